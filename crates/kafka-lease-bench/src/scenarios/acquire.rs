//! `acquire-release`: cycles of Acquire + Release of one partition through the gateway,
//! versus a raw Consul lock cycle over HTTP on a pre-created session (`PUT
//! /v1/kv/<key>?acquire=<session>`, then `DELETE /v1/kv/<key>`) on one kept-alive
//! connection. Consul writes are counted two ways: Raft log entries (`last_log_index` of
//! `/v1/agent/self`) across each arm's round, and the gateway's HTTP requests by kind, through
//! a counting proxy, in a separate phase (so the proxy's extra hop is not in the timings).

use std::time::Duration;

use std::sync::Arc;

use anyhow::{bail, Context, Result};
use kafka_lease_client::{AcquireOptions, Client};
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::TopicPartitionList;
use serde_json::{json, Map, Value};
use tokio::time::Instant;

use super::{acquire, ms, r3, ratio, Row};
use crate::consul::{diff, is_write, CountingProxy, Counts, RawConsul};
use crate::env::{create_topic, Env, Gateway};
use crate::report::{Chart, ScenarioResult};
use crate::stats::{median, percentile};

#[derive(Debug, Default)]
struct Arm {
    cycle_ms: Vec<f64>,
    acquire_ms: Vec<f64>,
    release_ms: Vec<f64>,
    raft_entries_per_cycle: f64,
}

impl Arm {
    /// One cycle that started at `t0`, had its lock at `t1` and was released at `t2`.
    fn record(&mut self, t0: Instant, t1: Instant, t2: Instant) {
        self.acquire_ms.push(ms(t1 - t0));
        self.release_ms.push(ms(t2 - t1));
        self.cycle_ms.push(ms(t2 - t0));
    }
}

fn options(group: &str, topic: &str) -> AcquireOptions {
    AcquireOptions::new(group, topic)
        .partition(0)
        .member("bench-acquire")
        .ttl(Duration::from_secs(30))
}

async fn gateway_arm(
    client: &Client,
    raft: &mut RawConsul,
    group: &str,
    topic: &str,
    cycles: usize,
) -> Result<Arm> {
    let mut arm = Arm::default();
    let before = raft.raft_index().await?;
    for _ in 0..cycles {
        let t0 = Instant::now();
        let lease = client
            .acquire(options(group, topic))
            .await
            .context("Acquire")?;
        let t1 = Instant::now();
        lease.release().await.context("Release")?;
        let t2 = Instant::now();
        arm.record(t0, t1, t2);
    }
    let after = raft.raft_index().await?;
    arm.raft_entries_per_cycle = (after - before) as f64 / cycles as f64;
    Ok(arm)
}

/// The raw cycle's lock: `PUT /v1/kv/<key>?acquire=<session>` with `value`.
async fn raw_lock(raw: &mut RawConsul, key: &str, session: &str, value: &str) -> Result<()> {
    let r = raw
        .request(
            "PUT",
            &format!("/v1/kv/{key}?acquire={session}"),
            value.as_bytes(),
        )
        .await?;
    if r.status != 200 || r.text().trim() != "true" {
        bail!("raw acquire: {} {}", r.status, r.text());
    }
    Ok(())
}

/// The raw cycle's release: `DELETE /v1/kv/<key>`.
async fn raw_unlock(raw: &mut RawConsul, key: &str) -> Result<()> {
    let r = raw.request("DELETE", &format!("/v1/kv/{key}"), b"").await?;
    if r.status != 200 {
        bail!("raw release: {} {}", r.status, r.text());
    }
    Ok(())
}

