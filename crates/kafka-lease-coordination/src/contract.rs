//! The lock contract: the [`LockBackend`] trait every backend implements, and the values it
//! takes and gives (keys, grants, fencing tokens, holder and member records, views, the
//! session's state). Its own module, below the backends, so that they import it and not the
//! crate root that declares them.

use std::fmt;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

/// The one name rule of the project, for group ids, topics (Kafka's own rule), member ids,
/// instance ids and Consul path segments: these characters only, which are safe in a Kafka
/// name, a URL path, a Consul key and a Consul service id.
pub const NAME_CHARS: &str = "[A-Za-z0-9._-]";

/// Whether `c` is one of [`NAME_CHARS`].
pub fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')
}

/// One lockable partition of a topic, for one group.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockKey {
    pub group: String,
    pub topic: String,
    pub partition: i32,
}

impl LockKey {
    pub fn new(group: impl Into<String>, topic: impl Into<String>, partition: i32) -> Self {
        Self {
            group: group.into(),
            topic: topic.into(),
            partition,
        }
    }

    /// `<prefix>/<group>/<topic>/<partition>`: the Consul key. Group and topic are validated
    /// names (no `/`, no `..`), so the path cannot escape the prefix.
    pub fn path(&self, prefix: &str) -> String {
        format!(
            "{}/{}/{}/{}",
            prefix.trim_end_matches('/'),
            self.group,
            self.topic,
            self.partition
        )
    }

    /// The key prefix under which every partition of this key's topic lives, with a trailing
    /// `/`: what a waiter watches.
    pub fn topic_prefix(&self, prefix: &str) -> String {
        format!(
            "{}/{}/{}/",
            prefix.trim_end_matches('/'),
            self.group,
            self.topic
        )
    }

    /// Parses a path made by [`LockKey::path`]; `None` for anything else under the prefix.
    pub fn from_path(prefix: &str, path: &str) -> Option<Self> {
        let rest = path
            .strip_prefix(prefix.trim_end_matches('/'))?
            .strip_prefix('/')?;
        let mut parts = rest.split('/');
        let (group, topic, partition) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() || group.is_empty() || topic.is_empty() {
            return None;
        }
        Some(Self::new(group, topic, partition.parse().ok()?))
    }
}

impl fmt::Display for LockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.group, self.topic, self.partition)
    }
}

/// A fencing token: strictly greater than every token issued before it for the same key.
/// Only a lock backend issues one (its field is private to this crate); the API carries it as
/// a number, which [`FencingToken::get`] gives and [`FencingToken::from_wire`] reads back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct FencingToken(u64);

impl FencingToken {
    /// The token as the API and the commit metadata carry it.
    pub fn get(self) -> u64 {
        self.0
    }

    /// A token as a client or another instance sent it: to compare with one a backend
    /// issued, never to vouch for a lock.
    pub fn from_wire(token: u64) -> Self {
        FencingToken(token)
    }

    /// The token a backend issues for a lock written at `index`.
    pub(crate) fn issued(index: u64) -> Self {
        FencingToken(index)
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// What a lock's value records about its holder, as JSON, so an operator can read it with
/// `consul kv get`. It never contains the lease id itself (a bearer credential), only its
/// public reference.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HolderInfo {
    /// The client's free-text label.
    pub member: String,
    /// The gateway instance serving the lease.
    pub gateway: String,
    /// The public half of the lease id (`<lease_ref>.<secret>`).
    pub lease_ref: String,
    /// When the lease was granted, in milliseconds since the Unix epoch.
    pub acquired_at_ms: u64,
    /// The lease's TTL in milliseconds.
    pub ttl_ms: u64,
    /// Where other instances reach the serving instance (`host:port`, its advertised gRPC
    /// address). Empty in records written before instances forwarded calls to each other.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub address: String,
    /// The member id of the subscription the lease belongs to (see [`MemberRecord`]); empty
    /// for a lease taken with Acquire.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub subscriber: String,
}

impl HolderInfo {
    pub fn acquired_at(&self) -> SystemTime {
        from_unix_ms(self.acquired_at_ms)
    }
}

/// `t` in milliseconds since the Unix epoch, as the records in the backend store times
/// (0 for a time before it).
pub fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The time a record's milliseconds since the Unix epoch stand for.
pub fn from_unix_ms(ms: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_millis(ms)
}

/// Proof that this instance holds a key. Built only by a backend; [`LockBackend::release`]
/// consumes it.
#[derive(Debug, PartialEq, Eq)]
pub struct LockGrant {
    key: LockKey,
    token: FencingToken,
    /// The backend session that holds the lock.
    session: String,
}

impl LockGrant {
    pub(crate) fn new(key: LockKey, token: FencingToken, session: String) -> Self {
        Self {
            key,
            token,
            session,
        }
    }

    pub fn key(&self) -> &LockKey {
        &self.key
    }

    pub fn token(&self) -> FencingToken {
        self.token
    }

