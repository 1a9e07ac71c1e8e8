//! Acquire: the wait in a topic's line, one attempt at one partition (claim here, lock in
//! the backend, open the lease), and the guards that give a claim or a lock back however an
//! attempt ends.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use tokio::time::Instant;
use tracing::Instrument;

use crate::coordination::{unix_ms, Acquisition, HeldPartition, HolderInfo, LockGrant, LockKey};
use crate::error::{BusyPartition, EndReason, LeaseError};
use crate::kafka::PartitionFeed;
use crate::lease::{new_lease_id, Lease, LeaseId, LeaseParts};
use crate::waiters::{Ticket, TopicWaiters, Tried, Wants};

use super::table::LocalBusy;
use super::{AcquireSpec, Gateway, Granted, Reset};

/// Counts an Acquire as waiting for as long as it lives.
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Ends an Acquire attempt's claim on a key however the attempt finishes (an error, or the
/// task being dropped), unless the claim became a lease.
struct Claim<'a> {
    gateway: &'a Gateway,
    key: LockKey,
    /// Set when the backend may hold the key for this instance although no grant came back.
    unreleased_by: Option<String>,
    via: Option<std::net::SocketAddr>,
    installed: bool,
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        if self.installed {
            return;
        }
        self.gateway
            .table()
            .unclaim(&self.key, self.unreleased_by.as_deref(), self.via);
        match self.unreleased_by.take() {
            Some(session) => self.gateway.spawn_release_key(self.key.clone(), session),
            // Free again here: a waiter may take it.
            None => self.gateway.freed(&self.key),
        }
    }
}

/// A lock grant not yet owned by a lease. Dropped unconsumed (the attempt failed or its task
/// was cancelled), it hands the grant to the background releaser, which retries until the
/// backend confirms.
struct GrantGuard<'a> {
    gateway: &'a Gateway,
    grant: Option<LockGrant>,
}

impl GrantGuard<'_> {
    fn key(&self) -> &LockKey {
        self.grant
            .as_ref()
            .map(LockGrant::key)
            .expect("a guard holds its grant until taken")
    }

    fn session(&self) -> &str {
        self.grant
            .as_ref()
            .map(LockGrant::session)
            .expect("a guard holds its grant until taken")
    }

    fn take(mut self) -> LockGrant {
        self.grant
            .take()
            .expect("a guard holds its grant until taken")
    }
}

impl Drop for GrantGuard<'_> {
    fn drop(&mut self) {
        if let Some(grant) = self.grant.take() {
            let session = grant.session().to_string();
            self.gateway.table().unreleased(grant.key(), &session);
            self.gateway.spawn_release_key(grant.key().clone(), session);
        }
    }
}

/// How long one round of a topic watch's blocking query may wait.
const TOPIC_WATCH_WAIT: Duration = Duration::from_secs(60);

/// How long an Acquire leaves a partition alone after finding it taken on this very
/// instance (a lease, an attempt, or a release not yet confirmed) since it was offered.
const LOCAL_PAUSE: Duration = Duration::from_millis(20);

/// The longest a partition is left alone after a lock-delay refusal (the longest lock-delay
/// the gateway accepts); the backend normally says less.
const DELAY_CAP: Duration = Duration::from_secs(60);

/// How long an Acquire without a partition waits for Kafka to say which partitions have
/// records to read (the proto promises a second) before it picks without a preference.
const PREFERENCE_DEADLINE: Duration = Duration::from_secs(1);

/// How one attempt at one partition went.
enum Attempt {
    /// A lease, and the lock as the topic's view should now show it.
    Granted(Box<Granted>, HeldPartition),
    /// Another instance holds it.
    Held,
    /// Free, but under lock-delay.
    Delayed,
    /// Taken on this instance since it was offered.
    Local,
    /// Locked, but the lock's session ended before the lease was installed: the grant is
    /// given back (void with its session) and the partition is tried again under the new
    /// session, which Consul refuses for the lock-delay.
    SessionEnded,
}

