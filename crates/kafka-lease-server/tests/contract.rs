//! The gRPC contract in process: the real server on `127.0.0.1:0`, one or two instances over
//! librdkafka's mock cluster and a shared in-memory lock store (see `support`), reached over
//! TCP with the client crate and the generated stubs. Each test mirrors an end-to-end test
//! under the repository's `tests/` (named above it) where the subject is the contract: the
//! codes, the `google.rpc.ErrorInfo` reasons and metadata, and the values a client sees.
//! What Kafka and Consul themselves do (outages, sessions, lock-delay, real brokers) stays
//! in those end-to-end suites.

mod support;

use kafka_lease_testkit::scenarios;

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use kafka_lease_client::proto;
use kafka_lease_client::{
    AcquireOptions, Bytes, Client, Error, LeaseFilter, ReadOptions, Reason, SeekTo, StatusDetails,
    SubscribeOptions, SubscriptionEvent,
};
use kafka_lease_server::coordination::LockBackend;
use kafka_lease_server::dev::DEMO_TOPIC;
use kafka_lease_testkit::{unique_name, wait_for};
use support::{Rig, TestRecord, A, B, DEADLINE};
use tokio::time::Instant;
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::HealthCheckRequest;

/// The code and the ErrorInfo reason of a status.
fn reason(status: &tonic::Status) -> (Code, Option<String>) {
    (
        status.code(),
        StatusDetails::from_status(status)
            .reason()
            .map(|r| r.as_str().to_string()),
    )
}

/// The next response of a raw Read, within the deadline; the stream must stay open.
async fn next_response(stream: &mut tonic::Streaming<proto::ReadResponse>) -> proto::ReadResponse {
    tokio::time::timeout(DEADLINE, stream.next())
        .await
        .expect("a response in time")
        .expect("the stream stays open")
        .expect("a batch")
}

fn read_request(lease_id: &str, max_records: u32) -> proto::ReadRequest {
    proto::ReadRequest {
        lease_id: lease_id.to_string(),
        max_records,
        ..Default::default()
    }
}

// ---------------------------------------------------------------------------------------------
// The standard services

/// Mirrors gateway_coordination.rs `health_is_serving_with_both_services_up`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_serving_on_every_instance() {
    let rig = Rig::two().await;
    for instance in [A, B] {
        let health = rig.health(instance).await;
        for service in ["", "kafka_lease.v1.PartitionLeaseService"] {
            let status = wait_for(&format!("SERVING for {service:?}"), DEADLINE, || {
                let mut health = health.clone();
                async move {
                    let status = health
                        .check(HealthCheckRequest {
                            service: service.to_string(),
                        })
                        .await
                        .ok()?
                        .into_inner()
                        .status;
                    (status == ServingStatus::Serving as i32).then_some(status)
                }
            })
            .await;
            assert_eq!(status, 1);
        }
    }
}

