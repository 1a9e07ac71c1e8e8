//! [`Kafka`]: the metadata client (partition counts, watermarks, offsets by time, ping), the
//! cache of group clients with its idle closer, and the metadata client's event pump.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::{Offset, TopicPartitionList};

use super::dead_letters::DeadLetters;
use super::errors::{blocking, retrying, unavailable, Failure};
use super::group::{offsets_by_partition, FetchClaim, GroupClient};
use super::settings::{ClientLog, KafkaSettings, PARTITION_COUNT_MAX_AGE};
use crate::error::LeaseError;

/// How long a group's client stays open after its last lease ended, so the next Acquire in
/// the group does not pay for a new client and a coordinator lookup (tens of ms).
const IDLE_GROUP_CLIENT: Duration = Duration::from_secs(60);

/// The one topic the health ping asks about (see [`Kafka::ping_answer`]).
const PING_TOPIC: &str = "__consumer_offsets";

/// A group client, when it was made, and since when no lease uses it.
struct CachedGroup {
    client: Arc<GroupClient>,
    /// The order clients were made in (see [`Kafka::fetcher`]).
    made: u64,
    idle_since: Option<tokio::time::Instant>,
}

/// The gateway's Kafka clients: one metadata client, and one [`GroupClient`] per group that
/// has leases on this instance (kept for [`IDLE_GROUP_CLIENT`] after its last lease), which
/// stores that group's offsets and fetches partitions for any group ([`Kafka::fetcher`]).
#[derive(Clone)]
pub struct Kafka {
    settings: Arc<KafkaSettings>,
    metadata: Arc<BaseConsumer<ClientLog>>,
    groups: Arc<Mutex<HashMap<String, CachedGroup>>>,
    /// Group clients made so far (see [`CachedGroup::made`]).
    clients_made: Arc<std::sync::atomic::AtomicU64>,
    /// Topic → its partition count and when it was read (see [`Kafka::partition_count`]).
    partition_counts: Arc<Mutex<HashMap<String, (i32, tokio::time::Instant)>>>,
    dead_letters: DeadLetters,
}

impl std::fmt::Debug for Kafka {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kafka")
            .field("bootstrap", &self.settings.bootstrap_servers)
            .finish()
    }
}

impl Kafka {
    /// Creates the metadata client. Connections are made lazily: this does not fail when the
    /// brokers are down (health reports that).
    pub fn new(settings: KafkaSettings) -> Result<Self, LeaseError> {
        let mut config = settings.base_config();
        // The metadata client never reads records or commits; a group id is still required
        // by librdkafka for a consumer handle, and this one is never used for offsets.
        config
            .set("group.id", "kafka-lease-metadata")
            .set("enable.auto.commit", "false");
        settings.apply_options(&mut config);
        let metadata: BaseConsumer<ClientLog> =
            settings.create(&config, "creating the metadata client")?;
        let metadata = Arc::new(metadata);
        tokio::spawn(serve_metadata_client_events(Arc::downgrade(&metadata)));
        let groups: Arc<Mutex<HashMap<String, CachedGroup>>> = Arc::default();
        tokio::spawn(close_idle_group_clients(Arc::downgrade(&groups)));
        let settings = Arc::new(settings);
        Ok(Self {
            dead_letters: DeadLetters::new(settings.clone()),
            settings,
            metadata,
            groups,
            clients_made: Arc::default(),
            partition_counts: Arc::default(),
        })
    }

    pub fn settings(&self) -> &KafkaSettings {
        &self.settings
    }

    /// The gateway's dead letter producer.
    pub fn dead_letters(&self) -> &DeadLetters {
        &self.dead_letters
    }

    /// Closes the group clients, for a gateway that stops: from now on what librdkafka
    /// reports of any client of this `Kafka` (the metadata client lives on while a clone of
    /// it does) is logged at debug level only (see [`ClientLog`]).
    pub async fn close(&self) {
        self.settings.log.close();
        let closing: Vec<CachedGroup> = self
            .groups
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain()
            .map(|(_, cached)| cached)
            .collect();
        // Closing a librdkafka consumer blocks briefly; keep it off the reactor.
        let _ = tokio::task::spawn_blocking(move || drop(closing)).await;
    }

