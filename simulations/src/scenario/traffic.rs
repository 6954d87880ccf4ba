//! A scenario's traffic: named streams of requests, their rates, descriptors and keys.

use std::collections::BTreeMap;
use std::time::Duration;

use super::*;

/// A stream of requests.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Traffic {
    /// Its name in reports.
    pub name: String,
    /// The domain of its requests.
    pub domain: String,
    /// Requests per second, all nodes together (an open loop: requests arrive whether or not
    /// earlier ones were answered).
    #[serde(default)]
    pub rate: f64,
    /// Instead of a rate, a closed loop: this many callers on each node it reaches, each
    /// sending its next request when the last is answered (a load generator's connections).
    #[serde(default)]
    pub callers: Option<usize>,
    /// When given, the rate moves linearly from `rate` at `from` to this at `until` (a ramp).
    #[serde(default)]
    pub ramp_to: Option<f64>,
    /// When it starts (default: at once).
    #[serde(default, with = "humantime_serde")]
    pub from: Option<Duration>,
    /// When it stops (default: at the end).
    #[serde(default, with = "humantime_serde")]
    pub until: Option<Duration>,
    /// Which identity each request carries: `{key}` in a descriptor value is replaced by it.
    #[serde(default)]
    pub keys: Keys,
    /// The request's descriptors (entries; `{key}` is replaced by the request's key).
    pub descriptors: Vec<BTreeMap<String, String>>,
    /// Units each request costs.
    #[serde(default = "one")]
    pub cost: u64,
    /// How long an admitted request runs before its concurrency slots are released.
    #[serde(default, with = "humantime_serde")]
    pub hold: Option<Duration>,
    /// The regions whose nodes receive it (default: all).
    #[serde(default)]
    pub regions: Option<Vec<String>>,
}

/// How keys are drawn: `hot`, `new`, `{zipf: {n, s}}` or `{uniform: {n}}`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(try_from = "KeysText")]
pub enum Keys {
    /// One key.
    #[default]
    Hot,
    /// Zipf over `n` keys with exponent `s`: a few hot keys and a long tail.
    Zipf {
        /// Keys.
        n: u64,
        /// Exponent (1.0 to 1.2 is typical of API keys).
        s: f64,
    },
    /// Uniform over `n` keys.
    Uniform {
        /// Keys.
        n: u64,
    },
    /// Every request a new key (a key-cardinality flood).
    New,
}

/// How `keys` is written.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum KeysText {
    Name(String),
    Zipf { zipf: ZipfText },
    Uniform { uniform: UniformText },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ZipfText {
    n: u64,
    #[serde(default = "zipf_s")]
    s: f64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct UniformText {
    n: u64,
}

impl TryFrom<KeysText> for Keys {
    type Error = String;

    fn try_from(text: KeysText) -> Result<Self, String> {
        Ok(match text {
            KeysText::Name(name) => match name.as_str() {
                "hot" => Keys::Hot,
                "new" => Keys::New,
                other => {
                    return Err(format!(
                        "unknown key distribution {other:?}: hot, new, {{zipf: {{n, s}}}} or {{uniform: {{n}}}}"
                    ));
                }
            },
            KeysText::Zipf { zipf } => Keys::Zipf {
                n: zipf.n,
                s: zipf.s,
            },
            KeysText::Uniform { uniform } => Keys::Uniform { n: uniform.n },
        })
    }
}

fn zipf_s() -> f64 {
    1.1
}
