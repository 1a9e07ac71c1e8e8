//! Queue mode on a lease: the Deliver path and the answers to it.
//!
//! The first Deliver on a lease opens its [`QueueRun`]: the [`Queue`] (which records may go
//! out, the progress to commit, the records due for the dead letter topic), started from the
//! progress the partition's last commit carried, and two tasks that live as long as the lease:
//! - the *fetcher* pulls records from the lease's partition feed into the queue, keeping each
//!   record's bytes (shared with the batch they were fetched in) until it is done, within a
//!   lookahead of [`LOOKAHEAD_RECORDS`] and [`LOOKAHEAD_BYTES`] beyond the window;
//! - the *keeper* writes the records due to the dead letter topic (each done only once the
//!   broker acknowledged its copy) and commits the progress, fenced, about every
//!   [`COMMIT_INTERVAL`] while it changed.
//!
//! A [`DeliverStream`] hands out what the queue lets go, as encoded `DeliverResponse`s; the
//! answers come through [`Lease::acknowledge`] from any connection. Deliver shares the Read
//! slot of the lease: a Deliver supersedes a Read or Deliver open on it, and keeps the lease
//! alive the same way.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use kafka_lease_proto::wire::EncodedDeliverResponse;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::error::LeaseError;
use crate::kafka::{BatchLimits, DeadLetter, DeadLetters};
use crate::queue::{Offered, OffsetMap, Order, Progress, Queue, QueueSettings};
use crate::records::{DeliverBatch, OneRecord, RecordsFor};

use super::read::{suspended_pause, Stop};
use super::{Call, Fence, Lease};

/// How often the keeper commits the progress while it changes.
pub const COMMIT_INTERVAL: Duration = Duration::from_secs(1);
/// Records fetched beyond the window, waiting to go out: room for other keys while one key
/// waits (key order), and for the next deliveries while the window is full.
pub const LOOKAHEAD_RECORDS: usize = 1024;
/// Bytes fetched beyond the window's bytes.
pub const LOOKAHEAD_BYTES: usize = 4 * 1024 * 1024;
/// Most deliveries in one response, and its bytes (a larger record goes alone).
const RESPONSE_RECORDS: usize = 500;
const RESPONSE_BYTES: usize = 1024 * 1024;
/// How long a Release waits for the dead letters due before it commits.
const FLUSH_LETTERS_WAIT: Duration = Duration::from_secs(5);
/// How long the keeper waits before writing a dead letter again after a failure.
const DEAD_LETTER_RETRY: Duration = Duration::from_secs(1);

/// A window of deliveries shared by several queues (a Subscribe member's leases): how many
/// records and bytes may be in flight across them all.
#[derive(Debug)]
pub struct SharedWindow {
    max_records: usize,
    max_bytes: usize,
    used: Mutex<(usize, usize)>,
    /// Room was freed: queues waiting for it look again.
    freed: Notify,
}

impl SharedWindow {
    pub fn new(max_records: usize, max_bytes: usize) -> Arc<Self> {
        Arc::new(SharedWindow {
            max_records,
            max_bytes,
            used: Mutex::new((0, 0)),
            freed: Notify::new(),
        })
    }

    fn used(&self) -> MutexGuard<'_, (usize, usize)> {
        self.used.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether one more record may go out beyond what is counted and `extra` (records and
    /// bytes taken but not counted yet); one always may when none is out.
    fn has_room(&self, extra: (usize, usize)) -> bool {
        let (records, bytes) = *self.used();
        let (records, bytes) = (records + extra.0, bytes + extra.1);
        records == 0 || (records < self.max_records && bytes < self.max_bytes)
    }

    /// Records and bytes went out (positive) or came back (negative).
    fn change(&self, records: isize, bytes: isize) {
        {
            let mut used = self.used();
            used.0 = used.0.saturating_add_signed(records);
            used.1 = used.1.saturating_add_signed(bytes);
        }
        if records < 0 || bytes < 0 {
            self.freed.notify_waiters();
        }
    }
}

/// A queue's settings as the first Deliver gave them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeliverSettings {
    pub queue: QueueSettings,
    pub dead_letter_topic: String,
}

/// An answer to a delivery.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AckKind {
    Accept,
    Retry { delay: Duration, reason: String },
    Reject { reason: String },
    Renew,
}

impl AckKind {
    /// Its name in the answers metric.
    pub fn label(&self) -> &'static str {
        match self {
            AckKind::Accept => "accept",
            AckKind::Retry { .. } => "retry",
            AckKind::Reject { .. } => "reject",
            AckKind::Renew => "renew",
        }
    }
}

