//! The workload: a producer writing unique values with acks=all, clients looping Acquire /
//! Read / process / Commit with random Seeks, Releases, broken streams, abandoned leases and
//! stalls past their TTL, and an observer reading the group's committed offsets from Kafka.
//! Everything they see goes into the history.
//!
//! Longer than most files here because the client styles (lease holders, Subscribe members,
//! queue consumers), the producer and the observer share one recorder, one reading of a
//! client error as an outcome and one commit discipline; apart, each would carry its own
//! copy, and the checker's reading of the history depends on their being the same.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::stream::FuturesUnordered;
use futures::StreamExt;
use kafka_lease_client::{
    AckOutcome, AcquireOptions, Client, Delivery, Error, Lease, Partition, QueueOptions,
    ReadOptions, SeekTo, SubscribeOptions, Subscription, SubscriptionEvent,
};
use rand::seq::IndexedRandom;
use rand::Rng;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use kafka_lease_chaos::history::{self, Event, Op, Outcome};

pub(crate) const GROUP: &str = "chaos";
pub(crate) const TOPIC: &str = "chaos";
/// Where queue-mode consumers' dead letters go (created with the topic).
pub(crate) const DEAD_LETTER_TOPIC: &str = "dlq.chaos.chaos";
/// The deliveries a queue-mode record gets before the gateway dead-letters it.
const MAX_DELIVERIES: u32 = 3;
/// The lease TTL the clients ask for.
pub(crate) const LEASE_TTL: Duration = Duration::from_secs(3);
/// The longest a client waits for one call before it counts the outcome unknown.
const CALL_DEADLINE: Duration = Duration::from_secs(10);

/// Writes events to the history with times on one clock.
#[derive(Debug, Clone)]
pub(crate) struct Recorder {
    start: Instant,
    tx: mpsc::UnboundedSender<Event>,
}

impl Recorder {
    pub(crate) fn new(start: Instant, tx: mpsc::UnboundedSender<Event>) -> Recorder {
        Recorder { start, tx }
    }

    /// Milliseconds since the run began.
    pub(crate) fn now(&self) -> f64 {
        self.start.elapsed().as_secs_f64() * 1000.0
    }

    pub(crate) fn record(&self, process: &str, op: Op) {
        self.record_at(self.now(), process, op);
    }

    /// Records an event that happened at `t_ms` (the history is sorted by time when read).
    pub(crate) fn record_at(&self, t_ms: f64, process: &str, op: Op) {
        let _ = self.tx.send(Event {
            t_ms,
            process: process.to_string(),
            op,
        });
    }
}

/// The leases the clients hold now, by lease id: (partition, serving gateway). The nemesis
/// reads it to aim at a gateway that serves leases.
pub(crate) type LiveLeases = Arc<Mutex<HashMap<String, (i32, String)>>>;

/// How an error ended a call, for the history.
fn outcome_of(error: &Error) -> Outcome {
    match error {
        Error::InvalidArgument { .. }
        | Error::NotFound { .. }
        | Error::Busy { .. }
        | Error::LeaseEnded { .. }
        | Error::FailedPrecondition { .. }
        | Error::OutOfRange { .. }
        | Error::Superseded { .. } => Outcome::Failed,
        _ => Outcome::Unknown,
    }
}

fn short(error: &Error) -> String {
    let text = error.to_string();
    text.chars().take(200).collect()
}

/// How one client behaves: the odds of each action at each tick.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Behaviour {
    pub(crate) seek: f64,
    pub(crate) break_stream: f64,
    pub(crate) stall: f64,
    pub(crate) abandon: f64,
    /// The odds that a lease is held for 30 to 90 s rather than 3 to 10 s.
    pub(crate) long_hold: f64,
    /// At a lease's end, the odds of sending the last commit and the Release together.
    pub(crate) commit_with_release: f64,
}

impl Default for Behaviour {
    fn default() -> Self {
        Behaviour {
            seek: 0.05,
            break_stream: 0.04,
            stall: 0.015,
            abandon: 0.15,
            commit_with_release: 0.3,
            long_hold: 0.3,
        }
    }
}

/// How a client uses the leases it acquires.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Style {
    /// Read, process and commit, with the odds of each action.
    Read(Behaviour),
    /// Queue mode: Deliver, answering each record (mostly accept, some retries, a few
    /// rejects to the dead letter topic) until it lets go: a Release (which commits what
    /// was done), or going quiet past its TTL.
    Queue,
}

