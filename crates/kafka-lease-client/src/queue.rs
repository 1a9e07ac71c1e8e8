//! Queue mode: a lease's records as [`Delivery`]s answered one by one
//! ([`Lease::deliveries`]), and a consumer that runs a handler per record with a concurrency
//! setting ([`Lease::consume`]).
//!
//! Answers are batched: each lease sends at most one Acknowledge at a time, and the answers
//! made meanwhile go together in the next one, so a busy consumer sends few calls and an idle
//! one answers at once.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;

use crate::connection::Connection;
use crate::convert::{duration_to_proto, system_time_from_proto};
use crate::error::{Error, Result};
use crate::lease::Lease;
use crate::stream::Record;
use kafka_lease_proto::v1 as proto;

/// How many times in a row a broken Deliver is reopened before the error reaches the caller.
const DEFAULT_RECONNECT_ATTEMPTS: u32 = 8;

/// How a queue's records may be handed out relative to each other.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Ordering {
    /// One record at a time, in offset order (the default).
    #[default]
    Partition,
    /// The records of one key one at a time, in offset order; keys in parallel. A record
    /// being retried holds back its key only.
    Key,
    /// Any record, in parallel.
    Unordered,
}

/// A queue's settings. Everything left unset takes the gateway's default; a lease keeps the
/// settings of its first Deliver.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueOptions {
    ordering: Ordering,
    pub(crate) max_in_flight: u32,
    max_in_flight_bytes: u32,
    ack_deadline: Option<Duration>,
    max_deliveries: u32,
    dead_letter_topic: String,
    reconnect_attempts: Option<u32>,
}

impl QueueOptions {
    /// The gateway's defaults: partition order, 64 in flight, a 30 s ack deadline, 5
    /// deliveries, dead letters to `dlq.<group>.<topic>`.
    pub fn new() -> Self {
        Self::default()
    }

    /// How records may be handed out relative to each other.
    pub fn ordering(mut self, ordering: Ordering) -> Self {
        self.ordering = ordering;
        self
    }

    /// Most deliveries unanswered at once (1 ..= 10,000; default 64).
    pub fn max_in_flight(mut self, records: u32) -> Self {
        self.max_in_flight = records;
        self
    }

    /// Most bytes of records unanswered at once (default 4 MiB; at most 64 MiB).
    pub fn max_in_flight_bytes(mut self, bytes: u32) -> Self {
        self.max_in_flight_bytes = bytes;
        self
    }

    /// How long a delivery may go unanswered before it is delivered again (1 s ..= 1 h;
    /// default 30 s).
    pub fn ack_deadline(mut self, deadline: Duration) -> Self {
        self.ack_deadline = Some(deadline);
        self
    }

    /// Deliveries after which a failing record goes to the dead letter topic (1 ..= 100;
    /// default 5).
    pub fn max_deliveries(mut self, deliveries: u32) -> Self {
        self.max_deliveries = deliveries;
        self
    }

    /// The dead letter topic (default `dlq.<group>.<topic>`); it must exist.
    pub fn dead_letter_topic(mut self, topic: impl Into<String>) -> Self {
        self.dead_letter_topic = topic.into();
        self
    }

    /// How many times in a row a broken Deliver is reopened (default 8).
    pub fn reconnect_attempts(mut self, attempts: u32) -> Self {
        self.reconnect_attempts = Some(attempts);
        self
    }

    /// The settings as a Subscribe's `queue`.
    pub(crate) fn settings(&self) -> proto::QueueSettings {
        let request = self.request("");
        proto::QueueSettings {
            ordering: request.ordering,
            max_in_flight: request.max_in_flight,
            max_in_flight_bytes: request.max_in_flight_bytes,
            ack_deadline: request.ack_deadline,
            max_deliveries: request.max_deliveries,
            dead_letter_topic: request.dead_letter_topic,
        }
    }

    fn request(&self, lease_id: &str) -> proto::DeliverRequest {
        proto::DeliverRequest {
            lease_id: lease_id.to_string(),
            ordering: match self.ordering {
                Ordering::Partition => proto::DeliveryOrder::Partition,
                Ordering::Key => proto::DeliveryOrder::Key,
                Ordering::Unordered => proto::DeliveryOrder::Unordered,
            } as i32,
            max_in_flight: self.max_in_flight,
            max_in_flight_bytes: self.max_in_flight_bytes,
            ack_deadline: self.ack_deadline.map(duration_to_proto),
            max_deliveries: self.max_deliveries,
            dead_letter_topic: self.dead_letter_topic.clone(),
        }
    }
}

