//! The most-denied keys, per rule and overall, in fixed memory whatever the key cardinality:
//! the Space-Saving algorithm (Metwally, Agrawal, El Abbadi 2005). Each list keeps
//! [`TRACKED`] counters; a key not tracked takes the place of the smallest, inheriting its
//! count as a bound on its error. Any key denied more than `total / TRACKED` times (1 % of a
//! list's denials) is always among them, and a reported count overstates the truth by at most
//! its `error`: under a flood of keys each denied once, the tail of a list is keys whose count
//! is nearly all error (`denied - error` is what is certain).
//!
//! Identities may be personal data or credentials (an IP address, a user id, an API key): how
//! they are shown is a setting, truncated by default (plain, or a keyed hash that is the same on
//! every node of a deployment and that nobody without its secret can reverse or test a guess
//! against: an unkeyed hash of an IPv4 address is reversed by trying all of them).

use std::collections::HashMap;

use hmac::{KeyInit, Mac};
use parking_lot::Mutex;
use serde::Serialize;
use sha2::Sha256;

/// Counters kept per list (a list reports its 20 largest).
pub const TRACKED: usize = 100;

/// Rules with a list of their own; denials under further rules count overall only.
pub const MAX_RULES: usize = 256;

/// Bytes of an identity kept (longer ones are cut, so memory stays bounded).
const MAX_IDENTITY: usize = 128;

/// The shortest secret a keyed hash of identities takes.
pub const MIN_SECRET: usize = 16;

/// How identities are shown.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum IdentityShown {
    /// As they are.
    Plain,
    /// Their first 6 characters and an ellipsis (the default: enough to tell keys apart, not
    /// enough to use one).
    #[default]
    Truncated,
    /// `hmac:` and the first 16 hex digits of their HMAC-SHA256 under the deployment's secret:
    /// the same on every node given the same secret, so lists can be compared, and nothing
    /// readable or testable without it.
    Hashed {
        /// The deployment's secret.
        secret: std::sync::Arc<[u8]>,
    },
}

impl IdentityShown {
    /// Reads `plain`, `truncated` or `hashed` (which needs a `secret` of at least
    /// [`MIN_SECRET`] bytes).
    pub fn parse(text: &str, secret: Option<&str>) -> Result<Self, String> {
        match text {
            "plain" => Ok(Self::Plain),
            "truncated" => Ok(Self::Truncated),
            "hashed" => match secret {
                Some(secret) if secret.len() >= MIN_SECRET => Ok(Self::Hashed {
                    secret: secret.as_bytes().into(),
                }),
                Some(_) => Err(format!(
                    "hashed identities need a secret of at least {MIN_SECRET} bytes \
                     (top_denied_secret)"
                )),
                None => Err(
                    "hashed identities need a secret (top_denied_secret): an unkeyed \
                     hash of an IP address is reversed by trying them all"
                        .into(),
                ),
            },
            other => Err(format!(
                "{other:?} is not a way to show identities: plain, truncated or hashed"
            )),
        }
    }
}

impl IdentityShown {
    fn show(&self, identity: &[u8]) -> String {
        match self {
            IdentityShown::Plain => String::from_utf8_lossy(identity).into_owned(),
            IdentityShown::Truncated => {
                let text = String::from_utf8_lossy(identity);
                let mut shown: String = text.chars().take(6).collect();
                if text.chars().nth(6).is_some() {
                    shown.push('…');
                }
                shown
            }
            IdentityShown::Hashed { secret } => {
                let mut mac = <hmac::Hmac<Sha256> as KeyInit>::new_from_slice(secret)
                    .expect("HMAC takes a key of any length");
                mac.update(identity);
                let digest = mac.finalize().into_bytes();
                let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
                format!("hmac:{hex}")
            }
        }
    }
}

/// One Space-Saving list.
#[derive(Debug, Default)]
struct SpaceSaving {
    counters: Vec<Counter>,
    index: HashMap<Vec<u8>, usize>,
    total: u64,
}

#[derive(Debug, Clone)]
struct Counter {
    key: Vec<u8>,
    count: u64,
    error: u64,
}

impl SpaceSaving {
    fn record(&mut self, key: &[u8]) {
        self.total += 1;
        let key = &key[..key.len().min(MAX_IDENTITY)];
        if let Some(&i) = self.index.get(key) {
            self.counters[i].count += 1;
            return;
        }
        if self.counters.len() < TRACKED {
            self.index.insert(key.to_vec(), self.counters.len());
            self.counters.push(Counter {
                key: key.to_vec(),
                count: 1,
                error: 0,
            });
            return;
        }
        // The smallest counter gives its place; its count bounds the newcomer's error.
        let (i, smallest) = self
            .counters
            .iter()
            .enumerate()
            .min_by_key(|(_, c)| c.count)
            .map(|(i, c)| (i, c.count))
            .unwrap_or((0, 0));
        let old = std::mem::replace(
            &mut self.counters[i],
            Counter {
                key: key.to_vec(),
                count: smallest + 1,
                error: smallest,
            },
        );
        self.index.remove(&old.key);
        self.index.insert(key.to_vec(), i);
    }

    fn top(&self, n: usize) -> Vec<&Counter> {
        let mut all: Vec<&Counter> = self.counters.iter().collect();
        all.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.key.cmp(&b.key)));
        all.truncate(n);
        all
    }
}

/// The most-denied keys of a node.
#[derive(Debug, Default)]
pub struct TopDenied {
    shown: IdentityShown,
    per_rule: Mutex<HashMap<String, SpaceSaving>>,
    overall: Mutex<SpaceSaving>,
}

