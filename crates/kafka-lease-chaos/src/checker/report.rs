//! What the checker reports: the verdict, its anomalies, the counts and the fault figures.
use std::fmt;

use serde::Serialize;

use crate::history::{Event, Outcome};

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
    pub(super) fn add(&mut self, outcome: Outcome) {
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
