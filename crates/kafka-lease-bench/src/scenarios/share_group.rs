//! `queue-vs-share-group`: queue mode against Kafka's share groups (KIP-932), the peer that
//! does the same job inside the broker, on the same records with the same 5 ms handler and
//! the same concurrency (64):
//! - rate: the gateway's UNORDERED deliveries through the Rust client's `Lease::consume`
//!   against 64 of Kafka's own Java share consumers (`java/ShareGroupBench.java`), one handler
//!   each; interleaved rounds, each on a fresh group from the first offset;
//! - redelivery: two consumer processes of one group, the one with records in flight
//!   SIGKILLed; the time from the kill until every record it had started and not finished was
//!   handed to the other. The gateway arm's processes are Subscribe members in queue mode
//!   (`kafka-lease-bench --queue-member`); the share group's, the Java program's `member` mode.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Map};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::queue::{consumer_run, setup, QueueRun, RunPlan, HANDLER, IN_FLIGHT};
use super::{r3, ratio, Row};
use crate::env::{create_topic, produce_fill, Env};
use crate::report::{Chart, ScenarioResult};
use crate::stats::median;

/// Records each Java share consumer acquires per poll (`max.poll.records`, strict with
/// `share.acquire.mode=record_limit`). Each consumer handles its records one at a time.
const SHARE_MAX_POLL: u32 = 10;
/// How long a kill run may wait for the records in flight to come again: past the share
/// group's 30 s record lock and 45 s session timeout.
const REDELIVERY_DEADLINE: Duration = Duration::from_secs(120);
/// How long a member may take to start handling.
const START_DEADLINE: Duration = Duration::from_secs(60);
/// The handler of the kill runs: long enough that what the bench last read of a member's
/// output is still what it has in flight when the signal lands (a 5 ms handler's records
/// are often all done by then on a loaded machine).
const KILL_HANDLER: Duration = Duration::from_millis(50);
/// Kill runs tried before one in which the killed member had records in flight.
const KILL_ATTEMPTS: usize = 3;
/// Records the consumer to be killed should have in flight, and how long to wait for that
/// once it is warm (then one will do).
const KILL_IN_FLIGHT: usize = 32;
const BUSY_DEADLINE: Duration = Duration::from_secs(10);

/// A child process whose stdout lines arrive, stamped, on a channel.
struct Lines {
    child: Child,
    rx: mpsc::UnboundedReceiver<(Instant, String)>,
    label: String,
}

impl Lines {
    fn spawn(mut command: Command, label: &str, log: PathBuf) -> Result<Lines> {
        let stderr =
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr))
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {label}"))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| anyhow!("{label} has no stdout"))?;
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if tx.send((Instant::now(), line)).is_err() {
                    break;
                }
            }
        });
        Ok(Lines {
            child,
            rx,
            label: label.to_string(),
        })
    }

    /// The next line, within `deadline` of now.
    async fn next(&mut self, deadline: Duration) -> Result<Option<(Instant, String)>> {
        tokio::time::timeout(deadline, self.rx.recv())
            .await
            .map_err(|_| anyhow!("{} printed nothing for {deadline:?}", self.label))
    }
}

/// One kill run: how many records were in flight on the killed consumer, and how long after
/// the kill the last of them was handed to the other.
#[derive(Debug, Clone, Copy)]
struct KillRun {
    in_flight: usize,
    secs: f64,
}

/// What one side's member processes are.
trait MemberCommand {
    fn command(&self, group: &str) -> Command;
    /// A line saying the member is in the group.
    fn ready(&self, line: &str) -> bool;
}

struct GatewayMember {
    bench: PathBuf,
    endpoint: String,
    topic: String,
    dead_letters: String,
}

impl MemberCommand for GatewayMember {
    fn command(&self, group: &str) -> Command {
        let mut c = Command::new(&self.bench);
        c.arg("--queue-member").args([
            self.endpoint.as_str(),
            group,
            &self.topic,
            &self.dead_letters,
            &KILL_HANDLER.as_millis().to_string(),
            &IN_FLIGHT.to_string(),
        ]);
        c
    }
    fn ready(&self, line: &str) -> bool {
        line == "joined"
    }
}

struct ShareMember {
    java: Java,
    bootstrap: String,
    topic: String,
}

