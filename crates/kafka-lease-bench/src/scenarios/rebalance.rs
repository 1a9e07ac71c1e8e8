//! `rebalance`: how long a group of members (Subscribe) on two gateways takes to make room
//! for a new one, and to take a leaver's partitions back (`drain-subscribe` is in
//! `drain/subscribe.rs`).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use kafka_lease_client::{Client, SubscribeOptions, Subscription, SubscriptionEvent};
use serde_json::Map;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::{r3, ratio, Row};
use crate::consul::RawConsul;
use crate::env::{create_topic, Env, Gateway};
use crate::report::{Chart, ScenarioResult};
use crate::stats::{median, percentile};

const PARTITIONS: i32 = 12;
/// Members already in the group when the new one joins.
const MEMBERS: usize = 3;
/// The goal on the p99 of joins and of leaves (issue 47; 1 s before it).
const GOAL_S: f64 = 0.25;
/// How long one round may take before the scenario fails.
const ROUND_DEADLINE: Duration = Duration::from_secs(60);

/// What the bench sees of one member.
#[derive(Default)]
struct Seen {
    /// Partitions assigned and not revoked since.
    held: HashSet<i32>,
    /// Held partitions that delivered a batch since their assignment.
    streaming: HashSet<i32>,
    /// `assigned` events so far.
    assigned: usize,
}

/// Runs a member: commits every batch at once, and on `revoking` commits again at once, so
/// that a lease moves as soon as the gateway lets it.
fn run_member(mut member: Subscription, seen: Arc<Mutex<Seen>>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut next: HashMap<String, i64> = HashMap::new();
        while let Some(Ok(event)) = member.next_event().await {
            match event {
                SubscriptionEvent::Assigned {
                    partition, offset, ..
                } => {
                    next.insert(partition.lease_id().to_string(), offset);
                    let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
                    seen.held.insert(partition.partition());
                    seen.assigned += 1;
                }
                SubscriptionEvent::Records { partition, batch } => {
                    if let Some(n) = batch.next_offset() {
                        next.insert(partition.lease_id().to_string(), n);
                        let _ = partition.commit(n).await;
                    }
                    seen.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .streaming
                        .insert(partition.partition());
                }
                SubscriptionEvent::Revoking { partition, .. } => {
                    if let Some(&n) = next.get(partition.lease_id()) {
                        let _ = partition.commit(n).await;
                    }
                }
                SubscriptionEvent::Revoked { partition, .. } => {
                    let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
                    seen.held.remove(&partition.partition());
                    seen.streaming.remove(&partition.partition());
                }
                _ => {}
            }
        }
    })
}

async fn join(
    client: &Client,
    group: &str,
    topic: &str,
    id: &str,
) -> Result<(JoinHandle<()>, Arc<Mutex<Seen>>)> {
    let member = client
        .subscribe(
            SubscribeOptions::new(group, [topic])
                .member_id(id)
                .max_wait(Duration::from_millis(10)),
        )
        .await
        .with_context(|| format!("Subscribe of {id}"))?;
    let seen = Arc::new(Mutex::new(Seen::default()));
    Ok((run_member(member, seen.clone()), seen))
}

