package io.github.kafkalease.examples;

import io.github.kafkalease.client.ConsumedRecord;
import io.github.kafkalease.client.KafkaLeaseClient;
import io.github.kafkalease.client.KafkaLeaseException;
import io.github.kafkalease.client.Partition;
import io.github.kafkalease.client.SubscribeOptions;
import io.github.kafkalease.client.Subscription;
import io.github.kafkalease.client.SubscriptionEvent;
import java.time.Duration;
import java.util.HashMap;
import java.util.Map;
import java.util.concurrent.atomic.AtomicInteger;
import sun.misc.Signal;

/**
 * Consumes a topic as a member of a consumer group through the kafka-lease gateway.
 *
 * <p>Environment: KAFKA_LEASE_ADDR (host:port), KAFKA_LEASE_GROUP, KAFKA_LEASE_TOPIC. Prints
 * {@code processed <topic> <partition> <offset>} per record, commits after each batch and when
 * a partition is revoked, and on SIGTERM or SIGINT commits what it processed, leaves the group
 * and exits 0.
 */
public final class Consume {
  public static void main(String[] args) {
    String addr = env("KAFKA_LEASE_ADDR");
    String group = env("KAFKA_LEASE_GROUP");
    String topic = env("KAFKA_LEASE_TOPIC");

    // SIGTERM/SIGINT only ask the loop below to stop: it commits and leaves the group itself.
    // (A shutdown hook would run while the JVM is already exiting, with status 143.) A second
    // signal exits at once.
    AtomicInteger signals = new AtomicInteger();
    for (String name : new String[] {"TERM", "INT"}) {
      Signal.handle(
          new Signal(name),
          s -> {
            if (signals.incrementAndGet() > 1) {
              Runtime.getRuntime().halt(128 + s.getNumber());
            }
          });
    }

    // Per lease: the offset after the last record processed, and whether it is committed.
    Map<Partition, Long> processed = new HashMap<>();
    Map<Partition, Long> committed = new HashMap<>();
    int status = 0;
    try (KafkaLeaseClient client = KafkaLeaseClient.connect(addr);
        Subscription member =
            client.subscribe(SubscribeOptions.of(group, topic).member("java-example"))) {
      System.err.printf("joined %s as %s%n", group, member.memberId());
      while (signals.get() == 0) {
        SubscriptionEvent event = member.poll(Duration.ofMillis(200));
        if (event == null) {
          if (member.isDone()) {
            System.err.println("the gateway ended the subscription");
            break;
          }
          continue;
        }
        Partition p = event.partition();
        if (event instanceof SubscriptionEvent.Assigned a) {
          System.err.printf("assigned %s/%d from offset %d%n", p.topic(), p.partition(), a.offset());
          processed.put(p, a.offset());
        } else if (event instanceof SubscriptionEvent.Records r) {
          for (ConsumedRecord record : r.batch().records()) {
            System.out.printf("processed %s %d %d%n", p.topic(), p.partition(), record.offset());
            System.out.flush();
          }
          processed.put(p, r.batch().nextOffset());
          commit(p, processed, committed);
        } else if (event instanceof SubscriptionEvent.Revoking) {
          System.err.printf("revoking %s/%d%n", p.topic(), p.partition());
          commit(p, processed, committed);
          processed.remove(p);
        } else if (event instanceof SubscriptionEvent.Revoked v) {
          System.err.printf("revoked %s/%d: %s%n", p.topic(), p.partition(), v.reason());
          processed.remove(p);
          committed.remove(p);
        }
      }
      // Stopping: commit what was processed, then leave (closing the subscription releases
      // the member's leases).
      for (Partition p : processed.keySet()) {
        commit(p, processed, committed);
      }
    } catch (KafkaLeaseException e) {
      System.err.println("kafka-lease: " + e.getMessage());
      status = 1;
    }
    System.err.println("stopped");
    System.exit(status);
  }

  /** Commits the offset after the last processed record of {@code p}, if not committed yet. */
  private static void commit(
      Partition p, Map<Partition, Long> processed, Map<Partition, Long> committed) {
    Long next = processed.get(p);
    if (next == null || next.equals(committed.get(p))) {
      return;
    }
    try {
      p.commit(next);
      committed.put(p, next);
    } catch (KafkaLeaseException e) {
      // Fenced (the lease moved on) or unavailable: the records may be delivered again.
      System.err.printf("commit %s/%d at %d failed: %s%n", p.topic(), p.partition(), next, e.getMessage());
    }
  }

  private static String env(String name) {
    String value = System.getenv(name);
    if (value == null || value.isEmpty()) {
      System.err.println(name + " is not set");
      System.exit(2);
    }
    return value;
  }
}
