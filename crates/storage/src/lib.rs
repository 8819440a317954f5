//! The PostgreSQL room of adk-postgres: the typed schema of the four tables,
//! the embedded migrations that create them, the connection pool and the
//! [`PgSessionStore`] that implements the domain's `SessionStore` contract.
//!
//! Nothing outside this crate depends on table layout: other crates go
//! through the store or through the functions exported here.

pub mod migrations;
pub mod policy;
pub mod pool;
pub mod schema;
pub mod schema_print;

pub use migrations::{MigrationError, run_pending_migrations};
pub use policy::{PolicyAmendment, PolicyChange, amend_policy, policy_changes, read_policy, set_policy};
pub use pool::{PgPool, PoolBuildError, PoolConfig, build_pool};
pub mod store;

mod call;
mod error;

pub use store::{CheckoutObserver, PgSessionStore, TenantScope};
