//! The keeper: writes the records due to the dead letter topic (each done only once the
//! broker acknowledged its copy) and commits the queue's progress, fenced, about every
//! [`COMMIT_INTERVAL`] while it changed, until the lease ends.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::kafka::{DeadLetter, DeadLetters};
use crate::lease::read::suspended_pause;
use crate::lease::{Fence, Lease};
use crate::queue::DeadLetterCause;
use crate::records::OneRecord;

use super::{QueueRun, COMMIT_INTERVAL};

/// How long the keeper waits before writing a dead letter again after a failure.
const DEAD_LETTER_RETRY: Duration = Duration::from_secs(1);

/// The keeper (see the module docs): until the lease ends.
pub(super) async fn keep(lease: Arc<Lease>, run: Arc<QueueRun>, dead_letters: DeadLetters) {
    keep_until_the_end(&lease, &run, &dead_letters).await;
    run.close();
}

async fn keep_until_the_end(lease: &Arc<Lease>, run: &Arc<QueueRun>, dead_letters: &DeadLetters) {
    let mut interrupts = lease.interrupts.subscribe();
    let mut last_commit = Instant::now();
    loop {
        let letters = run.letters.notified();
        tokio::pin!(letters);
        letters.as_mut().enable();
        if lease.is_ended() {
            return;
        }
        let due = {
            let mut state = run.state();
            let due = state.queue.take_dead_letters();
            state.writing += due.len();
            due
        };
        for (i, offset) in due.iter().enumerate() {
            let written = write_dead_letter(lease, run, dead_letters, *offset).await;
            run.state().writing -= 1;
            run.letters_written.notify_waiters();
            if !written {
                run.state().writing -= due.len() - i - 1;
                run.letters_written.notify_waiters();
                return;
            }
        }
        if last_commit.elapsed() >= COMMIT_INTERVAL {
            last_commit = Instant::now();
            if let Err(err) = run.commit_progress(lease).await {
                if lease.is_ended() {
                    return;
                }
                tracing::warn!(
                    parent: &lease.span,
                    error = %err,
                    "committing the queue's progress failed; retrying",
                );
            }
        }
        tokio::select! {
            () = letters => {}
            () = tokio::time::sleep_until(last_commit + COMMIT_INTERVAL) => {}
            _ = interrupts.changed() => {}
        }
    }
}

/// Writes the dead letter of `offset` until the broker acknowledges it, then marks the
/// record done. False when the lease ended (or can no longer vouch for its lock) first.
async fn write_dead_letter(
    lease: &Lease,
    run: &QueueRun,
    dead_letters: &DeadLetters,
    offset: i64,
) -> bool {
    let letter = {
        let state = run.state();
        let Some(due) = state.queue.dead_letter(offset) else {
            return true;
        };
        let reason = due.reason.map_or_else(
            || {
                format!(
                    "not handled in {} deliveries (max_deliveries {})",
                    due.attempts, run.settings.queue.max_deliveries
                )
            },
            str::to_string,
        );
        dead_letter_of(
            lease,
            &run.settings.dead_letter_topic,
            due.body,
            due.attempts,
            reason,
        )
    };
    let mut interrupts = lease.interrupts.subscribe();
    loop {
        match lease.fence() {
            Fence::Open => {}
            Fence::Suspended(_) => {
                suspended_pause(&mut interrupts).await;
                continue;
            }
            Fence::Closed(_) => return false,
        }
        match dead_letters.write(&letter).await {
            Ok(()) => break,
            Err(err) => {
                tracing::warn!(
                    parent: &lease.span,
                    offset,
                    topic = %letter.topic,
                    error = %err,
                    "writing a dead letter failed; retrying",
                );
                tokio::select! {
                    () = tokio::time::sleep(DEAD_LETTER_RETRY) => {}
                    _ = interrupts.changed() => {}
                }
            }
        }
    }
    tracing::info!(
        parent: &lease.span,
        offset,
        topic = %letter.topic,
        "record written to the dead letter topic",
    );
    {
        let mut state = run.state();
        if let Some(cause) = state.queue.dead_lettered(offset) {
            match cause {
                DeadLetterCause::Rejected => run.counters.dead_letters_rejected.increment(1),
                DeadLetterCause::MaxDeliveries => {
                    run.counters.dead_letters_max_deliveries.increment(1);
                }
            }
            state.record_done();
            state.dead_letters += 1;
        }
    }
    run.ready.notify_waiters();
    run.room.notify_waiters();
    true
}

/// The headers a dead letter's copy gets beside the record's own.
pub mod headers {
    pub const TOPIC: &str = "kafka-lease.topic";
    pub const PARTITION: &str = "kafka-lease.partition";
    pub const OFFSET: &str = "kafka-lease.offset";
    pub const GROUP: &str = "kafka-lease.group";
    pub const ATTEMPTS: &str = "kafka-lease.attempts";
    pub const REASON: &str = "kafka-lease.reason";
    pub const FENCING_TOKEN: &str = "kafka-lease.fencing-token";
}

/// The copy of `record` for the dead letter topic.
fn dead_letter_of(
    lease: &Lease,
    topic: &str,
    record: &OneRecord,
    attempts: u32,
    reason: String,
) -> DeadLetter {
    let decoded = record.decode();
    let mut all: Vec<(String, Option<Vec<u8>>)> = decoded
        .headers
        .into_iter()
        .map(|h| (h.key, h.value.map(Vec::from)))
        .collect();
    let ours = [
        (headers::TOPIC, lease.key.topic.clone()),
        (headers::PARTITION, lease.key.partition.to_string()),
        (headers::OFFSET, record.offset.to_string()),
        (headers::GROUP, lease.key.group.clone()),
        (headers::ATTEMPTS, attempts.to_string()),
        (headers::REASON, reason),
        (headers::FENCING_TOKEN, lease.token.get().to_string()),
    ];
    all.extend(
        ours.into_iter()
            .map(|(k, v)| (k.to_string(), Some(v.into_bytes()))),
    );
    DeadLetter {
        topic: topic.to_string(),
        key: decoded.key.map(Vec::from),
        value: decoded.value.map(Vec::from),
        headers: all,
        timestamp_ms: decoded
            .timestamp
            .map(|t| t.seconds * 1000 + i64::from(t.nanos) / 1_000_000),
    }
}
