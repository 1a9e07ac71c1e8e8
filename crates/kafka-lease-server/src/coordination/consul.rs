//! The Consul [`LockBackend`]: partition locks are KV keys acquired with one TTL session per
//! gateway instance, kept alive (and replaced when lost) by a background renew task.
//!
//! Layout: `<prefix>/<group>/<topic>/<partition>`, value = [`HolderInfo`] as JSON, held with
//! `?acquire=<session>`. The session has `Behavior = delete`, so the keys of a dead instance
//! vanish instead of lingering unlocked. The fencing token of a grant is the key's
//! `ModifyIndex` right after the acquire: a Raft index, so it grows across holders even though
//! `delete` behaviour recreates keys (whose `LockIndex` restarts at 1).
//!
//! # Self-fencing
//! Consul keeps a TTL session alive for at least `TTL` after each renew it answers (it arms
//! the expiry timer at 2×TTL). This instance measures from the *send* time of its last
//! successful renew (which is before Consul handled it) with the monotonic tokio clock; when
//! `session_ttl` has passed since then without another confirmed renew, it declares the
//! session [`SessionState::Lost`] ("consul unreachable since …") and every grant void, while
//! Consul still holds the locks for it: nobody else can have taken them yet. When Consul
//! answers again it destroys the old session (best effort) and creates a new one, since it
//! cannot know what became of the old locks.
//!
//! # Reads that consulrs cannot express
//! consulrs turns every non-2xx answer into an error and drops its headers, but Consul
//! answers a read of an empty prefix (exactly what a waiter sees after the last holder of a
//! topic released) with 404 *and* a meaningful `X-Consul-Index`. Without that index a waiter
//! would either spin or sleep through the change, so KV reads go through consulrs' own request
//! types and middleware (`rustify::Endpoint`) and read the raw response, whatever its status.
//! Writes and session calls use the plain consulrs functions.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use consulrs::api::features::{Blocking, ConsistencyMode, FeaturedEndpoint, Features};
use consulrs::api::kv::common::KVPair;
use consulrs::api::kv::requests::{
    DeleteKeyRequest, ReadKeyRequest, ReadKeysRequest, SetKeyRequest,
};
use consulrs::api::session::requests::CreateSessionRequest;
use consulrs::client::{Client as _, ConsulClient, ConsulClientSettingsBuilder};
use consulrs::error::ClientError;
use rustify::client::Client as _;
use rustify::endpoint::{Endpoint, MiddleWare as _};
use rustify::enums::{RequestMethod, RequestType, ResponseType};
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::{
    Acquisition, CoordinationError, FencingToken, HeldLock, HolderInfo, LockBackend, LockGrant,
    LockKey, SessionState,
};

/// Consul's bounds for a session TTL.
const TTL_MIN: Duration = Duration::from_secs(10);
const TTL_MAX: Duration = Duration::from_secs(24 * 60 * 60);
/// Consul clamps a session's lock-delay to this.
const LOCK_DELAY_MAX: Duration = Duration::from_secs(60);
/// How long an ordinary (non-blocking) request may take before it counts as a failure. The
/// HTTP client consulrs builds has no timeout at all, so every call is bounded here.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Pause between renew attempts after a failed one.
const RENEW_RETRY: Duration = Duration::from_millis(500);
/// Backoff bounds for creating a new session while Consul is unreachable.
const CREATE_BACKOFF_MIN: Duration = Duration::from_millis(500);
const CREATE_BACKOFF_MAX: Duration = Duration::from_secs(5);
/// Consul lengthens a blocking query's `wait` by a random jitter of up to `wait / 16`.
const JITTER_DIVISOR: u32 = 16;
/// The shortest `wait` asked of Consul: `wait=0` would mean its default of 5 minutes.
const MIN_SERVER_WAIT: Duration = Duration::from_secs(1);
/// The floor of the window in which a key that is free but refused is assumed to be under
/// lock-delay (see [`ConsulLocks::wait_for_change`]).
const LOCK_DELAY_POLL_MIN: Duration = Duration::from_millis(500);

/// How to reach Consul and how this instance's session behaves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConsulLockConfig {
    /// The agent's HTTP API, e.g. `http://127.0.0.1:8500`.
    pub address: String,
    /// ACL token (needs `key:write` on the prefix and `session:write` on the node).
    pub token: Option<String>,
    /// The KV prefix every lock lives under.
    pub prefix: String,
    /// This gateway instance's name: the session is named `kafka-lease <instance>`.
    pub instance: String,
    /// The session TTL (Consul allows 10 s ..= 24 h). Also the self-fence deadline.
    pub session_ttl: Duration,
    /// How long Consul keeps an invalidated session's keys unlockable (0 ..= 60 s).
    pub lock_delay: Duration,
    /// How often the session is renewed; at most half the TTL, so a failed renew can be
    /// retried before the self-fence deadline. Set it with the TTL: the default is the
    /// default TTL / 3.
    pub renew_interval: Duration,
}

