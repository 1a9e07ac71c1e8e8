//! The single mapping from domain errors to `tonic::Status`: the code, the human message,
//! and the `google.rpc.ErrorInfo` and `RetryInfo` details the proto documents.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use tonic::{Code, Status};
use tonic_types::{ErrorDetail, ErrorInfo, RetryInfo, StatusExt};

use kafka_lease_proto::v1;

use crate::coordination::CoordinationError;
use crate::error::{EndReason, LeaseError};

/// The `google.rpc.ErrorInfo` domain of every error this service sends.
pub const ERROR_DOMAIN: &str = "kafka-lease";

/// The retry advice sent with UNAVAILABLE, and with PARTITION_BUSY when no holder's expiry
/// is known: long enough not to hammer a struggling Kafka or Consul, short enough that a
/// blip costs little.
pub(crate) const RETRY_DELAY: Duration = Duration::from_secs(1);

/// The shortest PARTITION_BUSY retry advice, so that a lease expiring right now does not
/// invite a busy loop (an active holder renews it anyway).
pub(crate) const MIN_BUSY_RETRY_DELAY: Duration = Duration::from_millis(100);

/// The single place where domain errors become gRPC statuses: the code, the human message,
/// and in the details a `google.rpc.ErrorInfo` (always) and a `google.rpc.RetryInfo` (where
/// the same call can succeed later), as `ErrorReason` in the proto documents them.
pub fn status_of(err: LeaseError) -> Status {
    status_at(err, SystemTime::now())
}

