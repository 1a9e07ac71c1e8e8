//! The per-connection limits of a real gateway, through gRPC: leases per connection and long
//! calls per connection (each RESOURCE_EXHAUSTED naming the flag and its value; short calls
//! on a connection full of long ones are still answered at once), and the size of a request
//! message.

mod support;

use std::time::Duration;

use kafka_lease_client::{AcquireOptions, Client, Error, LeaseFilter, Reason};
use kafka_lease_testkit::unique_name;
use support::{create_topic, unique_prefix, GatewayProcess};

/// How long a short call on a connection full of long calls may take: it is answered at once.
const QUEUED: Duration = Duration::from_secs(5);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_connection_cannot_take_more_than_its_limits() {
    let services = kafka_lease_testkit::require_services!();
    let gateway = GatewayProcess::start(
        &services,
        &unique_prefix(),
        &unique_name("gw-limits"),
        &[
            "--max-leases-per-connection",
            "1",
            "--max-long-calls-per-connection",
            "2",
            "--metrics-listen",
            "127.0.0.1:0",
        ],
    )
    .await;
    let topic = create_topic(&services, 3).await;
    let group = unique_name("g");
    let connect = || async { Client::connect(gateway.endpoint()).await.expect("connect") };
    let options = |partition: i32| AcquireOptions::new(&group, &topic).partition(partition);

    // Leases per connection: the second Acquire on one connection is refused, with the flag
    // and its value; another connection is not affected.
    let first = connect().await;
    let lease = first.acquire(options(0)).await.expect("the first lease");
    match first.acquire(options(1)).await {
        Err(e @ Error::Busy { .. }) => {
            let details = e.details().expect("details");
            assert_eq!(details.reason(), Some(&Reason::LimitReached), "{e}");
            assert_eq!(
                details.metadata("limit"),
                Some("--max-leases-per-connection")
            );
            assert!(
                e.to_string().contains("--max-leases-per-connection")
                    && e.to_string().contains('1'),
                "names the flag and its value: {e}"
            );
        }
        other => panic!("a second lease on one connection is refused: {other:?}"),
    }
    let other = connect().await;
    let second = other.acquire(options(1)).await.expect("another connection");
    // Once the first lease is gone, its connection may take one again.
    lease.release().await.expect("release");
    let again = first.acquire(options(0)).await.expect("a lease again");

    // Long calls per connection: two Acquires waiting for held partitions fill a connection
    // that may have two; a third long call on it is refused at once, naming the flag and
    // the connection, while short calls on the same connection are answered; once a
    // waiting Acquire ends, a long call is admitted again.
    let list = |client: Client, group: String| async move {
        client.list_leases(LeaseFilter::new().group(group)).await
    };
    // A Read of a lease that has ended: admitted, it answers at once that the lease ended;
    // refused, it says why.
    let ended = connect().await.acquire(options(2)).await.expect("a lease");
    let ended_id = ended.lease_id().to_string();
    ended.release().await.expect("release");
    let read = |client: Client| {
        let lease_id = ended_id.clone();
        async move {
            client
                .raw()
                .read(kafka_lease_client::proto::ReadRequest {
                    lease_id,
                    ..Default::default()
                })
                .await
                .map(|_| ())
                .map_err(Error::from)
        }
    };
    let busy = connect().await;
    let waiting: Vec<_> = [0, 1]
        .into_iter()
        .map(|partition| {
            let (client, options) = (
                busy.clone(),
                options(partition).wait(Duration::from_secs(30)),
            );
            tokio::spawn(async move { client.acquire(options).await })
        })
        .collect();
    // Both waiting before the first probe: a probe (a long call too) sent while only one
    // waits would take the second one's place, and that Acquire would be the one refused.
    let metrics = gateway.metrics_endpoint();
    kafka_lease_testkit::wait_for(
        "the two Acquires to wait",
        Duration::from_secs(20),
        || async {
            assert!(
                waiting.iter().all(|w| !w.is_finished()),
                "a waiting Acquire ended while its partition was held"
            );
            (support::scrape_metric(&metrics, "kafka_lease_acquires_waiting").await == 2.0)
                .then_some(())
        },
    )
    .await;
    let refused = match read(busy.clone()).await {
        Err(e @ Error::Busy { .. }) => e,
        other => panic!("a third long call on a full connection is refused: {other:?}"),
    };
    assert!(
        waiting.iter().all(|w| !w.is_finished()),
        "a waiting Acquire ended while its partition was held"
    );
    let details = refused.details().expect("details");
    assert_eq!(details.reason(), Some(&Reason::LimitReached), "{refused}");
    assert_eq!(
        details.metadata("limit"),
        Some("--max-long-calls-per-connection")
    );
    let text = refused.to_string();
    assert!(
        text.contains("--max-long-calls-per-connection")
            && text.contains("limit is 2")
            && text.contains("long calls open"),
        "names the flag, its value and what is at the limit: {text}"
    );
    let listed = tokio::time::timeout(QUEUED, list(busy.clone(), group.clone()))
        .await
        .expect("a short call on the full connection is answered at once")
        .expect("list");
    assert_eq!(listed.len(), 2);
    match tokio::time::timeout(QUEUED, read(other.clone())).await {
        Ok(Err(e)) => assert!(
            !matches!(e, Error::Busy { .. }),
            "another connection has its own long calls: {e}"
        ),
        other => panic!("a Read of an ended lease on another connection: {other:?}"),
    }
    waiting[0].abort();
    kafka_lease_testkit::wait_for(
        "a long call to be admitted once a waiting Acquire ended",
        Duration::from_secs(20),
        || async { (!matches!(read(busy.clone()).await, Err(Error::Busy { .. }))).then_some(()) },
    )
    .await;
    waiting[1].abort();
    second.release().await.expect("release");
    again.release().await.expect("release");
}

