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

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tonic::metadata::MetadataMap;

use crate::error::{Denied, LeaseError};
use crate::reload::{digest, every_interval, Swapped};
use crate::tls::ServerTls;

mod policy;
mod tokens;

pub use policy::{Action, Policy, PolicyError};
pub use tokens::{Tokens, TokensError, MIN_TOKEN_LEN};

/// How often the policy and token files are checked for changes.
pub use crate::reload::RELOAD_INTERVAL;

/// The header with which a gateway instance names the caller of a call it forwards. Only
/// believed from another gateway (an identity the policy's `gateways` lists, or this
/// instance's own certificate identity).
pub const FORWARDED_FOR: &str = "kafka-lease-forwarded-for";

/// Why the policy or the tokens file was not loaded (at startup), or not reloaded (the
/// previous version stays in force): each names the file and the reason.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AuthFilesError {
    /// The file cannot be read.
    #[error("cannot read the {what} {}: {source}", .path.display())]
    Read {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file is not UTF-8.
    #[error("the {what} {} is not UTF-8", .path.display())]
    NotUtf8 {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::str::Utf8Error,
    },
    /// The file's text breaks a rule of its format.
    #[error("the {what} {}: {source}", .path.display())]
    Invalid {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: Box<FileContentError>,
    },
    /// A policy file with no way for callers to have an identity.
    #[error(
        "a policy file needs identities to apply to: give --auth-tokens-file, or \
         --tls-client-ca for client certificates, or both"
    )]
    PolicyWithoutIdentities,
}

