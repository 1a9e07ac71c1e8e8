//! The history indexed once for every check: each lease with its grant, token, calls and
//! end, by partition, and who succeeded whom.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::history::{Event, Op, Outcome};

use super::{Counts, LET_GO};

/// A lease, identified by partition, lease id and token.
#[derive(Debug)]
pub(super) struct Lease<'a> {
    pub(super) id: &'a str,
    pub(super) token: u64,
    /// Its `Acquired` event.
    pub(super) acquired: Option<usize>,
    /// The first event that shows it held the partition: a batch or a call that took effect.
    pub(super) first_seen: Option<usize>,
    /// When it ended: a release that took effect, a `LeaseEnded`, or the grant of a lease
    /// with a greater token, whichever came first.
    pub(super) ended_ms: Option<f64>,
    /// When its client chose to end it: a release that took effect, or a `LeaseEnded` with
    /// one of [`LET_GO`]'s reasons.
    pub(super) chosen_end_ms: Option<f64>,
}

impl Lease<'_> {
    /// The event from which the lease is known to have held its partition.
    pub(super) fn held_from(&self) -> Option<usize> {
        self.acquired.or(self.first_seen)
    }
}

/// For a token, the earliest time a lease with a greater token is known to have held.
#[derive(Debug, Default)]
pub(super) struct Successors {
    pub(super) tokens: Vec<u64>,
    /// For each position in `tokens`, the earliest (time, lease) at or after it.
    pub(super) suffix: Vec<(f64, usize)>,
}

impl Successors {
    pub(super) fn new(mut entries: Vec<(u64, f64, usize)>) -> Successors {
        entries.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
        let mut suffix = Vec::with_capacity(entries.len());
        let mut best: Option<(f64, usize)> = None;
        for &(_, t, lease) in entries.iter().rev() {
            let earliest = match best {
                Some(b) if b.0 <= t => b,
                _ => (t, lease),
            };
            best = Some(earliest);
            suffix.push(earliest);
        }
        suffix.reverse();
        Successors {
            tokens: entries.iter().map(|e| e.0).collect(),
            suffix,
        }
    }

    /// The earliest (time, lease) of a lease with a token greater than `token`.
    pub(super) fn first_above(&self, token: u64) -> Option<(f64, usize)> {
        let i = self.tokens.partition_point(|&t| t <= token);
        self.suffix.get(i).copied()
    }
}

/// What the checker keeps of one partition. Every list is in time order.
#[derive(Debug, Default)]
pub(super) struct Part {
    pub(super) leases: Vec<usize>,
    pub(super) acquired: Vec<usize>,
    pub(super) batches: Vec<usize>,
    pub(super) batch_times: Vec<f64>,
    /// Commits, Seeks and Releases that took effect.
    pub(super) ok_calls: Vec<usize>,
    pub(super) observations: Vec<usize>,
    pub(super) seeks_ok: Vec<usize>,
    pub(super) produced: Vec<usize>,
    /// Offset delivered → the first batch that delivered it.
    pub(super) delivered: BTreeMap<i64, usize>,
    pub(super) deliveries: u64,
    pub(super) final_event: Option<usize>,
    /// Successors by any evidence of holding.
    pub(super) successors: Successors,
    /// Successors by their `Acquired` only.
    pub(super) granted_successors: Successors,
}

/// The history indexed for the checks.
#[derive(Debug, Default)]
pub(super) struct Index<'a> {
    pub(super) counts: Counts,
    pub(super) leases: Vec<Lease<'a>>,
    pub(super) lease_keys: HashMap<(i32, u64), Vec<usize>>,
    pub(super) parts: BTreeMap<i32, Part>,
    /// Commits of any outcome, by (partition, token).
    pub(super) commits: HashMap<(i32, u64), Vec<usize>>,
    /// Seeks that took effect, by (partition, token).
    pub(super) seeks_ok: HashMap<(i32, u64), Vec<usize>>,
    /// Queue-mode answers of any outcome, by (partition, token).
    pub(super) acks: HashMap<(i32, u64), Vec<usize>>,
    /// (partition, offset) → a record of the dead letter topic that came from there.
    pub(super) dead_letters: HashMap<(i32, i64), usize>,
    /// (partition, offset) → the `Produced` event.
    pub(super) produced_at: HashMap<(i32, i64), usize>,
    /// Every value written, acknowledged or not.
    pub(super) values: HashSet<&'a str>,
    pub(super) nemesis: Vec<usize>,
    /// (partition, token, offset) → a commit its gateway reported late.
    pub(super) late_commits: HashMap<(i32, u64, i64), usize>,
}

impl<'a> Index<'a> {
    pub(super) fn part(&mut self, partition: i32) -> &mut Part {
        self.parts.entry(partition).or_default()
    }

    pub(super) fn lease(&mut self, partition: i32, id: &'a str, token: u64) -> usize {
        let ids = self.lease_keys.entry((partition, token)).or_default();
        if let Some(&l) = ids.iter().find(|&&l| self.leases[l].id == id) {
            return l;
        }
        let l = self.leases.len();
        self.leases.push(Lease {
            id,
            token,
            acquired: None,
            first_seen: None,
            ended_ms: None,
            chosen_end_ms: None,
        });
        ids.push(l);
        self.part(partition).leases.push(l);
        l
    }

