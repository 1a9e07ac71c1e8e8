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
 */
public record Batch(List<ConsumedRecord> records, long highWatermark, long seekEpoch) {

  static Batch of(List<KafkaRecord> records, long highWatermark, long seekEpoch) {
    return new Batch(
        records.stream().map(ConsumedRecord::fromProto).toList(), highWatermark, seekEpoch);
  }

  /** The offset to commit once this batch is processed: the last record's offset + 1. */
  public long nextOffset() {
    if (records.isEmpty()) {
      throw new IllegalStateException("empty batch");
    }
    return records.get(records.size() - 1).offset() + 1;
  }
}