/// What is wrong in the text of the policy or the tokens file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FileContentError {
    #[error(transparent)]
    Policy(#[from] PolicyError),
    #[error(transparent)]
    Tokens(#[from] TokensError),
}

/// A file read again when it changes, parsed by `parse`, the last good version kept.
struct Reloading<T> {
    path: PathBuf,
    what: &'static str,
    parse: fn(&str) -> Result<T, FileContentError>,
    value: Swapped<T>,
}

impl<T> Reloading<T> {
    fn load(
        path: PathBuf,
        what: &'static str,
        parse: fn(&str) -> Result<T, FileContentError>,
    ) -> Result<Self, AuthFilesError> {
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
    fn reload(&self) -> Result<bool, AuthFilesError> {
        let bytes = read_file(&self.path, self.what)?;
        self.value.offer(digest([bytes.as_slice()]), || {
            parse_file(&self.path, self.what, self.parse, &bytes)
        })
    }
}

fn read_file(path: &Path, what: &'static str) -> Result<Vec<u8>, AuthFilesError> {
    std::fs::read(path).map_err(|source| AuthFilesError::Read {
        what,
        path: path.to_path_buf(),
        source,
    })
}

fn parse_file<T>(
    path: &Path,
    what: &'static str,
    parse: fn(&str) -> Result<T, FileContentError>,
    bytes: &[u8],
) -> Result<T, AuthFilesError> {
    let text = std::str::from_utf8(bytes).map_err(|source| AuthFilesError::NotUtf8 {
        what,
        path: path.to_path_buf(),
        source,
    })?;
    parse(text).map_err(|source| AuthFilesError::Invalid {
        what,
        path: path.to_path_buf(),
        source: Box::new(source),
    })
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
    pub fn load(files: &AuthFiles, tls: Option<Arc<ServerTls>>) -> Result<Auth, AuthFilesError> {
        let policy = files
            .policy
            .clone()
            .map(|p| {
                Reloading::load(p, "policy file", |text| {
                    Policy::parse(text).map_err(FileContentError::from)
                })
            })
            .transpose()?;
        let tokens = files
            .tokens
            .clone()
            .map(|p| {
                Reloading::load(p, "tokens file", |text| {
                    Tokens::parse(text).map_err(FileContentError::from)
                })
            })
            .transpose()?;
        if policy.is_some() && tokens.is_none() && !tls.as_ref().is_some_and(|t| t.mutual()) {
            return Err(AuthFilesError::PolicyWithoutIdentities);
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
                        tracing::info!(
                            file = %policy.path.display(),
                            grants = policy.get().grant_count(),
                            "policy reloaded",
                        )
                    }
                    Ok(false) => {}
                    Err(err) => {
                        tracing::warn!(
                            error = %err,
                            "the policy file changed but does not validate; the previous policy \
                            stays in force",
                        )
                    }
                }
            }
            if let Some(tokens) = &self.tokens {
                match tokens.reload() {
                    Ok(true) => {
                        tracing::info!(
                            file = %tokens.path.display(),
                            tokens = tokens.get().count(),
                            "bearer tokens reloaded",
                        )
                    }
                    Ok(false) => {}
                    Err(err) => {
                        tracing::warn!(
                            error = %err,
                            "the tokens file changed but does not validate; the previous tokens \
                            stay in force",
                        )
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
    fn a_lease_answers_only_the_identity_that_acquired_it() {
        let alice = Caller::named("alice");
        let bob = Caller::named("bob");
        assert!(check_owner(Some("alice"), &alice, Action::Commit, "g", "t").is_ok());
        let err = check_owner(Some("alice"), &bob, Action::Commit, "g", "t").unwrap_err();
        assert!(err.to_string().contains("another identity"), "{err}");
        assert!(check_owner(Some("alice"), &Caller::anonymous(), Action::Read, "g", "t").is_err());
        assert!(check_owner(None, &bob, Action::Read, "g", "t").is_ok());
    }

    /// A file under the temporary directory with `bytes`, removed when dropped.
    struct TempFile(PathBuf);

    impl TempFile {
        fn new(bytes: &[u8]) -> TempFile {
            let path = std::env::temp_dir()
                .join(format!("kafka-lease-auth-{:016x}", rand::random::<u64>()));
            std::fs::write(&path, bytes).expect("write a temporary file");
            TempFile(path)
        }
    }

    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    #[test]
    fn a_file_that_does_not_load_is_named_with_the_reason() {
        let load = |policy: Option<&Path>, tokens: Option<&Path>| {
            let files = AuthFiles {
                policy: policy.map(Path::to_path_buf),
                tokens: tokens.map(Path::to_path_buf),
            };
            Auth::load(&files, None).map(|_| ()).unwrap_err()
        };
        let missing = std::env::temp_dir().join("kafka-lease-auth-no-such-file");
        let err = load(Some(&missing), None);
        let io = std::fs::read(&missing).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("cannot read the policy file {}: {io}", missing.display())
        );
        assert!(std::error::Error::source(&err).is_some());

        let binary = TempFile::new(b"\xff\xfe");
        let err = load(None, Some(&binary.0));
        assert_eq!(
            err.to_string(),
            format!("the tokens file {} is not UTF-8", binary.0.display())
        );

        let tokens = TempFile::new(b"a b c");
        let err = load(None, Some(&tokens.0));
        assert_eq!(
            err.to_string(),
            format!(
                "the tokens file {}: line 1: expected `<identity> <token>` (two words)",
                tokens.0.display()
            )
        );

        let policy = TempFile::new(
            b"[[allow]]\nidentities = [\"a\"]\ngroups = [\"g\"]\ntopics = [\"t\"]\nactions = []",
        );
        let err = load(Some(&policy.0), None);
        assert_eq!(
            err.to_string(),
            format!(
                "the policy file {}: allow[0].actions is empty",
                policy.0.display()
            )
        );

        let policy = TempFile::new(
            b"[[allow]]\nidentities = [\"a\"]\ngroups = [\"g\"]\ntopics = [\"t\"]\n\
              actions = [\"*\"]",
        );
        let err = load(Some(&policy.0), None);
        assert_eq!(
            err.to_string(),
            "a policy file needs identities to apply to: give --auth-tokens-file, or \
             --tls-client-ca for client certificates, or both"
        );
    }
}