/// Waits until `check` holds on the members' views.
async fn until(
    seen: &[Arc<Mutex<Seen>>],
    what: &str,
    check: impl Fn(&[Seen]) -> bool,
) -> Result<()> {
    let started = Instant::now();
    loop {
        let snapshot: Vec<Seen> = seen
            .iter()
            .map(|s| {
                let s = s.lock().unwrap_or_else(|p| p.into_inner());
                Seen {
                    held: s.held.clone(),
                    streaming: s.streaming.clone(),
                    assigned: s.assigned,
                }
            })
            .collect();
        if check(&snapshot) {
            return Ok(());
        }
        if started.elapsed() > ROUND_DEADLINE {
            let state: Vec<(Vec<i32>, Vec<i32>)> = snapshot
                .iter()
                .map(|s| {
                    let mut held: Vec<i32> = s.held.iter().copied().collect();
                    let mut streaming: Vec<i32> = s.streaming.iter().copied().collect();
                    held.sort_unstable();
                    streaming.sort_unstable();
                    (held, streaming)
                })
                .collect();
            bail!("{what} did not happen within {ROUND_DEADLINE:?}; (held, streaming) per member: {state:?}");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

pub(crate) async fn run(env: &Env) -> Result<Vec<ScenarioResult>> {
    let name = "rebalance";
    let topic = env.name("rebalance");
    create_topic(env, &topic, PARTITIONS).await?;
    // Two gateways with one Consul prefix: the members are spread over both, so every
    // rebalance is decided by two instances whose views of the group differ for a moment.
    let prefix = env.prefix(name);
    let a = Gateway::start(env, &prefix, &env.name("gw-rebalance-a"), None).await;
    let b = Gateway::start(env, &prefix, &env.name("gw-rebalance-b"), None).await;
    let (a, b) = match (a, b) {
        (Ok(a), Ok(b)) => (a, b),
        (a, b) => {
            for g in [a, b].into_iter().flatten() {
                g.stop().await;
            }
            bail!("the two gateways of the rebalance scenario did not both start");
        }
    };
    let result = rounds(env, [&a, &b], &prefix, &topic).await;
    a.stop().await;
    b.stop().await;
    let Rounds {
        joins,
        leaves,
        moved,
        minimum,
        join_writes,
        leave_writes,
        join_epochs,
        leave_epochs,
    } = result?;
    let floats = |v: &[u64]| v.iter().map(|&x| x as f64).collect::<Vec<_>>();
    let (writes_join, writes_leave) = (
        median(&floats(&join_writes)),
        median(&floats(&leave_writes)),
    );
    let epochs: u64 = join_epochs.iter().chain(&leave_epochs).sum();
    let changes = join_epochs.len() + leave_epochs.len();
    let (p50, p99, max) = (
        percentile(&joins, 50.0),
        percentile(&joins, 99.0),
        percentile(&joins, 100.0),
    );
    let (leave_p50, leave_p99, leave_max) = (
        percentile(&leaves, 50.0),
        percentile(&leaves, 99.0),
        percentile(&leaves, 100.0),
    );
    let mut details = Map::new();
    details.insert("p50_s".into(), r3(p50).into());
    details.insert("p99_s".into(), r3(p99).into());
    details.insert("max_s".into(), r3(max).into());
    details.insert("leave_p50_s".into(), r3(leave_p50).into());
    details.insert("leave_p99_s".into(), r3(leave_p99).into());
    details.insert("leave_max_s".into(), r3(leave_max).into());
    details.insert("partitions".into(), PARTITIONS.into());
    details.insert("members_before_the_join".into(), MEMBERS.into());
    details.insert("gateways".into(), 2.into());
    details.insert("partitions_moved".into(), moved.into());
    details.insert("partitions_moved_minimum".into(), minimum.into());
    details.insert(
        "consul_writes_per_join_median".into(),
        r3(writes_join).into(),
    );
    details.insert(
        "consul_writes_per_leave_median".into(),
        r3(writes_leave).into(),
    );
    details.insert("consul_writes_per_join".into(), join_writes.clone().into());
    details.insert(
        "consul_writes_per_leave".into(),
        leave_writes.clone().into(),
    );
    details.insert("target_epochs_per_join".into(), join_epochs.clone().into());
    details.insert(
        "target_epochs_per_leave".into(),
        leave_epochs.clone().into(),
    );
    details.insert(
        "samples_s".into(),
        joins.iter().map(|x| r3(*x)).collect::<Vec<_>>().into(),
    );
    details.insert(
        "leave_samples_s".into(),
        leaves.iter().map(|x| r3(*x)).collect::<Vec<_>>().into(),
    );
    details.insert("timing".into(), "two gateways, one Consul prefix; old members on A, B, A; the newcomer alternates between B and A. Join: from just before the new member's Subscribe call to the moment it holds its share (3 of 12 partitions) and has received a batch of each. Leave: from the newcomer's stream being dropped to the moment the old members hold 4 each and have received a batch of each. The old members commit at once on every batch and on revoking; one record per partition is produced every 20 ms throughout, so every moved partition has records to stream. Moves: assigned events per round against the minimum (3 on a join, 3 on a leave). Consul writes: Consul's Raft index from just before the change to balanced (the member record, the target's check-and-set writes, a release and an acquire per moved partition); epochs: the published target's epoch, before and after".into());
    let worst = p99.max(leave_p99);
    Ok(vec![
        Row {
            name: name.into(),
            scenario: "rebalance",
            unit: "s (p99)",
            gateway: r3(worst),
            baseline: GOAL_S,
            baseline_kind:
                "constant: the goal's 0.25 s (Kafka's own cooperative rebalance is not run here)"
                    .into(),
            ratio: ratio(worst, GOAL_S).map(r3),
            ratio_definition: "the larger of the join and leave p99s / 0.25 s (met when <= 1)",
            goal: "p99 of joins and of leaves <= 0.25 s, moves = minimum".into(),
            met: worst <= GOAL_S && moved == minimum,
            summary: format!(
            "joins p50 {p50:.3} s, p99 {p99:.3} s, max {max:.3} s over {} joins of a 4th member \
             to 3 on 12 partitions, members on two gateways; leaves p50 {leave_p50:.3} s, p99 \
             {leave_p99:.3} s; {moved} partitions moved (minimum {minimum}); Consul writes per \
             join {writes_join:.0}, per leave {writes_leave:.0} (median), {epochs} target \
             epochs over {changes} changes",
            joins.len()
        ),
            details,
            chart: Chart {
                title: "rebalance: a member's join to its share streaming".into(),
                unit: "s".into(),
                groups: vec![
                    ("p50".into(), vec![("gateway".into(), p50)]),
                    ("p99".into(), vec![("gateway".into(), p99)]),
                    ("max".into(), vec![("gateway".into(), max)]),
                ],
                lines: vec![("goal 0.25 s".into(), GOAL_S)],
            },
        }
        .build(),
    ])
}

/// What the rounds measured.
struct Rounds {
    /// Join to balanced, s.
    joins: Vec<f64>,
    /// Leave to balanced, s.
    leaves: Vec<f64>,
    /// Partitions assigned during the rounds, and how many had to be.
    moved: usize,
    minimum: usize,
    /// Per join and per leave: Consul's Raft writes from the change to balanced, and the
    /// target assignments published (epochs).
    join_writes: Vec<u64>,
    leave_writes: Vec<u64>,
    join_epochs: Vec<u64>,
    leave_epochs: Vec<u64>,
}

/// The epoch of the published target of (`group`, `topic`) under `prefix`; 0 when none.
async fn epoch(raft: &mut RawConsul, prefix: &str, group: &str, topic: &str) -> Result<u64> {
    let r = raft
        .request(
            "GET",
            &format!("/v1/kv/{prefix}/{group}/{topic}/~target?raw"),
            b"",
        )
        .await?;
    if r.status == 404 {
        return Ok(0);
    }
    if r.status != 200 {
        bail!("reading the target: {} {}", r.status, r.text());
    }
    let v: serde_json::Value = serde_json::from_slice(&r.body).context("parsing the target")?;
    v.get("epoch")
        .and_then(serde_json::Value::as_u64)
        .ok_or_else(|| anyhow!("the target has no epoch: {}", r.text()))
}

async fn rounds(env: &Env, gateways: [&Gateway; 2], prefix: &str, topic: &str) -> Result<Rounds> {
    let clients = [gateways[0].client().await?, gateways[1].client().await?];
    let mut raft = RawConsul::new(&env.services.consul_http_addr);
    let group = env.name("rebalance");
    // Records all along, so that a moved partition has something to stream.
    let producer = crate::env::bulk_producer(env)?;
    let producing = {
        let topic = topic.to_string();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(20)).await;
                for p in 0..PARTITIONS {
                    let record = rdkafka::producer::FutureRecord::<(), [u8]>::to(&topic)
                        .partition(p)
                        .payload(b"r");
                    let _ = producer.send(record, Duration::from_secs(5)).await;
                }
            }
        })
    };
    let result = async {
        let mut members = Vec::new();
        let mut seen = Vec::new();
        for i in 0..MEMBERS {
            let client = &clients[i % 2];
            let (task, s) = join(client, &group, topic, &format!("old-{i}")).await?;
            members.push(task);
            seen.push(s);
        }
        // Settled: each old member holds its share and streams it.
        let each = PARTITIONS as usize / MEMBERS;
        let settled = |v: &[Seen]| {
            v.iter()
                .all(|s| s.held.len() == each && s.streaming.len() == each)
        };
        until(&seen, "the first members to settle", settled).await?;
        let assigned = |seen: &[Arc<Mutex<Seen>>]| -> usize {
            seen.iter()
                .map(|s| s.lock().unwrap_or_else(|p| p.into_inner()).assigned)
                .sum()
        };
        let (mut joins, mut leaves, mut moved, mut minimum) = (Vec::new(), Vec::new(), 0, 0);
        let (mut join_writes, mut leave_writes) = (Vec::new(), Vec::new());
        let (mut join_epochs, mut leave_epochs) = (Vec::new(), Vec::new());
        for round in 1..=env.plan.rebalance_rounds {
            let before = assigned(&seen);
            let (r0, e0) = (
                raft.raft_index().await?,
                epoch(&mut raft, prefix, &group, topic).await?,
            );
            let t0 = Instant::now();
            let client = &clients[round % 2];
            let (task, newcomer) = join(client, &group, topic, &format!("new-{round}")).await?;
            let share = PARTITIONS as usize / (MEMBERS + 1);
            let old_share = |v: &[Seen]| v.iter().all(|s| s.held.len() == share);
            until(
                std::slice::from_ref(&newcomer),
                "the newcomer's share to stream",
                |v| v[0].held.len() == share && v[0].streaming.len() == share,
            )
            .await?;
            let join_took = t0.elapsed().as_secs_f64();
            joins.push(join_took);
            until(&seen, "the old members to give up the newcomer's share", old_share).await?;
            let join_moved = assigned(&seen) - before
                + newcomer.lock().unwrap_or_else(|p| p.into_inner()).assigned;
            let before = assigned(&seen);
            let (r1, e1) = (
                raft.raft_index().await?,
                epoch(&mut raft, prefix, &group, topic).await?,
            );
            let t1 = Instant::now();
            task.abort();
            let _ = task.await;
            until(&seen, "the old members to take the leaver's share", settled).await?;
            let leave_took = t1.elapsed().as_secs_f64();
            leaves.push(leave_took);
            let leave_moved = assigned(&seen) - before;
            let (r2, e2) = (
                raft.raft_index().await?,
                epoch(&mut raft, prefix, &group, topic).await?,
            );
            moved += join_moved + leave_moved;
            minimum += 2 * share;
            join_writes.push(r1 - r0);
            leave_writes.push(r2 - r1);
            join_epochs.push(e1 - e0);
            leave_epochs.push(e2 - e1);
            env.progress.say(format!(
                "  rebalance round {round}/{}: join balanced in {join_took:.3} s ({join_moved} moved, {} Consul writes, {} epochs), leave in {leave_took:.3} s ({leave_moved} moved, {} Consul writes, {} epochs)",
                env.plan.rebalance_rounds,
                r1 - r0,
                e1 - e0,
                r2 - r1,
                e2 - e1,
            ));
        }
        for member in members {
            member.abort();
        }
        Ok::<_, anyhow::Error>(Rounds {
            joins,
            leaves,
            moved,
            minimum,
            join_writes,
            leave_writes,
            join_epochs,
            leave_epochs,
        })
    }
    .await;
    producing.abort();
    result
}
