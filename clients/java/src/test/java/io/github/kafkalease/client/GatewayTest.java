package io.github.kafkalease.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.github.kafkalease.v1.MemberInfo;
import io.grpc.Status;
import io.grpc.netty.shaded.io.grpc.netty.NettyChannelBuilder;
import java.time.Duration;
import java.time.Instant;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.UUID;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.extension.ExtendWith;

/** Against the live gateway at KAFKA_LEASE_ADDR with the records of KAFKA_LEASE_FIXTURE. */
@Timeout(90)
@ExtendWith(Progress.class)
class GatewayTest {
  private static final Duration WAIT = Duration.ofSeconds(15);

  private Fixture fx;
  private KafkaLeaseClient client;

  @BeforeEach
  void connect() {
    fx = Fixture.load();
    client = KafkaLeaseClient.connect(fx.addr);
  }

  @AfterEach
  void close() {
    if (client != null) {
      client.close();
    }
  }

  private Lease acquire(String group, int partition) {
    return client.acquire(
        AcquireOptions.of(group, fx.topic).partition(partition).member("java-test"));
  }

  private static ConsumedRecord next(RecordStream stream) {
    ConsumedRecord r = stream.poll(WAIT);
    assertNotNull(r, "no record within " + WAIT);
    return r;
  }

  @Test
  void a_fullCycleKeepsEveryField() {
    String group = fx.freshGroup();
    List<Fixture.Rec> expected = fx.partition(0);
    assertEquals(10, expected.size());
    try (Lease lease = acquire(group, 0); RecordStream records = lease.records()) {
      assertEquals(fx.topic, lease.topic());
      assertEquals(0, lease.partition());
      assertEquals(group, lease.group());
      assertEquals(0, lease.offset());
      assertEquals(10, lease.highWatermark());
      assertNotEquals(0, lease.fencingToken());
      assertTrue(lease.expiresAt().isAfter(Instant.now().minusSeconds(5)));
      for (Fixture.Rec want : expected) {
        Fixture.assertRecord(want, next(records));
      }
      assertNull(records.poll(Duration.ofMillis(300)), "nothing after the last record");
      lease.release(10);
      // The Read ends with OK once the lease is released.
      long deadline = System.nanoTime() + WAIT.toNanos();
      while (!records.isDone() && System.nanoTime() < deadline) {
        assertNull(records.poll(Duration.ofMillis(200)));
      }
      assertTrue(records.isDone(), "the Read ends after Release");
    }
  }

  @Test
  void b_seekDropsTheOldEpoch() {
    try (Lease lease = acquire(fx.freshGroup(), 0);
        RecordStream records = lease.records(ReadOptions.defaults().maxRecords(2))) {
      for (long want = 0; want < 4; want++) {
        assertEquals(want, next(records).offset());
      }
      SeekTo.Result r = lease.seek(SeekTo.offset(2));
      assertEquals(2, r.offset());
      assertTrue(r.seekEpoch() >= 1, "a seek starts a new epoch");
      assertEquals(r.seekEpoch(), lease.seekEpoch());
      assertEquals(2, next(records).offset(), "the first record after a seek is the sought one");
      assertEquals(3, next(records).offset());
      assertEquals(4, next(records).offset());

      SeekTo.Result earliest = lease.seek(SeekTo.earliest());
      assertEquals(0, earliest.offset());
      assertTrue(Long.compareUnsigned(earliest.seekEpoch(), r.seekEpoch()) > 0);
      assertEquals(0, next(records).offset());

      Instant fifth = Instant.ofEpochMilli(fx.partition(0).get(5).ts());
      SeekTo.Result ts = lease.seek(SeekTo.timestamp(fifth));
      assertEquals(5, ts.offset());
      assertEquals(5, next(records).offset());

      SeekTo.Result latest = lease.seek(SeekTo.latest());
      assertEquals(10, latest.offset());
      assertNull(records.poll(Duration.ofMillis(500)), "nothing past the high watermark");

      SeekTo.Result committed = lease.seek(SeekTo.committed());
      assertEquals(0, committed.offset(), "no commit yet: the earliest reset position");
      assertEquals(0, next(records).offset());

      KafkaLeaseException out = assertThrows(KafkaLeaseException.class, () -> lease.seek(SeekTo.offset(11)));
      assertEquals(Status.Code.OUT_OF_RANGE, out.code());
      assertEquals("OFFSET_OUT_OF_RANGE", out.reason());
      assertEquals("10", out.metadata("high"));
    }
  }

