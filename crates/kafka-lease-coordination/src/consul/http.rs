//! Consul's HTTP API as this backend uses it: a client with a narrow API. Every request this
//! backend sends goes through here: consulrs calls bounded by a time limit, the raw KV reads
//! consulrs cannot express (a 404 with a meaningful index), `/v1/txn`, the registration. The
//! request types and the parsers of the answers are the wire, in `wire.rs`.
//!
//! # Reads that consulrs cannot express
//! consulrs turns every non-2xx answer into an error and drops its headers, but Consul
//! answers a read of an empty prefix (exactly what a waiter sees after the last holder of a
//! topic released) with 404 *and* a meaningful `X-Consul-Index`. Without that index a waiter
//! would either spin or sleep through the change, so KV reads go through consulrs' own request
//! types and middleware (`rustify::Endpoint`) and read the raw response, whatever its status.
//! Writes and session calls use the plain consulrs functions, except the service registration:
//! consulrs serializes it with an `Ns` field that Consul 1.8 rejects ("unknown field").

use std::time::Duration;

use consulrs::api::features::{Blocking, ConsistencyMode, FeaturedEndpoint, Features};
use consulrs::api::kv::common::KVPair;
use consulrs::api::kv::requests::ReadKeyRequest;
use consulrs::client::{Client as _, ConsulClient};
use consulrs::error::ClientError;
use rustify::client::Client as _;
use rustify::endpoint::{Endpoint, MiddleWare as _};

use crate::CoordinationError;

use super::wire::{
    parse_kv_answer, parse_txn_answer, KvRead, StatusLeader, Txn, TxnOp, TxnOutcome,
};
use super::{ConsulTls, Shared, REQUEST_TIMEOUT};

/// A consulrs client whose HTTP client trusts `tls.ca_cert` and presents `tls.client_cert`,
/// built here on rustls: consulrs' own builder parses the client certificate for rustls but
/// builds the client on the default (OpenSSL) backend, which refuses it. Errors name the
/// file and the reason.
pub(super) fn tls_client(
    settings: consulrs::client::ConsulClientSettings,
    tls: &ConsulTls,
) -> Result<ConsulClient, CoordinationError> {
    let failed = |what: &str, path: &str, e: &dyn std::fmt::Display| {
        unavailable("connect (TLS)", format!("{what} {path}: {e}"))
    };
    let mut builder = reqwest::ClientBuilder::new().use_rustls_tls();
    if let Some(path) = &tls.ca_cert {
        let pem = std::fs::read(path).map_err(|e| failed("cannot read the CA file", path, &e))?;
        let certs = reqwest::Certificate::from_pem_bundle(&pem)
            .map_err(|e| failed("no usable CA certificate in", path, &e))?;
        if certs.is_empty() {
            return Err(failed("no CA certificate in", path, &"expected PEM"));
        }
        for cert in certs {
            builder = builder.add_root_certificate(cert);
        }
    }
    if let (Some(cert), Some(key)) = (&tls.client_cert, &tls.client_key) {
        let mut pem = std::fs::read(cert)
            .map_err(|e| failed("cannot read the client certificate", cert, &e))?;
        pem.push(b'\n');
        pem.extend(std::fs::read(key).map_err(|e| failed("cannot read the client key", key, &e))?);
        let identity = reqwest::Identity::from_pem(&pem).map_err(|e| {
            failed(
                "no usable certificate and key (PEM; the key PKCS#8 or RSA) in",
                &format!("{cert} and {key}"),
                &e,
            )
        })?;
        builder = builder.identity(identity);
    }
    let http = builder
        .build()
        .map_err(|e| unavailable("connect (TLS)", error_chain(&e)))?;
    Ok(ConsulClient {
        http: rustify::clients::reqwest::Client::new(settings.address.as_str(), http),
        settings,
    })
}

/// A consulrs error with the server's message, which consulrs' own `Display` leaves out.
pub(super) fn describe(error: &ClientError) -> String {
    match error {
        ClientError::APIError { code, message } => {
            format!("HTTP {code}: {}", message.as_deref().unwrap_or("").trim())
        }
        other => error_chain(other),
    }
}

/// An error and its causes, each said once: the HTTP libraries repeat a cause's text in
/// their own ("error trying to connect: tcp connect error: Connection refused" above "tcp
/// connect error: Connection refused" above "Connection refused").
pub(super) fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let said = cause.to_string();
        if !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        source = cause.source();
    }
    text
}

