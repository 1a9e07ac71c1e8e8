package io.github.kafkalease.client;

import io.github.kafkalease.v1.AcquireResponse;
import io.github.kafkalease.v1.ReleaseRequest;
import io.grpc.Status;
import java.time.Duration;
import java.time.Instant;

/**
 * An exclusive, expiring lease on one partition, from {@link KafkaLeaseClient#acquire}. It
 * stays alive while a {@link RecordStream} of it is open, and for its TTL after the last call
 * otherwise. {@link #close} releases it (try-with-resources). Thread-safe: one thread may read
 * while another seeks or commits.
 */
public final class Lease extends LeaseHandle implements AutoCloseable {
  private final String group;
  private final long offset;
  private final long highWatermark;
  private final Instant expiresAt;
  private final String gateway;
  private final Duration ttl;
  private volatile boolean released;

  Lease(KafkaLeaseClient client, AcquireResponse r, String requestedGroup) {
    super(client, r.getLeaseId(), r.getTopic(), r.getPartition(), r.getFencingToken());
    this.group = r.getGroup().isEmpty() ? requestedGroup : r.getGroup();
    this.offset = r.getOffset();
    this.highWatermark = r.getHighWatermark();
    this.expiresAt = r.hasExpiresAt() ? Protos.instant(r.getExpiresAt()) : null;
    this.gateway = r.getGateway();
    this.ttl = r.hasTtl() ? Protos.duration(r.getTtl()) : Duration.ofSeconds(10);
  }

  /** The consumer group. */
  public String group() {
    return group;
  }

  /** Where reading starts: the group's committed offset, else the offset-reset position. */
  public long offset() {
    return offset;
  }

  /** The partition's high watermark at Acquire. */
  public long highWatermark() {
    return highWatermark;
  }

  /** When the lease expires if nothing renews it, as of Acquire (null if not sent). */
  public Instant expiresAt() {
    return expiresAt;
  }

  /** The gateway instance serving the lease (calls may reach any instance). */
  public String gateway() {
    return gateway;
  }

  /** The TTL the gateway granted. */
  public Duration ttl() {
    return ttl;
  }

  /** {@link #records(ReadOptions)} with the defaults. */
  public RecordStream records() {
    return records(ReadOptions.defaults());
  }

  /**
   * Opens a Read: the partition's records in order, with no gaps and no repeats, reopened by
   * itself when the connection breaks (see {@link RecordStream}). One Read per lease: opening
   * another ends the previous one (SUPERSEDED).
   */
  public RecordStream records(ReadOptions options) {
    return new RecordStream(
        (from, ifSeekEpoch) ->
            StreamCall.start(client.async()::read, options.request(leaseId, from, ifSeekEpoch)),
        options.fromOffset(),
        epochs,
        options.reconnectAttempts());
  }

  /** {@link #deliveries(QueueOptions)} with the gateway's defaults. */
  public Deliveries deliveries() {
    return deliveries(QueueOptions.defaults());
  }

  /**
   * Opens a Deliver: the lease's records one by one as {@link Delivery}s, each to be answered
   * (queue mode; see {@link Deliveries}). The first one puts the lease in queue mode for the
   * rest of its life: from then on {@link #records}, {@link #seek} and {@link #commit} fail with
   * FAILED_PRECONDITION, WRONG_MODE ({@link KafkaLeaseException#isWrongMode}); the gateway
   * commits for the client, and {@link #release} commits the queue's progress. One Deliver per
   * lease: a later one (with the same settings) takes over from the open one, which ends with
   * ABORTED (SUPERSEDED). Errors opening the queue (INVALID_ARGUMENT, the dead letter topic
   * missing: NOT_FOUND) come from the first {@code poll}/{@code hasNext}.
   */
  public Deliveries deliveries(QueueOptions options) {
    var request = options.request(leaseId);
    return new Deliveries(
        () -> StreamCall.start(client.async()::deliver, request),
        acks(),
        options.reconnectAttempts(),
        topic,
        partition);
  }

  /**
   * A consumer that runs {@code handler} on the lease's deliveries, up to {@link
   * ConsumeOptions#of}'s concurrency at once, until {@link QueueConsumer#shutdown} or the lease
   * ends: {@link QueueConsumer#run} runs it. See {@link QueueConsumer}.
   */
  public QueueConsumer consumer(ConsumeOptions options, DeliveryHandler handler) {
    return new QueueConsumer(this, options, handler);
  }

  @Override
  void release(ReleaseRequest request) {
    super.release(request);
    released = true;
  }

  /**
   * Releases the lease unless it was released already; a lease that has ended meanwhile
   * (NOT_FOUND, lost, expired) is not an error here.
   */
  @Override
  public void close() {
    if (released) {
      return;
    }
    try {
      release();
    } catch (KafkaLeaseException e) {
      if (e.code() != Status.Code.NOT_FOUND && !e.isLeaseEnded()) {
        throw e;
      }
    }
  }

  @Override
  public String toString() {
    return "Lease{group=" + group + ", topic=" + topic + ", partition=" + partition
        + ", fencingToken=" + Long.toUnsignedString(fencingToken) + ", offset=" + offset
        + ", highWatermark=" + highWatermark + ", expiresAt=" + expiresAt + "}";
  }
}
