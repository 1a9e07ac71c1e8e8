//! The kafka-lease gateway: lock backends, partition reading, the lease table and the gRPC
//! service.
//!
//! Layers, bottom up: [`coordination`] (locks; knows nothing of Kafka or gRPC), [`kafka`]
//! (reading and offsets; knows nothing of locks or gRPC), [`records`] (records encoded
//! straight from librdkafka's buffers into a response's bytes), [`lease`] and [`gateway`] (the
//! lease rules, on both), [`grpc`] (validation and the one error-to-status mapping),
//! [`forward`] (calls on leases other instances serve, sent on to them), [`tls`] and
//! [`auth`] (transport security, identities and the policy), and [`server`] (running it all,
//! health, shutdown).

pub mod auth;
mod balance;
pub mod calls;
pub mod config;
/// The partition locks: a crate of its own, so that "knows nothing of Kafka or gRPC" is a
/// rule the compiler enforces.
pub use kafka_lease_coordination as coordination;
pub mod dev;
pub mod error;
/// Forwarding between instances, at the path it had before it joined [`grpc`].
pub use grpc::forward;
pub mod gateway;
pub mod grpc;
pub mod kafka;
/// The operator's librdkafka properties, at the path they had before they joined
/// [`kafka::settings`].
pub use kafka::settings as kafka_config;
pub mod lease;
pub mod metrics;
pub mod metrics_endpoint;
pub mod records;
pub mod reload;
pub mod server;
pub mod subscribe;
pub mod tls;
pub mod validate;
mod waiters;
