package io.github.kafkalease.client;

import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.ThreadFactory;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;

/**
 * Runs a {@link DeliveryHandler} on every delivery of a lease in queue mode, from {@link
 * Lease#consumer}, or of a subscription's leases in queue mode, from {@link
 * Subscription#consumer}: up to the options' concurrency at once, on a thread pool. A handler that
 * returns accepts its record; one that throws has it retried (after the {@link
 * RetryException}'s delay, else the backoff for its attempt) or rejected to the dead letter
 * topic ({@link RejectException}, or the {@link ErrorPolicy}); past the queue's max deliveries
 * the gateway sends a failing record there too.
 *
 * <pre>{@code
 * try (QueueConsumer consumer = lease.consumer(ConsumeOptions.of(queue, 8), handler)) {
 *   ConsumeStats stats = consumer.run(); // until consumer.shutdown() (any thread) or the lease ends
 * }
 * lease.release(); // commits the queue's progress
 * }</pre>
 *
 * <p><b>Over a subscription</b> ({@link SubscribeOptions#queue}), the consumer reads the
 * subscription itself (do not read it meanwhile): it handles the deliveries of every lease the
 * member is assigned, answering each on its own lease, and skips the other events (at {@link
 * SubscriptionEvent.Revoking} the gateway releases the lease once none of its deliveries is in
 * flight). Its shutdown stops reading the subscription but keeps its stream open, so that the
 * member keeps its leases while the handlers drain and their answers land; it hands back what
 * is unfinished, then closes the subscription: the member leaves, and its leases are released,
 * committing their progress (after the member's session grace, if it has one). The
 * subscription's window ({@link QueueOptions#maxInFlight} of its queue settings, default 64)
 * is what is in flight; the consumer's concurrency is how many handlers run at once.
 *
 * <pre>{@code
 * Subscription member = client.subscribe(SubscribeOptions.of(group, topic).queue(queue));
 * try (QueueConsumer consumer = member.consumer(ConsumeOptions.of(8), handler)) {
 *   consumer.run(); // until consumer.shutdown() or the subscription ends; then the member leaves
 * }
 * }</pre>
 *
 * <p>{@link #shutdown} (from any thread, or an interrupt of the thread in {@link #run}) stops
 * taking deliveries: it closes the Deliver and hands back the deliveries received and not
 * started (a retry without delay, reason "the consumer shut down before handling it"), gives
 * the running handlers the drain time ({@link ConsumeOptions#drain}, 10 s by default) to
 * finish (renewing their deliveries meanwhile, which keeps the lease alive), then hands back
 * the records of those still running (their handlers are interrupted, and their answers
 * dropped). A handed-back record comes again with its attempt one higher. Then release the
 * lease: Release commits what was done. (Over a subscription: see above.)
 *
 * <p>An answer that fails (the connection, the lease ended) is dropped: the gateway delivers
 * the record again after its deadline, so a lost answer costs a redelivery, never a record.
 * {@link #run} runs once; {@link #close} shuts down and waits for {@link #run} to return.
 */
public final class QueueConsumer implements AutoCloseable {
  /** The reason of a hand-back at shutdown. */
  public static final String HANDED_BACK = "the consumer shut down before handling it";

  private static final AtomicInteger POOLS = new AtomicInteger();

  /** A delivery whose handler was started: answered by its handler or handed back, once. */
  private static final class Running {
    final Delivery delivery;
    final AtomicBoolean answered = new AtomicBoolean();
    Future<?> future;

    Running(Delivery delivery) {
      this.delivery = delivery;
    }
  }

  private final DeliverySource source;
  private final ConsumeOptions options;
  private final DeliveryHandler handler;
  private final Object lock = new Object();
  private final Map<Long, Running> running = new HashMap<>(); // guarded by lock
  private long nextId; // guarded by lock
  private final AtomicBoolean started = new AtomicBoolean();
  private final CountDownLatch finished = new CountDownLatch(1);
  private volatile boolean stopping;
  private final AtomicLong accepted = new AtomicLong();
  private final AtomicLong retried = new AtomicLong();
  private final AtomicLong rejected = new AtomicLong();
  private final AtomicLong handedBack = new AtomicLong();

