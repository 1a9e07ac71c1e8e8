//! Queue mode's pure core: no I/O, no clock but the one passed in, no lock. The lease's queue
//! run (`lease/deliver/`) drives it; everything here is unit-tested on its own.
//!
//! - [`Queue`] (this file): a queue-mode lease's records, the [`Dispatcher`]'s hand-outs and
//!   the clients' answers kept in step with the [`Progress`] a commit carries, the records
//!   due for the dead letter topic (rejected, or delivered `max_deliveries` times), and the
//!   brake that keeps the progress within its budget.
//! - `dispatch`: [`Dispatcher`], which records may be handed out now (ordering, flow
//!   control, deadlines, retries). It owns every fact of a record held: its body (the
//!   run keeps the record's bytes there), attempts, state and failure reason.
//! - `progress`: [`Progress`], what is done and the attempts, as the commit's metadata
//!   carries them; written by [`Queue`] alone, at each hand-out and each record done.
//! - `offsets`: [`OffsetMap`], values by offset, the dispatcher's store.
//!
//! The brake: the progress grows with the gaps between done records above the lowest one not
//! done. Past [`SLOW_AT`] of [`METADATA_BUDGET`], only records inside the done span go out
//! (they close gaps as often as they open them); past [`STOP_AT`], only the lowest record
//! not done, which can only shrink the progress. That record is always deliverable, and
//! after `max_deliveries` it goes to the dead letter topic, so the brake never stalls a
//! partition for good.

use std::time::Duration;

use tokio::time::Instant;

mod dispatch;
mod offsets;
mod progress;

pub use dispatch::{
    DeadLetterCause, DeadLetterDue, Delivery, Dispatcher, Order, Redelivery, Window,
};
pub use offsets::OffsetMap;
pub use progress::{Progress, ProgressError, BROKER_METADATA_MAX_BYTES, METADATA_BUDGET};

/// Past this size of the progress, only records inside the done span go out.
pub const SLOW_AT: usize = METADATA_BUDGET * 3 / 4;
/// Past this size, only the lowest record not done goes out.
pub const STOP_AT: usize = METADATA_BUDGET - 256;

/// How a queue-mode lease hands its records out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueSettings {
    pub order: Order,
    pub window: Window,
    /// How long a delivery may go unanswered before it is handed out again.
    pub ack_deadline: Duration,
    /// Deliveries after which a record that fails again goes to the dead letter topic.
    pub max_deliveries: u32,
}

/// What became of a record fetched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Offered {
    /// Waiting to be handed out.
    Queued,
    /// Done before (the progress says so): skipped.
    Done,
}

/// A queue-mode lease's records, each with what the caller keeps of it (`T`) until it is
/// done.
#[derive(Debug)]
pub struct Queue<T> {
    settings: QueueSettings,
    dispatcher: Dispatcher<T>,
    progress: Progress,
    /// Records to be written to the dead letter topic, in the order they became due.
    dead_letters: Vec<i64>,
}

impl<T> Queue<T> {
    /// Starts from the `progress` the last commit carried.
    pub fn new(settings: QueueSettings, progress: Progress) -> Self {
        Queue {
            dispatcher: Dispatcher::new(settings.order, settings.window, settings.ack_deadline),
            settings,
            progress,
            dead_letters: Vec::new(),
        }
    }

    /// The progress to commit now.
    pub fn progress(&self) -> &Progress {
        &self.progress
    }

    /// A record fetched, in offset order, with what the caller keeps of it until it is done
    /// (dropped at once if it was done before).
    pub fn offer(&mut self, offset: i64, key: Option<Vec<u8>>, bytes: usize, body: T) -> Offered {
        if self.progress.is_done(offset) {
            return Offered::Done;
        }
        let attempts = self.progress.attempts(offset);
        self.dispatcher.offer(offset, key, bytes, attempts, body);
        Offered::Queued
    }

    /// Offsets of `range` hold no record the lease can see (the gap between two records
    /// fetched one after the other, or below the first): done, so that the committed
    /// offset passes them. A read_committed reader never gets a transaction's markers or its
    /// aborted records, nor a compacted topic's removed ones.
    pub fn absent(&mut self, range: std::ops::Range<i64>) {
        self.progress.mark_absent(range);
    }

    /// What the caller keeps of `offset`, while it is held (not done).
    pub fn body(&self, offset: i64) -> Option<&T> {
        self.dispatcher.body(offset)
    }

    /// Records held (fetched and not done), and their bytes.
    pub fn held(&self) -> (usize, usize) {
        (self.dispatcher.len(), self.dispatcher.held_bytes())
    }

    /// When the delivery in flight longest went out.
    pub fn oldest_in_flight(&self) -> Option<Instant> {
        self.dispatcher.oldest_in_flight()
    }

