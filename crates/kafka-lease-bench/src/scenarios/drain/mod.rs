//! Drain scenarios: read a pre-produced partition (or 16) to the end, through the gateway
//! (the Rust client crate over loopback) versus a direct rdkafka consumer.
//!
//! `arms` runs each arm of a round; `rows` makes the rounds rows and charts; here the
//! scenarios and their rounds.

mod arms;
mod rows;
mod subscribe;

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use serde_json::{json, Map, Value};

use super::{r3, ratio, Row};
use crate::env::{
    create_topic, machine_busy_seconds, proc_cpu_seconds, produce_fill, Env, Gateway,
};
use crate::report::{Chart, ScenarioResult};
use crate::stats::{median, min_max};

use arms::{
    direct_drain, gateway_drain, go_drain, measured_gateway_drain, relay_drain, Arms, GatewaySide,
    ReadVia,
};
pub(crate) use arms::{direct_rate, relay_rate, RELAY_STYLE};
pub(crate) use rows::COUNTING_STYLE;
use rows::{
    chart, common_details, counting_channels, counting_row, cpu_row, go_row, limit_row,
    round_details, startup_details,
};
pub(crate) use subscribe::drain as drain_subscribe;

/// The Read options of the gateway arm: the largest batches the contract allows, and a short
/// fill wait so the last batch of a drain does not sit out the default 100 ms.
const READ_MAX_RECORDS: u32 = 10_000;
const READ_MAX_BYTES: u32 = 4 * 1024 * 1024;
const READ_MAX_WAIT: Duration = Duration::from_millis(10);

/// How the direct arm reads.
pub(crate) const CONSUMER_STYLE: &str =
    "rdkafka BaseConsumer: assign() (no group join, like the gateway), \
     poll() of the consumer's queue in a loop on one dedicated thread, one message at a time; \
     librdkafka settings as the gateway's per-group consumer (GroupClient::new: \
     queued.max.messages.kbytes=2048, queued.min.messages=10000, fetch.wait.max.ms=20, \
     fetch.queue.backoff.ms=2, reconnect.backoff.ms=20, auto commit off)";

/// How long one drain may take before the scenario fails.
const DRAIN_DEADLINE: Duration = Duration::from_secs(600);

/// One drain of one arm.
#[derive(Debug, Clone)]
struct DrainRun {
    records: u64,
    bytes: u64,
    secs: f64,
    /// records/s of each partition: its record count over the time its last record arrived.
    partition_rates: Vec<f64>,
    /// When the first record arrived (seconds after the start), the earliest over partitions.
    first_record_secs: f64,
    /// Records and value bytes that arrived with the first record (its batch, for the
    /// gateway): not counted in the steady-state rate, whose clock starts then.
    first_records: u64,
    first_bytes: u64,
    /// CPU time (user + system) the arm's process used during the drain: the gateway's, or
    /// the bench's own for the direct consumer (which runs in it). `None` when not measured.
    cpu_secs: Option<f64>,
    /// For the gateway arm: the CPU time of the bench process (the Rust client crate
    /// decoding the responses) over the drain.
    client_cpu_secs: Option<f64>,
    /// The machine's busy CPU seconds so far (`machine_busy_seconds`) when the first record
    /// arrived: the start of the steady window. `None` when not read.
    machine_at_first_record: Option<f64>,
    /// CPU time every process on the machine used over the steady window, from the first
    /// record to the last (`/proc/stat`): the broker, the arm's process, its client and
    /// anything else running. `None` when not measured.
    machine_cpu_secs: Option<f64>,
    /// Responses the gateway arm's Reads received (0 for the other arms).
    responses: u64,
}

