//! The binary as a person meets it: `--version`, bad configuration refused before anything
//! is bound, and `kafka-lease dev` serving its sample topic with nothing else installed.

use std::process::Stdio;
use std::time::Duration;

use kafka_lease_client::{AcquireOptions, Bytes, Client, ReadOptions, SeekTo};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_kafka-lease");

#[test]
fn version_names_the_version_and_the_git_revision() {
    let out = std::process::Command::new(BIN)
        .arg("--version")
        .output()
        .expect("run");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with(&format!("kafka-lease {}", env!("CARGO_PKG_VERSION"))),
        "{text}"
    );
    assert!(text.contains("(git "), "{text}");
}

#[test]
fn bad_configuration_exits_64_with_one_line_naming_the_value() {
    let cases: [(&[&str], &str); 6] = [
        (
            &["serve", "--kafka", "k:9092", "--session-ttl", "5s"],
            "--session-ttl 5s",
        ),
        (
            &["serve", "--kafka", "k:9092", "--lock-delay", "2m"],
            "--lock-delay 2m",
        ),
        (
            &["serve", "--kafka", "k:9092", "--consul", "localhost:8500"],
            "http://",
        ),
        (
            &["serve", "--kafka", "k:9092", "--consul-prefix", "a/../b"],
            "--consul-prefix",
        ),
        (&["serve", "--kafka", "nohostport"], "--kafka"),
        (
            &["serve", "--kafka", "k:9092", "--listen", "not-an-address"],
            "not-an-address",
        ),
    ];
    for (args, needle) in cases {
        let out = std::process::Command::new(BIN)
            .args(args)
            .env_remove("KAFKA_LEASE_LISTEN")
            .output()
            .expect("run");
        assert_eq!(out.status.code(), Some(64), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "nothing started: {args:?}");
    }
    // Environment variables are checked the same way.
    let out = std::process::Command::new(BIN)
        .args(["serve", "--kafka", "k:9092"])
        .env("KAFKA_LEASE_SESSION_TTL", "1s")
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--session-ttl 1s"));
}

#[test]
fn help_never_shows_the_values_of_secret_capable_variables() {
    let out = std::process::Command::new(BIN)
        .args(["serve", "--help"])
        .env("KAFKA_LEASE_KAFKA_OPTIONS", "sasl.password=Env-S3cr3t")
        .env("KAFKA_LEASE_CONSUL_TOKEN", "Token-S3cr3t")
        .output()
        .expect("run");
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(!help.contains("S3cr3t"), "{help}");
    for shown in [
        "--kafka-config <KEY=VALUE>",
        "--kafka-option",
        "KAFKA_LEASE_KAFKA_OPTIONS",
        "--kafka-config-file <PATH>",
        "KAFKA_LEASE_KAFKA_CONFIG_FILE",
    ] {
        assert!(help.contains(shown), "{shown}: {help}");
    }
}

#[test]
fn bad_kafka_configuration_exits_64_naming_the_place_but_no_value() {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let bad_line = dir.join("cli-bad-line.properties");
    std::fs::write(&bad_line, "# ok\nsasl.username=u\nFile-S3cr3t\n").expect("write");
    let reserved = dir.join("cli-reserved.properties");
    std::fs::write(&reserved, "group.id = File-S3cr3t\n").expect("write");
    let missing = dir.join("cli-missing.properties");
    let (bad_line, reserved, missing) = (
        bad_line.to_str().expect("utf-8"),
        reserved.to_str().expect("utf-8"),
        missing.to_str().expect("utf-8"),
    );
    let file_flag = "--kafka-config-file";
    let cases: [(&[&str], String); 5] = [
        (&[file_flag, bad_line], format!("{bad_line} line 3")),
        (
            &[file_flag, reserved],
            format!("{reserved} line 1 (group.id)"),
        ),
        (&[file_flag, missing], missing.to_string()),
        (
            &["--kafka-config", "sasl.password=Flag-S3cr3t,rest-S3cr3t"],
            "--kafka-config entry 2".to_string(),
        ),
        (
            &["--kafka-option", "bootstrap.servers=Flag-S3cr3t"],
            "--kafka-config bootstrap.servers".to_string(),
        ),
    ];
    for (args, needle) in cases {
        let out = std::process::Command::new(BIN)
            .args(["serve", "--kafka", "k:9092"])
            .args(args)
            .env_remove("KAFKA_LEASE_LISTEN")
            .output()
            .expect("run");
        assert_eq!(out.status.code(), Some(64), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(&needle), "{args:?}: {stderr}");
        assert!(!stderr.contains("S3cr3t"), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "nothing started: {args:?}");
    }
}

