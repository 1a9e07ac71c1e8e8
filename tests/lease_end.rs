//! How leases end when things go wrong around them: a gateway cut off from Consul ends every
//! lease at once (Reads on idle partitions end "lease lost" within the fence window, not one
//! after another), and a Release is not held up by a Read whose client stopped reading.

mod support;

use std::time::Duration;

use kafka_lease_client::{AcquireOptions, Error, ReadOptions, Reason};
use kafka_lease_testkit::unique_name;
use support::{
    consul_relay, create_topic, produce, producer, unique_prefix, GatewayProcess, TestRecord,
};
use tokio::time::Instant;

const DEADLINE: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_off_from_consul_every_idle_read_ends_lease_lost_within_the_fence_window() {
    let services = kafka_lease_testkit::require_services!();
    let (relay, relayed) = consul_relay(&services).await;
    // TTL-only: the agent's check would dial the gateway directly, around the relay.
    let gateway = GatewayProcess::start(
        &services,
        &unique_prefix(),
        &unique_name("gw"),
        &["--consul", &relayed, "--consul-check", "none"],
    )
    .await;
    const LEASES: i32 = 6;
    let topic = create_topic(&services, LEASES).await;
    let group = unique_name("g");
    let client = gateway.client().await;
    let mut streams = Vec::new();
    for partition in 0..LEASES {
        let lease = client
            .acquire(
                AcquireOptions::new(&group, &topic)
                    .partition(partition)
                    .ttl(Duration::from_secs(60)),
            )
            .await
            .expect("acquire");
        // Idle partitions: the Reads wait for records that never come.
        let stream = lease
            .records(ReadOptions::new().reconnect_attempts(0))
            .await
            .expect("read");
        streams.push((lease, stream));
    }

    let cut_at = Instant::now();
    relay.cut();
    relay.hold();
    let ends = futures::future::join_all(streams.iter_mut().map(|(_, stream)| async {
        let end = tokio::time::timeout(DEADLINE, stream.next_batch()).await;
        (end, cut_at.elapsed())
    }))
    .await;
    let mut slowest = Duration::ZERO;
    for (end, after) in ends {
        let end = end.expect("the Read ends");
        match end {
            Some(Err(err @ Error::LeaseEnded { .. })) => {
                assert_eq!(err.reason(), Some(Reason::LeaseLost), "{err}");
            }
            other => panic!("expected the Read to end with lease lost, got {other:?}"),
        }
        slowest = slowest.max(after);
    }
    println!("all {LEASES} idle Reads ended 'lease lost' within {slowest:?} of the cut");
    // The fence window is 1.25 s from the last confirmed renew; renews go out every 312.5 ms.
    assert!(
        slowest < Duration::from_millis(1250 + 1500),
        "every Read ends within the fence window (plus scheduling slack), not one lease after \
         another: the slowest took {slowest:?}"
    );
    relay.release();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_is_not_held_up_by_a_reader_that_stopped_reading() {
    let services = kafka_lease_testkit::require_services!();
    let gateway = GatewayProcess::start(&services, &unique_prefix(), &unique_name("gw"), &[]).await;
    let topic = create_topic(&services, 1).await;
    // Enough to fill the gateway's HTTP/2 send window and the client's receive buffers.
    let records: Vec<TestRecord> = (0..4_000)
        .map(|i| TestRecord::value(format!("{i:0>1024}")))
        .collect();
    produce(&producer(&services), &topic, 0, &records).await;
    let client = gateway.client().await;
    let lease = client
        .acquire(AcquireOptions::new(unique_name("g"), &topic))
        .await
        .expect("acquire");
    let mut stream = lease
        .records(ReadOptions::new().max_records(100).reconnect_attempts(0))
        .await
        .expect("read");
    stream.next_batch().await.expect("open").expect("a batch");
    // The reader stops reading but keeps the stream open: flow control stops the gateway.

    let started = Instant::now();
    tokio::time::timeout(Duration::from_secs(15), lease.release())
        .await
        .expect("Release answers although the reader is stalled")
        .expect("release");
    println!("Release with a stalled reader took {:?}", started.elapsed());
    drop(stream);
}
