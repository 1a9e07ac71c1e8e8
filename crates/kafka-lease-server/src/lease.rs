//! One lease: its identity, its mutable state (position, seek epoch, expiry, open Read), and
//! the Read stream that drains its partition.
//!
//! The seek guarantee lives here. Every batch is filled under the lease's feed lock and
//! tagged with the epoch and position it started from; it is handed to gRPC only from
//! [`ReadStream::poll_next`], under the state lock, and only if the epoch and position are
//! still the same. A Seek changes them under that same lock before it answers, so once a
//! SeekResponse exists no older-epoch batch can be handed over. A Seek also interrupts a
//! batch being filled (the Go library's "cancel the background fetch"); the next fill
//! repositions librdkafka to the lease position, whose seek purges what it pre-fetched.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use tokio::sync::watch;
use tokio::time::Instant;

use kafka_lease_proto::v1;

use crate::coordination::{FencingToken, LockBackend, LockGrant, LockKey, SessionState};
use crate::error::{EndReason, LeaseError};
use crate::kafka::{BatchLimits, CommitGate, CommitsSettled, GroupClient, PartitionFeed};
use crate::records::EncodedRecords;
use kafka_lease_proto::wire::EncodedReadResponse;

/// A new lease id for a lease served by `instance`: `<reference>.<secret>~<instance>`. The
/// reference (64 random bits) is public: it is stored in Consul and names the lease in logs
/// and messages. The secret (128 random bits) makes the whole id unguessable; only the client
/// that acquired the lease learns it. The serving instance lets any instance answer a call
/// on a lease it does not serve from what the id says, without a look at Consul (instance
/// ids are `[A-Za-z0-9._-]`, so `~` cannot occur in them).
pub fn new_lease_id(instance: &str) -> LeaseId {
    let reference: u64 = rand::random();
    let secret: u128 = rand::random();
    LeaseId(format!("{reference:016x}.{secret:032x}~{instance}"))
}

/// The id of a lease this instance granted ([`new_lease_id`]). It is a bearer credential: its
/// `Debug` shows the public reference only, so a lease, a grant or an event in a log never
/// shows it whole. Ids a client sends are plain strings until [`crate::gateway::Gateway::resolve`]
/// finds the lease they name.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct LeaseId(String);

impl LeaseId {
    /// The id as the client holds it.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The id as the response carries it.
    pub fn into_string(self) -> String {
        self.0
    }

    /// Its public reference ([`lease_ref`]).
    pub fn reference(&self) -> &str {
        lease_ref(&self.0)
    }
}

impl std::borrow::Borrow<str> for LeaseId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for LeaseId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LeaseId({}.…)", self.reference())
    }
}

/// The gateway instance a lease id says serves the lease, if it names one.
pub fn serving_instance(lease_id: &str) -> Option<&str> {
    lease_id
        .rsplit_once('~')
        .map(|(_, instance)| instance)
        .filter(|instance| !instance.is_empty())
}

/// The public reference part of a lease id (all of it, if it has no `.`).
pub fn lease_ref(lease_id: &str) -> &str {
    lease_id
        .split_once('.')
        .map_or(lease_id, |(reference, _)| reference)
}

/// Limits of one Read, validated.
#[derive(Clone, Copy, Debug)]
pub struct ReadLimits {
    pub max_records: usize,
    pub max_bytes: usize,
    pub max_wait: Duration,
}

/// A lease's seek epoch: 0 at the grant, one more at every Seek and every Read from an
/// offset. A batch carries the epoch it was filled in, and one of an epoch the lease has left
/// is never handed over. Only a lease moves it on; the API carries it as a number
/// ([`SeekEpoch::get`], [`SeekEpoch::from_wire`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SeekEpoch(u64);

impl SeekEpoch {
    /// The epoch as the API carries it.
    pub fn get(self) -> u64 {
        self.0
    }

