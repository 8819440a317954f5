//! Why the server could not start, and why one section of a page or a
//! scrape has no figures.

use std::net::SocketAddr;

/// Why `adk-pg serve` refused to start or stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DashboardError {
    /// A non-loopback address without a bearer token would hand the
    /// store's figures to anyone who can reach the port.
    #[error(
        "refusing to listen on {listen} without a token: set {var} to a secret, or listen on a loopback \
         address such as 127.0.0.1",
        var = crate::config::TOKEN_VAR
    )]
    TokenRequired {
        /// The address asked for.
        listen: SocketAddr,
    },
    /// A [`ServeConfig`](crate::ServeConfig) value is missing, empty or out
    /// of range; the message says which.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// The address could not be bound: in use, or not this host's.
    #[error("could not listen on {listen}: {source}")]
    Bind {
        /// The address asked for.
        listen: SocketAddr,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// The server stopped on an I/O error after it started.
    #[error("the server failed: {0}")]
    Serve(#[source] std::io::Error),
}

/// Why a section of the page (or of a scrape) has no figures. The rest of
/// the page is still served: one slow table costs one section.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct SectionError {
    /// What was being read, e.g. "read health".
    pub context: String,
    /// The cause, as PostgreSQL or the reading layer put it.
    pub message: String,
    /// The statement or lock timeout cut it short, or opening a connection
    /// took too long: the database is slow or locked, not broken.
    pub timed_out: bool,
}

impl SectionError {
    pub(crate) fn new(context: impl Into<String>, cause: &dyn std::fmt::Display) -> Self {
        let message = cause.to_string();
        // SQLSTATE 57014 and 55P03 are not exposed by diesel's error
        // information, and these are the server's own words for them
        // (`lc_messages` stays English, as the store already requires).
        let timed_out = message.contains("statement timeout")
            || message.contains("lock timeout")
            || message.contains("canceling statement");
        Self { context: context.into(), message, timed_out }
    }

    pub(crate) fn timeout(context: impl Into<String>, message: impl Into<String>) -> Self {
        Self { context: context.into(), message: message.into(), timed_out: true }
    }

    /// One line for a person: what failed and why.
    pub fn describe(&self) -> String {
        if self.timed_out {
            format!("{} timed out: {}", self.context, self.message)
        } else {
            format!("could not {}: {}", self.context, self.message)
        }
    }
}
