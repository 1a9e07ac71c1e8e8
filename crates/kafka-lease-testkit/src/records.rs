//! A record a test produces, whatever the broker: the end-to-end tests' real one and the
//! in-process tier's mock cluster.

use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::FutureRecord;

/// A record to produce: `None` is an absent key, value or header value.
#[derive(Clone, Debug, Default)]
pub struct TestRecord {
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    pub timestamp_ms: Option<i64>,
}

impl TestRecord {
    /// A record with this value and nothing else.
    pub fn value(value: impl Into<Vec<u8>>) -> Self {
        Self {
            value: Some(value.into()),
            ..Self::default()
        }
    }

    /// The record for a producer, to `partition` of `topic`.
    pub fn to_record<'a>(&'a self, topic: &'a str, partition: i32) -> FutureRecord<'a, [u8], [u8]> {
        let mut headers = OwnedHeaders::new();
        for (key, value) in &self.headers {
            headers = headers.insert(Header {
                key,
                value: value.as_deref(),
            });
        }
        let mut record = FutureRecord::to(topic)
            .partition(partition)
            .headers(headers);
        if let Some(key) = &self.key {
            record = record.key(key.as_slice());
        }
        if let Some(value) = &self.value {
            record = record.payload(value.as_slice());
        }
        if let Some(ts) = self.timestamp_ms {
            record = record.timestamp(ts);
        }
        record
    }
}
