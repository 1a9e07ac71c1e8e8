//! End to end across two real gateway processes sharing one Consul: exclusivity under a
//! race, waiting for a partition, calls that reach the other instance, ListLeases, bad input
//! that must change nothing, grpcurl against reflection, and health.

mod support;

use kafka_lease_testkit::scenarios;

use std::collections::BTreeMap;
use std::time::Duration;
use tokio::time::Instant;

use kafka_lease_client::proto;
use kafka_lease_client::{AcquireOptions, Error, LeaseFilter};
use kafka_lease_testkit::unique_name;
use support::{
    consul_keys, create_topic, produce_n, producer, unique_prefix, wait_health, GatewayProcess,
};
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;

const DEADLINE: Duration = Duration::from_secs(30);

#[tokio::test]
async fn two_gateways_never_grant_one_partition_twice() {
    let services = kafka_lease_testkit::require_services!();
    let prefix = unique_prefix();
    let a = GatewayProcess::start(&services, &prefix, &unique_name("gw-a"), &[]).await;
    let b = GatewayProcess::start(&services, &prefix, &unique_name("gw-b"), &[]).await;
    let partitions = 4;
    let topic = create_topic(&services, partitions).await;
    let group = unique_name("g");
    let (client_a, client_b) = (a.client().await, b.client().await);

    // Twice as many clients as partitions race, alternating between the gateways.
    let attempts = (0..partitions * 2).map(|i| {
        let client = if i % 2 == 0 {
            client_a.clone()
        } else {
            client_b.clone()
        };
        let options = AcquireOptions::new(&group, &topic).member(format!("member-{i}"));
        async move { (i, client.acquire(options).await) }
    });
    let results = futures::future::join_all(attempts).await;
    let mut holders: BTreeMap<i32, Vec<usize>> = BTreeMap::new();
    let mut leases = Vec::new();
    let mut refused = 0;
    for (i, result) in results {
        match result {
            Ok(lease) => {
                holders
                    .entry(lease.partition())
                    .or_default()
                    .push(i as usize);
                leases.push(lease);
            }
            Err(Error::Busy { message, .. }) => {
                assert!(message.contains("member-"), "names the holder: {message}");
                refused += 1;
            }
            Err(other) => panic!("unexpected: {other:?}"),
        }
    }
    assert_eq!(
        holders.len(),
        partitions as usize,
        "every partition leased: {holders:?}"
    );
    assert!(
        holders.values().all(|h| h.len() == 1),
        "each partition exactly once: {holders:?}"
    );
    assert_eq!(refused, partitions as usize);

    // Both gateways list the same leases, from Consul.
    let listed_a = client_a
        .list_leases(LeaseFilter::new().group(&group))
        .await
        .expect("list");
    let listed_b = client_b
        .list_leases(LeaseFilter::new().group(&group))
        .await
        .expect("list");
    assert_eq!(listed_a.len(), 4);
    let key = |l: &kafka_lease_client::LeaseInfo| {
        (
            l.partition,
            l.fencing_token,
            l.member.clone(),
            l.gateway.clone(),
        )
    };
    assert_eq!(
        listed_a.iter().map(key).collect::<Vec<_>>(),
        listed_b.iter().map(key).collect::<Vec<_>>()
    );
    for info in listed_a.iter().chain(&listed_b) {
        // Live details from whichever gateway serves the lease, through either.
        assert!(
            info.position.is_some() && info.expires_at.is_some(),
            "{info:?}"
        );
        assert_eq!(info.details_unavailable, None, "{info:?}");
    }

    // Who won the race is up to the race; from here on, gateway A holds partitions 0 and 1.
    let holders_before: Vec<(i32, u64)> = leases
        .iter()
        .map(|l| (l.partition(), l.fencing_token()))
        .collect();
    for lease in leases.drain(..) {
        lease.release().await.expect("release");
    }
    for partition in [0, 1] {
        let lease = client_a
            .acquire(
                AcquireOptions::new(&group, &topic)
                    .partition(partition)
                    .member("on-a"),
            )
            .await
            .expect("acquire on A");
        let before = holders_before
            .iter()
            .find(|(p, _)| *p == partition)
            .map(|(_, t)| *t);
        assert!(
            Some(lease.fencing_token()) > before,
            "tokens grow across holders and gateways"
        );
        leases.push(lease);
    }

    // A client waiting on gateway B gets a partition held via gateway A right after release.
    let lease = leases.remove(0);
    let partition = lease.partition();
    let waiter = {
        let client_b = client_b.clone();
        let options = AcquireOptions::new(&group, &topic)
            .partition(partition)
            .member("waiter")
            .wait(Duration::from_secs(20));
        tokio::spawn(async move { (client_b.acquire(options).await, Instant::now()) })
    };
    // The waiter must be blocked on the held partition before the release, or the test
    // would prove nothing: the lease is still listed as held by its first member.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiter.is_finished(),
        "the waiter waits while the partition is held"
    );
    let released_at = Instant::now();
    lease.release().await.expect("release");
    let (granted, granted_at) = waiter.await.expect("join");
    let granted = granted.expect("the waiter gets the partition");
    assert_eq!(granted.partition(), partition);
    println!(
        "handoff across gateways: {:?} from Release to the waiter's Acquire",
        granted_at - released_at
    );
    assert!(
        granted_at - released_at < Duration::from_secs(5),
        "handed off promptly"
    );

    // A lease served by A, named on B: forwarded to A (tests/forwarding.rs has the rest).
    let on_a = leases
        .iter()
        .find(|l| l.gateway() == a.instance)
        .expect("A holds another");
    let mut raw_b = client_b.raw();
    raw_b
        .commit(proto::CommitRequest {
            lease_id: on_a.lease_id().to_string(),
            offset: 0,
            metadata: None,
        })
        .await
        .expect("a commit through B of a lease A serves");
    // A lease id nobody knows: NOT_FOUND.
    let status = raw_b
        .commit(proto::CommitRequest {
            lease_id: "0123456789abcdef.00".into(),
            offset: 0,
            metadata: None,
        })
        .await
        .expect_err("unknown");
    assert_eq!(status.code(), Code::NotFound);

    for lease in leases {
        lease.release().await.expect("release");
    }
    granted.release().await.expect("release");
    assert!(
        consul_keys(&services, &prefix).await.is_empty(),
        "every key released"
    );
}

