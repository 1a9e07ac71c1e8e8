//! The Prometheus endpoint of a real gateway during a real acquire / read / seek / commit /
//! release cycle: the counters, gauges and histograms move as the cycle goes, with the
//! labels documented in docs/OPERATIONS.md.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use kafka_lease_client::{proto, AcquireOptions, SeekTo};
use kafka_lease_testkit::{unique_name, wait_for};
use support::GatewayProcess;
use support::{create_topic, metric_value as value, produce_n, producer, scrape, unique_prefix};

const DEADLINE: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_follow_a_lease_through_its_life() {
    let services = kafka_lease_testkit::require_services!();
    let topic = create_topic(&services, 2).await;
    let group = unique_name("metrics");
    let gateway = GatewayProcess::start(
        &services,
        &unique_prefix(),
        &unique_name("gw"),
        &["--metrics-listen", "127.0.0.1:0"],
    )
    .await;
    let endpoint = gateway.metrics_endpoint();
    let g = group.as_str();
    let t = topic.as_str();

    let before = scrape(&endpoint).await;
    assert_eq!(value(&before, "kafka_lease_leases", &[("group", g)]), 0.0);
    let granted_before = value(&before, "kafka_lease_leases_granted_total", &[]);

    produce_n(&producer(&services), &topic, 0, 20).await;
    let client = gateway.client().await;
    let lease = client
        .acquire(AcquireOptions::new(g, t).partition(0))
        .await
        .expect("acquire");
    let s = scrape(&endpoint).await;
    assert_eq!(
        value(&s, "kafka_lease_leases", &[("group", g), ("topic", t)]),
        1.0
    );
    assert_eq!(
        value(&s, "kafka_lease_leases_granted_total", &[]),
        granted_before + 1.0
    );
    assert!(
        value(
            &s,
            "kafka_lease_request_duration_seconds_count",
            &[("method", "Acquire"), ("outcome", "ok")]
        ) >= 1.0
    );
    assert!(
        value(
            &s,
            "kafka_lease_grpc_requests_total",
            &[("method", "Acquire"), ("code", "OK")]
        ) >= 1.0
    );
    let lease_labels = [("group", g), ("topic", t), ("partition", "0")];
    assert_eq!(value(&s, "kafka_lease_lease_position", &lease_labels), 0.0);

    // Read all 20: delivered records and bytes, the position and the lag follow.
    let mut stream = client
        .raw()
        .read(proto::ReadRequest {
            lease_id: lease.lease_id().to_string(),
            max_records: 100,
            ..Default::default()
        })
        .await
        .expect("read")
        .into_inner();
    let mut read = 0;
    let mut bytes = 0usize;
    while read < 20 {
        let batch = tokio::time::timeout(DEADLINE, stream.next())
            .await
            .expect("a batch in time")
            .expect("open")
            .expect("batch");
        read += batch.records.len();
        // Each record as encoded in the response: its field tag, length and message.
        bytes += batch
            .records
            .iter()
            .map(|r| {
                let len = prost::Message::encoded_len(r);
                1 + prost::length_delimiter_len(len) + len
            })
            .sum::<usize>();
    }
    let s = wait_for("the position to reach 20", DEADLINE, || async {
        let s = scrape(&endpoint).await;
        (value(&s, "kafka_lease_lease_position", &lease_labels) == 20.0).then_some(s)
    })
    .await;
    assert_eq!(
        value(
            &s,
            "kafka_lease_records_delivered_total",
            &[("group", g), ("topic", t)]
        ),
        20.0
    );
    assert_eq!(
        value(
            &s,
            "kafka_lease_bytes_delivered_total",
            &[("group", g), ("topic", t)]
        ),
        bytes as f64
    );
    assert_eq!(value(&s, "kafka_lease_lease_read_lag", &lease_labels), 0.0);

    // The Read ends and more records come: with nothing committed, the next Read starts at
    // the Acquire offset again, so the position shows 0 and the read lag all 25 records.
    drop(stream);
    produce_n(&producer(&services), &topic, 0, 5).await;
    wait_for("the read lag to show 25 records", DEADLINE, || async {
        let s = scrape(&endpoint).await;
        (value(&s, "kafka_lease_lease_read_lag", &lease_labels) == 25.0
            && value(&s, "kafka_lease_lease_position", &lease_labels) == 0.0)
            .then_some(())
    })
    .await;

    // Commit and seek: the committed offset, and the histograms by outcome.
    lease.commit(20).await.expect("commit");
    lease.seek(SeekTo::Offset(10)).await.expect("seek");
    let err = lease
        .seek(SeekTo::Offset(1_000))
        .await
        .expect_err("beyond the high watermark");
    assert_eq!(err.code(), tonic::Code::OutOfRange);
    let s = scrape(&endpoint).await;
    assert_eq!(
        value(&s, "kafka_lease_lease_committed_offset", &lease_labels),
        20.0
    );
    assert_eq!(value(&s, "kafka_lease_lease_position", &lease_labels), 10.0);
    assert_eq!(
        value(
            &s,
            "kafka_lease_request_duration_seconds_count",
            &[("method", "Commit"), ("outcome", "ok")]
        ),
        1.0
    );
    assert_eq!(
        value(
            &s,
            "kafka_lease_request_duration_seconds_count",
            &[("method", "Seek"), ("outcome", "OFFSET_OUT_OF_RANGE")]
        ),
        1.0
    );
    assert_eq!(
        value(
            &s,
            "kafka_lease_grpc_requests_total",
            &[("method", "Seek"), ("code", "OUT_OF_RANGE")]
        ),
        1.0
    );
    assert!(
        value(&s, "kafka_lease_consul_renew_duration_seconds_count", &[]) >= 1.0,
        "the Consul session renews are timed"
    );
    assert!(value(&s, "kafka_lease_consul_sessions_created_total", &[]) >= 1.0);
    // The session's TTL check has been passed all along: the counter is served, and zero.
    assert!(
        s.contains_key("kafka_lease_consul_check_pass_failures_total"),
        "the TTL check's pass failures are counted"
    );
    assert_eq!(
        value(&s, "kafka_lease_consul_check_pass_failures_total", &[]),
        0.0
    );

    // Release: no lease left for the group, one ended as released.
    let ended_before = value(
        &s,
        "kafka_lease_leases_ended_total",
        &[("reason", "released")],
    );
    lease.release().await.expect("release");
    let s = scrape(&endpoint).await;
    assert_eq!(
        value(&s, "kafka_lease_leases", &[("group", g), ("topic", t)]),
        0.0
    );
    assert_eq!(
        value(
            &s,
            "kafka_lease_leases_ended_total",
            &[("reason", "released")]
        ),
        ended_before + 1.0
    );

    // A failed Acquire is counted with its reason; no lease id is ever a label.
    let missing = unique_name("no-such-topic");
    client
        .acquire(AcquireOptions::new(g, &missing).retries(0))
        .await
        .expect_err("no such topic");
    let s = scrape(&endpoint).await;
    assert_eq!(
        value(
            &s,
            "kafka_lease_request_duration_seconds_count",
            &[("method", "Acquire"), ("outcome", "TOPIC_NOT_FOUND")]
        ),
        1.0
    );
    assert!(s.keys().all(|series| !series.contains("lease_id")));

    // The dashboard in deploy/ reads only series the gateway serves and docs/OPERATIONS.md lists.
    let dashboard = std::fs::read_to_string(
        kafka_lease_testkit::repo_root().join("deploy/grafana/kafka-lease.json"),
    )
    .expect("the dashboard");
    let readme =
        std::fs::read_to_string(kafka_lease_testkit::repo_root().join("docs/OPERATIONS.md"))
            .expect("docs/OPERATIONS.md");
    let served: std::collections::BTreeSet<&str> = s
        .keys()
        .map(|series| series.split('{').next().unwrap_or_default())
        .collect();
    let mut used = std::collections::BTreeSet::new();
    for (i, _) in dashboard.match_indices("kafka_lease_") {
        let name: String = dashboard[i..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || *c == '_')
            .collect();
        used.insert(name);
    }
    assert!(used.len() >= 10, "{used:?}");
    for name in &used {
        let base = name.strip_suffix("_bucket").unwrap_or(name);
        assert!(
            readme.contains(&format!("`{base}`")),
            "{base} is not in docs/OPERATIONS.md"
        );
        // The error counters appear with their first error, labelled by its operation.
        let on_error = base.ends_with("_errors_total");
        assert!(
            on_error || served.contains(name.as_str()),
            "the dashboard reads {name}, which the gateway does not serve: {served:?}"
        );
    }
    assert!(
        !gateway.log().contains('\u{1b}'),
        "no colour codes in a log file"
    );
}

