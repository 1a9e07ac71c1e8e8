//! `kafka-lease tail`: lease a partition, print its records to stdout like kcat, and give
//! the lease back (committing what was printed, if asked) however it ends.
//!
//! A record counts as printed once stdout has taken all of its line: the records go to
//! stdout from a blocking thread that counts the bytes each write took, so a reader that
//! goes away (`| head`) or a signal during a write leaves an exact count, never one decided
//! by which of two events the runtime saw first. Errors go to stderr as they happen; the
//! summary comes last.

//!
//! One concern a file: `args` (the flags), `output` (stdout, its watch, the progress line),
//! `finish` (the commit, the release and the summary); here the run itself: the lease, the
//! Read and the signals.

mod args;
mod finish;
mod output;

use std::io::IsTerminal as _;
use std::time::Duration;

use kafka_lease_client::{AcquireOptions, Client, Lease, ReadOptions};
use tokio::time::Instant;

use super::{render, Failure, EXIT_FAILURE};
pub(crate) use args::TailArgs;
use args::{default_member, TailFormat};
use finish::finish;
use output::{stdout_closed, Progress, RecordsOut};

/// Exit status after SIGINT (128 + 2, what a shell reports for a process SIGINT ended).
pub(crate) const EXIT_SIGINT: u8 = 130;
/// Exit status after SIGTERM (128 + 15).
pub(crate) const EXIT_SIGTERM: u8 = 143;

/// How long the commit and the release at the end may each take.
const CLEANUP_TIMEOUT: Duration = Duration::from_secs(10);

/// Records per Read batch (the gateway's default), fewer when `--max-records` is smaller.
const BATCH_RECORDS: u64 = 500;

/// A signal that stops `tail`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    Interrupt,
    Terminate,
}

impl Stop {
    fn status(self) -> u8 {
        match self {
            Stop::Interrupt => EXIT_SIGINT,
            Stop::Terminate => EXIT_SIGTERM,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Stop::Interrupt => "SIGINT",
            Stop::Terminate => "SIGTERM",
        }
    }
}

/// SIGINT and SIGTERM, listened to from the start, so neither ends the process before the
/// lease is given back.
struct Signals {
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> Result<Signals, Failure> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let listen = |kind: SignalKind| {
                signal(kind).map_err(|e| Failure {
                    status: EXIT_FAILURE,
                    line: format!("cannot listen for signals: {e}"),
                })
            };
            Ok(Signals {
                interrupt: listen(SignalKind::interrupt())?,
                terminate: listen(SignalKind::terminate())?,
            })
        }
        #[cfg(not(unix))]
        Ok(Signals {})
    }

    async fn recv(&mut self) -> Stop {
        #[cfg(unix)]
        {
            tokio::select! {
                _ = self.interrupt.recv() => Stop::Interrupt,
                _ = self.terminate.recv() => Stop::Terminate,
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
            Stop::Interrupt
        }
    }
}

/// What was printed so far.
#[derive(Debug, Default, Clone, Copy)]
struct Printed {
    records: u64,
    /// The offset after the last record printed: what `--commit-on-exit` commits.
    next_offset: Option<i64>,
    /// The partition's high watermark as of the last batch.
    high_watermark: Option<i64>,
}

/// Why reading stopped.
#[derive(Debug)]
enum Ending {
    /// `--max-records` were printed.
    MaxRecords,
    /// `--exit-at-end`: the Read reached this high watermark.
    End { high_watermark: i64 },
    /// SIGINT or SIGTERM.
    Signal(Stop),
    /// Whoever read stdout went away (`| head`).
    StdoutClosed,
    /// A failure; `lease_gone` when the lease ended with it (nothing to commit or release).
    Failed { failure: Failure, lease_gone: bool },
}

impl Ending {
    fn gateway(err: &kafka_lease_client::Error) -> Ending {
        Ending::Failed {
            failure: Failure::gateway(err),
            lease_gone: err.is_lease_ended(),
        }
    }
}

/// Leases, reads and prints until the end, then commits (if asked) and releases; the exit
/// status.
pub(crate) async fn run(args: TailArgs) -> Result<u8, Failure> {
    let connection = super::connection(&args.connect)?;
    let mut signals = Signals::new()?;
    let client = tokio::select! {
        client = connection.connect() => client?,
        stop = signals.recv() => return Ok(stop.status()),
    };
    let lease = tokio::select! {
        lease = acquire(&client, &args) => lease?,
        // Dropping the Acquire cancels it; a lease granted meanwhile ends at once, since the
        // gateway sees its caller gone.
        stop = signals.recv() => return Ok(stop.status()),
    };
    let mut progress = Progress::new(
        !args.quiet && std::io::stderr().is_terminal() && !std::io::stdout().is_terminal(),
    );
    let mut printed = Printed::default();
    let ending = read(&lease, &args, &mut signals, &mut progress, &mut printed).await;
    progress.clear();
    finish(lease, ending, printed, &args, &mut signals).await
}

