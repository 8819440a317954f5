//! Building an index on the partitioned event log without blocking writes.
//!
//! `CREATE INDEX CONCURRENTLY` is not supported on a partitioned table, and a
//! plain `CREATE INDEX` on `adk_events` would hold a `SHARE` lock on every
//! partition (no appends) for the whole build. The workaround PostgreSQL
//! documents, done here:
//!
//! 1. `CREATE INDEX … ON ONLY adk_events (…)`: catalog only, on the parent
//!    alone. With partitions present the new parent index is *invalid*.
//! 2. For every partition: `CREATE INDEX CONCURRENTLY` a matching index on
//!    the partition (appends carry on), then `ALTER INDEX <parent> ATTACH
//!    PARTITION <child>`.
//! 3. When the last partition's index is attached PostgreSQL marks the
//!    parent index valid; from then on every partition created later (by
//!    maintenance or `adk_ensure_event_partition`) gets the index
//!    automatically.
//!
//! Every step is looked up in the catalog first, so a run interrupted at any
//! point (including a `CREATE INDEX CONCURRENTLY` killed half-way, which
//! leaves an INVALID index behind) is finished by running it again, and a run
//! on a finished index changes nothing. The build of each partition's index
//! is watched from a second connection through
//! `pg_stat_progress_create_index`.

use std::time::{Duration, Instant};

use diesel::QueryableByName;
use diesel::sql_types::{Array, BigInt, Bool, Integer, Nullable, Text};
use diesel_async::{AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use serde::Serialize;

use crate::error::OpsError;
use crate::sql::{LockPolicy, LockRetry, connect, ddl, events_schema, first_row, quote_ident};

/// Key of the advisory lock that keeps two index builds apart: both would
/// otherwise take each other's half-built index for a leftover and drop it.
pub const INDEX_BUILD_LOCK_KEY: i64 = adk_postgres_schema::names::lock_keys::INDEX_BUILD;

/// PostgreSQL truncates identifiers longer than this (NAMEDATALEN - 1).
const MAX_IDENTIFIER_BYTES: usize = 63;
/// An index has at most this many columns (INDEX_MAX_KEYS).
const MAX_INDEX_COLUMNS: usize = 32;
/// How often a running build or validation is looked at.
pub(crate) const POLL_INTERVAL: Duration = Duration::from_millis(200);

/// Options of [`create_partitioned_index_with`].
#[derive(Debug, Clone, Default)]
pub struct IndexOptions {
    /// Stop after building this many partition indexes (a deliberate
    /// interruption; the next run carries on). `None` builds them all.
    pub stop_after_partitions: Option<usize>,
}

/// A snapshot of `pg_stat_progress_create_index` for one build.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BuildProgress {
    /// e.g. `building index: scanning table`, `waiting for old snapshots`.
    pub phase: String,
    pub blocks_done: i64,
    pub blocks_total: i64,
    pub tuples_done: i64,
    pub tuples_total: i64,
}

/// What [`create_partitioned_index`] is doing, as it happens.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum IndexProgress {
    Started {
        index: String,
        partitions: usize,
    },
    /// The (invalid until complete) index on the parent alone was created.
    ParentCreated {
        index: String,
    },
    /// The partition already has its index attached.
    PartitionSkipped {
        partition: String,
        child_index: String,
    },
    /// An INVALID leftover of an interrupted build was dropped.
    DroppedInvalid {
        child_index: String,
    },
    /// A concurrent build is running; sampled every ~200 ms.
    Building {
        partition: String,
        child_index: String,
        progress: BuildProgress,
    },
    /// The partition's index is built (or was found built) and attached.
    Attached {
        partition: String,
        child_index: String,
        elapsed_ms: u64,
    },
    Finished {
        index: String,
        valid: bool,
    },
}

