//! Prometheus metrics: their names, the recorder, and the recording helpers. A leaf every
//! module records through; it reads nothing of the gateway.
//!
//! Counters and histograms are recorded where things happen, through the `metrics` facade
//! (the lock crate records its own Consul metrics the same way, knowing nothing of
//! Prometheus); this module installs the Prometheus recorder. The endpoint that serves its
//! text on `--metrics-listen`, and samples the per-lease gauges from the lease table before
//! each scrape, is [`crate::metrics_endpoint`].
//!
//! Labels are bounded: method, gRPC code, reason, operation (all fixed sets); group, topic
//! and partition (as many as the leases this instance serves). Never lease ids.

use std::net::SocketAddr;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// gRPC calls answered, by `method` and `code`.
pub const GRPC_REQUESTS: &str = "kafka_lease_grpc_requests_total";
/// Seconds until Acquire, Commit, Seek and Release answered, by `method` and `outcome` (`ok`
/// or the error's reason).
pub const REQUEST_SECONDS: &str = "kafka_lease_request_duration_seconds";
/// Leases this instance serves, by `group` and `topic`.
pub const LEASES: &str = "kafka_lease_leases";
/// Per lease served here, by `group`, `topic`, `partition`: the read position (with a Read
/// open, the next offset it hands to gRPC; with none, where the next Read starts), the
/// group's committed offset, the consumer lag as Kafka's tools give it (high watermark less
/// the committed offset; unset while the group has none), and the read lag (high watermark
/// less the read position).
pub const LEASE_POSITION: &str = "kafka_lease_lease_position";
pub const LEASE_COMMITTED: &str = "kafka_lease_lease_committed_offset";
pub const LEASE_LAG: &str = "kafka_lease_lease_lag";
pub const LEASE_READ_LAG: &str = "kafka_lease_lease_read_lag";
/// Acquires waiting for a partition on this instance.
pub const ACQUIRES_WAITING: &str = "kafka_lease_acquires_waiting";
/// Leases granted, and leases ended by `reason` (released, expired, lost, abandoned,
/// shutdown).
pub const LEASES_GRANTED: &str = "kafka_lease_leases_granted_total";
pub const LEASES_ENDED: &str = "kafka_lease_leases_ended_total";
/// Records handed to Reads, and their size as encoded on the wire (each record's protobuf
/// field, with its key, value, headers and offsets), by `group` and `topic`. Handed to gRPC,
/// not received: a batch counts when the gateway writes it to the stream, and records of a
/// stream that breaks are counted again when a later Read sends them again.
pub const RECORDS_DELIVERED: &str = "kafka_lease_records_delivered_total";
pub const BYTES_DELIVERED: &str = "kafka_lease_bytes_delivered_total";
/// Kafka operations that failed, by `operation`.
pub const KAFKA_ERRORS: &str = "kafka_lease_kafka_errors_total";

/// Histogram buckets for request and Consul latencies, in seconds.
const LATENCY_BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Why the metrics endpoint could not start.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("installing the metrics recorder failed: {0}")]
    Install(String),
    #[error("cannot listen on {addr} for metrics: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// Installs the Prometheus recorder for the process. Call once, before anything records.
