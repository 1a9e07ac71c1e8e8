//! The member task: one per subscription on the instance its stream is on. It plans its
//! share from each topic's newest view ([`crate::balance`]), takes and revokes leases, and
//! merges their Reads fairly into the client's stream.
//!
//! Longer than most files here because it is one actor: its state and the handlers that
//! change it (a view, a take's answer, a Read's batch, a reattach, a revoke) are one type's
//! methods, and split over files they would hide which handler may change what.

use std::collections::{HashMap, HashSet};
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::stream::{SelectAll, Stream, StreamExt};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;

use crate::coordination::{LockKey, MemberRecord, TopicView};
use crate::error::LeaseError;
use crate::gateway::{AcquireSpec, Gateway, Granted};
use crate::lease::{DeliverSettings, Delivered, Lease, LeaseId, ReadBatch, SharedWindow};

use super::members::MemberClaim;
use super::stream::watch_topic;
use super::target::{Publish, TargetWriter};
use super::{Attach, Ended, Reattach, SubscribeSpec, SubscriptionEvent};

/// How long an attempt at a partition the rule gives this member may wait for it: not at
/// all. A take is tried only on a partition free in the member's newest view, and only once
/// per plan; a waiting one would be granted whenever the partition frees, to a plan that
/// may be stale by then (a partition its holder gave up for a newcomer went to the wrong
/// member: issue 32). The argument is in docs/ARCHITECTURE.md, "Subscriptions".
const TAKE_WAIT: Duration = Duration::ZERO;
/// After a take that failed for a reason no view change follows (the partition is under a
/// lock-delay, its key is still being released on this gateway, the gateway's own view
/// of the topic was a moment behind), how long before the rule runs again on the newest
/// view; under a noted lock-delay, the rest of the delay instead.
const RETAKE_PAUSE: Duration = Duration::from_millis(50);
/// After a take that failed otherwise (Consul unreachable, a limit reached).
const RETAKE_PAUSE_ERROR: Duration = Duration::from_secs(1);
/// The longest lock-delay asked about.
const DELAY_CAP: Duration = Duration::from_secs(60);
/// A subscription lease's TTL beyond its revoke grace: while the subscription reads it, its
/// open Read keeps it alive; this bounds a lease whose subscription task is gone.
const LEASE_TTL_MARGIN: Duration = Duration::from_secs(10);
/// How often a revoke in queue mode looks whether the lease's deliveries are all answered.
const REVOKE_POLL: Duration = Duration::from_millis(20);
/// How long an ending subscription waits for its attempts in flight, to release what they
/// took.
const CLEANUP_WAIT: Duration = Duration::from_secs(5);
/// A lease the member holds.
struct Held {
    lease_id: LeaseId,
    lease: Arc<Lease>,
    /// As granted, to announce it again to a client that takes the member over.
    granted: Granted,
    /// The end of its revoke grace, once revoking.
    deadline: Option<SystemTime>,
    /// Drives the lease's Read into its channel in the merged stream. A Read must be polled
    /// to notice that its lease ends (a batch being filled holds the partition's feed until
    /// then), and the merged stream is polled only as fast as the client reads; so each Read
    /// runs in a task of its own, one batch ahead at most, and aborting the task (a revoke,
    /// the member leaving) closes the Read at once.
    pump: JoinHandle<()>,
    revoking: bool,
    /// The offset after the last batch of this lease handed to the client's stream (put in
    /// its records channel); `None` while none was. A batch the pump read ahead but the
    /// member never handed on does not count (the next holder starts at the last commit
    /// and reads it); one in the channel when `revoking` overtakes it does (the stream
    /// drops it, but it counts as handed: conservative).
    handed: Option<i64>,
}

impl Held {
    /// Whether nothing was handed to the client since its last commit on this lease (or
    /// nothing at all): a revoke then has nothing to wait for.
    fn idle(&self) -> bool {
        match self.lease.queue() {
            Some(queue) => queue.in_flight() == 0,
            None => self
                .handed
                .is_none_or(|end| self.lease.committed() == Some(end)),
        }
    }
}

