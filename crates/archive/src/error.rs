//! Why archiving, verifying, restoring or erasing from the archive failed.

use adk_postgres_operations::OperationsError;

/// Why an archive operation failed. Every variant that concerns an object
/// names its key; none carries a credential (object_store's errors name the
/// request, never the secret).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ArchiveError {
    /// An argument was refused before anything was written.
    #[error("invalid {field}: {reason}")]
    InvalidInput {
        /// The argument at fault, such as `archive_url` or `schema`.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The destination URL could not be turned into a store.
    #[error("archive destination {url}: {reason}")]
    Destination {
        /// The destination URL.
        url: String,
        /// Why it could not be opened.
        reason: String,
    },
    /// Writing or reading an object failed; the day stays in the database.
    #[error("object {key}: {source}")]
    Storage {
        /// The object's key within the store.
        key: String,
        /// object_store's error.
        #[source]
        source: object_store::Error,
    },
    /// The disk or the bucket has no room (ENOSPC, EDQUOT, EFBIG, or an S3
    /// quota reply); the day stays in the database.
    #[error("object {key}: the archive's storage is full: {reason}")]
    StorageFull {
        /// The object's key within the store.
        key: String,
        /// The store's words.
        reason: String,
    },
    /// An object read back does not match what was written or recorded.
    #[error("object {key} does not verify: {reason}")]
    Unverified {
        /// The object's key within the store.
        key: String,
        /// What differs.
        reason: String,
    },
    /// Writing or reading an object's Parquet failed.
    #[error("object {key}: parquet: {source}")]
    Parquet {
        /// The object's key within the store.
        key: String,
        /// The Parquet library's error.
        #[source]
        source: parquet::errors::ParquetError,
    },
    /// Building or filtering Arrow batches failed, or a batch lacks a
    /// column the format has.
    #[error("{context}: {source}")]
    Arrow {
        /// What was being done.
        context: String,
        /// Arrow's error.
        #[source]
        source: arrow_schema::ArrowError,
    },
    /// Nothing is archived for what was asked.
    #[error("nothing archived for app {app} on {day}")]
    NotArchived {
        /// The app.
        app: String,
        /// The day (UTC).
        day: chrono::NaiveDate,
    },
    /// The operation is the store owner's: restoring, erasing and archiving
    /// read and write every app's objects.
    #[error("{what} needs the store's owner; role {role} is not")]
    NotOwner {
        /// The operation refused.
        what: &'static str,
        /// The role that asked.
        role: String,
    },
    /// Connecting or a statement failed, or the database is not migrated.
    #[error(transparent)]
    Operations(#[from] OperationsError),
}

/// Whether a store's error text says the storage has no room (ENOSPC,
/// EDQUOT, EFBIG, or an S3 quota reply).
fn says_full(text: &str) -> bool {
    [
        "No space left on device",
        "Disk quota exceeded",
        "File too large",
        "QuotaExceeded",
        "EntityTooLarge",
        "InsufficientStorage",
    ]
    .iter()
    .any(|needle| text.contains(needle))
}

/// A statement in a transaction that failed without saying which; the
/// callers name theirs with [`ArchiveError::query`].
impl From<diesel::result::Error> for ArchiveError {
    fn from(source: diesel::result::Error) -> Self {
        Self::Operations(OperationsError::Query { context: "archive transaction".into(), source })
    }
}

impl ArchiveError {
    /// Wraps a failed statement with what it was doing, for `map_err`.
    pub fn query(context: impl Into<String>) -> impl FnOnce(diesel::result::Error) -> Self {
        let context = context.into();
        move |source| Self::Operations(OperationsError::Query { context, source })
    }

    /// Classifies an object store failure: full storage is its own variant,
    /// so a caller (and the alert) can say so.
    pub(crate) fn storage(key: &str, source: object_store::Error) -> Self {
        let text = source.to_string();
        if says_full(&text) {
            Self::StorageFull { key: key.to_owned(), reason: text }
        } else {
            Self::Storage { key: key.to_owned(), source }
        }
    }

    pub(crate) fn parquet(key: &str) -> impl FnOnce(parquet::errors::ParquetError) -> Self {
        let key = key.to_owned();
        move |source| {
            // The writer reports the sink's failure as an external error,
            // the upload's `std::io::Error` wrapping object_store's; a full
            // disk must still read as one.
            if let parquet::errors::ParquetError::External(inner) = &source {
                let text = inner.to_string();
                if says_full(&text) {
                    return Self::StorageFull { key, reason: text };
                }
            }
            Self::Parquet { key, source }
        }
    }

    pub(crate) fn arrow(context: &str) -> impl FnOnce(arrow_schema::ArrowError) -> Self {
        let context = context.to_owned();
        move |source| Self::Arrow { context, source }
    }

    /// Whether a rerun may succeed: the store or the network failed, not
    /// the request.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Storage { .. } | Self::StorageFull { .. } | Self::Unverified { .. })
    }
}
