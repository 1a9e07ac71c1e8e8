//! `kafka-lease tail`: lease a partition, print its records to stdout like kcat, and give
//! the lease back (committing what was printed, if asked) however it ends.
//!
//! A record counts as printed once stdout has taken all of its line: the records go to
//! stdout from a blocking thread that counts the bytes each write took, so a reader that
//! goes away (`| head`) or a signal during a write leaves an exact count, never one decided
//! by which of two events the runtime saw first. Errors go to stderr as they happen; the
//! summary comes last.

use std::io::{IsTerminal as _, Write as _};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use clap::{Args, ValueEnum};
use kafka_lease_client::{AcquireOptions, Client, Lease, ReadOptions, SeekTo};
use tokio::time::Instant;

use super::leases::{parse_group, parse_topic};
use super::{render, ConnectArgs, Failure, EXIT_FAILURE};

/// Exit status after SIGINT (128 + 2, what a shell reports for a process SIGINT ended).
pub(crate) const EXIT_SIGINT: u8 = 130;
/// Exit status after SIGTERM (128 + 15).
pub(crate) const EXIT_SIGTERM: u8 = 143;

/// How long the commit and the release at the end may each take.
const CLEANUP_TIMEOUT: Duration = Duration::from_secs(10);

/// Records per Read batch (the gateway's default), fewer when `--max-records` is smaller.
const BATCH_RECORDS: u64 = 500;

/// How `tail` prints records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum TailFormat {
    /// One tab-separated line per record: partition, offset, timestamp, key, value, headers.
    Text,
    /// One JSON object per line.
    Json,
}

/// Where `tail` starts reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StartAt {
    /// The group's committed offset (else the earliest): where the lease starts anyway.
    Committed,
    /// The oldest retained record.
    Earliest,
    /// The high watermark: only records produced from now on.
    Latest,
    /// This offset.
    Offset(i64),
    /// The first record at or after this time.
    Time(SystemTime),
}

impl StartAt {
    /// The seek that gets there; `None` for where the lease starts.
    fn seek(self) -> Option<SeekTo> {
        match self {
            StartAt::Committed => None,
            StartAt::Earliest => Some(SeekTo::Earliest),
            StartAt::Latest => Some(SeekTo::Latest),
            StartAt::Offset(offset) => Some(SeekTo::Offset(offset)),
            StartAt::Time(time) => Some(SeekTo::Timestamp(time)),
        }
    }
}

const FROM_ALLOWED: &str = "allowed: earliest, latest, committed, an offset (0 or more), or an \
                            RFC 3339 time such as 2026-01-02T15:04:05Z or \
                            2026-01-02T16:04:05.5+01:00";

/// `--from`.
fn parse_from(value: &str) -> Result<StartAt, String> {
    match value {
        "committed" => return Ok(StartAt::Committed),
        "earliest" => return Ok(StartAt::Earliest),
        "latest" => return Ok(StartAt::Latest),
        _ => {}
    }
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        return value
            .parse::<i64>()
            .map(StartAt::Offset)
            .map_err(|_| format!("offset {value} is too large; {FROM_ALLOWED}"));
    }
    parse_rfc3339(value)
        .map(StartAt::Time)
        .ok_or_else(|| format!("{value:?} is not a position; {FROM_ALLOWED}"))
}

/// An RFC 3339 time with its zone: `Z` or `±hh:mm` (`T` or a space between date and time,
/// any number of fractional digits).
fn parse_rfc3339(value: &str) -> Option<SystemTime> {
    let upper = value.to_ascii_uppercase();
    if let Some(utc) = upper.strip_suffix('Z') {
        return humantime::parse_rfc3339_weak(utc).ok();
    }
    // `±hh:mm` at the end.
    let split = upper.len().checked_sub(6)?;
    let (local, zone) = (upper.get(..split)?, upper.get(split..)?.as_bytes());
    let sign = match zone[0] {
        b'+' => 1i64,
        b'-' => -1,
        _ => return None,
    };
    let digit = |b: u8| b.is_ascii_digit().then(|| i64::from(b - b'0'));
    if zone[3] != b':' {
        return None;
    }
    let hours = digit(zone[1])? * 10 + digit(zone[2])?;
    let minutes = digit(zone[4])? * 10 + digit(zone[5])?;
    if hours > 23 || minutes > 59 {
        return None;
    }
    let offset = Duration::from_secs(u64::try_from((hours * 60 + minutes) * 60).ok()?);
    let as_if_utc = humantime::parse_rfc3339_weak(local).ok()?;
    // Local time = UTC + offset, so UTC = local time - offset.
    if sign > 0 {
        as_if_utc.checked_sub(offset)
    } else {
        as_if_utc.checked_add(offset)
    }
}