/// Mirrors gateway_coordination.rs `grpcurl_lists_describes_and_acquires_through_reflection`
/// (`list` and `describe`, which grpcurl does over reflection v1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_lists_and_describes_the_service() {
    use prost::Message as _;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    use tonic_reflection::pb::v1::ServerReflectionRequest;

    let rig = Rig::one().await;
    let mut reflection = rig.reflection(A).await;
    let ask = |request: MessageRequest| {
        futures::stream::iter([ServerReflectionRequest {
            host: String::new(),
            message_request: Some(request),
        }])
    };
    let mut answers = reflection
        .server_reflection_info(ask(MessageRequest::ListServices(String::new())))
        .await
        .expect("reflection answers")
        .into_inner();
    let listed = match answers
        .next()
        .await
        .expect("an answer")
        .expect("ok")
        .message_response
    {
        Some(MessageResponse::ListServicesResponse(list)) => {
            list.service.into_iter().map(|s| s.name).collect::<Vec<_>>()
        }
        other => panic!("a service list, not {other:?}"),
    };
    for service in [
        "kafka_lease.v1.PartitionLeaseService",
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
    ] {
        assert!(listed.iter().any(|s| s == service), "{listed:?}");
    }

    let mut answers = reflection
        .server_reflection_info(ask(MessageRequest::FileContainingSymbol(
            "kafka_lease.v1.PartitionLeaseService".into(),
        )))
        .await
        .expect("reflection answers")
        .into_inner();
    let files = match answers
        .next()
        .await
        .expect("an answer")
        .expect("ok")
        .message_response
    {
        Some(MessageResponse::FileDescriptorResponse(files)) => files.file_descriptor_proto,
        other => panic!("file descriptors, not {other:?}"),
    };
    let methods: Vec<String> = files
        .iter()
        .map(|bytes| prost_types::FileDescriptorProto::decode(bytes.as_slice()).expect("decodes"))
        .flat_map(|file| file.service)
        .filter(|service| service.name() == "PartitionLeaseService")
        .flat_map(|service| service.method)
        .map(|method| method.name().to_string())
        .collect();
    for rpc in ["Acquire", "Read", "Seek", "Commit", "Release", "ListLeases"] {
        assert!(methods.iter().any(|m| m == rpc), "{methods:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// Acquire: exclusivity and picking a partition

/// Mirrors gateway_reading.rs `an_idle_lease_expires_and_an_open_read_keeps_it_alive` (the
/// refusal while held) and gateway_coordination.rs
/// `bad_requests_get_their_documented_code_and_change_nothing` ("held partition"), through
/// the instance that serves the lease and through the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_acquire_of_a_held_partition_is_refused_naming_the_holder() {
    let rig = Rig::two().await;
    let group = unique_name("g");
    let holder = rig
        .client(A)
        .await
        .acquire(
            AcquireOptions::new(&group, DEMO_TOPIC)
                .partition(0)
                .member("holder"),
        )
        .await
        .expect("acquire");
    for instance in [A, B] {
        match rig
            .client(instance)
            .await
            .acquire(AcquireOptions::new(&group, DEMO_TOPIC).partition(0))
            .await
        {
            Err(e @ Error::Busy { .. }) => {
                assert_eq!(e.code(), Code::ResourceExhausted);
                assert!(e.message().contains("holder"), "{e}");
                assert_eq!(e.reason(), Some(Reason::PartitionBusy));
                assert_eq!(e.metadata("partition"), Some("0"));
                assert_eq!(e.metadata("holder_member"), Some("holder"));
                assert_eq!(e.metadata("holder_gateway"), Some(holder.gateway()));
                assert!(e.retry_after().is_some(), "{e:?}");
            }
            other => panic!("expected the partition to be held: {other:?}"),
        }
    }
    holder.release().await.expect("release");
}

/// Mirrors gateway_coordination.rs `two_gateways_never_grant_one_partition_twice`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_never_grant_one_partition_twice() {
    let rig = Rig::two().await;
    let partitions = 4;
    let topic = rig.create_topic(partitions);
    let group = unique_name("g");
    let (client_a, client_b) = (rig.client(A).await, rig.client(B).await);

    // Twice as many clients as partitions race, alternating between the instances, none
    // naming a partition.
    let attempts = (0..partitions * 2).map(|i| {
        let client = if i % 2 == 0 {
            client_a.clone()
        } else {
            client_b.clone()
        };
        let options = AcquireOptions::new(&group, &topic).member(format!("member-{i}"));
        async move { client.acquire(options).await }
    });
    let mut holders: BTreeMap<i32, usize> = BTreeMap::new();
    let mut leases = Vec::new();
    let mut refused = 0;
    for result in futures::future::join_all(attempts).await {
        match result {
            Ok(lease) => {
                *holders.entry(lease.partition()).or_default() += 1;
                leases.push(lease);
            }
            Err(Error::Busy { message, .. }) => {
                assert!(message.contains("member-"), "names the holder: {message}");
                refused += 1;
            }
            Err(other) => panic!("unexpected: {other:?}"),
        }
    }
    assert_eq!(holders.len(), partitions as usize, "{holders:?}");
    assert!(holders.values().all(|n| *n == 1), "{holders:?}");
    assert_eq!(refused, partitions as usize);

    // Both instances list the same leases, with the live details of whichever serves each.
    let key = |l: &kafka_lease_client::LeaseInfo| {
        (
            l.partition,
            l.fencing_token,
            l.member.clone(),
            l.gateway.clone(),
        )
    };
    let listed_a = client_a
        .list_leases(LeaseFilter::new().group(&group))
        .await
        .expect("list");
    let listed_b = client_b
        .list_leases(LeaseFilter::new().group(&group))
        .await
        .expect("list");
    assert_eq!(listed_a.len(), 4);
    assert_eq!(
        listed_a.iter().map(key).collect::<Vec<_>>(),
        listed_b.iter().map(key).collect::<Vec<_>>()
    );
    for info in listed_a.iter().chain(&listed_b) {
        assert!(
            info.position.is_some() && info.expires_at.is_some(),
            "{info:?}"
        );
        assert_eq!(info.details_unavailable, None, "{info:?}");
    }

    // Released, partitions 0 and 1 go to A with larger tokens.
    let before: BTreeMap<i32, u64> = leases
        .iter()
        .map(|l| (l.partition(), l.fencing_token()))
        .collect();
    for lease in leases.drain(..) {
        lease.release().await.expect("release");
    }
    for partition in [0, 1] {
        let lease = client_a
            .acquire(
                AcquireOptions::new(&group, &topic)
                    .partition(partition)
                    .member("on-a"),
            )
            .await
            .expect("acquire on A");
        assert!(lease.fencing_token() > before[&partition], "tokens grow");
        leases.push(lease);
    }

    // A client waiting on B gets a partition held through A right after its release.
    let lease = leases.remove(0);
    let partition = lease.partition();
    let waiter = {
        let client_b = client_b.clone();
        let options = AcquireOptions::new(&group, &topic)
            .partition(partition)
            .member("waiter")
            .wait(Duration::from_secs(20));
        tokio::spawn(async move { (client_b.acquire(options).await, Instant::now()) })
    };
    let gateway_b = rig.node(B).gateway.clone();
    wait_for("the Acquire to wait on B", DEADLINE, || async {
        (gateway_b.waiting_acquires() == 1).then_some(())
    })
    .await;
    assert!(
        !waiter.is_finished(),
        "it waits while the partition is held"
    );
    let released_at = Instant::now();
    lease.release().await.expect("release");
    let (granted, granted_at) = waiter.await.expect("join");
    let granted = granted.expect("the waiter gets the partition");
    assert_eq!(granted.partition(), partition);
    assert!(granted_at - released_at < Duration::from_secs(5));

    // A lease A serves, named on B: forwarded. A lease id nobody knows: NOT_FOUND.
    let mut raw_b = client_b.raw();
    raw_b
        .commit(proto::CommitRequest {
            lease_id: leases[0].lease_id().to_string(),
            offset: 0,
            metadata: None,
        })
        .await
        .expect("a commit through B of a lease A serves");
    let status = raw_b
        .commit(proto::CommitRequest {
            lease_id: "0123456789abcdef.00".into(),
            offset: 0,
            metadata: None,
        })
        .await
        .expect_err("unknown");
    assert_eq!(status.code(), Code::NotFound);

    for lease in leases {
        lease.release().await.expect("release");
    }
    granted.release().await.expect("release");
    assert!(
        rig.node(A)
            .locks
            .list(Some(&group))
            .await
            .expect("list")
            .is_empty(),
        "every lock released"
    );
}

/// Mirrors gateway_coordination.rs `two_gateways_never_grant_one_partition_twice` (an Acquire
/// without a partition takes a free one; with none free it is refused naming a holder).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_without_a_partition_takes_a_free_one() {
    let rig = Rig::one().await;
    let client = rig.client(A).await;
    let group = unique_name("g");
    let mut held = Vec::new();
    for partition in [0, 1, 3] {
        held.push(
            client
                .acquire(
                    AcquireOptions::new(&group, DEMO_TOPIC)
                        .partition(partition)
                        .member(format!("member-{partition}")),
                )
                .await
                .expect("acquire"),
        );
    }
    let free = client
        .acquire(AcquireOptions::new(&group, DEMO_TOPIC).member("any"))
        .await
        .expect("the free partition");
    assert_eq!(free.partition(), 2);
    match client
        .acquire(AcquireOptions::new(&group, DEMO_TOPIC).member("late"))
        .await
    {
        Err(e @ Error::Busy { .. }) => {
            assert_eq!(e.reason(), Some(Reason::PartitionBusy), "{e}");
            assert_eq!(e.metadata("busy_partitions"), Some("4"), "{e:?}");
            let message = e.message();
            assert!(message.contains("every partition is leased"), "{message}");
            for holder in ["member-0", "member-1", "any", "member-3"] {
                assert!(message.contains(&format!("{holder:?}")), "{message}");
            }
        }
        other => panic!("every partition is held: {other:?}"),
    }
    free.release().await.expect("release");
    for lease in held {
        lease.release().await.expect("release");
    }
}

