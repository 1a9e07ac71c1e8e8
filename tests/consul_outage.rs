//! Health follows Consul: NOT_SERVING while the real Consul agent is stopped, Acquire
//! answers UNAVAILABLE, and the gateway recovers by itself when Consul returns. Its own test
//! binary, because it stops the shared Consul (test binaries run one after another).

mod support;

use std::time::Duration;

use kafka_lease_client::{AcquireOptions, Error, ReadOptions};
use kafka_lease_testkit::{unique_name, wait_for};
use support::{create_topic, services_script, unique_prefix, wait_health, GatewayProcess};
use tonic_health::pb::health_check_response::ServingStatus;

const DEADLINE: Duration = Duration::from_secs(60);

#[tokio::test]
async fn health_and_acquire_follow_consul_and_the_gateway_recovers() {
    let services = kafka_lease_testkit::require_services!();
    let gateway = GatewayProcess::start(&services, &unique_prefix(), &unique_name("gw"), &[]).await;
    let topic = create_topic(&services, 1).await;
    let client = gateway.client().await;
    let health = gateway.health().await;
    wait_health(&health, "", ServingStatus::Serving, DEADLINE).await;
    let held = client
        .acquire(AcquireOptions::new(unique_name("g"), &topic))
        .await
        .expect("acquire");
    let reads = held.records(ReadOptions::new()).await.expect("read");

    services_script(&services, "stop-consul").await;
    let stopped_at = tokio::time::Instant::now();
    let outage = {
        let (health, client, topic) = (health.clone(), client.clone(), topic.clone());
        let mut reads = reads;
        async move {
            wait_health(&health, "", ServingStatus::NotServing, DEADLINE).await;
            // Not ready, but alive: a liveness probe must not restart a gateway that waits
            // for Consul.
            wait_health(&health, "liveness", ServingStatus::Serving, DEADLINE).await;
            // The held lease self-fences: its Read ends with "lease lost" once the gateway
            // can no longer confirm its session.
            let end = tokio::time::timeout(DEADLINE, async {
                loop {
                    match reads.next_batch().await {
                        Some(Ok(_)) => continue,
                        other => return other,
                    }
                }
            })
            .await
            .expect("the Read ends during the outage");
            match end {
                Some(Err(Error::LeaseEnded { message, .. })) => {
                    assert!(message.contains("lease lost"), "{message}");
                    println!(
                        "held lease ended {:?} into the outage: {message}",
                        stopped_at.elapsed()
                    );
                }
                other => panic!("the Read must end with lease lost: {other:?}"),
            }
            match held.commit(0).await {
                Err(Error::LeaseEnded { .. }) => {}
                other => panic!("a commit on a self-fenced lease: {other:?}"),
            }
            match client
                .acquire(AcquireOptions::new(unique_name("g"), &topic).retries(0))
                .await
            {
                Err(Error::Unavailable { message, .. }) => {
                    println!("Acquire during the outage: {message}")
                }
                other => panic!("Acquire with Consul down: {other:?}"),
            }
        }
    };
    // Whatever happens above, Consul must come back for the tests after this one.
    let result = tokio::spawn(outage).await;
    services_script(&services, "start-consul").await;
    if let Err(panic) = result {
        std::panic::resume_unwind(panic.into_panic());
    }

    wait_health(&health, "", ServingStatus::Serving, DEADLINE).await;
    let lease = wait_for("an Acquire after Consul returned", DEADLINE, || {
        let client = client.clone();
        let topic = topic.clone();
        async move {
            client
                .acquire(AcquireOptions::new(unique_name("g"), &topic))
                .await
                .ok()
        }
    })
    .await;
    lease.release().await.expect("release");
}
