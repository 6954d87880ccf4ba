//! Per-rule regional policy: how a limit that is global across two regions is held.
//!
//! - `SPLIT` (the default): each region enforces `limit × its share` on its own; while the
//!   peer is down the survivor enforces `limit × failoverShare`.
//! - `ASYNC_SYNC`: each region enforces the whole limit and the region-sync actor debits the
//!   peer's consumption into it.
//! - `HOME_REGION`: the home region holds the counter; the other forwards each decision, and
//!   decides on a local bucket of `limit × fallbackShare` when it cannot.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use tollgate_lease::{Algorithm, Limit};

/// A regional policy as written (`regional:` in a rule document).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RegionalDoc {
    /// `SPLIT`, `ASYNC_SYNC` or `HOME_REGION`.
    pub policy: String,
    /// SPLIT: each region's share of the limit, e.g. `{us: 0.6, eu: 0.4}` (default: the
    /// node's `--region-shares`, else equal).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shares: Option<BTreeMap<String, f64>>,
    /// SPLIT: the survivor's share while the peer is down (default 1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failover_share: Option<f64>,
    /// HOME_REGION: the region that holds the counter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub home_region: Option<String>,
    /// HOME_REGION: the share of the limit the other region decides on alone while it cannot
    /// reach the home region (default: its SPLIT share).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback_share: Option<f64>,
}

/// A validated regional policy.
#[derive(Debug, Clone, PartialEq)]
pub enum RegionalPolicy {
    /// The limit divided between the regions.
    Split {
        /// Per region; regions not named get the node's default share.
        shares: BTreeMap<String, f64>,
        /// The survivor's share while the peer is down.
        failover_share: f64,
    },
    /// The whole limit in each region, the peer's consumption subtracted.
    AsyncSync,
    /// One region holds the counter.
    HomeRegion {
        /// That region.
        home: String,
        /// The other region's share while it cannot reach the home region.
        fallback_share: Option<f64>,
    },
}

impl Default for RegionalPolicy {
    fn default() -> Self {
        RegionalPolicy::Split {
            shares: BTreeMap::new(),
            failover_share: 1.0,
        }
    }
}

impl fmt::Display for RegionalPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RegionalPolicy::Split { .. } => "SPLIT",
            RegionalPolicy::AsyncSync => "ASYNC_SYNC",
            RegionalPolicy::HomeRegion { .. } => "HOME_REGION",
        })
    }
}

/// A field of the policy that is wrong, named as written (`regional.shares.us`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid `{field}`: {reason}")]
pub struct PolicyError {
    /// The field.
    pub field: String,
    /// Why.
    pub reason: String,
}

fn error(field: impl Into<String>, reason: impl Into<String>) -> PolicyError {
    PolicyError {
        field: field.into(),
        reason: reason.into(),
    }
}

fn share(field: &str, value: f64) -> Result<f64, PolicyError> {
    if value.is_finite() && value > 0.0 && value <= 1.0 {
        Ok(value)
    } else {
        Err(error(
            field,
            format!("must be above 0 and at most 1, got {value}"),
        ))
    }
}

/// Checks a region name: 1 to 32 characters of `[a-z0-9-]`.
pub fn validate_region(field: &str, name: &str) -> Result<(), PolicyError> {
    if !tollgate_lease::ops::allowance::is_region_name(name) {
        return Err(error(
            field,
            format!("{name:?} must be 1 to 32 characters of a-z 0-9 -"),
        ));
    }
    Ok(())
}

impl RegionalDoc {
    /// Validates the document for a rule of `algorithm`.
    pub fn validate(&self, algorithm: Algorithm) -> Result<RegionalPolicy, PolicyError> {
        let only = |field: &str, given: bool, policy: &str| {
            if given {
                Err(error(
                    format!("regional.{field}"),
                    format!("applies to {policy} only"),
                ))
            } else {
                Ok(())
            }
        };
        match self.policy.as_str() {
            "SPLIT" => {
                only("homeRegion", self.home_region.is_some(), "HOME_REGION")?;
                only(
                    "fallbackShare",
                    self.fallback_share.is_some(),
                    "HOME_REGION",
                )?;
                let mut shares = BTreeMap::new();
                let mut sum = 0.0;
                for (region, value) in self.shares.iter().flatten() {
                    let field = format!("regional.shares.{region}");
                    validate_region(&field, region)?;
                    sum += share(&field, *value)?;
                    shares.insert(region.clone(), *value);
                }
                if sum > 1.0 + 1e-9 {
                    return Err(error(
                        "regional.shares",
                        format!("add up to {sum}; at most 1"),
                    ));
                }
                let failover_share = match self.failover_share {
                    Some(v) => share("regional.failoverShare", v)?,
                    None => 1.0,
                };
                Ok(RegionalPolicy::Split {
                    shares,
                    failover_share,
                })
            }
            "ASYNC_SYNC" => {
                only("shares", self.shares.is_some(), "SPLIT")?;
                only("failoverShare", self.failover_share.is_some(), "SPLIT")?;
                only("homeRegion", self.home_region.is_some(), "HOME_REGION")?;
                only(
                    "fallbackShare",
                    self.fallback_share.is_some(),
                    "HOME_REGION",
                )?;
                if algorithm == Algorithm::Concurrency {
                    return Err(error(
                        "regional.policy",
                        "ASYNC_SYNC cannot apply to CONCURRENCY (slots are not consumption)",
                    ));
                }
                Ok(RegionalPolicy::AsyncSync)
            }
            "HOME_REGION" => {
                only("shares", self.shares.is_some(), "SPLIT")?;
                only("failoverShare", self.failover_share.is_some(), "SPLIT")?;
                let home = self
                    .home_region
                    .clone()
                    .ok_or_else(|| error("regional.homeRegion", "is required for HOME_REGION"))?;
                validate_region("regional.homeRegion", &home)?;
                let fallback_share = self
                    .fallback_share
                    .map(|v| share("regional.fallbackShare", v))
                    .transpose()?;
                Ok(RegionalPolicy::HomeRegion {
                    home,
                    fallback_share,
                })
            }
            other => Err(error(
                "regional.policy",
                format!("unknown policy {other:?}; expected SPLIT, ASYNC_SYNC or HOME_REGION"),
            )),
        }
    }
}

