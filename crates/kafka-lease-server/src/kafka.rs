//! Reading partitions and storing offsets with librdkafka (the `rdkafka` crate).
//!
//! One consumer client per consumer group on each gateway ([`GroupClient`]) reads every
//! partition leased in that group, each through its own split partition queue
//! ([`PartitionFeed`]), and stores the group's offsets in Kafka's group coordinator. The
//! client never joins the group (`assign`, not `subscribe`): partition ownership comes from
//! the lock backend, so Kafka's rebalancing must stay out of it. A lease therefore costs a
//! partition queue, not a client with its own threads; see docs/ARCHITECTURE.md for the
//! thread and memory arithmetic.
//!
//! librdkafka calls that block (metadata, watermarks, commits, seeks) run on tokio's blocking
//! pool so they never stall the reactor.

use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use rdkafka::client::ClientContext;
use rdkafka::config::{FromClientConfigAndContext, RDKafkaLogLevel};
use rdkafka::consumer::stream_consumer::StreamPartitionQueue;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, StreamConsumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Message, OwnedMessage};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use tokio::task::JoinHandle;

use crate::error::LeaseError;
use crate::kafka_config::KafkaProperties;
use crate::records::{EncodedRecords, Prepared};

/// How long a partition queue waits for a wake-up before it looks again by itself.
const REPOLL: Duration = Duration::from_millis(20);

/// How long a group's client stays open after its last lease ended, so the next Acquire in
/// the group does not pay for a new client and a coordinator lookup (tens of ms).
const IDLE_GROUP_CLIENT: Duration = Duration::from_secs(60);

/// The default of [`KafkaSettings::max_groups`].
pub const DEFAULT_MAX_GROUPS: usize = 100;

/// librdkafka's `reconnect.backoff.ms` for the gateway's clients (see `base_config`); the
/// backoff still doubles up to `reconnect.backoff.max.ms` while a broker stays unreachable.
const RECONNECT_BACKOFF_MS: &str = "20";

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

/// librdkafka's `socket.timeout.ms` for the gateway's clients.
const SOCKET_TIMEOUT_MS: &str = "10000";

/// How the gateway talks to Kafka.
#[derive(Clone, Debug)]
pub struct KafkaSettings {
    /// `host:port[,host:port...]`.
    pub bootstrap_servers: String,
    /// The operator's librdkafka properties (`--kafka-config`, `--kafka-config-file`),
    /// applied last. Shown only redacted (secret values as `***`).
    pub options: KafkaProperties,
    /// Most kilobytes librdkafka pre-fetches per leased partition (`queued.max.messages.kbytes`).
    /// This is the per-lease memory bound: a slow client stops the fetching at this point.
    pub queue_kbytes_per_partition: u32,
    /// Deadline for metadata, watermark, offset and commit requests.
    pub request_timeout: Duration,
    /// How long a topic's partition count is reused before it is read again (5 s).
    pub partition_count_max_age: Duration,
    /// Used in `client.id`, so broker logs show which gateway a connection belongs to.
    pub instance: String,
    /// Most consumer groups with a client on this gateway at once (`--max-groups`): each
    /// costs a librdkafka client with its own threads and broker connections.
    pub max_groups: usize,
    /// Look offsets up by time by reading the partition, not by asking the broker: only for
    /// `kafka-lease dev`, whose in-process Kafka (librdkafka's mock cluster) does not
    /// implement the lookup (it answers "no such offset" for every time).
    pub scan_for_timestamps: bool,
    /// The context of every client made with these settings.
    log: ClientLog,
}

impl KafkaSettings {
    pub fn new(bootstrap_servers: impl Into<String>, instance: impl Into<String>) -> Self {
        Self {
            bootstrap_servers: bootstrap_servers.into(),
            options: KafkaProperties::new(),
            queue_kbytes_per_partition: 2048,
            request_timeout: Duration::from_secs(5),
            partition_count_max_age: PARTITION_COUNT_MAX_AGE,
            instance: instance.into(),
            max_groups: DEFAULT_MAX_GROUPS,
            scan_for_timestamps: false,
            log: ClientLog::default(),
        }
    }

