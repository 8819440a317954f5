//! The operations room of adk-postgres: everything an operator runs
//! unattended against a live database. Partition maintenance (premake ahead
//! of the clock, drop days past lifetime plus retention as the store's
//! policy in the database sets them, never a day a live session still
//! holds, recover from interrupted runs), session expiry, health,
//! conversion of a live unpartitioned event table, and concurrent index
//! builds on the partitioned log.
//!
//! Every operation opens its own autocommit connection: some DDL refuses a
//! transaction block, and none of it should hold a pooled connection that
//! serves traffic. Every DDL statement runs under `lock_timeout` with retry,
//! so live appends never queue behind it for long.

pub mod convert;
pub mod error;
pub mod expiry;
pub mod health;
pub mod index;
pub mod maintenance;
pub mod partitions;
pub mod policy;
pub mod sql;
pub mod tenancy;

pub use convert::{
    ConvertOptions, ConvertPlan, ConvertProgress, ConvertReport, ConvertStep, StepKind, conversion_plan,
    convert_events, convert_events_with, plan_conversion,
};
pub use error::OpsError;
pub use expiry::{ExpiryReport, expire_sessions};
pub use health::{HealthReport, HealthThresholds, health};
pub use index::{IndexOptions, IndexProgress, IndexReport, create_partitioned_index, create_partitioned_index_with};
pub use maintenance::{MaintenanceConfig, MaintenanceReport, run_maintenance};
pub use policy::{KeptDay, PolicySummary, retire_before, store_policy};
pub use sql::LockPolicy;
pub use tenancy::{
    AppBinding, BindingChange, RoleBindings, STORE_FUNCTIONS, STORE_TABLES, ServiceRoleOptions, ServiceRoleReport,
    ServiceRoleView, setup_service_role, show_service_role,
};
