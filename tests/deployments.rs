//! The deployments as shipped, run for real: two gateways started with exactly the container
//! arguments and environment that `deploy/kubernetes/kafka-lease.yaml` gives a pod, and
//! again with what `docker-compose.yml` (over `deploy/Dockerfile`'s defaults) gives its two
//! gateways, on the real Kafka and Consul. The test plays the platform: the downward API
//! (pod names, pod IPs on 127.0.0.x, the node's IP 127.0.0.1) and compose's host names.
//!
//! What each shows: both instances register checks of their own on the one agent and hold
//! sessions (neither takes the other's registration for its own); a call on a lease one
//! serves, made through the other, is forwarded to the address it advertises; a killed
//! instance's partitions move to the survivor; and SIGTERM ends the survivor, leases given
//! back, well before the platform's kill.
//!
//! What the test changes, and only this: the broker and agent addresses (the deployment's
//! are its cluster's); the listen address, `0.0.0.0` in both deployments, becomes the
//! instance's own 127.0.0.x, because here both instances share one network namespace; and
//! a Consul prefix of the test's own.

mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use kafka_lease_client::{proto, AcquireOptions, Client};
use kafka_lease_testkit::{repo_root, unique_name, wait_for, GatewayProcess, Services};
use support::{consul, consul_keys, create_topic, unique_prefix, wait_health};
use tokio::time::Instant;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use yaml_rust2::{Yaml, YamlLoader};

/// An instance as the deployment starts it.
struct Instance {
    name: String,
    ip: &'static str,
    args: Vec<String>,
    env: BTreeMap<String, String>,
}

fn load_yaml(path: &str) -> Vec<Yaml> {
    let text = std::fs::read_to_string(repo_root().join(path))
        .unwrap_or_else(|e| panic!("reading {path}: {e}"));
    YamlLoader::load_from_str(&text).unwrap_or_else(|e| panic!("{path} is not YAML: {e}"))
}

fn strings(list: &Yaml, what: &str) -> Vec<String> {
    list.as_vec()
        .unwrap_or_else(|| panic!("{what} is not a list"))
        .iter()
        .map(|a| {
            a.as_str()
                .unwrap_or_else(|| panic!("{what} holds a non-string"))
                .to_string()
        })
        .collect()
}

/// The container's environment as the kubelet sets it for a pod named `pod` with IP
/// `pod_ip` on a node whose IP is 127.0.0.1: `$(VAR)` in a value is replaced by a variable
/// defined before it, as Kubernetes does.
fn pod_env(container: &Yaml, pod: &str, pod_ip: &str) -> BTreeMap<String, String> {
    let mut resolved: Vec<(String, String)> = Vec::new();
    for var in container["env"].as_vec().expect("the container's env") {
        let name = var["name"].as_str().expect("an env name").to_string();
        let value = if let Some(value) = var["value"].as_str() {
            let mut value = value.to_string();
            for (k, v) in &resolved {
                value = value.replace(&format!("$({k})"), v);
            }
            value
        } else {
            let from = &var["valueFrom"];
            match from["fieldRef"]["fieldPath"].as_str() {
                Some("status.podIP") => pod_ip.to_string(),
                Some("status.hostIP") => "127.0.0.1".to_string(),
                Some("metadata.name") => pod.to_string(),
                Some(other) => panic!("the test does not play the fieldRef {other}"),
                // An optional secret that is not there: the variable is not set.
                None if from["secretKeyRef"]["optional"].as_bool() == Some(true) => continue,
                None => panic!("the test does not play {var:?}"),
            }
        };
        assert!(
            !value.contains("$("),
            "{name}={value}: a reference Kubernetes would leave unexpanded"
        );
        resolved.push((name, value));
    }
    resolved.into_iter().collect()
}