// ---------------------------------------------------------------------------------------------
// Read, Seek, Commit, Release

/// Mirrors gateway_reading.rs `every_record_arrives_once_in_order_with_fields_intact`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_record_arrives_once_in_order_with_fields_intact() {
    let rig = Rig::one().await;
    let topic = rig.create_topic(1);
    // Every shape a record can have: null and empty keys and values, duplicate and null
    // headers, explicit timestamps.
    let records: Vec<TestRecord> = (0..60_u32)
        .map(|i| TestRecord {
            key: match i % 3 {
                0 => None,
                1 => Some(Vec::new()),
                _ => Some(format!("key-{i}").into_bytes()),
            },
            value: match i % 4 {
                0 => None,
                1 => Some(Vec::new()),
                _ => Some(vec![i as u8; (i as usize) * 13]),
            },
            headers: vec![
                ("h".to_string(), Some(b"first".to_vec())),
                ("h".to_string(), Some(b"second".to_vec())),
                ("null".to_string(), None),
                ("empty".to_string(), Some(Vec::new())),
            ],
            timestamp_ms: Some(1_700_000_000_000 + i64::from(i)),
        })
        .collect();
    assert_eq!(
        rig.produce(&topic, 0, &records).await,
        (0..60).collect::<Vec<i64>>()
    );

    let client = rig.client(A).await;
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

/// Mirrors gateway_reading.rs `seeks_while_reading_start_each_epoch_at_the_resolved_offset`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeks_while_reading_start_each_epoch_at_the_resolved_offset() {
    let rig = Rig::one().await;
    let topic = rig.create_topic(1);
    // One second apart: a time between two records finds the later one.
    let base_ms = 1_700_000_000_000_i64;
    let records: Vec<TestRecord> = (0..100)
        .map(|i| TestRecord {
            timestamp_ms: Some(base_ms + 1000 * i),
            ..TestRecord::value(format!("v{i}"))
        })
        .collect();
    rig.produce(&topic, 0, &records).await;
    let at = |ms: i64| SystemTime::UNIX_EPOCH + Duration::from_millis(ms as u64);
    let client = rig.client(A).await;
    let lease = client
        .acquire(AcquireOptions::new(unique_name("g"), &topic))
        .await
        .expect("acquire");
    lease.commit(23).await.expect("commit");

    // The raw stream, so this test sees exactly what the gateway sends (the client crate's
    // epoch filter would hide a violation).
    let mut raw = client.raw();
    let mut stream = raw
        .read(read_request(lease.lease_id(), 5))
        .await
        .expect("read")
        .into_inner();
    // The commit moved the lease's resume point: the Read starts there.
    assert_eq!(next_response(&mut stream).await.records[0].offset, 23);

    let targets = [
        (SeekTo::Offset(25), 25),
        (SeekTo::Earliest, 0),
        (SeekTo::Offset(99), 99),
        (SeekTo::Committed, 23),
        (SeekTo::Timestamp(at(base_ms - 3_600_000)), 0),
        (SeekTo::Timestamp(at(base_ms + 16_500)), 17),
        (SeekTo::Offset(17), 17),
        (SeekTo::Latest, -1),
        (SeekTo::Offset(50), 50),
        (SeekTo::Offset(51), 51),
    ];
    let mut newest_epoch = 0;
    let mut high_watermark = 100;
    // One round (the end-to-end test runs three): a seek by time costs a scan of the
    // partition here, as the mock cluster cannot look offsets up by time.
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
            // Nothing past the end yet: one record so the epoch has a first one.
            rig.produce_n(&topic, 0, 1).await;
            high_watermark += 1;
        }
        // Older epochs may still be in flight, but epochs never go backwards and the new
        // one starts at the resolved offset.
        let mut epoch_seen = 0;
        loop {
            let response = next_response(&mut stream).await;
            assert!(response.seek_epoch >= epoch_seen, "epochs never go back");
            epoch_seen = response.seek_epoch;
            if response.seek_epoch == newest_epoch {
                let offsets: Vec<i64> = response.records.iter().map(|r| r.offset).collect();
                let contiguous: Vec<i64> = (expected..expected + offsets.len() as i64).collect();
                assert_eq!(offsets, contiguous, "after {to:?}");
                break;
            }
            assert!(response.seek_epoch < newest_epoch);
        }
    }
    drop(stream);

    // The client crate's stream drops older epochs for its users.
    let mut filtered = lease
        .records(ReadOptions::new().max_records(3))
        .await
        .expect("read");
    for to in [SeekTo::Offset(10), SeekTo::Offset(80), SeekTo::Offset(40)] {
        let outcome = lease.seek(to).await.expect("seek");
        let batch = tokio::time::timeout(DEADLINE, filtered.next_batch())
            .await
            .expect("a batch in time")
            .expect("open")
            .expect("batch");
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

/// Mirrors gateway_reading.rs
/// `commit_release_and_the_next_holder_resumes_at_the_committed_offset`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commit_release_and_the_next_holder_resumes_at_the_committed_offset() {
    let rig = Rig::one().await;
    let topic = rig.create_topic(2);
    rig.produce_n(&topic, 1, 50).await;
    let group = unique_name("g");
    let client = rig.client(A).await;

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
    let batch = tokio::time::timeout(DEADLINE, stream.next_batch())
        .await
        .expect("a batch in time")
        .expect("open")
        .expect("batch");
    let next = batch.next_offset().expect("records");
    assert_eq!(next, 10);
    first
        .commit_with_metadata(next, "batch-1")
        .await
        .expect("commit");
    let (offset, metadata) = rig
        .committed(&group, &topic, 1)
        .await
        .expect("the cluster has the commit");
    assert_eq!(offset, 10);
    assert!(
        metadata.contains(&format!("token={}", first.fencing_token()))
            && metadata.ends_with("batch-1"),
        "{metadata}"
    );
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
        "the Read ends with OK after Release: {end:?}"
    );
    assert_eq!(
        rig.committed(&group, &topic, 1).await.map(|c| c.0),
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
    assert!(second.fencing_token() > first_token, "tokens grow");
    let mut stream = second.records(ReadOptions::new()).await.expect("read");
    let batch = tokio::time::timeout(DEADLINE, stream.next_batch())
        .await
        .expect("a batch in time")
        .expect("open")
        .expect("batch");
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

/// Commit fencing: a call on a lease that has ended is refused with the reason it ended, and
/// changes nothing. Mirrors gateway_coordination.rs
/// `bad_requests_get_their_documented_code_and_change_nothing` ("released lease", "seek on
/// released", "commit on released", a second Release) and forwarding.rs
/// `every_call_through_the_other_gateway_gives_what_the_serving_one_gives` (its second
/// Release).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_on_a_released_lease_is_fenced_off_and_changes_nothing() {
    let rig = Rig::one().await;
    let group = unique_name("g");
    let client = rig.client(A).await;
    let old = client
        .acquire(AcquireOptions::new(&group, DEMO_TOPIC).partition(0))
        .await
        .expect("acquire");
    let old_id = old.lease_id().to_string();
    let reference = old_id.split('.').next().expect("a reference").to_string();
    old.commit(3).await.expect("commit");
    old.release().await.expect("release");
    // The next holder starts where the old one committed.
    let next = client
        .acquire(AcquireOptions::new(&group, DEMO_TOPIC).partition(0))
        .await
        .expect("the next holder");
    assert_eq!(next.offset(), 3);

    let mut raw = client.raw();
    let status = raw
        .commit(proto::CommitRequest {
            lease_id: old_id.clone(),
            offset: 7,
            metadata: None,
        })
        .await
        .expect_err("a commit from the released lease");
    assert_eq!(
        reason(&status),
        (Code::FailedPrecondition, Some("LEASE_RELEASED".into()))
    );
    assert!(status.message().contains("released"), "{status:?}");
    assert_eq!(
        StatusDetails::from_status(&status).metadata("lease_ref"),
        Some(reference.as_str())
    );
    let status = raw
        .seek(proto::SeekRequest {
            lease_id: old_id.clone(),
            position: Some(proto::seek_request::Position::Earliest(())),
        })
        .await
        .expect_err("a seek on the released lease");
    assert_eq!(
        reason(&status),
        (Code::FailedPrecondition, Some("LEASE_RELEASED".into()))
    );
    let status = raw
        .read(read_request(&old_id, 0))
        .await
        .expect_err("a read of the released lease");
    assert_eq!(
        reason(&status),
        (Code::FailedPrecondition, Some("LEASE_RELEASED".into()))
    );
    assert!(status.message().contains("released"), "{status:?}");
    let status = raw
        .release(proto::ReleaseRequest {
            lease_id: old_id.clone(),
            commit_offset: None,
        })
        .await
        .expect_err("a second release");
    assert_eq!(
        reason(&status),
        (Code::NotFound, Some("LEASE_NOT_FOUND".into()))
    );
    assert_eq!(
        status.message(),
        format!("lease \"{reference}\" has ended: lease released")
    );

    // Nothing the old lease tried counted: the group's offset is the old commit, and the
    // next holder's own commit goes through.
    assert_eq!(
        rig.committed(&group, DEMO_TOPIC, 0).await.map(|c| c.0),
        Some(3)
    );
    next.commit(5).await.expect("the holder's commit");
    next.release().await.expect("release");
}

