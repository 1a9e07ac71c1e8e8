//! The gRPC surface: the one mapping from domain errors to `tonic::Status` (`status`), the
//! proto boundary (`convert`: requests validated into domain values, domain values into
//! responses), the `PartitionLeaseService` implementation over the [`Gateway`]
//! (`lease_service`, which forwards calls on leases other instances serve), and the
//! `GatewayPeerService` other instances call (`peer_service`); and forwarding, which is gRPC
//! between instances: calls on leases other instances serve sent on to them (`forward`), and
//! ListLeases' live details asked of them (`describe`).
//!
//! [`Gateway`]: crate::gateway::Gateway

mod convert;
mod describe;
pub mod forward;
mod framed;
mod lease_service;
mod peer_service;
mod status;

pub use framed::FramedService;
pub use lease_service::LeaseService;
pub use peer_service::PeerService;
pub use status::{status_of, ERROR_DOMAIN};
