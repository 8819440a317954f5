//! Why a rollup run or a usage query failed.

use crate::sketch::SketchError;

/// Why a rollup run failed. A failed run changed nothing: its transaction
/// is rolled back and the next run starts from the same watermark.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RollupError {
    /// A statement failed.
    #[error("{context}: {source}")]
    Query {
        /// What the statement was doing.
        context: &'static str,
        /// diesel's error.
        #[source]
        source: diesel::result::Error,
    },
    /// Connecting, or waiting for a lock, failed.
    #[error(transparent)]
    Operations(#[from] adk_postgres_operations::OperationsError),
    /// A stored sketch could not be decoded.
    #[error("a stored rollup row is unreadable: {0}")]
    Sketch(#[from] SketchError),
    /// A stored row, or a query's answer, is not what the code expects.
    #[error("a stored rollup row is unreadable: {0}")]
    Corrupt(String),
    /// An argument was refused; nothing was read or written.
    #[error("invalid {field}: {reason}")]
    InvalidInput {
        /// The argument at fault.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
}

impl RollupError {
    pub(crate) fn query(context: &'static str) -> impl FnOnce(diesel::result::Error) -> Self {
        move |source| Self::Query { context, source }
    }
}

/// Why a usage query was refused or failed. Refusals name the field.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UsageError {
    /// An argument was refused; nothing was read or written.
    #[error("invalid {field}: {reason}")]
    InvalidInput {
        /// The argument at fault.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The window and resolution ask for more points than a chart can use.
    #[error(
        "too many points: {points} buckets of {resolution} in the window, at most {max} (widen --resolution or narrow the window)"
    )]
    TooManyPoints {
        /// Buckets of that resolution in the window.
        points: i64,
        /// The resolution asked for.
        resolution: String,
        /// The most allowed ([`crate::MAX_POINTS`]).
        max: i64,
    },
    /// No level both divides the resolution and still holds the window's
    /// start (finer tiers are retained for less time).
    #[error("no rollup level holds {resolution} buckets from {since}: {reason}")]
    NotRetained {
        /// The resolution asked for.
        resolution: String,
        /// The window's start, RFC 3339.
        since: String,
        /// Why no level fits.
        reason: String,
    },
    /// A statement failed.
    #[error("{context}: {source}")]
    Query {
        /// What the statement was doing.
        context: &'static str,
        /// diesel's error.
        #[source]
        source: diesel::result::Error,
    },
    /// Connecting, or waiting for a lock, failed.
    #[error(transparent)]
    Operations(#[from] adk_postgres_operations::OperationsError),
    /// A stored sketch could not be decoded.
    #[error("a stored rollup row is unreadable: {0}")]
    Sketch(#[from] SketchError),
    /// A stored row, or a query's answer, is not what the code expects.
    #[error("a stored rollup row is unreadable: {0}")]
    Corrupt(String),
}

impl UsageError {
    pub(crate) fn query(context: &'static str) -> impl FnOnce(diesel::result::Error) -> Self {
        move |source| Self::Query { context, source }
    }
}