/// [`status_of`] as of `now`, which PARTITION_BUSY's retry delay is measured from.
pub(crate) fn status_at(err: LeaseError, now: SystemTime) -> Status {
    use v1::ErrorReason as R;
    let mut meta = HashMap::new();
    let mut put = |key: &str, value: String| {
        meta.insert(key.to_owned(), value);
    };
    let mut retry = None;
    let (code, reason) = match &err {
        LeaseError::NotAuthenticated(_) => (Code::Unauthenticated, R::NotAuthenticated),
        LeaseError::ActionDenied(denied) => {
            put("identity", denied.identity.clone());
            put("action", denied.action.to_owned());
            if let Some(group) = &denied.group {
                put("group", group.clone());
            }
            if let Some(topic) = &denied.topic {
                put("topic", topic.clone());
            }
            (Code::PermissionDenied, R::ActionDenied)
        }
        LeaseError::InvalidArgument { field, .. } => {
            put("field", (*field).to_owned());
            (Code::InvalidArgument, R::InvalidField)
        }
        LeaseError::TopicNotFound { topic } => {
            put("topic", topic.clone());
            (Code::NotFound, R::TopicNotFound)
        }
        LeaseError::PartitionNotFound {
            topic,
            partition,
            partition_count,
        } => {
            put("topic", topic.clone());
            put("partition", partition.to_string());
            put("partition_count", partition_count.to_string());
            (Code::NotFound, R::PartitionNotFound)
        }
        LeaseError::LeaseNotFound { lease_ref } | LeaseError::ReleaseOfEnded { lease_ref, .. } => {
            put("lease_ref", lease_ref.clone());
            (Code::NotFound, R::LeaseNotFound)
        }
        LeaseError::Busy { group, topic, busy } => {
            put("group", group.clone());
            put("topic", topic.clone());
            put("busy_partitions", busy.len().to_string());
            // The partition worth describing is the one that frees up first; where no expiry
            // is known (leases served elsewhere), the first one listed.
            let first = busy
                .iter()
                .filter_map(|b| b.expires_at.map(|at| (at, b)))
                .min_by_key(|(at, _)| *at);
            let shown = first.map(|(_, b)| b).or(busy.first());
            if let Some(b) = shown {
                put("partition", b.partition.to_string());
                if let Some(holder) = &b.holder {
                    put("holder_member", holder.member.clone());
                    put("holder_gateway", holder.gateway.clone());
                }
                if let Some(at) = b.expires_at {
                    put("expires_at", rfc3339(at));
                }
            }
            retry = Some(match first {
                Some((at, _)) => at
                    .duration_since(now)
                    .unwrap_or_default()
                    .max(MIN_BUSY_RETRY_DELAY),
                None => RETRY_DELAY,
            });
            (Code::ResourceExhausted, R::PartitionBusy)
        }
        LeaseError::WrongGateway { lease_ref, gateway } => {
            put("lease_ref", lease_ref.clone());
            put("gateway", gateway.clone());
            (Code::FailedPrecondition, R::WrongGateway)
        }
        LeaseError::LeaseEnded { lease_ref, reason } => {
            put("lease_ref", lease_ref.clone());
            match reason {
                EndReason::Released => (Code::FailedPrecondition, R::LeaseReleased),
                EndReason::Expired => (Code::FailedPrecondition, R::LeaseExpired),
                EndReason::Lost(_) => (Code::FailedPrecondition, R::LeaseLost),
                EndReason::Abandoned => (Code::FailedPrecondition, R::LeaseAbandoned),
                // No RetryInfo: the lease ended with its gateway, so no retry of a call on
                // it can succeed anywhere.
                EndReason::Shutdown => (Code::Unavailable, R::ShuttingDown),
            }
        }
        LeaseError::OffsetOutOfRange {
            topic,
            partition,
            offset,
            low,
            high,
        } => {
            put("topic", topic.clone());
            put("partition", partition.to_string());
            put("offset", offset.to_string());
            put("low", low.to_string());
            put("high", high.to_string());
            (Code::OutOfRange, R::OffsetOutOfRange)
        }
        LeaseError::Superseded { lease_ref } => {
            put("lease_ref", lease_ref.clone());
            (Code::Aborted, R::Superseded)
        }
        LeaseError::WrongMode {
            lease_ref, mode, ..
        } => {
            put("lease_ref", lease_ref.clone());
            put("mode", (*mode).to_owned());
            (Code::FailedPrecondition, R::WrongMode)
        }
        LeaseError::DeadLetterTopicNotFound { topic } => {
            put("topic", topic.clone());
            (Code::NotFound, R::TopicNotFound)
        }
        LeaseError::ShuttingDown => {
            retry = Some(RETRY_DELAY);
            (Code::Unavailable, R::ShuttingDown)
        }
        LeaseError::KafkaUnavailable { operation, .. } => {
            put("operation", (*operation).to_owned());
            retry = Some(RETRY_DELAY);
            (Code::Unavailable, R::KafkaUnavailable)
        }
        LeaseError::KafkaRefused {
            operation, denied, ..
        } => {
            put("operation", (*operation).to_owned());
            if *denied {
                (Code::PermissionDenied, R::KafkaDenied)
            } else {
                (Code::FailedPrecondition, R::KafkaRefused)
            }
        }
        LeaseError::LimitReached { flag, limit, .. } => {
            put("limit", (*flag).to_owned());
            put("value", limit.to_string());
            retry = Some(RETRY_DELAY);
            (Code::ResourceExhausted, R::LimitReached)
        }
        LeaseError::GatewayUnreachable {
            lease_ref,
            gateway,
            address,
            ..
        } => {
            put("lease_ref", lease_ref.clone());
            put("gateway", gateway.clone());
            put("address", address.clone());
            retry = Some(RETRY_DELAY);
            (Code::Unavailable, R::GatewayUnreachable)
        }
        LeaseError::MemberUnreachable(member) => {
            put("group", member.group.clone());
            put("member_id", member.member_id.clone());
            put("gateway", member.gateway.clone());
            put("address", member.address.clone());
            retry = Some(RETRY_DELAY);
            (Code::Unavailable, R::GatewayUnreachable)
        }
        LeaseError::MemberActive {
            group,
            topic,
            member_id,
        } => {
            put("group", group.clone());
            put("topic", topic.clone());
            put("member_id", member_id.clone());
            (Code::AlreadyExists, R::MemberActive)
        }
        LeaseError::Coordination(coordination) => {
            if let CoordinationError::Unavailable { operation, .. } = coordination {
                put("operation", (*operation).to_owned());
            }
            retry = Some(RETRY_DELAY);
            (Code::Unavailable, R::ConsulUnavailable)
        }
    };
    // ErrorInfo first: it is what every reader looks for, and tools print details in order.
    let mut details = vec![ErrorDetail::ErrorInfo(ErrorInfo::new(
        reason.as_str_name(),
        ERROR_DOMAIN,
        meta,
    ))];
    if let Some(delay) = retry {
        details.push(ErrorDetail::RetryInfo(RetryInfo::new(Some(whole_millis(
            delay,
        )))));
    }
    Status::with_error_details_vec(code, err.to_string(), details)
}

