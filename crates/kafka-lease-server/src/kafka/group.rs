//! [`GroupClient`]: one consumer group's client on this gateway, which stores the group's
//! offsets (committed, commit); and, for the partitions it fetches ([`FetchClaim`]), looks up
//! a topic's leaders and reads cached watermarks.

use std::collections::{HashMap, HashSet};
use std::ffi::{CStr, CString};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use tokio::task::JoinHandle;

use super::errors::{kafka_error, retrying, unavailable, Failure};
use super::settings::{ClientLog, KafkaSettings};
use crate::error::LeaseError;

/// The gate a partition's commits pass: each commit holds a [`CommitPermit`] from before its
/// check (the caller's: for a lease, its fence) until librdkafka has the commit's outcome,
/// and [`CommitGate::settled`] waits until none is in flight. A permit is made only here,
/// and [`GroupClient::commit`] takes one: a commit that skips the gate does not compile.
#[derive(Debug, Default)]
pub struct CommitGate(Arc<tokio::sync::RwLock<()>>);

/// A commit let through a [`CommitGate`]: the gate's settling waits for it.
#[derive(Debug)]
pub struct CommitPermit(#[allow(dead_code)] tokio::sync::OwnedRwLockReadGuard<()>);

/// No commit is in flight through the gate while this lives.
#[derive(Debug)]
pub struct CommitsSettled(#[allow(dead_code)] tokio::sync::OwnedRwLockWriteGuard<()>);

impl CommitGate {
    /// A permit, once `check` passes while it is held (so whoever settles the gate after
    /// making `check` fail knows no commit passed it before).
    pub async fn permit<E>(
        &self,
        check: impl FnOnce() -> Result<(), E>,
    ) -> Result<CommitPermit, E> {
        let permit = CommitPermit(self.0.clone().read_owned().await);
        check()?;
        Ok(permit)
    }

    /// Waits until no commit holds a permit.
    pub async fn settled(&self) -> CommitsSettled {
        CommitsSettled(self.0.clone().write_owned().await)
    }
}

/// What a commit's blocking call asks of its lease around the request (see
/// [`GroupClient::commit`]): whether it may still be handed to librdkafka, and what the time
/// of its answer means. The lease's fence: the commit gate in docs/ARCHITECTURE.md.
pub trait CommitFence: Send + 'static {
    /// Checked on the thread that hands the request to librdkafka, right before it does: a
    /// gateway paused (or starved) between the caller's check and this one sends nothing.
    fn may_send(&self) -> Result<Sent, LeaseError>;
    /// Called once librdkafka has the outcome, with how the request was let through and
    /// whether the commit may have been stored (it was, or its request timed out): an answer
    /// later than the fence allowed means it may have landed after a successor's commits.
    fn answered(&self, sent: Sent, may_have_landed: bool);
}

/// How [`CommitFence::may_send`] let a request through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sent {
    /// The fence was open: a late answer is the commit gate's limit.
    InTime,
    /// The fence was closed and a planted defect let the request through anyway: a late
    /// answer is the broken fence, not the limit.
    PastItsFence,
}

/// Whether a failed commit may still have been stored: its request went out and no answer
/// came (a timeout, a connection lost), rather than the broker refusing it.
fn may_have_landed(err: &rdkafka::error::KafkaError) -> bool {
    use rdkafka::error::RDKafkaErrorCode as C;
    matches!(
        err.rdkafka_error_code(),
        Some(
            C::RequestTimedOut
                | C::OperationTimedOut
                | C::MessageTimedOut
                | C::BrokerTransportFailure
                | C::AllBrokersDown
        ) | None
    )
}

/// librdkafka's `fetch.wait.max.ms` for the group clients: how long the broker holds a fetch
/// of partitions without new records. A client has one fetch in flight per broker, so a
/// partition opened while the group's other partitions wait in such a fetch is first fetched
/// when that one returns: this bounds the wait of a lease's first record when its group's
/// client is already reading elsewhere. Lower costs more empty fetches of idle partitions
/// (1000 / this per second per client and broker).
const FETCH_WAIT_MAX_MS: &str = "20";

