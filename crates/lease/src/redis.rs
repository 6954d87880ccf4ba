//! The Redis store: every operation is one atomic Lua script, timed by Redis `TIME`.
//!
//! Works against a single Redis and a Redis Cluster: an identity's keys share one hash tag,
//! hence one slot, so each script touches one node. A call that cannot finish within its
//! budget fails fast with a transient error.
//!
//! # Layout
//! - [`connection`]: single and cluster connections, lazily connected, with limiter timeouts.
//! - `scripts`: the `.lua` sources and their SHA1s.
//! - `reply`: script replies parsed into typed outcomes.
//! - [`batch`]: checks and lease asks for keys of one shard sent together under load.

pub mod batch;
pub mod connection;
mod reply;
mod scripts;

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use redis::{ErrorKind, RedisError, ServerErrorKind, Value};

use crate::key::BucketKey;

use crate::error::StoreError;
use batch::{Answer, BatchCounts, Batcher, Entered};
use connection::Connection;
pub use connection::RedisConfig;
use scripts::{BatchOp, SCRIPTS, Script};

/// The Redis-backed lease store. Cloning shares the connection.
#[derive(Debug, Clone)]
pub struct RedisStore {
    conn: Connection,
    budget: Duration,
    /// A cluster's slot ranges (None for a single Redis: one shard).
    shards: Option<Arc<ShardMap>>,
    /// The batching of checks and lease asks (None: every call goes alone).
    batcher: Option<Arc<Batcher>>,
}

/// Which slot range of a Redis Cluster each slot belongs to, refreshed from `CLUSTER SLOTS`:
/// one range is one shard's (or part of one), so a failing shard can be told apart from the
/// healthy ones. A range is named by its first slot, which a failover does not change.
#[derive(Debug, Default)]
struct ShardMap {
    /// Slot → first slot of its range; empty until the cluster has answered once.
    first_slot: ArcSwap<Vec<u16>>,
    /// How the cluster fails, as one of its nodes said last (None: not asked yet).
    settings: ArcSwap<Option<ClusterSettings>>,
}

/// How a Redis Cluster fails, read from one of its nodes (`CONFIG GET`), at start and after
/// each change of its slot ranges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClusterSettings {
    /// What the node said.
    Read {
        /// `cluster-require-full-coverage`. With `yes` (Redis's default) every node refuses
        /// every key while any slot is uncovered: one failed primary stops every shard until
        /// its replica is promoted, and every rule falls to its fail mode on all of them.
        require_full_coverage: bool,
        /// `cluster-node-timeout`, ms: how long a failed primary goes unnoticed before its
        /// replica is promoted.
        node_timeout_ms: Option<u64>,
    },
    /// The node would not say (a managed Redis that renames or forbids `CONFIG`): why.
    Unreadable(String),
}

impl ClusterSettings {
    /// What an operator should know, when it is a danger (None otherwise).
    pub fn warning(&self) -> Option<String> {
        match self {
            ClusterSettings::Read {
                require_full_coverage: true,
                node_timeout_ms,
            } => Some(format!(
                "the Redis Cluster has cluster-require-full-coverage yes (Redis's default): when \
                 one primary fails, every node refuses every key until its replica is promoted \
                 (cluster-node-timeout {}), so every rule on every shard falls to its fail mode; \
                 set cluster-require-full-coverage no on every node (docs/operations.md, \
                 \"Redis Cluster\")",
                node_timeout_ms.map_or("unknown".to_owned(), |ms| format!("{ms} ms"))
            )),
            ClusterSettings::Read { .. } => None,
            ClusterSettings::Unreadable(why) => Some(format!(
                "could not read the Redis Cluster's cluster-require-full-coverage ({why}): if it \
                 is yes (Redis's default), one failed primary stops every shard; check it \
                 (docs/operations.md, \"Redis Cluster\")"
            )),
        }
    }
}

/// Redis Cluster's slot count.
const SLOTS: usize = 16_384;
/// How often a cluster's slot ranges are read again.
const SHARD_REFRESH: Duration = Duration::from_secs(2);

