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
//! The HTTP plumbing, and why KV reads bypass consulrs' own functions, is in `http.rs`; the
//! request types and answer parsers it sends and reads are in `wire.rs`.
//! The [`LockBackend`] operations are in `locks.rs` (acquire, release, a grant read back),
//! `views.rs` (topic views, members, the list of locks) and `registry.rs` (instance
//! addresses, member records); the session in `session.rs`, the TTL check's passer in
//! `passer.rs`, the metrics in `metrics.rs`, the settings in `config.rs`.

use std::collections::HashMap;
use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use consulrs::client::{ConsulClient, ConsulClientSettingsBuilder};
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::contract::{
    Acquisition, CoordinationError, FencingToken, GroupTarget, HeldLock, HolderInfo, LockBackend,
    LockGrant, LockKey, MemberRecord, PublishedTarget, SessionState, TopicView,
};

mod config;
mod http;
mod locks;
pub mod metrics;
mod passer;
mod registry;
mod session;
mod views;
mod wire;

pub use config::{
    CheckKind, ConsulConfigError, ConsulLockConfig, ConsulTls, SessionCheck,
    DEFAULT_CHECK_INTERVAL, DEFAULT_CHECK_TIMEOUT, DEFAULT_CHECK_TTL, DEFAULT_DEREGISTER_AFTER,
    DEFAULT_LOCK_DELAY, DEFAULT_SESSION_TTL, FENCE_MARGIN, PASSES_PER_TTL,
};
pub use metrics::describe_metrics;

use http::*;
use passer::run_check_passer;
use session::*;
use wire::*;

