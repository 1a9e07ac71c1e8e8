package io.github.kafkalease.client;

import java.util.concurrent.atomic.AtomicLong;

/**
 * The newest seek epoch a lease's client has seen, shared by the lease (whose seek raises it)
 * and its record streams (which drop batches of older epochs). Epochs are unsigned.
 */
final class EpochFilter {
  private final AtomicLong newest = new AtomicLong();

  long newest() {
    return newest.get();
  }

  /** Records an epoch from a SeekResponse; never lowers the newest one. */
  void observe(long epoch) {
    newest.accumulateAndGet(epoch, (a, b) -> Long.compareUnsigned(a, b) >= 0 ? a : b);
  }

  /** Whether a batch of {@code epoch} may be handed out (raising the newest seen to it). */
  boolean admit(long epoch) {
    observe(epoch);
    return !isStale(epoch);
  }

  /** Whether an epoch newer than {@code epoch} has been seen. */
  boolean isStale(long epoch) {
    return Long.compareUnsigned(epoch, newest.get()) < 0;
  }
}