    pub fn session(&self) -> &str {
        &self.session
    }
}

/// The outcome of one attempt to lock a key. Contention is a value, not an error.
#[derive(Debug)]
pub enum Acquisition {
    Acquired(LockGrant),
    /// Another session holds the key. Who it is shows in the next [`TopicView`].
    Held,
    /// The key is free, but the backend will not lock it for a while yet: Consul's
    /// lock-delay after the session that held it was invalidated. Nothing is written when
    /// the delay ends, so no [`TopicView`] shows it; [`LockBackend::wait_cut`] says how long
    /// to wait before trying again.
    Delayed,
}

/// One lock of a [`TopicView`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldPartition {
    /// `None` while only an attempt's answer says it is held (a lock another instance took
    /// since the view): the token comes with the next view.
    pub token: Option<FencingToken>,
    /// The recorded holder; `None` when the value is not a readable [`HolderInfo`] (the key
    /// is held all the same).
    pub holder: Option<HolderInfo>,
}

/// The locks held under one (group, topic), and the members subscribed to it, as of the
/// backend index `index`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TopicView {
    /// Pass it back to [`LockBackend::topic_view`] to wait for the next change.
    pub index: u64,
    /// Partition → its lock. A partition not in the map is free (or under lock-delay).
    pub held: std::collections::BTreeMap<i32, HeldPartition>,
    /// Member id → its record: the members of the subscriptions to this (group, topic) whose
    /// gateway's session lives.
    pub members: std::collections::BTreeMap<String, MemberRecord>,
    /// The target assignment of the newest epoch published for this (group, topic), if any.
    pub target: Option<PublishedTarget>,
}

/// The target assignment of one epoch of a (group, topic)'s subscriptions: which partitions
/// each member is to hold, computed once by one gateway from one view of the membership and
/// stored beside the topic's locks (`<group>/<topic>/~target`), so that every gateway reads
/// the same one. Members only move toward the newest target they have seen (see
/// docs/ARCHITECTURE.md, "Subscriptions").
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupTarget {
    /// One more than the epoch it replaced; the first target is epoch 1.
    pub epoch: u64,
    /// The topic's partition count it was computed for.
    pub partitions: i32,
    /// The members it was computed for: member id → its cap (0: none).
    pub members: std::collections::BTreeMap<String, u32>,
    /// The partitions Acquire leases (not members) held when it was computed: no member's.
    #[serde(default)]
    pub reserved: std::collections::BTreeSet<i32>,
    /// Member id → the partitions it is to hold, ascending. Every member of `members` is
    /// here, perhaps with none.
    pub assignment: std::collections::BTreeMap<String, Vec<i32>>,
    /// The gateway instance that computed it.
    #[serde(default)]
    pub computed_by: String,
    /// When, in milliseconds since the Unix epoch.
    #[serde(default)]
    pub computed_at_ms: u64,
}

impl GroupTarget {
    /// The member the target gives `partition` to, if any.
    pub fn owner_of(&self, partition: i32) -> Option<&str> {
        self.assignment
            .iter()
            .find(|(_, partitions)| partitions.contains(&partition))
            .map(|(member, _)| member.as_str())
    }
}

/// A [`GroupTarget`] as stored: with the backend index of its write, which the next epoch's
/// write must name to replace it (check-and-set).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublishedTarget {
    pub target: GroupTarget,
    pub index: u64,
}

/// A member subscribed to a (group, topic), as its gateway records it beside the topic's
/// locks (`<group>/<topic>/~members/<member_id>`), bound to the gateway's session: the record
/// vanishes with the session, so a dead gateway's members leave with it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberRecord {
    /// Its stable id: `[A-Za-z0-9._-]`, at most 128 characters.
    pub member_id: String,
    /// The client's free-text label.
    #[serde(default)]
    pub member: String,
    /// The gateway instance its subscription stream is on.
    pub gateway: String,
    /// The most partitions of the topic it takes; 0: no cap.
    #[serde(default)]
    pub max_partitions: u32,
    /// When it joined, in milliseconds since the Unix epoch.
    #[serde(default)]
    pub joined_at_ms: u64,
}

/// What an instance records about itself for as long as its session lives (a backend
/// configured with an advertised address writes it with every session it creates, bound to
/// that session), so that another instance can forward calls on its leases to it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstanceRecord {
    /// The instance's name.
    pub instance: String,
    /// Its gRPC address, `host:port`, as other instances dial it.
    pub address: String,
}

/// A lock currently held by some instance, as listed from the backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldLock {
    pub key: LockKey,
    pub token: FencingToken,
    pub holder: HolderInfo,
}

/// The state of this instance's backend session, as the lease table watches it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SessionState {
    /// The session is valid; `id` names it. Grants made under another id are void.
    Live { id: String },
    /// No valid session (not yet created, invalidated, or the backend is unreachable past the
    /// self-fence deadline). Every grant is void; the backend is trying to recover.
    Lost { reason: String },
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CoordinationError {
    /// The backend could not be reached or answered with an error; safe to retry.
    #[error("lock backend unavailable during {operation}: {detail}")]
    Unavailable {
        operation: &'static str,
        detail: String,
    },
    /// This instance has no valid session right now (see [`SessionState::Lost`]).
    #[error("no valid lock session: {reason}")]
    NoSession { reason: String },
}

