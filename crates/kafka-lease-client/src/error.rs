//! The crate's error type: gRPC statuses from the gateway mapped to what they mean in the
//! kafka-lease API contract, with the machine-readable reason, metadata and retry advice the
//! gateway puts in the status details, plus connection failures.

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use tonic::{Code, Status};
use tonic_types::StatusExt;

use kafka_lease_proto::v1 as proto;

/// Shorthand for `Result<T, kafka_lease_client::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The `google.rpc.ErrorInfo` domain of the kafka-lease gateway's errors. ErrorInfo of any
/// other domain (a proxy's, say) is ignored.
pub const ERROR_DOMAIN: &str = "kafka-lease";

/// Why the gateway refused a call: the `reason` of the `google.rpc.ErrorInfo` in the status
/// details, mirroring the proto's `ErrorReason` (see it for the status code, the metadata keys
/// and the retry advice of each).
///
/// The gateway sends the reason as a string, the `ErrorReason` value's name; a name this
/// version of the crate does not know (from a newer gateway) is kept as [`Reason::Unknown`],
/// so match with a wildcard arm.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Reason {
    /// `INVALID_FIELD`: a request field is malformed or out of range (metadata `field`).
    InvalidField,
    /// `TOPIC_NOT_FOUND`: the topic does not exist (metadata `topic`).
    TopicNotFound,
    /// `PARTITION_NOT_FOUND`: the partition is out of range (metadata `topic`, `partition`,
    /// `partition_count`).
    PartitionNotFound,
    /// `LEASE_NOT_FOUND`: no gateway knows the lease (metadata `lease_ref`).
    LeaseNotFound,
    /// `PARTITION_BUSY`: leased by another member and `wait` ran out (metadata `group`,
    /// `topic`, `busy_partitions`, `partition`, `holder_member`, `holder_gateway`, and
    /// `expires_at` where known; retry advice until that expiry).
    PartitionBusy,
    /// `WRONG_GATEWAY`: another gateway instance serves the lease (metadata `lease_ref`,
    /// `gateway`). Gateways forward such calls to the serving instance instead, so a client
    /// no longer meets it.
    WrongGateway,
    /// `LEASE_LOST`: the gateway could no longer prove it holds the lease's Consul lock.
    LeaseLost,
    /// `LEASE_EXPIRED`: no Read was open and no call arrived within the lease's TTL.
    LeaseExpired,
    /// `LEASE_RELEASED`: the lease was released before this call.
    LeaseReleased,
    /// `LEASE_ABANDONED`: the Acquire that took the lease went away before it answered.
    LeaseAbandoned,
    /// `OFFSET_OUT_OF_RANGE`: an offset outside the partition's log (metadata `topic`,
    /// `partition`, `offset`, `low`, `high`).
    OffsetOutOfRange,
    /// `SUPERSEDED`: a newer Read on the lease took over this one.
    Superseded,
    /// `SHUTTING_DOWN`: the gateway instance is stopping. With metadata `lease_ref`, that
    /// lease ended with it.
    ShuttingDown,
    /// `KAFKA_UNAVAILABLE`: Kafka is unreachable (metadata `operation`; retry advice).
    KafkaUnavailable,
    /// `CONSUL_UNAVAILABLE`: Consul is unreachable or the gateway has no valid session
    /// (retry advice).
    ConsulUnavailable,
    /// `KAFKA_DENIED`: Kafka refused the gateway's own principal (authorization or
    /// authentication; code PERMISSION_DENIED, metadata `operation`). An operator must fix
    /// the gateway's Kafka credentials or ACLs; no retry helps.
    KafkaDenied,
    /// `KAFKA_REFUSED`: Kafka answered and refused the request for a reason no retry mends
    /// (code FAILED_PRECONDITION, metadata `operation`).
    KafkaRefused,
    /// `LIMIT_REACHED`: the gateway instance is at one of its limits (code
    /// RESOURCE_EXHAUSTED, metadata `limit` naming the flag and `value`; retry advice).
    LimitReached,
    /// `GATEWAY_UNREACHABLE`: the instance the call reached forwards it to the one serving
    /// the lease, which it cannot reach right now (code UNAVAILABLE, metadata `lease_ref`,
    /// `gateway`, `address`; retry advice). Once Consul notices a dead instance, calls on
    /// its leases answer `LEASE_LOST`.
    GatewayUnreachable,
    /// `MEMBER_ACTIVE`: a Subscribe named a member id that a live subscription uses (code
    /// ALREADY_EXISTS, metadata `group`, `topic`, `member_id`).
    MemberActive,
    /// `LEASE_REVOKED`: in a Subscribe `revoked` event, the lease moved to another member.
    LeaseRevoked,
    /// `NOT_AUTHENTICATED`: the gateway requires an identity (a client certificate or a
    /// bearer token, see [`ClientTls`](crate::ClientTls) and
    /// [`Client::with_bearer_token`](crate::Client::with_bearer_token)) and the call
    /// carried none it accepts (code UNAUTHENTICATED).
    NotAuthenticated,
    /// `ACTION_DENIED`: the caller's identity may not take this action on this group and
    /// topic, or the lease belongs to another identity (code PERMISSION_DENIED, metadata
    /// `identity`, `action`, `group`, `topic`).
    ActionDenied,
    /// `WRONG_MODE`: the call does not fit the lease's mode: Read, Seek or Commit on a lease
    /// in queue mode, Acknowledge on one that is not (code FAILED_PRECONDITION, metadata
    /// `lease_ref`, `mode`).
    WrongMode,
    /// A reason this version of the crate does not know, as the gateway spelled it.
    Unknown(String),
}

