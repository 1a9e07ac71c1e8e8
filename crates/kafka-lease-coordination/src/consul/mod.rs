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
//! - **Check-bound** ([`ConsulLockConfig::check`] set): `connect` registers a service
//!   `kafka-lease-<instance>` with the agent at `address`, with a check
//!   (`kafka-lease-<instance>-alive`), and binds the session to that check and to the node's
//!   `serfHealth` (`NodeChecks`, `ServiceChecks`). The check is either
//!   - a TTL check ([`CheckKind::Ttl`], the gateway's default) that this backend's passer
//!     task keeps passing every `ttl / PASSES_PER_TTL` on the gateway's runtime: a process
//!     that dies or cannot run its tasks (SIGSTOP, a wedged runtime) stops passing, and the
//!     agent marks the check critical `ttl` after the last pass; or
//!   - a TCP check ([`CheckKind::Tcp`]) that the agent runs against the gateway's gRPC
//!     listener every `interval`: a dead process refuses the connection at once, but a hung
//!     one that keeps its socket open (SIGSTOP) still passes, and its session then ends by
//!     TTL, like a TTL-only one.
//!
//!   When the check goes critical Consul invalidates the session, the keys vanish, and after
//!   `lock_delay` another gateway's waiter takes them. The registration is
//!   deregistered at `shutdown`, and `connect` deregisters any earlier registration of a dead
//!   process with the same service id or the same TCP check address (a gateway restarted on
//!   its port faster than one check interval would otherwise keep the old check passing and
//!   the old session, and its locks, alive until its TTL). After losing its session the
//!   backend re-registers the check only if the agent no longer has it: a check that is
//!   registered but critical makes Consul refuse new sessions until it passes again (a TTL
//!   check does at its next pass), rather than handing out sessions the check would end.
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
//! The HTTP plumbing, and why KV reads bypass consulrs' own functions, is in `http.rs`.

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use consulrs::api::features::{Blocking, ConsistencyMode, FeaturedEndpoint, Features};
use consulrs::api::kv::common::KVPair;
use consulrs::api::kv::requests::{DeleteKeyRequest, ReadKeyRequest};
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
    Acquisition, CoordinationError, FencingToken, HeldLock, HeldPartition, HolderInfo,
    InstanceRecord, LockBackend, LockGrant, LockKey, MemberRecord, SessionState, TopicView,
};

mod config;
mod http;
mod session;

/// The backend's metrics, recorded through the `metrics` facade (whatever recorder the
/// process installed; none, and they cost nothing).
pub mod metrics {
    /// Seconds a session renew took to answer (or to fail).
    pub const RENEW_SECONDS: &str = "kafka_lease_consul_renew_duration_seconds";
    /// Session renews that failed (no answer, an error); the session lives on until its
    /// fence window passes without a confirmed one.
    pub const RENEW_FAILURES: &str = "kafka_lease_consul_renew_failures_total";
    /// Lock sessions created (at startup, and after each loss).
    pub const SESSIONS_CREATED: &str = "kafka_lease_consul_sessions_created_total";
    /// Lock sessions lost, by `cause`: `invalidated` (Consul ended it) or `self_fence` (no
    /// renew confirmed for a whole fence window: every lock of the instance was void).
    pub const SESSIONS_LOST: &str = "kafka_lease_consul_sessions_lost_total";
    /// Consul requests that failed or went unanswered, by `operation`.
    pub const ERRORS: &str = "kafka_lease_consul_errors_total";
    /// Passes of the TTL check that failed or went unanswered, after the first that succeeded
    /// (the agent marks the check critical, and ends the session, `ttl` after the last one
    /// that succeeded).
    pub const CHECK_PASS_FAILURES: &str = "kafka_lease_consul_check_pass_failures_total";
}

