//! How a bucket's rate is shared among the Envoy streams that enforce it: max-min fair on
//! each stream's demand (water-filling), in whole units per second, and what each Envoy holds
//! as its local token bucket.

/// Shares `budget` whole units per second among `demands` (units per second, one per stream),
/// max-min fair: streams that ask less than an equal split get what they ask (rounded up), the
/// rest split what is left evenly, and the units rounding leaves go one each to the largest
/// unmet demands. The shares never sum to more than `budget`.
pub fn water_fill(budget: u64, demands: &[f64]) -> Vec<u64> {
    let wants: Vec<u64> = demands
        .iter()
        .map(|d| {
            if d.is_finite() && *d > 0.0 {
                d.ceil() as u64
            } else {
                0
            }
        })
        .collect();
    let mut order: Vec<usize> = (0..wants.len()).collect();
    order.sort_by_key(|&i| wants[i]);
    let mut shares = vec![0; wants.len()];
    let mut left = budget;
    for (k, &i) in order.iter().enumerate() {
        let fair = left / (order.len() - k) as u64;
        shares[i] = wants[i].min(fair);
        left -= shares[i];
    }
    for &i in order.iter().rev() {
        if left == 0 {
            break;
        }
        if wants[i] > shares[i] {
            shares[i] += 1;
            left -= 1;
        }
    }
    shares
}

/// Shares `budget` among streams grouped by host: max-min fair among the hosts first (a host
/// asks what its streams ask together), then within each host among its streams. `groups`
/// holds each stream's group (its host's index) and demand; the shares come back in the same
/// order. A host that opens many streams gets one host's share, split among them: many streams
/// on one bucket cannot drain another host's Envoy.
pub fn water_fill_by_group(budget: u64, streams: &[(usize, f64)]) -> Vec<u64> {
    let groups = streams.iter().map(|(g, _)| g + 1).max().unwrap_or(0);
    let mut asked = vec![0.0; groups];
    for (g, demand) in streams {
        if demand.is_finite() && *demand > 0.0 {
            asked[*g] += demand.ceil();
        }
    }
    let per_group = water_fill(budget, &asked);
    let mut shares = vec![0; streams.len()];
    for (g, share) in per_group.into_iter().enumerate() {
        let members: Vec<usize> = (0..streams.len()).filter(|&i| streams[i].0 == g).collect();
        let demands: Vec<f64> = members.iter().map(|&i| streams[i].1).collect();
        for (i, s) in members.into_iter().zip(water_fill(share, &demands)) {
            shares[i] = s;
        }
    }
    shares
}

/// What an Envoy stream is told to enforce for a bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// Every request admitted (no rule limits the bucket).
    AllowAll,
    /// Every request denied (a rule blocks the bucket, or its share is nothing).
    DenyAll,
    /// A token bucket of `max_tokens` filled with `per_second` tokens every second.
    TokenBucket {
        /// The most it holds, and what a new one starts with.
        max_tokens: u32,
        /// Tokens added per second.
        per_second: u32,
    },
}

impl Strategy {
    /// The token bucket of a share of `per_second` units a second holding at most
    /// `max_tokens`, or DENY_ALL for a share of nothing (Envoy refuses a bucket that never
    /// fills, and a share of nothing is paid for by nobody).
    pub fn share(per_second: u64, max_tokens: u64) -> Strategy {
        if per_second == 0 {
            return Strategy::DenyAll;
        }
        let clamp = |n: u64| u32::try_from(n).unwrap_or(u32::MAX).max(1);
        Strategy::TokenBucket {
            max_tokens: clamp(max_tokens),
            per_second: clamp(per_second),
        }
    }

    /// Its rate in units a second (None: not a token bucket).
    pub fn per_second(&self) -> Option<u64> {
        match self {
            Strategy::TokenBucket { per_second, .. } => Some(u64::from(*per_second)),
            _ => None,
        }
    }