/// What one run did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct IndexReport {
    pub index: String,
    pub columns: Vec<String>,
    /// The parent index was created by this run.
    pub parent_created: bool,
    /// Partitions seen.
    pub partitions: usize,
    /// Partitions whose index this run built concurrently and attached.
    pub built: Vec<String>,
    /// Partitions whose index existed, valid but unattached, and was attached.
    pub attached_existing: Vec<String>,
    /// Partitions that already had their index attached.
    pub skipped: Vec<String>,
    /// INVALID leftovers of interrupted builds that were dropped.
    pub dropped_invalid: Vec<String>,
    /// The parent index is valid: every partition has it, and partitions
    /// created from now on get it automatically.
    pub parent_valid: bool,
    /// The run stopped early because of `stop_after_partitions`.
    pub stopped_early: bool,
    pub elapsed_ms: u64,
}

/// Builds index `name` on `adk_events (columns…)` partition by partition
/// with `CREATE INDEX CONCURRENTLY`, so appends never wait for the build.
/// Resumable and idempotent.
pub async fn create_partitioned_index(
    database_url: &str,
    name: &str,
    columns: &[&str],
    policy: &LockPolicy,
    progress: &mut dyn FnMut(IndexProgress),
) -> Result<IndexReport, OpsError> {
    create_partitioned_index_with(database_url, name, columns, policy, &IndexOptions::default(), progress).await
}

/// [`create_partitioned_index`] with options.
pub async fn create_partitioned_index_with(
    database_url: &str,
    name: &str,
    columns: &[&str],
    policy: &LockPolicy,
    options: &IndexOptions,
    progress: &mut dyn FnMut(IndexProgress),
) -> Result<IndexReport, OpsError> {
    validate_identifier("name", name)?;
    if columns.is_empty() || columns.len() > MAX_INDEX_COLUMNS {
        return Err(OpsError::InvalidInput {
            field: "columns",
            reason: format!("between 1 and {MAX_INDEX_COLUMNS} columns, got {}", columns.len()),
        });
    }
    for (i, column) in columns.iter().enumerate() {
        validate_identifier("columns", column)?;
        if columns[..i].contains(column) {
            return Err(OpsError::InvalidInput { field: "columns", reason: format!("{column} is listed twice") });
        }
    }

    let started = Instant::now();
    let mut conn = connect(database_url, "adk-pg index", policy).await?;
    let schema = events_schema(&mut conn).await?;
    let parent_kind = relation_kind(&mut conn, &schema, "adk_events").await?;
    if parent_kind.as_deref() != Some("p") {
        return Err(OpsError::Conflict(
            "adk_events is not partitioned; build the index with CREATE INDEX CONCURRENTLY instead".into(),
        ));
    }
    let existing_columns = table_columns(&mut conn, &schema, "adk_events").await?;
    if let Some(missing) = columns.iter().find(|c| !existing_columns.iter().any(|e| e == *c)) {
        return Err(OpsError::InvalidInput { field: "columns", reason: format!("adk_events has no column {missing}") });
    }

    let locked = try_advisory_lock(&mut conn, INDEX_BUILD_LOCK_KEY).await?;
    if !locked {
        return Err(OpsError::Conflict("another index build is running on this database".into()));
    }
    let mut report = IndexReport {
        index: name.to_owned(),
        columns: columns.iter().map(|c| (*c).to_owned()).collect(),
        ..IndexReport::default()
    };
    let outcome =
        build_locked(&mut conn, database_url, &schema, name, columns, policy, options, progress, &mut report).await;
    // Session-scoped: release even on failure so the next run need not wait
    // for this connection to close.
    let _ = conn.batch_execute(&format!("SELECT pg_advisory_unlock({INDEX_BUILD_LOCK_KEY})")).await;
    outcome?;
    report.elapsed_ms = millis(started.elapsed());
    progress(IndexProgress::Finished { index: name.to_owned(), valid: report.parent_valid });
    Ok(report)
}

