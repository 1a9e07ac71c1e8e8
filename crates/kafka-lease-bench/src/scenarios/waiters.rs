//! Standby consumers, as costs to Consul:
//! - `waiters`: the Consul requests per second of a gateway with 1,000 Acquires waiting for
//!   held partitions, against the same gateway with 10 waiting (goal: ratio <= 1.2);
//! - `acquire-contended`: 100 partitions all held, 100 Acquires (any partition) waiting on
//!   another gateway; the holder releases them one at a time, and each release is counted in
//!   Consul Raft writes until a waiter holds the partition (goal: <= 3 per release: the
//!   release, the one lock that wins, and at most one that loses).

use std::time::Duration;

use anyhow::{Context, Result};
use futures::stream::{FuturesUnordered, StreamExt as _};
use kafka_lease_client::{AcquireOptions, Client, Lease};
use serde_json::{json, Map};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::{acquire, r3, ratio, Row};
use crate::consul::{diff, is_write, CountingProxy, RawConsul};
use crate::env::{create_topic, Env, Gateway};
use crate::report::{Chart, ScenarioResult};
use crate::stats::median;

const WAITERS_GOAL: f64 = 1.2;
const CONTENDED_GOAL: f64 = 3.0;
/// Calls per client connection at most (the gateway's default stream limit is 200).
const PER_CONNECTION: usize = 150;

type Waiter = JoinHandle<kafka_lease_client::Result<Lease>>;

/// `count` Acquires for any partition of `topic`, waiting up to `wait`, spread over
/// connections of their own.
async fn start_waiters(
    gateway: &Gateway,
    group: &str,
    topic: &str,
    count: usize,
    wait: Duration,
) -> Result<Vec<Waiter>> {
    let mut clients: Vec<Client> = Vec::new();
    for _ in 0..count.div_ceil(PER_CONNECTION) {
        clients.push(gateway.client().await?);
    }
    Ok((0..count)
        .map(|i| {
            let client = clients[i / PER_CONNECTION].clone();
            let options = AcquireOptions::new(group, topic)
                .member(format!("bench-standby-{i}"))
                .ttl(Duration::from_secs(60))
                .wait(wait);
            tokio::spawn(async move { client.acquire(options).await })
        })
        .collect())
}

/// A counting proxy in front of Consul, a holding gateway, and a waiting gateway whose
/// Consul requests go through the proxy, sharing `scenario`'s key prefix.
async fn gateways(
    env: &Env,
    scenario: &str,
    holder: &str,
    waiting: &str,
) -> Result<(CountingProxy, Gateway, Gateway)> {
    let prefix = env.prefix(scenario);
    let proxy = CountingProxy::start(&env.services.consul_http_addr).await?;
    let holder = Gateway::start(env, &prefix, &env.name(holder), None).await?;
    match Gateway::start(env, &prefix, &env.name(waiting), Some(&proxy.http_addr)).await {
        Ok(waiting) => Ok((proxy, holder, waiting)),
        Err(e) => {
            holder.stop().await;
            Err(e)
        }
    }
}

/// Holds every partition of `topic` from `client`.
async fn hold_all(
    client: &Client,
    group: &str,
    topic: &str,
    partitions: i32,
) -> Result<Vec<Lease>> {
    let mut held = Vec::new();
    for partition in 0..partitions {
        held.push(
            acquire(
                client,
                AcquireOptions::new(group, topic)
                    .partition(partition)
                    .member("bench-holder")
                    .ttl(Duration::from_secs(120)),
            )
            .await?,
        );
    }
    Ok(held)
}

/// Requests (all kinds) the proxy saw over `window`.
async fn requests_over(proxy: &CountingProxy, window: Duration) -> u64 {
    let before = proxy.snapshot();
    tokio::time::sleep(window).await;
    diff(&proxy.snapshot(), &before).values().sum()
}

