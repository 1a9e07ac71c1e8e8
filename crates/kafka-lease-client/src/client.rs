//! The connection to a gateway ([`Client`]): acquiring leases and listing them.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tonic::metadata::MetadataValue;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::connection::{Connection, Transport};
use crate::convert::Reset;
use crate::convert::{duration_from_proto, duration_to_proto, system_time_from_proto};
use crate::error::{Error, Result, StatusDetails};
use crate::lease::Lease;
use crate::subscription::{SubscribeOptions, Subscription};
use kafka_lease_proto::v1 as proto;
use kafka_lease_proto::v1::partition_lease_service_client::PartitionLeaseServiceClient;

/// A connection to a kafka-lease gateway. Cheap to clone: clones share one HTTP/2 channel.
#[derive(Debug, Clone)]
pub struct Client {
    connection: Connection,
}

/// TLS towards the gateway: the CA its certificate chains to, and for mutual TLS this
/// client's certificate and key. All PEM.
#[derive(Clone, Default)]
pub struct ClientTls {
    ca_pem: Option<Vec<u8>>,
    identity: Option<(Vec<u8>, Vec<u8>)>,
    domain: Option<String>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("ca", &self.ca_pem.is_some())
            .field("client_certificate", &self.identity.is_some())
            .field("domain", &self.domain)
            .finish()
    }
}

impl ClientTls {
    /// TLS checking the gateway's certificate against the CA certificates in `ca_pem`.
    pub fn new(ca_pem: impl Into<Vec<u8>>) -> ClientTls {
        ClientTls {
            ca_pem: Some(ca_pem.into()),
            ..ClientTls::default()
        }
    }

    /// Presents `cert_pem` (chain, leaf first) with its `key_pem`: mutual TLS.
    pub fn client_certificate(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> ClientTls {
        self.identity = Some((cert_pem.into(), key_pem.into()));
        self
    }

    /// Checks the gateway's certificate for `domain` instead of the endpoint's host.
    pub fn domain(mut self, domain: impl Into<String>) -> ClientTls {
        self.domain = Some(domain.into());
        self
    }

    fn config(&self) -> ClientTlsConfig {
        let mut config = ClientTlsConfig::new();
        if let Some(ca) = &self.ca_pem {
            config = config.ca_certificate(Certificate::from_pem(ca));
        }
        if let Some((cert, key)) = &self.identity {
            config = config.identity(Identity::from_pem(cert, key));
        }
        if let Some(domain) = &self.domain {
            config = config.domain_name(domain.clone());
        }
        config
    }
}

impl Client {
    /// Connects to the gateway at `endpoint`, e.g. `"http://127.0.0.1:50051"`.
    ///
    /// # Errors
    /// [`Error::InvalidEndpoint`] if `endpoint` is not a valid URI, [`Error::Transport`] if
    /// the connection cannot be made (retryable).
    pub async fn connect(endpoint: impl Into<String>) -> Result<Client> {
        let endpoint = endpoint.into();
        let channel = Endpoint::from_shared(endpoint.clone())
            .map_err(|source| Error::InvalidEndpoint { endpoint, source })?
            .connect()
            .await
            .map_err(Error::Transport)?;
        Ok(Client::from_channel(channel))
    }

    /// Connects over TLS to the gateway at `endpoint`, e.g. `"https://gw.example:50051"`.
    ///
    /// # Errors
    /// As [`Client::connect`]; a certificate the CA does not vouch for, or a gateway that
    /// refuses this client's certificate, is [`Error::Transport`].
    pub async fn connect_tls(endpoint: impl Into<String>, tls: &ClientTls) -> Result<Client> {
        let endpoint = endpoint.into();
        let channel = Endpoint::from_shared(endpoint.clone())
            .map_err(|source| Error::InvalidEndpoint {
                endpoint: endpoint.clone(),
                source,
            })?
            .tls_config(tls.config())
            .map_err(Error::Transport)?
            .connect()
            .await
            .map_err(Error::Transport)?;
        Ok(Client::from_channel(channel))
    }