impl DrainRun {
    /// Microseconds of the client's CPU per record (gateway arm).
    fn client_cpu_us_per_record(&self) -> Option<f64> {
        self.client_cpu_secs
            .filter(|_| self.records > 0)
            .map(|cpu| cpu * 1e6 / self.records as f64)
    }
    /// Notes the machine's busy CPU seconds at the end of the drain (`end`), for the
    /// steady window's CPU.
    fn machine_until(&mut self, end: f64) {
        self.machine_cpu_secs = self.machine_at_first_record.map(|first| end - first);
    }
    /// Microseconds of the whole machine's CPU per record over the steady window (the
    /// records the steady rate counts).
    fn machine_cpu_us_per_record(&self) -> Option<f64> {
        self.machine_cpu_secs
            .filter(|_| !self.steady_window_empty())
            .map(|cpu| cpu * 1e6 / (self.records - self.first_records) as f64)
    }
    /// How many of the machine's cores were busy on average over the steady window.
    fn busy_cores(&self) -> Option<f64> {
        self.machine_cpu_secs
            .filter(|_| !self.steady_window_empty())
            .map(|cpu| cpu / (self.secs - self.first_record_secs))
    }
    /// Microseconds of CPU per record drained.
    fn cpu_us_per_record(&self) -> Option<f64> {
        self.cpu_secs
            .filter(|_| self.records > 0)
            .map(|cpu| cpu * 1e6 / self.records as f64)
    }
    /// Steady-state drain rate: the records after the first arrival over the time from the
    /// first arrival to the last record.
    /// (With tiny counts everything can come in the first batch: then the end-to-end rate.)
    fn rate(&self) -> f64 {
        if self.steady_window_empty() {
            return self.end_to_end_rate();
        }
        (self.records - self.first_records) as f64 / (self.secs - self.first_record_secs)
    }
    fn mb_s(&self) -> f64 {
        if self.steady_window_empty() {
            return self.bytes as f64 / 1e6 / self.secs;
        }
        (self.bytes - self.first_bytes) as f64 / 1e6 / (self.secs - self.first_record_secs)
    }
    fn steady_window_empty(&self) -> bool {
        self.records <= self.first_records || self.secs <= self.first_record_secs
    }
    /// Including start-up: all records over the time from the start to the last record.
    fn end_to_end_rate(&self) -> f64 {
        self.records as f64 / self.secs
    }
    fn fairness(&self) -> f64 {
        let (lo, hi) = min_max(&self.partition_rates);
        lo / hi
    }
}

