//! Converting a live, unpartitioned event log into the partitioned layout
//! without rewriting its data.
//!
//! A table cannot be altered into a partitioned one. Instead the existing
//! table becomes, unchanged on disk, one *legacy* partition holding every day
//! before the cutover, under a new partitioned parent with the name and the
//! exact definition of migration `2026-11-01-000001_create_store`.
//!
//! # The legacy layout
//!
//! What this converts (the fixture `tests/fixtures/legacy_layout.sql`) is
//! migration 000001's tables except that:
//!
//! * `adk_sessions` has no `session_day` column, no `adk_sessions_key_day`
//!   unique constraint and no `adk_sessions_day` index;
//! * `adk_events` is a plain table without `session_day`, with
//!   `PRIMARY KEY (app_name, user_id, session_id, seq)`,
//!   `UNIQUE (app_name, user_id, session_id, event_id)` and
//!   `FOREIGN KEY (app_name, user_id, session_id) REFERENCES adk_sessions
//!   ON DELETE CASCADE` (any constraint names), plus the two CHECKs of the
//!   partitioned parent (`adk_events_seq_positive`,
//!   `adk_events_payload_is_object`; added if missing);
//! * there is no diesel migrations table.
//!
//! Anything else (other columns, row-level security, foreign keys pointing
//! at `adk_events`, inheritance) is refused with [`OpsError::Conflict`]
//! before anything is changed. The tables must be on the search path of the
//! connecting role, in the schema diesel keeps its migrations table in
//! (normally `public`).
//!
//! # The steps
//!
//! The numbers in brackets are the steps of the partitioning guide; each
//! [`StepKind`] is one resumable unit whose completion is read from the
//! catalog, never from a record of our own, so a run can be interrupted
//! anywhere (including a killed `CREATE INDEX CONCURRENTLY`, whose INVALID
//! leftover is dropped and rebuilt) and simply run again.
//!
//! * \[1\] [`StepKind::AddSessionDay`]: `session_day date NOT NULL DEFAULT
//!   '<cutover - 1>'` on both tables, in one transaction so both agree. A
//!   constant default is stored in the catalog (`attmissingval`): no rewrite,
//!   no scan.
//! * \[2\] Deploy the application that reads `session_day` under the session
//!   row lock and binds it into every event insert (this crate's store does,
//!   through `adk_append_event`). Nothing to do here, but it must be live
//!   before step \[4\]: after the swap an insert without `session_day` fails.
//! * \[3\] Everything the attach would otherwise do under its lock, done
//!   beforehand with weak locks: `adk_sessions_key_day` (unique index built
//!   concurrently, then promoted to a constraint) and `adk_sessions_day`;
//!   unique indexes matching the new primary key and event-id key on the
//!   old table (concurrently); `CHECK (session_day < '<cutover>')` added
//!   `NOT VALID` and then validated (a light lock), which is what lets the
//!   attach skip its validation scan; the new foreign key carrying
//!   `session_day`, `NOT VALID` then validated, which the attach adopts
//!   instead of checking.
//! * \[4\] [`StepKind::Swap`], one short transaction under `lock_timeout`
//!   (retried whole): lock both tables, rename `adk_events` to
//!   `adk_events_legacy`, drop its constraints without `session_day`,
//!   promote the prebuilt indexes to its primary key and unique constraint,
//!   create the partitioned parent exactly as migration 000001 does (grants
//!   and owner moved over from the old table, so that, like every other
//!   partition, the legacy one is reached only through the parent and its
//!   row-level security), attach the legacy table `FOR
//!   VALUES FROM (MINVALUE) TO ('<cutover>')`, create the cutover day's
//!   partition, and check inside the transaction that the parent's indexes
//!   and foreign key are valid and were adopted rather than rebuilt. Only
//!   catalog work happens under the lock; [`ConvertReport::swap_lock_ms`]
//!   says how long it was held.
//! * \[5\] [`StepKind::SessionsDefault`]: new sessions get today's UTC day
//!   (and so today's partition). Sessions from before keep the legacy day
//!   and keep appending into the legacy partition until they age out.
//! * \[6\] Dropping the legacy partition is not done here: maintenance drops
//!   it like any other partition once its upper bound (the cutover) is past
//!   the maximum session lifetime plus retention, and never deletes session
//!   rows while a `MINVALUE` partition is attached.
//!
//! Finally diesel's `__diesel_schema_migrations` is created if missing with
//! migration 000001 recorded as applied (the conversion *is* that
//! migration), and the later migrations are applied, so the database ends
//! exactly where a fresh install is. Run maintenance right after: the
//! conversion only creates the cutover day's partition.
//!
//! [`plan_conversion`] lists the remaining steps with their exact SQL
//! without changing anything (`--dry-run`); [`convert_events`] runs them.
//! Running it on a converted (or freshly migrated) database does nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Instant;

use adk_postgres_schema::migrations::{MIGRATIONS, apply_pending_migrations};
use chrono::NaiveDate;
use diesel::QueryableByName;
use diesel::migration::MigrationSource;
use diesel::pg::Pg;
use diesel::sql_types::{Array, BigInt, Bool, Nullable, Text};
use diesel_async::{AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use serde::Serialize;

use crate::error::OpsError;
use crate::index::{
    INDEX_INFO_SQL, IndexInfo, Observation, Watcher, backend_pid, build_index_concurrently, millis, run_long_watched,
    try_advisory_lock,
};
use crate::partitions::partition_name;
use crate::sql::{LockPolicy, LockRetry, connect, ddl, events_schema, first_row, quote_ident, quote_literal};

/// Key of the advisory lock that keeps two conversions apart.
pub const CONVERT_LOCK_KEY: i64 = adk_postgres_schema::names::lock_keys::CONVERSION;

/// The old table's name once it is a partition.
pub const LEGACY_PARTITION: &str = "adk_events_legacy";

const EVENTS: &str = "adk_events";
const SESSIONS: &str = "adk_sessions";
const SESSION_DAY: &str = "session_day";
const LEGACY_PKEY: &str = "adk_events_legacy_pkey";
const LEGACY_EVENT_ID_KEY: &str = "adk_events_legacy_event_id_key";
const LEGACY_RANGE: &str = "adk_events_legacy_range";
const LEGACY_FKEY: &str = "adk_events_legacy_session_fkey";
const SESSIONS_KEY_DAY: &str = "adk_sessions_key_day";
const SESSIONS_DAY: &str = "adk_sessions_day";
const PARENT_PKEY: &str = "adk_events_pkey";
const PARENT_EVENT_ID_KEY: &str = "adk_events_event_id_key";
const SEQ_POSITIVE: &str = "adk_events_seq_positive";
const PAYLOAD_IS_OBJECT: &str = "adk_events_payload_is_object";
const MIGRATIONS_TABLE: &str = "__diesel_schema_migrations";
/// diesel's version of migration 2026-11-01-000001_create_store.
const BASELINE_VERSION: &str = "20261101000001";
/// Migration 000001, whose `CREATE TABLE adk_events` the swap runs verbatim.
const CREATE_STORE_SQL: &str = include_str!("../../../migrations/2026-11-01-000001_create_store/up.sql");
/// The session-day default of migration 000001.
const SESSION_DAY_DEFAULT: &str = "((now() AT TIME ZONE 'UTC')::date)";

const KEY: [&str; 4] = ["app_name", "user_id", "session_id", "session_day"];

/// Columns of the legacy `adk_events`: name, type as `format_type` spells
/// it, and whether the partitioned parent requires NOT NULL (the attach
/// refuses a partition that is laxer than its parent).
const EVENT_COLUMNS: [(&str, &str, bool); 10] = [
    ("app_name", "text", true),
    ("user_id", "text", true),
    ("session_id", "text", true),
    ("seq", "bigint", true),
    ("event_id", "text", true),
    ("invocation_id", "text", false),
    ("author", "text", true),
    ("event_ts", "bigint", true),
    ("created_at", "timestamp with time zone", true),
    ("payload", "jsonb", true),
];

/// Columns the later migrations' functions use on `adk_sessions`.
const SESSION_COLUMNS: [&str; 10] = [
    "app_name",
    "user_id",
    "session_id",
    "state",
    "last_seq",
    "created_at",
    "updated_at",
    "expires_at",
    "closed_at",
    "successor_id",
];

/// One resumable unit of the conversion, in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StepKind {
    AddSessionDay,
    SessionsKeyDayIndex,
    SessionsKeyDayConstraint,
    SessionsDayIndex,
    EventsKeyIndex,
    EventsEventIdIndex,
    EventsChecks,
    EventsForeignKey,
    Swap,
    SessionsDefault,
    RecordBaseline,
    ApplyMigrations,
}