/// `ENV` and `CMD` of the runtime stage of `deploy/Dockerfile`.
fn image_defaults() -> (BTreeMap<String, String>, Vec<String>) {
    let text = std::fs::read_to_string(repo_root().join("deploy/Dockerfile")).expect("Dockerfile");
    let runtime = text
        .rsplit_once("\nFROM ")
        .map(|(_, stage)| stage)
        .expect("a runtime stage");
    let mut env = BTreeMap::new();
    let mut cmd = Vec::new();
    for line in runtime.lines() {
        if let Some(pairs) = line.strip_prefix("ENV ") {
            for pair in pairs.split_whitespace() {
                let (k, v) = pair.split_once('=').expect("ENV key=value");
                env.insert(k.to_string(), v.to_string());
            }
        } else if let Some(list) = line.strip_prefix("CMD ") {
            cmd = serde_json::from_str(list).expect("CMD in exec form");
        } else if let Some(list) = line.strip_prefix("ENTRYPOINT ") {
            let entry: Vec<String> = serde_json::from_str(list).expect("ENTRYPOINT in exec form");
            assert_eq!(entry, ["kafka-lease"], "the image runs the gateway binary");
        }
    }
    (env, cmd)
}

/// `--<flag>`'s default, from `kafka-lease serve --help`.
fn serve_default(flag: &str) -> String {
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_kafka-lease"))
        .args(["serve", "--help"])
        .output()
        .expect("kafka-lease serve --help");
    let help = String::from_utf8_lossy(&help.stdout);
    let section = help
        .split(&format!("--{flag} "))
        .nth(1)
        .unwrap_or_else(|| panic!("--{flag} in the help"));
    section
        .split("[default: ")
        .nth(1)
        .and_then(|d| d.split(']').next())
        .unwrap_or_else(|| panic!("a default for --{flag}"))
        .to_string()
}

fn seconds(value: &str) -> u64 {
    humantime::parse_duration(value)
        .unwrap_or_else(|e| panic!("{value:?} is not a duration: {e}"))
        .as_secs()
}

/// The gateway's shutdown grace in whole seconds, as `env` sets it or by default.
fn shutdown_grace(env: &BTreeMap<String, String>) -> u64 {
    seconds(
        env.get("KAFKA_LEASE_SHUTDOWN_GRACE")
            .cloned()
            .unwrap_or_else(|| serve_default("shutdown-grace"))
            .as_str(),
    )
}

/// What the test changes: see the file's comment.
fn localize(instance: &mut Instance, services: &Services, prefix: &str) {
    let env = &mut instance.env;
    let listen = env
        .get("KAFKA_LEASE_LISTEN")
        .expect("the deployment sets the listen address")
        .clone();
    let port = listen.rsplit_once(':').expect("host:port").1;
    assert_eq!(
        listen,
        format!("0.0.0.0:{port}"),
        "listens on every interface"
    );
    env.insert(
        "KAFKA_LEASE_LISTEN".into(),
        format!("{}:{port}", instance.ip),
    );
    if let Some(metrics) = env.get("KAFKA_LEASE_METRICS_LISTEN").cloned() {
        let port = metrics.rsplit_once(':').expect("host:port").1;
        env.insert(
            "KAFKA_LEASE_METRICS_LISTEN".into(),
            format!("{}:{port}", instance.ip),
        );
    }
    env.insert("KAFKA_LEASE_KAFKA".into(), services.kafka_bootstrap.clone());
    env.insert(
        "KAFKA_LEASE_CONSUL".into(),
        services.consul_http_addr.clone(),
    );
    env.insert("KAFKA_LEASE_CONSUL_PREFIX".into(), prefix.to_string());
}

