//! Which bucket a rule applied to an identity is, and the two keys it is known by: this node's
//! own (the registry and the fallback maps: the rule's uid, which changes with the rule's
//! definition, then the identity) and the store's ([`BucketKey`]: the identity's hash tag, then
//! the rule's id, the same on every node). Every key of a bucket is built here.

use tollgate_lease::{BucketKey, KeyError};

use crate::rules::CompiledRule;

/// A rule applied to an identity.
#[derive(Debug, Clone, Copy)]
pub struct BucketId<'a> {
    rule: &'a CompiledRule,
    identity: &'a [u8],
}

impl<'a> BucketId<'a> {
    /// `rule` applied to `identity`.
    pub fn new(rule: &'a CompiledRule, identity: &'a [u8]) -> Self {
        Self { rule, identity }
    }

    /// This node's key of the bucket: the rule's uid, then the identity.
    pub fn local_key(&self) -> Vec<u8> {
        let mut key = Vec::with_capacity(8 + self.identity.len());
        self.write_local_key(&mut key);
        key
    }

    /// Writes this node's key of the bucket into `key` (cleared first), so a lookup can reuse
    /// one buffer and allocate nothing.
    pub fn write_local_key(&self, key: &mut Vec<u8>) {
        key.clear();
        key.extend_from_slice(&self.rule.uid.to_le_bytes());
        key.extend_from_slice(self.identity);
    }

    /// The store's key of the bucket; an error if the identity is too long for one.
    pub fn store_key(&self) -> Result<BucketKey, KeyError> {
        BucketKey::new(self.identity, &self.rule.key)
    }
}