    /// The number of partitions of `topic`, from broker metadata read at most
    /// [`PARTITION_COUNT_MAX_AGE`] ago, or afresh when `wanted` (a partition the caller asks
    /// for) is past the count read then (the topic may have grown since).
    pub async fn partition_count(
        &self,
        topic: &str,
        wanted: Option<i32>,
    ) -> Result<i32, LeaseError> {
        let cached = self
            .partition_counts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(topic)
            .copied();
        if let Some((count, read)) = cached {
            if read.elapsed() < self.settings.partition_count_max_age
                && wanted.is_none_or(|p| p < count)
            {
                return Ok(count);
            }
        }
        let read = tokio::time::Instant::now();
        let count = match self.read_partition_count(topic).await {
            Ok(count) => count,
            // The brokers did not answer in time (a busy broker takes long over the metadata
            // of a topic of thousands of partitions): a count read before is still right for
            // every partition below it, since partitions are only ever added.
            Err(LeaseError::KafkaUnavailable { operation, detail })
                if cached.is_some_and(|(count, _)| wanted.is_none_or(|p| p < count)) =>
            {
                let count = cached.map_or(0, |(count, _)| count);
                tracing::debug!(
                    %topic,
                    count,
                    %detail,
                    operation,
                    "using the partition count read before",
                );
                return Ok(count);
            }
            Err(e) => return Err(e),
        };
        let mut counts = self
            .partition_counts
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        // Entries long unused are dropped; a recent one stays as the fallback above.
        counts.retain(|_, (_, at)| at.elapsed() < PARTITION_COUNT_MAX_AGE * 12);
        counts.insert(topic.to_string(), (count, read));
        Ok(count)
    }

    /// The number of partitions of `topic`, asked of the brokers.
    async fn read_partition_count(&self, topic: &str) -> Result<i32, LeaseError> {
        const OPERATION: &str = "fetching topic metadata";
        let client = self.metadata.clone();
        let topic = topic.to_string();
        let timeout = self.settings.request_timeout;
        retrying(OPERATION, timeout, move || {
            let metadata = client
                .fetch_metadata(Some(&topic), timeout)
                .map_err(|e| Failure::kafka(OPERATION, e))?;
            let Some(t) = metadata.topics().iter().find(|t| t.name() == topic) else {
                return Err(LeaseError::TopicNotFound {
                    topic: topic.clone(),
                }
                .into());
            };
            match t.error() {
                None if !t.partitions().is_empty() => Ok(t.partitions().len() as i32),
                None => Err(LeaseError::TopicNotFound {
                    topic: topic.clone(),
                }
                .into()),
                Some(code) => match RDKafkaErrorCode::from(code) {
                    RDKafkaErrorCode::UnknownTopicOrPartition | RDKafkaErrorCode::UnknownTopic => {
                        Err(LeaseError::TopicNotFound {
                            topic: topic.clone(),
                        }
                        .into())
                    }
                    other => Err(Failure::kafka(OPERATION, KafkaError::MetadataFetch(other))),
                },
            }
        })
        .await
    }

    /// `(log start offset, high watermark)` of a partition, asked of the broker.
    pub async fn watermarks(&self, topic: &str, partition: i32) -> Result<(i64, i64), LeaseError> {
        let client = self.metadata.clone();
        let topic = topic.to_string();
        let timeout = self.settings.request_timeout;
        retrying("fetching watermarks", timeout, move || {
            client
                .fetch_watermarks(&topic, partition, timeout)
                .map_err(|e| Failure::kafka("fetching watermarks", e))
        })
        .await
    }

