// Consumes a topic as a member of a consumer group through kafka-lease's Subscribe.
//
//   KAFKA_LEASE_ADDR=127.0.0.1:50051 KAFKA_LEASE_GROUP=demo-group KAFKA_LEASE_TOPIC=demo \
//     node dist/examples/consume.js
//
// Prints `processed <topic> <partition> <offset>` per record, commits after each batch and on
// `revoking`. On SIGTERM or SIGINT it stops, commits what it processed, ends the subscription
// (the member leaves the group and its leases are released) and exits 0.
import { Client, type Partition, type SubscriptionEvent } from "@kafka-lease/client";

function env(name: string): string {
  const value = process.env[name];
  if (!value) {
    process.stderr.write(`${name} must be set\n`);
    process.exit(2);
  }
  return value;
}

async function main(): Promise<number> {
  const client = Client.connect(env("KAFKA_LEASE_ADDR"));
  const subscription = await client.subscribe({
    group: env("KAFKA_LEASE_GROUP"),
    topics: [env("KAFKA_LEASE_TOPIC")],
    member: `node-example-${process.pid}`,
  });
  process.stderr.write(`joined as ${subscription.memberId}\n`);

  // Per lease: the offset after the last record processed, and the last one committed.
  const processed = new Map<Partition, bigint>();
  const committed = new Map<Partition, bigint>();
  const commit = async (partition: Partition) => {
    const offset = processed.get(partition);
    if (offset === undefined || committed.get(partition) === offset) return;
    await partition.commit(offset);
    committed.set(partition, offset);
  };

  async function handle(event: SubscriptionEvent): Promise<void> {
    switch (event.type) {
      case "assigned":
        process.stderr.write(`assigned ${event.partition.topic}/${event.partition.partition} at ${event.offset}\n`);
        break;
      case "records":
        for (const record of event.batch.records) {
          // "Process" the record.
          process.stdout.write(`processed ${event.partition.topic} ${event.partition.partition} ${record.offset}\n`);
        }
        processed.set(event.partition, event.batch.nextOffset!);
        await commit(event.partition);
        break;
      case "revoking":
        await commit(event.partition);
        process.stderr.write(`revoking ${event.partition.topic}/${event.partition.partition}: committed\n`);
        break;
      case "revoked":
        process.stderr.write(`revoked ${event.partition.topic}/${event.partition.partition}: ${event.reason}\n`);
        processed.delete(event.partition);
        committed.delete(event.partition);
        break;
    }
  }

  let stopping = false;
  let inFlight: Promise<void> = Promise.resolve();
  let failed = false;
  const stop = async (signal: string) => {
    if (stopping) return;
    stopping = true;
    process.stderr.write(`${signal}: committing and leaving the group\n`);
    try {
      await inFlight.catch(() => {});
      for (const partition of processed.keys()) await commit(partition);
    } catch (e) {
      failed = true;
      process.stderr.write(`commit on shutdown failed: ${e}\n`);
    } finally {
      subscription.cancel(); // ends the for-await loop below
    }
  };
  process.on("SIGTERM", () => void stop("SIGTERM"));
  process.on("SIGINT", () => void stop("SIGINT"));

  try {
    for await (const event of subscription) {
      if (stopping) continue; // nothing more is processed once stopping
      inFlight = handle(event);
      await inFlight;
    }
  } catch (e) {
    process.stderr.write(`subscription failed: ${e}\n`);
    failed = true;
  } finally {
    client.close();
  }
  return failed ? 1 : 0;
}

main().then(
  (code) => process.exit(code),
  (e) => {
    process.stderr.write(`${e}\n`);
    process.exit(1);
  },
);
