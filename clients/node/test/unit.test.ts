// Without a gateway: the generated code's presence and int64 handling, the status-details
// decoder, the epoch filter, and Acquire's retry and a Read's reopen against an in-process
// fake gateway.
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { inspect } from "node:util";
import { BinaryWriter } from "@bufbuild/protobuf/wire";
import * as grpc from "@grpc/grpc-js";
import { Client, Code, type Delivery, EpochFilter, KafkaLeaseError, RejectError, RetryError, decodeStatusDetails, proto } from "../src";
import { seekPosition } from "../src/lease";
import { leaseRenewEveryMs, subscriptionRenewEveryMs } from "../src/queue";

/** A google.rpc.Status with an ErrorInfo and, optionally, a RetryInfo, as the gateway sends it. */
function statusBytes(code: number, reason: string, metadata: Record<string, string>, retryMs?: number, domain = "kafka-lease") {
  const any = (typeUrl: string, value: Uint8Array) => new BinaryWriter().uint32(10).string(typeUrl).uint32(18).bytes(value).finish();
  const info = new BinaryWriter().uint32(10).string(reason).uint32(18).string(domain);
  for (const [k, v] of Object.entries(metadata)) info.uint32(26).fork().uint32(10).string(k).uint32(18).string(v).join();
  const status = new BinaryWriter().uint32(8).int32(code).uint32(18).string("message");
  status.uint32(26).bytes(any("type.googleapis.com/google.rpc.ErrorInfo", info.finish()));
  if (retryMs !== undefined) {
    const duration = new BinaryWriter().uint32(8).int64(Math.floor(retryMs / 1000)).uint32(16).int32((retryMs % 1000) * 1e6);
    const retry = new BinaryWriter().uint32(10).bytes(duration.finish());
    status.uint32(26).bytes(any("type.googleapis.com/google.rpc.RetryInfo", retry.finish()));
  }
  return status.finish();
}

describe("generated stubs", () => {
  test("absent and empty bytes stay distinct through encode and decode", () => {
    const record: proto.KafkaRecord = {
      offset: 1n,
      key: undefined,
      value: Buffer.alloc(0),
      headers: [{ key: "null" }, { key: "empty", value: Buffer.alloc(0) }, { key: "dup", value: Buffer.from("a") }],
      timestamp: undefined,
      timestampType: proto.TimestampType.TIMESTAMP_TYPE_CREATE_TIME,
    };
    const bytes = proto.KafkaRecord.encode(record).finish();
    // offset, then value present with length 0 (tag 26, len 0); no key field (tag 18) at all.
    assert.deepEqual([...bytes.subarray(0, 4)], [8, 1, 26, 0]);
    const back = proto.KafkaRecord.decode(bytes);
    assert.equal(back.key, undefined);
    assert.ok(back.value !== undefined && back.value.length === 0);
    assert.equal(back.headers[0]!.value, undefined);
    assert.ok(back.headers[1]!.value !== undefined && back.headers[1]!.value.length === 0);
    assert.deepEqual(back.headers.map((h) => h.key), ["null", "empty", "dup"]);
  });

  test("int64 and uint64 keep every bit as bigint", () => {
    const max = 2n ** 63n - 1n;
    assert.equal(proto.KafkaRecord.decode(proto.KafkaRecord.encode({ ...proto.KafkaRecord.create(), offset: max }).finish()).offset, max);
    const token = 2n ** 64n - 1n;
    const assigned = proto.Assigned.decode(proto.Assigned.encode({ ...proto.Assigned.create(), fencingToken: token }).finish());
    assert.equal(assigned.fencingToken, token);
    assert.equal(proto.ReleaseResponse.decode(new Uint8Array()).committedOffset, undefined, "optional int64 absent");
    assert.equal(proto.ReleaseResponse.decode(proto.ReleaseResponse.encode({ committedOffset: 0n }).finish()).committedOffset, 0n);
  });

  test("the seek position is a oneof of exactly one case", () => {
    assert.deepEqual(seekPosition(42), { $case: "offset", offset: 42n });
    assert.deepEqual(seekPosition("latest"), { $case: "latest", latest: {} });
    assert.deepEqual(seekPosition(new Date(1_700_000_000_123)), {
      $case: "timestamp",
      timestamp: { seconds: 1_700_000_000n, nanos: 123_000_000 },
    });
    assert.throws(() => seekPosition(2 ** 60), RangeError, "an unsafe number is refused, not rounded");
    const bytes = proto.SeekRequest.encode({ leaseId: "l", position: seekPosition("earliest") }).finish();
    assert.deepEqual(proto.SeekRequest.decode(bytes).position, { $case: "earliest", earliest: {} });
  });
});