    /// `(log start offset, high watermark)` of partitions `0..count` of `topic`, in one
    /// ListOffsets request per leader for each end (Kafka's special times -2 and -1): the
    /// partitions whose two offsets came back.
    pub async fn all_watermarks(
        &self,
        topic: &str,
        count: i32,
    ) -> Result<HashMap<i32, (i64, i64)>, LeaseError> {
        const OPERATION: &str = "listing the partitions' offsets";
        let client = self.metadata.clone();
        let topic = topic.to_string();
        let timeout = self.settings.request_timeout;
        blocking(OPERATION, move || {
            // librdkafka sends an offset given here as the ListOffsets time: the logical
            // `Beginning` and `End` are Kafka's special times -2 and -1.
            let ends = |time: Offset| -> Result<HashMap<i32, i64>, LeaseError> {
                let mut query = TopicPartitionList::new();
                for partition in 0..count {
                    query
                        .add_partition_offset(&topic, partition, time)
                        .map_err(|e| unavailable(OPERATION, e))?;
                }
                let answer = client
                    .offsets_for_times(query, timeout)
                    .map_err(|e| unavailable(OPERATION, e))?;
                Ok(offsets_by_partition(&answer, &topic))
            };
            let low = ends(Offset::Beginning)?;
            let high = ends(Offset::End)?;
            Ok(low
                .into_iter()
                .filter_map(|(p, low)| high.get(&p).map(|&high| (p, (low, high))))
                .collect())
        })
        .await
    }

    /// The partitions of `topic` (of `count`) with records for `group` to read: a high
    /// watermark past the group's committed offset, or, where the group has none, past where
    /// a lease would start (the log start with `from_earliest`, else nothing to read yet).
    pub async fn partitions_with_records(
        &self,
        group: &str,
        topic: &str,
        count: i32,
        from_earliest: bool,
    ) -> Result<std::collections::BTreeSet<i32>, LeaseError> {
        let client = self.group(group)?;
        let (committed, watermarks) = tokio::try_join!(
            client.committed_offsets(topic, count),
            self.all_watermarks(topic, count)
        )?;
        Ok(watermarks
            .into_iter()
            .filter(|(partition, (low, high))| {
                let start = match committed.get(partition) {
                    Some(&committed) => committed.max(*low),
                    None if from_earliest => *low,
                    None => *high,
                };
                *high > start
            })
            .map(|(partition, _)| partition)
            .collect())
    }

    /// The offset of the first record whose timestamp is at or after `timestamp_ms`, or
    /// `None` when there is none (the caller uses the high watermark).
    pub async fn offset_for_time(
        &self,
        topic: &str,
        partition: i32,
        timestamp_ms: i64,
    ) -> Result<Option<i64>, LeaseError> {
        if self.settings.scan_for_timestamps {
            return self.scan_for_time(topic, partition, timestamp_ms).await;
        }
        let client = self.metadata.clone();
        let topic = topic.to_string();
        let timeout = self.settings.request_timeout;
        blocking("looking up an offset by timestamp", move || {
            let mut query = TopicPartitionList::new();
            query
                .add_partition_offset(&topic, partition, Offset::Offset(timestamp_ms))
                .map_err(|e| unavailable("looking up an offset by timestamp", e))?;
            let answer = client
                .offsets_for_times(query, timeout)
                .map_err(|e| unavailable("looking up an offset by timestamp", e))?;
            let offset = answer.find_partition(&topic, partition).map(|e| e.offset());
            Ok(match offset {
                Some(Offset::Offset(o)) if o >= 0 => Some(o),
                _ => None,
            })
        })
        .await
    }

