//! Reading and writing the rows of a level. Every read is bounded by a
//! literal bucket_start range on the partition column, so the planner
//! prunes to the partitions of the range.

use std::collections::BTreeMap;

use adk_postgres_schema::quote::quote_ident;
use bigdecimal::BigDecimal;
use chrono::{DateTime, Utc};
use diesel::QueryableByName;
use diesel::sql_types::{Array, BigInt, Bool, Bytea, Integer, Nullable, Numeric, Text, Timestamptz};
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use crate::bucket::{Aggregate, Author, BucketKey, Kind, Level};
use crate::sketch::{Distinct, Quantiles, SketchError};

/// Columns of a level's row, in table order after the key.
pub(crate) const ROW_COLUMNS: &str = "app_name, author, folded, kind, bucket_start, events, payload_bytes, \
     payload_bytes_min, payload_bytes_max, prompt_tokens, candidates_tokens, total_tokens, cost, cost_events, \
     errors, latency_count, latency_sketch, size_sketch, sessions_sketch, users_sketch, folded_authors";

#[derive(QueryableByName)]
pub(crate) struct LevelRow {
    #[diesel(sql_type = Text)]
    pub app_name: String,
    #[diesel(sql_type = Text)]
    pub author: String,
    #[diesel(sql_type = Bool)]
    pub folded: bool,
    #[diesel(sql_type = Text)]
    pub kind: String,
    #[diesel(sql_type = Timestamptz)]
    pub bucket_start: DateTime<Utc>,
    #[diesel(sql_type = BigInt)]
    pub events: i64,
    #[diesel(sql_type = BigInt)]
    pub payload_bytes: i64,
    #[diesel(sql_type = Integer)]
    pub payload_bytes_min: i32,
    #[diesel(sql_type = Integer)]
    pub payload_bytes_max: i32,
    #[diesel(sql_type = BigInt)]
    pub prompt_tokens: i64,
    #[diesel(sql_type = BigInt)]
    pub candidates_tokens: i64,
    #[diesel(sql_type = BigInt)]
    pub total_tokens: i64,
    #[diesel(sql_type = Nullable<Numeric>)]
    pub cost: Option<BigDecimal>,
    #[diesel(sql_type = BigInt)]
    pub cost_events: i64,
    #[diesel(sql_type = BigInt)]
    pub errors: i64,
    #[diesel(sql_type = BigInt)]
    pub latency_count: i64,
    #[diesel(sql_type = Bytea)]
    pub latency_sketch: Vec<u8>,
    #[diesel(sql_type = Bytea)]
    pub size_sketch: Vec<u8>,
    #[diesel(sql_type = Bytea)]
    pub sessions_sketch: Vec<u8>,
    #[diesel(sql_type = Bytea)]
    pub users_sketch: Vec<u8>,
    #[diesel(sql_type = Nullable<Bytea>)]
    pub folded_authors: Option<Vec<u8>>,
}

