//! The arms of a drain: the gateway read by the Rust client, the Go client or a reader that
//! decodes nothing, and the direct rdkafka consumer and the relay that the gateway is
//! measured against.

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
use serde_json::Value;
use tokio::time::Instant;

use crate::env::{machine_busy_seconds, proc_cpu_seconds, thread_cpu_seconds, Env, Gateway};
use crate::scenarios::acquire;

use super::{DrainRun, DRAIN_DEADLINE, READ_MAX_BYTES, READ_MAX_RECORDS, READ_MAX_WAIT};

pub(super) fn read_options() -> ReadOptions {
    ReadOptions::new()
        .max_records(READ_MAX_RECORDS)
        .max_bytes(READ_MAX_BYTES)
        .max_wait(READ_MAX_WAIT)
}

/// How the gateway arm reads each lease.
#[derive(Clone, Copy)]
pub(super) enum ReadVia<'a> {
    /// With the Rust client, through the client that acquired the lease.
    Lease,
    /// With the Rust client, through the matching client of another gateway instance, which
    /// forwards the Read.
    Other(&'a [Client]),
    /// Through the matching channel to the same gateway, with a reader that only counts the
    /// records ([`crate::scenarios::discard`]): the relay arm's reader's equal.
    Counting(&'a [tonic::transport::Channel]),
}

/// A lease's Read, however the arm reads it: batches of records, or counts of them.
pub(super) enum Reading {
    Records(RecordStream),
    Counts(tonic::Streaming<crate::scenarios::discard::Counted>),
}

impl Reading {
    /// The next response's records and value bytes; `None` at the stream's end.
    pub(super) async fn next(&mut self) -> Option<Result<(u64, u64)>> {
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
pub(super) async fn gateway_drain(
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
                        Reading::Counts(crate::scenarios::discard::read(channel, request()).await?)
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
pub(super) async fn direct_drain(
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
pub(super) async fn relay_drain(
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
pub(super) enum ConsumerArm {
    Direct,
    Relay,
}

/// Runs a consumer arm on a blocking thread, with a consumer of its own.
pub(super) async fn consumer_drain(
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
pub(super) const RELAY_WRITE: usize = 64 * 1024;

/// The relay arm's work, on the calling (blocking) thread.
pub(super) fn relay_drain_blocking(
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
pub(super) fn direct_drain_blocking(
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

/// One gateway arm's drain of a round, measured (the gateway's CPU, the bench process's as
/// its reader's, the machine's) and reported on the progress line as `{label} {arm}`, the
/// reader's CPU named `reader`.
pub(super) async fn measured_gateway_drain(
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
pub(super) struct GatewaySide<'a> {
    pub(super) gateway: &'a Gateway,
    pub(super) clients: &'a [Client],
    pub(super) go_client: Option<&'a Path>,
}

/// Every arm's drains of one scenario, round by round.
pub(super) struct Arms {
    /// (gateway with the Rust client, direct consumer) per round.
    pub(super) runs: Vec<(DrainRun, DrainRun)>,
    /// The relay arm per round.
    pub(super) relays: Vec<DrainRun>,
    /// The gateway arm with a counting reader per round.
    pub(super) counting: Vec<DrainRun>,
    /// The Go client arm per round; empty when it did not run.
    pub(super) gos: Vec<DrainRun>,
}

/// How the Go client arm reads.
pub(super) const GO_CLIENT_STYLE: &str =
    "clients/go/examples/drain in a process of its own: the Go client (grpc-go, protobuf-go) \
     acquires the partition in a new group and reads it with Lease.Batches and the gateway \
     arm's Read options, every response decoded into records with their keys, values and \
     headers; its CPU (user + system) from getrusage over the drain, the gateway's from /proc \
     around it";

/// Go client arm: the Go client's drain program leases the one partition of `layout`
/// through `gateway` in a new group and reads `per_partition` records; the program reports
/// its own CPU (`client_cpu_secs`), the caller measures the gateway's.
pub(super) async fn go_drain(
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