impl Gateway {
    /// Grants a lease, waiting up to `spec.wait` for a partition to become free. The Acquire
    /// takes a place in its topic's line and tries only the partition the line offers it
    /// (see [`crate::waiters`]): a free one, offered to the oldest Acquire that wants it.
    pub async fn acquire(&self, spec: AcquireSpec) -> Result<Granted, LeaseError> {
        let called = Instant::now();
        if self.shutting_down.load(Ordering::SeqCst) {
            return Err(LeaseError::ShuttingDown);
        }
        let partition_count = self
            .kafka
            .partition_count(&spec.topic, spec.partition)
            .await?;
        let wants = match spec.partition {
            Some(p) if p >= partition_count => {
                return Err(LeaseError::PartitionNotFound {
                    topic: spec.topic.clone(),
                    partition: p,
                    partition_count,
                })
            }
            Some(p) => Wants::One(p),
            // Prefer a partition with records to read; start at a random partition, so
            // clients that start together spread out instead of all contending for
            // partition 0.
            None => Wants::Any {
                start: rand::random_range(0..partition_count),
                count: partition_count,
                preferred: Arc::new(self.with_records(&spec, partition_count).await),
            },
        };
        let deadline = Instant::now() + spec.wait;
        let ticket = self
            .topic_waiters(&spec.group, &spec.topic)
            .enqueue(wants.clone());
        let mut stopping = self.stopping.subscribe();
        let mut waiting: Option<Waiting<'_>> = None;
        loop {
            if self.shutting_down.load(Ordering::SeqCst) {
                return Err(LeaseError::ShuttingDown);
            }
            // The view read here only when no watch of the topic keeps it current.
            let view = self
                .locks
                .topic_view(&spec.group, &spec.topic, None, Duration::ZERO);
            if let Some(partition) = ticket.offer_now(view).await? {
                let key = LockKey::new(&spec.group, &spec.topic, partition);
                let tried = match self.attempt(&spec, key.clone()).await? {
                    Attempt::Granted(granted, held) => {
                        ticket.tried(partition, Tried::Locked(held));
                        tracing::debug!(
                            call_us = called.elapsed().as_micros() as u64,
                            "the Acquire's call, from the gateway's side",
                        );
                        return Ok(*granted);
                    }
                    Attempt::Held => Tried::Held,
                    Attempt::Delayed => {
                        Tried::Delayed(Instant::now() + self.locks.wait_cut(&key, DELAY_CAP))
                    }
                    // Taken here a moment ago (a lease, an attempt, a release in flight), or
                    // locked under a session that has just ended: look again shortly.
                    Attempt::Local | Attempt::SessionEnded => {
                        Tried::Delayed(Instant::now() + LOCAL_PAUSE)
                    }
                };
                ticket.tried(partition, tried);
                continue;
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(self.busy(&spec, &ticket, wants));
            }
            // Every partition it wants is taken: wait, if this gateway may take one more
            // waiter, for an offer from the topic's shared watch.
            if waiting.is_none() {
                if self.waiting.fetch_add(1, Ordering::SeqCst) >= self.limits.max_waiting_acquires {
                    self.waiting.fetch_sub(1, Ordering::SeqCst);
                    return Err(LeaseError::LimitReached {
                        flag: "--max-waiting-acquires",
                        limit: self.limits.max_waiting_acquires,
                        what: "as many Acquires as this gateway allows are already waiting \
                               for a partition"
                            .into(),
                    });
                }
                waiting = Some(Waiting(&self.waiting));
            }
            let watch = |line: &Arc<TopicWaiters>, from| self.spawn_topic_watch(line, &spec, from);
            tokio::select! {
                () = ticket.wait(deadline, watch) => {}
                _ = stopping.changed() => {}
            }
        }
    }

    /// The partitions of the Acquire's topic with records for its group to read, as Kafka
    /// tells within [`PREFERENCE_DEADLINE`]: a hint, so a failure or a slow answer is logged
    /// and gives no preference, never an error.
    async fn with_records(&self, spec: &AcquireSpec, partition_count: i32) -> BTreeSet<i32> {
        let lookup = self.kafka.partitions_with_records(
            &spec.group,
            &spec.topic,
            partition_count,
            spec.reset == Reset::Earliest,
        );
        match tokio::time::timeout(PREFERENCE_DEADLINE, lookup).await {
            Ok(Ok(partitions)) => {
                tracing::debug!(?partitions, "partitions with records to read");
                partitions
            }
            Ok(Err(err)) => {
                tracing::debug!(
                    %err,
                    "no partition preferred: the lookup of records to read failed"
                );
                BTreeSet::new()
            }
            Err(_) => {
                tracing::debug!(
                    deadline = ?PREFERENCE_DEADLINE,
                    "no partition preferred: the lookup of records to read took too long"
                );
                BTreeSet::new()
            }
        }
    }

