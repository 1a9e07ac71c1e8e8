//! The gRPC surface: request validation, the one mapping from domain errors to
//! `tonic::Status`, and the `PartitionLeaseService` implementation over [`Gateway`].

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use tonic::{Code, Request, Response, Status};
use tonic_types::{ErrorDetail, ErrorInfo, RetryInfo, StatusExt};

use kafka_lease_proto::encoded::partition_lease_service_server::PartitionLeaseService;
use kafka_lease_proto::v1;
use kafka_lease_proto::v1::gateway_peer_service_server::GatewayPeerService;
use kafka_lease_proto::wire::EncodedSubscribeResponse;

use crate::auth::{self, Action, Auth, Caller};
use crate::calls::{holding, ConnectionLimits, LongCalls};
use crate::coordination::CoordinationError;
use crate::coordination::LockKey;
use crate::error::{EndReason, LeaseError};
use crate::forward::{
    deadline_of, until_deadline, Failure, Peers, DESCRIBE_FANOUT, DESCRIBE_TIMEOUT, FORWARDED_BY,
};
use crate::gateway::{lease_info, AcquireSpec, Gateway, ListedLease, Reset, SeekTarget};
use crate::lease::lease_ref;
use crate::lease::{ReadBatch, ReadLimits};
use crate::subscribe::{Ended, SubscribeSpec, SubscriptionEvent};
use crate::validate;

/// The `google.rpc.ErrorInfo` domain of every error this service sends.
pub const ERROR_DOMAIN: &str = "kafka-lease";

/// The retry advice sent with UNAVAILABLE, and with PARTITION_BUSY when no holder's expiry
/// is known: long enough not to hammer a struggling Kafka or Consul, short enough that a
/// blip costs little.
const RETRY_DELAY: Duration = Duration::from_secs(1);

/// The shortest PARTITION_BUSY retry advice, so that a lease expiring right now does not
/// invite a busy loop (an active holder renews it anyway).
const MIN_BUSY_RETRY_DELAY: Duration = Duration::from_millis(100);

/// Runs one call of the lease service and records its outcome ([`crate::metrics`]).
async fn observed<T>(
    method: &'static str,
    call: impl std::future::Future<Output = Result<T, Status>>,
) -> Result<T, Status> {
    let started = tokio::time::Instant::now();
    let result = call.await;
    crate::metrics::record_call(method, started.elapsed(), result.as_ref().err());
    result
}

/// The single place where domain errors become gRPC statuses: the code, the human message,
/// and in the details a `google.rpc.ErrorInfo` (always) and a `google.rpc.RetryInfo` (where
/// the same call can succeed later), as `ErrorReason` in the proto documents them.
pub fn status_of(err: LeaseError) -> Status {
    status_at(err, SystemTime::now())
}

