//! An in-process [`LockBackend`] for `kafka-lease dev` and tests: several simulated gateway
//! instances share one [`MemoryLockStore`] and see each other's locks as they would in Consul.
//!
//! The store mimics the Consul behaviour the lease table depends on: a store-wide write index
//! that fencing tokens are taken from (so tokens for a key only grow), a per-topic
//! last-modify index that topic views block on, compare-and-set acquisition, and sessions that
//! can be invalidated (dropping every lock of the session) and then recreated. It has no TTLs
//! and no lock-delay: a dropped [`MemoryLocks`] keeps its locks until `shutdown` or
//! `invalidate_session`, like a process whose Consul session has not expired yet.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;

use crate::contract::{
    Acquisition, CoordinationError, FencingToken, GroupTarget, HeldLock, HeldPartition, HolderInfo,
    LockBackend, LockGrant, LockKey, MemberRecord, PublishedTarget, SessionState, TopicView,
};

/// How far ahead [`LockBackend::valid_until`] of a live in-memory session lies.
pub const FAR_FUTURE: Duration = Duration::from_secs(24 * 60 * 60);

/// The shared lock table. Cloning is cheap: every clone is the same store.
#[derive(Clone, Debug, Default)]
pub struct MemoryLockStore {
    inner: Arc<StoreInner>,
}

#[derive(Debug, Default)]
struct StoreInner {
    table: Mutex<Table>,
    /// Carries the store index after every write, so waiters wake up and re-check their
    /// topic. A watch (not a Notify) because a waiter that subscribes before checking the
    /// table cannot miss a write made between the check and the wait.
    writes: watch::Sender<u64>,
}

#[derive(Debug, Default)]
struct Table {
    /// The store-wide write index: one more for every write (acquire, release, invalidation).
    index: u64,
    locks: BTreeMap<LockKey, Entry>,
    /// `(group, topic)` → index of the last write under that topic prefix.
    topic_index: HashMap<(String, String), u64>,
    /// Instance → (its live session, the address it advertises), as instance records in
    /// Consul: gone with the session.
    instances: HashMap<String, (String, String)>,
    /// `(group, topic)` → member id → (the session that holds its record, the record).
    members: HashMap<(String, String), BTreeMap<String, (String, MemberRecord)>>,
    /// `(group, topic)` → its target assignment, with the index of its write; bound to no
    /// session.
    targets: HashMap<(String, String), PublishedTarget>,
}

#[derive(Debug, Clone)]
struct Entry {
    session: String,
    holder: HolderInfo,
    token: FencingToken,
}

impl Table {
    /// Starts a new write: the index it gets.
    fn next_index(&mut self) -> u64 {
        self.index += 1;
        self.index
    }

    fn touch(&mut self, key: &LockKey, index: u64) {
        self.topic_index
            .insert((key.group.clone(), key.topic.clone()), index);
    }

    fn topic_index(&self, key: &LockKey) -> u64 {
        // A topic never written is at 0: any later write under it is above every index a
        // caller can hold for it.
        self.topic_index
            .get(&(key.group.clone(), key.topic.clone()))
            .copied()
            .unwrap_or(0)
    }

    /// The locks under (`group`, `topic`), as a view at `index`.
    fn view(&self, group: &str, topic: &str, index: u64) -> TopicView {
        let from = LockKey::new(group, topic, i32::MIN);
        let held = self
            .locks
            .range(from..)
            .take_while(|(key, _)| key.group == group && key.topic == topic)
            .map(|(key, entry)| {
                (
                    key.partition,
                    HeldPartition {
                        token: Some(entry.token),
                        holder: Some(entry.holder.clone()),
                    },
                )
            })
            .collect();
        let members = self
            .members
            .get(&(group.to_string(), topic.to_string()))
            .map(|m| {
                m.iter()
                    .map(|(id, (_, record))| (id.clone(), record.clone()))
                    .collect()
            })
            .unwrap_or_default();
        let target = self
            .targets
            .get(&(group.to_string(), topic.to_string()))
            .cloned();
        TopicView {
            index,
            held,
            members,
            target,
        }
    }

