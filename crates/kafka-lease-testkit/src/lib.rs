//! Helpers shared by the integration tests: where the real Kafka and Consul started by
//! `scripts/services up` are, names unique to one test, and waiting for a condition with a
//! deadline instead of sleeping.
//!
//! A test that needs a service calls [`Services::require`]. Under `CI=true` a missing service
//! is a loud failure; elsewhere the test is skipped with a message saying how to start the
//! services.

pub mod certs;
pub mod consul_agent;
pub mod consul_secure;
pub mod gateway;
pub mod records;
pub mod relay;
pub mod scenarios;
pub mod topics;
pub use certs::TestCa;
pub use consul_agent::ConsulClientAgent;
pub use consul_secure::SecureConsul;
pub use gateway::GatewayProcess;
pub use records::TestRecord;
pub use relay::{Fault, Relay};
pub use topics::{create_topic, delete_topics};

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The connection settings of the services that `scripts/services up` started.
#[derive(Debug, Clone)]
pub struct Services {
    /// `host:port` of the Kafka broker.
    pub kafka_bootstrap: String,
    /// `http://host:port` of the Consul agent's HTTP API.
    pub consul_http_addr: String,
    /// Every `KEY=value` line of the env file, for the settings a few tests need (binaries,
    /// pid files).
    pub vars: BTreeMap<String, String>,
}

impl Services {
    /// The services' settings, or `None` (after printing how to start them) when they are not
    /// running and this is not CI.
    ///
    /// # Panics
    /// Under `CI=true` when the env file is missing or a service does not answer: a test that
    /// needs a service must never pass silently there.
    pub fn require(test: &str) -> Option<Services> {
        match Self::discover() {
            Ok(services) => Some(services),
            Err(why) => {
                if is_ci() {
                    panic!("{test}: needs the real Kafka and Consul, but {why}. scripts/test starts them (scripts/services up).");
                }
                eprintln!(
                    "SKIPPED {test}: {why}. Start the services with `scripts/services up` (or run `scripts/test`)."
                );
                None
            }
        }
    }

    /// The name of the test function that `type_name` (of a function item declared in its
    /// body, as [`require_services!`] does) belongs to.
    pub fn test_name(type_name: &str) -> &str {
        let mut path = type_name.strip_suffix("::here").unwrap_or(type_name);
        while let Some(outer) = path.strip_suffix("::{{closure}}") {
            path = outer;
        }
        path.rsplit("::").next().unwrap_or(path)
    }

    /// Reads the env file and checks that both services accept TCP connections.
    pub fn discover() -> Result<Services, String> {
        let path = env_file_path();
        let text = std::fs::read_to_string(&path).map_err(|e| {
            format!(
                "the services env file {} cannot be read ({e})",
                path.display()
            )
        })?;
        let vars = parse_env_file(&text);
        // Explicit environment variables win over the file, so a developer can point the
        // tests at services of their own.
        let pick = |key: &str| std::env::var(key).ok().or_else(|| vars.get(key).cloned());
        let kafka_bootstrap = pick("KAFKA_BOOTSTRAP_SERVERS")
            .ok_or_else(|| format!("{} has no KAFKA_BOOTSTRAP_SERVERS", path.display()))?;
        let consul_http_addr = pick("CONSUL_HTTP_ADDR")
            .ok_or_else(|| format!("{} has no CONSUL_HTTP_ADDR", path.display()))?;
        let consul_hostport = consul_http_addr
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_string();
        let kafka_first = kafka_bootstrap
            .split(',')
            .next()
            .unwrap_or_default()
            .to_string();
        for (name, addr) in [("Kafka", &kafka_first), ("Consul", &consul_hostport)] {
            std::net::TcpStream::connect_timeout(
                &addr
                    .parse()
                    .map_err(|e| format!("{name} address {addr:?} is not host:port ({e})"))?,
                Duration::from_secs(2),
            )
            .map_err(|e| format!("{name} at {addr} does not accept connections ({e})"))?;
        }
        Ok(Services {
            kafka_bootstrap,
            consul_http_addr,
            vars,
        })
    }

    /// A setting from the env file, or a panic naming it.
    pub fn var(&self, key: &str) -> &str {
        self.vars.get(key).map(String::as_str).unwrap_or_else(|| {
            panic!("the services env file has no {key}; rerun scripts/services up")
        })
    }

    /// The services and the broker's SASL listener, or `None` (after printing why and how to
    /// start them) when they are not running, or were started by a `scripts/services` older
    /// than the listener, and this is not CI.
    ///
    /// # Panics
    /// Under `CI=true` when a service or the listener is missing.
    pub fn require_kafka_sasl(test: &str) -> Option<(Services, KafkaSasl)> {
        let services = Self::require(test)?;
        match services.kafka_sasl() {
            Ok(sasl) => Some((services, sasl)),
            Err(why) => {
                if is_ci() {
                    panic!("{test}: needs the broker's SASL listener, but {why}. scripts/test starts it (scripts/services up).");
                }
                eprintln!(
                    "SKIPPED {test}: {why}. Restart the services with `scripts/services up`."
                );
                None
            }
        }
    }