#[allow(clippy::too_many_arguments)]
async fn build_locked(
    conn: &mut AsyncPgConnection,
    database_url: &str,
    schema: &str,
    name: &str,
    columns: &[&str],
    policy: &LockPolicy,
    options: &IndexOptions,
    progress: &mut dyn FnMut(IndexProgress),
    report: &mut IndexReport,
) -> Result<(), OpsError> {
    let column_list = columns.iter().map(|c| quote_ident(c)).collect::<Vec<_>>().join(", ");
    let qualified = |relation: &str| format!("{}.{}", quote_ident(schema), quote_ident(relation));
    let wanted: Vec<String> = columns.iter().map(|c| (*c).to_owned()).collect();

    // 1. The parent index, on the parent only. Quick (no data is read), but
    //    it takes a SHARE lock on the parent, so it runs under lock_timeout.
    match index_info(conn, schema, name).await? {
        Some(info) => check_definition(&info, "adk_events", &wanted)?,
        None => {
            if relation_kind(conn, schema, name).await?.is_some() {
                return Err(OpsError::Conflict(format!("{name} already exists and is not an index")));
            }
            ddl(
                conn,
                &format!(
                    "CREATE INDEX IF NOT EXISTS {} ON ONLY {} ({column_list})",
                    quote_ident(name),
                    qualified("adk_events")
                ),
                policy,
            )
            .await?;
            report.parent_created = true;
            progress(IndexProgress::ParentCreated { index: name.to_owned() });
            // A racing creator could have used the name for something else.
            let info = index_info(conn, schema, name)
                .await?
                .ok_or_else(|| OpsError::Conflict(format!("index {name} vanished right after it was created")))?;
            check_definition(&info, "adk_events", &wanted)?;
        }
    }

    let mut watcher = Watcher::open(database_url, "adk-pg index (progress)", policy).await;
    let pid = backend_pid(conn).await?;
    let mut announced = false;
    let mut built_this_run = 0usize;
    // Partitions made while this runs (maintenance premaking) get a clone
    // of the parent index from PostgreSQL itself; a second pass only has to
    // confirm that. Three passes are plenty; the loop never spins.
    for _pass in 0..3 {
        let partitions = list_partition_indexes(conn, schema, name).await?;
        if !announced {
            report.partitions = partitions.len();
            progress(IndexProgress::Started { index: name.to_owned(), partitions: partitions.len() });
            announced = true;
        }
        if let Some(pending) = partitions.iter().find(|p| p.detach_pending) {
            return Err(OpsError::Conflict(format!(
                "partition {} is half-detached; run maintenance (it finalizes the detach) and retry",
                pending.name
            )));
        }
        if let Some(nested) = partitions.iter().find(|p| p.kind != "r") {
            return Err(OpsError::Conflict(format!("partition {} is not a plain table", nested.name)));
        }
        let todo: Vec<&PartitionIndexRow> = partitions.iter().filter(|p| p.attached_index.is_none()).collect();
        for partition in partitions.iter().filter(|p| p.attached_index.is_some()) {
            let seen = [&report.skipped, &report.built, &report.attached_existing];
            if !seen.iter().any(|names| names.contains(&partition.name)) {
                report.skipped.push(partition.name.clone());
                progress(IndexProgress::PartitionSkipped {
                    partition: partition.name.clone(),
                    child_index: partition.attached_index.clone().unwrap_or_default(),
                });
            }
        }
        if todo.is_empty() {
            break;
        }
        for partition in todo {
            if options.stop_after_partitions.is_some_and(|limit| built_this_run >= limit) {
                report.stopped_early = true;
                report.parent_valid = parent_valid(conn, schema, name).await?;
                return Ok(());
            }
            let part_started = Instant::now();
            let child = child_index_name(name, &partition.name);
            let qualified_child = format!("{}.{}", quote_ident(&partition.schema), quote_ident(&child));
            let existing = index_info(conn, &partition.schema, &child).await?;
            let mut adopted = false;
            if let Some(info) = &existing
                && info.valid
            {
                // A valid index under our name that is not attached: an
                // earlier run built it and stopped before the attach.
                check_definition(info, &partition.name, &wanted)?;
                adopted = true;
            } else {
                // The index lands in its table's schema; its name takes none.
                let create = format!(
                    "CREATE INDEX CONCURRENTLY {} ON {}.{} ({column_list})",
                    quote_ident(&child),
                    quote_ident(&partition.schema),
                    quote_ident(&partition.name)
                );
                let outcome = build_index_concurrently(
                    conn,
                    pid,
                    &mut watcher,
                    &partition.schema,
                    &child,
                    &create,
                    policy,
                    &mut |p| {
                        progress(IndexProgress::Building {
                            partition: partition.name.clone(),
                            child_index: child.clone(),
                            progress: p,
                        })
                    },
                )
                .await;
                let outcome = match outcome {
                    Ok(outcome) => outcome,
                    // Maintenance may have dropped the partition meanwhile;
                    // then there is nothing to index.
                    Err(e) if relation_kind(conn, &partition.schema, &partition.name).await?.is_none() => {
                        tracing::info!(partition = %partition.name, error = %e, "partition vanished during the build");
                        continue;
                    }
                    Err(e) => return Err(e),
                };
                if outcome.dropped_invalid {
                    report.dropped_invalid.push(child.clone());
                    progress(IndexProgress::DroppedInvalid { child_index: child.clone() });
                }
            }
            ddl(conn, &format!("ALTER INDEX {} ATTACH PARTITION {qualified_child}", qualified(name)), policy).await?;
            if adopted {
                report.attached_existing.push(partition.name.clone());
            } else {
                report.built.push(partition.name.clone());
                built_this_run += 1;
            }
            progress(IndexProgress::Attached {
                partition: partition.name.clone(),
                child_index: child,
                elapsed_ms: millis(part_started.elapsed()),
            });
        }
    }

    report.parent_valid = parent_valid(conn, schema, name).await?;
    if !report.parent_valid {
        return Err(OpsError::Conflict(format!(
            "every partition has index {name} attached but the parent index is still invalid; \
             check pg_inherits for partitions added or removed during the build and rerun"
        )));
    }
    Ok(())
}

