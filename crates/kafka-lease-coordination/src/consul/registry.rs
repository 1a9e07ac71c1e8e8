//! Who is where: the address another instance advertises (its instance record), and this
//! instance's member records (`join`, `leave`), each bound to its session; and the target
//! assignments of subscriptions, bound to none.

use crate::{CoordinationError, GroupTarget, InstanceRecord, MemberRecord};

use super::views::{member_path, target_path};
use super::{unavailable, Shared, TxnOp, TxnOutcome, TxnRefusal};

impl Shared {
    /// One read of `<prefix>/~instances/<instance>/`: the newest record still locked by a
    /// session (an instance restarted under the same name may briefly have two).
    pub(super) async fn instance_address(
        &self,
        instance: &str,
    ) -> Result<Option<String>, CoordinationError> {
        let folder = format!("{}{instance}/", self.config.instances_folder());
        let read = self
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
    pub(super) async fn join(
        &self,
        group: &str,
        topic: &str,
        member: &MemberRecord,
    ) -> Result<bool, CoordinationError> {
        const OPERATION: &str = "join";
        let session = self.live_session()?;
        let path = member_path(self.prefix(), group, topic, &member.member_id);
        let value = serde_json::to_vec(member)
            .map_err(|e| unavailable(OPERATION, format!("record not serializable: {e}")))?;
        match self
            .txn(OPERATION, vec![TxnOp::lock(&path, &value, &session)])
            .await?
        {
            TxnOutcome::Applied(_) => Ok(true),
            TxnOutcome::Refused(TxnRefusal::AlreadyHeld(_) | TxnRefusal::LockDelay(_)) => Ok(false),
            TxnOutcome::Refused(TxnRefusal::InvalidSession(what)) => {
                self.poke.notify_one();
                Err(CoordinationError::NoSession {
                    reason: format!("consul rejected session {session}: {what}"),
                })
            }
            TxnOutcome::Refused(TxnRefusal::Other(what)) => {
                Err(unavailable(OPERATION, format!("{path}: {what}")))
            }
        }
    }

    /// One `/v1/txn`: check that this session holds the record, then delete it.
    pub(super) async fn leave(
        &self,
        group: &str,
        topic: &str,
        member_id: &str,
    ) -> Result<(), CoordinationError> {
        const OPERATION: &str = "leave";
        let Ok(session) = self.live_session() else {
            // No session: its records are gone with the last one.
            return Ok(());
        };
        let path = member_path(self.prefix(), group, topic, member_id);
        match self
            .txn(
                OPERATION,
                vec![TxnOp::check_session(&path, &session), TxnOp::delete(&path)],
            )
            .await?
        {
            // Refused: not ours (any more); nothing to remove.
            TxnOutcome::Applied(_) | TxnOutcome::Refused(_) => Ok(()),
        }
    }

    /// One `/v1/txn` with a `cas` of the target key: applied only if the key is still at
    /// `replaces` (absent, for `None`).
    pub(super) async fn publish_target(
        &self,
        group: &str,
        topic: &str,
        target: &GroupTarget,
        replaces: Option<u64>,
    ) -> Result<bool, CoordinationError> {
        const OPERATION: &str = "publish_target";
        let path = target_path(self.prefix(), group, topic);
        let value = serde_json::to_vec(target)
            .map_err(|e| unavailable(OPERATION, format!("target not serializable: {e}")))?;
        match self
            .txn(
                OPERATION,
                vec![TxnOp::cas(&path, &value, replaces.unwrap_or(0))],
            )
            .await?
        {
            TxnOutcome::Applied(_) => Ok(true),
            // The only check is the index: another epoch was written first.
            TxnOutcome::Refused(_) => Ok(false),
        }
    }

    /// One `/v1/txn` with a `delete-cas` of the target key.
    pub(super) async fn remove_target(
        &self,
        group: &str,
        topic: &str,
        index: u64,
    ) -> Result<bool, CoordinationError> {
        let path = target_path(self.prefix(), group, topic);
        match self
            .txn("remove_target", vec![TxnOp::delete_cas(&path, index)])
            .await?
        {
            TxnOutcome::Applied(_) => Ok(true),
            TxnOutcome::Refused(_) => Ok(false),
        }
    }
}
