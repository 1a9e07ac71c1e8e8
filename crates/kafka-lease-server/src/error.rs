//! The gateway's domain errors. Each variant carries what a person needs to act on it; the
//! gRPC layer maps them to status codes in exactly one place (`grpc::status_of`).

use std::fmt;
use std::time::SystemTime;

use crate::coordination::{CoordinationError, HolderInfo};

/// Why a lease ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EndReason {
    /// The client called Release.
    Released,
    /// No Read was open and no call arrived for longer than the TTL.
    Expired,
    /// The gateway could no longer prove it holds the Consul lock.
    Lost(String),
    /// The gateway is shutting down.
    Shutdown,
    /// The Acquire call that took the lock went away (its deadline passed, or its client
    /// cancelled it) before it could answer; nobody ever learnt the lease id.
    Abandoned,
}

impl EndReason {
    /// The reason as a metric label.
    pub fn label(&self) -> &'static str {
        match self {
            EndReason::Released => "released",
            EndReason::Expired => "expired",
            EndReason::Lost(_) => "lost",
            EndReason::Shutdown => "shutdown",
            EndReason::Abandoned => "abandoned",
        }
    }
}

impl fmt::Display for EndReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EndReason::Released => f.write_str("lease released"),
            EndReason::Expired => {
                f.write_str("lease expired (no Read open and no call within its ttl)")
            }
            EndReason::Lost(why) => write!(f, "lease lost: {why}"),
            EndReason::Shutdown => f.write_str("gateway shutting down"),
            EndReason::Abandoned => {
                f.write_str("lease abandoned (its Acquire call was cancelled before it answered)")
            }
        }
    }
}

