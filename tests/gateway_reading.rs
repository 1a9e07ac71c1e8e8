//! End to end through the real binary, real Kafka and real Consul: reading every record with
//! its fields intact, batch limits, seeking while reading, commit and resume, Release ending
//! a Read, superseding Reads, and TTL expiry.

mod support;

use std::time::{Duration, SystemTime};

use futures::StreamExt;
use kafka_lease_client::proto;
use kafka_lease_client::{AcquireOptions, Bytes, Error, ReadOptions, Reason, SeekTo};
use kafka_lease_testkit::{unique_name, wait_for, Services};
use support::{
    create_topic, kafka_committed, produce, produce_n, producer, unique_prefix, GatewayProcess,
    TestRecord,
};

const DEADLINE: Duration = Duration::from_secs(30);

#[tokio::test]
async fn every_record_arrives_once_in_order_with_fields_intact() {
    let services = kafka_lease_testkit::require_services!();
    let gateway = GatewayProcess::start(&services, &unique_prefix(), &unique_name("gw"), &[]).await;
    let topic = create_topic(&services, 1).await;
    let producer = producer(&services);
    // Every shape a record can have: null and empty keys and values, duplicate and null
    // headers, explicit timestamps.
    let mut records = Vec::new();
    for i in 0..60_u32 {
        let key = match i % 3 {
            0 => None,
            1 => Some(Vec::new()),
            _ => Some(format!("key-{i}").into_bytes()),
        };
        let value = match i % 4 {
            0 => None,
            1 => Some(Vec::new()),
            _ => Some(vec![i as u8; (i as usize) * 13]),
        };
        let headers = vec![
            ("h".to_string(), Some(b"first".to_vec())),
            ("h".to_string(), Some(b"second".to_vec())),
            ("null".to_string(), None),
            ("empty".to_string(), Some(Vec::new())),
        ];
        records.push(TestRecord {
            key,
            value,
            headers,
            timestamp_ms: Some(1_700_000_000_000 + i64::from(i)),
        });
    }
    let offsets = produce(&producer, &topic, 0, &records).await;
    assert_eq!(offsets, (0..60).collect::<Vec<i64>>());

    let client = gateway.client().await;
    let lease = client
        .acquire(AcquireOptions::new(unique_name("g"), &topic).member("reader"))
        .await
        .expect("acquire");
    assert_eq!(lease.offset(), 0);
    assert_eq!(lease.high_watermark(), 60);
    let mut stream = lease
        .records(ReadOptions::new().max_records(7))
        .await
        .expect("read");
    let mut got = Vec::new();
    while got.len() < records.len() {
        let batch = tokio::time::timeout(DEADLINE, stream.next_batch())
            .await
            .expect("a batch within the deadline")
            .expect("stream open")
            .expect("batch");
        assert!(
            !batch.records.is_empty() && batch.records.len() <= 7,
            "batch of {}",
            batch.records.len()
        );
        assert_eq!(batch.seek_epoch, 0);
        got.extend(batch.records);
    }
    assert_eq!(got.len(), records.len(), "no extra records");
    for (i, (sent, received)) in records.iter().zip(&got).enumerate() {
        assert_eq!(received.offset, i as i64, "offsets are consecutive");
        let sent_headers: Vec<_> = (sent.headers.iter())
            .map(|(k, v)| (k.clone(), v.clone().map(Bytes::from)))
            .collect();
        assert_eq!(
            received.key,
            sent.key.clone().map(Bytes::from),
            "key of {i}"
        );
        assert_eq!(
            received.value,
            sent.value.clone().map(Bytes::from),
            "value of {i}"
        );
        assert_eq!(received.headers, sent_headers, "headers of {i}");
        assert_eq!(
            received.timestamp,
            SystemTime::UNIX_EPOCH
                + Duration::from_millis(sent.timestamp_ms.unwrap_or_default() as u64)
        );
        assert_eq!(received.timestamp_type, proto::TimestampType::CreateTime);
    }
    lease.release().await.expect("release");
}

