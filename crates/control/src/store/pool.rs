//! The rule store's handle: a pool of PostgreSQL connections, and the migrations applied
//! through it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Config, Pool, PoolConfig, Runtime, Timeouts};
use tokio_postgres::NoTls;

use super::error::ControlError;

/// The rule store.
#[derive(Debug, Clone)]
pub struct RuleStore {
    pub(super) pool: Pool,
    url: String,
    /// The rule files the nodes read beside the store: a stored rule may replace one of
    /// theirs, and a write is checked against them (docs/rules-precedence.md).
    pub(super) rule_files: Arc<Vec<PathBuf>>,
}

impl RuleStore {
    /// A pool on `url` (no connection is made until used). Calls wait at most `timeout` for a
    /// connection, so an unreachable database fails requests fast.
    pub fn new(url: &str, timeout: Duration) -> Result<Self, ControlError> {
        let config = Config {
            url: Some(url.to_owned()),
            pool: Some(PoolConfig {
                max_size: 8,
                timeouts: Timeouts {
                    wait: Some(timeout),
                    create: Some(timeout),
                    recycle: Some(timeout),
                },
                ..PoolConfig::default()
            }),
            ..Config::default()
        };
        let pool = config
            .create_pool(Some(Runtime::Tokio1), NoTls)
            .map_err(|e| ControlError::Unavailable(e.to_string()))?;
        Ok(Self {
            pool,
            url: url.to_owned(),
            rule_files: Arc::default(),
        })
    }

    /// The store, checking each write against these rule files too: the files the nodes read
    /// beside it, whose rules a stored rule may replace.
    pub fn beside_rule_files(mut self, files: &[PathBuf]) -> Self {
        self.rule_files = Arc::new(files.to_vec());
        self
    }

    /// The database URL (for the listening connection).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Applies pending migrations.
    pub async fn migrate(&self) -> Result<usize, ControlError> {
        let mut client = self.pool.get().await?;
        Ok(crate::schema::migrate(&mut client).await?)
    }
}
