//! The benchmark's surroundings: the real services, the real gateway binary as child
//! processes, topics and records on the real broker, and `/proc` figures of a process.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use futures::StreamExt;
use kafka_lease_client::Client;
use kafka_lease_testkit::{GatewayProcess, Services};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;
use tokio::time::Instant;

use crate::progress::Progress;
use crate::Plan;

/// Everything a scenario needs: where the services are, which gateway binary to run with
/// which extra flags, where logs go, the counts of this mode, and the progress output.
#[derive(Debug)]
pub(crate) struct Env {
    pub(crate) services: Services,
    pub(crate) gateway_bin: PathBuf,
    pub(crate) gateway_args: Vec<String>,
    pub(crate) log_dir: PathBuf,
    pub(crate) plan: Plan,
    pub(crate) progress: Progress,
    /// Unique per run: Consul prefixes, topics and groups carry it.
    pub(crate) run_id: String,
    /// Topics created by the scenario running now, deleted when it ends
    /// ([`Env::delete_topics`]): a run's topics would otherwise pile up on the broker (a
    /// quick run creates over 2,000 partitions) until its heap runs out.
    pub(crate) topics: std::sync::Mutex<Vec<String>>,
    /// The Go client's drain program, built on first use (see [`Env::go_drain`]).
    pub(crate) go_drain: tokio::sync::OnceCell<Option<PathBuf>>,
}

impl Env {
    /// A name unique to this run and `what`, valid as a topic, group and key segment.
    pub(crate) fn name(&self, what: &str) -> String {
        kafka_lease_testkit::unique_name(&format!("bench-{what}"))
    }

    /// The Go client's drain program (`clients/go/examples/drain`), built once per run into
    /// the output folder with the Go client tests' caches (`.cache/clients/go`). `None`, said
    /// once, when `go` is not on PATH; under `CI=true` that is an error.
    pub(crate) async fn go_drain(&self) -> Result<Option<PathBuf>> {
        self.go_drain
            .get_or_try_init(|| self.build_go_drain())
            .await
            .cloned()
    }