pub(crate) async fn waiters(env: &Env) -> Result<Vec<ScenarioResult>> {
    let name = "waiters";
    let (few, many) = env.plan.waiters;
    let topic = env.name("waiters");
    create_topic(env, &topic, 4).await?;
    let (proxy, holder, waiting) = gateways(env, name, "gw-waiters-hold", "gw-waiters").await?;
    let window = env.plan.waiters_window;
    let result = async {
        let group = env.name("waiters");
        let held = hold_all(&holder.client().await?, &group, &topic, 4).await?;
        let mut rounds: Vec<(f64, f64)> = Vec::new();
        for round in 1..=env.plan.rounds {
            let mut rates = [0.0; 2];
            for (i, count) in [few, many].into_iter().enumerate() {
                let wait = env.plan.waiters_settle + window + Duration::from_secs(30);
                let waiters = start_waiters(&waiting, &group, &topic, count, wait).await?;
                tokio::time::sleep(env.plan.waiters_settle).await;
                let requests = requests_over(&proxy, window).await;
                rates[i] = requests as f64 / window.as_secs_f64();
                let finished = waiters.iter().filter(|w| w.is_finished()).count();
                for w in &waiters {
                    w.abort();
                }
                anyhow::ensure!(
                    finished == 0,
                    "{finished} of {count} waiters ended while their partitions were held"
                );
                env.progress.say(format!(
                    "  {name} round {round}/{}: {count} waiting: {:.2} Consul requests/s",
                    env.plan.rounds, rates[i]
                ));
            }
            rounds.push((rates[0], rates[1]));
        }
        for lease in held {
            let _ = lease.release().await;
        }
        Ok::<_, anyhow::Error>(rounds)
    }
    .await;
    waiting.stop().await;
    holder.stop().await;
    let rounds = result?;
    let few_rate = median(&rounds.iter().map(|r| r.0).collect::<Vec<_>>());
    let many_rate = median(&rounds.iter().map(|r| r.1).collect::<Vec<_>>());
    let ratio = ratio(many_rate, few_rate);
    let mut details = Map::new();
    details.insert("requests_per_s_few".into(), r3(few_rate).into());
    details.insert("requests_per_s_many".into(), r3(many_rate).into());
    details.insert("waiters_few_many".into(), json!([few, many]));
    details.insert(
        "rounds".into(),
        rounds
            .iter()
            .map(|(a, b)| json!([r3(*a), r3(*b)]))
            .collect::<Vec<_>>()
            .into(),
    );
    details.insert("timing".into(), format!("Consul HTTP requests of the waiting gateway (through a counting proxy) over {window:?}, {:?} after its waiters were sent; the session renewals are most of them", env.plan.waiters_settle).into());
    let chart = Chart {
        title: format!("waiters: Consul requests/s of a gateway with {few} vs {many} waiting"),
        unit: "requests/s".into(),
        groups: rounds
            .iter()
            .enumerate()
            .map(|(i, (a, b))| {
                (
                    format!("round {}", i + 1),
                    vec![
                        (format!("{few} waiting"), *a),
                        (format!("{many} waiting"), *b),
                    ],
                )
            })
            .collect(),
        lines: vec![],
    };
    Ok(vec![Row {
        name: name.into(),
        scenario: "waiters",
        unit: "Consul requests/s",
        gateway: r3(many_rate),
        baseline: r3(few_rate),
        baseline_kind: format!("the same gateway with {few} waiters, in the same run"),
        ratio: ratio.map(r3),
        ratio_definition: "requests/s with many waiters / with few (met when <= 1.2)",
        goal: format!("ratio <= {WAITERS_GOAL}"),
        met: ratio.is_some_and(|r| r <= WAITERS_GOAL),
        summary: format!("{many_rate:.2} requests/s with {many} waiting, {few_rate:.2} with {few}"),
        details,
        chart,
    }
    .build()])
}