    /// Sends `token` as `authorization: Bearer <token>` with every call (for a gateway
    /// with a tokens file; use TLS, or the token crosses the network readable).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the token cannot be a header value.
    pub fn with_bearer_token(mut self, token: &str) -> Result<Client> {
        let value = MetadataValue::try_from(format!("Bearer {token}")).map_err(|_| {
            Error::InvalidArgument {
                message: "the bearer token is not usable as a header value: it must be \
                          visible ASCII"
                    .into(),
                details: StatusDetails::default(),
            }
        })?;
        self.connection.credentials.bearer = Some(value);
        Ok(self)
    }

    /// Spreads calls over several gateway instances of one deployment, e.g.
    /// `["http://10.0.0.7:50051", "http://10.0.0.8:50051"]`: each call goes to whichever
    /// instance is least loaded of two picked at random, and a lease's calls may land on any
    /// of them (the instances forward calls on leases they do not serve). Instances that
    /// cannot be reached are left out until they can. Behind one address (a Kubernetes
    /// Service, a load balancer) [`Client::connect`] is all you need. Call it within a Tokio
    /// runtime: the channel watches its endpoints from a task of its own.
    ///
    /// # Errors
    /// [`Error::InvalidEndpoint`] if an endpoint is not a valid URI, [`Error::NoEndpoints`]
    /// if there is none.
    pub fn connect_balanced<I, S>(endpoints: I) -> Result<Client>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut parsed = Vec::new();
        for endpoint in endpoints {
            let endpoint = endpoint.into();
            parsed.push(
                Endpoint::from_shared(endpoint.clone())
                    .map_err(|source| Error::InvalidEndpoint { endpoint, source })?,
            );
        }
        if parsed.is_empty() {
            return Err(Error::NoEndpoints);
        }
        Ok(Client::from_channel(Channel::balance_list(
            parsed.into_iter(),
        )))
    }

    /// Uses an existing channel, e.g. one built with TLS, timeouts or `connect_lazy`.
    pub fn from_channel(channel: Channel) -> Client {
        Client {
            connection: Connection::new(channel),
        }
    }

    /// Sets the largest response message this client accepts (default
    /// [`DEFAULT_MAX_DECODING_MESSAGE_SIZE`](crate::DEFAULT_MAX_DECODING_MESSAGE_SIZE)). A larger one fails its call, or ends its Read,
    /// with [`Error::OutOfRange`].
    pub fn max_decoding_message_size(mut self, limit: usize) -> Client {
        self.connection.max_decoding_message_size = limit;
        self
    }

    /// The generated gRPC client, for calls and options this facade does not cover. It
    /// shares this client's channel and sends its bearer token.
    pub fn raw(&self) -> PartitionLeaseServiceClient<Transport> {
        self.connection.raw()
    }

