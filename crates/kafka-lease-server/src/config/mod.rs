//! Command-line and environment configuration, validated before anything is bound or
//! connected. Every flag of `serve` has a `KAFKA_LEASE_*` environment variable (a unit
//! test checks it, and that docs/OPERATIONS.md names it).
//!
//! The flags themselves are in `args.rs`; here are their validation, the error that names a
//! refused flag ([`ConfigError`]), and the settings derived from them.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use std::sync::Arc;

use crate::auth::{Auth, AuthFiles};
use crate::coordination::consul::{ConsulConfigError, ConsulLockConfig, ConsulTls, SessionCheck};
use crate::gateway::Limits;
use crate::kafka::settings::{parse_properties, KafkaProperties, PROPERTIES_FORMAT};
use crate::kafka::KafkaSettings;
use crate::server::ServeOptions;
use crate::tls::ServerTls;
use crate::tls::TlsFiles;

mod args;
#[cfg(test)]
mod tests;

pub use args::{
    kafka_config_entry, ConsulCheck, DevArgs, KafkaConfigEntry, LogArgs, LogFormat, SecurityArgs,
    ServeArgs,
};

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
        .map_err(|refused| ConfigError {
            flag: "--max-streams-per-connection",
            value: self
                .max_streams_per_connection
                .map_or_else(String::new, |v| v.to_string()),
            allowed: refused.to_string(),
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
        kafka_properties(self.kafka_config_file.as_deref(), &self.kafka_config)
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

    /// What this instance takes on at most.
    pub fn limits(&self) -> Limits {
        Limits {
            max_leases: self.max_leases as usize,
            max_waiting_acquires: self.max_waiting_acquires as usize,
            max_leases_per_connection: self.max_leases_per_connection as usize,
        }
    }

    /// The settings of instance `instance`'s Kafka clients, with the operator's `properties`
    /// ([`ServeArgs::kafka_properties`], read once).
    pub fn kafka_settings(&self, instance: &str, properties: KafkaProperties) -> KafkaSettings {
        let mut settings = KafkaSettings::new(&self.kafka, instance);
        settings.options = properties;
        settings.queue_kbytes_per_partition = self.fetch_queue_kbytes;
        settings.max_groups = self.max_groups as usize;
        settings
    }

    /// How the server runs, with its transport security and its identities and policy.
    pub fn serve_options(
        &self,
        tls: Option<Arc<ServerTls>>,
        auth: Arc<Auth>,
    ) -> Result<ServeOptions, ConfigError> {
        Ok(ServeOptions {
            grace: self.shutdown_grace,
            connection_limits: self.connection_limits()?,
            keepalive_interval: self.keepalive_interval,
            keepalive_timeout: self.keepalive_timeout,
            tls,
            auth,
            reflection: self.security.reflection,
        })
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

/// The librdkafka properties of `--kafka-config-file` (read now) and `--kafka-config` (which
/// override the file's value of the same key), as [`ServeArgs::kafka_properties`] takes
/// them; also for the tools that talk to Kafka themselves (`kafka-lease topics`).
pub fn kafka_properties(
    kafka_config_file: Option<&std::path::Path>,
    kafka_config: &[KafkaConfigEntry],
) -> Result<KafkaProperties, ConfigError> {
    let mut properties = KafkaProperties::new();
    if let Some(path) = &kafka_config_file {
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
    for (index, entry) in kafka_config.iter().enumerate() {
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
