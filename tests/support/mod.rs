//! Shared pieces of the end-to-end tests: the real `kafka-lease` binary as a child process,
//! topics and records on the real broker, and the lock keys in the real Consul.

#![allow(dead_code, unreachable_pub)]

use std::path::PathBuf;
use std::time::Duration;

use consulrs::api::kv::requests::ReadKeyRequest;
use consulrs::client::{ConsulClient, ConsulClientSettingsBuilder};
use kafka_lease_client::Client;
use kafka_lease_testkit::{unique_name, Services};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::FutureProducer;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

/// A `kafka-lease serve` process on 127.0.0.1 with a port of its own: the shared launcher
/// ([`kafka_lease_testkit::GatewayProcess`]) with the test services' addresses, panicking
/// with the gateway's log on failure.
pub struct GatewayProcess {
    inner: kafka_lease_testkit::GatewayProcess,
    pub addr: String,
    pub instance: String,
    pub log_path: PathBuf,
}

impl GatewayProcess {
    /// Starts the real binary against the test services, with lock keys under `prefix`, and
    /// waits until it listens. `extra` may name another `--kafka` or `--consul`.
    pub async fn start(services: &Services, prefix: &str, instance: &str, extra: &[&str]) -> Self {
        let log_path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{instance}.log"));
        // The test services unless `extra` names others (a relay, an agent of the test's own).
        let mut args = Vec::new();
        for (flag, value) in [
            ("--kafka", &services.kafka_bootstrap),
            ("--consul", &services.consul_http_addr),
        ] {
            if !extra.contains(&flag) {
                args.extend([flag, value.as_str()]);
            }
        }
        args.extend([
            "--consul-prefix",
            prefix,
            "--log",
            "info,kafka_lease_server=debug",
        ]);
        args.extend_from_slice(extra);
        let inner = kafka_lease_testkit::GatewayProcess::spawn(
            std::path::Path::new(env!("CARGO_BIN_EXE_kafka-lease")),
            &args,
            instance,
            log_path,
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        Self {
            addr: inner.addr.clone(),
            instance: inner.instance.clone(),
            log_path: inner.log_path.clone(),
            inner,
        }
    }

    pub fn endpoint(&self) -> String {
        self.inner.endpoint()
    }

    pub async fn client(&self) -> Client {
        Client::connect(self.endpoint())
            .await
            .expect("connect to the gateway")
    }

    pub fn pid(&self) -> u32 {
        self.inner.pid()
    }

    /// Sends a signal (`TERM`, `KILL`, `STOP`, `CONT`) to the gateway process.
    pub fn signal(&self, signal: &str) {
        self.inner.signal(signal).unwrap_or_else(|e| panic!("{e}"));
    }

    /// Waits for the process to exit and returns its exit code.
    pub async fn wait_exit(&mut self, deadline: Duration) -> Option<i32> {
        self.inner
            .wait_exit(deadline)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// A gRPC health client for the gateway.
    pub async fn health(&self) -> HealthClient<Channel> {
        let channel = tonic::transport::Endpoint::from_shared(self.endpoint())
            .expect("endpoint")
            .connect()
            .await
            .expect("connect");
        HealthClient::new(channel)
    }

    pub fn log(&self) -> String {
        self.inner.log()
    }

    /// Everything the gateway printed on stdout so far.
    pub fn stdout(&self) -> String {
        self.inner.stdout()
    }

    /// The Prometheus endpoint of a gateway started with `--metrics-listen 127.0.0.1:0`, as
    /// its log names it.
    pub fn metrics_endpoint(&self) -> String {
        let log = self.log();
        log.split_whitespace()
            .find_map(|w| {
                let w = w.trim_start_matches("endpoint=");
                (w.starts_with("http://") && w.ends_with("/metrics")).then(|| w.to_string())
            })
            .unwrap_or_else(|| panic!("no metrics endpoint in the gateway's log:\n{log}"))
    }
}

/// Waits until the gateway reports `want` for `service` ("" is the whole server); returns
/// the status as the wire carries it.
pub async fn wait_health(
    health: &HealthClient<Channel>,
    service: &str,
    want: ServingStatus,
    deadline: Duration,
) -> i32 {
    kafka_lease_testkit::wait_for(
        &format!("health {want:?} for {service:?}"),
        deadline,
        || {
            let mut health = health.clone();
            let service = service.to_string();
            async move {
                let status = health
                    .check(HealthCheckRequest { service })
                    .await
                    .ok()?
                    .into_inner()
                    .status;
                (status == want as i32).then_some(status)
            }
        },
    )
    .await
}

/// Runs `scripts/services <command>` (e.g. `stop-consul`, `start-kafka`) for an outage test,
/// without blocking the test's runtime: a broker start can take longer under load than the
/// gateway's HTTP/2 keepalive timeout (20 s), and a runtime blocked that long cannot answer
/// its pings, so the gateway would close the test's connection.
pub async fn services_script(services: &Services, command: &str) {
    let script = services.var("KAFKA_LEASE_SERVICES_SCRIPT").to_string();
    let command = command.to_string();
    let status = tokio::process::Command::new(script)
        .arg(&command)
        .status()
        .await
        .expect("run scripts/services");
    assert!(status.success(), "scripts/services {command} failed");
}

/// A relay in front of the test Consul agent's HTTP API (to cut, hold or fail its traffic),
/// and its `http://` address for a gateway's `--consul`.
pub async fn consul_relay(services: &Services) -> (kafka_lease_testkit::Relay, String) {
    let consul = services
        .consul_http_addr
        .trim_start_matches("http://")
        .parse()
        .expect("consul address");
    let relay = kafka_lease_testkit::Relay::start(consul)
        .await
        .expect("relay to Consul");
    let addr = format!("http://{}", relay.addr());
    (relay, addr)
}

/// The broker's `RELAYED` listener advertises one fixed port, so one test at a time relays
/// it (the test binaries run one after another).
static RELAYED_PORT: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn loopback(port: &str) -> std::net::SocketAddr {
    std::net::SocketAddr::from(([127, 0, 0, 1], port.parse().expect("a port number")))
}

/// A relay on the broker's advertised `RELAYED` port, with the guard that keeps it this
/// test's until the end: a gateway started with `--kafka <relay address>` reaches Kafka only
/// through it, so every byte it sends Kafka can be held.
pub async fn relay_kafka(
    services: &Services,
) -> (
    tokio::sync::MutexGuard<'static, ()>,
    kafka_lease_testkit::Relay,
) {
    let guard = RELAYED_PORT.lock().await;
    let relay = kafka_lease_testkit::Relay::start_at(
        loopback(services.var("KAFKA_LEASE_KAFKA_RELAYED_ADVERTISED_PORT")),
        loopback(services.var("KAFKA_LEASE_KAFKA_RELAYED_LISTEN_PORT")),
    )
    .await
    .expect("a relay on the broker's advertised RELAYED port");
    (guard, relay)
}

/// A fresh Consul key prefix for one test, so tests never see each other's locks.
pub fn unique_prefix() -> String {
    format!("kafka-lease-test/{}", unique_name("p"))
}

/// Creates a topic with `partitions` partitions and returns its name.
pub async fn create_topic(services: &Services, partitions: i32) -> String {
    let topic = unique_name("topic");
    kafka_lease_testkit::create_topic(&services.kafka_bootstrap, &topic, partitions)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    topic
}

pub use kafka_lease_testkit::TestRecord;

pub fn producer(services: &Services) -> FutureProducer {
    ClientConfig::new()
        .set("bootstrap.servers", &services.kafka_bootstrap)
        .set("linger.ms", "2")
        .set("enable.idempotence", "true")
        .create()
        .expect("producer")
}

/// Produces `records` to one partition, in order, and returns their offsets.
pub async fn produce(
    producer: &FutureProducer,
    topic: &str,
    partition: i32,
    records: &[TestRecord],
) -> Vec<i64> {
    let sends = records
        .iter()
        .map(|r| producer.send(r.to_record(topic, partition), Duration::from_secs(10)));
    futures::future::join_all(sends)
        .await
        .into_iter()
        .map(|r| r.map_err(|(e, _)| e).expect("produce").offset)
        .collect()
}

/// Produces `count` plain records `v<i>` to a partition.
pub async fn produce_n(
    producer: &FutureProducer,
    topic: &str,
    partition: i32,
    count: usize,
) -> Vec<i64> {
    let records: Vec<TestRecord> = (0..count)
        .map(|i| TestRecord::value(format!("v{i}")))
        .collect();
    produce(producer, topic, partition, &records).await
}

/// The group's committed offset and metadata for a partition, as Kafka's coordinator has it.
pub fn kafka_committed(
    services: &Services,
    group: &str,
    topic: &str,
    partition: i32,
) -> Option<(i64, String)> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &services.kafka_bootstrap)
        .set("group.id", group)
        .create()
        .expect("consumer");
    let mut list = TopicPartitionList::new();
    list.add_partition(topic, partition);
    let committed = consumer
        .committed_offsets(list, Duration::from_secs(10))
        .expect("offset fetch");
    let entry = committed.find_partition(topic, partition)?;
    match entry.offset() {
        Offset::Offset(o) => Some((o, entry.metadata().to_string())),
        _ => None,
    }
}

