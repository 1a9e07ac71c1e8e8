//! The in-process gRPC rig: the real server (`server::serve`, as `kafka-lease serve` and `dev`
//! run it: health, reflection, the lease service, the peer service, authorization and the
//! connection limits) on `127.0.0.1:0`, one or more instances over librdkafka's mock cluster
//! and one shared in-memory lock store. Clients reach it over real TCP connections.
//!
//! ```ignore
//! let rig = Rig::two().await;                       // instances A and B
//! let rig = Rig::one().leases_per_connection(1).long_calls_per_connection(2).await;
//! let client = rig.client(A).await;
//! ```
//!
//! Every instance advertises its address in the lock store, so a call on a lease one instance
//! serves, made through another, is forwarded as between real instances. Dropping the rig
//! shuts the instances down (gracefully, on the multi-threaded runtime the tests use), then
//! the mock cluster.

#![allow(dead_code, unreachable_pub)]

use std::future::{Future, IntoFuture};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use kafka_lease_client::Client;
use kafka_lease_server::auth::{Auth, AuthFiles};
use kafka_lease_server::calls::ConnectionLimits;
use kafka_lease_server::coordination::memory::{MemoryLockStore, MemoryLocks};
use kafka_lease_server::dev::DevKafka;
use kafka_lease_server::gateway::{Gateway, Limits};
use kafka_lease_server::server::{serve, ServeOptions, ServerError};
use kafka_lease_testkit::unique_name;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::FutureProducer;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::Channel;
use tonic_health::pb::health_client::HealthClient;
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;

/// The first instance of a rig.
pub const A: usize = 0;
/// The second instance of a [`Rig::two`].
pub const B: usize = 1;

/// Records per partition of the sample topic (`dev::DEMO_TOPIC`, 4 partitions).
pub const SAMPLE_RECORDS: u32 = 10;

/// How long any condition in this tier may take: far above what it needs.
pub const DEADLINE: Duration = Duration::from_secs(10);

/// What a rig is made of, stated once: how many instances, and their limits and policy.
#[derive(Debug, Clone)]
pub struct RigBuilder {
    instances: usize,
    sample_records: u32,
    max_groups: usize,
    limits: Limits,
    long_calls: Option<u32>,
    policy: Option<(String, Vec<(String, String)>)>,
}

/// A running rig. Dropping it shuts every instance down, then the mock cluster.
pub struct Rig {
    nodes: Vec<Node>,
    /// The lock table every instance shares, as they would share Consul.
    pub store: MemoryLockStore,
    /// The policy and tokens files, if any.
    scratch: Option<PathBuf>,
    /// Last: the servers' Kafka clients go before the cluster they talk to.
    kafka: DevKafka,
}

/// One gateway instance of a rig.
pub struct Node {
    pub instance: String,
    pub addr: SocketAddr,
    pub gateway: Arc<Gateway>,
    pub locks: Arc<MemoryLocks>,
    stop: Option<oneshot::Sender<()>>,
    server: JoinHandle<Result<(), ServerError>>,
}

impl std::fmt::Debug for Rig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rig")
            .field(
                "instances",
                &self
                    .nodes
                    .iter()
                    .map(|n| (&n.instance, n.addr))
                    .collect::<Vec<_>>(),
            )
            .field("kafka", &self.kafka)
            .finish()
    }
}

impl Rig {
    /// One instance.
    pub fn one() -> RigBuilder {
        RigBuilder::new(1)
    }

    /// Two instances, A and B, sharing the lock store: each forwards to the other.
    pub fn two() -> RigBuilder {
        RigBuilder::new(2)
    }

    pub fn node(&self, instance: usize) -> &Node {
        &self.nodes[instance]
    }

    /// Instance A's gateway, for tests of the lease rules in domain terms.
    pub fn gateway(&self) -> &Arc<Gateway> {
        &self.nodes[A].gateway
    }

    /// Instance A's lock backend.
    pub fn locks(&self) -> &Arc<MemoryLocks> {
        &self.nodes[A].locks
    }

