//! The assignment rule of subscriptions: which member of a (group, topic) should hold which
//! partitions. A pure function of the shared state (the topic's locks and its member records,
//! as one [`TopicView`](crate::coordination::TopicView) shows them), so every gateway computes
//! the same answer from the same view; each acts only for its own members.
//!
//! The rule (its convergence argument is in docs/ARCHITECTURE.md, "Subscriptions"):
//! 1. The *pool* is every partition not held by a lease taken with Acquire (those keep
//!    working as they do).
//! 2. Quotas: the pool's size `Q` is shared out among the `M` members, `⌊Q/M⌋` or `⌈Q/M⌉`
//!    each, water-filled under each member's cap. The `⌈Q/M⌉` slots go to the members that
//!    hold the most already (ties by member id), so a settled group keeps its shares.
//! 3. A member keeps the lowest-numbered of the pool partitions it holds, up to its quota,
//!    and gives up the rest.
//! 4. The free pool partitions (held by nobody) go, in ascending order, to the members below
//!    their quota, in member-id order. A partition being given up is not free until its
//!    holder releases it; the next view then hands it on.

use std::collections::{BTreeMap, BTreeSet};

/// Stands, in the picture a member plans from, for a partition the view shows held by this
/// member but which it no longer holds (its release is not in the view yet): in the pool,
/// not free, not this member's. Not a valid member id.
const RELEASING: &str = "\u{0}releasing";

/// A member's own picture of a topic, as it plans its share ([`member_share`]): the newest
/// view it has, and its own actions the view may not show yet.
#[derive(Clone, Debug, Default)]
pub(crate) struct Picture<'a> {
    pub(crate) partitions: i32,
    /// As the view shows it: partition → the member id of its holder's subscription, empty
    /// for a lease taken with Acquire.
    pub(crate) view_held: BTreeMap<i32, String>,
    /// As the view shows them: member id → its cap (0: none).
    pub(crate) view_members: BTreeMap<String, u32>,
    /// This member's id and cap.
    pub(crate) me: &'a str,
    pub(crate) my_cap: u32,
    /// The partitions this member holds or is taking, whatever the view says.
    pub(crate) mine: BTreeSet<i32>,
}

/// The rule applied to a member's own picture: its share of the topic. The partitions it
/// holds or is taking count as its own (the view may not show them yet), one the view shows
/// as its own but that it no longer holds counts as no one's but not free (its release is
/// not in the view yet: taking it back would move it twice), and the member counts among
/// the members whatever the view says.
pub(crate) fn member_share(picture: Picture<'_>) -> Option<Share> {
    let Picture {
        partitions,
        mut view_held,
        mut view_members,
        me,
        my_cap,
        mine,
    } = picture;
    for (p, subscriber) in view_held.iter_mut() {
        if subscriber == me && !mine.contains(p) {
            *subscriber = RELEASING.to_string();
        }
    }
    for &p in &mine {
        view_held.insert(p, me.to_string());
    }
    view_members.insert(me.to_string(), my_cap);
    plan(partitions, &view_held, &view_members).remove(me)
}

/// What one member should do about its share of a topic.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Share {
    /// How many partitions it should hold.
    pub(crate) quota: usize,
    /// Partitions it holds and keeps.
    pub(crate) keep: Vec<i32>,
    /// Partitions it holds beyond its quota: to give up.
    pub(crate) give_up: Vec<i32>,
    /// Free partitions it is to take.
    pub(crate) take: Vec<i32>,
}

/// The shares of every member. `held`: partition → the member id of the subscription whose
/// lease holds it, empty for a lease taken with Acquire. `members`: member id → its cap
/// (0: none). Partitions held by a subscription whose member is gone count as in the pool
/// but not free (they are released as their subscription ends).
pub(crate) fn plan(
    partitions: i32,
    held: &BTreeMap<i32, String>,
    members: &BTreeMap<String, u32>,
) -> BTreeMap<String, Share> {
    let pool: Vec<i32> = (0..partitions)
        .filter(|p| held.get(p).is_none_or(|subscriber| !subscriber.is_empty()))
        .collect();
    let mut holding: BTreeMap<&str, Vec<i32>> =
        members.keys().map(|m| (m.as_str(), Vec::new())).collect();
    for &p in &pool {
        if let Some(list) = held.get(&p).and_then(|m| holding.get_mut(m.as_str())) {
            list.push(p);
        }
    }
    let quotas = quotas(pool.len(), members, &holding);
    let mut free = pool.iter().copied().filter(|p| !held.contains_key(p));
    let mut shares = BTreeMap::new();
    for id in members.keys() {
        let quota = quotas.get(id.as_str()).copied().unwrap_or(0);
        let mine = holding.get(id.as_str()).cloned().unwrap_or_default();
        let kept = mine.len().min(quota);
        let take: Vec<i32> = free.by_ref().take(quota - kept).collect();
        shares.insert(
            id.clone(),
            Share {
                quota,
                keep: mine[..kept].to_vec(),
                give_up: mine[kept..].to_vec(),
                take,
            },
        );
    }
    shares
}

