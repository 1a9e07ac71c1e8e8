//! The checker: judges a run's history and measures what its faults did.
//!
//! It checks what kafka-lease promises under faults. A partition has one holder at a time: once
//! a lease with a greater fencing token has been granted, an older lease's calls must fail.
//! Tokens rise in real-time order, so a grant that follows another carries a greater token.
//! The group's committed offset, as Kafka shows it, never goes back unless a Seek asked for it,
//! and its token never goes back at all. Every acknowledged record below the final committed
//! offset reached some client, with the value it was produced with. Beside the verdict it
//! counts the calls by outcome, sums up deliveries, and measures each fault: how long the
//! partitions its target served took to be read again under a new lease (failover), and the
//! longest pause in deliveries during its window.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::fmt::{self, Write as _};

use serde::Serialize;

use crate::history::{Event, Op, Outcome, Phase};

/// At most this many anomalies of one kind on one partition are listed in a report; the last
/// one listed says how many there were (the report's `anomaly_totals` keeps the exact count).
pub const LISTED_PER_PARTITION: usize = 20;

/// At most this many events in an anomaly's excerpt.
pub const EXCERPT_LEN: usize = 8;

/// The reasons of a `LeaseEnded` that say the client chose to end the lease (went quiet on
/// purpose, stalled on purpose, or left the group), as the workload writes them.
pub const LET_GO: &[&str] = &[
    crate::history::ABANDONED,
    crate::history::STALLED,
    crate::history::MEMBER_LEFT,
];

/// A fault that was never stopped is taken to last this long when measuring the gap in
/// deliveries during it.
pub const OPEN_FAULT_WINDOW_MS: f64 = 30_000.0;

/// What the checker found in a history.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Events in the history.
    pub events: usize,
    /// Calls by kind and outcome.
    pub counts: Counts,
    /// How many anomalies of each kind were found (only the kinds found), exactly.
    pub anomaly_totals: Vec<AnomalyTotal>,
    /// The anomalies, by kind, then partition, then time; at most [`LISTED_PER_PARTITION`] of
    /// one kind on one partition.
    pub anomalies: Vec<Anomaly>,
    /// What was produced and delivered.
    pub delivery: Delivery,
    /// The faults, in the order they began.
    pub faults: Vec<Fault>,
    /// The faults summed up by name.
    pub fault_kinds: Vec<FaultKindSummary>,
    /// Commits their gateway reported late (answered after the lease's fence deadline), and
    /// the regressions of the committed offset they explain: the commit gate's documented
    /// limit (docs/ARCHITECTURE.md), shown, not counted as anomalies. A regression no such
    /// report explains is an anomaly.
    pub late_commits: Vec<LateCommit>,
}

/// A commit its gateway reported late, and what the observer saw of it.
#[derive(Debug, Clone, Serialize)]
pub struct LateCommit {
    /// Its partition.
    pub partition: i32,
    /// Its lease's token.
    pub token: u64,
    /// The offset it committed.
    pub offset: i64,
    /// The gateway that reported it.
    pub gateway: String,
    /// The regressions of the committed token or offset it explains, one sentence each.
    pub explains: Vec<String>,
    /// The events that show it: the gateway's report, and the readings of each regression.
    pub excerpt: Vec<Event>,
}

impl Report {
    /// Whether the history showed no anomaly.
    pub fn valid(&self) -> bool {
        self.anomalies.is_empty()
    }

    /// The number of anomalies found, including those not listed.
    pub fn anomaly_count(&self) -> u64 {
        self.anomaly_totals.iter().map(|t| t.count).sum()
    }
}

/// How many calls of one kind ended each way.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct OutcomeCounts {
    /// Took effect.
    pub ok: u64,
    /// Did not take effect.
    pub failed: u64,
    /// May or may not have taken effect.
    pub unknown: u64,
}

impl OutcomeCounts {
    fn add(&mut self, outcome: Outcome) {
        match outcome {
            Outcome::Ok => self.ok += 1,
            Outcome::Failed => self.failed += 1,
            Outcome::Unknown => self.unknown += 1,
        }
    }
}

/// Calls by kind and outcome. An `Acquired` is an ok acquire; a `Produced` an ok produce and a
/// `ProduceUnknown` an unknown one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    /// Acquire calls.
    pub acquire: OutcomeCounts,
    /// Commit calls.
    pub commit: OutcomeCounts,
    /// Seek calls.
    pub seek: OutcomeCounts,
    /// Release calls.
    pub release: OutcomeCounts,
    /// Queue-mode answers (Acknowledge), one per delivery answered.
    pub ack: OutcomeCounts,
    /// The producer's writes.
    pub produce: OutcomeCounts,
}

/// The kinds of anomaly the checker looks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AnomalyKind {
    /// A lease's call took effect after a lease with a greater token had been granted.
    StaleHolder,
    /// Two leases granted with one token, or a later grant with a token not greater.
    OverlappingGrant,
    /// The token on the group's committed offset went back.
    TokenRegression,
    /// The group's committed offset went back with no Seek to explain it.
    CommitRegression,
    /// An acknowledged record below the committed offset that no batch delivered.
    LostRecord,
    /// A batch delivered a value other than the one produced at its offset.
    WrongValue,
    /// A batch delivered a value that was never produced.
    PhantomRecord,
    /// In queue mode, the committed offset passed a record its lease never answered for
    /// good (accepted, rejected, or retried at its last delivery) and that is not in the
    /// dead letter topic.
    UnansweredCommit,
    /// In queue mode, a record answered into the dead letter topic (a reject, or a retry at
    /// its last delivery) that the committed offset passed, but that is not there.
    DeadLetterLost,
}

impl AnomalyKind {
    /// The kind's name, as serialized.
    pub fn as_str(self) -> &'static str {
        match self {
            AnomalyKind::StaleHolder => "stale-holder",
            AnomalyKind::OverlappingGrant => "overlapping-grant",
            AnomalyKind::TokenRegression => "token-regression",
            AnomalyKind::CommitRegression => "commit-regression",
            AnomalyKind::LostRecord => "lost-record",
            AnomalyKind::WrongValue => "wrong-value",
            AnomalyKind::PhantomRecord => "phantom-record",
            AnomalyKind::UnansweredCommit => "unanswered-commit",
            AnomalyKind::DeadLetterLost => "dead-letter-lost",
        }
    }
}

impl fmt::Display for AnomalyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One anomaly, with the history events that show it.
#[derive(Debug, Clone, Serialize)]
pub struct Anomaly {
    /// What went wrong.
    pub kind: AnomalyKind,
    /// The partition it concerns.
    pub partition: Option<i32>,
    /// One sentence naming the leases, tokens, offsets and times.
    pub description: String,
    /// The few events that show it, in time order.
    pub excerpt: Vec<Event>,
}

/// How many anomalies of one kind were found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct AnomalyTotal {
    /// The kind.
    pub kind: AnomalyKind,
    /// How many, listed or not.
    pub count: u64,
}

/// What was produced and delivered.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Delivery {
    /// Records whose write was acknowledged.
    pub produced: u64,
    /// Writes whose acknowledgement never came.
    pub produce_unknown: u64,
    /// Batches handed to clients.
    pub batches: u64,
    /// Distinct (partition, offset) delivered.
    pub delivered: u64,
    /// Records delivered in all, counting each time.
    pub deliveries: u64,
    /// Deliveries beyond the first of a record.
    pub duplicates: u64,
    /// Acknowledged records below the committed offset that were never delivered.
    pub lost: u64,
    /// Batches of a lease received after a lease with a greater token had been granted.
    pub late_batches: u64,
    /// The same, by partition.
    pub partitions: Vec<PartitionFigures>,
}

/// Delivery figures of one partition.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PartitionFigures {
    /// The partition.
    pub partition: i32,
    /// Records whose write was acknowledged.
    pub produced: u64,
    /// Distinct offsets delivered.
    pub delivered: u64,
    /// Records delivered in all.
    pub deliveries: u64,
    /// Acknowledged records below the committed offset never delivered.
    pub lost: u64,
    /// The committed offset at the end of the run (the `Final` event).
    pub final_committed: Option<i64>,
    /// The high watermark at the end of the run.
    pub high_watermark: Option<i64>,
    /// Batches of a lease received after a lease with a greater token had been granted.
    pub late_batches: u64,
    /// The most such a batch came after the greater lease's grant, in ms.
    pub max_late_ms: Option<f64>,
}

/// One fault: a nemesis start and the stop that healed it.
#[derive(Debug, Clone, Serialize)]
pub struct Fault {
    /// The fault's name (its kind: `kill-gateway`, `partition-consul`, …).
    pub name: String,
    /// What it targeted.
    pub target: String,
    /// When it began.
    pub start_ms: f64,
    /// When it was healed; none when the history has no stop for it.
    pub stop_ms: Option<f64>,
    /// Whether the fault was seen to take effect.
    pub took_effect: bool,
    /// What showed it.
    pub evidence: String,
    /// For each partition whose lease was served by the target when the fault began, how
    /// long until a lease with a greater token received a batch.
    pub failover_ms: Vec<Failover>,
    /// The longest gap between consecutive batches of one partition that overlaps the
    /// fault's window (start to stop, or start + [`OPEN_FAULT_WINDOW_MS`]).
    pub gap_ms: Option<f64>,
    /// The partition of that gap.
    pub gap_partition: Option<i32>,
    /// The batch times that bound that gap.
    pub gap_between_ms: Option<(f64, f64)>,
    /// What happened from this fault's start to the next fault's (or the history's end):
    /// the calls (Acquire, Commit, Seek, Release) completed, by outcome.
    pub calls: OutcomeCounts,
    /// Records delivered in that window.
    pub delivered: u64,
    /// How many of those had been delivered before.
    pub duplicated: u64,
}

/// How one partition moved off a fault's target.
#[derive(Debug, Clone, Serialize)]
pub struct Failover {
    /// The partition.
    pub partition: i32,
    /// The lease the target served when the fault began.
    pub from_lease: String,
    /// Its token.
    pub from_token: u64,
    /// From the fault's start to the first batch under a greater token; none when the
    /// partition never had one (not recovered), or when the lease was kept.
    pub ms: Option<f64>,
    /// The lease itself read on after the fault was healed, before any lease with a greater
    /// token: it was suspended, not lost, and no failover was needed.
    pub kept: bool,
    /// Its own client let the lease go during the fault, before any lease with a greater
    /// token read (a Release that took effect, or one of [`LET_GO`]'s ends): the partition
    /// moved by the workload's choice, not the fault's, so no failover is measured.
    pub let_go: bool,
    /// The lease of that batch.
    pub to_lease: Option<String>,
    /// Its token.
    pub to_token: Option<u64>,
}

/// The faults of one name summed up.
#[derive(Debug, Clone, Serialize)]
pub struct FaultKindSummary {
    /// The faults' name.
    pub name: String,
    /// How many there were.
    pub faults: u64,
    /// How many were seen to take effect.
    pub took_effect: u64,
    /// Failovers measured (partitions that recovered).
    pub failovers: u64,
    /// The median failover, nearest rank.
    pub failover_p50_ms: Option<f64>,
    /// The 99th percentile failover, nearest rank.
    pub failover_p99_ms: Option<f64>,
    /// Partitions that never recovered.
    pub not_recovered: u64,
    /// Leases of the target that were kept through the fault (suspended, then went on).
    pub kept: u64,
    /// Leases of the target that their clients let go during the fault.
    pub let_go: u64,
    /// The longest gap in deliveries during one of these faults.
    pub max_gap_ms: Option<f64>,
    /// The partition of that gap.
    pub max_gap_partition: Option<i32>,
}

