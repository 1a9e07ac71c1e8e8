//! `PartitionLeaseService` over the [`Gateway`]: each call validated, authorized, served
//! here or forwarded to the instance serving its lease, and its outcome recorded.

use std::future::Future;
use std::sync::Arc;

use futures::StreamExt;
use tonic::{Request, Response, Status};

use kafka_lease_proto::encoded::partition_lease_service_client::PartitionLeaseServiceClient;
use kafka_lease_proto::encoded::partition_lease_service_server::PartitionLeaseService;
use kafka_lease_proto::v1;
use kafka_lease_proto::wire::EncodedSubscribeResponse;

use super::forward::{deadline_of, until_deadline, Failure, Peers, Proxied, Route, FORWARDED_BY};
use crate::auth::{self, Action, Auth, Caller};
use crate::calls::{holding, ConnectionLimits, LongCall, LongCalls};
use crate::error::LeaseError;
use crate::gateway::{Gateway, Resolved};
use crate::lease::{lease_ref, DeliverSettings, Lease, SeekEpoch};
use crate::subscribe::{SubscribeSpec, Subscriptions};
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

    /// A Subscribe's settings, validated, with the caller's right to subscribe to each topic
    /// and, in queue mode, to write each topic's dead letters checked.
    fn checked_subscribe_spec(
        &self,
        caller: &Caller,
        request: &v1::SubscribeRequest,
    ) -> Result<SubscribeSpec, Status> {
        let mut spec = subscribe_spec(request).map_err(status_of)?;
        for topic in &spec.topics {
            self.auth
                .check(caller, Action::Subscribe, &spec.group, topic)
                .map_err(status_of)?;
        }
        spec.owner = caller.identity.clone();
        if let Some(queue) = &mut spec.queue {
            for topic in &spec.topics {
                let asked = queue.asked_dead_letter_topic.as_deref();
                let dead_letters =
                    Gateway::dead_letter_topic_of(&spec.group, topic, asked).map_err(status_of)?;
                self.auth
                    .check(caller, Action::DeadLetter, &spec.group, &dead_letters)
                    .map_err(status_of)?;
                queue.dead_letter_topics.insert(topic.clone(), dead_letters);
            }
        }
        Ok(spec)
    }

    /// A Subscribe whose member id is live elsewhere (`active`): when another instance holds
    /// the member's record (a client reconnecting through another instance within its
    /// session grace), the Subscribe goes there, as a call on a lease goes to its serving
    /// instance; otherwise `active` is the answer.
    async fn subscribe_where_the_member_is(
        &self,
        request: Request<v1::SubscribeRequest>,
        caller: &Caller,
        (group, member_id): (String, String),
        deadline: Option<tokio::time::Instant>,
        active: LeaseError,
    ) -> Result<SubscribeEvents, Status> {
        let Some(instance) = self.member_instance(&request, &group, &member_id).await else {
            return Err(status_of(active));
        };
        let member_ref = format!("member {member_id}");
        let route = match self.peers.route(&member_ref, &instance, true).await {
            Ok(route) => route,
            // Gone from Consul since the record was read: its members go with it.
            Err(_) => return Err(status_of(active)),
        };
        tracing::info!(
            peer = %instance, address = %route.address, %group, %member_id,
            "forwarding a Subscribe to the instance that holds the member"
        );
        let outgoing = self.peers.outgoing(request.into_inner(), deadline, caller);
        match route.client().subscribe(outgoing).await {
            Err(status) => Err(self.peers.failed_member(&route, &group, &member_id, status)),
            Ok(answer) => {
                let member = Failure::Member { group, member_id };
                Ok(self.peers.proxy(route, answer.into_inner(), member))
            }
        }
    }

    /// The way to `instance`, which serves the lease `lease_id` (`long`: for a stream), and
    /// the lease's public reference.
    async fn route<'a>(
        &self,
        lease_id: &'a str,
        instance: &str,
        long: bool,
    ) -> Result<(&'a str, Route), Status> {
        let lease_ref = lease_ref(lease_id);
        let route = self
            .peers
            .route(lease_ref, instance, long)
            .await
            .map_err(status_of)?;
        Ok((lease_ref, route))
    }

    /// A unary call on the lease `lease_id`, resolved once ([`LeaseService::on_lease`]):
    /// served here by `serve`, or forwarded with `forward` to the instance serving the lease.
    #[allow(clippy::too_many_arguments)]
    async fn unary_on_lease<Req, Resp, F, FFut, S, SFut>(
        &self,
        method: &'static str,
        request: Request<Req>,
        caller: &Caller,
        action: Action,
        lease_id: &str,
        forward: F,
        serve: S,
    ) -> Result<Response<Resp>, Status>
    where
        F: FnOnce(PeerClient, Request<Req>) -> FFut,
        FFut: Future<Output = Result<Response<Resp>, Status>>,
        S: FnOnce(Arc<Lease>, Req) -> SFut,
        SFut: Future<Output = Result<Resp, LeaseError>>,
    {
        let instance = match self.on_lease(&request, caller, action, lease_id)? {
            Serve::Here(lease) => {
                return serve(lease, request.into_inner())
                    .await
                    .map(Response::new)
                    .map_err(status_of)
            }
            Serve::Forward(instance) => instance,
        };
        let (lease_ref, route) = self.route(lease_id, &instance, false).await?;
        tracing::debug!(
            %method, peer = %instance, address = %route.address, %lease_ref,
            "forwarding a call to the serving instance"
        );
        let deadline = deadline_of(request.metadata());
        self.peers
            .unary(route, request.into_inner(), deadline, caller, forward)
            .await
            .map(Response::new)
    }

    /// A streaming call on the lease `lease_id` (Read, Deliver), resolved once: opened here
    /// by `serve`, or opened with `open` on the instance serving the lease and proxied from
    /// it; either way ended at the caller's deadline, and holding its `long` call's place.
    #[allow(clippy::too_many_arguments)]
    async fn stream_on_lease<Req, M, O, OFut, S, SFut>(
        &self,
        method: &'static str,
        request: Request<Req>,
        caller: &Caller,
        action: Action,
        lease_id: &str,
        long: Option<LongCall>,
        open: O,
        serve: S,
    ) -> Result<Response<Proxied<M>>, Status>
    where
        M: Send + 'static,
        O: FnOnce(PeerClient, Request<Req>) -> OFut,
        OFut: Future<Output = Result<Response<tonic::Streaming<M>>, Status>>,
        S: FnOnce(Arc<Lease>, Req) -> SFut,
        SFut: Future<Output = Result<Proxied<M>, LeaseError>>,
    {
        let deadline = deadline_of(request.metadata());
        let stream = match self.on_lease(&request, caller, action, lease_id)? {
            Serve::Here(lease) => serve(lease, request.into_inner())
                .await
                .map_err(status_of)?,
            Serve::Forward(instance) => {
                let (lease_ref, route) = self.route(lease_id, &instance, true).await?;
                tracing::info!(
                    peer = %instance, address = %route.address, %lease_ref,
                    "proxying a {method} from the serving instance"
                );
                let outgoing = self.peers.outgoing(request.into_inner(), deadline, caller);
                match open(route.client(), outgoing).await {
                    Ok(answer) => self.peers.proxy(route, answer.into_inner(), Failure::Lease),
                    Err(status) => return Err(self.peers.failed(&route, status).await),
                }
            }
        };
        Ok(Response::new(holding(
            until_deadline(stream, deadline, method),
            long,
        )))
    }
}

