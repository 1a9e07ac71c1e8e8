//! Command-line and environment configuration, validated before anything is bound or
//! connected. Every flag has a `KAFKA_LEASE_*` environment variable.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};

use crate::auth::AuthFiles;
use crate::coordination::consul::{ConsulConfigError, ConsulLockConfig, ConsulTls, SessionCheck};
use crate::kafka_config::{parse_properties, KafkaProperties, PROPERTIES_FORMAT};
use crate::tls::TlsFiles;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable, coloured when writing to a terminal.
    Pretty,
    /// One JSON object per line, for log shippers.
    Json,
}

/// How Consul learns that a gateway died or stopped working.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ConsulCheck {
    /// Bind the session to a TTL check that the gateway's runtime passes every
    /// `--consul-check-ttl / 5`: a crashed, stopped or wedged gateway's partitions move
    /// after about `--consul-check-ttl` plus the lock-delay. The agent needs no route to the
    /// gateway.
    Ttl,
    /// Bind the session to a TCP check that the Consul agent runs against the gRPC listener
    /// every second: a crashed gateway's partitions move after about one check interval
    /// plus the lock-delay, but a hung one keeps passing it (its kernel still completes
    /// handshakes) until the session TTL. Needs an agent that can dial the gateway
    /// (`--consul-check-addr`).
    Tcp,
    /// The session TTL alone: a crashed gateway's partitions move after up to
    /// 2 × `--session-ttl` + `--lock-delay`. For deployments without a local agent.
    None,
}

#[derive(Debug, Clone, Args)]
pub struct LogArgs {
    /// Log output format.
    #[arg(
        long,
        env = "KAFKA_LEASE_LOG_FORMAT",
        value_enum,
        default_value = "pretty"
    )]
    pub log_format: LogFormat,
    /// Log filter, in `tracing` EnvFilter syntax (e.g. `info`, `kafka_lease_server=debug`).
    #[arg(long, env = "KAFKA_LEASE_LOG", default_value = "info")]
    pub log: String,
    /// Export traces over OTLP/gRPC to this collector, e.g. `http://otel-collector:4317`
    /// (off unless given): a span per gRPC call, continuing the caller's W3C trace context,
    /// and a span per lease.
    #[arg(long, env = "KAFKA_LEASE_OTLP_ENDPOINT", value_name = "URL")]
    pub otlp_endpoint: Option<String>,
}

