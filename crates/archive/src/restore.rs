//! Loading an archived day back, for an audit or a legal hold: into a
//! schema of its own, never the live log's, in tables no append reaches and
//! a trigger keeps read-only. Each object is checked against its catalog
//! row before a row of it is loaded. Restoring the same day again replaces
//! it, in one transaction.

use std::collections::BTreeMap;

use chrono::NaiveDate;
use diesel::sql_types::{Array, BigInt, Date, Nullable, Text, Timestamptz};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use futures_util::StreamExt as _;
use object_store::path::Path;
use serde::Serialize;

use crate::destination::{Destination, StoreOptions};
use crate::format::{ArchivedBlob, ArchivedEvent, events_of, media_of};
use crate::object::{open_batches, verify_object};
use crate::write::catalog_of;
use crate::{ArchiveError, require_owner};
use adk_postgres_schema::quote::quote_ident;

/// Where `adk-pg archive restore` loads a day unless told otherwise.
pub const DEFAULT_RESTORE_SCHEMA: &str = "adk_restored";

/// What a restore loaded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RestoreReport {
    /// The schema the day was loaded into.
    pub schema: String,
    /// The app.
    pub app_name: String,
    /// The day (UTC).
    pub day: NaiveDate,
    /// Events loaded.
    pub events: i64,
    /// Pieces of media loaded.
    pub media: i64,
    /// Objects read.
    pub objects: usize,
}

/// The restored tables of a schema, made when missing, read-only to all but
/// the restore and the erasure.
///
/// The lock the triggers need is taken before the REVOKE updates the
/// tables' `pg_class` rows: an ANALYZE of an earlier restore's rows
/// (autovacuum's) holds a lock that conflicts with it and ends by updating
/// those rows, so taking the lock after them would deadlock with it.
pub(crate) fn restored_tables_sql(schema: &str, store_schema: &str) -> String {
    let s = quote_ident(schema);
    let guard = format!("{}.adk_archive_read_only()", quote_ident(store_schema));
    format!(
        "CREATE SCHEMA IF NOT EXISTS {s};
         CREATE TABLE IF NOT EXISTS {s}.adk_restored_events (
             app_name text NOT NULL, user_id text NOT NULL, session_id text NOT NULL, session_day date NOT NULL,
             seq bigint NOT NULL, event_id text NOT NULL, invocation_id text, author text NOT NULL,
             event_ts bigint NOT NULL, created_at timestamptz NOT NULL, payload jsonb NOT NULL, blob_refs bytea[],
             session_display_name text, session_labels jsonb, session_created_at timestamptz,
             PRIMARY KEY (app_name, user_id, session_id, session_day, seq));
         CREATE TABLE IF NOT EXISTS {s}.adk_restored_blobs (
             app_name text NOT NULL, day date NOT NULL, sha256 bytea NOT NULL, size bigint NOT NULL,
             data bytea NOT NULL, PRIMARY KEY (app_name, day, sha256));
         LOCK TABLE {s}.adk_restored_events, {s}.adk_restored_blobs IN SHARE ROW EXCLUSIVE MODE;
         REVOKE ALL ON {s}.adk_restored_events, {s}.adk_restored_blobs FROM PUBLIC;
         CREATE OR REPLACE TRIGGER adk_read_only BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE
             ON {s}.adk_restored_events FOR EACH STATEMENT EXECUTE FUNCTION {guard};
         CREATE OR REPLACE TRIGGER adk_read_only BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE
             ON {s}.adk_restored_blobs FOR EACH STATEMENT EXECUTE FUNCTION {guard};"
    )
}

