//! A drain's rounds made rows and charts: each arm against its baseline, CPU, fairness.

use anyhow::{Context, Result};
use serde_json::{json, Map, Value};

use crate::env::Gateway;
use crate::report::{Chart, ScenarioResult, NO_GOAL};
use crate::scenarios::{r3, ratio, Row};
use crate::stats::median;

use super::arms::{GO_CLIENT_STYLE, RELAY_STYLE};
use super::{DrainRun, CONSUMER_STYLE, READ_MAX_BYTES, READ_MAX_RECORDS, READ_MAX_WAIT};

/// The `<name>-go` row: the Go client's drain through the gateway against the direct
/// consumer, with the Rust client's figures from the same rounds beside it.
pub(super) fn go_row(
    name: &str,
    scenario: &'static str,
    runs: &[(DrainRun, DrainRun)],
    gos: &[DrainRun],
) -> ScenarioResult {
    let med = |xs: Vec<f64>| median(&xs);
    let go = med(gos.iter().map(DrainRun::rate).collect());
    let rust = med(runs.iter().map(|(g, _)| g.rate()).collect());
    let direct = med(runs.iter().map(|(_, d)| d.rate()).collect());
    let go_client = med(gos
        .iter()
        .filter_map(DrainRun::client_cpu_us_per_record)
        .collect());
    let rust_client = med(runs
        .iter()
        .filter_map(|(g, _)| g.client_cpu_us_per_record())
        .collect());
    let go_gateway = med(gos.iter().filter_map(DrainRun::cpu_us_per_record).collect());
    let rust_gateway = med(runs
        .iter()
        .filter_map(|(g, _)| g.cpu_us_per_record())
        .collect());
    let rate_ratio = ratio(go, direct);
    let mut details = Map::new();
    details.insert("go_client_style".into(), GO_CLIENT_STYLE.into());
    details.insert("rust_client_records_per_s".into(), r3(rust).into());
    details.insert(
        "go_over_rust_client_rate".into(),
        ratio(go, rust).map(r3).into(),
    );
    details.insert("go_client_cpu_us_per_record".into(), r3(go_client).into());
    details.insert(
        "rust_client_cpu_us_per_record".into(),
        r3(rust_client).into(),
    );
    details.insert(
        "gateway_cpu_us_per_record_go_arm".into(),
        r3(go_gateway).into(),
    );
    details.insert(
        "gateway_cpu_us_per_record_rust_arm".into(),
        r3(rust_gateway).into(),
    );
    details.insert(
        "go_first_record_secs".into(),
        r3(med(gos.iter().map(|g| g.first_record_secs).collect())).into(),
    );
    details.insert(
        "go_records_per_s".into(),
        gos.iter().map(|g| r3(g.rate())).collect::<Vec<_>>().into(),
    );
    Row {
        name: format!("{name}-go"),
        scenario,
        unit: "records/s",
        gateway: r3(go),
        baseline: r3(direct),
        baseline_kind: "measured: direct rdkafka BaseConsumer of the same partition, same rounds"
            .into(),
        ratio: rate_ratio.map(r3),
        ratio_definition: "Go client records/s through the gateway / direct records/s (medians across rounds)",
        goal: NO_GOAL.into(),
        met: true,
        summary: format!(
            "Go client {go:.0} vs Rust client {rust:.0} records/s; client CPU {go_client:.2} vs {rust_client:.2} us/record; gateway CPU {go_gateway:.2} vs {rust_gateway:.2} us/record"
        ),
        details,
        chart: three_arm_chart(
            format!("{name}: the Go client and the Rust client through the gateway, records/s per round"),
            runs,
            ("gateway, Rust client", "gateway, Go client"),
            gos,
        ),
    }
    .build()
}

