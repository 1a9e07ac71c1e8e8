//! Requests into domain values (validated) and domain values into responses: the proto
//! boundary of the lease service.

use std::time::SystemTime;

use tonic_types::StatusExt;

use kafka_lease_proto::v1;
use kafka_lease_proto::wire::EncodedSubscribeResponse;

use futures::StreamExt;

use crate::coordination::{from_unix_ms, LockKey};
use crate::error::LeaseError;
use crate::gateway::{AcquireSpec, Granted, ListedLease, ListedMember, Reset, SeekTarget};
use crate::lease::{
    Ack, AckKind, AckOutcome, DeliverStream, Delivered, LeaseSnapshot, QueueSnapshot, ReadBatch,
    ReadLimits, ReadStream, SeekEpoch,
};
use crate::queue::QueueSettings;
use crate::queue::{Order, Window};
use crate::subscribe::{Ended, SubscribeQueue, SubscribeSpec, SubscriptionEvent};
use crate::validate;

use super::forward::{DeliverResponses, ReadResponses};
use super::status::*;

pub(crate) fn timestamp(t: SystemTime) -> prost_types::Timestamp {
    let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    prost_types::Timestamp {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    }
}

pub(crate) fn proto_duration(d: std::time::Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    }
}

/// Converts a lease's public parts into the ListLeases row.
pub(crate) fn lease_info(listed: &ListedLease) -> v1::LeaseInfo {
    let local = listed.local.as_ref();
    v1::LeaseInfo {
        group: listed.key.group.clone(),
        topic: listed.key.topic.clone(),
        partition: listed.key.partition,
        member: listed.holder.member.clone(),
        fencing_token: listed.token.get(),
        acquired_at: Some(timestamp(listed.holder.acquired_at())),
        expires_at: local.map(|l| timestamp(l.expires_at)),
        gateway: listed.holder.gateway.clone(),
        position: local.map(|l| l.position),
        committed_offset: local.and_then(|l| l.committed),
        high_watermark: local.map(|l| l.high_watermark),
        lag: local.and_then(LeaseSnapshot::lag),
        read_lag: local.map(LeaseSnapshot::read_lag),
        details_unavailable: String::new(),
        gateway_address: listed.holder.address.clone(),
        member_id: listed.holder.subscriber.clone(),
        queue: local.and_then(|l| l.queue.as_ref()).map(queue_info),
    }
}

fn queue_info(queue: &QueueSnapshot) -> v1::QueueInfo {
    v1::QueueInfo {
        ordering: delivery_order(queue.settings.queue.order) as i32,
        in_flight: queue.in_flight as u32,
        oldest_in_flight: queue.oldest_in_flight.map(proto_duration),
        waiting: queue.waiting as u32,
        deliveries: queue.deliveries,
        redeliveries: queue.redeliveries,
        dead_letters: queue.dead_letters,
        dead_letter_topic: queue.settings.dead_letter_topic.clone(),
        progress_age: Some(proto_duration(queue.progress_age)),
        done_not_committed: queue.done_not_committed,
    }
}

fn delivery_order(order: Order) -> v1::DeliveryOrder {
    match order {
        Order::Partition => v1::DeliveryOrder::Partition,
        Order::Key => v1::DeliveryOrder::Key,
        Order::Unordered => v1::DeliveryOrder::Unordered,
    }
}

/// A Deliver's settings, validated, with the dead letter topic it names (`None`: the
/// default rule's, which depends on the lease).
pub(crate) fn deliver_spec(
    req: &v1::DeliverRequest,
) -> Result<(QueueSettings, Option<String>), LeaseError> {
    validate::lease_id(&req.lease_id)?;
    queue_settings_of(&v1::QueueSettings {
        ordering: req.ordering,
        max_in_flight: req.max_in_flight,
        max_in_flight_bytes: req.max_in_flight_bytes,
        ack_deadline: req.ack_deadline,
        max_deliveries: req.max_deliveries,
        dead_letter_topic: req.dead_letter_topic.clone(),
    })
}

