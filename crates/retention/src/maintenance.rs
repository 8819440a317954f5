//! Partition maintenance: premake days from the clock, drop days whose
//! sessions have aged out, and clean up after interrupted runs.
//!
//! How long is long enough is the store's policy, read from the database
//! (`adk_store_policy`) at the start of every run: the same row the append
//! function enforces the session lifetime from, so maintenance can never
//! retire a day on a shorter promise than the one appends were accepted on.
//! A day past lifetime plus retention that still holds a live session is
//! kept, recorded and alerted on (`kept_days`, health) rather than dropped.
//!
//! The order is the point. A day is detached (`CONCURRENTLY`, so appends
//! and reads never queue behind it), then dropped, and only then are that
//! day's session rows deleted: deleting sessions first would cascade into
//! the partition and delete its events one row at a time, the very cost
//! partitioning exists to avoid.
//!
//! On Citus, which has no `DETACH … CONCURRENTLY`, a day is detached with a
//! plain `DETACH`: it holds an ACCESS EXCLUSIVE lock on adk_events, on the
//! coordinator and on every shard, for the whole statement, so appends
//! queue behind it. The run reports how long each such detach took
//! (`exclusive_detach_ms`), which is how long appends waited at most; the
//! lock wait itself is bounded by the policy's lock_timeout as everywhere.
//! Session rows go by key instead of by ctid, which Citus cannot plan.
//!
//! Last, the usage rollups' partitions (migration 12): premade ahead so the
//! rollup job rarely needs DDL, and each tier dropped by whole partitions
//! at the end of its retention. Both are SQL functions judging by the
//! server's clock (not `today`), run under the same lock-wait retry as the
//! rest. They come after every step on the event log, so a failure there
//! never costs the log its partitions.

use std::collections::BTreeMap;
use std::time::Duration;

use adk_postgres_schema::quote::{quote_ident, quote_literal};
use chrono::{DateTime, Days, NaiveDate, Utc};
use diesel::QueryableByName;
use diesel::pg::Pg;
use diesel::sql_types::{Array, BigInt, Bool, Date, Integer, Jsonb, Nullable, Text, Timestamptz};
use diesel_async::{AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use serde::Serialize;

use crate::RetentionError;
use crate::lock::{Acquired, AdvisoryLock};
use crate::partitions::{Partition, day_of_partition, days_ahead, list_orphans, list_partitions, partition_name};
use crate::policy::{KeptDay, LiveDay, PolicySummary, live_days, retire_before, start_of, store_policy, usage_policy};
use adk_postgres_archive::{ArchiveConfig, ArchivePolicy, DayArchived, Destination};
use adk_postgres_operations::{LockPolicy, LockRetry, connect, ddl, events_schema, first_row, on_citus};

/// Key of the advisory lock that keeps two maintenance runs apart.
pub const MAINTENANCE_LOCK_KEY: i64 = adk_postgres_schema::names::lock_keys::MAINTENANCE;

/// How a run does its work. How far ahead to premake and how long to keep
/// are not here: they are the store's policy, in the database.
#[derive(Debug, Clone)]
pub struct MaintenanceConfig {
    /// Session rows deleted per statement once their day is dropped.
    pub session_delete_batch: i64,
    /// How its DDL waits for locks.
    pub lock_policy: LockPolicy,
    /// How long a run waits for another run to finish before skipping.
    pub wait_for_other_run: Duration,
    /// How days are archived before they are dropped, when the store's
    /// policy turns archiving on.
    pub archive: ArchiveConfig,
}

impl Default for MaintenanceConfig {
    fn default() -> Self {
        Self {
            session_delete_batch: 5_000,
            lock_policy: LockPolicy::default(),
            wait_for_other_run: Duration::from_secs(600),
            archive: ArchiveConfig::default(),
        }
    }
}

/// What one run did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct MaintenanceReport {
    /// The day (UTC) the run worked for; a run always sets it.
    pub today: Option<NaiveDate>,
    /// The policy the run judged by, as read from the database.
    pub policy: Option<PolicySummary>,
    /// Days before this one are past lifetime plus retention.
    pub retire_before: Option<NaiveDate>,
    /// Partitions created, by day.
    pub created: Vec<NaiveDate>,
    /// Partitions detached this run.
    pub detached: Vec<String>,
    /// Partition tables dropped.
    pub dropped: Vec<String>,
    /// Detaches finished with `FINALIZE`: left pending by an interrupted
    /// earlier run, or by this run's own detach timing out in its second
    /// phase.
    pub finalized: Vec<String>,
    /// On Citus only, where a detach locks adk_events exclusively: how long
    /// each of this run's detaches held that lock, in milliseconds.
    pub exclusive_detach_ms: Vec<u64>,
    /// Tables detached by an interrupted run for a day still kept, attached again.
    pub reattached: Vec<String>,
    /// Days past lifetime plus retention kept because a session of theirs is
    /// still live; `adk-pg status` alerts while their partition stays.
    pub kept: Vec<KeptDay>,
    /// Session rows of the dropped days deleted after the drop.
    pub sessions_deleted: u64,
    /// Events with media deleted from days about to be dropped, so that
    /// their blobs lost the reference (and went with the last one).
    pub media_events_released: u64,
    /// The archive policy the run judged by (`archive off` when off).
    pub archive_policy: Option<String>,
    /// App days archived (or found archived and read back) before their
    /// day was dropped.
    pub archived: Vec<DayArchived>,
    /// App days whose archive failed; their day is kept until a run
    /// archives them.
    pub archive_failed: Vec<ArchiveFailure>,
    /// Consecutive days after today with a partition.
    pub partitions_ahead: u32,
    /// Usage rollup partitions premade (`adk_premake_usage_partitions`).
    pub usage_partitions_created: u32,
    /// Usage rollup partitions dropped at the end of their tier's retention
    /// (`adk_retire_usage_partitions`).
    pub usage_partitions_dropped: Vec<String>,
    /// True when another run held the lock and this one waited for it.
    pub waited_for_other_run: bool,
    /// True when another run held the lock past `wait_for_other_run`; this
    /// run did nothing.
    pub skipped: bool,
}

