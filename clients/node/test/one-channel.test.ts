// One channel at the scale the gateway allows (issue 31), against a live gateway.
import assert from "node:assert/strict";
import * as http from "node:http";
import { setTimeout as delay } from "node:timers/promises";
import { test } from "node:test";
import { Client, type Lease, type RecordStream, proto, toKafkaLeaseError } from "../src";
import { ADDR, FIXTURE, freshGroup, pollUntil, within } from "./support";

/**
 * Groups leasing every partition of the fixture's scale topic (250): 4 x 250 = 1,000 leases,
 * the most one connection may hold (the gateway's --max-leases-per-connection).
 */
const GROUPS = 4;
/** Acquires waiting for held partitions, on the same client. */
const WAITERS = 500;
/** How long a short call is given on the full channel: far beyond its usual milliseconds. */
const SHORT_CALL_MS = 10_000;

/** The sum of a metric's series on the gateway's Prometheus endpoint. */
async function scrapeMetric(url: string, name: string): Promise<number> {
  const text = await new Promise<string>((resolve, reject) => {
    http
      .get(url, { timeout: 10_000 }, (res) => {
        let body = "";
        res.setEncoding("utf8");
        res.on("data", (chunk: string) => (body += chunk));
        res.on("end", () => resolve(body));
        res.on("error", reject);
      })
      .on("error", reject);
  });
  let sum = 0;
  for (const line of text.split("\n")) {
    const space = line.lastIndexOf(" ");
    if (line.startsWith("#") || space < 0) continue;
    if (line.slice(0, space).split("{")[0] === name) sum += Number(line.slice(space + 1));
  }
  return sum;
}

/** Runs `calls` with at most `n` at a time; their results in order. */
async function limited<T, R>(items: T[], n: number, call: (item: T) => Promise<R>): Promise<R[]> {
  const out: R[] = new Array(items.length);
  let next = 0;
  const worker = async () => {
    while (next < items.length) {
      const i = next++;
      out[i] = await call(items[i]!);
    }
  };
  await Promise.all(Array.from({ length: n }, worker));
  return out;
}

/** A short call with a deadline of SHORT_CALL_MS; its latency in ms. */
async function timed(what: string, call: (deadline: Date) => Promise<unknown>): Promise<number> {
  const started = performance.now();
  await within(SHORT_CALL_MS, `${what} on the full channel`, call(new Date(Date.now() + SHORT_CALL_MS)));
  return performance.now() - started;
}

