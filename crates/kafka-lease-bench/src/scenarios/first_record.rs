//! `first-record`: how long after the start of an Acquire the first record of a partition
//! that already holds records arrives, over many leases: each in a group new to the gateway
//! (its Kafka client is created by the Acquire), and all in one group whose client the
//! gateway already has. Baselines, same run: a direct rdkafka consumer created and assigned
//! the partition (new group), and one already connected that is assigned one more partition
//! (same group), each timed to its first record.

use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use kafka_lease_client::{AcquireOptions, Client, ReadOptions};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use serde_json::{json, Map};
use tokio::time::Instant;

use super::{acquire, ms, r3, ratio, Row};
use crate::env::{create_topic, produce_fill, Env, Gateway};
use crate::report::{Chart, ScenarioResult};
use crate::stats::{median, percentile};

/// Partitions of the topic (leases go round-robin over them) and records in each.
const PARTITIONS: i32 = 20;
const RECORDS_PER_PARTITION: usize = 50;
const VALUE_BYTES: usize = 1024;
/// The goal, for the p99 of each gateway arm.
const GOAL_MS: f64 = 50.0;
/// How long one first record may take before the scenario fails.
const DEADLINE: Duration = Duration::from_secs(30);

/// One measured lease: Acquire answered, first record, both from just before the Acquire.
#[derive(Debug, Clone, Copy)]
struct Sample {
    acquire_ms: f64,
    first_ms: f64,
}

/// The Read's options: no wait to fill the first batch (a Read may wait up to `max_wait`
/// after its first record for more), so the figure is when the first record is there.
fn read_options() -> ReadOptions {
    ReadOptions::new().max_records(100).max_wait(Duration::ZERO)
}

/// One lease of `partition` in `group`: Acquire, Read until the first batch, Release.
async fn one_lease(client: &Client, group: &str, topic: &str, partition: i32) -> Result<Sample> {
    let t0 = Instant::now();
    let lease = acquire(
        client,
        AcquireOptions::new(group, topic)
            .partition(partition)
            .member("bench-first-record")
            .ttl(Duration::from_secs(30)),
    )
    .await?;
    let acquired = t0.elapsed();
    if lease.high_watermark() <= lease.offset() {
        bail!(
            "partition {partition} has no record after offset {}",
            lease.offset()
        );
    }
    let mut stream = lease.records(read_options()).await.context("Read")?;
    let first = loop {
        match tokio::time::timeout(DEADLINE, stream.next_batch()).await {
            Err(_) => bail!("no record within {DEADLINE:?} of the Acquire"),
            Ok(Some(Ok(batch))) if !batch.records.is_empty() => break t0.elapsed(),
            Ok(Some(Ok(_))) => {}
            Ok(Some(Err(e))) => return Err(anyhow!(e).context("Read failed")),
            Ok(None) => bail!("the Read ended before its first record"),
        }
    };
    drop(stream);
    lease.release().await.context("Release")?;
    Ok(Sample {
        acquire_ms: ms(acquired),
        first_ms: ms(first),
    })
}

/// Direct consumer: `consumer` (created just now, or already connected) assigned
/// `partition` from the beginning, polled to its first record; unassigned after.
fn direct_first(consumer: &BaseConsumer, topic: &str, partition: i32, t0: Instant) -> Result<f64> {
    let mut list = TopicPartitionList::new();
    list.add_partition_offset(topic, partition, Offset::Beginning)?;
    consumer.incremental_assign(&list).context("assign")?;
    let first = loop {
        if t0.elapsed() > DEADLINE {
            bail!("direct consumer: no record within {DEADLINE:?}");
        }
        // Errors are librdkafka's transient ones; it retries them itself.
        if let Some(Ok(_)) = consumer.poll(Duration::from_millis(100)) {
            break ms(t0.elapsed());
        }
    };
    consumer.incremental_unassign(&list).context("unassign")?;
    Ok(first)
}

