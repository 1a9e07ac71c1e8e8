//! Reads are read_committed: a record of an aborted transaction never reaches a reader (a
//! Read, `kafka-lease tail`, queue mode's deliveries); the offsets such records and the
//! transactions' markers take are gaps; and a reader of a partition whose last offset is a
//! transaction marker still reaches its end, and commits it.

mod support;

use std::time::Duration;

use kafka_lease_client::{
    AckOutcome, AcquireOptions, LeaseFilter, Ordering, QueueOptions, ReadOptions,
};
use kafka_lease_testkit::{unique_name, Services};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::ClientConfig;
use support::{create_topic, kafka_committed, unique_prefix, GatewayProcess};

const DEADLINE: Duration = Duration::from_secs(30);

/// The values and offsets of the records of committed transactions.
struct Written {
    committed: Vec<(i64, String)>,
    high_watermark: i64,
}

/// Writes to partition 0 of `topic`, with one transactional producer: 5 records committed,
/// 5 aborted, 5 committed. Each transaction ends with a marker, which takes an offset: the
/// committed records are at 0..=4 and 12..=16, the aborted ones at 6..=10, the markers at 5,
/// 11 and 17, and the high watermark is 18.
async fn write_transactions(services: &Services, topic: &str) -> Written {
    let (services, topic) = (services.clone(), topic.to_string());
    tokio::task::spawn_blocking(move || {
        let producer: FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", &services.kafka_bootstrap)
            .set("transactional.id", unique_name("txn"))
            .create()
            .expect("transactional producer");
        producer
            .init_transactions(DEADLINE)
            .expect("init_transactions");
        let mut committed = Vec::new();
        for (name, commit) in [("c", true), ("a", false), ("d", true)] {
            producer.begin_transaction().expect("begin");
            for i in 0..5 {
                let value = format!("{name}{i}");
                let offset = futures::executor::block_on(
                    producer.send(
                        FutureRecord::<(), _>::to(&topic)
                            .partition(0)
                            .payload(&value),
                        DEADLINE,
                    ),
                )
                .map_err(|(e, _)| e)
                .expect("send")
                .offset;
                if commit {
                    committed.push((offset, value));
                }
            }
            if commit {
                producer.commit_transaction(DEADLINE).expect("commit");
            } else {
                producer.abort_transaction(DEADLINE).expect("abort");
            }
        }
        Written {
            committed,
            high_watermark: 18,
        }
    })
    .await
    .expect("writer")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_sees_only_committed_records_and_reaches_the_end_past_the_last_marker() {
    let services = kafka_lease_testkit::require_services!();
    let gateway = GatewayProcess::start(&services, &unique_prefix(), &unique_name("gw"), &[]).await;
    let topic = create_topic(&services, 1).await;
    let written = write_transactions(&services, &topic).await;
    let offsets: Vec<i64> = written.committed.iter().map(|(o, _)| *o).collect();
    assert_eq!(
        offsets,
        [0, 1, 2, 3, 4, 12, 13, 14, 15, 16],
        "the layout the test expects"
    );

    let client = gateway.client().await;
    let group = unique_name("g");
    let lease = client
        .acquire(AcquireOptions::new(&group, &topic).partition(0))
        .await
        .expect("acquire");
    assert_eq!(lease.high_watermark(), written.high_watermark);
    let mut stream = lease
        .records(ReadOptions::new().max_wait(Duration::from_millis(100)))
        .await
        .expect("read");
    let mut got = Vec::new();
    let mut next = 0;
    while got.len() < written.committed.len() {
        let batch = tokio::time::timeout(DEADLINE, stream.next_batch())
            .await
            .expect("a batch in time")
            .expect("open")
            .expect("batch");
        for record in &batch.records {
            let value = String::from_utf8_lossy(record.value.as_deref().unwrap_or_default());
            got.push((record.offset, value.into_owned()));
        }
        next = batch.next_offset().expect("never empty");
    }
    assert_eq!(got, written.committed, "no aborted record, none missing");
    // Nothing more comes: the marker at 17 is no record.
    let more = tokio::time::timeout(Duration::from_secs(1), stream.next_batch()).await;
    assert!(
        more.is_err(),
        "nothing after the last committed record: {more:?}"
    );
    drop(stream);
    // The batch's next offset passes the marker at 17: committed, nothing is left to read.
    assert_eq!(
        next, written.high_watermark,
        "the next offset passes the last marker"
    );
    lease.commit(next).await.expect("commit");
    let leases = client
        .list_leases(LeaseFilter::default().group(&group))
        .await
        .expect("list");
    println!(
        "next offset after the last record {next}; high watermark {}; ListLeases {:?}",
        written.high_watermark, leases[0]
    );
    assert_eq!(leases[0].lag, Some(0), "{:?}", leases[0]);
    lease.release().await.expect("release");
}

/// `kafka-lease tail -e` ends at the end of a partition whose last offset is a transaction's
/// marker, having printed the committed records, and commits past the marker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tail_exit_at_end_ends_at_a_partition_that_ends_with_a_marker() {
    let services = kafka_lease_testkit::require_services!();
    let gateway = GatewayProcess::start(&services, &unique_prefix(), &unique_name("gw"), &[]).await;
    let topic = create_topic(&services, 1).await;
    let written = write_transactions(&services, &topic).await;
    let group = unique_name("tail");
    let run = tokio::process::Command::new(env!("CARGO_BIN_EXE_kafka-lease"))
        .args([
            "tail",
            "--gateway",
            &gateway.endpoint(),
            "--group",
            &group,
            "--topic",
            &topic,
            "--from",
            "earliest",
            "-e",
            "--commit-on-exit",
        ])
        .env_remove("KAFKA_LEASE_GATEWAY")
        .env_remove("KAFKA_LEASE_TOKEN_FILE")
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(DEADLINE, run)
        .await
        .expect("tail -e ends")
        .expect("run tail");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    let values: Vec<&str> = stdout
        .lines()
        .map(|line| line.rsplit('\t').nth(1).unwrap_or_default())
        .collect();
    let expected: Vec<&str> = written.committed.iter().map(|(_, v)| v.as_str()).collect();
    assert_eq!(values, expected, "{stdout}");
    assert!(
        stderr.contains("reached the end of the partition"),
        "{stderr}"
    );
    assert_eq!(
        kafka_committed(&services, &group, &topic, 0).map(|c| c.0),
        Some(written.high_watermark),
        "{stderr}"
    );
}