/// An app's day that could not be archived; its day stays in the database.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ArchiveFailure {
    /// The app.
    pub app_name: String,
    /// The partition day (UTC).
    pub day: NaiveDate,
    /// The partition kept because of it.
    pub partition: String,
    /// Why the archive failed.
    pub error: String,
}

impl std::fmt::Display for MaintenanceReport {
    /// What `adk-pg maintain` prints after a run: a summary line, then one
    /// indented line per kind of change, and every kept day with its reason.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.skipped {
            return f.write_str("another maintenance run held the lock for too long; skipped");
        }
        write!(
            f,
            "maintenance for {}: {} partition(s) created, {} dropped, {} session(s) deleted, {} day(s) ahead",
            self.today.map(|d| d.to_string()).unwrap_or_default(),
            self.created.len(),
            self.dropped.len(),
            self.sessions_deleted,
            self.partitions_ahead
        )?;
        if let (Some(policy), Some(before)) = (&self.policy, self.retire_before) {
            write!(f, "\n  policy: {policy}; retiring days before {before}")?;
        }
        if !self.archived.is_empty() {
            let events: i64 = self.archived.iter().map(|a| a.events).sum();
            let bytes: i64 = self.archived.iter().map(|a| a.bytes).sum();
            write!(
                f,
                "\n  archived: {} app day(s), {events} event(s), {bytes} byte(s) of Parquet, read back and verified",
                self.archived.len()
            )?;
        }
        for failed in &self.archive_failed {
            write!(
                f,
                "\n  KEPT {} ({}): the archive of app {} failed: {}",
                failed.day, failed.partition, failed.app_name, failed.error
            )?;
        }
        if self.media_events_released > 0 {
            write!(
                f,
                "\n  media: {} event(s) naming blobs released before their day was dropped",
                self.media_events_released
            )?;
        }
        if !self.created.is_empty() {
            let days: Vec<String> = self.created.iter().map(ToString::to_string).collect();
            write!(f, "\n  created: {}", days.join(", "))?;
        }
        for (label, names) in [
            ("dropped", &self.dropped),
            ("finished interrupted detaches", &self.finalized),
            ("re-attached", &self.reattached),
        ] {
            if !names.is_empty() {
                write!(f, "\n  {label}: {}", names.join(", "))?;
            }
        }
        if let Some(longest) = self.exclusive_detach_ms.iter().max() {
            write!(
                f,
                "\n  detached with adk_events locked (Citus): {} time(s), {longest} ms at most",
                self.exclusive_detach_ms.len()
            )?;
        }
        if self.usage_partitions_created > 0 || !self.usage_partitions_dropped.is_empty() {
            write!(
                f,
                "\n  usage rollups: {} partition(s) created, {} dropped",
                self.usage_partitions_created,
                self.usage_partitions_dropped.len()
            )?;
            if !self.usage_partitions_dropped.is_empty() {
                write!(f, " ({})", self.usage_partitions_dropped.join(", "))?;
            }
        }
        for kept in &self.kept {
            write!(f, "\n  KEPT {} past retention", kept.day)?;
            if let Some(partition) = &kept.partition {
                write!(f, " ({partition})")?;
            }
            write!(f, ": {}", kept.reason)?;
        }
        if self.waited_for_other_run {
            f.write_str("\n  (waited for another run to finish first)")?;
        }
        Ok(())
    }
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

