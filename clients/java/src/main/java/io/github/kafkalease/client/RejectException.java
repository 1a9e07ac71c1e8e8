package io.github.kafkalease.client;

/**
 * Thrown by a {@link DeliveryHandler}: the record can never be handled; send it to the dead
 * letter topic now, with the reason (its {@code kafka-lease.reason} header).
 */
public class RejectException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  /** To the dead letter topic with {@code reason}. */
  public RejectException(String reason) {
    super(reason);
  }

  /** To the dead letter topic with {@code reason}, keeping the cause. */
  public RejectException(String reason, Throwable cause) {
    super(reason, cause);
  }

  /** What it asks the consumer to do. */
  public HandlerError error() {
    return new HandlerError.Reject(getMessage());
  }
}
