use std::sync::Mutex;

use ractor::{Actor, ActorProcessingErr};

use super::*;

const MS: Micros = 1_000;

/// Stands in for the key actor: counts the refills the decision path asks it for, and the
/// ticks (a tick sent after them says they have all been read: a mailbox is in order).
struct Refills(Arc<Mutex<(u64, u64)>>);

impl Actor for Refills {
    type Msg = KeyMsg;
    type State = ();
    type Arguments = ();

    async fn pre_start(&self, _: ActorRef<KeyMsg>, _: ()) -> Result<(), ActorProcessingErr> {
        Ok(())
    }

    async fn handle(
        &self,
        _: ActorRef<KeyMsg>,
        msg: KeyMsg,
        _: &mut (),
    ) -> Result<(), ActorProcessingErr> {
        let mut seen = self.0.lock().expect("count");
        match msg {
            KeyMsg::Refill { .. } => seen.0 += 1,
            KeyMsg::Tick => seen.1 += 1,
            _ => {}
        }
        Ok(())
    }
}

/// The refills asked of `bucket`'s actor so far: every message sent before is read first.
async fn refills_asked(bucket: &Bucket, seen: &Mutex<(u64, u64)>) -> u64 {
    let ticks = seen.lock().expect("count").1;
    bucket.actor.cast(KeyMsg::Tick).expect("the actor is up");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (refills, read) = *seen.lock().expect("count");
        if read > ticks {
            return refills;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the actor reads its mail"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// A bucket of a fixed window of 100 a second, and the refills its actor was asked for.
async fn bucket() -> (Arc<Bucket>, Arc<Mutex<(u64, u64)>>) {
    let asked = Arc::new(Mutex::new((0, 0)));
    let (actor, _) = Actor::spawn(None, Refills(asked.clone()), ())
        .await
        .expect("spawn");
    let rule = Arc::new(
        CompiledRule::for_override(100, Duration::from_secs(1), Default::default()).expect("rule"),
    );
    let limit = rule.limit().expect("limited");
    let key = BucketKey::new(b"alice", &rule.key).expect("key");
    let fallback = Arc::new(LocalBucket::for_limit(&limit, 1.0));
    (
        Arc::new(Bucket::new(key, rule, limit, actor, None, fallback, 1)),
        asked,
    )
}

#[tokio::test]
async fn a_lease_is_taken_to_its_last_unit_and_given_back_whole() {
    let (bucket, _) = bucket().await;
    assert!(!bucket.try_take(1, || 0), "nothing leased yet");
    bucket.install(5, NO_DEADLINE, 0);
    assert!(bucket.try_take(3, || 0));
    assert!(!bucket.try_take(3, || 0), "2 left, all or nothing");
    assert!(bucket.try_take(2, || 0));
    bucket.give_back(3);
    assert_eq!(bucket.units(), 3);
    assert_eq!(bucket.reclaim(), 3, "every unit held goes back");
    assert_eq!(bucket.units(), 0);
}

#[tokio::test]
async fn a_windows_units_are_spent_only_before_it_ends_and_die_with_it() {
    let (bucket, _) = bucket().await;
    bucket.install(5, 1_000 * MS, 0);
    assert!(bucket.try_take(1, || 999 * MS));
    assert!(!bucket.try_take(1, || 1_000 * MS), "the window is over");
    assert_eq!(bucket.held_at(1_000 * MS), 0);
    // The next window's grant drops what is left of the last one first.
    bucket.install(3, 2_000 * MS, 1_000 * MS);
    assert_eq!(bucket.units(), 3);
    assert_eq!(bucket.held_at(1_500 * MS), 3);
}

#[tokio::test]
async fn a_refill_ahead_is_asked_for_once_until_it_is_done() {
    let (bucket, asked) = bucket().await;
    bucket.install(10, NO_DEADLINE, 0);
    let ahead = |_granted: u64, left: i64| left < 8;
    assert_eq!(bucket.take_local(1, 0, ahead), LocalTake::Took);
    assert_eq!(bucket.take_local(2, 0, ahead), LocalTake::Took);
    assert!(bucket.refill_pending());
    assert_eq!(bucket.take_local(1, 0, ahead), LocalTake::Took);
    assert_eq!(
        refills_asked(&bucket, &asked).await,
        1,
        "asked once, while one is pending"
    );
    bucket.refill_done();
    assert_eq!(bucket.take_local(1, 0, ahead), LocalTake::Took);
    assert_eq!(
        refills_asked(&bucket, &asked).await,
        2,
        "and again once it was done"
    );
}

#[tokio::test]
async fn the_stores_denial_answers_here_until_it_is_rechecked() {
    let (bucket, _) = bucket().await;
    bucket.deny_until(1, Duration::from_millis(500), Duration::from_millis(100), 0);
    let wait = bucket.denied_for(1, 50 * MS).expect("still denied");
    assert_eq!(wait, Duration::from_millis(450));
    assert_eq!(
        bucket.take_local(1, 50 * MS, |_, _| false),
        LocalTake::Denied(wait)
    );
    assert_eq!(
        bucket.denied_for(1, 100 * MS),
        None,
        "rechecked with the store"
    );
    bucket.deny_until(1, Duration::from_millis(500), Duration::from_millis(500), 0);
    bucket.install(1, NO_DEADLINE, 0);
    assert_eq!(
        bucket.denied_for(1, 0),
        None,
        "what this node holds covers it"
    );
    bucket.clear_denial();
    assert_eq!(bucket.denied_for(2, 0), None);
}