/// One client: its own connection to one gateway, looping over leases until `stop`.
pub(crate) async fn client_loop(
    name: String,
    endpoint: String,
    via: String,
    recorder: Recorder,
    live: LiveLeases,
    style: Style,
    mut stop: watch::Receiver<bool>,
) {
    let mut client: Option<Client> = None;
    while !*stop.borrow() {
        let Some(c) = connected(&mut client, &endpoint, &mut stop).await else {
            continue;
        };
        let Some(lease) = acquire(&name, &c, &via, &recorder, &mut stop).await else {
            continue;
        };
        live.lock().unwrap_or_else(|p| p.into_inner()).insert(
            lease.lease_id().to_string(),
            (lease.partition(), lease.gateway().to_string()),
        );
        let id = lease.lease_id().to_string();
        match style {
            Style::Read(behaviour) => hold(&name, &c, lease, &recorder, behaviour, &mut stop).await,
            Style::Queue => hold_queue(&name, &c, lease, &recorder, &mut stop).await,
        }
        live.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
    }
}

/// Sleeps `d` or until stop.
async fn pause(stop: &mut watch::Receiver<bool>, d: Duration) {
    let _ = tokio::time::timeout(d, stop.wait_for(|s| *s)).await;
}

/// The identity of a lease in the history.
struct Held {
    lease: String,
    partition: i32,
    token: u64,
}

impl Held {
    fn ended(&self, recorder: &Recorder, name: &str, reason: String) {
        self.ended_at(recorder.now(), recorder, name, reason);
    }

    /// The lease ended at `t_ms` (a client that stalled let it go when it stopped).
    fn ended_at(&self, t_ms: f64, recorder: &Recorder, name: &str, reason: String) {
        recorder.record_at(
            t_ms,
            name,
            Op::LeaseEnded {
                lease: self.lease.clone(),
                partition: self.partition,
                token: self.token,
                reason,
            },
        );
    }
}