/// `d` rounded up to whole milliseconds: finer advice is noise, and rounding up never
/// advises retrying before the holder's expiry.
pub(crate) fn whole_millis(d: Duration) -> Duration {
    let millis = d.as_nanos().div_ceil(1_000_000);
    Duration::from_millis(u64::try_from(millis).unwrap_or(u64::MAX))
}

pub(crate) fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_maps_to_its_documented_code() {
        let cases: Vec<(LeaseError, Code)> = vec![
            (
                LeaseError::InvalidArgument {
                    field: "group",
                    message: "x".into(),
                },
                Code::InvalidArgument,
            ),
            (
                LeaseError::TopicNotFound { topic: "t".into() },
                Code::NotFound,
            ),
            (
                LeaseError::PartitionNotFound {
                    topic: "t".into(),
                    partition: 9,
                    partition_count: 4,
                },
                Code::NotFound,
            ),
            (
                LeaseError::LeaseNotFound {
                    lease_ref: "r".into(),
                },
                Code::NotFound,
            ),
            (
                LeaseError::Busy {
                    group: "g".into(),
                    topic: "t".into(),
                    busy: vec![],
                },
                Code::ResourceExhausted,
            ),
            (
                LeaseError::WrongGateway {
                    lease_ref: "r".into(),
                    gateway: "b".into(),
                },
                Code::FailedPrecondition,
            ),
            (
                LeaseError::LeaseEnded {
                    lease_ref: "r".into(),
                    reason: EndReason::Expired,
                },
                Code::FailedPrecondition,
            ),
            (
                LeaseError::LeaseEnded {
                    lease_ref: "r".into(),
                    reason: EndReason::Abandoned,
                },
                Code::FailedPrecondition,
            ),
            (
                LeaseError::LeaseEnded {
                    lease_ref: "r".into(),
                    reason: EndReason::Shutdown,
                },
                Code::Unavailable,
            ),
            (
                LeaseError::OffsetOutOfRange {
                    topic: "t".into(),
                    partition: 0,
                    offset: 99,
                    low: 0,
                    high: 10,
                },
                Code::OutOfRange,
            ),
            (
                LeaseError::Superseded {
                    lease_ref: "r".into(),
                },
                Code::Aborted,
            ),
            (LeaseError::ShuttingDown, Code::Unavailable),
            (
                LeaseError::KafkaUnavailable {
                    operation: "x",
                    detail: "y".into(),
                },
                Code::Unavailable,
            ),
            (
                LeaseError::KafkaRefused {
                    operation: "x",
                    detail: "y".into(),
                    denied: true,
                },
                Code::PermissionDenied,
            ),
            (
                LeaseError::KafkaRefused {
                    operation: "x",
                    detail: "y".into(),
                    denied: false,
                },
                Code::FailedPrecondition,
            ),
        ];
        for (err, code) in cases {
            let text = err.to_string();
            let status = status_of(err);
            assert_eq!(status.code(), code, "{text}");
            assert_eq!(status.message(), text);
        }
    }

    #[test]
    fn messages_carry_the_values_and_ranges() {
        let status = status_of(LeaseError::OffsetOutOfRange {
            topic: "orders".into(),
            partition: 2,
            offset: 99,
            low: 5,
            high: 10,
        });
        assert!(status.message().contains("99") && status.message().contains("5 ..= 10"));
        let expired = status_of(LeaseError::LeaseEnded {
            lease_ref: "r".into(),
            reason: EndReason::Expired,
        });
        assert!(
            expired.message().contains("lease expired"),
            "{}",
            expired.message()
        );
        let lost = status_of(LeaseError::LeaseEnded {
            lease_ref: "r".into(),
            reason: EndReason::Lost("session invalidated".into()),
        });
        assert!(lost.message().contains("lease lost"), "{}", lost.message());
    }

    /// The ErrorInfo and RetryInfo a client decodes from `status`'s details.
    fn decoded(status: &Status) -> (String, HashMap<String, String>, Option<Duration>) {
        let details = status.check_error_details().expect("details decode");
        let info = details
            .error_info()
            .expect("every status carries ErrorInfo");
        assert_eq!(info.domain, "kafka-lease");
        let retry = details
            .retry_info()
            .map(|r| r.retry_delay.expect("a delay"));
        (info.reason.clone(), info.metadata.clone(), retry)
    }

    fn meta(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn every_status_carries_error_info_with_its_documented_reason() {
        let ended = |reason| LeaseError::LeaseEnded {
            lease_ref: "r1".into(),
            reason,
        };
        let cases: Vec<(LeaseError, &str, bool)> = vec![
            (
                LeaseError::InvalidArgument {
                    field: "ttl",
                    message: "x".into(),
                },
                "INVALID_FIELD",
                false,
            ),
            (
                LeaseError::TopicNotFound { topic: "t".into() },
                "TOPIC_NOT_FOUND",
                false,
            ),
            (
                LeaseError::LeaseNotFound {
                    lease_ref: "r1".into(),
                },
                "LEASE_NOT_FOUND",
                false,
            ),
            (
                LeaseError::WrongGateway {
                    lease_ref: "r1".into(),
                    gateway: "gw-b".into(),
                },
                "WRONG_GATEWAY",
                false,
            ),
            (ended(EndReason::Released), "LEASE_RELEASED", false),
            (ended(EndReason::Expired), "LEASE_EXPIRED", false),
            (ended(EndReason::Lost("gone".into())), "LEASE_LOST", false),
            (ended(EndReason::Abandoned), "LEASE_ABANDONED", false),
            (ended(EndReason::Shutdown), "SHUTTING_DOWN", false),
            (
                LeaseError::Superseded {
                    lease_ref: "r1".into(),
                },
                "SUPERSEDED",
                false,
            ),
            (LeaseError::ShuttingDown, "SHUTTING_DOWN", true),
            (
                LeaseError::KafkaUnavailable {
                    operation: "fetch metadata",
                    detail: "y".into(),
                },
                "KAFKA_UNAVAILABLE",
                true,
            ),
            (
                LeaseError::Coordination(CoordinationError::NoSession { reason: "z".into() }),
                "CONSUL_UNAVAILABLE",
                true,
            ),
            (
                LeaseError::KafkaRefused {
                    operation: "committing an offset",
                    detail: "GroupAuthorizationFailed".into(),
                    denied: true,
                },
                "KAFKA_DENIED",
                false,
            ),
            (
                LeaseError::KafkaRefused {
                    operation: "committing an offset",
                    detail: "InvalidGroupId".into(),
                    denied: false,
                },
                "KAFKA_REFUSED",
                false,
            ),
            (
                LeaseError::LimitReached {
                    flag: "--max-leases",
                    limit: 3,
                    what: "full".into(),
                },
                "LIMIT_REACHED",
                true,
            ),
        ];
        for (err, want_reason, want_retry) in cases {
            let text = err.to_string();
            let status = status_of(err);
            assert_eq!(status.message(), text, "the message stays human text");
            let (reason, _, retry) = decoded(&status);
            assert_eq!(reason, want_reason, "{text}");
            assert_eq!(retry.is_some(), want_retry, "{text}");
            assert_eq!(
                v1::ErrorReason::from_str_name(&reason).map(|r| r.as_str_name()),
                Some(want_reason),
                "the reason string is an ErrorReason value's name"
            );
        }
    }

    #[test]
    fn lease_errors_name_the_lease() {
        let (reason, metadata, retry) = decoded(&status_of(LeaseError::LeaseEnded {
            lease_ref: "r1".into(),
            reason: EndReason::Lost("session invalidated".into()),
        }));
        assert_eq!(reason, "LEASE_LOST");
        assert_eq!(metadata, meta(&[("lease_ref", "r1")]));
        assert_eq!(retry, None);

        let (reason, metadata, _) = decoded(&status_of(LeaseError::WrongGateway {
            lease_ref: "r1".into(),
            gateway: "gw-b".into(),
        }));
        assert_eq!(reason, "WRONG_GATEWAY");
        assert_eq!(metadata, meta(&[("lease_ref", "r1"), ("gateway", "gw-b")]));
    }

    #[test]
    fn offset_out_of_range_carries_the_valid_range() {
        let status = status_of(LeaseError::OffsetOutOfRange {
            topic: "orders".into(),
            partition: 2,
            offset: 99,
            low: 5,
            high: 10,
        });
        assert_eq!(status.code(), Code::OutOfRange);
        let (reason, metadata, retry) = decoded(&status);
        assert_eq!(reason, "OFFSET_OUT_OF_RANGE");
        assert_eq!(
            metadata,
            meta(&[
                ("topic", "orders"),
                ("partition", "2"),
                ("offset", "99"),
                ("low", "5"),
                ("high", "10"),
            ])
        );
        assert_eq!(retry, None);
    }

    #[test]
    fn invalid_argument_and_not_found_name_the_culprit() {
        let (_, metadata, _) = decoded(&status_of(LeaseError::InvalidArgument {
            field: "max_bytes",
            message: "too big".into(),
        }));
        assert_eq!(metadata, meta(&[("field", "max_bytes")]));
        let (reason, metadata, _) = decoded(&status_of(LeaseError::PartitionNotFound {
            topic: "t".into(),
            partition: 9,
            partition_count: 4,
        }));
        assert_eq!(reason, "PARTITION_NOT_FOUND");
        assert_eq!(
            metadata,
            meta(&[("topic", "t"), ("partition", "9"), ("partition_count", "4")])
        );
    }

    fn holder(member: &str, gateway: &str) -> crate::coordination::HolderInfo {
        crate::coordination::HolderInfo {
            member: member.into(),
            gateway: gateway.into(),
            lease_ref: "r".into(),
            acquired_at_ms: 1_700_000_000_000,
            ttl_ms: 10_000,
            address: String::new(),
            subscriber: String::new(),
        }
    }

    #[test]
    fn busy_names_the_partition_that_frees_first_and_advises_waiting_for_it() {
        use crate::error::BusyPartition;
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let status = status_at(
            LeaseError::Busy {
                group: "g".into(),
                topic: "t".into(),
                busy: vec![
                    BusyPartition {
                        partition: 0,
                        holder: Some(holder("elsewhere", "gw-b")),
                        expires_at: None,
                    },
                    BusyPartition {
                        partition: 1,
                        holder: Some(holder("late", "gw-a")),
                        expires_at: Some(now + Duration::from_secs(9)),
                    },
                    BusyPartition {
                        partition: 2,
                        holder: Some(holder("soon", "gw-a")),
                        expires_at: Some(now + Duration::from_millis(2500)),
                    },
                ],
            },
            now,
        );
        assert_eq!(status.code(), Code::ResourceExhausted);
        let (reason, metadata, retry) = decoded(&status);
        assert_eq!(reason, "PARTITION_BUSY");
        assert_eq!(
            metadata,
            meta(&[
                ("group", "g"),
                ("topic", "t"),
                ("busy_partitions", "3"),
                ("partition", "2"),
                ("holder_member", "soon"),
                ("holder_gateway", "gw-a"),
                ("expires_at", "2023-11-14T22:13:22.500Z"),
            ])
        );
        assert_eq!(retry, Some(Duration::from_millis(2500)));
    }

    #[test]
    fn busy_without_a_known_expiry_advises_a_default_delay() {
        use crate::error::BusyPartition;
        let (_, metadata, retry) = decoded(&status_of(LeaseError::Busy {
            group: "g".into(),
            topic: "t".into(),
            busy: vec![BusyPartition {
                partition: 3,
                holder: Some(holder("w1", "gw-b")),
                expires_at: None,
            }],
        }));
        assert_eq!(metadata.get("partition").map(String::as_str), Some("3"));
        assert_eq!(
            metadata.get("holder_member").map(String::as_str),
            Some("w1")
        );
        assert!(!metadata.contains_key("expires_at"));
        assert_eq!(retry, Some(RETRY_DELAY));
    }

    #[test]
    fn retry_advice_is_rounded_up_to_whole_milliseconds() {
        assert_eq!(
            whole_millis(Duration::from_nanos(29_971_218_513)),
            Duration::from_millis(29_972)
        );
        assert_eq!(whole_millis(Duration::from_secs(1)), Duration::from_secs(1));
        assert_eq!(whole_millis(Duration::ZERO), Duration::ZERO);
    }

    #[test]
    fn error_info_comes_first_in_the_details() {
        let status = status_of(LeaseError::ShuttingDown);
        let details = status.check_error_details_vec().expect("details decode");
        assert!(
            matches!(
                details.as_slice(),
                [ErrorDetail::ErrorInfo(_), ErrorDetail::RetryInfo(_)]
            ),
            "{details:?}"
        );
    }

    #[test]
    fn unavailable_advises_a_retry() {
        let status = status_of(LeaseError::Coordination(CoordinationError::Unavailable {
            operation: "acquire lock",
            detail: "connection refused".into(),
        }));
        assert_eq!(status.code(), Code::Unavailable);
        let (reason, metadata, retry) = decoded(&status);
        assert_eq!(reason, "CONSUL_UNAVAILABLE");
        assert_eq!(metadata, meta(&[("operation", "acquire lock")]));
        assert_eq!(retry, Some(Duration::from_secs(1)));
    }
}
