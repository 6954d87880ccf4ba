//! A flood of new identities against a node with its default flags: how fast new keys come
//! in, what the node's RSS does during the flood and after it, how many key actors it holds,
//! and how many decisions were made without the store. One row per second.
//!
//! Three floods, each on a fresh node (the in-memory store, default settings): short keys each
//! sent twice (so every key earns a key actor), 2 KB keys each sent twice, and 2 KB keys each
//! sent once under an hour's window (every decision a store check whose key lives an hour:
//! the store fills). `FLOOD_ONLY=<part of a name>` runs one. Each floods for `FLOOD_SECONDS`
//! (default 30) from three load generators, then the node is watched for `QUIET_SECONDS`
//! (default 20) with no traffic.
//!
//! `cargo bench -p tollgate-server --bench key_flood` (builds `tollgate-loadgen` if it is not
//! beside `tollgate`). `FLOOD_EXTRA_ARGS` adds flags to the node (e.g. `--max-key-state-mb 64`,
//! or `--redis-batch-max 1` to send every store call alone). `FLOOD_STORE=redis` floods a node
//! on Redis instead: each flood starts its own `redis-server` (`maxmemory` 1 GB, evicting the
//! keys nearest their expiry, as an operator would bound it), and the rows then show Redis's
//! keys and memory.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::time::Instant;

use tollgate_testkit::RedisServer;
use tollgate_testkit::process::{KilledOnDrop, free_port, loadgen_beside, wait_for};

/// A token bucket per address (its keys live about a second after their last use) and a
/// window of an hour per user (its keys live an hour: a flood of them fills the store).
const RULES: &str = "domain: rl\nrules:\n  - {id: per-address, match: {remote_address: '*'}, algorithm: TOKEN_BUCKET, capacity: 100, refillPerSecond: 10}\n  - {id: per-user, match: {user: '*'}, algorithm: FIXED_WINDOW, limit: 100, window: 1h}\n";

fn rss_mib(pid: u32) -> f64 {
    tollgate_testkit::process::rss_bytes(pid).unwrap_or(0) as f64 / f64::from(1 << 20)
}

fn metrics(http: u16) -> String {
    tollgate_testkit::http::get(http, "/metrics", &[])
        .map(|r| r.body)
        .unwrap_or_default()
}

fn sum(body: &str, name: &str, labels: &str) -> f64 {
    tollgate_testkit::http::metric_sum(body, name, labels)
}

