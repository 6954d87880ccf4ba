//! The region link under hostile delivery: duplicated, reordered, dropped and corrupted
//! batches, a forged peer, a wrong secret, and a peer restarting with its counters reset.
//! One real region (eu: Redis and a node); the test plays region us.

use std::time::Duration;

use tollgate_lease::{BucketKey, CheckRequest, LeaseStore, Limit, RedisConfig, RedisStore};
use tollgate_proto::tollgate::regionsync::v1::Frame;
use tollgate_proto::tollgate::regionsync::v1::region_sync_client::RegionSyncClient;
use tollgate_regionsync::codec;
use tollgate_regionsync::consumption::epoch_until;
use tollgate_regionsync::link::PeerClient;
use tollgate_regionsync::messages::{Batch, Entry, Origin};
use tollgate_testkit::RedisServer;

use crate::support::{Running, SECRET};

const RULES: &str = "domain: api\nrules:\n  - {id: synced, match: {api_key: '*'}, algorithm: FIXED_WINDOW, limit: 1000, window: 1h, regional: {policy: ASYNC_SYNC}}\n  - {id: local, match: {user: '*'}, algorithm: FIXED_WINDOW, limit: 1000, window: 1h}\n";

fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_micros() as u64
}

fn limit() -> Limit {
    Limit::fixed_window(1000, Duration::from_secs(3600)).expect("limit")
}

fn batch(origin: &Origin, seq: u64, entries: &[(&str, &str, u64)]) -> Batch {
    let now = now_us();
    Batch {
        origin: origin.clone(),
        seq,
        sent_at: now,
        entries: entries
            .iter()
            .map(|(rule, key, total)| Entry {
                rule: (*rule).into(),
                identity: key.as_bytes().to_vec(),
                until: epoch_until(&limit(), now),
                total: *total,
                at: now,
            })
            .collect(),
    }
}

/// Region eu on `redis`, its peer us at an address nobody answers: the test plays us, calling
/// in.
fn eu_alone(redis: &RedisServer) -> tollgate_server::config::Settings {
    tollgate_server::config::Settings {
        redis_url: Some(vec![redis.url()]),
        region: Some("eu".into()),
        peer_region: Some("us".into()),
        peer_url: Some("http://127.0.0.1:9".into()),
        region_secret: Some(SECRET.into()),
        ..Default::default()
    }
}

/// A store on eu's Redis (to look at what the link applied), patient: the default 5 ms budget
/// is for a gateway's hot path, not for a test's look on a busy machine.
fn store_of(redis: &RedisServer) -> RedisStore {
    RedisStore::open(&RedisConfig {
        urls: vec![redis.url()],
        call_timeout: Duration::from_secs(2),
        ..RedisConfig::default()
    })
    .expect("store")
}

