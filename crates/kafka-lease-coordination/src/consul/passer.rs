//! The passer of a TTL check: the task that tells the agent, every pass interval, that this
//! gateway process still runs (see [`CheckKind::Ttl`]).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{PassCheck, SendError, Shared, PASSES_PER_TTL};

/// Why one pass of the TTL check failed.
#[derive(Debug, thiserror::Error)]
enum PassFailure {
    /// No answer within the patience of a pass.
    #[error("no answer within {0:?}")]
    NoAnswer(Duration),
    /// The request got no HTTP answer.
    #[error(transparent)]
    Send(#[from] SendError),
    /// The agent answered with something other than 200.
    #[error("HTTP {status}: {body}")]
    Status { status: u16, body: String },
}

/// Passes this instance's TTL check every `every`, for as long as the backend lives, whatever
/// the state of the session: the check says that this process runs, nothing more (a Kafka
/// outage, or a lost session being replaced, leaves it passing). It runs on the gateway's
/// runtime, so a process that cannot run its tasks (SIGSTOP, a wedged runtime, a paused VM)
/// stops passing, and the agent marks the check critical, ending the session, `ttl` after
/// the last pass. Each pass may take up to half the TTL: a slow agent still gets its passes
/// through (cancelling them sooner would fail the check while the agent works), and one that
/// hangs leaves time for another try on a fresh request before the TTL runs out.
pub(super) async fn run_check_passer(shared: Arc<Shared>, every: Duration) {
    let ttl = every * PASSES_PER_TTL;
    let patience = ttl / 2;
    let check_id = shared.config.check_id();
    let instance = shared.config.instance.clone();
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // When the last good pass was answered: a gap past the TTL between two means the agent
    // has likely marked the check critical meanwhile, and ended the session. Failures before
    // the first good pass are expected (the check may not be registered yet) and neither
    // counted nor warned about; after it, `failing_since` is the start of the current run of
    // failures, if any.
    let mut last_passed: Option<Instant> = None;
    let mut failing_since: Option<Instant> = None;
    loop {
        let due = ticks.tick().await;
        let started = Instant::now();
        let outcome = match tokio::time::timeout(
            patience,
            shared.send_raw_critical(PassCheck {
                check_id: check_id.clone(),
            }),
        )
        .await
        {
            Err(_) => Err(PassFailure::NoAnswer(patience)),
            Ok(Err(error)) => Err(PassFailure::from(error)),
            Ok(Ok(answer)) if answer.status == 200 => Ok(()),
            Ok(Ok(answer)) => Err(PassFailure::Status {
                status: answer.status,
                body: String::from_utf8_lossy(&answer.body).trim().to_string(),
            }),
        };
        match outcome {
            Ok(()) => {
                let now = Instant::now();
                if let Some(gap) = last_passed.map(|at| now.saturating_duration_since(at)) {
                    if gap > ttl {
                        // Said, because the session's end that follows would otherwise be
                        // reported with the check passing again, and no cause.
                        tracing::warn!(
                            %instance,
                            check = %check_id,
                            ?gap,
                            ?ttl,
                            turn_late_by = ?started.saturating_duration_since(due),
                            answered_in = ?now.saturating_duration_since(started),
                            "the liveness check went longer than its TTL without a pass: the \
                             agent has likely marked it critical and ended this instance's \
                             session. A pass's turn late means this process did not run its \
                             tasks in time (no CPU for it, a pause, or a blocked runtime); a \
                             slow answer, a slow agent",
                        );
                    }
                }
                last_passed = Some(now);
                if let Some(since) = failing_since.take() {
                    tracing::info!(
                        %instance,
                        check = %check_id,
                        failing_for = ?since.elapsed(),
                        "passing the liveness check again",
                    );
                }
            }
            Err(error) => {
                if last_passed.is_none() {
                    tracing::debug!(%instance, check = %check_id, %error, "liveness check not passed yet");
                    continue;
                }
                ::metrics::counter!(super::metrics::CHECK_PASS_FAILURES).increment(1);
                if failing_since.is_none() {
                    failing_since = Some(Instant::now());
                    tracing::warn!(
                        %instance,
                        check = %check_id,
                        %error,
                        "could not pass the liveness check; the agent ends this instance's \
                         session if no pass succeeds within the check's TTL",
                    );
                }
            }
        }
    }
}
