//! Queue mode on a lease: the Deliver path and the answers to it.
//!
//! The first Deliver on a lease opens its [`QueueRun`]: the [`Queue`] (which records may go
//! out, the progress to commit, the records due for the dead letter topic), started from the
//! progress the partition's last commit carried, and two tasks that live as long as the lease:
//! - the *fetcher* pulls records from the lease's partition feed into the queue, keeping each
//!   record's bytes (shared with the batch they were fetched in) until it is done, within a
//!   lookahead of [`LOOKAHEAD_RECORDS`] and [`LOOKAHEAD_BYTES`] beyond the window;
//! - the *keeper* writes the records due to the dead letter topic (each done only once the
//!   broker acknowledged its copy) and commits the progress, fenced, about every
//!   [`COMMIT_INTERVAL`] while it changed.
//!
//! A [`DeliverStream`] hands out what the queue lets go, as encoded `DeliverResponse`s; the
//! answers come through [`Lease::acknowledge`] from any connection. Deliver shares the Read
//! slot of the lease: a Deliver supersedes a Read or Deliver open on it, and keeps the lease
//! alive the same way.

mod fetcher;
mod keeper;
mod run;
mod stream;
mod window;

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::LeaseError;
use crate::kafka::DeadLetters;
use crate::queue::{Progress, QueueSettings};

use super::{Call, Lease};

pub use keeper::headers;
pub use run::QueueRun;
pub use stream::{DeliverStream, Delivered};
pub use window::SharedWindow;

/// How often the keeper commits the progress while it changes.
pub const COMMIT_INTERVAL: Duration = Duration::from_secs(1);
/// Records fetched beyond the window, waiting to go out: room for other keys while one key
/// waits (key order), and for the next deliveries while the window is full.
pub const LOOKAHEAD_RECORDS: usize = 1024;
/// Bytes fetched beyond the window's bytes.
pub const LOOKAHEAD_BYTES: usize = 4 * 1024 * 1024;
/// How long a Release waits for the dead letters due before it commits.
const FLUSH_LETTERS_WAIT: Duration = Duration::from_secs(5);

/// A queue's settings as the first Deliver gave them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeliverSettings {
    pub queue: QueueSettings,
    pub dead_letter_topic: String,
}

/// An answer to a delivery.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AckKind {
    Accept,
    Retry { delay: Duration, reason: String },
    Reject { reason: String },
    Renew,
}

impl AckKind {
    /// Its name in the answers metric.
    pub fn label(&self) -> &'static str {
        match self {
            AckKind::Accept => "accept",
            AckKind::Retry { .. } => "retry",
            AckKind::Reject { .. } => "reject",
            AckKind::Renew => "renew",
        }
    }
}

/// An answer to the delivery `attempt` (any, when `None`) of the record at `offset`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ack {
    pub offset: i64,
    pub attempt: Option<u32>,
    pub kind: AckKind,
}

/// What became of an answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AckOutcome {
    Applied,
    /// Changed nothing: not in flight (or not that delivery), or done.
    Stale,
    /// Changed nothing: no record at this offset was ever delivered (by any holder).
    NotDelivered,
}

impl AckOutcome {
    /// Its name in the answers metric.
    pub fn label(self) -> &'static str {
        match self {
            AckOutcome::Applied => "applied",
            AckOutcome::Stale => "stale",
            AckOutcome::NotDelivered => "not_delivered",
        }
    }
}

/// What ListLeases shows of a queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueSnapshot {
    pub settings: DeliverSettings,
    pub in_flight: usize,
    pub oldest_in_flight: Option<Duration>,
    pub waiting: usize,
    pub deliveries: u64,
    pub redeliveries: u64,
    pub dead_letters: u64,
    /// Since the last commit of the progress that landed (or since the queue opened).
    pub progress_age: Duration,
    /// Records done since the queue opened that no landed commit carries yet: what a crash
    /// of this gateway now would deliver again, beside what is in flight.
    pub done_not_committed: u64,
}

