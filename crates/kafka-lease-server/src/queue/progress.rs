//! A queue-mode lease's progress as its commit carries it: the
//! committed offset is the lowest record not done, and the records done above it and the
//! attempt counts of records delivered without success travel in the commit's metadata, so
//! that the next holder skips what is done and delivers the rest with their attempts.
//!
//! The metadata is `kafka-lease token=<token>;q1=<payload>`: the payload is base64url (no
//! padding) of varints. Done offsets above the base are kept as ranges, each written as its
//! gap from the end of the previous one and its length; attempts as offset deltas and counts.
//! So its size grows with the number of *gaps* above the base (and of records retried), not
//! with the number of records done: ten thousand records done in order past one stuck record
//! cost a few bytes. The broker refuses metadata longer than `offset.metadata.max.bytes`
//! (4,096 by default), so [`Progress::encoded_len`] is what the delivery side holds under
//! [`METADATA_BUDGET`] before it hands out records further above the base.

use std::collections::BTreeMap;
use std::ops::Range;

/// The broker's default `offset.metadata.max.bytes`.
pub const BROKER_METADATA_MAX_BYTES: usize = 4096;

/// What the progress may take of the metadata: the broker's default less room for the
/// `kafka-lease token=<u64>;` prefix (at most 39 bytes) and a margin.
pub const METADATA_BUDGET: usize = BROKER_METADATA_MAX_BYTES - 96;

/// The tag of the progress part of the metadata, with its format's version.
const TAG: &str = "q1=";

/// Which records of a partition are done, from `base` (the lowest offset not done, which is
/// the committed offset) up, and how often the records not done have been delivered.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    base: i64,
    /// Start → end (exclusive) of each run of done offsets above `base`; disjoint, not
    /// adjacent, each starting above `base`.
    done: BTreeMap<i64, i64>,
    /// Offset (≥ `base`, not done) → deliveries so far.
    attempts: BTreeMap<i64, u32>,
    /// The bytes the runs and the attempts take in the encoding (without the two counts in
    /// front of them), kept up to date by every change: a queue asks for the length before
    /// each delivery, and counting it afresh would cost a walk of every record in flight.
    entry_bytes: usize,
}

/// Why a metadata string holds no usable progress.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProgressError {
    #[error("the progress is not base64url: {0}")]
    NotBase64(String),
    #[error("the progress ends inside a number")]
    Truncated,
    #[error("the progress has {0} bytes after its end")]
    Trailing(usize),
    #[error("the progress names an offset beyond i64")]
    OutOfRange,
}

impl Progress {
    /// Nothing done at or above `base`.
    pub fn new(base: i64) -> Self {
        Progress {
            base,
            ..Progress::default()
        }
    }

    /// The lowest offset not done: what the commit stores as the group's offset.
    pub fn base(&self) -> i64 {
        self.base
    }

    /// Whether `offset` is done (everything below the base is).
    pub fn is_done(&self, offset: i64) -> bool {
        offset < self.base
            || self
                .done
                .range(..=offset)
                .next_back()
                .is_some_and(|(_, &end)| offset < end)
    }

