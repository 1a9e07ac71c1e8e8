//! The lease rules that need no real services, on an in-process gateway: librdkafka's mock
//! cluster for Kafka and the in-memory lock backend, so they run in well under a second each.
//! Where a Read starts (the resume point, `from_offset`), seek epochs, how a lease ends and
//! what is said to calls on it afterwards, and what an Acquire that goes away leaves behind.
//! The same rules hold against real Kafka and Consul; the end-to-end suites check those.

use std::time::Duration;

use futures::StreamExt;
use kafka_lease_server::coordination::LockBackend;
use kafka_lease_server::dev::{DevKafka, DEMO_TOPIC};
use kafka_lease_server::error::{EndReason, LeaseError};
use kafka_lease_server::gateway::{AcquireSpec, Gateway, Granted, Limits, Reset, SeekTarget};
use kafka_lease_server::kafka::{Kafka, KafkaSettings};
use kafka_lease_server::lease::{ReadLimits, ReadStream};
use kafka_lease_testkit::unique_name;

mod support;
use support::Rig;

/// Read, Seek, Commit and Release on lease `id` as the service calls them: the id resolved
/// once ([`Gateway::resolve`]), then the operation on the lease, epochs as numbers as on the
/// wire.
mod on_lease {

    use super::*;
    use kafka_lease_server::lease::{LeaseId, ReadLimits, ReadStream, SeekEpoch};

    pub(crate) async fn read(
        gateway: &Gateway,
        id: &LeaseId,
        limits: ReadLimits,
        from_offset: Option<i64>,
        if_seek_epoch: Option<u64>,
    ) -> Result<ReadStream, LeaseError> {
        let lease = gateway.lease(id.as_str())?;
        gateway
            .read(
                &lease,
                limits,
                from_offset,
                if_seek_epoch.map(SeekEpoch::from_wire),
            )
            .await
    }

    pub(crate) async fn seek(
        gateway: &Gateway,
        id: &LeaseId,
        target: kafka_lease_server::gateway::SeekTarget,
    ) -> Result<(i64, u64), LeaseError> {
        let (offset, epoch) = gateway.seek(&gateway.lease(id.as_str())?, target).await?;
        Ok((offset, epoch.get()))
    }

    pub(crate) async fn commit(
        gateway: &Gateway,
        id: &LeaseId,
        offset: i64,
        metadata: Option<&str>,
    ) -> Result<String, LeaseError> {
        gateway
            .commit(&gateway.lease(id.as_str())?, offset, metadata)
            .await
    }

    pub(crate) async fn release(
        gateway: &Gateway,
        id: &LeaseId,
        commit: Option<i64>,
    ) -> Result<Option<i64>, LeaseError> {
        let lease = gateway.resolve(id.as_str()).here_to_release()?;
        gateway.release(&lease, commit).await
    }
}

const RECORDS: u32 = 50;
const DEADLINE: Duration = Duration::from_secs(20);

async fn rig() -> Rig {
    Rig::one().sample_records(RECORDS).await
}

async fn rig_with(limits: Limits, max_groups: usize) -> Rig {
    Rig::one()
        .sample_records(RECORDS)
        .limits(limits)
        .max_groups(max_groups)
        .await
}

fn spec(group: &str, partition: i32) -> AcquireSpec {
    AcquireSpec {
        group: group.into(),
        topic: DEMO_TOPIC.into(),
        partition: Some(partition),
        member: "rules".into(),
        ttl: Duration::from_secs(30),
        wait: Duration::ZERO,
        reset: Reset::Earliest,
        via: None,
        subscriber: String::new(),
        owner: None,
    }
}

fn limits(max_records: usize) -> ReadLimits {
    ReadLimits {
        max_records,
        max_bytes: 1 << 20,
        max_wait: Duration::from_millis(20),
    }
}

/// The next response of a Read: `(seek_epoch, offsets)`.
async fn next(stream: &mut ReadStream) -> (u64, Vec<i64>) {
    let response = tokio::time::timeout(DEADLINE, stream.next())
        .await
        .expect("a response in time")
        .expect("the stream is open")
        .expect("a batch")
        .decode();
    (
        response.seek_epoch,
        response.records.iter().map(|r| r.offset).collect(),
    )
}

