//! Writing the archive's objects and reading them back.
//!
//! An object is written as it is encoded: each finished row group goes to
//! the store (a multipart upload past the first chunk), hashed on its way,
//! so memory holds one row group and one upload chunk however large the
//! day. A part closes at the size cap and the next one opens, so no single
//! object outgrows what a reader wants to fetch.
//!
//! Verifying reads the whole object back, hashes it and compares hash and
//! size with what was written, then reads the footer and compares the row
//! count: a flipped byte, a truncated upload or a foreign file all fail.

use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use futures_util::{FutureExt as _, StreamExt as _, TryFutureExt as _};
use object_store::buffered::BufWriter;
use object_store::path::Path;
use object_store::{GetOptions, GetRange, ObjectStore, ObjectStoreExt as _};
use parquet::arrow::arrow_reader::ArrowReaderOptions;
use parquet::arrow::async_reader::{AsyncFileReader, MetadataSuffixFetch};
use parquet::arrow::async_writer::AsyncFileWriter;
use parquet::arrow::{AsyncArrowWriter, ParquetRecordBatchStreamBuilder};
use parquet::errors::ParquetError;
use parquet::file::metadata::{ParquetMetaData, ParquetMetaDataReader};
use parquet::file::properties::WriterProperties;
use sha2::{Digest as _, Sha256};
use tokio::io::AsyncWriteExt as _;

use crate::ArchiveError;

/// An object written and read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrittenObject {
    /// The key within the store.
    pub key: String,
    /// Its number among the parts of its day and kind, from 0.
    pub part: i32,
    /// Rows it holds.
    pub rows: i64,
    /// Its size in bytes.
    pub bytes: i64,
    /// SHA-256 of the object's bytes.
    pub sha256: Vec<u8>,
}

/// The sink of one object: the store's buffered upload, hashed on the way.
struct HashingSink {
    inner: BufWriter,
    hasher: Sha256,
    bytes: u64,
}

impl AsyncFileWriter for HashingSink {
    fn write(&mut self, bs: Bytes) -> BoxFuture<'_, parquet::errors::Result<()>> {
        self.hasher.update(&bs);
        self.bytes += bs.len() as u64;
        Box::pin(async move { self.inner.write_all(&bs).await.map_err(|e| ParquetError::External(Box::new(e))) })
    }

    fn complete(&mut self) -> BoxFuture<'_, parquet::errors::Result<()>> {
        Box::pin(async move { self.inner.shutdown().await.map_err(|e| ParquetError::External(Box::new(e))) })
    }
}

struct OpenPart {
    writer: AsyncArrowWriter<HashingSink>,
    key: Path,
    part: i32,
    rows: i64,
}

/// Writes a stream of record batches as numbered parts under `folder`:
/// `<stem>-0000.parquet`, `<stem>-0001.parquet`, … A part is closed once
/// what it wrote passes `part_cap` bytes.
pub(crate) struct PartWriter {
    store: Arc<dyn ObjectStore>,
    folder: Path,
    stem: String,
    /// Set for a single object under a key of its own (a rewrite).
    fixed_key: Option<Path>,
    schema: SchemaRef,
    properties: WriterProperties,
    part_cap: u64,
    /// A row group is flushed early once it holds this much, so one of
    /// large payloads never grows past it in memory.
    flush_bytes: usize,
    open: Option<OpenPart>,
    written: Vec<WrittenObject>,
}

impl PartWriter {
    pub(crate) fn new(
        store: Arc<dyn ObjectStore>,
        folder: Path,
        stem: &str,
        schema: SchemaRef,
        properties: WriterProperties,
        part_cap: u64,
    ) -> Self {
        Self {
            store,
            folder,
            stem: stem.to_owned(),
            fixed_key: None,
            schema,
            properties,
            part_cap: part_cap.max(1),
            flush_bytes: 32 << 20,
            open: None,
            written: Vec::new(),
        }
    }

    /// One object at `key`, however large.
    pub(crate) fn single(
        store: Arc<dyn ObjectStore>,
        key: Path,
        schema: SchemaRef,
        properties: WriterProperties,
    ) -> Self {
        let mut writer = Self::new(store, Path::default(), "", schema, properties, u64::MAX);
        writer.fixed_key = Some(key);
        writer
    }

