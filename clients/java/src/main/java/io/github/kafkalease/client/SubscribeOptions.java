package io.github.kafkalease.client;

import io.github.kafkalease.v1.OffsetReset;
import io.github.kafkalease.v1.SubscribeRequest;
import java.time.Duration;
import java.util.List;

/** What {@link KafkaLeaseClient#subscribe} joins with; unset fields take the gateway's defaults. */
public final class SubscribeOptions {
  private final SubscribeRequest.Builder request = SubscribeRequest.newBuilder();
  private Duration joinTimeout = Duration.ofSeconds(30);
  private boolean resubscribe = true;
  private QueueOptions queue;

  private SubscribeOptions(String group, List<String> topics) {
    request.setGroup(group).addAllTopics(topics);
  }

  /** Joins {@code group} for {@code topics} (1..16 distinct names). */
  public static SubscribeOptions of(String group, String... topics) {
    return new SubscribeOptions(group, List.of(topics));
  }

  /** A stable member id ([A-Za-z0-9._-], at most 128); by default the gateway makes one. */
  public SubscribeOptions memberId(String memberId) {
    request.setMemberId(memberId);
    return this;
  }

  /** A free-text label, shown in ListLeases. */
  public SubscribeOptions member(String member) {
    request.setMember(member);
    return this;
  }

  /** Most records per batch of one lease (default 500). */
  public SubscribeOptions maxRecords(int maxRecords) {
    request.setMaxRecords(maxRecords);
    return this;
  }

  /**
   * Most bytes per batch of one lease (default 1 MiB; at most 4 MiB). A bound: the gateway sends
   * at most 256 KiB of records per batch whatever this allows.
   */
  public SubscribeOptions maxBytes(int maxBytes) {
    request.setMaxBytes(maxBytes);
    return this;
  }

  /** How long a batch may wait to fill once it has a record (default 100 ms). */
  public SubscribeOptions maxWait(Duration maxWait) {
    request.setMaxWait(Protos.duration(maxWait));
    return this;
  }

  /** Where a lease starts when the group has no committed offset (default earliest). */
  public SubscribeOptions offsetReset(OffsetReset reset) {
    request.setOffsetReset(reset);
    return this;
  }

  /** The most partitions of each topic this member holds (default: no cap). */
  public SubscribeOptions maxPartitions(int max) {
    request.setMaxPartitions(max);
    return this;
  }

  /** How long a revoked lease waits for this member's commit (default 5 s). */
  public SubscribeOptions revokeGrace(Duration grace) {
    request.setRevokeGrace(Protos.duration(grace));
    return this;
  }

  /**
   * How long the member stays in the group, keeping its leases, after its stream ends
   * (default 0: leave at once; at most 5 min). Within it the {@link Subscription} subscribes
   * again by itself when its stream breaks (see {@link #resubscribe}); with 0 it cannot.
   */
  public SubscribeOptions sessionGrace(Duration grace) {
    request.setSessionGrace(Protos.duration(grace));
    return this;
  }

  /** How long {@link KafkaLeaseClient#subscribe} waits for the {@code joined} event (30 s). */
  public SubscribeOptions joinTimeout(Duration timeout) {
    this.joinTimeout = timeout;
    return this;
  }

  /**
   * Whether the subscription subscribes again by itself, within the {@link #sessionGrace},
   * when its stream breaks (default true; nothing to do without a session grace).
   */
  public SubscribeOptions resubscribe(boolean resubscribe) {
    this.resubscribe = resubscribe;
    return this;
  }

  /**
   * Queue mode for every lease the member is assigned: their records come as {@link
   * SubscriptionEvent.Deliveries}, each {@link Delivery} to be answered (the gateway commits
   * for the member), or are handled by {@link Subscription#consumer}. The window ({@link
   * QueueOptions#maxInFlight}, default 64) is shared by all the member's leases; the dead
   * letter topic (default {@code dlq.<group>.<topic>}, one per topic) must exist when the
   * Subscribe starts, and may not be one of the subscribed topics. At {@link
   * SubscriptionEvent.Revoking} the gateway stops delivering that lease and releases it
   * (committing its progress) once none of its deliveries is in flight, or at the deadline.
   * {@code queue} is copied; its {@link QueueOptions#reconnectAttempts} does not apply.
   */
  public SubscribeOptions queue(QueueOptions queue) {
    this.queue = queue.copy();
    request.setQueue(this.queue.settings());
    return this;
  }

  SubscribeRequest request() {
    return request.build();
  }

  /** The queue settings, or null when the subscription is not in queue mode. */
  QueueOptions queue() {
    return queue;
  }

  Duration joinTimeout() {
    return joinTimeout;
  }

  Duration sessionGrace() {
    return request.hasSessionGrace() ? Protos.duration(request.getSessionGrace()) : Duration.ZERO;
  }

  boolean resubscribe() {
    return resubscribe;
  }
}
