//! Expiry: deleting sessions whose `expires_at` has passed, in small
//! batches so locks and WAL bursts stay short. Rows an in-flight append
//! holds are skipped and picked up by the next run. Each deleted session
//! takes its events along (the foreign key carries `session_day`, so the
//! cascade reads one partition).
//!
//! On Citus the batch is chosen by key rather than by ctid, and rows an
//! append holds are waited for rather than skipped: Citus plans neither a
//! ctid nor `FOR UPDATE` across shards. An append holds its session's row
//! only for its own short transaction.

use chrono::{DateTime, Utc};
use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Nullable, Timestamptz};
use diesel_async::RunQueryDsl;
use serde::Serialize;

use crate::RetentionError;
use adk_postgres_operations::{LockPolicy, connect, first_row, on_citus};

/// What an expiry run deleted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ExpiryReport {
    /// Sessions past their `expires_at` that were deleted.
    pub sessions_deleted: u64,
    /// Events that went with them (each session's `last_seq`).
    pub events_deleted: u64,
    /// Statements that deleted at least one session.
    pub batches: u32,
}

impl std::fmt::Display for ExpiryReport {
    /// What `adk-pg expire` prints after a run.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "expired {} session(s) and {} event(s) in {} batch(es)",
            self.sessions_deleted, self.events_deleted, self.batches
        )
    }
}

#[derive(QueryableByName)]
struct BatchRow {
    #[diesel(sql_type = BigInt)]
    sessions: i64,
    #[diesel(sql_type = Nullable<BigInt>)]
    events: Option<i64>,
}

const EXPIRE_SQL: &str = "\
WITH gone AS (
    DELETE FROM adk_sessions WHERE ctid = ANY (ARRAY(
        SELECT ctid FROM adk_sessions
        WHERE expires_at < coalesce($1, now())
        LIMIT $2
        FOR UPDATE SKIP LOCKED))
    RETURNING last_seq)
SELECT count(*) AS sessions, sum(last_seq)::bigint AS events FROM gone";

/// [`EXPIRE_SQL`] for Citus: the batch's keys become an intermediate result
/// that every shard deletes from.
const EXPIRE_BY_KEY_SQL: &str = "\
WITH gone AS (
    DELETE FROM adk_sessions WHERE (app_name, user_id, session_id) IN (
        SELECT app_name, user_id, session_id FROM adk_sessions
        WHERE expires_at < coalesce($1, now())
        LIMIT $2)
    RETURNING last_seq)
SELECT count(*) AS sessions, sum(last_seq)::bigint AS events FROM gone";

/// Deletes every session expired as of `as_of` (the server's clock when
/// `None`), `batch_size` sessions per statement, until a batch finds none.
pub async fn expire_sessions(
    database_url: &str,
    batch_size: i64,
    as_of: Option<DateTime<Utc>>,
) -> Result<ExpiryReport, RetentionError> {
    if batch_size < 1 {
        return Err(RetentionError::InvalidInput { field: "batch_size", reason: "must be at least 1".into() });
    }
    let mut conn = connect(database_url, "adk-pg expire", &LockPolicy::default()).await?;
    let statement = if on_citus(&mut conn).await? { EXPIRE_BY_KEY_SQL } else { EXPIRE_SQL };
    let mut report = ExpiryReport::default();
    loop {
        let batch = diesel::sql_query(statement)
            .bind::<Nullable<Timestamptz>, _>(as_of)
            .bind::<BigInt, _>(batch_size)
            .load::<BatchRow>(&mut conn)
            .await
            .and_then(first_row)
            .map_err(RetentionError::query("delete expired sessions"))?;
        if batch.sessions == 0 {
            return Ok(report);
        }
        report.batches += 1;
        report.sessions_deleted += u64::try_from(batch.sessions).unwrap_or_default();
        report.events_deleted += u64::try_from(batch.events.unwrap_or_default()).unwrap_or_default();
    }
}
