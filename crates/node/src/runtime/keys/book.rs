//! One identity's lease book: the leases it holds, per bucket and rule definition, and the
//! arithmetic over them: which lease unspent units go back under, which leases end by `now`,
//! when the next one does, what an older definition of a rule gives back. It takes `now` and
//! the buckets' counters and returns what to send back to the store; the key actor
//! (`keys/actor.rs`) keeps the messages, the store calls and the timers.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tollgate_lease::{BucketKey, LeaseId, Micros};

use crate::runtime::keys::bucket::Bucket;
use crate::runtime::sizing::Demand;

/// One lease held.
#[derive(Debug)]
pub(crate) struct HeldLease {
    pub(crate) id: LeaseId,
    pub(crate) units: u64,
    pub(crate) granted_at: Micros,
    pub(crate) expires_at: Micros,
}

/// Units going back to the store under one lease.
#[derive(Debug)]
pub(crate) struct Return {
    pub(crate) bucket: Arc<Bucket>,
    pub(crate) lease: LeaseId,
    pub(crate) units: u64,
    /// When the lease was granted (its consumption was recorded for the peer then).
    pub(crate) granted_at: Micros,
    /// Whether the grant was recorded for the peer region (so the return is taken back).
    pub(crate) recorded: bool,
}

/// Which leases: a rule definition's bucket. When a rule changes, the old definition's
/// leases are kept apart under their own key, never spent again, and returned when they end.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct HeldKey {
    /// The rule definition.
    uid: u64,
    /// The bucket's store key.
    key: BucketKey,
}

impl HeldKey {
    fn of(bucket: &Bucket) -> Self {
        HeldKey {
            uid: bucket.rule.uid,
            key: bucket.key.clone(),
        }
    }
}

#[derive(Debug)]
struct Held {
    bucket: Arc<Bucket>,
    /// Oldest first: units are spent oldest lease first.
    leases: VecDeque<HeldLease>,
    demand: Demand,
}

/// What an older definition of a rule gave back (see [`LeaseBook::supersede`]).
#[derive(Debug, Default)]
pub(crate) struct Superseded {
    /// Its unspent units, to return before the new definition leases.
    pub(crate) returns: Vec<Return>,
    /// Its buckets no longer held (the decision path must not find them).
    pub(crate) dropped: Vec<Arc<Bucket>>,
}

/// One identity's leases.
#[derive(Debug)]
pub(crate) struct LeaseBook {
    held: HashMap<HeldKey, Held>,
    /// How long before a lease ends its unspent units are returned (µs).
    return_margin: Micros,
}

impl LeaseBook {
    /// An empty book for leases of `ttl`: unspent units go back a tenth of it (at most
    /// 100 ms) before a lease ends.
    pub(crate) fn new(ttl: Duration) -> Self {
        Self {
            held: HashMap::new(),
            return_margin: (ttl.as_micros() as u64 / 10).min(100_000),
        }
    }

    /// How long before a lease ends its unspent units are returned (µs).
    pub(crate) fn return_margin(&self) -> Micros {
        self.return_margin
    }

    fn entry(&mut self, bucket: &Arc<Bucket>) -> &mut Held {
        self.held
            .entry(HeldKey::of(bucket))
            .or_insert_with(|| Held {
                bucket: bucket.clone(),
                leases: VecDeque::new(),
                demand: Demand::default(),
            })
    }

    /// Starts keeping `bucket` (a request or refill came for it), if not yet.
    pub(crate) fn open(&mut self, bucket: &Arc<Bucket>) {
        self.entry(bucket);
    }

    /// The demand seen on `bucket` (what sizes its leases).
    pub(crate) fn demand(&mut self, bucket: &Arc<Bucket>) -> &mut Demand {
        &mut self.entry(bucket).demand
    }

    /// This node's live leases of `bucket`.
    pub(crate) fn leases_of(&mut self, bucket: &Arc<Bucket>) -> u64 {
        self.entry(bucket).leases.len() as u64
    }

    /// Records a lease granted for `bucket` at `lease.granted_at`, asked for at `asked_at`.
    pub(crate) fn granted(&mut self, bucket: &Arc<Bucket>, lease: HeldLease, asked_at: Micros) {
        let held = self.entry(bucket);
        held.demand
            .on_grant(lease.granted_at, lease.units, asked_at);
        held.leases.push_back(lease);
    }

    /// The buckets held.
    pub(crate) fn buckets(&self) -> impl Iterator<Item = &Arc<Bucket>> {
        self.held.values().map(|h| &h.bucket)
    }

    /// Whether any lease is held.
    pub(crate) fn holds_leases(&self) -> bool {
        self.held.values().any(|h| !h.leases.is_empty())
    }

