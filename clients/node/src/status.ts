// The machine-readable part of a gateway error: the `google.rpc.Status` in the binary
// `grpc-status-details-bin` trailer, with its `google.rpc.ErrorInfo` and `google.rpc.RetryInfo`
// details.
//
// No maintained npm package decodes these without pulling in a second protobuf runtime
// (google-gax, protobufjs), so this is a small hand-written decoder over the wire reader the
// generated stubs already use (@bufbuild/protobuf/wire). Only the fields needed are read:
//   Status    { int32 code = 1; string message = 2; repeated Any details = 3; }
//   Any       { string type_url = 1; bytes value = 2; }
//   ErrorInfo { string reason = 1; string domain = 2; map<string, string> metadata = 3; }
//   RetryInfo { google.protobuf.Duration retry_delay = 1; }
import { BinaryReader, WireType } from "@bufbuild/protobuf/wire";
import type { Metadata } from "@grpc/grpc-js";
import { Duration } from "./gen/google/protobuf/duration";

/** The `ErrorInfo.domain` of the gateway's errors; ErrorInfo of any other domain is ignored. */
export const ERROR_DOMAIN = "kafka-lease";

const STATUS_DETAILS_KEY = "grpc-status-details-bin";
const ERROR_INFO_TYPE = "type.googleapis.com/google.rpc.ErrorInfo";
const RETRY_INFO_TYPE = "type.googleapis.com/google.rpc.RetryInfo";

/** What the gateway said about an error beyond its code and message. */
export interface StatusDetails {
  /** `ErrorInfo.reason` (an `ErrorReason` name) when the ErrorInfo is of {@link ERROR_DOMAIN}. */
  reason?: string;
  /** `ErrorInfo.metadata`: numbers in decimal, times in RFC 3339. Empty without an ErrorInfo. */
  metadata: Record<string, string>;
  /** `RetryInfo.retry_delay` in milliseconds; absent where the gateway says a retry cannot help. */
  retryAfterMs?: number;
}

/** Reads fields of one message: `on(fieldNo, wireType)` returns false to skip the field. */
function fields(bytes: Uint8Array, on: (r: BinaryReader, field: number, wire: WireType) => boolean) {
  const reader = new BinaryReader(bytes);
  while (reader.pos < reader.len) {
    const [field, wire] = reader.tag();
    if (!on(reader, field, wire)) reader.skip(wire, field);
  }
}

/** Decodes a serialized google.rpc.Status into the gateway's details. Throws on malformed input. */
export function decodeStatusDetails(bytes: Uint8Array): StatusDetails {
  const details: StatusDetails = { metadata: {} };
  fields(bytes, (r, field, wire) => {
    if (field !== 3 || wire !== WireType.LengthDelimited) return false;
    let typeUrl = "";
    let value: Uint8Array = new Uint8Array();
    fields(r.bytes(), (any, f, w) => {
      if (w !== WireType.LengthDelimited) return false;
      if (f === 1) typeUrl = any.string();
      else if (f === 2) value = any.bytes();
      else return false;
      return true;
    });
    if (typeUrl === ERROR_INFO_TYPE) decodeErrorInfo(value, details);
    else if (typeUrl === RETRY_INFO_TYPE) decodeRetryInfo(value, details);
    return true;
  });
  return details;
}

function decodeErrorInfo(bytes: Uint8Array, into: StatusDetails) {
  let reason = "";
  let domain = "";
  const metadata: Record<string, string> = {};
  fields(bytes, (r, field, wire) => {
    if (wire !== WireType.LengthDelimited) return false;
    if (field === 1) reason = r.string();
    else if (field === 2) domain = r.string();
    else if (field === 3) {
      let key = "";
      let value = "";
      fields(r.bytes(), (e, f, w) => {
        if (w !== WireType.LengthDelimited || (f !== 1 && f !== 2)) return false;
        if (f === 1) key = e.string();
        else value = e.string();
        return true;
      });
      metadata[key] = value;
    } else return false;
    return true;
  });
  if (domain === ERROR_DOMAIN && reason !== "") {
    into.reason = reason;
    into.metadata = metadata;
  }
}

function decodeRetryInfo(bytes: Uint8Array, into: StatusDetails) {
  fields(bytes, (r, field, wire) => {
    if (field !== 1 || wire !== WireType.LengthDelimited) return false;
    const delay = Duration.decode(r.bytes());
    into.retryAfterMs = Number(delay.seconds) * 1000 + delay.nanos / 1e6;
    return true;
  });
}

/**
 * The details in a call's trailers. Absent or undecodable details count as none: the code and
 * message still say what happened.
 */
export function statusDetailsFromMetadata(metadata: Metadata | undefined): StatusDetails {
  const raw = metadata?.get(STATUS_DETAILS_KEY)[0];
  if (raw === undefined || typeof raw === "string") return { metadata: {} };
  try {
    return decodeStatusDetails(raw);
  } catch {
    return { metadata: {} };
  }
}
