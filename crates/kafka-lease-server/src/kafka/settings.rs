//! How the gateway's librdkafka clients are made: [`KafkaSettings`], the configuration and
//! log context ([`ClientLog`]) of every client, and the operator's properties on top.
//!
//! librdkafka properties given by the operator (`--kafka-config key=value`,
//! `--kafka-config-file`): the properties-file format, one value per key, and the redaction of
//! secret values wherever properties are shown (logs, errors, `Debug`).
//!
//! The rule: a value is never shown when its key [`is_secret`]; where text may quote values
//! that the gateway does not control (librdkafka's error messages), every secret value in it
//! is replaced by [`REDACTED`] ([`KafkaProperties::redact`]).
//!
//! Over 600 lines, a third of them tests: the settings and the operator's properties they
//! carry are kept together, as both decide what a client is given and what is never shown.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::client::ClientContext;
use rdkafka::config::{FromClientConfigAndContext, RDKafkaLogLevel};
use rdkafka::consumer::ConsumerContext;
use rdkafka::error::KafkaError;
use rdkafka::ClientConfig;

use super::errors::unavailable;
use crate::error::LeaseError;

/// The default of [`KafkaSettings::max_groups`].
pub const DEFAULT_MAX_GROUPS: usize = 100;

/// librdkafka's `reconnect.backoff.ms` for the gateway's clients (see `base_config`); the
/// backoff still doubles up to `reconnect.backoff.max.ms` while a broker stays unreachable.
const RECONNECT_BACKOFF_MS: &str = "20";

/// librdkafka's `socket.timeout.ms` for the gateway's clients.
const SOCKET_TIMEOUT_MS: &str = "10000";

/// How long a topic's partition count is reused before it is read from the brokers again
/// (the default of [`KafkaSettings::partition_count_max_age`]). Partitions are only ever
/// added, and a partition past the cached count is read afresh.
pub(super) const PARTITION_COUNT_MAX_AGE: Duration = Duration::from_secs(5);

/// How the gateway talks to Kafka.
#[derive(Clone, Debug)]
pub struct KafkaSettings {
    /// `host:port[,host:port...]`.
    pub bootstrap_servers: String,
    /// The operator's librdkafka properties (`--kafka-config`, `--kafka-config-file`),
    /// applied last. Shown only redacted (secret values as `***`).
    pub options: KafkaProperties,
    /// Most kilobytes librdkafka pre-fetches per leased partition (`queued.max.messages.kbytes`).
    /// This is the per-lease memory bound: a slow client stops the fetching at this point.
    pub queue_kbytes_per_partition: u32,
    /// Deadline for metadata, watermark, offset and commit requests.
    pub request_timeout: Duration,
    /// How long a topic's partition count is reused before it is read again (5 s).
    pub partition_count_max_age: Duration,
    /// Used in `client.id`, so broker logs show which gateway a connection belongs to.
    pub instance: String,
    /// Most consumer groups with a client on this gateway at once (`--max-groups`): each
    /// costs a librdkafka client with its own threads and broker connections.
    pub max_groups: usize,
    /// Look offsets up by time by reading the partition, not by asking the broker: only for
    /// `kafka-lease dev`, whose in-process Kafka (librdkafka's mock cluster) does not
    /// implement the lookup (it answers "no such offset" for every time).
    pub scan_for_timestamps: bool,
    /// The context of every client made with these settings.
    pub(super) log: ClientLog,
}

/// Most kilobytes pre-fetched per leased partition, unless set (`--fetch-queue-kbytes`).
pub const DEFAULT_QUEUE_KBYTES: u32 = 2048;