impl Reason {
    /// The reason for an `ErrorInfo.reason` string.
    pub fn from_name(name: &str) -> Reason {
        use proto::ErrorReason as R;
        // Through the generated enum, so that the names are the proto's by construction.
        match R::from_str_name(name) {
            Some(R::InvalidField) => Reason::InvalidField,
            Some(R::TopicNotFound) => Reason::TopicNotFound,
            Some(R::PartitionNotFound) => Reason::PartitionNotFound,
            Some(R::LeaseNotFound) => Reason::LeaseNotFound,
            Some(R::PartitionBusy) => Reason::PartitionBusy,
            Some(R::WrongGateway) => Reason::WrongGateway,
            Some(R::LeaseLost) => Reason::LeaseLost,
            Some(R::LeaseExpired) => Reason::LeaseExpired,
            Some(R::LeaseReleased) => Reason::LeaseReleased,
            Some(R::LeaseAbandoned) => Reason::LeaseAbandoned,
            Some(R::OffsetOutOfRange) => Reason::OffsetOutOfRange,
            Some(R::Superseded) => Reason::Superseded,
            Some(R::ShuttingDown) => Reason::ShuttingDown,
            Some(R::KafkaUnavailable) => Reason::KafkaUnavailable,
            Some(R::ConsulUnavailable) => Reason::ConsulUnavailable,
            Some(R::KafkaDenied) => Reason::KafkaDenied,
            Some(R::KafkaRefused) => Reason::KafkaRefused,
            Some(R::LimitReached) => Reason::LimitReached,
            Some(R::GatewayUnreachable) => Reason::GatewayUnreachable,
            Some(R::MemberActive) => Reason::MemberActive,
            Some(R::LeaseRevoked) => Reason::LeaseRevoked,
            Some(R::NotAuthenticated) => Reason::NotAuthenticated,
            Some(R::ActionDenied) => Reason::ActionDenied,
            Some(R::WrongMode) => Reason::WrongMode,
            Some(R::Unspecified) | None => Reason::Unknown(name.to_owned()),
        }
    }

    /// The reason's name, as the gateway sends it in `ErrorInfo.reason`.
    pub fn as_str(&self) -> &str {
        use proto::ErrorReason as R;
        let known = match self {
            Reason::InvalidField => R::InvalidField,
            Reason::TopicNotFound => R::TopicNotFound,
            Reason::PartitionNotFound => R::PartitionNotFound,
            Reason::LeaseNotFound => R::LeaseNotFound,
            Reason::PartitionBusy => R::PartitionBusy,
            Reason::WrongGateway => R::WrongGateway,
            Reason::LeaseLost => R::LeaseLost,
            Reason::LeaseExpired => R::LeaseExpired,
            Reason::LeaseReleased => R::LeaseReleased,
            Reason::LeaseAbandoned => R::LeaseAbandoned,
            Reason::OffsetOutOfRange => R::OffsetOutOfRange,
            Reason::Superseded => R::Superseded,
            Reason::ShuttingDown => R::ShuttingDown,
            Reason::KafkaUnavailable => R::KafkaUnavailable,
            Reason::ConsulUnavailable => R::ConsulUnavailable,
            Reason::KafkaDenied => R::KafkaDenied,
            Reason::KafkaRefused => R::KafkaRefused,
            Reason::LimitReached => R::LimitReached,
            Reason::GatewayUnreachable => R::GatewayUnreachable,
            Reason::MemberActive => R::MemberActive,
            Reason::LeaseRevoked => R::LeaseRevoked,
            Reason::NotAuthenticated => R::NotAuthenticated,
            Reason::ActionDenied => R::ActionDenied,
            Reason::WrongMode => R::WrongMode,
            Reason::Unknown(name) => return name,
        };
        known.as_str_name()
    }