/// An Acquire without a partition prefers one with records for its group to read: a group
/// that read partition 1 to its end and never read partition 0 is given 0, every time (the
/// empty partition 2 never); once nothing is left to read anywhere, the pick spreads over
/// every partition as before.
#[tokio::test]
async fn an_acquire_without_a_partition_prefers_one_with_records_to_read() {
    let services = kafka_lease_testkit::require_services!();
    let prefix = unique_prefix();
    let gateway = GatewayProcess::start(&services, &prefix, &unique_name("gw"), &[]).await;
    let topic = create_topic(&services, 3).await;
    let producer = producer(&services);
    produce_n(&producer, &topic, 0, 5).await;
    produce_n(&producer, &topic, 1, 5).await;
    let group = unique_name("g");
    let client = gateway.client().await;
    let read_to_the_end = |partition: i32| {
        let client = client.clone();
        let (group, topic) = (group.clone(), topic.clone());
        async move {
            let lease = client
                .acquire(AcquireOptions::new(&group, &topic).partition(partition))
                .await
                .expect("acquire");
            let end = lease.high_watermark();
            lease
                .release_with_commit(end)
                .await
                .expect("release, committing the end");
        }
    };
    read_to_the_end(1).await;
    for round in 0..12 {
        let lease = client
            .acquire(AcquireOptions::new(&group, &topic))
            .await
            .expect("acquire any");
        assert_eq!(
            lease.partition(),
            0,
            "round {round}: partition 0 alone has records for the group to read"
        );
        lease.release().await.expect("release");
    }
    read_to_the_end(0).await;
    let mut picked = std::collections::BTreeSet::new();
    for _ in 0..30 {
        let lease = client
            .acquire(AcquireOptions::new(&group, &topic))
            .await
            .expect("acquire any");
        picked.insert(lease.partition());
        lease.release().await.expect("release");
    }
    assert_eq!(
        picked.into_iter().collect::<Vec<_>>(),
        [0, 1, 2],
        "with nothing to read anywhere, the pick spreads"
    );
}

#[tokio::test]
async fn bad_requests_get_their_documented_code_and_change_nothing() {
    let services = kafka_lease_testkit::require_services!();
    let prefix = unique_prefix();
    let gateway = GatewayProcess::start(&services, &prefix, &unique_name("gw"), &[]).await;
    let topic = create_topic(&services, 2).await;
    produce_n(&producer(&services), &topic, 0, 5).await;
    let group = unique_name("g");
    let client = gateway.client().await;
    scenarios::bad_requests_get_their_documented_code_and_change_nothing(
        &client,
        &group,
        &topic,
        || consul_keys(&services, &prefix),
        |group, topic| {
            let services = &services;
            async move { support::kafka_committed(services, &group, &topic, 0).is_some() }
        },
    )
    .await;
}

