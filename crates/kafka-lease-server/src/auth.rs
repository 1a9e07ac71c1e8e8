//! Who is calling, and what they may do.
//!
//! A caller's identity comes from, in order: a bearer token (`authorization: Bearer …`)
//! found in the tokens file, compared in constant time; the client certificate under mutual
//! TLS (its first URI SAN, else DNS SAN, else CN); for a call another gateway instance
//! forwarded, the identity that instance vouches for in [`FORWARDED_FOR`], believed only
//! from a connection whose own identity is a gateway's (see [`Policy`]).
//!
//! With a policy file, every call needs an identity (else UNAUTHENTICATED) and every action
//! a grant (else PERMISSION_DENIED naming the action, group and topic); without one, any
//! caller may do anything, as before. Either way a lease is bound to the identity that
//! acquired it: the same lease id from another identity is refused.
//!
//! The policy and token files are read again every [`RELOAD_INTERVAL`]; a changed file
//! that does not validate leaves the previous version in force and is logged with the
//! reason. Held leases are untouched by a reload: a grant removed stops the next call.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tonic::metadata::MetadataMap;

use crate::error::{Denied, LeaseError};
use crate::reload::{digest, every_interval, Swapped};
use crate::tls::ServerTls;

/// How often the policy and token files are checked for changes.
pub use crate::reload::RELOAD_INTERVAL;

/// The header with which a gateway instance names the caller of a call it forwards. Only
/// believed from another gateway (an identity the policy's `gateways` lists, or this
/// instance's own certificate identity).
pub const FORWARDED_FOR: &str = "kafka-lease-forwarded-for";

/// The shortest bearer token accepted in the tokens file.
pub const MIN_TOKEN_LEN: usize = 16;

/// What a caller can be allowed to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    Acquire,
    Read,
    Seek,
    Commit,
    Release,
    Subscribe,
    List,
}

impl Action {
    pub const ALL: [Action; 7] = [
        Action::Acquire,
        Action::Read,
        Action::Seek,
        Action::Commit,
        Action::Release,
        Action::Subscribe,
        Action::List,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Action::Acquire => "acquire",
            Action::Read => "read",
            Action::Seek => "seek",
            Action::Commit => "commit",
            Action::Release => "release",
            Action::Subscribe => "subscribe",
            Action::List => "list",
        }
    }

    fn parse(name: &str) -> Option<Vec<Action>> {
        if name == "*" {
            return Some(Action::ALL.to_vec());
        }
        Action::ALL
            .into_iter()
            .find(|a| a.as_str() == name)
            .map(|a| vec![a])
    }
}

/// A name pattern: `*` matches any run of characters, everything else itself.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Pattern(String);

impl Pattern {
    fn matches(&self, name: &str) -> bool {
        glob(self.0.as_bytes(), name.as_bytes())
    }
}

