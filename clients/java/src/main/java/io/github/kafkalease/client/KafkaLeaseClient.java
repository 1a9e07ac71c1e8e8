package io.github.kafkalease.client;

import io.github.kafkalease.v1.AcquireRequest;
import io.github.kafkalease.v1.LeaseInfo;
import io.github.kafkalease.v1.ListLeasesRequest;
import io.github.kafkalease.v1.ListLeasesResponse;
import io.github.kafkalease.v1.ListMembersRequest;
import io.github.kafkalease.v1.MemberInfo;
import io.github.kafkalease.v1.PartitionLeaseServiceGrpc;
import io.github.kafkalease.v1.PartitionLeaseServiceGrpc.PartitionLeaseServiceBlockingStub;
import io.github.kafkalease.v1.PartitionLeaseServiceGrpc.PartitionLeaseServiceStub;
import io.grpc.Channel;
import io.grpc.ChannelCredentials;
import io.grpc.Grpc;
import io.grpc.InsecureChannelCredentials;
import io.grpc.ManagedChannel;
import io.grpc.ManagedChannelBuilder;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.function.Supplier;

/**
 * A connection to a kafka-lease gateway: acquire leases, subscribe to groups, list members and
 * leases. Thread-safe; {@link #close} shuts the channel down if this client built it.
 */
public final class KafkaLeaseClient implements AutoCloseable {
  /**
   * The largest response accepted: 64 MiB (gRPC's default of 4 MiB is too small for the
   * largest Read batches, whose max_bytes does not count the framing).
   */
  public static final int MAX_INBOUND_MESSAGE_SIZE = 64 << 20;

  private final ManagedChannel owned;
  private final PartitionLeaseServiceBlockingStub blocking;
  private final PartitionLeaseServiceStub async;

  /** Uses {@code channel} (TLS, interceptors, ...); {@link #close} leaves it open. */
  public KafkaLeaseClient(Channel channel) {
    this(channel, null);
  }

  private KafkaLeaseClient(Channel channel, ManagedChannel owned) {
    this.owned = owned;
    this.blocking =
        PartitionLeaseServiceGrpc.newBlockingStub(channel)
            .withMaxInboundMessageSize(MAX_INBOUND_MESSAGE_SIZE);
    this.async =
        PartitionLeaseServiceGrpc.newStub(channel)
            .withMaxInboundMessageSize(MAX_INBOUND_MESSAGE_SIZE);
  }

  /** Connects to {@code target} ("host:port", or any gRPC target URI) in plaintext. */
  public static KafkaLeaseClient connect(String target) {
    return connect(target, InsecureChannelCredentials.create());
  }

  /** Connects to {@code target} with {@code credentials} (e.g. TlsChannelCredentials). */
  public static KafkaLeaseClient connect(String target, ChannelCredentials credentials) {
    return connect(Grpc.newChannelBuilder(target, credentials));
  }

  /** Builds the channel from {@code builder} (any channel options); {@link #close} shuts it. */
  public static KafkaLeaseClient connect(ManagedChannelBuilder<?> builder) {
    ManagedChannel channel = builder.maxInboundMessageSize(MAX_INBOUND_MESSAGE_SIZE).build();
    return new KafkaLeaseClient(channel, channel);
  }

  /** The generated blocking stub, for calls and options this client does not cover. */
  public PartitionLeaseServiceBlockingStub blocking() {
    return blocking;
  }

  /** The generated async stub. */
  public PartitionLeaseServiceStub async() {
    return async;
  }

  /**
   * Takes an exclusive lease on a partition. An UNAVAILABLE answer with the gateway's retry
   * advice (Kafka or Consul unreachable, the instance shutting down) is retried after its
   * delay, within the bounds of {@link AcquireOptions#retry}.
   *
   * @throws KafkaLeaseException INVALID_ARGUMENT (INVALID_FIELD), NOT_FOUND (TOPIC_NOT_FOUND,
   *     PARTITION_NOT_FOUND), RESOURCE_EXHAUSTED (PARTITION_BUSY: metadata names the holder),
   *     UNAVAILABLE once retries are spent
   */
  public Lease acquire(AcquireOptions options) {
    AcquireRequest request = options.request();
    long deadline = System.nanoTime() + options.retryDeadline().toNanos();
    for (int attempt = 1; ; attempt++) {
      try {
        return new Lease(this, blocking.acquire(request), request.getGroup());
      } catch (StatusRuntimeException e) {
        KafkaLeaseException error = KafkaLeaseException.from(e);
        Duration delay = error.retryDelay().orElse(null);
        if (error.code() != Status.Code.UNAVAILABLE
            || delay == null
            || attempt >= options.maxAttempts()
            || System.nanoTime() + delay.toNanos() > deadline) {
          throw error;
        }
        try {
          Thread.sleep(delay.toMillis());
        } catch (InterruptedException interrupted) {
          throw KafkaLeaseException.interrupted(interrupted);
        }
      }
    }
  }

  /**
   * Joins a group as a member; returns once the member has joined.
   *
   * @throws KafkaLeaseException INVALID_ARGUMENT, NOT_FOUND (TOPIC_NOT_FOUND), ALREADY_EXISTS
   *     (MEMBER_ACTIVE), UNAVAILABLE
   */
  public Subscription subscribe(SubscribeOptions options) {
    return Subscription.open(this, options);
  }

  /** The members subscribed to {@code group}, across every gateway instance. */
  public List<MemberInfo> listMembers(String group) {
    ListMembersRequest request = ListMembersRequest.newBuilder().setGroup(group).build();
    return call(() -> blocking.listMembers(request)).getMembersList();
  }

  /** The leases held in {@code group} (every group when null), every page of them. */
  public List<LeaseInfo> listLeases(String group) {
    List<LeaseInfo> all = new ArrayList<>();
    String token = "";
    do {
      ListLeasesRequest.Builder b = ListLeasesRequest.newBuilder().setPageToken(token);
      if (group != null) {
        b.setGroup(group);
      }
      ListLeasesResponse page = call(() -> blocking.listLeases(b.build()));
      all.addAll(page.getLeasesList());
      token = page.getNextPageToken();
    } while (!token.isEmpty());
    return all;
  }

  /** Shuts the channel down if this client built it, waiting up to 5 s for calls to end. */
  @Override
  public void close() {
    if (owned == null) {
      return;
    }
    owned.shutdown();
    try {
      if (!owned.awaitTermination(5, TimeUnit.SECONDS)) {
        owned.shutdownNow();
      }
    } catch (InterruptedException e) {
      owned.shutdownNow();
      Thread.currentThread().interrupt();
    }
  }

  /** Runs a unary call, turning its failure into a KafkaLeaseException. */
  static <T> T call(Supplier<T> call) {
    try {
      return call.get();
    } catch (StatusRuntimeException e) {
      throw KafkaLeaseException.from(e);
    }
  }
}