    /// An epoch as a client sent it (`if_seek_epoch`): to compare with the lease's.
    pub fn from_wire(epoch: u64) -> Self {
        SeekEpoch(epoch)
    }

    fn next(self) -> Self {
        SeekEpoch(self.0 + 1)
    }
}

impl std::fmt::Display for SeekEpoch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

#[derive(Debug)]
struct LeaseState {
    /// The offset of the next record to deliver.
    position: i64,
    /// Where a Read without `from_offset` starts: the most recent of the Acquire offset, the
    /// last commit accepted in this lease and the last Seek's resolved offset. Never the
    /// position: records past the resume point may have been handed to a stream that broke
    /// before the client received them (the resume contract in docs/ARCHITECTURE.md).
    resume_point: i64,
    seek_epoch: SeekEpoch,
    /// The id of the newest Read; an older Read seeing a different id is superseded.
    read_generation: u64,
    read_open: bool,
    /// When the lease expires if no Read is open. Only ever moves forward.
    expires_at: Instant,
    ended: Option<EndReason>,
    committed: Option<i64>,
    high_watermark: i64,
}

/// A lease served by this gateway.
pub struct Lease {
    pub id: LeaseId,
    pub lease_ref: String,
    pub key: LockKey,
    pub token: FencingToken,
    pub member: String,
    /// The identity that acquired it (see `auth`): calls from any other are refused.
    pub owner: Option<String>,
    pub ttl: Duration,
    pub acquired_at: SystemTime,
    pub span: tracing::Span,
    group_client: Arc<GroupClient>,
    /// The lock session the grant was made under.
    session: String,
    state: Mutex<LeaseState>,
    /// Bumped by everything a batch being filled must react to: Seek, a newer Read, the end.
    interrupts: watch::Sender<u64>,
    feed: tokio::sync::Mutex<Option<PartitionFeed>>,
    grant: Mutex<Option<LockGrant>>,
    locks: Arc<dyn LockBackend>,
    /// The commit gate: every commit holds a read permit from before its fence check until
    /// librdkafka has its outcome; the end of the lease takes the write side before its lock
    /// is released, so no commit of this lease can land after a successor's Acquire.
    commit_gate: CommitGate,
    /// Counts commits accepted and the end: what a subscription's revoke waits for.
    commits: watch::Sender<u64>,
    /// The delivery counters of its group and topic, looked up once: the Read path only
    /// adds to them.
    delivered: crate::metrics::Delivered,
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("lease_ref", &self.lease_ref)
            .field("key", &self.key)
            .field("token", &self.token)
            .finish()
    }
}

/// What ListLeases and the metrics show of a lease this gateway serves.
#[derive(Clone, Debug)]
pub struct LeaseSnapshot {
    /// The read position: with a Read open, the offset of the next record it hands to gRPC
    /// (records handed over may still sit in transport buffers, not yet received); with none
    /// open, where the next Read without `from_offset` starts (the resume point).
    pub position: i64,
    pub committed: Option<i64>,
    pub high_watermark: i64,
    pub expires_at: SystemTime,
    pub seek_epoch: SeekEpoch,
}

impl LeaseSnapshot {
    /// The consumer lag as Kafka's tools give it (`kafka-consumer-groups --describe`): the
    /// high watermark less the group's committed offset; `None` while the group has no
    /// committed offset for the partition (Kafka's tools show `-`).
    pub fn lag(&self) -> Option<i64> {
        self.committed.map(|c| (self.high_watermark - c).max(0))
    }

    /// The records between the read position and the high watermark: what the Read has
    /// still to hand over (0 once it is caught up, whatever the client has processed).
    pub fn read_lag(&self) -> i64 {
        (self.high_watermark - self.position).max(0)
    }
}

