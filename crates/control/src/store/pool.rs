//! The rule store's handle: a pool of PostgreSQL connections, and the migrations applied
//! through it.

use std::time::Duration;

use deadpool_postgres::{Config, Pool, PoolConfig, Runtime, Timeouts};
use tokio_postgres::NoTls;

use super::error::ControlError;

/// The rule store.
#[derive(Debug, Clone)]
pub struct RuleStore {
    pub(super) pool: Pool,
    url: String,
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
        })
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
