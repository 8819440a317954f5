//! The connection pool every store operation borrows from.

use std::time::Duration;

use diesel_async::AsyncPgConnection;
use diesel_async::pooled_connection::bb8::Pool;
use diesel_async::pooled_connection::{AsyncDieselConnectionManager, ManagerConfig, RecyclingMethod};
use diesel_async::{AsyncConnection, SimpleAsyncConnection};
use futures_util::FutureExt;

/// A bb8 pool of diesel-async PostgreSQL connections.
pub type PgPool = Pool<AsyncPgConnection>;

/// How connections are made and how many are kept.
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// Most connections open at once.
    pub max_size: u32,
    /// Connections kept open while idle.
    pub min_idle: Option<u32>,
    /// How long a caller waits for a free connection before an error.
    pub connection_timeout: Duration,
    /// Reported in `pg_stat_activity`, so operators can tell our sessions apart.
    pub application_name: String,
    /// Server-side cap on any one statement; a statement past it is cancelled
    /// by the server, never by dropping a future (which could strand a
    /// transaction on a pooled connection).
    pub statement_timeout: Duration,
    /// Server-side cap on waiting for a row or table lock.
    pub lock_timeout: Duration,
    /// Server-side cap on a transaction left open by a stalled client.
    pub idle_in_transaction_session_timeout: Duration,
}

impl Default for PoolConfig {
    fn default() -> Self {
        Self {
            max_size: 16,
            min_idle: None,
            connection_timeout: Duration::from_secs(10),
            application_name: "adk-postgres".to_owned(),
            statement_timeout: Duration::from_secs(30),
            lock_timeout: Duration::from_secs(10),
            idle_in_transaction_session_timeout: Duration::from_secs(60),
        }
    }
}

/// Why a pool could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PoolBuildError {
    #[error("invalid pool configuration: {field}: {reason}")]
    InvalidConfig { field: &'static str, reason: String },
    #[error("could not open the first connection: {0}")]
    Connect(#[source] diesel_async::pooled_connection::PoolError),
}

fn millis(field: &'static str, d: Duration) -> Result<u128, PoolBuildError> {
    let ms = d.as_millis();
    if ms == 0 && !d.is_zero() {
        return Err(PoolBuildError::InvalidConfig { field, reason: "below one millisecond".into() });
    }
    if ms > i32::MAX as u128 {
        return Err(PoolBuildError::InvalidConfig { field, reason: "above 24 days".into() });
    }
    Ok(ms)
}

/// The `SET` commands every new connection runs once.
fn session_setup_sql(config: &PoolConfig) -> Result<String, PoolBuildError> {
    if config.application_name.contains('\0') || config.application_name.len() > 63 {
        return Err(PoolBuildError::InvalidConfig {
            field: "application_name",
            reason: "must be at most 63 bytes without NUL".into(),
        });
    }
    let app = config.application_name.replace('\'', "''");
    Ok(format!(
        "SET application_name = '{app}'; SET statement_timeout = {}; SET lock_timeout = {}; \
         SET idle_in_transaction_session_timeout = {}",
        millis("statement_timeout", config.statement_timeout)?,
        millis("lock_timeout", config.lock_timeout)?,
        millis("idle_in_transaction_session_timeout", config.idle_in_transaction_session_timeout)?,
    ))
}

/// Builds a pool for `database_url` and opens its first connection, so a bad
/// URL or an unreachable server is reported here rather than on first use.
pub async fn build_pool(database_url: &str, config: &PoolConfig) -> Result<PgPool, PoolBuildError> {
    if config.max_size == 0 {
        return Err(PoolBuildError::InvalidConfig { field: "max_size", reason: "must be at least 1".into() });
    }
    let setup_sql = session_setup_sql(config)?;
    let mut manager_config = ManagerConfig::<AsyncPgConnection>::default();
    // A fast check is enough: a dead connection surfaces as a retryable error
    // on its next use and bb8 replaces it, and the check query would add a
    // round trip to every checkout.
    manager_config.recycling_method = RecyclingMethod::Fast;
    manager_config.custom_setup = Box::new(move |url| {
        let setup_sql = setup_sql.clone();
        async move {
            let mut conn = AsyncPgConnection::establish(url).await?;
            conn.batch_execute(&setup_sql).await.map_err(|e| diesel::ConnectionError::BadConnection(e.to_string()))?;
            Ok(conn)
        }
        .boxed()
    });
    let manager = AsyncDieselConnectionManager::new_with_config(database_url, manager_config);
    Pool::builder()
        .max_size(config.max_size)
        .min_idle(config.min_idle)
        .connection_timeout(config.connection_timeout)
        .test_on_check_out(true)
        .build(manager)
        .await
        .map_err(PoolBuildError::Connect)
}
