package io.github.kafkalease.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.github.kafkalease.v1.LeaseInfo;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.HashSet;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.FutureTask;
import java.util.concurrent.TimeUnit;
import java.util.function.BooleanSupplier;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.extension.ExtendWith;

/**
 * Queue mode over Subscribe against the live gateway, on the fixture's queue topic (partition
 * 0, 40 records, the one at the poison offset rejected).
 */
@Timeout(120)
@ExtendWith(Progress.class)
class SubscriptionQueueTest {
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
  void a_consumerOverASubscriptionRejectsThePoisonAndCommitsWhenTheMemberLeaves()
      throws Exception {
    assertEquals(40, fx.queueRecords);
    String group = fx.freshGroup() + "-java-subqueue";
    Map<Long, Integer> handled = new ConcurrentHashMap<>();
    Set<Integer> partitions = ConcurrentHashMap.newKeySet();
    DeliveryHandler handler =
        d -> {
          assertEquals(fx.queueTopic, d.topic());
          partitions.add(d.partition());
          String value = new String(d.record().value(), StandardCharsets.UTF_8);
          assertEquals("k" + d.offset() % fx.queueKeys, new String(d.record().key(), StandardCharsets.UTF_8));
          if (value.equals("poison")) {
            throw new RejectException("cannot handle poison");
          }
          assertEquals("v" + d.offset(), value);
          handled.merge(d.offset(), 1, Integer::sum);
        };
    QueueOptions queue =
        QueueOptions.defaults()
            .ordering(QueueOptions.Ordering.KEY)
            .maxInFlight(8)
            .deadLetterTopic(fx.deadLetterTopic);
    Subscription member =
        client.subscribe(
            SubscribeOptions.of(group, fx.queueTopic).member("java-subqueue-test").queue(queue));
    Set<Long> applied = ConcurrentHashMap.newKeySet();
    QueueConsumer consumer =
        member.consumer(
            ConsumeOptions.of(4)
                .onAccepted(
                    (d, outcome) -> {
                      if (outcome == Delivery.Outcome.APPLIED) {
                        applied.add(d.offset());
                      }
                    }),
            handler);
    FutureTask<ConsumeStats> run = new FutureTask<>(consumer::run);
    Thread t = new Thread(run, "subscription-queue-consumer");
    t.setDaemon(true);
    t.start();
    try {
      await(
          "39 records handled and the poison one dead-lettered",
          Duration.ofSeconds(60),
          () -> {
            if (run.isDone() || handled.size() < 39) {
              return run.isDone();
            }
            LeaseInfo info = leaseInfo(group);
            return info != null && info.getQueue().getDeadLetters() >= 1;
          });
      assertTrue(!run.isDone(), "the consumer is still running");
      LeaseInfo info = leaseInfo(group);
      assertNotNull(info, "ListLeases shows the lease");
      assertTrue(info.hasQueue(), "ListLeases shows the queue");
      assertEquals(1, info.getQueue().getDeadLetters());
      assertEquals(fx.deadLetterTopic, info.getQueue().getDeadLetterTopic());
    } finally {
      consumer.shutdown();
    }
    ConsumeStats stats = run.get(30, TimeUnit.SECONDS);
    assertEquals(new ConsumeStats(39, 0, 1, 0), stats);

    Set<Long> others = new HashSet<>();
    for (long o = 0; o < fx.queueRecords; o++) {
      if (o != fx.poisonOffset) {
        others.add(o);
      }
    }
    assertEquals(others, handled.keySet(), "every other record handled");
    handled.forEach((o, n) -> assertEquals(1, n, "offset " + o + " handled once"));
    assertEquals(others, applied, "every accept applied, and onAccepted told");
    assertTrue(partitions.contains(0), "the deliveries name their partition");

    // The member left: its lease was released, committing the queue's progress.
    try (Lease again =
        client.acquire(
            AcquireOptions.of(group, fx.queueTopic)
                .partition(0)
                .member("java-subqueue-test")
                .waitFor(Duration.ofSeconds(10)))) {
      assertEquals(fx.queueRecords, again.offset(), "leaving committed the queue's progress");
    }
  }

  @Test
  void b_aConsumerNeedsASubscriptionInQueueMode() {
    String group = fx.freshGroup() + "-java-subqueue-plain";
    try (Subscription member = client.subscribe(SubscribeOptions.of(group, fx.queueTopic))) {
      assertThrows(
          IllegalStateException.class, () -> member.consumer(ConsumeOptions.of(1), d -> {}));
    }
  }
}
