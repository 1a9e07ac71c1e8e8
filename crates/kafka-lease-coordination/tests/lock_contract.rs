//! The `LockBackend` contract: one set of scenarios, each run against two `MemoryLocks` of one
//! store and against two `ConsulLocks` sessions on the real Consul agent (skipped outside CI
//! when the services are down), plus the Consul-only behaviour (lock-delay, self-fencing,
//! check-bound sessions and their crash failover, the fence invariant of the configuration).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use async_trait::async_trait;
use consulrs::client::{ConsulClient, ConsulClientSettingsBuilder};
use kafka_lease_coordination::consul::{
    CheckKind, ConsulLockConfig, ConsulLocks, SessionCheck, DEFAULT_CHECK_TTL, FENCE_MARGIN,
};
use kafka_lease_coordination::memory::{MemoryLockStore, MemoryLocks};
use kafka_lease_coordination::{
    Acquisition, CoordinationError, GroupTarget, HolderInfo, LockBackend, LockGrant, LockKey,
    MemberRecord, SessionState, TopicView,
};
use kafka_lease_testkit::{unique_name, wait_for, Relay, Services};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Long enough for any condition on a healthy local Consul; short enough to fail fast.
const DEADLINE: Duration = Duration::from_secs(20);
/// What "at once" and "promptly" mean here: far below every timeout in play.
const PROMPT: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------------
// Rigs: two instances of one backend, and a way to kill a session behind the backend's back.

struct Rig<B> {
    a: B,
    b: B,
    /// A group name unique to this run, so Consul tests never see each other's keys.
    group: String,
    invalidator: Box<dyn Invalidate<B>>,
}

#[async_trait]
trait Invalidate<B>: Send + Sync {
    /// Invalidates `backend`'s current session as an outside event would.
    async fn invalidate(&self, backend: &B);
}

struct MemoryInvalidate;

#[async_trait]
impl Invalidate<MemoryLocks> for MemoryInvalidate {
    async fn invalidate(&self, backend: &MemoryLocks) {
        backend.invalidate_session();
    }
}

/// Destroys the session directly through the Consul API, as an operator (or a failed node
/// check) would.
struct ConsulInvalidate(ConsulClient);

#[async_trait]
impl Invalidate<ConsulLocks> for ConsulInvalidate {
    async fn invalidate(&self, backend: &ConsulLocks) {
        let id = live_id(backend);
        consulrs::session::delete(&self.0, &id, None)
            .await
            .expect("destroying the session");
    }
}

impl<B: LockBackend> Rig<B> {
    fn key(&self, topic: &str, partition: i32) -> LockKey {
        LockKey::new(self.group.clone(), topic, partition)
    }

    async fn finish(self) {
        self.a.shutdown().await;
        self.b.shutdown().await;
    }
}

fn memory_rig() -> Rig<MemoryLocks> {
    let store = MemoryLockStore::new();
    Rig {
        a: store.backend_at("gw-a", ADDRESS_A),
        b: store.backend_at("gw-b", ADDRESS_B),
        group: unique_name("g"),
        invalidator: Box::new(MemoryInvalidate),
    }
}

fn consul_config(
    address: &str,
    prefix: &str,
    instance: &str,
    lock_delay: Duration,
) -> ConsulLockConfig {
    ConsulLockConfig {
        address: address.into(),
        token: None,
        prefix: prefix.into(),
        instance: instance.into(),
        // Consul's minimum TTL; the renew interval derived from the lock-delay (a quarter of
        // the fence window), so invalidations are noticed within a fraction of a second.
        session_ttl: Duration::from_secs(10),
        lock_delay,
        renew_interval: None,
        check: None,
        advertise: None,
        tls: Default::default(),
    }
}

/// The addresses the rigs' two instances advertise (nothing listens there: only the
/// records are under test).
const ADDRESS_A: &str = "127.0.0.1:1001";
const ADDRESS_B: &str = "127.0.0.1:1002";

/// A check-bound session's config with the default timings (lock-delay 1.5 s, check every
/// 1 s, renew interval derived), its check dialing `gateway`.
fn check_config(
    address: &str,
    prefix: &str,
    instance: &str,
    gateway: SocketAddr,
) -> ConsulLockConfig {
    ConsulLockConfig {
        address: address.into(),
        prefix: prefix.into(),
        instance: instance.into(),
        check: Some(SessionCheck::for_listener(gateway)),
        ..ConsulLockConfig::default()
    }
}

fn consul_client(address: &str) -> ConsulClient {
    ConsulClient::new(
        ConsulClientSettingsBuilder::default()
            .address(address)
            .build()
            .unwrap(),
    )
    .unwrap()
}

async fn consul_rig(test: &str, lock_delay: Duration) -> Option<Rig<ConsulLocks>> {
    let services = Services::require(test)?;
    let address = services.consul_http_addr.clone();
    let prefix = unique_name("kafka-lease-test");
    let connect = |instance: &str, advertise: &str| {
        ConsulLocks::connect(ConsulLockConfig {
            advertise: Some(advertise.into()),
            ..consul_config(&address, &prefix, instance, lock_delay)
        })
    };
    let a = connect("gw-a", ADDRESS_A)
        .await
        .expect("connecting gw-a to Consul");
    let b = connect("gw-b", ADDRESS_B)
        .await
        .expect("connecting gw-b to Consul");
    Some(Rig {
        a,
        b,
        group: unique_name("g"),
        invalidator: Box::new(ConsulInvalidate(consul_client(&address))),
    })
}

