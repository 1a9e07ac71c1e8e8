//! `scale`: many concurrent leases on one gateway, each with an open Read, on a topic with as
//! many partitions, each holding one small record. At a low and a high lease count (after a
//! settle time): the gateway's RSS and OS threads from `/proc/<pid>/status`, and Consul's
//! write rate over a window, counted as in `acquire-release` (HTTP requests through a counting
//! proxy in front of Consul, and Raft log entries).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use futures::{StreamExt, TryStreamExt};
use kafka_lease_client::{AcquireOptions, Client, ReadOptions};
use serde_json::{json, Map, Value};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::{acquire, r3, ratio, Row};
use crate::consul::{diff, is_write, CountingProxy, Counts, RawConsul};
use crate::env::{create_topic, proc_cpu_seconds, proc_status, produce_fill, Env, Gateway};
use crate::report::{Chart, ScenarioResult};

const RSS_LIMIT_MIB: f64 = 512.0;
const THREAD_LIMIT: f64 = 64.0;
const LEASES_PER_CONNECTION: usize = 50;
const ACQUIRE_CONCURRENCY: usize = 16;

#[derive(Debug, Clone)]
struct Point {
    leases: usize,
    rss_mib: f64,
    threads: u64,
    /// The gateway's CPU use over the window, in millicores (1000 = one core busy).
    cpu_millicores: f64,
    http_writes_per_s: f64,
    raft_entries_per_s: f64,
    window_counts: Counts,
    window_s: f64,
}

impl Point {
    fn json(&self) -> Value {
        json!({
            "leases": self.leases,
            "rss_mib": r3(self.rss_mib),
            "threads": self.threads,
            "cpu_millicores": r3(self.cpu_millicores),
            "consul_http_writes_per_s": r3(self.http_writes_per_s),
            "raft_entries_per_s": r3(self.raft_entries_per_s),
            "window_s": r3(self.window_s),
            "window_requests": self.window_counts,
        })
    }
}

/// Opens a lease with an open Read for each `(group, partition)`, 16 Acquires at a time,
/// spread over `clients`; counts the leases opened and the records their Reads deliver. The
/// returned tasks hold the leases while they read.
pub(super) async fn open_leases(
    clients: &[Client],
    topic: &str,
    member: &str,
    leases: impl IntoIterator<Item = (String, i32)>,
    opened: &Arc<AtomicU64>,
    delivered: &Arc<AtomicU64>,
) -> Result<Vec<JoinHandle<()>>> {
    futures::stream::iter(leases.into_iter().enumerate())
        .map(|(i, (group, p))| {
            let client = clients[i % clients.len()].clone();
            let (topic, member) = (topic.to_string(), member.to_string());
            let (opened, delivered) = (opened.clone(), delivered.clone());
            async move {
                let lease = acquire(
                    &client,
                    AcquireOptions::new(&group, topic)
                        .partition(p)
                        .member(member)
                        .ttl(Duration::from_secs(60)),
                )
                .await
                .with_context(|| format!("group {group} partition {p}"))?;
                let mut stream = lease
                    .records(ReadOptions::new())
                    .await
                    .with_context(|| format!("Read of {group}/{p}"))?;
                opened.fetch_add(1, Ordering::Relaxed);
                Ok::<_, anyhow::Error>(tokio::spawn(async move {
                    let _lease = lease;
                    while let Some(Ok(batch)) = stream.next_batch().await {
                        delivered.fetch_add(batch.records.len() as u64, Ordering::Relaxed);
                    }
                }))
            }
        })
        .buffer_unordered(ACQUIRE_CONCURRENCY)
        .try_collect()
        .await
}

