//! The Consul [`LockBackend`]: partition locks are KV keys acquired with one session per
//! gateway instance, kept alive (and replaced when lost) by a background renew task.
//!
//! Layout: `<prefix>/<group>/<topic>/<partition>`, value = [`HolderInfo`] as JSON, held with
//! `?acquire=<session>`. The session has `Behavior = delete`, so the keys of a dead instance
//! vanish instead of lingering unlocked. The fencing token of a grant is the key's
//! `ModifyIndex` right after the acquire: a Raft index, so it grows across holders even though
//! `delete` behaviour recreates keys (whose `LockIndex` restarts at 1).
//!
//! # Sessions: check-bound or TTL-only
//! - **Check-bound** ([`ConsulLockConfig::check`] set; needs a Consul agent on the gateway's
//!   host): `connect` registers a service `kafka-lease-<instance>` with the *local* agent,
//!   with a TCP check (`kafka-lease-<instance>-alive`) that the agent runs against the
//!   gateway's gRPC listener every `check.interval`. The session is bound to that check and
//!   to the node's `serfHealth` (`NodeChecks`, `ServiceChecks`). When the gateway process dies
//!   the next check run fails at once (connection refused), Consul invalidates the session,
//!   the keys vanish, and after `lock_delay` another gateway's waiter takes them: a crash
//!   moves the partitions after at most `check.interval + lock_delay` (plus the waiter's
//!   reaction). A process that hangs but keeps its socket open (SIGSTOP) still passes a TCP
//!   check; its session then ends by TTL, like a TTL-only one. The registration is
//!   deregistered at `shutdown`, and `connect` deregisters any earlier registration of a dead
//!   process with the same service id or the same check address (a gateway restarted on its
//!   port faster than one check interval would otherwise keep the old check passing and the
//!   old session, and its locks, alive until its TTL). After losing its session the backend
//!   re-registers the check only if the agent no longer has it: a check that is registered
//!   but critical (the agent cannot reach the listener) makes Consul refuse new sessions
//!   until it passes again, rather than handing out sessions the next check run would end.
//! - **TTL-only** (no `check`): the session is created with *no* checks at all
//!   (`NodeChecks: []`), so no health check ends it; a crash then frees the keys after at
//!   most `2 × session_ttl + lock_delay` (Consul arms the expiry timer at twice the TTL):
//!   21.5 s with the defaults. It can still end at any moment for other reasons (its node is
//!   deregistered: an agent restart with `leave_on_terminate`, `force-leave`, reaping; or an
//!   operator destroys it), which is why its fence is the same as a check-bound session's.
//!
//! # Self-fencing
//! The timing invariant is stated once, in docs/ARCHITECTURE.md ("Self-fencing"); this
//! backend implements it. In short: `valid_until = S + lock_delay - FENCE_MARGIN`, where `S`
//! is the send time of the last renew (or create) Consul confirmed, for every kind of session.
//! [`LockBackend::valid_until`] returns it while the session is live, every side effect checks
//! it synchronously, and the renew task declares the session [`SessionState::Lost`] when it
//! passes without a newer confirmation. [`ConsulLockConfig::validate`] refuses settings that
//! break it.
//!
//! When Consul answers again after a self-fence, the backend destroys the old session (best
//! effort) and creates a new one, since it cannot know what became of the old locks.
//!
//! # Reads that consulrs cannot express
//! consulrs turns every non-2xx answer into an error and drops its headers, but Consul
//! answers a read of an empty prefix (exactly what a waiter sees after the last holder of a
//! topic released) with 404 *and* a meaningful `X-Consul-Index`. Without that index a waiter
//! would either spin or sleep through the change, so KV reads go through consulrs' own request
//! types and middleware (`rustify::Endpoint`) and read the raw response, whatever its status.
//! Writes and session calls use the plain consulrs functions, except the service registration:
//! consulrs serializes it with an `Ns` field that Consul 1.8 rejects ("unknown field").

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use consulrs::api::features::{Blocking, ConsistencyMode, FeaturedEndpoint, Features};
use consulrs::api::kv::common::KVPair;
use consulrs::api::kv::requests::{
    DeleteKeyRequest, ReadKeyRequest, ReadKeysRequest, SetKeyRequest,
};
use consulrs::api::session::common::ServiceCheck;
use consulrs::api::session::requests::CreateSessionRequest;
use consulrs::client::{Client as _, ConsulClient, ConsulClientSettingsBuilder};
use consulrs::error::ClientError;
use futures::stream::{FuturesUnordered, StreamExt as _};
use rustify::client::Client as _;
use rustify::endpoint::{Endpoint, MiddleWare as _};
use rustify::enums::{RequestMethod, RequestType, ResponseType};
use serde::Serialize;
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
/// The shortest lock-delay allowed: the fence window is `lock_delay - FENCE_MARGIN`, and must
/// leave room for three renews.
const LOCK_DELAY_MIN: Duration = Duration::from_secs(1);
/// What the self-fence deadline keeps in hand before the earliest moment another instance
/// could acquire one of this instance's keys (see the module docs): the time from the
/// synchronous deadline check to the side effect, and clock-rate differences between hosts.
pub const FENCE_MARGIN: Duration = Duration::from_millis(250);
/// The defaults of [`ConsulLockConfig`].
pub const DEFAULT_SESSION_TTL: Duration = Duration::from_secs(10);
pub const DEFAULT_LOCK_DELAY: Duration = Duration::from_millis(1500);
/// The defaults of [`SessionCheck`].
pub const DEFAULT_CHECK_INTERVAL: Duration = Duration::from_secs(1);
pub const DEFAULT_CHECK_TIMEOUT: Duration = Duration::from_secs(1);
pub const DEFAULT_DEREGISTER_AFTER: Duration = Duration::from_secs(60);
/// Consul runs no check more often than this (it raises shorter intervals to it).
const CHECK_INTERVAL_MIN: Duration = Duration::from_secs(1);
/// Consul's reaper ignores `DeregisterCriticalServiceAfter` values below this.
const DEREGISTER_AFTER_MIN: Duration = Duration::from_secs(60);
/// The service name every gateway registers under (check-bound sessions only).
pub const SERVICE_NAME: &str = "kafka-lease";
/// The service meta keys: the instance, and the address the check dials.
const META_INSTANCE: &str = "instance";
const META_CHECK_TCP: &str = "check_tcp";
/// How long an ordinary (non-blocking) request may take before it counts as a failure. The
/// HTTP client consulrs builds has no timeout at all, so every call is bounded here.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
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
/// How soon to try again a key still refused right after its expected lock-delay end.
const LOCK_DELAY_REPOLL: Duration = Duration::from_millis(100);

