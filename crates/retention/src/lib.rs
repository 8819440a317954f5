//! Retention and the other unattended work an operator runs against a live
//! adk-postgres database: partition maintenance (premake days ahead of the
//! clock, retire days past the session lifetime plus the retention the
//! store's policy sets, never a day a live session still holds, recover
//! from interrupted runs), session expiry, health, converting a live
//! unpartitioned event table, and building indexes on the partitioned log.
//!
//! What it must not depend on: the adk adapter, the `adk-pg` CLI, or the
//! store's internals. It needs the database layout (`adk-postgres-schema`)
//! and the store's published policy and error classifier, and nothing else
//! of the runtime: it talks SQL on autocommit connections of its own,
//! because some of its DDL refuses a transaction block and none of it may
//! hold a pooled connection the service needs. Every DDL statement runs
//! under `lock_timeout` with retry, so live appends never queue behind it
//! for long. `docs/ARCHITECTURE.md` places it among the other crates.
//!
//! Reports implement `Display` as the CLI prints them, and `Serialize` for
//! `--json`, so every tool that shows one shows the same text.

#![warn(missing_docs)]

mod catalog;
pub mod convert;
mod ddl_watch;
pub mod expiry;
pub mod health;
pub mod index;
mod lock;
pub mod maintenance;
pub mod partitions;
pub mod policy;

/// How retention's DDL waits for locks; its configurations carry one.
pub use adk_postgres_operations::LockPolicy;
/// Retention's operations fail as every operation does.
pub use adk_postgres_operations::OperationsError as RetentionError;
pub use convert::{
    ConvertOptions, ConvertPlan, ConvertProgress, ConvertReport, ConvertStep, StepKind, conversion_plan,
    convert_events, convert_events_with, plan_conversion,
};
pub use expiry::{ExpiryReport, expire_sessions};
pub use health::{ArchiveHealth, HealthReport, HealthThresholds, PendingArchive, RollupHealth, health};
pub use index::{IndexOptions, IndexProgress, IndexReport, create_partitioned_index, create_partitioned_index_with};
pub use maintenance::{ArchiveFailure, MaintenanceConfig, MaintenanceReport, run_maintenance};
pub use policy::{
    KeptDay, PolicySummary, UsageSummary, policy_settings, retire_before, span_text, store_policy, usage_installed,
    usage_policy,
};