impl Lease {
    /// The lease's queue, once a Deliver opened it.
    pub fn queue(&self) -> Option<&Arc<QueueRun>> {
        self.queue.get()
    }

    /// The progress the partition's last commit carried, when it is where the lease starts;
    /// else nothing done from the resume point.
    pub async fn committed_progress(&self) -> Result<Progress, LeaseError> {
        let start = self.resume_point();
        let committed = self
            .group_client
            .committed(&self.key.topic, self.key.partition)
            .await?;
        Ok(match committed {
            Some((offset, metadata)) if offset == start => {
                Progress::from_metadata(offset, &metadata).unwrap_or_else(|err| {
                    tracing::warn!(
                        parent: &self.span,
                        error = %err,
                        %metadata,
                        "the committed progress is unreadable; starting from the committed offset \
                        with nothing done above it",
                    );
                    Progress::new(offset)
                })
            }
            _ => Progress::new(start),
        })
    }

    /// Opens a Deliver: puts the lease in queue mode with `settings` (starting from
    /// `progress`) unless it is already, in which case the settings must be the queue's. It
    /// supersedes any Read or Deliver open on the lease.
    pub fn open_deliver(
        self: &Arc<Self>,
        settings: DeliverSettings,
        progress: Progress,
        dead_letters: &DeadLetters,
        shared: Option<Arc<SharedWindow>>,
    ) -> Result<DeliverStream, LeaseError> {
        let mut opened = false;
        let run = self
            .queue
            .get_or_init(|| {
                opened = true;
                Arc::new(QueueRun::new(
                    settings.clone(),
                    progress,
                    crate::metrics::QueueCounters::of(&self.key.group, &self.key.topic),
                    shared,
                ))
            })
            .clone();
        if run.settings != settings {
            return Err(LeaseError::InvalidArgument {
                field: "ordering",
                message: format!(
                    "lease {:?} is in queue mode with other settings ({:?}); a Deliver must ask \
                     for the queue's settings: {:?}",
                    self.lease_ref, settings, run.settings
                ),
            });
        }
        if opened {
            tracing::info!(parent: &self.span, settings = ?run.settings, "queue mode opened");
            tokio::spawn(fetcher::fetch(self.clone(), run.clone()));
            tokio::spawn(keeper::keep(
                self.clone(),
                run.clone(),
                dead_letters.clone(),
            ));
        }
        let generation = {
            let mut state = self.state();
            if let Some(reason) = &state.ended {
                return Err(self.ended_error(reason));
            }
            state.read_generation += 1;
            state.read_open = true;
            state.read_generation
        };
        self.interrupt();
        Ok(DeliverStream::new(self.clone(), run, generation))
    }

    /// Applies answers to deliveries. Fenced: a lease that has ended, or whose gateway can no
    /// longer vouch for its lock, applies none.
    pub fn acknowledge(&self, acks: &[Ack]) -> Result<Vec<AckOutcome>, LeaseError> {
        let run = self.begin(Call::Acknowledge)?;
        let run = run.ok_or_else(|| self.wrong_mode(Call::Acknowledge))?;
        Ok(run.apply(acks, Instant::now()))
    }

    /// Commits the queue's progress now if it changed (Release does before it ends the
    /// lease).
    pub async fn flush_queue(&self) -> Result<(), LeaseError> {
        let Some(run) = self.queue.get() else {
            return Ok(());
        };
        // The dead letters due are written first (for a while at most), so that a record
        // rejected just before the release is done, not delivered to the next holder again.
        let _ = tokio::time::timeout(FLUSH_LETTERS_WAIT, async {
            loop {
                let written = run.letters_written.notified();
                tokio::pin!(written);
                written.as_mut().enable();
                {
                    let state = run.state();
                    if state.writing == 0 && !state.queue.dead_letters_due() {
                        return;
                    }
                }
                run.letters.notify_waiters();
                written.await;
            }
        })
        .await;
        run.commit_progress(self).await
    }
}