impl MemberCommand for ShareMember {
    fn command(&self, group: &str) -> Command {
        self.java.command(&[
            "member",
            &self.bootstrap,
            &self.topic,
            group,
            &IN_FLIGHT.to_string(),
            &KILL_HANDLER.as_millis().to_string(),
            &SHARE_MAX_POLL.to_string(),
        ])
    }
    fn ready(&self, line: &str) -> bool {
        // A share consumer joins on its first polls; its first record says it is in.
        line.starts_with("start ")
    }
}

/// The Java program, compiled once, with the broker's jars.
#[derive(Clone)]
struct Java {
    java: String,
    classpath: String,
}

impl Java {
    async fn compile(env: &Env) -> Result<Java> {
        let vars = &env.services.vars;
        let java = vars
            .get("KAFKA_LEASE_JAVA")
            .cloned()
            .unwrap_or_else(|| "java".into());
        let jars = vars.get("KAFKA_LEASE_KAFKA_CLASSPATH").cloned().ok_or_else(|| {
            anyhow!("the services' env file has no KAFKA_LEASE_KAFKA_CLASSPATH (the broker's jars): restart them with scripts/services up")
        })?;
        let source =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("java/ShareGroupBench.java");
        let out_dir = env.log_dir.parent().unwrap_or(&env.log_dir).join("java");
        std::fs::create_dir_all(&out_dir)?;
        let out_dir = std::path::absolute(out_dir)?;
        let javac = PathBuf::from(&java).with_file_name("javac");
        let javac = if javac.is_file() {
            javac
        } else {
            PathBuf::from("javac")
        };
        env.progress
            .say("  compiling the share group's consumer (java/ShareGroupBench.java)");
        let output = Command::new(&javac)
            .args(["-cp", &jars, "-d"])
            .arg(&out_dir)
            .arg(&source)
            .output()
            .await
            .with_context(|| format!("running {}", javac.display()))?;
        if !output.status.success() {
            bail!(
                "javac ShareGroupBench.java failed: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        Ok(Java {
            java,
            classpath: format!("{}:{jars}", out_dir.display()),
        })
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.java);
        c.args(["-cp", &self.classpath, "ShareGroupBench"])
            .args(args);
        c
    }
}

/// The share group's rate: 64 consumers on a fresh group until `target` records were handled.
async fn share_rate(
    env: &Env,
    java: &Java,
    topic: &str,
    target: u64,
    round: usize,
) -> Result<QueueRun> {
    let group = env.name("share-rate");
    let bootstrap = env.services.kafka_bootstrap.clone();
    let command = java.command(&[
        "rate",
        &bootstrap,
        topic,
        &group,
        &IN_FLIGHT.to_string(),
        &HANDLER.as_millis().to_string(),
        &SHARE_MAX_POLL.to_string(),
        &target.to_string(),
    ]);
    let mut lines = Lines::spawn(
        command,
        "the share group's consumers",
        env.log_dir.join(format!("share-rate-{round}.log")),
    )?;
    loop {
        match lines.next(Duration::from_secs(600)).await? {
            Some((_, line)) => {
                if let Some(rest) = line.strip_prefix("rate ") {
                    let mut parts = rest.split_whitespace();
                    let handled: u64 = parts.next().unwrap_or("0").parse()?;
                    let secs: f64 = parts.next().unwrap_or("0").parse()?;
                    let _ = lines.child.wait().await;
                    return Ok(QueueRun {
                        handled,
                        secs,
                        handler_ms: HANDLER.as_secs_f64() * 1e3,
                        dead_lettered: 0,
                        gateway_cpu_secs: 0.0,
                    });
                }
            }
            None => bail!(
                "the share group's consumers exited without a rate (see {})",
                env.log_dir
                    .join(format!("share-rate-{round}.log"))
                    .display()
            ),
        }
    }
}

/// Follows a member's `start`/`done` lines: the records started and not finished, and how
/// many finished.
fn take(line: &str, started: &mut BTreeSet<i64>, done: &mut usize) {
    let mut parts = line.split_whitespace();
    match (
        parts.next(),
        parts.next().and_then(|o| o.parse::<i64>().ok()),
    ) {
        (Some("start"), Some(offset)) => {
            started.insert(offset);
        }
        (Some("done"), Some(offset)) => {
            started.remove(&offset);
            *done += 1;
        }
        _ => {}
    }
}

