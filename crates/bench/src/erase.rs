//! Erasing a user: how long `erase_user_with` takes for one user with many
//! events, and how much WAL it writes.
//!
//! A database of its own is seeded as the owner with `INSERT … SELECT`
//! (untimed): the user's events spread over four sessions on four days
//! (four partitions), each event the workload's own payload, next to other
//! users' traffic in the same partitions. The erasure runs through the
//! store as `adk-pg erase-user` runs it, from a checkpoint and with
//! autovacuum kept off the seeded tables, so the WAL counted is the
//! erasure's alone (full-page images of the first touch of each page
//! included, as in production after a checkpoint).

use std::time::Instant;

use adk_postgres_domain::{AppName, UserId};
use adk_postgres_storage::{EraseOptions, EraseStep, PgSessionStore, PoolConfig, TenantScope};
use anyhow::ensure;
use chrono::{Days, NaiveDate, Utc};
use serde::Serialize;
use tokio_postgres::Client;

use crate::floor::BoundEvent;
use crate::pgstat::{wal_lsn, wal_since};
use crate::server::{connect, human_bytes};
use crate::workload::APP;

/// The user erased.
const USER: &str = "erased-user";
/// Days (and so sessions and partitions) the user's events spread over.
const DAYS: u64 = 4;
/// Other users in the same partitions, and their events per session.
const OTHER_USERS: i64 = 200;
const OTHER_EVENTS: i64 = 100;

/// One measured erasure.
#[derive(Debug, Clone, Serialize)]
pub struct EraseBenchReport {
    pub events: u64,
    pub sessions: u64,
    pub partitions: u64,
    pub batch_size: u32,
    /// Batches (short transactions) the erasure ran.
    pub batches: u64,
    /// The largest number of rows one batch deleted.
    pub largest_batch: u64,
    pub secs: f64,
    pub events_per_sec: f64,
    pub wal_bytes: i64,
    pub wal_bytes_per_event: f64,
    /// Other users' events left in the same partitions, checked untouched.
    pub other_events: i64,
    /// The erased events' own size (`pg_column_size` of the rows): after a
    /// checkpoint, WAL is mostly full-page images of the pages they filled.
    pub erased_row_bytes: i64,
}

impl std::fmt::Display for EraseBenchReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "erase a user: {} events in {} sessions over {} partitions, batches of {}: {:.2} s ({:.0} events/s), \
             {} batches (largest {} rows), WAL {} ({:.0} bytes/event; the rows held {})",
            self.events,
            self.sessions,
            self.partitions,
            self.batch_size,
            self.secs,
            self.events_per_sec,
            self.batches,
            self.largest_batch,
            human_bytes(self.wal_bytes as f64),
            self.wal_bytes_per_event,
            human_bytes(self.erased_row_bytes as f64)
        )
    }
}

async fn seed(sql: &Client, day: NaiveDate, user_events: i64, payload: &str) -> anyhow::Result<()> {
    sql.execute("SELECT adk_ensure_event_partition($1)", &[&day]).await?;
    sql.execute(
        "INSERT INTO adk_sessions (app_name, user_id, session_id, session_day, last_seq, state, created_at, updated_at)
         SELECT $1, u.id, $2::date::text, $2, u.events, '{\"channel\": \"web\", \"turn\": 39}',
                ($2::date + time '12:00') AT TIME ZONE 'UTC', ($2::date + time '12:00') AT TIME ZONE 'UTC'
           FROM (SELECT $3::text AS id, $4::bigint AS events
                 UNION ALL SELECT 'other-' || n, $5::bigint FROM generate_series(1, $6::bigint) n) u",
        &[&APP, &day, &USER, &user_events, &OTHER_EVENTS, &OTHER_USERS],
    )
    .await?;
    sql.execute(
        "INSERT INTO adk_events (app_name, user_id, session_id, session_day, seq, event_id, invocation_id, author,
                                 event_ts, payload)
         SELECT $1, s.user_id, s.session_id, $2, n, e.id, 'inv-' || (n / 4), 'assistant',
                (extract(epoch FROM $2::date)::bigint * 1000000000) + n, $3::text::jsonb || jsonb_build_object('id', e.id)
           FROM adk_sessions s, generate_series(1, s.last_seq) n,
                LATERAL (SELECT md5(s.user_id || '-' || n::text) AS id) e
          WHERE s.app_name = $1 AND s.session_day = $2",
        &[&APP, &day, &payload],
    )
    .await?;
    sql.execute(
        "INSERT INTO adk_user_states (app_name, user_id, state) VALUES ($1, $2, '{\"plan\": \"pro\"}')
         ON CONFLICT DO NOTHING",
        &[&APP, &USER],
    )
    .await?;
    Ok(())
}