/// An answer to the delivery `attempt` (any, when `None`) of the record at `offset`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ack {
    pub offset: i64,
    pub attempt: Option<u32>,
    pub kind: AckKind,
}

/// What became of an answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AckOutcome {
    Applied,
    /// Changed nothing: not in flight (or not that delivery), or done.
    Stale,
    /// Changed nothing: no record at this offset was ever delivered (by any holder).
    NotDelivered,
}

impl AckOutcome {
    /// Its name in the answers metric.
    pub fn label(self) -> &'static str {
        match self {
            AckOutcome::Applied => "applied",
            AckOutcome::Stale => "stale",
            AckOutcome::NotDelivered => "not_delivered",
        }
    }
}

/// What ListLeases shows of a queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueSnapshot {
    pub settings: DeliverSettings,
    pub in_flight: usize,
    pub oldest_in_flight: Option<Duration>,
    pub waiting: usize,
    pub deliveries: u64,
    pub redeliveries: u64,
    pub dead_letters: u64,
}

#[derive(Debug)]
struct RunState {
    queue: Queue,
    /// The records offered and not done, by offset, with what the answers to them left.
    held: OffsetMap<Held>,
    body_bytes: usize,
    /// The offset the fetcher takes next.
    next_fetch: i64,
    /// The progress changed since the last commit.
    dirty: bool,
    /// The lease ended: what it had in flight went back to the shared window.
    closed: bool,
    /// Dead letters the keeper took and has not finished writing.
    writing: usize,
    deliveries: u64,
    redeliveries: u64,
    dead_letters: u64,
}

/// A record offered and not done: its bytes, and what its deliveries and answers left.
#[derive(Debug)]
struct Held {
    record: OneRecord,
    /// When it last went out from this gateway (kept past a deadline: a redelivery's cause).
    out_at: Option<Instant>,
    /// Why it was retried or rejected, for its dead letter.
    reason: Option<String>,
    /// Answered RETRY, until delivered again (a redelivery's cause).
    retried: bool,
    /// Answered REJECT, until its dead letter is written (its cause).
    rejected: bool,
}

impl Held {
    /// A record fetched, not delivered yet.
    fn new(record: OneRecord) -> Self {
        Held {
            record,
            out_at: None,
            reason: None,
            retried: false,
            rejected: false,
        }
    }
}

impl RunState {
    fn done(&mut self, offset: i64) {
        if let Some(held) = self.held.remove(offset) {
            self.body_bytes -= held.record.field.len();
        }
        self.dirty = true;
    }
}

/// A lease's queue mode (see the module docs).
pub struct QueueRun {
    settings: DeliverSettings,
    counters: crate::metrics::QueueCounters,
    /// The window shared with other queues (a Subscribe member's), if any.
    shared: Option<Arc<SharedWindow>>,
    state: Mutex<RunState>,
    /// Deliveries may be ready: records fetched, room in the window, a deadline or delay.
    ready: Notify,
    /// Records left the lookahead: the fetcher may fetch.
    room: Notify,
    /// Records are due for the dead letter topic.
    letters: Notify,
    /// A dead letter was written (or given up with the lease).
    letters_written: Notify,
    /// One commit of the progress at a time, so an older progress never lands after a newer.
    commit_lock: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for QueueRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueRun")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl QueueRun {
    /// A queue from `progress`, fetching from its base.
    pub(super) fn new(
        settings: DeliverSettings,
        progress: Progress,
        counters: crate::metrics::QueueCounters,
        shared: Option<Arc<SharedWindow>>,
    ) -> Self {
        let next_fetch = progress.base();
        QueueRun {
            counters,
            shared,
            state: Mutex::new(RunState {
                queue: Queue::new(settings.queue, progress),
                held: OffsetMap::new(),
                body_bytes: 0,
                next_fetch,
                dirty: false,
                closed: false,
                writing: 0,
                deliveries: 0,
                redeliveries: 0,
                dead_letters: 0,
            }),
            settings,
            ready: Notify::new(),
            room: Notify::new(),
            letters: Notify::new(),
            letters_written: Notify::new(),
            commit_lock: tokio::sync::Mutex::new(()),
        }
    }

    pub fn settings(&self) -> &DeliverSettings {
        &self.settings
    }

