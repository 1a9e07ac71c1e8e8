//! One holder, tokens that rise: the grants against each other.
use std::collections::BTreeMap;

use crate::history::{Event, Op};

use super::{invoked_ms, ms, AnomalyKind, Found, Index};

/// Overlapping grants: one token granted to two leases, or a grant whose token is not greater
/// than that of a grant completed before it was asked for.
pub(super) fn check_grants(history: &[Event], ix: &Index<'_>, found: &mut Vec<Found>) {
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

pub(super) fn lease_id(e: &Event) -> Option<&str> {
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