/// Two tests per scenario: `<scenario>::memory` and `<scenario>::consul`. The number is the
/// Consul lock-delay in seconds for that scenario.
macro_rules! contract {
    ($($scenario:ident: $lock_delay_secs:expr;)*) => {$(
        mod $scenario {
            use super::*;

            #[tokio::test]
            async fn memory() {
                super::$scenario(memory_rig()).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn consul() {
                let test = concat!(stringify!($scenario), "::consul");
                let delay = Duration::from_secs($lock_delay_secs);
                let Some(rig) = consul_rig(test, delay).await else { return };
                super::$scenario(rig).await;
            }
        }
    )*};
}

contract! {
    free_key_is_acquired: 1;
    held_key_is_busy_for_another_instance: 1;
    reacquire_by_the_holder_returns_the_same_grant: 1;
    // A 5 s lock-delay: a release that set one would make the successor's single try fail.
    release_lets_another_instance_acquire_at_once: 5;
    tokens_increase_across_holders_and_differ_across_keys: 1;
    wait_returns_promptly_when_the_holder_releases: 1;
    wait_returns_at_once_when_the_release_came_first: 1;
    wait_times_out_when_nothing_changes: 1;
    list_shows_exactly_the_held_locks: 1;
    shutdown_frees_the_keys_at_once: 5;
    lost_session_frees_the_keys_and_recovers: 1;
    instance_records_live_and_die_with_the_session: 1;
    members_join_leave_and_vanish_with_the_session: 1;
    targets_are_check_and_set_and_outlive_sessions: 1;
}

// ---------------------------------------------------------------------------------------------
// Helpers

fn holder(member: &str, gateway: &str) -> HolderInfo {
    HolderInfo {
        member: member.into(),
        gateway: gateway.into(),
        lease_ref: format!("ref-{member}"),
        acquired_at_ms: 1_700_000_000_000,
        ttl_ms: 30_000,
        address: String::new(),
        subscriber: String::new(),
    }
}

fn live_id(backend: &impl LockBackend) -> String {
    match &*backend.session_state().borrow() {
        SessionState::Live { id } => id.clone(),
        SessionState::Lost { reason } => panic!("expected a live session, it is lost: {reason}"),
    }
}

async fn acquire(backend: &impl LockBackend, key: &LockKey, who: &HolderInfo) -> LockGrant {
    match backend.try_acquire(key, who).await.expect("try_acquire") {
        Acquisition::Acquired(grant) => grant,
        busy => panic!("expected to acquire {key}, got {busy:?}"),
    }
}

/// Reads the topic's view, then fails to acquire `key`: the holder the view shows, and the
/// view's index (from before the attempt, so no change after it can be missed).
async fn busy(backend: &impl LockBackend, key: &LockKey) -> (Option<HolderInfo>, u64) {
    let view = backend
        .topic_view(&key.group, &key.topic, None, Duration::ZERO)
        .await
        .expect("topic_view");
    match backend
        .try_acquire(key, &holder("late", "gw-late"))
        .await
        .expect("try_acquire")
    {
        Acquisition::Held => (
            view.held.get(&key.partition).and_then(|h| h.holder.clone()),
            view.index,
        ),
        other => panic!("expected {key} to be held, got {other:?}"),
    }
}

/// Waits for a change under `key`'s topic after `index`: the new index.
async fn wait(backend: &impl LockBackend, key: &LockKey, index: u64, timeout: Duration) -> u64 {
    backend
        .topic_view(&key.group, &key.topic, Some(index), timeout)
        .await
        .expect("topic_view")
        .index
}

/// Polls `try_acquire` until it succeeds (for what only becomes free after a while).
async fn acquire_eventually(
    backend: &impl LockBackend,
    key: &LockKey,
    who: &HolderInfo,
) -> LockGrant {
    wait_for(&format!("{key} to become acquirable"), DEADLINE, || async {
        match backend.try_acquire(key, who).await {
            Ok(Acquisition::Acquired(grant)) => Some(grant),
            Ok(Acquisition::Held | Acquisition::Delayed) | Err(_) => None,
        }
    })
    .await
}

async fn timed<T>(future: impl Future<Output = T>) -> (T, Duration) {
    let started = Instant::now();
    let value = future.await;
    (value, started.elapsed())
}

// ---------------------------------------------------------------------------------------------
// Scenarios

async fn free_key_is_acquired<B: LockBackend>(rig: Rig<B>) {
    let key = rig.key("orders", 0);
    rig.a.ping().await.expect("ping");
    let grant = acquire(&rig.a, &key, &holder("m1", "gw-a")).await;
    assert_eq!(grant.key(), &key);
    assert_eq!(grant.session(), live_id(&rig.a));
    assert!(grant.token().get() > 0);
    rig.finish().await;
}

async fn held_key_is_busy_for_another_instance<B: LockBackend>(rig: Rig<B>) {
    let key = rig.key("orders", 0);
    let info = holder("m1", "gw-a");
    let _grant = acquire(&rig.a, &key, &info).await;
    let (seen, index) = busy(&rig.b, &key).await;
    assert_eq!(seen, Some(info));
    assert!(index > 0);
    // Still busy on a second try, and a sibling partition is independent.
    busy(&rig.b, &key).await;
    acquire(&rig.b, &rig.key("orders", 1), &holder("m2", "gw-b")).await;
    rig.finish().await;
}

async fn reacquire_by_the_holder_returns_the_same_grant<B: LockBackend>(rig: Rig<B>) {
    let key = rig.key("orders", 3);
    let first = acquire(&rig.a, &key, &holder("m1", "gw-a")).await;
    let again = acquire(&rig.a, &key, &holder("m1-again", "gw-a")).await;
    assert_eq!(first, again, "a re-acquire must not move the token");
    // Nothing was rewritten: the recorded holder is the first one.
    let listed = rig.a.list(Some(&rig.group)).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].holder, holder("m1", "gw-a"));
    assert_eq!(listed[0].token, first.token());
    // Releasing that one grant frees the key.
    rig.a.release(again).await.unwrap();
    acquire(&rig.b, &key, &holder("m2", "gw-b")).await;
    rig.finish().await;
}

async fn release_lets_another_instance_acquire_at_once<B: LockBackend>(rig: Rig<B>) {
    let key = rig.key("orders", 0);
    let grant = acquire(&rig.a, &key, &holder("m1", "gw-a")).await;
    busy(&rig.b, &key).await;
    rig.a.release(grant).await.unwrap();
    // One try, no retry: a lock-delay would refuse it.
    let (next, took) = timed(acquire(&rig.b, &key, &holder("m2", "gw-b"))).await;
    assert!(took < PROMPT, "{took:?}");
    assert_eq!(next.session(), live_id(&rig.b));
    // Releasing twice (a stale grant) is not an error and leaves the new holder alone.
    rig.finish().await;
}

async fn tokens_increase_across_holders_and_differ_across_keys<B: LockBackend>(rig: Rig<B>) {
    let key = rig.key("orders", 0);
    let mut tokens = Vec::new();
    let holders = [
        (&rig.a, "gw-a"),
        (&rig.b, "gw-b"),
        (&rig.a, "gw-a"),
        (&rig.b, "gw-b"),
    ];
    for (i, (backend, gateway)) in holders.into_iter().enumerate() {
        let grant = acquire(backend, &key, &holder(&format!("m{i}"), gateway)).await;
        tokens.push(grant.token());
        backend.release(grant).await.unwrap();
    }
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens must strictly increase: {tokens:?}"
    );
    let other = acquire(&rig.a, &rig.key("orders", 1), &holder("x", "gw-a")).await;
    let third = acquire(&rig.b, &rig.key("payments", 0), &holder("y", "gw-b")).await;
    assert!(!tokens.contains(&other.token()) && !tokens.contains(&third.token()));
    assert_ne!(other.token(), third.token());
    rig.finish().await;
}

