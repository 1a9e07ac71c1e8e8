//! Which records of a queue-mode lease may be handed out now: ordering per call, flow control
//! by records and bytes in flight, an ack deadline per delivery, retries after a delay, and
//! the attempts each record has had.
//!
//! Pure bookkeeping: the caller offers the records it fetched, in offset order, asks for the
//! next delivery, and reports each answer (done, retry), with the time. It is the one owner
//! of a record's facts while the record is held: its body (whatever the caller keeps of it),
//! key, size, attempts, state, when its delivery in flight went out, why it is out again,
//! and why it failed. The orderings:
//! - [`Order::Partition`]: one record at a time, in offset order (a Read's semantics).
//! - [`Order::Key`]: the records of one key in offset order, one at a time; different keys
//!   in parallel. A record being retried keeps its key waiting, so a poison record holds
//!   back its key, not the partition. Records without a key are ordered by nothing.
//! - [`Order::Unordered`]: any record, in parallel.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::time::Duration;

use tokio::time::Instant;

use super::offsets::OffsetMap;

/// How the records of one lease may be handed out relative to each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    Partition,
    Key,
    Unordered,
}

/// What may be in flight at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// Records handed out and not answered.
    pub max_records: usize,
    /// Their bytes (keys, values, headers); one record larger than this goes out alone.
    pub max_bytes: usize,
}

/// One hand-out of a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Delivery {
    pub offset: i64,
    /// 1 for the first delivery, and one more for each after it (carried over a handover).
    pub attempt: u32,
    /// When it is handed out again unless answered or renewed.
    pub deadline: Instant,
    /// Why the record goes out again; `None` for its first delivery.
    pub redelivery: Option<Redelivery>,
}

/// Why a record goes out again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Redelivery {
    /// Its last delivery was answered RETRY.
    Retried,
    /// Its last delivery here went unanswered past its deadline.
    Deadline,
    /// It was delivered by an earlier holder of the partition, and not here yet.
    Handover,
}

/// Why a record is held for the dead letter topic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeadLetterCause {
    /// Its delivery was answered REJECT.
    Rejected,
    /// It failed at its last delivery (`max_deliveries`).
    MaxDeliveries,
}

#[derive(Debug, Clone, Copy)]
enum State {
    Waiting {
        not_before: Option<Instant>,
        /// Why it waits to go out again, once it went out (here) before.
        again: Option<Redelivery>,
    },
    InFlight {
        deadline: Instant,
        /// When it went out.
        since: Instant,
    },
    /// Not to be handed out again (its dead letter is being written); its key waits.
    Held { cause: DeadLetterCause },
}

impl State {
    /// Waiting, due now.
    const READY: State = State::Waiting {
        not_before: None,
        again: None,
    };
}

#[derive(Debug)]
struct Record<T> {
    body: T,
    key: Option<Vec<u8>>,
    bytes: usize,
    attempts: u32,
    state: State,
    /// Why it last failed (a RETRY's or REJECT's reason), for its dead letter.
    reason: Option<String>,
}

/// A record held for the dead letter topic, as its copy there needs it.
#[derive(Debug)]
pub struct DeadLetterDue<'a, T> {
    pub body: &'a T,
    pub attempts: u32,
    pub reason: Option<&'a str>,
    pub cause: DeadLetterCause,
}

/// The records of one lease fetched and not done, and which are in flight.
///
/// Besides the records, three indexes, kept in step with each record's state, so that a
/// delivery, an answer and a deadline cost a few tree operations rather than a walk of every
/// record held (up to the window plus the lookahead): `ready` (waiting, and due), `delayed`
/// (waiting for the end of a retry's delay) and `deadlines` (in flight).
#[derive(Debug)]
pub struct Dispatcher<T> {
    order: Order,
    window: Window,
    ack_deadline: Duration,
    records: OffsetMap<Record<T>>,
    /// Key → its offsets not done (Key order only).
    keys: HashMap<Vec<u8>, BTreeSet<i64>>,
    /// Waiting records that may go out (their delay, if any, has ended).
    ready: BTreeSet<i64>,
    /// Waiting records whose retry delay has not ended yet: (its end, offset).
    delayed: BTreeSet<(Instant, i64)>,
    /// Records in flight: (deadline, offset), in deadline order. A delivery's deadline is
    /// mostly the latest yet (now plus the ack deadline), so it goes at the back; an entry
    /// left behind by an answer or a renewal stays until it reaches the front (or until such
    /// entries outnumber the live ones), and the front is always live.
    deadlines: VecDeque<(Instant, i64)>,
    in_flight: usize,
    in_flight_bytes: usize,
    /// The bytes of every record held.
    held_bytes: usize,
}