  @Test
  void c_commitReleaseReacquire() {
    String group = fx.freshGroup();
    Lease first = acquire(group, 0);
    first.commit(7, "java client test");
    first.release();
    first.close(); // released already: nothing to do
    KafkaLeaseException ended = assertThrows(KafkaLeaseException.class, () -> first.commit(8));
    assertTrue(ended.isLeaseEnded() || ended.code() == Status.Code.NOT_FOUND, ended.toString());

    try (Lease again = acquire(group, 0); RecordStream records = again.records()) {
      assertEquals(7, again.offset(), "the lease starts at the committed offset");
      assertTrue(Long.compareUnsigned(again.fencingToken(), first.fencingToken()) > 0);
      ConsumedRecord r = next(records);
      assertEquals(7, r.offset());
      Fixture.assertRecord(fx.partition(0).get(7), r);
    }
  }

  @Test
  void d_brokenReadIsReopenedWithoutLossOrRepeat() throws Exception {
    try (TcpRelay relay = new TcpRelay(fx.addr);
        // A small HTTP/2 window keeps the gateway from sending every record ahead of the
        // reader, so that the cut loses records in flight and the reopened Read must fetch them.
        KafkaLeaseClient relayed =
            KafkaLeaseClient.connect(
                NettyChannelBuilder.forTarget(relay.address())
                    .usePlaintext()
                    .flowControlWindow(128));
        Lease lease =
            relayed.acquire(AcquireOptions.of(fx.freshGroup(), fx.topic).partition(0));
        RecordStream records = lease.records(ReadOptions.defaults().maxRecords(1))) {
      List<Long> got = new ArrayList<>();
      for (int i = 0; i < 3; i++) {
        got.add(next(records).offset());
      }
      assertEquals(List.of(0L, 1L, 2L), got);
      int before = relay.accepted();
      relay.cutAll();
      while (got.size() < 10) {
        got.add(next(records).offset());
      }
      assertEquals(List.of(0L, 1L, 2L, 3L, 4L, 5L, 6L, 7L, 8L, 9L), got, "no gap, no repeat");
      assertTrue(relay.accepted() > before, "the client reconnected through the relay");
      assertNull(records.poll(Duration.ofMillis(300)), "no repeat after the end");
    }
  }

  @Test
  void e_errorReasonsComeFromErrorInfo() {
    KafkaLeaseException missing =
        assertThrows(
            KafkaLeaseException.class,
            () -> client.acquire(AcquireOptions.of(fx.freshGroup(), fx.missingTopic)));
    assertEquals(Status.Code.NOT_FOUND, missing.code());
    assertEquals("TOPIC_NOT_FOUND", missing.reason());
    assertEquals(fx.missingTopic, missing.metadata("topic"));

    String group = fx.freshGroup();
    try (Lease holder =
        client.acquire(AcquireOptions.of(group, fx.topic).partition(0).member("holder-java"))) {
      KafkaLeaseException busy =
          assertThrows(
              KafkaLeaseException.class,
              () ->
                  client.acquire(
                      AcquireOptions.of(group, fx.topic)
                          .partition(0)
                          .member("second")
                          .waitFor(Duration.ZERO)));
      assertEquals(Status.Code.RESOURCE_EXHAUSTED, busy.code());
      assertEquals("PARTITION_BUSY", busy.reason());
      assertEquals("holder-java", busy.metadata("holder_member"));
      assertEquals("0", busy.metadata("partition"));
      assertTrue(busy.retryDelay().isPresent(), "PARTITION_BUSY carries RetryInfo");
      assertFalse(busy.isRetryable());
      assertNotNull(holder.leaseId());
    }

    KafkaLeaseException ttl =
        assertThrows(
            KafkaLeaseException.class,
            () ->
                client.acquire(
                    AcquireOptions.of(fx.freshGroup(), fx.topic).ttl(Duration.ofMillis(500))));
    assertEquals(Status.Code.INVALID_ARGUMENT, ttl.code());
    assertEquals("INVALID_FIELD", ttl.reason());
    assertEquals("ttl", ttl.metadata("field"));

    KafkaLeaseException noGroup =
        assertThrows(KafkaLeaseException.class, () -> client.acquire(AcquireOptions.of("", fx.topic)));
    assertEquals(Status.Code.INVALID_ARGUMENT, noGroup.code());
    assertEquals("INVALID_FIELD", noGroup.reason());
    assertEquals("group", noGroup.metadata("field"));

    KafkaLeaseException noPartition =
        assertThrows(
            KafkaLeaseException.class,
            () -> client.acquire(AcquireOptions.of(fx.freshGroup(), fx.topic).partition(fx.partitions)));
    assertEquals("PARTITION_NOT_FOUND", noPartition.reason());
  }