async fn start(instance: &Instance) -> GatewayProcess {
    let args: Vec<&str> = instance.args.iter().map(String::as_str).collect();
    assert_eq!(args.first(), Some(&"serve"), "{args:?}");
    let env: Vec<(String, String)> = instance
        .env
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let log = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{}.log", instance.name));
    GatewayProcess::spawn_with_env(
        Path::new(env!("CARGO_BIN_EXE_kafka-lease")),
        &args[1..],
        &env,
        &instance.name,
        log,
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"))
}

/// The gRPC health service names the pod's probes ask for (`""`: the whole server), with
/// the probe's name; every probe of the container must be a gRPC one.
fn grpc_probes(container: &Yaml) -> Vec<(String, String)> {
    ["readinessProbe", "livenessProbe", "startupProbe"]
        .into_iter()
        .filter(|probe| !container[*probe].is_badvalue())
        .map(|probe| {
            let grpc = &container[probe]["grpc"];
            assert!(!grpc.is_badvalue(), "{probe} is not a gRPC probe");
            let service = grpc["service"].as_str().unwrap_or("").to_string();
            (probe.to_string(), service)
        })
        .collect()
}

/// Starts `a` then `b` and runs them through their probes, registration, forwarding, a kill
/// of `a` and a SIGTERM of `b`, which must exit by itself within `stop_deadline` (what the
/// platform allows before it kills).
async fn two_instances(
    services: &Services,
    prefix: &str,
    a: Instance,
    b: Instance,
    probes: &[(String, String)],
    stop_deadline: Duration,
) {
    let topic = create_topic(services, 2).await;
    let started = Instant::now();
    let gateway_a = start(&a).await;
    let gateway_b = start(&b).await;
    let mut gateway_b = gateway_b;
    let client_a = Client::connect(gateway_a.endpoint())
        .await
        .expect("connect to A");
    let client_b = Client::connect(gateway_b.endpoint())
        .await
        .expect("connect to B");

    // A, started first, still grants leases after B registered on the same agent: before the
    // check addresses were per instance, B's start deregistered A's check, and A's session
    // with it.
    let group = unique_name("deploy");
    let mut held = Vec::new();
    for partition in [0, 1] {
        held.push(
            client_a
                .acquire(AcquireOptions::new(&group, &topic).partition(partition))
                .await
                .unwrap_or_else(|e| panic!("A grants partition {partition}: {e}")),
        );
    }
    // Each probe passes on each instance, as the kubelet would ask it.
    for gateway in [&gateway_a, &gateway_b] {
        let channel = tonic::transport::Endpoint::from_shared(gateway.endpoint())
            .expect("endpoint")
            .connect()
            .await
            .expect("connect for health");
        let health = HealthClient::new(channel);
        for (probe, service) in probes {
            println!(
                "{probe} (health service {service:?}) on {}",
                gateway.instance
            );
            wait_health(
                &health,
                service,
                ServingStatus::Serving,
                Duration::from_secs(15),
            )
            .await;
        }
    }

    // Each instance's own check, kept passing: a TTL check (the default) for longer than its
    // TTL, so by the instance's passes; a TCP check run by the agent against the instance's
    // own address.
    let agent = consul(services);
    for instance in [&a, &b] {
        let check_id = format!("kafka-lease-{}-alive", instance.name);
        let what = format!("{check_id} to be kept passing");
        let check = wait_for(&what, Duration::from_secs(15), || async {
            let checks = consulrs::check::list(&agent, None).await.ok()?.response;
            let check = checks.get(&check_id)?.clone();
            let kept = match check.ty.as_deref() {
                Some("ttl") => started.elapsed() > Duration::from_secs(3),
                _ => !check.output.as_deref().unwrap_or("").is_empty(),
            };
            kept.then_some(check)
        })
        .await;
        assert_eq!(check.status.as_deref(), Some("passing"), "{check:#?}");
        if check.ty.as_deref() == Some("tcp") {
            let output = check.output.as_deref().unwrap_or("");
            assert!(
                output.contains(&format!("{}:", instance.ip)),
                "the agent must dial {}'s own address: {check:#?}",
                instance.name
            );
        }
    }
    // (A process may deregister what a dead one left on its own address, an earlier run's.)
    for (gateway, other) in [(&gateway_a, &b), (&gateway_b, &a)] {
        let log = gateway.log();
        let taken: Vec<&str> = log
            .lines()
            .filter(|line| line.contains("deregistering") && line.contains(&other.name))
            .collect();
        assert!(
            taken.is_empty(),
            "{} took {}'s registration for its own: {taken:?}",
            gateway.instance,
            other.name
        );
    }

    // A call through B on a lease A serves reaches A at the address A advertises.
    client_b
        .raw()
        .commit(proto::CommitRequest {
            lease_id: held[0].lease_id().to_string(),
            offset: 0,
            metadata: None,
        })
        .await
        .expect("a commit through B, forwarded to A");

    // A dies: its partitions move to B.
    let killed = Instant::now();
    gateway_a.kill().await;
    let mut moved = Vec::new();
    for partition in [0, 1] {
        moved.push(
            client_b
                .acquire(
                    AcquireOptions::new(&group, &topic)
                        .partition(partition)
                        .wait(Duration::from_secs(30)),
                )
                .await
                .unwrap_or_else(|e| panic!("B takes over partition {partition}: {e}")),
        );
    }
    println!(
        "{}: A's partitions moved to B {:?} after its kill",
        a.name,
        killed.elapsed()
    );
    drop(held);

    // SIGTERM: B gives its leases back and exits 0 before the platform would kill it.
    let stopping = Instant::now();
    gateway_b.signal("TERM").expect("SIGTERM");
    let code = gateway_b
        .wait_exit(stop_deadline)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(code, Some(0), "{}", gateway_b.log());
    println!(
        "{}: B exited {:?} after SIGTERM",
        b.name,
        stopping.elapsed()
    );
    let held_keys: Vec<_> = consul_keys(services, prefix)
        .await
        .into_iter()
        .filter(|(_, session, _)| session.is_some())
        .collect();
    assert!(held_keys.is_empty(), "locks still held: {held_keys:?}");
    drop(moved);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubernetes_manifest_runs_two_pods_that_fail_over() {
    let services = kafka_lease_testkit::require_services!();
    let docs = load_yaml("deploy/kubernetes/kafka-lease.yaml");
    let deployment = docs
        .iter()
        .find(|d| d["kind"].as_str() == Some("Deployment"))
        .expect("a Deployment");
    let pod_spec = &deployment["spec"]["template"]["spec"];
    let container = &pod_spec["containers"][0];
    let (image_env, image_cmd) = image_defaults();
    // `args` replace the image's CMD; the image's ENV stays under the pod's.
    let args = match &container["args"] {
        Yaml::BadValue => image_cmd,
        args => strings(args, "args"),
    };
    let grace = container_grace(pod_spec);
    let prefix = unique_prefix();
    let mut pods = Vec::new();
    for ip in ["127.0.0.2", "127.0.0.3"] {
        let name = unique_name("kafka-lease-pod");
        let mut env = image_env.clone();
        env.extend(pod_env(container, &name, ip));
        // What the manifest decides, as it resolves for this pod.
        assert_eq!(env["KAFKA_LEASE_INSTANCE_ID"], name);
        assert_eq!(env["KAFKA_LEASE_ADVERTISE_ADDR"], format!("{ip}:50051"));
        assert_eq!(env["KAFKA_LEASE_CONSUL"], "http://127.0.0.1:8500");
        // With a TCP check the node's agent dials the pod. Left to its default, the check
        // would dial the listen address with 127.0.0.1 for 0.0.0.0: the agent's own host,
        // where no gateway listens (this test moves the listen address, so only this line
        // can see that).
        let check = env
            .get("KAFKA_LEASE_CONSUL_CHECK")
            .cloned()
            .unwrap_or_else(|| serve_default("consul-check"));
        if check == "tcp" {
            assert_eq!(
                env.get("KAFKA_LEASE_CONSUL_CHECK_ADDR"),
                Some(&format!("{ip}:50051")),
                "the node's agent must dial the pod"
            );
        }
        let shutdown = shutdown_grace(&env);
        assert!(
            shutdown < grace,
            "the shutdown grace ({shutdown}s) must end before Kubernetes kills the pod ({grace}s)"
        );
        let mut pod = Instance {
            name,
            ip,
            args: args.clone(),
            env,
        };
        localize(&mut pod, &services, &prefix);
        pods.push(pod);
    }
    let b = pods.pop().expect("pod B");
    let a = pods.pop().expect("pod A");
    let probes = grpc_probes(container);
    assert!(
        probes.iter().any(|(p, _)| p == "livenessProbe"),
        "the manifest has a liveness probe"
    );
    two_instances(
        &services,
        &prefix,
        a,
        b,
        &probes,
        Duration::from_secs(grace),
    )
    .await;
}

fn container_grace(pod_spec: &Yaml) -> u64 {
    let grace = pod_spec["terminationGracePeriodSeconds"]
        .as_i64()
        .expect("terminationGracePeriodSeconds");
    u64::try_from(grace).expect("a positive grace")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_compose_runs_two_gateways_that_fail_over() {
    let services = kafka_lease_testkit::require_services!();
    let docs = load_yaml("docker-compose.yml");
    let compose = &docs[0]["services"];
    let (image_env, image_cmd) = image_defaults();
    let prefix = unique_prefix();
    // Compose's host names, as its network resolves them for the gateways.
    let hosts = [("gateway-a", "127.0.0.4"), ("gateway-b", "127.0.0.5")];
    let mut gateways = Vec::new();
    let mut stop_deadline = Duration::MAX;
    for (service, ip) in hosts {
        let spec = &compose[service];
        assert!(
            !spec.is_badvalue(),
            "docker-compose.yml has no service {service}"
        );
        let mut env = image_env.clone();
        for (k, v) in spec["environment"].as_hash().expect("environment as a map") {
            let value = match v {
                Yaml::String(s) => s.clone(),
                Yaml::Integer(i) => i.to_string(),
                Yaml::Boolean(b) => b.to_string(),
                other => panic!("an environment value the test does not read: {other:?}"),
            };
            env.insert(k.as_str().expect("a variable name").to_string(), value);
        }
        assert_eq!(env["KAFKA_LEASE_KAFKA"], "kafka:9092");
        assert_eq!(env["KAFKA_LEASE_CONSUL"], "http://consul:8500");
        // The addresses that name the gateway's own host: compose's network resolves the
        // service name; here it is the instance's 127.0.0.x.
        for (var, value) in env.iter_mut() {
            if value.contains(&format!("{service}:")) {
                assert!(var.ends_with("_ADDR"), "{var}={value}");
                *value = value.replace(service, ip);
            }
        }
        assert_eq!(env["KAFKA_LEASE_ADVERTISE_ADDR"], format!("{ip}:50051"));
        let args = match &spec["command"] {
            Yaml::BadValue => image_cmd.clone(),
            command => strings(command, "command"),
        };
        // Docker stops a container with SIGTERM and kills it `stop_grace_period` later (10 s
        // unless the file says).
        let platform_grace = spec["stop_grace_period"].as_str().map_or(10, seconds);
        let shutdown = shutdown_grace(&env);
        assert!(
            shutdown < platform_grace,
            "{service}: the shutdown grace ({shutdown}s) must end before Docker kills the \
             container ({platform_grace}s)"
        );
        stop_deadline = stop_deadline.min(Duration::from_secs(platform_grace));
        let name = env
            .get("KAFKA_LEASE_INSTANCE_ID")
            .cloned()
            .expect("an instance id");
        assert_eq!(name, service);
        let mut gateway = Instance {
            // Unique per run, as the Consul agent outlives the test.
            name: unique_name(service),
            ip,
            args,
            env,
        };
        gateway
            .env
            .insert("KAFKA_LEASE_INSTANCE_ID".into(), gateway.name.clone());
        localize(&mut gateway, &services, &prefix);
        gateways.push(gateway);
    }
    let b = gateways.pop().expect("gateway-b");
    let a = gateways.pop().expect("gateway-a");
    two_instances(&services, &prefix, a, b, &[], stop_deadline).await;
}
