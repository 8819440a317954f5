//! The operator's view of an adk-postgres store, served by `adk-pg serve`:
//! Prometheus metrics (`/metrics`), liveness and readiness (`/healthz`,
//! `/readyz`) and an HTML dashboard (`/`) with health cards, the partition
//! timeline, maintenance and rollup run history, and usage charts drawn
//! from the rollups.
//!
//! It only looks. Every request opens its own connection set to
//! `default_transaction_read_only`, a `statement_timeout` and a
//! `lock_timeout`, so the server runs no DDL and writes nothing (health
//! must not write either, and it does not run maintenance or rollups), and
//! a slow database costs a section of the page its figures, never the page
//! its answer. Each query is bounded: by a time window on the partition key
//! (usage, late events), by a row limit on a primary key (run history) or a
//! sample cap (state sizes), and always by the timeout.
//!
//! The page is rendered by pure functions (`page`): HTML with inline CSS
//! and server-drawn SVG charts, no JavaScript, nothing fetched at run time,
//! so it needs no build step and works behind any proxy.
//!
//! What it must not depend on: the store's runtime (the pool and
//! `PgSessionStore`), the adk adapter, the `adk-pg` binary or the test
//! harness. It reads health through `adk-postgres-retention` and usage
//! through `adk-postgres-rollup`'s query layer, so its cards alert by
//! exactly the rules `adk-pg status` uses and its charts are routed like
//! `adk-pg usage`. `docs/ARCHITECTURE.md` places it among the other crates.

#![warn(missing_docs)]

mod config;
mod db;
mod error;
mod gather;
mod metrics;
pub mod page;
mod server;
mod view;

pub use config::{DEFAULT_LISTEN, ServeConfig, TOKEN_VAR};
pub use error::{DashboardError, SectionError};
pub use gather::{
    AppTotal, History, LateToday, MaintenanceRun, MigrationStatus, OpsSnapshot, RollupRun, ScopeSizes, Section,
    SessionCounts, UsageView,
};
pub use metrics::render_metrics;
pub use server::{Server, router};
pub use view::{DashboardQuery, ResolutionChoice, UsageWindow};
