//! Checks of every request field against the API contract, turning raw protobuf values into
//! typed, in-range values. A failed check names the field, the offending value and what is
//! allowed; nothing has happened yet when it fails.

use std::time::Duration;

use crate::coordination::LockKey;
use crate::error::LeaseError;

/// The longest group id and topic name Kafka accepts.
pub const MAX_NAME_LEN: usize = 249;
/// The longest `member` label, in UTF-8 bytes.
pub const MAX_MEMBER_BYTES: usize = 256;
/// Kafka's default `offset.metadata.max.bytes`: the longest metadata a broker stores with a
/// committed offset. A longer one is refused by the broker (OFFSET_METADATA_TOO_LARGE).
pub const KAFKA_METADATA_LIMIT: usize = 4096;
/// The longest prefix the gateway puts before the client's metadata:
/// `kafka-lease token=<u64>;` with the token at its longest (20 digits).
pub const METADATA_PREFIX_MAX: usize = "kafka-lease token=".len() + 20 + 1;
/// The longest commit metadata a client may pass, in UTF-8 bytes: what fits beside the
/// prefix within Kafka's default limit, so a valid commit is never refused by the broker.
pub const MAX_METADATA_BYTES: usize = KAFKA_METADATA_LIMIT - METADATA_PREFIX_MAX;

pub const DEFAULT_TTL: Duration = Duration::from_secs(10);
pub const MIN_TTL: Duration = Duration::from_secs(1);
pub const MAX_TTL: Duration = Duration::from_secs(300);
pub const MAX_WAIT: Duration = Duration::from_secs(300);

pub const DEFAULT_MAX_RECORDS: u32 = 500;
pub const MAX_MAX_RECORDS: u32 = 10_000;
pub const DEFAULT_MAX_BYTES: u32 = 1024 * 1024;
pub const MAX_MAX_BYTES: u32 = 4 * 1024 * 1024;
pub const DEFAULT_MAX_WAIT: Duration = Duration::from_millis(100);
pub const MAX_MAX_WAIT: Duration = Duration::from_secs(10);

fn invalid(field: &'static str, message: String) -> LeaseError {
    LeaseError::InvalidArgument { field, message }
}

/// Shows a user-supplied string safely inside an error message: quoted, escaped, and cut
/// after 64 characters so a megabyte of garbage does not come back in the status.
pub fn shown(value: &str) -> String {
    let mut out: String = value.chars().take(64).collect();
    if value.chars().count() > 64 {
        out.push('…');
    }
    format!("{out:?}")
}

fn kafka_name(field: &'static str, kind: &str, value: &str) -> Result<(), LeaseError> {
    if value.is_empty() {
        return Err(invalid(
            field,
            format!(
                "{field} is empty; a {kind} is 1..={MAX_NAME_LEN} characters of [A-Za-z0-9._-]"
            ),
        ));
    }
    let len = value.chars().count();
    if len > MAX_NAME_LEN {
        return Err(invalid(
            field,
            format!(
                "{field} {} is {len} characters long; a {kind} is at most {MAX_NAME_LEN}",
                shown(value)
            ),
        ));
    }
    if let Some(bad) = value
        .chars()
        .find(|&c| !crate::coordination::is_name_char(c))
    {
        return Err(invalid(
            field,
            format!(
                "{field} {} contains {bad:?}; a {kind} may contain only [A-Za-z0-9._-]",
                shown(value)
            ),
        ));
    }
    Ok(())
}

/// A Kafka consumer-group id: 1..=249 characters of `[A-Za-z0-9._-]`. Also keeps Consul key
/// paths safe: no `/`, and `.`/`..` are refused so no path segment can climb.
pub fn group(value: &str) -> Result<(), LeaseError> {
    kafka_name("group", "group id", value)?;
    if value == "." || value == ".." {
        return Err(invalid(
            "group",
            format!("group {} is not allowed", shown(value)),
        ));
    }
    Ok(())
}

/// A Kafka topic name: 1..=249 characters of `[A-Za-z0-9._-]`, not `.` or `..`.
pub fn topic(value: &str) -> Result<(), LeaseError> {
    topic_field("topic", value)
}