fn glob(pattern: &[u8], name: &[u8]) -> bool {
    // Iterative wildcard match with one backtrack point: linear in practice, no recursion.
    let (mut p, mut n) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        if p < pattern.len() && pattern[p] == b'*' {
            star = Some((p, n));
            p += 1;
        } else if p < pattern.len() && pattern[p] == name[n] {
            p += 1;
            n += 1;
        } else if let Some((sp, sn)) = star {
            p = sp + 1;
            n = sn + 1;
            star = Some((sp, sn + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

#[derive(Debug, Clone)]
struct Grant {
    identities: Vec<Pattern>,
    groups: Vec<Pattern>,
    topics: Vec<Pattern>,
    actions: HashSet<Action>,
}

/// The policy file, parsed and checked.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    grants: Vec<Grant>,
    gateways: Vec<Pattern>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyFile {
    #[serde(default)]
    allow: Vec<GrantFile>,
    #[serde(default)]
    gateways: Option<GatewaysFile>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GrantFile {
    identities: Vec<String>,
    groups: Vec<String>,
    topics: Vec<String>,
    actions: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GatewaysFile {
    identities: Vec<String>,
}

impl Policy {
    /// Parses and checks a policy (TOML; see "Running it securely" in docs/OPERATIONS.md).
    pub fn parse(text: &str) -> Result<Policy, String> {
        let file: PolicyFile = toml::from_str(text).map_err(|e| e.to_string())?;
        let patterns = |what: &str, i: usize, list: Vec<String>| -> Result<Vec<Pattern>, String> {
            if list.is_empty() {
                return Err(format!(
                    "allow[{i}].{what} is empty; list at least one name or pattern (\"*\" for any)"
                ));
            }
            list.into_iter()
                .map(|p| {
                    if p.is_empty() || p.len() > 512 || p.chars().any(char::is_control) {
                        Err(format!(
                            "allow[{i}].{what} has {p:?}: a pattern is 1..=512 printable characters, `*` matching any run"
                        ))
                    } else {
                        Ok(Pattern(p))
                    }
                })
                .collect()
        };
        let mut grants = Vec::new();
        for (i, grant) in file.allow.into_iter().enumerate() {
            let mut actions = HashSet::new();
            if grant.actions.is_empty() {
                return Err(format!("allow[{i}].actions is empty"));
            }
            for name in &grant.actions {
                let parsed = Action::parse(name).ok_or_else(|| {
                    format!(
                        "allow[{i}].actions has {name:?}; allowed: {}, or \"*\" for all",
                        Action::ALL.map(Action::as_str).join(", ")
                    )
                })?;
                actions.extend(parsed);
            }
            grants.push(Grant {
                identities: patterns("identities", i, grant.identities)?,
                groups: patterns("groups", i, grant.groups)?,
                topics: patterns("topics", i, grant.topics)?,
                actions,
            });
        }
        let gateways = match file.gateways {
            Some(g) => g
                .identities
                .into_iter()
                .map(|p| {
                    if p.is_empty() || p.chars().any(char::is_control) {
                        Err(format!("gateways.identities has {p:?}: not a name"))
                    } else {
                        Ok(Pattern(p))
                    }
                })
                .collect::<Result<_, _>>()?,
            None => Vec::new(),
        };
        Ok(Policy { grants, gateways })
    }

    /// Whether `identity` may take `action` on `group` and `topic`.
    pub fn allows(&self, identity: &str, action: Action, group: &str, topic: &str) -> bool {
        self.grants.iter().any(|g| {
            g.actions.contains(&action)
                && g.identities.iter().any(|p| p.matches(identity))
                && g.groups.iter().any(|p| p.matches(group))
                && g.topics.iter().any(|p| p.matches(topic))
        })
    }

    /// Whether `identity` may take `action` on `group` for some topic (for listings that
    /// are filtered row by row afterwards).
    fn allows_in_group(&self, identity: &str, action: Action, group: &str) -> bool {
        self.grants.iter().any(|g| {
            g.actions.contains(&action)
                && g.identities.iter().any(|p| p.matches(identity))
                && g.groups.iter().any(|p| p.matches(group))
        })
    }

    fn is_gateway(&self, identity: &str) -> bool {
        self.gateways.iter().any(|p| p.matches(identity))
    }
}

/// The bearer tokens file: `<identity> <token>` per line, `#` comments.
#[derive(Clone, Default)]
pub struct Tokens {
    /// SHA-256 of each token, with its identity: compared digest to digest in constant
    /// time, so neither a token's bytes nor its length leak through timing.
    entries: Vec<([u8; 32], String)>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokens")
            .field("count", &self.entries.len())
            .finish()
    }
}

impl Tokens {
    /// Parses a tokens file. Errors name the line, never the token.
    pub fn parse(text: &str) -> Result<Tokens, String> {
        let mut entries = Vec::new();
        let mut seen = HashSet::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut parts = line.split_whitespace();
            let (Some(identity), Some(token), None) = (parts.next(), parts.next(), parts.next())
            else {
                return Err(format!(
                    "line {}: expected `<identity> <token>` (two words)",
                    n + 1
                ));
            };
            if token.len() < MIN_TOKEN_LEN {
                return Err(format!(
                    "line {}: the token for {identity:?} is shorter than {MIN_TOKEN_LEN} characters",
                    n + 1
                ));
            }
            let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
            if !seen.insert(digest) {
                return Err(format!(
                    "line {}: the token for {identity:?} is also given to another identity",
                    n + 1
                ));
            }
            entries.push((digest, identity.to_string()));
        }
        Ok(Tokens { entries })
    }

    /// The identity `token` belongs to. Every entry is compared, whatever matches.
    pub fn identity(&self, token: &str) -> Option<String> {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let mut found = None;
        for (known, identity) in &self.entries {
            if bool::from(known.ct_eq(&digest)) {
                found = Some(identity);
            }
        }
        found.cloned()
    }
}

/// A file read again when it changes, parsed by `parse`, the last good version kept.
struct Reloading<T> {
    path: PathBuf,
    what: &'static str,
    parse: fn(&str) -> Result<T, String>,
    value: Swapped<T>,
}

impl<T> Reloading<T> {
    fn load(
        path: PathBuf,
        what: &'static str,
        parse: fn(&str) -> Result<T, String>,
    ) -> Result<Self, String> {
        let bytes = read_file(&path, what)?;
        let value = parse_file(&path, what, parse, &bytes)?;
        Ok(Reloading {
            value: Swapped::new(value, digest([bytes.as_slice()])),
            path,
            what,
            parse,
        })
    }

    fn get(&self) -> Arc<T> {
        self.value.get()
    }

    /// `Ok(true)` when a changed, valid file replaced the previous version.
    fn reload(&self) -> Result<bool, String> {
        let bytes = read_file(&self.path, self.what)?;
        self.value.offer(digest([bytes.as_slice()]), || {
            parse_file(&self.path, self.what, self.parse, &bytes)
        })
    }
}

fn read_file(path: &Path, what: &str) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("cannot read the {what} {}: {e}", path.display()))
}

fn parse_file<T>(
    path: &Path,
    what: &str,
    parse: fn(&str) -> Result<T, String>,
    bytes: &[u8],
) -> Result<T, String> {
    let text = std::str::from_utf8(bytes)
        .map_err(|_| format!("the {what} {} is not UTF-8", path.display()))?;
    parse(text).map_err(|e| format!("the {what} {}: {e}", path.display()))
}

/// Where the identities and the policy come from.
#[derive(Debug, Clone, Default)]
pub struct AuthFiles {
    pub policy: Option<PathBuf>,
    pub tokens: Option<PathBuf>,
}

/// The caller of one call, as far as the gateway knows it.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Caller {
    /// `None`: no identity (allowed only without a policy).
    pub identity: Option<String>,
    /// The bearer token the identity came from: a call forwarded to another instance
    /// carries it on, for that instance to check itself. Never shown.
    token: Option<String>,
}

impl std::fmt::Debug for Caller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Caller")
            .field("identity", &self.identity)
            .field("token", &self.token.as_ref().map(|_| "***"))
            .finish()
    }
}