async fn acquire(rig: &Rig, group: &str, partition: i32) -> Granted {
    rig.gateway()
        .acquire(spec(group, partition))
        .await
        .expect("acquire")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_read_starts_at_the_resume_point_never_where_the_last_stream_got_to() {
    let rig = rig().await;
    let group = unique_name("g");
    let lease = acquire(&rig, &group, 0).await;
    assert_eq!(lease.offset, 0);

    let mut first = on_lease::read(rig.gateway(), &lease.lease_id, limits(10), None, None)
        .await
        .unwrap();
    assert_eq!(next(&mut first).await.1, (0..10).collect::<Vec<_>>());
    assert_eq!(next(&mut first).await.1, (10..20).collect::<Vec<_>>());
    // The stream broke after 20 records were handed to gRPC; none was committed. The next
    // Read starts at the Acquire offset again (at least once), superseding the first.
    let mut second = on_lease::read(rig.gateway(), &lease.lease_id, limits(10), None, None)
        .await
        .unwrap();
    assert_eq!(next(&mut second).await.1[0], 0);
    match tokio::time::timeout(DEADLINE, first.next())
        .await
        .expect("ends")
    {
        Some(Err(LeaseError::Superseded { .. })) => {}
        other => panic!("the first Read is superseded: {other:?}"),
    }

    // A commit moves the resume point.
    on_lease::commit(rig.gateway(), &lease.lease_id, 7, None)
        .await
        .unwrap();
    let mut third = on_lease::read(rig.gateway(), &lease.lease_id, limits(10), None, None)
        .await
        .unwrap();
    assert_eq!(next(&mut third).await.1[0], 7);

    // So does a Seek, in a new epoch.
    let (offset, epoch) = on_lease::seek(rig.gateway(), &lease.lease_id, SeekTarget::Offset(30))
        .await
        .unwrap();
    assert_eq!((offset, epoch), (30, 1));
    let mut fourth = on_lease::read(rig.gateway(), &lease.lease_id, limits(10), None, None)
        .await
        .unwrap();
    assert_eq!(next(&mut fourth).await, (1, (30..40).collect::<Vec<_>>()));

    // `from_offset` starts exactly there, as a Seek would: a new epoch.
    let mut fifth = on_lease::read(rig.gateway(), &lease.lease_id, limits(5), Some(12), None)
        .await
        .unwrap();
    assert_eq!(next(&mut fifth).await, (2, (12..17).collect::<Vec<_>>()));
    // ... and it is the new resume point.
    let mut sixth = on_lease::read(rig.gateway(), &lease.lease_id, limits(5), None, None)
        .await
        .unwrap();
    assert_eq!(next(&mut sixth).await.1[0], 12);

    // A reopen's `from_offset` counts only while the lease is at the epoch it names: a
    // reopen of epoch 2's Read racing a Seek (epoch 3) starts where the Seek put the lease.
    let (_, epoch) = on_lease::seek(rig.gateway(), &lease.lease_id, SeekTarget::Offset(20))
        .await
        .unwrap();
    assert_eq!(epoch, 3);
    let mut late_reopen =
        on_lease::read(rig.gateway(), &lease.lease_id, limits(5), Some(17), Some(2))
            .await
            .unwrap();
    assert_eq!(
        next(&mut late_reopen).await,
        (3, (20..25).collect::<Vec<_>>())
    );
    // At the epoch it names, it repositions (a new epoch).
    let mut reopen = on_lease::read(rig.gateway(), &lease.lease_id, limits(5), Some(22), Some(3))
        .await
        .unwrap();
    assert_eq!(next(&mut reopen).await, (4, (22..27).collect::<Vec<_>>()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_seek_no_record_of_the_old_epoch_is_handed_out() {
    let rig = rig().await;
    let lease = acquire(&rig, &unique_name("g"), 1).await;
    let mut stream = on_lease::read(rig.gateway(), &lease.lease_id, limits(3), None, None)
        .await
        .unwrap();
    assert_eq!(next(&mut stream).await, (0, vec![0, 1, 2]));
    for round in 1..=5_u64 {
        let target = (round as i64) * 7;
        let (offset, epoch) =
            on_lease::seek(rig.gateway(), &lease.lease_id, SeekTarget::Offset(target))
                .await
                .unwrap();
        assert_eq!((offset, epoch), (target, round));
        let (got_epoch, offsets) = next(&mut stream).await;
        assert_eq!(
            got_epoch, round,
            "every response after the SeekResponse is of its epoch"
        );
        assert_eq!(offsets[0], target, "and starts at the resolved offset");
    }
    let (offset, _) = on_lease::seek(rig.gateway(), &lease.lease_id, SeekTarget::Earliest)
        .await
        .unwrap();
    assert_eq!(offset, 0);
    assert_eq!(next(&mut stream).await.1[0], 0);
    // Out of range: refused with the range, nothing changes.
    match on_lease::seek(
        rig.gateway(),
        &lease.lease_id,
        SeekTarget::Offset(i64::from(RECORDS) + 1),
    )
    .await
    {
        Err(LeaseError::OffsetOutOfRange { low, high, .. }) => {
            assert_eq!((low, high), (0, i64::from(RECORDS)))
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_ends_the_read_with_ok_and_later_calls_say_so() {
    let rig = rig().await;
    let group = unique_name("g");
    let lease = acquire(&rig, &group, 2).await;
    let mut stream = on_lease::read(
        rig.gateway(),
        &lease.lease_id,
        limits(RECORDS as usize),
        None,
        None,
    )
    .await
    .unwrap();
    assert_eq!(next(&mut stream).await.1.len(), RECORDS as usize);
    on_lease::release(rig.gateway(), &lease.lease_id, Some(25))
        .await
        .unwrap();
    // The open Read (waiting for records that will not come) ends with OK.
    assert!(
        tokio::time::timeout(DEADLINE, stream.next())
            .await
            .expect("the Read ends")
            .is_none(),
        "a released lease's Read ends with OK"
    );
    let commit_refused = match on_lease::commit(rig.gateway(), &lease.lease_id, 30, None).await {
        Err(
            err @ LeaseError::LeaseEnded {
                reason: EndReason::Released,
                ..
            },
        ) => err.to_string(),
        other => panic!("a commit after Release is refused: {other:?}"),
    };
    // A second Release is NOT_FOUND (the contract), and says what Commit says: that the
    // lease has ended, and how; not that no instance knows it.
    let again = on_lease::release(rig.gateway(), &lease.lease_id, None)
        .await
        .expect_err("a second Release is refused");
    assert!(
        matches!(
            again,
            LeaseError::ReleaseOfEnded {
                reason: EndReason::Released,
                ..
            }
        ),
        "{again:?}"
    );
    let status = kafka_lease_server::grpc::status_of(again);
    assert_eq!(status.code(), tonic::Code::NotFound, "{status:?}");
    let reason = tonic_types::StatusExt::get_details_error_info(&status).map(|info| info.reason);
    assert_eq!(reason.as_deref(), Some("LEASE_NOT_FOUND"));
    assert_eq!(status.message(), commit_refused);
    assert!(
        commit_refused.ends_with("has ended: lease released"),
        "{commit_refused}"
    );
    // The partition is free at once, and the next holder starts at the commit.
    let next_holder = acquire(&rig, &group, 2).await;
    assert_eq!(next_holder.offset, 25);
    assert!(next_holder.fencing_token > lease.fencing_token);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_session_ends_every_lease_and_their_reads_say_lease_lost() {
    let rig = rig().await;
    let group = unique_name("g");
    let mut streams = Vec::new();
    for partition in 0..4 {
        let lease = acquire(&rig, &group, partition).await;
        let mut stream = on_lease::read(
            rig.gateway(),
            &lease.lease_id,
            limits(RECORDS as usize),
            None,
            None,
        )
        .await
        .unwrap();
        next(&mut stream).await;
        streams.push(stream);
    }
    rig.locks().invalidate_session();
    for mut stream in streams {
        match tokio::time::timeout(DEADLINE, stream.next())
            .await
            .expect("ends")
        {
            Some(Err(LeaseError::LeaseEnded {
                reason: EndReason::Lost(_),
                ..
            })) => {}
            other => panic!("expected lease lost, got {other:?}"),
        }
    }
    // A Read can see the fence before the session watcher has ended its lease; the table
    // empties right after.
    kafka_lease_testkit::wait_for("every lease to end", DEADLINE, || async {
        (rig.gateway().lease_count() == 0).then_some(())
    })
    .await;
    // The partitions can be leased again under the new session, as soon as this gateway
    // has let go of them (an Acquire that waits is offered the partition then).
    rig.gateway()
        .acquire(AcquireSpec {
            wait: DEADLINE,
            ..spec(&group, 0)
        })
        .await
        .expect("the partition again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_gets_a_partition_this_gateway_lets_go_of_after_its_session_is_lost() {
    let rig = rig().await;
    let group = unique_name("g");
    let lease = acquire(&rig, &group, 0).await;
    // A waiter on this same gateway, for the partition its own lease holds.
    let waiter = {
        let gateway = rig.gateway().clone();
        let spec = AcquireSpec {
            wait: Duration::from_secs(10),
            ..spec(&group, 0)
        };
        tokio::spawn(async move { gateway.acquire(spec).await })
    };
    kafka_lease_testkit::wait_for("the Acquire to wait", DEADLINE, || async {
        (rig.gateway().waiting_acquires() == 1).then_some(())
    })
    .await;
    // The session goes: the lock store drops the key at once (the watch sees it free while
    // the lease still blocks it here); the gateway lets go of it a moment later, with no
    // write any watch could see. The waiter must be offered it then, not at its deadline.
    rig.locks().invalidate_session();
    let granted = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter is served well before its deadline")
        .expect("join")
        .expect("the partition");
    assert_ne!(granted.lease_id, lease.lease_id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_dropped_at_any_point_leaves_no_lock_without_a_lease() {
    let rig = rig().await;
    let group = unique_name("g");
    // Cut the Acquire future after 0, 1, 2, ... polls' worth of progress: each cut lands at a
    // different await point (the partition count, the lock, the committed offset, ...).
    for step in 0..40_u64 {
        let call = rig.gateway().acquire(spec(&group, (step % 4) as i32));
        let cut = Duration::from_micros(step * 250);
        let _ = tokio::time::timeout(cut, call).await;
    }
    // Whatever became of the calls, every lock the backend holds belongs to a lease the
    // gateway serves, and the abandoned ones are given back.
    kafka_lease_testkit::wait_for("every lock to belong to a lease", DEADLINE, || async {
        let held = rig.locks().list(Some(&group)).await.ok()?;
        (held.len() == rig.gateway().lease_count()).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_broker_states_are_retried_and_refusals_are_not_unavailable() {
    use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
    let rig = rig().await;
    let group = unique_name("g");
    // A coordinator still loading its offsets answers NOT_COORDINATOR and
    // COORDINATOR_LOAD_IN_PROGRESS for a while: the Acquire gets its lease all the same.
    rig.mock().request_errors(
        RDKafkaApiKey::OffsetFetch,
        &[
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_COORDINATOR_LOAD_IN_PROGRESS,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_COORDINATOR,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_COORDINATOR_LOAD_IN_PROGRESS,
        ],
    );
    let lease = acquire(&rig, &group, 3).await;
    // A refusal no retry can mend is said as such, not as "unavailable, safe to retry".
    rig.mock().request_errors(
        RDKafkaApiKey::OffsetCommit,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_GROUP_AUTHORIZATION_FAILED],
    );
    match on_lease::commit(rig.gateway(), &lease.lease_id, 5, None).await {
        Err(LeaseError::KafkaRefused { denied: true, .. }) => {}
        other => panic!("an authorization failure is KAFKA_DENIED: {other:?}"),
    }
    // The lease is still usable once Kafka accepts again.
    on_lease::commit(rig.gateway(), &lease.lease_id, 5, None)
        .await
        .expect("commit");
}

/// The limit an error names, or a panic showing what came instead.
fn limit_of(result: Result<Granted, LeaseError>) -> (&'static str, usize) {
    match result {
        Err(LeaseError::LimitReached { flag, limit, what }) => {
            assert!(!what.is_empty());
            (flag, limit)
        }
        other => panic!("expected a limit, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_gateway_limit_is_refused_with_its_flag_and_value() {
    let limits = Limits {
        max_leases: 2,
        max_waiting_acquires: 1,
        ..Limits::default()
    };
    let rig = rig_with(limits, 2).await;
    let group = unique_name("g");
    let first = acquire(&rig, &group, 0).await;
    acquire(&rig, &group, 1).await;
    // A third lease is past --max-leases, and stores nothing.
    assert_eq!(
        limit_of(rig.gateway().acquire(spec(&group, 2)).await),
        ("--max-leases", 2)
    );
    let held = rig.locks().list(Some(&group)).await.expect("list");
    assert_eq!(held.len(), 2, "the refused Acquire took no lock");
    on_lease::release(rig.gateway(), &first.lease_id, None)
        .await
        .unwrap();

    // One Acquire may wait for the held partition 1; a second waiter is refused at once.
    let waiting = {
        let gateway = rig.gateway().clone();
        let spec = AcquireSpec {
            wait: Duration::from_secs(30),
            ..spec(&group, 1)
        };
        tokio::spawn(async move { gateway.acquire(spec).await })
    };
    kafka_lease_testkit::wait_for("the first Acquire to wait", DEADLINE, || async {
        (rig.gateway().waiting_acquires() == 1).then_some(())
    })
    .await;
    let second = AcquireSpec {
        wait: Duration::from_secs(30),
        ..spec(&group, 1)
    };
    let refused = rig.gateway().acquire(second).await.map(|_| ()).unwrap_err();
    assert_eq!(limit_of(Err(refused)), ("--max-waiting-acquires", 1));
    assert!(!waiting.is_finished(), "the first waiter keeps waiting");
    waiting.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_per_connection_count_live_leases_of_that_connection_only() {
    let limits = Limits {
        max_leases_per_connection: 2,
        ..Limits::default()
    };
    let rig = rig_with(limits, 2).await;
    let group = unique_name("g");
    let (one, two): (std::net::SocketAddr, std::net::SocketAddr) = (
        "127.0.0.1:40001".parse().unwrap(),
        "127.0.0.1:40002".parse().unwrap(),
    );
    let via = |partition, via| AcquireSpec {
        via: Some(via),
        ..spec(&group, partition)
    };
    let first = rig.gateway().acquire(via(0, one)).await.expect("first");
    rig.gateway().acquire(via(1, one)).await.expect("second");
    assert_eq!(
        limit_of(rig.gateway().acquire(via(2, one)).await),
        ("--max-leases-per-connection", 2)
    );
    // Another connection has its own count, and a lease that ends frees its place.
    rig.gateway()
        .acquire(via(2, two))
        .await
        .expect("other connection");
    on_lease::release(rig.gateway(), &first.lease_id, None)
        .await
        .unwrap();
    rig.gateway()
        .acquire(via(3, one))
        .await
        .expect("a place again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_count_read_before_serves_when_the_brokers_do_not_answer_a_metadata_request() {
    let kafka = DevKafka::start(RECORDS).await.expect("mock cluster");
    let mut settings = KafkaSettings::new(kafka.bootstrap_servers(), "rig");
    // Every call reads the count afresh, and gives up on the brokers after 300 ms.
    settings.partition_count_max_age = Duration::ZERO;
    settings.request_timeout = Duration::from_millis(300);
    let client = Kafka::new(settings).expect("kafka");
    let count = client
        .partition_count(DEMO_TOPIC, Some(0))
        .await
        .expect("count");
    // The broker now takes 2 s per request (a broker too busy for the metadata of a topic of
    // thousands of partitions): the count read before serves every partition below it.
    kafka
        .mock()
        .broker_round_trip_time(1, Duration::from_secs(2))
        .expect("slow broker");
    assert_eq!(
        client
            .partition_count(DEMO_TOPIC, Some(count - 1))
            .await
            .expect("the count read before"),
        count
    );
    // A partition past it needs the brokers' word.
    assert!(client
        .partition_count(DEMO_TOPIC, Some(count))
        .await
        .is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_group_limit_counts_groups_in_use_and_makes_room_from_idle_ones() {
    let rig = rig_with(Limits::default(), 2).await;
    let (one, two, three) = (unique_name("g"), unique_name("g"), unique_name("g"));
    acquire(&rig, &one, 0).await;
    let second = acquire(&rig, &two, 0).await;
    assert_eq!(
        limit_of(rig.gateway().acquire(spec(&three, 0)).await),
        ("--max-groups", 2)
    );
    // The second group's client is idle once its lease is gone (the lease's last tasks let
    // go of it a moment after Release answers): the third takes its place.
    on_lease::release(rig.gateway(), &second.lease_id, None)
        .await
        .unwrap();
    kafka_lease_testkit::wait_for(
        "the third group to take the idle one's place",
        DEADLINE,
        || {
            let (gateway, spec) = (rig.gateway().clone(), spec(&three, 0));
            async move {
                match gateway.acquire(spec).await {
                    Ok(granted) => Some(granted),
                    Err(LeaseError::LimitReached { .. }) => None,
                    Err(other) => panic!("the third group: {other:?}"),
                }
            }
        },
    )
    .await;
}
