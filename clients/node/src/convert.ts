// Conversions between JavaScript values and the protobuf types of the stubs, and a promise
// wrapper for unary calls.
import type { CallOptions, ClientUnaryCall, Metadata, ServiceError } from "@grpc/grpc-js";
import { Metadata as GrpcMetadata } from "@grpc/grpc-js";
import { setTimeout as delay } from "node:timers/promises";
import type { Duration } from "./gen/google/protobuf/duration";
import type { Timestamp } from "./gen/google/protobuf/timestamp";
import { toKafkaLeaseError } from "./errors";

/** An offset: a bigint, or a number that is a safe integer (never rounded silently). */
export type OffsetLike = bigint | number;

/** Per-call gRPC options (`deadline`, ...). */
export type CallOpts = Partial<CallOptions>;

export function toOffset(offset: OffsetLike): bigint {
  if (typeof offset === "bigint") return offset;
  if (!Number.isSafeInteger(offset)) throw new RangeError(`offset ${offset} is not a safe integer: pass a bigint`);
  return BigInt(offset);
}

export function msToDuration(ms: number): Duration {
  const seconds = Math.floor(ms / 1000);
  return { seconds: BigInt(seconds), nanos: Math.round((ms - seconds * 1000) * 1e6) };
}

export function durationToMs(d: Duration | undefined): number | undefined {
  return d === undefined ? undefined : Number(d.seconds) * 1000 + d.nanos / 1e6;
}

export function dateToTimestamp(date: Date): Timestamp {
  const ms = date.getTime();
  const seconds = Math.floor(ms / 1000);
  return { seconds: BigInt(seconds), nanos: (ms - seconds * 1000) * 1e6 };
}

/** A Date (millisecond precision, as Kafka's timestamps), or null when unset. */
export function timestampToDate(t: Timestamp | undefined): Date | null {
  return t === undefined ? null : new Date(Number(t.seconds) * 1000 + Math.floor(t.nanos / 1e6));
}

type UnaryMethod<Req, Res> = (
  request: Req,
  metadata: Metadata,
  options: CallOpts,
  callback: (error: ServiceError | null, response: Res) => void,
) => ClientUnaryCall;

/** Calls a unary method of the generated client; rejects with a KafkaLeaseError. */
export function unary<Req, Res>(method: UnaryMethod<Req, Res>, request: Req, options: CallOpts = {}): Promise<Res> {
  return new Promise((resolve, reject) => {
    method(request, new GrpcMetadata(), options, (error, response) =>
      error ? reject(toKafkaLeaseError(error)) : resolve(response),
    );
  });
}

/** Sleeps `ms`; resolves false (early) when `signal` aborts. */
export async function sleep(ms: number, signal?: AbortSignal): Promise<boolean> {
  try {
    await delay(ms, undefined, { signal });
    return true;
  } catch {
    return false;
  }
}
