//! A Consul *client* agent on loopback that joins the dev server `scripts/services` started,
//! so a test can put a gateway on an agent of its own and then stop or restart that agent:
//! what production sees when the agent on a gateway's host restarts (a graceful leave
//! deregisters its node, and Consul invalidates every session of that node at once).

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};

use crate::{wait_for, Services};

/// A client agent process owned by the test. Dropping it kills the process.
#[derive(Debug)]
pub struct ConsulClientAgent {
    bin: String,
    args: Vec<String>,
    log: PathBuf,
    child: Option<Child>,
    /// `http://127.0.0.1:<port>`: the agent's HTTP API, for a gateway's `--consul`.
    pub http_addr: String,
    /// The agent's node name.
    pub node: String,
}

/// A loopback port that was free a moment ago.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

impl ConsulClientAgent {
    /// Starts a client agent named `node` (data and log under `dir`) that joins the test
    /// services' Consul server, and waits until it serves its HTTP API with a known leader.
    pub async fn start(services: &Services, node: &str, dir: PathBuf) -> ConsulClientAgent {
        let server_serf = services.var("KAFKA_LEASE_CONSUL_SERF_LAN_PORT");
        let (http, serf) = (free_port(), free_port());
        std::fs::create_dir_all(dir.join("data")).expect("agent data dir");
        let args: Vec<String> = [
            "agent",
            "-node",
            node,
            "-bind",
            "127.0.0.1",
            "-client",
            "127.0.0.1",
            "-http-port",
            &http.to_string(),
            "-dns-port",
            "-1",
            "-grpc-port",
            "-1",
            "-serf-lan-port",
            &serf.to_string(),
            "-retry-join",
            &format!("127.0.0.1:{server_serf}"),
            "-retry-interval",
            "1s",
            "-data-dir",
            &dir.join("data").display().to_string(),
            "-hcl",
            "disable_update_check = true",
            // Consul's default for client agents, stated so the test does not depend on it:
            // a stopped agent leaves the cluster, and its node's sessions end.
            "-hcl",
            "leave_on_terminate = true",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let mut agent = ConsulClientAgent {
            bin: services.var("KAFKA_LEASE_CONSUL_BIN").to_string(),
            args,
            log: dir.join("agent.log"),
            child: None,
            http_addr: format!("http://127.0.0.1:{http}"),
            node: node.to_string(),
        };
        agent.restart().await;
        agent
    }

    /// Starts the agent again (after [`ConsulClientAgent::leave`]) with the same node name,
    /// ports and data, and waits until it is ready.
    pub async fn restart(&mut self) {
        assert!(self.child.is_none(), "the agent is running");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("agent log");
        let child = Command::new(&self.bin)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone().expect("log handle")))
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            .spawn()
            .expect("spawn the consul client agent");
        self.child = Some(child);
        let leader_url = format!("{}/v1/status/leader", self.http_addr);
        let log = self.log.clone();
        wait_for(
            &format!("the consul client agent to join (log: {})", log.display()),
            Duration::from_secs(30),
            || {
                let url = leader_url.clone();
                async move { http_get(&url).await.filter(|body| body.len() > 2) }
            },
        )
        .await;
    }

    /// Stops the agent gracefully (SIGINT: it leaves the cluster, so the servers deregister
    /// its node) and waits for it to exit.
    pub async fn leave(&mut self) {
        let mut child = self.child.take().expect("the agent is running");
        let pid = child.id().expect("agent pid");
        let status = std::process::Command::new("kill")
            .args(["-INT", &pid.to_string()])
            .status()
            .expect("kill -INT");
        assert!(status.success(), "kill -INT {pid} failed");
        tokio::time::timeout(Duration::from_secs(20), child.wait())
            .await
            .expect("the agent exits within 20 s of SIGINT")
            .expect("wait for the agent");
    }
}

/// A plain HTTP/1.0 GET on loopback: the body of a 200 answer, else `None`.
async fn http_get(url: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.strip_prefix("http://")?;
    let (host, path) = rest.split_once('/')?;
    let mut stream = tokio::net::TcpStream::connect(host).await.ok()?;
    let request = format!("GET /{path} HTTP/1.0\r\nHost: {host}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut response = String::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_string(&mut response))
        .await
        .ok()?
        .ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    (head.split_whitespace().nth(1) == Some("200")).then(|| body.trim().to_string())
}