/// How to reach Consul and how this instance's session behaves. The timing settings are
/// bound by the invariant in the module docs; [`ConsulLockConfig::validate`] enforces it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConsulLockConfig {
    /// The agent's HTTP API, e.g. `http://127.0.0.1:8500`. With `check` set it must be the
    /// agent on the gateway's own host: that agent runs the check.
    pub address: String,
    /// ACL token (needs `key:write` on the prefix and `session:write` on the node; with
    /// `check`, also `service:write` on `kafka-lease`).
    pub token: Option<String>,
    /// The KV prefix every lock lives under.
    pub prefix: String,
    /// This gateway instance's name: the session is named `kafka-lease <instance>`, the
    /// service (with `check`) `kafka-lease-<instance>`.
    pub instance: String,
    /// The session TTL (Consul allows 10 s ..= 24 h): how long a gateway that stopped
    /// renewing (crashed without a check, or hung) keeps its keys, up to twice this.
    pub session_ttl: Duration,
    /// How long Consul keeps an invalidated session's keys unlockable (1 s ..= 60 s). The
    /// self-fence window is `lock_delay - FENCE_MARGIN`.
    pub lock_delay: Duration,
    /// How often the session is renewed. `None` (the default) derives it:
    /// `fence_window / 4`, so three renews can fail before the fence. See
    /// [`ConsulLockConfig::renew_interval`].
    pub renew_interval: Option<Duration>,
    /// Bind the session to a TCP check the local agent runs against the gateway, for crash
    /// failover in about `check.interval + lock_delay`. `None`: a TTL-only session.
    pub check: Option<SessionCheck>,
}

/// The health check a check-bound session hangs on: the local Consul agent dials `tcp_addr`
/// every `interval`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionCheck {
    /// `host:port` the local agent dials: the gateway's gRPC listener.
    pub tcp_addr: String,
    /// How often the agent dials (Consul's minimum, and the default: 1 s).
    pub interval: Duration,
    /// How long one dial may take (default 1 s). A refused connection fails at once.
    pub timeout: Duration,
    /// How long the check may stay critical before the agent drops the registration
    /// (default 60 s, Consul's minimum): cleans up after a crashed gateway.
    pub deregister_after: Duration,
}

impl SessionCheck {
    /// A check dialing `tcp_addr`, with the default timings.
    pub fn new(tcp_addr: impl Into<String>) -> Self {
        Self {
            tcp_addr: tcp_addr.into(),
            interval: DEFAULT_CHECK_INTERVAL,
            timeout: DEFAULT_CHECK_TIMEOUT,
            deregister_after: DEFAULT_DEREGISTER_AFTER,
        }
    }

    /// A check for a gateway listening on `listen`: an unspecified address (`0.0.0.0`, `[::]`)
    /// is dialed on the loopback of its family (`127.0.0.1`, `[::1]`), since the agent runs
    /// on the same host.
    pub fn for_listener(listen: SocketAddr) -> Self {
        let ip = match listen.ip() {
            IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
            ip => ip,
        };
        Self::new(SocketAddr::new(ip, listen.port()).to_string())
    }
}