impl<T> Dispatcher<T> {
    pub fn new(order: Order, window: Window, ack_deadline: Duration) -> Self {
        Dispatcher {
            order,
            window,
            ack_deadline,
            records: OffsetMap::new(),
            keys: HashMap::new(),
            ready: BTreeSet::new(),
            delayed: BTreeSet::new(),
            deadlines: VecDeque::new(),
            in_flight: 0,
            in_flight_bytes: 0,
            held_bytes: 0,
        }
    }

    /// A record fetched, with what the caller keeps of it (`body`) until it is done:
    /// `attempts` deliveries it has had already (a handover carries them). Records are
    /// offered in offset order; one offered again is ignored.
    pub fn offer(
        &mut self,
        offset: i64,
        key: Option<Vec<u8>>,
        bytes: usize,
        attempts: u32,
        body: T,
    ) {
        let indexed = key.clone().filter(|_| self.order == Order::Key);
        let record = Record {
            body,
            key,
            bytes,
            attempts,
            state: State::READY,
            reason: None,
        };
        // One lookup: the insert itself refuses an offset held already.
        if !self.records.insert(offset, record) {
            return;
        }
        self.held_bytes += bytes;
        if let Some(key) = indexed {
            self.keys.entry(key).or_default().insert(offset);
        }
        self.ready.insert(offset);
    }

    /// Records offered and not done.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// The bytes of the records held.
    pub fn held_bytes(&self) -> usize {
        self.held_bytes
    }

    /// Records in flight, and their bytes.
    pub fn in_flight(&self) -> (usize, usize) {
        (self.in_flight, self.in_flight_bytes)
    }

    /// The attempt of `offset`'s delivery in flight and when it went out, if it is in
    /// flight.
    pub fn in_flight_of(&self, offset: i64) -> Option<(u32, Instant)> {
        let record = self.records.get(offset)?;
        match record.state {
            State::InFlight { since, .. } => Some((record.attempts, since)),
            _ => None,
        }
    }

    /// When the delivery in flight longest went out (a walk of the records held: for
    /// status, not for the hot path).
    pub fn oldest_in_flight(&self) -> Option<Instant> {
        self.records
            .values()
            .filter_map(|record| match record.state {
                State::InFlight { since, .. } => Some(since),
                _ => None,
            })
            .min()
    }

    /// What the caller keeps of `offset`, while it is held.
    pub fn body(&self, offset: i64) -> Option<&T> {
        self.records.get(offset).map(|record| &record.body)
    }

