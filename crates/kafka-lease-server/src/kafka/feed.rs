//! The Read path: [`PartitionFeed`], one leased partition's queue split off its group's
//! client, and the filling of a batch from it ([`BatchLimits`]).

use std::ffi::{CStr, CString};
use std::future::Future;
use std::ptr::NonNull;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use rdkafka::consumer::stream_consumer::StreamPartitionQueue;
use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Message, OwnedMessage};
use rdkafka::{Offset, TopicPartitionList};

use super::errors::{blocking, unavailable};
use super::group::GroupClient;
use super::settings::ClientLog;
use crate::error::LeaseError;
use crate::records::{EncodedRecords, Prepared};

/// How long a parked partition queue waits for a wake-up before it looks again by itself:
/// the bound on a wake-up librdkafka did not give (see [`PartitionFeed::take_next`]). Every
/// open Read that waits for records looks this often, so it is what an idle Read costs (at
/// 20 ms, 1,000 idle Reads cost 164 to 330 millicores: docs/CAPACITY.md).
const REPOLL: Duration = Duration::from_millis(250);

/// How many times a queue that still holds ops after a poll that found no record is looked
/// at again at once, before it parks until a wake-up or [`REPOLL`].
const LOOKS_BEFORE_PARKING: u32 = 4;

/// A leased partition's records, as they arrive from the group client. Dropping it stops the
/// fetching of that partition.
pub struct PartitionFeed {
    client: Arc<GroupClient>,
    topic: String,
    /// `topic` for librdkafka's C API (never absent: topic names are validated).
    topic_c: Option<CString>,
    partition: i32,
    queue: StreamPartitionQueue<ClientLog>,
    /// The same queue, to ask how many ops it holds before parking on it.
    length: QueueLength,
    /// Parked looks that found ops queued: wake-ups librdkafka did not give.
    rescues: metrics::Counter,
    /// The offset after the last record taken from the queue: where the queue stands.
    pulled_up_to: i64,
    /// A record taken from the queue but not delivered (it did not fit in a batch), with the
    /// lease position it follows.
    pending: Option<(OwnedMessage, i64)>,
    /// The size of the last batch filled from this partition: the next batch's buffer
    /// starts this large, so that a drain's batches are written once, not grown by copying.
    batch_hint: usize,
    /// The last batch's allocation (empty, sharing it with the response being sent): the
    /// next batch takes it back once that response is dropped, so a lease holds at most one
    /// batch buffer between batches (within the per-lease bound, `max_bytes`).
    spare: bytes::BytesMut,
}

impl std::fmt::Debug for PartitionFeed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartitionFeed")
            .field("topic", &self.topic)
            .field("partition", &self.partition)
            .field("pulled_up_to", &self.pulled_up_to)
            .finish()
    }
}

impl Drop for PartitionFeed {
    fn drop(&mut self) {
        let mut list = TopicPartitionList::new();
        if list
            .add_partition_offset(&self.topic, self.partition, Offset::Invalid)
            .is_ok()
        {
            if let Err(err) = self.client.consumer.incremental_unassign(&list) {
                tracing::warn!(topic = %self.topic, partition = self.partition, error = %err, "unassign failed");
            }
        }
    }
}

impl PartitionFeed {
    /// Starts fetching `client`'s `topic`/`partition` at `offset` into a queue of its own.
    pub(crate) fn open(
        client: &Arc<GroupClient>,
        topic: &str,
        partition: i32,
        offset: i64,
    ) -> Result<Self, LeaseError> {
        // Split before assigning, so no record can reach the shared main queue.
        let queue = client
            .consumer
            .split_partition_queue(topic, partition)
            .ok_or_else(|| {
                unavailable("opening a partition queue", "librdkafka refused the queue")
            })?;
        let topic_c = CString::new(topic).ok();
        let length = topic_c
            .as_deref()
            .and_then(|t| QueueLength::of(client, t, partition))
            .ok_or_else(|| {
                unavailable("opening a partition queue", "librdkafka refused the queue")
            })?;
        let mut list = TopicPartitionList::new();
        list.add_partition_offset(topic, partition, Offset::Offset(offset))
            .map_err(|e| unavailable("assigning a partition", e))?;
        client
            .consumer
            .incremental_assign(&list)
            .map_err(|e| unavailable("assigning a partition", e))?;
        Ok(PartitionFeed {
            client: client.clone(),
            topic: topic.to_string(),
            topic_c,
            partition,
            queue,
            length,
            rescues: metrics::counter!(crate::metrics::READ_RESCUES),
            pulled_up_to: offset,
            pending: None,
            batch_hint: 0,
            spare: bytes::BytesMut::new(),
        })
    }