    pub(super) fn seen(&mut self, partition: i32, id: &'a str, token: u64, event: usize) {
        let l = self.lease(partition, id, token);
        self.leases[l].first_seen.get_or_insert(event);
    }

    pub(super) fn chose_to_end(&mut self, partition: i32, id: &'a str, token: u64, t_ms: f64) {
        let l = self.lease(partition, id, token);
        self.leases[l].chosen_end_ms.get_or_insert(t_ms);
    }

    pub(super) fn ended(&mut self, partition: i32, id: &'a str, token: u64, t_ms: f64) {
        let l = self.lease(partition, id, token);
        self.leases[l].ended_ms.get_or_insert(t_ms);
    }

    /// Takes in one event; events come in time order.
    pub(super) fn add(&mut self, history: &'a [Event], i: usize) {
        let e = &history[i];
        match &e.op {
            Op::Produced {
                partition,
                offset,
                value,
            } => {
                self.counts.produce.ok += 1;
                self.part(*partition).produced.push(i);
                self.produced_at.entry((*partition, *offset)).or_insert(i);
                self.values.insert(value);
            }
            Op::ProduceUnknown { value, .. } => {
                self.counts.produce.unknown += 1;
                self.values.insert(value);
            }
            Op::Acquired {
                lease,
                partition,
                token,
                ..
            } => {
                self.counts.acquire.ok += 1;
                let l = self.lease(*partition, lease, *token);
                self.leases[l].acquired.get_or_insert(i);
                self.part(*partition).acquired.push(i);
            }
            Op::AcquireFailed { outcome, .. } => self.counts.acquire.add(*outcome),
            Op::Batch {
                lease,
                partition,
                token,
                offsets,
                ..
            } => {
                self.seen(*partition, lease, *token, i);
                let part = self.part(*partition);
                part.batches.push(i);
                part.batch_times.push(e.t_ms);
                part.deliveries += offsets.len() as u64;
                for &offset in offsets {
                    part.delivered.entry(offset).or_insert(i);
                }
            }
            Op::Commit {
                lease,
                partition,
                token,
                outcome,
                ..
            } => {
                self.counts.commit.add(*outcome);
                self.commits
                    .entry((*partition, *token))
                    .or_default()
                    .push(i);
                if *outcome == Outcome::Ok {
                    self.seen(*partition, lease, *token, i);
                    self.part(*partition).ok_calls.push(i);
                }
            }
            Op::Seek {
                lease,
                partition,
                token,
                outcome,
                ..
            } => {
                self.counts.seek.add(*outcome);
                if *outcome == Outcome::Ok {
                    self.seen(*partition, lease, *token, i);
                    self.seeks_ok
                        .entry((*partition, *token))
                        .or_default()
                        .push(i);
                    let part = self.part(*partition);
                    part.ok_calls.push(i);
                    part.seeks_ok.push(i);
                }
            }
            Op::Release {
                lease,
                partition,
                token,
                outcome,
                ..
            } => {
                self.counts.release.add(*outcome);
                if *outcome == Outcome::Ok {
                    self.seen(*partition, lease, *token, i);
                    self.ended(*partition, lease, *token, e.t_ms);
                    self.chose_to_end(*partition, lease, *token, e.t_ms);
                    self.part(*partition).ok_calls.push(i);
                }
            }
            Op::LeaseEnded {
                lease,
                partition,
                token,
                reason,
            } => {
                self.ended(*partition, lease, *token, e.t_ms);
                if LET_GO.contains(&reason.as_str()) {
                    self.chose_to_end(*partition, lease, *token, e.t_ms);
                }
            }
            Op::Ack {
                lease,
                partition,
                token,
                outcome,
                ..
            } => {
                self.counts.ack.add(*outcome);
                self.acks.entry((*partition, *token)).or_default().push(i);
                if *outcome == Outcome::Ok {
                    self.seen(*partition, lease, *token, i);
                    self.part(*partition).ok_calls.push(i);
                }
            }
            Op::DeadLetter {
                partition, offset, ..
            } => {
                self.dead_letters.entry((*partition, *offset)).or_insert(i);
            }
            Op::Committed { partition, .. } => self.part(*partition).observations.push(i),
            Op::Nemesis { .. } => self.nemesis.push(i),
            Op::LateCommit {
                partition,
                token,
                offset,
            } => {
                self.late_commits
                    .entry((*partition, *token, *offset))
                    .or_insert(i);
            }
            Op::Final { partition, .. } => self.part(*partition).final_event = Some(i),
        }
    }

    /// Builds what needs every event: the successors of each token, and the end of each
    /// lease by the grant of a greater one.
    pub(super) fn finish(&mut self, history: &[Event]) {
        for part in self.parts.values_mut() {
            let mut held = Vec::new();
            let mut granted = Vec::new();
            for &l in &part.leases {
                let lease = &self.leases[l];
                if let Some(from) = lease.held_from() {
                    held.push((lease.token, history[from].t_ms, l));
                }
                if let Some(a) = lease.acquired {
                    granted.push((lease.token, history[a].t_ms, l));
                }
            }
            part.successors = Successors::new(held);
            part.granted_successors = Successors::new(granted);
            for &l in &part.leases {
                let lease = &mut self.leases[l];
                if let Some((t, _)) = part.granted_successors.first_above(lease.token) {
                    lease.ended_ms = Some(lease.ended_ms.map_or(t, |e| e.min(t)));
                }
            }
        }
    }
}