/// `max_wait` is how long the gateway *may* wait to fill a batch: once it has every record up
/// to the high watermark, more would first have to be produced, and it sends what it has.
#[tokio::test]
async fn a_caught_up_partition_sends_its_records_without_waiting_out_max_wait() {
    let services = kafka_lease_testkit::require_services!();
    let gateway = GatewayProcess::start(&services, &unique_prefix(), &unique_name("gw"), &[]).await;
    let topic = create_topic(&services, 1).await;
    let producer = producer(&services);
    produce_n(&producer, &topic, 0, 5).await;

    let client = gateway.client().await;
    let lease = client
        .acquire(AcquireOptions::new(unique_name("g"), &topic))
        .await
        .expect("acquire");
    // The longest wait the contract allows; the test gives up at half of it.
    let max_wait = Duration::from_secs(10);
    let patience = max_wait / 2;
    let mut stream = lease
        .records(ReadOptions::new().max_records(500).max_wait(max_wait))
        .await
        .expect("read");
    let mut offsets = Vec::new();
    while offsets.len() < 5 {
        let batch = tokio::time::timeout(patience, stream.next_batch())
            .await
            .expect("the records before max_wait ran out")
            .expect("stream open")
            .expect("batch");
        offsets.extend(batch.records.iter().map(|r| r.offset));
    }
    assert_eq!(offsets, (0..5).collect::<Vec<i64>>());
    // Following the partition's end: a new record comes on its own, as soon as it is there.
    produce_n(&producer, &topic, 0, 1).await;
    let batch = tokio::time::timeout(patience, stream.next_batch())
        .await
        .expect("the new record before max_wait ran out")
        .expect("stream open")
        .expect("batch");
    assert_eq!(
        batch.records.iter().map(|r| r.offset).collect::<Vec<_>>(),
        vec![5]
    );
    lease.release().await.expect("release");
}

/// Produces `count` records of `size` bytes with one of `oversized` bytes at offset
/// `oversized_at`, reads them all through one raw Read with `max_bytes` (and `max_records`
/// 10,000, `max_wait` 1 s), and checks every response: the oversized record alone, every
/// other response within `bound` bytes, all records in order with no gap. Returns the number
/// of responses and the largest of those within the bound.
async fn read_checking_sizes(
    services: &Services,
    count: usize,
    size: usize,
    (oversized_at, oversized): (usize, usize),
    max_bytes: u32,
    bound: usize,
) -> (usize, usize) {
    let gateway = GatewayProcess::start(services, &unique_prefix(), &unique_name("gw"), &[]).await;
    let topic = create_topic(services, 1).await;
    let producer = producer(services);
    let mut records: Vec<TestRecord> = (0..count)
        .map(|_| TestRecord::value(vec![7_u8; size]))
        .collect();
    records[oversized_at] = TestRecord::value(vec![9_u8; oversized]);
    produce(&producer, &topic, 0, &records).await;

    let client = gateway.client().await;
    let lease = client
        .acquire(AcquireOptions::new(unique_name("g"), &topic))
        .await
        .expect("acquire");
    let mut raw = client.raw();
    let mut stream = raw
        .read(proto::ReadRequest {
            lease_id: lease.lease_id().to_string(),
            max_records: 10_000,
            max_bytes,
            max_wait: Some(prost_types::Duration {
                seconds: 1,
                nanos: 0,
            }),
            from_offset: None,
            if_seek_epoch: None,
        })
        .await
        .expect("read")
        .into_inner();
    let (mut seen, mut responses, mut largest) = (0, 0, 0);
    while seen < count as i64 {
        let response = tokio::time::timeout(DEADLINE, stream.next())
            .await
            .expect("deadline")
            .expect("open")
            .expect("ok");
        responses += 1;
        let encoded = prost::Message::encoded_len(&response);
        if response
            .records
            .iter()
            .any(|r| r.offset == oversized_at as i64)
        {
            assert_eq!(
                response.records.len(),
                1,
                "the oversized record comes alone"
            );
        } else {
            largest = largest.max(encoded);
            assert!(
                encoded <= bound,
                "a response of {encoded} bytes, above its bound of {bound}"
            );
        }
        for r in &response.records {
            assert_eq!(r.offset, seen, "in order, no gaps");
            seen += 1;
        }
    }
    drop(stream);
    lease.release().await.expect("release");
    (responses, largest)
}

#[tokio::test]
async fn batches_respect_max_bytes_and_oversized_records_come_alone() {
    let services = kafka_lease_testkit::require_services!();
    read_checking_sizes(&services, 30, 1000, (10, 10_000), 3_500, 3_500).await;
}

