//! The Read path: [`PartitionFeed`], one leased partition's queue split off the group client
//! claimed to fetch it (perhaps another group's: `Kafka::fetcher`), and the filling of a
//! batch from it ([`BatchLimits`]).

use std::collections::VecDeque;
use std::ffi::CString;
use std::future::Future;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use rdkafka::consumer::stream_consumer::StreamPartitionQueue;
use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::{Offset, TopicPartitionList};

use super::errors::{blocking, unavailable};
use super::group::{FetchClaim, GroupClient};
use super::raw::{QueueHandle, RawMessage, Viewed};
use super::settings::ClientLog;
use crate::error::LeaseError;
use crate::records::{EncodedRecords, Prepared, RecordsFor};

/// How long a parked partition queue waits for a wake-up before it looks again by itself:
/// the bound on a wake-up librdkafka did not give (see [`PartitionFeed::take_next`]). Every
/// open Read that waits for records looks this often, so it is what an idle Read costs (at
/// 20 ms, 1,000 idle Reads cost 164 to 330 millicores: docs/CAPACITY.md).
const REPOLL: Duration = Duration::from_millis(250);

/// How many times a queue that still holds ops after a poll that found no record is looked
/// at again at once, before it parks until a wake-up or [`REPOLL`].
const LOOKS_BEFORE_PARKING: u32 = 4;

/// A leased partition's records, as they arrive from the client that fetches it. Dropping it
/// stops the fetching of that partition.
pub struct PartitionFeed {
    // Dropped in this order: the popped records and the handle before the queue, and the
    // claim last (its client owns the librdkafka client they belong to).
    /// Records popped from the queue and not yet added to a batch, in order (the rest of a
    /// pop that filled a batch).
    popped: VecDeque<RawMessage>,
    /// The same queue as `queue`, to pop its records in batches and to ask how many ops it
    /// holds before parking on it.
    handle: QueueHandle,
    /// The claim's topic for librdkafka's C API (never absent: topic names are validated).
    topic_c: Option<CString>,
    /// The queue as rust-rdkafka's stream, to wait on it when it is empty.
    queue: StreamPartitionQueue<ClientLog>,
    /// Parked looks that found ops queued: wake-ups librdkafka did not give.
    rescues: metrics::Counter,
    /// Where the queue stands: the lease position its next record follows (the offset after
    /// the last record taken, or the position a record put back was to follow).
    pulled_up_to: i64,
    /// A record the wait for one took from the queue but did not deliver (it did not fit in
    /// the batch): the next batch's first. Only when `popped` is empty.
    pending: Option<OwnedMessage>,
    /// The size on the wire of the last record added: how many records one pop should take
    /// to fill the rest of a batch, so that few wait in `popped`.
    record_hint: usize,
    /// The size of the last batch filled from this partition: the next batch's buffer
    /// starts this large, so that a drain's batches are written once, not grown by copying.
    batch_hint: usize,
    /// The last batch's allocation (empty, sharing it with the response being sent): the
    /// next batch takes it back once that response is dropped, so a lease holds at most one
    /// batch buffer between batches (within the per-lease bound, `max_bytes`).
    spare: bytes::BytesMut,
    /// The client that fetches the partition, claimed for this lease. Last, so it is given
    /// back only after the partition was unassigned (in `drop`) and the queue dropped:
    /// dropping a queue clears its wake-up callback, which would be the next claimant's if
    /// that one had already split the same partition's queue.
    claim: FetchClaim,
}

impl std::fmt::Debug for PartitionFeed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartitionFeed")
            .field("topic", &self.claim.topic())
            .field("partition", &self.claim.partition())
            .field("pulled_up_to", &self.pulled_up_to)
            .finish()
    }
}

impl Drop for PartitionFeed {
    fn drop(&mut self) {
        self.popped.clear();
        let mut list = TopicPartitionList::new();
        if list
            .add_partition_offset(self.claim.topic(), self.claim.partition(), Offset::Invalid)
            .is_ok()
        {
            if let Err(err) = self.claim.client().consumer.incremental_unassign(&list) {
                tracing::warn!(
                    topic = %self.claim.topic(),
                    partition = self.claim.partition(),
                    error = %err,
                    "unassign failed",
                );
            }
        }
    }
}