impl StepKind {
    pub const ALL: [StepKind; 12] = [
        StepKind::AddSessionDay,
        StepKind::SessionsKeyDayIndex,
        StepKind::SessionsKeyDayConstraint,
        StepKind::SessionsDayIndex,
        StepKind::EventsKeyIndex,
        StepKind::EventsEventIdIndex,
        StepKind::EventsChecks,
        StepKind::EventsForeignKey,
        StepKind::Swap,
        StepKind::SessionsDefault,
        StepKind::RecordBaseline,
        StepKind::ApplyMigrations,
    ];

    /// Position in [`StepKind::ALL`], from 1.
    pub fn number(self) -> usize {
        Self::ALL.iter().position(|k| *k == self).map_or(0, |i| i + 1)
    }

    /// The step of the partitioning guide this belongs to (0: bookkeeping
    /// after the guide's steps).
    pub fn guide_step(self) -> u8 {
        match self {
            Self::AddSessionDay => 1,
            Self::Swap => 4,
            Self::SessionsDefault => 5,
            Self::RecordBaseline | Self::ApplyMigrations => 0,
            _ => 3,
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            Self::AddSessionDay => "add session_day with a constant default to adk_sessions and adk_events",
            Self::SessionsKeyDayIndex => "build adk_sessions_key_day concurrently",
            Self::SessionsKeyDayConstraint => "promote adk_sessions_key_day to a unique constraint",
            Self::SessionsDayIndex => "build adk_sessions_day concurrently",
            Self::EventsKeyIndex => "build the future primary key of the legacy events concurrently",
            Self::EventsEventIdIndex => "build the future event-id key of the legacy events concurrently",
            Self::EventsChecks => "add and validate the legacy range CHECK (and the parent's CHECKs)",
            Self::EventsForeignKey => "add and validate the foreign key carrying session_day",
            Self::Swap => "swap in the partitioned parent and attach the legacy partition (one transaction)",
            Self::SessionsDefault => "give new sessions today's UTC day",
            Self::RecordBaseline => "record migration 000001 as applied",
            Self::ApplyMigrations => "apply the remaining migrations",
        }
    }
}

/// What one action of a step does; the plan shows its SQL, the executor
/// runs it.
#[derive(Debug, Clone)]
enum Action {
    /// DDL under lock_timeout with retry. Several statements in one string
    /// run as one implicit transaction.
    Ddl(String),
    /// `CREATE INDEX CONCURRENTLY`, watched; an INVALID leftover of the
    /// same name is dropped first (`drop` is its `DROP INDEX CONCURRENTLY`).
    BuildIndex { index: String, drop: Option<String>, create: String },
    /// `VALIDATE CONSTRAINT`: a scan under a lock that blocks no reads or
    /// writes; watched.
    Validate(String),
    /// The swap transaction; timed.
    Swap(String),
    /// Create diesel's table if missing and record migration 000001.
    RecordBaseline { create: String },
    /// `run_pending_migrations`.
    ApplyMigrations { pending: Vec<String> },
}

impl Action {
    fn sql(&self) -> Vec<String> {
        match self {
            Self::Ddl(sql) | Self::Validate(sql) | Self::Swap(sql) => vec![sql.clone()],
            Self::BuildIndex { drop, create, .. } => drop.iter().cloned().chain([create.clone()]).collect(),
            Self::RecordBaseline { create } => vec![
                create.clone(),
                format!(
                    "INSERT INTO {} (version) VALUES ({}) ON CONFLICT DO NOTHING",
                    quote_ident(MIGRATIONS_TABLE),
                    quote_literal(BASELINE_VERSION)
                ),
            ],
            Self::ApplyMigrations { pending } => {
                vec![format!("-- diesel: run pending migrations {}", pending.join(", "))]
            }
        }
    }
}

/// One remaining step and the exact SQL it runs.
#[derive(Debug, Clone, Serialize)]
pub struct ConvertStep {
    /// Position in [`StepKind::ALL`], from 1; stable across runs.
    pub number: usize,
    pub kind: StepKind,
    /// The step of the partitioning guide (1, 3, 4, 5; 0 for bookkeeping).
    pub guide_step: u8,
    pub title: &'static str,
    /// The statements, in order. A statement holding several `;`-separated
    /// commands runs as one transaction.
    pub sql: Vec<String>,
    #[serde(skip)]
    actions: Vec<Action>,
}

impl ConvertStep {
    fn new(kind: StepKind, actions: Vec<Action>) -> Self {
        Self {
            number: kind.number(),
            kind,
            guide_step: kind.guide_step(),
            title: kind.title(),
            sql: actions.iter().flat_map(Action::sql).collect(),
            actions,
        }
    }
}

/// What a conversion would do now: the `--dry-run` output.
#[derive(Debug, Clone, Serialize)]
pub struct ConvertPlan {
    pub cutover: NaiveDate,
    pub schema: String,
    /// Nothing left to do.
    pub already_converted: bool,
    pub steps: Vec<ConvertStep>,
}

