//! Partition maintenance: premake days from the clock, drop days whose
//! sessions have aged out, and clean up after interrupted runs.
//!
//! The order is the point. A day is detached (`CONCURRENTLY`, so appends
//! and reads never queue behind it), then dropped, and only then are that
//! day's session rows deleted: deleting sessions first would cascade into
//! the partition and delete its events one row at a time, the very cost
//! partitioning exists to avoid.

use std::time::Duration;

use chrono::{DateTime, Days, NaiveDate, Utc};
use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Bool, Date, Integer, Timestamptz};
use diesel_async::{AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use serde::Serialize;

use crate::error::OpsError;
use crate::partitions::{Partition, day_of_partition, days_ahead, list_orphans, list_partitions, partition_name};
use crate::sql::{LockPolicy, connect, ddl, events_schema, quote_ident, quote_literal};

/// Key of the advisory lock that keeps two maintenance runs apart.
pub const MAINTENANCE_LOCK_KEY: i64 = 0x0adc_9a57_0001;

/// How far ahead to premake and how long to keep.
#[derive(Debug, Clone)]
pub struct MaintenanceConfig {
    /// Days after today that must have a partition (today itself always has one).
    pub premake_days: u32,
    /// Longest a session may live before it must be rolled over.
    pub max_session_lifetime_days: u32,
    /// How long a session's events are kept after its lifetime ends.
    pub retention_days: u32,
    /// Session rows deleted per statement once their day is dropped.
    pub session_delete_batch: i64,
    pub lock_policy: LockPolicy,
    /// How long a run waits for another run to finish before skipping.
    pub wait_for_other_run: Duration,
}

impl Default for MaintenanceConfig {
    fn default() -> Self {
        Self {
            premake_days: 7,
            max_session_lifetime_days: 7,
            retention_days: 30,
            session_delete_batch: 5_000,
            lock_policy: LockPolicy::default(),
            wait_for_other_run: Duration::from_secs(600),
        }
    }
}

impl MaintenanceConfig {
    /// Days strictly before this one are past lifetime plus retention.
    pub fn cutoff(&self, today: NaiveDate) -> NaiveDate {
        let keep = u64::from(self.max_session_lifetime_days) + u64::from(self.retention_days);
        today.checked_sub_days(Days::new(keep)).unwrap_or(NaiveDate::MIN)
    }
}

/// What one run did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct MaintenanceReport {
    pub today: Option<NaiveDate>,
    /// Partitions created, by day.
    pub created: Vec<NaiveDate>,
    /// Partitions detached this run (including finalized pending detaches).
    pub detached: Vec<String>,
    /// Partition tables dropped.
    pub dropped: Vec<String>,
    /// Detaches an earlier, interrupted run left pending, now finished.
    pub finalized: Vec<String>,
    /// Tables detached by an interrupted run for a day still kept, attached again.
    pub reattached: Vec<String>,
    pub sessions_deleted: u64,
    /// Consecutive days after today with a partition.
    pub partitions_ahead: u32,
    /// True when another run held the lock and this one waited for it.
    pub waited_for_other_run: bool,
    /// True when another run held the lock past `wait_for_other_run`; this
    /// run did nothing.
    pub skipped: bool,
}

#[derive(QueryableByName)]
struct LockedRow {
    #[diesel(sql_type = Bool)]
    locked: bool,
}

#[derive(QueryableByName)]
struct CountRow {
    #[diesel(sql_type = BigInt)]
    count: i64,
}

#[derive(QueryableByName)]
struct NowRow {
    #[diesel(sql_type = Timestamptz)]
    now: DateTime<Utc>,
}

