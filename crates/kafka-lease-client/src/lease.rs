//! A held lease ([`Lease`]): reading its partition, seeking, committing, releasing.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::connection::Connection;
use crate::convert::{
    duration_from_proto, duration_to_proto, system_time_from_proto, system_time_to_proto,
};
use crate::error::Result;
use crate::stream::{EpochFilter, OpenRead, RecordStream, Reopen, ResponseStream};
use kafka_lease_proto::v1 as proto;
use proto::seek_request::Position;

/// How many times in a row a broken Read is reopened before the error reaches the caller.
const DEFAULT_RECONNECT_ATTEMPTS: u32 = 8;

/// The contract's default TTL, assumed when the gateway does not say which TTL it granted.
const DEFAULT_TTL: Duration = Duration::from_secs(10);

/// An exclusive, expiring lease on one partition, from [`Client::acquire`](crate::Client::acquire).
///
/// The lease stays alive while a [`RecordStream`] from [`Lease::records`] is open, and for
/// [`Lease::ttl`] after the last call on it otherwise. Methods take `&self`, so one task can
/// read while another seeks or commits (share it with `Arc` or a borrow). Dropping a `Lease`
/// does not release it: it then ends when its TTL runs out. Prefer [`Lease::release`].
///
/// Its `Debug` output leaves out the lease id, which is a bearer credential.
pub struct Lease {
    pub(crate) client: Connection,
    lease_id: String,
    group: String,
    topic: String,
    partition: i32,
    fencing_token: u64,
    offset: i64,
    high_watermark: i64,
    expires_at: SystemTime,
    gateway: String,
    ttl: Duration,
    epochs: EpochFilter,
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("group", &self.group)
            .field("topic", &self.topic)
            .field("partition", &self.partition)
            .field("fencing_token", &self.fencing_token)
            .field("offset", &self.offset)
            .field("high_watermark", &self.high_watermark)
            .field("expires_at", &self.expires_at)
            .field("gateway", &self.gateway)
            .field("ttl", &self.ttl)
            .field("seek_epoch", &self.epochs.newest())
            .finish_non_exhaustive()
    }
}

impl Lease {
    /// The lease as the Acquire response describes it.
    pub(crate) fn from_acquired(
        client: Connection,
        response: proto::AcquireResponse,
        requested_group: String,
        requested_ttl: Option<Duration>,
    ) -> Lease {
        Lease {
            client,
            lease_id: response.lease_id,
            group: if response.group.is_empty() {
                requested_group
            } else {
                response.group
            },
            topic: response.topic,
            partition: response.partition,
            fencing_token: response.fencing_token,
            offset: response.offset,
            high_watermark: response.high_watermark,
            expires_at: system_time_from_proto(response.expires_at).unwrap_or(UNIX_EPOCH),
            gateway: response.gateway,
            ttl: duration_from_proto(response.ttl)
                .or(requested_ttl)
                .unwrap_or(DEFAULT_TTL),
            epochs: EpochFilter::new(),
        }
    }

    /// The opaque lease id the gateway chose. A bearer credential: whoever has it can commit
    /// and release, so do not log it.
    pub fn lease_id(&self) -> &str {
        &self.lease_id
    }

    /// The consumer group.
    pub fn group(&self) -> &str {
        &self.group
    }

    /// The topic.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// The leased partition.
    pub fn partition(&self) -> i32 {
        self.partition
    }

    /// Greater than every token issued before for this (group, topic, partition); use it to
    /// fence writes made on behalf of this lease.
    pub fn fencing_token(&self) -> u64 {
        self.fencing_token
    }

    /// Where reading started at Acquire: the group's committed offset, else the reset position.
    pub fn offset(&self) -> i64 {
        self.offset
    }

    /// The partition's high watermark at Acquire.
    pub fn high_watermark(&self) -> i64 {
        self.high_watermark
    }

    /// When the lease expires if nothing renews it, as of Acquire (every call and an open
    /// Read renew it; this value is not updated). `UNIX_EPOCH` if the gateway sent none.
    pub fn expires_at(&self) -> SystemTime {
        self.expires_at
    }

    /// The gateway instance serving this lease. Calls on it may reach any instance: the
    /// others forward them there.
    pub fn gateway(&self) -> &str {
        &self.gateway
    }