describe("status details", () => {
  test("ErrorInfo reason and metadata, RetryInfo delay", () => {
    const d = decodeStatusDetails(statusBytes(14, "KAFKA_UNAVAILABLE", { operation: "fetch", x: "1" }, 1500));
    assert.equal(d.reason, "KAFKA_UNAVAILABLE");
    assert.deepEqual(d.metadata, { operation: "fetch", x: "1" });
    assert.equal(d.retryAfterMs, 1500);
  });

  test("an ErrorInfo of another domain is ignored; garbage counts as no details", () => {
    const other = decodeStatusDetails(statusBytes(9, "LEASE_LOST", { a: "b" }, undefined, "some-proxy"));
    assert.equal(other.reason, undefined);
    assert.deepEqual(other.metadata, {});
    const md = new grpc.Metadata();
    md.set("grpc-status-details-bin", Buffer.from([0xff, 0xff, 0xff]));
    const e = KafkaLeaseError.fromStatus({ code: Code.UNAVAILABLE, details: "x", metadata: md });
    assert.equal(e.reason, undefined);
    assert.equal(e.retryable, true, "a status without details is a transport failure");
  });

  test("lease-ended and retryable follow the reason", () => {
    const md = (bytes: Uint8Array) => {
      const m = new grpc.Metadata();
      m.set("grpc-status-details-bin", Buffer.from(bytes));
      return m;
    };
    const lost = KafkaLeaseError.fromStatus({ code: 9, details: "gone", metadata: md(statusBytes(9, "LEASE_LOST", { lease_ref: "r" })) });
    assert.equal(lost.leaseEnded, true);
    const down = KafkaLeaseError.fromStatus({
      code: 14,
      details: "bye",
      metadata: md(statusBytes(14, "SHUTTING_DOWN", { lease_ref: "r" })),
    });
    assert.equal(down.leaseEnded, true);
    assert.equal(down.retryable, false);
  });
});

describe("epoch filter", () => {
  test("drops epochs older than a seen seek, never lowers", () => {
    const f = new EpochFilter();
    assert.equal(f.admit(0n), true);
    f.observe(2n);
    assert.equal(f.admit(1n), false);
    assert.equal(f.admit(3n), true);
    f.observe(1n);
    assert.equal(f.newest, 3n);
    assert.equal(f.admit(2n), false);
  });
});

/** A gateway in this process: Acquire fails with `failures` first; `handlers` replace the rest. */
async function fakeGateway(failures: Uint8Array[], handlers: Partial<proto.PartitionLeaseServiceServer> = {}) {
  const server = new grpc.Server();
  let calls = 0;
  const unimplemented = (_: unknown, cb: (e: grpc.ServiceError) => void) =>
    cb({ code: Code.UNIMPLEMENTED, details: "", metadata: new grpc.Metadata() } as grpc.ServiceError);
  server.addService(proto.PartitionLeaseServiceService, {
    acquire: (_call: unknown, cb: grpc.sendUnaryData<proto.AcquireResponse>) => {
      const failure = failures[calls++];
      if (failure === undefined) {
        cb(null, { ...proto.AcquireResponse.create(), leaseId: "secret-lease-id", topic: "t", offset: 2n ** 53n + 1n });
        return;
      }
      const metadata = new grpc.Metadata();
      metadata.set("grpc-status-details-bin", Buffer.from(failure));
      cb({ code: Code.UNAVAILABLE, details: "try later", metadata } as grpc.ServiceError);
    },
    read: unimplemented,
    seek: unimplemented,
    commit: unimplemented,
    release: unimplemented,
    subscribe: unimplemented,
    listMembers: unimplemented,
    listLeases: unimplemented,
    deliver: unimplemented,
    acknowledge: unimplemented,
    ...handlers,
  } as unknown as proto.PartitionLeaseServiceServer);
  const port = await new Promise<number>((resolve, reject) =>
    server.bindAsync("127.0.0.1:0", grpc.ServerCredentials.createInsecure(), (e, p) => (e ? reject(e) : resolve(p))),
  );
  return { client: Client.connect(`127.0.0.1:${port}`), server, calls: () => calls };
}

