//! The runtime store of adk-postgres: the connection pool, the store's
//! policy, and the [`PgSessionStore`] that implements the domain's
//! `SessionStore` contract by calling the store's SQL functions, each
//! through a typed wrapper ([`functions`]). Also here: setting up the
//! service roles that may call those functions and nothing else
//! ([`tenancy`]), the one classifier of PostgreSQL failures
//! ([`pg_error`]), and the live change feed ([`feed`]: a session's new
//! events, or an app's new sessions and events, as they commit).
//!
//! Its connections come from `adk-postgres-connect` (TLS, credentials,
//! keepalives, bounds) and run the store's statements unnamed, one round
//! trip each ([`pool`]), so the store works on a direct connection and
//! behind a transaction-mode pooler alike; every call is bounded on the
//! client by [`PoolConfig::operation_timeout`].
//!
//! It must not depend on the adk adapter, the operations crate or any
//! binary; a service links it to store sessions and nothing more.
//!
//! The layout it relies on (migrations, typed tables, shared names) is the
//! `adk-postgres-schema` crate's. Nothing outside these two crates depends
//! on table layout: other crates go through the store or the functions
//! exported here.
//!
//! Every `SessionStore` operation of [`PgSessionStore`] runs in a `DEBUG`
//! span named `adk_pg_store` ([`observe`]) with the fields `operation`
//! (`create`, `get`, `list`, `delete`, `append`, `rollover`, `find_by_id`,
//! `rewind`), `app`, `outcome` (`ok` or the error's kind, such as
//! `not_found` or `stale_session`) and `duration_ms`; user ids, session
//! ids, state and events are never recorded. A filter such as
//! `adk_postgres_storage=debug` turns the spans on. With the `metrics`
//! feature (off by default) each operation also records
//! `adk_pg_store_operation_duration_seconds` (labels `operation`,
//! `outcome`) and each failure `adk_pg_store_operation_errors_total`
//! (labels `operation`, `kind`) through the `metrics` facade, into whatever
//! recorder the service installed; without one, nothing is kept.

#![warn(missing_docs)]

mod conn;
pub mod policy;
pub mod pool;

pub use adk_postgres_connect::{ConnectConfig, ConnectError, CredentialError, PasswordProvider, Secret, SslMode};
pub use policy::{PolicyAmendment, PolicyChange, amend_policy, policy_changes, read_policy, set_policy};
pub use pool::{
    CheckoutError, PgConn, PgPool, PoolBuildError, PoolConfig, PooledConn, StoreConnections, build_pool,
    build_pool_with,
};
pub mod store;

mod error;
pub mod functions;
pub mod observe;
pub mod pg_error;

pub use feed::{AppFeed, AppNotice, EventFeed};
pub use store::feed;
pub use store::{CheckoutObserver, PgSessionStore, TenantScope};
pub use store::{DEFAULT_ERASE_BATCH, EraseOptions, EraseProgress, EraseStep, ErasureReport, MAX_ERASE_BATCH};

/// Migrating is the first thing a service does with the store, so one
/// dependency is enough for it.
pub use adk_postgres_schema::{MigrationError, run_pending_migrations};
pub mod tenancy;
pub use tenancy::{
    AppBinding, BindingChange, RoleBindings, STORE_FUNCTIONS, ServiceRoleError, ServiceRoleOptions, ServiceRoleReport,
    ServiceRoleView, setup_service_role, show_service_role,
};