async fn measure(
    env: &Env,
    gateway: &Gateway,
    proxy: &CountingProxy,
    raft: &mut RawConsul,
    leases: usize,
    delivered: &AtomicU64,
) -> Result<Point> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while (delivered.load(Ordering::Relaxed) as usize) < leases {
        if Instant::now() > deadline {
            bail!(
                "only {} of {leases} open Reads delivered their record within 60 s",
                delivered.load(Ordering::Relaxed)
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    env.progress.say(format!(
        "  scale: {leases} leases open, every Read delivered its record; settling {:.0} s",
        env.plan.scale_settle.as_secs_f64()
    ));
    tokio::time::sleep(env.plan.scale_settle).await;
    env.progress.say(format!(
        "  scale: counting Consul writes over {:.0} s at {leases} leases",
        env.plan.scale_window.as_secs_f64()
    ));
    let cpu0 = proc_cpu_seconds(gateway.pid())?;
    let (s0, r0, t0) = (proxy.snapshot(), raft.raft_index().await?, Instant::now());
    tokio::time::sleep(env.plan.scale_window).await;
    let (rss, threads) = proc_status(gateway.pid())?;
    let cpu1 = proc_cpu_seconds(gateway.pid())?;
    let (s1, r1) = (proxy.snapshot(), raft.raft_index().await?);
    let secs = t0.elapsed().as_secs_f64();
    let window_counts = diff(&s1, &s0);
    let writes: u64 = window_counts
        .iter()
        .filter(|(k, _)| is_write(k))
        .map(|(_, v)| *v)
        .sum();
    let point = Point {
        leases,
        rss_mib: rss as f64 / (1024.0 * 1024.0),
        threads,
        cpu_millicores: (cpu1 - cpu0) / secs * 1000.0,
        http_writes_per_s: writes as f64 / secs,
        raft_entries_per_s: (r1 - r0) as f64 / secs,
        window_counts,
        window_s: secs,
    };
    env.progress.say(format!(
        "  scale: {leases} leases: RSS {:.1} MiB, {} threads, CPU {:.0} millicores, {:.3} Consul HTTP writes/s, {:.3} Raft entries/s",
        point.rss_mib, point.threads, point.cpu_millicores, point.http_writes_per_s, point.raft_entries_per_s
    ));
    Ok(point)
}

pub(crate) async fn run(env: &Env) -> Result<Vec<ScenarioResult>> {
    let name = "scale";
    let (low, high) = env.plan.scale_leases;
    let topic = env.name("scale");
    env.progress
        .say(format!("  {name}: creating a topic of {high} partitions"));
    create_topic(env, &topic, high as i32).await?;
    produce_fill(env, name, &topic, high as i32, 1, 100).await?;
    let proxy = CountingProxy::start(&env.services.consul_http_addr).await?;
    let mut raft = RawConsul::new(&env.services.consul_http_addr);
    let gateway = Gateway::start(
        env,
        &env.prefix(name),
        &env.name("gw-scale"),
        Some(&proxy.http_addr),
    )
    .await?;
    let mut tasks: Vec<JoinHandle<()>> = Vec::new();
    let result = async {
        let (idle_rss, idle_threads) = proc_status(gateway.pid())?;
        let connections = high.div_ceil(LEASES_PER_CONNECTION).max(1);
        let mut clients = Vec::new();
        for _ in 0..connections {
            clients.push(gateway.client().await?);
        }
        let group = env.name("scale");
        let opened = Arc::new(AtomicU64::new(0));
        let delivered = Arc::new(AtomicU64::new(0));
        let mut points = Vec::new();
        let mut from = 0;
        for target in [low, high] {
            let started = Instant::now();
            {
                let _t = env.progress.ticker(
                    format!("{name} opening leases"),
                    opened.clone(),
                    target as u64,
                    "leases with an open Read",
                );
                tasks.extend(
                    open_leases(
                        &clients,
                        &topic,
                        "bench-scale",
                        (from..target).map(|p| (group.clone(), p as i32)),
                        &opened,
                        &delivered,
                    )
                    .await?,
                );
            }
            env.progress.say(format!(
                "  {name}: opened leases {from}..{target} in {:.1}s",
                started.elapsed().as_secs_f64()
            ));
            from = target;
            points.push(measure(env, &gateway, &proxy, &mut raft, target, &delivered).await?);
        }
        Ok::<_, anyhow::Error>((points, idle_rss, idle_threads, connections))
    }
    .await;
    env.progress.say(format!(
        "  {name}: stopping the gateway (it releases every lease)"
    ));
    gateway.stop().await;
    for t in &tasks {
        t.abort();
    }
    let (points, idle_rss, idle_threads, connections) = result?;
    let (lo, hi) = (&points[0], &points[1]);
    let points_json: Vec<Value> = points.iter().map(Point::json).collect();
    let mut common = Map::new();
    common.insert("leases".into(), high.into());
    common.insert("low_leases".into(), low.into());
    common.insert("client_connections".into(), connections.into());
    common.insert(
        "idle_rss_mib".into(),
        r3(idle_rss as f64 / (1024.0 * 1024.0)).into(),
    );
    common.insert("idle_threads".into(), idle_threads.into());
    common.insert("points".into(), points_json.into());
    common.insert("topic_partitions".into(), high.into());
    common.insert("records_per_partition".into(), 1.into());
    common.insert(
        "settle_s".into(),
        env.plan.scale_settle.as_secs_f64().into(),
    );
    common.insert("gateway_args".into(), env.gateway_args.clone().into());

    let rss = Row {
        name: "scale-rss".into(),
        scenario: "scale",
        unit: "MiB RSS",
        gateway: r3(hi.rss_mib),
        baseline: RSS_LIMIT_MIB,
        baseline_kind: "constant: the 512 MiB limit".into(),
        ratio: ratio(hi.rss_mib, RSS_LIMIT_MIB).map(r3),
        ratio_definition: "VmRSS at the high lease count / 512 MiB (met when <= 1)",
        goal: format!("<= 512 MiB at {high} leases"),
        met: hi.rss_mib <= RSS_LIMIT_MIB,
        summary: format!(
            "{:.1} MiB at {low} leases, {:.1} MiB idle; CPU {:.0} / {:.0} millicores at {low} / {high} leases",
            lo.rss_mib,
            idle_rss as f64 / 1048576.0,
            lo.cpu_millicores,
            hi.cpu_millicores
        ),
        details: common.clone(),
        chart: Chart {
            title: "scale: gateway RSS with open Reads".to_string(),
            unit: "MiB".into(),
            groups: vec![
                (
                    "idle".into(),
                    vec![("VmRSS".into(), idle_rss as f64 / 1048576.0)],
                ),
                (format!("{low} leases"), vec![("VmRSS".into(), lo.rss_mib)]),
                (format!("{high} leases"), vec![("VmRSS".into(), hi.rss_mib)]),
            ],
            lines: vec![("limit 512 MiB".into(), RSS_LIMIT_MIB)],
        },
    };
    let threads = Row {
        name: "scale-threads".into(),
        scenario: "scale",
        unit: "OS threads",
        gateway: hi.threads as f64,
        baseline: THREAD_LIMIT,
        baseline_kind: "constant: the 64-thread limit".into(),
        ratio: ratio(hi.threads as f64, THREAD_LIMIT).map(r3),
        ratio_definition: "Threads at the high lease count / 64 (met when <= 1)",
        goal: format!("<= 64 threads at {high} leases"),
        met: hi.threads as f64 <= THREAD_LIMIT,
        summary: format!(
            "{} threads at {low} leases, {idle_threads} idle",
            lo.threads
        ),
        details: common.clone(),
        chart: Chart {
            title: "scale: gateway OS threads with open Reads".into(),
            unit: "threads".into(),
            groups: vec![
                ("idle".into(), vec![("Threads".into(), idle_threads as f64)]),
                (
                    format!("{low} leases"),
                    vec![("Threads".into(), lo.threads as f64)],
                ),
                (
                    format!("{high} leases"),
                    vec![("Threads".into(), hi.threads as f64)],
                ),
            ],
            lines: vec![("limit 64".into(), THREAD_LIMIT)],
        },
    };
    // Both zero: the rate is the same (none) at both counts, which is what the goal asks.
    let (w_ratio, w_met) = match (hi.http_writes_per_s, lo.http_writes_per_s) {
        (h, l) if l > 0.0 => (Some(h / l), (0.5..=2.0).contains(&(h / l))),
        (0.0, _) => (None, true),
        _ => (None, false),
    };
    let mut w_details = common;
    w_details.insert(
        "raft_entries_per_s_high".into(),
        r3(hi.raft_entries_per_s).into(),
    );
    w_details.insert(
        "raft_entries_per_s_low".into(),
        r3(lo.raft_entries_per_s).into(),
    );
    w_details.insert(
        "window_s".into(),
        env.plan.scale_window.as_secs_f64().into(),
    );
    w_details.insert("counting_method".into(), "HTTP PUT/POST/DELETE requests from the gateway to Consul through a counting proxy, over the window (session renewals included: they are the steady-state writes); Raft entries from Stats.raft.last_log_index, any writer".into());
    let writes = Row {
        name: "scale-consul-writes".into(),
        scenario: "scale",
        unit: "Consul HTTP writes/s",
        gateway: r3(hi.http_writes_per_s),
        baseline: r3(lo.http_writes_per_s),
        baseline_kind: format!("measured: the same gateway's rate at {low} leases, same run"),
        ratio: w_ratio.map(r3),
        ratio_definition: "write rate at the high lease count / at the low lease count (null when the low rate is 0)",
        goal: format!("0.5 <= ratio <= 2 ({high} vs {low} leases)"),
        met: w_met,
        summary: format!(
            "Raft entries/s {:.3} at {high}, {:.3} at {low} leases",
            hi.raft_entries_per_s, lo.raft_entries_per_s
        ),
        details: w_details,
        chart: Chart {
            title: "scale: Consul writes per second at steady state".into(),
            unit: "per second".into(),
            groups: vec![
                (format!("{low} leases"), vec![("HTTP writes/s".into(), lo.http_writes_per_s), ("Raft entries/s".into(), lo.raft_entries_per_s)]),
                (format!("{high} leases"), vec![("HTTP writes/s".into(), hi.http_writes_per_s), ("Raft entries/s".into(), hi.raft_entries_per_s)]),
            ],
            lines: Vec::new(),
        },
    };
    Ok(vec![rss.build(), threads.build(), writes.build()])
}
