//! The history a run writes: one JSON object per line, in the order the harness saw the events.
//! Times are milliseconds since the run began, on the harness's monotonic clock (one process
//! runs every client, the producer and the nemesis, so one clock orders everything).
//!
//! A call is written once, when it completes, with the time it was invoked (`invoked_ms`) and
//! the time it completed (`t_ms`), so a checker can order two calls in real time: call A
//! happened before call B when A completed before B was invoked.

use serde::{Deserialize, Serialize};

/// One line of the history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// When the event completed (ms since the run began).
    pub t_ms: f64,
    /// Who: `producer`, `client-3`, `member-1`, `nemesis`, `observer`.
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
    /// An Acquire answered with a lease.
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
    /// Records handed to the client by a Read (or a Subscribe member's stream), in order.
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
