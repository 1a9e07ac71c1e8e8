//! `PartitionLeaseService` over the [`Gateway`]: each call validated, authorized, served
//! here or forwarded to the instance serving its lease, and its outcome recorded.

use std::sync::Arc;

use futures::StreamExt;
use tonic::{Request, Response, Status};

use kafka_lease_proto::encoded::partition_lease_service_server::PartitionLeaseService;
use kafka_lease_proto::v1;
use kafka_lease_proto::wire::EncodedSubscribeResponse;

use super::forward::{deadline_of, until_deadline, Failure, Peers, FORWARDED_BY};
use crate::auth::{self, Action, Auth, Caller};
use crate::calls::{holding, ConnectionLimits, LongCalls};
use crate::coordination::from_unix_ms;
use crate::error::LeaseError;
use crate::gateway::{Gateway, Resolved};
use crate::lease::lease_ref;
use crate::lease::ReadBatch;
use crate::lease::{DeliverSettings, Lease, SeekEpoch};
use crate::subscribe::Subscriptions;
use crate::validate;

use super::convert::*;
use super::describe::Describer;
use super::status::*;

/// Runs one call of the lease service and records its outcome ([`crate::metrics`]).
pub(crate) async fn observed<T>(
    method: &'static str,
    call: impl std::future::Future<Output = Result<T, Status>>,
) -> Result<T, Status> {
    let started = tokio::time::Instant::now();
    let result = call.await;
    crate::metrics::record_call(method, started.elapsed(), result.as_ref().err());
    result
}

/// `PartitionLeaseService` over a [`Gateway`], forwarding calls on leases that other
/// instances serve to them through [`Peers`].
#[derive(Debug, Clone)]
pub struct LeaseService {
    gateway: Arc<Gateway>,
    subscriptions: Subscriptions,
    peers: Arc<Peers>,
    auth: Arc<Auth>,
    /// The long calls open on each client connection (`crate::calls`).
    long_calls: Arc<LongCalls>,
}

