//! The cluster: three Consul servers, three Kafka brokers (KRaft, each broker its own
//! controller too: three voters) and the gateway nodes, each node a network namespace of its
//! own with one address on a bridge that lives in a namespace of its own too (the hub). Each
//! gateway node runs a Consul client agent beside the gateway, as production does. The harness
//! itself moves into the hub, so it reaches every node and the machine's own network is never
//! touched: no address, route or link outside the namespaces this module creates and removes.
//!
//! A cut is made of blackhole routes. A blackhole on the sender's side fails a connect at once
//! (EINVAL), which a program notices; a silent partition, the kind that costs timeouts, drops
//! the answers on the far side instead: to cut node A off from node B silently, B gets a
//! blackhole route to A.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use tokio::process::{Child, Command};

use crate::say;

/// What kind of node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Role {
    /// A Consul server.
    Consul,
    /// A Kafka broker (and KRaft controller).
    Broker,
    /// A gateway with its Consul client agent.
    Gateway,
}

/// One node: a network namespace with one address.
#[derive(Debug, Clone)]
pub(crate) struct Node {
    /// Short name: `c1`, `k2`, `g3`.
    pub(crate) name: String,
    /// The namespace's name (`<prefix>-<name>`).
    pub(crate) netns: String,
    pub(crate) role: Role,
    pub(crate) addr: Ipv4Addr,
    /// 1-based index within its role (the broker's node.id).
    pub(crate) index: usize,
}

/// Where the programs are and how many of each.
#[derive(Debug, Clone)]
pub(crate) struct Spec {
    /// Prefix of every namespace and link name; short (link names have 15 bytes).
    pub(crate) prefix: String,
    /// The first three octets of the bridge's /24.
    pub(crate) subnet: [u8; 3],
    pub(crate) gateways: usize,
    pub(crate) consul_bin: PathBuf,
    pub(crate) java: PathBuf,
    /// The Kafka jars' folder.
    pub(crate) kafka_libs: PathBuf,
    /// The class of Kafka's storage tool (differs between versions).
    pub(crate) kafka_storage_class: String,
    pub kafka_log4j: PathBuf,
    pub(crate) kafka_heap: String,
    /// Consul autopilot's `min_quorum` on the servers (0: Consul's default, no minimum).
    pub(crate) consul_min_quorum: u32,
    pub(crate) gateway_bin: PathBuf,
    /// Extra arguments for every gateway's `serve`.
    pub(crate) gateway_args: Vec<String>,
    /// Extra environment for every gateway (the planted defect).
    pub(crate) gateway_env: Vec<(String, String)>,
    /// The clockshift library (`clockshift/clockshift.c`), preloaded into every gateway when
    /// set, so that the clock fault can step a gateway's wall clock (and only its wall
    /// clock: the monotonic clock runs on) by writing the node's `clock-offset` file.
    pub(crate) clockshift_lib: Option<PathBuf>,
    /// Data dirs and logs.
    pub(crate) run_dir: PathBuf,
}

pub(crate) const KAFKA_PORT: u16 = 9092;
pub(crate) const KAFKA_CONTROLLER_PORT: u16 = 9093;
pub(crate) const CONSUL_HTTP_PORT: u16 = 8500;
pub(crate) const CONSUL_SERVER_PORT: u16 = 8300;
pub(crate) const GATEWAY_PORT: u16 = 7070;
/// Each gateway's metrics endpoint (for a look at its counters during a run).
pub(crate) const GATEWAY_METRICS_PORT: u16 = 9464;

/// A process the cluster started.
#[derive(Debug)]
struct Proc {
    child: Child,
    pid: u32,
}

/// The running cluster. [`Cluster::teardown`] (also run on drop) kills every process and
/// removes every namespace.
#[derive(Debug)]
pub(crate) struct Cluster {
    pub(crate) spec: Spec,
    pub(crate) nodes: Vec<Node>,
    procs: Mutex<BTreeMap<String, Proc>>,
    /// Blackhole routes in place: (namespace, destination).
    cuts: Mutex<Vec<(String, Ipv4Addr)>>,
    torn_down: Mutex<bool>,
}

