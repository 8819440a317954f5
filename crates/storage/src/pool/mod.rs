//! The connection pool every store operation borrows from.
//!
//! Connections come from [`adk_postgres_connect`] (TLS, credentials,
//! keepalives, the connect bound) and are the store's own [`PgConn`]: one
//! unnamed statement per round trip, nothing set after connecting, so the
//! pool works the same on a direct connection and behind a
//! transaction-mode pooler.

use std::sync::Arc;
use std::time::Duration;

use adk_postgres_connect::{ConnectConfig, ConnectError};

pub use crate::conn::PgConn;

mod gate;
mod retry;

pub use gate::CheckoutObserver;
pub(crate) use gate::FairGate;
pub(crate) use retry::{ConflictRetry, no_answer, with_retries};

/// A bb8 pool of the store's connections, with the settings they were
/// made with (the change feed opens its own connection from them).
#[derive(Debug, Clone)]
pub struct PgPool {
    inner: bb8::Pool<StoreConnections>,
    /// Connect failures, as bb8 reports them to its error sink: a waiting
    /// checkout fails with the cause at once instead of waiting out
    /// `connection_timeout` for a connection that is not coming.
    connect_failures: tokio::sync::broadcast::Sender<Arc<ConnectError>>,
    connect: Arc<ConnectConfig>,
    operation_timeout: Duration,
    max_size: u32,
    connection_timeout: Duration,
}

/// A connection borrowed from the pool; it goes back when dropped, unless
/// it is broken or was left mid-statement.
pub type PooledConn<'a> = bb8::PooledConnection<'a, StoreConnections>;

impl PgPool {
    /// A connection, waiting at most the pool's `connection_timeout`; a
    /// connect that fails meanwhile (TLS refused, credentials, a server
    /// that refuses connections) is the answer at once.
    pub async fn get(&self) -> Result<PooledConn<'_>, CheckoutError> {
        let mut failures = self.connect_failures.subscribe();
        tokio::select! {
            biased;
            got = self.inner.get() => got.map_err(|e| match e {
                bb8::RunError::User(e) => CheckoutError::Connect(Arc::new(e)),
                bb8::RunError::TimedOut => CheckoutError::TimedOut(self.connection_timeout),
            }),
            Ok(failure) = failures.recv() => Err(CheckoutError::Connect(failure)),
        }
    }

    /// How many connections the pool holds and how many are idle.
    pub fn state(&self) -> bb8::State {
        self.inner.state()
    }

    /// Most connections the pool opens.
    pub fn max_size(&self) -> u32 {
        self.max_size
    }

    /// How long a checkout waits for a connection.
    pub fn connection_timeout(&self) -> Duration {
        self.connection_timeout
    }

    /// The settings every connection of the pool is made with.
    pub fn connect_config(&self) -> &ConnectConfig {
        &self.connect
    }

    /// [`PoolConfig::operation_timeout`].
    pub fn operation_timeout(&self) -> Duration {
        self.operation_timeout
    }
}

/// How connections are made and how many are kept.
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// Most connections open at once.
    pub max_size: u32,
    /// Connections kept open while idle.
    pub min_idle: Option<u32>,
    /// How long a caller waits for a free connection before an error.
    pub connection_timeout: Duration,
    /// Reported in `pg_stat_activity`, so operators can tell our sessions
    /// apart (sent at startup; a connection string's own wins).
    pub application_name: String,
    /// The client's bound on each store call, from its start to its answer:
    /// past it the call returns a retryable `Unavailable`, the connection
    /// it was using is discarded (never handed to another caller) and the
    /// server is asked to cancel the statement. It is what bounds a call
    /// when the network goes silent, since the server-side timeouts below
    /// are enforced by a server that may no longer be reachable.
    pub operation_timeout: Duration,
    /// Server-side cap on any one statement, under `operation_timeout` so
    /// that a slow statement on a reachable server ends as a typed
    /// `Timeout` with its connection kept. Sent in the startup packet; a
    /// pooler that refuses startup options gets none of these three, and
    /// the role's defaults (`adk-pg service-role` sets them) apply instead.
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
            operation_timeout: Duration::from_secs(30),
            statement_timeout: Duration::from_secs(25),
            lock_timeout: Duration::from_secs(10),
            idle_in_transaction_session_timeout: Duration::from_secs(60),
        }
    }
}

/// Why no connection could be checked out.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum CheckoutError {
    /// Every connection stayed busy for the pool's `connection_timeout`
    /// (the duration); retryable.
    #[error("no database connection within {0:?} (connection_timeout)")]
    TimedOut(Duration),
    /// Opening a new connection failed; retryable when the
    /// [`ConnectError`] is.
    #[error("no database connection: {0}")]
    Connect(Arc<ConnectError>),
}

impl CheckoutError {
    /// Worth retrying: the pool was busy, or the connect failed for a
    /// reason that may pass.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::TimedOut(_) => true,
            Self::Connect(e) => e.is_retryable(),
        }
    }
}

/// Hands bb8's connect failures to the checkouts waiting for them.
#[derive(Debug, Clone)]
struct ConnectFailures(tokio::sync::broadcast::Sender<Arc<ConnectError>>);

impl bb8::ErrorSink<ConnectError> for ConnectFailures {
    fn sink(&self, error: ConnectError) {
        tracing::debug!(%error, "a new database connection failed");
        // Nobody waiting is fine: the next checkout tries again.
        let _ = self.0.send(Arc::new(error));
    }

    fn boxed_clone(&self) -> Box<dyn bb8::ErrorSink<ConnectError>> {
        Box::new(self.clone())
    }
}

