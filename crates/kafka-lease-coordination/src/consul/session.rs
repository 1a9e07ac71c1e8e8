//! This instance's Consul session: creating it (with its check registration, for a
//! check-bound session), renewing it and confirming it, noticing its loss and replacing it. The
//! renew task implements the self-fence deadline (docs/ARCHITECTURE.md, "Self-fencing").

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use consulrs::api::kv::requests::DeleteKeyRequest;
use consulrs::api::session::common::ServiceCheck;
use consulrs::api::session::requests::CreateSessionRequest;
use futures::stream::{FuturesUnordered, StreamExt as _};
use tokio::time::Instant;

use crate::{CoordinationError, FencingToken, InstanceRecord, LockKey, SessionState};

use super::{
    describe, go_duration, is_status, lock, unavailable, Confirmation, RegisterService,
    SessionCheck, Shared, TxnOp, TxnOutcome, CREATE_BACKOFF_MAX, CREATE_BACKOFF_MIN,
    META_CHECK_TCP, META_INSTANCE, REQUEST_TIMEOUT, SERVICE_NAME,
};

impl Shared {
    pub(super) fn set_state(&self, state: SessionState) {
        // Grants of any other session are void: forget them.
        let live = match &state {
            SessionState::Live { id } => Some(id.as_str()),
            SessionState::Lost { .. } => None,
        };
        lock(&self.granted).retain(|_, (session, _)| Some(session.as_str()) == live);
        self.state.send_replace(state);
    }

    /// The token of the grant this backend handed out for `key` under `session` and has not
    /// released, if any.
    pub(super) fn granted_token(&self, key: &LockKey, session: &str) -> Option<FencingToken> {
        lock(&self.granted)
            .get(key)
            .filter(|(s, _)| s == session)
            .map(|(_, token)| *token)
    }

