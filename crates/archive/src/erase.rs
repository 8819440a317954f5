//! Erasure reaches the archive: a user's rows leave every archived object
//! of the app that holds them, and every restored copy.
//!
//! An object is read only when it may hold the user: each row group's
//! `user_id` statistics (min, max) and bloom filter are checked from the
//! footer first, a few small range reads. An object that may is rewritten
//! without the user's rows under a new key, read back and verified, and
//! the catalog points to it in one transaction before the old object is
//! deleted; a day whose events changed gets its media rewritten to what the
//! remaining events still name, and a new manifest. An interrupted erasure
//! leaves either the old object or the new one named by the catalog, and
//! running it again finishes it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{Array, BooleanArray, RecordBatch};
use chrono::NaiveDate;
use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Bytea, Date, Integer, Text};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use futures_util::StreamExt as _;
use object_store::ObjectStoreExt as _;
use object_store::path::Path;
use parquet::arrow::ParquetRecordBatchStreamBuilder;
use parquet::file::statistics::Statistics;
use serde::Serialize;

use crate::destination::{Destination, StoreOptions};
use crate::format::{events_schema, media_schema, writer_properties};
use crate::object::{ObjectReader, PartWriter, WrittenObject, open_batches, verify_object};
use crate::write::{catalog_of, sweep, write_manifest};
use crate::{ArchiveConfig, ArchiveError, require_owner};
use adk_postgres_schema::quote::quote_ident;

/// What erasing a user from the archive did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ArchiveErasure {
    /// Archived event objects of the app.
    pub objects: usize,
    /// Of those, ruled out by their footer alone (statistics, bloom filter).
    pub skipped_by_footer: usize,
    /// Read in full because the footer could not rule the user out.
    pub read: usize,
    /// Rewritten without the user's rows.
    pub rewritten: usize,
    /// Media objects rewritten to what the remaining events still name.
    pub media_rewritten: usize,
    /// The user's rows removed from archived objects.
    pub archived_rows_removed: i64,
    /// The user's rows removed from restored copies in the database.
    pub restored_rows_removed: i64,
}

#[derive(QueryableByName)]
struct ObjectRow {
    #[diesel(sql_type = Date)]
    day: NaiveDate,
    #[diesel(sql_type = Text)]
    kind: String,
    #[diesel(sql_type = Integer)]
    part: i32,
    #[diesel(sql_type = Text)]
    object_key: String,
    #[diesel(sql_type = Text)]
    destination: String,
}

#[derive(QueryableByName)]
struct SchemaRow {
    #[diesel(sql_type = Text)]
    schema_name: String,
}

/// Removes `user`'s rows of `app` from the archive and from every restored
/// copy, and adds what was removed to the erasure's audit row
/// (`erasure_id`, from the erasure of the live log) when given.
pub async fn erase_user(
    conn: &mut AsyncPgConnection,
    app: &str,
    user: &str,
    erasure_id: Option<i64>,
    options: &StoreOptions,
) -> Result<ArchiveErasure, ArchiveError> {
    require_owner(conn, "erasing from the archive").await?;
    let config = ArchiveConfig::default();
    let objects: Vec<ObjectRow> = diesel::sql_query(
        "SELECT day, kind, part, object_key, destination FROM adk_archive_objects
          WHERE app_name = $1 AND kind = 'events' ORDER BY day, part",
    )
    .bind::<Text, _>(app)
    .load(conn)
    .await
    .map_err(ArchiveError::query("read the archive catalog"))?;
    let mut report = ArchiveErasure { objects: objects.len(), ..ArchiveErasure::default() };
    let mut destinations: BTreeMap<String, Destination> = BTreeMap::new();
    let mut changed_days: BTreeSet<NaiveDate> = BTreeSet::new();

    for object in &objects {
        if !destinations.contains_key(&object.destination) {
            destinations.insert(object.destination.clone(), Destination::open_with(&object.destination, options)?);
        }
        let Some(destination) = destinations.get(&object.destination) else { continue };
        let key = parse_key(&object.object_key)?;
        if !may_hold(&destination.store, &key, user).await? {
            report.skipped_by_footer += 1;
            continue;
        }
        report.read += 1;
        let new_key = rewritten_key(&object.object_key);
        let mut writer = PartWriter::single(
            Arc::clone(&destination.store),
            new_key.clone(),
            events_schema(),
            writer_properties(config.row_group_rows),
        );
        let mut removed: i64 = 0;
        let mut stream = open_batches(&destination.store, &key, None).await?;
        while let Some(batch) = stream.next().await {
            let batch = batch.map_err(ArchiveError::parquet(key.as_ref()))?;
            let (kept, gone) = without_user(&batch, user)?;
            removed += gone;
            writer.write(&kept).await?;
        }
        if removed == 0 {
            // The bloom filter's false positive: nothing to rewrite.
            writer.abandon().await;
            continue;
        }
        let written = writer.finish().await?;
        let Some(new_object) = written.into_iter().next() else {
            // Every row was the user's: the object goes, its row too.
            replace_object(conn, app, object, None, removed).await?;
            delete_quietly(destination, &key).await;
            report.rewritten += 1;
            report.archived_rows_removed += removed;
            changed_days.insert(object.day);
            continue;
        };
        verify_object(&destination.store, &new_object).await?;
        replace_object(conn, app, object, Some(&new_object), removed).await?;
        delete_quietly(destination, &key).await;
        report.rewritten += 1;
        report.archived_rows_removed += removed;
        changed_days.insert(object.day);
    }

    // Media no remaining event names goes, and each changed day gets a new
    // manifest.
    for day in changed_days {
        report.media_rewritten += rewrite_day_media(conn, &destinations, app, day, &config).await?;
    }

    report.restored_rows_removed = erase_restored(conn, app, user).await?;
    if let Some(erasure_id) = erasure_id {
        diesel::sql_query(
            "UPDATE adk_user_erasures SET archived_rows = archived_rows + $2, restored_rows = restored_rows + $3
              WHERE erasure_id = $1",
        )
        .bind::<BigInt, _>(erasure_id)
        .bind::<BigInt, _>(report.archived_rows_removed)
        .bind::<BigInt, _>(report.restored_rows_removed)
        .execute(conn)
        .await
        .map_err(ArchiveError::query("add the archive's rows to the erasure's audit row"))?;
    }
    tracing::info!(
        app,
        objects = report.objects,
        skipped = report.skipped_by_footer,
        rewritten = report.rewritten,
        removed = report.archived_rows_removed,
        "erased a user from the archive"
    );
    Ok(report)
}

