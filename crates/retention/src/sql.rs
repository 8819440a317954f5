//! The connection every operation runs on, and DDL with a bounded lock wait.
//!
//! Operations use their own autocommit connection rather than a pooled one:
//! `DETACH PARTITION … CONCURRENTLY` refuses a transaction block and may
//! wait for old snapshots longer than any service statement_timeout.

use std::time::Duration;

use diesel::sql_types::Text;
use diesel::{QueryableByName, sql_query};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};

use crate::error::{OpsError, is_lock_wait};

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
) -> Result<AsyncPgConnection, OpsError> {
    let mut conn = AsyncPgConnection::establish(database_url).await?;
    let app = application_name.replace('\'', "''");
    conn.batch_execute(&format!(
        "SET application_name = '{app}'; SET DateStyle = ISO; SET TimeZone = 'UTC'; \
         SET statement_timeout = 0; SET lock_timeout = {}",
        policy.lock_timeout.as_millis().max(1)
    ))
    .await
    .map_err(OpsError::query("configure the operations connection"))?;
    Ok(conn)
}

/// Runs one DDL statement, retrying with backoff when it times out waiting
/// for a lock. Returns the number of attempts it took.
pub async fn ddl(conn: &mut AsyncPgConnection, statement: &str, policy: &LockPolicy) -> Result<u32, OpsError> {
    let mut pause = policy.backoff;
    let attempts = policy.attempts.max(1);
    for attempt in 1..=attempts {
        match conn.batch_execute(statement).await {
            Ok(()) => return Ok(attempt),
            Err(e) if is_lock_wait(&e) && attempt < attempts => {
                tracing::warn!(statement, attempt, "lock wait timed out; retrying");
                tokio::time::sleep(pause).await;
                pause = pause.saturating_mul(2);
            }
            Err(e) if is_lock_wait(&e) => {
                return Err(OpsError::LockTimeout { statement: statement.to_owned(), attempts });
            }
            Err(e) => return Err(OpsError::Query { context: statement.to_owned(), source: e }),
        }
    }
    Err(OpsError::LockTimeout { statement: statement.to_owned(), attempts })
}

/// `"name"` with embedded quotes doubled: every identifier built from data
/// goes through here.
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `'text'` with embedded quotes doubled, for the few DDL positions that take
/// no bind parameters (partition bounds, defaults).
pub fn quote_literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

#[derive(QueryableByName)]
struct SchemaRow {
    #[diesel(sql_type = Text)]
    schema: String,
}

/// The schema holding `adk_events`, or `NotMigrated`.
pub async fn events_schema(conn: &mut AsyncPgConnection) -> Result<String, OpsError> {
    let row = sql_query(
        "SELECT n.nspname::text AS schema FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE c.oid = to_regclass('adk_events')",
    )
    .get_result::<SchemaRow>(conn)
    .await
    .map_err(|e| match e {
        diesel::result::Error::NotFound => OpsError::NotMigrated("table adk_events does not exist".into()),
        other => OpsError::Query { context: "find adk_events".into(), source: other },
    })?;
    Ok(row.schema)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_doubles_embedded_quotes() {
        assert_eq!(quote_ident("a\"b"), "\"a\"\"b\"");
        assert_eq!(quote_literal("it's"), "'it''s'");
    }
}
