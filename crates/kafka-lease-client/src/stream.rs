//! Reading a lease: the [`RecordStream`] of [`Batch`]es of [`Record`]s, and the
//! [`EpochFilter`] that drops batches a concurrent Seek made stale.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::stream::{FusedStream, Stream, StreamExt};
use tonic::codec::Streaming;
use tonic::{Code, Status};

use crate::convert::system_time_from_proto;
use crate::error::{Result, StatusDetails};
use kafka_lease_proto::v1 as proto;

/// The newest seek epoch a lease's client has seen, shared between the lease (whose
/// [`seek`](crate::Lease::seek) raises it) and its [`RecordStream`]s (which drop responses of
/// older epochs and raise it from the ones they deliver).
///
/// This is how the client keeps the contract's promise "no stale record after a seek": once
/// a SeekResponse of epoch `n` has been seen, no batch of an epoch below `n` is delivered,
/// even one already on its way when the seek was made. Cloning shares the same counter.
///
/// [`Lease`](crate::Lease) does all of this for you; the type is public for callers that drive
/// [`Client::raw`](crate::Client::raw) themselves.
#[derive(Debug, Clone, Default)]
pub struct EpochFilter {
    newest: Arc<AtomicU64>,
}

impl EpochFilter {
    /// A filter that has seen nothing yet (epoch 0, where every lease starts).
    pub fn new() -> Self {
        Self::default()
    }

    /// The newest epoch seen so far.
    pub fn newest(&self) -> u64 {
        self.newest.load(Ordering::Acquire)
    }

    /// Records an epoch from a SeekResponse: from now on, responses of older epochs are
    /// dropped. Never lowers the newest epoch.
    pub fn observe(&self, epoch: u64) {
        self.newest.fetch_max(epoch, Ordering::AcqRel);
    }

    /// Whether a ReadResponse of `epoch` should be delivered: `true` unless an epoch newer than
    /// it has been seen. A delivered epoch also becomes the newest seen.
    pub fn admit(&self, epoch: u64) -> bool {
        let before = self.newest.fetch_max(epoch, Ordering::AcqRel);
        epoch >= before
    }
}

/// One Kafka record, with every field as the broker stored it.
///
/// The key, value and header values are [`Bytes`]: slices of the gateway's response the
/// record came in, not copies of it. Cloning one is cheap, and keeping one keeps that
/// response's buffer (up to the Read's `max_bytes`) in memory; copy it
/// (`value.to_vec()`) to keep a small part of a large batch for long.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Record {
    /// The record's offset in its partition.
    pub offset: i64,
    /// The key; `None` is a null key, distinct from `Some(Bytes::new())`, an empty one.
    pub key: Option<Bytes>,
    /// The value; `None` is a tombstone, distinct from `Some(Bytes::new())`, an empty value.
    pub value: Option<Bytes>,
    /// `(key, value)` pairs in the order the producer wrote them, duplicates kept; a `None`
    /// value is a null header value, distinct from an empty one.
    pub headers: Vec<(String, Option<Bytes>)>,
    /// The record's timestamp (`UNIX_EPOCH` if the gateway sent none).
    pub timestamp: SystemTime,
    /// Whether the producer or the broker set [`timestamp`](Self::timestamp).
    pub timestamp_type: proto::TimestampType,
}

impl Record {
    /// The value of the first header named `key`: `None` if there is no such header,
    /// `Some(None)` if its value is null.
    pub fn header(&self, key: &str) -> Option<Option<&[u8]>> {
        self.headers
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_deref())
    }
}

impl From<proto::KafkaRecord> for Record {
    fn from(record: proto::KafkaRecord) -> Self {
        Record {
            offset: record.offset,
            key: record.key,
            value: record.value,
            headers: record
                .headers
                .into_iter()
                .map(|h| (h.key, h.value))
                .collect(),
            timestamp: system_time_from_proto(record.timestamp).unwrap_or(UNIX_EPOCH),
            timestamp_type: proto::TimestampType::try_from(record.timestamp_type)
                .unwrap_or(proto::TimestampType::Unspecified),
        }
    }
}

