//! The command line tools, `kafka-lease leases`, `tail` and `topics`, as a person runs them:
//! the real binary against a real gateway, real Kafka and real Consul. Leases the test holds
//! show with their member and token; tail prints what the test produced, in text and JSON,
//! from where `--from` says; every way tail ends (`--max-records`, `--exit-at-end`, SIGINT,
//! SIGTERM, a closed stdout, a gateway error) gives the lease back, and `--commit-on-exit`
//! commits the offset after the last record printed; the summary counts what the reader of a
//! closed pipe got and comes after any error; bad flags exit 64 with one line; `--gateway` as
//! `host:port` or a URL, and an unreachable one named; TLS, mutual TLS and a bearer token from
//! a file.

mod support;

use std::path::PathBuf;
use std::process::{Output, Stdio};
use std::time::{Duration, UNIX_EPOCH};

use kafka_lease_client::{AcquireOptions, Client, LeaseFilter};
use kafka_lease_testkit::{unique_name, wait_for, Services, TestCa};
use support::{
    consul_keys, create_topic, kafka_committed, produce, produce_n, producer, unique_prefix,
    GatewayProcess, TestRecord,
};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStderr, ChildStdout, Command};

const BIN: &str = env!("CARGO_BIN_EXE_kafka-lease");
const DEADLINE: Duration = Duration::from_secs(30);

/// The tool with `args`, its environment free of the variables that would change it.
fn tool(args: &[&str]) -> Command {
    let mut command = Command::new(BIN);
    command
        .args(args)
        .env_remove("KAFKA_LEASE_GATEWAY")
        .env_remove("KAFKA_LEASE_TOKEN_FILE")
        .env_remove("KAFKA_LEASE_KAFKA")
        .env_remove("KAFKA_LEASE_KAFKA_OPTIONS")
        .env_remove("KAFKA_LEASE_KAFKA_CONFIG_FILE")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    command
}

