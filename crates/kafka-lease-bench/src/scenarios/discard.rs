//! A Read client that only counts what it receives: the gateway arm's reader made as cheap
//! as the relay arm's, which reads its socket and discards the bytes. tonic and HTTP/2 as
//! every client has them, but no record is decoded into a value: each response is walked
//! once over its fields, counting the records and summing their values' lengths.
//!
//! With it, the drain scenarios compare the gateway with the relay arm on equal terms: on
//! these 2 cores the Rust client's decoding is otherwise part of the gateway arm's CPU.

use anyhow::{Context, Result};
use bytes::Buf;
use kafka_lease_client::proto::ReadRequest;
use prost::encoding::decode_varint;
use prost::Message;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::Channel;
use tonic::Status;

/// The Read method's path.
const READ_PATH: &str = "/kafka_lease.v1.PartitionLeaseService/Read";

/// What one response held.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Counted {
    pub(crate) records: u64,
    pub(crate) value_bytes: u64,
}

/// Opens a Read on `channel` whose responses arrive as [`Counted`]s.
pub(crate) async fn read(
    channel: Channel,
    request: ReadRequest,
) -> Result<tonic::Streaming<Counted>> {
    let mut grpc = tonic::client::Grpc::new(channel).max_decoding_message_size(8 * 1024 * 1024);
    grpc.ready().await.context("the channel to the gateway")?;
    let path = http::uri::PathAndQuery::from_static(READ_PATH);
    Ok(grpc
        .server_streaming(tonic::Request::new(request), path, CountingCodec)
        .await
        .context("Read (counting reader)")?
        .into_inner())
}

/// Encodes a Read request with prost; decodes a response into a [`Counted`].
struct CountingCodec;

impl Codec for CountingCodec {
    type Encode = ReadRequest;
    type Decode = Counted;
    type Encoder = RequestEncoder;
    type Decoder = ResponseCounter;

    fn encoder(&mut self) -> RequestEncoder {
        RequestEncoder
    }

    fn decoder(&mut self) -> ResponseCounter {
        ResponseCounter
    }
}

struct RequestEncoder;

impl Encoder for RequestEncoder {
    type Item = ReadRequest;
    type Error = Status;

    fn encode(&mut self, item: ReadRequest, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        item.encode(dst)
            .map_err(|e| Status::internal(format!("encoding the Read request: {e}")))
    }
}

struct ResponseCounter;

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
        let counted = count(message)
            .map_err(|what| Status::internal(format!("a malformed ReadResponse: {what}")))?;
        src.advance(len);
        Ok(Some(counted))
    }
}

/// Counts the records (field 1) of an encoded ReadResponse and sums their values' lengths
/// (field 3 of a record).
fn count(mut message: &[u8]) -> Result<Counted, &'static str> {
    let mut counted = Counted::default();
    while !message.is_empty() {
        let (field, body) = next_field(&mut message)?;
        if let (1, Some(mut record)) = (field, body) {
            counted.records += 1;
            while !record.is_empty() {
                if let (3, Some(value)) = next_field(&mut record)? {
                    counted.value_bytes += value.len() as u64;
                }
            }
        }
    }
    Ok(counted)
}

/// Takes one field off the front of `buf`: its number, and its bytes when it is
/// length-delimited.
fn next_field<'a>(buf: &mut &'a [u8]) -> Result<(u64, Option<&'a [u8]>), &'static str> {
    let key = decode_varint(buf).map_err(|_| "a bad field key")?;
    let skip = |buf: &mut &'a [u8], n: usize| -> Result<&'a [u8], &'static str> {
        if buf.len() < n {
            return Err("a field longer than the message");
        }
        let (head, rest) = buf.split_at(n);
        *buf = rest;
        Ok(head)
    };
    let body = match key & 7 {
        0 => {
            decode_varint(buf).map_err(|_| "a bad varint")?;
            None
        }
        1 => {
            skip(buf, 8)?;
            None
        }
        2 => {
            let n = decode_varint(buf).map_err(|_| "a bad length")?;
            Some(skip(buf, usize::try_from(n).map_err(|_| "a bad length")?)?)
        }
        5 => {
            skip(buf, 4)?;
            None
        }
        _ => return Err("an unknown wire type"),
    };
    Ok((key >> 3, body))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_lease_client::proto::{KafkaHeader, KafkaRecord, ReadResponse};

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
        };
        let encoded = response.encode_to_vec();
        assert_eq!(
            count(&encoded),
            Ok(Counted {
                records: 4,
                value_bytes: 1324
            })
        );
        assert_eq!(count(&[]), Ok(Counted::default()));
        assert!(count(&encoded[..encoded.len() - 1]).is_err());
    }
}