/// The parts a lease is built from; see [`Lease::new`].
#[derive(Debug)]
pub struct LeaseParts {
    pub id: LeaseId,
    pub grant: LockGrant,
    pub member: String,
    pub owner: Option<String>,
    pub ttl: Duration,
    pub acquired_at: SystemTime,
    pub position: i64,
    pub committed: Option<i64>,
    pub high_watermark: i64,
    pub feed: PartitionFeed,
    /// The lock backend, for the fence checks before side effects.
    pub locks: Arc<dyn LockBackend>,
}

impl Lease {
    pub fn new(parts: LeaseParts) -> Arc<Self> {
        let key = parts.grant.key().clone();
        let delivered = crate::metrics::Delivered::of(&key.group, &key.topic);
        let token = parts.grant.token();
        let lease_ref = parts.id.reference().to_string();
        let span = tracing::info_span!(
            "lease",
            lease = %lease_ref,
            group = %key.group,
            topic = %key.topic,
            partition = key.partition,
            token = token.get(),
        );
        Arc::new(Self {
            lease_ref,
            id: parts.id,
            key,
            token,
            member: parts.member,
            owner: parts.owner,
            ttl: parts.ttl,
            acquired_at: parts.acquired_at,
            span,
            group_client: parts.feed.client().clone(),
            session: parts.grant.session().to_string(),
            state: Mutex::new(LeaseState {
                position: parts.position,
                resume_point: parts.position,
                seek_epoch: SeekEpoch::default(),
                read_generation: 0,
                read_open: false,
                expires_at: Instant::now() + parts.ttl,
                ended: None,
                committed: parts.committed,
                high_watermark: parts.high_watermark,
            }),
            interrupts: watch::channel(0).0,
            feed: tokio::sync::Mutex::new(Some(parts.feed)),
            grant: Mutex::new(Some(parts.grant)),
            locks: parts.locks,
            commit_gate: CommitGate::default(),
            commits: watch::channel(0).0,
            delivered,
        })
    }

    /// Changes with every commit accepted on the lease, and at its end (a receiver taken
    /// now sees only what comes after).
    pub fn commit_watch(&self) -> watch::Receiver<u64> {
        self.commits.subscribe()
    }

    /// The lock session this lease's grant belongs to.
    pub fn session_id(&self) -> &str {
        &self.session
    }