  QueueConsumer(Lease lease, ConsumeOptions options, DeliveryHandler handler) {
    this(new DeliverySource.OfLease(lease, options.queue()), options, handler);
  }

  QueueConsumer(DeliverySource source, ConsumeOptions options, DeliveryHandler handler) {
    this.source = source;
    this.options = options;
    this.handler = handler;
  }

  /**
   * Consumes until {@link #shutdown}, an interrupt, or the lease's end (its release: the
   * Deliver ends) or the subscription's, then drains (and closes the subscription); returns
   * what it did.
   *
   * @throws KafkaLeaseException what ended the deliveries otherwise (after draining): the
   *     queue could not open (INVALID_ARGUMENT; NOT_FOUND, TOPIC_NOT_FOUND: the dead letter
   *     topic is missing), the lease ended, another Deliver took over, reopening failed; the
   *     error that ended the subscription
   * @throws IllegalStateException when called a second time
   */
  public ConsumeStats run() {
    if (!started.compareAndSet(false, true)) {
      throw new IllegalStateException("a QueueConsumer runs once");
    }
    try {
      return consume();
    } finally {
      finished.countDown();
    }
  }

  /** Stops taking deliveries; {@link #run} drains, hands back, and returns. Any thread. */
  public void shutdown() {
    stopping = true;
    source.wake();
    synchronized (lock) {
      lock.notifyAll();
    }
  }

  /** What it has done so far. */
  public ConsumeStats stats() {
    return new ConsumeStats(accepted.get(), retried.get(), rejected.get(), handedBack.get());
  }

