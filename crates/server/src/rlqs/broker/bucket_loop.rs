//! One shared bucket's loop: a tick every `config.tick` (or at once when a stream joins) that
//! forgets what the Envoys forgot, draws what the shares will admit from the rule's bucket
//! through the node, shares it out (`plan.rs`) and pushes what changed.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tollgate_node::runtime::{Charge, Node};
use tollgate_proto::envoy::service::rate_limit_quota::v3::BucketId;
use tollgate_proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use tollgate_proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    AbandonAction, QuotaAssignmentAction,
};
use tollgate_proto::envoy::r#type::v3::RateLimitStrategy;
use tollgate_proto::envoy::r#type::v3::TokenBucket;
use tollgate_proto::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy as Wire};

use crate::rlqs::plan::{
    BucketState, Decided, Plan, burst_each, closed_rate, fresh_streams, open_streams, paid_ahead,
    pay, share_out, targets, uniform,
};
use crate::rlqs::shares::Strategy;
use crate::rlqs::streams::{BUCKET_BYTES, SHARE_BYTES, StreamHandle};

use super::{BucketKey, Inner, RlqsConfig, SharedBucket};
pub(super) fn rules_of(node: &Node, key: &BucketKey) -> Vec<(String, String)> {
    node.charges(&key.request())
        .map(|charges| {
            charges
                .iter()
                .map(|c| (c.rule.domain.clone(), c.rule.id.clone()))
                .collect()
        })
        .unwrap_or_default()
}

/// A bucket's loop: a tick every `config.tick`, or at once when a stream joins.
pub(super) async fn run(inner: Arc<Inner>, bucket: Arc<SharedBucket>) {
    let mut interval = tokio::time::interval(inner.config.tick);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut stopping = inner.stopping.subscribe();
    loop {
        tokio::select! {
            _ = interval.tick() => {}
            _ = bucket.wake.notified() => {}
            _ = stopping.wait_for(|s| *s) => return,
        }
        if !tick(&inner, &bucket).await {
            return;
        }
    }
}

/// Drops the shares whose streams no longer hold the bucket: an open stream that reported no
/// request `idle_reports` times in a row, or has not reported the bucket for `stale_after`, is
/// told to abandon it (its Envoy forgets the bucket at once); if its answers are not read, it
/// keeps the share only until its assignment has run out, as a closed stream does (the Envoy
/// may still enforce it). Their budget goes back; returns how many were told to abandon.
fn forget(inner: &Inner, bucket: &SharedBucket, state: &mut BucketState, now: Instant) -> u64 {
    let config = &inner.config;
    let mut abandoned = 0;
    let mut freed: Vec<(Arc<StreamHandle>, usize)> = vec![];
    state.streams.retain(|_, share| {
        if share.open {
            let stale = now.saturating_duration_since(share.last_report) >= config.stale_after;
            if share.idle_reports >= config.idle_reports || stale {
                if share.stream.send(&bucket.key, abandon(bucket.key.id())) {
                    abandoned += 1;
                    freed.push((share.stream.clone(), share.bytes));
                    return false;
                }
                // Its stream is over: paid until its TTL.
                share.open = false;
            }
            return true;
        }
        let keep = share.expires_at.is_some_and(|at| at > now);
        if !keep {
            freed.push((share.stream.clone(), share.bytes));
        }
        keep
    });
    for (stream, bytes) in freed {
        stream.give_back(bytes);
        inner.budget.give_back(SHARE_BYTES);
    }
    abandoned
}

/// One tick of a bucket; false when the bucket has no stream left and is gone.
async fn tick(inner: &Inner, bucket: &SharedBucket) -> bool {
    let config = &inner.config;
    let now = Instant::now();
    let metrics = &inner.node.metrics().rlqs;
    let charges = inner
        .node
        .charges(&bucket.key.request())
        .unwrap_or_default();
    let rules: Vec<(String, String)> = charges
        .iter()
        .map(|c| (c.rule.domain.clone(), c.rule.id.clone()))
        .collect();
    let plan = Plan::of(charges);
    // What the streams want, and what to draw for it; the streams it is drawn for (one that
    // joins while the draw is out is shared out at the next tick, see `share_out`).
    let mut drawn_for = HashSet::new();
    let draws = {
        let mut state = bucket.state.lock();
        state.rules = rules;
        let abandoned = forget(inner, bucket, &mut state, now);
        metrics.abandons.inc_by(abandoned);
        if state.streams.is_empty() {
            state.gone = true;
            drop(state);
            let mut buckets = inner.buckets.lock();
            buckets.remove(&bucket.key);
            inner.budget.give_back(BUCKET_BYTES + bucket.key.bytes());
            metrics.buckets.set(buckets.len() as i64);
            return false;
        }
        match &plan {
            Plan::AllowAll | Plan::DenyAll => None,
            Plan::Shares {
                charges,
                rate,
                capacity,
            } => {
                let ahead = paid_ahead(&state, now);
                let target = targets(&state, *rate).iter().map(|(_, t)| *t).sum::<f64>()
                    + closed_rate(&state) as f64;
                let target = target.min(*rate);
                let fresh = fresh_streams(&state);
                let bursts = (fresh as f64) * burst_each(*capacity, open_streams(&state));
                drawn_for.extend(state.streams.keys().copied());
                Some(
                    charges
                        .iter()
                        .map(|c| {
                            let credit = state.credit.get(&c.rule.key).copied().unwrap_or(0.0);
                            let need = target * config.tick.as_secs_f64() + bursts - ahead - credit;
                            let want = if need >= 1.0 { need.ceil() as u64 } else { 0 };
                            (c.clone(), want.min(*capacity))
                        })
                        .collect::<Vec<_>>(),
                )
            }
        }
    };
    // Draw, outside the lock: each rule's bucket gives what it has, up to what is wanted.
    let mut drawn = vec![];
    if let Some(draws) = draws {
        for (charge, want) in draws {
            if want > 0 {
                // Boxed: the decision path's future is large, and a bucket's task would
                // otherwise hold room for it between ticks (thousands of idle buckets).
                let got = Box::pin(draw(&inner.node, &charge, want)).await;
                drawn.push((charge.rule.key.clone(), got));
            }
        }
    }
    let mut state = bucket.state.lock();
    for (rule, got) in drawn {
        *state.credit.entry(rule).or_insert(0.0) += got as f64;
    }
    match plan {
        Plan::AllowAll | Plan::DenyAll => {
            let strategy = if matches!(plan, Plan::AllowAll) {
                Strategy::AllowAll
            } else {
                Strategy::DenyAll
            };
            let decided = uniform(&state, strategy);
            push(&mut state, &bucket.key, decided, now, config, metrics);
        }
        Plan::Shares {
            charges,
            rate,
            capacity,
        } => {
            let decided = share_out(
                &state,
                &charges,
                rate,
                capacity,
                now,
                config.tick,
                &drawn_for,
            );
            let fills = push(&mut state, &bucket.key, decided, now, config, metrics);
            pay(&mut state, &charges, fills, now, config.tick);
        }
    }
    true
}

