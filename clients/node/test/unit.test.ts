// Without a gateway: the generated code's presence and int64 handling, the status-details
// decoder, the epoch filter, and Acquire's retry and a Read's reopen against an in-process
// fake gateway.
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { inspect } from "node:util";
import { BinaryWriter } from "@bufbuild/protobuf/wire";
import * as grpc from "@grpc/grpc-js";
import { Client, Code, EpochFilter, KafkaLeaseError, decodeStatusDetails, proto } from "../src";
import { seekPosition } from "../src/lease";

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

describe("acquire retry and read reopen (fake gateway)", () => {
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
      ...handlers,
    } as unknown as proto.PartitionLeaseServiceServer);
    const port = await new Promise<number>((resolve, reject) =>
      server.bindAsync("127.0.0.1:0", grpc.ServerCredentials.createInsecure(), (e, p) => (e ? reject(e) : resolve(p))),
    );
    return { client: Client.connect(`127.0.0.1:${port}`), server, calls: () => calls };
  }

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
