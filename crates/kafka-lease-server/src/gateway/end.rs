//! How leases end: expiry, release, session loss and shutdown, each through
//! [`Gateway::end_lease`] (commits settled, fetching stopped, lock released), and the
//! background releaser for a lock whose release is not confirmed.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tracing::Instrument;

use crate::coordination::{LockKey, SessionState};
use crate::error::EndReason;
use crate::lease::Lease;
use crate::waiters::TopicWaiters;

use super::Gateway;

/// How long the end of a lease waits in the foreground for its commits in flight to settle
/// before it leaves the rest to a background task.
const COMMIT_SETTLE_WAIT: Duration = Duration::from_secs(5);
/// How long the end of a queue-mode lease (expired, or with its gateway) waits to commit
/// the queue's progress.
const QUEUE_FLUSH_WAIT: Duration = Duration::from_secs(3);

/// How long the background releaser waits between attempts at most.
const RELEASE_RETRY_MAX: Duration = Duration::from_secs(2);

impl Gateway {
    /// Ends every lease whose lock was granted under a session that is no longer live.
    pub(super) async fn on_session_state(&self, state: &SessionState) {
        let stale: Vec<Arc<Lease>> = {
            let mut table = self.table();
            table.session_changed(match state {
                SessionState::Live { id } => Some(id.as_str()),
                SessionState::Lost { .. } => None,
            });
            table
                .leases()
                .filter(|lease| match state {
                    SessionState::Live { id } => lease.session_id() != id,
                    SessionState::Lost { .. } => true,
                })
                .cloned()
                .collect()
        };
        // Keys the old session may have held are claimable again here: offer them.
        let lines: Vec<Arc<TopicWaiters>> = self
            .waiters
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter_map(Weak::upgrade)
            .collect();
        for line in lines {
            line.dispatch();
        }
        let reason = match state {
            SessionState::Live { .. } => "the gateway's Consul session was replaced".to_string(),
            SessionState::Lost { reason } => reason.clone(),
        };
        // All at once: every one of them must stop before the fence window is over, and
        // ending one never waits on another.
        futures::future::join_all(stale.iter().map(|lease| {
            tracing::warn!(parent: &lease.span, %reason, "lock session lost; ending lease");
            self.end_lease(lease, EndReason::Lost(reason.clone()))
        }))
        .await;
    }

    /// Makes sure `session` no longer holds `key`, in the background: asks the backend what
    /// it holds and releases that, retrying until the backend answers or the session is gone
    /// (its locks are then void). The key stays unreleased in the table until then.
    pub(super) fn spawn_release_key(&self, key: LockKey, session: String) {
        let gateway = self.me.clone();
        tokio::spawn(async move {
            let mut pause = Duration::from_millis(100);
            loop {
                let Some(gateway) = gateway.upgrade() else {
                    return;
                };
                if gateway.live_session().as_deref() != Some(session.as_str()) {
                    gateway.table().released(&key, &session);
                    gateway.freed(&key);
                    return;
                }
                let outcome = match gateway.locks.held_grant(&key).await {
                    Ok(None) => Ok(()),
                    Ok(Some(grant)) => gateway.locks.release(grant).await,
                    Err(err) => Err(err),
                };
                match outcome {
                    Ok(()) => {
                        gateway.table().released(&key, &session);
                        gateway.freed(&key);
                        tracing::info!(key = %key, "lock released after an earlier attempt failed");
                        return;
                    }
                    Err(err) => {
                        tracing::warn!(
                            key = %key,
                            error = %err,
                            retry_in = ?pause,
                            "releasing a lock failed; retrying",
                        );
                    }
                }
                drop(gateway);
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(RELEASE_RETRY_MAX);
            }
        });
    }

    /// Ends a lease: out of the table, commits in flight settled, partition fetching
    /// stopped, lock released. Safe to call more than once; only the first call does
    /// anything.
    ///
    /// The lock is released only once no commit of the lease can still land (the commit
    /// gate), so a successor never sees its committed offset overwritten by this lease. That
    /// wait is bounded by librdkafka's request timeout; the caller waits for it at most
    /// [`COMMIT_SETTLE_WAIT`], after which the rest happens in the background and the key
    /// stays held (and blocked here) until it is done. The first release attempt is awaited
    /// (so that after Release returns, a successor's Acquire succeeds at once); if it fails,
    /// the background releaser retries until Consul confirms or the session is gone, and the
    /// key stays blocked on this instance until then (see `Table`).
    ///
    /// The work runs to its end in a task of its own, so a caller that goes away (a Release
    /// whose client is gone drops its handler) cannot stop it between taking the lease out
    /// of the table and releasing its lock, which would leave the key held for good.
    pub async fn end_lease(&self, lease: &Arc<Lease>, reason: EndReason) {
        let Some(gateway) = self.me.upgrade() else {
            // The gateway is being dropped: nobody can cancel this caller's work any more.
            return self.end_lease_to_the_end(lease, reason).await;
        };
        let lease = lease.clone();
        let ending = tokio::spawn(
            async move { gateway.end_lease_to_the_end(&lease, reason).await }.in_current_span(),
        );
        if let Err(err) = ending.await {
            tracing::error!(error = %err, "ending a lease failed");
        }
    }

