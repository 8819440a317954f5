//! Archiving one app's day: stream the partition out in key order, write
//! Parquet parts and the media they name, read every object back, write the
//! manifest, record the objects in the catalog. Only a day whose every
//! covered app came through this is dropped by maintenance.
//!
//! Safe to interrupt anywhere. Keys are fixed by app, day, kind and part, so
//! a rerun overwrites what an interrupted run left rather than adding to
//! it, and removes parts the new run did not write. A day already recorded
//! is read back again before it is reported archived: recorded and
//! verified once is not enough to drop on.

use std::collections::BTreeSet;
use std::sync::Arc;

use chrono::{DateTime, NaiveDate, Utc};
use diesel::QueryableByName;
use diesel::sql_types::{Array, BigInt, Bytea, Date, Integer, Nullable, Text, Timestamptz};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use futures_util::StreamExt as _;
use object_store::ObjectStoreExt as _;
use object_store::path::Path;
use serde::Serialize;

use crate::destination::Destination;
use crate::format::{
    ArchivedBlob, ArchivedEvent, FORMAT_VERSION, events_batch, events_schema, media_batch, media_schema,
    writer_properties,
};
use crate::object::{PartWriter, WrittenObject, hex, verify_object};
use crate::{ArchiveConfig, ArchiveError};
use adk_postgres_operations::first_row;

/// What archiving one app's day came to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DayArchived {
    /// The app.
    pub app_name: String,
    /// The day (UTC).
    pub day: NaiveDate,
    /// Events the archive holds for the app's day.
    pub events: i64,
    /// Objects it consists of, media included.
    pub objects: usize,
    /// Their bytes in all.
    pub bytes: i64,
    /// True when an earlier run had archived it and this one read it back.
    pub already_archived: bool,
}

#[derive(QueryableByName)]
struct CountRow {
    #[diesel(sql_type = BigInt)]
    count: i64,
}

#[derive(QueryableByName)]
struct AppRow {
    #[diesel(sql_type = Text)]
    app_name: String,
}

#[derive(QueryableByName)]
struct EventRow {
    #[diesel(sql_type = Text)]
    user_id: String,
    #[diesel(sql_type = Text)]
    session_id: String,
    #[diesel(sql_type = BigInt)]
    seq: i64,
    #[diesel(sql_type = Text)]
    event_id: String,
    #[diesel(sql_type = Nullable<Text>)]
    invocation_id: Option<String>,
    #[diesel(sql_type = Text)]
    author: String,
    #[diesel(sql_type = BigInt)]
    event_ts: i64,
    #[diesel(sql_type = Timestamptz)]
    created_at: DateTime<Utc>,
    #[diesel(sql_type = Text)]
    payload: String,
    #[diesel(sql_type = Nullable<Array<Text>>)]
    blob_refs: Option<Vec<String>>,
    #[diesel(sql_type = Nullable<Text>)]
    display_name: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    labels: Option<String>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    session_created_at: Option<DateTime<Utc>>,
}

#[derive(QueryableByName)]
struct BlobRow {
    #[diesel(sql_type = Text)]
    sha256: String,
    #[diesel(sql_type = Bytea)]
    data: Vec<u8>,
}

#[derive(QueryableByName)]
pub(crate) struct CatalogRow {
    #[diesel(sql_type = Text)]
    pub kind: String,
    #[diesel(sql_type = Integer)]
    pub part: i32,
    #[diesel(sql_type = Text)]
    pub object_key: String,
    #[diesel(sql_type = Text)]
    pub destination: String,
    #[diesel(sql_type = BigInt)]
    pub rows: i64,
    #[diesel(sql_type = BigInt)]
    pub bytes: i64,
    #[diesel(sql_type = Bytea)]
    pub sha256: Vec<u8>,
    #[diesel(sql_type = Integer)]
    pub format_version: i32,
    #[diesel(sql_type = BigInt)]
    pub day_events: i64,
}

impl CatalogRow {
    pub(crate) fn written(&self) -> WrittenObject {
        WrittenObject {
            key: self.object_key.clone(),
            part: self.part,
            rows: self.rows,
            bytes: self.bytes,
            sha256: self.sha256.clone(),
        }
    }
}

