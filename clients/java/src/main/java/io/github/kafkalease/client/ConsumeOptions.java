package io.github.kafkalease.client;

import java.time.Duration;
import java.util.concurrent.ExecutorService;
import java.util.function.BiConsumer;

/**
 * How a {@link QueueConsumer} runs its handler: the queue, concurrency, backoff, drain. The
 * queue settings apply to a lease's consumer; a subscription's consumer has the
 * subscription's ({@link SubscribeOptions#queue}) and ignores these.
 */
public final class ConsumeOptions {
  private final QueueOptions queue;
  private final int concurrency;
  private Duration initialBackoff = Duration.ofMillis(100);
  private Duration maxBackoff = Duration.ofSeconds(30);
  private Duration drain = Duration.ofSeconds(10);
  private ErrorPolicy errorPolicy = ErrorPolicy.RETRY;
  private ExecutorService executor;
  private BiConsumer<Delivery, Delivery.Outcome> onAccepted;

  private ConsumeOptions(QueueOptions queue, int concurrency) {
    this.queue = queue.copy();
    this.concurrency = Math.max(1, concurrency);
  }

  /**
   * {@code concurrency} handlers at once (at least 1), and as many deliveries in flight unless
   * {@code queue} sets {@link QueueOptions#maxInFlight}; a backoff of 100 ms doubling up to
   * 30 s; 10 s to drain; failures retried ({@link ErrorPolicy#RETRY}). {@code queue} is copied.
   */
  public static ConsumeOptions of(QueueOptions queue, int concurrency) {
    return new ConsumeOptions(queue, concurrency);
  }

  /**
   * {@link #of(QueueOptions, int)} with the gateway's queue defaults: for {@link
   * Subscription#consumer}, whose queue settings are the subscription's ({@link
   * SubscribeOptions#queue}).
   */
  public static ConsumeOptions of(int concurrency) {
    return new ConsumeOptions(QueueOptions.defaults(), concurrency);
  }

  /**
   * The delay of a retry that names none: {@code initial} for the first delivery, doubling
   * with each attempt, at most {@code max}.
   */
  public ConsumeOptions backoff(Duration initial, Duration max) {
    this.initialBackoff = initial;
    this.maxBackoff = max;
    return this;
  }

  /**
   * At shutdown, how long running handlers may take to finish (default 10 s); the records of
   * those that do not are handed back (retried at once) and the handlers interrupted.
   */
  public ConsumeOptions drain(Duration drain) {
    this.drain = drain;
    return this;
  }

  /** How a handler's failure is answered (default {@link ErrorPolicy#RETRY}). */
  public ConsumeOptions errorPolicy(ErrorPolicy policy) {
    this.errorPolicy = policy;
    return this;
  }

  /**
   * Runs the handlers on {@code executor} (left running at the end) instead of a pool of
   * {@code concurrency} threads of the consumer's own. It needs {@code concurrency} threads
   * free for the concurrency to be reached.
   */
  public ConsumeOptions executor(ExecutorService executor) {
    this.executor = executor;
    return this;
  }

  /**
   * Called on the handler's thread once the accept of a delivery its handler handled has come
   * back, with its outcome ({@link Delivery.Outcome#APPLIED}: the record is done; {@link
   * Delivery.Outcome#STALE}: the delivery was no longer in flight; {@link
   * Delivery.Outcome#NOT_DELIVERED}: the gateway never delivered that offset); not called when
   * the accept failed (the record comes again). For what must happen only once a record is
   * done: log it, acknowledge it upstream. What it throws is ignored.
   */
  public ConsumeOptions onAccepted(BiConsumer<Delivery, Delivery.Outcome> listener) {
    this.onAccepted = listener;
    return this;
  }

  /** The queue's settings, with max in flight = concurrency when the caller left it unset. */
  QueueOptions queue() {
    QueueOptions q = queue.copy();
    if (q.maxInFlight() == 0) {
      q.maxInFlight(Math.min(concurrency, 10_000));
    }
    return q;
  }

  int concurrency() {
    return concurrency;
  }

  Duration drain() {
    return drain;
  }

  ErrorPolicy errorPolicy() {
    return errorPolicy;
  }

  BiConsumer<Delivery, Delivery.Outcome> onAccepted() {
    return onAccepted;
  }

  ExecutorService executor() {
    return executor;
  }

  /** The backoff for a delivery's {@code attempt}-th failure: initial × 2^(attempt-1), capped. */
  Duration backoff(int attempt) {
    int doublings = Math.min(Math.max(attempt, 1) - 1, 20);
    Duration d = initialBackoff.multipliedBy(1L << doublings);
    return d.compareTo(maxBackoff) > 0 ? maxBackoff : d;
  }
}