  @Test
  void f_subscribeGetsEveryPartitionAndLeavesOnClose() {
    String group = fx.freshGroup();
    String memberId = "java-" + UUID.randomUUID().toString().substring(0, 8);
    Map<Integer, List<ConsumedRecord>> got = new HashMap<>();
    Set<Integer> assigned = new HashSet<>();
    try (Subscription sub =
        client.subscribe(
            SubscribeOptions.of(group, fx.topic)
                .memberId(memberId)
                .maxWait(Duration.ofMillis(20)))) {
      assertEquals(memberId, sub.memberId());
      long deadline = System.nanoTime() + Duration.ofSeconds(45).toNanos();
      while ((assigned.size() < fx.partitions || count(got) < fx.records.size())
          && System.nanoTime() < deadline) {
        SubscriptionEvent event = sub.poll(Duration.ofSeconds(1));
        if (event instanceof SubscriptionEvent.Assigned a) {
          assertEquals(fx.topic, a.partition().topic());
          assertEquals(0, a.offset(), "a fresh group starts at the earliest offset");
          assertTrue(assigned.add(a.partition().partition()), "assigned once");
        } else if (event instanceof SubscriptionEvent.Records r) {
          assertTrue(assigned.contains(r.partition().partition()), "records after assigned");
          got.computeIfAbsent(r.partition().partition(), p -> new ArrayList<>())
              .addAll(r.batch().records());
          r.partition().commit(r.batch().nextOffset());
        } else if (event != null) {
          throw new AssertionError("unexpected event with a single member: " + event);
        }
      }
      assertEquals(Set.of(0, 1), assigned);
      for (int p = 0; p < fx.partitions; p++) {
        List<Fixture.Rec> want = fx.partition(p);
        List<ConsumedRecord> have = got.getOrDefault(p, List.of());
        assertEquals(want.size(), have.size(), "partition " + p + " record count");
        for (int i = 0; i < want.size(); i++) {
          Fixture.assertRecord(want.get(i), have.get(i));
        }
      }
      List<MemberInfo> members = client.listMembers(group);
      assertEquals(1, members.size());
      assertEquals(memberId, members.get(0).getMemberId());
      // One join, one epoch of the group's target, which gives the member what it holds.
      assertEquals(1L, members.get(0).getGroupEpoch());
      assertEquals(List.of(0, 1), members.get(0).getTargetPartitionsList());
    }
    // Closing the subscription leaves the group.
    long deadline = System.nanoTime() + WAIT.toNanos();
    List<MemberInfo> members = client.listMembers(group);
    while (!members.isEmpty() && System.nanoTime() < deadline) {
      sleepBriefly();
      members = client.listMembers(group);
    }
    assertEquals(List.of(), members, "the member left the group");
    // What it committed is where the next leases start.
    for (int p = 0; p < fx.partitions; p++) {
      try (Lease lease =
          client.acquire(
              AcquireOptions.of(group, fx.topic).partition(p).waitFor(Duration.ofSeconds(10)))) {
        assertEquals(fx.partition(p).size(), lease.offset(), "partition " + p + " committed");
      }
    }
  }

