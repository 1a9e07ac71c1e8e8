//! The lease table of one gateway instance and the operations of the API: Acquire, Read,
//! Seek, Commit, Release and ListLeases, in domain terms (no gRPC here).
//!
//! Invariant: a lease is in the table only while this instance holds its lock; it leaves the
//! table (and its partition stops being fetched) before the lock is released, so the next
//! holder never overlaps with it on this instance.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, SystemTime};

use kafka_lease_proto::v1;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::Instrument;

use crate::coordination::{
    Acquisition, FencingToken, HeldPartition, HolderInfo, LockBackend, LockGrant, LockKey,
    MemberRecord, SessionState,
};
use crate::error::{BusyPartition, EndReason, LeaseError};
use crate::kafka::Kafka;
use crate::lease::{
    lease_ref, new_lease_id, serving_instance, Lease, LeaseParts, ReadFrom, ReadLimits, ReadStream,
};
use crate::waiters::{TopicQueue, Wants};

/// Where a lease starts when its group has no committed offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reset {
    Earliest,
    Latest,
}

/// A validated Acquire.
#[derive(Clone, Debug)]
pub struct AcquireSpec {
    pub group: String,
    pub topic: String,
    pub partition: Option<i32>,
    pub member: String,
    pub ttl: Duration,
    pub wait: Duration,
    pub reset: Reset,
    /// The client connection the Acquire came on (its peer address), for
    /// [`Limits::max_leases_per_connection`]; `None` for callers without one.
    pub via: Option<std::net::SocketAddr>,
    /// The member id of the subscription the lease is for; empty for an Acquire.
    pub subscriber: String,
    /// The caller's identity, when it has one: the lease answers only it.
    pub owner: Option<String>,
}

/// What Acquire grants.
#[derive(Clone, Debug)]
pub struct Granted {
    pub lease_id: String,
    pub key: LockKey,
    pub fencing_token: u64,
    pub offset: i64,
    pub high_watermark: i64,
    pub expires_at: SystemTime,
    pub ttl: Duration,
    pub gateway: String,
}

/// A validated Seek target.
#[derive(Clone, Copy, Debug)]
pub enum SeekTarget {
    Offset(i64),
    TimestampMs(i64),
    Earliest,
    Latest,
    Committed,
}

/// One row of ListLeases.
#[derive(Clone, Debug)]
pub struct ListedLease {
    pub key: LockKey,
    pub holder: HolderInfo,
    pub token: u64,
    /// Present where this instance serves the lease.
    pub local: Option<crate::lease::LeaseSnapshot>,
}

/// How many ended leases are remembered, so late calls get "lease expired" or "lease lost"
/// rather than "unknown lease".
const ENDED_MEMORY: usize = 10_000;

/// The local lease table, and the rules that keep leases on this instance exclusive. Its
/// methods are the only place those rules are written down:
///
/// - a key has at most one live lease here (`by_key`);
/// - a key is *claimed* by at most one Acquire attempt at a time (`claimed`), because the
///   lock backend cannot tell two attempts by the same session apart;
/// - a key this instance may still hold in the backend without a lease (a lease ended but its
///   release is not confirmed, or an acquire whose answer was lost) is *unreleased*, and
///   cannot be claimed until the release is confirmed or the session that held it is gone.
///   Otherwise the backend would hand the key straight back to this session (with the old
///   token), and the release in flight would then free it under the new lease.
#[derive(Default)]
struct Table {
    leases: HashMap<String, Arc<Lease>>,
    by_key: HashMap<LockKey, String>,
    claimed: HashSet<LockKey>,
    /// Key → the lock session that may still hold it.
    unreleased: HashMap<LockKey, String>,
    /// Client connection → its leases and claims here.
    per_connection: HashMap<std::net::SocketAddr, usize>,
    /// Lease id → the connection it was acquired on.
    lease_via: HashMap<String, std::net::SocketAddr>,
    ended: HashMap<String, EndReason>,
    ended_order: VecDeque<String>,
}

/// Why an Acquire attempt could not claim a key on this instance.
enum LocalBusy {
    /// A live lease here holds it, another attempt is on it, or its release is not
    /// confirmed yet.
    Taken,
    /// This instance serves as many leases as it may.
    Full,
    /// The connection the Acquire came on has as many leases here as it may.
    ConnectionFull,
}

impl Table {
    /// Claims `key` for one Acquire attempt, unless this instance leases it, is trying it,
    /// or may still hold it in the backend.
    fn claim(
        &mut self,
        key: &LockKey,
        limits: &Limits,
        via: Option<std::net::SocketAddr>,
    ) -> Result<(), LocalBusy> {
        if self.by_key.contains_key(key) {
            return Err(LocalBusy::Taken);
        }
        if self.leases.len() + self.claimed.len() >= limits.max_leases {
            return Err(LocalBusy::Full);
        }
        if via.is_some_and(|via| {
            self.per_connection.get(&via).copied().unwrap_or(0) >= limits.max_leases_per_connection
        }) {
            return Err(LocalBusy::ConnectionFull);
        }
        if self.unreleased.contains_key(key) || !self.claimed.insert(key.clone()) {
            return Err(LocalBusy::Taken);
        }
        if let Some(via) = via {
            *self.per_connection.entry(via).or_default() += 1;
        }
        Ok(())
    }

    /// One lease or claim fewer for the connection `via`.
    fn uncount(&mut self, via: Option<std::net::SocketAddr>) {
        let Some(via) = via else { return };
        if let Some(count) = self.per_connection.get_mut(&via) {
            *count -= 1;
            if *count == 0 {
                self.per_connection.remove(&via);
            }
        }
    }

