//! Messages whose encoding is written ahead, for the gateway's Read path.
//!
//! A `ReadResponse` built as `v1::ReadResponse` costs, per record, the copies of its key,
//! value and headers into vectors, their allocations and frees, and several walks of the
//! message to size it. The gateway instead writes each record's protobuf encoding straight
//! from librdkafka's buffers into one buffer per batch, and hands tonic an [`Encoded`]
//! message that writes those bytes as they are. The wire format is the proto's: a client
//! decodes an `Encoded<v1::ReadResponse>` as a `v1::ReadResponse`.
//!
//! The server generated in [`crate::encoded`] is `PartitionLeaseService` with
//! [`EncodedReadResponse`], [`EncodedSubscribeResponse`] and [`EncodedDeliverResponse`] in place
//! of the three messages.

use std::marker::PhantomData;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use prost::encoding::{self, DecodeContext, WireType};
use prost::DecodeError;

/// A message of type `T`, held as its encoding (the fields, without a length prefix), in
/// one or more parts written one after the other.
pub struct Encoded<T> {
    parts: Vec<Bytes>,
    message: PhantomData<fn() -> T>,
}

/// The server's `ReadResponse`.
pub type EncodedReadResponse = Encoded<crate::v1::ReadResponse>;
/// The server's `SubscribeResponse`.
pub type EncodedSubscribeResponse = Encoded<crate::v1::SubscribeResponse>;
/// The server's `DeliverResponse`.
pub type EncodedDeliverResponse = Encoded<crate::v1::DeliverResponse>;

impl<T> Encoded<T> {
    /// The message whose encoding is `parts`, concatenated. The caller vouches that they
    /// encode a `T`: nothing here checks it.
    pub fn from_parts(parts: Vec<Bytes>) -> Self {
        Encoded {
            parts,
            message: PhantomData,
        }
    }

    /// The encoding, in one piece.
    pub fn to_bytes(&self) -> Bytes {
        match self.parts.as_slice() {
            [] => Bytes::new(),
            [one] => one.clone(),
            parts => {
                let mut all = BytesMut::with_capacity(self.len());
                for part in parts {
                    all.put_slice(part);
                }
                all.freeze()
            }
        }
    }

    /// The encoding's parts, in order (their concatenation is the message's encoding).
    pub fn into_parts(self) -> Vec<Bytes> {
        self.parts
    }

    /// The encoded length in bytes.
    pub fn len(&self) -> usize {
        self.parts.iter().map(Bytes::len).sum()
    }

    /// Whether the encoding is empty (every field at its default).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<T: prost::Message + Default> Encoded<T> {
    /// `message`, encoded.
    pub fn from_message(message: &T) -> Self {
        Self::from_parts(vec![message.encode_to_vec().into()])
    }

    /// The message these bytes encode.
    pub fn to_message(&self) -> Result<T, DecodeError> {
        T::decode(self.to_bytes())
    }
}

impl<T> Default for Encoded<T> {
    fn default() -> Self {
        Self::from_parts(Vec::new())
    }
}

impl<T> Clone for Encoded<T> {
    fn clone(&self) -> Self {
        Self::from_parts(self.parts.clone())
    }
}

impl<T> PartialEq for Encoded<T> {
    fn eq(&self, other: &Self) -> bool {
        self.to_bytes() == other.to_bytes()
    }
}

impl<T> std::fmt::Debug for Encoded<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Encoded")
            .field("message", &std::any::type_name::<T>())
            .field("len", &self.len())
            .finish()
    }
}

impl<T> prost::Message for Encoded<T> {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        for part in &self.parts {
            buf.put_slice(part);
        }
    }

    /// Keeps the message's bytes as they came, as one part (no copy when `buf` is a
    /// `Bytes` or a `BytesMut`, as tonic's decoder hands it): a forwarded Read relays its
    /// responses without taking them apart record by record. The message's own fields are
    /// walked first, so a truncated or malformed message is refused; what a field holds (a
    /// record) is passed on as it came, for the client to decode.
    fn merge(&mut self, mut buf: impl Buf) -> Result<(), DecodeError>
    where
        Self: Sized,
    {
        let bytes = buf.copy_to_bytes(buf.remaining());
        check_fields(&bytes)?;
        if !bytes.is_empty() {
            self.parts.push(bytes);
        }
        Ok(())
    }

    /// Keeps the field as it came, so decoding and encoding again gives the same bytes.
    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        let mut field = BytesMut::new();
        encoding::encode_key(tag, wire_type, &mut field);
        match wire_type {
            WireType::Varint => {
                encoding::encode_varint(encoding::decode_varint(buf)?, &mut field);
            }
            WireType::SixtyFourBit => {
                let mut value = 0_u64;
                encoding::fixed64::merge(wire_type, &mut value, buf, ctx)?;
                field.put_u64_le(value);
            }
            WireType::ThirtyTwoBit => {
                let mut value = 0_u32;
                encoding::fixed32::merge(wire_type, &mut value, buf, ctx)?;
                field.put_u32_le(value);
            }
            WireType::LengthDelimited => {
                let mut value = Bytes::new();
                encoding::bytes::merge(wire_type, &mut value, buf, ctx)?;
                encoding::encode_varint(value.len() as u64, &mut field);
                self.parts.push(field.freeze());
                self.parts.push(value);
                return Ok(());
            }
            // Groups: proto3 has none, and the two messages held this way have none.
            WireType::StartGroup | WireType::EndGroup => {
                encoding::check_wire_type(WireType::LengthDelimited, wire_type)?;
            }
        }
        self.parts.push(field.freeze());
        Ok(())
    }

    fn encoded_len(&self) -> usize {
        self.len()
    }

    fn clear(&mut self) {
        self.parts.clear();
    }
}

