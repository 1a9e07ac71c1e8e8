//! The `LockBackend` contract: one set of scenarios, each run against two `MemoryLocks` of one
//! store and against two `ConsulLocks` sessions on the real Consul agent (skipped outside CI
//! when the services are down), plus the Consul-only behaviour (lock-delay, self-fencing).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::time::Duration;

use async_trait::async_trait;
use consulrs::client::{ConsulClient, ConsulClientSettingsBuilder};
use kafka_lease_server::coordination::consul::{ConsulLockConfig, ConsulLocks};
use kafka_lease_server::coordination::memory::{MemoryLockStore, MemoryLocks};
use kafka_lease_server::coordination::{
    Acquisition, CoordinationError, HolderInfo, LockBackend, LockGrant, LockKey, SessionState,
};
use kafka_lease_testkit::{unique_name, wait_for, Services};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
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
        a: store.backend("gw-a"),
        b: store.backend("gw-b"),
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
        // Consul's minimum TTL, and a quick renew so invalidations are noticed within ~1 s.
        session_ttl: Duration::from_secs(10),
        lock_delay,
        renew_interval: Duration::from_secs(1),
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
    let connect = |instance: &str| {
        ConsulLocks::connect(consul_config(&address, &prefix, instance, lock_delay))
    };
    let a = connect("gw-a").await.expect("connecting gw-a to Consul");
    let b = connect("gw-b").await.expect("connecting gw-b to Consul");
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

async fn busy(backend: &impl LockBackend, key: &LockKey) -> (Option<HolderInfo>, u64) {
    match backend
        .try_acquire(key, &holder("late", "gw-late"))
        .await
        .expect("try_acquire")
    {
        Acquisition::Busy { holder, index } => (holder, index),
        Acquisition::Acquired(grant) => panic!("expected {key} to be busy, acquired {grant:?}"),
    }
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
            Ok(Acquisition::Busy { .. }) | Err(_) => None,
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
    assert!(grant.token().0 > 0);
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
    let waiter = timed(rig.b.wait_for_change(&key, index, Duration::from_secs(20)));
    let releaser = async {
        rig.a.release(grant).await.unwrap();
    };
    let ((moved, took), ()) = tokio::join!(waiter, releaser);
    let moved = moved.unwrap();
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
    let (moved, took) = timed(rig.b.wait_for_change(&key, index, Duration::from_secs(20))).await;
    assert!(took < PROMPT, "waited {took:?}");
    assert!(moved.unwrap() > index);
    rig.finish().await;
}

async fn wait_times_out_when_nothing_changes<B: LockBackend>(rig: Rig<B>) {
    let key = rig.key("orders", 0);
    let _grant = acquire(&rig.a, &key, &holder("m1", "gw-a")).await;
    // A write under another topic must not end the wait.
    let _elsewhere = acquire(&rig.a, &rig.key("payments", 0), &holder("m1", "gw-a")).await;
    let (_, index) = busy(&rig.b, &key).await;
    let timeout = Duration::from_secs(2);
    let (next, took) = timed(rig.b.wait_for_change(&key, index, timeout)).await;
    let next = next.unwrap();
    assert!(
        took >= timeout.mul_f64(0.9) && took < timeout * 2,
        "waited {took:?}"
    );
    // Waiting again on what came back blocks too: it is a valid index, not a spurious change.
    let (_, took) = timed(rig.b.wait_for_change(&key, next, timeout)).await;
    assert!(
        took >= timeout.mul_f64(0.9),
        "second wait returned after {took:?}"
    );
    // Below Consul's shortest blocking wait (1 s) the caller's timeout still holds.
    let short = Duration::from_millis(300);
    let (_, took) = timed(rig.b.wait_for_change(&key, next, short)).await;
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
    let (seen, index) = busy(&rig.b, &key).await;
    assert_eq!(
        seen, None,
        "the key is free, refused only by the lock-delay"
    );
    let (woke, took) = timed(rig.b.wait_for_change(&key, index, Duration::from_secs(30))).await;
    woke.unwrap();
    assert!(took < PROMPT, "waited {took:?}");
    acquire_eventually(&rig.b, &key, &holder("m2", "gw-b")).await;
    let total = started.elapsed();
    assert!(
        total >= delay.mul_f64(0.9) && total < delay + PROMPT,
        "took over after {total:?}"
    );
    rig.finish().await;
}

/// A TCP relay to Consul that can be cut (every connection dropped, new ones refused) and
/// restored on the same port.
struct Relay {
    port: u16,
    upstream: String,
    tasks: JoinSet<()>,
}

impl Relay {
    async fn start(upstream: &str) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let mut relay = Relay {
            port,
            upstream: upstream.to_string(),
            tasks: JoinSet::new(),
        };
        relay.serve(listener);
        relay
    }

    fn serve(&mut self, listener: TcpListener) {
        let upstream = self.upstream.clone();
        self.tasks.spawn(async move {
            let mut connections = JoinSet::new();
            while let Ok((mut inbound, _)) = listener.accept().await {
                let upstream = upstream.clone();
                connections.spawn(async move {
                    if let Ok(mut outbound) = TcpStream::connect(&upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
    }

    /// Drops every connection and the listener: connects are refused from now on.
    async fn cut(&mut self) {
        self.tasks.shutdown().await;
    }

    async fn restore(&mut self) {
        let listener = TcpListener::bind(("127.0.0.1", self.port)).await.unwrap();
        self.serve(listener);
    }
}

/// Cut off from Consul, an instance declares its session lost once a whole TTL has passed
/// since its last confirmed renew, while Consul still holds its lock (nobody else can have
/// it yet); reconnected, it gets a new session and its old one is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consul_self_fences_when_unreachable_and_recovers() {
    let Some(services) = Services::require("consul_self_fences_when_unreachable_and_recovers")
    else {
        return;
    };
    let consul = services.consul_http_addr.clone();
    let upstream = consul
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    let mut relay = Relay::start(&upstream).await;
    let prefix = unique_name("kafka-lease-test");
    let group = unique_name("g");
    let key = LockKey::new(group.clone(), "orders", 0);
    let relayed = format!("http://127.0.0.1:{}", relay.port);
    let lock_delay = Duration::from_secs(1);
    let a = ConsulLocks::connect(consul_config(&relayed, &prefix, "gw-a", lock_delay))
        .await
        .unwrap();
    let b = ConsulLocks::connect(consul_config(&consul, &prefix, "gw-b", lock_delay))
        .await
        .unwrap();
    let ttl = a.config().session_ttl;
    let _grant = acquire(&a, &key, &holder("m1", "gw-a")).await;
    let old = live_id(&a);

    relay.cut().await;
    assert!(
        a.ping().await.is_err(),
        "ping must fail while Consul is unreachable"
    );
    let mut state = a.session_state();
    let lost = tokio::time::timeout(
        ttl + PROMPT,
        state.wait_for(|s| *s != SessionState::Live { id: old.clone() }),
    )
    .await
    .expect("self-fence")
    .unwrap()
    .clone();
    let silent = a.last_confirmed().expect("a renew was confirmed").elapsed();
    let SessionState::Lost { reason } = lost else {
        panic!("expected Lost, got {lost:?}")
    };
    assert!(reason.contains("consul unreachable since"), "{reason}");
    // Not before a whole TTL of silence, and not much later.
    assert!(
        silent >= ttl && silent < ttl + Duration::from_secs(2),
        "fenced after {silent:?}"
    );
    // Consul still holds the lock for the old session at this point: the fence came first.
    assert_eq!(busy(&b, &key).await.0, Some(holder("m1", "gw-a")));

    relay.restore().await;
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
}