/// What became of an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckOutcome {
    /// Applied.
    Applied,
    /// Changed nothing: the delivery was no longer in flight (its deadline passed, or it was
    /// answered already), or the record is done.
    Stale,
    /// Changed nothing: no record at this offset was ever delivered (not yet handed out, or
    /// past the partition's end); usually an offset off by one.
    NotDelivered,
}

impl AckOutcome {
    /// The gateway's outcome; STALE for none, or for one this version does not know (it
    /// changed nothing this client can tell).
    fn of(outcome: Option<i32>) -> AckOutcome {
        match outcome.and_then(|o| proto::AckOutcome::try_from(o).ok()) {
            Some(proto::AckOutcome::Applied) => AckOutcome::Applied,
            Some(proto::AckOutcome::NotDelivered) => AckOutcome::NotDelivered,
            _ => AckOutcome::Stale,
        }
    }
}

type Pending = (proto::Acknowledgement, oneshot::Sender<Result<AckOutcome>>);

/// A lease's answers on their way: one Acknowledge at a time, the rest batched behind it.
#[derive(Debug, Clone)]
pub(crate) struct Acks {
    tx: mpsc::UnboundedSender<Pending>,
}

impl Acks {
    pub(crate) fn start(client: Connection, lease_id: String) -> Acks {
        let (tx, mut rx) = mpsc::unbounded_channel::<Pending>();
        tokio::spawn(async move {
            while let Some(first) = rx.recv().await {
                let mut batch = vec![first];
                while batch.len() < 10_000 {
                    match rx.try_recv() {
                        Ok(next) => batch.push(next),
                        Err(_) => break,
                    }
                }
                let (acks, replies): (Vec<_>, Vec<_>) = batch.into_iter().unzip();
                let request = proto::AcknowledgeRequest {
                    lease_id: lease_id.clone(),
                    acknowledgements: acks,
                };
                match client.raw().acknowledge(request).await {
                    Ok(response) => {
                        let outcomes = response.into_inner().outcomes;
                        for (i, reply) in replies.into_iter().enumerate() {
                            let _ = reply.send(Ok(AckOutcome::of(outcomes.get(i).copied())));
                        }
                    }
                    Err(status) => {
                        for reply in replies {
                            let _ = reply.send(Err(Error::from(status.clone())));
                        }
                    }
                }
            }
        });
        Acks { tx }
    }

    async fn send(&self, ack: proto::Acknowledgement) -> Result<AckOutcome> {
        let (reply, answer) = oneshot::channel();
        self.tx.send((ack, reply)).map_err(|_| {
            Error::from(tonic::Status::cancelled(
                "the lease's acknowledgements stopped",
            ))
        })?;
        answer.await.map_err(|_| {
            Error::from(tonic::Status::cancelled(
                "the lease's acknowledgements stopped",
            ))
        })?
    }
}

/// Where a delivery came from, as a handler sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeliveryInfo {
    /// The record's topic.
    pub topic: String,
    /// The record's partition.
    pub partition: i32,
    /// 1 for the first delivery, one more for each after it.
    pub attempt: u32,
    /// When the gateway delivers the record again unless it is answered.
    pub deadline: SystemTime,
}

/// One hand-out of a record: answer it with [`accept`](Self::accept),
/// [`retry`](Self::retry), [`reject`](Self::reject), or [`renew`](Self::renew) it, before
/// its [`deadline`](Self::deadline).
#[derive(Debug, Clone)]
pub struct Delivery {
    /// The record.
    pub record: Record,
    /// Its topic.
    pub topic: String,
    /// Its partition.
    pub partition: i32,
    /// 1 for the first delivery, one more for each after it (carried over handovers).
    pub attempt: u32,
    /// When the gateway delivers the record again unless it is answered.
    pub deadline: SystemTime,
    acks: Acks,
}