impl Default for ConsulLockConfig {
    /// Every setting but `instance`, which must be set (`validate` insists).
    fn default() -> Self {
        let session_ttl = Duration::from_secs(10);
        Self {
            address: "http://127.0.0.1:8500".into(),
            token: None,
            prefix: "kafka-lease".into(),
            instance: String::new(),
            session_ttl,
            lock_delay: Duration::from_secs(1),
            renew_interval: session_ttl / 3,
        }
    }
}

/// A [`ConsulLockConfig`] setting that cannot work.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConsulConfigError {
    #[error("{setting} = {value} is out of range; allowed: {allowed}")]
    OutOfRange {
        setting: &'static str,
        value: String,
        allowed: String,
    },
    #[error("{setting} = {value:?} is invalid: {reason}")]
    Invalid {
        setting: &'static str,
        value: String,
        reason: &'static str,
    },
}

impl ConsulLockConfig {
    /// Checks every setting against what Consul and this backend accept.
    pub fn validate(&self) -> Result<(), ConsulConfigError> {
        let address = self.address.trim_end_matches('/');
        let host = address
            .strip_prefix("http://")
            .or_else(|| address.strip_prefix("https://"));
        if host.is_none_or(|h| h.is_empty() || h.contains(['/', '?', '#'])) {
            return Err(ConsulConfigError::Invalid {
                setting: "address",
                value: self.address.clone(),
                reason: "must be http://host:port or https://host:port",
            });
        }
        if let Some(token) = &self.token {
            // The token goes into a header; consulrs would panic on anything else.
            if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(ConsulConfigError::Invalid {
                    setting: "token",
                    value: "<redacted>".into(),
                    reason: "must be non-empty printable ASCII without spaces",
                });
            }
        }
        let prefix = self.prefix.trim_end_matches('/');
        let segment_ok = |s: &str| {
            !s.is_empty()
                && s != "."
                && s != ".."
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        };
        if !prefix.split('/').all(segment_ok) {
            return Err(ConsulConfigError::Invalid {
                setting: "prefix",
                value: self.prefix.clone(),
                reason: "must be one or more `/`-separated segments of [A-Za-z0-9._-], \
                         without a leading `/`, `.` or `..`",
            });
        }
        if self.instance.trim().is_empty() {
            return Err(ConsulConfigError::Invalid {
                setting: "instance",
                value: self.instance.clone(),
                reason: "must name this gateway instance",
            });
        }
        if !(TTL_MIN..=TTL_MAX).contains(&self.session_ttl) {
            return Err(ConsulConfigError::OutOfRange {
                setting: "session_ttl",
                value: format!("{:?}", self.session_ttl),
                allowed: "10s ..= 24h (Consul's limits)".into(),
            });
        }
        if self.lock_delay > LOCK_DELAY_MAX {
            return Err(ConsulConfigError::OutOfRange {
                setting: "lock_delay",
                value: format!("{:?}", self.lock_delay),
                allowed: "0s ..= 60s (Consul's limits)".into(),
            });
        }
        let max_renew = self.session_ttl / 2;
        if self.renew_interval.is_zero() || self.renew_interval > max_renew {
            return Err(ConsulConfigError::OutOfRange {
                setting: "renew_interval",
                value: format!("{:?}", self.renew_interval),
                allowed: format!("more than 0s ..= session_ttl / 2 = {max_renew:?}"),
            });
        }
        Ok(())
    }

    fn prefix(&self) -> &str {
        self.prefix.trim_end_matches('/')
    }
}

/// Partition locks in Consul for one gateway instance.
pub struct ConsulLocks {
    shared: Arc<Shared>,
    /// The renew task; aborted by `shutdown` and on drop.
    renewer: Mutex<Option<JoinHandle<()>>>,
}

/// What the backend and its renew task share.
struct Shared {
    client: ConsulClient,
    config: ConsulLockConfig,
    state: watch::Sender<SessionState>,
    /// Send time of the last renew (or create) Consul confirmed.
    last_confirmed: Mutex<Option<Instant>>,
    /// Asks the renew task to renew now (an acquire was told the session is invalid).
    poke: Notify,
    /// Keys found free but refused, with when that stops looking like lock-delay.
    refused: Mutex<HashMap<LockKey, Instant>>,
}

impl fmt::Debug for ConsulLocks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConsulLocks")
            .field("address", &self.shared.config.address)
            .field("prefix", &self.shared.config.prefix)
            .field("instance", &self.shared.config.instance)
            .field("state", &*self.shared.state.borrow())
            .finish_non_exhaustive()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section here is a plain assignment or map operation: a panic elsewhere
    // cannot leave the data half-updated, so a poisoned lock is still usable.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A consulrs error with the server's message, which consulrs' own `Display` leaves out.
fn describe(error: &ClientError) -> String {
    match error {
        ClientError::APIError { code, message } => {
            format!("HTTP {code}: {}", message.as_deref().unwrap_or("").trim())
        }
        other => error_chain(other),
    }
}

fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

fn is_status(error: &ClientError, status: u16) -> bool {
    matches!(error, ClientError::APIError { code, .. } if *code == status)
}

/// A Go duration string, as Consul parses them.
fn go_duration(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

fn unavailable(operation: &'static str, detail: impl Into<String>) -> CoordinationError {
    CoordinationError::Unavailable {
        operation,
        detail: detail.into(),
    }
}

/// Runs a request with [`REQUEST_TIMEOUT`], mapping both failures to `Unavailable`.
async fn bounded<T>(
    operation: &'static str,
    request: impl std::future::Future<Output = Result<T, ClientError>>,
) -> Result<T, CoordinationError> {
    match tokio::time::timeout(REQUEST_TIMEOUT, request).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(unavailable(operation, describe(&e))),
        Err(_) => Err(unavailable(
            operation,
            format!("no answer within {REQUEST_TIMEOUT:?}"),
        )),
    }
}

/// A KV read with its index, whatever the status: 404 is "no entries", not an error.
struct KvRead<T> {
    index: u64,
    entries: Vec<T>,
}

/// `GET /v1/status/leader`, which consulrs has no call for.
struct StatusLeader;

impl Endpoint for StatusLeader {
    type Response = String;
    const REQUEST_BODY_TYPE: RequestType = RequestType::JSON;
    const RESPONSE_BODY_TYPE: ResponseType = ResponseType::JSON;

    fn path(&self) -> String {
        "status/leader".into()
    }

    fn method(&self) -> RequestMethod {
        RequestMethod::GET
    }
}

impl FeaturedEndpoint for StatusLeader {
    fn features(&self) -> Option<Features> {
        None
    }
}

/// The status, `X-Consul-Index` and body of a response.
struct RawAnswer {
    status: u16,
    index: Option<u64>,
    body: Vec<u8>,
}

impl Shared {
    fn prefix(&self) -> &str {
        self.config.prefix()
    }

    fn live_session(&self) -> Result<String, CoordinationError> {
        match &*self.state.borrow() {
            SessionState::Live { id } => Ok(id.clone()),
            SessionState::Lost { reason } => Err(CoordinationError::NoSession {
                reason: reason.clone(),
            }),
        }
    }