/// Who holds a partition, for a RESOURCE_EXHAUSTED message.
#[derive(Clone, Debug)]
pub struct BusyPartition {
    pub partition: i32,
    pub holder: Option<HolderInfo>,
    /// Exact where this gateway serves the lease.
    pub expires_at: Option<SystemTime>,
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LeaseError {
    /// The gateway requires an identity and the call carried none it accepts.
    #[error("{0}")]
    NotAuthenticated(String),

    /// The caller may not take this action here.
    #[error("{0}")]
    ActionDenied(Box<Denied>),

    #[error("{message}")]
    InvalidArgument {
        field: &'static str,
        message: String,
    },

    #[error("topic {topic:?} does not exist")]
    TopicNotFound { topic: String },

    #[error("partition {partition} of topic {topic:?} does not exist; the topic has partitions 0..={}", partition_count - 1)]
    PartitionNotFound {
        topic: String,
        partition: i32,
        partition_count: i32,
    },

    #[error("{}", busy_message(group, topic, busy))]
    Busy {
        group: String,
        topic: String,
        busy: Vec<BusyPartition>,
    },

    /// No lease has this id: its reference is unknown, or its secret does not match. The
    /// message says both, so that it confirms neither to a caller without the secret.
    #[error("no lease has the id given (reference {lease_ref:?}): the reference is unknown to every gateway instance, or the secret part of the id does not match it; check that the whole id is sent as Acquire returned it")]
    LeaseNotFound { lease_ref: String },

    #[error("lease {lease_ref:?} is served by gateway instance {gateway:?}; send calls for it to that instance")]
    WrongGateway { lease_ref: String, gateway: String },

    #[error("lease {lease_ref:?} has ended: {reason}")]
    LeaseEnded {
        lease_ref: String,
        reason: EndReason,
    },

    /// Release of a lease that has ended: NOT_FOUND (LEASE_NOT_FOUND), as the contract has
    /// it, with the message Commit and Seek give for the same lease.
    #[error("lease {lease_ref:?} has ended: {reason}")]
    ReleaseOfEnded {
        lease_ref: String,
        reason: EndReason,
    },

    #[error("offset {offset} is out of range for {topic}/{partition}; valid offsets are {low} ..= {high} (log start ..= high watermark)")]
    OffsetOutOfRange {
        topic: String,
        partition: i32,
        offset: i64,
        low: i64,
        high: i64,
    },

    #[error("superseded: a newer Read or Deliver was opened on lease {lease_ref:?}")]
    Superseded { lease_ref: String },

    /// A call that does not fit the lease's mode (queue mode, or not).
    #[error("{message}")]
    WrongMode {
        lease_ref: String,
        /// The lease's mode: "queue" or "read".
        mode: &'static str,
        message: String,
    },

    /// A Deliver named (or defaulted to) a dead letter topic that does not exist.
    #[error("dead letter topic {topic:?} does not exist: create it, or name another in the Deliver's dead_letter_topic")]
    DeadLetterTopicNotFound { topic: String },

    #[error("the gateway is shutting down; retry on another instance")]
    ShuttingDown,

    #[error("Kafka is unavailable during {operation}: {detail}")]
    KafkaUnavailable {
        operation: &'static str,
        detail: String,
    },

    /// Kafka answered, and refused: a retry of the same request cannot succeed. `denied`
    /// when the refusal is an authorization failure of the gateway's own Kafka principal.
    #[error("Kafka refused {operation}: {detail}")]
    KafkaRefused {
        operation: &'static str,
        detail: String,
        denied: bool,
    },

    /// A per-gateway limit that keeps one client from taking what the gateway has for all.
    #[error("{what}: the limit is {limit} ({flag}); retry later, or raise {flag}")]
    LimitReached {
        /// The flag that sets the limit, e.g. `--max-leases`.
        flag: &'static str,
        limit: usize,
        /// What is at the limit, in words.
        what: String,
    },

    /// A call forwarded to the instance serving the lease could not reach it, although it
    /// is still registered.
    #[error("lease {lease_ref:?} is served by gateway instance {gateway:?} at {address}, which this instance cannot reach right now ({detail}); retry")]
    GatewayUnreachable {
        lease_ref: String,
        gateway: String,
        address: String,
        detail: String,
    },

    /// A Subscribe of a member that another instance serves could not reach that instance,
    /// although it still holds the member's record.
    #[error("member {:?} of group {:?} is served by gateway instance {:?} at {}, which this instance cannot reach right now ({}); subscribe again (when that instance is gone, its members go with its Consul session and the member joins anew)", .0.member_id, .0.group, .0.gateway, .0.address, .0.detail)]
    MemberUnreachable(Box<MemberUnreachable>),

    /// A Subscribe named a member id that a live subscription uses.
    #[error("member {member_id:?} of group {group:?} is subscribed to topic {topic:?} already, through a live stream; end that one first, or use another member id")]
    MemberActive {
        group: String,
        topic: String,
        member_id: String,
    },

    #[error("Consul is unavailable: {0}")]
    Coordination(#[from] CoordinationError),
}

fn busy_message(group: &str, topic: &str, busy: &[BusyPartition]) -> String {
    let mut parts = Vec::new();
    for b in busy.iter().take(8) {
        let who = match &b.holder {
            Some(h) => {
                let expiry = match b.expires_at {
                    Some(at) => format!("expires at {}", humantime::format_rfc3339_millis(at)),
                    None => format!(
                        "acquired at {}, ttl {}, renewed while its client is active",
                        humantime::format_rfc3339_seconds(h.acquired_at()),
                        humantime::format_duration(std::time::Duration::from_millis(h.ttl_ms))
                    ),
                };
                format!(
                    "partition {} held by member {:?} via gateway {:?} ({expiry})",
                    b.partition, h.member, h.gateway
                )
            }
            None => format!("partition {} held (holder unknown)", b.partition),
        };
        parts.push(who);
    }
    if busy.len() > 8 {
        parts.push(format!("and {} more", busy.len() - 8));
    }
    let what = if busy.len() == 1 {
        "the partition asked for is"
    } else {
        "every partition is"
    };
    format!(
        "{what} leased in group {group:?} of topic {topic:?}: {}",
        parts.join("; ")
    )
}

/// Where a member is served that a forwarded Subscribe could not reach (boxed in
/// [`LeaseError::MemberUnreachable`] to keep the error small).
#[derive(Debug)]
pub struct MemberUnreachable {
    pub group: String,
    pub member_id: String,
    pub gateway: String,
    pub address: String,
    pub detail: String,
}

/// A refusal by the policy (`crate::auth`): who, what, where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denied {
    pub identity: String,
    /// An [`Action`](crate::auth::Action)'s name, or `forward` / `describe` for the
    /// gateway-to-gateway calls.
    pub action: &'static str,
    pub group: Option<String>,
    pub topic: Option<String>,
    /// Why, in words, when it is not simply "no grant".
    pub why: Option<String>,
}

impl std::fmt::Display for Denied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?} may not {}", self.identity, self.action)?;
        if let Some(group) = &self.group {
            write!(f, " in group {group:?}")?;
        }
        if let Some(topic) = &self.topic {
            write!(f, " on topic {topic:?}")?;
        }
        match &self.why {
            Some(why) => write!(f, ": {why}"),
            None => write!(f, ": the gateway's policy grants it no such action there"),
        }
    }
}
