//! Groups that balance themselves: [`Client::subscribe`](crate::Client::subscribe) joins a
//! group as a member, and the gateways share the topics' partitions among the members.

use std::time::{Duration, SystemTime};

use tonic::Streaming;

use crate::connection::Connection;
use crate::convert::Reset;
use crate::convert::{duration_to_proto, system_time_from_proto};
use crate::error::{Error, Reason, Result};
use crate::lease::{SeekOutcome, SeekTo};
use crate::queue::{
    consume_from, Acks, ConsumeOptions, ConsumeStats, Delivery, DeliveryInfo, DeliverySource,
    HandlerError, QueueOptions,
};
use crate::stream::Batch;
use crate::stream::Record;
use kafka_lease_proto::v1 as proto;
use proto::subscribe_response::Event;
use std::future::Future;

/// What [`Client::subscribe`](crate::Client::subscribe) joins with. Unset fields are left to
/// the gateway's defaults.
#[derive(Debug, Clone)]
pub struct SubscribeOptions {
    request: proto::SubscribeRequest,
}

impl SubscribeOptions {
    /// Joins `group` for `topics` (1 ..= 16 distinct names).
    pub fn new<I, S>(group: impl Into<String>, topics: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        SubscribeOptions {
            request: proto::SubscribeRequest {
                group: group.into(),
                topics: topics.into_iter().map(Into::into).collect(),
                ..Default::default()
            },
        }
    }

    /// A stable member id (`[A-Za-z0-9._-]`, at most 128 characters); by default the gateway
    /// makes one up ([`Subscription::member_id`]).
    pub fn member_id(mut self, id: impl Into<String>) -> Self {
        self.request.member_id = id.into();
        self
    }

    /// A free-text label, shown in ListLeases.
    pub fn member(mut self, member: impl Into<String>) -> Self {
        self.request.member = member.into();
        self
    }

    /// Most records per batch of one lease (gateway default 500).
    pub fn max_records(mut self, max_records: u32) -> Self {
        self.request.max_records = max_records;
        self
    }

    /// Most bytes per batch of one lease (gateway default 1 MiB; at most 4 MiB). A bound:
    /// the gateway sends at most 256 KiB of records per batch whatever this allows.
    pub fn max_bytes(mut self, max_bytes: u32) -> Self {
        self.request.max_bytes = max_bytes;
        self
    }

    /// How long a batch may wait to fill once it has a record (gateway default 100 ms).
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.request.max_wait = Some(duration_to_proto(max_wait));
        self
    }

    /// Where a lease starts when the group has no committed offset.
    pub fn reset(mut self, reset: Reset) -> Self {
        self.request.offset_reset = proto::OffsetReset::from(reset) as i32;
        self
    }

    /// The most partitions of each topic this member holds.
    pub fn max_partitions(mut self, max: u32) -> Self {
        self.request.max_partitions = max;
        self
    }

    /// How long a revoked lease waits for this member's commit (gateway default 5 s).
    pub fn revoke_grace(mut self, grace: Duration) -> Self {
        self.request.revoke_grace = Some(duration_to_proto(grace));
        self
    }

    /// How long the member keeps its leases after its stream ends, for a new Subscribe
    /// with the same member id and topics (through any gateway) to take it over (default 0).
    pub fn session_grace(mut self, grace: Duration) -> Self {
        self.request.session_grace = Some(duration_to_proto(grace));
        self
    }

    /// Queue mode for every lease the member is assigned: their records come as
    /// [`SubscriptionEvent::Deliveries`], to answer one by one, and the gateway commits.
    /// `max_in_flight` and `max_in_flight_bytes` are shared by all the member's leases.
    pub fn queue(mut self, queue: QueueOptions) -> Self {
        self.request.queue = Some(queue.settings());
        self
    }

    pub(crate) fn into_request(self) -> proto::SubscribeRequest {
        self.request
    }
}

/// One of the member's leases: commit, seek or release it through any gateway instance.
#[derive(Debug, Clone)]
pub struct Partition {
    client: Connection,
    /// The newest seek epoch of each of the subscription's leases, shared with it.
    epochs: Epochs,
    lease_id: String,
    topic: String,
    partition: i32,
    fencing_token: u64,
}

impl Partition {
    /// The lease id (a bearer credential).
    pub fn lease_id(&self) -> &str {
        &self.lease_id
    }

    /// The topic.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// The partition.
    pub fn partition(&self) -> i32 {
        self.partition
    }

    /// The lease's fencing token (from its `assigned` event).
    pub fn fencing_token(&self) -> u64 {
        self.fencing_token
    }

