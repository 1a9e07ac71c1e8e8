//! The command-line flags of `serve` and `dev` as clap parses them (each with its
//! `KAFKA_LEASE_*` environment variable), and the parsers of their values.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};

use crate::gateway::Limits;
use crate::kafka::{DEFAULT_MAX_GROUPS, DEFAULT_QUEUE_KBYTES};

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
    #[arg(long, env = "KAFKA_LEASE_FETCH_QUEUE_KBYTES", default_value_t = DEFAULT_QUEUE_KBYTES,
          value_parser = clap::value_parser!(u32).range(64..=1_048_576))]
    pub fetch_queue_kbytes: u32,
    /// Most leases this instance serves at once; an Acquire past it is RESOURCE_EXHAUSTED.
    #[arg(long, env = "KAFKA_LEASE_MAX_LEASES", default_value_t = Limits::DEFAULT.max_leases as u32,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_leases: u32,
    /// Most Acquires waiting for a partition on this instance at once.
    #[arg(long, env = "KAFKA_LEASE_MAX_WAITING_ACQUIRES", default_value_t = Limits::DEFAULT.max_waiting_acquires as u32,
          value_parser = clap::value_parser!(u32).range(0..=1_000_000))]
    pub max_waiting_acquires: u32,
    /// Most leases (and Acquires in progress) one client connection may have on this instance
    /// at once; an Acquire past it is RESOURCE_EXHAUSTED.
    #[arg(long, env = "KAFKA_LEASE_MAX_LEASES_PER_CONNECTION", default_value_t = Limits::DEFAULT.max_leases_per_connection as u32,
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
    #[arg(long, env = "KAFKA_LEASE_MAX_GROUPS", default_value_t = DEFAULT_MAX_GROUPS as u32,
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

/// A flag's value that is not a duration.
#[derive(Debug, thiserror::Error)]
#[error("{value:?} is not a duration like 10s, 500ms or 2m ({source})")]
pub(super) struct NotADuration {
    value: String,
    #[source]
    source: humantime::DurationError,
}

fn parse_duration(value: &str) -> Result<Duration, NotADuration> {
    humantime::parse_duration(value).map_err(|source| NotADuration {
        value: value.to_string(),
        source,
    })
}

/// One `--kafka-config` value as given (one comma-separated piece of it), checked only by
/// [`ServeArgs::kafka_properties`]: a parse error would make clap quote the value, which may
/// be a secret. Its `Debug` shows the key alone.
#[derive(Clone, PartialEq, Eq)]
pub struct KafkaConfigEntry(String);

impl KafkaConfigEntry {
    /// `(key, value)`, trimmed, or `None` when it is not `key=value` with a key.
    pub(super) fn pair(&self) -> Option<(&str, &str)> {
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

/// `--kafka-config`'s value parser (never refuses: see [`KafkaConfigEntry`]).
pub fn kafka_config_entry(value: &str) -> Result<KafkaConfigEntry, std::convert::Infallible> {
    Ok(KafkaConfigEntry(value.to_string()))
}