impl Default for ConsulLockConfig {
    /// Every setting but `instance`, which must be set (`validate` insists). TTL-only: a
    /// check needs the gateway's address.
    fn default() -> Self {
        Self {
            address: "http://127.0.0.1:8500".into(),
            token: None,
            prefix: "kafka-lease".into(),
            instance: String::new(),
            session_ttl: DEFAULT_SESSION_TTL,
            lock_delay: DEFAULT_LOCK_DELAY,
            renew_interval: None,
            check: None,
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

fn out_of_range(setting: &'static str, value: Duration, allowed: String) -> ConsulConfigError {
    ConsulConfigError::OutOfRange {
        setting,
        value: format!("{value:?}"),
        allowed,
    }
}

/// A name made only of `[A-Za-z0-9._-]`: safe in a URL path and a Consul service id.
fn is_plain_name(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
}

impl ConsulLockConfig {
    /// Checks every setting against what Consul and this backend accept, including the
    /// self-fencing invariant (see the module docs).
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
        let segment_ok = |s: &str| is_plain_name(s) && s != "." && s != "..";
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
            return Err(out_of_range(
                "session_ttl",
                self.session_ttl,
                "10s ..= 24h (Consul's limits)".into(),
            ));
        }
        if !(LOCK_DELAY_MIN..=LOCK_DELAY_MAX).contains(&self.lock_delay) {
            return Err(out_of_range(
                "lock_delay",
                self.lock_delay,
                "1s ..= 60s (the self-fence window is lock_delay - 250ms, and Consul allows \
                 at most 60s)"
                    .into(),
            ));
        }
        if let Some(check) = &self.check {
            self.validate_check(check)?;
        }
        let window = self.fence_window();
        let renew = self.renew_interval();
        let max_renew = (window / 3).min(self.session_ttl / 2);
        if renew.is_zero() || renew > max_renew {
            return Err(out_of_range(
                "renew_interval",
                renew,
                format!(
                    "more than 0s ..= min(fence_window / 3, session_ttl / 2) = {max_renew:?}, \
                     where fence_window = lock_delay - {FENCE_MARGIN:?} = {window:?} (renew_interval * 3 <= \
                     fence_window: at least three renews before the self-fence)"
                ),
            ));
        }
        Ok(())
    }

    fn validate_check(&self, check: &SessionCheck) -> Result<(), ConsulConfigError> {
        if !is_plain_name(&self.instance) {
            return Err(ConsulConfigError::Invalid {
                setting: "instance",
                value: self.instance.clone(),
                reason: "must be [A-Za-z0-9._-] with a check: it is part of the Consul \
                         service id",
            });
        }
        let port_ok = check.tcp_addr.rsplit_once(':').is_some_and(|(host, port)| {
            !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p != 0)
        });
        if !port_ok || check.tcp_addr.contains(['/', ' ']) {
            return Err(ConsulConfigError::Invalid {
                setting: "check.tcp_addr",
                value: check.tcp_addr.clone(),
                reason: "must be host:port (the gateway's listener as the local agent \
                         reaches it, e.g. 127.0.0.1:50051)",
            });
        }
        if check.interval < CHECK_INTERVAL_MIN {
            return Err(out_of_range(
                "check.interval",
                check.interval,
                "1s or more (Consul's minimum)".into(),
            ));
        }
        if check.timeout < Duration::from_millis(1) || check.timeout > check.interval {
            return Err(out_of_range(
                "check.timeout",
                check.timeout,
                format!("1ms ..= check.interval = {:?}", check.interval),
            ));
        }
        if check.deregister_after < DEREGISTER_AFTER_MIN {
            return Err(out_of_range(
                "check.deregister_after",
                check.deregister_after,
                "60s or more (Consul's minimum)".into(),
            ));
        }
        Ok(())
    }

    /// How long after the send time of its last confirmed renew this instance may act on
    /// its grants: `lock_delay - FENCE_MARGIN`, whatever the session's checks (zero if that
    /// would be negative; `validate` refuses such settings). Any session can be invalidated
    /// at any moment after its last confirmation (a check, its node's deregistration, a
    /// destroy), and its keys are free for others `lock_delay` after that; see "Self-fencing"
    /// in docs/ARCHITECTURE.md.
    pub fn fence_window(&self) -> Duration {
        self.lock_delay.saturating_sub(FENCE_MARGIN)
    }

    /// The renew interval in effect: the configured one, or `fence_window / 4`.
    pub fn renew_interval(&self) -> Duration {
        self.renew_interval
            .unwrap_or_else(|| self.fence_window() / 4)
    }

    /// The Consul service id registered for a check-bound session.
    pub fn service_id(&self) -> String {
        format!("{SERVICE_NAME}-{}", self.instance)
    }

    /// The id of the check a check-bound session is bound to.
    pub fn check_id(&self) -> String {
        format!("{SERVICE_NAME}-{}-alive", self.instance)
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
    /// `config.fence_window()`.
    fence_window: Duration,
    state: watch::Sender<SessionState>,
    /// The last renew (or create) Consul confirmed: its session and its send time `S`.
    last_confirmed: Mutex<Option<Confirmation>>,
    /// Asks the renew task to renew now (an acquire was told the session is invalid).
    poke: Notify,
    /// Keys found free but refused (see `ConsulLocks::note_refused`).
    refused: Mutex<HashMap<LockKey, Refusal>>,
}

/// When a key found free but refused is expected to become acquirable.
#[derive(Clone, Copy, Debug)]
struct Refusal {
    /// When to try again.
    until: Instant,
    /// The end of the lock-delay window first noted for it.
    expected_end: Instant,
}

/// A confirmation that a session was valid: Consul answered a renew (or the create) of
/// `session` that was sent at `sent`.
#[derive(Clone, Debug)]
struct Confirmation {
    session: String,
    sent: Instant,
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

/// `PUT /v1/agent/service/register` with exactly the fields set here: consulrs' own request
/// type also sends `"Ns": null`, which Consul 1.8 refuses ("unknown field").
#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct RegisterService {
    #[serde(rename = "ID")]
    id: String,
    name: &'static str,
    meta: HashMap<&'static str, String>,
    check: TcpCheck,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct TcpCheck {
    #[serde(rename = "CheckID")]
    check_id: String,
    name: String,
    #[serde(rename = "TCP")]
    tcp: String,
    interval: String,
    timeout: String,
    deregister_critical_service_after: String,
    /// `passing`, so that the session can be bound to the check at once instead of after its
    /// first run (Consul refuses to bind a session to a critical check).
    status: &'static str,
}

impl RegisterService {
    fn new(config: &ConsulLockConfig, check: &SessionCheck) -> Self {
        Self {
            id: config.service_id(),
            name: SERVICE_NAME,
            meta: HashMap::from([
                (META_INSTANCE, config.instance.clone()),
                (META_CHECK_TCP, check.tcp_addr.clone()),
            ]),
            check: TcpCheck {
                check_id: config.check_id(),
                name: format!("kafka-lease gateway {} is alive", config.instance),
                tcp: check.tcp_addr.clone(),
                interval: go_duration(check.interval),
                timeout: go_duration(check.timeout),
                deregister_critical_service_after: go_duration(check.deregister_after),
                status: "passing",
            },
        }
    }
}

impl Endpoint for RegisterService {
    type Response = ();
    const REQUEST_BODY_TYPE: RequestType = RequestType::JSON;
    const RESPONSE_BODY_TYPE: ResponseType = ResponseType::JSON;