/// librdkafka's `fetch.queue.backoff.ms` for the group clients: how long a partition whose
/// pre-fetch queue is full (`queued.max.messages.kbytes`) waits before librdkafka looks at it
/// again. A Read that drains its partition slower than the broker serves it finds the queue
/// full after every fetch, and nothing is fetched for this long: at 10 ms a 1 KiB drain ran
/// at two thirds of its rate at 2 ms (docs/BENCHMARKS.md, "The prefetch queue's back-off").
/// librdkafka's default, 1 s, would stall such a Read for a second at a time. A full queue
/// whose client does not read costs no measurable CPU at 2 ms (100 stalled leases: 8
/// millicores, as at 10 ms).
const FETCH_QUEUE_BACKOFF_MS: &str = "2";

/// How long a group client's lookup of a topic's leaders is trusted (librdkafka keeps
/// topic metadata for 3 x `topic.metadata.refresh.interval.ms`, 90 s, and refreshes that of
/// the partitions it fetches every 30 s).
const TOPIC_LOOKUP_FRESH: Duration = Duration::from_secs(60);

type LeaseConsumer = StreamConsumer<ClientLog>;

/// A partition one lease fetches through a group client, which may be another group's: a
/// fetch needs no group, and librdkafka keeps state for every partition of every topic a
/// client fetches from (about 1.8 KiB each), so the gateway fetches through as few clients as
/// it can rather than one per group ([`crate::kafka::Kafka::fetcher`]). A client fetches a
/// partition for one lease at a time: the claim is given back when dropped, after the feed
/// that holds it stopped the fetching.
pub struct FetchClaim {
    client: Arc<GroupClient>,
    topic: String,
    partition: i32,
}

impl FetchClaim {
    /// The client that fetches the partition.
    pub fn client(&self) -> &Arc<GroupClient> {
        &self.client
    }

    pub fn topic(&self) -> &str {
        &self.topic
    }

    pub fn partition(&self) -> i32 {
        self.partition
    }
}

impl std::fmt::Debug for FetchClaim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FetchClaim")
            .field("client", &self.client.group)
            .field("topic", &self.topic)
            .field("partition", &self.partition)
            .finish()
    }
}

impl Drop for FetchClaim {
    fn drop(&mut self) {
        self.client
            .fetching_lock()
            .remove(&(std::mem::take(&mut self.topic), self.partition));
    }
}

/// One consumer group's client: stores the group's offsets, and fetches the partitions
/// claimed on it ([`FetchClaim`]), of its own group's leases or of other groups'.
pub struct GroupClient {
    group: String,
    pub(super) consumer: Arc<LeaseConsumer>,
    pub(super) request_timeout: Duration,
    /// Topics this client looked up, and when (see [`GroupClient::learn_topic`]).
    topics: Mutex<HashMap<String, tokio::time::Instant>>,
    /// The partitions this client fetches, one lease each (see [`FetchClaim`]).
    fetching: Mutex<HashSet<(String, i32)>>,
    /// Serves the client's main queue, where librdkafka delivers errors and events. Every
    /// partition is split off to its own queue, so no record arrives here.
    poller: JoinHandle<()>,
}

impl std::fmt::Debug for GroupClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupClient")
            .field("group", &self.group)
            .finish()
    }
}

impl Drop for GroupClient {
    fn drop(&mut self) {
        self.poller.abort();
    }
}

impl GroupClient {
    pub(super) fn new(settings: &KafkaSettings, group: &str) -> Result<Self, LeaseError> {
        let mut config = settings.base_config();
        config
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", "false")
            // Retention may delete records under a lease's position; reading then resumes at
            // the log start, the only records that still exist.
            .set("auto.offset.reset", "earliest")
            .set(
                "queued.max.messages.kbytes",
                settings.queue_kbytes_per_partition.to_string(),
            )
            .set("queued.min.messages", "10000")
            .set("fetch.queue.backoff.ms", FETCH_QUEUE_BACKOFF_MS)
            .set("fetch.wait.max.ms", FETCH_WAIT_MAX_MS);
        settings.apply_options(&mut config);
        let consumer: LeaseConsumer = settings.create(&config, "creating the group client")?;
        let consumer = Arc::new(consumer);
        let events = consumer.clone();
        let group_name = group.to_string();
        let poller = tokio::spawn(async move {
            loop {
                match events.recv().await {
                    Ok(message) => tracing::warn!(
                        group = %group_name,
                        topic = message.topic(),
                        partition = message.partition(),
                        offset = message.offset(),
                        "record arrived on the main queue; it is dropped (partition not split)"
                    ),
                    Err(err) => {
                        tracing::warn!(group = %group_name, error = %err, "kafka client error")
                    }
                }
            }
        });
        Ok(Self {
            group: group.to_string(),
            consumer,
            request_timeout: settings.request_timeout,
            topics: Mutex::default(),
            fetching: Mutex::default(),
            poller,
        })
    }