/// Loads `app`'s archived `day` into `schema` (made if missing). Only the
/// store's owner restores; the live log's schema is refused.
pub async fn restore_day(
    conn: &mut AsyncPgConnection,
    app: &str,
    day: NaiveDate,
    schema: &str,
    options: &StoreOptions,
) -> Result<RestoreReport, ArchiveError> {
    require_owner(conn, "restoring from the archive").await?;
    let store_schema = adk_postgres_operations::events_schema(conn).await?;
    if schema.is_empty() || schema.len() > 63 {
        return Err(ArchiveError::InvalidInput { field: "schema", reason: "must be 1 to 63 bytes".into() });
    }
    if schema == store_schema || schema.starts_with("pg_") || schema == "information_schema" {
        return Err(ArchiveError::InvalidInput {
            field: "schema",
            reason: format!("{schema} is not a schema a restored day may go into: it must never mix with the live log"),
        });
    }
    let catalog = catalog_of(conn, app, day).await?;
    let objects = catalog.len();
    if catalog.is_empty() {
        return Err(ArchiveError::NotArchived { app: app.to_owned(), day });
    }
    // Checked against the catalog before anything is loaded.
    let mut destinations: BTreeMap<String, Destination> = BTreeMap::new();
    for row in &catalog {
        if !destinations.contains_key(&row.destination) {
            destinations.insert(row.destination.clone(), Destination::open_with(&row.destination, options)?);
        }
        if let Some(destination) = destinations.get(&row.destination) {
            verify_object(&destination.store, &row.written()).await?;
        }
    }

    let setup = restored_tables_sql(schema, &store_schema);
    let s = quote_ident(schema);
    let app_owned = app.to_owned();
    let (events, media) = conn
        .transaction::<_, ArchiveError, _>(async move |conn| {
            conn.batch_execute(&setup).await.map_err(ArchiveError::query("make the restore schema"))?;
            conn.batch_execute("SET LOCAL adk.archive_writer = 'on'")
                .await
                .map_err(ArchiveError::query("open the restore for writing"))?;
            for table in ["adk_restored_events", "adk_restored_blobs"] {
                diesel::sql_query(format!(
                    "DELETE FROM {s}.{table} WHERE app_name = $1 AND {} = $2",
                    if table == "adk_restored_events" { "session_day" } else { "day" }
                ))
                .bind::<Text, _>(&app_owned)
                .bind::<Date, _>(day)
                .execute(conn)
                .await
                .map_err(ArchiveError::query("clear an earlier restore of the day"))?;
            }
            let (mut events, mut media) = (0_i64, 0_i64);
            for row in &catalog {
                let Some(destination) = destinations.get(&row.destination) else { continue };
                let key = Path::parse(&row.object_key)
                    .map_err(|e| ArchiveError::Unverified { key: row.object_key.clone(), reason: e.to_string() })?;
                let mut stream = open_batches(&destination.store, &key, None).await?;
                while let Some(batch) = stream.next().await {
                    let batch = batch.map_err(ArchiveError::parquet(key.as_ref()))?;
                    if row.kind == "events" {
                        events += insert_events(conn, &s, &events_of(&batch)?).await?;
                    } else {
                        media += insert_media(conn, &s, day, &media_of(&batch)?).await?;
                    }
                }
            }
            diesel::sql_query(
                "INSERT INTO adk_archive_restores (schema_name, app_name, day, rows) VALUES ($1, $2, $3, $4)
                 ON CONFLICT (schema_name, app_name, day)
                 DO UPDATE SET rows = EXCLUDED.rows, restored_at = now(), restored_by = current_user",
            )
            .bind::<Text, _>(schema)
            .bind::<Text, _>(&app_owned)
            .bind::<Date, _>(day)
            .bind::<BigInt, _>(events)
            .execute(conn)
            .await
            .map_err(ArchiveError::query("record the restore"))?;
            Ok((events, media))
        })
        .await?;
    tracing::info!(app, %day, schema, events, media, "restored an archived day");
    Ok(RestoreReport { schema: schema.to_owned(), app_name: app.to_owned(), day, events, media, objects })
}