    /// Sends a consulrs request the way consulrs would (version prefix, token, features),
    /// but keeps the response whatever its status (see the module docs).
    async fn send_raw<E: Endpoint + FeaturedEndpoint>(
        &self,
        endpoint: E,
    ) -> Result<RawAnswer, String> {
        let middleware = self.client.middle(endpoint.features());
        let mut request = endpoint
            .request(self.client.http().base())
            .map_err(|e| error_chain(&e))?;
        middleware
            .request(&endpoint, &mut request)
            .map_err(|e| error_chain(&e))?;
        let response = self
            .client
            .http()
            .send(request)
            .await
            .map_err(|e| error_chain(&e))?;
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

    /// Reads KV entries (one key, or a prefix with `recurse`); 404 means none.
    async fn read_kv(
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
        let answer = match tokio::time::timeout(REQUEST_TIMEOUT, self.send_raw(request)).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(e)) => return Err(unavailable(operation, e)),
            Err(_) => {
                return Err(unavailable(
                    operation,
                    format!("no answer within {REQUEST_TIMEOUT:?}"),
                ))
            }
        };
        parse_kv_answer(operation, answer)
    }

    /// The one entry at `path`, if any.
    async fn read_key(
        &self,
        operation: &'static str,
        path: &str,
        mode: Option<ConsistencyMode>,
    ) -> Result<Option<KVPair>, CoordinationError> {
        let read = self.read_kv(operation, path, false, mode).await?;
        Ok(read.entries.into_iter().find(|e| e.key == path))
    }

    fn set_state(&self, state: SessionState) {
        self.state.send_replace(state);
    }

    fn confirm(&self, sent: Instant) {
        *lock(&self.last_confirmed) = Some(sent);
    }

    async fn create_session(&self) -> Result<String, ClientError> {
        let mut request = CreateSessionRequest::builder();
        request
            .name(format!("kafka-lease {}", self.config.instance))
            .ttl(go_duration(self.config.session_ttl))
            .lock_delay(go_duration(self.config.lock_delay))
            .behavior("delete");
        let created = consulrs::session::create(&self.client, Some(&mut request)).await?;
        Ok(created.response.id)
    }

    /// Destroys a session and, first, deletes the keys it holds under the prefix one by one:
    /// explicit deletes set no lock-delay, so successors can take the keys at once, while
    /// destroying the session alone would lock them out for `lock_delay`.
    async fn end_session(&self, session: &str) {
        let instance = &self.config.instance;
        let prefix = format!("{}/", self.prefix());
        match self
            .read_kv("shutdown (list own keys)", &prefix, true, None)
            .await
        {
            Ok(read) => {
                for entry in read
                    .entries
                    .iter()
                    .filter(|e| e.session.as_deref() == Some(session))
                {
                    let mut request = DeleteKeyRequest::builder();
                    request.cas(entry.modify_index);
                    let deleted = bounded(
                        "shutdown (release)",
                        consulrs::kv::delete(&self.client, &entry.key, Some(&mut request)),
                    )
                    .await;
                    if let Err(error) = deleted {
                        tracing::warn!(
                            %instance,
                            key = %entry.key,
                            %error,
                            "could not release a lock at shutdown; destroying the session will",
                        );
                    }
                }
            }
            Err(error) => {
                tracing::warn!(
                    %instance,
                    %error,
                    "could not list own locks at shutdown; the session's destruction frees them",
                );
            }
        }
        match bounded(
            "shutdown (destroy session)",
            consulrs::session::delete(&self.client, session, None),
        )
        .await
        {
            Ok(_) => tracing::info!(%instance, %session, "destroyed consul lock session"),
            Err(error) => {
                tracing::warn!(
                    %instance,
                    %session,
                    %error,
                    "could not destroy the consul lock session; it expires after its TTL",
                )
            }
        }
    }

    /// Creates a session, retrying with backoff until Consul answers.
    async fn create_session_until_done(&self) -> Held {
        let mut backoff = CREATE_BACKOFF_MIN;
        loop {
            let sent = Instant::now();
            match tokio::time::timeout(REQUEST_TIMEOUT, self.create_session()).await {
                Ok(Ok(id)) => {
                    return Held {
                        id,
                        confirmed: sent,
                    }
                }
                Ok(Err(e)) => {
                    tracing::warn!(
                        instance = %self.config.instance,
                        error = %describe(&e),
                        retry_in = ?backoff,
                        "could not create a consul lock session",
                    );
                }
                Err(_) => {
                    tracing::warn!(
                        instance = %self.config.instance,
                        retry_in = ?backoff,
                        "creating a consul lock session timed out",
                    );
                }
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(CREATE_BACKOFF_MAX);
        }
    }

    /// Renews `held` until it is lost; returns how.
    async fn keep_alive(&self, held: &mut Held) -> Loss {
        let ttl = self.config.session_ttl;
        let instance = &self.config.instance;
        loop {
            let fence_at = held.confirmed + ttl;
            tokio::select! {
                () = tokio::time::sleep_until(held.confirmed + self.config.renew_interval) => {}
                () = self.poke.notified() => {}
            }
            loop {
                let now = Instant::now();
                if now >= fence_at {
                    return Loss::Unreachable;
                }
                let limit = REQUEST_TIMEOUT.min(fence_at - now);
                let renewed = tokio::time::timeout(
                    limit,
                    consulrs::session::renew(&self.client, &held.id, None),
                )
                .await;
                match renewed {
                    Ok(Ok(answer)) if !answer.response.is_empty() => {
                        held.confirmed = now;
                        self.confirm(now);
                        break;
                    }
                    // Consul 1.8 answers 404 for an unknown session; older ones 200 and `[]`.
                    Ok(Ok(_)) => return Loss::Invalidated,
                    Ok(Err(e)) if is_status(&e, 404) => return Loss::Invalidated,
                    Ok(Err(e)) => {
                        tracing::warn!(
                            %instance,
                            session = %held.id,
                            error = %describe(&e),
                            "renewing the consul lock session failed; retrying",
                        );
                    }
                    Err(_) => {
                        tracing::warn!(
                            %instance,
                            session = %held.id,
                            timeout = ?limit,
                            "renewing the consul lock session timed out; retrying",
                        );
                    }
                }
                let retry_at = (Instant::now() + RENEW_RETRY).min(fence_at);
                tokio::time::sleep_until(retry_at).await;
            }
        }
    }
}

fn parse_kv_answer(
    operation: &'static str,
    answer: RawAnswer,
) -> Result<KvRead<KVPair>, CoordinationError> {
    let index = answer.index.ok_or_else(|| {
        unavailable(
            operation,
            format!("HTTP {} without an X-Consul-Index header", answer.status),
        )
    })?;
    match answer.status {
        404 => Ok(KvRead {
            index,
            entries: Vec::new(),
        }),
        200 => {
            let entries = serde_json::from_slice(&answer.body)
                .map_err(|e| unavailable(operation, format!("unreadable KV answer: {e}")))?;
            Ok(KvRead { index, entries })
        }
        status => Err(unavailable(
            operation,
            format!(
                "HTTP {status}: {}",
                String::from_utf8_lossy(&answer.body).trim()
            ),
        )),
    }
}

/// The holder recorded in a KV entry, if it has a readable one.
fn holder_of(entry: &KVPair) -> Option<HolderInfo> {
    let value = entry.value.clone()?;
    let bytes: Vec<u8> = match value.try_into() {
        Ok(bytes) => bytes,
        Err(e) => {
            tracing::warn!(key = %entry.key, error = %describe(&e), "lock value is not base64");
            return None;
        }
    };
    match serde_json::from_slice(&bytes) {
        Ok(holder) => Some(holder),
        Err(e) => {
            tracing::warn!(key = %entry.key, error = %e, "lock value is not a HolderInfo");
            None
        }
    }
}