/// Accepts `[A-Za-z_][A-Za-z0-9_]*` of at most 63 bytes: what PostgreSQL
/// keeps without truncating and what needs no thought when quoted.
fn validate_identifier(field: &'static str, value: &str) -> Result<(), OpsError> {
    let invalid = |reason: String| Err(OpsError::InvalidInput { field, reason });
    if value.is_empty() {
        return invalid("must not be empty".into());
    }
    if value.len() > MAX_IDENTIFIER_BYTES {
        return invalid(format!("{value:?} is longer than {MAX_IDENTIFIER_BYTES} bytes"));
    }
    let mut chars = value.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if !first_ok || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return invalid(format!("{value:?} is not an identifier (letters, digits and _, not starting with a digit)"));
    }
    Ok(())
}

/// The name of the index on one partition: `<index>_<partition suffix>`,
/// the suffix being the partition name without `adk_events_` (`p20261105`,
/// `legacy`). Past 63 bytes the index part is cut and a hash of the full
/// name keeps it unique.
pub fn child_index_name(index: &str, partition: &str) -> String {
    let suffix = partition.strip_prefix("adk_events_").unwrap_or(partition);
    let plain = format!("{index}_{suffix}");
    if plain.len() <= MAX_IDENTIFIER_BYTES {
        return plain;
    }
    let hash = fnv1a(plain.as_bytes());
    // <index prefix>_<hash>_<suffix> keeps the partition readable; a suffix
    // too long for that leaves <index prefix>_<longer hash>.
    let tail =
        if suffix.len() <= 30 { format!("_{:08x}_{suffix}", hash & 0xffff_ffff) } else { format!("_{hash:016x}") };
    let keep = MAX_IDENTIFIER_BYTES.saturating_sub(tail.len());
    format!("{}{tail}", truncate_to_boundary(index, keep))
}

