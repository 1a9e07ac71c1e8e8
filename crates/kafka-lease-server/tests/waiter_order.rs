//! Who gets a released partition, against the real Consul and Kafka, with in-process gateways
//! (so a test can see when an Acquire has started waiting): one waiter per release, the
//! oldest on its gateway, whatever the number of waiters behind it.

use std::sync::Arc;
use std::time::Duration;

use kafka_lease_server::coordination::consul::{ConsulLockConfig, ConsulLocks};
use kafka_lease_server::coordination::LockBackend;
use kafka_lease_server::gateway::{AcquireSpec, Gateway, Granted, Reset};
use kafka_lease_server::kafka::{Kafka, KafkaSettings};
use kafka_lease_testkit::{create_topic, unique_name, wait_for, Services};
use tokio::task::JoinHandle;

const DEADLINE: Duration = Duration::from_secs(30);
/// Waiters on each of the two waiting gateways.
const PER_GATEWAY: usize = 3;

async fn gateway(services: &Services, prefix: &str, name: &str) -> Arc<Gateway> {
    let instance = unique_name(name);
    let locks = ConsulLocks::connect(ConsulLockConfig {
        address: services.consul_http_addr.clone(),
        prefix: prefix.into(),
        instance: instance.clone(),
        ..ConsulLockConfig::default()
    })
    .await
    .expect("a consul session");
    let backend: Arc<dyn LockBackend> = Arc::new(locks);
    let kafka = Kafka::new(KafkaSettings::new(
        services.kafka_bootstrap.clone(),
        instance.clone(),
    ))
    .expect("kafka");
    Gateway::new(instance, backend, kafka)
}

fn spec(group: &str, topic: &str, member: &str, wait: Duration) -> AcquireSpec {
    AcquireSpec {
        group: group.into(),
        topic: topic.into(),
        partition: None,
        member: member.into(),
        ttl: Duration::from_secs(60),
        wait,
        reset: Reset::Earliest,
        via: None,
        subscriber: String::new(),
        owner: None,
    }
}

type Waiter = (String, Arc<Gateway>, JoinHandle<Result<Granted, String>>);

/// Starts a waiter on `gateway`, and returns once the gateway counts it as waiting, so the
/// order the waiters were started in is the order they arrived in.
async fn start_waiter(gateway: &Arc<Gateway>, group: &str, topic: &str, member: &str) -> Waiter {
    let before = gateway.waiting_acquires();
    let task = {
        let (gateway, spec) = (gateway.clone(), spec(group, topic, member, DEADLINE * 2));
        tokio::spawn(async move { gateway.acquire(spec).await.map_err(|e| e.to_string()) })
    };
    wait_for(&format!("{member} to wait"), DEADLINE, || async {
        (gateway.waiting_acquires() == before + 1).then_some(())
    })
    .await;
    (member.to_string(), gateway.clone(), task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_release_goes_to_one_waiter_the_oldest_on_its_gateway() {
    let services = kafka_lease_testkit::require_services!();
    let prefix = format!("kafka-lease-test/{}", unique_name("order"));
    let topic = unique_name("order");
    create_topic(&services.kafka_bootstrap, &topic, 1)
        .await
        .expect("topic");
    let group = unique_name("g");
    let holder = gateway(&services, &prefix, "gw-hold").await;
    let (a, b) = (
        gateway(&services, &prefix, "gw-a").await,
        gateway(&services, &prefix, "gw-b").await,
    );
    let mut lease = holder
        .acquire(spec(&group, &topic, "first", Duration::ZERO))
        .await
        .expect("the first lease");
    let mut releasing = holder.clone();

    // Waiters arrive alternately on the two gateways: a-0, b-0, a-1, b-1, ...
    let mut waiting: Vec<Waiter> = Vec::new();
    for i in 0..PER_GATEWAY {
        waiting.push(start_waiter(&a, &group, &topic, &format!("a-{i}")).await);
        waiting.push(start_waiter(&b, &group, &topic, &format!("b-{i}")).await);
    }

    let mut served = Vec::new();
    while !waiting.is_empty() {
        let counts = (a.waiting_acquires(), b.waiting_acquires());
        releasing
            .release(
                &releasing.lease(lease.lease_id.as_str()).expect("held"),
                None,
            )
            .await
            .expect("release");
        let at = wait_for("a waiter to get the partition", DEADLINE, || async {
            waiting.iter().position(|(_, _, task)| task.is_finished())
        })
        .await;
        let (member, gateway, task) = waiting.remove(at);
        lease = task.await.expect("join").expect("the lease");
        // The oldest waiter still waiting on its gateway, and the only one served.
        let oldest_there = waiting
            .iter()
            .filter(|(_, g, _)| Arc::ptr_eq(g, &gateway))
            .map(|(m, _, _)| m.clone())
            .min();
        assert!(
            oldest_there.as_ref().is_none_or(|next| next > &member),
            "{member} was served before the older {oldest_there:?} on its gateway"
        );
        assert!(
            waiting.iter().all(|(_, _, task)| !task.is_finished()),
            "one release, one lease"
        );
        let now = (a.waiting_acquires(), b.waiting_acquires());
        assert_eq!(
            now.0 + now.1 + 1,
            counts.0 + counts.1,
            "exactly one waiter left"
        );
        served.push(member);
        releasing = gateway;
    }
    println!("served in this order: {served:?}");
    let order = |side: &str| -> Vec<String> {
        served
            .iter()
            .filter(|m| m.starts_with(side))
            .cloned()
            .collect()
    };
    let expected =
        |side: &str| -> Vec<String> { (0..PER_GATEWAY).map(|i| format!("{side}-{i}")).collect() };
    assert_eq!(order("a"), expected("a"));
    assert_eq!(order("b"), expected("b"));
    releasing
        .release(
            &releasing.lease(lease.lease_id.as_str()).expect("held"),
            None,
        )
        .await
        .expect("the last release");
    for g in [&holder, &a, &b] {
        g.shutdown().await;
        g.locks().shutdown().await;
    }
}
