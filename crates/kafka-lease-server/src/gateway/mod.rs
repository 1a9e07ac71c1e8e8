//! The gateway: the lease table of one instance and the operations of the API in domain
//! terms (no gRPC here: the service in [`crate::grpc`] maps these to the proto).
//!
//! Invariant: a lease is in the table only while this instance holds its lock; it leaves the
//! table (and its partition stops being fetched) before the lock is released, so the next
//! holder never overlaps with it on this instance.
//!
//! Its seams, one file each: [`spec`] (the values taken and given), [`table`] (the lease
//! table and its exclusivity rules), [`acquire`] (waiting in a topic's line, one attempt at
//! one partition, opening the lease), [`end`] (how leases end and their locks go back),
//! [`ops`] (where a lease id is served, then Read, Seek, Commit, Release), [`list`]
//! (ListLeases, ListMembers, the metrics' view). This file holds the [`Gateway`] itself.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use tokio::sync::watch;

use crate::coordination::{unix_ms, HolderInfo, LockBackend, SessionState};
use crate::kafka::Kafka;
use crate::lease::Lease;
use crate::waiters::TopicWaiters;

mod acquire;
mod end;
mod list;
mod ops;
mod spec;
mod table;

pub use ops::Resolved;
pub use spec::{AcquireSpec, Granted, ListedLease, ListedMember, Reset, SeekTarget};
use table::Table;

/// What one gateway instance takes on at most, so one client cannot take what it has for
/// all (each is a flag; see the configuration table in docs/OPERATIONS.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Leases served at once (`--max-leases`).
    pub max_leases: usize,
    /// Acquires waiting for a partition at once (`--max-waiting-acquires`).
    pub max_waiting_acquires: usize,
    /// Leases (and Acquires in progress) of one client connection at once
    /// (`--max-leases-per-connection`).
    pub max_leases_per_connection: usize,
}

impl Limits {
    /// The defaults: the flags' defaults are these.
    pub const DEFAULT: Limits = Limits {
        max_leases: 10_000,
        max_waiting_acquires: 1_000,
        max_leases_per_connection: 1_000,
    };
}

impl Default for Limits {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// The gateway: one per instance.
pub struct Gateway {
    instance: String,
    /// Where other instances reach this one (`host:port`), recorded with every lock.
    address: Option<String>,
    locks: Arc<dyn LockBackend>,
    kafka: Kafka,
    limits: Limits,
    /// Acquires waiting for a partition right now.
    waiting: AtomicUsize,
    table: Mutex<Table>,
    /// The line of Acquires of each (group, topic) that has any.
    waiters: Mutex<HashMap<(String, String), Weak<TopicWaiters>>>,
    shutting_down: AtomicBool,
    /// Set to `true` at shutdown, to wake every waiting Acquire.
    stopping: watch::Sender<bool>,
    /// This gateway itself, for tasks that must not keep it alive.
    me: Weak<Gateway>,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field("instance", &self.instance)
            .finish()
    }
}

impl Gateway {
    /// Creates the gateway with the default [`Limits`] and starts the task that ends leases
    /// when the lock session is lost.
    pub fn new(instance: String, locks: Arc<dyn LockBackend>, kafka: Kafka) -> Arc<Self> {
        Self::with_limits(instance, locks, kafka, Limits::default())
    }

    /// [`Gateway::new`] with the given limits.
    pub fn with_limits(
        instance: String,
        locks: Arc<dyn LockBackend>,
        kafka: Kafka,
        limits: Limits,
    ) -> Arc<Self> {
        Self::serving(instance, None, locks, kafka, limits)
    }

    /// [`Gateway::with_limits`] for an instance that other instances reach at `address`
    /// (`host:port`), which every lock's holder record names.
    pub fn serving(
        instance: String,
        address: Option<String>,
        locks: Arc<dyn LockBackend>,
        kafka: Kafka,
        limits: Limits,
    ) -> Arc<Self> {
        let gateway = Arc::new_cyclic(|me| Self {
            instance,
            address,
            locks,
            kafka,
            limits,
            waiting: AtomicUsize::new(0),
            table: Mutex::new(Table::default()),
            waiters: Mutex::default(),
            shutting_down: AtomicBool::new(false),
            stopping: watch::channel(false).0,
            me: me.clone(),
        });
        let watcher = Arc::downgrade(&gateway);
        let mut session = gateway.locks.session_state();
        tokio::spawn(async move {
            loop {
                let state = session.borrow_and_update().clone();
                let Some(gateway) = watcher.upgrade() else {
                    return;
                };
                gateway.on_session_state(&state).await;
                drop(gateway);
                if session.changed().await.is_err() {
                    return;
                }
            }
        });
        gateway
    }

    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// The address other instances reach this one at, if it advertises one.
    pub fn address(&self) -> Option<&str> {
        self.address.as_deref()
    }

    pub fn kafka(&self) -> &Kafka {
        &self.kafka
    }

    pub fn locks(&self) -> &Arc<dyn LockBackend> {
        &self.locks
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Number of Acquires waiting for a partition on this instance.
    pub fn waiting_acquires(&self) -> usize {
        self.waiting.load(Ordering::SeqCst)
    }

    /// Number of leases this instance serves.
    pub fn lease_count(&self) -> usize {
        self.table().len()
    }

    /// The id of the backend's live session, if there is one.
    fn live_session(&self) -> Option<String> {
        match &*self.locks.session_state().borrow() {
            SessionState::Live { id } => Some(id.clone()),
            SessionState::Lost { .. } => None,
        }
    }

    fn holder_of(&self, lease: &Lease) -> HolderInfo {
        HolderInfo {
            member: lease.member.clone(),
            gateway: self.instance.clone(),
            lease_ref: lease.lease_ref.clone(),
            acquired_at_ms: unix_ms(lease.acquired_at),
            ttl_ms: lease.ttl.as_millis() as u64,
            address: self.address.clone().unwrap_or_default(),
            // Only for this instance's own view of the line, which does not look at it.
            subscriber: String::new(),
        }
    }

    /// Turns `true` when the gateway starts shutting down.
    pub fn stopping(&self) -> watch::Receiver<bool> {
        self.stopping.subscribe()
    }

    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }
}