/// A topic name in request field `field` (the rules of [`topic`]).
pub fn topic_field(field: &'static str, value: &str) -> Result<(), LeaseError> {
    kafka_name(field, "topic name", value)?;
    if value == "." || value == ".." {
        return Err(invalid(
            field,
            format!("{field} {} is not allowed", shown(value)),
        ));
    }
    Ok(())
}

pub fn member(value: &str) -> Result<(), LeaseError> {
    if value.len() > MAX_MEMBER_BYTES {
        return Err(invalid(
            "member",
            format!(
                "member {} is {} bytes long; at most {MAX_MEMBER_BYTES} UTF-8 bytes are allowed",
                shown(value),
                value.len()
            ),
        ));
    }
    Ok(())
}

/// The longest member id of a subscription.
pub const MAX_MEMBER_ID_CHARS: usize = 128;

/// A subscription's member id: empty (the gateway makes one up), or 1 ..= 128 characters of
/// `[A-Za-z0-9._-]` (it is part of a Consul key).
pub fn member_id(value: &str) -> Result<(), LeaseError> {
    let ok =
        value.len() <= MAX_MEMBER_ID_CHARS && value.chars().all(crate::coordination::is_name_char);
    if ok {
        Ok(())
    } else {
        Err(invalid(
            "member_id",
            format!(
                "member_id {} is not allowed; allowed: empty, or 1 ..= {MAX_MEMBER_ID_CHARS} \
                 characters of [A-Za-z0-9._-]",
                shown(value)
            ),
        ))
    }
}

pub fn metadata(value: &str) -> Result<(), LeaseError> {
    if value.len() > MAX_METADATA_BYTES {
        return Err(invalid(
            "metadata",
            format!(
                "metadata is {} bytes long; at most {MAX_METADATA_BYTES} UTF-8 bytes are allowed \
                 (Kafka stores at most {KAFKA_METADATA_LIMIT}, and the gateway's token prefix \
                 takes up to {METADATA_PREFIX_MAX})",
                value.len()
            ),
        ));
    }
    Ok(())
}

pub fn partition(value: Option<i32>) -> Result<Option<i32>, LeaseError> {
    match value {
        Some(p) if p < 0 => Err(invalid(
            "partition",
            format!("partition {p} is negative; partitions are numbered from 0"),
        )),
        other => Ok(other),
    }
}

/// A protobuf Duration as a request names it in JSON (grpcurl, any JSON client): `"-5s"`,
/// `"1.500s"`. One whose fields disagree in sign, or whose nanos reach a second, has no such
/// form and is shown as its two fields.
pub fn shown_duration(value: &prost_types::Duration) -> String {
    let (seconds, nanos) = (value.seconds, value.nanos);
    if malformed(value) {
        return format!("{{seconds: {seconds}, nanos: {nanos}}}");
    }
    let sign = if seconds < 0 || nanos < 0 { "-" } else { "" };
    let (seconds, nanos) = (seconds.unsigned_abs(), nanos.unsigned_abs());
    seconds_text(sign, seconds, nanos)
}

/// Whether a protobuf Duration breaks its own rules: seconds and nanos of different signs,
/// or nanos of a second or more.
fn malformed(value: &prost_types::Duration) -> bool {
    value.nanos.unsigned_abs() >= 1_000_000_000
        || (value.seconds > 0 && value.nanos < 0)
        || (value.seconds < 0 && value.nanos > 0)
}

/// A std Duration in the same form as [`shown_duration`].
fn shown_std(value: Duration) -> String {
    seconds_text("", value.as_secs(), value.subsec_nanos())
}

/// `<sign><seconds>[.<fraction>]s`, the fraction in 3, 6 or 9 digits as protobuf's JSON
/// mapping writes it.
fn seconds_text(sign: &str, seconds: u64, nanos: u32) -> String {
    match nanos {
        0 => format!("{sign}{seconds}s"),
        n if n.is_multiple_of(1_000_000) => format!("{sign}{seconds}.{:03}s", n / 1_000_000),
        n if n.is_multiple_of(1_000) => format!("{sign}{seconds}.{:06}s", n / 1_000),
        n => format!("{sign}{seconds}.{n:09}s"),
    }
}