/// Mirrors gateway_coordination.rs `bad_requests_get_their_documented_code_and_change_nothing`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_their_documented_code_and_change_nothing() {
    let rig = Rig::one().await;
    let topic = rig.create_topic(2);
    rig.produce_n(&topic, 0, 5).await;
    let group = unique_name("g");
    let client = rig.client(A).await;
    scenarios::bad_requests_get_their_documented_code_and_change_nothing(
        &client,
        &group,
        &topic,
        || async {
            rig.node(A)
                .locks
                .list(None)
                .await
                .expect("locks")
                .into_iter()
                .map(|l| (l.key, l.token, l.holder))
                .collect::<Vec<_>>()
        },
        |group, topic| {
            let rig = &rig;
            async move { rig.committed(&group, &topic, 0).await.is_some() }
        },
    )
    .await;
}

/// Mirrors gateway_coordination.rs `bad_requests_get_their_documented_code_and_change_nothing`
/// ("unknown lease") and `two_gateways_never_grant_one_partition_twice` (an unknown id
/// through the other instance), for every call that names a lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_id_no_instance_knows_is_not_found_with_its_reference() {
    let rig = Rig::two().await;
    let unknown = "feedfacefeedface.0000";
    for instance in [A, B] {
        let mut raw = rig.client(instance).await.raw();
        let statuses = [
            raw.read(read_request(unknown, 0))
                .await
                .map(|_| ())
                .expect_err("read"),
            raw.seek(proto::SeekRequest {
                lease_id: unknown.into(),
                position: Some(proto::seek_request::Position::Earliest(())),
            })
            .await
            .map(|_| ())
            .expect_err("seek"),
            raw.commit(proto::CommitRequest {
                lease_id: unknown.into(),
                offset: 0,
                metadata: None,
            })
            .await
            .map(|_| ())
            .expect_err("commit"),
            raw.release(proto::ReleaseRequest {
                lease_id: unknown.into(),
                commit_offset: None,
            })
            .await
            .map(|_| ())
            .expect_err("release"),
        ];
        for status in statuses {
            assert_eq!(
                reason(&status),
                (Code::NotFound, Some("LEASE_NOT_FOUND".into())),
                "{status:?}"
            );
            assert!(status.message().contains("feedfacefeedface"), "{status:?}");
            assert_eq!(
                StatusDetails::from_status(&status).metadata("lease_ref"),
                Some("feedfacefeedface")
            );
        }
    }
}

