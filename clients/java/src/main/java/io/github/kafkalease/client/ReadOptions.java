package io.github.kafkalease.client;

import io.github.kafkalease.v1.ReadRequest;
import java.time.Duration;

/** How a Read batches records, and how often a broken one is reopened. */
public final class ReadOptions {
  private final ReadRequest.Builder request = ReadRequest.newBuilder();
  private Long fromOffset;
  private int reconnectAttempts = 8;

  /** The gateway's defaults: 500 records, 1 MiB, 100 ms; up to 8 reopens in a row. */
  public static ReadOptions defaults() {
    return new ReadOptions();
  }

  /** Most records per batch (default 500; at most 10000). */
  public ReadOptions maxRecords(int maxRecords) {
    request.setMaxRecords(maxRecords);
    return this;
  }

  /**
   * Most bytes per batch (default 1 MiB; at most 4 MiB). A bound: the gateway sends at most 256
   * KiB of records per batch whatever this allows (a single larger record comes alone).
   */
  public ReadOptions maxBytes(int maxBytes) {
    request.setMaxBytes(maxBytes);
    return this;
  }

  /** How long the gateway may wait to fill a batch once it has a record (default 100 ms). */
  public ReadOptions maxWait(Duration maxWait) {
    request.setMaxWait(Protos.duration(maxWait));
    return this;
  }

  /** Start here (as a seek would) instead of at the lease's resume point. */
  public ReadOptions fromOffset(long offset) {
    this.fromOffset = offset;
    return this;
  }

  /**
   * How many times in a row a broken stream is reopened (backoff 50 ms doubling to 2 s)
   * before the error reaches the caller; 0 turns reopening off.
   */
  public ReadOptions reconnectAttempts(int attempts) {
    this.reconnectAttempts = attempts;
    return this;
  }

  ReadRequest request(String leaseId, Long from, Long ifSeekEpoch) {
    ReadRequest.Builder b = request.clone().setLeaseId(leaseId);
    if (from != null) {
      b.setFromOffset(from);
    }
    if (ifSeekEpoch != null) {
      b.setIfSeekEpoch(ifSeekEpoch);
    }
    return b.build();
  }

  Long fromOffset() {
    return fromOffset;
  }

  int reconnectAttempts() {
    return reconnectAttempts;
  }
}