    /// Joins a group as a member for some topics: the gateways share the topics' partitions
    /// among the group's members (⌊P/M⌋ or ⌈P/M⌉ each), and the [`Subscription`] carries
    /// the member's leases, their records and the leases it gives up. Returns once the
    /// member has joined.
    ///
    /// ```no_run
    /// use kafka_lease_client::{Client, SubscribeOptions, SubscriptionEvent};
    ///
    /// # async fn run(client: Client) -> kafka_lease_client::Result<()> {
    /// let mut member = client
    ///     .subscribe(SubscribeOptions::new("billing", ["payments"]).member_id("worker-1"))
    ///     .await?;
    /// while let Some(event) = member.next_event().await {
    ///     match event? {
    ///         SubscriptionEvent::Records { partition, batch } => {
    ///             // … process batch.records …
    ///             if let Some(next) = batch.next_offset() {
    ///                 partition.commit(next).await?;
    ///             }
    ///         }
    ///         SubscriptionEvent::Revoking { partition, .. } => {
    ///             // Everything processed is committed already: nothing to add.
    ///             println!("giving up {}/{}", partition.topic(), partition.partition());
    ///         }
    ///         _ => {}
    ///     }
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] (names, member id, limits), [`Error::NotFound`] (a topic
    /// does not exist), [`Error::Other`] with reason [`Reason::MemberActive`](crate::Reason::MemberActive)
    /// (the member id is in use by a live subscription), [`Error::Unavailable`] (retryable).
    pub async fn subscribe(&self, options: SubscribeOptions) -> Result<Subscription> {
        Subscription::open(&self.connection, options).await
    }

    /// The members subscribed to `group` (every topic, or only `topic`), across every
    /// gateway instance, each with the partitions it holds, its topic's group epoch and the
    /// partitions that epoch's target assignment gives it: [`proto::MemberInfo`] as the
    /// gateway sends it.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] (bad names), [`Error::Unavailable`] (Consul unreachable).
    pub async fn list_members(
        &self,
        group: impl Into<String>,
        topic: Option<String>,
    ) -> Result<Vec<proto::MemberInfo>> {
        let request = proto::ListMembersRequest {
            group: group.into(),
            topic,
        };
        Ok(self.raw().list_members(request).await?.into_inner().members)
    }

    /// Takes an exclusive lease on a partition.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] (bad names, TTL, wait or partition), [`Error::NotFound`]
    /// (no such topic or partition), [`Error::Busy`] (leased by another member and `wait` ran
    /// out; the message names the holder, and so do [`Error::metadata`]'s `holder_member` and
    /// `partition`, with [`Error::retry_after`] until its lease expires where the gateway
    /// knows it), [`Error::Unavailable`] (retryable).
    ///
    /// A retryable failure is tried again ([`AcquireOptions::retries`]); the last one is
    /// returned. (A lease granted to an attempt whose answer was lost ends at once: the
    /// gateway sees its caller gone.)
    pub async fn acquire(&self, options: AcquireOptions) -> Result<Lease> {
        let requested_ttl = options.ttl;
        let requested_group = options.group.clone();
        let retries = options.retries.unwrap_or(DEFAULT_ACQUIRE_RETRIES);
        let request = options.into_request();
        let mut backoff = Duration::from_millis(100);
        let mut attempt = 0;
        let response = loop {
            match self.raw().acquire(request.clone()).await {
                Ok(response) => break response.into_inner(),
                Err(status) => {
                    let err = Error::from(status);
                    if attempt >= retries || !err.is_retryable() {
                        return Err(err);
                    }
                    attempt += 1;
                    tokio::time::sleep(err.retry_after().unwrap_or(backoff)).await;
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
            }
        };
        Ok(Lease::from_acquired(
            self.connection.clone(),
            response,
            requested_group,
            requested_ttl,
        ))
    }

    /// The held leases across every gateway instance, ordered by group, topic and partition:
    /// every page of them, fetched one after another ([`LeaseFilter::page_size`] at a time).
    pub async fn list_leases(&self, filter: LeaseFilter) -> Result<Vec<LeaseInfo>> {
        let mut all = Vec::new();
        let mut page_token = String::new();
        loop {
            let request = proto::ListLeasesRequest {
                group: filter.group.clone(),
                topic: filter.topic.clone(),
                page_size: filter.page_size,
                page_token,
            };
            let response = self.raw().list_leases(request).await?.into_inner();
            all.extend(response.leases.into_iter().map(LeaseInfo::from));
            if response.next_page_token.is_empty() {
                return Ok(all);
            }
            page_token = response.next_page_token;
        }
    }
}

/// What to acquire: `AcquireOptions::new(group, topic)` plus optional settings. Everything
/// left unset takes the gateway's default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AcquireOptions {
    group: String,
    topic: String,
    partition: Option<i32>,
    member: String,
    ttl: Option<Duration>,
    wait: Option<Duration>,
    reset: Reset,
    retries: Option<u32>,
}

/// How many times [`Client::acquire`] tries again after a retryable failure, by default.
pub const DEFAULT_ACQUIRE_RETRIES: u32 = 4;

