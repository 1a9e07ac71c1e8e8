//! Defects planted on purpose, to show that the fault tests (`scripts/chaos`,
//! docs/FAULTS.md) catch what they are meant to catch. Compiled in only with the
//! `planted-defects` feature, which no release, image or default build enables; without it
//! [`planted`] is a constant `false` and every call site folds away. With it, the
//! variable `KAFKA_LEASE_PLANTED_DEFECT` names the one defect a process runs with.

/// A guarantee switched off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Defect {
    /// `no-self-fence`: a lease's side effects no longer check the self-fence deadline, and
    /// the renew task no longer gives up a session it cannot confirm (the coordination
    /// crate's half, `consul/session.rs`): the gateway learns of a lost session only when
    /// Consul says so.
    NoSelfFence,
    /// `no-commit-gate`: the end of a lease no longer waits for its commits in flight.
    NoCommitGate,
    /// `release-without-waiting`: a Release no longer waits for the lease's commits in
    /// flight (the other ends still do).
    ReleaseWithoutWaiting,
}

impl Defect {
    /// Every defect, by the name `KAFKA_LEASE_PLANTED_DEFECT` takes.
    pub const ALL: [(&'static str, Defect); 3] = [
        ("no-self-fence", Defect::NoSelfFence),
        ("no-commit-gate", Defect::NoCommitGate),
        ("release-without-waiting", Defect::ReleaseWithoutWaiting),
    ];
}

/// Whether this process runs with `defect` planted.
#[cfg(feature = "planted-defects")]
pub fn planted(defect: Defect) -> bool {
    use std::sync::OnceLock;
    static CHOSEN: OnceLock<Option<Defect>> = OnceLock::new();
    *CHOSEN.get_or_init(|| {
        let name = std::env::var("KAFKA_LEASE_PLANTED_DEFECT").ok()?;
        let chosen = Defect::ALL
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, d)| *d);
        match chosen {
            Some(_) => tracing::warn!(defect = %name, "running with a planted defect"),
            None => tracing::error!(defect = %name, "KAFKA_LEASE_PLANTED_DEFECT names no defect"),
        }
        chosen
    }) == Some(defect)
}

/// Whether this process runs with `defect` planted: never, in this build.
#[cfg(not(feature = "planted-defects"))]
pub fn planted(defect: Defect) -> bool {
    let _ = defect;
    false
}
