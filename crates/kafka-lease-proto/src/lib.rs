//! Generated code for the `kafka_lease.v1` gRPC API. The `.proto` files under `proto/` are
//! the source of truth and their comments are the API docs. Written by hand: only [`wire`],
//! the ahead-encoded responses the gateway's server sends.

#![allow(missing_docs, unreachable_pub, missing_debug_implementations)]
#![allow(clippy::all)]

/// `kafka_lease.v1`: messages, the `PartitionLeaseService` client and server, and the
/// `GatewayPeerService` instances call on each other.
pub mod v1 {
    tonic::include_proto!("kafka_lease.v1");
}

/// `PartitionLeaseService`'s server and client again, with [`wire::EncodedReadResponse`] and
/// [`wire::EncodedSubscribeResponse`] for the two responses that carry records: the gateway
/// writes the records' encoding itself, and passes a peer's through when it forwards. The
/// calls, their paths and the bytes on the wire are those of [`v1`].
pub mod encoded {
    include!(concat!(env!("OUT_DIR"), "/encoded/kafka_lease.v1.rs"));
}

pub mod wire;

/// The encoded `FileDescriptorSet` of `kafka_lease.v1`, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    tonic::include_file_descriptor_set!("kafka_lease_v1_descriptor");

/// The fully qualified gRPC service name, as health checks and reflection name it.
pub const SERVICE_NAME: &str = "kafka_lease.v1.PartitionLeaseService";

/// The service gateway instances call on each other (not for clients).
pub const PEER_SERVICE_NAME: &str = "kafka_lease.v1.GatewayPeerService";