/// Walks the fields of a message's encoding without decoding them: each key, and each value's
/// extent, must be well formed, as prost's decoder requires.
fn check_fields(mut bytes: &[u8]) -> Result<(), DecodeError> {
    while bytes.has_remaining() {
        let (tag, wire_type) = encoding::decode_key(&mut bytes)?;
        // Groups: proto3 has none, and the messages held this way have none.
        if matches!(wire_type, WireType::StartGroup | WireType::EndGroup) {
            encoding::check_wire_type(WireType::LengthDelimited, wire_type)?;
        }
        encoding::skip_field(wire_type, tag, &mut bytes, DecodeContext::default())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1;
    use prost::Message as _;

    fn sample() -> v1::ReadResponse {
        v1::ReadResponse {
            records: vec![
                v1::KafkaRecord {
                    offset: 0,
                    key: None,
                    value: Some(Bytes::new()),
                    headers: vec![v1::KafkaHeader {
                        key: "h".into(),
                        value: None,
                    }],
                    timestamp: None,
                    timestamp_type: 0,
                },
                v1::KafkaRecord {
                    offset: 1 << 40,
                    key: Some(Bytes::from_static(b"k")),
                    value: Some(Bytes::from(vec![7; 300])),
                    headers: Vec::new(),
                    timestamp: Some(prost_types::Timestamp {
                        seconds: -5,
                        nanos: 1,
                    }),
                    timestamp_type: 2,
                },
            ],
            high_watermark: 12,
            seek_epoch: 3,
            next_offset: (1 << 40) + 1,
        }
    }

    #[test]
    fn an_encoded_message_writes_and_reads_the_protos_bytes() {
        let message = sample();
        let encoded = EncodedReadResponse::from_message(&message);
        assert_eq!(encoded.encode_to_vec(), message.encode_to_vec());
        assert_eq!(encoded.encoded_len(), message.encoded_len());
        assert_eq!(encoded.to_message().unwrap(), message);
        // Length-delimited, as inside another message or a gRPC frame.
        assert_eq!(
            encoded.encode_length_delimited_to_vec(),
            message.encode_length_delimited_to_vec()
        );
    }

    #[test]
    fn decoding_keeps_every_field_as_it_came() {
        let bytes = sample().encode_to_vec();
        let decoded = EncodedReadResponse::decode(bytes.as_slice()).unwrap();
        assert_eq!(decoded.encode_to_vec(), bytes);
        assert_eq!(decoded.to_message().unwrap(), sample());
        // Fixed-width fields (no message here has one, but a newer proto may).
        let mut fixed = Vec::new();
        encoding::fixed64::encode(9, &0x0102_0304_0506_0708, &mut fixed);
        encoding::fixed32::encode(10, &0x0a0b_0c0d, &mut fixed);
        let decoded = EncodedReadResponse::decode(fixed.as_slice()).unwrap();
        assert_eq!(decoded.encode_to_vec(), fixed);
    }

    #[test]
    fn a_truncated_encoding_is_refused() {
        let bytes = sample().encode_to_vec();
        assert!(EncodedReadResponse::decode(&bytes[..bytes.len() - 1]).is_err());
        let group = [0x0b_u8, 0x0c];
        assert!(EncodedReadResponse::decode(group.as_slice()).is_err());
    }

    /// Decoding from a `Bytes`, as tonic's decoder does, keeps the message as one slice of
    /// the buffer: no copy, no part per field.
    #[test]
    fn decoding_a_buffer_keeps_it_whole() {
        let bytes = Bytes::from(sample().encode_to_vec());
        let decoded = EncodedReadResponse::decode(bytes.clone()).unwrap();
        assert_eq!(decoded.parts.len(), 1);
        assert_eq!(decoded.parts[0].as_ptr(), bytes.as_ptr());
        assert_eq!(decoded.to_message().unwrap(), sample());
        // Whatever prefix of it arrives, it is refused exactly when prost refuses it (a cut
        // on a field's boundary is a shorter well-formed message to both).
        for n in 0..bytes.len() {
            let cut = bytes.slice(..n);
            assert_eq!(
                EncodedReadResponse::decode(cut.clone()).is_ok(),
                v1::ReadResponse::decode(cut).is_ok(),
                "a cut at {n} of {}",
                bytes.len()
            );
        }
        assert!(EncodedReadResponse::decode(Bytes::new())
            .unwrap()
            .is_empty());
    }

    #[test]
    fn parts_are_written_in_order() {
        let bytes = sample().encode_to_vec();
        let (a, b) = bytes.split_at(5);
        let encoded = EncodedReadResponse::from_parts(vec![
            Bytes::copy_from_slice(a),
            Bytes::copy_from_slice(b),
        ]);
        assert_eq!(encoded.encode_to_vec(), bytes);
        assert_eq!(encoded.to_bytes(), bytes);
        assert!(EncodedReadResponse::default().is_empty());
    }
}
