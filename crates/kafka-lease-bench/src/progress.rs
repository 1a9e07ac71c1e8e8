//! Progress lines on stderr, so a person running the benchmark always sees what it is doing:
//! the elapsed time, the scenario, the arm, and counts done.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Writes timestamped progress lines to stderr.
#[derive(Debug, Clone)]
pub(crate) struct Progress {
    started: Instant,
}

impl Progress {
    pub(crate) fn new() -> Self {
        Self {
            started: Instant::now(),
        }
    }

    pub(crate) fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// One line: `[  12.3s] message`.
    pub(crate) fn say(&self, message: impl AsRef<str>) {
        eprintln!(
            "[{:>7.1}s] {}",
            self.started.elapsed().as_secs_f64(),
            message.as_ref()
        );
    }

    /// Prints `label: done/total what` every 2 s while the returned guard lives (and the count
    /// moved or 10 s passed since the last line), so long phases are never silent.
    pub(crate) fn ticker(
        &self,
        label: impl Into<String>,
        done: Arc<AtomicU64>,
        total: u64,
        what: &'static str,
    ) -> Ticker {
        let me = self.clone();
        let label = label.into();
        let phase_started = Instant::now();
        let handle = tokio::spawn(async move {
            let mut last = u64::MAX;
            let mut last_print = Instant::now();
            loop {
                tokio::time::sleep(Duration::from_secs(2)).await;
                let now = done.load(Ordering::Relaxed);
                if now != last || last_print.elapsed() >= Duration::from_secs(10) {
                    me.say(format!(
                        "  {label}: {now}/{total} {what} ({:.1}s in this phase)",
                        phase_started.elapsed().as_secs_f64()
                    ));
                    last = now;
                    last_print = Instant::now();
                }
            }
        });
        Ticker { handle }
    }
}

/// Stops its progress ticker when dropped.
#[derive(Debug)]
pub(crate) struct Ticker {
    handle: JoinHandle<()>,
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.handle.abort();
    }
}