/// The apps with events in a partition, each found by one index probe (a
/// skip scan over the primary key) rather than by reading the day. Citus
/// plans no recursive query without the distribution column, so there
/// (`skip_scan` false) the day is read once with DISTINCT, on the workers.
pub async fn apps_in_partition(
    conn: &mut AsyncPgConnection,
    partition: &str,
    skip_scan: bool,
) -> Result<Vec<String>, ArchiveError> {
    let query = if skip_scan {
        format!(
            "WITH RECURSIVE apps AS (
                 (SELECT e.app_name FROM ONLY {partition} e ORDER BY e.app_name LIMIT 1)
                 UNION ALL
                 SELECT (SELECT e.app_name FROM ONLY {partition} e WHERE e.app_name > apps.app_name
                          ORDER BY e.app_name LIMIT 1)
                   FROM apps WHERE apps.app_name IS NOT NULL)
             SELECT app_name FROM apps WHERE app_name IS NOT NULL"
        )
    } else {
        format!("SELECT DISTINCT e.app_name FROM {partition} e ORDER BY 1")
    };
    let rows: Vec<AppRow> =
        diesel::sql_query(query).load(conn).await.map_err(ArchiveError::query("list the apps of a day"))?;
    Ok(rows.into_iter().map(|row| row.app_name).collect())
}

/// The catalog's rows of one app's day.
pub(crate) async fn catalog_of(
    conn: &mut AsyncPgConnection,
    app: &str,
    day: NaiveDate,
) -> Result<Vec<CatalogRow>, ArchiveError> {
    diesel::sql_query(
        "SELECT kind, part, object_key, destination, rows, bytes, sha256, format_version, day_events
           FROM adk_archive_objects WHERE app_name = $1 AND day = $2 ORDER BY kind, part",
    )
    .bind::<Text, _>(app)
    .bind::<Date, _>(day)
    .load(conn)
    .await
    .map_err(ArchiveError::query("read the archive catalog"))
}