/// Reads, processes and commits under one lease until it ends or the client lets it go.
async fn hold(
    name: &str,
    client: &Client,
    lease: Lease,
    recorder: &Recorder,
    behaviour: Behaviour,
    stop: &mut watch::Receiver<bool>,
) {
    let held = Held {
        lease: lease.lease_id().to_string(),
        partition: lease.partition(),
        token: lease.fencing_token(),
    };
    let start_offset = lease.offset();
    // Most leases are held for a few seconds; some for longer than a Consul session's TTL
    // (2 x 10 s), so that a holder that keeps going while cut off is still there when its
    // partition is given to another.
    let millis = if rand::rng().random_bool(behaviour.long_hold) {
        rand::rng().random_range(30_000..90_000)
    } else {
        rand::rng().random_range(3_000..10_000)
    };
    let until = Instant::now() + Duration::from_millis(millis);
    let read = ReadOptions::new()
        .max_records(100)
        .max_wait(Duration::from_millis(300));
    let mut stream = match tokio::time::timeout(CALL_DEADLINE, lease.records(read)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return held.ended(recorder, name, format!("read refused: {}", short(&e))),
        Err(_) => return held.ended(recorder, name, "read: no answer within 10 s".into()),
    };
    // The offset after the last record processed.
    let mut next: Option<i64> = None;
    let mut tick = tokio::time::interval(Duration::from_millis(400));
    loop {
        tokio::select! {
            batch = stream.next_batch() => match batch {
                Some(Ok(batch)) => {
                    let offsets: Vec<i64> = batch.records.iter().map(|r| r.offset).collect();
                    let values = batch
                        .records
                        .iter()
                        .map(|r| String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into_owned())
                        .collect();
                    next = offsets.last().map(|o| o + 1).or(next);
                    recorder.record(name, Op::Batch {
                        lease: held.lease.clone(),
                        partition: held.partition,
                        token: held.token,
                        offsets,
                        values,
                    });
                    if rand::rng().random_bool(0.5) {
                        if let Some(offset) = next {
                            if !commit(name, &lease, &held, offset, recorder).await {
                                return;
                            }
                        }
                    }
                }
                Some(Err(e)) => {
                    return held.ended(recorder, name, format!("read ended: {}", short(&e)));
                }
                None => return held.ended(recorder, name, "read ended without an error".into()),
            },
            _ = tick.tick() => {
                if *stop.borrow() || Instant::now() >= until {
                    break;
                }
                let roll: f64 = rand::rng().random();
                if roll < behaviour.seek {
                    let upto = next.unwrap_or(start_offset).max(start_offset);
                    let to = rand::rng().random_range(start_offset..=upto);
                    let invoked = recorder.now();
                    let result = tokio::time::timeout(CALL_DEADLINE, lease.seek(SeekTo::Offset(to))).await;
                    let (outcome, resolved, error) = match result {
                        Ok(Ok(done)) => (Outcome::Ok, Some(done.offset), None),
                        Ok(Err(e)) => (outcome_of(&e), None, Some(short(&e))),
                        Err(_) => (Outcome::Unknown, None, Some("no answer within 10 s".into())),
                    };
                    recorder.record(name, Op::Seek {
                        invoked_ms: invoked,
                        lease: held.lease.clone(),
                        partition: held.partition,
                        token: held.token,
                        to,
                        resolved,
                        outcome,
                        error,
                    });
                    match outcome {
                        Outcome::Ok => next = resolved,
                        _ => return held.ended(recorder, name, "seek failed".into()),
                    }
                } else if roll < behaviour.seek + behaviour.break_stream {
                    // A broken stream: the client drops its Read and opens another, which
                    // starts at the lease's resume point.
                    drop(stream);
                    stream = match tokio::time::timeout(CALL_DEADLINE, lease.records(read)).await {
                        Ok(Ok(s)) => s,
                        Ok(Err(e)) => return held.ended(recorder, name, format!("reopen refused: {}", short(&e))),
                        Err(_) => return held.ended(recorder, name, "reopen: no answer within 10 s".into()),
                    };
                    next = None;
                } else if roll < behaviour.seek + behaviour.break_stream + behaviour.stall {
                    // A stall past the TTL: no Read, no call; the lease must end, and the
                    // commit after it must be refused.
                    let stalled = recorder.now();
                    drop(stream);
                    tokio::time::sleep(LEASE_TTL + Duration::from_millis(1500)).await;
                    if let Some(offset) = next {
                        commit(name, &lease, &held, offset, recorder).await;
                    }
                    return held.ended_at(stalled, recorder, name, history::STALLED.into());
                }
            }
        }
    }
    drop(stream);
    if rand::rng().random_bool(behaviour.abandon) {
        // Gone quiet: the gateway ends the lease after its TTL.
        return held.ended(recorder, name, history::ABANDONED.into());
    }
    match next {
        Some(offset) if rand::rng().random_bool(behaviour.commit_with_release) => {
            // A commit and the Release sent together, as a client that commits in the
            // background and lets go at shutdown does: the Release must not free the
            // partition before the commit has landed or failed.
            tokio::join!(
                commit(name, &lease, &held, offset, recorder),
                release(name, client, &held, recorder)
            );
        }
        Some(offset) => {
            if commit(name, &lease, &held, offset, recorder).await {
                release(name, client, &held, recorder).await;
            }
        }
        None => release(name, client, &held, recorder).await,
    }
}

/// Releases the lease and records it.
async fn release(name: &str, client: &Client, held: &Held, recorder: &Recorder) {
    let invoked = recorder.now();
    let request = kafka_lease_client::proto::ReleaseRequest {
        lease_id: held.lease.clone(),
        commit_offset: None,
    };
    let mut raw = client.raw();
    let result = tokio::time::timeout(CALL_DEADLINE, raw.release(request)).await;
    let (outcome, error) = match result {
        Ok(Ok(_)) => (Outcome::Ok, None),
        Ok(Err(status)) => {
            let e = Error::from(status);
            (outcome_of(&e), Some(short(&e)))
        }
        Err(_) => (Outcome::Unknown, Some("no answer within 10 s".into())),
    };
    recorder.record(
        name,
        Op::Release {
            invoked_ms: invoked,
            lease: held.lease.clone(),
            partition: held.partition,
            token: held.token,
            outcome,
            error,
        },
    );
}

/// Commits and records it; false when the lease is over (the caller stops using it).
async fn commit(name: &str, lease: &Lease, held: &Held, offset: i64, recorder: &Recorder) -> bool {
    commit_with(name, held, offset, recorder, || lease.commit(offset)).await
}

