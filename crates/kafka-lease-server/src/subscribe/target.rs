//! Who writes a topic's next target assignment, and when: a member's side of the epochs
//! (docs/ARCHITECTURE.md, "Subscriptions"). Pure: [`TargetWriter::decide`] looks at a view
//! and says whether to write, and what; the member task makes the write and tells the
//! outcome back with [`TargetWriter::written`].

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use crate::balance;
use crate::coordination::{GroupTarget, TopicView};

/// How long a target may stay out of date before a member other than the one that
/// publishes first publishes it (its gateway may be cut off from Consul).
pub(super) const TARGET_TAKEOVER: Duration = Duration::from_millis(500);
/// After a write that failed (Consul unreachable or refusing), how long before this member
/// writes the topic's target again.
pub(super) const REWRITE_PAUSE: Duration = Duration::from_secs(1);

/// What a member does about a topic's target, on its newest view.
#[derive(Debug, PartialEq)]
pub(super) enum Publish {
    /// Nothing: the target is current, this member is not in the view, or it wrote (or is
    /// writing) the successor of the target the view shows.
    Nothing,
    /// Look again at this instant: the takeover of a late publication, or the end of the
    /// pause after a failed write.
    Later(Instant),
    /// Write `target`, a check-and-set on the target at `replaces` (`None`: there is none),
    /// moving `moves` partitions where `minimum` had to move.
    Now {
        target: GroupTarget,
        replaces: Option<u64>,
        moves: usize,
        minimum: usize,
    },
}

/// One member's writing of targets, per topic.
#[derive(Debug, Default)]
pub(super) struct TargetWriter {
    topics: HashMap<String, Writing>,
}

#[derive(Debug, Default)]
struct Writing {
    /// A write is in flight.
    publishing: bool,
    /// The index of the target this member last wrote a successor of (`Some(None)`: it
    /// wrote the first): while its view still shows that one, the write is not in the view
    /// yet (or lost to another writer's, not in it yet either), and is not made again.
    replaced: Option<Option<u64>>,
    /// Since when the published target is out of date, as this member saw it.
    stale_since: Option<Instant>,
    /// After a failed write: not written again before this instant, whatever the view.
    not_before: Option<Instant>,
}

