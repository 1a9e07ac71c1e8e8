//! Generated code for the `kafka_lease.v1` gRPC API. Nothing here is written by hand: the
//! `.proto` file under `proto/` is the source of truth and its comments are the API docs.

#![allow(missing_docs, unreachable_pub, missing_debug_implementations)]
#![allow(clippy::all)]

/// `kafka_lease.v1`: messages, the `PartitionLeaseService` client and server, and the
/// `GatewayPeerService` instances call on each other.
pub mod v1 {
    tonic::include_proto!("kafka_lease.v1");
}

/// The encoded `FileDescriptorSet` of `kafka_lease.v1`, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    tonic::include_file_descriptor_set!("kafka_lease_v1_descriptor");

/// The fully qualified gRPC service name, as health checks and reflection name it.
pub const SERVICE_NAME: &str = "kafka_lease.v1.PartitionLeaseService";

/// The service gateway instances call on each other (not for clients).
pub const PEER_SERVICE_NAME: &str = "kafka_lease.v1.GatewayPeerService";
