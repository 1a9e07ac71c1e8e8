//! [`DeadLetters`]: the gateway's one producer, which writes the copies of records that
//! queue mode gives up on (rejected, or failed at their last delivery) to dead letter topics.
//!
//! One producer per gateway, made at the first dead letter topic a queue opens with, shared
//! by every lease: librdkafka's producer batches across topics and partitions, and a
//! producer per lease would cost threads and connections per lease. It is idempotent with
//! `acks=all`, so a copy the broker acknowledged is on every in-sync replica and a retry of
//! librdkafka's own never writes it twice; a copy is written again only when the gateway
//! itself writes it again (a crash between the write and the commit that records it done).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};

use super::errors::{kafka_error, unavailable};
use super::settings::{ClientLog, KafkaSettings};
use crate::error::LeaseError;

/// How long librdkafka may take over one copy, retries included (its `delivery.timeout.ms`):
/// the caller retries after that, so a broker outage delays dead letters, never loses them.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(30);

/// The copy of a record for a dead letter topic: the record's key, value, headers and
/// timestamp, and headers saying where it came from and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeadLetter {
    pub topic: String,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    /// The record's own headers, then the gateway's (`kafka-lease.*`).
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    /// Milliseconds since the Unix epoch, as the record had it.
    pub timestamp_ms: Option<i64>,
}

/// The gateway's producer of dead letters (see the module docs).
#[derive(Clone)]
pub struct DeadLetters {
    settings: Arc<KafkaSettings>,
    producer: Arc<Mutex<Option<FutureProducer<ClientLog>>>>,
}

impl std::fmt::Debug for DeadLetters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeadLetters").finish_non_exhaustive()
    }
}

impl DeadLetters {
    pub(super) fn new(settings: Arc<KafkaSettings>) -> Self {
        DeadLetters {
            settings,
            producer: Arc::default(),
        }
    }

    /// The producer, made on first use.
    fn producer(&self) -> Result<FutureProducer<ClientLog>, LeaseError> {
        let mut slot = self.producer.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(producer) = &*slot {
            return Ok(producer.clone());
        }
        let mut config = self.settings.base_config();
        self.settings.apply_options(&mut config);
        // After the operator's properties: these are what a dead letter's guarantee rests on.
        config
            .set("acks", "all")
            .set("enable.idempotence", "true")
            .set("linger.ms", "5")
            .set(
                "delivery.timeout.ms",
                DELIVERY_TIMEOUT.as_millis().to_string(),
            );
        let producer: FutureProducer<ClientLog> = self
            .settings
            .create(&config, "creating the dead letter producer")?;
        *slot = Some(producer.clone());
        Ok(producer)
    }

    /// Writes `letter`, and returns once the broker has acknowledged it on every in-sync
    /// replica.
    pub async fn write(&self, letter: &DeadLetter) -> Result<(), LeaseError> {
        const OPERATION: &str = "writing a dead letter";
        let producer = self.producer()?;
        let mut headers = OwnedHeaders::new_with_capacity(letter.headers.len());
        for (key, value) in &letter.headers {
            headers = headers.insert(Header {
                key,
                value: value.as_deref(),
            });
        }
        let mut record: FutureRecord<'_, [u8], [u8]> =
            FutureRecord::to(&letter.topic).headers(headers);
        if let Some(key) = &letter.key {
            record = record.key(key);
        }
        if let Some(value) = &letter.value {
            record = record.payload(value);
        }
        if let Some(ms) = letter.timestamp_ms {
            record = record.timestamp(ms);
        }
        match producer.send(record, DELIVERY_TIMEOUT).await {
            Ok(_) => Ok(()),
            Err((err, _)) => Err(kafka_error(OPERATION, err)),
        }
    }

    /// Waits for copies in flight, for a gateway that stops.
    pub async fn flush(&self) {
        let producer = self
            .producer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if let Some(producer) = producer {
            let flushed = tokio::task::spawn_blocking(move || producer.flush(DELIVERY_TIMEOUT));
            if let Ok(Err(err)) = flushed.await {
                tracing::warn!(
                    error = %unavailable("flushing dead letters", err),
                    "dead letters may be unwritten",
                );
            }
        }
    }
}