    fn base_config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", &self.bootstrap_servers)
            .set("client.id", format!("kafka-lease-{}", self.instance))
            .set("socket.keepalive.enable", "true")
            // librdkafka's own bound on a request in flight (default 60 s): how long the end
            // of a lease may wait for a commit whose answer is missing (see the commit gate
            // in docs/ARCHITECTURE.md).
            .set("socket.timeout.ms", SOCKET_TIMEOUT_MS)
            // librdkafka backs off reconnects up to 10 s by default: after a broker restart
            // the gateway could then stay cut off for longer than a request's deadline (5 s)
            // and answer UNAVAILABLE to calls a running broker could serve.
            .set("reconnect.backoff.max.ms", "1000")
            // Also the pause between two picks of "any broker" to connect to (half of it,
            // 50 ms by default). A new client connects to the bootstrap address, drops that
            // connection as soon as it learns the broker's id, and its first request (the
            // coordinator lookup of a new group's first Acquire) then waited out the pause
            // before it could connect again: ~50 ms of that Acquire.
            .set("reconnect.backoff.ms", RECONNECT_BACKOFF_MS)
            .set("topic.metadata.refresh.interval.ms", "30000");
        config
    }

    fn apply_options(&self, config: &mut ClientConfig) {
        for (key, value) in self.options.iter() {
            config.set(key, value);
        }
    }

    /// Creates a librdkafka client from `config`. A failure never quotes a property's value:
    /// rdkafka's configuration error appends the value it refused (and librdkafka's own text
    /// may quote it), and it may be a secret, possibly under a misspelt key that
    /// [`crate::kafka_config::is_secret`] cannot recognise. So a refused property is named
    /// by its key only, and every secret value of the options is masked in what remains.
    fn create<T: FromClientConfigAndContext<ClientLog>>(
        &self,
        config: &ClientConfig,
        operation: &'static str,
    ) -> Result<T, LeaseError> {
        config
            .create_with_context(self.log.clone())
            .map_err(|e| unavailable(operation, self.creation_error(&e)))
    }

    /// [`KafkaSettings::create`]'s error text.
    fn creation_error(&self, err: &KafkaError) -> String {
        let text = match err {
            KafkaError::ClientConfig(_, description, key, _value) => {
                format!("librdkafka refused the property {key:?}: {description}")
            }
            other => other.to_string(),
        };
        self.options.redact(&text)
    }
}

/// How long a librdkafka log line or client error, once logged, is logged again at debug
/// level only (see [`ClientLog`]).
const LOG_REPEATS_QUIET: Duration = Duration::from_secs(60);

/// The context of the gateway's librdkafka clients: forwards librdkafka's log lines and
/// client errors to `tracing` at their level, as rdkafka's default context does (same
/// targets: `librdkafka`, `rdkafka::client`), with two differences:
///
/// - A line said in the last [`LOG_REPEATS_QUIET`] by any client of the same [`Kafka`] is a
///   debug line. While the brokers cannot be reached every client reports the same failure,
///   and the metadata client's queue yields it at each poll: without this a gateway started
///   with Kafka down wrote some twenty identical ERROR lines a second.
/// - Once [`Kafka::close`] is called, every line is a debug line: what clients being torn
///   down at shutdown report (their connections closing, the in-process cluster of
///   `kafka-lease dev` gone first) is not news, and read as a crash.
#[derive(Clone, Debug, Default)]
pub struct ClientLog {
    shared: Arc<ClientLogShared>,
}

#[derive(Debug, Default)]
struct ClientLogShared {
    closing: AtomicBool,
    /// Line (without its varying tail) → when it was last logged at its level.
    said: Mutex<HashMap<String, tokio::time::Instant>>,
}

impl ClientLog {
    /// From now on every line is a debug line.
    fn close(&self) {
        self.shared.closing.store(true, Ordering::Relaxed);
    }

    /// Whether `line` is logged at its own level now: not after [`ClientLog::close`], nor
    /// when it was within [`LOG_REPEATS_QUIET`].
    fn news(&self, line: &str) -> bool {
        if self.shared.closing.load(Ordering::Relaxed) {
            return false;
        }
        // librdkafka's tail varies between repeats: "(after 0ms in state CONNECT, 1
        // identical error(s) suppressed)".
        let key = line.split(" (after ").next().unwrap_or(line);
        let now = tokio::time::Instant::now();
        let mut said = self.shared.said.lock().unwrap_or_else(|p| p.into_inner());
        if said.len() >= 1024 {
            said.retain(|_, at| now.duration_since(*at) < LOG_REPEATS_QUIET);
        }
        match said.get(key) {
            Some(at) if now.duration_since(*at) < LOG_REPEATS_QUIET => false,
            _ => {
                said.insert(key.to_string(), now);
                true
            }
        }
    }
}

