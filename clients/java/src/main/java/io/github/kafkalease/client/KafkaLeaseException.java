package io.github.kafkalease.client;

import com.google.protobuf.Any;
import com.google.protobuf.InvalidProtocolBufferException;
import com.google.rpc.ErrorInfo;
import com.google.rpc.RetryInfo;
import io.github.kafkalease.v1.ErrorReason;
import io.grpc.Status;
import io.grpc.protobuf.StatusProto;
import java.time.Duration;
import java.util.Locale;
import java.util.Map;
import java.util.Optional;
import java.util.Set;

/**
 * A call the gateway (or the transport) refused: the gRPC code, and from the status details
 * (the {@code grpc-status-details-bin} trailer) the {@code google.rpc.ErrorInfo} reason of
 * domain {@value #ERROR_DOMAIN} with its metadata, and the {@code google.rpc.RetryInfo} delay.
 * Branch on {@link #reason()}, never on the message text.
 */
public class KafkaLeaseException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  /** The ErrorInfo domain of the gateway's errors; ErrorInfo of other domains is ignored. */
  public static final String ERROR_DOMAIN = "kafka-lease";

  private static final Set<String> LEASE_ENDED =
      Set.of("LEASE_LOST", "LEASE_EXPIRED", "LEASE_RELEASED", "LEASE_ABANDONED");

  private final Status.Code code;
  private final String reason;
  private final Map<String, String> metadata;
  private final Duration retryDelay;
  private final String gatewayMessage;

  KafkaLeaseException(
      Status.Code code,
      String message,
      String reason,
      Map<String, String> metadata,
      Duration retryDelay,
      Throwable cause) {
    super(code + (reason == null ? "" : " " + reason) + ": " + message, cause);
    this.code = code;
    this.gatewayMessage = message;
    this.reason = reason;
    this.metadata = Map.copyOf(metadata);
    this.retryDelay = retryDelay;
  }

  /** An error the client itself raises (no gateway status behind it). */
  static KafkaLeaseException of(Status.Code code, String message, Throwable cause) {
    return new KafkaLeaseException(code, message, null, Map.of(), null, cause);
  }

  /** The calling thread was interrupted while waiting: its flag is set again. */
  static KafkaLeaseException interrupted(InterruptedException e) {
    Thread.currentThread().interrupt();
    return of(Status.Code.CANCELLED, "interrupted", e);
  }

  /** Reads code, reason, metadata and retry delay from a failed gRPC call's exception. */
  public static KafkaLeaseException from(Throwable error) {
    if (error instanceof KafkaLeaseException e) {
      return e;
    }
    Status status = Status.fromThrowable(error);
    String reason = null;
    Map<String, String> metadata = Map.of();
    Duration retryDelay = null;
    com.google.rpc.Status details = StatusProto.fromThrowable(error);
    if (details != null) {
      for (Any any : details.getDetailsList()) {
        try {
          if (any.is(ErrorInfo.class)) {
            ErrorInfo info = any.unpack(ErrorInfo.class);
            if (ERROR_DOMAIN.equals(info.getDomain())) {
              reason = info.getReason();
              metadata = info.getMetadataMap();
            }
          } else if (any.is(RetryInfo.class)) {
            com.google.protobuf.Duration d = any.unpack(RetryInfo.class).getRetryDelay();
            retryDelay = Duration.ofSeconds(d.getSeconds(), d.getNanos());
          }
        } catch (InvalidProtocolBufferException ignored) {
          // A malformed detail is skipped; the code still says what happened.
        }
      }
    }
    String message = status.getDescription() == null ? "" : status.getDescription();
    return new KafkaLeaseException(
        status.getCode(), message, reason, metadata, retryDelay, error);
  }

  /** The gRPC status code. */
  public Status.Code code() {
    return code;
  }

  /** The ErrorInfo reason, e.g. "PARTITION_BUSY"; null when the status carried none. */
  public String reason() {
    return reason;
  }

  /**
   * The reason as the generated enum: UNRECOGNIZED for a name this version does not know,
   * ERROR_REASON_UNSPECIFIED when there is no reason.
   */
  public ErrorReason errorReason() {
    if (reason == null) {
      return ErrorReason.ERROR_REASON_UNSPECIFIED;
    }
    try {
      return ErrorReason.valueOf(reason);
    } catch (IllegalArgumentException unknown) {
      return ErrorReason.UNRECOGNIZED;
    }
  }

  /** The ErrorInfo metadata (strings: numbers in decimal, times in RFC 3339); may be empty. */
  public Map<String, String> metadata() {
    return metadata;
  }

  /** One metadata value, or null. */
  public String metadata(String key) {
    return metadata.get(key);
  }

  /** The gateway's advice from RetryInfo: the same call may succeed after this delay. */
  public Optional<Duration> retryDelay() {
    return Optional.ofNullable(retryDelay);
  }

  /** The status message, for people. */
  public String gatewayMessage() {
    return gatewayMessage;
  }

  /**
   * Whether sending the same call again can succeed: UNAVAILABLE with RetryInfo, or without
   * any reason (a transport failure).
   */
  public boolean isRetryable() {
    return code == Status.Code.UNAVAILABLE && (reason == null || retryDelay != null);
  }

  /** Whether the lease is gone for good (lost, expired, released, or ended with its gateway). */
  public boolean isLeaseEnded() {
    if (reason == null) {
      String m = gatewayMessage.toLowerCase(Locale.ROOT);
      return code == Status.Code.FAILED_PRECONDITION
          && (m.contains("lease lost") || m.contains("lease expired"));
    }
    return LEASE_ENDED.contains(reason)
        || ("SHUTTING_DOWN".equals(reason) && metadata.containsKey("lease_ref"));
  }

  /**
   * Whether the call does not fit the lease's mode (FAILED_PRECONDITION, WRONG_MODE): Read,
   * Seek or Commit on a lease in queue mode (a Deliver opened it), or Acknowledge on one that
   * no Deliver opened. Metadata {@code mode} says the lease's mode ("queue" or "read").
   */
  public boolean isWrongMode() {
    return "WRONG_MODE".equals(reason);
  }

  /**
   * Whether a Read stream that ended with this status broke (and reopening it can succeed),
   * rather than the lease ending: with a reason, the gateway's RetryInfo decides; without one,
   * the transport made the status up (connection dropped or reset).
   */
  boolean streamBroke() {
    if (reason != null) {
      return retryDelay != null;
    }
    return switch (code) {
      case UNAVAILABLE, UNKNOWN, INTERNAL, CANCELLED -> true;
      default -> false;
    };
  }
}
