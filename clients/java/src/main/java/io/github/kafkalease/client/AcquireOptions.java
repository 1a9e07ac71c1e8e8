package io.github.kafkalease.client;

import io.github.kafkalease.v1.AcquireRequest;
import io.github.kafkalease.v1.OffsetReset;
import java.time.Duration;

/**
 * What to acquire: {@code AcquireOptions.of(group, topic)} plus optional settings; anything
 * left unset takes the gateway's default. Also how hard {@link KafkaLeaseClient#acquire}
 * retries an UNAVAILABLE answer that carries RetryInfo.
 */
public final class AcquireOptions {
  private final AcquireRequest.Builder request = AcquireRequest.newBuilder();
  private int maxAttempts = 5;
  private Duration retryDeadline = Duration.ofSeconds(30);

  private AcquireOptions(String group, String topic) {
    request.setGroup(group).setTopic(topic);
  }

  /** A lease on any free partition of {@code topic} for consumer group {@code group}. */
  public static AcquireOptions of(String group, String topic) {
    return new AcquireOptions(group, topic);
  }

  /** This partition instead of one the gateway picks. */
  public AcquireOptions partition(int partition) {
    request.setPartition(partition);
    return this;
  }

  /** A label for this client (at most 256 UTF-8 bytes), shown to others. */
  public AcquireOptions member(String member) {
    request.setMember(member);
    return this;
  }

  /** How long the lease survives with no open Read and no call (default 10 s; 1 s..5 min). */
  public AcquireOptions ttl(Duration ttl) {
    request.setTtl(Protos.duration(ttl));
    return this;
  }

  /** How long to wait for the partition to become free (default 0; at most 5 min). */
  public AcquireOptions waitFor(Duration wait) {
    request.setWait(Protos.duration(wait));
    return this;
  }

  /** Where to start when the group has no committed offset (default earliest). */
  public AcquireOptions offsetReset(OffsetReset reset) {
    request.setOffsetReset(reset);
    return this;
  }

  /**
   * At most this many tries (default 5) within {@code deadline} (default 30 s) while the
   * gateway answers UNAVAILABLE with retry advice; 1 turns retrying off.
   */
  public AcquireOptions retry(int maxAttempts, Duration deadline) {
    this.maxAttempts = Math.max(1, maxAttempts);
    this.retryDeadline = deadline;
    return this;
  }

  AcquireRequest request() {
    return request.build();
  }

  int maxAttempts() {
    return maxAttempts;
  }

  Duration retryDeadline() {
    return retryDeadline;
  }
}
