//! The gateway against a Consul secured as production runs it: HTTPS only, client
//! certificates required, ACLs with a default policy of deny. With a token of the policy in
//! `deploy/consul-acl-policy.hcl` (read from a file, never logged) a gateway leases, commits
//! and releases; without any one of that policy's rules it cannot, so the policy is minimal;
//! without a client certificate, or without the CA, it cannot even connect.

mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use kafka_lease_client::{AcquireOptions, Client};
use kafka_lease_testkit::{repo_root, unique_name, SecureConsul, Services, TestCa};
use support::{create_topic, produce_n, producer};

/// How long one attempt at the lease cycle may take before it counts as failed.
const CYCLE: Duration = Duration::from_secs(15);

fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(unique_name(name));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// The policy's top-level rules (`kind "name" { ... }`), each as its own text.
fn rules(policy: &str) -> Vec<String> {
    let mut rules = Vec::new();
    let mut current = String::new();
    let mut depth = 0usize;
    for line in policy.lines() {
        let code = line.split('#').next().unwrap_or_default();
        if depth == 0 && code.trim().is_empty() {
            continue;
        }
        current.push_str(line);
        current.push('\n');
        depth += code.matches('{').count();
        depth -= code.matches('}').count();
        if depth == 0 {
            rules.push(std::mem::take(&mut current));
        }
    }
    rules
}

/// Starts a gateway on the secured Consul with `extra` arguments.
async fn gateway(
    services: &Services,
    consul: &SecureConsul,
    dir: &Path,
    name: &str,
    extra: &[String],
) -> Result<kafka_lease_testkit::GatewayProcess, String> {
    let mut args: Vec<String> = vec![
        "--kafka".into(),
        services.kafka_bootstrap.clone(),
        "--consul".into(),
        consul.https_addr.clone(),
        "--consul-ca-cert".into(),
        consul.ca_file.display().to_string(),
        "--log".into(),
        "info,kafka_lease_server=debug".into(),
    ];
    args.extend_from_slice(extra);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    kafka_lease_testkit::GatewayProcess::spawn(
        Path::new(env!("CARGO_BIN_EXE_kafka-lease")),
        &args,
        &unique_name(name),
        dir.join(format!("{name}.log")),
    )
    .await
}

fn client_cert(consul: &SecureConsul) -> Vec<String> {
    vec![
        "--consul-client-cert".into(),
        consul.client.cert.display().to_string(),
        "--consul-client-key".into(),
        consul.client.key.display().to_string(),
    ]
}

/// Acquire, commit, release on one partition: `Ok` when the whole cycle worked.
async fn lease_cycle(endpoint: String, group: &str, topic: &str) -> Result<(), String> {
    let cycle = async {
        let client = Client::connect(endpoint).await.map_err(|e| e.to_string())?;
        let lease = client
            .acquire(
                AcquireOptions::new(group, topic)
                    .partition(0)
                    .wait(Duration::from_secs(2))
                    .retries(0),
            )
            .await
            .map_err(|e| format!("acquire: {e}"))?;
        lease.commit(1).await.map_err(|e| format!("commit: {e}"))?;
        let listed = client
            .raw()
            .list_leases(kafka_lease_client::proto::ListLeasesRequest::default())
            .await
            .map_err(|e| format!("list: {e}"))?
            .into_inner()
            .leases;
        if listed.len() != 1 || !listed[0].details_unavailable.is_empty() {
            return Err(format!("list: {listed:?}"));
        }
        lease.release().await.map_err(|e| format!("release: {e}"))
    };
    tokio::time::timeout(CYCLE, cycle)
        .await
        .unwrap_or_else(|_| Err(format!("no outcome within {CYCLE:?}")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_works_on_a_secured_consul_with_exactly_the_documented_policy() {
    let services = kafka_lease_testkit::require_services!();
    let dir = scratch("consul-security");
    let ca = TestCa::new("consul test CA");
    let consul = SecureConsul::start(&services, &ca, &dir).await;
    let topic = create_topic(&services, 1).await;
    produce_n(&producer(&services), &topic, 0, 3).await;
    let policy = std::fs::read_to_string(repo_root().join("deploy/consul-acl-policy.hcl"))
        .expect("deploy/consul-acl-policy.hcl");

    // The documented policy, its token in a file: the whole cycle works.
    let token = consul.token_with_rules("kafka-lease", &policy, &dir).await;
    let token_file = dir.join("consul-token");
    std::fs::write(&token_file, format!("{token}\n")).expect("token file");
    let mut args = client_cert(&consul);
    args.extend([
        "--consul-token-file".into(),
        token_file.display().to_string(),
    ]);
    let gw = gateway(&services, &consul, &dir, "full-policy", &args)
        .await
        .expect("the gateway starts with the documented policy");
    let group = unique_name("secure");
    lease_cycle(gw.endpoint(), &group, &topic)
        .await
        .expect("acquire, commit and release work with the documented policy");
    let log = gw.log();
    assert!(!log.contains(&token), "the token is never logged");
    drop(gw);

    // Each rule is needed: without any one of them the gateway cannot do its work.
    let all = rules(&policy);
    assert!(all.len() >= 3, "{all:?}");
    for (i, left_out) in all.iter().enumerate() {
        let kept: String = all
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .map(|(_, r)| r.as_str())
            .collect();
        let name = format!("without-{i}");
        let token = consul.token_with_rules(&name, &kept, &dir).await;
        let mut args = client_cert(&consul);
        args.extend(["--consul-token".into(), token.clone()]);
        let outcome = match gateway(&services, &consul, &dir, &name, &args).await {
            Err(startup) => Err(format!("startup: {startup}")),
            Ok(gw) => lease_cycle(gw.endpoint(), &unique_name("secure"), &topic).await,
        };
        let why = outcome.expect_err(&format!(
            "the policy without\n{left_out}is enough, so that rule is not needed"
        ));
        println!(
            "without `{}`: {why}",
            left_out.lines().next().unwrap_or_default()
        );
    }

    // No client certificate: the agent refuses the connection, and the gateway says so.
    let no_cert = gateway(
        &services,
        &consul,
        &dir,
        "no-client-cert",
        &[
            "--consul-token-file".into(),
            token_file.display().to_string(),
        ],
    )
    .await
    .expect_err("no client certificate, no Consul");
    assert!(no_cert.contains("Consul"), "{no_cert}");
    // No CA for the agent's certificate: the gateway refuses the agent.
    let no_ca = kafka_lease_testkit::GatewayProcess::spawn(
        Path::new(env!("CARGO_BIN_EXE_kafka-lease")),
        &[
            "--kafka",
            &services.kafka_bootstrap,
            "--consul",
            &consul.https_addr,
            "--consul-client-cert",
            &consul.client.cert.display().to_string(),
            "--consul-client-key",
            &consul.client.key.display().to_string(),
            "--consul-token-file",
            &token_file.display().to_string(),
        ],
        &unique_name("no-ca"),
        dir.join("no-ca.log"),
    )
    .await
    .expect_err("an agent certificate nobody vouches for, no Consul");
    assert!(no_ca.contains("Consul"), "{no_ca}");
    for log in ["no-client-cert.log", "no-ca.log"] {
        let text = std::fs::read_to_string(dir.join(log)).unwrap_or_default();
        assert!(!text.contains(&token), "the token is never logged ({log})");
    }
}
