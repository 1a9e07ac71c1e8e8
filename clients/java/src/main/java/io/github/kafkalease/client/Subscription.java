package io.github.kafkalease.client;

import io.github.kafkalease.v1.SubscribeRequest;
import io.github.kafkalease.v1.SubscribeResponse;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.time.Duration;
import java.time.Instant;
import java.util.HashMap;
import java.util.Iterator;
import java.util.Map;
import java.util.NoSuchElementException;

/**
 * A member of a group, from {@link KafkaLeaseClient#subscribe}: a blocking iterator of its
 * {@link SubscriptionEvent}s. The member stays in the group while the stream is open; {@link
 * #close} cancels it, and the member leaves (its leases are released). Commit what you
 * processed before closing. One reading thread; {@link #close} may come from any thread.
 */
public final class Subscription implements Iterator<SubscriptionEvent>, AutoCloseable {
  private final KafkaLeaseClient client;
  private final StreamCall<SubscribeRequest, SubscribeResponse> call;
  private final String memberId;
  private final String gateway;
  private final Map<String, Partition> partitions = new HashMap<>();
  private SubscriptionEvent pending;
  private boolean done;

  private Subscription(
      KafkaLeaseClient client,
      StreamCall<SubscribeRequest, SubscribeResponse> call,
      String memberId,
      String gateway) {
    this.client = client;
    this.call = call;
    this.memberId = memberId;
    this.gateway = gateway;
  }

  static Subscription open(KafkaLeaseClient client, SubscribeOptions options) {
    StreamCall<SubscribeRequest, SubscribeResponse> call =
        StreamCall.start(client.async()::subscribe, options.request());
    Object first;
    try {
      first = call.take(options.joinTimeout());
    } catch (StatusRuntimeException e) {
      throw KafkaLeaseException.from(e);
    } catch (InterruptedException e) {
      call.cancel();
      throw KafkaLeaseException.interrupted(e);
    }
    if (first instanceof SubscribeResponse r && r.hasJoined()) {
      return new Subscription(client, call, r.getJoined().getMemberId(), r.getJoined().getGateway());
    }
    call.cancel();
    throw KafkaLeaseException.of(
        first == null ? Status.Code.DEADLINE_EXCEEDED : Status.Code.INTERNAL,
        first == null
            ? "no `joined` event within " + options.joinTimeout()
            : "the subscription's first event was not `joined`",
        null);
  }

  /** This member's id (the requested one, or the one the gateway made up). */
  public String memberId() {
    return memberId;
  }

  /** The gateway instance serving the subscription. */
  public String gateway() {
    return gateway;
  }

  /**
   * The next event, or null if none came within {@code timeout} (null: wait as long as it
   * takes) or the stream has ended (see {@link #isDone}).
   *
   * @throws KafkaLeaseException the status the gateway ended the stream with (the gateway
   *     shutting down, a transport failure: subscribe again)
   */
  public SubscriptionEvent poll(Duration timeout) {
    if (pending != null) {
      SubscriptionEvent e = pending;
      pending = null;
      return e;
    }
    long deadline = timeout == null ? 0 : System.nanoTime() + timeout.toNanos();
    while (!done) {
      Duration left =
          timeout == null ? null : Duration.ofNanos(Math.max(0, deadline - System.nanoTime()));
      Object item;
      try {
        item = call.take(left);
      } catch (StatusRuntimeException e) {
        done = true;
        throw KafkaLeaseException.from(e);
      } catch (InterruptedException e) {
        throw KafkaLeaseException.interrupted(e);
      }
      if (item == null) {
        return null;
      }
      if (item == StreamCall.END) {
        done = true;
        return null;
      }
      SubscriptionEvent event = convert((SubscribeResponse) item);
      if (event != null) {
        return event;
      }
    }
    return null;
  }

  /** Whether the stream has ended (cancelled, or ended by the gateway), without waiting. */
  public boolean isDone() {
    return done && pending == null;
  }

  @Override
  public boolean hasNext() {
    if (pending == null) {
      pending = poll(null);
    }
    return pending != null;
  }

  @Override
  public SubscriptionEvent next() {
    if (!hasNext()) {
      throw new NoSuchElementException("the subscription has ended");
    }
    SubscriptionEvent e = pending;
    pending = null;
    return e;
  }

  /** Ends the subscription: the member leaves the group and its leases are released. */
  @Override
  public void close() {
    call.cancel();
  }

  private Partition partition(String leaseId, String topic, int partition, long token) {
    return partitions.computeIfAbsent(
        leaseId, id -> new Partition(client, id, topic, partition, token));
  }

  private SubscriptionEvent convert(SubscribeResponse r) {
    switch (r.getEventCase()) {
      case ASSIGNED -> {
        var a = r.getAssigned();
        Partition p = partition(a.getLeaseId(), a.getTopic(), a.getPartition(), a.getFencingToken());
        return new SubscriptionEvent.Assigned(p, a.getOffset(), a.getHighWatermark());
      }
      case RECORDS -> {
        var b = r.getRecords();
        Partition p = partition(b.getLeaseId(), b.getTopic(), b.getPartition(), 0);
        if (!p.epochs.admit(b.getSeekEpoch()) || b.getRecordsCount() == 0) {
          return null; // made stale by a seek of this lease
        }
        return new SubscriptionEvent.Records(
            p, Batch.of(b.getRecordsList(), b.getHighWatermark(), b.getSeekEpoch()));
      }
      case REVOKING -> {
        var v = r.getRevoking();
        Instant deadline =
            v.hasDeadline() ? Protos.instant(v.getDeadline()) : Instant.now();
        return new SubscriptionEvent.Revoking(
            partition(v.getLeaseId(), v.getTopic(), v.getPartition(), 0), deadline);
      }
      case REVOKED -> {
        var v = r.getRevoked();
        Partition p = partition(v.getLeaseId(), v.getTopic(), v.getPartition(), 0);
        partitions.remove(v.getLeaseId());
        return new SubscriptionEvent.Revoked(p, v.getReason(), v.getMessage());
      }
      default -> {
        return null; // a later `joined`, or an event this version does not know
      }
    }
  }
}