pub fn consul(services: &Services) -> ConsulClient {
    ConsulClient::new(
        ConsulClientSettingsBuilder::default()
            .address(&services.consul_http_addr)
            .build()
            .expect("consul settings"),
    )
    .expect("consul client")
}

/// Every lock key under `prefix` with its session and raw value, sorted: what an operator
/// sees (the instances' own records, under `<prefix>/~instances/`, left out).
pub async fn consul_keys(
    services: &Services,
    prefix: &str,
) -> Vec<(String, Option<String>, String)> {
    let client = consul(services);
    match consulrs::kv::read(
        &client,
        &format!("{prefix}/"),
        Some(ReadKeyRequest::builder().recurse(true)),
    )
    .await
    {
        Ok(response) => {
            let records = format!("{prefix}/~instances/");
            let mut keys: Vec<_> = response
                .response
                .into_iter()
                .filter(|pair| !pair.key.starts_with(&records))
                .map(|pair| {
                    let value = pair
                        .value
                        .and_then(|v| {
                            let bytes: Result<Vec<u8>, _> = v.try_into();
                            bytes.ok()
                        })
                        .map(|b| String::from_utf8_lossy(&b).to_string())
                        .unwrap_or_default();
                    (pair.key, pair.session, value)
                })
                .collect();
            keys.sort();
            keys
        }
        Err(_) => Vec::new(),
    }
}

