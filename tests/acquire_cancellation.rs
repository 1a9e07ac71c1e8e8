//! An Acquire call that goes away (its deadline passes, its client cancels) at any point,
//! including after the gateway took the Consul lock, leaves no lock without a lease: the
//! gateway finishes the attempt and gives the lock back.

mod support;

use std::time::Duration;

use kafka_lease_client::AcquireOptions;
use kafka_lease_testkit::{unique_name, wait_for};
use support::{consul_keys, create_topic, unique_prefix, GatewayProcess};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquires_cancelled_at_any_point_leave_no_lock_without_a_lease() {
    let services = kafka_lease_testkit::require_services!();
    let prefix = unique_prefix();
    let gateway = GatewayProcess::start(&services, &prefix, &unique_name("gw"), &[]).await;
    let client = gateway.client().await;
    let topic = create_topic(&services, 4).await;
    let group = unique_name("g");
    // Every attempt is for a group new to the gateway: the work after the lock then includes
    // creating the group's Kafka client and finding its coordinator, which widens the window
    // in which a cancellation finds the lock taken and the lease not yet made. How long one
    // complete Acquire takes here, so the cuts cover all of it: before the lock, between the
    // lock and the answer, and after.
    let mut takes = Vec::new();
    for round in 0..5 {
        let started = tokio::time::Instant::now();
        let lease = client
            .acquire(
                AcquireOptions::new(format!("{group}-warm-{round}"), &topic)
                    .ttl(Duration::from_secs(1)),
            )
            .await
            .expect("an uncancelled acquire");
        takes.push(started.elapsed());
        lease.release().await.expect("release");
    }
    // The median, so that one slow call (a coordinator lookup on a busy broker) does not
    // stretch the cuts past the calls.
    takes.sort();
    let full = takes[takes.len() / 2];
    println!("one Acquire takes {full:?} (median of {takes:?})");

    let attempts = 60_u32;
    let (mut cancelled, mut granted) = (0, 0);
    for i in 0..attempts {
        let cut = full * 2 * i / attempts;
        // A call cut short after the gateway answered leaves a lease nobody knows of, which
        // its TTL ends; later calls wait for such partitions.
        let call = client.acquire(
            AcquireOptions::new(format!("{group}-{i}"), &topic)
                .ttl(Duration::from_secs(1))
                .wait(Duration::from_secs(10)),
        );
        match tokio::time::timeout(cut, call).await {
            Err(_) => cancelled += 1,
            Ok(Ok(lease)) => {
                granted += 1;
                lease.release().await.expect("release");
            }
            Ok(Err(err)) => panic!("acquire {i} failed: {err}"),
        }
    }
    println!("{cancelled} Acquires cancelled, {granted} completed");
    assert!(cancelled >= 10, "the cuts must land inside the calls");

    // Every lock is gone once the leases' TTL has passed, whatever became of the calls. (A
    // lock taken by a cancelled call that the gateway kept would stay here for as long as the
    // gateway's session lives.)
    let keys = wait_for(
        "no lock left under the test prefix",
        Duration::from_secs(15),
        || async {
            let keys = consul_keys(&services, &prefix).await;
            keys.is_empty().then_some(keys)
        },
    )
    .await;
    assert!(keys.is_empty());
    // And every partition can be leased again at once, in a group the cancelled calls used.
    for partition in 0..4 {
        client
            .acquire(AcquireOptions::new(format!("{group}-0"), &topic).partition(partition))
            .await
            .unwrap_or_else(|e| panic!("partition {partition} must be free: {e}"))
            .release()
            .await
            .expect("release");
    }
}