#[tokio::test]
async fn grpcurl_lists_describes_and_acquires_through_reflection() {
    let services = kafka_lease_testkit::require_services!();
    let gateway = GatewayProcess::start(&services, &unique_prefix(), &unique_name("gw"), &[]).await;
    let topic = create_topic(&services, 3).await;
    let grpcurl = services.var("KAFKA_LEASE_GRPCURL_BIN").to_string();
    let run = |args: Vec<String>| {
        let out = std::process::Command::new(&grpcurl)
            .args(&args)
            .output()
            .expect("run grpcurl");
        assert!(
            out.status.success(),
            "grpcurl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let addr = gateway.addr.clone();
    let list = run(vec!["-plaintext".into(), addr.clone(), "list".into()]);
    for service in [
        "kafka_lease.v1.PartitionLeaseService",
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
    ] {
        assert!(list.contains(service), "{list}");
    }
    let describe = run(vec![
        "-plaintext".into(),
        addr.clone(),
        "describe".into(),
        "kafka_lease.v1.PartitionLeaseService".into(),
    ]);
    for rpc in ["Acquire", "Read", "Seek", "Commit", "Release", "ListLeases"] {
        assert!(describe.contains(&format!("rpc {rpc}")), "{describe}");
    }
    let body =
        format!(r#"{{"group":"grpcurl-group","topic":"{topic}","member":"grpcurl","ttl":"5s"}}"#);
    let acquired = run(vec![
        "-plaintext".into(),
        "-d".into(),
        body,
        addr.clone(),
        "kafka_lease.v1.PartitionLeaseService/Acquire".into(),
    ]);
    let json: serde_json::Value = serde_json::from_str(&acquired).expect("JSON");
    let lease_id = json["leaseId"].as_str().expect("leaseId");
    assert!(
        json["fencingToken"]
            .as_str()
            .is_some_and(|t| t.parse::<u64>().is_ok()),
        "{json}"
    );
    run(vec![
        "-plaintext".into(),
        "-d".into(),
        format!(r#"{{"lease_id":"{lease_id}"}}"#),
        addr.clone(),
        "kafka_lease.v1.PartitionLeaseService/Release".into(),
    ]);
    let health = run(vec![
        "-plaintext".into(),
        addr,
        "grpc.health.v1.Health/Check".into(),
    ]);
    assert!(health.contains("SERVING"), "{health}");
}

#[tokio::test]
async fn health_is_serving_with_both_services_up() {
    let services = kafka_lease_testkit::require_services!();
    let gateway = GatewayProcess::start(&services, &unique_prefix(), &unique_name("gw"), &[]).await;
    let health = gateway.health().await;
    for service in ["", "kafka_lease.v1.PartitionLeaseService"] {
        let status = wait_health(&health, service, ServingStatus::Serving, DEADLINE).await;
        assert_eq!(status, 1);
    }
}

#[tokio::test]
async fn list_leases_pages_in_key_order() {
    let services = kafka_lease_testkit::require_services!();
    let gateway = GatewayProcess::start(&services, &unique_prefix(), &unique_name("gw"), &[]).await;
    let client = gateway.client().await;
    let topic = create_topic(&services, 12).await;
    let group = unique_name("g");
    let mut leases = Vec::new();
    for partition in [11, 2, 10, 0, 1] {
        leases.push(
            client
                .acquire(AcquireOptions::new(&group, &topic).partition(partition))
                .await
                .expect("acquire"),
        );
    }
    let mut raw = client.raw();
    let mut pages = Vec::new();
    let mut token = String::new();
    loop {
        let page = raw
            .list_leases(proto::ListLeasesRequest {
                group: Some(group.clone()),
                page_size: 2,
                page_token: token,
                ..Default::default()
            })
            .await
            .expect("a page")
            .into_inner();
        pages.push(page.leases.iter().map(|l| l.partition).collect::<Vec<_>>());
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert_eq!(pages, [vec![0, 1], vec![2, 10], vec![11]]);
    // The client crate walks the pages itself.
    let all = client
        .list_leases(LeaseFilter::new().group(&group).page_size(2))
        .await
        .expect("list");
    assert_eq!(
        all.iter().map(|l| l.partition).collect::<Vec<_>>(),
        [0, 1, 2, 10, 11]
    );
    for (size, token) in [(5_001, ""), (0, "not/a-token")] {
        let err = raw
            .list_leases(proto::ListLeasesRequest {
                page_size: size,
                page_token: token.to_string(),
                ..Default::default()
            })
            .await
            .expect_err("refused");
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    }
    for lease in leases {
        lease.release().await.expect("release");
    }
}

/// A gateway that cannot be reached for a moment (a restart, a connection refused) costs an
/// Acquire a retry, not a failure: the client tries again with backoff. Without retries the
/// same moment is an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_retries_while_the_gateway_cannot_be_reached() {
    let services = kafka_lease_testkit::require_services!();
    let gateway = GatewayProcess::start(&services, &unique_prefix(), &unique_name("gw"), &[]).await;
    let topic = create_topic(&services, 1).await;
    // An address where nothing listens yet (a port just freed), reached lazily.
    let addr = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        probe.local_addr().expect("its address")
    };
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .connect_lazy();
    let client = kafka_lease_client::Client::from_channel(channel);
    let refused = client
        .acquire(AcquireOptions::new(unique_name("g"), &topic).retries(0))
        .await
        .expect_err("nothing listens");
    assert!(refused.is_retryable(), "{refused:?}");
    // The gateway becomes reachable there a moment after the Acquire started.
    let target: std::net::SocketAddr = gateway.addr.parse().expect("gateway address");
    let opening = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(250)).await;
        kafka_lease_testkit::relay::Relay::start_at(addr, target)
            .await
            .expect("relay at the address")
    });
    let started = Instant::now();
    let lease = client
        .acquire(AcquireOptions::new(unique_name("g"), &topic))
        .await
        .expect("granted after retries");
    println!("granted {:?} after the Acquire started", started.elapsed());
    assert_eq!(lease.partition(), 0);
    let _relay = opening.await.expect("relay task");
}
