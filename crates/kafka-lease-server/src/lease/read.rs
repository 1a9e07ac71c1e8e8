//! The Read path of a lease: a Read's limits and start ([`ReadLimits`], [`ReadFrom`]), the
//! fill of one batch from the partition's feed, and [`ReadStream`], which hands a batch over
//! only under the lease's state lock and only while its seek epoch and position still hold
//! (the seek guarantee in the module docs of [`crate::lease`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;

use kafka_lease_proto::v1;
use kafka_lease_proto::wire::EncodedReadResponse;

use crate::error::LeaseError;
use crate::kafka::BatchLimits;
use crate::records::{EncodedRecords, RecordsFor};

use super::{Fence, Lease, SeekEpoch};

/// The most bytes of records the gateway puts in one response, whatever larger `max_bytes`
/// a Read or a Subscribe allows (`max_bytes` is a bound, not a size to reach; a single larger
/// record, up to `max_bytes`, still comes alone). A batch this size, and tonic's copy of it,
/// are written into memory the allocator hands back rather than fresh pages, and stay in the
/// core's cache on their way to the socket: with 16 and 64 partitions read at once, batches
/// of 4 MiB cost a quarter more CPU per record (page faults 16 % of it), and one partition
/// gains nothing from them (docs/BENCHMARKS.md, "Batches that fit the cache").
pub const FILL_BYTES: usize = 256 * 1024;

/// Limits of one Read, validated.
#[derive(Clone, Copy, Debug)]
pub struct ReadLimits {
    pub max_records: usize,
    pub max_bytes: usize,
    pub max_wait: Duration,
}

/// Where a Read asks to start: `offset`, only while the lease is at `if_seek_epoch` (when set).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadFrom {
    pub offset: i64,
    pub if_seek_epoch: Option<SeekEpoch>,
}

/// How a Read ends.
pub(super) enum Stop {
    /// With OK: the lease was released.
    Done,
    /// With this error.
    Failed(LeaseError),
}

impl Stop {
    /// The stream's last item: none for OK, else the error.
    fn last_item(self) -> Option<Result<ReadBatch, LeaseError>> {
        match self {
            Stop::Done => None,
            Stop::Failed(err) => Some(Err(err)),
        }
    }
}

/// What one fill produced.
enum Fill {
    Batch {
        epoch: SeekEpoch,
        from: i64,
        records: EncodedRecords,
        high_watermark: Option<i64>,
        /// Where the feed stands after the batch, past offsets that hold no record.
        reached: i64,
    },
    /// The Read must end.
    Stop(Stop),
    /// Interrupted or failed transiently: fill again.
    Again,
}

type FillFuture = Pin<Box<dyn Future<Output = Fill> + Send>>;

/// How often a Read or Deliver looks again at a suspended lock.
const SUSPENDED_LOOK: Duration = Duration::from_millis(50);

/// Waits once while the lock is suspended (the gateway waits for Consul to confirm its
/// session): [`SUSPENDED_LOOK`], or less when the lease is interrupted (a Seek, a Release,
/// its end).
pub(crate) async fn suspended_pause(interrupts: &mut tokio::sync::watch::Receiver<u64>) {
    tokio::select! {
        () = tokio::time::sleep(SUSPENDED_LOOK) => {}
        _ = interrupts.changed() => {}
    }
}

/// Fills one batch for Read `generation`, starting at the lease position.
async fn fill(
    lease: Arc<Lease>,
    generation: u64,
    limits: ReadLimits,
    records_for: RecordsFor,
) -> Fill {
    // Subscribe before looking at the state, so an interrupt after the look is not missed.
    let mut interrupts = lease.interrupts.subscribe();
    // Look before waiting for the feed: a newer Read may hold it for as long as its partition
    // is idle, and this Read must end rather than wait behind it.
    if let Some(stop) = lease.read_stop(&lease.state(), generation) {
        return Fill::Stop(stop);
    }
    // While the lock is suspended (the gateway waits for Consul to confirm its session),
    // fetch nothing to hand over: look again shortly, or at once on an interrupt (a Seek, a
    // Release, the lease's end).
    if lease.fence().is_suspended() {
        suspended_pause(&mut interrupts).await;
        return Fill::Again;
    }
    let mut feed_guard = tokio::select! {
        guard = lease.feed.lock() => guard,
        _ = interrupts.changed() => return Fill::Again,
    };
    let (epoch, from) = {
        let state = lease.state();
        if let Some(stop) = lease.read_stop(&state, generation) {
            return Fill::Stop(stop);
        }
        (state.seek_epoch, state.position)
    };
    let Some(feed) = feed_guard.as_mut() else {
        // The lease is being dismantled; the next look at the state ends the Read.
        drop(feed_guard);
        let _ = interrupts.changed().await;
        return Fill::Again;
    };
    if let Err(err) = feed.align(from).await {
        tracing::warn!(
            parent: &lease.span,
            error = %err,
            "repositioning the partition failed; retrying",
        );
        drop(feed_guard);
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(500)) => {}
            _ = interrupts.changed() => {}
        }
        return Fill::Again;
    }

    let batch_limits = BatchLimits {
        max_records: limits.max_records,
        // Room for the response's own fields (high watermark, epoch) beside the records.
        max_bytes: limits.max_bytes.min(FILL_BYTES).saturating_sub(32),
    };
    let mut records = feed.new_batch(batch_limits, records_for);
    // Armed once the batch has a record: one clock read per batch, not per record.
    let mut deadline: Option<Instant> = None;
    loop {
        // Everything librdkafka already holds, without waiting or arming a timer.
        if !feed.take_queued(&mut records, from, batch_limits) {
            break;
        }
        if !records.is_empty() {
            // Caught up with the partition: more records would have to be produced first,
            // and max_wait is how long the gateway *may* wait. A partition still behind its
            // high watermark waits for librdkafka's next fetch instead, to fill the batch.
            if feed.caught_up() {
                break;
            }
            deadline.get_or_insert_with(|| Instant::now() + limits.max_wait);
        }
        let next = async {
            match deadline {
                Some(at) => {
                    tokio::time::timeout_at(at, feed.take_next(&mut records, from, batch_limits))
                        .await
                        .ok()
                }
                None => Some(feed.take_next(&mut records, from, batch_limits).await),
            }
        };
        let room = tokio::select! {
            biased;
            _ = interrupts.changed() => return Fill::Again,
            room = next => room,
        };
        match room {
            // The wait for more ran out.
            None => break,
            Some(false) => break,
            Some(true) => {}
        }
    }
    feed.filled(&mut records);
    let high_watermark = feed.cached_high_watermark();
    // Past offsets after the last record that hold none (a transaction's marker).
    let reached = feed.pass_invisible();
    Fill::Batch {
        epoch,
        from,
        records,
        high_watermark,
        reached,
    }
}

