package io.github.kafkalease.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.github.kafkalease.v1.DeliveryOrder;
import io.github.kafkalease.v1.LeaseInfo;
import io.grpc.Status;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.HashSet;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.FutureTask;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.BooleanSupplier;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.extension.ExtendWith;

/** Queue mode against the live gateway, on the fixture's queue topic (partition 0, 40 records). */
@Timeout(120)
@ExtendWith(Progress.class)
class QueueTest {
  private static final Duration WAIT = Duration.ofSeconds(15);

  private Fixture fx;
  private KafkaLeaseClient client;

  @BeforeEach
  void connect() {
    fx = Fixture.load();
    Assumptions.assumeTrue(fx.queueTopic != null, "the fixture has no `queue` entry");
    client = KafkaLeaseClient.connect(fx.addr);
  }

  @AfterEach
  void close() {
    if (client != null) {
      client.close();
    }
  }

  /** A group of this test alone: the fixture's group, a suffix, and a random part. */
  private String group(String suffix) {
    return fx.freshGroup() + "-java-queue-" + suffix;
  }

  private Lease acquire(String group) {
    return client.acquire(
        AcquireOptions.of(group, fx.queueTopic)
            .partition(0)
            .member("java-queue-test")
            .waitFor(Duration.ofSeconds(10)));
  }

  private QueueOptions queue() {
    return QueueOptions.defaults().deadLetterTopic(fx.deadLetterTopic);
  }

  /** Runs the consumer on a thread of its own; the task's result is its stats. */
  private static FutureTask<ConsumeStats> start(QueueConsumer consumer) {
    FutureTask<ConsumeStats> task = new FutureTask<>(consumer::run);
    Thread t = new Thread(task, "queue-test-consumer");
    t.setDaemon(true);
    t.start();
    return task;
  }

  private static void await(String what, Duration within, BooleanSupplier done)
      throws InterruptedException {
    long deadline = System.nanoTime() + within.toNanos();
    while (!done.getAsBoolean()) {
      if (System.nanoTime() > deadline) {
        throw new AssertionError("not within " + within + ": " + what);
      }
      Thread.sleep(100);
    }
  }

  private LeaseInfo leaseInfo(String group) {
    return client.listLeases(group).stream()
        .filter(l -> l.getTopic().equals(fx.queueTopic) && l.getPartition() == 0)
        .findFirst()
        .orElse(null);
  }

  @Test
  void a_poisonGoesToTheDeadLetterTopicHoldingBackOnlyItsKey() throws Exception {
    assertEquals(40, fx.queueRecords);
    String group = group("poison");
    AtomicLong clock = new AtomicLong();
    Map<Long, Long> handledAt = new ConcurrentHashMap<>();
    Map<Long, Integer> handledTimes = new ConcurrentHashMap<>();
    Set<Integer> poisonAttempts = ConcurrentHashMap.newKeySet();
    AtomicLong poisonLastFailedAt = new AtomicLong(Long.MAX_VALUE);
    DeliveryHandler handler =
        d -> {
          String value = new String(d.record().value(), StandardCharsets.UTF_8);
          String key = new String(d.record().key(), StandardCharsets.UTF_8);
          assertEquals("k" + d.offset() % fx.queueKeys, key);
          if (value.equals("poison")) {
            poisonAttempts.add(d.attempt());
            if (d.attempt() == 3) {
              poisonLastFailedAt.set(clock.incrementAndGet());
            }
            throw new IllegalStateException("cannot handle poison");
          }
          assertEquals("v" + d.offset(), value);
          handledAt.put(d.offset(), clock.incrementAndGet());
          handledTimes.merge(d.offset(), 1, Integer::sum);
        };
    ConsumeOptions options =
        ConsumeOptions.of(queue().ordering(QueueOptions.Ordering.KEY).maxDeliveries(3), 4)
            .backoff(Duration.ofMillis(50), Duration.ofSeconds(1));
    Lease lease = acquire(group);
    try (QueueConsumer consumer = lease.consumer(options, handler)) {
      FutureTask<ConsumeStats> run = start(consumer);
      await(
          "39 records handled and the poison one dead-lettered",
          Duration.ofSeconds(60),
          () -> {
            if (run.isDone() || handledAt.size() < 39) {
              return run.isDone();
            }
            LeaseInfo info = leaseInfo(group);
            return info != null && info.getQueue().getDeadLetters() >= 1;
          });
      LeaseInfo info = leaseInfo(group);
      assertNotNull(info, "ListLeases shows the lease");
      assertTrue(info.hasQueue(), "ListLeases shows the queue");
      assertEquals(DeliveryOrder.DELIVERY_ORDER_KEY, info.getQueue().getOrdering());
      assertEquals(1, info.getQueue().getDeadLetters());
      assertEquals(fx.deadLetterTopic, info.getQueue().getDeadLetterTopic());
      consumer.shutdown();
      ConsumeStats stats = run.get(30, TimeUnit.SECONDS);
      assertEquals(new ConsumeStats(39, 3, 0, 0), stats);
    }

    Set<Long> others = new HashSet<>();
    for (long o = 0; o < fx.queueRecords; o++) {
      if (o != fx.poisonOffset) {
        others.add(o);
      }
    }
    assertEquals(others, handledAt.keySet(), "every other record handled");
    handledTimes.forEach((o, n) -> assertEquals(1, n, "offset " + o + " handled once"));
    assertEquals(Set.of(1, 2, 3), poisonAttempts, "the poison record was delivered 3 times");
    long poisonKey = fx.poisonOffset % fx.queueKeys;
    for (long o = fx.poisonOffset + fx.queueKeys; o < fx.queueRecords; o += fx.queueKeys) {
      assertEquals(poisonKey, o % fx.queueKeys);
      assertTrue(
          handledAt.get(o) > poisonLastFailedAt.get(),
          "offset " + o + " (the poison's key) handled only after its last attempt");
    }
    assertTrue(
        handledAt.keySet().stream()
            .anyMatch(o -> o % fx.queueKeys != poisonKey && handledAt.get(o) < poisonLastFailedAt.get()),
        "the other keys went on while the poison record was retried");

    lease.release();
    try (Lease again = acquire(group)) {
      assertEquals(fx.queueRecords, again.offset(), "Release committed the queue's progress");
    }
  }

