//! Rust client for kafka-lease: acquire an exclusive lease on a Kafka partition for a consumer
//! group, stream its records, seek, commit and release, through a kafka-lease gateway.
//!
//! A small facade over the generated gRPC client ([`proto`]); [`Client::raw`] gives the
//! generated client itself for anything the facade does not cover.
//!
//! ```no_run
//! use std::time::Duration;
//! use kafka_lease_client::{AcquireOptions, Client, ReadOptions, Reset};
//!
//! # async fn run() -> kafka_lease_client::Result<()> {
//! let client = Client::connect("http://127.0.0.1:50051").await?;
//! let lease = client
//!     .acquire(
//!         AcquireOptions::new("billing", "payments")
//!             .member("worker-1")
//!             .ttl(Duration::from_secs(30))
//!             .reset(Reset::Earliest),
//!     )
//!     .await?;
//! println!("leased {}/{} from offset {}", lease.topic(), lease.partition(), lease.offset());
//!
//! let mut records = lease.records(ReadOptions::new().max_records(100)).await?;
//! if let Some(batch) = records.next_batch().await {
//!     let batch = batch?;
//!     for record in &batch.records {
//!         println!("{}: {:?}", record.offset, record.value);
//!     }
//!     if let Some(next) = batch.next_offset() {
//!         lease.commit(next).await?;
//!     }
//! }
//! lease.release().await?;
//! # Ok(())
//! # }
//! ```
//!
//! # Seeking while reading
//!
//! [`Lease::seek`] may run while another task reads the lease's [`RecordStream`]. The contract
//! lets batches of the old position still be in flight; the stream drops them (it compares
//! each batch's seek epoch with the newest one the lease has seen, see [`EpochFilter`]), so
//! once `seek` has returned, the next batch starts at the new position.
//!
//! # Errors
//!
//! Every call returns [`Error`], with the gRPC status mapped to what it means in the API
//! contract: [`Error::Busy`] when the partition is leased by someone else,
//! [`Error::LeaseEnded`] when the lease is gone, [`Error::is_retryable`] for
//! `UNAVAILABLE`, and so on.
//!
//! The variant follows the status code and the gateway's machine-readable reason (the
//! `google.rpc.ErrorInfo` in the status details), never the message text. Branch on
//! [`Error::reason`] for finer cases, read the values involved with [`Error::metadata`], and
//! the gateway's retry advice with [`Error::retry_after`]:
//!
//! ```no_run
//! use kafka_lease_client::{AcquireOptions, Client, Error, Reason};
//!
//! # async fn run(client: Client) -> kafka_lease_client::Result<()> {
//! match client.acquire(AcquireOptions::new("billing", "payments").partition(3)).await {
//!     Ok(lease) => println!("got {}", lease.partition()),
//!     Err(e) if e.reason() == Some(Reason::PartitionBusy) => println!(
//!         "held by {:?}, try again in {:?}",
//!         e.metadata("holder_member"),
//!         e.retry_after()
//!     ),
//!     Err(e) => return Err(e),
//! }
//! # Ok(())
//! # }
//! ```

#![warn(missing_docs)]

mod client;
mod connection;
mod convert;
mod error;
mod lease;
mod queue;
mod stream;
mod subscription;

/// The generated `kafka_lease.v1` messages and gRPC client, for use with [`Client::raw`].
pub use kafka_lease_proto::v1 as proto;

/// The type of a record's key, value and header values: a slice of the response the record
/// came in, shared rather than copied (see [`Record`]).
pub use bytes::Bytes;

pub use client::{
    AcquireOptions, Client, ClientTls, LeaseFilter, LeaseInfo, QueueInfo, DEFAULT_ACQUIRE_RETRIES,
};
pub use connection::{Credentials, Transport, DEFAULT_MAX_DECODING_MESSAGE_SIZE};
pub use convert::Reset;
pub use error::{Error, Reason, Result, StatusDetails, ERROR_DOMAIN};
pub use lease::{Lease, ReadOptions, SeekOutcome, SeekTo};
pub use queue::{
    AckOutcome, ConsumeOptions, ConsumeStats, Deliveries, Delivery, DeliveryInfo, HandlerError,
    Ordering, QueueOptions,
};
pub use stream::{Batch, EpochFilter, Record, RecordStream};
pub use subscription::{Partition, SubscribeOptions, Subscription, SubscriptionEvent};