    /// The TTL the gateway granted.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The newest seek epoch seen for this lease (0 until the first seek).
    pub fn seek_epoch(&self) -> u64 {
        self.epochs.newest()
    }

    /// Opens a Read: the partition's records in order, with no gaps and no repeats, for as
    /// long as the lease is held. It starts at [`ReadOptions::from_offset`] if set, else at
    /// the lease's resume point: the most recent of the Acquire offset, the last commit and
    /// the last seek (so a new Read after a broken one may repeat records, never skip one).
    ///
    /// The stream reopens itself when it breaks, continuing right after the last record it
    /// handed out (see [`RecordStream`]).
    ///
    /// One Read per lease: opening another ends the previous stream with
    /// [`Error::Superseded`](crate::Error::Superseded). Batches made stale by a concurrent
    /// [`seek`](Self::seek) are dropped for you.
    pub async fn records(&self, options: ReadOptions) -> Result<RecordStream> {
        let template = proto::ReadRequest {
            lease_id: self.lease_id.clone(),
            max_records: options.max_records,
            max_bytes: options.max_bytes,
            max_wait: options.max_wait.map(duration_to_proto),
            from_offset: None,
            if_seek_epoch: None,
        };
        let client = self.client.clone();
        let open: OpenRead = Arc::new(
            move |from_offset: Option<i64>, if_seek_epoch: Option<u64>| {
                let request = proto::ReadRequest {
                    from_offset,
                    if_seek_epoch,
                    ..template.clone()
                };
                let mut raw = client.raw();
                Box::pin(async move {
                    let stream = raw.read(request).await?.into_inner();
                    Ok(Box::pin(stream) as ResponseStream)
                })
            },
        );
        let first = open(options.from_offset, None).await?;
        let reopen = Reopen {
            open,
            attempts: options
                .reconnect_attempts
                .unwrap_or(DEFAULT_RECONNECT_ATTEMPTS),
        };
        Ok(RecordStream::from_stream(
            first,
            self.epochs.clone(),
            Some(reopen),
        ))
    }

    /// Repositions the lease. Once this returns, no batch from before the seek is delivered by
    /// this lease's [`RecordStream`]s: the next one starts at [`SeekOutcome::offset`] (or the
    /// next existing record, where the log is compacted). Commits nothing.
    ///
    /// # Errors
    /// [`Error::OutOfRange`](crate::Error::OutOfRange) for an offset outside the log (the
    /// message gives the valid range), and the lease errors as for every call.
    pub async fn seek(&self, to: SeekTo) -> Result<SeekOutcome> {
        let request = proto::SeekRequest {
            lease_id: self.lease_id.clone(),
            position: Some(to.into()),
        };
        let response = self.client.raw().seek(request).await?.into_inner();
        self.epochs.observe(response.seek_epoch);
        Ok(SeekOutcome::from(response))
    }

    /// Commits `offset` (the next offset to read, Kafka's convention: last processed + 1) as
    /// the group's committed offset, fenced by this lease.
    ///
    /// # Errors
    /// [`Error::OutOfRange`](crate::Error::OutOfRange) (below 0 or above the high watermark),
    /// [`Error::LeaseEnded`](crate::Error::LeaseEnded) (fenced: the lease was lost, expired or
    /// released, and nothing changed; [`Error::reason`](crate::Error::reason) says which),
    /// [`Error::FailedPrecondition`](crate::Error::FailedPrecondition) (another gateway
    /// instance serves the lease), [`Error::NotFound`](crate::Error::NotFound),
    /// [`Error::Unavailable`](crate::Error::Unavailable).
    pub async fn commit(&self, offset: i64) -> Result<()> {
        self.send_commit(offset, None).await
    }

    /// Like [`commit`](Self::commit), storing `metadata` (at most 4057 UTF-8 bytes, so that
    /// with the gateway's fencing-token prefix it fits Kafka's default limit of 4096) with the
    /// offset.
    pub async fn commit_with_metadata(
        &self,
        offset: i64,
        metadata: impl Into<String>,
    ) -> Result<()> {
        self.send_commit(offset, Some(metadata.into())).await
    }