    /// Whether this instance leases `key`, is trying it, or may still hold it in the backend.
    fn blocks(&self, key: &LockKey) -> bool {
        self.by_key.contains_key(key)
            || self.claimed.contains(key)
            || self.unreleased.contains_key(key)
    }

    /// Ends a claim that produced no lease. `unreleased_by` names the session that may hold
    /// the key anyway (an acquire whose outcome is unknown).
    fn unclaim(
        &mut self,
        key: &LockKey,
        unreleased_by: Option<&str>,
        via: Option<std::net::SocketAddr>,
    ) {
        self.claimed.remove(key);
        self.uncount(via);
        if let Some(session) = unreleased_by {
            self.unreleased(key, session);
        }
    }

    /// `session` may hold `key` in the backend with no lease behind it: the key cannot be
    /// claimed until [`Table::released`].
    fn unreleased(&mut self, key: &LockKey, session: &str) {
        self.unreleased.insert(key.clone(), session.to_string());
    }

    /// Turns a claim into a live lease (which keeps the claim's count on its connection).
    fn install(&mut self, lease: Arc<Lease>, via: Option<std::net::SocketAddr>) {
        self.claimed.remove(&lease.key);
        if let Some(via) = via {
            self.lease_via.insert(lease.id.clone(), via);
        }
        self.by_key.insert(lease.key.clone(), lease.id.clone());
        self.leases.insert(lease.id.clone(), lease);
    }

    /// Takes an ended lease out: its key stays unreleased until [`Table::released`].
    fn remove_ended(&mut self, lease: &Lease, reason: EndReason) {
        if self.leases.remove(&lease.id).is_some() {
            let via = self.lease_via.remove(&lease.id);
            self.uncount(via);
        }
        if self.by_key.get(&lease.key) == Some(&lease.id) {
            self.by_key.remove(&lease.key);
        }
        self.unreleased(&lease.key, lease.session_id());
        if self.ended.insert(lease.id.clone(), reason).is_none() {
            self.ended_order.push_back(lease.id.clone());
        }
        while self.ended_order.len() > ENDED_MEMORY {
            if let Some(old) = self.ended_order.pop_front() {
                self.ended.remove(&old);
            }
        }
    }

    /// The backend confirmed that `session` no longer holds `key`.
    fn released(&mut self, key: &LockKey, session: &str) {
        if self.unreleased.get(key).is_some_and(|s| s == session) {
            self.unreleased.remove(key);
        }
    }

    /// The backend session is now `live` (or none): locks of every other session are void,
    /// so their keys can be claimed again (with a new token).
    fn session_changed(&mut self, live: Option<&str>) {
        self.unreleased
            .retain(|_, session| Some(session.as_str()) == live);
    }
}

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

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_leases: 10_000,
            max_waiting_acquires: 1_000,
            max_leases_per_connection: 1_000,
        }
    }
}

/// Counts an Acquire as waiting for as long as it lives.
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
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
    /// The queue of Acquires of each (group, topic) that has any.
    queues: Mutex<HashMap<(String, String), Weak<TopicQueue>>>,
    /// (group, member id) of every subscription with a live stream on this instance.
    /// Its task's way in while the member is detached (its stream gone, within its
    /// session grace); `None` while a stream is attached.
    members: Mutex<HashMap<(String, String), Option<crate::subscribe::Reattach>>>,
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

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Ends an Acquire attempt's claim on a key however the attempt finishes (an error, or the
/// task being dropped), unless the claim became a lease.
struct Claim<'a> {
    gateway: &'a Gateway,
    key: LockKey,
    /// Set when the backend may hold the key for this instance although no grant came back.
    unreleased_by: Option<String>,
    via: Option<std::net::SocketAddr>,
    installed: bool,
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        if self.installed {
            return;
        }
        self.gateway
            .table()
            .unclaim(&self.key, self.unreleased_by.as_deref(), self.via);
        match self.unreleased_by.take() {
            Some(session) => self.gateway.spawn_release_key(self.key.clone(), session),
            // Free again here: a waiter may take it.
            None => self.gateway.freed(&self.key),
        }
    }
}

/// A lock grant not yet owned by a lease. Dropped unconsumed (the attempt failed or its task
/// was cancelled), it hands the grant to the background releaser, which retries until the
/// backend confirms.
struct GrantGuard<'a> {
    gateway: &'a Gateway,
    grant: Option<LockGrant>,
}

impl GrantGuard<'_> {
    fn key(&self) -> &LockKey {
        self.grant
            .as_ref()
            .map(LockGrant::key)
            .expect("a guard holds its grant until taken")
    }

    fn take(mut self) -> LockGrant {
        self.grant
            .take()
            .expect("a guard holds its grant until taken")
    }
}

impl Drop for GrantGuard<'_> {
    fn drop(&mut self) {
        if let Some(grant) = self.grant.take() {
            let session = grant.session().to_string();
            self.gateway.table().unreleased(grant.key(), &session);
            self.gateway.spawn_release_key(grant.key().clone(), session);
        }
    }
}

/// How long one round of a topic watch's blocking query may wait.
const TOPIC_WATCH_WAIT: Duration = Duration::from_secs(60);

/// How long an Acquire leaves a partition alone after finding it taken on this very
/// instance (a lease, an attempt, or a release not yet confirmed) since it was offered.
const LOCAL_PAUSE: Duration = Duration::from_millis(20);

/// The longest a partition is left alone after a lock-delay refusal (the longest lock-delay
/// the gateway accepts); the backend normally says less.
const DELAY_CAP: Duration = Duration::from_secs(60);

