package io.github.kafkalease.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.google.protobuf.Any;
import com.google.rpc.Code;
import com.google.rpc.ErrorInfo;
import com.google.rpc.RetryInfo;
import io.github.kafkalease.v1.AckOutcome;
import io.github.kafkalease.v1.AckType;
import io.github.kafkalease.v1.AcknowledgeRequest;
import io.github.kafkalease.v1.AcknowledgeResponse;
import io.github.kafkalease.v1.Acknowledgement;
import io.github.kafkalease.v1.AcquireRequest;
import io.github.kafkalease.v1.AcquireResponse;
import io.github.kafkalease.v1.Assigned;
import io.github.kafkalease.v1.Joined;
import io.github.kafkalease.v1.SubscribeRequest;
import io.github.kafkalease.v1.SubscribeResponse;
import io.github.kafkalease.v1.SubscribedRecords;
import io.github.kafkalease.v1.DeliverRequest;
import io.github.kafkalease.v1.DeliverResponse;
import io.github.kafkalease.v1.DeliveryOrder;
import io.github.kafkalease.v1.KafkaRecord;
import io.github.kafkalease.v1.PartitionLeaseServiceGrpc;
import io.github.kafkalease.v1.ReadRequest;
import io.github.kafkalease.v1.ReadResponse;
import io.github.kafkalease.v1.SeekRequest;
import io.github.kafkalease.v1.SeekResponse;
import io.grpc.Grpc;
import io.grpc.InsecureServerCredentials;
import io.grpc.Server;
import io.grpc.Status;
import io.grpc.protobuf.StatusProto;
import io.grpc.stub.StreamObserver;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.BiConsumer;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.extension.ExtendWith;

/** The client against a scripted gateway on loopback: retry, reopen, epoch and queue rules. */
@Timeout(30)
@ExtendWith(Progress.class)
class FakeGatewayTest {
  private Server server;
  private KafkaLeaseClient client;

  private final AtomicInteger acquires = new AtomicInteger();
  private final List<ReadRequest> reads = new CopyOnWriteArrayList<>();
  private volatile Runnable onAcquire;
  private volatile BiConsumer<ReadRequest, StreamObserver<ReadResponse>> onRead;
  private final CountDownLatch seeked = new CountDownLatch(1);
  private final List<DeliverRequest> delivers = new CopyOnWriteArrayList<>();
  private volatile BiConsumer<DeliverRequest, StreamObserver<DeliverResponse>> onDeliver;
  private final List<AcknowledgeRequest> acknowledges = new CopyOnWriteArrayList<>();
  private volatile BiConsumer<AcknowledgeRequest, StreamObserver<AcknowledgeResponse>> onAcknowledge;
  private final List<SubscribeRequest> subscribes = new CopyOnWriteArrayList<>();
  private volatile BiConsumer<SubscribeRequest, StreamObserver<SubscribeResponse>> onSubscribe;