impl Caller {
    pub fn anonymous() -> Caller {
        Caller::default()
    }

    /// A caller known by `identity` (tests, and callers inside the gateway).
    pub fn named(identity: &str) -> Caller {
        Caller {
            identity: Some(identity.to_string()),
            token: None,
        }
    }

    /// What a call forwarded on this caller's behalf carries: its bearer token when it came
    /// with one (the serving instance checks it), else its identity in [`FORWARDED_FOR`]
    /// (believed there only from a gateway's certificate), else nothing.
    pub fn forwarding_headers(&self) -> Vec<(&'static str, String)> {
        match (&self.token, &self.identity) {
            (Some(token), _) => vec![("authorization", format!("Bearer {token}"))],
            (None, Some(identity)) => vec![(FORWARDED_FOR, identity.clone())],
            (None, None) => Vec::new(),
        }
    }
}

/// Identities and authorization for the gRPC service.
pub struct Auth {
    policy: Option<Reloading<Policy>>,
    tokens: Option<Reloading<Tokens>>,
    tls: Option<Arc<ServerTls>>,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth")
            .field("policy", &self.policy.as_ref().map(|p| &p.path))
            .field("tokens", &self.tokens.as_ref().map(|t| &t.path))
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

impl Auth {
    /// No identities, no policy: everyone may do everything.
    pub fn open() -> Arc<Auth> {
        Arc::new(Auth {
            policy: None,
            tokens: None,
            tls: None,
        })
    }

