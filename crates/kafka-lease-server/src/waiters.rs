//! The Acquires of one (group, topic) on this gateway, and what they know of the topic's
//! locks: one [`TopicWaiters`] per (group, topic) that has Acquires in progress.
//!
//! Every Acquire takes a [`Ticket`] in arrival order. The line keeps the newest
//! [`TopicView`] of the topic's locks (from one shared watch while anyone waits, or a read by
//! the Acquire that found no watch running) and *offers* each partition it shows free to one
//! ticket: the oldest one that wants it. Only that ticket tries the lock; the others sleep.
//! So a release wakes one waiter on this gateway, not all of them, and the waiters are
//! served in the order they came. A partition is not offered while it is:
//! - held in the view (or found held by a failed attempt since: marked until the next view);
//! - offered to a ticket already;
//! - under lock-delay (the backend said so; marked until the delay ends);
//! - blocked in the local lease table (a lease, an attempt or an unconfirmed release here),
//!   which the gateway answers through the `blocked` function it gives the line.
//!
//! Lock order: a line's lock is taken before the gateway's table lock, never after.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::coordination::{HeldPartition, HolderInfo, TopicView};

/// Which partitions an Acquire takes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Wants {
    /// Exactly this one.
    One(i32),
    /// Any of `0..count`, preferring a free one of `preferred` (the partitions with records
    /// to read), and among those, or failing those among all, the first free one from
    /// `start` on (wrapping), so that Acquires that start together spread over the
    /// partitions.
    Any {
        start: i32,
        count: i32,
        preferred: Arc<BTreeSet<i32>>,
    },
}

impl Wants {
    fn pick(&self, free: &BTreeSet<i32>) -> Option<i32> {
        // The first of `set` from `start` on, wrapping.
        let from_start = |set: &BTreeSet<i32>, start: i32, count: i32| {
            set.range(start..count)
                .chain(set.range(0..start.min(count)))
                .copied()
                .find(|p| free.contains(p))
        };
        match self {
            Wants::One(p) => free.contains(p).then_some(*p),
            Wants::Any {
                start,
                count,
                preferred,
            } => from_start(preferred, *start, *count).or_else(|| from_start(free, *start, *count)),
        }
    }

    /// One past the highest partition it may take.
    fn bound(&self) -> i32 {
        match self {
            Wants::One(p) => p.saturating_add(1),
            Wants::Any { count, .. } => *count,
        }
    }

    /// Every partition it may take, in its order of preference.
    pub(crate) fn partitions(&self) -> Vec<i32> {
        match self {
            Wants::One(p) => vec![*p],
            Wants::Any {
                start,
                count,
                preferred,
            } => {
                let (mut first, rest): (Vec<i32>, Vec<i32>) = (0..*count)
                    .map(|i| (start + i) % count)
                    .partition(|p| preferred.contains(p));
                first.extend(rest);
                first
            }
        }
    }

    /// Any of `0..count` from `start` on, with no preference.
    #[cfg(test)]
    pub(crate) fn any(start: i32, count: i32) -> Wants {
        Wants::Any {
            start,
            count,
            preferred: Arc::default(),
        }
    }
}

/// Tells whether the local lease table blocks a partition of the line's topic.
pub(crate) type Blocked = Box<dyn Fn(i32) -> bool + Send + Sync>;

pub(crate) struct TopicWaiters {
    inner: Mutex<Inner>,
    blocked: Blocked,
    /// The shared watch that keeps `inner.view` current while it runs.
    watch: Mutex<Option<JoinHandle<()>>>,
    /// Held by the one Acquire reading the view when no watch runs (see [`Self::refresh`]).
    reading: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct Inner {
    view: Option<TopicView>,
    /// Counts the views taken, so Acquires that arrive together read the topic once.
    views: u64,
    next_seq: u64,
    /// Tickets by arrival.
    tickets: BTreeMap<u64, Slot>,
    /// Partition → the ticket it is offered to.
    offered: HashMap<i32, u64>,
    /// Partition → when the backend will let it be locked (its lock-delay, or a short pause
    /// after a local clash).
    delayed: HashMap<i32, Instant>,
}

struct Slot {
    wants: Wants,
    offer: Option<i32>,
    wake: Arc<Notify>,
}

impl std::fmt::Debug for TopicWaiters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = self.lock();
        f.debug_struct("TopicWaiters")
            .field("tickets", &inner.tickets.len())
            .field("offered", &inner.offered)
            .finish_non_exhaustive()
    }
}