fn truncate_to_boundary(text: &str, max_bytes: usize) -> &str {
    if text.len() <= max_bytes {
        return text;
    }
    let mut end = max_bytes;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325_u64, |hash, b| (hash ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
}

pub(crate) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

fn check_definition(info: &IndexInfo, table: &str, columns: &[String]) -> Result<(), OpsError> {
    if info.table_name != table || info.is_unique || !info.plain || info.columns != columns {
        return Err(OpsError::Conflict(format!(
            "index {} already exists with another definition (on {}, columns {:?}, unique: {}); \
             drop it or pick another name",
            info.name, info.table_name, info.columns, info.is_unique
        )));
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Catalog lookups shared with the conversion.
// ---------------------------------------------------------------------------

/// One index as the catalog describes it.
#[derive(Debug, Clone, QueryableByName)]
pub(crate) struct IndexInfo {
    #[diesel(sql_type = Text)]
    pub name: String,
    #[diesel(sql_type = Text)]
    pub table_name: String,
    #[diesel(sql_type = Bool)]
    pub valid: bool,
    #[diesel(sql_type = Bool)]
    pub is_unique: bool,
    /// btree on plain columns: no expressions, no predicate, no INCLUDE.
    #[diesel(sql_type = Bool)]
    pub plain: bool,
    #[diesel(sql_type = Array<Text>)]
    pub columns: Vec<String>,
}

/// Indexes of one schema; callers add the rest of the WHERE clause.
pub(crate) const INDEX_INFO_SQL: &str = "\
SELECT i.relname::text AS name, t.relname::text AS table_name, x.indisvalid AS valid,
       x.indisunique AS is_unique,
       (am.amname = 'btree' AND x.indexprs IS NULL AND x.indpred IS NULL AND x.indnkeyatts = x.indnatts) AS plain,
       ARRAY(SELECT a.attname::text
             FROM unnest(x.indkey::int2[]) WITH ORDINALITY k(attnum, ord)
             JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = k.attnum
             ORDER BY k.ord) AS columns
FROM pg_index x
JOIN pg_class i ON i.oid = x.indexrelid
JOIN pg_class t ON t.oid = x.indrelid
JOIN pg_namespace n ON n.oid = i.relnamespace
JOIN pg_am am ON am.oid = i.relam
WHERE n.nspname = $1";

/// The index `schema.name`, if there is one.
pub(crate) async fn index_info(
    conn: &mut AsyncPgConnection,
    schema: &str,
    name: &str,
) -> Result<Option<IndexInfo>, OpsError> {
    let mut rows = diesel::sql_query(format!("{INDEX_INFO_SQL} AND i.relname = $2"))
        .bind::<Text, _>(schema)
        .bind::<Text, _>(name)
        .load::<IndexInfo>(conn)
        .await
        .map_err(OpsError::query(format!("look up index {name}")))?;
    Ok(rows.pop())
}

#[derive(QueryableByName)]
struct KindRow {
    #[diesel(sql_type = Text)]
    kind: String,
}

/// `pg_class.relkind` of `schema.name`, `None` when there is no such relation.
pub(crate) async fn relation_kind(
    conn: &mut AsyncPgConnection,
    schema: &str,
    name: &str,
) -> Result<Option<String>, OpsError> {
    let mut rows = diesel::sql_query(
        "SELECT c.relkind::text AS kind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = $1 AND c.relname = $2",
    )
    .bind::<Text, _>(schema)
    .bind::<Text, _>(name)
    .load::<KindRow>(conn)
    .await
    .map_err(OpsError::query(format!("look up {name}")))?;
    Ok(rows.pop().map(|r| r.kind))
}

#[derive(QueryableByName)]
struct ColumnNameRow {
    #[diesel(sql_type = Text)]
    name: String,
}

async fn table_columns(conn: &mut AsyncPgConnection, schema: &str, table: &str) -> Result<Vec<String>, OpsError> {
    let rows = diesel::sql_query(
        "SELECT a.attname::text AS name FROM pg_attribute a
         JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = $1 AND c.relname = $2 AND a.attnum > 0 AND NOT a.attisdropped",
    )
    .bind::<Text, _>(schema)
    .bind::<Text, _>(table)
    .load::<ColumnNameRow>(conn)
    .await
    .map_err(OpsError::query(format!("list the columns of {table}")))?;
    Ok(rows.into_iter().map(|r| r.name).collect())
}

#[derive(QueryableByName)]
struct PartitionIndexRow {
    #[diesel(sql_type = Text)]
    schema: String,
    #[diesel(sql_type = Text)]
    name: String,
    #[diesel(sql_type = Text)]
    kind: String,
    #[diesel(sql_type = Bool)]
    detach_pending: bool,
    /// The partition's index attached to the parent index, if any.
    #[diesel(sql_type = Nullable<Text>)]
    attached_index: Option<String>,
}

async fn list_partition_indexes(
    conn: &mut AsyncPgConnection,
    schema: &str,
    index: &str,
) -> Result<Vec<PartitionIndexRow>, OpsError> {
    diesel::sql_query(
        "WITH parent AS (
             SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = $1 AND c.relname = 'adk_events'),
         parent_index AS (
             SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = $1 AND c.relname = $2)
         SELECT n.nspname::text AS schema, c.relname::text AS name, c.relkind::text AS kind,
                h.inhdetachpending AS detach_pending,
                (SELECT ci.relname::text FROM pg_inherits hi
                 JOIN pg_index x ON x.indexrelid = hi.inhrelid
                 JOIN pg_class ci ON ci.oid = x.indexrelid
                 WHERE hi.inhparent = (SELECT oid FROM parent_index) AND x.indrelid = c.oid) AS attached_index
         FROM pg_inherits h
         JOIN pg_class c ON c.oid = h.inhrelid
         JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE h.inhparent = (SELECT oid FROM parent)
         ORDER BY c.relname",
    )
    .bind::<Text, _>(schema)
    .bind::<Text, _>(index)
    .load::<PartitionIndexRow>(conn)
    .await
    .map_err(OpsError::query("list the partitions of adk_events and their indexes"))
}

#[derive(QueryableByName)]
struct ValidRow {
    #[diesel(sql_type = Bool)]
    valid: bool,
}

async fn parent_valid(conn: &mut AsyncPgConnection, schema: &str, index: &str) -> Result<bool, OpsError> {
    let rows = diesel::sql_query(
        "SELECT x.indisvalid AS valid FROM pg_index x JOIN pg_class c ON c.oid = x.indexrelid
         JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = $2",
    )
    .bind::<Text, _>(schema)
    .bind::<Text, _>(index)
    .load::<ValidRow>(conn)
    .await
    .map_err(OpsError::query(format!("check that index {index} is valid")))?;
    Ok(rows.iter().any(|r| r.valid))
}

#[derive(QueryableByName)]
struct LockedRow {
    #[diesel(sql_type = Bool)]
    locked: bool,
}

/// Takes a session-level advisory lock without waiting.
pub(crate) async fn try_advisory_lock(conn: &mut AsyncPgConnection, key: i64) -> Result<bool, OpsError> {
    Ok(diesel::sql_query("SELECT pg_try_advisory_lock($1) AS locked")
        .bind::<BigInt, _>(key)
        .load::<LockedRow>(conn)
        .await
        .and_then(first_row)
        .map_err(OpsError::query("take an advisory lock"))?
        .locked)
}

#[derive(QueryableByName)]
struct PidRow {
    #[diesel(sql_type = Integer)]
    pid: i32,
}

/// The server process of `conn`, as `pg_stat_*` views know it.
pub(crate) async fn backend_pid(conn: &mut AsyncPgConnection) -> Result<i32, OpsError> {
    Ok(diesel::sql_query("SELECT pg_backend_pid() AS pid")
        .load::<PidRow>(conn)
        .await
        .and_then(first_row)
        .map_err(OpsError::query("read the backend pid"))?
        .pid)
}

// ---------------------------------------------------------------------------
// Watching a long statement from a second connection.
// ---------------------------------------------------------------------------

/// What to sample while a statement runs.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Watch {
    /// `pg_stat_progress_create_index`.
    IndexBuild,
    /// `pg_stat_activity` (validation scans have no progress view).
    Activity,
}

/// One sample of a running statement.
#[derive(Debug, Clone)]
pub(crate) enum Observation {
    Index(BuildProgress),
    Activity { elapsed: Duration, wait_event: Option<String> },
}

/// A second connection that looks at the working one while it is busy. A
/// statement in flight keeps its own connection occupied, so progress can
/// only be read from another. Progress is a nicety: when the second
/// connection cannot be had or fails, the work carries on without it.
pub(crate) struct Watcher {
    conn: Option<AsyncPgConnection>,
}

impl std::fmt::Debug for Watcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watcher").field("connected", &self.conn.is_some()).finish()
    }
}

