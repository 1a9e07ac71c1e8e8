//! Queue mode (Deliver and Acknowledge, through the Rust client's `Lease::consume`):
//! - `queue-slow-handler`: a handler that takes 5 ms, KEY order over 1,000 keys, 64 in
//!   flight, against the ideal 64 / 5 ms and against PARTITION order (one at a time);
//! - `queue-poison`: the same with one key whose every record fails, against the same run
//!   without it;
//! - `queue-overhead`: a handler that does nothing, UNORDERED: the gateway's CPU per record
//!   against a plain Read drain of the same records.
//!
//! Every run takes a fresh group on the same topic, so each starts at offset 0; the arms of
//! a scenario are interleaved in rounds.

use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use kafka_lease_client::{
    AcquireOptions, Client, ConsumeOptions, HandlerError, Ordering, QueueOptions, ReadOptions,
};
use serde_json::{json, Map};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::{acquire, at_most, r3, ratio, Row};
use crate::env::{create_topic, proc_cpu_seconds, produce_keyed, Env, Gateway};
use crate::report::{Chart, ScenarioResult};
use crate::stats::median;

/// The slow handler's time per record.
pub(crate) const HANDLER: Duration = Duration::from_millis(5);
/// Deliveries in flight (and handlers at once) of the slow-handler runs.
pub(crate) const IN_FLIGHT: u32 = 64;
/// Distinct keys of the slow-handler topic.
const KEYS: usize = 1_000;
/// The key whose records always fail in `queue-poison`.
const POISON_KEY: &[u8] = b"k0";
/// Deliveries in flight in the overhead runs: two full Deliver responses.
const OVERHEAD_IN_FLIGHT: u32 = 1_000;
/// Value size of the overhead topic's records.
const OVERHEAD_VALUE: usize = 1024;
/// How long one run may take before the scenario fails.
const RUN_DEADLINE: Duration = Duration::from_secs(600);

/// One consumer run: `handled` records (those counted) between the first handler's start and
/// the last counted record's end.
#[derive(Debug, Clone, Copy)]
pub(super) struct QueueRun {
    pub(super) handled: u64,
    pub(super) secs: f64,
    /// Mean time a counted handler took (its sleep as the runtime's timer served it).
    pub(super) handler_ms: f64,
    /// Records of the poison key sent to the dead letter topic by their last failure.
    pub(super) dead_lettered: u64,
    /// Gateway CPU (user + system) over the run.
    pub(super) gateway_cpu_secs: f64,
}

impl QueueRun {
    pub(super) fn rate(&self) -> f64 {
        self.handled as f64 / self.secs
    }
    fn cpu_us_per_record(&self) -> f64 {
        self.gateway_cpu_secs * 1e6 / self.handled as f64
    }
}

/// How a consumer run goes.
#[derive(Debug, Clone)]
pub(super) struct RunPlan<'a> {
    pub(super) topic: &'a str,
    pub(super) dead_letters: &'a str,
    pub(super) order: Ordering,
    pub(super) in_flight: u32,
    pub(super) handler: Duration,
    /// Stop once this many records (not of the poison key) were handled.
    pub(super) target: u64,
    pub(super) poison: bool,
}

/// When the run's counted records began and ended.
#[derive(Debug, Default)]
struct Clock {
    first_start: Option<Instant>,
    last_end: Option<Instant>,
    handler_total: Duration,
}

/// The slow handler's work: `time` on a thread of its own (a thread's sleep keeps to the
/// time asked within some tens of microseconds; the runtime's timer rounds each sleep up to
/// its next millisecond tick, which would make a 5 ms handler take 6).
pub(super) async fn handle(time: Duration) {
    #[allow(clippy::disallowed_methods)] // the handler's work, not a wait for an event
    let work = move || std::thread::sleep(time);
    let _ = tokio::task::spawn_blocking(work).await;
}