/// The `<name>-limit` row: the gateway against the relay arm, this machine's physical limit
/// for a process between Kafka and a client (medians across the same rounds).
pub(super) fn limit_row(
    name: &str,
    scenario: &'static str,
    runs: &[(DrainRun, DrainRun)],
    relays: &[DrainRun],
) -> ScenarioResult {
    let g = median(&runs.iter().map(|(g, _)| g.rate()).collect::<Vec<_>>());
    let r = median(&relays.iter().map(DrainRun::rate).collect::<Vec<_>>());
    let g_cpu = median(
        &runs
            .iter()
            .filter_map(|(g, _)| g.cpu_us_per_record())
            .collect::<Vec<_>>(),
    );
    let r_cpu = median(
        &relays
            .iter()
            .filter_map(DrainRun::cpu_us_per_record)
            .collect::<Vec<_>>(),
    );
    let d_cpu = median(
        &runs
            .iter()
            .filter_map(|(_, d)| d.cpu_us_per_record())
            .collect::<Vec<_>>(),
    );
    let rate_ratio = ratio(g, r);
    let cpu_ratio = ratio(g_cpu, r_cpu);
    let gateways = || runs.iter().map(|(g, _)| g);
    let g_machine = median(
        &gateways()
            .filter_map(DrainRun::machine_cpu_us_per_record)
            .collect::<Vec<_>>(),
    );
    let r_machine = median(
        &relays
            .iter()
            .filter_map(DrainRun::machine_cpu_us_per_record)
            .collect::<Vec<_>>(),
    );
    let mut details = Map::new();
    details.insert("relay_style".into(), RELAY_STYLE.into());
    // The whole machine's CPU per record in each arm (broker, arm, client, the rest): on
    // cores that are all busy, the rates go as the inverse of these.
    details.insert(
        "gateway_arm_machine_cpu_us_per_record".into(),
        r3(g_machine).into(),
    );
    details.insert(
        "relay_arm_machine_cpu_us_per_record".into(),
        r3(r_machine).into(),
    );
    details.insert(
        "gateway_arm_busy_cores".into(),
        gateways()
            .filter_map(DrainRun::busy_cores)
            .map(r3)
            .collect::<Vec<_>>()
            .into(),
    );
    details.insert(
        "relay_arm_busy_cores".into(),
        relays
            .iter()
            .filter_map(DrainRun::busy_cores)
            .map(r3)
            .collect::<Vec<_>>()
            .into(),
    );
    details.insert(
        "client_cpu_us_per_record".into(),
        r3(median(
            &gateways()
                .filter_map(DrainRun::client_cpu_us_per_record)
                .collect::<Vec<_>>(),
        ))
        .into(),
    );
    details.insert(
        "records_per_response".into(),
        r3(median(
            &gateways()
                .map(|g| g.records as f64 / g.responses.max(1) as f64)
                .collect::<Vec<_>>(),
        ))
        .into(),
    );
    details.insert("gateway_cpu_us_per_record".into(), r3(g_cpu).into());
    details.insert("relay_cpu_us_per_record".into(), r3(r_cpu).into());
    details.insert("direct_cpu_us_per_record".into(), r3(d_cpu).into());
    details.insert(
        "gateway_cpu_over_relay_cpu".into(),
        cpu_ratio.map(r3).into(),
    );
    details.insert(
        "relay_cpu_over_direct_cpu".into(),
        ratio(r_cpu, d_cpu).map(r3).into(),
    );
    details.insert(
        "relay_records_per_s".into(),
        relays
            .iter()
            .map(|r| r3(r.rate()))
            .collect::<Vec<_>>()
            .into(),
    );
    Row {
        name: format!("{name}-limit"),
        scenario,
        unit: "records/s",
        gateway: r3(g),
        baseline: r3(r),
        baseline_kind: "measured: the relay arm (direct consumer + loopback TCP copy of every record to a reader), same rounds".into(),
        ratio: rate_ratio.map(r3),
        ratio_definition: "gateway records/s / relay records/s (medians across rounds): the gateway's share of this machine's limit",
        goal: NO_GOAL.into(),
        met: true,
        summary: format!(
            "CPU per record: gateway {g_cpu:.2}, relay {r_cpu:.2} ({}x), direct {d_cpu:.2} us",
            cpu_ratio.map_or_else(|| "-".to_string(), |c| format!("{c:.2}"))
        ),
        details,
        chart: three_arm_chart(
            format!("{name}: gateway against the relay limit, records/s per round"),
            runs,
            ("gateway", "relay (limit)"),
            relays,
        ),
    }
    .build()
}

/// Channels of their own to `gateway`, one per client of the layout, for the counting
/// reader.
pub(super) async fn counting_channels(
    gateway: &Gateway,
    count: usize,
) -> Result<Vec<tonic::transport::Channel>> {
    let mut channels = Vec::new();
    for _ in 0..count {
        channels.push(
            tonic::transport::Channel::from_shared(gateway.endpoint())
                .context("the gateway's endpoint")?
                .connect()
                .await
                .context("connecting the counting reader")?,
        );
    }
    Ok(channels)
}