/// Runs maintenance as of `today` (UTC). Safe at any time, against live
/// traffic, concurrently with itself and after a crash at any point.
pub async fn run_maintenance(
    database_url: &str,
    today: NaiveDate,
    config: &MaintenanceConfig,
) -> Result<MaintenanceReport, OpsError> {
    if config.session_delete_batch < 1 {
        return Err(OpsError::InvalidInput { field: "session_delete_batch", reason: "must be at least 1".into() });
    }
    let mut conn = connect(database_url, "adk-pg maintain", &config.lock_policy).await?;
    let schema = events_schema(&mut conn).await?;
    let mut report = MaintenanceReport { today: Some(today), ..MaintenanceReport::default() };

    let locked = diesel::sql_query("SELECT pg_try_advisory_lock($1) AS locked")
        .bind::<BigInt, _>(MAINTENANCE_LOCK_KEY)
        .get_result::<LockedRow>(&mut conn)
        .await
        .map_err(OpsError::query("take the maintenance lock"))?
        .locked;
    if !locked {
        report.waited_for_other_run = true;
        let wait_ms = config.wait_for_other_run.as_millis().max(1);
        let waited = conn
            .batch_execute(&format!(
                "SET lock_timeout = {wait_ms}; SELECT pg_advisory_lock({MAINTENANCE_LOCK_KEY}); SET lock_timeout = {}",
                config.lock_policy.lock_timeout.as_millis().max(1)
            ))
            .await;
        if let Err(e) = waited {
            if crate::error::is_lock_wait(&e) {
                report.skipped = true;
                return Ok(report);
            }
            return Err(OpsError::Query { context: "wait for the maintenance lock".into(), source: e });
        }
    }

    let started = diesel::sql_query("SELECT now() AS now")
        .get_result::<NowRow>(&mut conn)
        .await
        .map_err(OpsError::query("read the clock"))?
        .now;
    let outcome = maintain_locked(&mut conn, &schema, today, config, &mut report).await;
    // The lock is session-scoped; release it even when the run failed, so
    // the next run does not wait for this connection to close.
    let _ = conn.batch_execute(&format!("SELECT pg_advisory_unlock({MAINTENANCE_LOCK_KEY})")).await;
    outcome?;
    record_run(&mut conn, started, &report).await?;
    Ok(report)
}

