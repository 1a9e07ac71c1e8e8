package io.github.kafkalease.client;

import java.time.Duration;

/**
 * Why a {@link DeliveryHandler} did not handle a record, and what to do about it: what an
 * {@link ErrorPolicy} decides, and what {@link RetryException} and {@link RejectException}
 * carry.
 */
public sealed interface HandlerError {
  /**
   * Deliver it again (at its last delivery it goes to the dead letter topic instead).
   *
   * @param delay not before this; null: the consumer's backoff for the delivery's attempt
   * @param reason why, for the dead letter copy if this was its last delivery
   */
  record Retry(Duration delay, String reason) implements HandlerError {}

  /**
   * To the dead letter topic now.
   *
   * @param reason why, written to the dead letter copy's {@code kafka-lease.reason} header
   */
  record Reject(String reason) implements HandlerError {}

  /** Deliver it again after the consumer's backoff. */
  static HandlerError retry(String reason) {
    return new Retry(null, reason);
  }

  /** Deliver it again after {@code delay}. */
  static HandlerError retryAfter(Duration delay, String reason) {
    return new Retry(delay, reason);
  }

  /** To the dead letter topic now. */
  static HandlerError reject(String reason) {
    return new Reject(reason);
  }
}
