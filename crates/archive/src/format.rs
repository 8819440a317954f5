//! The archive's files, format version 1: what a row of an events object and
//! of a media object holds, and how rows become Arrow record batches and
//! back.
//!
//! The columns are the event log's, so an archived day reads like the
//! partition it came from: the payload as JSON text, `event_ts` as the
//! store's exact nanoseconds, and the session's metadata (display name,
//! labels, creation time) beside every event, so one object answers "what
//! was this conversation" without the database. Media an event names by
//! hash (`blob_refs`, hex) is in the day's media objects.

use std::sync::Arc;

use arrow_array::builder::{
    BinaryBuilder, Date32Builder, Int64Builder, ListBuilder, StringBuilder, TimestampMicrosecondBuilder,
};
use arrow_array::cast::AsArray;
use arrow_array::types::{Date32Type, Int64Type, TimestampMicrosecondType};
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};
use chrono::{DateTime, NaiveDate, Utc};
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::schema::types::ColumnPath;

use crate::ArchiveError;

/// The version of the files this build writes, recorded in the catalog,
/// the manifest and the files' key-value metadata.
pub const FORMAT_VERSION: i32 = 1;

/// One archived event, with its session's metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchivedEvent {
    /// The app.
    pub app_name: String,
    /// The user.
    pub user_id: String,
    /// The session.
    pub session_id: String,
    /// The session's day (UTC), the partition the event was in.
    pub session_day: NaiveDate,
    /// The event's position in its session, from 1.
    pub seq: i64,
    /// The event's id.
    pub event_id: String,
    /// The invocation that produced it, when the log names one.
    pub invocation_id: Option<String>,
    /// `user` or the agent's name.
    pub author: String,
    /// Nanoseconds since the epoch, as the log holds them.
    pub event_ts: i64,
    /// When the event arrived in the log.
    pub created_at: DateTime<Utc>,
    /// The stored event, JSON text.
    pub payload: String,
    /// Hex SHA-256 of each piece of media the event names, in its order.
    pub blob_refs: Option<Vec<String>>,
    /// The session's display name; `None` when it has none or the session
    /// row is gone.
    pub session_display_name: Option<String>,
    /// JSON text of the session's labels; `None` when the session row is
    /// gone.
    pub session_labels: Option<String>,
    /// When the session was created; `None` when the session row is gone.
    pub session_created_at: Option<DateTime<Utc>>,
}

/// One piece of media, as `adk_blobs` holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchivedBlob {
    /// The app whose events name it.
    pub app_name: String,
    /// Hex SHA-256 of `data`.
    pub sha256: String,
    /// The media's raw bytes.
    pub data: Vec<u8>,
}

fn utc() -> Option<Arc<str>> {
    Some(Arc::from("UTC"))
}

/// The schema of an events object.
pub fn events_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("app_name", DataType::Utf8, false),
        Field::new("user_id", DataType::Utf8, false),
        Field::new("session_id", DataType::Utf8, false),
        Field::new("session_day", DataType::Date32, false),
        Field::new("seq", DataType::Int64, false),
        Field::new("event_id", DataType::Utf8, false),
        Field::new("invocation_id", DataType::Utf8, true),
        Field::new("author", DataType::Utf8, false),
        Field::new("event_ts", DataType::Int64, false),
        Field::new("created_at", DataType::Timestamp(TimeUnit::Microsecond, utc()), false),
        Field::new("payload", DataType::Utf8, false),
        Field::new("blob_refs", DataType::List(Arc::new(Field::new("item", DataType::Utf8, true))), true),
        Field::new("session_display_name", DataType::Utf8, true),
        Field::new("session_labels", DataType::Utf8, true),
        Field::new("session_created_at", DataType::Timestamp(TimeUnit::Microsecond, utc()), true),
    ]))
}

/// The schema of a media object.
pub fn media_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("app_name", DataType::Utf8, false),
        Field::new("sha256", DataType::Utf8, false),
        Field::new("size", DataType::Int64, false),
        Field::new("data", DataType::Binary, false),
    ]))
}

/// How every object is written: zstd, statistics per page, and a bloom
/// filter on `user_id`, so an erasure skips the objects (and row groups)
/// that cannot hold its user without reading them. Row groups are bounded
/// in rows, so the writer's memory is bounded however large a day is.
pub fn writer_properties(row_group_rows: usize) -> WriterProperties {
    WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(3).unwrap_or_default()))
        .set_statistics_enabled(EnabledStatistics::Page)
        .set_max_row_group_row_count(Some(row_group_rows.max(1)))
        .set_column_bloom_filter_enabled(ColumnPath::from("user_id"), true)
        .set_column_bloom_filter_fpp(ColumnPath::from("user_id"), 0.01)
        .set_key_value_metadata(Some(vec![parquet::file::metadata::KeyValue::new(
            "adk_postgres_archive_format".to_owned(),
            FORMAT_VERSION.to_string(),
        )]))
        .build()
}

fn micros(at: DateTime<Utc>) -> i64 {
    at.timestamp_micros()
}

