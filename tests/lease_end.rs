//! How leases end, or do not, when things go wrong around them: a gateway cut off from
//! Consul suspends every lease once its fence window passes (nothing is handed over, a
//! commit is answered UNAVAILABLE), carries on with the same leases if Consul confirms its
//! session before the session's TTL has passed (a Consul leader election, a short outage),
//! and otherwise ends every lease at once (Reads on idle partitions end "lease lost"
//! together, not one after another); a Release is not held up by a Read whose client
//! stopped reading; a Release whose client goes away mid-release still frees the partition;
//! and a gateway started while its Consul agent answers nothing (its servers out of reach,
//! or electing a leader) waits for it instead of exiting.

mod support;

use std::time::Duration;

use kafka_lease_client::{AcquireOptions, Error, ReadOptions, Reason};
use kafka_lease_testkit::unique_name;
use support::{
    consul_relay, create_topic, produce, producer, unique_prefix, GatewayProcess, TestRecord,
};
use tokio::time::Instant;

const DEADLINE: Duration = Duration::from_secs(60);

/// A gateway that reaches Consul through a relay the test can hold or cut. TTL-only: the
/// agent's check would dial the gateway directly, around the relay.
async fn gateway_behind_a_relay(
    services: &kafka_lease_testkit::Services,
) -> (kafka_lease_testkit::Relay, GatewayProcess) {
    let (relay, relayed) = consul_relay(services).await;
    let gateway = GatewayProcess::start(
        services,
        &unique_prefix(),
        &unique_name("gw"),
        &["--consul", &relayed, "--consul-check", "none"],
    )
    .await;
    (relay, gateway)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_off_from_consul_for_a_session_ttl_every_idle_read_ends_lease_lost_together() {
    let services = kafka_lease_testkit::require_services!();
    let (relay, gateway) = gateway_behind_a_relay(&services).await;
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
    let mut fastest = DEADLINE;
    for (end, after) in ends {
        let end = end.expect("the Read ends");
        match end {
            Some(Err(err @ Error::LeaseEnded { .. })) => {
                assert_eq!(err.reason(), Some(Reason::LeaseLost), "{err}");
            }
            other => panic!("expected the Read to end with lease lost, got {other:?}"),
        }
        slowest = slowest.max(after);
        fastest = fastest.min(after);
    }
    println!("all {LEASES} idle Reads ended 'lease lost' {fastest:?} to {slowest:?} after the cut");
    // Suspended after the fence window (1.25 s from the last confirmed renew), given up after
    // the session TTL (10 s from it; renews go out every 312.5 ms).
    assert!(
        fastest > Duration::from_millis(1250 + 1000),
        "the Reads wait through the suspension rather than ending at the fence window: the \
         first ended after {fastest:?}"
    );
    assert!(
        slowest < Duration::from_millis(10_000 + 1500),
        "every Read ends once the session TTL has passed (plus scheduling slack): the slowest \
         took {slowest:?}"
    );
    assert!(
        slowest - fastest < Duration::from_millis(1000),
        "every Read ends together, not one lease after another: {fastest:?} to {slowest:?}"
    );
    relay.release();
}

/// Cut off from Consul for longer than the fence window but well within the session's TTL (as
/// in a Consul leader election), a lease is suspended, not ended: its Read hands nothing over
/// and a commit is answered UNAVAILABLE (Consul unavailable, retryable) while the gateway
/// cannot confirm its session; once Consul answers, the same Read goes on from where it
/// stopped, with no gap and no repeat, and the commit goes through. Before the suspension,
/// the Read ended "lease lost" at the fence window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_consul_outage_suspends_a_lease_and_the_same_read_goes_on() {
    let services = kafka_lease_testkit::require_services!();
    let (relay, gateway) = gateway_behind_a_relay(&services).await;
    let topic = create_topic(&services, 1).await;
    let group = unique_name("g");
    let kafka = producer(&services);
    let first: Vec<TestRecord> = (0..20)
        .map(|i| TestRecord::value(format!("a{i}")))
        .collect();
    produce(&kafka, &topic, 0, &first).await;
    let client = gateway.client().await;
    let lease = client
        .acquire(AcquireOptions::new(&group, &topic).partition(0))
        .await
        .expect("acquire");
    let mut stream = lease
        .records(ReadOptions::new().reconnect_attempts(0))
        .await
        .expect("read");
    let mut next = 0;
    while next < 20 {
        let batch = stream
            .next_batch()
            .await
            .expect("a batch")
            .expect("records");
        for record in batch.records {
            assert_eq!(record.offset, next, "no gap, no repeat");
            next += 1;
        }
    }

    relay.cut();
    relay.hold();
    let cut_at = Instant::now();
    // Past the fence window (1.25 s), while the session lives on in Consul (TTL 10 s).
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let second: Vec<TestRecord> = (0..20)
        .map(|i| TestRecord::value(format!("b{i}")))
        .collect();
    produce(&kafka, &topic, 0, &second).await;
    let during = tokio::time::timeout(Duration::from_millis(1500), stream.next_batch()).await;
    assert!(
        during.is_err(),
        "nothing is handed over while the lock is suspended: {during:?}"
    );
    match lease.commit(20).await {
        Err(err @ Error::Unavailable { .. }) => {
            assert_eq!(err.reason(), Some(Reason::ConsulUnavailable), "{err}");
            assert!(err.is_retryable(), "{err}");
        }
        other => panic!("a commit while suspended: {other:?}"),
    }
    let suspended_for = cut_at.elapsed();

    relay.release();
    while next < 40 {
        let batch = tokio::time::timeout(DEADLINE, stream.next_batch())
            .await
            .expect("the same Read goes on once Consul answers")
            .expect("a batch")
            .expect("records, not the lease's end");
        for record in batch.records {
            assert_eq!(record.offset, next, "no gap, no repeat");
            next += 1;
        }
    }
    println!("suspended {suspended_for:?}; the same Read went on to offset {next}");
    let committed = wait_commit(&lease, 40).await;
    assert_eq!(committed, 40);
    lease.release().await.expect("release");
}