    fn state(&self) -> MutexGuard<'_, LeaseState> {
        // A panic while holding this lock cannot leave the state half-written (every update
        // is a few plain assignments), so a poisoned lock is still safe to use.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn interrupt(&self) {
        self.interrupts.send_modify(|n| *n = n.wrapping_add(1));
    }

    fn ended_error(&self, reason: &EndReason) -> LeaseError {
        LeaseError::LeaseEnded {
            lease_ref: self.lease_ref.clone(),
            reason: reason.clone(),
        }
    }

    /// Fails if the lease has ended; otherwise renews its TTL (every call on a lease counts
    /// as activity).
    pub fn touch(&self) -> Result<(), LeaseError> {
        let mut state = self.state();
        if let Some(reason) = &state.ended {
            return Err(self.ended_error(reason));
        }
        state.expires_at = state.expires_at.max(Instant::now() + self.ttl);
        Ok(())
    }

    pub fn is_ended(&self) -> bool {
        self.state().ended.is_some()
    }

    /// Marks the lease ended. Only the first call wins and returns true; it wakes every
    /// Read and the supervisor.
    pub fn mark_ended(&self, reason: EndReason) -> bool {
        {
            let mut state = self.state();
            if state.ended.is_some() {
                return false;
            }
            state.ended = Some(reason);
        }
        self.interrupt();
        self.commits.send_modify(|n| *n = n.wrapping_add(1));
        true
    }

    pub fn end_reason(&self) -> Option<EndReason> {
        self.state().ended.clone()
    }

    /// Stores `offset` as the group's committed offset for the lease's partition, with
    /// `kafka-lease token=<token>;<user metadata>` as its metadata, which it returns. The fence
    /// is checked at the side effect, under a commit-gate permit that travels with the request
    /// until librdkafka has its outcome: the end of the lease waits for it (the commit gate in
    /// docs/ARCHITECTURE.md). The caller has checked the offset's range.
    pub async fn commit(&self, offset: i64, metadata: Option<&str>) -> Result<String, LeaseError> {
        let permit = self.commit_gate.permit(|| self.fenced()).await?;
        let metadata = match metadata {
            Some(user) if !user.is_empty() => format!("kafka-lease token={};{user}", self.token),
            _ => format!("kafka-lease token={}", self.token),
        };
        tracing::debug!(parent: &self.span, offset, "commit sent to Kafka");
        self.group_client
            .commit(
                &self.key.topic,
                self.key.partition,
                offset,
                metadata.clone(),
                permit,
            )
            .await?;
        self.record_commit(offset);
        self.commits.send_modify(|n| *n = n.wrapping_add(1));
        tracing::debug!(parent: &self.span, offset, "committed");
        Ok(metadata)
    }

    /// Waits until no commit of this lease is in flight. Once the lease has ended, none can
    /// start (their fence check fails), so the lock can then be released.
    pub async fn commits_settled(&self) -> CommitsSettled {
        self.commit_gate.settled().await
    }

    /// The committed offset of the lease's partition, as Kafka has it now.
    pub async fn committed_in_kafka(&self) -> Result<Option<i64>, LeaseError> {
        let committed = self
            .group_client
            .committed(&self.key.topic, self.key.partition)
            .await?;
        Ok(committed.map(|(offset, _)| offset))
    }

    /// The partition's high watermark as librdkafka last saw it in a fetch response,
    /// without a request.
    pub fn fetched_high_watermark(&self) -> Option<i64> {
        self.group_client
            .cached_high_watermark(&self.key.topic, self.key.partition)
    }

    /// Stops fetching the partition and hands back the lock grant, for the gateway to
    /// release. Waits for a batch being filled to notice the end first.
    pub async fn dismantle(&self) -> Option<LockGrant> {
        drop(self.feed.lock().await.take());
        self.grant.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// Refuses a side effect (a commit, a seek, handing out records) unless the lease is live
    /// and this instance can still vouch for its lock: the grant's session is the live one
    /// and the self-fence deadline has not passed. Checked synchronously at the moment of the
    /// side effect, so a gateway that was paused cannot act on a lock that may have moved.
    pub fn fenced(&self) -> Result<(), LeaseError> {
        if let Some(reason) = &self.state().ended {
            return Err(self.ended_error(reason));
        }
        let same_session = matches!(
            &*self.locks.session_state().borrow(),
            SessionState::Live { id } if *id == self.session
        );
        let in_time = self
            .locks
            .valid_until()
            .is_some_and(|until| Instant::now() < until);
        if same_session && in_time {
            Ok(())
        } else {
            Err(self.ended_error(&EndReason::Lost(
                "the gateway cannot confirm its Consul lock (self-fenced)".into(),
            )))
        }
    }

    /// Repositions the lease: the next batch any Read hands over starts at `offset`, in the
    /// returned epoch.
    pub fn seek_to(&self, offset: i64) -> Result<SeekEpoch, LeaseError> {
        let epoch = {
            let mut state = self.state();
            if let Some(reason) = &state.ended {
                return Err(self.ended_error(reason));
            }
            state.seek_epoch = state.seek_epoch.next();
            state.position = offset;
            state.resume_point = offset;
            state.expires_at = state.expires_at.max(Instant::now() + self.ttl);
            state.seek_epoch
        };
        self.interrupt();
        Ok(epoch)
    }

    /// Notes an accepted commit: the group's committed offset, and the lease's resume point.
    fn record_commit(&self, offset: i64) {
        let mut state = self.state();
        state.committed = Some(offset);
        state.resume_point = offset;
    }

    /// Whether the lease is at seek epoch `epoch` (any, when `None`).
    pub fn still_at(&self, epoch: Option<SeekEpoch>) -> bool {
        epoch.is_none_or(|e| e == self.state().seek_epoch)
    }

    /// Where a Read without `from_offset` would start now.
    pub fn resume_point(&self) -> i64 {
        self.state().resume_point
    }

    /// The lease's current seek epoch.
    pub fn seek_epoch(&self) -> SeekEpoch {
        self.state().seek_epoch
    }

    pub fn committed(&self) -> Option<i64> {
        self.state().committed
    }

    /// The high watermark as last seen, for range checks that can then ask the broker when
    /// the cached value is too low.
    pub fn cached_high_watermark(&self) -> i64 {
        self.state().high_watermark
    }

    pub fn note_high_watermark(&self, high: i64) {
        let mut state = self.state();
        state.high_watermark = state.high_watermark.max(high);
    }

    pub fn snapshot(&self) -> LeaseSnapshot {
        let state = self.state();
        let remaining = if state.read_open {
            self.ttl
        } else {
            state.expires_at.saturating_duration_since(Instant::now())
        };
        LeaseSnapshot {
            // Between Reads the position the last one reached says nothing: what it handed
            // over may never have reached the client, and the next Read starts at the
            // resume point.
            position: if state.read_open {
                state.position
            } else {
                state.resume_point
            },
            committed: state.committed,
            high_watermark: state.high_watermark,
            expires_at: SystemTime::now() + remaining,
            seek_epoch: state.seek_epoch,
        }
    }

    /// Opens a Read, superseding any open one. It starts at `from` (a repositioning like a
    /// Seek: new epoch, new resume point) or, without it, at the resume point. Either way the
    /// position moves under the state lock together with the generation, so a batch the
    /// superseded Read was filling can never be handed out in the new one.
    pub fn open_read(
        self: &Arc<Self>,
        limits: ReadLimits,
        from: Option<ReadFrom>,
    ) -> Result<ReadStream, LeaseError> {
        let generation = {
            let mut state = self.state();
            if let Some(reason) = &state.ended {
                return Err(self.ended_error(reason));
            }
            let epoch = state.seek_epoch;
            match from {
                Some(from) if from.if_seek_epoch.is_none_or(|e| e == epoch) => {
                    state.seek_epoch = epoch.next();
                    state.position = from.offset;
                    state.resume_point = from.offset;
                }
                // No position, or one of an epoch a Seek has left: where that Seek put it.
                _ => state.position = state.resume_point,
            }
            state.read_generation += 1;
            state.read_open = true;
            state.read_generation
        };
        self.interrupt();
        Ok(ReadStream {
            lease: self.clone(),
            generation,
            limits,
            fill: None,
            finished: false,
        })
    }

    fn close_read(&self, generation: u64) {
        let mut state = self.state();
        if state.read_generation == generation && state.read_open {
            state.read_open = false;
            state.expires_at = state.expires_at.max(Instant::now() + self.ttl);
        }
    }

    /// Waits until the lease has been idle past its TTL (returns true) or has ended (false).
    pub async fn expired(&self) -> bool {
        let mut interrupts = self.interrupts.subscribe();
        loop {
            let deadline = {
                let state = self.state();
                if state.ended.is_some() {
                    return false;
                }
                if state.read_open {
                    // An open Read keeps the lease alive; look again a TTL from now, or
                    // sooner when something happens.
                    Instant::now() + self.ttl
                } else if state.expires_at <= Instant::now() {
                    return true;
                } else {
                    state.expires_at
                }
            };
            tokio::select! {
                () = tokio::time::sleep_until(deadline) => {}
                changed = interrupts.changed() => {
                    if changed.is_err() {
                        return false;
                    }
                }
            }
        }
    }

    /// Why Read `generation` must stop, if it must.
    fn read_stop(&self, state: &LeaseState, generation: u64) -> Option<Stop> {
        if state.read_generation != generation {
            return Some(Stop::Failed(LeaseError::Superseded {
                lease_ref: self.lease_ref.clone(),
            }));
        }
        match &state.ended {
            None => None,
            Some(EndReason::Released) => Some(Stop::Done),
            // A shutdown ends the lease too (UNAVAILABLE, naming it, with no retry advice):
            // reopening the Read elsewhere cannot succeed.
            Some(reason) => Some(Stop::Failed(self.ended_error(reason))),
        }
    }
}