/// `total` water-filled over the members under their caps; the larger shares to the members
/// holding the most, then by id.
fn quotas<'a>(
    total: usize,
    members: &'a BTreeMap<String, u32>,
    holding: &BTreeMap<&str, Vec<i32>>,
) -> BTreeMap<&'a str, usize> {
    let mut open: Vec<&str> = members.keys().map(String::as_str).collect();
    let held = |m: &str| holding.get(m).map_or(0, Vec::len);
    open.sort_by(|a, b| held(b).cmp(&held(a)).then(a.cmp(b)));
    let cap = |m: &str| members.get(m).copied().unwrap_or(0) as usize;
    let mut quotas = BTreeMap::new();
    let mut remaining = total;
    while !open.is_empty() {
        let share = remaining / open.len();
        let capped: Vec<&str> = open
            .iter()
            .copied()
            .filter(|&m| cap(m) > 0 && cap(m) <= share)
            .collect();
        if capped.is_empty() {
            let extra = remaining % open.len();
            for (i, &m) in open.iter().enumerate() {
                let quota = share + usize::from(i < extra);
                quotas.insert(m, if cap(m) > 0 { quota.min(cap(m)) } else { quota });
            }
            break;
        }
        for m in capped {
            quotas.insert(m, cap(m));
            remaining -= cap(m);
            open.retain(|&o| o != m);
        }
    }
    quotas
}

#[cfg(test)]
mod tests {
    use super::*;

