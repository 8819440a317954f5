//! The operator's jobs against a real PostgreSQL: partition maintenance,
//! the archive tier, expiry, session lifetime and rollover, the policy row,
//! converting a live event log, and index builds on the partitioned log.
//!
//! One binary for the area: each file is a module named for the behaviour
//! it pins.

mod archive;
mod archive_faults;
mod concurrent_index_build;
mod expiry;
mod lifetime_rollover;
mod live_conversion;
mod media_lifetime;
mod partition_maintenance;
mod policy;