/// Archives `app`'s events of `day`, held by the partition `partition`
/// (schema-qualified and quoted), to `destination`.
pub async fn archive_app_day(
    conn: &mut AsyncPgConnection,
    destination: &Destination,
    partition: &str,
    app: &str,
    day: NaiveDate,
    config: &ArchiveConfig,
) -> Result<DayArchived, ArchiveError> {
    let count: i64 = diesel::sql_query(format!(
        "SELECT count(*) AS count FROM ONLY {partition} WHERE app_name = $1 AND session_day = $2"
    ))
    .bind::<Text, _>(app)
    .bind::<Date, _>(day)
    .load::<CountRow>(conn)
    .await
    .and_then(first_row)
    .map_err(ArchiveError::query("count the events of an app's day"))?
    .count;
    if count == 0 {
        return Ok(DayArchived {
            app_name: app.to_owned(),
            day,
            events: 0,
            objects: 0,
            bytes: 0,
            already_archived: false,
        });
    }

    // 1. Recorded by an earlier run (killed before its drop): read it back,
    //    and if it still matches the day, it is archived.
    let recorded = catalog_of(conn, app, day).await?;
    if !recorded.is_empty()
        && recorded.iter().all(|row| {
            row.destination == destination.url && row.day_events == count && row.format_version == FORMAT_VERSION
        })
    {
        let mut intact = true;
        for row in &recorded {
            if let Err(error) = verify_object(&destination.store, &row.written()).await {
                tracing::warn!(app, %day, %error, "a recorded archive object no longer verifies; archiving the day again");
                intact = false;
                break;
            }
        }
        if intact {
            return Ok(DayArchived {
                app_name: app.to_owned(),
                day,
                events: count,
                objects: recorded.len(),
                bytes: recorded.iter().map(|row| row.bytes).sum(),
                already_archived: true,
            });
        }
    }

    // 2. Stream the day out in key order, a batch per statement.
    let folder = destination.day_folder(app, day);
    let properties = writer_properties(config.row_group_rows);
    let mut events = PartWriter::new(
        Arc::clone(&destination.store),
        folder.clone(),
        "events",
        events_schema(),
        properties.clone(),
        config.part_bytes,
    );
    let mut hashes = BTreeSet::new();
    let mut streamed: i64 = 0;
    let mut after: Option<(String, String, i64)> = None;
    // A failed stream abandons the open part, so no incomplete upload (a
    // multipart upload on S3, a staged file in a folder) outlives the run.
    let streaming: Result<(), ArchiveError> = async {
        loop {
            let (user, session, seq) = after.clone().unwrap_or_default();
            let rows: Vec<EventRow> = diesel::sql_query(format!(
                "SELECT e.user_id, e.session_id, e.seq, e.event_id, e.invocation_id, e.author, e.event_ts,
                    e.created_at, e.payload::text AS payload,
                    CASE WHEN e.blob_refs IS NOT NULL
                         THEN ARRAY(SELECT pg_catalog.encode(r.hash, 'hex')
                                      FROM unnest(e.blob_refs) WITH ORDINALITY AS r (hash, n) ORDER BY r.n) END
                        AS blob_refs,
                    s.display_name, s.labels::text AS labels, s.created_at AS session_created_at
               FROM ONLY {partition} e
               LEFT JOIN adk_sessions s
                 ON s.app_name = e.app_name AND s.user_id = e.user_id AND s.session_id = e.session_id
              WHERE e.app_name = $1 AND e.session_day = $7
                AND ($2 OR (e.user_id, e.session_id, e.seq) > ($3, $4, $5))
              ORDER BY e.user_id, e.session_id, e.seq
              LIMIT $6"
            ))
            .bind::<Text, _>(app)
            .bind::<diesel::sql_types::Bool, _>(after.is_none())
            .bind::<Text, _>(&user)
            .bind::<Text, _>(&session)
            .bind::<BigInt, _>(seq)
            .bind::<BigInt, _>(config.batch_rows.max(1))
            .bind::<Date, _>(day)
            .load(conn)
            .await
            .map_err(ArchiveError::query("read a batch of the day's events"))?;
            let Some(last) = rows.last() else { break };
            after = Some((last.user_id.clone(), last.session_id.clone(), last.seq));
            streamed += i64::try_from(rows.len()).unwrap_or(i64::MAX);
            let batch: Vec<ArchivedEvent> = rows
                .into_iter()
                .map(|row| {
                    if let Some(refs) = &row.blob_refs {
                        hashes.extend(refs.iter().cloned());
                    }
                    ArchivedEvent {
                        app_name: app.to_owned(),
                        user_id: row.user_id,
                        session_id: row.session_id,
                        session_day: day,
                        seq: row.seq,
                        event_id: row.event_id,
                        invocation_id: row.invocation_id,
                        author: row.author,
                        event_ts: row.event_ts,
                        created_at: row.created_at,
                        payload: row.payload,
                        blob_refs: row.blob_refs,
                        session_display_name: row.display_name,
                        session_labels: row.labels,
                        session_created_at: row.session_created_at,
                    }
                })
                .collect();
            events.write(&events_batch(&batch)?).await?;
        }
        Ok(())
    }
    .await;
    if let Err(error) = streaming {
        events.abandon().await;
        return Err(error);
    }
    let mut written = events.finish().await?;
    if streamed != count {
        return Err(ArchiveError::Unverified {
            key: folder.to_string(),
            reason: format!("{streamed} events streamed, {count} counted: the day changed while it was archived"),
        });
    }

    // 3. The media the day's events name, a few pieces per statement (a
    //    piece may be 32 MiB).
    let mut media_written = Vec::new();
    if !hashes.is_empty() {
        let mut media = PartWriter::new(
            Arc::clone(&destination.store),
            folder.clone(),
            "media",
            media_schema(),
            writer_properties(config.row_group_rows),
            config.part_bytes,
        );
        let wanted: Vec<String> = hashes.into_iter().collect();
        let copying: Result<(), ArchiveError> = async {
        for chunk in wanted.chunks(8) {
            let blobs: Vec<BlobRow> = diesel::sql_query(
                "SELECT pg_catalog.encode(b.sha256, 'hex') AS sha256, b.data FROM adk_blobs b
                  WHERE b.app_name = $1 AND b.sha256 = ANY (ARRAY(SELECT pg_catalog.decode(h, 'hex') FROM unnest($2::text[]) h))
                  ORDER BY b.sha256",
            )
            .bind::<Text, _>(app)
            .bind::<Array<Text>, _>(chunk)
            .load(conn)
            .await
            .map_err(ArchiveError::query("read the media of the day's events"))?;
            if blobs.len() != chunk.len() {
                return Err(ArchiveError::Unverified {
                    key: folder.to_string(),
                    reason: format!("{} of {} pieces of media the events name are stored", blobs.len(), chunk.len()),
                });
            }
            let batch: Vec<ArchivedBlob> = blobs
                .into_iter()
                .map(|blob| ArchivedBlob { app_name: app.to_owned(), sha256: blob.sha256, data: blob.data })
                .collect();
            media.write(&media_batch(&batch)?).await?;
        }
        Ok(())
        }
        .await;
        if let Err(error) = copying {
            media.abandon().await;
            return Err(error);
        }
        media_written = media.finish().await?;
    }

    // 4. Read everything back.
    for object in written.iter().chain(&media_written) {
        verify_object(&destination.store, object).await?;
    }

    // 5. The manifest, then the catalog, in one transaction per day.
    let objects: Vec<(&str, &WrittenObject)> =
        written.iter().map(|o| ("events", o)).chain(media_written.iter().map(|o| ("media", o))).collect();
    write_manifest(destination, &folder, app, day, count, &objects).await?;
    record(conn, destination, app, day, count, &objects).await?;
    let keep: BTreeSet<String> = objects.iter().map(|(_, o)| o.key.clone()).collect();
    sweep(destination, &folder, &keep).await?;

    let bytes = objects.iter().map(|(_, o)| o.bytes).sum();
    let objects_len = objects.len();
    written.extend(media_written);
    tracing::info!(app, %day, events = count, objects = objects_len, bytes, "archived an app's day");
    Ok(DayArchived {
        app_name: app.to_owned(),
        day,
        events: count,
        objects: objects_len,
        bytes,
        already_archived: false,
    })
}