    /// Commits `offset` (the next offset to read), fenced by the lease. During `revoking`,
    /// this commit is what lets the lease move at once.
    ///
    /// # Errors
    /// As [`Lease::commit`](crate::Lease::commit).
    pub async fn commit(&self, offset: i64) -> Result<()> {
        let request = proto::CommitRequest {
            lease_id: self.lease_id.clone(),
            offset,
            metadata: None,
        };
        self.client.raw().commit(request).await?;
        Ok(())
    }

    /// Repositions the lease; later `records` events of it start there (batches of the old
    /// position that were in flight carry the older seek epoch).
    ///
    /// # Errors
    /// As [`Lease::seek`](crate::Lease::seek).
    pub async fn seek(&self, to: SeekTo) -> Result<SeekOutcome> {
        let request = proto::SeekRequest {
            lease_id: self.lease_id.clone(),
            position: Some(to.into()),
        };
        let outcome = SeekOutcome::from(self.client.raw().seek(request).await?.into_inner());
        // Batches of the old position still on their way are dropped by the subscription.
        let mut epochs = self.epochs.lock().unwrap_or_else(|p| p.into_inner());
        let newest = epochs.entry(self.lease_id.clone()).or_default();
        *newest = (*newest).max(outcome.seek_epoch);
        Ok(outcome)
    }
}

/// The newest seek epoch the client knows per lease id.
type Epochs = std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, u64>>>;

/// What a subscription's stream carries.
#[derive(Debug)]
#[non_exhaustive]
pub enum SubscriptionEvent {
    /// A lease the member now holds; its records follow.
    Assigned {
        /// The lease.
        partition: Partition,
        /// Where its records start: the group's committed offset, else the reset position.
        offset: i64,
        /// The partition's high watermark at the grant.
        high_watermark: i64,
    },
    /// A batch of one of the member's leases.
    Records {
        /// The lease.
        partition: Partition,
        /// Its records, in offset order.
        batch: Batch,
    },
    /// Deliveries of one of the member's leases, in queue mode ([`SubscribeOptions::queue`]):
    /// answer each one.
    Deliveries {
        /// The lease.
        partition: Partition,
        /// Its deliveries.
        deliveries: Vec<Delivery>,
    },
    /// The lease is moving to another member: no records of it follow. Commit what was
    /// processed before `deadline`; the lease is released after that commit, or then.
    Revoking {
        /// The lease.
        partition: Partition,
        /// When it is released if no commit comes first.
        deadline: SystemTime,
    },
    /// The lease has ended: `reason` [`Reason::LeaseRevoked`] after `Revoking`, else why.
    Revoked {
        /// The lease.
        partition: Partition,
        /// Why it ended.
        reason: Reason,
        /// The gateway's words.
        message: String,
    },
}

/// A member of a group, from [`Client::subscribe`](crate::Client::subscribe). The member
/// stays in the group while this lives; dropping it leaves (its leases are released, after
/// the session grace if one was set).
///
/// When the stream breaks (the connection failed, the gateway it went through stopped) and
/// the subscription has a session grace, it subscribes again by itself with the same member
/// id, through the same channel (so through another gateway behind a balancer), for as long
/// as the grace lasts: the gateway that holds the member answers with every lease it still
/// holds (`Assigned` again, at its resume point, or `Revoking`), and the events go on. With
/// no session grace the member left with the stream, and the break is the caller's error.
#[derive(Debug)]
pub struct Subscription {
    client: Connection,
    epochs: Epochs,
    /// The fencing token of each lease, from its `assigned` event.
    tokens: std::collections::HashMap<String, u64>,
    /// The answers of each lease's deliveries, in queue mode.
    acks: std::collections::HashMap<String, Acks>,
    /// `None` once closed by a consumer's shutdown.
    stream: Option<Streaming<proto::SubscribeResponse>>,
    /// The Subscribe, to send again after a break (with the member id the gateway gave).
    request: proto::SubscribeRequest,
    member_id: String,
    gateway: String,
    /// Deliveries of the last `deliveries` event not yet taken by a consumer.
    pending: std::collections::VecDeque<Delivery>,
    /// The stream broke and the subscription is coming back: kept here, not in the future
    /// that reads the next event, so that a caller dropping that future (a `select!` taking
    /// another branch) resumes the rejoin where it was instead of reading the broken stream
    /// again, which would then look ended.
    rejoining: Option<Rejoining>,
}

/// A rejoin under way: why, until when, the next attempt and its backoff.
#[derive(Debug)]
struct Rejoining {
    last: Error,
    until: tokio::time::Instant,
    next_try: tokio::time::Instant,
    pause: Duration,
}

/// How long a subscription may try to come back after its stream broke: its session grace.
fn session_grace(request: &proto::SubscribeRequest) -> Duration {
    request
        .session_grace
        .and_then(|d| Duration::try_from(d).ok())
        .unwrap_or_default()
}