/// A Read that allows 4 MiB per response gets responses of at most `FILL_BYTES` of records
/// (a batch that stays in memory the allocator reuses, and in the core's cache, on its way to
/// the socket), every record in order, and a record larger than that, within `max_bytes`,
/// alone: 1.5 MiB of 1 KiB records, one of 512 KiB among them (within the broker's 1 MB
/// message limit).
#[tokio::test]
async fn responses_stay_within_the_gateways_fill_size_whatever_max_bytes_allows() {
    use kafka_lease_server::lease::FILL_BYTES;
    let services = kafka_lease_testkit::require_services!();
    let (responses, largest) = read_checking_sizes(
        &services,
        1_500,
        1024,
        (700, 512 * 1024),
        4 * 1024 * 1024,
        FILL_BYTES,
    )
    .await;
    println!(
        "1,500 records in {responses} responses, the largest of 1 KiB records {largest} bytes"
    );
}

#[tokio::test]
async fn seeks_while_reading_start_each_epoch_at_the_resolved_offset() {
    let services = kafka_lease_testkit::require_services!();
    let gateway = GatewayProcess::start(&services, &unique_prefix(), &unique_name("gw"), &[]).await;
    let topic = create_topic(&services, 1).await;
    let producer = producer(&services);
    let before = SystemTime::now();
    produce_n(&producer, &topic, 0, 400).await;
    let client = gateway.client().await;
    let group = unique_name("g");
    let lease = client
        .acquire(AcquireOptions::new(&group, &topic))
        .await
        .expect("acquire");
    lease.commit(123).await.expect("commit");

    // The raw stream, so this test sees exactly what the gateway sends (the client crate's
    // epoch filter would hide a violation).
    let mut raw = client.raw();
    let mut stream = raw
        .read(proto::ReadRequest {
            lease_id: lease.lease_id().to_string(),
            max_records: 5,
            max_bytes: 0,
            max_wait: None,
            from_offset: None,
            if_seek_epoch: None,
        })
        .await
        .expect("read")
        .into_inner();
    let first = stream.next().await.expect("open").expect("first batch");
    // The commit moved the lease's resume point: the Read starts there.
    assert_eq!(first.records[0].offset, 123);

    let targets = [
        (SeekTo::Offset(250), 250),
        (SeekTo::Earliest, 0),
        (SeekTo::Offset(399), 399),
        (SeekTo::Committed, 123),
        (SeekTo::Timestamp(before - Duration::from_secs(3600)), 0),
        (SeekTo::Offset(17), 17),
        (SeekTo::Latest, -1),
        (SeekTo::Offset(333), 333),
        (SeekTo::Offset(100), 100),
        (SeekTo::Offset(101), 101),
    ];
    let mut newest_epoch = 0;
    let mut high_watermark = 400;
    let mut last_offset_in_epoch: Option<i64> = None;
    for round in 0..3 {
        for (to, expected) in targets {
            // -1 stands for "the high watermark at this point".
            let expected = if expected == -1 {
                high_watermark
            } else {
                expected
            };
            let outcome = lease.seek(to).await.expect("seek");
            assert_eq!(outcome.offset, expected, "{to:?} resolved");
            assert_eq!(outcome.seek_epoch, newest_epoch + 1, "each seek adds one");
            newest_epoch = outcome.seek_epoch;
            if expected == high_watermark {
                // Nothing past the end yet: produce one record so the epoch has a first one.
                produce_n(&producer, &topic, 0, 1).await;
                high_watermark += 1;
            }
            // Read until the first response of the new epoch; older ones may still be in
            // flight (sent before the SeekResponse), but epochs never go backwards.
            let mut epoch_seen = 0;
            loop {
                let response = tokio::time::timeout(DEADLINE, stream.next())
                    .await
                    .expect("deadline")
                    .expect("open")
                    .expect("ok");
                assert!(
                    response.seek_epoch >= epoch_seen,
                    "epochs never go backwards"
                );
                epoch_seen = response.seek_epoch;
                if response.seek_epoch == newest_epoch {
                    assert_eq!(
                        response.records[0].offset, expected,
                        "round {round}: first record after {to:?}"
                    );
                    let offsets: Vec<i64> = response.records.iter().map(|r| r.offset).collect();
                    let contiguous: Vec<i64> =
                        (expected..expected + offsets.len() as i64).collect();
                    assert_eq!(offsets, contiguous);
                    last_offset_in_epoch = offsets.last().copied();
                    break;
                }
                assert!(response.seek_epoch < newest_epoch);
            }
        }
    }
    assert!(last_offset_in_epoch.is_some());
    drop(stream);

    // The client crate's stream drops older epochs for its users.
    let mut filtered = lease
        .records(ReadOptions::new().max_records(3))
        .await
        .expect("read");
    for to in [SeekTo::Offset(10), SeekTo::Offset(200), SeekTo::Offset(50)] {
        let outcome = lease.seek(to).await.expect("seek");
        let batch = filtered.next_batch().await.expect("open").expect("batch");
        assert_eq!(batch.seek_epoch, outcome.seek_epoch);
        assert_eq!(batch.records[0].offset, outcome.offset);
    }
    drop(filtered);

    let range = format!("0 ..= {high_watermark}");
    for bad in [-1, high_watermark + 1, i64::MAX] {
        match lease.seek(SeekTo::Offset(bad)).await {
            Err(e @ Error::OutOfRange { .. }) => {
                let message = e.message();
                assert!(
                    message.contains(&bad.to_string()) && message.contains(&range),
                    "{message}"
                );
                // The same facts, machine-readable.
                assert_eq!(e.reason(), Some(Reason::OffsetOutOfRange));
                assert_eq!(e.metadata("offset"), Some(bad.to_string().as_str()));
                assert_eq!(e.metadata("low"), Some("0"));
                assert_eq!(
                    e.metadata("high"),
                    Some(high_watermark.to_string().as_str())
                );
            }
            other => panic!("seek to {bad}: {other:?}"),
        }
    }
    lease.release().await.expect("release");
}