impl LeaseService {
    /// The service with no identities and no policy: everyone may do everything.
    pub fn new(gateway: Arc<Gateway>, peers: Arc<Peers>) -> Self {
        Self {
            subscriptions: Subscriptions::new(gateway.clone()),
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

    /// Where a call on `lease_id` is served, resolved once: forwarded to the instance the id
    /// names when this instance does not know the lease (unless the call was forwarded here
    /// already), or served here on the lease, once the caller may take `action` on its group
    /// and topic and is the identity that acquired it; otherwise why neither (the lease
    /// ended, or is unknown).
    fn on_lease<T>(
        &self,
        request: &Request<T>,
        caller: &Caller,
        action: Action,
        lease_id: &str,
    ) -> Result<Serve, Status> {
        let resolved = self.gateway.resolve(lease_id);
        if let Some(by) = request.metadata().get(FORWARDED_BY) {
            tracing::debug!(
                forwarded_by = ?by,
                lease_ref = %lease_ref(lease_id),
                "a call forwarded by another instance",
            );
        } else if let Resolved::Elsewhere { instance, .. } = resolved {
            return Ok(Serve::Forward(instance));
        }
        let lease = match action {
            Action::Release => resolved.here_to_release(),
            _ => resolved.here(),
        }
        .map_err(status_of)?;
        let (group, topic) = (&lease.key.group, &lease.key.topic);
        self.auth
            .check(caller, action, group, topic)
            .and_then(|()| auth::check_owner(lease.owner.as_deref(), caller, action, group, topic))
            .map_err(|err| {
                tracing::info!(parent: &lease.span, error = %err, "call refused");
                status_of(err)
            })?;
        Ok(Serve::Here(lease))
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
}

/// Where a call on a lease is served ([`LeaseService::on_lease`]).
enum Serve {
    /// Here, on this lease.
    Here(Arc<Lease>),
    /// By this other instance: the call is forwarded there.
    Forward(String),
}

pub(crate) type ReadResponseStream = super::forward::ReadResponses;

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
                lease_id: granted.lease_id.into_string(),
                topic: granted.key.topic,
                partition: granted.key.partition,
                fencing_token: granted.fencing_token.get(),
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
        let lease = match self.on_lease(&request, &caller, Action::Read, &request.get_ref().lease_id)? {
            Serve::Here(lease) => lease,
            Serve::Forward(instance) => {
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
                        "Read",
                    ),
                    long,
                ))),
                Err(status) => Err(self.peers.failed(&route, status).await),
            };
            }
        };
        let deadline = deadline_of(request.metadata());
        let stream = self
            .gateway
            .read(
                &lease,
                limits,
                request.get_ref().from_offset,
                request.get_ref().if_seek_epoch.map(SeekEpoch::from_wire),
            )
            .await
            .map_err(status_of)?;
        Ok(Response::new(holding(
            until_deadline(
                Box::pin(stream.map(|item| item.map(ReadBatch::into_response).map_err(status_of))),
                deadline,
                "Read",
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
        if let Some(queue) = &mut spec.queue {
            for topic in &spec.topics {
                let dead_letters = Gateway::dead_letter_topic_of(
                    &spec.group,
                    topic,
                    queue.asked_dead_letter_topic.as_deref(),
                )
                .map_err(status_of)?;
                self.auth
                    .check(&caller, Action::DeadLetter, &spec.group, &dead_letters)
                    .map_err(status_of)?;
                queue.dead_letter_topics.insert(topic.clone(), dead_letters);
            }
        }
        let long = self
            .long_calls
            .admit(request.remote_addr(), "Subscribe")
            .map_err(status_of)?;
        let deadline = deadline_of(request.metadata());
        let (group, member_id) = (spec.group.clone(), spec.member_id.clone());
        let events: Self::SubscribeStream = match self.subscriptions.subscribe(spec).await {
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
                        joined_at: Some(timestamp(from_unix_ms(record.joined_at_ms))),
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
            let lease = match self.on_lease(&request, &caller, Action::Seek, &lease_id)? {
                Serve::Here(lease) => lease,
                Serve::Forward(instance) => {
                    return self
                        .forward(
                            "Seek",
                            &instance,
                            &lease_id,
                            request,
                            &caller,
                            |mut c, r| async move { c.seek(r).await },
                        )
                        .await
                }
            };
            let (offset, seek_epoch) =
                self.gateway.seek(&lease, target).await.map_err(status_of)?;
            Ok(Response::new(v1::SeekResponse {
                offset,
                seek_epoch: seek_epoch.get(),
            }))
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
            let lease = match self.on_lease(&request, &caller, Action::Commit, &lease_id)? {
                Serve::Here(lease) => lease,
                Serve::Forward(instance) => {
                    return self
                        .forward(
                            "Commit",
                            &instance,
                            &lease_id,
                            request,
                            &caller,
                            |mut c, r| async move { c.commit(r).await },
                        )
                        .await
                }
            };
            let req = request.get_ref();
            let metadata = self
                .gateway
                .commit(&lease, req.offset, req.metadata.as_deref())
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
            let lease = match self.on_lease(&request, &caller, Action::Release, &lease_id)? {
                Serve::Here(lease) => lease,
                Serve::Forward(instance) => {
                    return self
                        .forward(
                            "Release",
                            &instance,
                            &lease_id,
                            request,
                            &caller,
                            |mut c, r| async move { c.release(r).await },
                        )
                        .await
                }
            };
            let req = request.get_ref();
            let committed_offset = self
                .gateway
                .release(&lease, req.commit_offset)
                .await
                .map_err(status_of)?;
            Ok(Response::new(v1::ReleaseResponse { committed_offset }))
        })
        .await
    }

    type DeliverStream = super::forward::DeliverResponses;

    async fn deliver(
        &self,
        request: Request<v1::DeliverRequest>,
    ) -> Result<Response<Self::DeliverStream>, Status> {
        observed("Deliver", async move {
            let caller = self.caller(&request)?;
            let (queue, dead_letter_topic) =
                deliver_spec(request.get_ref()).map_err(status_of)?;
            let long = self
                .long_calls
                .admit(request.remote_addr(), "Deliver")
                .map_err(status_of)?;
            let deadline = deadline_of(request.metadata());
            let lease_id = request.get_ref().lease_id.clone();
            let lease = match self.on_lease(&request, &caller, Action::Read, &lease_id)? {
                Serve::Here(lease) => lease,
                Serve::Forward(instance) => {
                    let lease_ref = lease_ref(&lease_id).to_string();
                    let route = self
                        .peers
                        .route(&lease_ref, &instance, true)
                        .await
                        .map_err(status_of)?;
                    tracing::info!(peer = %instance, address = %route.address, %lease_ref, "proxying a Deliver from the serving instance");
                    let outgoing = self.peers.outgoing(request.into_inner(), deadline, &caller);
                    return match route.client().deliver(outgoing).await {
                        Ok(answer) => Ok(Response::new(holding(
                            until_deadline(
                                self.peers.proxy(route, answer.into_inner(), Failure::Lease),
                                deadline,
                                "Deliver",
                            ),
                            long,
                        ))),
                        Err(status) => Err(self.peers.failed(&route, status).await),
                    };
                }
            };
            let dead_letter_topic =
                Gateway::dead_letter_topic(&lease, dead_letter_topic.as_deref())
                    .map_err(status_of)?;
            self.auth
                .check(&caller, Action::DeadLetter, &lease.key.group, &dead_letter_topic)
                .map_err(status_of)?;
            let settings = DeliverSettings {
                queue,
                dead_letter_topic,
            };
            let stream = self
                .gateway
                .deliver(&lease, settings, None)
                .await
                .map_err(status_of)?;
            Ok(Response::new(holding(
                until_deadline(
                    Box::pin(stream.map(|item| {
                        item.map(crate::lease::Delivered::into_response)
                            .map_err(status_of)
                    })),
                    deadline,
                    "Deliver",
                ),
                long,
            )))
        })
        .await
    }

    async fn acknowledge(
        &self,
        request: Request<v1::AcknowledgeRequest>,
    ) -> Result<Response<v1::AcknowledgeResponse>, Status> {
        observed("Acknowledge", async move {
            let caller = self.caller(&request)?;
            let acks = acks_of(request.get_ref()).map_err(status_of)?;
            let lease_id = request.get_ref().lease_id.clone();
            let lease = match self.on_lease(&request, &caller, Action::Commit, &lease_id)? {
                Serve::Here(lease) => lease,
                Serve::Forward(instance) => {
                    return self
                        .forward(
                            "Acknowledge",
                            &instance,
                            &lease_id,
                            request,
                            &caller,
                            |mut c, r| async move { c.acknowledge(r).await },
                        )
                        .await
                }
            };
            let outcomes = self.gateway.acknowledge(&lease, &acks).map_err(status_of)?;
            Ok(Response::new(v1::AcknowledgeResponse {
                outcomes: outcomes.into_iter().map(ack_outcome).collect(),
            }))
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
                leases: Describer {
                    gateway: &self.gateway,
                    peers: &self.peers,
                }
                .with_live_details(&page, deadline)
                .await,
                next_page_token: next
                    .as_ref()
                    .map(validate::page_token_after)
                    .unwrap_or_default(),
            }))
        })
        .await
    }
}