/// Runs the tool to its end (within the deadline).
async fn run(args: &[&str]) -> Output {
    tokio::time::timeout(DEADLINE, tool(args).output())
        .await
        .unwrap_or_else(|_| panic!("kafka-lease {args:?} did not end within {DEADLINE:?}"))
        .expect("run kafka-lease")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Asserts a run ended with `status`, and shows its output if not.
fn assert_status(out: &Output, status: i32, what: &str) {
    assert_eq!(
        out.status.code(),
        Some(status),
        "{what}: stdout:\n{}\nstderr:\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
}

/// A `tail` running in the background, its stdout and stderr read line by line.
struct Tail {
    child: Child,
    stdout: Option<Lines<BufReader<ChildStdout>>>,
    stderr: Lines<BufReader<ChildStderr>>,
}

impl Tail {
    fn spawn(args: &[&str]) -> Tail {
        let mut child = tool(&[&["tail"], args].concat())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn kafka-lease tail");
        let stdout = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let stderr = BufReader::new(child.stderr.take().expect("stderr")).lines();
        Tail {
            child,
            stdout: Some(stdout),
            stderr,
        }
    }

    async fn stdout_line(&mut self) -> String {
        let stdout = self.stdout.as_mut().expect("stdout open");
        tokio::time::timeout(DEADLINE, stdout.next_line())
            .await
            .expect("a line on stdout in time")
            .expect("read stdout")
            .expect("tail still printing")
    }

    /// Reads stderr until a line contains `needle`; returns that line.
    async fn stderr_until(&mut self, needle: &str) -> String {
        tokio::time::timeout(DEADLINE, async {
            while let Some(line) = self.stderr.next_line().await.expect("read stderr") {
                if line.contains(needle) {
                    return line;
                }
            }
            panic!("tail's stderr ended before {needle:?}");
        })
        .await
        .unwrap_or_else(|_| panic!("{needle:?} on tail's stderr in time"))
    }

    /// Closes the reading end of its stdout, as `| head -n 1` does after its line.
    fn close_stdout(&mut self) {
        self.stdout = None;
    }

    fn signal(&self, signal: &str) {
        let pid = self.child.id().expect("tail runs").to_string();
        let status = std::process::Command::new("kill")
            .args([&format!("-{signal}"), &pid])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} {pid}");
    }

    /// Waits for the exit; the status and the rest of stderr.
    async fn exit(mut self) -> (Option<i32>, String) {
        let status = tokio::time::timeout(DEADLINE, self.child.wait())
            .await
            .expect("tail exits in time")
            .expect("wait for tail");
        let mut rest = String::new();
        while let Ok(Some(line)) = self.stderr.next_line().await {
            rest.push_str(&line);
            rest.push('\n');
        }
        (status.code(), rest)
    }
}

/// Waits until the group holds no lease, through ListLeases and in Consul. A lease left
/// behind would stay for its TTL (10 s), far longer than this waits.
async fn assert_nothing_held(
    services: &Services,
    client: &Client,
    prefix: &str,
    group: &str,
    what: &str,
) {
    wait_for(
        &format!("{what}: no lease of group {group}"),
        Duration::from_secs(3),
        || async {
            let leases = client
                .list_leases(LeaseFilter::new().group(group))
                .await
                .expect("list leases");
            leases.is_empty().then_some(())
        },
    )
    .await;
    let keys = consul_keys(services, prefix).await;
    assert!(
        keys.iter().all(|(key, ..)| !key.contains(group)),
        "{what}: lock keys left in Consul: {keys:?}"
    );
}

/// Waits until a lease of the group shows in ListLeases.
async fn wait_until_held(client: &Client, group: &str) {
    wait_for(&format!("a lease of group {group}"), DEADLINE, || async {
        let leases = client
            .list_leases(LeaseFilter::new().group(group))
            .await
            .ok()?;
        (!leases.is_empty()).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_shows_the_leases_the_test_holds_as_a_table_and_as_json() {
    let services = kafka_lease_testkit::require_services!();
    let prefix = unique_prefix();
    let gateway = GatewayProcess::start(&services, &prefix, &unique_name("gw"), &[]).await;
    let topic = create_topic(&services, 3).await;
    produce_n(&producer(&services), &topic, 1, 7).await;
    let group = unique_name("ops");
    let client = gateway.client().await;
    let lease = client
        .acquire(
            AcquireOptions::new(&group, &topic)
                .partition(1)
                .member("ops-cli-member")
                .ttl(Duration::from_secs(60)),
        )
        .await
        .expect("acquire");
    let other_group = unique_name("other");
    let other = client
        .acquire(AcquireOptions::new(&other_group, &topic).partition(2))
        .await
        .expect("acquire in another group");
    let endpoint = gateway.endpoint();

    // `host:port`, as grpcurl takes it.
    let out = run(&["leases", "--gateway", &gateway.addr, "--group", &group]).await;
    assert_status(&out, 0, "leases");
    let table = text(&out.stdout);
    println!("{table}");
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 2, "a header and the one lease: {table}");
    let header: Vec<&str> = lines[0]
        .split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect();
    assert_eq!(
        header,
        [
            "GROUP",
            "TOPIC",
            "PARTITION",
            "MEMBER",
            "GATEWAY",
            "TOKEN",
            "POSITION",
            "COMMITTED",
            "LAG",
            "READ LAG",
            "EXPIRES IN",
            "NOTE"
        ]
    );
    let row: Vec<&str> = lines[1].split_whitespace().collect();
    let token = lease.fencing_token().to_string();
    assert_eq!(
        row[..10],
        [
            group.as_str(),
            topic.as_str(),
            "1",
            "ops-cli-member",
            gateway.instance.as_str(),
            token.as_str(),
            "0",
            "-",
            "-",
            "7"
        ],
        "{table}"
    );
    let expires_in: u64 = row[10]
        .strip_suffix('s')
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("expires in: {}", row[10]));
    assert!((50..=60).contains(&expires_in), "{table}");
    assert_eq!(row.len(), 11, "no note: {table}");
    assert!(out.stderr.is_empty(), "{}", text(&out.stderr));

    // JSON, with the gateway from the environment; every lease, both groups, in order.
    let out = tool(&["leases", "--output", "json"])
        .env("KAFKA_LEASE_GATEWAY", &endpoint)
        .output()
        .await
        .expect("run");
    assert_status(&out, 0, "leases --output json");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON value");
    let rows = json.as_array().expect("an array");
    let ours = rows
        .iter()
        .find(|r| r["group"] == group.as_str())
        .expect("our lease");
    assert_eq!(ours["topic"], topic.as_str());
    assert_eq!(ours["partition"], 1);
    assert_eq!(ours["member"], "ops-cli-member");
    assert_eq!(ours["member_id"], serde_json::Value::Null);
    assert_eq!(ours["gateway"], gateway.instance.as_str());
    assert_eq!(ours["gateway_address"], gateway.addr.as_str());
    assert_eq!(ours["fencing_token"], lease.fencing_token());
    assert_eq!(ours["position"], 0);
    assert_eq!(ours["committed_offset"], serde_json::Value::Null);
    assert_eq!(ours["high_watermark"], 7);
    // Kafka's lag needs a committed offset; the read lag is the 7 records not read yet.
    assert_eq!(ours["lag"], serde_json::Value::Null);
    assert_eq!(ours["read_lag"], 7);
    assert_eq!(ours["details_unavailable"], serde_json::Value::Null);
    let expires_in = ours["expires_in_seconds"].as_f64().expect("a number");
    assert!((50.0..=60.0).contains(&expires_in), "{ours}");
    assert!(ours["acquired_at"]
        .as_str()
        .is_some_and(|t| t.ends_with('Z')));
    assert!(ours["expires_at"]
        .as_str()
        .is_some_and(|t| t.ends_with('Z')));
    let keys: Vec<(String, String)> = rows
        .iter()
        .map(|r| (r["group"].to_string(), r["topic"].to_string()))
        .collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(keys, sorted, "as the gateway lists them");
    assert!(rows.iter().any(|r| r["group"] == other_group.as_str()));

    // Filters that match nothing: the header alone, an empty array.
    let out = run(&[
        "leases",
        "--gateway",
        &endpoint,
        "--group",
        &group,
        "--topic",
        "no-such-topic",
    ])
    .await;
    assert_status(&out, 0, "leases, nothing matches");
    assert_eq!(text(&out.stdout).lines().count(), 1);
    let out = run(&[
        "leases",
        "--gateway",
        &endpoint,
        "--group",
        &group,
        "--topic",
        "nope",
        "--output",
        "json",
    ])
    .await;
    assert_eq!(text(&out.stdout).trim(), "[]");

    lease.release().await.expect("release");
    other.release().await.expect("release");
}

/// Records with every shape a printer must keep apart.
fn shaped_records() -> Vec<TestRecord> {
    vec![
        TestRecord {
            key: Some(b"k1".to_vec()),
            value: Some(b"hello world".to_vec()),
            headers: vec![
                ("trace".into(), Some(b"abc".to_vec())),
                ("trace".into(), Some(b"a,b=c".to_vec())),
                ("none".into(), None),
            ],
            timestamp_ms: Some(1_700_000_000_123),
        },
        TestRecord {
            key: None,
            value: Some(vec![0x00, 0xff, b'x', b'\t', b'\n']),
            headers: Vec::new(),
            timestamp_ms: Some(1_700_000_001_000),
        },
        TestRecord {
            key: Some("clé".as_bytes().to_vec()),
            value: None,
            headers: Vec::new(),
            timestamp_ms: Some(1_700_000_002_000),
        },
        TestRecord {
            key: Some(Vec::new()),
            value: Some(Vec::new()),
            headers: vec![("bin".into(), Some(vec![0xc3]))],
            timestamp_ms: Some(1_700_000_003_000),
        },
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tail_prints_the_records_as_text_and_as_json_and_gives_the_lease_back() {
    let services = kafka_lease_testkit::require_services!();
    let prefix = unique_prefix();
    let gateway = GatewayProcess::start(&services, &prefix, &unique_name("gw"), &[]).await;
    let topic = create_topic(&services, 1).await;
    produce(&producer(&services), &topic, 0, &shaped_records()).await;
    let client = gateway.client().await;
    let endpoint = gateway.endpoint();
    let group = unique_name("tail");

    let out = run(&[
        "tail",
        "--gateway",
        &endpoint,
        "--group",
        &group,
        "--topic",
        &topic,
        "--from",
        "earliest",
        "--max-records",
        "4",
    ])
    .await;
    assert_status(&out, 0, "tail --max-records 4");
    let printed = text(&out.stdout);
    println!("{printed}");
    assert_eq!(
        printed,
        "0\t0\t2023-11-14T22:13:20.123Z\tk1\thello world\ttrace=abc,trace=a\\x2cb=c,none=\\N\n\
         0\t1\t2023-11-14T22:13:21.000Z\t\\N\t\\x00\\xffx\\t\\n\t\n\
         0\t2\t2023-11-14T22:13:22.000Z\tclé\t\\N\t\n\
         0\t3\t2023-11-14T22:13:23.000Z\t\t\tbin=\\xc3\n"
    );
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "leased partition 0 of {topic} for group {group} (fencing token "
        )) && stderr.contains("reading from offset 0"),
        "{stderr}"
    );
    assert!(
        stderr.contains("4 records printed; lease released"),
        "{stderr}"
    );
    assert_nothing_held(&services, &client, &prefix, &group, "after --max-records").await;
    assert_eq!(
        kafka_committed(&services, &group, &topic, 0),
        None,
        "no commit without --commit-on-exit"
    );

    let out = run(&[
        "tail",
        "--gateway",
        &endpoint,
        "--group",
        &group,
        "--topic",
        &topic,
        "--partition",
        "0",
        "--from",
        "earliest",
        "--max-records",
        "4",
        "--format",
        "json",
        "--quiet",
    ])
    .await;
    assert_status(&out, 0, "tail --format json");
    assert!(out.stderr.is_empty(), "--quiet: {}", text(&out.stderr));
    let lines: Vec<serde_json::Value> = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON object per line"))
        .collect();
    println!("{}", text(&out.stdout));
    assert_eq!(lines.len(), 4);
    let first = &lines[0];
    assert_eq!(first["topic"], topic.as_str());
    assert_eq!(first["partition"], 0);
    assert_eq!(first["offset"], 0);
    assert_eq!(first["timestamp"], "2023-11-14T22:13:20.123Z");
    assert_eq!(first["timestamp_type"], "create_time");
    assert_eq!(first["key"], "k1");
    assert_eq!(first["value"], "hello world");
    assert_eq!(
        first["headers"],
        serde_json::json!([
            {"key": "trace", "value": "abc"},
            {"key": "trace", "value": "a,b=c"},
            {"key": "none", "value": null},
        ])
    );
    let binary = &lines[1];
    assert_eq!(binary["key"], serde_json::Value::Null);
    assert_eq!(binary["value"], "AP94CQo=");
    assert_eq!(binary["value_encoding"], "base64");
    assert!(first.get("value_encoding").is_none());
    assert_eq!(lines[2]["key"], "clé");
    assert_eq!(lines[2]["value"], serde_json::Value::Null);
    assert_eq!(lines[3]["key"], "");
    assert_eq!(lines[3]["value"], "");
    assert_eq!(
        lines[3]["headers"],
        serde_json::json!([{"key": "bin", "value": "ww==", "value_encoding": "base64"}])
    );
    assert_nothing_held(&services, &client, &prefix, &group, "after the JSON tail").await;
}

/// RFC 3339 in UTC with milliseconds, as tail prints times and takes them.
fn rfc3339_ms(ms: i64) -> String {
    let time = UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).expect("after 1970"));
    humantime::format_rfc3339_millis(time).to_string()
}