#[tokio::test]
async fn commit_release_and_the_next_holder_resumes_at_the_committed_offset() {
    let services = kafka_lease_testkit::require_services!();
    let gateway = GatewayProcess::start(&services, &unique_prefix(), &unique_name("gw"), &[]).await;
    let topic = create_topic(&services, 2).await;
    let producer = producer(&services);
    produce_n(&producer, &topic, 1, 50).await;
    let group = unique_name("g");
    let client = gateway.client().await;

    let first = client
        .acquire(
            AcquireOptions::new(&group, &topic)
                .partition(1)
                .member("first"),
        )
        .await
        .expect("acquire");
    let mut stream = first
        .records(ReadOptions::new().max_records(10))
        .await
        .expect("read");
    let batch = stream.next_batch().await.expect("open").expect("batch");
    let next = batch.next_offset().expect("records");
    assert_eq!(next, 10);
    first
        .commit_with_metadata(next, "batch-1")
        .await
        .expect("commit");
    let (offset, metadata) =
        kafka_committed(&services, &group, &topic, 1).expect("Kafka has the commit");
    assert_eq!(offset, 10);
    assert!(
        metadata.contains(&format!("token={}", first.fencing_token()))
            && metadata.ends_with("batch-1"),
        "{metadata}"
    );
    // Commit 20 as part of the release.
    let first_token = first.fencing_token();
    first.release_with_commit(20).await.expect("release");
    // After Release the open Read ends with OK.
    let end = tokio::time::timeout(DEADLINE, async {
        loop {
            match stream.next_batch().await {
                None => return None,
                Some(Err(e)) => return Some(e),
                Some(Ok(_)) => continue,
            }
        }
    })
    .await
    .expect("the read ends");
    assert!(
        end.is_none(),
        "the Read ends with OK after Release, got {end:?}"
    );
    assert_eq!(
        kafka_committed(&services, &group, &topic, 1).map(|c| c.0),
        Some(20)
    );

    let second = client
        .acquire(
            AcquireOptions::new(&group, &topic)
                .partition(1)
                .member("second"),
        )
        .await
        .expect("acquire at once");
    assert_eq!(second.offset(), 20, "starts at the committed offset");
    assert!(
        second.fencing_token() > first_token,
        "tokens grow across holders"
    );
    let mut stream = second.records(ReadOptions::new()).await.expect("read");
    let batch = stream.next_batch().await.expect("open").expect("batch");
    assert_eq!(batch.records[0].offset, 20);

    // Another group has its own offsets, and OFFSET_RESET_LATEST starts at the end.
    let other = client
        .acquire(
            AcquireOptions::new(unique_name("g"), &topic)
                .partition(1)
                .reset(kafka_lease_client::Reset::Latest),
        )
        .await
        .expect("acquire");
    assert_eq!(other.offset(), 50);
    other.release().await.expect("release");
    drop(stream);
    second.release().await.expect("release");
}

