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
/// Commits answered after their lease's fence deadline, by `group` and `topic`: each may have
/// landed after a successor's commits (the gateway was paused, or the request was held in
/// the network, between its fence check and Kafka). See docs/ARCHITECTURE.md, the commit gate.
pub const COMMITS_LATE: &str = "kafka_lease_commits_late_total";
/// Reads that found records queued when they looked again by themselves (every 250 ms while
/// parked): wake-ups librdkafka did not give, each costing that record up to 250 ms.
pub const READ_RESCUES: &str = "kafka_lease_read_rescues_total";
/// Kafka operations that failed, by `operation`.
pub const KAFKA_ERRORS: &str = "kafka_lease_kafka_errors_total";
/// Queue mode, by `group` and `topic`: deliveries handed to Delivers; of those, deliveries
/// again by `cause` (`retry`: answered RETRY; `deadline`: unanswered past the ack deadline;
/// `handover`: delivered by an earlier holder, whose commit counted the attempt); records
/// written to the dead letter topic by `cause` (`rejected`, `max_deliveries`); and seconds
/// from a delivery to its answer (ACCEPT, RETRY or REJECT), by `type`.
pub const QUEUE_DELIVERIES: &str = "kafka_lease_queue_deliveries_total";
pub const QUEUE_REDELIVERIES: &str = "kafka_lease_queue_redeliveries_total";
pub const QUEUE_DEAD_LETTERS: &str = "kafka_lease_queue_dead_letters_total";
pub const QUEUE_ACK_SECONDS: &str = "kafka_lease_queue_ack_seconds";
/// Answers to deliveries, by `type` (accept, retry, reject, renew) and `outcome` (applied,
/// stale, not_delivered).
pub const QUEUE_ANSWERS: &str = "kafka_lease_queue_answers_total";
/// Per queue-mode lease served here, by `group`, `topic`, `partition`: deliveries in flight,
/// and the age in seconds of the oldest (0 when none is).
pub const QUEUE_IN_FLIGHT: &str = "kafka_lease_queue_in_flight";
pub const QUEUE_OLDEST_SECONDS: &str = "kafka_lease_queue_oldest_in_flight_seconds";
pub const QUEUE_PROGRESS_AGE_SECONDS: &str = "kafka_lease_queue_progress_age_seconds";
pub const QUEUE_DONE_UNCOMMITTED: &str = "kafka_lease_queue_done_not_committed";
/// Subscriptions: target assignments this instance published (one per epoch of a group's
/// topic); the partitions they gave to another member than the epoch before; and the moves
/// beyond the minimum (a target's moves past the fewest any balanced assignment needed, and
/// grants handed back because the newest target gave the partition to another member).
pub const SUBSCRIBE_EPOCHS: &str = "kafka_lease_subscribe_epochs_total";
pub const SUBSCRIBE_MOVES: &str = "kafka_lease_subscribe_moves_total";
pub const SUBSCRIBE_MOVES_BEYOND_MINIMUM: &str = "kafka_lease_subscribe_moves_beyond_minimum_total";

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
        "a lease's read position: the next offset its open Read hands over, or where the next \
         Read starts"
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
    describe_counter!(
        READ_RESCUES,
        "Reads that found records queued when they looked again by themselves: wake-ups \
         librdkafka did not give"
    );
    describe_counter!(
        COMMITS_LATE,
        "commits answered after their lease's fence deadline, which may have landed after a \
         successor's, by group and topic"
    );
    describe_counter!(
        QUEUE_DELIVERIES,
        "queue mode: deliveries handed to Delivers, by group and topic"
    );
    describe_counter!(
        QUEUE_REDELIVERIES,
        "queue mode: deliveries of a record delivered before, by group, topic and cause \
         (retry, deadline, handover)"
    );
    describe_counter!(
        QUEUE_DEAD_LETTERS,
        "queue mode: records written to the dead letter topic, by group, topic and cause \
         (rejected, max_deliveries)"
    );
    describe_histogram!(
        QUEUE_ACK_SECONDS,
        Unit::Seconds,
        "queue mode: seconds from a delivery to its answer, by group, topic and type"
    );
    describe_counter!(
        QUEUE_ANSWERS,
        "queue mode: answers to deliveries, by type and outcome (applied, stale, not_delivered)"
    );
    describe_gauge!(
        QUEUE_IN_FLIGHT,
        "queue mode: deliveries in flight, per lease served here"
    );
    describe_gauge!(
        QUEUE_PROGRESS_AGE_SECONDS,
        Unit::Seconds,
        "queue mode: time since the last commit of a lease's progress that landed (since the \
         queue opened, before the first), per lease served here"
    );
    describe_gauge!(
        QUEUE_DONE_UNCOMMITTED,
        "queue mode: records done that no landed commit carries yet (a crash would deliver \
         them again, beside those in flight), per lease served here"
    );
    describe_gauge!(
        QUEUE_OLDEST_SECONDS,
        Unit::Seconds,
        "queue mode: age of the oldest delivery in flight, per lease served here"
    );
    describe_counter!(
        SUBSCRIBE_EPOCHS,
        "subscriptions: target assignments this instance published, one per epoch of a \
         group's topic"
    );
    describe_counter!(
        SUBSCRIBE_MOVES,
        "subscriptions: partitions the published targets gave another member than the epoch \
         before"
    );
    describe_counter!(
        SUBSCRIBE_MOVES_BEYOND_MINIMUM,
        "subscriptions: moves beyond the fewest a change needed (a target's extra moves, and \
         grants handed back); should stay 0"
    );
    // Series a dashboard or an alert reads are there from the start, at zero, rather than
    // appearing with their first event (the error counters, labelled by an operation that
    // is known only when it fails, are the exception).
    metrics::counter!(LEASES_GRANTED).increment(0);
    for reason in ["released", "expired", "lost", "abandoned", "shutdown"] {
        metrics::counter!(LEASES_ENDED, "reason" => reason).increment(0);
    }
    metrics::gauge!(ACQUIRES_WAITING).set(0.0);
    metrics::counter!(READ_RESCUES).increment(0);
    for name in [
        SUBSCRIBE_EPOCHS,
        SUBSCRIBE_MOVES,
        SUBSCRIBE_MOVES_BEYOND_MINIMUM,
    ] {
        metrics::counter!(name).increment(0);
    }
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