impl AcquireOptions {
    /// A lease on any free partition of `topic` for consumer group `group` (both: 1..=249
    /// characters of `[A-Za-z0-9._-]`).
    pub fn new(group: impl Into<String>, topic: impl Into<String>) -> Self {
        AcquireOptions {
            group: group.into(),
            topic: topic.into(),
            ..Self::default()
        }
    }

    /// Asks for this partition instead of letting the gateway pick a free one.
    pub fn partition(mut self, partition: i32) -> Self {
        self.partition = Some(partition);
        self
    }

    /// A label for this client (at most 256 UTF-8 bytes), shown in `ListLeases` and in other
    /// clients' [`Error::Busy`] messages.
    pub fn member(mut self, member: impl Into<String>) -> Self {
        self.member = member.into();
        self
    }

    /// How long the lease survives with no open Read and no call on it. Gateway default
    /// 10 s; allowed 1 s ..= 5 min.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// How long to wait for a partition to become free before answering [`Error::Busy`].
    /// Gateway default 0 (answer at once); at most 5 min.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }

    /// Where to start when the group has no committed offset (default [`Reset::Earliest`]).
    pub fn reset(mut self, reset: Reset) -> Self {
        self.reset = reset;
        self
    }

    /// How many times to try again after a retryable failure ([`Error::is_retryable`]:
    /// Kafka or Consul unavailable behind the gateway, a broken connection), waiting the
    /// gateway's retry advice or a backoff of 100 ms doubling up to 2 s in between. Default
    /// [`DEFAULT_ACQUIRE_RETRIES`]; 0 answers the first failure.
    pub fn retries(mut self, retries: u32) -> Self {
        self.retries = Some(retries);
        self
    }

    /// The request these options describe.
    fn into_request(self) -> proto::AcquireRequest {
        proto::AcquireRequest {
            group: self.group,
            topic: self.topic,
            partition: self.partition,
            member: self.member,
            ttl: self.ttl.map(duration_to_proto),
            wait: self.wait.map(duration_to_proto),
            offset_reset: proto::OffsetReset::from(self.reset) as i32,
        }
    }
}

/// Which leases [`Client::list_leases`] returns; the default lists all of them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaseFilter {
    group: Option<String>,
    topic: Option<String>,
    page_size: u32,
}

impl LeaseFilter {
    /// No filter: every held lease.
    pub fn new() -> Self {
        Self::default()
    }

    /// Only leases of this consumer group.
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.group = Some(group.into());
        self
    }

    /// Only leases of this topic.
    pub fn topic(mut self, topic: impl Into<String>) -> Self {
        self.topic = Some(topic.into());
        self
    }

    /// How many leases each request fetches (the gateway's default, 1,000, when unset; at
    /// most 5,000).
    pub fn page_size(mut self, page_size: u32) -> Self {
        self.page_size = page_size;
        self
    }
}

/// One held lease as [`Client::list_leases`] shows it (never its lease id).
///
/// The live fields (`expires_at`, `position`, `committed_offset`, `high_watermark`, `lag`,
/// `read_lag`)
/// come from the gateway instance serving the lease, whichever instance answered; where it
/// could not be asked, they are `None` and `details_unavailable` says why.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseInfo {
    /// The consumer group.
    pub group: String,
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// The holder's member label.
    pub member: String,
    /// The lease's fencing token.
    pub fencing_token: u64,
    /// When the lease was granted (`UNIX_EPOCH` if the gateway sent none).
    pub acquired_at: SystemTime,
    /// When the lease expires unless renewed.
    pub expires_at: Option<SystemTime>,
    /// The gateway instance serving the lease.
    pub gateway: String,
    /// The read position: with a Read open, the next offset the gateway hands to it; with
    /// none, where the next Read starts (the resume point).
    pub position: Option<i64>,
    /// The group's committed offset for the partition, if it has one.
    pub committed_offset: Option<i64>,
    /// The partition's high watermark.
    pub high_watermark: Option<i64>,
    /// The consumer lag as Kafka's tools give it: `high_watermark - committed_offset`;
    /// `None` while the group has no committed offset. The figure to alert on.
    pub lag: Option<i64>,
    /// `high_watermark - position`: what the Read has still to hand over.
    pub read_lag: Option<i64>,
    /// Why the live fields are missing, when they are.
    pub details_unavailable: Option<String>,
    /// The serving instance's advertised address (`host:port`), where it recorded one.
    pub gateway_address: Option<String>,
    /// The member id of the subscription holding the lease; `None` for an Acquire lease.
    pub member_id: Option<String>,
    /// Its deliveries, for a lease in queue mode (a live detail).
    pub queue: Option<QueueInfo>,
}