impl fmt::Display for ConvertPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.already_converted {
            return writeln!(f, "-- adk_events in schema {} is already converted; nothing to do", self.schema);
        }
        writeln!(f, "-- converting adk_events in schema {} with cutover {}", self.schema, self.cutover)?;
        for step in &self.steps {
            writeln!(f, "\n-- step {} (guide step {}): {}", step.number, step.guide_step, step.title)?;
            for statement in &step.sql {
                writeln!(f, "{statement};")?;
            }
        }
        Ok(())
    }
}

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
    StepStarted {
        number: usize,
        kind: StepKind,
        title: &'static str,
    },
    /// A concurrent index build, sampled from `pg_stat_progress_create_index`
    /// every ~200 ms.
    IndexBuild {
        number: usize,
        index: String,
        phase: String,
        blocks_done: i64,
        blocks_total: i64,
        tuples_done: i64,
        tuples_total: i64,
    },
    /// A validation scan (no progress view exists for those): how long it
    /// has run and what it waits on, if anything.
    Validating {
        number: usize,
        statement: String,
        elapsed_ms: u64,
        wait_event: Option<String>,
    },
    /// An INVALID index left by an interrupted build was dropped.
    DroppedInvalidIndex {
        number: usize,
        index: String,
    },
    StepFinished {
        number: usize,
        kind: StepKind,
        elapsed_ms: u64,
    },
}

/// One step a run performed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StepReport {
    pub number: usize,
    pub kind: StepKind,
    pub elapsed_ms: u64,
}

/// What one run did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ConvertReport {
    pub cutover: NaiveDate,
    /// There was nothing to do.
    pub already_converted: bool,
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

/// The remaining steps with their exact SQL; empty when converted.
pub async fn plan_conversion(database_url: &str, cutover: NaiveDate) -> Result<Vec<ConvertStep>, OpsError> {
    Ok(conversion_plan(database_url, cutover).await?.steps)
}

/// [`plan_conversion`] with the schema and a printable form.
pub async fn conversion_plan(database_url: &str, cutover: NaiveDate) -> Result<ConvertPlan, OpsError> {
    let (mut conn, schema) = open(database_url, "adk-pg convert (plan)", &LockPolicy::default()).await?;
    let catalog = Catalog::read(&mut conn, &schema).await?;
    let steps = plan_steps(&catalog, cutover)?;
    Ok(ConvertPlan { cutover, schema, already_converted: steps.is_empty(), steps })
}

/// Converts the unpartitioned `adk_events` into the partitioned layout,
/// attaching the old table as the partition of every day before `cutover`
/// (the UTC day of the cutover, normally today). Resumable and idempotent.
pub async fn convert_events(
    database_url: &str,
    cutover: NaiveDate,
    policy: &LockPolicy,
    progress: &mut dyn FnMut(ConvertProgress),
) -> Result<ConvertReport, OpsError> {
    convert_events_with(database_url, cutover, policy, &ConvertOptions::default(), progress).await
}

/// [`convert_events`] with options.
pub async fn convert_events_with(
    database_url: &str,
    cutover: NaiveDate,
    policy: &LockPolicy,
    options: &ConvertOptions,
    progress: &mut dyn FnMut(ConvertProgress),
) -> Result<ConvertReport, OpsError> {
    let (mut conn, schema) = open(database_url, "adk-pg convert", policy).await?;
    if !try_advisory_lock(&mut conn, CONVERT_LOCK_KEY).await? {
        return Err(OpsError::Conflict("another conversion is running on this database".into()));
    }
    let mut report = ConvertReport {
        cutover,
        already_converted: false,
        steps: Vec::new(),
        stopped_early: false,
        swap_lock_ms: None,
        dropped_invalid_indexes: Vec::new(),
        migrations_applied: Vec::new(),
    };
    let outcome = run_steps(&mut conn, database_url, &schema, cutover, policy, options, progress, &mut report).await;
    // Session-scoped: release it even when the run failed.
    let _ = conn.batch_execute(&format!("SELECT pg_advisory_unlock({CONVERT_LOCK_KEY})")).await;
    outcome?;
    Ok(report)
}

/// An operations connection whose search path is the tables' schema, so
/// migration 000001's unqualified DDL lands next to the old table.
async fn open(
    database_url: &str,
    application_name: &str,
    policy: &LockPolicy,
) -> Result<(AsyncPgConnection, String), OpsError> {
    let mut conn = connect(database_url, application_name, policy).await?;
    let schema = events_schema(&mut conn).await?;
    conn.batch_execute(&format!("SET search_path TO {}", quote_ident(&schema)))
        .await
        .map_err(OpsError::query("set the search path"))?;
    Ok((conn, schema))
}

#[allow(clippy::too_many_arguments)]
async fn run_steps(
    conn: &mut AsyncPgConnection,
    database_url: &str,
    schema: &str,
    cutover: NaiveDate,
    policy: &LockPolicy,
    options: &ConvertOptions,
    progress: &mut dyn FnMut(ConvertProgress),
    report: &mut ConvertReport,
) -> Result<(), OpsError> {
    let pid = backend_pid(conn).await?;
    let mut watcher: Option<Watcher> = None;
    let mut last: Option<StepKind> = None;
    loop {
        // Re-read the catalog before every step: it, not this loop, is the
        // record of what is done, so a rerun after any interruption and
        // this run agree on what comes next.
        let catalog = Catalog::read(conn, schema).await?;
        let Some(step) = plan_steps(&catalog, cutover)?.into_iter().next() else {
            report.already_converted = report.steps.is_empty();
            return Ok(());
        };
        if last == Some(step.kind) {
            return Err(OpsError::Conflict(format!(
                "step {} ({}) ran but the catalog does not show it done",
                step.number, step.title
            )));
        }
        if options.stop_after.is_some_and(|limit| report.steps.len() >= limit) {
            report.stopped_early = true;
            return Ok(());
        }
        let started = Instant::now();
        progress(ConvertProgress::StepStarted { number: step.number, kind: step.kind, title: step.title });
        for action in &step.actions {
            run_action(conn, database_url, schema, pid, &mut watcher, policy, &step, action, progress, report).await?;
        }
        let elapsed_ms = millis(started.elapsed());
        progress(ConvertProgress::StepFinished { number: step.number, kind: step.kind, elapsed_ms });
        report.steps.push(StepReport { number: step.number, kind: step.kind, elapsed_ms });
        last = Some(step.kind);
    }
}