/// A duration field with its default (when unset) and inclusive range. A refusal names the
/// value as the request gave it, the range and the default.
pub fn duration_in(
    field: &'static str,
    value: Option<&prost_types::Duration>,
    default: Duration,
    min: Duration,
    max: Duration,
) -> Result<Duration, LeaseError> {
    let Some(d) = value else { return Ok(default) };
    let allowed = format!(
        "allowed {} ..= {}{}, {} when unset",
        shown_std(min),
        shown_std(max),
        in_minutes(max),
        shown_std(default)
    );
    let shown = shown_duration(d);
    if malformed(d) {
        return Err(invalid(
            field,
            format!(
                "{field} {shown} is malformed (seconds and nanos must have the same sign, \
                 nanos below a second); {allowed}"
            ),
        ));
    }
    if d.seconds < 0 || d.nanos < 0 {
        return Err(invalid(
            field,
            format!("{field} {shown} is negative; {allowed}"),
        ));
    }
    let d_std = Duration::new(d.seconds.unsigned_abs(), d.nanos.unsigned_abs());
    if d_std < min || d_std > max {
        return Err(invalid(
            field,
            format!("{field} {shown} is out of range; {allowed}"),
        ));
    }
    Ok(d_std)
}

/// ` (5 min)` for a whole number of minutes, so a limit in seconds reads at a glance.
fn in_minutes(d: Duration) -> String {
    if d.as_secs() >= 120 && d.as_secs().is_multiple_of(60) && d.subsec_nanos() == 0 {
        format!(" ({} min)", d.as_secs() / 60)
    } else {
        String::new()
    }
}

/// A count field where 0 means "the default", with an inclusive maximum.
pub fn count_in(
    field: &'static str,
    value: u32,
    default: u32,
    max: u32,
) -> Result<u32, LeaseError> {
    match value {
        0 => Ok(default),
        v if v > max => Err(invalid(
            field,
            format!("{field} {v} is too large; allowed 1 ..= {max} (0 means {default})"),
        )),
        v => Ok(v),
    }
}

/// Queue mode's limits (DeliverRequest, Acknowledge).
pub const DEFAULT_MAX_IN_FLIGHT: u32 = 64;
pub const MAX_MAX_IN_FLIGHT: u32 = 10_000;
pub const DEFAULT_MAX_IN_FLIGHT_BYTES: u32 = 4 * 1024 * 1024;
pub const MAX_MAX_IN_FLIGHT_BYTES: u32 = 64 * 1024 * 1024;
pub const DEFAULT_ACK_DEADLINE: Duration = Duration::from_secs(30);
pub const MIN_ACK_DEADLINE: Duration = Duration::from_secs(1);
pub const MAX_ACK_DEADLINE: Duration = Duration::from_secs(3600);
pub const DEFAULT_MAX_DELIVERIES: u32 = 5;
pub const MAX_MAX_DELIVERIES: u32 = 100;
pub const MAX_RETRY_DELAY: Duration = Duration::from_secs(3600);
pub const MAX_REASON_BYTES: usize = 1024;
pub const MAX_ACKNOWLEDGEMENTS: usize = 10_000;

/// ListLeases' `page_size`: 0 means the default.
pub const DEFAULT_PAGE_SIZE: u32 = 1_000;
pub const MAX_PAGE_SIZE: u32 = 5_000;

/// ListLeases' `page_token`: empty (the first page) or the key a previous page ended at,
/// `<group>/<topic>/<partition>`.
pub fn page_token(value: &str) -> Result<Option<LockKey>, LeaseError> {
    if value.is_empty() {
        return Ok(None);
    }
    let parsed = {
        let mut parts = value.split('/');
        match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some(g), Some(t), Some(p), None)
                if group(g).is_ok() && topic(t).is_ok() && p.parse::<i32>().is_ok() =>
            {
                p.parse().ok().map(|p| LockKey::new(g, t, p))
            }
            _ => None,
        }
    };
    parsed.map(Some).ok_or_else(|| {
        invalid(
            "page_token",
            format!(
                "page_token {} is not a token ListLeases returned; pass a next_page_token \
                 unchanged, or none for the first page",
                shown(value)
            ),
        )
    })
}

/// The `page_token` that continues after `key`.
pub fn page_token_after(key: &LockKey) -> String {
    format!("{}/{}/{}", key.group, key.topic, key.partition)
}