    fn state(&self) -> MutexGuard<'_, RunState> {
        // Every update leaves the state whole between statements that can panic.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Where the fetcher goes on and how much it may take now; `None` while the lookahead is
    /// full, or nearly.
    fn fetch_room(&self) -> Option<(i64, BatchLimits)> {
        let state = self.state();
        let window = self.settings.queue.window;
        let max_records = window.max_records + LOOKAHEAD_RECORDS;
        let max_bytes = window.max_bytes.saturating_add(LOOKAHEAD_BYTES);
        // While the lookahead is three quarters full, the fetcher waits for room for a fair
        // batch rather than fetching the few records each answer frees.
        let least = RESPONSE_RECORDS.min(max_records / 4);
        if state.held.len() + least > max_records || state.body_bytes >= max_bytes {
            return None;
        }
        Some((
            state.next_fetch,
            BatchLimits {
                max_records: (max_records - state.held.len()).min(RESPONSE_RECORDS),
                max_bytes: RESPONSE_BYTES,
            },
        ))
    }

    /// Records fetched, in offset order.
    fn offer(&self, records: Vec<OneRecord>) {
        if records.is_empty() {
            return;
        }
        // Only key order looks at keys.
        let keyed = self.settings.queue.order == Order::Key;
        {
            let mut state = self.state();
            for record in records {
                state.next_fetch = record.offset + 1;
                let key = record.key.as_deref().filter(|_| keyed).map(<[u8]>::to_vec);
                let offered = state.queue.offer(record.offset, key, record.field.len());
                if offered == Offered::Queued {
                    state.body_bytes += record.field.len();
                    state.held.insert(record.offset, Held::new(record));
                }
            }
        }
        self.ready.notify_waiters();
    }

    /// Runs `change` on the state, and tells the shared window what it did to the records
    /// in flight.
    fn in_window<T>(&self, change: impl FnOnce(&mut RunState) -> T) -> T {
        let mut state = self.state();
        let before = state.queue.in_flight();
        let out = change(&mut state);
        let after = state.queue.in_flight();
        if let (Some(shared), false) = (&self.shared, state.closed) {
            if before != after {
                shared.change(
                    after.0 as isize - before.0 as isize,
                    after.1 as isize - before.1 as isize,
                );
            }
        }
        out
    }

    /// The lease ended: what it had in flight goes back to the shared window.
    fn close(&self) {
        let mut state = self.state();
        if state.closed {
            return;
        }
        state.closed = true;
        let (records, bytes) = state.queue.in_flight();
        if let Some(shared) = &self.shared {
            shared.change(-(records as isize), -(bytes as isize));
        }
    }

    /// Records in flight.
    pub fn in_flight(&self) -> usize {
        self.state().queue.in_flight().0
    }

    /// The deliveries the queue lets go at `now`, as one response's worth.
    fn take_ready(&self, now: Instant) -> DeliverBatch {
        let mut batch = DeliverBatch::new();
        // Every delivery of the batch gets the same deadline: now + the ack deadline.
        let wall_now = SystemTime::now();
        let letters_due = self.in_window(|state| {
            let before = state.queue.in_flight();
            while batch.len() < RESPONSE_RECORDS && batch.wire_len() < RESPONSE_BYTES {
                if let Some(shared) = &self.shared {
                    // With what this batch took already, not yet counted in the window.
                    let now_out = state.queue.in_flight();
                    let extra = (
                        now_out.0.saturating_sub(before.0),
                        now_out.1.saturating_sub(before.1),
                    );
                    if !shared.has_room(extra) {
                        break;
                    }
                }
                let Some(delivery) = state.queue.next(now) else {
                    break;
                };
                let Some(held) = state.held.get_mut(delivery.offset) else {
                    continue;
                };
                let deadline = wall_now + delivery.deadline.saturating_duration_since(now);
                batch.push(
                    &held.record.field,
                    delivery.attempt,
                    timestamp_parts(deadline),
                );
                let delivered_here_before = held.out_at.replace(now).is_some();
                let retried = std::mem::take(&mut held.retried);
                // The attempt counts in the progress: the next commit carries it.
                state.dirty = true;
                state.deliveries += 1;
                if delivery.attempt > 1 {
                    state.redeliveries += 1;
                    let cause = if retried {
                        &self.counters.redelivered_retry
                    } else if delivered_here_before {
                        &self.counters.redelivered_deadline
                    } else {
                        &self.counters.redelivered_handover
                    };
                    cause.increment(1);
                }
            }
            state.queue.dead_letters_due()
        });
        // Counted once for the batch.
        if !batch.is_empty() {
            self.counters.deliveries.increment(batch.len() as u64);
        }
        if letters_due {
            self.letters.notify_waiters();
        }
        batch
    }

    /// When the queue changes by itself (a deadline, the end of a delay).
    fn next_wake(&self) -> Option<Instant> {
        self.state().queue.next_wake()
    }