pub(super) fn is_status(error: &ClientError, status: u16) -> bool {
    matches!(error, ClientError::APIError { code, .. } if *code == status)
}

/// A Go duration string, as Consul parses them.
pub(super) fn go_duration(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

pub(super) fn unavailable(operation: &'static str, detail: impl Into<String>) -> CoordinationError {
    ::metrics::counter!(super::metrics::ERRORS, "operation" => operation).increment(1);
    CoordinationError::Unavailable {
        operation,
        detail: detail.into(),
    }
}

impl Shared {
    /// Sends one ordinary request in its turn ([`MAX_REQUESTS_IN_FLIGHT`]) and bounds the
    /// wait and the request together by [`REQUEST_TIMEOUT`]: the one place that limit is
    /// applied (the HTTP client consulrs builds has no timeout of its own). No answer in
    /// time is `Unavailable`; the request's own outcome is the caller's to judge.
    pub(super) async fn in_time<T>(
        &self,
        operation: &'static str,
        request: impl std::future::Future<Output = T>,
    ) -> Result<T, CoordinationError> {
        tokio::time::timeout(REQUEST_TIMEOUT, async {
            // Never closed: the semaphore lives as long as the backend.
            let _turn = self.lane.acquire().await;
            request.await
        })
        .await
        .map_err(|_| unavailable(operation, format!("no answer within {REQUEST_TIMEOUT:?}")))
    }

    /// [`Shared::in_time`] for a consulrs call, whose errors are all `Unavailable`.
    pub(super) async fn bounded<T>(
        &self,
        operation: &'static str,
        request: impl std::future::Future<Output = Result<T, ClientError>>,
    ) -> Result<T, CoordinationError> {
        self.in_time(operation, request)
            .await?
            .map_err(|e| unavailable(operation, describe(&e)))
    }
}

/// A request that got no HTTP answer: it could not be built, or sending it failed. Its
/// text is the error and its causes, each said once ([`error_chain`]).
#[derive(Debug, thiserror::Error)]
#[error("{}", error_chain(.0))]
pub(super) struct SendError(#[source] rustify::errors::ClientError);

/// The status, `X-Consul-Index` and body of a response.
pub(super) struct RawAnswer {
    pub(super) status: u16,
    pub(super) index: Option<u64>,
    pub(super) body: Vec<u8>,
}

/// Sends a consulrs request on `client` the way consulrs would (version prefix, token,
/// features), but keeps the response whatever its status (see the module docs).
async fn send_raw_on<E: Endpoint + FeaturedEndpoint>(
    client: &ConsulClient,
    endpoint: E,
) -> Result<RawAnswer, SendError> {
    let middleware = client.middle(endpoint.features());
    let mut request = endpoint.request(client.http().base()).map_err(SendError)?;
    middleware
        .request(&endpoint, &mut request)
        .map_err(SendError)?;
    let response = client.http().send(request).await.map_err(SendError)?;
    let index = response
        .headers()
        .get("X-Consul-Index")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    Ok(RawAnswer {
        status: response.status().as_u16(),
        index,
        body: response.into_body(),
    })
}

impl Shared {
    /// Sends a consulrs request the way consulrs would (version prefix, token, features),
    /// but keeps the response whatever its status (see the module docs).
    pub(super) async fn send_raw<E: Endpoint + FeaturedEndpoint>(
        &self,
        endpoint: E,
    ) -> Result<RawAnswer, SendError> {
        send_raw_on(&self.client, endpoint).await
    }

    /// [`Shared::send_raw`] on the session's own connection (`critical`), for what keeps
    /// the session alive.
    pub(super) async fn send_raw_critical<E: Endpoint + FeaturedEndpoint>(
        &self,
        endpoint: E,
    ) -> Result<RawAnswer, SendError> {
        send_raw_on(&self.critical, endpoint).await
    }

    /// Reads KV entries (one key, or a prefix with `recurse`); 404 means none.
    pub(super) async fn read_kv(
        &self,
        operation: &'static str,
        path: &str,
        recurse: bool,
        mode: Option<ConsistencyMode>,
    ) -> Result<KvRead<KVPair>, CoordinationError> {
        let request = ReadKeyRequest {
            features: mode.map(|mode| Features {
                mode: Some(mode),
                ..Features::default()
            }),
            key: path.to_string(),
            recurse: recurse.then_some(true),
            ..ReadKeyRequest::default()
        };
        let answer = self
            .in_time(operation, self.send_raw(request))
            .await?
            .map_err(|e| unavailable(operation, e.to_string()))?;
        parse_kv_answer(operation, answer)
    }

    /// Applies a transaction: [`TxnOutcome::Applied`] with the KV entries its operations
    /// returned, or [`TxnOutcome::Refused`] with why Consul rolled it back.
    pub(super) async fn txn(
        &self,
        operation: &'static str,
        ops: Vec<TxnOp>,
    ) -> Result<TxnOutcome, CoordinationError> {
        let answer = self
            .in_time(operation, self.send_raw(Txn { ops }))
            .await?
            .map_err(|e| unavailable(operation, e.to_string()))?;
        parse_txn_answer(operation, &answer)
    }

    /// The locks under a topic prefix: at once (`blocking: None`), or after a change past
    /// `index` (Consul blocks up to `wait`). `limit` bounds the whole request.
    pub(super) async fn read_prefix(
        &self,
        operation: &'static str,
        prefix: &str,
        blocking: Option<(u64, Duration)>,
        limit: Duration,
    ) -> Result<Option<KvRead<KVPair>>, CoordinationError> {
        let request = ReadKeyRequest {
            features: blocking.map(|(index, wait)| Features {
                blocking: Some(Blocking {
                    index,
                    wait: Some(go_duration(wait)),
                }),
                ..Features::default()
            }),
            key: prefix.to_string(),
            recurse: Some(true),
            ..ReadKeyRequest::default()
        };
        let blocking_query = request.features.is_some();
        let sent = async {
            // A read at once takes a turn; a blocking query (one per watched topic) does not.
            let _turn = if blocking_query {
                None
            } else {
                self.lane.acquire().await.ok()
            };
            self.send_raw(request).await
        };
        match tokio::time::timeout(limit, sent).await {
            Ok(answer) => Ok(Some(parse_kv_answer(
                operation,
                answer.map_err(|e| unavailable(operation, e.to_string()))?,
            )?)),
            Err(_) => Ok(None),
        }
    }

    /// The one entry at `path`, if any.
    pub(super) async fn read_key(
        &self,
        operation: &'static str,
        path: &str,
        mode: Option<ConsistencyMode>,
    ) -> Result<Option<KVPair>, CoordinationError> {
        let read = self.read_kv(operation, path, false, mode).await?;
        Ok(read.entries.into_iter().find(|e| e.key == path))
    }

    /// Whether Consul answers and its cluster has a leader (`GET /v1/status/leader`).
    pub(super) async fn ping(&self) -> Result<(), CoordinationError> {
        let middleware = self.client.middle(None);
        let answer = self
            .bounded("ping", async {
                StatusLeader
                    .with_middleware(&middleware)
                    .exec(self.client.http())
                    .await
                    .map_err(ClientError::from)
            })
            .await?;
        let leader: String = answer
            .parse()
            .map_err(|e| unavailable("ping", error_chain(&e)))?;
        if leader.is_empty() {
            return Err(unavailable("ping", "the Consul cluster has no leader"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    /// An error whose text is `text`, caused by `source`.
    #[derive(Debug)]
    struct Layer(&'static str, Option<Box<Layer>>);

    impl std::fmt::Display for Layer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for Layer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|e| e as _)
        }
    }

    #[test]
    fn an_error_chain_says_each_cause_once() {
        let refused = Layer("Connection refused (os error 111)", None);
        let tcp = Layer(
            "tcp connect error: Connection refused (os error 111)",
            Some(Box::new(refused)),
        );
        let hyper = Layer(
            "error trying to connect: tcp connect error: Connection refused (os error 111)",
            Some(Box::new(tcp)),
        );
        let top = Layer("error sending request", Some(Box::new(hyper)));
        assert_eq!(
            error_chain(&top),
            "error sending request: error trying to connect: tcp connect error: Connection \
             refused (os error 111)"
        );
    }

    #[test]
    fn durations_are_written_the_way_go_parses_them() {
        assert_eq!(go_duration(Duration::from_secs(10)), "10s");
        assert_eq!(go_duration(Duration::from_millis(1500)), "1500ms");
        assert_eq!(go_duration(Duration::ZERO), "0s");
    }
}