/// How one attempt at one partition went.
enum Attempt {
    /// A lease, and the lock as the topic's view should now show it.
    Granted(Box<Granted>, HeldPartition),
    /// Another instance holds it.
    Held,
    /// Free, but under lock-delay.
    Delayed,
    /// Taken on this instance since it was offered.
    Local,
}

/// How long the end of a lease waits in the foreground for its commits in flight to settle
/// before it leaves the rest to a background task.
const COMMIT_SETTLE_WAIT: Duration = Duration::from_secs(5);

/// How long the background releaser waits between attempts at most.
const RELEASE_RETRY_MAX: Duration = Duration::from_secs(2);

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
            queues: Mutex::default(),
            members: Mutex::default(),
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

    /// The live details of the lease this instance serves on `key` under `token`, if it
    /// does: for another instance's ListLeases.
    /// Every lease this instance serves, with its live state (for the metrics).
    pub fn local_leases(&self) -> Vec<(LockKey, crate::lease::LeaseSnapshot)> {
        let leases: Vec<Arc<Lease>> = self.table().leases.values().cloned().collect();
        leases
            .into_iter()
            .map(|lease| {
                let mut snapshot = lease.snapshot();
                // The partition keeps being fetched while no Read is open, so librdkafka's
                // watermark is fresher than the one the last batch carried.
                if let Some(high) = lease
                    .group_client
                    .cached_high_watermark(&lease.key.topic, lease.key.partition)
                {
                    snapshot.high_watermark = snapshot.high_watermark.max(high);
                }
                (lease.key.clone(), snapshot)
            })
            .collect()
    }

    pub fn describe(&self, key: &LockKey, token: u64) -> Option<crate::lease::LeaseSnapshot> {
        let table = self.table();
        table
            .by_key
            .get(key)
            .and_then(|id| table.leases.get(id))
            .filter(|l| l.token.0 == token)
            .map(|l| l.snapshot())
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
        self.table().leases.len()
    }

    /// Ends every lease whose lock was granted under a session that is no longer live.
    async fn on_session_state(&self, state: &SessionState) {
        let stale: Vec<Arc<Lease>> = {
            let mut table = self.table();
            table.session_changed(match state {
                SessionState::Live { id } => Some(id.as_str()),
                SessionState::Lost { .. } => None,
            });
            table
                .leases
                .values()
                .filter(|lease| match state {
                    SessionState::Live { id } => lease.session_id() != id,
                    SessionState::Lost { .. } => true,
                })
                .cloned()
                .collect()
        };
        // Keys the old session may have held are claimable again here: offer them.
        let queues: Vec<Arc<TopicQueue>> = self
            .queues
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter_map(Weak::upgrade)
            .collect();
        for queue in queues {
            queue.dispatch();
        }
        let reason = match state {
            SessionState::Live { .. } => "the gateway's Consul session was replaced".to_string(),
            SessionState::Lost { reason } => reason.clone(),
        };
        // All at once: every one of them must stop before the fence window is over, and
        // ending one never waits on another.
        futures::future::join_all(stale.iter().map(|lease| {
            tracing::warn!(parent: &lease.span, %reason, "lock session lost; ending lease");
            self.end_lease(lease, EndReason::Lost(reason.clone()))
        }))
        .await;
    }

    /// Grants a lease, waiting up to `spec.wait` for a partition to become free. The Acquire
    /// takes a place in its topic's queue and tries only the partition the queue offers it
    /// (see [`crate::waiters`]): a free one, offered to the oldest Acquire that wants it.
    pub async fn acquire(&self, spec: AcquireSpec) -> Result<Granted, LeaseError> {
        if self.shutting_down.load(Ordering::SeqCst) {
            return Err(LeaseError::ShuttingDown);
        }
        let partition_count = self
            .kafka
            .partition_count(&spec.topic, spec.partition)
            .await?;
        let wants = match spec.partition {
            Some(p) if p >= partition_count => {
                return Err(LeaseError::PartitionNotFound {
                    topic: spec.topic.clone(),
                    partition: p,
                    partition_count,
                })
            }
            Some(p) => Wants::One(p),
            // Start at a random partition, so clients that start together spread out
            // instead of all contending for partition 0.
            None => Wants::Any {
                start: rand::random_range(0..partition_count),
                count: partition_count,
            },
        };
        let deadline = Instant::now() + spec.wait;
        let ticket = self.topic_queue(&spec.group, &spec.topic).enqueue(wants);
        let queue = ticket.queue().clone();
        let mut stopping = self.stopping.subscribe();
        let mut waiting: Option<Waiting<'_>> = None;
        loop {
            if self.shutting_down.load(Ordering::SeqCst) {
                return Err(LeaseError::ShuttingDown);
            }
            if queue.is_watched() {
                queue.dispatch();
            } else {
                // Nobody waits on this topic here, so nothing keeps its view current: read it.
                queue
                    .refresh(
                        self.locks
                            .topic_view(&spec.group, &spec.topic, None, Duration::ZERO),
                    )
                    .await?;
            }
            if let Some(partition) = ticket.offer() {
                let key = LockKey::new(&spec.group, &spec.topic, partition);
                match self.attempt(&spec, key.clone()).await? {
                    Attempt::Granted(granted, held) => {
                        queue.mark_held(partition, held);
                        return Ok(*granted);
                    }
                    Attempt::Held => queue.mark_held(
                        partition,
                        HeldPartition {
                            token: FencingToken(0),
                            holder: None,
                        },
                    ),
                    Attempt::Delayed => {
                        let left = self.locks.wait_cut(&key, DELAY_CAP);
                        queue.mark_delayed(partition, Instant::now() + left);
                    }
                    // Taken here a moment ago (a lease, an attempt, a release in flight):
                    // look again shortly.
                    Attempt::Local => queue.mark_delayed(partition, Instant::now() + LOCAL_PAUSE),
                }
                ticket.decline();
                continue;
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(self.busy(&spec, &queue, wants));
            }
            // Every partition it wants is taken: wait, if this gateway may take one more
            // waiter, for an offer from the topic's shared watch.
            if waiting.is_none() {
                if self.waiting.fetch_add(1, Ordering::SeqCst) >= self.limits.max_waiting_acquires {
                    self.waiting.fetch_sub(1, Ordering::SeqCst);
                    return Err(LeaseError::LimitReached {
                        flag: "--max-waiting-acquires",
                        limit: self.limits.max_waiting_acquires,
                        what: "as many Acquires as this gateway allows are already waiting \
                               for a partition"
                            .into(),
                    });
                }
                waiting = Some(Waiting(&self.waiting));
            }
            queue.ensure_watch(|from| self.spawn_topic_watch(&queue, &spec, from));
            let wake_at = queue.next_delay_end().map_or(deadline, |t| t.min(deadline));
            tokio::select! {
                () = ticket.offered() => {}
                () = tokio::time::sleep_until(wake_at) => {}
                _ = stopping.changed() => {}
            }
        }
    }

    /// The Busy answer: who holds each partition the Acquire wanted, as far as this gateway
    /// knows (its own leases in full, others from the topic's view).
    fn busy(&self, spec: &AcquireSpec, queue: &TopicQueue, wants: Wants) -> LeaseError {
        let partitions = wants.partitions();
        let mut busy: Vec<BusyPartition> = queue
            .holders(&partitions)
            .into_iter()
            .map(|(partition, holder)| {
                let key = LockKey::new(&spec.group, &spec.topic, partition);
                let local = {
                    let table = self.table();
                    table
                        .by_key
                        .get(&key)
                        .and_then(|id| table.leases.get(id))
                        .cloned()
                };
                match local {
                    Some(lease) => BusyPartition {
                        partition,
                        holder: Some(self.holder_of(&lease)),
                        expires_at: Some(lease.snapshot().expires_at),
                    },
                    None => BusyPartition {
                        partition,
                        holder,
                        expires_at: None,
                    },
                }
            })
            .collect();
        busy.sort_by_key(|b| b.partition);
        LeaseError::Busy {
            group: spec.group.clone(),
            topic: spec.topic.clone(),
            busy,
        }
    }

    /// One attempt at one partition, run to its end in a task of its own: once the lock
    /// request is out, the attempt must finish (a lease, or the lock given back) even if the
    /// Acquire call is cancelled (its deadline, its client gone). A lease granted after the
    /// caller went away is ended at once, so no key stays held without a lease.
    async fn attempt(&self, spec: &AcquireSpec, key: LockKey) -> Result<Attempt, LeaseError> {
        let Some(gateway) = self.me.upgrade() else {
            return Err(LeaseError::ShuttingDown);
        };
        let spec = spec.clone();
        let (answer, asked) = tokio::sync::oneshot::channel();
        tokio::spawn(
            async move {
                let outcome = gateway.try_partition(&spec, &key).await;
                if let Err(Ok(Attempt::Granted(granted, _))) = answer.send(outcome) {
                    let lease = gateway.table().leases.get(&granted.lease_id).cloned();
                    if let Some(lease) = lease {
                        tracing::info!(parent: &lease.span, "the Acquire call went away; ending its lease");
                        gateway.end_lease(&lease, EndReason::Abandoned).await;
                    }
                }
            }
            .in_current_span(),
        );
        asked.await.unwrap_or(Err(LeaseError::ShuttingDown))
    }

    /// One attempt at one partition.
    async fn try_partition(
        &self,
        spec: &AcquireSpec,
        key: &LockKey,
    ) -> Result<Attempt, LeaseError> {
        let claimed = self.table().claim(key, &self.limits, spec.via);
        if let Err(local) = claimed {
            return match local {
                LocalBusy::Full => Err(LeaseError::LimitReached {
                    flag: "--max-leases",
                    limit: self.limits.max_leases,
                    what: "this gateway serves as many leases as it may".into(),
                }),
                LocalBusy::ConnectionFull => Err(LeaseError::LimitReached {
                    flag: "--max-leases-per-connection",
                    limit: self.limits.max_leases_per_connection,
                    what: format!(
                        "the client connection from {} holds as many leases on this gateway \
                         as one connection may",
                        spec.via.map_or_else(|| "?".to_string(), |v| v.to_string())
                    ),
                }),
                LocalBusy::Taken => Ok(Attempt::Local),
            };
        }
        let mut claim = Claim {
            gateway: self,
            key: key.clone(),
            unreleased_by: None,
            via: spec.via,
            installed: false,
        };
        // The group's Kafka client first (held until the attempt ends, so it cannot be closed
        // as idle meanwhile): a gateway at its group limit refuses before it touches Consul.
        let _group_client = self.kafka.group(&key.group)?;
        let id = new_lease_id(&self.instance);
        let holder = HolderInfo {
            member: spec.member.clone(),
            gateway: self.instance.clone(),
            lease_ref: lease_ref(&id).to_string(),
            acquired_at_ms: now_ms(),
            ttl_ms: spec.ttl.as_millis() as u64,
            address: self.address.clone().unwrap_or_default(),
            subscriber: spec.subscriber.clone(),
        };
        let session = self.live_session();
        let grant = match self.locks.try_acquire(key, &holder).await {
            Ok(Acquisition::Acquired(grant)) => grant,
            Ok(Acquisition::Held) => return Ok(Attempt::Held),
            Ok(Acquisition::Delayed) => return Ok(Attempt::Delayed),
            Err(err) => {
                // The request may have reached Consul and taken the lock although no answer
                // came back: keep the key blocked here and make sure it is free.
                claim.unreleased_by = session;
                return Err(err.into());
            }
        };
        // The lock is ours. From here on, whatever happens gives it back unless a lease
        // takes it over.
        let grant = GrantGuard {
            gateway: self,
            grant: Some(grant),
        };
        let token = grant
            .grant
            .as_ref()
            .map_or(FencingToken(0), LockGrant::token);
        let granted = self.open_lease(spec, id, holder.clone(), grant).await?;
        claim.installed = true;
        let held = HeldPartition {
            token,
            holder: Some(holder),
        };
        Ok(Attempt::Granted(Box::new(granted), held))
    }

    /// The queue of Acquires on (`group`, `topic`), created if there is none.
    fn topic_queue(&self, group: &str, topic: &str) -> Arc<TopicQueue> {
        let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        let id = (group.to_string(), topic.to_string());
        if let Some(queue) = queues.get(&id).and_then(Weak::upgrade) {
            return queue;
        }
        queues.retain(|_, q| q.strong_count() > 0);
        let (gateway, probe) = (self.me.clone(), LockKey::new(group, topic, 0));
        let queue = TopicQueue::new(Box::new(move |partition| {
            let key = LockKey {
                partition,
                ..probe.clone()
            };
            gateway
                .upgrade()
                .is_some_and(|gateway| gateway.table().blocks(&key))
        }));
        queues.insert(id, Arc::downgrade(&queue));
        queue
    }

    /// This instance no longer holds `key`: offer it to a waiter here at once.
    fn freed(&self, key: &LockKey) {
        let queue = self
            .queues
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&(key.group.clone(), key.topic.clone()))
            .and_then(Weak::upgrade);
        if let Some(queue) = queue {
            queue.mark_free(key.partition);
        }
    }

    /// The shared watch of a topic: one blocking query at a time, however many Acquires
    /// wait on the topic here, each answer handed to the queue (which offers what it shows
    /// free). It ends with the queue.
    fn spawn_topic_watch(
        &self,
        queue: &Arc<TopicQueue>,
        spec: &AcquireSpec,
        from: u64,
    ) -> tokio::task::JoinHandle<()> {
        let (weak, locks) = (Arc::downgrade(queue), self.locks.clone());
        let (group, topic) = (spec.group.clone(), spec.topic.clone());
        tokio::spawn(async move {
            let mut from = from;
            loop {
                match locks
                    .topic_view(&group, &topic, Some(from), TOPIC_WATCH_WAIT)
                    .await
                {
                    Ok(view) => {
                        let Some(queue) = weak.upgrade() else { return };
                        from = view.index;
                        queue.set_view(view);
                    }
                    Err(err) => {
                        // The waiters keep their places; offers resume once Consul answers.
                        tracing::debug!(%topic, %group, error = %err, "topic watch failed; retrying");
                        tokio::time::sleep(Duration::from_millis(500)).await;
                        let Some(queue) = weak.upgrade() else { return };
                        from = queue.index();
                    }
                }
            }
        })
    }

    /// The id of the backend's live session, if there is one.
    fn live_session(&self) -> Option<String> {
        match &*self.locks.session_state().borrow() {
            SessionState::Live { id } => Some(id.clone()),
            SessionState::Lost { .. } => None,
        }
    }

    /// Makes sure `session` no longer holds `key`, in the background: asks the backend what
    /// it holds and releases that, retrying until the backend answers or the session is gone
    /// (its locks are then void). The key stays unreleased in the table until then.
    fn spawn_release_key(&self, key: LockKey, session: String) {
        let gateway = self.me.clone();
        tokio::spawn(async move {
            let mut pause = Duration::from_millis(100);
            loop {
                let Some(gateway) = gateway.upgrade() else {
                    return;
                };
                if gateway.live_session().as_deref() != Some(session.as_str()) {
                    gateway.table().released(&key, &session);
                    gateway.freed(&key);
                    return;
                }
                let outcome = match gateway.locks.held_grant(&key).await {
                    Ok(None) => Ok(()),
                    Ok(Some(grant)) => gateway.locks.release(grant).await,
                    Err(err) => Err(err),
                };
                match outcome {
                    Ok(()) => {
                        gateway.table().released(&key, &session);
                        gateway.freed(&key);
                        tracing::info!(key = %key, "lock released after an earlier attempt failed");
                        return;
                    }
                    Err(err) => {
                        tracing::warn!(key = %key, error = %err, retry_in = ?pause, "releasing a lock failed; retrying");
                    }
                }
                drop(gateway);
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(RELEASE_RETRY_MAX);
            }
        });
    }

    fn holder_of(&self, lease: &Lease) -> HolderInfo {
        HolderInfo {
            member: lease.member.clone(),
            gateway: self.instance.clone(),
            lease_ref: lease.lease_ref.clone(),
            acquired_at_ms: lease
                .acquired_at
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            ttl_ms: lease.ttl.as_millis() as u64,
            address: self.address.clone().unwrap_or_default(),
            // Only for this instance's own view of the queue, which does not look at it.
            subscriber: String::new(),
        }
    }

    /// Finds where the lease starts, starts fetching and puts the lease in the table. On
    /// failure the guard gives the lock back.
    async fn open_lease(
        &self,
        spec: &AcquireSpec,
        id: String,
        holder: HolderInfo,
        grant: GrantGuard<'_>,
    ) -> Result<Granted, LeaseError> {
        let key = grant.key().clone();
        let prepared = async {
            let group_client = self.kafka.group(&key.group)?;
            // All after the lock, and independent: one round trip to the brokers, not three.
            // (The committed offset must be read after the lock: the previous holder's
            // commits have settled by then.) The topic's leaders, through the group's client:
            // so the partition is fetched as soon as it is opened (see
            // `GroupClient::learn_topic`); only a speed-up, librdkafka finds them by itself
            // later.
            let learned = async {
                if let Err(err) = group_client.learn_topic(&key.topic).await {
                    tracing::debug!(topic = %key.topic, error = %err, "topic lookup failed; the partition's first fetch may wait for librdkafka's own");
                }
                Ok::<(), LeaseError>(())
            };
            let ((low, high), committed, ()) = tokio::try_join!(
                self.kafka.watermarks(&key.topic, key.partition),
                group_client.committed(&key.topic, key.partition),
                learned,
            )?;
            let committed = committed.map(|(offset, _)| offset);
            let start = match committed {
                // A committed offset that retention has passed, or that is beyond the log
                // (the topic was recreated), falls back to the reset policy, as Kafka's
                // auto.offset.reset does.
                Some(offset) if (low..=high).contains(&offset) => offset,
                _ => match spec.reset {
                    Reset::Earliest => low,
                    Reset::Latest => high,
                },
            };
            let feed = group_client.open_partition(&key.topic, key.partition, start)?;
            Ok::<_, LeaseError>((start, committed, high, feed))
        }
        .await;
        let (start, committed, high, feed) = prepared?;
        let grant = grant.take();
        let token = grant.token();
        let lease = Lease::new(LeaseParts {
            id: id.clone(),
            grant,
            member: spec.member.clone(),
            owner: spec.owner.clone(),
            ttl: spec.ttl,
            acquired_at: holder.acquired_at(),
            position: start,
            committed,
            high_watermark: high,
            feed,
            locks: self.locks.clone(),
        });
        self.table().install(lease.clone(), spec.via);
        metrics::counter!(crate::metrics::LEASES_GRANTED).increment(1);
        tracing::info!(parent: &lease.span, member = %spec.member, offset = start, "lease granted");
        self.spawn_supervisor(lease.clone());
        let snapshot = lease.snapshot();
        Ok(Granted {
            lease_id: id,
            key,
            fencing_token: token.0,
            offset: start,
            high_watermark: high,
            expires_at: snapshot.expires_at,
            ttl: spec.ttl,
            gateway: self.instance.clone(),
        })
    }

    /// Ends the lease when it has been idle past its TTL.
    fn spawn_supervisor(&self, lease: Arc<Lease>) {
        let span = lease.span.clone();
        let gateway = self.me.clone();
        tokio::spawn(
            async move {
                if lease.expired().await {
                    if let Some(gateway) = gateway.upgrade() {
                        tracing::info!("lease expired");
                        gateway.end_lease(&lease, EndReason::Expired).await;
                    }
                }
            }
            .instrument(span),
        );
    }

    /// Ends a lease: out of the table, commits in flight settled, partition fetching
    /// stopped, lock released. Safe to call more than once; only the first call does
    /// anything.
    ///
    /// The lock is released only once no commit of the lease can still land (the commit
    /// gate), so a successor never sees its committed offset overwritten by this lease. That
    /// wait is bounded by librdkafka's request timeout; the caller waits for it at most
    /// [`COMMIT_SETTLE_WAIT`], after which the rest happens in the background and the key
    /// stays held (and blocked here) until it is done. The first release attempt is awaited
    /// (so that after Release returns, a successor's Acquire succeeds at once); if it fails,
    /// the background releaser retries until Consul confirms or the session is gone, and the
    /// key stays blocked on this instance until then (see [`Table`]).
    pub async fn end_lease(&self, lease: &Arc<Lease>, reason: EndReason) {
        if !lease.mark_ended(reason.clone()) {
            return;
        }
        metrics::counter!(crate::metrics::LEASES_ENDED, "reason" => reason.label()).increment(1);
        self.table().remove_ended(lease, reason.clone());
        match tokio::time::timeout(COMMIT_SETTLE_WAIT, lease.commits_settled()).await {
            Ok(_settled) => self.dismantle_and_release(lease).await,
            Err(_) => {
                tracing::warn!(parent: &lease.span, "a commit is still in flight; the lock is released once it settles");
                let (gateway, lease) = (self.me.clone(), lease.clone());
                tokio::spawn(async move {
                    let _settled = lease.commits_settled().await;
                    if let Some(gateway) = gateway.upgrade() {
                        gateway.dismantle_and_release(&lease).await;
                    }
                });
            }
        }
        tracing::info!(parent: &lease.span, %reason, "lease ended");
    }

    /// Stops fetching the partition (so a successor on this instance can assign it again),
    /// then releases the lease's lock.
    async fn dismantle_and_release(&self, lease: &Lease) {
        let Some(grant) = lease.dismantle().await else {
            self.table().released(&lease.key, lease.session_id());
            self.freed(&lease.key);
            return;
        };
        let (key, session) = (grant.key().clone(), grant.session().to_string());
        match self.locks.release(grant).await {
            Ok(()) => {
                self.table().released(&key, &session);
                self.freed(&key);
            }
            Err(err) => {
                tracing::warn!(parent: &lease.span, error = %err, "explicit lock release failed; retrying in the background");
                self.spawn_release_key(key, session);
            }
        }
    }

    /// The lease a call names, or why there is none: LEASE_ENDED for one this instance served,
    /// WRONG_GATEWAY naming the instance the id says serves it, NOT_FOUND otherwise.
    pub fn lookup(&self, lease_id: &str) -> Result<Arc<Lease>, LeaseError> {
        let reference = lease_ref(lease_id).to_string();
        {
            let table = self.table();
            if let Some(lease) = table.leases.get(lease_id) {
                return Ok(lease.clone());
            }
            if let Some(reason) = table.ended.get(lease_id) {
                return Err(LeaseError::LeaseEnded {
                    lease_ref: reference,
                    reason: reason.clone(),
                });
            }
        }
        // Not ours: the id names the instance that serves it. Answered from the id alone, so
        // that unknown ids cost no look at Consul (a client sending made-up ids cannot make
        // the gateway scan every lock), and the answer does not depend on Consul being
        // reachable.
        match serving_instance(lease_id) {
            Some(instance) if instance != self.instance => Err(LeaseError::WrongGateway {
                lease_ref: reference,
                gateway: instance.to_string(),
            }),
            _ => Err(LeaseError::LeaseNotFound {
                lease_ref: reference,
            }),
        }
    }

    /// The instance a lease id names, when this instance does not know the lease and the
    /// id names another one: where a call on it is to be forwarded.
    pub fn served_elsewhere(&self, lease_id: &str) -> Option<String> {
        match self.lookup(lease_id) {
            Err(LeaseError::WrongGateway { gateway, .. }) => Some(gateway),
            _ => None,
        }
    }

    /// Opens a Read on a lease, superseding any open one: at `from_offset` (checked against
    /// the partition's range, as a Seek to it is) or at the lease's resume point. With
    /// `if_seek_epoch`, `from_offset` counts only while the lease is still at that epoch.
    pub async fn read(
        &self,
        lease_id: &str,
        limits: ReadLimits,
        from_offset: Option<i64>,
        if_seek_epoch: Option<u64>,
    ) -> Result<ReadStream, LeaseError> {
        let lease = self.lookup(lease_id)?;
        lease.fenced()?;
        lease.touch()?;
        let from = from_offset.map(|offset| ReadFrom {
            offset,
            if_seek_epoch,
        });
        if let Some(from) = from.filter(|from| lease.still_at(from.if_seek_epoch)) {
            self.check_in_range(&lease, from.offset).await?;
        }
        lease.open_read(limits, from)
    }

    /// Fails with OUT_OF_RANGE unless `offset` lies between the partition's log start offset
    /// and its high watermark, inclusive.
    async fn check_in_range(&self, lease: &Lease, offset: i64) -> Result<(), LeaseError> {
        let (topic, partition) = (lease.key.topic.as_str(), lease.key.partition);
        let (low, high) = self.kafka.watermarks(topic, partition).await?;
        lease.note_high_watermark(high);
        if (low..=high).contains(&offset) {
            Ok(())
        } else {
            Err(LeaseError::OffsetOutOfRange {
                topic: topic.to_string(),
                partition,
                offset,
                low,
                high,
            })
        }
    }

    /// Repositions a lease; returns the resolved offset and the new seek epoch.
    pub async fn seek(&self, lease_id: &str, target: SeekTarget) -> Result<(i64, u64), LeaseError> {
        let lease = self.lookup(lease_id)?;
        lease.fenced()?;
        lease.touch()?;
        let (topic, partition) = (lease.key.topic.as_str(), lease.key.partition);
        let (low, high) = self.kafka.watermarks(topic, partition).await?;
        lease.note_high_watermark(high);
        let offset = match target {
            SeekTarget::Offset(offset) => {
                if !(low..=high).contains(&offset) {
                    return Err(LeaseError::OffsetOutOfRange {
                        topic: topic.to_string(),
                        partition,
                        offset,
                        low,
                        high,
                    });
                }
                offset
            }
            SeekTarget::Earliest => low,
            SeekTarget::Latest => high,
            SeekTarget::TimestampMs(ms) => self
                .kafka
                .offset_for_time(topic, partition, ms)
                .await?
                .unwrap_or(high)
                .clamp(low, high),
            SeekTarget::Committed => match lease.group_client.committed(topic, partition).await? {
                Some((offset, _)) if (low..=high).contains(&offset) => offset,
                _ => low,
            },
        };
        let epoch = lease.seek_to(offset)?;
        tracing::debug!(parent: &lease.span, offset, epoch, "seek");
        Ok((offset, epoch))
    }

    /// Commits `offset` for the lease's partition, fenced by the lease's token. Returns the
    /// metadata stored with it.
    pub async fn commit(
        &self,
        lease_id: &str,
        offset: i64,
        metadata: Option<&str>,
    ) -> Result<String, LeaseError> {
        let lease = self.lookup(lease_id)?;
        self.commit_on(&lease, offset, metadata).await
    }

    async fn commit_on(
        &self,
        lease: &Arc<Lease>,
        offset: i64,
        metadata: Option<&str>,
    ) -> Result<String, LeaseError> {
        lease.touch()?;
        let (topic, partition) = (lease.key.topic.as_str(), lease.key.partition);
        let mut high = lease.cached_high_watermark();
        if offset > high {
            // The cached watermark may be behind the broker's; ask before refusing.
            let (_, fresh) = self.kafka.watermarks(topic, partition).await?;
            lease.note_high_watermark(fresh);
            high = fresh;
        }
        if offset < 0 || offset > high {
            return Err(LeaseError::OffsetOutOfRange {
                topic: topic.to_string(),
                partition,
                offset,
                low: 0,
                high,
            });
        }
        lease.commit(offset, metadata).await
    }

    /// Ends a lease at the client's request, committing first if asked. If the commit fails
    /// the lease is kept.
    pub async fn release(
        &self,
        lease_id: &str,
        commit: Option<i64>,
    ) -> Result<Option<i64>, LeaseError> {
        let lease = match self.lookup(lease_id) {
            Ok(lease) => lease,
            // Release of an ended lease is NOT_FOUND, per the contract, saying how it ended.
            Err(LeaseError::LeaseEnded { lease_ref, reason }) => {
                return Err(LeaseError::ReleaseOfEnded { lease_ref, reason })
            }
            Err(err) => return Err(err),
        };
        if let Some(offset) = commit {
            self.commit_on(&lease, offset, None).await?;
        }
        self.end_lease(&lease, EndReason::Released).await;
        Ok(commit)
    }

    /// Every held lease across all instances, with local detail where this one serves it.
    pub async fn list(
        &self,
        group: Option<&str>,
        topic: Option<&str>,
    ) -> Result<Vec<ListedLease>, LeaseError> {
        let held = self.locks.list(group).await?;
        let table = self.table();
        Ok(held
            .into_iter()
            .filter(|h| topic.is_none_or(|t| h.key.topic == t))
            .map(|h| {
                let local = table
                    .by_key
                    .get(&h.key)
                    .and_then(|id| table.leases.get(id))
                    .filter(|l| l.token == h.token)
                    .map(|l| l.snapshot());
                ListedLease {
                    key: h.key,
                    holder: h.holder,
                    token: h.token.0,
                    local,
                }
            })
            .collect())
    }

    /// The members subscribed to `group` (of `topic` only, if given), each with the
    /// partitions its leases hold: two reads of the group's prefix.
    pub async fn list_members(
        &self,
        group: &str,
        topic: Option<&str>,
    ) -> Result<Vec<(String, MemberRecord, Vec<i32>)>, LeaseError> {
        let members = self.locks.members(group).await?;
        let held = self.locks.list(Some(group)).await?;
        Ok(members
            .into_iter()
            .filter(|(t, _)| topic.is_none_or(|topic| t == topic))
            .map(|(t, record)| {
                let partitions = held
                    .iter()
                    .filter(|h| h.key.topic == t && h.holder.subscriber == record.member_id)
                    .map(|h| h.key.partition)
                    .collect();
                (t, record, partitions)
            })
            .collect())
    }

    /// Stops granting leases and ends every lease (their Reads end with UNAVAILABLE),
    /// releasing each lock explicitly so successors on other instances take over at once.
    pub async fn shutdown(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
        self.stopping.send_replace(true);
        let leases: Vec<Arc<Lease>> = self.table().leases.values().cloned().collect();
        let count = leases.len();
        futures::future::join_all(
            leases
                .iter()
                .map(|lease| self.end_lease(lease, EndReason::Shutdown)),
        )
        .await;
        tracing::info!(leases = count, "all leases released");
    }

    /// Marks member `member_id` of `group` as attached to a stream here: `Ok(None)` for a
    /// new member, `Ok(Some(way in))` for one detached within its grace, `Err(())` when a
    /// stream is attached already (Consul cannot tell two subscriptions of one session
    /// apart).
    pub(crate) fn claim_member(
        &self,
        group: &str,
        member_id: &str,
    ) -> Result<Option<crate::subscribe::Reattach>, ()> {
        let mut members = self.members.lock().unwrap_or_else(|p| p.into_inner());
        match members.get_mut(&(group.to_string(), member_id.to_string())) {
            Some(None) => Err(()),
            Some(detached) => Ok(detached.take()),
            None => {
                members.insert((group.to_string(), member_id.to_string()), None);
                Ok(None)
            }
        }
    }

    /// The member's stream is gone; `reattach` reaches its task until its grace ends.
    pub(crate) fn detach_member(
        &self,
        group: &str,
        member_id: &str,
        reattach: crate::subscribe::Reattach,
    ) {
        if let Some(slot) = self
            .members
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(&(group.to_string(), member_id.to_string()))
        {
            *slot = Some(reattach);
        }
    }

    /// Undoes [`Gateway::claim_member`].
    pub(crate) fn free_member(&self, group: &str, member_id: &str) {
        self.members
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(group.to_string(), member_id.to_string()));
    }

    /// Turns `true` when the gateway starts shutting down.
    pub fn stopping(&self) -> watch::Receiver<bool> {
        self.stopping.subscribe()
    }

    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }
}

/// Converts a lease's public parts into the ListLeases row.
pub fn lease_info(listed: &ListedLease) -> v1::LeaseInfo {
    let ts = |t: SystemTime| {
        let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
        prost_types::Timestamp {
            seconds: d.as_secs() as i64,
            nanos: d.subsec_nanos() as i32,
        }
    };
    let local = listed.local.as_ref();
    v1::LeaseInfo {
        group: listed.key.group.clone(),
        topic: listed.key.topic.clone(),
        partition: listed.key.partition,
        member: listed.holder.member.clone(),
        fencing_token: listed.token,
        acquired_at: Some(ts(listed.holder.acquired_at())),
        expires_at: local.map(|l| ts(l.expires_at)),
        gateway: listed.holder.gateway.clone(),
        position: local.map(|l| l.position),
        committed_offset: local.and_then(|l| l.committed),
        high_watermark: local.map(|l| l.high_watermark),
        lag: local.and_then(crate::lease::LeaseSnapshot::lag),
        read_lag: local.map(crate::lease::LeaseSnapshot::read_lag),
        details_unavailable: String::new(),
        gateway_address: listed.holder.address.clone(),
        member_id: listed.holder.subscriber.clone(),
    }
}