#[derive(QueryableByName)]
struct PendingRow {
    #[diesel(sql_type = Bool)]
    pending: bool,
}

#[derive(QueryableByName)]
struct MadeRow {
    #[diesel(sql_type = Integer)]
    made: i32,
}

#[derive(QueryableByName)]
struct NameRow {
    #[diesel(sql_type = Text)]
    name: String,
}

/// Runs maintenance as of `today` (UTC) under the store's policy. Safe at
/// any time, against live traffic, concurrently with itself and after a
/// crash at any point. A run that fails once it holds the maintenance lock
/// is recorded (`outcome = 'failed'` with the error) before the error is
/// returned.
pub async fn run_maintenance(
    database_url: &str,
    today: NaiveDate,
    config: &MaintenanceConfig,
) -> Result<MaintenanceReport, RetentionError> {
    if config.session_delete_batch < 1 {
        return Err(RetentionError::InvalidInput {
            field: "session_delete_batch",
            reason: "must be at least 1".into(),
        });
    }
    let mut conn = connect(database_url, "adk-pg maintain", &config.lock_policy).await?;
    let schema = events_schema(&mut conn).await?;
    let mut report = MaintenanceReport { today: Some(today), ..MaintenanceReport::default() };

    let acquired =
        AdvisoryLock::acquire_within(conn, MAINTENANCE_LOCK_KEY, config.wait_for_other_run, &config.lock_policy)
            .await?;
    let mut lock = match acquired {
        Acquired::Free(lock) => lock,
        Acquired::AfterWait(lock) => {
            report.waited_for_other_run = true;
            lock
        }
        Acquired::TimedOut => {
            report.waited_for_other_run = true;
            report.skipped = true;
            return Ok(report);
        }
    };
    let conn = lock.conn();

    let started = diesel::sql_query("SELECT now() AS now")
        .load::<NowRow>(conn)
        .await
        .and_then(first_row)
        .map_err(RetentionError::query("read the clock"));
    let (started, outcome) = match started {
        Ok(row) => (Some(row.now), maintain_locked(conn, &schema, today, config, &mut report).await),
        Err(error) => (None, Err(error)),
    };
    let recorded = match &outcome {
        Ok(()) => record_run(conn, started, &report, None).await,
        Err(error) => {
            // Best effort: the failure may have been the catalog read itself.
            if let Ok(partitions) = list_partitions(conn).await {
                report.partitions_ahead = days_ahead(&partitions, today);
            }
            record_run(conn, started, &report, Some(&error.to_string())).await
        }
    };
    // Released once the run is recorded, failed or not, so the next run
    // does not wait for this connection to close.
    lock.release().await;
    match (outcome, recorded) {
        (Ok(()), Ok(())) => Ok(report),
        (Ok(()), Err(error)) => Err(error),
        (Err(error), recorded) => {
            if let Err(record_error) = recorded {
                tracing::warn!(error = %record_error, "could not record the failed maintenance run");
            }
            Err(error)
        }
    }
}