/// Commits with `call` and records it; false when the lease is over (a refusal or no
/// answer ends it: the caller stops using it).
async fn commit_with<F, Fut>(
    name: &str,
    held: &Held,
    offset: i64,
    recorder: &Recorder,
    call: F,
) -> bool
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<(), Error>>,
{
    match commit_quietly(name, held, offset, recorder, call).await {
        None => true,
        Some(error) => {
            held.ended(recorder, name, format!("commit failed: {error}"));
            false
        }
    }
}

/// Writes `v<n>` values round-robin over the partitions at about `rate` a second, acks=all,
/// idempotent, at most 64 in flight.
pub(crate) async fn producer_loop(
    bootstrap: String,
    partitions: i32,
    rate: u32,
    recorder: Recorder,
    mut stop: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("acks", "all")
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .set("message.timeout.ms", "20000")
        .create()?;
    let mut in_flight = FuturesUnordered::new();
    let mut n: u64 = 0;
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(rate.max(1))));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick(), if in_flight.len() < 64 && !*stop.borrow() => {
                let value = format!("v{n}");
                let partition = (n % partitions as u64) as i32;
                n += 1;
                let producer = producer.clone();
                in_flight.push(async move {
                    let record = FutureRecord::<(), _>::to(TOPIC).partition(partition).payload(value.as_bytes());
                    let result = producer.send(record, Duration::from_secs(25)).await;
                    (value, result.map(|d| (d.partition, d.offset)).map_err(|(e, _)| e.to_string()))
                });
            }
            Some((value, result)) = in_flight.next() => match result {
                Ok((partition, offset)) => recorder.record("producer", Op::Produced { partition, offset, value }),
                Err(error) => recorder.record("producer", Op::ProduceUnknown { value, error }),
            },
            _ = stop.changed() => {}
        }
        if *stop.borrow() && in_flight.is_empty() {
            return Ok(());
        }
    }
}

/// A consumer that never joins the group, for reading its committed offsets and the
/// watermarks.
pub(crate) fn observer_consumer(bootstrap: &str) -> anyhow::Result<BaseConsumer> {
    Ok(ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", GROUP)
        .set("enable.auto.commit", "false")
        .create()?)
}