    pub fn group(&self) -> &str {
        &self.group
    }

    /// Claims `topic`/`partition` for one lease to fetch through this client, unless the
    /// client fetches it already (for a lease of another group).
    pub(super) fn claim(self: &Arc<Self>, topic: &str, partition: i32) -> Option<FetchClaim> {
        let key = (topic.to_string(), partition);
        if !self.fetching_lock().insert(key) {
            return None;
        }
        Some(FetchClaim {
            client: self.clone(),
            topic: topic.to_string(),
            partition,
        })
    }

    fn fetching_lock(&self) -> std::sync::MutexGuard<'_, HashSet<(String, i32)>> {
        self.fetching.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The group's committed offset and its metadata for a partition, `None` if it has none.
    pub async fn committed(
        &self,
        topic: &str,
        partition: i32,
    ) -> Result<Option<(i64, String)>, LeaseError> {
        let consumer = self.consumer.clone();
        let topic = topic.to_string();
        let timeout = self.request_timeout;
        const OPERATION: &str = "fetching the committed offset";
        retrying(OPERATION, timeout, move || {
            let mut query = TopicPartitionList::new();
            query.add_partition(&topic, partition);
            let answer = consumer
                .committed_offsets(query, timeout)
                .map_err(|e| Failure::kafka(OPERATION, e))?;
            let Some(entry) = answer.find_partition(&topic, partition) else {
                return Ok(None);
            };
            if let Err(e) = entry.error() {
                return Err(Failure::kafka(OPERATION, e));
            }
            Ok(match entry.offset() {
                Offset::Offset(o) if o >= 0 => Some((o, entry.metadata().to_string())),
                _ => None,
            })
        })
        .await
    }

    /// The group's committed offsets for partitions `0..count` of `topic`, in one request:
    /// those it has (a partition without one is absent).
    pub async fn committed_offsets(
        &self,
        topic: &str,
        count: i32,
    ) -> Result<HashMap<i32, i64>, LeaseError> {
        let consumer = self.consumer.clone();
        let topic = topic.to_string();
        let timeout = self.request_timeout;
        const OPERATION: &str = "fetching the committed offsets";
        retrying(OPERATION, timeout, move || {
            let mut query = TopicPartitionList::new();
            for partition in 0..count {
                query.add_partition(&topic, partition);
            }
            let answer = consumer
                .committed_offsets(query, timeout)
                .map_err(|e| Failure::kafka(OPERATION, e))?;
            Ok(offsets_by_partition(&answer, &topic))
        })
        .await
    }

    /// Asks the brokers for `topic`'s metadata through this client, so that a partition of
    /// it opened next is fetched from its leader at once. librdkafka does not look a topic
    /// up when a partition of it is assigned: a topic new to the client stayed without a
    /// leader until the client's once-a-second scan of unknown topics, and a lease's first
    /// record came ~1 s after the Acquire.
    ///
    /// Skipped when this client looked the topic up less than [`TOPIC_LOOKUP_FRESH`] ago:
    /// librdkafka still has it then, and the request would wait behind the client's fetch in
    /// flight on the same connection (up to `fetch.wait.max.ms`).
    pub async fn learn_topic(&self, topic: &str) -> Result<(), LeaseError> {
        const OPERATION: &str = "looking up the topic's leaders";
        let fresh = |at: &tokio::time::Instant| at.elapsed() < TOPIC_LOOKUP_FRESH;
        if self.topics_lock().get(topic).is_some_and(fresh) {
            return Ok(());
        }
        let consumer = self.consumer.clone();
        let owned = topic.to_string();
        let timeout = self.request_timeout;
        retrying(OPERATION, timeout, move || {
            consumer
                .fetch_metadata(Some(&owned), timeout)
                .map(drop)
                .map_err(|e| Failure::kafka(OPERATION, e))
        })
        .await?;
        let mut topics = self.topics_lock();
        topics.retain(|_, at| fresh(at));
        topics.insert(topic.to_string(), tokio::time::Instant::now());
        Ok(())
    }

