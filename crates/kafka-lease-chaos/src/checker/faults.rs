//! The fault figures: deliveries, each fault's window, failover and the longest pause.
use std::collections::{BTreeMap, HashMap, VecDeque};

use crate::history::{Event, Op, Phase};

use super::commits::Late;
use super::index::Part;
use super::{
    Delivery, Failover, Fault, FaultKindSummary, Index, OutcomeCounts, PartitionFigures,
    OPEN_FAULT_WINDOW_MS,
};

pub(super) fn delivery(
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
pub(super) fn faults(history: &[Event], ix: &Index<'_>) -> Vec<Fault> {
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
pub(super) fn failover(
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
pub(super) fn longest_gap(times: &[f64], start: f64, end: f64) -> Option<(f64, f64, f64)> {
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
pub(super) fn nearest_rank(sorted: &[f64], pct: usize) -> Option<f64> {
    let n = sorted.len();
    if n == 0 {
        return None;
    }
    let rank = (pct * n).div_ceil(100).clamp(1, n);
    sorted.get(rank - 1).copied()
}

pub(super) fn fault_kinds(faults: &[Fault]) -> Vec<FaultKindSummary> {
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
