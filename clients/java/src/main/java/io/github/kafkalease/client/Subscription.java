package io.github.kafkalease.client;

import io.github.kafkalease.v1.SubscribeRequest;
import io.github.kafkalease.v1.SubscribeResponse;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.time.Duration;
import java.time.Instant;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.NoSuchElementException;
import java.util.concurrent.Semaphore;
import java.util.concurrent.TimeUnit;

/**
 * A member of a group, from {@link KafkaLeaseClient#subscribe}: a blocking iterator of its
 * {@link SubscriptionEvent}s. The member stays in the group while the stream is open; {@link
 * #close} cancels it, and the member leaves (its leases are released). Commit what you
 * processed before closing. One reading thread; {@link #close} may come from any thread.
 *
 * <p><b>Resubscribing.</b> With a {@link SubscribeOptions#sessionGrace session grace}, the
 * gateway keeps a member whose stream broke, with its leases, for that long. When the stream
 * breaks (the connection dropped, or UNAVAILABLE with the gateway's retry advice), the
 * subscription subscribes again by itself within the grace, with the same member id (the one
 * from {@code joined} if none was given), topics and settings, with a backoff (100 ms doubling
 * to 2 s, or the gateway's retry advice), and the events go on: the gateway answers with
 * {@code joined} (not handed out), then an {@link SubscriptionEvent.Assigned} again for each
 * lease it still holds (the same {@link Partition} object, at the lease's resume point: its
 * last commit), or a {@link SubscriptionEvent.Revoking}, and records from there, so records
 * handed out and not committed before the break come again. A lease that ended meanwhile is
 * not announced again. Once the grace has passed, the error that broke the stream is thrown.
 * Without a session grace (0, the default) nothing is resubscribed: the member left when the
 * stream broke, and the error is thrown at once. Errors that are not about the connection
 * (INVALID_ARGUMENT, PERMISSION_DENIED, NOT_FOUND, ...) end the subscription, and so does
 * MEMBER_ACTIVE (another live stream has the member id), after 3 tries: the gateway may not
 * have noticed yet that the broken stream ended. {@link #resubscribes} counts them.
 */
public final class Subscription implements Iterator<SubscriptionEvent>, AutoCloseable {
  private static final Duration FIRST_BACKOFF = Duration.ofMillis(100);
  private static final Duration MAX_BACKOFF = Duration.ofSeconds(2);
  /** How many MEMBER_ACTIVE answers a resubscription takes before it gives up. */
  private static final int MEMBER_ACTIVE_TRIES = 3;

  private final KafkaLeaseClient client;
  /** What the subscription joined with, with the member id the gateway confirmed. */
  private final SubscribeRequest request;
  private final String memberId;
  private final Duration sessionGrace;
  private final boolean resubscribe;
  private final Duration joinTimeout;
  /** The queue settings; null when not in queue mode. */
  private final QueueOptions queue;
  private final Map<String, Partition> partitions = new HashMap<>();
  /** Released by {@link #close}: cuts a resubscription's backoff short. */
  private final Semaphore wakeups = new Semaphore(0);
  /** The open stream; null while waiting to subscribe again. */
  private volatile StreamCall<SubscribeRequest, SubscribeResponse> call;
  private volatile String gateway;
  private volatile boolean closed;
  private volatile int resubscribes;
  private SubscriptionEvent pending;
  private boolean done;
  // While resubscribing (the reading thread's):
  /** The open stream is a resubscription waiting for its {@code joined}, until joinBy. */
  private boolean joining;
  private long joinBy;
  /** When the member's session grace ends, counted from the break. */
  private long graceEnds;
  private long retryAt;
  private int tries;
  private int memberActive;

  private Subscription(
      KafkaLeaseClient client,
      StreamCall<SubscribeRequest, SubscribeResponse> call,
      SubscribeOptions options,
      String memberId,
      String gateway) {
    this.client = client;
    this.call = call;
    this.request = options.request().toBuilder().setMemberId(memberId).build();
    this.memberId = memberId;
    this.gateway = gateway;
    this.sessionGrace = options.sessionGrace();
    this.resubscribe = options.resubscribe() && !sessionGrace.isZero();
    this.joinTimeout = options.joinTimeout();
    this.queue = options.queue();
  }

  static Subscription open(KafkaLeaseClient client, SubscribeOptions options) {
    StreamCall<SubscribeRequest, SubscribeResponse> call =
        StreamCall.start(client.async()::subscribe, options.request());
    Object first;
    try {
      first = call.take(options.joinTimeout());
    } catch (StatusRuntimeException e) {
      throw KafkaLeaseException.from(e);
    } catch (InterruptedException e) {
      call.cancel();
      throw KafkaLeaseException.interrupted(e);
    }
    if (first instanceof SubscribeResponse r && r.hasJoined()) {
      return new Subscription(
          client, call, options, r.getJoined().getMemberId(), r.getJoined().getGateway());
    }
    call.cancel();
    throw KafkaLeaseException.of(
        first == null ? Status.Code.DEADLINE_EXCEEDED : Status.Code.INTERNAL,
        first == null
            ? "no `joined` event within " + options.joinTimeout()
            : "the subscription's first event was not `joined`",
        null);
  }