impl Subscription {
    pub(crate) async fn open(
        client: &Connection,
        options: SubscribeOptions,
    ) -> Result<Subscription> {
        let mut request = options.into_request();
        let (stream, joined) = join(client, &request).await?;
        request.member_id = joined.member_id.clone();
        Ok(Subscription {
            client: client.clone(),
            epochs: Epochs::default(),
            tokens: std::collections::HashMap::new(),
            acks: std::collections::HashMap::new(),
            stream: Some(stream),
            request,
            member_id: joined.member_id,
            gateway: joined.gateway,
            pending: std::collections::VecDeque::new(),
            rejoining: None,
        })
    }

    /// After the stream broke with `err`: marks the subscription as coming back, if its
    /// session grace allows (the error otherwise). [`Subscription::rejoin`] does the rest.
    fn broke(&mut self, err: Error) -> Result<()> {
        self.stream = None;
        let grace = session_grace(&self.request);
        if grace.is_zero() || !breaks_the_stream(&err) {
            return Err(err);
        }
        let now = tokio::time::Instant::now();
        let pause = Duration::from_millis(50);
        self.rejoining = Some(Rejoining {
            last: err,
            until: now + grace,
            next_try: now + pause,
            pause,
        });
        Ok(())
    }

    /// Subscribes again, with backoff, while the session grace lasts; the last error when it
    /// cannot. Cancel-safe: its progress lives in `self.rejoining`.
    async fn rejoin(&mut self) -> Result<()> {
        loop {
            let Some(state) = self.rejoining.as_mut() else {
                return Ok(());
            };
            if state.next_try >= state.until {
                let state = self.rejoining.take().expect("checked above");
                return Err(state.last);
            }
            let next_try = state.next_try;
            tokio::time::sleep_until(next_try).await;
            match join(&self.client, &self.request).await {
                Ok((stream, joined)) => {
                    self.stream = Some(stream);
                    self.gateway = joined.gateway;
                    self.rejoining = None;
                    return Ok(());
                }
                // The gateway may not have noticed the old stream's end yet: it still sees
                // the member attached. It will, within the grace.
                Err(e) if e.reason() == Some(Reason::MemberActive) || breaks_the_stream(&e) => {
                    if let Some(state) = self.rejoining.as_mut() {
                        state.last = e;
                        state.pause = (state.pause * 2).min(Duration::from_secs(1));
                        state.next_try = tokio::time::Instant::now() + state.pause;
                    }
                }
                Err(e) => {
                    self.rejoining = None;
                    return Err(e);
                }
            }
        }
    }

    /// Whether a batch of `lease_id` at `epoch` is of a position a seek through one of
    /// this subscription's [`Partition`] handles has left.
    fn stale(&self, lease_id: &str, epoch: u64) -> bool {
        self.epochs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(lease_id)
            .is_some_and(|newest| epoch < *newest)
    }

    /// This member's id.
    pub fn member_id(&self) -> &str {
        &self.member_id
    }

    /// The gateway instance serving the subscription.
    pub fn gateway(&self) -> &str {
        &self.gateway
    }

    /// The next event; `None` when the gateway ended the stream with OK, an error when it
    /// ended it otherwise (the gateway shutting down, a transport failure: subscribe again).
    pub async fn next_event(&mut self) -> Option<Result<SubscriptionEvent>> {
        loop {
            if self.rejoining.is_some() {
                if let Err(err) = self.rejoin().await {
                    return Some(Err(err));
                }
            }
            let response = match self.stream.as_mut()?.message().await {
                Ok(Some(response)) => response,
                Ok(None) => return None,
                Err(status) => match self.broke(Error::from(status)) {
                    Ok(()) => continue,
                    Err(err) => return Some(Err(err)),
                },
            };
            // Only `assigned` carries the fencing token: the others' handles get it from there.
            if let Some(Event::Assigned(a)) = &response.event {
                self.tokens.insert(a.lease_id.clone(), a.fencing_token);
            }
            let tokens = &self.tokens;
            let handle = |lease_id: String, topic: String, partition: i32| Partition {
                client: self.client.clone(),
                epochs: self.epochs.clone(),
                fencing_token: tokens.get(&lease_id).copied().unwrap_or_default(),
                lease_id,
                topic,
                partition,
            };
            let event = match response.event {
                Some(Event::Assigned(a)) => SubscriptionEvent::Assigned {
                    partition: handle(a.lease_id, a.topic, a.partition),
                    offset: a.offset,
                    high_watermark: a.high_watermark,
                },
                Some(Event::Records(r)) if self.stale(&r.lease_id, r.seek_epoch) => continue,
                Some(Event::Records(r)) => SubscriptionEvent::Records {
                    partition: handle(r.lease_id, r.topic, r.partition),
                    batch: Batch::from(proto::ReadResponse {
                        records: r.records,
                        high_watermark: r.high_watermark,
                        seek_epoch: r.seek_epoch,
                        // A records event has no next offset of its own (yet).
                        next_offset: 0,
                    }),
                },
                Some(Event::Deliveries(d)) => {
                    let acks = self
                        .acks
                        .entry(d.lease_id.clone())
                        .or_insert_with(|| Acks::start(self.client.clone(), d.lease_id.clone()))
                        .clone();
                    let (topic, partition) = (d.topic.clone(), d.partition);
                    SubscriptionEvent::Deliveries {
                        partition: handle(d.lease_id, d.topic, d.partition),
                        deliveries: d
                            .deliveries
                            .into_iter()
                            .filter_map(|delivery| {
                                Delivery::from_proto(delivery, &topic, partition, &acks)
                            })
                            .collect(),
                    }
                }
                Some(Event::Revoking(r)) => SubscriptionEvent::Revoking {
                    partition: handle(r.lease_id, r.topic, r.partition),
                    deadline: system_time_from_proto(r.deadline).unwrap_or(SystemTime::now()),
                },
                Some(Event::Revoked(r)) => {
                    self.epochs
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .remove(&r.lease_id);
                    let partition = handle(r.lease_id, r.topic, r.partition);
                    self.tokens.remove(partition.lease_id());
                    self.acks.remove(partition.lease_id());
                    SubscriptionEvent::Revoked {
                        partition,
                        reason: Reason::from_name(&r.reason),
                        message: r.message,
                    }
                }
                // A later `joined` or an event this version does not know: skipped.
                Some(Event::Joined(_)) | None => continue,
            };
            return Some(Ok(event));
        }
    }
}