    /// Loads and checks the files. Fails naming the file, the line or entry, and the rule.
    pub fn load(files: &AuthFiles, tls: Option<Arc<ServerTls>>) -> Result<Auth, String> {
        let policy = files
            .policy
            .clone()
            .map(|p| Reloading::load(p, "policy file", Policy::parse))
            .transpose()?;
        let tokens = files
            .tokens
            .clone()
            .map(|p| Reloading::load(p, "tokens file", Tokens::parse))
            .transpose()?;
        if policy.is_some() && tokens.is_none() && !tls.as_ref().is_some_and(|t| t.mutual()) {
            return Err(
                "a policy file needs identities to apply to: give --auth-tokens-file, or \
                 --tls-client-ca for client certificates, or both"
                    .into(),
            );
        }
        Ok(Auth {
            policy,
            tokens,
            tls,
        })
    }

    /// Whether calls are authorized against a policy.
    pub fn enforcing(&self) -> bool {
        self.policy.is_some()
    }

    /// Re-reads the files every [`RELOAD_INTERVAL`] (run it as a task).
    pub async fn watch(self: Arc<Self>) {
        every_interval(|| {
            if let Some(policy) = &self.policy {
                match policy.reload() {
                    Ok(true) => {
                        tracing::info!(file = %policy.path.display(), grants = policy.get().grants.len(), "policy reloaded")
                    }
                    Ok(false) => {}
                    Err(err) => {
                        tracing::warn!(error = %err, "the policy file changed but does not validate; the previous policy stays in force")
                    }
                }
            }
            if let Some(tokens) = &self.tokens {
                match tokens.reload() {
                    Ok(true) => {
                        tracing::info!(file = %tokens.path.display(), tokens = tokens.get().entries.len(), "bearer tokens reloaded")
                    }
                    Ok(false) => {}
                    Err(err) => {
                        tracing::warn!(error = %err, "the tokens file changed but does not validate; the previous tokens stay in force")
                    }
                }
            }
        })
        .await;
    }

