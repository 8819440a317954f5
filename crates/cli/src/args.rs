//! Command-line arguments.

use chrono::NaiveDate;
use clap::{Args, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "adk-pg", version, about = "Operate an adk-postgres session store")]
pub struct Cli {
    /// PostgreSQL URL, e.g. postgres://user@host/db
    #[arg(long, env = "DATABASE_URL", global = true, hide_env_values = true, default_value = "")]
    pub database_url: String,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Apply pending schema migrations.
    Migrate,
    /// Premake partitions ahead of today and retire days past lifetime + retention.
    Maintain(MaintainArgs),
    /// Delete sessions whose expires_at has passed, with their events.
    Expire {
        /// Sessions deleted per statement.
        #[arg(long, default_value_t = 500)]
        batch_size: i64,
        #[arg(long)]
        json: bool,
    },
    /// Convert an unpartitioned adk_events into daily partitions without
    /// rewriting it (resumable; run it again after an interruption).
    ConvertEvents {
        /// Print the SQL of the remaining steps and change nothing.
        #[arg(long)]
        dry_run: bool,
        /// The first day of daily partitions (default: today, UTC).
        #[arg(long)]
        cutover: Option<NaiveDate>,
        /// Longest any step waits for its lock before retrying.
        #[arg(long, default_value = "2s")]
        lock_timeout: humantime::Duration,
    },
    /// Build an index on every partition of adk_events without blocking writes.
    CreateIndex {
        /// Index name (on the parent; partitions get derived names).
        name: String,
        /// Comma-separated columns, e.g. app_name,author
        #[arg(long, value_delimiter = ',', required = true)]
        columns: Vec<String>,
        #[arg(long, default_value = "2s")]
        lock_timeout: humantime::Duration,
    },
    /// Grant a non-owner role what the service needs, so row-level security
    /// applies to it; creates the role with --create.
    ServiceRole {
        role: String,
        #[arg(long)]
        create: bool,
        /// Read the role's password from this environment variable.
        #[arg(long)]
        password_env: Option<String>,
    },
    /// Report health; exits 2 when something needs attention.
    Status {
        #[arg(long)]
        json: bool,
        /// Alert when fewer future days have a partition.
        #[arg(long, default_value_t = 3)]
        min_partitions_ahead: u32,
        /// Alert when the last successful maintenance run is older.
        #[arg(long, default_value = "24h")]
        max_run_age: humantime::Duration,
        /// The UTC day to judge by (default: today).
        #[arg(long)]
        today: Option<NaiveDate>,
    },
}

#[derive(Debug, Args)]
pub struct MaintainArgs {
    /// Run once and exit (the default).
    #[arg(long, conflicts_with = "every")]
    pub once: bool,
    /// Keep running, once per interval (e.g. 6h).
    #[arg(long)]
    pub every: Option<humantime::Duration>,
    #[arg(long, default_value_t = 7)]
    pub premake_days: u32,
    #[arg(long, default_value_t = 7)]
    pub max_session_lifetime_days: u32,
    #[arg(long, default_value_t = 30)]
    pub retention_days: u32,
    #[arg(long, default_value_t = 5000)]
    pub session_delete_batch: i64,
    /// Longest any DDL statement waits for its lock before retrying.
    #[arg(long, default_value = "2s")]
    pub lock_timeout: humantime::Duration,
    /// The UTC day to maintain for (default: today).
    #[arg(long)]
    pub today: Option<NaiveDate>,
    #[arg(long)]
    pub json: bool,
}
