//! The RLQS budget counts what buckets really take: 20,000 buckets reported by one stream
//! grow the heap by no more than `tollgate_rlqs_state_bytes` says they hold (the budget is
//! what keeps a node within its pod, so it must not undercount).
//!
//! The heap is counted by this test's own allocator: live bytes, exactly. Resident memory is
//! printed beside it but not judged: it moved from 2,463 to 4,288 bytes a bucket between runs
//! of the same code (the allocator's arenas and what other tests on the machine were doing),
//! and failed CI once at 4,288 against 3,026 counted.

mod support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// The system allocator, counting the bytes live on the heap.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

// Unsafe by the trait's nature: every call is forwarded unchanged to the system allocator.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as given; the caller upholds `alloc`'s contract.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded as given; `ptr` came from `alloc` with `layout`.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded as given; the caller upholds `realloc`'s contract.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_add(new_size, Ordering::Relaxed);
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Bytes live on this process's heap.
fn heap() -> u64 {
    LIVE.load(Ordering::Relaxed) as u64
}

use support::Served;
use support::rlqs_stream::{Stream, key};
use tollgate_proto::envoy::service::rate_limit_quota::v3::BucketId;

const RULES: &str = "domain: public-api\nrules:\n  - {id: per-key, match: {name: per-key, api_key: '*'}, algorithm: TOKEN_BUCKET, capacity: 100, refillPerSecond: 20}\n";

/// This process's resident memory, bytes.
fn rss() -> u64 {
    tollgate_testkit::process::rss_bytes(std::process::id()).unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_budget_counts_what_buckets_take() {
    let mut served = Served::start(
        RULES,
        tollgate_server::config::Settings {
            rlqs_max_state_mb: Some(1024),
            ..Default::default()
        },
    )
    .await;
    let n = 20_000;
    let ids: Vec<BucketId> = (0..n).map(|i| key(&format!("k-{i:0>36}"))).collect();
    let first = key("first");
    let mut stream = Stream::open(served.grpc, "public-api", &[(&first, 1, 0)]).await;
    stream.next_for(&first, Duration::from_secs(2)).await;
    let rlqs = &served.node.metrics().rlqs;
    let (before, heap_before, counted_before) = (rss(), heap(), rlqs.state_bytes.get());
    // Read every answer, as an Envoy does.
    let reports = stream.reporter();
    let queue = stream.reporter();
    let drain =
        tokio::spawn(async move { while let Ok(Some(_)) = stream.answers.message().await {} });
    // Every bucket reported every 5 s, as an Envoy reports what it holds, on its own timer
    // however long the node takes to read a round (a bucket not reported for 20 s is
    // forgotten; on a busy machine the first round of 20,000 new buckets takes the node some
    // 10 s to join). The first bucket too: it is held like the others.
    let mut ids = ids;
    ids.push(first.clone());
    // The client stops between rounds, never within one: a round cut short would leave the
    // buckets it had not reached reported only in the round before, and forgotten 20 s after
    // it, while the heap is read (CI once saw 17,467 of 20,001 held so). And it queues at most
    // one round: a round the node has not taken yet is not sent again behind itself (on a
    // starved machine the node takes some 13 s to read a round, and the rounds queued behind
    // it, this process's heap too, took longer to drain than the heap could wait).
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let reporting = tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_secs(5));
        loop {
            tokio::select! {
                _ = every.tick() => {}
                _ = stopped.changed() => return,
            }
            if reports.queued() > 0 {
                continue;
            }
            for chunk in ids.chunks(4_000) {
                let report: Vec<_> = chunk.iter().map(|id| (id, 1, 0)).collect();
                reports.report("", &report).await;
            }
            if *stopped.borrow() {
                return;
            }
        }
    });
    let started = tokio::time::Instant::now();
    let deadline = started + Duration::from_secs(60);
    while (rlqs.buckets.get() as usize) < n + 1 {
        assert!(tokio::time::Instant::now() < deadline, "every bucket held");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("{} buckets held after {:?}", n + 1, started.elapsed());
    // Settled: every bucket ticked a few times. Then the client stops, and what it had in
    // flight is let through to the node before the heap is read: reports queued on the
    // client's side are this process's heap too (on a busy machine the node reads a round
    // slower than every 5 s, and up to 16 reports of 4,000 ids, 20 MB, waited in the queue:
    // CI once read 3,267 bytes a bucket so). The buckets are held for 20 s after their last
    // report.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let _ = stop.send(true);
    reporting.await.expect("the client's last round");
    // At most one round is queued: the node reads it within a round's time (a guard, not a
    // wait: the loop ends when it is read).
    let drained = tokio::time::Instant::now() + Duration::from_secs(30);
    while queue.queued() > 0 {
        assert!(
            tokio::time::Instant::now() < drained,
            "the node reads the reports it was sent"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The last report taken is read and joined; the answers to it are let out.
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    drain.abort();
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The three read together (a bucket forgotten between the reads would skew them), per
    // bucket held when read. On a starved machine the node reads a round of 20,000 more
    // slowly than the client sends them, and a bucket whose report it had not reached within
    // 20 s is forgotten as an Envoy's would be (CI once held 17,467 of 20,001 here): what is
    // counted is what those held take.
    let (buckets, heap_now, counted_now, rss_now) = loop {
        let buckets = rlqs.buckets.get();
        let read = (heap(), rlqs.state_bytes.get(), rss());
        if rlqs.buckets.get() == buckets {
            break (buckets, read.0, read.1, read.2);
        }
    };
    let measured = (buckets as usize).saturating_sub(1);
    eprintln!(
        "streams {}, abandons {}, elapsed {:?}",
        rlqs.streams.get(),
        rlqs.abandons.get(),
        started.elapsed()
    );
    assert!(
        measured >= n / 2,
        "most buckets are held while they are measured: {measured} of {n}"
    );
    eprintln!("{measured} of {n} new buckets held when measured");
    let grew = rss_now.saturating_sub(before) as f64 / measured as f64;
    let held = heap_now.saturating_sub(heap_before) as f64 / measured as f64;
    let counted = (counted_now - counted_before) as f64 / measured as f64;
    eprintln!(
        "a bucket: {held:.0} bytes of heap, {grew:.0} of resident memory, {counted:.0} counted"
    );
    assert!(
        counted >= held,
        "the budget counts {counted:.0} bytes a bucket; they hold {held:.0} on the heap"
    );
    served.stop().await;
}