    /// Whether the reason says the lease has ended (lost, expired, released or abandoned):
    /// it is gone for good, and only a new Acquire helps.
    pub fn is_lease_ended(&self) -> bool {
        matches!(
            self,
            Reason::LeaseLost
                | Reason::LeaseExpired
                | Reason::LeaseReleased
                | Reason::LeaseAbandoned
        )
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The machine-readable part of a gateway's error status: the `google.rpc.ErrorInfo` of
/// domain [`ERROR_DOMAIN`] (reason and metadata) and the `google.rpc.RetryInfo`, decoded
/// from the status details. Empty for a status without them (one tonic made up for a broken
/// connection, or one from a gateway older than these details).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatusDetails {
    // Boxed: most errors are passed around far more often than they are inspected, and the
    // empty case (transport failures) costs nothing.
    inner: Option<Box<DetailsInner>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct DetailsInner {
    reason: Option<Reason>,
    metadata: HashMap<String, String>,
    retry_after: Option<Duration>,
}

impl StatusDetails {
    /// Decodes the details of `status`. Details that do not decode count as absent: the
    /// status code and message still say what happened.
    pub fn from_status(status: &Status) -> StatusDetails {
        if status.details().is_empty() {
            return StatusDetails::default();
        }
        let Ok(details) = status.check_error_details() else {
            return StatusDetails::default();
        };
        let (reason, metadata) = match details.error_info() {
            Some(info) if info.domain == ERROR_DOMAIN && !info.reason.is_empty() => {
                (Some(Reason::from_name(&info.reason)), info.metadata.clone())
            }
            _ => (None, HashMap::new()),
        };
        let retry_after = details.retry_info().and_then(|r| r.retry_delay);
        if reason.is_none() && retry_after.is_none() {
            return StatusDetails::default();
        }
        StatusDetails {
            inner: Some(Box::new(DetailsInner {
                reason,
                metadata,
                retry_after,
            })),
        }
    }

    /// The gateway's reason, if the status carried a kafka-lease ErrorInfo.
    pub fn reason(&self) -> Option<&Reason> {
        self.inner.as_ref()?.reason.as_ref()
    }

    /// One ErrorInfo metadata value (`lease_ref`, `partition`, `holder_member`, `low`, ...;
    /// numbers in decimal, times in RFC 3339).
    pub fn metadata(&self, key: &str) -> Option<&str> {
        self.inner.as_ref()?.metadata.get(key).map(String::as_str)
    }

    /// Every ErrorInfo metadata entry, in no particular order.
    pub fn metadata_entries(&self) -> impl Iterator<Item = (&str, &str)> {
        self.inner
            .iter()
            .flat_map(|inner| inner.metadata.iter())
            .map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// The gateway's RetryInfo: how long to wait before the same call can succeed. Absent
    /// where the gateway says a retry cannot succeed.
    pub fn retry_after(&self) -> Option<Duration> {
        self.inner.as_ref()?.retry_after
    }

    /// Whether the status carried none of the gateway's details.
    pub fn is_empty(&self) -> bool {
        self.inner.is_none()
    }
}

/// Everything that can go wrong talking to a kafka-lease gateway.
///
/// Each variant that comes from the gateway carries the status message, which per the API
/// contract says what was wrong with the offending value and the allowed range, or who holds
/// the partition, and the status details: [`Error::reason`] for branching (never parse the
/// message), [`Error::metadata`] for the values involved, [`Error::retry_after`] for the
/// gateway's retry advice. [`Error::code`] gives the gRPC code back; [`Error::is_retryable`]
/// says whether trying the same call again later may succeed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// `INVALID_ARGUMENT`: a name, TTL, wait, partition or read limit is out of range.
    #[error("invalid argument: {message}")]
    InvalidArgument {
        /// The gateway's message, naming the offending value and the allowed range.
        message: String,
        /// Reason `INVALID_FIELD`, metadata `field`.
        details: StatusDetails,
    },

    /// `NOT_FOUND`: the topic does not exist, the partition is out of range, or the lease is
    /// unknown or already ended (e.g. released twice). [`Error::reason`] tells which.
    #[error("not found: {message}")]
    NotFound {
        /// The gateway's message.
        message: String,
        /// Reason `TOPIC_NOT_FOUND`, `PARTITION_NOT_FOUND` or `LEASE_NOT_FOUND`.
        details: StatusDetails,
    },

    /// `RESOURCE_EXHAUSTED`: the partition asked for (or every partition) is leased by another
    /// member of the group and the Acquire's `wait` ran out.
    #[error("partition busy: {message}")]
    Busy {
        /// The gateway's message, naming the holder's member and when its lease expires.
        message: String,
        /// Reason `PARTITION_BUSY`: the holder in metadata, and in [`Error::retry_after`]
        /// the time until its lease expires where the gateway knows it.
        details: StatusDetails,
    },

    /// The lease has ended: reason `LEASE_LOST` (the gateway lost its Consul lock),
    /// `LEASE_EXPIRED` (the TTL ran out), `LEASE_RELEASED` (released before this call) or
    /// `LEASE_ABANDONED`; status `FAILED_PRECONDITION`. The lease is gone; acquire a new one.
    #[error("lease ended: {message}")]
    LeaseEnded {
        /// The gateway's message.
        message: String,
        /// The reason, with metadata `lease_ref`.
        details: StatusDetails,
    },

    /// Any other `FAILED_PRECONDITION`: a call that reached a gateway instance other than the
    /// one serving the lease (reason `WRONG_GATEWAY`, metadata `gateway` names that
    /// instance).
    #[error("failed precondition: {message}")]
    FailedPrecondition {
        /// The gateway's message.
        message: String,
        /// The reason and its metadata.
        details: StatusDetails,
    },

    /// `OUT_OF_RANGE`: a seek or commit offset outside the partition's valid range.
    #[error("out of range: {message}")]
    OutOfRange {
        /// The gateway's message, giving the valid range.
        message: String,
        /// Reason `OFFSET_OUT_OF_RANGE`, metadata `offset`, `low` and `high`.
        details: StatusDetails,
    },

    /// `ABORTED`: this Read stream was superseded by a newer Read on the same lease. The lease
    /// itself is still held.
    #[error("read superseded: {message}")]
    Superseded {
        /// The gateway's message.
        message: String,
        /// Reason `SUPERSEDED`.
        details: StatusDetails,
    },

    /// `UNAVAILABLE`: Consul or Kafka is unreachable, the gateway is shutting down, or the
    /// connection to it failed. Usually safe to retry: see [`Error::is_retryable`], which
    /// excludes a lease that ended with its gateway.
    #[error("unavailable: {message}")]
    Unavailable {
        /// The gateway's (or the transport's) message.
        message: String,
        /// Reason `KAFKA_UNAVAILABLE`, `CONSUL_UNAVAILABLE` or `SHUTTING_DOWN`, and the retry
        /// advice; empty when the transport made the status up.
        details: StatusDetails,
    },

    /// The endpoint given to [`Client::connect`](crate::Client::connect) is not a valid URI.
    #[error("invalid endpoint {endpoint:?}: {source}")]
    InvalidEndpoint {
        /// The endpoint as given.
        endpoint: String,
        /// Why it was rejected.
        #[source]
        source: tonic::transport::Error,
    },

    /// [`Client::connect_balanced`](crate::Client::connect_balanced) was given no endpoint.
    #[error("no gateway endpoints given; pass at least one, e.g. \"http://10.0.0.7:50051\"")]
    NoEndpoints,

    /// Connecting to the gateway failed (refused, unreachable, TLS, ...).
    #[error("transport error: {0}")]
    Transport(#[source] tonic::transport::Error),

    /// Any other gRPC status (`INTERNAL`, `DEADLINE_EXCEEDED`, `CANCELLED`, ...), kept whole.
    #[error("gRPC status {}: {}", .status.code(), .status.message())]
    Other {
        /// The status as received.
        #[source]
        status: Status,
        /// Its decoded details, if it had any.
        details: StatusDetails,
    },
}

impl Error {
    /// The gRPC status code this error stands for.
    ///
    /// [`Error::Transport`] counts as `UNAVAILABLE` and [`Error::InvalidEndpoint`] as
    /// `INVALID_ARGUMENT`, matching how gRPC itself reports those conditions.
    pub fn code(&self) -> Code {
        match self {
            Error::InvalidArgument { .. } | Error::InvalidEndpoint { .. } | Error::NoEndpoints => {
                Code::InvalidArgument
            }
            Error::NotFound { .. } => Code::NotFound,
            Error::Busy { .. } => Code::ResourceExhausted,
            Error::LeaseEnded { .. } | Error::FailedPrecondition { .. } => Code::FailedPrecondition,
            Error::OutOfRange { .. } => Code::OutOfRange,
            Error::Superseded { .. } => Code::Aborted,
            Error::Unavailable { .. } | Error::Transport(_) => Code::Unavailable,
            Error::Other { status, .. } => status.code(),
        }
    }

    /// The status details the gateway sent; `None` for the errors that are not a status
    /// ([`Error::Transport`], [`Error::InvalidEndpoint`], [`Error::NoEndpoints`]).
    pub fn details(&self) -> Option<&StatusDetails> {
        match self {
            Error::InvalidArgument { details, .. }
            | Error::NotFound { details, .. }
            | Error::Busy { details, .. }
            | Error::LeaseEnded { details, .. }
            | Error::FailedPrecondition { details, .. }
            | Error::OutOfRange { details, .. }
            | Error::Superseded { details, .. }
            | Error::Unavailable { details, .. }
            | Error::Other { details, .. } => Some(details),
            Error::InvalidEndpoint { .. } | Error::NoEndpoints | Error::Transport(_) => None,
        }
    }

    /// Why the gateway refused the call, from the `google.rpc.ErrorInfo` in the status details:
    /// what to branch on, rather than the message. `None` when there was no such ErrorInfo
    /// (a connection failure, or a gateway older than these details).
    pub fn reason(&self) -> Option<Reason> {
        self.details()?.reason().cloned()
    }

    /// One metadata value of the gateway's ErrorInfo, e.g. `metadata("holder_member")` of
    /// [`Error::Busy`] or `metadata("high")` of [`Error::OutOfRange`]. The keys of each reason
    /// are listed with the proto's `ErrorReason`.
    pub fn metadata(&self, key: &str) -> Option<&str> {
        self.details()?.metadata(key)
    }

    /// The gateway's retry advice (`google.rpc.RetryInfo`): how long to wait before the same
    /// call can succeed. Set for Kafka or Consul outages, a gateway that is shutting down, and
    /// a busy partition (until its holder's lease expires, where known).
    pub fn retry_after(&self) -> Option<Duration> {
        self.details()?.retry_after()
    }

    /// Whether the same call may succeed if tried again later, unchanged: `UNAVAILABLE` and
    /// connection failures, except where the gateway's details say otherwise (a lease that
    /// ended with its gateway's shutdown: `SHUTTING_DOWN` without retry advice).
    ///
    /// [`Error::Busy`] is not counted: the partition is held by someone else, and waiting for it
    /// is what [`AcquireOptions::wait`](crate::AcquireOptions::wait) is for.
    pub fn is_retryable(&self) -> bool {
        match self {
            // With a reason, the gateway said whether a retry can succeed by attaching
            // RetryInfo or not.
            Error::Unavailable { details, .. } => {
                details.reason().is_none() || details.retry_after().is_some()
            }
            Error::Transport(_) => true,
            _ => false,
        }
    }

    /// Whether this says the lease has ended: [`Error::LeaseEnded`], or `SHUTTING_DOWN`
    /// naming the lease (it ended with its gateway). The lease is gone for good and the caller
    /// must acquire a new one.
    ///
    /// A lease id no gateway knows is [`Error::NotFound`] instead, which is not counted here
    /// because `NOT_FOUND` from `Acquire` means an unknown topic or partition.
    pub fn is_lease_ended(&self) -> bool {
        match self {
            Error::LeaseEnded { .. } => true,
            Error::Unavailable { details, .. } => {
                details.reason() == Some(&Reason::ShuttingDown)
                    && details.metadata("lease_ref").is_some()
            }
            _ => false,
        }
    }

    /// The message the gateway (or the transport) gave, without the variant's prefix.
    pub fn message(&self) -> String {
        match self {
            Error::InvalidArgument { message, .. }
            | Error::NotFound { message, .. }
            | Error::Busy { message, .. }
            | Error::LeaseEnded { message, .. }
            | Error::FailedPrecondition { message, .. }
            | Error::OutOfRange { message, .. }
            | Error::Superseded { message, .. }
            | Error::Unavailable { message, .. } => message.clone(),
            Error::InvalidEndpoint { source, .. } => source.to_string(),
            Error::NoEndpoints => self.to_string(),
            Error::Transport(source) => source.to_string(),
            Error::Other { status, .. } => status.message().to_owned(),
        }
    }
}

/// For a gateway older than the status details only: whether a `FAILED_PRECONDITION`
/// message is the contract's "the lease ended" wording. Never consulted when the status
/// carries a reason.
fn says_lease_ended(message: &str) -> bool {
    let lower = message.to_ascii_lowercase();
    lower.contains("lease lost") || lower.contains("lease expired")
}

impl From<Status> for Error {
    fn from(status: Status) -> Self {
        let details = StatusDetails::from_status(&status);
        let message = status.message().to_owned();
        let lease_ended = match details.reason() {
            Some(reason) => reason.is_lease_ended(),
            None => status.code() == Code::FailedPrecondition && says_lease_ended(&message),
        };
        if lease_ended {
            return Error::LeaseEnded { message, details };
        }
        match status.code() {
            Code::InvalidArgument => Error::InvalidArgument { message, details },
            Code::NotFound => Error::NotFound { message, details },
            Code::ResourceExhausted => Error::Busy { message, details },
            Code::FailedPrecondition => Error::FailedPrecondition { message, details },
            Code::OutOfRange => Error::OutOfRange { message, details },
            Code::Aborted => Error::Superseded { message, details },
            Code::Unavailable => Error::Unavailable { message, details },
            _ => Error::Other { status, details },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(code: Code, message: &str) -> Error {
        Error::from(Status::new(code, message))
    }

    #[test]
    fn maps_each_contract_code_to_its_variant() {
        assert!(
            matches!(map(Code::InvalidArgument, "ttl 0s: allowed 1s..=5m"),
            Error::InvalidArgument { message, .. } if message == "ttl 0s: allowed 1s..=5m")
        );
        assert!(matches!(
            map(Code::NotFound, "no topic"),
            Error::NotFound { .. }
        ));
        assert!(matches!(
            map(Code::ResourceExhausted, "held by member x until ..."),
            Error::Busy { message, .. } if message.contains("member x")
        ));
        assert!(matches!(
            map(Code::OutOfRange, "valid 0..=10"),
            Error::OutOfRange { .. }
        ));
        assert!(matches!(
            map(Code::Aborted, "superseded"),
            Error::Superseded { .. }
        ));
        assert!(matches!(
            map(Code::Unavailable, "consul down"),
            Error::Unavailable { .. }
        ));
    }

    #[test]
    fn without_details_failed_precondition_falls_back_to_the_contract_wording() {
        assert!(matches!(
            map(Code::FailedPrecondition, "lease lost: consul lock gone"),
            Error::LeaseEnded { .. }
        ));
        assert!(matches!(
            map(Code::FailedPrecondition, "Lease Expired after 10s"),
            Error::LeaseEnded { .. }
        ));
        let other = map(Code::FailedPrecondition, "lease is served by gateway gw-2");
        assert!(matches!(other, Error::FailedPrecondition { .. }));
        assert!(!other.is_lease_ended());
        assert!(map(Code::FailedPrecondition, "lease lost").is_lease_ended());
    }

    #[test]
    fn other_codes_keep_the_whole_status() {
        let err = map(Code::Internal, "boom");
        match &err {
            Error::Other { status, details } => {
                assert!(details.is_empty());
                assert_eq!(status.code(), Code::Internal);
                assert_eq!(status.message(), "boom");
            }
            other => panic!("expected Other, got {other:?}"),
        }
        assert_eq!(err.code(), Code::Internal);
        assert_eq!(err.message(), "boom");
    }

    #[test]
    fn code_round_trips_for_mapped_variants() {
        for code in [
            Code::InvalidArgument,
            Code::NotFound,
            Code::ResourceExhausted,
            Code::FailedPrecondition,
            Code::OutOfRange,
            Code::Aborted,
            Code::Unavailable,
            Code::DeadlineExceeded,
            Code::Cancelled,
        ] {
            assert_eq!(map(code, "m").code(), code, "{code:?}");
        }
    }

    #[test]
    fn only_unavailable_is_retryable() {
        assert!(map(Code::Unavailable, "shutting down").is_retryable());
        for code in [
            Code::InvalidArgument,
            Code::NotFound,
            Code::ResourceExhausted,
            Code::FailedPrecondition,
            Code::OutOfRange,
            Code::Aborted,
            Code::Internal,
        ] {
            assert!(!map(code, "m").is_retryable(), "{code:?}");
        }
    }

    #[test]
    fn display_includes_the_message() {
        let err = map(Code::ResourceExhausted, "partition 3 held by worker-1");
        assert_eq!(
            err.to_string(),
            "partition busy: partition 3 held by worker-1"
        );
        assert_eq!(err.message(), "partition 3 held by worker-1");
    }

    /// A status as the gateway sends it: code, message, ErrorInfo of its domain, and
    /// RetryInfo where given.
    fn gateway_status(
        code: Code,
        message: &str,
        reason: &str,
        metadata: &[(&str, &str)],
        retry: Option<Duration>,
    ) -> Status {
        let metadata: HashMap<String, String> = metadata
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let mut details =
            tonic_types::ErrorDetails::with_error_info(reason, ERROR_DOMAIN, metadata);
        if retry.is_some() {
            details.set_retry_info(retry);
        }
        Status::with_error_details(code, message, details)
    }

    #[test]
    fn lease_ended_is_decided_by_the_reason_not_the_message() {
        for reason in [
            "LEASE_LOST",
            "LEASE_EXPIRED",
            "LEASE_RELEASED",
            "LEASE_ABANDONED",
        ] {
            // A message with none of the old wording: only the reason can tell.
            let err = Error::from(gateway_status(
                Code::FailedPrecondition,
                "lease \"r1\" has ended",
                reason,
                &[("lease_ref", "r1")],
                None,
            ));
            assert!(matches!(err, Error::LeaseEnded { .. }), "{reason}: {err:?}");
            assert!(err.is_lease_ended());
            assert_eq!(err.reason().map(|r| r.to_string()).as_deref(), Some(reason));
            assert_eq!(err.metadata("lease_ref"), Some("r1"));
            assert_eq!(err.code(), Code::FailedPrecondition);
        }
        // The old wording in the message does not make a wrong-gateway status a lease end.
        let err = Error::from(gateway_status(
            Code::FailedPrecondition,
            "lease lost? no: lease \"r1\" is served by gateway instance \"gw-b\"",
            "WRONG_GATEWAY",
            &[("lease_ref", "r1"), ("gateway", "gw-b")],
            None,
        ));
        assert!(matches!(err, Error::FailedPrecondition { .. }), "{err:?}");
        assert_eq!(err.reason(), Some(Reason::WrongGateway));
        assert_eq!(err.metadata("gateway"), Some("gw-b"));
        assert!(!err.is_lease_ended());
    }

    #[test]
    fn busy_carries_the_holder_and_the_retry_advice() {
        let err = Error::from(gateway_status(
            Code::ResourceExhausted,
            "the partition asked for is leased ...",
            "PARTITION_BUSY",
            &[
                ("partition", "3"),
                ("holder_member", "worker-1"),
                ("expires_at", "2030-01-01T00:00:00.000Z"),
            ],
            Some(Duration::from_millis(2500)),
        ));
        assert!(matches!(err, Error::Busy { .. }), "{err:?}");
        assert_eq!(err.reason(), Some(Reason::PartitionBusy));
        assert_eq!(err.metadata("holder_member"), Some("worker-1"));
        assert_eq!(err.metadata("partition"), Some("3"));
        assert_eq!(err.metadata("nope"), None);
        assert_eq!(err.retry_after(), Some(Duration::from_millis(2500)));
        assert!(
            !err.is_retryable(),
            "waiting for a partition is Acquire's wait"
        );
        let mut keys: Vec<_> = err
            .details()
            .map(|d| d.metadata_entries().map(|(k, _)| k).collect())
            .unwrap_or_default();
        keys.sort_unstable();
        assert_eq!(keys, vec!["expires_at", "holder_member", "partition"]);
    }

    #[test]
    fn out_of_range_carries_the_valid_range() {
        let err = Error::from(gateway_status(
            Code::OutOfRange,
            "offset 99 is out of range",
            "OFFSET_OUT_OF_RANGE",
            &[("offset", "99"), ("low", "5"), ("high", "10")],
            None,
        ));
        assert!(matches!(err, Error::OutOfRange { .. }));
        assert_eq!(err.reason(), Some(Reason::OffsetOutOfRange));
        assert_eq!(
            (err.metadata("low"), err.metadata("high")),
            (Some("5"), Some("10"))
        );
        assert_eq!(err.retry_after(), None);
    }

    #[test]
    fn unavailable_follows_the_gateway_retry_advice() {
        let outage = Error::from(gateway_status(
            Code::Unavailable,
            "Kafka is unavailable",
            "KAFKA_UNAVAILABLE",
            &[("operation", "fetch metadata")],
            Some(Duration::from_secs(1)),
        ));
        assert_eq!(outage.reason(), Some(Reason::KafkaUnavailable));
        assert_eq!(outage.retry_after(), Some(Duration::from_secs(1)));
        assert!(outage.is_retryable());
        assert!(!outage.is_lease_ended());

        let refused = Error::from(gateway_status(
            Code::Unavailable,
            "the gateway is shutting down; retry on another instance",
            "SHUTTING_DOWN",
            &[],
            Some(Duration::from_secs(1)),
        ));
        assert!(refused.is_retryable());
        assert!(!refused.is_lease_ended());

        // A lease that ended with its gateway: no retry of a call on it can succeed.
        let gone = Error::from(gateway_status(
            Code::Unavailable,
            "lease \"r1\" has ended: gateway shutting down",
            "SHUTTING_DOWN",
            &[("lease_ref", "r1")],
            None,
        ));
        assert!(matches!(gone, Error::Unavailable { .. }), "{gone:?}");
        assert!(!gone.is_retryable());
        assert!(gone.is_lease_ended());

        // A transport failure has no details and stays retryable.
        let broken = map(Code::Unavailable, "connection reset");
        assert!(broken.is_retryable());
        assert_eq!(broken.reason(), None);
        assert_eq!(broken.retry_after(), None);
    }

    #[test]
    fn unknown_reasons_are_kept_and_mapped_by_code() {
        let err = Error::from(gateway_status(
            Code::FailedPrecondition,
            "something new",
            "SOMETHING_NEW",
            &[("k", "v")],
            None,
        ));
        assert!(matches!(err, Error::FailedPrecondition { .. }), "{err:?}");
        assert_eq!(err.reason(), Some(Reason::Unknown("SOMETHING_NEW".into())));
        assert_eq!(err.metadata("k"), Some("v"));
        // The zero value is never sent; if it were, it is not a known reason.
        assert_eq!(
            Reason::from_name("ERROR_REASON_UNSPECIFIED"),
            Reason::Unknown("ERROR_REASON_UNSPECIFIED".into())
        );
    }

    #[test]
    fn error_info_of_another_domain_is_ignored() {
        let details = tonic_types::ErrorDetails::with_error_info(
            "LEASE_LOST",
            "some-proxy",
            HashMap::<String, String>::new(),
        );
        let err = Error::from(Status::with_error_details(
            Code::FailedPrecondition,
            "upstream refused",
            details,
        ));
        assert!(matches!(err, Error::FailedPrecondition { .. }), "{err:?}");
        assert_eq!(err.reason(), None);
        assert!(err.details().is_some_and(StatusDetails::is_empty));
    }

    #[test]
    fn every_proto_reason_round_trips_through_reason() {
        for value in 1.. {
            let Ok(proto_reason) = proto::ErrorReason::try_from(value) else {
                break;
            };
            let name = proto_reason.as_str_name();
            let reason = Reason::from_name(name);
            assert!(
                !matches!(reason, Reason::Unknown(_)),
                "{name} is in the proto but not in Reason"
            );
            assert_eq!(reason.as_str(), name);
        }
    }

    #[test]
    fn other_codes_keep_their_details() {
        let err = Error::from(gateway_status(
            Code::Internal,
            "boom",
            "SOMETHING_NEW",
            &[],
            Some(Duration::from_secs(3)),
        ));
        assert!(matches!(err, Error::Other { .. }), "{err:?}");
        assert_eq!(err.retry_after(), Some(Duration::from_secs(3)));
        assert!(!err.is_retryable());
    }
}
