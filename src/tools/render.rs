//! How the tools show records and leases: the text line of a record (with its escaping), its
//! JSON object, and the lease table and JSON array.

use std::fmt::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use kafka_lease_client::proto::TimestampType;
use kafka_lease_client::{LeaseInfo, Record};
use serde::Serialize;

/// What a null (absent) key, value or header value prints as in text.
pub(crate) const NULL: &str = "\\N";

/// The first instant that RFC 3339 cannot show with four year digits (year 10000).
const YEAR_10000: Duration = Duration::from_secs(253_402_300_800);

/// `2026-12-03T08:11:39.917Z` (UTC, milliseconds: Kafka's precision); `None` for a time
/// before 1970 (Kafka's "no timestamp" is -1) or after year 9999.
pub(crate) fn rfc3339(time: SystemTime) -> Option<String> {
    let since_epoch = time.duration_since(UNIX_EPOCH).ok()?;
    (since_epoch < YEAR_10000).then(|| humantime::format_rfc3339_millis(time).to_string())
}

/// Appends `bytes` escaped so the result is one tab-free line of printable text:
///
/// - `\` is written `\\`, tab `\t`, line feed `\n`, carriage return `\r`;
/// - every byte of a control character (U+0000–U+001F, U+007F–U+009F) and every byte that is
///   not part of valid UTF-8 is written `\xHH` (two lowercase hex digits);
/// - so are the ASCII characters in `also` (a header's `,` and `=`);
/// - everything else, valid UTF-8, is written as it is.
///
/// The escaping is reversible; a null field is written [`NULL`] (`\N`), which no escaped
/// field can be.
pub(crate) fn escape_into(out: &mut String, bytes: &[u8], also: &[u8]) {
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '\t' => out.push_str("\\t"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                c if c.is_control() || (c.is_ascii() && also.contains(&(c as u8))) => {
                    let mut buf = [0u8; 4];
                    for b in c.encode_utf8(&mut buf).bytes() {
                        let _ = write!(out, "\\x{b:02x}");
                    }
                }
                c => out.push(c),
            }
        }
        for b in chunk.invalid() {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
}

/// `bytes` escaped as [`escape_into`] does, or [`NULL`].
fn field(out: &mut String, bytes: Option<&[u8]>, also: &[u8]) {
    match bytes {
        None => out.push_str(NULL),
        Some(bytes) => escape_into(out, bytes, also),
    }
}

/// One record as a line of text, tab-separated, with its line feed:
///
/// `partition  offset  timestamp  key  value  headers`
///
/// The timestamp is RFC 3339 in UTC with milliseconds (`-` when the record has none); key
/// and value are escaped as [`escape_into`] says, `\N` when null; headers are
/// `name=value` pairs separated by `,` (`,` and `=` inside a name, and `,` inside a value,
/// escaped as `\x2c` and `\x3d`), the field empty when there are none.
pub(crate) fn record_text(out: &mut String, partition: i32, record: &Record) {
    let _ = write!(out, "{partition}\t{}\t", record.offset);
    match rfc3339(record.timestamp) {
        Some(time) => out.push_str(&time),
        None => out.push('-'),
    }
    out.push('\t');
    field(out, record.key.as_deref(), b"");
    out.push('\t');
    field(out, record.value.as_deref(), b"");
    out.push('\t');
    for (i, (name, value)) in record.headers.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        escape_into(out, name.as_bytes(), b",=");
        out.push('=');
        field(out, value.as_deref(), b",");
    }
    out.push('\n');
}

/// Bytes in JSON: the UTF-8 text when they are valid UTF-8, else base64 (standard alphabet,
/// padded) with the encoding named beside it.
fn json_bytes(bytes: Option<&[u8]>) -> (Option<String>, Option<&'static str>) {
    match bytes {
        None => (None, None),
        Some(bytes) => match std::str::from_utf8(bytes) {
            Ok(text) => (Some(text.to_string()), None),
            Err(_) => (
                Some(base64::engine::general_purpose::STANDARD.encode(bytes)),
                Some("base64"),
            ),
        },
    }
}