  /** {@link #shutdown}, then waits for {@link #run} (if it started) to return. */
  @Override
  public void close() {
    shutdown();
    if (!started.get()) {
      return;
    }
    try {
      finished.await();
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
  }

  private ConsumeStats consume() {
    DeliverySource ds = source;
    ds.open();
    if (stopping) {
      ds.wake();
    }
    ExecutorService pool = options.executor();
    boolean ownPool = pool == null;
    if (ownPool) {
      pool = Executors.newFixedThreadPool(options.concurrency(), threads());
    }
    KafkaLeaseException ended = null;
    RuntimeException refused = null;
    boolean interrupted = false;
    try {
      while (!stopping) {
        synchronized (lock) {
          while (running.size() >= options.concurrency() && !stopping) {
            lock.wait();
          }
        }
        if (stopping) {
          break;
        }
        Delivery delivery;
        try {
          delivery = ds.poll();
        } catch (KafkaLeaseException e) {
          if (e.getCause() instanceof InterruptedException) {
            Thread.interrupted(); // drain and hand back first; set again at the end
            interrupted = true;
          } else {
            ended = e;
          }
          break;
        }
        if (delivery == null) {
          if (ds.isDone()) {
            break;
          }
          continue; // woken up
        }
        try {
          start(delivery, pool);
        } catch (RejectedExecutionException e) {
          refused = e; // the caller's executor is shut down
          break;
        }
      }
    } catch (InterruptedException e) {
      interrupted = true;
    }
    stopping = true;
    try {
      interrupted |= drain(ds);
    } finally {
      ds.close(); // after the drain: a subscription's member leaves only now
      if (ownPool) {
        pool.shutdown();
      }
      if (interrupted) {
        Thread.currentThread().interrupt();
      }
    }
    if (ended != null) {
      throw ended;
    }
    if (refused != null) {
      throw refused;
    }
    return stats();
  }

  private void start(Delivery delivery, ExecutorService pool) {
    Running r = new Running(delivery);
    long id;
    synchronized (lock) {
      id = nextId++;
      running.put(id, r);
    }
    try {
      r.future = pool.submit(() -> handle(id, r));
    } catch (RejectedExecutionException e) {
      synchronized (lock) {
        running.remove(id);
      }
      if (r.answered.compareAndSet(false, true)) {
        answer(delivery, HandlerError.retry(ErrorPolicy.describe(e)));
      }
      throw e;
    }
  }

  private void handle(long id, Running r) {
    try {
      HandlerError error = null;
      try {
        handler.handle(r.delivery);
      } catch (RetryException e) {
        error = e.error();
      } catch (RejectException e) {
        error = e.error();
      } catch (Throwable t) {
        error = decide(r.delivery, t);
      }
      if (r.answered.compareAndSet(false, true)) {
        answer(r.delivery, error);
      }
    } finally {
      synchronized (lock) {
        running.remove(id);
        lock.notifyAll();
      }
    }
  }

  private HandlerError decide(Delivery delivery, Throwable error) {
    try {
      HandlerError decided = options.errorPolicy().decide(delivery, error);
      if (decided != null) {
        return decided;
      }
    } catch (RuntimeException policyFailed) {
      // the default below
    }
    return ErrorPolicy.RETRY.decide(delivery, error);
  }

  /** Sends the answer for a handler's outcome (null: success), counting it. */
  private void answer(Delivery delivery, HandlerError error) {
    try {
      if (error == null) {
        accepted.incrementAndGet();
        Delivery.Outcome outcome = delivery.accept();
        var listener = options.onAccepted();
        if (listener != null) {
          try {
            listener.accept(delivery, outcome);
          } catch (RuntimeException ignored) {
            // the listener's own business
          }
        }
      } else if (error instanceof HandlerError.Reject reject) {
        rejected.incrementAndGet();
        delivery.reject(reject.reason());
      } else if (error instanceof HandlerError.Retry retry) {
        retried.incrementAndGet();
        Duration delay =
            retry.delay() != null ? retry.delay() : options.backoff(delivery.attempt());
        delivery.retry(delay, retry.reason());
      }
    } catch (KafkaLeaseException lost) {
      // A lost answer costs a redelivery after the deadline, never a record.
    }
  }

  /**
   * Closes the Deliver (no more deliveries), hands back those received and not started, gives
   * the running handlers the drain time (renewing their deliveries every third of the lease's
   * TTL, which keeps the lease alive with no Deliver open), then hands back the records of
   * those still running, and interrupts them. True if the calling thread was interrupted
   * meanwhile (the drain is then cut short).
   */
  private boolean drain(DeliverySource ds) {
    boolean interrupted = false;
    List<CompletableFuture<Delivery.Outcome>> backs = new ArrayList<>();
    List<Delivery> received = ds.pause();
    for (Delivery d : received) {
      backs.add(d.retryAsync(Duration.ZERO, HANDED_BACK));
    }
    long now = System.nanoTime();
    long deadline = now + options.drain().toNanos();
    long keepalive = ds.renewEvery().toNanos();
    long renewAt = now + keepalive;
    List<Running> left;
    while (true) {
      List<Running> renew = List.of();
      synchronized (lock) {
        now = System.nanoTime();
        if (running.isEmpty() || now >= deadline) {
          left = new ArrayList<>(running.values());
          break;
        }
        if (now >= renewAt) {
          renew = new ArrayList<>(running.values());
          renewAt = now + keepalive;
        } else {
          try {
            TimeUnit.NANOSECONDS.timedWait(lock, Math.min(deadline, renewAt) - now);
          } catch (InterruptedException e) {
            interrupted = true;
            left = new ArrayList<>(running.values());
            break;
          }
        }
      }
      for (Running r : renew) {
        if (!r.answered.get()) {
          r.delivery.renewAsync(); // a lost renewal costs nothing: the drain ends soon
        }
      }
    }
    for (Running r : left) {
      if (r.answered.compareAndSet(false, true)) {
        if (r.future != null) {
          r.future.cancel(true);
        }
        backs.add(r.delivery.retryAsync(Duration.ZERO, HANDED_BACK));
      }
    }
    for (CompletableFuture<Delivery.Outcome> back : backs) {
      try {
        if (back.get() == Delivery.Outcome.APPLIED) {
          handedBack.incrementAndGet();
        }
      } catch (InterruptedException e) {
        interrupted = true;
      } catch (Exception lost) {
        // Not handed back: the gateway delivers it again after its deadline.
      }
    }
    return interrupted;
  }

  private ThreadFactory threads() {
    String prefix =
        "kafka-lease-handler-" + POOLS.incrementAndGet() + "-" + source.name() + "-";
    AtomicInteger n = new AtomicInteger();
    return task -> {
      Thread t = new Thread(task, prefix + n.incrementAndGet());
      t.setDaemon(true);
      return t;
    };
  }
}
