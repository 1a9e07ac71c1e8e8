//! Runs every scenario of the benchmark in smoke mode (tiny counts) against the real services
//! and the real gateway binary, and checks that the outputs exist and are well-formed. It
//! asserts nothing about speed.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

const SCENARIOS: &[&str] = &[
    "drain-1p-1KiB",
    "drain-1p-100B",
    "drain-16p",
    "drain-forwarded",
    "first-record",
    "latency",
    "acquire-release",
    "handoff",
    "crash-failover",
    "scale",
    "rebalance",
    "drain-subscribe",
    "queue-slow-handler",
    "queue-poison",
    "queue-overhead",
    "queue-vs-share-group",
];

/// Rows each scenario writes.
const ROWS: &[(&str, &[&str])] = &[
    (
        "drain-1p-1KiB",
        &["drain-1p-1KiB", "drain-1p-1KiB-limit-counting"],
    ),
    ("drain-1p-100B", &["drain-1p-100B"]),
    ("drain-16p", &["drain-16p", "drain-16p-limit-counting"]),
    ("drain-forwarded", &["drain-forwarded"]),
    (
        "first-record",
        &["first-record-new-group", "first-record-same-group"],
    ),
    ("latency", &["latency"]),
    ("acquire-release", &["acquire-release"]),
    ("handoff", &["handoff"]),
    ("crash-failover", &["crash-failover"]),
    (
        "scale",
        &["scale-rss", "scale-threads", "scale-consul-writes"],
    ),
    ("rebalance", &["rebalance"]),
    (
        "drain-subscribe",
        &["drain-subscribe", "drain-subscribe-limit-counting"],
    ),
    (
        "queue-slow-handler",
        &["queue-slow-handler", "queue-slow-handler-vs-partition"],
    ),
    ("queue-poison", &["queue-poison"]),
    ("queue-overhead", &["queue-overhead"]),
    (
        "queue-vs-share-group",
        &["queue-vs-share-group", "queue-vs-share-group-redelivery"],
    ),
];

fn number(row: &Value, field: &str) -> f64 {
    let name = row["name"].as_str().unwrap_or("?");
    let v = row[field]
        .as_f64()
        .unwrap_or_else(|| panic!("{name}.{field} is not a number: {}", row[field]));
    assert!(v.is_finite(), "{name}.{field} is not finite: {v}");
    v
}

#[test]
fn every_scenario_runs_in_smoke_mode_and_writes_well_formed_results() {
    let Some(_services) = kafka_lease_testkit::Services::require("bench smoke") else {
        return;
    };
    let bench = PathBuf::from(env!("CARGO_BIN_EXE_kafka-lease-bench"));
    let gateway = bench.parent().expect("bench dir").join("kafka-lease");
    assert!(
        gateway.is_file(),
        "the gateway binary {} is missing: `cargo test --workspace` builds it (the root package's \
         binary); or run `cargo build --bin kafka-lease` first",
        gateway.display()
    );
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("bench-smoke-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let status = Command::new(&bench)
        .arg("--smoke")
        .arg("--out")
        .arg(&out)
        .arg("--gateway-bin")
        .arg(&gateway)
        .status()
        .expect("run kafka-lease-bench");
    assert!(
        status.success(),
        "kafka-lease-bench --smoke failed: {status}"
    );

    let json = std::fs::read_to_string(out.join("results.json")).expect("results.json");
    let rows: Vec<Value> = serde_json::from_str(&json).expect("results.json parses");
    let md = std::fs::read_to_string(out.join("results.md")).expect("results.md");
    assert!(
        md.contains("| scenario |"),
        "results.md has no table:\n{md}"
    );

    for (scenario, names) in ROWS {
        assert!(SCENARIOS.contains(scenario));
        for name in *names {
            let row = rows
                .iter()
                .find(|r| r["name"] == *name)
                .unwrap_or_else(|| panic!("results.json has no row {name}"));
            assert_eq!(row["scenario"], *scenario);
            for field in ["unit", "goal", "baseline_kind", "ratio_definition"] {
                assert!(
                    row[field].as_str().is_some_and(|s| !s.is_empty()),
                    "{name}.{field} missing"
                );
            }
            assert!(row["met"].is_boolean(), "{name}.met is not a bool");
            let gateway = number(row, "gateway");
            let baseline = number(row, "baseline");
            if *name == "scale-consul-writes" {
                // A rate can be 0 in a smoke window; the ratio is then null.
                assert!(gateway >= 0.0 && baseline >= 0.0);
                assert!(row["ratio"].is_null() || number(row, "ratio") >= 0.0);
            } else {
                assert!(gateway > 0.0, "{name}.gateway must be > 0");
                assert!(baseline > 0.0, "{name}.baseline must be > 0");
                assert!(number(row, "ratio") > 0.0, "{name}.ratio must be > 0");
            }
            let svg = std::fs::read_to_string(out.join(format!("{name}.svg")))
                .unwrap_or_else(|_| panic!("{name}.svg missing"));
            assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
            assert!(
                md.contains(&format!("[{name}]")),
                "results.md has no row {name}"
            );
        }
    }
    // The Go client arm runs wherever Go is (CI has it: the client tests need it).
    let has_go = Command::new("go")
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success());
    if has_go || kafka_lease_testkit::is_ci() {
        for name in ["drain-1p-1KiB-go", "drain-1p-100B-go"] {
            let row = rows
                .iter()
                .find(|r| r["name"] == name)
                .unwrap_or_else(|| panic!("results.json has no row {name}"));
            assert!(number(row, "gateway") > 0.0, "{name}: the Go client's rate");
            assert!(number(row, "go_client_cpu_us_per_record") >= 0.0);
            assert!(number(row, "rust_client_records_per_s") > 0.0);
            assert!(
                out.join(format!("{name}.svg")).is_file(),
                "{name}.svg missing"
            );
        }
    }
    for name in ["drain-1p-1KiB", "drain-1p-100B", "drain-16p"] {
        let row = rows.iter().find(|r| r["name"] == name).expect("drain row");
        assert!(number(row, "gateway_mb_per_s") > 0.0);
        assert!(number(row, "baseline_mb_per_s") > 0.0);
    }
    let drain16 = rows
        .iter()
        .find(|r| r["name"] == "drain-16p")
        .expect("drain-16p");
    assert!(number(drain16, "gateway_slowest_over_fastest_partition") > 0.0);
    let latency = rows
        .iter()
        .find(|r| r["name"] == "latency")
        .expect("latency");
    assert!(number(latency, "gateway_p50_ms") > 0.0 && number(latency, "baseline_p50_ms") > 0.0);
    let acquire = rows
        .iter()
        .find(|r| r["name"] == "acquire-release")
        .expect("acquire");
    assert!(number(acquire, "consul_http_writes_per_acquire") > 0.0);
    let rss = rows
        .iter()
        .find(|r| r["name"] == "scale-rss")
        .expect("scale-rss");
    assert!(rss["points"].as_array().is_some_and(|p| p.len() == 2));
}