    /// Settles the leases an older definition of `bucket`'s rule holds on the same key: what
    /// they hold unspent goes back to the store (credited under the definition it was taken
    /// under) before the new definition leases anything, so a changed limit starts from the
    /// key's true count: neither the units spent under the old definition nor the ones held
    /// unspent are lost or counted twice. While a request still on an old definition waits
    /// for it (`old_waited_on`), its entry stays, empty.
    pub(crate) fn supersede(
        &mut self,
        bucket: &Arc<Bucket>,
        old_waited_on: bool,
        now: Micros,
    ) -> Superseded {
        let uid = bucket.rule.uid;
        let old: Vec<HeldKey> = self
            .held
            .keys()
            .filter(|k| k.key == bucket.key && k.uid != uid)
            .cloned()
            .collect();
        let mut out = Superseded::default();
        for name in old {
            if old_waited_on {
                let held = self.held.get_mut(&name).expect("listed above");
                let leases = std::mem::take(&mut held.leases);
                out.returns
                    .extend(unspent_returns(held.bucket.clone(), leases, now));
            } else {
                let held = self.held.remove(&name).expect("listed above");
                out.returns
                    .extend(unspent_returns(held.bucket.clone(), held.leases, now));
                out.dropped.push(held.bucket);
            }
        }
        out
    }

    /// Takes back everything `bucket` holds unspent, spread over its leases for return (see
    /// [`unspent_returns`]); its leases are gone from the book.
    pub(crate) fn give_back(&mut self, bucket: &Arc<Bucket>, now: Micros) -> Vec<Return> {
        let leases = std::mem::take(&mut self.entry(bucket).leases);
        unspent_returns(bucket.clone(), leases, now)
    }

    /// Takes back everything held unspent, every bucket (the actor stops).
    pub(crate) fn give_back_all(&mut self, now: Micros) -> Vec<Return> {
        let mut returns = vec![];
        for held in self.held.values_mut() {
            let leases = std::mem::take(&mut held.leases);
            returns.extend(unspent_returns(held.bucket.clone(), leases, now));
        }
        returns
    }

    /// Ends the leases within the return margin of their end at `now`, and takes back their
    /// share of what is unspent. Units are spent oldest lease first, so what is unspent
    /// belongs to the newest leases: an ending lease's share is what the unspent units exceed
    /// the leases after it by, at most its grant. That share goes back under its id (unless
    /// the lease has already ended: a window's units die with the window).
    pub(crate) fn expire(&mut self, now: Micros) -> Vec<Return> {
        let margin = self.return_margin;
        let mut returns = vec![];
        for held in self.held.values_mut() {
            let mut after: u64 = held.leases.iter().map(|l| l.units).sum();
            while let Some(front) = held.leases.front() {
                if front.expires_at > now + margin {
                    break;
                }
                let lease = held.leases.pop_front().expect("front exists");
                after -= lease.units;
                let unspent = held.bucket.units().max(0) as u64;
                let share = unspent.saturating_sub(after).min(lease.units);
                let taken = held.bucket.reclaim_up_to(share);
                if taken > 0 && lease.expires_at > now {
                    returns.push(Return {
                        bucket: held.bucket.clone(),
                        lease: lease.id,
                        units: taken,
                        granted_at: lease.granted_at,
                        recorded: true,
                    });
                }
            }
        }
        returns
    }

    /// When the next lease is due to be ended (its end less the return margin).
    pub(crate) fn next_expiry(&self) -> Option<Micros> {
        let margin = self.return_margin;
        self.held
            .values()
            .filter_map(|h| {
                h.leases
                    .front()
                    .map(|l| l.expires_at.saturating_sub(margin))
            })
            .min()
    }
}