async fn maintain_locked(
    conn: &mut AsyncPgConnection,
    schema: &str,
    today: NaiveDate,
    config: &MaintenanceConfig,
    report: &mut MaintenanceReport,
) -> Result<(), RetentionError> {
    let policy = &config.lock_policy;
    let parent = format!("{}.adk_events", quote_ident(schema));
    let qualified = |name: &str| format!("{}.{}", quote_ident(schema), quote_ident(name));
    // In the statement that creates or attaches a partition, so no moment
    // exists in which a role granted it directly (a default privilege, a
    // broad GRANT) could read it without row-level security.
    let protect = |qualified: &str| {
        format!("SELECT {}.adk_protect_tenant_table({}::regclass)", quote_ident(schema), quote_literal(qualified))
    };

    let store = store_policy(conn).await?;
    let usage = usage_policy(conn).await?;
    let citus = on_citus(conn).await?;
    let cutoff = retire_before(&store, today);
    let archive = adk_postgres_archive::read_archive_policy(conn)
        .await
        .map_err(|e| RetentionError::Conflict(format!("read the archive policy: {e}")))?;
    report.archive_policy = Some(archive.to_string());
    report.policy = Some(PolicySummary::of(&store).with_usage(usage.as_ref()));
    report.retire_before = Some(cutoff);
    // Read once, before anything is retired. A session of a day past the
    // cutoff is past its lifetime, so the append function refuses it: no
    // session can turn live between this read and the drop below (short of
    // the policy being raised meanwhile, which the next run honours).
    let live: BTreeMap<NaiveDate, LiveDay> = live_days(conn, cutoff, start_of(today), store.retention)
        .await?
        .into_iter()
        .map(|day| (day.day, day))
        .collect();
    let keep = |day: &LiveDay, partition: Option<&str>, report: &mut MaintenanceReport| {
        if !report.kept.iter().any(|k| k.day == day.day) {
            tracing::warn!(day = %day.day, open_sessions = day.open_sessions, "kept a day past retention: it has live sessions");
            report.kept.push(day.kept(partition.map(str::to_owned), store.retention));
        }
    };

    // 1. A DETACH … CONCURRENTLY interrupted between its two transactions
    //    leaves the partition half-detached; finish it.
    for partition in list_partitions(conn).await?.into_iter().filter(|p| p.detach_pending) {
        ddl(conn, &format!("ALTER TABLE {parent} DETACH PARTITION {} FINALIZE", qualified(&partition.name)), policy)
            .await?;
        report.finalized.push(partition.name);
    }

    // 2. Tables detached but not dropped: drop the expired ones, attach back
    //    any whose day is still kept (appends and reads of that day need
    //    them), live sessions included.
    for orphan in list_orphans(conn, schema).await? {
        let Some(day) = day_of_partition(&orphan) else { continue };
        if day < cutoff && !live.contains_key(&day) {
            ddl(conn, &format!("DROP TABLE IF EXISTS {}", qualified(&orphan)), policy).await?;
            report.dropped.push(orphan);
        } else {
            let next = day.succ_opt().unwrap_or(day);
            ddl(
                conn,
                &format!(
                    "ALTER TABLE {parent} ATTACH PARTITION {} FOR VALUES FROM ({}) TO ({}); {}",
                    qualified(&orphan),
                    quote_literal(&day.to_string()),
                    quote_literal(&next.to_string()),
                    protect(&qualified(&orphan))
                ),
                policy,
            )
            .await?;
            if let Some(live_day) = live.get(&day) {
                keep(live_day, Some(&orphan), report);
            }
            report.reattached.push(orphan);
        }
    }

    // 3. Premake from the clock, not from data: today through today + the
    //    policy's premake days, filling any gap.
    let partitions = list_partitions(conn).await?;
    for offset in 0..=u64::from(store.premake_days) {
        let Some(day) = today.checked_add_days(Days::new(offset)) else { break };
        if partitions.iter().any(|p| p.holds(day)) {
            continue;
        }
        let next = day.succ_opt().unwrap_or(day);
        ddl(
            conn,
            &format!(
                "CREATE TABLE IF NOT EXISTS {} PARTITION OF {parent} FOR VALUES FROM ({}) TO ({}); {}",
                qualified(&partition_name(day)),
                quote_literal(&day.to_string()),
                quote_literal(&next.to_string()),
                protect(&qualified(&partition_name(day)))
            ),
            policy,
        )
        .await?;
        report.created.push(day);
    }

    // 4. Retire whole partitions past lifetime + retention, unless a live
    //    session holds one of their days.
    let expired: Vec<Partition> = list_partitions(conn)
        .await?
        .into_iter()
        .filter(|p| !p.detach_pending && p.to.is_some_and(|to| to <= cutoff))
        .collect();
    for partition in &expired {
        let holding: Vec<&LiveDay> = live.values().filter(|day| partition.holds(day.day)).collect();
        if !holding.is_empty() {
            for day in holding {
                keep(day, Some(&partition.name), report);
            }
            continue;
        }
        // Archived before anything of the day is released or dropped: the
        // media its events name goes with them.
        if archive.is_on()
            && !archive_before_drop(conn, &archive, partition, &qualified(&partition.name), config, citus, report)
                .await?
        {
            continue;
        }
        report.media_events_released += release_media(conn, &qualified(&partition.name), config).await?;
        if citus {
            let started = std::time::Instant::now();
            ddl(conn, &format!("ALTER TABLE {parent} DETACH PARTITION {}", qualified(&partition.name)), policy).await?;
            let held = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
            tracing::info!(partition = %partition.name, held_ms = held, "detached with adk_events locked (Citus)");
            report.exclusive_detach_ms.push(held);
        } else if detach(conn, &parent, partition, &qualified(&partition.name), policy).await? {
            report.finalized.push(partition.name.clone());
        }
        report.detached.push(partition.name.clone());
        ddl(conn, &format!("DROP TABLE IF EXISTS {}", qualified(&partition.name)), policy).await?;
        report.dropped.push(partition.name.clone());
    }

    // 5. Session rows of retired days, whose events are gone. Never a row of
    //    a day some attached partition still holds (a kept day, a failed
    //    detach, a legacy partition): deleting those would cascade into
    //    their events row by row. Never a row of a live day either, even one
    //    without a partition.
    let remaining = list_partitions(conn).await?;
    let held_from: Vec<Option<NaiveDate>> = remaining.iter().map(|p| p.from).collect();
    let held_to: Vec<Option<NaiveDate>> = remaining.iter().map(|p| p.to).collect();
    let live_list: Vec<NaiveDate> = live.keys().copied().collect();
    for day in live.values() {
        if !remaining.iter().any(|p| p.holds(day.day)) {
            keep(day, None, report);
        }
    }
    loop {
        let statement = if citus { DELETE_RETIRED_SESSIONS_BY_KEY } else { DELETE_RETIRED_SESSIONS };
        let deleted = diesel::sql_query(statement)
            .bind::<Date, _>(cutoff)
            .bind::<Array<Date>, _>(&live_list)
            .bind::<Array<Nullable<Date>>, _>(&held_from)
            .bind::<Array<Nullable<Date>>, _>(&held_to)
            .bind::<BigInt, _>(config.session_delete_batch)
            .load::<CountRow>(conn)
            .await
            .and_then(first_row)
            .map_err(RetentionError::query("delete sessions of dropped days"))?
            .count;
        report.sessions_deleted += u64::try_from(deleted).unwrap_or_default();
        if deleted == 0 {
            break;
        }
    }
    report.kept.sort_by_key(|k| k.day);

    // 6. Autovacuum never analyzes a partitioned parent; do it when the set
    //    of partitions changed.
    if !report.created.is_empty() || !report.dropped.is_empty() || !report.reattached.is_empty() {
        conn.batch_execute(&format!("ANALYZE {parent}")).await.map_err(RetentionError::query("analyze adk_events"))?;
    }
    report.partitions_ahead = days_ahead(&list_partitions(conn).await?, today);

    // 7. Usage rollup partitions, when the rollups are installed. Both
    //    functions set their own lock_timeout (migration 12), which applies
    //    inside them instead of the policy's; the policy still paces the
    //    attempts.
    if usage.is_some() {
        let premake = format!("SELECT {}.adk_premake_usage_partitions() AS made", quote_ident(schema));
        let made: Vec<MadeRow> = load_with_retry(conn, &premake, policy).await?;
        report.usage_partitions_created =
            made.iter().map(|row| u32::try_from(row.made).unwrap_or_default()).sum::<u32>();
        let retire = format!("SELECT name FROM {}.adk_retire_usage_partitions() AS name", quote_ident(schema));
        let dropped: Vec<NameRow> = load_with_retry(conn, &retire, policy).await?;
        report.usage_partitions_dropped = dropped.into_iter().map(|row| row.name).collect();
        if !report.usage_partitions_dropped.is_empty() {
            tracing::info!(dropped = ?report.usage_partitions_dropped, "retired usage rollup partitions");
        }
    }
    Ok(())
}

