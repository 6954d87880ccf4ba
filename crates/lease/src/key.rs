//! Redis key names for buckets: `rl:{<identity>}:<rule>`.
//!
//! Every rule of one identity shares the hash tag `{<identity>}`, so all of an identity's
//! buckets sit in one Redis Cluster slot and one script can check them together.
//!
//! Identities are user input (API keys, IPs, header values), so they are escaped: every byte
//! outside `[A-Za-z0-9._~-]` becomes `%XX`, which keeps `{`, `}` and `:` out of the tag and makes
//! the encoding injective. The empty identity is written as a lone `%`, which no other identity
//! can produce (every other `%` is followed by two hex digits), and which keeps the tag non-empty:
//! Redis Cluster ignores an empty `{}` and would hash the whole key instead.

use std::fmt;
use std::sync::Arc;

/// The longest identity accepted, in bytes, before escaping.
pub const MAX_IDENTITY_BYTES: usize = 4096;

/// The longest rule id accepted, in bytes, before escaping.
pub const MAX_RULE_BYTES: usize = 1024;

/// Why a key cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// The identity is longer than [`MAX_IDENTITY_BYTES`].
    #[error("identity is {len} bytes long; at most {MAX_IDENTITY_BYTES} are allowed")]
    IdentityTooLong {
        /// Its length in bytes.
        len: usize,
    },
    /// The rule id is empty or longer than [`MAX_RULE_BYTES`].
    #[error("rule id must be 1 to {MAX_RULE_BYTES} bytes long, got {len}")]
    BadRuleId {
        /// Its length in bytes.
        len: usize,
    },
}

/// The key of one bucket: one rule applied to one identity.
///
/// Cheap to clone. Build it once per (identity, rule) and reuse it.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct BucketKey {
    /// `rl:{tag}:rule`
    key: Arc<str>,
    /// Length of `rl:{tag}` (the prefix shared by an identity's keys).
    tag_end: usize,
}

impl BucketKey {
    /// The key for `rule` applied to `identity`.
    pub fn new(identity: &[u8], rule: &str) -> Result<Self, KeyError> {
        if identity.len() > MAX_IDENTITY_BYTES {
            return Err(KeyError::IdentityTooLong {
                len: identity.len(),
            });
        }
        if rule.is_empty() || rule.len() > MAX_RULE_BYTES {
            return Err(KeyError::BadRuleId { len: rule.len() });
        }
        let mut key = String::with_capacity(8 + identity.len() + rule.len());
        key.push_str("rl:{");
        escape_into(identity, &mut key);
        key.push('}');
        let tag_end = key.len();
        key.push(':');
        escape_into(rule.as_bytes(), &mut key);
        Ok(Self {
            key: key.into(),
            tag_end,
        })
    }

    /// Rebuilds a key from [`BucketKey::as_str`] (e.g. out of a slot token a client sent back).
    pub fn parse(text: &str) -> Option<Self> {
        let rest = text.strip_prefix("rl:{")?;
        let close = rest.find('}')?;
        let tag = &rest[..close];
        let rule = rest[close + 1..].strip_prefix(':')?;
        let escaped = |s: &str| {
            !s.is_empty()
                && s.bytes().all(|b| {
                    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'~' | b'-' | b'%')
                })
        };
        if !escaped(tag) || !escaped(rule) || text.len() > 4 * (MAX_IDENTITY_BYTES + MAX_RULE_BYTES)
        {
            return None;
        }
        Some(Self {
            key: text.into(),
            tag_end: 4 + close + 1,
        })
    }

    /// The full Redis key of the bucket's state.
    pub fn as_str(&self) -> &str {
        &self.key
    }

    /// `rl:{tag}`: equal for every bucket of one identity.
    pub fn identity_prefix(&self) -> &str {
        &self.key[..self.tag_end]
    }

    /// Whether this is a key of `rule` (as [`BucketKey::new`] was given it).
    pub fn is_of_rule(&self, rule: &str) -> bool {
        let mut escaped = String::with_capacity(rule.len());
        escape_into(rule.as_bytes(), &mut escaped);
        self.key.get(self.tag_end + 1..) == Some(escaped.as_str())
    }

    /// The Redis key of the bucket's lease table (same slot as the state).
    pub(crate) fn lease_key(&self) -> String {
        format!("{}:leases", self.key)
    }

    /// The key of the bucket's reservations: nonce → record (same slot as the state).
    pub(crate) fn reservations_key(&self) -> String {
        format!("{}:reservations", self.key)
    }

    /// The key of when each reservation record of the bucket may go (same slot).
    pub(crate) fn reservation_ends_key(&self) -> String {
        format!("{}:reservations:ends", self.key)
    }

    /// The key of the bucket's regional allowance (same slot as the state).
    pub(crate) fn allowance_key(&self) -> String {
        format!("{}:allowance", self.key)
    }

    /// The key of the bucket's penalty record: denials counted, or a block (same slot).
    pub(crate) fn penalty_key(&self) -> String {
        format!("{}:penalty", self.key)
    }

    /// The key of the bucket's SHADOW penalty record (same slot): counted apart, never
    /// enforced.
    pub(crate) fn shadow_penalty_key(&self) -> String {
        format!("{}:penalty:shadow", self.key)
    }

    /// The key of the lift epoch of the bucket's penalty records (same slot): the store time
    /// of their latest lift or reset.
    pub(crate) fn penalty_epoch_key(&self) -> String {
        format!("{}:penalty:epoch", self.key)
    }

    /// The penalty record `penalty` counts in.
    pub(crate) fn penalty_key_of(&self, penalty: &crate::ops::penalty::Penalty) -> String {
        if penalty.is_shadow() {
            self.shadow_penalty_key()
        } else {
            self.penalty_key()
        }
    }

    /// The key of the bucket's demand reports (same slot as the state).
    pub(crate) fn demand_key(&self) -> String {
        format!("{}:demand", self.key)
    }

    /// The Redis key of the bucket's debit-once records (same slot as the state).
    pub(crate) fn remote_key(&self) -> String {
        format!("{}:remote", self.key)
    }
}

