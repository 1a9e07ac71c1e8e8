//! Reading the KV layout: a topic's view (its held partitions and member records, blocking
//! on a change), the member records of a group, the list of every held lock, and the layout
//! helpers they share.

use std::time::Duration;

use consulrs::api::kv::common::KVPair;

use crate::{
    CoordinationError, FencingToken, GroupTarget, HeldLock, HeldPartition, LockKey, MemberRecord,
    PublishedTarget, TopicView,
};

use super::{holder_of, unavailable, KvRead, Shared, REQUEST_TIMEOUT};

/// Consul lengthens a blocking query's `wait` by a random jitter of up to `wait / 16`.
const JITTER_DIVISOR: u32 = 16;
/// The shortest `wait` asked of Consul: `wait=0` would mean its default of 5 minutes.
const MIN_SERVER_WAIT: Duration = Duration::from_secs(1);

/// The folder of a topic's member records, under its lock prefix: `~` cannot occur in a
/// partition number, so no lock key lies under it.
const MEMBERS_DIR: &str = "~members";

/// The key of a topic's target assignment, under its lock prefix; written with
/// check-and-set, bound to no session.
const TARGET_KEY: &str = "~target";

/// A stored target assignment, if `entry` holds one that parses.
fn target_of(entry: &KVPair) -> Option<PublishedTarget> {
    let bytes: Vec<u8> = entry.value.clone()?.try_into().ok()?;
    match serde_json::from_slice::<GroupTarget>(&bytes) {
        Ok(target) => Some(PublishedTarget {
            target,
            index: entry.modify_index,
        }),
        Err(error) => {
            tracing::warn!(
                key = %entry.key,
                %error,
                "ignoring a target assignment that does not parse; the next epoch replaces it",
            );
            None
        }
    }
}

/// The view of one topic from a read of its prefix: the locked keys that parse as
/// `<group>/<topic>/<partition>` of this topic, the locked member records under
/// `<group>/<topic>/~members/`, and the target assignment at `<group>/<topic>/~target`.
fn view_of(prefix: &str, group: &str, topic: &str, read: KvRead<KVPair>) -> TopicView {
    let topic_prefix = LockKey::new(group, topic, 0).topic_prefix(prefix);
    let members_folder = format!("{topic_prefix}{MEMBERS_DIR}/");
    let target_key = format!("{topic_prefix}{TARGET_KEY}");
    let target = read
        .entries
        .iter()
        .find(|e| e.key == target_key)
        .and_then(target_of);
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
                    token: Some(FencingToken::issued(entry.modify_index)),
                    holder: holder_of(entry),
                },
            ))
        })
        .collect();
    TopicView {
        index: read.index,
        held,
        members,
        target,
    }
}

/// The key of a topic's target assignment.
pub(super) fn target_path(prefix: &str, group: &str, topic: &str) -> String {
    format!(
        "{}{TARGET_KEY}",
        LockKey::new(group, topic, 0).topic_prefix(prefix)
    )
}

/// The key of a member's record.
pub(super) fn member_path(prefix: &str, group: &str, topic: &str, member_id: &str) -> String {
    format!(
        "{}{MEMBERS_DIR}/{member_id}",
        LockKey::new(group, topic, 0).topic_prefix(prefix)
    )
}

impl Shared {
    /// A read of the topic prefix with values (`?recurse`): one request whatever the number
    /// of partitions. Blocking (`after: Some`), Consul's `wait` is `timeout × 16/17` (at
    /// least 1 s), so that with its jitter of up to `wait/16` the answer still comes within
    /// `timeout`; the local limit only catches a dead connection. A `timeout` below Consul's
    /// shortest wait ends locally and then reads the topic as it is. The index returned is
    /// Consul's; it may be lower than `after` (Consul reaped tombstones): per Consul's rules
    /// that is simply the next index to wait on.
    pub(super) async fn topic_view(
        &self,
        group: &str,
        topic: &str,
        after: Option<u64>,
        timeout: Duration,
    ) -> Result<TopicView, CoordinationError> {
        const OPERATION: &str = "topic_view";
        let prefix = LockKey::new(group, topic, 0).topic_prefix(self.prefix());
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
                let short = self
                    .read_prefix(OPERATION, &prefix, Some((index, MIN_SERVER_WAIT)), timeout)
                    .await?;
                if let Some(read) = short {
                    return Ok(view_of(self.prefix(), group, topic, read));
                }
                (None, REQUEST_TIMEOUT)
            }
            None => (None, REQUEST_TIMEOUT),
        };
        match self
            .read_prefix(OPERATION, &prefix, blocking, limit)
            .await?
        {
            Some(read) => Ok(view_of(self.prefix(), group, topic, read)),
            None => Err(unavailable(
                OPERATION,
                format!("no answer within {limit:?}"),
            )),
        }
    }

    /// One read of the group's prefix, keeping the locked member records.
    pub(super) async fn members(
        &self,
        group: &str,
    ) -> Result<Vec<(String, MemberRecord)>, CoordinationError> {
        let prefix = self.prefix();
        let path = format!("{prefix}/{group}/");
        let read = self.read_kv("members", &path, true, None).await?;
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

    /// One read of the group's prefix, keeping the target assignments.
    pub(super) async fn targets(
        &self,
        group: &str,
    ) -> Result<std::collections::BTreeMap<String, PublishedTarget>, CoordinationError> {
        let prefix = self.prefix();
        let path = format!("{prefix}/{group}/");
        let read = self.read_kv("targets", &path, true, None).await?;
        Ok(read
            .entries
            .iter()
            .filter_map(|entry| {
                let topic = entry
                    .key
                    .strip_prefix(&path)?
                    .strip_suffix(&format!("/{TARGET_KEY}"))?;
                (!topic.contains('/')).then_some(())?;
                Some((topic.to_string(), target_of(entry)?))
            })
            .collect())
    }

    /// Every held lock under the prefix (or one group's), ordered by key: one read, skipping
    /// the instance and member records.
    pub(super) async fn list(
        &self,
        group: Option<&str>,
    ) -> Result<Vec<HeldLock>, CoordinationError> {
        let prefix = self.prefix();
        let path = match group {
            Some(group) => format!("{prefix}/{group}/"),
            None => format!("{prefix}/"),
        };
        let instances = self.config.instances_folder();
        let read = self.read_kv("list", &path, true, None).await?;
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
                    token: FencingToken::issued(entry.modify_index),
                    holder: holder_of(entry)?,
                })
            })
            .collect();
        held.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(held)
    }
}
