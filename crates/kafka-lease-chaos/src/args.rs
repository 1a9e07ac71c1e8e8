//! `kafka-lease-chaos`'s command line: `run` (with every knob of the cluster, the workload
//! and the nemesis), `check` and `cleanup`.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    version,
    about = "Fault tests of kafka-lease on a cluster in network namespaces"
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Command {
    /// Bring the cluster up, run the workload under the nemesis, check the history.
    Run(Box<RunArgs>),
    /// Check a history written by `run`.
    Check {
        /// The history (JSON lines).
        history: PathBuf,
    },
    /// Remove the namespaces (and kill their processes) a run left behind.
    Cleanup {
        #[arg(long, default_value = "klc")]
        prefix: String,
    },
}

#[derive(clap::Args, Debug)]
pub(crate) struct RunArgs {
    /// The faults, in order (comma-separated), from: kill-gateway, pause-gateway,
    /// cut-gateway-consul, cut-gateway-kafka, kill-consul-leader, isolate-consul-leader,
    /// restart-consul-servers, isolate-consul-leader-after-restart, kill-partition-leader,
    /// isolate-partition-leader, kill-group-coordinator, skew-gateway-clock; `short` for one
    /// of each kind, `all` for every one.
    #[arg(long, default_value = "short")]
    pub(crate) nemesis: String,
    /// Run the faults in a random mix until this much time has passed (e.g. 30m); without
    /// it, each fault of --nemesis runs once.
    #[arg(long, value_parser = humantime_secs)]
    pub(crate) soak: Option<u64>,
    /// With --soak, the odds that a fault runs together with another (one that neither
    /// undoes nor aims at the same process).
    #[arg(long, default_value_t = 0.4)]
    pub(crate) overlap: f64,
    /// How long each fault is held (seconds).
    #[arg(long, default_value_t = 6)]
    pub(crate) hold: u64,
    /// Quiet time after each fault is healed (seconds).
    #[arg(long, default_value_t = 8)]
    pub(crate) recover: u64,
    #[arg(long, default_value_t = 3)]
    pub(crate) gateways: usize,
    /// Clients that Acquire and Read.
    #[arg(long, default_value_t = 9)]
    pub(crate) clients: usize,
    /// Subscribe members of the same group, joining and leaving.
    #[arg(long, default_value_t = 2)]
    pub(crate) members: usize,
    /// Queue-mode consumers of the same group (Acquire and Deliver, answering each record).
    #[arg(long, default_value_t = 2)]
    pub(crate) queue_consumers: usize,
    #[arg(long, default_value_t = 6)]
    pub(crate) partitions: i32,
    /// At a lease's end, the odds that a client sends its last commit and the Release
    /// together (what the commit gate is for).
    #[arg(long, default_value_t = 0.3)]
    pub(crate) commit_with_release: f64,
    /// The odds that a lease is held 30 to 90 s rather than 3 to 10 s.
    #[arg(long, default_value_t = 0.3)]
    pub(crate) long_hold: f64,
    /// The odds, at each 400 ms tick, that a client stalls past its lease's TTL.
    #[arg(long, default_value_t = 0.015)]
    pub(crate) stall: f64,
    /// Records a second the producer writes.
    #[arg(long, default_value_t = 150)]
    pub(crate) rate: u32,
    /// Where the history, the report and the nodes' logs go.
    #[arg(long, default_value = "chaos-out")]
    pub(crate) out: PathBuf,
    #[arg(long, default_value = "klc")]
    pub(crate) prefix: String,
    /// The bridge's /24, as three octets.
    #[arg(long, default_value = "10.99.0")]
    pub(crate) subnet: String,
    #[arg(long, env = "KAFKA_LEASE_CONSUL_BIN")]
    pub(crate) consul_bin: PathBuf,
    #[arg(long, env = "KAFKA_LEASE_JAVA")]
    pub(crate) java: PathBuf,
    #[arg(long, env = "KAFKA_LEASE_KAFKA_LIBS")]
    pub(crate) kafka_libs: PathBuf,
    #[arg(long, env = "KAFKA_LEASE_KAFKA_STORAGE_CLASS")]
    pub(crate) kafka_storage_class: String,
    #[arg(long, env = "KAFKA_LEASE_KAFKA_LOG4J")]
    pub(crate) kafka_log4j: PathBuf,
    #[arg(long, default_value = "512m")]
    pub(crate) kafka_heap: String,
    /// Consul autopilot's `min_quorum` on the servers: it stops removing dead servers from
    /// the Raft configuration at this many. 3 (the default here, and the advice in
    /// docs/OPERATIONS.md) keeps a server that was down a voter when it comes back; 0 is
    /// Consul's own default, under which a server down for ~10 s is removed and rejoins as
    /// a non-voter for autopilot's stabilization time.
    #[arg(long, default_value_t = 3)]
    pub(crate) consul_min_quorum: u32,
    #[arg(long)]
    pub(crate) gateway_bin: PathBuf,
    /// Extra arguments for each gateway's `serve` (repeatable).
    #[arg(long = "gateway-arg", allow_hyphen_values = true)]
    pub(crate) gateway_args: Vec<String>,
    /// Run the gateways with a defect planted on purpose (no-self-fence, no-commit-gate,
    /// release-without-waiting); the gateway must be built with the `planted-defects`
    /// feature. The run then succeeds only if the checker finds an anomaly.
    #[arg(long)]
    pub(crate) planted_defect: Option<String>,
    /// The clockshift library built from `clockshift/clockshift.c` (scripts/chaos builds
    /// it), preloaded into the gateways; needed by the skew-gateway-clock fault.
    #[arg(long)]
    pub(crate) clockshift_lib: Option<PathBuf>,
}

fn humantime_secs(text: &str) -> Result<u64, String> {
    let (number, unit) = text.split_at(
        text.find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len()),
    );
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration like 90s, 30m or 1h"))?;
    match unit {
        "" | "s" => Ok(n),
        "m" => Ok(n * 60),
        "h" => Ok(n * 3600),
        _ => Err(format!("{text:?}: the unit must be s, m or h")),
    }
}

#[cfg(test)]
mod tests {
    use super::humantime_secs;

    #[test]
    fn soak_durations_take_seconds_minutes_and_hours() {
        assert_eq!(humantime_secs("90"), Ok(90));
        assert_eq!(humantime_secs("90s"), Ok(90));
        assert_eq!(humantime_secs("30m"), Ok(1800));
        assert_eq!(humantime_secs("1h"), Ok(3600));
        assert!(humantime_secs("30x").is_err_and(|e| e.contains("s, m or h")));
        assert!(humantime_secs("m").is_err_and(|e| e.contains("30m")));
    }
}
