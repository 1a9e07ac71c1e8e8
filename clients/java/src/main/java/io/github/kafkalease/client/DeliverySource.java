package io.github.kafkalease.client;

import java.time.Duration;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.List;

/**
 * Where a {@link QueueConsumer}'s deliveries come from: a lease's Deliver ({@link Lease}) or a
 * subscription in queue mode ({@link Subscription}). Read by the consumer's thread; {@link
 * #wake} from any thread.
 */
interface DeliverySource {
  /** Starts taking deliveries (the consumer's thread, once). */
  void open();

  /**
   * The next delivery; null on a {@link #wake} or at the end ({@link #isDone}).
   *
   * @throws KafkaLeaseException what ended the deliveries (an interrupt: its cause is the
   *     {@link InterruptedException})
   */
  Delivery poll();

  /** Whether the deliveries have ended. */
  boolean isDone();

  /** Makes a blocked (or the next) {@link #poll} return null. Any thread, even before open. */
  void wake();

  /**
   * Stops taking deliveries and returns those received and not handed out (the consumer hands
   * them back). What keeps the deliveries in flight answerable stays open until {@link
   * #close}.
   */
  List<Delivery> pause();

  /** After the drain: ends the source. */
  void close();

  /** How often the running handlers' deliveries are renewed while draining. */
  Duration renewEvery();

  /** A name for the consumer's threads. */
  String name();

  /** A lease's Deliver: paused by closing it (the lease stays held while it is renewed). */
  final class OfLease implements DeliverySource {
    private final Lease lease;
    private final QueueOptions queue;
    private volatile Deliveries deliveries;

    OfLease(Lease lease, QueueOptions queue) {
      this.lease = lease;
      this.queue = queue;
    }

    @Override
    public void open() {
      deliveries = lease.deliveries(queue);
    }

    @Override
    public Delivery poll() {
      return deliveries.poll(null);
    }

    @Override
    public boolean isDone() {
      return deliveries.isDone();
    }

    @Override
    public void wake() {
      Deliveries d = deliveries;
      if (d != null) {
        d.wake();
      }
    }

    @Override
    public List<Delivery> pause() {
      List<Delivery> received = deliveries.takeReceived();
      deliveries.close();
      return received;
    }

    @Override
    public void close() {
      Deliveries d = deliveries;
      if (d != null) {
        d.close();
      }
    }

    @Override
    public Duration renewEvery() {
      // A third of the TTL: the renewals keep the lease alive with no Deliver open.
      return Duration.ofNanos(Math.max(lease.ttl().toNanos() / 3, 100_000_000L));
    }

    @Override
    public String name() {
      return lease.topic() + "-" + lease.partition();
    }
  }

  /**
   * A subscription in queue mode: paused by no longer reading it, its stream left open so that
   * the member keeps its leases while the handlers drain and their answers land; closed by
   * closing the subscription (the member leaves: its leases are released, committing their
   * progress).
   */
  final class OfSubscription implements DeliverySource {
    /** How long one wait on the subscription lasts before looking at wake-ups. */
    private static final Duration TICK = Duration.ofMillis(200);

    private final Subscription subscription;
    private final Duration ackDeadline;
    private final ArrayDeque<Delivery> pending = new ArrayDeque<>();
    private volatile boolean woken;
    private boolean done;

    OfSubscription(Subscription subscription, Duration ackDeadline) {
      this.subscription = subscription;
      this.ackDeadline = ackDeadline;
    }

    @Override
    public void open() {}

    @Override
    public Delivery poll() {
      while (true) {
        if (!pending.isEmpty()) {
          return pending.poll();
        }
        if (woken) {
          woken = false;
          return null;
        }
        SubscriptionEvent event = subscription.poll(TICK);
        if (event == null) {
          if (subscription.isDone()) {
            done = true;
            return null;
          }
          continue;
        }
        if (event instanceof SubscriptionEvent.Deliveries d) {
          pending.addAll(d.deliveries());
        }
        // Assigned, Revoking, Revoked: the gateway moves a revoked lease once none of its
        // deliveries is in flight; nothing to do here.
      }
    }

    @Override
    public boolean isDone() {
      return done && pending.isEmpty();
    }

    @Override
    public void wake() {
      woken = true;
    }

    @Override
    public List<Delivery> pause() {
      List<Delivery> out = new ArrayList<>(pending);
      pending.clear();
      return out;
    }

    @Override
    public void close() {
      subscription.close();
    }

    @Override
    public Duration renewEvery() {
      // The open stream keeps the leases; renewals keep the deliveries' deadlines ahead.
      long third = ackDeadline.toNanos() / 3;
      return Duration.ofNanos(Math.max(100_000_000L, Math.min(third, 2_000_000_000L)));
    }

    @Override
    public String name() {
      return "subscription";
    }
  }
}
