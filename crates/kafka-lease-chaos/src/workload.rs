//! The workload: a producer writing unique values with acks=all, clients looping Acquire /
//! Read / process / Commit with random Seeks, Releases, broken streams, abandoned leases and
//! stalls past their TTL, and an observer reading the group's committed offsets from Kafka.
//! Everything they see goes into the history.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::stream::FuturesUnordered;
use futures::StreamExt;
use kafka_lease_client::{AcquireOptions, Client, Error, Lease, ReadOptions, SeekTo};
use rand::Rng;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use kafka_lease_chaos::history::{Event, Op, Outcome};

pub(crate) const GROUP: &str = "chaos";
pub(crate) const TOPIC: &str = "chaos";
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

/// One client: its own connection to one gateway, looping over leases until `stop`.
pub(crate) async fn client_loop(
    name: String,
    endpoint: String,
    via: String,
    recorder: Recorder,
    live: LiveLeases,
    behaviour: Behaviour,
    mut stop: watch::Receiver<bool>,
) {
    let mut client: Option<Client> = None;
    while !*stop.borrow() {
        let c = match &client {
            Some(c) => c.clone(),
            None => {
                match tokio::time::timeout(CALL_DEADLINE, Client::connect(endpoint.clone())).await {
                    Ok(Ok(c)) => {
                        client = Some(c.clone());
                        c
                    }
                    _ => {
                        pause(&mut stop, Duration::from_millis(500)).await;
                        continue;
                    }
                }
            }
        };
        let invoked = recorder.now();
        let options = AcquireOptions::new(GROUP, TOPIC)
            .member(name.clone())
            .ttl(LEASE_TTL)
            .wait(Duration::from_secs(2))
            .retries(0);
        let acquired = tokio::time::timeout(CALL_DEADLINE, c.acquire(options)).await;
        let lease = match acquired {
            Ok(Ok(lease)) => lease,
            Ok(Err(e)) => {
                let busy = matches!(e, Error::Busy { .. });
                recorder.record(
                    &name,
                    Op::AcquireFailed {
                        invoked_ms: invoked,
                        outcome: outcome_of(&e),
                        error: short(&e),
                        via: via.clone(),
                    },
                );
                if !busy {
                    pause(&mut stop, Duration::from_millis(300)).await;
                }
                continue;
            }
            Err(_) => {
                recorder.record(
                    &name,
                    Op::AcquireFailed {
                        invoked_ms: invoked,
                        outcome: Outcome::Unknown,
                        error: "no answer within 10 s".into(),
                        via: via.clone(),
                    },
                );
                continue;
            }
        };
        recorder.record(
            &name,
            Op::Acquired {
                invoked_ms: invoked,
                lease: lease.lease_id().to_string(),
                partition: lease.partition(),
                token: lease.fencing_token(),
                offset: lease.offset(),
                gateway: lease.gateway().to_string(),
                via: via.clone(),
            },
        );
        live.lock().unwrap_or_else(|p| p.into_inner()).insert(
            lease.lease_id().to_string(),
            (lease.partition(), lease.gateway().to_string()),
        );
        let id = lease.lease_id().to_string();
        hold(&name, &c, lease, &recorder, behaviour, &mut stop).await;
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
        recorder.record(
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
                    drop(stream);
                    tokio::time::sleep(LEASE_TTL + Duration::from_millis(1500)).await;
                    if let Some(offset) = next {
                        commit(name, &lease, &held, offset, recorder).await;
                    }
                    return held.ended(recorder, name, "stalled past its TTL".into());
                }
            }
        }
    }
    drop(stream);
    if rand::rng().random_bool(behaviour.abandon) {
        // Gone quiet: the gateway ends the lease after its TTL.
        return held.ended(recorder, name, "abandoned".into());
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
    let invoked = recorder.now();
    // Retryable refusals (the gateway waits for Consul or Kafka) are retried, as a client
    // should, within the call's deadline.
    let result = tokio::time::timeout(CALL_DEADLINE, async {
        loop {
            match lease.commit(offset).await {
                Err(e) if e.is_retryable() => {
                    tokio::time::sleep(e.retry_after().unwrap_or(Duration::from_millis(200))).await;
                }
                other => return other,
            }
        }
    })
    .await;
    let (outcome, error, over) = match result {
        Ok(Ok(())) => (Outcome::Ok, None, false),
        Ok(Err(e)) => (outcome_of(&e), Some(short(&e)), true),
        Err(_) => (Outcome::Unknown, Some("no answer within 10 s".into()), true),
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
    if over {
        held.ended(
            recorder,
            name,
            format!("commit failed: {}", error.unwrap_or_default()),
        );
    }
    !over
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