#[derive(QueryableByName)]
struct IndexProgressRow {
    #[diesel(sql_type = Text)]
    phase: String,
    #[diesel(sql_type = BigInt)]
    blocks_done: i64,
    #[diesel(sql_type = BigInt)]
    blocks_total: i64,
    #[diesel(sql_type = BigInt)]
    tuples_done: i64,
    #[diesel(sql_type = BigInt)]
    tuples_total: i64,
}

#[derive(QueryableByName)]
struct ActivityRow {
    #[diesel(sql_type = Nullable<Text>)]
    wait_event: Option<String>,
}

impl Watcher {
    pub(crate) async fn open(database_url: &str, application_name: &str, policy: &LockPolicy) -> Self {
        match connect(database_url, application_name, policy).await {
            Ok(conn) => Self { conn: Some(conn) },
            Err(error) => {
                tracing::warn!(%error, "no second connection for progress; continuing without progress");
                Self { conn: None }
            }
        }
    }

    async fn observe(&mut self, watch: Watch, pid: i32, started: Instant) -> Option<Observation> {
        let conn = self.conn.as_mut()?;
        let outcome = match watch {
            Watch::IndexBuild => diesel::sql_query(
                "SELECT phase, coalesce(blocks_done, 0) AS blocks_done, coalesce(blocks_total, 0) AS blocks_total,
                        coalesce(tuples_done, 0) AS tuples_done, coalesce(tuples_total, 0) AS tuples_total
                 FROM pg_stat_progress_create_index WHERE pid = $1",
            )
            .bind::<Integer, _>(pid)
            .load::<IndexProgressRow>(conn)
            .await
            .map(|rows| {
                rows.into_iter().next().map(|r| {
                    Observation::Index(BuildProgress {
                        phase: r.phase,
                        blocks_done: r.blocks_done,
                        blocks_total: r.blocks_total,
                        tuples_done: r.tuples_done,
                        tuples_total: r.tuples_total,
                    })
                })
            }),
            Watch::Activity => diesel::sql_query(
                "SELECT CASE WHEN wait_event IS NULL THEN NULL ELSE wait_event_type || ':' || wait_event END
                        AS wait_event
                 FROM pg_stat_activity WHERE pid = $1",
            )
            .bind::<Integer, _>(pid)
            .load::<ActivityRow>(conn)
            .await
            .map(|rows| {
                rows.into_iter()
                    .next()
                    .map(|r| Observation::Activity { elapsed: started.elapsed(), wait_event: r.wait_event })
            }),
        };
        match outcome {
            Ok(observation) => observation,
            Err(error) => {
                tracing::warn!(%error, "reading progress failed; continuing without progress");
                self.conn = None;
                None
            }
        }
    }
}