/// Queue settings (a Deliver's, or a Subscribe's `queue`), validated, with the dead letter
/// topic they name.
pub(crate) fn queue_settings_of(
    req: &v1::QueueSettings,
) -> Result<(QueueSettings, Option<String>), LeaseError> {
    let order = match v1::DeliveryOrder::try_from(req.ordering) {
        Ok(v1::DeliveryOrder::Unspecified | v1::DeliveryOrder::Partition) => Order::Partition,
        Ok(v1::DeliveryOrder::Key) => Order::Key,
        Ok(v1::DeliveryOrder::Unordered) => Order::Unordered,
        Err(_) => {
            return Err(LeaseError::InvalidArgument {
                field: "ordering",
                message: format!(
                    "ordering {} is not a DeliveryOrder; allowed DELIVERY_ORDER_PARTITION (1, \
                     the default), DELIVERY_ORDER_KEY (2), DELIVERY_ORDER_UNORDERED (3)",
                    req.ordering
                ),
            })
        }
    };
    let max_records = validate::count_in(
        "max_in_flight",
        req.max_in_flight,
        validate::DEFAULT_MAX_IN_FLIGHT,
        validate::MAX_MAX_IN_FLIGHT,
    )? as usize;
    let max_bytes = validate::count_in(
        "max_in_flight_bytes",
        req.max_in_flight_bytes,
        validate::DEFAULT_MAX_IN_FLIGHT_BYTES,
        validate::MAX_MAX_IN_FLIGHT_BYTES,
    )? as usize;
    let ack_deadline = validate::duration_in(
        "ack_deadline",
        req.ack_deadline.as_ref(),
        validate::DEFAULT_ACK_DEADLINE,
        validate::MIN_ACK_DEADLINE,
        validate::MAX_ACK_DEADLINE,
    )?;
    let max_deliveries = validate::count_in(
        "max_deliveries",
        req.max_deliveries,
        validate::DEFAULT_MAX_DELIVERIES,
        validate::MAX_MAX_DELIVERIES,
    )?;
    let dead_letter_topic = if req.dead_letter_topic.is_empty() {
        None
    } else {
        validate::topic_field("dead_letter_topic", &req.dead_letter_topic)?;
        Some(req.dead_letter_topic.clone())
    };
    Ok((
        QueueSettings {
            order,
            window: Window {
                max_records,
                max_bytes,
            },
            ack_deadline,
            max_deliveries,
        },
        dead_letter_topic,
    ))
}

/// An Acknowledge's answers, validated.
pub(crate) fn acks_of(req: &v1::AcknowledgeRequest) -> Result<Vec<Ack>, LeaseError> {
    validate::lease_id(&req.lease_id)?;
    if req.acknowledgements.len() > validate::MAX_ACKNOWLEDGEMENTS {
        return Err(LeaseError::InvalidArgument {
            field: "acknowledgements",
            message: format!(
                "{} acknowledgements in one call; allowed at most {}",
                req.acknowledgements.len(),
                validate::MAX_ACKNOWLEDGEMENTS
            ),
        });
    }
    req.acknowledgements
        .iter()
        .enumerate()
        .map(|(i, a)| {
            if a.offset < 0 {
                return Err(LeaseError::InvalidArgument {
                    field: "offset",
                    message: format!(
                        "acknowledgements[{i}].offset {} is negative; an offset is 0 or more",
                        a.offset
                    ),
                });
            }
            if a.reason.len() > validate::MAX_REASON_BYTES {
                return Err(LeaseError::InvalidArgument {
                    field: "reason",
                    message: format!(
                        "acknowledgements[{i}].reason is {} bytes; allowed at most {}",
                        a.reason.len(),
                        validate::MAX_REASON_BYTES
                    ),
                });
            }
            let kind = match v1::AckType::try_from(a.r#type) {
                Ok(v1::AckType::Accept) => AckKind::Accept,
                Ok(v1::AckType::Retry) => AckKind::Retry {
                    delay: validate::duration_in(
                        "retry_delay",
                        a.retry_delay.as_ref(),
                        std::time::Duration::ZERO,
                        std::time::Duration::ZERO,
                        validate::MAX_RETRY_DELAY,
                    )?,
                    reason: a.reason.clone(),
                },
                Ok(v1::AckType::Reject) => AckKind::Reject {
                    reason: a.reason.clone(),
                },
                Ok(v1::AckType::Renew) => AckKind::Renew,
                Ok(v1::AckType::Unspecified) | Err(_) => {
                    return Err(LeaseError::InvalidArgument {
                        field: "type",
                        message: format!(
                            "acknowledgements[{i}].type {} is not an answer; allowed \
                             ACK_TYPE_ACCEPT (1), ACK_TYPE_RETRY (2), ACK_TYPE_REJECT (3), \
                             ACK_TYPE_RENEW (4)",
                            a.r#type
                        ),
                    })
                }
            };
            Ok(Ack {
                offset: a.offset,
                attempt: (a.attempt != 0).then_some(a.attempt),
                kind,
            })
        })
        .collect()
}