    pub fn client(&self) -> &Arc<GroupClient> {
        &self.client
    }

    /// Makes the next record taken be the first at or after `position`. Records pulled but
    /// not delivered (a Read that ended mid-batch, a Seek) put the queue ahead of the lease;
    /// this repositions librdkafka, which purges what it pre-fetched from the old position.
    pub async fn align(&mut self, position: i64) -> Result<(), LeaseError> {
        match &self.pending {
            Some((_, put_back_at)) if *put_back_at == position => return Ok(()),
            None if self.pulled_up_to == position => return Ok(()),
            _ => {}
        }
        self.pending = None;
        let consumer = self.client.consumer.clone();
        let topic = self.topic.clone();
        let partition = self.partition;
        let timeout = self.client.request_timeout;
        blocking("seeking", move || {
            consumer
                .seek(&topic, partition, Offset::Offset(position), timeout)
                .map_err(|e| unavailable("seeking", e))
        })
        .await?;
        self.pulled_up_to = position;
        Ok(())
    }

    /// Adds to `batch` what librdkafka already holds for the partition, without waiting or
    /// arming a timer (the per-record fast path: one look at the queue per record). False
    /// once the batch is full.
    pub fn take_queued(
        &mut self,
        batch: &mut EncodedRecords,
        from: i64,
        limits: BatchLimits,
    ) -> bool {
        if let Some((message, _)) = self.pending.take() {
            if !add(&mut self.pending, batch, &message, from, limits) {
                return false;
            }
        }
        // One message stream for the whole look: each stream registers a waker slot with
        // rdkafka (under its lock) when made and frees it when dropped, which per record
        // would cost more than the record.
        let mut stream = self.queue.stream();
        loop {
            let message = match stream.next().now_or_never() {
                None => return true,
                Some(None) => unreachable!("a partition queue's stream never ends"),
                Some(Some(Ok(message))) => message,
                Some(Some(Err(err))) => {
                    log_fetch_error(&self.topic, self.partition, &err);
                    continue;
                }
            };
            self.pulled_up_to = message.offset() + 1;
            if !add(&mut self.pending, batch, &message, from, limits) {
                return false;
            }
        }
    }

    /// Waits for the next record and adds it to `batch`; false once the batch is full.
    /// Cancel-safe: a record leaves the queue only in the poll that adds it. Transient fetch
    /// errors are logged and waited out.
    pub async fn take_next(
        &mut self,
        batch: &mut EncodedRecords,
        from: i64,
        limits: BatchLimits,
    ) -> bool {
        if self.pending.is_some() {
            return self.take_queued(batch, from, limits);
        }
        loop {
            // librdkafka wakes a queue's reader only when the queue goes from empty to
            // non-empty, and a poll can find no record while ops are still queued (one it
            // served itself, one of an older fetch version it dropped): parked then, the
            // reader would sleep through the records behind them, whose arrival is no
            // edge (rust-rdkafka issue #665). So a queue that still holds ops is looked at
            // again before parking, and a parked one looks again every REPOLL all the same;
            // a look that then finds ops counts as a rescue (a wake-up librdkafka missed).
            let length = &self.length;
            let mut recv = std::pin::pin!(self.queue.recv());
            let mut looks = 0;
            let parked = std::future::poll_fn(|cx| match recv.as_mut().poll(cx) {
                Poll::Pending if looks < LOOKS_BEFORE_PARKING && length.get() > 0 => {
                    looks += 1;
                    cx.waker().wake_by_ref();
                    Poll::Pending
                }
                other => other,
            });
            match tokio::time::timeout(REPOLL, parked).await {
                Ok(Ok(message)) => {
                    self.pulled_up_to = message.offset() + 1;
                    return add(&mut self.pending, batch, &message, from, limits);
                }
                Ok(Err(err)) => self.log_fetch_error(&err),
                Err(_) => {
                    let queued = self.length.get();
                    if queued > 0 {
                        self.rescues.increment(1);
                        tracing::debug!(
                            topic = %self.topic,
                            partition = self.partition,
                            queued,
                            "read rescue: ops queued without a wake-up"
                        );
                    }
                }
            }
        }
    }

    /// A buffer for the next batch, sized as the last one was (within `limits`), in the last
    /// batch's allocation when its response is gone.
    pub fn new_batch(&mut self, limits: BatchLimits) -> EncodedRecords {
        EncodedRecords::reusing(
            std::mem::take(&mut self.spare),
            self.batch_hint.min(limits.max_bytes),
        )
    }

