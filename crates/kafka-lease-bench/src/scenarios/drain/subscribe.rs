//! `drain-subscribe`: one member draining 16 partitions through Subscribe, against a direct
//! consumer of the same 16 and the relay, as in drain-16p; and the member read by the
//! counting reader.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use kafka_lease_client::{Client, SubscribeOptions, Subscription, SubscriptionEvent};
use serde_json::{json, Map};
use tokio::time::Instant;

use crate::env::{
    create_topic, machine_busy_seconds, proc_cpu_seconds, produce_fill, Env, Gateway,
};
use crate::report::{Chart, ScenarioResult};
use crate::scenarios::{r3, ratio, Row};
use crate::stats::{median, min_max};

/// `drain-subscribe`: one member of a 16-partition topic drains it through Subscribe;
/// against one direct consumer of the 16, as in drain-16p.
pub(crate) async fn drain(env: &Env) -> Result<Vec<ScenarioResult>> {
    let name = "drain-subscribe";
    let per_partition = env.plan.drain16_per_partition as u64;
    let topic = env.name("drainsub");
    create_topic(env, &topic, 16).await?;
    produce_fill(env, name, &topic, 16, per_partition as usize, 1024).await?;
    let gateway = Gateway::start(env, &env.prefix(name), &env.name("gw-drainsub"), None).await?;
    let client = gateway.client().await;
    let mut runs = Vec::new();
    let mut relays: Vec<(f64, Option<f64>)> = Vec::new();
    // Gateway, client, and the whole machine's CPU per record in the Subscribe arm; the
    // machine's in the relay arm.
    let mut cpus: Vec<(f64, f64, f64, f64)> = Vec::new();
    // The member read by the counting reader: its rate, the gateway's and the reader's CPU
    // per record.
    let mut countings: Vec<(f64, f64, f64)> = Vec::new();
    let (gateway_pid, own) = (gateway.pid(), std::process::id());
    let result = async {
        let client = client?;
        let channel = tonic::transport::Channel::from_shared(gateway.endpoint())
            .context("the gateway's endpoint")?
            .connect()
            .await
            .context("connecting the counting reader")?;
        let total = (per_partition * 16) as f64;
        for round in 1..=env.plan.rounds {
            let (gateway0, client0) = (proc_cpu_seconds(gateway_pid)?, proc_cpu_seconds(own)?);
            let machine0 = machine_busy_seconds()?;
            let (rate, fairness) =
                subscribe_drain(env, &client, None, &topic, per_partition).await?;
            let machine_cpu = (machine_busy_seconds()? - machine0) / total * 1e6;
            let gateway_cpu = (proc_cpu_seconds(gateway_pid)? - gateway0) / total * 1e6;
            let client_cpu = (proc_cpu_seconds(own)? - client0) / total * 1e6;
            let direct = super::direct_rate(env, &topic, 16, per_partition).await?;
            let (relay, relay_cpu, relay_machine_cpu) =
                super::relay_rate(env, &topic, 16, per_partition).await?;
            env.progress.say(format!(
                "  {name} round {round}/{}: subscribe {rate:.0}, direct {direct:.0}, relay {relay:.0} records/s; slowest/fastest partition {fairness:.2}; gateway CPU {gateway_cpu:.2}, client CPU {client_cpu:.2}, relay CPU {:.2} us/record; machine CPU {machine_cpu:.2} (Subscribe), {relay_machine_cpu:.2} (relay) us/record",
                env.plan.rounds,
                relay_cpu.unwrap_or(f64::NAN),
            ));
            let (gateway0, reader0) = (proc_cpu_seconds(gateway_pid)?, proc_cpu_seconds(own)?);
            let (counting_rate, _) =
                subscribe_drain(env, &client, Some(&channel), &topic, per_partition).await?;
            let counting_gateway_cpu = (proc_cpu_seconds(gateway_pid)? - gateway0) / total * 1e6;
            let reader_cpu = (proc_cpu_seconds(own)? - reader0) / total * 1e6;
            env.progress.say(format!(
                "  {name} round {round}/{}: counting reader {counting_rate:.0} records/s; gateway CPU {counting_gateway_cpu:.2}, reader CPU {reader_cpu:.2} us/record",
                env.plan.rounds,
            ));
            countings.push((counting_rate, counting_gateway_cpu, reader_cpu));
            runs.push((rate, direct, fairness));
            relays.push((relay, relay_cpu));
            cpus.push((gateway_cpu, client_cpu, machine_cpu, relay_machine_cpu));
        }
        Ok::<_, anyhow::Error>(())
    }
    .await;
    gateway.stop().await;
    result?;
    let g = median(&runs.iter().map(|r| r.0).collect::<Vec<_>>());
    let d = median(&runs.iter().map(|r| r.1).collect::<Vec<_>>());
    let fair = median(&runs.iter().map(|r| r.2).collect::<Vec<_>>());
    let relay = median(&relays.iter().map(|r| r.0).collect::<Vec<_>>());
    let relay_cpu = median(&relays.iter().filter_map(|r| r.1).collect::<Vec<_>>());
    let relay_ratio = ratio(g, relay);
    let ratio = ratio(g, d);
    let mut details = Map::new();
    details.insert("partitions".into(), 16.into());
    details.insert("records_per_partition".into(), per_partition.into());
    details.insert("value_bytes".into(), 1024.into());
    details.insert("slowest_over_fastest_partition".into(), r3(fair).into());
    details.insert(
        "rounds".into(),
        runs.iter()
            .enumerate()
            .map(|(i, (g, d, f))| json!({"round": i + 1, "subscribe_records_per_s": r3(*g), "direct_records_per_s": r3(*d), "slowest_over_fastest": r3(*f)}))
            .collect::<Vec<_>>()
            .into(),
    );
    details.insert("timing".into(), "subscribe: records after the first batch over the time from the first batch to the last record (a fresh group each round, so it starts at offset 0); fairness: per partition, its records over the time its last record arrived, slowest / fastest; direct: as drain-16p".into());
    let mut limit_details = Map::new();
    limit_details.insert("relay_style".into(), super::RELAY_STYLE.into());
    limit_details.insert("relay_cpu_us_per_record".into(), r3(relay_cpu).into());
    let gateway_cpu = median(&cpus.iter().map(|c| c.0).collect::<Vec<_>>());
    let client_cpu = median(&cpus.iter().map(|c| c.1).collect::<Vec<_>>());
    limit_details.insert("gateway_cpu_us_per_record".into(), r3(gateway_cpu).into());
    limit_details.insert("client_cpu_us_per_record".into(), r3(client_cpu).into());
    // The whole machine's CPU per record in each arm: on cores that are all busy, the rates
    // go as the inverse of these.
    limit_details.insert(
        "gateway_arm_machine_cpu_us_per_record".into(),
        r3(median(&cpus.iter().map(|c| c.2).collect::<Vec<_>>())).into(),
    );
    limit_details.insert(
        "relay_arm_machine_cpu_us_per_record".into(),
        r3(median(&cpus.iter().map(|c| c.3).collect::<Vec<_>>())).into(),
    );
    limit_details.insert(
        "rounds".into(),
        runs.iter()
            .zip(&relays)
            .enumerate()
            .map(|(i, ((g, _, _), (r, _)))| json!({"round": i + 1, "subscribe_records_per_s": r3(*g), "relay_records_per_s": r3(*r)}))
            .collect::<Vec<_>>()
            .into(),
    );
    let c = median(&countings.iter().map(|c| c.0).collect::<Vec<_>>());
    let c_gateway_cpu = median(&countings.iter().map(|c| c.1).collect::<Vec<_>>());
    let c_reader_cpu = median(&countings.iter().map(|c| c.2).collect::<Vec<_>>());
    let counting_ratio = crate::scenarios::ratio(c, relay);
    let mut counting_details = Map::new();
    counting_details.insert("reader_style".into(), super::COUNTING_STYLE.into());
    counting_details.insert("relay_style".into(), super::RELAY_STYLE.into());
    counting_details.insert("gateway_cpu_us_per_record".into(), r3(c_gateway_cpu).into());
    counting_details.insert("reader_cpu_us_per_record".into(), r3(c_reader_cpu).into());
    counting_details.insert("relay_cpu_us_per_record".into(), r3(relay_cpu).into());
    counting_details.insert(
        "rounds".into(),
        countings
            .iter()
            .zip(&relays)
            .enumerate()
            .map(|(i, ((c, g_cpu, r_cpu), (r, _)))| json!({"round": i + 1, "counting_records_per_s": r3(*c), "relay_records_per_s": r3(*r), "gateway_cpu_us_per_record": r3(*g_cpu), "reader_cpu_us_per_record": r3(*r_cpu)}))
            .collect::<Vec<_>>()
            .into(),
    );
    let counting = Row {
        name: format!("{name}-limit-counting"),
        scenario: "drain-subscribe",
        unit: "records/s",
        gateway: r3(c),
        baseline: r3(relay),
        baseline_kind: "measured: the relay arm of drain-subscribe-limit, same rounds".into(),
        ratio: counting_ratio.map(r3),
        ratio_definition: "Subscribe records/s read by a reader that only counts them / relay records/s (medians across rounds)",
        goal: crate::report::NO_GOAL.into(),
        met: true,
        summary: format!(
            "gateway CPU {c_gateway_cpu:.2}, its reader {c_reader_cpu:.2}, relay CPU {relay_cpu:.2} us per record"
        ),
        details: counting_details,
        chart: against_relay(
            format!("{name}-limit-counting: one member read by a counting reader against the relay arm, records/s per round"),
            "counting reader",
            &countings.iter().map(|c| c.0).collect::<Vec<_>>(),
            &relays,
            relay,
        ),
    }
    .build();
    let limit = Row {
        name: format!("{name}-limit"),
        scenario: "drain-subscribe",
        unit: "records/s",
        gateway: r3(g),
        baseline: r3(relay),
        baseline_kind: "measured: the relay arm (a direct consumer of all 16 partitions sending every record's bytes on over loopback TCP), same run".into(),
        ratio: relay_ratio.map(r3),
        ratio_definition: "Subscribe records/s / relay records/s (medians across rounds)",
        goal: ">= 0.9 (issue 30)".into(),
        met: relay_ratio.is_some_and(|r| r >= 0.9),
        summary: format!(
            "gateway CPU {gateway_cpu:.2}, client CPU {client_cpu:.2}, relay CPU {relay_cpu:.2} us per record"
        ),
        details: limit_details,
        chart: against_relay(
            format!("{name}-limit: one member against the relay arm, records/s per round"),
            "subscribe",
            &runs.iter().map(|r| r.0).collect::<Vec<_>>(),
            &relays,
            relay,
        ),
    }
    .build();
    Ok(vec![
        Row {
            name: name.into(),
            scenario: "drain-subscribe",
            unit: "records/s",
            gateway: r3(g),
            baseline: r3(d),
            baseline_kind:
                "measured: one direct rdkafka BaseConsumer assigned all 16 partitions, same run"
                    .into(),
            ratio: ratio.map(r3),
            ratio_definition: "Subscribe records/s / direct records/s (medians across rounds)",
            goal: ">= 0.9 and slowest/fastest partition >= 0.8".into(),
            met: ratio.is_some_and(|r| r >= 0.9) && fair >= 0.8,
            summary: format!("one member, 16 partitions; slowest/fastest partition {fair:.2}"),
            details,
            chart: Chart {
                title: format!("{name}: one member drains 16 partitions, records/s per round"),
                unit: "records/s".into(),
                groups: runs
                    .iter()
                    .enumerate()
                    .map(|(i, (g, d, _))| {
                        (
                            format!("round {}", i + 1),
                            vec![("subscribe".into(), *g), ("direct rdkafka".into(), *d)],
                        )
                    })
                    .collect(),
                lines: vec![("0.9 x direct median".into(), 0.9 * d)],
            },
        }
        .build(),
        limit,
        counting,
    ])
}