impl RedisStore {
    /// Prepares a store; no I/O happens until the first call, so a node can start while Redis
    /// is down. Must be called inside a tokio runtime.
    pub fn open(config: &RedisConfig) -> Result<Self, StoreError> {
        let conn = Connection::open(config)?;
        let shards = config.cluster.then(|| {
            let map = Arc::new(ShardMap::default());
            tokio::spawn(refresh_shards(Arc::downgrade(&map), conn.clone()));
            map
        });
        let batcher = (config.batch.max_batch > 1).then(|| {
            let patience = config.response_timeout.max(config.call_timeout);
            Arc::new(Batcher::new(config.batch, conn.clone(), patience))
        });
        Ok(Self {
            conn,
            budget: config.call_timeout,
            shards,
            batcher,
        })
    }

    /// How batching went so far (None when it is off).
    pub fn batch_counts(&self) -> Option<BatchCounts> {
        self.batcher.as_ref().map(|b| b.counts())
    }

    /// The budget of one call.
    pub fn call_timeout(&self) -> Duration {
        self.budget
    }

    /// The same store (same connection) with another budget per call: a caller that gives up
    /// on an answer at its budget can still have it, late, from a more patient view (up to
    /// the connection's response timeout).
    pub fn with_budget(&self, budget: Duration) -> Self {
        Self {
            budget,
            ..self.clone()
        }
    }

    /// The shard `key` lives on: the first slot of its slot range in a cluster (0 until the
    /// cluster has told its ranges), 0 for a single Redis.
    pub fn shard_of(&self, key: &BucketKey) -> u16 {
        let Some(shards) = &self.shards else {
            return 0;
        };
        let table = shards.first_slot.load();
        table
            .get(usize::from(slot_of(key.as_str())))
            .copied()
            .unwrap_or(0)
    }

    /// The shard whose batches a call on `key` (a Redis key) may join: the single server's, or
    /// in a cluster the slot range `key` is on; None while a cluster's ranges are unknown (a
    /// batch must not mix keys of several nodes, so such calls go alone).
    fn batch_shard(&self, key: &str) -> Option<u16> {
        let Some(shards) = &self.shards else {
            return Some(0);
        };
        shards
            .first_slot
            .load()
            .get(usize::from(slot_of(key)))
            .copied()
    }

    /// Makes the next call cost one round trip: connects (to every node of a cluster), loads
    /// every script there (`SCRIPT LOAD`, which a cluster connection sends to all its nodes)
    /// and, in a cluster, reads the slot ranges. `timeout` bounds this attempt; the caller
    /// decides how often to try (see the node's start-up patience).
    pub async fn warm_up(&self, timeout: Duration) -> Result<(), StoreError> {
        let attempt = async {
            for script in SCRIPTS.all() {
                let mut cmd = redis::cmd("SCRIPT");
                cmd.arg("LOAD").arg(&script.source);
                self.conn.run(&cmd).await?;
            }
            if let Some(shards) = &self.shards {
                let reply = self.conn.run(&cluster_slots()).await?;
                if let Some(table) = slot_table(&reply) {
                    shards.first_slot.store(Arc::new(table));
                }
                read_settings(shards, &self.conn).await;
            }
            Ok(())
        };
        match tokio::time::timeout(timeout, attempt).await {
            Ok(result) => result.map_err(|e| classify(e, timeout)),
            Err(_) => Err(StoreError::Timeout { budget: timeout }),
        }
    }

    /// How the cluster fails, as one of its nodes said last (None: a single Redis, or not
    /// asked yet).
    pub fn cluster_settings(&self) -> Option<ClusterSettings> {
        self.shards
            .as_ref()
            .and_then(|s| (**s.settings.load()).clone())
    }

    /// Every shard as [`RedisStore::shard_of`] names them (what the cluster told last; `[0]`
    /// for a single Redis).
    pub fn shards(&self) -> Vec<u16> {
        let Some(shards) = &self.shards else {
            return vec![0];
        };
        let mut firsts: Vec<u16> = shards.first_slot.load().iter().copied().collect();
        firsts.sort_unstable();
        firsts.dedup();
        if firsts.is_empty() {
            firsts.push(0);
        }
        firsts
    }

    /// One `PING` within the budget (for readiness checks).
    pub async fn ping(&self) -> Result<(), StoreError> {
        let cmd = redis::cmd("PING");
        self.within_budget(async { self.conn.run(&cmd).await.map(drop) })
            .await
    }