#[derive(Serialize)]
struct JsonHeader {
    key: String,
    value: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    value_encoding: Option<&'static str>,
}

#[derive(Serialize)]
struct JsonRecord<'a> {
    topic: &'a str,
    partition: i32,
    offset: i64,
    timestamp: Option<String>,
    timestamp_type: Option<&'static str>,
    key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    key_encoding: Option<&'static str>,
    value: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    value_encoding: Option<&'static str>,
    headers: Vec<JsonHeader>,
}

/// One record as one line of JSON, with its line feed:
///
/// `{"topic":…,"partition":…,"offset":…,"timestamp":"<RFC 3339>"|null,
/// "timestamp_type":"create_time"|"log_append_time"|null,"key":…,"value":…,
/// "headers":[{"key":…,"value":…}]}`
///
/// Key, value and header values are strings when they are valid UTF-8, `null` when null,
/// and otherwise base64 with `"key_encoding"`, `"value_encoding"` or the header's
/// `"value_encoding"` set to `"base64"` (the field is left out for UTF-8).
pub(crate) fn record_json(out: &mut String, topic: &str, partition: i32, record: &Record) {
    let (key, key_encoding) = json_bytes(record.key.as_deref());
    let (value, value_encoding) = json_bytes(record.value.as_deref());
    let json = JsonRecord {
        topic,
        partition,
        offset: record.offset,
        timestamp: rfc3339(record.timestamp),
        timestamp_type: match record.timestamp_type {
            TimestampType::CreateTime => Some("create_time"),
            TimestampType::LogAppendTime => Some("log_append_time"),
            TimestampType::Unspecified => None,
        },
        key,
        key_encoding,
        value,
        value_encoding,
        headers: record
            .headers
            .iter()
            .map(|(name, value)| {
                let (value, value_encoding) = json_bytes(value.as_deref());
                JsonHeader {
                    key: name.clone(),
                    value,
                    value_encoding,
                }
            })
            .collect(),
    };
    // Serializing plain strings and numbers cannot fail.
    if let Ok(line) = serde_json::to_string(&json) {
        out.push_str(&line);
        out.push('\n');
    }
}

/// Seconds from `now` until `at`, negative once it has passed, in milliseconds' precision.
fn seconds_until(at: SystemTime, now: SystemTime) -> f64 {
    let millis = match at.duration_since(now) {
        Ok(ahead) => ahead.as_millis() as f64,
        Err(behind) => -(behind.duration().as_millis() as f64),
    };
    millis / 1000.0
}

#[derive(Serialize)]
struct JsonLease<'a> {
    group: &'a str,
    topic: &'a str,
    partition: i32,
    member: &'a str,
    member_id: Option<&'a str>,
    gateway: &'a str,
    gateway_address: Option<&'a str>,
    fencing_token: u64,
    acquired_at: Option<String>,
    expires_at: Option<String>,
    expires_in_seconds: Option<f64>,
    position: Option<i64>,
    committed_offset: Option<i64>,
    high_watermark: Option<i64>,
    lag: Option<i64>,
    read_lag: Option<i64>,
    details_unavailable: Option<&'a str>,
    /// Queue mode's deliveries, for a lease in queue mode.
    queue: Option<JsonQueue<'a>>,
}

#[derive(Serialize)]
struct JsonQueue<'a> {
    ordering: &'static str,
    in_flight: u32,
    oldest_in_flight_seconds: Option<f64>,
    waiting: u32,
    deliveries: u64,
    redeliveries: u64,
    dead_letters: u64,
    dead_letter_topic: &'a str,
    progress_age_seconds: Option<f64>,
    done_not_committed: u64,
}

