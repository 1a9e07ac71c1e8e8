//! How `tail` ends: the commit (with `--commit-on-exit`) and the release, each bounded in
//! time and cut short by a second signal, then the summary and the exit status.

use kafka_lease_client::Lease;

use super::super::Failure;
use super::{Ending, Printed, Signals, Stop, TailArgs, CLEANUP_TIMEOUT};

/// A cleanup call's outcome: done, timed out, or cut short by another signal.
pub(super) enum Cleanup<T> {
    Done(T),
    TimedOut,
    Interrupted(Stop),
}

pub(super) async fn bounded<T>(
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
pub(super) async fn finish(
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

pub(super) fn timed_out(call: &str) -> Failure {
    Failure {
        status: super::super::exit_status(tonic::Code::DeadlineExceeded),
        line: format!(
            "DEADLINE_EXCEEDED: the gateway did not answer the {call} within {}s",
            CLEANUP_TIMEOUT.as_secs()
        ),
    }
}

/// A second signal during the commit or release: leave at once; the lease ends after its TTL.
pub(super) fn abandon(stop: Stop, args: &TailArgs) -> u8 {
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
pub(super) fn records_printed(count: u64) -> String {
    let noun = if count == 1 { "record" } else { "records" };
    format!("{count} {noun} printed")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_counts_in_the_singular_for_one_record() {
        assert_eq!(records_printed(0), "0 records printed");
        assert_eq!(records_printed(1), "1 record printed");
        assert_eq!(records_printed(2), "2 records printed");
    }
}