#[derive(Serialize)]
struct Manifest<'a> {
    format_version: i32,
    app_name: &'a str,
    day: NaiveDate,
    events: i64,
    objects: Vec<ManifestObject<'a>>,
    written_at: DateTime<Utc>,
}

#[derive(Serialize)]
struct ManifestObject<'a> {
    kind: &'a str,
    part: i32,
    key: &'a str,
    rows: i64,
    bytes: i64,
    sha256: String,
}

/// `manifest.json` beside the day's objects: what a reader without the
/// database needs to check the folder is whole.
pub(crate) async fn write_manifest(
    destination: &Destination,
    folder: &Path,
    app: &str,
    day: NaiveDate,
    events: i64,
    objects: &[(&str, &WrittenObject)],
) -> Result<(), ArchiveError> {
    let manifest = Manifest {
        format_version: FORMAT_VERSION,
        app_name: app,
        day,
        events,
        objects: objects
            .iter()
            .map(|(kind, o)| ManifestObject {
                kind,
                part: o.part,
                key: &o.key,
                rows: o.rows,
                bytes: o.bytes,
                sha256: hex(&o.sha256),
            })
            .collect(),
        written_at: Utc::now(),
    };
    let text = serde_json::to_vec_pretty(&manifest)
        .map_err(|e| ArchiveError::InvalidInput { field: "manifest", reason: e.to_string() })?;
    let key = folder.clone().join("manifest.json");
    destination.store.put(&key, text.into()).await.map_err(|e| ArchiveError::storage(key.as_ref(), e))?;
    Ok(())
}