/// The lag an operator alerts on is Kafka's (high watermark less the group's committed
/// offset), not the gateway's read position: a client that took one batch of 25 out of 60
/// records and committed 25 has 35 to go, whatever the gateway has written into the stream's
/// transport buffers; and once its Read ends, the position shown is where the next Read
/// starts. The scrape and ListLeases agree with Kafka's own group offsets at each step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lag_is_kafkas_and_the_position_is_where_the_next_read_starts() {
    let services = kafka_lease_testkit::require_services!();
    let topic = create_topic(&services, 1).await;
    let group = unique_name("lag");
    let gateway = GatewayProcess::start(
        &services,
        &unique_prefix(),
        &unique_name("gw"),
        &["--metrics-listen", "127.0.0.1:0"],
    )
    .await;
    let endpoint = gateway.metrics_endpoint();
    let (g, t) = (group.as_str(), topic.as_str());
    let labels = [("group", g), ("topic", t), ("partition", "0")];
    let has = |s: &BTreeMap<String, f64>, name: &str| {
        s.keys().any(|series| {
            series.starts_with(&format!("{name}{{"))
                && labels
                    .iter()
                    .all(|(k, v)| series.contains(&format!("{k}=\"{v}\"")))
        })
    };
    // Kafka's own view: the group's committed offset and the partition's high watermark.
    let kafka_lag = || {
        let committed = support::kafka_committed(&services, g, t, 0).map(|(o, _)| o);
        let consumer: rdkafka::consumer::BaseConsumer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", &services.kafka_bootstrap)
            .create()
            .expect("consumer");
        let (_, high) =
            rdkafka::consumer::Consumer::fetch_watermarks(&consumer, t, 0, Duration::from_secs(10))
                .expect("watermarks");
        committed.map(|c| high - c)
    };
    let listed = |client: kafka_lease_client::Client| async move {
        let leases = client
            .list_leases(kafka_lease_client::LeaseFilter::new().group(g))
            .await
            .expect("list");
        assert_eq!(leases.len(), 1, "{leases:?}");
        let l = leases.into_iter().next().expect("one");
        (l.position, l.lag, l.read_lag)
    };

    produce_n(&producer(&services), &topic, 0, 60).await;
    let client = gateway.client().await;
    let lease = client
        .acquire(AcquireOptions::new(g, t).partition(0))
        .await
        .expect("acquire");
    let mut stream = client
        .raw()
        .read(proto::ReadRequest {
            lease_id: lease.lease_id().to_string(),
            max_records: 25,
            ..Default::default()
        })
        .await
        .expect("read")
        .into_inner();
    let first = tokio::time::timeout(DEADLINE, stream.next())
        .await
        .expect("a batch in time")
        .expect("open")
        .expect("batch");
    assert_eq!(
        first.records.iter().map(|r| r.offset).collect::<Vec<_>>(),
        (0..25).collect::<Vec<_>>()
    );

    // After the first batch, before any commit: the gateway has handed every record to the
    // stream (read position 60, read lag 0); the group has no committed offset, so no lag
    // (Kafka's tools show "-").
    let s = wait_for("the read position to reach 60", DEADLINE, || async {
        let s = scrape(&endpoint).await;
        (value(&s, "kafka_lease_lease_position", &labels) == 60.0).then_some(s)
    })
    .await;
    assert_eq!(value(&s, "kafka_lease_lease_read_lag", &labels), 0.0);
    assert!(!has(&s, "kafka_lease_lease_lag"), "no lag before a commit");
    assert_eq!(kafka_lag(), None);
    assert_eq!(listed(client.clone()).await, (Some(60), None, Some(0)));
    assert_eq!(
        value(
            &s,
            "kafka_lease_records_delivered_total",
            &[("group", g), ("topic", t)]
        ),
        60.0,
        "delivered counts what was handed to the stream, not what the client took"
    );

    // After the commit of 25: the lag is Kafka's, 35, while the read lag stays 0.
    lease.commit(25).await.expect("commit");
    let s = scrape(&endpoint).await;
    assert_eq!(value(&s, "kafka_lease_lease_lag", &labels), 35.0);
    assert_eq!(
        value(&s, "kafka_lease_lease_committed_offset", &labels),
        25.0
    );
    assert_eq!(value(&s, "kafka_lease_lease_read_lag", &labels), 0.0);
    assert_eq!(kafka_lag(), Some(35));
    assert_eq!(listed(client.clone()).await, (Some(60), Some(35), Some(0)));

    // After the Read ends: the position is where the next Read starts, the resume point 25.
    drop(stream);
    let s = wait_for(
        "the position to show the resume point",
        DEADLINE,
        || async {
            let s = scrape(&endpoint).await;
            (value(&s, "kafka_lease_lease_position", &labels) == 25.0).then_some(s)
        },
    )
    .await;
    assert_eq!(value(&s, "kafka_lease_lease_lag", &labels), 35.0);
    assert_eq!(value(&s, "kafka_lease_lease_read_lag", &labels), 35.0);
    assert_eq!(kafka_lag(), Some(35));
    assert_eq!(listed(client.clone()).await, (Some(25), Some(35), Some(35)));
    let next = client
        .raw()
        .read(proto::ReadRequest {
            lease_id: lease.lease_id().to_string(),
            max_records: 25,
            ..Default::default()
        })
        .await
        .expect("read")
        .into_inner()
        .next()
        .await
        .expect("open")
        .expect("batch");
    assert_eq!(next.records[0].offset, 25, "the next Read starts there");
    lease.release().await.expect("release");
}