/// One consumer run through `gateway`: a fresh group's lease on partition 0, consumed with
/// `plan`'s handler until `plan.target` records were handled, then handed back and released.
pub(super) async fn consumer_run(
    env: &Env,
    gateway: &Gateway,
    client: &Client,
    plan: &RunPlan<'_>,
    done: Arc<AtomicU64>,
) -> Result<QueueRun> {
    let lease = acquire(
        client,
        AcquireOptions::new(env.name("queue"), plan.topic)
            .partition(0)
            .member("bench-queue")
            .ttl(Duration::from_secs(60)),
    )
    .await?;
    let handled = Arc::new(AtomicU64::new(0));
    let dead_lettered = Arc::new(AtomicU64::new(0));
    let clock = Arc::new(Mutex::new(Clock::default()));
    let finished = Arc::new(Notify::new());
    let queue = QueueOptions::new()
        .ordering(plan.order)
        .max_in_flight(plan.in_flight)
        .dead_letter_topic(plan.dead_letters);
    let options = ConsumeOptions::new(queue, plan.in_flight as usize);
    let (target, handler_time, poison) = (plan.target, plan.handler, plan.poison);
    let shutdown = {
        let finished = finished.clone();
        let handled = handled.clone();
        async move {
            while handled.load(AtomicOrdering::SeqCst) < target {
                finished.notified().await;
            }
        }
    };
    let handler = {
        let (handled, dead_lettered, clock, finished) = (
            handled.clone(),
            dead_lettered.clone(),
            clock.clone(),
            finished.clone(),
        );
        move |record: kafka_lease_client::Record, info: kafka_lease_client::DeliveryInfo| {
            let (handled, dead_lettered, clock, finished, done) = (
                handled.clone(),
                dead_lettered.clone(),
                clock.clone(),
                finished.clone(),
                done.clone(),
            );
            async move {
                let began = Instant::now();
                let is_poison = poison && record.key.as_deref() == Some(POISON_KEY);
                if !is_poison {
                    let mut c = clock.lock().unwrap_or_else(|e| e.into_inner());
                    c.first_start.get_or_insert(began);
                }
                if !handler_time.is_zero() {
                    handle(handler_time).await;
                }
                if is_poison {
                    // The consumer's default: 5 deliveries, then the dead letter topic.
                    if info.attempt >= 5 {
                        dead_lettered.fetch_add(1, AtomicOrdering::Relaxed);
                    }
                    return Err(HandlerError::retry("poison"));
                }
                let ended = Instant::now();
                {
                    let mut c = clock.lock().unwrap_or_else(|e| e.into_inner());
                    c.handler_total += ended - began;
                    c.last_end = Some(c.last_end.map_or(ended, |l| l.max(ended)));
                }
                done.fetch_add(1, AtomicOrdering::Relaxed);
                if handled.fetch_add(1, AtomicOrdering::SeqCst) + 1 >= target {
                    finished.notify_one();
                }
                Ok(())
            }
        }
    };
    let cpu_before = proc_cpu_seconds(gateway.pid())?;
    let consumed = tokio::time::timeout(RUN_DEADLINE, lease.consume(options, shutdown, handler))
        .await
        .map_err(|_| anyhow!("a queue run took longer than {RUN_DEADLINE:?}"))?;
    let cpu_after = proc_cpu_seconds(gateway.pid())?;
    let _ = lease.release().await;
    consumed.context("consume")?;
    let count = handled.load(AtomicOrdering::SeqCst);
    let c = clock.lock().unwrap_or_else(|e| e.into_inner());
    let (Some(first), Some(last)) = (c.first_start, c.last_end) else {
        bail!("the run handled no record");
    };
    Ok(QueueRun {
        handled: count,
        secs: (last - first).as_secs_f64().max(1e-6),
        handler_ms: c.handler_total.as_secs_f64() * 1e3 / count.max(1) as f64,
        dead_lettered: dead_lettered.load(AtomicOrdering::Relaxed),
        gateway_cpu_secs: cpu_after - cpu_before,
    })
}