/// A key in a list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeniedKey {
    /// The rule (overall lists name it; a rule's own list too, for uniformity).
    pub rule: String,
    /// The identity, shown as configured.
    pub identity: String,
    /// Denials counted (at most `error` more than the truth).
    pub denied: u64,
    /// How much `denied` may overstate.
    pub error: u64,
}

/// The lists, as `/top-denied` serves them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TopDeniedReport {
    /// Denials counted in all.
    pub denials: u64,
    /// The most-denied keys across rules.
    pub overall: Vec<DeniedKey>,
    /// Per rule id.
    pub rules: std::collections::BTreeMap<String, Vec<DeniedKey>>,
}

impl TopDenied {
    /// Lists showing identities as `shown`.
    pub fn new(shown: IdentityShown) -> Self {
        Self {
            shown,
            ..Self::default()
        }
    }

    /// Counts a denial of `identity` by rule `rule`.
    pub fn record(&self, rule: &str, identity: &[u8]) {
        {
            let mut per_rule = self.per_rule.lock();
            if let Some(list) = per_rule.get_mut(rule) {
                list.record(identity);
            } else if per_rule.len() < MAX_RULES {
                per_rule
                    .entry(rule.to_owned())
                    .or_default()
                    .record(identity);
            }
        }
        // Overall, a key is the rule and the identity together.
        let mut key = Vec::with_capacity(rule.len() + 1 + identity.len());
        key.extend_from_slice(rule.as_bytes());
        key.push(0);
        key.extend_from_slice(identity);
        self.overall.lock().record(&key);
    }

    /// The `n` most-denied keys overall and per rule.
    pub fn report(&self, n: usize) -> TopDeniedReport {
        let shown = &self.shown;
        let overall = self.overall.lock();
        let overall_keys = overall
            .top(n)
            .into_iter()
            .map(|c| {
                let (rule, identity) = match c.key.iter().position(|b| *b == 0) {
                    Some(at) => (&c.key[..at], &c.key[at + 1..]),
                    None => (&c.key[..], &[][..]),
                };
                DeniedKey {
                    rule: String::from_utf8_lossy(rule).into_owned(),
                    identity: shown.show(identity),
                    denied: c.count,
                    error: c.error,
                }
            })
            .collect();
        let denials = overall.total;
        drop(overall);
        let rules = self
            .per_rule
            .lock()
            .iter()
            .map(|(rule, list)| {
                let keys = list
                    .top(n)
                    .into_iter()
                    .map(|c| DeniedKey {
                        rule: rule.clone(),
                        identity: shown.show(&c.key),
                        denied: c.count,
                        error: c.error,
                    })
                    .collect();
                (rule.clone(), keys)
            })
            .collect();
        TopDeniedReport {
            denials,
            overall: overall_keys,
            rules,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heavy_keys_are_found_among_many_light_ones() {
        let top = TopDenied::new(IdentityShown::Plain);
        // Three heavy keys, each denied 8,000 times (3.6 % of all denials, over the 1 % that
        // 100 counters guarantee to catch), among 200,000 keys denied once.
        for i in 0..200_000u32 {
            top.record("per-ip", format!("light-{i}").as_bytes());
            if i % 25 == 0 {
                for heavy in ["10.0.0.1", "10.0.0.2", "10.0.0.3"] {
                    top.record("per-ip", heavy.as_bytes());
                }
            }
        }
        let report = top.report(20);
        let rule = &report.rules["per-ip"];
        let first: Vec<&str> = rule[..3].iter().map(|k| k.identity.as_str()).collect();
        assert!(
            first.contains(&"10.0.0.1")
                && first.contains(&"10.0.0.2")
                && first.contains(&"10.0.0.3"),
            "{first:?}"
        );
        for k in &rule[..3] {
            // Never under the truth, and over it by at most the error.
            assert!(k.denied >= 8_000 && k.denied - k.error <= 8_000, "{k:?}");
        }
        assert_eq!(report.denials, 224_000);
        assert_eq!(report.overall[0].rule, "per-ip");
        // Memory is the lists', whatever the cardinality.
        assert_eq!(top.per_rule.lock()["per-ip"].counters.len(), TRACKED);
        assert_eq!(top.overall.lock().index.len(), TRACKED);
    }

    #[test]
    fn identities_are_shown_as_configured() {
        assert_eq!(IdentityShown::Plain.show(b"user-12345"), "user-12345");
        assert_eq!(IdentityShown::Truncated.show(b"user-12345"), "user-1…");
        assert_eq!(IdentityShown::Truncated.show(b"user"), "user");
        assert_eq!(IdentityShown::default(), IdentityShown::Truncated);
        let keyed = |secret: &str| {
            IdentityShown::parse("hashed", Some(secret)).expect("a secret long enough")
        };
        let hashed = keyed("a-deployment-secret").show(b"user-12345");
        assert!(
            hashed.starts_with("hmac:") && hashed.len() == 5 + 16,
            "{hashed}"
        );
        assert_eq!(
            hashed,
            keyed("a-deployment-secret").show(b"user-12345"),
            "stable under one secret"
        );
        assert_ne!(
            hashed,
            keyed("another-deployment").show(b"user-12345"),
            "a guess cannot be tested without the secret"
        );
        assert!(IdentityShown::parse("secret", None).is_err());
        assert!(
            IdentityShown::parse("hashed", None).is_err(),
            "no unkeyed hash"
        );
        assert!(IdentityShown::parse("hashed", Some("short")).is_err());
    }

    #[test]
    fn rules_past_the_cap_count_overall_only() {
        let top = TopDenied::new(IdentityShown::Plain);
        for r in 0..MAX_RULES + 10 {
            top.record(&format!("rule-{r}"), b"k");
        }
        let report = top.report(20);
        assert_eq!(report.rules.len(), MAX_RULES);
        assert_eq!(report.denials, (MAX_RULES + 10) as u64);
    }
}
