package io.github.kafkalease.client;

import io.github.kafkalease.v1.DeliverRequest;
import io.github.kafkalease.v1.DeliverResponse;
import io.grpc.StatusRuntimeException;
import java.time.Duration;
import java.time.Instant;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.NoSuchElementException;
import java.util.Spliterator;
import java.util.Spliterators;
import java.util.concurrent.Semaphore;
import java.util.concurrent.TimeUnit;
import java.util.function.Supplier;
import java.util.stream.Stream;
import java.util.stream.StreamSupport;

/**
 * A lease's deliveries in queue mode, from {@link Lease#deliveries}: one {@link Delivery} at a
 * time ({@link Iterator}, {@link #poll}, {@link #stream}), each to be answered.
 *
 * <ul>
 *   <li>When the stream breaks (connection dropped, or UNAVAILABLE with the gateway's retry
 *       advice) it reopens the Deliver with the same settings, up to {@link
 *       QueueOptions#reconnectAttempts} times in a row with a backoff; deliveries in flight stay
 *       in flight meanwhile and can still be answered.
 *   <li>It ends ({@code hasNext()} false) when the gateway ends the Deliver with OK (after a
 *       release) or after {@link #close}; otherwise the error is thrown once as a {@link
 *       KafkaLeaseException}: the queue could not open (the dead letter topic does not exist:
 *       NOT_FOUND, TOPIC_NOT_FOUND; a setting out of range or not the queue's:
 *       INVALID_ARGUMENT), the lease ended, another Deliver took over (ABORTED, SUPERSEDED),
 *       or reopening failed every time.
 * </ul>
 *
 * One reading thread; {@link #close} may come from any thread. While open, the lease does not
 * expire. Closing it leaves the deliveries handed out in flight (answer them, or the gateway
 * delivers them again after their deadline).
 */
public final class Deliveries implements Iterator<Delivery>, AutoCloseable {
  private final Supplier<StreamCall<DeliverRequest, DeliverResponse>> open;
  private final Acks acks;
  private final int attempts;
  private final String topic;
  private final int partition;
  private final ArrayDeque<Delivery> ready = new ArrayDeque<>();
  /** Released by {@link #wake} and {@link #close}: cuts a reopen's backoff short. */
  private final Semaphore wakeups = new Semaphore(0);
  /** The open Deliver; null while waiting to reopen it. */
  private volatile StreamCall<DeliverRequest, DeliverResponse> call;
  private volatile boolean closed;
  private volatile long highWatermark = -1;
  private boolean done;
  private int failures;
  private long reopenAt;

  Deliveries(
      Supplier<StreamCall<DeliverRequest, DeliverResponse>> open,
      Acks acks,
      int attempts,
      String topic,
      int partition) {
    this.open = open;
    this.topic = topic;
    this.partition = partition;
    this.acks = acks;
    this.attempts = attempts;
    this.call = open.get();
  }

  @Override
  public boolean hasNext() {
    return fill(null);
  }

  @Override
  public Delivery next() {
    if (!fill(null)) {
      throw new NoSuchElementException("the Deliver has ended");
    }
    return ready.poll();
  }

  /**
   * The next delivery, or null if none came within {@code timeout} (null: wait as long as it
   * takes) or the Deliver has ended (see {@link #isDone}).
   */
  public Delivery poll(Duration timeout) {
    return fill(timeout) ? ready.poll() : null;
  }

  /** Whether the Deliver has ended (see {@link #hasNext}), without waiting. */
  public boolean isDone() {
    return done && ready.isEmpty();
  }

  /** The partition's high watermark as the gateway last reported it; -1 before the first. */
  public long highWatermark() {
    return highWatermark;
  }

  /** The deliveries as a sequential stream; closing it closes this Deliver. */
  public Stream<Delivery> stream() {
    return StreamSupport.stream(
            Spliterators.spliteratorUnknownSize(this, Spliterator.ORDERED | Spliterator.NONNULL),
            false)
        .onClose(this::close);
  }