    /// Drops every lock of `session` as one write (Consul invalidates a session in one Raft
    /// entry too). Returns the number of locks dropped.
    fn drop_session(&mut self, session: &str) -> usize {
        let keys: Vec<LockKey> = self
            .locks
            .iter()
            .filter(|(_, entry)| entry.session == session)
            .map(|(key, _)| key.clone())
            .collect();
        self.instances.retain(|_, (owner, _)| owner != session);
        let topics: Vec<(String, String)> = self
            .members
            .iter()
            .filter(|(_, members)| members.values().any(|(owner, _)| owner == session))
            .map(|(topic, _)| topic.clone())
            .collect();
        if keys.is_empty() && topics.is_empty() {
            return 0;
        }
        let index = self.next_index();
        for key in &keys {
            self.locks.remove(key);
            self.touch(key, index);
        }
        for (group, topic) in topics {
            if let Some(members) = self.members.get_mut(&(group.clone(), topic.clone())) {
                members.retain(|_, (owner, _)| owner != session);
            }
            self.touch(&LockKey::new(group, topic, 0), index);
        }
        keys.len()
    }
}

impl MemoryLockStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// A backend for one simulated instance, with a fresh live session of its own.
    pub fn backend(&self, instance: &str) -> MemoryLocks {
        self.make_backend(instance, None)
    }

    /// A backend for one simulated instance that advertises `address` to the others (see
    /// [`LockBackend::instance_address`]) for as long as its session lives.
    pub fn backend_at(&self, instance: &str, address: &str) -> MemoryLocks {
        self.make_backend(instance, Some(address.to_string()))
    }

    fn make_backend(&self, instance: &str, address: Option<String>) -> MemoryLocks {
        let id = new_session_id();
        let (state, _) = watch::channel(SessionState::Live { id: id.clone() });
        let locks = MemoryLocks {
            store: self.clone(),
            instance: instance.to_string(),
            address,
            state,
        };
        locks.register(&id);
        locks
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        // A panic while holding the lock cannot leave the table half-written (every write is
        // a few infallible map operations), so a poisoned lock is still consistent.
        self.inner
            .table
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Publishes a write to waiters. Called after the table lock is released.
    fn announce(&self, index: u64) {
        self.inner.writes.send_replace(index);
    }
}

/// One simulated instance's view of a [`MemoryLockStore`].
#[derive(Debug)]
pub struct MemoryLocks {
    store: MemoryLockStore,
    instance: String,
    /// The address it advertises, if any.
    address: Option<String>,
    state: watch::Sender<SessionState>,
}

