package io.github.kafkalease.client;

import io.github.kafkalease.v1.DeliverRequest;
import io.github.kafkalease.v1.DeliveryOrder;
import io.github.kafkalease.v1.QueueSettings;
import java.time.Duration;

/**
 * A queue's settings, for {@link Lease#deliveries(QueueOptions)}, {@link ConsumeOptions} and
 * {@link SubscribeOptions#queue}. Everything left unset takes the gateway's default; a lease
 * keeps the settings of its first Deliver, and a later one (a reopen, a second consumer) must
 * ask for the same. For a subscription, the window ({@link #maxInFlight}, {@link
 * #maxInFlightBytes}) is shared by all the member's leases, the dead letter topic serves
 * every topic of the subscription, and {@link #reconnectAttempts} does not apply.
 */
public final class QueueOptions {
  /** How a queue's records may be handed out relative to each other. */
  public enum Ordering {
    /** One record at a time, in offset order (the default). */
    PARTITION,
    /**
     * The records of one key one at a time, in offset order; keys in parallel. A record being
     * retried holds back its key only. Records without a key are ordered by nothing.
     */
    KEY,
    /** Any record, in parallel. */
    UNORDERED
  }

  private final DeliverRequest.Builder request;
  private int reconnectAttempts = 8;

  private QueueOptions(DeliverRequest.Builder request) {
    this.request = request;
  }

  /**
   * The gateway's defaults: partition order, 64 in flight (4 MiB), a 30 s ack deadline, 5
   * deliveries, dead letters to {@code dlq.<group>.<topic>}; up to 8 reopens in a row.
   */
  public static QueueOptions defaults() {
    return new QueueOptions(DeliverRequest.newBuilder());
  }

  /** How records may be handed out relative to each other (default {@link Ordering#PARTITION}). */
  public QueueOptions ordering(Ordering ordering) {
    request.setOrdering(
        switch (ordering) {
          case PARTITION -> DeliveryOrder.DELIVERY_ORDER_PARTITION;
          case KEY -> DeliveryOrder.DELIVERY_ORDER_KEY;
          case UNORDERED -> DeliveryOrder.DELIVERY_ORDER_UNORDERED;
        });
    return this;
  }

  /** Most deliveries handed out and not answered at once (1..10000; default 64). */
  public QueueOptions maxInFlight(int records) {
    request.setMaxInFlight(records);
    return this;
  }

  /**
   * Most bytes of records (keys, values, headers) in flight at once (default 4 MiB; at most
   * 64 MiB); a single record larger than this goes out alone.
   */
  public QueueOptions maxInFlightBytes(int bytes) {
    request.setMaxInFlightBytes(bytes);
    return this;
  }

  /**
   * How long a delivery may go unanswered before it is delivered again (1 s..1 h; default
   * 30 s). {@link Delivery#renew} extends one delivery's.
   */
  public QueueOptions ackDeadline(Duration deadline) {
    request.setAckDeadline(Protos.duration(deadline));
    return this;
  }

  /**
   * Deliveries after which a record that fails again goes to the dead letter topic (1..100;
   * default 5).
   */
  public QueueOptions maxDeliveries(int deliveries) {
    request.setMaxDeliveries(deliveries);
    return this;
  }

  /**
   * Where rejected records go (default {@code dlq.<group>.<topic>}): a topic that must exist
   * when the queue opens (else NOT_FOUND, TOPIC_NOT_FOUND naming it), not the lease's own.
   */
  public QueueOptions deadLetterTopic(String topic) {
    request.setDeadLetterTopic(topic);
    return this;
  }

  /**
   * How many times in a row a broken Deliver is reopened (backoff 200 ms doubling to 3.2 s)
   * before the error reaches the caller (default 8); 0 turns reopening off.
   */
  public QueueOptions reconnectAttempts(int attempts) {
    this.reconnectAttempts = attempts;
    return this;
  }

  /** A copy, so that a consumer can fill in what the caller left unset. */
  QueueOptions copy() {
    QueueOptions c = new QueueOptions(request.clone());
    c.reconnectAttempts = reconnectAttempts;
    return c;
  }

  int maxInFlight() {
    return request.getMaxInFlight();
  }

  DeliverRequest request(String leaseId) {
    return request.clone().setLeaseId(leaseId).build();
  }

  /** The settings as a Subscribe carries them. */
  QueueSettings settings() {
    QueueSettings.Builder s =
        QueueSettings.newBuilder()
            .setOrdering(request.getOrdering())
            .setMaxInFlight(request.getMaxInFlight())
            .setMaxInFlightBytes(request.getMaxInFlightBytes())
            .setMaxDeliveries(request.getMaxDeliveries())
            .setDeadLetterTopic(request.getDeadLetterTopic());
    if (request.hasAckDeadline()) {
      s.setAckDeadline(request.getAckDeadline());
    }
    return s.build();
  }

  /** The ack deadline asked for, or the gateway's default (30 s). */
  Duration ackDeadline() {
    return request.hasAckDeadline()
        ? Protos.duration(request.getAckDeadline())
        : Duration.ofSeconds(30);
  }

  int reconnectAttempts() {
    return reconnectAttempts;
  }
}