/// One ReadResponse: consecutive records of the partition, in offset order.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Batch {
    /// The records, in offset order, never empty when it comes from the gateway.
    pub records: Vec<Record>,
    /// The partition's high watermark (offset of the next record to be written) as last seen
    /// by the gateway.
    pub high_watermark: i64,
    /// The lease's seek epoch these records belong to.
    pub seek_epoch: u64,
    /// The gateway's `next_offset` (0 from a gateway that predates it).
    after: i64,
}

impl Batch {
    /// The offset to commit once this batch is processed (Kafka commits the next offset to
    /// read): the last record's offset + 1, or further when the offsets after it hold no
    /// record a reader gets (a transaction's marker; `ReadResponse.next_offset`). `None` for
    /// an empty batch.
    pub fn next_offset(&self) -> Option<i64> {
        self.records.last().map(|r| (r.offset + 1).max(self.after))
    }

    /// How far this batch's end is behind the high watermark.
    pub fn lag(&self) -> Option<i64> {
        self.next_offset().map(|next| self.high_watermark - next)
    }
}

impl From<proto::ReadResponse> for Batch {
    fn from(response: proto::ReadResponse) -> Self {
        Batch {
            records: response.records.into_iter().map(Record::from).collect(),
            high_watermark: response.high_watermark,
            seek_epoch: response.seek_epoch,
            after: response.next_offset,
        }
    }
}

/// An open Read on a lease: a stream of [`Batch`]es, from [`Lease::records`](crate::Lease::records).
///
/// - Batches of a seek epoch older than the newest one the lease has seen are dropped
///   silently (see [`EpochFilter`]), so after [`Lease::seek`](crate::Lease::seek) returns, the
///   next batch starts at the sought position.
/// - A broken stream is reopened by itself (see [`ReadOptions::reconnect_attempts`](crate::ReadOptions::reconnect_attempts)):
///   when the connection drops, a proxy resets the stream or the gateway answers that Kafka
///   or Consul is unavailable (with retry advice), it opens a new Read with `from_offset` = the offset after the last record it handed to
///   you, so nothing is skipped and nothing you already received comes again; it names that
///   record's seek epoch (`if_seek_epoch`), so a seek that reached the gateway first is not
///   undone. If a seek happened since the last batch you received, it reopens at the lease's
///   resume point (the seek's offset, or a later commit) instead.
/// - The stream ends (`None`) when the gateway ends it with `OK`, which it does after the lease
///   is released.
/// - An error status is yielded once as `Err` and then the stream ends:
///   [`Error::LeaseEnded`](crate::Error::LeaseEnded) when the lease was lost or expired,
///   [`Error::Superseded`](crate::Error::Superseded) when a newer Read on the lease took over,
///   [`Error::Unavailable`](crate::Error::Unavailable) when reopening failed every time, or
///   at once when the gateway shut down (the lease ended with it:
///   [`Error::is_lease_ended`](crate::Error::is_lease_ended) says so).
///
/// While it is open the lease does not expire. Dropping it closes the Read.
pub struct RecordStream {
    inner: Option<ResponseStream>,
    filter: EpochFilter,
    done: bool,
    reopen: Option<Reopen>,
    /// A reopen in progress: the new Read being opened.
    reopening: Option<ReopenFuture>,
    /// The offset after the last record handed to the caller, and the epoch of its batch.
    delivered: Option<(i64, u64)>,
    /// Failed reopen attempts since the last batch delivered.
    failures: u32,
}

/// The Read responses, boxed so the filtering can be tested without a gateway.
pub(crate) type ResponseStream =
    Pin<Box<dyn Stream<Item = Result<proto::ReadResponse, Status>> + Send>>;

