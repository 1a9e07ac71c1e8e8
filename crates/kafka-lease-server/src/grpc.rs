//! The gRPC surface: request validation, the one mapping from domain errors to
//! `tonic::Status`, and the `PartitionLeaseService` implementation over [`Gateway`].

use std::pin::Pin;
use std::sync::Arc;
use std::time::SystemTime;

use futures::{Stream, StreamExt};
use tonic::{Code, Request, Response, Status};

use kafka_lease_proto::v1;
use kafka_lease_proto::v1::partition_lease_service_server::PartitionLeaseService;

use crate::error::{EndReason, LeaseError};
use crate::gateway::{lease_info, AcquireSpec, Gateway, Reset, SeekTarget};
use crate::lease::ReadLimits;
use crate::validate;

/// The single place where domain errors become gRPC statuses.
pub fn status_of(err: LeaseError) -> Status {
    let code = match &err {
        LeaseError::InvalidArgument { .. } => Code::InvalidArgument,
        LeaseError::TopicNotFound { .. }
        | LeaseError::PartitionNotFound { .. }
        | LeaseError::LeaseNotFound { .. } => Code::NotFound,
        LeaseError::Busy { .. } => Code::ResourceExhausted,
        LeaseError::WrongGateway { .. } => Code::FailedPrecondition,
        LeaseError::LeaseEnded {
            reason: EndReason::Shutdown,
            ..
        } => Code::Unavailable,
        LeaseError::LeaseEnded { .. } => Code::FailedPrecondition,
        LeaseError::OffsetOutOfRange { .. } => Code::OutOfRange,
        LeaseError::Superseded { .. } => Code::Aborted,
        LeaseError::ShuttingDown
        | LeaseError::KafkaUnavailable { .. }
        | LeaseError::Coordination(_) => Code::Unavailable,
    };
    Status::new(code, err.to_string())
}

fn timestamp(t: SystemTime) -> prost_types::Timestamp {
    let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    prost_types::Timestamp {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    }
}

fn proto_duration(d: std::time::Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    }
}

/// `PartitionLeaseService` over a [`Gateway`].
#[derive(Debug, Clone)]
pub struct LeaseService {
    gateway: Arc<Gateway>,
}

impl LeaseService {
    pub fn new(gateway: Arc<Gateway>) -> Self {
        Self { gateway }
    }
}

fn acquire_spec(req: &v1::AcquireRequest) -> Result<AcquireSpec, LeaseError> {
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
    let reset = match v1::ResetPolicy::try_from(req.reset) {
        Ok(v1::ResetPolicy::ResetEarliest) => Reset::Earliest,
        Ok(v1::ResetPolicy::ResetLatest) => Reset::Latest,
        Err(_) => {
            return Err(LeaseError::InvalidArgument {
                field: "reset",
                message: format!(
                    "reset {} is not a ResetPolicy; allowed RESET_EARLIEST (0), RESET_LATEST (1)",
                    req.reset
                ),
            })
        }
    };
    Ok(AcquireSpec {
        group: req.group.clone(),
        topic: req.topic.clone(),
        partition,
        member: req.member.clone(),
        ttl,
        wait,
        reset,
    })
}

fn read_limits(req: &v1::ReadRequest) -> Result<ReadLimits, LeaseError> {
    validate::lease_id(&req.lease_id)?;
    Ok(ReadLimits {
        max_records: validate::count_in(
            "max_records",
            req.max_records,
            validate::DEFAULT_MAX_RECORDS,
            validate::MAX_MAX_RECORDS,
        )? as usize,
        max_bytes: validate::count_in(
            "max_bytes",
            req.max_bytes,
            validate::DEFAULT_MAX_BYTES,
            validate::MAX_MAX_BYTES,
        )? as usize,
        max_wait: validate::duration_in(
            "max_wait",
            req.max_wait.as_ref(),
            validate::DEFAULT_MAX_WAIT,
            std::time::Duration::ZERO,
            validate::MAX_MAX_WAIT,
        )?,
    })
}

fn seek_target(req: &v1::SeekRequest) -> Result<SeekTarget, LeaseError> {
    use v1::seek_request::Position;
    validate::lease_id(&req.lease_id)?;
    let must_be_true = |field: &'static str, set: bool| {
        if set {
            Ok(())
        } else {
            Err(LeaseError::InvalidArgument {
                field,
                message: format!("{field} is false; set it to true, or set another position"),
            })
        }
    };
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
        Some(Position::Earliest(set)) => {
            must_be_true("earliest", *set).map(|()| SeekTarget::Earliest)
        }
        Some(Position::Latest(set)) => must_be_true("latest", *set).map(|()| SeekTarget::Latest),
        Some(Position::Committed(set)) => {
            must_be_true("committed", *set).map(|()| SeekTarget::Committed)
        }
    }
}

