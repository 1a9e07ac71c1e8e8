//! A Read client that only counts what it receives: the gateway arm's reader made as cheap
//! as the relay arm's, which reads its socket and discards the bytes. tonic and HTTP/2 as
//! every client has them, but no record is decoded into a value: each response is walked
//! once over its fields, counting the records and summing their values' lengths.
//!
//! With it, the drain scenarios compare the gateway with the relay arm on equal terms: on
//! these 2 cores the Rust client's decoding is otherwise part of the gateway arm's CPU.

use std::marker::PhantomData;

use anyhow::{Context, Result};
use bytes::Buf;
use kafka_lease_client::proto::{ReadRequest, SubscribeRequest};
use prost::encoding::decode_varint;
use prost::Message;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::Channel;
use tonic::Status;

/// What one response held: its records and their values' lengths, and for a Subscribe's
/// records event, the partition they are of.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Counted {
    pub(crate) records: u64,
    pub(crate) value_bytes: u64,
    pub(crate) partition: Option<i32>,
}

/// Opens a Read on `channel` whose responses arrive as [`Counted`]s.
pub(crate) async fn read(
    channel: Channel,
    request: ReadRequest,
) -> Result<tonic::Streaming<Counted>> {
    open(
        channel,
        request,
        "/kafka_lease.v1.PartitionLeaseService/Read",
        Kind::Read,
    )
    .await
}

/// Opens a Subscribe on `channel` whose events arrive as [`Counted`]s (a records event's
/// records and partition; nothing counted for the other events).
pub(crate) async fn subscribe(
    channel: Channel,
    request: SubscribeRequest,
) -> Result<tonic::Streaming<Counted>> {
    open(
        channel,
        request,
        "/kafka_lease.v1.PartitionLeaseService/Subscribe",
        Kind::Subscribe,
    )
    .await
}

async fn open<R: Message + Send + 'static>(
    channel: Channel,
    request: R,
    path: &'static str,
    kind: Kind,
) -> Result<tonic::Streaming<Counted>> {
    let mut grpc = tonic::client::Grpc::new(channel).max_decoding_message_size(8 * 1024 * 1024);
    grpc.ready().await.context("the channel to the gateway")?;
    let codec = CountingCodec {
        kind,
        request: PhantomData::<fn() -> R>,
    };
    Ok(grpc
        .server_streaming(
            tonic::Request::new(request),
            http::uri::PathAndQuery::from_static(path),
            codec,
        )
        .await
        .with_context(|| format!("{path} (counting reader)"))?
        .into_inner())
}

/// Which response the counter walks.
#[derive(Clone, Copy, Debug)]
enum Kind {
    /// A ReadResponse: records in field 1.
    Read,
    /// A SubscribeResponse: a records event in field 3, its partition in the event's field
    /// 3 and its records in field 6.
    Subscribe,
}

/// Encodes a request with prost; decodes a response into a [`Counted`].
struct CountingCodec<R> {
    kind: Kind,
    request: PhantomData<fn() -> R>,
}

impl<R: Message + Send + 'static> Codec for CountingCodec<R> {
    type Encode = R;
    type Decode = Counted;
    type Encoder = RequestEncoder<R>;
    type Decoder = ResponseCounter;

    fn encoder(&mut self) -> RequestEncoder<R> {
        RequestEncoder(PhantomData)
    }

    fn decoder(&mut self) -> ResponseCounter {
        ResponseCounter(self.kind)
    }
}

struct RequestEncoder<R>(PhantomData<fn() -> R>);

impl<R: Message> Encoder for RequestEncoder<R> {
    type Item = R;
    type Error = Status;

    fn encode(&mut self, item: R, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        item.encode(dst)
            .map_err(|e| Status::internal(format!("encoding the request: {e}")))
    }
}

struct ResponseCounter(Kind);

impl Decoder for ResponseCounter {
    type Item = Counted;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Counted>, Status> {
        // tonic hands over the whole message in one contiguous buffer.
        let message = src.chunk();
        let len = message.len();
        if len != src.remaining() {
            return Err(Status::internal("a response split across buffers"));
        }
        let counted = match self.0 {
            Kind::Read => count_records(message),
            Kind::Subscribe => count_event(message),
        }
        .map_err(|what| Status::internal(format!("a malformed response: {what}")))?;
        src.advance(len);
        Ok(Some(counted))
    }
}

/// Counts the records of an encoded ReadResponse (field 1) and sums their values' lengths.
fn count_records(mut message: &[u8]) -> Result<Counted, &'static str> {
    let mut counted = Counted::default();
    while !message.is_empty() {
        if let (1, Field::Bytes(record)) = next_field(&mut message)? {
            add_record(&mut counted, record)?;
        }
    }
    Ok(counted)
}