/// Runs both arms `rounds` times, gateway first in each round, after one unmeasured warm-up
/// drain of each arm (a tenth of the records). Each arm's CPU is that of its process: the
/// gateway (`gateway_pid`) for the gateway arm, the bench itself for the direct one.
async fn rounds(
    env: &Env,
    name: &str,
    side: GatewaySide<'_>,
    topic: &str,
    layout: &[Vec<i32>],
    per_partition: u64,
) -> Result<Arms> {
    let GatewaySide {
        gateway,
        clients,
        go_client,
    } = side;
    let gateway_pid = gateway.pid();
    let partitions: Vec<i32> = layout.iter().flatten().copied().collect();
    let total = per_partition * partitions.len() as u64;
    let warm = (per_partition / 10).max(1);
    env.progress.say(format!(
        "  {name}: warm-up (gateway, direct: {} records each)",
        warm * partitions.len() as u64
    ));
    gateway_drain(
        env,
        clients,
        ReadVia::Lease,
        topic,
        layout,
        warm,
        Arc::default(),
    )
    .await?;
    let channels = counting_channels(gateway, layout.len()).await?;
    gateway_drain(
        env,
        clients,
        ReadVia::Counting(&channels),
        topic,
        layout,
        warm,
        Arc::default(),
    )
    .await?;
    direct_drain(env, topic, &partitions, warm, Arc::default()).await?;
    relay_drain(env, topic, &partitions, warm, Arc::default()).await?;
    if let Some(binary) = go_client {
        go_drain(env, binary, gateway, topic, layout, warm, Arc::default()).await?;
    }
    let mut out = Vec::new();
    let mut relays = Vec::new();
    let mut counting = Vec::new();
    let mut gos = Vec::new();
    for round in 1..=env.plan.rounds {
        let label = format!("{name} round {round}/{}", env.plan.rounds);
        let g = measured_gateway_drain(
            env,
            (&label, "gateway", "client"),
            gateway_pid,
            clients,
            ReadVia::Lease,
            (topic, layout, per_partition),
        )
        .await?;
        let done = Arc::new(AtomicU64::new(0));
        let d = {
            let _t = env
                .progress
                .ticker(format!("{label} direct"), done.clone(), total, "records");
            let cpu0 = proc_cpu_seconds(std::process::id())?;
            let mut run = direct_drain(env, topic, &partitions, per_partition, done).await?;
            run.machine_until(machine_busy_seconds()?);
            run.cpu_secs = Some(proc_cpu_seconds(std::process::id())? - cpu0);
            run
        };
        env.progress.say(format!(
            "  {label} direct: {total} records in {:.2}s, first after {:.3}s; steady {:.0} records/s, {:.1} MB/s; consumer CPU {:.2} us/record; machine CPU {:.2} us/record, {:.2} cores busy",
            d.secs,
            d.first_record_secs,
            d.rate(),
            d.mb_s(),
            d.cpu_us_per_record().unwrap_or(f64::NAN),
            d.machine_cpu_us_per_record().unwrap_or(f64::NAN),
            d.busy_cores().unwrap_or(f64::NAN)
        ));
        let done = Arc::new(AtomicU64::new(0));
        let r = {
            let _t = env
                .progress
                .ticker(format!("{label} relay"), done.clone(), total, "records");
            let mut run = relay_drain(env, topic, &partitions, per_partition, done).await?;
            run.machine_until(machine_busy_seconds()?);
            run
        };
        env.progress.say(format!(
            "  {label} relay (the limit): {total} records in {:.2}s; steady {:.0} records/s, {:.1} MB/s; relay CPU {:.2} us/record; machine CPU {:.2} us/record, {:.2} cores busy",
            r.secs,
            r.rate(),
            r.mb_s(),
            r.cpu_us_per_record().unwrap_or(f64::NAN),
            r.machine_cpu_us_per_record().unwrap_or(f64::NAN),
            r.busy_cores().unwrap_or(f64::NAN)
        ));
        let c = measured_gateway_drain(
            env,
            (&label, "gateway, counting reader", "reader"),
            gateway_pid,
            clients,
            ReadVia::Counting(&channels),
            (topic, layout, per_partition),
        )
        .await?;
        counting.push(c);
        if let Some(binary) = go_client {
            let done = Arc::new(AtomicU64::new(0));
            let _t =
                env.progress
                    .ticker(format!("{label} Go client"), done.clone(), total, "records");
            let cpu0 = proc_cpu_seconds(gateway_pid)?;
            let mut run =
                go_drain(env, binary, gateway, topic, layout, per_partition, done).await?;
            run.cpu_secs = Some(proc_cpu_seconds(gateway_pid)? - cpu0);
            env.progress.say(format!(
                "  {label} Go client: {total} records in {:.2}s, first after {:.3}s; steady {:.0} records/s, {:.1} MB/s; gateway CPU {:.2} us/record, Go client CPU {:.2} us/record",
                run.secs,
                run.first_record_secs,
                run.rate(),
                run.mb_s(),
                run.cpu_us_per_record().unwrap_or(f64::NAN),
                run.client_cpu_us_per_record().unwrap_or(f64::NAN)
            ));
            gos.push(run);
        }
        out.push((g, d));
        relays.push(r);
    }
    Ok(Arms {
        runs: out,
        relays,
        counting,
        gos,
    })
}

