//! Standby consumers: a thousand Acquires waiting across two gateways for partitions a third
//! gateway holds. Each gateway keeps one Consul watch per topic however many Acquires wait on
//! it, so no waiter fails, Consul sees about the request rate it sees with nobody waiting, the
//! holder keeps committing, and a release hands the partition to one waiter.

mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use kafka_lease_client::{AcquireOptions, Client, Error, Lease};
use kafka_lease_testkit::{unique_name, Relay, Services};
use support::{consul_relay, create_topic, unique_prefix, GatewayProcess};

/// Waiting Acquires on each of the two waiting gateways: together far more than Consul's
/// default limit of 200 connections per client address, which one blocking query per waiter
/// would exceed.
const WAITERS_PER_GATEWAY: usize = 500;
/// Client connections per waiting gateway (a connection carries at most 200 streams).
const CONNECTIONS: usize = 3;
const PARTITIONS: i32 = 4;
/// How long the waiters of the first round wait: long enough for a measuring window after
/// they have all arrived.
const WAIT: Duration = Duration::from_secs(12);
/// When, after the waiters were sent, the measuring window opens, and how long it lasts.
const SETTLE: Duration = Duration::from_secs(3);
const WINDOW: Duration = Duration::from_secs(5);

struct Waiting {
    gateway: GatewayProcess,
    relay: Relay,
    clients: Vec<Client>,
}

impl Waiting {
    async fn start(services: &Services, prefix: &str, name: &str) -> Waiting {
        let (relay, relayed) = consul_relay(services).await;
        let gateway = GatewayProcess::start(
            services,
            prefix,
            &unique_name(name),
            &["--consul", &relayed, "--consul-check", "none"],
        )
        .await;
        let mut clients = Vec::new();
        for _ in 0..CONNECTIONS {
            clients.push(Client::connect(gateway.endpoint()).await.expect("connect"));
        }
        Waiting {
            gateway,
            relay,
            clients,
        }
    }

    fn wait_all(
        &self,
        group: &str,
        topic: &str,
        round: &str,
        wait: Duration,
    ) -> Vec<tokio::task::JoinHandle<kafka_lease_client::Result<Lease>>> {
        (0..WAITERS_PER_GATEWAY)
            .map(|i| {
                let client = self.clients[i % CONNECTIONS].clone();
                // A TTL past the wait, so a granted lease outlives the round.
                let options = AcquireOptions::new(group, topic)
                    .member(format!("standby-{round}-{i}"))
                    .ttl(Duration::from_secs(60))
                    .wait(wait);
                tokio::spawn(async move { client.acquire(options).await })
            })
            .collect()
    }
}

async fn outcomes(
    waiters: Vec<tokio::task::JoinHandle<kafka_lease_client::Result<Lease>>>,
) -> (Vec<Lease>, usize, Vec<String>) {
    let (mut granted, mut busy, mut other) = (Vec::new(), 0, Vec::new());
    for waiter in waiters {
        match waiter.await.expect("join") {
            Ok(lease) => granted.push(lease),
            Err(Error::Busy { .. }) => busy += 1,
            Err(err) => other.push(err.to_string()),
        }
    }
    (granted, busy, other)
}