/// The offsets a tail printed, from its text lines.
fn offsets(out: &Output) -> Vec<i64> {
    text(&out.stdout)
        .lines()
        .map(|line| {
            line.split('\t')
                .nth(1)
                .and_then(|o| o.parse().ok())
                .unwrap_or_else(|| panic!("not a record line: {line:?}"))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tail_starts_where_from_says() {
    let services = kafka_lease_testkit::require_services!();
    let prefix = unique_prefix();
    let gateway = GatewayProcess::start(&services, &prefix, &unique_name("gw"), &[]).await;
    let topic = create_topic(&services, 1).await;
    let base_ms = 1_750_000_000_000_i64;
    let records: Vec<TestRecord> = (0..10)
        .map(|i| TestRecord {
            timestamp_ms: Some(base_ms + i * 1000),
            ..TestRecord::value(format!("v{i}"))
        })
        .collect();
    let producer = producer(&services);
    produce(&producer, &topic, 0, &records).await;
    let client = gateway.client().await;
    let endpoint = gateway.endpoint();
    let group = unique_name("from");
    let tail = |from: &str, max: &str, extra: &[&str]| {
        let mut args = vec![
            "tail".to_string(),
            "--gateway".into(),
            endpoint.clone(),
            "--group".into(),
            group.clone(),
            "--topic".into(),
            topic.clone(),
            "--from".into(),
            from.into(),
            "--max-records".into(),
            max.into(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    };
    let run_tail = |args: Vec<String>| async move {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run(&args).await
    };

    // An offset.
    let out = run_tail(tail("4", "2", &[])).await;
    assert_status(&out, 0, "--from 4");
    assert_eq!(offsets(&out), [4, 5]);
    // Earliest, committing on exit the offset after the last record printed.
    let out = run_tail(tail("earliest", "3", &["--commit-on-exit"])).await;
    assert_status(&out, 0, "--from earliest --commit-on-exit");
    assert_eq!(offsets(&out), [0, 1, 2]);
    assert!(
        text(&out.stderr).contains("3 records printed; committed offset 3; lease released"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(
        kafka_committed(&services, &group, &topic, 0).map(|(o, _)| o),
        Some(3)
    );
    // Committed, the default: where the group left off.
    let out = run_tail(tail("committed", "1", &[])).await;
    assert_eq!(offsets(&out), [3]);
    let out = run(&[
        "tail",
        "--gateway",
        &endpoint,
        "--group",
        &group,
        "--topic",
        &topic,
        "--max-records",
        "1",
    ])
    .await;
    assert_eq!(offsets(&out), [3], "committed is the default");
    // A time: the first record at or after it, in UTC or with an offset.
    let half_past_six = rfc3339_ms(base_ms + 6500);
    let out = run_tail(tail(&half_past_six, "2", &[])).await;
    assert_status(&out, 0, "--from a time");
    assert_eq!(offsets(&out), [7, 8], "{half_past_six}");
    let exact_in_another_zone = {
        // base + 2 s, written as the same instant at +02:00.
        let utc = rfc3339_ms(base_ms + 2000 + 2 * 3_600_000);
        format!("{}+02:00", utc.trim_end_matches('Z'))
    };
    let out = run_tail(tail(&exact_in_another_zone, "1", &[])).await;
    assert_eq!(offsets(&out), [2], "{exact_in_another_zone}");
    // Latest: only what is produced after the tail sought there.
    let latest_args = tail("latest", "1", &[]);
    let latest_args: Vec<&str> = latest_args[1..].iter().map(String::as_str).collect();
    let mut latest = Tail::spawn(&latest_args);
    let line = latest.stderr_until("reading from offset").await;
    assert!(line.ends_with("reading from offset 10"), "{line}");
    produce_n(&producer, &topic, 0, 1).await;
    assert_eq!(latest.stdout_line().await.split('\t').nth(1), Some("10"));
    let (status, stderr) = latest.exit().await;
    assert_eq!(status, Some(0), "{stderr}");
    // An offset past the end: the gateway's answer, one line, and the lease released.
    let out = run_tail(tail("999", "1", &[])).await;
    assert_status(&out, 1, "--from 999");
    let stderr = text(&out.stderr);
    let error_lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("OUT_OF_RANGE"))
        .collect();
    assert_eq!(error_lines.len(), 1, "{stderr}");
    assert!(
        error_lines[0].starts_with("kafka-lease tail: OUT_OF_RANGE (OFFSET_OUT_OF_RANGE): "),
        "{stderr}"
    );
    assert!(error_lines[0].contains("999"), "{stderr}");
    // The error first, as it happened, then the summary of the cleanup after it.
    let lines: Vec<&str> = stderr.lines().collect();
    let error_at = lines.iter().position(|l| l.contains("OUT_OF_RANGE"));
    let summary_at = lines.iter().position(|l| l.contains("records printed"));
    assert!(
        error_at.is_some() && summary_at.is_some() && error_at < summary_at,
        "the error, then the summary: {stderr}"
    );
    assert_eq!(
        lines.last().copied(),
        Some("kafka-lease tail: 0 records printed; lease released"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty());
    assert_nothing_held(&services, &client, &prefix, &group, "after --from 999").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_ends_a_waiting_tail_with_130_committing_and_releasing() {
    let services = kafka_lease_testkit::require_services!();
    let prefix = unique_prefix();
    let gateway = GatewayProcess::start(&services, &prefix, &unique_name("gw"), &[]).await;
    let topic = create_topic(&services, 2).await;
    let producer = producer(&services);
    produce_n(&producer, &topic, 1, 5).await;
    let client = gateway.client().await;
    let endpoint = gateway.endpoint();
    let group = unique_name("sigint");

    let mut tail = Tail::spawn(&[
        "--gateway",
        &endpoint,
        "--group",
        &group,
        "--topic",
        &topic,
        "--partition",
        "1",
        "--commit-on-exit",
        "--member",
        "sigint-test",
    ]);
    for i in 0..5 {
        let line = tail.stdout_line().await;
        assert!(line.starts_with(&format!("1\t{i}\t")), "{line}");
    }
    // A record produced while it waits is printed too.
    produce_n(&producer, &topic, 1, 1).await;
    assert!(tail.stdout_line().await.starts_with("1\t5\t"));
    let held = client
        .list_leases(LeaseFilter::new().group(&group))
        .await
        .expect("list");
    assert_eq!(held.len(), 1);
    assert_eq!(held[0].member, "sigint-test");
    tail.signal("INT");
    let (status, stderr) = tail.exit().await;
    println!("{stderr}");
    assert_eq!(status, Some(130), "{stderr}");
    assert!(
        stderr.contains("SIGINT received; stopping")
            && stderr.contains("6 records printed; committed offset 6; lease released"),
        "{stderr}"
    );
    assert_eq!(
        kafka_committed(&services, &group, &topic, 1).map(|(o, _)| o),
        Some(6),
        "the offset after the last record printed"
    );
    assert_nothing_held(&services, &client, &prefix, &group, "after SIGINT").await;

    // SIGTERM while waiting on an empty partition: 143, released, nothing to commit.
    let mut tail = Tail::spawn(&[
        "--gateway",
        &endpoint,
        "--group",
        &group,
        "--topic",
        &topic,
        "--partition",
        "0",
        "--commit-on-exit",
    ]);
    tail.stderr_until("reading from offset 0").await;
    wait_until_held(&client, &group).await;
    tail.signal("TERM");
    let (status, stderr) = tail.exit().await;
    assert_eq!(status, Some(143), "{stderr}");
    assert!(
        stderr.contains("0 records printed; nothing to commit; lease released"),
        "{stderr}"
    );
    assert_eq!(kafka_committed(&services, &group, &topic, 0), None);
    assert_nothing_held(&services, &client, &prefix, &group, "after SIGTERM").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_stdout_ends_tail_cleanly_and_releases_the_lease() {
    let services = kafka_lease_testkit::require_services!();
    let prefix = unique_prefix();
    let gateway = GatewayProcess::start(&services, &prefix, &unique_name("gw"), &[]).await;
    let topic = create_topic(&services, 1).await;
    let producer = producer(&services);
    produce_n(&producer, &topic, 0, 3).await;
    let client = gateway.client().await;
    let group = unique_name("head");
    let mut tail = Tail::spawn(&[
        "--gateway",
        &gateway.endpoint(),
        "--group",
        &group,
        "--topic",
        &topic,
        "--commit-on-exit",
    ]);
    // `| head -n 1`: one line read, then the pipe closed.
    assert!(tail.stdout_line().await.starts_with("0\t0\t"));
    // It ends by itself, with no record left to write: it notices the pipe closed.
    tail.close_stdout();
    let (status, stderr) = tail.exit().await;
    assert_eq!(status, Some(0), "{stderr}");
    assert!(
        stderr.contains("stdout was closed, so nothing committed"),
        "{stderr}"
    );
    assert_eq!(kafka_committed(&services, &group, &topic, 0), None);
    assert_nothing_held(&services, &client, &prefix, &group, "after the pipe closed").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_pipe_leaves_a_summary_counting_the_lines_the_reader_got() {
    let services = kafka_lease_testkit::require_services!();
    let prefix = unique_prefix();
    let gateway = GatewayProcess::start(&services, &prefix, &unique_name("gw"), &[]).await;
    let topic = create_topic(&services, 1).await;
    produce_n(&producer(&services), &topic, 0, 3).await;
    let client = gateway.client().await;
    let endpoint = gateway.endpoint();
    // `| head -n 3` with three records: the reader gets all three lines, then goes. The
    // summary says 3 every time; it once said 0 when the pipe's closing was seen before the
    // end of the write that had put the lines in it. Several runs, for the race.
    for run in 0..8 {
        let group = unique_name("pipe");
        let mut tail = Tail::spawn(&[
            "--gateway",
            &endpoint,
            "--group",
            &group,
            "--topic",
            &topic,
            "--from",
            "earliest",
        ]);
        for i in 0..3 {
            let line = tail.stdout_line().await;
            assert!(line.starts_with(&format!("0\t{i}\t")), "run {run}: {line}");
        }
        tail.close_stdout();
        let (status, stderr) = tail.exit().await;
        assert_eq!(status, Some(0), "run {run}: {stderr}");
        assert!(
            stderr.contains("kafka-lease tail: 3 records printed; lease released"),
            "run {run}: {stderr}"
        );
        assert_nothing_held(&services, &client, &prefix, &group, "after the pipe closed").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_at_end_stops_at_the_end_of_the_partition() {
    let services = kafka_lease_testkit::require_services!();
    let prefix = unique_prefix();
    let gateway = GatewayProcess::start(&services, &prefix, &unique_name("gw"), &[]).await;
    let topic = create_topic(&services, 2).await;
    // More than one Read batch (500 records each).
    produce_n(&producer(&services), &topic, 0, 1200).await;
    let client = gateway.client().await;
    let endpoint = gateway.endpoint();
    let group = unique_name("end");
    let tail = |extra: &[&str]| {
        let mut args = vec![
            "tail".to_string(),
            "--gateway".into(),
            endpoint.clone(),
            "--group".into(),
            group.clone(),
            "--topic".into(),
            topic.clone(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    };
    let run_tail = |args: Vec<String>| async move {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let started = tokio::time::Instant::now();
        let out = run(&args).await;
        (out, started.elapsed())
    };
    let summary = |out: &Output| {
        text(&out.stderr)
            .lines()
            .last()
            .unwrap_or_default()
            .to_string()
    };

    // Every record, across batches, then the end: exit 0, released, nothing committed.
    let (out, _) = run_tail(tail(&[
        "--partition",
        "0",
        "--from",
        "earliest",
        "--exit-at-end",
    ]))
    .await;
    assert_status(&out, 0, "--exit-at-end from the earliest");
    assert_eq!(offsets(&out), (0..1200).collect::<Vec<i64>>());
    assert_eq!(
        summary(&out),
        "kafka-lease tail: 1200 records printed; reached the end of the partition \
         (offset 1200); lease released"
    );
    assert_eq!(kafka_committed(&services, &group, &topic, 0), None);
    assert_nothing_held(&services, &client, &prefix, &group, "after -e").await;

    // From an offset, committing on exit.
    let (out, _) = run_tail(tail(&[
        "--partition",
        "0",
        "--from",
        "1190",
        "-e",
        "--commit-on-exit",
    ]))
    .await;
    assert_status(&out, 0, "-e --from 1190 --commit-on-exit");
    assert_eq!(offsets(&out), (1190..1200).collect::<Vec<i64>>());
    assert_eq!(
        summary(&out),
        "kafka-lease tail: 10 records printed; reached the end of the partition \
         (offset 1200); committed offset 1200; lease released"
    );
    assert_eq!(
        kafka_committed(&services, &group, &topic, 0).map(|(o, _)| o),
        Some(1200)
    );

    // Starting at the end (the committed offset, an empty partition, latest): nothing to
    // wait for, so it ends at once.
    for (what, extra) in [
        ("committed at the end", vec!["--partition", "0"]),
        (
            "an empty partition",
            vec!["--partition", "1", "--from", "earliest"],
        ),
        ("latest", vec!["--partition", "0", "--from", "latest"]),
    ] {
        let mut args = extra.clone();
        args.extend(["-e", "--commit-on-exit"]);
        let (out, took) = run_tail(tail(&args)).await;
        assert_status(&out, 0, what);
        assert!(out.stdout.is_empty(), "{what}");
        let end = if extra[1] == "1" { 0 } else { 1200 };
        assert_eq!(
            summary(&out),
            format!(
                "kafka-lease tail: 0 records printed; reached the end of the partition \
                 (offset {end}); nothing to commit; lease released"
            ),
            "{what}"
        );
        assert!(took < Duration::from_secs(10), "{what}: took {took:?}");
    }

    // --max-records first: it stops there.
    let (out, _) = run_tail(tail(&[
        "--partition",
        "0",
        "--from",
        "earliest",
        "-e",
        "--max-records",
        "3",
    ]))
    .await;
    assert_status(&out, 0, "-e --max-records 3");
    assert_eq!(offsets(&out), [0, 1, 2]);
    assert_eq!(
        summary(&out),
        "kafka-lease tail: 3 records printed; lease released"
    );
    assert_nothing_held(&services, &client, &prefix, &group, "after the -e runs").await;
}

#[tokio::test]
async fn bad_flags_exit_64_with_one_line_naming_the_value() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let missing = dir.join("cli-tools-no-such-token");
    let missing = missing.to_str().expect("utf-8");
    let tail = |extra: &[&'static str]| {
        let mut args = vec!["tail", "--group", "g", "--topic", "t"];
        args.extend_from_slice(extra);
        args
    };
    let cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
        (
            vec!["leases", "--output", "yaml"],
            vec!["'yaml'", "table, json"],
        ),
        (
            vec!["leases", "--gateway", "127.0.0.1"],
            vec!["\"127.0.0.1\"", "no port", "host:port", "http://host:port"],
        ),
        (
            vec!["leases", "--gateway", "grpc://127.0.0.1:50051"],
            vec!["\"grpc://127.0.0.1:50051\"", "host:port"],
        ),
        (
            vec![
                "leases",
                "--gateway",
                "127.0.0.1:50051",
                "--cert",
                "c.pem",
                "--key",
                "k.pem",
            ],
            vec!["--cert means TLS", "--ca-cert"],
        ),
        (
            vec!["leases", "--gateway", "https://127.0.0.1:50051"],
            vec!["--ca-cert"],
        ),
        (
            vec!["leases", "--ca-cert", "ca.pem"],
            vec!["--ca-cert is for TLS", "http://127.0.0.1:50051"],
        ),
        (
            vec![
                "leases",
                "--gateway",
                "https://x:1",
                "--ca-cert",
                "c.pem",
                "--cert",
                "c.pem",
            ],
            vec!["--key"],
        ),
        (
            vec!["leases", "--token-file", missing],
            vec!["--token-file", missing],
        ),
        (
            vec!["leases", "--group", "a/b"],
            vec!["\"a/b\"", "[A-Za-z0-9._-]"],
        ),
        (vec!["tail", "--topic", "t"], vec!["--group"]),
        (
            tail(&["--from", "yesterday"]),
            vec!["\"yesterday\"", "earliest, latest, committed"],
        ),
        (
            tail(&["--max-records", "0"]),
            vec!["'0'", "--max-records", "1 or more"],
        ),
        (tail(&["--partition=-1"]), vec!["'-1'", "--partition"]),
        (tail(&["--format", "xml"]), vec!["'xml'", "text, json"]),
        (tail(&["--wait", "1h"]), vec!["1h", "5m"]),
        (tail(&["--no-such-flag"]), vec!["--no-such-flag"]),
    ];
    for (args, needles) in cases {
        let out = run(&args).await;
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: one line: {stderr}");
        let tool = args[0];
        assert!(
            stderr.starts_with(&format!("kafka-lease {tool}: ")),
            "{args:?}: {stderr}"
        );
        for needle in needles {
            assert!(stderr.contains(needle), "{args:?}: {needle:?} in {stderr}");
        }
        assert!(out.stdout.is_empty(), "{args:?}");
    }
    // From the environment too.
    let out = tool(&["leases"])
        .env("KAFKA_LEASE_GATEWAY", "nonsense")
        .output()
        .await
        .expect("run");
    assert_eq!(out.status.code(), Some(64));
    assert!(text(&out.stderr).contains("\"nonsense\""));
    // Help is not an error.
    let out = run(&["tail", "--help"]).await;
    assert_status(&out, 0, "tail --help");
    let help = text(&out.stdout);
    for needle in ["--commit-on-exit", "-e, --exit-at-end", "host:port"] {
        assert!(help.contains(needle), "{needle:?} in {help}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_errors_are_one_line_with_the_code_and_exit_non_zero() {
    // Nothing listens on port 1: UNAVAILABLE, 69, naming the address tried, however it was
    // written.
    for (gateway, tried) in [
        ("http://127.0.0.1:1", "http://127.0.0.1:1"),
        ("127.0.0.1:1", "http://127.0.0.1:1"),
        ("[::1]:1", "http://[::1]:1"),
    ] {
        let out = run(&["leases", "--gateway", gateway]).await;
        assert_status(&out, 69, gateway);
        let stderr = text(&out.stderr);
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            stderr.starts_with(&format!(
                "kafka-lease leases: UNAVAILABLE: cannot reach the gateway at {tried}: "
            )),
            "{gateway}: {stderr}"
        );
    }

    let services = kafka_lease_testkit::require_services!();
    let prefix = unique_prefix();
    let gateway = GatewayProcess::start(&services, &prefix, &unique_name("gw"), &[]).await;
    let endpoint = gateway.endpoint();
    let group = unique_name("errors");
    let out = run(&[
        "tail",
        "--gateway",
        &endpoint,
        "--group",
        &group,
        "--topic",
        "no-such-topic-x",
    ])
    .await;
    assert_status(&out, 1, "unknown topic");
    let stderr = text(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("kafka-lease tail: NOT_FOUND (TOPIC_NOT_FOUND): "),
        "{stderr}"
    );

    // A partition someone else holds: who holds it.
    let topic = create_topic(&services, 1).await;
    let client = gateway.client().await;
    let lease = client
        .acquire(AcquireOptions::new(&group, &topic).member("the-holder"))
        .await
        .expect("acquire");
    let out = run(&[
        "tail",
        "--gateway",
        &endpoint,
        "--group",
        &group,
        "--topic",
        &topic,
        "--partition",
        "0",
    ])
    .await;
    assert_status(&out, 1, "busy");
    let stderr = text(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("kafka-lease tail: RESOURCE_EXHAUSTED (PARTITION_BUSY): ")
            && stderr.contains("the-holder"),
        "{stderr}"
    );
    lease.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tools_speak_mutual_tls_and_send_a_token_from_a_file() {
    let services = kafka_lease_testkit::require_services!();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(unique_name("cli-tls"));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let topic = create_topic(&services, 1).await;
    produce_n(&producer(&services), &topic, 0, 2).await;
    let group = unique_name("tls");
    let ca = TestCa::new("kafka-lease cli test CA");
    let ca_file = ca.write(&dir, "ca");
    let gateway_cert = ca
        .server(&["gateway.kafka-lease", "127.0.0.1"])
        .write(&dir, "gateway");
    let reader = ca.client("cli-reader").write(&dir, "reader");
    let ops_token = "ops-token-3c9e0d41a7b25f68";
    let lister_token = "lister-token-77e1b0c9d2a4f315";
    std::fs::write(
        dir.join("tokens"),
        format!("ops {ops_token}\nlister {lister_token}\n"),
    )
    .expect("tokens");
    std::fs::write(dir.join("ops.token"), format!("{ops_token}\n")).expect("token file");
    std::fs::write(dir.join("lister.token"), lister_token).expect("token file");
    std::fs::write(
        dir.join("policy.toml"),
        format!(
            r#"[[allow]]
identities = ["cli-reader"]
groups = ["{group}"]
topics = ["{topic}"]
actions = ["acquire", "read", "seek", "commit", "release", "list"]

[[allow]]
identities = ["lister"]
groups = ["*"]
topics = ["*"]
actions = ["list"]
"#
        ),
    )
    .expect("policy");
    let path = |name: &str| dir.join(name).display().to_string();
    let prefix = unique_prefix();
    let args = [
        "--tls-cert".to_string(),
        gateway_cert.cert.display().to_string(),
        "--tls-key".into(),
        gateway_cert.key.display().to_string(),
        "--tls-client-ca".into(),
        ca_file.display().to_string(),
        "--auth-policy".into(),
        path("policy.toml"),
        "--auth-tokens-file".into(),
        path("tokens"),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let gateway = GatewayProcess::start(&services, &prefix, &unique_name("gw"), &args).await;
    let https = format!("https://{}", gateway.addr);
    let (ca_path, cert_path, key_path) = (
        ca_file.display().to_string(),
        reader.cert.display().to_string(),
        reader.key.display().to_string(),
    );
    let tls: [&str; 8] = [
        "--gateway",
        &https,
        "--ca-cert",
        &ca_path,
        "--cert",
        &cert_path,
        "--key",
        &key_path,
    ];

    // The reader's certificate: tail prints and releases.
    let mut tail_args = vec!["tail"];
    tail_args.extend(tls);
    tail_args.extend([
        "--group",
        &group,
        "--topic",
        &topic,
        "--from",
        "earliest",
        "--max-records",
        "2",
        "--member",
        "tls-reader",
    ]);
    let out = run(&tail_args).await;
    assert_status(&out, 0, "tail over mutual TLS");
    assert_eq!(text(&out.stdout).lines().count(), 2);

    // A token identity allowed to list sees a lease the reader holds.
    let mut holder_args = vec![];
    holder_args.extend(tls);
    holder_args.extend([
        "--group",
        &group,
        "--topic",
        &topic,
        "--member",
        "tls-holder",
    ]);
    let mut holder = Tail::spawn(&holder_args);
    holder.stderr_until("reading from offset").await;
    let lister_file = path("lister.token");
    let mut leases_args = vec!["leases"];
    leases_args.extend(tls);
    leases_args.extend(["--token-file", &lister_file, "--output", "json"]);
    let out = run(&leases_args).await;
    assert_status(&out, 0, "leases with a token");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(json.as_array().map(Vec::len), Some(1), "{json}");
    assert_eq!(json[0]["group"], group.as_str());
    assert_eq!(json[0]["member"], "tls-holder");
    for output in [&out.stdout, &out.stderr] {
        assert!(
            !text(output).contains(lister_token),
            "the token is never printed"
        );
    }
    // `host:port` with TLS flags is TLS too.
    let out = run(&[
        "leases",
        "--gateway",
        &gateway.addr,
        "--ca-cert",
        &ca_path,
        "--cert",
        &cert_path,
        "--key",
        &key_path,
        "--token-file",
        &lister_file,
    ])
    .await;
    assert_status(&out, 0, "leases over TLS to host:port");
    assert!(
        text(&out.stdout).contains("tls-holder"),
        "{}",
        text(&out.stdout)
    );
    holder.signal("INT");
    let (status, stderr) = holder.exit().await;
    assert_eq!(status, Some(130), "{stderr}");

    // A token identity without the grant: PERMISSION_DENIED, 77, and the token not shown.
    let out = tool(&tail_args)
        .env("KAFKA_LEASE_TOKEN_FILE", path("ops.token"))
        .output()
        .await
        .expect("run");
    assert_status(&out, 77, "tail as ops");
    let stderr = text(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("kafka-lease tail: PERMISSION_DENIED (ACTION_DENIED): "),
        "{stderr}"
    );
    assert!(!stderr.contains(ops_token), "{stderr}");
}

/// `kafka-lease topics` against the real broker: create (with partitions and a config), the
/// same again (exit 1, "already exists"; 0 with --if-not-exists), a replication factor the
/// one broker cannot place (exit 1, naming the broker count), a bad name (exit 64), list,
/// describe (partitions, offsets, the config set), delete, the same again (exit 1; 0 with
/// --if-exists), and a broker that cannot be reached (exit 69). The created topic is one a
/// gateway leases like any other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topics_are_created_listed_described_and_deleted_with_clear_errors() {
    let services = kafka_lease_testkit::require_services!();
    let kafka = services.kafka_bootstrap.clone();
    let topic = unique_name("cli-topic");
    let topics = |args: &[&str]| {
        let mut all = vec!["topics"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--kafka", &kafka]);
        all.iter().map(|s| s.to_string()).collect::<Vec<_>>()
    };
    let run_topics = |args: Vec<String>| async move {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run(&args).await
    };

    let out = run_topics(topics(&[
        "create",
        &topic,
        "--partitions",
        "3",
        "--config",
        "retention.ms=86400000",
    ]))
    .await;
    assert_status(&out, 0, "create");
    assert_eq!(
        text(&out.stdout),
        format!("created topic {topic:?}: 3 partitions, replication factor 1\n")
    );

    let out = run_topics(topics(&["create", &topic, "--partitions", "3"])).await;
    assert_status(&out, 1, "create again");
    assert_eq!(
        text(&out.stderr),
        format!("kafka-lease topics: topic {topic:?} already exists\n")
    );
    let out = run_topics(topics(&["create", &topic, "--if-not-exists"])).await;
    assert_status(&out, 0, "create --if-not-exists");

    let other = unique_name("cli-topic");
    let out = run_topics(topics(&["create", &other, "--replication-factor", "3"])).await;
    assert_status(&out, 1, "replication 3 on one broker");
    assert!(
        text(&out.stderr).contains("replication factor 3 is more than the cluster's 1 broker"),
        "{}",
        text(&out.stderr)
    );
    let out = run_topics(topics(&["create", "bad/name"])).await;
    assert_status(&out, 64, "an invalid name");
    assert!(
        text(&out.stderr).contains("bad/name"),
        "{}",
        text(&out.stderr)
    );
    let out = run_topics(topics(&["list"])).await;
    assert_status(&out, 0, "list");
    assert!(
        !text(&out.stdout).contains(&other),
        "a refused create makes nothing"
    );

    let out = run_topics(topics(&["list", "--output", "json"])).await;
    assert_status(&out, 0, "list --output json");
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let entry = listed
        .as_array()
        .expect("an array")
        .iter()
        .find(|t| t["topic"] == topic.as_str())
        .unwrap_or_else(|| panic!("{topic} listed: {listed}"));
    assert_eq!(entry["partitions"], 3);
    assert_eq!(entry["replication_factor"], 1);

    // Records in partition 1, then describe shows them and the config.
    produce_n(&producer(&services), &topic, 1, 4).await;
    let out = run_topics(topics(&["describe", &topic, "--output", "json"])).await;
    assert_status(&out, 0, "describe");
    let described: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(described["partitions"].as_array().map(Vec::len), Some(3));
    assert_eq!(described["partitions"][1]["high_watermark"], 4);
    assert_eq!(described["partitions"][1]["log_start_offset"], 0);
    assert_eq!(
        described["configs"]["retention.ms"],
        serde_json::json!({"value": "86400000", "source": "topic"})
    );
    let out = run_topics(topics(&["describe", &topic])).await;
    assert_status(&out, 0, "describe as a table");
    assert!(
        text(&out.stdout).contains("retention.ms") && text(&out.stdout).contains("HIGH WATERMARK"),
        "{}",
        text(&out.stdout)
    );

    let out = run_topics(topics(&["delete", &topic])).await;
    assert_status(&out, 0, "delete");
    assert_eq!(text(&out.stdout), format!("deleted topic {topic:?}\n"));
    let out = run_topics(topics(&["describe", &topic])).await;
    assert_status(&out, 1, "describe a deleted topic");
    assert!(
        text(&out.stderr).contains("does not exist"),
        "{}",
        text(&out.stderr)
    );
    let out = run_topics(topics(&["delete", &topic])).await;
    assert_status(&out, 1, "delete again");
    assert_eq!(
        text(&out.stderr),
        format!("kafka-lease topics: topic {topic:?} does not exist\n")
    );
    let out = run_topics(topics(&["delete", &topic, "--if-exists"])).await;
    assert_status(&out, 0, "delete --if-exists");

    // Nothing listens on port 1: unreachable, exit 69, the address named.
    let out = run(&[
        "topics",
        "list",
        "--kafka",
        "127.0.0.1:1",
        "--timeout",
        "2s",
    ])
    .await;
    assert_status(&out, 69, "an unreachable broker");
    assert!(
        text(&out.stderr).contains("cannot reach Kafka at 127.0.0.1:1"),
        "{}",
        text(&out.stderr)
    );
}

/// `scripts/services` as a new user moves a copy: one setting
/// (`KAFKA_LEASE_SERVICES_PORT_OFFSET`) starts a whole second copy on shifted ports in a run
/// folder of its own, its env file exports each port under the one name the script reads
/// (so a port exported by `env` moves the copy when given back) and the gateway's
/// `KAFKA_LEASE_KAFKA`; `create-topic` and `produce` fill it, and `kafka-lease topics` sees
/// the records; an old `KAFKA_LEASE_TEST_*` name is refused with its new name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_copy_of_the_services_moves_with_one_setting_and_takes_topics_and_records() {
    // The suite's copy may run or not: this test starts and stops one of its own, from the
    // installed downloads (`scripts/services paths` fails when they are missing).
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let script = repo.join("scripts/services");
    let installed = Command::new(&script)
        .arg("paths")
        .stdin(Stdio::null())
        .output()
        .await
        .is_ok_and(|out| out.status.success());
    if !installed {
        assert!(
            std::env::var_os("CI").is_none(),
            "the test services are not installed (scripts/services install)"
        );
        eprintln!("skipping: the test services are not installed; run scripts/services install");
        return;
    }
    let run_dir = repo.join(format!(".cache/run-test-{}", unique_name("copy")));
    // The first offset whose every port is free (a developer may run a copy at 300).
    let offset: u16 = (3..=9)
        .map(|hundreds| hundreds * 100)
        .find(|offset| {
            [19092_u16, 19093, 19094, 19096, 18500, 18300, 18301, 18302]
                .iter()
                .all(|port| std::net::TcpListener::bind(("127.0.0.1", port + offset)).is_ok())
        })
        .expect("a port offset from 300 to 900 with every port free");
    let services = |args: &[&str], stdin: Option<&str>| {
        let mut command = Command::new(&script);
        command
            .args(args)
            .env("KAFKA_LEASE_SERVICES_PORT_OFFSET", offset.to_string())
            .env("KAFKA_LEASE_SERVICES_RUN", &run_dir)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        for (key, _) in std::env::vars() {
            if key.starts_with("KAFKA_LEASE_") && key.ends_with("_PORT") {
                command.env_remove(key);
            }
        }
        let input = stdin.map(str::to_string);
        async move {
            let mut child = command.spawn().expect("run scripts/services");
            if let (Some(input), Some(mut pipe)) = (input, child.stdin.take()) {
                use tokio::io::AsyncWriteExt as _;
                pipe.write_all(input.as_bytes()).await.expect("stdin");
            }
            tokio::time::timeout(Duration::from_secs(180), child.wait_with_output())
                .await
                .expect("scripts/services within 3 minutes")
                .expect("scripts/services output")
        }
    };
    let up = services(&["up"], None).await;
    let stopped = async {
        let down = services(&["down"], None).await;
        let _ = std::fs::remove_dir_all(&run_dir);
        down
    };
    if !up.status.success() {
        let _ = stopped.await;
        panic!("up failed: {}{}", text(&up.stdout), text(&up.stderr));
    }
    let kafka_port = 19092 + offset;
    let env = text(&services(&["env"], None).await.stdout);
    let exported = |name: &str| {
        env.lines()
            .find_map(|l| l.strip_prefix(&format!("export {name}=")))
            .map(|v| v.trim_matches(['\'', '"']).to_string())
    };
    let result = async {
        assert_eq!(
            exported("KAFKA_LEASE_KAFKA_PORT"),
            Some(kafka_port.to_string()),
            "{env}"
        );
        assert_eq!(
            exported("KAFKA_LEASE_CONSUL_PORT"),
            Some((18500 + offset).to_string()),
            "{env}"
        );
        assert_eq!(
            exported("KAFKA_LEASE_KAFKA"),
            Some(format!("127.0.0.1:{kafka_port}")),
            "{env}"
        );
        let topic = unique_name("copy-topic");
        let created = services(&["create-topic", &topic, "2"], None).await;
        assert!(created.status.success(), "{}", text(&created.stderr));
        let produced = services(&["produce", &topic], Some("a\nb\nc\n")).await;
        assert!(produced.status.success(), "{}", text(&produced.stderr));
        assert!(
            text(&produced.stdout).contains("3 record(s) written")
                || text(&produced.stderr).contains("3 record(s) written"),
            "{}{}",
            text(&produced.stdout),
            text(&produced.stderr)
        );
        let kafka = format!("127.0.0.1:{kafka_port}");
        let out = run(&[
            "topics", "describe", &topic, "--output", "json", "--kafka", &kafka,
        ])
        .await;
        assert_status(&out, 0, "describe on the second copy");
        let described: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        let records: i64 = described["partitions"]
            .as_array()
            .expect("partitions")
            .iter()
            .map(|p| p["high_watermark"].as_i64().unwrap_or(0))
            .sum();
        assert_eq!(records, 3, "{described}");
        // An old name is refused, naming the new one.
        let mut old = Command::new(&script);
        old.arg("status")
            .env("KAFKA_LEASE_TEST_KAFKA_PORT", "29092")
            .stdin(Stdio::null());
        let old = old.output().await.expect("run scripts/services");
        assert_eq!(old.status.code(), Some(1));
        assert!(
            text(&old.stderr).contains("KAFKA_LEASE_KAFKA_PORT"),
            "{}",
            text(&old.stderr)
        );
    };
    let outcome = futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(result)).await;
    let down = stopped.await;
    assert!(down.status.success(), "down: {}", text(&down.stderr));
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}
