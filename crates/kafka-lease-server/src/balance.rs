//! The assignment rule of subscriptions: which member of a (group, topic) is to hold which
//! partitions. Pure functions: one gateway computes each epoch's target assignment from one
//! view ([`next_target`]) and publishes it beside the topic's locks; every member moves
//! toward the newest target it has seen (`subscribe::member`). The argument is in
//! docs/ARCHITECTURE.md, "Subscriptions".
//!
//! The rule:
//! 1. The *pool* is every partition not held by a lease taken with Acquire (those keep
//!    working as they do).
//! 2. Quotas: the pool's size `Q` is shared out among the `M` members, `⌊Q/M⌋` or `⌈Q/M⌉`
//!    each, water-filled under each member's cap. The `⌈Q/M⌉` slots go to the members the
//!    previous target gave the most (ties by member id), so a settled group keeps its shares.
//! 3. A member keeps the lowest-numbered of the pool partitions the previous target gave it,
//!    up to its quota.
//! 4. The rest of the pool goes, in ascending order, to the members below their quota, in
//!    member-id order.
//!
//! Only what must move moves: a partition changes owner only if its owner left, the pool
//! lost it, or its owner's quota fell below what it had.

use std::collections::{BTreeMap, BTreeSet};

use crate::coordination::{GroupTarget, TopicView};

/// What one target is computed from, as one view shows it. A published target whose inputs
/// differ from a newer view's is out of date: the next epoch is due.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Inputs {
    pub(crate) partitions: i32,
    /// Member id → its cap (0: none).
    pub(crate) members: BTreeMap<String, u32>,
    /// The partitions held by leases that are not a member's (taken with Acquire, or whose
    /// holder record does not parse): outside the pool.
    pub(crate) reserved: BTreeSet<i32>,
}

impl Inputs {
    /// The inputs `view` shows, for a topic of `partitions` partitions (Kafka's count as
    /// this gateway knows it). A partition count below the view's target's is the target's:
    /// a topic's partitions are never removed, so a smaller count is metadata a moment old.
    pub(crate) fn of_view(view: &TopicView, partitions: i32) -> Inputs {
        let partitions = view
            .target
            .as_ref()
            .map_or(partitions, |t| partitions.max(t.target.partitions));
        let members = view
            .members
            .iter()
            .map(|(id, m)| (id.clone(), m.max_partitions))
            .collect();
        let reserved = view
            .held
            .iter()
            .filter(|(&p, h)| {
                p < partitions && h.holder.as_ref().is_none_or(|h| h.subscriber.is_empty())
            })
            .map(|(&p, _)| p)
            .collect();
        Inputs {
            partitions,
            members,
            reserved,
        }
    }

    /// The inputs `target` was computed from.
    pub(crate) fn of_target(target: &GroupTarget) -> Inputs {
        Inputs {
            partitions: target.partitions,
            members: target.members.clone(),
            reserved: target.reserved.clone(),
        }
    }

    fn pool(&self) -> Vec<i32> {
        (0..self.partitions)
            .filter(|p| !self.reserved.contains(p))
            .collect()
    }
}

/// Member id → the partitions it is to hold, ascending.
pub(crate) type Assignment = BTreeMap<String, Vec<i32>>;

/// The assignment of the next epoch for `inputs`, sticky to `basis`: partition → the member
/// it belonged to (the previous target's assignment; with none published yet, what each
/// member holds in the view).
pub(crate) fn next_target(basis: &BTreeMap<i32, String>, inputs: &Inputs) -> Assignment {
    let pool = inputs.pool();
    let mut had: BTreeMap<&str, Vec<i32>> = inputs
        .members
        .keys()
        .map(|m| (m.as_str(), Vec::new()))
        .collect();
    for p in &pool {
        if let Some(list) = basis.get(p).and_then(|m| had.get_mut(m.as_str())) {
            list.push(*p);
        }
    }
    let quotas = quotas(pool.len(), &inputs.members, &had);
    let mut assignment: Assignment = BTreeMap::new();
    let mut kept = BTreeSet::new();
    for (id, partitions) in &had {
        let quota = quotas.get(id).copied().unwrap_or(0);
        let keep: Vec<i32> = partitions.iter().copied().take(quota).collect();
        kept.extend(keep.iter().copied());
        assignment.insert((*id).to_string(), keep);
    }
    let mut rest = pool.iter().copied().filter(|p| !kept.contains(p));
    for (id, partitions) in assignment.iter_mut() {
        let quota = quotas.get(id.as_str()).copied().unwrap_or(0);
        partitions.extend(rest.by_ref().take(quota.saturating_sub(partitions.len())));
        partitions.sort_unstable();
    }
    assignment
}