/// A live session as the renew task tracks it.
struct Held {
    id: String,
    /// Send time of the last request Consul confirmed the session with.
    confirmed: Instant,
}

enum Loss {
    /// Consul says the session no longer exists.
    Invalidated,
    /// No renew was confirmed for a whole TTL.
    Unreachable,
}

/// The renew task: keeps the session alive, and replaces it when it is lost.
async fn run_renewer(shared: Arc<Shared>, first: Held) {
    let instance = shared.config.instance.clone();
    let ttl = shared.config.session_ttl;
    let mut held = first;
    // Sessions given up while Consul was unreachable: destroyed once it answers again, so
    // their keys go now rather than when Consul's own timer (up to 2×TTL) fires.
    let mut abandoned: Vec<String> = Vec::new();
    loop {
        match shared.keep_alive(&mut held).await {
            Loss::Invalidated => {
                tracing::info!(
                    %instance,
                    session = %held.id,
                    "consul lock session invalidated; creating a new one",
                );
                shared.set_state(SessionState::Lost {
                    reason: "session invalidated".into(),
                });
            }
            Loss::Unreachable => {
                let silent = held.confirmed.elapsed();
                let since = SystemTime::now()
                    .checked_sub(silent)
                    .unwrap_or(SystemTime::UNIX_EPOCH);
                let since = humantime::format_rfc3339_seconds(since);
                tracing::warn!(
                    %instance,
                    session = %held.id,
                    ?silent,
                    ?ttl,
                    "consul unreachable for a whole session TTL; every lock is void (self-fence)",
                );
                shared.set_state(SessionState::Lost {
                    reason: format!(
                        "consul unreachable since {since} (no renew confirmed for {silent:?}, \
                         session TTL {ttl:?})"
                    ),
                });
                abandoned.push(held.id.clone());
            }
        }
        held = shared.create_session_until_done().await;
        for old in std::mem::take(&mut abandoned) {
            let destroyed = bounded(
                "destroy abandoned session",
                consulrs::session::delete(&shared.client, &old, None),
            )
            .await;
            if let Err(error) = destroyed {
                tracing::warn!(
                    %instance,
                    session = %old,
                    %error,
                    "could not destroy an abandoned session; it expires by itself",
                );
            }
        }
        shared.confirm(held.confirmed);
        tracing::info!(%instance, session = %held.id, "consul lock session recovered");
        shared.set_state(SessionState::Live {
            id: held.id.clone(),
        });
    }
}

impl ConsulLocks {
    /// Validates `config`, creates this instance's session and starts renewing it.
    pub async fn connect(config: ConsulLockConfig) -> Result<ConsulLocks, CoordinationError> {
        config
            .validate()
            .map_err(|e| unavailable("connect (invalid configuration)", e.to_string()))?;
        // TLS settings come from Consul's usual environment variables (CONSUL_CACERT, ...);
        // the address and the token only from the config, which is the source of truth.
        let mut settings = ConsulClientSettingsBuilder::default()
            .address(config.address.trim_end_matches('/'))
            .build()
            .map_err(|e| unavailable("connect (client settings)", e.to_string()))?;
        settings.token = config.token.clone();
        let client = ConsulClient::new(settings)
            .map_err(|e| unavailable("connect (client)", describe(&e)))?;
        let (state, _) = watch::channel(SessionState::Lost {
            reason: "session not created yet".into(),
        });
        let shared = Arc::new(Shared {
            client,
            config,
            state,
            last_confirmed: Mutex::new(None),
            poke: Notify::new(),
            refused: Mutex::new(HashMap::new()),
        });
        let sent = Instant::now();
        let id = bounded("connect (create session)", shared.create_session()).await?;
        shared.confirm(sent);
        tracing::info!(
            instance = %shared.config.instance,
            session = %id,
            ttl = ?shared.config.session_ttl,
            lock_delay = ?shared.config.lock_delay,
            "created consul lock session"
        );
        shared.set_state(SessionState::Live { id: id.clone() });
        let renewer = tokio::spawn(run_renewer(
            shared.clone(),
            Held {
                id,
                confirmed: sent,
            },
        ));
        Ok(ConsulLocks {
            shared,
            renewer: Mutex::new(Some(renewer)),
        })
    }

    /// The send time of the last renew Consul confirmed; the session is self-fenced once a
    /// whole `session_ttl` has passed since.
    pub fn last_confirmed(&self) -> Option<Instant> {
        *lock(&self.shared.last_confirmed)
    }

    /// The configuration this backend runs with.
    pub fn config(&self) -> &ConsulLockConfig {
        &self.shared.config
    }