impl LevelRow {
    /// The row as a key and its aggregate; a sketch or kind that cannot be
    /// read is an error naming the column, never a silently empty bucket.
    pub(crate) fn decode(self) -> Result<(BucketKey, Aggregate), DecodeError> {
        let kind: Kind = self.kind.parse().map_err(DecodeError::Kind)?;
        let aggregate = Aggregate {
            events: self.events,
            payload_bytes: self.payload_bytes,
            payload_bytes_min: self.payload_bytes_min,
            payload_bytes_max: self.payload_bytes_max,
            prompt_tokens: self.prompt_tokens,
            candidates_tokens: self.candidates_tokens,
            total_tokens: self.total_tokens,
            cost: self.cost,
            cost_events: self.cost_events,
            errors: self.errors,
            latency: Quantiles::decode("latency_sketch", &self.latency_sketch)?,
            size: Quantiles::decode("size_sketch", &self.size_sketch)?,
            sessions: Distinct::decode("sessions_sketch", &self.sessions_sketch)?,
            users: Distinct::decode("users_sketch", &self.users_sketch)?,
            folded_authors: self.folded_authors.map(|b| Distinct::decode("folded_authors", &b)).transpose()?,
        };
        if u64::try_from(self.latency_count).ok() != Some(aggregate.latency.count()) {
            return Err(DecodeError::Mismatch(format!(
                "latency_count is {} but latency_sketch holds {} values",
                self.latency_count,
                aggregate.latency.count()
            )));
        }
        let key = BucketKey {
            app: self.app_name,
            start: self.bucket_start,
            author: Author::from_columns(self.author, self.folded),
            kind,
        };
        Ok((key, aggregate))
    }
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum DecodeError {
    #[error(transparent)]
    Sketch(#[from] SketchError),
    #[error("kind: {0}")]
    Kind(String),
    #[error("{0}")]
    Mismatch(String),
}

/// App-and-range windows of one level, sent as three parallel arrays.
#[derive(Debug, Default)]
pub(crate) struct Windows {
    pub apps: Vec<String>,
    pub from: Vec<DateTime<Utc>>,
    pub to: Vec<DateTime<Utc>>,
}

impl Windows {
    pub fn push(&mut self, app: &str, from: DateTime<Utc>, to: DateTime<Utc>) {
        self.apps.push(app.to_owned());
        self.from.push(from);
        self.to.push(to);
    }

    pub fn is_empty(&self) -> bool {
        self.apps.is_empty()
    }

    /// The smallest range covering every window: the literal bounds that
    /// let the planner prune.
    fn span(&self) -> Option<(DateTime<Utc>, DateTime<Utc>)> {
        Some((*self.from.iter().min()?, *self.to.iter().max()?))
    }
}

/// Every row of `level` inside any of `windows`, in key order (so sketches
/// merge in the same order, and a recomputed bucket gets the same bytes).
/// Each window is an index range scan of its own (`LATERAL`, kept from
/// being flattened by `OFFSET 0`): as a plain join, the planner matches on
/// the app alone and compares every window with every row of the app.
pub(crate) async fn load(
    conn: &mut AsyncPgConnection,
    level: Level,
    windows: &Windows,
) -> Result<Vec<LevelRow>, diesel::result::Error> {
    let Some((lo, hi)) = windows.span() else { return Ok(Vec::new()) };
    let table = quote_ident(level.table());
    diesel::sql_query(format!(
        "SELECT u.* FROM unnest($1::text[], $2::timestamptz[], $3::timestamptz[]) AS w(app, lo, hi)
         CROSS JOIN LATERAL (
             SELECT {ROW_COLUMNS} FROM {table} t
             WHERE t.app_name = w.app AND t.bucket_start >= w.lo AND t.bucket_start < w.hi
               AND t.bucket_start >= $4 AND t.bucket_start < $5
             OFFSET 0) AS u
         ORDER BY u.app_name, u.bucket_start, u.author, u.kind, u.folded",
    ))
    .bind::<Array<Text>, _>(&windows.apps)
    .bind::<Array<Timestamptz>, _>(&windows.from)
    .bind::<Array<Timestamptz>, _>(&windows.to)
    .bind::<Timestamptz, _>(lo)
    .bind::<Timestamptz, _>(hi)
    .load::<LevelRow>(conn)
    .await
}

/// Replaces every row of the buckets `windows` name by `rows`. Each window
/// is one bucket of `level` (its start is the bucket), so rows are deleted
/// by equality on (app, bucket start), the primary key's prefix.
pub(crate) async fn replace(
    conn: &mut AsyncPgConnection,
    level: Level,
    windows: &Windows,
    rows: &BTreeMap<BucketKey, Aggregate>,
) -> Result<(), diesel::result::Error> {
    let Some((lo, hi)) = windows.span() else { return Ok(()) };
    let table = quote_ident(level.table());
    diesel::sql_query(format!(
        "DELETE FROM {table} u
         USING unnest($1::text[], $2::timestamptz[]) AS w(app, bucket)
         WHERE u.app_name = w.app AND u.bucket_start = w.bucket
           AND u.bucket_start >= $3 AND u.bucket_start < $4"
    ))
    .bind::<Array<Text>, _>(&windows.apps)
    .bind::<Array<Timestamptz>, _>(&windows.from)
    .bind::<Timestamptz, _>(lo)
    .bind::<Timestamptz, _>(hi)
    .execute(conn)
    .await?;
    let entries: Vec<(&BucketKey, &Aggregate)> = rows.iter().collect();
    // Sketches make rows a few kB at most; a few thousand per statement
    // keeps one statement's parameters well under a megabyte or so.
    for chunk in entries.chunks(2_000) {
        insert(conn, &table, chunk).await?;
    }
    Ok(())
}

async fn insert(
    conn: &mut AsyncPgConnection,
    table: &str,
    rows: &[(&BucketKey, &Aggregate)],
) -> Result<(), diesel::result::Error> {
    let mut apps = Vec::with_capacity(rows.len());
    let mut authors = Vec::with_capacity(rows.len());
    let mut folded = Vec::with_capacity(rows.len());
    let mut kinds = Vec::with_capacity(rows.len());
    let mut starts = Vec::with_capacity(rows.len());
    let mut ints: [Vec<i64>; 6] = Default::default();
    let mut mins = Vec::with_capacity(rows.len());
    let mut maxes = Vec::with_capacity(rows.len());
    let mut costs = Vec::with_capacity(rows.len());
    let mut errors = Vec::with_capacity(rows.len());
    let mut latency_count = Vec::with_capacity(rows.len());
    let mut sketches: [Vec<Vec<u8>>; 4] = Default::default();
    let mut folded_authors = Vec::with_capacity(rows.len());
    for (key, aggregate) in rows {
        let (author, is_folded) = key.author.columns();
        apps.push(key.app.as_str());
        authors.push(author);
        folded.push(is_folded);
        kinds.push(key.kind.as_str());
        starts.push(key.start);
        for (column, value) in ints.iter_mut().zip([
            aggregate.events,
            aggregate.payload_bytes,
            aggregate.prompt_tokens,
            aggregate.candidates_tokens,
            aggregate.total_tokens,
            aggregate.cost_events,
        ]) {
            column.push(value);
        }
        mins.push(aggregate.payload_bytes_min);
        maxes.push(aggregate.payload_bytes_max);
        costs.push(aggregate.cost.clone());
        errors.push(aggregate.errors);
        latency_count.push(i64::try_from(aggregate.latency.count()).unwrap_or(i64::MAX));
        for (column, value) in sketches.iter_mut().zip([
            aggregate.latency.encode(),
            aggregate.size.encode(),
            aggregate.sessions.encode(),
            aggregate.users.encode(),
        ]) {
            column.push(value);
        }
        folded_authors.push(aggregate.folded_authors.as_ref().map(Distinct::encode));
    }
    let [events, payload_bytes, prompt, candidates, total, cost_events] = ints;
    let [latency, size, sessions, users] = sketches;
    diesel::sql_query(format!(
        "INSERT INTO {table} ({ROW_COLUMNS})
         SELECT * FROM unnest($1::text[], $2::text[], $3::boolean[], $4::text[], $5::timestamptz[],
                              $6::bigint[], $7::bigint[], $8::integer[], $9::integer[], $10::bigint[],
                              $11::bigint[], $12::bigint[], $13::numeric[], $14::bigint[], $15::bigint[],
                              $16::bigint[], $17::bytea[], $18::bytea[], $19::bytea[], $20::bytea[], $21::bytea[])"
    ))
    .bind::<Array<Text>, _>(apps)
    .bind::<Array<Text>, _>(authors)
    .bind::<Array<Bool>, _>(folded)
    .bind::<Array<Text>, _>(kinds)
    .bind::<Array<Timestamptz>, _>(starts)
    .bind::<Array<BigInt>, _>(events)
    .bind::<Array<BigInt>, _>(payload_bytes)
    .bind::<Array<Integer>, _>(mins)
    .bind::<Array<Integer>, _>(maxes)
    .bind::<Array<BigInt>, _>(prompt)
    .bind::<Array<BigInt>, _>(candidates)
    .bind::<Array<BigInt>, _>(total)
    .bind::<Array<Nullable<Numeric>>, _>(costs)
    .bind::<Array<BigInt>, _>(cost_events)
    .bind::<Array<BigInt>, _>(errors)
    .bind::<Array<BigInt>, _>(latency_count)
    .bind::<Array<Bytea>, _>(latency)
    .bind::<Array<Bytea>, _>(size)
    .bind::<Array<Bytea>, _>(sessions)
    .bind::<Array<Bytea>, _>(users)
    .bind::<Array<Nullable<Bytea>>, _>(folded_authors)
    .execute(conn)
    .await?;
    Ok(())
}
