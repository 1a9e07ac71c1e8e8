//! A Kafka broker restart under load: a Read stalls and resumes with no gap and no repeat,
//! Acquire answers UNAVAILABLE while the broker is down and succeeds as soon as it is back
//! (transient broker states are retried), and health follows. Its own test
//! binary, because it restarts the shared broker (test binaries run one after another).

mod support;

use std::time::Duration;

use kafka_lease_client::{AcquireOptions, Error, ReadOptions};
use kafka_lease_testkit::{unique_name, Services};
use support::{
    create_topic, produce_n, producer, services_script, unique_prefix, wait_health, GatewayProcess,
};
use tonic_health::pb::health_check_response::ServingStatus;

const DEADLINE: Duration = Duration::from_secs(90);

#[tokio::test]
async fn a_broker_restart_stalls_reads_without_gap_or_repeat() {
    let Some(services) = Services::require("a_broker_restart_stalls_reads_without_gap_or_repeat")
    else {
        return;
    };
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
    };
    let outage_result = tokio::time::timeout(DEADLINE, outage).await;
    services_script(&services, "start-kafka").await;
    outage_result.expect("the outage checks finish");
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
    lease.release().await.expect("release");
}