  private void start() throws Exception {
    server =
        Grpc.newServerBuilderForPort(0, InsecureServerCredentials.create())
            .addService(
                new PartitionLeaseServiceGrpc.PartitionLeaseServiceImplBase() {
                  @Override
                  public void acquire(AcquireRequest req, StreamObserver<AcquireResponse> out) {
                    acquires.incrementAndGet();
                    try {
                      onAcquire.run();
                    } catch (RuntimeException e) {
                      out.onError(e);
                      return;
                    }
                    out.onNext(
                        AcquireResponse.newBuilder()
                            .setLeaseId("ref.secret")
                            .setTopic(req.getTopic())
                            .setPartition(req.getPartition())
                            .setFencingToken(-2L) // 2^64 - 2: unsigned
                            .setOffset(Long.MAX_VALUE - 1)
                            .build());
                    out.onCompleted();
                  }

                  @Override
                  public void read(ReadRequest req, StreamObserver<ReadResponse> out) {
                    reads.add(req);
                    onRead.accept(req, out);
                  }

                  @Override
                  public void deliver(DeliverRequest req, StreamObserver<DeliverResponse> out) {
                    delivers.add(req);
                    onDeliver.accept(req, out);
                  }

                  @Override
                  public void acknowledge(
                      AcknowledgeRequest req, StreamObserver<AcknowledgeResponse> out) {
                    acknowledges.add(req);
                    onAcknowledge.accept(req, out);
                  }

                  @Override
                  public void subscribe(
                      SubscribeRequest req, StreamObserver<SubscribeResponse> out) {
                    subscribes.add(req);
                    onSubscribe.accept(req, out);
                  }

                  @Override
                  public void seek(SeekRequest req, StreamObserver<SeekResponse> out) {
                    out.onNext(SeekResponse.newBuilder().setOffset(5).setSeekEpoch(1).build());
                    out.onCompleted();
                    seeked.countDown();
                  }
                })
            .build()
            .start();
    client = KafkaLeaseClient.connect("127.0.0.1:" + server.getPort());
  }

  @AfterEach
  void stop() {
    if (client != null) {
      client.close();
    }
    if (server != null) {
      server.shutdownNow();
    }
  }

  static RuntimeException gatewayError(
      Code code, String reason, Map<String, String> metadata, Duration retry) {
    com.google.rpc.Status.Builder s =
        com.google.rpc.Status.newBuilder()
            .setCode(code.getNumber())
            .setMessage(reason + " (message for people)")
            .addDetails(
                Any.pack(
                    ErrorInfo.newBuilder()
                        .setDomain("kafka-lease")
                        .setReason(reason)
                        .putAllMetadata(metadata)
                        .build()));
    if (retry != null) {
      s.addDetails(
          Any.pack(
              RetryInfo.newBuilder()
                  .setRetryDelay(Protos.duration(retry))
                  .build()));
    }
    return StatusProto.toStatusRuntimeException(s.build());
  }

  static ReadResponse batch(long epoch, long... offsets) {
    ReadResponse.Builder b = ReadResponse.newBuilder().setSeekEpoch(epoch).setHighWatermark(100);
    for (long o : offsets) {
      b.addRecords(KafkaRecord.newBuilder().setOffset(o));
    }
    return b.build();
  }

  @Test
  void acquireRetriesUnavailableWithRetryInfo() throws Exception {
    start();
    onAcquire =
        () -> {
          if (acquires.get() < 3) {
            throw gatewayError(
                Code.UNAVAILABLE,
                "KAFKA_UNAVAILABLE",
                Map.of("operation", "fetch metadata"),
                Duration.ofMillis(20));
          }
        };
    Lease lease = client.acquire(AcquireOptions.of("g", "t").partition(3));
    assertEquals(3, acquires.get());
    assertEquals(3, lease.partition());
    assertEquals("18446744073709551614", Long.toUnsignedString(lease.fencingToken()));
    assertEquals(Long.MAX_VALUE - 1, lease.offset(), "int64 keeps every bit");
  }

  @Test
  void acquireRetriesAreBounded() throws Exception {
    start();
    onAcquire =
        () -> {
          throw gatewayError(Code.UNAVAILABLE, "CONSUL_UNAVAILABLE", Map.of(), Duration.ofMillis(10));
        };
    KafkaLeaseException e =
        assertThrows(
            KafkaLeaseException.class,
            () -> client.acquire(AcquireOptions.of("g", "t").retry(3, Duration.ofSeconds(10))));
    assertEquals(3, acquires.get());
    assertEquals("CONSUL_UNAVAILABLE", e.reason());
    assertEquals(Duration.ofMillis(10), e.retryDelay().orElseThrow());
    assertTrue(e.isRetryable());
  }