/// Opens a new Read from the given offset (or the lease's resume point), only while the lease
/// is at the given seek epoch (when set).
pub(crate) type OpenRead = Arc<
    dyn Fn(Option<i64>, Option<u64>) -> BoxFuture<'static, Result<ResponseStream, Status>>
        + Send
        + Sync,
>;

type ReopenFuture = BoxFuture<'static, Result<ResponseStream, Status>>;

/// How a [`RecordStream`] reopens itself.
#[derive(Clone)]
pub(crate) struct Reopen {
    pub(crate) open: OpenRead,
    /// Consecutive failed attempts before the error is handed to the caller.
    pub(crate) attempts: u32,
}

/// The first pause before a reopen; it doubles with each failed attempt, up to
/// [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// Whether a status that ended a Read says the stream broke, not the lease, so that
/// reopening it can succeed.
///
/// Where the gateway gave a reason, its retry advice decides: Kafka or Consul unreachable
/// for a moment carries RetryInfo; a lease that ended (lost, expired, or with its gateway's
/// shutdown) or a superseded Read carries none. A status without a reason was made up by
/// tonic or an intermediary (or comes from a gateway older than the details): the
/// connection dropped (tonic reports `UNAVAILABLE`, `UNKNOWN` or `INTERNAL` for that,
/// depending on where it broke), or an intermediary cancelled it.
fn stream_broke(status: &Status) -> bool {
    let details = StatusDetails::from_status(status);
    if details.reason().is_some() {
        return details.retry_after().is_some();
    }
    matches!(
        status.code(),
        Code::Unavailable | Code::Unknown | Code::Internal | Code::Cancelled
    )
}

impl std::fmt::Debug for RecordStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordStream")
            .field("newest_seek_epoch", &self.filter.newest())
            .field("delivered_up_to", &self.delivered.map(|(next, _)| next))
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

impl RecordStream {
    /// Wraps a Read response stream opened through [`Client::raw`](crate::Client::raw),
    /// filtering it by `filter` (share the filter with whatever code does the seeks). A stream
    /// made this way does not reopen itself.
    pub fn new(inner: Streaming<proto::ReadResponse>, filter: EpochFilter) -> Self {
        Self::from_stream(Box::pin(inner), filter, None)
    }

    /// Wraps any stream of Read responses.
    pub(crate) fn from_stream(
        inner: ResponseStream,
        filter: EpochFilter,
        reopen: Option<Reopen>,
    ) -> Self {
        RecordStream {
            inner: Some(inner),
            filter,
            done: false,
            reopen,
            reopening: None,
            delivered: None,
            failures: 0,
        }
    }

    /// The next batch; `None` once the stream has ended.
    pub async fn next_batch(&mut self) -> Option<Result<Batch>> {
        self.next().await
    }

    /// Where a reopened Read must start: right after the last record handed out, while the
    /// lease is at that record's seek epoch (the gateway checks, so a seek that races the
    /// reopen wins); the lease's resume point if a seek is known to have happened since.
    fn reopen_from(&self) -> (Option<i64>, Option<u64>) {
        match self.delivered {
            Some((next, epoch)) if self.filter.newest() <= epoch => (Some(next), Some(epoch)),
            _ => (None, None),
        }
    }

    /// Starts a reopen after `status` broke the stream, if that is allowed; false if the error
    /// must go to the caller.
    fn start_reopen(&mut self, status: &Status) -> bool {
        let Some(reopen) = &self.reopen else {
            return false;
        };
        if !stream_broke(status) || self.failures >= reopen.attempts {
            return false;
        }
        let backoff = FIRST_BACKOFF
            .saturating_mul(1 << self.failures.min(6))
            .min(MAX_BACKOFF);
        self.failures += 1;
        let open = reopen.open.clone();
        let (from, if_seek_epoch) = self.reopen_from();
        self.inner = None;
        self.reopening = Some(Box::pin(async move {
            tokio::time::sleep(backoff).await;
            open(from, if_seek_epoch).await
        }));
        true
    }
}