fn ordering_name(ordering: kafka_lease_client::Ordering) -> &'static str {
    match ordering {
        kafka_lease_client::Ordering::Partition => "partition",
        kafka_lease_client::Ordering::Key => "key",
        kafka_lease_client::Ordering::Unordered => "unordered",
    }
}

/// A queue-mode lease's deliveries in a few words, for the table's NOTE column.
fn queue_note(queue: &kafka_lease_client::QueueInfo) -> String {
    let mut note = format!(
        "queue ({} order): {} in flight",
        ordering_name(queue.ordering),
        queue.in_flight
    );
    if let Some(oldest) = queue.oldest_in_flight {
        note.push_str(&format!(" (oldest {}s)", oldest.as_secs()));
    }
    note.push_str(&format!(
        ", {} waiting, {} redelivered, {} dead letters",
        queue.waiting, queue.redeliveries, queue.dead_letters
    ));
    if queue.done_not_committed > 0 {
        note.push_str(&format!(
            ", {} done not committed",
            queue.done_not_committed
        ));
        if let Some(age) = queue.progress_age {
            note.push_str(&format!(" (last commit {}s ago)", age.as_secs()));
        }
    }
    note
}

/// The leases as one JSON array (pretty-printed), with its line feed: each lease an object
/// of the fields [`JsonLease`] names, unknown values `null`, `expires_in_seconds` relative to
/// `now` (negative once passed).
pub(crate) fn leases_json(leases: &[LeaseInfo], now: SystemTime) -> String {
    let rows: Vec<JsonLease<'_>> = leases
        .iter()
        .map(|l| JsonLease {
            group: &l.group,
            topic: &l.topic,
            partition: l.partition,
            member: &l.member,
            member_id: l.member_id.as_deref(),
            gateway: &l.gateway,
            gateway_address: l.gateway_address.as_deref(),
            fencing_token: l.fencing_token,
            acquired_at: Some(l.acquired_at)
                .filter(|t| *t != UNIX_EPOCH)
                .and_then(rfc3339),
            expires_at: l.expires_at.and_then(rfc3339),
            expires_in_seconds: l.expires_at.map(|at| seconds_until(at, now)),
            position: l.position,
            committed_offset: l.committed_offset,
            high_watermark: l.high_watermark,
            lag: l.lag,
            read_lag: l.read_lag,
            details_unavailable: l.details_unavailable.as_deref(),
            queue: l.queue.as_ref().map(|q| JsonQueue {
                ordering: ordering_name(q.ordering),
                in_flight: q.in_flight,
                oldest_in_flight_seconds: q.oldest_in_flight.map(|d| d.as_secs_f64()),
                waiting: q.waiting,
                deliveries: q.deliveries,
                redeliveries: q.redeliveries,
                dead_letters: q.dead_letters,
                dead_letter_topic: &q.dead_letter_topic,
                progress_age_seconds: q.progress_age.map(|d| d.as_secs_f64()),
                done_not_committed: q.done_not_committed,
            }),
        })
        .collect();
    let mut text = serde_json::to_string_pretty(&rows).unwrap_or_else(|_| "[]".into());
    text.push('\n');
    text
}

/// Free text for a table cell: escaped as [`escape_into`], `-` when empty.
fn cell(text: &str) -> String {
    if text.is_empty() {
        return "-".into();
    }
    let mut out = String::new();
    escape_into(&mut out, text.as_bytes(), b"");
    out
}

fn number_cell(value: Option<i64>) -> String {
    value.map_or_else(|| "-".into(), |v| v.to_string())
}

/// The table's header names; the numeric columns are right-aligned.
const COLUMNS: [(&str, bool); 12] = [
    ("GROUP", false),
    ("TOPIC", false),
    ("PARTITION", true),
    ("MEMBER", false),
    ("GATEWAY", false),
    ("TOKEN", true),
    ("POSITION", true),
    ("COMMITTED", true),
    ("LAG", true),
    ("READ LAG", true),
    ("EXPIRES IN", true),
    ("NOTE", false),
];

