package io.github.kafkalease.client;

/**
 * How a {@link QueueConsumer} answers a delivery whose handler threw something other than
 * {@link RetryException} or {@link RejectException} (those answer as they say, whatever the
 * policy). Set it with {@link ConsumeOptions#errorPolicy}.
 */
@FunctionalInterface
public interface ErrorPolicy {
  /** The default: deliver it again after the consumer's backoff (100 ms doubling to 30 s). */
  ErrorPolicy RETRY = (delivery, error) -> HandlerError.retry(describe(error));

  /** Send it to the dead letter topic at once. */
  ErrorPolicy REJECT = (delivery, error) -> HandlerError.reject(describe(error));

  /**
   * What to do with {@code delivery} after its handler threw {@code error}. A policy that
   * throws, or returns null, means {@link #RETRY}.
   */
  HandlerError decide(Delivery delivery, Throwable error);

  /** A reason from an error: its class and message. */
  static String describe(Throwable error) {
    String message = error.getMessage();
    return error.getClass().getName() + (message == null ? "" : ": " + message);
  }
}