/// What eu's store says has been spent on `rule` for `key`.
async fn spent(store: &RedisStore, rule: &str, key: &str) -> u64 {
    let key = BucketKey::new(key.as_bytes(), rule).expect("key");
    let peek = CheckRequest::single(key, limit(), 0).expect("peek");
    1000 - store.check(&peek).await.expect("check").buckets[0].remaining
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_link_applies_each_total_once_and_refuses_what_it_should() {
    let redis = tokio::task::spawn_blocking(|| RedisServer::start().expect("redis"))
        .await
        .expect("join");
    let mut eu = Running::start(eu_alone(&redis), RULES).await;
    let store = store_of(&redis);
    let url = format!("http://{}", eu.region_addr);
    let us = PeerClient::new(&url, "us", SECRET).expect("client");
    let timeout = Duration::from_secs(5);
    let node_a = Origin {
        region: "us".into(),
        incarnation: 1,
    };
    let send = |b: Batch| {
        let us = us.clone();
        async move { us.exchange(&b, timeout).await }
    };

    // Totals 5 then 9 for key a, delivered reordered and duplicated: 9 applied in all.
    let (b1, b2) = (
        batch(&node_a, 1, &[("synced", "a", 5)]),
        batch(&node_a, 2, &[("synced", "a", 9)]),
    );
    assert_eq!(send(b2.clone()).await.expect("b2").0.applied_units, 9);
    assert_eq!(send(b1.clone()).await.expect("b1 late").0.applied_units, 0);
    assert_eq!(send(b2.clone()).await.expect("b2 again").0.applied_units, 0);
    assert_eq!(spent(&store, "synced", "a").await, 9);
    // A dropped batch (total 12, never delivered) is covered by the next (15).
    let _dropped = batch(&node_a, 3, &[("synced", "a", 12)]);
    assert_eq!(
        send(batch(&node_a, 4, &[("synced", "a", 15)]))
            .await
            .expect("b4")
            .0
            .applied_units,
        6
    );
    assert_eq!(spent(&store, "synced", "a").await, 15);
    // The peer node restarts: a new incarnation, totals from zero, counted on top.
    let restarted = Origin {
        region: "us".into(),
        incarnation: 2,
    };
    assert_eq!(
        send(batch(&restarted, 1, &[("synced", "a", 3)]))
            .await
            .expect("after restart")
            .0
            .applied_units,
        3
    );
    assert_eq!(spent(&store, "synced", "a").await, 18);
    // A rule that does not sync here is skipped, not debited.
    let (ack, _) = send(batch(&node_a, 5, &[("local", "u", 7)]))
        .await
        .expect("b5");
    assert_eq!((ack.applied_units, ack.skipped), (0, 1));
    assert_eq!(spent(&store, "local", "u").await, 0);

    // A batch with one malformed entry is refused whole: its valid entry is not applied.
    let mut mixed = batch(&node_a, 6, &[("synced", "b", 4), ("synced", "c", 4)]);
    mixed.entries[1].rule = String::new();
    let refused = send(mixed).await.expect_err("malformed entry");
    assert!(refused.to_string().contains("InvalidArgument"), "{refused}");
    assert_eq!(spent(&store, "synced", "b").await, 0);

    // Raw frames: corrupted bytes, a forged region, a wrong secret.
    let mut raw = RegionSyncClient::connect(url.clone())
        .await
        .expect("connect");
    let call = |region: &'static str, secret: String, body: Vec<u8>| {
        let mut request = tonic::Request::new(Frame { body });
        request
            .metadata_mut()
            .insert("x-tollgate-region", region.parse().expect("ascii"));
        request.metadata_mut().insert(
            "authorization",
            format!("Bearer {secret}").parse().expect("ascii"),
        );
        request
    };
    let good = codec::encode(&batch(&node_a, 7, &[("synced", "a", 100)])).expect("encode");
    let mut corrupted = good.clone();
    corrupted.truncate(good.len() - 3);
    let status = raw
        .exchange(call("us", SECRET.into(), corrupted))
        .await
        .expect_err("corrupted");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    let status = raw
        .exchange(call("us", SECRET.into(), vec![0xff; 64]))
        .await
        .expect_err("garbage");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    let status = raw
        .exchange(call("mars", SECRET.into(), good.clone()))
        .await
        .expect_err("forged peer");
    assert_eq!(status.code(), tonic::Code::PermissionDenied);
    let status = raw
        .exchange(call("us", "not-the-secret-at-all".into(), good.clone()))
        .await
        .expect_err("wrong secret");
    assert_eq!(status.code(), tonic::Code::Unauthenticated);
    // A batch claiming another origin region inside a valid envelope.
    let forged = codec::encode(&batch(
        &Origin {
            region: "mars".into(),
            incarnation: 1,
        },
        1,
        &[("synced", "a", 100)],
    ))
    .expect("encode");
    let status = raw
        .exchange(call("us", SECRET.into(), forged))
        .await
        .expect_err("forged origin");
    assert_eq!(status.code(), tonic::Code::PermissionDenied);
    // None of that changed anything.
    assert_eq!(spent(&store, "synced", "a").await, 18);
    let rejected = &eu.node.metrics().region.batches_rejected;
    assert!(
        rejected
            .get_or_create(&tollgate_regionsync::metrics::ReasonLabel {
                reason: "malformed".into()
            })
            .get()
            >= 2
    );
    eu.stop().await;
}