fn days_since_epoch(day: NaiveDate) -> i32 {
    let epoch = NaiveDate::from_ymd_opt(1970, 1, 1).unwrap_or_default();
    i32::try_from((day - epoch).num_days()).unwrap_or(i32::MAX)
}

fn day_of(days: i32) -> NaiveDate {
    let epoch = NaiveDate::from_ymd_opt(1970, 1, 1).unwrap_or_default();
    epoch + chrono::Days::new(u64::from(days.unsigned_abs()))
}

/// Rows to one record batch of [`events_schema`].
pub fn events_batch(rows: &[ArchivedEvent]) -> Result<RecordBatch, ArchiveError> {
    let mut app = StringBuilder::new();
    let mut user = StringBuilder::new();
    let mut session = StringBuilder::new();
    let mut day = Date32Builder::new();
    let mut seq = Int64Builder::new();
    let mut event_id = StringBuilder::new();
    let mut invocation = StringBuilder::new();
    let mut author = StringBuilder::new();
    let mut event_ts = Int64Builder::new();
    let mut created = TimestampMicrosecondBuilder::new().with_timezone("UTC");
    let mut payload = StringBuilder::new();
    let mut refs = ListBuilder::new(StringBuilder::new());
    let mut display = StringBuilder::new();
    let mut labels = StringBuilder::new();
    let mut session_created = TimestampMicrosecondBuilder::new().with_timezone("UTC");
    for row in rows {
        app.append_value(&row.app_name);
        user.append_value(&row.user_id);
        session.append_value(&row.session_id);
        day.append_value(days_since_epoch(row.session_day));
        seq.append_value(row.seq);
        event_id.append_value(&row.event_id);
        invocation.append_option(row.invocation_id.as_deref());
        author.append_value(&row.author);
        event_ts.append_value(row.event_ts);
        created.append_value(micros(row.created_at));
        payload.append_value(&row.payload);
        match &row.blob_refs {
            Some(hashes) => {
                for hash in hashes {
                    refs.values().append_value(hash);
                }
                refs.append(true);
            }
            None => refs.append(false),
        }
        display.append_option(row.session_display_name.as_deref());
        labels.append_option(row.session_labels.as_deref());
        session_created.append_option(row.session_created_at.map(micros));
    }
    let columns: Vec<ArrayRef> = vec![
        Arc::new(app.finish()),
        Arc::new(user.finish()),
        Arc::new(session.finish()),
        Arc::new(day.finish()),
        Arc::new(seq.finish()),
        Arc::new(event_id.finish()),
        Arc::new(invocation.finish()),
        Arc::new(author.finish()),
        Arc::new(event_ts.finish()),
        Arc::new(created.finish()),
        Arc::new(payload.finish()),
        Arc::new(refs.finish()),
        Arc::new(display.finish()),
        Arc::new(labels.finish()),
        Arc::new(session_created.finish()),
    ];
    RecordBatch::try_new(events_schema(), columns).map_err(ArchiveError::arrow("build a batch of events"))
}

/// Pieces of media to one record batch of [`media_schema`].
pub fn media_batch(blobs: &[ArchivedBlob]) -> Result<RecordBatch, ArchiveError> {
    let mut app = StringBuilder::new();
    let mut sha = StringBuilder::new();
    let mut size = Int64Builder::new();
    let mut data = BinaryBuilder::new();
    for blob in blobs {
        app.append_value(&blob.app_name);
        sha.append_value(&blob.sha256);
        size.append_value(i64::try_from(blob.data.len()).unwrap_or(i64::MAX));
        data.append_value(&blob.data);
    }
    let columns: Vec<ArrayRef> =
        vec![Arc::new(app.finish()), Arc::new(sha.finish()), Arc::new(size.finish()), Arc::new(data.finish())];
    RecordBatch::try_new(media_schema(), columns).map_err(ArchiveError::arrow("build a batch of media"))
}

fn column<'a>(batch: &'a RecordBatch, name: &str) -> Result<&'a ArrayRef, ArchiveError> {
    batch.column_by_name(name).ok_or_else(|| ArchiveError::Arrow {
        context: "read an archived batch".into(),
        source: arrow_schema::ArrowError::SchemaError(format!("no column {name}")),
    })
}

fn strings<'a>(batch: &'a RecordBatch, name: &str) -> Result<&'a arrow_array::GenericStringArray<i32>, ArchiveError> {
    column(batch, name)?.as_string_opt::<i32>().ok_or_else(|| ArchiveError::Arrow {
        context: "read an archived batch".into(),
        source: arrow_schema::ArrowError::SchemaError(format!("column {name} is not text")),
    })
}

fn text(array: &arrow_array::GenericStringArray<i32>, row: usize) -> Option<String> {
    array.is_valid(row).then(|| array.value(row).to_owned())
}

fn timestamp(array: &arrow_array::PrimitiveArray<TimestampMicrosecondType>, row: usize) -> Option<DateTime<Utc>> {
    if array.is_valid(row) { DateTime::from_timestamp_micros(array.value(row)) } else { None }
}