async fn wait_returns_promptly_when_the_holder_releases<B: LockBackend>(rig: Rig<B>) {
    let key = rig.key("orders", 0);
    let grant = acquire(&rig.a, &key, &holder("m1", "gw-a")).await;
    let (_, index) = busy(&rig.b, &key).await;
    // The waiter is polled first, so it is waiting (or about to) when the release goes out;
    // the index from before the release is what makes the order not matter.
    let waiter = timed(wait(&rig.b, &key, index, Duration::from_secs(20)));
    let releaser = async {
        rig.a.release(grant).await.unwrap();
    };
    let ((moved, took), ()) = tokio::join!(waiter, releaser);
    assert!(took < PROMPT, "waited {took:?}");
    assert!(moved > index, "{moved} should be above {index}");
    acquire(&rig.b, &key, &holder("m2", "gw-b")).await;
    rig.finish().await;
}

async fn wait_returns_at_once_when_the_release_came_first<B: LockBackend>(rig: Rig<B>) {
    let key = rig.key("orders", 0);
    let grant = acquire(&rig.a, &key, &holder("m1", "gw-a")).await;
    let (_, index) = busy(&rig.b, &key).await;
    rig.a.release(grant).await.unwrap();
    let (moved, took) = timed(wait(&rig.b, &key, index, Duration::from_secs(20))).await;
    assert!(took < PROMPT, "waited {took:?}");
    assert!(moved > index);
    rig.finish().await;
}

async fn wait_times_out_when_nothing_changes<B: LockBackend>(rig: Rig<B>) {
    let key = rig.key("orders", 0);
    let _grant = acquire(&rig.a, &key, &holder("m1", "gw-a")).await;
    // A write under another topic must not end the wait.
    let _elsewhere = acquire(&rig.a, &rig.key("payments", 0), &holder("m1", "gw-a")).await;
    let (_, index) = busy(&rig.b, &key).await;
    let timeout = Duration::from_secs(2);
    let (next, took) = timed(wait(&rig.b, &key, index, timeout)).await;
    assert!(
        took >= timeout.mul_f64(0.9) && took < timeout * 2,
        "waited {took:?}"
    );
    // Waiting again on what came back blocks too: it is a valid index, not a spurious change.
    let (_, took) = timed(wait(&rig.b, &key, next, timeout)).await;
    assert!(
        took >= timeout.mul_f64(0.9),
        "second wait returned after {took:?}"
    );
    // Below Consul's shortest blocking wait (1 s) the caller's timeout still holds.
    let short = Duration::from_millis(300);
    let (_, took) = timed(wait(&rig.b, &key, next, short)).await;
    assert!(
        took >= short && took < Duration::from_millis(900),
        "short wait took {took:?}"
    );
    busy(&rig.b, &key).await;
    rig.finish().await;
}

async fn list_shows_exactly_the_held_locks<B: LockBackend>(rig: Rig<B>) {
    let other_group = format!("{}-other", rig.group);
    let k1 = rig.key("orders", 1);
    let k0 = rig.key("orders", 0);
    let k2 = LockKey::new(other_group.clone(), "orders", 0);
    let (h1, h0, h2) = (
        holder("m1", "gw-a"),
        holder("m0", "gw-a"),
        holder("m2", "gw-b"),
    );
    // Acquired out of order: list sorts by key.
    let g1 = acquire(&rig.a, &k1, &h1).await;
    let g0 = acquire(&rig.a, &k0, &h0).await;
    let g2 = acquire(&rig.b, &k2, &h2).await;
    let released = acquire(&rig.b, &rig.key("orders", 9), &h2).await;
    rig.b.release(released).await.unwrap();

    let mine: Vec<_> = rig.b.list(None).await.unwrap();
    let mine: Vec<_> = mine
        .into_iter()
        .filter(|h| h.key.group == rig.group || h.key.group == other_group)
        .map(|h| (h.key, h.token, h.holder))
        .collect();
    assert_eq!(
        mine,
        vec![
            (k0.clone(), g0.token(), h0.clone()),
            (k1.clone(), g1.token(), h1.clone()),
            (k2.clone(), g2.token(), h2.clone()),
        ]
    );
    let group: Vec<_> = rig.a.list(Some(&rig.group)).await.unwrap();
    let group: Vec<_> = group.into_iter().map(|h| h.key).collect();
    assert_eq!(group, vec![k0.clone(), k1]);
    let other: Vec<_> = rig.a.list(Some(&other_group)).await.unwrap();
    assert_eq!(
        other.into_iter().map(|h| h.key).collect::<Vec<_>>(),
        vec![k2]
    );
    assert!(rig.a.list(Some("no-such-group")).await.unwrap().is_empty());
    rig.a.release(g0).await.unwrap();
    let group: Vec<_> = rig.a.list(Some(&rig.group)).await.unwrap();
    assert_eq!(
        group.into_iter().map(|h| h.key).collect::<Vec<_>>(),
        vec![rig.key("orders", 1)]
    );
    rig.finish().await;
}

async fn shutdown_frees_the_keys_at_once<B: LockBackend>(rig: Rig<B>) {
    let (k0, k1) = (rig.key("orders", 0), rig.key("orders", 1));
    let _g0 = acquire(&rig.a, &k0, &holder("m0", "gw-a")).await;
    let _g1 = acquire(&rig.a, &k1, &holder("m1", "gw-a")).await;
    rig.a.shutdown().await;
    assert_eq!(
        *rig.a.session_state().borrow(),
        SessionState::Lost {
            reason: "shut down".into()
        }
    );
    // One try each, no retry: with a 5 s lock-delay on Consul this proves shutdown released
    // the keys explicitly rather than only destroying the session.
    let (_, took) = timed(async {
        acquire(&rig.b, &k0, &holder("n0", "gw-b")).await;
        acquire(&rig.b, &k1, &holder("n1", "gw-b")).await;
    })
    .await;
    assert!(took < PROMPT, "{took:?}");
    match rig
        .a
        .try_acquire(&rig.key("orders", 2), &holder("m2", "gw-a"))
        .await
    {
        Err(CoordinationError::NoSession { .. }) => {}
        other => panic!("a shut-down backend must refuse to acquire, got {other:?}"),
    }
    rig.finish().await;
}