    /// Applies `acks` in order.
    fn apply(&self, acks: &[Ack], now: Instant) -> Vec<AckOutcome> {
        // The answers by kind and outcome, counted once for the whole call.
        let mut answers = crate::metrics::AnswerCounts::default();
        let (outcomes, letters) = self.in_window(|state| {
            let outcomes: Vec<AckOutcome> = acks
                .iter()
                .map(|ack| {
                    let in_flight = state.queue.in_flight_attempt(ack.offset);
                    let this_delivery =
                        in_flight.is_some_and(|a| ack.attempt.is_none_or(|asked| asked == a));
                    let sent_at = state.held.get(ack.offset).and_then(|held| held.out_at);
                    let latency = |histogram: &metrics::Histogram| {
                        if let Some(at) = sent_at.filter(|_| this_delivery) {
                            histogram.record(now.saturating_duration_since(at).as_secs_f64());
                        }
                    };
                    let kind = ack.kind.label();
                    // A record never delivered (here or by an earlier holder) is not the
                    // client's to answer: most likely an offset off by one.
                    if !state.queue.ever_delivered(ack.offset) {
                        answers.add(kind, AckOutcome::NotDelivered.label());
                        return AckOutcome::NotDelivered;
                    }
                    let applied = match &ack.kind {
                        // Handed out before, but not by this holder yet: not in its hands.
                        AckKind::Accept if state.queue.attempts(ack.offset) == 0 => false,
                        AckKind::Accept => {
                            let done = state.queue.accept(ack.offset);
                            if done {
                                latency(&self.counters.ack_accept);
                                state.done(ack.offset);
                            }
                            done
                        }
                        AckKind::Retry { .. } | AckKind::Reject { .. } | AckKind::Renew
                            if !this_delivery =>
                        {
                            false
                        }
                        AckKind::Retry { delay, reason } => {
                            if let Some(held) = state.held.get_mut(ack.offset) {
                                if !reason.is_empty() {
                                    held.reason = Some(reason.clone());
                                }
                                held.out_at = None;
                                held.retried = true;
                            }
                            latency(&self.counters.ack_retry);
                            state.queue.retry(ack.offset, now + *delay)
                        }
                        AckKind::Reject { reason } => {
                            if let Some(held) = state.held.get_mut(ack.offset) {
                                held.reason = Some(reason.clone());
                                held.out_at = None;
                                held.rejected = true;
                            }
                            latency(&self.counters.ack_reject);
                            state.queue.reject(ack.offset)
                        }
                        AckKind::Renew => state
                            .queue
                            .renew(ack.offset, now + self.settings.queue.ack_deadline),
                    };
                    let outcome = if applied {
                        AckOutcome::Applied
                    } else {
                        AckOutcome::Stale
                    };
                    answers.add(kind, outcome.label());
                    outcome
                })
                .collect();
            (outcomes, state.queue.dead_letters_due())
        });
        answers.record();
        self.ready.notify_waiters();
        self.room.notify_waiters();
        if letters {
            self.letters.notify_waiters();
        }
        outcomes
    }

    /// What ListLeases shows.
    pub fn snapshot(&self) -> QueueSnapshot {
        let state = self.state();
        let now = Instant::now();
        let (in_flight, _) = state.queue.in_flight();
        QueueSnapshot {
            settings: self.settings.clone(),
            in_flight,
            oldest_in_flight: state
                .held
                .values()
                .filter_map(|held| held.out_at)
                .min()
                .map(|at| now - at),
            waiting: state.held.len().saturating_sub(in_flight),
            deliveries: state.deliveries,
            redeliveries: state.redeliveries,
            dead_letters: state.dead_letters,
        }
    }
}

/// `t` as a `google.protobuf.Timestamp`'s (seconds, nanos).
fn timestamp_parts(t: SystemTime) -> (i64, i32) {
    let since = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    (since.as_secs() as i64, since.subsec_nanos() as i32)
}

impl Lease {
    /// The lease's queue, once a Deliver opened it.
    pub fn queue(&self) -> Option<&Arc<QueueRun>> {
        self.queue.get()
    }

    /// The progress the partition's last commit carried, when it is where the lease starts;
    /// else nothing done from the resume point.
    pub async fn committed_progress(&self) -> Result<Progress, LeaseError> {
        let start = self.resume_point();
        let committed = self
            .group_client
            .committed(&self.key.topic, self.key.partition)
            .await?;
        Ok(match committed {
            Some((offset, metadata)) if offset == start => {
                Progress::from_metadata(offset, &metadata).unwrap_or_else(|err| {
                    tracing::warn!(parent: &self.span, error = %err, %metadata, "the committed progress is unreadable; starting from the committed offset with nothing done above it");
                    Progress::new(offset)
                })
            }
            _ => Progress::new(start),
        })
    }