/// [`status_of`] as of `now`, which PARTITION_BUSY's retry delay is measured from.
fn status_at(err: LeaseError, now: SystemTime) -> Status {
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
fn whole_millis(d: Duration) -> Duration {
    let millis = d.as_nanos().div_ceil(1_000_000);
    Duration::from_millis(u64::try_from(millis).unwrap_or(u64::MAX))
}

fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
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

/// `PartitionLeaseService` over a [`Gateway`], forwarding calls on leases that other
/// instances serve to them through [`Peers`].
#[derive(Debug, Clone)]
pub struct LeaseService {
    gateway: Arc<Gateway>,
    peers: Arc<Peers>,
    auth: Arc<Auth>,
    /// The long calls open on each client connection (`crate::calls`).
    long_calls: Arc<LongCalls>,
}

impl LeaseService {
    /// The service with no identities and no policy: everyone may do everything.
    pub fn new(gateway: Arc<Gateway>, peers: Arc<Peers>) -> Self {
        Self {
            gateway,
            peers,
            auth: Auth::open(),
            long_calls: LongCalls::new(ConnectionLimits::default().long_calls),
        }
    }

    /// Identities and the policy come from `auth`.
    pub fn with_auth(mut self, auth: Arc<Auth>) -> Self {
        self.auth = auth;
        self
    }

    /// At most `limit` long calls (Read, Subscribe, an Acquire that may wait) open at once on
    /// one client connection.
    pub fn with_long_calls_per_connection(mut self, limit: u32) -> Self {
        self.long_calls = LongCalls::new(limit);
        self
    }

    /// Who is calling: UNAUTHENTICATED when the gateway requires an identity and the call
    /// has none it accepts.
    fn caller<T>(&self, request: &Request<T>) -> Result<Caller, Status> {
        let certs = request.peer_certs();
        self.auth
            .caller(request.metadata(), certs.as_deref().map(Vec::as_slice))
            .map_err(status_of)
    }

    /// Checks a call on a lease this instance serves: the caller may take `action` on its
    /// group and topic, and is the identity that acquired it. A lease this instance does
    /// not know is left to the call itself, which answers why.
    fn authorize_lease(
        &self,
        caller: &Caller,
        action: Action,
        lease_id: &str,
    ) -> Result<(), Status> {
        if let Ok(lease) = self.gateway.lookup(lease_id) {
            let (group, topic) = (&lease.key.group, &lease.key.topic);
            self.auth
                .check(caller, action, group, topic)
                .and_then(|()| {
                    auth::check_owner(lease.owner.as_deref(), caller, action, group, topic)
                })
                .map_err(|err| {
                    tracing::info!(parent: &lease.span, error = %err, "call refused");
                    status_of(err)
                })?;
        }
        Ok(())
    }

    /// The instance to forward a call on `lease_id` to: the one the id names when this
    /// instance does not know the lease, unless the call was forwarded here already.
    fn forward_to<T>(&self, request: &Request<T>, lease_id: &str) -> Option<String> {
        if let Some(by) = request.metadata().get(FORWARDED_BY) {
            tracing::debug!(
                forwarded_by = ?by,
                lease_ref = %lease_ref(lease_id),
                "a call forwarded by another instance",
            );
            return None;
        }
        self.gateway.served_elsewhere(lease_id)
    }

    /// The other instance that holds the record of member `member_id` of `group`, for a
    /// Subscribe that was not forwarded already; `None` when none does (or Consul cannot say).
    async fn member_instance<T>(
        &self,
        request: &Request<T>,
        group: &str,
        member_id: &str,
    ) -> Option<String> {
        if member_id.is_empty() || request.metadata().get(FORWARDED_BY).is_some() {
            return None;
        }
        let members = self.gateway.locks().members(group).await.ok()?;
        members
            .into_iter()
            .map(|(_, record)| record)
            .find(|record| {
                record.member_id == member_id && record.gateway != self.gateway.instance()
            })
            .map(|record| record.gateway)
    }

    /// Forwards a unary call on `lease_id` to `instance`.
    async fn forward<Req, Resp, F, Fut>(
        &self,
        method: &'static str,
        instance: &str,
        lease_id: &str,
        request: Request<Req>,
        caller: &Caller,
        call: F,
    ) -> Result<Response<Resp>, Status>
    where
        F: FnOnce(
            kafka_lease_proto::encoded::partition_lease_service_client::PartitionLeaseServiceClient<
                tonic::transport::Channel,
            >,
            Request<Req>,
        ) -> Fut,
        Fut: std::future::Future<Output = Result<Response<Resp>, Status>>,
    {
        let lease_ref = lease_ref(lease_id);
        let route = self
            .peers
            .route(lease_ref, instance, false)
            .await
            .map_err(status_of)?;
        tracing::debug!(%method, peer = %instance, address = %route.address, %lease_ref, "forwarding a call to the serving instance");
        let deadline = deadline_of(request.metadata());
        self.peers
            .unary(route, request.into_inner(), deadline, caller, call)
            .await
            .map(Response::new)
    }

    /// The page's rows, each with the live details of its lease: from this instance's table,
    /// or asked of the instance serving it (at most [`DESCRIBE_FANOUT`] at once, each within
    /// [`DESCRIBE_TIMEOUT`] and the caller's deadline).
    async fn with_live_details(
        &self,
        page: &[ListedLease],
        deadline: Option<tokio::time::Instant>,
    ) -> Vec<v1::LeaseInfo> {
        let mut rows: Vec<v1::LeaseInfo> = page.iter().map(lease_info).collect();
        // Instance → its address and the rows to ask it about.
        let mut asks: HashMap<String, (String, Vec<usize>)> = HashMap::new();
        for (i, listed) in page.iter().enumerate() {
            if listed.local.is_some() {
                continue;
            }
            let gateway = &listed.holder.gateway;
            if gateway == self.gateway.instance() {
                rows[i].details_unavailable =
                    "this instance no longer serves it (it ended a moment ago)".into();
                continue;
            }
            asks.entry(gateway.clone())
                .or_insert_with(|| (listed.holder.address.clone(), Vec::new()))
                .1
                .push(i);
        }
        let limit = deadline.map_or(DESCRIBE_TIMEOUT, |d| {
            d.saturating_duration_since(tokio::time::Instant::now())
                .min(DESCRIBE_TIMEOUT)
        });
        let answers = futures::stream::iter(asks)
            .map(|(instance, (address, indices))| {
                let keys: Vec<v1::LeaseKey> = indices
                    .iter()
                    .map(|&i| v1::LeaseKey {
                        group: page[i].key.group.clone(),
                        topic: page[i].key.topic.clone(),
                        partition: page[i].key.partition,
                        fencing_token: page[i].token,
                    })
                    .collect();
                async move {
                    let answer =
                        tokio::time::timeout(limit, self.describe(&instance, address, keys))
                            .await
                            .unwrap_or_else(|_| {
                                Err(format!(
                                    "gateway instance {instance:?} did not answer within {limit:?}"
                                ))
                            });
                    (indices, answer)
                }
            })
            .buffer_unordered(DESCRIBE_FANOUT)
            .collect::<Vec<_>>()
            .await;
        for (indices, answer) in answers {
            match answer {
                Ok(described) => {
                    let by_key: HashMap<(String, String, i32, u64), v1::LeaseInfo> = described
                        .into_iter()
                        .map(|l| {
                            (
                                (
                                    l.group.clone(),
                                    l.topic.clone(),
                                    l.partition,
                                    l.fencing_token,
                                ),
                                l,
                            )
                        })
                        .collect();
                    for i in indices {
                        let row = &mut rows[i];
                        let key = (
                            row.group.clone(),
                            row.topic.clone(),
                            row.partition,
                            row.fencing_token,
                        );
                        match by_key.get(&key) {
                            Some(live) => {
                                row.expires_at = live.expires_at;
                                row.position = live.position;
                                row.committed_offset = live.committed_offset;
                                row.high_watermark = live.high_watermark;
                                row.lag = live.lag;
                                row.read_lag = live.read_lag;
                            }
                            None => {
                                row.details_unavailable = format!(
                                "gateway instance {:?} no longer serves it (it ended a moment ago)",
                                row.gateway
                            )
                            }
                        }
                    }
                }
                Err(why) => {
                    for i in indices {
                        rows[i].details_unavailable = why.clone();
                    }
                }
            }
        }
        rows
    }

    /// Asks `instance` (at `address`, or where its Consul record says when the lock names
    /// none) for the live details of `keys`.
    async fn describe(
        &self,
        instance: &str,
        address: String,
        keys: Vec<v1::LeaseKey>,
    ) -> Result<Vec<v1::LeaseInfo>, String> {
        let address = if address.is_empty() {
            match self.gateway.locks().instance_address(instance).await {
                Ok(Some(address)) => address,
                Ok(None) => {
                    return Err(format!(
                        "gateway instance {instance:?} is not registered in Consul"
                    ))
                }
                Err(err) => return Err(format!("looking up gateway instance {instance:?}: {err}")),
            }
        } else {
            address
        };
        let (mut client, _route) = self
            .peers
            .describer(instance, &address)
            .map_err(|e| e.to_string())?;
        let request = self.peers.outgoing(
            v1::DescribeLeasesRequest { leases: keys },
            None,
            &Caller::anonymous(),
        );
        match client.describe_leases(request).await {
            Ok(answer) => Ok(answer.into_inner().leases),
            Err(status) => Err(format!(
                "gateway instance {instance:?} at {address} did not answer: {}: {}",
                status.code(),
                status.message()
            )),
        }
    }
}

/// `GatewayPeerService` over a [`Gateway`]: what other instances ask of this one.
#[derive(Debug, Clone)]
pub struct PeerService {
    gateway: Arc<Gateway>,
    auth: Arc<Auth>,
}

impl PeerService {
    pub fn new(gateway: Arc<Gateway>) -> Self {
        Self {
            gateway,
            auth: Auth::open(),
        }
    }

    /// Only gateway instances may call it, when identities exist (see [`Auth::check_gateway`]).
    pub fn with_auth(mut self, auth: Arc<Auth>) -> Self {
        self.auth = auth;
        self
    }
}

#[tonic::async_trait]
impl GatewayPeerService for PeerService {
    async fn describe_leases(
        &self,
        request: Request<v1::DescribeLeasesRequest>,
    ) -> Result<Response<v1::DescribeLeasesResponse>, Status> {
        let certs = request.peer_certs();
        self.auth
            .check_gateway(certs.as_deref().map(Vec::as_slice))
            .map_err(status_of)?;
        let asked = &request.get_ref().leases;
        if asked.len() > validate::MAX_PAGE_SIZE as usize {
            return Err(status_of(LeaseError::InvalidArgument {
                field: "leases",
                message: format!(
                    "{} leases asked for; at most {} at once",
                    asked.len(),
                    validate::MAX_PAGE_SIZE
                ),
            }));
        }
        let mut leases = Vec::new();
        for key in asked {
            validate::group(&key.group).map_err(status_of)?;
            validate::topic(&key.topic).map_err(status_of)?;
            let lock = LockKey::new(key.group.clone(), key.topic.clone(), key.partition);
            if let Some(live) = self.gateway.describe(&lock, key.fencing_token) {
                leases.push(v1::LeaseInfo {
                    group: key.group.clone(),
                    topic: key.topic.clone(),
                    partition: key.partition,
                    fencing_token: key.fencing_token,
                    expires_at: Some(timestamp(live.expires_at)),
                    gateway: self.gateway.instance().to_string(),
                    position: Some(live.position),
                    committed_offset: live.committed,
                    high_watermark: Some(live.high_watermark),
                    lag: live.lag(),
                    read_lag: Some(live.read_lag()),
                    ..v1::LeaseInfo::default()
                });
            }
        }
        Ok(Response::new(v1::DescribeLeasesResponse { leases }))
    }
}

fn acquire_spec(
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

fn read_limits(req: &v1::ReadRequest) -> Result<ReadLimits, LeaseError> {
    validate::lease_id(&req.lease_id)?;
    limits_of(req.max_records, req.max_bytes, req.max_wait.as_ref())
}

fn limits_of(
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

fn reset_of(reset: i32) -> Result<Reset, LeaseError> {
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
const MAX_SUBSCRIBED_TOPICS: usize = 16;
/// The revoke grace when the request names none, and the longest allowed.
const DEFAULT_REVOKE_GRACE: std::time::Duration = std::time::Duration::from_secs(5);
const MAX_REVOKE_GRACE: std::time::Duration = std::time::Duration::from_secs(60);
/// The longest a detached member keeps its leases.
const MAX_SESSION_GRACE: std::time::Duration = std::time::Duration::from_secs(300);

fn subscribe_spec(req: &v1::SubscribeRequest) -> Result<SubscribeSpec, LeaseError> {
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
    })
}

/// A subscription event as the wire carries it. A records event's records are sent as the
/// Read path encoded them.
fn subscribe_response(event: SubscriptionEvent) -> EncodedSubscribeResponse {
    use v1::subscribe_response::Event;
    let event = match event {
        SubscriptionEvent::Joined { member_id, gateway } => {
            Event::Joined(v1::Joined { member_id, gateway })
        }
        SubscriptionEvent::Assigned(granted) => Event::Assigned(v1::Assigned {
            lease_id: granted.lease_id,
            topic: granted.key.topic,
            partition: granted.key.partition,
            fencing_token: granted.fencing_token,
            offset: granted.offset,
            high_watermark: granted.high_watermark,
        }),
        SubscriptionEvent::Records {
            lease_id,
            topic,
            partition,
            batch,
        } => {
            return batch.records.into_subscribed(
                &lease_id,
                &topic,
                partition,
                batch.seek_epoch,
                batch.high_watermark,
            )
        }
        SubscriptionEvent::Revoking {
            lease_id,
            topic,
            partition,
            deadline,
        } => Event::Revoking(v1::Revoking {
            lease_id,
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
                        lease_ref(&lease_id)
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
                lease_id,
                topic,
                partition,
                reason,
                message,
            })
        }
    };
    EncodedSubscribeResponse::from_message(&v1::SubscribeResponse { event: Some(event) })
}

fn seek_target(req: &v1::SeekRequest) -> Result<SeekTarget, LeaseError> {
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

type ReadResponseStream = crate::forward::ReadResponses;

#[tonic::async_trait]
impl PartitionLeaseService for LeaseService {
    async fn acquire(
        &self,
        request: Request<v1::AcquireRequest>,
    ) -> Result<Response<v1::AcquireResponse>, Status> {
        observed("Acquire", async move {
            let caller = self.caller(&request)?;
            let mut spec =
                acquire_spec(request.get_ref(), request.remote_addr()).map_err(status_of)?;
            self.auth
                .check(&caller, Action::Acquire, &spec.group, &spec.topic)
                .map_err(status_of)?;
            spec.owner = caller.identity;
            // An Acquire that may wait is a long call; one that does not is short.
            let _long = if spec.wait.is_zero() {
                None
            } else {
                self.long_calls
                    .admit(spec.via, "waiting Acquire")
                    .map_err(status_of)?
            };
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
                gateway_address: self.gateway.address().unwrap_or_default().to_string(),
            }))
        })
        .await
    }

    type ReadStream = ReadResponseStream;

    async fn read(
        &self,
        request: Request<v1::ReadRequest>,
    ) -> Result<Response<Self::ReadStream>, Status> {
        observed("Read", async move {
        let caller = self.caller(&request)?;
        let limits = read_limits(request.get_ref()).map_err(status_of)?;
        let long = self
            .long_calls
            .admit(request.remote_addr(), "Read")
            .map_err(status_of)?;
        if let Some(instance) = self.forward_to(&request, &request.get_ref().lease_id) {
            let lease_ref = lease_ref(&request.get_ref().lease_id).to_string();
            let route = self
                .peers
                .route(&lease_ref, &instance, true)
                .await
                .map_err(status_of)?;
            tracing::info!(peer = %instance, address = %route.address, %lease_ref, "proxying a Read from the serving instance");
            let deadline = deadline_of(request.metadata());
            let outgoing = self.peers.outgoing(request.into_inner(), deadline, &caller);
            return match route.client().read(outgoing).await {
                Ok(answer) => Ok(Response::new(holding(
                    until_deadline(
                        self.peers.proxy(route, answer.into_inner(), Failure::Lease),
                        deadline,
                    ),
                    long,
                ))),
                Err(status) => Err(self.peers.failed(&route, status).await),
            };
        }
        self.authorize_lease(&caller, Action::Read, &request.get_ref().lease_id)?;
        let deadline = deadline_of(request.metadata());
        let stream = self
            .gateway
            .read(
                &request.get_ref().lease_id,
                limits,
                request.get_ref().from_offset,
                request.get_ref().if_seek_epoch,
            )
            .await
            .map_err(status_of)?;
        Ok(Response::new(holding(
            until_deadline(
                Box::pin(stream.map(|item| item.map(ReadBatch::into_response).map_err(status_of))),
                deadline,
            ),
            long,
        )))
        })
        .await
    }

    type SubscribeStream = std::pin::Pin<
        Box<dyn futures::Stream<Item = Result<EncodedSubscribeResponse, Status>> + Send>,
    >;

    async fn subscribe(
        &self,
        request: Request<v1::SubscribeRequest>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        observed("Subscribe", async move {
        let caller = self.caller(&request)?;
        let mut spec = subscribe_spec(request.get_ref()).map_err(status_of)?;
        for topic in &spec.topics {
            self.auth
                .check(&caller, Action::Subscribe, &spec.group, topic)
                .map_err(status_of)?;
        }
        spec.owner = caller.identity.clone();
        let long = self
            .long_calls
            .admit(request.remote_addr(), "Subscribe")
            .map_err(status_of)?;
        let deadline = deadline_of(request.metadata());
        let (group, member_id) = (spec.group.clone(), spec.member_id.clone());
        let events: Self::SubscribeStream = match self.gateway.subscribe(spec).await {
            Ok(events) => {
                Box::pin(events.map(|event| event.map(subscribe_response).map_err(status_of)))
            }
            Err(err @ LeaseError::MemberActive { .. }) => {
                // The member id is held elsewhere: when another instance holds its record (a
                // client reconnecting through another instance within its session grace),
                // the Subscribe goes there, as a call on a lease goes to its serving instance.
                let Some(instance) = self.member_instance(&request, &group, &member_id).await
                else {
                    return Err(status_of(err));
                };
                let member_ref = format!("member {member_id}");
                let route = match self.peers.route(&member_ref, &instance, true).await {
                    Ok(route) => route,
                    // Gone from Consul since the record was read: its members go with it.
                    Err(_) => return Err(status_of(err)),
                };
                tracing::info!(peer = %instance, address = %route.address, %group, %member_id, "forwarding a Subscribe to the instance that holds the member");
                let outgoing = self.peers.outgoing(request.into_inner(), deadline, &caller);
                match route.client().subscribe(outgoing).await {
                    Ok(answer) => self.peers.proxy(
                        route,
                        answer.into_inner(),
                        Failure::Member { group, member_id },
                    ),
                    Err(status) => {
                        return Err(self.peers.failed_member(&route, &group, &member_id, status))
                    }
                }
            }
            Err(err) => return Err(status_of(err)),
        };
        let events: Self::SubscribeStream = match deadline {
            Some(deadline) => {
                Box::pin(events.take_until(tokio::time::sleep_until(deadline)).chain(
                    futures::stream::once(async {
                        Err(Status::deadline_exceeded(
                            "the Subscribe reached the caller's deadline (its grpc-timeout)",
                        ))
                    }),
                ))
            }
            None => Box::pin(events),
        };
        Ok(Response::new(holding(events, long)))
        })
        .await
    }

    async fn list_members(
        &self,
        request: Request<v1::ListMembersRequest>,
    ) -> Result<Response<v1::ListMembersResponse>, Status> {
        observed("ListMembers", async move {
            let caller = self.caller(&request)?;
            let req = request.get_ref();
            validate::group(&req.group).map_err(status_of)?;
            if let Some(topic) = &req.topic {
                validate::topic(topic).map_err(status_of)?;
                self.auth
                    .check(&caller, Action::List, &req.group, topic)
                    .map_err(status_of)?;
            } else {
                self.auth
                    .check_group(&caller, Action::List, &req.group)
                    .map_err(status_of)?;
            }
            let mut members = self
                .gateway
                .list_members(&req.group, req.topic.as_deref())
                .await
                .map_err(status_of)?;
            // Only the topics the caller may list.
            members
                .retain(|(topic, _, _)| self.auth.allows(&caller, Action::List, &req.group, topic));
            Ok(Response::new(v1::ListMembersResponse {
                members: members
                    .into_iter()
                    .map(|(topic, record, partitions)| v1::MemberInfo {
                        group: req.group.clone(),
                        topic,
                        member_id: record.member_id,
                        member: record.member,
                        gateway: record.gateway,
                        max_partitions: record.max_partitions,
                        joined_at: Some(timestamp(
                            SystemTime::UNIX_EPOCH + Duration::from_millis(record.joined_at_ms),
                        )),
                        partitions,
                    })
                    .collect(),
            }))
        })
        .await
    }

    async fn seek(
        &self,
        request: Request<v1::SeekRequest>,
    ) -> Result<Response<v1::SeekResponse>, Status> {
        observed("Seek", async move {
            let caller = self.caller(&request)?;
            let target = seek_target(request.get_ref()).map_err(status_of)?;
            let lease_id = request.get_ref().lease_id.clone();
            if let Some(instance) = self.forward_to(&request, &lease_id) {
                return self
                    .forward(
                        "Seek",
                        &instance,
                        &lease_id,
                        request,
                        &caller,
                        |mut c, r| async move { c.seek(r).await },
                    )
                    .await;
            }
            self.authorize_lease(&caller, Action::Seek, &lease_id)?;
            let (offset, seek_epoch) = self
                .gateway
                .seek(&request.get_ref().lease_id, target)
                .await
                .map_err(status_of)?;
            Ok(Response::new(v1::SeekResponse { offset, seek_epoch }))
        })
        .await
    }

    async fn commit(
        &self,
        request: Request<v1::CommitRequest>,
    ) -> Result<Response<v1::CommitResponse>, Status> {
        observed("Commit", async move {
            let caller = self.caller(&request)?;
            let req = request.get_ref();
            validate::lease_id(&req.lease_id).map_err(status_of)?;
            if let Some(metadata) = &req.metadata {
                validate::metadata(metadata).map_err(status_of)?;
            }
            let lease_id = req.lease_id.clone();
            if let Some(instance) = self.forward_to(&request, &lease_id) {
                return self
                    .forward(
                        "Commit",
                        &instance,
                        &lease_id,
                        request,
                        &caller,
                        |mut c, r| async move { c.commit(r).await },
                    )
                    .await;
            }
            self.authorize_lease(&caller, Action::Commit, &lease_id)?;
            let req = request.get_ref();
            let metadata = self
                .gateway
                .commit(&req.lease_id, req.offset, req.metadata.as_deref())
                .await
                .map_err(status_of)?;
            Ok(Response::new(v1::CommitResponse {
                offset: req.offset,
                metadata,
            }))
        })
        .await
    }

    async fn release(
        &self,
        request: Request<v1::ReleaseRequest>,
    ) -> Result<Response<v1::ReleaseResponse>, Status> {
        observed("Release", async move {
            let caller = self.caller(&request)?;
            validate::lease_id(&request.get_ref().lease_id).map_err(status_of)?;
            let lease_id = request.get_ref().lease_id.clone();
            if let Some(instance) = self.forward_to(&request, &lease_id) {
                return self
                    .forward(
                        "Release",
                        &instance,
                        &lease_id,
                        request,
                        &caller,
                        |mut c, r| async move { c.release(r).await },
                    )
                    .await;
            }
            self.authorize_lease(&caller, Action::Release, &lease_id)?;
            let req = request.get_ref();
            let committed_offset = self
                .gateway
                .release(&req.lease_id, req.commit_offset)
                .await
                .map_err(status_of)?;
            Ok(Response::new(v1::ReleaseResponse { committed_offset }))
        })
        .await
    }

    async fn list_leases(
        &self,
        request: Request<v1::ListLeasesRequest>,
    ) -> Result<Response<v1::ListLeasesResponse>, Status> {
        observed("ListLeases", async move {
            let caller = self.caller(&request)?;
            let req = request.get_ref();
            if let Some(group) = &req.group {
                validate::group(group).map_err(status_of)?;
            }
            if let Some(topic) = &req.topic {
                validate::topic(topic).map_err(status_of)?;
            }
            let size = validate::count_in(
                "page_size",
                req.page_size,
                validate::DEFAULT_PAGE_SIZE,
                validate::MAX_PAGE_SIZE,
            )
            .map_err(status_of)? as usize;
            let after = validate::page_token(&req.page_token).map_err(status_of)?;
            let mut listed = self
                .gateway
                .list(req.group.as_deref(), req.topic.as_deref())
                .await
                .map_err(status_of)?;
            // Only what the caller may see: a lease whose group and topic it may list.
            listed.retain(|l| {
                self.auth
                    .allows(&caller, Action::List, &l.key.group, &l.key.topic)
            });
            let (page, next) = page_of(listed, after.as_ref(), size);
            let deadline = deadline_of(request.metadata());
            Ok(Response::new(v1::ListLeasesResponse {
                leases: self.with_live_details(&page, deadline).await,
                next_page_token: next
                    .as_ref()
                    .map(validate::page_token_after)
                    .unwrap_or_default(),
            }))
        })
        .await
    }
}

/// One page of a listing: the first `size` leases after `after` in (group, topic,
/// partition) order, and the key to continue after when more follow.
fn page_of(
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
            token: 1,
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
