//! Benchmarks of the kafka-lease gateway, run against the real Kafka and Consul started by
//! `scripts/services up`, each scenario side by side with a direct baseline in the same run.
//!
//! The `kafka-lease-bench` binary (see `main.rs`) parses the command line into a [`Config`]
//! and calls [`run`]; every scenario spawns the real `kafka-lease` binary as child processes.
//! How each scenario is measured, and why, is in docs/BENCHMARKS.md.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{Map, Value};

pub mod compare;
mod consul;
mod env;
pub mod member;
mod progress;
mod report;
mod scenarios;
mod stats;

pub use report::{Chart, ScenarioResult};

use env::Env;
use progress::Progress;

/// Every scenario, in the order a run executes them.
pub const SCENARIOS: &[&str] = &[
    "drain-1p-1KiB",
    "drain-1p-100B",
    "drain-16p",
    "drain-64p",
    "drain-forwarded",
    "first-record",
    "latency",
    "acquire-release",
    "handoff",
    "waiters",
    "acquire-contended",
    "crash-failover",
    "scale",
    "groups",
    "rebalance",
    "drain-subscribe",
    "queue-slow-handler",
    "queue-poison",
    "queue-overhead",
    "queue-vs-share-group",
];

/// How big a run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Tiny counts: every scenario in seconds, for the test suite. The figures mean nothing.
    Smoke,
    /// Under 5 minutes on 2 cores.
    Quick,
    /// The full counts.
    Full,
}

impl Mode {
    /// Its name in the output.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Smoke => "smoke",
            Mode::Quick => "quick",
            Mode::Full => "full",
        }
    }
}

/// The fixed counts of one mode.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Interleaved rounds (arm A, arm B) of the scenarios with two measured arms.
    pub rounds: usize,
    /// Records of 1 KiB drained per arm and round.
    pub drain_1k_records: usize,
    /// Records of 100 B drained per arm and round.
    pub drain_100b_records: usize,
    /// Records of 1 KiB per partition in the 16-partition drain.
    pub drain16_per_partition: usize,
    /// Leases measured in each arm of `first-record` (new group, same group).
    pub first_record_leases: usize,
    /// Records per arm and round in the latency scenario (at 2,000 records/s).
    pub latency_records: usize,
    /// First records of each latency arm not counted (connection warm-up).
    pub latency_warmup: usize,
    /// Acquire+Release cycles per arm and round.
    pub acquire_cycles: usize,
    /// Cycles of the request-counting phase (gateway behind the counting proxy).
    pub acquire_count_cycles: usize,
    /// Handoffs measured.
    pub handoff_cycles: usize,
    /// Crash-failover runs.
    pub failover_runs: usize,
    /// Start-to-start spacing of overlapping failover runs.
    pub failover_stagger: Duration,
    /// Lease counts of the scale scenario: (low, high).
    pub scale_leases: (usize, usize),
    /// Wait after the leases are open before measuring.
    pub scale_settle: Duration,
    /// Window over which Consul writes are counted at each lease count.
    pub scale_window: Duration,
    /// Waiting Acquires of the `waiters` scenario: (few, many).
    pub waiters: (usize, usize),
    /// Wait after the waiters were sent before counting (also before the first release of
    /// `acquire-contended`).
    pub waiters_settle: Duration,
    /// Window over which the waiting gateway's Consul requests are counted.
    pub waiters_window: Duration,
    /// `acquire-contended`: (partitions = waiters, releases measured).
    pub contended: (usize, usize),
    /// `groups`: (groups, leases per group).
    pub groups: (usize, usize),
    /// `rebalance`: joins of a new member measured.
    pub rebalance_rounds: usize,
    /// `queue-slow-handler` and `queue-poison`: records per KEY-order run (also the topic's
    /// size), records per PARTITION-order run.
    pub queue_slow_records: (usize, usize),
    /// `queue-overhead`: records per run (Read and queue mode).
    pub queue_overhead_records: usize,
    /// `queue-vs-share-group`: SIGKILL runs of each arm (a share group's take 30 s), and
    /// the records of their topic.
    pub queue_kill_rounds: usize,
    pub queue_kill_records: usize,
}