    fn note_refused(&self, key: &LockKey) {
        let window = self.shared.config.lock_delay.max(LOCK_DELAY_POLL_MIN);
        lock(&self.shared.refused).insert(key.clone(), Instant::now() + window);
    }

    /// How long a wait on `key` may block: see `wait_for_change`.
    fn wait_limit(&self, key: &LockKey, timeout: Duration) -> Duration {
        let mut refused = lock(&self.shared.refused);
        match refused
            .get(key)
            .map(|until| until.checked_duration_since(Instant::now()))
        {
            Some(Some(left)) => timeout.min(left),
            Some(None) => {
                refused.remove(key);
                timeout
            }
            None => timeout,
        }
    }
}

impl Drop for ConsulLocks {
    fn drop(&mut self) {
        // Without `shutdown` the session is left to expire (up to 2×TTL), like a crash; the
        // renew task must not keep it alive for a backend nobody holds.
        let renewer = self
            .renewer
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(task) = renewer.take() {
            task.abort();
        }
    }
}

#[async_trait]
impl LockBackend for ConsulLocks {
    /// Index scheme: the topic prefix is read *before* the acquire, and its `X-Consul-Index`
    /// (the highest write index under the prefix, tombstones included, or the KV table's
    /// index when the prefix was never written) is what `Busy` carries. A release after that
    /// read is a write under the prefix with a higher index, so a `wait_for_change` on that
    /// index returns as soon as it happens, however the release and the failed acquire
    /// interleave. An index read *after* the failed acquire could already include the release
    /// and the waiter would sleep through it; an index of the key alone (its `ModifyIndex`)
    /// would be below writes to sibling partitions and make every wait return at once. A
    /// stale (older) index only costs a spurious wake-up.
    async fn try_acquire(
        &self,
        key: &LockKey,
        holder: &HolderInfo,
    ) -> Result<Acquisition, CoordinationError> {
        let shared = &*self.shared;
        let session = shared.live_session()?;
        let path = key.path(shared.prefix());
        let before = shared
            .read_kv(
                "try_acquire (read topic)",
                &key.topic_prefix(shared.prefix()),
                true,
                None,
            )
            .await?;
        let index = before.index;
        let current = before.entries.into_iter().find(|e| e.key == path);

        // Re-acquire: we hold it already. A PUT `?acquire` by the same session would succeed
        // but rewrite the key, moving its ModifyIndex and so voiding the token (and the
        // `?cas` release) of the grant already handed out. Confirm with a consistent read
        // and return that grant's token without writing; the recorded holder stays too.
        if current
            .as_ref()
            .is_some_and(|e| e.session.as_deref() == Some(session.as_str()))
        {
            let confirmed = shared
                .read_key(
                    "try_acquire (confirm own lock)",
                    &path,
                    Some(ConsistencyMode::CONSISTENT),
                )
                .await?;
            if let Some(entry) = confirmed.filter(|e| e.session.as_deref() == Some(&session)) {
                return Ok(Acquisition::Acquired(LockGrant::new(
                    key.clone(),
                    FencingToken(entry.modify_index),
                    session,
                )));
            }
        }

        let mut request = SetKeyRequest::builder();
        request.acquire(session.as_str());
        let acquired = match tokio::time::timeout(
            REQUEST_TIMEOUT,
            consulrs::kv::set_json(&shared.client, &path, holder, Some(&mut request)),
        )
        .await
        {
            Ok(Ok(answer)) => answer.response,
            Ok(Err(ClientError::APIError {
                code: 500,
                message: Some(message),
            })) if message.contains("invalid session") => {
                // Consul dropped the session before the renew task noticed: have it renew
                // now, which finds out and starts the recovery.
                shared.poke.notify_one();
                return Err(CoordinationError::NoSession {
                    reason: format!("consul rejected session {session}: {}", message.trim()),
                });
            }
            Ok(Err(e)) => return Err(unavailable("try_acquire (acquire)", describe(&e))),
            Err(_) => {
                return Err(unavailable(
                    "try_acquire (acquire)",
                    format!("no answer within {REQUEST_TIMEOUT:?}"),
                ))
            }
        };

        if acquired {
            // The acquire's own Raft index is the token: read it back consistently, so it
            // is the committed value (we never write the key again while holding it).
            let entry = shared
                .read_key(
                    "try_acquire (read grant)",
                    &path,
                    Some(ConsistencyMode::CONSISTENT),
                )
                .await?;
            return match entry {
                Some(entry) if entry.session.as_deref() == Some(&session) => {
                    lock(&shared.refused).remove(key);
                    Ok(Acquisition::Acquired(LockGrant::new(
                        key.clone(),
                        FencingToken(entry.modify_index),
                        session,
                    )))
                }
                other => {
                    shared.poke.notify_one();
                    Err(unavailable(
                        "try_acquire (read grant)",
                        format!(
                            "{path} was acquired but is now held by {:?}; session {session} \
                             was probably invalidated",
                            other.and_then(|e| e.session)
                        ),
                    ))
                }
            };
        }

        // Busy. The holder seen before the attempt is the one that refused us, unless the key
        // was free then: read it again.
        let other = match current.filter(|e| e.session.is_some()) {
            Some(entry) => Some(entry),
            None => shared
                .read_key("try_acquire (read holder)", &path, None)
                .await?
                .filter(|e| e.session.is_some()),
        };
        let holder = match &other {
            Some(entry) => holder_of(entry),
            None => {
                // Free yet refused: the lock-delay of a session invalidated a moment ago (or a
                // release that raced the re-read). Nothing is written when the delay ends, so
                // remember it and keep waits short (see `wait_for_change`).
                self.note_refused(key);
                None
            }
        };
        Ok(Acquisition::Busy { holder, index })
    }

