//! Drain scenarios: read a pre-produced partition (or 16) to the end, through the gateway
//! (the Rust client crate over loopback) versus a direct rdkafka consumer.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use kafka_lease_client::{AcquireOptions, Client, EpochFilter, ReadOptions, RecordStream};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use serde_json::{json, Map, Value};
use tokio::time::Instant;

use super::{acquire, r3, ratio, Row};
use crate::env::{
    create_topic, machine_busy_seconds, proc_cpu_seconds, produce_fill, thread_cpu_seconds, Env,
    Gateway,
};
use crate::report::{Chart, ScenarioResult, NO_GOAL};
use crate::stats::{median, min_max};

/// The Read options of the gateway arm: the largest batches the contract allows, and a short
/// fill wait so the last batch of a drain does not sit out the default 100 ms.
const READ_MAX_RECORDS: u32 = 10_000;
const READ_MAX_BYTES: u32 = 4 * 1024 * 1024;
const READ_MAX_WAIT: Duration = Duration::from_millis(10);

/// How the direct arm reads.
pub(crate) const CONSUMER_STYLE: &str =
    "rdkafka BaseConsumer: assign() (no group join, like the gateway), \
     poll() of the consumer's queue in a loop on one dedicated thread, one message at a time; \
     librdkafka settings as the gateway's per-group consumer (GroupClient::new: \
     queued.max.messages.kbytes=2048, queued.min.messages=10000, fetch.wait.max.ms=20, \
     fetch.queue.backoff.ms=2, reconnect.backoff.ms=20, auto commit off)";

/// How long one drain may take before the scenario fails.
const DRAIN_DEADLINE: Duration = Duration::from_secs(600);

/// One drain of one arm.
#[derive(Debug, Clone)]
struct DrainRun {
    records: u64,
    bytes: u64,
    secs: f64,
    /// records/s of each partition: its record count over the time its last record arrived.
    partition_rates: Vec<f64>,
    /// When the first record arrived (seconds after the start), the earliest over partitions.
    first_record_secs: f64,
    /// Records and value bytes that arrived with the first record (its batch, for the
    /// gateway): not counted in the steady-state rate, whose clock starts then.
    first_records: u64,
    first_bytes: u64,
    /// CPU time (user + system) the arm's process used during the drain: the gateway's, or
    /// the bench's own for the direct consumer (which runs in it). `None` when not measured.
    cpu_secs: Option<f64>,
    /// For the gateway arm: the CPU time of the bench process (the Rust client crate
    /// decoding the responses) over the drain.
    client_cpu_secs: Option<f64>,
    /// The machine's busy CPU seconds so far (`machine_busy_seconds`) when the first record
    /// arrived: the start of the steady window. `None` when not read.
    machine_at_first_record: Option<f64>,
    /// CPU time every process on the machine used over the steady window, from the first
    /// record to the last (`/proc/stat`): the broker, the arm's process, its client and
    /// anything else running. `None` when not measured.
    machine_cpu_secs: Option<f64>,
    /// Responses the gateway arm's Reads received (0 for the other arms).
    responses: u64,
}

impl DrainRun {
    /// Microseconds of the client's CPU per record (gateway arm).
    fn client_cpu_us_per_record(&self) -> Option<f64> {
        self.client_cpu_secs
            .filter(|_| self.records > 0)
            .map(|cpu| cpu * 1e6 / self.records as f64)
    }
    /// Notes the machine's busy CPU seconds at the end of the drain (`end`), for the
    /// steady window's CPU.
    fn machine_until(&mut self, end: f64) {
        self.machine_cpu_secs = self.machine_at_first_record.map(|first| end - first);
    }
    /// Microseconds of the whole machine's CPU per record over the steady window (the
    /// records the steady rate counts).
    fn machine_cpu_us_per_record(&self) -> Option<f64> {
        self.machine_cpu_secs
            .filter(|_| !self.steady_window_empty())
            .map(|cpu| cpu * 1e6 / (self.records - self.first_records) as f64)
    }
    /// How many of the machine's cores were busy on average over the steady window.
    fn busy_cores(&self) -> Option<f64> {
        self.machine_cpu_secs
            .filter(|_| !self.steady_window_empty())
            .map(|cpu| cpu / (self.secs - self.first_record_secs))
    }
    /// Microseconds of CPU per record drained.
    fn cpu_us_per_record(&self) -> Option<f64> {
        self.cpu_secs
            .filter(|_| self.records > 0)
            .map(|cpu| cpu * 1e6 / self.records as f64)
    }
    /// Steady-state drain rate: the records after the first arrival over the time from the
    /// first arrival to the last record.
    /// (With tiny counts everything can come in the first batch: then the end-to-end rate.)
    fn rate(&self) -> f64 {
        if self.steady_window_empty() {
            return self.end_to_end_rate();
        }
        (self.records - self.first_records) as f64 / (self.secs - self.first_record_secs)
    }
    fn mb_s(&self) -> f64 {
        if self.steady_window_empty() {
            return self.bytes as f64 / 1e6 / self.secs;
        }
        (self.bytes - self.first_bytes) as f64 / 1e6 / (self.secs - self.first_record_secs)
    }
    fn steady_window_empty(&self) -> bool {
        self.records <= self.first_records || self.secs <= self.first_record_secs
    }
    /// Including start-up: all records over the time from the start to the last record.
    fn end_to_end_rate(&self) -> f64 {
        self.records as f64 / self.secs
    }
    fn fairness(&self) -> f64 {
        let (lo, hi) = min_max(&self.partition_rates);
        lo / hi
    }
}

fn read_options() -> ReadOptions {
    ReadOptions::new()
        .max_records(READ_MAX_RECORDS)
        .max_bytes(READ_MAX_BYTES)
        .max_wait(READ_MAX_WAIT)
}

