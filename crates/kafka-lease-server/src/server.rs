//! Running the gateway: the gRPC server with health and reflection beside the lease service,
//! the health checker, and the graceful shutdown sequence.
//!
//! Shutdown order (each step bounded by the grace period): health NOT_SERVING; no new
//! leases; every lease ended, which ends its Read with UNAVAILABLE after the batch in flight
//! and releases its lock explicitly (no lock-delay for successors); the lock session
//! destroyed; the server stopped.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;
use tonic::transport::Server;
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

use kafka_lease_proto::v1::gateway_peer_service_server::GatewayPeerServiceServer;

use crate::auth::Auth;
use crate::calls::ConnectionLimits;
use crate::coordination::SessionState;
use crate::gateway::Gateway;
use crate::grpc::forward::Peers;
use crate::grpc::{FramedService, LeaseService, PeerService};
use crate::tls::ServerTls;

/// Why the server could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    #[error("building the reflection service failed: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error("the gRPC server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// The health service name a liveness probe asks for (Kubernetes' `grpc.service`): SERVING
/// for as long as the gateway runs, Kafka and Consul or not. The overall status (`""`) and
/// the API's service name are readiness: they follow Kafka, Consul and the lock session.
pub const LIVENESS_SERVICE: &str = "liveness";

/// How often health is re-checked against Kafka and Consul.
const HEALTH_INTERVAL: Duration = Duration::from_secs(1);

/// How the server runs.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// How long a graceful shutdown may take.
    pub grace: Duration,
    /// Calls open at once on one connection: long ones (Read, Subscribe, an Acquire that may
    /// wait; past the bound RESOURCE_EXHAUSTED), and all (HTTP/2
    /// SETTINGS_MAX_CONCURRENT_STREAMS, which leaves short calls room above the long ones: a
    /// client queues calls past it until one ends). See [`crate::calls`].
    pub connection_limits: ConnectionLimits,
    /// How often the server pings a client connection over HTTP/2; a connection that does
    /// not answer within `keepalive_timeout` is closed, and its calls end (a Read's lease
    /// then lives out its TTL).
    pub keepalive_interval: Duration,
    pub keepalive_timeout: Duration,
    /// TLS on the port (and towards peers); `None`: plaintext.
    pub tls: Option<Arc<ServerTls>>,
    /// Identities and the policy.
    pub auth: Arc<Auth>,
    /// Whether the reflection services are served (grpcurl and grpcui use them).
    pub reflection: bool,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            grace: Duration::from_secs(10),
            connection_limits: ConnectionLimits::default(),
            keepalive_interval: Duration::from_secs(20),
            keepalive_timeout: Duration::from_secs(20),
            tls: None,
            auth: Auth::open(),
            reflection: true,
        }
    }
}

/// The largest request message the API accepts, encoded (every legitimate one is far
/// smaller: names are at most 249 characters, commit metadata 4057 bytes). A larger one is
/// refused before it is decoded (tonic answers OUT_OF_RANGE, naming its size and the limit),
/// and the connection goes on serving.
pub const MAX_REQUEST_BYTES: usize = 1024 * 1024;