/// A live lease's id with its secret mistyped: NOT_FOUND, with a message that tells its
/// sender both possibilities (the reference unknown, or the secret not matching) so that it
/// confirms neither; the same words as for a reference nobody knows; and the lease goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_lease_id_with_a_wrong_secret_is_unknown_or_mismatched_and_changes_nothing() {
    let rig = Rig::two().await;
    let group = unique_name("g");
    let client = rig.client(A).await;
    let lease = client
        .acquire(AcquireOptions::new(&group, DEMO_TOPIC).partition(1))
        .await
        .expect("acquire");
    let id = lease.lease_id().to_string();
    let (reference, rest) = id.split_once('.').expect("<reference>.<secret>~<instance>");
    let (secret, instance) = rest.split_once('~').expect("an instance");
    let wrong_secret = format!("{reference}.{}~{instance}", "0".repeat(secret.len()));
    let unknown_reference = format!("{}.{secret}~{instance}", "feedfacefeedface");
    for via in [A, B] {
        let mut raw = rig.client(via).await.raw();
        let mut messages = Vec::new();
        for (sent, shown) in [
            (&wrong_secret, reference),
            (&unknown_reference, "feedfacefeedface"),
        ] {
            let status = raw
                .commit(proto::CommitRequest {
                    lease_id: sent.clone(),
                    offset: 0,
                    metadata: None,
                })
                .await
                .map(|_| ())
                .expect_err("a commit with an id that is not the lease's");
            assert_eq!(
                reason(&status),
                (Code::NotFound, Some("LEASE_NOT_FOUND".into())),
                "{status:?}"
            );
            let message = status.message();
            assert!(message.contains(shown), "{message}");
            assert!(
                message.contains("unknown") && message.contains("secret"),
                "the message must name both possibilities: {message}"
            );
            assert!(!message.contains(secret), "never echo a secret: {message}");
            messages.push(message.replace(shown, "<reference>"));
        }
        assert_eq!(
            messages[0], messages[1],
            "a wrong secret reads like an unknown reference"
        );
    }
    // Nothing changed: the lease still commits and releases.
    lease.commit(0).await.expect("the lease is untouched");
    lease.release().await.expect("release");
}

/// Mirrors gateway_reading.rs `an_idle_lease_expires_and_an_open_read_keeps_it_alive` (the
/// open Read here outlives the TTL by half of it, not three times).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_lease_expires_and_an_open_read_keeps_it_alive() {
    let rig = Rig::one().await;
    let group = unique_name("g");
    let client = rig.client(A).await;
    let ttl = Duration::from_secs(1);
    let lease = client
        .acquire(
            AcquireOptions::new(&group, DEMO_TOPIC)
                .partition(0)
                .ttl(ttl)
                .member("holder"),
        )
        .await
        .expect("acquire");

    // With a Read open, the TTL passes and the lease holds: time passing is the subject.
    let stream = lease.records(ReadOptions::new()).await.expect("read");
    tokio::time::sleep(ttl + ttl / 2).await;
    match client
        .acquire(AcquireOptions::new(&group, DEMO_TOPIC).partition(0))
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
        let group = group.clone();
        async move {
            client
                .acquire(AcquireOptions::new(&group, DEMO_TOPIC).partition(0))
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

/// Mirrors gateway_reading.rs `a_newer_read_supersedes_the_open_one`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_read_supersedes_the_open_one() {
    let rig = Rig::one().await;
    let topic = rig.create_topic(1);
    rig.produce_n(&topic, 0, 20).await;
    let client = rig.client(A).await;
    let lease = client
        .acquire(AcquireOptions::new(unique_name("g"), &topic))
        .await
        .expect("acquire");
    let mut old = lease
        .records(ReadOptions::new().max_records(5))
        .await
        .expect("read");
    let batch = tokio::time::timeout(DEADLINE, old.next_batch())
        .await
        .expect("a batch in time")
        .expect("open")
        .expect("batch");
    assert_eq!(batch.records.len(), 5);
    let mut new = lease
        .records(ReadOptions::new().max_records(100))
        .await
        .expect("read");
    // The old Read may still deliver what it had sent before it noticed; it then ends with
    // ABORTED (SUPERSEDED).
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
    assert_eq!(err.code(), Code::Aborted);
    assert_eq!(err.reason(), Some(Reason::Superseded));
    assert!(old_last >= 4);
    // The new Read starts at the lease's resume point (the Acquire offset), not after what
    // the old one handed to gRPC: at least once, never a gap.
    let batch = tokio::time::timeout(DEADLINE, new.next_batch())
        .await
        .expect("a batch within the deadline")
        .expect("open")
        .expect("batch");
    assert_eq!(batch.records[0].offset, 0);
    drop(new);
    lease.release().await.expect("release");
}

/// Mirrors gateway_coordination.rs `list_leases_pages_in_key_order`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_leases_pages_in_key_order() {
    let rig = Rig::one().await;
    let client = rig.client(A).await;
    let topic = rig.create_topic(12);
    let group = unique_name("g");
    let mut leases = Vec::new();
    for partition in [11, 2, 10, 0, 1] {
        leases.push(
            client
                .acquire(AcquireOptions::new(&group, &topic).partition(partition))
                .await
                .expect("acquire"),
        );
    }
    let mut raw = client.raw();
    let mut pages = Vec::new();
    let mut token = String::new();
    loop {
        let page = raw
            .list_leases(proto::ListLeasesRequest {
                group: Some(group.clone()),
                page_size: 2,
                page_token: token,
                ..Default::default()
            })
            .await
            .expect("a page")
            .into_inner();
        pages.push(page.leases.iter().map(|l| l.partition).collect::<Vec<_>>());
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert_eq!(pages, [vec![0, 1], vec![2, 10], vec![11]]);
    let all = client
        .list_leases(LeaseFilter::new().group(&group).page_size(2))
        .await
        .expect("list");
    assert_eq!(
        all.iter().map(|l| l.partition).collect::<Vec<_>>(),
        [0, 1, 2, 10, 11]
    );
    for (size, token) in [(5_001, ""), (0, "not/a-token")] {
        let err = raw
            .list_leases(proto::ListLeasesRequest {
                page_size: size,
                page_token: token.to_string(),
                ..Default::default()
            })
            .await
            .expect_err("refused");
        assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    }
    for lease in leases {
        lease.release().await.expect("release");
    }
}

// ---------------------------------------------------------------------------------------------
// Any instance serves any lease