    /// Marks `offset` done; the base moves past it and every done offset right above it.
    ///
    /// The encoding's length changes only where `offset` sits: its attempts entry goes (and
    /// the next entry's delta with it), the run below it or above it grows (or a run of its
    /// own appears, or the two merge), the first run above changes its gap, and, should the
    /// base move, the first attempts entry its delta. Each is counted from a few lookups.
    pub fn mark_done(&mut self, offset: i64) {
        if offset < self.base {
            return;
        }
        let below = self
            .done
            .range(..=offset)
            .next_back()
            .map(|(&s, &e)| (s, e));
        if below.is_some_and(|(_, e)| offset < e) {
            return;
        }
        self.remove_attempt(offset);
        let next = self
            .done
            .range(offset.saturating_add(1)..)
            .next()
            .map(|(&s, &e)| (s, e));
        let joins_above = next.filter(|&(s, _)| s == offset + 1);
        let old_base = self.base;
        // Bytes the change adds and takes away (apart, so that none goes below zero).
        let (mut add, mut sub) = (0, 0);
        if offset == self.base {
            match joins_above {
                // The run right above goes into the base.
                Some((s, e)) => {
                    sub += run_bytes(self.base + 1, s, e);
                    self.done.remove(&s);
                    self.base = e;
                }
                // The base moves by one: the first run's gap shrinks.
                None => {
                    if let Some((s, e)) = next {
                        sub += run_bytes(offset + 1, s, e);
                        add += run_bytes(offset + 2, s, e);
                    }
                    self.base = offset + 1;
                }
            }
        } else {
            // Where the gap before `offset` starts counting: past the run below, or the base.
            let from = below.map_or(self.base + 1, |(_, e)| e + 1);
            match (below.filter(|&(_, e)| e == offset), joins_above) {
                // A run of its own; the next run's gap shrinks.
                (None, None) => {
                    add += run_bytes(from, offset, offset + 1);
                    if let Some((s, e)) = next {
                        sub += run_bytes(from, s, e);
                        add += run_bytes(offset + 2, s, e);
                    }
                    self.done.insert(offset, offset + 1);
                }
                // The run below grows by one; the next run's gap shrinks.
                (Some((ps, _)), None) => {
                    sub += varint_len((offset - ps - 1) as u64);
                    add += varint_len((offset - ps) as u64);
                    if let Some((s, e)) = next {
                        sub += run_bytes(offset + 1, s, e);
                        add += run_bytes(offset + 2, s, e);
                    }
                    self.done.insert(ps, offset + 1);
                }
                // The run above starts one lower.
                (None, Some((s, e))) => {
                    sub += run_bytes(from, s, e);
                    add += run_bytes(from, offset, e);
                    self.done.remove(&s);
                    self.done.insert(offset, e);
                }
                // The runs below and above become one.
                (Some((ps, _)), Some((s, e))) => {
                    sub += varint_len((offset - ps - 1) as u64) + run_bytes(offset + 1, s, e);
                    add += varint_len((e - ps - 1) as u64);
                    self.done.remove(&s);
                    self.done.insert(ps, e);
                }
            }
        }
        if self.base != old_base {
            if let Some((&first, _)) = self.attempts.first_key_value() {
                sub += varint_len((first - old_base) as u64);
                add += varint_len((first - self.base) as u64);
            }
        }
        self.entry_bytes = self.entry_bytes + add - sub;
    }

    /// Marks every offset of `range` done at once: offsets that hold no record this reader
    /// can see (a transaction's marker, a record of an aborted transaction, one compacted or
    /// deleted away), found as the gap between two records fetched one after the other.
    /// Done as if each were delivered and accepted, so that the base passes them; the same
    /// as [`Progress::mark_done`] on each, in one step however long the gap.
    pub fn mark_absent(&mut self, range: Range<i64>) {
        let (mut start, mut end) = (range.start.max(self.base), range.end);
        if start >= end {
            return;
        }
        // Attempts of offsets in the gap (a record that was there for an earlier holder).
        let stale: Vec<i64> = self.attempts.range(start..end).map(|(&o, _)| o).collect();
        for offset in stale {
            self.attempts.remove(&offset);
        }
        // Runs that overlap or touch the gap join it.
        if let Some((&s, &e)) = self.done.range(..=start).next_back() {
            if e >= start {
                self.done.remove(&s);
                start = s;
                end = end.max(e);
            }
        }
        let joined: Vec<(i64, i64)> = self
            .done
            .range(start..=end)
            .map(|(&s, &e)| (s, e))
            .collect();
        for (s, e) in joined {
            self.done.remove(&s);
            end = end.max(e);
        }
        if start == self.base {
            self.base = end;
        } else {
            self.done.insert(start, end);
        }
        self.entry_bytes = self.count_entry_bytes();
    }

    /// Takes `offset`'s attempts entry out, if it has one (the base unchanged).
    fn remove_attempt(&mut self, offset: i64) {
        let Some(count) = self.attempts.remove(&offset) else {
            return;
        };
        let previous = self
            .attempts
            .range(..offset)
            .next_back()
            .map_or(self.base, |(&o, _)| o);
        let mut sub = varint_len((offset - previous) as u64) + varint_len(u64::from(count));
        let mut add = 0;
        if let Some((&next, _)) = self.attempts.range(offset.saturating_add(1)..).next() {
            sub += varint_len((next - offset) as u64);
            add += varint_len((next - previous) as u64);
        }
        self.entry_bytes = self.entry_bytes + add - sub;
    }