// One client (one gRPC channel, one connection) holds 1,000 leases with a Read open on each and
// has 500 Acquires waiting for held partitions; a Commit, a Seek, a ListLeases and a Release
// through the same client still answer within SHORT_CALL_MS. grpc-js sets no cap of its own on
// the streams of a channel (Node's HTTP/2 session keeps to the gateway's
// SETTINGS_MAX_CONCURRENT_STREAMS, and grpc-js lifts Node's session memory limit), which leaves
// short calls room past the long ones. The waiters use the generated client (`client.raw`, the
// same channel) so that the test can cancel them: Client.acquire takes no cancellation signal.
// Takes 5 to 15 s.
test("one channel carries 1,000 Reads and 500 waiting Acquires, and short calls answer", { timeout: 300_000 }, async () => {
  assert.ok(FIXTURE.scale?.topic && FIXTURE.metrics_url, "the fixture has no scale topic: run it through tests/clients.rs");
  const started = performance.now();
  const topic = FIXTURE.scale.topic;
  const keys: { group: string; partition: number }[] = [];
  for (let g = 0; g < GROUPS; g++) {
    const group = freshGroup();
    for (let p = 0; p < FIXTURE.scale.partitions; p++) keys.push({ group, partition: p });
  }
  const client = Client.connect(ADDR);
  const streams: RecordStream[] = [];
  const waiters: { call: ReturnType<typeof client.raw.acquire>; outcome: Promise<string> }[] = [];
  let leases: Lease[] = [];
  try {
    leases = await limited(keys, 32, (k) =>
      client.acquire({ group: k.group, topic, partition: k.partition, ttlMs: 60_000, member: "node-scale" }),
    );
    console.log(`${leases.length} leases acquired in ${Math.round(performance.now() - started)} ms`);

    // A Read open on each, through the client's RecordStream: each hands out the partition's
    // record at offset 0 (so it is open at the gateway), then stays open.
    const readsStarted = performance.now();
    for (const lease of leases) streams.push(lease.records());
    const firsts = await within(
      60_000,
      "the first record of every Read",
      Promise.all(streams.map((s) => s.next())),
    );
    firsts.forEach((first, i) => {
      assert.ok(!first.done, `the Read of lease ${i} ended`);
      assert.equal(first.value.records[0]?.offset, 0n, `the Read of lease ${i} starts at offset 0`);
    });
    console.log(`${streams.length} Reads open (each with its first record) in ${Math.round(performance.now() - readsStarted)} ms`);
    // What each Read does next: nothing until its lease is released.
    const nexts = streams.map((s) => s.next().then((r) => (r.done ? "ended" : `batch at ${r.value.records[0]?.offset}`)));

    // 500 Acquires waiting for the first 500 leases' partitions, on the same channel.
    const waitersStarted = performance.now();
    for (const k of keys.slice(0, WAITERS)) {
      const request = proto.AcquireRequest.fromPartial({
        group: k.group,
        topic,
        partition: k.partition,
        wait: { seconds: 120n, nanos: 0 },
      });
      let call!: ReturnType<typeof client.raw.acquire>;
      const outcome = new Promise<string>((resolve) => {
        call = client.raw.acquire(request, (error) => resolve(error ? toKafkaLeaseError(error).message : "granted"));
      });
      waiters.push({ call, outcome });
    }
    const waiting = await pollUntil(60_000, "every Acquire to wait at the gateway", async () => {
      const n = await scrapeMetric(FIXTURE.metrics_url, "kafka_lease_acquires_waiting");
      return n >= WAITERS ? n : undefined;
    });
    console.log(`${waiting} Acquires waiting after ${Math.round(performance.now() - waitersStarted)} ms`);

    // The short calls, on a lease of the last group (nobody waits for it), its Read open.
    const probe = leases[leases.length - 1]!;
    const probeStream = streams[streams.length - 1]!;
    const commit = await timed("Commit", (deadline) => probe.commit(1, undefined, { deadline }));
    const seek = await timed("Seek", async (deadline) => {
      assert.equal((await probe.seek("earliest", { deadline })).offset, 0n);
    });
    const list = await timed("ListLeases", async (deadline) => {
      const listed = await client.listLeases({ group: probe.group }, { deadline });
      assert.equal(listed.length, FIXTURE.scale.partitions);
    });
    const release = await timed("Release", (deadline) => probe.release(undefined, { deadline }));
    const ms = (x: number) => `${x.toFixed(1)} ms`;
    console.log(
      `one channel with ${streams.length} Reads and ${WAITERS} waiting Acquires: Commit ${ms(commit)}, ` +
        `Seek ${ms(seek)}, ListLeases ${ms(list)}, Release ${ms(release)}`,
    );
    // The released lease's Read ends (after the sought record 0 again); nothing else did.
    let probeNext = await within(SHORT_CALL_MS, "the released lease's Read", nexts[nexts.length - 1]!);
    if (probeNext === "batch at 0") probeNext = await within(SHORT_CALL_MS, "its end", probeStream.next().then((r) => (r.done ? "ended" : "batch")));
    assert.equal(probeNext, "ended");
    const settled = await Promise.race([
      Promise.race([...nexts.slice(0, -1), ...waiters.map((w) => w.outcome)]),
      delay(100).then(() => "nothing"),
    ]);
    assert.equal(settled, "nothing", "no other Read and no waiting Acquire ended");

    // Done: the waiters cancelled, then every lease released (its Read ends).
    for (const w of waiters) w.call.cancel();
    for (const w of waiters) assert.match(await w.outcome, /cancel/i);
    await limited(leases.slice(0, -1), 32, (lease) => lease.release());
    assert.deepEqual(new Set(await within(SHORT_CALL_MS, "the Reads' ends", Promise.all(nexts.slice(0, -1)))), new Set(["ended"]));
  } finally {
    for (const w of waiters) w.call.cancel();
    for (const s of streams) s.cancel();
    client.close();
  }
  console.log(`test took ${Math.round(performance.now() - started)} ms`);
});
