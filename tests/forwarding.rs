//! Any gateway serves any lease, end to end across two real gateway processes, real Kafka
//! and real Consul: every call on a lease through the instance that does not serve it gives
//! exactly what the serving one gives; a balanced channel over both runs whole consumer
//! cycles; a Read proxied from a killed instance ends with the lease-lost reason at once; a
//! client that stops reading a proxied Read stops the serving instance's fetching; ListLeases
//! through either instance has every lease's live details.

mod support;

use kafka_lease_testkit::scenarios;

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use kafka_lease_client::{proto, AcquireOptions, Client, LeaseFilter, Reason, StatusDetails};
use kafka_lease_testkit::{unique_name, wait_for, Services};
use support::{
    create_topic, kafka_committed, produce, produce_n, producer, unique_prefix, GatewayProcess,
    TestRecord,
};
use tokio::time::Instant;
use tonic::Code;

const DEADLINE: Duration = Duration::from_secs(30);

/// Two gateway instances sharing one Consul prefix: A (the one that serves the leases in
/// these tests) and B.
async fn two_gateways(services: &Services) -> (GatewayProcess, GatewayProcess) {
    let prefix = unique_prefix();
    let a = GatewayProcess::start(services, &prefix, &unique_name("gw-a"), &[]).await;
    let b = GatewayProcess::start(services, &prefix, &unique_name("gw-b"), &[]).await;
    (a, b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_call_through_the_other_gateway_gives_what_the_serving_one_gives() {
    let services = kafka_lease_testkit::require_services!();
    let (a, b) = two_gateways(&services).await;
    let topic = create_topic(&services, 1).await;
    let records: Vec<TestRecord> = (0..20)
        .map(|i| TestRecord::value(format!("record-{i}")))
        .collect();
    produce(&producer(&services), &topic, 0, &records).await;
    let (client_a, client_b) = (a.client().await, b.client().await);

    let committed = |group: String, topic: String| {
        let services = &services;
        async move { kafka_committed(services, &group, &topic, 0) }
    };
    let direct =
        scenarios::one_lease_life(&client_a, &client_a, &unique_name("g"), &topic, committed).await;
    let forwarded =
        scenarios::one_lease_life(&client_a, &client_b, &unique_name("g"), &topic, committed).await;
    println!("direct:    {direct:?}\nforwarded: {forwarded:?}");
    assert_eq!(forwarded, direct);
    // And the transcript is the one the contract promises (so equal is not equally wrong).
    assert_eq!(direct.start, 0);
    assert_eq!(direct.first_batch.first().map(|r| r.0), Some(0));
    assert_eq!(direct.seek, (12, 1));
    assert_eq!(direct.after_seek.first(), Some(&(12, 1)));
    assert_eq!(direct.out_of_range.0, Code::OutOfRange);
    assert_eq!(direct.after_release.0, Code::FailedPrecondition);
    // Release of a released lease: NOT_FOUND (the contract), saying what Commit and Seek say.
    assert_eq!(
        direct.second_release,
        (
            Code::NotFound,
            "lease \"R\" has ended: lease released".to_string(),
            Some("LEASE_NOT_FOUND".to_string())
        )
    );
    assert_eq!(direct.committed.as_ref().map(|c| c.0), Some(15));
    assert_eq!(direct.next_holder_start, 15);
    assert!(
        b.log()
            .contains("proxying a Read from the serving instance"),
        "B forwarded the Read"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_balanced_channel_over_both_gateways_runs_whole_cycles() {
    let services = kafka_lease_testkit::require_services!();
    let (a, b) = two_gateways(&services).await;
    let topic = create_topic(&services, 2).await;
    // Enough for every cycle to land on the same partition.
    let per_partition = 130;
    let producer = producer(&services);
    for partition in 0..2 {
        produce_n(&producer, &topic, partition, per_partition).await;
    }
    // One channel over both instances: every call may land on either.
    let client = Client::connect_balanced([a.endpoint(), b.endpoint()]).expect("endpoints");
    let group = unique_name("g");
    let mut seen: BTreeMap<i32, Vec<i64>> = BTreeMap::new();
    let mut gateways = std::collections::BTreeSet::new();
    let cycles = 12;
    for cycle in 0..cycles {
        let lease = client
            .acquire(
                AcquireOptions::new(&group, &topic)
                    .member(format!("cycle-{cycle}"))
                    .wait(Duration::from_secs(10)),
            )
            .await
            .expect("acquire");
        gateways.insert(lease.gateway().to_string());
        let mut records = lease
            .records(kafka_lease_client::ReadOptions::new().max_records(10))
            .await
            .expect("read");
        let batch = tokio::time::timeout(DEADLINE, records.next())
            .await
            .expect("a batch in time")
            .expect("the stream stays open")
            .expect("a batch");
        drop(records);
        let offsets: Vec<i64> = batch.records.iter().map(|r| r.offset).collect();
        let next = offsets.last().expect("records") + 1;
        seen.entry(lease.partition()).or_default().extend(&offsets);
        lease
            .release_with_commit(next)
            .await
            .expect("release with a commit");
    }
    assert_eq!(
        gateways.len(),
        2,
        "both instances granted leases: {gateways:?}"
    );
    // Across the cycles each partition's records came in order, with no gap and no repeat.
    for (partition, offsets) in &seen {
        let expected: Vec<i64> = (0..offsets.len() as i64).collect();
        assert_eq!(offsets, &expected, "partition {partition}");
    }
    assert_eq!(
        seen.values().map(Vec::len).sum::<usize>(),
        cycles * 10,
        "every cycle read a batch"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_proxied_from_a_killed_gateway_ends_with_lease_lost() {
    let services = kafka_lease_testkit::require_services!();
    let (a, b) = two_gateways(&services).await;
    let topic = create_topic(&services, 1).await;
    produce_n(&producer(&services), &topic, 0, 10).await;
    let (client_a, client_b) = (a.client().await, b.client().await);
    let group = unique_name("g");
    let lease = client_a
        .acquire(AcquireOptions::new(&group, &topic))
        .await
        .expect("acquire on A");
    let mut stream = client_b
        .raw()
        .read(proto::ReadRequest {
            lease_id: lease.lease_id().to_string(),
            ..Default::default()
        })
        .await
        .expect("read through B")
        .into_inner();
    let first = tokio::time::timeout(DEADLINE, stream.next())
        .await
        .expect("a batch in time")
        .expect("open")
        .expect("a batch");
    assert_eq!(first.records.len(), 10);

    // The serving instance dies; the Read through B is waiting for records.
    let killed = Instant::now();
    a.signal("KILL");
    let end = tokio::time::timeout(DEADLINE, stream.next())
        .await
        .expect("the proxied Read ends, not hangs");
    let took = killed.elapsed();
    let status = match end {
        Some(Err(status)) => status,
        other => panic!("the Read ends with an error status: {other:?}"),
    };
    println!("the proxied Read ended {took:?} after the kill: {status:?}");
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert_eq!(
        StatusDetails::from_status(&status).reason(),
        Some(&Reason::LeaseLost),
        "{status:?}"
    );
    assert!(took < Duration::from_secs(3), "ended after {took:?}");

    // The client resumes by acquiring: through B, once Consul freed the dead instance's lock.
    let again = client_b
        .acquire(
            AcquireOptions::new(&group, &topic)
                .partition(0)
                .wait(Duration::from_secs(25)),
        )
        .await
        .expect("the partition again, through B");
    assert_eq!(again.gateway(), b.instance);
    again.release().await.expect("release");
}

/// The resident set of a process, from /proc.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_a_proxied_read_stops_the_serving_gateway_fetching() {
    let services = kafka_lease_testkit::require_services!();
    let (a, b) = two_gateways(&services).await;
    let topic = create_topic(&services, 1).await;
    // 64 MiB: far more than the fetch queue, every HTTP/2 window on the way, and the
    // growth allowed below.
    let total = 64 * 1024;
    let record = TestRecord::value(vec![b'x'; 1024]);
    let producer = producer(&services);
    for _ in 0..8 {
        produce(&producer, &topic, 0, &vec![record.clone(); total / 8]).await;
    }
    let (client_a, client_b) = (a.client().await, b.client().await);
    let lease = client_a
        .acquire(AcquireOptions::new(unique_name("g"), &topic))
        .await
        .expect("acquire on A");
    let rss_before = (rss_kib(a.pid()), rss_kib(b.pid()));

    // Read through B, take one batch, then stop reading with the stream open.
    let mut stream = client_b
        .raw()
        .read(proto::ReadRequest {
            lease_id: lease.lease_id().to_string(),
            max_records: 100,
            ..Default::default()
        })
        .await
        .expect("read through B")
        .into_inner();
    tokio::time::timeout(DEADLINE, stream.next())
        .await
        .expect("a batch in time")
        .expect("open")
        .expect("a batch");

    // The serving gateway's position (what it handed to gRPC) stops moving, far short of
    // the end: asked through B, which fetches the live details from A.
    let position = || async {
        let listed = client_b
            .list_leases(LeaseFilter::new().topic(&topic))
            .await
            .expect("list");
        let info = listed.first().expect("the lease is listed").clone();
        assert_eq!(info.details_unavailable, None, "{info:?}");
        info.position.expect("a position")
    };
    let stalled = wait_for("the position to stop moving", DEADLINE, || async {
        let before = position().await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let after = position().await;
        (before == after).then_some(after)
    })
    .await;
    let rss_after = (rss_kib(a.pid()), rss_kib(b.pid()));
    println!(
        "position stalled at {stalled} of {total}; RSS A {} -> {} KiB, B {} -> {} KiB",
        rss_before.0, rss_after.0, rss_before.1, rss_after.1
    );
    assert!(
        stalled < (total as i64) / 2,
        "the serving gateway stopped fetching early: {stalled} of {total}"
    );
    for (before, after, who) in [
        (rss_before.0, rss_after.0, "A"),
        (rss_before.1, rss_after.1, "B"),
    ] {
        assert!(
            after.saturating_sub(before) < 32 * 1024,
            "{who} grew by {} KiB",
            after.saturating_sub(before)
        );
    }

    // Reading again drains the rest: nothing was lost while it waited.
    let mut next = stalled;
    let mut expected = None;
    while next < total as i64 {
        let batch = tokio::time::timeout(DEADLINE, stream.next())
            .await
            .expect("a batch in time")
            .expect("open")
            .expect("a batch");
        for r in &batch.records {
            if let Some(e) = expected {
                assert_eq!(r.offset, e, "no gap, no repeat");
            }
            expected = Some(r.offset + 1);
        }
        next = expected.unwrap_or(next);
    }
    drop(stream);
    lease.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_serving_gateway_costs_the_caller_its_deadline_and_listings_say_why() {
    let services = kafka_lease_testkit::require_services!();
    let (a, b) = two_gateways(&services).await;
    let topic = create_topic(&services, 2).await;
    let (client_a, client_b) = (a.client().await, b.client().await);
    let group = unique_name("g");
    let on_a = client_a
        .acquire(AcquireOptions::new(&group, &topic).partition(0))
        .await
        .expect("acquire on A");
    let on_b = client_b
        .acquire(AcquireOptions::new(&group, &topic).partition(1))
        .await
        .expect("acquire on B");
    // A forwarded call reaches A once, so B has a connection to it before A stops.
    client_b
        .raw()
        .commit(proto::CommitRequest {
            lease_id: on_a.lease_id().to_string(),
            offset: 0,
            metadata: None,
        })
        .await
        .expect("a commit through B");

    a.signal("STOP");
    // The caller's deadline travels with the forwarded call: it ends at the deadline, not at
    // a keepalive or a connect timeout of B's.
    let mut request = tonic::Request::new(proto::CommitRequest {
        lease_id: on_a.lease_id().to_string(),
        offset: 0,
        metadata: None,
    });
    request.set_timeout(Duration::from_millis(500));
    let started = Instant::now();
    let status = client_b
        .raw()
        .commit(request)
        .await
        .expect_err("A does not answer");
    let took = started.elapsed();
    println!("a forwarded commit to a paused instance: {took:?}, {status:?}");
    // (tonic's server reports its own deadline as CANCELLED "Timeout expired".)
    assert!(
        matches!(status.code(), Code::DeadlineExceeded | Code::Cancelled),
        "{status:?}"
    );
    assert!(took < Duration::from_secs(2), "ended after {took:?}");

    // ListLeases through B answers in bounded time: its own lease in full, A's without the
    // live details, saying why.
    let started = Instant::now();
    let listed = client_b
        .list_leases(LeaseFilter::new().group(&group))
        .await
        .expect("list through B");
    let took = started.elapsed();
    a.signal("CONT");
    println!("listed in {took:?}: {listed:?}");
    assert!(took < Duration::from_secs(5), "listed after {took:?}");
    assert_eq!(listed.len(), 2, "{listed:?}");
    let row = |partition: i32| {
        listed
            .iter()
            .find(|l| l.partition == partition)
            .expect("listed")
    };
    assert!(row(1).position.is_some() && row(1).details_unavailable.is_none());
    assert_eq!(row(0).position, None, "{:?}", row(0));
    let why = row(0).details_unavailable.as_deref().unwrap_or_default();
    assert!(why.contains(&a.instance), "{why}");
    assert_eq!(
        row(0).gateway_address.as_deref(),
        Some(a.addr.as_str()),
        "the holder record names A's address"
    );
    on_b.release().await.expect("release on B");
    // A may have fenced itself while stopped; either way its lease is over or released now.
    let _ = on_a.release().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_ends_at_the_callers_deadline_directly_and_forwarded_alike() {
    let services = kafka_lease_testkit::require_services!();
    let (a, b) = two_gateways(&services).await;
    let topic = create_topic(&services, 1).await;
    produce_n(&producer(&services), &topic, 0, 3).await;
    let (client_a, client_b) = (a.client().await, b.client().await);
    let lease = client_a
        .acquire(AcquireOptions::new(unique_name("g"), &topic))
        .await
        .expect("acquire on A");
    let deadline = Duration::from_millis(1500);
    for (via, client) in [("A (serving)", &client_a), ("B (forwarding)", &client_b)] {
        let mut request = tonic::Request::new(proto::ReadRequest {
            lease_id: lease.lease_id().to_string(),
            from_offset: Some(0),
            ..Default::default()
        });
        request.set_timeout(deadline);
        let started = Instant::now();
        let mut stream = client.raw().read(request).await.expect("read").into_inner();
        let first = tokio::time::timeout(DEADLINE, stream.next())
            .await
            .expect("a batch in time")
            .expect("open")
            .expect("a batch");
        assert_eq!(first.records.len(), 3);
        // Nothing more to read: the stream waits, until the deadline ends it.
        let end = tokio::time::timeout(DEADLINE, stream.next())
            .await
            .expect("the Read ends at its deadline, not never");
        let took = started.elapsed();
        println!("through {via}: {end:?} after {took:?}");
        let status = match end {
            Some(Err(status)) => status,
            other => panic!("through {via}: an error status, not {other:?}"),
        };
        assert_eq!(status.code(), Code::DeadlineExceeded, "through {via}");
        assert!(
            took >= deadline && took < deadline + Duration::from_secs(1),
            "through {via}: ended after {took:?}"
        );
    }
    lease.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxied_read_the_client_cancels_is_closed_on_the_serving_gateway_too() {
    let services = kafka_lease_testkit::require_services!();
    let (a, b) = two_gateways(&services).await;
    let topic = create_topic(&services, 1).await;
    produce_n(&producer(&services), &topic, 0, 3).await;
    let (client_a, client_b) = (a.client().await, b.client().await);
    // A short TTL: an open Read keeps the lease alive, so the lease expires only once the
    // Read on A is closed.
    let ttl = Duration::from_secs(2);
    let lease = client_a
        .acquire(AcquireOptions::new(unique_name("g"), &topic).ttl(ttl))
        .await
        .expect("acquire on A");
    let mut stream = client_b
        .raw()
        .read(proto::ReadRequest {
            lease_id: lease.lease_id().to_string(),
            ..Default::default()
        })
        .await
        .expect("read through B")
        .into_inner();
    tokio::time::timeout(DEADLINE, stream.next())
        .await
        .expect("a batch in time")
        .expect("open")
        .expect("a batch");
    // Open for longer than the TTL: the lease lives on while the proxied Read does.
    tokio::time::sleep(ttl * 2).await;
    let listed = client_b
        .list_leases(LeaseFilter::new().topic(&topic))
        .await
        .expect("list");
    assert_eq!(listed.len(), 1, "alive while the proxied Read is open");

    // The client goes away; B drops its call to A, which closes the Read there, and the
    // lease expires a TTL later.
    drop(stream);
    let cancelled = Instant::now();
    let status = wait_for("the lease to expire on A", DEADLINE, || async {
        match client_a
            .raw()
            .seek(proto::SeekRequest {
                lease_id: lease.lease_id().to_string(),
                position: Some(proto::seek_request::Position::Earliest(())),
            })
            .await
        {
            Ok(_) => {
                // The seek renewed it; wait past a whole TTL before the next look.
                tokio::time::sleep(ttl + Duration::from_millis(500)).await;
                None
            }
            Err(status) => Some(status),
        }
    })
    .await;
    println!(
        "expired {:?} after the cancel: {status:?}",
        cancelled.elapsed()
    );
    assert_eq!(
        StatusDetails::from_status(&status).reason(),
        Some(&Reason::LeaseExpired),
        "{status:?}"
    );
}