/// The basis of the first target, when none is published: what each member holds in
/// `view`.
pub(crate) fn holdings(view: &TopicView) -> BTreeMap<i32, String> {
    view.held
        .iter()
        .filter_map(|(&p, h)| {
            let subscriber = &h.holder.as_ref()?.subscriber;
            (!subscriber.is_empty()).then(|| (p, subscriber.clone()))
        })
        .collect()
}

/// The basis a published target gives the next one: partition → its member.
pub(crate) fn owners(assignment: &Assignment) -> BTreeMap<i32, String> {
    assignment
        .iter()
        .flat_map(|(m, ps)| ps.iter().map(move |&p| (p, m.clone())))
        .collect()
}

/// How many partitions of `next` belong to another member than in `basis` (a partition
/// no one had counts: it is taken).
pub(crate) fn moves(basis: &BTreeMap<i32, String>, next: &Assignment) -> usize {
    owners(next)
        .iter()
        .filter(|(p, m)| basis.get(p) != Some(m))
        .count()
}

/// The fewest partitions any balanced assignment for `inputs` must move from `basis`,
/// worked out apart from [`next_target`] (a check on it): every pool partition must have a
/// member, and the most that can stay is, over the members, what each had capped by its
/// quota, with the larger quotas of the uncapped members paired with the larger holdings.
pub(crate) fn minimum_moves(basis: &BTreeMap<i32, String>, inputs: &Inputs) -> usize {
    let pool = inputs.pool();
    let mut had: BTreeMap<&str, usize> = inputs.members.keys().map(|m| (m.as_str(), 0)).collect();
    for p in &pool {
        if let Some(count) = basis.get(p).and_then(|m| had.get_mut(m.as_str())) {
            *count += 1;
        }
    }
    // The quotas: a binding cap is the member's own; the others share the rest evenly, and
    // which of them get the larger shares is free.
    let (caps, remaining) = binding_caps(pool.len(), &inputs.members);
    let (mut fixed, mut free_quotas, mut free_had) = (0, Vec::new(), Vec::new());
    for (id, &count) in &had {
        match caps.get(id) {
            Some(&cap) => fixed += count.min(cap),
            None => free_had.push(count),
        }
    }
    if let Some(n) = std::num::NonZeroUsize::new(free_had.len()) {
        let (share, extra) = (remaining / n, remaining % n);
        free_quotas = (0..n.get())
            .map(|i| share + usize::from(i < extra))
            .collect();
    }
    free_quotas.sort_unstable_by(|a, b| b.cmp(a));
    free_had.sort_unstable_by(|a, b| b.cmp(a));
    let paired: usize = free_quotas
        .iter()
        .zip(&free_had)
        .map(|(q, h)| (*q).min(*h))
        .sum();
    let assigned = if free_had.is_empty() {
        caps.values().sum::<usize>()
    } else {
        pool.len()
    };
    assigned - (fixed + paired)
}