/// A `kafka-lease dev` process that listens: the process, its stdout (kept open for as long
/// as this lives), its address and the banner it printed before the listening line.
struct Dev {
    child: tokio::process::Child,
    _stdout: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    addr: String,
    banner: String,
}

/// Starts `command` (`kafka-lease dev` with the caller's arguments, environment and stderr)
/// and waits until it listens.
async fn start_dev(mut command: Command) -> Dev {
    let mut child = command
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn dev");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut banner = String::new();
    let addr = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await.expect("stdout") {
            if let Some(addr) = line.strip_prefix("kafka-lease listening on ") {
                return addr.to_string();
            }
            banner.push_str(&line);
            banner.push('\n');
        }
        panic!("dev exited early");
    })
    .await
    .expect("dev listens");
    Dev {
        child,
        _stdout: lines,
        addr,
        banner,
    }
}

#[tokio::test]
async fn dev_mode_serves_the_sample_topic_with_nothing_installed() {
    let Dev {
        mut child,
        addr,
        banner,
        _stdout,
    } = start_dev({
        let mut command = Command::new(BIN);
        command
            .args(["dev", "--listen", "127.0.0.1:0", "--sample-records", "12"])
            .stderr(Stdio::null());
        command
    })
    .await;
    assert!(
        banner.contains("grpcurl -plaintext"),
        "the banner shows grpcurl commands: {banner}"
    );

    let client = Client::connect(format!("http://{addr}"))
        .await
        .expect("connect");
    let mut seen_partitions = Vec::new();
    let mut leases = Vec::new();
    for _ in 0..4 {
        let lease = client
            .acquire(AcquireOptions::new("dev-test", "demo").member("test"))
            .await
            .expect("acquire");
        assert_eq!(lease.high_watermark(), 12);
        seen_partitions.push(lease.partition());
        leases.push(lease);
    }
    seen_partitions.sort_unstable();
    assert_eq!(
        seen_partitions,
        vec![0, 1, 2, 3],
        "the four partitions, once each"
    );
    let lease = leases.pop().expect("a lease");
    let partition = lease.partition();
    let mut stream = lease.records(ReadOptions::new()).await.expect("read");
    let mut records = Vec::new();
    while records.len() < 12 {
        let batch = tokio::time::timeout(Duration::from_secs(10), stream.next_batch())
            .await
            .expect("a batch")
            .expect("open")
            .expect("batch");
        records.extend(batch.records);
    }
    // Every shape a client must keep apart: null key, tombstone, empty value, a repeated
    // header and one without a value; one second apart in time.
    let bytes = |s: &Option<String>| s.clone().map(Bytes::from);
    for (i, record) in records.iter().enumerate() {
        let sample = kafka_lease_server::dev::sample(partition, i as u32);
        assert_eq!(record.offset, i as i64);
        assert_eq!(record.key, bytes(&sample.key), "key of {i}");
        assert_eq!(record.value, bytes(&sample.value), "value of {i}");
        let headers: Vec<(String, Option<Bytes>)> = sample
            .headers
            .iter()
            .map(|(k, v)| (k.clone(), bytes(v)))
            .collect();
        assert_eq!(record.headers, headers, "headers of {i}");
    }
    assert_eq!(records[3].key, None);
    assert_eq!(records[5].value, None);
    assert_eq!(records[7].value, Some(Bytes::new()));
    assert_eq!(
        records[6]
            .timestamp
            .duration_since(records[5].timestamp)
            .ok(),
        Some(Duration::from_secs(1))
    );
    // Seek by timestamp resolves as on a real broker: the first record at or after it.
    let half_second = Duration::from_millis(500);
    let to_seven = lease
        .seek(SeekTo::Timestamp(records[6].timestamp + half_second))
        .await
        .expect("seek by time");
    assert_eq!(to_seven.offset, 7);
    let exact = lease
        .seek(SeekTo::Timestamp(records[4].timestamp))
        .await
        .expect("seek by time");
    assert_eq!(exact.offset, 4);
    let after_all = lease
        .seek(SeekTo::Timestamp(records[11].timestamp + half_second))
        .await
        .expect("seek by time");
    assert_eq!(after_all.offset, 12, "none at or after: the high watermark");
    lease.release_with_commit(12).await.expect("release");
    let again = client
        .acquire(AcquireOptions::new("dev-test", "demo").wait(Duration::from_secs(5)))
        .await
        .expect("the released partition");
    assert_eq!(again.offset(), 12, "resumes at the commit");
    child.kill().await.expect("stop dev");
}

