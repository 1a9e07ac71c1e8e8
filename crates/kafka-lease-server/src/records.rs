//! Kafka records encoded straight into a response's bytes.
//!
//! A batch is one buffer holding the records' protobuf encoding as `ReadResponse.records`
//! carries them (each one a field-1 key, a length and a `KafkaRecord`), written from
//! librdkafka's message buffers with no per-record allocation. The encoding is byte for byte
//! what prost writes for the same `v1::KafkaRecord` (the tests check it), so a client sees no
//! difference.

use bytes::{BufMut, Bytes, BytesMut};
use kafka_lease_proto::v1;
use kafka_lease_proto::wire::{
    EncodedDeliverResponse, EncodedReadResponse, EncodedSubscribeResponse,
};
use prost::encoding::encoded_len_varint;
use rdkafka::message::{Headers, Message};

/// `ReadResponse.records`, `.high_watermark`, `.seek_epoch`.
const READ_RECORDS: u8 = 1;
const READ_HIGH_WATERMARK: u8 = 2;
const READ_SEEK_EPOCH: u8 = 3;
const READ_NEXT_OFFSET: u8 = 4;
/// `SubscribeResponse.records` (the oneof's `SubscribedRecords`) and its fields.
const SUBSCRIBE_RECORDS: u8 = 3;
const SUBSCRIBED_LEASE_ID: u8 = 1;
const SUBSCRIBED_TOPIC: u8 = 2;
const SUBSCRIBED_PARTITION: u8 = 3;
const SUBSCRIBED_SEEK_EPOCH: u8 = 4;
const SUBSCRIBED_HIGH_WATERMARK: u8 = 5;
const SUBSCRIBED_RECORDS: u8 = 6;

const VARINT: u8 = 0;
const LENGTH_DELIMITED: u8 = 2;

/// The key byte of field `field` (below 16) with `wire_type`.
const fn key(field: u8, wire_type: u8) -> u8 {
    (field << 3) | wire_type
}

/// A message's fields as the encoding needs them, read from librdkafka once (its headers
/// too: librdkafka parses them again at each ask when the record has none, allocating a
/// parse buffer each time).
#[derive(Debug)]
pub struct Prepared<'a, H> {
    offset: i64,
    key: Option<&'a [u8]>,
    value: Option<&'a [u8]>,
    headers: Option<&'a H>,
    /// The timestamp as `google.protobuf.Timestamp` (seconds, nanos), when there is one.
    timestamp: Option<(i64, i32)>,
    timestamp_type: v1::TimestampType,
    /// The encoded length of the whole `KafkaRecord`.
    body_len: usize,
    /// The encoded length of the `Timestamp` message.
    timestamp_len: usize,
}

impl<'a, H: Headers> Prepared<'a, H> {
    /// Reads `message`'s fields and sizes its encoding.
    pub fn of<M: Message<Headers = H>>(message: &'a M) -> Self {
        let (timestamp_ms, timestamp_type) = match message.timestamp() {
            rdkafka::Timestamp::NotAvailable => (None, v1::TimestampType::Unspecified),
            rdkafka::Timestamp::CreateTime(ms) => (Some(ms), v1::TimestampType::CreateTime),
            rdkafka::Timestamp::LogAppendTime(ms) => (Some(ms), v1::TimestampType::LogAppendTime),
        };
        let timestamp = timestamp_ms.map(|ms| {
            (
                ms.div_euclid(1000),
                (ms.rem_euclid(1000) * 1_000_000) as i32,
            )
        });
        let timestamp_len = timestamp.map_or(0, |(seconds, nanos)| {
            int_field_len(seconds) + int_field_len(i64::from(nanos))
        });
        let mut prepared = Prepared {
            offset: message.offset(),
            key: message.key(),
            value: message.payload(),
            headers: message.headers(),
            timestamp,
            timestamp_type,
            body_len: 0,
            timestamp_len,
        };
        let mut len = int_field_len(prepared.offset)
            + prepared.key.map_or(0, bytes_field_len)
            + prepared.value.map_or(0, bytes_field_len)
            + int_field_len(timestamp_type as i64);
        if timestamp.is_some() {
            len += delimited_len(timestamp_len);
        }
        if let Some(headers) = prepared.headers {
            for header in headers.iter() {
                len += delimited_len(header_len(header.key, header.value));
            }
        }
        prepared.body_len = len;
        prepared
    }