impl RegionalPolicy {
    /// The document that validates back into this policy.
    pub fn to_doc(&self) -> RegionalDoc {
        match self {
            RegionalPolicy::Split {
                shares,
                failover_share,
            } => RegionalDoc {
                policy: "SPLIT".into(),
                shares: (!shares.is_empty()).then(|| shares.clone()),
                failover_share: (*failover_share != 1.0).then_some(*failover_share),
                ..RegionalDoc::default()
            },
            RegionalPolicy::AsyncSync => RegionalDoc {
                policy: "ASYNC_SYNC".into(),
                ..RegionalDoc::default()
            },
            RegionalPolicy::HomeRegion {
                home,
                fallback_share,
            } => RegionalDoc {
                policy: "HOME_REGION".into(),
                home_region: Some(home.clone()),
                fallback_share: *fallback_share,
                ..RegionalDoc::default()
            },
        }
    }
}

/// The peer region as this node sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PeerState {
    /// Reachable.
    Up,
    /// Unreachable for longer than the failover time.
    Down,
}

/// What a node knows of the regions when it compiles its rules.
#[derive(Debug, Clone, PartialEq)]
pub struct RegionView {
    /// This node's region.
    pub own: String,
    /// The other region.
    pub peer: String,
    /// This region's share under SPLIT for rules that name none.
    pub default_share: f64,
    /// The peer's state.
    pub peer_state: PeerState,
}

/// How a rule runs in this region.
#[derive(Debug, Clone, PartialEq)]
pub enum Role {
    /// Decided here alone, on this region's counter.
    Local,
    /// Decided here on the whole limit; consumption is shipped to the peer and the peer's is
    /// debited here.
    Synced,
    /// Decided here on the whole limit for both regions (HOME_REGION homed here): the peer
    /// forwards its requests, and only rules so placed may be decided for it.
    Home,
    /// Decided by the home region; this region's bucket serves when it cannot be reached.
    Forwarded {
        /// The home region.
        home: String,
    },
}

/// Where a rule's limit is held in this region, and at what share.
#[derive(Debug, Clone, PartialEq)]
pub struct Placement {
    /// The fraction of the rule's limit this region enforces on its own counter.
    pub share: f64,
    /// How decisions are made.
    pub role: Role,
}

impl Placement {
    /// A single region: the whole limit, locally.
    pub const LOCAL: Placement = Placement {
        share: 1.0,
        role: Role::Local,
    };
}

/// How `policy` runs on a node that sees the regions as `view` (`None`: one region).
pub fn place(policy: &RegionalPolicy, view: Option<&RegionView>) -> Placement {
    let Some(view) = view else {
        return Placement::LOCAL;
    };
    // This region's share: as named; else what the peer's named share leaves; else the
    // node's default.
    let split_share = |shares: &BTreeMap<String, f64>| {
        shares
            .get(&view.own)
            .copied()
            .or_else(|| {
                shares
                    .get(&view.peer)
                    .map(|p| (1.0 - p).max(f64::MIN_POSITIVE))
            })
            .unwrap_or(view.default_share)
    };
    match policy {
        RegionalPolicy::Split {
            shares,
            failover_share,
        } => Placement {
            share: match view.peer_state {
                PeerState::Up => split_share(shares),
                PeerState::Down => *failover_share,
            },
            role: Role::Local,
        },
        RegionalPolicy::AsyncSync => Placement {
            share: 1.0,
            role: Role::Synced,
        },
        RegionalPolicy::HomeRegion {
            home,
            fallback_share,
        } => {
            if *home == view.own {
                Placement {
                    share: 1.0,
                    role: Role::Home,
                }
            } else if *home == view.peer {
                Placement {
                    share: fallback_share.unwrap_or(view.default_share),
                    role: Role::Forwarded { home: home.clone() },
                }
            } else {
                // A home this deployment does not have: hold this region's share here.
                Placement {
                    share: view.default_share,
                    role: Role::Local,
                }
            }
        }
    }
}

