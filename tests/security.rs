//! Transport security and authorization on real gateways, real Kafka and real Consul, with
//! certificates the test makes itself: plaintext refused on a TLS port, a client without a
//! certificate (or with one from another CA) refused under mutual TLS, identities from
//! certificates and bearer tokens, a policy that grants per group and topic, a lease that
//! answers only the identity that acquired it (also through another instance), a policy
//! reload that takes effect without touching held leases, a certificate reload, grpcurl
//! with `-cacert/-cert/-key`, and reflection switched off.

mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::StreamExt;
use kafka_lease_client::proto;
use kafka_lease_client::{AcquireOptions, Client, ClientTls, Reason, StatusDetails};
use kafka_lease_testkit::certs::Issued;
use kafka_lease_testkit::{unique_name, wait_for, TestCa};
use support::{
    consul_keys, create_topic, kafka_committed, produce_n, producer, unique_prefix, GatewayProcess,
};
use tonic::Code;

const DEADLINE: Duration = Duration::from_secs(20);

/// A directory of the test's own for its certificates, keys, policy and tokens.
fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(unique_name(name));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

fn https(gateway: &GatewayProcess) -> String {
    format!("https://{}", gateway.addr)
}

fn as_client(ca: &TestCa, who: &Issued) -> ClientTls {
    ClientTls::new(ca.pem.clone()).client_certificate(who.cert_pem.clone(), who.key_pem.clone())
}

/// Whether a connection attempt (or its first call) was refused at the transport: under
/// TLS 1.3 a client learns that the server refused its certificate only at its first read.
async fn refused(endpoint: String, tls: Option<&ClientTls>) -> bool {
    let client = match tls {
        Some(tls) => Client::connect_tls(endpoint, tls).await,
        None => Client::connect(endpoint).await,
    };
    match client {
        Err(_) => true,
        Ok(client) => {
            let answer = tokio::time::timeout(
                DEADLINE,
                client
                    .raw()
                    .list_leases(proto::ListLeasesRequest::default()),
            )
            .await
            .expect("an answer in time");
            match answer {
                Ok(_) => false,
                Err(status) => {
                    // Not one of the gateway's own answers: the connection itself failed.
                    assert!(
                        StatusDetails::from_status(&status).is_empty(),
                        "refused by the gateway, not the transport: {status:?}"
                    );
                    true
                }
            }
        }
    }
}

fn reason(status: &tonic::Status) -> (Code, Option<String>) {
    let details = StatusDetails::from_status(status);
    (
        status.code(),
        details.reason().map(|r| r.as_str().to_string()),
    )
}

