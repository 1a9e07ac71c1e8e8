//! The subscription members attached on this instance: one live stream per member id here
//! (Consul cannot tell two subscriptions of one session apart), and the way back in to a
//! member whose stream went within its session grace.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::Reattach;

/// (group, member id) of every subscription with a task on this instance: `None` while a
/// stream is attached, its task's way in while it is detached (its stream gone, within its
/// session grace).
#[derive(Debug, Default)]
pub(super) struct Members {
    members: Mutex<HashMap<(String, String), Option<Reattach>>>,
}

/// What [`Members::claim`] found.
pub(super) enum Claimed {
    /// A new member, claimed here until the claim is dropped.
    New(MemberClaim),
    /// A member detached within its grace: the way in to its task.
    Detached(Reattach),
    /// A stream is attached to the member already.
    Attached,
}

impl Members {
    /// Marks member `member_id` of `group` as attached to a stream here.
    pub(super) fn claim(self: &Arc<Self>, group: &str, member_id: &str) -> Claimed {
        let id = (group.to_string(), member_id.to_string());
        let mut members = self.members.lock().unwrap_or_else(|p| p.into_inner());
        match members.get_mut(&id) {
            Some(slot) => match slot.take() {
                Some(way_in) => Claimed::Detached(way_in),
                None => Claimed::Attached,
            },
            None => {
                members.insert(id.clone(), None);
                Claimed::New(MemberClaim {
                    members: self.clone(),
                    id,
                })
            }
        }
    }
}

/// A member id claimed on this instance, freed when the subscription's task is done.
#[derive(Debug)]
pub(super) struct MemberClaim {
    members: Arc<Members>,
    /// (group, member id).
    id: (String, String),
}

impl MemberClaim {
    /// The member's stream is gone; `reattach` reaches its task until its grace ends.
    pub(super) fn detach(&self, reattach: Reattach) {
        if let Some(slot) = self
            .members
            .members
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(&self.id)
        {
            *slot = Some(reattach);
        }
    }
}

impl Drop for MemberClaim {
    fn drop(&mut self) {
        self.members
            .members
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_stream_per_member_and_the_way_back_in_while_detached() {
        let members = Arc::new(Members::default());
        let Claimed::New(claim) = members.claim("g", "m-1") else {
            panic!("a new member is claimed");
        };
        assert!(matches!(members.claim("g", "m-1"), Claimed::Attached));
        // Another group's member of the same id is another member.
        assert!(matches!(members.claim("h", "m-1"), Claimed::New(_)));

        let (way_in, mut reached) = tokio::sync::mpsc::unbounded_channel();
        claim.detach(way_in);
        let Claimed::Detached(way_in) = members.claim("g", "m-1") else {
            panic!("a detached member is reached through its way in");
        };
        assert!(!way_in.is_closed() && reached.try_recv().is_err());
        // Taken over: attached again.
        assert!(matches!(members.claim("g", "m-1"), Claimed::Attached));

        drop(claim);
        assert!(matches!(members.claim("g", "m-1"), Claimed::New(_)));
    }
}
