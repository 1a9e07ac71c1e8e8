package io.github.kafkalease.v1;

import static io.grpc.MethodDescriptor.generateFullMethodName;

/**
 * <pre>
 * Leases Kafka partitions to the clients of a consumer group.
 * </pre>
 */
@io.grpc.stub.annotations.GrpcGenerated
public final class PartitionLeaseServiceGrpc {

  private PartitionLeaseServiceGrpc() {}

  public static final java.lang.String SERVICE_NAME = "kafka_lease.v1.PartitionLeaseService";

  // Static method descriptors that strictly reflect the proto.
  private static volatile io.grpc.MethodDescriptor<io.github.kafkalease.v1.AcquireRequest,
      io.github.kafkalease.v1.AcquireResponse> getAcquireMethod;

  @io.grpc.stub.annotations.RpcMethod(
      fullMethodName = SERVICE_NAME + '/' + "Acquire",
      requestType = io.github.kafkalease.v1.AcquireRequest.class,
      responseType = io.github.kafkalease.v1.AcquireResponse.class,
      methodType = io.grpc.MethodDescriptor.MethodType.UNARY)
  public static io.grpc.MethodDescriptor<io.github.kafkalease.v1.AcquireRequest,
      io.github.kafkalease.v1.AcquireResponse> getAcquireMethod() {
    io.grpc.MethodDescriptor<io.github.kafkalease.v1.AcquireRequest, io.github.kafkalease.v1.AcquireResponse> getAcquireMethod;
    if ((getAcquireMethod = PartitionLeaseServiceGrpc.getAcquireMethod) == null) {
      synchronized (PartitionLeaseServiceGrpc.class) {
        if ((getAcquireMethod = PartitionLeaseServiceGrpc.getAcquireMethod) == null) {
          PartitionLeaseServiceGrpc.getAcquireMethod = getAcquireMethod =
              io.grpc.MethodDescriptor.<io.github.kafkalease.v1.AcquireRequest, io.github.kafkalease.v1.AcquireResponse>newBuilder()
              .setType(io.grpc.MethodDescriptor.MethodType.UNARY)
              .setFullMethodName(generateFullMethodName(SERVICE_NAME, "Acquire"))
              .setSampledToLocalTracing(true)
              .setRequestMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(
                  io.github.kafkalease.v1.AcquireRequest.getDefaultInstance()))
              .setResponseMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(
                  io.github.kafkalease.v1.AcquireResponse.getDefaultInstance()))
              .setSchemaDescriptor(new PartitionLeaseServiceMethodDescriptorSupplier("Acquire"))
              .build();
        }
      }
    }
    return getAcquireMethod;
  }

  private static volatile io.grpc.MethodDescriptor<io.github.kafkalease.v1.ReadRequest,
      io.github.kafkalease.v1.ReadResponse> getReadMethod;

  @io.grpc.stub.annotations.RpcMethod(
      fullMethodName = SERVICE_NAME + '/' + "Read",
      requestType = io.github.kafkalease.v1.ReadRequest.class,
      responseType = io.github.kafkalease.v1.ReadResponse.class,
      methodType = io.grpc.MethodDescriptor.MethodType.SERVER_STREAMING)
  public static io.grpc.MethodDescriptor<io.github.kafkalease.v1.ReadRequest,
      io.github.kafkalease.v1.ReadResponse> getReadMethod() {
    io.grpc.MethodDescriptor<io.github.kafkalease.v1.ReadRequest, io.github.kafkalease.v1.ReadResponse> getReadMethod;
    if ((getReadMethod = PartitionLeaseServiceGrpc.getReadMethod) == null) {
      synchronized (PartitionLeaseServiceGrpc.class) {
        if ((getReadMethod = PartitionLeaseServiceGrpc.getReadMethod) == null) {
          PartitionLeaseServiceGrpc.getReadMethod = getReadMethod =
              io.grpc.MethodDescriptor.<io.github.kafkalease.v1.ReadRequest, io.github.kafkalease.v1.ReadResponse>newBuilder()
              .setType(io.grpc.MethodDescriptor.MethodType.SERVER_STREAMING)
              .setFullMethodName(generateFullMethodName(SERVICE_NAME, "Read"))
              .setSampledToLocalTracing(true)
              .setRequestMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(
                  io.github.kafkalease.v1.ReadRequest.getDefaultInstance()))
              .setResponseMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(
                  io.github.kafkalease.v1.ReadResponse.getDefaultInstance()))
              .setSchemaDescriptor(new PartitionLeaseServiceMethodDescriptorSupplier("Read"))
              .build();
        }
      }
    }
    return getReadMethod;
  }

  private static volatile io.grpc.MethodDescriptor<io.github.kafkalease.v1.SeekRequest,
      io.github.kafkalease.v1.SeekResponse> getSeekMethod;

  @io.grpc.stub.annotations.RpcMethod(
      fullMethodName = SERVICE_NAME + '/' + "Seek",
      requestType = io.github.kafkalease.v1.SeekRequest.class,
      responseType = io.github.kafkalease.v1.SeekResponse.class,
      methodType = io.grpc.MethodDescriptor.MethodType.UNARY)
  public static io.grpc.MethodDescriptor<io.github.kafkalease.v1.SeekRequest,
      io.github.kafkalease.v1.SeekResponse> getSeekMethod() {
    io.grpc.MethodDescriptor<io.github.kafkalease.v1.SeekRequest, io.github.kafkalease.v1.SeekResponse> getSeekMethod;
    if ((getSeekMethod = PartitionLeaseServiceGrpc.getSeekMethod) == null) {
      synchronized (PartitionLeaseServiceGrpc.class) {
        if ((getSeekMethod = PartitionLeaseServiceGrpc.getSeekMethod) == null) {
          PartitionLeaseServiceGrpc.getSeekMethod = getSeekMethod =
              io.grpc.MethodDescriptor.<io.github.kafkalease.v1.SeekRequest, io.github.kafkalease.v1.SeekResponse>newBuilder()
              .setType(io.grpc.MethodDescriptor.MethodType.UNARY)
              .setFullMethodName(generateFullMethodName(SERVICE_NAME, "Seek"))
              .setSampledToLocalTracing(true)
              .setRequestMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(
                  io.github.kafkalease.v1.SeekRequest.getDefaultInstance()))
              .setResponseMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(
                  io.github.kafkalease.v1.SeekResponse.getDefaultInstance()))
              .setSchemaDescriptor(new PartitionLeaseServiceMethodDescriptorSupplier("Seek"))
              .build();
        }
      }
    }
    return getSeekMethod;
  }

  private static volatile io.grpc.MethodDescriptor<io.github.kafkalease.v1.CommitRequest,
      io.github.kafkalease.v1.CommitResponse> getCommitMethod;

  @io.grpc.stub.annotations.RpcMethod(
      fullMethodName = SERVICE_NAME + '/' + "Commit",
      requestType = io.github.kafkalease.v1.CommitRequest.class,
      responseType = io.github.kafkalease.v1.CommitResponse.class,
      methodType = io.grpc.MethodDescriptor.MethodType.UNARY)
  public static io.grpc.MethodDescriptor<io.github.kafkalease.v1.CommitRequest,
      io.github.kafkalease.v1.CommitResponse> getCommitMethod() {
    io.grpc.MethodDescriptor<io.github.kafkalease.v1.CommitRequest, io.github.kafkalease.v1.CommitResponse> getCommitMethod;
    if ((getCommitMethod = PartitionLeaseServiceGrpc.getCommitMethod) == null) {
      synchronized (PartitionLeaseServiceGrpc.class) {
        if ((getCommitMethod = PartitionLeaseServiceGrpc.getCommitMethod) == null) {
          PartitionLeaseServiceGrpc.getCommitMethod = getCommitMethod =
              io.grpc.MethodDescriptor.<io.github.kafkalease.v1.CommitRequest, io.github.kafkalease.v1.CommitResponse>newBuilder()
              .setType(io.grpc.MethodDescriptor.MethodType.UNARY)
              .setFullMethodName(generateFullMethodName(SERVICE_NAME, "Commit"))
              .setSampledToLocalTracing(true)
              .setRequestMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(
                  io.github.kafkalease.v1.CommitRequest.getDefaultInstance()))
              .setResponseMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(
                  io.github.kafkalease.v1.CommitResponse.getDefaultInstance()))
              .setSchemaDescriptor(new PartitionLeaseServiceMethodDescriptorSupplier("Commit"))
              .build();
        }
      }
    }
    return getCommitMethod;
  }

  private static volatile io.grpc.MethodDescriptor<io.github.kafkalease.v1.ReleaseRequest,
      io.github.kafkalease.v1.ReleaseResponse> getReleaseMethod;

  @io.grpc.stub.annotations.RpcMethod(
      fullMethodName = SERVICE_NAME + '/' + "Release",
      requestType = io.github.kafkalease.v1.ReleaseRequest.class,
      responseType = io.github.kafkalease.v1.ReleaseResponse.class,
      methodType = io.grpc.MethodDescriptor.MethodType.UNARY)
  public static io.grpc.MethodDescriptor<io.github.kafkalease.v1.ReleaseRequest,
      io.github.kafkalease.v1.ReleaseResponse> getReleaseMethod() {
    io.grpc.MethodDescriptor<io.github.kafkalease.v1.ReleaseRequest, io.github.kafkalease.v1.ReleaseResponse> getReleaseMethod;
    if ((getReleaseMethod = PartitionLeaseServiceGrpc.getReleaseMethod) == null) {
      synchronized (PartitionLeaseServiceGrpc.class) {
        if ((getReleaseMethod = PartitionLeaseServiceGrpc.getReleaseMethod) == null) {
          PartitionLeaseServiceGrpc.getReleaseMethod = getReleaseMethod =
              io.grpc.MethodDescriptor.<io.github.kafkalease.v1.ReleaseRequest, io.github.kafkalease.v1.ReleaseResponse>newBuilder()
              .setType(io.grpc.MethodDescriptor.MethodType.UNARY)
              .setFullMethodName(generateFullMethodName(SERVICE_NAME, "Release"))
              .setSampledToLocalTracing(true)
              .setRequestMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(
                  io.github.kafkalease.v1.ReleaseRequest.getDefaultInstance()))
              .setResponseMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(
                  io.github.kafkalease.v1.ReleaseResponse.getDefaultInstance()))
              .setSchemaDescriptor(new PartitionLeaseServiceMethodDescriptorSupplier("Release"))
              .build();
        }
      }
    }
    return getReleaseMethod;
  }

  private static volatile io.grpc.MethodDescriptor<io.github.kafkalease.v1.SubscribeRequest,
      io.github.kafkalease.v1.SubscribeResponse> getSubscribeMethod;

  @io.grpc.stub.annotations.RpcMethod(
      fullMethodName = SERVICE_NAME + '/' + "Subscribe",
      requestType = io.github.kafkalease.v1.SubscribeRequest.class,
      responseType = io.github.kafkalease.v1.SubscribeResponse.class,
      methodType = io.grpc.MethodDescriptor.MethodType.SERVER_STREAMING)
  public static io.grpc.MethodDescriptor<io.github.kafkalease.v1.SubscribeRequest,
      io.github.kafkalease.v1.SubscribeResponse> getSubscribeMethod() {
    io.grpc.MethodDescriptor<io.github.kafkalease.v1.SubscribeRequest, io.github.kafkalease.v1.SubscribeResponse> getSubscribeMethod;
    if ((getSubscribeMethod = PartitionLeaseServiceGrpc.getSubscribeMethod) == null) {
      synchronized (PartitionLeaseServiceGrpc.class) {
        if ((getSubscribeMethod = PartitionLeaseServiceGrpc.getSubscribeMethod) == null) {
          PartitionLeaseServiceGrpc.getSubscribeMethod = getSubscribeMethod =
              io.grpc.MethodDescriptor.<io.github.kafkalease.v1.SubscribeRequest, io.github.kafkalease.v1.SubscribeResponse>newBuilder()
              .setType(io.grpc.MethodDescriptor.MethodType.SERVER_STREAMING)
              .setFullMethodName(generateFullMethodName(SERVICE_NAME, "Subscribe"))
              .setSampledToLocalTracing(true)
              .setRequestMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(
                  io.github.kafkalease.v1.SubscribeRequest.getDefaultInstance()))
              .setResponseMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(
                  io.github.kafkalease.v1.SubscribeResponse.getDefaultInstance()))
              .setSchemaDescriptor(new PartitionLeaseServiceMethodDescriptorSupplier("Subscribe"))
              .build();
        }
      }
    }
    return getSubscribeMethod;
  }

  private static volatile io.grpc.MethodDescriptor<io.github.kafkalease.v1.ListMembersRequest,
      io.github.kafkalease.v1.ListMembersResponse> getListMembersMethod;

  @io.grpc.stub.annotations.RpcMethod(
      fullMethodName = SERVICE_NAME + '/' + "ListMembers",
      requestType = io.github.kafkalease.v1.ListMembersRequest.class,
      responseType = io.github.kafkalease.v1.ListMembersResponse.class,
      methodType = io.grpc.MethodDescriptor.MethodType.UNARY)
  public static io.grpc.MethodDescriptor<io.github.kafkalease.v1.ListMembersRequest,
      io.github.kafkalease.v1.ListMembersResponse> getListMembersMethod() {
    io.grpc.MethodDescriptor<io.github.kafkalease.v1.ListMembersRequest, io.github.kafkalease.v1.ListMembersResponse> getListMembersMethod;
    if ((getListMembersMethod = PartitionLeaseServiceGrpc.getListMembersMethod) == null) {
      synchronized (PartitionLeaseServiceGrpc.class) {
        if ((getListMembersMethod = PartitionLeaseServiceGrpc.getListMembersMethod) == null) {
          PartitionLeaseServiceGrpc.getListMembersMethod = getListMembersMethod =
              io.grpc.MethodDescriptor.<io.github.kafkalease.v1.ListMembersRequest, io.github.kafkalease.v1.ListMembersResponse>newBuilder()
              .setType(io.grpc.MethodDescriptor.MethodType.UNARY)
              .setFullMethodName(generateFullMethodName(SERVICE_NAME, "ListMembers"))
              .setSampledToLocalTracing(true)
              .setRequestMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(
                  io.github.kafkalease.v1.ListMembersRequest.getDefaultInstance()))
              .setResponseMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(
                  io.github.kafkalease.v1.ListMembersResponse.getDefaultInstance()))
              .setSchemaDescriptor(new PartitionLeaseServiceMethodDescriptorSupplier("ListMembers"))
              .build();
        }
      }
    }
    return getListMembersMethod;
  }

  private static volatile io.grpc.MethodDescriptor<io.github.kafkalease.v1.ListLeasesRequest,
      io.github.kafkalease.v1.ListLeasesResponse> getListLeasesMethod;

  @io.grpc.stub.annotations.RpcMethod(
      fullMethodName = SERVICE_NAME + '/' + "ListLeases",
      requestType = io.github.kafkalease.v1.ListLeasesRequest.class,
      responseType = io.github.kafkalease.v1.ListLeasesResponse.class,
      methodType = io.grpc.MethodDescriptor.MethodType.UNARY)
  public static io.grpc.MethodDescriptor<io.github.kafkalease.v1.ListLeasesRequest,
      io.github.kafkalease.v1.ListLeasesResponse> getListLeasesMethod() {
    io.grpc.MethodDescriptor<io.github.kafkalease.v1.ListLeasesRequest, io.github.kafkalease.v1.ListLeasesResponse> getListLeasesMethod;
    if ((getListLeasesMethod = PartitionLeaseServiceGrpc.getListLeasesMethod) == null) {
      synchronized (PartitionLeaseServiceGrpc.class) {
        if ((getListLeasesMethod = PartitionLeaseServiceGrpc.getListLeasesMethod) == null) {
          PartitionLeaseServiceGrpc.getListLeasesMethod = getListLeasesMethod =
              io.grpc.MethodDescriptor.<io.github.kafkalease.v1.ListLeasesRequest, io.github.kafkalease.v1.ListLeasesResponse>newBuilder()
              .setType(io.grpc.MethodDescriptor.MethodType.UNARY)
              .setFullMethodName(generateFullMethodName(SERVICE_NAME, "ListLeases"))
              .setSampledToLocalTracing(true)
              .setRequestMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(
                  io.github.kafkalease.v1.ListLeasesRequest.getDefaultInstance()))
              .setResponseMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(
                  io.github.kafkalease.v1.ListLeasesResponse.getDefaultInstance()))
              .setSchemaDescriptor(new PartitionLeaseServiceMethodDescriptorSupplier("ListLeases"))
              .build();
        }
      }
    }
    return getListLeasesMethod;
  }

  private static volatile io.grpc.MethodDescriptor<io.github.kafkalease.v1.DeliverRequest,
      io.github.kafkalease.v1.DeliverResponse> getDeliverMethod;

  @io.grpc.stub.annotations.RpcMethod(
      fullMethodName = SERVICE_NAME + '/' + "Deliver",
      requestType = io.github.kafkalease.v1.DeliverRequest.class,
      responseType = io.github.kafkalease.v1.DeliverResponse.class,
      methodType = io.grpc.MethodDescriptor.MethodType.SERVER_STREAMING)
  public static io.grpc.MethodDescriptor<io.github.kafkalease.v1.DeliverRequest,
      io.github.kafkalease.v1.DeliverResponse> getDeliverMethod() {
    io.grpc.MethodDescriptor<io.github.kafkalease.v1.DeliverRequest, io.github.kafkalease.v1.DeliverResponse> getDeliverMethod;
    if ((getDeliverMethod = PartitionLeaseServiceGrpc.getDeliverMethod) == null) {
      synchronized (PartitionLeaseServiceGrpc.class) {
        if ((getDeliverMethod = PartitionLeaseServiceGrpc.getDeliverMethod) == null) {
          PartitionLeaseServiceGrpc.getDeliverMethod = getDeliverMethod =
              io.grpc.MethodDescriptor.<io.github.kafkalease.v1.DeliverRequest, io.github.kafkalease.v1.DeliverResponse>newBuilder()
              .setType(io.grpc.MethodDescriptor.MethodType.SERVER_STREAMING)
              .setFullMethodName(generateFullMethodName(SERVICE_NAME, "Deliver"))
              .setSampledToLocalTracing(true)
              .setRequestMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(
                  io.github.kafkalease.v1.DeliverRequest.getDefaultInstance()))
              .setResponseMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(
                  io.github.kafkalease.v1.DeliverResponse.getDefaultInstance()))
              .setSchemaDescriptor(new PartitionLeaseServiceMethodDescriptorSupplier("Deliver"))
              .build();
        }
      }
    }
    return getDeliverMethod;
  }

  private static volatile io.grpc.MethodDescriptor<io.github.kafkalease.v1.AcknowledgeRequest,
      io.github.kafkalease.v1.AcknowledgeResponse> getAcknowledgeMethod;

  @io.grpc.stub.annotations.RpcMethod(
      fullMethodName = SERVICE_NAME + '/' + "Acknowledge",
      requestType = io.github.kafkalease.v1.AcknowledgeRequest.class,
      responseType = io.github.kafkalease.v1.AcknowledgeResponse.class,
      methodType = io.grpc.MethodDescriptor.MethodType.UNARY)
  public static io.grpc.MethodDescriptor<io.github.kafkalease.v1.AcknowledgeRequest,
      io.github.kafkalease.v1.AcknowledgeResponse> getAcknowledgeMethod() {
    io.grpc.MethodDescriptor<io.github.kafkalease.v1.AcknowledgeRequest, io.github.kafkalease.v1.AcknowledgeResponse> getAcknowledgeMethod;
    if ((getAcknowledgeMethod = PartitionLeaseServiceGrpc.getAcknowledgeMethod) == null) {
      synchronized (PartitionLeaseServiceGrpc.class) {
        if ((getAcknowledgeMethod = PartitionLeaseServiceGrpc.getAcknowledgeMethod) == null) {
          PartitionLeaseServiceGrpc.getAcknowledgeMethod = getAcknowledgeMethod =
              io.grpc.MethodDescriptor.<io.github.kafkalease.v1.AcknowledgeRequest, io.github.kafkalease.v1.AcknowledgeResponse>newBuilder()
              .setType(io.grpc.MethodDescriptor.MethodType.UNARY)
              .setFullMethodName(generateFullMethodName(SERVICE_NAME, "Acknowledge"))
              .setSampledToLocalTracing(true)
              .setRequestMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(
                  io.github.kafkalease.v1.AcknowledgeRequest.getDefaultInstance()))
              .setResponseMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(
                  io.github.kafkalease.v1.AcknowledgeResponse.getDefaultInstance()))
              .setSchemaDescriptor(new PartitionLeaseServiceMethodDescriptorSupplier("Acknowledge"))
              .build();
        }
      }
    }
    return getAcknowledgeMethod;
  }

  /**
   * Creates a new async stub that supports all call types for the service
   */
  public static PartitionLeaseServiceStub newStub(io.grpc.Channel channel) {
    io.grpc.stub.AbstractStub.StubFactory<PartitionLeaseServiceStub> factory =
      new io.grpc.stub.AbstractStub.StubFactory<PartitionLeaseServiceStub>() {
        @java.lang.Override
        public PartitionLeaseServiceStub newStub(io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
          return new PartitionLeaseServiceStub(channel, callOptions);
        }
      };
    return PartitionLeaseServiceStub.newStub(factory, channel);
  }

  /**
   * Creates a new blocking-style stub that supports all types of calls on the service
   */
  public static PartitionLeaseServiceBlockingV2Stub newBlockingV2Stub(
      io.grpc.Channel channel) {
    io.grpc.stub.AbstractStub.StubFactory<PartitionLeaseServiceBlockingV2Stub> factory =
      new io.grpc.stub.AbstractStub.StubFactory<PartitionLeaseServiceBlockingV2Stub>() {
        @java.lang.Override
        public PartitionLeaseServiceBlockingV2Stub newStub(io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
          return new PartitionLeaseServiceBlockingV2Stub(channel, callOptions);
        }
      };
    return PartitionLeaseServiceBlockingV2Stub.newStub(factory, channel);
  }

  /**
   * Creates a new blocking-style stub that supports unary and streaming output calls on the service
   */
  public static PartitionLeaseServiceBlockingStub newBlockingStub(
      io.grpc.Channel channel) {
    io.grpc.stub.AbstractStub.StubFactory<PartitionLeaseServiceBlockingStub> factory =
      new io.grpc.stub.AbstractStub.StubFactory<PartitionLeaseServiceBlockingStub>() {
        @java.lang.Override
        public PartitionLeaseServiceBlockingStub newStub(io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
          return new PartitionLeaseServiceBlockingStub(channel, callOptions);
        }
      };
    return PartitionLeaseServiceBlockingStub.newStub(factory, channel);
  }

  /**
   * Creates a new ListenableFuture-style stub that supports unary calls on the service
   */
  public static PartitionLeaseServiceFutureStub newFutureStub(
      io.grpc.Channel channel) {
    io.grpc.stub.AbstractStub.StubFactory<PartitionLeaseServiceFutureStub> factory =
      new io.grpc.stub.AbstractStub.StubFactory<PartitionLeaseServiceFutureStub>() {
        @java.lang.Override
        public PartitionLeaseServiceFutureStub newStub(io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
          return new PartitionLeaseServiceFutureStub(channel, callOptions);
        }
      };
    return PartitionLeaseServiceFutureStub.newStub(factory, channel);
  }

  /**
   * <pre>
   * Leases Kafka partitions to the clients of a consumer group.
   * </pre>
   */
  public interface AsyncService {

    /**
     * <pre>
     * Takes an exclusive lease on one partition of `topic` for `group`.
     * Errors (reasons in ErrorReason): INVALID_ARGUMENT (names, ttl or wait out of range,
     * negative partition: INVALID_FIELD); NOT_FOUND (topic does not exist, partition out of
     * range: TOPIC_NOT_FOUND, PARTITION_NOT_FOUND); RESOURCE_EXHAUSTED (every partition, or
     * the one asked for, is leased in this group and `wait` ran out: PARTITION_BUSY; the
     * message and the metadata name the holder's member and when its lease expires);
     * UNAVAILABLE (Consul or Kafka unreachable, or the gateway is shutting down; safe to
     * retry: CONSUL_UNAVAILABLE, KAFKA_UNAVAILABLE, SHUTTING_DOWN, with RetryInfo).
     * </pre>
     */
    default void acquire(io.github.kafkalease.v1.AcquireRequest request,
        io.grpc.stub.StreamObserver<io.github.kafkalease.v1.AcquireResponse> responseObserver) {
      io.grpc.stub.ServerCalls.asyncUnimplementedUnaryCall(getAcquireMethod(), responseObserver);
    }

    /**
     * <pre>
     * Streams the leased partition's records in offset order, with no gaps and no repeats
     * within the stream, for as long as the lease is held. An open Read keeps the lease alive.
     * One Read per lease: a new Read supersedes the old one, which ends with ABORTED
     * (reason SUPERSEDED).
     * Reads are read_committed (as Deliver's and Subscribe's): a record of a transaction comes
     * once the transaction commits, and never if it aborts; a Read goes no further than the
     * partition's last stable offset. The offsets of aborted records and of the transactions'
     * markers hold no record, so offsets may jump (as in a compacted topic); "no gaps" means no
     * record is skipped. A response's `next_offset` passes the markers that follow its last
     * record, so a reader that commits it shows no lag once caught up.
     * Where a Read starts (the resume contract): at `from_offset` when it is set (as a Seek to
     * it would: the Read's first response carries a new seek epoch); otherwise at the lease's
     * *resume point*, the most recent of: the Acquire offset, the last Commit accepted in this
     * lease, and the last Seek's resolved offset. A Read never starts after a record that the
     * client has not committed or skipped on purpose: records handed to a stream that broke
     * (and may still have been in flight, in HTTP/2 buffers) are delivered again by the next
     * Read. To continue without repeats, reopen with `from_offset` = the last record received
     * + 1, as the Rust client does by itself. Delivery is therefore at least once.
     * The stream ends with OK after Release; FAILED_PRECONDITION (reason LEASE_LOST or
     * LEASE_EXPIRED; the message says "lease lost" or "lease expired") when the lease ended for
     * any other reason; UNAVAILABLE (SHUTTING_DOWN, naming the lease, which ended with the
     * gateway) when the gateway shuts down; DEADLINE_EXCEEDED at the caller's deadline, if it
     * set one (a Read's deadline bounds the whole stream, as gRPC defines it).
     * </pre>
     */
    default void read(io.github.kafkalease.v1.ReadRequest request,
        io.grpc.stub.StreamObserver<io.github.kafkalease.v1.ReadResponse> responseObserver) {
      io.grpc.stub.ServerCalls.asyncUnimplementedUnaryCall(getReadMethod(), responseObserver);
    }

    /**
     * <pre>
     * Repositions the lease. After the SeekResponse the gateway sends no ReadResponse of an
     * older `seek_epoch`, and the first record of the new epoch is the one at the resolved
     * offset (or the next existing one where the log is compacted). Seeking commits nothing;
     * it moves the lease's resume point (see Read) to the resolved offset.
     * Errors: OUT_OF_RANGE (offset below the log start or above the high watermark; the
     * message and the OFFSET_OUT_OF_RANGE metadata give the valid range); FAILED_PRECONDITION
     * (lease ended: LEASE_*); NOT_FOUND (unknown lease: LEASE_NOT_FOUND); UNAVAILABLE (the
     * instance serving the lease could not be reached from the one the call reached:
     * GATEWAY_UNREACHABLE).
     * </pre>
     */
    default void seek(io.github.kafkalease.v1.SeekRequest request,
        io.grpc.stub.StreamObserver<io.github.kafkalease.v1.SeekResponse> responseObserver) {
      io.grpc.stub.ServerCalls.asyncUnimplementedUnaryCall(getSeekMethod(), responseObserver);
    }

    /**
     * <pre>
     * Stores `offset` as the group's committed offset for the partition in Kafka's group
     * coordinator, where standard Kafka tooling sees it. Fenced: a commit for a lease that has
     * ended, or whose fencing token is older than the partition's current one, is rejected
     * with FAILED_PRECONDITION and changes nothing.
     * A commit also moves the lease's resume point (see Read) to `offset`.
     * Errors: INVALID_ARGUMENT (metadata too long); OUT_OF_RANGE (offset below 0 or above the
     * high watermark); FAILED_PRECONDITION; NOT_FOUND; UNAVAILABLE (Kafka unreachable).
     * </pre>
     */
    default void commit(io.github.kafkalease.v1.CommitRequest request,
        io.grpc.stub.StreamObserver<io.github.kafkalease.v1.CommitResponse> responseObserver) {
      io.grpc.stub.ServerCalls.asyncUnimplementedUnaryCall(getCommitMethod(), responseObserver);
    }

    /**
     * <pre>
     * Ends the lease, optionally committing first. After it returns another client's Acquire
     * for the partition succeeds at once, and the lease's open Read ends with OK.
     * Errors: NOT_FOUND (unknown or already-ended lease); OUT_OF_RANGE and
     * FAILED_PRECONDITION as for Commit, in which case the lease is kept.
     * </pre>
     */
    default void release(io.github.kafkalease.v1.ReleaseRequest request,
        io.grpc.stub.StreamObserver<io.github.kafkalease.v1.ReleaseResponse> responseObserver) {
      io.grpc.stub.ServerCalls.asyncUnimplementedUnaryCall(getReleaseMethod(), responseObserver);
    }

    /**
     * <pre>
     * Joins `group` as a member for one or more `topics`, and streams everything the member
     * needs: the leases it is assigned (usable with Commit, Seek and Release like any other
     * lease), their records, and the leases it must give up. The gateways share the
     * partitions of each topic that no Acquire lease holds among the members subscribed to it,
     * across every instance: each member holds ⌊P/M⌋ or ⌈P/M⌉ of them (under its cap), and
     * when members join or leave only the partitions that must move change hands. The member
     * stays in the group while the stream is open; when it ends (the client cancels or goes
     * away, or the gateway stops), the member leaves and its leases are released (after its
     * `session_grace`, if set). To leave cleanly, commit what was processed first, then end
     * the stream: a commit sent after the end races the release.
     * Only `assigned` carries a lease's fencing token; a client keeps it from there. After a
     * Seek of a lease, a `records` batch of an older `seek_epoch` may still arrive: drop it,
     * as a Read's client does.
     * Events, in order per lease: `assigned`, then `records` batches (the guarantees of Read:
     * offset order, no gaps, no repeats within the stream, seek epochs), then, when the lease
     * moves to another member, `revoking` (no records of it follow; commit what was processed
     * before the deadline) and `revoked`, or `revoked` alone when the lease ended otherwise.
     * In queue mode (`queue` set), `deliveries` events take the place of `records`; at
     * `revoking`, answer the lease's deliveries in flight before the deadline: the lease is
     * released (the gateway committing its progress) once none is in flight, or at the
     * deadline.
     * Records of all the member's leases share the stream fairly: a busy partition cannot
     * starve a quiet one.
     * Errors (the stream's status): INVALID_ARGUMENT (INVALID_FIELD); NOT_FOUND
     * (TOPIC_NOT_FOUND); ALREADY_EXISTS (MEMBER_ACTIVE: the member id is subscribed already
     * through a live stream); UNAVAILABLE (CONSUL_UNAVAILABLE, KAFKA_UNAVAILABLE,
     * SHUTTING_DOWN, GATEWAY_UNREACHABLE: the instance that holds the member, when a client
     * comes back through another one, cannot be reached).
     * </pre>
     */
    default void subscribe(io.github.kafkalease.v1.SubscribeRequest request,
        io.grpc.stub.StreamObserver<io.github.kafkalease.v1.SubscribeResponse> responseObserver) {
      io.grpc.stub.ServerCalls.asyncUnimplementedUnaryCall(getSubscribeMethod(), responseObserver);
    }

    /**
     * <pre>
     * Lists the members subscribed to `group` (Subscribe), across every gateway instance,
     * read from Consul, each with the partitions it holds and those the group's current target
     * assignment gives it, with that target's epoch. Ordered by topic, then member id.
     * Errors: INVALID_ARGUMENT (INVALID_FIELD); UNAVAILABLE (CONSUL_UNAVAILABLE).
     * </pre>
     */
    default void listMembers(io.github.kafkalease.v1.ListMembersRequest request,
        io.grpc.stub.StreamObserver<io.github.kafkalease.v1.ListMembersResponse> responseObserver) {
      io.grpc.stub.ServerCalls.asyncUnimplementedUnaryCall(getListMembersMethod(), responseObserver);
    }

    /**
     * <pre>
     * Lists the held leases across every gateway instance, read from Consul, with each lease's
     * live details (expiry, position, committed offset, lag) from the instance serving it:
     * asked of at most 8 instances at once, each bounded by 2 s; a lease whose instance did
     * not answer says why in `details_unavailable`.
     * </pre>
     */
    default void listLeases(io.github.kafkalease.v1.ListLeasesRequest request,
        io.grpc.stub.StreamObserver<io.github.kafkalease.v1.ListLeasesResponse> responseObserver) {
      io.grpc.stub.ServerCalls.asyncUnimplementedUnaryCall(getListLeasesMethod(), responseObserver);
    }

    /**
     * <pre>
     * Queue mode: hands the lease's records out one by one, as deliveries, each answered with
     * Acknowledge: ACCEPT (done), RETRY (deliver it again, after a delay if given), REJECT (to
     * the dead letter topic, with a reason) or RENEW (more time). Several records may be in
     * flight at once (`max_in_flight`), in the order `ordering` allows. A delivery not answered
     * by its `deadline` is delivered again, with its `attempt` one higher; a record that fails
     * its `max_deliveries`-th delivery (a RETRY, or its deadline passing) goes to the dead
     * letter topic. The verbs are those of Kafka's share groups (KIP-932): RETRY is their
     * RELEASE (named so here beside the Release call), and `attempt` their delivery count.
     * The gateway commits for the client: the committed offset is the lowest record not done,
     * and the records done above it, with the attempts of those delivered and not done, travel
     * in the commit's metadata beside the fencing token (fenced as every commit). The next
     * holder of the partition, on any gateway, skips what is done and delivers the rest with
     * their attempts carried over. It commits about once a second while something changed, and
     * before Release ends the lease. A record is done once accepted, or once the broker has
     * acknowledged its copy in the dead letter topic.
     * The first Deliver puts the lease in queue mode for the rest of its life: from then on
     * Read, Seek and Commit (and Release's `commit_offset`) are FAILED_PRECONDITION
     * (WRONG_MODE). A later Deliver (a client reopening a broken stream) must ask for the same
     * settings, and supersedes the open one, which ends with ABORTED (SUPERSEDED); deliveries
     * in flight stay in flight, and may be answered from any connection. An open Deliver keeps
     * the lease alive, as a Read does. The stream ends as a Read's does.
     * Errors: INVALID_ARGUMENT (a setting out of range, or not the queue's: INVALID_FIELD);
     * NOT_FOUND (the dead letter topic does not exist: TOPIC_NOT_FOUND, naming it; or the
     * lease: LEASE_NOT_FOUND); PERMISSION_DENIED (the policy grants no `dead_letter` on the
     * group and the dead letter topic: ACTION_DENIED); FAILED_PRECONDITION (LEASE_*);
     * UNAVAILABLE (Kafka unreachable, GATEWAY_UNREACHABLE).
     * </pre>
     */
    default void deliver(io.github.kafkalease.v1.DeliverRequest request,
        io.grpc.stub.StreamObserver<io.github.kafkalease.v1.DeliverResponse> responseObserver) {
      io.grpc.stub.ServerCalls.asyncUnimplementedUnaryCall(getDeliverMethod(), responseObserver);
    }

    /**
     * <pre>
     * Answers deliveries of a lease in queue mode, from any connection and through any
     * gateway instance. Each acknowledgement is applied on its own, in order, and its outcome
     * comes back in the same position: an answer for a delivery that is no longer in flight
     * (its deadline passed and it was delivered again, or it is done) is STALE and changes
     * nothing, except that an ACCEPT of a record not done yet counts, whichever delivery it
     * answers (the record was handled). An answer for an offset never delivered is
     * NOT_DELIVERED and changes nothing.
     * Errors: INVALID_ARGUMENT (INVALID_FIELD: an offset below 0, a type unset, a delay or
     * reason too long, more than 10,000 acknowledgements); FAILED_PRECONDITION (LEASE_*: the
     * lease has ended or moved, so nothing is applied; WRONG_MODE: no Deliver opened queue mode
     * on the lease); NOT_FOUND (LEASE_NOT_FOUND); UNAVAILABLE (GATEWAY_UNREACHABLE).
     * </pre>
     */
    default void acknowledge(io.github.kafkalease.v1.AcknowledgeRequest request,
        io.grpc.stub.StreamObserver<io.github.kafkalease.v1.AcknowledgeResponse> responseObserver) {
      io.grpc.stub.ServerCalls.asyncUnimplementedUnaryCall(getAcknowledgeMethod(), responseObserver);
    }
  }

  /**
   * Base class for the server implementation of the service PartitionLeaseService.
   * <pre>
   * Leases Kafka partitions to the clients of a consumer group.
   * </pre>
   */
  public static abstract class PartitionLeaseServiceImplBase
      implements io.grpc.BindableService, AsyncService {

    @java.lang.Override public final io.grpc.ServerServiceDefinition bindService() {
      return PartitionLeaseServiceGrpc.bindService(this);
    }
  }

  /**
   * A stub to allow clients to do asynchronous rpc calls to service PartitionLeaseService.
   * <pre>
   * Leases Kafka partitions to the clients of a consumer group.
   * </pre>
   */
  public static final class PartitionLeaseServiceStub
      extends io.grpc.stub.AbstractAsyncStub<PartitionLeaseServiceStub> {
    private PartitionLeaseServiceStub(
        io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
      super(channel, callOptions);
    }

    @java.lang.Override
    protected PartitionLeaseServiceStub build(
        io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
      return new PartitionLeaseServiceStub(channel, callOptions);
    }

    /**
     * <pre>
     * Takes an exclusive lease on one partition of `topic` for `group`.
     * Errors (reasons in ErrorReason): INVALID_ARGUMENT (names, ttl or wait out of range,
     * negative partition: INVALID_FIELD); NOT_FOUND (topic does not exist, partition out of
     * range: TOPIC_NOT_FOUND, PARTITION_NOT_FOUND); RESOURCE_EXHAUSTED (every partition, or
     * the one asked for, is leased in this group and `wait` ran out: PARTITION_BUSY; the
     * message and the metadata name the holder's member and when its lease expires);
     * UNAVAILABLE (Consul or Kafka unreachable, or the gateway is shutting down; safe to
     * retry: CONSUL_UNAVAILABLE, KAFKA_UNAVAILABLE, SHUTTING_DOWN, with RetryInfo).
     * </pre>
     */
    public void acquire(io.github.kafkalease.v1.AcquireRequest request,
        io.grpc.stub.StreamObserver<io.github.kafkalease.v1.AcquireResponse> responseObserver) {
      io.grpc.stub.ClientCalls.asyncUnaryCall(
          getChannel().newCall(getAcquireMethod(), getCallOptions()), request, responseObserver);
    }

    /**
     * <pre>
     * Streams the leased partition's records in offset order, with no gaps and no repeats
     * within the stream, for as long as the lease is held. An open Read keeps the lease alive.
     * One Read per lease: a new Read supersedes the old one, which ends with ABORTED
     * (reason SUPERSEDED).
     * Reads are read_committed (as Deliver's and Subscribe's): a record of a transaction comes
     * once the transaction commits, and never if it aborts; a Read goes no further than the
     * partition's last stable offset. The offsets of aborted records and of the transactions'
     * markers hold no record, so offsets may jump (as in a compacted topic); "no gaps" means no
     * record is skipped. A response's `next_offset` passes the markers that follow its last
     * record, so a reader that commits it shows no lag once caught up.
     * Where a Read starts (the resume contract): at `from_offset` when it is set (as a Seek to
     * it would: the Read's first response carries a new seek epoch); otherwise at the lease's
     * *resume point*, the most recent of: the Acquire offset, the last Commit accepted in this
     * lease, and the last Seek's resolved offset. A Read never starts after a record that the
     * client has not committed or skipped on purpose: records handed to a stream that broke
     * (and may still have been in flight, in HTTP/2 buffers) are delivered again by the next
     * Read. To continue without repeats, reopen with `from_offset` = the last record received
     * + 1, as the Rust client does by itself. Delivery is therefore at least once.
     * The stream ends with OK after Release; FAILED_PRECONDITION (reason LEASE_LOST or
     * LEASE_EXPIRED; the message says "lease lost" or "lease expired") when the lease ended for
     * any other reason; UNAVAILABLE (SHUTTING_DOWN, naming the lease, which ended with the
     * gateway) when the gateway shuts down; DEADLINE_EXCEEDED at the caller's deadline, if it
     * set one (a Read's deadline bounds the whole stream, as gRPC defines it).
     * </pre>
     */
    public void read(io.github.kafkalease.v1.ReadRequest request,
        io.grpc.stub.StreamObserver<io.github.kafkalease.v1.ReadResponse> responseObserver) {
      io.grpc.stub.ClientCalls.asyncServerStreamingCall(
          getChannel().newCall(getReadMethod(), getCallOptions()), request, responseObserver);
    }

    /**
     * <pre>
     * Repositions the lease. After the SeekResponse the gateway sends no ReadResponse of an
     * older `seek_epoch`, and the first record of the new epoch is the one at the resolved
     * offset (or the next existing one where the log is compacted). Seeking commits nothing;
     * it moves the lease's resume point (see Read) to the resolved offset.
     * Errors: OUT_OF_RANGE (offset below the log start or above the high watermark; the
     * message and the OFFSET_OUT_OF_RANGE metadata give the valid range); FAILED_PRECONDITION
     * (lease ended: LEASE_*); NOT_FOUND (unknown lease: LEASE_NOT_FOUND); UNAVAILABLE (the
     * instance serving the lease could not be reached from the one the call reached:
     * GATEWAY_UNREACHABLE).
     * </pre>
     */
    public void seek(io.github.kafkalease.v1.SeekRequest request,
        io.grpc.stub.StreamObserver<io.github.kafkalease.v1.SeekResponse> responseObserver) {
      io.grpc.stub.ClientCalls.asyncUnaryCall(
          getChannel().newCall(getSeekMethod(), getCallOptions()), request, responseObserver);
    }

    /**
     * <pre>
     * Stores `offset` as the group's committed offset for the partition in Kafka's group
     * coordinator, where standard Kafka tooling sees it. Fenced: a commit for a lease that has
     * ended, or whose fencing token is older than the partition's current one, is rejected
     * with FAILED_PRECONDITION and changes nothing.
     * A commit also moves the lease's resume point (see Read) to `offset`.
     * Errors: INVALID_ARGUMENT (metadata too long); OUT_OF_RANGE (offset below 0 or above the
     * high watermark); FAILED_PRECONDITION; NOT_FOUND; UNAVAILABLE (Kafka unreachable).
     * </pre>
     */
    public void commit(io.github.kafkalease.v1.CommitRequest request,
        io.grpc.stub.StreamObserver<io.github.kafkalease.v1.CommitResponse> responseObserver) {
      io.grpc.stub.ClientCalls.asyncUnaryCall(
          getChannel().newCall(getCommitMethod(), getCallOptions()), request, responseObserver);
    }

    /**
     * <pre>
     * Ends the lease, optionally committing first. After it returns another client's Acquire
     * for the partition succeeds at once, and the lease's open Read ends with OK.
     * Errors: NOT_FOUND (unknown or already-ended lease); OUT_OF_RANGE and
     * FAILED_PRECONDITION as for Commit, in which case the lease is kept.
     * </pre>
     */
    public void release(io.github.kafkalease.v1.ReleaseRequest request,
        io.grpc.stub.StreamObserver<io.github.kafkalease.v1.ReleaseResponse> responseObserver) {
      io.grpc.stub.ClientCalls.asyncUnaryCall(
          getChannel().newCall(getReleaseMethod(), getCallOptions()), request, responseObserver);
    }

    /**
     * <pre>
     * Joins `group` as a member for one or more `topics`, and streams everything the member
     * needs: the leases it is assigned (usable with Commit, Seek and Release like any other
     * lease), their records, and the leases it must give up. The gateways share the
     * partitions of each topic that no Acquire lease holds among the members subscribed to it,
     * across every instance: each member holds ⌊P/M⌋ or ⌈P/M⌉ of them (under its cap), and
     * when members join or leave only the partitions that must move change hands. The member
     * stays in the group while the stream is open; when it ends (the client cancels or goes
     * away, or the gateway stops), the member leaves and its leases are released (after its
     * `session_grace`, if set). To leave cleanly, commit what was processed first, then end
     * the stream: a commit sent after the end races the release.
     * Only `assigned` carries a lease's fencing token; a client keeps it from there. After a
     * Seek of a lease, a `records` batch of an older `seek_epoch` may still arrive: drop it,
     * as a Read's client does.
     * Events, in order per lease: `assigned`, then `records` batches (the guarantees of Read:
     * offset order, no gaps, no repeats within the stream, seek epochs), then, when the lease
     * moves to another member, `revoking` (no records of it follow; commit what was processed
     * before the deadline) and `revoked`, or `revoked` alone when the lease ended otherwise.
     * In queue mode (`queue` set), `deliveries` events take the place of `records`; at
     * `revoking`, answer the lease's deliveries in flight before the deadline: the lease is
     * released (the gateway committing its progress) once none is in flight, or at the
     * deadline.
     * Records of all the member's leases share the stream fairly: a busy partition cannot
     * starve a quiet one.
     * Errors (the stream's status): INVALID_ARGUMENT (INVALID_FIELD); NOT_FOUND
     * (TOPIC_NOT_FOUND); ALREADY_EXISTS (MEMBER_ACTIVE: the member id is subscribed already
     * through a live stream); UNAVAILABLE (CONSUL_UNAVAILABLE, KAFKA_UNAVAILABLE,
     * SHUTTING_DOWN, GATEWAY_UNREACHABLE: the instance that holds the member, when a client
     * comes back through another one, cannot be reached).
     * </pre>
     */
    public void subscribe(io.github.kafkalease.v1.SubscribeRequest request,
        io.grpc.stub.StreamObserver<io.github.kafkalease.v1.SubscribeResponse> responseObserver) {
      io.grpc.stub.ClientCalls.asyncServerStreamingCall(
          getChannel().newCall(getSubscribeMethod(), getCallOptions()), request, responseObserver);
    }

    /**
     * <pre>
     * Lists the members subscribed to `group` (Subscribe), across every gateway instance,
     * read from Consul, each with the partitions it holds and those the group's current target
     * assignment gives it, with that target's epoch. Ordered by topic, then member id.
     * Errors: INVALID_ARGUMENT (INVALID_FIELD); UNAVAILABLE (CONSUL_UNAVAILABLE).
     * </pre>
     */
    public void listMembers(io.github.kafkalease.v1.ListMembersRequest request,
        io.grpc.stub.StreamObserver<io.github.kafkalease.v1.ListMembersResponse> responseObserver) {
      io.grpc.stub.ClientCalls.asyncUnaryCall(
          getChannel().newCall(getListMembersMethod(), getCallOptions()), request, responseObserver);
    }

    /**
     * <pre>
     * Lists the held leases across every gateway instance, read from Consul, with each lease's
     * live details (expiry, position, committed offset, lag) from the instance serving it:
     * asked of at most 8 instances at once, each bounded by 2 s; a lease whose instance did
     * not answer says why in `details_unavailable`.
     * </pre>
     */
    public void listLeases(io.github.kafkalease.v1.ListLeasesRequest request,
        io.grpc.stub.StreamObserver<io.github.kafkalease.v1.ListLeasesResponse> responseObserver) {
      io.grpc.stub.ClientCalls.asyncUnaryCall(
          getChannel().newCall(getListLeasesMethod(), getCallOptions()), request, responseObserver);
    }

    /**
     * <pre>
     * Queue mode: hands the lease's records out one by one, as deliveries, each answered with
     * Acknowledge: ACCEPT (done), RETRY (deliver it again, after a delay if given), REJECT (to
     * the dead letter topic, with a reason) or RENEW (more time). Several records may be in
     * flight at once (`max_in_flight`), in the order `ordering` allows. A delivery not answered
     * by its `deadline` is delivered again, with its `attempt` one higher; a record that fails
     * its `max_deliveries`-th delivery (a RETRY, or its deadline passing) goes to the dead
     * letter topic. The verbs are those of Kafka's share groups (KIP-932): RETRY is their
     * RELEASE (named so here beside the Release call), and `attempt` their delivery count.
     * The gateway commits for the client: the committed offset is the lowest record not done,
     * and the records done above it, with the attempts of those delivered and not done, travel
     * in the commit's metadata beside the fencing token (fenced as every commit). The next
     * holder of the partition, on any gateway, skips what is done and delivers the rest with
     * their attempts carried over. It commits about once a second while something changed, and
     * before Release ends the lease. A record is done once accepted, or once the broker has
     * acknowledged its copy in the dead letter topic.
     * The first Deliver puts the lease in queue mode for the rest of its life: from then on
     * Read, Seek and Commit (and Release's `commit_offset`) are FAILED_PRECONDITION
     * (WRONG_MODE). A later Deliver (a client reopening a broken stream) must ask for the same
     * settings, and supersedes the open one, which ends with ABORTED (SUPERSEDED); deliveries
     * in flight stay in flight, and may be answered from any connection. An open Deliver keeps
     * the lease alive, as a Read does. The stream ends as a Read's does.
     * Errors: INVALID_ARGUMENT (a setting out of range, or not the queue's: INVALID_FIELD);
     * NOT_FOUND (the dead letter topic does not exist: TOPIC_NOT_FOUND, naming it; or the
     * lease: LEASE_NOT_FOUND); PERMISSION_DENIED (the policy grants no `dead_letter` on the
     * group and the dead letter topic: ACTION_DENIED); FAILED_PRECONDITION (LEASE_*);
     * UNAVAILABLE (Kafka unreachable, GATEWAY_UNREACHABLE).
     * </pre>
     */
    public void deliver(io.github.kafkalease.v1.DeliverRequest request,
        io.grpc.stub.StreamObserver<io.github.kafkalease.v1.DeliverResponse> responseObserver) {
      io.grpc.stub.ClientCalls.asyncServerStreamingCall(
          getChannel().newCall(getDeliverMethod(), getCallOptions()), request, responseObserver);
    }

    /**
     * <pre>
     * Answers deliveries of a lease in queue mode, from any connection and through any
     * gateway instance. Each acknowledgement is applied on its own, in order, and its outcome
     * comes back in the same position: an answer for a delivery that is no longer in flight
     * (its deadline passed and it was delivered again, or it is done) is STALE and changes
     * nothing, except that an ACCEPT of a record not done yet counts, whichever delivery it
     * answers (the record was handled). An answer for an offset never delivered is
     * NOT_DELIVERED and changes nothing.
     * Errors: INVALID_ARGUMENT (INVALID_FIELD: an offset below 0, a type unset, a delay or
     * reason too long, more than 10,000 acknowledgements); FAILED_PRECONDITION (LEASE_*: the
     * lease has ended or moved, so nothing is applied; WRONG_MODE: no Deliver opened queue mode
     * on the lease); NOT_FOUND (LEASE_NOT_FOUND); UNAVAILABLE (GATEWAY_UNREACHABLE).
     * </pre>
     */
    public void acknowledge(io.github.kafkalease.v1.AcknowledgeRequest request,
        io.grpc.stub.StreamObserver<io.github.kafkalease.v1.AcknowledgeResponse> responseObserver) {
      io.grpc.stub.ClientCalls.asyncUnaryCall(
          getChannel().newCall(getAcknowledgeMethod(), getCallOptions()), request, responseObserver);
    }
  }

  /**
   * A stub to allow clients to do synchronous rpc calls to service PartitionLeaseService.
   * <pre>
   * Leases Kafka partitions to the clients of a consumer group.
   * </pre>
   */
  public static final class PartitionLeaseServiceBlockingV2Stub
      extends io.grpc.stub.AbstractBlockingStub<PartitionLeaseServiceBlockingV2Stub> {
    private PartitionLeaseServiceBlockingV2Stub(
        io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
      super(channel, callOptions);
    }

    @java.lang.Override
    protected PartitionLeaseServiceBlockingV2Stub build(
        io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
      return new PartitionLeaseServiceBlockingV2Stub(channel, callOptions);
    }

    /**
     * <pre>
     * Takes an exclusive lease on one partition of `topic` for `group`.
     * Errors (reasons in ErrorReason): INVALID_ARGUMENT (names, ttl or wait out of range,
     * negative partition: INVALID_FIELD); NOT_FOUND (topic does not exist, partition out of
     * range: TOPIC_NOT_FOUND, PARTITION_NOT_FOUND); RESOURCE_EXHAUSTED (every partition, or
     * the one asked for, is leased in this group and `wait` ran out: PARTITION_BUSY; the
     * message and the metadata name the holder's member and when its lease expires);
     * UNAVAILABLE (Consul or Kafka unreachable, or the gateway is shutting down; safe to
     * retry: CONSUL_UNAVAILABLE, KAFKA_UNAVAILABLE, SHUTTING_DOWN, with RetryInfo).
     * </pre>
     */
    public io.github.kafkalease.v1.AcquireResponse acquire(io.github.kafkalease.v1.AcquireRequest request) throws io.grpc.StatusException {
      return io.grpc.stub.ClientCalls.blockingV2UnaryCall(
          getChannel(), getAcquireMethod(), getCallOptions(), request);
    }

    /**
     * <pre>
     * Streams the leased partition's records in offset order, with no gaps and no repeats
     * within the stream, for as long as the lease is held. An open Read keeps the lease alive.
     * One Read per lease: a new Read supersedes the old one, which ends with ABORTED
     * (reason SUPERSEDED).
     * Reads are read_committed (as Deliver's and Subscribe's): a record of a transaction comes
     * once the transaction commits, and never if it aborts; a Read goes no further than the
     * partition's last stable offset. The offsets of aborted records and of the transactions'
     * markers hold no record, so offsets may jump (as in a compacted topic); "no gaps" means no
     * record is skipped. A response's `next_offset` passes the markers that follow its last
     * record, so a reader that commits it shows no lag once caught up.
     * Where a Read starts (the resume contract): at `from_offset` when it is set (as a Seek to
     * it would: the Read's first response carries a new seek epoch); otherwise at the lease's
     * *resume point*, the most recent of: the Acquire offset, the last Commit accepted in this
     * lease, and the last Seek's resolved offset. A Read never starts after a record that the
     * client has not committed or skipped on purpose: records handed to a stream that broke
     * (and may still have been in flight, in HTTP/2 buffers) are delivered again by the next
     * Read. To continue without repeats, reopen with `from_offset` = the last record received
     * + 1, as the Rust client does by itself. Delivery is therefore at least once.
     * The stream ends with OK after Release; FAILED_PRECONDITION (reason LEASE_LOST or
     * LEASE_EXPIRED; the message says "lease lost" or "lease expired") when the lease ended for
     * any other reason; UNAVAILABLE (SHUTTING_DOWN, naming the lease, which ended with the
     * gateway) when the gateway shuts down; DEADLINE_EXCEEDED at the caller's deadline, if it
     * set one (a Read's deadline bounds the whole stream, as gRPC defines it).
     * </pre>
     */
    @io.grpc.ExperimentalApi("https://github.com/grpc/grpc-java/issues/10918")
    public io.grpc.stub.BlockingClientCall<?, io.github.kafkalease.v1.ReadResponse>
        read(io.github.kafkalease.v1.ReadRequest request) {
      return io.grpc.stub.ClientCalls.blockingV2ServerStreamingCall(
          getChannel(), getReadMethod(), getCallOptions(), request);
    }

    /**
     * <pre>
     * Repositions the lease. After the SeekResponse the gateway sends no ReadResponse of an
     * older `seek_epoch`, and the first record of the new epoch is the one at the resolved
     * offset (or the next existing one where the log is compacted). Seeking commits nothing;
     * it moves the lease's resume point (see Read) to the resolved offset.
     * Errors: OUT_OF_RANGE (offset below the log start or above the high watermark; the
     * message and the OFFSET_OUT_OF_RANGE metadata give the valid range); FAILED_PRECONDITION
     * (lease ended: LEASE_*); NOT_FOUND (unknown lease: LEASE_NOT_FOUND); UNAVAILABLE (the
     * instance serving the lease could not be reached from the one the call reached:
     * GATEWAY_UNREACHABLE).
     * </pre>
     */
    public io.github.kafkalease.v1.SeekResponse seek(io.github.kafkalease.v1.SeekRequest request) throws io.grpc.StatusException {
      return io.grpc.stub.ClientCalls.blockingV2UnaryCall(
          getChannel(), getSeekMethod(), getCallOptions(), request);
    }

    /**
     * <pre>
     * Stores `offset` as the group's committed offset for the partition in Kafka's group
     * coordinator, where standard Kafka tooling sees it. Fenced: a commit for a lease that has
     * ended, or whose fencing token is older than the partition's current one, is rejected
     * with FAILED_PRECONDITION and changes nothing.
     * A commit also moves the lease's resume point (see Read) to `offset`.
     * Errors: INVALID_ARGUMENT (metadata too long); OUT_OF_RANGE (offset below 0 or above the
     * high watermark); FAILED_PRECONDITION; NOT_FOUND; UNAVAILABLE (Kafka unreachable).
     * </pre>
     */
    public io.github.kafkalease.v1.CommitResponse commit(io.github.kafkalease.v1.CommitRequest request) throws io.grpc.StatusException {
      return io.grpc.stub.ClientCalls.blockingV2UnaryCall(
          getChannel(), getCommitMethod(), getCallOptions(), request);
    }

    /**
     * <pre>
     * Ends the lease, optionally committing first. After it returns another client's Acquire
     * for the partition succeeds at once, and the lease's open Read ends with OK.
     * Errors: NOT_FOUND (unknown or already-ended lease); OUT_OF_RANGE and
     * FAILED_PRECONDITION as for Commit, in which case the lease is kept.
     * </pre>
     */
    public io.github.kafkalease.v1.ReleaseResponse release(io.github.kafkalease.v1.ReleaseRequest request) throws io.grpc.StatusException {
      return io.grpc.stub.ClientCalls.blockingV2UnaryCall(
          getChannel(), getReleaseMethod(), getCallOptions(), request);
    }

    /**
     * <pre>
     * Joins `group` as a member for one or more `topics`, and streams everything the member
     * needs: the leases it is assigned (usable with Commit, Seek and Release like any other
     * lease), their records, and the leases it must give up. The gateways share the
     * partitions of each topic that no Acquire lease holds among the members subscribed to it,
     * across every instance: each member holds ⌊P/M⌋ or ⌈P/M⌉ of them (under its cap), and
     * when members join or leave only the partitions that must move change hands. The member
     * stays in the group while the stream is open; when it ends (the client cancels or goes
     * away, or the gateway stops), the member leaves and its leases are released (after its
     * `session_grace`, if set). To leave cleanly, commit what was processed first, then end
     * the stream: a commit sent after the end races the release.
     * Only `assigned` carries a lease's fencing token; a client keeps it from there. After a
     * Seek of a lease, a `records` batch of an older `seek_epoch` may still arrive: drop it,
     * as a Read's client does.
     * Events, in order per lease: `assigned`, then `records` batches (the guarantees of Read:
     * offset order, no gaps, no repeats within the stream, seek epochs), then, when the lease
     * moves to another member, `revoking` (no records of it follow; commit what was processed
     * before the deadline) and `revoked`, or `revoked` alone when the lease ended otherwise.
     * In queue mode (`queue` set), `deliveries` events take the place of `records`; at
     * `revoking`, answer the lease's deliveries in flight before the deadline: the lease is
     * released (the gateway committing its progress) once none is in flight, or at the
     * deadline.
     * Records of all the member's leases share the stream fairly: a busy partition cannot
     * starve a quiet one.
     * Errors (the stream's status): INVALID_ARGUMENT (INVALID_FIELD); NOT_FOUND
     * (TOPIC_NOT_FOUND); ALREADY_EXISTS (MEMBER_ACTIVE: the member id is subscribed already
     * through a live stream); UNAVAILABLE (CONSUL_UNAVAILABLE, KAFKA_UNAVAILABLE,
     * SHUTTING_DOWN, GATEWAY_UNREACHABLE: the instance that holds the member, when a client
     * comes back through another one, cannot be reached).
     * </pre>
     */
    @io.grpc.ExperimentalApi("https://github.com/grpc/grpc-java/issues/10918")
    public io.grpc.stub.BlockingClientCall<?, io.github.kafkalease.v1.SubscribeResponse>
        subscribe(io.github.kafkalease.v1.SubscribeRequest request) {
      return io.grpc.stub.ClientCalls.blockingV2ServerStreamingCall(
          getChannel(), getSubscribeMethod(), getCallOptions(), request);
    }

    /**
     * <pre>
     * Lists the members subscribed to `group` (Subscribe), across every gateway instance,
     * read from Consul, each with the partitions it holds and those the group's current target
     * assignment gives it, with that target's epoch. Ordered by topic, then member id.
     * Errors: INVALID_ARGUMENT (INVALID_FIELD); UNAVAILABLE (CONSUL_UNAVAILABLE).
     * </pre>
     */
    public io.github.kafkalease.v1.ListMembersResponse listMembers(io.github.kafkalease.v1.ListMembersRequest request) throws io.grpc.StatusException {
      return io.grpc.stub.ClientCalls.blockingV2UnaryCall(
          getChannel(), getListMembersMethod(), getCallOptions(), request);
    }

    /**
     * <pre>
     * Lists the held leases across every gateway instance, read from Consul, with each lease's
     * live details (expiry, position, committed offset, lag) from the instance serving it:
     * asked of at most 8 instances at once, each bounded by 2 s; a lease whose instance did
     * not answer says why in `details_unavailable`.
     * </pre>
     */
    public io.github.kafkalease.v1.ListLeasesResponse listLeases(io.github.kafkalease.v1.ListLeasesRequest request) throws io.grpc.StatusException {
      return io.grpc.stub.ClientCalls.blockingV2UnaryCall(
          getChannel(), getListLeasesMethod(), getCallOptions(), request);
    }

    /**
     * <pre>
     * Queue mode: hands the lease's records out one by one, as deliveries, each answered with
     * Acknowledge: ACCEPT (done), RETRY (deliver it again, after a delay if given), REJECT (to
     * the dead letter topic, with a reason) or RENEW (more time). Several records may be in
     * flight at once (`max_in_flight`), in the order `ordering` allows. A delivery not answered
     * by its `deadline` is delivered again, with its `attempt` one higher; a record that fails
     * its `max_deliveries`-th delivery (a RETRY, or its deadline passing) goes to the dead
     * letter topic. The verbs are those of Kafka's share groups (KIP-932): RETRY is their
     * RELEASE (named so here beside the Release call), and `attempt` their delivery count.
     * The gateway commits for the client: the committed offset is the lowest record not done,
     * and the records done above it, with the attempts of those delivered and not done, travel
     * in the commit's metadata beside the fencing token (fenced as every commit). The next
     * holder of the partition, on any gateway, skips what is done and delivers the rest with
     * their attempts carried over. It commits about once a second while something changed, and
     * before Release ends the lease. A record is done once accepted, or once the broker has
     * acknowledged its copy in the dead letter topic.
     * The first Deliver puts the lease in queue mode for the rest of its life: from then on
     * Read, Seek and Commit (and Release's `commit_offset`) are FAILED_PRECONDITION
     * (WRONG_MODE). A later Deliver (a client reopening a broken stream) must ask for the same
     * settings, and supersedes the open one, which ends with ABORTED (SUPERSEDED); deliveries
     * in flight stay in flight, and may be answered from any connection. An open Deliver keeps
     * the lease alive, as a Read does. The stream ends as a Read's does.
     * Errors: INVALID_ARGUMENT (a setting out of range, or not the queue's: INVALID_FIELD);
     * NOT_FOUND (the dead letter topic does not exist: TOPIC_NOT_FOUND, naming it; or the
     * lease: LEASE_NOT_FOUND); PERMISSION_DENIED (the policy grants no `dead_letter` on the
     * group and the dead letter topic: ACTION_DENIED); FAILED_PRECONDITION (LEASE_*);
     * UNAVAILABLE (Kafka unreachable, GATEWAY_UNREACHABLE).
     * </pre>
     */
    @io.grpc.ExperimentalApi("https://github.com/grpc/grpc-java/issues/10918")
    public io.grpc.stub.BlockingClientCall<?, io.github.kafkalease.v1.DeliverResponse>
        deliver(io.github.kafkalease.v1.DeliverRequest request) {
      return io.grpc.stub.ClientCalls.blockingV2ServerStreamingCall(
          getChannel(), getDeliverMethod(), getCallOptions(), request);
    }

    /**
     * <pre>
     * Answers deliveries of a lease in queue mode, from any connection and through any
     * gateway instance. Each acknowledgement is applied on its own, in order, and its outcome
     * comes back in the same position: an answer for a delivery that is no longer in flight
     * (its deadline passed and it was delivered again, or it is done) is STALE and changes
     * nothing, except that an ACCEPT of a record not done yet counts, whichever delivery it
     * answers (the record was handled). An answer for an offset never delivered is
     * NOT_DELIVERED and changes nothing.
     * Errors: INVALID_ARGUMENT (INVALID_FIELD: an offset below 0, a type unset, a delay or
     * reason too long, more than 10,000 acknowledgements); FAILED_PRECONDITION (LEASE_*: the
     * lease has ended or moved, so nothing is applied; WRONG_MODE: no Deliver opened queue mode
     * on the lease); NOT_FOUND (LEASE_NOT_FOUND); UNAVAILABLE (GATEWAY_UNREACHABLE).
     * </pre>
     */
    public io.github.kafkalease.v1.AcknowledgeResponse acknowledge(io.github.kafkalease.v1.AcknowledgeRequest request) throws io.grpc.StatusException {
      return io.grpc.stub.ClientCalls.blockingV2UnaryCall(
          getChannel(), getAcknowledgeMethod(), getCallOptions(), request);
    }
  }

  /**
   * A stub to allow clients to do limited synchronous rpc calls to service PartitionLeaseService.
   * <pre>
   * Leases Kafka partitions to the clients of a consumer group.
   * </pre>
   */
  public static final class PartitionLeaseServiceBlockingStub
      extends io.grpc.stub.AbstractBlockingStub<PartitionLeaseServiceBlockingStub> {
    private PartitionLeaseServiceBlockingStub(
        io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
      super(channel, callOptions);
    }

    @java.lang.Override
    protected PartitionLeaseServiceBlockingStub build(
        io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
      return new PartitionLeaseServiceBlockingStub(channel, callOptions);
    }

    /**
     * <pre>
     * Takes an exclusive lease on one partition of `topic` for `group`.
     * Errors (reasons in ErrorReason): INVALID_ARGUMENT (names, ttl or wait out of range,
     * negative partition: INVALID_FIELD); NOT_FOUND (topic does not exist, partition out of
     * range: TOPIC_NOT_FOUND, PARTITION_NOT_FOUND); RESOURCE_EXHAUSTED (every partition, or
     * the one asked for, is leased in this group and `wait` ran out: PARTITION_BUSY; the
     * message and the metadata name the holder's member and when its lease expires);
     * UNAVAILABLE (Consul or Kafka unreachable, or the gateway is shutting down; safe to
     * retry: CONSUL_UNAVAILABLE, KAFKA_UNAVAILABLE, SHUTTING_DOWN, with RetryInfo).
     * </pre>
     */
    public io.github.kafkalease.v1.AcquireResponse acquire(io.github.kafkalease.v1.AcquireRequest request) {
      return io.grpc.stub.ClientCalls.blockingUnaryCall(
          getChannel(), getAcquireMethod(), getCallOptions(), request);
    }

    /**
     * <pre>
     * Streams the leased partition's records in offset order, with no gaps and no repeats
     * within the stream, for as long as the lease is held. An open Read keeps the lease alive.
     * One Read per lease: a new Read supersedes the old one, which ends with ABORTED
     * (reason SUPERSEDED).
     * Reads are read_committed (as Deliver's and Subscribe's): a record of a transaction comes
     * once the transaction commits, and never if it aborts; a Read goes no further than the
     * partition's last stable offset. The offsets of aborted records and of the transactions'
     * markers hold no record, so offsets may jump (as in a compacted topic); "no gaps" means no
     * record is skipped. A response's `next_offset` passes the markers that follow its last
     * record, so a reader that commits it shows no lag once caught up.
     * Where a Read starts (the resume contract): at `from_offset` when it is set (as a Seek to
     * it would: the Read's first response carries a new seek epoch); otherwise at the lease's
     * *resume point*, the most recent of: the Acquire offset, the last Commit accepted in this
     * lease, and the last Seek's resolved offset. A Read never starts after a record that the
     * client has not committed or skipped on purpose: records handed to a stream that broke
     * (and may still have been in flight, in HTTP/2 buffers) are delivered again by the next
     * Read. To continue without repeats, reopen with `from_offset` = the last record received
     * + 1, as the Rust client does by itself. Delivery is therefore at least once.
     * The stream ends with OK after Release; FAILED_PRECONDITION (reason LEASE_LOST or
     * LEASE_EXPIRED; the message says "lease lost" or "lease expired") when the lease ended for
     * any other reason; UNAVAILABLE (SHUTTING_DOWN, naming the lease, which ended with the
     * gateway) when the gateway shuts down; DEADLINE_EXCEEDED at the caller's deadline, if it
     * set one (a Read's deadline bounds the whole stream, as gRPC defines it).
     * </pre>
     */
    public java.util.Iterator<io.github.kafkalease.v1.ReadResponse> read(
        io.github.kafkalease.v1.ReadRequest request) {
      return io.grpc.stub.ClientCalls.blockingServerStreamingCall(
          getChannel(), getReadMethod(), getCallOptions(), request);
    }

    /**
     * <pre>
     * Repositions the lease. After the SeekResponse the gateway sends no ReadResponse of an
     * older `seek_epoch`, and the first record of the new epoch is the one at the resolved
     * offset (or the next existing one where the log is compacted). Seeking commits nothing;
     * it moves the lease's resume point (see Read) to the resolved offset.
     * Errors: OUT_OF_RANGE (offset below the log start or above the high watermark; the
     * message and the OFFSET_OUT_OF_RANGE metadata give the valid range); FAILED_PRECONDITION
     * (lease ended: LEASE_*); NOT_FOUND (unknown lease: LEASE_NOT_FOUND); UNAVAILABLE (the
     * instance serving the lease could not be reached from the one the call reached:
     * GATEWAY_UNREACHABLE).
     * </pre>
     */
    public io.github.kafkalease.v1.SeekResponse seek(io.github.kafkalease.v1.SeekRequest request) {
      return io.grpc.stub.ClientCalls.blockingUnaryCall(
          getChannel(), getSeekMethod(), getCallOptions(), request);
    }

    /**
     * <pre>
     * Stores `offset` as the group's committed offset for the partition in Kafka's group
     * coordinator, where standard Kafka tooling sees it. Fenced: a commit for a lease that has
     * ended, or whose fencing token is older than the partition's current one, is rejected
     * with FAILED_PRECONDITION and changes nothing.
     * A commit also moves the lease's resume point (see Read) to `offset`.
     * Errors: INVALID_ARGUMENT (metadata too long); OUT_OF_RANGE (offset below 0 or above the
     * high watermark); FAILED_PRECONDITION; NOT_FOUND; UNAVAILABLE (Kafka unreachable).
     * </pre>
     */
    public io.github.kafkalease.v1.CommitResponse commit(io.github.kafkalease.v1.CommitRequest request) {
      return io.grpc.stub.ClientCalls.blockingUnaryCall(
          getChannel(), getCommitMethod(), getCallOptions(), request);
    }

    /**
     * <pre>
     * Ends the lease, optionally committing first. After it returns another client's Acquire
     * for the partition succeeds at once, and the lease's open Read ends with OK.
     * Errors: NOT_FOUND (unknown or already-ended lease); OUT_OF_RANGE and
     * FAILED_PRECONDITION as for Commit, in which case the lease is kept.
     * </pre>
     */
    public io.github.kafkalease.v1.ReleaseResponse release(io.github.kafkalease.v1.ReleaseRequest request) {
      return io.grpc.stub.ClientCalls.blockingUnaryCall(
          getChannel(), getReleaseMethod(), getCallOptions(), request);
    }

    /**
     * <pre>
     * Joins `group` as a member for one or more `topics`, and streams everything the member
     * needs: the leases it is assigned (usable with Commit, Seek and Release like any other
     * lease), their records, and the leases it must give up. The gateways share the
     * partitions of each topic that no Acquire lease holds among the members subscribed to it,
     * across every instance: each member holds ⌊P/M⌋ or ⌈P/M⌉ of them (under its cap), and
     * when members join or leave only the partitions that must move change hands. The member
     * stays in the group while the stream is open; when it ends (the client cancels or goes
     * away, or the gateway stops), the member leaves and its leases are released (after its
     * `session_grace`, if set). To leave cleanly, commit what was processed first, then end
     * the stream: a commit sent after the end races the release.
     * Only `assigned` carries a lease's fencing token; a client keeps it from there. After a
     * Seek of a lease, a `records` batch of an older `seek_epoch` may still arrive: drop it,
     * as a Read's client does.
     * Events, in order per lease: `assigned`, then `records` batches (the guarantees of Read:
     * offset order, no gaps, no repeats within the stream, seek epochs), then, when the lease
     * moves to another member, `revoking` (no records of it follow; commit what was processed
     * before the deadline) and `revoked`, or `revoked` alone when the lease ended otherwise.
     * In queue mode (`queue` set), `deliveries` events take the place of `records`; at
     * `revoking`, answer the lease's deliveries in flight before the deadline: the lease is
     * released (the gateway committing its progress) once none is in flight, or at the
     * deadline.
     * Records of all the member's leases share the stream fairly: a busy partition cannot
     * starve a quiet one.
     * Errors (the stream's status): INVALID_ARGUMENT (INVALID_FIELD); NOT_FOUND
     * (TOPIC_NOT_FOUND); ALREADY_EXISTS (MEMBER_ACTIVE: the member id is subscribed already
     * through a live stream); UNAVAILABLE (CONSUL_UNAVAILABLE, KAFKA_UNAVAILABLE,
     * SHUTTING_DOWN, GATEWAY_UNREACHABLE: the instance that holds the member, when a client
     * comes back through another one, cannot be reached).
     * </pre>
     */
    public java.util.Iterator<io.github.kafkalease.v1.SubscribeResponse> subscribe(
        io.github.kafkalease.v1.SubscribeRequest request) {
      return io.grpc.stub.ClientCalls.blockingServerStreamingCall(
          getChannel(), getSubscribeMethod(), getCallOptions(), request);
    }

    /**
     * <pre>
     * Lists the members subscribed to `group` (Subscribe), across every gateway instance,
     * read from Consul, each with the partitions it holds and those the group's current target
     * assignment gives it, with that target's epoch. Ordered by topic, then member id.
     * Errors: INVALID_ARGUMENT (INVALID_FIELD); UNAVAILABLE (CONSUL_UNAVAILABLE).
     * </pre>
     */
    public io.github.kafkalease.v1.ListMembersResponse listMembers(io.github.kafkalease.v1.ListMembersRequest request) {
      return io.grpc.stub.ClientCalls.blockingUnaryCall(
          getChannel(), getListMembersMethod(), getCallOptions(), request);
    }

    /**
     * <pre>
     * Lists the held leases across every gateway instance, read from Consul, with each lease's
     * live details (expiry, position, committed offset, lag) from the instance serving it:
     * asked of at most 8 instances at once, each bounded by 2 s; a lease whose instance did
     * not answer says why in `details_unavailable`.
     * </pre>
     */
    public io.github.kafkalease.v1.ListLeasesResponse listLeases(io.github.kafkalease.v1.ListLeasesRequest request) {
      return io.grpc.stub.ClientCalls.blockingUnaryCall(
          getChannel(), getListLeasesMethod(), getCallOptions(), request);
    }

    /**
     * <pre>
     * Queue mode: hands the lease's records out one by one, as deliveries, each answered with
     * Acknowledge: ACCEPT (done), RETRY (deliver it again, after a delay if given), REJECT (to
     * the dead letter topic, with a reason) or RENEW (more time). Several records may be in
     * flight at once (`max_in_flight`), in the order `ordering` allows. A delivery not answered
     * by its `deadline` is delivered again, with its `attempt` one higher; a record that fails
     * its `max_deliveries`-th delivery (a RETRY, or its deadline passing) goes to the dead
     * letter topic. The verbs are those of Kafka's share groups (KIP-932): RETRY is their
     * RELEASE (named so here beside the Release call), and `attempt` their delivery count.
     * The gateway commits for the client: the committed offset is the lowest record not done,
     * and the records done above it, with the attempts of those delivered and not done, travel
     * in the commit's metadata beside the fencing token (fenced as every commit). The next
     * holder of the partition, on any gateway, skips what is done and delivers the rest with
     * their attempts carried over. It commits about once a second while something changed, and
     * before Release ends the lease. A record is done once accepted, or once the broker has
     * acknowledged its copy in the dead letter topic.
     * The first Deliver puts the lease in queue mode for the rest of its life: from then on
     * Read, Seek and Commit (and Release's `commit_offset`) are FAILED_PRECONDITION
     * (WRONG_MODE). A later Deliver (a client reopening a broken stream) must ask for the same
     * settings, and supersedes the open one, which ends with ABORTED (SUPERSEDED); deliveries
     * in flight stay in flight, and may be answered from any connection. An open Deliver keeps
     * the lease alive, as a Read does. The stream ends as a Read's does.
     * Errors: INVALID_ARGUMENT (a setting out of range, or not the queue's: INVALID_FIELD);
     * NOT_FOUND (the dead letter topic does not exist: TOPIC_NOT_FOUND, naming it; or the
     * lease: LEASE_NOT_FOUND); PERMISSION_DENIED (the policy grants no `dead_letter` on the
     * group and the dead letter topic: ACTION_DENIED); FAILED_PRECONDITION (LEASE_*);
     * UNAVAILABLE (Kafka unreachable, GATEWAY_UNREACHABLE).
     * </pre>
     */
    public java.util.Iterator<io.github.kafkalease.v1.DeliverResponse> deliver(
        io.github.kafkalease.v1.DeliverRequest request) {
      return io.grpc.stub.ClientCalls.blockingServerStreamingCall(
          getChannel(), getDeliverMethod(), getCallOptions(), request);
    }

    /**
     * <pre>
     * Answers deliveries of a lease in queue mode, from any connection and through any
     * gateway instance. Each acknowledgement is applied on its own, in order, and its outcome
     * comes back in the same position: an answer for a delivery that is no longer in flight
     * (its deadline passed and it was delivered again, or it is done) is STALE and changes
     * nothing, except that an ACCEPT of a record not done yet counts, whichever delivery it
     * answers (the record was handled). An answer for an offset never delivered is
     * NOT_DELIVERED and changes nothing.
     * Errors: INVALID_ARGUMENT (INVALID_FIELD: an offset below 0, a type unset, a delay or
     * reason too long, more than 10,000 acknowledgements); FAILED_PRECONDITION (LEASE_*: the
     * lease has ended or moved, so nothing is applied; WRONG_MODE: no Deliver opened queue mode
     * on the lease); NOT_FOUND (LEASE_NOT_FOUND); UNAVAILABLE (GATEWAY_UNREACHABLE).
     * </pre>
     */
    public io.github.kafkalease.v1.AcknowledgeResponse acknowledge(io.github.kafkalease.v1.AcknowledgeRequest request) {
      return io.grpc.stub.ClientCalls.blockingUnaryCall(
          getChannel(), getAcknowledgeMethod(), getCallOptions(), request);
    }
  }

  /**
   * A stub to allow clients to do ListenableFuture-style rpc calls to service PartitionLeaseService.
   * <pre>
   * Leases Kafka partitions to the clients of a consumer group.
   * </pre>
   */
  public static final class PartitionLeaseServiceFutureStub
      extends io.grpc.stub.AbstractFutureStub<PartitionLeaseServiceFutureStub> {
    private PartitionLeaseServiceFutureStub(
        io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
      super(channel, callOptions);
    }

    @java.lang.Override
    protected PartitionLeaseServiceFutureStub build(
        io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
      return new PartitionLeaseServiceFutureStub(channel, callOptions);
    }

    /**
     * <pre>
     * Takes an exclusive lease on one partition of `topic` for `group`.
     * Errors (reasons in ErrorReason): INVALID_ARGUMENT (names, ttl or wait out of range,
     * negative partition: INVALID_FIELD); NOT_FOUND (topic does not exist, partition out of
     * range: TOPIC_NOT_FOUND, PARTITION_NOT_FOUND); RESOURCE_EXHAUSTED (every partition, or
     * the one asked for, is leased in this group and `wait` ran out: PARTITION_BUSY; the
     * message and the metadata name the holder's member and when its lease expires);
     * UNAVAILABLE (Consul or Kafka unreachable, or the gateway is shutting down; safe to
     * retry: CONSUL_UNAVAILABLE, KAFKA_UNAVAILABLE, SHUTTING_DOWN, with RetryInfo).
     * </pre>
     */
    public com.google.common.util.concurrent.ListenableFuture<io.github.kafkalease.v1.AcquireResponse> acquire(
        io.github.kafkalease.v1.AcquireRequest request) {
      return io.grpc.stub.ClientCalls.futureUnaryCall(
          getChannel().newCall(getAcquireMethod(), getCallOptions()), request);
    }

    /**
     * <pre>
     * Repositions the lease. After the SeekResponse the gateway sends no ReadResponse of an
     * older `seek_epoch`, and the first record of the new epoch is the one at the resolved
     * offset (or the next existing one where the log is compacted). Seeking commits nothing;
     * it moves the lease's resume point (see Read) to the resolved offset.
     * Errors: OUT_OF_RANGE (offset below the log start or above the high watermark; the
     * message and the OFFSET_OUT_OF_RANGE metadata give the valid range); FAILED_PRECONDITION
     * (lease ended: LEASE_*); NOT_FOUND (unknown lease: LEASE_NOT_FOUND); UNAVAILABLE (the
     * instance serving the lease could not be reached from the one the call reached:
     * GATEWAY_UNREACHABLE).
     * </pre>
     */
    public com.google.common.util.concurrent.ListenableFuture<io.github.kafkalease.v1.SeekResponse> seek(
        io.github.kafkalease.v1.SeekRequest request) {
      return io.grpc.stub.ClientCalls.futureUnaryCall(
          getChannel().newCall(getSeekMethod(), getCallOptions()), request);
    }

    /**
     * <pre>
     * Stores `offset` as the group's committed offset for the partition in Kafka's group
     * coordinator, where standard Kafka tooling sees it. Fenced: a commit for a lease that has
     * ended, or whose fencing token is older than the partition's current one, is rejected
     * with FAILED_PRECONDITION and changes nothing.
     * A commit also moves the lease's resume point (see Read) to `offset`.
     * Errors: INVALID_ARGUMENT (metadata too long); OUT_OF_RANGE (offset below 0 or above the
     * high watermark); FAILED_PRECONDITION; NOT_FOUND; UNAVAILABLE (Kafka unreachable).
     * </pre>
     */
    public com.google.common.util.concurrent.ListenableFuture<io.github.kafkalease.v1.CommitResponse> commit(
        io.github.kafkalease.v1.CommitRequest request) {
      return io.grpc.stub.ClientCalls.futureUnaryCall(
          getChannel().newCall(getCommitMethod(), getCallOptions()), request);
    }

    /**
     * <pre>
     * Ends the lease, optionally committing first. After it returns another client's Acquire
     * for the partition succeeds at once, and the lease's open Read ends with OK.
     * Errors: NOT_FOUND (unknown or already-ended lease); OUT_OF_RANGE and
     * FAILED_PRECONDITION as for Commit, in which case the lease is kept.
     * </pre>
     */
    public com.google.common.util.concurrent.ListenableFuture<io.github.kafkalease.v1.ReleaseResponse> release(
        io.github.kafkalease.v1.ReleaseRequest request) {
      return io.grpc.stub.ClientCalls.futureUnaryCall(
          getChannel().newCall(getReleaseMethod(), getCallOptions()), request);
    }

    /**
     * <pre>
     * Lists the members subscribed to `group` (Subscribe), across every gateway instance,
     * read from Consul, each with the partitions it holds and those the group's current target
     * assignment gives it, with that target's epoch. Ordered by topic, then member id.
     * Errors: INVALID_ARGUMENT (INVALID_FIELD); UNAVAILABLE (CONSUL_UNAVAILABLE).
     * </pre>
     */
    public com.google.common.util.concurrent.ListenableFuture<io.github.kafkalease.v1.ListMembersResponse> listMembers(
        io.github.kafkalease.v1.ListMembersRequest request) {
      return io.grpc.stub.ClientCalls.futureUnaryCall(
          getChannel().newCall(getListMembersMethod(), getCallOptions()), request);
    }

    /**
     * <pre>
     * Lists the held leases across every gateway instance, read from Consul, with each lease's
     * live details (expiry, position, committed offset, lag) from the instance serving it:
     * asked of at most 8 instances at once, each bounded by 2 s; a lease whose instance did
     * not answer says why in `details_unavailable`.
     * </pre>
     */
    public com.google.common.util.concurrent.ListenableFuture<io.github.kafkalease.v1.ListLeasesResponse> listLeases(
        io.github.kafkalease.v1.ListLeasesRequest request) {
      return io.grpc.stub.ClientCalls.futureUnaryCall(
          getChannel().newCall(getListLeasesMethod(), getCallOptions()), request);
    }

    /**
     * <pre>
     * Answers deliveries of a lease in queue mode, from any connection and through any
     * gateway instance. Each acknowledgement is applied on its own, in order, and its outcome
     * comes back in the same position: an answer for a delivery that is no longer in flight
     * (its deadline passed and it was delivered again, or it is done) is STALE and changes
     * nothing, except that an ACCEPT of a record not done yet counts, whichever delivery it
     * answers (the record was handled). An answer for an offset never delivered is
     * NOT_DELIVERED and changes nothing.
     * Errors: INVALID_ARGUMENT (INVALID_FIELD: an offset below 0, a type unset, a delay or
     * reason too long, more than 10,000 acknowledgements); FAILED_PRECONDITION (LEASE_*: the
     * lease has ended or moved, so nothing is applied; WRONG_MODE: no Deliver opened queue mode
     * on the lease); NOT_FOUND (LEASE_NOT_FOUND); UNAVAILABLE (GATEWAY_UNREACHABLE).
     * </pre>
     */
    public com.google.common.util.concurrent.ListenableFuture<io.github.kafkalease.v1.AcknowledgeResponse> acknowledge(
        io.github.kafkalease.v1.AcknowledgeRequest request) {
      return io.grpc.stub.ClientCalls.futureUnaryCall(
          getChannel().newCall(getAcknowledgeMethod(), getCallOptions()), request);
    }
  }

  private static final int METHODID_ACQUIRE = 0;
  private static final int METHODID_READ = 1;
  private static final int METHODID_SEEK = 2;
  private static final int METHODID_COMMIT = 3;
  private static final int METHODID_RELEASE = 4;
  private static final int METHODID_SUBSCRIBE = 5;
  private static final int METHODID_LIST_MEMBERS = 6;
  private static final int METHODID_LIST_LEASES = 7;
  private static final int METHODID_DELIVER = 8;
  private static final int METHODID_ACKNOWLEDGE = 9;

  private static final class MethodHandlers<Req, Resp> implements
      io.grpc.stub.ServerCalls.UnaryMethod<Req, Resp>,
      io.grpc.stub.ServerCalls.ServerStreamingMethod<Req, Resp>,
      io.grpc.stub.ServerCalls.ClientStreamingMethod<Req, Resp>,
      io.grpc.stub.ServerCalls.BidiStreamingMethod<Req, Resp> {
    private final AsyncService serviceImpl;
    private final int methodId;

    MethodHandlers(AsyncService serviceImpl, int methodId) {
      this.serviceImpl = serviceImpl;
      this.methodId = methodId;
    }

    @java.lang.Override
    @java.lang.SuppressWarnings("unchecked")
    public void invoke(Req request, io.grpc.stub.StreamObserver<Resp> responseObserver) {
      switch (methodId) {
        case METHODID_ACQUIRE:
          serviceImpl.acquire((io.github.kafkalease.v1.AcquireRequest) request,
              (io.grpc.stub.StreamObserver<io.github.kafkalease.v1.AcquireResponse>) responseObserver);
          break;
        case METHODID_READ:
          serviceImpl.read((io.github.kafkalease.v1.ReadRequest) request,
              (io.grpc.stub.StreamObserver<io.github.kafkalease.v1.ReadResponse>) responseObserver);
          break;
        case METHODID_SEEK:
          serviceImpl.seek((io.github.kafkalease.v1.SeekRequest) request,
              (io.grpc.stub.StreamObserver<io.github.kafkalease.v1.SeekResponse>) responseObserver);
          break;
        case METHODID_COMMIT:
          serviceImpl.commit((io.github.kafkalease.v1.CommitRequest) request,
              (io.grpc.stub.StreamObserver<io.github.kafkalease.v1.CommitResponse>) responseObserver);
          break;
        case METHODID_RELEASE:
          serviceImpl.release((io.github.kafkalease.v1.ReleaseRequest) request,
              (io.grpc.stub.StreamObserver<io.github.kafkalease.v1.ReleaseResponse>) responseObserver);
          break;
        case METHODID_SUBSCRIBE:
          serviceImpl.subscribe((io.github.kafkalease.v1.SubscribeRequest) request,
              (io.grpc.stub.StreamObserver<io.github.kafkalease.v1.SubscribeResponse>) responseObserver);
          break;
        case METHODID_LIST_MEMBERS:
          serviceImpl.listMembers((io.github.kafkalease.v1.ListMembersRequest) request,
              (io.grpc.stub.StreamObserver<io.github.kafkalease.v1.ListMembersResponse>) responseObserver);
          break;
        case METHODID_LIST_LEASES:
          serviceImpl.listLeases((io.github.kafkalease.v1.ListLeasesRequest) request,
              (io.grpc.stub.StreamObserver<io.github.kafkalease.v1.ListLeasesResponse>) responseObserver);
          break;
        case METHODID_DELIVER:
          serviceImpl.deliver((io.github.kafkalease.v1.DeliverRequest) request,
              (io.grpc.stub.StreamObserver<io.github.kafkalease.v1.DeliverResponse>) responseObserver);
          break;
        case METHODID_ACKNOWLEDGE:
          serviceImpl.acknowledge((io.github.kafkalease.v1.AcknowledgeRequest) request,
              (io.grpc.stub.StreamObserver<io.github.kafkalease.v1.AcknowledgeResponse>) responseObserver);
          break;
        default:
          throw new AssertionError();
      }
    }

    @java.lang.Override
    @java.lang.SuppressWarnings("unchecked")
    public io.grpc.stub.StreamObserver<Req> invoke(
        io.grpc.stub.StreamObserver<Resp> responseObserver) {
      switch (methodId) {
        default:
          throw new AssertionError();
      }
    }
  }

  public static final io.grpc.ServerServiceDefinition bindService(AsyncService service) {
    return io.grpc.ServerServiceDefinition.builder(getServiceDescriptor())
        .addMethod(
          getAcquireMethod(),
          io.grpc.stub.ServerCalls.asyncUnaryCall(
            new MethodHandlers<
              io.github.kafkalease.v1.AcquireRequest,
              io.github.kafkalease.v1.AcquireResponse>(
                service, METHODID_ACQUIRE)))
        .addMethod(
          getReadMethod(),
          io.grpc.stub.ServerCalls.asyncServerStreamingCall(
            new MethodHandlers<
              io.github.kafkalease.v1.ReadRequest,
              io.github.kafkalease.v1.ReadResponse>(
                service, METHODID_READ)))
        .addMethod(
          getSeekMethod(),
          io.grpc.stub.ServerCalls.asyncUnaryCall(
            new MethodHandlers<
              io.github.kafkalease.v1.SeekRequest,
              io.github.kafkalease.v1.SeekResponse>(
                service, METHODID_SEEK)))
        .addMethod(
          getCommitMethod(),
          io.grpc.stub.ServerCalls.asyncUnaryCall(
            new MethodHandlers<
              io.github.kafkalease.v1.CommitRequest,
              io.github.kafkalease.v1.CommitResponse>(
                service, METHODID_COMMIT)))
        .addMethod(
          getReleaseMethod(),
          io.grpc.stub.ServerCalls.asyncUnaryCall(
            new MethodHandlers<
              io.github.kafkalease.v1.ReleaseRequest,
              io.github.kafkalease.v1.ReleaseResponse>(
                service, METHODID_RELEASE)))
        .addMethod(
          getSubscribeMethod(),
          io.grpc.stub.ServerCalls.asyncServerStreamingCall(
            new MethodHandlers<
              io.github.kafkalease.v1.SubscribeRequest,
              io.github.kafkalease.v1.SubscribeResponse>(
                service, METHODID_SUBSCRIBE)))
        .addMethod(
          getListMembersMethod(),
          io.grpc.stub.ServerCalls.asyncUnaryCall(
            new MethodHandlers<
              io.github.kafkalease.v1.ListMembersRequest,
              io.github.kafkalease.v1.ListMembersResponse>(
                service, METHODID_LIST_MEMBERS)))
        .addMethod(
          getListLeasesMethod(),
          io.grpc.stub.ServerCalls.asyncUnaryCall(
            new MethodHandlers<
              io.github.kafkalease.v1.ListLeasesRequest,
              io.github.kafkalease.v1.ListLeasesResponse>(
                service, METHODID_LIST_LEASES)))
        .addMethod(
          getDeliverMethod(),
          io.grpc.stub.ServerCalls.asyncServerStreamingCall(
            new MethodHandlers<
              io.github.kafkalease.v1.DeliverRequest,
              io.github.kafkalease.v1.DeliverResponse>(
                service, METHODID_DELIVER)))
        .addMethod(
          getAcknowledgeMethod(),
          io.grpc.stub.ServerCalls.asyncUnaryCall(
            new MethodHandlers<
              io.github.kafkalease.v1.AcknowledgeRequest,
              io.github.kafkalease.v1.AcknowledgeResponse>(
                service, METHODID_ACKNOWLEDGE)))
        .build();
  }

  private static abstract class PartitionLeaseServiceBaseDescriptorSupplier
      implements io.grpc.protobuf.ProtoFileDescriptorSupplier, io.grpc.protobuf.ProtoServiceDescriptorSupplier {
    PartitionLeaseServiceBaseDescriptorSupplier() {}

    @java.lang.Override
    public com.google.protobuf.Descriptors.FileDescriptor getFileDescriptor() {
      return io.github.kafkalease.v1.PartitionLeaseProto.getDescriptor();
    }

    @java.lang.Override
    public com.google.protobuf.Descriptors.ServiceDescriptor getServiceDescriptor() {
      return getFileDescriptor().findServiceByName("PartitionLeaseService");
    }
  }

  private static final class PartitionLeaseServiceFileDescriptorSupplier
      extends PartitionLeaseServiceBaseDescriptorSupplier {
    PartitionLeaseServiceFileDescriptorSupplier() {}
  }

  private static final class PartitionLeaseServiceMethodDescriptorSupplier
      extends PartitionLeaseServiceBaseDescriptorSupplier
      implements io.grpc.protobuf.ProtoMethodDescriptorSupplier {
    private final java.lang.String methodName;

    PartitionLeaseServiceMethodDescriptorSupplier(java.lang.String methodName) {
      this.methodName = methodName;
    }

    @java.lang.Override
    public com.google.protobuf.Descriptors.MethodDescriptor getMethodDescriptor() {
      return getServiceDescriptor().findMethodByName(methodName);
    }
  }

  private static volatile io.grpc.ServiceDescriptor serviceDescriptor;

  public static io.grpc.ServiceDescriptor getServiceDescriptor() {
    io.grpc.ServiceDescriptor result = serviceDescriptor;
    if (result == null) {
      synchronized (PartitionLeaseServiceGrpc.class) {
        result = serviceDescriptor;
        if (result == null) {
          serviceDescriptor = result = io.grpc.ServiceDescriptor.newBuilder(SERVICE_NAME)
              .setSchemaDescriptor(new PartitionLeaseServiceFileDescriptorSupplier())
              .addMethod(getAcquireMethod())
              .addMethod(getReadMethod())
              .addMethod(getSeekMethod())
              .addMethod(getCommitMethod())
              .addMethod(getReleaseMethod())
              .addMethod(getSubscribeMethod())
              .addMethod(getListMembersMethod())
              .addMethod(getListLeasesMethod())
              .addMethod(getDeliverMethod())
              .addMethod(getAcknowledgeMethod())
              .build();
        }
      }
    }
    return result;
  }
}