/// Describes the backend's metrics to the installed recorder.
pub fn describe_metrics() {
    use ::metrics::{describe_counter, describe_histogram, Unit};
    describe_histogram!(
        metrics::RENEW_SECONDS,
        Unit::Seconds,
        "time a Consul session renew took"
    );
    describe_counter!(metrics::RENEW_FAILURES, "Consul session renews that failed");
    describe_counter!(metrics::SESSIONS_CREATED, "Consul lock sessions created");
    describe_counter!(
        metrics::SESSIONS_LOST,
        "Consul lock sessions lost, by cause"
    );
    describe_counter!(metrics::ERRORS, "Consul requests that failed, by operation");
    describe_counter!(
        metrics::CHECK_PASS_FAILURES,
        "passes of the session's TTL check that failed"
    );
    ::metrics::counter!(metrics::CHECK_PASS_FAILURES).increment(0);
    ::metrics::counter!(metrics::RENEW_FAILURES).increment(0);
    ::metrics::counter!(metrics::SESSIONS_CREATED).increment(0);
    for cause in ["invalidated", "self_fence"] {
        ::metrics::counter!(metrics::SESSIONS_LOST, "cause" => cause).increment(0);
    }
}

pub use config::{
    CheckKind, ConsulConfigError, ConsulLockConfig, ConsulTls, SessionCheck,
    DEFAULT_CHECK_INTERVAL, DEFAULT_CHECK_TIMEOUT, DEFAULT_CHECK_TTL, DEFAULT_DEREGISTER_AFTER,
    DEFAULT_LOCK_DELAY, DEFAULT_SESSION_TTL, FENCE_MARGIN, PASSES_PER_TTL,
};

use http::*;
use session::*;

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
/// lock-delay (see [`ConsulLocks::note_refused`]).
const LOCK_DELAY_POLL_MIN: Duration = Duration::from_millis(500);
/// How soon to try again a key still refused right after its expected lock-delay end.
const LOCK_DELAY_REPOLL: Duration = Duration::from_millis(100);

/// Partition locks in Consul for one gateway instance.
pub struct ConsulLocks {
    shared: Arc<Shared>,
    /// The renew task; aborted by `shutdown` and on drop.
    renewer: Mutex<Option<JoinHandle<()>>>,
    /// The task passing a TTL check (see [`CheckKind::Ttl`]); aborted by `shutdown` and on
    /// drop.
    passer: Mutex<Option<JoinHandle<()>>>,
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
    /// Grants handed out and not released: key → (session, token). See `try_acquire`.
    granted: Mutex<HashMap<LockKey, (String, FencingToken)>>,
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
}

/// The folder of a topic's member records, under its lock prefix: `~` cannot occur in a
/// partition number, so no lock key lies under it.
const MEMBERS_DIR: &str = "~members";

/// The view of one topic from a read of its prefix: the locked keys that parse as
/// `<group>/<topic>/<partition>` of this topic, and the locked member records under
/// `<group>/<topic>/~members/`.
fn view_of(prefix: &str, group: &str, topic: &str, read: KvRead<KVPair>) -> TopicView {
    let members_folder = format!(
        "{}{MEMBERS_DIR}/",
        LockKey::new(group, topic, 0).topic_prefix(prefix)
    );
    let members = read
        .entries
        .iter()
        .filter(|e| e.session.is_some())
        .filter_map(|entry| {
            let id = entry.key.strip_prefix(&members_folder)?;
            let bytes: Vec<u8> = entry.value.clone()?.try_into().ok()?;
            let record: MemberRecord = serde_json::from_slice(&bytes).ok()?;
            (record.member_id == id).then(|| (id.to_string(), record))
        })
        .collect();
    let held = read
        .entries
        .iter()
        .filter(|e| e.session.is_some())
        .filter_map(|entry| {
            let key = LockKey::from_path(prefix, &entry.key)
                .filter(|k| k.group == group && k.topic == topic)?;
            Some((
                key.partition,
                HeldPartition {
                    token: FencingToken(entry.modify_index),
                    holder: holder_of(entry),
                },
            ))
        })
        .collect();
    TopicView {
        index: read.index,
        held,
        members,
    }
}