    /// Opens a Deliver: puts the lease in queue mode with `settings` (starting from
    /// `progress`) unless it is already, in which case the settings must be the queue's. It
    /// supersedes any Read or Deliver open on the lease.
    pub fn open_deliver(
        self: &Arc<Self>,
        settings: DeliverSettings,
        progress: Progress,
        dead_letters: &DeadLetters,
        shared: Option<Arc<SharedWindow>>,
    ) -> Result<DeliverStream, LeaseError> {
        let mut opened = false;
        let run = self
            .queue
            .get_or_init(|| {
                opened = true;
                Arc::new(QueueRun::new(
                    settings.clone(),
                    progress,
                    crate::metrics::QueueCounters::of(&self.key.group, &self.key.topic),
                    shared,
                ))
            })
            .clone();
        if run.settings != settings {
            return Err(LeaseError::InvalidArgument {
                field: "ordering",
                message: format!(
                    "lease {:?} is in queue mode with other settings ({:?}); a Deliver must ask \
                     for the queue's settings: {:?}",
                    self.lease_ref, settings, run.settings
                ),
            });
        }
        if opened {
            tracing::info!(parent: &self.span, settings = ?run.settings, "queue mode opened");
            tokio::spawn(fetch(self.clone(), run.clone()));
            tokio::spawn(keep(self.clone(), run.clone(), dead_letters.clone()));
        }
        let generation = {
            let mut state = self.state();
            if let Some(reason) = &state.ended {
                return Err(self.ended_error(reason));
            }
            state.read_generation += 1;
            state.read_open = true;
            state.read_generation
        };
        self.interrupt();
        Ok(DeliverStream {
            lease: self.clone(),
            run,
            generation,
            step: None,
            finished: false,
        })
    }

    /// Applies answers to deliveries. Fenced: a lease that has ended, or whose gateway can no
    /// longer vouch for its lock, applies none.
    pub fn acknowledge(&self, acks: &[Ack]) -> Result<Vec<AckOutcome>, LeaseError> {
        let run = self.begin(Call::Acknowledge)?;
        let run = run.ok_or_else(|| self.wrong_mode(Call::Acknowledge))?;
        Ok(run.apply(acks, Instant::now()))
    }

    /// Commits the queue's progress now if it changed (Release does before it ends the
    /// lease).
    pub async fn flush_queue(&self) -> Result<(), LeaseError> {
        let Some(run) = self.queue.get() else {
            return Ok(());
        };
        // The dead letters due are written first (for a while at most), so that a record
        // rejected just before the release is done, not delivered to the next holder again.
        let _ = tokio::time::timeout(FLUSH_LETTERS_WAIT, async {
            loop {
                let written = run.letters_written.notified();
                tokio::pin!(written);
                written.as_mut().enable();
                {
                    let state = run.state();
                    if state.writing == 0 && !state.queue.dead_letters_due() {
                        return;
                    }
                }
                run.letters.notify_waiters();
                written.await;
            }
        })
        .await;
        commit_progress(self, run).await
    }
}

/// Commits `run`'s progress if it changed since the last commit.
async fn commit_progress(lease: &Lease, run: &QueueRun) -> Result<(), LeaseError> {
    let _one_at_a_time = run.commit_lock.lock().await;
    let (base, encoded) = {
        let mut state = run.state();
        if !state.dirty {
            return Ok(());
        }
        state.dirty = false;
        let progress = state.queue.progress();
        (progress.base(), progress.encode())
    };
    match lease.commit(base, Some(&encoded)).await {
        Ok(_) => Ok(()),
        Err(err) => {
            run.state().dirty = true;
            Err(err)
        }
    }
}

