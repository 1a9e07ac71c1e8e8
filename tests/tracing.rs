//! OpenTelemetry traces over OTLP/gRPC: a real gateway with `--otlp-endpoint` sends its
//! spans to a collector the test runs (the OTLP trace service, in process, on loopback): a
//! span per gRPC call that continues the caller's W3C trace context, and the lease's span
//! under the Acquire that granted it.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use kafka_lease_client::proto;
use kafka_lease_testkit::{unique_name, wait_for};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use support::{create_topic, unique_prefix, GatewayProcess};

/// (trace id, span id, parent span id, name, service.instance.id) of every span received.
type Received = Arc<Mutex<Vec<(Vec<u8>, Vec<u8>, Vec<u8>, String, String)>>>;

struct Collector(Received);

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut received = self.0.lock().expect("lock");
        for resource_spans in request.into_inner().resource_spans {
            let instance = resource_spans
                .resource
                .iter()
                .flat_map(|r| r.attributes.iter())
                .find(|kv| kv.key == "service.instance.id")
                .and_then(|kv| kv.value.as_ref())
                .map(|v| format!("{:?}", v.value))
                .unwrap_or_default();
            for scope in resource_spans.scope_spans {
                for span in scope.spans {
                    received.push((
                        span.trace_id,
                        span.span_id,
                        span.parent_span_id,
                        span.name,
                        instance.clone(),
                    ));
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_continue_the_callers_trace_and_leases_are_spans_of_their_acquire() {
    let services = kafka_lease_testkit::require_services!();
    let received: Received = Arc::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let collector_addr = listener.local_addr().expect("addr");
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(Collector(received.clone())))
            .serve_with_incoming(tokio_stream_of(listener)),
    );

    let topic = create_topic(&services, 1).await;
    let instance = unique_name("gw-traced");
    let endpoint = format!("http://{collector_addr}");
    let mut gateway = GatewayProcess::start(
        &services,
        &unique_prefix(),
        &instance,
        &["--otlp-endpoint", &endpoint],
    )
    .await;

    // The caller's trace: a W3C traceparent on the Acquire and on the Release.
    let trace_id = format!("{:032x}", rand_u128());
    let caller_span = "00f067aa0ba902b7";
    let traceparent = format!("00-{trace_id}-{caller_span}-01");
    let client = gateway.client().await;
    let mut acquire = tonic::Request::new(proto::AcquireRequest {
        group: unique_name("traced"),
        topic: topic.clone(),
        member: "tracer".into(),
        ..Default::default()
    });
    acquire
        .metadata_mut()
        .insert("traceparent", traceparent.parse().expect("ascii"));
    let granted = client
        .raw()
        .acquire(acquire)
        .await
        .expect("acquire")
        .into_inner();
    let mut release = tonic::Request::new(proto::ReleaseRequest {
        lease_id: granted.lease_id.clone(),
        ..Default::default()
    });
    release
        .metadata_mut()
        .insert("traceparent", traceparent.parse().expect("ascii"));
    client.raw().release(release).await.expect("release");
    // An untraced call starts a trace of its own.
    client
        .raw()
        .list_leases(proto::ListLeasesRequest::default())
        .await
        .expect("list");

    // SIGTERM: the gateway flushes its spans on the way out.
    gateway.signal("TERM");
    assert_eq!(gateway.wait_exit(Duration::from_secs(20)).await, Some(0));
    let spans = wait_for(
        "the spans of the traced calls",
        Duration::from_secs(10),
        || {
            let spans = received.lock().expect("lock").clone();
            let ours = spans.iter().filter(|s| hex(&s.0) == trace_id).count();
            async move { (ours >= 3).then_some(spans) }
        },
    )
    .await;
    let in_trace: Vec<_> = spans.iter().filter(|s| hex(&s.0) == trace_id).collect();
    let named = |name: &str| {
        in_trace
            .iter()
            .find(|s| s.3 == name)
            .unwrap_or_else(|| panic!("no {name} span in the caller's trace: {in_trace:?}"))
    };
    let acquire = named("kafka_lease.v1.PartitionLeaseService/Acquire");
    let release = named("kafka_lease.v1.PartitionLeaseService/Release");
    let lease = named("lease");
    assert_eq!(
        hex(&acquire.2),
        caller_span,
        "the call's parent is the caller's span"
    );
    assert_eq!(hex(&release.2), caller_span);
    assert_eq!(
        lease.2, acquire.1,
        "the lease's span is a child of its Acquire's"
    );
    assert!(
        acquire.4.contains(&instance),
        "the resource names the instance: {}",
        acquire.4
    );
    let list = spans
        .iter()
        .find(|s| s.3 == "kafka_lease.v1.PartitionLeaseService/ListLeases")
        .expect("the untraced call's span");
    assert_ne!(hex(&list.0), trace_id);
    assert!(list.2.is_empty(), "an untraced call is a root span");
    server.abort();
}

fn rand_u128() -> u128 {
    use std::hash::{BuildHasher, Hasher};
    let mut a = std::collections::hash_map::RandomState::new().build_hasher();
    a.write_u8(1);
    let mut b = std::collections::hash_map::RandomState::new().build_hasher();
    b.write_u8(2);
    (u128::from(a.finish()) << 64) | u128::from(b.finish())
}

fn tokio_stream_of(
    listener: tokio::net::TcpListener,
) -> impl futures::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    futures::stream::unfold(listener, |listener| async move {
        let accepted = listener.accept().await.map(|(stream, _)| stream);
        Some((accepted, listener))
    })
}
