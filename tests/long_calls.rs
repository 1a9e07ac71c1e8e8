//! One gRPC channel carries long calls and short calls together, as gRPC users expect: on one
//! connection, 1,000 leases with a Read open on each plus 500 Acquires waiting for held
//! partitions, and a Commit, a Seek, a Release and a ListLeases on the same connection still
//! answer at once, served by the gateway the connection reaches or forwarded to the one
//! serving the lease. Before `--max-long-calls-per-connection` the connection's 200 streams
//! (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS) filled with long calls and every short call after
//! them queued in the client for as long as they lasted.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

use futures::{StreamExt, TryStreamExt};
use kafka_lease_client::{proto, AcquireOptions, Client, LeaseFilter, SeekTo};
use kafka_lease_testkit::{unique_name, wait_for, Services};
use support::{connections_to, create_topic, scrape_metric, unique_prefix, GatewayProcess};

/// Leases, each with an open Read, on the one connection: 4 groups of a topic of 250
/// partitions (the most one connection may hold, `--max-leases-per-connection`).
const GROUPS: usize = 4;
const PARTITIONS: i32 = 250;
/// Acquires waiting for held partitions on the same connection.
const WAITERS: usize = 500;
/// How long a short call is given: far beyond its usual few milliseconds, far below forever.
const SHORT_CALL: Duration = Duration::from_secs(10);

/// The test's gateways and what they hold, torn down (topic deleted) at the end.
struct Setup {
    services: Services,
    topic: String,
    groups: Vec<String>,
}

impl Setup {
    async fn new(services: Services) -> Setup {
        let topic = create_topic(&services, PARTITIONS).await;
        let groups = (0..GROUPS).map(|_| unique_name("g")).collect();
        Setup {
            services,
            topic,
            groups,
        }
    }

    async fn finish(self) {
        let _ = kafka_lease_testkit::delete_topics(&self.services.kafka_bootstrap, &[&self.topic])
            .await;
    }

    fn keys(&self) -> impl Iterator<Item = (String, i32)> + '_ {
        self.groups
            .iter()
            .flat_map(|g| (0..PARTITIONS).map(move |p| (g.clone(), p)))
    }
}

/// Times one call, which must answer within [`SHORT_CALL`].
async fn timed<T, E: std::fmt::Debug>(
    what: &str,
    call: impl std::future::Future<Output = Result<T, E>>,
) -> (T, Duration) {
    let started = Instant::now();
    match tokio::time::timeout(SHORT_CALL, call).await {
        Ok(Ok(value)) => (value, started.elapsed()),
        Ok(Err(e)) => panic!("{what} failed: {e:?}"),
        Err(_) => {
            panic!("{what} did not answer within {SHORT_CALL:?} on a connection full of long calls")
        }
    }
}

/// The short calls on one lease (by id, through `client`'s raw stub, so that it works for a
/// lease another instance serves too) and a ListLeases, each timed.
async fn short_calls(client: &Client, lease_id: &str, group: &str) -> [Duration; 3] {
    let mut raw = client.raw();
    let (_, commit) = timed(
        "Commit",
        raw.commit(proto::CommitRequest {
            lease_id: lease_id.to_string(),
            offset: 0,
            ..Default::default()
        }),
    )
    .await;
    let (_, seek) = timed(
        "Seek",
        raw.seek(proto::SeekRequest {
            lease_id: lease_id.to_string(),
            position: Some(SeekTo::Earliest.into()),
        }),
    )
    .await;
    let (listed, list) = timed(
        "ListLeases",
        client.list_leases(LeaseFilter::new().group(group)),
    )
    .await;
    assert!(!listed.is_empty(), "the group's leases are listed");
    [commit, seek, list]
}

async fn release(client: &Client, lease_id: &str) -> Duration {
    timed(
        "Release",
        client.raw().release(proto::ReleaseRequest {
            lease_id: lease_id.to_string(),
            ..Default::default()
        }),
    )
    .await
    .1
}