    /// The broker's SASL listener and its SCRAM user, from the env file.
    pub fn kafka_sasl(&self) -> Result<KafkaSasl, String> {
        let get = |key: &str| {
            self.vars.get(key).cloned().ok_or_else(|| {
                format!(
                    "the services env file has no {key} (the services were started by a \
                     scripts/services without the SASL listener)"
                )
            })
        };
        let sasl = KafkaSasl {
            bootstrap: get("KAFKA_LEASE_KAFKA_SASL_BOOTSTRAP_SERVERS")?,
            mechanism: get("KAFKA_LEASE_KAFKA_SASL_MECHANISM")?,
            username: get("KAFKA_LEASE_KAFKA_SASL_USERNAME")?,
            password: get("KAFKA_LEASE_KAFKA_SASL_PASSWORD")?,
        };
        let addr = sasl.bootstrap.parse().map_err(|e| {
            format!(
                "the SASL listener {:?} is not host:port ({e})",
                sasl.bootstrap
            )
        })?;
        std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).map_err(|e| {
            format!(
                "the SASL listener at {} does not accept connections ({e})",
                sasl.bootstrap
            )
        })?;
        Ok(sasl)
    }
}

/// The test broker's `SASL_PLAINTEXT` listener and the SCRAM user `scripts/services` created
/// for it: fixed test credentials.
#[derive(Debug, Clone)]
pub struct KafkaSasl {
    /// `host:port` of the listener.
    pub bootstrap: String,
    /// `SCRAM-SHA-256`.
    pub mechanism: String,
    pub username: String,
    pub password: String,
}

/// True when running under CI (`CI=true` or `CI=1`).
pub fn is_ci() -> bool {
    matches!(std::env::var("CI").as_deref(), Ok("true") | Ok("1"))
}

/// The env file `scripts/services up` writes: `$KAFKA_LEASE_SERVICES_RUN/services.env`, by
/// default `.cache/run/services.env` in the repository.
pub fn env_file_path() -> PathBuf {
    if let Ok(run) = std::env::var("KAFKA_LEASE_SERVICES_RUN") {
        return Path::new(&run).join("services.env");
    }
    repo_root().join(".cache/run/services.env")
}

/// The repository root (the workspace directory).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn parse_env_file(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .filter_map(|line| line.split_once('='))
        .map(|(k, v)| {
            let v = v.trim();
            let v = v
                .strip_prefix('\'')
                .and_then(|v| v.strip_suffix('\''))
                .or_else(|| v.strip_prefix('"').and_then(|v| v.strip_suffix('"')))
                .unwrap_or(v);
            (k.trim().to_string(), v.to_string())
        })
        .collect()
}

/// A name unique to one test run: `<prefix>-<12 random hex digits>`, valid as a Kafka topic,
/// a group id and a Consul key segment.
pub fn unique_name(prefix: &str) -> String {
    format!("{prefix}-{:012x}", rand::random::<u64>() & 0xffff_ffff_ffff)
}

/// Polls `condition` every 20 ms until it yields `Some`, or panics after `deadline` naming
/// `what`. Tests wait for conditions, never for fixed times.
pub async fn wait_for<T, F, Fut>(what: &str, deadline: Duration, condition: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    wait_for_result(what, deadline, condition)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// [`wait_for`] for callers that report failure as a value (the benchmark): an error naming
/// `what` after `deadline`.
pub async fn wait_for_result<T, F, Fut>(
    what: &str,
    deadline: Duration,
    mut condition: F,
) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let started = tokio::time::Instant::now();
    loop {
        if let Some(value) = condition().await {
            return Ok(value);
        }
        if started.elapsed() >= deadline {
            return Err(format!("timed out after {deadline:?} waiting for {what}"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The real services for the test this is written in, named after the test function: the
/// settings, or, outside CI and with the services not running, a note on how to start them
/// and a `return` from the test (under `CI=true` it panics: see [`Services::require`]).
///
/// ```ignore
/// let services = kafka_lease_testkit::require_services!();
/// ```
#[macro_export]
macro_rules! require_services {
    () => {{
        fn here() {}
        match $crate::Services::require($crate::Services::test_name(::std::any::type_name_of_val(
            &here,
        ))) {
            Some(services) => services,
            None => return,
        }
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_file_lines_are_parsed_with_quotes_and_comments() {
        let vars = parse_env_file("# comment\nA=1\nB='two words'\n\nC=\"x=y\"\n");
        assert_eq!(vars.get("A").map(String::as_str), Some("1"));
        assert_eq!(vars.get("B").map(String::as_str), Some("two words"));
        assert_eq!(vars.get("C").map(String::as_str), Some("x=y"));
        assert_eq!(vars.len(), 3);
    }

    #[test]
    fn the_test_name_is_the_function_that_declares_here() {
        assert_eq!(
            Services::test_name("limits::one_connection::{{closure}}::here"),
            "one_connection"
        );
        assert_eq!(Services::test_name("smoke::plain::here"), "plain");
        fn here() {}
        assert_eq!(
            Services::test_name(std::any::type_name_of_val(&here)),
            "the_test_name_is_the_function_that_declares_here"
        );
    }

    #[test]
    fn unique_names_are_valid_kafka_names_and_differ() {
        let a = unique_name("t");
        let b = unique_name("t");
        assert_ne!(a, b);
        assert!(a.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
    }

    #[tokio::test]
    async fn wait_for_returns_the_first_some() {
        let mut n = 0;
        let got = wait_for("n to reach 3", Duration::from_secs(5), || {
            n += 1;
            let v = (n >= 3).then_some(n);
            async move { v }
        })
        .await;
        assert_eq!(got, 3);
    }
}