impl Stream for RecordStream {
    type Item = Result<Batch>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if this.done {
                return Poll::Ready(None);
            }
            if let Some(reopening) = this.reopening.as_mut() {
                let opened = futures::ready!(reopening.as_mut().poll(cx));
                this.reopening = None;
                match opened {
                    Ok(stream) => this.inner = Some(stream),
                    Err(status) => {
                        if this.start_reopen(&status) {
                            continue;
                        }
                        this.done = true;
                        return Poll::Ready(Some(Err(status.into())));
                    }
                }
            }
            let Some(inner) = this.inner.as_mut() else {
                this.done = true;
                return Poll::Ready(None);
            };
            let Some(item) = futures::ready!(inner.as_mut().poll_next(cx)) else {
                this.done = true;
                return Poll::Ready(None);
            };
            match item {
                // Checked when handed out, not when received: a batch buffered before a seek
                // returned is still dropped if it is stale.
                Ok(response) if this.filter.admit(response.seek_epoch) => {
                    let batch = Batch::from(response);
                    if let Some(next) = batch.next_offset() {
                        this.delivered = Some((next, batch.seek_epoch));
                    }
                    this.failures = 0;
                    return Poll::Ready(Some(Ok(batch)));
                }
                Ok(_stale) => continue,
                Err(status) => {
                    if this.start_reopen(&status) {
                        continue;
                    }
                    this.done = true;
                    return Poll::Ready(Some(Err(status.into())));
                }
            }
        }
    }
}

