//! Kafka credentials end to end: a gateway on the test broker's SASL_PLAINTEXT listener,
//! authenticating with SCRAM-SHA-256 (mechanism and user by `--kafka-config`, the password
//! from `--kafka-config-file`), leases a partition, reads it and commits; a gateway given a
//! wrong password fails visibly. Neither ever prints a password, and the startup log names
//! the properties set with secret values as `***`.
//!
//! The listener and its SCRAM user are set up by `scripts/services up` (fixed test
//! credentials, in the services env file as `KAFKA_LEASE_KAFKA_SASL_*`).

mod support;

use std::path::PathBuf;
use std::time::Duration;

use kafka_lease_client::{AcquireOptions, Error, ReadOptions, Reason};
use kafka_lease_testkit::{unique_name, wait_for, KafkaSasl, Services};
use support::{
    create_topic, kafka_committed, produce_n, producer, unique_prefix, wait_health, GatewayProcess,
};
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::HealthCheckRequest;

const DEADLINE: Duration = Duration::from_secs(30);

/// A properties file holding `password` (with comments and spaces around the `=`, as an
/// operator writes one), in the test target's temporary folder.
fn password_file(name: &str, password: &str) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}.properties"));
    let text = format!(
        "# The gateway's Kafka password (tests/kafka_sasl.rs).\n\
         ! Readable by the gateway alone in a real deployment.\n\
         \n\
         sasl.password = {password}\n"
    );
    std::fs::write(&path, text).expect("write the properties file");
    path
}

