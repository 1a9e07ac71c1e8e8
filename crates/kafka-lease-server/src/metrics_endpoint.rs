//! The Prometheus endpoint: `GET /metrics` on `--metrics-listen`, and the per-lease gauges
//! (position, committed offset, lags) and counts (leases per group and topic, Acquires
//! waiting) sampled from the lease table just before each scrape, so they are exact at
//! scrape time. The metric names and everything recorded where it happens are in
//! [`crate::metrics`], a leaf every module records through; this module reads the
//! [`Gateway`], so it sits above it.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;

use crate::gateway::Gateway;
use crate::metrics::{
    MetricsError, ACQUIRES_WAITING, LEASES, LEASE_COMMITTED, LEASE_LAG, LEASE_POSITION,
    LEASE_READ_LAG, QUEUE_DONE_UNCOMMITTED, QUEUE_IN_FLIGHT, QUEUE_OLDEST_SECONDS,
    QUEUE_PROGRESS_AGE_SECONDS,
};

/// Serves `GET /metrics` on `listener` until the task is dropped: the gauges sampled from
/// `gateway`, then everything recorded.
pub async fn serve(listener: TcpListener, handle: PrometheusHandle, gateway: Arc<Gateway>) {
    let sampler = Arc::new(Sampler::default());
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let (handle, gateway, sampler) = (handle.clone(), gateway.clone(), sampler.clone());
            async move {
                sampler.sample(&gateway);
                handle.run_upkeep();
                (
                    [(
                        axum::http::header::CONTENT_TYPE,
                        "text/plain; version=0.0.4; charset=utf-8",
                    )],
                    handle.render(),
                )
            }
        }),
    );
    if let Err(err) = axum::serve(listener, app).await {
        tracing::warn!(error = %err, "the metrics endpoint stopped");
    }
}

/// Binds the metrics listener (before anything else starts, so a taken port is a startup
/// error).
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, MetricsError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| MetricsError::Listen { addr, source })
}

/// The label sets the previous sample set: a group and topic with no lease left shows 0
/// leases, and an ended lease's lags show 0 (the instance that serves the partition next
/// reports them; its position and committed offset keep their last values, which is what
/// they were when it ended).
#[derive(Default)]
struct Sampler {
    seen_groups: Mutex<HashSet<(String, String)>>,
    seen_leases: Mutex<HashSet<(String, String, i32)>>,
    /// The queue-mode leases among them, whose queue gauges go to 0 when they end.
    seen_queues: Mutex<HashSet<(String, String, i32)>>,
}

impl Sampler {
    fn sample(&self, gateway: &Gateway) {
        let leases = gateway.local_leases();
        let mut groups: HashSet<(String, String)> = HashSet::new();
        let mut counts: std::collections::HashMap<(String, String), usize> = Default::default();
        let mut keys = HashSet::new();
        let mut queues = HashSet::new();
        for (key, snapshot) in &leases {
            *counts
                .entry((key.group.clone(), key.topic.clone()))
                .or_default() += 1;
            let labels = [
                ("group", key.group.clone()),
                ("topic", key.topic.clone()),
                ("partition", key.partition.to_string()),
            ];
            metrics::gauge!(LEASE_POSITION, &labels).set(snapshot.position as f64);
            if let Some(committed) = snapshot.committed {
                metrics::gauge!(LEASE_COMMITTED, &labels).set(committed as f64);
            }
            if let Some(lag) = snapshot.lag() {
                metrics::gauge!(LEASE_LAG, &labels).set(lag as f64);
            }
            metrics::gauge!(LEASE_READ_LAG, &labels).set(snapshot.read_lag() as f64);
            if let Some(queue) = &snapshot.queue {
                metrics::gauge!(QUEUE_IN_FLIGHT, &labels).set(queue.in_flight as f64);
                metrics::gauge!(QUEUE_OLDEST_SECONDS, &labels)
                    .set(queue.oldest_in_flight.map_or(0.0, |age| age.as_secs_f64()));
                metrics::gauge!(QUEUE_PROGRESS_AGE_SECONDS, &labels)
                    .set(queue.progress_age.as_secs_f64());
                metrics::gauge!(QUEUE_DONE_UNCOMMITTED, &labels)
                    .set(queue.done_not_committed as f64);
                queues.insert((key.group.clone(), key.topic.clone(), key.partition));
            }
            keys.insert((key.group.clone(), key.topic.clone(), key.partition));
        }
        for ((group, topic), n) in &counts {
            metrics::gauge!(LEASES, "group" => group.clone(), "topic" => topic.clone())
                .set(*n as f64);
            groups.insert((group.clone(), topic.clone()));
        }
        let mut seen = self.seen_groups.lock().unwrap_or_else(|p| p.into_inner());
        for (group, topic) in seen.difference(&groups) {
            metrics::gauge!(LEASES, "group" => group.clone(), "topic" => topic.clone()).set(0.0);
        }
        *seen = groups;
        let mut seen = self.seen_leases.lock().unwrap_or_else(|p| p.into_inner());
        for (group, topic, partition) in seen.difference(&keys) {
            let labels = [
                ("group", group.clone()),
                ("topic", topic.clone()),
                ("partition", partition.to_string()),
            ];
            metrics::gauge!(LEASE_LAG, &labels).set(0.0);
            metrics::gauge!(LEASE_READ_LAG, &labels).set(0.0);
        }
        *seen = keys;
        let mut seen = self.seen_queues.lock().unwrap_or_else(|p| p.into_inner());
        for (group, topic, partition) in seen.difference(&queues) {
            let labels = [
                ("group", group.clone()),
                ("topic", topic.clone()),
                ("partition", partition.to_string()),
            ];
            metrics::gauge!(QUEUE_IN_FLIGHT, &labels).set(0.0);
            metrics::gauge!(QUEUE_OLDEST_SECONDS, &labels).set(0.0);
            metrics::gauge!(QUEUE_PROGRESS_AGE_SECONDS, &labels).set(0.0);
            metrics::gauge!(QUEUE_DONE_UNCOMMITTED, &labels).set(0.0);
        }
        *seen = queues;
        metrics::gauge!(ACQUIRES_WAITING).set(gateway.waiting_acquires() as f64);
    }
}