    async fn within_budget<T>(
        &self,
        call: impl Future<Output = Result<T, RedisError>>,
    ) -> Result<T, StoreError> {
        within(self.budget, call).await
    }

    /// Runs `op` for one request: alone, or in its shard's next batch when calls are in flight
    /// there (see [`batch`]). The budget counts from now, wherever the request waits.
    async fn run(
        &self,
        op: BatchOp,
        keys: Vec<String>,
        args: Vec<String>,
    ) -> Result<Value, StoreError> {
        let script = op.script();
        let Some(batcher) = &self.batcher else {
            return eval(&self.conn, script, &keys, &args, self.budget).await;
        };
        let Some(shard) = self.batch_shard(&keys[0]) else {
            batcher.count_alone();
            return eval(&self.conn, script, &keys, &args, self.budget).await;
        };
        let deadline = tokio::time::Instant::now() + self.budget;
        match batcher.enter(shard, op, keys, args) {
            Entered::Alone(in_flight, keys, args) => {
                let result = eval(&self.conn, script, &keys, &args, self.budget).await;
                drop(in_flight);
                result
            }
            Entered::Queued(answer) => match tokio::time::timeout_at(deadline, answer).await {
                Err(_) => Err(StoreError::Timeout {
                    budget: self.budget,
                }),
                Ok(Err(_)) => Err(StoreError::Unavailable(
                    "the batch carrying the call was dropped".into(),
                )),
                Ok(Ok(Answer::Replied(result))) => result,
                Ok(Ok(Answer::Alone { keys, args })) => {
                    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                    let timeout = StoreError::Timeout {
                        budget: self.budget,
                    };
                    if left.is_zero() {
                        return Err(timeout);
                    }
                    eval(&self.conn, script, &keys, &args, left)
                        .await
                        .map_err(|e| match e {
                            StoreError::Timeout { .. } => timeout,
                            other => other,
                        })
                }
            },
        }
    }
}

/// `call` within `budget`, its error sorted (see [`classify`]).
async fn within<T>(
    budget: Duration,
    call: impl Future<Output = Result<T, RedisError>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(budget, call).await {
        Ok(result) => result.map_err(|e| classify(e, budget)),
        Err(_) => Err(StoreError::Timeout { budget }),
    }
}

/// Runs `script` by SHA within `budget`, falling back to sending its source once on
/// `NOSCRIPT`.
async fn eval(
    conn: &Connection,
    script: &Script,
    keys: &[String],
    args: &[String],
    budget: Duration,
) -> Result<Value, StoreError> {
    eval_with(conn, script, budget, |cmd| {
        cmd.arg(keys.len()).arg(keys).arg(args);
    })
    .await
}

/// [`eval`] with the key count, keys and arguments written by `fill`.
async fn eval_with(
    conn: &Connection,
    script: &Script,
    budget: Duration,
    fill: impl Fn(&mut redis::Cmd),
) -> Result<Value, StoreError> {
    within(budget, async {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(&script.sha);
        fill(&mut cmd);
        match conn.run(&cmd).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                tracing::debug!(script = script.name, "NOSCRIPT: sending the script source");
                let mut cmd = redis::cmd("EVAL");
                cmd.arg(&script.source);
                fill(&mut cmd);
                conn.run(&cmd).await
            }
            other => other,
        }
    })
    .await
}

/// The cluster slot of `key`: CRC16 (XMODEM) of its hash tag, as Redis computes it.
fn slot_of(key: &str) -> u16 {
    let key = key.as_bytes();
    let tag = key
        .iter()
        .position(|b| *b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            rest.iter()
                .position(|b| *b == b'}')
                .filter(|close| *close > 0)
                .map(|close| &rest[..close])
        })
        .unwrap_or(key);
    crc16::State::<crc16::XMODEM>::calculate(tag) % SLOTS as u16
}

/// Reads the cluster's slot ranges now and every [`SHARD_REFRESH`] until the store is dropped.
fn cluster_slots() -> redis::Cmd {
    let mut cmd = redis::cmd("CLUSTER");
    cmd.arg("SLOTS");
    cmd
}

