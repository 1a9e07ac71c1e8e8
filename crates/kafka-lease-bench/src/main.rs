//! `kafka-lease-bench`: benchmarks of the kafka-lease gateway against direct baselines, on the
//! real services started by `scripts/services up`. See docs/BENCHMARKS.md.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use kafka_lease_bench::{Config, Mode, SCENARIOS};

/// Benchmarks the kafka-lease gateway against direct Kafka and Consul baselines, in the same
/// run, on the services of `scripts/services up`.
#[derive(Debug, Parser)]
#[command(version, after_help = after_help(), args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Quick mode: the whole run in under 5 minutes on 2 cores.
    #[arg(long, conflicts_with = "smoke")]
    quick: bool,
    /// Smoke mode: tiny counts, seconds; for the test suite (the figures mean nothing).
    #[arg(long)]
    smoke: bool,
    /// Where results.json, results.md, one SVG per scenario and the gateway logs go.
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
    /// The kafka-lease binary [default: kafka-lease next to this executable].
    #[arg(long)]
    gateway_bin: Option<PathBuf>,
    /// An extra flag for every gateway started, e.g. `--gateway-arg=--session-ttl=15s`
    /// (repeatable).
    #[arg(long = "gateway-arg", allow_hyphen_values = true)]
    gateway_args: Vec<String>,
    /// Run only this scenario (repeatable); default: all.
    #[arg(long = "scenario", value_parser = clap::builder::PossibleValuesParser::new(SCENARIOS))]
    scenarios: Vec<String>,
    /// Internal: run as a queue-mode Subscribe member (ENDPOINT GROUP TOPIC DEAD_LETTER_TOPIC
    /// HANDLER_MS CONCURRENCY), printing what it handles, for `queue-vs-share-group`.
    #[arg(long, hide = true, num_args = 6, value_names = ["ENDPOINT", "GROUP", "TOPIC", "DEAD_LETTER_TOPIC", "HANDLER_MS", "CONCURRENCY"])]
    queue_member: Option<Vec<String>>,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Compares two runs' results.json (e.g. the last publication and a new run): lists
    /// every row whose ratio moved the wrong way by more than its noise band (its rounds'
    /// spread, at least 10 %), and exits 1 when a row that met its goal in OLD misses it in
    /// NEW. Only ratios are compared; each run's machine line (run.json beside it) is shown.
    Compare {
        /// The earlier run's results.json.
        old: PathBuf,
        /// The later run's results.json.
        new: PathBuf,
    },
}

fn after_help() -> String {
    format!(
        "Scenarios: {}.\nNeeds the services: scripts/services up. Build the gateway first: \
         cargo build --release --bin kafka-lease",
        SCENARIOS.join(", ")
    )
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(Command::Compare { old, new }) = &cli.command {
        return match kafka_lease_bench::compare::run(old, new) {
            Ok(false) => ExitCode::SUCCESS,
            Ok(true) => {
                eprintln!("kafka-lease-bench compare: a row that met its goal misses it now");
                ExitCode::FAILURE
            }
            Err(err) => {
                eprintln!("kafka-lease-bench compare: {err:#}");
                ExitCode::from(2)
            }
        };
    }
    if let Some(values) = cli.queue_member {
        let outcome = match kafka_lease_bench::member::MemberArgs::parse(&values) {
            Ok(args) => kafka_lease_bench::member::run(args).await,
            Err(err) => Err(err),
        };
        return match outcome {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) => {
                eprintln!("kafka-lease-bench --queue-member: {err:#}");
                ExitCode::FAILURE
            }
        };
    }
    let mode = if cli.smoke {
        Mode::Smoke
    } else if cli.quick {
        Mode::Quick
    } else {
        Mode::Full
    };
    let config = Config {
        mode,
        out: cli.out,
        gateway_bin: cli.gateway_bin,
        gateway_args: cli.gateway_args,
        scenarios: cli.scenarios,
    };
    match kafka_lease_bench::run(config).await {
        Ok(_) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("kafka-lease-bench: {err:#}");
            ExitCode::FAILURE
        }
    }
}