/// The gateway's arguments for the SASL listener: mechanism and user as flags, the password
/// in `file`.
fn sasl_args(sasl: &KafkaSasl, file: &str) -> Vec<String> {
    [
        "--kafka",
        &sasl.bootstrap,
        "--kafka-config",
        "security.protocol=sasl_plaintext",
        "--kafka-config",
        &format!("sasl.mechanism={}", sasl.mechanism),
        "--kafka-config",
        &format!("sasl.username={}", sasl.username),
        "--kafka-config-file",
        file,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// Stops the gateway (SIGTERM, waiting for its exit so the log is complete) and returns what
/// it wrote to stderr (its log) and to stdout.
async fn stop(mut gateway: GatewayProcess) -> (String, String) {
    gateway.signal("TERM");
    gateway.wait_exit(DEADLINE).await;
    (gateway.log(), gateway.stdout())
}

fn assert_never_shown(what: &str, output: &str, secrets: &[&str]) {
    for secret in secrets {
        assert!(
            !output.contains(secret),
            "the gateway's {what} shows a password ({secret:?}):\n{output}"
        );
    }
}

#[tokio::test]
async fn a_gateway_with_scram_credentials_leases_reads_and_commits() {
    let test = "a_gateway_with_scram_credentials_leases_reads_and_commits";
    let Some((services, sasl)) = Services::require_kafka_sasl(test) else {
        return;
    };
    // Topic and records through the plaintext listener; the gateway reads through SASL.
    let topic = create_topic(&services, 2).await;
    produce_n(&producer(&services), &topic, 1, 10).await;

    let file = password_file(&unique_name("sasl-right"), &sasl.password);
    let args = sasl_args(&sasl, file.to_str().expect("utf-8 path"));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let gateway =
        GatewayProcess::start(&services, &unique_prefix(), &unique_name("gw-sasl"), &args).await;
    let health = gateway.health().await;
    wait_health(&health, "", ServingStatus::Serving, DEADLINE).await;

    let group = unique_name("g-sasl");
    let client = gateway.client().await;
    let lease = client
        .acquire(
            AcquireOptions::new(&group, &topic)
                .partition(1)
                .member("sasl"),
        )
        .await
        .expect("acquire over SASL/SCRAM");
    assert_eq!(lease.offset(), 0);
    assert_eq!(lease.high_watermark(), 10);
    let mut stream = lease
        .records(ReadOptions::new().max_records(4))
        .await
        .expect("read");
    let mut values = Vec::new();
    while values.len() < 10 {
        let batch = tokio::time::timeout(DEADLINE, stream.next_batch())
            .await
            .expect("a batch within the deadline")
            .expect("stream open")
            .expect("batch");
        values.extend(batch.records.into_iter().map(|r| {
            (
                r.offset,
                String::from_utf8(r.value.unwrap_or_default().to_vec()).expect("utf-8"),
            )
        }));
    }
    let want: Vec<(i64, String)> = (0..10).map(|i| (i, format!("v{i}"))).collect();
    assert_eq!(values, want);
    drop(stream);
    lease.commit(10).await.expect("commit over SASL/SCRAM");
    let committed = kafka_committed(&services, &group, &topic, 1);
    assert_eq!(
        committed.map(|(offset, _)| offset),
        Some(10),
        "the commit is in Kafka"
    );
    lease.release().await.expect("release");

    let (log, stdout) = stop(gateway).await;
    // The startup log names every property set, the secret one masked.
    let startup = log
        .lines()
        .find(|l| l.contains("Kafka client properties"))
        .unwrap_or_else(|| panic!("no startup line naming the Kafka properties:\n{log}"));
    println!("startup line: {startup}");
    assert!(startup.contains("sasl.password=***"), "{startup}");
    assert!(
        startup.contains(&format!("sasl.username={}", sasl.username))
            && startup.contains("security.protocol=sasl_plaintext"),
        "{startup}"
    );
    assert!(
        startup.contains(file.to_str().expect("utf-8 path")),
        "{startup}"
    );
    assert_never_shown("log", &log, &[&sasl.password]);
    assert_never_shown("stdout", &stdout, &[&sasl.password]);
}

#[tokio::test]
async fn a_gateway_with_a_wrong_password_fails_visibly_without_showing_it() {
    let test = "a_gateway_with_a_wrong_password_fails_visibly_without_showing_it";
    let Some((services, sasl)) = Services::require_kafka_sasl(test) else {
        return;
    };
    let topic = create_topic(&services, 1).await;
    let wrong = format!("wrong-{}", unique_name("password"));
    let file = password_file(&unique_name("sasl-wrong"), &wrong);
    let args = sasl_args(&sasl, file.to_str().expect("utf-8 path"));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    // Kafka clients connect lazily: the gateway starts and listens; the broker's refusal
    // shows in health, in its log and in every call that needs Kafka.
    let gateway =
        GatewayProcess::start(&services, &unique_prefix(), &unique_name("gw-wrong"), &args).await;

    // Health says NOT_SERVING once the health check has heard from the broker (it logs why),
    // and stays there.
    let reason = wait_for("the health check to report Kafka", DEADLINE, || {
        let log = gateway.log();
        let line = log
            .lines()
            .find(|l| l.contains("health: NOT_SERVING, Kafka unreachable"))
            .map(str::to_string);
        async move { line }
    })
    .await;
    println!("health: {reason}");
    // Why, while it runs: librdkafka's own report of the broker's refusal.
    let refusal = wait_for(
        "the log to name the failed authentication",
        DEADLINE,
        || {
            let log = gateway.log();
            let line = log
                .lines()
                .find(|l| l.contains("SASL authentication error"))
                .map(str::to_string);
            async move { line }
        },
    )
    .await;
    println!("log: {refusal}");
    let mut health = gateway.health().await;
    for _ in 0..3 {
        let status = health
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .expect("health answers")
            .into_inner()
            .status;
        assert_eq!(status, ServingStatus::NotServing as i32);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // Acquire fails with UNAVAILABLE, KAFKA_UNAVAILABLE: librdkafka answers the metadata
    // request with a transport failure (its connections to the broker fail authentication),
    // not with the broker's SASL_AUTHENTICATION_FAILED, so the gateway cannot tell this from
    // a broker that is down (errors.proto would call an authentication failure KAFKA_DENIED).
    let client = gateway.client().await;
    let err = client
        .acquire(
            AcquireOptions::new(unique_name("g-wrong"), &topic)
                .member("sasl")
                .retries(0),
        )
        .await
        .map(|lease| lease.lease_id().to_string())
        .expect_err("no lease without Kafka");
    println!("Acquire with a wrong password: {err}");
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    assert_eq!(err.code(), Code::Unavailable);
    assert_eq!(err.reason(), Some(Reason::KafkaUnavailable), "{err:?}");
    assert_never_shown("Acquire error", &err.to_string(), &[&wrong, &sasl.password]);

    let (log, stdout) = stop(gateway).await;
    assert!(
        log.contains("sasl.password=***"),
        "the startup log names the property:\n{log}"
    );
    assert_never_shown("log", &log, &[&wrong, &sasl.password]);
    assert_never_shown("stdout", &stdout, &[&wrong, &sasl.password]);
}
