//! Proves the Consul that `scripts/services up` starts is a real agent: sessions, a KV
//! acquire that a second session cannot take (a value, not an error), release, and the
//! second session's acquire after it.

use consulrs::api::kv::requests::{ReadKeyRequest, SetKeyRequest};
use consulrs::api::session::requests::CreateSessionRequest;
use consulrs::client::{ConsulClient, ConsulClientSettingsBuilder};
use kafka_lease_testkit::unique_name;

async fn create_session(client: &ConsulClient, name: &str) -> String {
    consulrs::session::create(
        client,
        Some(
            CreateSessionRequest::builder()
                .name(name)
                .ttl("15s")
                .lock_delay("0s")
                .behavior("release"),
        ),
    )
    .await
    .expect("create session")
    .response
    .id
}

async fn acquire(client: &ConsulClient, key: &str, session: &str, value: &str) -> bool {
    consulrs::kv::set_json(
        client,
        key,
        &value,
        Some(SetKeyRequest::builder().acquire(session)),
    )
    .await
    .expect("acquire request")
    .response
}

async fn holder(client: &ConsulClient, key: &str) -> Option<String> {
    let entries = consulrs::kv::read(client, key, Some(&mut ReadKeyRequest::builder()))
        .await
        .expect("read key")
        .response;
    entries.into_iter().next().and_then(|e| e.session)
}

#[tokio::test]
async fn real_consul_sessions_lock_exclusively() {
    let services = kafka_lease_testkit::require_services!();
    let client = ConsulClient::new(
        ConsulClientSettingsBuilder::default()
            .address(&services.consul_http_addr)
            .build()
            .expect("settings"),
    )
    .expect("client");
    let key = format!("{}/group/topic/0", unique_name("smoke"));

    let first = create_session(&client, "smoke-first").await;
    let second = create_session(&client, "smoke-second").await;
    assert_ne!(first, second);

    assert!(
        acquire(&client, &key, &first, "first").await,
        "free key is acquired"
    );
    assert!(
        !acquire(&client, &key, &second, "second").await,
        "a held key is refused to another session as a value, not an error"
    );
    assert_eq!(holder(&client, &key).await.as_deref(), Some(first.as_str()));

    let released = consulrs::kv::set(
        &client,
        &key,
        b"",
        Some(SetKeyRequest::builder().release(first.as_str())),
    )
    .await
    .expect("release")
    .response;
    assert!(released);
    assert_eq!(holder(&client, &key).await, None);

    assert!(
        acquire(&client, &key, &second, "second").await,
        "released key is acquired"
    );
    assert_eq!(
        holder(&client, &key).await.as_deref(),
        Some(second.as_str())
    );

    for session in [&first, &second] {
        consulrs::session::delete(&client, session, None)
            .await
            .expect("destroy session");
    }
    consulrs::kv::delete(&client, &key, None)
        .await
        .expect("delete key");
}