pub(crate) async fn contended(env: &Env) -> Result<Vec<ScenarioResult>> {
    let name = "acquire-contended";
    let (partitions, releases) = env.plan.contended;
    let topic = env.name("contended");
    create_topic(env, &topic, partitions as i32).await?;
    let (proxy, holder, waiting) = gateways(env, name, "gw-contended-hold", "gw-contended").await?;
    let mut raft = RawConsul::new(&env.services.consul_http_addr);
    let result = async {
        let group = env.name("contended");
        let mut held = hold_all(&holder.client().await?, &group, &topic, partitions as i32).await?;
        let waiters = start_waiters(
            &waiting,
            &group,
            &topic,
            partitions,
            Duration::from_secs(120),
        )
        .await?;
        let mut pending: FuturesUnordered<_> = waiters.into_iter().collect();
        // Every waiter has arrived and looked at the topic before the first release.
        tokio::time::sleep(env.plan.waiters_settle).await;
        let mut samples: Vec<(u64, u64, f64)> = Vec::new();
        let mut granted = Vec::new();
        for k in 0..releases {
            let lease = held.pop().context("a held partition to release")?;
            let (r0, c0, t0) = (raft.raft_index().await?, proxy.snapshot(), Instant::now());
            lease.release().await.context("Release")?;
            let got = pending
                .next()
                .await
                .context("a waiter")?
                .context("waiter panicked")?
                .context("the waiting Acquire failed")?;
            let took = t0.elapsed();
            let (r1, c1) = (raft.raft_index().await?, proxy.snapshot());
            let writes: u64 = diff(&c1, &c0)
                .iter()
                .filter(|(k, _)| is_write(k) && !k.contains("session/renew"))
                .map(|(_, v)| *v)
                .sum();
            samples.push((r1 - r0, writes, took.as_secs_f64() * 1000.0));
            granted.push(got);
            if (k + 1) % 10 == 0 || k + 1 == releases {
                env.progress
                    .say(format!("  {name}: {}/{releases} releases", k + 1));
            }
        }
        for w in pending.iter() {
            w.abort();
        }
        for lease in granted.into_iter().chain(held) {
            let _ = lease.release().await;
        }
        Ok::<_, anyhow::Error>(samples)
    }
    .await;
    waiting.stop().await;
    holder.stop().await;
    let samples = result?;
    let n = samples.len().max(1) as f64;
    let raft_per_release = samples.iter().map(|s| s.0).sum::<u64>() as f64 / n;
    let waiter_writes = samples.iter().map(|s| s.1).sum::<u64>() as f64 / n;
    let handoff: Vec<f64> = samples.iter().map(|s| s.2).collect();
    let mut details = Map::new();
    details.insert(
        "raft_writes_per_release".into(),
        r3(raft_per_release).into(),
    );
    details.insert(
        "waiting_gateway_http_writes_per_release".into(),
        r3(waiter_writes).into(),
    );
    details.insert("partitions_and_waiters".into(), partitions.into());
    details.insert("releases".into(), samples.len().into());
    details.insert(
        "release_to_grant_median_ms".into(),
        r3(median(&handoff)).into(),
    );
    details.insert(
        "raft_writes_samples".into(),
        samples.iter().map(|s| s.0).collect::<Vec<_>>().into(),
    );
    details.insert("timing".into(), "Consul Raft log entries (last_log_index) from just before each Release to a waiter's Acquire returning; every partition held, one waiter per partition, all waiting for any partition on one gateway".into());
    let chart = Chart {
        title: format!(
            "acquire-contended: Consul writes per release, {partitions} partitions and waiters"
        ),
        unit: "Raft writes".into(),
        groups: vec![(
            "per release".into(),
            vec![
                ("Raft writes".into(), raft_per_release),
                ("waiting gateway's HTTP writes".into(), waiter_writes),
            ],
        )],
        lines: vec![("goal 3".into(), CONTENDED_GOAL)],
    };
    Ok(vec![Row {
        name: name.into(),
        scenario: "acquire-contended",
        unit: "Consul writes per release",
        gateway: r3(raft_per_release),
        baseline: CONTENDED_GOAL,
        baseline_kind: "constant: the goal's 3 writes (the release, the winning lock, one losing lock)".into(),
        ratio: ratio(raft_per_release, CONTENDED_GOAL).map(r3),
        ratio_definition: "Raft writes per release / 3 (met when <= 1)",
        goal: "<= 3 Consul writes per release".into(),
        met: raft_per_release <= CONTENDED_GOAL,
        summary: format!(
            "{raft_per_release:.2} Raft writes per release ({waiter_writes:.2} HTTP writes by the waiting gateway) over {} releases",
            samples.len()
        ),
        details,
        chart,
    }
    .build()])
}