impl PartitionFeed {
    /// Starts fetching the claimed partition at `offset` through the client claimed for it,
    /// into a queue of its own.
    pub(crate) fn open(claim: FetchClaim, offset: i64) -> Result<Self, LeaseError> {
        let (client, topic, partition) = (claim.client(), claim.topic(), claim.partition());
        // Split before assigning, so no record can reach the shared main queue.
        let queue = client
            .consumer
            .split_partition_queue(topic, partition)
            .ok_or_else(|| {
                unavailable("opening a partition queue", "librdkafka refused the queue")
            })?;
        let topic_c = CString::new(topic).ok();
        let handle = topic_c
            .as_deref()
            .and_then(|t| QueueHandle::of(client, t, partition))
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
            popped: VecDeque::new(),
            handle,
            topic_c,
            queue,
            rescues: metrics::counter!(crate::metrics::READ_RESCUES),
            pulled_up_to: offset,
            pending: None,
            record_hint: 0,
            batch_hint: 0,
            spare: bytes::BytesMut::new(),
            claim,
        })
    }

    /// The client that fetches the partition (perhaps another group's).
    pub fn client(&self) -> &Arc<GroupClient> {
        self.claim.client()
    }

    /// Makes the next record taken be the first at or after `position`. Records pulled but
    /// not delivered (a Read that ended mid-batch, a Seek) put the queue ahead of the lease;
    /// this repositions librdkafka, which purges what it pre-fetched from the old position.
    pub async fn align(&mut self, position: i64) -> Result<(), LeaseError> {
        if self.pulled_up_to == position {
            return Ok(());
        }
        self.pending = None;
        self.popped.clear();
        let consumer = self.claim.client().consumer.clone();
        let topic = self.claim.topic().to_string();
        let partition = self.claim.partition();
        let timeout = self.claim.client().request_timeout;
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
    /// arming a timer: records popped from the queue a batch at a time (see
    /// [`super::raw`]). False once the batch is full.
    pub fn take_queued(
        &mut self,
        batch: &mut EncodedRecords,
        from: i64,
        limits: BatchLimits,
    ) -> bool {
        if let Some(message) = self.pending.take() {
            let added = add(batch, &message, from, limits);
            if !self.took(message.offset(), &added) {
                if let Added::Left(_) = added {
                    self.pending = Some(message);
                }
                return false;
            }
        }
        loop {
            if self.popped.is_empty()
                && self
                    .handle
                    .pop(self.to_pop(batch, limits), &mut self.popped)
                    == 0
            {
                return true;
            }
            while let Some(message) = self.popped.pop_front() {
                if let Some(err) = message.error() {
                    log_fetch_error(self.claim.topic(), self.claim.partition(), &err);
                    continue;
                }
                let added = add(batch, &message, from, limits);
                if !self.took(message.offset(), &added) {
                    if let Added::Left(_) = added {
                        self.popped.push_front(message);
                    }
                    return false;
                }
            }
        }
    }

    /// Notes what adding the record at `offset` did; whether the batch has room for more.
    fn took(&mut self, offset: i64, added: &Added) -> bool {
        match *added {
            Added::Room(len) | Added::Full(len) => {
                self.pulled_up_to = offset + 1;
                if len > 0 {
                    self.record_hint = len;
                }
                matches!(added, Added::Room(_))
            }
            Added::Left(expected) => {
                self.pulled_up_to = expected;
                false
            }
        }
    }

    /// How many records to pop for the rest of `batch`: those it has room for, by count and
    /// by the last record's size (one more, so that a batch that fills by bytes is full).
    fn to_pop(&self, batch: &EncodedRecords, limits: BatchLimits) -> usize {
        let by_count = limits.max_records.saturating_sub(batch.len());
        let by_bytes = match self.record_hint {
            0 => 1,
            hint => limits.max_bytes.saturating_sub(batch.wire_len()) / hint + 1,
        };
        by_count.min(by_bytes)
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
        if self.pending.is_some() || !self.popped.is_empty() {
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
            let waited = {
                let length = &self.handle;
                let mut recv = std::pin::pin!(self.queue.recv());
                let mut looks = 0;
                let parked = std::future::poll_fn(|cx| match recv.as_mut().poll(cx) {
                    Poll::Pending if looks < LOOKS_BEFORE_PARKING && length.len() > 0 => {
                        looks += 1;
                        cx.waker().wake_by_ref();
                        Poll::Pending
                    }
                    other => other,
                });
                match tokio::time::timeout(REPOLL, parked).await {
                    Ok(Ok(message)) => match Viewed::of(&message) {
                        Some(message) => {
                            let added = add(batch, &*message, from, limits);
                            let left =
                                matches!(added, Added::Left(_)).then(|| message.to_owned_message());
                            Ok(Ok((message.offset(), added, left)))
                        }
                        None => continue,
                    },
                    Ok(Err(err)) => Ok(Err(err)),
                    Err(elapsed) => Err(elapsed),
                }
            };
            match waited {
                Ok(Ok((offset, added, left))) => {
                    let room = self.took(offset, &added);
                    self.pending = left;
                    return room;
                }
                Ok(Err(err)) => self.log_fetch_error(&err),
                Err(_) => {
                    let queued = self.handle.len();
                    if queued > 0 {
                        self.rescues.increment(1);
                        tracing::debug!(
                            topic = %self.claim.topic(),
                            partition = self.claim.partition(),
                            queued,
                            "read rescue: ops queued without a wake-up"
                        );
                    }
                }
            }
        }
    }

    /// A buffer for the next batch, written for `message`, sized as the last one was (within
    /// `limits`), in the last batch's allocation when its response is gone.
    pub fn new_batch(&mut self, limits: BatchLimits, message: RecordsFor) -> EncodedRecords {
        EncodedRecords::reusing(
            std::mem::take(&mut self.spare),
            self.batch_hint.min(limits.max_bytes),
            message,
        )
    }

    /// Notes the size of a filled batch and keeps a handle on its allocation, for
    /// [`Self::new_batch`].
    pub fn filled(&mut self, batch: &mut EncodedRecords) {
        self.batch_hint = batch.wire_len();
        self.spare = batch.split_spare();
    }

    /// librdkafka's position of the partition when it is past the last record taken and
    /// nothing taken from its queue waits here: the offsets between hold no record this
    /// reader can see (a transaction's marker, an aborted record).
    fn position_past_taken(&self) -> Option<i64> {
        // Records still waiting, here or in librdkafka's queue, come first; asking librdkafka
        // only once its queue is empty keeps the call off a drain's batches.
        if self.pending.is_some() || !self.popped.is_empty() || self.handle.len() > 0 {
            return None;
        }
        self.claim
            .client()
            .position_of(self.claim.topic(), self.claim.partition())
            .filter(|&position| position > self.pulled_up_to)
    }

    /// Moves where the queue stands past offsets that hold no record this reader can see
    /// (see [`Self::position_past_taken`]); returns where it stands. Queue mode counts the
    /// offsets passed as done, so that its committed offset reaches a partition's end even
    /// when a transaction's marker is the partition's last offset.
    pub fn pass_invisible(&mut self) -> i64 {
        if let Some(position) = self.position_past_taken() {
            self.pulled_up_to = position;
        }
        self.pulled_up_to
    }

    /// Whether every record up to the high watermark librdkafka last saw has been taken:
    /// a batch need not wait for more.
    ///
    /// Read committed, the last offsets of a partition may hold no record (a transaction's
    /// marker ends every transaction): librdkafka's position, past them, counts then.
    pub fn caught_up(&self) -> bool {
        self.pending.is_none()
            && self.popped.is_empty()
            && self.cached_high_watermark().is_some_and(|high| {
                self.pulled_up_to >= high
                    || self
                        .position_past_taken()
                        .is_some_and(|position| position >= high)
            })
    }

    fn log_fetch_error(&self, err: &KafkaError) {
        log_fetch_error(self.claim.topic(), self.claim.partition(), err);
    }

    /// The high watermark as librdkafka last saw it, if it has seen one.
    pub fn cached_high_watermark(&self) -> Option<i64> {
        self.claim
            .client()
            .cached_high_watermark_of(self.topic_c.as_deref()?, self.claim.partition())
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

/// What adding a record to a batch did.
enum Added {
    /// Added, or dropped as before the batch's next offset (size 0); the batch has room.
    /// The record's size on the wire.
    Room(usize),
    /// Added, and the batch is full; the record's size on the wire.
    Full(usize),
    /// Not added: it does not fit; the offset the batch's next record would have had.
    Left(i64),
}

/// Adds `message` to `batch`, which starts at `from`. A record before the batch's next
/// offset (pre-fetched before a reposition) is dropped, never delivered twice; one that does
/// not fit is left for the next batch. The first record always fits, so a record larger
/// than `max_bytes` goes alone.
fn add<M: Message>(
    batch: &mut EncodedRecords,
    message: &M,
    from: i64,
    limits: BatchLimits,
) -> Added {
    let expected = batch.last_offset().map_or(from, |last| last + 1);
    if message.offset() < expected {
        return Added::Room(0);
    }
    let prepared = Prepared::of(message);
    let len = prepared.wire_len();
    if !batch.is_empty() && batch.wire_len() + len > limits.max_bytes {
        return Added::Left(expected);
    }
    batch.push(&prepared);
    if batch.wire_len() < limits.max_bytes && batch.len() < limits.max_records {
        Added::Room(len)
    } else {
        Added::Full(len)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use std::ffi::CString;

    use rdkafka::bindings as rd;
    use rdkafka::mocking::MockCluster;
    use rdkafka::producer::{BaseProducer, FutureProducer, FutureRecord, Producer};
    use rdkafka::ClientConfig;

    use super::{BatchLimits, PartitionFeed};
    use crate::kafka::{Kafka, KafkaSettings};
    use crate::records::RecordsFor;

    /// One batch from `from`, filled as a Read fills it: what librdkafka holds, then a wait
    /// for more until the batch is full or no record comes for a second.
    async fn batch(feed: &mut PartitionFeed, from: i64, limits: BatchLimits) -> Vec<i64> {
        feed.align(from).await.expect("align");
        let mut records = feed.new_batch(limits, RecordsFor::Read);
        while feed.take_queued(&mut records, from, limits) {
            let next = feed.take_next(&mut records, from, limits);
            match tokio::time::timeout(Duration::from_secs(1), next).await {
                Ok(true) => {}
                Ok(false) | Err(_) => break,
            }
        }
        feed.filled(&mut records);
        records.decode().iter().map(|r| r.offset).collect()
    }

    fn offsets(from: i64, count: usize) -> Vec<i64> {
        (from..from + count as i64).collect()
    }

    /// Records are popped from librdkafka many at a time, so a batch that fills by bytes
    /// leaves popped records behind: they start the next batch (no gap, no repeat), and a
    /// reposition drops them with librdkafka's pre-fetched ones (nothing of the old position
    /// follows a Seek's new one, backwards or forwards).
    #[tokio::test(flavor = "multi_thread")]
    async fn records_popped_beyond_a_full_batch_start_the_next_and_a_reposition_drops_them() {
        let cluster = MockCluster::new(1).expect("mock cluster");
        cluster.create_topic("feed", 1, 1).expect("topic");
        let producer: FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", cluster.bootstrap_servers())
            .set("linger.ms", "5")
            .create()
            .expect("producer");
        let sends: Vec<_> = (0..300)
            .map(|i| {
                let value = format!("{i:0>100}");
                let record = FutureRecord::<(), _>::to("feed")
                    .partition(0)
                    .payload(&value);
                producer.send_result(record).expect("queued")
            })
            .collect();
        for sent in sends {
            sent.await.expect("delivered").expect("produced");
        }
        let kafka = Kafka::new(KafkaSettings::new(cluster.bootstrap_servers(), "feed-test"))
            .expect("client");
        let client = kafka.group("feed-group").expect("group client");
        let claim = kafka.fetcher(&client, "feed", 0).expect("claim");
        let mut feed = PartitionFeed::open(claim, 0).expect("feed");
        // 1,999 bytes: about 16 records of 117 bytes on the wire, never an exact fit.
        let limits = BatchLimits {
            max_records: 1_000,
            max_bytes: 1_999,
        };

        let first = batch(&mut feed, 0, limits).await;
        let n = first.len();
        assert!(n > 1, "a batch of several records, not {first:?}");
        assert_eq!(first, offsets(0, n));
        assert!(
            feed.pending.is_some() || !feed.popped.is_empty(),
            "the record that did not fit waits in the feed"
        );
        let second = batch(&mut feed, n as i64, limits).await;
        assert_eq!(
            second,
            offsets(n as i64, n),
            "the next batch starts with it"
        );
        assert!(!feed.popped.is_empty(), "popped records wait in the feed");

        let back = batch(&mut feed, 5, limits).await;
        assert_eq!(
            back,
            offsets(5, n),
            "after a seek back, from the new position"
        );
        let ahead = batch(&mut feed, 200, limits).await;
        assert_eq!(
            ahead,
            offsets(200, n),
            "after a seek ahead, from the new position"
        );
        let rest = batch(&mut feed, 200 + n as i64, limits).await;
        assert_eq!(rest, offsets(200 + n as i64, n));
        drop(feed);
        kafka.close().await;
    }

    /// Produces a record with one header named `name` (any bytes but NUL) to partition 0 of
    /// `topic`, through librdkafka's C API: rust-rdkafka takes a header name as a `&str`.
    #[allow(unsafe_code)]
    fn produce_with_header(producer: &BaseProducer, topic: &str, name: &[u8], value: &[u8]) {
        let topic = CString::new(topic).expect("topic");
        let name = CString::new(name).expect("a name without NUL");
        let vu = |vtype, u| rd::rd_kafka_vu_t { vtype, u };
        let fields = [
            vu(
                rd::rd_kafka_vtype_t::RD_KAFKA_VTYPE_TOPIC,
                rd::rd_kafka_vu_s__bindgen_ty_1 {
                    cstr: topic.as_ptr(),
                },
            ),
            vu(
                rd::rd_kafka_vtype_t::RD_KAFKA_VTYPE_PARTITION,
                rd::rd_kafka_vu_s__bindgen_ty_1 { i32_: 0 },
            ),
            vu(
                rd::rd_kafka_vtype_t::RD_KAFKA_VTYPE_MSGFLAGS,
                rd::rd_kafka_vu_s__bindgen_ty_1 {
                    i: rd::RD_KAFKA_MSG_F_COPY,
                },
            ),
            vu(
                rd::rd_kafka_vtype_t::RD_KAFKA_VTYPE_VALUE,
                rd::rd_kafka_vu_s__bindgen_ty_1 {
                    mem: rd::rd_kafka_vu_s__bindgen_ty_1__bindgen_ty_1 {
                        ptr: b"payload".as_ptr().cast_mut().cast(),
                        size: 7,
                    },
                },
            ),
            vu(
                rd::rd_kafka_vtype_t::RD_KAFKA_VTYPE_HEADER,
                rd::rd_kafka_vu_s__bindgen_ty_1 {
                    header: rd::rd_kafka_vu_s__bindgen_ty_1__bindgen_ty_2 {
                        name: name.as_ptr(),
                        val: value.as_ptr().cast(),
                        size: value.len() as isize,
                    },
                },
            ),
        ];
        // SAFETY: every field points at memory that outlives the call, which copies the value
        // (F_COPY) and the header.
        let error = unsafe {
            rd::rd_kafka_produceva(
                producer.client().native_ptr(),
                fields.as_ptr(),
                fields.len(),
            )
        };
        assert!(error.is_null(), "produceva refused the record");
    }

    /// Kafka allows any bytes in a header's name; the API's header key is a string. A record
    /// whose header name is not UTF-8 reaches the client with the name replaced (U+FFFD) and
    /// its value intact, whether the fill waited for it (rust-rdkafka's stream hands it over)
    /// or popped it: it panicked the fill before (rust-rdkafka unwraps the name as UTF-8),
    /// and every Read that reached it after.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_header_name_that_is_not_utf8_is_replaced_not_a_panic() {
        let cluster = MockCluster::new(1).expect("mock cluster");
        cluster.create_topic("headers", 1, 1).expect("topic");
        let producer: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", cluster.bootstrap_servers())
            .create()
            .expect("producer");
        let kafka = Kafka::new(KafkaSettings::new(cluster.bootstrap_servers(), "feed-test"))
            .expect("client");
        let client = kafka.group("headers-group").expect("group client");
        let claim = kafka.fetcher(&client, "headers", 0).expect("claim");
        let mut feed = PartitionFeed::open(claim, 0).expect("feed");
        let limits = BatchLimits {
            max_records: 3,
            max_bytes: 1 << 20,
        };
        // The fill looks at the empty queue and waits before anything is produced, so the
        // first record comes through the wait; the next two are popped.
        let produce = async {
            for value in [&b"first"[..], b"second", b"third"] {
                produce_with_header(&producer, "headers", b"trace-\xff\xfe", value);
            }
            producer.flush(Duration::from_secs(5)).expect("flushed");
        };
        let mut records = feed.new_batch(limits, RecordsFor::Read);
        let fill = async {
            let mut room = feed.take_queued(&mut records, 0, limits);
            while room {
                room = feed.take_next(&mut records, 0, limits).await
                    && feed.take_queued(&mut records, 0, limits);
            }
        };
        let ((), ()) = tokio::time::timeout(Duration::from_secs(30), async {
            tokio::join!(fill, produce)
        })
        .await
        .expect("three records within 30 s");
        let headers: Vec<(String, Option<Vec<u8>>)> = records
            .decode()
            .iter()
            .flat_map(|r| {
                r.headers
                    .iter()
                    .map(|h| (h.key.clone(), h.value.as_deref().map(<[u8]>::to_vec)))
            })
            .collect();
        let named = |value: &[u8]| ("trace-\u{fffd}\u{fffd}".to_string(), Some(value.to_vec()));
        assert_eq!(
            headers,
            vec![named(b"first"), named(b"second"), named(b"third")]
        );
        drop(feed);
        kafka.close().await;
    }
}
