//! Usage analytics against a real PostgreSQL: every rollup figure against
//! the raw log, the rollup job under live traffic, the queries, and
//! operating the tiers.
//!
//! One binary for the area: each file is a module named for the behaviour
//! it pins.

mod figures;
mod live_traffic;
mod operations;
mod queries;
mod redaction;
