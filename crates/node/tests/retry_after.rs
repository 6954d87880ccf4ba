//! Retry-After is a time at which the retry can succeed, whichever part denied (the local
//! pre-limit, a lease, the store's recent denial, the store itself): a lone client that waits
//! exactly the retry-after it was given is admitted. A property over algorithms, limits, costs
//! and pre-limit settings on the in-memory store (node and store share tokio's paused clock,
//! so "exactly" is exact), and the seed's login case on a real Redis.

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use tollgate_lease::{MemoryConfig, MemoryStore, SharedClock, Store, TokioClock};
use tollgate_node::runtime::verdict::Denial;
use tollgate_node::test_support::node_on;
use tollgate_node::{Request, RuntimeConfig};

/// A rule's limit as written in a rule file.
fn limit_yaml() -> impl Strategy<Value = String> {
    prop_oneof![
        (1u32..=20, prop::sample::select(vec![0.5, 1.0, 2.0, 10.0])).prop_map(|(c, r)| format!(
            "algorithm: TOKEN_BUCKET, capacity: {c}, refillPerSecond: {r}"
        )),
        (1u32..=20, prop::sample::select(vec![0.5, 1.0, 3.0, 10.0]))
            .prop_map(|(b, r)| format!("algorithm: GCRA, burst: {b}, ratePerSecond: {r}")),
        (
            1u32..=20,
            1u32..=20,
            prop::sample::select(vec!["1s", "7s", "1m"])
        )
            .prop_map(|(b, l, d)| format!(
                "algorithm: LEAKY_BUCKET, limit: {l}, duration: {d}, burst: {b}"
            )),
        (
            prop::sample::select(vec!["FIXED_WINDOW", "SLIDING_WINDOW", "SLIDING_WINDOW_LOG"]),
            1u32..=20,
            prop::sample::select(vec!["1s", "10s", "1m"])
        )
            .prop_map(|(a, l, w)| format!("algorithm: {a}, limit: {l}, window: {w}")),
    ]
}

/// One client step: wait this long, then send a request of this cost.
fn steps() -> impl Strategy<Value = Vec<(u64, u64)>> {
    prop::collection::vec(
        (
            prop::sample::select(vec![0u64, 0, 0, 1, 50, 300, 1_000, 7_000]),
            1u64..=3,
        ),
        1..40,
    )
}

async fn lone_client(
    limit: &str,
    prelimit: Option<f64>,
    start_us: u64,
    steps: &[(u64, u64)],
) -> Result<(), String> {
    // A fixed start (window boundaries are aligned to the epoch) makes a case repeatable.
    let clock: SharedClock = Arc::new(TokioClock::starting_at(start_us));
    let memory = MemoryStore::with_clock(clock.clone(), MemoryConfig::default());
    let rules = format!("domain: d\nrules:\n  - {{id: r, match: {{user: '*'}}, {limit}}}\n");
    let config = RuntimeConfig {
        prelimit_factor: prelimit,
        ..RuntimeConfig::default()
    };
    let node = node_on(Store::Memory(memory), &rules, config, clock).await;
    let mut denials = 0;
    for (i, &(gap_ms, cost)) in steps.iter().enumerate() {
        // sleep, not advance: on paused time the runtime jumps from timer to timer, so the
        // node's own timers (lease returns) fire on time while the client waits.
        tokio::time::sleep(Duration::from_millis(gap_ms)).await;
        let request = Request::new("d").descriptor([("user", "u")]).cost(cost);
        let verdict = node.check(&request).await.map_err(|e| e.to_string())?;
        if verdict.allowed {
            continue;
        }
        match verdict.denial() {
            Some(Denial::OverLimit) => {}
            Some(Denial::CostExceedsLimit) => continue,
            other => return Err(format!("step {i}: denied as {other:?}")),
        }
        denials += 1;
        let retry = verdict.retry_after;
        if retry.is_zero() {
            return Err(format!("step {i}: denied with no retry-after"));
        }
        tokio::time::sleep(retry).await;
        let again = node.check(&request).await.map_err(|e| e.to_string())?;
        if !again.allowed {
            return Err(format!(
                "step {i}: cost {cost} denied, retried exactly {retry:?} later and denied again \
                 (then told {:?}); {denials} denials so far; pre-limit denials {}; first {:?}; then {:?}",
                again.retry_after,
                node.metrics().prelimit_denied.get(),
                verdict
                    .statuses
                    .iter()
                    .map(|s| (s.outcome, s.remaining, s.retry_after))
                    .collect::<Vec<_>>(),
                again
                    .statuses
                    .iter()
                    .map(|s| (s.outcome, s.remaining, s.retry_after))
                    .collect::<Vec<_>>(),
            ));
        }
    }
    node.shutdown().await;
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn a_lone_client_retrying_at_retry_after_is_admitted(
        limit in limit_yaml(),
        prelimit in prop::sample::select(vec![None, Some(0.5), Some(1.0), Some(2.0)]),
        start_us in 1_800_000_000_000_000u64..1_800_000_060_000_000,
        steps in steps(),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .expect("runtime");
        let outcome = runtime.block_on(lone_client(&limit, prelimit, start_us, &steps));
        if let Err(failure) = outcome {
            prop_assert!(false, "{limit}, pre-limit {prelimit:?}: {failure}");
        }
    }
}