/// The caps that bind when `total` partitions are water-filled over `members`: member →
/// its cap, for each member whose cap is at or below its even share of what the others
/// leave; and how many partitions remain for the rest. Independent of any order.
fn binding_caps(total: usize, members: &BTreeMap<String, u32>) -> (BTreeMap<&str, usize>, usize) {
    let cap = |m: &str| members.get(m).copied().unwrap_or(0) as usize;
    let mut open: Vec<&str> = members.keys().map(String::as_str).collect();
    let mut capped = BTreeMap::new();
    let mut remaining = total;
    while !open.is_empty() {
        let share = remaining / open.len();
        let binding: Vec<&str> = open
            .iter()
            .copied()
            .filter(|&m| cap(m) > 0 && cap(m) <= share)
            .collect();
        if binding.is_empty() {
            break;
        }
        for m in binding {
            capped.insert(m, cap(m));
            remaining -= cap(m);
            open.retain(|&o| o != m);
        }
    }
    (capped, remaining)
}

/// `total` water-filled over the members under their caps; of the others' shares, the
/// larger ones to the members that had the most, then by id.
fn quotas<'a>(
    total: usize,
    members: &'a BTreeMap<String, u32>,
    had: &BTreeMap<&str, Vec<i32>>,
) -> BTreeMap<&'a str, usize> {
    let (mut quotas, remaining) = binding_caps(total, members);
    let mut open: Vec<&str> = members
        .keys()
        .map(String::as_str)
        .filter(|m| !quotas.contains_key(m))
        .collect();
    let count = |m: &str| had.get(m).map_or(0, Vec::len);
    open.sort_by(|a, b| count(b).cmp(&count(a)).then(a.cmp(b)));
    if let Some(n) = std::num::NonZeroUsize::new(open.len()) {
        let (share, extra) = (remaining / n, remaining % n);
        for (i, m) in open.into_iter().enumerate() {
            quotas.insert(m, share + usize::from(i < extra));
        }
    }
    quotas
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs(partitions: i32, ids: &[&str]) -> Inputs {
        Inputs {
            partitions,
            members: ids.iter().map(|id| (id.to_string(), 0)).collect(),
            reserved: BTreeSet::new(),
        }
    }

    fn counts(assignment: &Assignment) -> Vec<usize> {
        assignment.values().map(Vec::len).collect()
    }

    /// Every pool partition exactly once, shares within one of each other (no caps).
    fn assert_balanced(assignment: &Assignment, inputs: &Inputs) {
        let all: Vec<i32> = owners(assignment).into_keys().collect();
        assert_eq!(all, inputs.pool(), "{assignment:?}");
        let (lo, hi) = (
            counts(assignment).into_iter().min().unwrap_or(0),
            counts(assignment).into_iter().max().unwrap_or(0),
        );
        assert!(hi - lo <= 1, "{assignment:?}");
    }

    #[test]
    fn a_lone_member_gets_every_partition_not_leased_by_acquire() {
        let mut inputs = inputs(6, &["a"]);
        inputs.reserved.insert(3);
        let target = next_target(&BTreeMap::new(), &inputs);
        assert_eq!(target["a"], vec![0, 1, 2, 4, 5]);
    }

    #[test]
    fn joins_and_leaves_move_exactly_the_minimum() {
        let mut basis = BTreeMap::new();
        let mut ids = vec![];
        let mut total = 0;
        for (join, expected) in [("m1", 12), ("m2", 6), ("m3", 4), ("m4", 3)] {
            ids.push(join);
            let inputs = inputs(12, &ids);
            let next = next_target(&basis, &inputs);
            assert_balanced(&next, &inputs);
            let moved = moves(&basis, &next);
            assert_eq!(moved, expected, "on the join of {join}: {next:?}");
            assert_eq!(moved, minimum_moves(&basis, &inputs));
            total += moved;
            basis = owners(&next);
        }
        assert_eq!(total, 25);
        // Two leave: their partitions, and only theirs, move.
        let before = basis.clone();
        let inputs = inputs(12, &["m1", "m3"]);
        let next = next_target(&basis, &inputs);
        assert_eq!(moves(&basis, &next), 6);
        assert_eq!(minimum_moves(&basis, &inputs), 6);
        for (p, m) in &before {
            if m == "m1" || m == "m3" {
                assert_eq!(owners(&next).get(p), Some(m), "partition {p} stayed");
            }
        }
        assert_eq!(counts(&next), vec![6, 6]);
    }

    #[test]
    fn uneven_shares_stay_with_who_has_them() {
        let basis: BTreeMap<i32, String> = [(0, "b"), (1, "b"), (2, "b"), (3, "a"), (4, "a")]
            .into_iter()
            .map(|(p, s)| (p, s.to_string()))
            .collect();
        let next = next_target(&basis, &inputs(5, &["a", "b"]));
        assert_eq!(next["b"], vec![0, 1, 2]);
        assert_eq!(next["a"], vec![3, 4]);
        assert_eq!(moves(&basis, &next), 0);
    }

    #[test]
    fn caps_are_kept_and_the_rest_goes_to_the_others() {
        let inputs = Inputs {
            partitions: 10,
            members: [("a".into(), 1), ("b".into(), 0), ("c".into(), 2)].into(),
            reserved: BTreeSet::new(),
        };
        let next = next_target(&BTreeMap::new(), &inputs);
        assert_eq!(counts(&next), vec![1, 7, 2]);
        // More cap than partitions: everyone under their cap, every partition assigned.
        let inputs = Inputs {
            partitions: 3,
            members: [("a".into(), 5), ("b".into(), 5)].into(),
            reserved: BTreeSet::new(),
        };
        let next = next_target(&BTreeMap::new(), &inputs);
        assert_eq!(owners(&next).len(), 3);
        assert_eq!(minimum_moves(&BTreeMap::new(), &inputs), 3);
    }

    #[test]
    fn a_departed_members_partitions_go_to_the_others() {
        let basis: BTreeMap<i32, String> = [(0, "gone"), (1, "a"), (2, "b")]
            .into_iter()
            .map(|(p, s)| (p, s.to_string()))
            .collect();
        let inputs = inputs(3, &["a", "b"]);
        let next = next_target(&basis, &inputs);
        assert_eq!(owners(&next).get(&1).map(String::as_str), Some("a"));
        assert_eq!(owners(&next).get(&2).map(String::as_str), Some("b"));
        assert_eq!(moves(&basis, &next), 1);
        assert_eq!(minimum_moves(&basis, &inputs), 1);
    }

    /// Random sequences of joins, leaves, cap changes and Acquire leases: every target is
    /// balanced and moves exactly the minimum worked out apart.
    #[test]
    fn every_change_of_a_random_sequence_moves_the_minimum() {
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        let mut rand = |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        for _ in 0..50 {
            let partitions = 1 + rand(16) as i32;
            let mut inputs = inputs(partitions, &[]);
            let mut basis = BTreeMap::new();
            for step in 0..60 {
                match rand(6) {
                    0 | 1 => {
                        let cap = if rand(4) == 0 { 1 + rand(3) as u32 } else { 0 };
                        inputs.members.insert(format!("m{step}"), cap);
                    }
                    2 | 3 => {
                        let ids: Vec<String> = inputs.members.keys().cloned().collect();
                        if !ids.is_empty() {
                            inputs.members.remove(&ids[rand(ids.len() as u64) as usize]);
                        }
                    }
                    4 => {
                        let p = rand(partitions as u64) as i32;
                        if !inputs.reserved.remove(&p) {
                            inputs.reserved.insert(p);
                        }
                    }
                    _ => inputs.partitions = (inputs.partitions + 1).min(24),
                }
                let next = next_target(&basis, &inputs);
                let all: BTreeSet<i32> = owners(&next).into_keys().collect();
                assert!(all.iter().all(|p| !inputs.reserved.contains(p)));
                assert_eq!(
                    moves(&basis, &next),
                    minimum_moves(&basis, &inputs),
                    "step {step}: {inputs:?} from {basis:?} gave {next:?}"
                );
                if inputs.members.values().all(|&c| c == 0) && !inputs.members.is_empty() {
                    assert_balanced(&next, &inputs);
                }
                basis = owners(&next);
            }
        }
    }
}
