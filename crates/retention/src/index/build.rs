//! One run of an index build, once it holds the index-build lock: the
//! parent index, then every partition's, each looked up in the catalog
//! first so that a rerun finishes what an interrupted run left.

use std::time::Instant;

use adk_postgres_schema::quote::quote_ident;
use diesel::QueryableByName;
use diesel::sql_types::{Bool, Nullable, Text};
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use super::names::child_index_name;
use super::{IndexOptions, IndexProgress, IndexReport};
use crate::RetentionError;
use crate::catalog::{IndexInfo, index_info, relation_kind};
use crate::ddl_watch::{ConcurrentIndex, Watcher, backend_pid, build_index_concurrently, millis};
use adk_postgres_operations::{LockPolicy, ddl};

/// Everything one run works with, so each step reads what it needs from
/// one place instead of from a long argument list.
pub(super) struct Build<'a> {
    /// The connection holding the index-build lock.
    pub conn: &'a mut AsyncPgConnection,
    /// For the second connection that watches the builds.
    pub database_url: &'a str,
    /// The schema of `adk_events`.
    pub schema: &'a str,
    /// The parent index, and its columns (checked by `check_request`).
    pub name: &'a str,
    pub columns: &'a [&'a str],
    pub policy: &'a LockPolicy,
    pub options: &'a IndexOptions,
    pub progress: &'a mut dyn FnMut(IndexProgress),
    pub report: IndexReport,
}