impl Plan {
    /// The counts of `mode`.
    pub fn of(mode: Mode) -> Plan {
        match mode {
            Mode::Smoke => Plan {
                rounds: 2,
                drain_1k_records: 2_000,
                drain_100b_records: 5_000,
                drain16_per_partition: 200,
                first_record_leases: 5,
                latency_records: 1_000,
                latency_warmup: 100,
                acquire_cycles: 10,
                acquire_count_cycles: 5,
                handoff_cycles: 2,
                failover_runs: 1,
                failover_stagger: Duration::from_secs(1),
                scale_leases: (10, 20),
                scale_settle: Duration::from_secs(1),
                scale_window: Duration::from_secs(4),
                waiters: (10, 100),
                waiters_settle: Duration::from_secs(1),
                waiters_window: Duration::from_secs(2),
                contended: (20, 5),
                groups: (5, 2),
                rebalance_rounds: 2,
                queue_slow_records: (10_000, 40),
                queue_overhead_records: 5_000,
                queue_kill_rounds: 1,
                queue_kill_records: 50_000,
            },
            Mode::Quick => Plan {
                rounds: 3,
                drain_1k_records: 500_000,
                drain_100b_records: 1_000_000,
                drain16_per_partition: 25_000,
                first_record_leases: 20,
                latency_records: 10_000,
                latency_warmup: 500,
                acquire_cycles: 100,
                acquire_count_cycles: 20,
                handoff_cycles: 30,
                failover_runs: 10,
                failover_stagger: Duration::from_secs(2),
                scale_leases: (100, 1_000),
                scale_settle: Duration::from_secs(5),
                scale_window: Duration::from_secs(20),
                waiters: (10, 1_000),
                waiters_settle: Duration::from_secs(3),
                waiters_window: Duration::from_secs(5),
                contended: (100, 30),
                groups: (100, 10),
                rebalance_rounds: 20,
                queue_slow_records: (40_000, 300),
                queue_overhead_records: 300_000,
                queue_kill_rounds: 2,
                queue_kill_records: 200_000,
            },
            Mode::Full => Plan {
                rounds: 5,
                drain_1k_records: 1_000_000,
                drain_100b_records: 3_000_000,
                drain16_per_partition: 30_000,
                first_record_leases: 50,
                latency_records: 40_000,
                latency_warmup: 1_000,
                acquire_cycles: 300,
                acquire_count_cycles: 50,
                handoff_cycles: 100,
                failover_runs: 20,
                failover_stagger: Duration::from_secs(3),
                scale_leases: (1_000, 10_000),
                scale_settle: Duration::from_secs(10),
                scale_window: Duration::from_secs(60),
                waiters: (10, 1_000),
                waiters_settle: Duration::from_secs(5),
                waiters_window: Duration::from_secs(15),
                contended: (100, 100),
                groups: (100, 10),
                rebalance_rounds: 50,
                queue_slow_records: (100_000, 1_500),
                queue_overhead_records: 1_000_000,
                queue_kill_rounds: 3,
                queue_kill_records: 200_000,
            },
        }
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct Config {
    /// Smoke, quick or full.
    pub mode: Mode,
    /// Where results go.
    pub out: PathBuf,
    /// The gateway binary; `None`: `kafka-lease` next to this executable.
    pub gateway_bin: Option<PathBuf>,
    /// Extra flags for every gateway started (`--gateway-arg`).
    pub gateway_args: Vec<String>,
    /// Scenarios to run (empty: all), by [`SCENARIOS`] name.
    pub scenarios: Vec<String>,
}

/// The gateway binary to run: `explicit`, else `kafka-lease` beside the current executable.
///
/// # Errors
/// When it does not exist, with a message saying how to build it.
pub fn gateway_binary(explicit: Option<&Path>) -> Result<PathBuf> {
    let path = match explicit {
        Some(p) => p.to_path_buf(),
        None => std::env::current_exe()
            .context("locating the bench executable")?
            .parent()
            .ok_or_else(|| anyhow!("the bench executable has no parent directory"))?
            .join("kafka-lease"),
    };
    if !path.is_file() {
        bail!(
            "the gateway binary {} does not exist: build it with `cargo build --release --bin kafka-lease` \
             (it must sit next to kafka-lease-bench), or pass --gateway-bin PATH",
            path.display()
        );
    }
    Ok(path)
}

fn machine_info() -> Map<String, Value> {
    let mut m = Map::new();
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpu = read("/proc/cpuinfo")
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_default();
    let mem = read("/proc/meminfo")
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .map(|l| l.trim_start_matches("MemTotal:").trim().to_string())
        .unwrap_or_default();
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    m.insert("cpu".into(), cpu.into());
    m.insert("cores".into(), cores.into());
    m.insert("memory".into(), mem.into());
    m.insert(
        "kernel".into(),
        read("/proc/sys/kernel/osrelease").trim().into(),
    );
    m
}

fn gateway_version(bin: &Path) -> String {
    std::process::Command::new(bin)
        .arg("--version")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// Runs the selected scenarios in order, writing the results into `config.out` after each
/// one. Returns every row; fails if any scenario failed (after running the others).
///
/// # Errors
/// Services missing, gateway binary missing, an unknown scenario, or a failed scenario.
pub async fn run(config: Config) -> Result<Vec<ScenarioResult>> {
    for s in &config.scenarios {
        if !SCENARIOS.contains(&s.as_str()) {
            bail!(
                "unknown scenario {s:?}; the scenarios are: {}",
                SCENARIOS.join(", ")
            );
        }
    }
    let gateway_bin = gateway_binary(config.gateway_bin.as_deref())?;
    let services = kafka_lease_testkit::Services::discover().map_err(|why| {
        anyhow!("the benchmark needs the real Kafka and Consul, but {why}. Start them with `scripts/services up`.")
    })?;
    let progress = Progress::new();
    let log_dir = config.out.join("logs");
    std::fs::create_dir_all(&log_dir).with_context(|| format!("creating {}", log_dir.display()))?;
    let run_id = kafka_lease_testkit::unique_name("run");
    let plan = Plan::of(config.mode);
    let env = Env {
        services,
        gateway_bin: gateway_bin.clone(),
        gateway_args: config.gateway_args.clone(),
        log_dir,
        plan,
        progress: progress.clone(),
        run_id: run_id.clone(),
        topics: std::sync::Mutex::default(),
        go_drain: tokio::sync::OnceCell::new(),
    };
    let started_at = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let mut header = Map::new();
    header.insert("mode".into(), config.mode.name().into());
    header.insert("started_unix".into(), started_at.into());
    // Relative to the working directory where possible: results get committed, and a path
    // of the machine that ran them means nothing elsewhere.
    let shown_bin = std::env::current_dir()
        .ok()
        .and_then(|cwd| gateway_bin.strip_prefix(cwd).ok().map(Path::to_path_buf))
        .unwrap_or_else(|| gateway_bin.clone());
    header.insert(
        "gateway_binary".into(),
        shown_bin.display().to_string().into(),
    );
    header.insert(
        "gateway_version".into(),
        gateway_version(&gateway_bin).into(),
    );
    header.insert("gateway_args".into(), config.gateway_args.clone().into());
    header.insert("kafka".into(), env.services.kafka_bootstrap.clone().into());
    header.insert(
        "consul".into(),
        env.services.consul_http_addr.clone().into(),
    );
    header.insert("machine".into(), Value::Object(machine_info()));
    progress.say(format!(
        "kafka-lease-bench {} mode; gateway {}; kafka {}, consul {}; output {}",
        config.mode.name(),
        gateway_bin.display(),
        env.services.kafka_bootstrap,
        env.services.consul_http_addr,
        config.out.display()
    ));

    let mut results: Vec<ScenarioResult> = Vec::new();
    let mut failed: Vec<String> = Vec::new();
    for &name in SCENARIOS {
        if !config.scenarios.is_empty() && !config.scenarios.iter().any(|s| s == name) {
            continue;
        }
        let scenario_started = progress.elapsed();
        progress.say(format!("== {name}"));
        let outcome = scenarios::run(&env, name).await;
        env.delete_topics().await;
        match outcome {
            Ok(rows) => {
                for r in &rows {
                    progress.say(format!(
                        "== {name}: {} gateway {} vs baseline {} {} (ratio {}), goal {}: {}",
                        r.name,
                        report::fmt_num(r.gateway),
                        report::fmt_num(r.baseline),
                        r.unit,
                        r.ratio.map_or("n/a".into(), |x| format!("{x:.3}")),
                        r.goal,
                        if r.goal == report::NO_GOAL {
                            "reference"
                        } else if r.met {
                            "met"
                        } else {
                            "MISSED"
                        }
                    ));
                }
                results.extend(rows);
            }
            Err(err) => {
                progress.say(format!("== {name} FAILED: {err:#}"));
                failed.push(format!("{name}: {err:#}"));
            }
        }
        progress.say(format!(
            "== {name} took {:.1}s",
            (progress.elapsed() - scenario_started).as_secs_f64()
        ));
        header.insert(
            "total_seconds".into(),
            ((progress.elapsed().as_secs_f64() * 10.0).round() / 10.0).into(),
        );
        report::write_all(&config.out, &results, &header)?;
    }
    progress.say(format!(
        "done in {:.1}s; results in {}",
        progress.elapsed().as_secs_f64(),
        config.out.display()
    ));
    if !failed.is_empty() {
        bail!(
            "{} scenario(s) failed:\n{}",
            failed.len(),
            failed.join("\n")
        );
    }
    Ok(results)
}