    fn path(&self) -> String {
        "agent/service/register".into()
    }

    fn method(&self) -> RequestMethod {
        RequestMethod::PUT
    }

    fn body(&self) -> Result<Option<Vec<u8>>, rustify::errors::ClientError> {
        serde_json::to_vec(self)
            .map(Some)
            .map_err(|e| rustify::errors::ClientError::DataParseError { source: e.into() })
    }
}

impl FeaturedEndpoint for RegisterService {
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

    /// Records that Consul confirmed `session` with a request sent at `sent`. Only moves the
    /// confirmation forward.
    fn confirm(&self, session: &str, sent: Instant) {
        let mut confirmed = lock(&self.last_confirmed);
        let newer = confirmed
            .as_ref()
            .is_none_or(|c| c.session != session || c.sent < sent);
        if newer {
            *confirmed = Some(Confirmation {
                session: session.to_string(),
                sent,
            });
        }
    }

    /// `S + fence_window` for the live session, `None` when there is none.
    fn valid_until(&self) -> Option<Instant> {
        let state = self.state.borrow();
        let SessionState::Live { id } = &*state else {
            return None;
        };
        let confirmed = lock(&self.last_confirmed);
        confirmed
            .as_ref()
            .filter(|c| c.session == *id)
            .map(|c| c.sent + self.fence_window)
    }

    /// Registers (or re-registers, resetting its check to passing) this instance's service
    /// and TCP check with the local agent.
    async fn register_service(&self, check: &SessionCheck) -> Result<(), CoordinationError> {
        const OPERATION: &str = "register service check";
        let answer = tokio::time::timeout(
            REQUEST_TIMEOUT,
            self.send_raw(RegisterService::new(&self.config, check)),
        )
        .await
        .map_err(|_| unavailable(OPERATION, format!("no answer within {REQUEST_TIMEOUT:?}")))?
        .map_err(|e| unavailable(OPERATION, e))?;
        if answer.status == 200 {
            Ok(())
        } else {
            Err(unavailable(
                OPERATION,
                format!(
                    "HTTP {}: {}",
                    answer.status,
                    String::from_utf8_lossy(&answer.body).trim()
                ),
            ))
        }
    }

    /// Removes this instance's service (and so its check) from the local agent.
    async fn deregister_service(&self) -> Result<(), CoordinationError> {
        bounded(
            "deregister service check",
            consulrs::service::deregister(&self.client, &self.config.service_id(), None),
        )
        .await
        .map(|_| ())
    }

    /// Deregisters the registrations a dead gateway process left on this agent: one with
    /// this instance's service id (a restart with a fixed instance name), or one whose check
    /// dials the same address (only one process can listen there: this one). Until their
    /// check fails, their sessions, and the locks those hold, stay valid, and a process
    /// restarted on the same port within one check interval keeps the old check passing.
    /// Deregistering removes the check, which invalidates those sessions now.
    async fn remove_stale_registrations(
        &self,
        check: &SessionCheck,
    ) -> Result<(), CoordinationError> {
        let instance = &self.config.instance;
        let ours = self.config.service_id();
        let services = bounded("list services", consulrs::service::list(&self.client, None))
            .await?
            .response;
        for (id, service) in services {
            let meta = service.meta.unwrap_or_default();
            let stale = service.service.as_deref() == Some(SERVICE_NAME)
                && (id == ours || meta.get(META_CHECK_TCP) == Some(&check.tcp_addr));
            if !stale {
                continue;
            }
            tracing::warn!(
                %instance,
                service = %id,
                previous_instance = meta.get(META_INSTANCE).map_or("?", String::as_str),
                check_tcp = %check.tcp_addr,
                "deregistering the registration of an earlier gateway process on this address; \
                 its lock session ends now",
            );
            bounded(
                "deregister stale service",
                consulrs::service::deregister(&self.client, &id, None),
            )
            .await?;
        }
        Ok(())
    }