impl KafkaSettings {
    pub fn new(bootstrap_servers: impl Into<String>, instance: impl Into<String>) -> Self {
        Self {
            bootstrap_servers: bootstrap_servers.into(),
            options: KafkaProperties::new(),
            queue_kbytes_per_partition: DEFAULT_QUEUE_KBYTES,
            request_timeout: Duration::from_secs(5),
            partition_count_max_age: PARTITION_COUNT_MAX_AGE,
            instance: instance.into(),
            max_groups: DEFAULT_MAX_GROUPS,
            scan_for_timestamps: false,
            log: ClientLog::default(),
        }
    }

    pub(super) fn base_config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", &self.bootstrap_servers)
            .set("client.id", format!("kafka-lease-{}", self.instance))
            .set("socket.keepalive.enable", "true")
            // librdkafka's own bound on a request in flight (default 60 s): how long the end
            // of a lease may wait for a commit whose answer is missing (see the commit gate
            // in docs/ARCHITECTURE.md).
            .set("socket.timeout.ms", SOCKET_TIMEOUT_MS)
            // librdkafka backs off reconnects up to 10 s by default: after a broker restart
            // the gateway could then stay cut off for longer than a request's deadline (5 s)
            // and answer UNAVAILABLE to calls a running broker could serve.
            .set("reconnect.backoff.max.ms", "1000")
            // Also the pause between two picks of "any broker" to connect to (half of it,
            // 50 ms by default). A new client connects to the bootstrap address, drops that
            // connection as soon as it learns the broker's id, and its first request (the
            // coordinator lookup of a new group's first Acquire) then waited out the pause
            // before it could connect again: ~50 ms of that Acquire.
            .set("reconnect.backoff.ms", RECONNECT_BACKOFF_MS)
            .set("topic.metadata.refresh.interval.ms", "30000");
        config
    }

    pub(super) fn apply_options(&self, config: &mut ClientConfig) {
        for (key, value) in self.options.iter() {
            config.set(key, value);
        }
    }

    /// Creates a librdkafka client from `config`. A failure never quotes a property's value:
    /// rdkafka's configuration error appends the value it refused (and librdkafka's own text
    /// may quote it), and it may be a secret, possibly under a misspelt key that
    /// [`is_secret`] cannot recognise. So a refused property is named
    /// by its key only, and every secret value of the options is masked in what remains.
    pub(super) fn create<T: FromClientConfigAndContext<ClientLog>>(
        &self,
        config: &ClientConfig,
        operation: &'static str,
    ) -> Result<T, LeaseError> {
        config
            .create_with_context(self.log.clone())
            .map_err(|e| unavailable(operation, self.creation_error(&e)))
    }

    /// [`KafkaSettings::create`]'s error text.
    fn creation_error(&self, err: &KafkaError) -> String {
        let text = match err {
            KafkaError::ClientConfig(_, description, key, _value) => {
                format!("librdkafka refused the property {key:?}: {description}")
            }
            other => other.to_string(),
        };
        self.options.redact(&text)
    }
}

/// How long a librdkafka log line or client error, once logged, is logged again at debug
/// level only (see [`ClientLog`]).
const LOG_REPEATS_QUIET: Duration = Duration::from_secs(60);

/// The context of the gateway's librdkafka clients: forwards librdkafka's log lines and
/// client errors to `tracing` at their level, as rdkafka's default context does (same
/// targets: `librdkafka`, `rdkafka::client`), with two differences:
///
/// - A line said in the last [`LOG_REPEATS_QUIET`] by any client of the same [`Kafka`] is a
///   debug line. While the brokers cannot be reached every client reports the same failure,
///   and the metadata client's queue yields it at each poll: without this a gateway started
///   with Kafka down wrote some twenty identical ERROR lines a second.
/// - Once [`Kafka::close`] is called, every line is a debug line: what clients being torn
///   down at shutdown report (their connections closing, the in-process cluster of
///   `kafka-lease dev` gone first) is not news, and read as a crash.
///
/// [`Kafka`]: super::Kafka
/// [`Kafka::close`]: super::Kafka::close
#[derive(Clone, Debug, Default)]
pub struct ClientLog {
    shared: Arc<ClientLogShared>,
}