    async fn build_go_drain(&self) -> Result<Option<PathBuf>> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let source = root.join("clients/go");
        let has_go = std::process::Command::new("go")
            .arg("version")
            .output()
            .is_ok_and(|o| o.status.success());
        if !has_go || !source.join("examples/drain").is_dir() {
            let why = if has_go {
                format!("{} is missing", source.join("examples/drain").display())
            } else {
                "go is not on PATH".to_string()
            };
            if kafka_lease_testkit::is_ci() {
                bail!("the Go client arm of the drain scenarios cannot run: {why}");
            }
            self.progress.say(format!(
                "the Go client arm of the drain scenarios is skipped: {why} (install Go 1.23 or newer to measure it)"
            ));
            return Ok(None);
        }
        let out_dir = self.log_dir.parent().unwrap_or(&self.log_dir);
        let binary =
            std::path::absolute(out_dir.join("go-drain")).context("the Go drain program's path")?;
        let cache = std::path::absolute(root.join(".cache/clients/go"))
            .context("the Go client's cache path")?;
        let building = Arc::new(AtomicU64::new(0));
        let _ticker = self.progress.ticker(
            "building the Go client's drain program (clients/go/examples/drain)",
            building.clone(),
            1,
            "builds",
        );
        let started = Instant::now();
        let output = tokio::process::Command::new("go")
            .current_dir(&source)
            .args(["build", "-o"])
            .arg(&binary)
            .arg("./examples/drain")
            .env("GOTOOLCHAIN", "local")
            .env("GOFLAGS", "-modcacherw")
            .env("GOPATH", cache.join("gopath"))
            .env("GOMODCACHE", cache.join("gopath/pkg/mod"))
            .env("GOCACHE", cache.join("gocache"))
            .output()
            .await
            .context("running go build")?;
        if !output.status.success() {
            bail!(
                "go build of clients/go/examples/drain failed ({}): {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        building.store(1, Ordering::Relaxed);
        self.progress.say(format!(
            "built the Go client's drain program in {:.1}s",
            started.elapsed().as_secs_f64()
        ));
        Ok(Some(binary))
    }

    /// Deletes the topics the scenario created. A failure is said, not fatal: the scenario's
    /// figures stand.
    pub(crate) async fn delete_topics(&self) {
        let topics = std::mem::take(&mut *self.topics.lock().unwrap_or_else(|e| e.into_inner()));
        let names: Vec<&str> = topics.iter().map(String::as_str).collect();
        if let Err(e) =
            kafka_lease_testkit::delete_topics(&self.services.kafka_bootstrap, &names).await
        {
            self.progress
                .say(format!("  could not delete the scenario's topics: {e}"));
        }
    }

    /// A fresh Consul key prefix for one scenario.
    pub(crate) fn prefix(&self, scenario: &str) -> String {
        format!("kafka-lease-bench/{}/{scenario}", self.run_id)
    }

    /// librdkafka settings of a direct consumer that match the gateway's per-group consumer
    /// (`GroupClient::new` in crates/kafka-lease-server/src/kafka/group.rs): same fetch and queue
    /// settings, including what `--gateway-arg` changes (`--fetch-queue-kbytes`,
    /// `--kafka-config`).
    pub(crate) fn direct_consumer_config(&self, group: &str) -> ClientConfig {
        let mut fetch_queue_kbytes = "2048".to_string();
        let mut options: Vec<(String, String)> = Vec::new();
        let mut args = self.gateway_args.iter();
        while let Some(arg) = args.next() {
            let (flag, inline) = match arg.split_once('=') {
                Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
                _ => (arg.as_str(), None),
            };
            let mut value = || inline.clone().or_else(|| args.next().cloned());
            match flag {
                "--fetch-queue-kbytes" => {
                    if let Some(v) = value() {
                        fetch_queue_kbytes = v;
                    }
                }
                "--kafka-config" | "--kafka-option" => {
                    if let Some((k, v)) = value().as_deref().and_then(|kv| kv.split_once('=')) {
                        options.push((k.to_string(), v.to_string()));
                    }
                }
                _ => {}
            }
        }
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", &self.services.kafka_bootstrap)
            .set("client.id", format!("kafka-lease-bench-direct-{group}"))
            .set("socket.keepalive.enable", "true")
            .set("reconnect.backoff.max.ms", "1000")
            .set("reconnect.backoff.ms", "20")
            .set("topic.metadata.refresh.interval.ms", "30000")
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", "false")
            .set("auto.offset.reset", "earliest")
            .set("queued.max.messages.kbytes", fetch_queue_kbytes)
            .set("queued.min.messages", "10000")
            .set("fetch.queue.backoff.ms", "2")
            .set("fetch.wait.max.ms", "20");
        for (k, v) in options {
            config.set(k, v);
        }
        config
    }
}

/// A `kafka-lease serve` child process on 127.0.0.1 with a port of its own: the launcher the
/// tests use too ([`kafka_lease_testkit::GatewayProcess`]), with the benchmark's settings.
#[derive(Debug)]
pub(crate) struct Gateway {
    inner: GatewayProcess,
    pub(crate) addr: String,
    pub(crate) instance: String,
}

impl Gateway {
    /// Starts the gateway binary against the services (or against `consul` instead of the
    /// real Consul address, for the counting proxy), with lock keys under `prefix`, and waits
    /// until it prints the address it listens on.
    pub(crate) async fn start(
        env: &Env,
        prefix: &str,
        instance: &str,
        consul: Option<&str>,
    ) -> Result<Gateway> {
        let log_path = env.log_dir.join(format!("{instance}.log"));
        let consul = consul.unwrap_or(&env.services.consul_http_addr);
        let mut args = vec![
            "--kafka",
            &env.services.kafka_bootstrap,
            "--consul",
            consul,
            "--consul-prefix",
            prefix,
            "--log-format",
            "json",
        ];
        args.extend(env.gateway_args.iter().map(String::as_str));
        let inner = GatewayProcess::spawn(&env.gateway_bin, &args, instance, log_path)
            .await
            .map_err(|e| anyhow!(e))?;
        Ok(Gateway {
            addr: inner.addr.clone(),
            instance: inner.instance.clone(),
            inner,
        })
    }