    /// The local agent's view of this instance's check, for the log after an invalidation.
    async fn check_status(&self) -> String {
        let check_id = self.config.check_id();
        match bounded("list checks", consulrs::check::list(&self.client, None)).await {
            Ok(answer) => match answer.response.get(&check_id) {
                Some(check) => format!(
                    "{}: {}",
                    check.status.as_deref().unwrap_or("?"),
                    check.output.as_deref().unwrap_or("").trim()
                ),
                None => "not registered".into(),
            },
            Err(error) => format!("unknown ({error})"),
        }
    }

    /// Whether the local agent has this instance's check registered.
    async fn check_registered(&self) -> Result<bool, CoordinationError> {
        let checks = bounded("list checks", consulrs::check::list(&self.client, None)).await?;
        Ok(checks.response.contains_key(&self.config.check_id()))
    }

    /// Creates a session, returning its id and the send time of the create request. A
    /// check-bound one first gets its service check registered: always at `connect`
    /// ([`Registration::Always`], fresh and passing), and on recovery only if the agent lost
    /// it ([`Registration::IfMissing`]: an agent restarted without its data, or the
    /// registration reaped after `deregister_after`). A check that is registered but
    /// critical is left alone: Consul refuses the session until the check passes again, and
    /// resetting it to passing would only get a session that the next check run ends.
    async fn open_session(
        &self,
        registration: Registration,
    ) -> Result<(String, Instant), CoordinationError> {
        let mut request = CreateSessionRequest::builder();
        request
            .name(format!("kafka-lease {}", self.config.instance))
            .ttl(go_duration(self.config.session_ttl))
            .lock_delay(go_duration(self.config.lock_delay))
            .behavior("delete");
        match &self.config.check {
            Some(check) => {
                let register = match registration {
                    Registration::Always => true,
                    Registration::IfMissing => !self.check_registered().await?,
                };
                if register {
                    if registration == Registration::IfMissing {
                        tracing::warn!(
                            instance = %self.config.instance,
                            check = %self.config.check_id(),
                            "the local consul agent lost the service check; registering it again",
                        );
                    }
                    self.register_service(check).await?;
                }
                request
                    .node_checks(vec!["serfHealth".to_string()])
                    .service_checks(vec![ServiceCheck {
                        id: Some(self.config.check_id()),
                        namespace: None,
                    }]);
            }
            // No checks at all, not even the node's `serfHealth` (Consul's default), so a
            // flapping gossip link does not end it. The fence does not rely on that: the node's
            // deregistration or a destroy can still end it at any moment.
            None => {
                request.node_checks(Vec::<String>::new());
            }
        }
        let sent = Instant::now();
        let created = bounded(
            "create session",
            consulrs::session::create(&self.client, Some(&mut request)),
        )
        .await?;
        Ok((created.response.id, sent))
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
            match self.open_session(Registration::IfMissing).await {
                Ok((id, sent)) => {
                    return Held {
                        id,
                        confirmed: sent,
                    }
                }
                Err(error) => {
                    tracing::warn!(
                        instance = %self.config.instance,
                        %error,
                        retry_in = ?backoff,
                        "could not create a consul lock session",
                    );
                }
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(CREATE_BACKOFF_MAX);
        }
    }

    /// One renew of `session`: its send time and what Consul said.
    async fn renew_once(&self, session: &str, limit: Duration) -> (Instant, Renewal) {
        let sent = Instant::now();
        let renewed =
            tokio::time::timeout(limit, consulrs::session::renew(&self.client, session, None))
                .await;
        let outcome = match renewed {
            Ok(Ok(answer)) if !answer.response.is_empty() => Renewal::Confirmed,
            // Consul 1.8 answers 404 for an unknown session; older ones 200 and `[]`.
            Ok(Ok(_)) => Renewal::Gone,
            Ok(Err(e)) if is_status(&e, 404) => Renewal::Gone,
            Ok(Err(e)) => Renewal::Failed(describe(&e)),
            Err(_) => Renewal::Failed(format!("no answer within {limit:?}")),
        };
        (sent, outcome)
    }