/// Serves `gateway` on `listener` until `shutdown` resolves, then shuts down gracefully
/// within `options.grace`.
pub async fn serve(
    listener: TcpListener,
    gateway: Arc<Gateway>,
    shutdown: impl Future<Output = ()>,
    options: ServeOptions,
) -> Result<(), ServerError> {
    let grace = options.grace;
    let (reporter, health_service) = tonic_health::server::health_reporter();
    set_health(&reporter, ServingStatus::NotServing).await;
    // Liveness: SERVING from here to the end, whatever Kafka and Consul do. An answer at
    // all is the signal: it comes from this runtime, which a wedged process cannot run.
    reporter
        .set_service_status(LIVENESS_SERVICE, ServingStatus::Serving)
        .await;
    let health_task = tokio::spawn(watch_health(gateway.clone(), reporter.clone()));

    // google.rpc's error details are served too, so that reflection-driven tools (grpcurl,
    // grpcui) can decode the ErrorInfo and RetryInfo in every error status.
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(kafka_lease_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_types::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection_v1 = options
        .reflection
        .then(|| reflection().build_v1())
        .transpose()?;
    let reflection_v1alpha = options
        .reflection
        .then(|| reflection().build_v1alpha())
        .transpose()?;

    // Calls on leases other instances serve go to them over pooled connections, each
    // carrying as many calls as this instance lets a connection carry (instances of one
    // deployment share their settings).
    let limits = options.connection_limits;
    let peers = Arc::new(
        Peers::new(
            gateway.instance().to_string(),
            gateway.locks().clone(),
            limits,
        )
        .with_tls(options.tls.clone()),
    );
    // The certificate, key, CAs, policy and tokens are re-read while the server runs.
    let reloads: Vec<tokio::task::JoinHandle<()>> = [
        options.tls.clone().map(|tls| tokio::spawn(tls.watch())),
        Some(tokio::spawn(options.auth.clone().watch())),
    ]
    .into_iter()
    .flatten()
    .collect();
    let (stop_server, server_stopped) = tokio::sync::oneshot::channel::<()>();
    let router = Server::builder()
        .trace_fn(grpc_span)
        .http2_keepalive_interval(Some(options.keepalive_interval))
        .http2_keepalive_timeout(Some(options.keepalive_timeout))
        .max_concurrent_streams(Some(limits.streams))
        .add_service(health_service)
        .add_optional_service(reflection_v1)
        .add_optional_service(reflection_v1alpha)
        .add_service(FramedService::new(
            LeaseService::new(gateway.clone(), peers)
                .with_auth(options.auth.clone())
                .with_long_calls_per_connection(limits.long_calls),
            MAX_REQUEST_BYTES,
        ))
        .add_service(GatewayPeerServiceServer::new(
            PeerService::new(gateway.clone()).with_auth(options.auth.clone()),
        ));
    let stopped = async {
        let _ = server_stopped.await;
    };
    let server: std::pin::Pin<
        Box<dyn Future<Output = Result<(), tonic::transport::Error>> + Send>,
    > = match &options.tls {
        Some(tls) => Box::pin(
            router
                .serve_with_incoming_shutdown(crate::tls::incoming(listener, tls.clone()), stopped),
        ),
        // TCP_NODELAY: without it Nagle's algorithm holds small ReadResponses back until
        // the client's delayed ACK, adding ~40 ms to delivery latency.
        None => Box::pin(router.serve_with_incoming_shutdown(
            TcpIncoming::from(listener).with_nodelay(Some(true)),
            stopped,
        )),
    };
    tokio::pin!(server);
    let _reloads = AbortOnDrop(reloads);

    tokio::select! {
        result = &mut server => {
            health_task.abort();
            return result.map_err(ServerError::from);
        }
        () = shutdown => {}
    }

    let started = tokio::time::Instant::now();
    tracing::info!(grace = %humantime::format_duration(grace), "shutting down");
    health_task.abort();
    set_health(&reporter, ServingStatus::NotServing).await;
    if tokio::time::timeout(grace, gateway.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("leases were not all released within the grace period");
    }
    let remaining = grace.saturating_sub(started.elapsed());
    if tokio::time::timeout(remaining, gateway.locks().shutdown())
        .await
        .is_err()
    {
        tracing::warn!("the lock session was not destroyed within the grace period");
    }
    let _ = stop_server.send(());
    let remaining = grace
        .saturating_sub(started.elapsed())
        .max(Duration::from_millis(100));
    match tokio::time::timeout(remaining, &mut server).await {
        Ok(result) => result?,
        Err(_) => tracing::warn!("open calls did not finish within the grace period; closing them"),
    }
    tracing::info!(took = ?started.elapsed(), "shutdown complete");
    Ok(())
}

/// The span of one gRPC call, named by its method, continuing the caller's trace when the
/// request carries W3C trace context (`traceparent`). Exported over OTLP when
/// `--otlp-endpoint` is set; every log line of the call carries it.
fn grpc_span(request: &http::Request<()>) -> tracing::Span {
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    let method = request.uri().path().trim_start_matches('/');
    let span = tracing::info_span!(
        "grpc",
        otel.name = %method,
        otel.kind = "server",
        rpc.system = "grpc",
    );
    let parent = opentelemetry::global::get_text_map_propagator(|propagator| {
        propagator.extract(&HeaderExtractor(request.headers()))
    });
    let _ = span.set_parent(parent);
    span
}

/// Reads trace context from HTTP/2 request headers.
struct HeaderExtractor<'a>(&'a http::HeaderMap);

impl opentelemetry::propagation::Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

/// Stops the reload tasks when the server ends.
struct AbortOnDrop(Vec<tokio::task::JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

async fn set_health(reporter: &HealthReporter, status: ServingStatus) {
    reporter.set_service_status("", status).await;
    reporter
        .set_service_status(kafka_lease_proto::SERVICE_NAME, status)
        .await;
}

/// SERVING only while Kafka answers, Consul answers and the lock session is live.
async fn watch_health(gateway: Arc<Gateway>, reporter: HealthReporter) {
    let mut last: Option<ServingStatus> = None;
    let mut ticker = tokio::time::interval(HEALTH_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let (kafka, consul) = tokio::join!(gateway.kafka().ping(), gateway.locks().ping());
        let session_live = matches!(
            &*gateway.locks().session_state().borrow(),
            SessionState::Live { .. }
        );
        let status =
            if kafka.is_ok() && consul.is_ok() && session_live && !gateway.is_shutting_down() {
                ServingStatus::Serving
            } else {
                ServingStatus::NotServing
            };
        if last != Some(status) {
            match (&kafka, &consul) {
                (Err(e), _) => tracing::warn!(error = %e, "health: NOT_SERVING, Kafka unreachable"),
                (_, Err(e)) => {
                    tracing::warn!(error = %e, "health: NOT_SERVING, Consul unreachable")
                }
                _ if !session_live => tracing::warn!("health: NOT_SERVING, no live lock session"),
                _ => tracing::info!(?status, "health"),
            }
            set_health(&reporter, status).await;
            last = Some(status);
        }
    }
}