    /// The record's offset.
    pub fn offset(&self) -> i64 {
        self.offset
    }

    /// The bytes this record adds to a response: its encoding, key and length prefix.
    pub fn wire_len(&self) -> usize {
        delimited_len(self.body_len)
    }
}

/// The size of a one-byte key, a length prefix and `len` bytes.
fn delimited_len(len: usize) -> usize {
    1 + encoded_len_varint(len as u64) + len
}

/// An optional bytes field, present (even empty).
fn bytes_field_len(bytes: &[u8]) -> usize {
    delimited_len(bytes.len())
}

/// An int64/int32/enum field under proto3 rules: absent when zero.
fn int_field_len(value: i64) -> usize {
    if value == 0 {
        0
    } else {
        1 + encoded_len_varint(value as u64)
    }
}

fn header_len(key: &str, value: Option<&[u8]>) -> usize {
    let key_len = if key.is_empty() {
        0
    } else {
        delimited_len(key.len())
    };
    key_len + value.map_or(0, bytes_field_len)
}

/// A one-byte field key and a varint, written as one slice: prost's `encode_varint` writes
/// a byte at a time, each with its own capacity check, and a record has about eight of
/// these (a few per cent of the gateway's CPU on a drain).
fn put_key_varint(buf: &mut BytesMut, key: u8, mut value: u64) {
    let mut bytes = [0_u8; 11];
    bytes[0] = key;
    let mut at = 1;
    while value >= 0x80 {
        bytes[at] = (value as u8) | 0x80;
        value >>= 7;
        at += 1;
    }
    bytes[at] = value as u8;
    buf.put_slice(&bytes[..=at]);
}

fn put_delimited(buf: &mut BytesMut, field: u8, bytes: &[u8]) {
    put_key_varint(buf, key(field, LENGTH_DELIMITED), bytes.len() as u64);
    buf.put_slice(bytes);
}

fn put_int(buf: &mut BytesMut, field: u8, value: i64) {
    if value != 0 {
        put_key_varint(buf, key(field, VARINT), value as u64);
    }
}

/// The most bytes `ReadResponse`'s own fields take after the records: three keys and three
/// varints.
const RESPONSE_FIELDS: usize = 3 + 3 * 10;

/// The message a batch's records are written for: a record's field key differs between
/// `ReadResponse.records` (1) and `SubscribedRecords.records` (6), and nothing else does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RecordsFor {
    #[default]
    Read,
    Subscribe,
}

impl RecordsFor {
    /// A record's key byte in that message.
    const fn key(self) -> u8 {
        match self {
            RecordsFor::Read => key(READ_RECORDS, LENGTH_DELIMITED),
            RecordsFor::Subscribe => key(SUBSCRIBED_RECORDS, LENGTH_DELIMITED),
        }
    }
}

/// Consecutive records of one partition, each encoded as a `KafkaRecord` field of the
/// message they are written for ([`RecordsFor`]).
#[derive(Debug, Default)]
pub struct EncodedRecords {
    buf: BytesMut,
    count: usize,
    last_offset: Option<i64>,
    written_for: RecordsFor,
}

impl EncodedRecords {
    /// An empty batch for a `ReadResponse`.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty batch for `message`.
    pub fn written_for(message: RecordsFor) -> Self {
        EncodedRecords {
            written_for: message,
            ..Self::default()
        }
    }

    /// An empty batch written into `buf`, with room for `bytes` of records. `buf` may be the
    /// spare of an earlier batch ([`Self::split_spare`]): once that batch's response has
    /// been sent and dropped, `reserve` takes the whole allocation back instead of
    /// allocating, so a drain writes every batch into memory it has already touched (fresh
    /// pages cost the kernel a fault and a zeroed page each).
    pub fn reusing(mut buf: BytesMut, bytes: usize, message: RecordsFor) -> Self {
        buf.clear();
        buf.reserve(bytes + 32);
        EncodedRecords {
            buf,
            written_for: message,
            ..Self::default()
        }
    }