    /// `offset`, held for the dead letter topic, as its copy there needs it.
    pub fn dead_letter(&self, offset: i64) -> Option<DeadLetterDue<'_, T>> {
        let record = self.records.get(offset)?;
        let State::Held { cause } = record.state else {
            return None;
        };
        Some(DeadLetterDue {
            body: &record.body,
            attempts: record.attempts,
            reason: record.reason.as_deref(),
            cause,
        })
    }

    /// Notes why `offset` failed, for its dead letter.
    pub fn note_reason(&mut self, offset: i64, reason: &str) {
        if let Some(record) = self.records.get_mut(offset) {
            record.reason = Some(reason.to_string());
        }
    }

    /// Deliveries `offset` has had.
    pub fn attempts(&self, offset: i64) -> u32 {
        self.records.get(offset).map_or(0, |r| r.attempts)
    }

    /// Moves `offset` (a record held) to `state`, keeping the indexes and the window's
    /// counts in step.
    fn set_state(&mut self, offset: i64, state: State) {
        let Some(record) = self.records.get_mut(offset) else {
            return;
        };
        let mut left_flight = false;
        match std::mem::replace(&mut record.state, state) {
            State::Waiting { not_before, .. } => {
                if !self.ready.remove(&offset) {
                    if let Some(t) = not_before {
                        self.delayed.remove(&(t, offset));
                    }
                }
            }
            State::InFlight { deadline, .. } => {
                if state_is_in_flight_until(&state, deadline) {
                    // Renewed to the deadline it had: its entry stands.
                    return;
                }
                self.in_flight -= 1;
                self.in_flight_bytes -= record.bytes;
                left_flight = true;
            }
            State::Held { .. } => {}
        }
        match state {
            State::Waiting {
                not_before: None, ..
            } => {
                self.ready.insert(offset);
            }
            State::Waiting {
                not_before: Some(t),
                ..
            } => {
                self.delayed.insert((t, offset));
            }
            State::InFlight { deadline, .. } => {
                if self.deadlines.back().is_none_or(|&(t, _)| t <= deadline) {
                    self.deadlines.push_back((deadline, offset));
                } else {
                    let at = self.deadlines.partition_point(|&e| e <= (deadline, offset));
                    self.deadlines.insert(at, (deadline, offset));
                }
                self.in_flight += 1;
                self.in_flight_bytes += record.bytes;
            }
            State::Held { .. } => {}
        }
        if left_flight {
            self.clean_deadlines();
        }
    }

    /// Whether the deadlines' entry `(deadline, offset)` is its record's deadline in flight.
    fn live(&self, (deadline, offset): (Instant, i64)) -> bool {
        self.records
            .get(offset)
            .is_some_and(|r| state_is_in_flight_until(&r.state, deadline))
    }

    /// Drops the deadlines' entries left behind from the front (so that the front is live),
    /// and all of them once they outnumber the live ones.
    fn clean_deadlines(&mut self) {
        while let Some(&front) = self.deadlines.front() {
            if self.live(front) {
                break;
            }
            self.deadlines.pop_front();
        }
        if self.deadlines.len() > 2 * self.in_flight + 64 {
            let mut deadlines = std::mem::take(&mut self.deadlines);
            deadlines.retain(|&entry| self.live(entry));
            self.deadlines = deadlines;
        }
    }

    /// Whether the ready record `offset` may go out at `now`, as far as its delay and the
    /// ordering go.
    fn in_order(&self, offset: i64, record: &Record<T>, now: Instant) -> bool {
        if let State::Waiting {
            not_before: Some(t),
            ..
        } = record.state
        {
            if t > now {
                return false;
            }
        }
        match self.order {
            Order::Unordered => true,
            Order::Partition => {
                self.in_flight == 0 && self.records.first().map(|(first, _)| first) == Some(offset)
            }
            Order::Key => match &record.key {
                None => true,
                Some(key) => {
                    self.keys.get(key).and_then(|offsets| offsets.first()) == Some(&offset)
                }
            },
        }
    }

    /// The next record to hand out at `now`, if the ordering and the window let one go: the
    /// lowest offset that may. It is in flight until answered or its deadline passes.
    pub fn next(&mut self, now: Instant) -> Option<Delivery> {
        self.next_up_to(now, i64::MAX)
    }

    /// [`Dispatcher::next`] among the offsets up to `limit`.
    pub fn next_up_to(&mut self, now: Instant, limit: i64) -> Option<Delivery> {
        // Retries whose delay has ended are ready again.
        while let Some(&(t, offset)) = self.delayed.first() {
            if t > now {
                break;
            }
            self.delayed.pop_first();
            self.ready.insert(offset);
        }
        if self.in_flight >= self.window.max_records {
            return None;
        }
        let room = self.window.max_bytes.saturating_sub(self.in_flight_bytes);
        let offset = match self.order {
            // Only the lowest record not done may go, and only alone.
            Order::Partition => {
                let (first, record) = self.records.first()?;
                let fits = record.bytes <= room || self.in_flight == 0;
                (first <= limit
                    && fits
                    && self.ready.contains(&first)
                    && self.in_order(first, record, now))
                .then_some(first)?
            }
            Order::Key | Order::Unordered => {
                self.ready.range(..=limit).copied().find(|offset| {
                    self.records.get(*offset).is_some_and(|record| {
                        (record.bytes <= room || self.in_flight == 0)
                            && self.in_order(*offset, record, now)
                    })
                })?
            }
        };
        let deadline = now + self.ack_deadline;
        let again = match self.records.get(offset)?.state {
            State::Waiting { again, .. } => again,
            _ => None,
        };
        self.set_state(
            offset,
            State::InFlight {
                deadline,
                since: now,
            },
        );
        let record = self.records.get_mut(offset)?;
        record.attempts = record.attempts.saturating_add(1);
        Some(Delivery {
            offset,
            attempt: record.attempts,
            deadline,
            // Out before, but never from here: an earlier holder handed it out.
            redelivery: (record.attempts > 1).then_some(again.unwrap_or(Redelivery::Handover)),
        })
    }

    /// `offset` is done (accepted, or its dead letter written): it leaves, and the next
    /// record of its key may go. False for a record not offered or done already.
    pub fn finish(&mut self, offset: i64) -> bool {
        if !self.records.contains_key(offset) {
            return false;
        }
        // Out of every index first.
        self.set_state(
            offset,
            State::Held {
                cause: DeadLetterCause::MaxDeliveries,
            },
        );
        let Some(record) = self.records.remove(offset) else {
            return false;
        };
        self.held_bytes -= record.bytes;
        if let Some(key) = record.key {
            if let Some(offsets) = self.keys.get_mut(&key) {
                offsets.remove(&offset);
                if offsets.is_empty() {
                    self.keys.remove(&key);
                }
            }
        }
        true
    }

    /// `offset`, in flight, is to be handed out again, not before `not_before`; its key
    /// waits for it meanwhile. False unless it was in flight.
    pub fn retry(&mut self, offset: i64, not_before: Instant) -> bool {
        if !matches!(
            self.records.get(offset).map(|r| &r.state),
            Some(State::InFlight { .. })
        ) {
            return false;
        }
        self.set_state(
            offset,
            State::Waiting {
                not_before: Some(not_before),
                again: Some(Redelivery::Retried),
            },
        );
        true
    }

    /// `offset` is not to be handed out again until it is finished (its dead letter is being
    /// written, for `cause`); its key waits for it. False for a record not offered or done
    /// already.
    pub fn hold(&mut self, offset: i64, cause: DeadLetterCause) -> bool {
        if !self.records.contains_key(offset) {
            return false;
        }
        self.set_state(offset, State::Held { cause });
        true
    }

    /// `offset`, in flight, gets until `deadline`. False unless it was in flight.
    pub fn renew(&mut self, offset: i64, deadline: Instant) -> bool {
        match self.records.get(offset).map(|r| r.state) {
            Some(State::InFlight { since, .. }) => {
                self.set_state(offset, State::InFlight { deadline, since });
                true
            }
            _ => false,
        }
    }

    /// The records in flight whose deadline has passed at `now`, taken back to be handed
    /// out again (each delivery counts as an attempt).
    pub fn expire(&mut self, now: Instant) -> Vec<i64> {
        let mut late = Vec::new();
        while let Some(&(deadline, offset)) = self.deadlines.front() {
            if deadline > now {
                break;
            }
            if !self.live((deadline, offset)) {
                // The front is kept live; should an entry be left behind anyway, it goes
                // rather than taking a record that is not in flight back.
                self.deadlines.pop_front();
                continue;
            }
            self.set_state(
                offset,
                State::Waiting {
                    not_before: None,
                    again: Some(Redelivery::Deadline),
                },
            );
            late.push(offset);
        }
        late.sort_unstable();
        late
    }

    /// When something changes by itself: the earliest deadline in flight or end of a
    /// retry's delay.
    pub fn next_wake(&self) -> Option<Instant> {
        let deadline = self.deadlines.front().map(|&(t, _)| t);
        let delay = self.delayed.first().map(|&(t, _)| t);
        deadline.into_iter().chain(delay).min()
    }
}