/// What the member's own tasks report back.
enum Done {
    Acquired {
        topic: String,
        partition: i32,
        result: Result<Granted, LeaseError>,
    },
    Released {
        topic: String,
        partition: i32,
        lease_id: LeaseId,
    },
    /// A write of the topic's next target is over: landed (`Ok(true)`), beaten to it by
    /// another epoch (`Ok(false)`), or failed.
    Published {
        topic: String,
        written: Result<bool, ()>,
    },
}

/// One lease's Read in the merged stream.
type LeaseRead = Pin<Box<dyn Stream<Item = ReadItem> + Send>>;

/// A batch of one lease: records of a Read, or deliveries of a queue.
enum LeaseBatch {
    Read(ReadBatch),
    Deliveries(Delivered),
}

/// What a lease's Read (or Deliver, in queue mode) gives the member: a batch or its error,
/// then `None` when it ends by itself.
struct ReadItem {
    topic: String,
    partition: i32,
    lease_id: LeaseId,
    item: Option<Result<LeaseBatch, LeaseError>>,
}

pub(super) struct Member {
    /// Dropped last, after `finish` released the leases and removed the records.
    claim: MemberClaim,
    /// Given to the gateway when the stream goes, for a new one to reach this task.
    attach: Reattach,
    attach_rx: mpsc::UnboundedReceiver<Attach>,
    /// Whether a client's stream is attached.
    attached: bool,
    /// When a detached member leaves.
    detached_until: Option<tokio::time::Instant>,
    gateway: Arc<Gateway>,
    record: MemberRecord,
    spec: SubscribeSpec,
    control: mpsc::UnboundedSender<Result<SubscriptionEvent, LeaseError>>,
    records: mpsc::Sender<SubscriptionEvent>,
    views_rx: mpsc::Receiver<(String, TopicView)>,
    done: mpsc::UnboundedSender<Done>,
    done_rx: mpsc::UnboundedReceiver<Done>,
    watchers: Vec<JoinHandle<()>>,
    /// (topic, partition) → the lease.
    held: HashMap<(String, i32), Held>,
    /// Attempts in flight.
    pending: HashSet<(String, i32)>,
    /// Partitions whose take failed a moment ago: not tried again before the instant, when
    /// the rule runs again on the topic's newest view.
    not_before: HashMap<(String, i32), tokio::time::Instant>,
    /// Whether and when this member writes each topic's next target.
    targets: TargetWriter,
    /// Topics to plan again at an instant (a takeover of a late publication, a retry).
    replan_at: HashMap<String, tokio::time::Instant>,
    merged: SelectAll<LeaseRead>,
    /// The newest view of each topic.
    views: HashMap<String, TopicView>,
    /// In queue mode, the window of deliveries the member's leases share.
    window: Option<Arc<SharedWindow>>,
}

impl Member {
    /// Starts the task of a member that has joined its topics as `record`: it watches each
    /// topic and takes its share; its events go to `control`, its batches to `records`.
    pub(super) fn start(
        claim: MemberClaim,
        gateway: Arc<Gateway>,
        record: MemberRecord,
        spec: SubscribeSpec,
        control: mpsc::UnboundedSender<Result<SubscriptionEvent, LeaseError>>,
        records: mpsc::Sender<SubscriptionEvent>,
    ) {
        let (views, views_rx) = mpsc::channel(16);
        let watchers = spec
            .topics
            .iter()
            .map(|topic| {
                tokio::spawn(watch_topic(
                    gateway.clone(),
                    spec.group.clone(),
                    topic.clone(),
                    views.clone(),
                ))
            })
            .collect();
        let (done, done_rx) = mpsc::unbounded_channel();
        let (attach, attach_rx) = mpsc::unbounded_channel();
        let window = spec.queue.as_ref().map(|queue| {
            SharedWindow::new(
                queue.settings.window.max_records,
                queue.settings.window.max_bytes,
            )
        });
        let member = Member {
            attach,
            attach_rx,
            attached: true,
            detached_until: None,
            claim,
            gateway,
            record,
            spec,
            control,
            records,
            views_rx,
            done,
            done_rx,
            watchers,
            held: HashMap::new(),
            pending: HashSet::new(),
            not_before: HashMap::new(),
            targets: TargetWriter::default(),
            replan_at: HashMap::new(),
            merged: SelectAll::new(),
            views: HashMap::new(),
            window,
        };
        tokio::spawn(member.run());
    }