    pub(crate) fn endpoint(&self) -> String {
        self.inner.endpoint()
    }

    /// A new client connection (its own HTTP/2 channel).
    pub(crate) async fn client(&self) -> Result<Client> {
        Client::connect(self.endpoint())
            .await
            .with_context(|| format!("connecting to gateway {} at {}", self.instance, self.addr))
    }

    pub(crate) fn pid(&self) -> u32 {
        self.inner.pid()
    }

    /// SIGKILL, at once; does not wait.
    pub(crate) fn kill(&mut self) -> Result<()> {
        self.inner.signal("KILL").map_err(|e| anyhow!(e))
    }

    /// Sends a signal by name (`STOP`, `CONT`, ...).
    pub(crate) fn signal(&self, signal: &str) -> Result<()> {
        self.inner.signal(signal).map_err(|e| anyhow!(e))
    }

    /// SIGTERM (the gateway releases its locks and exits), SIGKILL after 20 s.
    pub(crate) async fn stop(self) {
        self.inner.stop(Duration::from_secs(20)).await;
    }

    /// Waits for a killed gateway to be reaped.
    pub(crate) async fn reap(self) {
        self.inner.kill().await;
    }
}

/// The `VmRSS` (bytes) and `Threads` of a process, from `/proc/<pid>/status`.
pub(crate) fn proc_status(pid: u32) -> Result<(u64, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    let field = |name: &str| -> Result<u64> {
        let line = text
            .lines()
            .find(|l| l.starts_with(name))
            .ok_or_else(|| anyhow!("/proc/{pid}/status has no {name}"))?;
        let number = line[name.len()..]
            .split_whitespace()
            .next()
            .ok_or_else(|| anyhow!("empty {name} line"))?;
        number
            .parse::<u64>()
            .with_context(|| format!("parsing {name} {number:?}"))
    };
    Ok((field("VmRSS:")? * 1024, field("Threads:")?))
}

/// CPU time every core of the machine has spent busy so far (user, nice, system, irq,
/// softirq and steal; not idle or iowait), from the first line of `/proc/stat`, in seconds:
/// over a drain, what every process on the machine spent (the broker's part included).
pub(crate) fn machine_busy_seconds() -> Result<f64> {
    let text = std::fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
    let line = text
        .lines()
        .next()
        .filter(|l| l.starts_with("cpu "))
        .ok_or_else(|| anyhow!("/proc/stat does not start with the cpu line"))?;
    let ticks: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|t| {
            t.parse::<u64>()
                .with_context(|| format!("parsing /proc/stat's {t:?}"))
        })
        .collect::<Result<_>>()?;
    // user nice system idle iowait irq softirq steal (guest time is inside user already).
    let busy = [0, 1, 2, 5, 6, 7]
        .iter()
        .map(|&i| ticks.get(i).copied().unwrap_or(0))
        .sum::<u64>();
    Ok(busy as f64 / clock_ticks_per_second())
}

/// CPU time (user + system, every thread) a process has used so far, from
/// `/proc/<pid>/stat`, in seconds (clock-tick resolution, 10 ms on Linux).
pub(crate) fn proc_cpu_seconds(pid: u32) -> Result<f64> {
    stat_cpu_seconds(&format!("/proc/{pid}/stat"))
}

/// CPU time (user + system) the calling thread has used so far, from
/// `/proc/thread-self/stat`, in seconds.
pub(crate) fn thread_cpu_seconds() -> Result<f64> {
    stat_cpu_seconds("/proc/thread-self/stat")
}

