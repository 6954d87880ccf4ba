//! Bearer tokens for the admin API: read-write and read-only, each with a name that the
//! history records (never the secret). Compared in constant time.

use subtle::ConstantTimeEq;

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Read rules and history.
    Read,
    /// Read and change rules.
    Write,
}

#[derive(Debug, Clone)]
struct Token {
    name: String,
    secret: Vec<u8>,
    access: Access,
}

/// The configured tokens.
#[derive(Debug, Clone, Default)]
pub struct Tokens {
    tokens: Vec<Token>,
}

impl Tokens {
    /// Tokens written `name:secret` (or just `secret`, named by position).
    pub fn new(write: &[String], read: &[String]) -> Self {
        let parse = |(i, text): (usize, &String), access, prefix: &str| {
            let (name, secret) = match text.split_once(':') {
                Some((name, secret)) if !name.is_empty() => (name.to_owned(), secret),
                _ => (format!("{prefix}-{}", i + 1), text.as_str()),
            };
            Token {
                name,
                secret: secret.as_bytes().to_vec(),
                access,
            }
        };
        let tokens = write
            .iter()
            .enumerate()
            .map(|t| parse(t, Access::Write, "write-token"))
            .chain(
                read.iter()
                    .enumerate()
                    .map(|t| parse(t, Access::Read, "read-token")),
            )
            .filter(|t| !t.secret.is_empty())
            .collect();
        Self { tokens }
    }

    /// Whether any token is configured (without one the admin API listens on loopback only).
    pub fn any(&self) -> bool {
        !self.tokens.is_empty()
    }

    /// The name and access of the token in an `Authorization` header value.
    pub fn check(&self, authorization: Option<&str>) -> Option<(String, Access)> {
        let presented = authorization?.strip_prefix("Bearer ")?.trim().as_bytes();
        let mut found = None;
        for t in &self.tokens {
            // Every token is compared, so timing does not tell which one nearly matched.
            if t.secret.len() == presented.len() && bool::from(t.secret.as_slice().ct_eq(presented))
            {
                found = Some((t.name.clone(), t.access));
            }
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_named_and_scoped() {
        let tokens = Tokens::new(
            &["alice:s3cret".into(), "plain".into()],
            &["dash:r3ad".into()],
        );
        assert_eq!(
            tokens.check(Some("Bearer s3cret")),
            Some(("alice".into(), Access::Write))
        );
        assert_eq!(
            tokens.check(Some("Bearer plain")),
            Some(("write-token-2".into(), Access::Write))
        );
        assert_eq!(
            tokens.check(Some("Bearer r3ad")),
            Some(("dash".into(), Access::Read))
        );
        assert_eq!(tokens.check(Some("Bearer nope")), None);
        assert_eq!(tokens.check(Some("Basic s3cret")), None);
        assert_eq!(tokens.check(None), None);
        assert!(!Tokens::new(&[], &[]).any());
    }
}
