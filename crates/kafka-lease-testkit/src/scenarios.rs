//! Contract scenarios stated once and run in both tiers: against the real binary, Kafka and
//! Consul (the end-to-end tests under `tests/`), and in process on the mock cluster and the
//! memory locks (`crates/kafka-lease-server/tests/contract.rs`). Both tiers depend on this
//! crate, so the scenarios live here rather than in either tier's folder.
//! Each takes a client of a gateway and what only its tier can say (what the lock store
//! holds, what Kafka has committed); the assertions are the same in both.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::future::Future;
use std::time::Duration;

use futures::StreamExt;
use kafka_lease_client::proto;
use kafka_lease_client::{AcquireOptions, Client, LeaseFilter, StatusDetails};
use tonic::Code;

/// How long any one step of a scenario may take: far above what it needs.
const DEADLINE: Duration = Duration::from_secs(30);

/// A topic of two partitions with five records on partition 0, group `group` never used:
/// every request field out of its range, and every call on a lease that is not there, gets
/// its documented code with the value named, and changes nothing: the one lease held keeps
/// its lock (`stored`: the lock store's contents, compared before and after) and nothing is
/// committed (`committed(group, topic)`: whether partition 0 has a committed offset).
pub async fn bad_requests_get_their_documented_code_and_change_nothing<S, SF, CF>(
    client: &Client,
    group: &str,
    topic: &str,
    stored: impl Fn() -> SF,
    committed: impl Fn(String, String) -> CF,
) where
    S: PartialEq + Debug,
    SF: Future<Output = Vec<S>>,
    CF: Future<Output = bool>,
{
    let (group, topic) = (group.to_string(), topic.to_string());
    let held = client
        .acquire(
            AcquireOptions::new(&group, &topic)
                .partition(0)
                .member("keeper"),
        )
        .await
        .expect("acquire");
    let released = client
        .acquire(AcquireOptions::new(&group, &topic).partition(1))
        .await
        .expect("acquire");
    let released_id = released.lease_id().to_string();
    released.release().await.expect("release");

    let stored_before = stored().await;
    let leases_before = client.list_leases(LeaseFilter::new()).await.expect("list");
    assert_eq!(stored_before.len(), 1, "one lock stored: {stored_before:?}");

    let acquire = |group: &str, topic: &str| proto::AcquireRequest {
        group: group.to_string(),
        topic: topic.to_string(),
        ..Default::default()
    };
    let secs = |s: i64, n: i32| {
        Some(prost_types::Duration {
            seconds: s,
            nanos: n,
        })
    };
    let long = "x".repeat(250);
    let acquires: Vec<(&str, proto::AcquireRequest, Code, &str)> = vec![
        (
            "group with /",
            acquire("a/b", &topic),
            Code::InvalidArgument,
            "\"a/b\"",
        ),
        (
            "group ..",
            acquire("..", &topic),
            Code::InvalidArgument,
            "\"..\"",
        ),
        (
            "group 250 chars",
            acquire(&long, &topic),
            Code::InvalidArgument,
            "250 characters",
        ),
        (
            "group non-ASCII",
            acquire("grüppe", &topic),
            Code::InvalidArgument,
            "'ü'",
        ),
        (
            "empty group",
            acquire("", &topic),
            Code::InvalidArgument,
            "group is empty",
        ),
        (
            "topic with /",
            acquire(&group, "t/x"),
            Code::InvalidArgument,
            "\"t/x\"",
        ),
        (
            "topic .",
            acquire(&group, "."),
            Code::InvalidArgument,
            "\".\"",
        ),
        (
            "missing topic",
            acquire(&group, "no-such-topic-xyz"),
            Code::NotFound,
            "no-such-topic-xyz",
        ),
        (
            "negative partition",
            proto::AcquireRequest {
                partition: Some(-1),
                ..acquire(&group, &topic)
            },
            Code::InvalidArgument,
            "-1",
        ),
        (
            "partition out of range",
            proto::AcquireRequest {
                partition: Some(2),
                ..acquire(&group, &topic)
            },
            Code::NotFound,
            "0..=1",
        ),
        (
            "ttl too short",
            proto::AcquireRequest {
                ttl: secs(0, 500_000_000),
                ..acquire(&group, &topic)
            },
            Code::InvalidArgument,
            "0.500s",
        ),
        (
            "ttl too long",
            proto::AcquireRequest {
                ttl: secs(301, 0),
                ..acquire(&group, &topic)
            },
            Code::InvalidArgument,
            "301s",
        ),
        (
            "negative wait",
            proto::AcquireRequest {
                wait: secs(-1, 0),
                ..acquire(&group, &topic)
            },
            Code::InvalidArgument,
            "wait",
        ),
        (
            "wait too long",
            proto::AcquireRequest {
                wait: secs(3600, 0),
                ..acquire(&group, &topic)
            },
            Code::InvalidArgument,
            "3600s",
        ),
        (
            "member too long",
            proto::AcquireRequest {
                member: "m".repeat(257),
                ..acquire(&group, &topic)
            },
            Code::InvalidArgument,
            "257 bytes",
        ),
        (
            "held partition",
            proto::AcquireRequest {
                partition: Some(0),
                ..acquire(&group, &topic)
            },
            Code::ResourceExhausted,
            "keeper",
        ),
    ];
    let mut raw = client.raw();
    for (name, request, code, needle) in acquires {
        let status = raw.acquire(request).await.expect_err(name);
        assert_eq!(status.code(), code, "{name}: {}", status.message());
        assert!(
            status.message().contains(needle),
            "{name}: {:?} lacks {needle:?}",
            status.message()
        );
    }

    let read = |lease_id: &str, max_records: u32, max_bytes: u32| proto::ReadRequest {
        lease_id: lease_id.to_string(),
        max_records,
        max_bytes,
        max_wait: None,
        from_offset: None,
        if_seek_epoch: None,
    };
    let reads: Vec<(&str, proto::ReadRequest, Code, &str)> = vec![
        (
            "max_bytes too large",
            read(held.lease_id(), 0, 4 * 1024 * 1024 + 1),
            Code::InvalidArgument,
            "4194305",
        ),
        (
            "negative from_offset",
            proto::ReadRequest {
                from_offset: Some(-7),
                ..read(held.lease_id(), 0, 0)
            },
            Code::OutOfRange,
            "-7",
        ),
        (
            "max_records too large",
            read(held.lease_id(), 10_001, 0),
            Code::InvalidArgument,
            "10001",
        ),
        (
            "unknown lease",
            read("feedfacefeedface.0000", 0, 0),
            Code::NotFound,
            "feedfacefeedface",
        ),
        (
            "empty lease id",
            read("", 0, 0),
            Code::InvalidArgument,
            "lease_id",
        ),
        (
            "released lease",
            read(&released_id, 0, 0),
            Code::FailedPrecondition,
            "released",
        ),
    ];
    for (name, request, code, needle) in reads {
        let status = raw.read(request).await.expect_err(name);
        assert_eq!(status.code(), code, "{name}: {}", status.message());
        assert!(
            status.message().contains(needle),
            "{name}: {:?} lacks {needle:?}",
            status.message()
        );
    }

    use proto::seek_request::Position;
    let seek = |lease_id: &str, position: Option<Position>| proto::SeekRequest {
        lease_id: lease_id.to_string(),
        position,
    };
    let seeks: Vec<(&str, proto::SeekRequest, Code, &str)> = vec![
        (
            "seek past the end",
            seek(held.lease_id(), Some(Position::Offset(6))),
            Code::OutOfRange,
            "0 ..= 5",
        ),
        (
            "seek negative",
            seek(held.lease_id(), Some(Position::Offset(-3))),
            Code::OutOfRange,
            "-3",
        ),
        (
            "seek without position",
            seek(held.lease_id(), None),
            Code::InvalidArgument,
            "position",
        ),
        (
            "seek on released",
            seek(&released_id, Some(Position::Earliest(()))),
            Code::FailedPrecondition,
            "released",
        ),
    ];
    for (name, request, code, needle) in seeks {
        let status = raw.seek(request).await.expect_err(name);
        assert_eq!(status.code(), code, "{name}: {}", status.message());
        assert!(
            status.message().contains(needle),
            "{name}: {:?} lacks {needle:?}",
            status.message()
        );
    }

    let commit = |lease_id: &str, offset: i64| proto::CommitRequest {
        lease_id: lease_id.to_string(),
        offset,
        metadata: None,
    };
    let commits: Vec<(&str, proto::CommitRequest, Code, &str)> = vec![
        (
            "commit past the end",
            commit(held.lease_id(), 6),
            Code::OutOfRange,
            "6",
        ),
        (
            "commit negative",
            commit(held.lease_id(), -1),
            Code::OutOfRange,
            "-1",
        ),
        (
            "commit on released",
            commit(&released_id, 1),
            Code::FailedPrecondition,
            "released",
        ),
        (
            "commit huge metadata",
            proto::CommitRequest {
                metadata: Some("m".repeat(5000)),
                ..commit(held.lease_id(), 1)
            },
            Code::InvalidArgument,
            "5000 bytes",
        ),
        (
            // With the token prefix this would exceed Kafka's offset.metadata.max.bytes: it
            // must be refused before anything is sent, not come back UNAVAILABLE.
            "commit metadata that fits 4096 only without the prefix",
            proto::CommitRequest {
                metadata: Some("m".repeat(4096)),
                ..commit(held.lease_id(), 1)
            },
            Code::InvalidArgument,
            "4096 bytes",
        ),
    ];
    for (name, request, code, needle) in commits {
        let status = raw.commit(request).await.expect_err(name);
        assert_eq!(status.code(), code, "{name}: {}", status.message());
        assert!(
            status.message().contains(needle),
            "{name}: {:?} lacks {needle:?}",
            status.message()
        );
    }

    let status = raw
        .release(proto::ReleaseRequest {
            lease_id: released_id.clone(),
            commit_offset: None,
        })
        .await
        .expect_err("release twice");
    assert_eq!(status.code(), Code::NotFound);
    let status = raw
        .release(proto::ReleaseRequest {
            lease_id: held.lease_id().to_string(),
            commit_offset: Some(99),
        })
        .await
        .expect_err("release with a bad commit");
    assert_eq!(status.code(), Code::OutOfRange, "{}", status.message());
    let status = raw
        .list_leases(proto::ListLeasesRequest {
            group: Some("a/b".into()),
            ..Default::default()
        })
        .await
        .expect_err("bad filter");
    assert_eq!(status.code(), Code::InvalidArgument);

    // Nothing changed: the same lease is held, with the same stored lock (key, token and
    // holder record).
    assert_eq!(stored().await, stored_before);
    let leases_after = client.list_leases(LeaseFilter::new()).await.expect("list");
    let view = |l: &kafka_lease_client::LeaseInfo| {
        (
            l.group.clone(),
            l.topic.clone(),
            l.partition,
            l.fencing_token,
            l.member.clone(),
        )
    };
    assert_eq!(
        leases_after.iter().map(view).collect::<Vec<_>>(),
        leases_before.iter().map(view).collect::<Vec<_>>()
    );
    assert!(
        !committed(group.to_string(), topic.to_string()).await,
        "no commit reached Kafka"
    );
    held.release().await.expect("the lease still works");
}

