package io.github.kafkalease.client;

import io.github.kafkalease.v1.KafkaRecord;
import java.util.List;

/**
 * Consecutive records of one partition, in offset order: one Read response (or one
 * Subscribe {@code records} event).
 *
 * @param records the records, never empty when they come from the gateway
 * @param highWatermark the partition's high watermark as last seen by the gateway
 * @param seekEpoch the lease's seek epoch the records belong to
 * @param after the gateway's {@code ReadResponse.next_offset} (0 when it has none)
 */
public record Batch(List<ConsumedRecord> records, long highWatermark, long seekEpoch, long after) {

  /** A batch without the gateway's next offset: {@link #nextOffset} is the last record's + 1. */
  public Batch(List<ConsumedRecord> records, long highWatermark, long seekEpoch) {
    this(records, highWatermark, seekEpoch, 0);
  }

  static Batch of(List<KafkaRecord> records, long highWatermark, long seekEpoch, long after) {
    return new Batch(
        records.stream().map(ConsumedRecord::fromProto).toList(),
        highWatermark,
        seekEpoch,
        after);
  }

  /**
   * The offset to commit once this batch is processed: the last record's offset + 1, or
   * further when the offsets after it hold no record (a transaction's marker).
   */
  public long nextOffset() {
    if (records.isEmpty()) {
      throw new IllegalStateException("empty batch");
    }
    return Math.max(records.get(records.size() - 1).offset() + 1, after);
  }
}