    /// Gives up the object being written: its upload is aborted, so no
    /// partial object is left behind.
    pub(crate) async fn abandon(mut self) {
        if let Some(open) = self.open.take() {
            let mut upload = open.writer.into_inner().inner;
            if let Err(error) = upload.abort().await {
                tracing::warn!(key = %open.key, %error, "could not abort an upload");
            }
        }
    }

    pub(crate) fn key_of(folder: &Path, stem: &str, part: i32) -> Path {
        folder.clone().join(format!("{stem}-{part:04}.parquet").as_str())
    }

    pub(crate) async fn write(&mut self, batch: &RecordBatch) -> Result<(), ArchiveError> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        if self.open.is_none() {
            let part = i32::try_from(self.written.len()).unwrap_or(i32::MAX);
            let key = match &self.fixed_key {
                Some(key) => key.clone(),
                None => Self::key_of(&self.folder, &self.stem, part),
            };
            let sink = HashingSink {
                inner: BufWriter::new(Arc::clone(&self.store), key.clone()),
                hasher: Sha256::new(),
                bytes: 0,
            };
            let writer = AsyncArrowWriter::try_new(sink, Arc::clone(&self.schema), Some(self.properties.clone()))
                .map_err(ArchiveError::parquet(key.as_ref()))?;
            self.open = Some(OpenPart { writer, key, part, rows: 0 });
        }
        let Some(open) = self.open.as_mut() else { return Ok(()) };
        open.writer.write(batch).await.map_err(ArchiveError::parquet(open.key.as_ref()))?;
        open.rows += i64::try_from(batch.num_rows()).unwrap_or(i64::MAX);
        if open.writer.in_progress_size() >= self.flush_bytes {
            open.writer.flush().await.map_err(ArchiveError::parquet(open.key.as_ref()))?;
        }
        if (open.writer.bytes_written() + open.writer.in_progress_size()) as u64 >= self.part_cap {
            self.close_part().await?;
        }
        Ok(())
    }

    async fn close_part(&mut self) -> Result<(), ArchiveError> {
        let Some(mut open) = self.open.take() else { return Ok(()) };
        open.writer.finish().await.map_err(ArchiveError::parquet(open.key.as_ref()))?;
        let sink = open.writer.into_inner();
        self.written.push(WrittenObject {
            key: open.key.to_string(),
            part: open.part,
            rows: open.rows,
            bytes: i64::try_from(sink.bytes).unwrap_or(i64::MAX),
            sha256: sink.hasher.finalize().to_vec(),
        });
        Ok(())
    }

    /// Closes the last part; returns every part written, in order.
    pub(crate) async fn finish(mut self) -> Result<Vec<WrittenObject>, ArchiveError> {
        self.close_part().await?;
        Ok(self.written)
    }
}

/// Reads `object` back from the store: its bytes must hash to the recorded
/// SHA-256 and be as many as recorded, and its footer must count the
/// recorded rows.
pub async fn verify_object(store: &Arc<dyn ObjectStore>, object: &WrittenObject) -> Result<(), ArchiveError> {
    let key = Path::parse(&object.key)
        .map_err(|e| ArchiveError::Unverified { key: object.key.clone(), reason: format!("not a key: {e}") })?;
    let unverified = |reason: String| ArchiveError::Unverified { key: object.key.clone(), reason };
    let (sha256, bytes) = hash_object(store, &key).await?;
    if bytes != object.bytes {
        return Err(unverified(format!("{bytes} bytes read back, {} written", object.bytes)));
    }
    if sha256 != object.sha256 {
        return Err(unverified(format!("SHA-256 {} read back, {} written", hex(&sha256), hex(&object.sha256))));
    }
    let rows = count_rows(store, &key).await.map_err(|e| unverified(format!("unreadable as Parquet: {e}")))?;
    if rows != object.rows {
        return Err(unverified(format!("{rows} rows in the footer, {} written", object.rows)));
    }
    Ok(())
}