async fn maintain_locked(
    conn: &mut AsyncPgConnection,
    schema: &str,
    today: NaiveDate,
    config: &MaintenanceConfig,
    report: &mut MaintenanceReport,
) -> Result<(), OpsError> {
    let policy = &config.lock_policy;
    let parent = format!("{}.adk_events", quote_ident(schema));
    let qualified = |name: &str| format!("{}.{}", quote_ident(schema), quote_ident(name));
    let cutoff = config.cutoff(today);

    // 1. A DETACH … CONCURRENTLY interrupted between its two transactions
    //    leaves the partition half-detached; finish it.
    for partition in list_partitions(conn).await?.into_iter().filter(|p| p.detach_pending) {
        ddl(conn, &format!("ALTER TABLE {parent} DETACH PARTITION {} FINALIZE", qualified(&partition.name)), policy)
            .await?;
        report.finalized.push(partition.name);
    }

    // 2. Tables detached but not dropped: drop the expired ones, attach back
    //    any whose day is still kept (appends for that day need them).
    for orphan in list_orphans(conn, schema).await? {
        let Some(day) = day_of_partition(&orphan) else { continue };
        if day < cutoff {
            ddl(conn, &format!("DROP TABLE IF EXISTS {}", qualified(&orphan)), policy).await?;
            report.dropped.push(orphan);
        } else {
            let next = day.succ_opt().unwrap_or(day);
            ddl(
                conn,
                &format!(
                    "ALTER TABLE {parent} ATTACH PARTITION {} FOR VALUES FROM ({}) TO ({})",
                    qualified(&orphan),
                    quote_literal(&day.to_string()),
                    quote_literal(&next.to_string())
                ),
                policy,
            )
            .await?;
            report.reattached.push(orphan);
        }
    }

    // 3. Premake from the clock, not from data: today through today + N,
    //    filling any gap.
    let partitions = list_partitions(conn).await?;
    for offset in 0..=u64::from(config.premake_days) {
        let Some(day) = today.checked_add_days(Days::new(offset)) else { break };
        if partitions.iter().any(|p| p.holds(day)) {
            continue;
        }
        let next = day.succ_opt().unwrap_or(day);
        ddl(
            conn,
            &format!(
                "CREATE TABLE IF NOT EXISTS {} PARTITION OF {parent} FOR VALUES FROM ({}) TO ({})",
                qualified(&partition_name(day)),
                quote_literal(&day.to_string()),
                quote_literal(&next.to_string())
            ),
            policy,
        )
        .await?;
        report.created.push(day);
    }

    // 4. Drop whole partitions past lifetime + retention.
    let expired: Vec<Partition> =
        list_partitions(conn).await?.into_iter().filter(|p| p.to.is_some_and(|to| to <= cutoff)).collect();
    for partition in &expired {
        ddl(
            conn,
            &format!("ALTER TABLE {parent} DETACH PARTITION {} CONCURRENTLY", qualified(&partition.name)),
            policy,
        )
        .await?;
        report.detached.push(partition.name.clone());
        ddl(conn, &format!("DROP TABLE IF EXISTS {}", qualified(&partition.name)), policy).await?;
        report.dropped.push(partition.name.clone());
    }

    // 5. Session rows of days whose events are gone. Never past a partition
    //    that is still attached (a failed detach above would otherwise turn
    //    into a row-by-row cascade).
    let remaining = list_partitions(conn).await?;
    let oldest_kept = remaining.iter().map(|p| p.from).min().flatten();
    let holds_minvalue = remaining.iter().any(|p| p.from.is_none() && p.to.is_some_and(|to| to > NaiveDate::MIN));
    let delete_before = match (holds_minvalue, oldest_kept) {
        (true, _) => None,
        (false, Some(oldest)) => Some(oldest.min(cutoff)),
        (false, None) => Some(cutoff),
    };
    if let Some(before) = delete_before {
        loop {
            let deleted = diesel::sql_query(
                "WITH gone AS (
                     DELETE FROM adk_sessions WHERE ctid = ANY (ARRAY(
                         SELECT ctid FROM adk_sessions WHERE session_day < $1 LIMIT $2 FOR UPDATE SKIP LOCKED))
                     RETURNING 1)
                 SELECT count(*) AS count FROM gone",
            )
            .bind::<Date, _>(before)
            .bind::<BigInt, _>(config.session_delete_batch)
            .get_result::<CountRow>(conn)
            .await
            .map_err(OpsError::query("delete sessions of dropped days"))?
            .count;
            report.sessions_deleted += u64::try_from(deleted).unwrap_or_default();
            if deleted == 0 {
                break;
            }
        }
    }

    // 6. Autovacuum never analyzes a partitioned parent; do it when the set
    //    of partitions changed.
    if !report.created.is_empty() || !report.dropped.is_empty() || !report.reattached.is_empty() {
        conn.batch_execute(&format!("ANALYZE {parent}")).await.map_err(OpsError::query("analyze adk_events"))?;
    }
    report.partitions_ahead = days_ahead(&list_partitions(conn).await?, today);
    Ok(())
}

fn count(items: usize) -> i32 {
    i32::try_from(items).unwrap_or(i32::MAX)
}

async fn record_run(
    conn: &mut AsyncPgConnection,
    started: DateTime<Utc>,
    report: &MaintenanceReport,
) -> Result<(), OpsError> {
    diesel::sql_query(
        "INSERT INTO adk_maintenance_runs
             (started_at, today, created, dropped, finalized, sessions_deleted, partitions_ahead)
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
    )
    .bind::<Timestamptz, _>(started)
    .bind::<Date, _>(report.today.unwrap_or_default())
    .bind::<Integer, _>(count(report.created.len()))
    .bind::<Integer, _>(count(report.dropped.len()))
    .bind::<Integer, _>(count(report.finalized.len()))
    .bind::<BigInt, _>(i64::try_from(report.sessions_deleted).unwrap_or(i64::MAX))
    .bind::<Integer, _>(i32::try_from(report.partitions_ahead).unwrap_or(i32::MAX))
    .execute(conn)
    .await
    .map_err(OpsError::query("record the maintenance run"))?;
    Ok(())
}