/// Runs `statement` on `conn` and, while it runs, samples it from the
/// watcher every [`POLL_INTERVAL`].
pub(crate) async fn run_watched(
    conn: &mut AsyncPgConnection,
    statement: &str,
    watcher: &mut Watcher,
    watch: Watch,
    pid: i32,
    on_observation: &mut dyn FnMut(Observation),
) -> diesel::QueryResult<()> {
    let started = Instant::now();
    let work = conn.batch_execute(statement);
    tokio::pin!(work);
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + POLL_INTERVAL, POLL_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            outcome = &mut work => return outcome,
            _ = ticker.tick() => {
                if let Some(observation) = watcher.observe(watch, pid, started).await {
                    on_observation(observation);
                }
            }
        }
    }
}

/// What [`build_index_concurrently`] had to do.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct BuildOutcome {
    pub attempts: u32,
    /// An INVALID index of that name (an interrupted build) was dropped first.
    pub dropped_invalid: bool,
    /// A valid index of that name was already there; nothing was built.
    pub already_built: bool,
}

/// Runs `create` (a `CREATE [UNIQUE] INDEX CONCURRENTLY` of `schema.index`)
/// until it succeeds, watching its progress.
///
/// A concurrent build that fails at any point, including the lock_timeout
/// of one of its waits, leaves an INVALID index behind that still costs
/// every write; before each attempt such a leftover is dropped
/// (`DROP INDEX CONCURRENTLY`, so no write waits for that either). Lock
/// waits are retried with the policy's backoff like any other DDL.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn build_index_concurrently(
    conn: &mut AsyncPgConnection,
    pid: i32,
    watcher: &mut Watcher,
    schema: &str,
    index: &str,
    create: &str,
    policy: &LockPolicy,
    on_progress: &mut dyn FnMut(BuildProgress),
) -> Result<BuildOutcome, OpsError> {
    let mut outcome = BuildOutcome::default();
    let mut retry = LockRetry::new(create, policy);
    loop {
        outcome.attempts = retry.attempt();
        match index_info(conn, schema, index).await? {
            Some(info) if info.valid => {
                outcome.already_built = outcome.attempts == 1;
                return Ok(outcome);
            }
            Some(_) => {
                let drop = format!("DROP INDEX CONCURRENTLY IF EXISTS {}.{}", quote_ident(schema), quote_ident(index));
                ddl(conn, &drop, policy).await?;
                outcome.dropped_invalid = true;
            }
            None => {}
        }
        let result = run_watched(conn, create, watcher, Watch::IndexBuild, pid, &mut |observation| {
            if let Observation::Index(progress) = observation {
                on_progress(progress);
            }
        })
        .await;
        if retry.settle(result).await? {
            return Ok(outcome);
        }
    }
}