#[tokio::test]
async fn a_newer_read_supersedes_the_open_one() {
    let services = kafka_lease_testkit::require_services!();
    let gateway = GatewayProcess::start(&services, &unique_prefix(), &unique_name("gw"), &[]).await;
    let topic = create_topic(&services, 1).await;
    let producer = producer(&services);
    produce_n(&producer, &topic, 0, 20).await;
    let client = gateway.client().await;
    let lease = client
        .acquire(AcquireOptions::new(unique_name("g"), &topic))
        .await
        .expect("acquire");
    let mut old = lease
        .records(ReadOptions::new().max_records(5))
        .await
        .expect("read");
    let batch = old.next_batch().await.expect("open").expect("batch");
    assert_eq!(batch.records.len(), 5);
    let mut new = lease
        .records(ReadOptions::new().max_records(100))
        .await
        .expect("read");
    // The old Read may still deliver what it had sent before it noticed; it then ends with
    // ABORTED.
    let mut old_last = batch.next_offset().expect("records") - 1;
    let err = tokio::time::timeout(DEADLINE, async {
        loop {
            match old.next_batch().await {
                Some(Ok(batch)) => old_last = batch.next_offset().expect("records") - 1,
                Some(Err(e)) => return e,
                None => panic!("old Read ended with OK, expected ABORTED"),
            }
        }
    })
    .await
    .expect("the old read ends");
    assert!(matches!(err, Error::Superseded { .. }), "{err:?}");
    assert!(old_last >= 4);
    // The new Read starts at the lease's resume point (nothing committed, no seek: the
    // Acquire offset), not after what the old one handed to gRPC, which the client may never
    // have received: at least once, never a gap.
    produce_n(&producer, &topic, 0, 5).await;
    let batch = tokio::time::timeout(DEADLINE, new.next_batch())
        .await
        .expect("a batch within the deadline")
        .expect("open")
        .expect("batch");
    assert_eq!(batch.records[0].offset, 0);
    drop(new);
    lease.release().await.expect("release");
}

#[tokio::test]
async fn an_idle_lease_expires_and_an_open_read_keeps_it_alive() {
    let services = kafka_lease_testkit::require_services!();
    let gateway = GatewayProcess::start(&services, &unique_prefix(), &unique_name("gw"), &[]).await;
    let topic = create_topic(&services, 1).await;
    let group = unique_name("g");
    let client = gateway.client().await;
    let ttl = Duration::from_secs(1);
    let lease = client
        .acquire(
            AcquireOptions::new(&group, &topic)
                .ttl(ttl)
                .member("holder"),
        )
        .await
        .expect("acquire");

    // With a Read open, three TTLs pass and the lease holds.
    let stream = lease.records(ReadOptions::new()).await.expect("read");
    tokio::time::sleep(ttl * 3).await;
    match client
        .acquire(AcquireOptions::new(&group, &topic).partition(0))
        .await
    {
        Err(e @ Error::Busy { .. }) => {
            assert!(e.message().contains("holder"), "{e}");
            assert_eq!(e.reason(), Some(Reason::PartitionBusy));
            assert_eq!(e.metadata("partition"), Some("0"));
            assert!(e.retry_after().is_some(), "{e:?}");
        }
        other => panic!("expected the partition to be held: {other:?}"),
    }
    lease.commit(0).await.expect("the lease is alive");

    // Closed, the lease lapses after its TTL and the partition is free.
    drop(stream);
    let successor = wait_for("the idle lease to expire", DEADLINE, || {
        let client = client.clone();
        let (group, topic) = (group.clone(), topic.clone());
        async move {
            client
                .acquire(AcquireOptions::new(&group, &topic).partition(0))
                .await
                .ok()
        }
    })
    .await;
    match lease.commit(0).await {
        Err(e @ Error::LeaseEnded { .. }) => {
            assert!(e.message().contains("lease expired"), "{e}");
            assert_eq!(e.reason(), Some(Reason::LeaseExpired));
        }
        other => panic!("commit on an expired lease: {other:?}"),
    }
    successor.release().await.expect("release");
}

