//! What every unattended job against a live adk-postgres database stands
//! on: retention (maintenance, expiry, conversion, index builds, health)
//! and the usage rollups both open their connection, wait for locks and
//! fail through this crate, so neither needs the other for it.
//!
//! - [`connect`]: an autocommit connection of the job's own (ISO dates,
//!   UTC, no statement timeout, the policy's lock timeout), never a pooled
//!   one, because some DDL refuses a transaction block and none of it may
//!   hold a connection the service needs.
//! - [`LockPolicy`], [`LockRetry`] and [`ddl`]: DDL that queues for its
//!   lock no longer than `lock_timeout`, retried with backoff, so live
//!   appends never wait behind it for long.
//! - [`OperationsError`]: why such a job failed.
//!
//! What it must not depend on: retention, the rollups, the dashboard, the
//! adk adapter or any binary; it is the floor they stand on. Of the store
//! it uses only the published policy errors and the one classifier of
//! PostgreSQL failures (`adk_postgres_storage::pg_error`).

#![warn(missing_docs)]

mod connection;
mod error;
mod lock_wait;

pub use connection::{connect, events_schema, first_row, on_citus};
pub use error::{OperationsError, is_lock_wait};
pub use lock_wait::{LockPolicy, LockRetry, ddl};
