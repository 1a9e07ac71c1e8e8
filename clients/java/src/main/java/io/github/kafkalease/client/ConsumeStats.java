package io.github.kafkalease.client;

/**
 * What a {@link QueueConsumer} did.
 *
 * @param accepted records the handler handled (answered with an accept)
 * @param retried handler failures answered with a retry
 * @param rejected handler failures answered with a reject (to the dead letter topic)
 * @param handedBack records handed back at shutdown unfinished (retried at once, the reason
 *     "the consumer shut down before handling it", and APPLIED): those whose handler was still
 *     running after the drain time, and any received but not started
 */
public record ConsumeStats(long accepted, long retried, long rejected, long handedBack) {}
