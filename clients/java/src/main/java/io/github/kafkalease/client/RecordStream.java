package io.github.kafkalease.client;

import io.github.kafkalease.v1.ReadRequest;
import io.github.kafkalease.v1.ReadResponse;
import io.grpc.StatusRuntimeException;
import java.time.Duration;
import java.util.Iterator;
import java.util.List;
import java.util.NoSuchElementException;
import java.util.Spliterator;
import java.util.Spliterators;
import java.util.function.BiFunction;
import java.util.stream.Stream;
import java.util.stream.StreamSupport;

/**
 * An open Read on a lease, from {@link Lease#records}: its records one by one ({@link
 * Iterator}, {@link #poll}, {@link #stream}) or a batch at a time ({@link #nextBatch}).
 *
 * <ul>
 *   <li>Batches of a seek epoch older than the newest one the lease has seen are dropped, so
 *       once {@link Lease#seek} returns, the next record handed out is at the sought offset.
 *   <li>When the stream breaks (connection dropped, or UNAVAILABLE with the gateway's retry
 *       advice) it reopens the Read at the offset after the last record it handed out, so
 *       nothing is skipped or repeated; after a seek, at the lease's resume point instead.
 *   <li>It ends ({@code hasNext()} false) when the gateway ends the Read with OK (after a
 *       release) or after {@link #close}; otherwise the error is thrown once as a {@link
 *       KafkaLeaseException} (lease lost or expired, superseded, reopening failed every time).
 * </ul>
 *
 * One reading thread; {@link #close} may come from any thread. While open, the lease does not
 * expire.
 */
public final class RecordStream implements Iterator<ConsumedRecord>, AutoCloseable {
  private static final Duration FIRST_BACKOFF = Duration.ofMillis(50);
  private static final Duration MAX_BACKOFF = Duration.ofSeconds(2);

  private final BiFunction<Long, Long, StreamCall<ReadRequest, ReadResponse>> open;
  private final EpochFilter epochs;
  private final int attempts;
  private volatile StreamCall<ReadRequest, ReadResponse> call;
  private volatile boolean closed;
  private boolean done;
  private int failures;
  private List<ConsumedRecord> buffer = List.of();
  private int index;
  private long bufferEpoch;
  private long bufferHighWatermark;
  /** The buffered response's next offset (0 when the gateway sent none). */
  private long bufferAfter;
  private boolean delivered;
  private long deliveredNext;
  private long deliveredEpoch;

  RecordStream(
      BiFunction<Long, Long, StreamCall<ReadRequest, ReadResponse>> open,
      Long fromOffset,
      EpochFilter epochs,
      int attempts) {
    this.open = open;
    this.epochs = epochs;
    this.attempts = attempts;
    this.call = open.apply(fromOffset, null);
  }

  @Override
  public boolean hasNext() {
    return fill(null);
  }

  @Override
  public ConsumedRecord next() {
    if (!fill(null)) {
      throw new NoSuchElementException("the Read has ended");
    }
    return handOut(index + 1).get(0);
  }

  /** The next record, or null if none came within {@code timeout} or the Read has ended. */
  public ConsumedRecord poll(Duration timeout) {
    return fill(timeout) ? handOut(index + 1).get(0) : null;
  }

  /**
   * The rest of the current batch (or the next one), or null if none came within {@code
   * timeout} (null: wait as long as it takes) or the Read has ended.
   */
  public Batch nextBatch(Duration timeout) {
    if (!fill(timeout)) {
      return null;
    }
    // The rest of the response: its next offset is the batch's.
    return new Batch(handOut(buffer.size()), bufferHighWatermark, bufferEpoch, bufferAfter);
  }

  /** Whether the Read has ended (see {@link #hasNext}), without waiting. */
  public boolean isDone() {
    return done && index >= buffer.size();
  }

  /** The records as a sequential stream; closing it closes this Read. */
  public Stream<ConsumedRecord> stream() {
    return StreamSupport.stream(
            Spliterators.spliteratorUnknownSize(this, Spliterator.ORDERED | Spliterator.NONNULL),
            false)
        .onClose(this::close);
  }

  /** Closes the Read (the lease stays held); a blocked reader sees the end. */
  @Override
  public void close() {
    closed = true;
    call.cancel();
  }

  private List<ConsumedRecord> handOut(int end) {
    List<ConsumedRecord> out = List.copyOf(buffer.subList(index, end));
    index = end;
    delivered = true;
    deliveredNext = out.get(out.size() - 1).offset() + 1;
    deliveredEpoch = bufferEpoch;
    return out;
  }

  /** True once a record of a current epoch is buffered; false on timeout or at the end. */
  private boolean fill(Duration timeout) {
    long deadline = timeout == null ? 0 : System.nanoTime() + timeout.toNanos();
    while (true) {
      if (index < buffer.size()) {
        if (!epochs.isStale(bufferEpoch)) {
          return true;
        }
        buffer = List.of(); // a seek made what is left stale
        index = 0;
      }
      if (done) {
        return false;
      }
      Duration left =
          timeout == null ? null : Duration.ofNanos(Math.max(0, deadline - System.nanoTime()));
      Object item;
      try {
        item = call.take(left);
      } catch (InterruptedException e) {
        throw KafkaLeaseException.interrupted(e);
      } catch (StatusRuntimeException e) {
        KafkaLeaseException error = KafkaLeaseException.from(e);
        if (closed || !error.streamBroke() || failures >= attempts) {
          done = true;
          throw error;
        }
        reopen();
        continue;
      }
      if (item == null) {
        return false;
      }
      if (item == StreamCall.END) {
        done = true;
        return false;
      }
      ReadResponse response = (ReadResponse) item;
      if (epochs.admit(response.getSeekEpoch()) && response.getRecordsCount() > 0) {
        Batch batch =
            Batch.of(
                response.getRecordsList(),
                response.getHighWatermark(),
                response.getSeekEpoch(),
                response.getNextOffset());
        buffer = batch.records();
        index = 0;
        bufferEpoch = batch.seekEpoch();
        bufferHighWatermark = batch.highWatermark();
        bufferAfter = batch.after();
        failures = 0;
      }
    }
  }

  /**
   * Opens a new Read after a pause, right after the last record handed out while the lease is
   * still at that record's seek epoch (the gateway checks, so a seek racing the reopen wins);
   * at the lease's resume point if a seek is known to have happened since.
   */
  private void reopen() {
    Duration backoff = FIRST_BACKOFF.multipliedBy(1L << Math.min(failures, 6));
    failures++;
    try {
      Thread.sleep((backoff.compareTo(MAX_BACKOFF) > 0 ? MAX_BACKOFF : backoff).toMillis());
    } catch (InterruptedException e) {
      throw KafkaLeaseException.interrupted(e);
    }
    boolean resume = delivered && !epochs.isStale(deliveredEpoch);
    StreamCall<ReadRequest, ReadResponse> next =
        resume ? open.apply(deliveredNext, deliveredEpoch) : open.apply(null, null);
    call = next;
    if (closed) {
      next.cancel();
    }
  }
}