pub fn install() -> Result<PrometheusHandle, MetricsError> {
    let recorder = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &LATENCY_BUCKETS)
        .map_err(|e| MetricsError::Install(e.to_string()))?
        .build_recorder();
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder).map_err(|e| MetricsError::Install(e.to_string()))?;
    describe();
    Ok(handle)
}

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(GRPC_REQUESTS, "gRPC calls answered, by method and code");
    describe_histogram!(
        REQUEST_SECONDS,
        Unit::Seconds,
        "time to answer Acquire, Commit, Seek and Release, by method and outcome"
    );
    describe_gauge!(LEASES, "leases this instance serves, by group and topic");
    describe_gauge!(
        LEASE_POSITION,
        "a lease's read position: the next offset its open Read hands over, or where the next Read starts"
    );
    describe_gauge!(
        LEASE_COMMITTED,
        "the group's committed offset for a leased partition"
    );
    describe_gauge!(
        LEASE_LAG,
        "consumer lag as Kafka's tools give it: high watermark minus the group's committed offset"
    );
    describe_gauge!(
        LEASE_READ_LAG,
        "records between a lease's read position and the partition's high watermark"
    );
    describe_gauge!(ACQUIRES_WAITING, "Acquires waiting for a partition here");
    describe_counter!(LEASES_GRANTED, "leases granted by this instance");
    describe_counter!(LEASES_ENDED, "leases ended, by reason");
    describe_counter!(
        RECORDS_DELIVERED,
        "records handed to Reads, by group and topic"
    );
    describe_counter!(
        BYTES_DELIVERED,
        Unit::Bytes,
        "encoded size of the records handed to Reads, by group and topic"
    );
    describe_counter!(KAFKA_ERRORS, "Kafka operations that failed, by operation");
    // Series a dashboard or an alert reads are there from the start, at zero, rather than
    // appearing with their first event (the error counters, labelled by an operation that
    // is known only when it fails, are the exception).
    metrics::counter!(LEASES_GRANTED).increment(0);
    for reason in ["released", "expired", "lost", "abandoned", "shutdown"] {
        metrics::counter!(LEASES_ENDED, "reason" => reason).increment(0);
    }
    metrics::gauge!(ACQUIRES_WAITING).set(0.0);
    kafka_lease_coordination::consul::describe_metrics();
}

/// The delivery counters of one group and topic, looked up once per lease so that a Read's
/// batch only adds to them.
#[derive(Clone)]
pub struct Delivered {
    pub records: metrics::Counter,
    pub bytes: metrics::Counter,
}

impl Delivered {
    pub fn of(group: &str, topic: &str) -> Delivered {
        let labels = [("group", group.to_string()), ("topic", topic.to_string())];
        Delivered {
            records: metrics::counter!(RECORDS_DELIVERED, &labels),
            bytes: metrics::counter!(BYTES_DELIVERED, &labels),
        }
    }
}

impl std::fmt::Debug for Delivered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Delivered").finish_non_exhaustive()
    }
}

/// Records one answered gRPC call: its code, and for the lease calls its latency with the
/// outcome (`ok`, or the error's reason).
pub fn record_call(method: &'static str, elapsed: Duration, status: Option<&tonic::Status>) {
    let code = status.map_or(tonic::Code::Ok, tonic::Status::code);
    metrics::counter!(GRPC_REQUESTS, "method" => method, "code" => code_name(code)).increment(1);
    if matches!(method, "Acquire" | "Commit" | "Seek" | "Release") {
        let outcome = match status {
            None => "ok".to_string(),
            Some(status) => tonic_types::StatusExt::get_details_error_info(status)
                .map(|info| info.reason)
                .unwrap_or_else(|| code_name(status.code()).to_string()),
        };
        metrics::histogram!(REQUEST_SECONDS, "method" => method, "outcome" => outcome)
            .record(elapsed.as_secs_f64());
    }
}

/// The canonical name of a gRPC code, as a label value.
pub fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code as C;
    match code {
        C::Ok => "OK",
        C::Cancelled => "CANCELLED",
        C::Unknown => "UNKNOWN",
        C::InvalidArgument => "INVALID_ARGUMENT",
        C::DeadlineExceeded => "DEADLINE_EXCEEDED",
        C::NotFound => "NOT_FOUND",
        C::AlreadyExists => "ALREADY_EXISTS",
        C::PermissionDenied => "PERMISSION_DENIED",
        C::ResourceExhausted => "RESOURCE_EXHAUSTED",
        C::FailedPrecondition => "FAILED_PRECONDITION",
        C::Aborted => "ABORTED",
        C::OutOfRange => "OUT_OF_RANGE",
        C::Unimplemented => "UNIMPLEMENTED",
        C::Internal => "INTERNAL",
        C::Unavailable => "UNAVAILABLE",
        C::DataLoss => "DATA_LOSS",
        C::Unauthenticated => "UNAUTHENTICATED",
    }
}
