//! librdkafka properties given by the operator (`--kafka-config key=value`,
//! `--kafka-config-file`): the properties-file format, one value per key, and the redaction of
//! secret values wherever properties are shown (logs, errors, `Debug`).
//!
//! The rule: a value is never shown when its key [`is_secret`]; where text may quote values
//! that the gateway does not control (librdkafka's error messages), every secret value in it
//! is replaced by [`REDACTED`] ([`KafkaProperties::redact`]).

use std::fmt;

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
