//! A bucket's identity, bounded in bytes whatever a client sends.
//!
//! An identity is built from descriptor values (an API key, an address, a path), and those come
//! from a client's request. A value of any length is matched against the rules as sent, but an
//! identity longer than [`MAX_LITERAL_IDENTITY_BYTES`] is kept as its digest
//! ([`bounded`]): the request still counts against its own limit (the same long value is the
//! same counter on every node and in both regions), the node's and the store's state per key
//! stays small, and no request is refused for being long (a refusal is an RPC error, which
//! Envoy's default `failure_mode_deny: false` turns into an uncounted allow).
//!
//! Why no two identities can share a counter by accident or on purpose:
//! - A digest identity starts with the byte `0xFF`, which no literal identity holds: every
//!   literal one is made of UTF-8 text (descriptor keys and values are text), where `0xFF`
//!   never occurs. A client cannot name a digest identity by sending its text.
//! - Two long identities share a counter only if their SHA-256 digests are equal: finding such
//!   a pair takes about 2^128 tries, and finding one that collides with a given identity (a
//!   victim's) about 2^256. A secret key would add nothing to this (it matters for a fast,
//!   non-cryptographic hash, whose collisions can be computed), and would have to be the same
//!   on every node and region for the counts to meet.

use std::borrow::Cow;

use sha2::{Digest, Sha256};

/// The longest identity kept as it is, in bytes; a longer one is kept as its digest.
pub const MAX_LITERAL_IDENTITY_BYTES: usize = 512;

/// The first byte of a digest identity: never in UTF-8 text, so never in a literal identity.
const DIGEST_MARK: u8 = 0xFF;

/// What a digest identity says after its mark (and shows as).
const DIGEST_PREFIX: &str = "sha256:";

/// Separates the digest of an identity from any other use of SHA-256 on the same bytes.
const DIGEST_DOMAIN: &[u8] = b"tollgate identity v1\0";

/// `identity` if it is at most [`MAX_LITERAL_IDENTITY_BYTES`] long, else its digest: the mark
/// `0xFF`, `sha256:` and 64 hex digits (72 bytes).
pub fn bounded(identity: Vec<u8>) -> Vec<u8> {
    if identity.len() <= MAX_LITERAL_IDENTITY_BYTES {
        return identity;
    }
    let digest = Sha256::new()
        .chain_update(DIGEST_DOMAIN)
        .chain_update(&identity)
        .finalize();
    let mut out = Vec::with_capacity(1 + DIGEST_PREFIX.len() + 64);
    out.push(DIGEST_MARK);
    out.extend_from_slice(DIGEST_PREFIX.as_bytes());
    for b in digest {
        out.extend_from_slice(format!("{b:02x}").as_bytes());
    }
    out
}

/// Whether `identity` is a digest ([`bounded`] reduced it).
pub fn is_digest(identity: &[u8]) -> bool {
    identity.first() == Some(&DIGEST_MARK)
}

/// `identity` as text for people: a digest as `sha256:<hex>`, anything else as UTF-8 (a byte
/// that is not is shown as U+FFFD).
pub fn shown(identity: &[u8]) -> Cow<'_, str> {
    match identity.split_first() {
        Some((&DIGEST_MARK, rest)) => String::from_utf8_lossy(rest),
        _ => String::from_utf8_lossy(identity),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_identity_is_kept_and_a_long_one_becomes_its_digest() {
        let short = vec![b'k'; MAX_LITERAL_IDENTITY_BYTES];
        assert_eq!(bounded(short.clone()), short);
        let long = vec![b'k'; MAX_LITERAL_IDENTITY_BYTES + 1];
        let digest = bounded(long.clone());
        assert!(is_digest(&digest));
        assert_eq!(digest.len(), 72);
        assert_eq!(bounded(long), digest, "the same value is the same counter");
        let other = bounded(vec![b'j'; MAX_LITERAL_IDENTITY_BYTES + 1]);
        assert_ne!(other, digest, "another value is another counter");
        assert!(shown(&digest).starts_with("sha256:"));
        assert!(!is_digest(&short));
    }

    #[test]
    fn no_literal_identity_can_name_a_digest() {
        let digest = bounded(vec![b'x'; 3000]);
        // The digest's own text, sent as a value, is a literal identity: another counter.
        let text = shown(&digest).into_owned();
        assert_ne!(bounded(text.clone().into_bytes()), digest);
        assert_ne!(
            bounded(format!("\u{FFFD}{text}").into_bytes()),
            digest,
            "nor with the mark's lossy character in front"
        );
    }
}