    async fn run(mut self) {
        let mut stopping = self.gateway.stopping();
        let mut permit: Option<mpsc::OwnedPermit<SubscriptionEvent>> = None;
        loop {
            if *stopping.borrow_and_update() {
                let _ = self.control.send(Err(LeaseError::ShuttingDown));
                break;
            }
            let want_permit = permit.is_none() && self.attached;
            let can_read = permit.is_some() && !self.merged.is_empty();
            let leave_at = self
                .detached_until
                .unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(3600));
            let retake_at = self
                .not_before
                .values()
                .chain(self.replan_at.values())
                .min()
                .copied();
            tokio::select! {
                biased;
                () = self.control.closed(), if self.attached => {
                    if self.spec.session_grace.is_zero() {
                        break;
                    }
                    // The client is gone: the member stays, with its leases (their Reads
                    // stay open, so they stay alive), for its session grace.
                    permit = None;
                    self.attached = false;
                    self.detached_until =
                        Some(tokio::time::Instant::now() + self.spec.session_grace);
                    self.claim.detach(self.attach.clone());
                    tracing::info!(
                        member_id = %self.spec.member_id,
                        grace = ?self.spec.session_grace,
                        "member detached; it keeps its leases for its session grace",
                    );
                }
                Some(attach) = self.attach_rx.recv(), if !self.attached => {
                    permit = None;
                    self.reattach(attach);
                }
                () = tokio::time::sleep_until(leave_at), if !self.attached => break,
                changed = stopping.changed() => if changed.is_err() { break },
                Some(done) = self.done_rx.recv() => {
                    // The rule again, on the newest view: a view that came while this
                    // action was in flight could not count it.
                    let topic = self.on_done(done).await;
                    self.replan(&topic).await;
                }
                () = tokio::time::sleep_until(retake_at.unwrap_or(leave_at)),
                    if retake_at.is_some() =>
                {
                    let now = tokio::time::Instant::now();
                    let mut due: Vec<String> = self
                        .not_before
                        .iter()
                        .filter(|(_, at)| **at <= now)
                        .map(|((topic, _), _)| topic.clone())
                        .collect();
                    self.not_before.retain(|_, at| *at > now);
                    due.extend(
                        self.replan_at
                            .iter()
                            .filter(|(_, at)| **at <= now)
                            .map(|(topic, _)| topic.clone()),
                    );
                    self.replan_at.retain(|_, at| *at > now);
                    due.sort();
                    due.dedup();
                    for topic in due {
                        self.replan(&topic).await;
                    }
                }
                Some((topic, view)) = self.views_rx.recv() => self.on_view(&topic, view).await,
                reserved = self.records.clone().reserve_owned(), if want_permit => match reserved {
                    Ok(reserved) => permit = Some(reserved),
                    Err(_) => break,
                },
                Some(read) = self.merged.next(), if can_read => {
                    self.on_read(read, &mut permit);
                }
            }
        }
        self.finish().await;
    }

    fn on_read(
        &mut self,
        read: ReadItem,
        permit: &mut Option<mpsc::OwnedPermit<SubscriptionEvent>>,
    ) {
        let ReadItem {
            topic,
            partition,
            lease_id,
            item,
        } = read;
        // Nothing of a lease that has moved on, or is being revoked (its Read was stopped,
        // but a batch may still sit in its channel), leaves the member.
        if self
            .held
            .get(&(topic.clone(), partition))
            .is_none_or(|h| h.lease_id != lease_id || h.revoking)
        {
            return;
        }
        match item {
            Some(Ok(LeaseBatch::Read(batch))) => {
                if let Some(permit) = permit.take() {
                    if let (Some(held), Some(last)) = (
                        self.held.get_mut(&(topic.clone(), partition)),
                        batch.records.last_offset(),
                    ) {
                        held.handed = Some(last + 1);
                    }
                    permit.send(SubscriptionEvent::Records {
                        lease_id,
                        topic,
                        partition,
                        batch,
                    });
                }
            }
            Some(Ok(LeaseBatch::Deliveries(delivered))) => {
                if let Some(permit) = permit.take() {
                    permit.send(SubscriptionEvent::Deliveries {
                        lease_id,
                        topic,
                        partition,
                        delivered,
                    });
                }
            }
            ended => {
                // A Read ends by itself when the lease ends: released by the client (OK), or
                // lost, expired, superseded, or with the gateway.
                let held = self.held.remove(&(topic.clone(), partition));
                let error = match ended {
                    Some(Err(err)) => err,
                    _ => held
                        .as_ref()
                        .and_then(|h| h.lease.end_reason())
                        .map(|reason| LeaseError::LeaseEnded {
                            lease_ref: lease_id.reference().to_string(),
                            reason,
                        })
                        .unwrap_or(LeaseError::LeaseNotFound {
                            lease_ref: lease_id.reference().to_string(),
                        }),
                };
                let _ = self.control.send(Ok(SubscriptionEvent::Revoked {
                    lease_id,
                    topic,
                    partition,
                    why: Ended::Other(error),
                }));
            }
        }
    }

    /// Takes in what a task of this member did; the topic it was about.
    async fn on_done(&mut self, done: Done) -> String {
        match done {
            Done::Acquired {
                topic,
                partition,
                result,
            } => {
                self.pending.remove(&(topic.clone(), partition));
                match result {
                    Ok(granted) => {
                        if self.targets_me(&topic, partition) {
                            self.install(topic.clone(), partition, granted);
                        } else {
                            // Never expected (the argument in docs/ARCHITECTURE.md): a take
                            // is made only for a partition the newest target gives this
                            // member, and a later epoch moves it away only if this member's
                            // quota fell. Handed back before anyone hears of it.
                            metrics::counter!(crate::metrics::SUBSCRIBE_MOVES_BEYOND_MINIMUM)
                                .increment(1);
                            tracing::warn!(
                                member_id = %self.spec.member_id,
                                %topic,
                                partition,
                                lease_ref = %granted.lease_id.reference(),
                                "a partition taken for this member is no longer its own in the \
                                newest target; handing it back",
                            );
                            let gateway = self.gateway.clone();
                            tokio::spawn(async move {
                                release(&gateway, granted.lease_id.as_str()).await;
                            });
                        }
                    }
                    Err(error) => {
                        // No view change may follow (a lock-delay ends silently, a key
                        // being released here frees without a write): the rule runs again
                        // shortly, on the newest view.
                        let key = LockKey::new(&self.spec.group, &topic, partition);
                        let pause = match &error {
                            LeaseError::Busy { .. } => {
                                let left = self.gateway.locks().wait_cut(&key, DELAY_CAP);
                                if left < DELAY_CAP {
                                    left
                                } else {
                                    RETAKE_PAUSE
                                }
                            }
                            _ => RETAKE_PAUSE_ERROR,
                        };
                        self.not_before.insert(
                            (topic.clone(), partition),
                            tokio::time::Instant::now() + pause,
                        );
                        tracing::debug!(
                            member_id = %self.spec.member_id,
                            %topic,
                            partition,
                            %error,
                            ?pause,
                            "a partition the rule gave this member was not taken; the rule runs \
                            again on the newest view",
                        );
                    }
                }
                topic
            }
            Done::Published { topic, written } => {
                let now = tokio::time::Instant::now();
                if let Some(at) = self.targets.written(&topic, written, now) {
                    // Failed: written again after a pause, whatever the view shows.
                    self.replan_at.insert(topic.clone(), at);
                }
                topic
            }
            Done::Released {
                topic,
                partition,
                lease_id,
            } => {
                self.held.remove(&(topic.clone(), partition));
                let _ = self.control.send(Ok(SubscriptionEvent::Revoked {
                    lease_id,
                    topic: topic.clone(),
                    partition,
                    why: Ended::Revoked,
                }));
                topic
            }
        }
    }

    /// A client took the detached member over: it hears `joined`, every lease again
    /// (`assigned` at its resume point, or `revoking` with its deadline), and a new Read of
    /// each from its resume point, as a Read reopened without `from_offset` would.
    ///
    /// A Subscribe for other topics is refused (INVALID_ARGUMENT), and the member stays
    /// detached: the new client may have meant another member.
    fn reattach(&mut self, attach: Attach) {
        let (mut mine, mut theirs) = (self.spec.topics.clone(), attach.spec.topics.clone());
        mine.sort();
        theirs.sort();
        if attach.spec.owner != self.spec.owner {
            let _ = attach.control.send(Err(LeaseError::ActionDenied(Box::new(
                crate::error::Denied {
                    identity: attach
                        .spec
                        .owner
                        .clone()
                        .unwrap_or_else(|| "(anonymous)".into()),
                    action: crate::auth::Action::Subscribe.as_str(),
                    group: Some(self.spec.group.clone()),
                    topic: mine.first().cloned(),
                    why: Some(format!(
                        "member {:?} belongs to another identity; only the identity that \
                         subscribed it may take it over",
                        self.spec.member_id
                    )),
                },
            ))));
            self.claim.detach(self.attach.clone());
            return;
        }
        if mine != theirs {
            let _ = attach.control.send(Err(LeaseError::InvalidArgument {
                field: "topics",
                message: format!(
                    "member {:?} of group {:?} is subscribed to topics {mine:?} and waits, \
                     detached, for its client to come back within its session grace; a \
                     Subscribe with its member id must name the same topics, not {theirs:?} \
                     (or use another member id)",
                    self.spec.member_id, self.spec.group,
                ),
            }));
            self.claim.detach(self.attach.clone());
            return;
        }
        self.spec.limits = attach.spec.limits;
        self.spec.revoke_grace = attach.spec.revoke_grace;
        self.spec.session_grace = attach.spec.session_grace;
        self.control = attach.control;
        self.records = attach.records;
        self.attached = true;
        self.detached_until = None;
        // Batches of the old Reads must not reach the new client: a fresh merge.
        self.merged = SelectAll::new();
        let _ = self.control.send(Ok(SubscriptionEvent::Joined {
            member_id: self.spec.member_id.clone(),
            gateway: self.gateway.instance().to_string(),
        }));
        let mut keys: Vec<(String, i32)> = self.held.keys().cloned().collect();
        keys.sort();
        for (topic, partition) in keys {
            let Some(held) = self.held.get(&(topic.clone(), partition)) else {
                continue;
            };
            if held.revoking {
                let _ = self.control.send(Ok(SubscriptionEvent::Revoking {
                    lease_id: held.lease_id.clone(),
                    topic: topic.clone(),
                    partition,
                    deadline: held.deadline.unwrap_or_else(SystemTime::now),
                }));
                continue;
            }
            held.pump.abort();
            let lease = held.lease.clone();
            let mut granted = held.granted.clone();
            granted.offset = lease.resume_point();
            match self.start_read(&topic, partition, &lease) {
                Ok(pump) => {
                    if let Some(held) = self.held.get_mut(&(topic.clone(), partition)) {
                        held.pump = pump;
                    }
                    let _ = self.control.send(Ok(SubscriptionEvent::Assigned(granted)));
                }
                Err(error) => {
                    tracing::debug!(
                        %topic,
                        partition,
                        %error,
                        "a lease ended while its member was detached",
                    );
                }
            }
        }
    }

    /// Opens a Read of `lease` (at its resume point), pumped by a task of its own into the
    /// merged stream.
    fn start_read(
        &mut self,
        topic: &str,
        partition: i32,
        lease: &Arc<Lease>,
    ) -> Result<JoinHandle<()>, LeaseError> {
        let (tx, rx) = mpsc::channel(1);
        let pump = match &self.spec.queue {
            None => {
                let read = self.gateway.read_at_resume_point(lease, self.spec.limits)?;
                tokio::spawn(pump(read.for_subscribe(), tx, LeaseBatch::Read))
            }
            Some(queue) => {
                let settings = DeliverSettings {
                    queue: queue.settings,
                    dead_letter_topic: queue
                        .dead_letter_topics
                        .get(topic)
                        .cloned()
                        .unwrap_or_default(),
                };
                let (gateway, lease, window) =
                    (self.gateway.clone(), lease.clone(), self.window.clone());
                tokio::spawn(async move {
                    match gateway.deliver(&lease, settings, window).await {
                        Ok(deliveries) => pump(deliveries, tx, LeaseBatch::Deliveries).await,
                        Err(err) => {
                            let _ = tx.send(Some(Err(err))).await;
                        }
                    }
                })
            }
        };
        let (lease_id, topic) = (lease.id.clone(), topic.to_string());
        let read: LeaseRead = Box::pin(ReceiverStream::new(rx).map(move |item| ReadItem {
            topic: topic.clone(),
            partition,
            lease_id: lease_id.clone(),
            item,
        }));
        self.merged.push(read);
        Ok(pump)
    }

    /// A new lease: announced, then its Read joins the merged stream.
    fn install(&mut self, topic: String, partition: i32, granted: Granted) {
        let lease_id = granted.lease_id.clone();
        let started = self
            .gateway
            .lease(lease_id.as_str())
            .and_then(|lease| Ok((self.start_read(&topic, partition, &lease)?, lease)));
        let (pump, lease) = match started {
            Ok(started) => started,
            Err(error) => {
                tracing::debug!(%topic, partition, %error, "a lease just granted ended at once");
                return;
            }
        };
        let _ = self
            .control
            .send(Ok(SubscriptionEvent::Assigned(granted.clone())));
        self.held.insert(
            (topic, partition),
            Held {
                lease_id,
                lease,
                granted,
                deadline: None,
                pump,
                revoking: false,
                handed: None,
            },
        );
    }

    async fn on_view(&mut self, topic: &str, view: TopicView) {
        let member_id = self.spec.member_id.clone();
        if !view.members.contains_key(&member_id) {
            // The record went with a lost session: join again under the new one.
            match self
                .gateway
                .locks()
                .join(&self.spec.group, topic, &self.record)
                .await
            {
                Ok(true) => {}
                Ok(false) => {
                    let _ = self.control.send(Err(LeaseError::MemberActive {
                        group: self.spec.group.clone(),
                        topic: topic.to_string(),
                        member_id,
                    }));
                    return;
                }
                Err(error) => {
                    tracing::debug!(%topic, %error, "could not join again yet");
                    return;
                }
            }
        }
        self.views.insert(topic.to_string(), view);
        self.replan(topic).await;
    }

    /// Whether the newest target of `topic` this member has seen gives it `partition`.
    fn targets_me(&self, topic: &str, partition: i32) -> bool {
        self.views
            .get(topic)
            .and_then(|view| view.target.as_ref())
            .and_then(|t| t.target.assignment.get(&self.spec.member_id))
            .is_some_and(|mine| mine.contains(&partition))
    }

    /// Moves this member toward the newest target of `topic` it has seen: gives up what the
    /// target gives another member, and takes what it gives this one once its holder has let
    /// it go (each once: a take that failed waits for its pause). Publishes the next epoch's
    /// target first when the view shows the published one out of date.
    async fn replan(&mut self, topic: &str) {
        let partitions = match self.gateway.kafka().partition_count(topic, None).await {
            Ok(count) => count,
            Err(error) => {
                tracing::warn!(%topic, %error, "no partition count for a subscribed topic");
                return;
            }
        };
        let Some(view) = self.views.get(topic).cloned() else {
            return;
        };
        self.publish_if_due(topic, &view, partitions);
        let Some(mine) = view
            .target
            .as_ref()
            .and_then(|t| t.target.assignment.get(&self.spec.member_id))
        else {
            // Not in the target yet (it was computed before this member joined): it keeps
            // what it holds until the next epoch says.
            return;
        };
        let give_up: Vec<i32> = self
            .held
            .keys()
            .filter(|(t, p)| t == topic && !mine.contains(p))
            .map(|&(_, p)| p)
            .collect();
        for partition in give_up {
            self.revoke(topic, partition);
        }
        let now = tokio::time::Instant::now();
        for &partition in mine {
            let key = (topic.to_string(), partition);
            if self.pending.contains(&key)
                || self.held.contains_key(&key)
                || self.not_before.get(&key).is_some_and(|at| *at > now)
                // Its holder lets it go first; the view that shows it free plans again.
                || view.held.contains_key(&partition)
            {
                continue;
            }
            self.take(topic, partition);
        }
    }

    /// Publishes the next epoch's target of `topic` when `view` shows the published one out
    /// of date and this member is the one to write it ([`TargetWriter::decide`]).
    fn publish_if_due(&mut self, topic: &str, view: &TopicView, partitions: i32) {
        let now = tokio::time::Instant::now();
        let (target, replaces, moves, minimum) = match self.targets.decide(
            topic,
            view,
            partitions,
            &self.spec.member_id,
            self.gateway.instance(),
            now,
            SystemTime::now(),
        ) {
            Publish::Nothing => return,
            Publish::Later(at) => {
                self.replan_at.insert(topic.to_string(), at);
                return;
            }
            Publish::Now {
                target,
                replaces,
                moves,
                minimum,
            } => (target, replaces, moves, minimum),
        };
        let (gateway, done) = (self.gateway.clone(), self.done.clone());
        let (group, topic, member_id) = (
            self.spec.group.clone(),
            topic.to_string(),
            self.spec.member_id.clone(),
        );
        tokio::spawn(async move {
            let written = gateway
                .locks()
                .publish_target(&group, &topic, &target, replaces)
                .await;
            let written = match written {
                Ok(true) => {
                    metrics::counter!(crate::metrics::SUBSCRIBE_EPOCHS).increment(1);
                    metrics::counter!(crate::metrics::SUBSCRIBE_MOVES).increment(moves as u64);
                    metrics::counter!(crate::metrics::SUBSCRIBE_MOVES_BEYOND_MINIMUM)
                        .increment(moves.saturating_sub(minimum) as u64);
                    tracing::info!(
                        %group,
                        %topic,
                        epoch = target.epoch,
                        %member_id,
                        members = target.members.len(),
                        moves,
                        minimum,
                        "published the target assignment of a new epoch",
                    );
                    Ok(true)
                }
                // Another epoch was written first: the next view shows it.
                Ok(false) => Ok(false),
                Err(error) => {
                    tracing::debug!(
                        %topic,
                        %error,
                        "publishing a target failed; written again after a pause",
                    );
                    Err(())
                }
            };
            let _ = done.send(Done::Published { topic, written });
        });
    }

    fn take(&mut self, topic: &str, partition: i32) {
        self.pending.insert((topic.to_string(), partition));
        let spec = AcquireSpec {
            group: self.spec.group.clone(),
            topic: topic.to_string(),
            partition: Some(partition),
            member: self.spec.member.clone(),
            ttl: self.spec.revoke_grace + LEASE_TTL_MARGIN,
            wait: TAKE_WAIT,
            reset: self.spec.reset,
            via: None,
            subscriber: self.spec.member_id.clone(),
            owner: self.spec.owner.clone(),
        };
        let (gateway, done, topic) = (self.gateway.clone(), self.done.clone(), topic.to_string());
        tokio::spawn(async move {
            let result = gateway.acquire(spec).await;
            let _ = done.send(Done::Acquired {
                topic,
                partition,
                result,
            });
        });
    }

    /// Starts giving up a lease: its Read stops, the client hears `revoking`, and the lease
    /// is released after the client's next commit on it, or at the grace's end; at once
    /// when nothing was handed to the client since its last commit on the lease.
    fn revoke(&mut self, topic: &str, partition: i32) {
        let Some(held) = self.held.get_mut(&(topic.to_string(), partition)) else {
            return;
        };
        if held.revoking {
            return;
        }
        held.revoking = true;
        held.pump.abort();
        let grace = self.spec.revoke_grace;
        let deadline = SystemTime::now() + grace;
        held.deadline = Some(deadline);
        tracing::info!(
            member_id = %self.spec.member_id,
            %topic,
            partition,
            ?grace,
            nothing_to_commit = held.idle(),
            "revoking a lease: it moves to another member",
        );
        let _ = self.control.send(Ok(SubscriptionEvent::Revoking {
            lease_id: held.lease_id.clone(),
            topic: topic.to_string(),
            partition,
            deadline,
        }));
        // Taken now, so a commit that comes before the task runs counts.
        let mut commits = held.lease.commit_watch();
        // Nothing handed to the client since its last commit: nothing to wait for.
        let idle = held.idle();
        let (gateway, done) = (self.gateway.clone(), self.done.clone());
        let (topic, lease_id, lease) =
            (topic.to_string(), held.lease_id.clone(), held.lease.clone());
        tokio::spawn(async move {
            match lease.queue().cloned() {
                // Queue mode: the client answers what is in flight; the release commits.
                Some(queue) => {
                    let _ = tokio::time::timeout(grace, async {
                        while queue.in_flight() > 0 && !lease.is_ended() {
                            tokio::time::sleep(REVOKE_POLL).await;
                        }
                    })
                    .await;
                }
                None if !idle => {
                    let _ = tokio::time::timeout(grace, commits.changed()).await;
                }
                None => {}
            }
            let _ = gateway.release(&lease, None).await;
            let _ = done.send(Done::Released {
                topic,
                partition,
                lease_id,
            });
        });
    }

    /// The member leaves: its records are removed, its leases released.
    async fn finish(mut self) {
        for watcher in &self.watchers {
            watcher.abort();
        }
        for held in self.held.values() {
            held.pump.abort();
        }
        // The records first, the leases after: every view then shows the group without
        // this member before it shows any of its partitions free, so the others' quotas
        // are their final ones when they take (docs/ARCHITECTURE.md, "Subscriptions").
        for topic in &self.spec.topics {
            if let Err(error) = self
                .gateway
                .locks()
                .leave(&self.spec.group, topic, &self.spec.member_id)
                .await
            {
                tracing::warn!(
                    %topic,
                    %error,
                    "could not remove a member record; it goes with the session",
                );
            }
            remove_target_if_last(&self.gateway, &self.spec.group, topic).await;
        }
        let deadline = tokio::time::Instant::now() + CLEANUP_WAIT;
        while !self.pending.is_empty() {
            match tokio::time::timeout_at(deadline, self.done_rx.recv()).await {
                Ok(Some(Done::Acquired {
                    topic,
                    partition,
                    result,
                })) => {
                    self.pending.remove(&(topic, partition));
                    if let Ok(granted) = result {
                        release(&self.gateway, granted.lease_id.as_str()).await;
                    }
                }
                Ok(Some(Done::Released { .. } | Done::Published { .. })) => {}
                Ok(None) | Err(_) => break,
            }
        }
        let leases: Vec<Arc<Lease>> = self.held.values().map(|h| h.lease.clone()).collect();
        for lease in leases {
            let _ = self.gateway.release(&lease, None).await;
        }
        tracing::info!(
            group = %self.spec.group,
            member_id = %self.spec.member_id,
            "member left",
        );
    }
}