/// A record batch of [`events_schema`] back to rows.
pub fn events_of(batch: &RecordBatch) -> Result<Vec<ArchivedEvent>, ArchiveError> {
    let wrong = |name: &str| ArchiveError::Arrow {
        context: "read an archived batch".into(),
        source: arrow_schema::ArrowError::SchemaError(format!("column {name} has another type")),
    };
    let app = strings(batch, "app_name")?;
    let user = strings(batch, "user_id")?;
    let session = strings(batch, "session_id")?;
    let day = column(batch, "session_day")?.as_primitive_opt::<Date32Type>().ok_or_else(|| wrong("session_day"))?;
    let seq = column(batch, "seq")?.as_primitive_opt::<Int64Type>().ok_or_else(|| wrong("seq"))?;
    let event_id = strings(batch, "event_id")?;
    let invocation = strings(batch, "invocation_id")?;
    let author = strings(batch, "author")?;
    let event_ts = column(batch, "event_ts")?.as_primitive_opt::<Int64Type>().ok_or_else(|| wrong("event_ts"))?;
    let created = column(batch, "created_at")?
        .as_primitive_opt::<TimestampMicrosecondType>()
        .ok_or_else(|| wrong("created_at"))?;
    let payload = strings(batch, "payload")?;
    let refs = column(batch, "blob_refs")?.as_list_opt::<i32>().ok_or_else(|| wrong("blob_refs"))?;
    let display = strings(batch, "session_display_name")?;
    let labels = strings(batch, "session_labels")?;
    let session_created = column(batch, "session_created_at")?
        .as_primitive_opt::<TimestampMicrosecondType>()
        .ok_or_else(|| wrong("session_created_at"))?;
    let mut rows = Vec::with_capacity(batch.num_rows());
    for row in 0..batch.num_rows() {
        let blob_refs = if refs.is_valid(row) {
            let values = refs.value(row);
            let values = values.as_string_opt::<i32>().ok_or_else(|| wrong("blob_refs"))?;
            Some((0..values.len()).map(|i| values.value(i).to_owned()).collect())
        } else {
            None
        };
        rows.push(ArchivedEvent {
            app_name: app.value(row).to_owned(),
            user_id: user.value(row).to_owned(),
            session_id: session.value(row).to_owned(),
            session_day: day_of(day.value(row)),
            seq: seq.value(row),
            event_id: event_id.value(row).to_owned(),
            invocation_id: text(invocation, row),
            author: author.value(row).to_owned(),
            event_ts: event_ts.value(row),
            created_at: timestamp(created, row).unwrap_or_default(),
            payload: payload.value(row).to_owned(),
            blob_refs,
            session_display_name: text(display, row),
            session_labels: text(labels, row),
            session_created_at: timestamp(session_created, row),
        });
    }
    Ok(rows)
}

/// A record batch of [`media_schema`] back to pieces of media.
pub fn media_of(batch: &RecordBatch) -> Result<Vec<ArchivedBlob>, ArchiveError> {
    let app = strings(batch, "app_name")?;
    let sha = strings(batch, "sha256")?;
    let data = column(batch, "data")?.as_binary_opt::<i32>().ok_or_else(|| ArchiveError::Arrow {
        context: "read an archived batch".into(),
        source: arrow_schema::ArrowError::SchemaError("column data is not binary".into()),
    })?;
    Ok((0..batch.num_rows())
        .map(|row| ArchivedBlob {
            app_name: app.value(row).to_owned(),
            sha256: sha.value(row).to_owned(),
            data: data.value(row).to_vec(),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(seq: i64, refs: Option<Vec<String>>) -> ArchivedEvent {
        ArchivedEvent {
            app_name: "app".into(),
            user_id: "u".into(),
            session_id: "s".into(),
            session_day: NaiveDate::from_ymd_opt(2026, 3, 1).expect("day"),
            seq,
            event_id: format!("e{seq}"),
            invocation_id: (seq % 2 == 0).then(|| "inv".into()),
            author: "model".into(),
            event_ts: 1_772_323_200_123_456_789,
            created_at: DateTime::from_timestamp_micros(1_772_323_200_123_456).expect("time"),
            payload: r#"{"content":{"parts":[{"text":"héllo"}]}}"#.into(),
            blob_refs: refs,
            session_display_name: None,
            session_labels: Some(r#"{"team":"a"}"#.into()),
            session_created_at: DateTime::from_timestamp_micros(1_772_323_100_000_000),
        }
    }

    #[test]
    fn events_round_trip_through_a_batch() {
        let rows = vec![event(1, None), event(2, Some(vec!["ab".into(), "cd".into()])), event(3, Some(vec![]))];
        let batch = events_batch(&rows).expect("batch");
        assert_eq!(events_of(&batch).expect("rows"), rows);
    }

    #[test]
    fn media_round_trips_through_a_batch() {
        let blobs = vec![ArchivedBlob { app_name: "app".into(), sha256: "00ff".into(), data: vec![0, 1, 255] }];
        assert_eq!(media_of(&media_batch(&blobs).expect("batch")).expect("rows"), blobs);
    }
}