/// Runs `ip` with `args`, failing with its stderr.
pub(crate) fn ip(args: &[&str]) -> Result<()> {
    let out = std::process::Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .context("running ip (iproute2)")?;
    if !out.status.success() {
        bail!(
            "ip {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// The namespaces whose names start with `<prefix>-`.
fn our_namespaces(prefix: &str) -> Result<Vec<String>> {
    let out = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .context("running ip netns list")?;
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(&format!("{prefix}-")))
        .map(str::to_string)
        .collect())
}

/// Kills every process in the namespaces of `prefix` and removes them: what a run that died
/// without its teardown left behind.
pub(crate) fn remove_leftovers(prefix: &str) -> Result<usize> {
    let namespaces = our_namespaces(prefix)?;
    for ns in &namespaces {
        if let Ok(out) = std::process::Command::new("ip")
            .args(["netns", "pids", ns])
            .output()
        {
            let me = std::process::id().to_string();
            for pid in String::from_utf8_lossy(&out.stdout)
                .split_whitespace()
                .filter(|p| *p != me)
            {
                let _ = std::process::Command::new("kill")
                    .args(["-KILL", pid])
                    .status();
            }
        }
    }
    for ns in &namespaces {
        let _ = ip(&["netns", "del", ns]);
    }
    Ok(namespaces.len())
}

impl Cluster {
    /// The nodes of `spec`: c1..c3 at .11-.13, k1..k3 at .21-.23, g1.. at .31...
    fn plan(spec: &Spec) -> Vec<Node> {
        let [a, b, c] = spec.subnet;
        let mut nodes = Vec::new();
        let mut add = |role: Role, letter: &str, base: u8, count: usize| {
            for i in 1..=count {
                let name = format!("{letter}{i}");
                nodes.push(Node {
                    netns: format!("{}-{name}", spec.prefix),
                    name,
                    role,
                    addr: Ipv4Addr::new(a, b, c, base + i as u8),
                    index: i,
                });
            }
        };
        add(Role::Consul, "c", 10, 3);
        add(Role::Broker, "k", 20, 3);
        add(Role::Gateway, "g", 30, spec.gateways);
        nodes
    }

    /// The hub namespace's name.
    pub(crate) fn hub(spec: &Spec) -> String {
        format!("{}-hub", spec.prefix)
    }

    /// Creates the namespaces, the bridge and the links (no process yet). Runs before the
    /// harness moves into the hub.
    pub(crate) fn create_network(spec: &Spec) -> Result<Vec<Node>> {
        let removed = remove_leftovers(&spec.prefix)?;
        if removed > 0 {
            say!("removed {removed} namespaces a previous run left behind");
        }
        let hub = Self::hub(spec);
        let [a, b, c] = spec.subnet;
        let bridge = format!("{}-br", spec.prefix);
        ip(&["netns", "add", &hub])?;
        ip(&["-n", &hub, "link", "set", "lo", "up"])?;
        ip(&["-n", &hub, "link", "add", &bridge, "type", "bridge"])?;
        ip(&[
            "-n",
            &hub,
            "addr",
            "add",
            &format!("{a}.{b}.{c}.1/24"),
            "dev",
            &bridge,
        ])?;
        ip(&["-n", &hub, "link", "set", &bridge, "up"])?;
        let nodes = Self::plan(spec);
        for node in &nodes {
            let ns = &node.netns;
            ip(&["netns", "add", ns])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
            let outer = format!("{}-{}", spec.prefix, node.name);
            // Both ends made in the hub, the inner one moved at once: nothing appears in the
            // machine's own namespace.
            ip(&[
                "-n", &hub, "link", "add", &outer, "type", "veth", "peer", "name", "eth0", "netns",
                ns,
            ])?;
            ip(&["-n", &hub, "link", "set", &outer, "master", &bridge])?;
            ip(&["-n", &hub, "link", "set", &outer, "up"])?;
            ip(&[
                "-n",
                ns,
                "addr",
                "add",
                &format!("{}/24", node.addr),
                "dev",
                "eth0",
            ])?;
            ip(&["-n", ns, "link", "set", "eth0", "up"])?;
        }
        Ok(nodes)
    }

    /// Moves the calling thread into the hub namespace. Call it on the main thread before any
    /// other thread exists: threads started later (the runtime's, librdkafka's) inherit it.
    pub(crate) fn enter_hub(spec: &Spec) -> Result<()> {
        let path = format!("/run/netns/{}", Self::hub(spec));
        let file = std::fs::File::open(&path).with_context(|| format!("opening {path}"))?;
        rustix::thread::move_into_link_name_space(
            std::os::fd::AsFd::as_fd(&file),
            Some(rustix::thread::LinkNameSpaceType::Network),
        )
        .with_context(|| format!("entering the network namespace {path}"))?;
        Ok(())
    }

    pub(crate) fn new(spec: Spec, nodes: Vec<Node>) -> Cluster {
        Cluster {
            spec,
            nodes,
            procs: Mutex::default(),
            cuts: Mutex::default(),
            torn_down: Mutex::new(false),
        }
    }

    pub(crate) fn node(&self, name: &str) -> Result<&Node> {
        self.nodes
            .iter()
            .find(|n| n.name == name)
            .ok_or_else(|| anyhow!("no node {name}"))
    }

    pub(crate) fn of_role(&self, role: Role) -> impl Iterator<Item = &Node> {
        self.nodes.iter().filter(move |n| n.role == role)
    }

    /// `host:port` of every broker, comma-separated.
    pub(crate) fn bootstrap(&self) -> String {
        self.of_role(Role::Broker)
            .map(|n| format!("{}:{KAFKA_PORT}", n.addr))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// `http://host:port` of a gateway.
    pub(crate) fn gateway_endpoint(&self, node: &Node) -> String {
        format!("http://{}:{GATEWAY_PORT}", node.addr)
    }

    pub(crate) fn node_dir(&self, node: &Node) -> PathBuf {
        self.spec.run_dir.join(&node.name)
    }

    /// Writes configuration and formats storage: once, before the first start.
    pub(crate) async fn prepare(&self) -> Result<()> {
        let cluster_id = kafka_cluster_id();
        for node in self.of_role(Role::Broker) {
            let dir = self.node_dir(node);
            std::fs::create_dir_all(dir.join("data"))?;
            let props = dir.join("server.properties");
            std::fs::write(&props, self.kafka_properties(node, &dir))?;
            let out = Command::new(&self.spec.java)
                .args(self.java_opts(&dir))
                .arg("-cp")
                .arg(format!("{}/*", self.spec.kafka_libs.display()))
                .arg(&self.spec.kafka_storage_class)
                .args(["format", "-t", &cluster_id, "-c"])
                .arg(&props)
                .stdin(Stdio::null())
                .output()
                .await
                .context("running Kafka's storage tool")?;
            if !out.status.success() {
                bail!(
                    "formatting {}'s storage failed: {}{}",
                    node.name,
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
        for node in self
            .of_role(Role::Consul)
            .chain(self.of_role(Role::Gateway))
        {
            std::fs::create_dir_all(self.node_dir(node).join("consul"))?;
        }
        Ok(())
    }

    fn java_opts(&self, dir: &Path) -> Vec<String> {
        vec![
            "-Xms128m".into(),
            format!("-Xmx{}", self.spec.kafka_heap),
            "-XX:+UseSerialGC".into(),
            "-XX:TieredStopAtLevel=1".into(),
            "-XX:+ExitOnOutOfMemoryError".into(),
            "-Djava.awt.headless=true".into(),
            format!(
                "-Dlog4j2.configurationFile=file:{}",
                self.spec.kafka_log4j.display()
            ),
            format!("-Dkafka.logs.dir={}", dir.display()),
        ]
    }

    fn kafka_properties(&self, node: &Node, dir: &Path) -> String {
        let voters = self
            .of_role(Role::Broker)
            .map(|n| format!("{}@{}:{KAFKA_CONTROLLER_PORT}", n.index, n.addr))
            .collect::<Vec<_>>()
            .join(",");
        let addr = node.addr;
        let mut p = String::new();
        let _ = write!(
            p,
            "# Written by kafka-lease-chaos: one of three KRaft nodes (broker and controller).\n\
             process.roles=broker,controller\n\
             node.id={}\n\
             controller.quorum.voters={voters}\n\
             listeners=PLAINTEXT://{addr}:{KAFKA_PORT},CONTROLLER://{addr}:{KAFKA_CONTROLLER_PORT}\n\
             advertised.listeners=PLAINTEXT://{addr}:{KAFKA_PORT}\n\
             controller.listener.names=CONTROLLER\n\
             inter.broker.listener.name=PLAINTEXT\n\
             listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT\n\
             log.dirs={}\n\
             num.partitions=1\n\
             default.replication.factor=3\n\
             min.insync.replicas=2\n\
             unclean.leader.election.enable=false\n\
             auto.create.topics.enable=false\n\
             offsets.topic.replication.factor=3\n\
             offsets.topic.num.partitions=6\n\
             transaction.state.log.replication.factor=3\n\
             transaction.state.log.min.isr=2\n\
             share.coordinator.state.topic.replication.factor=3\n\
             share.coordinator.state.topic.min.isr=2\n\
             group.initial.rebalance.delay.ms=0\n\
             num.network.threads=2\n\
             num.io.threads=2\n\
             num.recovery.threads.per.data.dir=1\n\
             replica.lag.time.max.ms=6000\n\
             broker.heartbeat.interval.ms=500\n\
             broker.session.timeout.ms=3000\n",
            node.index,
            dir.join("data").display()
        );
        p
    }

    /// The command line of a node's process (`what`: `kafka`, `consul`, `gateway`).
    fn command_line(&self, node: &Node, what: &str) -> Vec<String> {
        let dir = self.node_dir(node);
        match what {
            "kafka" => {
                let mut v = vec![self.spec.java.display().to_string()];
                v.extend(self.java_opts(&dir));
                v.push("-cp".into());
                v.push(format!("{}/*", self.spec.kafka_libs.display()));
                v.push("kafka.Kafka".into());
                v.push(dir.join("server.properties").display().to_string());
                v
            }
            "consul" => {
                let mut v = vec![
                    self.spec.consul_bin.display().to_string(),
                    "agent".into(),
                    "-node".into(),
                    node.name.clone(),
                    "-bind".into(),
                    node.addr.to_string(),
                    "-client".into(),
                    format!("127.0.0.1 {}", node.addr),
                    "-dns-port".into(),
                    "-1".into(),
                    "-grpc-port".into(),
                    "-1".into(),
                    "-data-dir".into(),
                    dir.join("consul").display().to_string(),
                    "-hcl".into(),
                    "disable_update_check = true".into(),
                    "-hcl".into(),
                    "performance { raft_multiplier = 1 }".into(),
                    "-log-level".into(),
                    "info".into(),
                    // Joins are retried every 30 s by default: an agent that starts before
                    // the servers listen would wait that long.
                    "-retry-interval".into(),
                    "1s".into(),
                ];
                if node.role == Role::Consul {
                    v.extend(["-server".into(), "-bootstrap-expect".into(), "3".into()]);
                    if self.spec.consul_min_quorum > 0 {
                        // Autopilot removes a server dead for ~10 s from the Raft
                        // configuration, leaving two voters of which both are needed, and
                        // takes it back as a non-voter for its stabilization time: a second
                        // fault then costs the quorum (docs/FAULTS.md, finding 9).
                        v.extend([
                            "-hcl".into(),
                            format!(
                                "autopilot {{ min_quorum = {} }}",
                                self.spec.consul_min_quorum
                            ),
                        ]);
                    }
                }
                for server in self.of_role(Role::Consul) {
                    if server.name != node.name {
                        v.push("-retry-join".into());
                        v.push(server.addr.to_string());
                    }
                }
                v
            }
            _ => {
                let listen = format!("{}:{GATEWAY_PORT}", node.addr);
                let mut v = vec![
                    self.spec.gateway_bin.display().to_string(),
                    "serve".into(),
                    "--kafka".into(),
                    self.bootstrap(),
                    "--consul".into(),
                    format!("http://127.0.0.1:{CONSUL_HTTP_PORT}"),
                    "--listen".into(),
                    listen.clone(),
                    "--advertise-addr".into(),
                    listen,
                    "--instance-id".into(),
                    node.name.clone(),
                    // The bridge is a private network the harness made; TLS is tested
                    // elsewhere (tests/security.rs).
                    "--plaintext".into(),
                    "--metrics-listen".into(),
                    format!("{}:{GATEWAY_METRICS_PORT}", node.addr),
                ];
                v.extend(self.spec.gateway_args.iter().cloned());
                v
            }
        }
    }

    fn key(node: &Node, what: &str) -> String {
        format!("{}/{what}", node.name)
    }

    /// Starts a node's process (`kafka`, `consul` or `gateway`) in its namespace.
    pub(crate) fn start(&self, node: &Node, what: &str) -> Result<u32> {
        let argv = self.command_line(node, what);
        let dir = self.node_dir(node);
        std::fs::create_dir_all(&dir)?;
        let log_path = dir.join(format!("{what}.log"));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("opening {}", log_path.display()))?;
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", &node.netns])
            .args(&argv)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log))
            .kill_on_drop(true);
        for var in [
            "http_proxy",
            "https_proxy",
            "HTTP_PROXY",
            "HTTPS_PROXY",
            "all_proxy",
            "ALL_PROXY",
            "no_proxy",
            "NO_PROXY",
        ] {
            command.env_remove(var);
        }
        if what == "gateway" {
            command.env("RUST_LOG", "info");
            command.envs(self.spec.gateway_env.iter().cloned());
            if let Some(lib) = &self.spec.clockshift_lib {
                // The file keeps the offset across restarts of the process: a fault that
                // is healed wrote "0" back.
                let file = self.clock_offset_file(node);
                if !file.exists() {
                    std::fs::write(&file, "0\n")?;
                }
                command
                    .env("LD_PRELOAD", lib)
                    .env("KAFKA_LEASE_CLOCKSHIFT_FILE", &file);
            }
        }
        let child = command
            .spawn()
            .with_context(|| format!("starting {what} on {}", node.name))?;
        let pid = child.id().ok_or_else(|| anyhow!("{what} exited at once"))?;
        let mut procs = self.procs.lock().unwrap_or_else(|p| p.into_inner());
        procs.insert(Self::key(node, what), Proc { child, pid });
        Ok(pid)
    }

    /// The file whose content (`0`, `+300`, `-120`: seconds) is a gateway's wall-clock
    /// offset.
    pub(crate) fn clock_offset_file(&self, node: &Node) -> PathBuf {
        self.node_dir(node).join("clock-offset")
    }

    /// The pid of a node's process, if it runs.
    pub(crate) fn pid(&self, node: &Node, what: &str) -> Option<u32> {
        let mut procs = self.procs.lock().unwrap_or_else(|p| p.into_inner());
        let proc = procs.get_mut(&Self::key(node, what))?;
        match proc.child.try_wait() {
            Ok(None) => Some(proc.pid),
            _ => None,
        }
    }

    /// Sends `signal` (`KILL`, `TERM`, `STOP`, `CONT`) to a node's process.
    pub(crate) fn signal(&self, node: &Node, what: &str, signal: &str) -> Result<u32> {
        let pid = self
            .pid(node, what)
            .ok_or_else(|| anyhow!("{what} on {} is not running", node.name))?;
        let status = std::process::Command::new("kill")
            .args([&format!("-{signal}"), &pid.to_string()])
            .status()?;
        if !status.success() {
            bail!("kill -{signal} {pid} failed");
        }
        Ok(pid)
    }

    /// Waits until a node's process has exited (after a signal), at most `deadline`.
    pub(crate) async fn wait_exit(
        &self,
        node: &Node,
        what: &str,
        deadline: Duration,
    ) -> Result<String> {
        let child = {
            let mut procs = self.procs.lock().unwrap_or_else(|p| p.into_inner());
            procs.remove(&Self::key(node, what))
        };
        let Some(mut proc) = child else {
            return Ok("not running".into());
        };
        match tokio::time::timeout(deadline, proc.child.wait()).await {
            Ok(Ok(status)) => Ok(format!("pid {} exited: {status}", proc.pid)),
            Ok(Err(e)) => Err(e.into()),
            Err(_) => {
                let _ = proc.child.start_kill();
                let _ = proc.child.wait().await;
                bail!(
                    "{what} on {} (pid {}) did not exit within {deadline:?}; killed",
                    node.name,
                    proc.pid
                )
            }
        }
    }

    /// The processes that have exited since they were started (and were not waited for by
    /// [`Cluster::wait_exit`]): (node, what, exit status). They are forgotten here.
    pub(crate) fn exited(&self) -> Vec<(Node, String, String)> {
        let mut procs = self.procs.lock().unwrap_or_else(|p| p.into_inner());
        let mut gone = Vec::new();
        procs.retain(|key, proc| match proc.child.try_wait() {
            Ok(Some(status)) => {
                gone.push((key.clone(), format!("pid {} exited: {status}", proc.pid)));
                false
            }
            _ => true,
        });
        gone.into_iter()
            .filter_map(|(key, status)| {
                let (name, what) = key.split_once('/')?;
                let node = self.nodes.iter().find(|n| n.name == name)?.clone();
                Some((node, what.to_string(), status))
            })
            .collect()
    }

    /// The last `lines` lines of a node's process log.
    pub(crate) fn log_tail(&self, node: &Node, what: &str, lines: usize) -> String {
        let path = self.node_dir(node).join(format!("{what}.log"));
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// The resident memory of every process the cluster runs now, and of the harness, in KiB.
    pub(crate) fn rss_kib(&self) -> u64 {
        let pids: Vec<u32> = {
            let procs = self.procs.lock().unwrap_or_else(|p| p.into_inner());
            procs.values().map(|p| p.pid).collect()
        };
        let mut total = rss_of("self");
        for pid in pids {
            total += rss_of(&pid.to_string());
        }
        total
    }

    /// The state letter of a process in /proc (`T` when stopped).
    pub(crate) fn proc_state(pid: u32) -> Option<char> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let after = stat.rsplit_once(") ")?.1;
        after.chars().next()
    }

    /// Drops traffic from `from` to `to` silently: `to`'s namespace gets a blackhole route to
    /// `from`, so `from`'s packets arrive and the answers vanish.
    pub(crate) fn cut_one_way(&self, from: &Node, to: &Node) -> Result<()> {
        ip(&[
            "-n",
            &to.netns,
            "route",
            "add",
            "blackhole",
            &format!("{}/32", from.addr),
        ])?;
        self.cuts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((to.netns.clone(), from.addr));
        Ok(())
    }

    /// Cuts traffic between `node` and the hub (the harness: the workload's clients, the
    /// producer and the observer), both ways.
    pub(crate) fn cut_from_hub(&self, node: &Node) -> Result<()> {
        let hub = Self::hub(&self.spec);
        let [a, b, c] = self.spec.subnet;
        let hub_addr = Ipv4Addr::new(a, b, c, 1);
        ip(&[
            "-n",
            &hub,
            "route",
            "add",
            "blackhole",
            &format!("{}/32", node.addr),
        ])?;
        ip(&[
            "-n",
            &node.netns,
            "route",
            "add",
            "blackhole",
            &format!("{hub_addr}/32"),
        ])?;
        let mut cuts = self.cuts.lock().unwrap_or_else(|p| p.into_inner());
        cuts.push((hub, node.addr));
        cuts.push((node.netns.clone(), hub_addr));
        Ok(())
    }

    /// Drops traffic from `from` to `to` at `from`'s side: `from`'s new connections fail at
    /// once, and what it sends on an established one stays in its retransmission queue until
    /// the cut heals (a request held back, then delivered late).
    pub(crate) fn hold_sending(&self, from: &Node, to: &Node) -> Result<()> {
        ip(&[
            "-n",
            &from.netns,
            "route",
            "add",
            "blackhole",
            &format!("{}/32", to.addr),
        ])?;
        self.cuts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((from.netns.clone(), to.addr));
        Ok(())
    }

    /// Removes every cut.
    pub(crate) fn heal(&self) -> Result<usize> {
        let cuts: Vec<_> =
            std::mem::take(&mut *self.cuts.lock().unwrap_or_else(|p| p.into_inner()));
        for (ns, addr) in &cuts {
            ip(&["-n", ns, "route", "del", "blackhole", &format!("{addr}/32")])?;
        }
        Ok(cuts.len())
    }

    /// Tries a TCP connect from inside `node`'s namespace to `target:port` and says how it
    /// went: `connected`, `refused`, `timed out` (what a silent cut gives), or the error.
    /// Runs a tiny Python program in the namespace (the harness's own sockets live in the hub).
    pub(crate) async fn probe(&self, node: &Node, target: Ipv4Addr, port: u16) -> String {
        let program = format!(
            "import socket\ns=socket.socket()\ns.settimeout(1.0)\ntry:\n s.connect(('{target}',{port}))\n print('connected')\nexcept socket.timeout:\n print('timed out')\nexcept ConnectionRefusedError:\n print('refused')\nexcept OSError as e:\n print('error: '+str(e))\n"
        );
        match Command::new("ip")
            .args(["netns", "exec", &node.netns, "python3", "-c", &program])
            .stdin(Stdio::null())
            .output()
            .await
        {
            Ok(out) => String::from_utf8_lossy(&out.stdout).trim().to_string(),
            Err(e) => format!("probe failed to run: {e}"),
        }
    }

    /// Stops everything: every process killed, every namespace removed. Idempotent.
    pub(crate) async fn teardown(&self) {
        {
            let mut done = self.torn_down.lock().unwrap_or_else(|p| p.into_inner());
            if *done {
                return;
            }
            *done = true;
        }
        let procs: Vec<Proc> = {
            let mut procs = self.procs.lock().unwrap_or_else(|p| p.into_inner());
            std::mem::take(&mut *procs).into_values().collect()
        };
        for mut proc in procs {
            let _ = std::process::Command::new("kill")
                .args(["-CONT", &proc.pid.to_string()])
                .stderr(Stdio::null())
                .status();
            let _ = proc.child.start_kill();
            let _ = tokio::time::timeout(Duration::from_secs(5), proc.child.wait()).await;
        }
        if let Err(e) = remove_leftovers(&self.spec.prefix) {
            say!("teardown: {e:#}");
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let done = *self.torn_down.lock().unwrap_or_else(|p| p.into_inner());
        if !done {
            // Children die with kill_on_drop; the namespaces go here.
            let _ = remove_leftovers(&self.spec.prefix);
        }
    }
}

/// VmRSS of /proc/<pid>/status, in KiB (0 when gone).
fn rss_of(pid: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// A Kafka cluster id: 16 random bytes, base64url without padding, not starting with `-`.
fn kafka_cluster_id() -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    loop {
        let bytes: [u8; 16] = rand::random();
        let mut bits: u32 = 0;
        let mut n = 0;
        let mut out = String::new();
        for b in bytes {
            bits = (bits << 8) | u32::from(b);
            n += 8;
            while n >= 6 {
                n -= 6;
                out.push(char::from(ALPHABET[((bits >> n) & 63) as usize]));
            }
        }
        if n > 0 {
            out.push(char::from(ALPHABET[((bits << (6 - n)) & 63) as usize]));
        }
        if !out.starts_with('-') {
            return out;
        }
    }
}