/// Acknowledge's answer: an outcome per acknowledgement, in order.
pub(crate) fn acknowledge_response(outcomes: Vec<AckOutcome>) -> v1::AcknowledgeResponse {
    v1::AcknowledgeResponse {
        outcomes: outcomes
            .into_iter()
            .map(|outcome| match outcome {
                AckOutcome::Applied => v1::AckOutcome::Applied as i32,
                AckOutcome::Stale => v1::AckOutcome::Stale as i32,
                AckOutcome::NotDelivered => v1::AckOutcome::NotDelivered as i32,
            })
            .collect(),
    }
}

pub(crate) fn acquire_spec(
    req: &v1::AcquireRequest,
    via: Option<std::net::SocketAddr>,
) -> Result<AcquireSpec, LeaseError> {
    validate::group(&req.group)?;
    validate::topic(&req.topic)?;
    validate::member(&req.member)?;
    let partition = validate::partition(req.partition)?;
    let ttl = validate::duration_in(
        "ttl",
        req.ttl.as_ref(),
        validate::DEFAULT_TTL,
        validate::MIN_TTL,
        validate::MAX_TTL,
    )?;
    let wait = validate::duration_in(
        "wait",
        req.wait.as_ref(),
        std::time::Duration::ZERO,
        std::time::Duration::ZERO,
        validate::MAX_WAIT,
    )?;
    let reset = reset_of(req.offset_reset)?;
    Ok(AcquireSpec {
        group: req.group.clone(),
        topic: req.topic.clone(),
        partition,
        member: req.member.clone(),
        ttl,
        wait,
        reset,
        via,
        subscriber: String::new(),
        owner: None,
    })
}

pub(crate) fn read_limits(req: &v1::ReadRequest) -> Result<ReadLimits, LeaseError> {
    validate::lease_id(&req.lease_id)?;
    limits_of(req.max_records, req.max_bytes, req.max_wait.as_ref())
}

pub(crate) fn limits_of(
    max_records: u32,
    max_bytes: u32,
    max_wait: Option<&prost_types::Duration>,
) -> Result<ReadLimits, LeaseError> {
    Ok(ReadLimits {
        max_records: validate::count_in(
            "max_records",
            max_records,
            validate::DEFAULT_MAX_RECORDS,
            validate::MAX_MAX_RECORDS,
        )? as usize,
        max_bytes: validate::count_in(
            "max_bytes",
            max_bytes,
            validate::DEFAULT_MAX_BYTES,
            validate::MAX_MAX_BYTES,
        )? as usize,
        max_wait: validate::duration_in(
            "max_wait",
            max_wait,
            validate::DEFAULT_MAX_WAIT,
            std::time::Duration::ZERO,
            validate::MAX_MAX_WAIT,
        )?,
    })
}

pub(crate) fn reset_of(reset: i32) -> Result<Reset, LeaseError> {
    match v1::OffsetReset::try_from(reset) {
        Ok(v1::OffsetReset::Unspecified | v1::OffsetReset::Earliest) => Ok(Reset::Earliest),
        Ok(v1::OffsetReset::Latest) => Ok(Reset::Latest),
        Err(_) => Err(LeaseError::InvalidArgument {
            field: "offset_reset",
            message: format!(
                "offset_reset {reset} is not an OffsetReset; allowed OFFSET_RESET_UNSPECIFIED \
                 (0, the default: earliest), OFFSET_RESET_EARLIEST (1), OFFSET_RESET_LATEST (2)"
            ),
        }),
    }
}

