package io.github.kafkalease.client;

import java.time.Duration;

/**
 * Thrown by a {@link DeliveryHandler}: deliver the record again, after {@code delay} (or the
 * consumer's backoff when it is null). At its last delivery the record goes to the dead letter
 * topic instead, with the reason.
 */
public class RetryException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  private final Duration delay;

  /** Again after the consumer's backoff. */
  public RetryException(String reason) {
    this(null, reason, null);
  }

  /** Again after {@code delay} (null: the consumer's backoff). */
  public RetryException(Duration delay, String reason) {
    this(delay, reason, null);
  }

  /** Again after {@code delay} (null: the consumer's backoff), keeping the cause. */
  public RetryException(Duration delay, String reason, Throwable cause) {
    super(reason, cause);
    this.delay = delay;
  }

  /** The delay; null: the consumer's backoff. */
  public Duration delay() {
    return delay;
  }

  /** What it asks the consumer to do. */
  public HandlerError error() {
    return new HandlerError.Retry(delay, getMessage());
  }
}