/// `--member`: the gateway's own rule (at most 256 UTF-8 bytes).
fn parse_member(value: &str) -> Result<String, String> {
    kafka_lease_server::validate::member(value)
        .map(|()| value.to_string())
        .map_err(|e| e.to_string())
}

/// `--max-records`: 1 or more.
fn parse_max_records(value: &str) -> Result<u64, String> {
    match value.parse::<u64>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!(
            "{value:?} is not a record count; allowed: 1 or more"
        )),
    }
}

/// `--wait`: a duration up to the gateway's limit for an Acquire's wait, 5 minutes.
fn parse_wait(value: &str) -> Result<Duration, String> {
    let wait = humantime::parse_duration(value)
        .map_err(|e| format!("{value:?} is not a duration like 10s, 500ms or 2m ({e})"))?;
    if wait > Duration::from_secs(300) {
        return Err(format!("{value} is too long; allowed 0s ..= 5m"));
    }
    Ok(wait)
}

#[derive(Debug, Clone, Args)]
pub(crate) struct TailArgs {
    #[command(flatten)]
    pub(crate) connect: ConnectArgs,
    /// The consumer group to lease the partition for.
    #[arg(long, value_name = "GROUP", value_parser = parse_group)]
    pub(crate) group: String,
    /// The topic to read.
    #[arg(long, value_name = "TOPIC", value_parser = parse_topic)]
    pub(crate) topic: String,
    /// The partition to lease; without it, any free one.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(i32).range(0..))]
    pub(crate) partition: Option<i32>,
    /// Where to start: `earliest`, `latest`, `committed` (the group's committed offset, else
    /// the earliest), an offset, or an RFC 3339 time (the first record at or after it).
    #[arg(long, value_name = "POSITION", default_value = "committed", value_parser = parse_from)]
    pub(crate) from: StartAt,
    /// Stop after printing this many records in all (exit status 0).
    #[arg(long, value_name = "N", value_parser = parse_max_records)]
    pub(crate) max_records: Option<u64>,
    /// Stop at the end of the partition, like kcat -e (exit status 0): once the records
    /// printed reach the high watermark the gateway sent with their batch; at once if the
    /// start is at or past the high watermark Acquire reported. Records produced meanwhile
    /// are printed while the Read has not caught up with them.
    #[arg(long, short = 'e')]
    pub(crate) exit_at_end: bool,
    /// On exit (--max-records, --exit-at-end, SIGINT, SIGTERM, an error), commit the offset
    /// after the last record printed, before releasing the lease.
    #[arg(long)]
    pub(crate) commit_on_exit: bool,
    /// How to print records.
    #[arg(long, value_enum, default_value = "text")]
    pub(crate) format: TailFormat,
    /// The member label the lease shows in `leases` (default `kafka-lease-tail@<host>:<pid>`).
    #[arg(long, value_name = "NAME", value_parser = parse_member)]
    pub(crate) member: Option<String>,
    /// How long to wait for the partition (or any partition) to become free.
    #[arg(long, value_name = "DURATION", default_value = "0s", value_parser = parse_wait)]
    pub(crate) wait: Duration,
    /// Print nothing on stderr but errors: no lease line, no progress, no summary.
    #[arg(long, short)]
    pub(crate) quiet: bool,
}

/// `kafka-lease-tail@<host>:<pid>`.
fn default_member() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into());
    let member = format!("kafka-lease-tail@{host}:{}", std::process::id());
    // The label is free text of at most 256 bytes; a host name is far shorter.
    member.chars().take(200).collect()
}

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

/// The progress line on stderr: shown once a second while records are read, only when
/// stderr is a terminal and stdout is not (records go to a file or a pipe), and not with
/// `--quiet`.
#[derive(Debug)]
struct Progress {
    enabled: bool,
    shown: bool,
    last_records: u64,
    last_at: Instant,
}

impl Progress {
    fn new(enabled: bool) -> Progress {
        Progress {
            enabled,
            shown: false,
            last_records: 0,
            last_at: Instant::now(),
        }
    }