/// The rows of adk_sessions a batch of step 5 deletes, `$5` at most: of days
/// before `$1`, not live (`$2`), held by no partition (`$3`..`$4`).
macro_rules! retired_sessions {
    ($key:literal) => {
        concat!(
            "SELECT ",
            $key,
            " FROM adk_sessions s
              WHERE s.session_day < $1
                AND s.session_day <> ALL ($2)
                AND NOT EXISTS (
                    SELECT 1 FROM unnest($3::date[], $4::date[]) AS held (held_from, held_to)
                    WHERE (held.held_from IS NULL OR s.session_day >= held.held_from)
                      AND (held.held_to IS NULL OR s.session_day < held.held_to))
              LIMIT $5"
        )
    };
}

/// Rows that an append holds are skipped, not waited for.
const DELETE_RETIRED_SESSIONS: &str = concat!(
    "WITH gone AS (DELETE FROM adk_sessions WHERE ctid = ANY (ARRAY(",
    retired_sessions!("s.ctid"),
    " FOR UPDATE SKIP LOCKED)) RETURNING 1) SELECT count(*) AS count FROM gone"
);

/// On Citus, which plans neither a ctid across shards nor FOR UPDATE
/// without the distribution key: the batch's keys are collected first, then
/// deleted on every shard. A row an append holds is waited for; a session
/// of a retired day is past its lifetime, which the append function
/// refuses, so no append holds one for long.
const DELETE_RETIRED_SESSIONS_BY_KEY: &str = concat!(
    "WITH gone AS (DELETE FROM adk_sessions WHERE (app_name, user_id, session_id) IN (",
    retired_sessions!("s.app_name, s.user_id, s.session_id"),
    ") RETURNING 1) SELECT count(*) AS count FROM gone"
);

