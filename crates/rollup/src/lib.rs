//! Usage analytics for an adk-postgres store: what agents did, per app,
//! author and kind of event, by minute, hour and day, kept long after the
//! raw events are gone.
//!
//! A rollup run ([`run_rollup`]) reads only the events that arrived since
//! its watermark and merges them into minute rows; the hours and days those
//! minutes belong to are then recomputed from the level below, never from
//! raw events. Each row keeps counts, sums, extremes and mergeable sketches
//! (latency and payload size quantiles, distinct sessions and users), so a
//! day's p99 is a merge of its hours, not an average of percentiles. User
//! and session ids never become dimensions: they only feed the distinct
//! count sketches. Late events within the policy's lateness window update
//! their buckets; later ones are counted, not rolled up. Each level is
//! partitioned by time and dropped by partition at the end of its tier
//! (`adk_retire_usage_partitions`, called by maintenance).
//!
//! Queries ([`usage`]) always need a time window and read the coarsest
//! level that satisfies the requested resolution, pruned to the window's
//! partitions.
//!
//! What it must not depend on: the store's runtime, the adk adapter or the
//! CLI. It needs the schema crate's names and the operations crate's
//! connection, and runs on a connection of its own, never on the append
//! path. `docs/ARCHITECTURE.md` ("Usage rollups") explains the design.

#![warn(missing_docs)]

mod bucket;
pub mod error;
mod job;
mod query;
mod rows;
pub mod sketch;

pub use bucket::{Aggregate, Author, BucketKey, Kind, Level};
pub use error::{RollupError, UsageError};
pub use job::{RollupConfig, RollupReport, run_rollup};
pub use query::{
    AUTO_POINTS, AUTO_STEPS, GroupBy, MAX_POINTS, Percentiles, Resolution, Tiers, UsageFigures, UsagePlan, UsagePoint,
    UsageQuery, UsageReport, UsageSeries, plan, tiers, usage, usage_at,
};