/// `drain-1p-1KiB` / `drain-1p-100B`.
pub(crate) async fn one_partition(
    env: &Env,
    name: &str,
    value_size: usize,
    records: usize,
    goal: f64,
) -> Result<Vec<ScenarioResult>> {
    let topic = env.name("drain1");
    create_topic(env, &topic, 1).await?;
    produce_fill(env, name, &topic, 1, records, value_size).await?;
    let gateway = Gateway::start(env, &env.prefix(name), &env.name("gw-drain"), None).await?;
    let client = gateway.client().await?;
    let go_client = env.go_drain().await?;
    let arms = rounds(
        env,
        name,
        GatewaySide {
            gateway: &gateway,
            clients: &[client],
            go_client: go_client.as_deref(),
        },
        &topic,
        &[vec![0]],
        records as u64,
    )
    .await;
    gateway.stop().await;
    let Arms {
        runs,
        relays,
        counting,
        gos,
    } = arms?;
    let g = median(&runs.iter().map(|(g, _)| g.rate()).collect::<Vec<_>>());
    let d = median(&runs.iter().map(|(_, d)| d.rate()).collect::<Vec<_>>());
    let g_mb = median(&runs.iter().map(|(g, _)| g.mb_s()).collect::<Vec<_>>());
    let d_mb = median(&runs.iter().map(|(_, d)| d.mb_s()).collect::<Vec<_>>());
    let ratio = ratio(g, d);
    let mut details = Map::new();
    common_details(&mut details, value_size, records as u64, 1);
    details.insert("gateway_mb_per_s".into(), r3(g_mb).into());
    details.insert("baseline_mb_per_s".into(), r3(d_mb).into());
    startup_details(&mut details, &runs);
    details.insert("rounds".into(), round_details(&runs));
    let scenario = if value_size == 1024 {
        "drain-1p-1KiB"
    } else {
        "drain-1p-100B"
    };
    let cpu = cpu_row(name, scenario, &runs);
    let limit = limit_row(name, scenario, &runs, &relays);
    let go = (!gos.is_empty()).then(|| go_row(name, scenario, &runs, &gos));
    let mut rows = vec![
        Row {
            name: name.to_string(),
            scenario,
            unit: "records/s",
            gateway: r3(g),
            baseline: r3(d),
            baseline_kind: "measured: direct rdkafka BaseConsumer of the same partition, same run"
                .into(),
            ratio: ratio.map(r3),
            ratio_definition: "gateway records/s / direct records/s (medians across rounds)",
            goal: format!(">= {goal}"),
            met: ratio.is_some_and(|r| r >= goal),
            summary: format!(
                "{g_mb:.1} vs {d_mb:.1} MB/s steady; first record after {:.2} vs {:.2} s",
                median(
                    &runs
                        .iter()
                        .map(|(g, _)| g.first_record_secs)
                        .collect::<Vec<_>>()
                ),
                median(
                    &runs
                        .iter()
                        .map(|(_, d)| d.first_record_secs)
                        .collect::<Vec<_>>()
                ),
            ),
            details,
            chart: chart(
                format!("{name}: drain one partition, records/s per round"),
                &runs,
                Some((format!("{goal} x direct median"), goal * d)),
            ),
        }
        .build(),
        cpu,
        limit,
        counting_row(name, scenario, &counting, &relays),
    ];
    rows.extend(go);
    Ok(rows)
}

/// `drain-16p`'s goals: the rate against the direct consumer's, and the slowest partition's
/// against the fastest's.
const DRAIN16_GOAL: f64 = 0.8;
const FAIRNESS_GOAL: f64 = 0.8;

/// `drain-16p`: 16 leases over 4 client connections versus one consumer of all 16.
pub(crate) async fn sixteen_partitions(env: &Env, name: &str) -> Result<Vec<ScenarioResult>> {
    many_partitions(env, name, "drain-16p", 16, env.plan.drain16_per_partition).await
}

/// `drain-64p`: 64 leases over 4 client connections versus one consumer of all 64, the
/// records of `drain-16p` spread over four times the partitions: with `drain-1p-1KiB` and
/// `drain-16p`, the slope of the gateway's CPU per record from 1 to 16 to 64 partitions.
pub(crate) async fn sixty_four_partitions(env: &Env, name: &str) -> Result<Vec<ScenarioResult>> {
    let per_partition = (env.plan.drain16_per_partition / 4).max(1);
    many_partitions(env, name, "drain-64p", 64, per_partition).await
}