  @Test
  void acquireDoesNotRetryWithoutRetryInfo() throws Exception {
    start();
    onAcquire =
        () -> {
          throw gatewayError(Code.UNAVAILABLE, "SHUTTING_DOWN", Map.of("lease_ref", "r1"), null);
        };
    KafkaLeaseException e =
        assertThrows(KafkaLeaseException.class, () -> client.acquire(AcquireOptions.of("g", "t")));
    assertEquals(1, acquires.get());
    assertEquals(Status.Code.UNAVAILABLE, e.code());
    assertTrue(e.isLeaseEnded());
    assertFalse(e.isRetryable());
  }

  @Test
  void errorInfoOfAnotherDomainIsIgnored() {
    KafkaLeaseException e =
        KafkaLeaseException.from(
            StatusProto.toStatusRuntimeException(
                com.google.rpc.Status.newBuilder()
                    .setCode(Code.FAILED_PRECONDITION.getNumber())
                    .setMessage("upstream")
                    .addDetails(
                        Any.pack(ErrorInfo.newBuilder().setDomain("proxy").setReason("LEASE_LOST").build()))
                    .build()));
    assertNull(e.reason());
    assertFalse(e.isLeaseEnded());
    assertEquals(Status.Code.FAILED_PRECONDITION, e.code());
  }

  @Test
  void readReopensAfterTheLastRecordHandedOut() throws Exception {
    start();
    onAcquire = () -> {};
    onRead =
        (req, out) -> {
          if (reads.size() == 1) {
            out.onNext(batch(0, 0, 1));
            out.onError(
                gatewayError(Code.UNAVAILABLE, "KAFKA_UNAVAILABLE", Map.of(), Duration.ofSeconds(1)));
          } else {
            out.onNext(batch(1, req.getFromOffset(), req.getFromOffset() + 1));
            out.onCompleted();
          }
        };
    Lease lease = client.acquire(AcquireOptions.of("g", "t"));
    try (RecordStream records = lease.records()) {
      List<Long> got = records.stream().map(ConsumedRecord::offset).toList();
      assertEquals(List.of(0L, 1L, 2L, 3L), got);
    }
    assertFalse(reads.get(0).hasFromOffset(), "the first Read starts at the resume point");
    assertFalse(reads.get(0).hasIfSeekEpoch());
    assertEquals(2, reads.get(1).getFromOffset());
    assertTrue(reads.get(1).hasIfSeekEpoch(), "only while the lease is at the epoch of record 1");
    assertEquals(0, reads.get(1).getIfSeekEpoch());
  }

  @Test
  void readIsReopenedAtTheResumePointAfterSeek() throws Exception {
    start();
    onAcquire = () -> {};
    onRead =
        (req, out) -> {
          switch (reads.size()) {
            case 1 -> {
              out.onNext(batch(0, 0, 1));
              out.onError(Status.UNAVAILABLE.withDescription("reset").asRuntimeException());
            }
            case 2 -> {
              out.onNext(batch(1, 5, 6));
              out.onError(Status.UNAVAILABLE.withDescription("reset").asRuntimeException());
            }
            default -> out.onCompleted();
          }
        };
    Lease lease = client.acquire(AcquireOptions.of("g", "t"));
    try (RecordStream records = lease.records()) {
      assertEquals(0, records.next().offset());
      assertEquals(new SeekTo.Result(5, 1), lease.seek(SeekTo.offset(5)));
      List<Long> got = records.stream().map(ConsumedRecord::offset).toList();
      assertEquals(List.of(5L, 6L), got, "offset 1 is stale");
    }
    assertEquals(3, reads.size());
    assertFalse(reads.get(1).hasFromOffset(), "after the seek: where the seek put the lease");
    assertFalse(reads.get(1).hasIfSeekEpoch());
    assertEquals(7, reads.get(2).getFromOffset());
    assertTrue(reads.get(2).hasIfSeekEpoch());
    assertEquals(1, reads.get(2).getIfSeekEpoch());
  }