    /// Rewrites every record's key byte for `message`, if the batch was written for the
    /// other one (a walk over the records; the Read and Subscribe paths write for their own
    /// message and never need it).
    fn rewrite_for(&mut self, message: RecordsFor) {
        if self.written_for == message {
            return;
        }
        let (from, to) = (self.written_for.key(), message.key());
        let records = &mut self.buf;
        let mut at = 0;
        while at < records.len() {
            debug_assert_eq!(records[at], from);
            records[at] = to;
            let mut rest = &records[at + 1..];
            let before = rest.len();
            let len = prost::encoding::decode_varint(&mut rest)
                .expect("a record's length prefix, written by push") as usize;
            at += 1 + (before - rest.len()) + len;
        }
        self.written_for = message;
    }

    /// Splits off the buffer's room beyond the records and the response's own fields,
    /// sharing its allocation, for the next batch ([`Self::reusing`]).
    pub fn split_spare(&mut self) -> BytesMut {
        self.buf.reserve(RESPONSE_FIELDS);
        let keep = self.buf.len() + RESPONSE_FIELDS;
        self.buf.split_off(keep)
    }

    /// How many records the batch holds.
    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The bytes the records take in a response, as counted against `max_bytes`.
    pub fn wire_len(&self) -> usize {
        self.buf.len()
    }

    /// The offset of the last record, if any.
    pub fn last_offset(&self) -> Option<i64> {
        self.last_offset
    }

    /// Appends the record `prepared` was read from.
    pub fn push<H: Headers>(&mut self, prepared: &Prepared<'_, H>) {
        let buf = &mut self.buf;
        buf.reserve(prepared.wire_len());
        put_key_varint(buf, self.written_for.key(), prepared.body_len as u64);
        put_int(buf, 1, prepared.offset);
        if let Some(key) = prepared.key {
            put_delimited(buf, 2, key);
        }
        if let Some(value) = prepared.value {
            put_delimited(buf, 3, value);
        }
        if let Some(headers) = prepared.headers {
            for header in headers.iter() {
                put_key_varint(
                    buf,
                    key(4, LENGTH_DELIMITED),
                    header_len(header.key, header.value) as u64,
                );
                if !header.key.is_empty() {
                    put_delimited(buf, 1, header.key.as_bytes());
                }
                if let Some(value) = header.value {
                    put_delimited(buf, 2, value);
                }
            }
        }
        if let Some((seconds, nanos)) = prepared.timestamp {
            put_key_varint(buf, key(5, LENGTH_DELIMITED), prepared.timestamp_len as u64);
            put_int(buf, 1, seconds);
            put_int(buf, 2, i64::from(nanos));
        }
        put_int(buf, 6, prepared.timestamp_type as i64);
        self.count += 1;
        self.last_offset = Some(prepared.offset);
    }

    /// The records as a `ReadResponse`.
    pub fn into_read_response(
        mut self,
        high_watermark: i64,
        seek_epoch: u64,
        next_offset: i64,
    ) -> EncodedReadResponse {
        self.rewrite_for(RecordsFor::Read);
        let mut buf = self.buf;
        buf.reserve(RESPONSE_FIELDS);
        put_int(&mut buf, READ_HIGH_WATERMARK, high_watermark);
        put_int(&mut buf, READ_SEEK_EPOCH, seek_epoch as i64);
        put_int(&mut buf, READ_NEXT_OFFSET, next_offset);
        EncodedReadResponse::from_parts(vec![buf.freeze()])
    }

    /// The records as a `SubscribeResponse` with a `records` event.
    pub fn into_subscribed(
        mut self,
        lease_id: &str,
        topic: &str,
        partition: i32,
        seek_epoch: u64,
        high_watermark: i64,
    ) -> EncodedSubscribeResponse {
        self.rewrite_for(RecordsFor::Subscribe);
        let records = self.buf;
        let mut fields = BytesMut::with_capacity(32 + lease_id.len() + topic.len());
        if !lease_id.is_empty() {
            put_delimited(&mut fields, SUBSCRIBED_LEASE_ID, lease_id.as_bytes());
        }
        if !topic.is_empty() {
            put_delimited(&mut fields, SUBSCRIBED_TOPIC, topic.as_bytes());
        }
        put_int(&mut fields, SUBSCRIBED_PARTITION, i64::from(partition));
        put_int(&mut fields, SUBSCRIBED_SEEK_EPOCH, seek_epoch as i64);
        put_int(&mut fields, SUBSCRIBED_HIGH_WATERMARK, high_watermark);
        let event_len = fields.len() + records.len();
        let mut head = BytesMut::with_capacity(1 + 10 + fields.len());
        put_key_varint(
            &mut head,
            key(SUBSCRIBE_RECORDS, LENGTH_DELIMITED),
            event_len as u64,
        );
        head.put_slice(&fields);
        EncodedSubscribeResponse::from_parts(vec![head.freeze(), records.freeze()])
    }