/// Consul requests both waiting gateways send during `WINDOW`.
async fn requests_in_window(gateways: &[&Waiting]) -> u64 {
    let count = || gateways.iter().map(|w| w.relay.requests()).sum::<u64>();
    let before = count();
    tokio::time::sleep(WINDOW).await;
    count() - before
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_waiters_on_two_gateways_cost_consul_nothing_and_none_fails() {
    let services = kafka_lease_testkit::require_services!();
    let prefix = unique_prefix();
    let a = Waiting::start(&services, &prefix, "gw-wait-a").await;
    let b = Waiting::start(&services, &prefix, "gw-wait-b").await;
    let holding_gateway =
        GatewayProcess::start(&services, &prefix, &unique_name("gw-hold"), &[]).await;
    let topic = create_topic(&services, PARTITIONS).await;
    let group = unique_name("g");
    let holder = holding_gateway.client().await;
    let mut held = Vec::new();
    for partition in 0..PARTITIONS {
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
    // The holder commits all along, and must keep succeeding while the waiters wait.
    let held = Arc::new(held);
    let (stop, commits, failures) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(std::sync::Mutex::new(Vec::<String>::new())),
    );
    let committer = {
        let (held, stop, commits, failures) = (
            held.clone(),
            stop.clone(),
            commits.clone(),
            failures.clone(),
        );
        tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                for lease in held.iter() {
                    match lease.commit(0).await {
                        Ok(()) => commits.fetch_add(1, Ordering::SeqCst),
                        Err(e) => {
                            failures.lock().unwrap().push(e.to_string());
                            0
                        }
                    };
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };

    let idle = requests_in_window(&[&a, &b]).await;
    let commits_before = commits.load(Ordering::SeqCst);
    let waiters: Vec<_> = [&a, &b]
        .iter()
        .flat_map(|w| w.wait_all(&group, &topic, "held", WAIT))
        .collect();
    tokio::time::sleep(SETTLE).await;
    let waiting = requests_in_window(&[&a, &b]).await;
    let (granted, busy, other) = outcomes(waiters).await;
    let commits_during = commits.load(Ordering::SeqCst) - commits_before;
    println!(
        "{} waiters on {PARTITIONS} held partitions: {} granted, {busy} timed out busy, {} \
         failed otherwise. Consul requests from the two waiting gateways in {WINDOW:?}: {idle} \
         idle, {waiting} with everyone waiting. The holder committed {commits_during} times \
         meanwhile.",
        2 * WAITERS_PER_GATEWAY,
        granted.len(),
        other.len()
    );
    assert!(
        other.is_empty(),
        "no waiter fails: {} did, e.g. {:?}",
        other.len(),
        &other[..other.len().min(3)]
    );
    assert_eq!((granted.len(), busy), (0, 2 * WAITERS_PER_GATEWAY));
    assert!(
        waiting <= 2 * idle,
        "Consul requests while {} wait ({waiting}) within twice the idle count ({idle})",
        2 * WAITERS_PER_GATEWAY
    );
    assert!(commits_during > 0, "the holder kept committing");

    // Round 2: one partition is released while they all wait: exactly one waiter gets it,
    // and each gateway tries the lock once (its oldest waiter), not once per waiter.
    let of = |kind: &str| a.relay.requests_of(kind) + b.relay.requests_of(kind);
    let (locks_before, reads_before) = (of("PUT /v1/txn") + of("PUT /v1/kv"), of("GET /v1/kv"));
    let waiters: Vec<_> = [&a, &b]
        .iter()
        .flat_map(|w| w.wait_all(&group, &topic, "release", Duration::from_secs(6)))
        .collect();
    stop.store(true, Ordering::SeqCst);
    committer.await.expect("committer");
    let failed = failures.lock().unwrap().clone();
    assert!(failed.is_empty(), "the holder's commits failed: {failed:?}");
    let Ok(mut held) = Arc::try_unwrap(held) else {
        panic!("the committer is done and holds no lease");
    };
    held.remove(0).release().await.expect("release");
    let (granted, busy, other) = outcomes(waiters).await;
    let (locks, reads) = (
        of("PUT /v1/txn") + of("PUT /v1/kv") - locks_before,
        of("GET /v1/kv") - reads_before,
    );
    println!(
        "one partition released among {} waiters: {} granted, {busy} busy; the waiting \
         gateways sent {locks} lock requests and {reads} topic reads to Consul in that round",
        2 * WAITERS_PER_GATEWAY,
        granted.len()
    );
    assert!(
        locks <= 2,
        "one lock attempt per gateway for one release, not one per waiter: {locks}"
    );
    assert!(
        reads <= 50,
        "Acquires that arrive together share their reads of the topic: {reads} reads"
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
    drop((a.gateway, b.gateway));
}