/// Queue mode hands out the committed records only, and its progress reaches the end of the
/// partition: the committed offset passes the markers and the aborted records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_mode_delivers_only_committed_records_and_commits_past_the_gaps() {
    let services = kafka_lease_testkit::require_services!();
    let gateway = GatewayProcess::start(&services, &unique_prefix(), &unique_name("gw"), &[]).await;
    let topic = create_topic(&services, 1).await;
    let dead_letters = create_topic(&services, 1).await;
    let written = write_transactions(&services, &topic).await;
    let client = gateway.client().await;
    let group = unique_name("g");
    let lease = client
        .acquire(AcquireOptions::new(&group, &topic).partition(0))
        .await
        .expect("acquire");
    let mut deliveries = lease
        .deliveries(
            QueueOptions::new()
                .ordering(Ordering::Unordered)
                .dead_letter_topic(dead_letters),
        )
        .await
        .expect("deliver");
    let mut got = Vec::new();
    while got.len() < written.committed.len() {
        let delivery = tokio::time::timeout(DEADLINE, deliveries.next())
            .await
            .expect("a delivery in time")
            .expect("open")
            .expect("delivery");
        let value = delivery.record.value.clone().unwrap_or_default();
        got.push((
            delivery.offset(),
            String::from_utf8_lossy(&value).into_owned(),
        ));
        assert_eq!(
            delivery.accept().await.expect("accept"),
            AckOutcome::Applied
        );
    }
    got.sort();
    assert_eq!(got, written.committed, "no aborted record, none missing");
    drop(deliveries);
    lease.release().await.expect("release");
    let stored = kafka_committed(&services, &group, &topic, 0);
    println!("committed after Release: {stored:?}");
    let committed = stored.map(|c| c.0);
    // Past the aborted records and every marker, the last one (17) included: nothing is
    // left for the next holder to deliver, and the progress has no hole left to carry.
    assert_eq!(
        committed,
        Some(written.high_watermark),
        "the progress passes the aborted records and the markers"
    );
}

/// A partition whose last offset is a transaction's marker is caught up once its last
/// record is taken: the Read sends its batch at once instead of waiting out `max_wait` for
/// records that would first have to be produced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_at_the_end_of_a_transactional_partition_does_not_wait_out_max_wait() {
    let services = kafka_lease_testkit::require_services!();
    let gateway = GatewayProcess::start(&services, &unique_prefix(), &unique_name("gw"), &[]).await;
    let topic = create_topic(&services, 1).await;
    let written = write_transactions(&services, &topic).await;
    let client = gateway.client().await;
    let lease = client
        .acquire(AcquireOptions::new(unique_name("g"), &topic).partition(0))
        .await
        .expect("acquire");
    let max_wait = Duration::from_secs(5);
    let started = tokio::time::Instant::now();
    let mut stream = lease
        .records(ReadOptions::new().max_wait(max_wait))
        .await
        .expect("read");
    let mut got = 0;
    while got < written.committed.len() {
        let batch = tokio::time::timeout(DEADLINE, stream.next_batch())
            .await
            .expect("a batch in time")
            .expect("open")
            .expect("batch");
        got += batch.records.len();
    }
    let took = started.elapsed();
    println!("all {got} committed records in {took:?} (max_wait {max_wait:?})");
    assert!(
        took < Duration::from_secs(2),
        "the last batch waited {took:?}, as if more records were on their way"
    );
    drop(stream);
    lease.release().await.expect("release");
}