#[derive(Debug, Default)]
struct ClientLogShared {
    closing: AtomicBool,
    /// Line (without its varying tail) → when it was last logged at its level.
    said: Mutex<HashMap<String, tokio::time::Instant>>,
}

impl ClientLog {
    /// From now on every line is a debug line.
    pub(super) fn close(&self) {
        self.shared.closing.store(true, Ordering::Relaxed);
    }

    /// Whether `line` is logged at its own level now: not after [`ClientLog::close`], nor
    /// when it was within [`LOG_REPEATS_QUIET`].
    fn news(&self, line: &str) -> bool {
        if self.shared.closing.load(Ordering::Relaxed) {
            return false;
        }
        // librdkafka's tail varies between repeats: "(after 0ms in state CONNECT, 1
        // identical error(s) suppressed)".
        let key = line.split(" (after ").next().unwrap_or(line);
        let now = tokio::time::Instant::now();
        let mut said = self.shared.said.lock().unwrap_or_else(|p| p.into_inner());
        if said.len() >= 1024 {
            said.retain(|_, at| now.duration_since(*at) < LOG_REPEATS_QUIET);
        }
        match said.get(key) {
            Some(at) if now.duration_since(*at) < LOG_REPEATS_QUIET => false,
            _ => {
                said.insert(key.to_string(), now);
                true
            }
        }
    }
}

impl ClientContext for ClientLog {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        use RDKafkaLogLevel as L;
        if matches!(level, L::Debug) || !self.news(&format!("{fac} {log_message}")) {
            tracing::debug!(target: "librdkafka", "librdkafka: {fac} {log_message}");
            return;
        }
        match level {
            L::Emerg | L::Alert | L::Critical | L::Error => {
                tracing::error!(target: "librdkafka", "librdkafka: {fac} {log_message}");
            }
            L::Warning => tracing::warn!(target: "librdkafka", "librdkafka: {fac} {log_message}"),
            L::Notice | L::Info | L::Debug => {
                tracing::info!(target: "librdkafka", "librdkafka: {fac} {log_message}");
            }
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if self.news(&format!("{error}: {reason}")) {
            tracing::error!(target: "rdkafka::client", "librdkafka: {error}: {reason}");
        } else {
            tracing::debug!(target: "rdkafka::client", "librdkafka: {error}: {reason}");
        }
    }
}

impl ConsumerContext for ClientLog {}

/// What a secret value is shown as.
pub const REDACTED: &str = "***";

/// Parts of a property key that mark its value as a credential (compared in lower case):
/// passwords and passphrases (`sasl.password`, `ssl.key.password`, `ssl.keystore.password`,
/// `sasl.oauthbearer.assertion.private.key.passphrase`), client secrets
/// (`sasl.oauthbearer.client.secret`), private keys and key stores (`ssl.key.pem`,
/// `ssl.key.location`, `ssl.keystore.*`, `sasl.oauthbearer.assertion.private.key.*`), and
/// configuration strings that embed credentials (`sasl.jaas.config` as Java clients spell it,
/// `sasl.oauthbearer.config`).
const SECRET_MARKERS: &[&str] = &[
    "password",
    "passphrase",
    "secret",
    "credential",
    "sasl.jaas.config",
    "sasl.oauthbearer.config",
    "ssl.key.",
    "ssl_key",
    "ssl.keystore",
    "private.key",
];

/// Whether the value of the librdkafka property `key` is a secret that must never be shown.
/// Errs on the side of hiding: a key that merely looks like it holds a credential is hidden.
pub fn is_secret(key: &str) -> bool {
    let key = key.trim().to_ascii_lowercase();
    SECRET_MARKERS.iter().any(|marker| key.contains(marker))
}

/// The properties the gateway applies to its librdkafka clients after its own, one value per
/// key, in the order the keys were first given. Its `Debug` hides secret values.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct KafkaProperties {
    entries: Vec<(String, String)>,
}