fn policy(topic: &str, app_actions: &[&str]) -> String {
    let actions = |list: &[&str]| {
        list.iter()
            .map(|a| format!("{a:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!(
        r#"# The application reads its own groups of one topic.
[[allow]]
identities = ["orders-app"]
groups = ["orders-*"]
topics = ["{topic}"]
actions = [{app}]

# Another service that may read and commit in the same groups, but not on others' leases.
[[allow]]
identities = ["intruder"]
groups = ["orders-*"]
topics = ["{topic}"]
actions = ["read", "commit"]

[[allow]]
identities = ["ops-bot"]
groups = ["*"]
topics = ["*"]
actions = ["list"]

[gateways]
identities = ["gateway.kafka-lease"]
"#,
        app = actions(app_actions)
    )
}

/// Writes `text` to `path` through a rename, as a secret volume or a config tool would.
fn replace_file(path: &Path, text: &str) {
    let next = path.with_extension("next");
    std::fs::write(&next, text).expect("write");
    std::fs::rename(&next, path).expect("rename");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_identities_and_the_policy_decide_who_may_do_what() {
    let services = kafka_lease_testkit::require_services!();
    let dir = scratch("security-mtls");
    let topic = create_topic(&services, 2).await;
    let group = unique_name("orders");
    let ca = TestCa::new("kafka-lease test CA");
    let rogue = TestCa::new("another CA");
    let ca_file = ca.write(&dir, "ca");
    let gateway_cert = ca
        .server(&["gateway.kafka-lease", "127.0.0.1"])
        .write(&dir, "gateway");
    let app = ca.client("orders-app");
    let intruder = ca.client("intruder");
    let impostor = rogue.client("orders-app");
    let ops_token = "ops-token-5f0c1e2d3b4a59687766";
    let tokens_file = dir.join("tokens");
    std::fs::write(
        &tokens_file,
        format!("# identity token\nops-bot {ops_token}\n"),
    )
    .expect("tokens");
    let policy_file = dir.join("policy.toml");
    let all_app = ["acquire", "read", "seek", "commit", "release", "list"];
    std::fs::write(&policy_file, policy(&topic, &all_app)).expect("policy");

    let prefix = unique_prefix();
    let args: Vec<String> = vec![
        "--tls-cert".into(),
        gateway_cert.cert.display().to_string(),
        "--tls-key".into(),
        gateway_cert.key.display().to_string(),
        "--tls-client-ca".into(),
        ca_file.display().to_string(),
        "--auth-policy".into(),
        policy_file.display().to_string(),
        "--auth-tokens-file".into(),
        tokens_file.display().to_string(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let a = GatewayProcess::start(&services, &prefix, &unique_name("gw-a"), &args).await;
    let b = GatewayProcess::start(&services, &prefix, &unique_name("gw-b"), &args).await;

    // Plaintext, no client certificate, a certificate from another CA: refused.
    assert!(
        refused(a.endpoint(), None).await,
        "plaintext must be refused"
    );
    assert!(
        refused(https(&a), Some(&ClientTls::new(ca.pem.clone()))).await,
        "a client without a certificate must be refused under mutual TLS"
    );
    assert!(
        refused(https(&a), Some(&as_client(&ca, &impostor))).await,
        "a certificate from another CA must be refused"
    );
    // A client that does not trust the gateway's CA refuses the gateway.
    assert!(refused(https(&a), Some(&as_client(&rogue, &app))).await);

    let app_a = Client::connect_tls(https(&a), &as_client(&ca, &app))
        .await
        .expect("orders-app connects to A");
    let app_b = Client::connect_tls(https(&b), &as_client(&ca, &app))
        .await
        .expect("orders-app connects to B");
    let intruder_a = Client::connect_tls(https(&a), &as_client(&ca, &intruder))
        .await
        .expect("intruder connects to A");
    let intruder_b = Client::connect_tls(https(&b), &as_client(&ca, &intruder))
        .await
        .expect("intruder connects to B");

    // An allowed identity works end to end.
    let producer = producer(&services);
    produce_n(&producer, &topic, 0, 10).await;
    let lease = app_a
        .acquire(AcquireOptions::new(&group, &topic).partition(0))
        .await
        .expect("orders-app may acquire");
    let lease_id = lease.lease_id().to_string();
    let mut stream = app_a
        .raw()
        .read(proto::ReadRequest {
            lease_id: lease_id.clone(),
            max_records: 10,
            ..Default::default()
        })
        .await
        .expect("orders-app may read")
        .into_inner();
    let batch = tokio::time::timeout(DEADLINE, stream.next())
        .await
        .expect("a batch in time")
        .expect("open")
        .expect("a batch");
    assert_eq!(batch.records.first().map(|r| r.offset), Some(0));
    lease.commit(5).await.expect("orders-app may commit");
    assert_eq!(
        kafka_committed(&services, &group, &topic, 0).map(|c| c.0),
        Some(5)
    );

    // A denied action: PERMISSION_DENIED naming the action, group and topic; nothing changes.
    let keys_before = consul_keys(&services, &prefix).await;
    let billing = unique_name("billing");
    let err = app_a
        .acquire(AcquireOptions::new(&billing, &topic).partition(1))
        .await
        .expect_err("orders-app may not acquire in a billing group");
    assert_eq!(err.code(), Code::PermissionDenied, "{err}");
    assert_eq!(err.reason(), Some(Reason::ActionDenied), "{err}");
    assert_eq!(err.metadata("action"), Some("acquire"));
    assert_eq!(err.metadata("group"), Some(billing.as_str()));
    assert_eq!(err.metadata("topic"), Some(topic.as_str()));
    assert_eq!(err.metadata("identity"), Some("orders-app"));
    assert_eq!(consul_keys(&services, &prefix).await, keys_before);
    assert_eq!(kafka_committed(&services, &billing, &topic, 1), None);

    // The lease answers only the identity that acquired it, on either instance (B forwards
    // to A over mutual TLS, naming the caller).
    for (via, intruder) in [("A", &intruder_a), ("B", &intruder_b)] {
        let status = intruder
            .raw()
            .commit(proto::CommitRequest {
                lease_id: lease_id.clone(),
                offset: 9,
                ..Default::default()
            })
            .await
            .expect_err("another identity's commit");
        assert_eq!(
            reason(&status),
            (Code::PermissionDenied, Some("ACTION_DENIED".into())),
            "via {via}: {status:?}"
        );
        assert!(status.message().contains("another identity"), "{status:?}");
        let status = intruder
            .raw()
            .read(proto::ReadRequest {
                lease_id: lease_id.clone(),
                ..Default::default()
            })
            .await
            .expect_err("another identity's read");
        assert_eq!(
            status.code(),
            Code::PermissionDenied,
            "via {via}: {status:?}"
        );
    }
    assert_eq!(
        kafka_committed(&services, &group, &topic, 0).map(|c| c.0),
        Some(5),
        "refused commits change nothing"
    );
    // The owner's call through B is forwarded and served.
    app_b
        .raw()
        .commit(proto::CommitRequest {
            lease_id: lease_id.clone(),
            offset: 7,
            ..Default::default()
        })
        .await
        .expect("orders-app commits through B");
    assert_eq!(
        kafka_committed(&services, &group, &topic, 0).map(|c| c.0),
        Some(7)
    );

    // A client cannot claim to be a gateway forwarding someone else's call.
    let mut forged = tonic::Request::new(proto::CommitRequest {
        lease_id: lease_id.clone(),
        offset: 9,
        ..Default::default()
    });
    forged.metadata_mut().insert(
        "kafka-lease-forwarded-for",
        "orders-app".parse().expect("ascii"),
    );
    forged
        .metadata_mut()
        .insert("kafka-lease-forwarded-by", "gw-x".parse().expect("ascii"));
    let status = intruder_a.raw().commit(forged).await.expect_err("forged");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");

    // Bearer tokens: the identity the tokens file gives; listings show only what it may see.
    let ops = Client::connect_tls(https(&a), &as_client(&ca, &intruder))
        .await
        .expect("connect")
        .with_bearer_token(ops_token)
        .expect("token");
    let listed = |client: Client| async move {
        client
            .raw()
            .list_leases(proto::ListLeasesRequest::default())
            .await
            .map(|r| {
                r.into_inner()
                    .leases
                    .into_iter()
                    .map(|l| (l.group, l.partition, l.fencing_token))
                    .collect::<Vec<_>>()
            })
    };
    let seen_by_ops = listed(ops.clone()).await.expect("ops-bot may list");
    assert!(
        seen_by_ops.contains(&(group.clone(), 0, lease.fencing_token())),
        "{seen_by_ops:?}"
    );
    assert_eq!(
        listed(intruder_a.clone()).await.expect("an empty listing"),
        Vec::new(),
        "intruder has no list grant: it sees nothing"
    );
    let wrong_token = "not-a-known-token-0123456789";
    let status = Client::connect_tls(https(&a), &as_client(&ca, &intruder))
        .await
        .expect("connect")
        .with_bearer_token(wrong_token)
        .expect("token")
        .raw()
        .list_leases(proto::ListLeasesRequest::default())
        .await
        .expect_err("an unknown token");
    assert_eq!(
        reason(&status),
        (Code::Unauthenticated, Some("NOT_AUTHENTICATED".into()))
    );
    assert!(!status.message().contains(wrong_token));

    // A policy reload takes effect without dropping the held lease.
    let without_commit = ["acquire", "read", "seek", "release", "list"];
    replace_file(&policy_file, &policy(&topic, &without_commit));
    let started = tokio::time::Instant::now();
    loop {
        match lease.commit(8).await {
            Ok(()) => {
                assert!(
                    started.elapsed() < DEADLINE,
                    "the new policy did not take effect within {DEADLINE:?}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(err) => {
                assert_eq!(err.reason(), Some(Reason::ActionDenied), "{err}");
                assert_eq!(err.metadata("action"), Some("commit"));
                break;
            }
        }
    }
    let committed_when_denied = kafka_committed(&services, &group, &topic, 0).map(|c| c.0);
    let seen_by_ops = listed(ops.clone()).await.expect("ops-bot may list");
    assert!(
        seen_by_ops.contains(&(group.clone(), 0, lease.fencing_token())),
        "the lease is still held after the reload: {seen_by_ops:?}"
    );
    lease
        .seek(kafka_lease_client::SeekTo::Offset(0))
        .await
        .expect("seek is still granted");

    // A policy that does not validate keeps the previous one in force, and says why.
    replace_file(
        &policy_file,
        "[[allow]]\nidentities = [\"orders-app\"]\nactions = [\"everything\"]\n",
    );
    wait_for("both instances report the bad policy", DEADLINE, || async {
        (a.log().contains("does not validate") && b.log().contains("does not validate"))
            .then_some(())
    })
    .await;
    assert_eq!(
        lease.commit(9).await.map_err(|e| e.reason()),
        Err(Some(Reason::ActionDenied)),
        "the previous policy (no commit) stays in force"
    );
    assert_eq!(
        kafka_committed(&services, &group, &topic, 0).map(|c| c.0),
        committed_when_denied
    );
    lease
        .seek(kafka_lease_client::SeekTo::Offset(1))
        .await
        .expect("and so do its grants");

    // Release gives the lock back; no secret is in any log.
    lease.release().await.expect("release");
    for gateway in [&a, &b] {
        let log = gateway.log();
        assert!(!log.contains(ops_token) && !log.contains(wrong_token));
    }
    assert!(
        a.log().contains("TLS handshake failed"),
        "refusals are logged"
    );
}

/// grpcurl as docs/OPERATIONS.md shows it, a certificate rotated while the gateway runs, and
/// reflection switched off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpcurl_works_with_certificates_and_a_rotated_certificate_is_served() {
    let services = kafka_lease_testkit::require_services!();
    let dir = scratch("security-grpcurl");
    let topic = create_topic(&services, 1).await;
    let ca = TestCa::new("kafka-lease test CA");
    let ca_file = ca.write(&dir, "ca");
    let gateway_cert = ca
        .server(&["gateway.kafka-lease", "127.0.0.1"])
        .write(&dir, "gateway");
    let client = ca.client("orders-app").write(&dir, "client");
    let path = |p: &Path| p.display().to_string();
    let args = [
        "--tls-cert".to_string(),
        path(&gateway_cert.cert),
        "--tls-key".into(),
        path(&gateway_cert.key),
        "--tls-client-ca".into(),
        path(&ca_file),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let prefix = unique_prefix();
    let gateway = GatewayProcess::start(&services, &prefix, &unique_name("gw"), &args).await;

    let grpcurl = services.var("KAFKA_LEASE_GRPCURL_BIN").to_string();
    let run = |extra: Vec<String>| {
        let grpcurl = grpcurl.clone();
        async move {
            let out = tokio::process::Command::new(&grpcurl)
                .args(&extra)
                .output()
                .await
                .expect("grpcurl runs");
            (
                out.status.success(),
                format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ),
            )
        }
    };
    let tls_flags = vec![
        "-cacert".to_string(),
        path(&ca_file),
        "-cert".into(),
        path(&client.cert),
        "-key".into(),
        path(&client.key),
    ];
    let mut list = tls_flags.clone();
    list.extend([gateway.addr.clone(), "list".into()]);
    let (ok, out) = run(list).await;
    assert!(
        ok && out.contains("kafka_lease.v1.PartitionLeaseService"),
        "{out}"
    );
    let group = unique_name("grpcurl");
    let mut acquire = tls_flags.clone();
    acquire.extend([
        "-d".into(),
        serde_json::json!({"group": group, "topic": topic, "member": "grpcurl"}).to_string(),
        gateway.addr.clone(),
        "kafka_lease.v1.PartitionLeaseService/Acquire".into(),
    ]);
    let (ok, out) = run(acquire).await;
    assert!(ok && out.contains("\"leaseId\""), "{out}");
    // Without the client certificate grpcurl is refused.
    let (ok, out) = run(vec![
        "-cacert".into(),
        path(&ca_file),
        gateway.addr.clone(),
        "list".into(),
    ])
    .await;
    assert!(!ok, "{out}");

    // Rotation: the certificate and key are replaced by ones from a new CA. A client that
    // trusts only the new CA is refused until the gateway reloads them, then served, with
    // no restart; a half-done rotation (new certificate, old key) keeps the old pair.
    let next_ca = TestCa::new("next CA");
    let rotated = next_ca.server(&["gateway.kafka-lease", "127.0.0.1"]);
    // The client certificate still comes from the original CA: the client CA is unchanged.
    let client_issued = ca.client("orders-app");
    let trusts_next = ClientTls::new(next_ca.pem.clone()).client_certificate(
        client_issued.cert_pem.clone(),
        client_issued.key_pem.clone(),
    );
    assert!(refused(https(&gateway), Some(&trusts_next)).await);
    replace_file(&gateway_cert.cert, &rotated.cert_pem);
    // Half-done: the old key does not match; the old pair is kept and the reason logged.
    wait_for("the mismatched pair is reported", DEADLINE, || async {
        (gateway.log().contains("keeping the previous certificate")).then_some(())
    })
    .await;
    let trusts_old = ClientTls::new(ca.pem.clone()).client_certificate(
        client_issued.cert_pem.clone(),
        client_issued.key_pem.clone(),
    );
    assert!(
        !refused(https(&gateway), Some(&trusts_old)).await,
        "still served"
    );
    replace_file(&gateway_cert.key, &rotated.key_pem);
    wait_for(
        "the rotated certificate is served without a restart",
        DEADLINE,
        || async { (!refused(https(&gateway), Some(&trusts_next)).await).then_some(()) },
    )
    .await;
    assert!(gateway
        .log()
        .contains("TLS certificate, key and CAs reloaded"));

    // Reflection off: grpcurl needs the .proto files then; the API itself still answers.
    let quiet = GatewayProcess::start(
        &services,
        &prefix,
        &unique_name("gw-quiet"),
        &["--reflection", "false"],
    )
    .await;
    let (ok, out) = run(vec!["-plaintext".into(), quiet.addr.clone(), "list".into()]).await;
    assert!(!ok && out.contains("reflection"), "{out}");
    quiet
        .client()
        .await
        .raw()
        .list_leases(proto::ListLeasesRequest::default())
        .await
        .expect("the API answers without reflection");
}
