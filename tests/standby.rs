//! Standby consumers: hundreds of Acquires waiting on one gateway for partitions another holds.
//! They share one Consul watch per topic, so they neither exhaust Consul's connections per
//! client (200 by default) nor fail; each release hands the partition to one of them.

mod support;

use std::time::Duration;

use kafka_lease_client::{AcquireOptions, Client, Error};
use kafka_lease_testkit::{unique_name, Services};
use support::{consul_relay, create_topic, unique_prefix, GatewayProcess};

/// Waiting Acquires on the gateway under test: more than Consul's default connection limit
/// per client address, which one blocking query per waiter would exceed.
const WAITERS: usize = 300;
/// Client connections they are spread over (a gateway takes 200 streams per connection).
const CONNECTIONS: usize = 3;
const WAIT: Duration = Duration::from_secs(6);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundreds_of_waiters_share_one_watch_and_none_fails() {
    let Some(services) = Services::require("hundreds_of_waiters_share_one_watch_and_none_fails")
    else {
        return;
    };
    let (relay, relayed) = consul_relay(&services).await;
    let prefix = unique_prefix();
    // The waiters' gateway reaches Consul through the relay, which counts its connections.
    let waiting_gateway = GatewayProcess::start(
        &services,
        &prefix,
        &unique_name("gw-wait"),
        &["--consul", &relayed, "--consul-check", "none"],
    )
    .await;
    let holding_gateway =
        GatewayProcess::start(&services, &prefix, &unique_name("gw-hold"), &[]).await;
    let topic = create_topic(&services, 2).await;
    let group = unique_name("g");
    let holder = holding_gateway.client().await;
    let mut held = Vec::new();
    for partition in 0..2 {
        held.push(
            holder
                .acquire(
                    AcquireOptions::new(&group, &topic)
                        .partition(partition)
                        .ttl(Duration::from_secs(60)),
                )
                .await
                .expect("the holder's lease"),
        );
    }
    let before = relay.accepted();

    let mut clients = Vec::new();
    for _ in 0..CONNECTIONS {
        clients.push(
            Client::connect(waiting_gateway.endpoint())
                .await
                .expect("connect"),
        );
    }
    let wait_all = |round: &'static str| {
        let clients = clients.clone();
        let (group, topic) = (group.clone(), topic.clone());
        (0..WAITERS)
            .map(move |i| {
                let client = clients[i % CONNECTIONS].clone();
                // A TTL past the waiters' wait, so a granted lease outlives the round.
                let options = AcquireOptions::new(&group, &topic)
                    .member(format!("standby-{round}-{i}"))
                    .ttl(Duration::from_secs(60))
                    .wait(WAIT);
                tokio::spawn(async move { client.acquire(options).await })
            })
            .collect::<Vec<_>>()
    };
    let outcomes = |waiters: Vec<tokio::task::JoinHandle<kafka_lease_client::Result<_>>>| async {
        let (mut granted, mut busy, mut other) = (Vec::new(), 0, Vec::new());
        for waiter in waiters {
            match waiter.await.expect("join") {
                Ok(lease) => granted.push(lease),
                Err(Error::Busy { .. }) => busy += 1,
                Err(err) => other.push(err.to_string()),
            }
        }
        (granted, busy, other)
    };

    // Round 1: both partitions stay held by the other gateway for the waiters' whole wait.
    let (granted, busy, other) = outcomes(wait_all("held")).await;
    let connections = relay.accepted() - before;
    println!(
        "{WAITERS} waiters on held partitions: {} granted, {busy} timed out busy, {} failed \
         otherwise; the waiting gateway opened {connections} connections to Consul meanwhile",
        granted.len(),
        other.len()
    );
    assert!(
        other.is_empty(),
        "no waiter fails: {} did, e.g. {:?}",
        other.len(),
        &other[..other.len().min(3)]
    );
    assert_eq!((granted.len(), busy), (0, WAITERS));
    assert!(
        connections < 50,
        "one watch per topic, not one per waiter: {connections} connections to Consul"
    );

    // Round 2: one partition is released while they wait: exactly one waiter gets it.
    let waiters = wait_all("release");
    let mut held = held.into_iter();
    held.next()
        .expect("partition 0")
        .release()
        .await
        .expect("release");
    let (granted, busy, other) = outcomes(waiters).await;
    println!(
        "one partition released among {WAITERS} waiters: {} granted, {busy} busy",
        granted.len()
    );
    assert!(other.is_empty(), "{other:?}");
    assert_eq!(
        granted.len(),
        1,
        "the released partition goes to one waiter"
    );
    for lease in granted.into_iter().chain(held) {
        lease.release().await.expect("release");
    }
}
