//! The resume contract, end to end through the real binary, real Kafka and real Consul: a
//! Read that is reopened after the previous one broke never starts past a record the client
//! did not commit or skip on purpose, `from_offset` starts a Read where the client says, and
//! the Rust client reopens a cut stream by itself with no gap and no repeat.

mod support;

use std::time::Duration;

use futures::StreamExt;
use kafka_lease_client::{proto, AcquireOptions, Client, ReadOptions};
use kafka_lease_testkit::{unique_name, Relay};
use support::{create_topic, produce, producer, unique_prefix, GatewayProcess, TestRecord};
use tonic::Code;

const DEADLINE: Duration = Duration::from_secs(30);

/// Opens a raw Read and returns its first response.
async fn first_response(
    client: &Client,
    lease_id: &str,
    from_offset: Option<i64>,
) -> Result<proto::ReadResponse, tonic::Status> {
    let mut stream = client
        .raw()
        .read(proto::ReadRequest {
            lease_id: lease_id.to_string(),
            max_records: 20,
            from_offset,
            ..Default::default()
        })
        .await?
        .into_inner();
    let first = tokio::time::timeout(DEADLINE, stream.next())
        .await
        .expect("a response within the deadline")
        .expect("the stream stays open")?;
    Ok(first)
}

#[tokio::test]
async fn a_reopened_read_starts_at_the_resume_point_not_after_records_in_flight() {
    let services = kafka_lease_testkit::require_services!();
    let gateway = GatewayProcess::start(&services, &unique_prefix(), &unique_name("gw"), &[]).await;
    let topic = create_topic(&services, 1).await;
    // Enough data that the gateway hands far more to gRPC than the client takes: thousands
    // of records sit in HTTP/2 buffers when the client goes away.
    let records: Vec<TestRecord> = (0..20_000)
        .map(|_| TestRecord::value(vec![b'x'; 1024]))
        .collect();
    produce(&producer(&services), &topic, 0, &records).await;

    let client = gateway.client().await;
    let lease = client
        .acquire(AcquireOptions::new(unique_name("g"), &topic))
        .await
        .expect("acquire");
    assert_eq!(lease.offset(), 0);

    // Take three batches (offsets 0..=59), then cancel the call.
    let mut stream = client
        .raw()
        .read(proto::ReadRequest {
            lease_id: lease.lease_id().to_string(),
            max_records: 20,
            ..Default::default()
        })
        .await
        .expect("read")
        .into_inner();
    let mut last = -1;
    for _ in 0..3 {
        let batch = tokio::time::timeout(DEADLINE, stream.next())
            .await
            .expect("a batch within the deadline")
            .expect("open")
            .expect("batch");
        last = batch.records.last().expect("records").offset;
    }
    assert_eq!(last, 59);
    drop(stream);

    // Nothing committed, no seek: a new Read starts at the Acquire offset, so the records
    // the client never received are delivered again, not skipped.
    let first = first_response(&client, lease.lease_id(), None)
        .await
        .expect("reopened read");
    assert_eq!(
        first.records[0].offset, 0,
        "a reopened Read must start at the resume point (the Acquire offset), not after \
         records that were in flight"
    );

    // A commit moves the resume point.
    lease.commit(60).await.expect("commit");
    let first = first_response(&client, lease.lease_id(), None)
        .await
        .expect("read after commit");
    assert_eq!(first.records[0].offset, 60);

    // from_offset starts where the client says, as a Seek would: with a new epoch.
    let epoch_before = first.seek_epoch;
    let first = first_response(&client, lease.lease_id(), Some(30))
        .await
        .expect("read from 30");
    assert_eq!(first.records[0].offset, 30);
    assert_eq!(first.seek_epoch, epoch_before + 1);
    // ... and that is the resume point now.
    let first = first_response(&client, lease.lease_id(), None)
        .await
        .expect("read after from_offset");
    assert_eq!(first.records[0].offset, 30);

    // A Seek moves it too.
    lease
        .seek(kafka_lease_client::SeekTo::Offset(1000))
        .await
        .expect("seek");
    let first = first_response(&client, lease.lease_id(), None)
        .await
        .expect("read after seek");
    assert_eq!(first.records[0].offset, 1000);

    // A from_offset outside the log is refused with the range, and changes nothing.
    let err = first_response(&client, lease.lease_id(), Some(20_001))
        .await
        .expect_err("past the high watermark");
    assert_eq!(err.code(), Code::OutOfRange, "{err:?}");
    assert!(err.message().contains("20001"), "{}", err.message());
    assert!(err.message().contains("20000"), "{}", err.message());
    let first = first_response(&client, lease.lease_id(), None)
        .await
        .expect("read after the refused one");
    assert_eq!(first.records[0].offset, 1000);

    // The longest metadata the contract allows is stored by Kafka (prefix included).
    lease
        .commit_with_metadata(1000, "m".repeat(4057))
        .await
        .expect("commit with the longest metadata");

    lease.release().await.expect("release");
}

