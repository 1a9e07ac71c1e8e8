//! The clients of other languages (clients/<language>) against a real gateway on the real
//! services: each language's own test suite, given a gateway and records of every shape a
//! client must keep apart (null and empty keys and values, tombstones, non-UTF-8 bytes,
//! duplicate and null headers, timestamps), and each language's example run to completion
//! as a user would run it: it consumes a topic as a group, is sent SIGTERM, and must have
//! committed what it processed, released its partitions and left the group.
//!
//! The contract with a language's folder:
//! - `test.sh` installs what it needs (cached under `.cache/clients/<language>`), builds, and
//!   runs the language's tests against `KAFKA_LEASE_ADDR` with the records described by the
//!   JSON file `KAFKA_LEASE_FIXTURE` (see [`Fixture`]); exit 0 when they pass. Each suite has
//!   a test of one channel at the scale the gateway allows (issue 31): many leases, each with
//!   a Read open, plus many Acquires waiting, and short calls on the same channel answering
//!   at once; the fixture gives it a topic of [`SCALE_PARTITIONS`] partitions (deleted when
//!   the suite ends) and the gateway's metrics endpoint. Its `queue` entry is a topic for
//!   queue mode (issue 28): keyed records, one `poison` value, and a dead letter topic.
//! - `example.sh` runs the example with `KAFKA_LEASE_ADDR`, `KAFKA_LEASE_GROUP`,
//!   `KAFKA_LEASE_TOPIC` and `KAFKA_LEASE_DEAD_LETTER_TOPIC` (its queue-mode consumer's dead
//!   letter topic): it prints `processed <topic> <partition> <offset>` per record it
//!   processed, and on SIGTERM ends cleanly with exit 0, its progress committed.

#![allow(clippy::unwrap_used)]

mod support;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use kafka_lease_client::LeaseFilter;
use kafka_lease_testkit::{is_ci, repo_root, unique_name, wait_for, Services};
use support::{create_topic, kafka_committed, produce, produce_n, producer, unique_prefix};
use support::{GatewayProcess, TestRecord};
use tokio::io::AsyncBufReadExt;

/// How long one language's whole suite may take (a cold toolchain download included).
const SUITE_DEADLINE: Duration = Duration::from_secs(20 * 60);
/// How long the example may take to process its records, and to end after SIGTERM.
const EXAMPLE_DEADLINE: Duration = Duration::from_secs(5 * 60);
const EXIT_DEADLINE: Duration = Duration::from_secs(20);

/// Partitions of the fixture's scale topic, one record (offset 0) in each: the largest topic
/// the one-channel tests lease (4 groups x 250 = the gateway's 1,000 leases per connection,
/// `--max-leases-per-connection`, as tests/long_calls.rs).
const SCALE_PARTITIONS: i32 = 250;

/// Records of the fixture's queue topic (partition 0, keys `k<i % 4>`, values `v<i>`), and
/// the offset whose value is `poison` instead.
const QUEUE_RECORDS: usize = 40;
const QUEUE_POISON: usize = 13;

/// The records every language checks, and where they are.
struct Fixture {
    json: serde_json::Value,
    /// The scale topic, to delete once the suite is done with it.
    scale_topic: String,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Partition 0: ten records of every shape; partition 1: five plain ones. Timestamps are
/// set by the producer (CreateTime), one second apart, starting a minute ago: older ones
/// would be deleted by the broker's time-based retention (7 days) within minutes.
fn fixture_records() -> Vec<(i32, TestRecord)> {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let base = now_ms / 1000 * 1000 - 60_000;
    let rec = |key: Option<&[u8]>, value: Option<&[u8]>, headers: Vec<(&str, Option<&[u8]>)>| {
        TestRecord {
            key: key.map(<[u8]>::to_vec),
            value: value.map(<[u8]>::to_vec),
            headers: headers
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.map(<[u8]>::to_vec)))
                .collect(),
            timestamp_ms: None,
        }
    };
    let mut p0 = vec![
        rec(Some(b"k0"), Some(b"hello"), vec![]),
        rec(None, Some(b"no key"), vec![]),
        rec(Some(b""), Some(b""), vec![]),
        rec(Some(b"tomb"), None, vec![]),
        rec(Some(&[0x00, 0xff, 0xfe]), Some(&[0x80, 0x81, 0x00]), vec![]),
        rec(
            Some(b"h"),
            Some(b"headers"),
            vec![
                ("dup", Some(b"a")),
                ("dup", Some(b"b")),
                ("null", None),
                ("empty", Some(b"")),
            ],
        ),
    ];
    for i in 6..10 {
        let (k, v) = (format!("k{i}"), format!("v{i}"));
        p0.push(rec(Some(k.as_bytes()), Some(v.as_bytes()), vec![]));
    }
    let p1 = (0..5).map(|i| {
        let v = format!("p1-v{i}");
        rec(None, Some(v.as_bytes()), vec![])
    });
    p0.into_iter()
        .map(|r| (0, r))
        .chain(p1.map(|r| (1, r)))
        .enumerate()
        .map(|(i, (p, mut r))| {
            r.timestamp_ms = Some(base + 1000 * i as i64);
            (p, r)
        })
        .collect()
}

