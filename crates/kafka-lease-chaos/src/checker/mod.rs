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

use std::collections::{BTreeMap, HashSet};

use crate::history::{Event, Op, Outcome};

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

mod commits;
mod faults;
mod grants;
mod index;
mod queue;
mod reads;
mod render;
mod report;

pub use render::render_markdown;
pub use report::*;

use commits::{check_observations, check_stale};
use faults::{delivery, fault_kinds, faults};
use grants::check_grants;
use index::Index;
use queue::check_queue;
use reads::{check_lost, check_values};

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

/// An anomaly before its events are copied out.
#[derive(Debug)]
pub(super) struct Found {
    pub(super) kind: AnomalyKind,
    pub(super) partition: i32,
    pub(super) at_ms: f64,
    pub(super) description: String,
    /// The events that show it, the most telling first.
    pub(super) excerpt: Vec<usize>,
}

/// A time for a description: whole ms when it is whole, else to a tenth.
pub(super) fn ms(t: f64) -> String {
    if t.fract() == 0.0 {
        format!("{t:.0}")
    } else {
        format!("{t:.1}")
    }
}

pub(super) fn token_text(token: Option<u64>) -> String {
    token.map_or_else(|| "none".to_string(), |t| t.to_string())
}

/// The `invoked_ms` of a call.
pub(super) fn invoked_ms(e: &Event) -> Option<f64> {
    match &e.op {
        Op::Acquired { invoked_ms, .. }
        | Op::AcquireFailed { invoked_ms, .. }
        | Op::Commit { invoked_ms, .. }
        | Op::Seek { invoked_ms, .. }
        | Op::Release { invoked_ms, .. } => Some(*invoked_ms),
        _ => None,
    }
}

/// Lists the anomalies: grouped by kind and partition, in time order, at most
/// [`LISTED_PER_PARTITION`] a group, with their excerpts copied out.
pub(super) fn finish_anomalies(
    history: &[Event],
    found: Vec<Found>,
) -> (Vec<Anomaly>, Vec<AnomalyTotal>) {
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
pub(super) fn excerpt(history: &[Event], events: &[usize]) -> Vec<Event> {
    let mut picked: Vec<usize> = Vec::new();
    for &i in events {
        if !picked.contains(&i) && picked.len() < EXCERPT_LEN {
            picked.push(i);
        }
    }
    picked.sort_by(|&a, &b| history[a].t_ms.total_cmp(&history[b].t_ms).then(a.cmp(&b)));
    picked.into_iter().map(|i| history[i].clone()).collect()
}

#[cfg(test)]
mod tests;
