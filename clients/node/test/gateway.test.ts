// Against a live gateway (KAFKA_LEASE_ADDR) and the fixture's records (KAFKA_LEASE_FIXTURE).
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { Client, Code, KafkaLeaseError, type KafkaLeaseRecord, type RecordStream, TimestampType } from "../src";
import { ADDR, FIXTURE, type FixtureRecord, Relay, fixtureRecords, freshGroup, hex, pollUntil, within } from "./support";

const P0 = fixtureRecords(0);
const P1 = fixtureRecords(1);
const START0 = BigInt(P0[0]!.offset);
const END0 = BigInt(P0[P0.length - 1]!.offset + 1);
const offsetsOf = (records: { offset: bigint }[]) => records.map((r) => Number(r.offset));

/** Reads batches until at least `n` records came, within `ms`. */
async function take(stream: RecordStream, n: number, ms = 15_000): Promise<KafkaLeaseRecord[]> {
  const out: KafkaLeaseRecord[] = [];
  const deadline = Date.now() + ms;
  while (out.length < n) {
    const next = await within(Math.max(deadline - Date.now(), 1), `${n} records (got ${out.length})`, stream.next());
    if (next.done) throw new Error(`the stream ended after ${out.length} records`);
    out.push(...next.value.records);
  }
  return out;
}

/** Consumes events until the subscription ends (resolves) or fails (rejects). */
async function drain(subscription: AsyncIterable<unknown>): Promise<void> {
  for await (const _ of subscription);
}

async function rejection(promise: Promise<unknown>): Promise<KafkaLeaseError> {
  const error = await promise.then(
    () => assert.fail("expected the call to fail"),
    (e: unknown) => e,
  );
  assert.ok(error instanceof KafkaLeaseError, `not a KafkaLeaseError: ${error}`);
  return error;
}

function assertSameRecord(got: KafkaLeaseRecord, want: FixtureRecord) {
  const at = `record at offset ${want.offset}`;
  assert.equal(got.offset, BigInt(want.offset), at);
  assert.equal(hex(got.key), want.key_hex, `${at}: key (null vs empty vs bytes)`);
  assert.equal(hex(got.value), want.value_hex, `${at}: value (tombstone vs empty vs bytes)`);
  assert.deepEqual(
    got.headers.map((h) => ({ key: h.key, value_hex: hex(h.value) })),
    want.headers,
    `${at}: headers, in order, duplicates and null vs empty values kept`,
  );
  assert.equal(got.timestamp?.getTime(), want.timestamp_ms, `${at}: timestamp`);
  assert.equal(got.timestampType, TimestampType.TIMESTAMP_TYPE_CREATE_TIME, `${at}: timestamp type`);
}

