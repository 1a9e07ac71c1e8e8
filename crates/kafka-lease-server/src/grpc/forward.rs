//! Forwarding between gateway instances: a call on a lease that another instance serves is
//! sent to that instance, over a connection pool kept per instance, and its answer comes back
//! unchanged; a Read is proxied as a stream, pulled only as fast as the caller reads it.
//!
//! The lease id names the serving instance; the instance's address comes from its record in
//! Consul ([`LockBackend::instance_address`]: one read, then cached until a call to it fails).
//! A forwarded call carries the caller's deadline (`grpc-timeout`, less the time spent here)
//! and the header [`FORWARDED_BY`]; an instance never forwards a call that has that header,
//! so a misrouted call cannot loop.
//!
//! When the serving instance does not answer, what the caller hears depends on what is known
//! (see [`Peers::failed`]): gone from Consul, or nothing listening at its address, ends the
//! lease for the caller (LEASE_LOST: it can only acquire again); registered and listening but
//! not answering is GATEWAY_UNREACHABLE, which a client retries, until Consul notices a dead
//! instance.
//!
//! About 620 lines of code: the pool, the forwarding of unary calls and of streams, and the
//! judging of a peer's failure are one mechanism (a route is counted while a call holds it,
//! and a failure forgets the pool the route came from).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::{Stream, StreamExt};
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Code, Request, Status};
use tonic_types::StatusExt;

use kafka_lease_proto::encoded::partition_lease_service_client::PartitionLeaseServiceClient;
use kafka_lease_proto::v1;
use kafka_lease_proto::v1::gateway_peer_service_client::GatewayPeerServiceClient;
use kafka_lease_proto::wire::{EncodedDeliverResponse, EncodedReadResponse};

use super::status::{status_of, ERROR_DOMAIN};
use crate::auth::Caller;
use crate::calls::ConnectionLimits;
use crate::coordination::LockBackend;
use crate::error::{EndReason, LeaseError, MemberUnreachable};
use crate::tls::ServerTls;

/// The request header that marks a call forwarded by another instance; its value names that
/// instance. A call with it is answered where it lands, never forwarded again.
pub const FORWARDED_BY: &str = "kafka-lease-forwarded-by";