/// Log lines, captured (this test process's subscriber).
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("log")).into_owned()
    }
}

/// The peer is reported up only once it has answered; the peer may ask for decisions of
/// HOME_REGION rules homed here only (never another rule's counter); a batch's epoch cannot
/// end past the rule's window; a wrong secret is logged clearly on both sides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_link_reports_the_truth_and_serves_only_what_is_the_peers() {
    let log = Captured::default();
    let writer = log.clone();
    tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .init();
    let redis = tokio::task::spawn_blocking(|| RedisServer::start().expect("redis"))
        .await
        .expect("join");
    let rules = "domain: api\nrules:\n\
      - {id: synced, match: {api_key: '*'}, algorithm: FIXED_WINDOW, limit: 1000, window: 1h, regional: {policy: ASYNC_SYNC}}\n\
      - {id: local, match: {user: '*'}, algorithm: FIXED_WINDOW, limit: 1000, window: 1h}\n\
      - {id: homed, match: {tenant: '*'}, algorithm: FIXED_WINDOW, limit: 1000, window: 1h, regional: {policy: HOME_REGION, homeRegion: eu}}\n";
    let settings = tollgate_server::config::Settings {
        region_heartbeat_ms: Some(50),
        ..eu_alone(&redis)
    };
    let mut eu = Running::start(settings, rules).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let status = eu.node.region().link().expect("region").status();
    assert_eq!(status.peer_state, "unreached", "never heard from: not up");
    assert!(!status.peer_up);
    assert_eq!(eu.node.metrics().region.peer_up.get(), 0);

    let store = store_of(&redis);
    let url = format!("http://{}", eu.region_addr);
    let us = PeerClient::new(&url, "us", SECRET).expect("client");
    let timeout = Duration::from_secs(5);
    let forward = |rule: &str| tollgate_regionsync::messages::ForwardRequest {
        rule: rule.into(),
        identity: b"k1".to_vec(),
        cost: 1,
    };
    assert!(
        us.forward(&forward("homed"), timeout)
            .await
            .expect("homed here")
            .allowed,
        "a HOME_REGION rule homed in eu is decided for us"
    );
    for rule in ["local", "synced"] {
        let refused = us.forward(&forward(rule), timeout).await;
        assert!(refused.is_err(), "{rule}: {refused:?}");
        assert_eq!(
            spent(&store, rule, "k1").await,
            0,
            "{rule}'s counter untouched"
        );
    }

    let origin = Origin {
        region: "us".into(),
        incarnation: 7,
    };
    // An entry whose epoch ends past the rule's window is refused, the rest of its batch
    // applied (refusing the batch would stop every other total from landing).
    let mut far = batch(&origin, 1, &[("synced", "k2", 5), ("synced", "k3", 4)]);
    far.entries[0].until = now_us() + 86_400_000_000;
    let (ack, _) = us.exchange(&far, timeout).await.expect("the batch lands");
    assert_eq!(ack.skipped, 1, "an epoch past the window");
    assert_eq!(spent(&store, "synced", "k2").await, 0);
    assert_eq!(spent(&store, "synced", "k3").await, 4);
    // What the peer sends and this region refuses is said at WARN, whatever the log level.
    let text = log.text();
    assert!(
        text.contains("WARN")
            && text.contains("refused what the peer sent")
            && text.contains("past the rule's window"),
        "eu warns of the entry it skipped: {text}"
    );

    let wrong = PeerClient::new(&url, "us", "not-the-shared-secret").expect("client");
    let ping = tollgate_regionsync::messages::Ping {
        origin: origin.clone(),
        sent_at: now_us(),
    };
    assert!(wrong.heartbeat(&ping, timeout).await.is_err());
    let text = log.text();
    assert!(
        text.contains("refused a call with a wrong secret"),
        "eu says why it refused: {text}"
    );
    assert!(
        text.contains("refused this region's secret"),
        "the caller says why it was refused: {text}"
    );
    assert!(
        text.contains("cannot reach the peer region"),
        "eu says it cannot reach its peer: {text}"
    );
    eu.stop().await;
}
