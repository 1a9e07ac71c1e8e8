// Queue mode against a live gateway (KAFKA_LEASE_ADDR) and the fixture's queue topic
// (KAFKA_LEASE_FIXTURE): partition 0 holds 40 records, key k<i % 4>, value v<i>, except the
// poison one.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { type Answer, Client, Code, KafkaLeaseError, type Lease, RejectError } from "../src";
import { ADDR, FIXTURE, Relay, freshGroup, pollUntil, within } from "./support";

const Q = FIXTURE.queue;
const keyOf = (offset: number) => `k${offset % Q.keys}`;

async function rejection(promise: Promise<unknown>): Promise<KafkaLeaseError> {
  const error = await promise.then(
    () => assert.fail("expected the call to fail"),
    (e: unknown) => e,
  );
  assert.ok(error instanceof KafkaLeaseError, `not a KafkaLeaseError: ${error}`);
  return error;
}

describe("queue mode against the gateway", () => {
  let client: Client;
  before(() => {
    client = Client.connect(ADDR);
  });
  after(() => client.close());

  const acquire = (group: string, ttlMs = 30_000): Promise<Lease> =>
    client.acquire({ group, topic: Q.topic, partition: 0, ttlMs, waitMs: 10_000 });

  /** The lease's QueueInfo as ListLeases shows it. */
  async function queueInfo(group: string) {
    const [info] = await client.listLeases({ group, topic: Q.topic });
    return info?.queue;
  }

  test("q-a. key order, a poison record: the rest handled, its key-mates after its last attempt, one dead letter, then the group starts past the end", async () => {
    const group = freshGroup("poison-");
    const lease = await acquire(group);
    const shutdown = new AbortController();
    const log: { event: "start" | "end"; offset: number; attempt: number }[] = [];
    const handled = new Set<number>();
    const running = new Set<string>();
    let overlap = "";
    const consumed = lease.consume(
      async (record, { attempt }) => {
        const offset = Number(record.offset);
        const key = record.key?.toString() ?? "";
        if (running.has(key)) overlap ||= `two records of ${key} at once (offset ${offset})`;
        running.add(key);
        log.push({ event: "start", offset, attempt });
        try {
          await new Promise((r) => setTimeout(r, 5));
          if (record.value?.toString() === "poison") throw new Error(`poison at ${offset}`);
          assert.equal(record.value?.toString(), `v${offset}`);
          assert.equal(key, keyOf(offset));
          handled.add(offset);
        } finally {
          running.delete(key);
          log.push({ event: "end", offset, attempt });
        }
      },
      {
        ordering: "key",
        maxDeliveries: 3,
        deadLetterTopic: Q.dead_letter_topic,
        concurrency: Q.keys,
        backoff: { initialMs: 50, maxMs: 200 },
        signal: shutdown.signal,
      },
    );
    consumed.catch(() => {});
    try {
      const info = await pollUntil(30_000, "39 records handled and one dead letter", async () => {
        if (handled.size < Q.records - 1) return undefined;
        const queue = await queueInfo(group);
        return queue !== undefined && queue.deadLetters >= 1n ? queue : undefined;
      });
      assert.equal(info.deadLetters, 1n);
      assert.equal(info.deadLetterTopic, Q.dead_letter_topic);
      shutdown.abort();
      const stats = await within(15_000, "the consumer to stop", consumed);
      assert.deepEqual(stats, { accepted: Q.records - 1, retried: 3, rejected: 0, handedBack: 0 });
      assert.equal(overlap, "", "key order: one record of a key at a time");

      const all = Array.from({ length: Q.records }, (_, i) => i);
      assert.deepEqual([...handled].sort((a, b) => a - b), all.filter((o) => o !== Q.poison_offset));
      const poison = log.filter((e) => e.offset === Q.poison_offset && e.event === "start").map((e) => e.attempt);
      assert.deepEqual(poison, [1, 2, 3], "the poison record: max_deliveries attempts");
      const lastPoison = log.findIndex((e) => e.offset === Q.poison_offset && e.event === "end" && e.attempt === 3);
      const mates = all.filter((o) => keyOf(o) === keyOf(Q.poison_offset));
      for (const offset of mates) {
        const started = log.findIndex((e) => e.offset === offset && e.event === "start");
        if (offset < Q.poison_offset) assert.ok(started < lastPoison, `${offset} (before the poison) was not held back`);
        if (offset > Q.poison_offset) {
          assert.ok(started > lastPoison, `${offset}, of the poison's key, started before its last attempt ended`);
        }
      }
      // Other keys were not held back: some record after the poison of another key was
      // handled before the poison's last attempt.
      const other = log.findIndex(
        (e) => e.event === "end" && e.offset > Q.poison_offset && keyOf(e.offset) !== keyOf(Q.poison_offset),
      );
      assert.ok(other >= 0 && other < lastPoison, "a poison record holds back its key, not the partition");
    } finally {
      shutdown.abort();
      await consumed.catch(() => {});
      await lease.release().catch(() => {});
    }
    // Release committed the queue's progress: the group goes on past the end.
    const next = await acquire(group);
    assert.equal(next.offset, BigInt(Q.records));
    await next.release();
  });

  test("q-b. shutdown hands back what still runs; the next consume gets those records again at attempt 2", async () => {
    const group = freshGroup("handback-");
    const lease = await acquire(group);
    try {
      const shutdown = new AbortController();
      const started: number[] = [];
      const options = { ordering: "unordered" as const, concurrency: 3, deadLetterTopic: Q.dead_letter_topic };
      const first = lease.consume(
        async (record, { signal }) => {
          started.push(Number(record.offset));
          await new Promise((resolve) => signal.addEventListener("abort", resolve));
        },
        { ...options, signal: shutdown.signal, drainMs: 200 },
      );
      first.catch(() => {});
      await pollUntil(15_000, "three handlers running", async () => (started.length >= 3 ? true : undefined));
      shutdown.abort();
      const stats = await within(15_000, "the first consumer to stop", first);
      assert.deepEqual(stats, { accepted: 0, retried: 0, rejected: 0, handedBack: started.length });
      assert.equal(started.length, 3);

      const again = new AbortController();
      const seen = new Map<number, number>();
      const second = lease.consume(
        async (record, { attempt }) => {
          seen.set(Number(record.offset), attempt);
        },
        { ...options, signal: again.signal },
      );
      second.catch(() => {});
      // Stopped once it handled the whole partition: stopped earlier, the deliveries it had
      // received and not yet started would be handed back too (seen under load in Python's).
      await pollUntil(15_000, "the handed-back records again, and every other record", async () =>
        started.every((o) => seen.has(o)) && seen.size === Q.records ? true : undefined,
      );
      again.abort();
      const secondStats = await within(15_000, "the second consumer to stop", second);
      assert.equal(secondStats.handedBack, 0);
      for (const offset of started) assert.equal(seen.get(offset), 2, `record ${offset}: its second delivery`);
      for (const [offset, attempt] of seen) {
        if (!started.includes(offset)) assert.equal(attempt, 1, `record ${offset} was never handed out before`);
      }
    } finally {
      await lease.release().catch(() => {});
    }
  });

  test("q-c. queue mode shuts Read, Seek and Commit out (WRONG_MODE); an answer after Release fails as the lease ended", async () => {
    const group = freshGroup("after-release-");
    const lease = await acquire(group);
    const stream = lease.deliveries({ deadLetterTopic: Q.dead_letter_topic });
    const first = await within(15_000, "a delivery", stream.next());
    assert.ok(!first.done);
    const delivery = first.value;
    assert.equal(delivery.offset, 0n);
    assert.equal(delivery.attempt, 1);
    assert.ok(delivery.deadline !== null && delivery.deadline.getTime() > Date.now());

    const commit = await rejection(lease.commit(1));
    assert.equal(commit.code, Code.FAILED_PRECONDITION);
    assert.equal(commit.reason, "WRONG_MODE");
    assert.equal(commit.leaseEnded, false);
    const seek = await rejection(lease.seek(0));
    assert.equal(seek.reason, "WRONG_MODE");
    const records = lease.records();
    const read = await rejection(within(15_000, "the Read to fail", records.next()));
    assert.equal(read.reason, "WRONG_MODE");

    assert.equal(await delivery.renew(), "applied");
    await lease.release();
    assert.deepEqual(await within(15_000, "the Deliver to end", stream.next()), { value: undefined, done: true });
    const late = await rejection(delivery.accept());
    assert.equal(late.code, Code.FAILED_PRECONDITION);
    assert.equal(late.reason, "LEASE_RELEASED");
    assert.ok(late.leaseEnded, `an answer after Release: ${late.message}`);
  });

  test("q-d. a dead letter topic that does not exist fails the first Deliver (TOPIC_NOT_FOUND)", async () => {
    const lease = await acquire(freshGroup("no-dlq-"));
    try {
      const stream = lease.deliveries({ deadLetterTopic: FIXTURE.missing_topic });
      const missing = await rejection(within(15_000, "the Deliver to fail", stream.next()));
      assert.equal(missing.code, Code.NOT_FOUND);
      assert.equal(missing.reason, "TOPIC_NOT_FOUND");
      assert.equal(missing.metadata["topic"], FIXTURE.missing_topic);
    } finally {
      await lease.release().catch(() => {});
    }
  });
  test("q-e. a Deliver cut by the network reopens by itself; consume goes on to the end", async () => {
    const relay = await Relay.start(ADDR);
    const relayed = Client.connect(relay.address);
    const group = freshGroup("cut-");
    const lease = await relayed.acquire({ group, topic: Q.topic, partition: 0, ttlMs: 30_000 });
    const shutdown = new AbortController();
    const handled = new Set<number>();
    const reconnects: Code[] = [];
    let cut = false;
    const consumed = lease.consume(
      async (record) => {
        handled.add(Number(record.offset));
        if (handled.size === 5 && !cut) {
          cut = true;
          assert.ok(relay.cut() > 0, "the relay had connections to cut");
        }
      },
      {
        ordering: "unordered",
        concurrency: 2,
        // Answers lost in the cut come again after this.
        ackDeadlineMs: 2_000,
        deadLetterTopic: Q.dead_letter_topic,
        signal: shutdown.signal,
        onReconnect: (cause) => reconnects.push(cause.code),
      },
    );
    consumed.catch(() => {});
    try {
      // Every record handled, and done: an accept lost in the cut leaves its record in flight
      // until its deadline, then it comes again; the gateway commits what is done.
      await pollUntil(30_000, "every record handled and committed", async () => {
        if (handled.size < Q.records) return undefined;
        const [info] = await client.listLeases({ group, topic: Q.topic });
        return info?.committedOffset === BigInt(Q.records) ? true : undefined;
      });
      assert.ok(cut);
      assert.ok(reconnects.length >= 1, "the Deliver was reopened");
      assert.ok(reconnects.every((c) => c === Code.UNAVAILABLE), `reopened after ${reconnects.map((c) => Code[c])}`);
      shutdown.abort();
      const stats = await within(15_000, "the consumer to stop", consumed);
      assert.ok(stats.accepted >= Q.records, "every record accepted (some twice, their answers lost in the cut)");
    } finally {
      shutdown.abort();
      await consumed.catch(() => {});
      await lease.release().catch(() => {});
      relayed.close();
      await relay.close();
    }
    const next = await acquire(group);
    assert.equal(next.offset, BigInt(Q.records), "everything was done");
    await next.release();
  });

  test("q-f. a subscription in queue mode: the consumer rejects the poison record, handles the rest, and leaves; the group starts past the end", async () => {
    const group = freshGroup("sub-queue-");
    const subscription = await client.subscribe({
      group,
      topics: [Q.topic],
      queue: { ordering: "key", maxInFlight: Q.keys, deadLetterTopic: Q.dead_letter_topic },
    });
    const shutdown = new AbortController();
    const handled = new Set<number>();
    const where = new Set<string>();
    const applied: number[] = [];
    const events: string[] = [];
    const consumed = subscription.consume(
      async (record, { topic, partition }) => {
        where.add(`${topic}/${partition}`);
        const offset = Number(record.offset);
        if (record.value?.toString() === "poison") throw new RejectError(`poison at ${offset}`);
        assert.equal(record.value?.toString(), `v${offset}`);
        assert.equal(record.key?.toString(), keyOf(offset));
        handled.add(offset);
      },
      {
        concurrency: Q.keys,
        signal: shutdown.signal,
        onAnswer: (a: Answer) => {
          if (a.action === "accept" && a.outcome === "applied") applied.push(Number(a.record.offset));
        },
        onEvent: (e) => events.push(e.type),
      },
    );
    consumed.catch(() => {});
    try {
      const info = await pollUntil(30_000, "39 records handled and one dead letter", async () => {
        if (handled.size < Q.records - 1) return undefined;
        const queue = await queueInfo(group);
        return queue !== undefined && queue.deadLetters >= 1n ? queue : undefined;
      });
      assert.equal(info.deadLetters, 1n);
      assert.equal(info.deadLetterTopic, Q.dead_letter_topic);
      shutdown.abort();
      const stats = await within(15_000, "the consumer to stop", consumed);
      assert.deepEqual(stats, { accepted: Q.records - 1, retried: 0, rejected: 1, handedBack: 0 });
      const all = Array.from({ length: Q.records }, (_, i) => i).filter((o) => o !== Q.poison_offset);
      assert.deepEqual([...handled].sort((a, b) => a - b), all);
      assert.deepEqual(applied.sort((a, b) => a - b), all, "every accept applied");
      assert.deepEqual([...where], [`${Q.topic}/0`], "the handler is told the record's topic and partition");
      assert.ok(events.includes("assigned"), `events: ${events.join(", ")}`);
      // The consumer ended the subscription: the member left.
      assert.deepEqual(await subscription.next(), { done: true, value: undefined });
    } finally {
      shutdown.abort();
      await consumed.catch(() => {});
      subscription.cancel();
    }
    // The member's leases were released as it left, committing the queue's progress.
    const next = await client.acquire({ group, topic: Q.topic, partition: 0, ttlMs: 30_000, waitMs: 10_000 });
    try {
      assert.equal(next.offset, BigInt(Q.records));
    } finally {
      await next.release();
    }
  });

  test("q-g. a subscription consumer's shutdown: the running handlers finish and their accepts land before the member leaves", async () => {
    const group = freshGroup("sub-drain-");
    const subscription = await client.subscribe({
      group,
      topics: [Q.topic],
      queue: { ordering: "unordered", maxInFlight: 2, deadLetterTopic: Q.dead_letter_topic },
    });
    const shutdown = new AbortController();
    const started: number[] = [];
    const consumed = subscription.consume(
      async (record) => {
        started.push(Number(record.offset));
        await new Promise((r) => setTimeout(r, 800));
      },
      { concurrency: 2, signal: shutdown.signal, drainMs: 10_000 },
    );
    consumed.catch(() => {});
    try {
      await pollUntil(15_000, "two handlers running", async () => (started.length >= 2 ? true : undefined));
      shutdown.abort();
      const stats = await within(15_000, "the consumer to stop", consumed);
      assert.deepEqual(started.sort((a, b) => a - b), [0, 1]);
      assert.deepEqual(stats, { accepted: 2, retried: 0, rejected: 0, handedBack: 0 });
    } finally {
      shutdown.abort();
      await consumed.catch(() => {});
      subscription.cancel();
    }
    // Both accepts reached the leases before the member left: its release committed past them.
    const next = await client.acquire({ group, topic: Q.topic, partition: 0, ttlMs: 30_000, waitMs: 10_000 });
    try {
      assert.equal(next.offset, 2n);
    } finally {
      await next.release();
    }
  });

  test("q-h. a drain longer than the lease's TTL: the renewals keep the lease alive, and the handler's accept is applied", async () => {
    const group = freshGroup("drain-ttl-");
    const ttlMs = 2_000;
    const lease = await acquire(group, ttlMs);
    const shutdown = new AbortController();
    const started: number[] = [];
    const answers: Answer[] = [];
    const consumed = lease.consume(
      async (record) => {
        started.push(Number(record.offset));
        // Once the shutdown begins (the Deliver closed), three TTLs more.
        await new Promise((resolve) => {
          if (shutdown.signal.aborted) resolve(undefined);
          else shutdown.signal.addEventListener("abort", resolve, { once: true });
        });
        await new Promise((r) => setTimeout(r, 3 * ttlMs));
      },
      {
        concurrency: 1,
        deadLetterTopic: Q.dead_letter_topic,
        signal: shutdown.signal,
        drainMs: 5 * ttlMs,
        onAnswer: (a) => answers.push(a),
      },
    );
    consumed.catch(() => {});
    let released = false;
    try {
      await pollUntil(15_000, "a handler running", async () => (started.length >= 1 ? true : undefined));
      shutdown.abort();
      const stats = await within(14_000, "the consumer to stop", consumed);
      assert.deepEqual(started, [0]);
      assert.deepEqual(stats, { accepted: 1, retried: 0, rejected: 0, handedBack: 0 });
      assert.deepEqual(
        answers.map((a) => [a.action, Number(a.record.offset), a.outcome, a.error?.reason]),
        [["accept", 0, "applied", undefined]],
      );
      // The lease outlived the drain: Release works and commits the accepted record.
      await lease.release();
      released = true;
    } finally {
      shutdown.abort();
      await consumed.catch(() => {});
      if (!released) await lease.release().catch(() => {});
    }
    const next = await acquire(group);
    try {
      assert.equal(next.offset, 1n);
    } finally {
      await next.release();
    }
  });
});