impl TopicWaiters {
    pub(crate) fn new(blocked: Blocked) -> Arc<Self> {
        Arc::new(TopicWaiters {
            inner: Mutex::new(Inner::default()),
            blocked,
            watch: Mutex::new(None),
            reading: tokio::sync::Mutex::new(()),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Every critical section is a handful of map operations that cannot panic halfway.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A ticket at the back of the line.
    pub(crate) fn enqueue(self: &Arc<Self>, wants: Wants) -> Ticket {
        let wake = Arc::new(Notify::new());
        let seq = {
            let mut inner = self.lock();
            let seq = inner.next_seq;
            inner.next_seq += 1;
            inner.tickets.insert(
                seq,
                Slot {
                    wants,
                    offer: None,
                    wake: wake.clone(),
                },
            );
            seq
        };
        Ticket {
            line: self.clone(),
            seq,
            wake,
        }
    }

    /// Whether a watch keeps the view current (else an Acquire reads the topic itself).
    fn is_watched(&self) -> bool {
        self.watch
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .is_some_and(|task| !task.is_finished())
    }

    /// Starts the shared watch with `start` (given the view's index) unless it runs.
    fn ensure_watch(&self, start: impl FnOnce(u64) -> JoinHandle<()>) {
        let mut watch = self.watch.lock().unwrap_or_else(|p| p.into_inner());
        if watch.as_ref().is_some_and(|task| !task.is_finished()) {
            return;
        }
        let index = self.lock().view.as_ref().map_or(0, |v| v.index);
        *watch = Some(start(index));
    }

    /// For a line that has never had a view, whose only ticket is `seq` and wants one
    /// partition: takes an empty view (nothing held) instead of reading the topic, and offers
    /// from it. The ticket's one attempt at the lock then reads the key as a side effect: a
    /// partition found held is marked so, and the next refresh reads the topic. That saves
    /// the lone Acquire of a free partition a Consul round trip (issue 49); an Acquire of a
    /// held one pays a refused lock (a Raft write) instead of a read. Whether it did so.
    fn assume_free(&self, seq: u64) -> bool {
        let mut inner = self.lock();
        let alone = inner.tickets.len() == 1
            && inner
                .tickets
                .get(&seq)
                .is_some_and(|slot| matches!(slot.wants, Wants::One(_)));
        if inner.view.is_some() || !alone {
            return false;
        }
        inner.view = Some(TopicView::default());
        self.dispatch_locked(&mut inner);
        true
    }

    /// Brings the view up to date when no watch does: reads it with `read`, unless a view
    /// was taken while this call waited for another reader (Acquires that arrive together
    /// share one read), then offers what it shows free.
    async fn refresh<E, F>(&self, read: F) -> Result<(), E>
    where
        F: std::future::Future<Output = Result<TopicView, E>>,
    {
        let seen = self.lock().views;
        let _reader = self.reading.lock().await;
        if self.lock().views != seen {
            self.dispatch();
            return Ok(());
        }
        self.set_view(read.await?);
        Ok(())
    }

    /// The index of the view, for the watch to wait from.
    pub(crate) fn index(&self) -> u64 {
        self.lock().view.as_ref().map_or(0, |v| v.index)
    }

    /// Takes a newer view of the topic and offers what it shows free.
    pub(crate) fn set_view(&self, view: TopicView) {
        let mut inner = self.lock();
        inner.view = Some(view);
        inner.views += 1;
        self.dispatch_locked(&mut inner);
    }

    /// This gateway has just locked `partition` (or found it held): not free until a view
    /// says otherwise.
    fn mark_held(&self, partition: i32, held: HeldPartition) {
        let mut inner = self.lock();
        if let Some(view) = inner.view.as_mut() {
            view.held.insert(partition, held);
        }
    }

    /// This gateway has just released `partition`: offer it now, without waiting for the
    /// watch to report the release.
    pub(crate) fn mark_free(&self, partition: i32) {
        let mut inner = self.lock();
        if let Some(view) = inner.view.as_mut() {
            view.held.remove(&partition);
        }
        self.dispatch_locked(&mut inner);
    }

    /// `partition` may not be locked before `until`.
    fn mark_delayed(&self, partition: i32, until: Instant) {
        self.lock().delayed.insert(partition, until);
    }

    /// The earliest end of a delay, if any partition is delayed: when to look again.
    fn next_delay_end(&self) -> Option<Instant> {
        self.lock().delayed.values().min().copied()
    }

    /// Offers free partitions to the oldest tickets that want them.
    pub(crate) fn dispatch(&self) {
        let mut inner = self.lock();
        self.dispatch_locked(&mut inner);
    }

    fn dispatch_locked(&self, inner: &mut Inner) {
        let Some(view) = inner.view.as_ref() else {
            return;
        };
        let now = Instant::now();
        inner.delayed.retain(|_, until| *until > now);
        let idle = inner.tickets.values().filter(|s| s.offer.is_none());
        let Some(bound) = idle.map(|s| s.wants.bound()).max() else {
            return;
        };
        let mut free: BTreeSet<i32> = (0..bound)
            .filter(|p| {
                !view.held.contains_key(p)
                    && !inner.offered.contains_key(p)
                    && !inner.delayed.contains_key(p)
            })
            .collect();
        if free.is_empty() {
            return;
        }
        free.retain(|&p| !(self.blocked)(p));
        for (&seq, slot) in inner.tickets.iter_mut() {
            if free.is_empty() {
                break;
            }
            if slot.offer.is_some() {
                continue;
            }
            if let Some(p) = slot.wants.pick(&free) {
                free.remove(&p);
                slot.offer = Some(p);
                inner.offered.insert(p, seq);
                slot.wake.notify_one();
            }
        }
    }

    /// What is known of who holds each of `partitions`: the view's holder where it has one.
    fn holders(&self, partitions: &[i32]) -> Vec<(i32, Option<HolderInfo>)> {
        let inner = self.lock();
        partitions
            .iter()
            .map(|&p| {
                let holder = inner
                    .view
                    .as_ref()
                    .and_then(|v| v.held.get(&p))
                    .and_then(|h| h.holder.clone());
                (p, holder)
            })
            .collect()
    }

    /// Takes the offer away from ticket `seq` (it tried and failed, or left), and offers
    /// what became free.
    fn withdraw(&self, seq: u64, leaving: bool) {
        let mut inner = self.lock();
        let offer = if leaving {
            inner.tickets.remove(&seq).and_then(|s| s.offer)
        } else {
            inner.tickets.get_mut(&seq).and_then(|s| s.offer.take())
        };
        if let Some(p) = offer {
            if inner.offered.get(&p) == Some(&seq) {
                inner.offered.remove(&p);
            }
        }
        self.dispatch_locked(&mut inner);
    }
}

impl Drop for TopicWaiters {
    fn drop(&mut self) {
        let watch = self.watch.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Some(task) = watch.take() {
            task.abort();
        }
    }
}

/// One Acquire's place in its topic's line; leaving it (drop) gives up any offer.
pub(crate) struct Ticket {
    line: Arc<TopicWaiters>,
    seq: u64,
    wake: Arc<Notify>,
}

/// How a ticket's attempt at its offered partition went ([`Ticket::tried`]).
pub(crate) enum Tried {
    /// This gateway locked it, as `held`: the ticket is done.
    Locked(HeldPartition),
    /// Another instance holds it (its token comes with the next view).
    Held,
    /// Not to be tried again before the instant (a lock-delay, or a key still busy here).
    Delayed(Instant),
}

/// An Acquire's whole protocol with its topic's line: [`Ticket::offer_now`], then
/// [`Ticket::tried`] with what came of the partition offered, or [`Ticket::wait`] for one;
/// [`Ticket::holders`] for the answer when none came in time.
impl Ticket {
    /// The partition offered to this ticket now, once the line's view is current: kept so
    /// by the topic's watch when one runs, else read with `read` (Acquires that arrive
    /// together share one read), and what it shows free offered.
    pub(crate) async fn offer_now<E, F>(&self, read: F) -> Result<Option<i32>, E>
    where
        F: std::future::Future<Output = Result<TopicView, E>>,
    {
        if self.line.is_watched() {
            self.line.dispatch();
        } else if !self.line.assume_free(self.seq) {
            self.line.refresh(read).await?;
        }
        Ok(self.offer())
    }

    /// What came of trying `partition`, the one offered: unless it was locked, the offer goes
    /// back (the place in line stays) and the partition counts as taken or delayed until the
    /// view or the delay says otherwise.
    pub(crate) fn tried(&self, partition: i32, tried: Tried) {
        match tried {
            Tried::Locked(held) => return self.line.mark_held(partition, held),
            Tried::Held => self.line.mark_held(
                partition,
                HeldPartition {
                    token: None,
                    holder: None,
                },
            ),
            Tried::Delayed(until) => self.line.mark_delayed(partition, until),
        }
        self.decline();
    }

    /// Waits for an offer, the end of a partition's delay, or `deadline`, whichever comes
    /// first; starts the topic's shared watch with `watch` (given the line and the view's
    /// index) unless one runs.
    pub(crate) async fn wait(
        &self,
        deadline: Instant,
        watch: impl FnOnce(&Arc<TopicWaiters>, u64) -> JoinHandle<()>,
    ) {
        self.line.ensure_watch(|from| watch(&self.line, from));
        let wake_at = self
            .line
            .next_delay_end()
            .map_or(deadline, |t| t.min(deadline));
        tokio::select! {
            () = self.offered() => {}
            () = tokio::time::sleep_until(wake_at) => {}
        }
    }

    /// What is known of who holds each of `partitions`: the view's holder where it has one.
    pub(crate) fn holders(&self, partitions: &[i32]) -> Vec<(i32, Option<HolderInfo>)> {
        self.line.holders(partitions)
    }

    /// The partition offered to this ticket, if any.
    fn offer(&self) -> Option<i32> {
        self.line
            .lock()
            .tickets
            .get(&self.seq)
            .and_then(|s| s.offer)
    }

    /// The offered partition could not be taken: give it up (keeping the place in line).
    fn decline(&self) {
        self.line.withdraw(self.seq, false);
    }

    /// Waits for an offer (one that came before the call counts).
    async fn offered(&self) {
        self.wake.notified().await;
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.line.withdraw(self.seq, true);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::coordination::FencingToken;
    use std::sync::atomic::{AtomicBool, Ordering};

    fn held(partitions: &[i32]) -> TopicView {
        TopicView {
            index: 1,
            held: partitions
                .iter()
                .map(|&p| {
                    (
                        p,
                        HeldPartition {
                            token: Some(FencingToken::from_wire(1)),
                            holder: None,
                        },
                    )
                })
                .collect(),
            members: Default::default(),
            target: None,
        }
    }

    fn line() -> Arc<TopicWaiters> {
        TopicWaiters::new(Box::new(|_| false))
    }

    #[tokio::test]
    async fn a_freed_partition_goes_to_the_oldest_waiter_only() {
        let q = line();
        q.set_view(held(&[0, 1]));
        let tickets: Vec<Ticket> = (0..5).map(|_| q.enqueue(Wants::any(0, 2))).collect();
        assert!(tickets.iter().all(|t| t.offer().is_none()));
        q.mark_free(1);
        let offers: Vec<_> = tickets.iter().map(Ticket::offer).collect();
        assert_eq!(offers, vec![Some(1), None, None, None, None]);
        // The first one fails (another gateway took it): the partition is held again and
        // nobody else is offered it until a view says it is free.
        q.mark_held(
            1,
            HeldPartition {
                token: Some(FencingToken::from_wire(2)),
                holder: None,
            },
        );
        tickets[0].decline();
        assert!(tickets.iter().all(|t| t.offer().is_none()));
        // The next release goes to the oldest again, which kept its place.
        q.set_view(held(&[0]));
        assert_eq!(tickets[0].offer(), Some(1));
        assert!(tickets[1..].iter().all(|t| t.offer().is_none()));
    }

    #[tokio::test]
    async fn a_lone_acquire_of_one_partition_tries_it_without_reading_the_topic() {
        let reads = std::sync::atomic::AtomicUsize::new(0);
        let read = || async {
            reads.fetch_add(1, Ordering::SeqCst);
            Ok::<_, ()>(held(&[0]))
        };
        let q = line();
        let lone = q.enqueue(Wants::One(0));
        assert_eq!(lone.offer_now(read()).await, Ok(Some(0)), "offered unread");
        assert_eq!(reads.load(Ordering::SeqCst), 0);
        // Its attempt finds it held: the next look reads the topic.
        lone.tried(0, Tried::Held);
        assert_eq!(lone.offer_now(read()).await, Ok(None));
        assert_eq!(reads.load(Ordering::SeqCst), 1);
        drop(lone);
        // Not alone, or not one partition: the topic is read first.
        for wants in [vec![Wants::One(1), Wants::One(0)], vec![Wants::any(0, 2)]] {
            let q = line();
            let tickets: Vec<Ticket> = wants.into_iter().map(|w| q.enqueue(w)).collect();
            let before = reads.load(Ordering::SeqCst);
            let _ = tickets[tickets.len() - 1].offer_now(read()).await;
            assert_eq!(reads.load(Ordering::SeqCst), before + 1);
        }
    }

    #[tokio::test]
    async fn a_leaving_waiter_passes_its_offer_to_the_next() {
        let q = line();
        q.set_view(held(&[0]));
        let first = q.enqueue(Wants::One(0));
        let second = q.enqueue(Wants::any(0, 1));
        q.mark_free(0);
        assert_eq!(first.offer(), Some(0));
        assert_eq!(second.offer(), None);
        drop(first);
        assert_eq!(second.offer(), Some(0));
    }

    #[tokio::test]
    async fn waiters_get_the_partitions_they_want_in_order() {
        let q = line();
        q.set_view(held(&[0, 1, 2, 3]));
        let only_3 = q.enqueue(Wants::One(3));
        let any = q.enqueue(Wants::any(2, 4));
        let only_0 = q.enqueue(Wants::One(0));
        q.set_view(held(&[1]));
        assert_eq!(only_3.offer(), Some(3));
        // `any` prefers from its start (2) on.
        assert_eq!(any.offer(), Some(2));
        assert_eq!(only_0.offer(), Some(0));
    }

    #[test]
    fn any_prefers_a_free_partition_with_records_then_spreads_from_its_start() {
        let free: BTreeSet<i32> = [0, 1, 3].into_iter().collect();
        let with_records = |p: &[i32]| Wants::Any {
            start: 2,
            count: 4,
            preferred: Arc::new(p.iter().copied().collect()),
        };
        // From its start among those with records: 3 (2 is held), then around to 0.
        assert_eq!(with_records(&[0, 3]).pick(&free), Some(3));
        assert_eq!(with_records(&[0, 2]).pick(&free), Some(0));
        // Every partition with records is held: any free one, from the start on.
        assert_eq!(with_records(&[2]).pick(&free), Some(3));
        assert_eq!(Wants::any(2, 4).pick(&free), Some(3));
        assert_eq!(with_records(&[1]).partitions(), [1, 2, 3, 0]);
    }

    #[tokio::test(start_paused = true)]
    async fn delayed_and_locally_blocked_partitions_are_not_offered() {
        let blocked = Arc::new(AtomicBool::new(true));
        let q = TopicWaiters::new(Box::new({
            let blocked = blocked.clone();
            move |p| p == 1 && blocked.load(Ordering::SeqCst)
        }));
        q.set_view(held(&[]));
        q.mark_delayed(0, Instant::now() + std::time::Duration::from_secs(1));
        let t = q.enqueue(Wants::any(0, 2));
        q.dispatch();
        assert_eq!(t.offer(), None);
        blocked.store(false, Ordering::SeqCst);
        q.dispatch();
        assert_eq!(t.offer(), Some(1));
        q.mark_delayed(1, Instant::now() + std::time::Duration::from_secs(5));
        t.decline();
        assert_eq!(
            q.next_delay_end(),
            Some(Instant::now() + std::time::Duration::from_secs(1))
        );
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        q.dispatch();
        assert_eq!(t.offer(), Some(0));
    }

    #[tokio::test]
    async fn an_offer_made_before_the_wait_is_not_missed() {
        let q = line();
        q.set_view(held(&[0]));
        let t = q.enqueue(Wants::One(0));
        q.mark_free(0);
        // The notification came before anyone awaited it; the wait returns at once.
        tokio::time::timeout(std::time::Duration::from_secs(1), t.offered())
            .await
            .expect("the stored wake-up");
        assert_eq!(t.offer(), Some(0));
    }
}