  /**
   * Ends the Deliver (the lease stays held, in queue mode); a blocked reader sees the end. The
   * deliveries handed out stay in flight: answer them, or they come again after their deadline.
   */
  @Override
  public void close() {
    closed = true;
    StreamCall<DeliverRequest, DeliverResponse> c = call;
    if (c != null) {
      c.cancel();
    }
    wakeups.release();
  }

  /**
   * Makes a blocked (or the next) {@link #poll} return null at once; the Deliver stays open.
   * For a {@link #poll} loop only: an iterator would take the null for the end.
   */
  void wake() {
    StreamCall<DeliverRequest, DeliverResponse> c = call;
    if (c != null) {
      c.wake();
    }
    wakeups.release();
  }

  /**
   * The deliveries received and not handed out yet, without waiting or asking for more; they
   * are the caller's to answer now. For a reader about to {@link #close}.
   */
  List<Delivery> takeReceived() {
    StreamCall<DeliverRequest, DeliverResponse> c = call;
    if (c != null) {
      c.drainArrived().forEach(this::add);
    }
    List<Delivery> out = new ArrayList<>(ready);
    ready.clear();
    return out;
  }

  private void add(DeliverResponse response) {
    highWatermark = response.getHighWatermark();
    for (io.github.kafkalease.v1.Delivery d : response.getDeliveriesList()) {
      if (!d.hasRecord()) {
        continue;
      }
      Instant due = d.hasDeadline() ? Protos.instant(d.getDeadline()) : Instant.EPOCH;
      ready.add(
          new Delivery(
              topic, partition, ConsumedRecord.fromProto(d.getRecord()), d.getAttempt(), due, acks));
    }
  }

  /** True once a delivery is ready; false on timeout, wake-up or at the end. */
  private boolean fill(Duration timeout) {
    long deadline = timeout == null ? 0 : System.nanoTime() + timeout.toNanos();
    while (true) {
      if (!ready.isEmpty()) {
        return true;
      }
      if (done) {
        return false;
      }
      if (closed) {
        done = true;
        return false;
      }
      Duration left =
          timeout == null ? null : Duration.ofNanos(Math.max(0, deadline - System.nanoTime()));
      if (call == null) {
        if (!reopen(left)) {
          return false;
        }
        continue;
      }
      Object item;
      try {
        item = call.take(left);
      } catch (InterruptedException e) {
        throw KafkaLeaseException.interrupted(e);
      } catch (StatusRuntimeException e) {
        KafkaLeaseException error = KafkaLeaseException.from(e);
        if (closed) {
          done = true;
          return false;
        }
        if (!error.streamBroke() || failures >= attempts) {
          done = true;
          throw error;
        }
        failures++;
        reopenAt = System.nanoTime() + backoff(failures).toNanos();
        call = null;
        continue;
      }
      if (item == null) {
        return false;
      }
      if (item == StreamCall.END) {
        done = true;
        return false;
      }
      failures = 0;
      add((DeliverResponse) item);
    }
  }

  /**
   * Waits out the backoff (within {@code left}; a wake-up cuts it short), then opens the
   * Deliver again. False when it is not time yet.
   */
  private boolean reopen(Duration left) {
    long wait = reopenAt - System.nanoTime();
    if (wait > 0) {
      long nanos = left == null ? wait : Math.min(wait, left.toNanos());
      try {
        if (wakeups.tryAcquire(nanos, TimeUnit.NANOSECONDS)) {
          return false;
        }
      } catch (InterruptedException e) {
        throw KafkaLeaseException.interrupted(e);
      }
      if (System.nanoTime() < reopenAt) {
        return false;
      }
    }
    StreamCall<DeliverRequest, DeliverResponse> next = open.get();
    call = next;
    if (closed) {
      next.cancel();
    }
    return true;
  }

  /** 200 ms after the first failure in a row, doubling up to 3.2 s. */
  private static Duration backoff(int failures) {
    return Duration.ofMillis(100L << Math.min(failures, 5));
  }
}
