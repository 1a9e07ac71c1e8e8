//! A commit that is slow to reach Kafka (held in the network) when its lease ends must not land
//! after the next holder's commits: the end of a lease waits for its commits in flight before
//! the lock goes (the commit gate in docs/ARCHITECTURE.md). Gateway A reaches Kafka through a
//! relay on the test broker's `RELAYED` listener, so every byte it sends Kafka can be held.
//!
//! What the gate cannot cover: a commit held in the network while its gateway loses its
//! Consul session (cut off, or paused) can land after the successor's. Kafka does not fence
//! the offset commits of a client outside the group protocol, so the gateway cannot stop it;
//! it knows it, from the time of the answer, and counts and logs it.

mod support;

use std::time::Duration;

use kafka_lease_client::{AcquireOptions, Client};
use kafka_lease_proto::v1::{CommitRequest, CommitResponse};
use kafka_lease_testkit::{unique_name, wait_for, Relay};
use support::{
    consul_relay, create_topic, kafka_committed, metric_value, produce_n, producer, relay_kafka,
    scrape, unique_prefix, GatewayProcess,
};
use tokio::task::JoinHandle;
use tokio::time::Instant;

const DEADLINE: Duration = Duration::from_secs(60);

/// How long the test holds A's traffic at most when nothing else lets it go: a successor
/// that could commit while A's commit is held would have done so long before.
const HOLD_AT_MOST: Duration = Duration::from_secs(3);