fn stat_cpu_seconds(path: &str) -> Result<f64> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
    // The command name, field 2, is in parentheses and may hold spaces: count from after it.
    let rest = text
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .ok_or_else(|| anyhow!("{path} has no command name"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line; `rest` starts at field 3.
    let ticks = |i: usize| -> Result<u64> {
        fields
            .get(i)
            .ok_or_else(|| anyhow!("{path} is short"))?
            .parse::<u64>()
            .with_context(|| format!("parsing {path} field {}", i + 3))
    };
    Ok((ticks(11)? + ticks(12)?) as f64 / clock_ticks_per_second())
}

/// `sysconf(_SC_CLK_TCK)`, asked of `getconf` once; 100 (Linux's value) if it cannot say.
fn clock_ticks_per_second() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|t| t.trim().parse::<f64>().ok())
            .filter(|t| *t > 0.0)
            .unwrap_or(100.0)
    })
}

/// Creates `topic` with `partitions` partitions and waits until the broker's metadata lists
/// every partition with a leader.
/// Creates `topic`, to be deleted when the scenario ends.
pub(crate) async fn create_topic(env: &Env, topic: &str, partitions: i32) -> Result<()> {
    env.topics
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(topic.to_string());
    kafka_lease_testkit::create_topic(&env.services.kafka_bootstrap, topic, partitions)
        .await
        .map_err(|e| anyhow!(e))
}

/// A producer for bulk loading: batches, acks from the leader.
pub(crate) fn bulk_producer(env: &Env) -> Result<FutureProducer> {
    ClientConfig::new()
        .set("bootstrap.servers", &env.services.kafka_bootstrap)
        .set("linger.ms", "5")
        .set("batch.size", "1000000")
        .set("acks", "1")
        .set("queue.buffering.max.messages", "1000000")
        .create()
        .context("producer")
}

/// Produces `per_partition` records with values of `value_size` bytes to each of
/// `partitions` (round-robin), and waits until every one is acknowledged.
pub(crate) async fn produce_fill(
    env: &Env,
    label: &str,
    topic: &str,
    partitions: i32,
    per_partition: usize,
    value_size: usize,
) -> Result<()> {
    produce(
        env,
        label,
        topic,
        partitions,
        per_partition,
        value_size,
        None,
    )
    .await
}

/// Produces `count` records of `value_size` bytes to partition 0 of `topic`, keyed `k<i mod
/// keys>`, and waits until every one is acknowledged.
pub(crate) async fn produce_keyed(
    env: &Env,
    label: &str,
    topic: &str,
    count: usize,
    keys: usize,
    value_size: usize,
) -> Result<()> {
    produce(env, label, topic, 1, count, value_size, Some(keys)).await
}

async fn produce(
    env: &Env,
    label: &str,
    topic: &str,
    partitions: i32,
    per_partition: usize,
    value_size: usize,
    keys: Option<usize>,
) -> Result<()> {
    let producer = bulk_producer(env)?;
    let value: Vec<u8> = (0..value_size).map(|i| (i % 251) as u8).collect();
    let total = per_partition * partitions as usize;
    let done = Arc::new(AtomicU64::new(0));
    let _ticker = env.progress.ticker(
        format!("{label} producing"),
        done.clone(),
        total as u64,
        "records",
    );
    let started = Instant::now();
    let producer_ref = &producer;
    let value_ref = value.as_slice();
    let done_ref = &done;
    let mut results = futures::stream::iter(0..total)
        .map(|i| async move {
            let partition = (i % partitions as usize) as i32;
            let key = keys.map(|keys| format!("k{}", i % keys));
            let mut record = FutureRecord::<[u8], [u8]>::to(topic)
                .partition(partition)
                .payload(value_ref);
            if let Some(key) = &key {
                record = record.key(key.as_bytes());
            }
            let r = producer_ref.send(record, Duration::from_secs(30)).await;
            done_ref.fetch_add(1, Ordering::Relaxed);
            r.map(|_| ()).map_err(|(e, _)| e)
        })
        .buffer_unordered(50_000);
    while let Some(r) = results.next().await {
        r.context("producing")?;
    }
    let over = keys.map_or(String::new(), |keys| format!(" over {keys} keys"));
    env.progress.say(format!(
        "  {label}: produced {total} records of {value_size} B{over} in {:.1}s",
        started.elapsed().as_secs_f64()
    ));
    Ok(())
}
