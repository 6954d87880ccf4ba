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

/// The shortest secret a token takes (as the region link's secret): a token is all that
/// stands between a network and every rule.
pub const MIN_SECRET: usize = 16;

/// Whether `name` can name a token (`name:secret`): letters, digits, `_`, `.` and `-`. Text
/// before a `:` that is not one (`Xk9#2:pQ`) is part of the secret, not a name.
fn is_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

impl Tokens {
    /// Tokens written `name:secret` (or just `secret`, named by position; the text before the
    /// first `:` names the token only when it is a name, [`is_name`]). Every secret must be
    /// at least [`MIN_SECRET`] characters: a secret pasted with a `,` in it, which the
    /// command line and the environment split at, ends up as pieces too short to pass, and is
    /// refused rather than read as several weak tokens. An empty secret is refused too (an
    /// empty `--admin-tokens ""` must never read as "no authentication"). Errors name the
    /// setting and the position, never the secret.
    pub fn parse(write: &[String], read: &[String]) -> Result<Self, String> {
        let parse = |(i, text): (usize, &String), access, setting: &str, prefix: &str| {
            let (name, secret) = match text.split_once(':') {
                Some((name, secret)) if is_name(name) => (name.to_owned(), secret),
                _ => (format!("{prefix}-{}", i + 1), text.as_str()),
            };
            if secret.is_empty() {
                return Err(format!(
                    "{setting}[{i}] ({name:?}) has an empty secret; give every token a secret, \
                     or none at all (the admin API then listens on loopback only)"
                ));
            }
            let length = secret.chars().count();
            if length < MIN_SECRET {
                return Err(format!(
                    "{setting}[{i}] ({name:?}) has a secret of {length} characters; a token \
                     needs at least {MIN_SECRET}. A list is split at ',' (flags and \
                     environment): a secret that contains one can be given whole only as \
                     an item of admin_tokens in --config's YAML"
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
        let presented = presented(authorization)?;
        let mut found = None;
        for t in &self.tokens {
            // Every token is compared, so timing does not tell which one nearly matched.
            if same_secret(presented, &t.secret) {
                found = Some((t.name.clone(), t.access));
            }
        }
        found
    }
}

/// The token an `Authorization` header value presents (`Bearer <token>`, the scheme in any
/// case: RFC 9110 §11.1); None for another scheme, no header, or an empty token. Every bearer
/// token Tollgate takes (the admin API's, `--json-check-token`, `--top-denied-token`) is read
/// here.
pub fn presented(authorization: Option<&str>) -> Option<&[u8]> {
    let (scheme, token) = authorization?.trim().split_once(' ')?;
    let token = token.trim().as_bytes();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Whether `presented` is `secret`, compared in a time that does not tell where they differ.
pub fn same_secret(presented: &[u8], secret: &[u8]) -> bool {
    presented.len() == secret.len() && bool::from(presented.ct_eq(secret))
}

/// Whether `authorization` presents `secret` as a bearer token.
pub fn presents(authorization: Option<&str>, secret: &str) -> bool {
    presented(authorization).is_some_and(|p| same_secret(p, secret.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_named_and_scoped() {
        let tokens = Tokens::parse(
            &[
                "alice:s3cret-s3cret-s3cret".into(),
                "plain-secret-of-length".into(),
            ],
            &["dash:r3ad-r3ad-r3ad-r3ad".into()],
        )
        .expect("tokens");
        assert_eq!(
            tokens.check(Some("Bearer s3cret-s3cret-s3cret")),
            Some(("alice".into(), Access::Write))
        );
        assert_eq!(
            tokens.check(Some("Bearer plain-secret-of-length")),
            Some(("write-token-2".into(), Access::Write))
        );
        assert_eq!(
            tokens.check(Some("Bearer r3ad-r3ad-r3ad-r3ad")),
            Some(("dash".into(), Access::Read))
        );
        assert_eq!(tokens.check(Some("Bearer nope")), None);
        assert_eq!(tokens.check(Some("Basic s3cret-s3cret-s3cret")), None);
        assert_eq!(tokens.check(Some("Bearer ")), None);
        assert_eq!(tokens.check(None), None);
        assert!(!Tokens::parse(&[], &[]).expect("none").any());
    }

    #[test]
    fn the_bearer_scheme_is_case_insensitive() {
        let tokens = Tokens::parse(&["alice:s3cret-s3cret-s3cret".into()], &[]).expect("tokens");
        for header in [
            "bearer s3cret-s3cret-s3cret",
            "BEARER s3cret-s3cret-s3cret",
            "BeArEr  s3cret-s3cret-s3cret",
        ] {
            assert!(tokens.check(Some(header)).is_some(), "{header}");
        }
    }

    #[test]
    fn an_empty_secret_is_refused_not_ignored() {
        for (write, read) in [
            (vec![String::new()], vec![]),
            (vec!["admin:".into()], vec![]),
            (vec!["ok:a-secret-long-enough".into()], vec![String::new()]),
        ] {
            let err = Tokens::parse(&write, &read).expect_err("empty secret");
            assert!(err.contains("empty secret"), "{err}");
        }
    }

    #[test]
    fn a_pasted_secret_is_taken_whole_or_refused_never_read_as_weak_tokens() {
        // As `--admin-tokens 'Xk9#2:pQ,z'` reaches the parser: split at the comma. Neither
        // piece names a token ('#' is no name's), and both are far too short.
        let err = Tokens::parse(&["Xk9#2:pQ".into(), "z".into()], &[]).expect_err("refused");
        assert!(
            err.contains("admin_tokens[0]") && err.contains("8 characters"),
            "{err}"
        );
        assert!(!err.contains("pQ"), "the error never shows a secret: {err}");
        // Whole, it is one token of its own, the '#' and ':' part of its secret.
        let whole = Tokens::parse(&["Xk9#2:pQ,z-and-then-some".into()], &[]).expect("one token");
        assert_eq!(
            whole.check(Some("Bearer Xk9#2:pQ,z-and-then-some")),
            Some(("write-token-1".into(), Access::Write))
        );
        assert_eq!(whole.check(Some("Bearer pQ,z-and-then-some")), None);
        // A name is still a name.
        let named = Tokens::parse(&["ops:0123456789abcdef".into()], &[]).expect("named");
        assert_eq!(
            named.check(Some("Bearer 0123456789abcdef")),
            Some(("ops".into(), Access::Write))
        );
        let short = Tokens::parse(&["ops:0123456789abcde".into()], &[]).expect_err("15");
        assert!(short.contains("at least 16"), "{short}");
    }

    #[test]
    fn one_token_is_presented_as_a_bearer_token_or_not_at_all() {
        let secret = "0123456789abcdef";
        assert!(presents(Some("Bearer 0123456789abcdef"), secret));
        assert!(presents(Some("  bEaReR   0123456789abcdef "), secret));
        assert!(!presents(Some("Basic 0123456789abcdef"), secret));
        assert!(!presents(Some("Bearer 0123456789abcdeF"), secret));
        assert!(!presents(Some("Bearer 0123456789abcde"), secret));
        assert!(!presents(Some("Bearer"), secret));
        assert!(!presents(Some(""), ""), "an empty token is never one");
        assert!(!presents(Some("Bearer "), ""));
        assert!(!presents(None, secret));
    }
}
