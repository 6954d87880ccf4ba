//! Reserve, then settle ([docs/reserve-settle.md]): a request admitted on an estimate of its
//! cost, charged its actual cost once the response is done.
//!
//! A reservation is decided as a request is (its rules, its penalties, its fail modes), but in
//! the store itself: the store records the estimate under a fresh nonce in every bucket it
//! charged, all or nothing per identity. The settle names the same request (its descriptors
//! find the same buckets under the rules as they are then) and the nonce; the store charges
//! the actual cost once per bucket (see `tollgate_lease::ops::reservation`).
//!
//! The id is the nonce alone: 128 random bits. A forged or altered id names no reservation in
//! the buckets the request finds, so it charges nothing.
//!
//! Not covered: rules held in a peer region (HOME_REGION, outside the home region) and
//! concurrency rules are refused; a request whose buckets belong to two identities reserves
//! in each, and if the second refuses, the first keeps its estimate charged (as a direct
//! check's units are kept).

use std::collections::HashMap;
use std::time::Duration;

use tollgate_lease::{
    Algorithm, BucketKey, MAX_RESERVATION_TTL, Reserve, SettleItem, SettleRequest, Settlement,
    StoreError,
};

use super::Node;
use crate::rules::RuleKind;
use crate::runtime::decision::Route;
use crate::runtime::keys::bucket_id::BucketId;
use crate::runtime::matching;
use crate::runtime::request::{Request, RequestError};
use crate::runtime::verdict::Verdict;

/// Why a reservation or a settlement was refused.
#[derive(Debug, thiserror::Error)]
pub enum ReserveError {
    /// The request itself is not one.
    #[error(transparent)]
    Request(#[from] RequestError),
    /// A part of the reservation is not acceptable (`field` names it).
    #[error("{field}: {reason}")]
    Invalid {
        /// The field at fault (`reserve_ttl_ms`, `reservation_id`, `actual`, a rule).
        field: &'static str,
        /// Why.
        reason: String,
    },
    /// The store did not answer the settlement.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// One rule's settlement.
#[derive(Debug, Clone, PartialEq)]
pub struct RuleSettlement {
    /// The rule's id.
    pub rule: String,
    /// What the store did.
    pub settlement: Settlement,
}

/// A fresh reservation id: 128 random bits, as the store's nonce.
#[must_use]
pub fn new_id() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// The reservation id for an id the caller already has for its request (Envoy's
/// `x-request-id`): the first 128 bits of its SHA-256, so any string makes a well-formed id
/// and the reserve and the settle, made apart, name the same one. Two requests of one
/// identity that share an id share a record: the second reserve replaces the first's record
/// (both estimates stay charged, one settle refunds at most one), so a reused id can only
/// cost its client, never refund more than was charged.
pub fn reservation_id_for(request_id: impl AsRef<[u8]>) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(request_id.as_ref());
    digest[..16].iter().map(|b| format!("{b:02x}")).collect()
}

fn invalid(field: &'static str, reason: impl Into<String>) -> ReserveError {
    ReserveError::Invalid {
        field,
        reason: reason.into(),
    }
}

impl Node {
    /// Decides `request` as [`Node::check`] does, but in the store itself, reserving its cost
    /// (the estimate) for `ttl`; settle it with [`Node::settle`], the same request and the id
    /// returned (only when the request was admitted). An unsettled reservation expires charged
    /// at its estimate.
    pub async fn check_and_reserve(
        &self,
        request: &Request,
        ttl: Duration,
    ) -> Result<(Verdict, Option<String>), ReserveError> {
        self.check_and_reserve_as(request, ttl, new_id()).await
    }

    /// [`Node::check_and_reserve`] under a given id (one from [`reservation_id_for`], when
    /// the settle is made by someone who knows the request's own id but never saw this
    /// answer: Envoy's call at the end of the stream).
    pub async fn check_and_reserve_as(
        &self,
        request: &Request,
        ttl: Duration,
        id: String,
    ) -> Result<(Verdict, Option<String>), ReserveError> {
        request.validate()?;
        if ttl < Duration::from_millis(1) || ttl > MAX_RESERVATION_TTL {
            return Err(invalid(
                "reserve_ttl_ms",
                format!("1 to {} ms", MAX_RESERVATION_TTL.as_millis()),
            ));
        }
        let rules = self.inner.rules.load();
        let hits = matching::hits(&rules, request, &self.inner.decider.overrides, self.now())?;
        self.note_long_identities(&hits, &request.domain);
        for hit in &hits {
            if let RuleKind::Limited(limit) = hit.rule.kind {
                if limit.algorithm() == Algorithm::Concurrency {
                    return Err(invalid(
                        "rule",
                        format!(
                            "{} is a CONCURRENCY rule: slots are taken and released, not reserved",
                            hit.rule.id
                        ),
                    ));
                }
                if hit.rule.forwarded() {
                    return Err(invalid(
                        "rule",
                        format!(
                            "{} is held in its home region: reservations are made in this \
                             region's store only",
                            hit.rule.id
                        ),
                    ));
                }
            }
        }
        let reserve = Reserve { nonce: id, ttl };
        let now = self.now();
        let verdict = self
            .inner
            .decider
            .decide(hits, Route::Reserve(&reserve), now)
            .await;
        let id = verdict.allowed.then_some(reserve.nonce);
        Ok((verdict, id))
    }

    /// Settles the reservation `id` made for `request` at its `actual` cost, once per bucket:
    /// each limited rule the request matches now says what its store did.
    pub async fn settle(
        &self,
        request: &Request,
        id: &str,
        actual: u64,
    ) -> Result<Vec<RuleSettlement>, ReserveError> {
        request.validate()?;
        if id.is_empty()
            || id.len() > 64
            || !id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            return Err(invalid(
                "reservation_id",
                "not an id this API gave (1 to 64 of A-Z a-z 0-9 _ -)",
            ));
        }
        if actual > tollgate_lease::limit::MAX_UNITS {
            return Err(invalid(
                "actual",
                format!("at most {}", tollgate_lease::limit::MAX_UNITS),
            ));
        }
        let mut by_identity: HashMap<String, Vec<(String, SettleItem)>> = HashMap::new();
        for charge in self.charges(request)? {
            let RuleKind::Limited(limit) = charge.rule.kind else {
                continue;
            };
            if limit.algorithm() == Algorithm::Concurrency {
                continue;
            }
            let key: BucketKey = BucketId::new(&charge.rule, &charge.identity)
                .store_key()
                .map_err(|e| invalid("descriptors", e.to_string()))?;
            by_identity
                .entry(key.identity_prefix().to_owned())
                .or_default()
                .push((
                    charge.rule.id.clone(),
                    SettleItem {
                        key,
                        limit,
                        nonce: id.to_owned(),
                        actual,
                    },
                ));
        }
        // A settle is made after the response, no request waits on it: it waits for the
        // store as long as any call is waited for (the patience), not one call's budget.
        let store = &self.inner.decider.shared.store;
        let mut out = vec![];
        for (_, group) in by_identity {
            let (rules, items): (Vec<String>, Vec<SettleItem>) = group.into_iter().unzip();
            let req =
                SettleRequest::new(items).map_err(|e| invalid("descriptors", e.to_string()))?;
            let settled = store.settle(&req).await?;
            for (rule, settlement) in rules.into_iter().zip(settled) {
                self.inner
                    .decider
                    .shared
                    .metrics
                    .settlement(&rule, &settlement);
                out.push(RuleSettlement { rule, settlement });
            }
        }
        out.sort_by(|a, b| a.rule.cmp(&b.rule));
        Ok(out)
    }
}