  @Test
  void readIsNotReopenedWhenTheLeaseEnded() throws Exception {
    start();
    onAcquire = () -> {};
    onRead =
        (req, out) -> {
          out.onNext(batch(0, 0));
          out.onError(gatewayError(Code.FAILED_PRECONDITION, "LEASE_LOST", Map.of("lease_ref", "r"), null));
        };
    Lease lease = client.acquire(AcquireOptions.of("g", "t"));
    try (RecordStream records = lease.records()) {
      assertEquals(0, records.next().offset());
      KafkaLeaseException e = assertThrows(KafkaLeaseException.class, records::hasNext);
      assertTrue(e.isLeaseEnded());
      assertEquals("LEASE_LOST", e.reason());
      assertFalse(records.hasNext());
    }
    assertEquals(1, reads.size());
  }

  @Test
  void batchesOfAnOlderEpochAreDroppedAfterSeek() throws Exception {
    start();
    onAcquire = () -> {};
    onRead =
        (req, out) -> {
          out.onNext(batch(0, 0, 1));
          try {
            assertTrue(seeked.await(10, TimeUnit.SECONDS));
          } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
          }
          out.onNext(batch(0, 2)); // was in flight when the seek returned
          out.onNext(batch(1, 5, 6));
          out.onCompleted();
        };
    Lease lease = client.acquire(AcquireOptions.of("g", "t"));
    try (RecordStream records = lease.records()) {
      assertEquals(0, records.poll(Duration.ofSeconds(5)).offset());
      assertEquals(new SeekTo.Result(5, 1), lease.seek(SeekTo.offset(5)));
      assertEquals(5, records.poll(Duration.ofSeconds(5)).offset(), "offset 1 and 2 are stale");
      assertEquals(6, records.poll(Duration.ofSeconds(5)).offset());
      assertNull(records.poll(Duration.ofSeconds(5)));
      assertTrue(records.isDone());
    }
  }

  static DeliverResponse deliveries(int attempt, long... offsets) {
    DeliverResponse.Builder b = DeliverResponse.newBuilder().setHighWatermark(100);
    for (long o : offsets) {
      b.addDeliveries(
          io.github.kafkalease.v1.Delivery.newBuilder()
              .setRecord(KafkaRecord.newBuilder().setOffset(o))
              .setAttempt(attempt)
              .setDeadline(Protos.timestamp(java.time.Instant.now().plusSeconds(30))));
    }
    return b.build();
  }

  @Test
  void answersAreBatchedOneAcknowledgeAtATime() throws Exception {
    start();
    onAcquire = () -> {};
    onDeliver = (req, out) -> out.onNext(deliveries(1, 0, 1, 2, 3, 4, 5));
    CountDownLatch firstCall = new CountDownLatch(1);
    CountDownLatch letFirstGo = new CountDownLatch(1);
    AtomicInteger inFlight = new AtomicInteger();
    AtomicInteger mostInFlight = new AtomicInteger();
    onAcknowledge =
        (req, out) -> {
          mostInFlight.accumulateAndGet(inFlight.incrementAndGet(), Math::max);
          if (acknowledges.size() == 1) {
            firstCall.countDown();
            try {
              letFirstGo.await(10, TimeUnit.SECONDS);
            } catch (InterruptedException e) {
              Thread.currentThread().interrupt();
            }
          }
          AcknowledgeResponse.Builder b = AcknowledgeResponse.newBuilder();
          for (Acknowledgement a : req.getAcknowledgementsList()) {
            // Even offsets APPLIED, odd ones STALE, but 5 was never delivered.
            b.addOutcomes(
                a.getOffset() == 5
                    ? AckOutcome.ACK_OUTCOME_NOT_DELIVERED
                    : a.getOffset() % 2 == 0
                        ? AckOutcome.ACK_OUTCOME_APPLIED
                        : AckOutcome.ACK_OUTCOME_STALE);
          }
          inFlight.decrementAndGet();
          out.onNext(b.build());
          out.onCompleted();
        };
    Lease lease = client.acquire(AcquireOptions.of("g", "t"));
    List<Delivery> got = new java.util.ArrayList<>();
    try (Deliveries ds =
        lease.deliveries(
            QueueOptions.defaults()
                .ordering(QueueOptions.Ordering.KEY)
                .maxInFlight(6)
                .ackDeadline(Duration.ofSeconds(5))
                .maxDeliveries(3)
                .deadLetterTopic("dlq"))) {
      for (int i = 0; i < 6; i++) {
        got.add(ds.poll(Duration.ofSeconds(5)));
      }
    }
    DeliverRequest opened = delivers.get(0);
    assertEquals(DeliveryOrder.DELIVERY_ORDER_KEY, opened.getOrdering());
    assertEquals(6, opened.getMaxInFlight());
    assertEquals(5, opened.getAckDeadline().getSeconds());
    assertEquals(3, opened.getMaxDeliveries());
    assertEquals("dlq", opened.getDeadLetterTopic());

    var first = got.get(0).acceptAsync();
    assertTrue(firstCall.await(5, TimeUnit.SECONDS));
    String longReason = "é".repeat(1000); // 2000 UTF-8 bytes
    var rest =
        List.of(
            got.get(1).retryAsync(Duration.ofMillis(1500), "later"),
            got.get(2).rejectAsync(longReason),
            got.get(3).renewAsync(),
            got.get(4).retryAsync(Duration.ofHours(3), "much later"),
            got.get(5).acceptAsync());
    letFirstGo.countDown();
    assertEquals(Delivery.Outcome.APPLIED, first.get(5, TimeUnit.SECONDS));
    List<Delivery.Outcome> outcomes = new java.util.ArrayList<>();
    for (var f : rest) {
      outcomes.add(f.get(5, TimeUnit.SECONDS));
    }
    assertEquals(
        List.of(
            Delivery.Outcome.STALE,
            Delivery.Outcome.APPLIED,
            Delivery.Outcome.STALE,
            Delivery.Outcome.APPLIED,
            Delivery.Outcome.NOT_DELIVERED), // not reported as stale
        outcomes);
    assertEquals(2, acknowledges.size(), "the answers made meanwhile went together");
    assertEquals(1, mostInFlight.get(), "one Acknowledge at a time");
    assertEquals(1, acknowledges.get(0).getAcknowledgementsCount());
    List<Acknowledgement> second = acknowledges.get(1).getAcknowledgementsList();
    assertEquals(List.of(1L, 2L, 3L, 4L, 5L), second.stream().map(Acknowledgement::getOffset).toList());
    assertEquals(AckType.ACK_TYPE_RETRY, second.get(0).getType());
    assertEquals(1, second.get(0).getAttempt());
    assertEquals(Duration.ofMillis(1500), Protos.duration(second.get(0).getRetryDelay()));
    assertEquals("later", second.get(0).getReason());
    assertEquals(AckType.ACK_TYPE_REJECT, second.get(1).getType());
    byte[] cut = second.get(1).getReason().getBytes(StandardCharsets.UTF_8);
    assertEquals(1024, cut.length, "a reason is cut to 1024 bytes, between characters");
    assertEquals("é".repeat(512), second.get(1).getReason());
    assertEquals(AckType.ACK_TYPE_RENEW, second.get(2).getType());
    assertEquals(Duration.ofHours(1), Protos.duration(second.get(3).getRetryDelay()));
    assertEquals(AckType.ACK_TYPE_ACCEPT, second.get(4).getType());
  }

  @Test
  void aBrokenDeliverIsReopenedWithTheSameSettings() throws Exception {
    start();
    onAcquire = () -> {};
    onDeliver =
        (req, out) -> {
          switch (delivers.size()) {
            case 1 -> {
              out.onNext(deliveries(1, 0));
              out.onError(Status.UNAVAILABLE.withDescription("reset").asRuntimeException());
            }
            case 2 ->
                out.onError(
                    gatewayError(Code.UNAVAILABLE, "KAFKA_UNAVAILABLE", Map.of(), Duration.ofMillis(10)));
            case 3 -> {
              out.onNext(deliveries(2, 0, 1));
              out.onCompleted();
            }
            default -> out.onError(gatewayError(Code.ABORTED, "SUPERSEDED", Map.of(), null));
          }
        };
    Lease lease = client.acquire(AcquireOptions.of("g", "t"));
    try (Deliveries ds = lease.deliveries(QueueOptions.defaults().maxInFlight(2))) {
      List<String> got =
          ds.stream().map(d -> d.offset() + "/" + d.attempt()).toList();
      assertEquals(List.of("0/1", "0/2", "1/2"), got);
      assertTrue(ds.isDone());
    }
    assertEquals(3, delivers.size());
    assertEquals(delivers.get(0), delivers.get(1));
    assertEquals(delivers.get(0), delivers.get(2));
    assertEquals(2, delivers.get(2).getMaxInFlight());
  }

  @Test
  void aDeliverEndedOtherwiseIsNotReopened() throws Exception {
    start();
    onAcquire = () -> {};
    onDeliver =
        (req, out) ->
            out.onError(
                gatewayError(Code.ABORTED, "SUPERSEDED", Map.of("lease_ref", "r"), null));
    Lease lease = client.acquire(AcquireOptions.of("g", "t"));
    try (Deliveries ds = lease.deliveries()) {
      KafkaLeaseException e = assertThrows(KafkaLeaseException.class, ds::hasNext);
      assertEquals("SUPERSEDED", e.reason());
      assertFalse(ds.hasNext());
    }
    assertEquals(1, delivers.size());
  }

  @Test
  void theConsumerAnswersByWhatTheHandlerDid() throws Exception {
    start();
    onAcquire = () -> {};
    onDeliver =
        (req, out) -> {
          DeliverResponse.Builder b = DeliverResponse.newBuilder();
          int[] attempts = {1, 1, 1, 3, 2};
          for (int o = 0; o < attempts.length; o++) {
            b.addDeliveries(
                io.github.kafkalease.v1.Delivery.newBuilder()
                    .setRecord(KafkaRecord.newBuilder().setOffset(o))
                    .setAttempt(attempts[o]));
          }
          out.onNext(b.build()); // and stays open
        };
    onAcknowledge =
        (req, out) -> {
          AcknowledgeResponse.Builder b = AcknowledgeResponse.newBuilder();
          req.getAcknowledgementsList().forEach(a -> b.addOutcomes(AckOutcome.ACK_OUTCOME_APPLIED));
          out.onNext(b.build());
          out.onCompleted();
        };
    Lease lease = client.acquire(AcquireOptions.of("g", "t"));
    ConsumeOptions options =
        ConsumeOptions.of(QueueOptions.defaults(), 5)
            .backoff(Duration.ofMillis(100), Duration.ofMillis(300))
            .errorPolicy(
                (delivery, error) ->
                    error instanceof IllegalArgumentException
                        ? HandlerError.reject("bad: " + error.getMessage())
                        : ErrorPolicy.RETRY.decide(delivery, error));
    QueueConsumer consumer =
        lease.consumer(
            options,
            d -> {
              switch ((int) d.offset()) {
                case 0 -> {}
                case 1 -> throw new RetryException(Duration.ofSeconds(2), "not yet");
                case 2 -> throw new RejectException("never");
                case 3 -> throw new IllegalStateException("flaky");
                default -> throw new IllegalArgumentException("malformed");
              }
            });
    Thread stopper =
        new Thread(
            () -> {
              long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
              try {
                while (answered() < 5 && System.nanoTime() < deadline) {
                  Thread.sleep(10);
                }
              } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
              }
              consumer.shutdown();
            });
    stopper.start();
    ConsumeStats stats = consumer.run();
    stopper.join();
    assertEquals(new ConsumeStats(1, 2, 2, 0), stats);
    assertEquals(1, delivers.size());
    assertEquals(5, delivers.get(0).getMaxInFlight(), "max in flight = concurrency when unset");
    Map<Long, Acknowledgement> byOffset = new java.util.HashMap<>();
    acknowledges.forEach(r -> r.getAcknowledgementsList().forEach(a -> byOffset.put(a.getOffset(), a)));
    assertEquals(AckType.ACK_TYPE_ACCEPT, byOffset.get(0L).getType());
    assertEquals(AckType.ACK_TYPE_RETRY, byOffset.get(1L).getType());
    assertEquals(Duration.ofSeconds(2), Protos.duration(byOffset.get(1L).getRetryDelay()));
    assertEquals("not yet", byOffset.get(1L).getReason());
    assertEquals(AckType.ACK_TYPE_REJECT, byOffset.get(2L).getType());
    assertEquals("never", byOffset.get(2L).getReason());
    assertEquals(AckType.ACK_TYPE_RETRY, byOffset.get(3L).getType());
    assertEquals(
        Duration.ofMillis(300),
        Protos.duration(byOffset.get(3L).getRetryDelay()),
        "the backoff of attempt 3, 400 ms, capped at 300 ms");
    assertEquals(3, byOffset.get(3L).getAttempt());
    assertEquals("java.lang.IllegalStateException: flaky", byOffset.get(3L).getReason());
    assertEquals(AckType.ACK_TYPE_REJECT, byOffset.get(4L).getType());
    assertEquals("bad: malformed", byOffset.get(4L).getReason());
  }

  private int answered() {
    return acknowledges.stream().mapToInt(AcknowledgeRequest::getAcknowledgementsCount).sum();
  }

  static SubscribeResponse joined(String memberId) {
    return SubscribeResponse.newBuilder()
        .setJoined(Joined.newBuilder().setMemberId(memberId).setGateway("gw-" + memberId))
        .build();
  }

  static SubscribeResponse assigned(String leaseId, int partition, long offset) {
    return SubscribeResponse.newBuilder()
        .setAssigned(
            Assigned.newBuilder()
                .setLeaseId(leaseId)
                .setTopic("t")
                .setPartition(partition)
                .setFencingToken(7)
                .setOffset(offset))
        .build();
  }

  static SubscribeResponse records(String leaseId, int partition, long... offsets) {
    SubscribedRecords.Builder b =
        SubscribedRecords.newBuilder().setLeaseId(leaseId).setTopic("t").setPartition(partition);
    for (long o : offsets) {
      b.addRecords(KafkaRecord.newBuilder().setOffset(o));
    }
    return SubscribeResponse.newBuilder().setRecords(b).build();
  }

  @Test
  void aBrokenSubscriptionSubscribesAgainAsTheSameMember() throws Exception {
    start();
    onSubscribe =
        (req, out) -> {
          switch (subscribes.size()) {
            case 1 -> {
              out.onNext(joined("made-up-7"));
              out.onNext(assigned("L1", 0, 0));
              out.onNext(records("L1", 0, 0, 1));
              out.onError(Status.UNAVAILABLE.withDescription("connection reset").asRuntimeException());
            }
            case 2 -> // the gateway has not noticed the old stream's end yet
                out.onError(
                    gatewayError(Code.ALREADY_EXISTS, "MEMBER_ACTIVE", Map.of("member_id", "made-up-7"), null));
            case 3 ->
                out.onError(
                    gatewayError(Code.UNAVAILABLE, "GATEWAY_UNREACHABLE", Map.of(), Duration.ofMillis(10)));
            case 4 -> {
              out.onNext(joined("made-up-7"));
              out.onNext(assigned("L1", 0, 2));
              out.onNext(records("L1", 0, 2));
              out.onError(
                  gatewayError(Code.INVALID_ARGUMENT, "INVALID_FIELD", Map.of("field", "topics"), null));
            }
            default -> out.onError(Status.INTERNAL.asRuntimeException());
          }
        };
    try (Subscription sub =
        client.subscribe(
            SubscribeOptions.of("g", "t").maxRecords(7).sessionGrace(Duration.ofSeconds(30)))) {
      assertEquals("made-up-7", sub.memberId());
      var first = (SubscriptionEvent.Assigned) sub.poll(Duration.ofSeconds(5));
      var batch = (SubscriptionEvent.Records) sub.poll(Duration.ofSeconds(5));
      assertEquals(List.of(0L, 1L), batch.batch().records().stream().map(ConsumedRecord::offset).toList());
      var again = (SubscriptionEvent.Assigned) sub.poll(Duration.ofSeconds(5));
      assertTrue(first.partition() == again.partition(), "the same lease, the same Partition");
      assertEquals(2, again.offset());
      assertEquals(1, sub.resubscribes());
      assertEquals("gw-made-up-7", sub.gateway());
      var after = (SubscriptionEvent.Records) sub.poll(Duration.ofSeconds(5));
      assertEquals(2, after.batch().records().get(0).offset());
      KafkaLeaseException e = assertThrows(KafkaLeaseException.class, () -> sub.poll(Duration.ofSeconds(5)));
      assertEquals("INVALID_FIELD", e.reason(), "an error not about the connection ends it");
      assertTrue(sub.isDone());
    }
    assertEquals(4, subscribes.size());
    assertEquals("", subscribes.get(0).getMemberId());
    for (SubscribeRequest again : subscribes.subList(1, 4)) {
      assertEquals("made-up-7", again.getMemberId(), "the member id from `joined`");
      assertEquals(subscribes.get(0).getTopicsList(), again.getTopicsList());
      assertEquals(7, again.getMaxRecords());
      assertEquals(30, again.getSessionGrace().getSeconds());
    }
  }

  @Test
  void resubscribingStopsWhenTheSessionGraceRunsOut() throws Exception {
    start();
    onSubscribe =
        (req, out) -> {
          if (subscribes.size() == 1) {
            out.onNext(joined("m"));
          }
          out.onError(Status.UNAVAILABLE.withDescription("refused").asRuntimeException());
        };
    long started = System.nanoTime();
    try (Subscription sub =
        client.subscribe(SubscribeOptions.of("g", "t").memberId("m").sessionGrace(Duration.ofMillis(700)))) {
      KafkaLeaseException e = assertThrows(KafkaLeaseException.class, () -> sub.poll(null));
      assertEquals(Status.Code.UNAVAILABLE, e.code());
      assertEquals(0, sub.resubscribes());
    }
    long took = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - started);
    assertTrue(took < 2000, "gave up within the grace, took " + took + " ms");
    assertTrue(subscribes.size() >= 3, "tried again within the grace: " + subscribes.size());
  }

  @Test
  void memberActiveForAnotherLiveStreamEndsTheSubscription() throws Exception {
    start();
    onSubscribe =
        (req, out) -> {
          if (subscribes.size() == 1) {
            out.onNext(joined("m"));
            out.onError(Status.UNAVAILABLE.withDescription("reset").asRuntimeException());
          } else {
            out.onError(gatewayError(Code.ALREADY_EXISTS, "MEMBER_ACTIVE", Map.of(), null));
          }
        };
    try (Subscription sub =
        client.subscribe(SubscribeOptions.of("g", "t").memberId("m").sessionGrace(Duration.ofSeconds(30)))) {
      KafkaLeaseException e = assertThrows(KafkaLeaseException.class, () -> sub.poll(null));
      assertEquals("MEMBER_ACTIVE", e.reason());
    }
    assertEquals(1 + 3, subscribes.size(), "3 tries, then the other stream is taken as live");
  }
}