/// Mirrors forwarding.rs `every_call_through_the_other_gateway_gives_what_the_serving_one_gives`:
/// Read, Seek, Commit and Release through B on a lease held through A.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_call_through_the_other_instance_gives_what_the_serving_one_gives() {
    let rig = Rig::two().await;
    let topic = rig.create_topic(1);
    let records: Vec<TestRecord> = (0..20)
        .map(|i| TestRecord::value(format!("record-{i}")))
        .collect();
    rig.produce(&topic, 0, &records).await;
    let (client_a, client_b) = (rig.client(A).await, rig.client(B).await);

    let committed = |group: String, topic: String| {
        let rig = &rig;
        async move { rig.committed(&group, &topic, 0).await }
    };
    let direct =
        scenarios::one_lease_life(&client_a, &client_a, &unique_name("g"), &topic, committed).await;
    let forwarded =
        scenarios::one_lease_life(&client_a, &client_b, &unique_name("g"), &topic, committed).await;
    assert_eq!(forwarded, direct);
    // And the transcript is the one the contract promises (so equal is not equally wrong).
    assert_eq!(direct.start, 0);
    assert_eq!(direct.first_batch.first().map(|r| r.0), Some(0));
    assert_eq!(direct.seek, (12, 1));
    assert_eq!(direct.after_seek.first(), Some(&(12, 1)));
    assert_eq!(direct.out_of_range.0, Code::OutOfRange);
    assert_eq!(
        direct.out_of_range.2.as_deref(),
        Some("OFFSET_OUT_OF_RANGE")
    );
    assert_eq!(direct.released_with, Some(15));
    assert_eq!(
        direct.after_release,
        (Code::FailedPrecondition, Some("LEASE_RELEASED".into()))
    );
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
}

/// Mirrors forwarding.rs `a_read_ends_at_the_callers_deadline_directly_and_forwarded_alike`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_ends_at_the_callers_deadline_directly_and_forwarded_alike() {
    let rig = Rig::two().await;
    let topic = rig.create_topic(1);
    rig.produce_n(&topic, 0, 3).await;
    let (client_a, client_b) = (rig.client(A).await, rig.client(B).await);
    let lease = client_a
        .acquire(AcquireOptions::new(unique_name("g"), &topic))
        .await
        .expect("acquire on A");
    let deadline = Duration::from_millis(700);
    for (via, client) in [("A (serving)", &client_a), ("B (forwarding)", &client_b)] {
        let mut request = tonic::Request::new(proto::ReadRequest {
            lease_id: lease.lease_id().to_string(),
            from_offset: Some(0),
            ..Default::default()
        });
        request.set_timeout(deadline);
        let started = Instant::now();
        let mut stream = client.raw().read(request).await.expect("read").into_inner();
        assert_eq!(next_response(&mut stream).await.records.len(), 3);
        // Nothing more to read: the stream waits, until the deadline ends it.
        let end = tokio::time::timeout(DEADLINE, stream.next())
            .await
            .expect("the Read ends at its deadline, not never");
        let took = started.elapsed();
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

// ---------------------------------------------------------------------------------------------
// Limits and authorization

/// Mirrors limits.rs `one_connection_cannot_take_more_than_its_limits`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_connection_cannot_take_more_than_its_limits() {
    let rig = Rig::one()
        .leases_per_connection(1)
        .long_calls_per_connection(2)
        .await;
    let topic = rig.create_topic(3);
    let group = unique_name("g");
    let options = |partition: i32| AcquireOptions::new(&group, &topic).partition(partition);

    // Leases per connection: the second Acquire on one connection is refused, naming the
    // flag and its value; another connection is not affected.
    let first = rig.client(A).await;
    let lease = first.acquire(options(0)).await.expect("the first lease");
    match first.acquire(options(1)).await {
        Err(e @ Error::Busy { .. }) => {
            let details = e.details().expect("details");
            assert_eq!(details.reason(), Some(&Reason::LimitReached), "{e}");
            assert_eq!(
                details.metadata("limit"),
                Some("--max-leases-per-connection")
            );
            assert!(
                e.to_string().contains("--max-leases-per-connection")
                    && e.to_string().contains('1'),
                "names the flag and its value: {e}"
            );
        }
        other => panic!("a second lease on one connection is refused: {other:?}"),
    }
    let other = rig.client(A).await;
    let second = other.acquire(options(1)).await.expect("another connection");
    lease.release().await.expect("release");
    let again = first.acquire(options(0)).await.expect("a lease again");

    // Long calls per connection: two waiting Acquires fill a connection that may have two;
    // a third long call is refused at once, while short calls are answered.
    let ended = rig
        .client(A)
        .await
        .acquire(options(2))
        .await
        .expect("a lease");
    let ended_id = ended.lease_id().to_string();
    ended.release().await.expect("release");
    let read = |client: Client| {
        let lease_id = ended_id.clone();
        async move {
            client
                .raw()
                .read(read_request(&lease_id, 0))
                .await
                .map(|_| ())
                .map_err(Error::from)
        }
    };
    let busy = rig.client(A).await;
    let waiting: Vec<_> = [0, 1]
        .into_iter()
        .map(|partition| {
            let (client, options) = (
                busy.clone(),
                options(partition).wait(Duration::from_secs(30)),
            );
            tokio::spawn(async move { client.acquire(options).await })
        })
        .collect();
    // Both wait before anything else is opened on the connection: a long call probing the
    // limit while the second was still on its way would take its place.
    let gateway = rig.node(A).gateway.clone();
    wait_for("the two Acquires to wait", DEADLINE, || async {
        (gateway.waiting_acquires() == 2).then_some(())
    })
    .await;
    assert!(
        waiting.iter().all(|w| !w.is_finished()),
        "a waiting Acquire ended while its partition was held"
    );
    let refused = match read(busy.clone()).await {
        Err(e @ Error::Busy { .. }) => e,
        other => panic!("a third long call on the connection is refused: {other:?}"),
    };
    let details = refused.details().expect("details");
    assert_eq!(details.reason(), Some(&Reason::LimitReached), "{refused}");
    assert_eq!(
        details.metadata("limit"),
        Some("--max-long-calls-per-connection")
    );
    let text = refused.to_string();
    assert!(
        text.contains("--max-long-calls-per-connection")
            && text.contains("limit is 2")
            && text.contains("long calls open"),
        "names the flag, its value and what is at the limit: {text}"
    );
    let listed = tokio::time::timeout(DEADLINE, busy.list_leases(LeaseFilter::new().group(&group)))
        .await
        .expect("a short call on the full connection is answered at once")
        .expect("list");
    assert_eq!(listed.len(), 2);
    match tokio::time::timeout(DEADLINE, read(other.clone())).await {
        Ok(Err(e)) => assert!(
            !matches!(e, Error::Busy { .. }),
            "another connection has its own long calls: {e}"
        ),
        other => panic!("a Read of an ended lease on another connection: {other:?}"),
    }
    waiting[0].abort();
    wait_for(
        "a long call to be admitted once a waiting Acquire ended",
        DEADLINE,
        || async { (!matches!(read(busy.clone()).await, Err(Error::Busy { .. }))).then_some(()) },
    )
    .await;
    waiting[1].abort();
    second.release().await.expect("release");
    again.release().await.expect("release");
}

