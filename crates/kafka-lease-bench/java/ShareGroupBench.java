// The peer arm of the queue-mode bench (`queue-vs-share-group`): Kafka's own Java share
// consumer (KIP-932) on the same records, with the same handler and concurrency as the gateway
// arm. Run by kafka-lease-bench with the broker's jars on the class path, in Java's
// source-file mode:
//
//   java -cp '<kafka libs>/*' ShareGroupBench.java rate   BOOTSTRAP TOPIC GROUP CONSUMERS HANDLER_MS MAX_POLL TARGET
//   java -cp '<kafka libs>/*' ShareGroupBench.java member BOOTSTRAP TOPIC GROUP CONSUMERS HANDLER_MS MAX_POLL
//
// CONSUMERS threads each run one KafkaShareConsumer of GROUP (a share consumer is not
// thread-safe: one handler at a time each), explicit acknowledgement, strict record limits
// (share.acquire.mode=record_limit, max.poll.records=MAX_POLL). The handler sleeps HANDLER_MS
// and the record is accepted. Before the consumers start, the group's
// share.auto.offset.reset is set to earliest (a share group starts at the latest offset by
// default).
//
// `rate` prints `rate RECORDS SECONDS` once TARGET records were handled (from the first
// handler's start to the TARGET-th end) and exits. `member` prints `start OFFSET ATTEMPT` as a
// handler starts and `done OFFSET` as it ends, one line each, until it is killed.

import java.io.PrintStream;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.consumer.AcknowledgeType;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaShareConsumer;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

public class ShareGroupBench {
  private static final PrintStream OUT = System.out;

  public static void main(String[] args) throws Exception {
    if (args.length < 7) {
      System.err.println(
          "usage: ShareGroupBench rate|member BOOTSTRAP TOPIC GROUP CONSUMERS HANDLER_MS MAX_POLL [TARGET]");
      System.exit(2);
    }
    String mode = args[0];
    String bootstrap = args[1];
    String topic = args[2];
    String group = args[3];
    int consumers = Integer.parseInt(args[4]);
    long handlerMs = Long.parseLong(args[5]);
    int maxPoll = Integer.parseInt(args[6]);
    long target = mode.equals("rate") ? Long.parseLong(args[7]) : Long.MAX_VALUE;

    fromEarliest(bootstrap, group);

    AtomicLong handled = new AtomicLong();
    AtomicLong firstStart = new AtomicLong();
    CountDownLatch finished = new CountDownLatch(1);
    boolean member = mode.equals("member");
    List<Thread> threads = new ArrayList<>();
    for (int i = 0; i < consumers; i++) {
      Properties p = new Properties();
      p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
      p.put(ConsumerConfig.GROUP_ID_CONFIG, group);
      p.put(ConsumerConfig.CLIENT_ID_CONFIG, group + "-" + i);
      p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
      p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
      p.put(ConsumerConfig.SHARE_ACKNOWLEDGEMENT_MODE_CONFIG, "explicit");
      p.put(ConsumerConfig.SHARE_ACQUIRE_MODE_CONFIG, "record_limit");
      p.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, Integer.toString(maxPoll));
      Thread t =
          new Thread(
              () -> {
                try (KafkaShareConsumer<byte[], byte[]> consumer = new KafkaShareConsumer<>(p)) {
                  consumer.subscribe(List.of(topic));
                  while (finished.getCount() > 0) {
                    ConsumerRecords<byte[], byte[]> records = consumer.poll(Duration.ofMillis(100));
                    for (ConsumerRecord<byte[], byte[]> record : records) {
                      long began = System.nanoTime();
                      firstStart.compareAndSet(0, began);
                      if (member) {
                        say("start " + record.offset() + " " + record.deliveryCount().orElse((short) 1));
                      }
                      Thread.sleep(handlerMs);
                      consumer.acknowledge(record, AcknowledgeType.ACCEPT);
                      if (member) {
                        say("done " + record.offset());
                      }
                      long n = handled.incrementAndGet();
                      if (n == target) {
                        double secs = (System.nanoTime() - firstStart.get()) / 1e9;
                        say("rate " + n + " " + secs);
                        finished.countDown();
                      }
                    }
                    // The acknowledgements go with the next poll; send them now so a record
                    // handled is not held while the next poll waits.
                    if (!records.isEmpty()) {
                      consumer.commitAsync();
                    }
                  }
                } catch (InterruptedException e) {
                  Thread.currentThread().interrupt();
                } catch (RuntimeException e) {
                  System.err.println("consumer failed: " + e);
                  finished.countDown();
                }
              },
              "share-consumer-" + i);
      t.setDaemon(true);
      threads.add(t);
      t.start();
    }
    finished.await();
    System.exit(handled.get() >= target || member ? 0 : 1);
  }

  private static synchronized void say(String line) {
    OUT.println(line);
    OUT.flush();
  }

  /** Sets the group's share.auto.offset.reset to earliest. */
  private static void fromEarliest(String bootstrap, String group) throws Exception {
    Properties p = new Properties();
    p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    try (Admin admin = Admin.create(p)) {
      ConfigResource resource = new ConfigResource(ConfigResource.Type.GROUP, group);
      Collection<AlterConfigOp> ops =
          List.of(
              new AlterConfigOp(
                  new ConfigEntry("share.auto.offset.reset", "earliest"), AlterConfigOp.OpType.SET));
      admin.incrementalAlterConfigs(Map.of(resource, ops)).all().get();
    }
  }
}