  /** This member's id (the requested one, or the one the gateway made up). */
  public String memberId() {
    return memberId;
  }

  /** The gateway instance serving the subscription (since the last resubscription). */
  public String gateway() {
    return gateway;
  }

  /** How many times the subscription has subscribed again after its stream broke. */
  public int resubscribes() {
    return resubscribes;
  }

  /**
   * The next event, or null if none came within {@code timeout} (null: wait as long as it
   * takes) or the stream has ended (see {@link #isDone}). A broken stream is subscribed again
   * meanwhile (see the class comment).
   *
   * @throws KafkaLeaseException the status the gateway ended the stream with (the gateway
   *     shutting down, a transport failure with no session grace or past it: subscribe again)
   */
  public SubscriptionEvent poll(Duration timeout) {
    if (pending != null) {
      SubscriptionEvent e = pending;
      pending = null;
      return e;
    }
    long deadline = timeout == null ? 0 : System.nanoTime() + timeout.toNanos();
    while (!done) {
      if (closed) {
        done = true;
        return null;
      }
      Duration left =
          timeout == null ? null : Duration.ofNanos(Math.max(0, deadline - System.nanoTime()));
      StreamCall<SubscribeRequest, SubscribeResponse> c = call;
      if (c == null) {
        if (!subscribeAgain(left) && left != null && System.nanoTime() >= deadline) {
          return null;
        }
        continue;
      }
      Duration wait = left;
      if (joining) {
        Duration toJoin = Duration.ofNanos(Math.max(0, joinBy - System.nanoTime()));
        wait = left == null || toJoin.compareTo(left) < 0 ? toJoin : left;
      }
      Object item;
      try {
        item = c.take(wait);
      } catch (StatusRuntimeException e) {
        KafkaLeaseException error = KafkaLeaseException.from(e);
        if (closed) {
          done = true;
          return null;
        }
        broke(error);
        continue;
      } catch (InterruptedException e) {
        throw KafkaLeaseException.interrupted(e);
      }
      if (item == null) {
        if (joining && System.nanoTime() >= joinBy) {
          c.cancel();
          broke(
              KafkaLeaseException.of(
                  Status.Code.DEADLINE_EXCEEDED,
                  "no `joined` event within " + joinTimeout + " of subscribing again",
                  null));
          continue;
        }
        if (left != null && System.nanoTime() >= deadline) {
          return null;
        }
        continue;
      }
      if (item == StreamCall.END) {
        done = true;
        return null;
      }
      SubscribeResponse response = (SubscribeResponse) item;
      if (joining) {
        joining = false;
        if (!response.hasJoined()) {
          c.cancel();
          done = true;
          throw KafkaLeaseException.of(
              Status.Code.INTERNAL, "the resubscription's first event was not `joined`", null);
        }
        gateway = response.getJoined().getGateway();
        resubscribes++;
        continue;
      }
      SubscriptionEvent event = convert(response);
      if (event != null) {
        return event;
      }
    }
    return null;
  }

  /**
   * The stream (or a resubscription) failed with {@code error}: schedules the next
   * resubscription, or ends the subscription by throwing {@code error}.
   */
  private void broke(KafkaLeaseException error) {
    call = null;
    boolean wasJoining = joining;
    joining = false;
    long now = System.nanoTime();
    boolean again;
    if (!resubscribe) {
      again = false;
    } else if (!wasJoining) {
      // The established stream broke: the member's grace runs from now.
      again = error.streamBroke();
      graceEnds = now + sessionGrace.toNanos();
      tries = 0;
      memberActive = 0;
    } else {
      again =
          error.streamBroke()
              || error.code() == Status.Code.DEADLINE_EXCEEDED
              || ("MEMBER_ACTIVE".equals(error.reason()) && ++memberActive < MEMBER_ACTIVE_TRIES);
    }
    if (again) {
      Duration backoff = FIRST_BACKOFF.multipliedBy(1L << Math.min(tries, 5));
      if (backoff.compareTo(MAX_BACKOFF) > 0) {
        backoff = MAX_BACKOFF;
      }
      Duration advice = error.retryDelay().orElse(Duration.ZERO);
      tries++;
      retryAt = now + Math.max(backoff.toNanos(), advice.toNanos());
      again = retryAt < graceEnds;
    }
    if (!again) {
      done = true;
      throw error;
    }
  }

