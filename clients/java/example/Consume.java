package io.github.kafkalease.examples;

import io.github.kafkalease.client.ConsumeOptions;
import io.github.kafkalease.client.ConsumeStats;
import io.github.kafkalease.client.ConsumedRecord;
import io.github.kafkalease.client.Delivery;
import io.github.kafkalease.client.KafkaLeaseClient;
import io.github.kafkalease.client.KafkaLeaseException;
import io.github.kafkalease.client.Partition;
import io.github.kafkalease.client.QueueConsumer;
import io.github.kafkalease.client.QueueOptions;
import io.github.kafkalease.client.SubscribeOptions;
import io.github.kafkalease.client.Subscription;
import io.github.kafkalease.client.SubscriptionEvent;
import java.time.Duration;
import java.util.HashMap;
import java.util.Map;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;
import sun.misc.Signal;

/**
 * Consumes a topic as a member of a consumer group through the kafka-lease gateway.
 *
 * <p>Environment: KAFKA_LEASE_ADDR (host:port), KAFKA_LEASE_GROUP, KAFKA_LEASE_TOPIC, and
 * optionally KAFKA_LEASE_DEAD_LETTER_TOPIC. Prints {@code processed <topic> <partition>
 * <offset>} per record, and on SIGTERM or SIGINT leaves the group (its leases are released,
 * committing their progress) and exits 0.
 *
 * <p>With a dead letter topic (it must exist, and not be the consumed topic), the member
 * subscribes in queue mode with partition ordering: a consumer runs a handler on each record,
 * each partition's records one at a time in offset order, and a record is printed once its
 * accept is applied (the gateway commits the queue's progress). Without one, it reads batches
 * and commits after each (and when a partition is revoked).
 */
public final class Consume {
  public static void main(String[] args) {
    String addr = env("KAFKA_LEASE_ADDR");
    String group = env("KAFKA_LEASE_GROUP");
    String topic = env("KAFKA_LEASE_TOPIC");
    String deadLetterTopic = System.getenv("KAFKA_LEASE_DEAD_LETTER_TOPIC");

    // SIGTERM/SIGINT only ask the consumer to stop: it finishes, leaves the group and the
    // program exits by itself. (A shutdown hook would run while the JVM is already exiting,
    // with status 143.) A second signal exits at once.
    AtomicInteger signals = new AtomicInteger();
    AtomicReference<QueueConsumer> consumer = new AtomicReference<>();
    for (String name : new String[] {"TERM", "INT"}) {
      Signal.handle(
          new Signal(name),
          s -> {
            if (signals.incrementAndGet() > 1) {
              Runtime.getRuntime().halt(128 + s.getNumber());
            }
            QueueConsumer c = consumer.get();
            if (c != null) {
              c.shutdown();
            }
          });
    }

    int status;
    try (KafkaLeaseClient client = KafkaLeaseClient.connect(addr)) {
      if (deadLetterTopic == null || deadLetterTopic.isEmpty()) {
        System.err.println(
            "KAFKA_LEASE_DEAD_LETTER_TOPIC is not set: queue mode needs an existing dead letter"
                + " topic, so reading batches and committing them instead");
        status = read(client, group, topic, signals);
      } else {
        status = queue(client, group, topic, deadLetterTopic, signals, consumer);
      }
    } catch (KafkaLeaseException e) {
      System.err.println("kafka-lease: " + e.getMessage());
      status = 1;
    }
    System.err.println("stopped");
    System.exit(status);
  }

  /**
   * Queue mode over the subscription: a handler per record, each partition in offset order.
   * The consumer's shutdown lets running handlers finish while the member still holds its
   * leases, hands back what is left, then leaves the group.
   */
  private static int queue(
      KafkaLeaseClient client,
      String group,
      String topic,
      String deadLetterTopic,
      AtomicInteger signals,
      AtomicReference<QueueConsumer> consumer) {
    QueueOptions queue =
        QueueOptions.defaults()
            .ordering(QueueOptions.Ordering.PARTITION)
            .deadLetterTopic(deadLetterTopic);
    // No session grace (the default): the member leaves as soon as its stream ends.
    Subscription member =
        client.subscribe(SubscribeOptions.of(group, topic).member("java-example").queue(queue));
    System.err.printf(
        "joined %s as %s (queue mode, dead letters to %s)%n",
        group, member.memberId(), deadLetterTopic);
    ConsumeOptions options =
        ConsumeOptions.of(4)
            .onAccepted(
                (d, outcome) -> {
                  if (outcome == Delivery.Outcome.APPLIED) {
                    System.out.printf("processed %s %d %d%n", d.topic(), d.partition(), d.offset());
                    System.out.flush();
                  }
                });
    // The handler: where the work on d.record() goes. Returning accepts the record; throwing
    // RetryException or RejectException retries it or sends it to the dead letter topic.
    try (QueueConsumer c = member.consumer(options, d -> {})) {
      consumer.set(c);
      if (signals.get() > 0) {
        c.shutdown(); // a signal came before the consumer was there
      }
      ConsumeStats stats = c.run(); // closes the subscription at the end: the member leaves
      if (signals.get() == 0) {
        System.err.println("the gateway ended the subscription");
      }
      System.err.printf(
          "left %s: %d accepted, %d retried, %d rejected, %d handed back%n",
          group, stats.accepted(), stats.retried(), stats.rejected(), stats.handedBack());
      return 0;
    } finally {
      member.close();
    }
  }

  /** Plain reads: batches of records, committed after each, until a signal. */
  private static int read(
      KafkaLeaseClient client, String group, String topic, AtomicInteger signals) {
    // Per lease: the offset after the last record processed, and whether it is committed.
    Map<Partition, Long> processed = new HashMap<>();
    Map<Partition, Long> committed = new HashMap<>();
    try (Subscription member =
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
    }
    return 0;
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
