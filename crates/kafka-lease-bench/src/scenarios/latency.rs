//! `latency`: produce-to-client delivery latency at a paced 2,000 records/s, gateway versus a
//! direct consumer. Each record carries its send time (microseconds since the Unix epoch,
//! taken just before it is handed to the producer) in its value; the reader subtracts it from
//! the time it receives the record. Producer and readers share this process's clock.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context, Result};
use kafka_lease_client::{AcquireOptions, ReadOptions, Reset};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use serde_json::{json, Map};
use tokio::time::Instant;

use super::{acquire, r3, ratio, Row};
use crate::env::{create_topic, Env, Gateway};
use crate::report::{Chart, ScenarioResult};
use crate::stats::{median, percentile};

const RATE: f64 = 2000.0;
const VALUE_BYTES: usize = 100;
const SLACK_MS: f64 = 2.0;

fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// `(sequence, latency in ms)` of a record value written by [`paced_produce`].
fn decode(value: &[u8], received_micros: u64) -> Option<(u64, f64)> {
    let seq = u64::from_be_bytes(value.get(0..8)?.try_into().ok()?);
    let sent = u64::from_be_bytes(value.get(8..16)?.try_into().ok()?);
    Some((seq, received_micros.saturating_sub(sent) as f64 / 1000.0))
}

fn latency_producer(env: &Env) -> Result<FutureProducer> {
    ClientConfig::new()
        .set("bootstrap.servers", &env.services.kafka_bootstrap)
        .set("linger.ms", "0")
        .set("acks", "1")
        .create()
        .context("latency producer")
}

/// The sequence number of a probe record: sent every 10 ms until the reader has received
/// one, so that measuring starts only once the reader is fetching (no start-up in the figures).
const PROBE: u64 = u64::MAX;