#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Kafka bootstrap servers, `host:port[,host:port...]`.
    #[arg(long, env = "KAFKA_LEASE_KAFKA")]
    pub kafka: String,
    /// Consul HTTP API address.
    #[arg(
        long,
        env = "KAFKA_LEASE_CONSUL",
        default_value = "http://127.0.0.1:8500"
    )]
    pub consul: String,
    /// Consul ACL token (needs `key_prefix` write on the prefix and `session` write).
    #[arg(long, env = "KAFKA_LEASE_CONSUL_TOKEN", hide_env_values = true)]
    pub consul_token: Option<String>,
    /// A file holding the Consul ACL token (read at startup, surrounding whitespace
    /// trimmed): keeps the token out of the process list and the environment.
    #[arg(
        long,
        env = "KAFKA_LEASE_CONSUL_TOKEN_FILE",
        conflicts_with = "consul_token",
        value_name = "PATH"
    )]
    pub consul_token_file: Option<PathBuf>,
    /// CA certificates (PEM) that Consul's HTTPS certificate must chain to, for an
    /// `https://` --consul. Default: CONSUL_CACERT, else the system's roots.
    #[arg(long, env = "KAFKA_LEASE_CONSUL_CA_CERT", value_name = "PATH")]
    pub consul_ca_cert: Option<PathBuf>,
    /// A client certificate (PEM) for a Consul agent that verifies incoming HTTPS
    /// (`verify_incoming`), with --consul-client-key.
    #[arg(
        long,
        env = "KAFKA_LEASE_CONSUL_CLIENT_CERT",
        requires = "consul_client_key",
        value_name = "PATH"
    )]
    pub consul_client_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM, PKCS#8 or RSA).
    #[arg(
        long,
        env = "KAFKA_LEASE_CONSUL_CLIENT_KEY",
        requires = "consul_client_cert",
        value_name = "PATH"
    )]
    pub consul_client_key: Option<PathBuf>,
    /// Consul KV prefix for the lock keys: `<prefix>/<group>/<topic>/<partition>`.
    #[arg(long, env = "KAFKA_LEASE_CONSUL_PREFIX", default_value = "kafka-lease")]
    pub consul_prefix: String,
    /// The address the gRPC server listens on.
    #[arg(long, env = "KAFKA_LEASE_LISTEN", default_value = "127.0.0.1:50051")]
    pub listen: SocketAddr,
    /// The `host:port` other gateway instances reach this one at, to forward calls on the
    /// leases it serves (recorded in Consul). Default: the listen address, which must then be
    /// a concrete one (not 0.0.0.0 or [::]); in Kubernetes, the pod IP and port.
    #[arg(long, env = "KAFKA_LEASE_ADVERTISE_ADDR")]
    pub advertise_addr: Option<String>,
    /// This instance's name, shown to clients and stored in lock values. Default: the
    /// host name plus a random suffix, so a restarted gateway is a new instance.
    #[arg(long, env = "KAFKA_LEASE_INSTANCE_ID")]
    pub instance_id: Option<String>,
    /// TTL of the gateway's Consul session (10s ..= 24h). A gateway that cannot renew its
    /// session within this time stops serving its leases.
    #[arg(long, env = "KAFKA_LEASE_SESSION_TTL", value_parser = parse_duration, default_value = "10s")]
    pub session_ttl: Duration,
    /// Consul lock-delay after the gateway's session is invalidated (1s ..= 60s). Explicit
    /// releases set none. The gateway stops acting on its locks this long less 250 ms after
    /// its last confirmed session renewal (the self-fence window).
    #[arg(long, env = "KAFKA_LEASE_LOCK_DELAY", value_parser = parse_duration, default_value = "1500ms")]
    pub lock_delay: Duration,
    /// How Consul learns that this gateway died or stopped working (see `--consul-check` in
    /// docs/OPERATIONS.md).
    #[arg(
        long,
        env = "KAFKA_LEASE_CONSUL_CHECK",
        value_enum,
        default_value = "ttl"
    )]
    pub consul_check: ConsulCheck,
    /// With `--consul-check ttl`: how long after the gateway's last pass the agent marks the
    /// check critical, ending the session (500ms ..= 10s; passed five times per TTL).
    #[arg(long, env = "KAFKA_LEASE_CONSUL_CHECK_TTL", value_parser = parse_duration, default_value = "1s")]
    pub consul_check_ttl: Duration,
    /// The `host:port` the Consul agent dials for the TCP check. Default: the listen
    /// address, with the loopback address (127.0.0.1 or [::1]) for an unspecified host.
    #[arg(long, env = "KAFKA_LEASE_CONSUL_CHECK_ADDR")]
    pub consul_check_addr: Option<String>,
    /// How often the session is renewed, which is also how often the gateway confirms it
    /// still holds its locks. Default: a quarter of the self-fence window (see
    /// docs/ARCHITECTURE.md); refused if fewer than three renewals fit in the window.
    #[arg(long, env = "KAFKA_LEASE_CONSUL_RENEW_INTERVAL", value_parser = parse_duration)]
    pub consul_renew_interval: Option<Duration>,
    /// Most kilobytes pre-fetched per leased partition: the per-lease memory bound.
    #[arg(long, env = "KAFKA_LEASE_FETCH_QUEUE_KBYTES", default_value_t = 2048,
          value_parser = clap::value_parser!(u32).range(64..=1_048_576))]
    pub fetch_queue_kbytes: u32,
    /// Most leases this instance serves at once; an Acquire past it is RESOURCE_EXHAUSTED.
    #[arg(long, env = "KAFKA_LEASE_MAX_LEASES", default_value_t = 10_000,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_leases: u32,
    /// Most Acquires waiting for a partition on this instance at once.
    #[arg(long, env = "KAFKA_LEASE_MAX_WAITING_ACQUIRES", default_value_t = 1_000,
          value_parser = clap::value_parser!(u32).range(0..=1_000_000))]
    pub max_waiting_acquires: u32,
    /// Most leases (and Acquires in progress) one client connection may have on this instance
    /// at once; an Acquire past it is RESOURCE_EXHAUSTED.
    #[arg(long, env = "KAFKA_LEASE_MAX_LEASES_PER_CONNECTION", default_value_t = 1_000,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_leases_per_connection: u32,
    /// Most long calls (Reads, Subscribes, Acquires that may wait) open at once on one client
    /// connection; one past it is RESOURCE_EXHAUSTED. Default: --max-leases-per-connection +
    /// --max-waiting-acquires + 100 (2,100), so that one connection can read every lease it
    /// holds and wait for as many partitions as the gateway lets wait.
    #[arg(long, env = "KAFKA_LEASE_MAX_LONG_CALLS_PER_CONNECTION",
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_long_calls_per_connection: Option<u32>,
    /// Most calls open at once on one client connection (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS:
    /// a client queues calls past it until one ends). Must be larger than
    /// --max-long-calls-per-connection: the difference is the room short calls (Commit, Seek,
    /// Release, ListLeases) always have. Default: --max-long-calls-per-connection + 100.
    #[arg(long, env = "KAFKA_LEASE_MAX_STREAMS_PER_CONNECTION",
          value_parser = clap::value_parser!(u32).range(2..=1_000_100))]
    pub max_streams_per_connection: Option<u32>,
    /// Most consumer groups with leases on this instance at once (each costs a Kafka client
    /// with its own threads and broker connections).
    #[arg(long, env = "KAFKA_LEASE_MAX_GROUPS", default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub max_groups: u32,
    /// A librdkafka property, `key=value`, for the gateway's Kafka clients: TLS, SASL, tuning
    /// (repeatable; a value splits at commas, so give a value that holds a comma in
    /// --kafka-config-file). Overrides the same key of --kafka-config-file. Values of secret
    /// keys (passwords, private keys) are never shown. `--kafka-option` is the older name.
    #[arg(long = "kafka-config", visible_alias = "kafka-option", env = "KAFKA_LEASE_KAFKA_OPTIONS",
          value_name = "KEY=VALUE", value_delimiter = ',', hide_env_values = true,
          value_parser = kafka_config_entry)]
    pub kafka_config: Vec<KafkaConfigEntry>,
    /// A Java-style properties file of librdkafka properties (`key=value` lines, `#` or `!`
    /// comments, blank lines), read at startup; --kafka-config overrides its values. The
    /// place for secrets such as `sasl.password`: keep it readable by the gateway alone.
    #[arg(long, env = "KAFKA_LEASE_KAFKA_CONFIG_FILE", value_name = "PATH")]
    pub kafka_config_file: Option<PathBuf>,
    /// How long a graceful shutdown (SIGTERM, SIGINT) may take before the process exits.
    #[arg(long, env = "KAFKA_LEASE_SHUTDOWN_GRACE", value_parser = parse_duration, default_value = "10s")]
    pub shutdown_grace: Duration,
    /// How often the gateway pings each client connection over HTTP/2 (1s ..= 10m).
    #[arg(long, env = "KAFKA_LEASE_KEEPALIVE_INTERVAL", value_parser = parse_duration, default_value = "20s")]
    pub keepalive_interval: Duration,
    /// How long a ping may go unanswered before the connection is closed and its calls end:
    /// a client that vanished without closing it (a paused or cut-off host) then loses its
    /// leases after their TTL, as one that went away does (1s ..= 10m).
    #[arg(long, env = "KAFKA_LEASE_KEEPALIVE_TIMEOUT", value_parser = parse_duration, default_value = "20s")]
    pub keepalive_timeout: Duration,
    /// Serve Prometheus metrics at `http://<addr>/metrics` (off unless given; 9464 is the
    /// conventional port, e.g. `0.0.0.0:9464`).
    #[arg(long, env = "KAFKA_LEASE_METRICS_LISTEN", value_name = "ADDR")]
    pub metrics_listen: Option<SocketAddr>,
    #[command(flatten)]
    pub security: SecurityArgs,
    #[command(flatten)]
    pub log: LogArgs,
}