    /// [`end_lease`](Self::end_lease)'s work, in whichever task runs it.
    async fn end_lease_to_the_end(&self, lease: &Arc<Lease>, reason: EndReason) {
        // A queue's progress since its last commit is committed while the lease can still
        // commit, so that a gateway's restart or a client gone quiet repeats nothing
        // answered (Release has done so already; a lost lease cannot).
        if matches!(reason, EndReason::Expired | EndReason::Shutdown) && !lease.is_ended() {
            if let Err(err) = tokio::time::timeout(QUEUE_FLUSH_WAIT, lease.flush_queue())
                .await
                .unwrap_or(Ok(()))
            {
                tracing::warn!(
                    parent: &lease.span,
                    error = %err,
                    "committing the queue's progress at the lease's end failed",
                );
            }
        }
        if !lease.mark_ended(reason.clone()) {
            return;
        }
        metrics::counter!(crate::metrics::LEASES_ENDED, "reason" => reason.label()).increment(1);
        self.table().remove_ended(lease, reason.clone());
        use crate::defects::{planted, Defect};
        if planted(Defect::NoCommitGate)
            || (planted(Defect::ReleaseWithoutWaiting) && matches!(reason, EndReason::Released))
        {
            self.dismantle_and_release(lease).await;
            tracing::info!(parent: &lease.span, %reason, "lease ended");
            return;
        }
        let settling = tokio::time::Instant::now();
        match tokio::time::timeout(COMMIT_SETTLE_WAIT, lease.commits_settled()).await {
            Ok(_settled) => {
                let settled = settling.elapsed();
                self.dismantle_and_release(lease).await;
                tracing::debug!(
                    parent: &lease.span,
                    settle_us = settled.as_micros() as u64,
                    end_us = settling.elapsed().as_micros() as u64,
                    "the lease's end's steps",
                );
            }
            Err(_) => {
                tracing::warn!(
                    parent: &lease.span,
                    "a commit is still in flight; the lock is released once it settles",
                );
                let (gateway, lease) = (self.me.clone(), lease.clone());
                tokio::spawn(async move {
                    let _settled = lease.commits_settled().await;
                    if let Some(gateway) = gateway.upgrade() {
                        gateway.dismantle_and_release(&lease).await;
                    }
                });
            }
        }
        tracing::info!(parent: &lease.span, %reason, "lease ended");
    }

    /// Stops fetching the partition (so a successor on this instance can assign it again),
    /// then releases the lease's lock.
    async fn dismantle_and_release(&self, lease: &Lease) {
        let dismantling = tokio::time::Instant::now();
        let Some(grant) = lease.dismantle().await else {
            self.table().released(&lease.key, lease.session_id());
            self.freed(&lease.key);
            return;
        };
        let dismantled = dismantling.elapsed();
        let (key, session) = (grant.key().clone(), grant.session().to_string());
        let released = self.locks.release(grant).await;
        tracing::debug!(
            parent: &lease.span,
            unassign_us = dismantled.as_micros() as u64,
            unlock_us = (dismantling.elapsed() - dismantled).as_micros() as u64,
            "the lease's dismantling's steps",
        );
        match released {
            Ok(()) => {
                self.table().released(&key, &session);
                self.freed(&key);
            }
            Err(err) => {
                tracing::warn!(
                    parent: &lease.span,
                    error = %err,
                    "explicit lock release failed; retrying in the background",
                );
                self.spawn_release_key(key, session);
            }
        }
    }

    /// Stops granting leases and ends every lease (their Reads end with UNAVAILABLE),
    /// releasing each lock explicitly so successors on other instances take over at once.
    pub async fn shutdown(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
        self.stopping.send_replace(true);
        let leases: Vec<Arc<Lease>> = self.table().leases().cloned().collect();
        let count = leases.len();
        futures::future::join_all(
            leases
                .iter()
                .map(|lease| self.end_lease(lease, EndReason::Shutdown)),
        )
        .await;
        tracing::info!(leases = count, "all leases released");
    }
}
