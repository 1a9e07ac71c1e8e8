//! A Consul dev server of the test's own, secured as production runs it: the HTTP API only
//! over HTTPS with client certificates required (`verify_incoming_https`), and ACLs on with
//! a default policy of deny. The test gets a management token and the `consul` CLI to make
//! policies and tokens, as an operator would.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};

use crate::certs::{IssuedFiles, TestCa};
use crate::{wait_for, Services};

/// The secured Consul server. Dropping it kills the process.
#[derive(Debug)]
pub struct SecureConsul {
    bin: String,
    _child: Child,
    /// `https://127.0.0.1:<port>`.
    pub https_addr: String,
    /// The CA that signed the server's and the clients' certificates.
    pub ca_file: PathBuf,
    /// A client certificate the agent accepts (for the CLI, and for gateways under test).
    pub client: IssuedFiles,
    /// The management token (ACL `master`).
    pub management_token: String,
    pub log: PathBuf,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

fn uuid() -> String {
    let hex = format!("{:032x}", rand::random::<u128>());
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

impl SecureConsul {
    /// Starts the server with certificates from `ca` (files under `dir`) and waits until its
    /// ACL system answers the management token.
    pub async fn start(services: &Services, ca: &TestCa, dir: &Path) -> SecureConsul {
        std::fs::create_dir_all(dir.join("data")).expect("consul data dir");
        let ca_file = ca.write(dir, "consul-ca");
        let server = ca
            .server(&["server.dc1.consul", "localhost", "127.0.0.1"])
            .write(dir, "consul-server");
        let client = ca.client("consul-operator").write(dir, "consul-operator");
        let management_token = uuid();
        let https = free_port();
        let config = format!(
            r#"
ports {{
  http = -1
  https = {https}
  dns = -1
  grpc = -1
  serf_lan = {serf_lan}
  serf_wan = {serf_wan}
  server = {server_port}
}}
ca_file = "{ca}"
cert_file = "{cert}"
key_file = "{key}"
verify_incoming_https = true
verify_outgoing = false
acl {{
  enabled = true
  default_policy = "deny"
  enable_token_persistence = false
  tokens {{
    master = "{token}"
    agent = "{token}"
  }}
}}
disable_update_check = true
"#,
            serf_lan = free_port(),
            serf_wan = free_port(),
            server_port = free_port(),
            ca = ca_file.display(),
            cert = server.cert.display(),
            key = server.key.display(),
            token = management_token,
        );
        let config_file = dir.join("consul.hcl");
        std::fs::write(&config_file, config).expect("consul config");
        let log = dir.join("consul.log");
        let log_file = std::fs::File::create(&log).expect("consul log");
        let bin = services.var("KAFKA_LEASE_CONSUL_BIN").to_string();
        let child = Command::new(&bin)
            .args([
                "agent",
                "-dev",
                "-node",
                &format!("secure-{https}"),
                "-bind",
                "127.0.0.1",
                "-client",
                "127.0.0.1",
                "-data-dir",
                &dir.join("data").display().to_string(),
                "-config-file",
                &config_file.display().to_string(),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::from(log_file.try_clone().expect("log handle")))
            .stderr(Stdio::from(log_file))
            .kill_on_drop(true)
            .spawn()
            .expect("spawn the secured consul server");
        let consul = SecureConsul {
            bin,
            _child: child,
            https_addr: format!("https://127.0.0.1:{https}"),
            ca_file,
            client,
            management_token,
            log,
        };
        let log = consul.log.clone();
        wait_for(
            &format!(
                "the secured consul server to answer ACL requests (log: {})",
                log.display()
            ),
            Duration::from_secs(30),
            || async { consul.cli(&["acl", "policy", "list"]).await.ok() },
        )
        .await;
        consul
    }

    /// Runs the `consul` CLI against this server over HTTPS, with the client certificate
    /// and the management token: its stdout, or its stderr as the error.
    pub async fn cli(&self, args: &[&str]) -> Result<String, String> {
        let out = Command::new(&self.bin)
            .args(args)
            .env("CONSUL_HTTP_ADDR", &self.https_addr)
            .env("CONSUL_CACERT", &self.ca_file)
            .env("CONSUL_CLIENT_CERT", &self.client.cert)
            .env("CONSUL_CLIENT_KEY", &self.client.key)
            .env("CONSUL_HTTP_TOKEN", &self.management_token)
            .output()
            .await
            .map_err(|e| format!("running consul: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).to_string())
        } else {
            Err(format!(
                "consul {args:?} failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }

    /// A new policy named `name` with `rules` (HCL), and a token with it: the token's secret.
    pub async fn token_with_rules(&self, name: &str, rules: &str, dir: &Path) -> String {
        let rules_file = dir.join(format!("{name}.hcl"));
        std::fs::write(&rules_file, rules).expect("rules file");
        self.cli(&[
            "acl",
            "policy",
            "create",
            "-name",
            name,
            "-rules",
            &format!("@{}", rules_file.display()),
        ])
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        let out = self
            .cli(&[
                "acl",
                "token",
                "create",
                "-policy-name",
                name,
                "-description",
                name,
                "-format",
                "json",
            ])
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let secret = out
            .split("\"SecretID\"")
            .nth(1)
            .and_then(|rest| rest.split('"').nth(1))
            .unwrap_or_else(|| panic!("no SecretID in {out}"));
        secret.to_string()
    }
}
