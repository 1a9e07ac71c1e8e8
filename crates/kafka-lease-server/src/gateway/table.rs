//! The local lease table: which leases this instance serves, which keys it is trying or may
//! still hold in the backend, and what it may take on. Its fields are private: every rule
//! that keeps leases on this instance exclusive is one of its methods.

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;

use crate::coordination::LockKey;
use crate::error::EndReason;
use crate::lease::{Lease, LeaseId};

use super::Limits;

/// How many ended leases are remembered, so late calls get "lease expired" or "lease lost"
/// rather than "unknown lease".
const ENDED_MEMORY: usize = 10_000;

/// The local lease table, and the rules that keep leases on this instance exclusive. Its
/// methods are the only place those rules are written down:
///
/// - a key has at most one live lease here (`by_key`);
/// - a key is *claimed* by at most one Acquire attempt at a time (`claimed`), because the
///   lock backend cannot tell two attempts by the same session apart;
/// - a key this instance may still hold in the backend without a lease (a lease ended but its
///   release is not confirmed, or an acquire whose answer was lost) is *unreleased*, and
///   cannot be claimed until the release is confirmed or the session that held it is gone.
///   Otherwise the backend would hand the key straight back to this session (with the old
///   token), and the release in flight would then free it under the new lease.
#[derive(Default)]
pub(super) struct Table {
    leases: HashMap<LeaseId, Arc<Lease>>,
    by_key: HashMap<LockKey, LeaseId>,
    claimed: HashSet<LockKey>,
    /// Key → the lock session that may still hold it.
    unreleased: HashMap<LockKey, String>,
    /// Client connection → its leases and claims here.
    per_connection: HashMap<SocketAddr, usize>,
    /// Lease id → the connection it was acquired on.
    lease_via: HashMap<LeaseId, SocketAddr>,
    ended: HashMap<LeaseId, EndReason>,
    ended_order: VecDeque<LeaseId>,
}

/// Why an Acquire attempt could not claim a key on this instance.
#[derive(Debug)]
pub(super) enum LocalBusy {
    /// A live lease here holds it, another attempt is on it, or its release is not
    /// confirmed yet.
    Taken,
    /// This instance serves as many leases as it may.
    Full,
    /// The connection the Acquire came on has as many leases here as it may.
    ConnectionFull,
}

impl Table {
    /// The live lease `id`, if this instance serves it.
    pub(super) fn lease(&self, id: &str) -> Option<&Arc<Lease>> {
        self.leases.get(id)
    }

    /// The live lease on `key`, if this instance serves one.
    pub(super) fn lease_at(&self, key: &LockKey) -> Option<&Arc<Lease>> {
        self.by_key.get(key).and_then(|id| self.leases.get(id))
    }

    /// Every live lease here.
    pub(super) fn leases(&self) -> impl Iterator<Item = &Arc<Lease>> {
        self.leases.values()
    }

    /// How many leases this instance serves.
    pub(super) fn len(&self) -> usize {
        self.leases.len()
    }

    /// How lease `id` ended, if it was served here (and is among the last
    /// [`ENDED_MEMORY`] to end).
    pub(super) fn ended(&self, id: &str) -> Option<&EndReason> {
        self.ended.get(id)
    }

    /// Claims `key` for one Acquire attempt, unless this instance leases it, is trying it,
    /// or may still hold it in the backend.
    pub(super) fn claim(
        &mut self,
        key: &LockKey,
        limits: &Limits,
        via: Option<SocketAddr>,
    ) -> Result<(), LocalBusy> {
        if self.by_key.contains_key(key) {
            return Err(LocalBusy::Taken);
        }
        if self.leases.len() + self.claimed.len() >= limits.max_leases {
            return Err(LocalBusy::Full);
        }
        if via.is_some_and(|via| {
            self.per_connection.get(&via).copied().unwrap_or(0) >= limits.max_leases_per_connection
        }) {
            return Err(LocalBusy::ConnectionFull);
        }
        if self.unreleased.contains_key(key) || !self.claimed.insert(key.clone()) {
            return Err(LocalBusy::Taken);
        }
        if let Some(via) = via {
            *self.per_connection.entry(via).or_default() += 1;
        }
        Ok(())
    }

    /// One lease or claim fewer for the connection `via`.
    pub(super) fn uncount(&mut self, via: Option<SocketAddr>) {
        let Some(via) = via else { return };
        if let Some(count) = self.per_connection.get_mut(&via) {
            *count -= 1;
            if *count == 0 {
                self.per_connection.remove(&via);
            }
        }
    }

    /// Whether this instance leases `key`, is trying it, or may still hold it in the backend.
    pub(super) fn blocks(&self, key: &LockKey) -> bool {
        self.by_key.contains_key(key)
            || self.claimed.contains(key)
            || self.unreleased.contains_key(key)
    }

    /// Ends a claim that produced no lease. `unreleased_by` names the session that may hold
    /// the key anyway (an acquire whose outcome is unknown).
    pub(super) fn unclaim(
        &mut self,
        key: &LockKey,
        unreleased_by: Option<&str>,
        via: Option<SocketAddr>,
    ) {
        self.claimed.remove(key);
        self.uncount(via);
        if let Some(session) = unreleased_by {
            self.unreleased(key, session);
        }
    }