async fn lost_session_frees_the_keys_and_recovers<B: LockBackend>(rig: Rig<B>) {
    let key = rig.key("orders", 0);
    let stale = acquire(&rig.a, &key, &holder("m1", "gw-a")).await;
    let old = live_id(&rig.a);
    let mut state = rig.a.session_state();
    rig.invalidator.invalidate(&rig.a).await;

    // The backend notices: Lost, or (if it recovered before we looked) a new Live id.
    let noticed = timed(state.wait_for(|s| *s != SessionState::Live { id: old.clone() }));
    let (noticed, took) = tokio::time::timeout(DEADLINE, noticed)
        .await
        .expect("state change");
    drop(noticed.unwrap());
    assert!(took < PROMPT, "noticed after {took:?}");

    // The old key is free for the other instance (after Consul's lock-delay).
    let taken = acquire_eventually(&rig.b, &key, &holder("m2", "gw-b")).await;

    // The invalidated instance gets a new session and can lock again.
    let new = wait_for("a new live session", DEADLINE, || async {
        match &*rig.a.session_state().borrow() {
            SessionState::Live { id } if *id != old => Some(id.clone()),
            _ => None,
        }
    })
    .await;
    let fresh = acquire(&rig.a, &rig.key("orders", 1), &holder("m1", "gw-a")).await;
    assert_eq!(fresh.session(), new);
    assert_eq!(busy(&rig.a, &key).await.0, Some(holder("m2", "gw-b")));

    // Releasing the stale grant is fine and does not touch the new holder's lock.
    rig.a.release(stale).await.unwrap();
    let held = rig.b.list(Some(&rig.group)).await.unwrap();
    let held: Vec<_> = held.into_iter().map(|h| (h.key, h.token)).collect();
    assert_eq!(
        held,
        vec![(key, taken.token()), (rig.key("orders", 1), fresh.token())]
    );
    rig.finish().await;
}

async fn instance_records_live_and_die_with_the_session<B: LockBackend>(rig: Rig<B>) {
    let address = |instance: &'static str| rig.b.instance_address(instance);
    assert_eq!(address("gw-a").await.unwrap().as_deref(), Some(ADDRESS_A));
    assert_eq!(address("gw-b").await.unwrap().as_deref(), Some(ADDRESS_B));
    assert_eq!(address("gw-c").await.unwrap(), None, "never registered");

    // The records are not locks: a listing of the whole prefix shows only the lock.
    let key = rig.key("orders", 0);
    acquire(&rig.a, &key, &holder("m1", "gw-a")).await;
    let listed: Vec<LockKey> = rig
        .b
        .list(None)
        .await
        .unwrap()
        .into_iter()
        .map(|h| h.key)
        .collect();
    assert_eq!(listed, vec![key]);

    // A lost session takes its record along; the recovered one registers again.
    let old = live_id(&rig.a);
    rig.invalidator.invalidate(&rig.a).await;
    wait_for("a new live session", DEADLINE, || async {
        match &*rig.a.session_state().borrow() {
            SessionState::Live { id } if *id != old => Some(()),
            _ => None,
        }
    })
    .await;
    assert_eq!(address("gw-a").await.unwrap().as_deref(), Some(ADDRESS_A));

    // Shut down, the instance is gone.
    rig.a.shutdown().await;
    assert_eq!(address("gw-a").await.unwrap(), None, "after shutdown");
    rig.finish().await;
}

fn member(id: &str, gateway: &str) -> MemberRecord {
    MemberRecord {
        member_id: id.into(),
        member: format!("label of {id}"),
        gateway: gateway.into(),
        max_partitions: 0,
        joined_at_ms: 1_700_000_000_000,
    }
}

async fn members_join_leave_and_vanish_with_the_session<B: LockBackend>(rig: Rig<B>) {
    let (group, topic) = (rig.group.clone(), "orders");
    async fn now<B: LockBackend>(backend: &B, group: &str, topic: &str) -> TopicView {
        backend
            .topic_view(group, topic, None, Duration::from_secs(1))
            .await
            .unwrap()
    }
    let view = |backend| now(backend, &group, topic);
    let lock = rig.key(topic, 0);
    acquire(&rig.a, &lock, &holder("m1", "gw-a")).await;
    let before = view(&rig.b).await.index;
    assert!(rig
        .a
        .join(&group, topic, &member("m-1", "gw-a"))
        .await
        .unwrap());
    assert!(rig
        .b
        .join(&group, topic, &member("m-2", "gw-b"))
        .await
        .unwrap());
    // A member id is one member: another instance cannot take it over while it lives.
    assert!(!rig
        .b
        .join(&group, topic, &member("m-1", "gw-b"))
        .await
        .unwrap());
    // Its own instance may write it again.
    assert!(rig
        .a
        .join(&group, topic, &member("m-1", "gw-a"))
        .await
        .unwrap());
    let seen = view(&rig.b).await;
    assert!(seen.index > before, "a join moves the topic's index");
    assert_eq!(
        seen.members.keys().cloned().collect::<Vec<_>>(),
        vec!["m-1".to_string(), "m-2".to_string()]
    );
    assert_eq!(seen.members["m-1"], member("m-1", "gw-a"));
    let listed = rig.b.members(&group).await.unwrap();
    assert_eq!(
        listed,
        vec![
            (topic.to_string(), member("m-1", "gw-a")),
            (topic.to_string(), member("m-2", "gw-b")),
        ]
    );
    assert!(rig.b.members("another-group").await.unwrap().is_empty());
    assert_eq!(
        seen.held.keys().copied().collect::<Vec<_>>(),
        vec![0],
        "locks as before"
    );
    // Records are not locks.
    let listed: Vec<LockKey> = rig
        .b
        .list(None)
        .await
        .unwrap()
        .into_iter()
        .map(|h| h.key)
        .collect();
    assert_eq!(listed, vec![lock.clone()]);

    // Leaving removes only one's own record.
    rig.b.leave(&group, topic, "m-1").await.unwrap();
    rig.b.leave(&group, topic, "m-2").await.unwrap();
    assert_eq!(
        view(&rig.a)
            .await
            .members
            .keys()
            .cloned()
            .collect::<Vec<_>>(),
        vec!["m-1".to_string()]
    );

    // A lost session takes its members along, and wakes a watcher of the topic.
    let index = view(&rig.b).await.index;
    let watch = rig.b.topic_view(&group, topic, Some(index), DEADLINE);
    let (woke, ()) = tokio::join!(watch, rig.invalidator.invalidate(&rig.a));
    let woke = woke.unwrap();
    let gone = wait_for("the member to vanish", DEADLINE, || async {
        let v = view(&rig.b).await;
        v.members.is_empty().then_some(v)
    })
    .await;
    assert!(gone.held.is_empty(), "and its locks");
    assert!(woke.index > index);
    rig.finish().await;
}

