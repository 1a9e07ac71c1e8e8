// Consumes a topic as a member of a consumer group through kafka-lease's Subscribe.
//
//   KAFKA_LEASE_ADDR=127.0.0.1:50051 KAFKA_LEASE_GROUP=demo-group KAFKA_LEASE_TOPIC=demo \
//     KAFKA_LEASE_DEAD_LETTER_TOPIC=dlq.demo-group.demo node dist/examples/consume.js
//
// With KAFKA_LEASE_DEAD_LETTER_TOPIC (an existing topic, not the consumed one) the member is in
// queue mode: `Subscription.consume` runs a handler per record, one at a time per partition in
// offset order (PARTITION ordering), and the gateway commits what is done. Without it, it reads
// the records' batches (Subscribe's plain events) and commits after each batch and on
// `revoking`.
//
// Either way it prints `processed <topic> <partition> <offset>` per record (in queue mode, once
// the record's accept was applied). On SIGTERM or SIGINT it stops, lets what runs finish (queue
// mode) or commits what it processed, ends the subscription (the member leaves the group and
// its leases are released, committing their progress) and exits 0.
import { Client, type Partition, type Subscription, type SubscriptionEvent } from "@kafka-lease/client";

/** Handlers at once, and the member's window (deliveries in flight, shared by its leases). */
const CONCURRENCY = 8;

function env(name: string): string {
  const value = process.env[name];
  if (!value) {
    process.stderr.write(`${name} must be set\n`);
    process.exit(2);
  }
  return value;
}

const say = (line: string) => process.stderr.write(`${line}\n`);

function logEvent(event: SubscriptionEvent): void {
  const where = `${event.partition.topic}/${event.partition.partition}`;
  switch (event.type) {
    case "assigned":
      say(`assigned ${where} at ${event.offset}`);
      break;
    case "revoking":
      say(`revoking ${where}`);
      break;
    case "revoked":
      say(`revoked ${where}: ${event.reason}`);
      break;
    default:
      break;
  }
}

/** Waits (at most `ms`) until the gateways no longer list the member in the group. */
async function waitUntilLeft(client: Client, group: string, memberId: string, ms: number): Promise<boolean> {
  const deadline = Date.now() + ms;
  for (;;) {
    const members = await client.listMembers(group).catch(() => undefined);
    if (members !== undefined && !members.some((m) => m.memberId === memberId)) return true;
    if (Date.now() > deadline) return false;
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** Queue mode: the subscription's consumer, until SIGTERM or SIGINT. */
async function consumeQueue(client: Client, group: string, topic: string, deadLetterTopic: string): Promise<number> {
  const shutdown = new AbortController();
  const stop = (signal: string) => {
    if (shutdown.signal.aborted) return;
    say(`${signal}: finishing what runs and leaving the group`);
    shutdown.abort();
  };
  process.on("SIGTERM", () => stop("SIGTERM"));
  process.on("SIGINT", () => stop("SIGINT"));

  // No session grace: the member leaves as soon as its stream ends.
  const subscription = await client.subscribe({
    group,
    topics: [topic],
    member: `node-example-${process.pid}`,
    queue: { ordering: "partition", maxInFlight: CONCURRENCY, deadLetterTopic },
  });
  say(`joined as ${subscription.memberId} (queue mode, dead letters to ${deadLetterTopic})`);
  try {
    const stats = await subscription.consume(
      async (_record) => {
        // "Process" the record: resolving accepts it (throwing would retry it, a RejectError
        // send it to the dead letter topic).
      },
      {
        concurrency: CONCURRENCY,
        signal: shutdown.signal,
        onAnswer: (answer) => {
          if (answer.action === "accept" && answer.outcome === "applied") {
            process.stdout.write(`processed ${answer.topic} ${answer.partition} ${answer.record.offset}\n`);
          } else if (answer.error !== undefined) {
            say(`${answer.action} of ${answer.topic}/${answer.partition}@${answer.record.offset} failed: ${answer.error}`);
          }
        },
        onEvent: logEvent,
      },
    );
    say(`accepted ${stats.accepted}, retried ${stats.retried}, rejected ${stats.rejected}, handed back ${stats.handedBack}`);
  } catch (e) {
    say(`subscription failed: ${e}`);
    return 1;
  }
  // The consumer ended the subscription: make sure the member is gone (its leases released,
  // their progress committed) before the process exits.
  if (!(await waitUntilLeft(client, group, subscription.memberId, 5_000))) {
    say(`the member ${subscription.memberId} is still listed in ${group}`);
    return 1;
  }
  say("left the group");
  return 0;
}

/** Plain Subscribe: batches of records, committed by the example. */
async function consumeRecords(client: Client, group: string, topic: string): Promise<number> {
  const subscription: Subscription = await client.subscribe({
    group,
    topics: [topic],
    member: `node-example-${process.pid}`,
  });
  say(`joined as ${subscription.memberId}`);

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
    logEvent(event);
    switch (event.type) {
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
        say(`committed ${event.partition.topic}/${event.partition.partition} before its revocation`);
        break;
      case "revoked":
        processed.delete(event.partition);
        committed.delete(event.partition);
        break;
      default:
        break;
    }
  }

  let stopping = false;
  let inFlight: Promise<void> = Promise.resolve();
  let failed = false;
  const stop = async (signal: string) => {
    if (stopping) return;
    stopping = true;
    say(`${signal}: committing and leaving the group`);
    try {
      await inFlight.catch(() => {});
      for (const partition of processed.keys()) await commit(partition);
    } catch (e) {
      failed = true;
      say(`commit on shutdown failed: ${e}`);
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
    say(`subscription failed: ${e}`);
    failed = true;
  }
  if (!failed && !(await waitUntilLeft(client, group, subscription.memberId, 5_000))) {
    say(`the member ${subscription.memberId} is still listed in ${group}`);
    failed = true;
  }
  if (!failed) say("left the group");
  return failed ? 1 : 0;
}

async function main(): Promise<number> {
  const client = Client.connect(env("KAFKA_LEASE_ADDR"));
  const group = env("KAFKA_LEASE_GROUP");
  const topic = env("KAFKA_LEASE_TOPIC");
  const deadLetterTopic = process.env.KAFKA_LEASE_DEAD_LETTER_TOPIC;
  try {
    if (deadLetterTopic) return await consumeQueue(client, group, topic, deadLetterTopic);
    say(
      "KAFKA_LEASE_DEAD_LETTER_TOPIC is not set: reading records without queue mode " +
        "(queue mode needs an existing dead letter topic other than the consumed one)",
    );
    return await consumeRecords(client, group, topic);
  } finally {
    client.close();
  }
}

main().then(
  (code) => process.exit(code),
  (e) => {
    process.stderr.write(`${e}\n`);
    process.exit(1);
  },
);
