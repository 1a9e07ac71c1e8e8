//! Partition locks: acquiring a key with one `/v1/txn` lock, releasing it with a CAS delete,
//! reading back a grant, and the keys found free but refused under lock-delay.

use std::time::Duration;

use consulrs::api::features::ConsistencyMode;
use consulrs::api::kv::requests::DeleteKeyRequest;
use tokio::time::Instant;

use crate::{Acquisition, CoordinationError, FencingToken, HolderInfo, LockGrant, LockKey};

use super::{describe, is_status, lock, unavailable, Shared, TxnOp, TxnOutcome, TxnRefusal};

/// The floor of the window in which a key that is free but refused is assumed to be under
/// lock-delay (see [`Shared::note_refused`]).
const LOCK_DELAY_POLL_MIN: Duration = Duration::from_millis(500);
/// How soon to try again a key still refused right after its expected lock-delay end.
const LOCK_DELAY_REPOLL: Duration = Duration::from_millis(100);

/// When a key found free but refused is expected to become acquirable.
#[derive(Clone, Copy, Debug)]
pub(super) struct Refusal {
    /// When to try again.
    until: Instant,
    /// The end of the lock-delay window first noted for it.
    expected_end: Instant,
}

impl Shared {
    /// One `/v1/txn` with a `lock` operation: a single Raft write, whose answer carries the
    /// key's `ModifyIndex` after the lock (the token: the committed index of the very write
    /// that took it, so no read-back). Nothing is read first; a caller that watches the
    /// topic ([`LockBackend::topic_view`]) tries only keys it has seen free.
    ///
    /// A key this backend granted and has not released is answered from memory: a second
    /// `lock` by the same session would succeed but rewrite the key, moving its `ModifyIndex`
    /// and so voiding the token (and the `?cas` release) of the grant already handed out.
    pub(super) async fn try_acquire(
        &self,
        key: &LockKey,
        holder: &HolderInfo,
    ) -> Result<Acquisition, CoordinationError> {
        const OPERATION: &str = "try_acquire";
        let session = self.live_session()?;
        if let Some(token) = self.granted_token(key, &session) {
            return Ok(Acquisition::Acquired(LockGrant::new(
                key.clone(),
                token,
                session,
            )));
        }
        let path = key.path(self.prefix());
        let value = serde_json::to_vec(holder)
            .map_err(|e| unavailable(OPERATION, format!("holder not serializable: {e}")))?;
        let outcome = self
            .txn(OPERATION, vec![TxnOp::lock(&path, &value, &session)])
            .await?;
        let refusal = match outcome {
            TxnOutcome::Applied(entries) => {
                let entry = entries.into_iter().find(|e| e.key == path);
                return match entry {
                    Some(entry) if entry.session.as_deref() == Some(&session) => {
                        let token = FencingToken::issued(entry.modify_index);
                        lock(&self.refused).remove(key);
                        lock(&self.granted).insert(key.clone(), (session.clone(), token));
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
            TxnOutcome::Refused(refusal) => refusal,
        };
        match refusal {
            TxnRefusal::InvalidSession(what) => {
                // Consul dropped the session before the renew task noticed: have it renew
                // now, which finds out and starts the recovery.
                self.poke.notify_one();
                Err(CoordinationError::NoSession {
                    reason: format!("consul rejected session {session}: {what}"),
                })
            }
            TxnRefusal::LockDelay(_) => {
                // Free yet refused: the lock-delay of a session invalidated a moment ago.
                // Nothing is written when the delay ends, so remember when it does (see
                // `wait_cut`).
                self.note_refused(key);
                Ok(Acquisition::Delayed)
            }
            TxnRefusal::AlreadyHeld(_) => Ok(Acquisition::Held),
            TxnRefusal::Other(what) => Err(unavailable(OPERATION, format!("{path}: {what}"))),
        }
    }

    /// Releases a grant with a CAS delete of its key.
    pub(super) async fn release(&self, grant: LockGrant) -> Result<(), CoordinationError> {
        // `?cas=<token>` deletes the key only if it was not written since our acquire (we
        // never write it while holding it), so a key lost and taken by someone else since is
        // never touched. An explicit delete sets no lock-delay: a successor can take it now.
        let path = grant.key().path(self.prefix());
        // Whatever comes of it, the grant is given up: a later try_acquire must go to Consul.
        lock(&self.granted).remove(grant.key());
        let mut request = DeleteKeyRequest::builder();
        request.cas(grant.token().get());
        let deleted = consulrs::kv::delete(&self.client, &path, Some(&mut request));
        match self.in_time("release", deleted).await? {
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

    /// The grant the live session holds on `key`, read consistently.
    pub(super) async fn held_grant(
        &self,
        key: &LockKey,
    ) -> Result<Option<LockGrant>, CoordinationError> {
        let session = self.live_session()?;
        let entry = self
            .read_key(
                "held_grant",
                &key.path(self.prefix()),
                Some(ConsistencyMode::CONSISTENT),
            )
            .await?;
        Ok(entry
            .filter(|e| e.session.as_deref() == Some(session.as_str()))
            .map(|e| LockGrant::new(key.clone(), FencingToken::issued(e.modify_index), session)))
    }

    /// Notes that `key` was found free but refused: under the lock-delay of a session
    /// invalidated a moment ago, which ends at most `lock_delay` from now. A refusal inside
    /// that window keeps its end; one shortly after it (the estimate was a hair early: the
    /// delay started a moment after the key was seen free, or the leader's clock runs ahead)
    /// polls again in [`LOCK_DELAY_REPOLL`] instead of arming a whole new window.
    fn note_refused(&self, key: &LockKey) {
        let delay = self.config.lock_delay.max(LOCK_DELAY_POLL_MIN);
        let now = Instant::now();
        let mut refused = lock(&self.refused);
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
    pub(super) fn wait_limit(&self, key: &LockKey, timeout: Duration) -> Duration {
        lock(&self.refused)
            .get(key)
            .and_then(|r| r.until.checked_duration_since(Instant::now()))
            .map_or(timeout, |left| left.min(timeout))
    }
}
