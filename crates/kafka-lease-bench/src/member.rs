//! A queue-mode Subscribe member as a process of its own (`kafka-lease-bench --queue-member
//! ...`), for the redelivery-after-SIGKILL arm of `queue-vs-share-group`: the bench starts two,
//! kills the one holding the partition, and watches the other's output for the records the
//! dead one had in flight.
//!
//! Output, one line each, flushed: `joined` once the member is in the group, `start OFFSET
//! ATTEMPT` as a handler starts, `done OFFSET` as it ends.

use std::io::Write;
use std::time::Duration;

use anyhow::{Context, Result};
use kafka_lease_client::{Client, ConsumeOptions, Ordering, QueueOptions, SubscribeOptions};

/// What a member is told: `ENDPOINT GROUP TOPIC DEAD_LETTER_TOPIC HANDLER_MS CONCURRENCY`.
#[derive(Debug, Clone)]
pub struct MemberArgs {
    pub endpoint: String,
    pub group: String,
    pub topic: String,
    pub dead_letters: String,
    pub handler: Duration,
    pub concurrency: usize,
}

impl MemberArgs {
    /// Parses the six values of `--queue-member`.
    ///
    /// # Errors
    /// A count other than six, or a number that does not parse.
    pub fn parse(values: &[String]) -> Result<MemberArgs> {
        let [endpoint, group, topic, dead_letters, handler_ms, concurrency] = values else {
            anyhow::bail!(
                "--queue-member takes ENDPOINT GROUP TOPIC DEAD_LETTER_TOPIC HANDLER_MS CONCURRENCY, got {values:?}"
            );
        };
        Ok(MemberArgs {
            endpoint: endpoint.clone(),
            group: group.clone(),
            topic: topic.clone(),
            dead_letters: dead_letters.clone(),
            handler: Duration::from_millis(handler_ms.parse().context("HANDLER_MS")?),
            concurrency: concurrency.parse().context("CONCURRENCY")?,
        })
    }
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Runs the member until it is killed (or its subscription ends).
///
/// # Errors
/// Connecting, subscribing, or the subscription failing.
pub async fn run(args: MemberArgs) -> Result<()> {
    let client = Client::connect(args.endpoint.clone())
        .await
        .context("connecting")?;
    let queue = QueueOptions::new()
        .ordering(Ordering::Unordered)
        .dead_letter_topic(args.dead_letters.clone());
    let subscription = client
        .subscribe(
            SubscribeOptions::new(args.group.clone(), [args.topic.clone()])
                .member("bench-queue-member")
                .queue(queue.clone()),
        )
        .await
        .context("Subscribe")?;
    say("joined");
    let handler = args.handler;
    subscription
        .consume(
            ConsumeOptions::new(queue, args.concurrency),
            std::future::pending::<()>(),
            move |record, info| async move {
                say(&format!("start {} {}", record.offset, info.attempt));
                tokio::time::sleep(handler).await;
                say(&format!("done {}", record.offset));
                Ok(())
            },
        )
        .await
        .context("consume")?;
    Ok(())
}
