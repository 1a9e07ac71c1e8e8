//! The history a run writes: one JSON object per line, in the order the harness saw the events.
//! Times are milliseconds since the run began, on the harness's monotonic clock (one process
//! runs every client, the producer and the nemesis, so one clock orders everything).
//!
//! A call is written once, when it completes, with the time it was invoked (`invoked_ms`) and
//! the time it completed (`t_ms`), so a checker can order two calls in real time: call A
//! happened before call B when A completed before B was invoked.

use serde::{Deserialize, Serialize};

/// A `LeaseEnded` reason: the client went quiet on purpose, for the gateway to end the lease
/// by its TTL.
pub const ABANDONED: &str = "abandoned";
/// A `LeaseEnded` reason: the client stalled past its TTL on purpose.
pub const STALLED: &str = "stalled past its TTL";
/// A `LeaseEnded` reason: the Subscribe member left the group (its stream ended).
pub const MEMBER_LEFT: &str = "the member left";

/// One line of the history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// When the event completed (ms since the run began).
    pub t_ms: f64,
    /// Who: `producer`, `client-3` (Acquire and Read), `member-1` (Subscribe), `queue-2`
    /// (Acquire and Deliver), `nemesis`, `observer`.
    pub process: String,
    #[serde(flatten)]
    pub op: Op,
}

/// How a call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// It took effect.
    Ok,
    /// It did not take effect (an error that says so: refused, not found, fenced).
    Failed,
    /// It may or may not have taken effect (a timeout, a broken connection).
    Unknown,
}

/// What happened.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum Op {
    /// The producer's write was acknowledged by the cluster (acks=all).
    Produced {
        partition: i32,
        offset: i64,
        value: String,
    },
    /// A write whose acknowledgement never came: it may or may not be in the log.
    ProduceUnknown { value: String, error: String },
    /// An Acquire answered with a lease, or a Subscribe member's `assigned` event.
    Acquired {
        invoked_ms: f64,
        lease: String,
        partition: i32,
        token: u64,
        /// The offset the lease starts at (the group's committed offset, or the reset).
        offset: i64,
        /// The instance that serves the lease.
        gateway: String,
        /// The gateway the client called.
        via: String,
    },
    /// An Acquire that gave no lease.
    AcquireFailed {
        invoked_ms: f64,
        outcome: Outcome,
        error: String,
        via: String,
    },
    /// Records handed to the client by a Read (or a Subscribe member's stream), in order; in
    /// queue mode, one delivery (a record delivered again is another `Batch`).
    Batch {
        lease: String,
        partition: i32,
        token: u64,
        offsets: Vec<i64>,
        values: Vec<String>,
    },
    /// A Commit of `offset` (the next record to read) for the lease.
    Commit {
        invoked_ms: f64,
        lease: String,
        partition: i32,
        token: u64,
        offset: i64,
        outcome: Outcome,
        error: Option<String>,
    },
    /// A Seek of the lease to `to` (answered with `resolved` when it took effect).
    Seek {
        invoked_ms: f64,
        lease: String,
        partition: i32,
        token: u64,
        to: i64,
        resolved: Option<i64>,
        outcome: Outcome,
        error: Option<String>,
    },
    /// A Release of the lease.
    Release {
        invoked_ms: f64,
        lease: String,
        partition: i32,
        token: u64,
        outcome: Outcome,
        error: Option<String>,
    },
    /// The client learnt that its lease ended without its Release (lost, expired, fenced),
    /// or gave it up after an error it could not tell from that.
    LeaseEnded {
        lease: String,
        partition: i32,
        token: u64,
        reason: String,
    },
    /// A queue-mode answer to one delivery (Acknowledge): `accept`, `retry` or `reject`.
    Ack {
        invoked_ms: f64,
        lease: String,
        partition: i32,
        token: u64,
        offset: i64,
        /// The delivery's attempt (1 for the first).
        attempt: u32,
        answer: String,
        /// Whether the answer ends the record: an accept, a reject, or a retry of the last
        /// delivery the queue allows (the gateway dead-letters it).
        terminal: bool,
        /// Ok only when the gateway applied it (a stale answer changed nothing: Failed).
        outcome: Outcome,
        error: Option<String>,
    },
    /// A record of the dead letter topic, read by the observer at the end of the run, with
    /// where it came from (the gateway's `kafka-lease.*` headers).
    DeadLetter {
        partition: i32,
        offset: i64,
        token: Option<u64>,
        attempts: Option<u32>,
        reason: String,
    },
    /// The group's committed offset of a partition as the observer read it from Kafka, with
    /// the fencing token named in its metadata (`kafka-lease token=<t>;…`).
    Committed {
        partition: i32,
        offset: i64,
        token: Option<u64>,
        metadata: String,
    },
    /// A fault began (`phase` start) or was healed (`phase` stop).
    Nemesis {
        name: String,
        phase: Phase,
        /// What it targets: a gateway, a Consul server, a broker.
        target: String,
        /// For a start: whether the fault was seen to take effect (the process gone, the
        /// leader changed, a probe across the cut timed out); always true for a stop.
        took_effect: bool,
        /// What showed it (or why it could not be shown).
        evidence: String,
    },
    /// A commit its gateway reported late (`late commit` in its log, read at the end of the
    /// run): answered after its lease's fence deadline, so it may have landed after a
    /// successor's commits. The process is the gateway.
    LateCommit {
        partition: i32,
        token: u64,
        offset: i64,
    },
    /// The end of the run: a partition's final committed offset and high watermark.
    Final {
        partition: i32,
        committed: i64,
        high_watermark: i64,
    },
}