    /// Notes one more delivery of `offset`; returns the count so far (0 for a record that is
    /// done, which is never delivered again).
    pub fn delivered(&mut self, offset: i64) -> u32 {
        if self.is_done(offset) {
            return 0;
        }
        let below = self
            .attempts
            .range_mut(..=offset)
            .next_back()
            .map(|(&o, count)| (o, count));
        match below {
            Some((o, count)) if o == offset => {
                let old = *count;
                *count = old.saturating_add(1);
                let new = *count;
                self.entry_bytes =
                    self.entry_bytes + varint_len(u64::from(new)) - varint_len(u64::from(old));
                new
            }
            below => {
                // A new entry between the one below (or the base) and the next: the next's
                // delta shrinks.
                let previous = below.map_or(self.base, |(o, _)| o);
                let mut add = varint_len((offset - previous) as u64) + varint_len(1);
                let mut sub = 0;
                if let Some((&next, _)) = self.attempts.range(offset.saturating_add(1)..).next() {
                    sub += varint_len((next - previous) as u64);
                    add += varint_len((next - offset) as u64);
                }
                self.entry_bytes = self.entry_bytes + add - sub;
                self.attempts.insert(offset, 1);
                1
            }
        }
    }

    /// `entry_bytes` counted afresh: a walk of every run and attempts entry.
    fn count_entry_bytes(&self) -> usize {
        let mut bytes = 0;
        let mut from = self.base + 1;
        for (&start, &end) in &self.done {
            bytes += run_bytes(from, start, end);
            from = end + 1;
        }
        let mut previous = self.base;
        for (&offset, &count) in &self.attempts {
            bytes += varint_len((offset - previous) as u64) + varint_len(u64::from(count));
            previous = offset;
        }
        bytes
    }

    /// How often `offset` has been delivered (0 for one never delivered, or done).
    pub fn attempts(&self, offset: i64) -> u32 {
        self.attempts.get(&offset).copied().unwrap_or(0)
    }

    /// The runs of done offsets above the base.
    pub fn done_ranges(&self) -> impl Iterator<Item = Range<i64>> + '_ {
        self.done.iter().map(|(&start, &end)| start..end)
    }

    /// The highest offset done, if any is above the base.
    pub fn highest_done(&self) -> Option<i64> {
        self.done.values().next_back().map(|end| end - 1)
    }

    /// The progress part of the commit metadata, `q1=<payload>`.
    pub fn encode(&self) -> String {
        let mut bytes = Vec::new();
        put(&mut bytes, self.done.len() as u64);
        let mut previous_end = self.base + 1;
        for (&start, &end) in &self.done {
            // A run starts above the base, and at least one offset after the previous run.
            put(&mut bytes, (start - previous_end) as u64);
            put(&mut bytes, (end - start - 1) as u64);
            previous_end = end + 1;
        }
        put(&mut bytes, self.attempts.len() as u64);
        let mut previous = self.base;
        for (&offset, &count) in &self.attempts {
            put(&mut bytes, (offset - previous) as u64);
            put(&mut bytes, u64::from(count));
            previous = offset;
        }
        format!("{TAG}{}", base64url(&bytes))
    }

    /// The length of [`Progress::encode`], without making it.
    pub fn encoded_len(&self) -> usize {
        let bytes = varint_len(self.done.len() as u64)
            + varint_len(self.attempts.len() as u64)
            + self.entry_bytes;
        TAG.len() + (bytes * 4).div_ceil(3)
    }

    /// The progress a commit of `base` stored with `metadata`: nothing done above the base
    /// when the metadata has no progress part (a commit outside queue mode).
    pub fn from_metadata(base: i64, metadata: &str) -> Result<Progress, ProgressError> {
        let Some(payload) = metadata.split(';').find_map(|part| part.strip_prefix(TAG)) else {
            return Ok(Progress::new(base));
        };
        let bytes = from_base64url(payload)?;
        let mut reader = Reader {
            bytes: &bytes,
            at: 0,
        };
        let mut progress = Progress::new(base);
        let runs = reader.next()?;
        let mut previous_end = base.checked_add(1).ok_or(ProgressError::OutOfRange)?;
        for _ in 0..runs {
            let start = offset_after(previous_end, reader.next()?)?;
            let end = offset_after(start, reader.next()?)?
                .checked_add(1)
                .ok_or(ProgressError::OutOfRange)?;
            progress.done.insert(start, end);
            previous_end = end.checked_add(1).ok_or(ProgressError::OutOfRange)?;
        }
        let retried = reader.next()?;
        let mut previous = base;
        for _ in 0..retried {
            let offset = offset_after(previous, reader.next()?)?;
            let count = u32::try_from(reader.next()?).unwrap_or(u32::MAX);
            progress.attempts.insert(offset, count);
            previous = offset;
        }
        progress.entry_bytes = progress.count_entry_bytes();
        match bytes.len() - reader.at {
            0 => Ok(progress),
            left => Err(ProgressError::Trailing(left)),
        }
    }
}

