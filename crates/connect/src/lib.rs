//! How adk-postgres reaches PostgreSQL. Every connection the project opens
//! (the store's pool, migrations, maintenance, rollups, the dashboard, the
//! change feed, service-role setup, the CLI, the demo, the benchmarks and
//! the test harness) is built here, so TLS, credentials, keepalives and the
//! connect bound are decided in one place.
//!
//! A [`ConnectConfig`] comes from a libpq connection string, in either
//! form, with libpq's `PG*` variables filling what the string leaves out:
//!
//! - TLS through rustls with libpq's `sslmode` semantics ([`SslMode`]):
//!   `sslrootcert` (a file, or `system` for the platform's roots),
//!   `sslcert`/`sslkey` for a client certificate, `sslnegotiation=direct`.
//!   A verify mode never falls back to plaintext; a certificate that does
//!   not verify is a [`ConnectError::Tls`] naming the [`TlsFailure`].
//! - Credentials from a [`PasswordProvider`], asked on every new
//!   connection, so IAM tokens rotate. Secrets appear in no `Debug`,
//!   error or log line.
//! - TCP keepalives and `tcp_user_timeout` on by default
//!   ([`DEFAULT_KEEPALIVES_IDLE`] and the rest), so a connection whose
//!   peer went silent is dropped by the kernel instead of being kept for
//!   about 15 minutes, and every connect is bounded by
//!   [`DEFAULT_CONNECT_TIMEOUT`] per host on the client.
//! - Multi-host strings with `target_session_attrs` (`read-write`,
//!   `primary`, `read-only`, `standby`, `any`), for failover.
//! - Server settings (timeouts) sent in the startup packet rather than by
//!   `SET` after connecting, so nothing a connection sets can leak to
//!   another client through a transaction pooler; a pooler that refuses
//!   startup options is detected and connected to without them.
//!
//! It depends on no other crate of the workspace and knows nothing of the
//! store's tables.

#![warn(missing_docs)]

mod conninfo;
mod credentials;
mod error;
mod open;
mod tls;

pub use conninfo::redact_url;
pub use credentials::{CredentialError, PasswordFuture, PasswordProvider, Secret, SharedPasswordProvider};
pub use error::{ConnectError, TlsFailure};
pub use open::{
    ConnectConfig, Connected, DEFAULT_CONNECT_TIMEOUT, DEFAULT_KEEPALIVES_IDLE, DEFAULT_KEEPALIVES_INTERVAL,
    DEFAULT_KEEPALIVES_RETRIES, DEFAULT_TCP_USER_TIMEOUT, DIRECT_SESSION_CHECK, DIRECT_SESSION_SETTING, PgConnection,
    TlsConnector, TlsStream, client, establish, spawn_connection,
};
pub use tls::SslMode;
/// The driver's client, re-exported so callers name one version of it.
pub use tokio_postgres;
