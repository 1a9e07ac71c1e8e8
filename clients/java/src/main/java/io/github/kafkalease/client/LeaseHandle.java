package io.github.kafkalease.client;

import io.github.kafkalease.v1.CommitRequest;
import io.github.kafkalease.v1.ReleaseRequest;
import io.github.kafkalease.v1.SeekResponse;

/**
 * A held lease on one partition, from {@link KafkaLeaseClient#acquire} ({@link Lease}) or a
 * subscription's {@code assigned} event ({@link Partition}): commit, seek and release it.
 * The lease id is a bearer credential: {@link #toString} leaves it out.
 */
public abstract sealed class LeaseHandle permits Lease, Partition {
  final KafkaLeaseClient client;
  final String leaseId;
  final String topic;
  final int partition;
  final long fencingToken;
  final EpochFilter epochs = new EpochFilter();
  private Acks acks;

  LeaseHandle(KafkaLeaseClient client, String leaseId, String topic, int partition, long token) {
    this.client = client;
    this.leaseId = leaseId;
    this.topic = topic;
    this.partition = partition;
    this.fencingToken = token;
  }

  /**
   * The lease's answers in queue mode: one batching sender per lease, whatever Deliver (or
   * subscription stream) the deliveries came on.
   */
  synchronized Acks acks() {
    if (acks == null) {
      acks = new Acks(client, leaseId);
    }
    return acks;
  }

  /** The opaque lease id: whoever has it can commit and release, so do not log it. */
  public String leaseId() {
    return leaseId;
  }

  /** The topic. */
  public String topic() {
    return topic;
  }

  /** The partition. */
  public int partition() {
    return partition;
  }

  /**
   * Greater than every token issued before for this (group, topic, partition): an unsigned
   * 64-bit number (compare with {@link Long#compareUnsigned}, print with {@link
   * Long#toUnsignedString}); 0 when the event that named the lease did not carry it.
   */
  public long fencingToken() {
    return fencingToken;
  }

  /** The newest seek epoch seen for this lease (0 until the first seek). */
  public long seekEpoch() {
    return epochs.newest();
  }

  /**
   * Repositions the lease. Once this returns, no batch from before the seek is handed out:
   * the next one starts at {@link SeekTo.Result#offset()}. Commits nothing.
   */
  public SeekTo.Result seek(SeekTo to) {
    SeekResponse r = KafkaLeaseClient.call(() -> client.blocking().seek(to.request(leaseId)));
    epochs.observe(r.getSeekEpoch());
    return new SeekTo.Result(r.getOffset(), r.getSeekEpoch());
  }

  /** Commits {@code offset} (the next offset to read: last processed + 1), fenced by the lease. */
  public void commit(long offset) {
    commit(CommitRequest.newBuilder().setLeaseId(leaseId).setOffset(offset).build());
  }

  /** As {@link #commit(long)}, storing {@code metadata} (at most 4057 UTF-8 bytes) with it. */
  public void commit(long offset, String metadata) {
    commit(
        CommitRequest.newBuilder()
            .setLeaseId(leaseId)
            .setOffset(offset)
            .setMetadata(metadata)
            .build());
  }

  private void commit(CommitRequest request) {
    KafkaLeaseClient.call(() -> client.blocking().commit(request));
  }

  /** Ends the lease: its open Read ends, and another client can acquire the partition at once. */
  public void release() {
    release(ReleaseRequest.newBuilder().setLeaseId(leaseId).build());
  }

  /** Commits {@code offset} (fenced; if it is rejected the lease is kept), then releases. */
  public void release(long commitOffset) {
    release(ReleaseRequest.newBuilder().setLeaseId(leaseId).setCommitOffset(commitOffset).build());
  }

  void release(ReleaseRequest request) {
    KafkaLeaseClient.call(() -> client.blocking().release(request));
  }

  @Override
  public String toString() {
    return getClass().getSimpleName() + "{topic=" + topic + ", partition=" + partition
        + ", fencingToken=" + Long.toUnsignedString(fencingToken) + "}";
  }
}
