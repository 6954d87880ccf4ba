//! Two regions on loopback: each its own `redis-server` and two nodes; each region's nodes
//! reach the other region's link through a [`TcpProxy`] the test can cut.

use std::time::Duration;

use tollgate_node::{Node, Request};
use tollgate_regionsync::policy::PeerState;
use tollgate_server::app::{App, Serving};
use tollgate_server::config::{Config, Settings};
use tollgate_testkit::{RedisServer, TcpProxy};

pub(crate) const SECRET: &str = "a-shared-secret-for-tests";

/// One node process.
pub(crate) struct Running {
    pub(crate) node: Node,
    pub(crate) region_addr: std::net::SocketAddr,
    serving: Serving,
    _dir: tempfile::TempDir,
}

impl Running {
    pub(crate) async fn start(settings: Settings, rules: &str) -> Running {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("rules.yaml");
        std::fs::write(&file, rules).expect("rules");
        let base = Settings {
            grpc_listen: Some("127.0.0.1:0".parse().expect("addr")),
            http_listen: Some("127.0.0.1:0".parse().expect("addr")),
            region_listen: Some("127.0.0.1:0".parse().expect("addr")),
            rules: Some(vec![file]),
            prelimit_factor: Some(0.0),
            ..Settings::default()
        };
        let config = Config::try_from(settings.or(base)).expect("config");
        let app = App::start(config).await.expect("node starts");
        let serving = app.spawn();
        Running {
            node: serving.node.clone(),
            region_addr: serving.region_addr.expect("region link"),
            serving,
            _dir: dir,
        }
    }

    pub(crate) async fn stop(&mut self) {
        self.serving.stop().await;
    }
}

/// One region: its Redis, its nodes, and the proxy its nodes reach the peer through.
pub(crate) struct Region {
    pub(crate) _redis: RedisServer,
    pub(crate) nodes: Vec<Running>,
    pub(crate) to_peer: TcpProxy,
}

impl Region {
    /// Offers `rate` requests per second for `duration`, spread over the region's nodes;
    /// returns how many were admitted.
    pub(crate) async fn load(&self, request: &Request, rate: f64, duration: Duration) -> u64 {
        let tick = Duration::from_millis(20);
        let per_tick = rate * tick.as_secs_f64();
        let mut ticker = tokio::time::interval(tick);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        let end = tokio::time::Instant::now() + duration;
        let (mut owed, mut admitted, mut turn) = (0.0, 0u64, 0usize);
        while tokio::time::Instant::now() < end {
            ticker.tick().await;
            owed += per_tick;
            while owed >= 1.0 {
                owed -= 1.0;
                let node = &self.nodes[turn % self.nodes.len()].node;
                turn += 1;
                if node.check(request).await.expect("valid").allowed {
                    admitted += 1;
                }
            }
        }
        admitted
    }
}

impl Region {
    /// `callers` tasks per node deciding `request` back to back (as fast as the nodes answer)
    /// for `duration`; how many were admitted. Each caller yields between its requests, as a
    /// caller reached over a connection does: a decision from a lease never waits, and a loop
    /// of them in the nodes' own runtime would starve everything else in it (the region link's
    /// heartbeats, which then counted the peer down).
    pub(crate) async fn burst(&self, request: &Request, callers: usize, duration: Duration) -> u64 {
        let end = tokio::time::Instant::now() + duration;
        let mut tasks = vec![];
        for node in &self.nodes {
            for _ in 0..callers {
                let (node, request) = (node.node.clone(), request.clone());
                tasks.push(tokio::spawn(async move {
                    let mut admitted = 0u64;
                    while tokio::time::Instant::now() < end {
                        if node.check(&request).await.expect("valid").allowed {
                            admitted += 1;
                        }
                        tokio::task::yield_now().await;
                    }
                    admitted
                }));
            }
        }
        let mut admitted = 0;
        for task in tasks {
            admitted += task.await.expect("caller");
        }
        admitted
    }
}

/// Two regions, `us` and `eu`, sharing `rules`.
pub(crate) struct TwoRegions {
    pub(crate) us: Region,
    pub(crate) eu: Region,
}

fn region_settings(
    region: &str,
    peer: &str,
    redis: &RedisServer,
    peer_url: String,
    interval: Duration,
) -> Settings {
    Settings {
        redis_url: Some(vec![redis.url()]),
        region: Some(region.into()),
        peer_region: Some(peer.into()),
        peer_url: Some(peer_url),
        region_secret: Some(SECRET.into()),
        region_sync_interval_ms: Some(interval.as_millis() as u64),
        region_heartbeat_ms: Some(100),
        region_failover_after_ms: Some(1000),
        region_failback_after_ms: Some(1000),
        region_forward_deadline_ms: Some(500),
        ..Settings::default()
    }
}