    /// The records one by one, each as its own `KafkaRecord` field (key byte, length and
    /// body), sharing the batch's buffer: what queue mode keeps per record.
    pub fn into_records(mut self) -> Vec<OneRecord> {
        self.rewrite_for(RecordsFor::Read);
        let all = self.buf.freeze();
        let mut records = Vec::with_capacity(self.count);
        let mut at = 0;
        while at < all.len() {
            let mut rest = &all[at + 1..];
            let before = rest.len();
            let len = prost::encoding::decode_varint(&mut rest)
                .expect("a record's length prefix, written by push") as usize;
            let body_at = at + 1 + (before - rest.len());
            let field = all.slice(at..body_at + len);
            let (offset, key) = offset_and_key(&all[body_at..body_at + len]);
            // The key as a slice of the shared buffer: no copy.
            let key = key.map(|key| all.slice_ref(key));
            records.push(OneRecord { offset, key, field });
            at = body_at + len;
        }
        records
    }

    /// The records, decoded (for tests and tools; the Read path never decodes).
    pub fn decode(&self) -> Vec<v1::KafkaRecord> {
        let mut copy = EncodedRecords {
            buf: BytesMut::from(&self.buf[..]),
            count: self.count,
            last_offset: self.last_offset,
            written_for: self.written_for,
        };
        copy.rewrite_for(RecordsFor::Read);
        let response: v1::ReadResponse =
            prost::Message::decode(copy.buf.freeze()).expect("records encoded by push decode");
        response.records
    }
}

/// One record of a batch, as [`EncodedRecords::into_records`] splits it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OneRecord {
    pub offset: i64,
    /// Its key, sharing the batch's buffer.
    pub key: Option<Bytes>,
    /// The record as a length-delimited field 1: `ReadResponse.records` and
    /// `Delivery.record` alike.
    pub field: Bytes,
}

impl OneRecord {
    /// The record, decoded (for a dead letter's copy).
    pub fn decode(&self) -> v1::KafkaRecord {
        let response: v1::ReadResponse =
            prost::Message::decode(self.field.clone()).expect("a record encoded by push");
        response.records.into_iter().next().unwrap_or_default()
    }
}

/// The offset and key of a `KafkaRecord` body written by [`EncodedRecords::push`] (offset,
/// then key: the first two fields when present).
fn offset_and_key(mut body: &[u8]) -> (i64, Option<&[u8]>) {
    use prost::encoding::{decode_key, decode_varint, WireType};
    let mut offset = 0;
    while !body.is_empty() {
        let Ok((field, wire_type)) = decode_key(&mut body) else {
            break;
        };
        match (field, wire_type) {
            (1, WireType::Varint) => {
                offset = decode_varint(&mut body).unwrap_or_default() as i64;
            }
            (2, WireType::LengthDelimited) => {
                let len = decode_varint(&mut body).unwrap_or_default() as usize;
                return (offset, body.get(..len));
            }
            // Past the key's place: the record has none.
            _ => break,
        }
    }
    (offset, None)
}

/// `DeliverResponse`'s fields: `deliveries`, and `Delivery`'s `record`, `attempt`,
/// `deadline`; `high_watermark`.
const DELIVER_DELIVERIES: u8 = 1;
const DELIVER_HIGH_WATERMARK: u8 = 2;
const DELIVERY_ATTEMPT: u8 = 2;
const DELIVERY_DEADLINE: u8 = 3;

/// `SubscribeResponse.deliveries` (the oneof's `SubscribedDeliveries`) and its fields.
const SUBSCRIBE_DELIVERIES: u8 = 6;
const SUBSCRIBED_DELIVERIES_LEASE_ID: u8 = 1;
const SUBSCRIBED_DELIVERIES_TOPIC: u8 = 2;
const SUBSCRIBED_DELIVERIES_PARTITION: u8 = 3;
const SUBSCRIBED_DELIVERIES_HIGH_WATERMARK: u8 = 4;
const SUBSCRIBED_DELIVERIES: u8 = 5;