async fn raw_arm(
    raw: &mut RawConsul,
    raft: &mut RawConsul,
    session: &str,
    key: &str,
    cycles: usize,
) -> Result<Arm> {
    let mut arm = Arm::default();
    let renewed = raw
        .request("PUT", &format!("/v1/session/renew/{session}"), b"")
        .await?;
    if renewed.status != 200 {
        bail!(
            "renewing the raw session: {} {}",
            renewed.status,
            renewed.text()
        );
    }
    let value = json!({"member": "bench-raw", "gateway": "raw", "lease": "raw", "acquired_at_ms": 0, "ttl_ms": 30000}).to_string();
    let before = raft.raft_index().await?;
    for _ in 0..cycles {
        let t0 = Instant::now();
        raw_lock(raw, key, session, &value).await?;
        let t1 = Instant::now();
        raw_unlock(raw, key).await?;
        let t2 = Instant::now();
        arm.record(t0, t1, t2);
    }
    let after = raft.raft_index().await?;
    arm.raft_entries_per_cycle = (after - before) as f64 / cycles as f64;
    Ok(arm)
}

/// What an in-process consumer would do for the same result as the gateway's cycle: the raw
/// Consul lock, the group's committed offset and the partition's watermarks from Kafka (both
/// at once, as the gateway asks them), the raw Consul release.
async fn direct_arm(
    raw: &mut RawConsul,
    session: &str,
    key: &str,
    consumer: &Arc<BaseConsumer>,
    topic: &str,
    cycles: usize,
) -> Result<Arm> {
    let mut arm = Arm::default();
    let value = json!({"member": "bench-direct", "gateway": "direct", "lease": "direct", "acquired_at_ms": 0, "ttl_ms": 30000}).to_string();
    for _ in 0..cycles {
        let t0 = Instant::now();
        raw_lock(raw, key, session, &value).await?;
        let (committed, watermarks) = {
            let (c1, c2, t1, t2) = (
                consumer.clone(),
                consumer.clone(),
                topic.to_string(),
                topic.to_string(),
            );
            tokio::join!(
                tokio::task::spawn_blocking(move || {
                    let mut query = TopicPartitionList::new();
                    query.add_partition(&t1, 0);
                    c1.committed_offsets(query, Duration::from_secs(5))
                }),
                tokio::task::spawn_blocking(move || c2.fetch_watermarks(
                    &t2,
                    0,
                    Duration::from_secs(5)
                )),
            )
        };
        committed?.context("direct: committed offset")?;
        watermarks?.context("direct: watermarks")?;
        let t1 = Instant::now();
        raw_unlock(raw, key).await?;
        let t2 = Instant::now();
        arm.record(t0, t1, t2);
    }
    Ok(arm)
}

/// Per-operation averages of the counting phase.
#[derive(Debug, Default)]
struct Counted {
    acquire: Counts,
    release: Counts,
    raft_acquire: u64,
    raft_release: u64,
    cycles: usize,
}

fn per_op(counts: &Counts, n: usize) -> Value {
    Value::Object(
        counts
            .iter()
            .map(|(k, v)| (k.clone(), r3(*v as f64 / n as f64).into()))
            .collect(),
    )
}

/// HTTP writes per operation, leaving out the periodic session renewal (not caused by it).
fn writes_per_op(counts: &Counts, n: usize) -> f64 {
    counts
        .iter()
        .filter(|(k, _)| is_write(k) && !k.contains("session/renew"))
        .map(|(_, v)| *v)
        .sum::<u64>() as f64
        / n as f64
}