/// How the counting reader reads.
pub(crate) const COUNTING_STYLE: &str =
    "the gateway arm's Acquires and Read requests (or its Subscribe), on channels of their \
     own, one per client connection (tonic, HTTP/2), the responses not decoded into records: \
     each is walked once over its fields, counting the records and summing their values' \
     lengths \
     (crates/kafka-lease-bench/src/scenarios/discard.rs). The relay arm's reader's equal: \
     what a client must do at least to read a gRPC stream";

/// The `<name>-limit-counting` row: the gateway, read by a reader that only counts, against
/// the relay arm, whose reader only discards: the gateway's share of this machine's limit
/// when its client costs about what the relay's reader does (medians across the same
/// rounds).
pub(super) fn counting_row(
    name: &str,
    scenario: &'static str,
    counting: &[DrainRun],
    relays: &[DrainRun],
) -> ScenarioResult {
    let med = |runs: &[DrainRun], f: &dyn Fn(&DrainRun) -> Option<f64>| {
        median(&runs.iter().filter_map(f).collect::<Vec<_>>())
    };
    let c = med(counting, &|r| Some(r.rate()));
    let r = med(relays, &|r| Some(r.rate()));
    let c_cpu = med(counting, &DrainRun::cpu_us_per_record);
    let r_cpu = med(relays, &DrainRun::cpu_us_per_record);
    let reader_cpu = med(counting, &DrainRun::client_cpu_us_per_record);
    let rate_ratio = ratio(c, r);
    let cpu_ratio = ratio(c_cpu, r_cpu);
    let mut details = Map::new();
    details.insert("reader_style".into(), COUNTING_STYLE.into());
    details.insert("relay_style".into(), RELAY_STYLE.into());
    details.insert("gateway_cpu_us_per_record".into(), r3(c_cpu).into());
    details.insert("reader_cpu_us_per_record".into(), r3(reader_cpu).into());
    details.insert("relay_cpu_us_per_record".into(), r3(r_cpu).into());
    details.insert(
        "gateway_cpu_over_relay_cpu".into(),
        cpu_ratio.map(r3).into(),
    );
    details.insert(
        "gateway_arm_machine_cpu_us_per_record".into(),
        r3(med(counting, &DrainRun::machine_cpu_us_per_record)).into(),
    );
    details.insert(
        "relay_arm_machine_cpu_us_per_record".into(),
        r3(med(relays, &DrainRun::machine_cpu_us_per_record)).into(),
    );
    details.insert(
        "gateway_arm_busy_cores".into(),
        r3(med(counting, &DrainRun::busy_cores)).into(),
    );
    details.insert(
        "relay_arm_busy_cores".into(),
        r3(med(relays, &DrainRun::busy_cores)).into(),
    );
    details.insert(
        "rounds".into(),
        counting
            .iter()
            .zip(relays)
            .enumerate()
            .map(|(i, (c, r))| {
                json!({
                    "round": i + 1,
                    "gateway_records_per_s": r3(c.rate()),
                    "relay_records_per_s": r3(r.rate()),
                    "gateway_cpu_us_per_record": c.cpu_us_per_record().map(r3),
                    "reader_cpu_us_per_record": c.client_cpu_us_per_record().map(r3),
                    "relay_cpu_us_per_record": r.cpu_us_per_record().map(r3),
                })
            })
            .collect::<Vec<_>>()
            .into(),
    );
    Row {
        name: format!("{name}-limit-counting"),
        scenario,
        unit: "records/s",
        gateway: r3(c),
        baseline: r3(r),
        baseline_kind: "measured: the relay arm (direct consumer + loopback TCP copy of every record to a reader that discards it), same rounds".into(),
        ratio: rate_ratio.map(r3),
        ratio_definition: "gateway records/s read by a reader that only counts them / relay records/s (medians across rounds)",
        goal: NO_GOAL.into(),
        met: true,
        summary: format!(
            "CPU per record: gateway {c_cpu:.2}, its reader {reader_cpu:.2}, relay {r_cpu:.2} us ({}x)",
            cpu_ratio.map_or_else(|| "-".to_string(), |c| format!("{c:.2}"))
        ),
        details,
        chart: Chart {
            title: format!(
                "{name}: gateway (counting reader) against the relay limit, records/s per round"
            ),
            unit: "records/s".into(),
            groups: counting
                .iter()
                .zip(relays)
                .enumerate()
                .map(|(i, (c, r))| {
                    (
                        format!("round {}", i + 1),
                        vec![
                            ("gateway, counting reader".into(), c.rate()),
                            ("relay (limit)".into(), r.rate()),
                        ],
                    )
                })
                .collect(),
            lines: vec![("0.9 x relay median".into(), 0.9 * r)],
        },
    }
    .build()
}