/// Mirrors limits.rs `an_oversized_request_is_refused_and_the_connection_goes_on`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_request_is_refused_and_the_connection_goes_on() {
    let rig = Rig::one().await;
    let group = unique_name("g");
    let client = rig.client(A).await;
    let huge = proto::AcquireRequest {
        group: group.clone(),
        topic: DEMO_TOPIC.into(),
        member: "m".repeat(2 * 1024 * 1024),
        ..Default::default()
    };
    let refused = client.raw().acquire(huge).await.expect_err("2 MiB request");
    assert_eq!(refused.code(), Code::OutOfRange, "{refused:?}");
    assert!(refused.message().contains("1048576"), "{refused:?}");
    let leases = client
        .list_leases(LeaseFilter::new().group(&group))
        .await
        .expect("the connection still serves");
    assert!(leases.is_empty(), "nothing was acquired: {leases:?}");
    client
        .acquire(AcquireOptions::new(&group, DEMO_TOPIC))
        .await
        .expect("a normal request on the same connection")
        .release()
        .await
        .expect("release");
}

/// Mirrors security.rs `mutual_tls_identities_and_the_policy_decide_who_may_do_what`, with
/// identities from bearer tokens (certificates and TLS stay end to end).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_policy_decides_who_may_do_what_on_either_instance() {
    const APP: &str = "orders-app-token-0123456789";
    const INTRUDER: &str = "intruder-token-0123456789ab";
    const OPS: &str = "ops-token-5f0c1e2d3b4a59687766";
    let policy = format!(
        r#"[[allow]]
identities = ["orders-app"]
groups = ["orders-*"]
topics = ["{DEMO_TOPIC}"]
actions = ["acquire", "read", "seek", "commit", "release", "list"]

[[allow]]
identities = ["intruder"]
groups = ["orders-*"]
topics = ["{DEMO_TOPIC}"]
actions = ["read", "commit"]

[[allow]]
identities = ["ops-bot"]
groups = ["*"]
topics = ["*"]
actions = ["list"]
"#
    );
    let rig = Rig::two()
        .policy(
            &policy,
            &[
                ("orders-app", APP),
                ("intruder", INTRUDER),
                ("ops-bot", OPS),
            ],
        )
        .await;
    let as_who = |instance: usize, token: &'static str| {
        let endpoint = rig.endpoint(instance);
        async move {
            Client::connect(endpoint)
                .await
                .expect("connect")
                .with_bearer_token(token)
                .expect("token")
        }
    };
    let (app_a, app_b) = (as_who(A, APP).await, as_who(B, APP).await);
    let (intruder_a, intruder_b) = (as_who(A, INTRUDER).await, as_who(B, INTRUDER).await);
    let group = unique_name("orders");

    let lease = app_a
        .acquire(AcquireOptions::new(&group, DEMO_TOPIC).partition(0))
        .await
        .expect("orders-app may acquire");
    let lease_id = lease.lease_id().to_string();
    let mut stream = app_a
        .raw()
        .read(read_request(&lease_id, 10))
        .await
        .expect("orders-app may read")
        .into_inner();
    assert_eq!(
        next_response(&mut stream)
            .await
            .records
            .first()
            .map(|r| r.offset),
        Some(0)
    );
    drop(stream);
    lease.commit(5).await.expect("orders-app may commit");

    // A denied action: PERMISSION_DENIED naming the action, group, topic and identity.
    let locks_before = rig.node(A).locks.list(None).await.expect("locks");
    let billing = unique_name("billing");
    let err = app_a
        .acquire(AcquireOptions::new(&billing, DEMO_TOPIC).partition(1))
        .await
        .expect_err("orders-app may not acquire in a billing group");
    assert_eq!(err.code(), Code::PermissionDenied, "{err}");
    assert_eq!(err.reason(), Some(Reason::ActionDenied), "{err}");
    assert_eq!(err.metadata("action"), Some("acquire"));
    assert_eq!(err.metadata("group"), Some(billing.as_str()));
    assert_eq!(err.metadata("topic"), Some(DEMO_TOPIC));
    assert_eq!(err.metadata("identity"), Some("orders-app"));
    assert_eq!(
        rig.node(A).locks.list(None).await.expect("locks").len(),
        locks_before.len()
    );

    // The lease answers only the identity that acquired it, on either instance (B forwards
    // to A with the caller's token).
    for (via, intruder) in [("A", &intruder_a), ("B", &intruder_b)] {
        let status = intruder
            .raw()
            .commit(proto::CommitRequest {
                lease_id: lease_id.clone(),
                offset: 9,
                ..Default::default()
            })
            .await
            .expect_err("another identity's commit");
        assert_eq!(
            reason(&status),
            (Code::PermissionDenied, Some("ACTION_DENIED".into())),
            "via {via}: {status:?}"
        );
        assert!(status.message().contains("another identity"), "{status:?}");
        let status = intruder
            .raw()
            .read(read_request(&lease_id, 0))
            .await
            .expect_err("another identity's read");
        assert_eq!(
            status.code(),
            Code::PermissionDenied,
            "via {via}: {status:?}"
        );
    }
    assert_eq!(
        rig.committed(&group, DEMO_TOPIC, 0).await.map(|c| c.0),
        Some(5),
        "refused commits change nothing"
    );
    // The owner's call through B is forwarded and served.
    app_b
        .raw()
        .commit(proto::CommitRequest {
            lease_id: lease_id.clone(),
            offset: 7,
            ..Default::default()
        })
        .await
        .expect("orders-app commits through B");
    assert_eq!(
        rig.committed(&group, DEMO_TOPIC, 0).await.map(|c| c.0),
        Some(7)
    );

    // Listings show what the identity may see.
    let listed = |client: Client| async move {
        client
            .raw()
            .list_leases(proto::ListLeasesRequest::default())
            .await
            .map(|r| {
                r.into_inner()
                    .leases
                    .into_iter()
                    .map(|l| (l.group, l.partition, l.fencing_token))
                    .collect::<Vec<_>>()
            })
    };
    let ops = as_who(B, OPS).await;
    let seen_by_ops = listed(ops).await.expect("ops-bot may list");
    assert!(
        seen_by_ops.contains(&(group.clone(), 0, lease.fencing_token())),
        "{seen_by_ops:?}"
    );
    assert_eq!(
        listed(intruder_a.clone()).await.expect("an empty listing"),
        Vec::new(),
        "intruder has no list grant: it sees nothing"
    );
    // An unknown token, and no identity at all: UNAUTHENTICATED, the token never shown.
    let wrong = "not-a-known-token-0123456789";
    let status = listed(as_who(A, wrong).await)
        .await
        .expect_err("an unknown token");
    assert_eq!(
        reason(&status),
        (Code::Unauthenticated, Some("NOT_AUTHENTICATED".into()))
    );
    assert!(!status.message().contains(wrong));
    let status = listed(rig.client(A).await).await.expect_err("no identity");
    assert_eq!(
        reason(&status),
        (Code::Unauthenticated, Some("NOT_AUTHENTICATED".into()))
    );
    lease.release().await.expect("release");
}