async fn counting_phase(env: &Env, raft: &mut RawConsul, topic: &str) -> Result<Counted> {
    let proxy = CountingProxy::start(&env.services.consul_http_addr).await?;
    let gateway = Gateway::start(
        env,
        &env.prefix("acquire-release-counted"),
        &env.name("gw-acq-counted"),
        Some(&proxy.http_addr),
    )
    .await?;
    let result = async {
        let client = gateway.client().await?;
        let group = env.name("acq-counted");
        // One cycle first, so the group's Kafka client exists before counting.
        client
            .acquire(options(&group, topic))
            .await?
            .release()
            .await?;
        let mut c = Counted {
            cycles: env.plan.acquire_count_cycles,
            ..Counted::default()
        };
        for _ in 0..c.cycles {
            let (s0, r0) = (proxy.snapshot(), raft.raft_index().await?);
            let lease = client.acquire(options(&group, topic)).await?;
            let (s1, r1) = (proxy.snapshot(), raft.raft_index().await?);
            lease.release().await?;
            let (s2, r2) = (proxy.snapshot(), raft.raft_index().await?);
            for (k, v) in diff(&s1, &s0) {
                *c.acquire.entry(k).or_insert(0) += v;
            }
            for (k, v) in diff(&s2, &s1) {
                *c.release.entry(k).or_insert(0) += v;
            }
            c.raft_acquire += r1 - r0;
            c.raft_release += r2 - r1;
        }
        Ok::<_, anyhow::Error>(c)
    }
    .await;
    gateway.stop().await;
    result
}

