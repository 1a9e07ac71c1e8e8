//! A session can end in more ways than its TTL and its checks: when the Consul agent a
//! gateway talks to restarts (a graceful leave deregisters its node), Consul invalidates every
//! session of that node at once, TTL-only or not, and a waiter on another agent takes the keys
//! after the lock-delay. The gateway that held them must have stopped acting on them by then:
//! never two holders that can commit. And a lock taken under a session that ends before its
//! lease is installed never becomes a lease. (In its own test binary: it restarts a Consul
//! agent.)

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use consulrs::client::ConsulClient;
use kafka_lease_client::AcquireOptions;
use kafka_lease_testkit::{unique_name, wait_for, ConsulClientAgent};
use support::{
    consul, create_topic, kafka_committed, produce_n, producer, relay_kafka, unique_prefix,
    GatewayProcess,
};
use tokio::time::Instant;

const DEADLINE: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_restart_under_a_ttl_only_gateway_never_leaves_two_holders_that_can_commit() {
    let services = kafka_lease_testkit::require_services!();
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(unique_name("agent"));
    let mut agent = ConsulClientAgent::start(&services, &unique_name("node-a"), dir).await;

    // Gateway A talks to its own client agent, with a TTL-only session (no check can end
    // it); gateway B talks to the server's agent.
    let prefix = unique_prefix();
    let a = GatewayProcess::start(
        &services,
        &prefix,
        &unique_name("gw-a"),
        &["--consul", &agent.http_addr, "--consul-check", "none"],
    )
    .await;
    let b = GatewayProcess::start(
        &services,
        &prefix,
        &unique_name("gw-b"),
        &["--consul-check", "none"],
    )
    .await;
    let topic = create_topic(&services, 1).await;
    produce_n(&producer(&services), &topic, 0, 200).await;
    let group = unique_name("g");
    let (client_a, client_b) = (a.client().await, b.client().await);
    let old = client_a
        .acquire(
            AcquireOptions::new(&group, &topic)
                .partition(0)
                .member("old")
                .ttl(Duration::from_secs(60)),
        )
        .await
        .expect("acquire on A");
    let old = Arc::new(old);
    old.commit(1).await.expect("A commits while healthy");

    // A's client commits without pause, noting when each accepted commit was sent.
    let accepted: Arc<Mutex<Vec<(Instant, i64)>>> = Arc::default();
    let committer = {
        let accepted = accepted.clone();
        let old = old.clone();
        tokio::spawn(async move {
            for offset in 2..200 {
                let sent = Instant::now();
                match old.commit(offset).await {
                    Ok(_) => accepted
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push((sent, offset)),
                    Err(err) => return err,
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            panic!("the old holder's commits were never refused");
        })
    };
    let waiter = {
        let options = AcquireOptions::new(&group, &topic)
            .partition(0)
            .member("successor")
            .wait(DEADLINE);
        tokio::spawn(async move {
            let granted = client_b.acquire(options).await;
            (granted, Instant::now())
        })
    };

    // The agent under A restarts: its node leaves, and A's session ends with it.
    let left_at = Instant::now();
    agent.leave().await;
    let (granted, acquired_at) = tokio::time::timeout(DEADLINE, waiter)
        .await
        .expect("the waiter returns")
        .expect("join");
    let successor = granted.expect("the successor gets the partition");
    println!(
        "successor acquired {:?} after the agent under A began to leave",
        acquired_at - left_at
    );
    assert!(successor.fencing_token() > old.fencing_token());
    agent.restart().await;

    let refused = tokio::time::timeout(DEADLINE, committer)
        .await
        .expect("the old holder's commits are refused in time")
        .expect("join");
    println!("the old holder's commit was refused: {refused}");
    let accepted = accepted.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let late: Vec<_> = accepted
        .iter()
        .filter(|(sent, _)| *sent > acquired_at)
        .collect();
    assert!(
        late.is_empty(),
        "the old holder committed after the successor was granted the partition \
         (two holders that could commit): {late:?}"
    );
    let last_old = accepted.last().map_or(1, |(_, offset)| *offset);
    assert_eq!(
        successor.offset(),
        last_old,
        "the successor starts at the old holder's last accepted commit"
    );
    successor.commit(150).await.expect("the successor commits");
    assert_eq!(
        kafka_committed(&services, &group, &topic, 0).map(|c| c.0),
        Some(150),
        "the successor's offset stands"
    );
    successor.release().await.expect("release");
}

/// The session and `ModifyIndex` of the lock key at `path`, while a session holds it.
async fn key_holder(consul: &ConsulClient, path: &str) -> Option<(String, u64)> {
    let pairs = consulrs::kv::read(consul, path, None).await.ok()?.response;
    let pair = pairs.into_iter().find(|p| p.key == path)?;
    Some((pair.session?, pair.modify_index))
}

/// A lock taken under a session that ends while its lease is being opened (Kafka slow to
/// answer where the lease starts) must not become a lease: the sweep that ends the session's
/// leases has already run without it, and a lease installed after it would outlive its lock
/// (the chaos run's "overlapping grant" at start-up: a gateway's session ended under an
/// Acquire whose lease opened two seconds later, after another gateway took the partition).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_whose_session_ends_while_its_lease_opens_never_becomes_a_lease() {
    let services = kafka_lease_testkit::require_services!();
    let (_relayed_port, relay) = relay_kafka(&services).await;
    let relayed = relay.addr().to_string();
    let prefix = unique_prefix();
    let a = GatewayProcess::start(
        &services,
        &prefix,
        &unique_name("gw-a"),
        &["--kafka", &relayed, "--consul-check", "none"],
    )
    .await;
    let topic = create_topic(&services, 1).await;
    produce_n(&producer(&services), &topic, 0, 20).await;
    let group = unique_name("g");
    let client = a.client().await;
    // Once through, so the next Acquire knows the topic and the group's client and reaches
    // Consul with Kafka held.
    let warm = client
        .acquire(
            AcquireOptions::new(&group, &topic)
                .partition(0)
                .member("warm"),
        )
        .await
        .expect("warm-up acquire");
    warm.release().await.expect("warm-up release");

    let consul = consul(&services);
    let path = format!("{prefix}/{group}/{topic}/0");
    relay.hold();
    let acquire = {
        let options = AcquireOptions::new(&group, &topic)
            .partition(0)
            .member("m")
            .ttl(Duration::from_secs(60))
            .wait(DEADLINE);
        let client = client.clone();
        tokio::spawn(async move { client.acquire(options).await })
    };
    // The lock is taken; opening the lease waits on Kafka.
    let (old_session, old_token) = wait_for("A to lock the partition", DEADLINE, || {
        key_holder(&consul, &path)
    })
    .await;
    let seen = a.log().matches("consul lock session invalidated").count();
    consulrs::session::delete(&consul, &old_session, None)
        .await
        .expect("destroy A's session");
    wait_for("A to see its session end", DEADLINE, || async {
        (a.log().matches("consul lock session invalidated").count() > seen).then_some(())
    })
    .await;
    relay.release();

    let lease = tokio::time::timeout(DEADLINE, acquire)
        .await
        .expect("the Acquire returns")
        .expect("join")
        .expect("the Acquire is granted under A's new session");
    assert!(
        lease.fencing_token() > old_token,
        "the Acquire was granted the lock taken under the ended session {old_session} \
         (token {})",
        lease.fencing_token()
    );
    let (session, token) = key_holder(&consul, &path)
        .await
        .expect("the lease's key is held");
    assert_ne!(session, old_session, "held by the ended session");
    assert_eq!(
        token,
        lease.fencing_token(),
        "the key is held by the lease's own lock"
    );
    lease.release().await.expect("release");
}