    /// Its bucket size (0: not a token bucket).
    pub fn max_tokens(&self) -> u64 {
        match self {
            Strategy::TokenBucket { max_tokens, .. } => u64::from(*max_tokens),
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Strategy, water_fill, water_fill_by_group};
    use proptest::prelude::{prop_assert, prop_assert_eq, proptest};

    #[test]
    fn a_lone_stream_gets_all_it_asks_up_to_the_budget() {
        assert_eq!(water_fill(20, &[50.0]), vec![20]);
        assert_eq!(water_fill(20, &[5.0]), vec![5]);
    }

    #[test]
    fn equal_demands_split_evenly_and_the_rounding_goes_somewhere() {
        let shares = water_fill(20, &[50.0, 50.0, 50.0]);
        assert_eq!(shares.iter().sum::<u64>(), 20);
        assert!(shares.iter().all(|s| *s == 6 || *s == 7), "{shares:?}");
    }

    #[test]
    fn small_demands_are_met_and_the_rest_is_split() {
        assert_eq!(water_fill(20, &[2.0, 50.0, 50.0]), vec![2, 9, 9]);
        assert_eq!(water_fill(20, &[0.0, 50.0]), vec![0, 20]);
        assert_eq!(water_fill(20, &[0.5, 3.2]), vec![1, 4]);
    }

    #[test]
    fn nothing_to_share_is_nothing_shared() {
        assert_eq!(water_fill(0, &[5.0, 5.0]), vec![0, 0]);
        assert_eq!(water_fill(10, &[]), Vec::<u64>::new());
    }

    #[test]
    fn a_share_of_nothing_is_deny_all_and_a_bucket_holds_at_least_one() {
        assert_eq!(Strategy::share(0, 10), Strategy::DenyAll);
        assert_eq!(
            Strategy::share(5, 0),
            Strategy::TokenBucket {
                max_tokens: 1,
                per_second: 5
            }
        );
    }

    #[test]
    fn many_streams_of_one_host_share_that_hosts_part() {
        // 2,000 streams of one host and one honest Envoy on another, a rate of 20.
        let mut streams: Vec<(usize, f64)> = (0..2_000).map(|_| (0, 50.0)).collect();
        streams.push((1, 50.0));
        let shares = water_fill_by_group(20, &streams);
        assert_eq!(shares[2_000], 10, "the honest host keeps half");
        assert_eq!(shares[..2_000].iter().sum::<u64>(), 10);
        // One host alone gets what it asks, split by its streams' demands.
        assert_eq!(water_fill_by_group(20, &[(0, 3.0), (0, 50.0)]), vec![3, 17]);
    }

    proptest! {
        #[test]
        fn grouped_shares_never_exceed_the_budget_and_hosts_are_max_min_fair(
            budget in 0u64..1_000,
            streams in proptest::collection::vec((0usize..5, 0.0f64..500.0), 0..40),
        ) {
            let shares = water_fill_by_group(budget, &streams);
            prop_assert_eq!(shares.len(), streams.len());
            prop_assert!(shares.iter().sum::<u64>() <= budget);
            let mut hosts = [(0u64, 0u64); 5];
            for ((g, d), s) in streams.iter().zip(&shares) {
                prop_assert!(*s <= d.ceil() as u64);
                hosts[*g].0 += s;
                hosts[*g].1 += d.ceil() as u64;
            }
            let most = hosts.iter().map(|(got, _)| *got).max().unwrap_or(0);
            for (got, wanted) in hosts {
                if got < wanted {
                    prop_assert!(got + 1 >= most, "{:?}", hosts);
                }
            }
        }

        #[test]
        fn shares_never_exceed_the_budget_nor_a_demand_rounded_up(
            budget in 0u64..10_000,
            demands in proptest::collection::vec(0.0f64..5_000.0, 0..40),
        ) {
            let shares = water_fill(budget, &demands);
            prop_assert_eq!(shares.len(), demands.len());
            prop_assert!(shares.iter().sum::<u64>() <= budget);
            for (s, d) in shares.iter().zip(&demands) {
                prop_assert!(*s <= d.ceil() as u64);
            }
            // Max-min fair: a stream short of its demand gets at least as much as any other
            // stream, less one for rounding.
            let most = shares.iter().copied().max().unwrap_or(0);
            for (s, d) in shares.iter().zip(&demands) {
                if *s < d.ceil() as u64 {
                    prop_assert!(*s + 1 >= most, "{:?} {:?}", shares, demands);
                }
            }
            // Nothing wasted while some demand is unmet.
            let wanted: u64 = demands.iter().map(|d| d.ceil() as u64).sum();
            prop_assert_eq!(shares.iter().sum::<u64>(), budget.min(wanted));
        }
    }
}
