//! `kafka-lease dev`: an in-process Kafka (librdkafka's mock cluster) with a sample topic,
//! and in-memory locks, so the API can be tried with nothing installed. Not for production:
//! the mock cluster keeps records in memory and forgets them on exit.

use std::time::Duration;

use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{DefaultProducerContext, FutureProducer, FutureRecord};
use rdkafka::ClientConfig;

use std::sync::Arc;

use crate::coordination::memory::{MemoryLockStore, MemoryLocks};
use crate::coordination::LockBackend;
use crate::error::LeaseError;
use crate::gateway::{Gateway, Limits};
use crate::kafka::{Kafka, KafkaSettings};

/// The sample topic's name and partition count.
pub const DEMO_TOPIC: &str = "demo";
pub const DEMO_PARTITIONS: i32 = 4;
/// The dead letter topic queue mode defaults to for the walkthrough's group
/// (`dlq.<group>.<topic>`), so a Deliver on a `demo-group` lease opens as it is.
pub const DEMO_DEAD_LETTERS: &str = "dlq.demo-group.demo";

/// A running mock cluster holding the sample topic. Dropping it stops the cluster.
pub struct DevKafka {
    cluster: MockCluster<'static, DefaultProducerContext>,
}

impl std::fmt::Debug for DevKafka {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DevKafka")
            .field("bootstrap", &self.bootstrap_servers())
            .finish()
    }
}

impl DevKafka {
    /// Starts a one-broker mock cluster and fills `demo` with `per_partition` records per
    /// partition: keys and headers, and every shape a client must keep apart (see
    /// [`sample`]), one second apart in time, the last one a second ago.
    pub async fn start(per_partition: u32) -> Result<Self, LeaseError> {
        let fail = |operation: &'static str| {
            move |e: rdkafka::error::KafkaError| LeaseError::KafkaUnavailable {
                operation,
                detail: e.to_string(),
            }
        };
        let cluster = MockCluster::new(1).map_err(fail("starting the mock cluster"))?;
        cluster
            .create_topic(DEMO_TOPIC, DEMO_PARTITIONS, 1)
            .map_err(fail("creating the demo topic"))?;
        cluster
            .create_topic(DEMO_DEAD_LETTERS, 1, 1)
            .map_err(fail("creating the demo dead letter topic"))?;
        let producer: FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", cluster.bootstrap_servers())
            .set("linger.ms", "5")
            .create()
            .map_err(fail("creating the sample producer"))?;
        let now_ms = crate::coordination::unix_ms(std::time::SystemTime::now()) as i64;
        for partition in 0..DEMO_PARTITIONS {
            for i in 0..per_partition {
                let record = sample(partition, i);
                let mut headers = OwnedHeaders::new();
                for (key, value) in &record.headers {
                    headers = headers.insert(Header {
                        key,
                        value: value.as_deref(),
                    });
                }
                let mut message = FutureRecord::<str, str>::to(DEMO_TOPIC)
                    .partition(partition)
                    .headers(headers)
                    .timestamp(now_ms - 1000 * i64::from(per_partition - i));
                if let Some(key) = &record.key {
                    message = message.key(key);
                }
                if let Some(value) = &record.value {
                    message = message.payload(value);
                }
                producer
                    .send(message, Duration::from_secs(5))
                    .await
                    .map_err(|(e, _)| fail("producing sample records")(e))?;
            }
        }
        Ok(Self { cluster })
    }

    pub fn bootstrap_servers(&self) -> String {
        self.cluster.bootstrap_servers()
    }

    /// The mock cluster itself, for tests that inject broker errors or delays.
    pub fn mock(&self) -> &MockCluster<'static, DefaultProducerContext> {
        &self.cluster
    }
}

/// A gateway instance over the mock cluster `kafka` and the in-memory lock store `store`:
/// what `kafka-lease dev` serves, and each instance of the in-process test rig (several
/// instances on one store share their locks as instances on one Consul do). With `address`,
/// the instance records where others reach it, so they forward calls on its leases to it.
pub fn gateway(
    kafka: &DevKafka,
    store: &MemoryLockStore,
    instance: &str,
    address: Option<&str>,
    limits: Limits,
    max_groups: usize,
) -> Result<(Arc<Gateway>, Arc<MemoryLocks>), LeaseError> {
    let locks = Arc::new(match address {
        Some(address) => store.backend_at(instance, address),
        None => store.backend(instance),
    });
    let mut settings = KafkaSettings::new(kafka.bootstrap_servers(), instance);
    // The mock cluster cannot look offsets up by time: they are found by a scan.
    settings.scan_for_timestamps = true;
    settings.max_groups = max_groups;
    let backend: Arc<dyn LockBackend> = locks.clone();
    let gateway = Gateway::serving(
        instance.to_string(),
        address.map(str::to_string),
        backend,
        Kafka::new(settings)?,
        limits,
    );
    Ok((gateway, locks))
}

/// One sample record: its key, value and headers (absent is `None`).
#[derive(Debug, PartialEq)]
pub struct Sample {
    pub key: Option<String>,
    pub value: Option<String>,
    pub headers: Vec<(String, Option<String>)>,
}

/// Record `i` of `partition`: a JSON order keyed by user, with a `source` and a `seq` header;
/// of every ten, #3 has no key (null), #5 is a tombstone (no value), #7 has an empty value,
/// and #9 has a repeated `tag` header and a `trace` header without a value.
pub fn sample(partition: i32, i: u32) -> Sample {
    let mut headers = vec![
        ("source".to_string(), Some("kafka-lease-dev".to_string())),
        ("seq".to_string(), Some(i.to_string())),
    ];
    if i % 10 == 9 {
        headers.push(("tag".into(), Some("a".into())));
        headers.push(("tag".into(), Some("b".into())));
        headers.push(("trace".into(), None));
    }
    let key = (i % 10 != 3).then(|| format!("user-{}", (i * 7 + partition as u32) % 10));
    let value = match i % 10 {
        5 => None,
        7 => Some(String::new()),
        _ => Some(format!(
            "{{\"order\":{i},\"partition\":{partition},\"amount\":{}}}",
            (i * 37) % 100
        )),
    };
    Sample {
        key,
        value,
        headers,
    }
}
