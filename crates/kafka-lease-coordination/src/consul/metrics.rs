//! The backend's metrics, recorded through the `metrics` facade (whatever recorder the
//! process installed; none, and they cost nothing): their names, and `describe_metrics`.

/// Seconds a session renew took to answer (or to fail).
pub const RENEW_SECONDS: &str = "kafka_lease_consul_renew_duration_seconds";
/// Session renews that failed (no answer, an error); the session lives on until a session
/// TTL passes without a confirmed one.
pub const RENEW_FAILURES: &str = "kafka_lease_consul_renew_failures_total";
/// Lock sessions created (at startup, and after each loss).
pub const SESSIONS_CREATED: &str = "kafka_lease_consul_sessions_created_total";
/// Lock sessions lost, by `cause`: `invalidated` (Consul ended it) or `self_fence` (no
/// renew confirmed for a whole session TTL: the instance gave the session up, and every
/// lock of it was void).
pub const SESSIONS_LOST: &str = "kafka_lease_consul_sessions_lost_total";
/// Times the locks were suspended: no renew confirmed for a whole fence window, so no side
/// effect passed the fence until Consul confirmed the session again (or it was lost).
pub const SESSIONS_SUSPENDED: &str = "kafka_lease_consul_session_suspensions_total";
/// Consul requests that failed or went unanswered, by `operation`.
pub const ERRORS: &str = "kafka_lease_consul_errors_total";
/// Passes of the TTL check that failed or went unanswered, after the first that succeeded
/// (the agent marks the check critical, and ends the session, `ttl` after the last one
/// that succeeded).
pub const CHECK_PASS_FAILURES: &str = "kafka_lease_consul_check_pass_failures_total";

/// Describes the backend's metrics to the installed recorder.
pub fn describe_metrics() {
    use ::metrics::{describe_counter, describe_histogram, Unit};
    describe_histogram!(
        RENEW_SECONDS,
        Unit::Seconds,
        "time a Consul session renew took"
    );
    describe_counter!(RENEW_FAILURES, "Consul session renews that failed");
    describe_counter!(SESSIONS_CREATED, "Consul lock sessions created");
    describe_counter!(SESSIONS_LOST, "Consul lock sessions lost, by cause");
    describe_counter!(
        SESSIONS_SUSPENDED,
        "times the locks were suspended for want of a confirmed session renew"
    );
    describe_counter!(ERRORS, "Consul requests that failed, by operation");
    describe_counter!(
        CHECK_PASS_FAILURES,
        "passes of the session's TTL check that failed"
    );
    ::metrics::counter!(CHECK_PASS_FAILURES).increment(0);
    ::metrics::counter!(RENEW_FAILURES).increment(0);
    ::metrics::counter!(SESSIONS_CREATED).increment(0);
    ::metrics::counter!(SESSIONS_SUSPENDED).increment(0);
    for cause in ["invalidated", "self_fence"] {
        ::metrics::counter!(SESSIONS_LOST, "cause" => cause).increment(0);
    }
}