fn offset_after(from: i64, delta: u64) -> Result<i64, ProgressError> {
    i64::try_from(delta)
        .ok()
        .and_then(|delta| from.checked_add(delta))
        .ok_or(ProgressError::OutOfRange)
}

fn put(bytes: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        bytes.push((value as u8) | 0x80);
        value >>= 7;
    }
    bytes.push(value as u8);
}

/// The bytes of the run `start..end` in the encoding, the previous run ending (or the base
/// sitting) right before `from`.
fn run_bytes(from: i64, start: i64, end: i64) -> usize {
    varint_len((start - from) as u64) + varint_len((end - start - 1) as u64)
}

fn varint_len(value: u64) -> usize {
    (64 - value.max(1).leading_zeros() as usize).div_ceil(7)
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn next(&mut self) -> Result<u64, ProgressError> {
        let mut value = 0_u64;
        for shift in (0..64).step_by(7) {
            let byte = *self.bytes.get(self.at).ok_or(ProgressError::Truncated)?;
            self.at += 1;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(ProgressError::OutOfRange)
    }
}

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

fn base64url(bytes: &[u8]) -> String {
    let mut out = String::with_capacity((bytes.len() * 4).div_ceil(3));
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0_u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            out.push(ALPHABET[(n >> (18 - 6 * i)) as usize & 63] as char);
        }
    }
    out
}