/// A request larger than the API accepts (1 MiB encoded) is refused before it is decoded,
/// changes nothing, and the same connection goes on serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_request_is_refused_and_the_connection_goes_on() {
    let services = kafka_lease_testkit::require_services!();
    let gateway =
        GatewayProcess::start(&services, &unique_prefix(), &unique_name("gw-size"), &[]).await;
    let topic = create_topic(&services, 1).await;
    let group = unique_name("g");
    let client = Client::connect(gateway.endpoint()).await.expect("connect");
    let huge = kafka_lease_client::proto::AcquireRequest {
        group: group.clone(),
        topic: topic.clone(),
        member: "m".repeat(2 * 1024 * 1024),
        ..Default::default()
    };
    let refused = client.raw().acquire(huge).await.expect_err("2 MiB request");
    // tonic answers OUT_OF_RANGE, naming the size and the limit.
    assert_eq!(refused.code(), tonic::Code::OutOfRange, "{refused:?}");
    assert!(
        refused.message().contains("1048576"),
        "names the limit: {refused:?}"
    );
    let leases = client
        .list_leases(LeaseFilter::new().group(&group))
        .await
        .expect("the connection still serves");
    assert!(leases.is_empty(), "nothing was acquired: {leases:?}");
    client
        .acquire(AcquireOptions::new(&group, &topic))
        .await
        .expect("a normal request on the same connection");
}

/// A client that vanishes without closing its connection (a paused or cut-off host: its
/// packets stop, no FIN, no RST) loses its lease: the gateway's HTTP/2 pings go unanswered,
/// it closes the connection, the open Read ends, and the lease lives out its TTL. With the
/// pings far apart the same client keeps the partition past the wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_vanishes_with_its_connection_open_loses_its_lease() {
    let services = kafka_lease_testkit::require_services!();
    let topic = create_topic(&services, 1).await;
    for (keepalive, freed) in [("1s", true), ("10m", false)] {
        let gateway = GatewayProcess::start(
            &services,
            &unique_prefix(),
            &unique_name("gw-keepalive"),
            &[
                "--keepalive-interval",
                keepalive,
                "--keepalive-timeout",
                "1s",
            ],
        )
        .await;
        let target: std::net::SocketAddr = gateway.addr.parse().expect("gateway address");
        let relay = kafka_lease_testkit::Relay::start(target)
            .await
            .expect("relay");
        let vanishing = Client::connect(format!("http://{}", relay.addr()))
            .await
            .expect("connect through the relay");
        let group = unique_name("g");
        let lease = vanishing
            .acquire(
                AcquireOptions::new(&group, &topic)
                    .partition(0)
                    .ttl(Duration::from_secs(2)),
            )
            .await
            .expect("the lease");
        // An open Read keeps the lease alive for as long as it is open.
        let _records = lease
            .records(kafka_lease_client::ReadOptions::new().reconnect_attempts(0))
            .await
            .expect("read");
        relay.hold();
        let other = Client::connect(gateway.endpoint()).await.expect("connect");
        let started = tokio::time::Instant::now();
        let next = other
            .acquire(
                AcquireOptions::new(&group, &topic)
                    .partition(0)
                    .wait(Duration::from_secs(8)),
            )
            .await;
        println!(
            "keepalive {keepalive}: the next Acquire answered after {:?}: {}",
            started.elapsed(),
            if next.is_ok() { "granted" } else { "busy" }
        );
        assert_eq!(next.is_ok(), freed, "keepalive {keepalive}: {next:?}");
        relay.release();
    }
}
