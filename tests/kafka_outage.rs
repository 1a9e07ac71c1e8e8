//! A Kafka broker down for 20 s under load: a Read stalls and resumes with no gap and no
//! repeat, Acquire answers UNAVAILABLE while the broker is down and succeeds as soon as it is
//! back (transient broker states are retried), readiness follows while liveness stays
//! SERVING, and the outage ends no Consul session and no lease. Its own test binary, because
//! it restarts the shared broker (test binaries run one after another).

mod support;

use std::time::Duration;

use kafka_lease_client::{AcquireOptions, Error, ReadOptions};
use kafka_lease_testkit::unique_name;
use support::{
    create_topic, produce_n, producer, services_script, unique_prefix, wait_health, GatewayProcess,
};
/// The health service name of liveness (`kafka_lease_server::server::LIVENESS_SERVICE`).
const LIVENESS: &str = "liveness";
use tonic_health::pb::health_check_response::ServingStatus;

const DEADLINE: Duration = Duration::from_secs(90);
/// How long the broker stays down: longer than every liveness and session timing (the
/// session's TTL check, 1 s; its TTL, 10 s) and than the lease's own TTL would allow, if
/// any of them followed Kafka.
const OUTAGE: Duration = Duration::from_secs(20);

#[tokio::test]
async fn a_broker_restart_stalls_reads_without_gap_or_repeat() {
    let services = kafka_lease_testkit::require_services!();
    let gateway = GatewayProcess::start(&services, &unique_prefix(), &unique_name("gw"), &[]).await;
    let topic = create_topic(&services, 1).await;
    produce_n(&producer(&services), &topic, 0, 100).await;
    let client = gateway.client().await;
    let health = gateway.health().await;
    wait_health(&health, "", ServingStatus::Serving, DEADLINE).await;

    let lease = client
        .acquire(AcquireOptions::new(unique_name("g"), &topic).ttl(Duration::from_secs(60)))
        .await
        .expect("acquire");
    let mut stream = lease
        .records(ReadOptions::new().max_records(10))
        .await
        .expect("read");
    let mut offsets = Vec::new();
    while offsets.len() < 50 {
        let batch = stream.next_batch().await.expect("open").expect("batch");
        offsets.extend(batch.records.iter().map(|r| r.offset));
    }

    services_script(&services, "stop-kafka").await;
    let stopped_at = tokio::time::Instant::now();
    let outage = async {
        wait_health(&health, "", ServingStatus::NotServing, DEADLINE).await;
        match client
            .acquire(AcquireOptions::new(unique_name("g"), &topic).retries(0))
            .await
        {
            Err(Error::Unavailable { message, .. }) => {
                println!("Acquire during the broker outage: {message}")
            }
            other => panic!("Acquire with Kafka down: {other:?}"),
        }
        // The outage lasts its full length; liveness answers SERVING throughout.
        while stopped_at.elapsed() < OUTAGE {
            wait_health(
                &health,
                LIVENESS,
                ServingStatus::Serving,
                Duration::from_secs(5),
            )
            .await;
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    };
    let outage_result = tokio::time::timeout(DEADLINE, outage).await;
    services_script(&services, "start-kafka").await;
    outage_result.expect("the outage checks finish");
    println!("Kafka was down for {:?}", stopped_at.elapsed());
    // The broker listens again but is still loading its offsets topic (NOT_COORDINATOR,
    // COORDINATOR_LOAD_IN_PROGRESS): an Acquire in a group it has never seen, sent at once,
    // gets its lease; the gateway retries those states within the call's deadline.
    let asked = tokio::time::Instant::now();
    let fresh = client
        .acquire(AcquireOptions::new(unique_name("g"), &topic).member("right after the restart"))
        .await
        .expect("an Acquire right after the broker restart succeeds");
    println!(
        "Acquire right after the broker restart: offset {}, answered in {:?}",
        fresh.offset(),
        asked.elapsed()
    );
    fresh.release().await.expect("release");
    wait_health(&health, "", ServingStatus::Serving, DEADLINE).await;

    // More records after the restart; the same Read goes on from where it was.
    produce_n(&producer(&services), &topic, 0, 100).await;
    while offsets.len() < 200 {
        let batch = tokio::time::timeout(DEADLINE, stream.next_batch())
            .await
            .expect("the Read resumes")
            .expect("open")
            .expect("batch");
        offsets.extend(batch.records.iter().map(|r| r.offset));
    }
    assert_eq!(
        offsets,
        (0..200).collect::<Vec<i64>>(),
        "no gap, no repeat across the restart"
    );
    drop(stream);
    // The lease held through the outage is the same lease: it commits and releases.
    lease
        .commit(200)
        .await
        .expect("a commit on the lease held through the outage");
    lease.release().await.expect("release");
    let log = gateway.log();
    assert_eq!(
        log.matches("created consul lock session").count(),
        1,
        "a Kafka outage must end no session:\n{log}"
    );
    for sign in [
        "session invalidated",
        "self-fence",
        "could not pass the liveness check",
    ] {
        assert!(
            !log.contains(sign),
            "{sign:?} during a Kafka outage:\n{log}"
        );
    }
}
