//! The scenarios. Each returns one or more [`ScenarioResult`] rows.

use anyhow::{bail, Result};
use serde_json::{Map, Value};

use crate::env::Env;
use crate::report::{Chart, ScenarioResult};

mod acquire;
mod discard;
mod drain;
mod failover;
mod first_record;
mod groups;
mod handoff;
mod latency;
mod queue;
mod rebalance;
mod scale;
mod share_group;
mod waiters;

/// Runs scenario `name`.
pub(crate) async fn run(env: &Env, name: &str) -> Result<Vec<ScenarioResult>> {
    let plan = &env.plan;
    match name {
        "drain-1p-1KiB" => drain::one_partition(env, name, 1024, plan.drain_1k_records, 0.8).await,
        "drain-1p-100B" => drain::one_partition(env, name, 100, plan.drain_100b_records, 0.9).await,
        "drain-16p" => drain::sixteen_partitions(env, name).await,
        "drain-64p" => drain::sixty_four_partitions(env, name).await,
        "drain-forwarded" => drain::forwarded(env, name).await,
        "first-record" => first_record::run(env).await,
        "latency" => latency::run(env).await,
        "acquire-release" => acquire::run(env).await,
        "handoff" => handoff::run(env).await,
        "crash-failover" => failover::run(env).await,
        "scale" => scale::run(env).await,
        "groups" => groups::run(env).await,
        "waiters" => waiters::waiters(env).await,
        "acquire-contended" => waiters::contended(env).await,
        "rebalance" => rebalance::run(env).await,
        "drain-subscribe" => drain::drain_subscribe(env).await,
        "queue-slow-handler" => queue::slow_handler(env).await,
        "queue-poison" => queue::poison(env).await,
        "queue-overhead" => queue::overhead(env).await,
        "queue-vs-share-group" => share_group::run(env).await,
        other => bail!("unknown scenario {other}"),
    }
}

/// The parts of a row; [`Row::build`] fills in the rest.
#[derive(Debug)]
struct Row {
    name: String,
    scenario: &'static str,
    unit: &'static str,
    gateway: f64,
    baseline: f64,
    baseline_kind: String,
    ratio: Option<f64>,
    ratio_definition: &'static str,
    goal: String,
    met: bool,
    summary: String,
    details: Map<String, Value>,
    chart: Chart,
}

impl Row {
    fn build(self) -> ScenarioResult {
        ScenarioResult {
            name: self.name,
            scenario: self.scenario.to_string(),
            unit: self.unit.to_string(),
            gateway: self.gateway,
            baseline: self.baseline,
            baseline_kind: self.baseline_kind,
            ratio: self.ratio.filter(|r| r.is_finite()),
            ratio_definition: self.ratio_definition.to_string(),
            goal: self.goal,
            met: self.met,
            summary: self.summary,
            details: self.details,
            chart: self.chart,
        }
    }
}

/// Rounds a figure for the JSON output (3 decimals).
fn r3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// `gateway / baseline`, `None` when the baseline is 0.
/// Whether `value` is at most `goal`, past the rounding of floating point: CPU times are
/// differences of whole clock ticks read as seconds, so two arms a whole number of ticks apart
/// (the goal exactly) can differ from it in the last bits.
fn at_most(value: f64, goal: f64) -> bool {
    value <= goal * (1.0 + 1e-9)
}

fn ratio(gateway: f64, baseline: f64) -> Option<f64> {
    (baseline != 0.0).then(|| gateway / baseline)
}

/// Acquire, retried while the gateway answers UNAVAILABLE (for at most 30 s): a fresh
/// broker answers the first group-coordinator lookups with "not coordinator" while it creates
/// its offsets topic. Other errors are returned at once.
async fn acquire(
    client: &kafka_lease_client::Client,
    options: kafka_lease_client::AcquireOptions,
) -> Result<kafka_lease_client::Lease> {
    let started = tokio::time::Instant::now();
    loop {
        match client.acquire(options.clone()).await {
            Ok(lease) => return Ok(lease),
            Err(e)
                if e.is_retryable() && started.elapsed() < std::time::Duration::from_secs(30) =>
            {
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
            Err(e) => return Err(anyhow::anyhow!(e).context("Acquire")),
        }
    }
}

/// Milliseconds of a duration.
fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
