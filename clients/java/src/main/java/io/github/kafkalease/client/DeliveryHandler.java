package io.github.kafkalease.client;

/**
 * What a {@link QueueConsumer} runs on each delivery. Returning accepts the record; throwing
 * answers it by the consumer's {@link ErrorPolicy}: a {@link RejectException} sends it to the
 * dead letter topic, a {@link RetryException} delivers it again after its delay, anything else
 * goes to the policy (by default: again, after the consumer's backoff).
 *
 * <p>The consumer answers the delivery: do not {@link Delivery#accept accept}, {@link
 * Delivery#retry retry} or {@link Delivery#reject reject} it here (the consumer's answer would
 * then be STALE). {@link Delivery#renew} is fine, for a handler that may outlast the ack
 * deadline. Called from the consumer's handler threads, up to its concurrency at once; at
 * shutdown a handler still running after the drain time is interrupted.
 */
@FunctionalInterface
public interface DeliveryHandler {
  /** Handles {@code delivery.record()}, its {@code delivery.attempt()}-th delivery. */
  void handle(Delivery delivery) throws Exception;
}