    async fn release(&self, grant: LockGrant) -> Result<(), CoordinationError> {
        // `?cas=<token>` deletes the key only if it was not written since our acquire (we
        // never write it while holding it), so a key lost and taken by someone else since is
        // never touched. An explicit delete sets no lock-delay: a successor can take it now.
        let path = grant.key().path(self.shared.prefix());
        let mut request = DeleteKeyRequest::builder();
        request.cas(grant.token().0);
        let deleted = consulrs::kv::delete(&self.shared.client, &path, Some(&mut request));
        match tokio::time::timeout(REQUEST_TIMEOUT, deleted).await {
            Ok(Ok(answer)) => {
                if !answer.response {
                    tracing::debug!(
                        key = %path,
                        token = %grant.token(),
                        "lock was already lost before its release",
                    );
                }
                Ok(())
            }
            Ok(Err(e)) if is_status(&e, 404) => Ok(()),
            Ok(Err(e)) => Err(unavailable("release", describe(&e))),
            Err(_) => Err(unavailable(
                "release",
                format!("no answer within {REQUEST_TIMEOUT:?}"),
            )),
        }
    }

    /// A blocking query on the topic prefix (`?keys`, so no values travel). Consul's `wait`
    /// is set to `timeout × 16/17` (at least 1 s), so that with its jitter of up to `wait/16`
    /// the answer still comes within `timeout`; the local limit only catches a dead
    /// connection. The index returned is Consul's; it may be lower than `index` (Consul
    /// reaped tombstones, or nothing changed under the topic since `index`, which was a
    /// higher index from elsewhere): per Consul's rules that is simply the next index to
    /// wait on.
    ///
    /// After a `Busy` without holder (a free key refused under lock-delay, which no write
    /// ends) the wait is cut to the rest of the lock-delay window, so the caller retries when
    /// the key becomes acquirable instead of at its own timeout.
    async fn wait_for_change(
        &self,
        key: &LockKey,
        index: u64,
        timeout: Duration,
    ) -> Result<u64, CoordinationError> {
        const OPERATION: &str = "wait_for_change";
        let timeout = self.wait_limit(key, timeout);
        let server_wait = (timeout
            .mul_f64(f64::from(JITTER_DIVISOR) / f64::from(JITTER_DIVISOR + 1)))
        .max(MIN_SERVER_WAIT);
        let request = ReadKeysRequest {
            features: Some(Features {
                blocking: Some(Blocking {
                    index,
                    wait: Some(go_duration(server_wait)),
                }),
                ..Features::default()
            }),
            key: key.topic_prefix(self.shared.prefix()),
            keys: true,
            ..ReadKeysRequest::default()
        };
        let short = timeout < MIN_SERVER_WAIT;
        let limit = if short {
            timeout
        } else {
            server_wait + server_wait / JITTER_DIVISOR + REQUEST_TIMEOUT
        };
        let answer = match tokio::time::timeout(limit, self.shared.send_raw(request)).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(e)) => return Err(unavailable(OPERATION, e)),
            // Consul's shortest wait is longer than the caller's: its timeout is the answer.
            Err(_) if short => return Ok(index),
            Err(_) => {
                return Err(unavailable(
                    OPERATION,
                    format!("no answer within {limit:?}"),
                ))
            }
        };
        let index_header = answer.index;
        match answer.status {
            200 | 404 => index_header.ok_or_else(|| {
                unavailable(
                    OPERATION,
                    format!("HTTP {} without X-Consul-Index", answer.status),
                )
            }),
            status => Err(unavailable(
                OPERATION,
                format!(
                    "HTTP {status}: {}",
                    String::from_utf8_lossy(&answer.body).trim()
                ),
            )),
        }
    }

    async fn list(&self, group: Option<&str>) -> Result<Vec<HeldLock>, CoordinationError> {
        let prefix = self.shared.prefix();
        let path = match group {
            Some(group) => format!("{prefix}/{group}/"),
            None => format!("{prefix}/"),
        };
        let read = self.shared.read_kv("list", &path, true, None).await?;
        let mut held: Vec<HeldLock> = read
            .entries
            .iter()
            .filter(|e| e.session.is_some())
            .filter_map(|entry| {
                let Some(key) = LockKey::from_path(prefix, &entry.key) else {
                    tracing::warn!(
                        key = %entry.key,
                        "ignoring a locked key that is not <group>/<topic>/<partition>",
                    );
                    return None;
                };
                Some(HeldLock {
                    key,
                    token: FencingToken(entry.modify_index),
                    holder: holder_of(entry)?,
                })
            })
            .collect();
        held.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(held)
    }

    fn session_state(&self) -> watch::Receiver<SessionState> {
        self.shared.state.subscribe()
    }

    async fn ping(&self) -> Result<(), CoordinationError> {
        let middleware = self.shared.client.middle(None);
        let answer = bounded("ping", async {
            StatusLeader
                .with_middleware(&middleware)
                .exec(self.shared.client.http())
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

    async fn shutdown(&self) {
        let renewer = lock(&self.renewer).take();
        if let Some(task) = renewer {
            task.abort();
            // Wait until it has really stopped, so it cannot publish a new session after the
            // state below. (A session it was creating at that moment expires by its TTL.)
            let _ = task.await;
        }
        let previous = self.shared.state.send_replace(SessionState::Lost {
            reason: "shut down".into(),
        });
        if let SessionState::Live { id } = previous {
            self.shared.end_session(&id).await;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn valid() -> ConsulLockConfig {
        ConsulLockConfig {
            instance: "gw-1".into(),
            ..ConsulLockConfig::default()
        }
    }

    fn rejected(config: ConsulLockConfig) -> String {
        config
            .validate()
            .expect_err("should be rejected")
            .to_string()
    }

    #[test]
    fn defaults_are_valid_once_the_instance_is_named() {
        valid().validate().unwrap();
        assert!(rejected(ConsulLockConfig::default()).contains("instance"));
        let d = ConsulLockConfig::default();
        assert_eq!(d.renew_interval, d.session_ttl / 3);
        assert_eq!(d.prefix, "kafka-lease");
    }

    #[test]
    fn out_of_range_values_name_the_setting_and_the_range() {
        let e = rejected(ConsulLockConfig {
            session_ttl: Duration::from_secs(5),
            ..valid()
        });
        assert!(
            e.contains("session_ttl = 5s") && e.contains("10s ..= 24h"),
            "{e}"
        );
        let e = rejected(ConsulLockConfig {
            session_ttl: Duration::from_secs(25 * 3600),
            ..valid()
        });
        assert!(e.contains("session_ttl"), "{e}");
        let e = rejected(ConsulLockConfig {
            lock_delay: Duration::from_secs(61),
            ..valid()
        });
        assert!(
            e.contains("lock_delay = 61s") && e.contains("0s ..= 60s"),
            "{e}"
        );
        let e = rejected(ConsulLockConfig {
            renew_interval: Duration::from_secs(6),
            ..valid()
        });
        assert!(e.contains("renew_interval = 6s") && e.contains("5s"), "{e}");
        let e = rejected(ConsulLockConfig {
            renew_interval: Duration::ZERO,
            ..valid()
        });
        assert!(e.contains("renew_interval"), "{e}");
        ConsulLockConfig {
            lock_delay: Duration::ZERO,
            ..valid()
        }
        .validate()
        .unwrap();
    }

    #[test]
    fn addresses_prefixes_and_tokens_are_checked() {
        for bad in [
            "127.0.0.1:8500",
            "localhost:8500",
            "http://",
            "ftp://x",
            "http://h/p",
        ] {
            let e = rejected(ConsulLockConfig {
                address: bad.into(),
                ..valid()
            });
            assert!(e.contains("address"), "{bad}: {e}");
        }
        ConsulLockConfig {
            address: "https://consul.example:8501/".into(),
            ..valid()
        }
        .validate()
        .unwrap();
        for bad in ["", "/abs", "a//b", "a/../b", "sp ace", "a/./b"] {
            let e = rejected(ConsulLockConfig {
                prefix: bad.into(),
                ..valid()
            });
            assert!(e.contains("prefix"), "{bad:?}: {e}");
        }
        ConsulLockConfig {
            prefix: "team/kafka-lease_1/".into(),
            ..valid()
        }
        .validate()
        .unwrap();
        let e = rejected(ConsulLockConfig {
            token: Some("a b".into()),
            ..valid()
        });
        assert!(e.contains("token") && !e.contains("a b"), "{e}");
    }

    #[test]
    fn durations_are_written_the_way_go_parses_them() {
        assert_eq!(go_duration(Duration::from_secs(10)), "10s");
        assert_eq!(go_duration(Duration::from_millis(1500)), "1500ms");
        assert_eq!(go_duration(Duration::ZERO), "0s");
    }

    #[tokio::test]
    async fn connect_refuses_an_invalid_config_without_touching_the_network() {
        let e = ConsulLocks::connect(ConsulLockConfig::default())
            .await
            .unwrap_err();
        assert!(e.to_string().contains("instance"), "{e}");
    }
}