/// Archives each covered app's events of the partition's days; false when
/// any of them failed (the failure is recorded), so the day is kept.
async fn archive_before_drop(
    conn: &mut AsyncPgConnection,
    policy: &ArchivePolicy,
    partition: &Partition,
    qualified: &str,
    config: &MaintenanceConfig,
    citus: bool,
    report: &mut MaintenanceReport,
) -> Result<bool, RetentionError> {
    let days = partition_days(conn, partition, qualified).await?;
    let apps = adk_postgres_archive::apps_in_partition(conn, qualified, !citus)
        .await
        .map_err(|e| RetentionError::Conflict(format!("list the apps of {}: {e}", partition.name)))?;
    let url = policy.url.clone().unwrap_or_default();
    let destination = Destination::open_with(&url, &config.archive.store_options);
    let mut whole = true;
    for day in days {
        for app in apps.iter().filter(|app| policy.covers(app)) {
            let outcome = match &destination {
                Ok(destination) => {
                    adk_postgres_archive::archive_app_day(conn, destination, qualified, app, day, &config.archive).await
                }
                Err(error) => {
                    Err(adk_postgres_archive::ArchiveError::Destination { url: url.clone(), reason: error.to_string() })
                }
            };
            match outcome {
                Ok(archived) if archived.events == 0 => {}
                Ok(archived) => report.archived.push(archived),
                Err(error) => {
                    whole = false;
                    tracing::warn!(app, %day, partition = %partition.name, %error, "kept a day: its archive failed");
                    if let Err(record) = adk_postgres_archive::record_failure(conn, app, day, &error).await {
                        tracing::warn!(error = %record, "could not record the archive failure");
                    }
                    report.archive_failed.push(ArchiveFailure {
                        app_name: app.clone(),
                        day,
                        partition: partition.name.clone(),
                        error: error.to_string(),
                    });
                }
            }
        }
    }
    Ok(whole)
}

