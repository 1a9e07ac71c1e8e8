//! Records taken from a partition queue many at a time, through librdkafka's C API.
//!
//! rust-rdkafka's partition stream pops one record per poll, and each poll costs librdkafka's
//! bookkeeping of an application poll (clock reads, the consumed position updated under the
//! partition's lock) and rust-rdkafka an allocation and a clock read of its own.
//! `rd_kafka_consume_batch_queue` pops up to n records under one poll's bookkeeping and
//! hands them over as librdkafka's own messages, freed one by one when dropped
//! ([`RawMessage`]). The queue is the same one the stream waits on, so a Read still parks on
//! rust-rdkafka's wake-up when the queue is empty.

use std::cell::OnceCell;
use std::collections::VecDeque;
use std::ffi::{c_void, CStr};
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::ptr::NonNull;

use rdkafka::bindings as rd;
use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Header, Headers, Message, OwnedHeaders, OwnedMessage};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::Timestamp;

use super::group::GroupClient;

/// The most records one pop takes.
pub(super) const MOST_POPPED: usize = 128;

/// A handle of librdkafka's own on a partition's fetch queue (rust-rdkafka's queue neither
/// tells its length nor pops in batches).
pub(super) struct QueueHandle(NonNull<rd::rd_kafka_queue_t>);

// SAFETY: a librdkafka queue handle may be used from any thread: every operation on it takes
// the queue's own lock.
#[allow(unsafe_code)]
unsafe impl Send for QueueHandle {}
#[allow(unsafe_code)]
unsafe impl Sync for QueueHandle {}

impl QueueHandle {
    #[allow(unsafe_code)]
    pub(super) fn of(client: &GroupClient, topic: &CStr, partition: i32) -> Option<Self> {
        // SAFETY: the client handle is valid while `client` lives; the topic pointer is a
        // NUL-terminated string that outlives the call. The handle returned holds its own
        // reference to the queue, released in `drop`.
        let queue = unsafe {
            rd::rd_kafka_queue_get_partition(
                client.consumer.client().native_ptr(),
                topic.as_ptr(),
                partition,
            )
        };
        NonNull::new(queue).map(QueueHandle)
    }

    /// Ops in the queue (records, errors and events).
    #[allow(unsafe_code)]
    pub(super) fn len(&self) -> usize {
        // SAFETY: the handle is valid until `drop`; the call only reads the queue's length
        // under its lock.
        unsafe { rd::rd_kafka_queue_length(self.0.as_ptr()) }
    }

    /// Moves up to `most` (at most [`MOST_POPPED`]) of the records the queue holds now onto
    /// the back of `into`, without waiting; how many it moved. Records of an older fetch
    /// version (before a seek) are dropped by librdkafka on the way, as a poll drops them.
    #[allow(unsafe_code)]
    pub(super) fn pop(&self, most: usize, into: &mut VecDeque<RawMessage>) -> usize {
        let mut popped = [std::ptr::null_mut::<rd::rd_kafka_message_t>(); MOST_POPPED];
        let most = most.clamp(1, MOST_POPPED);
        // SAFETY: the handle is valid until `drop`; librdkafka writes at most `most` message
        // pointers into the array, each one ours to destroy (RawMessage's drop). A timeout of
        // 0 returns at once.
        let n = unsafe {
            rd::rd_kafka_consume_batch_queue(self.0.as_ptr(), 0, popped.as_mut_ptr(), most)
        };
        let n = usize::try_from(n).unwrap_or(0).min(most);
        into.extend(
            popped[..n]
                .iter()
                .filter_map(|&ptr| NonNull::new(ptr))
                .map(|ptr| RawMessage {
                    ptr,
                    headers: OnceCell::new(),
                }),
        );
        n
    }
}

impl Drop for QueueHandle {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        // SAFETY: the handle came from rd_kafka_queue_get_partition and is destroyed once.
        unsafe { rd::rd_kafka_queue_destroy(self.0.as_ptr()) }
    }
}

