use std::path::PathBuf;

use crate::capability::Capability;

/// Why the harness could not provide a server, a cluster or a database.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HarnessError {
    /// Neither a server URL, nor server binaries, nor (with the feature) a
    /// container runtime: the message says what to install or set.
    #[error("{0}")]
    NoPostgres(String),
    #[error("`{command}` failed ({status}):\n{output}")]
    Command { command: String, status: String, output: String },
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("PostgreSQL did not start; the end of its log {log}:\n{tail}")]
    StartFailed { log: PathBuf, tail: String },
    #[error("{0}")]
    Setup(String),
    /// A cluster was asked for something its server binaries were built
    /// without (a TLS cluster from a build without SSL).
    #[error("the PostgreSQL in {} was {}, and this cluster needs {capability}", .bin_dir.display(), .capability.lacking())]
    Lacks { capability: Capability, bin_dir: PathBuf },
    /// The venv of moto and DuckDB is missing and may not be made here (CI),
    /// or cannot be: the message says what to run or install.
    #[error("{0}")]
    NoPythonTools(String),
    /// A request to a fixture's HTTP server (the S3 server) got no answer.
    #[error("{context}: {}", with_causes(.source.as_ref()))]
    Http {
        context: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("invalid server URL {url:?}: {reason}")]
    BadUrl { url: String, reason: String },
    #[error("connecting to {url}: {}", with_causes(.source))]
    Connect {
        /// Without its password.
        url: String,
        #[source]
        source: adk_postgres_connect::ConnectError,
    },
    #[error("{}", with_causes(.0))]
    Postgres(#[from] tokio_postgres::Error),
    #[error(transparent)]
    Migration(#[from] adk_postgres_schema::MigrationError),
    #[cfg(feature = "testcontainers")]
    #[error("starting a PostgreSQL container: {0}")]
    Container(#[from] testcontainers::TestcontainersError),
}

impl HarnessError {
    pub(crate) fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let context = context.into();
        move |source| Self::Io { context, source }
    }
}

/// tokio-postgres keeps the server's message in the error's source, not in
/// its Display ("db error"), and a test failure should say what went wrong.
fn with_causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