    /// `session` may hold `key` in the backend with no lease behind it: the key cannot be
    /// claimed until [`Table::released`].
    pub(super) fn unreleased(&mut self, key: &LockKey, session: &str) {
        self.unreleased.insert(key.clone(), session.to_string());
    }

    /// Turns a claim into a live lease (which keeps the claim's count on its connection).
    pub(super) fn install(&mut self, lease: Arc<Lease>, via: Option<SocketAddr>) {
        self.claimed.remove(&lease.key);
        if let Some(via) = via {
            self.lease_via.insert(lease.id.clone(), via);
        }
        self.by_key.insert(lease.key.clone(), lease.id.clone());
        self.leases.insert(lease.id.clone(), lease);
    }

    /// Takes an ended lease out: its key stays unreleased until [`Table::released`].
    pub(super) fn remove_ended(&mut self, lease: &Lease, reason: EndReason) {
        if self.leases.remove(&lease.id).is_some() {
            let via = self.lease_via.remove(&lease.id);
            self.uncount(via);
        }
        if self.by_key.get(&lease.key) == Some(&lease.id) {
            self.by_key.remove(&lease.key);
        }
        self.unreleased(&lease.key, lease.session_id());
        if self.ended.insert(lease.id.clone(), reason).is_none() {
            self.ended_order.push_back(lease.id.clone());
        }
        while self.ended_order.len() > ENDED_MEMORY {
            if let Some(old) = self.ended_order.pop_front() {
                self.ended.remove(&old);
            }
        }
    }

    /// The backend confirmed that `session` no longer holds `key`.
    pub(super) fn released(&mut self, key: &LockKey, session: &str) {
        if self.unreleased.get(key).is_some_and(|s| s == session) {
            self.unreleased.remove(key);
        }
    }

    /// The backend session is now `live` (or none): locks of every other session are void,
    /// so their keys can be claimed again (with a new token).
    pub(super) fn session_changed(&mut self, live: Option<&str>) {
        self.unreleased
            .retain(|_, session| Some(session.as_str()) == live);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max_leases: usize, per_connection: usize) -> Limits {
        Limits {
            max_leases,
            max_leases_per_connection: per_connection,
            ..Limits::default()
        }
    }

    fn key(partition: i32) -> LockKey {
        LockKey::new("g", "t", partition)
    }

    #[test]
    fn a_key_is_claimed_by_one_attempt_at_a_time() {
        let mut table = Table::default();
        let limits = limits(10, 10);
        assert!(table.claim(&key(0), &limits, None).is_ok());
        assert!(table.blocks(&key(0)) && !table.blocks(&key(1)));
        assert!(matches!(
            table.claim(&key(0), &limits, None),
            Err(LocalBusy::Taken)
        ));
        table.unclaim(&key(0), None, None);
        assert!(!table.blocks(&key(0)));
        assert!(table.claim(&key(0), &limits, None).is_ok());
    }

    #[test]
    fn claims_count_against_the_instance_and_the_connection() {
        let mut table = Table::default();
        let via: SocketAddr = "127.0.0.1:4000".parse().unwrap();
        let other: SocketAddr = "127.0.0.1:4001".parse().unwrap();
        let limits = limits(3, 2);
        table.claim(&key(0), &limits, Some(via)).unwrap();
        table.claim(&key(1), &limits, Some(via)).unwrap();
        assert!(matches!(
            table.claim(&key(2), &limits, Some(via)),
            Err(LocalBusy::ConnectionFull)
        ));
        table.claim(&key(2), &limits, Some(other)).unwrap();
        assert!(matches!(
            table.claim(&key(3), &limits, None),
            Err(LocalBusy::Full)
        ));
        // A claim given back counts no more.
        table.unclaim(&key(0), None, Some(via));
        table.claim(&key(3), &limits, Some(via)).unwrap();
    }

    #[test]
    fn a_key_the_backend_may_still_hold_is_not_claimed_until_released() {
        let mut table = Table::default();
        let limits = limits(10, 10);
        table.claim(&key(0), &limits, None).unwrap();
        // An acquire whose answer was lost: session s1 may hold it.
        table.unclaim(&key(0), Some("s1"), None);
        assert!(table.blocks(&key(0)));
        assert!(matches!(
            table.claim(&key(0), &limits, None),
            Err(LocalBusy::Taken)
        ));
        // Another session's release says nothing of s1's hold.
        table.released(&key(0), "s2");
        assert!(table.blocks(&key(0)));
        table.released(&key(0), "s1");
        assert!(table.claim(&key(0), &limits, None).is_ok());
    }

    #[test]
    fn a_new_session_voids_the_holds_of_every_other() {
        let mut table = Table::default();
        table.unreleased(&key(0), "s1");
        table.unreleased(&key(1), "s2");
        table.session_changed(Some("s2"));
        assert!(!table.blocks(&key(0)) && table.blocks(&key(1)));
        table.session_changed(None);
        assert!(!table.blocks(&key(1)));
    }
}