    /// The highest offset the brake lets go out now (records not done are all at or above
    /// the base, so at [`STOP_AT`] only the base goes).
    fn brake(&self) -> i64 {
        let size = self.progress.encoded_len();
        if size < SLOW_AT {
            i64::MAX
        } else if size < STOP_AT {
            self.progress.highest_done().unwrap_or(self.progress.base())
        } else {
            self.progress.base()
        }
    }

    /// The next delivery at `now`, if the ordering, the window and the brake let one go. The
    /// records whose deadline passed are taken back first; those at their last delivery
    /// become due for the dead letter topic instead.
    pub fn next(&mut self, now: Instant) -> Option<Delivery> {
        for offset in self.dispatcher.expire(now) {
            self.failed(offset);
        }
        let limit = self.brake();
        let delivery = self.dispatcher.next_up_to(now, limit)?;
        self.progress.delivered(delivery.offset);
        Some(delivery)
    }

    /// A delivery of `offset` failed (a retry, or its deadline passed): at its last
    /// delivery, it becomes due for the dead letter topic.
    fn failed(&mut self, offset: i64) {
        if self.dispatcher.attempts(offset) >= self.settings.max_deliveries {
            self.dispatcher.hold(offset, DeadLetterCause::MaxDeliveries);
            self.dead_letters.push(offset);
        }
    }

    /// `offset` was handled: done.
    pub fn accept(&mut self, offset: i64) -> bool {
        let known = self.dispatcher.finish(offset);
        if known {
            self.progress.mark_done(offset);
        }
        known
    }

    /// `offset` is to be delivered again, not before `not_before`; at its last delivery it
    /// becomes due for the dead letter topic instead (with `reason`, unless empty).
    pub fn retry(&mut self, offset: i64, not_before: Instant, reason: &str) -> bool {
        if !self.dispatcher.retry(offset, not_before) {
            return false;
        }
        if !reason.is_empty() {
            self.dispatcher.note_reason(offset, reason);
        }
        self.failed(offset);
        true
    }

    /// `offset` goes to the dead letter topic now, whatever its deliveries, with `reason`.
    pub fn reject(&mut self, offset: i64, reason: &str) -> bool {
        if !self.dispatcher.hold(offset, DeadLetterCause::Rejected) {
            return false;
        }
        self.dispatcher.note_reason(offset, reason);
        self.dead_letters.push(offset);
        true
    }