describe("acquire retry and read reopen (fake gateway)", () => {
  test("retries UNAVAILABLE with RetryInfo after its delay, then succeeds", async () => {
    const retry = statusBytes(14, "CONSUL_UNAVAILABLE", {}, 100);
    const fake = await fakeGateway([retry, retry]);
    try {
      const started = Date.now();
      const lease = await fake.client.acquire({ group: "g", topic: "t" });
      assert.equal(fake.calls(), 3);
      assert.ok(Date.now() - started >= 200, "waited the retry delay twice");
      assert.equal(lease.offset, 2n ** 53n + 1n, "int64 beyond 2^53 arrives exactly");
      assert.equal(lease.leaseId, "secret-lease-id");
      assert.ok(!inspect(lease).includes("secret-lease-id"), "the lease id (a credential) stays out of logs");
    } finally {
      fake.client.close();
      fake.server.forceShutdown();
    }
  });

  test("does not retry without RetryInfo, and stops after the attempts", async () => {
    const fake = await fakeGateway([statusBytes(14, "SHUTTING_DOWN", { lease_ref: "r" })]);
    const noAdvice = await fake.client.acquire({ group: "g", topic: "t" }).catch((e: KafkaLeaseError) => e);
    assert.ok(noAdvice instanceof KafkaLeaseError && noAdvice.reason === "SHUTTING_DOWN");
    assert.equal(fake.calls(), 1);
    fake.client.close();
    fake.server.forceShutdown();

    const retry = statusBytes(14, "KAFKA_UNAVAILABLE", {}, 10);
    const always = await fakeGateway([retry, retry, retry, retry]);
    const failed = await always.client.acquire({ group: "g", topic: "t", retry: { attempts: 3 } }).catch((e) => e);
    assert.ok(failed instanceof KafkaLeaseError && failed.code === Code.UNAVAILABLE && failed.retryAfterMs === 10);
    assert.equal(always.calls(), 3);
    always.client.close();
    always.server.forceShutdown();
  });

  test("reopens a broken Read after the last record handed out, at its epoch; after a seek, at the resume point", async () => {
    const batch = (seekEpoch: bigint, ...offsets: bigint[]): proto.ReadResponse => ({
      ...proto.ReadResponse.create(),
      seekEpoch,
      records: offsets.map((offset) => ({ ...proto.KafkaRecord.create(), offset })),
    });
    const scripts = [[batch(0n, 5n, 6n)], [batch(1n, 7n)], [batch(1n, 8n)], []];
    const reads: proto.ReadRequest[] = [];
    const fake = await fakeGateway([], {
      read: (call) => {
        const script = scripts[reads.push(call.request) - 1];
        for (const response of script) call.write(response);
        if (script.length === 0) call.end();
        else call.emit("error", { code: Code.UNAVAILABLE, details: "connection reset", metadata: new grpc.Metadata() });
      },
      seek: (_call, cb) => cb(null, { ...proto.SeekResponse.create(), offset: 20n, seekEpoch: 2n }),
    });
    try {
      const lease = await fake.client.acquire({ group: "g", topic: "t" });
      const stream = lease.records();
      const offsets = async () => (await stream.next()).value?.records.map((r) => r.offset);
      assert.deepEqual(await offsets(), [5n, 6n]);
      assert.deepEqual(await offsets(), [7n]);
      assert.deepEqual(await offsets(), [8n]);
      assert.equal((await lease.seek(20)).seekEpoch, 2n);
      assert.equal(await offsets(), undefined, "ended after the reopen");
      const asked = reads.map((r) => [r.fromOffset, r.ifSeekEpoch]);
      // Only while the lease is still at the epoch of the last record handed out; after the
      // seek, neither: the Read starts where the seek put the lease.
      assert.deepEqual(asked, [[undefined, undefined], [7n, 0n], [8n, 1n], [undefined, undefined]]);
    } finally {
      fake.client.close();
      fake.server.forceShutdown();
    }
  });
});