impl Subscription {
    /// Runs `handler` on every delivery of the member's leases, as
    /// [`Lease::consume`](crate::Lease::consume) does for one lease, until `shutdown`
    /// completes or the subscription ends; the subscription must have been opened with
    /// [`SubscribeOptions::queue`]. Assignments and revocations are followed by the gateway:
    /// a revoked lease's deliveries in flight are still answered, and it moves once none
    /// is. At shutdown, after the drain, the member leaves (its leases are released,
    /// committing what was done, after its session grace if it has one).
    ///
    /// # Errors
    /// The error that ended the subscription.
    pub async fn consume<F, Fut>(
        mut self,
        options: ConsumeOptions,
        shutdown: impl Future<Output = ()>,
        handler: F,
    ) -> Result<ConsumeStats>
    where
        F: Fn(Record, DeliveryInfo) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<(), HandlerError>> + Send + 'static,
    {
        consume_from(&mut self, options, shutdown, handler).await
    }
}

impl DeliverySource for Subscription {
    fn pause(&mut self) -> Vec<Delivery> {
        // The stream stays open, so the member keeps its leases while its handlers finish
        // and their answers reach the leases.
        self.pending.drain(..).collect()
    }

    fn close(&mut self) {
        // The member leaves with its stream (after its session grace, if it has one); its
        // leases are released then, committing what was done.
        self.stream = None;
        self.rejoining = None;
    }

    async fn next_delivery(&mut self) -> Option<Result<Delivery>> {
        loop {
            if let Some(delivery) = self.pending.pop_front() {
                return Some(Ok(delivery));
            }
            match self.next_event().await? {
                Ok(SubscriptionEvent::Deliveries { deliveries, .. }) => {
                    self.pending.extend(deliveries);
                }
                Ok(_) => {}
                Err(err) => return Some(Err(err)),
            }
        }
    }
}

/// Sends the Subscribe and reads its `joined`.
async fn join(
    client: &Connection,
    request: &proto::SubscribeRequest,
) -> Result<(Streaming<proto::SubscribeResponse>, proto::Joined)> {
    let mut stream = client.raw().subscribe(request.clone()).await?.into_inner();
    match stream.message().await? {
        Some(proto::SubscribeResponse {
            event: Some(Event::Joined(joined)),
        }) => Ok((stream, joined)),
        other => Err(Error::from(tonic::Status::internal(format!(
            "the subscription's first event was not `joined`: {other:?}"
        )))),
    }
}

/// Whether `err` says the stream broke (the connection, or the gateway it went through), not
/// that the member or the request is refused.
fn breaks_the_stream(err: &Error) -> bool {
    match err {
        Error::Transport(_) => true,
        Error::Unavailable { details, .. } => {
            // A gateway shutting down ends the stream; another one takes the member over.
            details.reason().is_none()
                || matches!(
                    details.reason(),
                    Some(Reason::ShuttingDown | Reason::GatewayUnreachable)
                )
        }
        Error::Other { status, details } => {
            details.reason().is_none()
                && matches!(
                    status.code(),
                    tonic::Code::Unknown | tonic::Code::Internal | tonic::Code::Cancelled
                )
        }
        _ => false,
    }
}