fn parse_key(key: &str) -> Result<Path, ArchiveError> {
    Path::parse(key).map_err(|e| ArchiveError::Unverified { key: key.to_owned(), reason: format!("not a key: {e}") })
}

/// `…/events-0000.parquet` → `…/events-0000.r1.parquet` → `….r2.parquet`:
/// a rewrite never overwrites the object the catalog still names.
fn rewritten_key(key: &str) -> Path {
    let stem = key.strip_suffix(".parquet").unwrap_or(key);
    let (base, generation) = match stem.rsplit_once(".r") {
        Some((base, n)) if n.chars().all(|c| c.is_ascii_digit()) && !n.is_empty() => {
            (base, n.parse::<u64>().unwrap_or(0))
        }
        _ => (stem, 0),
    };
    // The key was parsed from the catalog, so its new name parses too.
    let next = format!("{base}.r{}.parquet", generation + 1);
    Path::parse(&next).unwrap_or_else(|_| Path::from(next.as_str()))
}

/// Whether the object may hold `user`, from its footer: a row group is
/// ruled out when `user` is outside its `user_id` range or its bloom filter
/// says no.
async fn may_hold(store: &Arc<dyn object_store::ObjectStore>, key: &Path, user: &str) -> Result<bool, ArchiveError> {
    let reader = ObjectReader::new(Arc::clone(store), key.clone());
    let mut builder =
        ParquetRecordBatchStreamBuilder::new(reader).await.map_err(ArchiveError::parquet(key.as_ref()))?;
    let metadata = Arc::clone(builder.metadata());
    let Some(column) = metadata.file_metadata().schema_descr().columns().iter().position(|c| c.name() == "user_id")
    else {
        return Ok(true);
    };
    for (index, group) in metadata.row_groups().iter().enumerate() {
        let chunk = group.column(column);
        if let Some(Statistics::ByteArray(stats)) = chunk.statistics()
            && let (Some(min), Some(max)) = (stats.min_opt(), stats.max_opt())
            && (user.as_bytes() < min.data() || user.as_bytes() > max.data())
        {
            continue;
        }
        let filter = builder
            .get_row_group_column_bloom_filter(index, column)
            .await
            .map_err(ArchiveError::parquet(key.as_ref()))?;
        match filter {
            Some(filter) if !filter.check(&user) => continue,
            _ => return Ok(true),
        }
    }
    Ok(false)
}

/// The batch without `user`'s rows, and how many there were.
fn without_user(batch: &RecordBatch, user: &str) -> Result<(RecordBatch, i64), ArchiveError> {
    let users =
        batch.column_by_name("user_id").and_then(|c| c.as_string_opt::<i32>()).ok_or_else(|| ArchiveError::Arrow {
            context: "erase from an archived batch".into(),
            source: arrow_schema::ArrowError::SchemaError("no text column user_id".into()),
        })?;
    let keep: BooleanArray = (0..users.len()).map(|i| Some(users.is_null(i) || users.value(i) != user)).collect();
    let removed = i64::try_from(keep.false_count()).unwrap_or(i64::MAX);
    let kept = arrow_select::filter::filter_record_batch(batch, &keep)
        .map_err(ArchiveError::arrow("erase from an archived batch"))?;
    Ok((kept, removed))
}

