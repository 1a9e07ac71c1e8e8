//! `crash-failover`: gateway A holds a partition, a client of gateway B waits for it in
//! Acquire; A is SIGKILLed (row `crash-failover`) or SIGSTOPped (row `hang-failover`: alive
//! but not working, its socket still accepting handshakes); measured from just before the
//! signal to B's client holding the partition. Each run has its own gateway A and its own
//! group (so its own lock key); B is shared. Kills and stops alternate; runs overlap,
//! starting `failover_stagger` apart, so that a run whose failover takes tens of seconds (a
//! TTL-only Consul session, or a hang under the TCP check) does not make the mode overrun.

use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use kafka_lease_client::{AcquireOptions, Client, Error as ClientError};
use serde_json::{json, Map};
use tokio::time::Instant;

use super::{acquire, r3, ratio, Row};
use crate::env::{create_topic, Env, Gateway};
use crate::report::{Chart, ScenarioResult};
use crate::stats::percentile;

const GOAL_S: f64 = 3.0;
/// Kafka's default `session.timeout.ms` (45 s since Kafka 3.0): how long a crashed member of
/// a classic consumer group keeps its partitions. A documented constant, not measured.
const KAFKA_SESSION_TIMEOUT_S: f64 = 45.0;
const SETTLE: Duration = Duration::from_millis(300);
const GIVE_UP: Duration = Duration::from_secs(180);

fn options(group: &str, topic: &str, wait: Duration) -> AcquireOptions {
    AcquireOptions::new(group, topic)
        .partition(0)
        .member("bench-failover")
        .ttl(Duration::from_secs(60))
        .wait(wait)
}

/// How gateway A stops working.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Failure {
    /// SIGKILL: the process is gone.
    Crash,
    /// SIGSTOP: the process is there, its listen socket too, but nothing runs.
    Hang,
}

impl Failure {
    fn row(self) -> &'static str {
        match self {
            Failure::Crash => "crash-failover",
            Failure::Hang => "hang-failover",
        }
    }

    fn signal(self) -> &'static str {
        match self {
            Failure::Crash => "SIGKILL",
            Failure::Hang => "SIGSTOP",
        }
    }
}

async fn one_run(
    env: &Env,
    prefix: &str,
    topic: &str,
    b: &Client,
    run: usize,
    failure: Failure,
) -> Result<f64> {
    let mut a =
        Gateway::start(env, prefix, &env.name(&format!("gw-failover-a{run}")), None).await?;
    let result = async {
        let group = env.name("failover");
        let client_a = a.client().await?;
        let _held = acquire(&client_a, options(&group, topic, Duration::ZERO))
            .await
            .context("Acquire on gateway A")?;
        let (b, g, t) = (b.clone(), group.clone(), topic.to_string());
        let waiter = tokio::spawn(async move {
            let started = Instant::now();
            loop {
                match b.acquire(options(&g, &t, Duration::from_secs(60))).await {
                    Ok(lease) => return Ok((lease, Instant::now())),
                    Err(ClientError::Busy { .. }) if started.elapsed() < GIVE_UP => continue,
                    Err(e) => return Err(anyhow!(e).context("the waiting Acquire on gateway B")),
                }
            }
        });
        tokio::time::sleep(SETTLE).await;
        let t0 = Instant::now();
        match failure {
            Failure::Crash => a.kill()?,
            Failure::Hang => a.signal("STOP")?,
        }
        let (lease, t1) = tokio::time::timeout(GIVE_UP + Duration::from_secs(60), waiter)
            .await
            .map_err(|_| anyhow!("B's client did not get the partition within {GIVE_UP:?}"))?
            .context("waiter panicked")??;
        let secs = (t1 - t0).as_secs_f64();
        let _ = lease.release().await;
        Ok::<_, anyhow::Error>(secs)
    }
    .await;
    a.kill()?;
    a.reap().await;
    let secs = result?;
    env.progress
        .say(format!("  {} run {}: {secs:.3} s", failure.row(), run + 1));
    Ok(secs)
}