impl KafkaProperties {
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets `key` to `value`, replacing (in place) a value given before.
    pub fn set(&mut self, key: impl Into<String>, value: impl Into<String>) {
        let (key, value) = (key.into(), value.into());
        match self.entries.iter_mut().find(|(k, _)| *k == key) {
            Some(entry) => entry.1 = value,
            None => self.entries.push((key, value)),
        }
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.entries
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|(k, _)| k.as_str())
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The properties as `key=value, …` for a log line, each secret value shown as
    /// [`REDACTED`]; `(none)` when there are none.
    pub fn redacted(&self) -> Redacted<'_> {
        Redacted(self)
    }

    /// `text` with every secret value of these properties replaced by [`REDACTED`]: for
    /// messages written by others (librdkafka) that may quote a value.
    pub fn redact(&self, text: &str) -> String {
        let mut secrets: Vec<&str> = self
            .entries
            .iter()
            .filter(|(k, v)| is_secret(k) && !v.is_empty())
            .map(|(_, v)| v.as_str())
            .collect();
        // The longest first, so a secret that contains another is replaced whole.
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        let mut text = text.to_string();
        for secret in secrets {
            if text.contains(secret) {
                text = text.replace(secret, REDACTED);
            }
        }
        text
    }
}

impl FromIterator<(String, String)> for KafkaProperties {
    fn from_iter<I: IntoIterator<Item = (String, String)>>(iter: I) -> Self {
        let mut properties = KafkaProperties::new();
        for (k, v) in iter {
            properties.set(k, v);
        }
        properties
    }
}

impl fmt::Debug for KafkaProperties {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(
                self.entries
                    .iter()
                    .map(|(k, v)| (k, if is_secret(k) { REDACTED } else { v.as_str() })),
            )
            .finish()
    }
}

/// [`KafkaProperties::redacted`].
#[derive(Debug)]
pub struct Redacted<'a>(&'a KafkaProperties);

impl fmt::Display for Redacted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("(none)");
        }
        for (i, (key, value)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            let shown = if is_secret(key) { REDACTED } else { value };
            write!(f, "{key}={shown}")?;
        }
        Ok(())
    }
}

/// What the properties-file format allows, for error messages.
pub const PROPERTIES_FORMAT: &str = "a Java-style properties file: `key=value` lines (spaces \
     around the key and the value are trimmed), comments starting with # or !, and blank lines";

/// A line of a properties file that is neither `key=value`, a comment nor blank. It names the
/// line and the problem, never the line's text (which may hold a secret).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {problem}")]
pub struct PropertiesLineError {
    /// 1-based.
    pub line: usize,
    pub problem: &'static str,
}