    /// The caller of a call with `metadata`, on a connection that presented `certs`.
    pub fn caller(
        &self,
        metadata: &MetadataMap,
        certs: Option<&[rustls_pki_types::CertificateDer<'static>]>,
    ) -> Result<Caller, LeaseError> {
        let from_cert = certs
            .and_then(|c| c.first())
            .and_then(crate::tls::identity_of);
        if let Some(vouched) = metadata.get(FORWARDED_FOR) {
            let trusted = from_cert.as_deref().is_some_and(|id| self.is_gateway(id));
            if !trusted {
                return Err(LeaseError::ActionDenied(Box::new(Denied {
                    identity: from_cert.unwrap_or_else(|| "(anonymous)".into()),
                    action: "forward",
                    group: None,
                    topic: None,
                    why: Some(format!(
                        "only gateway instances may send {FORWARDED_FOR}; this connection's \
                         identity is not one the policy's `gateways` lists"
                    )),
                })));
            }
            let vouched = vouched.to_str().unwrap_or_default();
            return self.required(
                if vouched.is_empty() {
                    None
                } else {
                    Some(vouched.to_string())
                },
                None,
            );
        }
        if let (Some(tokens), Some(header)) = (&self.tokens, metadata.get("authorization")) {
            let header = header.to_str().unwrap_or_default();
            let token = header
                .strip_prefix("Bearer ")
                .or_else(|| header.strip_prefix("bearer "))
                .ok_or_else(|| {
                    LeaseError::NotAuthenticated(
                        "the authorization header is not `Bearer <token>`".into(),
                    )
                })?;
            let token = token.trim();
            return match tokens.get().identity(token) {
                Some(identity) => Ok(Caller {
                    identity: Some(identity),
                    token: Some(token.to_string()),
                }),
                None => Err(LeaseError::NotAuthenticated(
                    "the bearer token is not one this gateway knows".into(),
                )),
            };
        }
        self.required(from_cert, None)
    }

    fn required(
        &self,
        identity: Option<String>,
        token: Option<String>,
    ) -> Result<Caller, LeaseError> {
        if identity.is_none() && self.enforcing() {
            return Err(LeaseError::NotAuthenticated(
                "this gateway requires an identity: a client certificate (mutual TLS) or a \
                 bearer token (`authorization: Bearer <token>`)"
                    .into(),
            ));
        }
        Ok(Caller { identity, token })
    }

    /// Whether `identity` is another gateway instance: listed in the policy's `gateways`,
    /// or the identity of this instance's own certificate.
    pub fn is_gateway(&self, identity: &str) -> bool {
        let own = self.tls.as_ref().and_then(|t| t.own_identity());
        own.as_deref() == Some(identity)
            || self
                .policy
                .as_ref()
                .is_some_and(|p| p.get().is_gateway(identity))
    }

    /// Checks that the peer service's caller is a gateway instance (when identities exist).
    pub fn check_gateway(
        &self,
        certs: Option<&[rustls_pki_types::CertificateDer<'static>]>,
    ) -> Result<(), LeaseError> {
        if !self.enforcing() && !self.tls.as_ref().is_some_and(|t| t.mutual()) {
            return Ok(());
        }
        let identity = certs
            .and_then(|c| c.first())
            .and_then(crate::tls::identity_of);
        match identity {
            Some(id) if self.is_gateway(&id) => Ok(()),
            other => Err(LeaseError::ActionDenied(Box::new(Denied {
                identity: other.unwrap_or_else(|| "(anonymous)".into()),
                action: "describe",
                group: None,
                topic: None,
                why: Some("the peer service answers gateway instances only".into()),
            }))),
        }
    }

    /// Checks that `caller` may take `action` on `group` and `topic`.
    pub fn check(
        &self,
        caller: &Caller,
        action: Action,
        group: &str,
        topic: &str,
    ) -> Result<(), LeaseError> {
        self.decide(caller, action, group, Some(topic))
    }

    /// Whether `caller` may take `action` on `group` and `topic` (for filtering listings).
    pub fn allows(&self, caller: &Caller, action: Action, group: &str, topic: &str) -> bool {
        self.policy.as_ref().is_none_or(|policy| {
            let identity = caller.identity.as_deref().unwrap_or_default();
            policy.get().allows(identity, action, group, topic)
        })
    }

    /// Checks that `caller` may take `action` on some topic of `group`.
    pub fn check_group(
        &self,
        caller: &Caller,
        action: Action,
        group: &str,
    ) -> Result<(), LeaseError> {
        self.decide(caller, action, group, None)
    }

    /// The policy's verdict on `action` in `group`, on `topic` or (`None`) on some topic.
    fn decide(
        &self,
        caller: &Caller,
        action: Action,
        group: &str,
        topic: Option<&str>,
    ) -> Result<(), LeaseError> {
        let Some(policy) = &self.policy else {
            return Ok(());
        };
        let identity = caller.identity.as_deref().unwrap_or_default();
        let policy = policy.get();
        let allowed = match topic {
            Some(topic) => policy.allows(identity, action, group, topic),
            None => policy.allows_in_group(identity, action, group),
        };
        if allowed {
            return Ok(());
        }
        Err(LeaseError::ActionDenied(Box::new(Denied {
            identity: identity.to_string(),
            action: action.as_str(),
            group: Some(group.to_string()),
            topic: topic.map(str::to_string),
            why: None,
        })))
    }
}

/// A lease's owner check: the identity that acquired it, and the one calling now.
pub fn check_owner(
    owner: Option<&str>,
    caller: &Caller,
    action: Action,
    group: &str,
    topic: &str,
) -> Result<(), LeaseError> {
    match owner {
        Some(owner) if caller.identity.as_deref() != Some(owner) => {
            Err(LeaseError::ActionDenied(Box::new(Denied {
                identity: caller
                    .identity
                    .clone()
                    .unwrap_or_else(|| "(anonymous)".into()),
                action: action.as_str(),
                group: Some(group.to_string()),
                topic: Some(topic.to_string()),
                why: Some(
                    "the lease was acquired by another identity, and a lease id is bound to \
                     the identity that acquired it"
                        .into(),
                ),
            })))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_whole_names_with_star_for_any_run() {
        let p = |s: &str| Pattern(s.to_string());
        assert!(p("orders-*").matches("orders-eu"));
        assert!(p("orders-*").matches("orders-"));
        assert!(!p("orders-*").matches("order"));
        assert!(p("*").matches(""));
        assert!(p("a*b*c").matches("aXXbYYc"));
        assert!(!p("a*b*c").matches("aXXbYY"));
        assert!(p("exact").matches("exact"));
        assert!(!p("exact").matches("exact2"));
        assert!(p("*-dlq").matches("orders-dlq"));
    }

    const POLICY: &str = r#"
        [[allow]]
        identities = ["orders-*"]
        groups = ["orders"]
        topics = ["orders", "orders.*"]
        actions = ["acquire", "read", "commit", "release"]

        [[allow]]
        identities = ["ops"]
        groups = ["*"]
        topics = ["*"]
        actions = ["list"]

        [gateways]
        identities = ["gateway"]
    "#;

    #[test]
    fn a_policy_grants_exactly_what_it_lists() {
        let policy = Policy::parse(POLICY).expect("valid");
        assert!(policy.allows("orders-eu", Action::Acquire, "orders", "orders.v2"));
        assert!(!policy.allows("orders-eu", Action::Seek, "orders", "orders"));
        assert!(!policy.allows("orders-eu", Action::Acquire, "billing", "orders"));
        assert!(!policy.allows("orders-eu", Action::Acquire, "orders", "billing"));
        assert!(policy.allows("ops", Action::List, "billing", "x"));
        assert!(!policy.allows("ops", Action::Read, "billing", "x"));
        assert!(!policy.allows("nobody", Action::List, "orders", "orders"));
        assert!(policy.is_gateway("gateway"));
        assert!(!policy.is_gateway("orders-eu"));
    }

    #[test]
    fn a_bad_policy_names_the_entry_and_what_is_allowed() {
        let err = Policy::parse(
            r#"[[allow]]
            identities = ["a"]
            groups = ["g"]
            topics = ["t"]
            actions = ["acquire", "delete"]"#,
        )
        .unwrap_err();
        assert!(
            err.contains("allow[0].actions")
                && err.contains("\"delete\"")
                && err.contains("subscribe"),
            "{err}"
        );
        let err = Policy::parse(
            "[[allow]]\nidentities = []\ngroups=[\"g\"]\ntopics=[\"t\"]\nactions=[\"*\"]",
        )
        .unwrap_err();
        assert!(err.contains("allow[0].identities is empty"), "{err}");
        let err = Policy::parse("[[allow]]\nidentities = [\"a\"]\ngroups=[\"g\"]\ntopics=[\"t\"]\nactions=[\"*\"]\ncolour=1").unwrap_err();
        assert!(err.contains("colour"), "{err}");
        assert!(Policy::parse("not toml [").is_err());
    }

    #[test]
    fn tokens_map_to_identities_and_errors_never_show_a_token() {
        let tokens = Tokens::parse(
            "# comment\norders-eu  0123456789abcdef0123\n\nops fedcba9876543210fedc\n",
        )
        .expect("valid");
        assert_eq!(
            tokens.identity("0123456789abcdef0123").as_deref(),
            Some("orders-eu")
        );
        assert_eq!(
            tokens.identity("fedcba9876543210fedc").as_deref(),
            Some("ops")
        );
        assert_eq!(tokens.identity("0123456789abcdef012"), None);
        assert_eq!(tokens.identity(""), None);
        let err = Tokens::parse("a short-secret-x").unwrap_err();
        assert!(
            err.contains("line 1") && !err.contains("short-secret-x"),
            "{err}"
        );
        let err = Tokens::parse("a 0123456789abcdef0123\nb 0123456789abcdef0123").unwrap_err();
        assert!(
            err.contains("line 2") && !err.contains("0123456789abcdef0123"),
            "{err}"
        );
        let err = Tokens::parse("a b c").unwrap_err();
        assert!(err.contains("two words"), "{err}");
        assert!(!format!("{tokens:?}").contains("0123"));
    }

    #[test]
    fn a_lease_answers_only_the_identity_that_acquired_it() {
        let alice = Caller::named("alice");
        let bob = Caller::named("bob");
        assert!(check_owner(Some("alice"), &alice, Action::Commit, "g", "t").is_ok());
        let err = check_owner(Some("alice"), &bob, Action::Commit, "g", "t").unwrap_err();
        assert!(err.to_string().contains("another identity"), "{err}");
        assert!(check_owner(Some("alice"), &Caller::anonymous(), Action::Read, "g", "t").is_err());
        assert!(check_owner(None, &bob, Action::Read, "g", "t").is_ok());
    }
}