/// Holds `relay` (gateway A's way to Kafka) and commits `offset` on `lease_id` through
/// `client`; returns once A has passed the fence check and sent the commit into the hold.
async fn commit_held(
    a: &GatewayProcess,
    client: &Client,
    relay: &Relay,
    lease_id: &str,
    offset: i64,
) -> JoinHandle<Result<tonic::Response<CommitResponse>, tonic::Status>> {
    let sent_before = a.log().matches("commit sent to Kafka").count();
    relay.hold();
    let mut raw = client.raw();
    let request = CommitRequest {
        lease_id: lease_id.to_string(),
        offset,
        ..Default::default()
    };
    let held = tokio::spawn(async move { raw.commit(request).await });
    wait_for(
        "gateway A to send the commit to Kafka",
        DEADLINE,
        || async { (a.log().matches("commit sent to Kafka").count() > sent_before).then_some(()) },
    )
    .await;
    held
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_held_in_flight_at_release_never_lands_after_the_successors() {
    let services = kafka_lease_testkit::require_services!();
    let (_relayed_port, relay) = relay_kafka(&services).await;
    let relayed = relay.addr().to_string();
    let prefix = unique_prefix();
    let a = GatewayProcess::start(
        &services,
        &prefix,
        &unique_name("gw-a"),
        &["--kafka", &relayed],
    )
    .await;
    let b = GatewayProcess::start(&services, &prefix, &unique_name("gw-b"), &[]).await;
    let topic = create_topic(&services, 1).await;
    produce_n(&producer(&services), &topic, 0, 40).await;
    let group = unique_name("g");
    let (client_a, client_b) = (a.client().await, b.client().await);

    let old = client_a
        .acquire(
            AcquireOptions::new(&group, &topic)
                .partition(0)
                .member("old"),
        )
        .await
        .expect("acquire on A");
    old.commit(5).await.expect("a commit through the relay");

    // A's next commit passes its fence check and goes out, but the network holds it.
    let held_commit = commit_held(&a, &client_a, &relay, old.lease_id(), 10).await;

    // The holder releases; the successor on B waits for the partition and commits at once.
    let release = tokio::spawn(async move { old.release().await });
    let mut successor = {
        let group = group.clone();
        let topic = topic.clone();
        tokio::spawn(async move {
            let lease = client_b
                .acquire(
                    AcquireOptions::new(&group, &topic)
                        .partition(0)
                        .member("successor")
                        .wait(DEADLINE),
                )
                .await
                .expect("the successor gets the partition");
            lease.commit(20).await.expect("the successor commits");
            lease
        })
    };

    // Let A's traffic go once the successor has committed, or after HOLD_AT_MOST if it
    // cannot (because A keeps the lock while its commit is in flight).
    let held_at = Instant::now();
    let committed_during_hold = tokio::select! {
        done = &mut successor => Some(done.expect("join")),
        () = tokio::time::sleep(HOLD_AT_MOST) => None,
    };
    println!(
        "A's traffic held for {:?}; the successor {} meanwhile",
        held_at.elapsed(),
        if committed_during_hold.is_some() {
            "acquired and committed"
        } else {
            "could not commit"
        }
    );
    relay.release();
    let held_result = tokio::time::timeout(DEADLINE, held_commit)
        .await
        .expect("the held commit answers")
        .expect("join");
    println!(
        "the held commit answered: {:?}",
        held_result.as_ref().map(|_| "OK").map_err(|s| s.code())
    );
    tokio::time::timeout(DEADLINE, release)
        .await
        .expect("Release answers")
        .expect("join")
        .expect("release");
    let successor = match committed_during_hold {
        Some(lease) => lease,
        None => tokio::time::timeout(DEADLINE, successor)
            .await
            .expect("the successor commits once the held commit settled")
            .expect("join"),
    };
    assert_eq!(
        kafka_committed(&services, &group, &topic, 0).map(|c| c.0),
        Some(20),
        "the successor's commit stands; the held commit must not land after it"
    );
    successor.release().await.expect("release");
    relay.stop().await;
}

/// A commit that passed its fence check is held in the network while gateway A is cut off
/// from Consul (its TTL check stops passing, Consul ends its session, and after the lock-delay
/// the successor on B is granted the partition and commits). Let go, A's commit lands after
/// the successor's: the limit of the commit gate (docs/ARCHITECTURE.md). A must say so: its
/// answer came after the lease's fence deadline plus the margin before any successor's grant,
/// so A counts the commit in `kafka_lease_commits_late_total` and logs it with its token and
/// offset. Before that counter, nothing told anyone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_held_in_flight_across_the_loss_of_its_session_is_counted_late() {
    let services = kafka_lease_testkit::require_services!();
    let (_relayed_port, kafka) = relay_kafka(&services).await;
    let (consul, consul_relayed) = consul_relay(&services).await;
    let relayed = kafka.addr().to_string();
    let prefix = unique_prefix();
    // The TTL check (the default) is passed through A's Consul address, the relay: cutting it
    // is what a pause or a partition does to the session.
    let a = GatewayProcess::start(
        &services,
        &prefix,
        &unique_name("gw-a"),
        &[
            "--kafka",
            &relayed,
            "--consul",
            &consul_relayed,
            "--metrics-listen",
            "127.0.0.1:0",
        ],
    )
    .await;
    let b = GatewayProcess::start(&services, &prefix, &unique_name("gw-b"), &[]).await;
    let topic = create_topic(&services, 1).await;
    produce_n(&producer(&services), &topic, 0, 40).await;
    let group = unique_name("g");
    let (client_a, client_b) = (a.client().await, b.client().await);
    let endpoint = a.metrics_endpoint();
    let late = || async {
        metric_value(
            &scrape(&endpoint).await,
            "kafka_lease_commits_late_total",
            &[("group", group.as_str()), ("topic", topic.as_str())],
        )
    };

    let old = client_a
        .acquire(
            AcquireOptions::new(&group, &topic)
                .partition(0)
                .member("old"),
        )
        .await
        .expect("acquire on A");
    old.commit(5).await.expect("a commit in time");
    assert_eq!(late().await, 0.0, "a commit answered in time is not late");

    let held_commit = commit_held(&a, &client_a, &kafka, old.lease_id(), 10).await;

    // A is cut off from Consul; the successor on B gets the partition once Consul has ended
    // A's session and the lock-delay has run, and commits.
    let cut_at = Instant::now();
    consul.cut();
    consul.hold();
    let successor = client_b
        .acquire(
            AcquireOptions::new(&group, &topic)
                .partition(0)
                .member("successor")
                .wait(DEADLINE),
        )
        .await
        .expect("the successor gets the partition");
    successor.commit(20).await.expect("the successor commits");
    println!(
        "the successor acquired and committed {:?} after A was cut off from Consul",
        cut_at.elapsed()
    );

    kafka.release();
    let held_result = tokio::time::timeout(DEADLINE, held_commit)
        .await
        .expect("the held commit answers")
        .expect("join");
    println!(
        "the held commit answered: {:?}; Kafka's committed offset now: {:?}",
        held_result.as_ref().map(|_| "OK").map_err(|s| s.code()),
        kafka_committed(&services, &group, &topic, 0)
    );
    wait_for("A to count the late commit", DEADLINE, || async {
        (late().await == 1.0).then_some(())
    })
    .await;
    let log = a.log();
    let line = log
        .lines()
        .find(|l| l.contains("late commit"))
        .unwrap_or_else(|| panic!("A logs the late commit:\n{log}"));
    println!("A logged: {line}");
    let token = format!("token={}", old.fencing_token());
    assert!(
        line.contains(&token) && line.contains("offset=10") && line.contains("partition=0"),
        "the warning names the lease's token, the offset and the partition: {line}"
    );
    consul.release();
    successor.release().await.expect("release");
    kafka.stop().await;
}
