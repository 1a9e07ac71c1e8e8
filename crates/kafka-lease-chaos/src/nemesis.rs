//! The nemesis: faults of a real cluster, each started, shown to take effect, held, and
//! healed, with both ends written to the history.
//!
//! Longer than most files here because `Nemesis::start` is one match with an arm per fault:
//! each arm starts its fault, shows that it took effect and names its undo, so a fault reads
//! whole in one place; the helpers below it are the evidence those arms gather.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use rand::seq::IndexedRandom;
use rand::Rng;
use rdkafka::consumer::{BaseConsumer, Consumer};
use tokio::time::Instant;

use kafka_lease_chaos::history::{Op, Phase};

use crate::cluster::{Cluster, Node, Role, CONSUL_HTTP_PORT, GATEWAY_PORT, KAFKA_PORT};
use crate::say;
use crate::workload::{LiveLeases, Recorder, GROUP, TOPIC};

/// Every fault the nemesis knows.
pub(crate) const ALL: &[&str] = &[
    "kill-gateway",
    "pause-gateway",
    "cut-gateway-consul",
    "cut-gateway-kafka",
    "kill-consul-leader",
    "isolate-consul-leader",
    "restart-consul-servers",
    "isolate-consul-leader-after-restart",
    "kill-partition-leader",
    "isolate-partition-leader",
    "kill-group-coordinator",
    "skew-gateway-clock",
];

/// One of each kind: a gateway process, a gateway's network, Consul, Kafka.
pub(crate) const SHORT: &[&str] = &[
    "kill-gateway",
    "pause-gateway",
    "cut-gateway-consul",
    "cut-gateway-kafka",
    "kill-consul-leader",
    "kill-partition-leader",
    "skew-gateway-clock",
];

/// Faults that act on one gateway (the busiest): two of them at once would aim at the same
/// process.
const ON_A_GATEWAY: &[&str] = &[
    "kill-gateway",
    "pause-gateway",
    "cut-gateway-consul",
    "cut-gateway-kafka",
    "skew-gateway-clock",
];

/// Faults healed by removing every blackhole route: of two at once, the first healed would
/// heal the other too.
const BY_ROUTES: &[&str] = &[
    "cut-gateway-consul",
    "cut-gateway-kafka",
    "isolate-consul-leader",
    "isolate-consul-leader-after-restart",
    "isolate-partition-leader",
];

/// Faults on the same service's processes (Consul's servers, Kafka's brokers) that must not
/// overlap: the second could pick the node the first took down.
fn service(name: &str) -> Option<&'static str> {
    match name {
        "kill-consul-leader"
        | "isolate-consul-leader"
        | "restart-consul-servers"
        | "isolate-consul-leader-after-restart" => Some("consul"),
        "kill-partition-leader" | "isolate-partition-leader" | "kill-group-coordinator" => {
            Some("kafka")
        }
        _ => None,
    }
}

/// Whether two faults can run at once: different kinds, not both on a gateway, not both
/// made of routes, not both on one service, and neither one of those that run [`ALONE`].
pub(crate) fn compatible(a: &str, b: &str) -> bool {
    a != b
        && !(ON_A_GATEWAY.contains(&a) && ON_A_GATEWAY.contains(&b))
        && !(BY_ROUTES.contains(&a) && BY_ROUTES.contains(&b))
        && (service(a).is_none() || service(a) != service(b))
        && !ALONE.contains(&a)
        && !ALONE.contains(&b)
}

/// Faults that run alone: the rolling restart of every Consul server is not held (it runs
/// to its end at once), and the isolation after a restart spends 20 s on its first part.
const ALONE: &[&str] = &[
    "restart-consul-servers",
    "isolate-consul-leader-after-restart",
];