/// The days a partition holds: its own for a daily partition, else those
/// its rows name.
async fn partition_days(
    conn: &mut AsyncPgConnection,
    partition: &Partition,
    qualified: &str,
) -> Result<Vec<NaiveDate>, RetentionError> {
    if let (Some(from), Some(to)) = (partition.from, partition.to)
        && from.succ_opt() == Some(to)
    {
        return Ok(vec![from]);
    }
    #[derive(QueryableByName)]
    struct DayRow {
        #[diesel(sql_type = Date)]
        day: NaiveDate,
    }
    let days: Vec<DayRow> =
        diesel::sql_query(format!("SELECT DISTINCT session_day AS day FROM ONLY {qualified} ORDER BY 1"))
            .load(conn)
            .await
            .map_err(RetentionError::query("list the days of a partition"))?;
    Ok(days.into_iter().map(|row| row.day).collect())
}

/// Deletes the events of `partition` that name media, a batch per
/// statement, before the day is dropped: each delete counts its blobs down
/// (the `adk_events_release_blobs` trigger, blobs.sql), so a blob no other
/// day's event names goes too, and one another day names stays. The rest of
/// the day, every event without media, still goes with the `DROP`. Finding
/// them is one scan of the day; the deletes are by `ctid`, so a batch never
/// scans again. Safe to interrupt: what was deleted was counted down in the
/// same transaction, and what was not is found by the next run.
async fn release_media(
    conn: &mut AsyncPgConnection,
    partition: &str,
    config: &MaintenanceConfig,
) -> Result<u64, RetentionError> {
    #[derive(QueryableByName)]
    struct TidRow {
        #[diesel(sql_type = Text)]
        tid: String,
    }
    let found: Vec<TidRow> =
        diesel::sql_query(format!("SELECT ctid::text AS tid FROM ONLY {partition} WHERE blob_refs IS NOT NULL"))
            .load(conn)
            .await
            .map_err(RetentionError::query("find the events with media of a day to drop"))?;
    let tids: Vec<String> = found.into_iter().map(|row| row.tid).collect();
    let batch = usize::try_from(config.session_delete_batch).unwrap_or(1).max(1);
    let mut released = 0;
    for chunk in tids.chunks(batch) {
        let deleted = diesel::sql_query(format!("DELETE FROM ONLY {partition} WHERE ctid = ANY ($1::text[]::tid[])"))
            .bind::<Array<Text>, _>(chunk)
            .execute(conn)
            .await
            .map_err(RetentionError::query("release the media of a day to drop"))?;
        released += u64::try_from(deleted).unwrap_or_default();
    }
    if released > 0 {
        tracing::info!(partition, released, "released the media of a day before dropping it");
    }
    Ok(released)
}

/// Runs one statement that takes DDL locks and returns rows, retrying
/// after a lock wait timed out as [`ddl`] does. Each attempt is its own
/// autocommit statement, so a failed one left nothing behind.
async fn load_with_retry<T>(
    conn: &mut AsyncPgConnection,
    statement: &str,
    policy: &LockPolicy,
) -> Result<Vec<T>, RetentionError>
where
    T: QueryableByName<Pg> + Send + 'static,
{
    let mut retry = LockRetry::new(statement, policy);
    loop {
        let (result, rows) = match diesel::sql_query(statement).load::<T>(conn).await {
            Ok(rows) => (Ok(()), rows),
            Err(error) => (Err(error), Vec::new()),
        };
        if retry.settle(result).await? {
            return Ok(rows);
        }
    }
}