/// Transport security, identities and authorization on the gRPC port.
#[derive(Debug, Clone, Args)]
pub struct SecurityArgs {
    /// The server's TLS certificate chain (PEM, leaf first): TLS on the gRPC port. Also
    /// this instance's client certificate towards other instances. Re-read when it changes.
    #[arg(long, env = "KAFKA_LEASE_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The certificate's private key (PEM: PKCS#8, PKCS#1 or SEC1). Re-read when it changes.
    #[arg(long, env = "KAFKA_LEASE_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// CA certificates (PEM) that client certificates must chain to: every client must
    /// present one (mutual TLS), and its name is the caller's identity. Re-read when it changes.
    #[arg(long, env = "KAFKA_LEASE_TLS_CLIENT_CA", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,
    /// CA certificates (PEM) that other instances' certificates must chain to when calls
    /// are forwarded to them. Default: --tls-client-ca.
    #[arg(long, env = "KAFKA_LEASE_TLS_PEER_CA", requires = "tls_cert")]
    pub tls_peer_ca: Option<PathBuf>,
    /// Serve plaintext gRPC on a non-loopback address. Without TLS flags the gateway
    /// serves plaintext only on a loopback address unless this is given.
    #[arg(long, env = "KAFKA_LEASE_PLAINTEXT", conflicts_with = "tls_cert")]
    pub plaintext: bool,
    /// The authorization policy (TOML): which identities may do what, per group and topic
    /// pattern. Set, every call needs an identity. Re-read when it changes; a bad version
    /// keeps the previous one in force. See "Running it securely" in docs/OPERATIONS.md.
    #[arg(long, env = "KAFKA_LEASE_AUTH_POLICY")]
    pub auth_policy: Option<PathBuf>,
    /// Bearer tokens: lines of `<identity> <token>` (`#` comments). A call with
    /// `authorization: Bearer <token>` is that identity. Re-read when it changes.
    #[arg(long, env = "KAFKA_LEASE_AUTH_TOKENS_FILE")]
    pub auth_tokens_file: Option<PathBuf>,
    /// Whether the gRPC reflection services are served (grpcurl and grpcui use them to
    /// learn the API; with `false`, give them the .proto files instead).
    #[arg(long, env = "KAFKA_LEASE_REFLECTION", default_value_t = true,
          action = clap::ArgAction::Set, value_name = "BOOL")]
    pub reflection: bool,
}

impl SecurityArgs {
    /// The TLS files, when TLS is on.
    pub fn tls_files(&self) -> Option<TlsFiles> {
        Some(TlsFiles {
            cert: self.tls_cert.clone()?,
            key: self.tls_key.clone()?,
            client_ca: self.tls_client_ca.clone(),
            peer_ca: self.tls_peer_ca.clone(),
        })
    }

    pub fn auth_files(&self) -> AuthFiles {
        AuthFiles {
            policy: self.auth_policy.clone(),
            tokens: self.auth_tokens_file.clone(),
        }
    }

    /// Plaintext on a non-loopback address only when asked for; forwarding over TLS needs
    /// a CA to check peers against.
    fn validate(&self, listen: SocketAddr) -> Result<(), ConfigError> {
        if self.tls_cert.is_none() && !self.plaintext && !listen.ip().is_loopback() {
            return Err(ConfigError {
                flag: "--listen",
                value: listen.to_string(),
                allowed: "a loopback address, unless TLS is set up (--tls-cert and --tls-key) \
                          or plaintext is asked for explicitly (--plaintext): without TLS, \
                          lease ids, offsets and records cross the network readable by anyone \
                          on the path"
                    .into(),
            });
        }
        if self.tls_cert.is_some() && self.tls_client_ca.is_none() && self.tls_peer_ca.is_none() {
            return Err(ConfigError {
                flag: "--tls-peer-ca",
                value: "(unset)".into(),
                allowed: "a CA file: with TLS on, calls forwarded to other instances check \
                          their certificates against it (--tls-client-ca serves for both when \
                          one CA signs gateways and clients)"
                    .into(),
            });
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Args)]
pub struct DevArgs {
    /// The address the gRPC server listens on.
    #[arg(long, env = "KAFKA_LEASE_LISTEN", default_value = "127.0.0.1:50051")]
    pub listen: SocketAddr,
    /// Records per partition of the sample topic `demo`.
    #[arg(long, default_value_t = 25)]
    pub sample_records: u32,
    #[command(flatten)]
    pub log: LogArgs,
}

fn parse_duration(value: &str) -> Result<Duration, String> {
    humantime::parse_duration(value)
        .map_err(|e| format!("{value:?} is not a duration like 10s, 500ms or 2m ({e})"))
}

/// One `--kafka-config` value as given (one comma-separated piece of it), checked only by
/// [`ServeArgs::kafka_properties`]: a parse error would make clap quote the value, which may
/// be a secret. Its `Debug` shows the key alone.
#[derive(Clone, PartialEq, Eq)]
pub struct KafkaConfigEntry(String);

impl KafkaConfigEntry {
    /// `(key, value)`, trimmed, or `None` when it is not `key=value` with a key.
    fn pair(&self) -> Option<(&str, &str)> {
        match self.0.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => Some((k.trim(), v.trim())),
            _ => None,
        }
    }
}