#[tokio::test]
async fn the_client_reopens_a_cut_stream_with_no_gap_and_no_repeat() {
    let services = kafka_lease_testkit::require_services!();
    let gateway = GatewayProcess::start(&services, &unique_prefix(), &unique_name("gw"), &[]).await;
    let topic = create_topic(&services, 1).await;
    // 10,000 records of 512 bytes: after the third cut (3,000 records in) the gateway cannot
    // have sent the rest already (a client takes at most 2 MiB ahead per stream), so each cut
    // needs a reconnection. With 5,000 the rest could sit in the client's buffers, and the
    // last cut then needed none.
    const TOTAL: i64 = 10_000;
    let records: Vec<TestRecord> = (0..TOTAL)
        .map(|i| TestRecord::value(format!("{i:0>512}")))
        .collect();
    produce(&producer(&services), &topic, 0, &records).await;

    let relay = Relay::start(gateway.addr.parse().expect("gateway address"))
        .await
        .expect("relay");
    let client = Client::connect(format!("http://{}", relay.addr()))
        .await
        .expect("connect through the relay");
    let lease = client
        .acquire(AcquireOptions::new(unique_name("g"), &topic))
        .await
        .expect("acquire");
    let mut stream = lease
        .records(ReadOptions::new().max_records(50))
        .await
        .expect("read");

    let mut got: Vec<i64> = Vec::new();
    let mut cuts = 0;
    while (got.len() as i64) < TOTAL {
        let batch = tokio::time::timeout(DEADLINE, stream.next_batch())
            .await
            .expect("a batch within the deadline")
            .expect("the stream stays open")
            .expect("no error reaches the caller: the stream reopens itself");
        got.extend(batch.records.iter().map(|r| r.offset));
        // Cut the connection three times while records are in flight, each time only once
        // the client has reconnected since the previous cut: records it had buffered before
        // a cut (up to 2 MiB) can carry it past the next 1,000 before it reconnects, and a
        // cut then would find no connection to cut.
        if cuts < 3 && got.len() as i64 >= (cuts + 1) * 1000 && relay.accepted() > cuts as u64 {
            relay.cut();
            cuts += 1;
        }
    }
    assert_eq!(cuts, 3);
    assert_eq!(
        got,
        (0..TOTAL).collect::<Vec<_>>(),
        "every record exactly once, in order, across the cuts"
    );
    assert!(
        relay.accepted() >= 4,
        "the client reconnected after each cut ({} connections)",
        relay.accepted()
    );
    drop(stream);
    lease.release().await.expect("release");
}

/// A reopen that names the epoch of its last record does not undo a Seek that reached the
/// gateway first: the Read starts where the Seek put the lease. At the epoch it names, the
/// reopen repositions as asked.
#[tokio::test]
async fn a_reopen_of_an_epoch_a_seek_has_left_starts_where_the_seek_put_the_lease() {
    let services = kafka_lease_testkit::require_services!();
    let gateway = GatewayProcess::start(&services, &unique_prefix(), &unique_name("gw"), &[]).await;
    let topic = create_topic(&services, 1).await;
    let records: Vec<TestRecord> = (0..100)
        .map(|i| TestRecord::value(format!("v{i}")))
        .collect();
    produce(&producer(&services), &topic, 0, &records).await;
    let client = gateway.client().await;
    let lease = client
        .acquire(AcquireOptions::new(unique_name("g"), &topic))
        .await
        .expect("acquire");
    let read = |from_offset: i64, if_seek_epoch: u64| proto::ReadRequest {
        lease_id: lease.lease_id().to_string(),
        max_records: 5,
        from_offset: Some(from_offset),
        if_seek_epoch: Some(if_seek_epoch),
        ..Default::default()
    };
    let first = |request| {
        let mut raw = client.raw();
        async move {
            let mut stream = raw.read(request).await.expect("read").into_inner();
            tokio::time::timeout(DEADLINE, stream.next())
                .await
                .expect("a batch in time")
                .expect("open")
                .expect("a batch")
        }
    };
    // Epoch 0: the caller has read up to 9; its Seek to 50 lands first (epoch 1).
    let seek = client
        .raw()
        .seek(proto::SeekRequest {
            lease_id: lease.lease_id().to_string(),
            position: Some(proto::seek_request::Position::Offset(50)),
        })
        .await
        .expect("seek")
        .into_inner();
    assert_eq!(seek.seek_epoch, 1);
    let late = first(read(10, 0)).await;
    assert_eq!(
        (late.seek_epoch, late.records[0].offset),
        (1, 50),
        "the reopen of epoch 0 did not undo the Seek"
    );
    let current = first(read(60, 1)).await;
    assert_eq!((current.seek_epoch, current.records[0].offset), (2, 60));
}