/// A queue-mode lease's deliveries, as ListLeases shows them.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueueInfo {
    /// The ordering the queue was opened with.
    pub ordering: crate::Ordering,
    /// Deliveries handed out and not answered.
    pub in_flight: u32,
    /// How long the oldest of them has been out.
    pub oldest_in_flight: Option<Duration>,
    /// Records fetched and waiting to be handed out.
    pub waiting: u32,
    /// Deliveries since the queue opened on this lease.
    pub deliveries: u64,
    /// Of those, deliveries of a record delivered before.
    pub redeliveries: u64,
    /// Records written to the dead letter topic.
    pub dead_letters: u64,
    /// The dead letter topic.
    pub dead_letter_topic: String,
    /// Since the last commit of the queue's progress that landed (since the queue opened,
    /// before the first); `None` from a gateway too old to say.
    pub progress_age: Option<Duration>,
    /// Records done that no landed commit carries yet: what a crash of the serving gateway
    /// now would deliver again, beside the records in flight.
    pub done_not_committed: u64,
}

impl From<proto::QueueInfo> for QueueInfo {
    fn from(info: proto::QueueInfo) -> Self {
        QueueInfo {
            ordering: match proto::DeliveryOrder::try_from(info.ordering) {
                Ok(proto::DeliveryOrder::Key) => crate::Ordering::Key,
                Ok(proto::DeliveryOrder::Unordered) => crate::Ordering::Unordered,
                _ => crate::Ordering::Partition,
            },
            in_flight: info.in_flight,
            oldest_in_flight: duration_from_proto(info.oldest_in_flight),
            waiting: info.waiting,
            deliveries: info.deliveries,
            redeliveries: info.redeliveries,
            dead_letters: info.dead_letters,
            dead_letter_topic: info.dead_letter_topic,
            progress_age: duration_from_proto(info.progress_age),
            done_not_committed: info.done_not_committed,
        }
    }
}