type ReadResponseStream = Pin<Box<dyn Stream<Item = Result<v1::ReadResponse, Status>> + Send>>;

#[tonic::async_trait]
impl PartitionLeaseService for LeaseService {
    async fn acquire(
        &self,
        request: Request<v1::AcquireRequest>,
    ) -> Result<Response<v1::AcquireResponse>, Status> {
        let spec = acquire_spec(request.get_ref()).map_err(status_of)?;
        let granted = self.gateway.acquire(spec).await.map_err(status_of)?;
        Ok(Response::new(v1::AcquireResponse {
            lease_id: granted.lease_id,
            topic: granted.key.topic,
            partition: granted.key.partition,
            fencing_token: granted.fencing_token,
            offset: granted.offset,
            high_watermark: granted.high_watermark,
            expires_at: Some(timestamp(granted.expires_at)),
            group: granted.key.group,
            gateway: granted.gateway,
            ttl: Some(proto_duration(granted.ttl)),
        }))
    }

    type ReadStream = ReadResponseStream;

    async fn read(
        &self,
        request: Request<v1::ReadRequest>,
    ) -> Result<Response<Self::ReadStream>, Status> {
        let limits = read_limits(request.get_ref()).map_err(status_of)?;
        let stream = self
            .gateway
            .read(
                &request.get_ref().lease_id,
                limits,
                request.get_ref().from_offset,
            )
            .await
            .map_err(status_of)?;
        Ok(Response::new(Box::pin(
            stream.map(|item| item.map_err(status_of)),
        )))
    }

    async fn seek(
        &self,
        request: Request<v1::SeekRequest>,
    ) -> Result<Response<v1::SeekResponse>, Status> {
        let target = seek_target(request.get_ref()).map_err(status_of)?;
        let (offset, seek_epoch) = self
            .gateway
            .seek(&request.get_ref().lease_id, target)
            .await
            .map_err(status_of)?;
        Ok(Response::new(v1::SeekResponse { offset, seek_epoch }))
    }

    async fn commit(
        &self,
        request: Request<v1::CommitRequest>,
    ) -> Result<Response<v1::CommitResponse>, Status> {
        let req = request.get_ref();
        validate::lease_id(&req.lease_id).map_err(status_of)?;
        if let Some(metadata) = &req.metadata {
            validate::metadata(metadata).map_err(status_of)?;
        }
        let metadata = self
            .gateway
            .commit(&req.lease_id, req.offset, req.metadata.as_deref())
            .await
            .map_err(status_of)?;
        Ok(Response::new(v1::CommitResponse {
            offset: req.offset,
            metadata,
        }))
    }

    async fn release(
        &self,
        request: Request<v1::ReleaseRequest>,
    ) -> Result<Response<v1::ReleaseResponse>, Status> {
        let req = request.get_ref();
        validate::lease_id(&req.lease_id).map_err(status_of)?;
        let committed_offset = self
            .gateway
            .release(&req.lease_id, req.commit_offset)
            .await
            .map_err(status_of)?;
        Ok(Response::new(v1::ReleaseResponse { committed_offset }))
    }

    async fn list_leases(
        &self,
        request: Request<v1::ListLeasesRequest>,
    ) -> Result<Response<v1::ListLeasesResponse>, Status> {
        let req = request.get_ref();
        if let Some(group) = &req.group {
            validate::group(group).map_err(status_of)?;
        }
        if let Some(topic) = &req.topic {
            validate::topic(topic).map_err(status_of)?;
        }
        let listed = self
            .gateway
            .list(req.group.as_deref(), req.topic.as_deref())
            .await
            .map_err(status_of)?;
        Ok(Response::new(v1::ListLeasesResponse {
            leases: listed.iter().map(lease_info).collect(),
        }))
    }
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

    #[test]
    fn seek_requires_exactly_one_true_position() {
        use v1::seek_request::Position;
        let req = |p: Option<Position>| v1::SeekRequest {
            lease_id: "a.b".into(),
            position: p,
        };
        assert!(seek_target(&req(None)).is_err());
        assert!(seek_target(&req(Some(Position::Earliest(false)))).is_err());
        assert!(matches!(
            seek_target(&req(Some(Position::Latest(true)))),
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