#[allow(clippy::too_many_arguments)]
async fn run_action(
    conn: &mut AsyncPgConnection,
    database_url: &str,
    schema: &str,
    pid: i32,
    watcher: &mut Option<Watcher>,
    policy: &LockPolicy,
    step: &ConvertStep,
    action: &Action,
    progress: &mut dyn FnMut(ConvertProgress),
    report: &mut ConvertReport,
) -> Result<(), OpsError> {
    let number = step.number;
    match action {
        Action::Ddl(sql) => {
            ddl(conn, sql, policy).await?;
        }
        Action::BuildIndex { index, create, .. } => {
            let watcher = watcher_for(watcher, database_url, policy).await;
            let outcome = build_index_concurrently(conn, pid, watcher, schema, index, create, policy, &mut |p| {
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
                report.dropped_invalid_indexes.push(index.clone());
                progress(ConvertProgress::DroppedInvalidIndex { number, index: index.clone() });
            }
        }
        Action::Validate(sql) => {
            let watcher = watcher_for(watcher, database_url, policy).await;
            run_long_watched(conn, pid, watcher, sql, policy, &mut |observation| {
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
            report.swap_lock_ms = Some(run_swap(conn, sql, policy).await?);
        }
        Action::RecordBaseline { create } => {
            ddl(conn, create, policy).await?;
            diesel::sql_query(format!(
                "INSERT INTO {} (version) VALUES ($1) ON CONFLICT DO NOTHING",
                quote_ident(MIGRATIONS_TABLE)
            ))
            .bind::<Text, _>(BASELINE_VERSION)
            .execute(conn)
            .await
            .map_err(OpsError::query("record migration 000001 as applied"))?;
        }
        Action::ApplyMigrations { .. } => {
            // Only the migrations: premaking days ahead here would take
            // exclusive locks under the live writers; the CLI tells the
            // operator to run `adk-pg maintain` next.
            let applied = apply_pending_migrations(database_url)
                .await
                .map_err(|e| OpsError::NotMigrated(format!("applying the migrations after the conversion: {e}")))?;
            report.migrations_applied.extend(applied);
        }
    }
    Ok(())
}

async fn watcher_for<'w>(watcher: &'w mut Option<Watcher>, database_url: &str, policy: &LockPolicy) -> &'w mut Watcher {
    // Opened on first use: steps without a long statement need no second
    // connection.
    if let Some(open) = watcher.take() {
        return watcher.insert(open);
    }
    watcher.insert(Watcher::open(database_url, "adk-pg convert (progress)", policy).await)
}

/// Runs the swap transaction, retrying it whole when it times out on a lock;
/// returns how long the successful attempt took, i.e. how long it held its
/// locks.
async fn run_swap(conn: &mut AsyncPgConnection, sql: &str, policy: &LockPolicy) -> Result<u64, OpsError> {
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

// ---------------------------------------------------------------------------
// The catalog, read once per step.
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, QueryableByName)]
struct RelationRow {
    #[diesel(sql_type = Text)]
    name: String,
    #[diesel(sql_type = Text)]
    kind: String,
    #[diesel(sql_type = Text)]
    owner: String,
    /// Row-level security enabled, or policies defined.
    #[diesel(sql_type = Bool)]
    secured: bool,
    /// A partition or inheritance child, or has children.
    #[diesel(sql_type = Bool)]
    in_hierarchy: bool,
    /// Foreign keys of other tables that point here.
    #[diesel(sql_type = BigInt)]
    referenced_by: i64,
}

#[derive(Debug, Clone, QueryableByName)]
struct ColumnRow {
    #[diesel(sql_type = Text)]
    table_name: String,
    #[diesel(sql_type = Text)]
    name: String,
    #[diesel(sql_type = Text)]
    type_name: String,
    #[diesel(sql_type = Bool)]
    not_null: bool,
    #[diesel(sql_type = Nullable<Text>)]
    default_expr: Option<String>,
}

#[derive(Debug, Clone, QueryableByName)]
struct ConstraintRow {
    #[diesel(sql_type = Text)]
    table_name: String,
    #[diesel(sql_type = Text)]
    name: String,
    #[diesel(sql_type = Text)]
    kind: String,
    #[diesel(sql_type = Bool)]
    validated: bool,
    #[diesel(sql_type = Text)]
    definition: String,
    #[diesel(sql_type = Array<Text>)]
    columns: Vec<String>,
}

#[derive(Debug, Clone, QueryableByName)]
struct GrantRow {
    /// `None` for PUBLIC.
    #[diesel(sql_type = Nullable<Text>)]
    grantee: Option<String>,
    #[diesel(sql_type = Text)]
    privilege: String,
    #[diesel(sql_type = Bool)]
    grantable: bool,
}

#[derive(QueryableByName)]
struct TextRow {
    #[diesel(sql_type = Text)]
    value: String,
}

/// What the conversion needs to know about the two tables.
#[derive(Debug, Clone)]
struct Catalog {
    current_user: String,
    relations: BTreeMap<String, RelationRow>,
    columns: Vec<ColumnRow>,
    indexes: Vec<IndexInfo>,
    constraints: Vec<ConstraintRow>,
    /// Privileges granted on `adk_events` to others than its owner.
    grants: Vec<GrantRow>,
    /// Versions in `__diesel_schema_migrations`; `None` without the table.
    migrations: Option<BTreeSet<String>>,
}