/// Whether `state` is in flight until `deadline`.
fn state_is_in_flight_until(state: &State, deadline: Instant) -> bool {
    matches!(state, State::InFlight { deadline: d, .. } if *d == deadline)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// The dispatcher as it was before its indexes: a walk of every record for each
    /// delivery and deadline. The indexed one must choose exactly as it did.
    mod reference {
        use super::super::{Delivery, Order, Window};
        use std::collections::{BTreeMap, BTreeSet, HashMap};
        use std::time::Duration;
        use tokio::time::Instant;

        #[derive(Debug)]
        enum State {
            Waiting { not_before: Option<Instant> },
            InFlight { deadline: Instant },
            Held,
        }

        #[derive(Debug)]
        struct Record {
            key: Option<Vec<u8>>,
            bytes: usize,
            attempts: u32,
            state: State,
        }

        #[derive(Debug)]
        pub(super) struct Reference {
            order: Order,
            window: Window,
            ack_deadline: Duration,
            records: BTreeMap<i64, Record>,
            keys: HashMap<Vec<u8>, BTreeSet<i64>>,
            in_flight: usize,
            in_flight_bytes: usize,
        }

        impl Reference {
            pub(super) fn new(order: Order, window: Window, ack_deadline: Duration) -> Self {
                Reference {
                    order,
                    window,
                    ack_deadline,
                    records: BTreeMap::new(),
                    keys: HashMap::new(),
                    in_flight: 0,
                    in_flight_bytes: 0,
                }
            }

            pub(super) fn offer(
                &mut self,
                offset: i64,
                key: Option<Vec<u8>>,
                bytes: usize,
                attempts: u32,
            ) {
                if self.records.contains_key(&offset) {
                    return;
                }
                if self.order == Order::Key {
                    if let Some(key) = &key {
                        self.keys.entry(key.clone()).or_default().insert(offset);
                    }
                }
                self.records.insert(
                    offset,
                    Record {
                        key,
                        bytes,
                        attempts,
                        state: State::Waiting { not_before: None },
                    },
                );
            }

            pub(super) fn len(&self) -> usize {
                self.records.len()
            }

            pub(super) fn in_flight(&self) -> (usize, usize) {
                (self.in_flight, self.in_flight_bytes)
            }

            fn eligible(&self, offset: i64, record: &Record, now: Instant) -> bool {
                let State::Waiting { not_before } = record.state else {
                    return false;
                };
                if not_before.is_some_and(|t| t > now) {
                    return false;
                }
                match self.order {
                    Order::Unordered => true,
                    Order::Partition => {
                        self.in_flight == 0 && self.records.keys().next() == Some(&offset)
                    }
                    Order::Key => match &record.key {
                        None => true,
                        Some(key) => {
                            self.keys.get(key).and_then(|offsets| offsets.first()) == Some(&offset)
                        }
                    },
                }
            }

            pub(super) fn next_where(
                &mut self,
                now: Instant,
                allowed: impl Fn(i64) -> bool,
            ) -> Option<Delivery> {
                if self.in_flight >= self.window.max_records {
                    return None;
                }
                let room = self.window.max_bytes.saturating_sub(self.in_flight_bytes);
                let offset = self.records.iter().find_map(|(&offset, record)| {
                    let fits = record.bytes <= room || self.in_flight == 0;
                    (fits && allowed(offset) && self.eligible(offset, record, now))
                        .then_some(offset)
                })?;
                let record = self.records.get_mut(&offset)?;
                let deadline = now + self.ack_deadline;
                record.state = State::InFlight { deadline };
                record.attempts = record.attempts.saturating_add(1);
                self.in_flight += 1;
                self.in_flight_bytes += record.bytes;
                Some(Delivery {
                    offset,
                    attempt: record.attempts,
                    deadline,
                    redelivery: None,
                })
            }

            fn land(&mut self, offset: i64) -> Option<&mut Record> {
                let record = self.records.get_mut(&offset)?;
                if let State::InFlight { .. } = record.state {
                    self.in_flight -= 1;
                    self.in_flight_bytes -= record.bytes;
                }
                Some(record)
            }

            pub(super) fn finish(&mut self, offset: i64) -> bool {
                if self.land(offset).is_none() {
                    return false;
                }
                let Some(record) = self.records.remove(&offset) else {
                    return false;
                };
                if let Some(key) = record.key {
                    if let Some(offsets) = self.keys.get_mut(&key) {
                        offsets.remove(&offset);
                        if offsets.is_empty() {
                            self.keys.remove(&key);
                        }
                    }
                }
                true
            }

            pub(super) fn retry(&mut self, offset: i64, not_before: Instant) -> bool {
                if !matches!(
                    self.records.get(&offset).map(|r| &r.state),
                    Some(State::InFlight { .. })
                ) {
                    return false;
                }
                if let Some(record) = self.land(offset) {
                    record.state = State::Waiting {
                        not_before: Some(not_before),
                    };
                }
                true
            }

            pub(super) fn hold(&mut self, offset: i64) -> bool {
                match self.land(offset) {
                    Some(record) => {
                        record.state = State::Held;
                        true
                    }
                    None => false,
                }
            }

            pub(super) fn renew(&mut self, offset: i64, deadline: Instant) -> bool {
                match self.records.get_mut(&offset).map(|r| &mut r.state) {
                    Some(State::InFlight { deadline: d }) => {
                        *d = deadline;
                        true
                    }
                    _ => false,
                }
            }

            pub(super) fn expire(&mut self, now: Instant) -> Vec<i64> {
                let late: Vec<i64> = self
                    .records
                    .iter()
                    .filter(
                        |(_, r)| matches!(r.state, State::InFlight { deadline } if deadline <= now),
                    )
                    .map(|(&offset, _)| offset)
                    .collect();
                for &offset in &late {
                    if let Some(record) = self.land(offset) {
                        record.state = State::Waiting { not_before: None };
                    }
                }
                late
            }

            pub(super) fn next_wake(&self) -> Option<Instant> {
                self.records
                    .values()
                    .filter_map(|r| match r.state {
                        State::InFlight { deadline } => Some(deadline),
                        State::Waiting { not_before } => not_before,
                        State::Held => None,
                    })
                    .min()
            }
        }
    }
    use proptest::prelude::*;

    const WIDE: Window = Window {
        max_records: 64,
        max_bytes: usize::MAX,
    };

    fn key(k: u8) -> Option<Vec<u8>> {
        Some(vec![k])
    }

    #[test]
    fn partition_order_is_one_at_a_time_in_offset_order() {
        let now = Instant::now();
        let mut d = Dispatcher::new(Order::Partition, WIDE, Duration::from_secs(30));
        for offset in 10..13 {
            d.offer(offset, key(1), 10, 0, ());
        }
        let first = d.next(now).expect("the first");
        assert_eq!((first.offset, first.attempt), (10, 1));
        assert_eq!(d.next(now), None, "one at a time");
        assert!(d.retry(10, now + Duration::from_secs(1)));
        assert_eq!(d.next(now), None, "the retried record holds the partition");
        let again = d.next(now + Duration::from_secs(1)).expect("again");
        assert_eq!((again.offset, again.attempt), (10, 2));
        assert!(d.finish(10));
        assert_eq!(d.next(now).map(|d| d.offset), Some(11));
    }

    #[test]
    fn a_poison_record_holds_back_its_key_not_the_others() {
        let now = Instant::now();
        let mut d = Dispatcher::new(Order::Key, WIDE, Duration::from_secs(30));
        d.offer(0, key(1), 10, 0, ());
        d.offer(1, key(2), 10, 0, ());
        d.offer(2, key(1), 10, 0, ());
        d.offer(3, None, 10, 0, ());
        let out: Vec<i64> = std::iter::from_fn(|| d.next(now).map(|d| d.offset)).collect();
        assert_eq!(out, [0, 1, 3], "key 1's second record waits for its first");
        assert!(d.retry(0, now + Duration::from_secs(60)));
        assert!(d.finish(1) && d.finish(3));
        assert_eq!(
            d.next(now),
            None,
            "offset 2 waits behind its key's retried record"
        );
        assert!(d.finish(0));
        assert_eq!(d.next(now).map(|d| d.offset), Some(2));
    }

    #[test]
    fn a_retry_due_behind_a_full_window_wakes_nobody_before_the_window_can_change() {
        let now = Instant::now();
        let window = Window {
            max_records: 1,
            max_bytes: usize::MAX,
        };
        let mut d = Dispatcher::new(Order::Unordered, window, Duration::from_secs(30));
        d.offer(0, None, 1, 0, ());
        d.offer(1, None, 1, 0, ());
        assert_eq!(d.next(now).map(|d| d.offset), Some(0));
        assert!(d.retry(0, now + Duration::from_millis(100)));
        assert_eq!(d.next(now).map(|d| d.offset), Some(1));
        // The retry is due, but the window is full: nothing can go out until offset 1 is
        // answered or its deadline passes, so that is the next wake-up, not the delay's end
        // (which is past, and would make the caller wake again at once, over and over).
        let later = now + Duration::from_millis(200);
        assert_eq!(d.next(later), None);
        assert_eq!(d.next_wake(), Some(now + Duration::from_secs(30)));
        assert!(d.finish(1));
        assert_eq!(d.next(later).map(|d| (d.offset, d.attempt)), Some((0, 2)));
    }

    #[test]
    fn the_window_bounds_records_and_bytes_and_a_large_record_goes_alone() {
        let now = Instant::now();
        let window = Window {
            max_records: 2,
            max_bytes: 100,
        };
        let mut d = Dispatcher::new(Order::Unordered, window, Duration::from_secs(30));
        d.offer(0, None, 60, 0, ());
        d.offer(1, None, 60, 0, ());
        d.offer(2, None, 30, 0, ());
        d.offer(3, None, 500, 0, ());
        assert_eq!(d.next(now).map(|d| d.offset), Some(0));
        assert_eq!(
            d.next(now).map(|d| d.offset),
            Some(2),
            "60 more bytes do not fit"
        );
        assert_eq!(d.next(now), None, "two records in flight");
        d.finish(0);
        d.finish(2);
        assert_eq!(d.next(now).map(|d| d.offset), Some(1));
        assert_eq!(d.next(now), None, "500 bytes wait for an empty window");
        d.finish(1);
        assert_eq!(d.next(now).map(|d| d.offset), Some(3));
    }

    #[test]
    fn a_late_record_is_handed_out_again_with_its_attempt_and_renew_moves_the_deadline() {
        let now = Instant::now();
        let ack = Duration::from_secs(30);
        let mut d = Dispatcher::new(Order::Unordered, WIDE, ack);
        d.offer(7, None, 1, 4, ());
        let first = d.next(now).expect("out");
        assert_eq!((first.attempt, first.deadline), (5, now + ack));
        assert!(d.renew(7, now + 2 * ack));
        assert_eq!(d.expire(now + ack), Vec::<i64>::new());
        assert_eq!(d.next_wake(), Some(now + 2 * ack));
        assert_eq!(d.expire(now + 2 * ack), [7]);
        assert_eq!(d.in_flight(), (0, 0));
        let again = d.next(now + 2 * ack).expect("again");
        assert_eq!((again.offset, again.attempt), (7, 6));
        assert!(!d.retry(8, now) && !d.renew(8, now) && !d.finish(8));
    }

    #[test]
    fn the_dispatcher_keeps_a_records_facts_why_it_goes_out_again_and_why_it_is_held() {
        let now = Instant::now();
        let later = now + Duration::from_secs(1);
        let ack = Duration::from_secs(30);
        let mut d = Dispatcher::new(Order::Unordered, WIDE, ack);
        d.offer(0, None, 10, 0, "zero");
        d.offer(1, None, 20, 0, "one");
        d.offer(2, None, 30, 2, "two, handed over");
        assert_eq!((d.len(), d.held_bytes()), (3, 60));
        let out: Vec<_> = std::iter::from_fn(|| d.next(now))
            .map(|d| (d.offset, d.redelivery))
            .collect();
        assert_eq!(out, [(0, None), (1, None), (2, Some(Redelivery::Handover))]);
        assert_eq!(d.in_flight_of(1), Some((1, now)));
        assert_eq!(d.oldest_in_flight(), Some(now));
        // 0 is retried, 1 passes its deadline, 2 is held for its dead letter.
        assert!(d.retry(0, now));
        d.note_reason(0, "busy");
        assert!(d.hold(2, DeadLetterCause::Rejected));
        d.note_reason(2, "malformed");
        assert_eq!(d.expire(now + ack), [1]);
        let again: Vec<_> = std::iter::from_fn(|| d.next(later))
            .map(|d| (d.offset, d.attempt, d.redelivery))
            .collect();
        assert_eq!(
            again,
            [
                (0, 2, Some(Redelivery::Retried)),
                (1, 2, Some(Redelivery::Deadline))
            ]
        );
        assert_eq!(d.oldest_in_flight(), Some(later));
        let due = d.dead_letter(2).expect("held for its dead letter");
        assert_eq!(
            (*due.body, due.attempts, due.reason, due.cause),
            (
                "two, handed over",
                3,
                Some("malformed"),
                DeadLetterCause::Rejected
            )
        );
        assert!(d.dead_letter(0).is_none(), "in flight, not held");
        assert_eq!(d.body(0), Some(&"zero"));
        assert!(d.finish(2));
        assert_eq!((d.len(), d.held_bytes(), d.body(2)), (2, 30, None));
    }

    #[derive(Debug, Clone)]
    enum Op {
        Next,
        Finish(usize),
        Retry(usize, u64),
        Expire(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => Just(Op::Next),
            3 => (0_usize..64).prop_map(Op::Finish),
            1 => (0_usize..64, 0_u64..3).prop_map(|(i, s)| Op::Retry(i, s)),
            1 => (0_u64..40).prop_map(Op::Expire),
        ]
    }

    #[derive(Debug, Clone)]
    enum Step {
        Next(i64),
        Finish(usize),
        Retry(usize, u64),
        Hold(usize),
        Renew(usize, u64),
        Advance(u64),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            6 => (0_i64..80).prop_map(|l| Step::Next(if l > 60 { i64::MAX } else { l })),
            3 => (0_usize..80).prop_map(Step::Finish),
            1 => (0_usize..80, 0_u64..3).prop_map(|(i, s)| Step::Retry(i, s)),
            1 => (0_usize..80).prop_map(Step::Hold),
            1 => (0_usize..80, 1_u64..30).prop_map(|(i, s)| Step::Renew(i, s)),
            1 => (0_u64..15).prop_map(Step::Advance),
        ]
    }

    proptest! {
        /// The indexed dispatcher makes exactly the choices of the walking one it replaced:
        /// the same deliveries (offset, attempt, deadline), the same answers accepted or
        /// refused, the same records taken back at their deadlines, the same wake-ups.
        #[test]
        fn the_indexes_change_no_choice(
            order in prop_oneof![Just(Order::Partition), Just(Order::Key), Just(Order::Unordered)],
            keys in proptest::collection::vec(proptest::option::of(0_u8..8), 1..60),
            sizes in proptest::collection::vec(1_usize..40, 60),
            steps in proptest::collection::vec(step(), 0..300),
        ) {
            let start = Instant::now();
            let window = Window { max_records: 6, max_bytes: 80 };
            let ack = Duration::from_secs(10);
            let mut new: Dispatcher<()> = Dispatcher::new(order, window, ack);
            let mut old = reference::Reference::new(order, window, ack);
            for (i, k) in keys.iter().enumerate() {
                let attempts = (i % 3) as u32;
                new.offer(i as i64, k.map(|k| vec![k]), sizes[i], attempts, ());
                old.offer(i as i64, k.map(|k| vec![k]), sizes[i], attempts);
            }
            let mut now = start;
            let n = keys.len();
            for step in steps {
                match step {
                    Step::Next(limit) => {
                        // The reference knows nothing of why a record goes out again.
                        let a = new
                            .next_up_to(now, limit)
                            .map(|d| Delivery { redelivery: None, ..d });
                        let b = old.next_where(now, |o| o <= limit);
                        prop_assert_eq!(a, b);
                    }
                    Step::Finish(i) => {
                        let offset = (i % n) as i64;
                        prop_assert_eq!(new.finish(offset), old.finish(offset));
                    }
                    Step::Retry(i, s) => {
                        let (offset, at) = ((i % n) as i64, now + Duration::from_secs(s));
                        prop_assert_eq!(new.retry(offset, at), old.retry(offset, at));
                    }
                    Step::Hold(i) => {
                        let offset = (i % n) as i64;
                        let held = new.hold(offset, DeadLetterCause::MaxDeliveries);
                        prop_assert_eq!(held, old.hold(offset));
                    }
                    Step::Renew(i, s) => {
                        let (offset, at) = ((i % n) as i64, now + Duration::from_secs(s));
                        prop_assert_eq!(new.renew(offset, at), old.renew(offset, at));
                    }
                    Step::Advance(s) => {
                        now += Duration::from_secs(s);
                        prop_assert_eq!(new.expire(now), old.expire(now));
                    }
                }
                prop_assert_eq!(new.in_flight(), old.in_flight());
                // One difference, on purpose: the walking one also woke for the end of a
                // retry's delay that had passed while the record could not go out yet (a
                // full window), so its caller woke again at once, and again, until the
                // window freed. The indexed one wakes for the next thing still to come.
                match (new.next_wake(), old.next_wake()) {
                    (a, Some(b)) if b > now => prop_assert_eq!(a, Some(b)),
                    (Some(a), Some(b)) => prop_assert!(a >= b),
                    (a, b) => prop_assert!(a.is_none() || b.is_some(), "{:?} {:?}", a, b),
                }
                prop_assert_eq!(new.len(), old.len());
            }
        }
    }

    proptest! {
        /// Whatever the answers and the time: the window holds; in Key order a key has at
        /// most one record in flight, and it is the key's lowest offset not done; in
        /// Partition order at most one record is in flight, the lowest not done; and once
        /// every record is answered and time has passed, all are handed out and done.
        #[test]
        fn the_orderings_and_the_window_hold(
            order in prop_oneof![Just(Order::Partition), Just(Order::Key), Just(Order::Unordered)],
            keys in proptest::collection::vec(proptest::option::of(0_u8..6), 1..40),
            ops in proptest::collection::vec(op(), 0..200),
        ) {
            let start = Instant::now();
            let window = Window { max_records: 5, max_bytes: 50 };
            let mut d = Dispatcher::new(order, window, Duration::from_secs(10));
            for (i, k) in keys.iter().enumerate() {
                d.offer(i as i64, k.map(|k| vec![k]), 10, 0, ());
            }
            let mut now = start;
            let mut out: BTreeMap<i64, Option<u8>> = BTreeMap::new();
            let mut done = BTreeSet::new();
            for op in ops {
                match op {
                    Op::Next => {
                        if let Some(delivery) = d.next(now) {
                            prop_assert!(!done.contains(&delivery.offset));
                            out.insert(delivery.offset, keys[delivery.offset as usize]);
                        }
                    }
                    Op::Finish(i) => {
                        if let Some(&offset) = out.keys().nth(i % out.len().max(1)) {
                            prop_assert!(d.finish(offset));
                            out.remove(&offset);
                            done.insert(offset);
                        }
                    }
                    Op::Retry(i, secs) => {
                        if let Some(&offset) = out.keys().nth(i % out.len().max(1)) {
                            prop_assert!(d.retry(offset, now + Duration::from_secs(secs)));
                            out.remove(&offset);
                        }
                    }
                    Op::Expire(secs) => {
                        now += Duration::from_secs(secs);
                        for offset in d.expire(now) {
                            prop_assert!(out.remove(&offset).is_some());
                        }
                    }
                }
                prop_assert!(out.len() <= window.max_records);
                prop_assert_eq!(d.in_flight(), (out.len(), out.len() * 10));
                let lowest_not_done = (0..keys.len() as i64).find(|o| !done.contains(o));
                match order {
                    Order::Partition => {
                        prop_assert!(out.len() <= 1);
                        if let Some(&offset) = out.keys().next() {
                            prop_assert_eq!(Some(offset), lowest_not_done);
                        }
                    }
                    Order::Key => {
                        for (&offset, k) in &out {
                            let Some(k) = k else { continue };
                            let first_of_key = (0..keys.len() as i64)
                                .find(|o| keys[*o as usize] == Some(*k) && !done.contains(o));
                            prop_assert_eq!(Some(offset), first_of_key, "key {}", k);
                        }
                    }
                    Order::Unordered => {}
                }
            }
            // Liveness: answer everything, let time pass, and all get done.
            for offset in std::mem::take(&mut out).into_keys() {
                d.finish(offset);
            }
            now += Duration::from_secs(10);
            while let Some(delivery) = d.next(now) {
                prop_assert!(d.finish(delivery.offset));
            }
            prop_assert!(d.is_empty());
        }
    }
}