/// Records/s per round of the gateway arm, a third arm of the same rounds (`third`), and the
/// direct consumer, labelled `(gateway, third)` and "direct rdkafka".
pub(super) fn three_arm_chart(
    title: String,
    runs: &[(DrainRun, DrainRun)],
    labels: (&str, &str),
    third: &[DrainRun],
) -> Chart {
    Chart {
        title,
        unit: "records/s".into(),
        groups: runs
            .iter()
            .zip(third)
            .enumerate()
            .map(|(i, ((g, d), t))| {
                (
                    format!("round {}", i + 1),
                    vec![
                        (labels.0.into(), g.rate()),
                        (labels.1.into(), t.rate()),
                        ("direct rdkafka".into(), d.rate()),
                    ],
                )
            })
            .collect(),
        lines: Vec::new(),
    }
}

pub(super) fn round_details(runs: &[(DrainRun, DrainRun)]) -> Value {
    Value::Array(
        runs.iter()
            .enumerate()
            .map(|(i, (g, d))| {
                json!({
                    "round": i + 1,
                    "gateway_records_per_s": r3(g.rate()),
                    "direct_records_per_s": r3(d.rate()),
                    "gateway_mb_per_s": r3(g.mb_s()),
                    "direct_mb_per_s": r3(d.mb_s()),
                    "gateway_secs": r3(g.secs),
                    "direct_secs": r3(d.secs),
                    "gateway_end_to_end_records_per_s": r3(g.end_to_end_rate()),
                    "direct_end_to_end_records_per_s": r3(d.end_to_end_rate()),
                    "gateway_first_record_secs": r3(g.first_record_secs),
                    "direct_first_record_secs": r3(d.first_record_secs),
                    "gateway_partition_records_per_s": g.partition_rates.iter().map(|x| r3(*x)).collect::<Vec<_>>(),
                    "direct_partition_records_per_s": d.partition_rates.iter().map(|x| r3(*x)).collect::<Vec<_>>(),
                })
            })
            .collect(),
    )
}

/// The goal of the `-cpu` rows: the gateway's CPU per record at most this many times the
/// direct consumer's.
pub(super) const CPU_GOAL: f64 = 1.5;