impl std::fmt::Debug for KafkaConfigEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.pair() {
            Some((key, _)) => write!(f, "{key}=<value not shown>"),
            None => f.write_str("<not key=value; not shown>"),
        }
    }
}

fn kafka_config_entry(value: &str) -> Result<KafkaConfigEntry, std::convert::Infallible> {
    Ok(KafkaConfigEntry(value.to_string()))
}

/// Properties the gateway sets itself on every Kafka client; an operator may not.
const RESERVED_KAFKA_KEYS: [&str; 3] = ["group.id", "enable.auto.commit", "bootstrap.servers"];
const RESERVED_KAFKA_KEYS_ALLOWED: &str = "any librdkafka property except group.id, \
     enable.auto.commit and bootstrap.servers, which the gateway sets itself";

/// A configuration value that is syntactically fine but not allowed.
#[derive(Debug, thiserror::Error)]
#[error("invalid {flag} {value}: {allowed}")]
pub struct ConfigError {
    pub flag: &'static str,
    pub value: String,
    pub allowed: String,
}

fn check_name(flag: &'static str, value: &str) -> Result<(), ConfigError> {
    let ok = !value.is_empty()
        && value.len() <= 128
        && value.chars().all(crate::coordination::is_name_char);
    if ok {
        Ok(())
    } else {
        Err(ConfigError {
            flag,
            value: format!("{value:?}"),
            allowed: "1..=128 characters of [A-Za-z0-9._-]".into(),
        })
    }
}

impl ServeArgs {
    /// Checks every value against its allowed range. Runs before any port is bound.
    /// The per-connection call limits, each derived from the others unless set; refused
    /// when the stream bound leaves short calls no room.
    pub fn connection_limits(&self) -> Result<crate::calls::ConnectionLimits, ConfigError> {
        crate::calls::ConnectionLimits::derive(
            self.max_leases_per_connection,
            self.max_waiting_acquires,
            self.max_long_calls_per_connection,
            self.max_streams_per_connection,
        )
        .map_err(|allowed| ConfigError {
            flag: "--max-streams-per-connection",
            value: self
                .max_streams_per_connection
                .map_or_else(String::new, |v| v.to_string()),
            allowed,
        })
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        self.connection_limits()?;
        if self.kafka.trim().is_empty() || self.kafka.split(',').any(|s| !s.contains(':')) {
            return Err(ConfigError {
                flag: "--kafka",
                value: format!("{:?}", self.kafka),
                allowed: "host:port[,host:port...]".into(),
            });
        }
        if let Some(id) = &self.instance_id {
            check_name("--instance-id", id)?;
        }
        self.security.validate(self.listen)?;
        self.consul_token()?;
        if let (Some(addr), false) = (
            &self.consul_check_addr,
            self.consul_check == ConsulCheck::Tcp,
        ) {
            return Err(ConfigError {
                flag: "--consul-check-addr",
                value: addr.clone(),
                allowed: "only with --consul-check tcp (the default check, ttl, needs no \
                          address: drop this setting, or add --consul-check tcp)"
                    .into(),
            });
        }
        for (flag, value) in [
            ("--keepalive-interval", self.keepalive_interval),
            ("--keepalive-timeout", self.keepalive_timeout),
        ] {
            if value < Duration::from_secs(1) || value > Duration::from_secs(600) {
                return Err(ConfigError {
                    flag,
                    value: humantime::format_duration(value).to_string(),
                    allowed: "1s ..= 10m".into(),
                });
            }
        }
        if self.shutdown_grace < Duration::from_secs(1)
            || self.shutdown_grace > Duration::from_secs(600)
        {
            return Err(ConfigError {
                flag: "--shutdown-grace",
                value: humantime::format_duration(self.shutdown_grace).to_string(),
                allowed: "1s ..= 10m".into(),
            });
        }
        // Every Consul setting (address, prefix, TTL, lock-delay, renew interval, check) is
        // checked once, by the lock backend's own validation, which also enforces the
        // self-fencing invariant (docs/ARCHITECTURE.md); its verdict is told in flag terms.
        // The listen port does not matter to it.
        let mut listen = self.listen;
        if listen.port() == 0 {
            // Port 0 is chosen at bind time; any real port validates the same.
            listen.set_port(50051);
        }
        self.advertise(listen)?;
        if let Err(err) = self.consul_config("validate", listen).validate() {
            return Err(self.consul_error(err));
        }
        self.kafka_properties()?;
        Ok(())
    }