fn target(epoch: u64, assignment: &[(&str, &[i32])]) -> GroupTarget {
    GroupTarget {
        epoch,
        partitions: 4,
        members: assignment.iter().map(|(m, _)| (m.to_string(), 0)).collect(),
        reserved: Default::default(),
        assignment: assignment
            .iter()
            .map(|(m, ps)| (m.to_string(), ps.to_vec()))
            .collect(),
        computed_by: "gw-a".into(),
        computed_at_ms: 1_700_000_000_000,
    }
}

async fn targets_are_check_and_set_and_outlive_sessions<B: LockBackend>(rig: Rig<B>) {
    let (group, topic) = (rig.group.clone(), "orders");
    async fn now<B: LockBackend>(backend: &B, group: &str, topic: &str) -> TopicView {
        backend
            .topic_view(group, topic, None, Duration::from_secs(1))
            .await
            .unwrap()
    }
    let view = |backend| now(backend, &group, topic);
    assert_eq!(view(&rig.a).await.target, None, "none before the first");
    let first = target(1, &[("m-1", &[0, 1, 2, 3])]);
    // Creating needs the key absent: of two first writers, one wins.
    assert!(rig
        .a
        .publish_target(&group, topic, &first, None)
        .await
        .unwrap());
    let other = target(1, &[("m-2", &[0, 1, 2, 3])]);
    assert!(!rig
        .b
        .publish_target(&group, topic, &other, None)
        .await
        .unwrap());
    let seen = view(&rig.b).await;
    let published = seen.target.clone().expect("the first target");
    assert_eq!(published.target, first);
    // Replacing needs the index of the write it replaces: of two writers of the next epoch
    // from the same view, one wins; a stale index loses.
    let second = target(2, &[("m-1", &[0, 1]), ("m-2", &[2, 3])]);
    assert!(rig
        .b
        .publish_target(&group, topic, &second, Some(published.index))
        .await
        .unwrap());
    assert!(!rig
        .a
        .publish_target(&group, topic, &other, Some(published.index))
        .await
        .unwrap());
    let seen = view(&rig.a).await;
    let published = seen.target.clone().expect("the second target");
    assert_eq!(published.target, second);
    assert!(
        seen.index >= published.index,
        "the view is at or after the write"
    );
    // Targets are not locks, nor members; a group's are listed by topic.
    assert!(rig.a.list(None).await.unwrap().is_empty());
    assert!(rig.a.members(&group).await.unwrap().is_empty());
    let listed = rig.b.targets(&group).await.unwrap();
    assert_eq!(
        listed.keys().cloned().collect::<Vec<_>>(),
        vec![topic.to_string()]
    );
    assert_eq!(listed[topic].target, second);
    // Bound to no session: the writer's session ending leaves it.
    // (Consul has destroyed the session, and with it its session-bound keys, once the
    // invalidation returns.)
    rig.invalidator.invalidate(&rig.b).await;
    assert_eq!(
        view(&rig.a).await.target.map(|t| t.target),
        Some(second),
        "the target stays when its writer's session ends"
    );
    // Removing needs the index of the stored one too.
    let index = view(&rig.a).await.target.expect("still there").index;
    assert!(!rig.a.remove_target(&group, topic, index - 1).await.unwrap());
    assert!(rig.a.remove_target(&group, topic, index).await.unwrap());
    assert_eq!(view(&rig.a).await.target, None);
    assert!(
        rig.a.remove_target(&group, topic, index).await.unwrap(),
        "gone already counts as gone"
    );
    rig.finish().await;
}

// ---------------------------------------------------------------------------------------------
// Consul only

/// After a session is invalidated, Consul refuses its keys for the lock-delay although they
/// are free, and no write marks the end of the delay: the wait must not sleep until its own
/// timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consul_wait_ends_with_the_lock_delay() {
    let delay = Duration::from_secs(3);
    let Some(rig) = consul_rig("consul_wait_ends_with_the_lock_delay", delay).await else {
        return;
    };
    let key = rig.key("orders", 0);
    let _lost = acquire(&rig.a, &key, &holder("m1", "gw-a")).await;
    let (_, invalidated_at) = timed(rig.invalidator.invalidate(&rig.a)).await;
    let started = Instant::now() - invalidated_at;
    let view = rig
        .b
        .topic_view(&key.group, &key.topic, None, Duration::ZERO)
        .await
        .unwrap();
    assert!(view.held.is_empty(), "the key is free: {view:?}");
    let refused = rig
        .b
        .try_acquire(&key, &holder("m2", "gw-b"))
        .await
        .unwrap();
    assert!(
        matches!(refused, Acquisition::Delayed),
        "refused only by the lock-delay: {refused:?}"
    );
    // No write ends a lock-delay: the backend says how long to leave the key alone.
    let cut = rig.b.wait_cut(&key, Duration::from_secs(30));
    assert!(cut <= delay, "told to wait {cut:?}");
    tokio::time::sleep(cut).await;
    acquire_eventually(&rig.b, &key, &holder("m2", "gw-b")).await;
    let total = started.elapsed();
    assert!(
        total >= delay.mul_f64(0.9) && total < delay + PROMPT,
        "took over after {total:?}"
    );
    rig.finish().await;
}

