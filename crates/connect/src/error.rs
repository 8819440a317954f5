//! Why a connection could not be made, typed so a caller can tell a
//! mistake in the configuration (fix it) from a network or server that is
//! away for now (retry).

use std::time::Duration;

/// Why a certificate or handshake was refused, in libpq's terms.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TlsFailure {
    /// The server's chain does not lead to a root in `sslrootcert`.
    UnknownIssuer,
    /// The server's certificate is past its end date (or before its start).
    Expired,
    /// `verify-full`: the certificate does not name the host connected to.
    WrongHost {
        /// The host name the certificate was checked against.
        host: String,
    },
    /// `require` or stronger, but the server does not offer TLS.
    NotOffered,
    /// The server refused our client certificate, or asked for one we lack.
    ClientCertificateRefused,
    /// Any other handshake failure, as rustls described it.
    Handshake,
}

impl std::fmt::Display for TlsFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::UnknownIssuer => f.write_str("the server's certificate is not signed by a CA in sslrootcert"),
            Self::Expired => f.write_str("the server's certificate has expired or is not yet valid"),
            Self::WrongHost { host } => write!(f, "the server's certificate is not valid for host {host:?}"),
            Self::NotOffered => f.write_str("the server does not offer TLS"),
            Self::ClientCertificateRefused => f.write_str("the server refused the client certificate"),
            Self::Handshake => f.write_str("the TLS handshake failed"),
        }
    }
}

/// A connection that could not be made. Secrets never appear in it: URLs
/// are redacted and the password provider's error is kept as its source
/// only when the provider put nothing secret in it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// A parameter of the connection string (or its `PG*` variable) is wrong.
    #[error("invalid connection parameter {parameter}: {reason}")]
    InvalidUrl {
        /// The parameter's libpq name, such as `sslmode`.
        parameter: String,
        /// What is wrong with its value.
        reason: String,
    },
    /// A TLS file (`sslrootcert`, `sslcert`, `sslkey`) could not be used.
    #[error("{parameter} {path}: {reason}")]
    TlsFile {
        /// `sslrootcert`, `sslcert` or `sslkey`.
        parameter: &'static str,
        /// The file, as given or found by default.
        path: String,
        /// Why it could not be read or used.
        reason: String,
    },
    /// The TLS handshake or certificate check failed; never retried in
    /// plaintext when a verify mode was asked for.
    #[error("TLS to {target}: {reason}: {detail}")]
    Tls {
        /// The connection string, password redacted.
        target: String,
        /// What was refused, in libpq's terms.
        reason: TlsFailure,
        /// rustls' own description.
        detail: String,
    },
    /// The password provider failed; worth retrying.
    #[error("the password provider failed: {message}")]
    Credentials {
        /// The provider's message.
        message: String,
    },
    /// No answer within the connect bound.
    #[error("no connection to {target} within {bound:?}")]
    Timeout {
        /// The connection string, password redacted.
        target: String,
        /// The bound that passed: one connect timeout per host tried.
        bound: Duration,
    },
    /// The server could not be reached, or closed the connection.
    #[error("could not reach {target}: {}", with_causes(.source))]
    Unreachable {
        /// The connection string, password redacted.
        target: String,
        /// The driver's error.
        #[source]
        source: tokio_postgres::Error,
    },
    /// A connection pooler lent the session ([`crate::ConnectConfig::connect_direct`]):
    /// the work asked for needs a session of its own.
    #[error(
        "{target} goes through a connection pooler (PgBouncer or the like), and this needs a session of its own: \
         give it a direct URL to the server"
    )]
    ThroughPooler {
        /// The connection string, password redacted.
        target: String,
    },
    /// The connection was closed, by the server or after a failure.
    #[error("the connection to {target} is closed")]
    Closed {
        /// The connection string, password redacted.
        target: String,
    },
    /// The server (or a pooler in front of it) refused us: authentication,
    /// `pg_hba.conf`, a missing database, too many connections, or a
    /// server that is starting or shutting down.
    #[error("{target} refused the connection: {}", refusal(.source))]
    Refused {
        /// The connection string, password redacted.
        target: String,
        /// The driver's error, carrying the server's SQLSTATE and message.
        #[source]
        source: tokio_postgres::Error,
    },
}

impl ConnectError {
    pub(crate) fn invalid(parameter: &str, reason: impl Into<String>) -> Self {
        Self::InvalidUrl { parameter: parameter.to_owned(), reason: reason.into() }
    }

    /// Worth trying again later, with the same configuration: the network,
    /// the server or the credentials source may be back by then. A refusal
    /// is retryable only when the server says it is starting, shutting
    /// down or out of connections (a failover, a restart, a full pooler).
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Credentials { .. } | Self::Timeout { .. } | Self::Unreachable { .. } | Self::Closed { .. } => true,
            Self::Refused { source, .. } => source.code().is_some_and(|code| {
                let code = code.code();
                code.starts_with("08") || code.starts_with("57P") || code == "53300" || code == "25006"
            }),
            Self::InvalidUrl { .. } | Self::TlsFile { .. } | Self::Tls { .. } | Self::ThroughPooler { .. } => false,
        }
    }

    /// The TLS reason, when the handshake was what failed.
    pub fn tls_failure(&self) -> Option<&TlsFailure> {
        match self {
            Self::Tls { reason, .. } => Some(reason),
            _ => None,
        }
    }
}

/// An error and its causes on one line: the driver's top line ("error
/// connecting to server", "db error") says little on its own.
pub(crate) fn with_causes(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// The server's own words for a refusal (SQLSTATE, message, detail).
fn refusal(error: &tokio_postgres::Error) -> String {
    match error.as_db_error() {
        Some(db) => {
            let mut text = format!("{} ({})", db.message(), db.code().code());
            if let Some(detail) = db.detail() {
                text.push_str(": ");
                text.push_str(detail);
            }
            text
        }
        None => with_causes(error),
    }
}
