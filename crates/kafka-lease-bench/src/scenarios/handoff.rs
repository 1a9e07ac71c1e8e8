//! `handoff`: the holder releases while a client of another gateway instance waits in
//! Acquire (`wait` = 10 s) for the same partition; measured from just before the Release call
//! to the waiter's Acquire returning. The roles alternate between the two gateways.

use std::time::Duration;

use anyhow::{Context, Result};
use kafka_lease_client::{AcquireOptions, Client, Lease};
use serde_json::{json, Map};
use tokio::time::Instant;

use super::{acquire, ms, r3, ratio, Row};
use crate::env::{create_topic, Env, Gateway};
use crate::report::{Chart, ScenarioResult};
use crate::stats::percentile;

const GOAL_MS: f64 = 10.0;
/// How long the waiter has been in its Acquire before the holder releases.
const SETTLE: Duration = Duration::from_millis(250);
const WARMUP: usize = 2;

fn options(group: &str, topic: &str) -> AcquireOptions {
    AcquireOptions::new(group, topic)
        .partition(0)
        .member("bench-handoff")
        .ttl(Duration::from_secs(30))
        .wait(Duration::from_secs(10))
}

pub(crate) async fn run(env: &Env) -> Result<Vec<ScenarioResult>> {
    let name = "handoff";
    let topic = env.name("handoff");
    create_topic(env, &topic, 1).await?;
    let prefix = env.prefix(name);
    let a = Gateway::start(env, &prefix, &env.name("gw-handoff-a"), None).await?;
    let b = match Gateway::start(env, &prefix, &env.name("gw-handoff-b"), None).await {
        Ok(b) => b,
        Err(e) => {
            a.stop().await;
            return Err(e);
        }
    };
    let cycles = env.plan.handoff_cycles;
    let result = async {
        let clients: [Client; 2] = [a.client().await?, b.client().await?];
        let group = env.name("handoff");
        let mut holder: Lease = acquire(&clients[0], options(&group, &topic))
            .await
            .context("first Acquire")?;
        let mut side = 0_usize;
        let mut samples: Vec<(f64, f64, usize)> = Vec::new();
        for k in 0..WARMUP + cycles {
            let waiter_client = clients[1 - side].clone();
            let (g, t) = (group.clone(), topic.clone());
            let waiter = tokio::spawn(async move {
                let lease = waiter_client.acquire(options(&g, &t)).await;
                (lease, Instant::now())
            });
            tokio::time::sleep(SETTLE).await;
            let t0 = Instant::now();
            holder.release().await.context("Release")?;
            let released = Instant::now();
            let (lease, returned) = waiter.await.context("waiter panicked")?;
            holder = lease.context("the waiting Acquire failed")?;
            if k >= WARMUP {
                samples.push((ms(returned - t0), ms(released - t0), side));
                if (k - WARMUP + 1).is_multiple_of(10) || k + 1 == WARMUP + cycles {
                    env.progress
                        .say(format!("  {name}: {}/{cycles} handoffs", k - WARMUP + 1));
                }
            }
            side = 1 - side;
        }
        let _ = holder.release().await;
        Ok::<_, anyhow::Error>(samples)
    }
    .await;
    a.stop().await;
    b.stop().await;
    let samples = result?;
    let handoff: Vec<f64> = samples.iter().map(|s| s.0).collect();
    let release: Vec<f64> = samples.iter().map(|s| s.1).collect();
    let (p50, p99, max) = (
        percentile(&handoff, 50.0),
        percentile(&handoff, 99.0),
        percentile(&handoff, 100.0),
    );
    let mut details = Map::new();
    details.insert("p50_ms".into(), r3(p50).into());
    details.insert("p99_ms".into(), r3(p99).into());
    details.insert("max_ms".into(), r3(max).into());
    details.insert(
        "release_call_p50_p99_ms".into(),
        json!([
            r3(percentile(&release, 50.0)),
            r3(percentile(&release, 99.0))
        ]),
    );
    details.insert("handoffs".into(), handoff.len().into());
    details.insert("warmup_handoffs_not_counted".into(), WARMUP.into());
    details.insert(
        "waiter_in_acquire_before_release_ms".into(),
        (SETTLE.as_millis() as u64).into(),
    );
    details.insert(
        "samples_ms".into(),
        handoff.iter().map(|x| r3(*x)).collect::<Vec<_>>().into(),
    );
    details.insert("timing".into(), "from just before the holder's Release call (gateway A) to the return of the Acquire a client of gateway B had been waiting in; roles alternate".into());
    let chart = Chart {
        title: "handoff: Release to the waiting Acquire returning".into(),
        unit: "ms".into(),
        groups: vec![
            ("p50".into(), vec![("gateway".into(), p50)]),
            ("p99".into(), vec![("gateway".into(), p99)]),
            ("max".into(), vec![("gateway".into(), max)]),
        ],
        lines: vec![("goal 10 ms".into(), GOAL_MS)],
    };
    Ok(vec![Row {
        name: name.into(),
        scenario: "handoff",
        unit: "ms (p99)",
        gateway: r3(p99),
        baseline: GOAL_MS,
        baseline_kind:
            "constant: the goal's 10 ms budget (there is no direct equivalent to measure)".into(),
        ratio: ratio(p99, GOAL_MS).map(r3),
        ratio_definition: "gateway p99 / 10 ms (met when <= 1)",
        goal: "p99 <= 10 ms".into(),
        met: p99 <= GOAL_MS,
        summary: format!(
            "p50 {p50:.2} ms, max {max:.2} ms over {} handoffs",
            handoff.len()
        ),
        details,
        chart,
    }
    .build()])
}