/// The fetcher (see the module docs): until the lease ends.
async fn fetch(lease: Arc<Lease>, run: Arc<QueueRun>) {
    let mut interrupts = lease.interrupts.subscribe();
    loop {
        if lease.is_ended() {
            return;
        }
        let room = run.room.notified();
        tokio::pin!(room);
        room.as_mut().enable();
        let Some((from, limits)) = run.fetch_room() else {
            tokio::select! {
                () = room => {}
                _ = interrupts.changed() => {}
            }
            continue;
        };
        let mut feed_guard = tokio::select! {
            guard = lease.feed.lock() => guard,
            _ = interrupts.changed() => continue,
        };
        let Some(feed) = feed_guard.as_mut() else {
            // Dismantled: the lease is ending.
            return;
        };
        if let Err(err) = feed.align(from).await {
            tracing::warn!(parent: &lease.span, error = %err, "repositioning the partition failed; retrying");
            drop(feed_guard);
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(500)) => {}
                _ = interrupts.changed() => {}
            }
            continue;
        }
        // Sized as the last batch was, so that filling it does not grow it copy by copy.
        let mut batch = feed.new_batch(limits, RecordsFor::Read);
        if feed.take_queued(&mut batch, from, limits) && batch.is_empty() {
            let got = tokio::select! {
                more = feed.take_next(&mut batch, from, limits) => more,
                _ = interrupts.changed() => false,
            };
            if got {
                feed.take_queued(&mut batch, from, limits);
            }
        }
        let high = feed.cached_high_watermark();
        feed.filled(&mut batch);
        drop(feed_guard);
        if let Some(high) = high {
            lease.note_high_watermark(high);
        }
        run.offer(batch.into_records());
    }
}

/// The keeper (see the module docs): until the lease ends.
async fn keep(lease: Arc<Lease>, run: Arc<QueueRun>, dead_letters: DeadLetters) {
    keep_until_the_end(&lease, &run, &dead_letters).await;
    run.close();
}

async fn keep_until_the_end(lease: &Arc<Lease>, run: &Arc<QueueRun>, dead_letters: &DeadLetters) {
    let mut interrupts = lease.interrupts.subscribe();
    let mut last_commit = Instant::now();
    loop {
        let letters = run.letters.notified();
        tokio::pin!(letters);
        letters.as_mut().enable();
        if lease.is_ended() {
            return;
        }
        let due = {
            let mut state = run.state();
            let due = state.queue.take_dead_letters();
            state.writing += due.len();
            due
        };
        for (i, offset) in due.iter().enumerate() {
            let written = write_dead_letter(lease, run, dead_letters, *offset).await;
            run.state().writing -= 1;
            run.letters_written.notify_waiters();
            if !written {
                run.state().writing -= due.len() - i - 1;
                run.letters_written.notify_waiters();
                return;
            }
        }
        if last_commit.elapsed() >= COMMIT_INTERVAL {
            last_commit = Instant::now();
            if let Err(err) = commit_progress(lease, run).await {
                if lease.is_ended() {
                    return;
                }
                tracing::warn!(parent: &lease.span, error = %err, "committing the queue's progress failed; retrying");
            }
        }
        tokio::select! {
            () = letters => {}
            () = tokio::time::sleep_until(last_commit + COMMIT_INTERVAL) => {}
            _ = interrupts.changed() => {}
        }
    }
}

/// Writes the dead letter of `offset` until the broker acknowledges it, then marks the
/// record done. False when the lease ended (or can no longer vouch for its lock) first.
async fn write_dead_letter(
    lease: &Lease,
    run: &QueueRun,
    dead_letters: &DeadLetters,
    offset: i64,
) -> bool {
    let letter = {
        let state = run.state();
        let Some(held) = state.held.get(offset) else {
            return true;
        };
        let attempts = state.queue.attempts(offset);
        let reason = held.reason.clone().unwrap_or_else(|| {
            format!(
                "not handled in {attempts} deliveries (max_deliveries {})",
                run.settings.queue.max_deliveries
            )
        });
        dead_letter_of(
            lease,
            &run.settings.dead_letter_topic,
            &held.record,
            attempts,
            reason,
        )
    };
    let mut interrupts = lease.interrupts.subscribe();
    loop {
        match lease.fence() {
            Fence::Open => {}
            Fence::Suspended(_) => {
                suspended_pause(&mut interrupts).await;
                continue;
            }
            Fence::Closed(_) => return false,
        }
        match dead_letters.write(&letter).await {
            Ok(()) => break,
            Err(err) => {
                tracing::warn!(parent: &lease.span, offset, topic = %letter.topic, error = %err, "writing a dead letter failed; retrying");
                tokio::select! {
                    () = tokio::time::sleep(DEAD_LETTER_RETRY) => {}
                    _ = interrupts.changed() => {}
                }
            }
        }
    }
    tracing::info!(parent: &lease.span, offset, topic = %letter.topic, "record written to the dead letter topic");
    {
        let mut state = run.state();
        if state.queue.dead_lettered(offset) {
            if state.held.get(offset).is_some_and(|held| held.rejected) {
                run.counters.dead_letters_rejected.increment(1);
            } else {
                run.counters.dead_letters_max_deliveries.increment(1);
            }
            state.done(offset);
            state.dead_letters += 1;
        }
    }
    run.ready.notify_waiters();
    run.room.notify_waiters();
    true
}

