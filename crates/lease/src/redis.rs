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

pub mod connection;
mod reply;
mod scripts;

use std::time::Duration;

use redis::{ErrorKind, RedisError, ServerErrorKind, Value};

use crate::error::StoreError;
use crate::limit::Limit;
use crate::ops::check::{CheckOutcome, CheckRequest};
use crate::ops::debit::DebitRequest;
use crate::ops::lease::{LeaseGrant, LeaseRequest, ReturnRequest};
use crate::ops::nonce;
use crate::ops::slot::SlotRelease;
use crate::store::{LeaseStore, state_key};
use connection::Connection;
pub use connection::RedisConfig;
use scripts::{SCRIPTS, Script};

/// The Redis-backed lease store. Cloning shares the connection.
#[derive(Debug, Clone)]
pub struct RedisStore {
    conn: Connection,
    budget: Duration,
}

impl RedisStore {
    /// Prepares a store; no I/O happens until the first call, so a node can start while Redis
    /// is down. Must be called inside a tokio runtime.
    pub fn open(config: &RedisConfig) -> Result<Self, StoreError> {
        Ok(Self {
            conn: Connection::open(config)?,
            budget: config.call_timeout,
        })
    }

    /// The budget of one call.
    pub fn call_timeout(&self) -> Duration {
        self.budget
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
        match tokio::time::timeout(self.budget, call).await {
            Ok(result) => result.map_err(|e| classify(e, self.budget)),
            Err(_) => Err(StoreError::Timeout {
                budget: self.budget,
            }),
        }
    }

    /// Runs `script` by SHA, falling back to sending its source once on `NOSCRIPT`.
    async fn eval(
        &self,
        script: &Script,
        keys: &[String],
        args: &[String],
    ) -> Result<Value, StoreError> {
        self.within_budget(async {
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(&script.sha).arg(keys.len()).arg(keys).arg(args);
            match self.conn.run(&cmd).await {
                Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                    tracing::debug!(script = script.name, "NOSCRIPT: sending the script source");
                    let mut cmd = redis::cmd("EVAL");
                    cmd.arg(&script.source).arg(keys.len()).arg(keys).arg(args);
                    self.conn.run(&cmd).await
                }
                other => other,
            }
        })
        .await
    }
}

/// Sorts a Redis error into transient (worth retrying later) or not.
fn classify(e: RedisError, budget: Duration) -> StoreError {
    if e.is_timeout() {
        return StoreError::Timeout { budget };
    }
    if e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_cluster_error()
    {
        return StoreError::Unavailable(e.to_string());
    }
    match e.kind() {
        ErrorKind::Server(
            ServerErrorKind::MasterDown | ServerErrorKind::BusyLoading | ServerErrorKind::ReadOnly,
        )
        | ErrorKind::ClusterConnectionNotFound => StoreError::Unavailable(e.to_string()),
        ErrorKind::Parse | ErrorKind::UnexpectedReturnType => StoreError::BadReply(e.to_string()),
        _ if e.code() == Some("BUSY") => StoreError::Unavailable(e.to_string()),
        _ => StoreError::Rejected(e.to_string()),
    }
}

/// The three arguments that describe a bucket's limit to the scripts.
fn limit_args(limit: &Limit, args: &mut Vec<String>) {
    let (p1, p2) = limit.script_params();
    args.push(limit.algorithm().script_code().to_string());
    args.push(p1);
    args.push(p2);
}

impl LeaseStore for RedisStore {
    async fn check(&self, req: &CheckRequest) -> Result<CheckOutcome, StoreError> {
        let items = req.items();
        let keys: Vec<String> = items
            .iter()
            .map(|i| state_key(&i.key, &i.limit).into_owned())
            .collect();
        let mut args = Vec::with_capacity(2 + 4 * items.len());
        args.push(nonce());
        args.push(if req.is_peek() { "1" } else { "0" }.to_owned());
        for item in items {
            limit_args(&item.limit, &mut args);
            args.push(item.cost.to_string());
        }
        let reply = self.eval(&SCRIPTS.check, &keys, &args).await?;
        reply::check(reply, items.len())
    }

    async fn acquire_leases(&self, req: &LeaseRequest) -> Result<Vec<LeaseGrant>, StoreError> {
        let asks = req.asks();
        let mut keys = Vec::with_capacity(2 * asks.len());
        let mut args = Vec::with_capacity(2 + 6 * asks.len());
        args.push(nonce());
        args.push((req.ttl().as_micros() as u64).to_string());
        for ask in asks {
            keys.push(state_key(&ask.key, &ask.limit).into_owned());
            keys.push(ask.key.lease_key());
            limit_args(&ask.limit, &mut args);
            args.push(ask.want.to_string());
            args.push(ask.min.to_string());
            args.push(format!("{:?}", ask.max_share));
        }
        let reply = self.eval(&SCRIPTS.lease_acquire, &keys, &args).await?;
        reply::grants(reply, asks.len())
    }

    async fn return_leases(&self, req: &ReturnRequest) -> Result<Vec<u64>, StoreError> {
        let items = req.items();
        let mut keys = Vec::with_capacity(2 * items.len());
        let mut args = Vec::with_capacity(5 * items.len());
        for item in items {
            keys.push(state_key(&item.key, &item.limit).into_owned());
            keys.push(item.key.lease_key());
            limit_args(&item.limit, &mut args);
            args.push(item.lease.as_str().to_owned());
            args.push(item.unspent.to_string());
        }
        let reply = self.eval(&SCRIPTS.lease_return, &keys, &args).await?;
        reply::counts(reply, items.len(), "lease return reply")
    }

    async fn release_slots(&self, req: &SlotRelease) -> Result<Vec<bool>, StoreError> {
        let items = req.items();
        let keys: Vec<String> = items.iter().map(|(k, _)| format!("{k}:slots")).collect();
        let args: Vec<String> = items.iter().map(|(_, s)| s.as_str().to_owned()).collect();
        let reply = self.eval(&SCRIPTS.slot_release, &keys, &args).await?;
        Ok(reply::counts(reply, items.len(), "slot release reply")?
            .into_iter()
            .map(|n| n == 1)
            .collect())
    }

    async fn debit(&self, req: &DebitRequest) -> Result<Vec<u64>, StoreError> {
        let items = req.items();
        let keys: Vec<String> = items
            .iter()
            .flat_map(|i| [state_key(&i.key, &i.limit).into_owned(), i.key.remote_key()])
            .collect();
        let mut args = Vec::with_capacity(7 * items.len());
        for item in items {
            limit_args(&item.limit, &mut args);
            args.push(item.units.to_string());
            args.push(item.consumed_at.map(|t| t.to_string()).unwrap_or_default());
            match &item.once {
                Some(once) => {
                    args.push(once.origin.clone());
                    args.push(once.until.to_string());
                }
                None => args.extend([String::new(), String::new()]),
            }
        }
        let reply = self.eval(&SCRIPTS.debit, &keys, &args).await?;
        reply::counts(reply, items.len(), "debit reply")
    }
}