/// Sends probes until `ready`, then `count` records at [`RATE`] per second (catching up after
/// timer jitter), each with its sequence number and send time. Returns the achieved rate.
async fn paced_produce(
    producer: &FutureProducer,
    topic: &str,
    count: usize,
    ready: &AtomicBool,
) -> Result<f64> {
    let mut value = vec![0_u8; VALUE_BYTES];
    let probing = Instant::now();
    while !ready.load(Ordering::Acquire) {
        if probing.elapsed() > Duration::from_secs(60) {
            bail!("the reader received no probe record within 60 s");
        }
        value[0..8].copy_from_slice(&PROBE.to_be_bytes());
        value[8..16].copy_from_slice(&now_micros().to_be_bytes());
        let record = FutureRecord::<[u8], [u8]>::to(topic)
            .partition(0)
            .payload(&value);
        producer
            .send_result(record)
            .map_err(|(e, _)| anyhow!("producing: {e}"))?;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let start = Instant::now();
    let mut sent = 0_usize;
    while sent < count {
        let due = (((start.elapsed().as_secs_f64() * RATE) as usize) + 1).min(count);
        while sent < due {
            value[0..8].copy_from_slice(&(sent as u64).to_be_bytes());
            value[8..16].copy_from_slice(&now_micros().to_be_bytes());
            let record = FutureRecord::<[u8], [u8]>::to(topic)
                .partition(0)
                .payload(&value);
            // The delivery future is dropped: the record is sent all the same.
            producer
                .send_result(record)
                .map_err(|(e, _)| anyhow!("producing: {e}"))?;
            sent += 1;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    Ok(count as f64 / start.elapsed().as_secs_f64())
}

#[derive(Debug, Default)]
struct Arm {
    latencies_ms: Vec<f64>,
    produce_rate: f64,
}

impl Arm {
    fn p(&self, q: f64) -> f64 {
        percentile(&self.latencies_ms, q)
    }
}

/// What a reader of either arm makes of the records it receives: the probe record marks it
/// ready, every other record is a latency sample (kept once past the warm-up).
struct Samples {
    warmup: u64,
    latencies: Vec<f64>,
    seen: usize,
    done: Arc<AtomicU64>,
    ready: Arc<AtomicBool>,
}

impl Samples {
    fn new(count: usize, warmup: u64, done: Arc<AtomicU64>, ready: Arc<AtomicBool>) -> Self {
        Self {
            warmup,
            latencies: Vec::with_capacity(count),
            seen: 0,
            done,
            ready,
        }
    }

    fn observe(&mut self, value: Option<&[u8]>, received_micros: u64) {
        match value.and_then(|v| decode(v, received_micros)) {
            Some((PROBE, _)) => self.ready.store(true, Ordering::Release),
            Some((seq, ms)) => {
                if seq >= self.warmup {
                    self.latencies.push(ms);
                }
                self.seen += 1;
                self.done.fetch_add(1, Ordering::Relaxed);
            }
            None => {}
        }
    }
}

async fn gateway_arm(
    env: &Env,
    client: &kafka_lease_client::Client,
    producer: &FutureProducer,
    topic: &str,
    done: Arc<AtomicU64>,
) -> Result<Arm> {
    let count = env.plan.latency_records;
    let warmup = env.plan.latency_warmup as u64;
    let lease = acquire(
        client,
        AcquireOptions::new(env.name("lat"), topic)
            .partition(0)
            .member("bench-latency")
            .reset(Reset::Latest)
            .ttl(Duration::from_secs(60)),
    )
    .await?;
    let mut stream = lease
        .records(
            ReadOptions::new()
                .max_records(10_000)
                .max_wait(Duration::ZERO),
        )
        .await
        .context("Read")?;
    let ready = Arc::new(AtomicBool::new(false));
    let reader_ready = ready.clone();
    let reader = tokio::spawn(async move {
        let mut samples = Samples::new(count, warmup, done, reader_ready);
        while samples.seen < count {
            match stream.next_batch().await {
                Some(Ok(batch)) => {
                    let now = now_micros();
                    for r in &batch.records {
                        samples.observe(r.value.as_deref(), now);
                    }
                }
                Some(Err(e)) => return Err(anyhow!(e).context("Read failed")),
                None => bail!("the Read ended after {} records", samples.seen),
            }
        }
        Ok((samples.latencies, stream))
    });
    let produce_rate = paced_produce(producer, topic, count, &ready).await?;
    let deadline = Duration::from_secs_f64(count as f64 / RATE + 60.0);
    let (latencies, stream) = tokio::time::timeout(deadline, reader)
        .await
        .map_err(|_| anyhow!("the gateway reader did not get every record within {deadline:?}"))?
        .context("reader panicked")??;
    drop(stream);
    let _ = lease.release().await;
    Ok(Arm {
        latencies_ms: latencies,
        produce_rate,
    })
}

async fn direct_arm(
    env: &Env,
    producer: &FutureProducer,
    topic: &str,
    done: Arc<AtomicU64>,
) -> Result<Arm> {
    let count = env.plan.latency_records;
    let warmup = env.plan.latency_warmup as u64;
    let config = env.direct_consumer_config(&env.name("lat-direct"));
    let topic_owned = topic.to_string();
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel::<Result<()>>();
    let ready = Arc::new(AtomicBool::new(false));
    let reader_ready = ready.clone();
    let reader = tokio::task::spawn_blocking(move || -> Result<Vec<f64>> {
        let setup = || -> Result<BaseConsumer> {
            let consumer: BaseConsumer = config.create().context("direct consumer")?;
            // The high watermark now: where the records of this arm start (connects too).
            let (_, high) = consumer
                .fetch_watermarks(&topic_owned, 0, Duration::from_secs(10))
                .context("watermarks")?;
            let mut list = TopicPartitionList::new();
            list.add_partition_offset(&topic_owned, 0, Offset::Offset(high))?;
            consumer.assign(&list).context("assign")?;
            Ok(consumer)
        };
        let consumer = match setup() {
            Ok(c) => {
                let _ = ready_tx.send(Ok(()));
                c
            }
            Err(e) => {
                let _ = ready_tx.send(Err(anyhow!("{e:#}")));
                return Err(e);
            }
        };
        let started = Instant::now();
        let limit = Duration::from_secs_f64(count as f64 / RATE + 60.0);
        let mut samples = Samples::new(count, warmup, done, reader_ready);
        while samples.seen < count {
            if started.elapsed() > limit {
                bail!(
                    "the direct reader got {} of {count} records within {limit:?}",
                    samples.seen
                );
            }
            if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
                samples.observe(m.payload(), now_micros());
            }
        }
        Ok(samples.latencies)
    });
    ready_rx.await.context("direct reader setup")??;
    let produce_rate = paced_produce(producer, topic, count, &ready).await?;
    let latencies = reader.await.context("direct reader panicked")??;
    Ok(Arm {
        latencies_ms: latencies,
        produce_rate,
    })
}

pub(crate) async fn run(env: &Env) -> Result<Vec<ScenarioResult>> {
    let name = "latency";
    let topic = env.name("lat");
    create_topic(env, &topic, 1).await?;
    let producer = latency_producer(env)?;
    let gateway = Gateway::start(env, &env.prefix(name), &env.name("gw-lat"), None).await?;
    let client = gateway.client().await?;
    let count = env.plan.latency_records;
    let mut rounds: Vec<(Arm, Arm)> = Vec::new();
    let result: Result<()> = async {
        for round in 1..=env.plan.rounds {
            let label = format!("{name} round {round}/{}", env.plan.rounds);
            let done = Arc::new(AtomicU64::new(0));
            let g = {
                let _t = env.progress.ticker(
                    format!("{label} gateway"),
                    done.clone(),
                    count as u64,
                    "records",
                );
                gateway_arm(env, &client, &producer, &topic, done).await?
            };
            env.progress.say(format!(
                "  {label} gateway: p50 {:.2} ms, p99 {:.2} ms ({} records at {:.0}/s)",
                g.p(50.0),
                g.p(99.0),
                g.latencies_ms.len(),
                g.produce_rate
            ));
            let done = Arc::new(AtomicU64::new(0));
            let d = {
                let _t = env.progress.ticker(
                    format!("{label} direct"),
                    done.clone(),
                    count as u64,
                    "records",
                );
                direct_arm(env, &producer, &topic, done).await?
            };
            env.progress.say(format!(
                "  {label} direct: p50 {:.2} ms, p99 {:.2} ms ({} records at {:.0}/s)",
                d.p(50.0),
                d.p(99.0),
                d.latencies_ms.len(),
                d.produce_rate
            ));
            rounds.push((g, d));
        }
        Ok(())
    }
    .await;
    gateway.stop().await;
    result?;
    let med = |f: &dyn Fn(&(Arm, Arm)) -> f64| median(&rounds.iter().map(f).collect::<Vec<_>>());
    let g99 = med(&|(g, _)| g.p(99.0));
    let d99 = med(&|(_, d)| d.p(99.0));
    let g50 = med(&|(g, _)| g.p(50.0));
    let d50 = med(&|(_, d)| d.p(50.0));
    let all_g: Vec<f64> = rounds
        .iter()
        .flat_map(|(g, _)| g.latencies_ms.iter().copied())
        .collect();
    let all_d: Vec<f64> = rounds
        .iter()
        .flat_map(|(_, d)| d.latencies_ms.iter().copied())
        .collect();
    let mut details = Map::new();
    details.insert("gateway_p50_ms".into(), r3(g50).into());
    details.insert("baseline_p50_ms".into(), r3(d50).into());
    details.insert("gateway_p99_ms".into(), r3(g99).into());
    details.insert("baseline_p99_ms".into(), r3(d99).into());
    details.insert(
        "pooled_gateway_p50_p99_max_ms".into(),
        json!([
            r3(percentile(&all_g, 50.0)),
            r3(percentile(&all_g, 99.0)),
            r3(percentile(&all_g, 100.0))
        ]),
    );
    details.insert(
        "pooled_direct_p50_p99_max_ms".into(),
        json!([
            r3(percentile(&all_d, 50.0)),
            r3(percentile(&all_d, 99.0)),
            r3(percentile(&all_d, 100.0))
        ]),
    );
    details.insert("rate_records_per_s".into(), RATE.into());
    details.insert("records_per_arm_and_round".into(), count.into());
    details.insert(
        "warmup_records_not_counted".into(),
        env.plan.latency_warmup.into(),
    );
    details.insert("value_bytes".into(), VALUE_BYTES.into());
    details.insert(
        "producer".into(),
        "rdkafka FutureProducer, linger.ms=0, acks=1, send time in the value".into(),
    );
    details.insert(
        "gateway_read_options".into(),
        json!({"max_records": 10000, "max_wait_ms": 0}),
    );
    details.insert("consumer_style".into(), super::drain::CONSUMER_STYLE.into());
    details.insert(
        "rounds".into(),
        rounds
            .iter()
            .enumerate()
            .map(|(i, (g, d))| json!({
                "round": i + 1,
                "gateway_p50_ms": r3(g.p(50.0)), "gateway_p99_ms": r3(g.p(99.0)),
                "direct_p50_ms": r3(d.p(50.0)), "direct_p99_ms": r3(d.p(99.0)),
                "gateway_samples": g.latencies_ms.len(), "direct_samples": d.latencies_ms.len(),
                "gateway_produce_rate": r3(g.produce_rate), "direct_produce_rate": r3(d.produce_rate),
            }))
            .collect::<Vec<_>>()
            .into(),
    );
    let chart = Chart {
        title: "latency: produce to client at 2,000 records/s".into(),
        unit: "ms".into(),
        groups: rounds
            .iter()
            .enumerate()
            .map(|(i, (g, d))| {
                (
                    format!("round {}", i + 1),
                    vec![
                        ("gateway p50".into(), g.p(50.0)),
                        ("direct p50".into(), d.p(50.0)),
                        ("gateway p99".into(), g.p(99.0)),
                        ("direct p99".into(), d.p(99.0)),
                    ],
                )
            })
            .collect(),
        lines: vec![("direct p99 + 2 ms".into(), d99 + SLACK_MS)],
    };
    Ok(vec![Row {
        name: name.into(),
        scenario: "latency",
        unit: "ms (p99)",
        gateway: r3(g99),
        baseline: r3(d99),
        baseline_kind: "measured: direct rdkafka BaseConsumer of the same partition, same run"
            .into(),
        ratio: ratio(g99, d99).map(r3),
        ratio_definition:
            "gateway p99 / direct p99 (medians of per-round p99s); the goal is on the difference",
        goal: "p99 <= direct p99 + 2 ms".into(),
        met: g99 <= d99 + SLACK_MS,
        summary: format!("p50 {g50:.2} vs {d50:.2} ms; p99 {g99:.2} vs {d99:.2} ms"),
        details,
        chart,
    }
    .build()])
}
