//! The fetcher: pulls records from the lease's partition feed into the queue, within the
//! lookahead, until the lease ends.

use std::sync::Arc;
use std::time::Duration;

use crate::lease::Lease;
use crate::records::RecordsFor;

use super::QueueRun;

/// How often a fetcher waiting for a record looks whether librdkafka has passed offsets that
/// hold none (see [`crate::kafka::PartitionFeed::pass_invisible`]).
const PASS_LOOK: Duration = Duration::from_secs(1);

/// The fetcher (see the module docs): until the lease ends.
pub(super) async fn fetch(lease: Arc<Lease>, run: Arc<QueueRun>) {
    let mut interrupts = lease.interrupts.subscribe();
    loop {
        if lease.is_ended() {
            return;
        }
        let room = run.room.notified();
        tokio::pin!(room);
        room.as_mut().enable();
        let Some((from, limits)) = run.fetch_room() else {
            tokio::select! {
                () = room => {}
                _ = interrupts.changed() => {}
            }
            continue;
        };
        let mut feed_guard = tokio::select! {
            guard = lease.feed.lock() => guard,
            _ = interrupts.changed() => continue,
        };
        let Some(feed) = feed_guard.as_mut() else {
            // Dismantled: the lease is ending.
            return;
        };
        if let Err(err) = feed.align(from).await {
            tracing::warn!(
                parent: &lease.span,
                error = %err,
                "repositioning the partition failed; retrying",
            );
            drop(feed_guard);
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(500)) => {}
                _ = interrupts.changed() => {}
            }
            continue;
        }
        // Sized as the last batch was, so that filling it does not grow it copy by copy.
        let mut batch = feed.new_batch(limits, RecordsFor::Read);
        // Nothing to take, and nothing passed (offsets that hold no record, such as a
        // transaction's marker last in the partition, count as done below): wait for a
        // record, looking again now and then, since librdkafka passing a marker wakes
        // nobody.
        if feed.take_queued(&mut batch, from, limits)
            && batch.is_empty()
            && feed.pass_invisible() == from
        {
            let got = loop {
                let waited = tokio::select! {
                    more = tokio::time::timeout(
                        PASS_LOOK,
                        feed.take_next(&mut batch, from, limits),
                    ) => more,
                    _ = interrupts.changed() => Ok(false),
                };
                match waited {
                    Ok(got) => break got,
                    Err(_) if feed.pass_invisible() > from => break false,
                    Err(_) => {}
                }
            };
            if got {
                feed.take_queued(&mut batch, from, limits);
            }
        }
        let high = feed.cached_high_watermark();
        feed.filled(&mut batch);
        let reached = feed.pass_invisible();
        drop(feed_guard);
        if let Some(high) = high {
            lease.note_high_watermark(high);
        }
        run.offer(batch.into_records(), reached);
    }
}
