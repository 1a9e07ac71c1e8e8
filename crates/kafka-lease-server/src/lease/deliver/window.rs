//! The window of deliveries a Subscribe member's leases share.

use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

/// A window of deliveries shared by several queues (a Subscribe member's leases): how many
/// records and bytes may be in flight across them all.
#[derive(Debug)]
pub struct SharedWindow {
    max_records: usize,
    max_bytes: usize,
    used: Mutex<(usize, usize)>,
    /// Room was freed: queues waiting for it look again.
    pub(super) freed: Notify,
}

impl SharedWindow {
    pub fn new(max_records: usize, max_bytes: usize) -> Arc<Self> {
        Arc::new(SharedWindow {
            max_records,
            max_bytes,
            used: Mutex::new((0, 0)),
            freed: Notify::new(),
        })
    }

    fn used(&self) -> MutexGuard<'_, (usize, usize)> {
        self.used.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether one more record may go out beyond what is counted and `extra` (records and
    /// bytes taken but not counted yet); one always may when none is out.
    pub(super) fn has_room(&self, extra: (usize, usize)) -> bool {
        let (records, bytes) = *self.used();
        let (records, bytes) = (records + extra.0, bytes + extra.1);
        records == 0 || (records < self.max_records && bytes < self.max_bytes)
    }

    /// Records and bytes went out (positive) or came back (negative).
    pub(super) fn change(&self, records: isize, bytes: isize) {
        {
            let mut used = self.used();
            used.0 = used.0.saturating_add_signed(records);
            used.1 = used.1.saturating_add_signed(bytes);
        }
        if records < 0 || bytes < 0 {
            self.freed.notify_waiters();
        }
    }
}