/// A record popped from a partition queue, owned until dropped: librdkafka's message, read in
/// place (no copy) and destroyed on drop.
pub(super) struct RawMessage {
    ptr: NonNull<rd::rd_kafka_message_t>,
    /// Its headers, parsed by librdkafka on the first look.
    headers: OnceCell<Option<RawHeaders>>,
}

// SAFETY: a popped message is the application's alone until destroyed; librdkafka touches it
// no more, and destroying it may happen on any thread.
#[allow(unsafe_code)]
unsafe impl Send for RawMessage {}

impl std::fmt::Debug for RawMessage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawMessage")
            .field("partition", &self.partition())
            .field("offset", &self.offset())
            .finish()
    }
}

impl RawMessage {
    #[allow(unsafe_code)]
    fn raw(&self) -> &rd::rd_kafka_message_t {
        // SAFETY: valid and unaliased by librdkafka until drop.
        unsafe { self.ptr.as_ref() }
    }

    /// A copy that outlives the queue (for a record rust-rdkafka's stream handed over that
    /// did not fit in its batch); what is not UTF-8 in a header's name replaced by U+FFFD.
    pub(super) fn to_owned_message(&self) -> OwnedMessage {
        let headers = self.headers().map(|headers| {
            (0..headers.count())
                .filter_map(|i| headers.try_get(i))
                .fold(
                    OwnedHeaders::new_with_capacity(headers.count()),
                    |kept, header| {
                        kept.insert(Header {
                            key: header.key,
                            value: header.value,
                        })
                    },
                )
        });
        OwnedMessage::new(
            self.payload().map(<[u8]>::to_vec),
            self.key().map(<[u8]>::to_vec),
            self.topic().to_string(),
            self.timestamp(),
            self.partition(),
            self.offset(),
            headers,
        )
    }

    /// The error this message carries in place of a record (a fetch error librdkafka
    /// reports through the queue), if any.
    pub(super) fn error(&self) -> Option<KafkaError> {
        let err = self.raw().err;
        (err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR)
            .then(|| KafkaError::MessageConsumption(RDKafkaErrorCode::from(err)))
    }
}

impl Drop for RawMessage {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        // SAFETY: popped by rd_kafka_consume_batch_queue, destroyed once, here.
        unsafe { rd::rd_kafka_message_destroy(self.ptr.as_ptr()) }
    }
}

#[allow(unsafe_code)]
fn slice<'a>(ptr: *const c_void, len: usize) -> Option<&'a [u8]> {
    // SAFETY (for the callers): `ptr` points at `len` bytes that live as long as the message
    // the returned slice is tied to.
    (!ptr.is_null()).then(|| unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) })
}

impl Message for RawMessage {
    type Headers = RawHeaders;

    fn key(&self) -> Option<&[u8]> {
        slice(self.raw().key, self.raw().key_len)
    }

    fn payload(&self) -> Option<&[u8]> {
        slice(self.raw().payload, self.raw().len)
    }

    #[allow(unsafe_code)]
    unsafe fn payload_mut(&mut self) -> Option<&mut [u8]> {
        let (ptr, len) = (self.raw().payload, self.raw().len);
        // SAFETY: as `payload`, and the message is ours alone (the caller takes librdkafka's
        // caveat on writing into it, as the trait says).
        (!ptr.is_null()).then(|| unsafe { std::slice::from_raw_parts_mut(ptr.cast::<u8>(), len) })
    }

    #[allow(unsafe_code)]
    fn topic(&self) -> &str {
        // SAFETY: a consumed message's topic handle lives as long as the message; its name is
        // a NUL-terminated string owned by the handle.
        let name = unsafe { CStr::from_ptr(rd::rd_kafka_topic_name(self.raw().rkt)) };
        name.to_str().unwrap_or_default()
    }

    fn partition(&self) -> i32 {
        self.raw().partition
    }

    fn offset(&self) -> i64 {
        self.raw().offset
    }