/// The offsets of the next `count` records a Read delivers.
async fn next_offsets(stream: &mut kafka_lease_client::RecordStream, count: usize) -> Vec<i64> {
    let mut offsets = Vec::new();
    while offsets.len() < count {
        let batch = tokio::time::timeout(DEADLINE, stream.next_batch())
            .await
            .expect("a batch within the deadline")
            .expect("stream open")
            .expect("batch");
        offsets.extend(batch.records.iter().map(|r| r.offset));
    }
    offsets
}

/// A gateway fetches the leases of several groups through as few Kafka clients as it can (a
/// group's client fetches for another group's leases; docs/ARCHITECTURE.md, "The consumer
/// design, and why"), and a partition leased in two groups through two clients. Whichever
/// client fetches them, each group's leases read every record of their partitions and store
/// offsets in their own group only, and one group's lease ending leaves the other group's
/// Reads untouched, even those its client fetched.
#[tokio::test]
async fn groups_on_one_gateway_read_apart_and_keep_their_own_offsets() {
    let services = kafka_lease_testkit::require_services!();
    let gateway = GatewayProcess::start(&services, &unique_prefix(), &unique_name("gw"), &[]).await;
    let topic = create_topic(&services, 2).await;
    let producer = producer(&services);
    produce_n(&producer, &topic, 0, 30).await;
    produce_n(&producer, &topic, 1, 30).await;
    let (a, b) = (unique_name("ga"), unique_name("gb"));
    let client = gateway.client().await;
    let acquire = |group: &str, partition: i32| {
        client.acquire(
            AcquireOptions::new(group, &topic)
                .partition(partition)
                .member("m"),
        )
    };
    // Group a's client is the gateway's first, so it fetches b's partition 1 as well; it
    // fetches partition 0 for a already, so b's partition 0 is fetched by b's own client.
    let a0 = acquire(&a, 0).await.expect("acquire a/0");
    let b1 = acquire(&b, 1).await.expect("acquire b/1");
    let b0 = acquire(&b, 0).await.expect("acquire b/0");
    let options = || ReadOptions::new().max_records(7);
    let mut a0_read = a0.records(options()).await.expect("read a/0");
    let mut b1_read = b1.records(options()).await.expect("read b/1");
    let mut b0_read = b0.records(options()).await.expect("read b/0");
    let all: Vec<i64> = (0..30).collect();
    assert_eq!(next_offsets(&mut a0_read, 30).await, all, "a/0");
    assert_eq!(next_offsets(&mut b1_read, 30).await, all, "b/1");
    assert_eq!(next_offsets(&mut b0_read, 30).await, all, "b/0");

    b0.commit(7).await.expect("commit b/0");
    b1.commit(5).await.expect("commit b/1");
    a0.release_with_commit(12).await.expect("release a/0");
    let committed = |group: &str, partition: i32| {
        kafka_committed(&services, group, &topic, partition).map(|(offset, _)| offset)
    };
    assert_eq!(
        [
            committed(&a, 0),
            committed(&a, 1),
            committed(&b, 0),
            committed(&b, 1)
        ],
        [Some(12), None, Some(7), Some(5)],
        "each group's offsets in its own group"
    );

    // a's lease ended; b's Reads, one of them fetched by a's client, go on.
    produce_n(&producer, &topic, 0, 10).await;
    produce_n(&producer, &topic, 1, 10).await;
    let more: Vec<i64> = (30..40).collect();
    assert_eq!(
        next_offsets(&mut b1_read, 10).await,
        more,
        "b/1 after a's release"
    );
    assert_eq!(
        next_offsets(&mut b0_read, 10).await,
        more,
        "b/0 after a's release"
    );

    // a's partition 0 again, while b's partition 0 is still fetched: at a's offset.
    let again = acquire(&a, 0).await.expect("acquire a/0 again");
    assert_eq!(again.offset(), 12, "a resumes at its own committed offset");
    let mut again_read = again.records(options()).await.expect("read a/0 again");
    assert_eq!(
        next_offsets(&mut again_read, 28).await,
        (12..40).collect::<Vec<i64>>()
    );
    drop((again_read, b0_read, b1_read));
    for lease in [again, b0, b1] {
        lease.release().await.expect("release");
    }
}