/// Deliveries built from records kept as [`OneRecord::field`], for a `DeliverResponse` or a
/// Subscribe's `deliveries` event: each delivery's record goes out as the bytes fetched, not
/// copied.
#[derive(Debug, Default)]
pub struct DeliverBatch {
    /// Each delivery: its record's field, and the `attempt` and `deadline` fields after it.
    deliveries: Vec<(Bytes, Bytes)>,
    /// Where the tails are written: one allocation for many, each tail a slice of it.
    tails: BytesMut,
    wire_len: usize,
}

impl DeliverBatch {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a delivery of `record` (a [`OneRecord::field`]), its `attempt`, and its
    /// deadline as a `google.protobuf.Timestamp` (seconds, nanos).
    pub fn push(&mut self, record: &Bytes, attempt: u32, deadline: (i64, i32)) {
        // A tail takes at most 2 + 5 + 2 + 11 + 6 bytes.
        if self.tails.capacity() < 32 {
            self.tails.reserve(32 * 64);
        }
        let tail = &mut self.tails;
        put_int(tail, DELIVERY_ATTEMPT, i64::from(attempt));
        let (seconds, nanos) = deadline;
        let timestamp_len = int_field_len(seconds) + int_field_len(i64::from(nanos));
        put_key_varint(
            tail,
            key(DELIVERY_DEADLINE, LENGTH_DELIMITED),
            timestamp_len as u64,
        );
        put_int(tail, 1, seconds);
        put_int(tail, 2, i64::from(nanos));
        let tail = tail.split().freeze();
        self.wire_len += delimited_len(record.len() + tail.len());
        self.deliveries.push((record.clone(), tail));
    }

    pub fn len(&self) -> usize {
        self.deliveries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.deliveries.is_empty()
    }

    /// The bytes the deliveries take in the response.
    pub fn wire_len(&self) -> usize {
        self.wire_len
    }

    /// The deliveries as repeated field `field`, each a key, a length and its parts.
    fn into_parts(self, field: u8, mut head: BytesMut) -> Vec<Bytes> {
        let mut parts = Vec::with_capacity(1 + self.deliveries.len() * 3);
        for (record, tail) in self.deliveries {
            put_key_varint(
                &mut head,
                key(field, LENGTH_DELIMITED),
                (record.len() + tail.len()) as u64,
            );
            parts.push(head.split().freeze());
            parts.push(record);
            parts.push(tail);
        }
        parts
    }

    /// The deliveries as a `DeliverResponse`.
    pub fn into_response(self, high_watermark: i64) -> EncodedDeliverResponse {
        let heads = BytesMut::with_capacity(self.deliveries.len() * 4);
        let mut parts = self.into_parts(DELIVER_DELIVERIES, heads);
        let mut fields = BytesMut::with_capacity(11);
        put_int(&mut fields, DELIVER_HIGH_WATERMARK, high_watermark);
        if !fields.is_empty() {
            parts.push(fields.freeze());
        }
        EncodedDeliverResponse::from_parts(parts)
    }

