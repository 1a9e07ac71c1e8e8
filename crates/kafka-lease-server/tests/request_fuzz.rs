//! Bad requests, generated: every request field at its edges and beyond, through the gRPC
//! service itself (in process: librdkafka's mock cluster and the in-memory lock backend).
//! Each request has one field out of its allowed range and the others anywhere in theirs; it
//! must be refused with the status the contract gives (INVALID_ARGUMENT naming the field,
//! OUT_OF_RANGE, NOT_FOUND), never panic the task that serves it, and change nothing: the
//! held lease keeps its lock, token, committed offset, resume point and seek epoch, and no
//! other lock is taken.

use std::sync::Arc;
use std::time::Duration;

use kafka_lease_proto::encoded::partition_lease_service_server::PartitionLeaseService as _;
use kafka_lease_proto::v1;
use kafka_lease_server::coordination::LockBackend;
use kafka_lease_server::dev::DEMO_TOPIC;
use kafka_lease_server::grpc::forward::Peers;
use kafka_lease_server::grpc::LeaseService;
use proptest::prelude::*;
use tonic::{Code, Request};
use tonic_types::StatusExt;

mod support;

/// Records per partition of the sample topic: the high watermark.
const RECORDS: i64 = 20;
const COMMITTED: i64 = 5;
const CASES: u32 = 256;

/// The in-process rig's instance, with the lease service called directly (no socket) and
/// one lease held.
struct Rig {
    service: LeaseService,
    lease_id: String,
    rig: support::Rig,
}

/// What must not change: the held locks (key, token) and the lease's offsets and epoch.
#[derive(Debug, PartialEq)]
struct State {
    locks: Vec<(String, u64)>,
    committed: Option<i64>,
    resume_point: i64,
    seek_epoch: u64,
}

impl Rig {
    async fn new() -> Rig {
        let rig = support::Rig::one().sample_records(RECORDS as u32).await;
        let backend: Arc<dyn LockBackend> = rig.locks().clone();
        let peers = Arc::new(Peers::new(
            rig.gateway().instance().to_string(),
            backend,
            kafka_lease_server::calls::ConnectionLimits::default(),
        ));
        let service = LeaseService::new(rig.gateway().clone(), peers);
        let lease_id = service
            .acquire(Request::new(v1::AcquireRequest {
                group: "fuzz".into(),
                topic: DEMO_TOPIC.into(),
                partition: Some(0),
                ttl: Some(prost_types::Duration {
                    seconds: 300,
                    nanos: 0,
                }),
                ..Default::default()
            }))
            .await
            .expect("the held lease")
            .into_inner()
            .lease_id;
        service
            .commit(Request::new(v1::CommitRequest {
                lease_id: lease_id.clone(),
                offset: COMMITTED,
                metadata: None,
            }))
            .await
            .expect("a commit");
        Rig {
            service,
            lease_id,
            rig,
        }
    }

    async fn state(&self) -> State {
        let lease = self
            .rig
            .gateway()
            .lease(&self.lease_id)
            .expect("the lease lives");
        let held = self.rig.locks().list(None).await.expect("locks");
        State {
            locks: held
                .iter()
                .map(|h| (format!("{:?}", h.key), h.token.get()))
                .collect(),
            committed: lease.committed(),
            resume_point: lease.resume_point(),
            seek_epoch: lease.seek_epoch().get(),
        }
    }
}