fn from_base64url(text: &str) -> Result<Vec<u8>, ProgressError> {
    let bad = || ProgressError::NotBase64(text.chars().take(16).collect());
    let digits: Vec<u32> = text
        .bytes()
        .map(|c| {
            ALPHABET
                .iter()
                .position(|&a| a == c)
                .map(|p| p as u32)
                .ok_or_else(bad)
        })
        .collect::<Result<_, _>>()?;
    if digits.len() % 4 == 1 {
        return Err(bad());
    }
    let mut out = Vec::with_capacity(digits.len() * 3 / 4);
    for chunk in digits.chunks(4) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0_u32, |n, (i, &d)| n | d << (18 - 6 * i));
        for i in 0..chunk.len() - 1 {
            out.push((n >> (16 - 8 * i)) as u8);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    #[test]
    fn the_base_moves_past_every_done_record_right_above_it() {
        let mut p = Progress::new(100);
        p.mark_done(102);
        p.mark_done(103);
        p.mark_done(105);
        assert_eq!(p.base(), 100);
        assert_eq!(p.done_ranges().collect::<Vec<_>>(), [102..104, 105..106]);
        p.mark_done(101);
        assert_eq!(p.base(), 100);
        assert_eq!(p.done_ranges().collect::<Vec<_>>(), [101..104, 105..106]);
        p.mark_done(100);
        assert_eq!(p.base(), 104);
        assert_eq!(
            p.done_ranges().collect::<Vec<_>>(),
            vec![Range {
                start: 105,
                end: 106
            }]
        );
        assert!(p.is_done(103) && !p.is_done(104) && p.is_done(105));
        p.mark_done(104);
        assert_eq!((p.base(), p.done_ranges().count()), (106, 0));
    }

    #[test]
    fn attempts_are_kept_until_the_record_is_done() {
        let mut p = Progress::new(0);
        assert_eq!(p.delivered(3), 1);
        assert_eq!(p.delivered(3), 2);
        p.mark_done(5);
        let again = Progress::from_metadata(0, &format!("kafka-lease token=9;{}", p.encode()))
            .expect("decodes");
        assert_eq!(again, p);
        assert_eq!(again.attempts(3), 2);
        p.mark_done(3);
        assert_eq!(p.attempts(3), 0);
        // A done record is not delivered again, and counts nothing (nor below the base).
        assert_eq!((p.delivered(3), p.delivered(5)), (0, 0));
        assert_eq!(Progress::from_metadata(0, &p.encode()), Ok(p));
    }

    #[test]
    fn many_records_done_past_one_stuck_record_cost_a_few_bytes() {
        let mut p = Progress::new(1_000_000);
        p.delivered(1_000_000);
        for offset in 1_000_001..1_010_001 {
            p.mark_done(offset);
        }
        assert_eq!(p.done_ranges().count(), 1);
        assert!(p.encoded_len() < 24, "{}", p.encode());
    }

    #[test]
    fn each_record_in_flight_costs_about_three_characters() {
        // A first delivery's attempt count is an entry: a delta and a count, a byte each, so
        // a thousand records in flight take two thirds of the budget, and the brake (at 3/4
        // of it) holds a window at about 1,100 records in flight.
        let mut p = Progress::new(0);
        for offset in 0..1_000 {
            p.delivered(offset);
        }
        // No runs (1 byte), a thousand entries (2 bytes), each entry 2 bytes; in base64.
        let raw: usize = 1 + 2 + 1_000 * 2;
        assert_eq!(p.encoded_len(), "q1=".len() + (raw * 4).div_ceil(3));
        assert!(p.encoded_len() * 4 < METADATA_BUDGET * 3);
    }

    #[test]
    fn the_budget_holds_some_hundreds_of_gaps() {
        // Every other record done: the worst case for runs, each gap and length one byte.
        let mut p = Progress::new(0);
        for offset in (1..2_000).step_by(2) {
            p.mark_done(offset);
        }
        assert_eq!(p.done_ranges().count(), 1_000);
        assert!(p.encoded_len() <= METADATA_BUDGET, "{}", p.encoded_len());
        assert!(
            p.encoded_len() + "kafka-lease token=18446744073709551615;".len()
                <= BROKER_METADATA_MAX_BYTES
        );
    }

    #[test]
    fn metadata_without_progress_is_nothing_done_and_garbage_is_refused() {
        assert_eq!(
            Progress::from_metadata(7, "kafka-lease token=3;user text"),
            Ok(Progress::new(7))
        );
        assert!(matches!(
            Progress::from_metadata(7, "kafka-lease token=3;q1=!!"),
            Err(ProgressError::NotBase64(_))
        ));
        assert_eq!(
            Progress::from_metadata(7, "kafka-lease token=3;q1=gA"),
            Err(ProgressError::Truncated)
        );
        assert_eq!(
            Progress::from_metadata(7, "kafka-lease token=3;q1=AAAA"),
            Err(ProgressError::Trailing(1))
        );
    }

    proptest! {
        /// A gap marked absent at once leaves the progress exactly as marking each of its
        /// offsets done would, wherever it falls among the runs, the attempts and the base.
        #[test]
        fn a_gap_marked_absent_is_each_of_its_offsets_marked_done(
            marks in proptest::collection::vec(0_i64..200, 0..60),
            retried in proptest::collection::vec(0_i64..200, 0..20),
            gap in (0_i64..200, 0_i64..60),
        ) {
            let mut one_step = Progress::new(10);
            for offset in &retried {
                one_step.delivered(10 + offset);
            }
            for offset in &marks {
                one_step.mark_done(10 + offset);
            }
            let mut each = one_step.clone();
            let range = 10 + gap.0..10 + gap.0 + gap.1;
            one_step.mark_absent(range.clone());
            for offset in range {
                each.mark_done(offset);
            }
            prop_assert_eq!(&one_step, &each);
            prop_assert_eq!(one_step.entry_bytes, one_step.count_entry_bytes());
        }

        /// Whatever is done and retried, in whatever order: decoding the encoding gives the
        /// same progress; its length is what `encoded_len` says; and what is done is exactly
        /// what was marked done.
        #[test]
        fn encoding_round_trips(
            base in 0_i64..1_000_000_000_000,
            marks in proptest::collection::vec(0_i64..3_000, 0..400),
            retried in proptest::collection::vec((0_i64..3_000, 1_u32..20), 0..40),
            // Some runs crowd the marks into a short span, where runs join and the base moves.
            span in prop_oneof![Just(3_000_i64), 20_i64..400],
        ) {
            let marks: Vec<i64> = marks.iter().map(|offset| offset % span).collect();
            let mut p = Progress::new(base);
            for (offset, times) in &retried {
                for _ in 0..*times {
                    p.delivered(base + offset);
                    prop_assert_eq!(p.entry_bytes, p.count_entry_bytes());
                }
            }
            for (i, offset) in marks.iter().enumerate() {
                p.mark_done(base + offset);
                prop_assert_eq!(p.entry_bytes, p.count_entry_bytes());
                // Deliveries between the marks, as a queue makes them.
                p.delivered(base + (offset * 7 + i as i64) % 3_000);
                prop_assert_eq!(p.entry_bytes, p.count_entry_bytes());
            }
            let metadata = format!("kafka-lease token=42;{}", p.encode());
            let decoded = Progress::from_metadata(p.base(), &metadata).expect("decodes");
            prop_assert_eq!(&decoded, &p);
            prop_assert_eq!(p.encode().len(), p.encoded_len());
            let marked: BTreeSet<i64> = marks.iter().map(|o| base + o).collect();
            for offset in base..base + 3_000 {
                prop_assert_eq!(p.is_done(offset), marked.contains(&offset), "offset {}", offset);
            }
        }
    }
}