/// One kill run: two members of a fresh group start together; once both are in the group
/// and one of them finished `warm` records, that one is SIGKILLed, and the other's output is
/// watched for the records the dead one had started and not finished.
async fn kill_run(
    env: &Env,
    label: &str,
    members: &dyn MemberCommand,
    warm: usize,
    round: usize,
) -> Result<Option<KillRun>> {
    let group = env.name(&format!("kill-{label}"));
    let log = |who: usize| env.log_dir.join(format!("{label}-{who}-{round}.log"));
    let mut procs = [
        Lines::spawn(
            members.command(&group),
            &format!("{label} member 1"),
            log(1),
        )?,
        Lines::spawn(
            members.command(&group),
            &format!("{label} member 2"),
            log(2),
        )?,
    ];
    let mut ready = [false, false];
    let mut started: [BTreeSet<i64>; 2] = [BTreeSet::new(), BTreeSet::new()];
    let mut done = [0_usize, 0];
    let give_up = Instant::now() + START_DEADLINE;
    let mut busy_by = give_up;
    let victim = loop {
        let [one, two] = &mut procs;
        let (who, line) = tokio::select! {
            line = one.rx.recv() => (0, line),
            line = two.rx.recv() => (1, line),
            () = tokio::time::sleep_until(give_up) => bail!(
                "{label}: within {START_DEADLINE:?}, the members were not both in the group with one of them {warm} records in (ready {ready:?}, done {done:?}; see {})",
                log(1).display()
            ),
        };
        let (_, line) = line.ok_or_else(|| {
            anyhow!(
                "{label} member {} exited (see {})",
                who + 1,
                log(who + 1).display()
            )
        })?;
        ready[who] |= members.ready(&line);
        take(&line, &mut started[who], &mut done[who]);
        // Killed while a good share of its handlers run: each process takes its records in
        // waves (a window's worth, answered together), so the moment right after a record
        // ends is often one with few in flight.
        if ready == [true, true] {
            let busy = |v: usize| {
                let want = if Instant::now() < busy_by {
                    KILL_IN_FLIGHT
                } else {
                    1
                };
                done[v] >= warm && started[v].len() >= want
            };
            if let Some(v) = (0..2).find(|&v| busy(v)) {
                break v;
            }
        } else {
            busy_by = Instant::now() + BUSY_DEADLINE;
        }
    };
    let survivor = 1 - victim;
    procs[victim].child.start_kill().context("SIGKILL")?;
    let killed = Instant::now();
    // What it printed before it died.
    while let Some((_, line)) = procs[victim].next(Duration::from_secs(10)).await? {
        take(&line, &mut started[victim], &mut done[victim]);
    }
    let _ = procs[victim].child.wait().await;
    let mut waiting = std::mem::take(&mut started[victim]);
    let in_flight = waiting.len();
    if in_flight == 0 {
        return Ok(None);
    }
    let deadline = killed + REDELIVERY_DEADLINE;
    let last = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let Some((at, line)) = procs[survivor].next(left).await.map_err(|_| {
            anyhow!(
                "{label}: {} of the {in_flight} records in flight on the killed member were not delivered again within {REDELIVERY_DEADLINE:?}",
                waiting.len()
            )
        })?
        else {
            bail!("{label} member {} exited (see {})", survivor + 1, log(survivor + 1).display());
        };
        if at < killed {
            continue;
        }
        let mut parts = line.split_whitespace();
        if let (Some("start"), Some(offset)) = (
            parts.next(),
            parts.next().and_then(|o| o.parse::<i64>().ok()),
        ) {
            waiting.remove(&offset);
            if waiting.is_empty() {
                break at;
            }
        }
    };
    let _ = procs[survivor].child.start_kill();
    let _ = procs[survivor].child.wait().await;
    Ok(Some(KillRun {
        in_flight,
        secs: (last - killed).as_secs_f64(),
    }))
}

/// [`kill_run`] until the killed member had records in flight (at most `KILL_ATTEMPTS`).
async fn kill_with_records_in_flight(
    env: &Env,
    label: &str,
    members: &dyn MemberCommand,
    warm: usize,
    round: usize,
) -> Result<KillRun> {
    for attempt in 1..=KILL_ATTEMPTS {
        if let Some(run) = kill_run(env, label, members, warm, round).await? {
            return Ok(run);
        }
        env.progress.say(format!(
            "  {label}: the killed member had no record in flight (attempt {attempt}/{KILL_ATTEMPTS}); again"
        ));
    }
    bail!("{label}: in {KILL_ATTEMPTS} kill runs the killed member never had a record in flight")
}