/// A member's records/s per round (`label`) beside the relay arm's, with a line at 0.9 of
/// the relay's median.
fn against_relay(
    title: String,
    label: &str,
    rates: &[f64],
    relays: &[(f64, Option<f64>)],
    relay_median: f64,
) -> Chart {
    Chart {
        title,
        unit: "records/s".into(),
        groups: rates
            .iter()
            .zip(relays)
            .enumerate()
            .map(|(i, (g, (r, _)))| {
                (
                    format!("round {}", i + 1),
                    vec![(label.into(), *g), ("relay".into(), *r)],
                )
            })
            .collect(),
        lines: vec![("0.9 x relay median".into(), 0.9 * relay_median)],
    }
}

/// A member's events as the drain counts them: the Rust client's `Subscription`, or a
/// Subscribe read by the counting reader (`super::discard`).
enum Events {
    Client(Box<Subscription>),
    Counting(Box<tonic::Streaming<crate::scenarios::discard::Counted>>),
}

impl Events {
    /// The next event: `Some((partition, records))` for a records event, `None` for another.
    async fn next(&mut self) -> Result<Option<(i32, u64)>> {
        match self {
            Events::Client(member) => {
                let event = member
                    .next_event()
                    .await
                    .ok_or_else(|| anyhow!("the subscription ended"))??;
                Ok(match event {
                    SubscriptionEvent::Records { partition, batch } => {
                        Some((partition.partition(), batch.records.len() as u64))
                    }
                    _ => None,
                })
            }
            Events::Counting(stream) => {
                let counted = stream
                    .message()
                    .await?
                    .ok_or_else(|| anyhow!("the subscription ended"))?;
                Ok(counted.partition.map(|p| (p, counted.records)))
            }
        }
    }
}

