//! Why an operation failed, typed so a caller can tell a lock wait it gave
//! up on from refused input, a conflict or an unmigrated database.

/// Why a maintenance, expiry, conversion, index, health or rollup
/// operation failed. Retention publishes it as `RetentionError`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OperationsError {
    /// The database could not be reached or refused the connection.
    #[error("could not connect: {0}")]
    Connect(#[from] diesel::ConnectionError),
    /// A statement failed; `context` says what it was doing.
    #[error("{context}: {source}")]
    Query {
        /// What the statement was doing, or the DDL statement itself.
        context: String,
        /// diesel's error.
        #[source]
        source: diesel::result::Error,
    },
    /// A DDL statement kept waiting for its lock past `lock_timeout` on
    /// every attempt; live traffic was never blocked for longer than that.
    #[error("gave up after {attempts} attempts waiting for a lock: {statement}")]
    LockTimeout {
        /// The DDL statement.
        statement: String,
        /// How many times it was tried.
        attempts: u32,
    },
    /// A table or function the operation needs does not exist: run the
    /// migrations (`adk-pg migrate`).
    #[error("the database is not migrated: {0}")]
    NotMigrated(String),
    /// An argument was refused before anything ran.
    #[error("invalid {field}: {reason}")]
    InvalidInput {
        /// The argument at fault.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The operation cannot go on from what it found: another run holds its
    /// lock, a layout or partition bound it does not recognise, or a part it
    /// reads (such as the archive policy) failed. The message says which.
    #[error("{0}")]
    Conflict(String),
    /// Reading or changing the store's policy failed; names the field when
    /// a value was refused.
    #[error("{0}")]
    Store(#[from] adk_postgres_domain::StoreError),
}

impl OperationsError {
    /// Wraps a failed statement with what it was doing, for `map_err`.
    pub fn query(context: impl Into<String>) -> impl FnOnce(diesel::result::Error) -> Self {
        let context = context.into();
        move |source| Self::Query { context, source }
    }
}

/// Whether `error` is PostgreSQL giving up on a lock (lock_timeout) or
/// breaking a deadlock: both are worth another attempt after a pause.
pub fn is_lock_wait(error: &diesel::result::Error) -> bool {
    use adk_postgres_storage::pg_error::{PgFailure, classify};
    matches!(classify(error), PgFailure::LockTimeout | PgFailure::Deadlock)
}
