//! Retention: one day of events removed by our maintenance (DETACH
//! PARTITION … CONCURRENTLY, DROP TABLE, then the day's session rows) versus
//! `DELETE` of the same rows, in time and WAL bytes.
//!
//! Two identical days in one database: a recent one is deleted with
//! `DELETE` (maintenance keeps it), an old one is retired by
//! `run_maintenance`. Each is measured from a checkpoint, with autovacuum
//! kept off the seeded tables, so the WAL counted is the removal's alone.

use std::time::Instant;

use adk_postgres_domain::StorePolicy;
use adk_postgres_retention::{MaintenanceConfig, retire_before, run_maintenance};
use chrono::{Days, NaiveDate, Utc};
use serde::Serialize;
use tokio_postgres::Client;

use crate::floor::BoundEvent;
use crate::pgstat::{wal_lsn, wal_since};
use crate::server::connect;
use crate::workload::APP;

#[derive(Debug, Clone, Serialize)]
pub struct RetentionReport {
    pub events: i64,
    pub sessions: i64,
    pub drop_ms: f64,
    pub drop_wal_bytes: i64,
    pub delete_ms: f64,
    pub delete_wal_bytes: i64,
    /// drop WAL / delete WAL.
    pub wal_ratio: f64,
    /// drop time / delete time.
    pub time_ratio: f64,
    pub partitions_dropped: Vec<String>,
}

async fn seed_day(
    sql: &Client,
    day: NaiveDate,
    sessions: i32,
    events_per_session: i32,
    payload: &str,
) -> anyhow::Result<()> {
    sql.execute("SELECT adk_ensure_event_partition($1)", &[&day]).await?;
    sql.execute(
        "INSERT INTO adk_sessions (app_name, user_id, session_id, session_day, last_seq, state, created_at, updated_at)
         SELECT $4, 'u-' || s, $1::date::text || '-' || s, $1, $3::int, '{\"channel\": \"web\", \"turn\": 39}',
                ($1::date + time '12:00') AT TIME ZONE 'UTC', ($1::date + time '12:00') AT TIME ZONE 'UTC'
         FROM generate_series(1, $2) s",
        &[&day, &sessions, &events_per_session, &APP],
    )
    .await?;
    // The workload's own payload, its id made unique per row.
    sql.execute(
        "INSERT INTO adk_events (app_name, user_id, session_id, session_day, seq, event_id, invocation_id, author,
                                 event_ts, payload)
         SELECT $4, 'u-' || s, $1::date::text || '-' || s, $1, n, e.id, 'inv-' || n, 'assistant',
                (extract(epoch FROM $1::date)::bigint * 1000000000) + n, $5::text::jsonb || jsonb_build_object('id', e.id)
         FROM generate_series(1, $2) s, generate_series(1, $3) n,
              LATERAL (SELECT md5(s::text || '-' || n::text) AS id) e",
        &[&day, &sessions, &events_per_session, &APP, &payload],
    )
    .await?;
    Ok(())
}

/// Seeds, measures and reports; `url` is a freshly migrated database.
pub async fn measure(url: &str, sessions: usize, events_per_session: usize) -> anyhow::Result<RetentionReport> {
    let sql = connect(url).await?;
    let today = Utc::now().date_naive();
    let config = MaintenanceConfig::default();
    // Kept by maintenance (inside lifetime + retention): removed by DELETE.
    let deleted_day = today.checked_sub_days(Days::new(10)).expect("a date");
    // Past lifetime + retention of the policy a fresh migration installs:
    // retired by maintenance (its sessions were last active on that day).
    let dropped_day = retire_before(&StorePolicy::default(), today).checked_sub_days(Days::new(5)).expect("a date");
    let payload = BoundEvent::of(1)?.payload;
    let (s, e) = (i32::try_from(sessions)?, i32::try_from(events_per_session)?);
    for day in [deleted_day, dropped_day] {
        seed_day(&sql, day, s, e, &payload).await?;
    }
    // Premake first, keeping everything, so the measured run only retires.
    sql.batch_execute("UPDATE adk_store_policy SET retention = retention + interval '100000 days'").await?;
    run_maintenance(url, today, &config).await?;
    sql.batch_execute("UPDATE adk_store_policy SET retention = retention - interval '100000 days'").await?;
    sql.batch_execute("VACUUM (FREEZE, ANALYZE) adk_events, adk_sessions").await?;
    sql.batch_execute("ALTER TABLE adk_sessions SET (autovacuum_enabled = off)").await?;
    for day in [deleted_day, dropped_day] {
        sql.batch_execute(&format!("ALTER TABLE adk_events_p{} SET (autovacuum_enabled = off)", day.format("%Y%m%d")))
            .await?;
    }
    let events: i64 =
        sql.query_one("SELECT count(*) FROM adk_events WHERE session_day = $1", &[&dropped_day]).await?.get(0);

    // DELETE: the day's events, then its sessions.
    sql.batch_execute("CHECKPOINT").await?;
    let start = wal_lsn(&sql).await?;
    let began = Instant::now();
    let deleted = sql.execute("DELETE FROM adk_events WHERE session_day = $1", &[&deleted_day]).await?;
    let deleted_sessions = sql.execute("DELETE FROM adk_sessions WHERE session_day = $1", &[&deleted_day]).await?;
    let delete_ms = began.elapsed().as_secs_f64() * 1000.0;
    let delete_wal_bytes = wal_since(&sql, &start).await?;
    anyhow::ensure!(deleted as i64 == events, "DELETE removed {deleted} events, expected {events}");

    // Our maintenance.
    sql.batch_execute("CHECKPOINT").await?;
    let start = wal_lsn(&sql).await?;
    let began = Instant::now();
    let report = run_maintenance(url, today, &config).await?;
    let drop_ms = began.elapsed().as_secs_f64() * 1000.0;
    let drop_wal_bytes = wal_since(&sql, &start).await?;
    let expected = format!("adk_events_p{}", dropped_day.format("%Y%m%d"));
    anyhow::ensure!(report.dropped.contains(&expected), "maintenance did not drop {expected}: {report:?}");
    anyhow::ensure!(
        report.sessions_deleted == deleted_sessions,
        "maintenance deleted {} sessions, expected {deleted_sessions}",
        report.sessions_deleted
    );
    Ok(RetentionReport {
        events,
        sessions: i64::try_from(deleted_sessions)?,
        drop_ms,
        drop_wal_bytes,
        delete_ms,
        delete_wal_bytes,
        wal_ratio: drop_wal_bytes as f64 / delete_wal_bytes.max(1) as f64,
        time_ratio: drop_ms / delete_ms.max(f64::MIN_POSITIVE),
        partitions_dropped: report.dropped,
    })
}