/// The two ends of a fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    Start,
    Stop,
}

/// Reads a history written as JSON lines.
pub fn parse(text: &str) -> Result<Vec<Event>, String> {
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(i, line)| {
            serde_json::from_str(line).map_err(|e| format!("history line {}: {e}", i + 1))
        })
        .collect()
}

/// The commits a gateway's log reports late (its `late commit` warnings), as (partition,
/// token, offset): the lease's span names the partition and token, the event the offset.
pub fn late_commits(log: &str) -> Vec<(i32, u64, i64)> {
    let field = |line: &str, name: &str| -> Option<String> {
        let at = line
            .rfind(&format!(" {name}="))
            .or_else(|| line.rfind(&format!("{{{name}=")))?;
        let rest = &line[at + name.len() + 2..];
        Some(rest.chars().take_while(char::is_ascii_digit).collect())
    };
    log.lines()
        .filter(|line| line.contains("late commit:"))
        .filter_map(|line| {
            Some((
                field(line, "partition")?.parse().ok()?,
                field(line, "token")?.parse().ok()?,
                field(line, "offset")?.parse().ok()?,
            ))
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_gateways_late_commit_warning_is_read_back() {
        // As a gateway printed it in tests/commit_ordering.rs.
        let log = "2026-12-06T10:12:50.554866Z  INFO kafka_lease_server: started\n\
            2026-12-06T10:12:50.554866Z  WARN grpc{otel.name=kafka_lease.v1.PartitionLeaseService/Acquire \
            otel.kind=\"server\" rpc.system=\"grpc\"}:lease{lease=f8bc38ca9522d2a0 group=g-3dbd7e2db9df \
            topic=topic-462203b5f68a partition=3 token=188}: kafka_lease_server::lease: late commit: \
            answered after its lease's fence deadline, so it may have landed after a successor's \
            commits (the gateway was paused, or the request was held in the network) offset=10 \
            late_ms=987\n\
            2026-12-06T10:12:51Z  WARN something else partition=1 token=2 offset=3\n";
        assert_eq!(late_commits(log), vec![(3, 188, 10)]);
    }
}