async fn count(sql: &Client, query: &str) -> anyhow::Result<i64> {
    Ok(sql.query_one(query, &[&APP, &USER]).await?.get(0))
}

/// Seeds a user with `events` events (and other users beside them), erases
/// them in batches of `batch_size` through the store as the owner, and
/// reports. `url` is a freshly migrated database.
pub async fn measure_erase(url: &str, events: usize, batch_size: u32) -> anyhow::Result<EraseBenchReport> {
    let sql = connect(url).await?;
    let today = Utc::now().date_naive();
    let payload = BoundEvent::of(1)?.payload;
    let per_day = i64::try_from(events)? / DAYS as i64;
    let mut partitions = Vec::new();
    for back in 0..DAYS {
        let day = today.checked_sub_days(Days::new(back)).ok_or_else(|| anyhow::anyhow!("no such day"))?;
        seed(&sql, day, per_day, &payload).await?;
        partitions.push(format!("adk_events_p{}", day.format("%Y%m%d")));
    }
    sql.batch_execute("VACUUM (FREEZE, ANALYZE) adk_events, adk_sessions, adk_user_states").await?;
    sql.batch_execute("ALTER TABLE adk_sessions SET (autovacuum_enabled = off)").await?;
    for partition in &partitions {
        sql.batch_execute(&format!("ALTER TABLE {partition} SET (autovacuum_enabled = off)")).await?;
    }
    let seeded = count(&sql, "SELECT count(*) FROM adk_events WHERE app_name = $1 AND user_id = $2").await?;
    let others = count(&sql, "SELECT count(*) FROM adk_events WHERE app_name = $1 AND user_id <> $2").await?;
    let erased_row_bytes = count(
        &sql,
        "SELECT coalesce(sum(pg_column_size(e.*)), 0)::bigint FROM adk_events e WHERE app_name = $1 AND user_id = $2",
    )
    .await?;

    let store = PgSessionStore::connect(url, &PoolConfig { max_size: 2, ..PoolConfig::default() }, Default::default())
        .await?
        .with_tenant_scope(TenantScope::PerRequest);
    let (app, user) = (AppName::new(APP)?, UserId::new(USER)?);
    let options = EraseOptions { batch_size, dry_run: false };
    let mut largest_batch = 0;
    sql.batch_execute("CHECKPOINT").await?;
    let start = wal_lsn(&sql).await?;
    let began = Instant::now();
    let report = store
        .erase_user_with(&app, &user, options, |p| {
            if p.step != EraseStep::Done {
                largest_batch = largest_batch.max(p.affected);
            }
        })
        .await?;
    let secs = began.elapsed().as_secs_f64();
    let wal_bytes = wal_since(&sql, &start).await?;

    ensure!(report.events == u64::try_from(seeded)?, "erased {} events of {seeded}", report.events);
    let left = count(&sql, "SELECT count(*) FROM adk_events WHERE app_name = $1 AND user_id = $2").await?;
    ensure!(left == 0, "{left} events of the erased user are left");
    let others_after = count(&sql, "SELECT count(*) FROM adk_events WHERE app_name = $1 AND user_id <> $2").await?;
    ensure!(others_after == others, "other users' events changed: {others} -> {others_after}");
    Ok(EraseBenchReport {
        events: report.events,
        sessions: report.sessions,
        partitions: DAYS,
        batch_size,
        batches: report.batches,
        largest_batch,
        secs,
        events_per_sec: report.events as f64 / secs.max(f64::MIN_POSITIVE),
        wal_bytes,
        wal_bytes_per_event: wal_bytes as f64 / report.events.max(1) as f64,
        other_events: others,
        erased_row_bytes,
    })
}

#[cfg(test)]
mod tests {
    use crate::server::Server;

    /// Not part of `cargo test`: measures once on a throwaway cluster with
    /// durable settings and prints the figure. Run with
    /// `cargo test --release -p adk-postgres-bench erase -- --ignored --nocapture`.
    #[tokio::test(flavor = "multi_thread")]
    #[ignore = "a measurement, not a test"]
    async fn erase_100k_events() -> anyhow::Result<()> {
        let server = Server::throwaway().await?;
        for batch_size in [1_000, 5_000] {
            let url = server.fresh_database("adk_bench_erase").await?;
            adk_postgres_schema::run_pending_migrations(&url).await?;
            let report = super::measure_erase(&url, 100_000, batch_size).await?;
            println!("{report}");
            println!("{}", serde_json::to_string(&report)?);
            server.drop_database("adk_bench_erase").await?;
        }
        Ok(())
    }
}