/// `limit` scaled to `share`: counts are rounded down but never below 1 (a limit of 1 cannot be
/// split: prefer HOME_REGION for tiny limits); a token bucket's rate scales too, never slower
/// than refilling from empty in the longest period. The same scaling the store gives a
/// regional allowance ([`tollgate_lease::share_of`]).
pub fn scale(limit: Limit, share: f64) -> Limit {
    tollgate_lease::share_of(&limit, share)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn view(state: PeerState) -> RegionView {
        RegionView {
            own: "us".into(),
            peer: "eu".into(),
            default_share: 0.5,
            peer_state: state,
        }
    }

    fn doc(yaml_like: RegionalDoc) -> Result<RegionalPolicy, PolicyError> {
        yaml_like.validate(Algorithm::FixedWindow)
    }

    #[test]
    fn split_shares_follow_the_peer_state() {
        let policy = doc(RegionalDoc {
            policy: "SPLIT".into(),
            shares: Some([("us".into(), 0.6), ("eu".into(), 0.4)].into()),
            failover_share: Some(0.9),
            ..RegionalDoc::default()
        })
        .expect("valid");
        assert_eq!(place(&policy, Some(&view(PeerState::Up))).share, 0.6);
        assert_eq!(place(&policy, Some(&view(PeerState::Down))).share, 0.9);
        assert_eq!(place(&policy, None), Placement::LOCAL);
        assert_eq!(
            place(&RegionalPolicy::default(), Some(&view(PeerState::Up))).share,
            0.5
        );
        // Only the peer named: this region gets the rest, never more than the whole.
        let peer_only = RegionalPolicy::Split {
            shares: [("eu".into(), 0.7)].into(),
            failover_share: 1.0,
        };
        let share = place(&peer_only, Some(&view(PeerState::Up))).share;
        assert!((share - 0.3).abs() < 1e-9, "{share}");
        assert_eq!(policy.to_doc().validate(Algorithm::FixedWindow), Ok(policy));
    }

    #[test]
    fn home_region_forwards_from_the_other_region_only() {
        let policy = RegionalPolicy::HomeRegion {
            home: "eu".into(),
            fallback_share: None,
        };
        let placed = place(&policy, Some(&view(PeerState::Up)));
        assert_eq!(placed.role, Role::Forwarded { home: "eu".into() });
        assert_eq!(placed.share, 0.5);
        let home = RegionalPolicy::HomeRegion {
            home: "us".into(),
            fallback_share: Some(0.2),
        };
        assert_eq!(
            place(&home, Some(&view(PeerState::Up))),
            Placement {
                share: 1.0,
                role: Role::Home
            }
        );
    }

    #[test]
    fn invalid_policies_name_the_field() {
        let cases = [
            (
                RegionalDoc {
                    policy: "EVERYWHERE".into(),
                    ..RegionalDoc::default()
                },
                "regional.policy",
            ),
            (
                RegionalDoc {
                    policy: "SPLIT".into(),
                    shares: Some([("us".into(), 0.7), ("eu".into(), 0.7)].into()),
                    ..RegionalDoc::default()
                },
                "regional.shares",
            ),
            (
                RegionalDoc {
                    policy: "SPLIT".into(),
                    shares: Some([("us".into(), -0.1)].into()),
                    ..RegionalDoc::default()
                },
                "regional.shares.us",
            ),
            (
                RegionalDoc {
                    policy: "SPLIT".into(),
                    shares: Some([("US East".into(), 0.5)].into()),
                    ..RegionalDoc::default()
                },
                "regional.shares.US East",
            ),
            (
                RegionalDoc {
                    policy: "HOME_REGION".into(),
                    ..RegionalDoc::default()
                },
                "regional.homeRegion",
            ),
            (
                RegionalDoc {
                    policy: "ASYNC_SYNC".into(),
                    home_region: Some("eu".into()),
                    ..RegionalDoc::default()
                },
                "regional.homeRegion",
            ),
            (
                RegionalDoc {
                    policy: "SPLIT".into(),
                    failover_share: Some(f64::NAN),
                    ..RegionalDoc::default()
                },
                "regional.failoverShare",
            ),
        ];
        for (d, field) in cases {
            assert_eq!(doc(d.clone()).expect_err("invalid").field, field, "{d:?}");
        }
        let conc = RegionalDoc {
            policy: "ASYNC_SYNC".into(),
            ..RegionalDoc::default()
        };
        assert_eq!(
            conc.validate(Algorithm::Concurrency)
                .expect_err("invalid")
                .field,
            "regional.policy"
        );
    }

    #[test]
    fn scaling_rounds_down_and_keeps_at_least_one() {
        let fw = Limit::fixed_window(100, Duration::from_secs(60)).expect("limit");
        assert_eq!(scale(fw, 0.6).capacity(), 60);
        assert_eq!(scale(fw, 0.004).capacity(), 1);
        let tb = Limit::token_bucket(10, 5.0).expect("limit");
        let half = scale(tb, 0.5);
        assert_eq!((half.capacity(), half.refill_per_second()), (5, Some(2.5)));
        assert_eq!(scale(tb, 1.0), tb);
    }
}
