//! The stream behind a Deliver call: waits for what the queue lets go and hands it to gRPC.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use kafka_lease_proto::wire::EncodedDeliverResponse;
use tokio::time::Instant;

use crate::error::LeaseError;
use crate::lease::read::{suspended_pause, Stop};
use crate::lease::{Fence, Lease};
use crate::records::DeliverBatch;

use super::QueueRun;

/// One response's worth of deliveries of a lease.
#[derive(Debug)]
pub struct Delivered {
    pub batch: DeliverBatch,
    pub high_watermark: i64,
}

impl Delivered {
    /// As a Deliver call sends it.
    pub fn into_response(self) -> EncodedDeliverResponse {
        self.batch.into_response(self.high_watermark)
    }
}

/// What one step of a Deliver produced.
enum Step {
    Batch(DeliverBatch),
    Stop(Stop),
}

type StepFuture = Pin<Box<dyn Future<Output = Step> + Send>>;

/// Waits for deliveries for Deliver `generation`.
async fn step(lease: Arc<Lease>, run: Arc<QueueRun>, generation: u64) -> Step {
    let mut interrupts = lease.interrupts.subscribe();
    loop {
        let ready = run.ready.notified();
        tokio::pin!(ready);
        ready.as_mut().enable();
        let freed = async {
            match &run.shared {
                Some(shared) => shared.freed.notified().await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(freed);
        if let Some(stop) = lease.read_stop(&lease.state(), generation) {
            return Step::Stop(stop);
        }
        match lease.fence() {
            Fence::Open => {}
            Fence::Suspended(_) => {
                // Nothing goes out until Consul confirms the session again.
                suspended_pause(&mut interrupts).await;
                continue;
            }
            Fence::Closed(fenced) => return Step::Stop(Stop::Failed(fenced)),
        }
        let now = Instant::now();
        let batch = run.take_ready(now);
        if !batch.is_empty() {
            return Step::Batch(batch);
        }
        let wake = run.next_wake();
        tokio::select! {
            () = ready => {}
            () = freed => {}
            () = sleep_until_some(wake) => {}
            _ = interrupts.changed() => {}
        }
    }
}

async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The stream behind one Deliver call; ends as a Read's does. Dropping it closes the
/// Deliver (deliveries in flight stay in flight until answered or their deadline).
pub struct DeliverStream {
    lease: Arc<Lease>,
    run: Arc<QueueRun>,
    generation: u64,
    step: Option<StepFuture>,
    finished: bool,
}

impl DeliverStream {
    pub(super) fn new(lease: Arc<Lease>, run: Arc<QueueRun>, generation: u64) -> Self {
        DeliverStream {
            lease,
            run,
            generation,
            step: None,
            finished: false,
        }
    }
}

impl std::fmt::Debug for DeliverStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeliverStream")
            .field("lease", &self.lease.lease_ref)
            .field("generation", &self.generation)
            .finish()
    }
}

impl Drop for DeliverStream {
    fn drop(&mut self) {
        self.lease.close_read(self.generation);
    }
}

impl futures::Stream for DeliverStream {
    type Item = Result<Delivered, LeaseError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if this.finished {
            return Poll::Ready(None);
        }
        let (lease, run, generation) = (this.lease.clone(), this.run.clone(), this.generation);
        let fut = this
            .step
            .get_or_insert_with(|| Box::pin(step(lease, run, generation)));
        let outcome = match fut.as_mut().poll(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(outcome) => outcome,
        };
        this.step = None;
        match outcome {
            Step::Stop(stop) => {
                this.finished = true;
                Poll::Ready(match stop {
                    Stop::Done => None,
                    Stop::Failed(err) => Some(Err(err)),
                })
            }
            Step::Batch(batch) => {
                let records = batch.len() as u64;
                let bytes = batch.wire_len() as u64;
                this.lease.delivered.records.increment(records);
                this.lease.delivered.bytes.increment(bytes);
                let high_watermark = this.lease.cached_high_watermark();
                Poll::Ready(Some(Ok(Delivered {
                    batch,
                    high_watermark,
                })))
            }
        }
    }
}
