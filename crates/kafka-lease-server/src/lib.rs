//! The kafka-lease gateway: lock backends, partition reading, the lease table and the gRPC
//! service.
//!
//! Layers, bottom up (docs/ARCHITECTURE.md, "Module graph"; `tests/layering.rs` checks that
//! no module names one on its layer or above), below them all [`coordination`] (locks, a
//! crate of its own: knows nothing of Kafka or gRPC):
//!
//! 0. the leaves: [`metrics`]; [`records`] (records encoded straight from librdkafka's
//!    buffers into a response's bytes); [`reload`]; `balance` (Subscribe's fair shares);
//!    [`queue`] (queue mode's pure core: the dispatcher, the progress a commit carries, the
//!    two kept in step); [`defects`] (the fault tests' planted defects).
//! 1. [`error`], [`tls`], `waiters` (the Acquires waiting for a topic's partitions).
//! 2. [`kafka`] (reading and offsets; knows nothing of locks or gRPC), [`validate`],
//!    [`auth`] (identities and the policy).
//! 3. [`lease`] (one lease, its Read and its queue run).
//! 4. [`gateway`] (the lease table and the operations in domain terms).
//! 5. [`subscribe`], [`calls`], [`metrics_endpoint`], [`dev`] (the mock cluster and an
//!    in-process gateway over it).
//! 6. [`grpc`] (the service, the one error-to-status mapping, and [`grpc::forward`]ing to
//!    other instances).
//! 7. [`server`] (running it all, health, shutdown).
//! 8. [`config`] (the flags).

pub mod auth;
mod balance;
pub mod calls;
pub mod config;
/// The partition locks: a crate of its own, so that "knows nothing of Kafka or gRPC" is a
/// rule the compiler enforces.
pub use kafka_lease_coordination as coordination;
pub mod defects;
pub mod dev;
pub mod error;
pub mod gateway;
pub mod grpc;
pub mod kafka;
pub mod lease;
pub mod metrics;
pub mod metrics_endpoint;
pub mod queue;
pub mod records;
pub mod reload;
pub mod server;
pub mod subscribe;
pub mod tls;
pub mod validate;
mod waiters;
