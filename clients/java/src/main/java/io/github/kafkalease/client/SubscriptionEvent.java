package io.github.kafkalease.client;

import java.time.Instant;
import java.util.List;

/**
 * What a {@link Subscription} carries, per lease in this order: {@link Assigned}, {@link
 * Records} batches (or {@link Deliveries}, in queue mode: {@link SubscribeOptions#queue}), then {@link Revoking} and {@link Revoked} (or {@link Revoked} alone). After
 * the subscription subscribed again by itself (its stream broke within its session grace),
 * each lease the member still holds is announced again: {@link Assigned} at its last commit,
 * with records from there, or {@link Revoking}.
 */
public sealed interface SubscriptionEvent {
  /** The lease the event is about. */
  Partition partition();

  /**
   * The member now holds a lease; its records follow. Again for a lease it holds already
   * (the same {@link Partition}) after a resubscription: records start over from {@code offset}.
   *
   * @param partition the lease
   * @param offset where its records start: the committed offset, else the reset position
   * @param highWatermark the partition's high watermark at the grant
   */
  record Assigned(Partition partition, long offset, long highWatermark)
      implements SubscriptionEvent {}

  /**
   * A batch of one of the member's leases (stale seek epochs already dropped).
   *
   * @param partition the lease
   * @param batch its records, in offset order
   */
  record Records(Partition partition, Batch batch) implements SubscriptionEvent {}

  /**
   * Deliveries of one of the member's leases, in queue mode ({@link SubscribeOptions#queue}):
   * answer each one ({@link Delivery#accept}, {@link Delivery#retry}, {@link Delivery#reject})
   * before its deadline; the answers of a lease go batched on that lease. The gateway commits.
   *
   * @param partition the lease
   * @param deliveries its deliveries, in the order handed out
   * @param highWatermark the partition's high watermark as the gateway last saw it
   */
  record Deliveries(Partition partition, List<Delivery> deliveries, long highWatermark)
      implements SubscriptionEvent {}

  /**
   * The lease moves to another member: no records of it follow. Commit what was processed
   * before {@code deadline}; the lease is released after that commit, or then.
   *
   * @param partition the lease
   * @param deadline when it is released at the latest
   */
  record Revoking(Partition partition, Instant deadline) implements SubscriptionEvent {}

  /**
   * The lease has ended.
   *
   * @param partition the lease
   * @param reason why: an ErrorReason name (LEASE_REVOKED after Revoking, LEASE_LOST, ...)
   * @param message why, for people
   */
  record Revoked(Partition partition, String reason, String message)
      implements SubscriptionEvent {}
}