    /// [`Kafka::offset_for_time`] by reading the partition from its start (see
    /// [`KafkaSettings::scan_for_timestamps`]): fine for a dev cluster's few records.
    async fn scan_for_time(
        &self,
        topic: &str,
        partition: i32,
        timestamp_ms: i64,
    ) -> Result<Option<i64>, LeaseError> {
        const OPERATION: &str = "looking up an offset by timestamp (scanning)";
        let (low, high) = self.watermarks(topic, partition).await?;
        if high <= low {
            return Ok(None);
        }
        let mut config = self.settings.base_config();
        config
            .set(
                "group.id",
                format!("kafka-lease-scan-{}", self.settings.instance),
            )
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false");
        self.settings.apply_options(&mut config);
        let topic = topic.to_string();
        let timeout = self.settings.request_timeout;
        let settings = self.settings.clone();
        blocking(OPERATION, move || {
            use rdkafka::consumer::{BaseConsumer, Consumer as _};
            use rdkafka::Message as _;
            let consumer: BaseConsumer<ClientLog> = settings.create(&config, OPERATION)?;
            let mut assignment = TopicPartitionList::new();
            assignment
                .add_partition_offset(&topic, partition, Offset::Beginning)
                .map_err(|e| unavailable(OPERATION, e))?;
            consumer
                .assign(&assignment)
                .map_err(|e| unavailable(OPERATION, e))?;
            let deadline = tokio::time::Instant::now() + timeout;
            loop {
                let Some(left) = deadline.checked_duration_since(tokio::time::Instant::now())
                else {
                    return Err(unavailable(OPERATION, "the partition was not read in time"));
                };
                match consumer.poll(left) {
                    Some(Ok(message)) => {
                        let at = message.timestamp().to_millis().unwrap_or(i64::MIN);
                        if at >= timestamp_ms {
                            return Ok(Some(message.offset()));
                        }
                        if message.offset() + 1 >= high {
                            return Ok(None);
                        }
                    }
                    Some(Err(e)) => return Err(unavailable(OPERATION, e)),
                    None => {}
                }
            }
        })
        .await
    }

    /// Checks that a broker answers a metadata request (for health).
    pub async fn ping(&self) -> Result<(), LeaseError> {
        self.ping_answer().await.map(|_| ())
    }

    /// The health ping's metadata request and the size of its answer: (brokers, topics). It
    /// asks for the brokers and one topic, the group offsets topic every group client uses,
    /// not for every topic of the cluster: every gateway pings every second, and an answer
    /// listing the whole cluster's partitions would make a fleet's pings grow with the
    /// cluster (docs/CAPACITY.md). (librdkafka's public API has no request for the brokers
    /// alone: an empty topic list is sent as "all topics".) The topic need not exist or be
    /// readable: any answer names the brokers.
    async fn ping_answer(&self) -> Result<(usize, usize), LeaseError> {
        const WHAT: &str = "checking broker reachability";
        let client = self.metadata.clone();
        let timeout = self.settings.request_timeout.min(Duration::from_secs(2));
        blocking(WHAT, move || {
            let metadata = client
                .fetch_metadata(Some(PING_TOPIC), timeout)
                .map_err(|e| unavailable(WHAT, e))?;
            if metadata.brokers().is_empty() {
                return Err(unavailable(WHAT, "no brokers in metadata"));
            }
            Ok((metadata.brokers().len(), metadata.topics().len()))
        })
        .await
    }