/// Counts a SubscribeResponse's records event (field 3: its partition in field 3, its
/// records in field 6), if it is one.
fn count_event(mut message: &[u8]) -> Result<Counted, &'static str> {
    let mut counted = Counted::default();
    while !message.is_empty() {
        if let (3, Field::Bytes(mut event)) = next_field(&mut message)? {
            // Partition 0 is the field's default, which proto3 leaves out.
            counted.partition = Some(0);
            while !event.is_empty() {
                match next_field(&mut event)? {
                    (3, Field::Varint(partition)) => counted.partition = Some(partition as i32),
                    (6, Field::Bytes(record)) => add_record(&mut counted, record)?,
                    _ => {}
                }
            }
        }
    }
    Ok(counted)
}

/// Counts one encoded KafkaRecord and its value's length (field 3).
fn add_record(counted: &mut Counted, mut record: &[u8]) -> Result<(), &'static str> {
    counted.records += 1;
    while !record.is_empty() {
        if let (3, Field::Bytes(value)) = next_field(&mut record)? {
            counted.value_bytes += value.len() as u64;
        }
    }
    Ok(())
}

/// One field's value.
enum Field<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Fixed,
}

/// Takes one field off the front of `buf`: its number and its value.
fn next_field<'a>(buf: &mut &'a [u8]) -> Result<(u64, Field<'a>), &'static str> {
    let key = decode_varint(buf).map_err(|_| "a bad field key")?;
    let skip = |buf: &mut &'a [u8], n: usize| -> Result<&'a [u8], &'static str> {
        if buf.len() < n {
            return Err("a field longer than the message");
        }
        let (head, rest) = buf.split_at(n);
        *buf = rest;
        Ok(head)
    };
    let value = match key & 7 {
        0 => Field::Varint(decode_varint(buf).map_err(|_| "a bad varint")?),
        1 => {
            skip(buf, 8)?;
            Field::Fixed
        }
        2 => {
            let n = decode_varint(buf).map_err(|_| "a bad length")?;
            Field::Bytes(skip(buf, usize::try_from(n).map_err(|_| "a bad length")?)?)
        }
        5 => {
            skip(buf, 4)?;
            Field::Fixed
        }
        _ => return Err("an unknown wire type"),
    };
    Ok((key >> 3, value))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_lease_client::proto::{
        subscribe_response, KafkaHeader, KafkaRecord, ReadResponse, SubscribeResponse,
        SubscribedRecords,
    };

    #[test]
    fn counts_the_records_and_their_values_as_prost_encodes_them() {
        let record = |offset: i64, value: Option<&[u8]>| KafkaRecord {
            offset,
            key: Some(bytes::Bytes::from_static(b"key")),
            value: value.map(bytes::Bytes::copy_from_slice),
            headers: vec![KafkaHeader {
                key: "h".into(),
                value: Some(bytes::Bytes::from_static(b"header value")),
            }],
            timestamp: Some(prost_types::Timestamp {
                seconds: 1,
                nanos: 2,
            }),
            ..Default::default()
        };
        let response = ReadResponse {
            records: vec![
                record(0, Some(&[7; 1024])),
                record(1, None),
                record(2, Some(b"")),
                record(3, Some(&[1; 300])),
            ],
            high_watermark: 99,
            seek_epoch: 3,
            next_offset: 4,
        };
        let encoded = response.encode_to_vec();
        let four = Counted {
            records: 4,
            value_bytes: 1324,
            partition: None,
        };
        assert_eq!(count_records(&encoded), Ok(four));
        assert_eq!(count_records(&[]), Ok(Counted::default()));
        assert!(count_records(&encoded[..encoded.len() - 1]).is_err());

        for partition in [7, 0] {
            let event = SubscribeResponse {
                event: Some(subscribe_response::Event::Records(SubscribedRecords {
                    lease_id: "lease".into(),
                    topic: "topic".into(),
                    partition,
                    seek_epoch: 2,
                    high_watermark: 99,
                    records: response.records.clone(),
                })),
            };
            assert_eq!(
                count_event(&event.encode_to_vec()),
                Ok(Counted {
                    partition: Some(partition),
                    ..four
                })
            );
        }
        let assigned = SubscribeResponse {
            event: Some(subscribe_response::Event::Assigned(Default::default())),
        };
        assert_eq!(
            count_event(&assigned.encode_to_vec()),
            Ok(Counted::default())
        );
    }
}