    /// The deliveries as a `SubscribeResponse` with a `deliveries` event.
    pub fn into_subscribed(
        self,
        lease_id: &str,
        topic: &str,
        partition: i32,
        high_watermark: i64,
    ) -> EncodedSubscribeResponse {
        let mut fields = BytesMut::with_capacity(32 + lease_id.len() + topic.len());
        if !lease_id.is_empty() {
            put_delimited(
                &mut fields,
                SUBSCRIBED_DELIVERIES_LEASE_ID,
                lease_id.as_bytes(),
            );
        }
        if !topic.is_empty() {
            put_delimited(&mut fields, SUBSCRIBED_DELIVERIES_TOPIC, topic.as_bytes());
        }
        put_int(
            &mut fields,
            SUBSCRIBED_DELIVERIES_PARTITION,
            i64::from(partition),
        );
        put_int(
            &mut fields,
            SUBSCRIBED_DELIVERIES_HIGH_WATERMARK,
            high_watermark,
        );
        let event_len = fields.len() + self.wire_len;
        let mut head = BytesMut::with_capacity(1 + 10 + fields.len());
        put_key_varint(
            &mut head,
            key(SUBSCRIBE_DELIVERIES, LENGTH_DELIMITED),
            event_len as u64,
        );
        head.put_slice(&fields);
        let heads = BytesMut::with_capacity(self.deliveries.len() * 4);
        let mut parts = vec![head.freeze()];
        parts.extend(self.into_parts(SUBSCRIBED_DELIVERIES, heads));
        EncodedSubscribeResponse::from_parts(parts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use prost::encoding::encode_varint;
    use prost::Message as _;
    use rdkafka::message::{Header, OwnedHeaders, OwnedMessage};

    #[test]
    fn a_key_and_varint_are_prosts_bytes_at_every_length() {
        let mut values = vec![0_u64, 1, 127, 128, 300, u64::MAX, (-1_i64) as u64];
        values.extend((1..64).map(|bit| 1_u64 << bit));
        values.extend((1..64).map(|bit| (1_u64 << bit) - 1));
        for value in values {
            let mut ours = BytesMut::new();
            put_key_varint(&mut ours, 0x2a, value);
            let mut theirs = BytesMut::new();
            theirs.put_u8(0x2a);
            encode_varint(value, &mut theirs);
            assert_eq!(ours, theirs, "{value}");
        }
    }

    #[test]
    fn records_split_one_by_one_and_deliveries_decode_as_prost_encodes_them() {
        let mut batch = EncodedRecords::new();
        let with_key = OwnedMessage::new(
            Some(b"v".to_vec()),
            Some(b"k".to_vec()),
            "t".into(),
            rdkafka::Timestamp::CreateTime(1_700_000_000_123),
            0,
            7,
            None,
        );
        let without_key = OwnedMessage::new(
            None,
            None,
            "t".into(),
            rdkafka::Timestamp::NotAvailable,
            0,
            8,
            None,
        );
        batch.push(&Prepared::of(&with_key));
        batch.push(&Prepared::of(&without_key));
        let records = batch.into_records();
        assert_eq!(records.len(), 2);
        assert_eq!(
            (records[0].offset, records[0].key.as_deref()),
            (7, Some(&b"k"[..]))
        );
        assert_eq!((records[1].offset, records[1].key.as_deref()), (8, None));
        assert_eq!(records[0].decode(), as_prost(&with_key));

        let mut deliveries = DeliverBatch::new();
        deliveries.push(&records[0].field, 3, (1_700_000_030, 5));
        deliveries.push(&records[1].field, 1, (1_700_000_031, 0));
        let wire_len = deliveries.wire_len();
        let encoded = deliveries.into_response(42).to_bytes();
        let expected = v1::DeliverResponse {
            deliveries: vec![
                v1::Delivery {
                    record: Some(as_prost(&with_key)),
                    attempt: 3,
                    deadline: Some(prost_types::Timestamp {
                        seconds: 1_700_000_030,
                        nanos: 5,
                    }),
                },
                v1::Delivery {
                    record: Some(as_prost(&without_key)),
                    attempt: 1,
                    deadline: Some(prost_types::Timestamp {
                        seconds: 1_700_000_031,
                        nanos: 0,
                    }),
                },
            ],
            high_watermark: 42,
        };
        assert_eq!(encoded, expected.encode_to_vec());
        assert_eq!(wire_len + 2, encoded.len());

        let mut again = DeliverBatch::new();
        again.push(&records[0].field, 3, (1_700_000_030, 5));
        again.push(&records[1].field, 1, (1_700_000_031, 0));
        let event = again.into_subscribed("r.s", "t", 4, 42).to_bytes();
        let expected = v1::SubscribeResponse {
            event: Some(v1::subscribe_response::Event::Deliveries(
                v1::SubscribedDeliveries {
                    lease_id: "r.s".into(),
                    topic: "t".into(),
                    partition: 4,
                    high_watermark: 42,
                    deliveries: expected.deliveries,
                },
            )),
        };
        assert_eq!(event, expected.encode_to_vec());
    }

    /// `message` as the previous Read path built it with prost.
    fn as_prost(message: &OwnedMessage) -> v1::KafkaRecord {
        let prepared = Prepared::of(message);
        v1::KafkaRecord {
            offset: message.offset(),
            key: message.key().map(Bytes::copy_from_slice),
            value: message.payload().map(Bytes::copy_from_slice),
            headers: message
                .headers()
                .map(|headers| {
                    headers
                        .iter()
                        .map(|h| v1::KafkaHeader {
                            key: h.key.to_string(),
                            value: h.value.map(Bytes::copy_from_slice),
                        })
                        .collect()
                })
                .unwrap_or_default(),
            timestamp: prepared
                .timestamp
                .map(|(seconds, nanos)| prost_types::Timestamp { seconds, nanos }),
            timestamp_type: prepared.timestamp_type as i32,
        }
    }

    fn message(
        offset: i64,
        key: Option<Vec<u8>>,
        value: Option<Vec<u8>>,
        headers: Vec<(String, Option<Vec<u8>>)>,
        timestamp: rdkafka::Timestamp,
    ) -> OwnedMessage {
        let headers = (!headers.is_empty()).then(|| {
            headers
                .iter()
                .fold(OwnedHeaders::new(), |all, (key, value)| {
                    all.insert(Header {
                        key: key.as_str(),
                        value: value.as_deref(),
                    })
                })
        });
        OwnedMessage::new(value, key, "t".into(), timestamp, 0, offset, headers)
    }

    fn timestamps() -> impl Strategy<Value = rdkafka::Timestamp> {
        prop_oneof![
            Just(rdkafka::Timestamp::NotAvailable),
            any::<i64>().prop_map(|ms| rdkafka::Timestamp::CreateTime(ms / 2)),
            (-2000_i64..2000).prop_map(rdkafka::Timestamp::LogAppendTime),
        ]
    }

    fn messages() -> impl Strategy<Value = OwnedMessage> {
        (
            prop_oneof![Just(0_i64), 0_i64..300, any::<i64>().prop_map(i64::abs)],
            proptest::option::of(proptest::collection::vec(any::<u8>(), 0..40)),
            proptest::option::of(proptest::collection::vec(any::<u8>(), 0..300)),
            proptest::collection::vec(
                (
                    "[a-z]{0,5}",
                    proptest::option::of(proptest::collection::vec(any::<u8>(), 0..9)),
                ),
                0..4,
            ),
            timestamps(),
        )
            .prop_map(|(offset, key, value, headers, timestamp)| {
                message(offset, key, value, headers, timestamp)
            })
    }

    proptest! {
        #[test]
        fn records_encode_byte_for_byte_as_prost_does(
            batch in proptest::collection::vec(messages(), 0..6),
            high_watermark in any::<i64>(),
            seek_epoch in any::<u64>(),
            next_offset in any::<i64>(),
        ) {
            let mut records = EncodedRecords::new();
            let mut expected = v1::ReadResponse {
                high_watermark,
                seek_epoch,
                next_offset,
                ..Default::default()
            };
            let mut wire = 0;
            for message in &batch {
                let prepared = Prepared::of(message);
                let record = as_prost(message);
                let len = record.encoded_len();
                prop_assert_eq!(prepared.wire_len(), 1 + prost::length_delimiter_len(len) + len);
                wire += prepared.wire_len();
                records.push(&prepared);
                expected.records.push(record);
            }
            prop_assert_eq!(records.wire_len(), wire);
            prop_assert_eq!(records.len(), batch.len());
            prop_assert_eq!(records.decode(), expected.records.clone());

            let subscribed = v1::SubscribeResponse {
                event: Some(v1::subscribe_response::Event::Records(v1::SubscribedRecords {
                    lease_id: "l-1.gw".into(),
                    topic: "orders".into(),
                    partition: 3,
                    seek_epoch,
                    high_watermark,
                    records: expected.records.clone(),
                })),
            };
            // Written for Subscribe, and for Read then rewritten, and the other way round.
            let mut for_subscribe = EncodedRecords::written_for(RecordsFor::Subscribe);
            let mut read_twice = EncodedRecords::new();
            let mut sub_twice = EncodedRecords::written_for(RecordsFor::Subscribe);
            for message in &batch {
                for_subscribe.push(&Prepared::of(message));
                read_twice.push(&Prepared::of(message));
                sub_twice.push(&Prepared::of(message));
            }
            prop_assert_eq!(for_subscribe.decode(), expected.records.clone());
            let read = records.into_read_response(high_watermark, seek_epoch, next_offset);
            prop_assert_eq!(read.encode_to_vec(), expected.encode_to_vec());
            let sub = for_subscribe
                .into_subscribed("l-1.gw", "orders", 3, seek_epoch, high_watermark);
            prop_assert_eq!(sub.encode_to_vec(), subscribed.encode_to_vec());
            let sub = read_twice
                .into_subscribed("l-1.gw", "orders", 3, seek_epoch, high_watermark);
            prop_assert_eq!(sub.encode_to_vec(), subscribed.encode_to_vec());
            let read = sub_twice.into_read_response(high_watermark, seek_epoch, next_offset);
            prop_assert_eq!(read.encode_to_vec(), expected.encode_to_vec());
        }
    }

    #[test]
    fn a_batch_reuses_the_allocation_of_the_last_once_its_response_is_dropped() {
        let messages: Vec<OwnedMessage> = (0..50)
            .map(|i| {
                message(
                    i,
                    Some(vec![i as u8; 8]),
                    Some(vec![i as u8; 1000]),
                    Vec::new(),
                    rdkafka::Timestamp::CreateTime(i),
                )
            })
            .collect();
        let fill = |records: &mut EncodedRecords, from: usize| {
            for m in &messages[from..from + 25] {
                records.push(&Prepared::of(m));
            }
        };
        let mut first = EncodedRecords::reusing(BytesMut::new(), 30_000, RecordsFor::Read);
        fill(&mut first, 0);
        let allocation = first.buf.as_ptr();
        let spare = first.split_spare();
        let sent = first.into_read_response(50, 1, 50);
        let expected = v1::ReadResponse {
            records: messages[..25].iter().map(as_prost).collect(),
            high_watermark: 50,
            seek_epoch: 1,
            next_offset: 50,
        };
        assert_eq!(sent.encode_to_vec(), expected.encode_to_vec());

        // While the response is alive, the spare must not write over it.
        let mut held = EncodedRecords::reusing(spare, 30_000, RecordsFor::Read);
        assert_ne!(held.buf.as_ptr(), allocation);
        assert_eq!(sent.encode_to_vec(), expected.encode_to_vec());
        let spare = held.split_spare();
        drop(held);

        // Once it is dropped (and the batch that held the spare), the next batch writes into
        // the first allocation again, and encodes correctly.
        drop(sent);
        let mut first = EncodedRecords::reusing(BytesMut::new(), 30_000, RecordsFor::Read);
        fill(&mut first, 0);
        let allocation = first.buf.as_ptr();
        let spare_of_first = first.split_spare();
        drop(first.into_read_response(50, 1, 50));
        drop(spare);
        let mut second = EncodedRecords::reusing(spare_of_first, 30_000, RecordsFor::Read);
        assert_eq!(
            second.buf.as_ptr(),
            allocation,
            "the allocation was not reused"
        );
        fill(&mut second, 25);
        let expected = v1::ReadResponse {
            records: messages[25..].iter().map(as_prost).collect(),
            high_watermark: 51,
            seek_epoch: 2,
            next_offset: 51,
        };
        assert_eq!(
            second.into_read_response(51, 2, 51).encode_to_vec(),
            expected.encode_to_vec()
        );
    }

    #[test]
    fn absent_and_empty_stay_different() {
        let empty = message(
            0,
            Some(Vec::new()),
            Some(Vec::new()),
            vec![(String::new(), Some(Vec::new())), ("k".into(), None)],
            rdkafka::Timestamp::CreateTime(0),
        );
        let absent = message(7, None, None, Vec::new(), rdkafka::Timestamp::NotAvailable);
        let mut records = EncodedRecords::new();
        records.push(&Prepared::of(&empty));
        records.push(&Prepared::of(&absent));
        assert_eq!(records.last_offset(), Some(7));
        let decoded = records.decode();
        assert_eq!(decoded[0].key, Some(Bytes::new()));
        assert_eq!(decoded[0].value, Some(Bytes::new()));
        assert_eq!(decoded[0].headers[0].value, Some(Bytes::new()));
        assert_eq!(decoded[0].headers[1].value, None);
        assert_eq!(
            decoded[0].timestamp,
            Some(prost_types::Timestamp::default())
        );
        assert_eq!(decoded[1].key, None);
        assert_eq!(decoded[1].value, None);
        assert_eq!(decoded[1].timestamp, None);
        assert_eq!(decoded[1].offset, 7);
    }
}