pub(crate) async fn run(env: &Env) -> Result<Vec<ScenarioResult>> {
    let name = "acquire-release";
    let topic = env.name("acq");
    create_topic(env, &topic, 2).await?;
    let mut raw = RawConsul::new(&env.services.consul_http_addr);
    let mut raft = RawConsul::new(&env.services.consul_http_addr);
    let session = raw.create_session("kafka-lease-bench-raw", "60s").await?;
    let raw_key = format!("{}/raw/{topic}/0", env.prefix(name));
    let gateway = Gateway::start(env, &env.prefix(name), &env.name("gw-acq"), None).await?;
    let cycles = env.plan.acquire_cycles;
    let mut rounds: Vec<(Arm, Arm)> = Vec::new();
    let mut direct_rounds: Vec<Arm> = Vec::new();
    let direct_key = format!("{}/direct/{topic}/0", env.prefix(name));
    let consumer: Arc<BaseConsumer> = Arc::new(
        env.direct_consumer_config(&env.name("acq-direct"))
            .create()
            .context("the direct arm's consumer")?,
    );
    let mut warm_rounds: Vec<Arm> = Vec::new();
    let result: Result<Counted> = async {
        let client = gateway.client().await?;
        let group = env.name("acq");
        env.progress
            .say(format!("  {name}: warm-up (10 cycles each arm)"));
        acquire(&client, options(&group, &topic))
            .await?
            .release()
            .await?;
        gateway_arm(&client, &mut raft, &group, &topic, 10).await?;
        raw_arm(&mut raw, &mut raft, &session, &raw_key, 10).await?;
        direct_arm(&mut raw, &session, &direct_key, &consumer, &topic, 10).await?;
        for round in 1..=env.plan.rounds {
            let label = format!("{name} round {round}/{}", env.plan.rounds);
            env.progress
                .say(format!("  {label} gateway: {cycles} cycles"));
            let g = gateway_arm(&client, &mut raft, &group, &topic, cycles).await?;
            env.progress.say(format!(
                "  {label} gateway: p50 {:.2} ms, p99 {:.2} ms; raw: {cycles} cycles",
                percentile(&g.cycle_ms, 50.0),
                percentile(&g.cycle_ms, 99.0)
            ));
            let r = raw_arm(&mut raw, &mut raft, &session, &raw_key, cycles).await?;
            env.progress.say(format!(
                "  {label} raw: p50 {:.2} ms, p99 {:.2} ms",
                percentile(&r.cycle_ms, 50.0),
                percentile(&r.cycle_ms, 99.0)
            ));
            // Third arm, for the diagnosis: the same cycle while another lease of the group
            // (partition 1) stays held, so the gateway keeps the group's Kafka client.
            let other = acquire(&client, options(&group, &topic).partition(1)).await?;
            let w = gateway_arm(&client, &mut raft, &group, &topic, cycles).await?;
            other.release().await.context("Release of partition 1")?;
            env.progress.say(format!(
                "  {label} gateway, group kept open by a lease on partition 1: p50 {:.2} ms, p99 {:.2} ms",
                percentile(&w.cycle_ms, 50.0),
                percentile(&w.cycle_ms, 99.0)
            ));
            warm_rounds.push(w);
            rounds.push((g, r));
            let d = direct_arm(&mut raw, &session, &direct_key, &consumer, &topic, cycles).await?;
            env.progress.say(format!(
                "  {label} direct (raw Consul + the Kafka lookups of an Acquire): p50 {:.2} ms, p99 {:.2} ms",
                percentile(&d.cycle_ms, 50.0),
                percentile(&d.cycle_ms, 99.0)
            ));
            direct_rounds.push(d);
        }
        env.progress.say(format!(
            "  {name}: counting Consul requests over {} cycles (gateway behind a counting proxy)",
            env.plan.acquire_count_cycles
        ));
        counting_phase(env, &mut raft, &topic).await
    }
    .await;
    gateway.stop().await;
    let _ = raw
        .request("PUT", &format!("/v1/session/destroy/{session}"), b"")
        .await;
    let counted = result?;

    let med = |f: &dyn Fn(&(Arm, Arm)) -> f64| median(&rounds.iter().map(f).collect::<Vec<_>>());
    let g99 = med(&|(g, _)| percentile(&g.cycle_ms, 99.0));
    let r99 = med(&|(_, r)| percentile(&r.cycle_ms, 99.0));
    let g50 = med(&|(g, _)| percentile(&g.cycle_ms, 50.0));
    let r50 = med(&|(_, r)| percentile(&r.cycle_ms, 50.0));
    let ratio = ratio(g99, r99);
    let writes_acquire = writes_per_op(&counted.acquire, counted.cycles);
    let writes_release = writes_per_op(&counted.release, counted.cycles);
    let mut details = Map::new();
    details.insert("gateway_p50_ms".into(), r3(g50).into());
    details.insert("baseline_p50_ms".into(), r3(r50).into());
    details.insert("gateway_p99_ms".into(), r3(g99).into());
    details.insert("baseline_p99_ms".into(), r3(r99).into());
    // The medians across rounds of one arm's p50 and p99 of one latency series.
    let p50_p99 = |series: &dyn Fn(&(Arm, Arm)) -> &Vec<f64>| {
        json!([
            r3(med(&|round| percentile(series(round), 50.0))),
            r3(med(&|round| percentile(series(round), 99.0)))
        ])
    };
    details.insert(
        "gateway_acquire_p50_p99_ms".into(),
        p50_p99(&|(g, _)| &g.acquire_ms),
    );
    details.insert(
        "gateway_release_p50_p99_ms".into(),
        p50_p99(&|(g, _)| &g.release_ms),
    );
    details.insert(
        "raw_acquire_p50_p99_ms".into(),
        p50_p99(&|(_, r)| &r.acquire_ms),
    );
    details.insert(
        "raw_release_p50_p99_ms".into(),
        p50_p99(&|(_, r)| &r.release_ms),
    );
    details.insert("cycles_per_arm_and_round".into(), cycles.into());
    let warm_med = |q: f64| {
        median(
            &warm_rounds
                .iter()
                .map(|w| percentile(&w.cycle_ms, q))
                .collect::<Vec<_>>(),
        )
    };
    details.insert(
        "gateway_group_kept_open_p50_p99_ms".into(),
        json!([r3(warm_med(50.0)), r3(warm_med(99.0))]),
    );
    details.insert(
        "gateway_group_kept_open_acquire_p50_p99_ms".into(),
        json!([
            r3(median(
                &warm_rounds
                    .iter()
                    .map(|w| percentile(&w.acquire_ms, 50.0))
                    .collect::<Vec<_>>()
            )),
            r3(median(
                &warm_rounds
                    .iter()
                    .map(|w| percentile(&w.acquire_ms, 99.0))
                    .collect::<Vec<_>>()
            ))
        ]),
    );
    details.insert("group_kept_open_arm".into(), "diagnostic third arm, not the headline: the same cycle while the bench holds a lease on partition 1 of the same group, so the group's Kafka client is not closed between cycles".into());
    details.insert(
        "gateway_raft_entries_per_cycle".into(),
        r3(med(&|(g, _)| g.raft_entries_per_cycle)).into(),
    );
    details.insert(
        "raw_raft_entries_per_cycle".into(),
        r3(med(&|(_, r)| r.raft_entries_per_cycle)).into(),
    );
    details.insert(
        "consul_http_writes_per_acquire".into(),
        r3(writes_acquire).into(),
    );
    details.insert(
        "consul_http_writes_per_release".into(),
        r3(writes_release).into(),
    );
    details.insert(
        "raft_entries_per_acquire".into(),
        r3(counted.raft_acquire as f64 / counted.cycles as f64).into(),
    );
    details.insert(
        "raft_entries_per_release".into(),
        r3(counted.raft_release as f64 / counted.cycles as f64).into(),
    );
    details.insert(
        "consul_http_requests_per_acquire".into(),
        per_op(&counted.acquire, counted.cycles),
    );
    details.insert(
        "consul_http_requests_per_release".into(),
        per_op(&counted.release, counted.cycles),
    );
    details.insert("counting_cycles".into(), counted.cycles.into());
    details.insert("counting_method".into(), "Raft: Consul /v1/agent/self Stats.raft.last_log_index before and after (includes any background Raft write of the agent); HTTP: a counting TCP proxy between a second gateway and Consul, requests by method, path kind and flags; HTTP writes = PUT/POST/DELETE except the periodic session renew".into());
    details.insert("raw_baseline".into(), "one kept-alive HTTP/1.1 connection, pre-created session (Behavior=delete); PUT /v1/kv/<key>?acquire=<session> with a ~90-byte JSON value, then DELETE /v1/kv/<key>".into());
    details.insert(
        "rounds".into(),
        rounds
            .iter()
            .enumerate()
            .map(|(i, (g, r))| json!({
                "round": i + 1,
                "gateway_p50_ms": r3(percentile(&g.cycle_ms, 50.0)), "gateway_p99_ms": r3(percentile(&g.cycle_ms, 99.0)),
                "raw_p50_ms": r3(percentile(&r.cycle_ms, 50.0)), "raw_p99_ms": r3(percentile(&r.cycle_ms, 99.0)),
                "gateway_raft_entries_per_cycle": r3(g.raft_entries_per_cycle), "raw_raft_entries_per_cycle": r3(r.raft_entries_per_cycle),
            }))
            .collect::<Vec<_>>()
            .into(),
    );
    let chart = Chart {
        title: "acquire-release: one Acquire + Release cycle".into(),
        unit: "ms".into(),
        groups: rounds
            .iter()
            .enumerate()
            .map(|(i, (g, r))| {
                (
                    format!("round {}", i + 1),
                    vec![
                        ("gateway p50".into(), percentile(&g.cycle_ms, 50.0)),
                        ("raw Consul p50".into(), percentile(&r.cycle_ms, 50.0)),
                        ("gateway p99".into(), percentile(&g.cycle_ms, 99.0)),
                        ("raw Consul p99".into(), percentile(&r.cycle_ms, 99.0)),
                        (
                            "gateway, group kept open, p99".into(),
                            percentile(&warm_rounds[i].cycle_ms, 99.0),
                        ),
                    ],
                )
            })
            .collect(),
        lines: vec![("1.5 x raw p99".into(), 1.5 * r99)],
    };
    let d99 = median(
        &direct_rounds
            .iter()
            .map(|d| percentile(&d.cycle_ms, 99.0))
            .collect::<Vec<_>>(),
    );
    let d50 = median(
        &direct_rounds
            .iter()
            .map(|d| percentile(&d.cycle_ms, 50.0))
            .collect::<Vec<_>>(),
    );
    let direct_ratio = super::ratio(g99, d99);
    let mut direct_details = Map::new();
    direct_details.insert("gateway_p50_ms".into(), r3(g50).into());
    direct_details.insert("direct_p50_ms".into(), r3(d50).into());
    direct_details.insert("gateway_p99_ms".into(), r3(g99).into());
    direct_details.insert("direct_p99_ms".into(), r3(d99).into());
    // Each round's p99s, so that `compare` can tell this row's noise from a slip.
    direct_details.insert(
        "rounds".into(),
        rounds
            .iter()
            .zip(&direct_rounds)
            .enumerate()
            .map(|(i, ((g, _), d))| {
                json!({
                    "round": i + 1,
                    "gateway_p99_ms": r3(percentile(&g.cycle_ms, 99.0)),
                    "direct_p99_ms": r3(percentile(&d.cycle_ms, 99.0)),
                })
            })
            .collect::<Vec<_>>()
            .into(),
    );
    direct_details.insert("direct_baseline".into(), "in the bench process: the raw Consul cycle of the first row around the two Kafka lookups every Acquire needs (the group's committed offset, and the partition's watermarks, asked at once as the gateway does) through an rdkafka BaseConsumer with the gateway's settings".into());
    let direct_row = Row {
        name: "acquire-release-direct".into(),
        scenario: "acquire-release",
        unit: "ms (p99)",
        gateway: r3(g99),
        baseline: r3(d99),
        baseline_kind: "measured: raw Consul lock + committed offset and watermarks from Kafka + raw release, same run".into(),
        ratio: direct_ratio.map(r3),
        ratio_definition: "gateway cycle p99 / direct cycle p99 (medians of per-round p99s)",
        goal: "<= 1.5".into(),
        met: direct_ratio.is_some_and(|r| r <= 1.5),
        summary: format!("p50 {g50:.2} vs {d50:.2} ms"),
        details: direct_details,
        chart: Chart {
            title: "acquire-release: gateway cycle vs the same work done directly".into(),
            unit: "ms".into(),
            groups: rounds
                .iter()
                .zip(&direct_rounds)
                .enumerate()
                .map(|(i, ((g, _), d))| {
                    (
                        format!("round {}", i + 1),
                        vec![
                            ("gateway p50".into(), percentile(&g.cycle_ms, 50.0)),
                            ("direct p50".into(), percentile(&d.cycle_ms, 50.0)),
                            ("gateway p99".into(), percentile(&g.cycle_ms, 99.0)),
                            ("direct p99".into(), percentile(&d.cycle_ms, 99.0)),
                        ],
                    )
                })
                .collect(),
            lines: vec![("1.5 x direct p99".into(), 1.5 * d99)],
        },
    }
    .build();
    Ok(vec![Row {
        name: name.into(),
        scenario: "acquire-release",
        unit: "ms (p99)",
        gateway: r3(g99),
        baseline: r3(r99),
        baseline_kind: "measured: raw Consul acquire + release over HTTP, same run".into(),
        ratio: ratio.map(r3),
        ratio_definition: "gateway cycle p99 / raw cycle p99 (medians of per-round p99s)",
        goal: "<= 1.5".into(),
        met: ratio.is_some_and(|r| r <= 1.5),
        summary: format!(
            "p50 {g50:.2} vs {r50:.2} ms; Consul HTTP writes per Acquire {writes_acquire:.2}, per Release {writes_release:.2}; Raft entries per cycle {:.2} (raw {:.2})",
            med(&|(g, _)| g.raft_entries_per_cycle),
            med(&|(_, r)| r.raft_entries_per_cycle)
        ),
        details,
        chart,
    }
    .build(), direct_row])
}
