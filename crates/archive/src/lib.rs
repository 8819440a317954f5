//! The archive tier of adk-postgres: before maintenance drops a day past
//! retention, each app's events of that day are written as Apache Parquet
//! (zstd) to object storage, with the media they name, read back and
//! verified, and recorded in the catalog (`adk_archive_objects`); only
//! then may the day go. A day that fails to archive is kept and alerted on.
//!
//! The files are plain Parquet in Hive folders
//! (`app=<app>/day=<YYYY-MM-DD>/events-0000.parquet`), which DuckDB,
//! Spark, Athena and BigQuery read without this crate. [`restore_day`]
//! loads a day back into a separate read-only schema; [`erase_user`]
//! removes a user from every archived object and restored copy that holds
//! them, skipping objects whose statistics and bloom filters rule the user
//! out.
//!
//! What it must not depend on: retention (which calls it), the CLI, the
//! dashboard or the adk adapter. It uses the operations crate for its
//! connection and errors, the schema crate for names, and the store only
//! for the catalog's listing function, which service roles call too.

#![warn(missing_docs)]

mod destination;
mod erase;
mod error;
pub mod format;
mod object;
mod policy;
mod restore;
mod verify;
mod write;

pub use destination::{Destination, StoreOptions, check_url};
pub use erase::{ArchiveErasure, erase_user};
pub use error::ArchiveError;
pub use object::{WrittenObject, verify_object};
pub use policy::{ArchivePolicy, ArchiveSetting, read_archive_policy, set_archive_policy};
pub use restore::{DEFAULT_RESTORE_SCHEMA, RestoreReport, has_restored_copies, restore_day};
pub use verify::{ArchivedObject, ObjectCheck, list_archive, verify_archive};
pub use write::{DayArchived, apps_in_partition, archive_app_day, record_failure};

/// How the archive writes.
#[derive(Debug, Clone)]
pub struct ArchiveConfig {
    /// A part closes once it holds this many bytes and the next one opens.
    pub part_bytes: u64,
    /// Events read per statement.
    pub batch_rows: i64,
    /// Rows per Parquet row group: what the writer holds in memory at most
    /// (less when 32 MiB of encoded data comes first).
    pub row_group_rows: usize,
    /// Object store settings beyond the environment's.
    pub store_options: StoreOptions,
}

impl Default for ArchiveConfig {
    fn default() -> Self {
        Self {
            part_bytes: 256 << 20,
            batch_rows: 2_000,
            row_group_rows: 16_384,
            store_options: StoreOptions::default(),
        }
    }
}

/// Whether the connected role owns the store: archiving, restoring and
/// erasing from the archive read and write every app's objects.
pub(crate) async fn require_owner(
    conn: &mut diesel_async::AsyncPgConnection,
    what: &'static str,
) -> Result<(), ArchiveError> {
    use diesel_async::RunQueryDsl as _;
    #[derive(diesel::QueryableByName)]
    struct OwnerRow {
        #[diesel(sql_type = diesel::sql_types::Bool)]
        owner: bool,
        #[diesel(sql_type = diesel::sql_types::Text)]
        role: String,
    }
    let row = diesel::sql_query("SELECT adk_is_store_owner() AS owner, current_user::text AS role")
        .load::<OwnerRow>(conn)
        .await
        .and_then(adk_postgres_operations::first_row)
        .map_err(ArchiveError::query("read whether the role owns the store"))?;
    if row.owner { Ok(()) } else { Err(ArchiveError::NotOwner { what, role: row.role }) }
}
