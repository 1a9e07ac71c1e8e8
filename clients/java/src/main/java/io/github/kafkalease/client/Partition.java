package io.github.kafkalease.client;

/**
 * One of a subscription member's leases (from an {@code assigned} event): commit, seek or
 * release it. Every event of the same lease carries the same object.
 */
public final class Partition extends LeaseHandle {
  Partition(KafkaLeaseClient client, String leaseId, String topic, int partition, long token) {
    super(client, leaseId, topic, partition, token);
  }
}
