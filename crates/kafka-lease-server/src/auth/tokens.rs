//! The bearer tokens file: `<identity> <token>` per line, parsed into [`Tokens`], which
//! tells the identity a token belongs to without leaking a token's bytes through timing.

use std::collections::HashSet;

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The shortest bearer token accepted in the tokens file.
pub const MIN_TOKEN_LEN: usize = 16;

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

/// What is wrong with a tokens file: the line (counted from 1) and the rule, never the
/// token.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokensError {
    /// A line that is not two words.
    #[error("line {line}: expected `<identity> <token>` (two words)")]
    NotTwoWords { line: usize },
    /// A token shorter than [`MIN_TOKEN_LEN`].
    #[error("line {line}: the token for {identity:?} is shorter than {MIN_TOKEN_LEN} characters")]
    TooShort { line: usize, identity: String },
    /// A token an earlier line gave already.
    #[error("line {line}: the token for {identity:?} is also given to another identity")]
    Reused { line: usize, identity: String },
}

impl Tokens {
    /// Parses a tokens file. Errors name the line, never the token.
    pub fn parse(text: &str) -> Result<Tokens, TokensError> {
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
                return Err(TokensError::NotTwoWords { line: n + 1 });
            };
            if token.len() < MIN_TOKEN_LEN {
                return Err(TokensError::TooShort {
                    line: n + 1,
                    identity: identity.to_string(),
                });
            }
            let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
            if !seen.insert(digest) {
                return Err(TokensError::Reused {
                    line: n + 1,
                    identity: identity.to_string(),
                });
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

    /// How many tokens the file gives (for the log of a reload).
    pub(super) fn count(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let err = Tokens::parse("a short-secret-x").unwrap_err().to_string();
        assert!(
            err.contains("line 1") && !err.contains("short-secret-x"),
            "{err}"
        );
        let err = Tokens::parse("a 0123456789abcdef0123\nb 0123456789abcdef0123")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("line 2") && !err.contains("0123456789abcdef0123"),
            "{err}"
        );
        let err = Tokens::parse("a b c").unwrap_err().to_string();
        assert!(err.contains("two words"), "{err}");
        assert!(!format!("{tokens:?}").contains("0123"));
    }

    #[test]
    fn each_rule_of_a_tokens_file_is_told_in_its_own_words() {
        let err = |text: &str| Tokens::parse(text).unwrap_err().to_string();
        assert_eq!(
            err("a b c"),
            "line 1: expected `<identity> <token>` (two words)"
        );
        assert_eq!(
            err("# comment\na short"),
            r#"line 2: the token for "a" is shorter than 16 characters"#
        );
        assert_eq!(
            err("a 0123456789abcdef\nb 0123456789abcdef"),
            r#"line 2: the token for "b" is also given to another identity"#
        );
    }
}