/// What the nemesis needs.
#[derive(Clone)]
pub(crate) struct Nemesis {
    pub(crate) cluster: Arc<Cluster>,
    pub(crate) recorder: Recorder,
    pub(crate) live: LiveLeases,
    pub(crate) http: reqwest::Client,
    pub(crate) metadata: Arc<BaseConsumer>,
    /// When the fault in progress was injected.
    pub(crate) at: Arc<std::sync::Mutex<f64>>,
}

impl std::fmt::Debug for Nemesis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nemesis").finish_non_exhaustive()
    }
}

/// A fault in place, and how to heal it.
#[derive(Debug)]
enum Undo {
    StartAgain(Node, &'static str),
    Continue(Node, &'static str),
    /// Set the gateway's clock offset back to zero.
    Unskew(Node),
    Heal,
    Nothing,
}

impl Nemesis {
    /// Records a fault's start at `self.at` (when it was injected, not when the evidence
    /// came in).
    fn start_event(&self, name: &str, target: &str, took_effect: bool, evidence: String) {
        say!("nemesis {name} on {target}: {evidence}");
        let at = *self.at.lock().unwrap_or_else(|p| p.into_inner());
        self.recorder.record_at(
            at,
            "nemesis",
            Op::Nemesis {
                name: name.into(),
                phase: Phase::Start,
                target: target.into(),
                took_effect,
                evidence,
            },
        );
    }

    fn stop_event(&self, name: &str, target: &str, evidence: String) {
        say!("nemesis {name} on {target} healed: {evidence}");
        self.recorder.record(
            "nemesis",
            Op::Nemesis {
                name: name.into(),
                phase: Phase::Stop,
                target: target.into(),
                took_effect: true,
                evidence,
            },
        );
    }

    /// Runs one fault: start, hold for `hold`, heal.
    pub(crate) async fn run(&self, name: &str, hold: Duration) -> Result<()> {
        *self.at.lock().unwrap_or_else(|p| p.into_inner()) = self.recorder.now();
        let (target, undo) = self.start(name).await?;
        if name != "restart-consul-servers" {
            tokio::time::sleep(hold).await;
        }
        let evidence = self.undo(undo).await?;
        self.stop_event(name, &target, evidence);
        Ok(())
    }

    /// Runs two faults at once: `first` starts, then `second`; both are held for `hold`,
    /// then healed in the reverse order. [`compatible`] tells which pairs can overlap.
    pub(crate) async fn run_pair(&self, first: &str, second: &str, hold: Duration) -> Result<()> {
        *self.at.lock().unwrap_or_else(|p| p.into_inner()) = self.recorder.now();
        let (first_target, first_undo) = self.start(first).await?;
        *self.at.lock().unwrap_or_else(|p| p.into_inner()) = self.recorder.now();
        let second_started = self.start(second).await;
        let (second_target, second_undo) = match second_started {
            Ok(started) => started,
            Err(e) => {
                let evidence = self.undo(first_undo).await?;
                self.stop_event(first, &first_target, evidence);
                return Err(e);
            }
        };
        tokio::time::sleep(hold).await;
        let evidence = self.undo(second_undo).await?;
        self.stop_event(second, &second_target, evidence);
        let evidence = self.undo(first_undo).await?;
        self.stop_event(first, &first_target, evidence);
        Ok(())
    }

    /// The gateway serving the most leases now (else the first).
    fn busiest_gateway(&self) -> Result<Node> {
        let live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        let mut counts: Vec<(usize, String)> = self
            .cluster
            .of_role(Role::Gateway)
            .map(|g| {
                (
                    live.values().filter(|(_, gw)| *gw == g.name).count(),
                    g.name.clone(),
                )
            })
            .collect();
        counts.sort();
        let name = counts.last().map(|(_, n)| n.clone()).unwrap_or_default();
        Ok(self.cluster.node(&name)?.clone())
    }

    async fn start(&self, name: &str) -> Result<(String, Undo)> {
        let cluster = &self.cluster;
        match name {
            "kill-gateway" => {
                let g = self.busiest_gateway()?;
                cluster.signal(&g, "gateway", "KILL")?;
                let exit = cluster
                    .wait_exit(&g, "gateway", Duration::from_secs(5))
                    .await;
                let (ok, evidence) = match exit {
                    Ok(e) => (e.contains("signal"), e),
                    Err(e) => (false, format!("{e:#}")),
                };
                self.start_event(name, &g.name, ok, evidence);
                Ok((g.name.clone(), Undo::StartAgain(g, "gateway")))
            }
            "pause-gateway" => {
                let g = self.busiest_gateway()?;
                let pid = cluster.signal(&g, "gateway", "STOP")?;
                tokio::time::sleep(Duration::from_millis(100)).await;
                let state = Cluster::proc_state(pid);
                self.start_event(
                    name,
                    &g.name,
                    state == Some('T'),
                    format!("pid {pid} in state {state:?} (T: stopped)"),
                );
                Ok((g.name.clone(), Undo::Continue(g, "gateway")))
            }
            "cut-gateway-consul" => {
                let g = self.busiest_gateway()?;
                let servers: Vec<Node> = cluster.of_role(Role::Consul).cloned().collect();
                for s in &servers {
                    cluster.cut_one_way(&g, s)?;
                }
                let probe = cluster
                    .probe(&g, servers[0].addr, crate::cluster::CONSUL_SERVER_PORT)
                    .await;
                let kafka = cluster.probe(&g, self.broker(1)?.addr, KAFKA_PORT).await;
                self.start_event(
                    name,
                    &g.name,
                    probe == "timed out" && kafka == "connected",
                    format!("from {}: to Consul c1 {probe}; to Kafka k1 {kafka}", g.name),
                );
                Ok((g.name.clone(), Undo::Heal))
            }
            "cut-gateway-kafka" => {
                let g = self.busiest_gateway()?;
                let brokers: Vec<Node> = cluster.of_role(Role::Broker).cloned().collect();
                // Both ways: the brokers drop their answers, and the gateway's requests stay
                // in its retransmission queue, to arrive when the cut heals.
                for b in &brokers {
                    cluster.cut_one_way(&g, b)?;
                    cluster.hold_sending(&g, b)?;
                }
                let probe = cluster.probe(&g, brokers[0].addr, KAFKA_PORT).await;
                let consul = cluster
                    .probe(
                        &g,
                        cluster.node("c1")?.addr,
                        crate::cluster::CONSUL_SERVER_PORT,
                    )
                    .await;
                self.start_event(
                    name,
                    &g.name,
                    probe != "connected" && consul == "connected",
                    format!(
                        "from {}: to Kafka k1 {probe}; to Consul c1 {consul}",
                        g.name
                    ),
                );
                Ok((g.name.clone(), Undo::Heal))
            }
            "kill-consul-leader" => {
                let leader = self.consul_leader(None).await?;
                cluster.signal(&leader, "consul", "KILL")?;
                let _ = cluster
                    .wait_exit(&leader, "consul", Duration::from_secs(5))
                    .await;
                let t0 = Instant::now();
                let next = self.wait_new_consul_leader(&leader).await;
                let (ok, evidence) = match next {
                    Ok(n) => (
                        true,
                        format!(
                            "killed {}; {} leads after {} ms",
                            leader.name,
                            n.name,
                            t0.elapsed().as_millis()
                        ),
                    ),
                    Err(e) => (
                        false,
                        format!(
                            "killed {}; {e:#} (Raft configuration: {})",
                            leader.name,
                            self.suffrages(&leader).await
                        ),
                    ),
                };
                self.start_event(name, &leader.name, ok, evidence);
                Ok((leader.name.clone(), Undo::StartAgain(leader, "consul")))
            }
            "isolate-consul-leader" => {
                let leader = self.consul_leader(None).await?;
                self.isolate(&leader)?;
                let t0 = Instant::now();
                let next = self.wait_new_consul_leader(&leader).await;
                let (ok, evidence) = match next {
                    Ok(n) => (
                        true,
                        format!(
                            "isolated {}; {} leads the majority after {} ms",
                            leader.name,
                            n.name,
                            t0.elapsed().as_millis()
                        ),
                    ),
                    Err(e) => (
                        false,
                        format!(
                            "isolated {}; {e:#} (Raft configuration: {})",
                            leader.name,
                            self.suffrages(&leader).await
                        ),
                    ),
                };
                self.start_event(name, &leader.name, ok, evidence);
                Ok((leader.name.clone(), Undo::Heal))
            }
            "isolate-consul-leader-after-restart" => {
                // A follower down past autopilot's dead-server cleanup (it acts ~10 s after
                // a server fails) and started again; at once, the leader cut off. The
                // majority is the returned server and the third: it elects a leader only if
                // the returned server came back a voter (docs/FAULTS.md, finding 9).
                let leader = self.consul_leader(None).await?;
                let follower = cluster
                    .of_role(Role::Consul)
                    .find(|n| n.name != leader.name)
                    .cloned()
                    .ok_or_else(|| anyhow!("no Consul server but the leader"))?;
                cluster.signal(&follower, "consul", "KILL")?;
                let _ = cluster
                    .wait_exit(&follower, "consul", Duration::from_secs(5))
                    .await;
                tokio::time::sleep(Duration::from_secs(20)).await;
                cluster.start(&follower, "consul")?;
                let back = self.wait_consul_leader_with(&follower).await;
                let suffrage = self.suffrages(&follower).await;
                // The leader as the returned server sees it (the first one if it knows none).
                let leader = back.unwrap_or(leader);
                *self.at.lock().unwrap_or_else(|p| p.into_inner()) = self.recorder.now();
                self.isolate(&leader)?;
                let t0 = Instant::now();
                let next = self.wait_new_consul_leader(&leader).await;
                let before = format!(
                    "{} killed, started again 20 s later (Raft configuration then: {suffrage}); \
                     isolated {}",
                    follower.name, leader.name
                );
                let (ok, evidence) = match next {
                    Ok(n) => (
                        true,
                        format!(
                            "{before}; {} leads the majority after {} ms",
                            n.name,
                            t0.elapsed().as_millis()
                        ),
                    ),
                    Err(e) => (false, format!("{before}; {e:#}")),
                };
                self.start_event(name, &leader.name, ok, evidence);
                Ok((leader.name.clone(), Undo::Heal))
            }
            "restart-consul-servers" => {
                let mut evidence = Vec::new();
                let mut ok = true;
                let servers: Vec<Node> = cluster.of_role(Role::Consul).cloned().collect();
                for s in &servers {
                    let old = cluster.pid(s, "consul");
                    cluster.signal(s, "consul", "TERM")?;
                    let _ = cluster
                        .wait_exit(s, "consul", Duration::from_secs(10))
                        .await;
                    let new = cluster.start(s, "consul")?;
                    let leader = self.wait_consul_leader_with(s).await;
                    ok &= leader.is_ok();
                    evidence.push(format!(
                        "{} pid {old:?} -> {new}, then leader {}",
                        s.name,
                        leader
                            .map(|l| l.name)
                            .unwrap_or_else(|e| format!("none: {e:#}"))
                    ));
                }
                self.start_event(name, "c1,c2,c3", ok, evidence.join("; "));
                Ok(("c1,c2,c3".into(), Undo::Nothing))
            }
            "kill-partition-leader" | "isolate-partition-leader" => {
                let partition = self.leased_partition();
                let leader = self.partition_leader(TOPIC, partition)?;
                let node = self.broker(leader)?;
                if name == "kill-partition-leader" {
                    cluster.signal(&node, "kafka", "KILL")?;
                    let _ = cluster
                        .wait_exit(&node, "kafka", Duration::from_secs(5))
                        .await;
                } else {
                    self.isolate(&node)?;
                }
                let moved = self.wait_leader_moves(TOPIC, partition, leader).await;
                let (ok, evidence) = match moved {
                    Ok((to, ms)) => (
                        true,
                        format!("{TOPIC}/{partition} led by k{leader}; k{to} leads after {ms} ms"),
                    ),
                    Err(e) => (
                        false,
                        format!("{TOPIC}/{partition} led by k{leader}: {e:#}"),
                    ),
                };
                self.start_event(name, &node.name, ok, evidence);
                let undo = if name == "kill-partition-leader" {
                    Undo::StartAgain(node.clone(), "kafka")
                } else {
                    Undo::Heal
                };
                Ok((node.name.clone(), undo))
            }
            "kill-group-coordinator" => {
                let partition = coordinator_partition(GROUP, 6);
                let leader = self.partition_leader("__consumer_offsets", partition)?;
                let node = self.broker(leader)?;
                cluster.signal(&node, "kafka", "KILL")?;
                let _ = cluster
                    .wait_exit(&node, "kafka", Duration::from_secs(5))
                    .await;
                let moved = self
                    .wait_leader_moves("__consumer_offsets", partition, leader)
                    .await;
                let (ok, evidence) = match moved {
                    Ok((to, ms)) => (
                        true,
                        format!(
                            "group {GROUP}'s coordinator (__consumer_offsets/{partition}) was k{leader}; k{to} after {ms} ms"
                        ),
                    ),
                    Err(e) => (false, format!("coordinator k{leader}: {e:#}")),
                };
                self.start_event(name, &node.name, ok, evidence);
                Ok((node.name.clone(), Undo::StartAgain(node.clone(), "kafka")))
            }
            "skew-gateway-clock" => {
                let g = self.busiest_gateway()?;
                // A step of 2 to 10 minutes, forward or back: far beyond every TTL and
                // fence window, as a badly set clock corrected by NTP would be.
                let minutes = rand::rng().random_range(2..=10_i64);
                let skew = if rand::rng().random_bool(0.5) {
                    minutes * 60
                } else {
                    -minutes * 60
                };
                let before = self.gateway_clock_offset(&g).await;
                std::fs::write(self.cluster.clock_offset_file(&g), format!("{skew:+}\n"))?;
                let seen = self.wait_gateway_clock_offset(&g, skew).await;
                let (ok, evidence) = match seen {
                    Ok(offset) => (
                        true,
                        format!(
                            "wall clock stepped {skew:+} s: the expiries of its leases were \
                             {} s off the harness's clock before, {offset:+.1} s after",
                            before.map_or("unknown".into(), |b| format!("{b:+.1}"))
                        ),
                    ),
                    Err(e) => (false, format!("wall clock stepped {skew:+} s: {e:#}")),
                };
                self.start_event(name, &g.name, ok, evidence);
                Ok((g.name.clone(), Undo::Unskew(g)))
            }
            other => bail!("no such nemesis: {other} (known: {})", ALL.join(", ")),
        }
    }

    async fn undo(&self, undo: Undo) -> Result<String> {
        let cluster = &self.cluster;
        match undo {
            Undo::StartAgain(node, what) => {
                let pid = cluster.start(&node, what)?;
                if what == "gateway" {
                    self.wait_gateway(&node).await?;
                }
                Ok(format!("{what} on {} started again (pid {pid})", node.name))
            }
            Undo::Continue(node, what) => {
                let pid = cluster.signal(&node, what, "CONT")?;
                Ok(format!("{what} on {} continued (pid {pid})", node.name))
            }
            Undo::Unskew(node) => {
                std::fs::write(cluster.clock_offset_file(&node), "0\n")?;
                let seen = self.wait_gateway_clock_offset(&node, 0).await;
                Ok(match seen {
                    Ok(offset) => format!(
                        "wall clock set back: the expiries of its leases are {offset:+.1} s off \
                         the harness's clock"
                    ),
                    Err(e) => format!("wall clock set back: {e:#}"),
                })
            }
            Undo::Heal => Ok(format!("{} routes removed", cluster.heal()?)),
            Undo::Nothing => Ok("nothing to heal".into()),
        }
    }

    /// Cuts `node` off from every other node and from the clients, both ways.
    fn isolate(&self, node: &Node) -> Result<()> {
        for other in self.cluster.nodes.iter().filter(|n| n.name != node.name) {
            self.cluster.cut_one_way(node, other)?;
            self.cluster.cut_one_way(other, node)?;
        }
        self.cluster.cut_from_hub(node)
    }

    fn broker(&self, id: i32) -> Result<Node> {
        Ok(self
            .cluster
            .of_role(Role::Broker)
            .find(|n| n.index as i32 == id)
            .ok_or_else(|| anyhow!("no broker {id}"))?
            .clone())
    }

    /// A partition some client holds now (else 0).
    fn leased_partition(&self) -> i32 {
        let live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        let partitions: Vec<i32> = live.values().map(|(p, _)| *p).collect();
        partitions.choose(&mut rand::rng()).copied().unwrap_or(0)
    }

    fn partition_leader(&self, topic: &str, partition: i32) -> Result<i32> {
        let md = self
            .metadata
            .fetch_metadata(Some(topic), Duration::from_secs(5))?;
        let t = md
            .topics()
            .iter()
            .find(|t| t.name() == topic)
            .ok_or_else(|| anyhow!("no metadata for {topic}"))?;
        let p = t
            .partitions()
            .iter()
            .find(|p| p.id() == partition)
            .ok_or_else(|| anyhow!("no metadata for {topic}/{partition}"))?;
        if p.leader() < 0 {
            bail!("{topic}/{partition} has no leader");
        }
        Ok(p.leader())
    }

    /// Waits (15 s at most) until another broker than `old` leads the partition, as the
    /// other brokers tell (a client of its own, bootstrapped from them only: a client that
    /// knows the old leader may keep asking it, and an isolated broker still believes it
    /// leads).
    async fn wait_leader_moves(
        &self,
        topic: &str,
        partition: i32,
        old: i32,
    ) -> Result<(i32, u128)> {
        let others = self
            .cluster
            .of_role(Role::Broker)
            .filter(|n| n.index as i32 != old)
            .map(|n| format!("{}:{KAFKA_PORT}", n.addr))
            .collect::<Vec<_>>()
            .join(",");
        let asker: Arc<BaseConsumer> = Arc::new(
            rdkafka::ClientConfig::new()
                .set("bootstrap.servers", &others)
                .create()
                .context("a metadata client of the other brokers")?,
        );
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(15) {
            let md = asker.clone();
            let topic_owned = topic.to_string();
            let leader = tokio::task::spawn_blocking(move || -> Option<i32> {
                let md = md
                    .fetch_metadata(Some(&topic_owned), Duration::from_secs(2))
                    .ok()?;
                let t = md.topics().iter().find(|t| t.name() == topic_owned)?;
                let p = t.partitions().iter().find(|p| p.id() == partition)?;
                Some(p.leader())
            })
            .await
            .ok()
            .flatten();
            if let Some(l) = leader {
                if l >= 0 && l != old {
                    return Ok((l, t0.elapsed().as_millis()));
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        bail!("the leader did not move within 15 s")
    }

    async fn leader_seen_by(&self, server: &Node) -> Result<String> {
        let url = format!("http://{}:{CONSUL_HTTP_PORT}/v1/status/leader", server.addr);
        let text = self
            .http
            .get(&url)
            .send()
            .await
            .with_context(|| format!("asking {} for the leader", server.name))?
            .text()
            .await?;
        let addr: String = serde_json::from_str(&text).context("reading /v1/status/leader")?;
        Ok(addr)
    }

    fn node_of_raft_addr(&self, addr: &str) -> Option<Node> {
        let host = addr.split(':').next()?;
        self.cluster
            .of_role(Role::Consul)
            .find(|n| n.addr.to_string() == host)
            .cloned()
    }

    /// The Consul leader, as the servers other than `except` see it.
    pub(crate) async fn consul_leader(&self, except: Option<&Node>) -> Result<Node> {
        for s in self.cluster.of_role(Role::Consul) {
            if except.is_some_and(|e| e.name == s.name) {
                continue;
            }
            if let Ok(addr) = self.leader_seen_by(s).await {
                if let Some(n) = self.node_of_raft_addr(&addr) {
                    return Ok(n);
                }
            }
        }
        bail!("no Consul server knows a leader")
    }

    async fn wait_new_consul_leader(&self, old: &Node) -> Result<Node> {
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(20) {
            if let Ok(n) = self.consul_leader(Some(old)).await {
                if n.name != old.name {
                    return Ok(n);
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        bail!("no new leader within 20 s")
    }

    /// Each server's place in the Raft configuration (voter, non-voter, or absent), as the
    /// first server other than `except` that answers knows it (a stale read: there may be
    /// no leader).
    async fn suffrages(&self, except: &Node) -> String {
        for s in self.cluster.of_role(Role::Consul) {
            if s.name == except.name {
                continue;
            }
            let url = format!(
                "http://{}:{CONSUL_HTTP_PORT}/v1/operator/raft/configuration?stale",
                s.addr
            );
            let Ok(answer) = self.http.get(&url).send().await else {
                continue;
            };
            let Ok(text) = answer.text().await else {
                continue;
            };
            let Ok(config) = serde_json::from_str::<serde_json::Value>(&text) else {
                continue;
            };
            let servers = config["Servers"].as_array().map_or(&[][..], Vec::as_slice);
            return self
                .cluster
                .of_role(Role::Consul)
                .map(|n| {
                    let entry = servers
                        .iter()
                        .find(|e| e["Node"].as_str() == Some(n.name.as_str()));
                    let what = match entry.map(|e| e["Voter"].as_bool()) {
                        Some(Some(true)) => "voter",
                        Some(_) => "non-voter",
                        None => "absent",
                    };
                    format!("{} {what}", n.name)
                })
                .collect::<Vec<_>>()
                .join(", ")
                + &format!(" (as {} knows it)", s.name);
        }
        "unknown (no server answered)".into()
    }

    /// Waits until `server` answers and knows a leader.
    async fn wait_consul_leader_with(&self, server: &Node) -> Result<Node> {
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(30) {
            if let Ok(addr) = self.leader_seen_by(server).await {
                if let Some(n) = self.node_of_raft_addr(&addr) {
                    return Ok(n);
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        bail!("{} knew no leader within 30 s", server.name)
    }

    /// How far a gateway's wall clock is off the harness's, in seconds, from the expiries
    /// it reports for the leases it serves (ListLeases: its wall clock's now plus the time
    /// the lease has left, at most its TTL): the smallest of them minus the harness's now,
    /// so the true offset or up to a lease TTL (3 s, a member's 12 s) above it. (The `Date`
    /// header of its HTTP answers was tried first: hyper renews its cached date only once
    /// the clock passes the next second it expects, so after a step back it stays frozen.)
    async fn gateway_clock_offset(&self, node: &Node) -> Result<f64> {
        let client = kafka_lease_client::Client::connect(self.cluster.gateway_endpoint(node))
            .await
            .with_context(|| format!("connecting to {}", node.name))?;
        let request = kafka_lease_client::proto::ListLeasesRequest {
            group: Some(GROUP.to_string()),
            topic: Some(TOPIC.to_string()),
            ..Default::default()
        };
        let answer =
            tokio::time::timeout(Duration::from_secs(5), client.raw().list_leases(request))
                .await
                .map_err(|_| anyhow!("ListLeases on {}: no answer within 5 s", node.name))?
                .with_context(|| format!("ListLeases on {}", node.name))?
                .into_inner();
        let now = std::time::SystemTime::now();
        let secs = |t: std::time::SystemTime| -> f64 {
            match t.duration_since(std::time::UNIX_EPOCH) {
                Ok(d) => d.as_secs_f64(),
                Err(e) => -e.duration().as_secs_f64(),
            }
        };
        answer
            .leases
            .iter()
            .filter(|l| l.gateway == node.name)
            .filter_map(|l| l.expires_at)
            .map(|t| t.seconds as f64 + f64::from(t.nanos) / 1e9 - secs(now))
            .min_by(f64::total_cmp)
            .ok_or_else(|| anyhow!("{} serves no lease to show its clock by", node.name))
    }

    /// Waits (15 s at most: the clockshift library reads its file every 200 ms) until a
    /// gateway's wall clock shows `want` seconds off the harness's (from 2 s below to 13 s
    /// above: the leases' time left); the offset seen.
    async fn wait_gateway_clock_offset(&self, node: &Node, want: i64) -> Result<f64> {
        let t0 = Instant::now();
        let mut last = None;
        let want = want as f64;
        while t0.elapsed() < Duration::from_secs(15) {
            match self.gateway_clock_offset(node).await {
                Ok(offset) if offset >= want - 2.0 && offset <= want + 13.0 => return Ok(offset),
                Ok(offset) => last = Some(format!("{offset:+.1} s off")),
                Err(e) => last = Some(format!("{e:#}")),
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        bail!(
            "{} did not show a clock {want:+} s off the harness's within 15 s (last: {})",
            node.name,
            last.unwrap_or_else(|| "no answer".into())
        )
    }

    /// Waits until a gateway accepts connections again.
    pub(crate) async fn wait_gateway(&self, node: &Node) -> Result<()> {
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(30) {
            if tokio::net::TcpStream::connect((node.addr, GATEWAY_PORT))
                .await
                .is_ok()
            {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        bail!("gateway {} did not listen within 30 s", node.name)
    }
}

/// The `__consumer_offsets` partition of a group: Java's `String.hashCode`, made
/// non-negative as Kafka's `Utils.abs` does, modulo the topic's partition count.
pub(crate) fn coordinator_partition(group: &str, partitions: i32) -> i32 {
    let mut h: i32 = 0;
    for unit in group.encode_utf16() {
        h = h.wrapping_mul(31).wrapping_add(i32::from(unit));
    }
    let abs = if h == i32::MIN { 0 } else { h.abs() };
    abs % partitions
}

#[cfg(test)]
mod tests {
    use super::{compatible, coordinator_partition, ALL, ALONE};

    #[test]
    fn faults_overlap_only_where_neither_undoes_or_aims_at_the_other() {
        assert!(compatible("kill-gateway", "kill-consul-leader"));
        assert!(compatible("cut-gateway-consul", "kill-partition-leader"));
        assert!(compatible("skew-gateway-clock", "isolate-consul-leader"));
        assert!(!compatible("kill-gateway", "pause-gateway"));
        assert!(!compatible("cut-gateway-kafka", "isolate-partition-leader"));
        assert!(!compatible("kill-consul-leader", "isolate-consul-leader"));
        assert!(!compatible("kill-gateway", "restart-consul-servers"));
        assert!(!compatible(
            "skew-gateway-clock",
            "isolate-consul-leader-after-restart"
        ));
        // Every fault has a partner.
        for a in ALL {
            if !ALONE.contains(a) {
                assert!(ALL.iter().any(|b| compatible(a, b)), "{a} has no partner");
            }
        }
    }

    #[test]
    fn the_coordinator_partition_follows_javas_string_hash() {
        // "hello".hashCode() is 99162322; 99162322 % 6 is 4.
        assert_eq!(coordinator_partition("hello", 6), 4);
        // "polygenelubricants".hashCode() is Integer.MIN_VALUE, which Kafka's Utils.abs
        // turns into 0.
        assert_eq!(coordinator_partition("polygenelubricants", 50), 0);
        assert_eq!(coordinator_partition("", 6), 0);
    }
}