    /// The Busy answer: who holds each partition the Acquire wanted, as far as this gateway
    /// knows (its own leases in full, others from the topic's view).
    fn busy(&self, spec: &AcquireSpec, ticket: &Ticket, wants: Wants) -> LeaseError {
        let partitions = wants.partitions();
        let mut busy: Vec<BusyPartition> = ticket
            .holders(&partitions)
            .into_iter()
            .map(|(partition, holder)| {
                let key = LockKey::new(&spec.group, &spec.topic, partition);
                let local = self.table().lease_at(&key).cloned();
                match local {
                    Some(lease) => BusyPartition {
                        partition,
                        holder: Some(self.holder_of(&lease)),
                        expires_at: Some(lease.snapshot().expires_at),
                    },
                    None => BusyPartition {
                        partition,
                        holder,
                        expires_at: None,
                    },
                }
            })
            .collect();
        busy.sort_by_key(|b| b.partition);
        LeaseError::Busy {
            group: spec.group.clone(),
            topic: spec.topic.clone(),
            busy,
        }
    }

    /// One attempt at one partition, run to its end in a task of its own: once the lock
    /// request is out, the attempt must finish (a lease, or the lock given back) even if the
    /// Acquire call is cancelled (its deadline, its client gone). A lease granted after the
    /// caller went away is ended at once, so no key stays held without a lease.
    async fn attempt(&self, spec: &AcquireSpec, key: LockKey) -> Result<Attempt, LeaseError> {
        let Some(gateway) = self.me.upgrade() else {
            return Err(LeaseError::ShuttingDown);
        };
        let spec = spec.clone();
        let (answer, asked) = tokio::sync::oneshot::channel();
        tokio::spawn(
            async move {
                let outcome = gateway.try_partition(&spec, &key).await;
                if let Err(Ok(Attempt::Granted(granted, _))) = answer.send(outcome) {
                    let lease = gateway.table().lease(granted.lease_id.as_str()).cloned();
                    if let Some(lease) = lease {
                        tracing::info!(
                            parent: &lease.span,
                            "the Acquire call went away; ending its lease",
                        );
                        gateway.end_lease(&lease, EndReason::Abandoned).await;
                    }
                }
            }
            .in_current_span(),
        );
        asked.await.unwrap_or(Err(LeaseError::ShuttingDown))
    }

    /// One attempt at one partition.
    async fn try_partition(
        &self,
        spec: &AcquireSpec,
        key: &LockKey,
    ) -> Result<Attempt, LeaseError> {
        let claimed = self.table().claim(key, &self.limits, spec.via);
        if let Err(local) = claimed {
            return match local {
                LocalBusy::Full => Err(LeaseError::LimitReached {
                    flag: "--max-leases",
                    limit: self.limits.max_leases,
                    what: "this gateway serves as many leases as it may".into(),
                }),
                LocalBusy::ConnectionFull => Err(LeaseError::LimitReached {
                    flag: "--max-leases-per-connection",
                    limit: self.limits.max_leases_per_connection,
                    what: format!(
                        "the client connection from {} holds as many leases on this gateway \
                         as one connection may",
                        spec.via.map_or_else(|| "?".to_string(), |v| v.to_string())
                    ),
                }),
                LocalBusy::Taken => Ok(Attempt::Local),
            };
        }
        let mut claim = Claim {
            gateway: self,
            key: key.clone(),
            unreleased_by: None,
            via: spec.via,
            installed: false,
        };
        // The group's Kafka client first (held until the attempt ends, so it cannot be closed
        // as idle meanwhile): a gateway at its group limit refuses before it touches Consul.
        let _group_client = self.kafka.group(&key.group)?;
        let id = new_lease_id(&self.instance);
        let holder = HolderInfo {
            member: spec.member.clone(),
            gateway: self.instance.clone(),
            lease_ref: id.reference().to_string(),
            acquired_at_ms: unix_ms(SystemTime::now()),
            ttl_ms: spec.ttl.as_millis() as u64,
            address: self.address.clone().unwrap_or_default(),
            subscriber: spec.subscriber.clone(),
        };
        let session = self.live_session();
        let asked = Instant::now();
        let grant = match self.locks.try_acquire(key, &holder).await {
            Ok(Acquisition::Acquired(grant)) => grant,
            Ok(Acquisition::Held) => return Ok(Attempt::Held),
            Ok(Acquisition::Delayed) => return Ok(Attempt::Delayed),
            Err(err) => {
                // The request may have reached Consul and taken the lock although no answer
                // came back: keep the key blocked here and make sure it is free.
                claim.unreleased_by = session;
                return Err(err.into());
            }
        };
        // The lock is ours. From here on, whatever happens gives it back unless a lease
        // takes it over.
        let grant = GrantGuard {
            gateway: self,
            grant: Some(grant),
        };
        let token = grant.grant.as_ref().map(LockGrant::token);
        let locked = asked.elapsed();
        let Some(granted) = self
            .open_lease(spec, id, holder.clone(), grant, locked)
            .await?
        else {
            return Ok(Attempt::SessionEnded);
        };
        claim.installed = true;
        let held = HeldPartition {
            token,
            holder: Some(holder),
        };
        Ok(Attempt::Granted(Box::new(granted), held))
    }

