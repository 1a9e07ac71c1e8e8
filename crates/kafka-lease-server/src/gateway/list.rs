//! ListLeases and ListMembers: every lock of a group from the backend, with live details
//! where this instance serves the lease; and this instance's own leases, for the metrics and
//! for another instance's ListLeases.

use std::sync::Arc;

use crate::coordination::{FencingToken, LockKey};
use crate::error::LeaseError;
use crate::lease::{Lease, LeaseSnapshot};

use super::{Gateway, ListedLease, ListedMember};

impl Gateway {
    /// Every lease this instance serves, with its live state (for the metrics).
    pub fn local_leases(&self) -> Vec<(LockKey, LeaseSnapshot)> {
        let leases: Vec<Arc<Lease>> = self.table().leases().cloned().collect();
        leases
            .into_iter()
            .map(|lease| {
                let mut snapshot = lease.snapshot();
                // The partition keeps being fetched while no Read is open, so librdkafka's
                // watermark is fresher than the one the last batch carried.
                if let Some(high) = lease.fetched_high_watermark() {
                    snapshot.high_watermark = snapshot.high_watermark.max(high);
                }
                (lease.key.clone(), snapshot)
            })
            .collect()
    }

    /// The live details of the lease this instance serves on `key` under `token`, if it
    /// does: for another instance's ListLeases.
    pub fn describe(&self, key: &LockKey, token: FencingToken) -> Option<LeaseSnapshot> {
        self.table()
            .lease_at(key)
            .filter(|l| l.token == token)
            .map(|l| l.snapshot())
    }

    /// Every held lease across all instances, with local detail where this one serves it.
    pub async fn list(
        &self,
        group: Option<&str>,
        topic: Option<&str>,
    ) -> Result<Vec<ListedLease>, LeaseError> {
        let held = self.locks.list(group).await?;
        let table = self.table();
        Ok(held
            .into_iter()
            .filter(|h| topic.is_none_or(|t| h.key.topic == t))
            .map(|h| {
                let local = table
                    .lease_at(&h.key)
                    .filter(|l| l.token == h.token)
                    .map(|l| l.snapshot());
                ListedLease {
                    key: h.key,
                    holder: h.holder,
                    token: h.token,
                    local,
                }
            })
            .collect())
    }

    /// The members subscribed to `group` (of `topic` only, if given), each with the
    /// partitions its leases hold and those its topic's target gives it: three reads of the
    /// group's prefix.
    pub async fn list_members(
        &self,
        group: &str,
        topic: Option<&str>,
    ) -> Result<Vec<ListedMember>, LeaseError> {
        let members = self.locks.members(group).await?;
        let held = self.locks.list(Some(group)).await?;
        let targets = self.locks.targets(group).await?;
        Ok(members
            .into_iter()
            .filter(|(t, _)| topic.is_none_or(|topic| t == topic))
            .map(|(t, record)| {
                let partitions = held
                    .iter()
                    .filter(|h| h.key.topic == t && h.holder.subscriber == record.member_id)
                    .map(|h| h.key.partition)
                    .collect();
                let target = targets.get(&t).map(|p| &p.target);
                ListedMember {
                    epoch: target.map_or(0, |t| t.epoch),
                    target: target.and_then(|t| t.assignment.get(&record.member_id).cloned()),
                    topic: t,
                    record,
                    partitions,
                }
            })
            .collect())
    }
}