/// Points the catalog at the rewritten object (or drops the row when
/// nothing of the object is left), and lowers the day's event count.
async fn replace_object(
    conn: &mut AsyncPgConnection,
    app: &str,
    old: &ObjectRow,
    new: Option<&WrittenObject>,
    removed: i64,
) -> Result<(), ArchiveError> {
    let app = app.to_owned();
    let (day, kind, part) = (old.day, old.kind.clone(), old.part);
    let new = new.cloned();
    conn.transaction::<_, diesel::result::Error, _>(async move |conn| {
        match &new {
            Some(new) => {
                diesel::sql_query(
                    "UPDATE adk_archive_objects SET object_key = $5, rows = $6, bytes = $7, sha256 = $8,
                            verified_at = now()
                      WHERE app_name = $1 AND day = $2 AND kind = $3 AND part = $4",
                )
                .bind::<Text, _>(&app)
                .bind::<Date, _>(day)
                .bind::<Text, _>(&kind)
                .bind::<Integer, _>(part)
                .bind::<Text, _>(&new.key)
                .bind::<BigInt, _>(new.rows)
                .bind::<BigInt, _>(new.bytes)
                .bind::<Bytea, _>(&new.sha256)
                .execute(conn)
                .await?;
            }
            None => {
                diesel::sql_query(
                    "DELETE FROM adk_archive_objects WHERE app_name = $1 AND day = $2 AND kind = $3 AND part = $4",
                )
                .bind::<Text, _>(&app)
                .bind::<Date, _>(day)
                .bind::<Text, _>(&kind)
                .bind::<Integer, _>(part)
                .execute(conn)
                .await?;
            }
        }
        diesel::sql_query(
            "UPDATE adk_archive_objects SET day_events = day_events - $3 WHERE app_name = $1 AND day = $2",
        )
        .bind::<Text, _>(&app)
        .bind::<Date, _>(day)
        .bind::<BigInt, _>(removed)
        .execute(conn)
        .await?;
        Ok(())
    })
    .await
    .map_err(ArchiveError::query("point the catalog at a rewritten object"))
}

async fn delete_quietly(destination: &Destination, key: &Path) {
    if let Err(error) = destination.store.delete(key).await {
        tracing::warn!(key = %key, %error, "could not delete a replaced archive object; the next run sweeps it");
    }
}

/// Rewrites the media objects of an app's day to the pieces its remaining
/// events name, writes the day's manifest again and sweeps the folder.
/// Returns how many media objects were rewritten.
async fn rewrite_day_media(
    conn: &mut AsyncPgConnection,
    destinations: &BTreeMap<String, Destination>,
    app: &str,
    day: NaiveDate,
    config: &ArchiveConfig,
) -> Result<usize, ArchiveError> {
    let catalog = catalog_of(conn, app, day).await?;
    let Some(first) = catalog.as_slice().first() else { return Ok(0) };
    let Some(destination) = destinations.get(&first.destination) else { return Ok(0) };
    let mut named: BTreeSet<String> = BTreeSet::new();
    for row in catalog.iter().filter(|row| row.kind == "events") {
        let key = parse_key(&row.object_key)?;
        let mut stream = open_batches(&destination.store, &key, Some(&["blob_refs"])).await?;
        while let Some(batch) = stream.next().await {
            let batch = batch.map_err(ArchiveError::parquet(key.as_ref()))?;
            if let Some(list) = batch.column_by_name("blob_refs").and_then(|c| c.as_list_opt::<i32>()) {
                for i in (0..list.len()).filter(|i| list.is_valid(*i)) {
                    let values = list.value(i);
                    if let Some(values) = values.as_string_opt::<i32>() {
                        named.extend((0..values.len()).map(|j| values.value(j).to_owned()));
                    }
                }
            }
        }
    }
    let mut rewritten = 0;
    for row in catalog.iter().filter(|row| row.kind == "media") {
        let key = parse_key(&row.object_key)?;
        let mut writer = PartWriter::single(
            Arc::clone(&destination.store),
            rewritten_key(&row.object_key),
            media_schema(),
            writer_properties(config.row_group_rows),
        );
        let mut removed = 0_i64;
        let mut stream = open_batches(&destination.store, &key, None).await?;
        while let Some(batch) = stream.next().await {
            let batch = batch.map_err(ArchiveError::parquet(key.as_ref()))?;
            let hashes = batch.column_by_name("sha256").and_then(|c| c.as_string_opt::<i32>()).ok_or_else(|| {
                ArchiveError::Arrow {
                    context: "erase from archived media".into(),
                    source: arrow_schema::ArrowError::SchemaError("no text column sha256".into()),
                }
            })?;
            let keep: BooleanArray = (0..hashes.len()).map(|i| Some(named.contains(hashes.value(i)))).collect();
            removed += i64::try_from(keep.false_count()).unwrap_or(i64::MAX);
            let kept = arrow_select::filter::filter_record_batch(&batch, &keep)
                .map_err(ArchiveError::arrow("erase from archived media"))?;
            writer.write(&kept).await?;
        }
        if removed == 0 {
            writer.abandon().await;
            continue;
        }
        let written = writer.finish().await?;
        let old = ObjectRow {
            day,
            kind: "media".into(),
            part: row.part,
            object_key: row.object_key.clone(),
            destination: row.destination.clone(),
        };
        match written.into_iter().next() {
            Some(new) => {
                verify_object(&destination.store, &new).await?;
                replace_object(conn, app, &old, Some(&new), 0).await?;
            }
            None => replace_object(conn, app, &old, None, 0).await?,
        }
        delete_quietly(destination, &key).await;
        rewritten += 1;
    }
    // The manifest says what the folder holds now.
    let catalog = catalog_of(conn, app, day).await?;
    let objects: Vec<WrittenObject> = catalog.iter().map(|row| row.written()).collect();
    let kinds: Vec<(&str, &WrittenObject)> =
        catalog.iter().zip(&objects).map(|(row, object)| (row.kind.as_str(), object)).collect();
    let events = catalog.as_slice().first().map(|row| row.day_events).unwrap_or_default();
    let folder = destination.day_folder(app, day);
    write_manifest(destination, &folder, app, day, events, &kinds).await?;
    let keep: BTreeSet<String> = objects.iter().map(|o| o.key.clone()).collect();
    sweep(destination, &folder, &keep).await?;
    Ok(rewritten)
}

