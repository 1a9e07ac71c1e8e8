package io.github.kafkalease.client;

import io.github.kafkalease.v1.AckType;
import io.github.kafkalease.v1.Acknowledgement;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.time.Instant;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;

/**
 * One hand-out of a record in queue mode, from {@link Deliveries} or a subscription's {@link
 * SubscriptionEvent.Deliveries}: answer it with {@link
 * #accept}, {@link #retry}, {@link #reject}, or {@link #renew} it, before its {@link
 * #deadline} (else the gateway delivers the record again, its attempt one higher).
 *
 * <p>Answers of a lease travel batched: at most one Acknowledge call per lease is in flight,
 * and the answers made meanwhile go together in the next one. Each answer returns {@link
 * Outcome#APPLIED}, {@link Outcome#STALE} or {@link Outcome#NOT_DELIVERED}; the blocking
 * methods wait for it, the {@code
 * ...Async} ones return at once. Thread-safe: answer from any thread, even after the {@link
 * Deliveries} it came from was closed or broke. An answer after the lease ended (released,
 * lost, expired, moved to another holder) fails with the lease-ended error ({@link
 * KafkaLeaseException#isLeaseEnded}).
 */
public final class Delivery {
  /** What became of an answer. */
  public enum Outcome {
    /** Applied. */
    APPLIED,
    /**
     * Changed nothing: the delivery was no longer in flight (its deadline passed and it was
     * delivered again, or it was answered already), or the record is done. An accept of a
     * record not done yet still counts, whichever delivery it answers.
     */
    STALE,
    /**
     * Changed nothing: no record at this offset was ever delivered on the partition, by this
     * holder or an earlier one (not handed out yet, or past the partition's end). Usually a
     * bug of the caller, such as an offset off by one.
     */
    NOT_DELIVERED
  }

  /** The most UTF-8 bytes of a reason the gateway takes; longer ones are cut. */
  static final int MAX_REASON_BYTES = 1024;

  /** The longest retry delay the gateway takes; longer ones are shortened to it. */
  static final Duration MAX_RETRY_DELAY = Duration.ofHours(1);

  private final String topic;
  private final int partition;
  private final ConsumedRecord record;
  private final int attempt;
  private final Instant deadline;
  private final Acks acks;

  Delivery(
      String topic, int partition, ConsumedRecord record, int attempt, Instant deadline, Acks acks) {
    this.topic = topic;
    this.partition = partition;
    this.record = record;
    this.attempt = attempt;
    this.deadline = deadline;
    this.acks = acks;
  }

  /** The record's topic. */
  public String topic() {
    return topic;
  }

  /** The record's partition. */
  public int partition() {
    return partition;
  }

  /** The record. */
  public ConsumedRecord record() {
    return record;
  }

  /** The record's offset. */
  public long offset() {
    return record.offset();
  }

  /** 1 for the first delivery, one more for each after it (carried over handovers). */
  public int attempt() {
    return attempt;
  }

  /** When the gateway delivers the record again unless it is answered (or renewed). */
  public Instant deadline() {
    return deadline;
  }

  /** Handled: the record is done. */
  public Outcome accept() {
    return await(acceptAsync());
  }

  /**
   * Not handled: deliver it again, not before {@code delay} (at most 1 h). At its last
   * delivery ({@link QueueOptions#maxDeliveries}) the record goes to the dead letter topic
   * instead, with {@code reason}.
   */
  public Outcome retry(Duration delay, String reason) {
    return await(retryAsync(delay, reason));
  }

  /** Never to be handled: to the dead letter topic now, with {@code reason}. */
  public Outcome reject(String reason) {
    return await(rejectAsync(reason));
  }

  /** Still working: the deadline moves to now + the queue's ack deadline. */
  public Outcome renew() {
    return await(renewAsync());
  }

  /** {@link #accept} without waiting. */
  public CompletableFuture<Outcome> acceptAsync() {
    return acks.send(answer(AckType.ACK_TYPE_ACCEPT).build());
  }

  /**
   * {@link #retry} without waiting. A reason longer than 1024 UTF-8 bytes is cut; a delay
   * above 1 h is shortened to 1 h (null or negative: none).
   */
  public CompletableFuture<Outcome> retryAsync(Duration delay, String reason) {
    Acknowledgement.Builder ack = answer(AckType.ACK_TYPE_RETRY).setReason(cut(reason));
    if (delay != null && !delay.isNegative() && !delay.isZero()) {
      Duration d = delay.compareTo(MAX_RETRY_DELAY) > 0 ? MAX_RETRY_DELAY : delay;
      ack.setRetryDelay(Protos.duration(d));
    }
    return acks.send(ack.build());
  }

  /** {@link #reject} without waiting. A reason longer than 1024 UTF-8 bytes is cut. */
  public CompletableFuture<Outcome> rejectAsync(String reason) {
    return acks.send(answer(AckType.ACK_TYPE_REJECT).setReason(cut(reason)).build());
  }

  /** {@link #renew} without waiting. */
  public CompletableFuture<Outcome> renewAsync() {
    return acks.send(answer(AckType.ACK_TYPE_RENEW).build());
  }

  private Acknowledgement.Builder answer(AckType type) {
    return Acknowledgement.newBuilder()
        .setOffset(record.offset())
        .setType(type)
        .setAttempt(attempt);
  }

  /** {@code reason} within the gateway's 1024 UTF-8 bytes, cut on a character boundary. */
  static String cut(String reason) {
    if (reason == null) {
      return "";
    }
    byte[] bytes = reason.getBytes(StandardCharsets.UTF_8);
    if (bytes.length <= MAX_REASON_BYTES) {
      return reason;
    }
    int end = MAX_REASON_BYTES;
    while (end > 0 && (bytes[end] & 0xC0) == 0x80) {
      end--; // bytes[end] continues a character: cut before that character starts
    }
    return new String(bytes, 0, end, StandardCharsets.UTF_8);
  }

  static Outcome await(CompletableFuture<Outcome> answer) {
    try {
      return answer.get();
    } catch (InterruptedException e) {
      throw KafkaLeaseException.interrupted(e);
    } catch (ExecutionException e) {
      throw KafkaLeaseException.from(e.getCause());
    }
  }

  @Override
  public String toString() {
    return "Delivery{topic=" + topic + ", partition=" + partition + ", offset=" + record.offset() + ", attempt=" + attempt + ", deadline="
        + deadline + "}";
  }
}
