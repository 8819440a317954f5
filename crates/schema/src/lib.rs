//! The database layout of adk-postgres, as a unit of its own: the embedded
//! migrations that create it, the store's SQL functions (one file per area
//! in `sql/`, installed after every migrate), the typed diesel tables
//! generated from it, and the names (tables, partitions, advisory lock keys) the SQL and the
//! Rust code share.
//!
//! It must not depend on the connection pool, the store or any other crate
//! of the workspace, so the operations crate, the test harness and xtask
//! can use it without pulling in the runtime store.

pub mod catalog;
pub mod citus;
pub mod migrations;
pub mod names;
pub mod quote;
pub mod replaceable;
pub mod tables;
pub mod tables_print;

pub use migrations::{
    MIGRATIONS, MigrationError, apply_pending_migrations, citus_layout, pending_migrations, revert_all_migrations,
    run_pending_migrations, run_pending_migrations_on_citus,
};