  @Test
  void b_shutdownHandsBackWhatIsRunning() throws Exception {
    String group = group("handback");
    QueueOptions queue = queue().ordering(QueueOptions.Ordering.UNORDERED);
    Set<Long> running = ConcurrentHashMap.newKeySet();
    CountDownLatch three = new CountDownLatch(3);
    CountDownLatch never = new CountDownLatch(1);
    try (Lease lease = acquire(group)) {
      ConsumeStats first;
      try (QueueConsumer consumer =
          lease.consumer(
              ConsumeOptions.of(queue, 3).drain(Duration.ofMillis(500)),
              d -> {
                running.add(d.offset());
                three.countDown();
                never.await(); // until the drain ends and the consumer interrupts it
              })) {
        FutureTask<ConsumeStats> run = start(consumer);
        assertTrue(three.await(WAIT.toSeconds(), TimeUnit.SECONDS), "3 handlers running");
        Thread.sleep(300);
        assertEquals(3, running.size(), "no more than the concurrency at once");
        consumer.shutdown();
        first = run.get(30, TimeUnit.SECONDS);
      }
      assertEquals(new ConsumeStats(0, 0, 0, 3), first, "the 3 running records handed back");

      Map<Long, Integer> attempts = new ConcurrentHashMap<>();
      try (QueueConsumer again =
          lease.consumer(
              ConsumeOptions.of(queue, 3), d -> attempts.putIfAbsent(d.offset(), d.attempt()))) {
        FutureTask<ConsumeStats> run = start(again);
        await(
            "the handed-back records delivered again",
            WAIT,
            () -> run.isDone() || attempts.keySet().containsAll(running));
        again.shutdown();
        ConsumeStats second = run.get(30, TimeUnit.SECONDS);
        assertTrue(second.accepted() >= 3, second.toString());
      }
      for (long o : running) {
        assertEquals(2, attempts.get(o), "offset " + o + ": its second delivery");
      }
      attempts.forEach(
          (o, attempt) -> {
            if (!running.contains(o)) {
              assertEquals(1, attempt, "offset " + o + " was never handed out before");
            }
          });
    }
  }

  @Test
  void c_answersAfterReleaseFailAsTheLeaseEnded() throws Exception {
    Lease lease = acquire(group("release"));
    try (Deliveries deliveries = lease.deliveries(queue())) {
      Delivery first = deliveries.poll(WAIT);
      assertNotNull(first, "a delivery within " + WAIT);
      assertEquals(0, first.offset());
      assertEquals(1, first.attempt());
      assertTrue(first.deadline().isAfter(java.time.Instant.now()));

      KafkaLeaseException wrong = assertThrows(KafkaLeaseException.class, () -> lease.commit(1));
      assertEquals(Status.Code.FAILED_PRECONDITION, wrong.code());
      assertTrue(wrong.isWrongMode(), wrong.toString());
      assertEquals("queue", wrong.metadata("mode"));

      assertEquals(Delivery.Outcome.APPLIED, first.renew());
      assertEquals(Delivery.Outcome.APPLIED, first.accept());
      assertEquals(Delivery.Outcome.STALE, first.accept(), "answered already");

      Delivery second = deliveries.poll(WAIT);
      assertNotNull(second, "the next delivery once the first is done (partition order)");
      assertEquals(1, second.offset());

      lease.release();
      KafkaLeaseException ended = assertThrows(KafkaLeaseException.class, second::accept);
      assertTrue(ended.isLeaseEnded(), ended.toString());

      long deadline = System.nanoTime() + WAIT.toNanos();
      while (!deliveries.isDone() && System.nanoTime() < deadline) {
        deliveries.poll(Duration.ofMillis(200));
      }
      assertTrue(deliveries.isDone(), "the Deliver ends after Release");
    }
  }

  @Test
  void d_aMissingDeadLetterTopicIsNotFound() throws Exception {
    try (Lease lease = acquire(group("nodlq"));
        Deliveries deliveries =
            lease.deliveries(QueueOptions.defaults().deadLetterTopic(fx.missingTopic))) {
      KafkaLeaseException missing =
          assertThrows(KafkaLeaseException.class, () -> deliveries.poll(WAIT));
      assertEquals(Status.Code.NOT_FOUND, missing.code());
      assertEquals("TOPIC_NOT_FOUND", missing.reason());
      assertEquals(fx.missingTopic, missing.metadata("topic"));
      assertTrue(deliveries.isDone());
    }
  }
}