pub(crate) async fn run(env: &Env) -> Result<Vec<ScenarioResult>> {
    let name = "crash-failover";
    let topic = env.name("failover");
    create_topic(env, &topic, 1).await?;
    let prefix = env.prefix(name);
    let b = Gateway::start(env, &prefix, &env.name("gw-failover-b"), None).await?;
    let runs = env.plan.failover_runs;
    let stagger = env.plan.failover_stagger;
    let result = async {
        let client_b = b.client().await?;
        env.progress.say(format!(
            "  {name}: {runs} SIGKILLs and {runs} SIGSTOPs, alternating, started {:.0} s apart \
             (each waits for its own failover)",
            stagger.as_secs_f64()
        ));
        let started = Instant::now();
        let futures = (0..runs * 2).map(|i| {
            let client_b = client_b.clone();
            let (prefix, topic) = (prefix.clone(), topic.clone());
            let failure = if i % 2 == 0 {
                Failure::Crash
            } else {
                Failure::Hang
            };
            async move {
                tokio::time::sleep_until(started + stagger * i as u32).await;
                let secs = one_run(env, &prefix, &topic, &client_b, i / 2, failure).await?;
                Ok::<_, anyhow::Error>((failure, secs))
            }
        });
        futures::future::join_all(futures)
            .await
            .into_iter()
            .collect::<Result<Vec<(Failure, f64)>>>()
    }
    .await;
    b.stop().await;
    let samples = result?;
    Ok([Failure::Crash, Failure::Hang]
        .into_iter()
        .map(|failure| {
            let secs: Vec<f64> = samples
                .iter()
                .filter(|(f, _)| *f == failure)
                .map(|(_, s)| *s)
                .collect();
            row(env, failure, &secs, stagger)
        })
        .collect())
}

fn row(env: &Env, failure: Failure, secs: &[f64], stagger: Duration) -> ScenarioResult {
    let name = failure.row();
    let signal = failure.signal();
    let (p50, p99, max) = (
        percentile(secs, 50.0),
        percentile(secs, 99.0),
        percentile(secs, 100.0),
    );
    let mut details = Map::new();
    details.insert("p50_s".into(), r3(p50).into());
    details.insert("p99_s".into(), r3(p99).into());
    details.insert("max_s".into(), r3(max).into());
    details.insert("runs".into(), secs.len().into());
    details.insert(
        "samples_s".into(),
        secs.iter().map(|x| r3(*x)).collect::<Vec<_>>().into(),
    );
    details.insert("gateway_args".into(), env.gateway_args.clone().into());
    details.insert("run_stagger_s".into(), stagger.as_secs_f64().into());
    details.insert("timing".into(), format!("from just before {signal} of gateway A to the return of the Acquire (wait=60s, retried on Busy) of B's client; runs overlap, each with its own gateway A and lock key").into());
    details.insert("baseline_constant".into(), json!({"name": "Kafka consumer group session.timeout.ms default", "seconds": KAFKA_SESSION_TIMEOUT_S}));
    let chart = Chart {
        title: format!("{name}: {signal} of the holder's gateway to the waiter holding it"),
        unit: "s".into(),
        groups: secs
            .iter()
            .enumerate()
            .map(|(i, s)| (format!("{}", i + 1), vec![("gateway (per run)".into(), *s)]))
            .collect(),
        lines: vec![("goal 3 s".into(), GOAL_S)],
    };
    Row {
        name: name.into(),
        scenario: "crash-failover",
        unit: "s (p99)",
        gateway: r3(p99),
        baseline: KAFKA_SESSION_TIMEOUT_S,
        baseline_kind: "constant: Kafka's default consumer session.timeout.ms (45 s), not measured"
            .into(),
        ratio: ratio(p99, KAFKA_SESSION_TIMEOUT_S).map(r3),
        ratio_definition: "gateway p99 / 45 s",
        goal: "p99 <= 3 s".into(),
        met: p99 <= GOAL_S,
        summary: format!("p50 {p50:.2} s, max {max:.2} s over {} runs", secs.len()),
        details,
        chart,
    }
    .build()
}
