//! `kafka-lease dev`: an in-process Kafka (librdkafka's mock cluster) with a sample topic,
//! and in-memory locks, so the API can be tried with nothing installed. Not for production:
//! the mock cluster keeps records in memory and forgets them on exit.

use std::time::Duration;

use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{DefaultProducerContext, FutureProducer, FutureRecord};
use rdkafka::ClientConfig;

use crate::error::LeaseError;

/// The sample topic's name and partition count.
pub const DEMO_TOPIC: &str = "demo";
pub const DEMO_PARTITIONS: i32 = 4;

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
    /// partition, with keys and headers.
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
        let producer: FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", cluster.bootstrap_servers())
            .set("linger.ms", "5")
            .create()
            .map_err(fail("creating the sample producer"))?;
        for partition in 0..DEMO_PARTITIONS {
            for i in 0..per_partition {
                let key = format!("user-{}", (i * 7 + partition as u32) % 10);
                let value = format!(
                    "{{\"order\":{},\"partition\":{partition},\"amount\":{}}}",
                    i,
                    (i * 37) % 100
                );
                let headers = OwnedHeaders::new()
                    .insert(Header {
                        key: "source",
                        value: Some("kafka-lease-dev"),
                    })
                    .insert(Header {
                        key: "seq",
                        value: Some(&i.to_string()),
                    });
                producer
                    .send(
                        FutureRecord::to(DEMO_TOPIC)
                            .partition(partition)
                            .key(&key)
                            .payload(&value)
                            .headers(headers),
                        Duration::from_secs(5),
                    )
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