/// The headers a dead letter's copy gets beside the record's own.
pub mod headers {
    pub const TOPIC: &str = "kafka-lease.topic";
    pub const PARTITION: &str = "kafka-lease.partition";
    pub const OFFSET: &str = "kafka-lease.offset";
    pub const GROUP: &str = "kafka-lease.group";
    pub const ATTEMPTS: &str = "kafka-lease.attempts";
    pub const REASON: &str = "kafka-lease.reason";
    pub const FENCING_TOKEN: &str = "kafka-lease.fencing-token";
}

/// The copy of `record` for the dead letter topic.
fn dead_letter_of(
    lease: &Lease,
    topic: &str,
    record: &OneRecord,
    attempts: u32,
    reason: String,
) -> DeadLetter {
    let decoded = record.decode();
    let mut all: Vec<(String, Option<Vec<u8>>)> = decoded
        .headers
        .into_iter()
        .map(|h| (h.key, h.value.map(Vec::from)))
        .collect();
    let ours = [
        (headers::TOPIC, lease.key.topic.clone()),
        (headers::PARTITION, lease.key.partition.to_string()),
        (headers::OFFSET, record.offset.to_string()),
        (headers::GROUP, lease.key.group.clone()),
        (headers::ATTEMPTS, attempts.to_string()),
        (headers::REASON, reason),
        (headers::FENCING_TOKEN, lease.token.get().to_string()),
    ];
    all.extend(
        ours.into_iter()
            .map(|(k, v)| (k.to_string(), Some(v.into_bytes()))),
    );
    DeadLetter {
        topic: topic.to_string(),
        key: decoded.key.map(Vec::from),
        value: decoded.value.map(Vec::from),
        headers: all,
        timestamp_ms: decoded
            .timestamp
            .map(|t| t.seconds * 1000 + i64::from(t.nanos) / 1_000_000),
    }
}

/// One response's worth of deliveries of a lease.
#[derive(Debug)]
pub struct Delivered {
    pub batch: DeliverBatch,
    pub high_watermark: i64,
}

impl Delivered {
    /// As a Deliver call sends it.
    pub fn into_response(self) -> EncodedDeliverResponse {
        self.batch.into_response(self.high_watermark)
    }
}

/// What one step of a Deliver produced.
enum Step {
    Batch(DeliverBatch),
    Stop(Stop),
}

type StepFuture = Pin<Box<dyn Future<Output = Step> + Send>>;

/// Waits for deliveries for Deliver `generation`.
async fn step(lease: Arc<Lease>, run: Arc<QueueRun>, generation: u64) -> Step {
    let mut interrupts = lease.interrupts.subscribe();
    loop {
        let ready = run.ready.notified();
        tokio::pin!(ready);
        ready.as_mut().enable();
        let freed = async {
            match &run.shared {
                Some(shared) => shared.freed.notified().await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(freed);
        if let Some(stop) = lease.read_stop(&lease.state(), generation) {
            return Step::Stop(stop);
        }
        match lease.fence() {
            Fence::Open => {}
            Fence::Suspended(_) => {
                // Nothing goes out until Consul confirms the session again.
                suspended_pause(&mut interrupts).await;
                continue;
            }
            Fence::Closed(fenced) => return Step::Stop(Stop::Failed(fenced)),
        }
        let now = Instant::now();
        let batch = run.take_ready(now);
        if !batch.is_empty() {
            return Step::Batch(batch);
        }
        let wake = run.next_wake();
        tokio::select! {
            () = ready => {}
            () = freed => {}
            () = sleep_until_some(wake) => {}
            _ = interrupts.changed() => {}
        }
    }
}

async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The stream behind one Deliver call; ends as a Read's does. Dropping it closes the
/// Deliver (deliveries in flight stay in flight until answered or their deadline).
pub struct DeliverStream {
    lease: Arc<Lease>,
    run: Arc<QueueRun>,
    generation: u64,
    step: Option<StepFuture>,
    finished: bool,
}

impl std::fmt::Debug for DeliverStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeliverStream")
            .field("lease", &self.lease.lease_ref)
            .field("generation", &self.generation)
            .finish()
    }
}

impl Drop for DeliverStream {
    fn drop(&mut self) {
        self.lease.close_read(self.generation);
    }
}

