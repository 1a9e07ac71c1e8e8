//! The values the gateway's operations take and give, in domain terms.

use std::time::{Duration, SystemTime};

use crate::coordination::{FencingToken, HolderInfo, LockKey, MemberRecord};
use crate::lease::LeaseId;

/// Where a lease starts when its group has no committed offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reset {
    Earliest,
    Latest,
}

/// A validated Acquire.
#[derive(Clone, Debug)]
pub struct AcquireSpec {
    pub group: String,
    pub topic: String,
    pub partition: Option<i32>,
    pub member: String,
    pub ttl: Duration,
    pub wait: Duration,
    pub reset: Reset,
    /// The client connection the Acquire came on (its peer address), for
    /// [`super::Limits::max_leases_per_connection`]; `None` for callers without one.
    pub via: Option<std::net::SocketAddr>,
    /// The member id of the subscription the lease is for; empty for an Acquire.
    pub subscriber: String,
    /// The caller's identity, when it has one: the lease answers only it.
    pub owner: Option<String>,
}

/// What Acquire grants.
#[derive(Clone, Debug)]
pub struct Granted {
    pub lease_id: LeaseId,
    pub key: LockKey,
    pub fencing_token: FencingToken,
    pub offset: i64,
    pub high_watermark: i64,
    pub expires_at: SystemTime,
    pub ttl: Duration,
    pub gateway: String,
}

/// A validated Seek target.
#[derive(Clone, Copy, Debug)]
pub enum SeekTarget {
    Offset(i64),
    TimestampMs(i64),
    Earliest,
    Latest,
    Committed,
}

/// One row of ListLeases.
#[derive(Clone, Debug)]
pub struct ListedLease {
    pub key: LockKey,
    pub holder: HolderInfo,
    pub token: FencingToken,
    /// Present where this instance serves the lease.
    pub local: Option<crate::lease::LeaseSnapshot>,
}

/// One row of ListMembers.
#[derive(Clone, Debug)]
pub struct ListedMember {
    pub topic: String,
    pub record: MemberRecord,
    /// The partitions its leases hold, ascending.
    pub partitions: Vec<i32>,
    /// The epoch of its topic's target; 0: none published.
    pub epoch: u64,
    /// What that target gives it; `None` when the target was computed before it joined.
    pub target: Option<Vec<i32>>,
}