/// Parses a Java-style properties text as the gateway reads `--kafka-config-file`: each line
/// is `key=value` (split at the first `=`, key and value trimmed), a comment (its first
/// non-blank character is `#` or `!`) or blank. There are no escapes and no continuation
/// lines: a value is taken as written, so a secret needs no quoting. Returns the entries
/// with their 1-based line numbers, in file order (a key given twice keeps both; the caller
/// lets the last win).
pub fn parse_properties(text: &str) -> Result<Vec<(usize, String, String)>, PropertiesLineError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut entries = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let number = index + 1;
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') || trimmed.starts_with('!') {
            continue;
        }
        let Some((key, value)) = trimmed.split_once('=') else {
            return Err(PropertiesLineError {
                line: number,
                problem: "not key=value (no `=`)",
            });
        };
        let key = key.trim();
        if key.is_empty() {
            return Err(PropertiesLineError {
                line: number,
                problem: "the key before `=` is empty",
            });
        }
        if key.chars().any(char::is_whitespace) {
            return Err(PropertiesLineError {
                line: number,
                problem: "the key before `=` contains a space",
            });
        }
        entries.push((number, key.to_string(), value.trim().to_string()));
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kafka::Kafka;
    use rdkafka::types::RDKafkaConfRes;

    fn settings_with(options: &[(&str, &str)]) -> KafkaSettings {
        let mut settings = KafkaSettings::new("127.0.0.1:9", "test");
        for (k, v) in options {
            settings.options.set(*k, *v);
        }
        settings
    }

    fn creation_failure(options: &[(&str, &str)]) -> String {
        match Kafka::new(settings_with(options)) {
            Ok(_) => panic!("{options:?} must be refused"),
            Err(err) => {
                println!("{err}");
                err.to_string()
            }
        }
    }

    #[tokio::test]
    async fn client_creation_errors_never_quote_a_property_value() {
        // A secret under a misspelt key: rdkafka's error appends the value it refused.
        let err = creation_failure(&[("sasl.pasword", "typo-S3cr3t")]);
        assert!(err.contains("sasl.pasword"), "{err}");
        assert!(!err.contains("typo-S3cr3t"), "{err}");
        // librdkafka's own text quotes an invalid value: a secret's is masked.
        let err = creation_failure(&[("sasl.password", "S3cr3t"), ("socket.timeout.ms", "S3cr3t")]);
        assert!(err.contains("socket.timeout.ms"), "{err}");
        assert!(!err.contains("S3cr3t"), "{err}");
        // A private key librdkafka cannot load.
        let err = creation_failure(&[
            ("security.protocol", "ssl"),
            ("ssl.key.pem", "not-a-pem-S3cr3t"),
            ("ssl.key.password", "pw-S3cr3t"),
        ]);
        assert!(!err.contains("S3cr3t"), "{err}");
    }

    #[test]
    fn a_configuration_error_is_told_by_key_with_secret_values_masked() {
        let settings = settings_with(&[("sasl.password", "S3cr3t"), ("client.rack", "r1")]);
        let err = KafkaError::ClientConfig(
            RDKafkaConfRes::RD_KAFKA_CONF_INVALID,
            "Invalid value \"S3cr3t\" for configuration property \"sasl.password\"".into(),
            "sasl.password".into(),
            "S3cr3t".into(),
        );
        let text = settings.creation_error(&err);
        assert!(!text.contains("S3cr3t"), "{text}");
        assert!(
            text.contains("\"sasl.password\"") && text.contains("***"),
            "{text}"
        );
        let err = KafkaError::ClientCreation("failed to load S3cr3t".into());
        assert_eq!(
            settings.creation_error(&err),
            "Client creation error: failed to load ***"
        );
    }

    #[test]
    fn settings_debug_hides_secret_values() {
        let settings = settings_with(&[("sasl.password", "S3cr3t"), ("sasl.username", "svc")]);
        let debug = format!("{settings:?}");
        assert!(!debug.contains("S3cr3t"), "{debug}");
        assert!(debug.contains("svc"), "{debug}");
    }

    #[test]
    fn secret_keys_are_recognised_and_others_are_not() {
        for key in [
            "sasl.password",
            "SASL.PASSWORD",
            " sasl.password ",
            "ssl.key.password",
            "ssl.key.pem",
            "ssl.key.location",
            "ssl.keystore.password",
            "ssl.keystore.location",
            "ssl_key",
            "sasl.jaas.config",
            "sasl.oauthbearer.client.secret",
            "sasl.oauthbearer.config",
            "sasl.oauthbearer.assertion.private.key.pem",
            "sasl.oauthbearer.assertion.private.key.passphrase",
            "some.future.credentials",
        ] {
            assert!(is_secret(key), "{key} must be secret");
        }
        for key in [
            "security.protocol",
            "sasl.mechanism",
            "sasl.mechanisms",
            "sasl.username",
            "ssl.ca.location",
            "ssl.certificate.location",
            "ssl.certificate.pem",
            "ssl.endpoint.identification.algorithm",
            "client.id",
            "socket.timeout.ms",
        ] {
            assert!(!is_secret(key), "{key} is not secret");
        }
    }

    #[test]
    fn redacted_display_and_debug_hide_secret_values_only() {
        let properties: KafkaProperties = [
            ("security.protocol", "sasl_ssl"),
            ("sasl.username", "svc"),
            ("sasl.password", "hunter2"),
            ("ssl.key.pem", "-----BEGIN PRIVATE KEY-----abc"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let shown = properties.redacted().to_string();
        assert_eq!(
            shown,
            "security.protocol=sasl_ssl, sasl.username=svc, sasl.password=***, ssl.key.pem=***"
        );
        let debug = format!("{properties:?}");
        assert!(debug.contains("\"sasl.password\": \"***\""), "{debug}");
        assert!(debug.contains("sasl_ssl"), "{debug}");
        assert!(
            !debug.contains("hunter2") && !debug.contains("BEGIN"),
            "{debug}"
        );
        assert_eq!(KafkaProperties::new().redacted().to_string(), "(none)");
    }

    #[test]
    fn redact_replaces_every_secret_value_in_a_message() {
        let mut properties = KafkaProperties::new();
        properties.set("sasl.password", "pass");
        properties.set("ssl.key.password", "passphrase-longer");
        properties.set("sasl.username", "svc");
        properties.set("sasl.oauthbearer.client.secret", "");
        let message = "Invalid value \"passphrase-longer\" and \"pass\" twice: pass; user svc";
        assert_eq!(
            properties.redact(message),
            "Invalid value \"***\" and \"***\" twice: ***; user svc"
        );
    }

    #[test]
    fn set_replaces_a_value_in_place() {
        let mut properties = KafkaProperties::new();
        properties.set("a", "1");
        properties.set("b", "2");
        properties.set("a", "3");
        let all: Vec<_> = properties.iter().collect();
        assert_eq!(all, vec![("a", "3"), ("b", "2")]);
        assert_eq!(properties.get("a"), Some("3"));
        assert_eq!(properties.len(), 2);
    }

    #[test]
    fn properties_files_take_comments_blank_lines_and_trimmed_pairs() {
        let text = "\u{feff}# a comment\n\
                    ! another comment\n\
                    \n   \t\n\
                    security.protocol = sasl_plaintext\r\n\
                    \tsasl.mechanism=SCRAM-SHA-256   \n\
                    sasl.password = p=a#ss!word with spaces \n\
                    empty.value=\n\
                    security.protocol=sasl_ssl\n";
        let entries = parse_properties(text).expect("valid");
        let want = vec![
            (5, "security.protocol", "sasl_plaintext"),
            (6, "sasl.mechanism", "SCRAM-SHA-256"),
            (7, "sasl.password", "p=a#ss!word with spaces"),
            (8, "empty.value", ""),
            (9, "security.protocol", "sasl_ssl"),
        ];
        let got: Vec<_> = entries
            .iter()
            .map(|(n, k, v)| (*n, k.as_str(), v.as_str()))
            .collect();
        assert_eq!(got, want);
        assert_eq!(parse_properties("").expect("empty file"), vec![]);
    }

    #[test]
    fn bad_properties_lines_are_named_by_number_without_their_text() {
        for (text, line, problem) in [
            ("a=1\nhunter2-without-equals\n", 2, "no `=`"),
            ("# c\n\n = hunter2\n", 3, "empty"),
            ("a=1\nsasl.password hunter2=x\n", 2, "space"),
        ] {
            let err = parse_properties(text).expect_err(text);
            assert_eq!(err.line, line, "{text:?}");
            let shown = err.to_string();
            assert!(shown.contains(&format!("line {line}")), "{shown}");
            assert!(shown.contains(problem), "{shown}");
            assert!(!shown.contains("hunter2"), "{shown}");
        }
    }
}
