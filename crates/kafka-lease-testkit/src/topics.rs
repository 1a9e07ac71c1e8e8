//! Topics on the real test broker: created, then waited for until the broker's metadata lists
//! every partition with a leader (CreateTopics answers when the controller has the topic; the
//! broker's metadata cache follows a moment later, and a client that asks in between is told
//! the topic does not exist). Shared by the end-to-end tests and the benchmark.

use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewPartitions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::ClientConfig;

use crate::wait_for_result;

/// How long a new topic may take to appear with leaders for every partition.
const TOPIC_DEADLINE: Duration = Duration::from_secs(60);
/// Partitions created by one request at most: a KRaft controller refuses a request that
/// makes more than 10,000 metadata records (one per partition, plus the topic's), with
/// POLICY_VIOLATION. Larger topics are created in steps.
const PARTITIONS_PER_REQUEST: i32 = 5_000;

/// Deletes `topics` from the broker at `bootstrap` (a topic already gone is not an error).
pub async fn delete_topics(bootstrap: &str, topics: &[&str]) -> Result<(), String> {
    if topics.is_empty() {
        return Ok(());
    }
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .map_err(|e| format!("admin client: {e}"))?;
    let options = AdminOptions::new().operation_timeout(Some(TOPIC_DEADLINE));
    let results = admin
        .delete_topics(topics, &options)
        .await
        .map_err(|e| format!("deleting topics {topics:?}: {e}"))?;
    for result in results {
        match result {
            Ok(_) | Err((_, rdkafka::types::RDKafkaErrorCode::UnknownTopicOrPartition)) => {}
            Err((t, e)) => return Err(format!("deleting topic {t}: {e}")),
        }
    }
    Ok(())
}

/// Creates `topic` with `partitions` partitions (replication factor 1) on the broker at
/// `bootstrap`, and waits until its metadata lists every partition with a leader.
pub async fn create_topic(bootstrap: &str, topic: &str, partitions: i32) -> Result<(), String> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .map_err(|e| format!("admin client: {e}"))?;
    let options = AdminOptions::new().operation_timeout(Some(TOPIC_DEADLINE));
    let first = partitions.min(PARTITIONS_PER_REQUEST);
    let results = admin
        .create_topics(
            &[NewTopic::new(topic, first, TopicReplication::Fixed(1))],
            &options,
        )
        .await
        .map_err(|e| format!("creating topic {topic}: {e}"))?;
    for result in results {
        result.map_err(|(t, e)| format!("creating topic {t}: {e}"))?;
    }
    let mut created = first;
    while created < partitions {
        let next = (created + PARTITIONS_PER_REQUEST).min(partitions);
        let results = admin
            .create_partitions(&[NewPartitions::new(topic, next as usize)], &options)
            .await
            .map_err(|e| format!("growing topic {topic} to {next} partitions: {e}"))?;
        for result in results {
            result.map_err(|(t, e)| format!("growing topic {t} to {next} partitions: {e}"))?;
        }
        created = next;
    }
    let metadata: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .map_err(|e| format!("metadata client: {e}"))?;
    wait_for_result(
        &format!("topic {topic} to list {partitions} partitions with leaders"),
        TOPIC_DEADLINE,
        || {
            let ready = metadata
                .fetch_metadata(Some(topic), Duration::from_secs(5))
                .ok()
                .is_some_and(|m| {
                    m.topics().iter().any(|t| {
                        t.name() == topic
                            && t.error().is_none()
                            && t.partitions().len() == partitions as usize
                            && t.partitions().iter().all(|p| p.leader() >= 0)
                    })
                });
            async move { ready.then_some(()) }
        },
    )
    .await
}
