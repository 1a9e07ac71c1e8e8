//! Hot reload of files, in one place: a value built from files' bytes, swapped for a new one
//! only when the bytes changed and the new ones build a whole value, and a task that offers
//! the files again every [`RELOAD_INTERVAL`]. The TLS material (`tls.rs`) and the policy and
//! token files (`auth/`) reload through it.

use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use sha2::{Digest, Sha256};

/// How often reloadable files are read again.
pub const RELOAD_INTERVAL: Duration = Duration::from_secs(2);

/// The digest a [`Swapped`] compares files' bytes by.
pub type Digest32 = [u8; 32];

/// The digest of `parts` (each file's bytes, in order).
pub fn digest<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> Digest32 {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part);
    }
    hasher.finalize().into()
}

/// A value built from files, the last good version kept.
#[derive(Debug)]
pub struct Swapped<T> {
    current: RwLock<Arc<T>>,
    /// Digest of the bytes the current value was built from, or of the last bad version
    /// (so a bad version is reported once, not at every look).
    seen: Mutex<Digest32>,
}

impl<T> Swapped<T> {
    /// `value`, built from bytes of digest `digest`.
    pub fn new(value: T, digest: Digest32) -> Self {
        Swapped {
            current: RwLock::new(Arc::new(value)),
            seen: Mutex::new(digest),
        }
    }

    /// The current value.
    pub fn get(&self) -> Arc<T> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Offers bytes of digest `digest`: unchanged since the last offer, `Ok(false)`; else
    /// `build` makes the new value, which replaces the current one (`Ok(true)`), or fails
    /// (`Err`, the current value kept).
    pub fn offer<E>(
        &self,
        digest: Digest32,
        build: impl FnOnce() -> Result<T, E>,
    ) -> Result<bool, E> {
        {
            let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
            if *seen == digest {
                return Ok(false);
            }
            *seen = digest;
        }
        let value = build()?;
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(value);
        Ok(true)
    }
}

/// Runs `look` every [`RELOAD_INTERVAL`], the first one interval from now, until the task
/// is dropped.
pub async fn every_interval(mut look: impl FnMut()) {
    let mut ticker = tokio::time::interval(RELOAD_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    loop {
        ticker.tick().await;
        look();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_is_swapped_only_for_changed_bytes_that_build() {
        let swapped = Swapped::new(1, digest([b"one".as_slice()]));
        assert_eq!(
            swapped.offer(digest([b"one".as_slice()]), || Ok::<_, ()>(9)),
            Ok(false)
        );
        assert_eq!(*swapped.get(), 1);
        assert_eq!(
            swapped.offer(digest([b"bad".as_slice()]), || Err("bad")),
            Err("bad")
        );
        assert_eq!(*swapped.get(), 1, "a bad version keeps the last good one");
        assert_eq!(
            swapped.offer(digest([b"bad".as_slice()]), || Err("bad")),
            Ok(false),
            "the same bad version is not offered again"
        );
        assert_eq!(
            swapped.offer(digest([b"two".as_slice()]), || Ok::<_, ()>(2)),
            Ok(true)
        );
        assert_eq!(*swapped.get(), 2);
    }

    #[test]
    fn the_digest_tells_where_one_file_ends() {
        assert_ne!(
            digest([b"ab".as_slice(), b"c".as_slice()]),
            digest([b"a".as_slice(), b"bc".as_slice()])
        );
    }
}