/// Detaches `partition` with `DETACH … CONCURRENTLY`; returns whether it
/// had to be finished with `FINALIZE`.
///
/// The second of the statement's two transactions waits for every
/// transaction that may still see the partition. When that wait hits
/// `lock_timeout`, the partition stays marked pending, and issuing the same
/// statement again fails ("already pending detach"): only `FINALIZE`
/// finishes it, so that is what is retried (under the same lock policy).
/// A timeout in the first phase leaves nothing pending and is retried as is.
async fn detach(
    conn: &mut AsyncPgConnection,
    parent: &str,
    partition: &Partition,
    qualified: &str,
    policy: &LockPolicy,
) -> Result<bool, RetentionError> {
    let statement = format!("ALTER TABLE {parent} DETACH PARTITION {qualified} CONCURRENTLY");
    let mut retry = LockRetry::new(&statement, policy);
    loop {
        let result = conn.batch_execute(&statement).await;
        if let Err(error) = &result {
            match detach_pending(conn, partition).await {
                Ok(true) => {
                    tracing::warn!(partition = %partition.name, %error, "detach left pending; finishing it with FINALIZE");
                    ddl(conn, &format!("ALTER TABLE {parent} DETACH PARTITION {qualified} FINALIZE"), policy).await?;
                    return Ok(true);
                }
                Ok(false) => {}
                Err(check) => {
                    tracing::warn!(partition = %partition.name, error = %check, "could not read whether the detach is pending")
                }
            }
        }
        if retry.settle(result).await? {
            return Ok(false);
        }
    }
}

/// Whether the catalog marks `partition` as detach-pending.
async fn detach_pending(conn: &mut AsyncPgConnection, partition: &Partition) -> Result<bool, RetentionError> {
    Ok(diesel::sql_query(
        "SELECT coalesce(bool_or(i.inhdetachpending), false) AS pending
         FROM pg_inherits i
         JOIN pg_class c ON c.oid = i.inhrelid
         JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE i.inhparent = to_regclass('adk_events') AND n.nspname = $1 AND c.relname = $2",
    )
    .bind::<Text, _>(&partition.schema)
    .bind::<Text, _>(&partition.name)
    .load::<PendingRow>(conn)
    .await
    .and_then(first_row)
    .map_err(RetentionError::query("read whether a detach is pending"))?
    .pending)
}

fn count(items: usize) -> i32 {
    i32::try_from(items).unwrap_or(i32::MAX)
}

/// Records one run, successful or failed (`error` set), with the days it
/// kept and why. `started` is `None` when the clock could not be read.
async fn record_run(
    conn: &mut AsyncPgConnection,
    started: Option<DateTime<Utc>>,
    report: &MaintenanceReport,
    error: Option<&str>,
) -> Result<(), RetentionError> {
    let kept_days = serde_json::to_value(&report.kept)
        .map_err(|e| RetentionError::Conflict(format!("could not encode the kept days: {e}")))?;
    diesel::sql_query(
        "INSERT INTO adk_maintenance_runs
             (started_at, today, created, dropped, finalized, sessions_deleted, partitions_ahead,
              outcome, error, kept_days)
         VALUES (coalesce($1, now()), $2, $3, $4, $5, $6, $7, $8, $9, $10)",
    )
    .bind::<Nullable<Timestamptz>, _>(started)
    .bind::<Date, _>(report.today.unwrap_or_default())
    .bind::<Integer, _>(count(report.created.len()))
    .bind::<Integer, _>(count(report.dropped.len()))
    .bind::<Integer, _>(count(report.finalized.len()))
    .bind::<BigInt, _>(i64::try_from(report.sessions_deleted).unwrap_or(i64::MAX))
    .bind::<Integer, _>(i32::try_from(report.partitions_ahead).unwrap_or(i32::MAX))
    .bind::<Text, _>(if error.is_some() { "failed" } else { "ok" })
    .bind::<Nullable<Text>, _>(error)
    .bind::<Jsonb, _>(kept_days)
    .execute(conn)
    .await
    .map_err(RetentionError::query("record the maintenance run"))?;
    Ok(())
}
