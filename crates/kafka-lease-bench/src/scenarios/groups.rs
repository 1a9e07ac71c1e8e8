//! `groups`: many consumer groups on one gateway. A topic with one small record per
//! partition; `groups` groups each lease `per_group` partitions of their own, each lease with
//! an open Read that must deliver its record. Then the gateway's RSS and OS threads (goal:
//! <= 64 threads and <= 256 MiB at 100 groups x 10 leases; each group costs the gateway a
//! librdkafka client that stores its offsets, and partitions are fetched through as few of
//! those clients as can, see docs/ARCHITECTURE.md). The same figures at a tenth of the groups
//! first, so the cost of one more group is a slope within one run (docs/CAPACITY.md); then,
//! on another gateway, what a group costs by how its partitions are fetched.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Result};
use serde_json::Map;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::scale::open_leases;
use super::{r3, ratio, Row};
use crate::env::{create_topic, proc_status, produce_fill, Env, Gateway};
use crate::report::{Chart, ScenarioResult};

const RSS_LIMIT_MIB: f64 = 256.0;
const THREAD_LIMIT: f64 = 64.0;
const LEASES_PER_CONNECTION: usize = 50;

async fn delivered_all(delivered: &AtomicU64, expected: u64) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while delivered.load(Ordering::Relaxed) < expected {
        if Instant::now() > deadline {
            bail!(
                "only {} of {expected} open Reads delivered their record within 60 s",
                delivered.load(Ordering::Relaxed)
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

pub(crate) async fn run(env: &Env) -> Result<Vec<ScenarioResult>> {
    let name = "groups";
    let (groups, per_group) = env.plan.groups;
    let partitions = groups * per_group;
    let mid_groups = (groups / 10).max(1);
    let topic = env.name("groups");
    create_topic(env, &topic, partitions as i32).await?;
    produce_fill(env, name, &topic, partitions as i32, 1, 100).await?;
    let gateway = Gateway::start(env, &env.prefix(name), &env.name("gw-groups"), None).await?;
    let mut tasks: Vec<JoinHandle<()>> = Vec::new();
    let result = async {
        let (idle_rss, idle_threads) = proc_status(gateway.pid())?;
        let mut clients = Vec::new();
        for _ in 0..partitions.div_ceil(LEASES_PER_CONNECTION).max(1) {
            clients.push(gateway.client().await?);
        }
        let delivered = Arc::new(AtomicU64::new(0));
        let run_id = env.name("g");
        // Each group on partitions of its own.
        let mut own: Vec<(String, i32)> = (0..partitions)
            .map(|p| (format!("{run_id}-{}", p / per_group), p as i32))
            .collect();
        let started = Instant::now();
        let opened = Arc::new(AtomicU64::new(0));
        // A tenth of the groups first, then the rest: two points of one run.
        let rest = own.split_off(mid_groups * per_group);
        let mut points = Vec::new();
        for (step, leases) in [(mid_groups, own), (groups, rest)] {
            tasks.extend(
                open_leases(
                    &clients,
                    &topic,
                    "bench-groups",
                    leases,
                    &opened,
                    &delivered,
                )
                .await?,
            );
            delivered_all(&delivered, (step * per_group) as u64).await?;
            env.progress.say(format!(
                "  {name}: {step} groups x {per_group} leases open in {:.1}s; settling {:?}",
                started.elapsed().as_secs_f64(),
                env.plan.scale_settle
            ));
            tokio::time::sleep(env.plan.scale_settle).await;
            let (rss, threads) = proc_status(gateway.pid())?;
            env.progress.say(format!(
                "  {name}: {step} groups: RSS {:.1} MiB, {threads} threads",
                rss as f64 / 1048576.0
            ));
            points.push((rss, threads));
        }
        let [(mid_rss, mid_threads), (rss, threads)] = points[..] else {
            bail!("two points measured, not {}", points.len());
        };
        Ok::<_, anyhow::Error>((idle_rss, idle_threads, mid_rss, mid_threads, rss, threads))
    }
    .await;
    gateway.stop().await;
    for t in &tasks {
        t.abort();
    }
    let (idle_rss, idle_threads, mid_rss, mid_threads, rss, threads) = result?;
    let sizes = topic_size_cost(env, &topic, partitions, mid_groups, per_group).await?;
    let mib = |b: u64| b as f64 / 1048576.0;
    // The cost of one more group (with its leases), between the two points.
    let more = (groups - mid_groups).max(1) as f64;
    let rss_per_group = (mib(rss) - mib(mid_rss)) / more;
    let threads_per_group = (threads as f64 - mid_threads as f64) / more;
    let mut details = Map::new();
    details.insert("groups".into(), groups.into());
    details.insert("leases_per_group".into(), per_group.into());
    details.insert("idle_rss_mib".into(), r3(mib(idle_rss)).into());
    details.insert("idle_threads".into(), idle_threads.into());
    details.insert("mid_groups".into(), mid_groups.into());
    details.insert("mid_rss_mib".into(), r3(mib(mid_rss)).into());
    details.insert("mid_threads".into(), mid_threads.into());
    details.insert("rss_mib".into(), r3(mib(rss)).into());
    details.insert("threads".into(), threads.into());
    details.insert("rss_mib_per_group".into(), r3(rss_per_group).into());
    details.insert("threads_per_group".into(), r3(threads_per_group).into());
    details.insert(
        "rss_mib_per_group_by_topic_partitions".into(),
        serde_json::json!({
            sizes.small_partitions.to_string(): r3(sizes.small_per_group_mib),
            partitions.to_string(): r3(sizes.large_per_group_mib),
        }),
    );
    details.insert(
        "rss_kib_per_topic_partition_per_group".into(),
        r3(sizes.kib_per_partition()).into(),
    );
    details.insert(
        "rss_mib_per_group_on_partitions_of_its_own".into(),
        r3(sizes.own_partitions_per_group_mib).into(),
    );
    details.insert("timing".into(), format!("VmRSS and Threads from /proc/<pid>/status {:?} after every Read delivered its record; each group leases partitions of its own", env.plan.scale_settle).into());
    let chart = |title: &str, unit: &str, values: [f64; 3], limit: f64| Chart {
        title: title.into(),
        unit: unit.into(),
        groups: vec![
            ("idle".into(), vec![("gateway".into(), values[0])]),
            (
                format!("{mid_groups} groups x {per_group}"),
                vec![("gateway".into(), values[1])],
            ),
            (
                format!("{groups} groups x {per_group}"),
                vec![("gateway".into(), values[2])],
            ),
        ],
        lines: vec![(format!("limit {limit}"), limit)],
    };
    let rss_row = Row {
        name: "groups-rss".into(),
        scenario: "groups",
        unit: "MiB",
        gateway: r3(mib(rss)),
        baseline: RSS_LIMIT_MIB,
        baseline_kind: "constant: the 256 MiB limit".into(),
        ratio: ratio(mib(rss), RSS_LIMIT_MIB).map(r3),
        ratio_definition: "VmRSS / 256 MiB (met when <= 1)",
        goal: format!("<= 256 MiB at {groups} groups x {per_group} leases"),
        met: mib(rss) <= RSS_LIMIT_MIB,
        summary: format!(
            "{:.1} MiB ({:.1} idle, {:.1} at {mid_groups} groups: {rss_per_group:.2} MiB per group); \
             another gateway: groups leasing the same partitions, each fetched by a client of its \
             own, {:.2} MiB per group on a topic of {} and {:.2} on one of {partitions} ({:.2} KiB \
             per partition of a topic a client fetches from); groups on partitions of their own, \
             fetched by one client, {:.2}",
            mib(rss),
            mib(idle_rss),
            mib(mid_rss),
            sizes.small_per_group_mib,
            sizes.small_partitions,
            sizes.large_per_group_mib,
            sizes.kib_per_partition(),
            sizes.own_partitions_per_group_mib,
        ),
        details: details.clone(),
        chart: chart(
            "groups: gateway RSS",
            "MiB",
            [mib(idle_rss), mib(mid_rss), mib(rss)],
            RSS_LIMIT_MIB,
        ),
    }
    .build();
    let threads_row = Row {
        name: "groups-threads".into(),
        scenario: "groups",
        unit: "threads",
        gateway: threads as f64,
        baseline: THREAD_LIMIT,
        baseline_kind: "constant: the 64-thread limit".into(),
        ratio: ratio(threads as f64, THREAD_LIMIT).map(r3),
        ratio_definition: "OS threads / 64 (met when <= 1)",
        goal: format!("<= 64 threads at {groups} groups x {per_group} leases"),
        met: threads as f64 <= THREAD_LIMIT,
        summary: format!(
            "{threads} threads ({idle_threads} idle, {mid_threads} at {mid_groups} groups: \
             {threads_per_group:.2} per group)"
        ),
        details,
        chart: chart(
            "groups: gateway OS threads",
            "threads",
            [idle_threads as f64, mid_threads as f64, threads as f64],
            THREAD_LIMIT,
        ),
    }
    .build();
    Ok(vec![rss_row, threads_row])
}

/// What a group costs by how its partitions are fetched: on a topic of few partitions and
/// on one of many when every group leases the same partitions (each group's partitions then
/// fetched by a client of their own, which keeps state for the whole topic), and on the topic
/// of many when each group leases partitions of its own (fetched by one client for all).
struct TopicSizes {
    small_partitions: usize,
    small_per_group_mib: f64,
    large_partitions: usize,
    large_per_group_mib: f64,
    own_partitions_per_group_mib: f64,
}

impl TopicSizes {
    /// librdkafka keeps state for every partition of a topic its client fetches from, leased
    /// or not: the difference between the two slopes where each group's partitions are
    /// fetched by a client of their own, per partition.
    fn kib_per_partition(&self) -> f64 {
        (self.large_per_group_mib - self.small_per_group_mib) * 1024.0
            / (self.large_partitions - self.small_partitions).max(1) as f64
    }
}

/// On a gateway of its own, `groups` groups of `per_group` leases three times: on a topic of
/// `per_group` partitions, every group all of it; on `large` (of `large_partitions`), every
/// group the same `per_group` partitions; on `large` again, each group partitions of its own.
/// The RSS a group adds in each, so the cost of a topic's size is a slope of one run, and what
/// sharing a fetching client saves is beside it.
async fn topic_size_cost(
    env: &Env,
    large: &str,
    large_partitions: usize,
    groups: usize,
    per_group: usize,
) -> Result<TopicSizes> {
    let name = "groups";
    let small = env.name("groups-small");
    create_topic(env, &small, per_group as i32).await?;
    produce_fill(env, name, &small, per_group as i32, 1, 100).await?;
    let gateway = Gateway::start(
        env,
        &env.prefix("groups-topics"),
        &env.name("gw-groups-topics"),
        None,
    )
    .await?;
    let mut tasks: Vec<JoinHandle<()>> = Vec::new();
    let result = async {
        let mut clients = Vec::new();
        for _ in 0..(3 * groups * per_group).div_ceil(LEASES_PER_CONNECTION).max(1) {
            clients.push(gateway.client().await?);
        }
        let (opened, delivered) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let run_id = env.name("gt");
        let (mut rss, _) = proc_status(gateway.pid())?;
        let mut per_group_mib = Vec::new();
        let large = large.to_string();
        let steps = [
            (1, &small, per_group, "every group all of it"),
            (2, &large, large_partitions, "every group the same partitions"),
            (3, &large, large_partitions, "each group partitions of its own"),
        ];
        for (step, topic, partitions, how) in steps {
            let leases: Vec<(String, i32)> = (0..groups * per_group)
                .map(|i| {
                    let group = format!("{run_id}-{step}-{}", i / per_group);
                    let partition = match step {
                        1 | 2 => i % per_group,
                        // Past the partitions step 2 leases.
                        _ => per_group + i,
                    };
                    (group, partition as i32)
                })
                .collect();
            tasks.extend(
                open_leases(&clients, topic, "bench-groups", leases, &opened, &delivered).await?,
            );
            delivered_all(&delivered, (step * groups * per_group) as u64).await?;
            tokio::time::sleep(env.plan.scale_settle).await;
            let (now, _) = proc_status(gateway.pid())?;
            let added = (now as f64 - rss as f64) / 1048576.0 / groups as f64;
            env.progress.say(format!(
                "  {name}: {groups} more groups x {per_group} leases on a topic of {partitions} partitions, {how}: {added:.2} MiB per group"
            ));
            per_group_mib.push(added);
            rss = now;
        }
        Ok::<_, anyhow::Error>(TopicSizes {
            small_partitions: per_group,
            small_per_group_mib: per_group_mib[0],
            large_partitions,
            large_per_group_mib: per_group_mib[1],
            own_partitions_per_group_mib: per_group_mib[2],
        })
    }
    .await;
    gateway.stop().await;
    for t in &tasks {
        t.abort();
    }
    result
}
