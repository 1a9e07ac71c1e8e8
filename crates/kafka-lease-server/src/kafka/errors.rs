//! What a librdkafka error means to the caller (unavailable, refused, or a transient broker
//! state worth retrying), and running blocking librdkafka calls off the reactor: [`blocking`],
//! [`retrying`].

use std::sync::Arc;
use std::time::Duration;

use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use crate::error::LeaseError;

pub(super) fn unavailable(operation: &'static str, err: impl std::fmt::Display) -> LeaseError {
    metrics::counter!(crate::metrics::KAFKA_ERRORS, "operation" => operation).increment(1);
    LeaseError::KafkaUnavailable {
        operation,
        detail: err.to_string(),
    }
}

pub(super) async fn blocking<T: Send + 'static>(
    operation: &'static str,
    f: impl FnOnce() -> Result<T, LeaseError> + Send + 'static,
) -> Result<T, LeaseError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| unavailable(operation, format!("blocking task failed: {e}")))?
}

/// Broker states that clear by themselves within seconds: a coordinator or partition leader
/// that is loading, moving or not elected yet (a freshly started broker loading its offsets
/// topic answers NOT_COORDINATOR and COORDINATOR_LOAD_IN_PROGRESS for a while), and requests
/// lost with a connection. Kafka's own clients retry these; so does the gateway, within the
/// request's deadline, instead of handing the caller an error it can do nothing about.
///
/// librdkafka's own "unknown partition" too: a broker that has just started answers
/// metadata without the topic's partitions for a moment, and a request for one of them
/// fails locally. The gateway asks only for partitions it has checked against the topic's
/// partition count, so the state clears with the next metadata refresh.
fn is_transient(err: &KafkaError) -> bool {
    use RDKafkaErrorCode as C;
    matches!(
        err.rdkafka_error_code(),
        Some(
            C::UnknownPartition
                | C::NotCoordinator
                | C::CoordinatorLoadInProgress
                | C::CoordinatorNotAvailable
                | C::LeaderNotAvailable
                | C::NotLeaderForPartition
                | C::RequestTimedOut
                | C::NetworkException
                | C::BrokerTransportFailure
                | C::AllBrokersDown
                | C::OperationTimedOut
        )
    )
}

/// One failed attempt at a broker request, and whether trying again may succeed.
pub(super) struct Failure {
    error: LeaseError,
    transient: bool,
}

impl Failure {
    pub(super) fn kafka(operation: &'static str, err: KafkaError) -> Self {
        Failure {
            transient: is_transient(&err),
            error: kafka_error(operation, err),
        }
    }
}

/// What a librdkafka error means to the caller. A broker's refusal that no retry can mend
/// (an authorization failure, a malformed request) is not UNAVAILABLE, which the contract
/// calls safe to retry: a client would retry it forever. Everything else (the connection,
/// timeouts, broker states that clear) is.
pub(super) fn kafka_error(operation: &'static str, err: KafkaError) -> LeaseError {
    use RDKafkaErrorCode as C;
    let (refused, denied) = match err.rdkafka_error_code() {
        Some(
            C::TopicAuthorizationFailed
            | C::GroupAuthorizationFailed
            | C::ClusterAuthorizationFailed
            | C::TransactionalIdAuthorizationFailed
            | C::DelegationTokenAuthorizationFailed
            | C::SaslAuthenticationFailed,
        ) => (true, true),
        Some(
            C::OffsetMetadataTooLarge
            | C::InvalidCommitOffsetSize
            | C::InvalidTopic
            | C::InvalidGroupId
            | C::IllegalGeneration
            | C::UnknownMemberId
            | C::UnsupportedVersion
            | C::InvalidRequest
            | C::InvalidPartitions
            | C::GroupIdNotFound,
        ) => (true, false),
        _ => (false, false),
    };
    if refused {
        metrics::counter!(crate::metrics::KAFKA_ERRORS, "operation" => operation).increment(1);
        LeaseError::KafkaRefused {
            operation,
            detail: err.to_string(),
            denied,
        }
    } else {
        unavailable(operation, err)
    }
}

impl From<LeaseError> for Failure {
    fn from(error: LeaseError) -> Self {
        Failure {
            error,
            transient: false,
        }
    }
}

/// Runs a blocking broker request on the blocking pool, again and again while it fails with
/// a transient broker state, until `budget` has passed since the first attempt. The last
/// error is returned once the budget is spent.
pub(super) async fn retrying<T: Send + 'static>(
    operation: &'static str,
    budget: Duration,
    f: impl Fn() -> Result<T, Failure> + Send + Sync + 'static,
) -> Result<T, LeaseError> {
    let f = Arc::new(f);
    let deadline = tokio::time::Instant::now() + budget;
    let mut pause = Duration::from_millis(50);
    loop {
        let attempt = f.clone();
        let outcome = tokio::task::spawn_blocking(move || attempt())
            .await
            .map_err(|e| unavailable(operation, format!("blocking task failed: {e}")))?;
        match outcome {
            Ok(value) => return Ok(value),
            Err(failure) if failure.transient && tokio::time::Instant::now() + pause < deadline => {
                tracing::debug!(
                    operation,
                    error = %failure.error,
                    retry_in = ?pause,
                    "transient broker state; retrying",
                );
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(500));
            }
            Err(failure) => return Err(failure.error),
        }
    }
}