/// Acquires a lease on each key through `acquirer`, 16 at a time; returns their groups and
/// ids in the order of [`Setup::keys`] (the waiters take the first [`WAITERS`] keys).
async fn acquire_all(acquirer: &Client, setup: &Setup) -> Vec<(String, String)> {
    let started = Instant::now();
    let mut ids: Vec<(usize, String, String)> = futures::stream::iter(setup.keys().enumerate())
        .map(|(i, (group, partition))| {
            let (client, topic) = (acquirer.clone(), setup.topic.clone());
            async move {
                let lease = client
                    .acquire(
                        AcquireOptions::new(&group, &topic)
                            .partition(partition)
                            .ttl(Duration::from_secs(60)),
                    )
                    .await
                    .map_err(|e| format!("{group}/{partition}: {e}"))?;
                Ok::<_, String>((i, group, lease.lease_id().to_string()))
            }
        })
        .buffer_unordered(16)
        .try_collect()
        .await
        .unwrap_or_else(|e| panic!("acquire: {e}"));
    ids.sort();
    println!("{} leases acquired in {:?}", ids.len(), started.elapsed());
    ids.into_iter().map(|(_, group, id)| (group, id)).collect()
}

/// Opens a Read on each lease through `reader`, 32 at a time, and keeps each open in a task
/// of its own. Each Read must start within [`SHORT_CALL`]. The counter counts Reads ended.
async fn read_all(
    reader: &Client,
    ids: &[(String, String)],
) -> (Vec<tokio::task::JoinHandle<()>>, Arc<AtomicUsize>) {
    let ended = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let tasks = futures::stream::iter(ids.iter().cloned())
        .map(|(_, lease_id)| {
            let (client, ended) = (reader.clone(), ended.clone());
            async move {
                let mut stream = tokio::time::timeout(
                    SHORT_CALL,
                    client.raw().read(proto::ReadRequest {
                        lease_id: lease_id.clone(),
                        ..Default::default()
                    }),
                )
                .await
                .map_err(|_| format!("the Read of {lease_id} did not start in {SHORT_CALL:?}"))?
                .map_err(|e| format!("the Read of {lease_id}: {e}"))?
                .into_inner();
                Ok::<_, String>(tokio::spawn(async move {
                    while let Some(Ok(_)) = stream.next().await {}
                    ended.fetch_add(1, Ordering::SeqCst);
                }))
            }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<_>>()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    println!("{} Reads open in {:?}", tasks.len(), started.elapsed());
    (tasks, ended)
}

/// Starts [`WAITERS`] Acquires through `client` on partitions `ids` holds, each waiting up
/// to 2 minutes; waits until `gateway` counts them all as waiting.
async fn wait_all(
    client: &Client,
    setup: &Setup,
    metrics: &str,
) -> Vec<tokio::task::JoinHandle<Result<(), String>>> {
    let started = Instant::now();
    let waiters: Vec<_> = setup
        .keys()
        .take(WAITERS)
        .map(|(group, partition)| {
            let (client, topic) = (client.clone(), setup.topic.clone());
            tokio::spawn(async move {
                match client
                    .acquire(
                        AcquireOptions::new(&group, &topic)
                            .partition(partition)
                            .wait(Duration::from_secs(120))
                            .retries(0),
                    )
                    .await
                {
                    Ok(_) => Err(format!("{group}/{partition} was granted while held")),
                    Err(e) => Err(format!("{group}/{partition}: {e}")),
                }
            })
        })
        .collect();
    let waiting = wait_for(
        "every Acquire to wait at the gateway",
        Duration::from_secs(60),
        || async {
            let n = scrape_metric(metrics, "kafka_lease_acquires_waiting").await;
            (n >= WAITERS as f64).then_some(n)
        },
    )
    .await;
    println!("{waiting} Acquires waiting after {:?}", started.elapsed());
    waiters
}

/// Checks that, of the long calls, only the released lease's Read ended and every waiting
/// Acquire still waits; then ends them all.
async fn end_checked(
    reads: &[tokio::task::JoinHandle<()>],
    reads_ended: &AtomicUsize,
    waiters: &[tokio::task::JoinHandle<Result<(), String>>],
) {
    // Release's answer and the end of the lease's Read are two streams: nothing orders their
    // arrival at the client (a forwarded Read's end crosses the peer connection after the
    // serving instance ends it), so the end is awaited, within a short call's time.
    let started = Instant::now();
    wait_for("the released lease's Read to end", SHORT_CALL, || async {
        (reads_ended.load(Ordering::SeqCst) > 0).then_some(())
    })
    .await;
    println!(
        "the released lease's Read ended {:?} after Release answered",
        started.elapsed()
    );
    assert_eq!(
        reads_ended.load(Ordering::SeqCst),
        1,
        "only the released lease's Read ended"
    );
    assert!(
        waiters.iter().all(|w| !w.is_finished()),
        "every waiting Acquire still waits"
    );
    for task in waiters {
        task.abort();
    }
    for task in reads {
        task.abort();
    }
}

/// RSS of a process, from /proc.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

fn report(label: &str, idle: [Duration; 3], full: [Duration; 3], release: [Duration; 2]) {
    let ms = |d: Duration| format!("{:.1} ms", d.as_secs_f64() * 1000.0);
    println!(
        "{label}: Commit {} -> {}, Seek {} -> {}, ListLeases {} -> {}, Release {} -> {} \
         (idle connection -> connection with {} Reads and {WAITERS} waiting Acquires)",
        ms(idle[0]),
        ms(full[0]),
        ms(idle[1]),
        ms(full[1]),
        ms(idle[2]),
        ms(full[2]),
        ms(release[0]),
        ms(release[1]),
        GROUPS * PARTITIONS as usize,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_connection_carries_its_long_calls_and_short_calls_answer_at_once() {
    let services = kafka_lease_testkit::require_services!();
    let gateway = GatewayProcess::start(
        &services,
        &unique_prefix(),
        &unique_name("gw-long"),
        &["--metrics-listen", "127.0.0.1:0"],
    )
    .await;
    let metrics = gateway.metrics_endpoint();
    let setup = Setup::new(services).await;
    // The one connection every call of this test takes.
    let client = gateway.client().await;

    let ids = acquire_all(&client, &setup).await;
    // The last two leases are of a group nobody waits in: one released on the idle
    // connection, one (with a Read open) the short calls' target.
    let (_, released_idle) = ids[ids.len() - 1].clone();
    let (probe_group, probe) = ids[ids.len() - 2].clone();
    let idle = short_calls(&client, &probe, &probe_group).await;
    let release_idle = release(&client, &released_idle).await;

    let rss_before = rss_kib(gateway.pid());
    let (reads, reads_ended) = read_all(&client, &ids[..ids.len() - 1]).await;
    let rss_reads = rss_kib(gateway.pid());
    let waiters = wait_all(&client, &setup, &metrics).await;
    let rss_waiters = rss_kib(gateway.pid());
    println!(
        "gateway RSS: {rss_before} KiB before the Reads, +{} KiB with {} Reads open, +{} KiB \
         with {WAITERS} Acquires waiting besides",
        rss_reads.saturating_sub(rss_before),
        reads.len(),
        rss_waiters.saturating_sub(rss_reads),
    );
    // The stated bound (docs/OPERATIONS.md, "One channel for everything"): well above what one open call
    // costs (about 6 KiB per Read, 18 KiB per waiting Acquire), far below a leak per stream.
    assert!(
        rss_reads.saturating_sub(rss_before) < reads.len() as u64 * 32,
        "an open Read costs under 32 KiB"
    );
    assert!(
        rss_waiters.saturating_sub(rss_reads) < WAITERS as u64 * 64,
        "a waiting Acquire costs under 64 KiB"
    );

    let full = short_calls(&client, &probe, &probe_group).await;
    let release_full = release(&client, &probe).await;
    report("one gateway", idle, full, [release_idle, release_full]);
    end_checked(&reads, &reads_ended, &waiters).await;
    setup.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forwarding_gateway_carries_them_over_its_peer_connections() {
    let services = kafka_lease_testkit::require_services!();
    let prefix = unique_prefix();
    let serving = GatewayProcess::start(&services, &prefix, &unique_name("gw-serving"), &[]).await;
    let forwarding = GatewayProcess::start(
        &services,
        &prefix,
        &unique_name("gw-forwarding"),
        &["--metrics-listen", "127.0.0.1:0"],
    )
    .await;
    let metrics = forwarding.metrics_endpoint();
    let setup = Setup::new(services).await;

    // The leases are served by one instance; every other call goes through the other, on
    // one connection, which forwards the calls on leases to the serving instance.
    let ids = acquire_all(&serving.client().await, &setup).await;
    let client = forwarding.client().await;
    let (_, released_idle) = ids[ids.len() - 1].clone();
    let (probe_group, probe) = ids[ids.len() - 2].clone();
    let idle = short_calls(&client, &probe, &probe_group).await;
    let release_idle = release(&client, &released_idle).await;

    let (reads, reads_ended) = read_all(&client, &ids[..ids.len() - 1]).await;
    let waiters = wait_all(&client, &setup, &metrics).await;
    let full = short_calls(&client, &probe, &probe_group).await;
    let release_full = release(&client, &probe).await;
    report("forwarded", idle, full, [release_idle, release_full]);
    end_checked(&reads, &reads_ended, &waiters).await;
    setup.finish().await;
}

/// A burst of every Acquire at once (as a client with a thread or a task per lease sends
/// them): the gateway's connections to Consul stay bounded, so Consul's limit of
/// connections per client address (`http_max_conns_per_client`, 200 by default) is never
/// reached, and the gateway's own session renewals and check passes, which go on their own
/// connection, never queue behind the burst: no lease is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_acquires_keeps_the_gateways_consul_connections_bounded() {
    let services = kafka_lease_testkit::require_services!();
    let gateway =
        GatewayProcess::start(&services, &unique_prefix(), &unique_name("gw-burst"), &[]).await;
    let consul_port: u16 = services
        .consul_http_addr
        .trim_end_matches('/')
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("consul port");
    let setup = Setup::new(services).await;
    let client = gateway.client().await;
    let pid = gateway.pid();
    let sampling = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let sampler = {
        let sampling = sampling.clone();
        tokio::spawn(async move {
            let mut peak = 0;
            while sampling.load(std::sync::atomic::Ordering::SeqCst) {
                peak = peak.max(connections_to(pid, consul_port));
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            peak
        })
    };
    let started = Instant::now();
    let acquired: Vec<Result<String, String>> =
        futures::future::join_all(setup.keys().map(|(group, partition)| {
            let (client, topic) = (client.clone(), setup.topic.clone());
            async move {
                client
                    .acquire(
                        AcquireOptions::new(&group, &topic)
                            .partition(partition)
                            .ttl(Duration::from_secs(60)),
                    )
                    .await
                    .map(|lease| lease.lease_id().to_string())
                    .map_err(|e| format!("{group}/{partition}: {e}"))
            }
        }))
        .await;
    // And a burst of Acquires that wait for the held partitions.
    let waiting: Vec<_> = setup
        .keys()
        .take(WAITERS)
        .map(|(group, partition)| {
            let (client, topic) = (client.clone(), setup.topic.clone());
            tokio::spawn(async move {
                let _ = client
                    .acquire(
                        AcquireOptions::new(&group, &topic)
                            .partition(partition)
                            .wait(Duration::from_secs(20))
                            .retries(0),
                    )
                    .await;
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(3)).await;
    sampling.store(false, std::sync::atomic::Ordering::SeqCst);
    let peak = sampler.await.expect("sampler");
    for waiter in &waiting {
        waiter.abort();
    }
    let failed: Vec<&String> = acquired.iter().filter_map(|r| r.as_ref().err()).collect();
    println!(
        "{} Acquires at once in {:?}: {} failed; at most {peak} connections to Consul",
        acquired.len(),
        started.elapsed(),
        failed.len()
    );
    assert!(
        failed.is_empty(),
        "every Acquire succeeds: {:?}",
        &failed[..failed.len().min(5)]
    );
    // 32 requests in flight at most, one blocking query per watched topic (4 here) and the
    // session's own connection; a finished request's connection goes back to the pool a
    // moment after its turn passes to the next request, which may open another meanwhile,
    // so the count can pass the turns for a moment. The bound that matters is Consul's 200.
    assert!(
        peak < 100,
        "the gateway's connections to Consul stay well under Consul's limit of 200 per \
         client address: {peak} at the peak"
    );
    let log = gateway.log();
    assert!(
        !log.contains("self-fenced") && !log.contains("session invalidated"),
        "the gateway kept its session through the burst"
    );
    setup.finish().await;
}
