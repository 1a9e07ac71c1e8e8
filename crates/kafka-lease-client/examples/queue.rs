//! Example: join group `demo-group` for topic `demo` in queue mode, and handle its records
//! one by one, eight at a time, with per-key order, until Ctrl-C (or, with a count, until
//! that many are handled). Records whose value says `"amount":0` are rejected to the dead
//! letter topic (`dlq.demo-group.demo`, which `kafka-lease dev` creates); the others are
//! accepted. At the end the member leaves, and its leases' releases commit what was done.
//!
//! ```text
//! cargo run -p kafka-lease-client --example queue -- [COUNT]
//! ```
//!
//! Connects to `KAFKA_LEASE_ADDR` (default `http://127.0.0.1:50051`).

use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};
use std::sync::Arc;
use std::time::Duration;

use kafka_lease_client::{
    Client, ConsumeOptions, HandlerError, Ordering, QueueOptions, SubscribeOptions,
};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr =
        std::env::var("KAFKA_LEASE_ADDR").unwrap_or_else(|_| "http://127.0.0.1:50051".into());
    let count: Option<usize> = std::env::args().nth(1).and_then(|n| n.parse().ok());

    let client = Client::connect(addr).await?;
    let subscription = client
        .subscribe(
            SubscribeOptions::new("demo-group", ["demo"])
                .member("queue-example")
                // Comes back by itself within this long if the connection breaks.
                .session_grace(Duration::from_secs(10))
                .queue(QueueOptions::new().ordering(Ordering::Key)),
        )
        .await?;
    println!("joined as member {}", subscription.member_id());

    let handled = Arc::new(AtomicUsize::new(0));
    let seen = handled.clone();
    let shutdown = async move {
        match count {
            Some(count) => {
                while seen.load(AtomicOrdering::SeqCst) < count {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
            None => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    };
    let stats = subscription
        .consume(
            ConsumeOptions::new(QueueOptions::new(), 8),
            shutdown,
            move |record, info| {
                let handled = handled.clone();
                async move {
                    let value =
                        String::from_utf8_lossy(record.value.as_deref().unwrap_or_default())
                            .into_owned();
                    if value.contains("\"amount\":0}") {
                        println!(
                            "{}/{} offset {}: rejected (attempt {})",
                            info.topic, info.partition, record.offset, info.attempt
                        );
                        return Err(HandlerError::reject("an amount of 0"));
                    }
                    println!(
                        "{}/{} offset {}: {value} (attempt {})",
                        info.topic, info.partition, record.offset, info.attempt
                    );
                    handled.fetch_add(1, AtomicOrdering::SeqCst);
                    Ok(())
                }
            },
        )
        .await?;
    println!(
        "accepted {}, retried {}, rejected {}, handed back {}",
        stats.accepted, stats.retried, stats.rejected, stats.handed_back
    );
    Ok(())
}
