//! Consul requests lost on the way, or answered after the answer was lost: the gateway never
//! keeps a lock nobody leases. A release whose request is lost is retried until Consul
//! confirms; an acquire whose answer is lost (Consul took the lock, the gateway heard nothing)
//! is cleaned up. Either way the partition becomes free for the next holder, although the
//! gateway's session stays live throughout (so Consul itself would never free the key).

mod support;

use std::time::Duration;

use kafka_lease_client::{AcquireOptions, Error};
use kafka_lease_testkit::{unique_name, Fault, Relay, Services};
use support::{consul_relay, create_topic, unique_prefix, GatewayProcess};
use tokio::time::Instant;

/// How long the next holder waits: far longer than a retry takes, far shorter than the
/// gateway's session lasts.
const WAIT: Duration = Duration::from_secs(10);

struct Setup {
    relay: Relay,
    relayed: GatewayProcess,
    direct: GatewayProcess,
    topic: String,
    group: String,
}

impl Setup {
    /// A client of the other gateway waits for partition 0 and gets it: how long it took.
    async fn next_holder_gets_the_partition(&self, why: &str) -> Duration {
        let started = Instant::now();
        let next = self
            .direct
            .client()
            .await
            .acquire(
                AcquireOptions::new(&self.group, &self.topic)
                    .partition(0)
                    .wait(WAIT),
            )
            .await
            .unwrap_or_else(|e| panic!("{why}: {e}"));
        let took = started.elapsed();
        next.release().await.expect("release");
        took
    }
}

async fn setup(services: &Services) -> Setup {
    let (relay, relayed_addr) = consul_relay(services).await;
    let prefix = unique_prefix();
    let relayed = GatewayProcess::start(
        services,
        &prefix,
        &unique_name("gw-relayed"),
        &["--consul", &relayed_addr, "--consul-check", "none"],
    )
    .await;
    let direct = GatewayProcess::start(services, &prefix, &unique_name("gw-direct"), &[]).await;
    let topic = create_topic(services, 1).await;
    Setup {
        relay,
        relayed,
        direct,
        topic,
        group: unique_name("g"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_lost_on_the_way_to_consul_is_retried_until_the_key_is_free() {
    let services = kafka_lease_testkit::require_services!();
    let s = setup(&services).await;
    let lease = s
        .relayed
        .client()
        .await
        .acquire(AcquireOptions::new(&s.group, &s.topic).partition(0))
        .await
        .expect("acquire");
    s.relay.fail_next(b"DELETE /v1/kv/", Fault::LoseRequest);
    lease.release().await.expect("Release answers");
    assert_eq!(s.relay.faults_fired(), 1, "the release request was lost");

    let after = s
        .next_holder_gets_the_partition(
            "the partition becomes free although the first release was lost",
        )
        .await;
    println!("the next holder got the partition {after:?} after Release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_whose_answer_is_lost_leaves_no_lock_behind() {
    let services = kafka_lease_testkit::require_services!();
    let s = setup(&services).await;
    s.relay.fail_next(b"PUT /v1/txn", Fault::LoseAnswer);
    match s
        .relayed
        .client()
        .await
        // The gateway's own answer, not the client's retry of it.
        .acquire(
            AcquireOptions::new(&s.group, &s.topic)
                .partition(0)
                .retries(0),
        )
        .await
    {
        Err(e @ Error::Unavailable { .. }) => println!("the Acquire failed as it should: {e}"),
        other => panic!("an Acquire whose lock answer was lost is UNAVAILABLE: {other:?}"),
    }
    assert_eq!(s.relay.faults_fired(), 1, "the acquire's answer was lost");

    let after = s
        .next_holder_gets_the_partition("the lock Consul granted without an answer is given back")
        .await;
    println!("the next holder got the partition {after:?} later");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_lease_ids_are_answered_without_consul() {
    let services = kafka_lease_testkit::require_services!();
    let s = setup(&services).await;
    let mut raw = s.relayed.client().await.raw();
    // Consul stops answering the relayed gateway (within its fence window, so it stays
    // healthy); calls naming no instance are still answered at once.
    s.relay.hold();
    let commit = |lease_id: &str| kafka_lease_proto::v1::CommitRequest {
        lease_id: lease_id.to_string(),
        offset: 0,
        ..Default::default()
    };
    let started = Instant::now();
    let unknown = raw
        .commit(commit("0123456789abcdef.0123456789abcdef0123456789abcdef"))
        .await
        .expect_err("a lease nobody serves");
    let took = started.elapsed();
    s.relay.release();
    assert_eq!(unknown.code(), tonic::Code::NotFound, "{unknown:?}");
    // (Looking the ids up in Consul, as before, these were UNAVAILABLE after its 5 s limit.)
    println!("answered in {took:?} with Consul not answering");

    // An id naming an instance is forwarded there, and where to is Consul's to say: one
    // read of the instance's record, which a made-up instance does not have.
    let elsewhere = raw
        .commit(commit(
            "0123456789abcdef.0123456789abcdef0123456789abcdef~gw-elsewhere",
        ))
        .await
        .expect_err("a lease of an instance that does not exist");
    assert_eq!(
        elsewhere.code(),
        tonic::Code::FailedPrecondition,
        "{elsewhere:?}"
    );
    let details = kafka_lease_client::StatusDetails::from_status(&elsewhere);
    assert_eq!(
        details.reason(),
        Some(&kafka_lease_client::Reason::LeaseLost),
        "{elsewhere:?}"
    );
    assert!(
        elsewhere.message().contains("gw-elsewhere")
            && elsewhere.message().contains("not registered"),
        "{elsewhere:?}"
    );
}