/// The leases as a table for people, with a header line; columns separated by two spaces,
/// `-` where a value is unknown, expiry in whole seconds from `now` (`expired` once passed),
/// the member's label (else its subscription member id), and in NOTE why the live details
/// are missing, when they are.
pub(crate) fn leases_table(leases: &[LeaseInfo], now: SystemTime) -> String {
    let rows: Vec<[String; 12]> = leases
        .iter()
        .map(|l| {
            let member = if l.member.is_empty() {
                l.member_id.clone().unwrap_or_default()
            } else {
                l.member.clone()
            };
            let expires = match l.expires_at {
                None => "-".to_string(),
                Some(at) => match at.duration_since(now) {
                    Ok(ahead) => format!("{}s", ahead.as_secs()),
                    Err(_) => "expired".to_string(),
                },
            };
            [
                cell(&l.group),
                cell(&l.topic),
                l.partition.to_string(),
                cell(&member),
                cell(&l.gateway),
                l.fencing_token.to_string(),
                number_cell(l.position),
                number_cell(l.committed_offset),
                number_cell(l.lag),
                number_cell(l.read_lag),
                expires,
                match (&l.details_unavailable, &l.queue) {
                    (Some(why), _) => cell(why),
                    (None, Some(queue)) => queue_note(queue),
                    (None, None) => String::new(),
                },
            ]
        })
        .collect();
    table(&COLUMNS, &rows)
}