impl TwoRegions {
    pub(crate) async fn start(rules: &str, interval: Duration) -> TwoRegions {
        let (us_redis, eu_redis) = tokio::task::spawn_blocking(|| {
            (
                RedisServer::start().expect("redis us"),
                RedisServer::start().expect("redis eu"),
            )
        })
        .await
        .expect("join");
        let (us_to_eu, eu_to_us) = (
            TcpProxy::start().expect("proxy"),
            TcpProxy::start().expect("proxy"),
        );
        let mut us_nodes = vec![];
        let mut eu_nodes = vec![];
        for _ in 0..2 {
            us_nodes.push(
                Running::start(
                    region_settings("us", "eu", &us_redis, us_to_eu.url(), interval),
                    rules,
                )
                .await,
            );
            eu_nodes.push(
                Running::start(
                    region_settings("eu", "us", &eu_redis, eu_to_us.url(), interval),
                    rules,
                )
                .await,
            );
        }
        us_to_eu.set_target(eu_nodes[0].region_addr);
        eu_to_us.set_target(us_nodes[0].region_addr);
        let regions = TwoRegions {
            us: Region {
                _redis: us_redis,
                nodes: us_nodes,
                to_peer: us_to_eu,
            },
            eu: Region {
                _redis: eu_redis,
                nodes: eu_nodes,
                to_peer: eu_to_us,
            },
        };
        // Nodes that started before the link was set up (more than the failover time on a
        // busy machine) saw the peer down: wait until every node sees it up.
        regions.until_peer_state(PeerState::Up).await;
        regions
    }

    /// What each node has been through, for failure messages.
    pub(crate) fn diagnose(&self) -> String {
        let describe = |name: &str, nodes: &[Running]| {
            nodes
                .iter()
                .map(|n| {
                    let m = n.node.metrics();
                    format!(
                        "{name}: peer {:?}, breaker opened {}, failed open {}, slow store {}, owed {}, stalls {}, late leases {}, lease waits {}, rules generation {}, region {:?}",
                        n.node.region().link().map(|r| r.peer_state()),
                        m.breaker_opened.get(),
                        n.node
                            .rules()
                            .load()
                            .rules()
                            .iter()
                            .map(|r| r.counters.failed_open.get())
                            .sum::<u64>(),
                        m.slow_store_decisions.get(),
                        m.owed_units.get(),
                        m.store_stalls.get(),
                        m.late_leases.get(),
                        m.lease_waits.get(),
                        n.node.rules().generation(),
                        n.node.region().link().map(|r| r.status()),
                    )
                })
                .collect::<Vec<_>>()
                .join("; ")
        };
        format!(
            "{}; {}",
            describe("us", &self.us.nodes),
            describe("eu", &self.eu.nodes)
        )
    }

    /// Cuts the link both ways.
    pub(crate) fn cut(&self) {
        self.us.to_peer.cut();
        self.eu.to_peer.cut();
    }

    /// Restores the link both ways.
    pub(crate) fn restore(&self) {
        self.us.to_peer.restore();
        self.eu.to_peer.restore();
    }

    /// Waits until every node sees its peer in `state`.
    pub(crate) async fn until_peer_state(&self, state: PeerState) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        loop {
            let all = self
                .us
                .nodes
                .iter()
                .chain(&self.eu.nodes)
                .all(|n| n.node.region().link().expect("region").peer_state() == state);
            if all {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the nodes never saw the peer {state:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub(crate) async fn stop(mut self) {
        for node in self.us.nodes.iter_mut().chain(self.eu.nodes.iter_mut()) {
            node.stop().await;
        }
    }
}

/// `n` checks of `request`, alternating over `nodes`; how many were admitted.
pub(crate) async fn admitted(nodes: &[Running], request: &Request, n: usize) -> usize {
    let mut count = 0;
    for i in 0..n {
        if nodes[i % nodes.len()]
            .node
            .check(request)
            .await
            .expect("valid")
            .allowed
        {
            count += 1;
        }
    }
    count
}

/// How long until the next wall-clock window of `window` starts (windows are aligned to the
/// Unix epoch, by Redis's clock, which is this machine's).
pub(crate) fn window_start_in(window: Duration) -> Duration {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_micros() as u64;
    let w = window.as_micros() as u64;
    Duration::from_micros(w - now % w)
}