impl Catalog {
    async fn read(conn: &mut AsyncPgConnection, schema: &str) -> Result<Self, OpsError> {
        let relations = diesel::sql_query(
            "SELECT c.relname::text AS name, c.relkind::text AS kind, pg_get_userbyid(c.relowner)::text AS owner,
                    (c.relrowsecurity OR EXISTS (SELECT 1 FROM pg_policy p WHERE p.polrelid = c.oid)) AS secured,
                    EXISTS (SELECT 1 FROM pg_inherits h WHERE h.inhparent = c.oid OR h.inhrelid = c.oid) AS in_hierarchy,
                    (SELECT count(*) FROM pg_constraint f
                     WHERE f.confrelid = c.oid AND f.conrelid <> c.oid AND f.conparentid = 0) AS referenced_by
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = $1 AND (c.relname LIKE 'adk\\_%' OR c.relname = $2)",
        )
        .bind::<Text, _>(schema)
        .bind::<Text, _>(MIGRATIONS_TABLE)
        .load::<RelationRow>(conn)
        .await
        .map_err(OpsError::query("read the tables"))?;
        let relations: BTreeMap<String, RelationRow> = relations.into_iter().map(|r| (r.name.clone(), r)).collect();

        let columns = diesel::sql_query(
            "SELECT c.relname::text AS table_name, a.attname::text AS name,
                    format_type(a.atttypid, a.atttypmod) AS type_name, a.attnotnull AS not_null,
                    pg_get_expr(d.adbin, d.adrelid) AS default_expr
             FROM pg_attribute a
             JOIN pg_class c ON c.oid = a.attrelid
             JOIN pg_namespace n ON n.oid = c.relnamespace
             LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
             WHERE n.nspname = $1 AND c.relname IN ('adk_events', 'adk_sessions')
               AND a.attnum > 0 AND NOT a.attisdropped",
        )
        .bind::<Text, _>(schema)
        .load::<ColumnRow>(conn)
        .await
        .map_err(OpsError::query("read the columns"))?;

        let indexes = diesel::sql_query(INDEX_INFO_SQL)
            .bind::<Text, _>(schema)
            .load::<IndexInfo>(conn)
            .await
            .map_err(OpsError::query("read the indexes"))?;

        let constraints = diesel::sql_query(
            "SELECT t.relname::text AS table_name, c.conname::text AS name, c.contype::text AS kind,
                    c.convalidated AS validated, pg_get_constraintdef(c.oid) AS definition,
                    ARRAY(SELECT a.attname::text
                          FROM unnest(c.conkey) WITH ORDINALITY k(attnum, ord)
                          JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.attnum
                          ORDER BY k.ord) AS columns
             FROM pg_constraint c
             JOIN pg_class t ON t.oid = c.conrelid
             JOIN pg_namespace n ON n.oid = t.relnamespace
             WHERE n.nspname = $1 AND t.relname IN ('adk_events', 'adk_sessions')",
        )
        .bind::<Text, _>(schema)
        .load::<ConstraintRow>(conn)
        .await
        .map_err(OpsError::query("read the constraints"))?;

        let grants = diesel::sql_query(
            "SELECT CASE WHEN g.grantee = 0 THEN NULL ELSE pg_get_userbyid(g.grantee)::text END AS grantee,
                    g.privilege_type::text AS privilege, g.is_grantable AS grantable
             FROM pg_class c
             JOIN pg_namespace n ON n.oid = c.relnamespace
             CROSS JOIN LATERAL aclexplode(c.relacl) g
             WHERE n.nspname = $1 AND c.relname = 'adk_events' AND g.grantee <> c.relowner
             ORDER BY 1, 2",
        )
        .bind::<Text, _>(schema)
        .load::<GrantRow>(conn)
        .await
        .map_err(OpsError::query("read the privileges on adk_events"))?;

        let migrations = if relations.get(MIGRATIONS_TABLE).is_some_and(|r| r.kind == "r") {
            let rows =
                diesel::sql_query(format!("SELECT version::text AS value FROM {}", quote_ident(MIGRATIONS_TABLE)))
                    .load::<TextRow>(conn)
                    .await
                    .map_err(OpsError::query("read the applied migrations"))?;
            Some(rows.into_iter().map(|r| r.value).collect())
        } else {
            None
        };

        let current_user = diesel::sql_query("SELECT current_user::text AS value")
            .load::<TextRow>(conn)
            .await
            .and_then(first_row)
            .map_err(OpsError::query("read current_user"))?
            .value;

        Ok(Self { current_user, relations, columns, indexes, constraints, grants, migrations })
    }

    fn relation(&self, name: &str) -> Option<&RelationRow> {
        self.relations.get(name)
    }

    fn column(&self, table: &str, name: &str) -> Option<&ColumnRow> {
        self.columns.iter().find(|c| c.table_name == table && c.name == name)
    }

    fn index(&self, name: &str) -> Option<&IndexInfo> {
        self.indexes.iter().find(|i| i.name == name)
    }

    fn constraint(&self, table: &str, name: &str) -> Option<&ConstraintRow> {
        self.constraints.iter().find(|c| c.table_name == table && c.name == name)
    }
}

// ---------------------------------------------------------------------------
// Planning: the remaining steps, from the catalog alone.
// ---------------------------------------------------------------------------

fn plan_steps(catalog: &Catalog, cutover: NaiveDate) -> Result<Vec<ConvertStep>, OpsError> {
    let events =
        catalog.relation(EVENTS).ok_or_else(|| OpsError::NotMigrated("table adk_events does not exist".into()))?;
    if catalog.relation(SESSIONS).is_none() {
        return Err(OpsError::NotMigrated("table adk_sessions does not exist".into()));
    }
    let mut steps = Vec::new();
    let unpartitioned = match events.kind.as_str() {
        "p" => false,
        "r" => true,
        other => return Err(unrecognised(format!("adk_events is a relation of kind '{other}', not a table"))),
    };
    if unpartitioned {
        plan_before_swap(catalog, cutover, &mut steps)?;
    }
    plan_after_swap(catalog, unpartitioned, &mut steps)?;
    Ok(steps)
}

fn unrecognised(detail: String) -> OpsError {
    OpsError::Conflict(format!("unrecognised layout, nothing was changed: {detail}"))
}

fn columns_are(columns: &[String], wanted: &[&str]) -> bool {
    columns.len() == wanted.len() && columns.iter().zip(wanted).all(|(a, b)| a == b)
}

/// Refuses what the swap could not handle, before anything is changed.
fn recognise(catalog: &Catalog, cutover: NaiveDate) -> Result<(), OpsError> {
    let events = catalog.relation(EVENTS).ok_or_else(|| unrecognised("adk_events is missing".into()))?;
    if events.in_hierarchy {
        return Err(unrecognised("adk_events takes part in inheritance or partitioning".into()));
    }
    if events.secured {
        return Err(unrecognised(
            "adk_events has row-level security; the partitioned parent would need its own policies".into(),
        ));
    }
    if events.referenced_by > 0 {
        return Err(unrecognised("other tables have foreign keys pointing at adk_events".into()));
    }
    for (name, type_name, parent_not_null) in EVENT_COLUMNS {
        let column =
            catalog.column(EVENTS, name).ok_or_else(|| unrecognised(format!("adk_events.{name} is missing")))?;
        if column.type_name != type_name {
            return Err(unrecognised(format!("adk_events.{name} is {}, expected {type_name}", column.type_name)));
        }
        if parent_not_null && !column.not_null {
            return Err(unrecognised(format!("adk_events.{name} must be NOT NULL")));
        }
    }
    if let Some(extra) = catalog
        .columns
        .iter()
        .filter(|c| c.table_name == EVENTS)
        .find(|c| c.name != SESSION_DAY && !EVENT_COLUMNS.iter().any(|(name, _, _)| *name == c.name))
    {
        return Err(unrecognised(format!("adk_events has a column the partitioned parent lacks: {}", extra.name)));
    }
    for name in SESSION_COLUMNS {
        if catalog.column(SESSIONS, name).is_none() {
            return Err(unrecognised(format!("adk_sessions.{name} is missing")));
        }
    }
    let sessions_pkey = catalog.constraints.iter().find(|c| c.table_name == SESSIONS && c.kind == "p");
    if !sessions_pkey.is_some_and(|c| columns_are(&c.columns, &KEY[..3])) {
        return Err(unrecognised("adk_sessions' primary key is not (app_name, user_id, session_id)".into()));
    }
    let today = partition_name(cutover);
    for taken in [LEGACY_PARTITION, today.as_str()] {
        if catalog.relation(taken).is_some() {
            return Err(unrecognised(format!("{taken} already exists")));
        }
    }
    Ok(())
}

