//! The Consul backend's settings: what they are, their defaults, and the one validation of
//! them, including the self-fencing invariant (stated in docs/ARCHITECTURE.md, "Self-fencing").

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use super::{Ipv4Addr, Ipv6Addr, SERVICE_NAME};

/// Consul's bounds for a session TTL.
pub(super) const TTL_MIN: Duration = Duration::from_secs(10);
pub(super) const TTL_MAX: Duration = Duration::from_secs(24 * 60 * 60);
/// Consul clamps a session's lock-delay to this.
pub(super) const LOCK_DELAY_MAX: Duration = Duration::from_secs(60);
/// The shortest lock-delay allowed: the fence window is `lock_delay - FENCE_MARGIN`, and must
/// leave room for three renews.
pub(super) const LOCK_DELAY_MIN: Duration = Duration::from_secs(1);
/// What the self-fence deadline keeps in hand before the earliest moment another instance
/// could acquire one of this instance's keys (see the module docs): the time from the
/// synchronous deadline check to the side effect, and clock-rate differences between hosts.
pub const FENCE_MARGIN: Duration = Duration::from_millis(250);
/// The defaults of [`ConsulLockConfig`].
pub const DEFAULT_SESSION_TTL: Duration = Duration::from_secs(10);
pub const DEFAULT_LOCK_DELAY: Duration = Duration::from_millis(1500);
/// The defaults of [`SessionCheck`].
pub const DEFAULT_CHECK_INTERVAL: Duration = Duration::from_secs(1);
pub const DEFAULT_CHECK_TIMEOUT: Duration = Duration::from_secs(1);
pub const DEFAULT_DEREGISTER_AFTER: Duration = Duration::from_secs(60);
pub const DEFAULT_CHECK_TTL: Duration = Duration::from_secs(1);
/// The bounds of a TTL check's TTL: at least 100 ms between passes; at most Consul's
/// shortest session TTL, beyond which the session's own expiry would end it first.
pub(super) const CHECK_TTL_MIN: Duration = Duration::from_millis(500);
pub(super) const CHECK_TTL_MAX: Duration = Duration::from_secs(10);
/// Consul runs no check more often than this (it raises shorter intervals to it).
pub(super) const CHECK_INTERVAL_MIN: Duration = Duration::from_secs(1);
/// Consul's reaper ignores `DeregisterCriticalServiceAfter` values below this.
pub(super) const DEREGISTER_AFTER_MIN: Duration = Duration::from_secs(60);

/// How to reach Consul and how this instance's session behaves. The timing settings are
/// bound by the invariant in the module docs; [`ConsulLockConfig::validate`] enforces it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConsulLockConfig {
    /// The agent's HTTP API, e.g. `http://127.0.0.1:8500`. With `check` set it must be the
    /// agent on the gateway's own host: that agent runs the check.
    pub address: String,
    /// ACL token (needs `key:write` on the prefix and `session:write` on the node; with
    /// `check`, also `service:write` on `kafka-lease`).
    pub token: Option<String>,
    /// The KV prefix every lock lives under.
    pub prefix: String,
    /// This gateway instance's name: the session is named `kafka-lease <instance>`, the
    /// service (with `check`) `kafka-lease-<instance>`.
    pub instance: String,
    /// The session TTL (Consul allows 10 s ..= 24 h): how long a gateway that stopped
    /// renewing (crashed without a check, or hung) keeps its keys, up to twice this.
    pub session_ttl: Duration,
    /// How long Consul keeps an invalidated session's keys unlockable (1 s ..= 60 s). The
    /// self-fence window is `lock_delay - FENCE_MARGIN`.
    pub lock_delay: Duration,
    /// How often the session is renewed. `None` (the default) derives it:
    /// `fence_window / 4`, so three renews can fail before the fence. See
    /// [`ConsulLockConfig::renew_interval`].
    pub renew_interval: Option<Duration>,
    /// Bind the session to a TCP check the local agent runs against the gateway, for crash
    /// failover in about `check.interval + lock_delay`. `None`: a TTL-only session.
    pub check: Option<SessionCheck>,
    /// This instance's gRPC address as other instances dial it (`host:port`). When set,
    /// every session this backend creates registers it in an [`InstanceRecord`] bound to the
    /// session (see [`LockBackend::instance_address`]), before the session is used. `None`:
    /// nothing is registered, and no other instance can forward calls here.
    pub advertise: Option<String>,
    /// TLS towards an `https://` address: the CA and, for an agent that verifies incoming
    /// HTTPS, a client certificate. Unset parts fall back to Consul's usual environment
    /// variables (`CONSUL_CACERT`, `CONSUL_CLIENT_CERT`, `CONSUL_CLIENT_KEY`).
    pub tls: ConsulTls,
}