    fn topics_lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, tokio::time::Instant>> {
        self.topics.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stores `offset` with `metadata` as the group's committed offset, synchronously. Only
    /// with a [`CommitPermit`], held until librdkafka has the request's outcome, and the
    /// lease's [`CommitFence`], asked again right before the request goes to librdkafka and
    /// told when its outcome came.
    pub async fn commit(
        &self,
        topic: &str,
        partition: i32,
        offset: i64,
        metadata: String,
        in_flight: CommitPermit,
        fence: Box<dyn CommitFence>,
    ) -> Result<(), LeaseError> {
        const OPERATION: &str = "committing an offset";
        let consumer = self.consumer.clone();
        let topic = topic.to_string();
        let request = tokio::task::spawn_blocking(move || {
            // Held until librdkafka has the request's outcome (an answer, or its own request
            // timeout), even after the caller stopped waiting: whoever waits for this
            // guard's release (the end of a lease) knows the commit can no longer land.
            let _in_flight = in_flight;
            let mut list = TopicPartitionList::new();
            list.add_partition_offset(&topic, partition, Offset::Offset(offset))
                .map_err(|e| unavailable(OPERATION, e))?;
            if let Some(mut entry) = list.find_partition(&topic, partition) {
                entry.set_metadata(metadata);
            }
            let sent = fence.may_send()?;
            let outcome = consumer.commit(&list, CommitMode::Sync);
            fence.answered(
                sent,
                match &outcome {
                    Ok(()) => true,
                    Err(e) => may_have_landed(e),
                },
            );
            outcome.map_err(|e| kafka_error(OPERATION, e))
        });
        match tokio::time::timeout(self.request_timeout, request).await {
            Ok(joined) => {
                joined.map_err(|e| unavailable(OPERATION, format!("blocking task failed: {e}")))?
            }
            Err(_) => Err(unavailable(
                OPERATION,
                format!(
                    "no answer within {:?}; the commit may still land while the lease lasts",
                    self.request_timeout
                ),
            )),
        }
    }

    /// The high watermark librdkafka last saw in a fetch response, without a request.
    pub fn cached_high_watermark(&self, topic: &str, partition: i32) -> Option<i64> {
        self.cached_high_watermark_of(&CString::new(topic).ok()?, partition)
    }

    /// [`Self::cached_high_watermark`] for a topic name already made a C string (the Read
    /// path asks once per batch, without allocating).
    #[allow(unsafe_code)]
    pub(super) fn cached_high_watermark_of(&self, topic: &CStr, partition: i32) -> Option<i64> {
        let (mut low, mut high) = (-1_i64, -1_i64);
        // SAFETY: the client handle is valid while `self.consumer` lives; the topic pointer
        // is a NUL-terminated string that outlives the call; librdkafka only writes the two
        // out-parameters and does no network I/O in this call.
        let err = unsafe {
            rdkafka::bindings::rd_kafka_get_watermark_offsets(
                self.consumer.client().native_ptr(),
                topic.as_ptr(),
                partition,
                &mut low,
                &mut high,
            )
        };
        (err == rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR && high >= 0)
            .then_some(high)
    }
}

impl GroupClient {
    /// librdkafka's position of `partition` of `topic`: the next offset it will hand the
    /// application. It passes what a read_committed reader never gets (a transaction's
    /// marker, an aborted record), where the last record taken + 1 stops short of them.
    /// `None` before a first fetch.
    #[allow(unsafe_code)]
    pub(super) fn position_of(&self, topic: &str, partition: i32) -> Option<i64> {
        let mut list = TopicPartitionList::new();
        list.add_partition(topic, partition);
        // SAFETY: the client handle is valid while `self.consumer` lives; `list` is a valid
        // list that outlives the call; librdkafka only writes the elements' offsets and does
        // no network I/O in this call.
        let err = unsafe {
            rdkafka::bindings::rd_kafka_position(self.consumer.client().native_ptr(), list.ptr())
        };
        if err != rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            return None;
        }
        match list.find_partition(topic, partition)?.offset() {
            Offset::Offset(offset) => Some(offset),
            _ => None,
        }
    }
}

/// The partitions of `topic` in a librdkafka answer that came back with an offset (not an
/// error, not a logical offset), and that offset.
pub(super) fn offsets_by_partition(answer: &TopicPartitionList, topic: &str) -> HashMap<i32, i64> {
    answer
        .elements_for_topic(topic)
        .iter()
        .filter(|e| e.error().is_ok())
        .filter_map(|e| match e.offset() {
            Offset::Offset(o) if o >= 0 => Some((e.partition(), o)),
            _ => None,
        })
        .collect()
}