/// Which field a request breaks, and the value it gets.
#[derive(Clone, Debug)]
enum Bad {
    Name(&'static str, String),
    Partition(i32),
    Duration(&'static str, i64, i32),
    OffsetReset(i32),
    LeaseId(String),
    ReadLimit(&'static str, u32),
    FromOffset(i64),
    SeekOffset(i64),
    SeekTime(i64, i32),
    CommitOffset(i64),
    Metadata(usize),
    ReleaseOffset(i64),
    Topics(Vec<String>),
    MemberId(String),
}

fn bad_name() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just(".".to_string()),
        Just("..".to_string()),
        Just("a".repeat(250)),
        Just("a".repeat(10_000)),
        "[a-z]{0,5}[ /:*?\"<>|\u{0}\u{e9}\u{1f600}][a-z]{0,5}",
    ]
}

fn bad() -> impl Strategy<Value = Bad> {
    prop_oneof![
        (prop_oneof![Just("group"), Just("topic")], bad_name()).prop_map(|(f, v)| Bad::Name(f, v)),
        prop_oneof![Just(-1), Just(4), Just(i32::MAX), Just(i32::MIN), 4..1000]
            .prop_map(Bad::Partition),
        (
            prop_oneof![Just("ttl"), Just("wait")],
            prop_oneof![
                Just(-1_i64),
                Just(0),
                Just(301),
                Just(i64::MAX),
                Just(i64::MIN)
            ],
            prop_oneof![Just(-1_i32), Just(0), Just(1_000_000_000), Just(i32::MAX)],
        )
            .prop_filter("outside the allowed range", |(f, s, n)| {
                // ttl allows 1 s ..= 5 min, wait 0 ..= 5 min, nanos 0 ..= 999,999,999.
                let nanos_ok = (0..1_000_000_000).contains(n);
                let secs_ok = match *f {
                    "ttl" => (1..=299).contains(s) || (*s == 300 && *n == 0),
                    _ => (0..=299).contains(s) || (*s == 300 && *n == 0),
                };
                !(nanos_ok && secs_ok)
            })
            .prop_map(|(f, s, n)| Bad::Duration(f, s, n)),
        prop_oneof![Just(-1), Just(3), Just(99), Just(i32::MIN)].prop_map(Bad::OffsetReset),
        prop_oneof![
            Just(String::new()),
            Just("no-dot".to_string()),
            Just(".".to_string()),
            Just("x".repeat(201)),
            "[a-f0-9]{8}\\.[a-f0-9]{8}",
        ]
        .prop_map(Bad::LeaseId),
        (
            prop_oneof![Just("max_records"), Just("max_bytes")],
            prop_oneof![Just(10_001_u32), Just(u32::MAX), Just(4 * 1024 * 1024 + 1)],
        )
            // max_records is capped at 10,000, max_bytes at 4 MiB.
            .prop_filter("beyond the cap", |(f, v)| {
                *v > if *f == "max_records" {
                    10_000
                } else {
                    4 * 1024 * 1024
                }
            })
            .prop_map(|(f, v)| Bad::ReadLimit(f, v)),
        prop_oneof![
            Just(-1_i64),
            Just(RECORDS + 1),
            Just(i64::MAX),
            Just(i64::MIN)
        ]
        .prop_map(Bad::FromOffset),
        prop_oneof![
            Just(-1_i64),
            Just(RECORDS + 1),
            Just(i64::MAX),
            Just(i64::MIN)
        ]
        .prop_map(Bad::SeekOffset),
        (
            prop_oneof![Just(0_i64), Just(i64::MAX), Just(i64::MIN), Just(-1)],
            prop_oneof![Just(-1_i32), Just(1_000_000_000), Just(i32::MIN)]
        )
            .prop_map(|(s, n)| Bad::SeekTime(s, n)),
        prop_oneof![
            Just(-1_i64),
            Just(RECORDS + 1),
            Just(i64::MAX),
            Just(i64::MIN)
        ]
        .prop_map(Bad::CommitOffset),
        prop_oneof![Just(4_058_usize), Just(100_000)].prop_map(Bad::Metadata),
        prop_oneof![Just(-1_i64), Just(RECORDS + 1), Just(i64::MAX)].prop_map(Bad::ReleaseOffset),
        prop_oneof![
            Just(Vec::new()),
            Just(vec![DEMO_TOPIC.to_string(), String::new()]),
            Just(vec!["bad topic".to_string()]),
        ]
        .prop_map(Bad::Topics),
        prop_oneof![Just("bad id".to_string()), Just("m".repeat(129))].prop_map(Bad::MemberId),
    ]
}

fn duration(seconds: i64, nanos: i32) -> Option<prost_types::Duration> {
    Some(prost_types::Duration { seconds, nanos })
}

/// Sends the request `bad` describes to the service, in a task of its own: the status it
/// answered with (`Ok` is a status too: the refusal that was missing).
async fn send(rig: &Rig, bad: Bad) -> Result<(), tonic::Status> {
    let service = rig.service.clone();
    let lease_id = rig.lease_id.clone();
    let acquire = || v1::AcquireRequest {
        group: "fuzz-other".into(),
        topic: DEMO_TOPIC.into(),
        partition: Some(1),
        ..Default::default()
    };
    let subscribe = || v1::SubscribeRequest {
        group: "fuzz-members".into(),
        topics: vec![DEMO_TOPIC.into()],
        ..Default::default()
    };
    let task = tokio::spawn(async move {
        match bad {
            Bad::Name(field, value) => {
                let mut req = acquire();
                if field == "group" {
                    req.group = value;
                } else {
                    req.topic = value;
                }
                service.acquire(Request::new(req)).await.map(drop)
            }
            Bad::Partition(p) => {
                let req = v1::AcquireRequest {
                    partition: Some(p),
                    ..acquire()
                };
                service.acquire(Request::new(req)).await.map(drop)
            }
            Bad::Duration(field, s, n) => {
                let mut req = acquire();
                if field == "ttl" {
                    req.ttl = duration(s, n);
                } else {
                    req.wait = duration(s, n);
                }
                service.acquire(Request::new(req)).await.map(drop)
            }
            Bad::OffsetReset(r) => {
                let req = v1::AcquireRequest {
                    offset_reset: r,
                    ..acquire()
                };
                service.acquire(Request::new(req)).await.map(drop)
            }
            Bad::LeaseId(id) => service
                .commit(Request::new(v1::CommitRequest {
                    lease_id: id,
                    offset: 1,
                    metadata: None,
                }))
                .await
                .map(drop),
            Bad::ReadLimit(field, v) => {
                let mut req = v1::ReadRequest {
                    lease_id,
                    ..Default::default()
                };
                if field == "max_records" {
                    req.max_records = v;
                } else {
                    req.max_bytes = v;
                }
                service.read(Request::new(req)).await.map(drop)
            }
            Bad::FromOffset(o) => service
                .read(Request::new(v1::ReadRequest {
                    lease_id,
                    from_offset: Some(o),
                    ..Default::default()
                }))
                .await
                .map(drop),
            Bad::SeekOffset(o) => service
                .seek(Request::new(v1::SeekRequest {
                    lease_id,
                    position: Some(v1::seek_request::Position::Offset(o)),
                }))
                .await
                .map(drop),
            Bad::SeekTime(seconds, nanos) => service
                .seek(Request::new(v1::SeekRequest {
                    lease_id,
                    position: Some(v1::seek_request::Position::Timestamp(
                        prost_types::Timestamp { seconds, nanos },
                    )),
                }))
                .await
                .map(drop),
            Bad::CommitOffset(o) => service
                .commit(Request::new(v1::CommitRequest {
                    lease_id,
                    offset: o,
                    metadata: None,
                }))
                .await
                .map(drop),
            Bad::Metadata(len) => service
                .commit(Request::new(v1::CommitRequest {
                    lease_id,
                    offset: 1,
                    metadata: Some("m".repeat(len)),
                }))
                .await
                .map(drop),
            Bad::ReleaseOffset(o) => service
                .release(Request::new(v1::ReleaseRequest {
                    lease_id,
                    commit_offset: Some(o),
                }))
                .await
                .map(drop),
            Bad::Topics(topics) => service
                .subscribe(Request::new(v1::SubscribeRequest {
                    topics,
                    ..subscribe()
                }))
                .await
                .map(drop),
            Bad::MemberId(member_id) => service
                .subscribe(Request::new(v1::SubscribeRequest {
                    member_id,
                    ..subscribe()
                }))
                .await
                .map(drop),
        }
    });
    task.await
        .expect("the task serving a bad request does not panic")
}

#[test]
fn a_bad_request_is_refused_with_its_field_named_and_changes_nothing() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let rig = runtime.block_on(Rig::new());
    let before = runtime.block_on(rig.state());
    assert_eq!(before.committed, Some(COMMITTED));
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: CASES,
        failure_persistence: None,
        // A case that changed the state leaves the rig changed: no shrinking, so the
        // failure names the request that did it.
        max_shrink_iters: 0,
        ..ProptestConfig::default()
    });
    let refused = std::sync::Mutex::new(std::collections::BTreeMap::<String, usize>::new());
    runner
        .run(&bad(), |bad| {
            let case = format!("{bad:?}");
            let answer = runtime.block_on(async {
                tokio::time::timeout(Duration::from_secs(10), send(&rig, bad.clone())).await
            });
            let answer = answer.map_err(|_| TestCaseError::fail(format!("{case}: no answer")))?;
            let status = match answer {
                Ok(()) => return Err(TestCaseError::fail(format!("{case} was accepted"))),
                Err(status) => status,
            };
            prop_assert!(
                matches!(
                    status.code(),
                    Code::InvalidArgument | Code::OutOfRange | Code::NotFound
                ),
                "{case}: {status:?}"
            );
            prop_assert!(!status.message().is_empty(), "{case}: no message");
            let info = status.get_details_error_info();
            prop_assert!(info.is_some(), "{case}: no ErrorInfo: {status:?}");
            if status.code() == Code::InvalidArgument {
                let info = info.expect("checked");
                prop_assert_eq!(&info.reason, "INVALID_FIELD", "{}", case);
                prop_assert!(info.metadata.contains_key("field"), "{case}: {info:?}");
            }
            let after = runtime.block_on(rig.state());
            prop_assert_eq!(&after, &before, "{} changed the state", case);
            *refused
                .lock()
                .expect("tally")
                .entry(format!("{:?}", status.code()))
                .or_default() += 1;
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{e}"));
    let refused = refused.into_inner().expect("tally");
    println!("{CASES} bad requests refused ({refused:?}); nothing changed");
}
