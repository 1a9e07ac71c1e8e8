// The client's error type: a gRPC status from the gateway with the reason, metadata and retry
// advice of its details, or a transport failure (no details).
import { status as Code } from "@grpc/grpc-js";
import type { Metadata } from "@grpc/grpc-js";
import { ErrorReason } from "./gen/kafka_lease/v1/errors";
import { statusDetailsFromMetadata, type StatusDetails } from "./status";

export { Code };

/** The reason names of the proto's `ErrorReason` (what `ErrorInfo.reason` carries). */
export type ReasonName = Exclude<keyof typeof ErrorReason, "ERROR_REASON_UNSPECIFIED" | "UNRECOGNIZED">;

/** Reasons that say the lease has ended for good: only a new Acquire helps. */
const LEASE_ENDED: ReadonlySet<string> = new Set<ReasonName>([
  "LEASE_LOST",
  "LEASE_EXPIRED",
  "LEASE_RELEASED",
  "LEASE_ABANDONED",
]);

/**
 * A failed call. Branch on {@link KafkaLeaseError.reason} (from the status details), never on
 * the message text.
 */
export class KafkaLeaseError extends Error {
  override readonly name = "KafkaLeaseError";

  constructor(
    /** The gRPC status code (`Code.UNAVAILABLE`, ...). */
    readonly code: Code,
    /** The gateway's message (or the transport's), for people. */
    readonly grpcMessage: string,
    /** `ErrorInfo.reason` of domain "kafka-lease": an `ErrorReason` name, or undefined. */
    readonly reason: ReasonName | (string & {}) | undefined,
    /** `ErrorInfo.metadata` (`lease_ref`, `holder_member`, `low`, `high`, `field`, ...). */
    readonly metadata: Readonly<Record<string, string>>,
    /** `RetryInfo.retry_delay` in ms: present only where the same call may succeed later. */
    readonly retryAfterMs: number | undefined,
    options?: { cause?: unknown },
  ) {
    super(`${Code[code] ?? code}${reason ? ` (${reason})` : ""}: ${grpcMessage}`, options);
  }

  /** Builds the error of a failed call from its status (code, details text and trailers). */
  static fromStatus(status: { code: number; details?: string; metadata?: Metadata }, cause?: unknown) {
    const d: StatusDetails = statusDetailsFromMetadata(status.metadata);
    return new KafkaLeaseError(status.code, status.details ?? "", d.reason, d.metadata, d.retryAfterMs, {
      cause,
    });
  }

  /**
   * Whether the same call, sent again later, may succeed: UNAVAILABLE with the gateway's retry
   * advice, or without any reason (a transport failure).
   */
  get retryable(): boolean {
    return this.code === Code.UNAVAILABLE && (this.reason === undefined || this.retryAfterMs !== undefined);
  }

  /**
   * Whether the lease is gone for good (lost, expired, released, abandoned, or ended with its
   * gateway's shutdown): acquire a new one.
   */
  get leaseEnded(): boolean {
    if (this.reason === undefined) {
      // A gateway older than the details: the contract's wording.
      return this.code === Code.FAILED_PRECONDITION && /lease (lost|expired)/i.test(this.grpcMessage);
    }
    return (
      LEASE_ENDED.has(this.reason) ||
      (this.reason === "SHUTTING_DOWN" && this.metadata["lease_ref"] !== undefined)
    );
  }
}

/** Anything a call may throw, as a KafkaLeaseError (a non-gRPC error becomes UNKNOWN). */
export function toKafkaLeaseError(error: unknown): KafkaLeaseError {
  if (error instanceof KafkaLeaseError) return error;
  const e = error as { code?: unknown; details?: unknown; metadata?: Metadata; message?: unknown };
  if (typeof e?.code === "number") {
    return KafkaLeaseError.fromStatus(
      { code: e.code, details: typeof e.details === "string" ? e.details : String(e.message), metadata: e.metadata },
      error,
    );
  }
  return new KafkaLeaseError(Code.UNKNOWN, String(e?.message ?? error), undefined, {}, undefined, { cause: error });
}

/**
 * Whether a status that ended a stream (a Read, a Deliver, a Subscribe) says the stream broke,
 * not the lease or the subscription. With a reason, the gateway's retry advice decides; without
 * one (made up by the transport), the codes of a dropped connection do.
 */
export function streamBroke(e: KafkaLeaseError): boolean {
  if (e.reason !== undefined) return e.retryAfterMs !== undefined;
  return [Code.UNAVAILABLE, Code.UNKNOWN, Code.INTERNAL, Code.CANCELLED].includes(e.code);
}