/// One batch of a Read: records encoded for the wire, with the response's other fields.
#[derive(Debug)]
pub struct ReadBatch {
    pub records: EncodedRecords,
    pub high_watermark: i64,
    pub seek_epoch: SeekEpoch,
    /// The lease's position after this batch: its last record + 1, or past the offsets
    /// after it that hold no record (a transaction's marker).
    pub next_offset: i64,
}

impl ReadBatch {
    /// The batch as the Read call sends it.
    pub fn into_response(self) -> EncodedReadResponse {
        self.records.into_read_response(
            self.high_watermark,
            self.seek_epoch.get(),
            self.next_offset,
        )
    }

    /// The batch decoded, as a client sees it (for tests; the Read path never decodes).
    pub fn decode(&self) -> v1::ReadResponse {
        v1::ReadResponse {
            records: self.records.decode(),
            high_watermark: self.high_watermark,
            seek_epoch: self.seek_epoch.get(),
            next_offset: self.next_offset,
        }
    }
}

/// The stream behind one Read call. Ends with `None` after Release; yields one error and
/// ends otherwise. Dropping it (the client went away) closes the Read, which starts the
/// lease's TTL.
pub struct ReadStream {
    lease: Arc<Lease>,
    generation: u64,
    limits: ReadLimits,
    /// The message its batches are written for: a Subscribe's Reads write for its records
    /// events, so the batch need not be rewritten on the way.
    records_for: RecordsFor,
    fill: Option<FillFuture>,
    finished: bool,
}

impl ReadStream {
    /// Read `generation` of `lease`, just opened.
    pub(super) fn new(lease: Arc<Lease>, generation: u64, limits: ReadLimits) -> Self {
        ReadStream {
            lease,
            generation,
            limits,
            records_for: RecordsFor::Read,
            fill: None,
            finished: false,
        }
    }

    /// The same Read, its batches written for a Subscribe's records events.
    pub fn for_subscribe(mut self) -> Self {
        self.records_for = RecordsFor::Subscribe;
        self
    }
}

impl std::fmt::Debug for ReadStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadStream")
            .field("lease", &self.lease.lease_ref)
            .field("generation", &self.generation)
            .finish()
    }
}

impl Drop for ReadStream {
    fn drop(&mut self) {
        self.lease.close_read(self.generation);
    }
}

impl futures::Stream for ReadStream {
    type Item = Result<ReadBatch, LeaseError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        loop {
            if this.finished {
                return Poll::Ready(None);
            }
            let (lease, generation, limits) = (this.lease.clone(), this.generation, this.limits);
            let records_for = this.records_for;
            let fut = this
                .fill
                .get_or_insert_with(|| Box::pin(fill(lease, generation, limits, records_for)));
            let outcome = match fut.as_mut().poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(outcome) => outcome,
            };
            this.fill = None;
            match outcome {
                Fill::Again => continue,
                Fill::Stop(stop) => {
                    this.finished = true;
                    return Poll::Ready(stop.last_item());
                }
                Fill::Batch {
                    epoch,
                    from,
                    records,
                    high_watermark,
                    reached,
                } => {
                    // The handoff: under the state lock, so a Seek either happened before
                    // (and this batch is dropped) or happens after the batch is handed over.
                    match this.lease.fence() {
                        Fence::Open => {}
                        // Dropped (the next fill seeks back to the position and waits for
                        // the session's confirmation first).
                        Fence::Suspended(_) => continue,
                        Fence::Closed(fenced) => {
                            this.finished = true;
                            return Poll::Ready(Some(Err(fenced)));
                        }
                    }
                    let mut state = this.lease.state();
                    if let Some(stop) = this.lease.read_stop(&state, this.generation) {
                        this.finished = true;
                        return Poll::Ready(stop.last_item());
                    }
                    if state.seek_epoch != epoch || state.position != from {
                        continue;
                    }
                    let Some(last) = records.last_offset() else {
                        continue;
                    };
                    state.position = reached.max(last + 1);
                    this.lease.delivered.records.increment(records.len() as u64);
                    this.lease
                        .delivered
                        .bytes
                        .increment(records.wire_len() as u64);
                    let high = high_watermark.unwrap_or(0).max(state.position);
                    state.high_watermark = state.high_watermark.max(high);
                    let response = ReadBatch {
                        records,
                        high_watermark: state.high_watermark,
                        seek_epoch: epoch,
                        next_offset: state.position,
                    };
                    return Poll::Ready(Some(Ok(response)));
                }
            }
        }
    }
}