/// The fencing token a commit's metadata names (`kafka-lease token=<t>;…`).
pub(crate) fn token_of(metadata: &str) -> Option<u64> {
    let rest = metadata.strip_prefix("kafka-lease token=")?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// The group's committed offsets and their metadata, by partition.
pub(crate) fn committed(
    consumer: &BaseConsumer,
    partitions: i32,
) -> anyhow::Result<BTreeMap<i32, (i64, String)>> {
    let mut list = TopicPartitionList::new();
    for p in 0..partitions {
        list.add_partition(TOPIC, p);
    }
    let got = consumer.committed_offsets(list, Duration::from_secs(3))?;
    let mut out = BTreeMap::new();
    for element in got.elements() {
        if let Offset::Offset(o) = element.offset() {
            out.insert(element.partition(), (o, element.metadata().to_string()));
        }
    }
    Ok(out)
}

/// Polls the committed offsets every 250 ms and records each change.
pub(crate) async fn observer_loop(
    bootstrap: String,
    partitions: i32,
    recorder: Recorder,
    mut stop: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let consumer = Arc::new(observer_consumer(&bootstrap)?);
    let mut seen: BTreeMap<i32, (i64, String)> = BTreeMap::new();
    while !*stop.borrow() {
        let c = consumer.clone();
        if let Ok(Ok(now)) = tokio::task::spawn_blocking(move || committed(&c, partitions)).await {
            for (partition, (offset, metadata)) in now {
                if seen.get(&partition) != Some(&(offset, metadata.clone())) {
                    recorder.record(
                        "observer",
                        Op::Committed {
                            partition,
                            offset,
                            token: token_of(&metadata),
                            metadata: metadata.clone(),
                        },
                    );
                    seen.insert(partition, (offset, metadata));
                }
            }
        }
        pause(&mut stop, Duration::from_millis(250)).await;
    }
    Ok(())
}

/// A client connected to `endpoint`, made once and kept; `None` (after a pause) when the
/// gateway does not answer.
async fn connected(
    client: &mut Option<Client>,
    endpoint: &str,
    stop: &mut watch::Receiver<bool>,
) -> Option<Client> {
    if let Some(c) = client {
        return Some(c.clone());
    }
    match tokio::time::timeout(CALL_DEADLINE, Client::connect(endpoint.to_string())).await {
        Ok(Ok(c)) => {
            *client = Some(c.clone());
            Some(c)
        }
        _ => {
            pause(stop, Duration::from_millis(500)).await;
            None
        }
    }
}

/// A member's lease, as the member tracks it.
struct MemberLease {
    held: Held,
    handle: Partition,
    /// Where the lease started.
    start: i64,
    /// The offset after the last record processed.
    next: Option<i64>,
}

/// A Subscribe member: joins the group through one gateway, takes what it is assigned,
/// processes and commits, seeks now and then, commits when asked to give a partition up,
/// and leaves after 10 to 40 s (its stream ends), to join again a moment later.
pub(crate) async fn member_loop(
    name: String,
    endpoint: String,
    via: String,
    recorder: Recorder,
    live: LiveLeases,
    mut stop: watch::Receiver<bool>,
) {
    let mut client: Option<Client> = None;
    while !*stop.borrow() {
        let Some(c) = connected(&mut client, &endpoint, &mut stop).await else {
            continue;
        };
        let options = SubscribeOptions::new(GROUP, [TOPIC])
            .member(name.clone())
            .max_records(100)
            .max_wait(Duration::from_millis(300))
            .revoke_grace(Duration::from_secs(2));
        let subscription = match tokio::time::timeout(CALL_DEADLINE, c.subscribe(options)).await {
            Ok(Ok(s)) => s,
            _ => {
                pause(&mut stop, Duration::from_millis(500)).await;
                continue;
            }
        };
        let stay = Duration::from_millis(rand::rng().random_range(10_000..40_000));
        member_session(&name, subscription, &via, &recorder, &live, stay, &mut stop).await;
        let away = Duration::from_millis(rand::rng().random_range(1_000..5_000));
        pause(&mut stop, away).await;
    }
}

/// One membership: from the join until the member leaves or its stream ends.
async fn member_session(
    name: &str,
    mut subscription: Subscription,
    via: &str,
    recorder: &Recorder,
    live: &LiveLeases,
    stay: Duration,
    stop: &mut watch::Receiver<bool>,
) {
    let gateway = subscription.gateway().to_string();
    let until = Instant::now() + stay;
    let mut leases: HashMap<String, MemberLease> = HashMap::new();
    let mut tick = tokio::time::interval(Duration::from_millis(400));
    let ended = loop {
        tokio::select! {
            event = subscription.next_event() => match event {
                Some(Ok(SubscriptionEvent::Assigned { partition, offset, .. })) => {
                    let held = Held {
                        lease: partition.lease_id().to_string(),
                        partition: partition.partition(),
                        token: partition.fencing_token(),
                    };
                    recorder.record(name, Op::Acquired {
                        invoked_ms: recorder.now(),
                        lease: held.lease.clone(),
                        partition: held.partition,
                        token: held.token,
                        offset,
                        gateway: gateway.clone(),
                        via: via.to_string(),
                    });
                    live.lock().unwrap_or_else(|p| p.into_inner())
                        .insert(held.lease.clone(), (held.partition, gateway.clone()));
                    leases.insert(held.lease.clone(), MemberLease { held, handle: partition, start: offset, next: None });
                }
                Some(Ok(SubscriptionEvent::Records { partition, batch })) => {
                    let Some(lease) = leases.get_mut(partition.lease_id()) else {
                        continue;
                    };
                    let offsets: Vec<i64> = batch.records.iter().map(|r| r.offset).collect();
                    let values = batch
                        .records
                        .iter()
                        .map(|r| String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into_owned())
                        .collect();
                    lease.next = batch.next_offset().or(lease.next);
                    recorder.record(name, Op::Batch {
                        lease: lease.held.lease.clone(),
                        partition: lease.held.partition,
                        token: lease.held.token,
                        offsets,
                        values,
                    });
                    if rand::rng().random_bool(0.5) {
                        if let Some(offset) = lease.next {
                            let handle = &lease.handle;
                            commit_quietly(name, &lease.held, offset, recorder, || handle.commit(offset)).await;
                        }
                    }
                }
                Some(Ok(SubscriptionEvent::Revoking { partition, .. })) => {
                    // Commit what was processed: that lets the partition move at once.
                    if let Some(lease) = leases.get(partition.lease_id()) {
                        if let Some(offset) = lease.next {
                            let handle = &lease.handle;
                            commit_quietly(name, &lease.held, offset, recorder, || handle.commit(offset)).await;
                        }
                    }
                }
                Some(Ok(SubscriptionEvent::Revoked { partition, reason, message })) => {
                    if let Some(lease) = leases.remove(partition.lease_id()) {
                        let why: String = message.chars().take(160).collect();
                        lease.held.ended(recorder, name, format!("revoked ({reason:?}): {why}"));
                        live.lock().unwrap_or_else(|p| p.into_inner()).remove(&lease.held.lease);
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => break format!("the subscription ended: {}", short(&e)),
                None => break "the subscription ended without an error".to_string(),
            },
            _ = tick.tick() => {
                if *stop.borrow() || Instant::now() >= until {
                    // Leaving: the last commits first, as a member shutting down would.
                    for lease in leases.values() {
                        if let Some(offset) = lease.next {
                            if rand::rng().random_bool(0.7) {
                                let handle = &lease.handle;
                                commit_quietly(name, &lease.held, offset, recorder, || handle.commit(offset)).await;
                            }
                        }
                    }
                    break history::MEMBER_LEFT.to_string();
                }
                if rand::rng().random_bool(0.05) {
                    let ids: Vec<String> = leases.keys().cloned().collect();
                    let Some(id) = ids.choose(&mut rand::rng()) else { continue };
                    let Some(lease) = leases.get_mut(id) else { continue };
                    let upto = lease.next.unwrap_or(lease.start).max(lease.start);
                    let to = rand::rng().random_range(lease.start..=upto);
                    let invoked = recorder.now();
                    let result = tokio::time::timeout(CALL_DEADLINE, lease.handle.seek(SeekTo::Offset(to))).await;
                    let (outcome, resolved, error) = match result {
                        Ok(Ok(done)) => (Outcome::Ok, Some(done.offset), None),
                        Ok(Err(e)) => (outcome_of(&e), None, Some(short(&e))),
                        Err(_) => (Outcome::Unknown, None, Some("no answer within 10 s".into())),
                    };
                    recorder.record(name, Op::Seek {
                        invoked_ms: invoked,
                        lease: lease.held.lease.clone(),
                        partition: lease.held.partition,
                        token: lease.held.token,
                        to,
                        resolved,
                        outcome,
                        error,
                    });
                    if outcome == Outcome::Ok {
                        lease.next = resolved;
                    }
                }
            }
        }
    };
    drop(subscription);
    for lease in leases.into_values() {
        lease.held.ended(recorder, name, ended.clone());
        live.lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&lease.held.lease);
    }
}

/// Commits and records it, without ending the lease on a refusal (a member's lease ends
/// when the gateway says so, with `revoked`); the error when it did not take effect.
/// Retryable refusals (the gateway waits for Consul or Kafka) are retried, as a client
/// should, within the call's deadline.
async fn commit_quietly<F, Fut>(
    name: &str,
    held: &Held,
    offset: i64,
    recorder: &Recorder,
    call: F,
) -> Option<String>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<(), Error>>,
{
    let invoked = recorder.now();
    let result = tokio::time::timeout(CALL_DEADLINE, async {
        loop {
            match call().await {
                Err(e) if e.is_retryable() => {
                    tokio::time::sleep(e.retry_after().unwrap_or(Duration::from_millis(200))).await;
                }
                other => return other,
            }
        }
    })
    .await;
    let (outcome, error) = match result {
        Ok(Ok(())) => (Outcome::Ok, None),
        Ok(Err(e)) => (outcome_of(&e), Some(short(&e))),
        Err(_) => (Outcome::Unknown, Some("no answer within 10 s".into())),
    };
    recorder.record(
        name,
        Op::Commit {
            invoked_ms: invoked,
            lease: held.lease.clone(),
            partition: held.partition,
            token: held.token,
            offset,
            outcome,
            error: error.clone(),
        },
    );
    error
}

/// One Acquire, recorded; the lease, or `None` after a pause.
async fn acquire(
    name: &str,
    client: &Client,
    via: &str,
    recorder: &Recorder,
    stop: &mut watch::Receiver<bool>,
) -> Option<Lease> {
    let invoked = recorder.now();
    let options = AcquireOptions::new(GROUP, TOPIC)
        .member(name.to_string())
        .ttl(LEASE_TTL)
        .wait(Duration::from_secs(2))
        .retries(0);
    let (outcome, error, busy) =
        match tokio::time::timeout(CALL_DEADLINE, client.acquire(options)).await {
            Ok(Ok(lease)) => {
                recorder.record(
                    name,
                    Op::Acquired {
                        invoked_ms: invoked,
                        lease: lease.lease_id().to_string(),
                        partition: lease.partition(),
                        token: lease.fencing_token(),
                        offset: lease.offset(),
                        gateway: lease.gateway().to_string(),
                        via: via.to_string(),
                    },
                );
                return Some(lease);
            }
            Ok(Err(e)) => (outcome_of(&e), short(&e), matches!(e, Error::Busy { .. })),
            Err(_) => (Outcome::Unknown, "no answer within 10 s".to_string(), false),
        };
    recorder.record(
        name,
        Op::AcquireFailed {
            invoked_ms: invoked,
            outcome,
            error,
            via: via.to_string(),
        },
    );
    if !busy {
        pause(stop, Duration::from_millis(300)).await;
    }
    None
}

/// Answers one delivery as the roll says, and records it; false when the lease is over.
async fn answer(name: &str, held: &Held, delivery: &Delivery, recorder: &Recorder) -> bool {
    let roll: f64 = rand::rng().random();
    let invoked = recorder.now();
    let (kind, result) = if roll < 0.9 {
        (
            "accept",
            tokio::time::timeout(CALL_DEADLINE, delivery.accept()).await,
        )
    } else if roll < 0.97 {
        (
            "retry",
            tokio::time::timeout(
                CALL_DEADLINE,
                delivery.retry(Duration::from_millis(200), "chaos: try again"),
            )
            .await,
        )
    } else {
        (
            "reject",
            tokio::time::timeout(CALL_DEADLINE, delivery.reject("chaos: rejected")).await,
        )
    };
    let (outcome, error, over) = match result {
        Ok(Ok(AckOutcome::Applied)) => (Outcome::Ok, None, false),
        Ok(Ok(other)) => (Outcome::Failed, Some(format!("{other:?}")), false),
        Ok(Err(e)) => {
            let over = matches!(e, Error::LeaseEnded { .. } | Error::NotFound { .. });
            (outcome_of(&e), Some(short(&e)), over)
        }
        Err(_) => (
            Outcome::Unknown,
            Some("no answer within 10 s".into()),
            false,
        ),
    };
    recorder.record(
        name,
        Op::Ack {
            invoked_ms: invoked,
            lease: held.lease.clone(),
            partition: held.partition,
            token: held.token,
            offset: delivery.offset(),
            attempt: delivery.attempt,
            answer: kind.to_string(),
            terminal: kind != "retry" || delivery.attempt >= MAX_DELIVERIES,
            outcome,
            error,
        },
    );
    !over
}

/// Takes deliveries under one lease until it ends or the consumer lets it go.
async fn hold_queue(
    name: &str,
    client: &Client,
    lease: Lease,
    recorder: &Recorder,
    stop: &mut watch::Receiver<bool>,
) {
    let held = Held {
        lease: lease.lease_id().to_string(),
        partition: lease.partition(),
        token: lease.fencing_token(),
    };
    let options = QueueOptions::new()
        .ack_deadline(Duration::from_secs(5))
        .max_deliveries(MAX_DELIVERIES)
        .dead_letter_topic(DEAD_LETTER_TOPIC);
    let mut deliveries = match tokio::time::timeout(CALL_DEADLINE, lease.deliveries(options)).await
    {
        Ok(Ok(d)) => d,
        Ok(Err(e)) => return held.ended(recorder, name, format!("deliver refused: {}", short(&e))),
        Err(_) => return held.ended(recorder, name, "deliver: no answer within 10 s".into()),
    };
    let until = Instant::now() + Duration::from_millis(rand::rng().random_range(5_000..30_000));
    let mut tick = tokio::time::interval(Duration::from_millis(400));
    loop {
        tokio::select! {
            delivery = deliveries.next() => match delivery {
                Some(Ok(delivery)) => {
                    let value = String::from_utf8_lossy(delivery.record.value.as_deref().unwrap_or_default()).into_owned();
                    recorder.record(name, Op::Batch {
                        lease: held.lease.clone(),
                        partition: held.partition,
                        token: held.token,
                        offsets: vec![delivery.offset()],
                        values: vec![value],
                    });
                    if !answer(name, &held, &delivery, recorder).await {
                        return held.ended(recorder, name, "an answer found the lease ended".into());
                    }
                }
                Some(Err(e)) => return held.ended(recorder, name, format!("deliveries ended: {}", short(&e))),
                None => return held.ended(recorder, name, "deliveries ended without an error".into()),
            },
            _ = tick.tick() => {
                if *stop.borrow() || Instant::now() >= until {
                    break;
                }
                if rand::rng().random_bool(0.01) {
                    // Gone quiet past the TTL: the deliveries in flight come again to the
                    // next holder.
                    let stalled = recorder.now();
                    drop(deliveries);
                    tokio::time::sleep(LEASE_TTL + Duration::from_millis(1500)).await;
                    return held.ended_at(stalled, recorder, name, history::STALLED.into());
                }
            }
        }
    }
    drop(deliveries);
    // Release commits what was done.
    release(name, client, &held, recorder).await;
}

/// Every record of the dead letter topic, with the `kafka-lease.*` headers that say where it
/// came from.
pub(crate) fn dead_letters(bootstrap: &str) -> anyhow::Result<Vec<Op>> {
    use rdkafka::message::{Headers, Message};
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "chaos-dead-letter-reader")
        .set("enable.auto.commit", "false")
        .create()?;
    let metadata = consumer.fetch_metadata(Some(DEAD_LETTER_TOPIC), Duration::from_secs(5))?;
    let partitions: Vec<i32> = metadata
        .topics()
        .iter()
        .filter(|t| t.name() == DEAD_LETTER_TOPIC)
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect();
    let mut list = TopicPartitionList::new();
    // Partition → (low, high, next offset to read, records read).
    let mut progress: BTreeMap<i32, (i64, i64, i64, u64)> = BTreeMap::new();
    for &p in &partitions {
        let (low, high) =
            consumer.fetch_watermarks(DEAD_LETTER_TOPIC, p, Duration::from_secs(5))?;
        if high > low {
            list.add_partition_offset(DEAD_LETTER_TOPIC, p, Offset::Offset(low))?;
            progress.insert(p, (low, high, low, 0));
        }
    }
    let mut out = Vec::new();
    if progress.is_empty() {
        return Ok(out);
    }
    consumer.assign(&list)?;
    // Until every partition was read up to its high watermark, or nothing came for 10 s.
    let mut idle = 0;
    while idle < 20 {
        // The consumer's position also passes what is not a record (a transaction marker).
        if let Ok(positions) = consumer.position() {
            for e in positions.elements() {
                if let (Some(entry), Offset::Offset(at)) =
                    (progress.get_mut(&e.partition()), e.offset())
                {
                    entry.2 = entry.2.max(at);
                }
            }
        }
        if progress.values().all(|&(_, high, next, _)| next >= high) {
            break;
        }
        let Some(message) = consumer.poll(Duration::from_millis(500)) else {
            idle += 1;
            continue;
        };
        idle = 0;
        let message = message?;
        if let Some(entry) = progress.get_mut(&message.partition()) {
            entry.2 = entry.2.max(message.offset() + 1);
            entry.3 += 1;
        }
        let mut fields: HashMap<String, String> = HashMap::new();
        if let Some(headers) = message.headers() {
            for h in headers.iter() {
                if let Some(v) = h.value {
                    fields.insert(h.key.to_string(), String::from_utf8_lossy(v).into_owned());
                }
            }
        }
        let field = |k: &str| fields.get(k).cloned().unwrap_or_default();
        out.push(Op::DeadLetter {
            partition: field("kafka-lease.partition").parse().unwrap_or(-1),
            offset: field("kafka-lease.offset").parse().unwrap_or(-1),
            token: field("kafka-lease.fencing-token").parse().ok(),
            attempts: field("kafka-lease.attempts").parse().ok(),
            reason: field("kafka-lease.reason"),
        });
    }
    let short: Vec<String> = progress
        .iter()
        .filter(|(_, &(_, high, next, _))| next < high)
        .map(|(p, &(low, high, next, read))| {
            format!("partition {p}: {read} records read, offsets {low}..{next} of {low}..{high}")
        })
        .collect();
    if !short.is_empty() {
        anyhow::bail!("nothing more came for 10 s: {}", short.join("; "));
    }
    Ok(out)
}