    /// The group's client on this instance, created on first use and shared by every lease
    /// of the group. It is closed when its last lease ends.
    pub fn group(&self, group: &str) -> Result<Arc<GroupClient>, LeaseError> {
        let mut groups = self.groups.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(cached) = groups.get_mut(group) {
            cached.idle_since = None;
            return Ok(cached.client.clone());
        }
        if groups.len() >= self.settings.max_groups {
            // At the limit: make room by closing a client no lease uses (one kept idle for
            // a while), or refuse.
            let idle = groups
                .iter()
                .find(|(_, cached)| Arc::strong_count(&cached.client) == 1)
                .map(|(name, _)| name.clone());
            match idle.and_then(|name| groups.remove(&name)) {
                // Closing a librdkafka consumer blocks briefly; keep it off the reactor.
                Some(closing) => drop(tokio::task::spawn_blocking(move || drop(closing))),
                None => {
                    return Err(LeaseError::LimitReached {
                        flag: "--max-groups",
                        limit: self.settings.max_groups,
                        what: format!(
                            "this gateway already has leases in {} consumer groups, so it \
                             cannot take one in group {group:?}",
                            groups.len()
                        ),
                    })
                }
            }
        }
        let client = Arc::new(GroupClient::new(&self.settings, group)?);
        groups.insert(
            group.to_string(),
            CachedGroup {
                client: client.clone(),
                made: self
                    .clients_made
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed),
                idle_since: None,
            },
        );
        Ok(client)
    }

    /// The client a lease of `own`'s group fetches `topic`/`partition` through: the oldest
    /// group client on this instance that does not fetch that partition already, whichever
    /// group it stores offsets for. A fetch needs no group, and librdkafka keeps state for
    /// every partition of each topic a client fetches from (1.8 KiB a partition), so leases
    /// of groups on distinct partitions share one client's state and threads' work instead of
    /// each group's client learning the whole topic; a partition leased in several groups on
    /// this instance is fetched once per group, by as many clients. `own` is the fallback,
    /// and never fetches a partition twice either: a gateway holds a partition's lock once
    /// per group, and own's client is among those tried (unless the gateway is closing them).
    pub fn fetcher(
        &self,
        own: &Arc<GroupClient>,
        topic: &str,
        partition: i32,
    ) -> Result<FetchClaim, LeaseError> {
        let groups = self.groups.lock().unwrap_or_else(|p| p.into_inner());
        let mut clients: Vec<&CachedGroup> = groups.values().collect();
        clients.sort_unstable_by_key(|cached| cached.made);
        clients
            .iter()
            .find_map(|cached| cached.client.claim(topic, partition))
            .or_else(|| own.claim(topic, partition))
            .ok_or_else(|| {
                unavailable(
                    "opening a partition queue",
                    format!(
                        "every Kafka client of this gateway fetches partition {partition} of \
                         {topic:?} already (group {:?} asked for it)",
                        own.group()
                    ),
                )
            })
    }
}

/// How often the metadata client's events are served.
const METADATA_EVENTS_INTERVAL: Duration = Duration::from_secs(1);

/// Serves the metadata client's event queue every [`METADATA_EVENTS_INTERVAL`] until the
/// client is gone. librdkafka queues its log lines and client errors there (a failed SASL
/// authentication, all brokers down), and the metadata client is otherwise never polled: they
/// would be logged only when it closes, so a gateway with wrong Kafka credentials would only
/// say "broker transport failure" while it runs. (Group clients serve theirs in their poller.)
async fn serve_metadata_client_events(client: Weak<BaseConsumer<ClientLog>>) {
    let mut ticker = tokio::time::interval(METADATA_EVENTS_INTERVAL);
    loop {
        ticker.tick().await;
        let Some(client) = client.upgrade() else {
            return;
        };
        // The client context logs each event as it is served; the errors poll returns are
        // those same events (the client reads no records). A poll returns None once its
        // time passed without an event it returns, having served everything else meanwhile;
        // the bound keeps a storm of errors from holding the blocking thread.
        let _ = tokio::task::spawn_blocking(move || {
            for _ in 0..20 {
                if client.poll(Duration::from_millis(50)).is_none() {
                    break;
                }
            }
        })
        .await;
    }
}