/// Queue mode's counters of one group and topic, looked up once per queue.
#[derive(Clone)]
pub struct QueueCounters {
    pub deliveries: metrics::Counter,
    pub redelivered_retry: metrics::Counter,
    pub redelivered_deadline: metrics::Counter,
    pub redelivered_handover: metrics::Counter,
    pub dead_letters_rejected: metrics::Counter,
    pub dead_letters_max_deliveries: metrics::Counter,
    pub ack_accept: metrics::Histogram,
    pub ack_retry: metrics::Histogram,
    pub ack_reject: metrics::Histogram,
}

impl QueueCounters {
    pub fn of(group: &str, topic: &str) -> QueueCounters {
        let labels = |extra: (&'static str, &'static str)| {
            [
                ("group", group.to_string()),
                ("topic", topic.to_string()),
                (extra.0, extra.1.to_string()),
            ]
        };
        let plain = [("group", group.to_string()), ("topic", topic.to_string())];
        QueueCounters {
            deliveries: metrics::counter!(QUEUE_DELIVERIES, &plain),
            redelivered_retry: metrics::counter!(QUEUE_REDELIVERIES, &labels(("cause", "retry"))),
            redelivered_deadline: metrics::counter!(
                QUEUE_REDELIVERIES,
                &labels(("cause", "deadline"))
            ),
            redelivered_handover: metrics::counter!(
                QUEUE_REDELIVERIES,
                &labels(("cause", "handover"))
            ),
            dead_letters_rejected: metrics::counter!(
                QUEUE_DEAD_LETTERS,
                &labels(("cause", "rejected"))
            ),
            dead_letters_max_deliveries: metrics::counter!(
                QUEUE_DEAD_LETTERS,
                &labels(("cause", "max_deliveries"))
            ),
            ack_accept: metrics::histogram!(QUEUE_ACK_SECONDS, &labels(("type", "accept"))),
            ack_retry: metrics::histogram!(QUEUE_ACK_SECONDS, &labels(("type", "retry"))),
            ack_reject: metrics::histogram!(QUEUE_ACK_SECONDS, &labels(("type", "reject"))),
        }
    }
}

impl std::fmt::Debug for QueueCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueCounters").finish_non_exhaustive()
    }
}

/// Answers of one Acknowledge by type and outcome, recorded together
/// ([`AnswerCounts::record`]): one counter lookup per kind seen, not one per answer.
#[derive(Debug, Default)]
pub struct AnswerCounts {
    /// (type, outcome) → count, in the order first seen (four types, three outcomes).
    counts: Vec<(&'static str, &'static str, u64)>,
}

impl AnswerCounts {
    /// One answer of `kind` with `outcome` (`applied`, `stale` or `not_delivered`).
    pub fn add(&mut self, kind: &'static str, outcome: &'static str) {
        match self
            .counts
            .iter_mut()
            .find(|(k, o, _)| *k == kind && *o == outcome)
        {
            Some((_, _, n)) => *n += 1,
            None => self.counts.push((kind, outcome, 1)),
        }
    }

    pub fn record(&self) {
        for &(kind, outcome, n) in &self.counts {
            metrics::counter!(QUEUE_ANSWERS, "type" => kind, "outcome" => outcome).increment(n);
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