    /// `offset`, due for the dead letter topic, as its copy there needs it.
    pub fn dead_letter(&self, offset: i64) -> Option<DeadLetterDue<'_, T>> {
        self.dispatcher.dead_letter(offset)
    }

    /// The records due for the dead letter topic, taken: the caller writes each, then calls
    /// [`Queue::dead_lettered`]. Until then its key waits, and it is not done.
    pub fn take_dead_letters(&mut self) -> Vec<i64> {
        std::mem::take(&mut self.dead_letters)
    }

    /// The broker acknowledged `offset`'s copy in the dead letter topic: done. Why it went
    /// there, or `None` if it was not due.
    pub fn dead_lettered(&mut self, offset: i64) -> Option<DeadLetterCause> {
        let cause = self.dispatcher.dead_letter(offset)?.cause;
        self.accept(offset).then_some(cause)
    }

    /// `offset`, in flight, gets until `deadline`.
    pub fn renew(&mut self, offset: i64, deadline: Instant) -> bool {
        self.dispatcher.renew(offset, deadline)
    }

    /// Whether records are due for the dead letter topic ([`Queue::take_dead_letters`]).
    pub fn dead_letters_due(&self) -> bool {
        !self.dead_letters.is_empty()
    }

    /// The attempt of `offset`'s delivery in flight and when it went out, if it is in
    /// flight.
    pub fn in_flight_of(&self, offset: i64) -> Option<(u32, Instant)> {
        self.dispatcher.in_flight_of(offset)
    }

    /// Records in flight, and their bytes.
    pub fn in_flight(&self) -> (usize, usize) {
        self.dispatcher.in_flight()
    }

    /// Deliveries `offset` has had.
    pub fn attempts(&self, offset: i64) -> u32 {
        self.dispatcher.attempts(offset)
    }

    /// Whether the record at `offset` was ever handed out, by this holder or an earlier one
    /// (a done record was): an answer for one never delivered is the client's mistake.
    pub fn ever_delivered(&self, offset: i64) -> bool {
        self.progress.is_done(offset)
            || self.progress.attempts(offset) > 0
            || self.dispatcher.attempts(offset) > 0
    }

    /// When something changes by itself (a deadline, the end of a retry's delay).
    pub fn next_wake(&self) -> Option<Instant> {
        self.dispatcher.next_wake()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(order: Order) -> QueueSettings {
        QueueSettings {
            order,
            window: Window {
                max_records: 64,
                max_bytes: usize::MAX,
            },
            ack_deadline: Duration::from_secs(30),
            max_deliveries: 3,
        }
    }

    #[test]
    fn a_poison_record_goes_to_the_dead_letters_after_its_last_delivery_and_its_key_waits() {
        let now = Instant::now();
        let mut q = Queue::new(settings(Order::Key), Progress::new(0));
        q.offer(0, Some(b"poison".to_vec()), 1, ());
        q.offer(1, Some(b"poison".to_vec()), 1, ());
        q.offer(2, Some(b"other".to_vec()), 1, ());
        for attempt in 1..=3 {
            let d = q.next(now).expect("the poison record");
            assert_eq!((d.offset, d.attempt), (0, attempt));
            let other = q.next(now);
            if attempt == 1 {
                assert_eq!(other.map(|d| d.offset), Some(2), "other keys go meanwhile");
                assert!(q.accept(2));
            }
            assert!(q.retry(0, now, ""));
        }
        assert_eq!(q.take_dead_letters(), [0]);
        assert_eq!(
            q.next(now),
            None,
            "its key waits for the dead letter's write"
        );
        assert_eq!(q.dead_lettered(0), Some(DeadLetterCause::MaxDeliveries));
        assert_eq!(q.next(now).map(|d| d.offset), Some(1));
        assert!(q.accept(1));
        assert_eq!(q.progress().base(), 3);
    }

    #[test]
    fn a_record_counts_as_delivered_once_handed_out_or_done() {
        let now = Instant::now();
        let mut q = Queue::<()>::new(settings(Order::Unordered), Progress::new(10));
        for offset in 10..13 {
            q.offer(offset, None, 1, ());
        }
        // Below the base: done before this holder.
        assert!(q.ever_delivered(9));
        // Offered but not handed out, and past what was fetched: never delivered.
        assert!(!q.ever_delivered(10) && !q.ever_delivered(999));
        let first = q.next(now).expect("a delivery").offset;
        assert!(q.ever_delivered(first));
        assert!(q.accept(first));
        assert!(q.ever_delivered(first), "done stays delivered");
    }

    #[test]
    fn attempts_and_done_records_carry_over_a_handover() {
        let now = Instant::now();
        let mut first = Queue::<()>::new(settings(Order::Unordered), Progress::new(10));
        for offset in 10..14 {
            first.offer(offset, None, 1, ());
        }
        let _ = std::iter::from_fn(|| first.next(now)).count();
        assert!(first.accept(12) && first.retry(11, now, ""));
        // The next holder starts from the committed progress.
        let metadata = format!("kafka-lease token=5;{}", first.progress().encode());
        let progress =
            Progress::from_metadata(first.progress().base(), &metadata).expect("decodes");
        let mut next = Queue::new(settings(Order::Unordered), progress);
        assert_eq!(next.offer(12, None, 1, ()), Offered::Done);
        assert_eq!(next.offer(11, None, 1, ()), Offered::Queued);
        assert_eq!(next.attempts(11), 1);
        let out: Vec<(i64, u32)> =
            std::iter::from_fn(|| next.next(now).map(|d| (d.offset, d.attempt))).collect();
        assert_eq!(out, [(11, 2)]);
    }

    #[test]
    fn the_brake_keeps_the_progress_in_budget_and_lets_the_stuck_record_out() {
        let now = Instant::now();
        let mut s = settings(Order::Unordered);
        s.window.max_records = 1_000_000;
        let mut q = Queue::new(s, Progress::new(0));
        // Every other record done past a stuck one: the progress grows with each gap.
        let mut offset = 0;
        let mut stuck_seen = false;
        loop {
            q.offer(offset, None, 1, ());
            offset += 1;
            let Some(d) = q.next(now) else { break };
            if d.offset == 0 {
                stuck_seen = true;
                continue;
            }
            if d.offset % 2 == 1 {
                q.accept(d.offset);
            }
            assert!(q.progress().encoded_len() <= METADATA_BUDGET);
            if offset > 100_000 {
                break;
            }
        }
        assert!(stuck_seen);
        assert!(
            q.progress().encoded_len() >= SLOW_AT && offset < 100_000,
            "the brake stopped new deliveries before the budget: {} bytes at offset {offset}",
            q.progress().encoded_len()
        );
        // The stuck record fails to its end and goes to the dead letters; done, it frees all.
        for _ in 0..3 {
            assert!(q.retry(0, now, ""));
            if let Some(d) = q.next(now) {
                assert_eq!(d.offset, 0);
            }
        }
        assert_eq!(q.take_dead_letters(), [0]);
        assert_eq!(q.dead_lettered(0), Some(DeadLetterCause::MaxDeliveries));
        assert_eq!(q.progress().base(), 2);
    }
}