/// TLS towards Consul's HTTPS API: PEM files.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConsulTls {
    /// CA certificates the agent's certificate must chain to.
    pub ca_cert: Option<String>,
    /// This gateway's client certificate and its key (both or neither).
    pub client_cert: Option<String>,
    pub client_key: Option<String>,
}

/// The health check a check-bound session hangs on (see the module docs, "Sessions").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionCheck {
    /// Who keeps the check passing: the gateway itself (TTL) or the agent dialing it (TCP).
    pub kind: CheckKind,
    /// How long the check may stay critical before the agent drops the registration
    /// (default 60 s, Consul's minimum): cleans up after a crashed gateway.
    pub deregister_after: Duration,
}

/// The two kinds of [`SessionCheck`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CheckKind {
    /// A TTL check the backend's own task passes every `ttl / PASSES_PER_TTL`, on the
    /// gateway's runtime; the agent marks it critical `ttl` after the last pass. It follows
    /// the process's ability to run at all: a crash, a SIGSTOP, a wedged runtime or a paused
    /// VM stop the passes alike, while a Kafka outage does not touch them. The agent needs no
    /// route to the gateway.
    Ttl {
        /// Default 1 s (500 ms ..= 60 s).
        ttl: Duration,
    },
    /// A TCP check the agent runs against the gateway's gRPC listener: fails at once when
    /// nothing listens (a crash), but passes while a hung process's kernel still completes
    /// handshakes (SIGSTOP, a wedged runtime).
    Tcp {
        /// `host:port` the agent dials: the gateway's gRPC listener as the agent reaches it.
        addr: String,
        /// How often the agent dials (Consul's minimum, and the default: 1 s).
        interval: Duration,
        /// How long one dial may take (default 1 s). A refused connection fails at once.
        timeout: Duration,
    },
}

/// How many times per TTL the backend passes a TTL check: four passes can be lost or late
/// before the check fails.
pub const PASSES_PER_TTL: u32 = 5;

impl SessionCheck {
    /// A TTL check of `ttl` that the gateway passes itself.
    pub fn ttl(ttl: Duration) -> Self {
        Self {
            kind: CheckKind::Ttl { ttl },
            deregister_after: DEFAULT_DEREGISTER_AFTER,
        }
    }

    /// A TCP check dialing `addr`, with the default timings.
    pub fn tcp(addr: impl Into<String>) -> Self {
        Self {
            kind: CheckKind::Tcp {
                addr: addr.into(),
                interval: DEFAULT_CHECK_INTERVAL,
                timeout: DEFAULT_CHECK_TIMEOUT,
            },
            deregister_after: DEFAULT_DEREGISTER_AFTER,
        }
    }

    /// A TCP check for a gateway listening on `listen`: an unspecified address (`0.0.0.0`,
    /// `[::]`) is dialed on the loopback of its family (`127.0.0.1`, `[::1]`), since the
    /// agent runs on the same host.
    pub fn for_listener(listen: SocketAddr) -> Self {
        let ip = match listen.ip() {
            IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
            ip => ip,
        };
        Self::tcp(SocketAddr::new(ip, listen.port()).to_string())
    }

    /// The address a TCP check dials.
    pub fn tcp_addr(&self) -> Option<&str> {
        match &self.kind {
            CheckKind::Tcp { addr, .. } => Some(addr),
            CheckKind::Ttl { .. } => None,
        }
    }

    /// How often the backend passes a TTL check.
    pub fn pass_interval(&self) -> Option<Duration> {
        match &self.kind {
            CheckKind::Ttl { ttl } => Some(*ttl / PASSES_PER_TTL),
            CheckKind::Tcp { .. } => None,
        }
    }