/// The service name every gateway registers under (check-bound sessions only).
pub const SERVICE_NAME: &str = "kafka-lease";
/// The service meta keys: the instance, and the address the check dials.
const META_INSTANCE: &str = "instance";
const META_CHECK_TCP: &str = "check_tcp";
/// How long an ordinary (non-blocking) request may take before it counts as a failure. The
/// HTTP client consulrs builds has no timeout at all, so every call is bounded here.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// The most ordinary requests one backend has in flight to Consul at once; the rest wait
/// for a turn (within their time bound). Consul refuses a client address more than
/// `http_max_conns_per_client` connections (200 by default), and each request in flight
/// holds one: a burst of Acquires (a thousand at once, and hundreds waiting) reached 189,
/// and then the session's own renewals could not connect. Blocking queries (one per
/// watched topic) and the session's renewals and check passes do not take a turn.
const MAX_REQUESTS_IN_FLIGHT: usize = 32;
/// Backoff bounds for creating a new session while Consul is unreachable.
const CREATE_BACKOFF_MIN: Duration = Duration::from_millis(500);
const CREATE_BACKOFF_MAX: Duration = Duration::from_secs(5);

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
    /// A client of its own (its own connection) for what keeps the session alive: its
    /// renewals and the TTL check's passes never wait behind a burst of other requests.
    critical: ConsulClient,
    /// Turns for ordinary requests ([`MAX_REQUESTS_IN_FLIGHT`]).
    lane: tokio::sync::Semaphore,
    config: ConsulLockConfig,
    /// `config.fence_window()`.
    fence_window: Duration,
    state: watch::Sender<SessionState>,
    /// The last renew (or create) Consul confirmed: its session and its send time `S`.
    last_confirmed: Mutex<Option<Confirmation>>,
    /// Asks the renew task to renew now (an acquire was told the session is invalid).
    poke: Notify,
    /// Keys found free but refused (see `Shared::note_refused`).
    refused: Mutex<HashMap<LockKey, locks::Refusal>>,
    /// Grants handed out and not released: key → (session, token). See `try_acquire`.
    granted: Mutex<HashMap<LockKey, (String, FencingToken)>>,
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
        let make = |settings: consulrs::client::ConsulClientSettings| {
            if config.tls == ConsulTls::default() {
                ConsulClient::new(settings)
                    .map_err(|e| unavailable("connect (client)", describe(&e)))
            } else {
                http::tls_client(settings, &config.tls)
            }
        };
        let critical = make(settings.clone())?;
        let client = make(settings)?;
        let (state, _) = watch::channel(SessionState::Lost {
            reason: "session not created yet".into(),
        });
        let shared = Arc::new(Shared {
            client,
            critical,
            lane: tokio::sync::Semaphore::new(MAX_REQUESTS_IN_FLIGHT),
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

    /// Releases the keys one by one, destroys the session, then deregisters the service check
    /// (a check-bound session). Only the first call does anything.
    async fn close(&self) {
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

/// The handle forwards to [`Shared`], which owns the state and whose inherent methods hold
/// the operations (in `locks.rs`, `views.rs`, `registry.rs`, by concern). The trait is not
/// implemented on `Shared` itself on purpose: the renew and pass tasks hold `Arc<Shared>`
/// for the session's life, so a backend nobody holds could not be told apart from one in
/// use, and dropping it without `shutdown` must stop those tasks (its session then expires,
/// as after a crash). This handle owns the tasks and stops them on drop.
#[async_trait]
impl LockBackend for ConsulLocks {
    async fn try_acquire(
        &self,
        key: &LockKey,
        holder: &HolderInfo,
    ) -> Result<Acquisition, CoordinationError> {
        self.shared.try_acquire(key, holder).await
    }

    async fn release(&self, grant: LockGrant) -> Result<(), CoordinationError> {
        self.shared.release(grant).await
    }

    async fn held_grant(&self, key: &LockKey) -> Result<Option<LockGrant>, CoordinationError> {
        self.shared.held_grant(key).await
    }

    async fn topic_view(
        &self,
        group: &str,
        topic: &str,
        after: Option<u64>,
        timeout: Duration,
    ) -> Result<TopicView, CoordinationError> {
        self.shared.topic_view(group, topic, after, timeout).await
    }

    fn wait_cut(&self, key: &LockKey, timeout: Duration) -> Duration {
        self.shared.wait_limit(key, timeout)
    }

    async fn instance_address(&self, instance: &str) -> Result<Option<String>, CoordinationError> {
        self.shared.instance_address(instance).await
    }

    async fn join(
        &self,
        group: &str,
        topic: &str,
        member: &MemberRecord,
    ) -> Result<bool, CoordinationError> {
        self.shared.join(group, topic, member).await
    }

    async fn leave(
        &self,
        group: &str,
        topic: &str,
        member_id: &str,
    ) -> Result<(), CoordinationError> {
        self.shared.leave(group, topic, member_id).await
    }

    async fn members(&self, group: &str) -> Result<Vec<(String, MemberRecord)>, CoordinationError> {
        self.shared.members(group).await
    }

    async fn publish_target(
        &self,
        group: &str,
        topic: &str,
        target: &GroupTarget,
        replaces: Option<u64>,
    ) -> Result<bool, CoordinationError> {
        self.shared
            .publish_target(group, topic, target, replaces)
            .await
    }

    async fn remove_target(
        &self,
        group: &str,
        topic: &str,
        index: u64,
    ) -> Result<bool, CoordinationError> {
        self.shared.remove_target(group, topic, index).await
    }

    async fn targets(
        &self,
        group: &str,
    ) -> Result<std::collections::BTreeMap<String, PublishedTarget>, CoordinationError> {
        self.shared.targets(group).await
    }

    async fn list(&self, group: Option<&str>) -> Result<Vec<HeldLock>, CoordinationError> {
        self.shared.list(group).await
    }

    fn session_state(&self) -> watch::Receiver<SessionState> {
        self.shared.state.subscribe()
    }

    /// `S + fence_window` (see the module docs) while the session is live.
    fn valid_until(&self) -> Option<Instant> {
        self.shared.valid_until()
    }

    async fn ping(&self) -> Result<(), CoordinationError> {
        self.shared.ping().await
    }

    async fn shutdown(&self) {
        self.close().await;
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
