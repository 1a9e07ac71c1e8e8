//! Churn with a checker: clients on two gateways repeatedly acquire, read (reopening their
//! Read within a lease now and then), commit and release (or vanish) while a chaos loop aborts
//! clients, SIGKILLs a gateway, then restarts both gateways in turn with SIGTERM (a rolling
//! restart). A sampler reads Kafka's committed offsets and their metadata (which names the
//! fencing token of the lease that wrote them) all along. A checker then asserts that no commit
//! ever succeeded from a superseded lease (ownership never overlapped), accepted commits never
//! moved backwards, Kafka's committed offset never went back to an older lease's (no commit
//! landed late), and every record produced, during the chaos too, was delivered at least once.
//!
//! Bounded for CI (40 s of chaos, then a drain); `KAFKA_LEASE_CHURN_SECS=600` runs it longer.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use kafka_lease_client::{AcquireOptions, Client, ReadOptions};
use kafka_lease_testkit::{unique_name, Services};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use support::{create_topic, kafka_committed, produce_n, producer, unique_prefix, GatewayProcess};
use tokio::time::Instant;

const PARTITIONS: i32 = 4;
const RECORDS_PER_PARTITION: usize = 300;
const WORKERS: usize = 6;

/// One lease as a worker saw it.
#[derive(Debug, Clone)]
struct Entry {
    worker: usize,
    partition: i32,
    token: u64,
    gateway: String,
    acquired_at: Instant,
    start_offset: i64,
    delivered: Vec<i64>,
    /// (when the request was sent, offset) of each commit the gateway accepted.
    commits: Vec<(Instant, i64)>,
    /// A commit sent whose answer never came back (its worker was aborted).
    unanswered: Option<i64>,
    ended: Option<&'static str>,
}

#[derive(Default)]
struct Log {
    entries: Vec<Entry>,
    kills: usize,
    rolling_restarts: usize,
    aborted_workers: usize,
    reopened_reads: usize,
}

type SharedLog = Arc<Mutex<Log>>;

/// Per partition, each distinct `(fencing token, committed offset)` Kafka was seen to hold, in
/// the order seen.
type SharedHistory = Arc<Mutex<BTreeMap<i32, Vec<(u64, i64)>>>>;

fn log(log: &SharedLog) -> std::sync::MutexGuard<'_, Log> {
    log.lock().unwrap_or_else(|p| p.into_inner())
}