describe("queue mode (fake gateway)", () => {
  const deliveries = (...offsets: [bigint, number][]): proto.DeliverResponse => ({
    highWatermark: 100n,
    deliveries: offsets.map(([offset, attempt]) => ({
      record: { ...proto.KafkaRecord.create(), offset, value: Buffer.from(`v${offset}`) },
      attempt,
      deadline: { seconds: 2_000_000_000n, nanos: 0 },
    })),
  });
  type AckCall = { request: proto.AcknowledgeRequest; answer: (outcomes?: proto.AckOutcome[]) => void };

  /** A fake whose Deliver plays `scripts` (one per call; `"break"` ends it UNAVAILABLE, else OK). */
  async function queueGateway(scripts: (proto.DeliverResponse | "break" | "hold")[][], autoAnswer = false, ttlMs?: number) {
    const delivers: proto.DeliverRequest[] = [];
    const acks: AckCall[] = [];
    let onAck: (() => void) | undefined;
    const fake = await fakeGateway([], {
      deliver: (call) => {
        const script = scripts[delivers.push(call.request) - 1] ?? [];
        for (const step of script) {
          if (step === "break") {
            call.emit("error", { code: Code.UNAVAILABLE, details: "connection reset", metadata: new grpc.Metadata() });
            return;
          }
          if (step === "hold") return; // stays open
          call.write(step);
        }
        call.end();
      },
      acknowledge: (call, cb) => {
        const answer = (outcomes?: proto.AckOutcome[]) =>
          cb(null, {
            outcomes: outcomes ?? call.request.acknowledgements.map(() => proto.AckOutcome.ACK_OUTCOME_APPLIED),
          });
        acks.push({ request: call.request, answer });
        if (autoAnswer) answer();
        onAck?.();
      },
    });
    const lease = await fake.client.acquire({ group: "g", topic: "t", ttlMs });
    const nextAck = (n: number) =>
      new Promise<void>((resolve) => {
        const check = () => acks.length >= n && resolve();
        onAck = check;
        check();
      });
    return { fake, lease, delivers, acks, nextAck };
  }

  test("answers go in one Acknowledge at a time, those made meanwhile batched; outcomes in order", async () => {
    const q = await queueGateway([[deliveries([1n, 1], [2n, 1], [3n, 1], [4n, 2]), "hold"]]);
    try {
      const stream = q.lease.deliveries({ ordering: "key", maxInFlight: 10, ackDeadlineMs: 5_000, maxDeliveries: 3, deadLetterTopic: "dlq" });
      const got: Delivery[] = [];
      for (let i = 0; i < 4; i++) got.push((await stream.next()).value!);
      assert.deepEqual(got.map((d) => [d.offset, d.attempt]), [[1n, 1], [2n, 1], [3n, 1], [4n, 2]]);
      assert.equal(got[0]!.record.value?.toString(), "v1");
      assert.deepEqual(got[0]!.deadline, new Date(2_000_000_000_000));
      assert.deepEqual(q.delivers[0], {
        leaseId: "secret-lease-id",
        ordering: proto.DeliveryOrder.DELIVERY_ORDER_KEY,
        maxInFlight: 10,
        maxInFlightBytes: 0,
        ackDeadline: { seconds: 5n, nanos: 0 },
        maxDeliveries: 3,
        deadLetterTopic: "dlq",
      });

      const first = got[0]!.accept();
      await q.nextAck(1);
      // While the first call is out, three more answers queue up behind it.
      const rest = [got[1]!.retry(1500, "later"), got[2]!.reject("x".repeat(2000)), got[3]!.renew()];
      await new Promise((r) => setImmediate(r));
      assert.equal(q.acks.length, 1, "one Acknowledge in flight at a time");
      q.acks[0]!.answer();
      assert.equal(await first, "applied");
      await q.nextAck(2);
      assert.deepEqual(
        q.acks[1]!.request.acknowledgements.map((a) => [a.offset, a.type, a.attempt, a.retryDelay, a.reason.length]),
        [
          [2n, proto.AckType.ACK_TYPE_RETRY, 1, { seconds: 1n, nanos: 500_000_000 }, 5],
          [3n, proto.AckType.ACK_TYPE_REJECT, 1, undefined, 1024],
          [4n, proto.AckType.ACK_TYPE_RENEW, 2, undefined, 0],
        ],
      );
      q.acks[1]!.answer([proto.AckOutcome.ACK_OUTCOME_APPLIED, proto.AckOutcome.ACK_OUTCOME_STALE, proto.AckOutcome.ACK_OUTCOME_NOT_DELIVERED]);
      // NOT_DELIVERED is not reported as stale.
      assert.deepEqual(await Promise.all(rest), ["applied", "stale", "notDelivered"]);
      await assert.rejects(got[1]!.retry(-1), RangeError, "a bad delay fails alone, before it can spoil a batch");
      stream.cancel();
    } finally {
      q.fake.client.close();
      q.fake.server.forceShutdown();
    }
  });

  test("renewals while draining: a third of a lease's TTL; a third of a subscription's ack deadline, at most 2 s; at least 100 ms", () => {
    assert.equal(leaseRenewEveryMs(30_000), 10_000);
    assert.equal(leaseRenewEveryMs(1_500), 500);
    assert.equal(leaseRenewEveryMs(150), 100);
    assert.equal(subscriptionRenewEveryMs(), 2_000, "the gateway's default ack deadline, 30 s");
    assert.equal(subscriptionRenewEveryMs(60_000), 2_000);
    assert.equal(subscriptionRenewEveryMs(1_500), 500);
    assert.equal(subscriptionRenewEveryMs(150), 100);
  });

  test("a broken Deliver is reopened with the same request; closing hands back what was not handed out", async () => {
    const q = await queueGateway(
      [[deliveries([1n, 1]), "break"], ["break"], [deliveries([2n, 1], [3n, 1], [4n, 1]), "hold"]],
      true,
    );
    try {
      const causes: Code[] = [];
      const stream = q.lease.deliveries({ onReconnect: (cause) => causes.push(cause.code) });
      assert.equal((await stream.next()).value?.offset, 1n);
      assert.equal((await stream.next()).value?.offset, 2n);
      assert.equal(stream.reconnects, 2);
      assert.deepEqual(causes, [Code.UNAVAILABLE, Code.UNAVAILABLE]);
      assert.equal(q.delivers.length, 3);
      assert.deepEqual(q.delivers[2], q.delivers[0]);
      stream.cancel();
      await q.nextAck(1);
      assert.deepEqual(
        q.acks[0]!.request.acknowledgements.map((a) => [a.offset, a.type, a.retryDelay]),
        [
          [3n, proto.AckType.ACK_TYPE_RETRY, { seconds: 0n, nanos: 0 }],
          [4n, proto.AckType.ACK_TYPE_RETRY, { seconds: 0n, nanos: 0 }],
        ],
      );
      assert.deepEqual(await stream.next(), { value: undefined, done: true });
    } finally {
      q.fake.client.close();
      q.fake.server.forceShutdown();
    }
  });

  test("consume: concurrency, the error policy, and a draining shutdown that hands back what still runs", async () => {
    const q = await queueGateway([[deliveries([1n, 1], [2n, 3], [3n, 1], [4n, 1], [5n, 1], [6n, 1]), "hold"]], true);
    try {
      const shutdown = new AbortController();
      let running = 0;
      let most = 0;
      const aborted: bigint[] = [];
      const stats = q.lease.consume(
        async (record, { attempt, signal }) => {
          most = Math.max(most, ++running);
          try {
            await new Promise((r) => setTimeout(r, 20));
            if (record.offset === 1n) return;
            if (record.offset === 2n) throw new Error(`boom at attempt ${attempt}`);
            if (record.offset === 3n) throw new RetryError("busy", { delayMs: 250 });
            if (record.offset === 4n) throw new RejectError("poison");
            if (record.offset === 5n) throw new TypeError("policy says reject");
            // 6: blocks until handed back.
            await new Promise((resolve) => signal.addEventListener("abort", resolve));
            aborted.push(record.offset);
          } finally {
            running--;
          }
        },
        {
          concurrency: 2,
          signal: shutdown.signal,
          drainMs: 100,
          backoff: { initialMs: 50, maxMs: 150 },
          onError: (e) => (e instanceof TypeError ? { action: "reject", reason: "typed" } : undefined),
        },
      );
      while (q.acks.flatMap((a) => a.request.acknowledgements).length < 5) await new Promise((r) => setTimeout(r, 10));
      shutdown.abort();
      assert.deepEqual(await stats, { accepted: 1, retried: 2, rejected: 2, handedBack: 1 });
      assert.equal(most, 2, "never more than `concurrency` handlers at once");
      assert.equal(q.delivers[0]!.maxInFlight, 2, "max in flight defaults to the concurrency");
      assert.deepEqual(aborted, [6n], "the handed-back handler's signal aborted");
      const answers = new Map(
        q.acks.flatMap((a) => a.request.acknowledgements).map((a) => [a.offset, [a.type, a.retryDelay, a.reason]]),
      );
      const ms = (n: number) => ({ seconds: BigInt(Math.floor(n / 1000)), nanos: (n % 1000) * 1e6 });
      assert.deepEqual(answers.get(1n), [proto.AckType.ACK_TYPE_ACCEPT, undefined, ""]);
      assert.deepEqual(answers.get(2n), [proto.AckType.ACK_TYPE_RETRY, ms(150), "boom at attempt 3"], "backoff 50 ms doubling, at most 150");
      assert.deepEqual(answers.get(3n), [proto.AckType.ACK_TYPE_RETRY, ms(250), "busy"]);
      assert.deepEqual(answers.get(4n), [proto.AckType.ACK_TYPE_REJECT, undefined, "poison"]);
      assert.deepEqual(answers.get(5n), [proto.AckType.ACK_TYPE_REJECT, undefined, "typed"]);
      assert.deepEqual(answers.get(6n), [proto.AckType.ACK_TYPE_RETRY, ms(0), "the consumer shut down before handling it"]);
    } finally {
      q.fake.client.close();
      q.fake.server.forceShutdown();
    }
  });

  test("consume: while draining, the deliveries of the handlers still running are renewed every third of the TTL, and no more after", async () => {
    const q = await queueGateway([[deliveries([1n, 1], [2n, 1]), "hold"]], true, 300);
    try {
      const shutdown = new AbortController();
      const started: bigint[] = [];
      const since = (ms: number) => new Promise((r) => setTimeout(r, ms));
      const stats = q.lease.consume(
        async (record) => {
          started.push(record.offset);
          await new Promise((resolve) => shutdown.signal.addEventListener("abort", resolve, { once: true }));
          await since(record.offset === 1n ? 150 : 650);
        },
        { concurrency: 2, signal: shutdown.signal, drainMs: 5_000 },
      );
      while (started.length < 2) await since(10);
      shutdown.abort();
      assert.deepEqual(await stats, { accepted: 2, retried: 0, rejected: 0, handedBack: 0 });
      const sent = () => q.acks.flatMap((a) => a.request.acknowledgements).map((a) => [a.offset, a.type] as const);
      const after = sent().length;
      await since(400);
      assert.equal(sent().length, after, "no renewal after the drain");
      const renewals = (offset: bigint) =>
        sent().filter(([o, type]) => o === offset && type === proto.AckType.ACK_TYPE_RENEW).length;
      const answered = (offset: bigint) =>
        sent().findIndex(([o, type]) => o === offset && type === proto.AckType.ACK_TYPE_ACCEPT);
      assert.ok(renewals(2n) >= 3 && renewals(2n) <= 7, `offset 2 (650 ms, every 100 ms) renewed ${renewals(2n)} times`);
      assert.ok(renewals(1n) < renewals(2n), `offset 1 (150 ms) renewed ${renewals(1n)} times`);
      for (const offset of [1n, 2n]) {
        const renewedAfter = sent().slice(answered(offset)).some(([o, type]) => o === offset && type === proto.AckType.ACK_TYPE_RENEW);
        assert.ok(answered(offset) >= 0 && !renewedAfter, `offset ${offset}: not renewed once answered`);
      }
    } finally {
      q.fake.client.close();
      q.fake.server.forceShutdown();
    }
  });
});

