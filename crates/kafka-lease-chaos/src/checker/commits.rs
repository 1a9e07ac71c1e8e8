//! The committed offsets as Kafka showed them: a stale holder's commit refused, no commit
//! going back, and the late commits the contract allows.

use std::collections::BTreeMap;

use crate::history::{Event, Op, Outcome};

use super::reads::check_readings;
use super::{ms, AnomalyKind, Found, Index, LateCommit};

/// Late batches of one partition: how many, and the most late.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Late {
    pub(super) count: u64,
    pub(super) max_ms: Option<f64>,
}

/// Stale holders: a call of a lease that took effect though it was invoked after a lease with
/// a greater token had been granted. Counts the late batches too.
pub(super) fn check_stale(
    history: &[Event],
    ix: &Index<'_>,
    found: &mut Vec<Found>,
) -> BTreeMap<i32, Late> {
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
pub(super) fn find_commit(
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

pub(super) fn observation(e: &Event) -> Option<(i64, Option<u64>)> {
    match &e.op {
        Op::Committed { offset, token, .. } => Some((*offset, *token)),
        _ => None,
    }
}

/// The observer's readings: the token must never go back; the offset must not go back unless
/// a Seek explains it. A regression to a commit its gateway reported late is that commit's
/// (returned, with the late commits nothing showed), not an anomaly.
pub(super) fn check_observations(
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
