//! `tail`'s flags: where to start, how to print, how many, how long to wait, and their
//! parsers (each refusal names the value and what is allowed).

use std::time::{Duration, SystemTime};

use clap::{Args, ValueEnum};
use kafka_lease_client::SeekTo;

use super::super::leases::{parse_group, parse_topic};
use super::super::ConnectArgs;

/// How `tail` prints records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum TailFormat {
    /// One tab-separated line per record: partition, offset, timestamp, key, value, headers.
    Text,
    /// One JSON object per line.
    Json,
}

/// Where `tail` starts reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StartAt {
    /// The group's committed offset (else the earliest): where the lease starts anyway.
    Committed,
    /// The oldest retained record.
    Earliest,
    /// The high watermark: only records produced from now on.
    Latest,
    /// This offset.
    Offset(i64),
    /// The first record at or after this time.
    Time(SystemTime),
}

impl StartAt {
    /// The seek that gets there; `None` for where the lease starts.
    pub(super) fn seek(self) -> Option<SeekTo> {
        match self {
            StartAt::Committed => None,
            StartAt::Earliest => Some(SeekTo::Earliest),
            StartAt::Latest => Some(SeekTo::Latest),
            StartAt::Offset(offset) => Some(SeekTo::Offset(offset)),
            StartAt::Time(time) => Some(SeekTo::Timestamp(time)),
        }
    }
}

pub(super) const FROM_ALLOWED: &str =
    "allowed: earliest, latest, committed, an offset (0 or more), or an \
                            RFC 3339 time such as 2026-01-02T15:04:05Z or \
                            2026-01-02T16:04:05.5+01:00";

/// `--from`.
pub(super) fn parse_from(value: &str) -> Result<StartAt, String> {
    match value {
        "committed" => return Ok(StartAt::Committed),
        "earliest" => return Ok(StartAt::Earliest),
        "latest" => return Ok(StartAt::Latest),
        _ => {}
    }
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        return value
            .parse::<i64>()
            .map(StartAt::Offset)
            .map_err(|_| format!("offset {value} is too large; {FROM_ALLOWED}"));
    }
    parse_rfc3339(value)
        .map(StartAt::Time)
        .ok_or_else(|| format!("{value:?} is not a position; {FROM_ALLOWED}"))
}

/// An RFC 3339 time with its zone: `Z` or `±hh:mm` (`T` or a space between date and time,
/// any number of fractional digits).
pub(super) fn parse_rfc3339(value: &str) -> Option<SystemTime> {
    let upper = value.to_ascii_uppercase();
    if let Some(utc) = upper.strip_suffix('Z') {
        return humantime::parse_rfc3339_weak(utc).ok();
    }
    // `±hh:mm` at the end.
    let split = upper.len().checked_sub(6)?;
    let (local, zone) = (upper.get(..split)?, upper.get(split..)?.as_bytes());
    let sign = match zone[0] {
        b'+' => 1i64,
        b'-' => -1,
        _ => return None,
    };
    let digit = |b: u8| b.is_ascii_digit().then(|| i64::from(b - b'0'));
    if zone[3] != b':' {
        return None;
    }
    let hours = digit(zone[1])? * 10 + digit(zone[2])?;
    let minutes = digit(zone[4])? * 10 + digit(zone[5])?;
    if hours > 23 || minutes > 59 {
        return None;
    }
    let offset = Duration::from_secs(u64::try_from((hours * 60 + minutes) * 60).ok()?);
    let as_if_utc = humantime::parse_rfc3339_weak(local).ok()?;
    // Local time = UTC + offset, so UTC = local time - offset.
    if sign > 0 {
        as_if_utc.checked_sub(offset)
    } else {
        as_if_utc.checked_add(offset)
    }
}

/// `--member`: the gateway's own rule (at most 256 UTF-8 bytes).
pub(super) fn parse_member(value: &str) -> Result<String, String> {
    kafka_lease_server::validate::member(value)
        .map(|()| value.to_string())
        .map_err(|e| e.to_string())
}

/// `--max-records`: 1 or more.
pub(super) fn parse_max_records(value: &str) -> Result<u64, String> {
    match value.parse::<u64>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!(
            "{value:?} is not a record count; allowed: 1 or more"
        )),
    }
}

/// `--wait`: a duration up to the gateway's limit for an Acquire's wait, 5 minutes.
pub(super) fn parse_wait(value: &str) -> Result<Duration, String> {
    let wait = humantime::parse_duration(value)
        .map_err(|e| format!("{value:?} is not a duration like 10s, 500ms or 2m ({e})"))?;
    if wait > Duration::from_secs(300) {
        return Err(format!("{value} is too long; allowed 0s ..= 5m"));
    }
    Ok(wait)
}