impl fmt::Debug for BucketKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.key, f)
    }
}

impl fmt::Display for BucketKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.key)
    }
}

fn escape_into(bytes: &[u8], out: &mut String) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    if bytes.is_empty() {
        out.push('%');
        return;
    }
    for &b in bytes {
        if b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'~' | b'-') {
            out.push(b as char);
        } else {
            out.push('%');
            out.push(HEX[usize::from(b >> 4)] as char);
            out.push(HEX[usize::from(b & 0xf)] as char);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn tag(key: &BucketKey) -> &str {
        let s = key.as_str();
        let open = s.find('{').expect("tag opens");
        let close = s[open..].find('}').expect("tag closes") + open;
        &s[open + 1..close]
    }

    #[test]
    fn plain_identities_stay_readable() {
        let key = BucketKey::new(b"k_123", "gold-orders-create").expect("key");
        assert_eq!(key.as_str(), "rl:{k_123}:gold-orders-create");
        assert_eq!(key.identity_prefix(), "rl:{k_123}");
    }

    #[test]
    fn hostile_identities_cannot_break_the_tag() {
        for identity in [
            &b"{}"[..],
            b"foo{}{bar}",
            b"a}:b",
            b"\r\n",
            b"\xff\xfe",
            b"%",
            b"",
        ] {
            let key = BucketKey::new(identity, "r:1").expect("key");
            let tag = tag(&key);
            assert!(!tag.is_empty(), "empty tag for {identity:?}");
            assert!(!tag.contains(['{', '}', ':']), "{tag:?}");
            assert!(key.as_str().is_ascii());
            // The rule part cannot fake a second tag or a lease-table suffix either.
            assert!(key.as_str().ends_with(":r%3A1"), "{key}");
        }
    }

    #[test]
    fn empty_identity_differs_from_percent_and_from_nul() {
        let empty = BucketKey::new(b"", "r").expect("key");
        let percent = BucketKey::new(b"%", "r").expect("key");
        let nul = BucketKey::new(b"\0", "r").expect("key");
        assert_ne!(empty, percent);
        assert_ne!(empty, nul);
        assert_ne!(percent, nul);
    }

    #[test]
    fn keys_parse_back() {
        let key = BucketKey::new(b"a:b{c}", "r.1").expect("key");
        assert_eq!(BucketKey::parse(key.as_str()), Some(key.clone()));
        assert_eq!(
            BucketKey::parse(key.as_str()).map(|k| k.identity_prefix().to_owned()),
            Some(key.identity_prefix().to_owned())
        );
        for bad in [
            "",
            "rl:{}:r",
            "rl:{a}",
            "rl:{a}:",
            "xx:{a}:r",
            "rl:{a b}:r",
            "rl:{a}:r:x",
        ] {
            assert_eq!(BucketKey::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn oversized_input_is_refused() {
        let big = vec![b'a'; 1 << 20];
        assert_eq!(
            BucketKey::new(&big, "r"),
            Err(KeyError::IdentityTooLong { len: 1 << 20 })
        );
        assert_eq!(
            BucketKey::new(b"a", ""),
            Err(KeyError::BadRuleId { len: 0 })
        );
        assert!(BucketKey::new(&vec![b'a'; MAX_IDENTITY_BYTES], "r").is_ok());
    }

    proptest! {
        #[test]
        fn distinct_identities_give_distinct_keys(a in proptest::collection::vec(any::<u8>(), 0..24),
                                                  b in proptest::collection::vec(any::<u8>(), 0..24)) {
            let ka = BucketKey::new(&a, "rule").expect("key");
            let kb = BucketKey::new(&b, "rule").expect("key");
            prop_assert_eq!(a == b, ka == kb);
            let clean = !tag(&ka).contains(['{', '}', ':']);
            prop_assert!(clean, "tag of {:?} leaks a delimiter", a);
        }
    }
}