/// Checks a history (events in the order written; times need not be sorted).
pub fn check(history: &[Event]) -> Report {
    let order = time_order(history);
    let mut ix = Index::default();
    for &i in &order {
        ix.add(history, i);
    }
    ix.finish(history);

    let mut found = Vec::new();
    check_grants(history, &ix, &mut found);
    let late = check_stale(history, &ix, &mut found);
    let late_commits = check_observations(history, &ix, &mut found);
    check_values(history, &ix, &mut found);
    let lost = check_lost(history, &ix, &mut found);
    check_queue(history, &ix, &mut found);
    let (anomalies, anomaly_totals) = finish_anomalies(history, found);

    let delivery = delivery(history, &ix, &late, &lost);
    let mut faults = faults(history, &ix);
    windows(history, &mut faults);
    let fault_kinds = fault_kinds(&faults);
    Report {
        events: history.len(),
        counts: ix.counts,
        anomaly_totals,
        anomalies,
        delivery,
        faults,
        fault_kinds,
        late_commits,
    }
}

/// Fills each fault's window figures: from its start to the next fault's start (faults in
/// order of start), the calls completed by outcome and the records delivered, first time
/// or again.
fn windows(history: &[Event], faults: &mut [Fault]) {
    let mut starts: Vec<(f64, usize)> = faults
        .iter()
        .enumerate()
        .map(|(i, f)| (f.start_ms, i))
        .collect();
    starts.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut seen: HashSet<(i32, i64)> = HashSet::new();
    for i in time_order(history) {
        let e = &history[i];
        let at = starts.partition_point(|(t, _)| *t <= e.t_ms);
        let window = at.checked_sub(1).map(|w| starts[w].1);
        let outcome = match &e.op {
            Op::Acquired { .. } => Some(Outcome::Ok),
            Op::AcquireFailed { outcome, .. }
            | Op::Commit { outcome, .. }
            | Op::Seek { outcome, .. }
            | Op::Release { outcome, .. } => Some(*outcome),
            _ => None,
        };
        if let (Some(outcome), Some(w)) = (outcome, window) {
            faults[w].calls.add(outcome);
        }
        if let Op::Batch {
            partition, offsets, ..
        } = &e.op
        {
            for &o in offsets {
                let again = !seen.insert((*partition, o));
                if let Some(w) = window {
                    faults[w].delivered += 1;
                    if again {
                        faults[w].duplicated += 1;
                    }
                }
            }
        }
    }
}

/// Indices of the events sorted by time (ties keep the order written).
fn time_order(history: &[Event]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..history.len()).collect();
    order.sort_by(|&a, &b| history[a].t_ms.total_cmp(&history[b].t_ms));
    order
}

/// A lease, identified by partition, lease id and token.
#[derive(Debug)]
struct Lease<'a> {
    id: &'a str,
    token: u64,
    /// Its `Acquired` event.
    acquired: Option<usize>,
    /// The first event that shows it held the partition: a batch or a call that took effect.
    first_seen: Option<usize>,
    /// When it ended: a release that took effect, a `LeaseEnded`, or the grant of a lease
    /// with a greater token, whichever came first.
    ended_ms: Option<f64>,
    /// When its client chose to end it: a release that took effect, or a `LeaseEnded` with
    /// one of [`LET_GO`]'s reasons.
    chosen_end_ms: Option<f64>,
}

impl Lease<'_> {
    /// The event from which the lease is known to have held its partition.
    fn held_from(&self) -> Option<usize> {
        self.acquired.or(self.first_seen)
    }
}

/// For a token, the earliest time a lease with a greater token is known to have held.
#[derive(Debug, Default)]
struct Successors {
    tokens: Vec<u64>,
    /// For each position in `tokens`, the earliest (time, lease) at or after it.
    suffix: Vec<(f64, usize)>,
}

impl Successors {
    fn new(mut entries: Vec<(u64, f64, usize)>) -> Successors {
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
    fn first_above(&self, token: u64) -> Option<(f64, usize)> {
        let i = self.tokens.partition_point(|&t| t <= token);
        self.suffix.get(i).copied()
    }
}

/// What the checker keeps of one partition. Every list is in time order.
#[derive(Debug, Default)]
struct Part {
    leases: Vec<usize>,
    acquired: Vec<usize>,
    batches: Vec<usize>,
    batch_times: Vec<f64>,
    /// Commits, Seeks and Releases that took effect.
    ok_calls: Vec<usize>,
    observations: Vec<usize>,
    seeks_ok: Vec<usize>,
    produced: Vec<usize>,
    /// Offset delivered → the first batch that delivered it.
    delivered: BTreeMap<i64, usize>,
    deliveries: u64,
    final_event: Option<usize>,
    /// Successors by any evidence of holding.
    successors: Successors,
    /// Successors by their `Acquired` only.
    granted_successors: Successors,
}

/// The history indexed for the checks.
#[derive(Debug, Default)]
struct Index<'a> {
    counts: Counts,
    leases: Vec<Lease<'a>>,
    lease_keys: HashMap<(i32, u64), Vec<usize>>,
    parts: BTreeMap<i32, Part>,
    /// Commits of any outcome, by (partition, token).
    commits: HashMap<(i32, u64), Vec<usize>>,
    /// Seeks that took effect, by (partition, token).
    seeks_ok: HashMap<(i32, u64), Vec<usize>>,
    /// Queue-mode answers of any outcome, by (partition, token).
    acks: HashMap<(i32, u64), Vec<usize>>,
    /// (partition, offset) → a record of the dead letter topic that came from there.
    dead_letters: HashMap<(i32, i64), usize>,
    /// (partition, offset) → the `Produced` event.
    produced_at: HashMap<(i32, i64), usize>,
    /// Every value written, acknowledged or not.
    values: HashSet<&'a str>,
    nemesis: Vec<usize>,
    /// (partition, token, offset) → a commit its gateway reported late.
    late_commits: HashMap<(i32, u64, i64), usize>,
}

impl<'a> Index<'a> {
    fn part(&mut self, partition: i32) -> &mut Part {
        self.parts.entry(partition).or_default()
    }