    /// Sends one Commit.
    async fn send_commit(&self, offset: i64, metadata: Option<String>) -> Result<()> {
        let request = proto::CommitRequest {
            lease_id: self.lease_id.clone(),
            offset,
            metadata,
        };
        self.client.raw().commit(request).await?;
        Ok(())
    }

    /// Ends the lease. Its open Read ends with `None`, and another client can acquire the
    /// partition at once.
    ///
    /// # Errors
    /// [`Error::NotFound`](crate::Error::NotFound) if the lease had already ended. The `Lease`
    /// is consumed either way; after an [`Error::Unavailable`](crate::Error::Unavailable) the
    /// lease ends by itself when its TTL runs out.
    pub async fn release(self) -> Result<()> {
        self.send_release(None).await
    }

    /// Commits `offset` (fenced, as [`commit`](Self::commit)) and then ends the lease.
    ///
    /// # Errors
    /// As [`commit`](Self::commit) and [`release`](Self::release). If the commit is rejected
    /// the gateway keeps the lease, but this `Lease` is consumed: it then ends when its TTL
    /// runs out (or its open Read is dropped and the TTL runs out). Call
    /// [`commit`](Self::commit) first if you need to handle a rejected commit.
    pub async fn release_with_commit(self, offset: i64) -> Result<()> {
        self.send_release(Some(offset)).await
    }

    /// Sends one Release.
    async fn send_release(&self, commit_offset: Option<i64>) -> Result<()> {
        let request = proto::ReleaseRequest {
            lease_id: self.lease_id.clone(),
            commit_offset,
        };
        self.client.raw().release(request).await?;
        Ok(())
    }
}

/// How a Read batches records. Everything left unset takes the gateway's default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadOptions {
    max_records: u32,
    max_bytes: u32,
    max_wait: Option<Duration>,
    from_offset: Option<i64>,
    reconnect_attempts: Option<u32>,
}

impl ReadOptions {
    /// The gateway's defaults: 500 records, 1 MiB, 100 ms.
    pub fn new() -> Self {
        Self::default()
    }

    /// Most records per batch (gateway default 500; at most 10 000).
    pub fn max_records(mut self, max_records: u32) -> Self {
        self.max_records = max_records;
        self
    }

    /// Most bytes of keys, values and headers per batch (gateway default 1 MiB; at most
    /// 4 MiB). A single larger record comes alone in its own batch. A bound: the gateway
    /// sends at most 256 KiB of records per batch whatever this allows.
    pub fn max_bytes(mut self, max_bytes: u32) -> Self {
        self.max_bytes = max_bytes;
        self
    }

    /// How long the gateway may wait to fill a batch once it has a record (gateway default
    /// 100 ms; allowed 0 ..= 10 s). A batch that reaches the partition's end goes at once.
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = Some(max_wait);
        self
    }

    /// Start at this offset (between the log start and the high watermark, else
    /// [`Error::OutOfRange`](crate::Error::OutOfRange)), as a seek to it would, instead of at
    /// the lease's resume point.
    pub fn from_offset(mut self, offset: i64) -> Self {
        self.from_offset = Some(offset);
        self
    }

    /// How many times in a row a broken stream is reopened (with backoff from 50 ms up to
    /// 2 s between attempts) before the error reaches the caller. Default 8 (about 7 s);
    /// 0 turns reopening off.
    pub fn reconnect_attempts(mut self, attempts: u32) -> Self {
        self.reconnect_attempts = Some(attempts);
        self
    }
}

/// Where [`Lease::seek`] goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SeekTo {
    /// An absolute offset, between the log start offset and the high watermark inclusive.
    Offset(i64),
    /// The first record whose timestamp is at or after this time (the high watermark if none).
    Timestamp(SystemTime),
    /// The oldest retained record (the log start offset).
    Earliest,
    /// The high watermark: only records produced from now on.
    Latest,
    /// The group's committed offset (else the lease's reset position).
    Committed,
}

impl From<SeekTo> for Position {
    fn from(to: SeekTo) -> Self {
        match to {
            SeekTo::Offset(offset) => Position::Offset(offset),
            SeekTo::Timestamp(time) => Position::Timestamp(system_time_to_proto(time)),
            SeekTo::Earliest => Position::Earliest(()),
            SeekTo::Latest => Position::Latest(()),
            SeekTo::Committed => Position::Committed(()),
        }
    }
}