async fn acquire(client: &Client, args: &TailArgs) -> Result<Lease, Failure> {
    let member = args.member.clone().unwrap_or_else(default_member);
    let mut options = AcquireOptions::new(&args.group, &args.topic).member(member);
    if let Some(partition) = args.partition {
        options = options.partition(partition);
    }
    if !args.wait.is_zero() {
        options = options.wait(args.wait);
    }
    client
        .acquire(options)
        .await
        .map_err(|e| Failure::gateway(&e))
}

async fn read(
    lease: &Lease,
    args: &TailArgs,
    signals: &mut Signals,
    progress: &mut Progress,
    printed: &mut Printed,
) -> Ending {
    let start = match args.from.seek() {
        None => lease.offset(),
        Some(to) => tokio::select! {
            sought = lease.seek(to) => match sought {
                Ok(outcome) => outcome.offset,
                Err(e) => return Ending::gateway(&e),
            },
            stop = signals.recv() => return Ending::Signal(stop),
        },
    };
    if !args.quiet {
        eprintln!(
            "kafka-lease tail: leased partition {} of {} for group {} (fencing token {}, \
             gateway {}); reading from offset {start}",
            lease.partition(),
            lease.topic(),
            lease.group(),
            lease.fencing_token(),
            lease.gateway(),
        );
    }
    // `--exit-at-end` from a start at or past the end: no batch would ever come (a batch is
    // never empty), so the end is the high watermark Acquire reported.
    if args.exit_at_end && start >= lease.high_watermark() {
        return Ending::End {
            high_watermark: start,
        };
    }
    let per_batch = args.max_records.unwrap_or(BATCH_RECORDS).min(BATCH_RECORDS) as u32;
    let options = ReadOptions::new().max_records(per_batch);
    let mut stream = tokio::select! {
        stream = lease.records(options) => match stream {
            Ok(stream) => stream,
            Err(e) => return Ending::gateway(&e),
        },
        stop = signals.recv() => return Ending::Signal(stop),
    };
    let mut stdout = RecordsOut::new();
    let mut tick = tokio::time::interval_at(
        Instant::now() + Duration::from_secs(1),
        Duration::from_secs(1),
    );
    let mut text = String::new();
    // Where each record's line ends in `text`.
    let mut ends: Vec<usize> = Vec::new();
    let mut closed = std::pin::pin!(stdout_closed());
    loop {
        let batch = tokio::select! {
            biased;
            stop = signals.recv() => return Ending::Signal(stop),
            () = &mut closed => return Ending::StdoutClosed,
            _ = tick.tick(), if progress.enabled => {
                progress.show(lease.partition(), lease.topic(), printed);
                continue;
            }
            batch = stream.next_batch() => batch,
        };
        let batch = match batch {
            Some(Ok(batch)) => batch,
            Some(Err(e)) => return Ending::gateway(&e),
            None => {
                return Ending::Failed {
                    failure: Failure {
                        status: EXIT_FAILURE,
                        line: "the gateway ended the Read: the lease was released".into(),
                    },
                    lease_gone: true,
                }
            }
        };
        let remaining = args
            .max_records
            .map_or(usize::MAX, |max| (max - printed.records) as usize);
        let records = &batch.records[..batch.records.len().min(remaining)];
        if records.is_empty() {
            continue;
        }
        text.clear();
        ends.clear();
        for record in records {
            match args.format {
                TailFormat::Text => render::record_text(&mut text, lease.partition(), record),
                TailFormat::Json => {
                    render::record_json(&mut text, lease.topic(), lease.partition(), record)
                }
            }
            ends.push(text.len());
        }
        // Not raced against `closed`: the write itself fails once the reader has gone, and
        // what it took before counts.
        let written = tokio::select! {
            biased;
            stop = signals.recv() => Err(Ending::Signal(stop)),
            (back, written) = stdout.write(std::mem::take(&mut text)) => {
                text = back;
                match written {
                    Ok(()) => Ok(()),
                    Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                        Err(Ending::StdoutClosed)
                    }
                    Err(e) => Err(Ending::Failed {
                        failure: Failure {
                            status: EXIT_FAILURE,
                            line: format!("cannot write to stdout: {e}"),
                        },
                        lease_gone: false,
                    }),
                }
            }
        };
        // The records whose whole line stdout took.
        let taken = match written {
            Ok(()) => records.len(),
            Err(_) => ends.partition_point(|&end| end <= stdout.taken()),
        };
        if let Some(last) = records[..taken].last() {
            printed.records += taken as u64;
            // The whole batch printed: past any transaction marker after it, as the
            // gateway says, so that `-e` ends at a partition whose last offset is one.
            printed.next_offset = if taken == batch.records.len() {
                batch.next_offset()
            } else {
                Some(last.offset + 1)
            };
            printed.high_watermark = Some(batch.high_watermark);
        }
        if let Err(ending) = written {
            return ending;
        }
        if args.max_records.is_some_and(|max| printed.records >= max) {
            return Ending::MaxRecords;
        }
        // The gateway's high watermark is never below the offset after the batch's last
        // record: the Read has caught up when it printed up to it.
        if args.exit_at_end
            && printed
                .next_offset
                .is_some_and(|next| next >= batch.high_watermark)
        {
            return Ending::End {
                high_watermark: batch.high_watermark,
            };
        }
    }
}