async fn flood(
    name: &str,
    descriptor: &str,
    keys: &str,
    key_bytes: usize,
    flood_secs: u64,
    quiet_secs: u64,
) {
    if std::env::var("FLOOD_ONLY").is_ok_and(|only| !name.contains(&only)) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let rules = dir.path().join("rules.yaml");
    std::fs::write(&rules, RULES).expect("rules");
    let (grpc, http) = (
        free_port(false).expect("port"),
        free_port(false).expect("port"),
    );
    let extra = std::env::var("FLOOD_EXTRA_ARGS").unwrap_or_default();
    let redis = std::env::var("FLOOD_STORE")
        .is_ok_and(|s| s == "redis")
        .then(|| {
            RedisServer::start_with(&["--maxmemory", "1gb", "--maxmemory-policy", "volatile-ttl"])
                .expect("redis-server")
        });
    let store_args = redis
        .as_ref()
        .map(|r| vec!["--redis-url".to_owned(), r.url()])
        .unwrap_or_default();
    let node = KilledOnDrop(
        Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .arg("--rules")
            .arg(&rules)
            .args(&store_args)
            .args(["--grpc-listen", &format!("127.0.0.1:{grpc}")])
            .args(["--http-listen", &format!("127.0.0.1:{http}")])
            .args(extra.split_whitespace())
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start tollgate"),
    );
    wait_for("the node", Duration::from_secs(30), || {
        tollgate_testkit::http::get(http, "/readyz", &[])
            .ok()
            .filter(|r| r.status == 200)
            .map(|_| ())
    })
    .expect("ready");
    let pid = node.0.id();
    let loadgen = loadgen_beside(Path::new(env!("CARGO_BIN_EXE_tollgate"))).expect("loadgen");
    let clients: Vec<KilledOnDrop> = (0..3)
        .map(|c| {
            let child: Child = Command::new(&loadgen)
                .args(["run", "--target", &format!("http://127.0.0.1:{grpc}")])
                // Three clients, three disjoint key spaces.
                .args(["--key", descriptor, "--domain", "rl"])
                .args(["--keys", keys, "--key-bytes", &key_bytes.to_string()])
                .args(["--name", &format!("c{c}")])
                .args(["--connections", "4", "--streams", "16", "--threads", "1"])
                .args(["--duration", &format!("{flood_secs}s"), "--warmup", "0s"])
                .args(["--key-prefix", &format!("c{c}")])
                .arg("--quiet")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("loadgen");
            KilledOnDrop(child)
        })
        .collect();
    let on = if redis.is_some() {
        "Redis"
    } else {
        "the in-memory store"
    };
    println!(
        "\n{name} on {on} (`{descriptor}` keys {keys}, {key_bytes} B identities, three clients)\n"
    );
    println!(
        "| s | RSS MiB | key actors | decisions | new keys/s | failed open | store keys | bytes held | Redis MiB |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let start = Instant::now();
    let mut last_decided = 0.0;
    let total = flood_secs + quiet_secs;
    let per_key = keys
        .strip_prefix("new:")
        .and_then(|r| r.parse().ok())
        .unwrap_or(1.0);
    for second in 1..=total {
        let due = start + Duration::from_secs(second);
        tokio::time::sleep_until(due).await;
        let body = metrics(http);
        let decided = sum(&body, "tollgate_decisions_total", "");
        if second % 5 == 0 || second == 1 || second == flood_secs + 1 {
            let (store_keys, redis_mib) = match &redis {
                Some(r) => redis_figures(r),
                None => (sum(&body, "tollgate_memory_store_keys", ""), 0.0),
            };
            println!(
                "| {second} | {:.0} | {:.0} | {decided:.0} | {:.0} | {:.0} | {store_keys:.0} | {:.0} | {redis_mib:.0} |",
                rss_mib(pid),
                sum(&body, "tollgate_key_actors ", ""),
                (decided - last_decided) / per_key,
                sum(&body, "tollgate_decisions_total", "outcome=\"failed_open\""),
                sum(&body, "tollgate_key_state_bytes", ""),
            );
        }
        last_decided = decided;
    }
    let body = metrics(http);
    let batches = sum(&body, "tollgate_store_batches_total", "");
    if batches > 0.0 {
        println!(
            "\n{batches:.0} batches carried {:.0} store calls (mean {:.1})",
            sum(&body, "tollgate_store_batched_requests_total", ""),
            sum(&body, "tollgate_store_batched_requests_total", "") / batches
        );
    }
    drop(clients);
}

/// Redis's key count and the memory it uses, MiB.
fn redis_figures(redis: &RedisServer) -> (f64, f64) {
    let keys = redis
        .cli(&["DBSIZE"])
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0.0);
    let used = redis
        .cli(&["INFO", "memory"])
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix("used_memory:"))
                .and_then(|v| v.trim().parse::<f64>().ok())
        })
        .unwrap_or(0.0);
    (keys, used / f64::from(1 << 20))
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let secs = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(default)
    };
    let (f, q) = (secs("FLOOD_SECONDS", 30), secs("QUIET_SECONDS", 20));
    flood("Short keys, each twice", "remote_address", "new:2", 0, f, q).await;
    flood(
        "2 KB keys, each twice",
        "remote_address",
        "new:2",
        2048,
        f,
        q,
    )
    .await;
    flood(
        "2 KB keys, each once, hour windows",
        "user",
        "new",
        2048,
        f,
        q,
    )
    .await;
}
