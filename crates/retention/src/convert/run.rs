//! Running a conversion: the steps the plan lists, one at a time, each
//! re-planned from the catalog first, under the conversion lock.

use std::fmt;
use std::time::Instant;

use adk_postgres_schema::migrations::apply_pending_migrations;
use adk_postgres_schema::quote::quote_ident;
use chrono::NaiveDate;
use diesel::sql_types::Text;
use diesel_async::{AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use serde::Serialize;

use super::CONVERT_LOCK_KEY;
use super::catalog::{Catalog, open};
use super::layout::{BASELINE_VERSION, MIGRATIONS_TABLE};
use super::plan::plan_steps;
use super::steps::{Action, StepKind};
use crate::RetentionError;
use crate::ddl_watch::{
    ConcurrentIndex, Observation, Watcher, backend_pid, build_index_concurrently, millis, run_long_watched,
};
use crate::lock::AdvisoryLock;
use adk_postgres_operations::{LockPolicy, LockRetry, ddl};

/// Options of [`convert_events_with`].
#[derive(Debug, Clone, Default)]
pub struct ConvertOptions {
    /// Stop after running this many steps (a deliberate interruption; the
    /// next run carries on). `None` runs to the end.
    pub stop_after: Option<usize>,
}

/// What a conversion is doing, as it happens.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum ConvertProgress {
    /// A step began.
    StepStarted {
        /// The step's number, as [`ConvertStep::number`](super::ConvertStep::number).
        number: usize,
        /// Which step.
        kind: StepKind,
        /// What it does.
        title: &'static str,
    },
    /// A concurrent index build, sampled from `pg_stat_progress_create_index`
    /// every ~200 ms.
    IndexBuild {
        /// The step's number, as [`ConvertStep::number`](super::ConvertStep::number).
        number: usize,
        /// The index being built.
        index: String,
        /// The build's phase, as the progress view names it.
        phase: String,
        /// Blocks processed in this phase.
        blocks_done: i64,
        /// Blocks this phase will process.
        blocks_total: i64,
        /// Tuples processed in this phase.
        tuples_done: i64,
        /// Tuples this phase will process.
        tuples_total: i64,
    },
    /// A validation scan (no progress view exists for those): how long it
    /// has run and what it waits on, if anything.
    Validating {
        /// The step's number, as [`ConvertStep::number`](super::ConvertStep::number).
        number: usize,
        /// The `VALIDATE CONSTRAINT` statement.
        statement: String,
        /// Milliseconds since it started.
        elapsed_ms: u64,
        /// What its backend waits on, as `wait_event_type:wait_event`;
        /// `None` while it is not waiting.
        wait_event: Option<String>,
    },
    /// An INVALID index left by an interrupted build was dropped.
    DroppedInvalidIndex {
        /// The step's number, as [`ConvertStep::number`](super::ConvertStep::number).
        number: usize,
        /// The index dropped.
        index: String,
    },
    /// A step completed.
    StepFinished {
        /// The step's number, as [`ConvertStep::number`](super::ConvertStep::number).
        number: usize,
        /// Which step.
        kind: StepKind,
        /// How long it took, in milliseconds.
        elapsed_ms: u64,
    },
}

/// One step a run performed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StepReport {
    /// The step's number, as [`ConvertStep::number`](super::ConvertStep::number).
    pub number: usize,
    /// Which step.
    pub kind: StepKind,
    /// How long it took, in milliseconds.
    pub elapsed_ms: u64,
}

/// What one run did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ConvertReport {
    /// The first day (UTC) of the new partitions.
    pub cutover: NaiveDate,
    /// There was nothing to do.
    pub already_converted: bool,
    /// The steps this run performed, in order.
    pub steps: Vec<StepReport>,
    /// The run stopped because of `stop_after`; steps remain.
    pub stopped_early: bool,
    /// How long the swap transaction held its locks (its last attempt).
    pub swap_lock_ms: Option<u64>,
    /// INVALID leftovers of interrupted index builds that were dropped.
    pub dropped_invalid_indexes: Vec<String>,
    /// Diesel migrations applied after the swap.
    pub migrations_applied: Vec<String>,
}