describe("resubscribe (fake gateway)", () => {
  type Step = proto.SubscribeResponse | { code: Code; details?: Uint8Array };
  const joined = (memberId: string): proto.SubscribeResponse => ({ event: { $case: "joined", joined: { memberId, gateway: "gw" } } });
  const assigned = (offset: bigint): proto.SubscribeResponse => ({
    event: { $case: "assigned", assigned: { ...proto.Assigned.create(), leaseId: "L1", topic: "t", partition: 0, fencingToken: 7n, offset } },
  });
  const records = (offset: bigint): proto.SubscribeResponse => ({
    event: {
      $case: "records",
      records: { ...proto.SubscribedRecords.create(), leaseId: "L1", topic: "t", records: [{ ...proto.KafkaRecord.create(), offset }] },
    },
  });
  const broken = { code: Code.UNAVAILABLE };

  async function subscribeGateway(scripts: Step[][]) {
    const requests: proto.SubscribeRequest[] = [];
    const fake = await fakeGateway([], {
      subscribe: (call) => {
        for (const step of scripts[requests.push(call.request) - 1] ?? []) {
          if (!("code" in step)) {
            call.write(step);
            continue;
          }
          const metadata = new grpc.Metadata();
          if (step.details !== undefined) metadata.set("grpc-status-details-bin", Buffer.from(step.details));
          call.emit("error", { code: step.code, details: "ended", metadata });
          return;
        }
      },
    });
    return { fake, requests };
  }

  test("a broken stream subscribes again under the member id `joined` gave; MEMBER_ACTIVE just after the break is retried; INVALID_ARGUMENT ends it", async () => {
    const memberActive = statusBytes(6, "MEMBER_ACTIVE", { member_id: "gen-1" });
    const invalid = statusBytes(3, "INVALID_FIELD", { field: "topics" });
    const { fake, requests } = await subscribeGateway([
      [joined("gen-1"), assigned(3n), broken],
      [{ code: Code.ALREADY_EXISTS, details: memberActive }],
      [joined("gen-1"), assigned(4n), records(4n), broken],
      [{ code: Code.INVALID_ARGUMENT, details: invalid }],
    ]);
    try {
      const attempts: [Code, string | undefined, number][] = [];
      const subscription = await fake.client.subscribe({
        group: "g",
        topics: ["t"],
        maxRecords: 1,
        sessionGraceMs: 5_000,
        onResubscribe: (cause, attempt) => attempts.push([cause.code, cause.reason, attempt]),
      });
      assert.equal(subscription.memberId, "gen-1");
      const first = (await subscription.next()).value;
      assert.ok(first?.type === "assigned" && first.offset === 3n);
      const again = (await subscription.next()).value;
      assert.ok(again?.type === "assigned" && again.offset === 4n);
      assert.equal(again.partition, first.partition, "the same Partition for the same lease");
      const batch = (await subscription.next()).value;
      assert.ok(batch?.type === "records" && batch.batch.records[0]!.offset === 4n);
      const end = await subscription.next().catch((e: unknown) => e);
      assert.ok(end instanceof KafkaLeaseError && end.code === Code.INVALID_ARGUMENT, `ended with ${end}`);
      assert.equal(subscription.resubscribes, 1);
      assert.deepEqual(attempts, [
        [Code.UNAVAILABLE, undefined, 1],
        [Code.ALREADY_EXISTS, "MEMBER_ACTIVE", 2],
        [Code.UNAVAILABLE, undefined, 1],
      ]);
      assert.equal(requests.length, 4);
      assert.equal(requests[0]!.memberId, "");
      for (const r of requests.slice(1)) assert.deepEqual(r, { ...requests[0]!, memberId: "gen-1" }, "the same settings");
      assert.deepEqual(await subscription.next(), { done: true, value: undefined });
    } finally {
      fake.client.close();
      fake.server.forceShutdown();
    }
  });

  test("without a session grace (or with resubscribe: false) a break ends the subscription", async () => {
    for (const options of [{}, { sessionGraceMs: 5_000, resubscribe: false }]) {
      const { fake, requests } = await subscribeGateway([[joined("m"), broken], [joined("m")]]);
      try {
        const subscription = await fake.client.subscribe({ group: "g", topics: ["t"], memberId: "m", ...options });
        const end = await subscription.next().catch((e: unknown) => e);
        assert.ok(end instanceof KafkaLeaseError && end.code === Code.UNAVAILABLE);
        assert.equal(requests.length, 1);
      } finally {
        fake.client.close();
        fake.server.forceShutdown();
      }
    }
  });
});