impl Delivery {
    /// A delivery as the wire carries it, answered through `acks`.
    pub(crate) fn from_proto(
        delivery: proto::Delivery,
        topic: &str,
        partition: i32,
        acks: &Acks,
    ) -> Option<Delivery> {
        Some(Delivery {
            record: Record::from(delivery.record?),
            topic: topic.to_string(),
            partition,
            attempt: delivery.attempt,
            deadline: system_time_from_proto(delivery.deadline).unwrap_or(SystemTime::UNIX_EPOCH),
            acks: acks.clone(),
        })
    }

    /// The record's offset.
    pub fn offset(&self) -> i64 {
        self.record.offset
    }

    /// Moves the record's key, value and headers out, leaving its offset and timestamp.
    fn take_record(&mut self) -> Record {
        Record {
            offset: self.record.offset,
            key: self.record.key.take(),
            value: self.record.value.take(),
            headers: std::mem::take(&mut self.record.headers),
            timestamp: self.record.timestamp,
            timestamp_type: self.record.timestamp_type,
        }
    }

    /// Where it came from, for a handler.
    pub fn info(&self) -> DeliveryInfo {
        DeliveryInfo {
            topic: self.topic.clone(),
            partition: self.partition,
            attempt: self.attempt,
            deadline: self.deadline,
        }
    }

    fn answer(&self, kind: proto::AckType) -> proto::Acknowledgement {
        proto::Acknowledgement {
            offset: self.record.offset,
            r#type: kind as i32,
            attempt: self.attempt,
            retry_delay: None,
            reason: String::new(),
        }
    }

    /// Handled: the record is done.
    pub async fn accept(&self) -> Result<AckOutcome> {
        self.acks.send(self.answer(proto::AckType::Accept)).await
    }

    /// Not handled: deliver it again after `delay` (at its last delivery, it goes to the
    /// dead letter topic with `reason`).
    pub async fn retry(&self, delay: Duration, reason: impl Into<String>) -> Result<AckOutcome> {
        let mut ack = self.answer(proto::AckType::Retry);
        ack.retry_delay = Some(duration_to_proto(delay));
        ack.reason = reason.into();
        self.acks.send(ack).await
    }

    /// Never to be handled: to the dead letter topic now, with `reason`.
    pub async fn reject(&self, reason: impl Into<String>) -> Result<AckOutcome> {
        let mut ack = self.answer(proto::AckType::Reject);
        ack.reason = reason.into();
        self.acks.send(ack).await
    }

    /// Still working: the deadline moves to now + the queue's ack deadline.
    pub async fn renew(&self) -> Result<AckOutcome> {
        self.acks.send(self.answer(proto::AckType::Renew)).await
    }
}

type DeliverStream = tonic::codec::Streaming<proto::DeliverResponse>;

/// A lease's deliveries, from [`Lease::deliveries`]. Reopens itself when the stream breaks
/// (deliveries in flight stay in flight meanwhile, and can still be answered).
#[derive(Debug)]
pub struct Deliveries {
    client: Connection,
    topic: String,
    partition: i32,
    request: proto::DeliverRequest,
    inner: Option<DeliverStream>,
    ready: VecDeque<Delivery>,
    acks: Acks,
    attempts: u32,
    /// Closed by a consumer's shutdown: not reopened.
    closed: bool,
    /// Failed attempts to reopen the stream since it last delivered: kept here, not in the
    /// future reading the next delivery, so that a caller dropping that future (a `select!`
    /// taking another branch) does not reset the count of attempts.
    failures: u32,
}

impl Deliveries {
    /// The next delivery; `None` once the lease was released.
    pub async fn next(&mut self) -> Option<Result<Delivery>> {
        loop {
            if let Some(delivery) = self.ready.pop_front() {
                return Some(Ok(delivery));
            }
            if self.closed {
                return None;
            }
            let inner = match &mut self.inner {
                Some(inner) => inner,
                None => match self.client.raw().deliver(self.request.clone()).await {
                    Ok(response) => self.inner.insert(response.into_inner()),
                    Err(status) => {
                        let err = Error::from(status);
                        self.failures += 1;
                        if err.is_retryable() && self.failures <= self.attempts {
                            tokio::time::sleep(backoff(self.failures)).await;
                            continue;
                        }
                        return Some(Err(err));
                    }
                },
            };
            match inner.next().await {
                Some(Ok(response)) => {
                    self.failures = 0;
                    for delivery in response.deliveries {
                        if let Some(delivery) =
                            Delivery::from_proto(delivery, &self.topic, self.partition, &self.acks)
                        {
                            self.ready.push_back(delivery);
                        }
                    }
                }
                None => return None,
                Some(Err(status)) => {
                    self.inner = None;
                    let err = Error::from(status);
                    self.failures += 1;
                    if err.is_retryable() && self.failures <= self.attempts {
                        tokio::time::sleep(backoff(self.failures)).await;
                        continue;
                    }
                    return Some(Err(err));
                }
            }
        }
    }
}