/// A lock service shared by every gateway instance.
#[async_trait]
pub trait LockBackend: Send + Sync + std::fmt::Debug + 'static {
    /// Tries once to lock `key` for this instance, recording `holder` as the value: one
    /// write, whatever the outcome. Trying a key this instance holds under a grant it has not
    /// released returns that grant again and writes nothing (its token and holder stay).
    async fn try_acquire(
        &self,
        key: &LockKey,
        holder: &HolderInfo,
    ) -> Result<Acquisition, CoordinationError>;

    /// Releases a held lock explicitly, so that a successor can take it at once (no
    /// lock-delay). Releasing a lock that was already lost is not an error.
    async fn release(&self, grant: LockGrant) -> Result<(), CoordinationError>;

    /// The grant this instance's live session holds on `key`, read consistently, or `None`
    /// when it holds none. For cleaning up after an outcome that is not known: an acquire
    /// whose answer was lost (it may have taken the lock), or a release that failed.
    async fn held_grant(&self, key: &LockKey) -> Result<Option<LockGrant>, CoordinationError>;

    /// The locks held under (`group`, `topic`). With `after: None`, as they are now. With
    /// `after: Some(index)` (an index from an earlier view), waits until something under the
    /// topic changes after `index` or `timeout` passes, then answers; at once if it has
    /// changed already. One request however many partitions the topic has.
    async fn topic_view(
        &self,
        group: &str,
        topic: &str,
        after: Option<u64>,
        timeout: Duration,
    ) -> Result<TopicView, CoordinationError>;

    /// How long to wait before trying `key` again, at most `timeout`: after
    /// [`Acquisition::Delayed`], the rest of the delay (Consul's lock-delay ends silently,
    /// with no write a [`TopicView`] could show); otherwise `timeout`.
    fn wait_cut(&self, key: &LockKey, timeout: Duration) -> Duration {
        let _ = key;
        timeout
    }

    /// The address `instance` advertises to other instances (see [`InstanceRecord`]), read
    /// from the backend: `Some` while that instance has a live session that registered one;
    /// `None` when it has none (the instance is gone, lost its session, or never existed).
    async fn instance_address(&self, instance: &str) -> Result<Option<String>, CoordinationError>;

    /// Records `member` as subscribed to (`group`, `topic`), bound to this instance's session
    /// (written again, the record is replaced). `Ok(false)` when another session holds that
    /// member id (the member is subscribed through another instance).
    async fn join(
        &self,
        group: &str,
        topic: &str,
        member: &MemberRecord,
    ) -> Result<bool, CoordinationError>;

    /// Removes the record of member `member_id` of (`group`, `topic`) if this instance's
    /// session holds it.
    async fn leave(
        &self,
        group: &str,
        topic: &str,
        member_id: &str,
    ) -> Result<(), CoordinationError>;

    /// The members subscribed to the topics of `group` (see [`MemberRecord`]) whose
    /// gateway's session lives: (topic, record), ordered by topic and member id.
    async fn members(&self, group: &str) -> Result<Vec<(String, MemberRecord)>, CoordinationError>;

    /// Publishes `target` as the target assignment of (`group`, `topic`) if the stored one is
    /// still the one written at `replaces` (`None`: if none is stored): one check-and-set
    /// write, not bound to any session. `Ok(false)` when another write came first (the next
    /// view shows it).
    async fn publish_target(
        &self,
        group: &str,
        topic: &str,
        target: &GroupTarget,
        replaces: Option<u64>,
    ) -> Result<bool, CoordinationError>;

    /// Removes the target of (`group`, `topic`) if it is still the one written at `index`
    /// (the last member left): one check-and-set delete. `Ok(false)` when it was replaced
    /// (a member joined meanwhile); `Ok(true)` when it is gone, now or already.
    async fn remove_target(
        &self,
        group: &str,
        topic: &str,
        index: u64,
    ) -> Result<bool, CoordinationError>;

    /// The published targets of the topics of `group`: topic → target, one read.
    async fn targets(
        &self,
        group: &str,
    ) -> Result<std::collections::BTreeMap<String, PublishedTarget>, CoordinationError>;

    /// Every held lock under the prefix, optionally only one group's, ordered by key.
    async fn list(&self, group: Option<&str>) -> Result<Vec<HeldLock>, CoordinationError>;

    /// The current session state; the receiver sees every change.
    fn session_state(&self) -> tokio::sync::watch::Receiver<SessionState>;

    /// Until when this instance may act on its grants: the self-fence deadline, derived from
    /// the last confirmation that the session was valid. `None` when there is no live
    /// session. Side effects (commits, handing out records) check this synchronously, so a
    /// gateway that was paused (SIGSTOP, a long GC-like stall) cannot act on a lock that may
    /// have moved while it was not running, even before its background tasks catch up.
    fn valid_until(&self) -> Option<tokio::time::Instant>;

    /// Whether the backend answers right now (for health).
    async fn ping(&self) -> Result<(), CoordinationError>;

    /// Ends this instance's session: every lock it holds is released. Called last in a
    /// graceful shutdown, after the leases were released one by one.
    async fn shutdown(&self);
}