    /// The mock cluster, for injecting broker errors.
    pub fn mock(
        &self,
    ) -> &rdkafka::mocking::MockCluster<'static, rdkafka::producer::DefaultProducerContext> {
        self.kafka.mock()
    }

    /// `http://host:port` of an instance.
    pub fn endpoint(&self, instance: usize) -> String {
        format!("http://{}", self.nodes[instance].addr)
    }

    /// A client of an instance, on a connection of its own.
    pub async fn client(&self, instance: usize) -> Client {
        Client::connect(self.endpoint(instance))
            .await
            .expect("connect to the rig")
    }

    /// A channel to an instance, for the standard services' stubs.
    pub async fn channel(&self, instance: usize) -> Channel {
        tonic::transport::Endpoint::from_shared(self.endpoint(instance))
            .expect("endpoint")
            .connect()
            .await
            .expect("connect to the rig")
    }

    pub async fn health(&self, instance: usize) -> HealthClient<Channel> {
        HealthClient::new(self.channel(instance).await)
    }

    pub async fn reflection(&self, instance: usize) -> ServerReflectionClient<Channel> {
        ServerReflectionClient::new(self.channel(instance).await)
    }

    /// A topic of the test's own with `partitions` partitions and no records.
    pub fn create_topic(&self, partitions: i32) -> String {
        let topic = unique_name("topic");
        self.kafka
            .mock()
            .create_topic(&topic, partitions, 1)
            .expect("create a topic in the mock cluster");
        topic
    }

    /// Produces `records` to one partition, in order; their offsets.
    pub async fn produce(&self, topic: &str, partition: i32, records: &[TestRecord]) -> Vec<i64> {
        let producer: FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", self.kafka.bootstrap_servers())
            .set("linger.ms", "1")
            .create()
            .expect("producer");
        let mut offsets = Vec::new();
        // One at a time: the offsets are the order the test gave.
        for r in records {
            let delivered = producer
                .send(r.to_record(topic, partition), Duration::from_secs(5))
                .await
                .map_err(|(e, _)| e)
                .expect("produce to the mock cluster");
            offsets.push(delivered.offset);
        }
        offsets
    }

    /// Produces `count` records `v<i>` to one partition.
    pub async fn produce_n(&self, topic: &str, partition: i32, count: usize) -> Vec<i64> {
        let records: Vec<TestRecord> = (0..count)
            .map(|i| TestRecord::value(format!("v{i}")))
            .collect();
        self.produce(topic, partition, &records).await
    }

    /// The group's committed offset and metadata for a partition, as the cluster has it.
    pub async fn committed(
        &self,
        group: &str,
        topic: &str,
        partition: i32,
    ) -> Option<(i64, String)> {
        let bootstrap = self.kafka.bootstrap_servers();
        let (group, topic) = (group.to_string(), topic.to_string());
        tokio::task::spawn_blocking(move || {
            let consumer: BaseConsumer = ClientConfig::new()
                .set("bootstrap.servers", bootstrap)
                .set("group.id", &group)
                .create()
                .expect("consumer");
            let mut list = TopicPartitionList::new();
            list.add_partition(&topic, partition);
            let committed = consumer
                .committed_offsets(list, Duration::from_secs(5))
                .expect("offset fetch");
            let entry = committed.find_partition(&topic, partition)?;
            match entry.offset() {
                Offset::Offset(o) => Some((o, entry.metadata().to_string())),
                _ => None,
            }
        })
        .await
        .expect("offset fetch task")
    }
}

impl Rig {
    /// Stops every instance as `serve` does on SIGTERM (health NOT_SERVING, every lease
    /// ended and its lock released, the server stopped), then closes its Kafka clients,
    /// while the mock cluster still answers: a request in flight when it went would wait
    /// out its timeout.
    async fn shut_down(&mut self) {
        for node in &mut self.nodes {
            if let Some(stop) = node.stop.take() {
                let _ = stop.send(());
            }
        }
        for node in &mut self.nodes {
            let _ = tokio::time::timeout(Duration::from_secs(5), &mut node.server).await;
        }
        for node in &self.nodes {
            node.gateway.kafka().close().await;
        }
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        // On a multi-threaded runtime (every test of this tier) the instances shut down
        // gracefully; elsewhere, or while a failed test unwinds, they are cut off.
        let graceful = !std::thread::panicking()
            && tokio::runtime::Handle::try_current().is_ok_and(|handle| {
                handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread
            });
        if graceful {
            tokio::task::block_in_place(|| {
                tokio::runtime::Handle::current().block_on(self.shut_down());
            });
        }
        for node in &self.nodes {
            node.server.abort();
        }
        if let Some(dir) = &self.scratch {
            let _ = std::fs::remove_dir_all(dir);
        }
        // The mock cluster, a field, goes after this.
    }
}