    /// Records that Consul confirmed `session` with a request sent at `sent`. Only moves the
    /// confirmation forward.
    pub(super) fn confirm(&self, session: &str, sent: Instant) {
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
    pub(super) fn valid_until(&self) -> Option<Instant> {
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
    pub(super) async fn register_service(
        &self,
        check: &SessionCheck,
    ) -> Result<(), CoordinationError> {
        const OPERATION: &str = "register service check";
        let answer = self
            .in_time(
                OPERATION,
                self.send_raw(RegisterService::new(&self.config, check)),
            )
            .await?
            .map_err(|e| unavailable(OPERATION, e.to_string()))?;
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
    pub(super) async fn deregister_service(&self) -> Result<(), CoordinationError> {
        self.bounded(
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
    pub(super) async fn remove_stale_registrations(
        &self,
        check: &SessionCheck,
    ) -> Result<(), CoordinationError> {
        let instance = &self.config.instance;
        let ours = self.config.service_id();
        let services = self
            .bounded("list services", consulrs::service::list(&self.client, None))
            .await?
            .response;
        for (id, service) in services {
            let meta = service.meta.unwrap_or_default();
            let stale = service.service.as_deref() == Some(SERVICE_NAME)
                && (id == ours
                    || meta
                        .get(META_CHECK_TCP)
                        .is_some_and(|addr| Some(addr.as_str()) == check.tcp_addr()));
            if !stale {
                continue;
            }
            tracing::warn!(
                %instance,
                service = %id,
                previous_instance = meta.get(META_INSTANCE).map_or("?", String::as_str),
                check_tcp = check.tcp_addr().unwrap_or("-"),
                "deregistering the registration of an earlier gateway process with this \
                 instance name or check address; its lock session ends now",
            );
            self.bounded(
                "deregister stale service",
                consulrs::service::deregister(&self.client, &id, None),
            )
            .await?;
        }
        Ok(())
    }

    /// The local agent's view of this instance's check, for the log after an invalidation.
    pub(super) async fn check_status(&self) -> String {
        let check_id = self.config.check_id();
        match self
            .bounded("list checks", consulrs::check::list(&self.client, None))
            .await
        {
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
    pub(super) async fn check_registered(&self) -> Result<bool, CoordinationError> {
        let checks = self
            .bounded("list checks", consulrs::check::list(&self.client, None))
            .await?;
        Ok(checks.response.contains_key(&self.config.check_id()))
    }

    /// Creates a session, returning its id and the send time of the create request. A
    /// check-bound one first gets its service check registered: always at `connect`
    /// ([`Registration::Always`], fresh and passing), and on recovery only if the agent lost
    /// it ([`Registration::IfMissing`]: an agent restarted without its data, or the
    /// registration reaped after `deregister_after`). A check that is registered but
    /// critical is left alone: Consul refuses the session until the check passes again, and
    /// resetting it to passing would only get a session that the next check run ends.
    pub(super) async fn open_session(
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
        let created = self
            .bounded(
                "create session",
                consulrs::session::create(&self.client, Some(&mut request)),
            )
            .await?;
        Ok((created.response.id, sent))
    }

    /// Destroys a session and, first, deletes the keys it holds under the prefix one by one:
    /// explicit deletes set no lock-delay, so successors can take the keys at once, while
    /// destroying the session alone would lock them out for `lock_delay`.
    pub(super) async fn end_session(&self, session: &str) {
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
                    let deleted = self
                        .bounded(
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
        match self
            .bounded(
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

    /// Writes this instance's [`InstanceRecord`] (when it advertises an address) under
    /// `<prefix>/~instances/<instance>/<session>`, locked by `session`: it vanishes with the
    /// session (`Behavior = delete`), so a record found locked names a live instance. A key
    /// per session, so a restarted instance with the same name never waits for the record of
    /// its predecessor's session to expire.
    pub(super) async fn register_instance(&self, session: &str) -> Result<(), CoordinationError> {
        const OPERATION: &str = "register instance";
        let Some(address) = &self.config.advertise else {
            return Ok(());
        };
        let record = InstanceRecord {
            instance: self.config.instance.clone(),
            address: address.clone(),
        };
        let value = serde_json::to_vec(&record)
            .map_err(|e| unavailable(OPERATION, format!("record not serializable: {e}")))?;
        let path = format!(
            "{}{}/{session}",
            self.config.instances_folder(),
            self.config.instance
        );
        match self
            .txn(OPERATION, vec![TxnOp::lock(&path, &value, session)])
            .await?
        {
            TxnOutcome::Applied(_) => Ok(()),
            TxnOutcome::Refused(refusal) => {
                Err(unavailable(OPERATION, format!("{path}: {refusal}")))
            }
        }
    }

    /// A new session with this instance's record registered under it; a session whose
    /// record could not be written is destroyed again (unused, it holds nothing).
    pub(super) async fn open_registered_session(
        &self,
        registration: Registration,
    ) -> Result<(String, Instant), CoordinationError> {
        let (id, sent) = self.open_session(registration).await?;
        if let Err(error) = self.register_instance(&id).await {
            let _ = self
                .bounded(
                    "destroy unregistered session",
                    consulrs::session::delete(&self.client, &id, None),
                )
                .await;
            return Err(error);
        }
        ::metrics::counter!(super::metrics::SESSIONS_CREATED).increment(1);
        Ok((id, sent))
    }

    /// Creates a session, retrying with backoff until Consul answers.
    pub(super) async fn create_session_until_done(&self) -> Held {
        let mut backoff = CREATE_BACKOFF_MIN;
        loop {
            match self.open_registered_session(Registration::IfMissing).await {
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
    pub(super) async fn renew_once(&self, session: &str, limit: Duration) -> (Instant, Renewal) {
        let sent = Instant::now();
        let renewed = tokio::time::timeout(
            limit,
            consulrs::session::renew(&self.critical, session, None),
        )
        .await;
        ::metrics::histogram!(super::metrics::RENEW_SECONDS).record(sent.elapsed().as_secs_f64());
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
    /// time.
    ///
    /// When `S + fence_window` passes, the locks are *suspended*: `valid_until` is past, so
    /// no side effect passes the fence, but the session is kept and renews go on. A renew
    /// that Consul then confirms proves the session (and so every lock of it) was never
    /// invalidated in between, and moves `valid_until` ahead again: a Consul leader election,
    /// or a few seconds without the agent, costs a pause rather than every lease. The session
    /// is given up (lost) when Consul says it is gone, or when `S + session_ttl` passes
    /// without a confirmation: by then Consul may have expired it, and the instance has
    /// waited long enough to say so to its clients.
    pub(super) async fn keep_alive(&self, held: &mut Held) -> Loss {
        let instance = &self.config.instance;
        let every = self.config.renew_interval();
        // An answer later than this is worthless: it would confirm a deadline already past.
        let limit = REQUEST_TIMEOUT.min(self.fence_window);
        let mut attempts = FuturesUnordered::new();
        let mut next = held.confirmed + every;
        let give_up = self.config.session_ttl.max(self.fence_window);
        let mut suspended = false;
        loop {
            let fence_at = held.confirmed + self.fence_window;
            let give_up_at = held.confirmed + give_up;
            tokio::select! {
                biased;
                Some((sent, outcome)) = attempts.next(), if !attempts.is_empty() => {
                    match outcome {
                        Renewal::Confirmed => {
                            if sent > held.confirmed {
                                held.confirmed = sent;
                                self.confirm(&held.id, sent);
                                if suspended && Instant::now() < sent + self.fence_window {
                                    suspended = false;
                                    tracing::info!(
                                        %instance,
                                        session = %held.id,
                                        "consul confirmed the lock session again; its locks are no longer suspended",
                                    );
                                }
                            }
                        }
                        Renewal::Gone => return Loss::Invalidated,
                        Renewal::Failed(error) => {
                            ::metrics::counter!(super::metrics::RENEW_FAILURES).increment(1);
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
                () = tokio::time::sleep_until(fence_at), if !suspended => {
                    suspended = true;
                    ::metrics::counter!(super::metrics::SESSIONS_SUSPENDED).increment(1);
                    tracing::warn!(
                        %instance,
                        session = %held.id,
                        fence_window = ?self.fence_window,
                        give_up_in = ?give_up_at.saturating_duration_since(Instant::now()),
                        "no renew confirmed for a whole fence window; every lock is suspended (self-fence) until consul confirms the session",
                    );
                }
                () = tokio::time::sleep_until(give_up_at), if !no_self_fence_planted() => {
                    return Loss::Unreachable
                }
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

/// Whether the fault tests planted the defect `no-self-fence` in this process
/// (`KAFKA_LEASE_PLANTED_DEFECT`, read only in a build with the `planted-defects` feature,
/// which no release enables; the server's `defects.rs` holds the other half): the renew task
/// then never gives up a session it cannot confirm.
#[cfg(feature = "planted-defects")]
fn no_self_fence_planted() -> bool {
    std::env::var("KAFKA_LEASE_PLANTED_DEFECT").is_ok_and(|d| d == "no-self-fence")
}

#[cfg(not(feature = "planted-defects"))]
fn no_self_fence_planted() -> bool {
    false
}

/// A live session as the renew task tracks it.
pub(super) struct Held {
    pub(super) id: String,
    /// Send time of the last request Consul confirmed the session with.
    pub(super) confirmed: Instant,
}

/// When [`Shared::open_session`] registers the service check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Registration {
    Always,
    IfMissing,
}

/// What one renew found out.
pub(super) enum Renewal {
    Confirmed,
    /// Consul does not know the session (any more).
    Gone,
    /// No usable answer: unreachable, an error, or too slow.
    Failed(String),
}

pub(super) enum Loss {
    /// Consul says the session no longer exists.
    Invalidated,
    /// No renew was confirmed for a whole fence window.
    Unreachable,
}

/// The renew task: keeps the session alive, and replaces it when it is lost.
pub(super) async fn run_renewer(shared: Arc<Shared>, first: Held) {
    let instance = shared.config.instance.clone();
    let window = shared.fence_window;
    let mut held = first;
    // Sessions given up while Consul was unreachable: destroyed once it answers again, so
    // their keys go now rather than when Consul's own timer (up to 2×TTL) fires.
    let mut abandoned: Vec<String> = Vec::new();
    loop {
        match shared.keep_alive(&mut held).await {
            Loss::Invalidated => {
                ::metrics::counter!(super::metrics::SESSIONS_LOST, "cause" => "invalidated")
                    .increment(1);
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
                ::metrics::counter!(super::metrics::SESSIONS_LOST, "cause" => "self_fence")
                    .increment(1);
                let silent = held.confirmed.elapsed();
                let since = SystemTime::now()
                    .checked_sub(silent)
                    .unwrap_or(SystemTime::UNIX_EPOCH);
                let since = humantime::format_rfc3339_seconds(since);
                shared.set_state(SessionState::Lost {
                    reason: format!(
                        "consul unreachable since {since} (no renew confirmed for {silent:?}: \
                         the locks were suspended after the fence window, {window:?}, and \
                         given up after the session TTL, {:?})",
                        shared.config.session_ttl
                    ),
                });
                tracing::warn!(
                    %instance,
                    session = %held.id,
                    ?silent,
                    fence_window = ?window,
                    "no renew confirmed for a whole session TTL; every lock is void, creating a new session",
                );
                abandoned.push(held.id.clone());
            }
        }
        held = shared.create_session_until_done().await;
        for old in std::mem::take(&mut abandoned) {
            let destroyed = shared
                .bounded(
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