/// How the gateway arm reads each lease.
#[derive(Clone, Copy)]
enum ReadVia<'a> {
    /// With the Rust client, through the client that acquired the lease.
    Lease,
    /// With the Rust client, through the matching client of another gateway instance, which
    /// forwards the Read.
    Other(&'a [Client]),
    /// Through the matching channel to the same gateway, with a reader that only counts the
    /// records ([`super::discard`]): the relay arm's reader's equal.
    Counting(&'a [tonic::transport::Channel]),
}

/// A lease's Read, however the arm reads it: batches of records, or counts of them.
enum Reading {
    Records(RecordStream),
    Counts(tonic::Streaming<super::discard::Counted>),
}

impl Reading {
    /// The next response's records and value bytes; `None` at the stream's end.
    async fn next(&mut self) -> Option<Result<(u64, u64)>> {
        match self {
            Reading::Records(stream) => stream.next_batch().await.map(|batch| {
                let batch = batch.map_err(|e| anyhow!(e).context("Read failed"))?;
                let size: u64 = batch
                    .records
                    .iter()
                    .map(|r| r.value.as_ref().map_or(0, |v| v.len()) as u64)
                    .sum();
                Ok((batch.records.len() as u64, size))
            }),
            Reading::Counts(stream) => stream.message().await.transpose().map(|counted| {
                let counted = counted.map_err(|e| anyhow!(e).context("Read failed"))?;
                Ok((counted.records, counted.value_bytes))
            }),
        }
    }
}

/// Gateway arm: every client acquires its partitions (concurrently) and reads each to
/// `per_partition` records as `read_via` says. Timed from just before the Acquires to the
/// last record.
async fn gateway_drain(
    env: &Env,
    clients: &[Client],
    read_via: ReadVia<'_>,
    topic: &str,
    layout: &[Vec<i32>],
    per_partition: u64,
    done: Arc<AtomicU64>,
) -> Result<DrainRun> {
    let group = env.name("drain");
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for (i, (client, partitions)) in clients.iter().zip(layout).enumerate() {
        let reader = match read_via {
            ReadVia::Lease => None,
            ReadVia::Other(via) => Some(Ok(via[i].clone())),
            ReadVia::Counting(channels) => Some(Err(channels[i].clone())),
        };
        for &partition in partitions {
            let reader = reader.clone();
            let client = client.clone();
            let group = group.clone();
            let topic = topic.to_string();
            let done = done.clone();
            tasks.push(tokio::spawn(async move {
                let lease = acquire(
                    &client,
                    AcquireOptions::new(group, topic)
                        .partition(partition)
                        .member("bench-drain")
                        .ttl(Duration::from_secs(60)),
                )
                .await?;
                let request = || kafka_lease_client::proto::ReadRequest {
                    lease_id: lease.lease_id().to_string(),
                    max_records: READ_MAX_RECORDS,
                    max_bytes: READ_MAX_BYTES,
                    max_wait: Some(prost_types::Duration {
                        seconds: 0,
                        nanos: READ_MAX_WAIT.as_nanos() as i32,
                    }),
                    from_offset: None,
                    if_seek_epoch: None,
                };
                let mut stream = match reader {
                    None => Reading::Records(lease.records(read_options()).await.context("Read")?),
                    Some(Err(channel)) => {
                        Reading::Counts(super::discard::read(channel, request()).await?)
                    }
                    Some(Ok(reader)) => {
                        let inner = reader
                            .raw()
                            .read(request())
                            .await
                            .context("Read through the other instance")?
                            .into_inner();
                        Reading::Records(RecordStream::new(inner, EpochFilter::new()))
                    }
                };
                let (mut n, mut bytes, mut responses) = (0_u64, 0_u64, 0_u64);
                let mut machine_at_first = None;
                let mut first = (f64::NAN, 0_u64, 0_u64);
                while n < per_partition {
                    match stream.next().await {
                        Some(Ok((records, size))) => {
                            if n == 0 {
                                first = (t0.elapsed().as_secs_f64(), records, size);
                                machine_at_first = machine_busy_seconds().ok();
                            }
                            bytes += size;
                            responses += 1;
                            n += records;
                            done.fetch_add(records, Ordering::Relaxed);
                        }
                        Some(Err(e)) => return Err(e),
                        None => bail!("the Read ended after {n} records"),
                    }
                }
                let finish = t0.elapsed().as_secs_f64();
                drop(stream);
                let _ = lease.release().await;
                Ok::<_, anyhow::Error>((n, bytes, responses, finish, first, machine_at_first))
            }));
        }
    }
    let joined = tokio::time::timeout(DRAIN_DEADLINE, futures::future::join_all(tasks))
        .await
        .map_err(|_| anyhow!("gateway drain took longer than {DRAIN_DEADLINE:?}"))?;
    let mut run = DrainRun {
        records: 0,
        bytes: 0,
        secs: 0.0,
        partition_rates: Vec::new(),
        first_record_secs: f64::INFINITY,
        first_records: 0,
        first_bytes: 0,
        cpu_secs: None,
        client_cpu_secs: None,
        machine_at_first_record: None,
        machine_cpu_secs: None,
        responses: 0,
    };
    let mut finishes = Vec::new();
    for j in joined {
        let (n, bytes, responses, finish, (first, first_n, first_b), machine_at_first) =
            j.context("drain task panicked")??;
        run.responses += responses;
        if first < run.first_record_secs {
            run.first_record_secs = first;
            run.machine_at_first_record = machine_at_first;
            run.first_records = first_n;
            run.first_bytes = first_b;
        }
        finishes.push((n, finish));
        run.records += n;
        run.bytes += bytes;
        run.secs = run.secs.max(finish);
    }
    // A partition whose records all arrived with the arm's first batch has no measurable span
    // after the first record (tiny smoke-mode counts); time it from the arm's start instead,
    // so its rate stays finite and the fairness ratio meaningful.
    run.partition_rates = finishes
        .iter()
        .map(|(n, finish)| {
            let span = finish - run.first_record_secs;
            *n as f64 / if span > 1e-3 { span } else { *finish }
        })
        .collect();
    Ok(run)
}

/// Direct arm: one consumer assigned every partition from the beginning, polled on a
/// blocking thread until each partition delivered `per_partition` records. Timed from just
/// before the consumer is created to the last record.
async fn direct_drain(
    env: &Env,
    topic: &str,
    partitions: &[i32],
    per_partition: u64,
    done: Arc<AtomicU64>,
) -> Result<DrainRun> {
    consumer_drain(
        env,
        ConsumerArm::Direct,
        topic,
        partitions,
        per_partition,
        done,
    )
    .await
}

/// Relay arm, the physical limit of a gateway on this machine: what any process between
/// Kafka and a client must at least do. The direct consumer, with every record's bytes sent
/// on over loopback TCP to a reader that discards them: no protocol, no framing beyond
/// lengths, no per-record allocation. Its CPU is the bench process's minus the reader's.
async fn relay_drain(
    env: &Env,
    topic: &str,
    partitions: &[i32],
    per_partition: u64,
    done: Arc<AtomicU64>,
) -> Result<DrainRun> {
    consumer_drain(
        env,
        ConsumerArm::Relay,
        topic,
        partitions,
        per_partition,
        done,
    )
    .await
}

/// The arms whose consumer runs in the bench process.
#[derive(Clone, Copy, Debug)]
enum ConsumerArm {
    Direct,
    Relay,
}

/// Runs a consumer arm on a blocking thread, with a consumer of its own.
async fn consumer_drain(
    env: &Env,
    arm: ConsumerArm,
    topic: &str,
    partitions: &[i32],
    per_partition: u64,
    done: Arc<AtomicU64>,
) -> Result<DrainRun> {
    let name = match arm {
        ConsumerArm::Direct => "direct",
        ConsumerArm::Relay => "relay",
    };
    let config = env.direct_consumer_config(&env.name(name));
    let topic = topic.to_string();
    let partitions = partitions.to_vec();
    tokio::task::spawn_blocking(move || match arm {
        ConsumerArm::Direct => direct_drain_blocking(
            config,
            &topic,
            &partitions,
            per_partition,
            &done,
            &mut |_| Ok(()),
        ),
        ConsumerArm::Relay => {
            relay_drain_blocking(config, &topic, &partitions, per_partition, &done)
        }
    })
    .await
    .with_context(|| format!("{name} drain thread panicked"))?
}

/// How the relay arm writes.
pub(crate) const RELAY_STYLE: &str =
    "the direct arm's consumer, writing each record (offset, timestamp, key and value with \
     4-byte length prefixes) into a 64 KiB buffer that goes to a loopback TCP socket when full; \
     another thread of the bench reads the socket into a 256 KiB buffer and discards it. CPU: \
     the bench process's over the drain minus the reading thread's (the client's part)";

/// The size of the relay arm's writes.
const RELAY_WRITE: usize = 64 * 1024;

/// The relay arm's work, on the calling (blocking) thread.
fn relay_drain_blocking(
    config: ClientConfig,
    topic: &str,
    partitions: &[i32],
    per_partition: u64,
    done: &AtomicU64,
) -> Result<DrainRun> {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("relay listener")?;
    let address = listener.local_addr()?;
    let reader = std::thread::spawn(move || -> Result<(u64, f64)> {
        let (mut socket, _) = listener.accept().context("relay accept")?;
        let cpu0 = thread_cpu_seconds()?;
        let mut buf = vec![0_u8; 256 * 1024];
        let mut total = 0_u64;
        loop {
            match socket.read(&mut buf).context("relay read")? {
                0 => break,
                n => total += n as u64,
            }
        }
        Ok((total, thread_cpu_seconds()? - cpu0))
    });
    let mut socket = std::net::TcpStream::connect(address).context("relay connect")?;
    socket.set_nodelay(true)?;
    let mut out = Vec::with_capacity(RELAY_WRITE + 64 * 1024);
    let pid = std::process::id();
    let cpu0 = proc_cpu_seconds(pid)?;
    let mut run =
        direct_drain_blocking(config, topic, partitions, per_partition, done, &mut |m| {
            let key = m.key().unwrap_or_default();
            let value = m.payload().unwrap_or_default();
            out.extend_from_slice(&m.offset().to_le_bytes());
            out.extend_from_slice(&m.timestamp().to_millis().unwrap_or(-1).to_le_bytes());
            out.extend_from_slice(&(key.len() as u32).to_le_bytes());
            out.extend_from_slice(key);
            out.extend_from_slice(&(value.len() as u32).to_le_bytes());
            out.extend_from_slice(value);
            if out.len() >= RELAY_WRITE {
                socket.write_all(&out).context("relay write")?;
                out.clear();
            }
            Ok(())
        })?;
    socket.write_all(&out).context("relay write")?;
    socket.shutdown(std::net::Shutdown::Write)?;
    let (_, reader_cpu) = reader
        .join()
        .map_err(|_| anyhow!("relay reader panicked"))??;
    // Both at clock-tick resolution: tiny (smoke-mode) drains can come out below zero.
    run.cpu_secs = Some((proc_cpu_seconds(pid)? - cpu0 - reader_cpu).max(0.0));
    Ok(run)
}

/// The steady rate of one direct drain of `partitions` partitions (0..), for other
/// scenarios' baselines.
pub(crate) async fn direct_rate(
    env: &Env,
    topic: &str,
    partitions: i32,
    per_partition: u64,
) -> Result<f64> {
    let all: Vec<i32> = (0..partitions).collect();
    Ok(
        direct_drain(env, topic, &all, per_partition, Arc::default())
            .await?
            .rate(),
    )
}

/// The relay arm over `partitions` (see [`relay_drain`]): its steady records/s, its CPU per
/// record and the whole machine's CPU per record over the whole drain (start-up included),
/// for a scenario that measures the gateway otherwise.
pub(crate) async fn relay_rate(
    env: &Env,
    topic: &str,
    partitions: i32,
    per_partition: u64,
) -> Result<(f64, Option<f64>, f64)> {
    let all: Vec<i32> = (0..partitions).collect();
    let machine0 = machine_busy_seconds()?;
    let run = relay_drain(env, topic, &all, per_partition, Arc::default()).await?;
    let machine = (machine_busy_seconds()? - machine0) * 1e6 / run.records.max(1) as f64;
    Ok((run.rate(), run.cpu_us_per_record(), machine))
}

/// The direct consumer's loop; `sink` sees every record (the relay arm writes it on).
fn direct_drain_blocking(
    config: ClientConfig,
    topic: &str,
    partitions: &[i32],
    per_partition: u64,
    done: &AtomicU64,
    sink: &mut dyn FnMut(&BorrowedMessage<'_>) -> Result<()>,
) -> Result<DrainRun> {
    let t0 = Instant::now();
    let consumer: BaseConsumer = config.create().context("direct consumer")?;
    let mut list = TopicPartitionList::new();
    for &p in partitions {
        list.add_partition_offset(topic, p, Offset::Beginning)?;
    }
    consumer.assign(&list).context("assign")?;
    let mut counts: HashMap<i32, u64> = HashMap::new();
    let mut finish: HashMap<i32, f64> = HashMap::new();
    let mut bytes = 0_u64;
    let mut errors = 0_u32;
    let mut first = f64::NAN;
    let mut first_bytes = 0_u64;
    let mut machine_at_first = None;
    while finish.len() < partitions.len() {
        if t0.elapsed() > DRAIN_DEADLINE {
            bail!("direct drain took longer than {DRAIN_DEADLINE:?}");
        }
        match consumer.poll(Duration::from_millis(100)) {
            None => {}
            Some(Err(e)) => {
                errors += 1;
                if errors > 100 {
                    bail!("direct consumer keeps failing: {e}");
                }
            }
            Some(Ok(m)) => {
                sink(&m)?;
                if first.is_nan() {
                    first = t0.elapsed().as_secs_f64();
                    first_bytes = m.payload().map_or(0, <[u8]>::len) as u64;
                    machine_at_first = machine_busy_seconds().ok();
                }
                bytes += m.payload().map_or(0, <[u8]>::len) as u64;
                let c = counts.entry(m.partition()).or_insert(0);
                *c += 1;
                done.fetch_add(1, Ordering::Relaxed);
                if *c == per_partition {
                    finish.insert(m.partition(), t0.elapsed().as_secs_f64());
                }
            }
        }
    }
    let secs = finish.values().copied().fold(0.0, f64::max);
    Ok(DrainRun {
        first_record_secs: first,
        first_records: 1,
        first_bytes,
        cpu_secs: None,
        client_cpu_secs: None,
        machine_at_first_record: machine_at_first,
        machine_cpu_secs: None,
        responses: 0,
        records: counts.values().sum(),
        bytes,
        secs,
        partition_rates: partitions
            .iter()
            .map(|p| {
                counts.get(p).copied().unwrap_or(0) as f64
                    / finish.get(p).copied().unwrap_or(f64::NAN)
            })
            .collect(),
    })
}

/// Runs both arms `rounds` times, gateway first in each round, after one unmeasured warm-up
/// drain of each arm (a tenth of the records). Each arm's CPU is that of its process: the
/// gateway (`gateway_pid`) for the gateway arm, the bench itself for the direct one.
async fn rounds(
    env: &Env,
    name: &str,
    side: GatewaySide<'_>,
    topic: &str,
    layout: &[Vec<i32>],
    per_partition: u64,
) -> Result<Arms> {
    let GatewaySide {
        gateway,
        clients,
        go_client,
    } = side;
    let gateway_pid = gateway.pid();
    let partitions: Vec<i32> = layout.iter().flatten().copied().collect();
    let total = per_partition * partitions.len() as u64;
    let warm = (per_partition / 10).max(1);
    env.progress.say(format!(
        "  {name}: warm-up (gateway, direct: {} records each)",
        warm * partitions.len() as u64
    ));
    gateway_drain(
        env,
        clients,
        ReadVia::Lease,
        topic,
        layout,
        warm,
        Arc::default(),
    )
    .await?;
    let channels = counting_channels(gateway, layout.len()).await?;
    gateway_drain(
        env,
        clients,
        ReadVia::Counting(&channels),
        topic,
        layout,
        warm,
        Arc::default(),
    )
    .await?;
    direct_drain(env, topic, &partitions, warm, Arc::default()).await?;
    relay_drain(env, topic, &partitions, warm, Arc::default()).await?;
    if let Some(binary) = go_client {
        go_drain(env, binary, gateway, topic, layout, warm, Arc::default()).await?;
    }
    let mut out = Vec::new();
    let mut relays = Vec::new();
    let mut counting = Vec::new();
    let mut gos = Vec::new();
    for round in 1..=env.plan.rounds {
        let label = format!("{name} round {round}/{}", env.plan.rounds);
        let g = measured_gateway_drain(
            env,
            (&label, "gateway", "client"),
            gateway_pid,
            clients,
            ReadVia::Lease,
            (topic, layout, per_partition),
        )
        .await?;
        let done = Arc::new(AtomicU64::new(0));
        let d = {
            let _t = env
                .progress
                .ticker(format!("{label} direct"), done.clone(), total, "records");
            let cpu0 = proc_cpu_seconds(std::process::id())?;
            let mut run = direct_drain(env, topic, &partitions, per_partition, done).await?;
            run.machine_until(machine_busy_seconds()?);
            run.cpu_secs = Some(proc_cpu_seconds(std::process::id())? - cpu0);
            run
        };
        env.progress.say(format!(
            "  {label} direct: {total} records in {:.2}s, first after {:.3}s; steady {:.0} records/s, {:.1} MB/s; consumer CPU {:.2} us/record; machine CPU {:.2} us/record, {:.2} cores busy",
            d.secs,
            d.first_record_secs,
            d.rate(),
            d.mb_s(),
            d.cpu_us_per_record().unwrap_or(f64::NAN),
            d.machine_cpu_us_per_record().unwrap_or(f64::NAN),
            d.busy_cores().unwrap_or(f64::NAN)
        ));
        let done = Arc::new(AtomicU64::new(0));
        let r = {
            let _t = env
                .progress
                .ticker(format!("{label} relay"), done.clone(), total, "records");
            let mut run = relay_drain(env, topic, &partitions, per_partition, done).await?;
            run.machine_until(machine_busy_seconds()?);
            run
        };
        env.progress.say(format!(
            "  {label} relay (the limit): {total} records in {:.2}s; steady {:.0} records/s, {:.1} MB/s; relay CPU {:.2} us/record; machine CPU {:.2} us/record, {:.2} cores busy",
            r.secs,
            r.rate(),
            r.mb_s(),
            r.cpu_us_per_record().unwrap_or(f64::NAN),
            r.machine_cpu_us_per_record().unwrap_or(f64::NAN),
            r.busy_cores().unwrap_or(f64::NAN)
        ));
        let c = measured_gateway_drain(
            env,
            (&label, "gateway, counting reader", "reader"),
            gateway_pid,
            clients,
            ReadVia::Counting(&channels),
            (topic, layout, per_partition),
        )
        .await?;
        counting.push(c);
        if let Some(binary) = go_client {
            let done = Arc::new(AtomicU64::new(0));
            let _t =
                env.progress
                    .ticker(format!("{label} Go client"), done.clone(), total, "records");
            let cpu0 = proc_cpu_seconds(gateway_pid)?;
            let mut run =
                go_drain(env, binary, gateway, topic, layout, per_partition, done).await?;
            run.cpu_secs = Some(proc_cpu_seconds(gateway_pid)? - cpu0);
            env.progress.say(format!(
                "  {label} Go client: {total} records in {:.2}s, first after {:.3}s; steady {:.0} records/s, {:.1} MB/s; gateway CPU {:.2} us/record, Go client CPU {:.2} us/record",
                run.secs,
                run.first_record_secs,
                run.rate(),
                run.mb_s(),
                run.cpu_us_per_record().unwrap_or(f64::NAN),
                run.client_cpu_us_per_record().unwrap_or(f64::NAN)
            ));
            gos.push(run);
        }
        out.push((g, d));
        relays.push(r);
    }
    Ok(Arms {
        runs: out,
        relays,
        counting,
        gos,
    })
}

/// One gateway arm's drain of a round, measured (the gateway's CPU, the bench process's as
/// its reader's, the machine's) and reported on the progress line as `{label} {arm}`, the
/// reader's CPU named `reader`.
async fn measured_gateway_drain(
    env: &Env,
    (label, arm, reader): (&str, &str, &str),
    gateway_pid: u32,
    clients: &[Client],
    via: ReadVia<'_>,
    (topic, layout, per_partition): (&str, &[Vec<i32>], u64),
) -> Result<DrainRun> {
    let total = per_partition * layout.iter().map(Vec::len).sum::<usize>() as u64;
    let done = Arc::new(AtomicU64::new(0));
    let run = {
        let _t = env
            .progress
            .ticker(format!("{label} {arm}"), done.clone(), total, "records");
        let cpu0 = proc_cpu_seconds(gateway_pid)?;
        let client0 = proc_cpu_seconds(std::process::id())?;
        let mut run = gateway_drain(env, clients, via, topic, layout, per_partition, done).await?;
        run.machine_until(machine_busy_seconds()?);
        run.cpu_secs = Some(proc_cpu_seconds(gateway_pid)? - cpu0);
        run.client_cpu_secs = Some(proc_cpu_seconds(std::process::id())? - client0);
        run
    };
    env.progress.say(format!(
        "  {label} {arm}: {total} records in {:.2}s, first after {:.3}s; steady {:.0} records/s, {:.1} MB/s; gateway CPU {:.2} us/record, {reader} CPU {:.2} us/record; machine CPU {:.2} us/record, {:.2} cores busy; {:.0} records per response",
        run.secs,
        run.first_record_secs,
        run.rate(),
        run.mb_s(),
        run.cpu_us_per_record().unwrap_or(f64::NAN),
        run.client_cpu_us_per_record().unwrap_or(f64::NAN),
        run.machine_cpu_us_per_record().unwrap_or(f64::NAN),
        run.busy_cores().unwrap_or(f64::NAN),
        run.records as f64 / run.responses.max(1) as f64
    ));
    Ok(run)
}

/// The gateway's side of a drain scenario: the gateway, the Rust clients connected to it,
/// and the Go client's drain program when the Go arm runs.
#[derive(Clone, Copy)]
struct GatewaySide<'a> {
    gateway: &'a Gateway,
    clients: &'a [Client],
    go_client: Option<&'a Path>,
}

/// Every arm's drains of one scenario, round by round.
struct Arms {
    /// (gateway with the Rust client, direct consumer) per round.
    runs: Vec<(DrainRun, DrainRun)>,
    /// The relay arm per round.
    relays: Vec<DrainRun>,
    /// The gateway arm with a counting reader per round.
    counting: Vec<DrainRun>,
    /// The Go client arm per round; empty when it did not run.
    gos: Vec<DrainRun>,
}

/// How the Go client arm reads.
const GO_CLIENT_STYLE: &str =
    "clients/go/examples/drain in a process of its own: the Go client (grpc-go, protobuf-go) \
     acquires the partition in a new group and reads it with Lease.Batches and the gateway \
     arm's Read options, every response decoded into records with their keys, values and \
     headers; its CPU (user + system) from getrusage over the drain, the gateway's from /proc \
     around it";

/// Go client arm: the Go client's drain program leases the one partition of `layout`
/// through `gateway` in a new group and reads `per_partition` records; the program reports
/// its own CPU (`client_cpu_secs`), the caller measures the gateway's.
async fn go_drain(
    env: &Env,
    binary: &Path,
    gateway: &Gateway,
    topic: &str,
    layout: &[Vec<i32>],
    per_partition: u64,
    done: Arc<AtomicU64>,
) -> Result<DrainRun> {
    use tokio::io::AsyncBufReadExt;
    let [partitions] = layout else {
        bail!("the Go client arm reads one partition through one connection, not {layout:?}");
    };
    let [partition] = partitions[..] else {
        bail!("the Go client arm reads one partition, not {partitions:?}");
    };
    let mut child = tokio::process::Command::new(binary)
        .arg("-addr")
        .arg(&gateway.addr)
        .arg("-group")
        .arg(env.name("drain-go"))
        .arg("-topic")
        .arg(topic)
        .arg("-partition")
        .arg(partition.to_string())
        .arg("-records")
        .arg(per_partition.to_string())
        .arg("-max-records")
        .arg(READ_MAX_RECORDS.to_string())
        .arg("-max-bytes")
        .arg(READ_MAX_BYTES.to_string())
        .arg("-max-wait")
        .arg(format!("{}ms", READ_MAX_WAIT.as_millis()))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", binary.display()))?;
    let stdout = child.stdout.take().context("the Go drain's stdout")?;
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let mut result = None;
    let read = async {
        while let Some(line) = lines.next_line().await? {
            if let Some(n) = line.strip_prefix("progress ") {
                done.store(n.trim().parse().unwrap_or(0), Ordering::Relaxed);
            } else if let Some(json) = line.strip_prefix("result ") {
                result =
                    Some(serde_json::from_str::<Value>(json).with_context(|| {
                        format!("the Go drain's result line is not JSON: {json}")
                    })?);
            }
        }
        Ok::<_, anyhow::Error>(())
    };
    tokio::time::timeout(DRAIN_DEADLINE, read)
        .await
        .map_err(|_| anyhow!("Go client drain took longer than {DRAIN_DEADLINE:?}"))??;
    let output = child.wait_with_output().await?;
    if !output.status.success() {
        bail!(
            "the Go client's drain failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    let result = result.context("the Go drain printed no result line")?;
    let number = |field: &str| {
        result[field]
            .as_f64()
            .with_context(|| format!("the Go drain's result has no number {field}: {result}"))
    };
    let records = number("records")? as u64;
    let secs = number("finish_secs")?;
    let first_record_secs = number("first_record_secs")?;
    let span = secs - first_record_secs;
    Ok(DrainRun {
        records,
        bytes: number("bytes")? as u64,
        secs,
        partition_rates: vec![records as f64 / if span > 1e-3 { span } else { secs }],
        first_record_secs,
        first_records: number("first_batch_records")? as u64,
        first_bytes: number("first_batch_bytes")? as u64,
        cpu_secs: None,
        client_cpu_secs: Some(number("cpu_secs")?),
        machine_at_first_record: None,
        machine_cpu_secs: None,
        responses: 0,
    })
}

/// The `<name>-go` row: the Go client's drain through the gateway against the direct
/// consumer, with the Rust client's figures from the same rounds beside it.
fn go_row(
    name: &str,
    scenario: &'static str,
    runs: &[(DrainRun, DrainRun)],
    gos: &[DrainRun],
) -> ScenarioResult {
    let med = |xs: Vec<f64>| median(&xs);
    let go = med(gos.iter().map(DrainRun::rate).collect());
    let rust = med(runs.iter().map(|(g, _)| g.rate()).collect());
    let direct = med(runs.iter().map(|(_, d)| d.rate()).collect());
    let go_client = med(gos
        .iter()
        .filter_map(DrainRun::client_cpu_us_per_record)
        .collect());
    let rust_client = med(runs
        .iter()
        .filter_map(|(g, _)| g.client_cpu_us_per_record())
        .collect());
    let go_gateway = med(gos.iter().filter_map(DrainRun::cpu_us_per_record).collect());
    let rust_gateway = med(runs
        .iter()
        .filter_map(|(g, _)| g.cpu_us_per_record())
        .collect());
    let rate_ratio = ratio(go, direct);
    let mut details = Map::new();
    details.insert("go_client_style".into(), GO_CLIENT_STYLE.into());
    details.insert("rust_client_records_per_s".into(), r3(rust).into());
    details.insert(
        "go_over_rust_client_rate".into(),
        ratio(go, rust).map(r3).into(),
    );
    details.insert("go_client_cpu_us_per_record".into(), r3(go_client).into());
    details.insert(
        "rust_client_cpu_us_per_record".into(),
        r3(rust_client).into(),
    );
    details.insert(
        "gateway_cpu_us_per_record_go_arm".into(),
        r3(go_gateway).into(),
    );
    details.insert(
        "gateway_cpu_us_per_record_rust_arm".into(),
        r3(rust_gateway).into(),
    );
    details.insert(
        "go_first_record_secs".into(),
        r3(med(gos.iter().map(|g| g.first_record_secs).collect())).into(),
    );
    details.insert(
        "go_records_per_s".into(),
        gos.iter().map(|g| r3(g.rate())).collect::<Vec<_>>().into(),
    );
    Row {
        name: format!("{name}-go"),
        scenario,
        unit: "records/s",
        gateway: r3(go),
        baseline: r3(direct),
        baseline_kind: "measured: direct rdkafka BaseConsumer of the same partition, same rounds"
            .into(),
        ratio: rate_ratio.map(r3),
        ratio_definition: "Go client records/s through the gateway / direct records/s (medians across rounds)",
        goal: NO_GOAL.into(),
        met: true,
        summary: format!(
            "Go client {go:.0} vs Rust client {rust:.0} records/s; client CPU {go_client:.2} vs {rust_client:.2} us/record; gateway CPU {go_gateway:.2} vs {rust_gateway:.2} us/record"
        ),
        details,
        chart: three_arm_chart(
            format!("{name}: the Go client and the Rust client through the gateway, records/s per round"),
            runs,
            ("gateway, Rust client", "gateway, Go client"),
            gos,
        ),
    }
    .build()
}

/// The `<name>-limit` row: the gateway against the relay arm, this machine's physical limit
/// for a process between Kafka and a client (medians across the same rounds).
fn limit_row(
    name: &str,
    scenario: &'static str,
    runs: &[(DrainRun, DrainRun)],
    relays: &[DrainRun],
) -> ScenarioResult {
    let g = median(&runs.iter().map(|(g, _)| g.rate()).collect::<Vec<_>>());
    let r = median(&relays.iter().map(DrainRun::rate).collect::<Vec<_>>());
    let g_cpu = median(
        &runs
            .iter()
            .filter_map(|(g, _)| g.cpu_us_per_record())
            .collect::<Vec<_>>(),
    );
    let r_cpu = median(
        &relays
            .iter()
            .filter_map(DrainRun::cpu_us_per_record)
            .collect::<Vec<_>>(),
    );
    let d_cpu = median(
        &runs
            .iter()
            .filter_map(|(_, d)| d.cpu_us_per_record())
            .collect::<Vec<_>>(),
    );
    let rate_ratio = ratio(g, r);
    let cpu_ratio = ratio(g_cpu, r_cpu);
    let gateways = || runs.iter().map(|(g, _)| g);
    let g_machine = median(
        &gateways()
            .filter_map(DrainRun::machine_cpu_us_per_record)
            .collect::<Vec<_>>(),
    );
    let r_machine = median(
        &relays
            .iter()
            .filter_map(DrainRun::machine_cpu_us_per_record)
            .collect::<Vec<_>>(),
    );
    let mut details = Map::new();
    details.insert("relay_style".into(), RELAY_STYLE.into());
    // The whole machine's CPU per record in each arm (broker, arm, client, the rest): on
    // cores that are all busy, the rates go as the inverse of these.
    details.insert(
        "gateway_arm_machine_cpu_us_per_record".into(),
        r3(g_machine).into(),
    );
    details.insert(
        "relay_arm_machine_cpu_us_per_record".into(),
        r3(r_machine).into(),
    );
    details.insert(
        "gateway_arm_busy_cores".into(),
        gateways()
            .filter_map(DrainRun::busy_cores)
            .map(r3)
            .collect::<Vec<_>>()
            .into(),
    );
    details.insert(
        "relay_arm_busy_cores".into(),
        relays
            .iter()
            .filter_map(DrainRun::busy_cores)
            .map(r3)
            .collect::<Vec<_>>()
            .into(),
    );
    details.insert(
        "client_cpu_us_per_record".into(),
        r3(median(
            &gateways()
                .filter_map(DrainRun::client_cpu_us_per_record)
                .collect::<Vec<_>>(),
        ))
        .into(),
    );
    details.insert(
        "records_per_response".into(),
        r3(median(
            &gateways()
                .map(|g| g.records as f64 / g.responses.max(1) as f64)
                .collect::<Vec<_>>(),
        ))
        .into(),
    );
    details.insert("gateway_cpu_us_per_record".into(), r3(g_cpu).into());
    details.insert("relay_cpu_us_per_record".into(), r3(r_cpu).into());
    details.insert("direct_cpu_us_per_record".into(), r3(d_cpu).into());
    details.insert(
        "gateway_cpu_over_relay_cpu".into(),
        cpu_ratio.map(r3).into(),
    );
    details.insert(
        "relay_cpu_over_direct_cpu".into(),
        ratio(r_cpu, d_cpu).map(r3).into(),
    );
    details.insert(
        "relay_records_per_s".into(),
        relays
            .iter()
            .map(|r| r3(r.rate()))
            .collect::<Vec<_>>()
            .into(),
    );
    Row {
        name: format!("{name}-limit"),
        scenario,
        unit: "records/s",
        gateway: r3(g),
        baseline: r3(r),
        baseline_kind: "measured: the relay arm (direct consumer + loopback TCP copy of every record to a reader), same rounds".into(),
        ratio: rate_ratio.map(r3),
        ratio_definition: "gateway records/s / relay records/s (medians across rounds): the gateway's share of this machine's limit",
        goal: NO_GOAL.into(),
        met: true,
        summary: format!(
            "CPU per record: gateway {g_cpu:.2}, relay {r_cpu:.2} ({}x), direct {d_cpu:.2} us",
            cpu_ratio.map_or_else(|| "-".to_string(), |c| format!("{c:.2}"))
        ),
        details,
        chart: three_arm_chart(
            format!("{name}: gateway against the relay limit, records/s per round"),
            runs,
            ("gateway", "relay (limit)"),
            relays,
        ),
    }
    .build()
}

/// Channels of their own to `gateway`, one per client of the layout, for the counting
/// reader.
async fn counting_channels(
    gateway: &Gateway,
    count: usize,
) -> Result<Vec<tonic::transport::Channel>> {
    let mut channels = Vec::new();
    for _ in 0..count {
        channels.push(
            tonic::transport::Channel::from_shared(gateway.endpoint())
                .context("the gateway's endpoint")?
                .connect()
                .await
                .context("connecting the counting reader")?,
        );
    }
    Ok(channels)
}

/// How the counting reader reads.
pub(crate) const COUNTING_STYLE: &str =
    "the gateway arm's Acquires and Read requests (or its Subscribe), on channels of their \
     own, one per client connection (tonic, HTTP/2), the responses not decoded into records: \
     each is walked once over its fields, counting the records and summing their values' \
     lengths \
     (crates/kafka-lease-bench/src/scenarios/discard.rs). The relay arm's reader's equal: \
     what a client must do at least to read a gRPC stream";

/// The `<name>-limit-counting` row: the gateway, read by a reader that only counts, against
/// the relay arm, whose reader only discards: the gateway's share of this machine's limit
/// when its client costs about what the relay's reader does (medians across the same
/// rounds).
fn counting_row(
    name: &str,
    scenario: &'static str,
    counting: &[DrainRun],
    relays: &[DrainRun],
) -> ScenarioResult {
    let med = |runs: &[DrainRun], f: &dyn Fn(&DrainRun) -> Option<f64>| {
        median(&runs.iter().filter_map(f).collect::<Vec<_>>())
    };
    let c = med(counting, &|r| Some(r.rate()));
    let r = med(relays, &|r| Some(r.rate()));
    let c_cpu = med(counting, &DrainRun::cpu_us_per_record);
    let r_cpu = med(relays, &DrainRun::cpu_us_per_record);
    let reader_cpu = med(counting, &DrainRun::client_cpu_us_per_record);
    let rate_ratio = ratio(c, r);
    let cpu_ratio = ratio(c_cpu, r_cpu);
    let mut details = Map::new();
    details.insert("reader_style".into(), COUNTING_STYLE.into());
    details.insert("relay_style".into(), RELAY_STYLE.into());
    details.insert("gateway_cpu_us_per_record".into(), r3(c_cpu).into());
    details.insert("reader_cpu_us_per_record".into(), r3(reader_cpu).into());
    details.insert("relay_cpu_us_per_record".into(), r3(r_cpu).into());
    details.insert(
        "gateway_cpu_over_relay_cpu".into(),
        cpu_ratio.map(r3).into(),
    );
    details.insert(
        "gateway_arm_machine_cpu_us_per_record".into(),
        r3(med(counting, &DrainRun::machine_cpu_us_per_record)).into(),
    );
    details.insert(
        "relay_arm_machine_cpu_us_per_record".into(),
        r3(med(relays, &DrainRun::machine_cpu_us_per_record)).into(),
    );
    details.insert(
        "gateway_arm_busy_cores".into(),
        r3(med(counting, &DrainRun::busy_cores)).into(),
    );
    details.insert(
        "relay_arm_busy_cores".into(),
        r3(med(relays, &DrainRun::busy_cores)).into(),
    );
    details.insert(
        "rounds".into(),
        counting
            .iter()
            .zip(relays)
            .enumerate()
            .map(|(i, (c, r))| {
                json!({
                    "round": i + 1,
                    "gateway_records_per_s": r3(c.rate()),
                    "relay_records_per_s": r3(r.rate()),
                    "gateway_cpu_us_per_record": c.cpu_us_per_record().map(r3),
                    "reader_cpu_us_per_record": c.client_cpu_us_per_record().map(r3),
                    "relay_cpu_us_per_record": r.cpu_us_per_record().map(r3),
                })
            })
            .collect::<Vec<_>>()
            .into(),
    );
    Row {
        name: format!("{name}-limit-counting"),
        scenario,
        unit: "records/s",
        gateway: r3(c),
        baseline: r3(r),
        baseline_kind: "measured: the relay arm (direct consumer + loopback TCP copy of every record to a reader that discards it), same rounds".into(),
        ratio: rate_ratio.map(r3),
        ratio_definition: "gateway records/s read by a reader that only counts them / relay records/s (medians across rounds)",
        goal: NO_GOAL.into(),
        met: true,
        summary: format!(
            "CPU per record: gateway {c_cpu:.2}, its reader {reader_cpu:.2}, relay {r_cpu:.2} us ({}x)",
            cpu_ratio.map_or_else(|| "-".to_string(), |c| format!("{c:.2}"))
        ),
        details,
        chart: Chart {
            title: format!(
                "{name}: gateway (counting reader) against the relay limit, records/s per round"
            ),
            unit: "records/s".into(),
            groups: counting
                .iter()
                .zip(relays)
                .enumerate()
                .map(|(i, (c, r))| {
                    (
                        format!("round {}", i + 1),
                        vec![
                            ("gateway, counting reader".into(), c.rate()),
                            ("relay (limit)".into(), r.rate()),
                        ],
                    )
                })
                .collect(),
            lines: vec![("0.9 x relay median".into(), 0.9 * r)],
        },
    }
    .build()
}

/// Records/s per round of the gateway arm, a third arm of the same rounds (`third`), and the
/// direct consumer, labelled `(gateway, third)` and "direct rdkafka".
fn three_arm_chart(
    title: String,
    runs: &[(DrainRun, DrainRun)],
    labels: (&str, &str),
    third: &[DrainRun],
) -> Chart {
    Chart {
        title,
        unit: "records/s".into(),
        groups: runs
            .iter()
            .zip(third)
            .enumerate()
            .map(|(i, ((g, d), t))| {
                (
                    format!("round {}", i + 1),
                    vec![
                        (labels.0.into(), g.rate()),
                        (labels.1.into(), t.rate()),
                        ("direct rdkafka".into(), d.rate()),
                    ],
                )
            })
            .collect(),
        lines: Vec::new(),
    }
}

fn round_details(runs: &[(DrainRun, DrainRun)]) -> Value {
    Value::Array(
        runs.iter()
            .enumerate()
            .map(|(i, (g, d))| {
                json!({
                    "round": i + 1,
                    "gateway_records_per_s": r3(g.rate()),
                    "direct_records_per_s": r3(d.rate()),
                    "gateway_mb_per_s": r3(g.mb_s()),
                    "direct_mb_per_s": r3(d.mb_s()),
                    "gateway_secs": r3(g.secs),
                    "direct_secs": r3(d.secs),
                    "gateway_end_to_end_records_per_s": r3(g.end_to_end_rate()),
                    "direct_end_to_end_records_per_s": r3(d.end_to_end_rate()),
                    "gateway_first_record_secs": r3(g.first_record_secs),
                    "direct_first_record_secs": r3(d.first_record_secs),
                    "gateway_partition_records_per_s": g.partition_rates.iter().map(|x| r3(*x)).collect::<Vec<_>>(),
                    "direct_partition_records_per_s": d.partition_rates.iter().map(|x| r3(*x)).collect::<Vec<_>>(),
                })
            })
            .collect(),
    )
}

/// The goal of the `-cpu` rows: the gateway's CPU per record at most this many times the
/// direct consumer's.
const CPU_GOAL: f64 = 1.5;

/// The `<name>-cpu` row: CPU time per record of the gateway process against that of the
/// direct consumer, in the same rounds (medians). Independent of how busy the machine is,
/// unlike the rates: a process that waits for the CPU uses none.
fn cpu_row(name: &str, scenario: &'static str, runs: &[(DrainRun, DrainRun)]) -> ScenarioResult {
    let per = |f: &dyn Fn(&(DrainRun, DrainRun)) -> Option<f64>| {
        median(&runs.iter().filter_map(f).collect::<Vec<_>>())
    };
    let g = per(&|(g, _)| g.cpu_us_per_record());
    let d = per(&|(_, d)| d.cpu_us_per_record());
    let client = per(&|(g, _)| g.client_cpu_us_per_record());
    let ratio = ratio(g, d);
    let mut details = Map::new();
    details.insert("client_cpu_us_per_record".into(), r3(client).into());
    details.insert(
        "client".into(),
        "the Rust client crate in the bench process, decoding every response into records (owned keys, values and headers); its CPU over the gateway drains, per record".into(),
    );
    details.insert(
        "timing".into(),
        "CPU time (user + system, all threads, from /proc/<pid>/stat at 10 ms resolution) of the gateway process over each gateway drain, and of the bench process (the direct consumer runs in it) over each direct drain, divided by the records drained; medians across rounds".into(),
    );
    details.insert(
        "rounds".into(),
        runs.iter()
            .map(|(g, d)| {
                json!({
                    "gateway_cpu_s": g.cpu_secs.map(r3),
                    "client_cpu_s": g.client_cpu_secs.map(r3),
                    "direct_cpu_s": d.cpu_secs.map(r3),
                    "gateway_records": g.records,
                    "direct_records": d.records,
                })
            })
            .collect::<Vec<_>>()
            .into(),
    );
    Row {
        name: format!("{name}-cpu"),
        scenario,
        unit: "CPU us/record",
        gateway: r3(g),
        baseline: r3(d),
        baseline_kind: "measured: CPU per record of the direct rdkafka consumer, same rounds"
            .into(),
        ratio: ratio.map(r3),
        ratio_definition: "gateway CPU per record / direct consumer CPU per record (medians)",
        goal: format!("<= {CPU_GOAL}"),
        met: ratio.is_some_and(|r| r <= CPU_GOAL),
        summary: format!(
            "{g:.2} vs {d:.2} us of CPU per record; the client's decoding {client:.2} us"
        ),
        details,
        chart: Chart {
            lines: vec![(format!("{CPU_GOAL} x direct median"), CPU_GOAL * d)],
            ..per_round(
                format!("{name}: CPU per record, per round"),
                "us/record",
                runs,
                |run| run.cpu_us_per_record().unwrap_or(0.0),
            )
        },
    }
    .build()
}

fn chart(title: String, runs: &[(DrainRun, DrainRun)], goal_line: Option<(String, f64)>) -> Chart {
    Chart {
        lines: goal_line.into_iter().collect(),
        ..per_round(title, "records/s", runs, DrainRun::rate)
    }
}

/// A chart of `figure` for both arms, one group per round, no lines.
fn per_round(
    title: String,
    unit: &str,
    runs: &[(DrainRun, DrainRun)],
    figure: impl Fn(&DrainRun) -> f64,
) -> Chart {
    Chart {
        title,
        unit: unit.into(),
        groups: runs
            .iter()
            .enumerate()
            .map(|(i, (g, d))| {
                (
                    format!("round {}", i + 1),
                    vec![
                        ("gateway".into(), figure(g)),
                        ("direct rdkafka".into(), figure(d)),
                    ],
                )
            })
            .collect(),
        lines: Vec::new(),
    }
}

/// Medians of the start-up figures, beside the steady-state headline.
fn startup_details(details: &mut Map<String, Value>, runs: &[(DrainRun, DrainRun)]) {
    let med = |f: &dyn Fn(&(DrainRun, DrainRun)) -> f64| {
        r3(median(&runs.iter().map(f).collect::<Vec<_>>()))
    };
    details.insert(
        "gateway_first_record_secs".into(),
        med(&|(g, _)| g.first_record_secs).into(),
    );
    details.insert(
        "baseline_first_record_secs".into(),
        med(&|(_, d)| d.first_record_secs).into(),
    );
    details.insert(
        "gateway_end_to_end_records_per_s".into(),
        med(&|(g, _)| g.end_to_end_rate()).into(),
    );
    details.insert(
        "baseline_end_to_end_records_per_s".into(),
        med(&|(_, d)| d.end_to_end_rate()).into(),
    );
}

fn common_details(
    details: &mut Map<String, Value>,
    value_size: usize,
    per_partition: u64,
    partitions: usize,
) {
    details.insert("value_bytes".into(), value_size.into());
    details.insert("records_per_partition".into(), per_partition.into());
    details.insert("partitions".into(), partitions.into());
    details.insert("consumer_style".into(), CONSUMER_STYLE.into());
    details.insert(
        "gateway_read_options".into(),
        json!({"max_records": READ_MAX_RECORDS, "max_bytes": READ_MAX_BYTES, "max_wait_ms": READ_MAX_WAIT.as_millis() as u64}),
    );
    details.insert(
        "timing".into(),
        "steady-state rate: records after the first arrival (the first batch, for the gateway) over the time from the first arrival to the last record; start-up separately: gateway from just before Acquire, direct from just before the consumer is created, to the first record (first_record_secs) and end-to-end rates including it; MB = 10^6 bytes of record values".into(),
    );
}

/// `drain-1p-1KiB` / `drain-1p-100B`.
pub(crate) async fn one_partition(
    env: &Env,
    name: &str,
    value_size: usize,
    records: usize,
    goal: f64,
) -> Result<Vec<ScenarioResult>> {
    let topic = env.name("drain1");
    create_topic(env, &topic, 1).await?;
    produce_fill(env, name, &topic, 1, records, value_size).await?;
    let gateway = Gateway::start(env, &env.prefix(name), &env.name("gw-drain"), None).await?;
    let client = gateway.client().await?;
    let go_client = env.go_drain().await?;
    let arms = rounds(
        env,
        name,
        GatewaySide {
            gateway: &gateway,
            clients: &[client],
            go_client: go_client.as_deref(),
        },
        &topic,
        &[vec![0]],
        records as u64,
    )
    .await;
    gateway.stop().await;
    let Arms {
        runs,
        relays,
        counting,
        gos,
    } = arms?;
    let g = median(&runs.iter().map(|(g, _)| g.rate()).collect::<Vec<_>>());
    let d = median(&runs.iter().map(|(_, d)| d.rate()).collect::<Vec<_>>());
    let g_mb = median(&runs.iter().map(|(g, _)| g.mb_s()).collect::<Vec<_>>());
    let d_mb = median(&runs.iter().map(|(_, d)| d.mb_s()).collect::<Vec<_>>());
    let ratio = ratio(g, d);
    let mut details = Map::new();
    common_details(&mut details, value_size, records as u64, 1);
    details.insert("gateway_mb_per_s".into(), r3(g_mb).into());
    details.insert("baseline_mb_per_s".into(), r3(d_mb).into());
    startup_details(&mut details, &runs);
    details.insert("rounds".into(), round_details(&runs));
    let scenario = if value_size == 1024 {
        "drain-1p-1KiB"
    } else {
        "drain-1p-100B"
    };
    let cpu = cpu_row(name, scenario, &runs);
    let limit = limit_row(name, scenario, &runs, &relays);
    let go = (!gos.is_empty()).then(|| go_row(name, scenario, &runs, &gos));
    let mut rows = vec![
        Row {
            name: name.to_string(),
            scenario,
            unit: "records/s",
            gateway: r3(g),
            baseline: r3(d),
            baseline_kind: "measured: direct rdkafka BaseConsumer of the same partition, same run"
                .into(),
            ratio: ratio.map(r3),
            ratio_definition: "gateway records/s / direct records/s (medians across rounds)",
            goal: format!(">= {goal}"),
            met: ratio.is_some_and(|r| r >= goal),
            summary: format!(
                "{g_mb:.1} vs {d_mb:.1} MB/s steady; first record after {:.2} vs {:.2} s",
                median(
                    &runs
                        .iter()
                        .map(|(g, _)| g.first_record_secs)
                        .collect::<Vec<_>>()
                ),
                median(
                    &runs
                        .iter()
                        .map(|(_, d)| d.first_record_secs)
                        .collect::<Vec<_>>()
                ),
            ),
            details,
            chart: chart(
                format!("{name}: drain one partition, records/s per round"),
                &runs,
                Some((format!("{goal} x direct median"), goal * d)),
            ),
        }
        .build(),
        cpu,
        limit,
        counting_row(name, scenario, &counting, &relays),
    ];
    rows.extend(go);
    Ok(rows)
}

/// `drain-16p`'s goals: the rate against the direct consumer's, and the slowest partition's
/// against the fastest's.
const DRAIN16_GOAL: f64 = 0.8;
const FAIRNESS_GOAL: f64 = 0.8;

/// `drain-16p`: 16 leases over 4 client connections versus one consumer of all 16.
pub(crate) async fn sixteen_partitions(env: &Env, name: &str) -> Result<Vec<ScenarioResult>> {
    many_partitions(env, name, "drain-16p", 16, env.plan.drain16_per_partition).await
}

/// `drain-64p`: 64 leases over 4 client connections versus one consumer of all 64, the
/// records of `drain-16p` spread over four times the partitions: with `drain-1p-1KiB` and
/// `drain-16p`, the slope of the gateway's CPU per record from 1 to 16 to 64 partitions.
pub(crate) async fn sixty_four_partitions(env: &Env, name: &str) -> Result<Vec<ScenarioResult>> {
    let per_partition = (env.plan.drain16_per_partition / 4).max(1);
    many_partitions(env, name, "drain-64p", 64, per_partition).await
}

/// `partitions` leases over 4 client connections (as many on each) versus one direct
/// consumer assigned them all.
async fn many_partitions(
    env: &Env,
    name: &str,
    scenario: &'static str,
    partitions: i32,
    per_partition: usize,
) -> Result<Vec<ScenarioResult>> {
    let value_size = 1024;
    let topic = env.name(&format!("drain{partitions}"));
    create_topic(env, &topic, partitions).await?;
    produce_fill(env, name, &topic, partitions, per_partition, value_size).await?;
    let gateway = Gateway::start(
        env,
        &env.prefix(name),
        &env.name(&format!("gw-drain{partitions}")),
        None,
    )
    .await?;
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(gateway.client().await?);
    }
    let per_client = partitions / 4;
    let layout: Vec<Vec<i32>> = (0..4)
        .map(|c| (c * per_client..(c + 1) * per_client).collect())
        .collect();
    let arms = rounds(
        env,
        name,
        GatewaySide {
            gateway: &gateway,
            clients: &clients,
            go_client: None,
        },
        &topic,
        &layout,
        per_partition as u64,
    )
    .await;
    gateway.stop().await;
    let Arms {
        runs,
        relays,
        counting,
        ..
    } = arms?;
    let g = median(&runs.iter().map(|(g, _)| g.rate()).collect::<Vec<_>>());
    let d = median(&runs.iter().map(|(_, d)| d.rate()).collect::<Vec<_>>());
    let g_mb = median(&runs.iter().map(|(g, _)| g.mb_s()).collect::<Vec<_>>());
    let d_mb = median(&runs.iter().map(|(_, d)| d.mb_s()).collect::<Vec<_>>());
    let g_fair = median(&runs.iter().map(|(g, _)| g.fairness()).collect::<Vec<_>>());
    let d_fair = median(&runs.iter().map(|(_, d)| d.fairness()).collect::<Vec<_>>());
    let ratio = ratio(g, d);
    let met = ratio.is_some_and(|r| r >= DRAIN16_GOAL) && g_fair >= FAIRNESS_GOAL;
    let mut details = Map::new();
    common_details(
        &mut details,
        value_size,
        per_partition as u64,
        partitions as usize,
    );
    details.insert("client_connections".into(), 4.into());
    details.insert("leases_per_connection".into(), per_client.into());
    details.insert("gateway_mb_per_s".into(), r3(g_mb).into());
    details.insert("baseline_mb_per_s".into(), r3(d_mb).into());
    details.insert(
        "gateway_slowest_over_fastest_partition".into(),
        r3(g_fair).into(),
    );
    details.insert(
        "direct_slowest_over_fastest_partition".into(),
        r3(d_fair).into(),
    );
    details.insert(
        "fairness_definition".into(),
        "per partition: its records over the time its last record arrived (from the arm's start); slowest / fastest, median across rounds".into(),
    );
    startup_details(&mut details, &runs);
    details.insert("rounds".into(), round_details(&runs));
    let cpu = cpu_row(name, scenario, &runs);
    let limit = limit_row(name, scenario, &runs, &relays);
    Ok(vec![
        Row {
        name: name.to_string(),
        scenario,
        unit: "records/s",
        gateway: r3(g),
        baseline: r3(d),
        baseline_kind: format!(
            "measured: one direct rdkafka BaseConsumer assigned all {partitions} partitions, same run"
        ),
        ratio: ratio.map(r3),
        ratio_definition: "gateway records/s / direct records/s (medians across rounds)",
        goal: format!(">= {DRAIN16_GOAL} and slowest/fastest partition >= {FAIRNESS_GOAL}"),
        met,
        summary: format!(
            "{g_mb:.1} vs {d_mb:.1} MB/s; slowest/fastest partition {g_fair:.2} (direct {d_fair:.2})"
        ),
        details,
        chart: chart(
            format!(
                "{name}: {partitions} partitions, 4 connections x {per_client} leases, records/s per round"
            ),
            &runs,
            Some((format!("{DRAIN16_GOAL} x direct median"), DRAIN16_GOAL * d)),
        ),
    }
    .build(),
        cpu,
        limit,
        counting_row(name, scenario, &counting, &relays),
    ])
}

/// `drain-forwarded`: one partition of 1 KiB records, leased on one gateway instance and
/// read through another, which proxies the Read; against the same drain read through the
/// serving instance and a direct consumer, the three arms interleaved in each round.
pub(crate) async fn forwarded(env: &Env, name: &str) -> Result<Vec<ScenarioResult>> {
    let records = env.plan.drain_1k_records;
    let value_size = 1024;
    let goal = 0.8;
    let topic = env.name("drainfwd");
    create_topic(env, &topic, 1).await?;
    produce_fill(env, name, &topic, 1, records, value_size).await?;
    let prefix = env.prefix(name);
    let serving = Gateway::start(env, &prefix, &env.name("gw-serving"), None).await?;
    let other = match Gateway::start(env, &prefix, &env.name("gw-forwarding"), None).await {
        Ok(other) => other,
        Err(e) => {
            serving.stop().await;
            return Err(e);
        }
    };
    let runs = forwarded_rounds(env, name, &serving, &other, &topic, records as u64).await;
    serving.stop().await;
    other.stop().await;
    let runs = runs?;
    let med = |f: &dyn Fn(&(DrainRun, DrainRun, DrainRun)) -> f64| {
        median(&runs.iter().map(f).collect::<Vec<_>>())
    };
    let fwd = med(&|(_, f, _)| f.rate());
    let via_serving = med(&|(g, _, _)| g.rate());
    let direct = med(&|(_, _, d)| d.rate());
    let ratio_gateway = ratio(fwd, via_serving);
    let ratio_direct = ratio(fwd, direct);
    let mut details = Map::new();
    common_details(&mut details, value_size, records as u64, 1);
    details.insert(
        "serving_gateway_records_per_s".into(),
        r3(via_serving).into(),
    );
    details.insert("direct_consumer_records_per_s".into(), r3(direct).into());
    details.insert(
        "forwarded_over_direct_consumer".into(),
        ratio_direct.map(r3).into(),
    );
    details.insert(
        "forwarded_mb_per_s".into(),
        r3(med(&|(_, f, _)| f.mb_s())).into(),
    );
    details.insert(
        "forwarded_first_record_secs".into(),
        r3(med(&|(_, f, _)| f.first_record_secs)).into(),
    );
    details.insert(
        "serving_first_record_secs".into(),
        r3(med(&|(g, _, _)| g.first_record_secs)).into(),
    );
    let hop_cpu = med(&|(_, f, _)| f.cpu_us_per_record().unwrap_or(f64::NAN));
    details.insert(
        "forwarding_instance_cpu_us_per_record".into(),
        r3(hop_cpu).into(),
    );
    // The whole machine's CPU per record in each arm: on cores that are all busy, the rates
    // go as the inverse of these.
    details.insert(
        "serving_arm_machine_cpu_us_per_record".into(),
        r3(med(&|(g, _, _)| {
            g.machine_cpu_us_per_record().unwrap_or(f64::NAN)
        }))
        .into(),
    );
    details.insert(
        "forwarded_arm_machine_cpu_us_per_record".into(),
        r3(med(&|(_, f, _)| {
            f.machine_cpu_us_per_record().unwrap_or(f64::NAN)
        }))
        .into(),
    );
    details.insert(
        "serving_arm_busy_cores".into(),
        r3(med(&|(g, _, _)| g.busy_cores().unwrap_or(f64::NAN))).into(),
    );
    details.insert(
        "forwarded_arm_busy_cores".into(),
        r3(med(&|(_, f, _)| f.busy_cores().unwrap_or(f64::NAN))).into(),
    );
    details.insert(
        "arms".into(),
        "per round, in this order: acquire and read through the serving instance; acquire on the serving instance and read through the other (the Read proxied); a direct rdkafka consumer".into(),
    );
    details.insert(
        "rounds".into(),
        Value::Array(
            runs.iter()
                .enumerate()
                .map(|(i, (g, f, d))| {
                    json!({
                        "round": i + 1,
                        "serving_records_per_s": r3(g.rate()),
                        "forwarded_records_per_s": r3(f.rate()),
                        "direct_records_per_s": r3(d.rate()),
                        "forwarding_instance_cpu_us_per_record":
                            f.cpu_us_per_record().map(r3),
                    })
                })
                .collect(),
        ),
    );
    Ok(vec![Row {
        name: name.to_string(),
        scenario: "drain-forwarded",
        unit: "records/s",
        gateway: r3(fwd),
        baseline: r3(via_serving),
        baseline_kind: "measured: the same drain read through the serving instance, same run"
            .into(),
        ratio: ratio_gateway.map(r3),
        ratio_definition:
            "records/s read through the other instance / through the serving one (medians across rounds)",
        goal: format!(">= {goal}"),
        met: ratio_gateway.is_some_and(|r| r >= goal),
        summary: format!(
            "{fwd:.0} records/s forwarded, {via_serving:.0} through the serving instance, {direct:.0} direct ({} of direct); the forwarding instance's CPU {hop_cpu:.2} us per record",
            ratio_direct.map_or("-".into(), |r| format!("{r:.2}"))
        ),
        details,
        chart: Chart {
            title: format!("{name}: drain one partition through the other instance, records/s per round"),
            unit: "records/s".into(),
            groups: runs
                .iter()
                .enumerate()
                .map(|(i, (g, f, d))| {
                    (
                        format!("round {}", i + 1),
                        vec![
                            ("serving gateway".into(), g.rate()),
                            ("forwarded".into(), f.rate()),
                            ("direct rdkafka".into(), d.rate()),
                        ],
                    )
                })
                .collect(),
            lines: vec![(format!("{goal} x serving median"), goal * via_serving)],
        },
    }
    .build()])
}

/// The three arms of `drain-forwarded`, after one unmeasured warm-up drain of each.
async fn forwarded_rounds(
    env: &Env,
    name: &str,
    serving: &Gateway,
    other: &Gateway,
    topic: &str,
    per_partition: u64,
) -> Result<Vec<(DrainRun, DrainRun, DrainRun)>> {
    let a = [serving.client().await?];
    let b = [other.client().await?];
    let layout = [vec![0]];
    let warm = (per_partition / 10).max(1);
    env.progress.say(format!(
        "  {name}: warm-up (serving, forwarded, direct: {warm} records each)"
    ));
    gateway_drain(
        env,
        &a,
        ReadVia::Lease,
        topic,
        &layout,
        warm,
        Arc::default(),
    )
    .await?;
    gateway_drain(
        env,
        &a,
        ReadVia::Other(&b),
        topic,
        &layout,
        warm,
        Arc::default(),
    )
    .await?;
    direct_drain(env, topic, &[0], warm, Arc::default()).await?;
    let mut out = Vec::new();
    for round in 1..=env.plan.rounds {
        let label = format!("{name} round {round}/{}", env.plan.rounds);
        let arm = |what: &'static str| {
            let done = Arc::new(AtomicU64::new(0));
            let ticker = env.progress.ticker(
                format!("{label} {what}"),
                done.clone(),
                per_partition,
                "records",
            );
            (done, ticker)
        };
        let (done, ticker) = arm("serving");
        let cpu0 = proc_cpu_seconds(serving.pid())?;
        let mut g =
            gateway_drain(env, &a, ReadVia::Lease, topic, &layout, per_partition, done).await?;
        g.machine_until(machine_busy_seconds()?);
        g.cpu_secs = Some(proc_cpu_seconds(serving.pid())? - cpu0);
        drop(ticker);
        let (done, ticker) = arm("forwarded");
        // The forwarding instance's CPU over the forwarded drain: what the hop costs.
        let cpu0 = proc_cpu_seconds(other.pid())?;
        let serving0 = proc_cpu_seconds(serving.pid())?;
        let mut f = gateway_drain(
            env,
            &a,
            ReadVia::Other(&b),
            topic,
            &layout,
            per_partition,
            done,
        )
        .await?;
        f.machine_until(machine_busy_seconds()?);
        f.cpu_secs = Some(proc_cpu_seconds(other.pid())? - cpu0);
        let serving_in_forwarded = proc_cpu_seconds(serving.pid())? - serving0;
        drop(ticker);
        let (done, ticker) = arm("direct");
        let d = direct_drain(env, topic, &[0], per_partition, done).await?;
        drop(ticker);
        env.progress.say(format!(
            "  {label}: serving {:.0}, forwarded {:.0}, direct {:.0} records/s; forwarding \
             instance CPU {:.2} us per record; serving instance CPU {:.2} us per record alone, \
             {:.2} forwarded; machine CPU {:.2} us per record (cores busy {:.2}) through the \
             serving instance, {:.2} ({:.2}) forwarded",
            g.rate(),
            f.rate(),
            d.rate(),
            f.cpu_us_per_record().unwrap_or(f64::NAN),
            g.cpu_us_per_record().unwrap_or(f64::NAN),
            serving_in_forwarded * 1e6 / f.records.max(1) as f64,
            g.machine_cpu_us_per_record().unwrap_or(f64::NAN),
            g.busy_cores().unwrap_or(f64::NAN),
            f.machine_cpu_us_per_record().unwrap_or(f64::NAN),
            f.busy_cores().unwrap_or(f64::NAN),
        ));
        out.push((g, f, d));
    }
    Ok(out)
}