/// The most topics one Subscribe may name.
pub(crate) const MAX_SUBSCRIBED_TOPICS: usize = 16;
/// The revoke grace when the request names none, and the longest allowed.
pub(crate) const DEFAULT_REVOKE_GRACE: std::time::Duration = std::time::Duration::from_secs(5);
pub(crate) const MAX_REVOKE_GRACE: std::time::Duration = std::time::Duration::from_secs(60);
/// The longest a detached member keeps its leases.
pub(crate) const MAX_SESSION_GRACE: std::time::Duration = std::time::Duration::from_secs(300);

pub(crate) fn subscribe_spec(req: &v1::SubscribeRequest) -> Result<SubscribeSpec, LeaseError> {
    validate::group(&req.group)?;
    if req.topics.is_empty() || req.topics.len() > MAX_SUBSCRIBED_TOPICS {
        return Err(LeaseError::InvalidArgument {
            field: "topics",
            message: format!(
                "{} topics given; allowed 1 ..= {MAX_SUBSCRIBED_TOPICS}",
                req.topics.len()
            ),
        });
    }
    let mut seen = std::collections::HashSet::new();
    for topic in &req.topics {
        validate::topic(topic)?;
        if !seen.insert(topic.as_str()) {
            return Err(LeaseError::InvalidArgument {
                field: "topics",
                message: format!("topic {topic:?} is named twice; name each topic once"),
            });
        }
    }
    validate::member(&req.member)?;
    validate::member_id(&req.member_id)?;
    Ok(SubscribeSpec {
        group: req.group.clone(),
        topics: req.topics.clone(),
        member: req.member.clone(),
        member_id: req.member_id.clone(),
        limits: limits_of(req.max_records, req.max_bytes, req.max_wait.as_ref())?,
        reset: reset_of(req.offset_reset)?,
        max_partitions: req.max_partitions,
        revoke_grace: validate::duration_in(
            "revoke_grace",
            req.revoke_grace.as_ref(),
            DEFAULT_REVOKE_GRACE,
            std::time::Duration::ZERO,
            MAX_REVOKE_GRACE,
        )?,
        session_grace: validate::duration_in(
            "session_grace",
            req.session_grace.as_ref(),
            std::time::Duration::ZERO,
            std::time::Duration::ZERO,
            MAX_SESSION_GRACE,
        )?,
        owner: None,
        queue: match &req.queue {
            None => None,
            Some(queue) => {
                let (settings, asked_dead_letter_topic) = queue_settings_of(queue)?;
                Some(SubscribeQueue {
                    settings,
                    asked_dead_letter_topic,
                    dead_letter_topics: Default::default(),
                })
            }
        },
    })
}

/// A subscription event as the wire carries it. A records event's records are sent as the
/// Read path encoded them.
pub(crate) fn subscribe_response(event: SubscriptionEvent) -> EncodedSubscribeResponse {
    use v1::subscribe_response::Event;
    let event = match event {
        SubscriptionEvent::Joined { member_id, gateway } => {
            Event::Joined(v1::Joined { member_id, gateway })
        }
        SubscriptionEvent::Assigned(granted) => Event::Assigned(assigned(granted)),
        SubscriptionEvent::Records {
            lease_id,
            topic,
            partition,
            batch,
        } => {
            return batch.records.into_subscribed(
                lease_id.as_str(),
                &topic,
                partition,
                batch.seek_epoch.get(),
                batch.high_watermark,
            )
        }
        SubscriptionEvent::Deliveries {
            lease_id,
            topic,
            partition,
            delivered,
        } => {
            return delivered.batch.into_subscribed(
                lease_id.as_str(),
                &topic,
                partition,
                delivered.high_watermark,
            )
        }
        SubscriptionEvent::Revoking {
            lease_id,
            topic,
            partition,
            deadline,
        } => Event::Revoking(v1::Revoking {
            lease_id: lease_id.into_string(),
            topic,
            partition,
            deadline: Some(timestamp(deadline)),
        }),
        SubscriptionEvent::Revoked {
            lease_id,
            topic,
            partition,
            why,
        } => {
            let (reason, message) = match why {
                Ended::Revoked => (
                    v1::ErrorReason::LeaseRevoked.as_str_name().to_string(),
                    format!(
                        "lease {:?} moved to another member of the group",
                        lease_id.reference()
                    ),
                ),
                Ended::Other(err) => {
                    let status = status_of(err);
                    let reason = status
                        .get_details_error_info()
                        .map(|info| info.reason)
                        .unwrap_or_default();
                    (reason, status.message().to_string())
                }
            };
            Event::Revoked(v1::Revoked {
                lease_id: lease_id.into_string(),
                topic,
                partition,
                reason,
                message,
            })
        }
    };
    EncodedSubscribeResponse::from_message(&v1::SubscribeResponse { event: Some(event) })
}

