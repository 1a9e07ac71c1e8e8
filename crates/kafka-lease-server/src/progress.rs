//! A queue-mode lease's progress as its commit carries it (issue 28, the first piece): the
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
    pub fn mark_done(&mut self, offset: i64) {
        if self.is_done(offset) {
            return;
        }
        self.change_attempts(offset, |attempts| {
            attempts.remove(&offset);
        });
        // The runs whose encoding can change: from the one below `offset` to the first one
        // beyond the run `offset` may join; and the first attempt, should the base move.
        let low = self
            .done
            .range(..offset)
            .next_back()
            .map_or(offset, |(&s, _)| s);
        let high = self
            .done
            .range(offset.saturating_add(2)..)
            .next()
            .map_or(i64::MAX, |(&s, _)| s);
        let before = self.runs_bytes(low, high) + self.first_attempt_bytes();
        self.join_done(offset);
        let after = self.runs_bytes(low, high) + self.first_attempt_bytes();
        self.entry_bytes = self.entry_bytes + after - before;
    }

    /// Puts `offset` (not done) into the runs, or moves the base past it.
    fn join_done(&mut self, offset: i64) {
        let (mut start, mut end) = (offset, offset + 1);
        // Join the run that ends right at `offset`, and the one that starts right after it.
        if let Some((&s, &e)) = self.done.range(..offset).next_back() {
            if e == offset {
                self.done.remove(&s);
                start = s;
            }
        }
        if let Some(e) = self.done.remove(&end) {
            end = e;
        }
        if start == self.base {
            self.base = end;
        } else {
            self.done.insert(start, end);
        }
    }

    /// Notes one more delivery of `offset`; returns the count so far (0 for a record that is
    /// done, which is never delivered again).
    pub fn delivered(&mut self, offset: i64) -> u32 {
        if self.is_done(offset) {
            return 0;
        }
        let mut count = 0;
        self.change_attempts(offset, |attempts| {
            let entry = attempts.entry(offset).or_insert(0);
            *entry = entry.saturating_add(1);
            count = *entry;
        });
        count
    }

    /// Changes the attempts at `offset` (the base unchanged), keeping `entry_bytes`: only
    /// the entry at `offset` and the one after it encode differently.
    fn change_attempts(&mut self, offset: i64, change: impl FnOnce(&mut BTreeMap<i64, u32>)) {
        let next = self
            .attempts
            .range(offset.saturating_add(1)..)
            .next()
            .map(|(&o, _)| o);
        let cost = |p: &Progress| p.attempt_bytes(offset) + next.map_or(0, |n| p.attempt_bytes(n));
        let before = cost(self);
        change(&mut self.attempts);
        let after = cost(self);
        self.entry_bytes = self.entry_bytes + after - before;
    }

    /// The bytes of the attempts entry at `offset` (0 if there is none).
    fn attempt_bytes(&self, offset: i64) -> usize {
        let Some(&count) = self.attempts.get(&offset) else {
            return 0;
        };
        let previous = self
            .attempts
            .range(..offset)
            .next_back()
            .map_or(self.base, |(&o, _)| o);
        varint_len((offset - previous) as u64) + varint_len(u64::from(count))
    }

    fn first_attempt_bytes(&self) -> usize {
        self.attempts
            .keys()
            .next()
            .map_or(0, |&first| self.attempt_bytes(first))
    }

    /// The bytes of the runs starting in `low ..= high`.
    fn runs_bytes(&self, low: i64, high: i64) -> usize {
        let mut previous_end = self
            .done
            .range(..low)
            .next_back()
            .map_or(self.base + 1, |(_, &e)| e + 1);
        let mut bytes = 0;
        for (&start, &end) in self.done.range(low..=high) {
            bytes +=
                varint_len((start - previous_end) as u64) + varint_len((end - start - 1) as u64);
            previous_end = end + 1;
        }
        bytes
    }

    /// `entry_bytes` counted afresh.
    fn count_entry_bytes(&self) -> usize {
        self.runs_bytes(i64::MIN, i64::MAX)
            + self
                .attempts
                .keys()
                .map(|&o| self.attempt_bytes(o))
                .sum::<usize>()
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
        /// Whatever is done and retried, in whatever order: decoding the encoding gives the
        /// same progress; its length is what `encoded_len` says; and what is done is exactly
        /// what was marked done.
        #[test]
        fn encoding_round_trips(
            base in 0_i64..1_000_000_000_000,
            marks in proptest::collection::vec(0_i64..3_000, 0..400),
            retried in proptest::collection::vec((0_i64..3_000, 1_u32..20), 0..40),
        ) {
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
