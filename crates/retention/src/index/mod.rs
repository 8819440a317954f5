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

mod build;
mod names;

use std::time::Instant;

use serde::Serialize;

use crate::RetentionError;
use crate::catalog::{relation_kind, table_columns};
use crate::lock::AdvisoryLock;
use adk_postgres_operations::{LockPolicy, connect, events_schema};

pub use crate::ddl_watch::BuildProgress;
pub use names::child_index_name;

/// Key of the advisory lock that keeps two index builds apart: both would
/// otherwise take each other's half-built index for a leftover and drop it.
pub const INDEX_BUILD_LOCK_KEY: i64 = adk_postgres_schema::names::lock_keys::INDEX_BUILD;

/// Options of [`create_partitioned_index_with`].
#[derive(Debug, Clone, Default)]
pub struct IndexOptions {
    /// Stop after building this many partition indexes (a deliberate
    /// interruption; the next run carries on). `None` builds them all.
    pub stop_after_partitions: Option<usize>,
}

/// What [`create_partitioned_index`] is doing, as it happens.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum IndexProgress {
    /// The run holds its lock and has listed the partitions.
    Started {
        /// The index on the parent.
        index: String,
        /// Partitions to cover.
        partitions: usize,
    },
    /// The (invalid until complete) index on the parent alone was created.
    ParentCreated {
        /// The index on the parent.
        index: String,
    },
    /// The partition already has its index attached.
    PartitionSkipped {
        /// The partition.
        partition: String,
        /// The partition's own index, as [`child_index_name`] names it.
        child_index: String,
    },
    /// An INVALID leftover of an interrupted build was dropped.
    DroppedInvalid {
        /// The index dropped.
        child_index: String,
    },
    /// A concurrent build is running; sampled every ~200 ms.
    Building {
        /// The partition.
        partition: String,
        /// The partition's own index, as [`child_index_name`] names it.
        child_index: String,
        /// The latest sample.
        progress: BuildProgress,
    },
    /// The partition's index is built (or was found built) and attached.
    Attached {
        /// The partition.
        partition: String,
        /// The partition's own index, as [`child_index_name`] names it.
        child_index: String,
        /// How long building and attaching it took, in milliseconds.
        elapsed_ms: u64,
    },
    /// The run ended.
    Finished {
        /// The index on the parent.
        index: String,
        /// Whether the parent index is valid: every partition has it.
        valid: bool,
    },
}

/// What one run did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct IndexReport {
    /// The index on the parent.
    pub index: String,
    /// Its columns, in order.
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
    /// How long the run took, in milliseconds.
    pub elapsed_ms: u64,
}

impl std::fmt::Display for IndexReport {
    /// What `adk-pg create-index` prints after a run.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "index {} on {} partition(s): {} built, {} already there",
            self.index,
            self.partitions,
            self.built.len(),
            self.skipped.len() + self.attached_existing.len()
        )
    }
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
) -> Result<IndexReport, RetentionError> {
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
) -> Result<IndexReport, RetentionError> {
    names::check_request(name, columns)?;

    let started = Instant::now();
    let mut conn = connect(database_url, "adk-pg index", policy).await?;
    let schema = events_schema(&mut conn).await?;
    let parent_kind = relation_kind(&mut conn, &schema, "adk_events").await?;
    if parent_kind.as_deref() != Some("p") {
        return Err(RetentionError::Conflict(
            "adk_events is not partitioned; build the index with CREATE INDEX CONCURRENTLY instead".into(),
        ));
    }
    let existing_columns = table_columns(&mut conn, &schema, "adk_events").await?;
    if let Some(missing) = columns.iter().find(|c| !existing_columns.iter().any(|e| e == *c)) {
        return Err(RetentionError::InvalidInput {
            field: "columns",
            reason: format!("adk_events has no column {missing}"),
        });
    }

    let Some(mut lock) = AdvisoryLock::try_acquire(conn, INDEX_BUILD_LOCK_KEY).await? else {
        return Err(RetentionError::Conflict("another index build is running on this database".into()));
    };
    let mut build = build::Build {
        conn: lock.conn(),
        database_url,
        schema: &schema,
        name,
        columns,
        policy,
        options,
        progress: &mut *progress,
        report: IndexReport {
            index: name.to_owned(),
            columns: columns.iter().map(|c| (*c).to_owned()).collect(),
            ..IndexReport::default()
        },
    };
    let outcome = build.run().await;
    let mut report = build.report;
    lock.release().await;
    outcome?;
    report.elapsed_ms = crate::ddl_watch::millis(started.elapsed());
    progress(IndexProgress::Finished { index: name.to_owned(), valid: report.parent_valid });
    Ok(report)
}