/// What a client sees of one lease's life, with fencing tokens (which differ between any two
/// leases) written as `T`.
#[derive(Debug, PartialEq, Eq)]
pub struct Transcript {
    pub start: i64,
    pub first_batch: Vec<(i64, Option<Vec<u8>>, u64)>,
    pub seek: (i64, u64),
    pub after_seek: Vec<(i64, u64)>,
    pub commit_metadata: String,
    pub out_of_range: (Code, String, Option<String>, BTreeMap<String, String>),
    pub released_with: Option<i64>,
    pub after_release: (Code, Option<String>),
    /// A second Release: code, message (lease reference written as `R`), reason.
    pub second_release: (Code, String, Option<String>),
    pub committed: Option<(i64, String)>,
    pub next_holder_start: i64,
}

pub fn without_token(text: &str, token: u64) -> String {
    text.replace(&token.to_string(), "T")
}

/// `text` with the (first) quoted lease reference after `lease ` written as `R`.
pub fn without_lease_ref(text: &str) -> String {
    let Some((head, rest)) = text.split_once("lease \"") else {
        return text.to_string();
    };
    match rest.split_once('"') {
        Some((_, tail)) => format!("{head}lease \"R\"{tail}"),
        None => text.to_string(),
    }
}

pub fn reason_and_metadata(status: &tonic::Status) -> (Option<String>, BTreeMap<String, String>) {
    let details = StatusDetails::from_status(status);
    let metadata = details
        .metadata_entries()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    (details.reason().map(|r| r.as_str().to_string()), metadata)
}