/// One member of a fresh group subscribes to `topic` (16 partitions) and drains it: through
/// the Rust client, or, given `counting`, through the counting reader on that channel. Its
/// steady records/s and the slowest partition's rate over the fastest's.
async fn subscribe_drain(
    env: &Env,
    client: &Client,
    counting: Option<&tonic::transport::Channel>,
    topic: &str,
    per_partition: u64,
) -> Result<(f64, f64)> {
    let group = env.name("drainsub");
    let t0 = Instant::now();
    let (max_records, max_bytes, max_wait) = (10_000, 4 * 1024 * 1024, Duration::from_millis(10));
    let mut events = match counting {
        None => Events::Client(Box::new(
            client
                .subscribe(
                    SubscribeOptions::new(&group, [topic])
                        .member_id("drainer")
                        .max_records(max_records)
                        .max_bytes(max_bytes)
                        .max_wait(max_wait),
                )
                .await
                .context("Subscribe")?,
        )),
        Some(channel) => {
            let request = kafka_lease_client::proto::SubscribeRequest {
                group: group.clone(),
                topics: vec![topic.to_string()],
                member_id: "drainer".into(),
                max_records,
                max_bytes,
                max_wait: Some(prost_types::Duration {
                    seconds: 0,
                    nanos: max_wait.as_nanos() as i32,
                }),
                ..Default::default()
            };
            Events::Counting(Box::new(
                crate::scenarios::discard::subscribe(channel.clone(), request).await?,
            ))
        }
    };
    let total = per_partition * 16;
    let mut counts: BTreeMap<i32, (u64, f64)> = BTreeMap::new();
    let (mut n, mut first) = (0_u64, None::<(f64, u64)>);
    while n < total {
        let event = tokio::time::timeout(Duration::from_secs(600), events.next())
            .await
            .map_err(|_| anyhow!("the drain stalled"))??;
        if let Some((partition, k)) = event {
            let now = t0.elapsed().as_secs_f64();
            first.get_or_insert((now, k));
            n += k;
            let entry = counts.entry(partition).or_default();
            entry.0 += k;
            entry.1 = now;
        }
    }
    let last = t0.elapsed().as_secs_f64();
    let (first_at, first_n) = first.unwrap_or((0.0, 0));
    let rate = (n - first_n) as f64 / (last - first_at).max(1e-6);
    let rates: Vec<f64> = counts
        .values()
        .map(|(k, at)| *k as f64 / (at - first_at).max(1e-3))
        .collect();
    let (lo, hi) = min_max(&rates);
    Ok((rate, lo / hi))
}