pub(crate) fn seek_target(req: &v1::SeekRequest) -> Result<SeekTarget, LeaseError> {
    use v1::seek_request::Position;
    validate::lease_id(&req.lease_id)?;
    match &req.position {
        None => Err(LeaseError::InvalidArgument {
            field: "position",
            message: "no position given; set one of offset, timestamp, earliest, latest, committed"
                .into(),
        }),
        Some(Position::Offset(offset)) => Ok(SeekTarget::Offset(*offset)),
        Some(Position::Timestamp(ts)) => Ok(SeekTarget::TimestampMs(validate::timestamp_ms(
            "timestamp",
            ts,
        )?)),
        Some(Position::Earliest(())) => Ok(SeekTarget::Earliest),
        Some(Position::Latest(())) => Ok(SeekTarget::Latest),
        Some(Position::Committed(())) => Ok(SeekTarget::Committed),
    }
}

/// One page of a listing: the first `size` leases after `after` in (group, topic,
/// partition) order, and the key to continue after when more follow.
pub(crate) fn page_of(
    mut listed: Vec<ListedLease>,
    after: Option<&LockKey>,
    size: usize,
) -> (Vec<ListedLease>, Option<LockKey>) {
    listed.sort_by(|a, b| a.key.cmp(&b.key));
    let mut page: Vec<ListedLease> = listed
        .into_iter()
        .filter(|l| after.is_none_or(|after| l.key > *after))
        .take(size + 1)
        .collect();
    let next = (page.len() > size).then(|| {
        page.truncate(size);
        page.last().map(|l| l.key.clone())
    });
    (page, next.flatten())
}

/// A grant as Subscribe's `assigned` event carries it.
fn assigned(granted: Granted) -> v1::Assigned {
    v1::Assigned {
        lease_id: granted.lease_id.into_string(),
        topic: granted.key.topic,
        partition: granted.key.partition,
        fencing_token: granted.fencing_token.get(),
        offset: granted.offset,
        high_watermark: granted.high_watermark,
    }
}

/// A grant as Acquire answers it: what `assigned` carries, and the lease's group, expiry,
/// TTL and serving instance (`gateway_address`: where it listens, empty when not
/// advertised).
pub(crate) fn acquire_response(granted: Granted, gateway_address: &str) -> v1::AcquireResponse {
    let group = granted.key.group.clone();
    let (gateway, expires_at, ttl) = (granted.gateway.clone(), granted.expires_at, granted.ttl);
    let v1::Assigned {
        lease_id,
        topic,
        partition,
        fencing_token,
        offset,
        high_watermark,
    } = assigned(granted);
    v1::AcquireResponse {
        lease_id,
        topic,
        partition,
        fencing_token,
        offset,
        high_watermark,
        expires_at: Some(timestamp(expires_at)),
        group,
        gateway,
        ttl: Some(proto_duration(ttl)),
        gateway_address: gateway_address.to_string(),
    }
}

/// A Read's batches as responses.
pub(crate) fn read_responses(stream: ReadStream) -> ReadResponses {
    Box::pin(stream.map(|item| item.map(ReadBatch::into_response).map_err(status_of)))
}

/// A Deliver's deliveries as responses.
pub(crate) fn deliver_responses(stream: DeliverStream) -> DeliverResponses {
    Box::pin(stream.map(|item| item.map(Delivered::into_response).map_err(status_of)))
}

pub(crate) fn seek_response(offset: i64, epoch: SeekEpoch) -> v1::SeekResponse {
    v1::SeekResponse {
        offset,
        seek_epoch: epoch.get(),
    }
}

pub(crate) fn commit_response(offset: i64, metadata: String) -> v1::CommitResponse {
    v1::CommitResponse { offset, metadata }
}

pub(crate) fn release_response(committed_offset: Option<i64>) -> v1::ReleaseResponse {
    v1::ReleaseResponse { committed_offset }
}