impl Fixture {
    /// The fixture for a suite against `gateway`, whose metrics the one-channel tests read
    /// (`kafka_lease_acquires_waiting`, to know that their Acquires wait at the gateway).
    async fn produce(services: &Services, gateway: &GatewayProcess) -> Fixture {
        let topic = create_topic(services, 2).await;
        let producer = producer(services);
        let mut records = Vec::new();
        for (partition, record) in fixture_records() {
            let offsets =
                produce(&producer, &topic, partition, std::slice::from_ref(&record)).await;
            let header = |(k, v): &(String, Option<Vec<u8>>)| serde_json::json!({"key": k, "value_hex": v.as_deref().map(hex)});
            records.push(serde_json::json!({
                "partition": partition,
                "offset": offsets[0],
                "key_hex": record.key.as_deref().map(hex),
                "value_hex": record.value.as_deref().map(hex),
                "headers": record.headers.iter().map(header).collect::<Vec<_>>(),
                "timestamp_ms": record.timestamp_ms,
            }));
        }
        // Queue mode's topic: keyed records, one of them a poison value the suites' handlers
        // fail on, and a dead letter topic for it.
        let queue_topic = create_topic(services, 1).await;
        let queue_records: Vec<TestRecord> = (0..QUEUE_RECORDS)
            .map(|i| TestRecord {
                key: Some(format!("k{}", i % 4).into_bytes()),
                value: Some(if i == QUEUE_POISON {
                    b"poison".to_vec()
                } else {
                    format!("v{i}").into_bytes()
                }),
                ..TestRecord::default()
            })
            .collect();
        produce(&producer, &queue_topic, 0, &queue_records).await;
        let dead_letter_topic = create_topic(services, 1).await;
        let scale_topic = create_topic(services, SCALE_PARTITIONS).await;
        futures::future::join_all(
            (0..SCALE_PARTITIONS).map(|p| produce_n(&producer, &scale_topic, p, 1)),
        )
        .await;
        Fixture {
            json: serde_json::json!({
                "group": unique_name("clients"),
                "topic": topic,
                "partitions": 2,
                "missing_topic": unique_name("no-such-topic"),
                "records": records,
                "scale": {"topic": scale_topic, "partitions": SCALE_PARTITIONS},
                "queue": {
                    "topic": queue_topic,
                    "dead_letter_topic": dead_letter_topic,
                    "records": QUEUE_RECORDS,
                    "keys": 4,
                    "poison_offset": QUEUE_POISON,
                },
                "metrics_url": gateway.metrics_endpoint(),
            }),
            scale_topic,
        }
    }

    /// Deletes the scale topic: the test broker's heap is small, and its partitions many.
    async fn delete_scale_topic(&self, services: &Services) {
        if let Err(e) =
            kafka_lease_testkit::delete_topics(&services.kafka_bootstrap, &[&self.scale_topic])
                .await
        {
            eprintln!("could not delete the scale topic {}: {e}", self.scale_topic);
        }
    }

    fn write(&self, language: &str) -> PathBuf {
        let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("{language}-fixture-{}.json", unique_name("f")));
        std::fs::write(&path, serde_json::to_vec_pretty(&self.json).unwrap()).unwrap();
        path
    }
}

/// Lines of the end of the gateway's log a failed suite prints (after all its warnings).
const GATEWAY_LOG_TAIL: usize = 200;

/// What every gateway of these tests is started with.
///
/// A liveness check's TTL of 5 s, not the default 1 s: the four suites run at once, each
/// against a gateway of its own (a debug build), beside their toolchains' runtimes, Kafka and
/// Consul, and on two cores a gateway's runtime has been seen to get no turn for 1.4 s (the
/// JVMs and Consul ran meanwhile; the gateway used a tenth of a core). The agent then ends its
/// session, and every lease of the suite ends with it. These suites test the clients, not how
/// fast a silent gateway's partitions move: tests/failover.rs does that, with the default.
const GATEWAY_ARGS: &[&str] = &[
    "--metrics-listen",
    "127.0.0.1:0",
    "--consul-check-ttl",
    "5s",
];