/// One lease's life on partition 0 of `topic`, as the client sees it: acquired through
/// `acquirer`, everything else (Read, Seek, Commit, a Seek out of range, Release, calls on
/// the released lease) through `caller`, the same gateway or another that forwards;
/// `committed(group, topic)` is partition 0's committed offset and metadata as Kafka has it.
pub async fn one_lease_life<CF>(
    acquirer: &Client,
    caller: &Client,
    group: &str,
    topic: &str,
    committed: impl FnOnce(String, String) -> CF,
) -> Transcript
where
    CF: Future<Output = Option<(i64, String)>>,
{
    let lease = acquirer
        .acquire(AcquireOptions::new(group, topic).partition(0))
        .await
        .expect("acquire");
    let (lease_id, token) = (lease.lease_id().to_string(), lease.fencing_token());
    let mut raw = caller.raw();
    let read = |from_offset: Option<i64>| proto::ReadRequest {
        lease_id: lease_id.clone(),
        max_records: 5,
        from_offset,
        ..Default::default()
    };

    let mut stream = raw.read(read(None)).await.expect("read").into_inner();
    let first = tokio::time::timeout(DEADLINE, stream.next())
        .await
        .expect("a first batch in time")
        .expect("the stream stays open")
        .expect("a batch");
    let first_batch = first
        .records
        .iter()
        .map(|r| {
            (
                r.offset,
                r.value.as_deref().map(<[u8]>::to_vec),
                first.seek_epoch,
            )
        })
        .collect();

    let seek = raw
        .seek(proto::SeekRequest {
            lease_id: lease_id.clone(),
            position: Some(proto::seek_request::Position::Offset(12)),
        })
        .await
        .expect("seek")
        .into_inner();
    // The Read open before the seek goes on in the new epoch: its next batch of the new
    // epoch starts at the sought offset.
    let mut after_seek = Vec::new();
    while after_seek.is_empty() {
        let batch = tokio::time::timeout(DEADLINE, stream.next())
            .await
            .expect("a batch after the seek in time")
            .expect("the stream stays open")
            .expect("a batch");
        if batch.seek_epoch == seek.seek_epoch {
            after_seek = batch
                .records
                .iter()
                .map(|r| (r.offset, batch.seek_epoch))
                .collect();
        }
    }
    drop(stream);

    let commit = raw
        .commit(proto::CommitRequest {
            lease_id: lease_id.clone(),
            offset: 14,
            metadata: Some("worker 7".into()),
        })
        .await
        .expect("commit")
        .into_inner();
    let out_of_range = raw
        .commit(proto::CommitRequest {
            lease_id: lease_id.clone(),
            offset: 1_000_000,
            metadata: None,
        })
        .await
        .expect_err("an offset past the high watermark");
    let (oor_reason, oor_metadata) = reason_and_metadata(&out_of_range);
    let released = raw
        .release(proto::ReleaseRequest {
            lease_id: lease_id.clone(),
            commit_offset: Some(15),
        })
        .await
        .expect("release")
        .into_inner();
    let after_release = raw
        .seek(proto::SeekRequest {
            lease_id: lease_id.clone(),
            position: Some(proto::seek_request::Position::Earliest(())),
        })
        .await
        .expect_err("a seek on a released lease");
    let second_release = raw
        .release(proto::ReleaseRequest {
            lease_id: lease_id.clone(),
            commit_offset: None,
        })
        .await
        .expect_err("a second release");
    let next = acquirer
        .acquire(AcquireOptions::new(group, topic).partition(0))
        .await
        .expect("the next holder");
    let next_holder_start = next.offset();
    next.release().await.expect("release the next holder");
    Transcript {
        start: lease.offset(),
        first_batch,
        seek: (seek.offset, seek.seek_epoch),
        after_seek,
        commit_metadata: without_token(&commit.metadata, token),
        out_of_range: (
            out_of_range.code(),
            out_of_range.message().to_string(),
            oor_reason,
            oor_metadata,
        ),
        released_with: released.committed_offset,
        after_release: (after_release.code(), reason_and_metadata(&after_release).0),
        second_release: (
            second_release.code(),
            without_lease_ref(second_release.message()),
            reason_and_metadata(&second_release).0,
        ),
        committed: committed(group.to_string(), topic.to_string())
            .await
            .map(|(offset, metadata)| (offset, without_token(&metadata, token))),
        next_holder_start,
    }
}
