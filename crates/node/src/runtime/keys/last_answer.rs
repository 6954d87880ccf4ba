//! What the store last said of one bucket (what remains globally, when it is full again, how
//! many nodes hold leases of it) and what this node admitted without the store since: what a
//! client is told remains, and what the node decides by while the store has stalled (its share
//! of the last answer, owed to the store and debited there when it answers).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tollgate_lease::{Algorithm, Limit, Micros};

/// What the store last said of a bucket, and what was admitted without it since.
#[derive(Debug)]
pub struct LastAnswer {
    limit: Limit,
    /// Whether the two regions share the limit (the peer spends on it too).
    shared_by_regions: bool,
    /// What the store said remains globally, when it said so, and when the bucket would be
    /// full (node clock, µs).
    global_remaining: AtomicU64,
    /// How many nodes hold leases of the bucket, this one included, as the store last told
    /// (at least `min_holders`): a node deciding on the store's last answer takes its share
    /// of it.
    holders: AtomicU64,
    /// The nodes said to share the limits (`--cluster-nodes`): a node that answered first, when
    /// the others had not yet asked, still divides by them.
    min_holders: u64,
    observed_at: AtomicU64,
    /// Whether the store has answered for this bucket yet: before it has, this node knows
    /// nothing of what other nodes spent, and has no share of anything to decide by.
    heard: AtomicBool,
    full_at: AtomicU64,
    /// Units admitted while the store had stalled (by a fail mode, or on its last answer),
    /// not yet debited in the store; and when the latest of them was admitted (node clock, µs:
    /// a window's debit lands in the window they were admitted in).
    owed: AtomicU64,
    owed_at: AtomicU64,
    /// When the earliest of the units owed was admitted (`u64::MAX`: none owed): a late
    /// grant pays only for units admitted in its own window.
    owed_since: AtomicU64,
    /// Units the lease call out for this bucket asked the store for (0: none out).
    asked: AtomicU64,
}

impl LastAnswer {
    /// Nothing said yet: the whole capacity remains; `nodes` the nodes said to share the
    /// limits.
    pub fn new(limit: Limit, shared_by_regions: bool, nodes: u32) -> Self {
        let min_holders = u64::from(nodes.max(1));
        Self {
            global_remaining: AtomicU64::new(limit.capacity()),
            limit,
            shared_by_regions,
            holders: AtomicU64::new(min_holders),
            min_holders,
            observed_at: AtomicU64::new(0),
            heard: AtomicBool::new(false),
            full_at: AtomicU64::new(0),
            owed: AtomicU64::new(0),
            owed_at: AtomicU64::new(0),
            owed_since: AtomicU64::new(NONE_OWED),
            asked: AtomicU64::new(0),
        }
    }

    /// A lease call asking for `want` units of the bucket went out.
    pub(crate) fn asking(&self, want: u64) {
        self.asked.store(want, Ordering::Release);
    }

    /// The lease call out for the bucket ended (answered or failed).
    pub(crate) fn asked_done(&self) {
        self.asked.store(0, Ordering::Release);
    }

    /// Records that units now owed were admitted at `now`.
    fn owe(&self, now: Micros) {
        self.owed_at.fetch_max(now, Ordering::AcqRel);
        self.owed_since.fetch_min(now, Ordering::AcqRel);
    }

    /// Estimated units left globally at `now`: what the store last said (a token bucket
    /// refilled since), plus what this node holds (`held`), less what was admitted without the store
    /// since; at most the capacity.
    pub fn remaining(&self, held: i64, now: Micros) -> u64 {
        (self.refilled_estimate(now) as i64 + held - self.owed.load(Ordering::Acquire) as i64)
            .clamp(0, self.limit.capacity() as i64) as u64
    }

    /// What the store last said remains, a token bucket refilled since at its rate (what a
    /// client is told remains).
    fn refilled_estimate(&self, now: Micros) -> u64 {
        let mut store = self.global_remaining.load(Ordering::Relaxed);
        if let Some(rate) = self.limit.refill_per_second() {
            let since = now.saturating_sub(self.observed_at.load(Ordering::Relaxed));
            store = store.saturating_add((rate * since as f64 / 1e6).floor() as u64);
        }
        store.min(self.limit.capacity())
    }

    /// Whether the store has answered for this bucket yet (see [`LastAnswer::decide_while_slow`]).
    pub fn heard(&self) -> bool {
        self.heard.load(Ordering::Acquire)
    }