/// What a seek resolved to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct SeekOutcome {
    /// The resolved offset: the first record of the new epoch is at or after it.
    pub offset: i64,
    /// The lease's new seek epoch.
    pub seek_epoch: u64,
}

impl From<proto::SeekResponse> for SeekOutcome {
    fn from(response: proto::SeekResponse) -> Self {
        SeekOutcome {
            offset: response.offset,
            seek_epoch: response.seek_epoch,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seek_to_maps_to_the_oneof() {
        assert_eq!(Position::from(SeekTo::Offset(42)), Position::Offset(42));
        assert_eq!(Position::from(SeekTo::Earliest), Position::Earliest(()));
        assert_eq!(Position::from(SeekTo::Latest), Position::Latest(()));
        assert_eq!(Position::from(SeekTo::Committed), Position::Committed(()));
        let t = UNIX_EPOCH + Duration::new(1_700_000_000, 1_000);
        assert_eq!(
            Position::from(SeekTo::Timestamp(t)),
            Position::Timestamp(prost_types::Timestamp {
                seconds: 1_700_000_000,
                nanos: 1_000
            })
        );
    }

    #[test]
    fn read_options_default_to_the_gateway() {
        assert_eq!(
            ReadOptions::new(),
            ReadOptions {
                max_records: 0,
                max_bytes: 0,
                max_wait: None,
                from_offset: None,
                reconnect_attempts: None,
            }
        );
        let o = ReadOptions::new().from_offset(42).reconnect_attempts(0);
        assert_eq!((o.from_offset, o.reconnect_attempts), (Some(42), Some(0)));
        let o = ReadOptions::new()
            .max_records(10)
            .max_bytes(1024)
            .max_wait(Duration::from_millis(5));
        assert_eq!((o.max_records, o.max_bytes), (10, 1024));
        assert_eq!(o.max_wait, Some(Duration::from_millis(5)));
    }

    fn lease(response: proto::AcquireResponse, ttl: Option<Duration>) -> Lease {
        let channel = tonic::transport::Endpoint::from_static("http://127.0.0.1:1").connect_lazy();
        Lease::from_acquired(Connection::new(channel), response, "req-group".into(), ttl)
    }

    #[tokio::test]
    async fn lease_takes_the_acquire_response() {
        let l = lease(
            proto::AcquireResponse {
                lease_id: "secret-id".into(),
                topic: "t".into(),
                partition: 4,
                fencing_token: 77,
                offset: 10,
                high_watermark: 20,
                expires_at: Some(prost_types::Timestamp {
                    seconds: 1_000,
                    nanos: 0,
                }),
                group: "g".into(),
                gateway: "gw-1".into(),
                gateway_address: "10.0.0.7:50051".into(),
                ttl: Some(prost_types::Duration {
                    seconds: 30,
                    nanos: 0,
                }),
            },
            Some(Duration::from_secs(5)),
        );
        assert_eq!(l.lease_id(), "secret-id");
        assert_eq!((l.group(), l.topic(), l.partition()), ("g", "t", 4));
        assert_eq!(
            (l.fencing_token(), l.offset(), l.high_watermark()),
            (77, 10, 20)
        );
        assert_eq!(l.expires_at(), UNIX_EPOCH + Duration::from_secs(1_000));
        assert_eq!(l.gateway(), "gw-1");
        assert_eq!(l.ttl(), Duration::from_secs(30));
        assert_eq!(l.seek_epoch(), 0);
        assert!(!format!("{l:?}").contains("secret-id"));
    }

    #[tokio::test]
    async fn lease_falls_back_when_the_response_is_sparse() {
        let l = lease(
            proto::AcquireResponse::default(),
            Some(Duration::from_secs(5)),
        );
        assert_eq!(l.group(), "req-group");
        assert_eq!(l.ttl(), Duration::from_secs(5));
        assert_eq!(l.expires_at(), UNIX_EPOCH);
        let l = lease(proto::AcquireResponse::default(), None);
        assert_eq!(l.ttl(), DEFAULT_TTL);
    }
}