impl Build<'_> {
    pub(super) async fn run(&mut self) -> Result<(), RetentionError> {
        let (schema, name, policy) = (self.schema, self.name, self.policy);
        let column_list = self.columns.iter().map(|c| quote_ident(c)).collect::<Vec<_>>().join(", ");
        let qualified = |relation: &str| format!("{}.{}", quote_ident(schema), quote_ident(relation));
        let wanted: Vec<String> = self.columns.iter().map(|c| (*c).to_owned()).collect();

        // 1. The parent index, on the parent only. Quick (no data is read), but
        //    it takes a SHARE lock on the parent, so it runs under lock_timeout.
        match index_info(self.conn, schema, name).await? {
            Some(info) => check_definition(&info, "adk_events", &wanted)?,
            None => {
                if relation_kind(self.conn, schema, name).await?.is_some() {
                    return Err(RetentionError::Conflict(format!("{name} already exists and is not an index")));
                }
                ddl(
                    self.conn,
                    &format!(
                        "CREATE INDEX IF NOT EXISTS {} ON ONLY {} ({column_list})",
                        quote_ident(name),
                        qualified("adk_events")
                    ),
                    policy,
                )
                .await?;
                self.report.parent_created = true;
                (self.progress)(IndexProgress::ParentCreated { index: name.to_owned() });
                // A racing creator could have used the name for something else.
                let info = index_info(self.conn, schema, name).await?.ok_or_else(|| {
                    RetentionError::Conflict(format!("index {name} vanished right after it was created"))
                })?;
                check_definition(&info, "adk_events", &wanted)?;
            }
        }

        let pid = backend_pid(self.conn).await?;
        let mut watcher = Watcher::open(self.database_url, "adk-pg index (progress)", policy, pid).await;
        let mut announced = false;
        let mut built_this_run = 0usize;
        // Partitions made while this runs (maintenance premaking) get a clone
        // of the parent index from PostgreSQL itself; a second pass only has to
        // confirm that. Three passes are plenty; the loop never spins.
        for _pass in 0..3 {
            let partitions = list_partition_indexes(self.conn, schema, name).await?;
            if !announced {
                self.report.partitions = partitions.len();
                (self.progress)(IndexProgress::Started { index: name.to_owned(), partitions: partitions.len() });
                announced = true;
            }
            if let Some(pending) = partitions.iter().find(|p| p.detach_pending) {
                return Err(RetentionError::Conflict(format!(
                    "partition {} is half-detached; run maintenance (it finalizes the detach) and retry",
                    pending.name
                )));
            }
            if let Some(nested) = partitions.iter().find(|p| p.kind != "r") {
                return Err(RetentionError::Conflict(format!("partition {} is not a plain table", nested.name)));
            }
            let todo: Vec<&PartitionIndexRow> = partitions.iter().filter(|p| p.attached_index.is_none()).collect();
            for partition in partitions.iter().filter(|p| p.attached_index.is_some()) {
                let seen = [&self.report.skipped, &self.report.built, &self.report.attached_existing];
                if !seen.iter().any(|names| names.contains(&partition.name)) {
                    self.report.skipped.push(partition.name.clone());
                    (self.progress)(IndexProgress::PartitionSkipped {
                        partition: partition.name.clone(),
                        child_index: partition.attached_index.clone().unwrap_or_default(),
                    });
                }
            }
            if todo.is_empty() {
                break;
            }
            for partition in todo {
                if self.options.stop_after_partitions.is_some_and(|limit| built_this_run >= limit) {
                    self.report.stopped_early = true;
                    self.report.parent_valid = parent_valid(self.conn, schema, name).await?;
                    return Ok(());
                }
                let part_started = Instant::now();
                let child = child_index_name(name, &partition.name);
                let qualified_child = format!("{}.{}", quote_ident(&partition.schema), quote_ident(&child));
                let existing = index_info(self.conn, &partition.schema, &child).await?;
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
                    let index = ConcurrentIndex { schema: &partition.schema, name: &child, create: &create };
                    let progress = &mut *self.progress;
                    let outcome = build_index_concurrently(self.conn, &mut watcher, policy, index, &mut |p| {
                        progress(IndexProgress::Building {
                            partition: partition.name.clone(),
                            child_index: child.clone(),
                            progress: p,
                        })
                    })
                    .await;
                    let outcome = match outcome {
                        Ok(outcome) => outcome,
                        // Maintenance may have dropped the partition meanwhile;
                        // then there is nothing to index.
                        Err(e) if relation_kind(self.conn, &partition.schema, &partition.name).await?.is_none() => {
                            tracing::info!(partition = %partition.name, error = %e, "partition vanished during the build");
                            continue;
                        }
                        Err(e) => return Err(e),
                    };
                    if outcome.dropped_invalid {
                        self.report.dropped_invalid.push(child.clone());
                        (self.progress)(IndexProgress::DroppedInvalid { child_index: child.clone() });
                    }
                }
                ddl(self.conn, &format!("ALTER INDEX {} ATTACH PARTITION {qualified_child}", qualified(name)), policy)
                    .await?;
                if adopted {
                    self.report.attached_existing.push(partition.name.clone());
                } else {
                    self.report.built.push(partition.name.clone());
                    built_this_run += 1;
                }
                (self.progress)(IndexProgress::Attached {
                    partition: partition.name.clone(),
                    child_index: child,
                    elapsed_ms: millis(part_started.elapsed()),
                });
            }
        }

        self.report.parent_valid = parent_valid(self.conn, schema, name).await?;
        if !self.report.parent_valid {
            return Err(RetentionError::Conflict(format!(
                "every partition has index {name} attached but the parent index is still invalid; \
                 check pg_inherits for partitions added or removed during the build and rerun"
            )));
        }
        Ok(())
    }
}

fn check_definition(info: &IndexInfo, table: &str, columns: &[String]) -> Result<(), RetentionError> {
    if info.table_name != table || info.is_unique || !info.plain || info.columns != columns {
        return Err(RetentionError::Conflict(format!(
            "index {} already exists with another definition (on {}, columns {:?}, unique: {}); \
             drop it or pick another name",
            info.name, info.table_name, info.columns, info.is_unique
        )));
    }
    Ok(())
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
) -> Result<Vec<PartitionIndexRow>, RetentionError> {
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
    .map_err(RetentionError::query("list the partitions of adk_events and their indexes"))
}

#[derive(QueryableByName)]
struct ValidRow {
    #[diesel(sql_type = Bool)]
    valid: bool,
}

async fn parent_valid(conn: &mut AsyncPgConnection, schema: &str, index: &str) -> Result<bool, RetentionError> {
    let rows = diesel::sql_query(
        "SELECT x.indisvalid AS valid FROM pg_index x JOIN pg_class c ON c.oid = x.indexrelid
         JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = $2",
    )
    .bind::<Text, _>(schema)
    .bind::<Text, _>(index)
    .load::<ValidRow>(conn)
    .await
    .map_err(RetentionError::query(format!("check that index {index} is valid")))?;
    Ok(rows.iter().any(|r| r.valid))
}