/// How a Read ends.
enum Stop {
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
    },
    /// The Read must end.
    Stop(Stop),
    /// Interrupted or failed transiently: fill again.
    Again,
}

type FillFuture = Pin<Box<dyn Future<Output = Fill> + Send>>;

/// Fills one batch for Read `generation`, starting at the lease position.
async fn fill(lease: Arc<Lease>, generation: u64, limits: ReadLimits) -> Fill {
    // Subscribe before looking at the state, so an interrupt after the look is not missed.
    let mut interrupts = lease.interrupts.subscribe();
    // Look before waiting for the feed: a newer Read may hold it for as long as its partition
    // is idle, and this Read must end rather than wait behind it.
    if let Some(stop) = lease.read_stop(&lease.state(), generation) {
        return Fill::Stop(stop);
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
        tracing::warn!(parent: &lease.span, error = %err, "repositioning the partition failed; retrying");
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
        max_bytes: limits.max_bytes.saturating_sub(32),
    };
    let mut records = feed.new_batch(batch_limits);
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
    Fill::Batch {
        epoch,
        from,
        records,
        high_watermark,
    }
}

/// One batch of a Read: records encoded for the wire, with the response's other fields.
#[derive(Debug)]
pub struct ReadBatch {
    pub records: EncodedRecords,
    pub high_watermark: i64,
    pub seek_epoch: SeekEpoch,
}