    /// For the log: `ttl 1s` or `tcp 127.0.0.1:50051`.
    pub fn describe(&self) -> String {
        match &self.kind {
            CheckKind::Ttl { ttl } => {
                format!("ttl {ttl:?}, passed every {:?}", *ttl / PASSES_PER_TTL)
            }
            CheckKind::Tcp { addr, .. } => format!("tcp {addr}"),
        }
    }
}

impl Default for ConsulLockConfig {
    /// Every setting but `instance`, which must be set (`validate` insists). TTL-only: a
    /// check needs the gateway's address.
    fn default() -> Self {
        Self {
            address: "http://127.0.0.1:8500".into(),
            token: None,
            prefix: "kafka-lease".into(),
            instance: String::new(),
            session_ttl: DEFAULT_SESSION_TTL,
            lock_delay: DEFAULT_LOCK_DELAY,
            renew_interval: None,
            check: None,
            advertise: None,
            tls: ConsulTls::default(),
        }
    }
}

/// A [`ConsulLockConfig`] setting that cannot work.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConsulConfigError {
    #[error("{setting} = {value} is out of range; allowed: {allowed}")]
    OutOfRange {
        setting: &'static str,
        value: String,
        allowed: String,
    },
    #[error("{setting} = {value:?} is invalid: {reason}")]
    Invalid {
        setting: &'static str,
        value: String,
        reason: &'static str,
    },
}

impl ConsulConfigError {
    /// The setting at fault, its value as given (quoted where it is text), and what is
    /// allowed: for callers that report the error in their own terms (the CLI names flags).
    pub fn parts(&self) -> (&'static str, String, String) {
        match self {
            ConsulConfigError::OutOfRange {
                setting,
                value,
                allowed,
            } => (setting, value.clone(), allowed.clone()),
            ConsulConfigError::Invalid {
                setting,
                value,
                reason,
            } => (setting, format!("{value:?}"), reason.to_string()),
        }
    }
}

pub(super) fn out_of_range(
    setting: &'static str,
    value: Duration,
    allowed: String,
) -> ConsulConfigError {
    ConsulConfigError::OutOfRange {
        setting,
        value: format!("{value:?}"),
        allowed,
    }
}

/// A name made only of `[A-Za-z0-9._-]`: safe in a URL path and a Consul service id.
pub(super) fn is_plain_name(s: &str) -> bool {
    !s.is_empty() && s.chars().all(crate::is_name_char)
}