/// `partitions` leases over 4 client connections (as many on each) versus one direct
/// consumer assigned them all.
async fn many_partitions(
    env: &Env,
    name: &str,
    scenario: &'static str,
    partitions: i32,
    per_partition: usize,
) -> Result<Vec<ScenarioResult>> {
    let value_size = 1024;
    let topic = env.name(&format!("drain{partitions}"));
    create_topic(env, &topic, partitions).await?;
    produce_fill(env, name, &topic, partitions, per_partition, value_size).await?;
    let gateway = Gateway::start(
        env,
        &env.prefix(name),
        &env.name(&format!("gw-drain{partitions}")),
        None,
    )
    .await?;
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(gateway.client().await?);
    }
    let per_client = partitions / 4;
    let layout: Vec<Vec<i32>> = (0..4)
        .map(|c| (c * per_client..(c + 1) * per_client).collect())
        .collect();
    let arms = rounds(
        env,
        name,
        GatewaySide {
            gateway: &gateway,
            clients: &clients,
            go_client: None,
        },
        &topic,
        &layout,
        per_partition as u64,
    )
    .await;
    gateway.stop().await;
    let Arms {
        runs,
        relays,
        counting,
        ..
    } = arms?;
    let g = median(&runs.iter().map(|(g, _)| g.rate()).collect::<Vec<_>>());
    let d = median(&runs.iter().map(|(_, d)| d.rate()).collect::<Vec<_>>());
    let g_mb = median(&runs.iter().map(|(g, _)| g.mb_s()).collect::<Vec<_>>());
    let d_mb = median(&runs.iter().map(|(_, d)| d.mb_s()).collect::<Vec<_>>());
    let g_fair = median(&runs.iter().map(|(g, _)| g.fairness()).collect::<Vec<_>>());
    let d_fair = median(&runs.iter().map(|(_, d)| d.fairness()).collect::<Vec<_>>());
    let ratio = ratio(g, d);
    let met = ratio.is_some_and(|r| r >= DRAIN16_GOAL) && g_fair >= FAIRNESS_GOAL;
    let mut details = Map::new();
    common_details(
        &mut details,
        value_size,
        per_partition as u64,
        partitions as usize,
    );
    details.insert("client_connections".into(), 4.into());
    details.insert("leases_per_connection".into(), per_client.into());
    details.insert("gateway_mb_per_s".into(), r3(g_mb).into());
    details.insert("baseline_mb_per_s".into(), r3(d_mb).into());
    details.insert(
        "gateway_slowest_over_fastest_partition".into(),
        r3(g_fair).into(),
    );
    details.insert(
        "direct_slowest_over_fastest_partition".into(),
        r3(d_fair).into(),
    );
    details.insert(
        "fairness_definition".into(),
        "per partition: its records over the time its last record arrived (from the arm's start); slowest / fastest, median across rounds".into(),
    );
    startup_details(&mut details, &runs);
    details.insert("rounds".into(), round_details(&runs));
    let cpu = cpu_row(name, scenario, &runs);
    let limit = limit_row(name, scenario, &runs, &relays);
    Ok(vec![
        Row {
        name: name.to_string(),
        scenario,
        unit: "records/s",
        gateway: r3(g),
        baseline: r3(d),
        baseline_kind: format!(
            "measured: one direct rdkafka BaseConsumer assigned all {partitions} partitions, same run"
        ),
        ratio: ratio.map(r3),
        ratio_definition: "gateway records/s / direct records/s (medians across rounds)",
        goal: format!(">= {DRAIN16_GOAL} and slowest/fastest partition >= {FAIRNESS_GOAL}"),
        met,
        summary: format!(
            "{g_mb:.1} vs {d_mb:.1} MB/s; slowest/fastest partition {g_fair:.2} (direct {d_fair:.2})"
        ),
        details,
        chart: chart(
            format!(
                "{name}: {partitions} partitions, 4 connections x {per_client} leases, records/s per round"
            ),
            &runs,
            Some((format!("{DRAIN16_GOAL} x direct median"), DRAIN16_GOAL * d)),
        ),
    }
    .build(),
        cpu,
        limit,
        counting_row(name, scenario, &counting, &relays),
    ])
}

