//! The connection every operation runs on, and DDL with a bounded lock wait.
//!
//! Operations use their own autocommit connection rather than a pooled one:
//! `DETACH PARTITION … CONCURRENTLY` refuses a transaction block and may
//! wait for old snapshots longer than any service statement_timeout.

use std::time::Duration;

use adk_postgres_schema::quote::quote_literal;
use diesel::QueryableByName;
use diesel::sql_types::Bool;
use diesel_async::{AsyncPgConnection, RunQueryDsl as _, SimpleAsyncConnection};

use crate::error::{RetentionError, is_lock_wait};

/// How DDL waits for locks.
#[derive(Debug, Clone)]
pub struct LockPolicy {
    /// Longest a DDL statement queues for its lock; while it queues, it
    /// blocks every newer query on the table, so keep this short.
    pub lock_timeout: Duration,
    /// Tries per statement before giving up.
    pub attempts: u32,
    /// Pause after the first failed try; doubles each time.
    pub backoff: Duration,
}

impl Default for LockPolicy {
    fn default() -> Self {
        Self { lock_timeout: Duration::from_secs(2), attempts: 6, backoff: Duration::from_millis(200) }
    }
}

/// Opens an autocommit connection for operations work: ISO dates (partition
/// bounds are parsed from text), UTC, no statement timeout, and the
/// policy's lock timeout.
pub async fn connect(
    database_url: &str,
    application_name: &str,
    policy: &LockPolicy,
) -> Result<AsyncPgConnection, RetentionError> {
    let mut conn = adk_postgres_connect::establish(database_url).await?;
    conn.batch_execute(&format!(
        "SET application_name = {}; SET DateStyle = ISO; SET TimeZone = 'UTC'; \
         SET statement_timeout = 0; SET lock_timeout = {}",
        quote_literal(application_name),
        policy.lock_timeout.as_millis().max(1)
    ))
    .await
    .map_err(RetentionError::query("configure the operations connection"))?;
    Ok(conn)
}

/// Paces the attempts of one statement that may time out waiting for a
/// lock: a pause that doubles after each timeout, up to the policy's number
/// of attempts, then a typed `LockTimeout`.
#[derive(Debug)]
pub struct LockRetry<'a> {
    statement: &'a str,
    attempts: u32,
    attempt: u32,
    pause: Duration,
}

impl<'a> LockRetry<'a> {
    pub fn new(statement: &'a str, policy: &LockPolicy) -> Self {
        Self { statement, attempts: policy.attempts.max(1), attempt: 1, pause: policy.backoff }
    }

    /// The attempt about to run (or that just succeeded), from 1.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// Judges one attempt: `Ok(true)` when it succeeded, `Ok(false)` after
    /// pausing when a lock wait timed out and another attempt is due, an
    /// error otherwise.
    pub async fn settle(&mut self, result: diesel::QueryResult<()>) -> Result<bool, RetentionError> {
        match result {
            Ok(()) => Ok(true),
            Err(e) if is_lock_wait(&e) && self.attempt < self.attempts => {
                tracing::warn!(statement = self.statement, attempt = self.attempt, "lock wait timed out; retrying");
                tokio::time::sleep(self.pause).await;
                self.pause = self.pause.saturating_mul(2);
                self.attempt += 1;
                Ok(false)
            }
            Err(e) if is_lock_wait(&e) => {
                Err(RetentionError::LockTimeout { statement: self.statement.to_owned(), attempts: self.attempts })
            }
            Err(e) => Err(RetentionError::Query { context: self.statement.to_owned(), source: e }),
        }
    }
}

/// Runs one DDL statement, retrying with backoff when it times out waiting
/// for a lock. Returns the number of attempts it took.
pub async fn ddl(conn: &mut AsyncPgConnection, statement: &str, policy: &LockPolicy) -> Result<u32, RetentionError> {
    let mut retry = LockRetry::new(statement, policy);
    loop {
        let result = conn.batch_execute(statement).await;
        if retry.settle(result).await? {
            return Ok(retry.attempt());
        }
    }
}

/// The first row of a reply that was read to its end (`load`).
///
/// Never diesel-async's `get_result`/`first` in this crate: they return on
/// the first row and drop the rest of the reply before PostgreSQL's
/// ReadyForQuery, so an error the server sends after that row — a failed
/// commit of an autocommit write, a connection lost at that moment — would
/// go unseen and the write would be reported as done.
pub(crate) fn first_row<T>(rows: Vec<T>) -> diesel::QueryResult<T> {
    rows.into_iter().next().ok_or(diesel::result::Error::NotFound)
}

/// The schema holding `adk_events`, or `NotMigrated`.
pub async fn events_schema(conn: &mut AsyncPgConnection) -> Result<String, RetentionError> {
    adk_postgres_schema::catalog::store_schema(conn)
        .await
        .map_err(RetentionError::query("find adk_events"))?
        .ok_or_else(|| RetentionError::NotMigrated("table adk_events does not exist".into()))
}

#[derive(QueryableByName)]
struct DistributedRow {
    #[diesel(sql_type = Bool)]
    answer: bool,
}

/// Whether the store runs on Citus: the database has the citus extension,
/// which is what makes the migrations distribute it. A few operations
/// must take another path there (see each caller).
pub async fn on_citus(conn: &mut AsyncPgConnection) -> Result<bool, RetentionError> {
    Ok(diesel::sql_query(adk_postgres_schema::citus::CITUS_INSTALLED_SQL)
        .load::<DistributedRow>(conn)
        .await
        .and_then(first_row)
        .map_err(RetentionError::query("look for the citus extension"))?
        .answer)
}