/// The date of a constant default such as `'2026-11-04'::date`.
fn constant_day(default_expr: Option<&str>) -> Option<NaiveDate> {
    let inner = default_expr?.strip_prefix('\'')?.strip_suffix("'::date")?;
    NaiveDate::parse_from_str(inner, "%Y-%m-%d").ok()
}

/// `pg_get_constraintdef` of a constraint that is not validated yet ends in
/// ` NOT VALID`; compare definitions without it.
fn without_not_valid(definition: &str) -> &str {
    definition.strip_suffix(" NOT VALID").unwrap_or(definition)
}

fn plan_before_swap(catalog: &Catalog, cutover: NaiveDate, steps: &mut Vec<ConvertStep>) -> Result<(), OpsError> {
    recognise(catalog, cutover)?;
    let legacy_day = cutover
        .pred_opt()
        .ok_or_else(|| OpsError::InvalidInput { field: "cutover", reason: "has no day before it".into() })?;
    let (events, sessions) = (quote_ident(EVENTS), quote_ident(SESSIONS));
    let day = quote_ident(SESSION_DAY);

    // [1] session_day on both tables.
    match (catalog.column(SESSIONS, SESSION_DAY), catalog.column(EVENTS, SESSION_DAY)) {
        (None, None) => {
            let add = |table: &str| {
                format!(
                    "ALTER TABLE {table} ADD COLUMN {day} date NOT NULL DEFAULT {}",
                    quote_literal(&legacy_day.to_string())
                )
            };
            // Sessions first, the order appends lock in; one transaction so
            // both tables get the same legacy day.
            steps.push(ConvertStep::new(
                StepKind::AddSessionDay,
                vec![Action::Ddl(format!("{}; {}", add(&sessions), add(&events)))],
            ));
        }
        (Some(s), Some(e)) => {
            for column in [s, e] {
                if column.type_name != "date" || !column.not_null {
                    return Err(unrecognised(format!("{}.session_day is not date NOT NULL", column.table_name)));
                }
                if let Some(earlier) = constant_day(column.default_expr.as_deref())
                    && earlier >= cutover
                {
                    return Err(OpsError::Conflict(format!(
                        "an earlier run gave the legacy rows the day {earlier}, which is not before the cutover \
                         {cutover}; rerun with the cutover that run used ({})",
                        earlier.succ_opt().unwrap_or(earlier)
                    )));
                }
            }
        }
        (Some(_), None) => {
            return Err(unrecognised("adk_sessions has session_day but adk_events does not".into()));
        }
        (None, Some(_)) => {
            return Err(unrecognised("adk_events has session_day but adk_sessions does not".into()));
        }
    }

    // [3] Indexes and constraints, built with weak locks before the swap.
    let events_key: Vec<&str> = KEY.iter().copied().chain(["seq"]).collect();
    let events_id_key: Vec<&str> = KEY.iter().copied().chain(["event_id"]).collect();
    steps.extend(index_step(catalog, StepKind::SessionsKeyDayIndex, SESSIONS, SESSIONS_KEY_DAY, true, &KEY)?);
    match catalog.constraint(SESSIONS, SESSIONS_KEY_DAY) {
        Some(c) if c.kind == "u" && columns_are(&c.columns, &KEY) => {}
        Some(c) => return Err(unrecognised(format!("constraint {} exists as {}", c.name, c.definition))),
        None => steps.push(ConvertStep::new(
            StepKind::SessionsKeyDayConstraint,
            vec![Action::Ddl(format!(
                "ALTER TABLE {sessions} ADD CONSTRAINT {key} UNIQUE USING INDEX {key}",
                key = quote_ident(SESSIONS_KEY_DAY)
            ))],
        )),
    }
    steps.extend(index_step(catalog, StepKind::SessionsDayIndex, SESSIONS, SESSIONS_DAY, false, &[SESSION_DAY])?);
    steps.extend(index_step(catalog, StepKind::EventsKeyIndex, EVENTS, LEGACY_PKEY, true, &events_key)?);
    steps.extend(index_step(catalog, StepKind::EventsEventIdIndex, EVENTS, LEGACY_EVENT_ID_KEY, true, &events_id_key)?);

    let cutover_literal = quote_literal(&cutover.to_string());
    let checks = [
        (
            LEGACY_RANGE,
            // An explicit date comparison: the attach proves the partition
            // bound from exactly this shape.
            format!("{day} < {cutover_literal}::date"),
            format!("CHECK ((session_day < '{cutover}'::date))"),
        ),
        (SEQ_POSITIVE, "seq > 0".to_owned(), "CHECK ((seq > 0))".to_owned()),
        (
            PAYLOAD_IS_OBJECT,
            "jsonb_typeof(payload) = 'object'".to_owned(),
            "CHECK ((jsonb_typeof(payload) = 'object'::text))".to_owned(),
        ),
    ];
    let mut actions = Vec::new();
    for (name, expression, expected) in checks {
        let validate = Action::Validate(format!("ALTER TABLE {events} VALIDATE CONSTRAINT {}", quote_ident(name)));
        match catalog.constraint(EVENTS, name) {
            None => {
                actions.push(Action::Ddl(format!(
                    "ALTER TABLE {events} ADD CONSTRAINT {} CHECK ({expression}) NOT VALID",
                    quote_ident(name)
                )));
                actions.push(validate);
            }
            Some(c) if c.kind == "c" && without_not_valid(&c.definition) == expected => {
                if !c.validated {
                    actions.push(validate);
                }
            }
            Some(c) if name == LEGACY_RANGE => {
                return Err(OpsError::Conflict(format!(
                    "an earlier run started this conversion with another cutover ({}); rerun with that cutover",
                    c.definition
                )));
            }
            Some(c) => {
                return Err(unrecognised(format!(
                    "adk_events has {} as {}, expected {expected}",
                    c.name, c.definition
                )));
            }
        }
    }
    if !actions.is_empty() {
        steps.push(ConvertStep::new(StepKind::EventsChecks, actions));
    }

    let key_list = KEY.map(quote_ident).join(", ");
    let fkey_expected = "FOREIGN KEY (app_name, user_id, session_id, session_day) REFERENCES \
                         adk_sessions(app_name, user_id, session_id, session_day) ON DELETE CASCADE";
    let validate_fkey =
        Action::Validate(format!("ALTER TABLE {events} VALIDATE CONSTRAINT {}", quote_ident(LEGACY_FKEY)));
    match catalog.constraint(EVENTS, LEGACY_FKEY) {
        None => steps.push(ConvertStep::new(
            StepKind::EventsForeignKey,
            vec![
                Action::Ddl(format!(
                    "ALTER TABLE {events} ADD CONSTRAINT {} FOREIGN KEY ({key_list}) \
                     REFERENCES {sessions} ({key_list}) ON DELETE CASCADE NOT VALID",
                    quote_ident(LEGACY_FKEY)
                )),
                validate_fkey,
            ],
        )),
        Some(c) if c.kind == "f" && without_not_valid(&c.definition) == fkey_expected => {
            if !c.validated {
                steps.push(ConvertStep::new(StepKind::EventsForeignKey, vec![validate_fkey]));
            }
        }
        Some(c) => return Err(unrecognised(format!("adk_events has {} as {}", c.name, c.definition))),
    }

    // [4] The swap.
    steps.push(ConvertStep::new(StepKind::Swap, swap_actions(catalog, cutover)?));
    Ok(())
}