/// SHA-256 and length of an object's bytes, streamed.
pub(crate) async fn hash_object(store: &Arc<dyn ObjectStore>, key: &Path) -> Result<(Vec<u8>, i64), ArchiveError> {
    let got = store.get(key).await.map_err(|e| ArchiveError::storage(key.as_ref(), e))?;
    let mut stream = got.into_stream();
    let mut hasher = Sha256::new();
    let mut bytes: i64 = 0;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| ArchiveError::storage(key.as_ref(), e))?;
        hasher.update(&chunk);
        bytes += i64::try_from(chunk.len()).unwrap_or(i64::MAX);
    }
    Ok((hasher.finalize().to_vec(), bytes))
}

/// The row count an object's footer records.
pub(crate) async fn count_rows(store: &Arc<dyn ObjectStore>, key: &Path) -> Result<i64, ArchiveError> {
    let reader = ObjectReader::new(Arc::clone(store), key.clone());
    let builder = ParquetRecordBatchStreamBuilder::new(reader).await.map_err(ArchiveError::parquet(key.as_ref()))?;
    Ok(builder.metadata().file_metadata().num_rows())
}

fn external(error: object_store::Error) -> ParquetError {
    ParquetError::External(Box::new(error))
}

/// Parquet's view of one object: ranges fetched as the reader asks for
/// them, the footer with one suffix request.
#[derive(Debug, Clone)]
pub(crate) struct ObjectReader {
    store: Arc<dyn ObjectStore>,
    path: Path,
}

impl ObjectReader {
    pub(crate) fn new(store: Arc<dyn ObjectStore>, path: Path) -> Self {
        Self { store, path }
    }
}

impl AsyncFileReader for ObjectReader {
    fn get_bytes(&mut self, range: std::ops::Range<u64>) -> BoxFuture<'_, parquet::errors::Result<Bytes>> {
        self.store.get_range(&self.path, range).map_err(external).boxed()
    }

    fn get_byte_ranges(
        &mut self,
        ranges: Vec<std::ops::Range<u64>>,
    ) -> BoxFuture<'_, parquet::errors::Result<Vec<Bytes>>> {
        async move { self.store.get_ranges(&self.path, &ranges).await.map_err(external) }.boxed()
    }

    fn get_metadata<'a>(
        &'a mut self,
        options: Option<&'a ArrowReaderOptions>,
    ) -> BoxFuture<'a, parquet::errors::Result<Arc<ParquetMetaData>>> {
        async move {
            let metadata = ParquetMetaDataReader::new()
                .with_arrow_reader_options(options)
                .load_via_suffix_and_finish(self)
                .await?;
            Ok(Arc::new(metadata))
        }
        .boxed()
    }
}

impl MetadataSuffixFetch for &mut ObjectReader {
    fn fetch_suffix(&mut self, suffix: usize) -> BoxFuture<'_, parquet::errors::Result<Bytes>> {
        let options = GetOptions { range: Some(GetRange::Suffix(suffix as u64)), ..Default::default() };
        async move {
            let got = self.store.get_opts(&self.path, options).await.map_err(external)?;
            got.bytes().await.map_err(external)
        }
        .boxed()
    }
}

/// The record batches of an object, `columns` only when given.
pub(crate) async fn open_batches(
    store: &Arc<dyn ObjectStore>,
    key: &Path,
    columns: Option<&[&str]>,
) -> Result<parquet::arrow::async_reader::ParquetRecordBatchStream<ObjectReader>, ArchiveError> {
    let reader = ObjectReader::new(Arc::clone(store), key.clone());
    let builder = ParquetRecordBatchStreamBuilder::new(reader).await.map_err(ArchiveError::parquet(key.as_ref()))?;
    let builder = match columns {
        Some(columns) => {
            let mask = parquet::arrow::ProjectionMask::columns(builder.parquet_schema(), columns.iter().copied());
            builder.with_projection(mask)
        }
        None => builder,
    };
    builder.with_batch_size(2_048).build().map_err(ArchiveError::parquet(key.as_ref()))
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::with_capacity(bytes.len() * 2), |mut out, b| {
        let _ = write!(out, "{b:02x}");
        out
    })
}
