//! Example: lease a partition of topic `demo`, print a few batches of records, commit what
//! was read and release the lease.
//!
//! ```text
//! cargo run -p kafka-lease-client --example consume -- [GROUP]
//! ```
//!
//! Connects to `KAFKA_LEASE_ADDR` (default `http://127.0.0.1:50051`); GROUP defaults to
//! `example`.

use std::time::Duration;

use kafka_lease_client::{AcquireOptions, Client, ReadOptions, Record};

/// How many batches to print before committing and releasing.
const BATCHES: usize = 3;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr =
        std::env::var("KAFKA_LEASE_ADDR").unwrap_or_else(|_| "http://127.0.0.1:50051".into());
    let group = std::env::args().nth(1).unwrap_or_else(|| "example".into());

    println!("connecting to {addr}");
    let client = Client::connect(addr).await?;

    println!("acquiring a partition of topic demo for group {group}");
    let lease = client
        .acquire(
            AcquireOptions::new(&group, "demo")
                .member("consume-example")
                .wait(Duration::from_secs(5)),
        )
        .await?;
    println!(
        "leased partition {} (fencing token {}), starting at offset {}, high watermark {}",
        lease.partition(),
        lease.fencing_token(),
        lease.offset(),
        lease.high_watermark()
    );

    let mut records = lease.records(ReadOptions::new().max_records(10)).await?;
    let mut next_offset = None;
    for n in 1..=BATCHES {
        // A lease on a quiet partition gets no batch; don't wait forever for one.
        let batch = match tokio::time::timeout(Duration::from_secs(5), records.next_batch()).await {
            Err(_) => {
                println!("no new records for 5 s");
                break;
            }
            Ok(None) => {
                println!("the gateway ended the stream");
                break;
            }
            Ok(Some(batch)) => batch?,
        };
        println!(
            "batch {n}: {} records, high watermark {}",
            batch.records.len(),
            batch.high_watermark
        );
        for record in &batch.records {
            print_record(record);
        }
        next_offset = batch.next_offset().or(next_offset);
    }
    drop(records);

    if let Some(offset) = next_offset {
        println!("committing offset {offset}");
        lease.commit(offset).await?;
    } else {
        println!("nothing read; nothing to commit");
    }
    println!("releasing the lease");
    lease.release().await?;
    println!("released");
    Ok(())
}

/// Prints one record on a line, headers indented below it.
fn print_record(record: &Record) {
    println!(
        "  offset {}: key={} value={}",
        record.offset,
        show(record.key.as_deref()),
        show(record.value.as_deref())
    );
    for (key, value) in &record.headers {
        println!("    header {key}={}", show(value.as_deref()));
    }
}

/// Bytes as text where they are UTF-8; `null` for absent (distinct from `""`, empty).
fn show(bytes: Option<&[u8]>) -> String {
    match bytes {
        None => "null".into(),
        Some(bytes) => format!("{:?}", String::from_utf8_lossy(bytes)),
    }
}
