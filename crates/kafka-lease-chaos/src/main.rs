//! `kafka-lease-chaos`: brings up a cluster of three Consul servers, three Kafka brokers and
//! the gateways (each with a Consul client agent), every node in a network namespace of its
//! own; runs the workload under the nemesis; writes the history; and checks it.
//!
//! `scripts/chaos` runs it with the paths of the services `scripts/services install` fetched.

mod args;
mod cluster;
mod nemesis;
mod workload;

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Parser;

use kafka_lease_chaos::{checker, history};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::Consumer;
use rdkafka::ClientConfig;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use args::{Cli, Command, RunArgs};
use cluster::{Cluster, Role, Spec};
use workload::{Behaviour, LiveLeases, Recorder, Style};

/// Progress lines, so that nobody stares at a silent terminal.
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {{
        println!("[chaos] {}", format!($($arg)*));
    }};
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Check { history } => check_file(&history),
        Command::Cleanup { prefix } => cluster::remove_leftovers(&prefix).map(|n| {
            say!("removed {n} namespaces");
            true
        }),
        Command::Run(args) => run(*args),
    };
    match result {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::from(1),
        Err(e) => {
            eprintln!("[chaos] error: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}

fn check_file(path: &PathBuf) -> Result<bool> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let events = history::parse(&text).map_err(anyhow::Error::msg)?;
    let report = checker::check(&events);
    print!("{}", checker::render_markdown(&report));
    Ok(report.valid())
}

fn run(args: RunArgs) -> Result<bool> {
    let octets: Vec<u8> = args
        .subnet
        .split('.')
        .map(str::parse)
        .collect::<Result<_, _>>()
        .with_context(|| format!("--subnet {:?}: three octets like 10.99.0", args.subnet))?;
    let [a, b, c] = octets[..] else {
        bail!("--subnet {:?}: three octets like 10.99.0", args.subnet);
    };
    let nemeses: Vec<String> = match args.nemesis.as_str() {
        "short" => nemesis::SHORT.iter().map(|s| s.to_string()).collect(),
        "all" => nemesis::ALL.iter().map(|s| s.to_string()).collect(),
        list => list.split(',').map(|s| s.trim().to_string()).collect(),
    };
    for n in &nemeses {
        if !nemesis::ALL.contains(&n.as_str()) {
            bail!(
                "--nemesis: no fault named {n:?} (known: {})",
                nemesis::ALL.join(", ")
            );
        }
    }
    if nemeses.iter().any(|n| n == "skew-gateway-clock") && args.clockshift_lib.is_none() {
        bail!(
            "--nemesis skew-gateway-clock needs --clockshift-lib (the library built from \
             crates/kafka-lease-chaos/clockshift/clockshift.c; scripts/chaos builds and passes it)"
        );
    }
    std::fs::create_dir_all(&args.out)?;
    let out = std::fs::canonicalize(&args.out)?;
    let run_dir = out.join("nodes");
    let _ = std::fs::remove_dir_all(&run_dir);
    std::fs::create_dir_all(&run_dir)?;
    let spec = Spec {
        prefix: args.prefix.clone(),
        subnet: [a, b, c],
        gateways: args.gateways,
        consul_bin: args.consul_bin.clone(),
        java: args.java.clone(),
        kafka_libs: args.kafka_libs.clone(),
        kafka_storage_class: args.kafka_storage_class.clone(),
        kafka_log4j: args.kafka_log4j.clone(),
        kafka_heap: args.kafka_heap.clone(),
        consul_min_quorum: args.consul_min_quorum,
        gateway_bin: std::fs::canonicalize(&args.gateway_bin)
            .with_context(|| format!("--gateway-bin {}", args.gateway_bin.display()))?,
        gateway_args: args.gateway_args.clone(),
        gateway_env: args
            .planted_defect
            .iter()
            .map(|d| ("KAFKA_LEASE_PLANTED_DEFECT".to_string(), d.clone()))
            .collect(),
        clockshift_lib: args
            .clockshift_lib
            .as_ref()
            .map(std::fs::canonicalize)
            .transpose()
            .context("--clockshift-lib")?,
        run_dir,
    };
    say!(
        "creating {} network namespaces on {}.0/24 (prefix {})",
        7 + spec.gateways,
        args.subnet,
        spec.prefix
    );
    let nodes = Cluster::create_network(&spec)?;
    let cluster = Arc::new(Cluster::new(spec.clone(), nodes));
    // From here on this thread, and every thread it starts, lives in the hub.
    Cluster::enter_hub(&spec)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let result = runtime.block_on(async {
        let work = run_in_cluster(cluster.clone(), &args, &nemeses, &out);
        tokio::select! {
            r = work => r,
            _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
        }
    });
    if let Err(e) = &result {
        eprintln!("[chaos] error: {e:#}");
    }
    runtime.block_on(async {
        say!("tearing the cluster down");
        cluster.teardown().await;
    });
    if result.is_err() {
        say!("the nodes' logs are under {}", out.join("nodes").display());
    }
    result
}

async fn run_in_cluster(
    cluster: Arc<Cluster>,
    args: &RunArgs,
    nemeses: &[String],
    out: &std::path::Path,
) -> Result<bool> {
    let t0 = Instant::now();
    say!("formatting the brokers' storage");
    cluster.prepare().await?;
    say!("starting 3 Consul servers and 3 Kafka brokers");
    for node in cluster.of_role(Role::Consul) {
        cluster.start(node, "consul")?;
    }
    for node in cluster.of_role(Role::Broker) {
        cluster.start(node, "kafka")?;
    }
    for node in cluster.of_role(Role::Gateway) {
        cluster.start(node, "consul")?;
    }
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(2))
        .build()?;
    let bootstrap = cluster.bootstrap();
    let metadata = Arc::new(workload::observer_consumer(&bootstrap)?);
    let (tx, mut rx) = mpsc::unbounded_channel();
    let recorder = Recorder::new(t0, tx);
    let live: LiveLeases = LiveLeases::default();
    let nemesis = nemesis::Nemesis {
        cluster: cluster.clone(),
        recorder: recorder.clone(),
        live: live.clone(),
        http: http.clone(),
        metadata: metadata.clone(),
        at: Arc::default(),
    };
    wait_until(
        "a Consul leader and 6 agents",
        Duration::from_secs(60),
        || {
            let http = http.clone();
            let c1 = cluster.node("c1").map(|n| n.addr);
            async move {
                let c1 = c1.ok()?;
                let text = http
                    .get(format!(
                        "http://{c1}:{}/v1/catalog/nodes",
                        cluster::CONSUL_HTTP_PORT
                    ))
                    .send()
                    .await
                    .ok()?
                    .text()
                    .await
                    .ok()?;
                let nodes: serde_json::Value = serde_json::from_str(&text).ok()?;
                (nodes.as_array()?.len() >= 6).then_some(())
            }
        },
    )
    .await?;
    wait_until("3 Kafka brokers", Duration::from_secs(90), || {
        let md = metadata.clone();
        async move {
            tokio::task::spawn_blocking(move || {
                let m = md.fetch_metadata(None, Duration::from_secs(2)).ok()?;
                (m.brokers().len() == 3).then_some(())
            })
            .await
            .ok()
            .flatten()
        }
    })
    .await?;
    say!(
        "creating topic {} ({} partitions, replication factor 3, min.insync.replicas 2)",
        workload::TOPIC,
        args.partitions
    );
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()?;
    let topic = NewTopic::new(workload::TOPIC, args.partitions, TopicReplication::Fixed(3))
        .set("min.insync.replicas", "2");
    let dead_letters = NewTopic::new(workload::DEAD_LETTER_TOPIC, 1, TopicReplication::Fixed(3))
        .set("min.insync.replicas", "2");
    // Retried: a client that has just learnt the brokers' ids from its bootstrap addresses
    // can drop a request in flight ("broker handle destroyed"), seen with Kafka 3.9.
    let mut attempt = 0;
    loop {
        attempt += 1;
        let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(20)));
        let outcome = match admin.create_topics([&topic, &dead_letters], &options).await {
            Ok(results) => results
                .into_iter()
                .map(|r| match r {
                    Ok(_) => Ok(()),
                    Err((_, rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists)) => Ok(()),
                    Err((name, code)) => Err(anyhow::anyhow!("creating topic {name}: {code}")),
                })
                .collect::<Result<Vec<()>>>()
                .map(|_| ()),
            Err(e) => Err(anyhow::anyhow!("creating the topic: {e}")),
        };
        match outcome {
            Ok(()) => break,
            Err(e) if attempt < 5 => {
                say!("{e:#}; again in 1 s");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => return Err(e),
        }
    }
    say!("starting {} gateways", cluster.spec.gateways);
    for node in cluster.of_role(Role::Gateway) {
        cluster.start(node, "gateway")?;
    }
    for node in cluster.of_role(Role::Gateway) {
        nemesis.wait_gateway(node).await?;
    }
    say!("cluster up after {:.1} s", t0.elapsed().as_secs_f64());
    let peak_rss = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let sampler = {
        let cluster = cluster.clone();
        let peak = peak_rss.clone();
        tokio::spawn(async move {
            loop {
                let now = cluster.rss_kib();
                peak.fetch_max(now, std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        })
    };

    // The history writer.
    let history_path = out.join("history.jsonl");
    let mut file = std::io::BufWriter::new(std::fs::File::create(&history_path)?);
    let writer = tokio::spawn(async move {
        let mut events = Vec::new();
        while let Some(event) = rx.recv().await {
            if let Ok(line) = serde_json::to_string(&event) {
                let _ = writeln!(file, "{line}");
            }
            events.push(event);
        }
        let _ = file.flush();
        events
    });

    let (stop_tx, stop_rx) = watch::channel(false);
    let producer = tokio::spawn(workload::producer_loop(
        bootstrap.clone(),
        args.partitions,
        args.rate,
        recorder.clone(),
        stop_rx.clone(),
    ));
    let observer = tokio::spawn(workload::observer_loop(
        bootstrap.clone(),
        args.partitions,
        recorder.clone(),
        stop_rx.clone(),
    ));
    let gateways: Vec<_> = cluster.of_role(Role::Gateway).cloned().collect();
    let mut clients = Vec::new();
    for i in 0..args.clients {
        let g = &gateways[i % gateways.len()];
        clients.push(tokio::spawn(workload::client_loop(
            format!("client-{i}"),
            cluster.gateway_endpoint(g),
            g.name.clone(),
            recorder.clone(),
            live.clone(),
            Style::Read(Behaviour {
                commit_with_release: args.commit_with_release.clamp(0.0, 1.0),
                long_hold: args.long_hold.clamp(0.0, 1.0),
                stall: args.stall.clamp(0.0, 1.0),
                ..Behaviour::default()
            }),
            stop_rx.clone(),
        )));
    }
    for i in 0..args.members {
        let g = &gateways[(i + 1) % gateways.len()];
        clients.push(tokio::spawn(workload::member_loop(
            format!("member-{i}"),
            cluster.gateway_endpoint(g),
            g.name.clone(),
            recorder.clone(),
            live.clone(),
            stop_rx.clone(),
        )));
    }
    for i in 0..args.queue_consumers {
        let g = &gateways[(i + 2) % gateways.len()];
        clients.push(tokio::spawn(workload::client_loop(
            format!("queue-{i}"),
            cluster.gateway_endpoint(g),
            g.name.clone(),
            recorder.clone(),
            live.clone(),
            Style::Queue,
            stop_rx.clone(),
        )));
    }
    say!(
        "workload running: {} clients, {} Subscribe members and {} queue consumers over {} \
         gateways, a producer at {} records/s",
        args.clients,
        args.members,
        args.queue_consumers,
        gateways.len(),
        args.rate
    );
    tokio::time::sleep(Duration::from_secs(8)).await;

    let hold = Duration::from_secs(args.hold);
    let recover = Duration::from_secs(args.recover);
    let mut nemesis_errors = Vec::new();
    match args.soak {
        None => {
            for (i, name) in nemeses.iter().enumerate() {
                say!("fault {}/{}: {name}", i + 1, nemeses.len());
                if let Err(e) = nemesis.run(name, hold).await {
                    say!("fault {name} failed: {e:#}");
                    nemesis_errors.push(format!("{name}: {e:#}"));
                    let _ = cluster.heal();
                }
                tokio::time::sleep(recover).await;
                crashed(&cluster, &nemesis, &mut nemesis_errors).await;
            }
        }
        Some(seconds) => {
            let until = Instant::now() + Duration::from_secs(seconds);
            let mut n = 0;
            while Instant::now() < until {
                n += 1;
                let name = &nemeses[rand::random_range(0..nemeses.len())];
                let left = until.saturating_duration_since(Instant::now()).as_secs();
                // At --overlap odds, two faults at once.
                let partners: Vec<&String> = nemeses
                    .iter()
                    .filter(|other| nemesis::compatible(name, other))
                    .collect();
                let partner = if rand::random_bool(args.overlap.clamp(0.0, 1.0)) {
                    partners
                        .get(rand::random_range(0..partners.len().max(1)))
                        .copied()
                } else {
                    None
                };
                let result = match partner {
                    Some(other) => {
                        say!("soak fault {n}: {name} and {other} at once ({left} s left)");
                        nemesis.run_pair(name, other, hold).await
                    }
                    None => {
                        say!("soak fault {n}: {name} ({left} s left)");
                        nemesis.run(name, hold).await
                    }
                };
                if let Err(e) = result {
                    say!("fault {name} failed: {e:#}");
                    nemesis_errors.push(format!("{name}: {e:#}"));
                    let _ = cluster.heal();
                }
                tokio::time::sleep(recover).await;
                crashed(&cluster, &nemesis, &mut nemesis_errors).await;
            }
        }
    }

    say!("stopping the workload");
    let _ = stop_tx.send(true);
    for c in clients {
        let _ = c.await;
    }
    producer.await??;
    // Let the last commits reach the observer.
    tokio::time::sleep(Duration::from_secs(1)).await;
    observer.await??;
    let partitions = args.partitions;
    // A fault just healed can leave a leader or a coordinator moving: ask again for a while.
    let mut attempt = 0;
    let finals = loop {
        attempt += 1;
        let md = metadata.clone();
        let got = tokio::task::spawn_blocking(move || -> Result<Vec<(i32, i64, i64)>> {
            let committed = workload::committed(&md, partitions)?;
            let mut v = Vec::new();
            for p in 0..partitions {
                let (_, high) = md.fetch_watermarks(workload::TOPIC, p, Duration::from_secs(5))?;
                v.push((p, committed.get(&p).map(|c| c.0).unwrap_or(0), high));
            }
            Ok(v)
        })
        .await?;
        match got {
            Ok(v) => break v,
            Err(e) if attempt < 20 => {
                say!("reading the final offsets: {e:#}; again in 1 s");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => return Err(e.context("reading the final offsets")),
        }
    };
    for (partition, committed, high_watermark) in finals {
        recorder.record(
            "observer",
            history::Op::Final {
                partition,
                committed,
                high_watermark,
            },
        );
    }
    let dead = {
        let bootstrap = bootstrap.clone();
        tokio::task::spawn_blocking(move || workload::dead_letters(&bootstrap)).await?
    }
    .context("reading the dead letter topic")?;
    say!(
        "{} dead letters in {}",
        dead.len(),
        workload::DEAD_LETTER_TOPIC
    );
    for op in dead {
        recorder.record("observer", op);
    }
    // What the gateways reported of their own commits: those answered past their lease's
    // fence deadline (the commit gate's limit), which explain a regression of the committed
    // offset.
    let mut late = 0;
    for node in cluster.of_role(Role::Gateway) {
        let log =
            std::fs::read_to_string(cluster.node_dir(node).join("gateway.log")).unwrap_or_default();
        for (partition, token, offset) in history::late_commits(&log) {
            late += 1;
            recorder.record(
                &node.name,
                history::Op::LateCommit {
                    partition,
                    token,
                    offset,
                },
            );
        }
    }
    if late > 0 {
        say!("{late} late commits reported by the gateways (answered past their lease's fence deadline)");
    }
    drop(recorder);
    drop(nemesis);
    let events = writer.await?;
    let report = checker::check(&events);
    let markdown = checker::render_markdown(&report);
    std::fs::write(out.join("report.md"), &markdown)?;
    std::fs::write(
        out.join("report.json"),
        serde_json::to_string_pretty(&report)?,
    )?;
    print!("{markdown}");
    say!(
        "history: {} events in {}; report in {}",
        events.len(),
        history_path.display(),
        out.join("report.md").display()
    );
    for fault in report.faults.iter().filter(|f| !f.took_effect) {
        nemesis_errors.push(format!(
            "{} on {} was not seen to take effect: {}",
            fault.name, fault.target, fault.evidence
        ));
    }
    let all_took_effect = nemesis_errors.is_empty();
    for line in attribution(&report) {
        say!("{line}");
    }
    for e in &nemesis_errors {
        say!("a fault could not be run: {e}");
    }
    sampler.abort();
    say!(
        "run took {:.1} s; peak resident memory of the cluster and the harness {:.0} MiB",
        t0.elapsed().as_secs_f64(),
        peak_rss.load(std::sync::atomic::Ordering::Relaxed) as f64 / 1024.0
    );
    if let Some(defect) = &args.planted_defect {
        let caught = !report.valid();
        say!(
            "planted defect {defect}: {}",
            if caught {
                "caught"
            } else {
                "NOT caught: the checker found no anomaly"
            }
        );
        return Ok(caught && all_took_effect);
    }
    Ok(report.valid() && all_took_effect)
}

/// Processes that exited on their own (no fault of the nemesis's stopped them, or it would
/// have started them again): each is a failure of the run, said with the end of its log,
/// and is started again so that the run goes on.
async fn crashed(cluster: &Cluster, nemesis: &nemesis::Nemesis, errors: &mut Vec<String>) {
    for (node, what, status) in cluster.exited() {
        say!(
            "{what} on {} exited on its own ({status}); the end of its log:\n{}",
            node.name,
            cluster.log_tail(&node, &what, 30)
        );
        errors.push(format!(
            "{what} on {} exited on its own ({status})",
            node.name
        ));
        match cluster.start(&node, &what) {
            Ok(pid) => {
                say!("{what} on {} started again (pid {pid})", node.name);
                if what == "gateway" {
                    let _ = nemesis.wait_gateway(&node).await;
                }
            }
            Err(e) => say!("{what} on {} could not be started again: {e:#}", node.name),
        }
    }
}

/// For each kind of anomaly, when it first showed and the fault it followed: the last fault
/// that began before the anomaly's last event, and how long after its start it showed.
fn attribution(report: &checker::Report) -> Vec<String> {
    let mut lines = Vec::new();
    for total in &report.anomaly_totals {
        let first = report
            .anomalies
            .iter()
            .filter(|a| a.kind == total.kind)
            .map(|a| a.excerpt.iter().map(|e| e.t_ms).fold(0.0_f64, f64::max))
            .min_by(f64::total_cmp);
        let Some(at) = first else { continue };
        let fault = report
            .faults
            .iter()
            .filter(|f| f.start_ms <= at)
            .max_by(|x, y| x.start_ms.total_cmp(&y.start_ms));
        lines.push(match fault {
            Some(f) => format!(
                "{} x {}: the first at {:.0} ms, {:.0} ms after {} on {} began",
                total.count,
                total.kind,
                at,
                at - f.start_ms,
                f.name,
                f.target
            ),
            None => format!(
                "{} x {}: the first at {:.0} ms, before any fault",
                total.count, total.kind, at
            ),
        });
    }
    lines
}

/// Polls `probe` every 250 ms until it gives `Some`, for at most `deadline`, saying what it
/// waits for every 10 s.
async fn wait_until<F, Fut>(what: &str, deadline: Duration, mut probe: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<()>>,
{
    let t0 = Instant::now();
    let mut next_note = Duration::from_secs(10);
    loop {
        if probe().await.is_some() {
            say!("{what}: ready after {:.1} s", t0.elapsed().as_secs_f64());
            return Ok(());
        }
        if t0.elapsed() > deadline {
            bail!("{what}: not ready within {deadline:?}");
        }
        if t0.elapsed() > next_note {
            say!(
                "still waiting for {what} ({:.0} s)",
                t0.elapsed().as_secs_f64()
            );
            next_note += Duration::from_secs(10);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