impl fmt::Display for ConvertReport {
    /// What `adk-pg convert-events` prints after a run.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.already_converted {
            return f.write_str("adk_events is already partitioned; nothing to do");
        }
        writeln!(
            f,
            "converted adk_events: {} step(s) run, legacy partition up to {}, swap held its locks for {} ms",
            self.steps.len(),
            self.cutover,
            self.swap_lock_ms.unwrap_or_default()
        )?;
        f.write_str("run `adk-pg maintain` now to premake the coming days")
    }
}

/// Converts the unpartitioned `adk_events` into the partitioned layout,
/// attaching the old table as the partition of every day before `cutover`
/// (the UTC day of the cutover, normally today). Resumable and idempotent.
pub async fn convert_events(
    database_url: &str,
    cutover: NaiveDate,
    policy: &LockPolicy,
    progress: &mut dyn FnMut(ConvertProgress),
) -> Result<ConvertReport, RetentionError> {
    convert_events_with(database_url, cutover, policy, &ConvertOptions::default(), progress).await
}

/// [`convert_events`] with options.
pub async fn convert_events_with(
    database_url: &str,
    cutover: NaiveDate,
    policy: &LockPolicy,
    options: &ConvertOptions,
    progress: &mut dyn FnMut(ConvertProgress),
) -> Result<ConvertReport, RetentionError> {
    let (conn, schema) = open(database_url, "adk-pg convert", policy).await?;
    let Some(mut lock) = AdvisoryLock::try_acquire(conn, CONVERT_LOCK_KEY).await? else {
        return Err(RetentionError::Conflict("another conversion is running on this database".into()));
    };
    // An error before the run starts drops the guard, which releases the lock.
    let pid = backend_pid(lock.conn()).await?;
    let mut run = Run {
        conn: lock.conn(),
        database_url,
        schema: &schema,
        policy,
        pid,
        watcher: None,
        progress,
        report: ConvertReport {
            cutover,
            already_converted: false,
            steps: Vec::new(),
            stopped_early: false,
            swap_lock_ms: None,
            dropped_invalid_indexes: Vec::new(),
            migrations_applied: Vec::new(),
        },
    };
    let outcome = run.steps(options).await;
    let report = run.report;
    lock.release().await;
    outcome?;
    Ok(report)
}

/// Everything one run works with, so each step and action reads what it
/// needs from one place instead of from a long argument list.
struct Run<'a> {
    /// The connection holding the conversion lock, its search path the
    /// tables' schema.
    conn: &'a mut AsyncPgConnection,
    /// For the migrations at the end and the second connection that
    /// watches long statements.
    database_url: &'a str,
    schema: &'a str,
    policy: &'a LockPolicy,
    /// The server process of `conn`, for the watcher.
    pid: i32,
    /// Opened on first use: steps without a long statement need no second
    /// connection.
    watcher: Option<Watcher>,
    progress: &'a mut dyn FnMut(ConvertProgress),
    report: ConvertReport,
}

