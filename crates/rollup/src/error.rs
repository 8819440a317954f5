//! Why a rollup run or a usage query failed.

use crate::sketch::SketchError;

/// Why a rollup run failed. A failed run changed nothing: its transaction
/// is rolled back and the next run starts from the same watermark.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RollupError {
    #[error("{context}: {source}")]
    Query {
        context: &'static str,
        #[source]
        source: diesel::result::Error,
    },
    #[error(transparent)]
    Operations(#[from] adk_postgres_operations::OperationsError),
    #[error("a stored rollup row is unreadable: {0}")]
    Sketch(#[from] SketchError),
    #[error("a stored rollup row is unreadable: {0}")]
    Corrupt(String),
    #[error("invalid {field}: {reason}")]
    InvalidInput { field: &'static str, reason: String },
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
    #[error("invalid {field}: {reason}")]
    InvalidInput { field: &'static str, reason: String },
    /// The window and resolution ask for more points than a chart can use.
    #[error(
        "too many points: {points} buckets of {resolution} in the window, at most {max} (widen --resolution or narrow the window)"
    )]
    TooManyPoints { points: i64, resolution: String, max: i64 },
    /// No level both divides the resolution and still holds the window's
    /// start (finer tiers are retained for less time).
    #[error("no rollup level holds {resolution} buckets from {since}: {reason}")]
    NotRetained { resolution: String, since: String, reason: String },
    #[error("{context}: {source}")]
    Query {
        context: &'static str,
        #[source]
        source: diesel::result::Error,
    },
    #[error(transparent)]
    Operations(#[from] adk_postgres_operations::OperationsError),
    #[error("a stored rollup row is unreadable: {0}")]
    Sketch(#[from] SketchError),
    #[error("a stored rollup row is unreadable: {0}")]
    Corrupt(String),
}

impl UsageError {
    pub(crate) fn query(context: &'static str) -> impl FnOnce(diesel::result::Error) -> Self {
        move |source| Self::Query { context, source }
    }
}