#[tokio::test]
async fn json_logs_carry_the_lease_span_fields() {
    let log_path = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dev-json.log");
    let log = std::fs::File::create(&log_path).expect("log file");
    let Dev {
        mut child,
        addr,
        banner: _,
        _stdout,
    } = start_dev({
        let mut command = Command::new(BIN);
        command
            .args(["dev", "--listen", "127.0.0.1:0", "--log-format", "json"])
            .stderr(Stdio::from(log));
        command
    })
    .await;
    let client = Client::connect(format!("http://{addr}"))
        .await
        .expect("connect");
    let lease = client
        .acquire(
            AcquireOptions::new("json-logs", "demo")
                .partition(2)
                .member("logger"),
        )
        .await
        .expect("acquire");
    let token = lease.fencing_token();
    lease.release().await.expect("release");
    let granted =
        kafka_lease_testkit::wait_for("the lease's log lines", Duration::from_secs(10), || {
            let text = std::fs::read_to_string(&log_path).unwrap_or_default();
            let found = text
                .lines()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .find(|v| v["message"] == "lease granted");
            async move { found }
        })
        .await;
    let span = &granted["span"];
    assert_eq!(span["name"], "lease", "{granted}");
    assert_eq!(span["group"], "json-logs");
    assert_eq!(span["topic"], "demo");
    assert_eq!(span["partition"], 2);
    assert_eq!(span["token"], token);
    child.kill().await.expect("stop dev");
}

/// The lines of `text` at ERROR level, in the pretty format (`<time> ERROR <target>: ...`).
fn error_lines(text: &str) -> Vec<&str> {
    text.lines()
        .filter(|line| line.split_whitespace().nth(1) == Some("ERROR"))
        .collect()
}