/// A lease id must at least look like one before it is looked up.
pub fn lease_id(value: &str) -> Result<(), LeaseError> {
    if value.is_empty() {
        return Err(invalid(
            "lease_id",
            "lease_id is empty; pass the id Acquire returned".into(),
        ));
    }
    // 16 + 1 + 32 hex digits, `~` and an instance id of at most 128 characters.
    if value.len() > 200 {
        return Err(invalid(
            "lease_id",
            format!("lease_id {} is not a lease id (too long)", shown(value)),
        ));
    }
    Ok(())
}

/// A protobuf Timestamp as milliseconds since the Unix epoch.
pub fn timestamp_ms(
    field: &'static str,
    value: &prost_types::Timestamp,
) -> Result<i64, LeaseError> {
    if value.nanos < 0 || value.nanos >= 1_000_000_000 || value.seconds < 0 {
        return Err(invalid(
            field,
            format!(
                "{field} {}s{}ns is before 1970 or malformed",
                value.seconds, value.nanos
            ),
        ));
    }
    value
        .seconds
        .checked_mul(1000)
        .and_then(|ms| ms.checked_add(i64::from(value.nanos / 1_000_000)))
        .ok_or_else(|| {
            invalid(
                field,
                format!("{field} {}s is too far in the future", value.seconds),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_metadata_fits_kafkas_limit_with_the_longest_prefix() {
        let user = "m".repeat(MAX_METADATA_BYTES);
        assert!(metadata(&user).is_ok());
        let stored = format!("kafka-lease token={};{user}", u64::MAX);
        assert_eq!(stored.len(), KAFKA_METADATA_LIMIT);
        let err = metadata(&format!("{user}m")).unwrap_err().to_string();
        assert!(err.contains("4058 bytes") && err.contains("4057"), "{err}");
    }

    #[test]
    fn names_follow_kafka_rules() {
        for ok in ["a", "orders", "my.group_1-x", &"x".repeat(249)] {
            assert!(group(ok).is_ok(), "{ok}");
            assert!(topic(ok).is_ok(), "{ok}");
        }
        for bad in ["", "a/b", "..", ".", "ü", "a b", &"x".repeat(250), "a\0b"] {
            assert!(group(bad).is_err(), "{bad:?}");
            assert!(topic(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn errors_name_the_value_and_the_rule() {
        let LeaseError::InvalidArgument { field, message } = topic("a/b").unwrap_err() else {
            panic!("wrong variant");
        };
        assert_eq!(field, "topic");
        assert!(
            message.contains("\"a/b\"") && message.contains("[A-Za-z0-9._-]"),
            "{message}"
        );
        let LeaseError::InvalidArgument { message, .. } = group(&"g".repeat(250)).unwrap_err()
        else {
            panic!("wrong variant");
        };
        assert!(
            message.contains("250 characters") && message.contains("249"),
            "{message}"
        );
    }

    #[test]
    fn durations_have_defaults_and_ranges() {
        let d = |s: i64, n: i32| prost_types::Duration {
            seconds: s,
            nanos: n,
        };
        assert_eq!(
            duration_in("ttl", None, DEFAULT_TTL, MIN_TTL, MAX_TTL).ok(),
            Some(DEFAULT_TTL)
        );
        assert!(duration_in(
            "ttl",
            Some(&d(0, 999_000_000)),
            DEFAULT_TTL,
            MIN_TTL,
            MAX_TTL
        )
        .is_err());
        assert!(duration_in("ttl", Some(&d(301, 0)), DEFAULT_TTL, MIN_TTL, MAX_TTL).is_err());
        assert!(duration_in("ttl", Some(&d(-1, 0)), DEFAULT_TTL, MIN_TTL, MAX_TTL).is_err());
        assert_eq!(
            duration_in("ttl", Some(&d(300, 0)), DEFAULT_TTL, MIN_TTL, MAX_TTL).ok(),
            Some(MAX_TTL)
        );
    }

    fn duration_message(
        field: &'static str,
        seconds: i64,
        nanos: i32,
        (default, min, max): (Duration, Duration, Duration),
    ) -> String {
        let value = prost_types::Duration { seconds, nanos };
        match duration_in(field, Some(&value), default, min, max) {
            Err(LeaseError::InvalidArgument { field: f, message }) => {
                assert_eq!(f, field);
                message
            }
            other => panic!("{field} {seconds}s {nanos}ns: {other:?}"),
        }
    }

    #[test]
    fn duration_errors_name_the_value_as_sent_and_the_range() {
        // Every duration field of the API, with its default and range from the proto.
        let ttl = (DEFAULT_TTL, MIN_TTL, MAX_TTL);
        let wait = (Duration::ZERO, Duration::ZERO, MAX_WAIT);
        let max_wait = (DEFAULT_MAX_WAIT, Duration::ZERO, MAX_MAX_WAIT);
        let revoke_grace = (
            Duration::from_secs(5),
            Duration::ZERO,
            Duration::from_secs(60),
        );
        let session_grace = (Duration::ZERO, Duration::ZERO, Duration::from_secs(300));
        let cases = [
            (
                duration_message("ttl", -5, 0, ttl),
                "ttl -5s is negative; allowed 1s ..= 300s (5 min), 10s when unset",
            ),
            (
                duration_message("ttl", 0, 999_000_000, ttl),
                "ttl 0.999s is out of range; allowed 1s ..= 300s (5 min), 10s when unset",
            ),
            (
                duration_message("ttl", 301, 0, ttl),
                "ttl 301s is out of range; allowed 1s ..= 300s (5 min), 10s when unset",
            ),
            (
                duration_message("ttl", 1, -5, ttl),
                "ttl {seconds: 1, nanos: -5} is malformed (seconds and nanos must have the \
                 same sign, nanos below a second); allowed 1s ..= 300s (5 min), 10s when unset",
            ),
            (
                duration_message("wait", 0, -500_000_000, wait),
                "wait -0.500s is negative; allowed 0s ..= 300s (5 min), 0s when unset",
            ),
            (
                duration_message("wait", 300, 1, wait),
                "wait 300.000000001s is out of range; allowed 0s ..= 300s (5 min), 0s when unset",
            ),
            (
                duration_message("max_wait", -1, -250_000, max_wait),
                "max_wait -1.000250s is negative; allowed 0s ..= 10s, 0.100s when unset",
            ),
            (
                duration_message("max_wait", 0, 1_000_000_000, max_wait),
                "max_wait {seconds: 0, nanos: 1000000000} is malformed (seconds and nanos must \
                 have the same sign, nanos below a second); allowed 0s ..= 10s, 0.100s when unset",
            ),
            (
                duration_message("revoke_grace", 61, 0, revoke_grace),
                "revoke_grace 61s is out of range; allowed 0s ..= 60s, 5s when unset",
            ),
            (
                duration_message("session_grace", -300, 0, session_grace),
                "session_grace -300s is negative; allowed 0s ..= 300s (5 min), 0s when unset",
            ),
        ];
        for (got, want) in cases {
            assert_eq!(got, want);
        }
    }

    #[test]
    fn durations_are_shown_as_json_writes_them() {
        let d = |seconds, nanos| shown_duration(&prost_types::Duration { seconds, nanos });
        assert_eq!(d(0, 0), "0s");
        assert_eq!(d(-5, 0), "-5s");
        assert_eq!(d(1, 500_000_000), "1.500s");
        assert_eq!(d(0, -1_000), "-0.000001s");
        assert_eq!(d(0, 7), "0.000000007s");
        assert_eq!(d(i64::MIN, 0), "-9223372036854775808s");
        assert_eq!(d(-1, 5), "{seconds: -1, nanos: 5}");
    }

    #[test]
    fn counts_default_on_zero_and_cap() {
        assert_eq!(count_in("max_records", 0, 500, 10_000).ok(), Some(500));
        assert_eq!(
            count_in("max_records", 10_000, 500, 10_000).ok(),
            Some(10_000)
        );
        assert!(count_in("max_records", 10_001, 500, 10_000).is_err());
    }

    #[test]
    fn member_and_partition_limits() {
        assert!(member(&"m".repeat(256)).is_ok());
        assert!(member(&"m".repeat(257)).is_err());
        assert!(partition(Some(-1)).is_err());
        assert_eq!(partition(Some(0)).ok(), Some(Some(0)));
    }
}