/// Takes back what `bucket` holds unspent and spreads it over `leases` for return, newest
/// first (its grant is the most likely to cover what is unspent); ended leases are skipped.
fn unspent_returns(
    bucket: Arc<Bucket>,
    mut leases: VecDeque<HeldLease>,
    now: Micros,
) -> Vec<Return> {
    let mut left = bucket.reclaim();
    let mut returns = vec![];
    while let Some(lease) = leases.pop_back() {
        let give = left.min(lease.units);
        if give > 0 && lease.expires_at > now {
            returns.push(Return {
                bucket: bucket.clone(),
                lease: lease.id,
                units: give,
                granted_at: lease.granted_at,
                recorded: true,
            });
            left -= give;
        }
    }
    returns
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use ractor::{Actor, ActorProcessingErr, ActorRef};

    use super::*;
    use crate::rules::CompiledRule;
    use crate::runtime::keys::bucket::{KeyMsg, NO_DEADLINE};
    use crate::runtime::local::LocalBucket;

    const SECOND: Micros = 1_000_000;

    /// Stands in for the key actor the buckets name: the book never talks to it.
    struct Nobody;

    impl Actor for Nobody {
        type Msg = KeyMsg;
        type State = ();
        type Arguments = ();

        async fn pre_start(&self, _: ActorRef<KeyMsg>, _: ()) -> Result<(), ActorProcessingErr> {
            Ok(())
        }
    }

    async fn bucket_of(requests: u32) -> Arc<Bucket> {
        let (actor, _) = Actor::spawn(None, Nobody, ()).await.expect("spawn");
        let rule = Arc::new(
            CompiledRule::for_override(requests, Duration::from_secs(1), Default::default())
                .expect("rule"),
        );
        let limit = rule.limit().expect("limited");
        let key = BucketKey::new(b"alice", &rule.key).expect("key");
        let fallback = Arc::new(LocalBucket::for_limit(&limit, 1.0));
        Arc::new(Bucket::new(key, rule, limit, actor, None, fallback, 1))
    }

    fn lease(name: &str, units: u64, granted_at: Micros) -> HeldLease {
        HeldLease {
            id: LeaseId::forged(name),
            units,
            granted_at,
            expires_at: granted_at + SECOND,
        }
    }

    /// Grants `lease` into both the book and the bucket's counter, as the actor does.
    fn grant(book: &mut LeaseBook, bucket: &Arc<Bucket>, lease: HeldLease) {
        bucket.install(lease.units, NO_DEADLINE, lease.granted_at);
        let at = lease.granted_at;
        book.granted(bucket, lease, at);
    }

    fn returned(returns: &[Return]) -> Vec<(String, u64)> {
        returns
            .iter()
            .map(|r| (r.lease.as_str().to_string(), r.units))
            .collect()
    }

    #[tokio::test]
    async fn an_ending_lease_returns_only_what_the_leases_after_it_do_not_cover() {
        let bucket = bucket_of(100).await;
        let mut book = LeaseBook::new(Duration::from_secs(1));
        grant(&mut book, &bucket, lease("old", 10, 0));
        grant(&mut book, &bucket, lease("new", 10, SECOND / 2));
        // 12 of 20 spent: the oldest lease's units first, so 8 unspent belong to "new".
        assert!(bucket.try_take(12, || 0));
        let margin = book.return_margin();
        assert_eq!(book.next_expiry(), Some(SECOND - margin));
        assert!(book.expire(SECOND - margin - 1).is_empty(), "not due yet");
        let returns = book.expire(SECOND - margin);
        assert!(
            returns.is_empty(),
            "old is all spent: {:?}",
            returned(&returns)
        );
        assert_eq!(bucket.units(), 8);
        // 3 more spent; "new" ends with 5 unspent, all its own.
        assert!(bucket.try_take(3, || 0));
        let returns = book.expire(SECOND + SECOND / 2 - margin);
        assert_eq!(returned(&returns), [("new".to_string(), 5)]);
        assert_eq!(bucket.units(), 0);
        assert_eq!(book.next_expiry(), None);
        assert!(!book.holds_leases());
    }

    #[tokio::test]
    async fn an_ended_lease_returns_nothing_its_units_died_with_it() {
        let bucket = bucket_of(100).await;
        let mut book = LeaseBook::new(Duration::from_secs(1));
        grant(&mut book, &bucket, lease("gone", 10, 0));
        assert!(book.expire(SECOND + 1).is_empty());
        assert_eq!(bucket.units(), 0, "taken back all the same");
    }

    #[tokio::test]
    async fn giving_back_spreads_the_unspent_units_over_the_newest_leases_first() {
        let bucket = bucket_of(100).await;
        let mut book = LeaseBook::new(Duration::from_secs(1));
        grant(&mut book, &bucket, lease("a", 10, 0));
        grant(&mut book, &bucket, lease("b", 4, 10));
        grant(&mut book, &bucket, lease("c", 6, 20));
        assert!(bucket.try_take(5, || 0));
        let returns = book.give_back(&bucket, 30);
        assert_eq!(
            returned(&returns),
            [
                ("c".to_string(), 6),
                ("b".to_string(), 4),
                ("a".to_string(), 5)
            ]
        );
        assert_eq!(bucket.units(), 0);
        assert!(!book.holds_leases());
    }

    #[tokio::test]
    async fn a_changed_rule_gives_back_what_its_old_definition_holds_once() {
        let old = bucket_of(100).await;
        let mut new = bucket_of(50).await;
        // The same key under a new definition (its uid differs).
        let same_key = Bucket::new(
            old.key.clone(),
            new.rule.clone(),
            new.limit,
            new.actor.clone(),
            None,
            new.fallback.clone(),
            1,
        );
        new = Arc::new(same_key);
        assert_ne!(old.rule.uid, new.rule.uid);
        let mut book = LeaseBook::new(Duration::from_secs(1));
        grant(&mut book, &old, lease("old", 10, 0));
        assert!(old.try_take(4, || 0));

        // A request still waits on the old definition: its entry stays, emptied.
        let kept = book.supersede(&new, true, 10);
        assert_eq!(returned(&kept.returns), [("old".to_string(), 6)]);
        assert!(kept.dropped.is_empty());
        assert_eq!(book.buckets().count(), 1);

        // No longer waited on: dropped, with nothing left to give back twice.
        let dropped = book.supersede(&new, false, 20);
        assert!(dropped.returns.is_empty());
        assert_eq!(dropped.dropped.len(), 1);
        assert!(Arc::ptr_eq(&dropped.dropped[0], &old));
        assert_eq!(book.buckets().count(), 0);
    }
}