/// Cut off from Consul, an instance suspends its locks once its fence window has passed
/// since its last confirmed renew (`valid_until` is past, while Consul still holds its lock:
/// nobody else can have it yet), keeps the session while it waits, and declares the session
/// lost once a whole session TTL has passed without a confirmation; reconnected, it gets a
/// new session and its old one is gone. Run for a TTL-only session and check-bound ones
/// (all: window = lock-delay - 250 ms). With a check, Consul may end the session by the check
/// during the wait, and another instance may then take the key: the suspended instance does
/// nothing with it.
async fn self_fences_when_unreachable_and_recovers(test: &str, check: Check) {
    let Some(services) = Services::require(test) else {
        return;
    };
    let consul = services.consul_http_addr.clone();
    let upstream = consul
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    let upstream = tokio::net::lookup_host(&upstream)
        .await
        .unwrap()
        .next()
        .expect("Consul's address");
    // Closed, it refuses connects, as when Consul's host is gone; reopened on the same port.
    let relay = Relay::start(upstream).await.unwrap();
    let prefix = unique_name("kafka-lease-test");
    let group = unique_name("g");
    let key = LockKey::new(group.clone(), "orders", 0);
    let relayed = format!("http://{}", relay.addr());
    let lock_delay = Duration::from_secs(1);
    let gateway = FakeGateway::start().await;
    let config = match check {
        Check::Tcp => check_config(&relayed, &prefix, &unique_name("gw-a"), gateway.addr),
        Check::Ttl => ConsulLockConfig {
            check: Some(SessionCheck::ttl(DEFAULT_CHECK_TTL)),
            ..consul_config(&relayed, &prefix, &unique_name("gw-a"), lock_delay)
        },
        Check::None => consul_config(&relayed, &prefix, "gw-a", lock_delay),
    };
    let a = ConsulLocks::connect(config).await.unwrap();
    let b = ConsulLocks::connect(consul_config(&consul, &prefix, "gw-b", lock_delay))
        .await
        .unwrap();
    let window = a.config().fence_window();
    let _grant = acquire(&a, &key, &holder("m1", "gw-a")).await;
    let old = live_id(&a);

    relay.close().await;
    assert!(
        a.ping().await.is_err(),
        "ping must fail while Consul is unreachable"
    );
    // Suspended: the deadline passes, the session stays.
    let until = a.valid_until().expect("a deadline while live");
    tokio::time::sleep_until(until).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        *a.session_state().borrow(),
        SessionState::Live { id: old.clone() },
        "suspended, not lost, once the fence window passes"
    );
    assert!(
        a.valid_until().is_some_and(|u| u <= Instant::now()),
        "no side effect may pass the fence while suspended"
    );
    if check == Check::None {
        // Consul still holds the lock for the old session: the fence came first.
        assert_eq!(busy(&b, &key).await.0, Some(holder("m1", "gw-a")));
    }
    let mut state = a.session_state();
    let ttl = a.config().session_ttl;
    let lost = tokio::time::timeout(
        ttl + PROMPT,
        state.wait_for(|s| *s != SessionState::Live { id: old.clone() }),
    )
    .await
    .expect("the session given up")
    .unwrap()
    .clone();
    let silent = a.last_confirmed().expect("a renew was confirmed").elapsed();
    assert_eq!(a.valid_until(), None, "no deadline without a live session");
    let SessionState::Lost { reason } = lost else {
        panic!("expected Lost, got {lost:?}")
    };
    assert!(reason.contains("consul unreachable since"), "{reason}");
    // Not before a whole session TTL of silence, and not much later.
    assert!(
        silent >= ttl && silent < ttl + Duration::from_secs(2),
        "given up after {silent:?} (session TTL {ttl:?}, window {window:?})"
    );

    relay.reopen().await.unwrap();
    let new = wait_for(
        "a new live session after reconnecting",
        DEADLINE,
        || async {
            match &*a.session_state().borrow() {
                SessionState::Live { id } if *id != old => Some(id.clone()),
                _ => None,
            }
        },
    )
    .await;
    a.ping().await.unwrap();
    // The abandoned session was destroyed (not left to expire): its key frees up after the
    // lock-delay, well before the old session's own 2×TTL.
    acquire_eventually(&b, &key, &holder("m2", "gw-b")).await;
    let fresh = acquire(&a, &LockKey::new(group, "orders", 1), &holder("m1", "gw-a")).await;
    assert_eq!(fresh.session(), new);
    a.shutdown().await;
    b.shutdown().await;
    gateway.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consul_self_fences_when_unreachable_and_recovers() {
    self_fences_when_unreachable_and_recovers(
        "consul_self_fences_when_unreachable_and_recovers",
        Check::None,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consul_check_bound_self_fences_when_unreachable_and_recovers() {
    self_fences_when_unreachable_and_recovers(
        "consul_check_bound_self_fences_when_unreachable_and_recovers",
        Check::Tcp,
    )
    .await;
}

/// The TTL check's recovery: cut off, the passes fail and the check goes critical (Consul
/// refuses sessions bound to it); reconnected, the next pass makes it pass again and a new
/// session is created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consul_ttl_check_bound_self_fences_when_unreachable_and_recovers() {
    self_fences_when_unreachable_and_recovers(
        "consul_ttl_check_bound_self_fences_when_unreachable_and_recovers",
        Check::Ttl,
    )
    .await;
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Check {
    None,
    Tcp,
    Ttl,
}

/// Cut off from Consul for longer than its fence window but less than its session's TTL
/// (what a Consul leader election costs), an instance keeps its session: its locks are
/// suspended while no renew is confirmed, and once Consul answers again, the same session
/// is confirmed, the deadline moves ahead, and the lock was held by it all along. (Before
/// the suspension, the instance gave the session up at the fence window, and every lease
/// of the gateway ended with it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consul_resumes_the_same_session_after_an_outage_shorter_than_its_ttl() {
    let test = "consul_resumes_the_same_session_after_an_outage_shorter_than_its_ttl";
    let Some(services) = Services::require(test) else {
        return;
    };
    let consul = services.consul_http_addr.clone();
    let upstream = consul
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    let upstream = tokio::net::lookup_host(&upstream)
        .await
        .unwrap()
        .next()
        .expect("Consul's address");
    let relay = Relay::start(upstream).await.unwrap();
    let prefix = unique_name("kafka-lease-test");
    let key = LockKey::new(unique_name("g"), "orders", 0);
    let relayed = format!("http://{}", relay.addr());
    let lock_delay = Duration::from_secs(1);
    let a = ConsulLocks::connect(consul_config(&relayed, &prefix, "gw-a", lock_delay))
        .await
        .unwrap();
    let b = ConsulLocks::connect(consul_config(&consul, &prefix, "gw-b", lock_delay))
        .await
        .unwrap();
    let window = a.config().fence_window();
    let grant = acquire(&a, &key, &holder("m1", "gw-a")).await;
    let old = live_id(&a);

    relay.close().await;
    // Three fence windows of silence: suspended all along, never lost.
    let mut state = a.session_state();
    let changed = tokio::time::timeout(
        window * 3,
        state.wait_for(|s| *s != SessionState::Live { id: old.clone() }),
    )
    .await;
    assert!(
        changed.is_err(),
        "the session was given up: {:?}",
        *a.session_state().borrow()
    );
    assert!(
        a.valid_until().is_some_and(|u| u <= Instant::now()),
        "suspended: no side effect may pass the fence"
    );
    assert_eq!(busy(&b, &key).await.0, Some(holder("m1", "gw-a")));

    relay.reopen().await.unwrap();
    let resumed = wait_for("the deadline ahead again", DEADLINE, || async {
        a.valid_until().filter(|u| *u > Instant::now())
    })
    .await;
    assert!(resumed > Instant::now());
    assert_eq!(
        *a.session_state().borrow(),
        SessionState::Live { id: old.clone() },
        "the same session, confirmed again"
    );
    assert_eq!(grant.session(), old);
    assert_eq!(busy(&b, &key).await.0, Some(holder("m1", "gw-a")));
    a.shutdown().await;
    b.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// Check-bound sessions

/// A stand-in for a gateway's gRPC listener, for the agent's TCP check to dial: accepts and
/// drops connections until killed, after which connects are refused (as after a crash).
struct FakeGateway {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl FakeGateway {
    async fn start() -> FakeGateway {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            while let Ok((connection, _)) = listener.accept().await {
                drop(connection);
            }
        });
        FakeGateway { addr, task }
    }

    /// Closes the listener (the task owns it): connection refused from now on.
    async fn kill(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

/// The session as Consul has it (empty once it is gone).
async fn session_info(
    client: &ConsulClient,
    id: &str,
) -> Vec<consulrs::api::session::common::SessionEntry> {
    consulrs::session::read(client, id, None)
        .await
        .expect("reading the session")
        .response
}

async fn registered_services(client: &ConsulClient) -> Vec<String> {
    consulrs::service::list(client, None)
        .await
        .expect("listing the agent's services")
        .response
        .into_keys()
        .collect()
}

/// The crash-failover path: a check-bound holder's "process" dies (its listener closes),
/// the agent's check fails, Consul invalidates the session, and a waiting instance (TTL-only
/// in even rounds, check-bound in odd ones) takes the key after the lock-delay. At that
/// moment the dead holder must no longer consider itself valid: no overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consul_check_bound_session_fails_over_in_seconds() {
    const ROUNDS: usize = 10;
    let services = kafka_lease_testkit::require_services!();
    let address = services.consul_http_addr.clone();
    let client = consul_client(&address);
    let mut times = Vec::new();
    for round in 0..ROUNDS {
        let prefix = unique_name("kafka-lease-test");
        let key = LockKey::new(unique_name("g"), "orders", 0);
        let gateway_a = FakeGateway::start().await;
        let gateway_b = FakeGateway::start().await;
        let a_config = check_config(&address, &prefix, &unique_name("gw-a"), gateway_a.addr);
        let b_check_bound = round % 2 == 1;
        let b_config = if b_check_bound {
            check_config(&address, &prefix, &unique_name("gw-b"), gateway_b.addr)
        } else {
            ConsulLockConfig {
                check: None,
                ..check_config(&address, &prefix, &unique_name("gw-b"), gateway_b.addr)
            }
        };
        let a = ConsulLocks::connect(a_config.clone()).await.unwrap();
        let b = ConsulLocks::connect(b_config.clone()).await.unwrap();
        let old = live_id(&a);

        if round < 2 {
            // What Consul made of the two kinds of session.
            let info = session_info(&client, &old).await;
            let checks: Vec<_> = info[0]
                .service_checks
                .iter()
                .flatten()
                .filter_map(|c| c.id.clone())
                .collect();
            assert_eq!(checks, vec![a_config.check_id()], "{info:?}");
            assert_eq!(info[0].node_checks, Some(vec!["serfHealth".to_string()]));
            assert_eq!(info[0].lock_delay, Some(1_500_000_000));
            assert_eq!(info[0].behavior.as_deref(), Some("delete"));
            let info = session_info(&client, &live_id(&b)).await;
            if b_check_bound {
                assert!(info[0].service_checks.is_some(), "{info:?}");
            } else {
                // TTL-only: no checks at all, not even serfHealth.
                assert_eq!(info[0].node_checks, Some(vec![]), "{info:?}");
                assert!(info[0].service_checks.is_none(), "{info:?}");
            }
            assert!(registered_services(&client)
                .await
                .contains(&a_config.service_id()));
        }

        let _grant = acquire(&a, &key, &holder("m1", "gw-a")).await;
        let (_, mut index) = busy(&b, &key).await;
        gateway_a.kill().await;
        let killed = Instant::now();
        let taken = loop {
            assert!(
                killed.elapsed() < PROMPT,
                "round {round}: no failover within {PROMPT:?}"
            );
            match b.try_acquire(&key, &holder("m2", "gw-b")).await {
                Ok(Acquisition::Acquired(grant)) => break grant,
                Ok(Acquisition::Held) => {
                    index = b
                        .topic_view(&key.group, &key.topic, Some(index), Duration::from_secs(5))
                        .await
                        .map_or(index, |view| view.index);
                }
                Ok(Acquisition::Delayed) => {
                    tokio::time::sleep(b.wait_cut(&key, Duration::from_secs(5))).await;
                }
                Err(e) => panic!("round {round}: try_acquire failed: {e}"),
            }
        };
        let took = killed.elapsed();
        // No overlap: by now the dead holder's deadline has passed and it knows it.
        let now = Instant::now();
        let until = a.valid_until();
        assert!(
            until.is_none_or(|u| u <= now),
            "round {round}: the old holder is still valid for {:?} after the takeover",
            until.map(|u| u - now)
        );
        assert_ne!(
            *a.session_state().borrow(),
            SessionState::Live { id: old.clone() }
        );
        // The old session is gone, its check critical, so no new one was created for it.
        assert!(session_info(&client, &old).await.is_empty());
        assert!(matches!(
            *a.session_state().borrow(),
            SessionState::Lost { .. }
        ));
        assert_eq!(taken.session(), live_id(&b));
        println!(
            "round {round}: check-bound holder died, {} waiter acquired after {took:?}",
            if b_check_bound {
                "check-bound"
            } else {
                "TTL-only"
            }
        );
        times.push(took);

        a.shutdown().await;
        b.shutdown().await;
        let left = registered_services(&client).await;
        assert!(
            !left.contains(&a_config.service_id()) && !left.contains(&b_config.service_id()),
            "shutdown must deregister the service checks: {left:?}"
        );
        gateway_b.kill().await;
    }
    times.sort();
    println!(
        "check-bound crash failover over {ROUNDS} rounds: min {:?}, median {:?}, max {:?}",
        times[0],
        times[(ROUNDS - 1) / 2],
        times[ROUNDS - 1]
    );
    // check interval (1 s) + lock-delay (1.5 s) + the waiter's reaction, with room for a
    // loaded machine.
    assert!(times[ROUNDS - 1] < Duration::from_secs(5), "{times:?}");
}

/// `valid_until` is `S + fence_window`: never further ahead than the window, moved forward by
/// every renew so that it never lapses while Consul answers, and gone at shutdown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consul_valid_until_moves_forward_with_renews_and_ends_at_shutdown() {
    let services = kafka_lease_testkit::require_services!();
    let address = services.consul_http_addr.clone();
    let prefix = unique_name("kafka-lease-test");
    let gateway = FakeGateway::start().await;
    for config in [
        check_config(&address, &prefix, &unique_name("gw-a"), gateway.addr),
        ConsulLockConfig {
            check: None,
            renew_interval: Some(Duration::from_millis(400)),
            ..check_config(&address, &prefix, &unique_name("gw-a"), gateway.addr)
        },
    ] {
        let window = config.fence_window();
        let a = ConsulLocks::connect(config).await.unwrap();
        let first = a.valid_until().expect("live after connect");
        let left = first - Instant::now();
        assert!(
            left <= window && left > window / 2,
            "{left:?} of {window:?}"
        );
        // Sampled for 2 s: always ahead of now, never more than a window ahead, and moving.
        let mut latest = first;
        let sampling = Instant::now();
        while sampling.elapsed() < Duration::from_secs(2) {
            let now = Instant::now();
            let until = a.valid_until().expect("still live");
            assert!(until > now, "lapsed while Consul answers");
            assert!(until <= now + window);
            assert!(until >= latest, "moved backwards");
            latest = until;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            latest >= first + Duration::from_millis(1500),
            "renews moved it by only {:?}",
            latest - first
        );
        a.shutdown().await;
        assert_eq!(a.valid_until(), None);
    }
    gateway.kill().await;
}

/// A gateway restarted on its port faster than one check interval would keep the dead
/// process's check passing, and its session and locks alive until the TTL. `connect`
/// deregisters such a registration (same check address), which ends that session now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consul_restart_on_the_same_address_ends_the_old_session() {
    let services = kafka_lease_testkit::require_services!();
    let address = services.consul_http_addr.clone();
    let client = consul_client(&address);
    let prefix = unique_name("kafka-lease-test");
    let key = LockKey::new(unique_name("g"), "orders", 0);
    // The port stays open throughout: the "restarted" process listens where the old one did.
    let gateway = FakeGateway::start().await;
    let old_config = check_config(&address, &prefix, &unique_name("gw-old"), gateway.addr);
    let old = ConsulLocks::connect(old_config.clone()).await.unwrap();
    let old_session = live_id(&old);
    let _grant = acquire(&old, &key, &holder("m1", "gw-old")).await;
    // Crash: no shutdown, renews stop, nothing is cleaned up.
    drop(old);
    let b = ConsulLocks::connect(consul_config(
        &address,
        &prefix,
        "gw-b",
        Duration::from_secs(1),
    ))
    .await
    .unwrap();
    assert_eq!(busy(&b, &key).await.0, Some(holder("m1", "gw-old")));

    let (new, took) = timed(async {
        let new = ConsulLocks::connect(check_config(
            &address,
            &prefix,
            &unique_name("gw-new"),
            gateway.addr,
        ))
        .await
        .unwrap();
        acquire_eventually(&b, &key, &holder("m2", "gw-b")).await;
        new
    })
    .await;
    println!("old session's key taken {took:?} after the restart on the same address");
    // Lock-delay (1.5 s) and a little, far below the old session's TTL (10 s, 20 s server side).
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert!(session_info(&client, &old_session).await.is_empty());
    let services = registered_services(&client).await;
    assert!(!services.contains(&old_config.service_id()), "{services:?}");
    assert!(
        services.contains(&new.config().service_id()),
        "{services:?}"
    );
    new.shutdown().await;
    b.shutdown().await;
    gateway.kill().await;
}

