package io.github.kafkalease.client;

import com.google.protobuf.Empty;
import io.github.kafkalease.v1.SeekRequest;
import java.time.Instant;
import java.util.function.UnaryOperator;

/** Where a seek goes: {@code SeekTo.offset(42)}, {@code SeekTo.earliest()}, ... */
public final class SeekTo {
  private final UnaryOperator<SeekRequest.Builder> position;

  private SeekTo(UnaryOperator<SeekRequest.Builder> position) {
    this.position = position;
  }

  /** An absolute offset, between the log start offset and the high watermark inclusive. */
  public static SeekTo offset(long offset) {
    return new SeekTo(b -> b.setOffset(offset));
  }

  /** The first record whose timestamp is at or after {@code time} (else the high watermark). */
  public static SeekTo timestamp(Instant time) {
    return new SeekTo(b -> b.setTimestamp(Protos.timestamp(time)));
  }

  /** The log start offset. */
  public static SeekTo earliest() {
    return new SeekTo(b -> b.setEarliest(Empty.getDefaultInstance()));
  }

  /** The high watermark: only records produced from now on. */
  public static SeekTo latest() {
    return new SeekTo(b -> b.setLatest(Empty.getDefaultInstance()));
  }

  /** The group's committed offset (else the lease's offset-reset position). */
  public static SeekTo committed() {
    return new SeekTo(b -> b.setCommitted(Empty.getDefaultInstance()));
  }

  SeekRequest request(String leaseId) {
    return position.apply(SeekRequest.newBuilder().setLeaseId(leaseId)).build();
  }

  /**
   * What a seek resolved to.
   *
   * @param offset the first record of the new epoch is at or after it
   * @param seekEpoch the lease's new seek epoch (an unsigned 64-bit number)
   */
  public record Result(long offset, long seekEpoch) {}
}