async fn worker(
    id: usize,
    endpoints: Arc<RwLock<Vec<String>>>,
    group: String,
    topic: String,
    shared: SharedLog,
) {
    let mut round = 0_usize;
    loop {
        round += 1;
        let endpoint = {
            let endpoints = endpoints.read().unwrap_or_else(|p| p.into_inner());
            endpoints[(id + round) % endpoints.len()].clone()
        };
        let Ok(client) = Client::connect(endpoint).await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let options = AcquireOptions::new(&group, &topic)
            .member(format!("worker-{id}"))
            .ttl(Duration::from_secs(2))
            .wait(Duration::from_secs(2));
        let Ok(lease) = client.acquire(options).await else {
            continue;
        };
        let index = {
            let mut log = log(&shared);
            log.entries.push(Entry {
                worker: id,
                partition: lease.partition(),
                token: lease.fencing_token(),
                gateway: lease.gateway().to_string(),
                acquired_at: Instant::now(),
                start_offset: lease.offset(),
                delivered: Vec::new(),
                commits: Vec::new(),
                unanswered: None,
                ended: None,
            });
            log.entries.len() - 1
        };
        let target = 10 + (id * 7 + round * 13) % 50;
        let mut next = lease.offset();
        // Every other lease reopens its Read once half-way, without `from_offset`: the new
        // Read starts at the resume point, so records come again (at least once, never less).
        let reopen_after = if round.is_multiple_of(2) {
            target / 2
        } else {
            usize::MAX
        };
        let mut delivered = 0;
        let mut reopened = false;
        'reads: while delivered < target {
            let Ok(mut stream) = lease.records(ReadOptions::new().max_records(20)).await else {
                break;
            };
            while delivered < target {
                if !reopened && delivered >= reopen_after {
                    reopened = true;
                    continue 'reads;
                }
                match tokio::time::timeout(Duration::from_secs(1), stream.next_batch()).await {
                    Ok(Some(Ok(batch))) => {
                        let offsets: Vec<i64> = batch.records.iter().map(|r| r.offset).collect();
                        delivered += offsets.len();
                        if let Some(n) = batch.next_offset() {
                            next = n;
                        }
                        log(&shared).entries[index].delivered.extend(offsets);
                    }
                    _ => break 'reads,
                }
            }
        }
        if reopened {
            log(&shared).reopened_reads += 1;
        }
        let sent = Instant::now();
        // Noted before it is sent: a worker aborted mid-call (the chaos, or the end of the
        // drain) leaves a commit whose outcome nobody heard, which may still have landed.
        log(&shared).entries[index].unanswered = Some(next);
        let accepted = lease.commit(next).await.is_ok();
        {
            let mut log = log(&shared);
            log.entries[index].unanswered = None;
            if accepted {
                log.entries[index].commits.push((sent, next));
            }
        }
        if round.is_multiple_of(5) {
            // Vanish: no Release, the lease lapses after its TTL.
            log(&shared).entries[index].ended = Some("vanished");
            drop(lease);
        } else {
            let how = if lease.release().await.is_ok() {
                "released"
            } else {
                "release failed"
            };
            log(&shared).entries[index].ended = Some(how);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn churn_never_overlaps_never_goes_back_and_delivers_everything() {
    let services = kafka_lease_testkit::require_services!();
    let budget = Duration::from_secs(
        std::env::var("KAFKA_LEASE_CHURN_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(40),
    );
    let prefix = unique_prefix();
    let mut a = GatewayProcess::start(&services, &prefix, &unique_name("churn-a"), &[]).await;
    let mut b = GatewayProcess::start(&services, &prefix, &unique_name("churn-b"), &[]).await;
    let topic = create_topic(&services, PARTITIONS).await;
    let producer = producer(&services);
    for partition in 0..PARTITIONS {
        produce_n(&producer, &topic, partition, RECORDS_PER_PARTITION).await;
    }
    let group = unique_name("churn");
    let endpoints = Arc::new(RwLock::new(vec![a.endpoint(), b.endpoint()]));
    let shared: SharedLog = Arc::default();
    let spawn = |id: usize| {
        tokio::spawn(worker(
            id,
            endpoints.clone(),
            group.clone(),
            topic.clone(),
            shared.clone(),
        ))
    };
    let mut workers: Vec<_> = (0..WORKERS).map(spawn).collect();

    // More records keep arriving while the chaos runs.
    let produced: Arc<Mutex<BTreeMap<i32, usize>>> = Arc::new(Mutex::new(
        (0..PARTITIONS)
            .map(|p| (p, RECORDS_PER_PARTITION))
            .collect(),
    ));
    let producing = {
        let (topic, produced) = (topic.clone(), produced.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(100)).await;
                for partition in 0..PARTITIONS {
                    produce_n(&producer, &topic, partition, 5).await;
                    *produced
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .entry(partition)
                        .or_default() += 5;
                }
            }
        })
    };
    // Kafka's committed offsets as they change, with the token of the lease that wrote each.
    let history: SharedHistory = Arc::default();
    let sampling = {
        let (topic, history) = (topic.clone(), history.clone());
        let consumer: Arc<BaseConsumer> = Arc::new(
            ClientConfig::new()
                .set("bootstrap.servers", &services.kafka_bootstrap)
                .set("group.id", &group)
                .create()
                .expect("sampling consumer"),
        );
        tokio::spawn(async move {
            loop {
                let (consumer, topic) = (consumer.clone(), topic.clone());
                let seen =
                    tokio::task::spawn_blocking(move || committed_with_tokens(&consumer, &topic))
                        .await
                        .unwrap_or_default();
                {
                    let mut history = history.lock().unwrap_or_else(|p| p.into_inner());
                    for (partition, entry) in seen {
                        let list = history.entry(partition).or_default();
                        if list.last() != Some(&entry) {
                            list.push(entry);
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    let started = Instant::now();
    let mut chaos_round = 0_usize;
    while started.elapsed() < budget {
        tokio::time::sleep(Duration::from_millis(700)).await;
        chaos_round += 1;
        // Abort one client mid-whatever: its connection drops, its lease lapses.
        let victim = chaos_round % WORKERS;
        workers[victim].abort();
        workers[victim] = spawn(victim);
        log(&shared).aborted_workers += 1;
        if log(&shared).kills == 0 && started.elapsed() >= budget / 3 {
            a.signal("KILL");
            a.wait_exit(Duration::from_secs(10)).await;
            log(&shared).kills += 1;
            a = GatewayProcess::start(&services, &prefix, &unique_name("churn-a2"), &[]).await;
            endpoints.write().unwrap_or_else(|p| p.into_inner())[0] = a.endpoint();
        }
        // Then a rolling restart: SIGTERM each gateway in turn, start a new one in its place.
        let restarts = log(&shared).rolling_restarts;
        if restarts < 2 && started.elapsed() >= budget * (3 + restarts as u32) / 6 {
            let (gateway, slot) = if restarts == 0 {
                (&mut b, 1)
            } else {
                (&mut a, 0)
            };
            gateway.signal("TERM");
            let code = gateway.wait_exit(Duration::from_secs(15)).await;
            assert_eq!(
                code,
                Some(0),
                "a graceful stop exits 0; log: {}",
                gateway.log()
            );
            *gateway =
                GatewayProcess::start(&services, &prefix, &unique_name("churn-r"), &[]).await;
            endpoints.write().unwrap_or_else(|p| p.into_inner())[slot] = gateway.endpoint();
            log(&shared).rolling_restarts += 1;
        }
    }
    producing.abort();
    let _ = producing.await;
    // Chaos over: the workers drain what is left.
    let produced = produced.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let covered = |shared: &SharedLog| {
        let log = log(shared);
        let mut seen: BTreeMap<i32, BTreeSet<i64>> = BTreeMap::new();
        for e in &log.entries {
            seen.entry(e.partition).or_default().extend(&e.delivered);
        }
        produced
            .iter()
            .all(|(p, n)| seen.get(p).map_or(0, BTreeSet::len) >= *n)
    };
    let drain_deadline = Instant::now() + Duration::from_secs(60);
    while !covered(&shared) && Instant::now() < drain_deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let drained = covered(&shared);
    for w in &workers {
        w.abort();
    }
    sampling.abort();
    let _ = sampling.await;
    let history = history.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let log = log(&shared);

    // The checker.
    let mut overlaps = Vec::new();
    let mut backwards = Vec::new();
    let mut by_partition: BTreeMap<i32, Vec<&Entry>> = BTreeMap::new();
    for e in &log.entries {
        by_partition.entry(e.partition).or_default().push(e);
    }
    let mut delivered_total = 0;
    let mut duplicates = 0;
    let mut late = Vec::new();
    if !drained {
        // What the next look needs: per partition, what is missing, and its last leases.
        for (p, n) in &produced {
            let seen: BTreeSet<i64> = by_partition
                .get(p)
                .into_iter()
                .flatten()
                .flat_map(|e| e.delivered.iter().copied())
                .collect();
            let missing: Vec<i64> = (0..*n as i64).filter(|o| !seen.contains(o)).collect();
            println!(
                "partition {p}: {} of {n} delivered; missing {} (first {:?})",
                seen.len(),
                missing.len(),
                &missing[..missing.len().min(10)]
            );
            let entries: &[&Entry] = by_partition.get(p).map_or(&[], Vec::as_slice);
            for e in &entries[entries.len().saturating_sub(6)..] {
                println!(
                    "  worker {} token {} on {} at +{:?}: from {}, delivered {} ({:?}..{:?}), \
                     commits {:?}, ended {:?}",
                    e.worker,
                    e.token,
                    e.gateway,
                    e.acquired_at.duration_since(started),
                    e.start_offset,
                    e.delivered.len(),
                    e.delivered.first(),
                    e.delivered.last(),
                    e.commits.iter().map(|c| c.1).collect::<Vec<_>>(),
                    e.ended
                );
            }
        }
        println!("gateway A's log:\n{}", tail(&a.log(), 80));
        println!("gateway B's log:\n{}", tail(&b.log(), 80));
    }
    assert!(
        drained,
        "the drain did not deliver every produced record within 60 s ({produced:?} produced)"
    );
    for (partition, entries) in &by_partition {
        // Tokens are unique per partition and grow in acquisition order.
        let mut by_time = entries.clone();
        by_time.sort_by_key(|e| e.acquired_at);
        let tokens: Vec<u64> = by_time.iter().map(|e| e.token).collect();
        let mut sorted = tokens.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(
            tokens, sorted,
            "partition {partition}: tokens grow with each new holder"
        );
        // A commit sent after a newer holder's Acquire returned must have been refused: if one
        // was accepted, two holders overlapped.
        for e in entries {
            for (sent, offset) in &e.commits {
                if let Some(newer) = entries
                    .iter()
                    .find(|n| n.token > e.token && n.acquired_at < *sent)
                {
                    overlaps.push(format!(
                        "partition {partition}: commit {offset} by token {} accepted after token {} was granted",
                        e.token, newer.token
                    ));
                }
            }
        }
        // Accepted commits, in the order they were sent, never go backwards.
        let mut commits: Vec<(Instant, i64, u64)> = entries
            .iter()
            .flat_map(|e| e.commits.iter().map(move |(t, o)| (*t, *o, e.token)))
            .collect();
        commits.sort();
        for pair in commits.windows(2) {
            if pair[1].1 < pair[0].1 {
                backwards.push(format!(
                    "partition {partition}: {} then {}",
                    pair[0].1, pair[1].1
                ));
            }
        }
        // Every new holder starts where the last accepted commit left the partition.
        let delivered: Vec<i64> = entries
            .iter()
            .flat_map(|e| e.delivered.iter().copied())
            .collect();
        delivered_total += delivered.len();
        let unique: BTreeSet<i64> = delivered.iter().copied().collect();
        duplicates += delivered.len() - unique.len();
        let produced_here = produced.get(partition).copied().unwrap_or_default() as i64;
        let missing: Vec<i64> = (0..produced_here).filter(|o| !unique.contains(o)).collect();
        assert!(
            missing.is_empty(),
            "partition {partition}: of {produced_here} records produced, never delivered \
             {missing:?}"
        );
        // Kafka's committed offset never goes back to an older lease's: a commit of a lease
        // that landed after a newer holder's commit would show its older token again.
        let tokens_seen: Vec<u64> = history
            .get(partition)
            .map(|h| h.iter().map(|(token, _)| *token).collect())
            .unwrap_or_default();
        if let Some(pair) = tokens_seen.windows(2).find(|w| w[1] < w[0]) {
            late.push(format!(
                "partition {partition}: Kafka's committed offset went from token {} back to \
                 token {} (history {:?})",
                pair[0],
                pair[1],
                history.get(partition)
            ));
        }
        // Kafka ends with the last accepted commit, or with a commit of the same lease or a
        // newer one whose answer was lost when its worker was aborted: never with an older
        // lease's.
        let last = commits.last().map(|c| (c.2, c.1));
        let in_kafka = committed_with_token(&services, &group, &topic, *partition);
        let explained = in_kafka == last
            || in_kafka.is_some_and(|(token, offset)| {
                last.is_none_or(|(last_token, _)| token >= last_token)
                    && entries
                        .iter()
                        .any(|e| e.token == token && e.unanswered == Some(offset))
            });
        assert!(
            explained,
            "partition {partition}: Kafka has (token, offset) {in_kafka:?}; the last accepted \
             commit was {last:?}"
        );
    }
    println!(
        "churn: {} s, {} records, {} leases, {} reopened Reads, {} client aborts, {} gateway kills, {} graceful restarts, {} deliveries, {} duplicates, {} overlaps, {} backward commits, {} committed-offset changes seen, {} late commits",
        started.elapsed().as_secs(),
        produced.values().sum::<usize>(),
        log.entries.len(),
        log.reopened_reads,
        log.aborted_workers,
        log.kills,
        log.rolling_restarts,
        delivered_total,
        duplicates,
        overlaps.len(),
        backwards.len(),
        history.values().map(Vec::len).sum::<usize>(),
        late.len()
    );
    let per_gateway: BTreeMap<&str, usize> =
        log.entries.iter().fold(BTreeMap::new(), |mut m, e| {
            *m.entry(e.gateway.as_str()).or_default() += 1;
            m
        });
    println!(
        "leases per gateway: {per_gateway:?}; workers seen: {}",
        log.entries
            .iter()
            .map(|e| e.worker)
            .collect::<BTreeSet<_>>()
            .len()
    );
    assert!(overlaps.is_empty(), "{overlaps:#?}");
    assert!(backwards.is_empty(), "{backwards:#?}");
    assert!(late.is_empty(), "{late:#?}");
    assert!(
        history.values().map(Vec::len).sum::<usize>() >= PARTITIONS as usize,
        "the sampler saw the committed offsets change: {history:?}"
    );
    assert!(
        log.reopened_reads > 0,
        "workers reopened Reads within a lease"
    );
    assert_eq!(log.kills, 1, "the gateway kill happened");
    assert_eq!(
        log.rolling_restarts, 2,
        "both gateways were restarted gracefully"
    );
    let ended: usize = log.entries.iter().filter(|e| e.ended.is_some()).count();
    assert!(
        ended > 0 && log.entries.iter().any(|e| e.start_offset > 0),
        "leases ended and resumed"
    );
}

/// Kafka's committed `(token, offset)` for one partition of the group, read afresh.
fn committed_with_token(
    services: &Services,
    group: &str,
    topic: &str,
    partition: i32,
) -> Option<(u64, i64)> {
    let (offset, metadata) = kafka_committed(services, group, topic, partition)?;
    let token = token_of(&metadata)?;
    Some((token, offset))
}

/// The fencing token named by a commit's metadata (`kafka-lease token=<t>;…`).
fn token_of(metadata: &str) -> Option<u64> {
    metadata
        .strip_prefix("kafka-lease token=")?
        .split(';')
        .next()?
        .parse()
        .ok()
}

/// The group's committed offset of every partition of `topic`, each with the fencing token
/// its metadata names (`kafka-lease token=<t>;…`), as Kafka's coordinator has them now.
fn committed_with_tokens(consumer: &BaseConsumer, topic: &str) -> Vec<(i32, (u64, i64))> {
    let mut query = TopicPartitionList::new();
    for partition in 0..PARTITIONS {
        query.add_partition(topic, partition);
    }
    let Ok(answer) = consumer.committed_offsets(query, Duration::from_secs(5)) else {
        return Vec::new();
    };
    answer
        .elements()
        .iter()
        .filter_map(|entry| {
            let Offset::Offset(offset) = entry.offset() else {
                return None;
            };
            let token = token_of(entry.metadata())?;
            Some((entry.partition(), (token, offset)))
        })
        .collect()
}

/// The last `n` lines of `text`.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