describe("against the gateway", () => {
  let client: Client;
  before(async () => {
    client = Client.connect(ADDR);
    // Every test below relies on the fixture's records being in Kafka from their first offset.
    const probe = await client.acquire({ group: freshGroup(), topic: FIXTURE.topic, partition: 0 });
    const earliest = await probe.seek("earliest");
    await probe.release();
    if (earliest.offset !== START0) {
      throw new Error(
        `partition 0 of ${FIXTURE.topic} now starts at offset ${earliest.offset}, not ${START0}: the fixture's ` +
          `records were deleted from Kafka (time retention: their timestamps are of 2023, older than the ` +
          `broker's retention of 7 days)`,
      );
    }
  });
  after(() => client.close());

  test("a. acquire, read all of partition 0, every field as the fixture says", async () => {
    const lease = await client.acquire({ group: freshGroup(), topic: FIXTURE.topic, partition: 0, ttlMs: 30_000 });
    try {
      assert.equal(lease.topic, FIXTURE.topic);
      assert.equal(lease.partition, 0);
      assert.ok(lease.fencingToken > 0n);
      assert.equal(typeof lease.offset, "bigint");
      assert.equal(
        lease.offset,
        START0,
        `a fresh group starts at the log start; a later start means the fixture's records are gone from Kafka ` +
          `(deleted by time retention: their timestamps are of 2023)`,
      );
      assert.equal(lease.highWatermark, END0);
      assert.ok(lease.expiresAt !== null && lease.expiresAt.getTime() > Date.now());
      assert.equal(lease.ttlMs, 30_000);
      const stream = lease.records();
      try {
        const records = await take(stream, P0.length);
        assert.deepEqual(offsetsOf(records), P0.map((r) => r.offset));
        records.forEach((r, i) => assertSameRecord(r, P0[i]!));
      } finally {
        stream.cancel();
      }
    } finally {
      await lease.release();
    }
  });

  test("b. seek to an offset, earliest, latest, a time, committed: no stale record leaks", async () => {
    const lease = await client.acquire({ group: freshGroup(), topic: FIXTURE.topic, partition: 0 });
    const stream = lease.records({ maxRecords: 1 });
    try {
      assert.deepEqual(offsetsOf(await take(stream, 4)), [0, 1, 2, 3]);
      // Responses of epoch 0 (4, 5, ...) are in flight or buffered by now: all must be dropped.
      const sought = await lease.seek(2);
      assert.deepEqual(sought, { offset: 2n, seekEpoch: 1n });
      assert.equal(lease.seekEpoch, 1n);
      assert.deepEqual(offsetsOf(await take(stream, 3)), [2, 3, 4]);

      assert.deepEqual(await lease.seek("earliest"), { offset: START0, seekEpoch: 2n });
      assert.deepEqual(offsetsOf(await take(stream, 2)), [0, 1]);

      const latest = await lease.seek("latest");
      assert.deepEqual(latest, { offset: END0, seekEpoch: 3n });

      const at = await lease.seek(new Date(P0[5]!.timestamp_ms));
      assert.deepEqual(at, { offset: 5n, seekEpoch: 4n });
      assert.deepEqual(offsetsOf(await take(stream, 1)), [5]);

      // Nothing committed in this group: the offset_reset position (earliest).
      assert.deepEqual(await lease.seek("committed"), { offset: START0, seekEpoch: 5n });
      assert.deepEqual(offsetsOf(await take(stream, 1)), [0]);
    } finally {
      stream.cancel();
      await lease.release();
    }
  });

  test("c. commit 7, release, acquire again: the lease starts at 7 and so does the Read", async () => {
    const group = freshGroup();
    const first = await client.acquire({ group, topic: FIXTURE.topic, partition: 0 });
    await first.commit(7n, "node test");
    await first.release();
    const released = await rejection(first.commit(8n));
    assert.ok(released.leaseEnded || released.code === Code.NOT_FOUND, `commit after release: ${released.message}`);

    const second = await client.acquire({ group, topic: FIXTURE.topic, partition: 0 });
    const stream = second.records();
    try {
      assert.equal(second.offset, 7n);
      assert.ok(second.fencingToken > first.fencingToken, "fencing tokens grow");
      const records = await take(stream, 3);
      assert.deepEqual(offsetsOf(records), [7, 8, 9]);
    } finally {
      stream.cancel();
      // Release with a commit: the next lease of the group starts there.
      await second.release(9);
    }
    const third = await client.acquire({ group, topic: FIXTURE.topic, partition: 0 });
    assert.equal(third.offset, 9n);
    await third.release();
  });

  test("d. a Read cut by the network is reopened after the last record handed out", async () => {
    const relay = await Relay.start(ADDR);
    // A tiny HTTP/2 window keeps the gateway from sending far ahead of what was handed out, so
    // the cut breaks the stream while records 3.. are still to come (not all buffered here).
    const relayed = Client.connect(relay.address, { channelOptions: { "grpc-node.flow_control_window": 100 } });
    const lease = await relayed.acquire({ group: freshGroup(), topic: FIXTURE.topic, partition: 0, ttlMs: 30_000 });
    let handedOut = -1;
    const reopens: { from: bigint | undefined; expected: bigint }[] = [];
    const stream = lease.records({
      maxRecords: 1,
      onReconnect: (from) => reopens.push({ from, expected: BigInt(handedOut + 1) }),
    });
    try {
      const firstThree = await take(stream, 3);
      assert.deepEqual(offsetsOf(firstThree), [0, 1, 2]);
      handedOut = 2;
      assert.ok(relay.cut() > 0, "the relay had connections to cut");

      const rest: KafkaLeaseRecord[] = [];
      while (rest.length < P0.length - 3) {
        const batch = await take(stream, 1);
        rest.push(...batch);
        handedOut = Number(batch[batch.length - 1]!.offset);
      }
      assert.deepEqual(offsetsOf(rest), P0.slice(3).map((r) => r.offset), "no gap and no repeat");
      rest.forEach((r, i) => assertSameRecord(r, P0[i + 3]!));

      // Records buffered before the cut may have come first; the break itself must show up as a
      // reopen (pending the next record) from right after the last record handed out.
      const pending = stream.next();
      pending.catch(() => {});
      await pollUntil(15_000, "the Read to be reopened", async () => (stream.reconnects > 0 ? true : undefined));
      assert.ok(reopens.length > 0);
      for (const r of reopens) assert.equal(r.from, r.expected, "reopened at the offset after the last record");
    } finally {
      stream.cancel();
      await lease.release().catch(() => {});
      relayed.close();
      await relay.close();
    }
  });

  test("e. errors carry the ErrorInfo reason and metadata", async () => {
    const missing = await rejection(client.acquire({ group: freshGroup(), topic: FIXTURE.missing_topic }));
    assert.equal(missing.code, Code.NOT_FOUND);
    assert.equal(missing.reason, "TOPIC_NOT_FOUND");
    assert.equal(missing.metadata["topic"], FIXTURE.missing_topic);
    assert.equal(missing.retryAfterMs, undefined);
    assert.equal(missing.retryable, false);

    const group = freshGroup();
    const holder = `node-holder-${group.slice(-6)}`;
    const held = await client.acquire({ group, topic: FIXTURE.topic, partition: 0, member: holder });
    try {
      const busy = await rejection(client.acquire({ group, topic: FIXTURE.topic, partition: 0, waitMs: 0 }));
      assert.equal(busy.code, Code.RESOURCE_EXHAUSTED);
      assert.equal(busy.reason, "PARTITION_BUSY");
      assert.equal(busy.metadata["holder_member"], holder);
      assert.equal(busy.metadata["partition"], "0");
      assert.ok(busy.retryAfterMs !== undefined && busy.retryAfterMs > 0, "retry advice until the holder's expiry");
      assert.equal(busy.retryable, false, "waiting for a partition is what `wait` is for");

      const range = await rejection(held.seek(1_000_000n));
      assert.equal(range.code, Code.OUT_OF_RANGE);
      assert.equal(range.reason, "OFFSET_OUT_OF_RANGE");
      assert.equal(range.metadata["high"], String(END0));
    } finally {
      await held.release();
    }

    const ttl = await rejection(client.acquire({ group: freshGroup(), topic: FIXTURE.topic, ttlMs: 500 }));
    assert.equal(ttl.code, Code.INVALID_ARGUMENT);
    assert.equal(ttl.reason, "INVALID_FIELD");
    assert.equal(ttl.metadata["field"], "ttl");

    const noGroup = await rejection(client.acquire({ group: "", topic: FIXTURE.topic }));
    assert.equal(noGroup.code, Code.INVALID_ARGUMENT);
    assert.equal(noGroup.reason, "INVALID_FIELD");
    assert.equal(noGroup.metadata["field"], "group");
  });

  test("f. subscribe: both partitions, all 15 records, commits; cancelling leaves the group", async () => {
    const group = freshGroup();
    const subscription = await client.subscribe({ group, topics: [FIXTURE.topic], memberId: `node-${group.slice(-8)}` });
    assert.equal(subscription.memberId, `node-${group.slice(-8)}`);
    const assigned = new Set<number>();
    const seen = new Map<number, number[]>([
      [0, []],
      [1, []],
    ]);
    const total = () => [...seen.values()].reduce((n, o) => n + o.length, 0);
    const deadline = Date.now() + 30_000;
    try {
      while (assigned.size < 2 || total() < P0.length + P1.length) {
        const next = await within(Math.max(deadline - Date.now(), 1), "assignments and records", subscription.next());
        if (next.done) throw new Error("the subscription ended");
        const event = next.value;
        if (event.type === "assigned") {
          assert.equal(event.partition.topic, FIXTURE.topic);
          assert.ok(event.partition.fencingToken > 0n);
          assert.equal(event.offset, BigInt(fixtureRecords(event.partition.partition)[0]!.offset));
          assigned.add(event.partition.partition);
        } else if (event.type === "records") {
          assert.ok(assigned.has(event.partition.partition), "records come after `assigned`");
          seen.get(event.partition.partition)!.push(...offsetsOf(event.batch.records));
          await event.partition.commit(event.batch.nextOffset!);
        } else {
          assert.fail(`unexpected ${event.type} event`);
        }
      }
      assert.deepEqual([...assigned].sort(), [0, 1]);
      assert.deepEqual(seen.get(0), P0.map((r) => r.offset));
      assert.deepEqual(seen.get(1), P1.map((r) => r.offset));
      const members = await client.listMembers(group);
      assert.deepEqual(members.map((m) => [m.memberId, m.partitions]), [[subscription.memberId, [0, 1]]]);
      // One join, one epoch of the group's target, which gives the member what it holds.
      assert.deepEqual([Number(members[0].groupEpoch), members[0].targetPartitions], [1, [0, 1]]);
    } finally {
      subscription.cancel();
    }
    assert.deepEqual(await subscription.next(), { done: true, value: undefined });
    await pollUntil(15_000, "the member to leave the group", async () =>
      (await client.listMembers(group)).length === 0 ? true : undefined,
    );
    // What it committed is where the group's next leases start.
    for (const [partition, records] of [
      [0, P0],
      [1, P1],
    ] as const) {
      const lease = await client.acquire({ group, topic: FIXTURE.topic, partition, waitMs: 10_000 });
      assert.equal(lease.offset, BigInt(records[records.length - 1]!.offset + 1), `partition ${partition}'s committed offset`);
      await lease.release();
    }
  });
  test("g. a subscription cut by the network subscribes again by itself within its session grace; without one it ends", async () => {
    const relay = await Relay.start(ADDR);
    // A tiny HTTP/2 window and one record per event keep records coming after the cut.
    const relayed = Client.connect(relay.address, { channelOptions: { "grpc-node.flow_control_window": 100 } });
    const group = freshGroup("resub-");
    const causes: string[] = [];
    // No member id given: it subscribes again under the one `joined` gave.
    const subscription = await relayed.subscribe({
      group,
      topics: [FIXTURE.topic],
      maxRecords: 1,
      sessionGraceMs: 20_000,
      onResubscribe: (cause) => causes.push(Code[cause.code] ?? String(cause.code)),
    });
    const memberId = subscription.memberId;
    assert.ok(memberId !== "");
    const control = await relayed.subscribe({ group: freshGroup("no-grace-"), topics: [FIXTURE.topic] });
    const seen = new Map<number, Set<number>>([
      [0, new Set()],
      [1, new Set()],
    ]);
    const committed = new Map<number, bigint>();
    const assigned: { partition: number; offset: bigint; afterCut: boolean; committed?: bigint }[] = [];
    let received = 0;
    let cut = false;
    const all = () => seen.get(0)!.size === P0.length && seen.get(1)!.size === P1.length;
    const deadline = Date.now() + 45_000;
    try {
      while (!all() || !assigned.some((a) => a.afterCut)) {
        const next = await within(Math.max(deadline - Date.now(), 1), "events after the cut", subscription.next());
        if (next.done) throw new Error("the subscription ended");
        const event = next.value;
        if (event.type === "assigned") {
          const p = event.partition.partition;
          assigned.push({ partition: p, offset: event.offset, afterCut: cut, committed: committed.get(p) });
        } else if (event.type === "records") {
          const p = event.partition.partition;
          for (const r of event.batch.records) seen.get(p)!.add(Number(r.offset));
          // A commit racing the cut may fail (its records then come again): only those that
          // succeed count.
          const ok = await event.partition.commit(event.batch.nextOffset!).then(
            () => true,
            (e: KafkaLeaseError) => (e.retryable ? false : Promise.reject(e)),
          );
          if (ok) committed.set(p, event.batch.nextOffset!);
          // Mid-stream, once each lease's first `assigned` came: events sent before a cut
          // may be lost with the connection.
          if (++received >= 4 && !cut && new Set(assigned.map((a) => a.partition)).size === 2) {
            assert.ok(relay.cut() > 0, "the relay had connections to cut");
            cut = true;
          }
        } else {
          assert.fail(`unexpected ${event.type} event`);
        }
      }
      assert.ok(cut, "the cut happened mid-stream");
      assert.equal(subscription.resubscribes, 1);
      assert.ok(causes.length >= 1, "the break was seen");
      assert.equal(subscription.memberId, memberId, "the same member");
      // The member kept its leases: `assigned` again for each, at what it had committed.
      for (const a of assigned.filter((x) => x.afterCut)) {
        const before = assigned.find((x) => !x.afterCut && x.partition === a.partition);
        assert.ok(before !== undefined, `partition ${a.partition}: assigned again, not newly`);
        const start = BigInt(fixtureRecords(a.partition)[0]!.offset);
        assert.equal(a.offset, a.committed ?? start, "records come again from the last commit");
      }
      const members = await client.listMembers(group);
      assert.deepEqual(members.map((m) => [m.memberId, m.partitions]), [[memberId, [0, 1]]]);

      // Without a session grace the cut ended the other subscription.
      const ended = await rejection(within(15_000, "the graceless subscription to end", drain(control)));
      assert.equal(ended.code, Code.UNAVAILABLE);
      assert.equal(control.resubscribes, 0);
    } finally {
      subscription.cancel();
      control.cancel();
      relayed.close();
      await relay.close();
    }
  });
});