/// The step that builds index `name` concurrently, unless a valid one with
/// that definition exists. An INVALID one (an interrupted build) is dropped
/// and rebuilt; a valid one with another definition is refused.
fn index_step(
    catalog: &Catalog,
    kind: StepKind,
    table: &str,
    name: &str,
    unique: bool,
    columns: &[&str],
) -> Result<Option<ConvertStep>, OpsError> {
    let create = format!(
        "CREATE {}INDEX CONCURRENTLY {} ON {} ({})",
        if unique { "UNIQUE " } else { "" },
        quote_ident(name),
        quote_ident(table),
        columns.iter().map(|c| quote_ident(c)).collect::<Vec<_>>().join(", ")
    );
    let drop = match catalog.index(name) {
        Some(index) if index.valid => {
            if index.table_name != table
                || index.is_unique != unique
                || !index.plain
                || !columns_are(&index.columns, columns)
            {
                return Err(unrecognised(format!(
                    "index {name} exists with another definition (on {}, columns {:?})",
                    index.table_name, index.columns
                )));
            }
            return Ok(None);
        }
        Some(_) => Some(format!("DROP INDEX CONCURRENTLY IF EXISTS {}", quote_ident(name))),
        None if catalog.relation(name).is_some() => {
            return Err(unrecognised(format!("{name} exists and is not an index")));
        }
        None => None,
    };
    Ok(Some(ConvertStep::new(kind, vec![Action::BuildIndex { index: name.to_owned(), drop, create }])))
}

/// `CREATE TABLE adk_events (…) PARTITION BY RANGE (session_day);` exactly
/// as migration 000001 has it.
fn parent_ddl() -> Result<&'static str, OpsError> {
    let missing = || OpsError::Conflict("migration 000001 has no CREATE TABLE adk_events statement".into());
    let start = CREATE_STORE_SQL.find("CREATE TABLE adk_events (").ok_or_else(missing)?;
    let rest = &CREATE_STORE_SQL[start..];
    let end = rest.find(';').ok_or_else(missing)?;
    Ok(&rest[..end])
}

/// A literal that casts to the relation `name` in the pinned schema.
fn regclass(name: &str) -> String {
    format!("{}::regclass", quote_literal(&quote_ident(name)))
}

const PRIVILEGES: [&str; 7] = ["SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER"];

fn swap_actions(catalog: &Catalog, cutover: NaiveDate) -> Result<Vec<Action>, OpsError> {
    let events = catalog.relation(EVENTS).ok_or_else(|| unrecognised("adk_events is missing".into()))?;
    let (parent, legacy, sessions) = (quote_ident(EVENTS), quote_ident(LEGACY_PARTITION), quote_ident(SESSIONS));
    let next = cutover
        .succ_opt()
        .ok_or_else(|| OpsError::InvalidInput { field: "cutover", reason: "has no day after it".into() })?;

    // The old key, event-id and foreign-key constraints (whatever they are
    // called): without session_day they cannot exist on a partition of the
    // new parent, and the names may be the ones the parent is about to use.
    let old: Vec<&ConstraintRow> = catalog
        .constraints
        .iter()
        .filter(|c| c.table_name == EVENTS && matches!(c.kind.as_str(), "p" | "u" | "f"))
        .filter(|c| !c.columns.iter().any(|col| col == SESSION_DAY))
        .collect();
    for taken in [PARENT_PKEY, PARENT_EVENT_ID_KEY] {
        let freed = old.iter().any(|c| c.kind != "f" && c.name == taken);
        if catalog.relation(taken).is_some() && !freed {
            return Err(unrecognised(format!("{taken}, a name the partitioned parent needs, is taken")));
        }
    }

    let mut sql = vec![
        // Sessions first: appends lock the session row and then write the
        // event, so taking the locks in the other order could deadlock.
        // ACCESS EXCLUSIVE on adk_sessions is what dropping the old foreign
        // key takes anyway; everything below is catalog work.
        format!("LOCK TABLE {sessions}, {parent} IN ACCESS EXCLUSIVE MODE"),
        format!("ALTER TABLE {parent} RENAME TO {legacy}"),
    ];
    if !old.is_empty() {
        let drops: Vec<String> = old.iter().map(|c| format!("DROP CONSTRAINT {}", quote_ident(&c.name))).collect();
        sql.push(format!("ALTER TABLE {legacy} {}", drops.join(", ")));
    }
    sql.push(format!(
        "ALTER TABLE {legacy} ADD CONSTRAINT {pkey} PRIMARY KEY USING INDEX {pkey}, \
         ADD CONSTRAINT {idkey} UNIQUE USING INDEX {idkey}, ALTER COLUMN {day} DROP DEFAULT",
        pkey = quote_ident(LEGACY_PKEY),
        idkey = quote_ident(LEGACY_EVENT_ID_KEY),
        day = quote_ident(SESSION_DAY),
    ));
    sql.push(parent_ddl()?.to_owned());
    // The service's privileges were granted on the old table; the parent
    // is what it queries from now on.
    for grant in &catalog.grants {
        let privilege = PRIVILEGES
            .iter()
            .find(|p| **p == grant.privilege)
            .ok_or_else(|| unrecognised(format!("unknown privilege {} on adk_events", grant.privilege)))?;
        let grantee = grant.grantee.as_deref().map_or_else(|| "PUBLIC".to_owned(), quote_ident);
        let option = if grant.grantable { " WITH GRANT OPTION" } else { "" };
        sql.push(format!("GRANT {privilege} ON {parent} TO {grantee}{option}"));
        // Access goes through the parent (and its row-level security), as
        // for every other partition: none keeps privileges of its own.
        sql.push(format!("REVOKE {privilege} ON {legacy} FROM {grantee}"));
    }
    sql.push(format!(
        "ALTER TABLE {parent} ATTACH PARTITION {legacy} FOR VALUES FROM (MINVALUE) TO ({})",
        quote_literal(&cutover.to_string())
    ));
    let first_day = quote_ident(&partition_name(cutover));
    sql.push(format!(
        "CREATE TABLE {first_day} PARTITION OF {parent} FOR VALUES FROM ({}) TO ({})",
        quote_literal(&cutover.to_string()),
        quote_literal(&next.to_string())
    ));
    // Last, because attaching needs the running role to own the parent.
    if events.owner != catalog.current_user {
        for table in [&parent, &first_day] {
            sql.push(format!("ALTER TABLE {table} OWNER TO {}", quote_ident(&events.owner)));
        }
    }
    // Checked before commit: the attach must have adopted the indexes and
    // the foreign key built in step 3 (anything else would have been built
    // or checked under this lock) and left the parent fully valid.
    sql.push(format!(
        "DO $verify$
DECLARE
    problem text;
BEGIN
    SELECT string_agg(x.indexrelid::regclass::text, ', ') INTO problem
      FROM pg_index x WHERE x.indrelid = {parent_oid} AND NOT x.indisvalid;
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'invalid index on adk_events after the attach: %', problem;
    END IF;
    SELECT string_agg(c.conname::text, ', ') INTO problem
      FROM pg_constraint c WHERE c.conrelid IN ({parent_oid}, {legacy_oid}) AND NOT c.convalidated;
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'constraint not validated after the attach: %', problem;
    END IF;
    IF (SELECT count(*) FROM pg_inherits h WHERE h.inhrelid IN ({pkey_oid}, {idkey_oid})) <> 2
       OR (SELECT count(*) FROM pg_index x WHERE x.indrelid = {legacy_oid}
             AND EXISTS (SELECT 1 FROM pg_inherits h WHERE h.inhrelid = x.indexrelid)) <> 2 THEN
        RAISE EXCEPTION 'the attach did not adopt the prebuilt indexes';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conrelid = {legacy_oid}
                     AND c.conname = {fkey_name} AND c.conparentid <> 0) THEN
        RAISE EXCEPTION 'the attach did not adopt the validated foreign key';
    END IF;
END
$verify$",
        parent_oid = regclass(EVENTS),
        legacy_oid = regclass(LEGACY_PARTITION),
        pkey_oid = regclass(LEGACY_PKEY),
        idkey_oid = regclass(LEGACY_EVENT_ID_KEY),
        fkey_name = quote_literal(LEGACY_FKEY),
    ));
    Ok(vec![
        Action::Swap(sql.join(";\n")),
        // Autovacuum never analyzes a partitioned parent; plans over the
        // whole log need its statistics. Outside the transaction: it reads.
        Action::Ddl(format!("ANALYZE {parent}")),
    ])
}

