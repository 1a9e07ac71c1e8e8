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
//!
//! Files: this one (the lease, its state, commits, the fence, Seek, expiry), `id` (lease
//! ids), `read` (the Read path: a batch filled from the feed and handed over), `deliver`
//! (queue mode: the Deliver path, the answers to it, dead letters and the progress's
//! commits).

mod deliver;
mod id;
mod read;

pub use deliver::{
    headers as dead_letter_headers, Ack, AckKind, AckOutcome, DeliverSettings, DeliverStream,
    Delivered, QueueRun, QueueSnapshot, SharedWindow, COMMIT_INTERVAL, LOOKAHEAD_BYTES,
    LOOKAHEAD_RECORDS,
};
pub use id::{lease_ref, new_lease_id, serving_instance, LeaseId};
use read::Stop;
pub use read::{ReadBatch, ReadFrom, ReadLimits, ReadStream, FILL_BYTES};

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use tokio::sync::watch;
use tokio::time::Instant;

use crate::coordination::{
    CoordinationError, FencingToken, LockBackend, LockGrant, LockKey, SessionState,
};
use crate::error::{EndReason, LeaseError};
use crate::kafka::{CommitFence, CommitGate, CommitsSettled, GroupClient, PartitionFeed, Sent};

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

/// What a lease's fence says at one moment ([`Lease::fence`]).
#[derive(Debug)]
pub enum Fence {
    /// Side effects may happen.
    Open,
    /// None may happen now, but the lease lives: the gateway waits for Consul to confirm its
    /// session. A Read or Deliver holds its records back until then; a call gets the error
    /// (UNAVAILABLE, retryable).
    Suspended(LeaseError),
    /// None may happen, ever: the lease has ended or is about to (the error says why).
    Closed(LeaseError),
}

impl Fence {
    /// Whether side effects are only suspended.
    pub fn is_suspended(&self) -> bool {
        matches!(self, Fence::Suspended(_))
    }
}

/// A call on a lease, as [`Lease::begin`] guards it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    Read,
    /// A Subscribe member's Read of a lease it holds: not fenced at its opening (a lease
    /// just granted, or a member attached again), since the Read hands nothing over while
    /// the fence is not open and the member must not lose its lease over a pause.
    SubscribeRead,
    Seek,
    Commit,
    /// A Release with `commit_offset`: its commit, before the commit's own guards.
    ReleaseWithCommit,
    Deliver,
    Acknowledge,
}