/// Why a pool could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PoolBuildError {
    /// A [`PoolConfig`] field is out of range; nothing was opened.
    #[error("invalid pool configuration: {field}: {reason}")]
    InvalidConfig {
        /// The field at fault, such as `max_size`.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The connection string was refused, or the first connection could not
    /// be opened in time.
    #[error("could not open the first connection: {0}")]
    Connect(#[source] Arc<ConnectError>),
}

fn millis(field: &'static str, d: Duration) -> Result<String, PoolBuildError> {
    let ms = d.as_millis();
    if ms == 0 && !d.is_zero() {
        return Err(PoolBuildError::InvalidConfig { field, reason: "below one millisecond".into() });
    }
    if ms > i32::MAX as u128 {
        return Err(PoolBuildError::InvalidConfig { field, reason: "above 24 days".into() });
    }
    Ok(ms.to_string())
}

/// The server settings every connection of the pool starts with.
fn server_settings(config: &PoolConfig) -> Result<Vec<(String, String)>, PoolBuildError> {
    Ok(vec![
        ("statement_timeout".to_owned(), millis("statement_timeout", config.statement_timeout)?),
        ("lock_timeout".to_owned(), millis("lock_timeout", config.lock_timeout)?),
        (
            "idle_in_transaction_session_timeout".to_owned(),
            millis("idle_in_transaction_session_timeout", config.idle_in_transaction_session_timeout)?,
        ),
    ])
}

/// Makes the pool's connections.
#[derive(Debug, Clone)]
pub struct StoreConnections {
    connect: ConnectConfig,
}

impl StoreConnections {
    /// How each connection is opened, the pool's server settings included.
    pub fn connect_config(&self) -> &ConnectConfig {
        &self.connect
    }
}

impl bb8::ManageConnection for StoreConnections {
    type Connection = PgConn;
    type Error = ConnectError;

    async fn connect(&self) -> Result<PgConn, ConnectError> {
        let connected = self.connect.connect().await?;
        Ok(PgConn::new(connected, &self.connect))
    }

    /// No round trip: a dead connection fails its next statement as a
    /// retryable error and is replaced; a check query on every checkout
    /// would double the round trips of every operation.
    async fn is_valid(&self, conn: &mut PgConn) -> Result<(), ConnectError> {
        if conn.is_broken() { Err(ConnectError::Closed { target: self.connect.redacted().to_owned() }) } else { Ok(()) }
    }

    fn has_broken(&self, conn: &mut PgConn) -> bool {
        conn.is_broken()
    }
}

/// The connection settings a pool of `config` uses on top of `connect`.
fn pool_connect_config(connect: ConnectConfig, config: &PoolConfig) -> Result<ConnectConfig, PoolBuildError> {
    if config.application_name.contains('\0') || config.application_name.len() > 63 {
        return Err(PoolBuildError::InvalidConfig {
            field: "application_name",
            reason: "must be at most 63 bytes without NUL".into(),
        });
    }
    if config.operation_timeout.is_zero() {
        return Err(PoolBuildError::InvalidConfig { field: "operation_timeout", reason: "must be above zero".into() });
    }
    Ok(connect.with_default_application_name(&config.application_name).with_server_settings(server_settings(config)?))
}

/// Builds a pool for `database_url` (a libpq connection string) and opens
/// its first connection, so a bad URL or an unreachable server is reported
/// here rather than on first use.
pub async fn build_pool(database_url: &str, config: &PoolConfig) -> Result<PgPool, PoolBuildError> {
    let connect = ConnectConfig::from_url(database_url).map_err(|e| PoolBuildError::Connect(Arc::new(e)))?;
    build_pool_with(connect, config).await
}

/// [`build_pool`] from connection settings already made (a password
/// provider, say).
pub async fn build_pool_with(connect: ConnectConfig, config: &PoolConfig) -> Result<PgPool, PoolBuildError> {
    if config.max_size == 0 {
        return Err(PoolBuildError::InvalidConfig { field: "max_size", reason: "must be at least 1".into() });
    }
    let connect = pool_connect_config(connect, config)?;
    let (connect_failures, _) = tokio::sync::broadcast::channel(16);
    let inner = bb8::Pool::builder()
        .max_size(config.max_size)
        .min_idle(config.min_idle)
        .connection_timeout(config.connection_timeout)
        .test_on_check_out(true)
        // The connection used last goes out first: a service's calls keep
        // landing on the few backends whose caches (catalog, plans, CPU)
        // are warm, and the surplus left by a burst stays idle until
        // `idle_timeout` closes it. bb8's default, first in first out,
        // rotates every call through every open connection: with 16 open, a
        // list of 100 ran at 70% of the pace it keeps on the one used last.
        .queue_strategy(bb8::QueueStrategy::Lifo)
        // A failed connect is the caller's answer at once, with its typed
        // cause (a refused TLS handshake, a failing password provider);
        // bb8's own retries would turn it into a bare timeout.
        .retry_connection(false)
        .error_sink(Box::new(ConnectFailures(connect_failures.clone())))
        .build(StoreConnections { connect: connect.clone() })
        .await
        .map_err(|e| PoolBuildError::Connect(Arc::new(e)))?;
    let pool = PgPool {
        inner,
        connect_failures,
        connect: Arc::new(connect),
        operation_timeout: config.operation_timeout,
        max_size: config.max_size,
        connection_timeout: config.connection_timeout,
    };
    match pool.get().await {
        Ok(first) => drop(first),
        Err(CheckoutError::Connect(e)) => return Err(PoolBuildError::Connect(e)),
        Err(CheckoutError::TimedOut(bound)) => {
            let target = pool.connect.redacted().to_owned();
            return Err(PoolBuildError::Connect(Arc::new(ConnectError::Timeout { target, bound })));
        }
    }
    Ok(pool)
}