pub(crate) async fn run(env: &Env) -> Result<Vec<ScenarioResult>> {
    let name = "queue-vs-share-group";
    let (records, _) = env.plan.queue_slow_records;
    let java = Java::compile(env).await?;
    let setup = setup(env, name, records, 1_000, 100).await?;
    let bench = std::env::current_exe().context("locating the bench executable")?;
    let result = async {
        let plan = RunPlan {
            topic: &setup.topic,
            dead_letters: &setup.dead_letters,
            order: kafka_lease_client::Ordering::Unordered,
            in_flight: IN_FLIGHT,
            handler: HANDLER,
            target: records as u64,
            poison: false,
        };
        let (mut ours, mut theirs) = (Vec::new(), Vec::new());
        for round in 1..=env.plan.rounds {
            let done = Arc::new(AtomicU64::new(0));
            let ticker = env.progress.ticker(
                format!("{name} round {round}/{}: gateway UNORDERED", env.plan.rounds),
                done.clone(),
                records as u64,
                "records",
            );
            let run = consumer_run(env, &setup.gateway, &setup.client, &plan, done).await?;
            drop(ticker);
            env.progress.say(format!(
                "  {name} round {round}: gateway UNORDERED {:.0} records/s",
                run.rate()
            ));
            ours.push(run);
            let run = share_rate(env, &java, &setup.topic, records as u64, round).await?;
            env.progress.say(format!(
                "  {name} round {round}: share group {:.0} records/s",
                run.rate()
            ));
            theirs.push(run);
        }
        // The kill runs' topic: enough records that both members are still busy when one dies
        // (a new share consumer gets its assignment on a heartbeat, 5 s apart by default).
        let kill_topic = env.name(&format!("{name}-kill"));
        create_topic(env, &kill_topic, 1).await?;
        produce_fill(env, &format!("{name} kill runs"), &kill_topic, 1, env.plan.queue_kill_records, 100).await?;
        let gateway_members = GatewayMember {
            bench: bench.clone(),
            endpoint: setup.gateway.endpoint(),
            topic: kill_topic.clone(),
            dead_letters: setup.dead_letters.clone(),
        };
        let share_members = ShareMember {
            java: java.clone(),
            bootstrap: env.services.kafka_bootstrap.clone(),
            topic: kill_topic.clone(),
        };
        let warm = 1_000;
        let (mut our_kills, mut their_kills) = (Vec::new(), Vec::new());
        for round in 1..=env.plan.queue_kill_rounds {
            env.progress.say(format!(
                "  {name} kill round {round}/{}: gateway members",
                env.plan.queue_kill_rounds
            ));
            let k = kill_with_records_in_flight(env, "gateway", &gateway_members, warm, round).await?;
            env.progress.say(format!(
                "  {name} kill round {round}: gateway: {} records in flight handed to the other member {:.3}s after the kill",
                k.in_flight, k.secs
            ));
            our_kills.push(k);
            env.progress.say(format!(
                "  {name} kill round {round}/{}: share consumers (the record lock is 30 s)",
                env.plan.queue_kill_rounds
            ));
            let k = kill_with_records_in_flight(env, "share", &share_members, warm, round).await?;
            env.progress.say(format!(
                "  {name} kill round {round}: share group: {} records in flight delivered again {:.3}s after the kill",
                k.in_flight, k.secs
            ));
            their_kills.push(k);
        }
        Ok::<_, anyhow::Error>((ours, theirs, our_kills, their_kills))
    }
    .await;
    setup.gateway.stop().await;
    let (ours, theirs, our_kills, their_kills) = result?;
    let rates = |runs: &[QueueRun]| runs.iter().map(QueueRun::rate).collect::<Vec<_>>();
    let (our_rate, their_rate) = (median(&rates(&ours)), median(&rates(&theirs)));
    let secs = |runs: &[KillRun]| runs.iter().map(|k| k.secs).collect::<Vec<_>>();
    let (our_secs, their_secs) = (median(&secs(&our_kills)), median(&secs(&their_kills)));
    let mut details = Map::new();
    details.insert("records".into(), records.into());
    details.insert("handler_ms".into(), (HANDLER.as_millis() as u64).into());
    details.insert("concurrency".into(), IN_FLIGHT.into());
    details.insert("share_consumers".into(), IN_FLIGHT.into());
    details.insert("share_max_poll_records".into(), SHARE_MAX_POLL.into());
    details.insert("share_acquire_mode".into(), "record_limit".into());
    details.insert(
        "gateway_rates".into(),
        rates(&ours).into_iter().map(r3).collect::<Vec<_>>().into(),
    );
    details.insert(
        "share_rates".into(),
        rates(&theirs)
            .into_iter()
            .map(r3)
            .collect::<Vec<_>>()
            .into(),
    );
    details.insert("timing".into(), "records handled over the time from the first handler's start to the last counted handler's end; gateway: Lease::consume, UNORDERED, 64 in flight and 64 handlers; share group: 64 KafkaShareConsumer threads of one process, explicit ACCEPT of each record, acknowledgements committed after each poll's records; each round a fresh group from the first offset, the two arms interleaved".into());
    let mut kill_details = Map::new();
    kill_details.insert(
        "gateway_runs".into(),
        our_kills
            .iter()
            .map(|k| json!({"in_flight": k.in_flight, "secs": r3(k.secs)}))
            .collect::<Vec<_>>()
            .into(),
    );
    kill_details.insert(
        "share_runs".into(),
        their_kills
            .iter()
            .map(|k| json!({"in_flight": k.in_flight, "secs": r3(k.secs)}))
            .collect::<Vec<_>>()
            .into(),
    );
    kill_details.insert("timing".into(), "two consumer processes of one fresh group, handlers of 50 ms (gateway: queue-mode Subscribe members, UNORDERED, 64 handlers, session grace 0; share group: 64 share consumers each); the one that handled 1,000 records first is SIGKILLed with at least 32 started (or, after 10 s, at least one) after it handled some records and the second joined; measured from the kill to the second's start of the last of the records the first had started and not finished. The share group's records come back when their acquisition lock (share.record.lock.duration.ms, 30 s by default) ends".into());
    let rate_row = Row {
        name: name.into(),
        scenario: "queue-vs-share-group",
        unit: "records/s",
        gateway: r3(our_rate),
        baseline: r3(their_rate),
        baseline_kind: "measured: Kafka's Java share consumers (KIP-932), same records, handler and concurrency, same run".into(),
        ratio: ratio(our_rate, their_rate).map(r3),
        ratio_definition: "gateway UNORDERED records/s / share group records/s",
        goal: ">= 1".into(),
        met: our_rate >= their_rate,
        summary: format!(
            "5 ms handler, 64 at once: gateway {our_rate:.0} vs share group {their_rate:.0} records/s"
        ),
        details,
        chart: super::queue::rounds_chart(
            "queue-vs-share-group: records/s, 5 ms handler, 64 at once".into(),
            "records/s",
            &[("gateway UNORDERED", &ours), ("share group", &theirs)],
            None,
            QueueRun::rate,
        ),
    };
    let rounds = our_kills.len();
    let kill_row = Row {
        name: format!("{name}-redelivery"),
        scenario: "queue-vs-share-group",
        unit: "s",
        gateway: r3(our_secs),
        baseline: r3(their_secs),
        baseline_kind: "measured: the share group's redelivery after the same kill, same run".into(),
        ratio: ratio(our_secs, their_secs).map(r3),
        ratio_definition: "gateway seconds / share group seconds, kill to redelivery of every record in flight",
        goal: "<= 0.1".into(),
        met: our_secs <= 0.1 * their_secs,
        summary: format!(
            "records in flight on a SIGKILLed consumer delivered again after {our_secs:.2} s vs {their_secs:.1} s (median of {rounds})"
        ),
        details: kill_details,
        chart: Chart {
            title: "queue-vs-share-group: kill to redelivery of the records in flight".into(),
            unit: "s".into(),
            groups: our_kills
                .iter()
                .zip(&their_kills)
                .enumerate()
                .map(|(i, (o, t))| {
                    (
                        format!("round {}", i + 1),
                        vec![("gateway".into(), o.secs), ("share group".into(), t.secs)],
                    )
                })
                .collect(),
            lines: Vec::new(),
        },
    };
    Ok(vec![rate_row.build(), kill_row.build()])
}