/// Rows as a table for people: a header line of `columns` (name, right-aligned), each column
/// padded to its widest cell, columns separated by two spaces, no space at a line's end.
pub(crate) fn table<R: AsRef<[String]>>(columns: &[(&str, bool)], rows: &[R]) -> String {
    let mut widths: Vec<usize> = columns
        .iter()
        .map(|(name, _)| name.chars().count())
        .collect();
    for row in rows {
        for (width, value) in widths.iter_mut().zip(row.as_ref()) {
            *width = (*width).max(value.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |values: &mut dyn Iterator<Item = &str>| {
        let mut text = String::new();
        for (i, value) in values.enumerate() {
            let (_, right) = columns[i];
            let pad = widths[i].saturating_sub(value.chars().count());
            if i > 0 {
                text.push_str("  ");
            }
            if right {
                text.extend(std::iter::repeat_n(' ', pad));
                text.push_str(value);
            } else {
                text.push_str(value);
                text.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(&mut columns.iter().map(|(name, _)| *name));
    for row in rows {
        line(&mut row.as_ref().iter().map(String::as_str));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn escaped(bytes: &[u8]) -> String {
        let mut out = String::new();
        escape_into(&mut out, bytes, b"");
        out
    }

    #[test]
    fn text_escaping_keeps_each_record_on_one_line_and_is_reversible() {
        assert_eq!(escaped(b"plain text, = ok"), "plain text, = ok");
        assert_eq!(escaped("grüße ✓".as_bytes()), "grüße ✓");
        assert_eq!(escaped(b"a\tb\nc\rd\\e"), "a\\tb\\nc\\rd\\\\e");
        assert_eq!(escaped(b"\x00\x1b[31m\x7f"), "\\x00\\x1b[31m\\x7f");
        assert_eq!(escaped(&[0xff, b'a', 0xc3]), "\\xffa\\xc3");
        // A C1 control character, valid UTF-8: its two bytes.
        assert_eq!(escaped("\u{85}".as_bytes()), "\\xc2\\x85");
        // A literal \N is not the null marker.
        assert_eq!(escaped(b"\\N"), "\\\\N");
    }

    fn record() -> Record {
        Record::from(kafka_lease_client::proto::KafkaRecord {
            offset: 42,
            key: Some(kafka_lease_client::Bytes::from_static(b"k 1")),
            value: Some(kafka_lease_client::Bytes::from_static(&[0x00, 0xff, b'x'])),
            headers: vec![
                kafka_lease_client::proto::KafkaHeader {
                    key: "trace,id=".into(),
                    value: Some(kafka_lease_client::Bytes::from_static(b"a,b=c")),
                },
                kafka_lease_client::proto::KafkaHeader {
                    key: "empty".into(),
                    value: Some(kafka_lease_client::Bytes::new()),
                },
                kafka_lease_client::proto::KafkaHeader {
                    key: "null".into(),
                    value: None,
                },
            ],
            timestamp: Some(prost_types_timestamp(1_700_000_000, 123_000_000)),
            timestamp_type: TimestampType::CreateTime as i32,
        })
    }

    fn prost_types_timestamp(seconds: i64, nanos: i32) -> prost_types::Timestamp {
        prost_types::Timestamp { seconds, nanos }
    }

    #[test]
    fn a_record_as_text() {
        let mut out = String::new();
        record_text(&mut out, 3, &record());
        assert_eq!(
            out,
            "3\t42\t2023-11-14T22:13:20.123Z\tk 1\t\\x00\\xffx\t\
             trace\\x2cid\\x3d=a\\x2cb=c,empty=,null=\\N\n"
        );
        let mut bare = record();
        bare.key = None;
        bare.value = None;
        bare.headers.clear();
        bare.timestamp = UNIX_EPOCH - Duration::from_millis(1);
        let mut out = String::new();
        record_text(&mut out, 0, &bare);
        assert_eq!(out, "0\t42\t-\t\\N\t\\N\t\n");
    }

    #[test]
    fn a_record_as_json() {
        let mut out = String::new();
        record_json(&mut out, "t", 3, &record());
        assert!(out.ends_with('\n') && out.lines().count() == 1, "{out}");
        let v: serde_json::Value = serde_json::from_str(&out).expect("json");
        assert_eq!(v["topic"], "t");
        assert_eq!(v["partition"], 3);
        assert_eq!(v["offset"], 42);
        assert_eq!(v["timestamp"], "2023-11-14T22:13:20.123Z");
        assert_eq!(v["timestamp_type"], "create_time");
        assert_eq!(v["key"], "k 1");
        assert!(v.get("key_encoding").is_none());
        assert_eq!(v["value"], "AP94");
        assert_eq!(v["value_encoding"], "base64");
        assert_eq!(v["headers"][0]["key"], "trace,id=");
        assert_eq!(v["headers"][0]["value"], "a,b=c");
        assert_eq!(v["headers"][1]["value"], "");
        assert_eq!(v["headers"][2]["value"], serde_json::Value::Null);
    }

    fn lease(member: &str, details: Option<&str>) -> LeaseInfo {
        LeaseInfo::from(kafka_lease_client::proto::LeaseInfo {
            group: "g".into(),
            topic: "orders".into(),
            partition: 11,
            member: member.into(),
            fencing_token: 1234,
            acquired_at: Some(prost_types_timestamp(1_700_000_000, 0)),
            expires_at: Some(prost_types_timestamp(1_700_000_030, 0)),
            gateway: "gw-a".into(),
            position: details.is_none().then_some(5),
            committed_offset: details.is_none().then_some(3),
            high_watermark: details.is_none().then_some(9),
            lag: details.is_none().then_some(6),
            read_lag: details.is_none().then_some(4),
            details_unavailable: details.unwrap_or_default().into(),
            gateway_address: "10.0.0.7:50051".into(),
            member_id: String::new(),
            queue: details
                .is_none()
                .then(|| kafka_lease_client::proto::QueueInfo {
                    ordering: kafka_lease_client::proto::DeliveryOrder::Key as i32,
                    in_flight: 3,
                    oldest_in_flight: Some(prost_types::Duration {
                        seconds: 12,
                        nanos: 0,
                    }),
                    waiting: 40,
                    deliveries: 90,
                    redeliveries: 5,
                    dead_letters: 1,
                    dead_letter_topic: "dlq.g.orders".into(),
                    progress_age: Some(prost_types::Duration {
                        seconds: 7,
                        nanos: 0,
                    }),
                    done_not_committed: 120,
                }),
        })
    }

    #[test]
    fn leases_as_a_table() {
        let now = UNIX_EPOCH + Duration::from_millis(1_700_000_009_500);
        let table = leases_table(
            &[
                lease("worker\n1", None),
                lease("", Some("gw-b did not answer")),
            ],
            now,
        );
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 3, "{table}");
        assert_eq!(
            lines[0],
            "GROUP  TOPIC   PARTITION  MEMBER     GATEWAY  TOKEN  POSITION  COMMITTED  LAG  \
             READ LAG  EXPIRES IN  NOTE"
        );
        assert!(
            lines[1].starts_with(concat!(
                "g      orders         11  worker\\n1  gw-a      1234         5          3",
                "    6         4         20s  "
            )),
            "{table}"
        );
        assert!(
            lines[1].ends_with(
                "queue (key order): 3 in flight (oldest 12s), 40 waiting, 5 redelivered, \
                 1 dead letters, 120 done not committed (last commit 7s ago)"
            ),
            "{table}"
        );
        assert!(
            lines[2].ends_with("-          -    -         -         20s  gw-b did not answer"),
            "{table}"
        );
        let expired = leases_table(&[lease("m", None)], now + Duration::from_secs(60));
        assert!(expired
            .lines()
            .nth(1)
            .is_some_and(|l| l.contains(" expired  queue")));
        assert_eq!(leases_table(&[], now).lines().count(), 1);
    }

    #[test]
    fn leases_as_json() {
        let now = UNIX_EPOCH + Duration::from_millis(1_700_000_009_500);
        let text = leases_json(&[lease("worker-1", None)], now);
        let v: serde_json::Value = serde_json::from_str(&text).expect("json");
        let row = &v[0];
        assert_eq!(row["member"], "worker-1");
        assert_eq!(row["member_id"], serde_json::Value::Null);
        assert_eq!(row["fencing_token"], 1234);
        assert_eq!(row["gateway"], "gw-a");
        assert_eq!(row["gateway_address"], "10.0.0.7:50051");
        assert_eq!(row["acquired_at"], "2023-11-14T22:13:20.000Z");
        assert_eq!(row["expires_at"], "2023-11-14T22:13:50.000Z");
        assert_eq!(row["expires_in_seconds"], 20.5);
        assert_eq!(row["position"], 5);
        assert_eq!(row["committed_offset"], 3);
        assert_eq!(row["lag"], 6);
        assert_eq!(row["read_lag"], 4);
        assert_eq!(row["details_unavailable"], serde_json::Value::Null);
        assert_eq!(row["queue"]["ordering"], "key");
        assert_eq!(row["queue"]["in_flight"], 3);
        assert_eq!(row["queue"]["oldest_in_flight_seconds"], 12.0);
        assert_eq!(row["queue"]["redeliveries"], 5);
        assert_eq!(row["queue"]["dead_letter_topic"], "dlq.g.orders");
        assert_eq!(row["queue"]["progress_age_seconds"], 7.0);
        assert_eq!(row["queue"]["done_not_committed"], 120);
        assert_eq!(leases_json(&[], now), "[]\n");
    }

    #[test]
    fn the_table_pads_columns_and_right_aligns_numbers() {
        let text = table(
            &[("TOPIC", false), ("PARTITIONS", true)],
            &[
                vec!["orders".to_string(), "4".into()],
                vec!["dlq.billing.orders".to_string(), "12".into()],
            ],
        );
        assert_eq!(
            text,
            "TOPIC               PARTITIONS\n\
             orders                       4\n\
             dlq.billing.orders          12\n"
        );
    }
}