// ---------------------------------------------------------------------------------------------
// Subscribe

/// A member of a group in a task of its own: counts the leases assigned to it, and commits
/// on `revoking` so a lease moves at once.
struct Member {
    assigned: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Member {
    async fn join(client: &Client, group: &str, topic: &str, id: &str) -> Member {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let mut subscription = client
            .subscribe(SubscribeOptions::new(group, [topic]).member_id(id))
            .await
            .expect("subscribe");
        assert_eq!(subscription.member_id(), id);
        let assigned = std::sync::Arc::new(AtomicUsize::new(0));
        let counter = assigned.clone();
        let task = tokio::spawn(async move {
            let mut next: BTreeMap<String, i64> = BTreeMap::new();
            while let Some(Ok(event)) = subscription.next_event().await {
                match event {
                    SubscriptionEvent::Assigned {
                        partition, offset, ..
                    } => {
                        counter.fetch_add(1, Ordering::SeqCst);
                        next.insert(partition.lease_id().to_string(), offset);
                    }
                    SubscriptionEvent::Records { partition, batch } => {
                        if let Some(offset) = batch.next_offset() {
                            next.insert(partition.lease_id().to_string(), offset);
                        }
                    }
                    SubscriptionEvent::Revoking { partition, .. } => {
                        if let Some(offset) = next.get(partition.lease_id()) {
                            let _ = partition.commit(*offset).await;
                        }
                    }
                    _ => {}
                }
            }
        });
        Member { assigned, task }
    }

    fn assigned(&self) -> usize {
        self.assigned.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The client goes away: its stream is dropped.
    async fn leave(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

/// Waits until ListLeases shows `expected` leases per member id (and nothing else).
async fn settled(client: &Client, group: &str, expected: &[(&str, usize)]) {
    let expected: BTreeMap<String, usize> =
        expected.iter().map(|(m, n)| (m.to_string(), *n)).collect();
    wait_for(
        &format!("the group to settle at {expected:?}"),
        DEADLINE,
        || async {
            let leases = client
                .list_leases(LeaseFilter::new().group(group))
                .await
                .ok()?;
            let mut counts: BTreeMap<String, usize> = BTreeMap::new();
            for lease in &leases {
                *counts
                    .entry(lease.member_id.clone().unwrap_or_default())
                    .or_default() += 1;
            }
            (counts == expected).then_some(())
        },
    )
    .await;
}

/// Waits until the members have been assigned `expected` leases in all; more fails at once.
async fn assigned(members: &[&Member], expected: &[usize]) {
    let counts = || members.iter().map(|m| m.assigned()).collect::<Vec<_>>();
    let reached = wait_for("the assignments", DEADLINE, || async {
        let now = counts();
        (now == expected || now.iter().zip(expected).any(|(n, e)| n > e)).then_some(now)
    })
    .await;
    assert_eq!(reached, expected, "assignments");
}

/// Mirrors subscribe.rs `members_share_a_topic_move_only_what_must_move_and_lose_no_record`
/// (the shares as members join on either instance) and
/// `a_member_whose_client_goes_away_leaves_and_releases_its_leases`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_on_two_instances_share_a_topic_and_leaving_releases_their_leases() {
    let rig = Rig::two().await;
    let topic = rig.create_topic(4);
    let group = unique_name("g");
    let (client_a, client_b) = (rig.client(A).await, rig.client(B).await);
    let m1 = Member::join(&client_a, &group, &topic, "m1").await;
    settled(&client_a, &group, &[("m1", 4)]).await;
    // The events trail the locks ListLeases shows.
    assigned(&[&m1], &[4]).await;
    let m2 = Member::join(&client_b, &group, &topic, "m2").await;
    settled(&client_b, &group, &[("m1", 2), ("m2", 2)]).await;
    assigned(&[&m1, &m2], &[4, 2]).await;
    // The leases are listed through either instance, each served where its member is.
    let listed = client_a
        .list_leases(LeaseFilter::new().group(&group))
        .await
        .expect("list");
    for lease in &listed {
        let serving = match lease.member_id.as_deref() {
            Some("m1") => &rig.node(A).instance,
            _ => &rig.node(B).instance,
        };
        assert_eq!(&lease.gateway, serving, "{lease:?}");
    }
    m1.leave().await;
    settled(&client_b, &group, &[("m2", 4)]).await;
    m2.leave().await;
    settled(&client_a, &group, &[]).await;
}

/// Mirrors subscribe.rs `a_member_id_is_one_live_member_on_any_gateway`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_id_is_one_live_member_on_any_instance() {
    let rig = Rig::two().await;
    let topic = rig.create_topic(2);
    let group = unique_name("g");
    let (client_a, client_b) = (rig.client(A).await, rig.client(B).await);
    let options = || SubscribeOptions::new(&group, [&topic]).member_id("only-one");
    let first = client_a.subscribe(options()).await.expect("the first");
    for (name, client) in [("the same instance", &client_a), ("the other", &client_b)] {
        match client.subscribe(options()).await {
            Err(err @ Error::Other { .. }) => {
                assert_eq!(err.code(), Code::AlreadyExists, "{name}: {err:?}");
                assert_eq!(err.reason(), Some(Reason::MemberActive), "{name}: {err:?}");
                assert_eq!(err.metadata("member_id"), Some("only-one"));
            }
            other => panic!("{name}: a second live member with the same id: {other:?}"),
        }
    }
    // Once the first has left, the id is free again, on either instance.
    drop(first);
    settled(&client_a, &group, &[]).await;
    let again = wait_for("the id to be free", DEADLINE, || async {
        client_b.subscribe(options()).await.ok()
    })
    .await;
    assert_eq!(again.member_id(), "only-one");
}