/// Closes group clients no lease has used for [`IDLE_GROUP_CLIENT`]; ends with the clients.
async fn close_idle_group_clients(groups: Weak<Mutex<HashMap<String, CachedGroup>>>) {
    let mut ticker = tokio::time::interval(IDLE_GROUP_CLIENT / 6);
    loop {
        ticker.tick().await;
        let Some(groups) = groups.upgrade() else {
            return;
        };
        let now = tokio::time::Instant::now();
        let closing: Vec<CachedGroup> = {
            let mut groups = groups.lock().unwrap_or_else(|p| p.into_inner());
            for cached in groups.values_mut() {
                // Only the cache holds it: no lease of the group is open on this instance.
                if Arc::strong_count(&cached.client) == 1 {
                    cached.idle_since.get_or_insert(now);
                } else {
                    cached.idle_since = None;
                }
            }
            let idle: Vec<String> = groups
                .iter()
                .filter(|(_, c)| c.idle_since.is_some_and(|t| now - t >= IDLE_GROUP_CLIENT))
                .map(|(name, _)| name.clone())
                .collect();
            idle.iter().filter_map(|name| groups.remove(name)).collect()
        };
        // Closing a librdkafka consumer blocks briefly; keep it off the reactor.
        if !closing.is_empty() {
            tracing::debug!(groups = closing.len(), "closing idle group clients");
            let _ = tokio::task::spawn_blocking(move || drop(closing)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rdkafka::mocking::MockCluster;

    use super::{GroupClient, Kafka};
    use crate::kafka::settings::KafkaSettings;

    /// The health ping runs every second on every gateway: its answer must not list every
    /// topic of the cluster (it did: a request for all topics, 3 here).
    #[tokio::test(flavor = "multi_thread")]
    async fn the_health_ping_asks_for_the_brokers_and_one_topic() {
        let cluster = MockCluster::new(1).expect("mock cluster");
        for topic in ["ping-a", "ping-b", "ping-c"] {
            cluster.create_topic(topic, 4, 1).expect("topic");
        }
        let kafka = Kafka::new(KafkaSettings::new(cluster.bootstrap_servers(), "ping-test"))
            .expect("client");
        let (brokers, topics) = kafka.ping_answer().await.expect("ping");
        assert_eq!(
            (brokers, topics),
            (1, 1),
            "the ping asks for the brokers and one topic, not the cluster's three"
        );
        assert_eq!(
            kafka.partition_count("ping-b", None).await.expect("count"),
            4
        );
        let (_, topics) = kafka.ping_answer().await.expect("ping");
        assert_eq!(topics, 1, "nor after a topic was asked about");
        kafka.close().await;
    }

    /// Leases of groups on distinct partitions are fetched by one client, the oldest; a
    /// partition leased in several groups by as many clients; a claim given back frees the
    /// partition on its client.
    #[tokio::test(flavor = "multi_thread")]
    async fn groups_share_the_oldest_client_for_the_partitions_it_does_not_fetch() {
        let cluster = MockCluster::new(1).expect("mock cluster");
        cluster.create_topic("shared", 3, 1).expect("topic");
        let kafka = Kafka::new(KafkaSettings::new(
            cluster.bootstrap_servers(),
            "fetch-test",
        ))
        .expect("client");
        let [a, b, c] = ["a", "b", "c"].map(|group| kafka.group(group).expect("group client"));
        let fetcher = |own: &Arc<GroupClient>, partition: i32| {
            kafka.fetcher(own, "shared", partition).expect("a client")
        };
        let a0 = fetcher(&a, 0);
        assert!(Arc::ptr_eq(a0.client(), &a));
        let b1 = fetcher(&b, 1);
        assert!(
            Arc::ptr_eq(b1.client(), &a),
            "b's partition 1 by a's client"
        );
        let b0 = fetcher(&b, 0);
        assert!(Arc::ptr_eq(b0.client(), &b), "a's client fetches 0 already");
        let c0 = fetcher(&c, 0);
        assert!(Arc::ptr_eq(c0.client(), &c), "a's and b's fetch 0 already");
        let refused = kafka
            .fetcher(&c, "shared", 0)
            .expect_err("every client fetches partition 0");
        assert!(
            refused
                .to_string()
                .contains("fetches partition 0 of \"shared\" already"),
            "{refused}"
        );
        drop(a0);
        let c0_again = fetcher(&c, 0);
        assert!(Arc::ptr_eq(c0_again.client(), &a), "a's client gave 0 back");
        drop((b1, b0, c0, c0_again));
        kafka.close().await;
    }
}