/// A Read drain of `count` records of partition 0 through `client`, with a fresh group:
/// (records, seconds, gateway CPU seconds).
async fn read_run(
    env: &Env,
    gateway: &Gateway,
    client: &Client,
    topic: &str,
    count: u64,
    done: Arc<AtomicU64>,
) -> Result<QueueRun> {
    let lease = acquire(
        client,
        AcquireOptions::new(env.name("queue-read"), topic)
            .partition(0)
            .member("bench-queue")
            .ttl(Duration::from_secs(60)),
    )
    .await?;
    let cpu_before = proc_cpu_seconds(gateway.pid())?;
    let mut stream = lease
        .records(
            ReadOptions::new()
                .max_records(10_000)
                .max_bytes(4 * 1024 * 1024)
                .max_wait(Duration::from_millis(10)),
        )
        .await
        .context("Read")?;
    let mut n = 0_u64;
    let mut first = None;
    let drained = tokio::time::timeout(RUN_DEADLINE, async {
        while n < count {
            match stream.next_batch().await {
                Some(Ok(batch)) => {
                    first.get_or_insert_with(Instant::now);
                    n += batch.records.len() as u64;
                    done.fetch_add(batch.records.len() as u64, AtomicOrdering::Relaxed);
                }
                Some(Err(e)) => return Err(anyhow!(e).context("Read failed")),
                None => bail!("the Read ended after {n} records"),
            }
        }
        Ok(())
    })
    .await
    .map_err(|_| anyhow!("a Read drain took longer than {RUN_DEADLINE:?}"))?;
    let end = Instant::now();
    let cpu_after = proc_cpu_seconds(gateway.pid())?;
    drop(stream);
    let _ = lease.release().await;
    drained?;
    Ok(QueueRun {
        handled: n,
        secs: first.map_or(1e-6, |f| (end - f).as_secs_f64().max(1e-6)),
        handler_ms: 0.0,
        dead_lettered: 0,
        gateway_cpu_secs: cpu_after - cpu_before,
    })
}

/// A gateway, a topic of `count` keyed records and a dead letter topic, for one scenario.
pub(super) struct Setup {
    pub(super) gateway: Gateway,
    pub(super) client: Client,
    pub(super) topic: String,
    pub(super) dead_letters: String,
}

pub(super) async fn setup(
    env: &Env,
    name: &str,
    count: usize,
    keys: usize,
    value_size: usize,
) -> Result<Setup> {
    let topic = env.name(name);
    let dead_letters = env.name(&format!("{name}-dlq"));
    create_topic(env, &topic, 1).await?;
    create_topic(env, &dead_letters, 1).await?;
    produce_keyed(env, name, &topic, count, keys, value_size).await?;
    let gateway = Gateway::start(
        env,
        &env.prefix(name),
        &env.name(&format!("gw-{name}")),
        None,
    )
    .await?;
    let client = match gateway.client().await {
        Ok(c) => c,
        Err(e) => {
            gateway.stop().await;
            return Err(e);
        }
    };
    Ok(Setup {
        gateway,
        client,
        topic,
        dead_letters,
    })
}