/// Runs a long statement that takes a weak lock (`VALIDATE CONSTRAINT`)
/// with lock_timeout retries, sampling `pg_stat_activity` while it runs.
pub(crate) async fn run_long_watched(
    conn: &mut AsyncPgConnection,
    pid: i32,
    watcher: &mut Watcher,
    statement: &str,
    policy: &LockPolicy,
    on_observation: &mut dyn FnMut(Observation),
) -> Result<u32, OpsError> {
    let mut retry = LockRetry::new(statement, policy);
    loop {
        let result = run_watched(conn, statement, watcher, Watch::Activity, pid, on_observation).await;
        if retry.settle(result).await? {
            return Ok(retry.attempt());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_checked() {
        assert!(validate_identifier("name", "adk_events_author").is_ok());
        assert!(validate_identifier("name", "_x1").is_ok());
        for bad in ["", "1abc", "a-b", "a b", "a\"b", "drop table x;", "é"] {
            assert!(validate_identifier("name", bad).is_err(), "{bad:?}");
        }
        assert!(validate_identifier("name", &"a".repeat(63)).is_ok());
        assert!(validate_identifier("name", &"a".repeat(64)).is_err());
    }

    #[test]
    fn child_names_fit_and_stay_unique() {
        assert_eq!(child_index_name("adk_events_author", "adk_events_p20261105"), "adk_events_author_p20261105");
        assert_eq!(child_index_name("ix", "adk_events_legacy"), "ix_legacy");
        let long = "a".repeat(63);
        let one = child_index_name(&long, "adk_events_p20261105");
        let two = child_index_name(&long, "adk_events_p20261106");
        assert!(one.len() <= 63 && two.len() <= 63, "{one} {two}");
        assert_ne!(one, two);
        assert!(one.ends_with("_p20261105"), "{one}");
        let mut other = "a".repeat(62);
        other.push('b');
        assert_ne!(child_index_name(&other, "adk_events_p20261105"), one);
        let huge_partition = "x".repeat(63);
        let three = child_index_name("ix", &huge_partition);
        assert!(three.len() <= 63, "{three}");
        assert_ne!(three, child_index_name("ix", &"y".repeat(63)));
    }
}
