//! Partition locks: who holds which (group, topic, partition), across every gateway instance.
//!
//! A [`LockBackend`] grants [`LockGrant`]s. Each grant carries a [`FencingToken`] taken from
//! the backend's own write index (Consul's Raft `ModifyIndex`), so tokens for one key only
//! ever grow, whichever instance acquired it and across restarts. The backend knows nothing
//! of Kafka or gRPC.
//!
//! Two backends implement the trait: [`consul::ConsulLocks`] for real deployments, and
//! [`memory::MemoryLocks`] for `kafka-lease dev` and unit tests. One contract test suite
//! (`tests/lock_contract.rs` of this crate) runs against both.

pub mod consul;
mod contract;
pub mod memory;

pub use contract::*;
