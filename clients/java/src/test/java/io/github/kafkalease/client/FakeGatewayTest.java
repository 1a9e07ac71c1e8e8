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
import io.github.kafkalease.v1.AcquireRequest;
import io.github.kafkalease.v1.AcquireResponse;
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

/** The client against a scripted gateway on loopback: retry, reopen and epoch rules. */
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
}