    /// Notes the size of a filled batch and keeps a handle on its allocation, for
    /// [`Self::new_batch`].
    pub fn filled(&mut self, batch: &mut EncodedRecords) {
        self.batch_hint = batch.wire_len();
        self.spare = batch.split_spare();
    }

    /// Whether every record up to the high watermark librdkafka last saw has been taken:
    /// a batch need not wait for more.
    pub fn caught_up(&self) -> bool {
        self.pending.is_none()
            && self
                .cached_high_watermark()
                .is_some_and(|high| self.pulled_up_to >= high)
    }

    fn log_fetch_error(&self, err: &KafkaError) {
        log_fetch_error(&self.topic, self.partition, err);
    }

    /// The high watermark as librdkafka last saw it, if it has seen one.
    pub fn cached_high_watermark(&self) -> Option<i64> {
        self.client
            .cached_high_watermark_of(self.topic_c.as_deref()?, self.partition)
    }
}

fn log_fetch_error(topic: &str, partition: i32, err: &KafkaError) {
    tracing::warn!(%topic, partition, error = %err, "fetch error; librdkafka retries");
}

/// How much a batch may hold.
#[derive(Clone, Copy, Debug)]
pub struct BatchLimits {
    pub max_records: usize,
    /// Bytes for the records on the wire (see [`EncodedRecords::wire_len`]).
    pub max_bytes: usize,
}

/// A message that can be kept past the queue's borrow.
trait Keep: Message {
    fn keep(&self) -> OwnedMessage;
}

impl Keep for BorrowedMessage<'_> {
    fn keep(&self) -> OwnedMessage {
        self.detach()
    }
}

impl Keep for OwnedMessage {
    fn keep(&self) -> OwnedMessage {
        self.clone()
    }
}

/// Adds `message` to `batch`, which starts at `from`; false once the batch is full. A
/// record that does not fit is kept in `pending`, to start the next batch; a record before
/// the batch's next offset (pre-fetched before a reposition) is dropped, never delivered
/// twice. The first record always fits, so a record larger than `max_bytes` goes alone.
fn add<M: Keep>(
    pending: &mut Option<(OwnedMessage, i64)>,
    batch: &mut EncodedRecords,
    message: &M,
    from: i64,
    limits: BatchLimits,
) -> bool {
    let expected = batch.last_offset().map_or(from, |last| last + 1);
    if message.offset() < expected {
        return true;
    }
    let prepared = Prepared::of(message);
    if !batch.is_empty() && batch.wire_len() + prepared.wire_len() > limits.max_bytes {
        *pending = Some((message.keep(), expected));
        return false;
    }
    batch.push(&prepared);
    batch.wire_len() < limits.max_bytes && batch.len() < limits.max_records
}

/// A handle of librdkafka's own on a partition's fetch queue, to ask how many ops it holds
/// (rust-rdkafka's queue does not tell).
struct QueueLength(NonNull<rdkafka::bindings::rd_kafka_queue_t>);

// SAFETY: a librdkafka queue handle may be used from any thread: every operation on it takes
// the queue's own lock.
#[allow(unsafe_code)]
unsafe impl Send for QueueLength {}
#[allow(unsafe_code)]
unsafe impl Sync for QueueLength {}

impl QueueLength {
    #[allow(unsafe_code)]
    fn of(client: &GroupClient, topic: &CStr, partition: i32) -> Option<Self> {
        // SAFETY: the client handle is valid while `client` lives; the topic pointer is a
        // NUL-terminated string that outlives the call. The handle returned holds its own
        // reference to the queue, released in `drop`.
        let queue = unsafe {
            rdkafka::bindings::rd_kafka_queue_get_partition(
                client.consumer.client().native_ptr(),
                topic.as_ptr(),
                partition,
            )
        };
        NonNull::new(queue).map(QueueLength)
    }

    /// Ops in the queue (records, errors and events).
    #[allow(unsafe_code)]
    fn get(&self) -> usize {
        // SAFETY: the handle is valid until `drop`; the call only reads the queue's length
        // under its lock.
        unsafe { rdkafka::bindings::rd_kafka_queue_length(self.0.as_ptr()) }
    }
}

impl Drop for QueueLength {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        // SAFETY: the handle came from rd_kafka_queue_get_partition and is destroyed once.
        unsafe { rdkafka::bindings::rd_kafka_queue_destroy(self.0.as_ptr()) }
    }
}
