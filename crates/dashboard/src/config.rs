//! What `adk-pg serve` is told: where to listen, which database to read,
//! the bearer token, the timeouts and the alert thresholds.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::Duration;

use adk_postgres_retention::HealthThresholds;

use crate::error::DashboardError;

/// Where the server listens unless told otherwise: loopback only, so that
/// no token is needed until an operator chooses to open it up. 9187 is also
/// postgres_exporter's usual port; pass `--listen` to run both on a host.
pub const DEFAULT_LISTEN: SocketAddr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 9187));

/// The environment variable the CLI reads the bearer token from. Never a
/// flag: a flag's value shows in `ps` and in shell history.
pub const TOKEN_VAR: &str = "ADK_PG_SERVE_TOKEN";

/// How the server runs.
#[derive(Clone)]
pub struct ServeConfig {
    /// The store's database, connected to as its owner (as `adk-pg status`
    /// is): the policy and the run tables are not granted to service roles.
    pub database_url: String,
    /// The address and port to serve on.
    pub listen: SocketAddr,
    /// When set, every endpoint but `/healthz` wants `Authorization:
    /// Bearer <token>`. Required for a non-loopback address.
    pub token: Option<String>,
    /// Longest any one statement may run, and any lock wait may last.
    pub statement_timeout: Duration,
    /// Longest opening a connection may take.
    pub connect_timeout: Duration,
    /// The thresholds `adk-pg status` alerts by; the cards and
    /// `adk_pg_alerts_firing` use the same.
    pub thresholds: HealthThresholds,
    /// Requests reading the database at once; the rest wait their turn, so
    /// a burst of page loads cannot take more connections than this.
    pub max_concurrent_reads: usize,
}

impl std::fmt::Debug for ServeConfig {
    /// Leaves out the URL's password and the token.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServeConfig")
            .field("database", &database_label(&self.database_url))
            .field("listen", &self.listen)
            .field("token", &self.token.as_ref().map(|_| "(set)"))
            .field("statement_timeout", &self.statement_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("thresholds", &self.thresholds)
            .field("max_concurrent_reads", &self.max_concurrent_reads)
            .finish()
    }
}

impl ServeConfig {
    /// Defaults for everything but the database.
    pub fn new(database_url: impl Into<String>) -> Self {
        Self {
            database_url: database_url.into(),
            listen: DEFAULT_LISTEN,
            token: None,
            statement_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(5),
            thresholds: HealthThresholds::default(),
            max_concurrent_reads: 4,
        }
    }

    /// Refuses what would serve the store's figures to anyone who can reach
    /// the port, and settings that cannot work.
    pub fn validate(&self) -> Result<(), DashboardError> {
        if self.database_url.trim().is_empty() {
            return Err(DashboardError::InvalidConfig(
                "no database given: pass --database-url or set DATABASE_URL".into(),
            ));
        }
        if self.token.as_deref().is_some_and(|token| token.trim().is_empty()) {
            return Err(DashboardError::InvalidConfig(format!("{TOKEN_VAR} is set but empty")));
        }
        if !self.listen.ip().is_loopback() && self.token.is_none() {
            return Err(DashboardError::TokenRequired { listen: self.listen });
        }
        if self.statement_timeout.is_zero() || self.statement_timeout > Duration::from_secs(600) {
            return Err(DashboardError::InvalidConfig(
                "the statement timeout must be more than 0 and at most 10 minutes (0 would mean none)".into(),
            ));
        }
        if self.connect_timeout.is_zero() {
            return Err(DashboardError::InvalidConfig("the connect timeout must be more than 0".into()));
        }
        if self.max_concurrent_reads == 0 {
            return Err(DashboardError::InvalidConfig("at least one request must be allowed to read".into()));
        }
        Ok(())
    }
}

/// The database as the page names it: host, port and database, never the
/// user's password.
pub(crate) fn database_label(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(parsed) => {
            // A Unix socket folder arrives percent-encoded (`%2Fvar%2Frun`).
            let host = percent_decoded(parsed.host_str().filter(|host| !host.is_empty()).unwrap_or("local socket"));
            let port = parsed.port().map(|port| format!(":{port}")).unwrap_or_default();
            let database = parsed.path().trim_start_matches('/');
            format!("{host}{port}/{database}")
        }
        Err(_) => "(unparsable database URL)".to_owned(),
    }
}

fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
        match (bytes[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(listen: &str, token: Option<&str>) -> ServeConfig {
        ServeConfig {
            listen: listen.parse().unwrap_or(DEFAULT_LISTEN),
            token: token.map(str::to_owned),
            ..ServeConfig::new("postgres://owner:secret@db.internal:5433/store")
        }
    }

    #[test]
    fn loopback_needs_no_token_and_anything_else_does() {
        assert!(config("127.0.0.1:9187", None).validate().is_ok());
        assert!(config("[::1]:9187", None).validate().is_ok());
        for open in ["0.0.0.0:9187", "[::]:9187", "10.1.2.3:80"] {
            assert!(
                matches!(config(open, None).validate(), Err(DashboardError::TokenRequired { .. })),
                "{open} without a token"
            );
            assert!(config(open, Some("s3cret-token")).validate().is_ok(), "{open} with a token");
        }
        assert!(matches!(config("127.0.0.1:1", Some("  ")).validate(), Err(DashboardError::InvalidConfig(_))));
    }

    #[test]
    fn impossible_settings_are_refused() {
        let zero = ServeConfig { statement_timeout: Duration::ZERO, ..config("127.0.0.1:1", None) };
        assert!(matches!(zero.validate(), Err(DashboardError::InvalidConfig(_))));
        let none = ServeConfig { max_concurrent_reads: 0, ..config("127.0.0.1:1", None) };
        assert!(matches!(none.validate(), Err(DashboardError::InvalidConfig(_))));
        let nowhere = ServeConfig::new(" ");
        assert!(matches!(nowhere.validate(), Err(DashboardError::InvalidConfig(_))));
    }

    #[test]
    fn secrets_stay_out_of_labels_and_debug_output() {
        let config = config("0.0.0.0:9187", Some("s3cret-token"));
        assert_eq!(database_label(&config.database_url), "db.internal:5433/store");
        let debug = format!("{config:?}");
        assert!(!debug.contains("secret") && !debug.contains("s3cret"), "{debug}");
        assert_eq!(database_label("postgres://u@%2Fvar%2Frun%2Fpostgresql/store"), "/var/run/postgresql/store");
    }
}