/// Commits `offset` once the gateway confirms its session again (UNAVAILABLE until then).
async fn wait_commit(lease: &kafka_lease_client::Lease, offset: i64) -> i64 {
    let started = Instant::now();
    loop {
        match lease.commit(offset).await {
            Ok(()) => return offset,
            Err(err) if err.is_retryable() && started.elapsed() < DEADLINE => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(err) => panic!("commit after the outage: {err}"),
        }
    }
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

/// The fault tests' soak found it: a gateway killed during a Consul leader's isolation was
/// started again, its agent (pinned to the isolated server) accepted the connection and
/// answered nothing, and the gateway exited after 5 s ("cannot open a Consul session ...
/// no answer within 5s"), to stay down. It now waits for Consul, saying so in its log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_started_while_consul_answers_nothing_waits_for_it() {
    let services = kafka_lease_testkit::require_services!();
    let (relay, relayed) = consul_relay(&services).await;
    // Connections are accepted, nothing is forwarded: an agent with no server to ask.
    relay.hold();
    let instance = unique_name("gw-wait");
    let starting = {
        let (services, relayed, instance) = (services.clone(), relayed.clone(), instance.clone());
        tokio::spawn(async move {
            GatewayProcess::start(
                &services,
                &unique_prefix(),
                &instance,
                &["--consul", &relayed, "--consul-check", "none"],
            )
            .await
        })
    };
    // Past the 5 s a request to Consul may take, and then some.
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert!(
        !starting.is_finished(),
        "the gateway is still waiting for Consul"
    );
    relay.release();
    let gateway = tokio::time::timeout(DEADLINE, starting)
        .await
        .expect("the gateway listens once Consul answers")
        .expect("start task");
    let log = gateway.log();
    assert!(
        log.contains("cannot open a session yet"),
        "the gateway said it was waiting: {log}"
    );
    let topic = create_topic(&services, 1).await;
    let lease = gateway
        .client()
        .await
        .acquire(AcquireOptions::new(unique_name("g"), &topic))
        .await
        .expect("an Acquire works once the gateway is up");
    assert_eq!(lease.partition(), 0);
}

/// The churn test found it: a client that went away while its Release was releasing the
/// lock (its deadline, a killed process) left the lock held for good. The Release handler
/// ended the lease and was then dropped with the call, before the lock's release in Consul
/// had finished; the lease was gone, nothing would expire it, and the partition stayed
/// taken while the gateway's session lived. The end of a lease now runs to its end in a
/// task of its own, whatever happens to the call that asked for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_whose_client_goes_away_mid_release_still_frees_the_partition() {
    let services = kafka_lease_testkit::require_services!();
    let (relay, gateway) = gateway_behind_a_relay(&services).await;
    let topic = create_topic(&services, 1).await;
    let group = unique_name("g");
    let client = gateway.client().await;
    // A long TTL: the partition must come back by the Release, not by expiry.
    let lease = client
        .acquire(
            AcquireOptions::new(&group, &topic)
                .partition(0)
                .ttl(Duration::from_secs(120)),
        )
        .await
        .expect("acquire");

    // Consul answers nothing while the Release releases the lock, and the client gives up
    // on the call: its stream is reset and the gateway drops the handler. The hold is kept
    // well inside the fence window (1.25 s), so the gateway's session stays confirmed.
    relay.hold();
    let gave_up = tokio::time::timeout(Duration::from_millis(400), lease.release()).await;
    assert!(gave_up.is_err(), "the Release waits on Consul: {gave_up:?}");
    relay.release();

    let started = Instant::now();
    let successor = loop {
        match client
            .acquire(AcquireOptions::new(&group, &topic).partition(0))
            .await
        {
            Ok(lease) => break lease,
            Err(_busy) if started.elapsed() < Duration::from_secs(15) => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(err) => panic!(
                "partition 0 is still taken 15 s after the Release its client gave up on \
                 (the lock was never released; its lease had a 120 s TTL): {err}"
            ),
        }
    };
    println!(
        "the successor got partition 0 {:?} after Consul answered again",
        started.elapsed()
    );
    successor.release().await.expect("release");
}