impl ReadBatch {
    /// The batch as the Read call sends it.
    pub fn into_response(self) -> EncodedReadResponse {
        self.records
            .into_read_response(self.high_watermark, self.seek_epoch.get())
    }

    /// The batch decoded, as a client sees it (for tests; the Read path never decodes).
    pub fn decode(&self) -> v1::ReadResponse {
        v1::ReadResponse {
            records: self.records.decode(),
            high_watermark: self.high_watermark,
            seek_epoch: self.seek_epoch.get(),
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
    fill: Option<FillFuture>,
    finished: bool,
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
            let fut = this
                .fill
                .get_or_insert_with(|| Box::pin(fill(lease, generation, limits)));
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
                } => {
                    // The handoff: under the state lock, so a Seek either happened before
                    // (and this batch is dropped) or happens after the batch is handed over.
                    if let Err(fenced) = this.lease.fenced() {
                        this.finished = true;
                        return Poll::Ready(Some(Err(fenced)));
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
                    state.position = last + 1;
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
                    };
                    return Poll::Ready(Some(Ok(response)));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_ids_are_long_random_and_have_a_public_reference() {
        let (a, b) = (new_lease_id("gw-1.example"), new_lease_id("gw-1.example"));
        assert_ne!(a, b);
        // A credential: its Debug shows the reference alone.
        assert_eq!(format!("{a:?}"), format!("LeaseId({}.…)", a.reference()));
        assert_eq!(a.reference(), lease_ref(a.as_str()));
        let a = a.into_string();
        assert_eq!(a.len(), 16 + 1 + 32 + 1 + "gw-1.example".len());
        assert_eq!(lease_ref(&a).len(), 16);
        assert!(a.starts_with(lease_ref(&a)));
        assert_eq!(lease_ref("no-dot"), "no-dot");
        assert_eq!(serving_instance(&a), Some("gw-1.example"));
        assert_eq!(serving_instance("0123.4567"), None);
        assert_eq!(serving_instance("0123.4567~"), None);
    }
}

/// Where a Read asks to start: `offset`, only while the lease is at `if_seek_epoch` (when set).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadFrom {
    pub offset: i64,
    pub if_seek_epoch: Option<SeekEpoch>,
}
