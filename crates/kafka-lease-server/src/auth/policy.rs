//! The policy: the actions a caller can be allowed, the name patterns grants match with,
//! and the policy file (TOML) parsed and checked into a [`Policy`].

use std::collections::HashSet;

use serde::Deserialize;

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
    /// Writing a queue's dead letters: checked against the group and the dead letter topic
    /// when a Deliver opens queue mode.
    DeadLetter,
}

impl Action {
    pub const ALL: [Action; 8] = [
        Action::Acquire,
        Action::Read,
        Action::Seek,
        Action::Commit,
        Action::Release,
        Action::Subscribe,
        Action::List,
        Action::DeadLetter,
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
            Action::DeadLetter => "dead_letter",
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

/// What is wrong with a policy file: not the TOML of a policy, or an entry (named by its
/// place in the file) that breaks a rule.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// Not TOML, or not a policy's fields (one unknown, one missing, a wrong type).
    #[error(transparent)]
    Toml(#[from] toml::de::Error),
    /// `allow[grant].list` names nothing.
    #[error("allow[{grant}].{list} is empty; list at least one name or pattern (\"*\" for any)")]
    EmptyList { grant: usize, list: &'static str },
    /// `allow[grant].list` has a pattern that is empty, too long or not printable.
    #[error(
        "allow[{grant}].{list} has {pattern:?}: a pattern is 1..=512 printable characters, `*` \
         matching any run"
    )]
    BadPattern {
        grant: usize,
        list: &'static str,
        pattern: String,
    },
    /// `allow[grant].actions` names nothing.
    #[error("allow[{grant}].actions is empty")]
    NoActions { grant: usize },
    /// `allow[grant].actions` names an action there is none of.
    #[error(
        "allow[{grant}].actions has {action:?}; allowed: {allowed}, or \"*\" for all",
        allowed = Action::ALL.map(Action::as_str).join(", ")
    )]
    UnknownAction { grant: usize, action: String },
    /// `gateways.identities` has an entry that is empty or not printable.
    #[error("gateways.identities has {identity:?}: not a name")]
    BadGatewayIdentity { identity: String },
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
    pub fn parse(text: &str) -> Result<Policy, PolicyError> {
        let file: PolicyFile = toml::from_str(text)?;
        let patterns = |list: &'static str,
                        i: usize,
                        names: Vec<String>|
         -> Result<Vec<Pattern>, PolicyError> {
            if names.is_empty() {
                return Err(PolicyError::EmptyList { grant: i, list });
            }
            names
                .into_iter()
                .map(|p| {
                    if p.is_empty() || p.len() > 512 || p.chars().any(char::is_control) {
                        Err(PolicyError::BadPattern {
                            grant: i,
                            list,
                            pattern: p,
                        })
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
                return Err(PolicyError::NoActions { grant: i });
            }
            for name in &grant.actions {
                let parsed = Action::parse(name).ok_or_else(|| PolicyError::UnknownAction {
                    grant: i,
                    action: name.clone(),
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
                        Err(PolicyError::BadGatewayIdentity { identity: p })
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
    pub(super) fn allows_in_group(&self, identity: &str, action: Action, group: &str) -> bool {
        self.grants.iter().any(|g| {
            g.actions.contains(&action)
                && g.identities.iter().any(|p| p.matches(identity))
                && g.groups.iter().any(|p| p.matches(group))
        })
    }

    pub(super) fn is_gateway(&self, identity: &str) -> bool {
        self.gateways.iter().any(|p| p.matches(identity))
    }

    /// How many `allow` entries the policy has (for the log of a reload).
    pub(super) fn grant_count(&self) -> usize {
        self.grants.len()
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
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("allow[0].actions")
                && err.contains("\"delete\"")
                && err.contains("subscribe"),
            "{err}"
        );
        let err = Policy::parse(
            "[[allow]]\nidentities = []\ngroups=[\"g\"]\ntopics=[\"t\"]\nactions=[\"*\"]",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("allow[0].identities is empty"), "{err}");
        let err = Policy::parse(
            "[[allow]]\nidentities = [\"a\"]\ngroups=[\"g\"]\ntopics=[\"t\"]\n\
             actions=[\"*\"]\ncolour=1",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("colour"), "{err}");
        assert!(Policy::parse("not toml [").is_err());
    }

    #[test]
    fn each_rule_of_a_policy_is_told_in_its_own_words() {
        let allow = |identities: &str, groups: &str, actions: &str| {
            let text = format!(
                "[[allow]]\nidentities = {identities}\ngroups = {groups}\ntopics = [\"t\"]\n\
                 actions = {actions}"
            );
            Policy::parse(&text).unwrap_err().to_string()
        };
        assert_eq!(
            allow("[]", r#"["g"]"#, r#"["*"]"#),
            r#"allow[0].identities is empty; list at least one name or pattern ("*" for any)"#
        );
        assert_eq!(
            allow(r#"["a"]"#, r#"[""]"#, r#"["*"]"#),
            concat!(
                r#"allow[0].groups has "": a pattern is 1..=512 printable characters, "#,
                "`*` matching any run"
            )
        );
        assert_eq!(
            allow(r#"["a"]"#, r#"["g"]"#, "[]"),
            "allow[0].actions is empty"
        );
        assert_eq!(
            allow(r#"["a"]"#, r#"["g"]"#, r#"["delete"]"#),
            concat!(
                r#"allow[0].actions has "delete"; allowed: acquire, read, seek, commit, "#,
                r#"release, subscribe, list, dead_letter, or "*" for all"#
            )
        );
        assert_eq!(
            Policy::parse("[gateways]\nidentities = [\"\"]")
                .unwrap_err()
                .to_string(),
            r#"gateways.identities has "": not a name"#
        );
        let toml_error = toml::from_str::<toml::Table>("not toml [").unwrap_err();
        assert_eq!(
            Policy::parse("not toml [").unwrap_err().to_string(),
            toml_error.to_string()
        );
    }
}
