//! What the readers got: in order, no gaps or repeats, the values produced, and no
//! acknowledged record lost.

use std::collections::{BTreeMap, HashSet};

use crate::history::{Event, Op};

use super::commits::{find_commit, observation};
use super::{invoked_ms, ms, token_text, AnomalyKind, Found, Index};

/// The regressions in the observer's readings, each handed to `found` with the reading that
/// went back.
pub(super) fn check_readings(
    history: &[Event],
    ix: &Index<'_>,
    found: &mut dyn FnMut(Found, usize),
) {
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
pub(super) fn check_values(history: &[Event], ix: &Index<'_>, found: &mut Vec<Found>) {
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
pub(super) fn check_lost(
    history: &[Event],
    ix: &Index<'_>,
    found: &mut Vec<Found>,
) -> BTreeMap<i32, u64> {
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