/// How long dialing a peer may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// HTTP/2 pings on peer connections, so that a peer that stopped answering (paused, cut off)
/// ends the Reads proxied from it instead of leaving them silent.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the check "does anything listen at the peer's address" may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// ListLeases asks at most this many instances for live details at once.
pub const DESCRIBE_FANOUT: usize = 8;
/// How long one instance may take to describe its leases for a ListLeases.
pub const DESCRIBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Why no connection to a peer can be made from its advertised address.
#[derive(Debug, thiserror::Error)]
enum Unusable {
    #[error("its advertised address is not usable: {0}")]
    Address(#[source] tonic::transport::Error),
    #[error("TLS towards it cannot be set up: {0}")]
    Tls(#[source] tonic::transport::Error),
}

/// The connections to the other instances, and the forwarding of calls over them.
#[derive(Debug)]
pub struct Peers {
    /// This instance.
    me: String,
    locks: Arc<dyn LockBackend>,
    /// What one pooled connection carries at once: past `streams` calls, or `long_calls`
    /// long ones (Reads, Subscribes), another connection is opened, so a forwarded call never
    /// queues behind the peer's HTTP/2 stream limit nor is refused by its long-call limit
    /// (instances of one deployment share their settings).
    limits: ConnectionLimits,
    peers: Mutex<HashMap<String, Peer>>,
    /// This instance's TLS: set, peers are dialed over TLS, presenting this instance's
    /// certificate and checking theirs against the peer CA.
    tls: Option<Arc<ServerTls>>,
}

/// The pool of connections to one instance.
#[derive(Debug)]
struct Peer {
    address: String,
    connections: Vec<Connection>,
}

#[derive(Clone, Debug)]
struct Connection {
    channel: Channel,
    /// Calls open on it.
    open: Arc<AtomicUsize>,
    /// Long calls (Reads, Subscribes) open on it.
    long: Arc<AtomicUsize>,
}

/// A call's hold on one pooled connection to the serving instance, given back on drop.
#[derive(Debug)]
pub struct Route {
    /// The serving instance.
    pub instance: String,
    /// Where it was dialed.
    pub address: String,
    /// The lease's public reference, for errors and logs.
    pub lease_ref: String,
    channel: Channel,
    open: Arc<AtomicUsize>,
    /// Set for a long call: its count on the connection.
    long: Option<Arc<AtomicUsize>>,
}

impl Drop for Route {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::SeqCst);
        if let Some(long) = &self.long {
            long.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl Route {
    pub fn client(&self) -> PartitionLeaseServiceClient<Channel> {
        // The serving instance bounds what it sends (ReadRequest.max_bytes, a single record
        // alone past it); this side passes on whatever that is.
        PartitionLeaseServiceClient::new(self.channel.clone()).max_decoding_message_size(usize::MAX)
    }
}

/// The end of a lease as a caller hears it when the instance that served it is gone.
fn gone(lease_ref: &str, instance: &str, why: String) -> LeaseError {
    LeaseError::LeaseEnded {
        lease_ref: lease_ref.to_string(),
        reason: EndReason::Lost(format!(
            "the gateway instance {instance:?} that served it {why}; acquire a new lease"
        )),
    }
}

fn lock(peers: &Mutex<HashMap<String, Peer>>) -> MutexGuard<'_, HashMap<String, Peer>> {
    peers.lock().unwrap_or_else(|p| p.into_inner())
}

impl Peers {
    pub fn new(me: String, locks: Arc<dyn LockBackend>, limits: ConnectionLimits) -> Self {
        Peers {
            me,
            locks,
            limits,
            peers: Mutex::new(HashMap::new()),
            tls: None,
        }
    }

    /// Peers are dialed over TLS with `tls`'s certificate and peer CA (read at each new
    /// connection, so a reloaded certificate is used from then on).
    pub fn with_tls(mut self, tls: Option<Arc<ServerTls>>) -> Self {
        self.tls = tls;
        self
    }

    fn endpoint(&self, address: &str) -> Result<Endpoint, Unusable> {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let mut endpoint =
            Endpoint::from_shared(format!("{scheme}://{address}")).map_err(Unusable::Address)?;
        if let Some(tls) = &self.tls {
            let peer = tls.peer();
            let mut config =
                ClientTlsConfig::new().identity(Identity::from_pem(&peer.cert_pem, &peer.key_pem));
            if let Some(ca) = &peer.ca_pem {
                config = config.ca_certificate(Certificate::from_pem(ca));
            }
            endpoint = endpoint.tls_config(config).map_err(Unusable::Tls)?;
        }
        Ok(endpoint)
    }

    /// A connection to `instance` for one call on lease `lease_ref` (`long`: a Read or a
    /// Subscribe): the cached address, else the one its Consul record gives; LEASE_LOST when
    /// it has none (the instance is gone).
    pub async fn route(
        &self,
        lease_ref: &str,
        instance: &str,
        long: bool,
    ) -> Result<Route, LeaseError> {
        let cached = lock(&self.peers).get(instance).map(|p| p.address.clone());
        let address = match cached {
            Some(address) => address,
            None => match self.locks.instance_address(instance).await? {
                Some(address) => address,
                None => {
                    return Err(gone(
                        lease_ref,
                        instance,
                        "is not registered in Consul (it stopped, or lost its session)".into(),
                    ))
                }
            },
        };
        self.route_to(lease_ref, instance, &address, long)
    }

    /// A connection to `instance` at `address` (replacing a pool to another address) for a
    /// call, `long` or short: the first pooled connection with room for it, else a new one.
    pub fn route_to(
        &self,
        lease_ref: &str,
        instance: &str,
        address: &str,
        long: bool,
    ) -> Result<Route, LeaseError> {
        let mut peers = lock(&self.peers);
        let peer = peers.entry(instance.to_string()).or_insert_with(|| Peer {
            address: address.to_string(),
            connections: Vec::new(),
        });
        if peer.address != address {
            *peer = Peer {
                address: address.to_string(),
                connections: Vec::new(),
            };
        }
        let (streams, long_calls) = (
            self.limits.streams as usize,
            self.limits.long_calls as usize,
        );
        let connection = match peer.connections.iter().find(|c| {
            c.open.load(Ordering::SeqCst) < streams
                && (!long || c.long.load(Ordering::SeqCst) < long_calls)
        }) {
            Some(connection) => connection.clone(),
            None => {
                let endpoint = self
                    .endpoint(address)
                    .map_err(|why| LeaseError::GatewayUnreachable {
                        lease_ref: lease_ref.to_string(),
                        gateway: instance.to_string(),
                        address: address.to_string(),
                        detail: why.to_string(),
                    })?
                    .connect_timeout(CONNECT_TIMEOUT)
                    .tcp_nodelay(true)
                    .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
                    .keep_alive_timeout(KEEPALIVE_TIMEOUT)
                    .keep_alive_while_idle(true);
                let connection = Connection {
                    channel: endpoint.connect_lazy(),
                    open: Arc::new(AtomicUsize::new(0)),
                    long: Arc::new(AtomicUsize::new(0)),
                };
                if !peer.connections.is_empty() {
                    tracing::debug!(
                        peer = %instance,
                        %address,
                        connections = peer.connections.len() + 1,
                        "another connection to a peer (the others carry {streams} calls, or \
                         {long_calls} long ones, each)",
                    );
                }
                peer.connections.push(connection.clone());
                connection
            }
        };
        connection.open.fetch_add(1, Ordering::SeqCst);
        if long {
            connection.long.fetch_add(1, Ordering::SeqCst);
        }
        Ok(Route {
            instance: instance.to_string(),
            address: address.to_string(),
            lease_ref: lease_ref.to_string(),
            channel: connection.channel,
            open: connection.open,
            long: long.then_some(connection.long),
        })
    }

    /// A client of `instance`'s peer service at `address`, for ListLeases.
    pub fn describer(
        &self,
        instance: &str,
        address: &str,
    ) -> Result<(GatewayPeerServiceClient<Channel>, Route), LeaseError> {
        let route = self.route_to("", instance, address, false)?;
        let client = GatewayPeerServiceClient::new(route.channel.clone())
            .max_decoding_message_size(usize::MAX);
        Ok((client, route))
    }

    /// Drops the pool of `instance`, so the next call looks its address up again.
    fn forget(&self, instance: &str) {
        lock(&self.peers).remove(instance);
    }

    /// The request to send to the serving instance: `message`, the caller's deadline less
    /// what has passed, and [`FORWARDED_BY`].
    pub fn outgoing<T>(
        &self,
        message: T,
        deadline: Option<tokio::time::Instant>,
        caller: &Caller,
    ) -> Request<T> {
        let mut request = Request::new(message);
        if let Some(deadline) = deadline {
            request.set_timeout(deadline.saturating_duration_since(tokio::time::Instant::now()));
        }
        if let Ok(value) = MetadataValue::try_from(self.me.as_str()) {
            request.metadata_mut().insert(FORWARDED_BY, value);
        }
        // An identity that cannot be a header value is not sent: the serving instance then
        // sees no caller, and refuses whatever needs one.
        for (name, value) in caller.forwarding_headers() {
            if let Ok(value) = MetadataValue::try_from(value.as_str()) {
                request.metadata_mut().insert(name, value);
            }
        }
        request
    }

    /// What the caller hears when a call forwarded over `route` failed with `status`.
    ///
    /// - An answer of the serving instance (it carries this service's ErrorInfo) comes back
    ///   exactly, but for WRONG_GATEWAY: the address now belongs to another instance, so
    ///   the one that served the lease is gone (LEASE_LOST).
    /// - A status without it comes back as it is too (a deadline, a cancellation), unless
    ///   its code is one tonic makes up for a failed connection (UNAVAILABLE, UNKNOWN,
    ///   INTERNAL): the transport failing. The pool is dropped, and: LEASE_LOST when Consul
    ///   no longer has the instance, or nothing listens at its address (a process that died;
    ///   its session ends soon too); GATEWAY_UNREACHABLE (retry) otherwise.
    pub async fn failed(&self, route: &Route, status: Status) -> Status {
        let (lease_ref, instance, address) = (&route.lease_ref, &route.instance, &route.address);
        if let Some(info) = status.get_details_error_info() {
            if info.domain == ERROR_DOMAIN {
                if info.reason == v1::ErrorReason::WrongGateway.as_str_name() {
                    self.forget(instance);
                    return status_of(gone(
                        lease_ref,
                        instance,
                        format!("no longer listens at {address}: another instance does"),
                    ));
                }
                return exactly(&status);
            }
        }
        if !connection_failed(&status) {
            return exactly(&status);
        }
        self.forget(instance);
        let detail = format!("{}: {}", status.code(), status.message());
        let verdict = match self.locks.instance_address(instance).await {
            Ok(None) => Err(format!(
                "is no longer registered in Consul (it stopped, or lost its session; the call \
                 failed with {detail})"
            )),
            Ok(Some(current)) => match probe(&current).await {
                Probe::Refused => Err(format!(
                    "no longer listens at {current} (connection refused; the call failed with \
                     {detail})"
                )),
                Probe::Listening | Probe::Unknown => Ok(detail),
            },
            Err(err) => Ok(format!(
                "{detail}; Consul did not say whether it lives: {err}"
            )),
        };
        let err = match verdict {
            Err(why) => gone(lease_ref, instance, why),
            Ok(detail) => LeaseError::GatewayUnreachable {
                lease_ref: lease_ref.clone(),
                gateway: instance.clone(),
                address: address.clone(),
                detail,
            },
        };
        tracing::warn!(
            peer = %instance,
            %address,
            lease_ref = %lease_ref,
            error = %err,
            "a call forwarded to the serving instance failed",
        );
        status_of(err)
    }

    /// What the caller of a forwarded Subscribe hears when it failed with `status`: the
    /// member's instance's own answer exactly; a failed connection as MEMBER's instance being
    /// unreachable (UNAVAILABLE, retry: when that instance is gone, its member records go
    /// with its session, and the member joins anew wherever it subscribes).
    pub fn failed_member(
        &self,
        route: &Route,
        group: &str,
        member_id: &str,
        status: Status,
    ) -> Status {
        let ours = status
            .get_details_error_info()
            .is_some_and(|info| info.domain == ERROR_DOMAIN);
        if ours || !connection_failed(&status) {
            return exactly(&status);
        }
        self.forget(&route.instance);
        let err = LeaseError::MemberUnreachable(Box::new(MemberUnreachable {
            group: group.to_string(),
            member_id: member_id.to_string(),
            gateway: route.instance.clone(),
            address: route.address.clone(),
            detail: format!("{}: {}", status.code(), status.message()),
        }));
        tracing::warn!(
            peer = %route.instance, address = %route.address, %member_id, error = %err,
            "a Subscribe forwarded to the member's instance failed"
        );
        status_of(err)
    }

    /// Proxies a stream opened on another instance (a Read on the serving instance, a
    /// Subscribe on the member's): each response as it comes, pulled only when the caller's
    /// stream wants the next one (so HTTP/2 flow control carries a slow caller's pace to
    /// the other instance); the end as that instance sent it, or as `on` tells a failure
    /// ([`Peers::failed`] or [`Peers::failed_member`]).
    pub fn proxy<T: Send + 'static>(
        self: &Arc<Self>,
        route: Route,
        inner: tonic::Streaming<T>,
        on: Failure,
    ) -> Proxied<T> {
        struct State<T> {
            peers: Arc<Peers>,
            route: Route,
            inner: tonic::Streaming<T>,
            on: Failure,
            done: bool,
        }
        let state = State {
            peers: self.clone(),
            route,
            inner,
            on,
            done: false,
        };
        Box::pin(futures::stream::unfold(state, |mut st| async move {
            if st.done {
                return None;
            }
            let next = st.inner.message().await;
            match next {
                Ok(Some(response)) => Some((Ok(response), st)),
                Ok(None) => None,
                Err(status) => {
                    st.done = true;
                    let status = match &st.on {
                        Failure::Lease => st.peers.failed(&st.route, status).await,
                        Failure::Member { group, member_id } => {
                            st.peers.failed_member(&st.route, group, member_id, status)
                        }
                    };
                    Some((Err(status), st))
                }
            }
        }))
    }

    /// Forwards a unary call over a route to the serving instance; the answer as
    /// [`Peers::failed`] tells it.
    pub async fn unary<Req, Resp, F, Fut>(
        &self,
        route: Route,
        message: Req,
        deadline: Option<tokio::time::Instant>,
        caller: &Caller,
        call: F,
    ) -> Result<Resp, Status>
    where
        F: FnOnce(PartitionLeaseServiceClient<Channel>, Request<Req>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<Resp>, Status>>,
    {
        let request = self.outgoing(message, deadline, caller);
        match call(route.client(), request).await {
            Ok(response) => Ok(response.into_inner()),
            Err(status) => Err(self.failed(&route, status).await),
        }
    }
}

/// A stream's responses, as the gRPC service hands them to tonic.
pub type Proxied<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// A Read's responses.
pub type ReadResponses = Proxied<EncodedReadResponse>;

/// A Deliver's responses.
pub type DeliverResponses = Proxied<EncodedDeliverResponse>;

/// How a proxied stream tells a failure of the other instance.
#[derive(Debug)]
pub enum Failure {
    /// A lease's Read: [`Peers::failed`].
    Lease,
    /// A member's Subscribe: [`Peers::failed_member`].
    Member { group: String, member_id: String },
}

/// `stream`, ended with DEADLINE_EXCEEDED at `deadline` (the caller's `grpc-timeout`): tonic
/// enforces a call's deadline only until its response headers, and a Read is a stream.
pub fn until_deadline<T: Send + 'static>(
    stream: Proxied<T>,
    deadline: Option<tokio::time::Instant>,
    call: &'static str,
) -> Proxied<T> {
    let Some(deadline) = deadline else {
        return stream;
    };
    let state = (stream, Box::pin(tokio::time::sleep_until(deadline)), false);
    Box::pin(futures::stream::unfold(
        state,
        move |(mut stream, mut sleep, done)| async move {
            if done {
                return None;
            }
            tokio::select! {
                biased;
                item = stream.next() => item.map(|item| (item, (stream, sleep, false))),
                () = &mut sleep => Some((
                    Err(Status::deadline_exceeded(format!(
                        "the {call} reached the caller's deadline (its grpc-timeout)",
                    ))),
                    (stream, sleep, true),
                )),
            }
        },
    ))
}

/// Whether `status` is what tonic makes up when the connection to another instance fails
/// (refused, reset, a broken HTTP/2 stream): UNAVAILABLE, UNKNOWN or INTERNAL without
/// details, or CANCELLED without details, which hyper reports for a call sent on a pooled
/// connection that closed under it (the other instance was killed a moment before). A
/// status with this gateway's details is the other instance's answer; anything else (a
/// deadline, a method the peer does not have) is passed on as it is. (A caller that
/// cancels drops the forwarding call: no status comes back to map.)
fn connection_failed(status: &Status) -> bool {
    if status.get_details_error_info().is_some() {
        return false;
    }
    matches!(
        status.code(),
        Code::Unavailable | Code::Unknown | Code::Internal | Code::Cancelled
    )
}

/// `status` as the serving instance sent it: code, message and details (its ErrorInfo and
/// RetryInfo). Transport headers of the hop are not carried over.
fn exactly(status: &Status) -> Status {
    Status::with_details(
        status.code(),
        status.message(),
        status.details().to_vec().into(),
    )
}

enum Probe {
    Listening,
    Refused,
    Unknown,
}

/// Whether a live server listens at `address` right now. A connection is not enough: a
/// process killed a moment ago may still complete handshakes from its listen backlog while
/// the kernel closes its sockets, and then resets them. An HTTP/2 server sends its SETTINGS
/// frame as soon as it accepts, so a live gateway says something at once; a dead one
/// refuses, resets or closes. A paused one says nothing: unknown.
async fn probe(address: &str) -> Probe {
    use tokio::io::AsyncReadExt as _;
    let connected =
        tokio::time::timeout(PROBE_TIMEOUT, tokio::net::TcpStream::connect(address)).await;
    let mut stream = match connected {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => return Probe::Refused,
        Ok(Err(_)) | Err(_) => return Probe::Unknown,
    };
    let mut byte = [0_u8; 1];
    match tokio::time::timeout(PROBE_TIMEOUT, stream.read(&mut byte)).await {
        Ok(Ok(n)) if n > 0 => Probe::Listening,
        // Closed or reset without a word: nothing serves there any more.
        Ok(Ok(_)) => Probe::Refused,
        Ok(Err(e))
            if matches!(
                e.kind(),
                std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::ConnectionAborted
            ) =>
        {
            Probe::Refused
        }
        Ok(Err(_)) | Err(_) => Probe::Unknown,
    }
}

/// The caller's deadline, from its `grpc-timeout` header, as an instant.
pub fn deadline_of(metadata: &MetadataMap) -> Option<tokio::time::Instant> {
    let value = metadata.get("grpc-timeout")?.to_str().ok()?;
    grpc_timeout(value).map(|d| tokio::time::Instant::now() + d)
}

/// Parses a `grpc-timeout` value: at most 8 digits and a unit (H, M, S, m, u, n).
fn grpc_timeout(value: &str) -> Option<Duration> {
    if value.len() < 2 || value.len() > 9 {
        return None;
    }
    let (digits, unit) = value.split_at(value.len() - 1);
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_connection_is_told_from_the_other_instances_answer() {
        // hyper's word for a call on a pooled connection that closed under it.
        assert!(connection_failed(&Status::cancelled(
            "operation was canceled"
        )));
        assert!(connection_failed(&Status::unavailable(
            "connection refused"
        )));
        assert!(connection_failed(&Status::unknown("h2 protocol error")));
        assert!(!connection_failed(&Status::deadline_exceeded("deadline")));
        assert!(!connection_failed(&Status::unimplemented("no such method")));
        // The other instance's own answer carries this gateway's details.
        let answer = status_of(LeaseError::ShuttingDown);
        assert!(answer.get_details_error_info().is_some());
        assert!(!connection_failed(&answer));
    }

    #[test]
    fn grpc_timeouts_parse_as_the_spec_writes_them() {
        assert_eq!(grpc_timeout("30000000u"), Some(Duration::from_secs(30)));
        assert_eq!(grpc_timeout("5S"), Some(Duration::from_secs(5)));
        assert_eq!(grpc_timeout("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(grpc_timeout("1M"), Some(Duration::from_secs(60)));
        assert_eq!(grpc_timeout("250m"), Some(Duration::from_millis(250)));
        assert_eq!(grpc_timeout("7n"), Some(Duration::from_nanos(7)));
        for bad in ["", "S", "123456789S", "1x", "-1S", "1.5S"] {
            assert_eq!(grpc_timeout(bad), None, "{bad:?}");
        }
    }
}