async fn refresh_shards(map: std::sync::Weak<ShardMap>, conn: Connection) {
    let cmd = cluster_slots();
    loop {
        let Some(shards) = map.upgrade() else { return };
        match conn.run(&cmd).await {
            Ok(reply) => {
                if let Some(table) = slot_table(&reply) {
                    let changed = **shards.first_slot.load() != table;
                    shards.first_slot.store(Arc::new(table));
                    // The topology moved (or the settings were never read): read them again.
                    if changed || shards.settings.load().is_none() {
                        read_settings(&shards, &conn).await;
                    }
                }
            }
            Err(e) => tracing::debug!(error = %e, "CLUSTER SLOTS failed; keeping the last ranges"),
        }
        drop(shards);
        tokio::time::sleep(SHARD_REFRESH).await;
    }
}

/// Reads how the cluster fails from one of its nodes and keeps it; says it in the log when it
/// is a danger, once each time it changes.
async fn read_settings(shards: &ShardMap, conn: &Connection) {
    let mut cmd = redis::cmd("CONFIG");
    cmd.arg("GET").arg("cluster-*");
    let read = match conn.run(&cmd).await {
        Ok(reply) => {
            let pairs = config_pairs(&reply);
            match pairs.get("cluster-require-full-coverage") {
                Some(v) => ClusterSettings::Read {
                    require_full_coverage: v.eq_ignore_ascii_case("yes"),
                    node_timeout_ms: pairs
                        .get("cluster-node-timeout")
                        .and_then(|v| v.parse().ok()),
                },
                None => ClusterSettings::Unreadable(
                    "CONFIG GET did not answer cluster-require-full-coverage".into(),
                ),
            }
        }
        Err(e) => ClusterSettings::Unreadable(e.to_string()),
    };
    let before = shards.settings.swap(Arc::new(Some(read.clone())));
    if before.as_ref().as_ref() != Some(&read) {
        match read.warning() {
            Some(warning) => tracing::warn!("{warning}"),
            None => tracing::info!(?read, "the Redis Cluster fails one shard at a time"),
        }
    }
}

/// A `CONFIG GET` reply (a flat array or a map of name, value) as name → value.
fn config_pairs(reply: &Value) -> std::collections::HashMap<String, String> {
    let text = |v: &Value| match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    match reply {
        Value::Array(items) => items
            .chunks(2)
            .filter_map(|pair| Some((text(pair.first()?)?, text(pair.get(1)?)?)))
            .collect(),
        Value::Map(entries) => entries
            .iter()
            .filter_map(|(k, v)| Some((text(k)?, text(v)?)))
            .collect(),
        _ => Default::default(),
    }
}

/// `CLUSTER SLOTS` (`[[start, end, primary, replicas...], ...]`) as slot → first slot.
fn slot_table(reply: &Value) -> Option<Vec<u16>> {
    let Value::Array(ranges) = reply else {
        return None;
    };
    let int = |v: &Value| match v {
        Value::Int(n) => u16::try_from(*n).ok().filter(|n| usize::from(*n) < SLOTS),
        _ => None,
    };
    let mut table = vec![0u16; SLOTS];
    for range in ranges {
        let Value::Array(fields) = range else {
            return None;
        };
        let (start, end) = (int(fields.first()?)?, int(fields.get(1)?)?);
        for slot in start..=end {
            table[usize::from(slot)] = start;
        }
    }
    Some(table)
}

/// Sorts a Redis error into transient (worth retrying later) or not.
fn classify(e: RedisError, budget: Duration) -> StoreError {
    if e.is_timeout() {
        return StoreError::Timeout { budget };
    }
    if e.is_connection_refusal() {
        return StoreError::Refused(e.to_string());
    }
    if e.is_io_error() || e.is_connection_dropped() || e.is_cluster_error() {
        return StoreError::Unavailable(e.to_string());
    }
    match e.kind() {
        ErrorKind::Server(
            ServerErrorKind::MasterDown | ServerErrorKind::BusyLoading | ServerErrorKind::ReadOnly,
        )
        | ErrorKind::ClusterConnectionNotFound => StoreError::Unavailable(e.to_string()),
        ErrorKind::Parse | ErrorKind::UnexpectedReturnType => StoreError::BadReply(e.to_string()),
        _ if e.code() == Some("BUSY") => StoreError::Unavailable(e.to_string()),
        // maxmemory reached with a no-eviction policy: Redis is up, but takes no new state.
        _ if e.code() == Some("OOM") => StoreError::Full(e.to_string()),
        _ => StoreError::Rejected(e.to_string()),
    }
}

mod operations;
