//! The kafka-lease gateway: lock backends, partition reading, the lease table and the gRPC
//! service.
//!
//! Layers, bottom up (docs/ARCHITECTURE.md, "Module graph"; `tests/layering.rs` checks that
//! no module names one on its layer or above): [`coordination`] (locks, a crate of its own:
//! knows nothing of Kafka or gRPC); [`metrics`], [`progress`] and [`dispatch`] (a queue-mode
//! lease's progress as its commit carries it, and which of its records may go out now), [`records`] (records encoded straight from
//! librdkafka's buffers into a response's bytes), [`reload`]; [`error`], [`tls`], [`queue`] (the two kept in step, with dead letters and the
//! progress's brake); [`kafka`]
//! (reading and offsets; knows nothing of locks or gRPC), [`validate`], [`auth`]
//! (identities and the policy); [`lease`] (one lease); [`gateway`] (the lease table and the
//! operations in domain terms); [`subscribe`], [`calls`], [`metrics_endpoint`], [`dev`] (the mock cluster and an
//! in-process gateway over it); [`grpc`]
//! (the service, the one error-to-status mapping, and [`grpc::forward`]ing to other instances);
//! [`server`] (running it all, health, shutdown); [`config`] (the flags).

pub mod auth;
mod balance;
pub mod calls;
pub mod config;
/// The partition locks: a crate of its own, so that "knows nothing of Kafka or gRPC" is a
/// rule the compiler enforces.
pub use kafka_lease_coordination as coordination;
pub mod defects;
pub mod dev;
pub mod dispatch;
pub mod error;
pub mod gateway;
pub mod grpc;
pub mod kafka;
pub mod lease;
pub mod metrics;
pub mod metrics_endpoint;
pub mod progress;
pub mod queue;
pub mod records;
pub mod reload;
pub mod server;
pub mod subscribe;
pub mod tls;
pub mod validate;
mod waiters;