/// Direct arms: `n` consumers each created for one partition, then `n` assignments of one
/// consumer created (and warmed with one partition) beforehand.
/// `configs` has one consumer configuration (group) for each of the `n + 1` consumers.
fn direct_arms(configs: Vec<ClientConfig>, topic: &str, n: usize) -> Result<(Vec<f64>, Vec<f64>)> {
    let mut configs = configs.into_iter();
    let mut config = || {
        configs
            .next()
            .ok_or_else(|| anyhow!("a configuration per consumer"))
    };
    let mut new = Vec::new();
    for i in 0..n {
        let t0 = Instant::now();
        let consumer: BaseConsumer = config()?.create().context("direct consumer")?;
        new.push(direct_first(&consumer, topic, i as i32 % PARTITIONS, t0)?);
    }
    let consumer: BaseConsumer = config()?.create().context("direct consumer")?;
    direct_first(&consumer, topic, 0, Instant::now())?;
    let mut same = Vec::new();
    for i in 0..n {
        same.push(direct_first(
            &consumer,
            topic,
            (i as i32 + 1) % PARTITIONS,
            Instant::now(),
        )?);
    }
    Ok((new, same))
}

pub(crate) async fn run(env: &Env) -> Result<Vec<ScenarioResult>> {
    let name = "first-record";
    let n = env.plan.first_record_leases;
    let topic = env.name("first");
    create_topic(env, &topic, PARTITIONS).await?;
    produce_fill(
        env,
        name,
        &topic,
        PARTITIONS,
        RECORDS_PER_PARTITION,
        VALUE_BYTES,
    )
    .await?;
    let gateway = Gateway::start(env, &env.prefix(name), &env.name("gw-first"), None).await?;
    let arms = gateway_arms(env, &gateway, &topic, n).await;
    gateway.stop().await;
    let (new_group, same_group) = arms?;
    env.progress
        .say(format!("  {name}: direct arms ({n} leases each)"));
    let (direct_new, direct_same) = {
        let configs: Vec<ClientConfig> = (0..=n)
            .map(|_| env.direct_consumer_config(&env.name("first-direct")))
            .collect();
        let topic = topic.clone();
        tokio::task::spawn_blocking(move || direct_arms(configs, &topic, n))
            .await
            .context("direct arm thread panicked")??
    };
    Ok(vec![
        row(
            "first-record-new-group",
            "Acquire -> first record, a group new to the gateway (its Kafka client created by the Acquire)",
            &new_group,
            &direct_new,
            "measured: a direct rdkafka consumer created and assigned the partition, to its first record, same run",
        ),
        row(
            "first-record-same-group",
            "Acquire -> first record, a group whose Kafka client the gateway already has",
            &same_group,
            &direct_same,
            "measured: a connected direct rdkafka consumer assigned one more partition, to its first record, same run",
        ),
    ])
}

/// The gateway arms, on one client connection: `n` leases each in a new group, then one
/// unmeasured lease that brings a group's client up and `n` measured leases in that group.
async fn gateway_arms(
    env: &Env,
    gateway: &Gateway,
    topic: &str,
    n: usize,
) -> Result<(Vec<Sample>, Vec<Sample>)> {
    let client = gateway.client().await?;
    // Unmeasured: the gateway's first Acquire creates its metadata connections.
    one_lease(&client, &env.name("first-warm"), topic, 0).await?;
    env.progress
        .say(format!("  first-record: gateway, {n} leases in new groups"));
    let mut new_group = Vec::new();
    for i in 0..n {
        let group = env.name(&format!("first-new-{i}"));
        new_group.push(one_lease(&client, &group, topic, i as i32 % PARTITIONS).await?);
    }
    env.progress
        .say(format!("  first-record: gateway, {n} leases in one group"));
    let group = env.name("first-same");
    one_lease(&client, &group, topic, 0).await?;
    let mut same_group = Vec::new();
    for i in 0..n {
        same_group.push(one_lease(&client, &group, topic, (i as i32 + 1) % PARTITIONS).await?);
    }
    Ok((new_group, same_group))
}