/// The `<name>-cpu` row: CPU time per record of the gateway process against that of the
/// direct consumer, in the same rounds (medians). Independent of how busy the machine is,
/// unlike the rates: a process that waits for the CPU uses none.
pub(super) fn cpu_row(
    name: &str,
    scenario: &'static str,
    runs: &[(DrainRun, DrainRun)],
) -> ScenarioResult {
    let per = |f: &dyn Fn(&(DrainRun, DrainRun)) -> Option<f64>| {
        median(&runs.iter().filter_map(f).collect::<Vec<_>>())
    };
    let g = per(&|(g, _)| g.cpu_us_per_record());
    let d = per(&|(_, d)| d.cpu_us_per_record());
    let client = per(&|(g, _)| g.client_cpu_us_per_record());
    let ratio = ratio(g, d);
    let mut details = Map::new();
    details.insert("client_cpu_us_per_record".into(), r3(client).into());
    details.insert(
        "client".into(),
        "the Rust client crate in the bench process, decoding every response into records (owned keys, values and headers); its CPU over the gateway drains, per record".into(),
    );
    details.insert(
        "timing".into(),
        "CPU time (user + system, all threads, from /proc/<pid>/stat at 10 ms resolution) of the gateway process over each gateway drain, and of the bench process (the direct consumer runs in it) over each direct drain, divided by the records drained; medians across rounds".into(),
    );
    details.insert(
        "rounds".into(),
        runs.iter()
            .map(|(g, d)| {
                json!({
                    "gateway_cpu_s": g.cpu_secs.map(r3),
                    "client_cpu_s": g.client_cpu_secs.map(r3),
                    "direct_cpu_s": d.cpu_secs.map(r3),
                    "gateway_records": g.records,
                    "direct_records": d.records,
                })
            })
            .collect::<Vec<_>>()
            .into(),
    );
    Row {
        name: format!("{name}-cpu"),
        scenario,
        unit: "CPU us/record",
        gateway: r3(g),
        baseline: r3(d),
        baseline_kind: "measured: CPU per record of the direct rdkafka consumer, same rounds"
            .into(),
        ratio: ratio.map(r3),
        ratio_definition: "gateway CPU per record / direct consumer CPU per record (medians)",
        goal: format!("<= {CPU_GOAL}"),
        met: ratio.is_some_and(|r| r <= CPU_GOAL),
        summary: format!(
            "{g:.2} vs {d:.2} us of CPU per record; the client's decoding {client:.2} us"
        ),
        details,
        chart: Chart {
            lines: vec![(format!("{CPU_GOAL} x direct median"), CPU_GOAL * d)],
            ..per_round(
                format!("{name}: CPU per record, per round"),
                "us/record",
                runs,
                |run| run.cpu_us_per_record().unwrap_or(0.0),
            )
        },
    }
    .build()
}

pub(super) fn chart(
    title: String,
    runs: &[(DrainRun, DrainRun)],
    goal_line: Option<(String, f64)>,
) -> Chart {
    Chart {
        lines: goal_line.into_iter().collect(),
        ..per_round(title, "records/s", runs, DrainRun::rate)
    }
}

/// A chart of `figure` for both arms, one group per round, no lines.
pub(super) fn per_round(
    title: String,
    unit: &str,
    runs: &[(DrainRun, DrainRun)],
    figure: impl Fn(&DrainRun) -> f64,
) -> Chart {
    Chart {
        title,
        unit: unit.into(),
        groups: runs
            .iter()
            .enumerate()
            .map(|(i, (g, d))| {
                (
                    format!("round {}", i + 1),
                    vec![
                        ("gateway".into(), figure(g)),
                        ("direct rdkafka".into(), figure(d)),
                    ],
                )
            })
            .collect(),
        lines: Vec::new(),
    }
}

/// Medians of the start-up figures, beside the steady-state headline.
pub(super) fn startup_details(details: &mut Map<String, Value>, runs: &[(DrainRun, DrainRun)]) {
    let med = |f: &dyn Fn(&(DrainRun, DrainRun)) -> f64| {
        r3(median(&runs.iter().map(f).collect::<Vec<_>>()))
    };
    details.insert(
        "gateway_first_record_secs".into(),
        med(&|(g, _)| g.first_record_secs).into(),
    );
    details.insert(
        "baseline_first_record_secs".into(),
        med(&|(_, d)| d.first_record_secs).into(),
    );
    details.insert(
        "gateway_end_to_end_records_per_s".into(),
        med(&|(g, _)| g.end_to_end_rate()).into(),
    );
    details.insert(
        "baseline_end_to_end_records_per_s".into(),
        med(&|(_, d)| d.end_to_end_rate()).into(),
    );
}

pub(super) fn common_details(
    details: &mut Map<String, Value>,
    value_size: usize,
    per_partition: u64,
    partitions: usize,
) {
    details.insert("value_bytes".into(), value_size.into());
    details.insert("records_per_partition".into(), per_partition.into());
    details.insert("partitions".into(), partitions.into());
    details.insert("consumer_style".into(), CONSUMER_STYLE.into());
    details.insert(
        "gateway_read_options".into(),
        json!({"max_records": READ_MAX_RECORDS, "max_bytes": READ_MAX_BYTES, "max_wait_ms": READ_MAX_WAIT.as_millis() as u64}),
    );
    details.insert(
        "timing".into(),
        "steady-state rate: records after the first arrival (the first batch, for the gateway) over the time from the first arrival to the last record; start-up separately: gateway from just before Acquire, direct from just before the consumer is created, to the first record (first_record_secs) and end-to-end rates including it; MB = 10^6 bytes of record values".into(),
    );
}
