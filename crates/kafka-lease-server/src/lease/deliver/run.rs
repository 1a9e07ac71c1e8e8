//! A lease's queue run: the [`Queue`] of records fetched and not done, under one lock, with
//! the counts and signals the fetcher, the keeper and the stream share.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::error::LeaseError;
use crate::kafka::BatchLimits;
use crate::queue::{Offered, Order, Progress, Queue, Redelivery};
use crate::records::{DeliverBatch, OneRecord};

use crate::lease::Lease;

use super::window::SharedWindow;
use super::{
    Ack, AckKind, AckOutcome, DeliverSettings, QueueSnapshot, LOOKAHEAD_BYTES, LOOKAHEAD_RECORDS,
};

/// Most deliveries in one response, and its bytes (a larger record goes alone).
const RESPONSE_RECORDS: usize = 500;
const RESPONSE_BYTES: usize = 1024 * 1024;

/// What the run's lock guards. Every fact of a record held (its bytes, attempts, state,
/// when it went out, why it failed) is the queue's; the rest is the run's own.
#[derive(Debug)]
pub(super) struct RunState {
    pub(super) queue: Queue<OneRecord>,
    /// The offset the fetcher takes next.
    next_fetch: i64,
    /// The progress changed since the last commit.
    pub(super) dirty: bool,
    /// The lease ended: what it had in flight went back to the shared window.
    closed: bool,
    /// Dead letters the keeper took and has not finished writing.
    pub(super) writing: usize,
    deliveries: u64,
    redeliveries: u64,
    pub(super) dead_letters: u64,
    /// Records done (accepted, or dead-lettered) since the queue opened on this lease.
    done: u64,
    /// Of those, the ones the last commit that landed carried.
    done_committed: u64,
    /// When that commit landed (when the queue opened, before the first).
    committed_at: Instant,
}

impl RunState {
    /// A record was done: the progress changed.
    pub(super) fn record_done(&mut self) {
        self.dirty = true;
        self.done += 1;
    }
}

/// A lease's queue mode (see the module docs).
pub struct QueueRun {
    pub(super) settings: DeliverSettings,
    pub(super) counters: crate::metrics::QueueCounters,
    /// The window shared with other queues (a Subscribe member's), if any.
    pub(super) shared: Option<Arc<SharedWindow>>,
    state: Mutex<RunState>,
    /// Deliveries may be ready: records fetched, room in the window, a deadline or delay.
    pub(super) ready: Notify,
    /// Records left the lookahead: the fetcher may fetch.
    pub(super) room: Notify,
    /// Records are due for the dead letter topic.
    pub(super) letters: Notify,
    /// A dead letter was written (or given up with the lease).
    pub(super) letters_written: Notify,
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
                next_fetch,
                dirty: false,
                closed: false,
                writing: 0,
                deliveries: 0,
                redeliveries: 0,
                dead_letters: 0,
                done: 0,
                done_committed: 0,
                committed_at: Instant::now(),
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

    pub(super) fn state(&self) -> MutexGuard<'_, RunState> {
        // Every update leaves the state whole between statements that can panic.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Where the fetcher goes on and how much it may take now; `None` while the lookahead is
    /// full, or nearly.
    pub(super) fn fetch_room(&self) -> Option<(i64, BatchLimits)> {
        let state = self.state();
        let window = self.settings.queue.window;
        let max_records = window.max_records + LOOKAHEAD_RECORDS;
        let max_bytes = window.max_bytes.saturating_add(LOOKAHEAD_BYTES);
        // While the lookahead is three quarters full, the fetcher waits for room for a fair
        // batch rather than fetching the few records each answer frees.
        let least = RESPONSE_RECORDS.min(max_records / 4);
        let (held, held_bytes) = state.queue.held();
        if held + least > max_records || held_bytes >= max_bytes {
            return None;
        }
        Some((
            state.next_fetch,
            BatchLimits {
                max_records: (max_records - held).min(RESPONSE_RECORDS),
                max_bytes: RESPONSE_BYTES,
            },
        ))
    }

