//! The crate's error type: gRPC statuses from the gateway mapped to what they mean in the
//! kafka-lease API contract, plus connection failures.

use tonic::{Code, Status};

/// Shorthand for `Result<T, kafka_lease_client::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong talking to a kafka-lease gateway.
///
/// Each variant that comes from the gateway carries the status message, which per the API
/// contract says what was wrong with the offending value and the allowed range, or who holds
/// the partition. [`Error::code`] gives the gRPC code back; [`Error::is_retryable`] says whether
/// trying the same call again later may succeed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// `INVALID_ARGUMENT`: a name, TTL, wait, partition or read limit is out of range.
    #[error("invalid argument: {message}")]
    InvalidArgument {
        /// The gateway's message, naming the offending value and the allowed range.
        message: String,
    },

    /// `NOT_FOUND`: the topic does not exist, the partition is out of range, or the lease is
    /// unknown or already ended (e.g. released twice).
    #[error("not found: {message}")]
    NotFound {
        /// The gateway's message.
        message: String,
    },

    /// `RESOURCE_EXHAUSTED`: the partition asked for (or every partition) is leased by another
    /// member of the group and the Acquire's `wait` ran out.
    #[error("partition busy: {message}")]
    Busy {
        /// The gateway's message, naming the holder's member and when its lease expires.
        message: String,
    },

    /// `FAILED_PRECONDITION` with "lease lost" or "lease expired" in the message: the lease
    /// ended without a Release (TTL ran out, the gateway lost its Consul lock, ...). The lease
    /// is gone; acquire a new one.
    #[error("lease ended: {message}")]
    LeaseEnded {
        /// The gateway's message.
        message: String,
    },

    /// Any other `FAILED_PRECONDITION`: a fenced commit (the lease's fencing token is older
    /// than the partition's current one), or a call that reached a gateway instance other than
    /// the one serving the lease (the message names that instance).
    ///
    /// The contract does not give these cases distinct markers, so they share this variant;
    /// read the message to tell them apart.
    #[error("failed precondition: {message}")]
    FailedPrecondition {
        /// The gateway's message.
        message: String,
    },

    /// `OUT_OF_RANGE`: a seek or commit offset outside the partition's valid range.
    #[error("out of range: {message}")]
    OutOfRange {
        /// The gateway's message, giving the valid range.
        message: String,
    },

    /// `ABORTED`: this Read stream was superseded by a newer Read on the same lease. The lease
    /// itself is still held.
    #[error("read superseded: {message}")]
    Superseded {
        /// The gateway's message.
        message: String,
    },

    /// `UNAVAILABLE`: Consul or Kafka is unreachable, the gateway is shutting down, or the
    /// connection to it failed. Safe to retry.
    #[error("unavailable: {message}")]
    Unavailable {
        /// The gateway's (or the transport's) message.
        message: String,
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

    /// Connecting to the gateway failed (refused, unreachable, TLS, ...).
    #[error("transport error: {0}")]
    Transport(#[source] tonic::transport::Error),

    /// Any other gRPC status (`INTERNAL`, `DEADLINE_EXCEEDED`, `CANCELLED`, ...), kept whole.
    #[error("gRPC status {}: {}", .0.code(), .0.message())]
    Other(#[source] Status),
}

impl Error {
    /// The gRPC status code this error stands for.
    ///
    /// [`Error::Transport`] counts as `UNAVAILABLE` and [`Error::InvalidEndpoint`] as
    /// `INVALID_ARGUMENT`, matching how gRPC itself reports those conditions.
    pub fn code(&self) -> Code {
        match self {
            Error::InvalidArgument { .. } | Error::InvalidEndpoint { .. } => Code::InvalidArgument,
            Error::NotFound { .. } => Code::NotFound,
            Error::Busy { .. } => Code::ResourceExhausted,
            Error::LeaseEnded { .. } | Error::FailedPrecondition { .. } => Code::FailedPrecondition,
            Error::OutOfRange { .. } => Code::OutOfRange,
            Error::Superseded { .. } => Code::Aborted,
            Error::Unavailable { .. } | Error::Transport(_) => Code::Unavailable,
            Error::Other(status) => status.code(),
        }
    }

    /// Whether the same call may succeed if tried again later, unchanged: `UNAVAILABLE` and
    /// connection failures.
    ///
    /// [`Error::Busy`] is not counted: the partition is held by someone else, and waiting for it
    /// is what [`AcquireOptions::wait`](crate::AcquireOptions::wait) is for.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Error::Unavailable { .. } | Error::Transport(_))
    }

    /// Whether this says the lease ended without a Release ([`Error::LeaseEnded`]): the lease
    /// is gone for good and the caller must acquire a new one.
    ///
    /// A lease id no gateway knows is [`Error::NotFound`] instead, which is not counted here
    /// because `NOT_FOUND` from `Acquire` means an unknown topic or partition.
    pub fn is_lease_ended(&self) -> bool {
        matches!(self, Error::LeaseEnded { .. })
    }

    /// The message the gateway (or the transport) gave, without the variant's prefix.
    pub fn message(&self) -> String {
        match self {
            Error::InvalidArgument { message }
            | Error::NotFound { message }
            | Error::Busy { message }
            | Error::LeaseEnded { message }
            | Error::FailedPrecondition { message }
            | Error::OutOfRange { message }
            | Error::Superseded { message }
            | Error::Unavailable { message } => message.clone(),
            Error::InvalidEndpoint { source, .. } => source.to_string(),
            Error::Transport(source) => source.to_string(),
            Error::Other(status) => status.message().to_owned(),
        }
    }
}

/// Whether a `FAILED_PRECONDITION` message is the contract's "the lease ended" wording.
fn says_lease_ended(message: &str) -> bool {
    let lower = message.to_ascii_lowercase();
    lower.contains("lease lost") || lower.contains("lease expired")
}

impl From<Status> for Error {
    fn from(status: Status) -> Self {
        let message = || status.message().to_owned();
        match status.code() {
            Code::InvalidArgument => Error::InvalidArgument { message: message() },
            Code::NotFound => Error::NotFound { message: message() },
            Code::ResourceExhausted => Error::Busy { message: message() },
            Code::FailedPrecondition if says_lease_ended(status.message()) => {
                Error::LeaseEnded { message: message() }
            }
            Code::FailedPrecondition => Error::FailedPrecondition { message: message() },
            Code::OutOfRange => Error::OutOfRange { message: message() },
            Code::Aborted => Error::Superseded { message: message() },
            Code::Unavailable => Error::Unavailable { message: message() },
            _ => Error::Other(status),
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
            Error::InvalidArgument { message } if message == "ttl 0s: allowed 1s..=5m")
        );
        assert!(matches!(
            map(Code::NotFound, "no topic"),
            Error::NotFound { .. }
        ));
        assert!(matches!(
            map(Code::ResourceExhausted, "held by member x until ..."),
            Error::Busy { message } if message.contains("member x")
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
    fn failed_precondition_is_split_on_the_contract_wording() {
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
            Error::Other(status) => {
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
}