/// `drain-forwarded`: one partition of 1 KiB records, leased on one gateway instance and
/// read through another, which proxies the Read; against the same drain read through the
/// serving instance and a direct consumer, the three arms interleaved in each round.
pub(crate) async fn forwarded(env: &Env, name: &str) -> Result<Vec<ScenarioResult>> {
    let records = env.plan.drain_1k_records;
    let value_size = 1024;
    let goal = 0.8;
    let topic = env.name("drainfwd");
    create_topic(env, &topic, 1).await?;
    produce_fill(env, name, &topic, 1, records, value_size).await?;
    let prefix = env.prefix(name);
    let serving = Gateway::start(env, &prefix, &env.name("gw-serving"), None).await?;
    let other = match Gateway::start(env, &prefix, &env.name("gw-forwarding"), None).await {
        Ok(other) => other,
        Err(e) => {
            serving.stop().await;
            return Err(e);
        }
    };
    let runs = forwarded_rounds(env, name, &serving, &other, &topic, records as u64).await;
    serving.stop().await;
    other.stop().await;
    let runs = runs?;
    let med = |f: &dyn Fn(&(DrainRun, DrainRun, DrainRun)) -> f64| {
        median(&runs.iter().map(f).collect::<Vec<_>>())
    };
    let fwd = med(&|(_, f, _)| f.rate());
    let via_serving = med(&|(g, _, _)| g.rate());
    let direct = med(&|(_, _, d)| d.rate());
    let ratio_gateway = ratio(fwd, via_serving);
    let ratio_direct = ratio(fwd, direct);
    let mut details = Map::new();
    common_details(&mut details, value_size, records as u64, 1);
    details.insert(
        "serving_gateway_records_per_s".into(),
        r3(via_serving).into(),
    );
    details.insert("direct_consumer_records_per_s".into(), r3(direct).into());
    details.insert(
        "forwarded_over_direct_consumer".into(),
        ratio_direct.map(r3).into(),
    );
    details.insert(
        "forwarded_mb_per_s".into(),
        r3(med(&|(_, f, _)| f.mb_s())).into(),
    );
    details.insert(
        "forwarded_first_record_secs".into(),
        r3(med(&|(_, f, _)| f.first_record_secs)).into(),
    );
    details.insert(
        "serving_first_record_secs".into(),
        r3(med(&|(g, _, _)| g.first_record_secs)).into(),
    );
    let hop_cpu = med(&|(_, f, _)| f.cpu_us_per_record().unwrap_or(f64::NAN));
    details.insert(
        "forwarding_instance_cpu_us_per_record".into(),
        r3(hop_cpu).into(),
    );
    // The whole machine's CPU per record in each arm: on cores that are all busy, the rates
    // go as the inverse of these.
    details.insert(
        "serving_arm_machine_cpu_us_per_record".into(),
        r3(med(&|(g, _, _)| {
            g.machine_cpu_us_per_record().unwrap_or(f64::NAN)
        }))
        .into(),
    );
    details.insert(
        "forwarded_arm_machine_cpu_us_per_record".into(),
        r3(med(&|(_, f, _)| {
            f.machine_cpu_us_per_record().unwrap_or(f64::NAN)
        }))
        .into(),
    );
    details.insert(
        "serving_arm_busy_cores".into(),
        r3(med(&|(g, _, _)| g.busy_cores().unwrap_or(f64::NAN))).into(),
    );
    details.insert(
        "forwarded_arm_busy_cores".into(),
        r3(med(&|(_, f, _)| f.busy_cores().unwrap_or(f64::NAN))).into(),
    );
    details.insert(
        "arms".into(),
        "per round, in this order: acquire and read through the serving instance; acquire on the serving instance and read through the other (the Read proxied); a direct rdkafka consumer".into(),
    );
    details.insert(
        "rounds".into(),
        Value::Array(
            runs.iter()
                .enumerate()
                .map(|(i, (g, f, d))| {
                    json!({
                        "round": i + 1,
                        "serving_records_per_s": r3(g.rate()),
                        "forwarded_records_per_s": r3(f.rate()),
                        "direct_records_per_s": r3(d.rate()),
                        "forwarding_instance_cpu_us_per_record":
                            f.cpu_us_per_record().map(r3),
                    })
                })
                .collect(),
        ),
    );
    Ok(vec![Row {
        name: name.to_string(),
        scenario: "drain-forwarded",
        unit: "records/s",
        gateway: r3(fwd),
        baseline: r3(via_serving),
        baseline_kind: "measured: the same drain read through the serving instance, same run"
            .into(),
        ratio: ratio_gateway.map(r3),
        ratio_definition:
            "records/s read through the other instance / through the serving one (medians across rounds)",
        goal: format!(">= {goal}"),
        met: ratio_gateway.is_some_and(|r| r >= goal),
        summary: format!(
            "{fwd:.0} records/s forwarded, {via_serving:.0} through the serving instance, {direct:.0} direct ({} of direct); the forwarding instance's CPU {hop_cpu:.2} us per record",
            ratio_direct.map_or("-".into(), |r| format!("{r:.2}"))
        ),
        details,
        chart: Chart {
            title: format!("{name}: drain one partition through the other instance, records/s per round"),
            unit: "records/s".into(),
            groups: runs
                .iter()
                .enumerate()
                .map(|(i, (g, f, d))| {
                    (
                        format!("round {}", i + 1),
                        vec![
                            ("serving gateway".into(), g.rate()),
                            ("forwarded".into(), f.rate()),
                            ("direct rdkafka".into(), d.rate()),
                        ],
                    )
                })
                .collect(),
            lines: vec![(format!("{goal} x serving median"), goal * via_serving)],
        },
    }
    .build()])
}