    /// Renews `held` until it is lost; returns how. A renew goes out every `renew_interval`
    /// (and at once when poked) whether or not the earlier ones have answered, so a slow or
    /// lost request does not hold up the next; each confirmation moves `S` to its own send
    /// time. The session is lost when `S + fence_window` passes.
    async fn keep_alive(&self, held: &mut Held) -> Loss {
        let instance = &self.config.instance;
        let every = self.config.renew_interval();
        // An answer later than this is worthless: it would confirm a deadline already past.
        let limit = REQUEST_TIMEOUT.min(self.fence_window);
        let mut attempts = FuturesUnordered::new();
        let mut next = held.confirmed + every;
        loop {
            let fence_at = held.confirmed + self.fence_window;
            tokio::select! {
                biased;
                Some((sent, outcome)) = attempts.next(), if !attempts.is_empty() => {
                    match outcome {
                        Renewal::Confirmed => {
                            if sent > held.confirmed {
                                held.confirmed = sent;
                                self.confirm(&held.id, sent);
                            }
                        }
                        Renewal::Gone => return Loss::Invalidated,
                        Renewal::Failed(error) => {
                            tracing::warn!(
                                %instance,
                                session = %held.id,
                                %error,
                                fence_in = ?fence_at.saturating_duration_since(Instant::now()),
                                "renewing the consul lock session failed; retrying",
                            );
                        }
                    }
                }
                () = tokio::time::sleep_until(fence_at) => return Loss::Unreachable,
                () = tokio::time::sleep_until(next) => {
                    attempts.push(self.renew_once(&held.id, limit));
                    next = Instant::now() + every;
                }
                () = self.poke.notified() => {
                    attempts.push(self.renew_once(&held.id, limit));
                    next = Instant::now() + every;
                }
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

/// When [`Shared::open_session`] registers the service check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Registration {
    Always,
    IfMissing,
}

/// What one renew found out.
enum Renewal {
    Confirmed,
    /// Consul does not know the session (any more).
    Gone,
    /// No usable answer: unreachable, an error, or too slow.
    Failed(String),
}

enum Loss {
    /// Consul says the session no longer exists.
    Invalidated,
    /// No renew was confirmed for a whole fence window.
    Unreachable,
}

/// The renew task: keeps the session alive, and replaces it when it is lost.
async fn run_renewer(shared: Arc<Shared>, first: Held) {
    let instance = shared.config.instance.clone();
    let window = shared.fence_window;
    let mut held = first;
    // Sessions given up while Consul was unreachable: destroyed once it answers again, so
    // their keys go now rather than when Consul's own timer (up to 2×TTL) fires.
    let mut abandoned: Vec<String> = Vec::new();
    loop {
        match shared.keep_alive(&mut held).await {
            Loss::Invalidated => {
                shared.set_state(SessionState::Lost {
                    reason: "session invalidated".into(),
                });
                let check = match shared.config.check {
                    Some(_) => shared.check_status().await,
                    None => "none (TTL-only session)".into(),
                };
                tracing::warn!(
                    %instance,
                    session = %held.id,
                    %check,
                    "consul lock session invalidated; every lock is void, creating a new session",
                );
            }
            Loss::Unreachable => {
                let silent = held.confirmed.elapsed();
                let since = SystemTime::now()
                    .checked_sub(silent)
                    .unwrap_or(SystemTime::UNIX_EPOCH);
                let since = humantime::format_rfc3339_seconds(since);
                shared.set_state(SessionState::Lost {
                    reason: format!(
                        "consul unreachable since {since} (no renew confirmed for {silent:?}, \
                         fence window {window:?})"
                    ),
                });
                tracing::warn!(
                    %instance,
                    session = %held.id,
                    ?silent,
                    fence_window = ?window,
                    "no renew confirmed for a whole fence window; every lock is void (self-fence)",
                );
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
        shared.confirm(&held.id, held.confirmed);
        tracing::info!(%instance, session = %held.id, "consul lock session recovered");
        shared.set_state(SessionState::Live {
            id: held.id.clone(),
        });
    }
}

impl ConsulLocks {
    /// Validates `config`, registers the service check (if any; after deregistering what a
    /// dead process left on the same address), creates this instance's session and starts
    /// renewing it.
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
            fence_window: config.fence_window(),
            config,
            state,
            last_confirmed: Mutex::new(None),
            poke: Notify::new(),
            refused: Mutex::new(HashMap::new()),
        });
        if let Some(check) = &shared.config.check {
            shared.remove_stale_registrations(check).await?;
        }
        let (id, sent) = match shared.open_session(Registration::Always).await {
            Ok(opened) => opened,
            Err(error) => {
                if shared.config.check.is_some() {
                    let _ = shared.deregister_service().await;
                }
                return Err(error);
            }
        };
        shared.confirm(&id, sent);
        tracing::info!(
            instance = %shared.config.instance,
            session = %id,
            ttl = ?shared.config.session_ttl,
            lock_delay = ?shared.config.lock_delay,
            fence_window = ?shared.fence_window,
            renew_interval = ?shared.config.renew_interval(),
            check = ?shared.config.check.as_ref().map(|c| &c.tcp_addr),
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

    /// The send time `S` of the last renew (or create) Consul confirmed, for whichever
    /// session that was; the session is self-fenced at `S + fence_window`.
    pub fn last_confirmed(&self) -> Option<Instant> {
        lock(&self.shared.last_confirmed).as_ref().map(|c| c.sent)
    }

    /// The configuration this backend runs with.
    pub fn config(&self) -> &ConsulLockConfig {
        &self.shared.config
    }

    /// Notes that `key` was found free but refused: under the lock-delay of a session
    /// invalidated a moment ago, which ends at most `lock_delay` from now. A refusal inside
    /// that window keeps its end; one shortly after it (the estimate was a hair early: the
    /// delay started a moment after the key was seen free, or the leader's clock runs ahead)
    /// polls again in [`LOCK_DELAY_REPOLL`] instead of arming a whole new window.
    fn note_refused(&self, key: &LockKey) {
        let delay = self.shared.config.lock_delay.max(LOCK_DELAY_POLL_MIN);
        let now = Instant::now();
        let mut refused = lock(&self.shared.refused);
        refused.retain(|_, r| now < r.expected_end + delay);
        let refusal = match refused.get(key) {
            Some(r) if r.until > now => *r,
            Some(r) => Refusal {
                until: now + LOCK_DELAY_REPOLL,
                expected_end: r.expected_end,
            },
            None => Refusal {
                until: now + delay,
                expected_end: now + delay,
            },
        };
        refused.insert(key.clone(), refusal);
    }

    /// How long a wait on `key` may block, and whether that was cut short to end with a
    /// lock-delay (see `wait_for_change`).
    fn wait_limit(&self, key: &LockKey, timeout: Duration) -> (Duration, bool) {
        let left = lock(&self.shared.refused)
            .get(key)
            .and_then(|r| r.until.checked_duration_since(Instant::now()))
            .filter(|left| !left.is_zero());
        match left {
            Some(left) if left < timeout => (left, true),
            _ => (timeout, false),
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

    async fn held_grant(&self, key: &LockKey) -> Result<Option<LockGrant>, CoordinationError> {
        let shared = &*self.shared;
        let session = shared.live_session()?;
        let entry = shared
            .read_key(
                "held_grant",
                &key.path(shared.prefix()),
                Some(ConsistencyMode::CONSISTENT),
            )
            .await?;
        Ok(entry
            .filter(|e| e.session.as_deref() == Some(session.as_str()))
            .map(|e| LockGrant::new(key.clone(), FencingToken(e.modify_index), session)))
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
    /// ends) the wait is cut to the rest of the lock-delay window and ends exactly then (not
    /// `× 16/17` early, which would only get refused again), so the caller retries when the
    /// key becomes acquirable instead of at its own timeout.
    async fn wait_for_change(
        &self,
        key: &LockKey,
        index: u64,
        timeout: Duration,
    ) -> Result<u64, CoordinationError> {
        const OPERATION: &str = "wait_for_change";
        let (timeout, cut) = self.wait_limit(key, timeout);
        // A wait that must end at a given moment (the end of a lock-delay, or a timeout
        // below Consul's shortest wait) asks Consul for at least that long and ends locally.
        let short = cut || timeout < MIN_SERVER_WAIT;
        let server_wait = if short {
            Duration::from_millis(timeout.as_micros().div_ceil(1000) as u64).max(MIN_SERVER_WAIT)
        } else {
            (timeout.mul_f64(f64::from(JITTER_DIVISOR) / f64::from(JITTER_DIVISOR + 1)))
                .max(MIN_SERVER_WAIT)
        };
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
        let limit = if short {
            timeout
        } else {
            server_wait + server_wait / JITTER_DIVISOR + REQUEST_TIMEOUT
        };
        let answer = match tokio::time::timeout(limit, self.shared.send_raw(request)).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(e)) => return Err(unavailable(OPERATION, e)),
            // The wait ends here, not when Consul answers: its timeout is the answer.
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

    /// `S + fence_window` (see the module docs) while the session is live.
    fn valid_until(&self) -> Option<Instant> {
        self.shared.valid_until()
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

    /// Releases the keys one by one, destroys the session, then deregisters the service check
    /// (a check-bound session). Only the first call does anything.
    async fn shutdown(&self) {
        let renewer = lock(&self.renewer).take();
        let Some(task) = renewer else {
            return;
        };
        task.abort();
        // Wait until it has really stopped, so it cannot publish a new session after the
        // state below. (A session it was creating at that moment expires by its TTL, or
        // ends with the check deregistered below.)
        let _ = task.await;
        let previous = self.shared.state.send_replace(SessionState::Lost {
            reason: "shut down".into(),
        });
        if let SessionState::Live { id } = previous {
            self.shared.end_session(&id).await;
        }
        if self.shared.config.check.is_some() {
            match self.shared.deregister_service().await {
                Ok(()) => tracing::info!(
                    instance = %self.shared.config.instance,
                    service = %self.shared.config.service_id(),
                    "deregistered the service check",
                ),
                Err(error) => tracing::warn!(
                    instance = %self.shared.config.instance,
                    %error,
                    "could not deregister the service check; the agent drops it after \
                     check.deregister_after",
                ),
            }
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

    fn checked() -> ConsulLockConfig {
        ConsulLockConfig {
            check: Some(SessionCheck::new("127.0.0.1:50051")),
            ..valid()
        }
    }

    #[test]
    fn defaults_are_valid_once_the_instance_is_named() {
        valid().validate().unwrap();
        assert!(rejected(ConsulLockConfig::default()).contains("instance"));
        let d = ConsulLockConfig::default();
        assert_eq!(d.renew_interval, None);
        assert_eq!(d.prefix, "kafka-lease");
        assert_eq!(d.check, None);
        // TTL-only or check-bound: the window is the lock-delay less the margin, renewed four
        // times per window (a TTL-only session can end early too: its node deregistered).
        assert_eq!(d.fence_window(), Duration::from_millis(1250));
        assert_eq!(d.renew_interval(), Duration::from_micros(312_500));
        let c = checked();
        c.validate().unwrap();
        assert_eq!(c.fence_window(), Duration::from_millis(1250));
        assert_eq!(c.renew_interval(), Duration::from_micros(312_500));
        let check = c.check.unwrap();
        assert_eq!(check.interval, Duration::from_secs(1));
        assert_eq!(check.timeout, Duration::from_secs(1));
        assert_eq!(check.deregister_after, Duration::from_secs(60));
    }

    #[test]
    fn the_fence_invariant_is_enforced() {
        // Three renews per window: 1.25 s / 3 = 416.66 ms at most with a check.
        ConsulLockConfig {
            renew_interval: Some(Duration::from_millis(416)),
            ..checked()
        }
        .validate()
        .unwrap();
        let e = rejected(ConsulLockConfig {
            renew_interval: Some(Duration::from_millis(417)),
            ..checked()
        });
        assert!(
            e.contains("renew_interval = 417ms")
                && e.contains("lock_delay - 250ms")
                && e.contains("fence_window = lock_delay - 250ms = 1.25s")
                && e.contains("renew_interval * 3 <= fence_window"),
            "{e}"
        );
        // Without a check the lock-delay sets the window too, not the TTL: the window that
        // the old TTL-based rule allowed is refused.
        let e = rejected(ConsulLockConfig {
            renew_interval: Some(Duration::from_millis(3250)),
            ..valid()
        });
        assert!(
            e.contains("renew_interval = 3.25s") && e.contains("lock_delay - 250ms"),
            "{e}"
        );
        ConsulLockConfig {
            renew_interval: Some(Duration::from_millis(416)),
            ..valid()
        }
        .validate()
        .unwrap();
        // A long lock-delay widens the window, still bounded by renew <= TTL / 2.
        let e = rejected(ConsulLockConfig {
            lock_delay: Duration::from_secs(30),
            renew_interval: Some(Duration::from_secs(6)),
            ..valid()
        });
        assert!(e.contains("renew_interval = 6s"), "{e}");
        for config in [valid(), checked()] {
            let e = rejected(ConsulLockConfig {
                lock_delay: Duration::from_millis(999),
                ..config
            });
            assert!(
                e.contains("lock_delay = 999ms") && e.contains("1s ..= 60s"),
                "{e}"
            );
        }
        // A derived interval follows the lock-delay.
        let c = ConsulLockConfig {
            lock_delay: Duration::from_secs(1),
            ..checked()
        };
        c.validate().unwrap();
        assert_eq!(c.fence_window(), Duration::from_millis(750));
        assert_eq!(c.renew_interval(), Duration::from_micros(187_500));
    }

    #[test]
    fn check_settings_are_checked() {
        let with = |f: fn(&mut SessionCheck)| {
            let mut config = checked();
            f(config.check.as_mut().unwrap());
            config
        };
        for (config, needle) in [
            (with(|c| c.tcp_addr = "50051".into()), "check.tcp_addr"),
            (with(|c| c.tcp_addr = ":50051".into()), "check.tcp_addr"),
            (with(|c| c.tcp_addr = "h:0".into()), "check.tcp_addr"),
            (with(|c| c.tcp_addr = "h:port".into()), "check.tcp_addr"),
            (
                with(|c| c.interval = Duration::from_millis(500)),
                "check.interval = 500ms",
            ),
            (with(|c| c.timeout = Duration::ZERO), "check.timeout = 0ns"),
            (
                with(|c| c.timeout = Duration::from_secs(2)),
                "check.timeout = 2s",
            ),
            (
                with(|c| c.deregister_after = Duration::from_secs(30)),
                "check.deregister_after",
            ),
        ] {
            let e = rejected(config);
            assert!(e.contains(needle), "{needle}: {e}");
        }
        with(|c| c.tcp_addr = "[::1]:50051".into())
            .validate()
            .unwrap();
        let e = rejected(ConsulLockConfig {
            instance: "gw 1".into(),
            ..checked()
        });
        assert!(e.contains("instance") && e.contains("service id"), "{e}");
    }

    #[test]
    fn a_check_dials_the_loopback_for_an_unspecified_listen_address() {
        let addr = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert_eq!(
            SessionCheck::for_listener(addr("0.0.0.0:50051")).tcp_addr,
            "127.0.0.1:50051"
        );
        assert_eq!(
            SessionCheck::for_listener(addr("[::]:50051")).tcp_addr,
            "[::1]:50051"
        );
        assert_eq!(
            SessionCheck::for_listener(addr("10.1.2.3:7000")).tcp_addr,
            "10.1.2.3:7000"
        );
    }

    #[test]
    fn the_registration_has_only_the_fields_consul_accepts() {
        let config = checked();
        let body = RegisterService::new(&config, config.check.as_ref().unwrap())
            .body()
            .unwrap()
            .unwrap();
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "ID": "kafka-lease-gw-1",
                "Name": "kafka-lease",
                "Meta": {"instance": "gw-1", "check_tcp": "127.0.0.1:50051"},
                "Check": {
                    "CheckID": "kafka-lease-gw-1-alive",
                    "Name": "kafka-lease gateway gw-1 is alive",
                    "TCP": "127.0.0.1:50051",
                    "Interval": "1s",
                    "Timeout": "1s",
                    "DeregisterCriticalServiceAfter": "60s",
                    "Status": "passing",
                },
            })
        );
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
            e.contains("lock_delay = 61s") && e.contains("1s ..= 60s"),
            "{e}"
        );
        let e = rejected(ConsulLockConfig {
            renew_interval: Some(Duration::from_secs(6)),
            ..valid()
        });
        assert!(
            e.contains("renew_interval = 6s") && e.contains("416.666666ms"),
            "{e}"
        );
        let e = rejected(ConsulLockConfig {
            renew_interval: Some(Duration::ZERO),
            ..valid()
        });
        assert!(e.contains("renew_interval"), "{e}");
        // No lock-delay leaves no fence window, with or without a check.
        let e = rejected(ConsulLockConfig {
            lock_delay: Duration::ZERO,
            ..valid()
        });
        assert!(e.contains("lock_delay = 0ns"), "{e}");
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
