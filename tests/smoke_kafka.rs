//! Proves the Kafka that `scripts/services up` starts is a real broker: topic creation
//! through the admin API, produce with keys and headers, read back by assigned partition,
//! and a group offset commit read back through the broker's offset fetch.

use std::time::Duration;

use kafka_lease_testkit::unique_name;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

const PARTITIONS: i32 = 3;
const PER_PARTITION: i64 = 5;

#[tokio::test]
async fn real_kafka_creates_topics_produces_reads_and_commits() {
    let services = kafka_lease_testkit::require_services!();
    let topic = unique_name("smoke");
    let group = unique_name("smoke-group");

    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &services.kafka_bootstrap)
        .create()
        .expect("admin client");
    let created = admin
        .create_topics(
            &[NewTopic::new(
                &topic,
                PARTITIONS,
                TopicReplication::Fixed(1),
            )],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await
        .expect("create_topics request");
    assert!(
        matches!(created.as_slice(), [Ok(name)] if name == &topic),
        "{created:?}"
    );

    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &services.kafka_bootstrap)
        .set("linger.ms", "0")
        .create()
        .expect("producer");
    for partition in 0..PARTITIONS {
        for i in 0..PER_PARTITION {
            let key = format!("k{partition}-{i}");
            let value = format!("v{partition}-{i}");
            let headers = OwnedHeaders::new()
                .insert(Header {
                    key: "index",
                    value: Some(&i.to_string()),
                })
                .insert(Header {
                    key: "dup",
                    value: Some("a"),
                })
                .insert(Header {
                    key: "dup",
                    value: Some("b"),
                });
            producer
                .send(
                    FutureRecord::to(&topic)
                        .partition(partition)
                        .key(&key)
                        .payload(&value)
                        .headers(headers),
                    Duration::from_secs(10),
                )
                .await
                .map_err(|(e, _)| e)
                .expect("produce");
        }
    }

    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &services.kafka_bootstrap)
        .set("group.id", &group)
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    // Partition 1 alone, assigned (not subscribed), the way the gateway reads.
    let mut assignment = TopicPartitionList::new();
    assignment
        .add_partition_offset(&topic, 1, Offset::Beginning)
        .expect("assignment");
    consumer.assign(&assignment).expect("assign");
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while seen.len() < PER_PARTITION as usize && tokio::time::Instant::now() < deadline {
        if let Some(message) = consumer.poll(Duration::from_millis(200)) {
            let message = message.expect("fetch");
            assert_eq!(message.partition(), 1);
            let headers = message.headers().expect("headers survive");
            let pairs: Vec<(String, String)> = headers
                .iter()
                .map(|h| {
                    (
                        h.key.to_string(),
                        String::from_utf8_lossy(h.value.unwrap_or_default()).into(),
                    )
                })
                .collect();
            seen.push((
                message.offset(),
                String::from_utf8_lossy(message.key().unwrap_or_default()).to_string(),
                String::from_utf8_lossy(message.payload().unwrap_or_default()).to_string(),
                pairs,
            ));
        }
    }
    assert_eq!(seen.len(), PER_PARTITION as usize, "read back {seen:?}");
    for (i, (offset, key, value, headers)) in seen.iter().enumerate() {
        assert_eq!(*offset, i as i64);
        assert_eq!(key, &format!("k1-{i}"));
        assert_eq!(value, &format!("v1-{i}"));
        let expected: Vec<(String, String)> = vec![
            ("index".into(), i.to_string()),
            ("dup".into(), "a".into()),
            ("dup".into(), "b".into()),
        ];
        assert_eq!(headers, &expected, "header order and duplicates are kept");
    }

    // Commit offset 3 for partition 1 with metadata and read it back from the coordinator.
    let mut commit = TopicPartitionList::new();
    commit
        .add_partition_offset(&topic, 1, Offset::Offset(3))
        .expect("commit list");
    commit
        .find_partition(&topic, 1)
        .expect("entry")
        .set_metadata("smoke");
    consumer.commit(&commit, CommitMode::Sync).expect("commit");
    let mut query = TopicPartitionList::new();
    query.add_partition(&topic, 1);
    query.add_partition(&topic, 2);
    let committed = consumer
        .committed_offsets(query, Duration::from_secs(10))
        .expect("offset fetch");
    let p1 = committed.find_partition(&topic, 1).expect("p1");
    assert_eq!(p1.offset(), Offset::Offset(3));
    assert_eq!(p1.metadata(), "smoke");
    let p2 = committed.find_partition(&topic, 2).expect("p2");
    assert_eq!(
        p2.offset(),
        Offset::Invalid,
        "nothing committed for partition 2"
    );

    admin
        .delete_topics(&[&topic], &AdminOptions::new())
        .await
        .expect("delete topic");
}
