//! Lease ids: `<reference>.<secret>~<instance>`, a bearer credential whose reference alone
//! is public ([`LeaseId`]), and what a plain id a client sends says ([`lease_ref`],
//! [`serving_instance`]).

/// A new lease id for a lease served by `instance`: `<reference>.<secret>~<instance>`. The
/// reference (64 random bits) is public: it is stored in Consul and names the lease in logs
/// and messages. The secret (128 random bits) makes the whole id unguessable; only the client
/// that acquired the lease learns it. The serving instance lets any instance answer a call
/// on a lease it does not serve from what the id says, without a look at Consul (instance
/// ids are `[A-Za-z0-9._-]`, so `~` cannot occur in them).
pub fn new_lease_id(instance: &str) -> LeaseId {
    let reference: u64 = rand::random();
    let secret: u128 = rand::random();
    LeaseId(format!("{reference:016x}.{secret:032x}~{instance}"))
}

/// The id of a lease this instance granted ([`new_lease_id`]). It is a bearer credential: its
/// `Debug` shows the public reference only, so a lease, a grant or an event in a log never
/// shows it whole. Ids a client sends are plain strings until [`crate::gateway::Gateway::resolve`]
/// finds the lease they name.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct LeaseId(String);

impl LeaseId {
    /// The id as the client holds it.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The id as the response carries it.
    pub fn into_string(self) -> String {
        self.0
    }

    /// Its public reference ([`lease_ref`]).
    pub fn reference(&self) -> &str {
        lease_ref(&self.0)
    }
}

impl std::borrow::Borrow<str> for LeaseId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for LeaseId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LeaseId({}.…)", self.reference())
    }
}

/// The gateway instance a lease id says serves the lease, if it names one.
pub fn serving_instance(lease_id: &str) -> Option<&str> {
    lease_id
        .rsplit_once('~')
        .map(|(_, instance)| instance)
        .filter(|instance| !instance.is_empty())
}

/// The public reference part of a lease id (all of it, if it has no `.`).
pub fn lease_ref(lease_id: &str) -> &str {
    lease_id
        .split_once('.')
        .map_or(lease_id, |(reference, _)| reference)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_ids_are_long_random_and_have_a_public_reference() {
        let (a, b) = (new_lease_id("gw-1.example"), new_lease_id("gw-1.example"));
        assert_ne!(a, b);
        // A credential: its Debug shows the reference alone.
        assert_eq!(format!("{a:?}"), format!("LeaseId({}.…)", a.reference()));
        assert_eq!(a.reference(), lease_ref(a.as_str()));
        let a = a.into_string();
        assert_eq!(a.len(), 16 + 1 + 32 + 1 + "gw-1.example".len());
        assert_eq!(lease_ref(&a).len(), 16);
        assert!(a.starts_with(lease_ref(&a)));
        assert_eq!(lease_ref("no-dot"), "no-dot");
        assert_eq!(serving_instance(&a), Some("gw-1.example"));
        assert_eq!(serving_instance("0123.4567"), None);
        assert_eq!(serving_instance("0123.4567~"), None);
    }
}