#[derive(Debug, Clone, Args)]
pub(crate) struct TailArgs {
    #[command(flatten)]
    pub(crate) connect: ConnectArgs,
    /// The consumer group to lease the partition for.
    #[arg(long, value_name = "GROUP", value_parser = parse_group)]
    pub(crate) group: String,
    /// The topic to read.
    #[arg(long, value_name = "TOPIC", value_parser = parse_topic)]
    pub(crate) topic: String,
    /// The partition to lease; without it, any free one.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(i32).range(0..))]
    pub(crate) partition: Option<i32>,
    /// Where to start: `earliest`, `latest`, `committed` (the group's committed offset, else
    /// the earliest), an offset, or an RFC 3339 time (the first record at or after it).
    #[arg(long, value_name = "POSITION", default_value = "committed", value_parser = parse_from)]
    pub(crate) from: StartAt,
    /// Stop after printing this many records in all (exit status 0).
    #[arg(long, value_name = "N", value_parser = parse_max_records)]
    pub(crate) max_records: Option<u64>,
    /// Stop at the end of the partition, like kcat -e (exit status 0): once the records
    /// printed reach the high watermark the gateway sent with their batch; at once if the
    /// start is at or past the high watermark Acquire reported. Records produced meanwhile
    /// are printed while the Read has not caught up with them.
    #[arg(long, short = 'e')]
    pub(crate) exit_at_end: bool,
    /// On exit (--max-records, --exit-at-end, SIGINT, SIGTERM, an error), commit the offset
    /// after the last record printed, before releasing the lease.
    #[arg(long)]
    pub(crate) commit_on_exit: bool,
    /// How to print records.
    #[arg(long, value_enum, default_value = "text")]
    pub(crate) format: TailFormat,
    /// The member label the lease shows in `leases` (default `kafka-lease-tail@<host>:<pid>`).
    #[arg(long, value_name = "NAME", value_parser = parse_member)]
    pub(crate) member: Option<String>,
    /// How long to wait for the partition (or any partition) to become free.
    #[arg(long, value_name = "DURATION", default_value = "0s", value_parser = parse_wait)]
    pub(crate) wait: Duration,
    /// Print nothing on stderr but errors: no lease line, no progress, no summary.
    #[arg(long, short)]
    pub(crate) quiet: bool,
}

/// `kafka-lease-tail@<host>:<pid>`.
pub(super) fn default_member() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into());
    let member = format!("kafka-lease-tail@{host}:{}", std::process::id());
    // The label is free text of at most 256 bytes; a host name is far shorter.
    member.chars().take(200).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    #[test]
    fn from_takes_keywords_offsets_and_times() {
        assert_eq!(parse_from("committed"), Ok(StartAt::Committed));
        assert_eq!(parse_from("earliest"), Ok(StartAt::Earliest));
        assert_eq!(parse_from("latest"), Ok(StartAt::Latest));
        assert_eq!(parse_from("0"), Ok(StartAt::Offset(0)));
        assert_eq!(parse_from("42"), Ok(StartAt::Offset(42)));
        let at = |secs: u64, millis: u64| {
            StartAt::Time(UNIX_EPOCH + Duration::from_millis(secs * 1000 + millis))
        };
        assert_eq!(parse_from("2023-11-14T22:13:20Z"), Ok(at(1_700_000_000, 0)));
        assert_eq!(
            parse_from("2023-11-14t22:13:20.25z"),
            Ok(at(1_700_000_000, 250))
        );
        assert_eq!(
            parse_from("2023-11-14T23:13:20.5+01:00"),
            Ok(at(1_700_000_000, 500))
        );
        assert_eq!(
            parse_from("2023-11-14T20:43:20-01:30"),
            Ok(at(1_700_000_000, 0))
        );
        for bad in [
            "",
            "-1",
            "99999999999999999999",
            "first",
            "2023-11-14",
            "2023-11-14T22:13:20",
            "2023-11-14T22:13:20+1:00",
            "2023-11-14T22:13:20+24:00",
        ] {
            let err = parse_from(bad).expect_err(bad);
            assert!(err.contains("allowed: earliest, latest"), "{bad}: {err}");
        }
    }

    #[test]
    fn max_records_is_one_or_more() {
        assert_eq!(parse_max_records("1"), Ok(1));
        for bad in ["0", "-3", "many", ""] {
            assert!(parse_max_records(bad).is_err_and(|e| e.contains("allowed: 1 or more")));
        }
    }

    #[test]
    fn wait_is_bounded_by_the_gateway_limit() {
        assert_eq!(parse_wait("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_wait("5m"), Ok(Duration::from_secs(300)));
        assert!(parse_wait("6m").is_err_and(|e| e.contains("0s ..= 5m")));
        assert!(parse_wait("soon").is_err());
    }

    #[test]
    fn the_default_member_names_the_tool() {
        let member = default_member();
        assert!(member.starts_with("kafka-lease-tail@"), "{member}");
        assert!(parse_member(&member).is_ok());
    }
}
