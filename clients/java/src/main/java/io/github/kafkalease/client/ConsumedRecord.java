package io.github.kafkalease.client;

import io.github.kafkalease.v1.KafkaRecord;
import io.github.kafkalease.v1.TimestampType;
import java.time.Instant;
import java.util.List;

/**
 * One Kafka record as the broker stored it. Absent and empty stay distinct: a null {@code key}
 * is a null key, an empty array an empty one; a null {@code value} is a tombstone. The arrays
 * are the caller's to keep (records compare by identity of their arrays, as Java records do).
 *
 * @param offset the record's offset in its partition
 * @param key the key, null when absent
 * @param value the value, null for a tombstone
 * @param headers in the order the producer wrote them, duplicates kept
 * @param timestamp the record's timestamp, null when it has none
 * @param timestampType whether the producer or the broker set the timestamp
 */
public record ConsumedRecord(
    long offset,
    byte[] key,
    byte[] value,
    List<Header> headers,
    Instant timestamp,
    TimestampType timestampType) {

  /**
   * A record header.
   *
   * @param key the header's key
   * @param value null when the header's value is null, distinct from an empty one
   */
  public record Header(String key, byte[] value) {}

  /** The record's timestamp in milliseconds since the epoch, or -1 when it has none. */
  public long timestampMillis() {
    return timestamp == null ? -1 : timestamp.toEpochMilli();
  }

  /** Converts the generated message, keeping absent fields apart from empty ones. */
  public static ConsumedRecord fromProto(KafkaRecord r) {
    List<Header> headers =
        r.getHeadersList().stream()
            .map(h -> new Header(h.getKey(), h.hasValue() ? h.getValue().toByteArray() : null))
            .toList();
    Instant timestamp =
        r.hasTimestamp()
            ? Instant.ofEpochSecond(r.getTimestamp().getSeconds(), r.getTimestamp().getNanos())
            : null;
    return new ConsumedRecord(
        r.getOffset(),
        r.hasKey() ? r.getKey().toByteArray() : null,
        r.hasValue() ? r.getValue().toByteArray() : null,
        headers,
        timestamp,
        r.getTimestampType());
  }
}