/// The key of a member's record.
fn member_path(prefix: &str, group: &str, topic: &str, member_id: &str) -> String {
    format!(
        "{}{MEMBERS_DIR}/{member_id}",
        LockKey::new(group, topic, 0).topic_prefix(prefix)
    )
}

impl ConsulLocks {
    /// Validates `config`, registers the service check (if any; after deregistering what a
    /// dead process left on the same address), creates this instance's session and starts
    /// renewing it.
    pub async fn connect(config: ConsulLockConfig) -> Result<ConsulLocks, CoordinationError> {
        config
            .validate()
            .map_err(|e| unavailable("connect (invalid configuration)", e.to_string()))?;
        // TLS files come from the config, else from Consul's usual environment variables
        // (CONSUL_CACERT, ...); the address and the token only from the config, which is the
        // source of truth.
        let mut settings = ConsulClientSettingsBuilder::default()
            .address(config.address.trim_end_matches('/'))
            .build()
            .map_err(|e| unavailable("connect (client settings)", e.to_string()))?;
        settings.token = config.token.clone();
        let client = if config.tls == ConsulTls::default() {
            ConsulClient::new(settings)
                .map_err(|e| unavailable("connect (client)", describe(&e)))?
        } else {
            http::tls_client(settings, &config.tls)?
        };
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
            granted: Mutex::new(HashMap::new()),
        });
        if let Some(check) = &shared.config.check {
            shared.remove_stale_registrations(check).await?;
        }
        // Passing from before the registration, so that the check never waits a whole pass
        // interval for its first pass (until it is registered, a pass fails quietly).
        let passer = shared
            .config
            .check
            .as_ref()
            .and_then(SessionCheck::pass_interval)
            .map(|every| tokio::spawn(run_check_passer(shared.clone(), every)));
        let (id, sent) = match shared.open_registered_session(Registration::Always).await {
            Ok(opened) => opened,
            Err(error) => {
                if let Some(passer) = &passer {
                    passer.abort();
                }
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
            check = shared.config.check.as_ref().map_or("none".into(), SessionCheck::describe),
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
            passer: Mutex::new(passer),
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

    /// How long to leave `key` alone, at most `timeout`: the rest of its noted lock-delay.
    fn wait_limit(&self, key: &LockKey, timeout: Duration) -> Duration {
        lock(&self.shared.refused)
            .get(key)
            .and_then(|r| r.until.checked_duration_since(Instant::now()))
            .map_or(timeout, |left| left.min(timeout))
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
        let passer = self
            .passer
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(task) = passer.take() {
            task.abort();
        }
    }
}

#[async_trait]
impl LockBackend for ConsulLocks {
    /// One `/v1/txn` with a `lock` operation: a single Raft write, whose answer carries the
    /// key's `ModifyIndex` after the lock (the token: the committed index of the very write
    /// that took it, so no read-back). Nothing is read first; a caller that watches the
    /// topic ([`LockBackend::topic_view`]) tries only keys it has seen free.
    ///
    /// A key this backend granted and has not released is answered from memory: a second
    /// `lock` by the same session would succeed but rewrite the key, moving its `ModifyIndex`
    /// and so voiding the token (and the `?cas` release) of the grant already handed out.
    async fn try_acquire(
        &self,
        key: &LockKey,
        holder: &HolderInfo,
    ) -> Result<Acquisition, CoordinationError> {
        const OPERATION: &str = "try_acquire";
        let shared = &*self.shared;
        let session = shared.live_session()?;
        if let Some(token) = shared.granted_token(key, &session) {
            return Ok(Acquisition::Acquired(LockGrant::new(
                key.clone(),
                token,
                session,
            )));
        }
        let path = key.path(shared.prefix());
        let value = serde_json::to_vec(holder)
            .map_err(|e| unavailable(OPERATION, format!("holder not serializable: {e}")))?;
        let outcome = shared
            .txn(OPERATION, vec![TxnOp::lock(&path, &value, &session)])
            .await?;
        let what = match outcome {
            Ok(entries) => {
                let entry = entries.into_iter().find(|e| e.key == path);
                return match entry {
                    Some(entry) if entry.session.as_deref() == Some(&session) => {
                        let token = FencingToken(entry.modify_index);
                        lock(&shared.refused).remove(key);
                        lock(&shared.granted).insert(key.clone(), (session.clone(), token));
                        Ok(Acquisition::Acquired(LockGrant::new(
                            key.clone(),
                            token,
                            session,
                        )))
                    }
                    other => Err(unavailable(
                        OPERATION,
                        format!(
                            "the lock of {path} was applied but answered {:?} as its session",
                            other.and_then(|e| e.session)
                        ),
                    )),
                };
            }
            Err(what) => what,
        };
        if what.contains("invalid session") {
            // Consul dropped the session before the renew task noticed: have it renew now,
            // which finds out and starts the recovery.
            shared.poke.notify_one();
            return Err(CoordinationError::NoSession {
                reason: format!("consul rejected session {session}: {what}"),
            });
        }
        if what.contains("lock delay") {
            // Free yet refused: the lock-delay of a session invalidated a moment ago. Nothing
            // is written when the delay ends, so remember when it does (see `wait_cut`).
            self.note_refused(key);
            return Ok(Acquisition::Delayed);
        }
        if what.contains("already held") {
            return Ok(Acquisition::Held);
        }
        Err(unavailable(OPERATION, format!("{path}: {what}")))
    }

    async fn release(&self, grant: LockGrant) -> Result<(), CoordinationError> {
        // `?cas=<token>` deletes the key only if it was not written since our acquire (we
        // never write it while holding it), so a key lost and taken by someone else since is
        // never touched. An explicit delete sets no lock-delay: a successor can take it now.
        let path = grant.key().path(self.shared.prefix());
        // Whatever comes of it, the grant is given up: a later try_acquire must go to Consul.
        lock(&self.shared.granted).remove(grant.key());
        let mut request = DeleteKeyRequest::builder();
        request.cas(grant.token().0);
        let deleted = consulrs::kv::delete(&self.shared.client, &path, Some(&mut request));
        match in_time("release", deleted).await? {
            Ok(answer) => {
                if !answer.response {
                    tracing::debug!(
                        key = %path,
                        token = %grant.token(),
                        "lock was already lost before its release",
                    );
                }
                Ok(())
            }
            Err(e) if is_status(&e, 404) => Ok(()),
            Err(e) => Err(unavailable("release", describe(&e))),
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

    /// A read of the topic prefix with values (`?recurse`): one request whatever the number
    /// of partitions. Blocking (`after: Some`), Consul's `wait` is `timeout × 16/17` (at
    /// least 1 s), so that with its jitter of up to `wait/16` the answer still comes within
    /// `timeout`; the local limit only catches a dead connection. A `timeout` below Consul's
    /// shortest wait ends locally and then reads the topic as it is. The index returned is
    /// Consul's; it may be lower than `after` (Consul reaped tombstones): per Consul's rules
    /// that is simply the next index to wait on.
    async fn topic_view(
        &self,
        group: &str,
        topic: &str,
        after: Option<u64>,
        timeout: Duration,
    ) -> Result<TopicView, CoordinationError> {
        const OPERATION: &str = "topic_view";
        let shared = &*self.shared;
        let prefix = LockKey::new(group, topic, 0).topic_prefix(shared.prefix());
        let (blocking, limit) = match after {
            Some(index) if timeout >= MIN_SERVER_WAIT => {
                let wait = timeout
                    .mul_f64(f64::from(JITTER_DIVISOR) / f64::from(JITTER_DIVISOR + 1))
                    .max(MIN_SERVER_WAIT);
                (
                    Some((index, wait)),
                    wait + wait / JITTER_DIVISOR + REQUEST_TIMEOUT,
                )
            }
            Some(index) => {
                let short = shared
                    .read_prefix(OPERATION, &prefix, Some((index, MIN_SERVER_WAIT)), timeout)
                    .await?;
                if let Some(read) = short {
                    return Ok(view_of(shared.prefix(), group, topic, read));
                }
                (None, REQUEST_TIMEOUT)
            }
            None => (None, REQUEST_TIMEOUT),
        };
        match shared
            .read_prefix(OPERATION, &prefix, blocking, limit)
            .await?
        {
            Some(read) => Ok(view_of(shared.prefix(), group, topic, read)),
            None => Err(unavailable(
                OPERATION,
                format!("no answer within {limit:?}"),
            )),
        }
    }

    fn wait_cut(&self, key: &LockKey, timeout: Duration) -> Duration {
        self.wait_limit(key, timeout)
    }

    /// One read of `<prefix>/~instances/<instance>/`: the newest record still locked by a
    /// session (an instance restarted under the same name may briefly have two).
    async fn instance_address(&self, instance: &str) -> Result<Option<String>, CoordinationError> {
        let shared = &*self.shared;
        let folder = format!("{}{instance}/", shared.config.instances_folder());
        let read = shared
            .read_kv("instance address", &folder, true, None)
            .await?;
        Ok(read
            .entries
            .iter()
            .filter(|e| e.session.is_some())
            .max_by_key(|e| e.create_index)
            .and_then(|entry| {
                let bytes: Vec<u8> = entry.value.clone()?.try_into().ok()?;
                let record: InstanceRecord = serde_json::from_slice(&bytes).ok()?;
                (record.instance == instance).then_some(record.address)
            }))
    }

    /// One `/v1/txn` with a `lock` of the member's record: its session's own record is
    /// rewritten in place; another session's is refused ("already held").
    async fn join(
        &self,
        group: &str,
        topic: &str,
        member: &MemberRecord,
    ) -> Result<bool, CoordinationError> {
        const OPERATION: &str = "join";
        let shared = &*self.shared;
        let session = shared.live_session()?;
        let path = member_path(shared.prefix(), group, topic, &member.member_id);
        let value = serde_json::to_vec(member)
            .map_err(|e| unavailable(OPERATION, format!("record not serializable: {e}")))?;
        match shared
            .txn(OPERATION, vec![TxnOp::lock(&path, &value, &session)])
            .await?
        {
            Ok(_) => Ok(true),
            Err(what) if what.contains("already held") || what.contains("lock delay") => Ok(false),
            Err(what) if what.contains("invalid session") => {
                shared.poke.notify_one();
                Err(CoordinationError::NoSession {
                    reason: format!("consul rejected session {session}: {what}"),
                })
            }
            Err(what) => Err(unavailable(OPERATION, format!("{path}: {what}"))),
        }
    }

    /// One `/v1/txn`: check that this session holds the record, then delete it.
    async fn leave(
        &self,
        group: &str,
        topic: &str,
        member_id: &str,
    ) -> Result<(), CoordinationError> {
        const OPERATION: &str = "leave";
        let shared = &*self.shared;
        let Ok(session) = shared.live_session() else {
            // No session: its records are gone with the last one.
            return Ok(());
        };
        let path = member_path(shared.prefix(), group, topic, member_id);
        match shared
            .txn(
                OPERATION,
                vec![TxnOp::check_session(&path, &session), TxnOp::delete(&path)],
            )
            .await?
        {
            // Refused: not ours (any more); nothing to remove.
            Ok(_) | Err(_) => Ok(()),
        }
    }

    /// One read of the group's prefix, keeping the locked member records.
    async fn members(&self, group: &str) -> Result<Vec<(String, MemberRecord)>, CoordinationError> {
        let prefix = self.shared.prefix();
        let path = format!("{prefix}/{group}/");
        let read = self.shared.read_kv("members", &path, true, None).await?;
        let mut members: Vec<(String, MemberRecord)> = read
            .entries
            .iter()
            .filter(|e| e.session.is_some())
            .filter_map(|entry| {
                let rest = entry.key.strip_prefix(&path)?;
                let (topic, id) = rest.split_once(&format!("/{MEMBERS_DIR}/"))?;
                let bytes: Vec<u8> = entry.value.clone()?.try_into().ok()?;
                let record: MemberRecord = serde_json::from_slice(&bytes).ok()?;
                (record.member_id == id && !topic.contains('/'))
                    .then(|| (topic.to_string(), record))
            })
            .collect();
        members.sort_by(|a, b| (&a.0, &a.1.member_id).cmp(&(&b.0, &b.1.member_id)));
        Ok(members)
    }

    async fn list(&self, group: Option<&str>) -> Result<Vec<HeldLock>, CoordinationError> {
        let prefix = self.shared.prefix();
        let path = match group {
            Some(group) => format!("{prefix}/{group}/"),
            None => format!("{prefix}/"),
        };
        let instances = self.shared.config.instances_folder();
        let read = self.shared.read_kv("list", &path, true, None).await?;
        let mut held: Vec<HeldLock> = read
            .entries
            .iter()
            .filter(|e| {
                e.session.is_some()
                    && !e.key.starts_with(&instances)
                    && !e.key.contains(&format!("/{MEMBERS_DIR}/"))
            })
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
        if let Some(passer) = lock(&self.passer).take() {
            passer.abort();
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

/// Passes this instance's TTL check every `every`, for as long as the backend lives, whatever
/// the state of the session: the check says that this process runs, nothing more (a Kafka
/// outage, or a lost session being replaced, leaves it passing). It runs on the gateway's
/// runtime, so a process that cannot run its tasks (SIGSTOP, a wedged runtime, a paused VM)
/// stops passing, and the agent marks the check critical, ending the session, `ttl` after
/// the last pass. Each pass may take up to half the TTL: a slow agent still gets its passes
/// through (cancelling them sooner would fail the check while the agent works), and one that
/// hangs leaves time for another try on a fresh request before the TTL runs out.
async fn run_check_passer(shared: Arc<Shared>, every: Duration) {
    let patience = every * PASSES_PER_TTL / 2;
    let check_id = shared.config.check_id();
    let instance = shared.config.instance.clone();
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Failures before the first good pass are expected (the check may not be registered
    // yet) and neither counted nor warned about; after it, `failing_since` is the start of
    // the current run of failures, if any.
    let mut passed_once = false;
    let mut failing_since: Option<Instant> = None;
    loop {
        ticks.tick().await;
        let outcome = match tokio::time::timeout(
            patience,
            shared.send_raw(PassCheck {
                check_id: check_id.clone(),
            }),
        )
        .await
        {
            Err(_) => Err(format!("no answer within {patience:?}")),
            Ok(Err(error)) => Err(error),
            Ok(Ok(answer)) if answer.status == 200 => Ok(()),
            Ok(Ok(answer)) => Err(format!(
                "HTTP {}: {}",
                answer.status,
                String::from_utf8_lossy(&answer.body).trim()
            )),
        };
        match outcome {
            Ok(()) => {
                if let Some(since) = failing_since.take() {
                    tracing::info!(
                        %instance,
                        check = %check_id,
                        failing_for = ?since.elapsed(),
                        "passing the liveness check again",
                    );
                }
                passed_once = true;
            }
            Err(error) => {
                if !passed_once {
                    tracing::debug!(%instance, check = %check_id, %error, "liveness check not passed yet");
                    continue;
                }
                ::metrics::counter!(metrics::CHECK_PASS_FAILURES).increment(1);
                if failing_since.is_none() {
                    failing_since = Some(Instant::now());
                    tracing::warn!(
                        %instance,
                        check = %check_id,
                        %error,
                        "could not pass the liveness check; the agent ends this instance's \
                         session if no pass succeeds within the check's TTL",
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[tokio::test]
    async fn connect_refuses_an_invalid_config_without_touching_the_network() {
        let e = ConsulLocks::connect(ConsulLockConfig::default())
            .await
            .unwrap_err();
        assert!(e.to_string().contains("instance"), "{e}");
    }
}