fn backoff(failures: u32) -> Duration {
    Duration::from_millis(100 << failures.min(5))
}

/// Why a handler did not handle a record, and what to do about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandlerError {
    /// Deliver it again: after `delay`, or after the consumer's backoff for its attempt.
    Retry {
        /// Not before this; `None`: the consumer's backoff.
        delay: Option<Duration>,
        /// Why, for the dead letter if this was its last delivery.
        reason: String,
    },
    /// To the dead letter topic now.
    Reject {
        /// Why, for the dead letter.
        reason: String,
    },
}

impl HandlerError {
    /// Deliver it again after the consumer's backoff.
    pub fn retry(reason: impl Into<String>) -> Self {
        HandlerError::Retry {
            delay: None,
            reason: reason.into(),
        }
    }

    /// Deliver it again after `delay`.
    pub fn retry_after(delay: Duration, reason: impl Into<String>) -> Self {
        HandlerError::Retry {
            delay: Some(delay),
            reason: reason.into(),
        }
    }

    /// To the dead letter topic now.
    pub fn reject(reason: impl Into<String>) -> Self {
        HandlerError::Reject {
            reason: reason.into(),
        }
    }
}

impl<E: std::error::Error> From<E> for HandlerError {
    /// Any error retries, after the consumer's backoff.
    fn from(err: E) -> Self {
        HandlerError::retry(err.to_string())
    }
}

/// How [`Lease::consume`] runs the handler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumeOptions {
    pub(crate) queue: QueueOptions,
    pub(crate) concurrency: usize,
    backoff: (Duration, Duration),
    pub(crate) drain: Duration,
}

impl ConsumeOptions {
    /// `concurrency` handlers at once (and as many deliveries in flight, unless the queue
    /// options say otherwise), a backoff of 100 ms doubling up to 30 s, 10 s to drain.
    pub fn new(queue: QueueOptions, concurrency: usize) -> Self {
        ConsumeOptions {
            queue,
            concurrency: concurrency.max(1),
            backoff: (Duration::from_millis(100), Duration::from_secs(30)),
            drain: Duration::from_secs(10),
        }
    }

    /// The delay of a retry without one: `initial`, doubling with each attempt, at most
    /// `max`.
    pub fn backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.backoff = (initial, max);
        self
    }

    /// At shutdown, how long handlers running may take to finish; the records of those
    /// that do not are handed back (retried at once).
    pub fn drain(mut self, drain: Duration) -> Self {
        self.drain = drain;
        self
    }

    fn delay(&self, attempt: u32) -> Duration {
        let (initial, max) = self.backoff;
        initial
            .saturating_mul(1 << attempt.saturating_sub(1).min(20))
            .min(max)
    }
}

/// What a [`Lease::consume`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConsumeStats {
    /// Records the handler handled (accepted).
    pub accepted: u64,
    /// Handler failures answered with a retry.
    pub retried: u64,
    /// Records the handler rejected.
    pub rejected: u64,
    /// Records handed back at shutdown, unfinished.
    pub handed_back: u64,
}

