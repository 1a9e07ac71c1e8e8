// Records as the wrapper hands them out: the stubs' KafkaRecord with presence as null and
// timestamps as Dates, and a Read's (or a subscription's) batch of them.
import { type KafkaRecord, TimestampType } from "./gen/kafka_lease/v1/partition_lease";
import { timestampToDate } from "./convert";

/** One Kafka record. `null` is absent (null key, tombstone, null header value), never `""`. */
export interface KafkaLeaseRecord {
  offset: bigint;
  key: Buffer | null;
  value: Buffer | null;
  /** In the producer's order, duplicates kept. */
  headers: { key: string; value: Buffer | null }[];
  /** Millisecond precision; null when the record has none. */
  timestamp: Date | null;
  timestampType: TimestampType;
}

/** One ReadResponse (or `records` event): consecutive records of one partition. */
export interface Batch {
  records: KafkaLeaseRecord[];
  highWatermark: bigint;
  seekEpoch: bigint;
  /**
   * The offset to commit once the batch is processed: last offset + 1, or further when the
   * offsets after it hold no record (a transaction's marker); undefined if empty.
   */
  nextOffset: bigint | undefined;
}

export function toRecord(r: KafkaRecord): KafkaLeaseRecord {
  return {
    offset: r.offset,
    key: r.key ?? null,
    value: r.value ?? null,
    headers: r.headers.map((h) => ({ key: h.key, value: h.value ?? null })),
    timestamp: timestampToDate(r.timestamp),
    timestampType: r.timestampType,
  };
}

export function toBatch(r: {
  records: KafkaRecord[];
  highWatermark: bigint;
  seekEpoch: bigint;
  nextOffset?: bigint;
}): Batch {
  const records = r.records.map(toRecord);
  const last = records[records.length - 1];
  const after = r.nextOffset ?? 0n;
  let nextOffset: bigint | undefined;
  if (last !== undefined) {
    nextOffset = last.offset + 1n > after ? last.offset + 1n : after;
  }
  return {
    records,
    highWatermark: r.highWatermark,
    seekEpoch: r.seekEpoch,
    nextOffset,
  };
}