/// The language's folder, when its scripts and toolchain are there; `None` (skip, with a
/// message) when the toolchain is missing outside CI; under CI a missing one fails.
fn language_dir(language: &str, toolchain: &str) -> Option<PathBuf> {
    let dir = repo_root().join("clients").join(language);
    assert!(
        dir.join("test.sh").is_file() && dir.join("example.sh").is_file(),
        "{} has no test.sh and example.sh",
        dir.display()
    );
    let found = std::process::Command::new("sh")
        .args(["-c", &format!("command -v {toolchain}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        assert!(
            !is_ci(),
            "the {language} client's tests need `{toolchain}` on PATH, and CI=true"
        );
        eprintln!("SKIP {language} client: `{toolchain}` is not on PATH; install it to run these");
        return None;
    }
    Some(dir)
}

/// Runs the language's test suite against a gateway with the fixture records.
async fn run_suite(services: &Services, gateway: &GatewayProcess, language: &str, dir: &PathBuf) {
    let records = Fixture::produce(services, gateway).await;
    let fixture = records.write(language);
    println!(
        "[{language}] test.sh against {} ({})",
        gateway.addr,
        fixture.display()
    );
    let started = tokio::time::Instant::now();
    let mut child = tokio::process::Command::new("bash")
        .arg(dir.join("test.sh"))
        .current_dir(dir)
        .env("KAFKA_LEASE_ADDR", &gateway.addr)
        .env("KAFKA_LEASE_FIXTURE", &fixture)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("test.sh");
    let status = tokio::time::timeout(SUITE_DEADLINE, child.wait()).await;
    if status.is_err() {
        let _ = child.kill().await;
    }
    records.delete_scale_topic(services).await;
    let status = status
        .unwrap_or_else(|_| panic!("the {language} suite ran past {SUITE_DEADLINE:?}"))
        .expect("test.sh status");
    if !status.success() {
        // What the gateway saw: a failure under load is otherwise lost with the process.
        let log = gateway.log();
        let lines: Vec<&str> = log.lines().collect();
        let warnings: Vec<&str> = lines
            .iter()
            .copied()
            .filter(|l| l.contains("WARN") || l.contains("ERROR"))
            .collect();
        let tail = &lines[lines.len().saturating_sub(GATEWAY_LOG_TAIL)..];
        println!(
            "[{language}] the gateway's warnings and errors ({}):\n{}\n[{language}] its last {} lines:\n{}",
            warnings.len(),
            warnings.join("\n"),
            tail.len(),
            tail.join("\n")
        );
    }
    assert!(
        status.success(),
        "the {language} client's tests failed: {status}"
    );
    println!("[{language}] test.sh passed in {:?}", started.elapsed());
}

/// Runs the language's example on a topic of 3 partitions of 20 records each, sends it
/// SIGTERM once it processed them all, and checks what it left: offsets committed at the
/// end of each partition, no lease held, no member left.
async fn run_example(services: &Services, gateway: &GatewayProcess, language: &str, dir: &PathBuf) {
    let topic = create_topic(services, 3).await;
    let producer = producer(services);
    for p in 0..3 {
        produce_n(&producer, &topic, p, 20).await;
    }
    let group = unique_name("example");
    // The examples consume in queue mode, which needs a dead letter topic that exists.
    let dead_letters = create_topic(services, 1).await;
    let mut child = tokio::process::Command::new("bash")
        .arg(dir.join("example.sh"))
        .current_dir(dir)
        .env("KAFKA_LEASE_ADDR", &gateway.addr)
        .env("KAFKA_LEASE_GROUP", &group)
        .env("KAFKA_LEASE_TOPIC", &topic)
        .env("KAFKA_LEASE_DEAD_LETTER_TOPIC", &dead_letters)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("example.sh");
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut processed: BTreeMap<i32, Vec<i64>> = BTreeMap::new();
    let all = tokio::time::timeout(EXAMPLE_DEADLINE, async {
        while processed.values().map(Vec::len).sum::<usize>() < 60 {
            let Ok(Some(line)) = lines.next_line().await else {
                return false;
            };
            let words: Vec<&str> = line.split_whitespace().collect();
            if words.first() != Some(&"processed") {
                println!("[{language} example] {line}");
            }
            if let ["processed", t, p, o] = words.as_slice() {
                assert_eq!(*t, topic, "{line}");
                processed
                    .entry(p.parse().unwrap())
                    .or_default()
                    .push(o.parse().unwrap());
            }
        }
        true
    })
    .await;
    assert_eq!(
        all,
        Ok(true),
        "the {language} example processed {processed:?}"
    );
    // Every record once. The examples run in queue mode (PARTITION order) and print a record
    // once its accept is applied, from the thread that sent it: two answers of a partition
    // can be on their way at once (the next record goes out as soon as the gateway applies
    // the accept, before the client has read that Acknowledge's response), so the lines'
    // order is the threads', not the partition's. tests/queue_mode.rs checks the order
    // itself.
    for (p, offsets) in &processed {
        let mut sorted = offsets.clone();
        sorted.sort_unstable();
        assert_eq!(
            sorted,
            (0..20).collect::<Vec<i64>>(),
            "partition {p}, every record once: {offsets:?}"
        );
    }
    // SIGTERM, as Kubernetes stops a pod: it ends cleanly.
    let pid = child.id().unwrap();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let name = language.to_string();
    let drain = tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            println!("[{name} example] {line}");
        }
    });
    let status = tokio::time::timeout(EXIT_DEADLINE, child.wait())
        .await
        .unwrap_or_else(|_| {
            panic!("the {language} example did not end within {EXIT_DEADLINE:?} of SIGTERM")
        })
        .unwrap();
    let _ = drain.await;
    assert!(
        status.success(),
        "the {language} example ended with {status}"
    );
    // What it processed is committed, and it holds nothing. In queue mode the gateway
    // commits, last when the member's leases are released as it leaves: within moments of
    // the exit, not necessarily before it.
    for p in 0..3 {
        let committed = wait_for("the example's commits", Duration::from_secs(15), || async {
            kafka_committed(services, &group, &topic, p)
                .map(|(offset, _)| offset)
                .filter(|offset| *offset == 20)
        })
        .await;
        assert_eq!(committed, 20, "partition {p}'s committed offset");
    }
    let client = gateway.client().await;
    wait_for(
        "the example's leases to be released",
        Duration::from_secs(30),
        || async {
            let leases = client
                .list_leases(LeaseFilter::new().group(&group))
                .await
                .ok()?;
            let members = client.list_members(&group, None).await.ok()?;
            (leases.is_empty() && members.is_empty()).then_some(())
        },
    )
    .await;
    println!("[{language}] example: 60 records processed and committed, SIGTERM, clean exit, nothing held");
}

