//! The connection every operation runs on, and the reads each job starts
//! with.
//!
//! Operations use their own autocommit connection rather than a pooled one:
//! `DETACH PARTITION … CONCURRENTLY` refuses a transaction block and may
//! wait for old snapshots longer than any service statement_timeout.

use adk_postgres_schema::quote::quote_literal;
use diesel::QueryableByName;
use diesel::sql_types::Bool;
use diesel_async::{AsyncPgConnection, RunQueryDsl as _, SimpleAsyncConnection};

use crate::error::OperationsError;
use crate::lock_wait::LockPolicy;

/// Opens an autocommit connection for operations work: ISO dates (partition
/// bounds are parsed from text), UTC, no statement timeout, and the
/// policy's lock timeout.
pub async fn connect(
    database_url: &str,
    application_name: &str,
    policy: &LockPolicy,
) -> Result<AsyncPgConnection, OperationsError> {
    let mut conn = adk_postgres_connect::establish(database_url).await?;
    conn.batch_execute(&format!(
        "SET application_name = {}; SET DateStyle = ISO; SET TimeZone = 'UTC'; \
         SET statement_timeout = 0; SET lock_timeout = {}",
        quote_literal(application_name),
        policy.lock_timeout.as_millis().max(1)
    ))
    .await
    .map_err(OperationsError::query("configure the operations connection"))?;
    Ok(conn)
}

/// The first row of a reply that was read to its end (`load`).
///
/// Never diesel-async's `get_result`/`first` in the operations: they return on
/// the first row and drop the rest of the reply before PostgreSQL's
/// ReadyForQuery, so an error the server sends after that row — a failed
/// commit of an autocommit write, a connection lost at that moment — would
/// go unseen and the write would be reported as done.
pub fn first_row<T>(rows: Vec<T>) -> diesel::QueryResult<T> {
    rows.into_iter().next().ok_or(diesel::result::Error::NotFound)
}

/// The schema holding `adk_events`, or `NotMigrated`.
pub async fn events_schema(conn: &mut AsyncPgConnection) -> Result<String, OperationsError> {
    adk_postgres_schema::catalog::store_schema(conn)
        .await
        .map_err(OperationsError::query("find adk_events"))?
        .ok_or_else(|| OperationsError::NotMigrated("table adk_events does not exist".into()))
}

#[derive(QueryableByName)]
struct DistributedRow {
    #[diesel(sql_type = Bool)]
    answer: bool,
}

/// Whether the store runs on Citus: the database has the citus extension,
/// which is what makes the migrations distribute it. A few operations
/// must take another path there (see each caller).
pub async fn on_citus(conn: &mut AsyncPgConnection) -> Result<bool, OperationsError> {
    Ok(diesel::sql_query(adk_postgres_schema::citus::CITUS_INSTALLED_SQL)
        .load::<DistributedRow>(conn)
        .await
        .and_then(first_row)
        .map_err(OperationsError::query("look for the citus extension"))?
        .answer)
}