impl ConsulLockConfig {
    /// Checks every setting against what Consul and this backend accept, including the
    /// self-fencing invariant (see the module docs).
    pub fn validate(&self) -> Result<(), ConsulConfigError> {
        let address = self.address.trim_end_matches('/');
        let host = address
            .strip_prefix("http://")
            .or_else(|| address.strip_prefix("https://"));
        if host.is_none_or(|h| h.is_empty() || h.contains(['/', '?', '#'])) {
            return Err(ConsulConfigError::Invalid {
                setting: "address",
                value: self.address.clone(),
                reason: "must be http://host:port or https://host:port",
            });
        }
        if (self.tls.ca_cert.is_some() || self.tls.client_cert.is_some())
            && !address.starts_with("https://")
        {
            return Err(ConsulConfigError::Invalid {
                setting: "address",
                value: self.address.clone(),
                reason: "must be https://host:port when a CA or client certificate for \
                         Consul is given",
            });
        }
        if self.tls.client_cert.is_some() != self.tls.client_key.is_some() {
            return Err(ConsulConfigError::Invalid {
                setting: "tls.client_cert",
                value: if self.tls.client_cert.is_some() {
                    "a certificate without a key".into()
                } else {
                    "a key without a certificate".into()
                },
                reason: "a client certificate needs its key, and a key its certificate",
            });
        }
        if let Some(token) = &self.token {
            // The token goes into a header; consulrs would panic on anything else.
            if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(ConsulConfigError::Invalid {
                    setting: "token",
                    value: "<redacted>".into(),
                    reason: "must be non-empty printable ASCII without spaces",
                });
            }
        }
        let prefix = self.prefix.trim_end_matches('/');
        let segment_ok = |s: &str| is_plain_name(s) && s != "." && s != "..";
        if !prefix.split('/').all(segment_ok) {
            return Err(ConsulConfigError::Invalid {
                setting: "prefix",
                value: self.prefix.clone(),
                reason: "must be one or more `/`-separated segments of [A-Za-z0-9._-], \
                         without a leading `/`, `.` or `..`",
            });
        }
        if self.instance.trim().is_empty() {
            return Err(ConsulConfigError::Invalid {
                setting: "instance",
                value: self.instance.clone(),
                reason: "must name this gateway instance",
            });
        }
        if !(TTL_MIN..=TTL_MAX).contains(&self.session_ttl) {
            return Err(out_of_range(
                "session_ttl",
                self.session_ttl,
                "10s ..= 24h (Consul's limits)".into(),
            ));
        }
        if !(LOCK_DELAY_MIN..=LOCK_DELAY_MAX).contains(&self.lock_delay) {
            return Err(out_of_range(
                "lock_delay",
                self.lock_delay,
                "1s ..= 60s (the self-fence window is lock_delay - 250ms, and Consul allows \
                 at most 60s)"
                    .into(),
            ));
        }
        if let Some(check) = &self.check {
            self.validate_check(check)?;
        }
        if let Some(advertise) = &self.advertise {
            if !is_plain_name(&self.instance) {
                return Err(ConsulConfigError::Invalid {
                    setting: "instance",
                    value: self.instance.clone(),
                    reason: "must be [A-Za-z0-9._-] with an advertised address: it is part \
                             of the instance's Consul key",
                });
            }
            if !is_host_port(advertise) {
                return Err(ConsulConfigError::Invalid {
                    setting: "advertise",
                    value: advertise.clone(),
                    reason: "must be host:port with a port in 1..=65535 (the address other \
                             gateway instances dial, e.g. 10.0.0.7:50051)",
                });
            }
        }
        let window = self.fence_window();
        let renew = self.renew_interval();
        let max_renew = (window / 3).min(self.session_ttl / 2);
        if renew.is_zero() || renew > max_renew {
            return Err(out_of_range(
                "renew_interval",
                renew,
                format!(
                    "more than 0s ..= min(fence_window / 3, session_ttl / 2) = {max_renew:?}, \
                     where fence_window = lock_delay - {FENCE_MARGIN:?} = {window:?} (renew_interval * 3 <= \
                     fence_window: at least three renews before the self-fence)"
                ),
            ));
        }
        Ok(())
    }

    fn validate_check(&self, check: &SessionCheck) -> Result<(), ConsulConfigError> {
        if !is_plain_name(&self.instance) {
            return Err(ConsulConfigError::Invalid {
                setting: "instance",
                value: self.instance.clone(),
                reason: "must be [A-Za-z0-9._-] with a check: it is part of the Consul \
                         service id",
            });
        }
        match &check.kind {
            CheckKind::Ttl { ttl } => {
                if !(CHECK_TTL_MIN..=CHECK_TTL_MAX).contains(ttl) {
                    return Err(out_of_range(
                        "check.ttl",
                        *ttl,
                        "500ms ..= 10s (passed every ttl / 5; a longer one gains little \
                         over the session's own TTL)"
                            .into(),
                    ));
                }
            }
            CheckKind::Tcp {
                addr,
                interval,
                timeout,
            } => {
                if !is_host_port(addr) {
                    return Err(ConsulConfigError::Invalid {
                        setting: "check.tcp_addr",
                        value: addr.clone(),
                        reason: "must be host:port (the gateway's listener as the local agent \
                                 reaches it, e.g. 127.0.0.1:50051)",
                    });
                }
                if *interval < CHECK_INTERVAL_MIN {
                    return Err(out_of_range(
                        "check.interval",
                        *interval,
                        "1s or more (Consul's minimum)".into(),
                    ));
                }
                if *timeout < Duration::from_millis(1) || timeout > interval {
                    return Err(out_of_range(
                        "check.timeout",
                        *timeout,
                        format!("1ms ..= check.interval = {interval:?}"),
                    ));
                }
            }
        }
        if check.deregister_after < DEREGISTER_AFTER_MIN {
            return Err(out_of_range(
                "check.deregister_after",
                check.deregister_after,
                "60s or more (Consul's minimum)".into(),
            ));
        }
        Ok(())
    }

    /// How long after the send time of its last confirmed renew this instance may act on
    /// its grants: `lock_delay - FENCE_MARGIN`, whatever the session's checks (zero if that
    /// would be negative; `validate` refuses such settings). Any session can be invalidated
    /// at any moment after its last confirmation (a check, its node's deregistration, a
    /// destroy), and its keys are free for others `lock_delay` after that; see "Self-fencing"
    /// in docs/ARCHITECTURE.md.
    pub fn fence_window(&self) -> Duration {
        self.lock_delay.saturating_sub(FENCE_MARGIN)
    }

    /// The renew interval in effect: the configured one, or `fence_window / 4`.
    pub fn renew_interval(&self) -> Duration {
        self.renew_interval
            .unwrap_or_else(|| self.fence_window() / 4)
    }

    /// The Consul service id registered for a check-bound session.
    pub fn service_id(&self) -> String {
        format!("{SERVICE_NAME}-{}", self.instance)
    }

    /// The id of the check a check-bound session is bound to.
    pub fn check_id(&self) -> String {
        format!("{SERVICE_NAME}-{}-alive", self.instance)
    }

    pub(super) fn prefix(&self) -> &str {
        self.prefix.trim_end_matches('/')
    }

    /// The folder of the instance records: `<prefix>/~instances/`. `~` cannot occur in a
    /// group name, so no lock key ever lies under it.
    pub(super) fn instances_folder(&self) -> String {
        format!("{}/{INSTANCES_DIR}/", self.prefix())
    }
}

