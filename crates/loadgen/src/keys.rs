//! Key distributions: which client key each request carries.

use std::sync::atomic::{AtomicU64, Ordering};

use rand::Rng;
use rand_distr::{Distribution, Zipf};

/// Where keys come from.
#[derive(Debug)]
pub(crate) enum Keys {
    /// One key, always.
    Hot,
    /// Zipf over `n` keys (key 0 the most frequent).
    Zipf(Zipf<f64>),
    /// Uniform over `n` keys.
    Uniform(u64),
    /// A new key every `repeats` requests (`new`: every request; `new:2`: each new key sent
    /// twice in a row, which earns it a key actor on the node).
    New {
        /// Requests drawn so far.
        next: AtomicU64,
        /// Requests per key.
        repeats: u64,
    },
}

impl Keys {
    /// Reads `hot`, `zipf:N`, `uniform:N`, `new`, `new:R`.
    pub(crate) fn parse(text: &str, zipf_s: f64) -> anyhow::Result<Self> {
        let count = |n: &str| -> anyhow::Result<u64> {
            let n: u64 = n
                .parse()
                .map_err(|_| anyhow::anyhow!("{n:?} is not a key count"))?;
            anyhow::ensure!(n > 0, "a key count must be at least 1");
            Ok(n)
        };
        Ok(match text.split_once(':') {
            None if text == "hot" => Keys::Hot,
            None if text == "new" => Keys::New {
                next: AtomicU64::new(0),
                repeats: 1,
            },
            Some(("new", r)) => Keys::New {
                next: AtomicU64::new(0),
                repeats: count(r)?,
            },
            Some(("zipf", n)) => Keys::Zipf(
                Zipf::new(count(n)? as f64, zipf_s).map_err(|e| anyhow::anyhow!("zipf: {e}"))?,
            ),
            Some(("uniform", n)) => Keys::Uniform(count(n)?),
            _ => anyhow::bail!(
                "unknown key distribution {text:?} (hot, zipf:N, uniform:N, new, new:R)"
            ),
        })
    }

    /// The next request's key.
    pub(crate) fn next(&self, rng: &mut impl Rng) -> String {
        match self {
            Keys::Hot => "10.1.2.3".to_owned(),
            Keys::Zipf(z) => format!("k{}", z.sample(rng) as u64),
            Keys::Uniform(n) => format!("k{}", rng.random_range(0..*n)),
            Keys::New { next, repeats } => {
                format!("n{}", next.fetch_add(1, Ordering::Relaxed) / repeats)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distributions_parse_and_draw() {
        let mut rng = rand::rng();
        assert_eq!(
            Keys::parse("hot", 1.0).expect("hot").next(&mut rng),
            "10.1.2.3"
        );
        let uniform = Keys::parse("uniform:10", 1.0).expect("uniform");
        assert!((0..100).all(|_| {
            let k = uniform.next(&mut rng);
            k[1..].parse::<u64>().is_ok_and(|n| n < 10)
        }));
        let zipf = Keys::parse("zipf:1000", 1.0).expect("zipf");
        let hot = (0..1000).filter(|_| zipf.next(&mut rng) == "k1").count();
        assert!(hot > 50, "Zipf's first key is frequent: {hot} of 1000");
        let new = Keys::parse("new", 1.0).expect("new");
        assert_ne!(new.next(&mut rng), new.next(&mut rng));
        assert!(Keys::parse("zipf:0", 1.0).is_err());
        assert!(Keys::parse("pareto:10", 1.0).is_err());
    }
}