impl Lease {
    /// Puts the lease in queue mode (on the first call) and opens its deliveries.
    ///
    /// # Errors
    /// As the Deliver call: [`Error::InvalidArgument`](crate::Error::InvalidArgument) for
    /// settings out of range, [`Error::NotFound`](crate::Error::NotFound) when the dead
    /// letter topic does not exist, the lease errors as for every call.
    pub async fn deliveries(&self, options: QueueOptions) -> Result<Deliveries> {
        let request = options.request(self.lease_id());
        let first = self.client.raw().deliver(request.clone()).await?;
        Ok(Deliveries {
            client: self.client.clone(),
            topic: self.topic().to_string(),
            partition: self.partition(),
            request,
            inner: Some(first.into_inner()),
            ready: VecDeque::new(),
            acks: Acks::start(self.client.clone(), self.lease_id().to_string()),
            attempts: options
                .reconnect_attempts
                .unwrap_or(DEFAULT_RECONNECT_ATTEMPTS),
            closed: false,
            failures: 0,
        })
    }

    /// Runs `handler` on every record of the lease, up to `options`' concurrency at once,
    /// until `shutdown` completes or the lease ends. `Ok(())` accepts the record; an error
    /// retries it (after its delay or the backoff) or rejects it to the dead letter topic;
    /// after the queue's `max_deliveries` a failing record goes there too.
    ///
    /// At shutdown it stops taking deliveries, gives running handlers the drain time, and
    /// hands back the records of those still running. Then release the lease: Release
    /// commits what was done.
    ///
    /// # Errors
    /// What opening the deliveries fails with, or the error that ended them (the lease
    /// ended, or a broken stream could not be reopened).
    pub async fn consume<F, Fut>(
        &self,
        options: ConsumeOptions,
        shutdown: impl Future<Output = ()>,
        handler: F,
    ) -> Result<ConsumeStats>
    where
        F: Fn(Record, DeliveryInfo) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<(), HandlerError>> + Send + 'static,
    {
        let mut queue = options.queue.clone();
        if queue.max_in_flight == 0 {
            queue.max_in_flight = options.concurrency.min(10_000) as u32;
        }
        let mut deliveries = self.deliveries(queue).await?;
        consume_from(&mut deliveries, options, shutdown, handler).await
    }
}

/// How often a draining consumer renews the deliveries its handlers still run.
const RENEW_WHILE_DRAINING: Duration = Duration::from_secs(2);

/// Gives a delivery back to the gateway, to be delivered again at once; whether the
/// gateway took it.
async fn hand_back(delivery: &Delivery) -> bool {
    delivery
        .retry(Duration::ZERO, "the consumer shut down before handling it")
        .await
        .is_ok_and(|outcome| outcome == AckOutcome::Applied)
}

/// Where a consumer takes its deliveries from: a lease's, or a subscription's.
pub(crate) trait DeliverySource: Send {
    /// The next delivery; `None` when there are no more.
    fn next_delivery(&mut self) -> impl Future<Output = Option<Result<Delivery>>> + Send;

    /// Stops taking deliveries, as a consumer's shutdown begins; returns those received but
    /// not taken, to hand back. A lease's Deliver stream closes here, so that what is handed
    /// back is not delivered onto it again.
    fn pause(&mut self) -> Vec<Delivery>;

    /// Ends the source, once the handlers are done: a subscription's member leaves here,
    /// after its handlers' answers reached its leases.
    fn close(&mut self) {}
}

impl DeliverySource for Deliveries {
    fn next_delivery(&mut self) -> impl Future<Output = Option<Result<Delivery>>> + Send {
        self.next()
    }

    fn pause(&mut self) -> Vec<Delivery> {
        self.closed = true;
        self.inner = None;
        self.ready.drain(..).collect()
    }
}