    /// Estimated time until the bucket is full.
    pub fn reset_after(&self, now: Micros) -> Duration {
        Duration::from_micros(self.full_at.load(Ordering::Relaxed).saturating_sub(now))
    }

    /// A fail mode admitted `cost` while the store had stalled: owed to the store, and debited
    /// there when it answers (see the key actor's `settle_owed`).
    pub fn admitted_without_store(&self, cost: u64, now: Micros) {
        self.owed.fetch_add(cost, Ordering::AcqRel);
        self.owe(now);
    }

    /// Gives back units owed for a request that was denied elsewhere.
    pub fn refund_owed(&self, cost: u64) {
        let _ = self
            .owed
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |owed| {
                Some(owed.saturating_sub(cost))
            });
    }

    /// Pays up to `granted` of what is owed out of a grant that just arrived: the call was out
    /// while the node admitted on its share, and the store granted it from the same
    /// remainder the share was taken of. Spent from the grant, those units are counted once;
    /// debited on top of it, the remainder would be spent twice. A window's grant pays only
    /// for units admitted in its own window (see [`LastAnswer::grant_covers_since`]; the others
    /// are debited in theirs). Returns the units paid.
    pub(crate) fn pay_owed_from_grant(
        &self,
        granted: u64,
        reset_after: Duration,
        now: Micros,
    ) -> u64 {
        let Some(since) = self.grant_covers_since(reset_after, now) else {
            return 0;
        };
        if self.owed_since.load(Ordering::Acquire) < since {
            return 0;
        }
        let mut paid = 0;
        let _ = self
            .owed
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |owed| {
                paid = owed.min(granted);
                Some(owed - paid)
            });
        if self.owed.load(Ordering::Acquire) == 0 {
            self.owed_since.store(NONE_OWED, Ordering::Release);
        }
        paid
    }

    /// The earliest admission a grant answered at `now` (with the store's `reset_after`) can
    /// pay for: any, for the algorithms that refill; the start of the grant's window for a
    /// fixed or sliding window (the store says when it ends; said at the call, read later,
    /// the estimate is late, never early); None for a log or a concurrency limit, whose
    /// units are debited where they were admitted.
    fn grant_covers_since(&self, reset_after: Duration, now: Micros) -> Option<Micros> {
        let w = self.limit.window().map_or(0, |w| w.as_micros() as u64);
        let end = now + reset_after.as_micros() as u64;
        let algorithm = self.limit.algorithm();
        if algorithm.refills() {
            return Some(0);
        }
        match algorithm {
            Algorithm::FixedWindow => Some(end.saturating_sub(w)),
            // Its count is of the window that ends a window before the bucket is full again.
            Algorithm::SlidingWindow => Some(end.saturating_sub(2 * w)),
            _ => None,
        }
    }

    /// The store could not be reached (down, not late): what was admitted without it is
    /// forgiven; how many units.
    pub(crate) fn forgive_owed(&self) -> u64 {
        self.owed_since.store(NONE_OWED, Ordering::Release);
        self.owed.swap(0, Ordering::AcqRel)
    }

    /// Takes what is owed to the store, to debit it: the units and when the latest of them
    /// was admitted. What the store last said remains no longer counts them.
    pub(crate) fn take_owed(&self) -> Option<(u64, Micros)> {
        let units = self.owed.swap(0, Ordering::AcqRel);
        self.owed_since.store(NONE_OWED, Ordering::Release);
        if units == 0 {
            return None;
        }
        let _ = self
            .global_remaining
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| {
                Some(r.saturating_sub(units))
            });
        Some((units, self.owed_at.load(Ordering::Acquire)))
    }

    /// Records what the store said about the bucket, and how many nodes hold leases of it
    /// (`holders`, this one included): what the node decides by while the store has stalled
    /// (see [`LastAnswer::decide_while_slow`]).
    pub(crate) fn observe(&self, remaining: u64, reset_after: Duration, holders: u64, now: Micros) {
        self.global_remaining.store(remaining, Ordering::Relaxed);
        self.holders
            .store(holders.max(self.min_holders), Ordering::Relaxed);
        self.observed_at.store(now, Ordering::Relaxed);
        self.heard.store(true, Ordering::Release);
        self.full_at
            .store(now + reset_after.as_micros() as u64, Ordering::Relaxed);
    }

    /// What this node takes to remain of the bucket in the store while the store does not
    /// answer: what the store last said (units held by nodes not counted), with no refill
    /// since (refill is shared with every other node, and another region's nodes refill their
    /// own views at the same rate: credited to this node, it would be spent twice); the whole
    /// capacity once the bucket would be full again (for a rule the two regions share, half of
    /// it: the peer spends on the same limit); nothing when the store never said. Others' spending
    /// since can only make it less.
    fn stalled_estimate(&self, now: Micros) -> u64 {
        if !self.heard() {
            // Never answered: every fresh node would take the whole capacity for its own, and
            // together they would spend it several times over (two fresh nodes on one stalled
            // first call admitted 101 against an exact bound of 80). Nothing to share.
            return 0;
        }
        if now >= self.full_at.load(Ordering::Relaxed) {
            let capacity = self.limit.capacity();
            return if self.shared_by_regions {
                capacity / 2
            } else {
                capacity
            };
        }
        self.global_remaining
            .load(Ordering::Relaxed)
            .min(self.limit.capacity())
    }

    /// Decides `cost` while the store has stalled (or did not answer within the patience):
    /// admitted if this node's share of the most that can remain in the store (see
    /// [`LastAnswer::stalled_estimate`]) covers it and everything admitted so without the store;
    /// owed, and debited in the store when it answers. The share is that remainder divided by
    /// the nodes holding leases of the bucket (see [`share_of`]): nodes deciding on the same
    /// answer do not each spend all of it, so a stalled store gives an undershoot, never an
    /// N-fold overshoot. While this node's lease call for the bucket is out, the share is at
    /// most what that call asked for: the store runs the call when it can, before any call
    /// another node sends later, and its grant pays for what was admitted meanwhile (other
    /// nodes, answered, lease the rest of the remainder; a share of all of it would overlap
    /// their leases). Denied, the wait until the share covers the cost.
    pub fn decide_while_slow(&self, cost: u64, now: Micros) -> Result<(), Duration> {
        if !self.heard() {
            // No answer to take a share of (see `stalled_estimate`): denied, to try again
            // shortly, when the first answer will most likely be in.
            return Err(NOT_HEARD_RETRY);
        }
        let holders = self.holders.load(Ordering::Relaxed);
        let share = share_of(self.stalled_estimate(now), holders);
        let share = match self.asked.load(Ordering::Acquire) {
            0 => share,
            asked => share.min(asked),
        };
        let taken = self
            .owed
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |owed| {
                (owed + cost <= share).then_some(owed + cost)
            });
        match taken {
            Ok(_) => {
                self.owe(now);
                Ok(())
            }
            Err(owed) => {
                let missing = (owed + cost).saturating_sub(share);
                let wait = match self.limit.refill_per_second() {
                    // This node's share of the refill covers what is missing.
                    Some(rate) => Duration::from_secs_f64(missing as f64 * holders as f64 / rate),
                    None => self.reset_after(now),
                };
                Err(wait.max(Duration::from_millis(1)))
            }
        }
    }
}