/// A Subscribe's events, as the gRPC service hands them to tonic.
type SubscribeEvents = Proxied<EncodedSubscribeResponse>;

/// The client of another instance's lease service.
type PeerClient = PartitionLeaseServiceClient<tonic::transport::Channel>;

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
            let address = self.gateway.address().unwrap_or_default();
            Ok(Response::new(acquire_response(granted, address)))
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
            let lease_id = request.get_ref().lease_id.clone();
            self.stream_on_lease(
                "Read",
                request,
                &caller,
                Action::Read,
                &lease_id,
                long,
                |mut peer, request| async move { peer.read(request).await },
                |lease, req| async move {
                    let from = req.if_seek_epoch.map(SeekEpoch::from_wire);
                    let stream = self
                        .gateway
                        .read(&lease, limits, req.from_offset, from)
                        .await?;
                    Ok(read_responses(stream))
                },
            )
            .await
        })
        .await
    }

    type SubscribeStream = SubscribeEvents;

    async fn subscribe(
        &self,
        request: Request<v1::SubscribeRequest>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        observed("Subscribe", async move {
            let caller = self.caller(&request)?;
            let spec = self.checked_subscribe_spec(&caller, request.get_ref())?;
            let long = self
                .long_calls
                .admit(request.remote_addr(), "Subscribe")
                .map_err(status_of)?;
            let deadline = deadline_of(request.metadata());
            let (group, member_id) = (spec.group.clone(), spec.member_id.clone());
            let events: SubscribeEvents = match self.subscriptions.subscribe(spec).await {
                Ok(events) => {
                    Box::pin(events.map(|event| event.map(subscribe_response).map_err(status_of)))
                }
                Err(err @ LeaseError::MemberActive { .. }) => {
                    let member = (group, member_id);
                    self.subscribe_where_the_member_is(request, &caller, member, deadline, err)
                        .await?
                }
                Err(err) => return Err(status_of(err)),
            };
            let events: SubscribeEvents = match deadline {
                Some(deadline) => {
                    Box::pin(events.take_until(tokio::time::sleep_until(deadline)).chain(
                        futures::stream::once(async {
                            Err(Status::deadline_exceeded(
                                "the Subscribe reached the caller's deadline (its grpc-timeout)",
                            ))
                        }),
                    ))
                }
                None => events,
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
            members.retain(|m| {
                self.auth
                    .allows(&caller, Action::List, &req.group, &m.topic)
            });
            Ok(Response::new(list_members_response(&req.group, members)))
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
            self.unary_on_lease(
                "Seek",
                request,
                &caller,
                Action::Seek,
                &lease_id,
                |mut peer, request| async move { peer.seek(request).await },
                |lease, _| async move {
                    let (offset, epoch) = self.gateway.seek(&lease, target).await?;
                    Ok(seek_response(offset, epoch))
                },
            )
            .await
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
            self.unary_on_lease(
                "Commit",
                request,
                &caller,
                Action::Commit,
                &lease_id,
                |mut peer, request| async move { peer.commit(request).await },
                |lease, req| async move {
                    let metadata = self
                        .gateway
                        .commit(&lease, req.offset, req.metadata.as_deref())
                        .await?;
                    Ok(commit_response(req.offset, metadata))
                },
            )
            .await
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
            self.unary_on_lease(
                "Release",
                request,
                &caller,
                Action::Release,
                &lease_id,
                |mut peer, request| async move { peer.release(request).await },
                |lease, req| async move {
                    let committed = self.gateway.release(&lease, req.commit_offset).await?;
                    Ok(release_response(committed))
                },
            )
            .await
        })
        .await
    }

    type DeliverStream = super::forward::DeliverResponses;

    async fn deliver(
        &self,
        request: Request<v1::DeliverRequest>,
    ) -> Result<Response<Self::DeliverStream>, Status> {
        observed("Deliver", async move {
            let caller = &self.caller(&request)?;
            let (queue, dead_letter_topic) = deliver_spec(request.get_ref()).map_err(status_of)?;
            let long = self
                .long_calls
                .admit(request.remote_addr(), "Deliver")
                .map_err(status_of)?;
            let lease_id = request.get_ref().lease_id.clone();
            self.stream_on_lease(
                "Deliver",
                request,
                caller,
                Action::Read,
                &lease_id,
                long,
                |mut peer, request| async move { peer.deliver(request).await },
                |lease, _| async move {
                    let dead_letter_topic =
                        Gateway::dead_letter_topic(&lease, dead_letter_topic.as_deref())?;
                    let group = &lease.key.group;
                    self.auth
                        .check(caller, Action::DeadLetter, group, &dead_letter_topic)?;
                    let settings = DeliverSettings {
                        queue,
                        dead_letter_topic,
                    };
                    let stream = self.gateway.deliver(&lease, settings, None).await?;
                    Ok(deliver_responses(stream))
                },
            )
            .await
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
            self.unary_on_lease(
                "Acknowledge",
                request,
                &caller,
                Action::Commit,
                &lease_id,
                |mut peer, request| async move { peer.acknowledge(request).await },
                |lease, _| async move {
                    let outcomes = self.gateway.acknowledge(&lease, &acks)?;
                    Ok(acknowledge_response(outcomes))
                },
            )
            .await
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