/// One language's suite at a time: each holds a gateway with 1,000 leases and 500 waiting
/// Acquires (its one-channel test) beside a runtime of its own, and four of them at once on
/// the test machine's two cores starved the gateways' and the agent's timers past the
/// fence window (a gateway self-fenced, as it must when it cannot renew in time).
static ONE_SUITE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn client_language(language: &str, toolchain: &str) {
    let Some(services) = Services::require(&format!("{language}_client")) else {
        return;
    };
    let _turn = ONE_SUITE_AT_A_TIME.lock().await;
    let Some(dir) = language_dir(language, toolchain) else {
        return;
    };
    let gateway = GatewayProcess::start(
        &services,
        &unique_prefix(),
        &unique_name(language),
        GATEWAY_ARGS,
    )
    .await;
    run_suite(&services, &gateway, language, &dir).await;
    run_example(&services, &gateway, language, &dir).await;
}

/// For working on a client: a gateway and a fixture, kept up for four hours, their settings in
/// `target/tmp/client-dev.env` (`cargo test --test clients -- --ignored --nocapture
/// serve_for_client_development`). Its scale topic ([`SCALE_PARTITIONS`] partitions) is left
/// behind when it is killed: delete it (its name is in the fixture) when done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a development aid: serves until killed"]
async fn serve_for_client_development() {
    let services = kafka_lease_testkit::require_services!();
    let gateway = GatewayProcess::start(
        &services,
        &unique_prefix(),
        &unique_name("dev"),
        GATEWAY_ARGS,
    )
    .await;
    let fixture = Fixture::produce(&services, &gateway).await.write("dev");
    let env = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("client-dev.env");
    std::fs::write(
        &env,
        format!(
            "export KAFKA_LEASE_ADDR={}\nexport KAFKA_LEASE_FIXTURE={}\nexport KAFKA_BOOTSTRAP_SERVERS={}\n",
            gateway.addr,
            fixture.display(),
            services.kafka_bootstrap
        ),
    )
    .unwrap();
    println!(
        "gateway {} with fixture {}; settings in {}",
        gateway.addr,
        fixture.display(),
        env.display()
    );
    tokio::time::sleep(Duration::from_secs(4 * 3600)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_client() {
    client_language("go", "go").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client() {
    client_language("python", "python3").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn java_client() {
    client_language("java", "mvn").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_client() {
    client_language("node", "node").await;
}
