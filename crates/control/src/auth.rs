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
    /// Tokens written `name:secret` (or just `secret`, named by position). An empty secret is
    /// refused (an empty `--admin-tokens ""` must never read as "no authentication"); the
    /// error names the setting and the position.
    pub fn parse(write: &[String], read: &[String]) -> Result<Self, String> {
        let parse = |(i, text): (usize, &String), access, setting: &str, prefix: &str| {
            let (name, secret) = match text.split_once(':') {
                Some((name, secret)) if !name.is_empty() => (name.to_owned(), secret),
                _ => (format!("{prefix}-{}", i + 1), text.as_str()),
            };
            if secret.is_empty() {
                return Err(format!(
                    "{setting}[{i}] ({name:?}) has an empty secret; give every token a secret, \
                     or none at all (the admin API then listens on loopback only)"
                ));
            }
            Ok(Token {
                name,
                secret: secret.as_bytes().to_vec(),
                access,
            })
        };
        let tokens = write
            .iter()
            .enumerate()
            .map(|t| parse(t, Access::Write, "admin_tokens", "write-token"))
            .chain(
                read.iter()
                    .enumerate()
                    .map(|t| parse(t, Access::Read, "admin_read_tokens", "read-token")),
            )
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { tokens })
    }

    /// Whether any token is configured (without one the admin API listens on loopback only).
    pub fn any(&self) -> bool {
        !self.tokens.is_empty()
    }

    /// The name and access of the token in an `Authorization` header value (`Bearer <token>`,
    /// the scheme in any case: RFC 9110 §11.1).
    pub fn check(&self, authorization: Option<&str>) -> Option<(String, Access)> {
        let (scheme, presented) = authorization?.trim().split_once(' ')?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return None;
        }
        let presented = presented.trim().as_bytes();
        if presented.is_empty() {
            return None;
        }
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
        let tokens = Tokens::parse(
            &["alice:s3cret".into(), "plain".into()],
            &["dash:r3ad".into()],
        )
        .expect("tokens");
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
        assert_eq!(tokens.check(Some("Bearer ")), None);
        assert_eq!(tokens.check(None), None);
        assert!(!Tokens::parse(&[], &[]).expect("none").any());
    }

    #[test]
    fn the_bearer_scheme_is_case_insensitive() {
        let tokens = Tokens::parse(&["alice:s3cret".into()], &[]).expect("tokens");
        for header in ["bearer s3cret", "BEARER s3cret", "BeArEr  s3cret"] {
            assert!(tokens.check(Some(header)).is_some(), "{header}");
        }
    }

    #[test]
    fn an_empty_secret_is_refused_not_ignored() {
        for (write, read) in [
            (vec![String::new()], vec![]),
            (vec!["admin:".into()], vec![]),
            (vec!["ok:secret".into()], vec![String::new()]),
        ] {
            let err = Tokens::parse(&write, &read).expect_err("empty secret");
            assert!(err.contains("empty secret"), "{err}");
        }
    }
}
