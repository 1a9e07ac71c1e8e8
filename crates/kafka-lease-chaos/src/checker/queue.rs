//! Queue mode: no commit past a record not answered for good, no dead letter lost.
use std::collections::BTreeMap;

use crate::history::{Event, Op, Outcome};

use super::commits::observation;
use super::{ms, AnomalyKind, Found, Index};

/// Queue mode: the gateway commits a queue lease's progress, and may pass a record only once
/// it is done: answered for good by the lease (an ACCEPT; a REJECT or a RETRY at the last
/// delivery, which send it to the dead letter topic), or dead-lettered by the gateway (ack
/// deadlines missed to the last delivery). A record sent to the dead letter topic and passed
/// must be there. An answer whose outcome is unknown counts as given: it may have been
/// applied. A queue lease's records are one at a time in offset order (the workload's
/// queues keep partition order), so what was done is the prefix below the committed offset.
pub(super) fn check_queue(history: &[Event], ix: &Index<'_>, found: &mut Vec<Found>) {
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