/// ListMembers' answer: each member of `group` with the topic it subscribed to, the
/// partitions of it its leases hold, and what its topic's target gives it.
pub(crate) fn list_members_response(
    group: &str,
    members: Vec<ListedMember>,
) -> v1::ListMembersResponse {
    v1::ListMembersResponse {
        members: members
            .into_iter()
            .map(|listed| v1::MemberInfo {
                group: group.to_string(),
                topic: listed.topic,
                member_id: listed.record.member_id,
                member: listed.record.member,
                gateway: listed.record.gateway,
                max_partitions: listed.record.max_partitions,
                joined_at: Some(timestamp(from_unix_ms(listed.record.joined_at_ms))),
                partitions: listed.partitions,
                group_epoch: listed.epoch,
                awaiting_target: listed.epoch > 0 && listed.target.is_none(),
                target_partitions: listed.target.unwrap_or_default(),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(group: &str, partition: i32) -> ListedLease {
        ListedLease {
            key: LockKey::new(group, "t", partition),
            holder: crate::coordination::HolderInfo {
                member: String::new(),
                gateway: "gw".into(),
                lease_ref: format!("{group}-{partition}"),
                acquired_at_ms: 0,
                ttl_ms: 10_000,
                address: String::new(),
                subscriber: String::new(),
            },
            token: crate::coordination::FencingToken::from_wire(1),
            local: None,
        }
    }

    #[test]
    fn pages_follow_the_key_order_and_end_with_no_token() {
        // Partitions 2 and 10 in numeric order, not as strings; groups in name order.
        let all = || {
            vec![
                listed("b", 0),
                listed("a", 10),
                listed("a", 2),
                listed("a", 1),
            ]
        };
        let keys = |page: &[ListedLease]| {
            page.iter()
                .map(|l| (l.key.group.clone(), l.key.partition))
                .collect::<Vec<_>>()
        };
        let (first, next) = page_of(all(), None, 2);
        assert_eq!(keys(&first), [("a".into(), 1), ("a".into(), 2)]);
        let next = next.expect("more follow");
        let token = validate::page_token_after(&next);
        let after = validate::page_token(&token).unwrap();
        let (second, next) = page_of(all(), after.as_ref(), 2);
        assert_eq!(keys(&second), [("a".into(), 10), ("b".into(), 0)]);
        assert_eq!(next, None, "the last page has no token");
        let (whole, next) = page_of(all(), None, 4);
        assert_eq!((whole.len(), next), (4, None));
        assert!(validate::page_token("a/t").is_err());
        assert!(validate::page_token("a/t/x").is_err());
        assert!(validate::page_token("a/../1/2").is_err());
    }

    #[test]
    fn offset_reset_names_the_allowed_values() {
        assert!(matches!(reset_of(0), Ok(Reset::Earliest)));
        assert!(matches!(reset_of(1), Ok(Reset::Earliest)));
        assert!(matches!(reset_of(2), Ok(Reset::Latest)));
        let err = reset_of(7).expect_err("7 is no OffsetReset").to_string();
        assert!(
            err.contains("offset_reset 7") && err.contains("OFFSET_RESET_LATEST (2)"),
            "{err}"
        );
    }

    #[test]
    fn seek_requires_a_position() {
        use v1::seek_request::Position;
        let req = |p: Option<Position>| v1::SeekRequest {
            lease_id: "a.b".into(),
            position: p,
        };
        assert!(seek_target(&req(None)).is_err());
        assert!(matches!(
            seek_target(&req(Some(Position::Latest(())))),
            Ok(SeekTarget::Latest)
        ));
        assert!(matches!(
            seek_target(&req(Some(Position::Offset(-1)))),
            Ok(SeekTarget::Offset(-1))
        ));
    }

    #[test]
    fn read_limits_have_defaults_and_caps() {
        let mut req = v1::ReadRequest {
            lease_id: "a.b".into(),
            ..Default::default()
        };
        let limits = read_limits(&req).expect("defaults");
        assert_eq!((limits.max_records, limits.max_bytes), (500, 1024 * 1024));
        req.max_bytes = 4 * 1024 * 1024 + 1;
        let LeaseError::InvalidArgument { field, message } = read_limits(&req).unwrap_err() else {
            panic!("wrong variant")
        };
        assert_eq!(field, "max_bytes");
        assert!(
            message.contains("4194305") && message.contains("4194304"),
            "{message}"
        );
    }
}