/// `validate` refuses every setting that breaks the self-fence invariant, naming the setting,
/// the value and the rule.
#[test]
fn the_config_refuses_settings_that_break_the_fence_invariant() {
    let base = ConsulLockConfig {
        instance: "gw-1".into(),
        ..ConsulLockConfig::default()
    };
    let checked = ConsulLockConfig {
        check: Some(SessionCheck::tcp("127.0.0.1:50051")),
        ..base.clone()
    };
    base.validate().unwrap();
    checked.validate().unwrap();
    assert_eq!(checked.fence_window(), checked.lock_delay - FENCE_MARGIN);
    // TTL-only too: its node's deregistration can end it at any moment (see "Self-fencing" in
    // docs/ARCHITECTURE.md), so the TTL does not widen its window.
    assert_eq!(base.fence_window(), base.lock_delay - FENCE_MARGIN);
    assert!(checked.renew_interval() * 3 <= checked.fence_window());
    assert!(base.renew_interval() * 3 <= base.fence_window());

    let refused = |config: ConsulLockConfig| config.validate().unwrap_err().to_string();
    // Check-bound: fewer than three renews per lock-delay window.
    let e = refused(ConsulLockConfig {
        renew_interval: Some(Duration::from_millis(500)),
        ..checked.clone()
    });
    assert!(
        e.contains("renew_interval = 500ms")
            && e.contains("lock_delay - 250ms")
            && e.contains("renew_interval * 3 <= fence_window"),
        "{e}"
    );
    // Check-bound: a lock-delay too short for any margin.
    let e = refused(ConsulLockConfig {
        lock_delay: Duration::from_millis(500),
        ..checked.clone()
    });
    assert!(
        e.contains("lock_delay = 500ms") && e.contains("1s ..= 60s"),
        "{e}"
    );
    // TTL-only: fewer than three renews per lock-delay window, though many per TTL.
    let e = refused(ConsulLockConfig {
        renew_interval: Some(Duration::from_millis(500)),
        ..base.clone()
    });
    assert!(
        e.contains("renew_interval = 500ms") && e.contains("lock_delay - 250ms"),
        "{e}"
    );
    // Consul runs no check more often than once a second.
    let e = refused(ConsulLockConfig {
        check: Some(SessionCheck {
            kind: CheckKind::Tcp {
                addr: "127.0.0.1:50051".into(),
                interval: Duration::from_millis(200),
                timeout: Duration::from_millis(200),
            },
            ..SessionCheck::tcp("127.0.0.1:50051")
        }),
        ..base
    });
    assert!(e.contains("check.interval = 200ms"), "{e}");
}

#[tokio::test]
async fn memory_valid_until_is_set_while_live_and_none_after_shutdown() {
    let store = MemoryLockStore::new();
    let a = store.backend("gw-a");
    assert!(a.valid_until().is_some_and(|u| u > Instant::now() + PROMPT));
    a.shutdown().await;
    assert_eq!(a.valid_until(), None);
}