fn new_session_id() -> String {
    // Shaped like Consul's session UUIDs so logs look alike.
    let n: u128 = rand::random();
    let hex = format!("{n:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

impl MemoryLocks {
    /// The instance name given to [`MemoryLockStore::backend`].
    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// Records the instance's address under `session`, as the Consul backend does with each
    /// session it creates.
    fn register(&self, session: &str) {
        if let Some(address) = &self.address {
            self.store.table().instances.insert(
                self.instance.clone(),
                (session.to_string(), address.clone()),
            );
        }
    }

    fn live_session(&self) -> Result<String, CoordinationError> {
        match &*self.state.borrow() {
            SessionState::Live { id } => Ok(id.clone()),
            SessionState::Lost { reason } => Err(CoordinationError::NoSession {
                reason: reason.clone(),
            }),
        }
    }

    /// Drops every lock of `session` as one write and tells waiters; how many it dropped.
    fn drop_session(&self, session: &str) -> usize {
        let (dropped, index) = {
            let mut table = self.store.table();
            let dropped = table.drop_session(session);
            (dropped, table.index)
        };
        if dropped > 0 {
            self.store.announce(index);
        }
        dropped
    }

    /// Test hook: invalidates this instance's session as Consul would (its node failing, or
    /// an operator destroying it): every lock it holds is dropped, the state goes `Lost` and
    /// then at once `Live` again under a new session id, as the Consul backend's recovery
    /// would. Grants made under the old session stay void. Does nothing after `shutdown`.
    pub fn invalidate_session(&self) {
        let Ok(old) = self.live_session() else { return };
        let dropped = self.drop_session(&old);
        tracing::info!(
            instance = %self.instance,
            session = %old,
            dropped,
            "memory lock session invalidated",
        );
        self.state.send_replace(SessionState::Lost {
            reason: "session invalidated".into(),
        });
        let id = new_session_id();
        tracing::info!(instance = %self.instance, session = %id, "memory lock session recreated");
        self.register(&id);
        self.state.send_replace(SessionState::Live { id });
    }
}

#[async_trait]
impl LockBackend for MemoryLocks {
    async fn try_acquire(
        &self,
        key: &LockKey,
        holder: &HolderInfo,
    ) -> Result<Acquisition, CoordinationError> {
        let session = self.live_session()?;
        let (outcome, written) = {
            let mut table = self.store.table();
            match table.locks.get(key) {
                // Re-acquiring a key this session holds writes nothing and keeps the token and
                // the recorded holder, as the Consul backend does (where `LockIndex` does not
                // move either): the existing grant stays the one to release.
                Some(entry) if entry.session == session => (
                    Acquisition::Acquired(LockGrant::new(key.clone(), entry.token, session)),
                    None,
                ),
                Some(_) => (Acquisition::Held, None),
                None => {
                    let index = table.next_index();
                    let token = FencingToken::issued(index);
                    table.locks.insert(
                        key.clone(),
                        Entry {
                            session: session.clone(),
                            holder: holder.clone(),
                            token,
                        },
                    );
                    table.touch(key, index);
                    (
                        Acquisition::Acquired(LockGrant::new(key.clone(), token, session)),
                        Some(index),
                    )
                }
            }
        };
        if let Some(index) = written {
            self.store.announce(index);
        }
        Ok(outcome)
    }

    async fn release(&self, grant: LockGrant) -> Result<(), CoordinationError> {
        let written = {
            let mut table = self.store.table();
            // Only the exact grant may release: a key lost and re-acquired since (by anyone,
            // this instance included) carries another session or token and is left alone.
            let ours = table
                .locks
                .get(grant.key())
                .is_some_and(|e| e.session == grant.session() && e.token == grant.token());
            if ours {
                table.locks.remove(grant.key());
                let index = table.next_index();
                table.touch(grant.key(), index);
                Some(index)
            } else {
                None
            }
        };
        if let Some(index) = written {
            self.store.announce(index);
        }
        Ok(())
    }

    async fn held_grant(&self, key: &LockKey) -> Result<Option<LockGrant>, CoordinationError> {
        let session = self.live_session()?;
        let table = self.store.table();
        Ok(table
            .locks
            .get(key)
            .filter(|entry| entry.session == session)
            .map(|entry| LockGrant::new(key.clone(), entry.token, session.clone())))
    }

    async fn topic_view(
        &self,
        group: &str,
        topic: &str,
        after: Option<u64>,
        timeout: Duration,
    ) -> Result<TopicView, CoordinationError> {
        let probe = LockKey::new(group, topic, 0);
        let deadline = tokio::time::Instant::now() + timeout;
        // Subscribe before looking, so a write between the look and the wait still wakes us.
        let mut writes = self.store.inner.writes.subscribe();
        loop {
            {
                let table = self.store.table();
                let index = table.topic_index(&probe);
                if after.is_none_or(|after| index != after) {
                    return Ok(table.view(group, topic, index));
                }
            }
            match tokio::time::timeout_at(deadline, writes.changed()).await {
                Ok(Ok(())) => continue,
                // The sender lives in the store, which `self` keeps alive: it cannot close.
                Ok(Err(_)) | Err(_) => {
                    let table = self.store.table();
                    let index = table.topic_index(&probe);
                    return Ok(table.view(group, topic, index));
                }
            }
        }
    }

    async fn instance_address(&self, instance: &str) -> Result<Option<String>, CoordinationError> {
        Ok(self
            .store
            .table()
            .instances
            .get(instance)
            .map(|(_, address)| address.clone()))
    }

    async fn join(
        &self,
        group: &str,
        topic: &str,
        member: &MemberRecord,
    ) -> Result<bool, CoordinationError> {
        let session = self.live_session()?;
        let index = {
            let mut table = self.store.table();
            let topic_key = (group.to_string(), topic.to_string());
            let held_elsewhere = table
                .members
                .get(&topic_key)
                .and_then(|m| m.get(&member.member_id))
                .is_some_and(|(owner, _)| *owner != session);
            if held_elsewhere {
                return Ok(false);
            }
            let index = table.next_index();
            table
                .members
                .entry(topic_key)
                .or_default()
                .insert(member.member_id.clone(), (session, member.clone()));
            table.touch(&LockKey::new(group, topic, 0), index);
            index
        };
        self.store.announce(index);
        Ok(true)
    }

    async fn leave(
        &self,
        group: &str,
        topic: &str,
        member_id: &str,
    ) -> Result<(), CoordinationError> {
        let Ok(session) = self.live_session() else {
            return Ok(());
        };
        let written = {
            let mut table = self.store.table();
            let topic_key = (group.to_string(), topic.to_string());
            let ours = table
                .members
                .get(&topic_key)
                .and_then(|m| m.get(member_id))
                .is_some_and(|(owner, _)| *owner == session);
            if ours {
                if let Some(members) = table.members.get_mut(&topic_key) {
                    members.remove(member_id);
                }
                let index = table.next_index();
                table.touch(&LockKey::new(group, topic, 0), index);
                Some(index)
            } else {
                None
            }
        };
        if let Some(index) = written {
            self.store.announce(index);
        }
        Ok(())
    }

    async fn members(&self, group: &str) -> Result<Vec<(String, MemberRecord)>, CoordinationError> {
        let table = self.store.table();
        let mut members: Vec<(String, MemberRecord)> = table
            .members
            .iter()
            .filter(|((g, _), _)| g == group)
            .flat_map(|((_, topic), members)| {
                members
                    .values()
                    .map(move |(_, record)| (topic.clone(), record.clone()))
            })
            .collect();
        members.sort_by(|a, b| (&a.0, &a.1.member_id).cmp(&(&b.0, &b.1.member_id)));
        Ok(members)
    }

    async fn publish_target(
        &self,
        group: &str,
        topic: &str,
        target: &GroupTarget,
        replaces: Option<u64>,
    ) -> Result<bool, CoordinationError> {
        let index = {
            let mut table = self.store.table();
            let topic_key = (group.to_string(), topic.to_string());
            let stored = table.targets.get(&topic_key).map(|t| t.index);
            if stored != replaces {
                return Ok(false);
            }
            let index = table.next_index();
            table.targets.insert(
                topic_key,
                PublishedTarget {
                    target: target.clone(),
                    index,
                },
            );
            table.touch(&LockKey::new(group, topic, 0), index);
            index
        };
        self.store.announce(index);
        Ok(true)
    }

    async fn remove_target(
        &self,
        group: &str,
        topic: &str,
        index: u64,
    ) -> Result<bool, CoordinationError> {
        let written = {
            let mut table = self.store.table();
            let topic_key = (group.to_string(), topic.to_string());
            match table.targets.get(&topic_key).map(|t| t.index) {
                None => return Ok(true),
                Some(stored) if stored != index => return Ok(false),
                Some(_) => {}
            }
            table.targets.remove(&topic_key);
            let written = table.next_index();
            table.touch(&LockKey::new(group, topic, 0), written);
            written
        };
        self.store.announce(written);
        Ok(true)
    }

    async fn targets(
        &self,
        group: &str,
    ) -> Result<BTreeMap<String, PublishedTarget>, CoordinationError> {
        Ok(self
            .store
            .table()
            .targets
            .iter()
            .filter(|((g, _), _)| g == group)
            .map(|((_, topic), target)| (topic.clone(), target.clone()))
            .collect())
    }

    async fn list(&self, group: Option<&str>) -> Result<Vec<HeldLock>, CoordinationError> {
        let table = self.store.table();
        // The BTreeMap iterates in `LockKey` order, which is the order promised.
        Ok(table
            .locks
            .iter()
            .filter(|(key, _)| group.is_none_or(|g| key.group == g))
            .map(|(key, entry)| HeldLock {
                key: key.clone(),
                token: entry.token,
                holder: entry.holder.clone(),
            })
            .collect())
    }

    fn session_state(&self) -> watch::Receiver<SessionState> {
        self.state.subscribe()
    }

    /// Nothing can cut an in-memory session off behind its back: while it is live the
    /// deadline is always [`FAR_FUTURE`] away; `None` after `shutdown` and during an
    /// `invalidate_session`.
    fn valid_until(&self) -> Option<tokio::time::Instant> {
        match &*self.state.borrow() {
            SessionState::Live { .. } => Some(tokio::time::Instant::now() + FAR_FUTURE),
            SessionState::Lost { .. } => None,
        }
    }

    async fn ping(&self) -> Result<(), CoordinationError> {
        Ok(())
    }

    async fn shutdown(&self) {
        let Ok(session) = self.live_session() else {
            return;
        };
        let dropped = self.drop_session(&session);
        tracing::info!(
            instance = %self.instance,
            session = %session,
            dropped,
            "memory lock session shut down",
        );
        self.state.send_replace(SessionState::Lost {
            reason: "shut down".into(),
        });
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn holder(member: &str) -> HolderInfo {
        HolderInfo {
            member: member.into(),
            gateway: "gw".into(),
            lease_ref: format!("ref-{member}"),
            acquired_at_ms: 1,
            ttl_ms: 1000,
            address: String::new(),
            subscriber: String::new(),
        }
    }

    fn key(partition: i32) -> LockKey {
        LockKey::new("g", "t", partition)
    }

    async fn acquire(b: &MemoryLocks, k: &LockKey, who: &str) -> LockGrant {
        match b.try_acquire(k, &holder(who)).await.unwrap() {
            Acquisition::Acquired(grant) => grant,
            other => panic!("expected Acquired, got {other:?}"),
        }
    }

    async fn held_view(b: &MemoryLocks, k: &LockKey) -> TopicView {
        let view = b
            .topic_view(&k.group, &k.topic, None, Duration::ZERO)
            .await
            .unwrap();
        assert!(matches!(
            b.try_acquire(k, &holder("late")).await.unwrap(),
            Acquisition::Held
        ));
        view
    }

    #[tokio::test]
    async fn tokens_are_the_index_of_the_acquire_write_and_grow() {
        let store = MemoryLockStore::new();
        let (a, b) = (store.backend("a"), store.backend("b"));
        let first = acquire(&a, &key(0), "a").await;
        let other_key = acquire(&b, &key(1), "b").await;
        assert_eq!(first.token(), FencingToken::issued(1));
        assert_eq!(other_key.token(), FencingToken::issued(2));
        a.release(first).await.unwrap(); // index 3
        let second = acquire(&b, &key(0), "b").await;
        assert_eq!(second.token(), FencingToken::issued(4));
    }

    #[tokio::test]
    async fn reacquire_keeps_token_and_holder_and_writes_nothing() {
        let store = MemoryLockStore::new();
        let a = store.backend("a");
        let first = acquire(&a, &key(0), "first").await;
        let again = acquire(&a, &key(0), "second").await;
        assert_eq!(first, again);
        assert_eq!(store.table().index, 1);
        assert_eq!(a.list(None).await.unwrap()[0].holder, holder("first"));
    }

    #[tokio::test]
    async fn release_of_a_stale_grant_leaves_the_new_holder_alone() {
        let store = MemoryLockStore::new();
        let (a, b) = (store.backend("a"), store.backend("b"));
        let stale = acquire(&a, &key(0), "a").await;
        a.invalidate_session();
        let fresh = acquire(&b, &key(0), "b").await;
        a.release(stale).await.unwrap();
        let listed = b.list(None).await.unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].token, fresh.token());
    }

    #[tokio::test(start_paused = true)]
    async fn a_view_shows_the_holders_and_answers_at_once_when_the_topic_moved_already() {
        let store = MemoryLockStore::new();
        let (a, b) = (store.backend("a"), store.backend("b"));
        let grant = acquire(&a, &key(0), "a").await;
        let view = held_view(&b, &key(0)).await;
        assert_eq!(view.held[&0].holder, Some(holder("a")));
        assert_eq!(view.held[&0].token, Some(grant.token()));
        a.release(grant).await.unwrap();
        let started = tokio::time::Instant::now();
        let moved = b
            .topic_view("g", "t", Some(view.index), Duration::from_secs(30))
            .await
            .unwrap();
        assert!(moved.index > view.index);
        assert!(moved.held.is_empty());
        assert_eq!(started.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_view_wait_wakes_on_a_write_under_the_topic_only() {
        let store = MemoryLockStore::new();
        let (a, b) = (store.backend("a"), store.backend("b"));
        let grant = acquire(&a, &key(0), "a").await;
        let index = held_view(&b, &key(0)).await.index;
        let waiter = tokio::spawn({
            let b = store.backend("waiter");
            async move {
                let started = tokio::time::Instant::now();
                let got = b
                    .topic_view("g", "t", Some(index), Duration::from_secs(30))
                    .await;
                (got.unwrap(), started.elapsed())
            }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        // Writes under another topic or group must not wake the waiter.
        let _other_topic = acquire(&a, &LockKey::new("g", "other", 0), "a").await;
        let _other_group = acquire(&a, &LockKey::new("h", "t", 0), "a").await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!waiter.is_finished());
        // Another partition of the same topic does (the view is the whole topic's).
        tokio::time::sleep(Duration::from_secs(1)).await;
        let _sibling = acquire(&a, &key(7), "a").await;
        let (moved, waited) = waiter.await.unwrap();
        assert!(moved.index > index);
        assert_eq!(moved.held.keys().copied().collect::<Vec<_>>(), vec![0, 7]);
        assert_eq!(waited, Duration::from_secs(3));
        a.release(grant).await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_view_wait_times_out_with_the_topic_as_it_is() {
        let store = MemoryLockStore::new();
        let (a, b) = (store.backend("a"), store.backend("b"));
        let _grant = acquire(&a, &key(0), "a").await; // index 1, topic at 1
        let _elsewhere = acquire(&a, &LockKey::new("g", "u", 0), "a").await; // index 2
        let index = held_view(&b, &key(0)).await.index;
        assert_eq!(index, 1);
        let started = tokio::time::Instant::now();
        let got = b
            .topic_view("g", "t", Some(index), Duration::from_secs(7))
            .await
            .unwrap();
        assert_eq!(started.elapsed(), Duration::from_secs(7));
        assert_eq!(got.index, 1);
        assert_eq!(got.held.len(), 1);
    }

    #[tokio::test]
    async fn invalidation_drops_locks_in_one_write_and_renews_the_session() {
        let store = MemoryLockStore::new();
        let (a, b) = (store.backend("a"), store.backend("b"));
        let mut state = a.session_state();
        let old = a.live_session().unwrap();
        let _g0 = acquire(&a, &key(0), "a").await;
        let _g1 = acquire(&a, &key(1), "a").await;
        let _kept = acquire(&b, &key(2), "b").await;
        a.invalidate_session();
        assert_eq!(store.table().index, 4);
        assert!(state.has_changed().unwrap());
        let SessionState::Live { id } = state.borrow_and_update().clone() else {
            panic!("expected a live session after recovery");
        };
        assert_ne!(id, old);
        let keys: Vec<_> = b
            .list(None)
            .await
            .unwrap()
            .into_iter()
            .map(|h| h.key)
            .collect();
        assert_eq!(keys, vec![key(2)]);
        acquire(&a, &key(0), "a").await;
    }

    #[tokio::test(start_paused = true)]
    async fn valid_until_is_far_ahead_while_live_and_none_once_lost() {
        let store = MemoryLockStore::new();
        let a = store.backend("a");
        let now = tokio::time::Instant::now();
        assert_eq!(a.valid_until(), Some(now + FAR_FUTURE));
        let state = a.session_state();
        a.invalidate_session();
        // A new session replaced the old one, and it is valid again.
        assert!(state.has_changed().unwrap());
        assert!(a.valid_until().is_some());
        a.shutdown().await;
        assert_eq!(a.valid_until(), None);
    }

    #[tokio::test]
    async fn shutdown_frees_everything_and_refuses_new_acquires() {
        let store = MemoryLockStore::new();
        let (a, b) = (store.backend("a"), store.backend("b"));
        let _g = acquire(&a, &key(0), "a").await;
        a.shutdown().await;
        assert_eq!(
            *a.session_state().borrow(),
            SessionState::Lost {
                reason: "shut down".into()
            }
        );
        assert!(matches!(
            a.try_acquire(&key(1), &holder("a")).await,
            Err(CoordinationError::NoSession { .. })
        ));
        acquire(&b, &key(0), "b").await;
        // Idempotent, and invalidation after shutdown does not resurrect the session.
        a.shutdown().await;
        a.invalidate_session();
        assert!(matches!(
            *a.session_state().borrow(),
            SessionState::Lost { .. }
        ));
    }

    #[tokio::test]
    async fn list_filters_by_group_and_sorts_by_key() {
        let store = MemoryLockStore::new();
        let a = store.backend("a");
        for k in [
            LockKey::new("h", "t", 0),
            key(10),
            key(2),
            LockKey::new("g", "a", 5),
        ] {
            acquire(&a, &k, "a").await;
        }
        let all: Vec<_> = a
            .list(None)
            .await
            .unwrap()
            .into_iter()
            .map(|h| h.key)
            .collect();
        assert_eq!(
            all,
            vec![
                LockKey::new("g", "a", 5),
                key(2),
                key(10),
                LockKey::new("h", "t", 0)
            ]
        );
        let g: Vec<_> = a
            .list(Some("g"))
            .await
            .unwrap()
            .into_iter()
            .map(|h| h.key)
            .collect();
        assert_eq!(g, vec![LockKey::new("g", "a", 5), key(2), key(10)]);
        assert!(a.list(Some("nope")).await.unwrap().is_empty());
    }
}