impl ClientContext for ClientLog {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        use RDKafkaLogLevel as L;
        if matches!(level, L::Debug) || !self.news(&format!("{fac} {log_message}")) {
            tracing::debug!(target: "librdkafka", "librdkafka: {fac} {log_message}");
            return;
        }
        match level {
            L::Emerg | L::Alert | L::Critical | L::Error => {
                tracing::error!(target: "librdkafka", "librdkafka: {fac} {log_message}");
            }
            L::Warning => tracing::warn!(target: "librdkafka", "librdkafka: {fac} {log_message}"),
            L::Notice | L::Info | L::Debug => {
                tracing::info!(target: "librdkafka", "librdkafka: {fac} {log_message}");
            }
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if self.news(&format!("{error}: {reason}")) {
            tracing::error!(target: "rdkafka::client", "librdkafka: {error}: {reason}");
        } else {
            tracing::debug!(target: "rdkafka::client", "librdkafka: {error}: {reason}");
        }
    }
}

impl ConsumerContext for ClientLog {}

fn unavailable(operation: &'static str, err: impl std::fmt::Display) -> LeaseError {
    metrics::counter!(crate::metrics::KAFKA_ERRORS, "operation" => operation).increment(1);
    LeaseError::KafkaUnavailable {
        operation,
        detail: err.to_string(),
    }
}

async fn blocking<T: Send + 'static>(
    operation: &'static str,
    f: impl FnOnce() -> Result<T, LeaseError> + Send + 'static,
) -> Result<T, LeaseError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| unavailable(operation, format!("blocking task failed: {e}")))?
}

/// Broker states that clear by themselves within seconds: a coordinator or partition leader
/// that is loading, moving or not elected yet (a freshly started broker loading its offsets
/// topic answers NOT_COORDINATOR and COORDINATOR_LOAD_IN_PROGRESS for a while), and requests
/// lost with a connection. Kafka's own clients retry these; so does the gateway, within the
/// request's deadline, instead of handing the caller an error it can do nothing about.
fn is_transient(err: &KafkaError) -> bool {
    use RDKafkaErrorCode as C;
    matches!(
        err.rdkafka_error_code(),
        Some(
            C::NotCoordinator
                | C::CoordinatorLoadInProgress
                | C::CoordinatorNotAvailable
                | C::LeaderNotAvailable
                | C::NotLeaderForPartition
                | C::RequestTimedOut
                | C::NetworkException
                | C::BrokerTransportFailure
                | C::AllBrokersDown
                | C::OperationTimedOut
        )
    )
}

/// One failed attempt at a broker request, and whether trying again may succeed.
struct Failure {
    error: LeaseError,
    transient: bool,
}

impl Failure {
    fn kafka(operation: &'static str, err: KafkaError) -> Self {
        Failure {
            transient: is_transient(&err),
            error: kafka_error(operation, err),
        }
    }
}

/// What a librdkafka error means to the caller. A broker's refusal that no retry can mend
/// (an authorization failure, a malformed request) is not UNAVAILABLE, which the contract
/// calls safe to retry: a client would retry it forever. Everything else (the connection,
/// timeouts, broker states that clear) is.
fn kafka_error(operation: &'static str, err: KafkaError) -> LeaseError {
    use RDKafkaErrorCode as C;
    let (refused, denied) = match err.rdkafka_error_code() {
        Some(
            C::TopicAuthorizationFailed
            | C::GroupAuthorizationFailed
            | C::ClusterAuthorizationFailed
            | C::TransactionalIdAuthorizationFailed
            | C::DelegationTokenAuthorizationFailed
            | C::SaslAuthenticationFailed,
        ) => (true, true),
        Some(
            C::OffsetMetadataTooLarge
            | C::InvalidCommitOffsetSize
            | C::InvalidTopic
            | C::InvalidGroupId
            | C::IllegalGeneration
            | C::UnknownMemberId
            | C::UnsupportedVersion
            | C::InvalidRequest
            | C::InvalidPartitions
            | C::GroupIdNotFound,
        ) => (true, false),
        _ => (false, false),
    };
    if refused {
        metrics::counter!(crate::metrics::KAFKA_ERRORS, "operation" => operation).increment(1);
        LeaseError::KafkaRefused {
            operation,
            detail: err.to_string(),
            denied,
        }
    } else {
        unavailable(operation, err)
    }
}

