//! The embedded diesel migrations and the code that applies them.
//!
//! diesel's migration harness is synchronous; it runs on an
//! `AsyncConnectionWrapper` inside `spawn_blocking` so callers on any tokio
//! runtime flavour can migrate.

use diesel::migration::MigrationVersion;
use diesel_async::AsyncPgConnection;
use diesel_async::async_connection_wrapper::AsyncConnectionWrapper;
use diesel_migrations::{EmbeddedMigrations, MigrationHarness, embed_migrations};

use crate::citus::{self, CitusLayout};
use crate::names::lock_keys;
use crate::replaceable;

/// Every migration in `migrations/` at the workspace root, compiled in.
/// They are read through the crate's own `migrations` link to that folder,
/// so the packaged crate carries them and builds outside the workspace.
pub const MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations");

/// Migration 000001's `up.sql`. The live-table conversion in
/// adk-postgres-retention runs its `CREATE TABLE adk_events` verbatim, so
/// a converted table is exactly what a fresh install creates.
pub const CREATE_STORE_UP_SQL: &str = include_str!("../migrations/2026-11-01-000001_create_store/up.sql");

/// Why migrating failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MigrationError {
    /// The database could not be reached (address, TLS, credentials or the
    /// connect bound); nothing was applied.
    #[error("could not connect to run migrations: {0}")]
    Connect(#[source] diesel::ConnectionError),
    /// Taking the migration lock, applying or reverting a migration, or
    /// making the policy's event partitions failed; the message says which.
    #[error("migration failed: {0}")]
    Apply(String),
    /// Installing the store's SQL functions (`crates/schema/sql`) after a
    /// migrate, or dropping them after a revert, failed; the message names
    /// the step.
    #[error("installing the store's functions (crates/schema/sql) failed: {0}")]
    Replaceable(String),
    /// Creating the `citus` extension, distributing the store's tables and
    /// functions, or reading their layout failed.
    #[error("distributing the store on Citus failed: {0}")]
    Citus(String),
    /// The blocking task that drives diesel's synchronous harness panicked or
    /// was cancelled.
    #[error("the migration task panicked or was cancelled: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// Only the install's BEGIN and COMMIT fail this way; every statement
/// inside names what it was doing.
impl From<diesel::result::Error> for MigrationError {
    fn from(error: diesel::result::Error) -> Self {
        MigrationError::Replaceable(error.to_string())
    }
}

type Wrapper = AsyncConnectionWrapper<AsyncPgConnection>;

/// Connects in async context (through the one connection module: TLS,
/// credentials, bounds); the synchronous harness then drives it from a
/// blocking thread.
async fn connect(database_url: &str) -> Result<Wrapper, MigrationError> {
    let conn = adk_postgres_connect::establish(database_url).await.map_err(MigrationError::Connect)?;
    Ok(Wrapper::from(conn))
}

/// Applies every pending migration, installs the store's functions from
/// `crates/schema/sql/` when their text changed (see [`replaceable`]), then
/// makes the event partitions the
/// store policy asks for (today through today + `premake_days`, UTC) that
/// are missing, so a new database takes appends at once, before any
/// maintenance has run. Returns the versions applied, oldest first.
///
/// On a database with the `citus` extension the store is then distributed
/// (see [`crate::citus`]), every time, so a later migration's new function
/// is delegated too.
pub async fn run_pending_migrations(database_url: &str) -> Result<Vec<String>, MigrationError> {
    migrate(database_url, Mode { premake: true, create_citus: false }).await
}

/// [`run_pending_migrations`] on Citus, chosen rather than detected: the
/// `citus` extension is created first when the database lacks it. The
/// workers must already be added (`citus_add_node`) for the shards to be
/// spread over them.
pub async fn run_pending_migrations_on_citus(database_url: &str) -> Result<Vec<String>, MigrationError> {
    migrate(database_url, Mode { premake: true, create_citus: true }).await
}

/// How the store is laid out on Citus, `None` on a database without the
/// `citus` extension.
pub async fn citus_layout(database_url: &str) -> Result<Option<CitusLayout>, MigrationError> {
    let mut conn = connect(database_url).await?;
    tokio::task::spawn_blocking(move || {
        if citus::citus_installed(&mut conn)? { citus::layout(&mut conn).map(Some) } else { Ok(None) }
    })
    .await?
}

/// Applies every pending migration and nothing else, for a caller that
/// makes partitions on its own terms: creating a partition locks
/// `adk_events` and `adk_sessions` exclusively, which a live conversion must
/// not do behind its writers' backs.
pub async fn apply_pending_migrations(database_url: &str) -> Result<Vec<String>, MigrationError> {
    migrate(database_url, Mode { premake: false, create_citus: false }).await
}

#[derive(Debug, Clone, Copy)]
struct Mode {
    premake: bool,
    create_citus: bool,
}

async fn migrate(database_url: &str, mode: Mode) -> Result<Vec<String>, MigrationError> {
    let mut conn = connect(database_url).await?;
    tokio::task::spawn_blocking(move || {
        use diesel::connection::SimpleConnection;
        // Services may migrate on start: they take turns, and the last ones
        // find nothing pending and the same functions installed. The lock
        // is the session's, so it goes with the connection whatever fails.
        conn.batch_execute(&format!("SELECT pg_catalog.pg_advisory_lock({})", lock_keys::MIGRATION))
            .map_err(|e| MigrationError::Apply(format!("taking the migration lock: {e}")))?;
        // A migration's DDL queues behind any long transaction on its table,
        // and every create and append then queues behind the migration: on
        // a live database that is an outage. Failing after a few seconds
        // instead leaves the store serving, and the migrate can be retried.
        // Set after the advisory lock, which may rightly wait for another
        // service's whole migrate.
        conn.batch_execute(&format!("SET lock_timeout = '{}'", replaceable::LOCK_TIMEOUT))
            .map_err(|e| MigrationError::Apply(format!("setting lock_timeout: {e}")))?;
        if mode.create_citus {
            citus::create_extension(&mut conn)?;
        }
        let applied: Vec<String> = conn
            .run_pending_migrations(MIGRATIONS)
            .map_err(|e| MigrationError::Apply(e.to_string()))?
            .iter()
            .map(MigrationVersion::to_string)
            .collect();
        let on_citus = citus::citus_installed(&mut conn)?;
        replaceable::install(&mut conn, on_citus)?;
        if on_citus {
            citus::distribute(&mut conn)?;
        }
        if mode.premake {
            conn.batch_execute("SELECT adk_premake_event_partitions()")
                .map_err(|e| MigrationError::Apply(format!("making today's event partitions: {e}")))?;
        }
        Ok(applied)
    })
    .await?
}

/// Reverts every applied migration, newest first, then drops the functions
/// the files alone made ([`replaceable::FILES_ONLY`]); returns the versions
/// reverted.
pub async fn revert_all_migrations(database_url: &str) -> Result<Vec<String>, MigrationError> {
    let mut conn = connect(database_url).await?;
    tokio::task::spawn_blocking(move || {
        let reverted = conn.revert_all_migrations(MIGRATIONS).map_err(|e| MigrationError::Apply(e.to_string()))?;
        let reverted: Vec<String> = reverted.iter().map(MigrationVersion::to_string).collect();
        replaceable::drop_files_only(&mut conn)?;
        Ok(reverted)
    })
    .await?
}

/// Versions of the migrations compiled into this binary that the database has
/// not applied yet.
pub async fn pending_migrations(database_url: &str) -> Result<Vec<String>, MigrationError> {
    let mut conn = connect(database_url).await?;
    tokio::task::spawn_blocking(move || {
        let pending = conn.pending_migrations(MIGRATIONS).map_err(|e| MigrationError::Apply(e.to_string()))?;
        Ok(pending.iter().map(|m| m.name().version().to_string()).collect())
    })
    .await?
}