/// Runs `handler` on the deliveries of `source` (see [`Lease::consume`]).
pub(crate) async fn consume_from<F, Fut>(
    source: &mut impl DeliverySource,
    options: ConsumeOptions,
    shutdown: impl Future<Output = ()>,
    handler: F,
) -> Result<ConsumeStats>
where
    F: Fn(Record, DeliveryInfo) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = std::result::Result<(), HandlerError>> + Send + 'static,
{
    {
        let deliveries = source;
        let handler = Arc::new(handler);
        let options = Arc::new(options);
        let mut stats = ConsumeStats::default();
        let mut running: JoinSet<Answered> = JoinSet::new();
        let mut out: HashMap<tokio::task::Id, Delivery> = HashMap::new();
        tokio::pin!(shutdown);
        let mut ended = None;
        loop {
            tokio::select! {
                biased;
                () = &mut shutdown => break,
                Some(joined) = running.join_next_with_id() => {
                    if let Ok((id, answered)) = joined {
                        out.remove(&id);
                        stats.count(answered);
                    }
                }
                next = deliveries.next_delivery(), if running.len() < options.concurrency => match next {
                    None => break,
                    Some(Err(err)) => { ended = Some(err); break }
                    Some(Ok(mut delivery)) => {
                        let handler = handler.clone();
                        let info = delivery.info();
                        // The handler owns the record; the delivery keeps its offset, and
                        // what renews or hands it back, without a copy of the record.
                        let record = delivery.take_record();
                        let kept = delivery.clone();
                        let answering = options.clone();
                        // The task answers too: handlers finishing together then answer
                        // together, batched into one Acknowledge, instead of each waiting
                        // for the one before it.
                        let handle = running.spawn(async move {
                            let answer = match handler(record, info).await {
                                Ok(()) => Answer::Accept,
                                Err(err) => Answer::Failed(err),
                            };
                            answer.send(&delivery, &answering).await
                        });
                        out.insert(handle.id(), kept);
                    }
                }
            }
        }
        // No more deliveries. The deliveries received and not started go back at once.
        for delivery in deliveries.pause() {
            if hand_back(&delivery).await {
                stats.handed_back += 1;
            }
        }
        // Drain: running handlers get the drain time, their deliveries renewed meanwhile
        // (which also keeps the lease alive with its stream closed); then what is still
        // running goes back.
        let drain_until = tokio::time::Instant::now() + options.drain;
        let mut renew = tokio::time::interval(RENEW_WHILE_DRAINING);
        renew.tick().await;
        while !running.is_empty() {
            tokio::select! {
                joined = running.join_next_with_id() => {
                    if let Some(Ok((id, answered))) = joined {
                        out.remove(&id);
                        stats.count(answered);
                    }
                }
                _ = renew.tick() => {
                    for delivery in out.values() {
                        let _ = delivery.renew().await;
                    }
                }
                () = tokio::time::sleep_until(drain_until) => break,
            }
        }
        running.abort_all();
        for (_, delivery) in out.drain() {
            if hand_back(&delivery).await {
                stats.handed_back += 1;
            }
        }
        deliveries.close();
        match ended {
            Some(err) => Err(err),
            None => Ok(stats),
        }
    }
}

/// A handler's outcome, to send.
pub(crate) enum Answer {
    Accept,
    Failed(HandlerError),
}

/// What a handler's answer was, for the stats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answered {
    Accepted,
    Retried,
    Rejected,
}

impl ConsumeStats {
    fn count(&mut self, answered: Answered) {
        match answered {
            Answered::Accepted => self.accepted += 1,
            Answered::Retried => self.retried += 1,
            Answered::Rejected => self.rejected += 1,
        }
    }
}

impl Answer {
    /// Sends the answer; waits for its batch's Acknowledge. A lost answer costs a
    /// redelivery after the deadline, never a record: its outcome is not needed.
    pub(crate) async fn send(self, delivery: &Delivery, options: &ConsumeOptions) -> Answered {
        match self {
            Answer::Accept => {
                let _ = delivery.accept().await;
                Answered::Accepted
            }
            Answer::Failed(HandlerError::Retry { delay, reason }) => {
                let delay = delay.unwrap_or_else(|| options.delay(delivery.attempt));
                let _ = delivery.retry(delay, reason).await;
                Answered::Retried
            }
            Answer::Failed(HandlerError::Reject { reason }) => {
                let _ = delivery.reject(reason).await;
                Answered::Rejected
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_gateway_outcome_has_its_own_and_an_unknown_one_is_stale() {
        let of = |o: proto::AckOutcome| AckOutcome::of(Some(o as i32));
        assert_eq!(of(proto::AckOutcome::Applied), AckOutcome::Applied);
        assert_eq!(of(proto::AckOutcome::Stale), AckOutcome::Stale);
        assert_eq!(
            of(proto::AckOutcome::NotDelivered),
            AckOutcome::NotDelivered
        );
        assert_eq!(of(proto::AckOutcome::Unspecified), AckOutcome::Stale);
        assert_eq!(AckOutcome::of(Some(99)), AckOutcome::Stale);
        assert_eq!(AckOutcome::of(None), AckOutcome::Stale);
    }
}
