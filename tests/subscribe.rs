//! Subscribe end to end: members of one group on two real gateway processes share a topic's
//! partitions through real Consul and real Kafka; joins move only what must move, leaves
//! (a client process killed, a client that goes away, a gateway killed) hand the partitions
//! on, and every record is delivered at least once with members committing what they
//! processed.

#![allow(clippy::unwrap_used)]

mod support;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kafka_lease_client::proto;
use kafka_lease_client::{Client, LeaseFilter};
use kafka_lease_testkit::{unique_name, wait_for, Services};
use proto::subscribe_response::Event;
use support::{consul_keys, create_topic, produce_n, producer, unique_prefix, GatewayProcess};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;

const DEADLINE: Duration = Duration::from_secs(60);

/// Offsets delivered per partition, across every member.
type Delivered = Arc<Mutex<BTreeMap<i32, BTreeSet<i64>>>>;

/// Every commit the gateways accepted: (partition, fencing token, sent, answered).
type Commits = Arc<Mutex<Vec<(i32, u64, Instant, Instant)>>>;

/// The checker of ownership: once a lease's commit was accepted, no commit of an older lease
/// of the same partition (a smaller token) sent after that may be accepted. Returns the
/// number of accepted commits checked.
fn no_two_holders_committed(commits: &Commits) -> usize {
    let commits = commits.lock().unwrap().clone();
    for (p, token, sent, _) in &commits {
        for (q, newer, _, answered) in &commits {
            assert!(
                !(p == q && newer > token && sent > answered),
                "partition {p}: a commit of token {token} was accepted after one of token {newer}"
            );
        }
    }
    commits.len()
}

/// A member run by the test: it commits every batch it processed, and on `revoking` commits
/// again at once so the lease moves without waiting for the grace.
struct TestMember {
    assigned: Arc<AtomicUsize>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Vec<String>>,
}

impl TestMember {
    fn start(
        client: &Client,
        group: &str,
        topic: &str,
        id: &str,
        delivered: Delivered,
        commits: Commits,
    ) -> Self {
        let assigned = Arc::new(AtomicUsize::new(0));
        let (stop, mut stopped) = oneshot::channel::<()>();
        let mut raw = client.raw();
        let request = proto::SubscribeRequest {
            group: group.into(),
            topics: vec![topic.into()],
            member: format!("test {id}"),
            member_id: id.into(),
            max_wait: Some(prost_types::Duration {
                seconds: 0,
                nanos: 10_000_000,
            }),
            ..Default::default()
        };
        let counter = assigned.clone();
        let task = tokio::spawn(async move {
            let mut log = Vec::new();
            let mut stream = raw
                .subscribe(request)
                .await
                .expect("subscribe")
                .into_inner();
            // lease id → (partition, next offset to commit, fencing token)
            let mut leases: HashMap<String, (i32, i64, u64)> = HashMap::new();
            loop {
                let event = tokio::select! {
                    _ = &mut stopped => return log,
                    event = stream.message() => event,
                };
                let event = match event {
                    Ok(Some(response)) => response.event.expect("an event"),
                    Ok(None) => return log,
                    Err(status) => {
                        log.push(format!("ended: {status:?}"));
                        return log;
                    }
                };
                match event {
                    Event::Joined(joined) => log.push(format!("joined {}", joined.member_id)),
                    Event::Deliveries(d) => log.push(format!("deliveries of {}", d.partition)),
                    Event::Assigned(a) => {
                        counter.fetch_add(1, Ordering::SeqCst);
                        log.push(format!("assigned {} at {}", a.partition, a.offset));
                        leases.insert(a.lease_id, (a.partition, a.offset, a.fencing_token));
                    }
                    Event::Records(batch) => {
                        let (partition, next, token) = leases
                            .get_mut(&batch.lease_id)
                            .expect("records of an assigned lease");
                        assert_eq!(*partition, batch.partition);
                        let offsets: Vec<i64> = batch.records.iter().map(|r| r.offset).collect();
                        delivered
                            .lock()
                            .unwrap()
                            .entry(batch.partition)
                            .or_default()
                            .extend(&offsets);
                        *next = offsets.last().expect("never empty") + 1;
                        let sent = Instant::now();
                        let accepted = raw
                            .commit(proto::CommitRequest {
                                lease_id: batch.lease_id.clone(),
                                offset: *next,
                                metadata: None,
                            })
                            .await
                            .is_ok();
                        if accepted {
                            commits.lock().unwrap().push((
                                batch.partition,
                                *token,
                                sent,
                                Instant::now(),
                            ));
                        }
                    }
                    Event::Revoking(r) => {
                        log.push(format!("revoking {}", r.partition));
                        let next = leases.get(&r.lease_id).map(|l| l.1).expect("known lease");
                        let _ = raw
                            .commit(proto::CommitRequest {
                                lease_id: r.lease_id.clone(),
                                offset: next,
                                metadata: None,
                            })
                            .await;
                    }
                    Event::Revoked(r) => {
                        log.push(format!("revoked {} ({})", r.partition, r.reason));
                        leases.remove(&r.lease_id);
                    }
                }
            }
        });
        TestMember {
            assigned,
            stop: Some(stop),
            task,
        }
    }