    /// The librdkafka properties the operator set: those of `--kafka-config-file` (read now),
    /// then those of `--kafka-config`, which override the file's value of the same key; a key
    /// given twice in one place keeps its last value. Refuses a file that cannot be read or
    /// has a line that is not `key=value`, a comment or blank, a flag value that is not
    /// `key=value`, and the keys the gateway sets itself. No error quotes a value.
    pub fn kafka_properties(&self) -> Result<KafkaProperties, ConfigError> {
        let mut properties = KafkaProperties::new();
        if let Some(path) = &self.kafka_config_file {
            let file = path.display().to_string();
            let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
                flag: "--kafka-config-file",
                value: file.clone(),
                allowed: format!("a file the gateway can read ({e}), holding {PROPERTIES_FORMAT}"),
            })?;
            let entries = parse_properties(&text).map_err(|e| ConfigError {
                flag: "--kafka-config-file",
                value: format!("{file} line {}", e.line),
                allowed: format!(
                    "{}; allowed is {PROPERTIES_FORMAT} (the line is not shown: it may hold a \
                     secret)",
                    e.problem
                ),
            })?;
            for (line, key, value) in entries {
                if RESERVED_KAFKA_KEYS.contains(&key.as_str()) {
                    return Err(ConfigError {
                        flag: "--kafka-config-file",
                        value: format!("{file} line {line} ({key})"),
                        allowed: RESERVED_KAFKA_KEYS_ALLOWED.into(),
                    });
                }
                properties.set(key, value);
            }
        }
        for (index, entry) in self.kafka_config.iter().enumerate() {
            let Some((key, value)) = entry.pair() else {
                return Err(ConfigError {
                    flag: "--kafka-config",
                    value: format!("entry {} (the value is not shown)", index + 1),
                    allowed: "key=value; entries are the flag's values and their \
                              comma-separated pieces, in order (KAFKA_LEASE_KAFKA_OPTIONS \
                              splits the same way), so a value holding a comma belongs in \
                              --kafka-config-file"
                        .into(),
                });
            };
            if RESERVED_KAFKA_KEYS.contains(&key) {
                return Err(ConfigError {
                    flag: "--kafka-config",
                    value: key.to_string(),
                    allowed: RESERVED_KAFKA_KEYS_ALLOWED.into(),
                });
            }
            properties.set(key, value);
        }
        Ok(properties)
    }

    /// The Consul ACL token: `--consul-token`, or the contents of `--consul-token-file`.
    /// Errors name the file, never its contents.
    pub fn consul_token(&self) -> Result<Option<String>, ConfigError> {
        let Some(path) = &self.consul_token_file else {
            return Ok(self.consul_token.clone());
        };
        let refused = |allowed: String| ConfigError {
            flag: "--consul-token-file",
            value: path.display().to_string(),
            allowed,
        };
        let text = std::fs::read_to_string(path).map_err(|e| {
            refused(format!(
                "a file the gateway can read ({e}) holding the token"
            ))
        })?;
        let token = text.trim();
        if token.is_empty() {
            return Err(refused(
                "a file holding the token; this one is empty".into(),
            ));
        }
        Ok(Some(token.to_string()))
    }

    /// A Consul setting the lock backend refused, told as the flag that sets it, with the value
    /// as it was given.
    fn consul_error(&self, err: ConsulConfigError) -> ConfigError {
        let given = |d: Duration| humantime::format_duration(d).to_string();
        let (setting, value, allowed) = err.parts();
        let (flag, value) = match setting {
            "address" => ("--consul", value),
            "token" if self.consul_token_file.is_some() => ("--consul-token-file", value),
            "token" => ("--consul-token", value),
            "tls.client_cert" => ("--consul-client-cert", value),
            "prefix" => ("--consul-prefix", value),
            "instance" => ("--instance-id", value),
            "session_ttl" => ("--session-ttl", given(self.session_ttl)),
            "lock_delay" => ("--lock-delay", given(self.lock_delay)),
            "renew_interval" => (
                "--consul-renew-interval",
                self.consul_renew_interval
                    .map_or_else(|| format!("{value} (derived)"), given),
            ),
            "check.tcp_addr" => ("--consul-check-addr", value),
            "check.ttl" => ("--consul-check-ttl", given(self.consul_check_ttl)),
            "advertise" => ("--advertise-addr", value),
            _ => ("--consul-check", format!("{setting} = {value}")),
        };
        ConfigError {
            flag,
            value,
            allowed,
        }
    }

    /// The Consul lock settings for a gateway listening on `bound`.
    pub fn consul_config(&self, instance: &str, bound: SocketAddr) -> ConsulLockConfig {
        let check = match self.consul_check {
            ConsulCheck::Ttl => Some(SessionCheck::ttl(self.consul_check_ttl)),
            ConsulCheck::Tcp => Some(match &self.consul_check_addr {
                Some(addr) => SessionCheck::tcp(addr.clone()),
                None => SessionCheck::for_listener(bound),
            }),
            ConsulCheck::None => None,
        };
        let path = |p: &Option<PathBuf>| p.as_ref().map(|p| p.display().to_string());
        ConsulLockConfig {
            address: self.consul.clone(),
            // An unreadable file was refused by `validate`, which runs first.
            token: self.consul_token().ok().flatten(),
            tls: ConsulTls {
                ca_cert: path(&self.consul_ca_cert),
                client_cert: path(&self.consul_client_cert),
                client_key: path(&self.consul_client_key),
            },
            prefix: self.consul_prefix.trim_matches('/').to_string(),
            instance: instance.to_string(),
            session_ttl: self.session_ttl,
            lock_delay: self.lock_delay,
            renew_interval: self.consul_renew_interval,
            check,
            advertise: self.advertise(bound).ok(),
        }
    }

    /// Where other instances reach a gateway listening on `bound`: `--advertise-addr`, else
    /// the listen address when it is a concrete one.
    pub fn advertise(&self, bound: SocketAddr) -> Result<String, ConfigError> {
        match &self.advertise_addr {
            Some(address) => Ok(address.clone()),
            None if bound.ip().is_unspecified() => Err(ConfigError {
                flag: "--advertise-addr",
                value: "(unset)".into(),
                allowed: format!(
                    "host:port where other gateway instances reach this one; it must be set \
                     because --listen {} is a wildcard address that nobody can dial (in \
                     Kubernetes, the pod IP and port)",
                    self.listen
                ),
            }),
            None => Ok(bound.to_string()),
        }
    }

    /// The instance id: configured, or `<host>-<8 random hex digits>`.
    pub fn instance(&self) -> String {
        self.instance_id.clone().unwrap_or_else(default_instance_id)
    }
}