    /// Records fetched, in offset order; the fetch has reached `reached` (past the last
    /// record, when the offsets after it hold none this reader can see).
    pub(super) fn offer(&self, records: Vec<OneRecord>, reached: i64) {
        // Only key order looks at keys.
        let keyed = self.settings.queue.order == Order::Key;
        {
            let mut state = self.state();
            for record in records {
                // The fetch went on from `next_fetch`: the offsets before this record hold
                // none this reader can see (transaction markers, aborted or compacted
                // records). Done, or the committed offset would stop at the first of them.
                if record.offset > state.next_fetch {
                    let gap = state.next_fetch..record.offset;
                    state.queue.absent(gap);
                    state.dirty = true;
                }
                state.next_fetch = record.offset + 1;
                let key = record.key.as_deref().filter(|_| keyed).map(<[u8]>::to_vec);
                let (offset, bytes) = (record.offset, record.field.len());
                // A record done before is dropped here.
                let _: Offered = state.queue.offer(offset, key, bytes, record);
            }
            if reached > state.next_fetch {
                let gap = state.next_fetch..reached;
                state.queue.absent(gap);
                state.dirty = true;
                state.next_fetch = reached;
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
    pub(super) fn close(&self) {
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
    pub(super) fn take_ready(&self, now: Instant) -> DeliverBatch {
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
                let Some(record) = state.queue.body(delivery.offset) else {
                    continue;
                };
                let deadline = wall_now + delivery.deadline.saturating_duration_since(now);
                batch.push(&record.field, delivery.attempt, timestamp_parts(deadline));
                // The attempt counts in the progress: the next commit carries it.
                state.dirty = true;
                state.deliveries += 1;
                if let Some(redelivery) = delivery.redelivery {
                    state.redeliveries += 1;
                    let cause = match redelivery {
                        Redelivery::Retried => &self.counters.redelivered_retry,
                        Redelivery::Deadline => &self.counters.redelivered_deadline,
                        Redelivery::Handover => &self.counters.redelivered_handover,
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
    pub(super) fn next_wake(&self) -> Option<Instant> {
        self.state().queue.next_wake()
    }

    /// Applies `acks` in order.
    pub(super) fn apply(&self, acks: &[Ack], now: Instant) -> Vec<AckOutcome> {
        // The answers by kind and outcome, counted once for the whole call.
        let mut answers = crate::metrics::AnswerCounts::default();
        let (outcomes, letters) = self.in_window(|state| {
            let outcomes: Vec<AckOutcome> = acks
                .iter()
                .map(|ack| {
                    let in_flight = state.queue.in_flight_of(ack.offset);
                    let this_delivery =
                        in_flight.is_some_and(|(a, _)| ack.attempt.is_none_or(|asked| asked == a));
                    let latency = |histogram: &metrics::Histogram| {
                        if let Some((_, at)) = in_flight.filter(|_| this_delivery) {
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
                                state.record_done();
                            }
                            done
                        }
                        AckKind::Retry { .. } | AckKind::Reject { .. } | AckKind::Renew
                            if !this_delivery =>
                        {
                            false
                        }
                        AckKind::Retry { delay, reason } => {
                            latency(&self.counters.ack_retry);
                            state.queue.retry(ack.offset, now + *delay, reason)
                        }
                        AckKind::Reject { reason } => {
                            latency(&self.counters.ack_reject);
                            state.queue.reject(ack.offset, reason)
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
            oldest_in_flight: state.queue.oldest_in_flight().map(|at| now - at),
            waiting: state.queue.held().0.saturating_sub(in_flight),
            deliveries: state.deliveries,
            redeliveries: state.redeliveries,
            dead_letters: state.dead_letters,
            progress_age: now.saturating_duration_since(state.committed_at),
            done_not_committed: state.done - state.done_committed,
        }
    }
}

/// `t` as a `google.protobuf.Timestamp`'s (seconds, nanos).
fn timestamp_parts(t: SystemTime) -> (i64, i32) {
    let since = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    (since.as_secs() as i64, since.subsec_nanos() as i32)
}

impl QueueRun {
    /// Commits the progress for `lease` if it changed since the last commit.
    pub(super) async fn commit_progress(&self, lease: &Lease) -> Result<(), LeaseError> {
        let run = self;
        let _one_at_a_time = run.commit_lock.lock().await;
        let (base, encoded, done) = {
            let mut state = run.state();
            if !state.dirty {
                return Ok(());
            }
            state.dirty = false;
            let progress = state.queue.progress();
            (progress.base(), progress.encode(), state.done)
        };
        match lease.commit(base, Some(&encoded)).await {
            Ok(_) => {
                let mut state = run.state();
                state.done_committed = state.done_committed.max(done);
                state.committed_at = Instant::now();
                Ok(())
            }
            Err(err) => {
                run.state().dirty = true;
                Err(err)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::{QueueSettings, Window};
    use std::time::Duration;

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
        run.offer(records(0..4), 0);
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
        run.offer(records(0..3), 0);
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