    fn assigned(&self) -> usize {
        self.assigned.load(Ordering::SeqCst)
    }

    /// The client goes away: its stream is dropped mid-flight.
    async fn leave(mut self) -> Vec<String> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.task.await.expect("member task")
    }
}

/// A member in a process of its own (grpcurl), for a client killed with SIGKILL: it reads
/// and never commits, so what it read is read again by the next holders.
struct ProcessMember {
    child: tokio::process::Child,
    assigned: Arc<AtomicUsize>,
    reader: JoinHandle<()>,
}

impl ProcessMember {
    fn start(services: &Services, addr: &str, group: &str, topic: &str, id: &str) -> Self {
        use tokio::io::AsyncBufReadExt;
        let request = serde_json::json!({
            "group": group,
            "topics": [topic],
            "member": format!("process {id}"),
            "member_id": id,
            "max_wait": "0.010s",
        });
        let mut child = tokio::process::Command::new(services.var("KAFKA_LEASE_GRPCURL_BIN"))
            .args([
                "-plaintext",
                "-d",
                &request.to_string(),
                addr,
                "kafka_lease.v1.PartitionLeaseService/Subscribe",
            ])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("grpcurl");
        let assigned = Arc::new(AtomicUsize::new(0));
        let counter = assigned.clone();
        let mut lines = tokio::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
        let reader = tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                if line.trim_start().starts_with("\"assigned\": {") {
                    counter.fetch_add(1, Ordering::SeqCst);
                }
            }
        });
        ProcessMember {
            child,
            assigned,
            reader,
        }
    }

    /// SIGKILL: the kernel closes its connection; the process says nothing.
    async fn kill(mut self) {
        self.child
            .start_kill()
            .expect("kill -9 the member's process");
        self.child.wait().await.expect("reaped");
        let _ = self.reader.await;
    }
}

/// What [`assigned`] counts.
trait Counted {
    fn assigned(&self) -> usize;
}

impl Counted for TestMember {
    fn assigned(&self) -> usize {
        TestMember::assigned(self)
    }
}

impl Counted for ProcessMember {
    fn assigned(&self) -> usize {
        self.assigned.load(Ordering::SeqCst)
    }
}

/// Waits until ListLeases shows `expected` leases per member id (and nothing else).
async fn settled(client: &Client, group: &str, expected: &BTreeMap<String, usize>) {
    let last = Arc::new(Mutex::new(BTreeMap::new()));
    let seen = last.clone();
    let waited = tokio::time::timeout(
        DEADLINE,
        wait_for("the group to settle", DEADLINE, || {
            let seen = seen.clone();
            async move {
                let leases = client
                    .list_leases(LeaseFilter::new().group(group))
                    .await
                    .ok()?;
                let mut counts: BTreeMap<String, usize> = BTreeMap::new();
                for lease in &leases {
                    let id = lease.member_id.clone().unwrap_or_default();
                    *counts.entry(id).or_default() += 1;
                }
                *seen.lock().unwrap() = counts.clone();
                (counts == *expected).then_some(())
            }
        }),
    )
    .await;
    assert!(
        waited.is_ok(),
        "expected {expected:?}, last seen {:?}",
        last.lock().unwrap()
    );
}