    fn picture<'a>(
        me: &'a str,
        held: &[(i32, &str)],
        members: &[&str],
        mine: &[i32],
    ) -> Picture<'a> {
        Picture {
            partitions: 6,
            view_held: held.iter().map(|&(p, m)| (p, m.to_string())).collect(),
            view_members: members.iter().map(|m| (m.to_string(), 0)).collect(),
            me,
            my_cap: 0,
            mine: mine.iter().copied().collect(),
        }
    }

    #[test]
    fn a_member_counts_what_it_is_taking_before_the_view_shows_it() {
        // The view shows nothing held yet; "a" is taking 0, 1 and 2 already.
        let share = member_share(picture("a", &[], &["a", "b"], &[0, 1, 2])).expect("a share");
        assert_eq!(
            (share.quota, share.keep, share.take),
            (3, vec![0, 1, 2], vec![])
        );
        // Not in the view's members yet, it still counts itself.
        let share = member_share(picture("c", &[], &["a", "b"], &[])).expect("a share");
        assert_eq!(share.quota, 2);
    }

    #[test]
    fn a_partition_the_view_still_shows_as_its_own_after_its_release_is_not_taken_back() {
        // "a" gave 2 up (released, not yet in the view): not free, not "a"'s; "a" takes
        // another free one instead of taking 2 back.
        let share = member_share(picture(
            "a",
            &[(0, "a"), (1, "a"), (2, "a")],
            &["a", "b"],
            &[0, 1],
        ))
        .expect("a share");
        assert_eq!(share.quota, 3);
        assert_eq!(share.keep, [0, 1]);
        assert_eq!(share.take, [3], "2 is on its way out, not free");
    }

    fn members(ids: &[&str]) -> BTreeMap<String, u32> {
        ids.iter().map(|id| (id.to_string(), 0)).collect()
    }

    /// Applies every member's plan at once (give up, then take), as the gateways would
    /// over a few views; returns the new holdings.
    fn settle(
        partitions: i32,
        mut held: BTreeMap<i32, String>,
        members: &BTreeMap<String, u32>,
    ) -> (BTreeMap<i32, String>, usize) {
        let mut moves = 0;
        for _ in 0..10 {
            let shares = plan(partitions, &held, members);
            let mut changed = false;
            for (id, share) in &shares {
                for p in &share.give_up {
                    held.remove(p);
                    changed = true;
                }
                for p in &share.take {
                    held.insert(*p, id.clone());
                    moves += 1;
                    changed = true;
                }
            }
            // Subscriptions of members that left end.
            let before = held.len();
            held.retain(|_, s| s.is_empty() || members.contains_key(s));
            changed |= held.len() != before;
            if !changed {
                return (held, moves);
            }
        }
        panic!("did not settle: {held:?}");
    }

    fn counts(held: &BTreeMap<i32, String>) -> BTreeMap<String, usize> {
        let mut counts = BTreeMap::new();
        for s in held.values() {
            *counts.entry(s.clone()).or_default() += 1;
        }
        counts
    }

    #[test]
    fn a_lone_member_takes_every_partition_not_leased_by_acquire() {
        let held = BTreeMap::from([(3, String::new())]);
        let shares = plan(6, &held, &members(&["a"]));
        assert_eq!(shares["a"].quota, 5);
        assert_eq!(shares["a"].take, vec![0, 1, 2, 4, 5]);
    }

    #[test]
    fn joins_move_only_what_must_move_and_shares_stay_within_one() {
        let mut held = BTreeMap::new();
        let mut ids = vec![];
        let mut total_moves = 0;
        for (join, expected_moves) in [("m1", 12), ("m2", 6), ("m3", 4), ("m4", 3)] {
            ids.push(join);
            let (next, moves) = settle(12, held, &members(&ids));
            held = next;
            let counts = counts(&held);
            let (lo, hi) = (counts.values().min(), counts.values().max());
            assert!(hi.unwrap() - lo.unwrap() <= 1, "{counts:?}");
            assert_eq!(held.len(), 12);
            // The moves on a join are exactly the new member's share.
            assert_eq!(moves, expected_moves, "on the join of {join}: {counts:?}");
            total_moves += moves;
        }
        assert_eq!(total_moves, 25);
        // Two leave: their partitions, and only theirs, move.
        let before = held.clone();
        let (after, moves) = settle(12, held, &members(&["m1", "m3"]));
        assert_eq!(moves, 6);
        for (p, s) in &before {
            if s == "m1" || s == "m3" {
                assert_eq!(after.get(p), Some(s), "partition {p} stayed");
            }
        }
        assert_eq!(
            counts(&after).values().copied().collect::<Vec<_>>(),
            vec![6, 6]
        );
    }

    #[test]
    fn uneven_shares_stay_with_who_has_them() {
        // 5 partitions, 2 members: whoever holds 3 keeps 3.
        let held: BTreeMap<i32, String> = [(0, "b"), (1, "b"), (2, "b"), (3, "a"), (4, "a")]
            .into_iter()
            .map(|(p, s)| (p, s.to_string()))
            .collect();
        let shares = plan(5, &held, &members(&["a", "b"]));
        assert_eq!(shares["b"].quota, 3);
        assert_eq!(shares["a"].quota, 2);
        assert!(shares
            .values()
            .all(|s| s.give_up.is_empty() && s.take.is_empty()));
    }

    #[test]
    fn caps_are_kept_and_the_rest_goes_to_the_others() {
        let members: BTreeMap<String, u32> = [
            ("a".to_string(), 1),
            ("b".to_string(), 0),
            ("c".to_string(), 2),
        ]
        .into();
        let (held, _) = settle(10, BTreeMap::new(), &members);
        assert_eq!(
            counts(&held),
            [("a".into(), 1), ("b".into(), 7), ("c".into(), 2)].into()
        );
        // More cap than partitions: everyone under their cap.
        let members: BTreeMap<String, u32> = [("a".to_string(), 5), ("b".to_string(), 5)].into();
        let (held, _) = settle(3, BTreeMap::new(), &members);
        assert_eq!(held.len(), 3);
    }

    #[test]
    fn a_departed_members_partitions_are_not_free_until_released() {
        let held: BTreeMap<i32, String> = [(0, "gone"), (1, "a")]
            .into_iter()
            .map(|(p, s)| (p, s.to_string()))
            .collect();
        let shares = plan(3, &held, &members(&["a", "b"]));
        // Pool of 3 (0 included), but only 2 is free now.
        assert_eq!(shares["a"].quota + shares["b"].quota, 3);
        let taken: Vec<i32> = shares.values().flat_map(|s| s.take.clone()).collect();
        assert_eq!(taken, vec![2]);
    }
}