impl Call {
    /// Its name in messages.
    pub fn name(self) -> &'static str {
        match self {
            Call::Read | Call::SubscribeRead => "Read",
            Call::Seek => "Seek",
            Call::Commit => "Commit",
            Call::ReleaseWithCommit => "Release with commit_offset",
            Call::Deliver => "Deliver",
            Call::Acknowledge => "Acknowledge",
        }
    }
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
    /// The client that stores the group's offsets.
    group_client: Arc<GroupClient>,
    /// The client that fetches the partition (perhaps another group's: see `Kafka::fetcher`).
    fetch_client: Arc<GroupClient>,
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
    /// Queue mode, once a Deliver opened it (`deliver`).
    queue: std::sync::OnceLock<Arc<QueueRun>>,
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
    /// Its queue, in queue mode.
    pub queue: Option<QueueSnapshot>,
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
    /// The client that stores the group's offsets (the feed's may be another group's).
    pub group_client: Arc<GroupClient>,
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
            group_client: parts.group_client,
            fetch_client: parts.feed.client().clone(),
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
            queue: std::sync::OnceLock::new(),
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

    /// The guards of `call`, in one place, before it acts: a call with a side effect needs
    /// the fence open ([`Lease::fenced`]); every call renews the TTL and fails on an ended
    /// lease ([`Lease::touch`]), except a Release's commit, which its Commit guards; Read,
    /// Seek and Commit (and a Release's commit) refuse a lease in queue mode, Acknowledge one
    /// that is not. The lease's queue run, if a Deliver opened one.
    pub fn begin(&self, call: Call) -> Result<Option<&Arc<QueueRun>>, LeaseError> {
        if matches!(
            call,
            Call::Read | Call::Seek | Call::Deliver | Call::Acknowledge
        ) {
            self.fenced()?;
        }
        if call != Call::ReleaseWithCommit {
            self.touch()?;
        }
        let queue = self.queue.get();
        let wrong = match call {
            Call::Read
            | Call::SubscribeRead
            | Call::Seek
            | Call::Commit
            | Call::ReleaseWithCommit => queue.is_some(),
            Call::Acknowledge => queue.is_none(),
            Call::Deliver => false,
        };
        if wrong {
            return Err(self.wrong_mode(call));
        }
        Ok(queue)
    }

    /// WRONG_MODE for `call`: a plain call on a lease in queue mode, or an Acknowledge on one
    /// that is not.
    fn wrong_mode(&self, call: Call) -> LeaseError {
        let lease_ref = self.lease_ref.clone();
        if call == Call::Acknowledge {
            return LeaseError::WrongMode {
                message: format!(
                    "lease {lease_ref:?} is not in queue mode: open a Deliver on it before \
                     Acknowledge"
                ),
                lease_ref,
                mode: "read",
            };
        }
        LeaseError::WrongMode {
            message: format!(
                "lease {lease_ref:?} is in queue mode (a Deliver opened it), where the gateway \
                 commits; {} is not available on it: answer deliveries with Acknowledge, or \
                 Release the lease",
                call.name()
            ),
            lease_ref,
            mode: "queue",
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
        let fence = Box::new(SessionFence {
            locks: self.locks.clone(),
            session: self.session.clone(),
            deadline: self.locks.valid_until(),
            span: self.span.clone(),
            key: self.key.clone(),
            offset,
        });
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
                fence,
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
        self.fetch_client
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
        match self.fence() {
            Fence::Open => Ok(()),
            Fence::Suspended(err) | Fence::Closed(err) => Err(err),
        }
    }

    /// The fence, told apart: open, suspended (the session is the lease's, but no renew has
    /// been confirmed for a fence window: the lease waits for Consul, it has not ended), or
    /// closed (the lease ended, or its session is gone).
    pub fn fence(&self) -> Fence {
        if let Some(reason) = &self.state().ended {
            return Fence::Closed(self.ended_error(reason));
        }
        if !session_is_live(&*self.locks, &self.session) {
            return Fence::Closed(self.ended_error(&EndReason::Lost(
                "the gateway cannot confirm its Consul lock (self-fenced)".into(),
            )));
        }
        let in_time = self
            .locks
            .valid_until()
            .is_some_and(|until| Instant::now() < until)
            || crate::defects::planted(crate::defects::Defect::NoSelfFence);
        if in_time {
            Fence::Open
        } else {
            Fence::Suspended(LeaseError::Coordination(CoordinationError::Unavailable {
                operation: "confirming the lease's lock",
                detail: "no renew of the gateway's Consul session has been confirmed for a \
                         fence window (Consul unreachable, or electing a leader); the lease \
                         is kept, and acts again once Consul confirms the session, or ends \
                         \"lease lost\" if it cannot"
                    .into(),
            }))
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
        // Before the state lock: a lease's locks are taken state first, the queue's after.
        let queue = self.queue.get().map(|run| run.snapshot());
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
            queue,
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
        Ok(ReadStream::new(self.clone(), generation, limits))
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

/// A commit's view of its lease's fence from the blocking thread that sends it (see
/// [`crate::kafka::CommitFence`]): the session part of [`Lease::fence`], which a pause or a
/// cut can close between the caller's check and the request.
struct SessionFence {
    locks: Arc<dyn LockBackend>,
    session: String,
    /// The lease's fence deadline (`valid_until`) when the commit passed its check.
    deadline: Option<Instant>,
    span: tracing::Span,
    key: LockKey,
    offset: i64,
}

impl SessionFence {
    /// The latest deadline the lease's session had: its `valid_until` now if it is still the
    /// live session (renews only move it on), the one at the check otherwise.
    fn deadline(&self) -> Option<Instant> {
        let now = if session_is_live(&*self.locks, &self.session) {
            self.locks.valid_until()
        } else {
            None
        };
        now.max(self.deadline)
    }
}

/// Whether `session` is the gateway's live Consul session (so its `valid_until` is the
/// lease's fence deadline).
fn session_is_live(locks: &dyn LockBackend, session: &str) -> bool {
    matches!(
        &*locks.session_state().borrow(),
        SessionState::Live { id } if id == session
    )
}

impl CommitFence for SessionFence {
    fn may_send(&self) -> Result<Sent, LeaseError> {
        if self.deadline().is_some_and(|until| Instant::now() < until) {
            return Ok(Sent::InTime);
        }
        if crate::defects::planted(crate::defects::Defect::NoSelfFence) {
            return Ok(Sent::PastItsFence);
        }
        Err(LeaseError::Coordination(CoordinationError::Unavailable {
            operation: "confirming the lease's lock",
            detail: "the lease's fence closed between the commit's check and its request (the \
                     gateway was paused or starved, or Consul stopped confirming its session); \
                     nothing was sent"
                .into(),
        }))
    }

    /// A successor is granted the lock no sooner than `FENCE_MARGIN` after the last deadline
    /// of this lease's session (the lock-delay runs from the session's end, which is after
    /// the send of its last confirmed renew). An answer before that landed before any
    /// successor's grant; one after may have landed after the successor's first commit: the
    /// limit of the commit gate (docs/ARCHITECTURE.md), counted and logged here.
    fn answered(&self, sent: Sent, may_have_landed: bool) {
        if !may_have_landed || sent != Sent::InTime {
            return;
        }
        let now = Instant::now();
        let late_by = match self.deadline() {
            Some(until) => {
                now.checked_duration_since(until + crate::coordination::consul::FENCE_MARGIN)
            }
            None => Some(Duration::ZERO),
        };
        let Some(late_by) = late_by else {
            return;
        };
        metrics::counter!(
            crate::metrics::COMMITS_LATE,
            "group" => self.key.group.clone(),
            "topic" => self.key.topic.clone()
        )
        .increment(1);
        // The lease's span names its group, topic, partition and token.
        tracing::warn!(
            parent: &self.span,
            offset = self.offset,
            late_ms = late_by.as_millis() as u64,
            "late commit: answered after its lease's fence deadline, so it may have landed \
             after a successor's commits (the gateway was paused, or the request was held in \
             the network)"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coordination::memory::MemoryLockStore;

    fn fence_of(locks: Arc<dyn LockBackend>, deadline: Option<Instant>) -> SessionFence {
        let session = match &*locks.session_state().borrow() {
            SessionState::Live { id } => id.clone(),
            SessionState::Lost { .. } => panic!("a new backend's session is live"),
        };
        SessionFence {
            locks,
            session,
            deadline,
            span: tracing::Span::none(),
            key: LockKey::new("g", "t", 0),
            offset: 7,
        }
    }

    /// The request goes out while the lease's session is the live one and within its
    /// deadline; once the session is replaced (lost, then a new one) and the deadline taken
    /// at the check has passed, nothing is sent and the refusal says why.
    #[tokio::test(start_paused = true)]
    async fn a_commit_whose_session_went_between_check_and_send_is_not_sent() {
        let store = MemoryLockStore::new();
        let locks = Arc::new(store.backend("a"));
        let checked = Some(Instant::now() + Duration::from_secs(1));
        let fence = fence_of(locks.clone(), checked);
        assert_eq!(fence.may_send().ok(), Some(Sent::InTime));

        locks.invalidate_session();
        // The deadline taken at the check still holds for a moment.
        assert_eq!(fence.may_send().ok(), Some(Sent::InTime));
        tokio::time::advance(Duration::from_secs(2)).await;
        let refused = fence
            .may_send()
            .expect_err("past the session's last deadline");
        assert!(
            refused.to_string().contains("nothing was sent"),
            "the refusal says the commit was not sent: {refused}"
        );
        locks.shutdown().await;
    }
}
