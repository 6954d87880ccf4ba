//! A penalty block started in one region holds in the other: the region whose node started it
//! tells the peer over the link, and the peer's nodes deny the client without a store call.

use std::time::Duration;

use tokio::time::Instant;
use tollgate_node::Request;
use tollgate_node::runtime::verdict::Denial;

use crate::support::TwoRegions;

const RULES: &str = "domain: auth\nrules:
  - {id: login, match: {ip: '*'}, algorithm: TOKEN_BUCKET, capacity: 10, refillPerSecond: 100,
     penalty: {after: 10, within: 1m, block: 6s}}
";

fn client(ip: &str) -> Request {
    Request::new("auth").descriptor([("ip", ip)])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_started_in_one_region_holds_in_the_other() {
    let regions = TwoRegions::start(RULES, Duration::from_millis(250)).await;
    let us = &regions.us.nodes[0].node;
    let eu = &regions.eu.nodes[1].node;

    // In the us region, the client hammers one node into the penalty box.
    let start = Instant::now();
    loop {
        let v = us.check(&client("192.0.2.5")).await.expect("valid");
        if v.denial() == Some(Denial::Penalized) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "no block in the us region"
        );
        tokio::task::yield_now().await;
    }
    let blocked_at = Instant::now();

    // The eu region, where the client never was over its limit, blocks it too: within the
    // link's delivery, for the block's time left.
    let eu_blocked = loop {
        let v = eu.check(&client("192.0.2.5")).await.expect("valid");
        if v.denial() == Some(Denial::Penalized) {
            break v;
        }
        assert!(
            blocked_at.elapsed() < Duration::from_secs(2),
            "the eu region never held the block: {v:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    eprintln!(
        "the eu region held the block {:?} after the us region started it",
        blocked_at.elapsed()
    );
    assert!(
        eu_blocked.retry_after > Duration::from_secs(3)
            && eu_blocked.retry_after <= Duration::from_secs(6),
        "{:?}",
        eu_blocked.retry_after
    );
    // Every eu node: the other one learns it from its store at its first decision.
    let other = &regions.eu.nodes[0].node;
    let v = other.check(&client("192.0.2.5")).await.expect("valid");
    assert_eq!(v.denial(), Some(Denial::Penalized), "{v:?}");
    // Another client is not blocked in either region.
    assert!(eu.check(&client("192.0.2.6")).await.expect("valid").allowed);
    regions.stop().await;
}

/// The peer region's word on how long to block is never longer than this region's rule: a
/// block sent for 7 days under a rule that blocks for 6 s is held here for 6 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_cannot_block_for_longer_than_the_rule_here() {
    use tollgate_regionsync::link::PeerClient;
    use tollgate_regionsync::messages::{Origin, PenaltyBatch, PenaltyBlock};
    let redis =
        tokio::task::spawn_blocking(|| tollgate_testkit::RedisServer::start().expect("redis"))
            .await
            .expect("join");
    let mut eu = crate::support::Running::start(
        tollgate_server::config::Settings {
            redis_url: Some(vec![redis.url()]),
            region: Some("eu".into()),
            peer_region: Some("us".into()),
            peer_url: Some("http://127.0.0.1:9".into()),
            region_secret: Some(crate::support::SECRET.into()),
            ..Default::default()
        },
        RULES,
    )
    .await;
    let us = PeerClient::new(
        &format!("http://{}", eu.region_addr),
        "us",
        crate::support::SECRET,
    )
    .expect("client");
    let week = Duration::from_secs(7 * 24 * 3600);
    let ack = us
        .penalty(
            &PenaltyBatch {
                origin: Origin {
                    region: "us".into(),
                    incarnation: 1,
                },
                blocks: vec![PenaltyBlock {
                    rule: "login".into(),
                    identity: b"192.0.2.9".to_vec(),
                    left_us: week.as_micros() as u64,
                }],
            },
            Duration::from_secs(5),
        )
        .await
        .expect("the block is taken");
    assert_eq!(ack.imposed, 1);
    let v = eu.node.check(&client("192.0.2.9")).await.expect("valid");
    assert_eq!(v.denial(), Some(Denial::Penalized), "{v:?}");
    assert!(
        v.retry_after <= Duration::from_secs(6),
        "held for the rule's 6 s, not the peer's week: {:?}",
        v.retry_after
    );
    eu.stop().await;
}