impl FusedStream for RecordStream {
    fn is_terminated(&self) -> bool {
        self.done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filter_starts_at_epoch_zero_and_admits_it() {
        let f = EpochFilter::new();
        assert_eq!(f.newest(), 0);
        assert!(f.admit(0));
        assert!(f.admit(0));
    }

    #[test]
    fn filter_drops_epochs_older_than_a_seen_seek() {
        let f = EpochFilter::new();
        f.observe(2);
        assert!(!f.admit(0));
        assert!(!f.admit(1));
        assert!(f.admit(2));
        assert!(f.admit(3));
        // A delivered newer epoch raises the bar too.
        assert_eq!(f.newest(), 3);
        assert!(!f.admit(2));
    }

    #[test]
    fn observe_never_lowers() {
        let f = EpochFilter::new();
        f.observe(5);
        f.observe(3);
        assert_eq!(f.newest(), 5);
    }

    #[test]
    fn clones_share_the_counter() {
        let lease_side = EpochFilter::new();
        let stream_side = lease_side.clone();
        assert!(stream_side.admit(0));
        lease_side.observe(1);
        assert!(!stream_side.admit(0));
        assert!(stream_side.admit(1));
    }

    #[test]
    fn filter_sequence_models_read_during_seek() {
        // Responses as they may arrive while a seek to epoch 1 races with the stream.
        let f = EpochFilter::new();
        let mut delivered = Vec::new();
        for (epoch, seek_done) in [
            (0, false),
            (0, false),
            (0, true),
            (1, true),
            (0, true),
            (1, true),
        ] {
            if seek_done {
                f.observe(1);
            }
            if f.admit(epoch) {
                delivered.push(epoch);
            }
        }
        assert_eq!(delivered, vec![0, 0, 1, 1]);
    }

    fn response(epoch: u64, offsets: &[i64]) -> Result<proto::ReadResponse, Status> {
        Ok(proto::ReadResponse {
            records: offsets
                .iter()
                .map(|&offset| proto::KafkaRecord {
                    offset,
                    ..Default::default()
                })
                .collect(),
            high_watermark: 100,
            seek_epoch: epoch,
            next_offset: 0,
        })
    }

    fn stream_of(
        items: Vec<Result<proto::ReadResponse, Status>>,
        filter: &EpochFilter,
    ) -> RecordStream {
        RecordStream::from_stream(Box::pin(futures::stream::iter(items)), filter.clone(), None)
    }

    fn offsets(batch: &Batch) -> Vec<i64> {
        batch.records.iter().map(|r| r.offset).collect()
    }

    #[test]
    fn stream_drops_stale_batches_after_a_seek() {
        futures::executor::block_on(async {
            let filter = EpochFilter::new();
            let mut stream = stream_of(
                vec![
                    response(0, &[0, 1]),
                    response(0, &[2, 3]),
                    response(1, &[50]),
                    response(1, &[51]),
                ],
                &filter,
            );
            let first = stream.next_batch().await;
            assert!(matches!(first, Some(Ok(ref b)) if offsets(b) == vec![0, 1]));
            // The seek's response arrives: epoch 1. The buffered epoch-0 batch is dropped.
            filter.observe(1);
            let next = stream.next_batch().await;
            assert!(matches!(next, Some(Ok(ref b)) if offsets(b) == vec![50] && b.seek_epoch == 1));
            let next = stream.next_batch().await;
            assert!(matches!(next, Some(Ok(ref b)) if offsets(b) == vec![51]));
            assert!(stream.next_batch().await.is_none());
            assert!(stream.is_terminated());
        });
    }

    #[test]
    fn stream_raises_the_epoch_from_responses() {
        futures::executor::block_on(async {
            let filter = EpochFilter::new();
            let mut stream = stream_of(
                vec![response(2, &[5]), response(1, &[9]), response(2, &[6])],
                &filter,
            );
            let got: Vec<_> = (&mut stream).collect::<Vec<_>>().await;
            let got: Vec<Vec<i64>> = got.iter().flatten().map(offsets).collect();
            assert_eq!(got, vec![vec![5], vec![6]]);
            assert_eq!(filter.newest(), 2);
        });
    }

    #[test]
    fn stream_yields_one_error_then_ends() {
        futures::executor::block_on(async {
            let filter = EpochFilter::new();
            let mut stream = stream_of(
                vec![
                    response(0, &[0]),
                    Err(Status::failed_precondition("lease expired after 10s")),
                    response(0, &[1]),
                ],
                &filter,
            );
            assert!(matches!(stream.next_batch().await, Some(Ok(_))));
            assert!(matches!(
                stream.next_batch().await,
                Some(Err(crate::Error::LeaseEnded { .. }))
            ));
            assert!(stream.next_batch().await.is_none());
            assert!(stream.next_batch().await.is_none());
        });
    }

    #[test]
    fn stream_maps_superseded() {
        futures::executor::block_on(async {
            let mut stream = stream_of(
                vec![Err(Status::aborted("superseded"))],
                &EpochFilter::new(),
            );
            assert!(matches!(
                stream.next_batch().await,
                Some(Err(crate::Error::Superseded { .. }))
            ));
            assert!(stream.next_batch().await.is_none());
        });
    }

    /// What each reopen asked for: `from_offset` and `if_seek_epoch`.
    type Asked = Arc<std::sync::Mutex<Vec<(Option<i64>, Option<u64>)>>>;

    /// A reopen that records each `from_offset` (and `if_seek_epoch`) asked for and answers with the next scripted
    /// stream (or an error once the script runs out).
    fn scripted_reopen(
        script: Vec<Vec<Result<proto::ReadResponse, Status>>>,
        attempts: u32,
    ) -> (Reopen, Asked) {
        let asked = Arc::new(std::sync::Mutex::new(Vec::new()));
        let script = Arc::new(std::sync::Mutex::new(std::collections::VecDeque::from(
            script,
        )));
        let log = asked.clone();
        let open: OpenRead = Arc::new(move |from: Option<i64>, epoch: Option<u64>| {
            log.lock().unwrap().push((from, epoch));
            let next = script.lock().unwrap().pop_front();
            Box::pin(async move {
                match next {
                    Some(items) => Ok(Box::pin(futures::stream::iter(items)) as ResponseStream),
                    None => Err(Status::unavailable("connection refused")),
                }
            })
        });
        (Reopen { open, attempts }, asked)
    }

    async fn drain(stream: &mut RecordStream) -> (Vec<i64>, Option<crate::Error>) {
        let mut got = Vec::new();
        while let Some(item) = stream.next_batch().await {
            match item {
                Ok(batch) => got.extend(offsets(&batch)),
                Err(e) => return (got, Some(e)),
            }
        }
        (got, None)
    }

    #[tokio::test]
    async fn a_broken_stream_reopens_right_after_the_last_record_handed_out() {
        let filter = EpochFilter::new();
        let (reopen, asked) =
            scripted_reopen(vec![vec![response(1, &[4, 5]), response(1, &[6])]], 3);
        let first = vec![
            response(0, &[0, 1]),
            response(0, &[2, 3]),
            Err(Status::unknown("error reading a body from connection")),
        ];
        let mut stream =
            RecordStream::from_stream(Box::pin(futures::stream::iter(first)), filter, Some(reopen));
        let (got, err) = drain(&mut stream).await;
        assert_eq!(got, vec![0, 1, 2, 3, 4, 5, 6], "no gap, no repeat");
        assert!(err.is_none(), "{err:?}");
        // From the next offset, while the lease is still at that record's epoch.
        assert_eq!(*asked.lock().unwrap(), vec![(Some(4), Some(0))]);
    }

    #[tokio::test]
    async fn a_seek_since_the_last_batch_reopens_at_the_resume_point() {
        let filter = EpochFilter::new();
        let (reopen, asked) = scripted_reopen(vec![vec![response(1, &[50])]], 3);
        let first = vec![
            response(0, &[0, 1]),
            Err(Status::unavailable("h2 protocol error")),
        ];
        let mut stream = RecordStream::from_stream(
            Box::pin(futures::stream::iter(first)),
            filter.clone(),
            Some(reopen),
        );
        assert!(matches!(stream.next_batch().await, Some(Ok(_))));
        filter.observe(1); // the caller's Seek returned epoch 1
        let (got, err) = drain(&mut stream).await;
        assert_eq!(got, vec![50]);
        assert!(err.is_none(), "{err:?}");
        assert_eq!(*asked.lock().unwrap(), vec![(None, None)]);
    }

    #[tokio::test]
    async fn lease_errors_are_not_reopened_and_attempts_are_bounded() {
        let (reopen, asked) = scripted_reopen(vec![], 3);
        let mut stream = RecordStream::from_stream(
            Box::pin(futures::stream::iter(vec![Err(Status::aborted(
                "superseded",
            ))])),
            EpochFilter::new(),
            Some(reopen),
        );
        let (_, err) = drain(&mut stream).await;
        assert!(
            matches!(err, Some(crate::Error::Superseded { .. })),
            "{err:?}"
        );
        assert!(asked.lock().unwrap().is_empty());

        let (reopen, asked) = scripted_reopen(vec![], 3);
        let mut stream = RecordStream::from_stream(
            Box::pin(futures::stream::iter(vec![
                response(0, &[0]),
                Err(Status::unavailable("gone")),
            ])),
            EpochFilter::new(),
            Some(reopen),
        );
        let (got, err) = drain(&mut stream).await;
        assert_eq!(got, vec![0]);
        assert!(
            matches!(err, Some(crate::Error::Unavailable { .. })),
            "{err:?}"
        );
        assert_eq!(*asked.lock().unwrap(), vec![(Some(1), Some(0)); 3]);
        assert!(stream.next_batch().await.is_none());
    }

    fn gateway_status(code: Code, reason: &str, lease_ref: bool, retry: bool) -> Status {
        use tonic_types::{ErrorDetails, StatusExt};
        let mut metadata = std::collections::HashMap::new();
        if lease_ref {
            metadata.insert("lease_ref".to_owned(), "r1".to_owned());
        }
        let mut details = ErrorDetails::with_error_info(reason, crate::ERROR_DOMAIN, metadata);
        if retry {
            details.set_retry_info(Some(Duration::from_secs(1)));
        }
        Status::with_error_details(code, "m", details)
    }

    #[test]
    fn reopening_follows_the_gateway_reason_where_there_is_one() {
        // Outages the gateway advises retrying.
        assert!(stream_broke(&gateway_status(
            Code::Unavailable,
            "KAFKA_UNAVAILABLE",
            false,
            true
        )));
        assert!(stream_broke(&gateway_status(
            Code::Unavailable,
            "CONSUL_UNAVAILABLE",
            false,
            true
        )));
        // The lease ended with its gateway: same code, but reopening cannot succeed.
        assert!(!stream_broke(&gateway_status(
            Code::Unavailable,
            "SHUTTING_DOWN",
            true,
            false
        )));
        for (code, reason) in [
            (Code::FailedPrecondition, "LEASE_LOST"),
            (Code::FailedPrecondition, "LEASE_EXPIRED"),
            (Code::Aborted, "SUPERSEDED"),
            (Code::NotFound, "LEASE_NOT_FOUND"),
        ] {
            assert!(
                !stream_broke(&gateway_status(code, reason, true, false)),
                "{reason}"
            );
        }
        // No details: the transport made the status up; the code decides.
        assert!(stream_broke(&Status::unavailable("connection reset")));
        assert!(stream_broke(&Status::unknown("error reading a body")));
        assert!(!stream_broke(&Status::failed_precondition("lease lost")));
    }

    #[tokio::test]
    async fn a_read_ended_by_the_gateway_shutdown_is_not_reopened() {
        let (reopen, asked) = scripted_reopen(vec![vec![response(0, &[1])]], 3);
        let mut stream = RecordStream::from_stream(
            Box::pin(futures::stream::iter(vec![
                response(0, &[0]),
                Err(gateway_status(
                    Code::Unavailable,
                    "SHUTTING_DOWN",
                    true,
                    false,
                )),
            ])),
            EpochFilter::new(),
            Some(reopen),
        );
        let (got, err) = drain(&mut stream).await;
        assert_eq!(got, vec![0]);
        let err = err.expect("the shutdown is reported");
        assert!(matches!(err, crate::Error::Unavailable { .. }), "{err:?}");
        assert!(err.is_lease_ended() && !err.is_retryable(), "{err:?}");
        assert!(asked.lock().unwrap().is_empty(), "no reopen attempted");
    }

    #[tokio::test]
    async fn a_kafka_outage_reopens_the_read() {
        let (reopen, asked) = scripted_reopen(vec![vec![response(0, &[1])]], 3);
        let mut stream = RecordStream::from_stream(
            Box::pin(futures::stream::iter(vec![
                response(0, &[0]),
                Err(gateway_status(
                    Code::Unavailable,
                    "KAFKA_UNAVAILABLE",
                    false,
                    true,
                )),
            ])),
            EpochFilter::new(),
            Some(reopen),
        );
        let (got, err) = drain(&mut stream).await;
        assert_eq!(got, vec![0, 1]);
        assert!(err.is_none(), "{err:?}");
        assert_eq!(*asked.lock().unwrap(), vec![(Some(1), Some(0))]);
    }

    #[test]
    fn decoded_values_are_slices_of_the_response_not_copies() {
        use prost::Message;
        let response = proto::ReadResponse {
            records: (0..3)
                .map(|i| proto::KafkaRecord {
                    offset: i,
                    key: Some(Bytes::from(format!("key-{i}"))),
                    value: Some(Bytes::from(vec![i as u8; 1024])),
                    headers: vec![proto::KafkaHeader {
                        key: "h".into(),
                        value: Some(Bytes::from_static(b"header value")),
                    }],
                    ..Default::default()
                })
                .collect(),
            high_watermark: 3,
            seek_epoch: 0,
            next_offset: 3,
        };
        // As tonic hands a message to prost: its bytes in a BytesMut of the receive buffer.
        let mut received = bytes::BytesMut::from(&response.encode_to_vec()[..]);
        let range = received.as_ptr() as usize..received.as_ptr() as usize + received.len();
        let batch = Batch::from(proto::ReadResponse::decode(&mut received).expect("decodes"));
        let inside = |b: &Bytes| range.contains(&(b.as_ptr() as usize));
        for (i, record) in batch.records.iter().enumerate() {
            let value = record.value.as_ref().expect("a value");
            assert_eq!(&value[..], &vec![i as u8; 1024][..]);
            assert!(inside(value), "record {i}'s value was copied");
            assert!(
                inside(record.key.as_ref().expect("a key")),
                "key {i} was copied"
            );
            let header = record.headers[0].1.as_ref().expect("a header value");
            assert!(inside(header), "record {i}'s header value was copied");
        }
    }

    #[test]
    fn record_conversion_keeps_absent_and_empty_apart() {
        let record = Record::from(proto::KafkaRecord {
            offset: 7,
            key: None,
            value: Some(Bytes::new()),
            headers: vec![
                proto::KafkaHeader {
                    key: "a".into(),
                    value: None,
                },
                proto::KafkaHeader {
                    key: "a".into(),
                    value: Some(Bytes::new()),
                },
                proto::KafkaHeader {
                    key: "b".into(),
                    value: Some(Bytes::from_static(b"x")),
                },
            ],
            timestamp: Some(prost_types::Timestamp {
                seconds: 1_700_000_000,
                nanos: 5_000_000,
            }),
            timestamp_type: proto::TimestampType::LogAppendTime as i32,
        });
        assert_eq!(record.offset, 7);
        assert_eq!(record.key, None);
        assert_eq!(record.value, Some(Bytes::new()));
        assert_eq!(
            record.headers,
            vec![
                ("a".to_owned(), None),
                ("a".to_owned(), Some(Bytes::new())),
                ("b".to_owned(), Some(Bytes::from_static(b"x"))),
            ]
        );
        assert_eq!(record.header("a"), Some(None));
        assert_eq!(record.header("b"), Some(Some(&b"x"[..])));
        assert_eq!(record.header("c"), None);
        assert_eq!(
            record.timestamp,
            UNIX_EPOCH + std::time::Duration::new(1_700_000_000, 5_000_000)
        );
        assert_eq!(record.timestamp_type, proto::TimestampType::LogAppendTime);
    }

    #[test]
    fn record_conversion_tolerates_missing_fields() {
        let record = Record::from(proto::KafkaRecord {
            timestamp_type: 99,
            ..Default::default()
        });
        assert_eq!(record.timestamp, UNIX_EPOCH);
        assert_eq!(record.timestamp_type, proto::TimestampType::Unspecified);
    }

    #[test]
    fn batch_next_offset_and_lag() {
        let batch = Batch::from(proto::ReadResponse {
            records: vec![
                proto::KafkaRecord {
                    offset: 10,
                    ..Default::default()
                },
                proto::KafkaRecord {
                    offset: 11,
                    ..Default::default()
                },
            ],
            high_watermark: 20,
            seek_epoch: 2,
            next_offset: 0,
        });
        // A gateway that predates `next_offset`: the last record + 1.
        assert_eq!(batch.next_offset(), Some(12));
        assert_eq!(batch.lag(), Some(8));
        assert_eq!(batch.seek_epoch, 2);
        // Past a transaction's marker after the last record.
        let past = Batch::from(proto::ReadResponse {
            records: vec![proto::KafkaRecord {
                offset: 11,
                ..Default::default()
            }],
            high_watermark: 13,
            seek_epoch: 2,
            next_offset: 13,
        });
        assert_eq!(past.next_offset(), Some(13));
        assert_eq!(past.lag(), Some(0));
        let empty = Batch::from(proto::ReadResponse::default());
        assert_eq!(empty.next_offset(), None);
        assert_eq!(empty.lag(), None);
    }
}