impl From<proto::LeaseInfo> for LeaseInfo {
    fn from(info: proto::LeaseInfo) -> Self {
        LeaseInfo {
            group: info.group,
            topic: info.topic,
            partition: info.partition,
            member: info.member,
            fencing_token: info.fencing_token,
            acquired_at: system_time_from_proto(info.acquired_at).unwrap_or(UNIX_EPOCH),
            expires_at: system_time_from_proto(info.expires_at),
            gateway: info.gateway,
            position: info.position,
            committed_offset: info.committed_offset,
            high_watermark: info.high_watermark,
            lag: info.lag,
            read_lag: info.read_lag,
            details_unavailable: Some(info.details_unavailable).filter(|s| !s.is_empty()),
            gateway_address: Some(info.gateway_address).filter(|s| !s.is_empty()),
            member_id: Some(info.member_id).filter(|s| !s.is_empty()),
            queue: info.queue.map(QueueInfo::from),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acquire_defaults_leave_everything_to_the_gateway() {
        let request = AcquireOptions::new("g", "t").into_request();
        assert_eq!(
            request,
            proto::AcquireRequest {
                group: "g".into(),
                topic: "t".into(),
                partition: None,
                member: String::new(),
                ttl: None,
                wait: None,
                offset_reset: proto::OffsetReset::Earliest as i32,
            }
        );
    }

    #[test]
    fn acquire_options_fill_the_request() {
        let request = AcquireOptions::new("g", "t")
            .partition(3)
            .member("worker-1")
            .ttl(Duration::from_secs(30))
            .wait(Duration::from_millis(1500))
            .reset(Reset::Latest)
            .into_request();
        assert_eq!(request.partition, Some(3));
        assert_eq!(request.member, "worker-1");
        assert_eq!(
            request.ttl,
            Some(prost_types::Duration {
                seconds: 30,
                nanos: 0
            })
        );
        assert_eq!(
            request.wait,
            Some(prost_types::Duration {
                seconds: 1,
                nanos: 500_000_000
            })
        );
        assert_eq!(request.offset_reset, proto::OffsetReset::Latest as i32);
    }

    #[test]
    fn a_balanced_client_needs_valid_endpoints() {
        assert!(matches!(
            Client::connect_balanced(Vec::<String>::new()),
            Err(Error::NoEndpoints)
        ));
        match Client::connect_balanced(["http://127.0.0.1:50051", "not a uri"]) {
            Err(Error::InvalidEndpoint { endpoint, .. }) => assert_eq!(endpoint, "not a uri"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn lease_info_converts() {
        let info = LeaseInfo::from(proto::LeaseInfo {
            group: "g".into(),
            topic: "t".into(),
            partition: 2,
            member: "m".into(),
            fencing_token: 42,
            acquired_at: Some(prost_types::Timestamp {
                seconds: 100,
                nanos: 0,
            }),
            expires_at: None,
            gateway: "gw-1".into(),
            position: Some(5),
            committed_offset: None,
            high_watermark: Some(9),
            lag: Some(4),
            read_lag: Some(4),
            details_unavailable: String::new(),
            gateway_address: "10.0.0.7:50051".into(),
            member_id: String::new(),
            queue: Some(proto::QueueInfo {
                ordering: proto::DeliveryOrder::Key as i32,
                in_flight: 3,
                oldest_in_flight: Some(prost_types::Duration {
                    seconds: 2,
                    nanos: 0,
                }),
                waiting: 7,
                deliveries: 100,
                redeliveries: 4,
                dead_letters: 1,
                dead_letter_topic: "dlq.g.t".into(),
                progress_age: Some(prost_types::Duration {
                    seconds: 3,
                    nanos: 500_000_000,
                }),
                done_not_committed: 17,
            }),
        });
        let queue = info.queue.as_ref().expect("queue");
        assert_eq!(queue.ordering, crate::Ordering::Key);
        assert_eq!(queue.oldest_in_flight, Some(Duration::from_secs(2)));
        assert_eq!(queue.progress_age, Some(Duration::from_millis(3_500)));
        assert_eq!(queue.done_not_committed, 17);
        assert_eq!((queue.in_flight, queue.redeliveries), (3, 4));
        assert_eq!(info.details_unavailable, None);
        assert_eq!(info.gateway_address.as_deref(), Some("10.0.0.7:50051"));
        assert_eq!(info.acquired_at, UNIX_EPOCH + Duration::from_secs(100));
        assert_eq!(info.expires_at, None);
        assert_eq!(info.position, Some(5));
        assert_eq!(info.committed_offset, None);
        assert_eq!(info.lag, Some(4));
    }

    #[tokio::test]
    async fn connect_rejects_a_bad_endpoint() {
        let err = Client::connect("not a uri").await.err();
        assert!(
            matches!(err, Some(Error::InvalidEndpoint { ref endpoint, .. }) if endpoint == "not a uri"),
            "{err:?}"
        );
    }

    #[tokio::test]
    async fn connect_failure_is_retryable() {
        // Port 1 on loopback: nothing listens there.
        let err = Client::connect("http://127.0.0.1:1").await.err();
        assert!(matches!(err, Some(Error::Transport(_))), "{err:?}");
        assert!(err.is_some_and(|e| e.is_retryable()));
    }
}