/// Deletes the user's rows from every restored copy of the app's days, and
/// the restored media no remaining row names.
async fn erase_restored(conn: &mut AsyncPgConnection, app: &str, user: &str) -> Result<i64, ArchiveError> {
    let schemas: Vec<SchemaRow> =
        diesel::sql_query("SELECT DISTINCT schema_name FROM adk_archive_restores WHERE app_name = $1")
            .bind::<Text, _>(app)
            .load(conn)
            .await
            .map_err(ArchiveError::query("list the restored copies"))?;
    let mut removed = 0_i64;
    for schema in schemas {
        let s = quote_ident(&schema.schema_name);
        let app = app.to_owned();
        let user = user.to_owned();
        removed += conn
            .transaction::<_, diesel::result::Error, _>(async move |conn| {
                conn.batch_execute("SET LOCAL adk.archive_writer = 'on'").await?;
                let exists: Vec<SchemaRow> = diesel::sql_query(
                    "SELECT n.nspname::text AS schema_name FROM pg_namespace n WHERE n.nspname = $1
                        AND pg_catalog.to_regclass(pg_catalog.quote_ident(n.nspname) || '.adk_restored_events') IS NOT NULL",
                )
                .bind::<Text, _>(&schema.schema_name)
                .load(conn)
                .await?;
                if exists.is_empty() {
                    return Ok(0);
                }
                let gone = diesel::sql_query(format!(
                    "DELETE FROM {s}.adk_restored_events WHERE app_name = $1 AND user_id = $2"
                ))
                .bind::<Text, _>(&app)
                .bind::<Text, _>(&user)
                .execute(conn)
                .await?;
                diesel::sql_query(format!(
                    "DELETE FROM {s}.adk_restored_blobs b WHERE b.app_name = $1
                        AND NOT EXISTS (SELECT 1 FROM {s}.adk_restored_events e
                                         WHERE e.app_name = b.app_name AND e.session_day = b.day
                                           AND b.sha256 = ANY (e.blob_refs))"
                ))
                .bind::<Text, _>(&app)
                .execute(conn)
                .await?;
                Ok(i64::try_from(gone).unwrap_or(i64::MAX))
            })
            .await
            .map_err(ArchiveError::query("erase a user from a restored copy"))?;
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rewrite_takes_the_next_generation_of_the_key() {
        assert_eq!(
            rewritten_key("p/app=a/day=2026-01-01/events-0000.parquet").as_ref(),
            "p/app=a/day=2026-01-01/events-0000.r1.parquet"
        );
        assert_eq!(
            rewritten_key("app=a/day=2026-01-01/events-0003.r1.parquet").as_ref(),
            "app=a/day=2026-01-01/events-0003.r2.parquet"
        );
        assert_eq!(
            rewritten_key("app=a%2Fb/day=2026-01-01/media-0000.parquet").as_ref(),
            "app=a%2Fb/day=2026-01-01/media-0000.r1.parquet"
        );
    }
}