/// The three arms of `drain-forwarded`, after one unmeasured warm-up drain of each.
async fn forwarded_rounds(
    env: &Env,
    name: &str,
    serving: &Gateway,
    other: &Gateway,
    topic: &str,
    per_partition: u64,
) -> Result<Vec<(DrainRun, DrainRun, DrainRun)>> {
    let a = [serving.client().await?];
    let b = [other.client().await?];
    let layout = [vec![0]];
    let warm = (per_partition / 10).max(1);
    env.progress.say(format!(
        "  {name}: warm-up (serving, forwarded, direct: {warm} records each)"
    ));
    gateway_drain(
        env,
        &a,
        ReadVia::Lease,
        topic,
        &layout,
        warm,
        Arc::default(),
    )
    .await?;
    gateway_drain(
        env,
        &a,
        ReadVia::Other(&b),
        topic,
        &layout,
        warm,
        Arc::default(),
    )
    .await?;
    direct_drain(env, topic, &[0], warm, Arc::default()).await?;
    let mut out = Vec::new();
    for round in 1..=env.plan.rounds {
        let label = format!("{name} round {round}/{}", env.plan.rounds);
        let arm = |what: &'static str| {
            let done = Arc::new(AtomicU64::new(0));
            let ticker = env.progress.ticker(
                format!("{label} {what}"),
                done.clone(),
                per_partition,
                "records",
            );
            (done, ticker)
        };
        let (done, ticker) = arm("serving");
        let cpu0 = proc_cpu_seconds(serving.pid())?;
        let mut g =
            gateway_drain(env, &a, ReadVia::Lease, topic, &layout, per_partition, done).await?;
        g.machine_until(machine_busy_seconds()?);
        g.cpu_secs = Some(proc_cpu_seconds(serving.pid())? - cpu0);
        drop(ticker);
        let (done, ticker) = arm("forwarded");
        // The forwarding instance's CPU over the forwarded drain: what the hop costs.
        let cpu0 = proc_cpu_seconds(other.pid())?;
        let serving0 = proc_cpu_seconds(serving.pid())?;
        let mut f = gateway_drain(
            env,
            &a,
            ReadVia::Other(&b),
            topic,
            &layout,
            per_partition,
            done,
        )
        .await?;
        f.machine_until(machine_busy_seconds()?);
        f.cpu_secs = Some(proc_cpu_seconds(other.pid())? - cpu0);
        let serving_in_forwarded = proc_cpu_seconds(serving.pid())? - serving0;
        drop(ticker);
        let (done, ticker) = arm("direct");
        let d = direct_drain(env, topic, &[0], per_partition, done).await?;
        drop(ticker);
        env.progress.say(format!(
            "  {label}: serving {:.0}, forwarded {:.0}, direct {:.0} records/s; forwarding \
             instance CPU {:.2} us per record; serving instance CPU {:.2} us per record alone, \
             {:.2} forwarded; machine CPU {:.2} us per record (cores busy {:.2}) through the \
             serving instance, {:.2} ({:.2}) forwarded",
            g.rate(),
            f.rate(),
            d.rate(),
            f.cpu_us_per_record().unwrap_or(f64::NAN),
            g.cpu_us_per_record().unwrap_or(f64::NAN),
            serving_in_forwarded * 1e6 / f.records.max(1) as f64,
            g.machine_cpu_us_per_record().unwrap_or(f64::NAN),
            g.busy_cores().unwrap_or(f64::NAN),
            f.machine_cpu_us_per_record().unwrap_or(f64::NAN),
            f.busy_cores().unwrap_or(f64::NAN),
        ));
        out.push((g, f, d));
    }
    Ok(out)
}