impl From<LeaseError> for Failure {
    fn from(error: LeaseError) -> Self {
        Failure {
            error,
            transient: false,
        }
    }
}

/// Runs a blocking broker request on the blocking pool, again and again while it fails with
/// a transient broker state, until `budget` has passed since the first attempt. The last
/// error is returned once the budget is spent.
async fn retrying<T: Send + 'static>(
    operation: &'static str,
    budget: Duration,
    f: impl Fn() -> Result<T, Failure> + Send + Sync + 'static,
) -> Result<T, LeaseError> {
    let f = Arc::new(f);
    let deadline = tokio::time::Instant::now() + budget;
    let mut pause = Duration::from_millis(50);
    loop {
        let attempt = f.clone();
        let outcome = tokio::task::spawn_blocking(move || attempt())
            .await
            .map_err(|e| unavailable(operation, format!("blocking task failed: {e}")))?;
        match outcome {
            Ok(value) => return Ok(value),
            Err(failure) if failure.transient && tokio::time::Instant::now() + pause < deadline => {
                tracing::debug!(operation, error = %failure.error, retry_in = ?pause, "transient broker state; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(500));
            }
            Err(failure) => return Err(failure.error),
        }
    }
}

/// A group client and since when no lease uses it.
struct CachedGroup {
    client: Arc<GroupClient>,
    idle_since: Option<tokio::time::Instant>,
}

/// The gateway's Kafka clients: one metadata client, and one [`GroupClient`] per group that
/// has leases on this instance (kept for [`IDLE_GROUP_CLIENT`] after its last lease).
#[derive(Clone)]
pub struct Kafka {
    settings: Arc<KafkaSettings>,
    metadata: Arc<BaseConsumer<ClientLog>>,
    groups: Arc<Mutex<HashMap<String, CachedGroup>>>,
    /// Topic → its partition count and when it was read (see [`Kafka::partition_count`]).
    partition_counts: Arc<Mutex<HashMap<String, (i32, tokio::time::Instant)>>>,
}

/// How long a topic's partition count is reused before it is read from the brokers again
/// (the default of [`KafkaSettings::partition_count_max_age`]). Partitions are only ever
/// added, and a partition past the cached count is read afresh.
const PARTITION_COUNT_MAX_AGE: Duration = Duration::from_secs(5);

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
        Ok(Self {
            settings: Arc::new(settings),
            metadata,
            groups,
            partition_counts: Arc::default(),
        })
    }

    pub fn settings(&self) -> &KafkaSettings {
        &self.settings
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
                tracing::debug!(%topic, count, %detail, operation, "using the partition count read before");
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
        let client = self.metadata.clone();
        let timeout = self.settings.request_timeout.min(Duration::from_secs(2));
        blocking("checking broker reachability", move || {
            let metadata = client
                .fetch_metadata(None, timeout)
                .map_err(|e| unavailable("checking broker reachability", e))?;
            if metadata.brokers().is_empty() {
                return Err(unavailable(
                    "checking broker reachability",
                    "no brokers in metadata",
                ));
            }
            Ok(())
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
                idle_since: None,
            },
        );
        Ok(client)
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

type LeaseConsumer = StreamConsumer<ClientLog>;

/// One consumer-group's client: reads the group's leased partitions and stores its offsets.
pub struct GroupClient {
    group: String,
    consumer: Arc<LeaseConsumer>,
    request_timeout: Duration,
    /// Topics this client looked up, and when (see [`GroupClient::learn_topic`]).
    topics: Mutex<HashMap<String, tokio::time::Instant>>,
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
    fn new(settings: &KafkaSettings, group: &str) -> Result<Self, LeaseError> {
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
            poller,
        })
    }

    pub fn group(&self) -> &str {
        &self.group
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

    /// Stores `offset` with `metadata` as the group's committed offset, synchronously.
    pub async fn commit(
        &self,
        topic: &str,
        partition: i32,
        offset: i64,
        metadata: String,
        in_flight: impl Send + 'static,
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
            consumer
                .commit(&list, CommitMode::Sync)
                .map_err(|e| kafka_error(OPERATION, e))
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

    /// Starts fetching `topic`/`partition` at `offset` into a queue of its own.
    pub fn open_partition(
        self: &Arc<Self>,
        topic: &str,
        partition: i32,
        offset: i64,
    ) -> Result<PartitionFeed, LeaseError> {
        // Split before assigning, so no record can reach the shared main queue.
        let queue = self
            .consumer
            .split_partition_queue(topic, partition)
            .ok_or_else(|| {
                unavailable("opening a partition queue", "librdkafka refused the queue")
            })?;
        let mut list = TopicPartitionList::new();
        list.add_partition_offset(topic, partition, Offset::Offset(offset))
            .map_err(|e| unavailable("assigning a partition", e))?;
        self.consumer
            .incremental_assign(&list)
            .map_err(|e| unavailable("assigning a partition", e))?;
        Ok(PartitionFeed {
            client: self.clone(),
            topic: topic.to_string(),
            topic_c: CString::new(topic).ok(),
            partition,
            queue,
            pulled_up_to: offset,
            pending: None,
            batch_hint: 0,
            spare: bytes::BytesMut::new(),
        })
    }

    /// The high watermark librdkafka last saw in a fetch response, without a request.
    pub fn cached_high_watermark(&self, topic: &str, partition: i32) -> Option<i64> {
        self.cached_high_watermark_of(&CString::new(topic).ok()?, partition)
    }

    /// [`Self::cached_high_watermark`] for a topic name already made a C string (the Read
    /// path asks once per batch, without allocating).
    #[allow(unsafe_code)]
    fn cached_high_watermark_of(&self, topic: &CStr, partition: i32) -> Option<i64> {
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

/// A leased partition's records, as they arrive from the group client. Dropping it stops the
/// fetching of that partition.
pub struct PartitionFeed {
    client: Arc<GroupClient>,
    topic: String,
    /// `topic` for librdkafka's C API (never absent: topic names are validated).
    topic_c: Option<CString>,
    partition: i32,
    queue: StreamPartitionQueue<ClientLog>,
    /// The offset after the last record taken from the queue: where the queue stands.
    pulled_up_to: i64,
    /// A record taken from the queue but not delivered (it did not fit in a batch), with the
    /// lease position it follows.
    pending: Option<(OwnedMessage, i64)>,
    /// The size of the last batch filled from this partition: the next batch's buffer
    /// starts this large, so that a drain's batches are written once, not grown by copying.
    batch_hint: usize,
    /// The last batch's allocation (empty, sharing it with the response being sent): the
    /// next batch takes it back once that response is dropped, so a lease holds at most one
    /// batch buffer between batches (within the per-lease bound, `max_bytes`).
    spare: bytes::BytesMut,
}

impl std::fmt::Debug for PartitionFeed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartitionFeed")
            .field("topic", &self.topic)
            .field("partition", &self.partition)
            .field("pulled_up_to", &self.pulled_up_to)
            .finish()
    }
}

impl Drop for PartitionFeed {
    fn drop(&mut self) {
        let mut list = TopicPartitionList::new();
        if list
            .add_partition_offset(&self.topic, self.partition, Offset::Invalid)
            .is_ok()
        {
            if let Err(err) = self.client.consumer.incremental_unassign(&list) {
                tracing::warn!(topic = %self.topic, partition = self.partition, error = %err, "unassign failed");
            }
        }
    }
}

impl PartitionFeed {
    pub fn client(&self) -> &Arc<GroupClient> {
        &self.client
    }

    /// Makes the next record taken be the first at or after `position`. Records pulled but
    /// not delivered (a Read that ended mid-batch, a Seek) put the queue ahead of the lease;
    /// this repositions librdkafka, which purges what it pre-fetched from the old position.
    pub async fn align(&mut self, position: i64) -> Result<(), LeaseError> {
        match &self.pending {
            Some((_, put_back_at)) if *put_back_at == position => return Ok(()),
            None if self.pulled_up_to == position => return Ok(()),
            _ => {}
        }
        self.pending = None;
        let consumer = self.client.consumer.clone();
        let topic = self.topic.clone();
        let partition = self.partition;
        let timeout = self.client.request_timeout;
        blocking("seeking", move || {
            consumer
                .seek(&topic, partition, Offset::Offset(position), timeout)
                .map_err(|e| unavailable("seeking", e))
        })
        .await?;
        self.pulled_up_to = position;
        Ok(())
    }

    /// Adds to `batch` what librdkafka already holds for the partition, without waiting or
    /// arming a timer (the per-record fast path: one look at the queue per record). False
    /// once the batch is full.
    pub fn take_queued(
        &mut self,
        batch: &mut EncodedRecords,
        from: i64,
        limits: BatchLimits,
    ) -> bool {
        if let Some((message, _)) = self.pending.take() {
            if !add(&mut self.pending, batch, &message, from, limits) {
                return false;
            }
        }
        // One message stream for the whole look: each stream registers a waker slot with
        // rdkafka (under its lock) when made and frees it when dropped, which per record
        // would cost more than the record.
        let mut stream = self.queue.stream();
        loop {
            let message = match stream.next().now_or_never() {
                None => return true,
                Some(None) => unreachable!("a partition queue's stream never ends"),
                Some(Some(Ok(message))) => message,
                Some(Some(Err(err))) => {
                    log_fetch_error(&self.topic, self.partition, &err);
                    continue;
                }
            };
            self.pulled_up_to = message.offset() + 1;
            if !add(&mut self.pending, batch, &message, from, limits) {
                return false;
            }
        }
    }

    /// Waits for the next record and adds it to `batch`; false once the batch is full.
    /// Cancel-safe: a record leaves the queue only in the poll that adds it. Transient fetch
    /// errors are logged and waited out.
    pub async fn take_next(
        &mut self,
        batch: &mut EncodedRecords,
        from: i64,
        limits: BatchLimits,
    ) -> bool {
        if self.pending.is_some() {
            return self.take_queued(batch, from, limits);
        }
        loop {
            // Look again every REPOLL even without a wake-up: a split partition queue can
            // miss the wake-up for records that arrive just as it is polled (rust-rdkafka
            // issue #665), and a missed one then costs at most this. (The one-second
            // first-record delays once blamed on it had another cause: see `learn_topic`.)
            match tokio::time::timeout(REPOLL, self.queue.recv()).await {
                Ok(Ok(message)) => {
                    self.pulled_up_to = message.offset() + 1;
                    return add(&mut self.pending, batch, &message, from, limits);
                }
                Ok(Err(err)) => self.log_fetch_error(&err),
                Err(_) => {}
            }
        }
    }

    /// A buffer for the next batch, sized as the last one was (within `limits`), in the last
    /// batch's allocation when its response is gone.
    pub fn new_batch(&mut self, limits: BatchLimits) -> EncodedRecords {
        EncodedRecords::reusing(
            std::mem::take(&mut self.spare),
            self.batch_hint.min(limits.max_bytes),
        )
    }

    /// Notes the size of a filled batch and keeps a handle on its allocation, for
    /// [`Self::new_batch`].
    pub fn filled(&mut self, batch: &mut EncodedRecords) {
        self.batch_hint = batch.wire_len();
        self.spare = batch.split_spare();
    }

    /// Whether every record up to the high watermark librdkafka last saw has been taken:
    /// a batch need not wait for more.
    pub fn caught_up(&self) -> bool {
        self.pending.is_none()
            && self
                .cached_high_watermark()
                .is_some_and(|high| self.pulled_up_to >= high)
    }

    fn log_fetch_error(&self, err: &KafkaError) {
        log_fetch_error(&self.topic, self.partition, err);
    }

    /// The high watermark as librdkafka last saw it, if it has seen one.
    pub fn cached_high_watermark(&self) -> Option<i64> {
        self.client
            .cached_high_watermark_of(self.topic_c.as_deref()?, self.partition)
    }
}

fn log_fetch_error(topic: &str, partition: i32, err: &KafkaError) {
    tracing::warn!(%topic, partition, error = %err, "fetch error; librdkafka retries");
}

/// How much a batch may hold.
#[derive(Clone, Copy, Debug)]
pub struct BatchLimits {
    pub max_records: usize,
    /// Bytes for the records on the wire (see [`EncodedRecords::wire_len`]).
    pub max_bytes: usize,
}

/// A message that can be kept past the queue's borrow.
trait Keep: Message {
    fn keep(&self) -> OwnedMessage;
}

impl Keep for BorrowedMessage<'_> {
    fn keep(&self) -> OwnedMessage {
        self.detach()
    }
}