/// One scrape of a gateway's Prometheus endpoint `endpoint` (`http://host:port/metrics`):
/// every sample as `name{labels}` → value.
pub async fn scrape(endpoint: &str) -> std::collections::BTreeMap<String, f64> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = endpoint
        .strip_prefix("http://")
        .and_then(|rest| rest.split('/').next())
        .expect("http endpoint");
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    stream
        .write_all(format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await
        .expect("request");
    let mut text = String::new();
    stream.read_to_string(&mut text).await.expect("response");
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP answer");
    assert!(
        head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
        "{head}"
    );
    assert!(
        head.to_lowercase().contains("content-type: text/plain"),
        "{head}"
    );
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_string(), value.parse().ok()?))
        })
        .collect()
}

/// The sum of the series named `name` whose labels include all of `labels`.
pub fn metric_value(
    samples: &std::collections::BTreeMap<String, f64>,
    name: &str,
    labels: &[(&str, &str)],
) -> f64 {
    samples
        .iter()
        .filter(|(series, _)| {
            let (n, rest) = series.split_once('{').unwrap_or((series.as_str(), ""));
            n == name
                && labels
                    .iter()
                    .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")))
        })
        .map(|(_, v)| *v)
        .sum()
}

/// The sum of the samples of the metric `name` (any labels) in one scrape of `endpoint`.
pub async fn scrape_metric(endpoint: &str, name: &str) -> f64 {
    metric_value(&scrape(endpoint).await, name, &[])
}

/// The TCP connections process `pid` has established to `port` on the loopback address,
/// read from /proc (Linux): its sockets' inodes matched against the kernel's TCP table.
pub fn connections_to(pid: u32, port: u16) -> usize {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return 0;
    };
    let inodes: std::collections::HashSet<String> = fds
        .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter_map(|target| {
            let target = target.to_string_lossy().into_owned();
            Some(
                target
                    .strip_prefix("socket:[")?
                    .strip_suffix(']')?
                    .to_string(),
            )
        })
        .collect();
    let port_hex = format!("{port:04X}");
    ["tcp", "tcp6"]
        .iter()
        .filter_map(|table| std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).ok())
        .flat_map(|text| text.lines().skip(1).map(str::to_string).collect::<Vec<_>>())
        .filter(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // local, remote, state (01: established), ..., inode (field 9).
            fields.len() > 9
                && fields[2].ends_with(&format!(":{port_hex}"))
                && fields[3] == "01"
                && inodes.contains(fields[9])
        })
        .count()
}