#[tokio::test]
async fn serve_with_consul_down_says_so_once_with_the_address_and_what_to_do() {
    // A loopback port where nothing listens.
    let consul = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        format!("http://{}", listener.local_addr().expect("addr"))
    };
    let started = tokio::time::Instant::now();
    let out = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--kafka", "127.0.0.1:9"])
        .args(["--consul", &consul])
        .env_remove("KAFKA_LEASE_LISTEN")
        .env_remove("RUST_LOG")
        .env_remove("KAFKA_LEASE_LOG")
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(30), out)
        .await
        .expect("serve gives up within 30 s")
        .expect("run serve");
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stderr}");
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(10), "{stderr}");
    let errors = error_lines(&stderr);
    assert_eq!(errors.len(), 1, "one ERROR line: {stderr}");
    let line = errors[0];
    for needle in [
        consul.as_str(),
        "Connection refused",
        "--consul",
        "kafka-lease dev",
    ] {
        assert!(line.contains(needle), "{needle:?} in {line}");
    }
    for line in stderr.lines() {
        assert!(
            line.matches("Connection refused").count() <= 1,
            "the cause once: {line}"
        );
    }
    // Nothing repeats the error in another form after it.
    assert!(
        !stderr.lines().any(|l| l.starts_with("kafka-lease: ")),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_stops_dev_quietly_after_a_session_of_many_groups() {
    let log_path = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dev-ctrl-c.log");
    let log = std::fs::File::create(&log_path).expect("log file");
    let Dev {
        mut child,
        addr,
        banner: _,
        _stdout,
    } = start_dev({
        let mut command = Command::new(BIN);
        command
            .args(["dev", "--listen", "127.0.0.1:0"])
            .env_remove("RUST_LOG")
            .env_remove("KAFKA_LEASE_LOG")
            .stderr(Stdio::from(log));
        command
    })
    .await;
    let client = Client::connect(format!("http://{addr}"))
        .await
        .expect("connect");
    // A session of 20 groups: some leases released, some still held (one with its Read
    // open) when Ctrl-C comes.
    let mut held = Vec::new();
    let mut reads = Vec::new();
    for i in 0..20 {
        let lease = client
            .acquire(AcquireOptions::new(format!("ctrl-c-{i}"), "demo").member("test"))
            .await
            .expect("acquire");
        let mut stream = lease.records(ReadOptions::new()).await.expect("read");
        let batch = tokio::time::timeout(Duration::from_secs(10), stream.next_batch())
            .await
            .expect("a batch")
            .expect("open")
            .expect("batch");
        assert!(!batch.records.is_empty());
        if i % 2 == 0 {
            lease.release().await.expect("release");
        } else {
            held.push(lease);
            reads.push(stream);
        }
    }
    let pid = child.id().expect("dev runs").to_string();
    let status = std::process::Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .expect("kill -INT");
    assert!(status.success());
    let exit = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("dev exits within 30 s of SIGINT")
        .expect("wait");
    drop((held, reads));
    let text = std::fs::read_to_string(&log_path).expect("log");
    assert!(exit.success(), "{exit:?}: {text}");
    let shutdown = text
        .find("SIGINT received")
        .expect("the log says SIGINT came");
    assert!(text.contains("shutdown complete"), "{text}");
    let after = error_lines(&text[shutdown..]);
    assert!(
        after.is_empty(),
        "{} ERROR lines after SIGINT:\n{}",
        after.len(),
        after.join("\n")
    );
    assert!(error_lines(&text).is_empty(), "{text}");
}

#[tokio::test]
async fn serve_with_kafka_down_says_so_without_repeating_itself() {
    let Some(services) = kafka_lease_testkit::Services::require(
        "serve_with_kafka_down_says_so_without_repeating_itself",
    ) else {
        return;
    };
    // A loopback port where nothing listens.
    let kafka = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("addr").to_string()
    };
    let instance = kafka_lease_testkit::unique_name("gw-no-kafka");
    let prefix = format!("kafka-lease-test/{}", kafka_lease_testkit::unique_name("p"));
    let gateway = kafka_lease_testkit::GatewayProcess::spawn(
        std::path::Path::new(BIN),
        &[
            "--kafka",
            &kafka,
            "--consul",
            &services.consul_http_addr,
            "--consul-prefix",
            &prefix,
            "--log",
            "info",
        ],
        &instance,
        std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{instance}.log")),
    )
    .await
    .expect("serve starts with Kafka down");
    // The gateway stays up, NOT_SERVING, while Kafka cannot be reached; a few seconds of that.
    kafka_lease_testkit::wait_for(
        "health to say Kafka is unreachable",
        Duration::from_secs(20),
        || {
            let seen = gateway
                .log()
                .contains("health: NOT_SERVING, Kafka unreachable")
                .then_some(());
            async move { seen }
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let log = gateway.log();
    gateway.stop(Duration::from_secs(10)).await;
    let errors = error_lines(&log);
    assert!(
        !errors.is_empty(),
        "librdkafka's report of the failure: {log}"
    );
    assert!(
        errors
            .iter()
            .any(|l| l.contains(&kafka) && l.contains("Connection refused")),
        "{log}"
    );
    // Each said once, not at each poll of each client (twenty a second before).
    assert!(
        errors.len() <= 4,
        "{} ERROR lines:\n{}",
        errors.len(),
        errors.join("\n")
    );
}
