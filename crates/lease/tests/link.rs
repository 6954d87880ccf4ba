//! The linked store (the in-memory store behind a link the simulations fault): a link that is
//! down refuses at once, a stalled one holds calls (the caller's budget ends its wait, the
//! command still runs on resume), a slow one adds latency, a failover forgets the state, and
//! the ledger books what each answer handed out and took back.

use std::sync::Arc;
use std::time::Duration;

use tollgate_lease::{
    BucketKey, CheckRequest, Latency, LeaseAsk, LeaseRequest, LeaseStore, Limit, LinkCondition,
    LinkedStore, MemoryConfig, MemoryStore, StoreError, TokioClock,
};

fn store() -> LinkedStore {
    let memory = MemoryStore::with_clock(
        Arc::new(TokioClock::starting_at(1_000_000)),
        MemoryConfig::default(),
    );
    let linked = LinkedStore::new(memory, Latency::fixed(Duration::from_millis(2)), 7);
    linked.keep_ledger();
    linked
}

fn key() -> BucketKey {
    BucketKey::new(b"user-1", "r").expect("key")
}

fn one(limit: Limit) -> CheckRequest {
    CheckRequest::single(key(), limit, 1).expect("request")
}

#[tokio::test(start_paused = true)]
async fn a_call_takes_its_latency_and_a_slow_link_adds_to_it() {
    let s = store();
    let limit = Limit::token_bucket(10, 1.0).expect("limit");
    let t = tokio::time::Instant::now();
    assert!(s.check(&one(limit)).await.expect("answers").allowed());
    assert_eq!(t.elapsed(), Duration::from_millis(2));
    s.link()
        .set_condition(LinkCondition::Slow(Duration::from_millis(30)));
    let t = tokio::time::Instant::now();
    s.check(&one(limit)).await.expect("answers");
    assert_eq!(t.elapsed(), Duration::from_millis(32));
    assert_eq!(
        s.link()
            .calls()
            .check
            .load(std::sync::atomic::Ordering::Relaxed),
        2
    );
}

#[tokio::test(start_paused = true)]
async fn a_link_that_is_down_refuses_at_once() {
    let s = store();
    s.link().set_condition(LinkCondition::Down);
    let t = tokio::time::Instant::now();
    let e = s
        .check(&one(Limit::token_bucket(10, 1.0).expect("limit")))
        .await
        .expect_err("refused");
    assert!(matches!(e, StoreError::Refused(_)), "{e}");
    assert_eq!(t.elapsed(), Duration::ZERO);
    assert_eq!(
        s.link()
            .calls()
            .refused
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
}

#[tokio::test(start_paused = true)]
async fn a_stalled_link_times_out_its_callers_and_runs_their_commands_on_resume() {
    let s = store();
    let budgeted = s.with_budget(Duration::from_millis(5));
    let limit = Limit::token_bucket(1, 0.001).expect("limit");
    s.link().set_condition(LinkCondition::Stalled);
    let e = budgeted.check(&one(limit)).await.expect_err("times out");
    assert!(matches!(e, StoreError::Timeout { .. }), "{e}");
    // Redis resumes and runs the command its caller gave up on: the one unit is spent.
    s.link().set_condition(LinkCondition::Up);
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(
        !s.check(&one(limit)).await.expect("answers").allowed(),
        "spent on resume"
    );
    assert_eq!(
        s.link().ledger_of(key().as_str()).map(|l| l.handed),
        Some(1)
    );
}

#[tokio::test(start_paused = true)]
async fn a_failover_forgets_every_bucket() {
    let s = store();
    let limit = Limit::token_bucket(1, 0.001).expect("limit");
    assert!(s.check(&one(limit)).await.expect("answers").allowed());
    assert!(!s.check(&one(limit)).await.expect("answers").allowed());
    s.fail_over();
    assert!(
        s.check(&one(limit)).await.expect("answers").allowed(),
        "full again"
    );
    assert_eq!(s.link().failovers(), 1);
}

#[tokio::test(start_paused = true)]
async fn the_ledger_books_grants_and_returns() {
    let s = store();
    let limit = Limit::token_bucket(100, 1.0).expect("limit");
    let ask = LeaseAsk {
        key: key(),
        limit,
        want: 10,
        min: 1,
        max_share: 1.0,
        allowance: None,
        penalized: false,
    };
    let req = LeaseRequest::new(vec![ask], Duration::from_secs(1)).expect("lease");
    let grant = s.acquire_leases(&req).await.expect("grants").remove(0);
    assert_eq!(grant.units, 10);
    let back = tollgate_lease::ReturnRequest::new(vec![tollgate_lease::LeaseReturn {
        key: key(),
        limit,
        lease: grant.lease.expect("a lease"),
        unspent: 4,
        allowance: None,
    }])
    .expect("return");
    assert_eq!(s.return_leases(&back).await.expect("credits"), vec![4]);
    let ledger = s.link().ledger_of(key().as_str()).expect("kept");
    assert_eq!((ledger.handed, ledger.credited), (10, 4));
}