    fn lease(&mut self, partition: i32, id: &'a str, token: u64) -> usize {
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

    fn seen(&mut self, partition: i32, id: &'a str, token: u64, event: usize) {
        let l = self.lease(partition, id, token);
        self.leases[l].first_seen.get_or_insert(event);
    }

    fn chose_to_end(&mut self, partition: i32, id: &'a str, token: u64, t_ms: f64) {
        let l = self.lease(partition, id, token);
        self.leases[l].chosen_end_ms.get_or_insert(t_ms);
    }

    fn ended(&mut self, partition: i32, id: &'a str, token: u64, t_ms: f64) {
        let l = self.lease(partition, id, token);
        self.leases[l].ended_ms.get_or_insert(t_ms);
    }

    /// Takes in one event; events come in time order.
    fn add(&mut self, history: &'a [Event], i: usize) {
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
    fn finish(&mut self, history: &[Event]) {
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

/// An anomaly before its events are copied out.
#[derive(Debug)]
struct Found {
    kind: AnomalyKind,
    partition: i32,
    at_ms: f64,
    description: String,
    /// The events that show it, the most telling first.
    excerpt: Vec<usize>,
}

/// A time for a description: whole ms when it is whole, else to a tenth.
fn ms(t: f64) -> String {
    if t.fract() == 0.0 {
        format!("{t:.0}")
    } else {
        format!("{t:.1}")
    }
}

fn token_text(token: Option<u64>) -> String {
    token.map_or_else(|| "none".to_string(), |t| t.to_string())
}

/// The `invoked_ms` of a call.
fn invoked_ms(e: &Event) -> Option<f64> {
    match &e.op {
        Op::Acquired { invoked_ms, .. }
        | Op::AcquireFailed { invoked_ms, .. }
        | Op::Commit { invoked_ms, .. }
        | Op::Seek { invoked_ms, .. }
        | Op::Release { invoked_ms, .. } => Some(*invoked_ms),
        _ => None,
    }
}

/// Overlapping grants: one token granted to two leases, or a grant whose token is not greater
/// than that of a grant completed before it was asked for.
fn check_grants(history: &[Event], ix: &Index<'_>, found: &mut Vec<Found>) {
    for (&p, part) in &ix.parts {
        let mut by_token: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
        let mut times = Vec::with_capacity(part.acquired.len());
        // The greatest token granted so far, and its event, at each position.
        let mut prefix_max: Vec<(u64, usize)> = Vec::with_capacity(part.acquired.len());
        for &i in &part.acquired {
            if let Op::Acquired { token, .. } = &history[i].op {
                by_token.entry(*token).or_default().push(i);
                let best = match prefix_max.last() {
                    Some(&(t, e)) if t >= *token => (t, e),
                    _ => (*token, i),
                };
                prefix_max.push(best);
                times.push(history[i].t_ms);
            }
        }
        for (token, events) in &by_token {
            let mut ids: Vec<&str> = events
                .iter()
                .filter_map(|&i| lease_id(&history[i]))
                .collect();
            ids.sort_unstable();
            ids.dedup();
            if ids.len() > 1 {
                let second = events.get(1).map_or(0.0, |&i| history[i].t_ms);
                found.push(Found {
                    kind: AnomalyKind::OverlappingGrant,
                    partition: p,
                    at_ms: second,
                    description: format!(
                        "Partition {p} granted token {token} to {} leases ({}), the second at {} \
                         ms.",
                        ids.len(),
                        ids.join(", "),
                        ms(second)
                    ),
                    excerpt: events.clone(),
                });
            }
        }
        for &b in &part.acquired {
            let (Some(invoked), Op::Acquired { lease, token, .. }) =
                (invoked_ms(&history[b]), &history[b].op)
            else {
                continue;
            };
            let k = times.partition_point(|&t| t < invoked);
            let Some(&(earlier_token, a)) = k.checked_sub(1).and_then(|k| prefix_max.get(k)) else {
                continue;
            };
            // An equal token of another lease is reported above, as one grant to two leases.
            if earlier_token > *token {
                let a_id = lease_id(&history[a]).unwrap_or("?");
                found.push(Found {
                    kind: AnomalyKind::OverlappingGrant,
                    partition: p,
                    at_ms: history[b].t_ms,
                    description: format!(
                        "Lease {lease} of partition {p} was granted token {token} at {} ms (asked \
                         for at {} ms), not greater than token {earlier_token} of lease {a_id} \
                         granted at {} ms.",
                        ms(history[b].t_ms),
                        ms(invoked),
                        ms(history[a].t_ms)
                    ),
                    excerpt: vec![a, b],
                });
            }
        }
    }
}

fn lease_id(e: &Event) -> Option<&str> {
    match &e.op {
        Op::Acquired { lease, .. }
        | Op::Batch { lease, .. }
        | Op::Commit { lease, .. }
        | Op::Seek { lease, .. }
        | Op::Release { lease, .. }
        | Op::LeaseEnded { lease, .. } => Some(lease),
        _ => None,
    }
}

/// Late batches of one partition: how many, and the most late.
#[derive(Debug, Default, Clone, Copy)]
struct Late {
    count: u64,
    max_ms: Option<f64>,
}

/// Stale holders: a call of a lease that took effect though it was invoked after a lease with
/// a greater token had been granted. Counts the late batches too.
fn check_stale(history: &[Event], ix: &Index<'_>, found: &mut Vec<Found>) -> BTreeMap<i32, Late> {
    let mut late = BTreeMap::new();
    for (&p, part) in &ix.parts {
        for &i in &part.ok_calls {
            let e = &history[i];
            let (lease, token, invoked, what) = match &e.op {
                Op::Commit {
                    lease,
                    token,
                    invoked_ms,
                    offset,
                    ..
                } => (
                    lease,
                    *token,
                    *invoked_ms,
                    format!("a commit of offset {offset}"),
                ),
                Op::Seek {
                    lease,
                    token,
                    invoked_ms,
                    to,
                    ..
                } => (lease, *token, *invoked_ms, format!("a seek to {to}")),
                Op::Release {
                    lease,
                    token,
                    invoked_ms,
                    ..
                } => (lease, *token, *invoked_ms, "a release".to_string()),
                _ => continue,
            };
            let Some((from, b)) = part.successors.first_above(token) else {
                continue;
            };
            if from >= invoked {
                continue;
            }
            let successor = &ix.leases[b];
            let how = if successor.acquired.is_some() {
                "was granted"
            } else {
                "was seen holding the partition"
            };
            let mut excerpt: Vec<usize> = successor.held_from().into_iter().collect();
            excerpt.push(i);
            let own = ix.lease_keys.get(&(p, token)).and_then(|ls| {
                ls.iter()
                    .find(|&&l| ix.leases[l].id == lease.as_str())
                    .and_then(|&l| ix.leases[l].acquired)
            });
            excerpt.extend(own);
            found.push(Found {
                kind: AnomalyKind::StaleHolder,
                partition: p,
                at_ms: invoked,
                description: format!(
                    "Lease {lease} (token {token}) of partition {p} had {what} invoked at {} ms \
                     and answered ok at {} ms, after lease {} (token {}) {how} at {} ms.",
                    ms(invoked),
                    ms(e.t_ms),
                    successor.id,
                    successor.token,
                    ms(from)
                ),
                excerpt,
            });
        }
        let mut counted = Late::default();
        for &i in &part.batches {
            let Op::Batch { token, .. } = &history[i].op else {
                continue;
            };
            if let Some((from, _)) = part.successors.first_above(*token) {
                let by = history[i].t_ms - from;
                if by > 0.0 {
                    counted.count += 1;
                    counted.max_ms = Some(counted.max_ms.map_or(by, |m| m.max(by)));
                }
            }
        }
        late.insert(p, counted);
    }
    late
}

/// The commit of `token` that most likely wrote the observed `offset` near `t_ms`: one of that
/// offset not known to have failed and invoked by then, nearest in time; else the nearest.
fn find_commit(
    history: &[Event],
    ix: &Index<'_>,
    partition: i32,
    token: u64,
    offset: i64,
    t_ms: f64,
) -> Option<usize> {
    let commits = ix.commits.get(&(partition, token))?;
    let distance = |i: usize| (history[i].t_ms - t_ms).abs();
    let nearest = |it: &mut dyn Iterator<Item = usize>| {
        it.min_by(|&a, &b| distance(a).total_cmp(&distance(b)))
    };
    let matching = nearest(&mut commits.iter().copied().filter(|&i| {
        matches!(&history[i].op, Op::Commit { offset: o, outcome, invoked_ms, .. }
            if *o == offset && *outcome != Outcome::Failed && *invoked_ms <= t_ms)
    }));
    matching.or_else(|| nearest(&mut commits.iter().copied()))
}

fn observation(e: &Event) -> Option<(i64, Option<u64>)> {
    match &e.op {
        Op::Committed { offset, token, .. } => Some((*offset, *token)),
        _ => None,
    }
}

/// The observer's readings: the token must never go back; the offset must not go back unless
/// a Seek explains it. A regression to a commit its gateway reported late is that commit's
/// (returned, with the late commits nothing showed), not an anomaly.
fn check_observations(
    history: &[Event],
    ix: &Index<'_>,
    found: &mut Vec<Found>,
) -> Vec<LateCommit> {
    let mut late: BTreeMap<(i32, u64, i64), LateCommit> = ix
        .late_commits
        .iter()
        .map(|(&(partition, token, offset), &i)| {
            let commit = LateCommit {
                partition,
                token,
                offset,
                gateway: history[i].process.clone(),
                explains: Vec::new(),
                excerpt: vec![history[i].clone()],
            };
            ((partition, token, offset), commit)
        })
        .collect();
    let mut explained_by_late = |f: Found, reading: usize| {
        let key = observation(&history[reading])
            .and_then(|(offset, token)| token.map(|token| (f.partition, token, offset)));
        match key.and_then(|k| late.get_mut(&k)) {
            Some(commit) => {
                commit
                    .explains
                    .push(format!("{}: {}", f.kind, f.description));
                for &i in &f.excerpt {
                    if !commit.excerpt.contains(&history[i]) {
                        commit.excerpt.push(history[i].clone());
                    }
                }
            }
            None => found.push(f),
        }
    };
    check_readings(history, ix, &mut explained_by_late);
    late.into_values().collect()
}

/// The regressions in the observer's readings, each handed to `found` with the reading that
/// went back.
fn check_readings(history: &[Event], ix: &Index<'_>, found: &mut dyn FnMut(Found, usize)) {
    for (&p, part) in &ix.parts {
        // Tokens.
        let mut greatest: Option<(u64, usize)> = None;
        let mut previous: Option<u64> = None;
        for &i in &part.observations {
            let Some((offset, Some(token))) = observation(&history[i]) else {
                continue;
            };
            if let Some((top, top_event)) = greatest {
                // A run of readings with the same smaller token is one regression.
                if token < top && previous != Some(token) {
                    let top_offset = observation(&history[top_event]).map_or(0, |o| o.0);
                    let mut excerpt = vec![top_event, i];
                    excerpt.extend(find_commit(
                        history,
                        ix,
                        p,
                        top,
                        top_offset,
                        history[top_event].t_ms,
                    ));
                    excerpt.extend(find_commit(history, ix, p, token, offset, history[i].t_ms));
                    found(
                        Found {
                            kind: AnomalyKind::TokenRegression,
                            partition: p,
                            at_ms: history[i].t_ms,
                            description: format!(
                                "The observer read partition {p}'s committed offset {offset} with \
                             token {token} at {} ms, after it had read offset {top_offset} with \
                             the greater token {top} at {} ms.",
                                ms(history[i].t_ms),
                                ms(history[top_event].t_ms)
                            ),
                            excerpt,
                        },
                        i,
                    );
                }
            }
            previous = Some(token);
            if greatest.is_none_or(|(top, _)| token > top) {
                greatest = Some((token, i));
            }
        }
        // Offsets, reading by reading.
        for pair in part.observations.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            let (Some((o1, t1)), Some((o2, t2))) =
                (observation(&history[a]), observation(&history[b]))
            else {
                continue;
            };
            if o2 >= o1 {
                continue;
            }
            let (ta, tb) = (history[a].t_ms, history[b].t_ms);
            let explained = match t2 {
                Some(token) => ix.seeks_ok.get(&(p, token)).is_some_and(|seeks| {
                    seeks.iter().any(|&s| {
                        matches!(&history[s].op, Op::Seek { invoked_ms, to, resolved, .. }
                            if *invoked_ms < tb && resolved.unwrap_or(*to) <= o2)
                    })
                }),
                None => part.seeks_ok.iter().any(|&s| {
                    invoked_ms(&history[s]).is_some_and(|inv| inv < tb) && history[s].t_ms > ta
                }),
            };
            if explained {
                continue;
            }
            let mut excerpt = vec![a, b];
            if let Some(token) = t2 {
                excerpt.extend(find_commit(history, ix, p, token, o2, tb));
            }
            if let Some(token) = t1 {
                excerpt.extend(find_commit(history, ix, p, token, o1, ta));
            }
            let why = match t2 {
                Some(token) => format!(
                    "no seek that took effect of the lease with token {token} to {o2} or below \
                     explains it"
                ),
                None => "no seek took effect on the partition between the two readings".to_string(),
            };
            found(
                Found {
                    kind: AnomalyKind::CommitRegression,
                    partition: p,
                    at_ms: tb,
                    description: format!(
                    "Partition {p}'s committed offset went back from {o1} (token {}) at {} ms to \
                     {o2} (token {}) at {} ms, and {why}.",
                    token_text(t1),
                    ms(ta),
                    token_text(t2),
                    ms(tb)
                ),
                    excerpt,
                },
                b,
            );
        }
    }
}

/// Values delivered: each must be the one produced at its offset, and must have been written.
fn check_values(history: &[Event], ix: &Index<'_>, found: &mut Vec<Found>) {
    let mut reported: HashSet<(i32, i64, &str)> = HashSet::new();
    for (&p, part) in &ix.parts {
        for &i in &part.batches {
            let Op::Batch {
                lease,
                token,
                offsets,
                values,
                ..
            } = &history[i].op
            else {
                continue;
            };
            for (&offset, value) in offsets.iter().zip(values) {
                let produced = ix.produced_at.get(&(p, offset)).copied();
                let produced_value = produced.and_then(|j| match &history[j].op {
                    Op::Produced { value, .. } => Some(value.as_str()),
                    _ => None,
                });
                let kind = if !ix.values.contains(value.as_str()) {
                    AnomalyKind::PhantomRecord
                } else if produced_value.is_some_and(|v| v != value) {
                    AnomalyKind::WrongValue
                } else {
                    continue;
                };
                if !reported.insert((p, offset, value.as_str())) {
                    continue;
                }
                let was = match (produced, produced_value) {
                    (Some(j), Some(v)) => {
                        format!("{v:?}, produced at {} ms", ms(history[j].t_ms))
                    }
                    _ => "no acknowledged value".to_string(),
                };
                let description = match kind {
                    AnomalyKind::PhantomRecord => format!(
                        "Lease {lease} (token {token}) received at {} ms the value {value:?} at \
                         offset {offset} of partition {p}, a value never written (the offset \
                         holds {was}).",
                        ms(history[i].t_ms)
                    ),
                    _ => format!(
                        "Lease {lease} (token {token}) received at {} ms the value {value:?} at \
                         offset {offset} of partition {p}, where the producer was told it wrote \
                         {was}.",
                        ms(history[i].t_ms)
                    ),
                };
                found.push(Found {
                    kind,
                    partition: p,
                    at_ms: history[i].t_ms,
                    description,
                    excerpt: produced.into_iter().chain([i]).collect(),
                });
            }
        }
    }
}

/// Lost records: acknowledged records below the committed offset that no batch delivered.
/// Returns the exact count by partition.
fn check_lost(history: &[Event], ix: &Index<'_>, found: &mut Vec<Found>) -> BTreeMap<i32, u64> {
    let mut lost = BTreeMap::new();
    for (&p, part) in &ix.parts {
        let limit = match part.final_event.map(|f| (&history[f].op, f)) {
            Some((Op::Final { committed, .. }, f)) => {
                Some((*committed, f, "final committed offset"))
            }
            _ => part
                .observations
                .iter()
                .filter_map(|&i| observation(&history[i]).map(|o| (o.0, i)))
                .max_by_key(|&(o, _)| o)
                .map(|(o, i)| (o, i, "largest committed offset observed")),
        };
        let Some((limit, limit_event, limit_name)) = limit else {
            continue;
        };
        let mut missing: Vec<(i64, usize)> = part
            .produced
            .iter()
            .filter_map(|&i| match &history[i].op {
                Op::Produced { offset, .. }
                    if *offset < limit && !part.delivered.contains_key(offset) =>
                {
                    Some((*offset, i))
                }
                _ => None,
            })
            .collect();
        missing.sort_unstable();
        missing.dedup_by_key(|m| m.0);
        lost.insert(p, missing.len() as u64);
        for (offset, i) in missing {
            let value = match &history[i].op {
                Op::Produced { value, .. } => value.as_str(),
                _ => "",
            };
            let mut excerpt = vec![i];
            excerpt.extend(part.delivered.range(..offset).next_back().map(|(_, &b)| b));
            excerpt.extend(part.delivered.range(offset + 1..).next().map(|(_, &b)| b));
            excerpt.push(limit_event);
            found.push(Found {
                kind: AnomalyKind::LostRecord,
                partition: p,
                // Lost records are listed by offset.
                at_ms: offset as f64,
                description: format!(
                    "Record {offset} of partition {p} (value {value:?}, acknowledged at {} ms) \
                     lies below the {limit_name} {limit}, but no batch delivered it.",
                    ms(history[i].t_ms)
                ),
                excerpt,
            });
        }
    }
    lost
}

/// Queue mode: the gateway commits a queue lease's progress, and may pass a record only once
/// it is done: answered for good by the lease (an ACCEPT; a REJECT or a RETRY at the last
/// delivery, which send it to the dead letter topic), or dead-lettered by the gateway (ack
/// deadlines missed to the last delivery). A record sent to the dead letter topic and passed
/// must be there. An answer whose outcome is unknown counts as given: it may have been
/// applied. A queue lease's records are one at a time in offset order (the workload's
/// queues keep partition order), so what was done is the prefix below the committed offset.
fn check_queue(history: &[Event], ix: &Index<'_>, found: &mut Vec<Found>) {
    for (&(p, token), acks) in &ix.acks {
        let Some(part) = ix.parts.get(&p) else {
            continue;
        };
        let start = ix.lease_keys.get(&(p, token)).and_then(|ls| {
            ls.iter()
                .filter_map(|&l| ix.leases[l].acquired)
                .find_map(|a| match &history[a].op {
                    Op::Acquired { offset, .. } => Some((*offset, a)),
                    _ => None,
                })
        });
        let Some((start, acquired)) = start else {
            continue;
        };
        // Offset → the answer that ended it (Ok or unknown outcome), and the answers that
        // send it to the dead letter topic.
        let mut done: BTreeMap<i64, usize> = BTreeMap::new();
        let mut to_dead: BTreeMap<i64, usize> = BTreeMap::new();
        for &i in acks {
            if let Op::Ack {
                offset,
                answer,
                terminal,
                outcome,
                ..
            } = &history[i].op
            {
                if *terminal && *outcome != Outcome::Failed {
                    done.entry(*offset).or_insert(i);
                    if answer != "accept" && *outcome == Outcome::Ok {
                        to_dead.entry(*offset).or_insert(i);
                    }
                }
            }
        }
        // The greatest offset committed under this token, and the reading that showed it.
        let passed = part
            .observations
            .iter()
            .filter_map(|&i| match observation(&history[i]) {
                Some((offset, Some(t))) if t == token => Some((offset, i)),
                _ => None,
            })
            .max_by_key(|&(o, _)| o);
        let Some((committed, reading)) = passed else {
            continue;
        };
        if let Some(o) = (start..committed)
            .find(|o| !done.contains_key(o) && !ix.dead_letters.contains_key(&(p, *o)))
        {
            let mut excerpt = vec![reading, acquired];
            excerpt.extend(done.range(..o).next_back().map(|(_, &i)| i));
            excerpt.extend(done.range(o + 1..).next().map(|(_, &i)| i));
            excerpt.extend(part.delivered.get(&o).copied());
            found.push(Found {
                kind: AnomalyKind::UnansweredCommit,
                partition: p,
                at_ms: history[reading].t_ms,
                description: format!(
                    "The queue lease with token {token} on partition {p} started at {start}, \
                     and the observer read its committed offset {committed} at {} ms, but \
                     record {o} was never answered for good under it nor dead-lettered.",
                    ms(history[reading].t_ms)
                ),
                excerpt,
            });
        }
        for (&o, &i) in to_dead.range(..committed) {
            if ix.dead_letters.contains_key(&(p, o)) {
                continue;
            }
            found.push(Found {
                kind: AnomalyKind::DeadLetterLost,
                partition: p,
                at_ms: history[i].t_ms,
                description: format!(
                    "Record {o} of partition {p} was answered into the dead letter topic by \
                     the lease with token {token} at {} ms and its committed offset passed \
                     it ({committed}), but the dead letter topic does not hold it.",
                    ms(history[i].t_ms)
                ),
                excerpt: vec![i, reading],
            });
        }
    }
}

/// Lists the anomalies: grouped by kind and partition, in time order, at most
/// [`LISTED_PER_PARTITION`] a group, with their excerpts copied out.
fn finish_anomalies(history: &[Event], found: Vec<Found>) -> (Vec<Anomaly>, Vec<AnomalyTotal>) {
    let mut groups: BTreeMap<(AnomalyKind, i32), Vec<Found>> = BTreeMap::new();
    for f in found {
        groups.entry((f.kind, f.partition)).or_default().push(f);
    }
    let mut totals: BTreeMap<AnomalyKind, u64> = BTreeMap::new();
    let mut anomalies = Vec::new();
    for ((kind, p), mut group) in groups {
        group.sort_by(|a, b| a.at_ms.total_cmp(&b.at_ms));
        let total = group.len();
        *totals.entry(kind).or_default() += total as u64;
        group.truncate(LISTED_PER_PARTITION);
        let listed = group.len();
        for (n, f) in group.into_iter().enumerate() {
            let mut description = f.description;
            if total > listed && n + 1 == listed {
                let sentence = description.trim_end_matches('.').to_string();
                description = format!(
                    "{sentence}; partition {p} has {total} {kind} anomalies in all, the first \
                     {listed} listed."
                );
            }
            anomalies.push(Anomaly {
                kind,
                partition: Some(p),
                description,
                excerpt: excerpt(history, &f.excerpt),
            });
        }
    }
    let totals = totals
        .into_iter()
        .map(|(kind, count)| AnomalyTotal { kind, count })
        .collect();
    (anomalies, totals)
}

/// The events named, each once, the first [`EXCERPT_LEN`], in time order.
fn excerpt(history: &[Event], events: &[usize]) -> Vec<Event> {
    let mut picked: Vec<usize> = Vec::new();
    for &i in events {
        if !picked.contains(&i) && picked.len() < EXCERPT_LEN {
            picked.push(i);
        }
    }
    picked.sort_by(|&a, &b| history[a].t_ms.total_cmp(&history[b].t_ms).then(a.cmp(&b)));
    picked.into_iter().map(|i| history[i].clone()).collect()
}

fn delivery(
    history: &[Event],
    ix: &Index<'_>,
    late: &BTreeMap<i32, Late>,
    lost: &BTreeMap<i32, u64>,
) -> Delivery {
    let mut d = Delivery {
        produced: ix.counts.produce.ok,
        produce_unknown: ix.counts.produce.unknown,
        ..Delivery::default()
    };
    for (&p, part) in &ix.parts {
        let (final_committed, high_watermark) = match part.final_event.map(|f| &history[f].op) {
            Some(Op::Final {
                committed,
                high_watermark,
                ..
            }) => (Some(*committed), Some(*high_watermark)),
            _ => (None, None),
        };
        let late = late.get(&p).copied().unwrap_or_default();
        let figures = PartitionFigures {
            partition: p,
            produced: part.produced.len() as u64,
            delivered: part.delivered.len() as u64,
            deliveries: part.deliveries,
            lost: lost.get(&p).copied().unwrap_or(0),
            final_committed,
            high_watermark,
            late_batches: late.count,
            max_late_ms: late.max_ms,
        };
        d.batches += part.batches.len() as u64;
        d.delivered += figures.delivered;
        d.deliveries += figures.deliveries;
        d.lost += figures.lost;
        d.late_batches += figures.late_batches;
        d.partitions.push(figures);
    }
    d.duplicates = d.deliveries - d.delivered;
    d
}

/// The faults: each start paired with the next stop of the same name and target.
fn faults(history: &[Event], ix: &Index<'_>) -> Vec<Fault> {
    let mut faults: Vec<Fault> = Vec::new();
    let mut open: HashMap<(&str, &str), VecDeque<usize>> = HashMap::new();
    for &i in &ix.nemesis {
        let Op::Nemesis {
            name,
            phase,
            target,
            took_effect,
            evidence,
        } = &history[i].op
        else {
            continue;
        };
        let queue = open.entry((name.as_str(), target.as_str())).or_default();
        match phase {
            Phase::Start => {
                queue.push_back(faults.len());
                faults.push(Fault {
                    name: name.clone(),
                    target: target.clone(),
                    start_ms: history[i].t_ms,
                    stop_ms: None,
                    took_effect: *took_effect,
                    evidence: evidence.clone(),
                    failover_ms: Vec::new(),
                    gap_ms: None,
                    gap_partition: None,
                    gap_between_ms: None,
                    calls: OutcomeCounts::default(),
                    delivered: 0,
                    duplicated: 0,
                });
            }
            Phase::Stop => {
                if let Some(f) = queue.pop_front() {
                    faults[f].stop_ms = Some(history[i].t_ms);
                }
            }
        }
    }
    for fault in &mut faults {
        let start = fault.start_ms;
        let end = fault.stop_ms.unwrap_or(start + OPEN_FAULT_WINDOW_MS);
        for (&p, part) in &ix.parts {
            if let Some(failover) =
                failover(history, ix, part, p, &fault.target, start, fault.stop_ms)
            {
                fault.failover_ms.push(failover);
            }
            if let Some((gap, from, to)) = longest_gap(&part.batch_times, start, end) {
                if fault.gap_ms.is_none_or(|g| gap > g) {
                    fault.gap_ms = Some(gap);
                    fault.gap_partition = Some(p);
                    fault.gap_between_ms = Some((from, to));
                }
            }
        }
    }
    faults
}

/// If the lease live on the partition at `start` was served by `target`: how long from `start`
/// until a lease with a greater token received a batch.
fn failover(
    history: &[Event],
    ix: &Index<'_>,
    part: &Part,
    partition: i32,
    target: &str,
    start: f64,
    stop: Option<f64>,
) -> Option<Failover> {
    let live = part
        .leases
        .iter()
        .filter_map(|&l| {
            let lease = &ix.leases[l];
            let a = lease.acquired?;
            let Op::Acquired { gateway, .. } = &history[a].op else {
                return None;
            };
            let live = history[a].t_ms <= start && lease.ended_ms.is_none_or(|e| e >= start);
            (live && gateway == target).then_some(lease)
        })
        .max_by_key(|lease| lease.token)?;
    let first = part.batch_times.partition_point(|&t| t < start);
    let next = part.batches[first..]
        .iter()
        .find_map(|&i| match &history[i].op {
            Op::Batch { lease, token, .. } if *token > live.token => {
                Some((history[i].t_ms - start, lease.clone(), *token))
            }
            _ => None,
        });
    // Kept: a batch of the same lease after the fault was healed, before any successor's.
    let kept = stop.is_some_and(|stop| {
        let after = part.batch_times.partition_point(|&t| t < stop);
        let successor_at = next.as_ref().map(|n| n.0 + start);
        part.batches[after..].iter().any(|&i| {
            matches!(&history[i].op, Op::Batch { token, .. } if *token == live.token)
                && successor_at.is_none_or(|s| history[i].t_ms < s)
        })
    });
    // Let go: its client released it, or chose to end it, before any successor read.
    let successor_at = next.as_ref().map(|n| n.0 + start);
    let let_go = !kept
        && ix
            .lease_keys
            .get(&(partition, live.token))
            .into_iter()
            .flatten()
            .any(|&l| {
                ix.leases[l].id == live.id
                    && ix.leases[l]
                        .chosen_end_ms
                        .is_some_and(|t| t >= start && successor_at.is_none_or(|s| t <= s))
            });
    let next = if kept || let_go { None } else { next };
    Some(Failover {
        partition,
        from_lease: live.id.to_string(),
        from_token: live.token,
        kept,
        let_go,
        ms: next.as_ref().map(|n| n.0),
        to_lease: next.as_ref().map(|n| n.1.clone()),
        to_token: next.map(|n| n.2),
    })
}

/// The longest gap between consecutive times that overlaps [start, end]: (gap, from, to).
fn longest_gap(times: &[f64], start: f64, end: f64) -> Option<(f64, f64, f64)> {
    if times.len() < 2 {
        return None;
    }
    let lo = times.partition_point(|&t| t <= start).saturating_sub(1);
    let hi = times.partition_point(|&t| t < end).min(times.len() - 1);
    let mut best: Option<(f64, f64, f64)> = None;
    for i in lo..hi {
        let (a, b) = (times[i], times[i + 1]);
        if a < end && b > start && best.is_none_or(|g| b - a > g.0) {
            best = Some((b - a, a, b));
        }
    }
    best
}

/// The nearest-rank percentile `pct` (1 to 100) of sorted values.
fn nearest_rank(sorted: &[f64], pct: usize) -> Option<f64> {
    let n = sorted.len();
    if n == 0 {
        return None;
    }
    let rank = (pct * n).div_ceil(100).clamp(1, n);
    sorted.get(rank - 1).copied()
}

fn fault_kinds(faults: &[Fault]) -> Vec<FaultKindSummary> {
    let mut by_name: BTreeMap<&str, Vec<&Fault>> = BTreeMap::new();
    for f in faults {
        by_name.entry(f.name.as_str()).or_default().push(f);
    }
    by_name
        .into_iter()
        .map(|(name, faults)| {
            let mut times: Vec<f64> = faults
                .iter()
                .flat_map(|f| f.failover_ms.iter().filter_map(|o| o.ms))
                .collect();
            times.sort_by(f64::total_cmp);
            let not_recovered = faults
                .iter()
                .flat_map(|f| &f.failover_ms)
                .filter(|o| o.ms.is_none() && !o.kept && !o.let_go)
                .count() as u64;
            let let_go = faults
                .iter()
                .flat_map(|f| &f.failover_ms)
                .filter(|o| o.let_go)
                .count() as u64;
            let kept = faults
                .iter()
                .flat_map(|f| &f.failover_ms)
                .filter(|o| o.kept)
                .count() as u64;
            let mut max_gap: Option<(f64, Option<i32>)> = None;
            for f in &faults {
                if let Some(g) = f.gap_ms {
                    if max_gap.is_none_or(|m| g > m.0) {
                        max_gap = Some((g, f.gap_partition));
                    }
                }
            }
            FaultKindSummary {
                name: name.to_string(),
                faults: faults.len() as u64,
                took_effect: faults.iter().filter(|f| f.took_effect).count() as u64,
                failovers: times.len() as u64,
                failover_p50_ms: nearest_rank(&times, 50),
                failover_p99_ms: nearest_rank(&times, 99),
                not_recovered,
                kept,
                let_go,
                max_gap_ms: max_gap.map(|m| m.0),
                max_gap_partition: max_gap.and_then(|m| m.1),
            }
        })
        .collect()
}

/// A short human summary of a report, in Markdown.
pub fn render_markdown(report: &Report) -> String {
    let mut out = String::new();
    // Writing to a String does not fail.
    let _ = render(report, &mut out);
    out
}

fn opt_ms(t: Option<f64>) -> String {
    t.map_or_else(|| "-".to_string(), ms)
}

fn render(report: &Report, out: &mut String) -> fmt::Result {
    let n = report.anomaly_count();
    if report.valid() {
        writeln!(out, "# Verdict: valid")?;
    } else {
        let noun = if n == 1 { "anomaly" } else { "anomalies" };
        let kinds: Vec<String> = report
            .anomaly_totals
            .iter()
            .map(|t| format!("{} {}", t.count, t.kind))
            .collect();
        writeln!(out, "# Verdict: INVALID: {n} {noun} ({})", kinds.join(", "))?;
    }
    writeln!(out, "\n{} events.\n", report.events)?;

    writeln!(out, "## Calls\n")?;
    writeln!(out, "| call | ok | failed | unknown |")?;
    writeln!(out, "|---|---:|---:|---:|")?;
    let c = &report.counts;
    for (name, k) in [
        ("acquire", c.acquire),
        ("commit", c.commit),
        ("seek", c.seek),
        ("release", c.release),
        ("ack", c.ack),
        ("produce", c.produce),
    ] {
        writeln!(out, "| {name} | {} | {} | {} |", k.ok, k.failed, k.unknown)?;
    }

    writeln!(out, "\n## Faults\n")?;
    if report.fault_kinds.is_empty() {
        writeln!(out, "No faults.")?;
    } else {
        writeln!(
            out,
            "| fault | faults | took effect | failover p50 ms | failover p99 ms | max gap ms | \
             kept | let go | not recovered |"
        )?;
        writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|---:|")?;
        for k in &report.fault_kinds {
            let gap = match (k.max_gap_ms, k.max_gap_partition) {
                (Some(g), Some(p)) => format!("{} (p{p})", ms(g)),
                (g, _) => opt_ms(g),
            };
            writeln!(
                out,
                "| {} | {} | {} | {} | {} | {gap} | {} | {} | {} |",
                k.name,
                k.faults,
                k.took_effect,
                opt_ms(k.failover_p50_ms),
                opt_ms(k.failover_p99_ms),
                k.kept,
                k.let_go,
                k.not_recovered
            )?;
        }
        writeln!(out)?;
        writeln!(
            out,
            "| fault | target | start ms | stop ms | took effect | failover ms (partition) | gap \
             ms (partition) | calls ok / failed / unknown | delivered (again) |"
        )?;
        writeln!(out, "|---|---|---:|---:|---|---|---:|---:|---:|")?;
        for f in &report.faults {
            let failover: Vec<String> = f
                .failover_ms
                .iter()
                .map(|o| match o.ms {
                    Some(t) => format!("{} (p{})", ms(t), o.partition),
                    None if o.kept => format!("kept (p{})", o.partition),
                    None if o.let_go => format!("let go (p{})", o.partition),
                    None => format!("not recovered (p{})", o.partition),
                })
                .collect();
            let gap = match (f.gap_ms, f.gap_partition) {
                (Some(g), Some(p)) => format!("{} (p{p})", ms(g)),
                (g, _) => opt_ms(g),
            };
            writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {gap} | {} / {} / {} | {} ({}) |",
                f.name,
                f.target,
                ms(f.start_ms),
                opt_ms(f.stop_ms),
                if f.took_effect { "yes" } else { "no" },
                if failover.is_empty() {
                    "-".to_string()
                } else {
                    failover.join(", ")
                },
                f.calls.ok,
                f.calls.failed,
                f.calls.unknown,
                f.delivered,
                f.duplicated
            )?;
        }
    }

    let d = &report.delivery;
    writeln!(out, "\n## Delivery\n")?;
    writeln!(
        out,
        "- produced: {} acknowledged, {} unknown",
        d.produced, d.produce_unknown
    )?;
    writeln!(
        out,
        "- delivered: {} records in {} deliveries over {} batches ({} duplicates)",
        d.delivered, d.deliveries, d.batches, d.duplicates
    )?;
    writeln!(out, "- lost: {}", d.lost)?;
    writeln!(out, "- late batches: {}", d.late_batches)?;
    let explaining = report
        .late_commits
        .iter()
        .filter(|c| !c.explains.is_empty())
        .count();
    writeln!(
        out,
        "- late commits (answered past their lease's fence deadline, reported by their \
         gateway): {}, {explaining} of them seen to set the committed offset back",
        report.late_commits.len()
    )?;
    if !d.partitions.is_empty() {
        writeln!(
            out,
            "\n| partition | produced | delivered | deliveries | lost | final committed | high \
             watermark | late batches | max late ms |"
        )?;
        writeln!(out, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|")?;
        let num = |v: Option<i64>| v.map_or_else(|| "-".to_string(), |v| v.to_string());
        for p in &d.partitions {
            writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                p.partition,
                p.produced,
                p.delivered,
                p.deliveries,
                p.lost,
                num(p.final_committed),
                num(p.high_watermark),
                p.late_batches,
                opt_ms(p.max_late_ms)
            )?;
        }
    }

    if !report.late_commits.is_empty() {
        writeln!(out, "\n## Late commits\n")?;
        writeln!(
            out,
            "Each was answered after its lease's fence deadline, so it may have landed after a \
             successor's commits: the limit of the commit gate (docs/ARCHITECTURE.md), which \
             the gateway cannot prevent and reports. The regressions it explains are not \
             counted as anomalies."
        )?;
        for (n, c) in report.late_commits.iter().enumerate() {
            writeln!(
                out,
                "\n### {}. partition {}, token {}, offset {} (reported by {})\n",
                n + 1,
                c.partition,
                c.token,
                c.offset,
                c.gateway
            )?;
            if c.explains.is_empty() {
                writeln!(out, "The observer saw no regression from it.\n")?;
            }
            for e in &c.explains {
                writeln!(out, "- {e}")?;
            }
            writeln!(out, "\n```json")?;
            for e in &c.excerpt {
                let line = serde_json::to_string(e).unwrap_or_else(|e| format!("({e})"));
                writeln!(out, "{line}")?;
            }
            writeln!(out, "```")?;
        }
    }

    if !report.anomalies.is_empty() {
        writeln!(out, "\n## Anomalies")?;
        for (n, a) in report.anomalies.iter().enumerate() {
            let on = a
                .partition
                .map_or_else(String::new, |p| format!(", partition {p}"));
            writeln!(out, "\n### {}. {}{on}\n", n + 1, a.kind)?;
            writeln!(out, "{}\n", a.description)?;
            writeln!(out, "```json")?;
            for e in &a.excerpt {
                let line = serde_json::to_string(e).unwrap_or_else(|e| format!("({e})"));
                writeln!(out, "{line}")?;
            }
            writeln!(out, "```")?;
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ev(t_ms: f64, process: &str, op: Op) -> Event {
        Event {
            t_ms,
            process: process.to_string(),
            op,
        }
    }

    /// The value the producer writes at (partition, offset) in these tests.
    fn value(p: i32, o: i64) -> String {
        format!("v{p}-{o}")
    }

    fn produced(t: f64, p: i32, o: i64) -> Event {
        ev(
            t,
            "producer",
            Op::Produced {
                partition: p,
                offset: o,
                value: value(p, o),
            },
        )
    }

    fn acquired(t: f64, inv: f64, lease: &str, p: i32, token: u64, offset: i64, gw: &str) -> Event {
        ev(
            t,
            "client-1",
            Op::Acquired {
                invoked_ms: inv,
                lease: lease.to_string(),
                partition: p,
                token,
                offset,
                gateway: gw.to_string(),
                via: gw.to_string(),
            },
        )
    }

    /// A batch of the records [from, to) with their produced values.
    fn batch(t: f64, lease: &str, p: i32, token: u64, from: i64, to: i64) -> Event {
        ev(
            t,
            "client-1",
            Op::Batch {
                lease: lease.to_string(),
                partition: p,
                token,
                offsets: (from..to).collect(),
                values: (from..to).map(|o| value(p, o)).collect(),
            },
        )
    }

    fn commit(
        t: f64,
        inv: f64,
        lease: &str,
        p: i32,
        token: u64,
        offset: i64,
        outcome: Outcome,
    ) -> Event {
        ev(
            t,
            "client-1",
            Op::Commit {
                invoked_ms: inv,
                lease: lease.to_string(),
                partition: p,
                token,
                offset,
                outcome,
                error: None,
            },
        )
    }

    fn seek(t: f64, inv: f64, lease: &str, p: i32, token: u64, to: i64, outcome: Outcome) -> Event {
        ev(
            t,
            "client-1",
            Op::Seek {
                invoked_ms: inv,
                lease: lease.to_string(),
                partition: p,
                token,
                to,
                resolved: (outcome == Outcome::Ok).then_some(to),
                outcome,
                error: None,
            },
        )
    }

    fn release(t: f64, inv: f64, lease: &str, p: i32, token: u64, outcome: Outcome) -> Event {
        ev(
            t,
            "client-1",
            Op::Release {
                invoked_ms: inv,
                lease: lease.to_string(),
                partition: p,
                token,
                outcome,
                error: None,
            },
        )
    }

    fn lease_ended(t: f64, lease: &str, p: i32, token: u64) -> Event {
        ev(
            t,
            "client-1",
            Op::LeaseEnded {
                lease: lease.to_string(),
                partition: p,
                token,
                reason: "expired".to_string(),
            },
        )
    }

    fn observed(t: f64, p: i32, offset: i64, token: Option<u64>) -> Event {
        ev(
            t,
            "observer",
            Op::Committed {
                partition: p,
                offset,
                token,
                metadata: token.map_or_else(String::new, |t| format!("kafka-lease token={t};")),
            },
        )
    }

    fn nemesis(t: f64, name: &str, phase: Phase, target: &str) -> Event {
        ev(
            t,
            "nemesis",
            Op::Nemesis {
                name: name.to_string(),
                phase,
                target: target.to_string(),
                took_effect: true,
                evidence: "test".to_string(),
            },
        )
    }

    fn final_(t: f64, p: i32, committed: i64, high_watermark: i64) -> Event {
        ev(
            t,
            "observer",
            Op::Final {
                partition: p,
                committed,
                high_watermark,
            },
        )
    }

    fn kinds(report: &Report) -> Vec<(AnomalyKind, Option<i32>)> {
        report
            .anomalies
            .iter()
            .map(|a| (a.kind, a.partition))
            .collect()
    }

    /// Two partitions: on 0 a clean handover (A releases before B acquires), duplicates after
    /// it and a seek back that explains the committed offset going back; on 1 a gateway killed
    /// under lease C, C's late batch after D took over, and D's first batch 80 ms after the kill.
    fn benign_history() -> Vec<Event> {
        let ok = Outcome::Ok;
        let mut h = Vec::new();
        for o in 0..10 {
            h.push(produced(1.0 + o as f64, 0, o));
        }
        for o in 0..4 {
            h.push(produced(1.5 + o as f64, 1, o));
        }
        h.push(ev(
            12.0,
            "producer",
            Op::ProduceUnknown {
                value: "u-1".to_string(),
                error: "timed out".to_string(),
            },
        ));
        h.extend([
            acquired(20.0, 15.0, "A", 0, 100, 0, "gw-1"),
            acquired(20.0, 18.0, "C", 1, 101, 0, "gw-1"),
            batch(24.0, "C", 1, 101, 0, 2),
            batch(25.0, "A", 0, 100, 0, 6),
            commit(32.0, 30.0, "A", 0, 100, 4, ok),
            observed(35.0, 0, 4, Some(100)),
            release(42.0, 40.0, "A", 0, 100, ok),
            acquired(50.0, 45.0, "B", 0, 200, 4, "gw-2"),
            batch(55.0, "B", 0, 200, 4, 10),
            commit(62.0, 60.0, "B", 0, 200, 10, ok),
            observed(65.0, 0, 10, Some(200)),
            seek(72.0, 70.0, "B", 0, 200, 6, ok),
            batch(75.0, "B", 0, 200, 6, 8),
            commit(82.0, 80.0, "B", 0, 200, 8, ok),
            observed(85.0, 0, 8, Some(200)),
            release(92.0, 90.0, "B", 0, 200, ok),
            nemesis(100.0, "kill-gateway", Phase::Start, "gw-1"),
            ev(
                155.0,
                "client-2",
                Op::AcquireFailed {
                    invoked_ms: 150.0,
                    outcome: Outcome::Unknown,
                    error: "deadline".to_string(),
                    via: "gw-1".to_string(),
                },
            ),
            acquired(160.0, 150.0, "D", 1, 202, 0, "gw-2"),
            batch(170.0, "C", 1, 101, 2, 3),
            batch(180.0, "D", 1, 202, 0, 4),
            commit(186.0, 185.0, "D", 1, 202, 4, ok),
            observed(190.0, 1, 4, Some(202)),
            nemesis(300.0, "kill-gateway", Phase::Stop, "gw-1"),
            final_(400.0, 0, 8, 10),
            final_(400.0, 1, 4, 4),
        ]);
        h
    }

    #[test]
    fn benign_history_is_valid_with_exact_figures() {
        let report = check(&benign_history());
        assert!(report.valid(), "{}", render_markdown(&report));
        assert_eq!(report.anomaly_count(), 0);

        let c = report.counts;
        let n = |k: OutcomeCounts| (k.ok, k.failed, k.unknown);
        assert_eq!(n(c.acquire), (4, 0, 1));
        assert_eq!(n(c.commit), (4, 0, 0));
        assert_eq!(n(c.seek), (1, 0, 0));
        assert_eq!(n(c.release), (2, 0, 0));
        assert_eq!(n(c.produce), (14, 0, 1));

        let d = &report.delivery;
        assert_eq!(d.produced, 14);
        assert_eq!(d.produce_unknown, 1);
        assert_eq!(d.batches, 6);
        assert_eq!(d.delivered, 14);
        assert_eq!(d.deliveries, 21);
        assert_eq!(d.duplicates, 7);
        assert_eq!(d.lost, 0);
        assert_eq!(d.late_batches, 1);
        let p0 = &d.partitions[0];
        assert_eq!((p0.final_committed, p0.high_watermark), (Some(8), Some(10)));
        assert_eq!((p0.delivered, p0.deliveries, p0.late_batches), (10, 14, 0));
        let p1 = &d.partitions[1];
        assert_eq!((p1.final_committed, p1.high_watermark), (Some(4), Some(4)));
        assert_eq!((p1.late_batches, p1.max_late_ms), (1, Some(10.0)));

        assert_eq!(report.faults.len(), 1);
        let f = &report.faults[0];
        assert_eq!((f.start_ms, f.stop_ms), (100.0, Some(300.0)));
        // Partition 0's lease B (gw-2) was released before the kill: only C moved.
        assert_eq!(f.failover_ms.len(), 1);
        let o = &f.failover_ms[0];
        assert_eq!(
            (o.partition, o.from_lease.as_str(), o.from_token),
            (1, "C", 101)
        );
        assert_eq!(o.ms, Some(80.0));
        assert_eq!((o.to_lease.as_deref(), o.to_token), (Some("D"), Some(202)));
        // Partition 1's batches at 24 and 170 straddle the fault's start.
        assert_eq!(f.gap_ms, Some(146.0));
        assert_eq!(f.gap_partition, Some(1));
        assert_eq!(f.gap_between_ms, Some((24.0, 170.0)));

        let k = &report.fault_kinds[0];
        assert_eq!(k.name, "kill-gateway");
        assert_eq!(
            (k.faults, k.took_effect, k.failovers, k.not_recovered),
            (1, 1, 1, 0)
        );
        assert_eq!(
            (k.failover_p50_ms, k.failover_p99_ms),
            (Some(80.0), Some(80.0))
        );
        assert_eq!((k.max_gap_ms, k.max_gap_partition), (Some(146.0), Some(1)));

        let text = render_markdown(&report);
        assert!(text.starts_with("# Verdict: valid\n"), "{text}");
        assert!(
            text.contains("| kill-gateway | 1 | 1 | 80 | 80 | 146 (p1) | 0 |"),
            "{text}"
        );
        assert!(text.contains("| acquire | 4 | 0 | 1 |"), "{text}");
    }

    #[test]
    fn order_written_does_not_matter() {
        let mut h = benign_history();
        h.reverse();
        let report = check(&h);
        assert!(report.valid());
        assert_eq!(report.delivery.duplicates, 7);
        assert_eq!(report.faults[0].failover_ms[0].ms, Some(80.0));
    }

    #[test]
    fn stale_holder_is_detected_and_late_batch_is_not() {
        let ok = Outcome::Ok;
        let h = vec![
            produced(1.0, 0, 0),
            acquired(10.0, 5.0, "A", 0, 1, 0, "gw-1"),
            // Before B was granted: fine.
            commit(16.0, 15.0, "A", 0, 1, 0, ok),
            acquired(20.0, 12.0, "B", 0, 2, 0, "gw-2"),
            // Invoked after B's grant, answered ok: the anomaly.
            commit(27.0, 25.0, "A", 0, 1, 3, ok),
            // Fenced as it should be: fine.
            seek(31.0, 30.0, "A", 0, 1, 0, Outcome::Failed),
            // In flight before the grant: fine.
            release(22.0, 19.0, "A", 0, 1, ok),
            // A batch received after the grant: late, not an anomaly.
            batch(23.5, "A", 0, 1, 0, 1),
        ];
        let report = check(&h);
        assert_eq!(kinds(&report), vec![(AnomalyKind::StaleHolder, Some(0))]);
        let a = &report.anomalies[0];
        assert!(
            a.description.contains("Lease A (token 1)"),
            "{}",
            a.description
        );
        assert!(
            a.description
                .contains("lease B (token 2) was granted at 20 ms"),
            "{}",
            a.description
        );
        let times: Vec<f64> = a.excerpt.iter().map(|e| e.t_ms).collect();
        assert_eq!(times, vec![10.0, 20.0, 27.0]);
        assert_eq!(report.delivery.late_batches, 1);
        assert_eq!(report.delivery.partitions[0].max_late_ms, Some(3.5));
        assert_eq!(report.counts.commit.ok, 2);
        assert_eq!(report.counts.seek.failed, 1);
        assert!(
            render_markdown(&report).starts_with("# Verdict: INVALID: 1 anomaly (1 stale-holder)")
        );
    }

    #[test]
    fn stale_holder_against_a_lease_seen_only_in_batches() {
        // A Subscribe member's lease has no Acquired: its first batch shows it held.
        let h = vec![
            produced(1.0, 0, 0),
            batch(10.0, "M", 0, 7, 0, 1),
            commit(13.0, 12.0, "L", 0, 6, 1, Outcome::Ok),
        ];
        let report = check(&h);
        assert_eq!(kinds(&report), vec![(AnomalyKind::StaleHolder, Some(0))]);
        assert!(report.anomalies[0]
            .description
            .contains("was seen holding the partition at 10 ms"));
    }

    #[test]
    fn overlapping_grants_are_detected() {
        let h = vec![
            // One token, two leases.
            acquired(10.0, 5.0, "A", 0, 5, 0, "gw-1"),
            acquired(20.0, 15.0, "B", 0, 5, 0, "gw-2"),
            // A smaller token granted after C's grant completed.
            acquired(10.0, 5.0, "C", 1, 9, 0, "gw-1"),
            acquired(20.0, 15.0, "D", 1, 7, 0, "gw-1"),
            // Concurrent with C's acquire (asked for before C's grant completed): fine.
            acquired(25.0, 5.0, "E", 1, 3, 0, "gw-1"),
        ];
        let report = check(&h);
        assert_eq!(
            kinds(&report),
            vec![
                (AnomalyKind::OverlappingGrant, Some(0)),
                (AnomalyKind::OverlappingGrant, Some(1))
            ]
        );
        assert!(report.anomalies[0]
            .description
            .contains("token 5 to 2 leases (A, B)"));
        assert!(report.anomalies[1]
            .description
            .contains("Lease D of partition 1 was granted token 7"));
        assert!(report.anomalies[1]
            .description
            .contains("token 9 of lease C"));
        assert_eq!(report.anomalies[1].excerpt.len(), 2);
        assert_eq!(
            report.anomaly_totals,
            vec![AnomalyTotal {
                kind: AnomalyKind::OverlappingGrant,
                count: 2
            }]
        );
    }

    #[test]
    fn token_regression_is_detected_once_per_drop() {
        let h = vec![
            commit(8.0, 7.0, "B", 0, 2, 5, Outcome::Ok),
            observed(10.0, 0, 5, Some(2)),
            // An old lease's commit that was answered unknown but landed.
            commit(19.0, 4.0, "A", 0, 1, 6, Outcome::Unknown),
            observed(20.0, 0, 6, Some(1)),
            observed(30.0, 0, 6, Some(1)),
        ];
        let report = check(&h);
        assert_eq!(
            kinds(&report),
            vec![(AnomalyKind::TokenRegression, Some(0))]
        );
        let a = &report.anomalies[0];
        let times: Vec<f64> = a.excerpt.iter().map(|e| e.t_ms).collect();
        assert_eq!(times, vec![8.0, 10.0, 19.0, 20.0]);
        assert!(
            a.description.contains("offset 6 with token 1 at 20 ms"),
            "{}",
            a.description
        );
        assert!(
            a.description
                .contains("offset 5 with the greater token 2 at 10 ms"),
            "{}",
            a.description
        );
    }

    /// The regression a late commit causes (the lease with token 29's commit, paused in its
    /// gateway, lands after the successor's) is that commit's when its gateway reported it,
    /// and an anomaly when nothing did; a report of another offset explains nothing.
    #[test]
    fn a_regression_to_a_commit_its_gateway_reported_late_is_not_an_anomaly() {
        let history = |reported: Option<(i64, u64)>| {
            let mut h = vec![
                commit(30.0, 29.0, "A", 5, 29, 520, Outcome::Ok),
                observed(31.0, 5, 520, Some(29)),
                commit(40.0, 39.0, "B", 5, 78, 673, Outcome::Ok),
                observed(41.0, 5, 673, Some(78)),
                // A's commit of 528, sent before its gateway stopped, lands when it goes on.
                observed(50.0, 5, 528, Some(29)),
                commit(60.0, 59.0, "B", 5, 78, 700, Outcome::Ok),
                observed(61.0, 5, 700, Some(78)),
            ];
            if let Some((offset, token)) = reported {
                h.push(ev(
                    90.0,
                    "g3",
                    Op::LateCommit {
                        partition: 5,
                        token,
                        offset,
                    },
                ));
            }
            h
        };
        let unreported = check(&history(None));
        assert_eq!(
            kinds(&unreported),
            vec![
                (AnomalyKind::TokenRegression, Some(5)),
                (AnomalyKind::CommitRegression, Some(5))
            ]
        );
        assert!(unreported.late_commits.is_empty());

        let reported = check(&history(Some((528, 29))));
        assert!(reported.valid(), "{:?}", kinds(&reported));
        assert_eq!(reported.late_commits.len(), 1);
        let late = &reported.late_commits[0];
        assert_eq!((late.partition, late.token, late.offset), (5, 29, 528));
        assert_eq!(late.gateway, "g3");
        assert_eq!(late.explains.len(), 2, "{:?}", late.explains);
        assert!(late.explains[0].starts_with("token-regression"));
        assert!(late.explains[1].starts_with("commit-regression"));
        let markdown = render_markdown(&reported);
        assert!(markdown.contains("## Late commits"), "{markdown}");
        assert!(markdown.contains("1, 1 of them seen to set the committed offset back"));

        // A report of another offset of the same lease explains nothing.
        let other = check(&history(Some((527, 29))));
        assert_eq!(other.anomaly_count(), 2);
        assert!(other.late_commits[0].explains.is_empty());
    }

    #[test]
    fn commit_regression_is_detected_unless_a_seek_explains_it() {
        let ok = Outcome::Ok;
        let h = vec![
            // 0: no seek.
            observed(10.0, 0, 100, Some(1)),
            observed(20.0, 0, 50, Some(1)),
            // 1: the lease sought to 40 before the reading.
            observed(10.0, 1, 100, Some(1)),
            seek(13.0, 12.0, "L1", 1, 1, 40, ok),
            observed(20.0, 1, 50, Some(1)),
            // 2: no token and no seek.
            observed(10.0, 2, 100, None),
            observed(20.0, 2, 50, None),
            // 3: no token, a seek between the readings.
            observed(10.0, 3, 100, None),
            seek(15.0, 14.0, "L3", 3, 1, 50, ok),
            observed(20.0, 3, 50, None),
            // 4: a seek, but to above the offset read.
            observed(10.0, 4, 100, Some(1)),
            seek(13.0, 12.0, "L4", 4, 1, 60, ok),
            observed(20.0, 4, 50, Some(1)),
            // 5: a seek of another token does not explain it.
            observed(10.0, 5, 100, Some(2)),
            seek(13.0, 12.0, "L5", 5, 1, 10, ok),
            observed(20.0, 5, 50, Some(2)),
        ];
        let report = check(&h);
        let partitions: Vec<Option<i32>> = report.anomalies.iter().map(|a| a.partition).collect();
        assert_eq!(partitions, vec![Some(0), Some(2), Some(4), Some(5)]);
        assert!(report
            .anomalies
            .iter()
            .all(|a| a.kind == AnomalyKind::CommitRegression));
        assert!(report.anomalies[0]
            .description
            .contains("went back from 100 (token 1) at 10 ms to 50 (token 1) at 20 ms"));
    }

    #[test]
    fn lost_records_are_listed_up_to_the_cap_with_the_exact_total() {
        let mut h = Vec::new();
        for o in 0..30 {
            h.push(produced(1.0, 0, o));
        }
        h.push(batch(40.0, "A", 0, 1, 0, 5));
        h.push(final_(100.0, 0, 30, 30));
        // Partition 1: no Final, the largest committed offset observed is 2.
        for o in 0..3 {
            h.push(produced(1.0, 1, o));
        }
        h.push(batch(40.0, "B", 1, 1, 0, 1));
        h.push(observed(50.0, 1, 2, Some(1)));
        // Partition 2: nothing says how far it was read; skipped.
        h.push(produced(1.0, 2, 0));
        let report = check(&h);
        let lost0: Vec<&Anomaly> = report
            .anomalies
            .iter()
            .filter(|a| a.partition == Some(0))
            .collect();
        let lost1: Vec<&Anomaly> = report
            .anomalies
            .iter()
            .filter(|a| a.partition == Some(1))
            .collect();
        assert_eq!(lost0.len(), 20);
        assert_eq!(lost1.len(), 1);
        assert!(lost0[0].description.starts_with("Record 5 of partition 0"));
        assert!(lost0[19]
            .description
            .contains("has 25 lost-record anomalies in all, the first 20 listed"));
        assert!(lost1[0].description.contains("Record 1 of partition 1"));
        assert!(lost1[0]
            .description
            .contains("largest committed offset observed 2"));
        assert_eq!(report.delivery.lost, 26);
        assert_eq!(report.delivery.partitions[0].lost, 25);
        assert_eq!(report.delivery.partitions[2].lost, 0);
        assert_eq!(report.anomaly_count(), 26);
        // The record, the batch before it and the Final.
        assert_eq!(lost0[0].excerpt.len(), 3);
    }

    #[test]
    fn wrong_and_phantom_values_are_detected() {
        let h = vec![
            produced(1.0, 0, 0),
            produced(2.0, 0, 1),
            ev(
                3.0,
                "producer",
                Op::ProduceUnknown {
                    value: "maybe".to_string(),
                    error: "timed out".to_string(),
                },
            ),
            ev(
                10.0,
                "client-1",
                Op::Batch {
                    lease: "A".to_string(),
                    partition: 0,
                    token: 1,
                    offsets: vec![0, 1, 2],
                    // A value written elsewhere; one never written; an unknown write that landed.
                    values: vec![value(0, 1), "ghost".to_string(), "maybe".to_string()],
                },
            ),
            ev(
                20.0,
                "client-1",
                Op::Batch {
                    lease: "A".to_string(),
                    partition: 0,
                    token: 1,
                    offsets: vec![0, 1],
                    values: vec![value(0, 1), "ghost".to_string()],
                },
            ),
        ];
        let report = check(&h);
        assert_eq!(
            kinds(&report),
            vec![
                (AnomalyKind::WrongValue, Some(0)),
                (AnomalyKind::PhantomRecord, Some(0))
            ]
        );
        assert!(report.anomalies[0]
            .description
            .contains("\"v0-1\" at offset 0"));
        assert!(report.anomalies[1]
            .description
            .contains("\"ghost\" at offset 1"));
        assert_eq!(report.delivery.deliveries, 5);
        assert_eq!(report.delivery.duplicates, 2);
    }

    #[test]
    fn a_lease_its_client_lets_go_during_a_fault_is_not_a_failover() {
        let mut h: Vec<Event> = (0..12).map(|o| produced(1.0, 0, o)).collect();
        h.extend([
            acquired(10.0, 5.0, "A", 0, 1, 0, "g1"),
            batch(20.0, "A", 0, 1, 0, 4),
            nemesis(100.0, "skew-gateway-clock", Phase::Start, "g1"),
            // The client's own choice, in the middle of the fault.
            ev(
                2000.0,
                "client-1",
                Op::LeaseEnded {
                    lease: "A".to_string(),
                    partition: 0,
                    token: 1,
                    reason: crate::history::ABANDONED.to_string(),
                },
            ),
            nemesis(3000.0, "skew-gateway-clock", Phase::Stop, "g1"),
            acquired(9000.0, 8990.0, "B", 0, 2, 4, "g2"),
            batch(9010.0, "B", 0, 2, 4, 12),
        ]);
        let report = check(&h);
        assert!(report.valid(), "{:?}", report.anomalies);
        let f = &report.faults[0].failover_ms;
        assert_eq!(f.len(), 1);
        assert!(f[0].let_go && !f[0].kept);
        assert_eq!(f[0].ms, None);
        let k = &report.fault_kinds[0];
        assert_eq!(
            (k.let_go, k.kept, k.not_recovered, k.failovers),
            (1, 0, 0, 0)
        );
        assert!(render_markdown(&report).contains("let go (p0)"));
        // The same lease lost to the fault (it ends with another reason) is a failover.
        for e in &mut h {
            if let Op::LeaseEnded { reason, .. } = &mut e.op {
                *reason = "read ended: lease lost".to_string();
            }
        }
        let report = check(&h);
        let f = &report.faults[0].failover_ms;
        assert!(!f[0].let_go);
        assert_eq!(f[0].ms, Some(8910.0));
    }

    #[test]
    fn a_lease_that_reads_on_after_the_fault_is_kept_not_failed_over() {
        let mut h: Vec<Event> = (0..12).map(|o| produced(1.0, 0, o)).collect();
        h.extend([
            acquired(10.0, 5.0, "A", 0, 1, 0, "g1"),
            batch(20.0, "A", 0, 1, 0, 4),
            nemesis(100.0, "kill-consul-leader", Phase::Start, "g1"),
            nemesis(3000.0, "kill-consul-leader", Phase::Stop, "g1"),
            // Suspended during the fault, the same lease reads on after it.
            batch(3100.0, "A", 0, 1, 5, 9),
            acquired(9000.0, 8990.0, "B", 0, 2, 10, "g2"),
            batch(9010.0, "B", 0, 2, 10, 12),
        ]);
        let report = check(&h);
        assert!(report.valid(), "{:?}", report.anomalies);
        let f = &report.faults[0].failover_ms;
        assert_eq!(f.len(), 1);
        assert!(f[0].kept);
        assert_eq!(f[0].ms, None);
        let k = &report.fault_kinds[0];
        assert_eq!((k.kept, k.not_recovered, k.failovers), (1, 0, 0));
        // The window runs from the fault's start to the end: B's grant, and the batches
        // of offsets 5..=8 and 10..=11, none delivered before.
        let w = &report.faults[0];
        assert_eq!((w.calls.ok, w.calls.failed, w.calls.unknown), (1, 0, 0));
        assert_eq!((w.delivered, w.duplicated), (6, 0));
        assert!(render_markdown(&report).contains("kept (p0)"));
    }

    #[test]
    fn failover_percentiles_and_recovery() {
        let mut h = vec![
            // Fault 1 on gw-1: partition 0 moves after 80 ms.
            acquired(10.0, 5.0, "A", 0, 1, 0, "gw-1"),
            nemesis(100.0, "kill-gateway", Phase::Start, "gw-1"),
            acquired(170.0, 150.0, "A2", 0, 2, 0, "gw-2"),
            batch(180.0, "A2", 0, 2, 0, 1),
            nemesis(200.0, "kill-gateway", Phase::Stop, "gw-1"),
        ];
        // Fault 2 on gw-2 at 1000: partitions 0, 1, 2 move after 100, 300, 500 ms; 3 never.
        for (p, (lease, moved)) in [("A2", 100.0), ("B", 300.0), ("C", 500.0), ("E", 0.0)]
            .into_iter()
            .enumerate()
        {
            let p = p as i32;
            let token = if p == 0 { 2 } else { 1 };
            if p != 0 {
                h.push(acquired(500.0, 490.0, lease, p, token, 0, "gw-2"));
            }
            if moved > 0.0 {
                h.push(acquired(
                    1000.0 + moved - 10.0,
                    1000.0,
                    "N",
                    p,
                    10,
                    0,
                    "gw-3",
                ));
                h.push(batch(1000.0 + moved, "N", p, 10, 0, 1));
            }
        }
        h.push(nemesis(1000.0, "kill-gateway", Phase::Start, "gw-2"));
        // Partition 4's lease on gw-2 ended before the fault: not counted.
        h.push(acquired(500.0, 490.0, "F", 4, 1, 0, "gw-2"));
        h.push(lease_ended(900.0, "F", 4, 1));
        // A fault on a Consul server moves nothing; its gap is measured.
        h.push(nemesis(
            2000.0,
            "partition-consul",
            Phase::Start,
            "consul-1",
        ));
        h.push(batch(1950.0, "N", 0, 10, 1, 2));
        h.push(batch(2100.0, "N", 0, 10, 2, 3));
        h.push(batch(2400.0, "N", 0, 10, 3, 4));
        for p in 0..4 {
            h.push(produced(1.0, p, 0));
        }
        for o in 1..4 {
            h.push(produced(1.0, 0, o));
        }
        h.push(nemesis(2200.0, "partition-consul", Phase::Stop, "consul-1"));
        let report = check(&h);
        assert!(report.valid(), "{}", render_markdown(&report));

        assert_eq!(report.faults.len(), 3);
        let f2 = &report.faults[1];
        assert_eq!(f2.stop_ms, None);
        let moved: Vec<(i32, Option<f64>)> =
            f2.failover_ms.iter().map(|o| (o.partition, o.ms)).collect();
        assert_eq!(
            moved,
            vec![
                (0, Some(100.0)),
                (1, Some(300.0)),
                (2, Some(500.0)),
                (3, None)
            ]
        );
        let consul = &report.faults[2];
        assert!(consul.failover_ms.is_empty());
        assert_eq!(
            (consul.gap_ms, consul.gap_partition),
            (Some(300.0), Some(0))
        );

        let k = &report.fault_kinds[0];
        assert_eq!(k.name, "kill-gateway");
        // Failovers 80, 100, 300, 500: nearest rank 2 of 4 and 4 of 4.
        assert_eq!((k.faults, k.failovers, k.not_recovered), (2, 4, 1));
        assert_eq!(
            (k.failover_p50_ms, k.failover_p99_ms),
            (Some(100.0), Some(500.0))
        );
        let c = &report.fault_kinds[1];
        assert_eq!(c.name, "partition-consul");
        assert_eq!((c.faults, c.failovers, c.failover_p50_ms), (1, 0, None));
        assert_eq!(c.max_gap_ms, Some(300.0));
    }

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(nearest_rank(&v, 50), Some(50.0));
        assert_eq!(nearest_rank(&v, 99), Some(99.0));
        assert_eq!(nearest_rank(&[7.0], 99), Some(7.0));
        assert_eq!(nearest_rank(&[], 50), None);
    }

    #[test]
    fn report_serializes_with_kebab_case_kinds() {
        let h = vec![
            acquired(10.0, 5.0, "A", 0, 5, 0, "gw-1"),
            acquired(20.0, 15.0, "B", 0, 5, 0, "gw-2"),
        ];
        let report = check(&h);
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["anomalies"][0]["kind"], "overlapping-grant");
        assert_eq!(json["anomaly_totals"][0]["count"], 1);
        assert_eq!(json["anomalies"][0]["excerpt"][1]["lease"], "B");
        let text = render_markdown(&report);
        assert!(
            text.contains("### 1. overlapping-grant, partition 0"),
            "{text}"
        );
        assert!(text.contains("```json\n{\"t_ms\":10.0"), "{text}");
    }

    /// One lease's turn in a generated history: records to read, whether it seeks back by
    /// some records and reads them again, whether it releases (else its lease ends), and
    /// whether a batch of it arrives late, after the next lease's grant.
    type Turn = (i64, i64, bool, bool);

    /// A correct sequential history: leases of one partition one after another, each reading
    /// on from the committed offset, committing, and letting go.
    fn sequential(records: i64, turns: &[Turn]) -> Vec<Event> {
        let ok = Outcome::Ok;
        let mut h: Vec<Event> = (0..records).map(|o| produced(o as f64, 0, o)).collect();
        let mut t = records as f64 + 10.0;
        let mut next = || {
            t += 10.0;
            t
        };
        let mut pos = 0;
        let mut late: Option<(String, u64, i64)> = None;
        for (n, &(read, back, releases, late_batch)) in turns.iter().enumerate() {
            let lease = format!("L{n}");
            let token = 10 * (n as u64 + 1);
            let inv = next();
            h.push(acquired(next(), inv, &lease, 0, token, pos, "gw-1"));
            if let Some((old, old_token, at)) = late.take() {
                h.push(batch(next(), &old, 0, old_token, at, at + 1));
            }
            let end = (pos + read).min(records);
            if end > pos {
                h.push(batch(next(), &lease, 0, token, pos, end));
                let inv = next();
                h.push(commit(next(), inv, &lease, 0, token, end, ok));
                h.push(observed(next(), 0, end, Some(token)));
                if back > 0 && end - back >= 0 {
                    let inv = next();
                    h.push(seek(next(), inv, &lease, 0, token, end - back, ok));
                    h.push(batch(next(), &lease, 0, token, end - back, end));
                    let inv = next();
                    h.push(commit(next(), inv, &lease, 0, token, end - back, ok));
                    h.push(observed(next(), 0, end - back, Some(token)));
                    let inv = next();
                    h.push(commit(next(), inv, &lease, 0, token, end, ok));
                    h.push(observed(next(), 0, end, Some(token)));
                }
                if late_batch {
                    late = Some((lease.clone(), token, end - 1));
                }
            }
            pos = end;
            if releases {
                let inv = next();
                h.push(release(next(), inv, &lease, 0, token, ok));
            } else {
                h.push(lease_ended(next(), &lease, 0, token));
            }
        }
        h.push(final_(next(), 0, pos, records));
        h
    }

    proptest! {
        #[test]
        fn sequential_correct_histories_are_valid(
            records in 1_i64..40,
            turns in proptest::collection::vec(
                (0_i64..12, 0_i64..4, any::<bool>(), any::<bool>()),
                1..10,
            ),
        ) {
            let h = sequential(records, &turns);
            let report = check(&h);
            prop_assert!(report.valid(), "{}", render_markdown(&report));
            let final_committed = report.delivery.partitions[0].final_committed.unwrap();
            prop_assert_eq!(report.delivery.lost, 0);
            prop_assert_eq!(report.delivery.produced, records as u64);
            prop_assert_eq!(report.delivery.delivered, final_committed as u64);
            prop_assert_eq!(report.counts.acquire.ok, turns.len() as u64);
        }
    }

    fn ack(
        t: f64,
        lease: &str,
        p: i32,
        token: u64,
        offset: i64,
        answer: &str,
        terminal: bool,
    ) -> Event {
        ev(
            t,
            "queue-1",
            Op::Ack {
                invoked_ms: t - 1.0,
                lease: lease.to_string(),
                partition: p,
                token,
                offset,
                attempt: 1,
                answer: answer.to_string(),
                terminal,
                outcome: Outcome::Ok,
                error: None,
            },
        )
    }

    fn dead_letter(t: f64, p: i32, offset: i64) -> Event {
        ev(
            t,
            "observer",
            Op::DeadLetter {
                partition: p,
                offset,
                token: Some(7),
                attempts: Some(1),
                reason: "chaos: rejected".to_string(),
            },
        )
    }

    /// A queue lease Q (token 7) starting at 0: 0 accepted, 1 retried then accepted, 2
    /// rejected (in the dead letter topic), 3 accepted; the gateway commits 4.
    fn queue_history() -> Vec<Event> {
        let mut h: Vec<Event> = (0..5).map(|o| produced(1.0 + o as f64, 0, o)).collect();
        h.extend([
            acquired(10.0, 9.0, "Q", 0, 7, 0, "gw-1"),
            batch(11.0, "Q", 0, 7, 0, 1),
            ack(12.0, "Q", 0, 7, 0, "accept", true),
            batch(13.0, "Q", 0, 7, 1, 2),
            ack(14.0, "Q", 0, 7, 1, "retry", false),
            batch(15.0, "Q", 0, 7, 1, 2),
            ack(16.0, "Q", 0, 7, 1, "accept", true),
            batch(17.0, "Q", 0, 7, 2, 3),
            ack(18.0, "Q", 0, 7, 2, "reject", true),
            batch(19.0, "Q", 0, 7, 3, 4),
            ack(20.0, "Q", 0, 7, 3, "accept", true),
            observed(30.0, 0, 4, Some(7)),
            final_(40.0, 0, 4, 5),
            dead_letter(41.0, 0, 2),
        ]);
        h
    }

    #[test]
    fn a_queue_that_commits_only_what_was_answered_is_valid() {
        let report = check(&queue_history());
        assert!(report.valid(), "{:?}", report.anomalies);
        assert_eq!(report.counts.ack.ok, 5);
    }

    #[test]
    fn a_queue_commit_past_a_record_answered_only_with_a_retry_is_caught() {
        let mut h = queue_history();
        // Record 1's second answer never came: only the retry, which is not the last
        // delivery, answered it.
        h.retain(|e| !(matches!(&e.op, Op::Ack { offset: 1, answer, .. } if answer == "accept")));
        let report = check(&h);
        assert_eq!(
            kinds(&report),
            vec![(AnomalyKind::UnansweredCommit, Some(0))]
        );
        assert!(report.anomalies[0]
            .description
            .contains("record 1 was never answered"));
    }

    #[test]
    fn a_rejected_record_passed_but_missing_from_the_dead_letter_topic_is_caught() {
        let mut h = queue_history();
        h.retain(|e| !matches!(e.op, Op::DeadLetter { .. }));
        let report = check(&h);
        // Record 2 is both: rejected (so counted as answered) and not dead-lettered.
        assert_eq!(kinds(&report), vec![(AnomalyKind::DeadLetterLost, Some(0))]);
    }

    #[test]
    fn a_record_the_gateway_dead_lettered_by_itself_may_be_passed_unanswered() {
        let mut h = queue_history();
        // Record 3's deliveries all timed out: the gateway dead-lettered it; no answer.
        h.retain(|e| !(matches!(&e.op, Op::Ack { offset: 3, .. })));
        h.push(dead_letter(42.0, 0, 3));
        let report = check(&h);
        assert!(report.valid(), "{:?}", report.anomalies);
    }
}