impl TargetWriter {
    /// Whether member `member_id`, on `instance`, writes the next epoch's target of `topic`
    /// now that `view` (of a topic of `partitions` partitions) is its newest. When the view
    /// shows the published target out of date (computed from other members, another pool,
    /// or none yet), one member writes at once: the one with the lowest id in the view, the
    /// same on every gateway. Any other writes once the target has stayed out of date for
    /// [`TARGET_TAKEOVER`]. The write is a check-and-set on the target the view shows, so
    /// each epoch has one target whoever writes. After a failed write, none before
    /// [`REWRITE_PAUSE`] has passed.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn decide(
        &mut self,
        topic: &str,
        view: &TopicView,
        partitions: i32,
        member_id: &str,
        instance: &str,
        now: Instant,
        wall: SystemTime,
    ) -> Publish {
        let inputs = balance::Inputs::of_view(view, partitions);
        let published = view.target.as_ref();
        let writing = self.topics.entry(topic.to_string()).or_default();
        if published.is_some_and(|t| balance::Inputs::of_target(&t.target) == inputs) {
            writing.stale_since = None;
            return Publish::Nothing;
        }
        let replaces = published.map(|t| t.index);
        if !inputs.members.contains_key(member_id)
            || writing.publishing
            || writing.replaced == Some(replaces)
        {
            return Publish::Nothing;
        }
        if let Some(at) = writing.not_before.filter(|at| now < *at) {
            return Publish::Later(at);
        }
        let since = *writing.stale_since.get_or_insert(now);
        let first = inputs.members.keys().next().map(String::as_str) == Some(member_id);
        if !first && now < since + TARGET_TAKEOVER {
            return Publish::Later(since + TARGET_TAKEOVER);
        }
        let basis = match published {
            Some(t) => balance::owners(&t.target.assignment),
            None => balance::holdings(view),
        };
        let assignment = balance::next_target(&basis, &inputs);
        let (moves, minimum) = (
            balance::moves(&basis, &assignment),
            balance::minimum_moves(&basis, &inputs),
        );
        writing.publishing = true;
        writing.replaced = Some(replaces);
        writing.not_before = None;
        Publish::Now {
            target: GroupTarget {
                epoch: published.map_or(1, |t| t.target.epoch + 1),
                partitions: inputs.partitions,
                members: inputs.members,
                reserved: inputs.reserved,
                assignment,
                computed_by: instance.to_string(),
                computed_at_ms: crate::coordination::unix_ms(wall),
            },
            replaces,
            moves,
            minimum,
        }
    }

    /// The write of `topic`'s target came back: `written` is `Ok(true)` when it landed,
    /// `Ok(false)` when another epoch was written first (the next view shows it), and
    /// `Err(())` when it failed. After a failure the target is written again, whatever the
    /// view shows, at the instant returned (the member plans the topic again then).
    pub(super) fn written(
        &mut self,
        topic: &str,
        written: Result<bool, ()>,
        now: Instant,
    ) -> Option<Instant> {
        let writing = self.topics.entry(topic.to_string()).or_default();
        writing.publishing = false;
        match written {
            Ok(_) => None,
            Err(()) => {
                let at = now + REWRITE_PAUSE;
                writing.replaced = None;
                writing.not_before = Some(at);
                Some(at)
            }
        }
    }

    /// Whether a write of `topic`'s target is in flight.
    #[cfg(test)]
    fn publishing(&self, topic: &str) -> bool {
        self.topics.get(topic).is_some_and(|w| w.publishing)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::coordination::{MemberRecord, PublishedTarget};

    const TOPIC: &str = "t";

    fn view(members: &[&str], target: Option<(GroupTarget, u64)>) -> TopicView {
        TopicView {
            index: 7,
            held: BTreeMap::new(),
            members: members
                .iter()
                .map(|id| {
                    (
                        id.to_string(),
                        MemberRecord {
                            member_id: id.to_string(),
                            member: String::new(),
                            gateway: "g".into(),
                            max_partitions: 0,
                            joined_at_ms: 0,
                        },
                    )
                })
                .collect(),
            target: target.map(|(target, index)| PublishedTarget { target, index }),
        }
    }

    fn decide(writer: &mut TargetWriter, view: &TopicView, me: &str, now: Instant) -> Publish {
        writer.decide(TOPIC, view, 4, me, "g", now, SystemTime::now())
    }

    fn target_of(publish: Publish) -> (GroupTarget, Option<u64>) {
        match publish {
            Publish::Now {
                target, replaces, ..
            } => (target, replaces),
            other => panic!("expected a write, got {other:?}"),
        }
    }

    #[test]
    fn the_lowest_member_writes_at_once_and_another_after_the_takeover() {
        let now = Instant::now();
        let first = view(&["a", "b"], None);
        let (target, replaces) = target_of(decide(&mut TargetWriter::default(), &first, "a", now));
        assert_eq!((target.epoch, replaces), (1, None));
        assert_eq!(
            target.assignment["a"].len() + target.assignment["b"].len(),
            4
        );
        let mut b = TargetWriter::default();
        assert_eq!(
            decide(&mut b, &first, "b", now),
            Publish::Later(now + TARGET_TAKEOVER)
        );
        let (target, _) = target_of(decide(&mut b, &first, "b", now + TARGET_TAKEOVER));
        assert_eq!(target.epoch, 1);
    }

    #[test]
    fn a_target_is_written_once_per_view_that_shows_it_out_of_date() {
        let now = Instant::now();
        let mut a = TargetWriter::default();
        let stale = view(&["a"], None);
        let (target, _) = target_of(decide(&mut a, &stale, "a", now));
        assert!(a.publishing(TOPIC));
        // In flight, then landed, with the view not showing it yet: no second write.
        assert_eq!(decide(&mut a, &stale, "a", now), Publish::Nothing);
        assert_eq!(a.written(TOPIC, Ok(true), now), None);
        assert_eq!(decide(&mut a, &stale, "a", now), Publish::Nothing);
        // The view shows it: current. A member joins: epoch 2, replacing index 9.
        let current = view(&["a"], Some((target.clone(), 9)));
        assert_eq!(decide(&mut a, &current, "a", now), Publish::Nothing);
        let joined = view(&["a", "b"], Some((target, 9)));
        let (next, replaces) = target_of(decide(&mut a, &joined, "a", now));
        assert_eq!((next.epoch, replaces), (2, Some(9)));
    }

    /// A failed write is made again after [`REWRITE_PAUSE`], not at once: the member plans
    /// the topic again as soon as the write comes back, and Consul may be failing fast.
    #[test]
    fn a_failed_write_is_made_again_after_its_pause_and_not_before() {
        let now = Instant::now();
        let mut a = TargetWriter::default();
        let stale = view(&["a"], None);
        target_of(decide(&mut a, &stale, "a", now));
        let retry = a.written(TOPIC, Err(()), now);
        assert_eq!(retry, Some(now + REWRITE_PAUSE));
        assert_eq!(
            decide(&mut a, &stale, "a", now),
            Publish::Later(now + REWRITE_PAUSE)
        );
        assert_eq!(
            decide(&mut a, &stale, "a", now + REWRITE_PAUSE / 2),
            Publish::Later(now + REWRITE_PAUSE)
        );
        let (target, replaces) = target_of(decide(&mut a, &stale, "a", now + REWRITE_PAUSE));
        assert_eq!((target.epoch, replaces), (1, None));
        // Another member's target landing meanwhile ends the matter.
        let mut b = TargetWriter::default();
        target_of(decide(&mut b, &stale, "a", now));
        b.written(TOPIC, Err(()), now);
        let current = view(&["a"], Some((target, 3)));
        assert_eq!(decide(&mut b, &current, "a", now), Publish::Nothing);
    }

    #[test]
    fn a_member_not_in_the_view_writes_nothing() {
        let stale = view(&["a"], None);
        assert_eq!(
            decide(&mut TargetWriter::default(), &stale, "z", Instant::now()),
            Publish::Nothing
        );
    }
}