impl Run<'_> {
    async fn steps(&mut self, options: &ConvertOptions) -> Result<(), RetentionError> {
        let cutover = self.report.cutover;
        let mut last: Option<StepKind> = None;
        loop {
            // Re-read the catalog before every step: it, not this loop, is the
            // record of what is done, so a rerun after any interruption and
            // this run agree on what comes next.
            let catalog = Catalog::read(self.conn, self.schema).await?;
            let Some(step) = plan_steps(&catalog, cutover)?.into_iter().next() else {
                self.report.already_converted = self.report.steps.is_empty();
                return Ok(());
            };
            if last == Some(step.kind) {
                return Err(RetentionError::Conflict(format!(
                    "step {} ({}) ran but the catalog does not show it done",
                    step.number, step.title
                )));
            }
            if options.stop_after.is_some_and(|limit| self.report.steps.len() >= limit) {
                self.report.stopped_early = true;
                return Ok(());
            }
            let started = Instant::now();
            (self.progress)(ConvertProgress::StepStarted { number: step.number, kind: step.kind, title: step.title });
            for action in &step.actions {
                self.action(step.number, action).await?;
            }
            let elapsed_ms = millis(started.elapsed());
            (self.progress)(ConvertProgress::StepFinished { number: step.number, kind: step.kind, elapsed_ms });
            self.report.steps.push(StepReport { number: step.number, kind: step.kind, elapsed_ms });
            last = Some(step.kind);
        }
    }

    /// Runs one action of step `number`.
    async fn action(&mut self, number: usize, action: &Action) -> Result<(), RetentionError> {
        let policy = self.policy;
        match action {
            Action::Ddl(sql) => {
                ddl(self.conn, sql, policy).await?;
            }
            Action::BuildIndex { index, create, .. } => {
                let watcher = watcher_for(&mut self.watcher, self.database_url, policy, self.pid).await;
                let progress = &mut *self.progress;
                let target = ConcurrentIndex { schema: self.schema, name: index, create };
                let outcome = build_index_concurrently(self.conn, watcher, policy, target, &mut |p| {
                    progress(ConvertProgress::IndexBuild {
                        number,
                        index: index.clone(),
                        phase: p.phase,
                        blocks_done: p.blocks_done,
                        blocks_total: p.blocks_total,
                        tuples_done: p.tuples_done,
                        tuples_total: p.tuples_total,
                    })
                })
                .await?;
                if outcome.dropped_invalid {
                    self.report.dropped_invalid_indexes.push(index.clone());
                    (self.progress)(ConvertProgress::DroppedInvalidIndex { number, index: index.clone() });
                }
            }
            Action::Validate(sql) => {
                let watcher = watcher_for(&mut self.watcher, self.database_url, policy, self.pid).await;
                let progress = &mut *self.progress;
                run_long_watched(self.conn, watcher, policy, sql, &mut |observation| {
                    if let Observation::Activity { elapsed, wait_event } = observation {
                        progress(ConvertProgress::Validating {
                            number,
                            statement: sql.clone(),
                            elapsed_ms: millis(elapsed),
                            wait_event,
                        });
                    }
                })
                .await?;
            }
            Action::Swap(sql) => {
                self.report.swap_lock_ms = Some(run_swap(self.conn, sql, policy).await?);
            }
            Action::RecordBaseline { create } => {
                ddl(self.conn, create, policy).await?;
                diesel::sql_query(format!(
                    "INSERT INTO {} (version) VALUES ($1) ON CONFLICT DO NOTHING",
                    quote_ident(MIGRATIONS_TABLE)
                ))
                .bind::<Text, _>(BASELINE_VERSION)
                .execute(self.conn)
                .await
                .map_err(RetentionError::query("record migration 000001 as applied"))?;
            }
            Action::ApplyMigrations { .. } => {
                // Only the migrations: premaking days ahead here would take
                // exclusive locks under the live writers; the CLI tells the
                // operator to run `adk-pg maintain` next.
                let applied = apply_pending_migrations(self.database_url).await.map_err(|e| {
                    RetentionError::NotMigrated(format!("applying the migrations after the conversion: {e}"))
                })?;
                self.report.migrations_applied.extend(applied);
            }
        }
        Ok(())
    }
}

async fn watcher_for<'w>(
    watcher: &'w mut Option<Watcher>,
    database_url: &str,
    policy: &LockPolicy,
    pid: i32,
) -> &'w mut Watcher {
    if let Some(open) = watcher.take() {
        return watcher.insert(open);
    }
    watcher.insert(Watcher::open(database_url, "adk-pg convert (progress)", policy, pid).await)
}

/// Runs the swap transaction, retrying it whole when it times out on a lock;
/// returns how long the successful attempt took, i.e. how long it held its
/// locks.
async fn run_swap(conn: &mut AsyncPgConnection, sql: &str, policy: &LockPolicy) -> Result<u64, RetentionError> {
    let mut retry = LockRetry::new("the conversion swap", policy);
    loop {
        let started = Instant::now();
        // One simple-protocol message with several statements is one
        // transaction: all of it commits or none of it does.
        let result = conn.batch_execute(sql).await;
        if retry.settle(result).await? {
            return Ok(millis(started.elapsed()));
        }
    }
}