/// Replaces the catalog's rows of an app's day with `objects`, and marks
/// the day's open failures resolved, in one transaction.
async fn record(
    conn: &mut AsyncPgConnection,
    destination: &Destination,
    app: &str,
    day: NaiveDate,
    events: i64,
    objects: &[(&str, &WrittenObject)],
) -> Result<(), ArchiveError> {
    let kinds: Vec<&str> = objects.iter().map(|(kind, _)| *kind).collect();
    let parts: Vec<i32> = objects.iter().map(|(_, o)| o.part).collect();
    let keys: Vec<&str> = objects.iter().map(|(_, o)| o.key.as_str()).collect();
    let rows: Vec<i64> = objects.iter().map(|(_, o)| o.rows).collect();
    let bytes: Vec<i64> = objects.iter().map(|(_, o)| o.bytes).collect();
    let hashes: Vec<&[u8]> = objects.iter().map(|(_, o)| o.sha256.as_slice()).collect();
    let url = destination.url.clone();
    let app = app.to_owned();
    conn.transaction::<_, diesel::result::Error, _>(async move |conn| {
        diesel::sql_query("DELETE FROM adk_archive_objects WHERE app_name = $1 AND day = $2")
            .bind::<Text, _>(&app)
            .bind::<Date, _>(day)
            .execute(conn)
            .await?;
        diesel::sql_query(
            "INSERT INTO adk_archive_objects
                 (app_name, day, kind, part, object_key, destination, rows, bytes, sha256, format_version, day_events)
             SELECT $1, $2, o.kind, o.part, o.object_key, $3, o.rows, o.bytes, o.sha256, $4, $5
               FROM unnest($6::text[], $7::integer[], $8::text[], $9::bigint[], $10::bigint[], $11::bytea[])
                    AS o (kind, part, object_key, rows, bytes, sha256)",
        )
        .bind::<Text, _>(&app)
        .bind::<Date, _>(day)
        .bind::<Text, _>(&url)
        .bind::<Integer, _>(FORMAT_VERSION)
        .bind::<BigInt, _>(events)
        .bind::<Array<Text>, _>(&kinds)
        .bind::<Array<Integer>, _>(&parts)
        .bind::<Array<Text>, _>(&keys)
        .bind::<Array<BigInt>, _>(&rows)
        .bind::<Array<BigInt>, _>(&bytes)
        .bind::<Array<Bytea>, _>(&hashes)
        .execute(conn)
        .await?;
        diesel::sql_query(
            "UPDATE adk_archive_failures SET resolved_at = now()
              WHERE app_name = $1 AND day = $2 AND resolved_at IS NULL",
        )
        .bind::<Text, _>(&app)
        .bind::<Date, _>(day)
        .execute(conn)
        .await?;
        Ok(())
    })
    .await
    .map_err(ArchiveError::query("record the archived day in the catalog"))
}

/// Records that an app's day failed to archive (the day is kept).
pub async fn record_failure(
    conn: &mut AsyncPgConnection,
    app: &str,
    day: NaiveDate,
    error: &ArchiveError,
) -> Result<(), ArchiveError> {
    diesel::sql_query("INSERT INTO adk_archive_failures (app_name, day, error) VALUES ($1, $2, $3)")
        .bind::<Text, _>(app)
        .bind::<Date, _>(day)
        .bind::<Text, _>(error.to_string())
        .execute(conn)
        .await
        .map_err(ArchiveError::query("record an archive failure"))?;
    Ok(())
}

/// Deletes objects under `folder` that are neither in `keep` nor the
/// manifest: parts an interrupted or earlier run left, which no catalog row
/// names.
pub(crate) async fn sweep(
    destination: &Destination,
    folder: &Path,
    keep: &BTreeSet<String>,
) -> Result<(), ArchiveError> {
    let mut listing = destination.store.list(Some(folder));
    let manifest = folder.clone().join("manifest.json").to_string();
    let mut stale = Vec::new();
    while let Some(meta) = listing.next().await {
        let meta = meta.map_err(|e| ArchiveError::storage(folder.as_ref(), e))?;
        let key = meta.location.to_string();
        if key != manifest && !keep.contains(&key) {
            stale.push(meta.location);
        }
    }
    for key in stale {
        tracing::info!(key = %key, "deleting an archive object no catalog row names");
        destination.store.delete(&key).await.map_err(|e| ArchiveError::storage(key.as_ref(), e))?;
    }
    Ok(())
}