impl RigBuilder {
    fn new(instances: usize) -> Self {
        RigBuilder {
            instances,
            sample_records: SAMPLE_RECORDS,
            max_groups: kafka_lease_server::kafka::DEFAULT_MAX_GROUPS,
            limits: Limits::default(),
            long_calls: None,
            policy: None,
        }
    }

    /// Records per partition of the sample topic (default [`SAMPLE_RECORDS`]).
    pub fn sample_records(mut self, records: u32) -> Self {
        self.sample_records = records;
        self
    }

    /// `--max-leases`, `--max-waiting-acquires` and `--max-leases-per-connection`.
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// `--max-groups`.
    pub fn max_groups(mut self, max_groups: usize) -> Self {
        self.max_groups = max_groups;
        self
    }

    /// `--max-leases-per-connection`.
    pub fn leases_per_connection(mut self, limit: usize) -> Self {
        self.limits.max_leases_per_connection = limit;
        self
    }

    /// `--max-long-calls-per-connection`.
    pub fn long_calls_per_connection(mut self, limit: u32) -> Self {
        self.long_calls = Some(limit);
        self
    }

    /// `--auth-policy` with this policy (TOML) and `--auth-tokens-file` with these
    /// `(identity, token)` pairs.
    pub fn policy(mut self, policy: &str, tokens: &[(&str, &str)]) -> Self {
        let tokens = tokens
            .iter()
            .map(|(identity, token)| (identity.to_string(), token.to_string()))
            .collect();
        self.policy = Some((policy.to_string(), tokens));
        self
    }

    pub async fn start(self) -> Rig {
        let kafka = DevKafka::start(self.sample_records)
            .await
            .expect("the mock cluster");
        let (auth, scratch) = match &self.policy {
            Some((policy, tokens)) => {
                let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(unique_name("rig"));
                std::fs::create_dir_all(&dir).expect("scratch dir");
                let files = AuthFiles {
                    policy: Some(dir.join("policy.toml")),
                    tokens: Some(dir.join("tokens")),
                };
                std::fs::write(dir.join("policy.toml"), policy).expect("policy file");
                let lines: String = tokens
                    .iter()
                    .map(|(identity, token)| format!("{identity} {token}\n"))
                    .collect();
                std::fs::write(dir.join("tokens"), lines).expect("tokens file");
                let auth = Auth::load(&files, None).expect("the policy and tokens load");
                (Arc::new(auth), Some(dir))
            }
            None => (Auth::open(), None),
        };
        let connection_limits = ConnectionLimits::derive(
            u32::try_from(self.limits.max_leases_per_connection).unwrap_or(u32::MAX),
            u32::try_from(self.limits.max_waiting_acquires).unwrap_or(u32::MAX),
            self.long_calls,
            None,
        )
        .expect("connection limits");
        let store = MemoryLockStore::new();
        let mut nodes = Vec::new();
        for letter in ['a', 'b', 'c', 'd'].into_iter().take(self.instances) {
            let instance = unique_name(&format!("gw-{letter}"));
            let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            let addr = listener.local_addr().expect("bound address");
            let (gateway, locks) = kafka_lease_server::dev::gateway(
                &kafka,
                &store,
                &instance,
                Some(&addr.to_string()),
                self.limits,
                self.max_groups,
            )
            .expect("an in-process gateway");
            let options = ServeOptions {
                grace: Duration::from_secs(2),
                connection_limits,
                auth: auth.clone(),
                ..ServeOptions::default()
            };
            let (stop, stopped) = oneshot::channel::<()>();
            let server = tokio::spawn(serve(
                listener,
                gateway.clone(),
                async {
                    let _ = stopped.await;
                },
                options,
            ));
            nodes.push(Node {
                instance,
                addr,
                gateway,
                locks,
                stop: Some(stop),
                server,
            });
        }
        Rig {
            nodes,
            store,
            scratch,
            kafka,
        }
    }
}

impl IntoFuture for RigBuilder {
    type Output = Rig;
    type IntoFuture = Pin<Box<dyn Future<Output = Rig>>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.start())
    }
}

pub use kafka_lease_testkit::TestRecord;