impl Keep for OwnedMessage {
    fn keep(&self) -> OwnedMessage {
        self.clone()
    }
}

/// Adds `message` to `batch`, which starts at `from`; false once the batch is full. A
/// record that does not fit is kept in `pending`, to start the next batch; a record before
/// the batch's next offset (pre-fetched before a reposition) is dropped, never delivered
/// twice. The first record always fits, so a record larger than `max_bytes` goes alone.
fn add<M: Keep>(
    pending: &mut Option<(OwnedMessage, i64)>,
    batch: &mut EncodedRecords,
    message: &M,
    from: i64,
    limits: BatchLimits,
) -> bool {
    let expected = batch.last_offset().map_or(from, |last| last + 1);
    if message.offset() < expected {
        return true;
    }
    let prepared = Prepared::of(message);
    if !batch.is_empty() && batch.wire_len() + prepared.wire_len() > limits.max_bytes {
        *pending = Some((message.keep(), expected));
        return false;
    }
    batch.push(&prepared);
    batch.wire_len() < limits.max_bytes && batch.len() < limits.max_records
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::types::RDKafkaConfRes;

    fn settings_with(options: &[(&str, &str)]) -> KafkaSettings {
        let mut settings = KafkaSettings::new("127.0.0.1:9", "test");
        for (k, v) in options {
            settings.options.set(*k, *v);
        }
        settings
    }

    fn creation_failure(options: &[(&str, &str)]) -> String {
        match Kafka::new(settings_with(options)) {
            Ok(_) => panic!("{options:?} must be refused"),
            Err(err) => {
                println!("{err}");
                err.to_string()
            }
        }
    }

    #[tokio::test]
    async fn client_creation_errors_never_quote_a_property_value() {
        // A secret under a misspelt key: rdkafka's error appends the value it refused.
        let err = creation_failure(&[("sasl.pasword", "typo-S3cr3t")]);
        assert!(err.contains("sasl.pasword"), "{err}");
        assert!(!err.contains("typo-S3cr3t"), "{err}");
        // librdkafka's own text quotes an invalid value: a secret's is masked.
        let err = creation_failure(&[("sasl.password", "S3cr3t"), ("socket.timeout.ms", "S3cr3t")]);
        assert!(err.contains("socket.timeout.ms"), "{err}");
        assert!(!err.contains("S3cr3t"), "{err}");
        // A private key librdkafka cannot load.
        let err = creation_failure(&[
            ("security.protocol", "ssl"),
            ("ssl.key.pem", "not-a-pem-S3cr3t"),
            ("ssl.key.password", "pw-S3cr3t"),
        ]);
        assert!(!err.contains("S3cr3t"), "{err}");
    }

    #[test]
    fn a_configuration_error_is_told_by_key_with_secret_values_masked() {
        let settings = settings_with(&[("sasl.password", "S3cr3t"), ("client.rack", "r1")]);
        let err = KafkaError::ClientConfig(
            RDKafkaConfRes::RD_KAFKA_CONF_INVALID,
            "Invalid value \"S3cr3t\" for configuration property \"sasl.password\"".into(),
            "sasl.password".into(),
            "S3cr3t".into(),
        );
        let text = settings.creation_error(&err);
        assert!(!text.contains("S3cr3t"), "{text}");
        assert!(
            text.contains("\"sasl.password\"") && text.contains("***"),
            "{text}"
        );
        let err = KafkaError::ClientCreation("failed to load S3cr3t".into());
        assert_eq!(
            settings.creation_error(&err),
            "Client creation error: failed to load ***"
        );
    }

    #[test]
    fn settings_debug_hides_secret_values() {
        let settings = settings_with(&[("sasl.password", "S3cr3t"), ("sasl.username", "svc")]);
        let debug = format!("{settings:?}");
        assert!(!debug.contains("S3cr3t"), "{debug}");
        assert!(debug.contains("svc"), "{debug}");
    }
}