fn row(
    name: &str,
    what: &str,
    samples: &[Sample],
    direct: &[f64],
    baseline_kind: &str,
) -> ScenarioResult {
    let first: Vec<f64> = samples.iter().map(|s| s.first_ms).collect();
    let acquire: Vec<f64> = samples.iter().map(|s| s.acquire_ms).collect();
    let after_acquire: Vec<f64> = samples.iter().map(|s| s.first_ms - s.acquire_ms).collect();
    let (p50, p99) = (percentile(&first, 50.0), percentile(&first, 99.0));
    let (d50, d99) = (percentile(direct, 50.0), percentile(direct, 99.0));
    let mut details = Map::new();
    details.insert("what".into(), what.into());
    details.insert("leases".into(), samples.len().into());
    details.insert("partitions".into(), PARTITIONS.into());
    details.insert("records_per_partition".into(), RECORDS_PER_PARTITION.into());
    details.insert("value_bytes".into(), VALUE_BYTES.into());
    details.insert(
        "timing".into(),
        "gateway: from just before the Acquire to the first batch of the Read that follows it (max_wait 0: the batch holds what the gateway has when it has the first record); direct: from just before the consumer is created (new group) or the partition assigned (same group) to its first record".into(),
    );
    details.insert("gateway_p50_ms".into(), r3(p50).into());
    details.insert("gateway_p99_ms".into(), r3(p99).into());
    details.insert(
        "gateway_acquire_p50_ms".into(),
        r3(percentile(&acquire, 50.0)).into(),
    );
    details.insert(
        "gateway_acquire_p99_ms".into(),
        r3(percentile(&acquire, 99.0)).into(),
    );
    details.insert(
        "gateway_acquired_to_first_record_p50_ms".into(),
        r3(percentile(&after_acquire, 50.0)).into(),
    );
    details.insert(
        "gateway_acquired_to_first_record_p99_ms".into(),
        r3(percentile(&after_acquire, 99.0)).into(),
    );
    details.insert("direct_p50_ms".into(), r3(d50).into());
    details.insert("direct_p99_ms".into(), r3(d99).into());
    details.insert(
        "samples_ms".into(),
        json!(samples
            .iter()
            .map(|s| json!({"acquire": r3(s.acquire_ms), "first_record": r3(s.first_ms)}))
            .collect::<Vec<_>>()),
    );
    details.insert(
        "direct_samples_ms".into(),
        json!(direct.iter().map(|x| r3(*x)).collect::<Vec<_>>()),
    );
    let ratio = ratio(p99, d99);
    Row {
        name: name.to_string(),
        scenario: "first-record",
        unit: "ms",
        gateway: r3(p99),
        baseline: r3(d99),
        baseline_kind: baseline_kind.to_string(),
        ratio: ratio.map(r3),
        ratio_definition: "gateway p99 / direct p99 (first-record ms)",
        goal: format!("gateway p99 <= {GOAL_MS} ms"),
        met: p99 <= GOAL_MS,
        summary: format!(
            "p50 {p50:.1} ms, p99 {p99:.1} ms over {} leases (Acquire p50 {:.1} ms); direct p50 {d50:.1} ms, p99 {d99:.1} ms",
            samples.len(),
            median(&acquire),
        ),
        details,
        chart: Chart {
            title: format!("{name}: Acquire -> first record, ms"),
            unit: "ms".into(),
            groups: vec![
                (
                    "p50".into(),
                    vec![("gateway".into(), p50), ("direct rdkafka".into(), d50)],
                ),
                (
                    "p99".into(),
                    vec![("gateway".into(), p99), ("direct rdkafka".into(), d99)],
                ),
            ],
            lines: vec![(format!("goal {GOAL_MS} ms"), GOAL_MS)],
        },
    }
    .build()
}