/// Waits until the members have seen `expected` assignments in all (the events trail the
/// locks ListLeases shows); more than expected fails at once.
async fn assigned(members: &[&dyn Counted], expected: &[usize]) {
    let counts = || members.iter().map(|m| m.assigned()).collect::<Vec<_>>();
    let reached = tokio::time::timeout(DEADLINE, async {
        loop {
            let now = counts();
            if now == expected || now.iter().zip(expected).any(|(n, e)| n > e) {
                return now;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert_eq!(
        reached.ok(),
        Some(expected.to_vec()),
        "assignments (now {:?})",
        counts()
    );
}

fn shares(pairs: &[(&str, usize)]) -> BTreeMap<String, usize> {
    pairs.iter().map(|(m, n)| (m.to_string(), *n)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_share_a_topic_move_only_what_must_move_and_lose_no_record() {
    let services = kafka_lease_testkit::require_services!();
    let prefix = unique_prefix();
    let a = GatewayProcess::start(&services, &prefix, &unique_name("gw-a"), &[]).await;
    let b = GatewayProcess::start(&services, &prefix, &unique_name("gw-b"), &[]).await;
    let partitions = 12;
    let topic = create_topic(&services, partitions).await;
    let per_partition = 30;
    let producer = producer(&services);
    for p in 0..partitions {
        produce_n(&producer, &topic, p, per_partition).await;
    }
    let group = unique_name("g");
    let (client_a, client_b) = (a.client().await, b.client().await);
    let delivered: Delivered = Arc::default();
    let commits: Commits = Arc::default();
    // Records keep coming while members join and leave, so leases move with records in
    // flight and commits of both holders around each move.
    let produced: Arc<Mutex<usize>> = Arc::new(Mutex::new(per_partition));
    let producing = {
        let (topic, produced) = (topic.clone(), produced.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(50)).await;
                for p in 0..partitions {
                    produce_n(&producer, &topic, p, 2).await;
                }
                *produced.lock().unwrap() += 2;
            }
        })
    };

    // Joins one at a time: each moves exactly the newcomer's share (the others take
    // nothing new), and shares stay within one of each other.
    let m1 = TestMember::start(
        &client_a,
        &group,
        &topic,
        "m1",
        delivered.clone(),
        commits.clone(),
    );
    settled(&client_a, &group, &shares(&[("m1", 12)])).await;
    assigned(&[&m1], &[12]).await;
    let m2 = TestMember::start(
        &client_a,
        &group,
        &topic,
        "m2",
        delivered.clone(),
        commits.clone(),
    );
    settled(&client_b, &group, &shares(&[("m1", 6), ("m2", 6)])).await;
    assigned(&[&m1, &m2], &[12, 6]).await;
    let m3 = TestMember::start(
        &client_b,
        &group,
        &topic,
        "m3",
        delivered.clone(),
        commits.clone(),
    );
    let three = shares(&[("m1", 4), ("m2", 4), ("m3", 4)]);
    settled(&client_a, &group, &three).await;
    assigned(&[&m1, &m2, &m3], &[12, 6, 4]).await;
    let m4 = ProcessMember::start(&services, &b.addr, &group, &topic, "m4");
    let four = shares(&[("m1", 3), ("m2", 3), ("m3", 3), ("m4", 3)]);
    settled(&client_a, &group, &four).await;
    assigned(&[&m1, &m2, &m3, &m4], &[12, 6, 4, 3]).await;
    // The members and their shares, from either gateway.
    for client in [&client_a, &client_b] {
        let members = client
            .list_members(&group, Some(topic.clone()))
            .await
            .expect("list members");
        let listed: Vec<(String, usize)> = members
            .iter()
            .map(|m| (m.member_id.clone(), m.partitions.len()))
            .collect();
        assert_eq!(
            listed,
            [("m1", 3), ("m2", 3), ("m3", 3), ("m4", 3)].map(|(m, n)| (m.to_string(), n))
        );
        let mut all: Vec<i32> = members.iter().flat_map(|m| m.partitions.clone()).collect();
        all.sort_unstable();
        assert_eq!(
            all,
            (0..partitions).collect::<Vec<_>>(),
            "each partition once"
        );
        assert_eq!(members[2].gateway, b.instance, "m3 is on B");
        // One target per change, read alike from either gateway: four joins, four epochs;
        // settled, each member holds what its target gives it.
        let epoch = members[0].group_epoch;
        assert_eq!(epoch, 4, "the epoch after four joins");
        for m in &members {
            assert_eq!(m.group_epoch, epoch, "{m:?}");
            assert!(!m.awaiting_target, "{m:?}");
            assert_eq!(m.target_partitions, m.partitions, "{m:?}");
        }
    }

    // m4's client process is killed (SIGKILL); m3's gateway is killed. m1 and m2 (on A)
    // take it all. The moves on a leave are the leaver's partitions only: m4's 3 (one each
    // to m1, m2, m3), then m3's 4 (two each to m1 and m2).
    m4.kill().await;
    settled(&client_a, &group, &three).await;
    assigned(&[&m1, &m2, &m3], &[13, 7, 5]).await;
    b.signal("KILL");
    settled(&client_a, &group, &shares(&[("m1", 6), ("m2", 6)])).await;
    assigned(&[&m1, &m2], &[15, 9]).await;

    // Every record of every partition, the ones produced during the moves too, reached
    // some member. (An abort mid-round may leave some partitions 2 records ahead of the
    // count: those are not asked for.)
    producing.abort();
    let _ = producing.await;
    let produced = *produced.lock().unwrap();
    wait_for("every record delivered", DEADLINE, || async {
        let delivered = delivered.lock().unwrap();
        let complete = (0..partitions).all(|p| {
            delivered
                .get(&p)
                .is_some_and(|offsets| (0..produced as i64).all(|o| offsets.contains(&o)))
        });
        complete.then_some(())
    })
    .await;
    let checked = no_two_holders_committed(&commits);
    println!(
        "{produced} records per partition delivered; {checked} accepted commits, no older \
         lease's after a newer one's"
    );
    // Two per partition at least: commits from before and after the moves were checked.
    assert!(checked >= 24, "commits were made and checked: {checked}");
    let log1 = m1.leave().await;
    let log2 = m2.leave().await;
    println!("m1: {log1:?}\nm2: {log2:?}");
    let log3 = m3.leave().await;
    println!("m3: {log3:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_client_goes_away_leaves_and_releases_its_leases() {
    let services = kafka_lease_testkit::require_services!();
    let prefix = unique_prefix();
    let a = GatewayProcess::start(&services, &prefix, &unique_name("gw-a"), &[]).await;
    let topic = create_topic(&services, 3).await;
    let group = unique_name("g");
    let client = a.client().await;
    let member = TestMember::start(
        &client,
        &group,
        &topic,
        "m1",
        Delivered::default(),
        Commits::default(),
    );
    settled(&client, &group, &shares(&[("m1", 3)])).await;
    assigned(&[&member], &[3]).await;
    let log = member.leave().await;
    println!("{log:?}");
    settled(&client, &group, &shares(&[])).await;
}

/// The next event of a member, within the deadline; the stream must stay open.
async fn next_event(
    member: &mut kafka_lease_client::Subscription,
) -> kafka_lease_client::SubscriptionEvent {
    tokio::time::timeout(DEADLINE, member.next_event())
        .await
        .expect("an event in time")
        .expect("open")
        .expect("an event")
}

/// Runs one member through the client crate until it has read `records` records of every
/// one of its partitions, without committing; returns it with the next offset per partition.
async fn read_all(
    client: &Client,
    group: &str,
    topic: &str,
    id: &str,
    partitions: usize,
    records: i64,
) -> (kafka_lease_client::Subscription, BTreeMap<i32, i64>) {
    use kafka_lease_client::{SubscribeOptions, SubscriptionEvent};
    let mut member = client
        .subscribe(
            SubscribeOptions::new(group, [topic])
                .member_id(id)
                .revoke_grace(Duration::from_secs(3))
                .max_wait(Duration::from_millis(10)),
        )
        .await
        .expect("subscribe");
    let mut next: BTreeMap<i32, i64> = BTreeMap::new();
    while next.len() < partitions || next.values().any(|n| *n < records) {
        let event = next_event(&mut member).await;
        if let SubscriptionEvent::Records { partition, batch } = event {
            next.insert(
                partition.partition(),
                batch.next_offset().expect("never empty"),
            );
        }
    }
    (member, next)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_lease_moves_after_the_members_commit_or_at_the_grace_deadline() {
    use kafka_lease_client::{SubscribeOptions, SubscriptionEvent};
    let services = kafka_lease_testkit::require_services!();
    let a = GatewayProcess::start(&services, &unique_prefix(), &unique_name("gw"), &[]).await;
    let topic = create_topic(&services, 2).await;
    let producer = producer(&services);
    for p in 0..2 {
        produce_n(&producer, &topic, p, 10).await;
    }
    let client = a.client().await;
    for commits in [true, false] {
        let group = unique_name("g");
        let (mut first, next) = read_all(&client, &group, &topic, "first", 2, 10).await;
        // A second member joins: the first must give one partition up.
        let mut second = client
            .subscribe(SubscribeOptions::new(&group, [&topic]).member_id("second"))
            .await
            .expect("subscribe");
        let (revoked, revoking_at) = loop {
            let event = next_event(&mut first).await;
            if let SubscriptionEvent::Revoking { partition, .. } = event {
                break (partition, Instant::now());
            }
        };
        if commits {
            revoked
                .commit(next[&revoked.partition()])
                .await
                .expect("a commit within the grace");
        }
        let (offset, assigned_at) = loop {
            let event = next_event(&mut second).await;
            if let SubscriptionEvent::Assigned {
                partition, offset, ..
            } = event
            {
                assert_eq!(partition.partition(), revoked.partition());
                break (offset, Instant::now());
            }
        };
        let took = assigned_at - revoking_at;
        println!("commits: {commits}; moved {took:?} after revoking, at offset {offset}");
        if commits {
            // Moved at once, from where the first member got to: nothing lost, nothing
            // delivered twice.
            assert!(took < Duration::from_secs(2), "moved after {took:?}");
            assert_eq!(offset, 10);
        } else {
            // Moved at the deadline, from the last commit (none): delivered again.
            assert!(took >= Duration::from_millis(2_900), "moved after {took:?}");
            assert_eq!(offset, 0);
        }
        // The first member hears the end of the lease.
        loop {
            let event = next_event(&mut first).await;
            if let SubscriptionEvent::Revoked {
                partition, reason, ..
            } = event
            {
                assert_eq!(partition.partition(), revoked.partition());
                assert_eq!(reason, kafka_lease_client::Reason::LeaseRevoked);
                break;
            }
        }
    }
}

/// A revoked lease whose client was handed nothing since its last commit on it (it committed
/// everything it read, or read nothing) is released at once: no commit to wait for, and the
/// grace (10 s here) does not hold the move (issue 32).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_lease_with_nothing_handed_since_its_last_commit_moves_at_once() {
    use kafka_lease_client::{SubscribeOptions, SubscriptionEvent};
    let services = kafka_lease_testkit::require_services!();
    let a = GatewayProcess::start(&services, &unique_prefix(), &unique_name("gw"), &[]).await;
    let client = a.client().await;
    let producer = producer(&services);
    for records in [10, 0] {
        let topic = create_topic(&services, 2).await;
        for p in 0..2 {
            produce_n(&producer, &topic, p, records).await;
        }
        let group = unique_name("g");
        let options = |id: &str| {
            SubscribeOptions::new(&group, [&topic])
                .member_id(id)
                .revoke_grace(Duration::from_secs(10))
                .max_wait(Duration::from_millis(10))
        };
        let mut first = client.subscribe(options("first")).await.expect("subscribe");
        // Reads every record and commits each batch; holds both partitions.
        let (mut assigned, mut committed) = (0, BTreeMap::<i32, i64>::new());
        while assigned < 2 || committed.values().filter(|&&n| n == records as i64).count() < 2 {
            match next_event(&mut first).await {
                SubscriptionEvent::Assigned {
                    offset, partition, ..
                } => {
                    assigned += 1;
                    committed.insert(partition.partition(), offset);
                }
                SubscriptionEvent::Records { partition, batch } => {
                    let next = batch.next_offset().expect("never empty");
                    partition.commit(next).await.expect("commit");
                    committed.insert(partition.partition(), next);
                }
                _ => {}
            }
        }
        let mut second = client
            .subscribe(options("second"))
            .await
            .expect("subscribe");
        let (revoked, revoking_at) = loop {
            if let SubscriptionEvent::Revoking { partition, .. } = next_event(&mut first).await {
                break (partition, Instant::now());
            }
        };
        // No commit on `revoking`: there is nothing to commit.
        let (offset, took) = loop {
            if let SubscriptionEvent::Assigned {
                partition, offset, ..
            } = next_event(&mut second).await
            {
                assert_eq!(partition.partition(), revoked.partition());
                break (offset, revoking_at.elapsed());
            }
        };
        println!(
            "{records} records read and committed: moved {took:?} after revoking, at {offset}"
        );
        assert_eq!(offset, records as i64, "from the last commit");
        assert!(
            took < Duration::from_secs(2),
            "moved after {took:?}, grace 10 s"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_id_is_one_live_member_on_any_gateway() {
    use kafka_lease_client::{Error, Reason, SubscribeOptions};
    let services = kafka_lease_testkit::require_services!();
    let prefix = unique_prefix();
    let a = GatewayProcess::start(&services, &prefix, &unique_name("gw-a"), &[]).await;
    let b = GatewayProcess::start(&services, &prefix, &unique_name("gw-b"), &[]).await;
    let topic = create_topic(&services, 2).await;
    let group = unique_name("g");
    let (client_a, client_b) = (a.client().await, b.client().await);
    let options = || SubscribeOptions::new(&group, [&topic]).member_id("only-one");
    let first = client_a.subscribe(options()).await.expect("the first");
    for (name, client) in [
        ("the same gateway", &client_a),
        ("the other gateway", &client_b),
    ] {
        match client.subscribe(options()).await {
            Err(err @ Error::Other { .. }) => {
                assert_eq!(err.code(), tonic::Code::AlreadyExists, "{name}: {err:?}");
                assert_eq!(err.reason(), Some(Reason::MemberActive), "{name}: {err:?}");
                assert_eq!(err.metadata("member_id"), Some("only-one"));
            }
            other => panic!("{name}: a second live member with the same id: {other:?}"),
        }
    }
    // Once the first has left, the id is free again, on either gateway.
    drop(first);
    settled(&client_a, &group, &shares(&[])).await;
    let again = wait_for("the id to be free", DEADLINE, || async {
        client_b.subscribe(options()).await.ok()
    })
    .await;
    assert_eq!(again.member_id(), "only-one");
}

/// A member joining and leaving again and again, right after the previous one: the group
/// settles every time. (A view that arrived while one of a member's own acquisitions was in
/// flight once left the member holding one partition beyond its quota for good: the rule now
/// runs again on the newest view after every action of the member.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_coming_and_going_quickly_always_settle() {
    let services = kafka_lease_testkit::require_services!();
    let a = GatewayProcess::start(&services, &unique_prefix(), &unique_name("gw"), &[]).await;
    let topic = create_topic(&services, 12).await;
    let group = unique_name("g");
    let client = a.client().await;
    let (delivered, commits) = (Delivered::default(), Commits::default());
    let old: Vec<TestMember> = (0..3)
        .map(|i| {
            let id = format!("old-{i}");
            TestMember::start(
                &client,
                &group,
                &topic,
                &id,
                delivered.clone(),
                commits.clone(),
            )
        })
        .collect();
    let three = shares(&[("old-0", 4), ("old-1", 4), ("old-2", 4)]);
    settled(&client, &group, &three).await;
    for round in 0..10 {
        let id = format!("new-{round}");
        let newcomer = TestMember::start(
            &client,
            &group,
            &topic,
            &id,
            delivered.clone(),
            commits.clone(),
        );
        let four = shares(&[("old-0", 3), ("old-1", 3), ("old-2", 3), (id.as_str(), 3)]);
        settled(&client, &group, &four).await;
        newcomer.leave().await;
        settled(&client, &group, &three).await;
    }
    for member in old {
        member.leave().await;
    }
}

/// A client that comes back within its member's session grace, through the other gateway
/// (behind a load balancer it may land anywhere): its Subscribe goes to the instance that
/// holds the member, and it gets the same leases back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_comes_back_within_its_grace_keeps_its_leases() {
    use kafka_lease_client::{Error, SubscribeOptions, SubscriptionEvent};
    let services = kafka_lease_testkit::require_services!();
    let prefix = unique_prefix();
    let a = GatewayProcess::start(&services, &prefix, &unique_name("gw-a"), &[]).await;
    let b = GatewayProcess::start(&services, &prefix, &unique_name("gw-b"), &[]).await;
    let topic = create_topic(&services, 4).await;
    let other_topic = create_topic(&services, 1).await;
    let producer = producer(&services);
    for p in 0..4 {
        produce_n(&producer, &topic, p, 10).await;
    }
    let group = unique_name("g");
    let (client_a, client_b) = (a.client().await, b.client().await);
    let options = |topics: &[&String]| {
        SubscribeOptions::new(&group, topics.iter().copied())
            .member_id("steady")
            .session_grace(Duration::from_secs(5))
            .max_wait(Duration::from_millis(10))
    };
    // Until `count` leases were assigned: their lease ids and start offsets, by partition.
    async fn assigned_leases(
        member: &mut kafka_lease_client::Subscription,
        count: usize,
    ) -> BTreeMap<i32, (String, u64, i64)> {
        let mut leases = BTreeMap::new();
        while leases.len() < count {
            if let SubscriptionEvent::Assigned {
                partition, offset, ..
            } = next_event(member).await
            {
                leases.insert(
                    partition.partition(),
                    (
                        partition.lease_id().to_string(),
                        partition.fencing_token(),
                        offset,
                    ),
                );
            }
        }
        leases
    }
    let mut first = client_a
        .subscribe(options(&[&topic]))
        .await
        .expect("subscribe");
    assert_eq!(first.gateway(), a.instance);
    let before = assigned_leases(&mut first, 4).await;
    // Partition 0's records are processed and committed up to 5 before the connection
    // goes.
    let lease0 = client_a
        .raw()
        .commit(kafka_lease_client::proto::CommitRequest {
            lease_id: before[&0].0.clone(),
            offset: 5,
            metadata: None,
        })
        .await;
    assert!(lease0.is_ok(), "{lease0:?}");
    drop(first);
    let left_at = Instant::now();

    // Until A has noticed the stream is gone, the member is live (MEMBER_ACTIVE); then a
    // Subscribe with its id for other topics is refused: it names the member's topics.
    let refused = wait_for("the member to be detached", DEADLINE, || async {
        match client_b.subscribe(options(&[&topic, &other_topic])).await {
            Err(err) if err.reason() == Some(kafka_lease_client::Reason::MemberActive) => None,
            other => Some(other),
        }
    })
    .await;
    match refused {
        Err(err @ Error::InvalidArgument { .. }) => {
            assert!(err.to_string().contains(&topic), "{err}");
        }
        other => panic!("a takeover for other topics: {other:?}"),
    }

    // Back through B within the grace, for the same topics: the member on A, with the same
    // leases (ids and tokens), each from its resume point.
    let mut again = client_b
        .subscribe(options(&[&topic]))
        .await
        .expect("back within the grace, through the other gateway");
    let back_after = left_at.elapsed();
    assert_eq!(again.gateway(), a.instance, "the member stayed on A");
    let after = assigned_leases(&mut again, 4).await;
    for (p, (id, token, offset)) in &after {
        assert_eq!(
            (id, token),
            (&before[p].0, &before[p].1),
            "partition {p} kept"
        );
        assert_eq!(*offset, if *p == 0 { 5 } else { 0 }, "partition {p}");
    }
    // Its records come again, from the resume point.
    loop {
        if let SubscriptionEvent::Records { partition, batch } = next_event(&mut again).await {
            if partition.partition() == 0 {
                assert_eq!(batch.records.first().map(|r| r.offset), Some(5));
                break;
            }
        }
    }
    // The leases are usable through B too (forwarded to A).
    let commit = client_b
        .raw()
        .commit(kafka_lease_client::proto::CommitRequest {
            lease_id: after[&1].0.clone(),
            offset: 3,
            metadata: None,
        })
        .await;
    assert!(commit.is_ok(), "{commit:?}");
    println!("came back through B {back_after:?} after leaving A");
    // Gone for longer than the grace: the member leaves and its leases are released.
    drop(again);
    settled(&client_a, &group, &shares(&[])).await;
    let members = client_b
        .list_members(&group, None)
        .await
        .expect("list members");
    assert!(members.is_empty(), "{members:?}");
    // Nothing of the group stays in Consul: the last member to leave removed its topics'
    // target assignments too.
    let group_keys = format!("{prefix}/{group}/");
    wait_for("the group's keys to go", DEADLINE, || async {
        let keys = consul_keys(&services, &prefix).await;
        (!keys.iter().any(|(k, _, _)| k.starts_with(&group_keys))).then_some(())
    })
    .await;
}

/// One member of two topics holds a share of each; a member of one of them takes half of
/// that one only. The member's partitions are merged fairly: a quiet partition's records
/// come while a busy one still has thousands to go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_of_two_topics_shares_each_and_a_busy_partition_starves_no_other() {
    use kafka_lease_client::{SubscribeOptions, SubscriptionEvent};
    let services = kafka_lease_testkit::require_services!();
    let a = GatewayProcess::start(&services, &unique_prefix(), &unique_name("gw"), &[]).await;
    let (busy, quiet) = (
        create_topic(&services, 2).await,
        create_topic(&services, 3).await,
    );
    let producer = producer(&services);
    // Large enough that the busy partition cannot be drained in the time it takes to produce
    // the quiet records and deliver them (the Read path drains some 300,000 small records a
    // second here): the quiet ones must come while it still has records to go.
    let backlog = 100_000;
    produce_n(&producer, &busy, 0, backlog).await;
    let group = unique_name("g");
    let client = a.client().await;
    let mut both = client
        .subscribe(
            SubscribeOptions::new(&group, [&busy, &quiet])
                .member_id("both")
                .max_records(50)
                .max_wait(Duration::from_millis(10)),
        )
        .await
        .expect("subscribe");
    // All five partitions assigned and the busy one streaming, then records come to the
    // quiet ones: they arrive while the busy partition's backlog is still mostly unread.
    let (mut assigned, mut busy_seen) = (0, 0);
    while assigned < 5 || busy_seen == 0 {
        match next_event(&mut both).await {
            SubscriptionEvent::Assigned { .. } => assigned += 1,
            SubscriptionEvent::Records { batch, .. } => busy_seen += batch.records.len(),
            _ => {}
        }
    }
    let produced_at = Instant::now();
    for p in 0..3 {
        produce_n(&producer, &quiet, p, 5).await;
    }
    let (mut quiet_seen, busy_before) = (0, busy_seen);
    while quiet_seen < 15 {
        if let SubscriptionEvent::Records { partition, batch } = next_event(&mut both).await {
            if partition.topic() == quiet {
                quiet_seen += batch.records.len();
            } else {
                busy_seen += batch.records.len();
            }
        }
    }
    let between = busy_seen - busy_before;
    println!(
        "all 15 quiet records came {:?} after they were produced, after {between} more busy \
         ones ({busy_seen} of {backlog})",
        produced_at.elapsed()
    );
    assert!(
        busy_seen < backlog,
        "the quiet partitions waited for the busy one's backlog ({between} busy records)"
    );

    // A member of the quiet topic only: the quiet topic splits 2 / 1 between the two, the
    // busy one stays whole with the member of both.
    let only = client
        .subscribe(SubscribeOptions::new(&group, [&quiet]).member_id("quiet-only"))
        .await
        .expect("subscribe");
    let split = |members: Vec<kafka_lease_client::proto::MemberInfo>| {
        let mut shares: Vec<(String, usize)> = members
            .into_iter()
            .map(|m| (m.member_id, m.partitions.len()))
            .collect();
        shares.sort();
        shares
    };
    wait_for("the quiet topic to split", DEADLINE, || async {
        let quiet_shares = split(
            client
                .list_members(&group, Some(quiet.clone()))
                .await
                .ok()?,
        );
        let busy_shares = split(client.list_members(&group, Some(busy.clone())).await.ok()?);
        let mut counts: Vec<usize> = quiet_shares.iter().map(|(_, n)| *n).collect();
        counts.sort_unstable();
        let members: Vec<&str> = quiet_shares.iter().map(|(m, _)| m.as_str()).collect();
        (members == ["both", "quiet-only"]
            && counts == [1, 2]
            && busy_shares == [("both".to_string(), 2)])
        .then_some(())
    })
    .await;
    // It leaves: the quiet topic goes back to the member of both.
    drop(only);
    settled(&client, &group, &shares(&[("both", 5)])).await;
}

/// A client whose member's gateway died comes back through another within its grace: while
/// Consul still holds the dead instance's member record the answer is GATEWAY_UNREACHABLE
/// (retry); once the record has gone with the dead instance's session, the member joins
/// anew on the live instance and takes every partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_gateway_died_joins_anew_through_another() {
    use kafka_lease_client::{Reason, SubscribeOptions};
    let services = kafka_lease_testkit::require_services!();
    let prefix = unique_prefix();
    let a = GatewayProcess::start(&services, &prefix, &unique_name("gw-a"), &[]).await;
    let b = GatewayProcess::start(&services, &prefix, &unique_name("gw-b"), &[]).await;
    let topic = create_topic(&services, 3).await;
    let group = unique_name("g");
    let (client_a, client_b) = (a.client().await, b.client().await);
    let options = || {
        SubscribeOptions::new(&group, [&topic])
            .member_id("survivor")
            .session_grace(Duration::from_secs(60))
    };
    let first = client_a.subscribe(options()).await.expect("subscribe");
    settled(&client_b, &group, &shares(&[("survivor", 3)])).await;
    a.signal("KILL");
    let killed_at = Instant::now();
    let mut unreachable = 0;
    let again = loop {
        match client_b.subscribe(options()).await {
            Ok(again) => break again,
            Err(err) if err.reason() == Some(Reason::GatewayUnreachable) => {
                assert_eq!(
                    err.metadata("gateway"),
                    Some(a.instance.as_str()),
                    "{err:?}"
                );
                assert_eq!(err.metadata("member_id"), Some("survivor"), "{err:?}");
                assert!(err.retry_after().is_some(), "{err:?}");
                unreachable += 1;
            }
            // A moment after the kill, Consul may not yet have the session's end while the
            // record's join is refused and the instance's address still resolves.
            Err(err) if err.reason() == Some(Reason::MemberActive) => {}
            Err(err) => panic!("{err:?}"),
        }
        assert!(killed_at.elapsed() < DEADLINE, "still refused");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    println!(
        "joined anew on B {:?} after A was killed ({unreachable} GATEWAY_UNREACHABLE before)",
        killed_at.elapsed()
    );
    assert_eq!(again.gateway(), b.instance);
    settled(&client_b, &group, &shares(&[("survivor", 3)])).await;
    drop(first);
}

/// A seek through a subscription's partition handle: no batch of the old position reaches
/// the member after the seek answered, though some were on their way; and every event's
/// handle carries the lease's fencing token, which only `assigned` sends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seek_through_a_partition_handle_leaks_no_batch_of_the_old_position() {
    use kafka_lease_client::{SeekTo, SubscribeOptions, SubscriptionEvent};
    let services = kafka_lease_testkit::require_services!();
    let a = GatewayProcess::start(&services, &unique_prefix(), &unique_name("gw"), &[]).await;
    let topic = create_topic(&services, 1).await;
    produce_n(&producer(&services), &topic, 0, 500).await;
    let client = a.client().await;
    let mut member = client
        .subscribe(
            SubscribeOptions::new(unique_name("g"), [&topic])
                .max_records(10)
                .max_wait(Duration::from_millis(10)),
        )
        .await
        .expect("subscribe");
    let token = loop {
        if let SubscriptionEvent::Assigned { partition, .. } = next_event(&mut member).await {
            break partition.fencing_token();
        }
    };
    assert!(token > 0);
    let (handle, first) = loop {
        if let SubscriptionEvent::Records { partition, batch } = next_event(&mut member).await {
            break (partition, batch);
        }
    };
    assert_eq!(
        handle.fencing_token(),
        token,
        "a records event's handle has the token"
    );
    assert_eq!(first.records[0].offset, 0);
    // Batches 10.., 20.. are on their way (pumped ahead, in the HTTP/2 window) when the
    // seek back to 0 answers.
    let outcome = handle.seek(SeekTo::Offset(0)).await.expect("seek");
    loop {
        if let SubscriptionEvent::Records { partition, batch } = next_event(&mut member).await {
            assert_eq!(partition.fencing_token(), token);
            assert_eq!(
                (batch.seek_epoch, batch.records[0].offset),
                (outcome.seek_epoch, 0),
                "the first batch after the seek is of its position"
            );
            break;
        }
    }
}

/// A target that Consul fails to write, at once and every time, is written again after a
/// pause, not in a loop (the member plans the topic again as each write comes back); it lands
/// once Consul takes it, and the member then gets its partitions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_consul_fails_to_write_is_written_again_after_a_pause_not_in_a_loop() {
    use kafka_lease_client::{SubscribeOptions, SubscriptionEvent};
    use kafka_lease_testkit::Fault;
    let services = kafka_lease_testkit::require_services!();
    let (relay, relayed) = support::consul_relay(&services).await;
    let gateway = GatewayProcess::start(
        &services,
        &unique_prefix(),
        &unique_name("gw"),
        &["--consul", &relayed, "--consul-check", "none"],
    )
    .await;
    let topic = create_topic(&services, 2).await;
    let group = unique_name("g");
    // Every write of a target is lost on its way to Consul, and the connection closes: a
    // write fails within a round trip.
    relay.fail_every(b"~target", Fault::LoseRequest);
    let client = gateway.client().await;
    let mut member = client
        .subscribe(SubscribeOptions::new(&group, [&topic]).member_id("only"))
        .await
        .expect("subscribe");
    let failing = Duration::from_secs(3);
    let started = Instant::now();
    wait_for(
        "the first write of the target to fail",
        DEADLINE,
        || async { (relay.faults_fired() > 0).then_some(()) },
    )
    .await;
    tokio::time::sleep(failing).await;
    let writes = relay.faults_fired();
    println!(
        "{writes} writes of the target failed in {:?}",
        started.elapsed()
    );
    // One at once, then one a second: 4 in 3 s, give or take the edges.
    assert!(
        (2..=6).contains(&writes),
        "{writes} writes of the target in {:?}: one a second expected",
        started.elapsed()
    );
    relay.stop_failing();
    let mut assigned = BTreeSet::new();
    while assigned.len() < 2 {
        if let SubscriptionEvent::Assigned { partition, .. } = next_event(&mut member).await {
            assigned.insert(partition.partition());
        }
    }
    let members = client
        .list_members(&group, Some(topic.clone()))
        .await
        .expect("list members");
    assert_eq!(members.len(), 1, "{members:?}");
    assert_eq!(members[0].group_epoch, 1, "{members:?}");
    assert_eq!(members[0].target_partitions, vec![0, 1], "{members:?}");
}
