//! The real `kafka-lease` binary as a child process: started with the arguments a test or the
//! benchmark chooses, on a loopback port of its own, and stopped, killed, paused or resumed
//! with signals. The one launcher the end-to-end tests and the benchmark share.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// How long a gateway may take to print the address it listens on.
const LISTEN_DEADLINE: Duration = Duration::from_secs(30);

/// A running gateway process. Dropping it kills the process.
#[derive(Debug)]
pub struct GatewayProcess {
    child: Option<Child>,
    pid: u32,
    /// `127.0.0.1:<port>`, as the gateway printed it.
    pub addr: String,
    /// The `--instance-id` it was given.
    pub instance: String,
    /// Where its log (stderr) goes.
    pub log_path: PathBuf,
    /// Every line it printed on stdout so far.
    stdout: Arc<Mutex<String>>,
}

impl GatewayProcess {
    /// Runs `bin serve <args>` with `--listen 127.0.0.1:0 --instance-id <instance>` added,
    /// stderr to `log_path`, and waits until it prints `kafka-lease listening on <addr>`.
    pub async fn spawn(
        bin: &Path,
        args: &[&str],
        instance: &str,
        log_path: PathBuf,
    ) -> Result<GatewayProcess, String> {
        let mut all: Vec<&str> = args.to_vec();
        all.extend(["--listen", "127.0.0.1:0", "--instance-id", instance]);
        Self::start(bin, &all, &[], false, instance, log_path).await
    }

    /// Runs `bin serve <args>` with exactly the `KAFKA_LEASE_*` variables of `env` (none
    /// inherited from the test's own environment) and nothing else added (the listen address
    /// and instance id come from `args` or `env`, as a deployment gives them), and waits
    /// until it prints `kafka-lease listening on <addr>`.
    pub async fn spawn_with_env(
        bin: &Path,
        args: &[&str],
        env: &[(String, String)],
        instance: &str,
        log_path: PathBuf,
    ) -> Result<GatewayProcess, String> {
        Self::start(bin, args, env, true, instance, log_path).await
    }

    async fn start(
        bin: &Path,
        args: &[&str],
        env: &[(String, String)],
        only_given_settings: bool,
        instance: &str,
        log_path: PathBuf,
    ) -> Result<GatewayProcess, String> {
        let log = std::fs::File::create(&log_path)
            .map_err(|e| format!("creating {}: {e}", log_path.display()))?;
        let mut command = Command::new(bin);
        if only_given_settings {
            for (key, _) in std::env::vars_os() {
                if key.to_string_lossy().starts_with("KAFKA_LEASE_") {
                    command.env_remove(key);
                }
            }
        }
        let mut child = command
            .arg("serve")
            .args(args)
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("spawning {}: {e}", bin.display()))?;
        let pid = child.id().ok_or("the gateway exited at once")?;
        let stdout = child.stdout.take().ok_or("no stdout pipe")?;
        let mut lines = BufReader::new(stdout).lines();
        let printed: Arc<Mutex<String>> = Arc::default();
        let keep = |printed: &Arc<Mutex<String>>, line: &str| {
            let mut printed = printed.lock().unwrap_or_else(|p| p.into_inner());
            printed.push_str(line);
            printed.push('\n');
        };
        let found = tokio::time::timeout(LISTEN_DEADLINE, async {
            while let Ok(Some(line)) = lines.next_line().await {
                keep(&printed, &line);
                if let Some(addr) = line.strip_prefix("kafka-lease listening on ") {
                    return Some(addr.trim().to_string());
                }
            }
            None
        })
        .await;
        let addr = match found {
            Ok(Some(addr)) => addr,
            Ok(None) => {
                return Err(format!(
                    "gateway {instance} exited before listening; its log ({}):\n{}",
                    log_path.display(),
                    log_tail(&log_path, 15)
                ))
            }
            Err(_) => {
                return Err(format!(
                    "gateway {instance} did not listen within {LISTEN_DEADLINE:?}; its log \
                     ({}):\n{}",
                    log_path.display(),
                    log_tail(&log_path, 15)
                ))
            }
        };
        // Keep draining stdout so the child never blocks on a full pipe.
        let drained = printed.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                keep(&drained, &line);
            }
        });
        Ok(GatewayProcess {
            child: Some(child),
            pid,
            addr,
            instance: instance.to_string(),
            log_path,
            stdout: printed,
        })
    }

    /// `http://<addr>`, for a gRPC client.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Sends a signal by name (`TERM`, `KILL`, `STOP`, `CONT`, ...).
    pub fn signal(&self, signal: &str) -> Result<(), String> {
        let status = std::process::Command::new("kill")
            .args([&format!("-{signal}"), &self.pid.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map_err(|e| format!("running kill: {e}"))?;
        if status.success() {
            Ok(())
        } else {
            Err(format!("kill -{signal} {} failed", self.pid))
        }
    }

    /// Waits up to `deadline` for the process to exit; its exit code (`None` if a signal
    /// ended it).
    pub async fn wait_exit(&mut self, deadline: Duration) -> Result<Option<i32>, String> {
        let child = self
            .child
            .as_mut()
            .ok_or("the gateway was already reaped")?;
        let status = tokio::time::timeout(deadline, child.wait())
            .await
            .map_err(|_| {
                format!(
                    "gateway {} did not exit within {deadline:?}; its log: {}",
                    self.instance,
                    self.log_path.display()
                )
            })?
            .map_err(|e| format!("waiting for the gateway: {e}"))?;
        self.child = None;
        Ok(status.code())
    }

    /// SIGTERM (the gateway releases its locks and exits), SIGKILL after `grace`.
    pub async fn stop(mut self, grace: Duration) {
        if self.child.is_none() {
            return;
        }
        let _ = self.signal("TERM");
        if self.wait_exit(grace).await.is_err() {
            if let Some(child) = self.child.as_mut() {
                let _ = child.start_kill();
                let _ = child.wait().await;
            }
        }
    }

    /// SIGKILL at once, and waits for the process to be reaped.
    pub async fn kill(mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
    }

    /// Everything the gateway logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// Everything the gateway printed on stdout so far.
    pub fn stdout(&self) -> String {
        self.stdout
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// The last `lines` lines of a file, for error messages.
pub fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