  /**
   * Waits out the backoff (within {@code left}), then subscribes again. False when it is not
   * time yet (or {@link #close} cut the wait short).
   */
  private boolean subscribeAgain(Duration left) {
    long wait = retryAt - System.nanoTime();
    if (wait > 0) {
      long nanos = left == null ? wait : Math.min(wait, left.toNanos());
      try {
        if (wakeups.tryAcquire(nanos, TimeUnit.NANOSECONDS)) {
          return false;
        }
      } catch (InterruptedException e) {
        throw KafkaLeaseException.interrupted(e);
      }
      if (System.nanoTime() < retryAt) {
        return false;
      }
    }
    long now = System.nanoTime();
    joining = true;
    joinBy = Math.min(now + joinTimeout.toNanos(), graceEnds);
    StreamCall<SubscribeRequest, SubscribeResponse> next =
        StreamCall.start(client.async()::subscribe, request);
    call = next;
    if (closed) {
      next.cancel();
    }
    return true;
  }

  /**
   * A consumer that runs {@code handler} on the deliveries of every lease the member is
   * assigned, up to {@link ConsumeOptions#of}'s concurrency at once, until {@link
   * QueueConsumer#shutdown} or the subscription's end; {@link QueueConsumer#run} runs it,
   * reading this subscription (do not read it meanwhile), and closes it at the end, after the
   * drain: the member leaves then. The subscription must be in queue mode ({@link
   * SubscribeOptions#queue}); the options' queue settings are ignored. See {@link
   * QueueConsumer}.
   *
   * @throws IllegalStateException when the subscription is not in queue mode
   */
  public QueueConsumer consumer(ConsumeOptions options, DeliveryHandler handler) {
    if (queue == null) {
      throw new IllegalStateException(
          "the subscription is not in queue mode: subscribe with SubscribeOptions.queue");
    }
    return new QueueConsumer(
        new DeliverySource.OfSubscription(this, queue.ackDeadline()), options, handler);
  }

  /** Whether the stream has ended (cancelled, or ended by the gateway), without waiting. */
  public boolean isDone() {
    return done && pending == null;
  }

  @Override
  public boolean hasNext() {
    if (pending == null) {
      pending = poll(null);
    }
    return pending != null;
  }

  @Override
  public SubscriptionEvent next() {
    if (!hasNext()) {
      throw new NoSuchElementException("the subscription has ended");
    }
    SubscriptionEvent e = pending;
    pending = null;
    return e;
  }

  /**
   * Ends the subscription: the member leaves the group and its leases are released (after its
   * session grace, if it has one: the gateway cannot tell a close from a broken connection).
   */
  @Override
  public void close() {
    closed = true;
    StreamCall<SubscribeRequest, SubscribeResponse> c = call;
    if (c != null) {
      c.cancel();
    }
    wakeups.release();
  }

  private Partition partition(String leaseId, String topic, int partition, long token) {
    return partitions.computeIfAbsent(
        leaseId, id -> new Partition(client, id, topic, partition, token));
  }

  private SubscriptionEvent convert(SubscribeResponse r) {
    switch (r.getEventCase()) {
      case ASSIGNED -> {
        var a = r.getAssigned();
        Partition p = partition(a.getLeaseId(), a.getTopic(), a.getPartition(), a.getFencingToken());
        return new SubscriptionEvent.Assigned(p, a.getOffset(), a.getHighWatermark());
      }
      case RECORDS -> {
        var b = r.getRecords();
        Partition p = partition(b.getLeaseId(), b.getTopic(), b.getPartition(), 0);
        if (!p.epochs.admit(b.getSeekEpoch()) || b.getRecordsCount() == 0) {
          return null; // made stale by a seek of this lease
        }
        return new SubscriptionEvent.Records(
            p, Batch.of(b.getRecordsList(), b.getHighWatermark(), b.getSeekEpoch(), 0));
      }
      case DELIVERIES -> {
        var d = r.getDeliveries();
        Partition p = partition(d.getLeaseId(), d.getTopic(), d.getPartition(), 0);
        Acks acks = p.acks();
        List<Delivery> out = new ArrayList<>(d.getDeliveriesCount());
        for (io.github.kafkalease.v1.Delivery x : d.getDeliveriesList()) {
          if (!x.hasRecord()) {
            continue;
          }
          Instant due = x.hasDeadline() ? Protos.instant(x.getDeadline()) : Instant.EPOCH;
          out.add(
              new Delivery(
                  p.topic(),
                  p.partition(),
                  ConsumedRecord.fromProto(x.getRecord()),
                  x.getAttempt(),
                  due,
                  acks));
        }
        if (out.isEmpty()) {
          return null;
        }
        return new SubscriptionEvent.Deliveries(p, List.copyOf(out), d.getHighWatermark());
      }
      case REVOKING -> {
        var v = r.getRevoking();
        Instant deadline =
            v.hasDeadline() ? Protos.instant(v.getDeadline()) : Instant.now();
        return new SubscriptionEvent.Revoking(
            partition(v.getLeaseId(), v.getTopic(), v.getPartition(), 0), deadline);
      }
      case REVOKED -> {
        var v = r.getRevoked();
        Partition p = partition(v.getLeaseId(), v.getTopic(), v.getPartition(), 0);
        partitions.remove(v.getLeaseId());
        return new SubscriptionEvent.Revoked(p, v.getReason(), v.getMessage());
      }
      default -> {
        return null; // a later `joined`, or an event this version does not know
      }
    }
  }
}