/// `<host name>-<8 random hex digits>`, with the host name cleaned to `[A-Za-z0-9._-]`.
pub fn default_instance_id() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "gateway".into());
    let host: String = host
        .chars()
        .map(|c| {
            if crate::coordination::is_name_char(c) {
                c
            } else {
                '-'
            }
        })
        .take(100)
        .collect();
    format!("{host}-{:08x}", rand::random::<u32>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, clap::Parser)]
    struct TestCli {
        #[command(flatten)]
        serve: ServeArgs,
    }

    fn serve(args: &[&str]) -> Result<ServeArgs, String> {
        use clap::Parser;
        let mut full = vec!["kafka-lease"];
        full.extend_from_slice(args);
        TestCli::try_parse_from(full)
            .map(|c| c.serve)
            .map_err(|e| e.to_string())
    }

    /// Every flag of `serve` has a row in the configuration table of docs/OPERATIONS.md
    /// that names its environment variable and, where clap has one, its default: the flags
    /// are the one place each default is stated, and the manual is checked against them.
    #[test]
    fn the_operations_manual_lists_every_flag_with_its_env_and_default() {
        use clap::CommandFactory;
        let manual = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/OPERATIONS.md"),
        )
        .expect("docs/OPERATIONS.md");
        let rows: Vec<&str> = manual.lines().filter(|l| l.starts_with("| `--")).collect();
        let command = TestCli::command();
        let mut checked = 0;
        for arg in command.get_arguments() {
            let Some(long) = arg.get_long() else { continue };
            if long == "help" {
                continue;
            }
            let flag = format!("`--{long}`");
            let row = rows
                .iter()
                .find(|row| row.split(" | ").next().is_some_and(|f| f.contains(&flag)))
                .unwrap_or_else(|| panic!("docs/OPERATIONS.md has no row for --{long}"));
            if let Some(env) = arg.get_env() {
                let env = env.to_string_lossy();
                assert!(
                    row.contains(&format!("`{env}`")),
                    "the row of --{long} does not name {env}: {row}"
                );
            }
            let defaults: Vec<String> = arg
                .get_default_values()
                .iter()
                .map(|v| v.to_string_lossy().into_owned())
                .collect();
            if let [default] = defaults.as_slice() {
                let column = row.split(" | ").nth(2).unwrap_or_default();
                assert!(
                    column.contains(&format!("`{default}`")),
                    "the row of --{long} does not give its default {default:?}: {row}"
                );
            }
            checked += 1;
        }
        assert!(checked >= 40, "only {checked} flags checked");
    }

    #[test]
    fn defaults_are_the_documented_ones() {
        let s = serve(&["--kafka", "127.0.0.1:9092"]).expect("parse");
        assert_eq!(s.listen.to_string(), "127.0.0.1:50051");
        assert_eq!(s.consul_prefix, "kafka-lease");
        assert_eq!(s.session_ttl, Duration::from_secs(10));
        assert_eq!(s.shutdown_grace, Duration::from_secs(10));
        assert!(s.validate().is_ok());
    }

    #[test]
    fn the_session_check_is_a_ttl_check_the_gateway_passes_unless_told_otherwise() {
        let bound = "127.0.0.1:50051".parse().expect("addr");
        let s = serve(&["--kafka", "k:1"]).expect("parse");
        assert_eq!(s.consul_check, ConsulCheck::Ttl);
        let check = s.consul_config("i", bound).check.expect("a check");
        assert_eq!(check, SessionCheck::ttl(Duration::from_secs(1)));
        assert_eq!(check.pass_interval(), Some(Duration::from_millis(200)));

        let s = serve(&["--kafka", "k:1", "--consul-check-ttl", "2s"]).expect("parse");
        s.validate().expect("valid");
        let check = s.consul_config("i", bound).check.expect("a check");
        assert_eq!(check.pass_interval(), Some(Duration::from_millis(400)));
        let s = serve(&["--kafka", "k:1", "--consul-check-ttl", "100ms"]).expect("parse");
        let err = s.validate().unwrap_err().to_string();
        assert!(
            err.contains("--consul-check-ttl")
                && err.contains("100ms")
                && err.contains("500ms ..= 10s"),
            "{err}"
        );

        // The address is the TCP check's alone: given with the TTL check it is refused,
        // naming what to do, rather than silently ignored.
        let s = serve(&["--kafka", "k:1", "--consul-check-addr", "10.0.0.7:50051"]).expect("parse");
        let err = s.validate().unwrap_err().to_string();
        assert!(
            err.contains("--consul-check-addr") && err.contains("--consul-check tcp"),
            "{err}"
        );
        let s = serve(&[
            "--kafka",
            "k:1",
            "--consul-check",
            "tcp",
            "--consul-check-addr",
            "10.0.0.7:50051",
        ])
        .expect("parse");
        s.validate().expect("valid");
        let check = s.consul_config("i", bound).check.expect("a check");
        assert_eq!(check.tcp_addr(), Some("10.0.0.7:50051"));
        let s = serve(&["--kafka", "k:1", "--consul-check", "none"]).expect("parse");
        assert_eq!(s.consul_config("i", bound).check, None);
    }

    #[test]
    fn bad_values_are_refused_with_the_value_and_range() {
        let s = serve(&["--kafka", "k:1", "--session-ttl", "5s"]).expect("parse");
        let err = s.validate().unwrap_err().to_string();
        assert!(
            err.contains("--session-ttl") && err.contains("5s") && err.contains("10s"),
            "{err}"
        );
        let s = serve(&["--kafka", "k:1", "--consul-prefix", "a/../b"]).expect("parse");
        assert!(s.validate().is_err());
        let s = serve(&["--kafka", "k:1", "--consul", "127.0.0.1:8500"]).expect("parse");
        assert!(s.validate().unwrap_err().to_string().contains("http://"));
        assert!(serve(&["--kafka", "k:1", "--listen", "nope"]).is_err());
        let s = serve(&["--kafka", "k:1", "--kafka-option", "novalue"]).expect("parse");
        let err = s.validate().unwrap_err().to_string();
        assert!(
            err.contains("--kafka-config entry 1") && !err.contains("novalue"),
            "{err}"
        );
        let s = serve(&["--kafka", "k:1", "--keepalive-timeout", "500ms"]).expect("parse");
        let err = s.validate().unwrap_err().to_string();
        assert!(
            err.contains("--keepalive-timeout")
                && err.contains("500ms")
                && err.contains("1s ..= 10m"),
            "{err}"
        );
    }

    #[test]
    fn the_consul_token_comes_from_its_file_and_errors_never_show_it() {
        let dir =
            std::env::temp_dir().join(format!("kafka-lease-token-{:016x}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).expect("dir");
        let file = dir.join("token");
        std::fs::write(&file, "  s3cr3t-token\n").expect("write");
        let path = file.display().to_string();
        let s = serve(&["--kafka", "k:1", "--consul-token-file", &path]).expect("parse");
        assert!(s.validate().is_ok());
        assert_eq!(
            s.consul_token().expect("read").as_deref(),
            Some("s3cr3t-token")
        );
        assert_eq!(
            s.consul_config("i", "127.0.0.1:1".parse().expect("addr"))
                .token
                .as_deref(),
            Some("s3cr3t-token")
        );
        std::fs::write(&file, "\n").expect("write");
        let err = s.validate().unwrap_err().to_string();
        assert!(
            err.contains("--consul-token-file") && err.contains("empty"),
            "{err}"
        );
        let missing = dir.join("missing").display().to_string();
        let s = serve(&["--kafka", "k:1", "--consul-token-file", &missing]).expect("parse");
        let err = s.validate().unwrap_err().to_string();
        assert!(err.contains(&missing), "{err}");
        // Both at once is refused by the parser; a CA needs an https:// address.
        assert!(serve(&[
            "--kafka",
            "k:1",
            "--consul-token",
            "t",
            "--consul-token-file",
            &path
        ])
        .is_err());
        let s = serve(&["--kafka", "k:1", "--consul-ca-cert", "ca.pem"]).expect("parse");
        let err = s.validate().unwrap_err().to_string();
        assert!(
            err.contains("--consul") && err.contains("https://"),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn plaintext_leaves_loopback_only_when_asked_and_tls_needs_a_peer_ca() {
        let s = serve(&["--kafka", "k:1", "--listen", "10.0.0.7:50051"]).expect("parse");
        let err = s.validate().unwrap_err().to_string();
        assert!(
            err.contains("--listen")
                && err.contains("10.0.0.7:50051")
                && err.contains("--plaintext"),
            "{err}"
        );
        let s = serve(&[
            "--kafka",
            "k:1",
            "--listen",
            "10.0.0.7:50051",
            "--plaintext",
        ])
        .expect("parse");
        assert!(s.validate().is_ok());
        let tls = ["--tls-cert", "c.pem", "--tls-key", "k.pem"];
        let mut args = vec!["--kafka", "k:1", "--listen", "10.0.0.7:50051"];
        args.extend(tls);
        let err = serve(&args)
            .expect("parse")
            .validate()
            .unwrap_err()
            .to_string();
        assert!(err.contains("--tls-peer-ca"), "{err}");
        args.extend(["--tls-client-ca", "ca.pem"]);
        assert!(serve(&args).expect("parse").validate().is_ok());
        // Plaintext and TLS at once, or half a key pair, are refused by the parser.
        assert!(serve(&[
            "--kafka",
            "k:1",
            "--tls-cert",
            "c",
            "--tls-key",
            "k",
            "--plaintext"
        ])
        .is_err());
        assert!(serve(&["--kafka", "k:1", "--tls-cert", "c"]).is_err());
        assert!(serve(&["--kafka", "k:1", "--tls-client-ca", "ca"]).is_err());
        let s = serve(&["--kafka", "k:1", "--reflection", "false"]).expect("parse");
        assert!(!s.security.reflection);
    }

    #[test]
    fn the_advertised_address_is_the_listen_address_unless_that_is_a_wildcard() {
        let bound: SocketAddr = "10.0.0.7:41234".parse().expect("addr");
        let s = serve(&["--kafka", "k:1", "--listen", "10.0.0.7:0"]).expect("parse");
        assert_eq!(s.advertise(bound).expect("concrete"), "10.0.0.7:41234");
        assert_eq!(
            s.consul_config("i", bound).advertise.as_deref(),
            Some("10.0.0.7:41234")
        );

        let s =
            serve(&["--kafka", "k:1", "--listen", "0.0.0.0:50051", "--plaintext"]).expect("parse");
        let err = s.validate().unwrap_err().to_string();
        assert!(
            err.contains("--advertise-addr") && err.contains("0.0.0.0:50051"),
            "{err}"
        );
        let s = serve(&["--kafka", "k:1", "--listen", "[::]:50051", "--plaintext"]).expect("parse");
        assert!(s.validate().is_err());

        let s = serve(&[
            "--kafka",
            "k:1",
            "--listen",
            "0.0.0.0:50051",
            "--advertise-addr",
            "gw-1.kafka-lease:50051",
            "--plaintext",
        ])
        .expect("parse");
        assert!(s.validate().is_ok());
        assert_eq!(s.advertise(bound).expect("given"), "gw-1.kafka-lease:50051");

        for bad in ["no-port", "host:0", "host:x", ":50051", "a/b:1"] {
            let s = serve(&["--kafka", "k:1", "--advertise-addr", bad]).expect("parse");
            let err = s.validate().unwrap_err().to_string();
            assert!(
                err.contains("--advertise-addr") && err.contains(bad),
                "{bad}: {err}"
            );
        }
    }

    /// A properties file of its own for one test, removed when dropped.
    struct TempFile(std::path::PathBuf);

    impl TempFile {
        fn new(text: &str) -> Self {
            let path = std::env::temp_dir().join(format!(
                "kafka-lease-config-test-{}-{:016x}.properties",
                std::process::id(),
                rand::random::<u64>()
            ));
            std::fs::write(&path, text).expect("write the properties file");
            TempFile(path)
        }

        fn path(&self) -> &str {
            self.0.to_str().expect("utf-8 temp path")
        }
    }

    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    #[test]
    fn kafka_config_flags_override_the_file_and_the_old_name_still_works() {
        let file = TempFile::new(
            "# credentials\n\
             security.protocol = sasl_ssl\n\
             sasl.username=from-file\n\
             sasl.password = S3cr3t=with#chars\n",
        );
        let s = serve(&[
            "--kafka",
            "k:1",
            "--kafka-config-file",
            file.path(),
            "--kafka-config",
            "sasl.username=from-flag",
            "--kafka-option",
            "sasl.mechanism=SCRAM-SHA-256,client.rack=r1",
        ])
        .expect("parse");
        assert!(s.validate().is_ok());
        let properties = s.kafka_properties().expect("properties");
        let all: Vec<_> = properties.iter().collect();
        assert_eq!(
            all,
            vec![
                ("security.protocol", "sasl_ssl"),
                ("sasl.username", "from-flag"),
                ("sasl.password", "S3cr3t=with#chars"),
                ("sasl.mechanism", "SCRAM-SHA-256"),
                ("client.rack", "r1"),
            ]
        );
        let debug = format!("{s:?} {properties:?}");
        assert!(!debug.contains("S3cr3t"), "{debug}");
    }

    #[test]
    fn kafka_config_values_are_never_quoted_in_errors_or_debug() {
        let s = serve(&[
            "--kafka",
            "k:1",
            "--kafka-config",
            "client.rack=r1",
            // A password holding a comma: split in two, the second piece is not key=value.
            "--kafka-config",
            "sasl.password=S3cr3t,tail-S3cr3t",
        ])
        .expect("parse: values are checked later, never by clap");
        let err = s.validate().unwrap_err().to_string();
        assert!(err.contains("--kafka-config entry 3"), "{err}");
        assert!(err.contains("--kafka-config-file"), "{err}");
        assert!(!err.contains("S3cr3t"), "{err}");
        let debug = format!("{s:?}");
        assert!(debug.contains("sasl.password=<value not shown>"), "{debug}");
        assert!(!debug.contains("S3cr3t"), "{debug}");
    }

    #[test]
    fn keys_the_gateway_sets_are_refused_from_flags_and_from_the_file() {
        for key in ["group.id", "enable.auto.commit", "bootstrap.servers"] {
            let s =
                serve(&["--kafka", "k:1", "--kafka-config", &format!("{key}=x")]).expect("parse");
            let err = s.validate().unwrap_err().to_string();
            assert!(err.contains("--kafka-config") && err.contains(key), "{err}");

            let file = TempFile::new(&format!("a.b=1\n\n{key} = S3cr3t\n"));
            let s = serve(&["--kafka", "k:1", "--kafka-config-file", file.path()]).expect("parse");
            let err = s.validate().unwrap_err().to_string();
            assert!(
                err.contains("--kafka-config-file")
                    && err.contains(&format!("{} line 3 ({key})", file.path())),
                "{err}"
            );
            assert!(!err.contains("S3cr3t"), "{err}");
        }
    }

    #[test]
    fn a_bad_properties_file_is_refused_naming_the_file_and_line_but_no_value() {
        let file = TempFile::new("# ok\nsasl.username=u\nS3cr3t-on-a-line-of-its-own\n");
        let s = serve(&["--kafka", "k:1", "--kafka-config-file", file.path()]).expect("parse");
        let err = s.validate().unwrap_err().to_string();
        assert!(
            err.contains(&format!("--kafka-config-file {} line 3", file.path())),
            "{err}"
        );
        assert!(
            err.contains("key=value") && err.contains('#') && err.contains('!'),
            "names what is allowed: {err}"
        );
        assert!(!err.contains("S3cr3t"), "{err}");

        let missing = std::env::temp_dir().join("kafka-lease-no-such-file.properties");
        let missing = missing.to_str().expect("utf-8");
        let s = serve(&["--kafka", "k:1", "--kafka-config-file", missing]).expect("parse");
        let err = s.validate().unwrap_err().to_string();
        assert!(
            err.contains("--kafka-config-file")
                && err.contains(missing)
                && err.contains("key=value"),
            "{err}"
        );
    }
}