/// `owed_since` when nothing is owed.
const NONE_OWED: Micros = u64::MAX;

/// How long a request denied for want of any answer from the store is told to wait.
const NOT_HEARD_RETRY: Duration = Duration::from_secs(1);

/// One node's share of `remaining` units when `holders` nodes (at least 1) may spend them on
/// the same answer: rounded down, so that the shares never add up to more than there is.
pub fn share_of(remaining: u64, holders: u64) -> u64 {
    remaining / holders.max(1)
}

/// How many nodes hold leases of a bucket, this one included, from the store's count of live
/// leases (`live_leases`, each node holding at least one, some several) and this node's own
/// (`own`): the other nodes hold at most `live_leases - own`. Counting a node that holds two
/// leases twice undershoots; never counting one too few keeps the shares within the remainder.
pub fn holders_of(live_leases: u64, own: u64) -> u64 {
    1 + live_leases.saturating_sub(own)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_of_a_last_answer_never_add_up_to_more_than_it() {
        for remaining in 0..200 {
            for holders in 1..12 {
                let share = share_of(remaining, holders);
                assert!(share * holders <= remaining, "{remaining} over {holders}");
                assert!(
                    remaining - share * holders < holders,
                    "{remaining} over {holders}"
                );
            }
        }
        assert_eq!(share_of(50, 0), 50, "at least this node holds it");
    }

    #[test]
    fn a_bucket_the_store_never_answered_for_has_no_share_to_decide_by() {
        let limit = Limit::token_bucket(50, 10.0).expect("limit");
        // Two fresh nodes, each believing itself alone, on one stalled first call.
        let nodes = [
            LastAnswer::new(limit, false, 1),
            LastAnswer::new(limit, false, 1),
        ];
        let admitted: usize = nodes
            .iter()
            .map(|n| {
                (0..100)
                    .filter(|_| n.decide_while_slow(1, 1_000).is_ok())
                    .count()
            })
            .sum();
        assert_eq!(admitted, 0, "nothing admitted on an answer never given");
        assert_eq!(
            nodes[0].decide_while_slow(1, 1_000),
            Err(NOT_HEARD_RETRY),
            "told to try again shortly, not after the rule's refill"
        );
        // Once the store answered, a node decides on its share of what it said.
        nodes[0].observe(40, Duration::from_secs(1), 2, 2_000);
        let admitted = (0..100)
            .filter(|_| nodes[0].decide_while_slow(1, 3_000).is_ok())
            .count();
        assert_eq!(admitted, 20);
    }

    #[test]
    fn owed_units_are_paid_from_a_late_grant_before_any_debit() {
        let limit = Limit::token_bucket(100, 0.001).expect("limit");
        let last = LastAnswer::new(limit, false, 1);
        last.observe(20, Duration::from_secs(3600), 2, 1_000);
        // The lease call is out; the node admits its share of the 20 (10).
        let admitted = (0..20)
            .filter(|_| last.decide_while_slow(1, 2_000).is_ok())
            .count();
        assert_eq!(admitted, 10);
        // The late grant (6 units, from the same 20) pays 6 of them; only 4 are debited.
        let hour = Duration::from_secs(3600);
        assert_eq!(last.pay_owed_from_grant(6, hour, 3_000), 6);
        assert_eq!(last.take_owed().map(|(units, _)| units), Some(4));
        // A grant larger than what is owed pays it all and leaves nothing to debit.
        assert!(last.decide_while_slow(3, 3_000).is_ok());
        assert_eq!(last.pay_owed_from_grant(50, hour, 4_000), 3);
        assert_eq!(last.take_owed(), None);
    }

    #[test]
    fn while_a_lease_call_is_out_the_share_is_what_it_asked_for() {
        let limit = Limit::fixed_window(100, Duration::from_secs(3600)).expect("limit");
        let last = LastAnswer::new(limit, false, 1);
        // The store said 56 remain, two holders: a share of 28. The call out asked for 6.
        last.observe(56, Duration::from_secs(3000), 2, 1_000);
        last.asking(6);
        let admitted = (0..40)
            .filter(|_| last.decide_while_slow(1, 2_000).is_ok())
            .count();
        assert_eq!(admitted, 6, "no more than the call out will bring");
        // Its grant, in the same window, pays for them: nothing is left to debit.
        last.asked_done();
        assert_eq!(
            last.pay_owed_from_grant(6, Duration::from_secs(2999), 3_000),
            6
        );
        assert_eq!(last.take_owed(), None);
    }

    #[test]
    fn a_windows_grant_pays_only_for_what_was_admitted_in_its_window() {
        let w = Duration::from_secs(10);
        let limit = Limit::fixed_window(100, w).expect("limit");
        let last = LastAnswer::new(limit, false, 1);
        last.observe(50, Duration::from_secs(1), 1, 0);
        // Admitted at 0.9 s, in the window that ends at 1 s.
        assert!(last.decide_while_slow(5, 900_000).is_ok());
        // Granted at 1.2 s from the next window (it ends in 9.8 s): it does not pay for them.
        assert_eq!(
            last.pay_owed_from_grant(20, Duration::from_millis(9_800), 1_200_000),
            0
        );
        assert_eq!(
            last.take_owed(),
            Some((5, 900_000)),
            "debited in their own window"
        );
        // A log's grant never pays: its units are debited where they were admitted.
        let log = LastAnswer::new(Limit::sliding_window_log(100, w).expect("limit"), false, 1);
        log.observe(50, Duration::from_secs(1), 1, 0);
        assert!(log.decide_while_slow(5, 900_000).is_ok());
        assert_eq!(log.pay_owed_from_grant(20, w, 1_000_000), 0);
    }

    #[test]
    fn the_other_holders_are_counted_from_the_live_leases_less_this_nodes_own() {
        // Alone with two live leases of its own.
        assert_eq!(holders_of(2, 2), 1);
        // Three others, one lease each, beside this node's one.
        assert_eq!(holders_of(4, 1), 4);
        // A node that holds two leases counts twice: an undershoot, never an overshoot.
        assert_eq!(holders_of(3, 1), 3);
        // A store that counted fewer than this node holds (a lease just expired there).
        assert_eq!(holders_of(1, 2), 1);
    }
}