/// Runs `arms` (label, plan) interleaved for the plan's rounds, each with a progress ticker.
async fn interleaved(
    env: &Env,
    name: &str,
    setup: &Setup,
    arms: &[(&str, RunPlan<'_>)],
) -> Result<Vec<Vec<QueueRun>>> {
    let mut runs: Vec<Vec<QueueRun>> = vec![Vec::new(); arms.len()];
    for round in 1..=env.plan.rounds {
        for (i, (label, plan)) in arms.iter().enumerate() {
            let done = Arc::new(AtomicU64::new(0));
            let _ticker = env.progress.ticker(
                format!("{name} round {round}/{}: {label}", env.plan.rounds),
                done.clone(),
                plan.target,
                "records",
            );
            let run = consumer_run(env, &setup.gateway, &setup.client, plan, done).await?;
            env.progress.say(format!(
                "  {name} round {round}: {label} {:.0} records/s ({} in {:.2}s; handler {:.2} ms)",
                run.rate(),
                run.handled,
                run.secs,
                run.handler_ms
            ));
            runs[i].push(run);
        }
    }
    Ok(runs)
}

fn rates(runs: &[QueueRun]) -> Vec<f64> {
    runs.iter().map(QueueRun::rate).collect()
}

pub(super) fn rounds_chart(
    title: String,
    unit: &str,
    arms: &[(&str, &[QueueRun])],
    line: Option<(String, f64)>,
    value: fn(&QueueRun) -> f64,
) -> Chart {
    let rounds = arms.first().map_or(0, |(_, r)| r.len());
    Chart {
        title,
        unit: unit.into(),
        groups: (0..rounds)
            .map(|i| {
                (
                    format!("round {}", i + 1),
                    arms.iter()
                        .map(|(label, runs)| (label.to_string(), value(&runs[i])))
                        .collect(),
                )
            })
            .collect(),
        lines: line.into_iter().collect(),
    }
}

/// `queue-slow-handler`: KEY order at 64 in flight against the ideal and against PARTITION.
pub(crate) async fn slow_handler(env: &Env) -> Result<Vec<ScenarioResult>> {
    let name = "queue-slow-handler";
    let (keyed, in_order) = env.plan.queue_slow_records;
    let setup = setup(env, name, keyed, KEYS, 100).await?;
    let result = async {
        let plan = |order, target| RunPlan {
            topic: &setup.topic,
            dead_letters: &setup.dead_letters,
            order,
            in_flight: IN_FLIGHT,
            handler: HANDLER,
            target,
            poison: false,
        };
        interleaved(
            env,
            name,
            &setup,
            &[
                ("KEY", plan(Ordering::Key, keyed as u64)),
                ("PARTITION", plan(Ordering::Partition, in_order as u64)),
            ],
        )
        .await
    }
    .await;
    setup.gateway.stop().await;
    let runs = result?;
    let (key_runs, partition_runs) = (&runs[0], &runs[1]);
    let ideal = f64::from(IN_FLIGHT) / HANDLER.as_secs_f64();
    let key_rate = median(&rates(key_runs));
    let partition_rate = median(&rates(partition_runs));
    let handler_ms = median(&key_runs.iter().map(|r| r.handler_ms).collect::<Vec<_>>());
    let of_ideal = key_rate / ideal;
    let speedup = key_rate / partition_rate;
    let mut details = Map::new();
    details.insert(
        "records_per_run".into(),
        json!({"KEY": keyed, "PARTITION": in_order}),
    );
    details.insert("keys".into(), KEYS.into());
    details.insert("in_flight".into(), IN_FLIGHT.into());
    details.insert("handler_ms".into(), (HANDLER.as_millis() as u64).into());
    details.insert("handler_measured_ms".into(), r3(handler_ms).into());
    details.insert(
        "ideal_at_measured_handler".into(),
        r3(f64::from(IN_FLIGHT) / (handler_ms / 1e3)).into(),
    );
    details.insert(
        "key_rates".into(),
        rates(key_runs)
            .into_iter()
            .map(r3)
            .collect::<Vec<_>>()
            .into(),
    );
    details.insert(
        "partition_rates".into(),
        rates(partition_runs)
            .into_iter()
            .map(r3)
            .collect::<Vec<_>>()
            .into(),
    );
    details.insert("timing".into(), "records handled over the time from the first handler's start to the last counted handler's end; the handler is a tokio sleep of 5 ms (the runtime's timer rounds it up to the next millisecond); each run a fresh group from offset 0; KEY and PARTITION interleaved".into());
    let ideal_row = Row {
        name: name.into(),
        scenario: "queue-slow-handler",
        unit: "records/s",
        gateway: r3(key_rate),
        baseline: r3(ideal),
        baseline_kind: "constant: the ideal, 64 in flight / 5 ms".into(),
        ratio: ratio(key_rate, ideal).map(r3),
        ratio_definition: "KEY-order records/s / (64 / 5 ms)",
        goal: ">= 0.8".into(),
        met: of_ideal >= 0.8,
        summary: format!(
            "KEY over {KEYS} keys, 64 in flight, 5 ms handler (measured {handler_ms:.2} ms): {key_rate:.0} records/s of the ideal {ideal:.0}"
        ),
        details: details.clone(),
        chart: rounds_chart(
            "queue-slow-handler: KEY order, 64 in flight, 5 ms handler".into(),
            "records/s",
            &[("KEY", key_runs)],
            Some(("ideal 64 / 5 ms".into(), ideal)),
            QueueRun::rate,
        ),
    };
    let partition_row = Row {
        name: format!("{name}-vs-partition"),
        scenario: "queue-slow-handler",
        unit: "records/s",
        gateway: r3(key_rate),
        baseline: r3(partition_rate),
        baseline_kind: "measured: PARTITION order (one record at a time), same handler, same run"
            .into(),
        ratio: Some(r3(speedup)),
        ratio_definition: "KEY-order records/s / PARTITION-order records/s",
        goal: ">= 50".into(),
        met: speedup >= 50.0,
        summary: format!(
            "KEY {key_rate:.0} vs PARTITION {partition_rate:.0} records/s ({speedup:.1}x)"
        ),
        details,
        chart: rounds_chart(
            "queue-slow-handler: KEY vs PARTITION order".into(),
            "records/s",
            &[("KEY", key_runs), ("PARTITION", partition_runs)],
            None,
            QueueRun::rate,
        ),
    };
    Ok(vec![ideal_row.build(), partition_row.build()])
}

/// `queue-poison`: the slow-handler run with one key whose records always fail.
pub(crate) async fn poison(env: &Env) -> Result<Vec<ScenarioResult>> {
    let name = "queue-poison";
    let (records, _) = env.plan.queue_slow_records;
    let setup = setup(env, name, records, KEYS, 100).await?;
    // Both arms stop after the same number of healthy records: those of every other key.
    let healthy = (records - records.div_ceil(KEYS)) as u64;
    let result = async {
        let plan = |poison| RunPlan {
            topic: &setup.topic,
            dead_letters: &setup.dead_letters,
            order: Ordering::Key,
            in_flight: IN_FLIGHT,
            handler: HANDLER,
            target: healthy,
            poison,
        };
        interleaved(
            env,
            name,
            &setup,
            &[("without poison", plan(false)), ("with poison", plan(true))],
        )
        .await
    }
    .await;
    setup.gateway.stop().await;
    let runs = result?;
    let (clean, poisoned) = (&runs[0], &runs[1]);
    let clean_rate = median(&rates(clean));
    let poisoned_rate = median(&rates(poisoned));
    let share = poisoned_rate / clean_rate;
    let dead: Vec<u64> = poisoned.iter().map(|r| r.dead_lettered).collect();
    let mut details = Map::new();
    details.insert("records".into(), records.into());
    details.insert("healthy_records_counted".into(), healthy.into());
    details.insert(
        "poison_key".into(),
        String::from_utf8_lossy(POISON_KEY).into_owned().into(),
    );
    details.insert("poison_records".into(), records.div_ceil(KEYS).into());
    details.insert(
        "poison_records_dead_lettered_per_run".into(),
        dead.clone().into(),
    );
    details.insert(
        "clean_rates".into(),
        rates(clean).into_iter().map(r3).collect::<Vec<_>>().into(),
    );
    details.insert(
        "poisoned_rates".into(),
        rates(poisoned)
            .into_iter()
            .map(r3)
            .collect::<Vec<_>>()
            .into(),
    );
    details.insert("timing".into(), "records of the other keys handled over the time from the first one's start to the last one's end; the poison key's records fail every delivery (the consumer's default backoff, 100 ms doubling; the 5th failure sends the record to the dead letter topic), one at a time in key order; both arms count the same number of healthy records".into());
    Ok(vec![Row {
        name: name.into(),
        scenario: "queue-poison",
        unit: "records/s",
        gateway: r3(poisoned_rate),
        baseline: r3(clean_rate),
        baseline_kind: "measured: the same run without the poison key, same run".into(),
        ratio: ratio(poisoned_rate, clean_rate).map(r3),
        ratio_definition: "records/s of the other keys with a poison key / without",
        goal: ">= 0.9".into(),
        met: share >= 0.9,
        summary: format!(
            "{poisoned_rate:.0} vs {clean_rate:.0} records/s of the other keys; poison records dead-lettered per run {dead:?}"
        ),
        details,
        chart: rounds_chart(
            "queue-poison: other keys' rate with and without a poison key".into(),
            "records/s",
            &[("without poison", clean), ("with poison", poisoned)],
            None,
            QueueRun::rate,
        ),
    }
    .build()])
}

/// `queue-overhead`: gateway CPU per record of a no-op UNORDERED consumer against a Read
/// drain of the same records.
pub(crate) async fn overhead(env: &Env) -> Result<Vec<ScenarioResult>> {
    let name = "queue-overhead";
    let records = env.plan.queue_overhead_records;
    let setup = setup(env, name, records, KEYS, OVERHEAD_VALUE).await?;
    let result = async {
        let plan = RunPlan {
            topic: &setup.topic,
            dead_letters: &setup.dead_letters,
            order: Ordering::Unordered,
            in_flight: OVERHEAD_IN_FLIGHT,
            handler: Duration::ZERO,
            target: records as u64,
            poison: false,
        };
        let (mut reads, mut queues) = (Vec::new(), Vec::new());
        for round in 1..=env.plan.rounds {
            let done = Arc::new(AtomicU64::new(0));
            let ticker = env.progress.ticker(
                format!("{name} round {round}/{}: Read", env.plan.rounds),
                done.clone(),
                records as u64,
                "records",
            );
            let read = read_run(env, &setup.gateway, &setup.client, &setup.topic, records as u64, done).await?;
            drop(ticker);
            let done = Arc::new(AtomicU64::new(0));
            let ticker = env.progress.ticker(
                format!("{name} round {round}/{}: queue", env.plan.rounds),
                done.clone(),
                records as u64,
                "records",
            );
            let queue = consumer_run(env, &setup.gateway, &setup.client, &plan, done).await?;
            drop(ticker);
            env.progress.say(format!(
                "  {name} round {round}: gateway CPU {:.2} us/record queued ({:.0} records/s) vs {:.2} Read ({:.0} records/s)",
                queue.cpu_us_per_record(),
                queue.rate(),
                read.cpu_us_per_record(),
                read.rate()
            ));
            reads.push(read);
            queues.push(queue);
        }
        Ok::<_, anyhow::Error>((reads, queues))
    }
    .await;
    setup.gateway.stop().await;
    let (reads, queues) = result?;
    let cpu = |runs: &[QueueRun]| {
        median(
            &runs
                .iter()
                .map(QueueRun::cpu_us_per_record)
                .collect::<Vec<_>>(),
        )
    };
    let (read_cpu, queue_cpu) = (cpu(&reads), cpu(&queues));
    let times = queue_cpu / read_cpu;
    let mut details = Map::new();
    details.insert("records".into(), records.into());
    details.insert("value_bytes".into(), OVERHEAD_VALUE.into());
    details.insert("in_flight".into(), OVERHEAD_IN_FLIGHT.into());
    details.insert("queue_rate".into(), r3(median(&rates(&queues))).into());
    details.insert("read_rate".into(), r3(median(&rates(&reads))).into());
    details.insert(
        "rounds_cpu_us_per_record".into(),
        reads
            .iter()
            .zip(&queues)
            .map(|(r, q)| json!({"read": r3(r.cpu_us_per_record()), "queue": r3(q.cpu_us_per_record())}))
            .collect::<Vec<_>>()
            .into(),
    );
    details.insert("timing".into(), "the gateway process's CPU (user + system, /proc) from just before the Read (or the Deliver) to the last record, over the records; the queue arm's handler does nothing and answers every record with ACCEPT (the client batches the answers); each run a fresh group from offset 0; Read and queue interleaved".into());
    Ok(vec![Row {
        name: name.into(),
        scenario: "queue-overhead",
        unit: "CPU us/record",
        gateway: r3(queue_cpu),
        baseline: r3(read_cpu),
        baseline_kind: "measured: a Read drain of the same records through the same gateway, same run".into(),
        ratio: ratio(queue_cpu, read_cpu).map(r3),
        ratio_definition: "gateway CPU per record, queue mode / Read",
        goal: "<= 2".into(),
        met: at_most(times, 2.0),
        summary: format!(
            "UNORDERED, {OVERHEAD_IN_FLIGHT} in flight, no-op handler: {queue_cpu:.2} vs {read_cpu:.2} us of gateway CPU per record ({:.0} vs {:.0} records/s)",
            median(&rates(&queues)),
            median(&rates(&reads))
        ),
        details,
        chart: rounds_chart(
            "queue-overhead: gateway CPU per record, queue mode vs Read".into(),
            "CPU us/record",
            &[("queue", &queues), ("Read", &reads)],
            Some(("2x Read".into(), 2.0 * read_cpu)),
            QueueRun::cpu_us_per_record,
        ),
    }
    .build()])
}