async fn insert_events(
    conn: &mut AsyncPgConnection,
    schema: &str,
    rows: &[ArchivedEvent],
) -> Result<i64, ArchiveError> {
    if rows.is_empty() {
        return Ok(0);
    }
    let col = |f: fn(&ArchivedEvent) -> String| rows.iter().map(f).collect::<Vec<String>>();
    let days: Vec<NaiveDate> = rows.iter().map(|r| r.session_day).collect();
    let seqs: Vec<i64> = rows.iter().map(|r| r.seq).collect();
    let ts: Vec<i64> = rows.iter().map(|r| r.event_ts).collect();
    let created: Vec<chrono::DateTime<chrono::Utc>> = rows.iter().map(|r| r.created_at).collect();
    let invocations: Vec<Option<&str>> = rows.iter().map(|r| r.invocation_id.as_deref()).collect();
    let refs: Vec<Option<String>> = rows.iter().map(|r| r.blob_refs.as_ref().map(|h| h.join(","))).collect();
    let names: Vec<Option<&str>> = rows.iter().map(|r| r.session_display_name.as_deref()).collect();
    let labels: Vec<Option<&str>> = rows.iter().map(|r| r.session_labels.as_deref()).collect();
    let session_created: Vec<Option<chrono::DateTime<chrono::Utc>>> =
        rows.iter().map(|r| r.session_created_at).collect();
    let inserted = diesel::sql_query(format!(
        "INSERT INTO {schema}.adk_restored_events
         SELECT r.app_name, r.user_id, r.session_id, r.session_day, r.seq, r.event_id, r.invocation_id, r.author,
                r.event_ts, r.created_at, r.payload::jsonb,
                CASE WHEN r.refs IS NOT NULL THEN
                     ARRAY(SELECT pg_catalog.decode(h, 'hex') FROM unnest(pg_catalog.string_to_array(r.refs, ',')) h) END,
                r.display_name, r.labels::jsonb, r.session_created_at
           FROM unnest($1::text[], $2::text[], $3::text[], $4::date[], $5::bigint[], $6::text[], $7::text[],
                       $8::text[], $9::bigint[], $10::timestamptz[], $11::text[], $12::text[], $13::text[],
                       $14::text[], $15::timestamptz[])
                AS r (app_name, user_id, session_id, session_day, seq, event_id, invocation_id, author, event_ts,
                      created_at, payload, refs, display_name, labels, session_created_at)"
    ))
    .bind::<Array<Text>, _>(col(|r| r.app_name.clone()))
    .bind::<Array<Text>, _>(col(|r| r.user_id.clone()))
    .bind::<Array<Text>, _>(col(|r| r.session_id.clone()))
    .bind::<Array<Date>, _>(days)
    .bind::<Array<BigInt>, _>(seqs)
    .bind::<Array<Text>, _>(col(|r| r.event_id.clone()))
    .bind::<Array<Nullable<Text>>, _>(invocations)
    .bind::<Array<Text>, _>(col(|r| r.author.clone()))
    .bind::<Array<BigInt>, _>(ts)
    .bind::<Array<Timestamptz>, _>(created)
    .bind::<Array<Text>, _>(col(|r| r.payload.clone()))
    .bind::<Array<Nullable<Text>>, _>(refs)
    .bind::<Array<Nullable<Text>>, _>(names)
    .bind::<Array<Nullable<Text>>, _>(labels)
    .bind::<Array<Nullable<Timestamptz>>, _>(session_created)
    .execute(conn)
    .await
    .map_err(ArchiveError::query("load a batch of archived events"))?;
    Ok(i64::try_from(inserted).unwrap_or(i64::MAX))
}

async fn insert_media(
    conn: &mut AsyncPgConnection,
    schema: &str,
    day: NaiveDate,
    blobs: &[ArchivedBlob],
) -> Result<i64, ArchiveError> {
    let mut inserted = 0;
    for blob in blobs {
        inserted += diesel::sql_query(format!(
            "INSERT INTO {schema}.adk_restored_blobs (app_name, day, sha256, size, data)
             VALUES ($1, $2, pg_catalog.decode($3, 'hex'), pg_catalog.length($4), $4)"
        ))
        .bind::<Text, _>(&blob.app_name)
        .bind::<Date, _>(day)
        .bind::<Text, _>(&blob.sha256)
        .bind::<diesel::sql_types::Bytea, _>(&blob.data)
        .execute(conn)
        .await
        .map_err(ArchiveError::query("load a piece of archived media"))?;
    }
    Ok(i64::try_from(inserted).unwrap_or(i64::MAX))
}

/// Whether some day of `app` was restored (and an erasure must reach it).
/// Only the owner sees the list; for any other role it is empty.
pub async fn has_restored_copies(conn: &mut AsyncPgConnection, app: &str) -> Result<bool, ArchiveError> {
    #[derive(diesel::QueryableByName)]
    struct Found {
        #[diesel(sql_type = diesel::sql_types::Bool)]
        found: bool,
    }
    Ok(diesel::sql_query("SELECT EXISTS (SELECT 1 FROM adk_archive_restores WHERE app_name = $1) AS found")
        .bind::<Text, _>(app)
        .load::<Found>(conn)
        .await
        .map_err(ArchiveError::query("look for restored copies"))?
        .into_iter()
        .any(|row| row.found))
}
