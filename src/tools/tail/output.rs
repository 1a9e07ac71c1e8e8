//! Where `tail`'s output goes: the records to stdout from a blocking thread that counts what
//! each write took, the watch for a reader of stdout that went away, and the progress line
//! on stderr.

use std::io::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::time::Instant;

use super::Printed;

/// The progress line on stderr: shown once a second while records are read, only when
/// stderr is a terminal and stdout is not (records go to a file or a pipe), and not with
/// `--quiet`.
#[derive(Debug)]
pub(super) struct Progress {
    pub(super) enabled: bool,
    shown: bool,
    last_records: u64,
    last_at: Instant,
}

impl Progress {
    pub(super) fn new(enabled: bool) -> Progress {
        Progress {
            enabled,
            shown: false,
            last_records: 0,
            last_at: Instant::now(),
        }
    }

    pub(super) fn show(&mut self, partition: i32, topic: &str, printed: &Printed) {
        if !self.enabled {
            return;
        }
        let now = Instant::now();
        let seconds = now.duration_since(self.last_at).as_secs_f64().max(0.001);
        let rate = (printed.records - self.last_records) as f64 / seconds;
        self.last_records = printed.records;
        self.last_at = now;
        let text = progress_text(partition, topic, printed, rate);
        let mut stderr = std::io::stderr().lock();
        let _ = write!(stderr, "\r\x1b[2K{text}");
        let _ = stderr.flush();
        self.shown = true;
    }

    /// Removes the line, before anything else is written to stderr.
    pub(super) fn clear(&mut self) {
        if self.shown {
            let mut stderr = std::io::stderr().lock();
            let _ = write!(stderr, "\r\x1b[2K");
            let _ = stderr.flush();
            self.shown = false;
        }
    }
}

pub(super) fn progress_text(partition: i32, topic: &str, printed: &Printed, rate: f64) -> String {
    let mut text = format!(
        "{topic}/{partition}: {} records, {rate:.0}/s",
        printed.records
    );
    if let Some(next) = printed.next_offset {
        text.push_str(&format!(", next offset {next}"));
        if let Some(high) = printed.high_watermark {
            text.push_str(&format!(", lag {}", (high - next).max(0)));
        }
    }
    text
}

/// Stdout for the records, written from a blocking thread so that a reader that stops
/// reading never blocks the runtime, with the count of the bytes each write took.
pub(super) struct RecordsOut {
    /// `None` once a write was abandoned midway (by a signal; nothing is written after).
    sink: Option<Box<dyn std::io::Write + Send>>,
    /// The bytes of the current write stdout has taken so far.
    taken: Arc<AtomicUsize>,
}

impl RecordsOut {
    pub(super) fn new() -> RecordsOut {
        let taken = Arc::new(AtomicUsize::new(0));
        // Unbuffered: a duplicate of the descriptor, so each write is one write(2) and what
        // it took is known. Else (not Unix, or no descriptor to spare) std's stdout.
        #[cfg(unix)]
        {
            use std::os::fd::AsFd as _;
            if let Ok(fd) = std::io::stdout().as_fd().try_clone_to_owned() {
                return RecordsOut {
                    sink: Some(Box::new(std::fs::File::from(fd))),
                    taken,
                };
            }
        }
        RecordsOut {
            sink: Some(Box::new(std::io::stdout())),
            taken,
        }
    }

    /// Writes all of `text`; gives it back with `Ok` once stdout took all of it. Dropped
    /// before that, the write goes on on its thread; [`RecordsOut::taken`] says how much of
    /// it got through so far.
    pub(super) async fn write(&mut self, text: String) -> (String, std::io::Result<()>) {
        self.taken.store(0, Ordering::Release);
        let Some(mut sink) = self.sink.take() else {
            return (
                text,
                Err(std::io::Error::other(
                    "an earlier write to stdout was cut short",
                )),
            );
        };
        let taken = Arc::clone(&self.taken);
        let job = tokio::task::spawn_blocking(move || {
            let bytes = text.as_bytes();
            let mut done = 0;
            let result = loop {
                if done == bytes.len() {
                    break sink.flush();
                }
                match sink.write(&bytes[done..]) {
                    Ok(0) => break Err(std::io::ErrorKind::WriteZero.into()),
                    Ok(n) => {
                        done += n;
                        taken.store(done, Ordering::Release);
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => break Err(e),
                }
            };
            (sink, text, result)
        });
        match job.await {
            Ok((sink, text, result)) => {
                self.sink = Some(sink);
                (text, result)
            }
            Err(e) => (String::new(), Err(std::io::Error::other(e))),
        }
    }

    /// The bytes of the last write stdout took.
    pub(super) fn taken(&self) -> usize {
        self.taken.load(Ordering::Acquire)
    }
}

/// Resolves once whoever reads stdout has gone away: the read end of its pipe is closed
/// (`| head` after its lines). A tail waiting for records would otherwise keep its lease
/// until its next write failed, which may be never. Never resolves for a stdout that cannot
/// be watched (a regular file).
pub(super) async fn stdout_closed() {
    #[cfg(unix)]
    {
        use std::os::fd::AsFd as _;
        use tokio::io::unix::AsyncFd;
        use tokio::io::Interest;
        // The write end of a pipe whose reader closed reports an error condition (EPOLLERR).
        // Watched through a duplicate of the descriptor, so that the watch owns what it
        // watches; watching changes nothing about the writes to stdout (no flag is set).
        if let Ok(duplicate) = std::io::stdout().as_fd().try_clone_to_owned() {
            // Deprecated because a registered descriptor that its owner closes meanwhile is
            // unsound; this one is an `OwnedFd` the `AsyncFd` owns, so it stays open for as
            // long as it is registered (the condition of the `unsafe` replacement, which
            // this workspace does not allow).
            #[allow(deprecated)]
            let watched = AsyncFd::with_interest(duplicate, Interest::ERROR);
            if let Ok(stdout) = watched {
                while let Ok(mut guard) = stdout.ready(Interest::ERROR).await {
                    if guard.ready().is_error() {
                        return;
                    }
                    guard.clear_ready();
                }
            }
        }
    }
    std::future::pending::<()>().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_progress_line_says_count_rate_and_lag() {
        let mut printed = Printed::default();
        assert_eq!(progress_text(2, "t", &printed, 0.0), "t/2: 0 records, 0/s");
        printed.records = 1500;
        printed.next_offset = Some(1600);
        printed.high_watermark = Some(1700);
        assert_eq!(
            progress_text(2, "t", &printed, 1234.4),
            "t/2: 1500 records, 1234/s, next offset 1600, lag 100"
        );
    }
}