impl futures::Stream for DeliverStream {
    type Item = Result<Delivered, LeaseError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if this.finished {
            return Poll::Ready(None);
        }
        let (lease, run, generation) = (this.lease.clone(), this.run.clone(), this.generation);
        let fut = this
            .step
            .get_or_insert_with(|| Box::pin(step(lease, run, generation)));
        let outcome = match fut.as_mut().poll(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(outcome) => outcome,
        };
        this.step = None;
        match outcome {
            Step::Stop(stop) => {
                this.finished = true;
                Poll::Ready(match stop {
                    Stop::Done => None,
                    Stop::Failed(err) => Some(Err(err)),
                })
            }
            Step::Batch(batch) => {
                let records = batch.len() as u64;
                let bytes = batch.wire_len() as u64;
                this.lease.delivered.records.increment(records);
                this.lease.delivered.bytes.increment(bytes);
                let high_watermark = this.lease.cached_high_watermark();
                Poll::Ready(Some(Ok(Delivered {
                    batch,
                    high_watermark,
                })))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::{Order, Window};

    fn run(order: Order) -> QueueRun {
        QueueRun::new(
            DeliverSettings {
                queue: QueueSettings {
                    order,
                    window: Window {
                        max_records: 8,
                        max_bytes: usize::MAX,
                    },
                    ack_deadline: Duration::from_secs(30),
                    max_deliveries: 3,
                },
                dead_letter_topic: "dlq".into(),
            },
            Progress::new(0),
            crate::metrics::QueueCounters::of("g", "t"),
            None,
        )
    }

    fn records(offsets: std::ops::Range<i64>) -> Vec<OneRecord> {
        offsets
            .map(|offset| OneRecord {
                offset,
                key: Some(bytes::Bytes::from_static(b"k")),
                field: bytes::Bytes::from(vec![0x0a, 0x00]),
            })
            .collect()
    }

    fn ack(offset: i64, attempt: Option<u32>, kind: AckKind) -> Ack {
        Ack {
            offset,
            attempt,
            kind,
        }
    }

    #[test]
    fn answers_apply_to_the_delivery_in_flight_and_an_accept_to_any_delivered_record() {
        let run = run(Order::Unordered);
        run.offer(records(0..4));
        let now = Instant::now();
        assert_eq!(run.take_ready(now).len(), 4);
        use AckOutcome::{Applied, NotDelivered, Stale};
        let retry = AckKind::Retry {
            delay: Duration::ZERO,
            reason: "again".into(),
        };
        let outcomes = run.apply(
            &[
                ack(0, Some(1), AckKind::Accept),
                ack(0, None, AckKind::Accept),
                ack(1, Some(2), retry.clone()),
                ack(1, Some(1), retry.clone()),
                ack(2, None, AckKind::Renew),
                ack(9, None, AckKind::Accept),
            ],
            now,
        );
        assert_eq!(
            outcomes,
            [Applied, Stale, Stale, Applied, Applied, NotDelivered]
        );
        // Record 1 comes again as its second delivery; an accept of its first still counts.
        let again = run.take_ready(now);
        assert_eq!(again.len(), 1);
        assert_eq!(
            run.apply(&[ack(1, Some(1), AckKind::Accept)], now),
            [Applied]
        );
        assert_eq!(run.apply(&[ack(1, Some(2), retry)], now), [Stale]);
        let snapshot = run.snapshot();
        assert_eq!(
            (
                snapshot.in_flight,
                snapshot.deliveries,
                snapshot.redeliveries
            ),
            (2, 5, 1)
        );
        assert!(run.state().dirty);
    }

    #[test]
    fn an_answer_for_a_record_never_delivered_is_not_delivered_and_changes_nothing() {
        let run = run(Order::Partition);
        run.offer(records(0..3));
        let now = Instant::now();
        assert_eq!(
            run.take_ready(now).len(),
            1,
            "partition order: one at a time"
        );
        let kinds = [
            AckKind::Accept,
            AckKind::Retry {
                delay: Duration::ZERO,
                reason: String::new(),
            },
            AckKind::Reject {
                reason: "no".into(),
            },
            AckKind::Renew,
        ];
        // Offered but not handed out yet (2), and past the partition's end (999).
        for offset in [2, 999] {
            for kind in &kinds {
                assert_eq!(
                    run.apply(&[ack(offset, None, kind.clone())], now),
                    [AckOutcome::NotDelivered],
                    "{kind:?} of {offset}"
                );
            }
        }
        assert_eq!(run.state().queue.progress().base(), 0, "nothing done");
        assert_eq!(run.snapshot().dead_letters, 0, "nothing dead-lettered");
        assert_eq!(
            run.apply(&[ack(0, None, AckKind::Accept)], now),
            [AckOutcome::Applied]
        );
        assert_eq!(run.take_ready(now).len(), 1);
        assert_eq!(run.state().queue.progress().base(), 1);
    }
}
