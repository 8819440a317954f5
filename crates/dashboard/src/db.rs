//! The one kind of connection the server reads on: its own, read-only,
//! with every statement and lock wait cut off by a timeout.

use std::collections::BTreeSet;
use std::time::Duration;

use adk_postgres_schema::MIGRATIONS;
use diesel::QueryableByName;
use diesel::migration::MigrationSource;
use diesel::pg::Pg;
use diesel::sql_types::{Bool, Text};
use diesel_async::{AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};

use crate::error::SectionError;
use crate::gather::MigrationStatus;

/// How the server's connections are opened.
#[derive(Debug, Clone)]
pub(crate) struct DbSettings {
    pub url: String,
    pub statement_timeout: Duration,
    pub connect_timeout: Duration,
}

/// Opens a connection for one request.
///
/// A fresh connection per request rather than a pool: requests are few
/// (a scrape a minute, a person now and then), and a connection that was
/// cut off mid-statement is simply dropped with its request. The settings
/// make it safe to point at a production store:
/// - `default_transaction_read_only`: any write or DDL, from this crate or
///   a library it calls, fails instead of happening;
/// - `statement_timeout` and `lock_timeout`: a slow or locked table fails
///   one statement, and so one section, instead of hanging the page;
/// - UTC and ISO dates: partition bounds are parsed from text, and nothing
///   may depend on the server's TimeZone.
pub(crate) async fn connect(settings: &DbSettings) -> Result<AsyncPgConnection, SectionError> {
    const CONTEXT: &str = "connect to the database";
    // Cancelling a connection attempt leaves nothing behind: no statement
    // or transaction has started on it yet.
    let mut conn =
        match tokio::time::timeout(settings.connect_timeout, adk_postgres_connect::establish(&settings.url)).await {
            Ok(Ok(conn)) => conn,
            Ok(Err(e)) => return Err(SectionError::new(CONTEXT, &e)),
            Err(_) => {
                return Err(SectionError::timeout(
                    CONTEXT,
                    format!("no connection within {}", humantime::format_duration(settings.connect_timeout)),
                ));
            }
        };
    let millis = settings.statement_timeout.as_millis().max(1);
    conn.batch_execute(&format!(
        "SET application_name = 'adk-pg serve'; SET DateStyle = ISO; SET TimeZone = 'UTC'; \
         SET statement_timeout = {millis}; SET lock_timeout = {millis}; \
         SET idle_in_transaction_session_timeout = {millis}; SET default_transaction_read_only = on"
    ))
    .await
    .map_err(|e| SectionError::new("configure the connection", &e))?;
    Ok(conn)
}

#[derive(QueryableByName)]
struct ExistsRow {
    #[diesel(sql_type = Bool)]
    exists: bool,
}

#[derive(QueryableByName)]
struct VersionRow {
    #[diesel(sql_type = Text)]
    version: String,
}

/// The migrations compiled into this binary that the database lacks.
///
/// Read from diesel's bookkeeping table directly: diesel's own
/// `pending_migrations` first runs `CREATE TABLE IF NOT EXISTS` on it,
/// which is DDL, and this server runs none.
pub(crate) async fn migration_status(conn: &mut AsyncPgConnection) -> Result<MigrationStatus, SectionError> {
    const CONTEXT: &str = "read the applied migrations";
    let compiled: Vec<String> = MigrationSource::<Pg>::migrations(&MIGRATIONS)
        .map_err(|e| SectionError::new("list the compiled migrations", &e))?
        .iter()
        .map(|migration| migration.name().version().to_string())
        .collect();
    let exists = diesel::sql_query("SELECT to_regclass('__diesel_schema_migrations') IS NOT NULL AS exists")
        .load::<ExistsRow>(conn)
        .await
        .map_err(|e| SectionError::new(CONTEXT, &e))?
        .into_iter()
        .next()
        .is_some_and(|row| row.exists);
    let applied: BTreeSet<String> = if exists {
        diesel::sql_query("SELECT version::text AS version FROM __diesel_schema_migrations")
            .load::<VersionRow>(conn)
            .await
            .map_err(|e| SectionError::new(CONTEXT, &e))?
            .into_iter()
            .map(|row| row.version)
            .collect()
    } else {
        BTreeSet::new()
    };
    let pending: Vec<String> = compiled.iter().filter(|version| !applied.contains(*version)).cloned().collect();
    Ok(MigrationStatus { compiled: compiled.len(), pending })
}