/// Takes up to `want` units from `charge`'s bucket: all of them if it has them, else what it
/// says remains (two store checks, each all or nothing). Returns what was taken.
async fn draw(node: &Node, charge: &Charge, want: u64) -> u64 {
    let verdict = node.draw(charge, want).await;
    if verdict.allowed {
        return want;
    }
    let left = verdict.statuses.first().map_or(0, |s| s.remaining);
    let remaining = left.min(want - 1);
    if remaining > 0 && node.draw(charge, remaining).await.allowed {
        remaining
    } else {
        0
    }
}

fn duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    }
}

/// The wire form of `strategy` for bucket `id`, to live `ttl`.
fn assignment(id: BucketId, strategy: Strategy, ttl: Duration) -> BucketAction {
    let wire = match strategy {
        Strategy::AllowAll => Wire::BlanketRule(BlanketRule::AllowAll as i32),
        Strategy::DenyAll => Wire::BlanketRule(BlanketRule::DenyAll as i32),
        Strategy::TokenBucket {
            max_tokens,
            per_second,
        } => Wire::TokenBucket(TokenBucket {
            max_tokens,
            tokens_per_fill: Some(per_second),
            // Whole seconds: Envoy 1.40 divides by the seconds, and compares only the nanos.
            fill_interval: Some(duration(Duration::from_secs(1))),
            name: String::new(),
        }),
    };
    BucketAction {
        bucket_id: Some(id),
        bucket_action: Some(
            tollgate_proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction::QuotaAssignmentAction(
                QuotaAssignmentAction {
                    // Whole seconds, at least one: an unset or sub-second TTL expires at once.
                    assignment_time_to_live: Some(duration(Duration::from_secs(
                        ttl.as_secs().max(1),
                    ))),
                    rate_limit_strategy: Some(RateLimitStrategy {
                        strategy: Some(wire),
                    }),
                },
            ),
        ),
    }
}

pub(super) fn abandon(id: BucketId) -> BucketAction {
    BucketAction {
        bucket_id: Some(id),
        bucket_action: Some(
            tollgate_proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction::AbandonAction(
                AbandonAction {},
            ),
        ),
    }
}

/// Sends each open stream its strategy when it changed or its TTL is due for renewal: lower
/// shares first, so the sum stays within the limit while shares move. A higher share is sent
/// at most once a second (it can wait; a lower one cannot). Returns the first fills sent.
fn push(
    state: &mut BucketState,
    key: &Arc<BucketKey>,
    decided: Vec<Decided>,
    now: Instant,
    config: &RlqsConfig,
    metrics: &tollgate_node::metrics::rlqs::RlqsMetrics,
) -> f64 {
    let mut due: Vec<(Decided, bool)> = decided
        .into_iter()
        .filter_map(|d| {
            let share = state.streams.get(&d.stream)?;
            let since = now.saturating_duration_since(share.pushed_at);
            let old = share.strategy.and_then(|s| s.per_second());
            let new = d.strategy.per_second();
            let lower = old.is_some_and(|old| new.unwrap_or(0) < old);
            let higher = matches!((old, new), (Some(old), Some(new)) if new > old);
            let changed = share.strategy != Some(d.strategy);
            let send = (changed && (!higher || since >= Duration::from_secs(1)))
                || since >= config.renew_after;
            send.then_some((d, lower))
        })
        .collect();
    due.sort_by_key(|(_, lower)| !lower);
    let mut fills = 0.0;
    for (d, _) in due {
        let Some(share) = state.streams.get_mut(&d.stream) else {
            continue;
        };
        if !share.open {
            continue;
        }
        // An unchanged higher share not yet due keeps the old one, renewed.
        let strategy = d.strategy;
        tracing::debug!(stream = d.stream, bucket = ?key.entries, ?strategy, "RLQS assignment");
        if share
            .stream
            .send(key, assignment(key.id(), strategy, config.assignment_ttl))
        {
            share.strategy = Some(strategy);
            share.pushed_at = now;
            share.expires_at = Some(now + config.assignment_ttl);
            fills += d.fill;
            metrics.assignments.inc();
        }
    }
    fills
}