/// The folder, under the prefix, of the instance records.
pub(super) const INSTANCES_DIR: &str = "~instances";

/// `host:port`, with a non-empty host, a port in 1..=65535, and no `/` or space.
pub(super) fn is_host_port(value: &str) -> bool {
    let port_ok = value
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p != 0));
    port_ok && !value.contains(['/', ' '])
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn valid() -> ConsulLockConfig {
        ConsulLockConfig {
            instance: "gw-1".into(),
            ..ConsulLockConfig::default()
        }
    }

    fn rejected(config: ConsulLockConfig) -> String {
        config
            .validate()
            .expect_err("should be rejected")
            .to_string()
    }

    #[test]
    fn tls_towards_consul_needs_https_and_a_whole_key_pair() {
        let tls = |ca: bool, cert: bool, key: bool| ConsulTls {
            ca_cert: ca.then(|| "ca.pem".into()),
            client_cert: cert.then(|| "c.pem".into()),
            client_key: key.then(|| "k.pem".into()),
        };
        let e = rejected(ConsulLockConfig {
            tls: tls(true, false, false),
            ..valid()
        });
        assert!(e.contains("https://"), "{e}");
        let https = |t: ConsulTls| ConsulLockConfig {
            address: "https://127.0.0.1:8501".into(),
            tls: t,
            ..valid()
        };
        assert!(https(tls(true, true, true)).validate().is_ok());
        assert!(https(tls(true, false, false)).validate().is_ok());
        let e = rejected(https(tls(true, true, false)));
        assert!(e.contains("without a key"), "{e}");
        let e = rejected(https(tls(false, false, true)));
        assert!(e.contains("without a certificate"), "{e}");
    }

    fn checked() -> ConsulLockConfig {
        ConsulLockConfig {
            check: Some(SessionCheck::tcp("127.0.0.1:50051")),
            ..valid()
        }
    }

    fn ttl_checked() -> ConsulLockConfig {
        ConsulLockConfig {
            check: Some(SessionCheck::ttl(DEFAULT_CHECK_TTL)),
            ..valid()
        }
    }

    #[test]
    fn defaults_are_valid_once_the_instance_is_named() {
        valid().validate().unwrap();
        assert!(rejected(ConsulLockConfig::default()).contains("instance"));
        let d = ConsulLockConfig::default();
        assert_eq!(d.renew_interval, None);
        assert_eq!(d.prefix, "kafka-lease");
        assert_eq!(d.check, None);
        // TTL-only or check-bound: the window is the lock-delay less the margin, renewed four
        // times per window (a TTL-only session can end early too: its node deregistered).
        assert_eq!(d.fence_window(), Duration::from_millis(1250));
        assert_eq!(d.renew_interval(), Duration::from_micros(312_500));
        let c = checked();
        c.validate().unwrap();
        assert_eq!(c.fence_window(), Duration::from_millis(1250));
        assert_eq!(c.renew_interval(), Duration::from_micros(312_500));
        let check = c.check.unwrap();
        assert_eq!(
            check.kind,
            CheckKind::Tcp {
                addr: "127.0.0.1:50051".into(),
                interval: Duration::from_secs(1),
                timeout: Duration::from_secs(1)
            }
        );
        assert_eq!(check.deregister_after, Duration::from_secs(60));
        let t = ttl_checked();
        t.validate().unwrap();
        // The fence does not depend on the kind of check.
        assert_eq!(t.fence_window(), Duration::from_millis(1250));
        let check = t.check.unwrap();
        assert_eq!(check.pass_interval(), Some(Duration::from_millis(200)));
        assert_eq!(check.tcp_addr(), None);
    }

    #[test]
    fn the_fence_invariant_is_enforced() {
        // Three renews per window: 1.25 s / 3 = 416.66 ms at most with a check.
        ConsulLockConfig {
            renew_interval: Some(Duration::from_millis(416)),
            ..checked()
        }
        .validate()
        .unwrap();
        let e = rejected(ConsulLockConfig {
            renew_interval: Some(Duration::from_millis(417)),
            ..checked()
        });
        assert!(
            e.contains("renew_interval = 417ms")
                && e.contains("lock_delay - 250ms")
                && e.contains("fence_window = lock_delay - 250ms = 1.25s")
                && e.contains("renew_interval * 3 <= fence_window"),
            "{e}"
        );
        // Without a check the lock-delay sets the window too, not the TTL: the window that
        // the old TTL-based rule allowed is refused.
        let e = rejected(ConsulLockConfig {
            renew_interval: Some(Duration::from_millis(3250)),
            ..valid()
        });
        assert!(
            e.contains("renew_interval = 3.25s") && e.contains("lock_delay - 250ms"),
            "{e}"
        );
        ConsulLockConfig {
            renew_interval: Some(Duration::from_millis(416)),
            ..valid()
        }
        .validate()
        .unwrap();
        // A long lock-delay widens the window, still bounded by renew <= TTL / 2.
        let e = rejected(ConsulLockConfig {
            lock_delay: Duration::from_secs(30),
            renew_interval: Some(Duration::from_secs(6)),
            ..valid()
        });
        assert!(e.contains("renew_interval = 6s"), "{e}");
        for config in [valid(), checked()] {
            let e = rejected(ConsulLockConfig {
                lock_delay: Duration::from_millis(999),
                ..config
            });
            assert!(
                e.contains("lock_delay = 999ms") && e.contains("1s ..= 60s"),
                "{e}"
            );
        }
        // A derived interval follows the lock-delay.
        let c = ConsulLockConfig {
            lock_delay: Duration::from_secs(1),
            ..checked()
        };
        c.validate().unwrap();
        assert_eq!(c.fence_window(), Duration::from_millis(750));
        assert_eq!(c.renew_interval(), Duration::from_micros(187_500));
    }

    #[test]
    fn check_settings_are_checked() {
        let with = |f: fn(&mut SessionCheck)| {
            let mut config = checked();
            f(config.check.as_mut().unwrap());
            config
        };
        fn tcp(addr: &str, interval_ms: u64, timeout_ms: u64) -> CheckKind {
            CheckKind::Tcp {
                addr: addr.into(),
                interval: Duration::from_millis(interval_ms),
                timeout: Duration::from_millis(timeout_ms),
            }
        }
        for (config, needle) in [
            (
                with(|c| c.kind = tcp("50051", 1000, 1000)),
                "check.tcp_addr",
            ),
            (
                with(|c| c.kind = tcp(":50051", 1000, 1000)),
                "check.tcp_addr",
            ),
            (with(|c| c.kind = tcp("h:0", 1000, 1000)), "check.tcp_addr"),
            (
                with(|c| c.kind = tcp("h:port", 1000, 1000)),
                "check.tcp_addr",
            ),
            (
                with(|c| c.kind = tcp("h:1", 500, 500)),
                "check.interval = 500ms",
            ),
            (
                with(|c| c.kind = tcp("h:1", 1000, 0)),
                "check.timeout = 0ns",
            ),
            (
                with(|c| c.kind = tcp("h:1", 1000, 2000)),
                "check.timeout = 2s",
            ),
            (
                with(|c| c.deregister_after = Duration::from_secs(30)),
                "check.deregister_after",
            ),
            (
                with(|c| {
                    c.kind = CheckKind::Ttl {
                        ttl: Duration::from_millis(499),
                    }
                }),
                "check.ttl = 499ms",
            ),
            (
                with(|c| {
                    c.kind = CheckKind::Ttl {
                        ttl: Duration::from_secs(11),
                    }
                }),
                "check.ttl = 11s",
            ),
        ] {
            let e = rejected(config);
            assert!(e.contains(needle), "{needle}: {e}");
        }
        with(|c| {
            c.kind = CheckKind::Ttl {
                ttl: Duration::from_millis(500),
            }
        })
        .validate()
        .unwrap();
        with(|c| c.kind = tcp("[::1]:50051", 1000, 1000))
            .validate()
            .unwrap();
        let e = rejected(ConsulLockConfig {
            instance: "gw 1".into(),
            ..ttl_checked()
        });
        assert!(e.contains("instance") && e.contains("service id"), "{e}");
    }

    #[test]
    fn a_check_dials_the_loopback_for_an_unspecified_listen_address() {
        let addr = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert_eq!(
            SessionCheck::for_listener(addr("0.0.0.0:50051")).tcp_addr(),
            Some("127.0.0.1:50051")
        );
        assert_eq!(
            SessionCheck::for_listener(addr("[::]:50051")).tcp_addr(),
            Some("[::1]:50051")
        );
        assert_eq!(
            SessionCheck::for_listener(addr("10.1.2.3:7000")).tcp_addr(),
            Some("10.1.2.3:7000")
        );
    }

    #[test]
    fn out_of_range_values_name_the_setting_and_the_range() {
        let e = rejected(ConsulLockConfig {
            session_ttl: Duration::from_secs(5),
            ..valid()
        });
        assert!(
            e.contains("session_ttl = 5s") && e.contains("10s ..= 24h"),
            "{e}"
        );
        let e = rejected(ConsulLockConfig {
            session_ttl: Duration::from_secs(25 * 3600),
            ..valid()
        });
        assert!(e.contains("session_ttl"), "{e}");
        let e = rejected(ConsulLockConfig {
            lock_delay: Duration::from_secs(61),
            ..valid()
        });
        assert!(
            e.contains("lock_delay = 61s") && e.contains("1s ..= 60s"),
            "{e}"
        );
        let e = rejected(ConsulLockConfig {
            renew_interval: Some(Duration::from_secs(6)),
            ..valid()
        });
        assert!(
            e.contains("renew_interval = 6s") && e.contains("416.666666ms"),
            "{e}"
        );
        let e = rejected(ConsulLockConfig {
            renew_interval: Some(Duration::ZERO),
            ..valid()
        });
        assert!(e.contains("renew_interval"), "{e}");
        // No lock-delay leaves no fence window, with or without a check.
        let e = rejected(ConsulLockConfig {
            lock_delay: Duration::ZERO,
            ..valid()
        });
        assert!(e.contains("lock_delay = 0ns"), "{e}");
    }

    #[test]
    fn addresses_prefixes_and_tokens_are_checked() {
        for bad in [
            "127.0.0.1:8500",
            "localhost:8500",
            "http://",
            "ftp://x",
            "http://h/p",
        ] {
            let e = rejected(ConsulLockConfig {
                address: bad.into(),
                ..valid()
            });
            assert!(e.contains("address"), "{bad}: {e}");
        }
        ConsulLockConfig {
            address: "https://consul.example:8501/".into(),
            ..valid()
        }
        .validate()
        .unwrap();
        for bad in ["", "/abs", "a//b", "a/../b", "sp ace", "a/./b"] {
            let e = rejected(ConsulLockConfig {
                prefix: bad.into(),
                ..valid()
            });
            assert!(e.contains("prefix"), "{bad:?}: {e}");
        }
        ConsulLockConfig {
            prefix: "team/kafka-lease_1/".into(),
            ..valid()
        }
        .validate()
        .unwrap();
        let e = rejected(ConsulLockConfig {
            token: Some("a b".into()),
            ..valid()
        });
        assert!(e.contains("token") && !e.contains("a b"), "{e}");
    }
}