    #[allow(unsafe_code)]
    fn timestamp(&self) -> Timestamp {
        let mut kind = rd::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE;
        // SAFETY: the message is valid; the call reads its timestamp into `kind`.
        let ms = unsafe { rd::rd_kafka_message_timestamp(self.ptr.as_ptr(), &mut kind) };
        match kind {
            _ if ms == -1 => Timestamp::NotAvailable,
            rd::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE => {
                Timestamp::NotAvailable
            }
            rd::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_CREATE_TIME => {
                Timestamp::CreateTime(ms)
            }
            rd::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_LOG_APPEND_TIME => {
                Timestamp::LogAppendTime(ms)
            }
        }
    }

    #[allow(unsafe_code)]
    fn headers(&self) -> Option<&RawHeaders> {
        self.headers
            .get_or_init(|| {
                let mut headers = std::ptr::null_mut();
                // SAFETY: the message is valid; librdkafka parses its headers once and keeps
                // them with the message, which owns them until it is destroyed.
                let err = unsafe { rd::rd_kafka_message_headers(self.ptr.as_ptr(), &mut headers) };
                if err == rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
                    NonNull::new(headers).map(|ptr| RawHeaders {
                        ptr,
                        lossy_names: OnceCell::new(),
                    })
                } else {
                    None
                }
            })
            .as_ref()
    }
}

/// A message rust-rdkafka's stream handed over, read as a popped one is, in place and
/// without taking it over: rust-rdkafka's own headers unwrap a header's name as UTF-8 and
/// panic on one that is not, which Kafka allows ([`RawHeaders`] replaces what is not).
pub(super) struct Viewed<'a> {
    raw: ManuallyDrop<RawMessage>,
    _message: PhantomData<&'a ()>,
}

impl<'a> Viewed<'a> {
    pub(super) fn of(message: &'a BorrowedMessage<'_>) -> Option<Self> {
        NonNull::new(message.ptr()).map(|ptr| Viewed {
            // Never dropped: the message stays rust-rdkafka's, destroyed with `message`.
            raw: ManuallyDrop::new(RawMessage {
                ptr,
                headers: OnceCell::new(),
            }),
            _message: PhantomData,
        })
    }
}

impl std::ops::Deref for Viewed<'_> {
    type Target = RawMessage;

    fn deref(&self) -> &RawMessage {
        &self.raw
    }
}

/// A message's headers, read in place.
pub(super) struct RawHeaders {
    ptr: NonNull<rd::rd_kafka_headers_t>,
    /// Every header's name with what is not UTF-8 replaced by U+FFFD, made at the first
    /// name that is not (Kafka allows any bytes there; the API's header key is a string).
    lossy_names: OnceCell<Vec<String>>,
}

impl RawHeaders {
    /// Header `idx`'s name and value as librdkafka holds them.
    #[allow(unsafe_code)]
    fn raw(&self, idx: usize) -> Option<(&CStr, Option<&[u8]>)> {
        let (mut name, mut value, mut len) = (std::ptr::null(), std::ptr::null(), 0);
        // SAFETY: the headers live as long as their message, which outlives `self`'s borrow;
        // librdkafka points `name` and `value` into the headers it owns.
        let err = unsafe {
            rd::rd_kafka_header_get_all(self.ptr.as_ptr(), idx, &mut name, &mut value, &mut len)
        };
        if err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR || name.is_null() {
            return None;
        }
        // SAFETY: a header's name is a NUL-terminated string owned by the headers.
        Some((unsafe { CStr::from_ptr(name) }, slice(value, len)))
    }
}

impl Headers for RawHeaders {
    #[allow(unsafe_code)]
    fn count(&self) -> usize {
        // SAFETY: the headers live as long as their message, which outlives `self`'s borrow.
        unsafe { rd::rd_kafka_header_cnt(self.ptr.as_ptr()) }
    }

    fn try_get(&self, idx: usize) -> Option<Header<'_, &[u8]>> {
        let (name, value) = self.raw(idx)?;
        let key = match name.to_str() {
            Ok(key) => key,
            Err(_) => self
                .lossy_names
                .get_or_init(|| {
                    (0..self.count())
                        .map(|i| {
                            self.raw(i).map_or_else(String::new, |(name, _)| {
                                name.to_string_lossy().into_owned()
                            })
                        })
                        .collect()
                })
                .get(idx)?,
        };
        Some(Header { key, value })
    }
}