/// After a leaving member's record is gone: removes the topic's target if no member is left
/// (a check-and-set on the target read, so a member's newer epoch stays), so that a group
/// that is done leaves nothing in Consul. A member that joins after the removal starts from
/// epoch 1, from what the members hold.
async fn remove_target_if_last(gateway: &Gateway, group: &str, topic: &str) {
    let locks = gateway.locks();
    let Ok(view) = locks.topic_view(group, topic, None, Duration::ZERO).await else {
        return;
    };
    let Some(target) = view.target.filter(|_| view.members.is_empty()) else {
        return;
    };
    match locks.remove_target(group, topic, target.index).await {
        Ok(true) => tracing::info!(
            %group,
            %topic,
            epoch = target.target.epoch,
            "the last member left; removed the target assignment",
        ),
        Ok(false) => {}
        Err(error) => tracing::debug!(%topic, %error, "could not remove the target"),
    }
}

/// Releases lease `lease_id`, if this instance still serves it.
/// Pumps one lease's stream (its Read's batches or its deliveries, each made a
/// [`LeaseBatch`] by `wrap`) into the member's merged stream, until it ends (then `None`)
/// or fails (the error is its last item), or the merged stream is gone.
async fn pump<T, S>(
    mut stream: S,
    tx: mpsc::Sender<Option<Result<LeaseBatch, LeaseError>>>,
    wrap: fn(T) -> LeaseBatch,
) where
    S: futures::Stream<Item = Result<T, LeaseError>> + Unpin,
{
    while let Some(item) = stream.next().await {
        let last = item.is_err();
        if tx.send(Some(item.map(wrap))).await.is_err() || last {
            return;
        }
    }
    let _ = tx.send(None).await;
}

async fn release(gateway: &Gateway, lease_id: &str) {
    if let Ok(lease) = gateway.lease(lease_id) {
        let _ = gateway.release(&lease, None).await;
    }
}