fn plan_after_swap(catalog: &Catalog, unpartitioned: bool, steps: &mut Vec<ConvertStep>) -> Result<(), OpsError> {
    // [5] New sessions get today's day. Before the swap this is always
    // still to do; after it, the default says whether it was done.
    let default_done = !unpartitioned
        && catalog
            .column(SESSIONS, SESSION_DAY)
            .ok_or_else(|| unrecognised("adk_events is partitioned but adk_sessions has no session_day".into()))?
            .default_expr
            .as_deref()
            .is_some_and(|d| d.contains("now()"));
    if !default_done {
        steps.push(ConvertStep::new(
            StepKind::SessionsDefault,
            vec![Action::Ddl(format!(
                "ALTER TABLE {} ALTER COLUMN {} SET DEFAULT {SESSION_DAY_DEFAULT}",
                quote_ident(SESSIONS),
                quote_ident(SESSION_DAY)
            ))],
        ));
    }

    // Diesel's bookkeeping: 000001 is what the conversion did.
    let mut recorded = catalog.migrations.clone().unwrap_or_default();
    if !recorded.contains(BASELINE_VERSION) {
        steps.push(ConvertStep::new(
            StepKind::RecordBaseline,
            vec![Action::RecordBaseline {
                create: format!(
                    "CREATE TABLE IF NOT EXISTS {} (version VARCHAR(50) PRIMARY KEY NOT NULL, \
                     run_on TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP)",
                    quote_ident(MIGRATIONS_TABLE)
                ),
            }],
        ));
        recorded.insert(BASELINE_VERSION.to_owned());
    }
    let pending: Vec<String> = embedded_versions()?.into_iter().filter(|v| !recorded.contains(v)).collect();
    if !pending.is_empty() {
        steps.push(ConvertStep::new(StepKind::ApplyMigrations, vec![Action::ApplyMigrations { pending }]));
    }
    Ok(())
}

/// Versions of the migrations compiled into this binary, oldest first.
fn embedded_versions() -> Result<Vec<String>, OpsError> {
    let migrations = MigrationSource::<Pg>::migrations(&MIGRATIONS)
        .map_err(|e| OpsError::NotMigrated(format!("reading the embedded migrations: {e}")))?;
    let mut versions: Vec<String> = migrations.iter().map(|m| m.name().version().to_string()).collect();
    versions.sort();
    Ok(versions)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parent_ddl_is_migration_000001s() {
        let ddl = parent_ddl().expect("found");
        assert!(ddl.starts_with("CREATE TABLE adk_events ("));
        assert!(ddl.ends_with("PARTITION BY RANGE (session_day)"), "{ddl}");
        for name in [PARENT_PKEY, PARENT_EVENT_ID_KEY, "adk_events_session_fkey", SEQ_POSITIVE, PAYLOAD_IS_OBJECT] {
            assert!(ddl.contains(&format!("CONSTRAINT {name} ")), "{name}");
        }
        assert!(ddl.contains("CHECK (seq > 0)") && ddl.contains("CHECK (jsonb_typeof(payload) = 'object')"));
        assert!(CREATE_STORE_SQL.contains(&format!("DEFAULT {SESSION_DAY_DEFAULT}")));
    }

    #[test]
    fn the_baseline_is_the_first_migration() {
        let versions = embedded_versions().expect("embedded");
        // Spelled out: diesel's QueryDsl::first would shadow the slice method.
        assert_eq!(<[String]>::first(&versions).map(String::as_str), Some(BASELINE_VERSION));
    }

    #[test]
    fn steps_are_numbered_in_order() {
        for (i, kind) in StepKind::ALL.iter().enumerate() {
            assert_eq!(kind.number(), i + 1);
        }
    }

    #[test]
    fn reads_constant_defaults() {
        let day = NaiveDate::from_ymd_opt(2026, 11, 4);
        assert_eq!(constant_day(Some("'2026-11-04'::date")), day);
        assert_eq!(constant_day(Some("((now() AT TIME ZONE 'UTC'::text))::date")), None);
        assert_eq!(constant_day(None), None);
        assert_eq!(without_not_valid("CHECK ((seq > 0)) NOT VALID"), "CHECK ((seq > 0))");
    }
}
