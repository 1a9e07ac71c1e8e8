//! Reading partitions and storing offsets with librdkafka (the `rdkafka` crate).
//!
//! One consumer client per consumer group on each gateway ([`GroupClient`]) stores the
//! group's offsets in Kafka's group coordinator. A leased partition is fetched through its
//! own split partition queue ([`PartitionFeed`]) by the oldest of those clients that does not
//! fetch it already, whichever group it commits for ([`Kafka::fetcher`], [`FetchClaim`]): a
//! fetch needs no group, and librdkafka keeps state for every partition of each topic a
//! client fetches from. No client joins its group (`assign`, not `subscribe`): partition
//! ownership comes from the lock backend, so Kafka's rebalancing must stay out of it. A
//! lease therefore costs a partition queue, not a client with its own threads; see
//! docs/ARCHITECTURE.md for the thread and memory arithmetic.
//!
//! librdkafka calls that block (metadata, watermarks, commits, seeks) run on tokio's blocking
//! pool so they never stall the reactor.
//!
//! One concern a file, each importing only those listed before it:
//!
//! - `errors`: what a librdkafka error means to the caller, and the blocking pool
//!   (`blocking`, `retrying` while a broker state is transient).
//! - [`settings`]: [`KafkaSettings`], how every client is configured and created, its log
//!   context ([`ClientLog`]), and the operator's properties (`KafkaProperties`, the
//!   properties-file format, `is_secret`).
//! - `dead_letters`: [`DeadLetters`], the gateway's one producer, for queue mode's dead
//!   letter topics.
//! - `group`: [`GroupClient`], a consumer group's client (committed offsets, commits; for the
//!   partitions claimed on it, [`FetchClaim`], topic lookups and the cached high watermark).
//! - `metadata`: [`Kafka`], the metadata client (partition counts, watermarks, offsets by
//!   time, ping, the partitions with records for a group to read), the cache of group
//!   clients, and which of them fetches a lease's partition.
//! - `raw`: a partition queue's records popped many at a time through librdkafka's C API,
//!   read in place.
//! - `feed`: [`PartitionFeed`], the Read path: a partition queue split off a group client
//!   and batches filled from it ([`BatchLimits`]).
//! - `admin`: [`TopicAdmin`], topics created, listed, described and deleted through Kafka's
//!   admin API, for `kafka-lease topics` (the gateway itself never calls it).

mod admin;
mod dead_letters;
mod errors;
mod feed;
mod group;
mod metadata;
mod raw;
pub mod settings;

pub use admin::{ConfigSetting, NewTopicSpec, PartitionInfo, TopicAdmin, TopicError, TopicInfo};
pub use dead_letters::{DeadLetter, DeadLetters};
pub use feed::{BatchLimits, PartitionFeed};
pub use group::{
    CommitFence, CommitGate, CommitPermit, CommitsSettled, FetchClaim, GroupClient, Sent,
};
pub use metadata::Kafka;
pub use settings::{ClientLog, KafkaSettings, DEFAULT_MAX_GROUPS, DEFAULT_QUEUE_KBYTES};