    fn show(&mut self, partition: i32, topic: &str, printed: &Printed) {
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
    fn clear(&mut self) {
        if self.shown {
            let mut stderr = std::io::stderr().lock();
            let _ = write!(stderr, "\r\x1b[2K");
            let _ = stderr.flush();
            self.shown = false;
        }
    }
}

fn progress_text(partition: i32, topic: &str, printed: &Printed, rate: f64) -> String {
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
            printed.next_offset = Some(last.offset + 1);
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

/// Stdout for the records, written from a blocking thread so that a reader that stops
/// reading never blocks the runtime, with the count of the bytes each write took.
struct RecordsOut {
    /// `None` once a write was abandoned midway (by a signal; nothing is written after).
    sink: Option<Box<dyn std::io::Write + Send>>,
    /// The bytes of the current write stdout has taken so far.
    taken: Arc<AtomicUsize>,
}

impl RecordsOut {
    fn new() -> RecordsOut {
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
    async fn write(&mut self, text: String) -> (String, std::io::Result<()>) {
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
    fn taken(&self) -> usize {
        self.taken.load(Ordering::Acquire)
    }
}

/// Resolves once whoever reads stdout has gone away: the read end of its pipe is closed
/// (`| head` after its lines). A tail waiting for records would otherwise keep its lease
/// until its next write failed, which may be never. Never resolves for a stdout that cannot
/// be watched (a regular file).
async fn stdout_closed() {
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

/// A cleanup call's outcome: done, timed out, or cut short by another signal.
enum Cleanup<T> {
    Done(T),
    TimedOut,
    Interrupted(Stop),
}

async fn bounded<T>(
    signals: &mut Signals,
    call: impl std::future::Future<Output = T>,
) -> Cleanup<T> {
    tokio::select! {
        done = tokio::time::timeout(CLEANUP_TIMEOUT, call) => match done {
            Ok(value) => Cleanup::Done(value),
            Err(_) => Cleanup::TimedOut,
        },
        stop = signals.recv() => Cleanup::Interrupted(stop),
    }
}

/// Commits (with `--commit-on-exit`) and releases, then says how it ended; the exit status.
/// An error goes to stderr when it happens, before the summary: the one that ended the
/// Read at once, one of the commit or the release when it fails. The first error decides
/// the exit status.
async fn finish(
    lease: Lease,
    ending: Ending,
    printed: Printed,
    args: &TailArgs,
    signals: &mut Signals,
) -> Result<u8, Failure> {
    let say = |text: &str| {
        if !args.quiet {
            eprintln!("kafka-lease tail: {text}");
        }
    };
    // Errors are printed even with --quiet.
    let mut failed: Option<u8> = None;
    let mut fail = |failure: Failure| {
        if failed.is_none() {
            eprintln!("kafka-lease tail: {}", failure.line);
            failed = Some(failure.status);
        }
    };
    let stdout_closed = matches!(ending, Ending::StdoutClosed);
    let mut summary = vec![records_printed(printed.records)];
    let (status, lease_gone) = match ending {
        Ending::MaxRecords => (0, false),
        Ending::End { high_watermark } => {
            summary.push(format!(
                "reached the end of the partition (offset {high_watermark})"
            ));
            (0, false)
        }
        Ending::StdoutClosed => (0, false),
        Ending::Signal(stop) => {
            say(&format!("{} received; stopping", stop.name()));
            (stop.status(), false)
        }
        Ending::Failed {
            failure,
            lease_gone,
        } => {
            let status = failure.status;
            fail(failure);
            (status, lease_gone)
        }
    };
    if args.commit_on_exit && stdout_closed {
        summary
            .push("stdout was closed, so nothing committed (printed records may be unread)".into());
    } else if args.commit_on_exit && lease_gone {
        summary.push("nothing committed (the lease ended)".into());
    } else if args.commit_on_exit {
        match printed.next_offset {
            None => summary.push("nothing to commit".into()),
            Some(next) => match bounded(signals, lease.commit(next)).await {
                Cleanup::Done(Ok(())) => summary.push(format!("committed offset {next}")),
                Cleanup::Done(Err(e)) => {
                    summary.push("commit failed".into());
                    fail(Failure::gateway(&e));
                }
                Cleanup::TimedOut => {
                    summary.push("commit failed".into());
                    fail(timed_out("Commit"));
                }
                Cleanup::Interrupted(stop) => return Ok(abandon(stop, args)),
            },
        }
    }
    if lease_gone {
        summary.push("the lease had ended".into());
    } else {
        match bounded(signals, lease.release()).await {
            Cleanup::Done(Ok(())) => summary.push("lease released".into()),
            Cleanup::Done(Err(e)) => {
                summary.push("release failed".into());
                fail(Failure::gateway(&e));
            }
            Cleanup::TimedOut => {
                summary.push("release failed".into());
                fail(timed_out("Release"));
            }
            Cleanup::Interrupted(stop) => return Ok(abandon(stop, args)),
        }
    }
    say(&summary.join("; "));
    Ok(failed.unwrap_or(status))
}

fn timed_out(call: &str) -> Failure {
    Failure {
        status: super::exit_status(tonic::Code::DeadlineExceeded),
        line: format!(
            "DEADLINE_EXCEEDED: the gateway did not answer the {call} within {}s",
            CLEANUP_TIMEOUT.as_secs()
        ),
    }
}

/// A second signal during the commit or release: leave at once; the lease ends after its TTL.
fn abandon(stop: Stop, args: &TailArgs) -> u8 {
    if !args.quiet {
        eprintln!(
            "kafka-lease tail: {} received again; leaving without releasing (the lease ends \
             after its TTL)",
            stop.name()
        );
    }
    stop.status()
}

/// The summary's count: "1 record printed", "3 records printed".
fn records_printed(count: u64) -> String {
    let noun = if count == 1 { "record" } else { "records" };
    format!("{count} {noun} printed")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    #[test]
    fn the_summary_counts_in_the_singular_for_one_record() {
        assert_eq!(records_printed(0), "0 records printed");
        assert_eq!(records_printed(1), "1 record printed");
        assert_eq!(records_printed(2), "2 records printed");
    }

    #[test]
    fn from_takes_keywords_offsets_and_times() {
        assert_eq!(parse_from("committed"), Ok(StartAt::Committed));
        assert_eq!(parse_from("earliest"), Ok(StartAt::Earliest));
        assert_eq!(parse_from("latest"), Ok(StartAt::Latest));
        assert_eq!(parse_from("0"), Ok(StartAt::Offset(0)));
        assert_eq!(parse_from("42"), Ok(StartAt::Offset(42)));
        let at = |secs: u64, millis: u64| {
            StartAt::Time(UNIX_EPOCH + Duration::from_millis(secs * 1000 + millis))
        };
        assert_eq!(parse_from("2023-11-14T22:13:20Z"), Ok(at(1_700_000_000, 0)));
        assert_eq!(
            parse_from("2023-11-14t22:13:20.25z"),
            Ok(at(1_700_000_000, 250))
        );
        assert_eq!(
            parse_from("2023-11-14T23:13:20.5+01:00"),
            Ok(at(1_700_000_000, 500))
        );
        assert_eq!(
            parse_from("2023-11-14T20:43:20-01:30"),
            Ok(at(1_700_000_000, 0))
        );
        for bad in [
            "",
            "-1",
            "99999999999999999999",
            "first",
            "2023-11-14",
            "2023-11-14T22:13:20",
            "2023-11-14T22:13:20+1:00",
            "2023-11-14T22:13:20+24:00",
        ] {
            let err = parse_from(bad).expect_err(bad);
            assert!(err.contains("allowed: earliest, latest"), "{bad}: {err}");
        }
    }

    #[test]
    fn max_records_is_one_or_more() {
        assert_eq!(parse_max_records("1"), Ok(1));
        for bad in ["0", "-3", "many", ""] {
            assert!(parse_max_records(bad).is_err_and(|e| e.contains("allowed: 1 or more")));
        }
    }

    #[test]
    fn wait_is_bounded_by_the_gateway_limit() {
        assert_eq!(parse_wait("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_wait("5m"), Ok(Duration::from_secs(300)));
        assert!(parse_wait("6m").is_err_and(|e| e.contains("0s ..= 5m")));
        assert!(parse_wait("soon").is_err());
    }

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

    #[test]
    fn the_default_member_names_the_tool() {
        let member = default_member();
        assert!(member.starts_with("kafka-lease-tail@"), "{member}");
        assert!(parse_member(&member).is_ok());
    }
}