    /// The line of Acquires on (`group`, `topic`), created if there is none.
    fn topic_waiters(&self, group: &str, topic: &str) -> Arc<TopicWaiters> {
        let mut lines = self.waiters.lock().unwrap_or_else(|p| p.into_inner());
        let id = (group.to_string(), topic.to_string());
        if let Some(line) = lines.get(&id).and_then(Weak::upgrade) {
            return line;
        }
        lines.retain(|_, q| q.strong_count() > 0);
        let (gateway, probe) = (self.me.clone(), LockKey::new(group, topic, 0));
        let line = TopicWaiters::new(Box::new(move |partition| {
            let key = LockKey {
                partition,
                ..probe.clone()
            };
            gateway
                .upgrade()
                .is_some_and(|gateway| gateway.table().blocks(&key))
        }));
        lines.insert(id, Arc::downgrade(&line));
        line
    }

    /// This instance no longer holds `key`: offer it to a waiter here at once.
    pub(super) fn freed(&self, key: &LockKey) {
        let line = self
            .waiters
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&(key.group.clone(), key.topic.clone()))
            .and_then(Weak::upgrade);
        if let Some(line) = line {
            line.mark_free(key.partition);
        }
    }

    /// The shared watch of a topic: one blocking query at a time, however many Acquires
    /// wait on the topic here, each answer handed to the line (which offers what it shows
    /// free). It ends with the line.
    fn spawn_topic_watch(
        &self,
        line: &Arc<TopicWaiters>,
        spec: &AcquireSpec,
        from: u64,
    ) -> tokio::task::JoinHandle<()> {
        let (weak, locks) = (Arc::downgrade(line), self.locks.clone());
        let (group, topic) = (spec.group.clone(), spec.topic.clone());
        tokio::spawn(async move {
            let mut from = from;
            loop {
                match locks
                    .topic_view(&group, &topic, Some(from), TOPIC_WATCH_WAIT)
                    .await
                {
                    Ok(view) => {
                        let Some(line) = weak.upgrade() else { return };
                        from = view.index;
                        line.set_view(view);
                    }
                    Err(err) => {
                        // The waiters keep their places; offers resume once Consul answers.
                        tracing::debug!(
                            %topic,
                            %group,
                            error = %err,
                            "topic watch failed; retrying",
                        );
                        tokio::time::sleep(Duration::from_millis(500)).await;
                        let Some(line) = weak.upgrade() else { return };
                        from = line.index();
                    }
                }
            }
        })
    }

    /// Finds where the lease starts, starts fetching and puts the lease in the table; `None`
    /// when the lock's session ended meanwhile. On failure the guard gives the lock back.
    async fn open_lease(
        &self,
        spec: &AcquireSpec,
        id: LeaseId,
        holder: HolderInfo,
        grant: GrantGuard<'_>,
        locked: Duration,
    ) -> Result<Option<Granted>, LeaseError> {
        let key = grant.key().clone();
        let opening = Instant::now();
        let prepared = async {
            let group_client = self.kafka.group(&key.group)?;
            // The client that will fetch the partition (perhaps another group's, see
            // `Kafka::fetcher`), claimed now so no other lease takes it meanwhile.
            let claim = self
                .kafka
                .fetcher(&group_client, &key.topic, key.partition)?;
            // All after the lock, and independent: one round trip to the brokers, not three.
            // (The committed offset must be read after the lock: the previous holder's
            // commits have settled by then.) The topic's leaders, through the client that
            // fetches: so the partition is fetched as soon as it is opened (see
            // `GroupClient::learn_topic`); only a speed-up, librdkafka finds them by itself
            // later.
            let learned = async {
                if let Err(err) = claim.client().learn_topic(&key.topic).await {
                    tracing::debug!(
                        topic = %key.topic,
                        error = %err,
                        "topic lookup failed; the partition's first fetch may wait for \
                        librdkafka's own",
                    );
                }
                Ok::<(), LeaseError>(())
            };
            // Each timed, for the debug line of the Acquire's steps.
            let asked = Instant::now();
            let (watermarks, committed, learned) = tokio::join!(
                async {
                    let answer = self.kafka.watermarks(&key.topic, key.partition).await;
                    (answer, asked.elapsed())
                },
                async {
                    let answer = group_client.committed(&key.topic, key.partition).await;
                    (answer, asked.elapsed())
                },
                async { (learned.await, asked.elapsed()) },
            );
            let steps = [watermarks.1, committed.1, learned.1];
            let ((low, high), committed, ()) = (watermarks.0?, committed.0?, learned.0?);
            let committed = committed.map(|(offset, _)| offset);
            let start = match committed {
                // A committed offset that retention has passed, or that is beyond the log
                // (the topic was recreated), falls back to the reset policy, as Kafka's
                // auto.offset.reset does.
                Some(offset) if (low..=high).contains(&offset) => offset,
                _ => match spec.reset {
                    Reset::Earliest => low,
                    Reset::Latest => high,
                },
            };
            let assigning = Instant::now();
            let feed = PartitionFeed::open(claim, start)?;
            let assigned = assigning.elapsed();
            Ok::<_, LeaseError>((start, committed, high, feed, group_client, steps, assigned))
        }
        .await;
        let (start, committed, high, feed, group_client, steps, assigned) = prepared?;
        // The session the lock was taken under may have ended while the lease was being
        // opened (Kafka can take seconds), and the sweep that ends its leases
        // ([`Gateway::on_session_state`]) has then already run without this one: a lease
        // installed now would outlive its lock. Checked under the table's lock, which the
        // sweep takes too: either the session is still live when the lease goes in (a later
        // sweep finds it), or the attempt gives the grant back (its guard) and ends here.
        let mut table = self.table();
        if self.live_session().as_deref() != Some(grant.session()) {
            drop(table);
            tracing::info!(
                key = %key,
                "the lock session ended while the lease was being opened; not granting it",
            );
            return Ok(None);
        }
        let grant = grant.take();
        let token = grant.token();
        let lease = Lease::new(LeaseParts {
            id: id.clone(),
            grant,
            member: spec.member.clone(),
            owner: spec.owner.clone(),
            ttl: spec.ttl,
            acquired_at: holder.acquired_at(),
            position: start,
            committed,
            high_watermark: high,
            feed,
            group_client,
            locks: self.locks.clone(),
        });
        table.install(lease.clone(), spec.via);
        drop(table);
        metrics::counter!(crate::metrics::LEASES_GRANTED).increment(1);
        tracing::info!(parent: &lease.span, member = %spec.member, offset = start, "lease granted");
        tracing::debug!(
            parent: &lease.span,
            lock_us = locked.as_micros() as u64,
            watermarks_us = steps[0].as_micros() as u64,
            committed_us = steps[1].as_micros() as u64,
            metadata_us = steps[2].as_micros() as u64,
            assign_us = assigned.as_micros() as u64,
            open_us = opening.elapsed().as_micros() as u64,
            "the Acquire's steps",
        );
        self.spawn_supervisor(lease.clone());
        let snapshot = lease.snapshot();
        Ok(Some(Granted {
            lease_id: id,
            key,
            fencing_token: token,
            offset: start,
            high_watermark: high,
            expires_at: snapshot.expires_at,
            ttl: spec.ttl,
            gateway: self.instance.clone(),
        }))
    }

    /// Ends the lease when it has been idle past its TTL.
    fn spawn_supervisor(&self, lease: Arc<Lease>) {
        let span = lease.span.clone();
        let gateway = self.me.clone();
        tokio::spawn(
            async move {
                if lease.expired().await {
                    if let Some(gateway) = gateway.upgrade() {
                        tracing::info!("lease expired");
                        gateway.end_lease(&lease, EndReason::Expired).await;
                    }
                }
            }
            .instrument(span),
        );
    }
}