  @Test
  void g_aBrokenSubscriptionResubscribesWithinItsSessionGrace() throws Exception {
    String group = fx.freshGroup();
    Map<Integer, List<Long>> got = new HashMap<>();
    Map<Integer, Long> committed = new HashMap<>();
    Map<Integer, Partition> leases = new HashMap<>();
    Map<Integer, Long> reassignedAt = new HashMap<>();
    try (TcpRelay relay = new TcpRelay(fx.addr);
        // A small HTTP/2 window keeps the gateway from sending every record before the cut.
        KafkaLeaseClient relayed =
            KafkaLeaseClient.connect(
                NettyChannelBuilder.forTarget(relay.address()).usePlaintext().flowControlWindow(128));
        Subscription sub =
            relayed.subscribe(
                SubscribeOptions.of(group, fx.topic)
                    .maxRecords(1)
                    .maxWait(Duration.ofMillis(20))
                    .sessionGrace(Duration.ofSeconds(10)))) {
      String memberId = sub.memberId(); // made up by the gateway
      int batches = 0;
      int acceptedBefore = 0;
      boolean cut = false;
      long deadline = System.nanoTime() + Duration.ofSeconds(45).toNanos();
      while (!hasAll(got) && System.nanoTime() < deadline) {
        SubscriptionEvent event = sub.poll(Duration.ofSeconds(1));
        if (event instanceof SubscriptionEvent.Assigned a) {
          int p = a.partition().partition();
          if (!cut) {
            assertNull(leases.put(p, a.partition()), "assigned once before the cut");
          } else {
            assertTrue(leases.get(p) == a.partition(), "the same lease, the same Partition");
            assertEquals(committed.getOrDefault(p, 0L), a.offset(), "again at its last commit");
            reassignedAt.put(p, a.offset());
            // Records resume at the commit: drop what came after it before the cut.
            got.computeIfAbsent(p, k -> new ArrayList<>()).removeIf(o -> o >= a.offset());
          }
        } else if (event instanceof SubscriptionEvent.Records r) {
          int p = r.partition().partition();
          List<Long> offsets = got.computeIfAbsent(p, k -> new ArrayList<>());
          for (ConsumedRecord record : r.batch().records()) {
            assertEquals(offsets.size(), record.offset(), "partition " + p + ": no gap, no repeat");
            offsets.add(record.offset());
          }
          commitThroughTheCut(r.partition(), r.batch().nextOffset());
          committed.put(p, r.batch().nextOffset());
          // Mid-stream, once each lease's first `assigned` came (events sent before a cut
          // may be lost with the connection); the caller does nothing about it.
          if (++batches >= 3 && !cut && leases.size() == 2) {
            acceptedBefore = relay.accepted();
            relay.cutAll();
            cut = true;
          }
        } else if (event != null) {
          throw new AssertionError("unexpected event with a single member: " + event);
        }
      }
      assertTrue(cut, "the relay was cut");
      assertTrue(hasAll(got), "every record after the break, got " + got);
      assertEquals(1, sub.resubscribes());
      assertTrue(relay.accepted() > acceptedBefore, "the client reconnected through the relay");
      assertEquals(memberId, sub.memberId());
      assertFalse(reassignedAt.isEmpty(), "the leases were announced again");
      List<MemberInfo> members = client.listMembers(group);
      assertEquals(1, members.size(), "one member, taken over: " + members);
      assertEquals(memberId, members.get(0).getMemberId());
    }
  }

  /**
   * Commits on the relayed channel, which the cut breaks under calls in flight (grpc-java
   * answers them UNKNOWN "channel closed", or UNAVAILABLE): such a commit is sent again, as a
   * caller would, once the channel has reconnected. A commit is idempotent.
   */
  private static void commitThroughTheCut(Partition partition, long offset) throws Exception {
    for (int attempt = 1; ; attempt++) {
      try {
        partition.commit(offset);
        return;
      } catch (KafkaLeaseException e) {
        boolean broken =
            e.isRetryable()
                || (e.code() == io.grpc.Status.Code.UNKNOWN && e.reason() == null);
        if (!broken || attempt == 50) {
          throw e;
        }
        Thread.sleep(100);
      }
    }
  }

  @Test
  void h_withoutSessionGraceABrokenSubscriptionEnds() throws Exception {
    try (TcpRelay relay = new TcpRelay(fx.addr);
        KafkaLeaseClient relayed = KafkaLeaseClient.connect(relay.address());
        Subscription sub =
            relayed.subscribe(
                SubscribeOptions.of(fx.freshGroup(), fx.topic).maxWait(Duration.ofMillis(20)))) {
      SubscriptionEvent first = sub.poll(WAIT);
      assertTrue(first instanceof SubscriptionEvent.Assigned, String.valueOf(first));
      relay.cutAll();
      KafkaLeaseException broke =
          assertThrows(
              KafkaLeaseException.class,
              () -> {
                while (sub.poll(WAIT) != null) {
                  // events that came before the cut
                }
              });
      assertEquals(Status.Code.UNAVAILABLE, broke.code(), broke.toString());
      assertTrue(sub.isDone());
      assertEquals(0, sub.resubscribes());
    }
  }

  /** Whether {@code got} holds every fixture record of every partition, in order. */
  private boolean hasAll(Map<Integer, List<Long>> got) {
    for (int p = 0; p < fx.partitions; p++) {
      if (got.getOrDefault(p, List.of()).size() < fx.partition(p).size()) {
        return false;
      }
    }
    return true;
  }

  private static int count(Map<Integer, List<ConsumedRecord>> got) {
    return got.values().stream().mapToInt(List::size).sum();
  }

  private static void sleepBriefly() {
    try {
      Thread.sleep(100);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new AssertionError(e);
    }
  }
}
