//! Command-line arguments.

use std::time::Duration;

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
    /// Premake partitions ahead of today and retire days past lifetime +
    /// retention, as the store's policy (adk-pg policy) sets them.
    Maintain(MaintainArgs),
    /// Show or change the store's policy (session lifetime, retention,
    /// default TTL, days premade), which lives in the database.
    Policy {
        #[command(subcommand)]
        command: PolicyCommand,
    },
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
    /// Set up the non-owner role an agent service connects as: bind it to
    /// the apps it may act for and let it run the store's operations (and
    /// nothing else); creates the role with --create.
    ServiceRole {
        role: String,
        #[arg(long)]
        create: bool,
        /// Read the role's password from this environment variable; only its
        /// SCRAM-SHA-256 verifier is sent to the server.
        #[arg(long)]
        password_env: Option<String>,
        /// An app the role may act for (repeat for several). The role's
        /// bindings become exactly these apps.
        #[arg(long = "app", conflicts_with_all = ["all_apps", "show"])]
        apps: Vec<String>,
        /// Let the role act for every app: for a trusted router serving many
        /// tenants from one pool.
        #[arg(long, conflicts_with = "show")]
        all_apps: bool,
        /// Print the role's bindings and their history, change nothing.
        #[arg(long, conflicts_with_all = ["create", "password_env"])]
        show: bool,
        #[arg(long)]
        json: bool,
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

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Print the policy in force.
    Show {
        #[arg(long)]
        json: bool,
    },
    /// Change the policy; fields not given keep their current value. An
    /// invalid policy is refused and nothing is written.
    Set(PolicySetArgs),
    /// Print the recorded changes of the policy, newest first.
    History {
        /// Most changes to print.
        #[arg(long, default_value_t = 20)]
        limit: i64,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
pub struct PolicySetArgs {
    /// Sessions older than this refuse appends, for every client (e.g. 7d).
    #[arg(long)]
    pub max_session_lifetime: Option<humantime::Duration>,
    /// How long events are kept after a session's lifetime (e.g. 30d);
    /// never shorter than the lifetime.
    #[arg(long)]
    pub retention: Option<humantime::Duration>,
    /// Time to live of new sessions unless a client asks for less (e.g. 1h),
    /// or `none`.
    #[arg(long, value_parser = parse_ttl)]
    pub default_ttl: Option<Ttl>,
    /// Days after today that always have an event partition (1 to 366).
    #[arg(long)]
    pub premake_days: Option<u32>,
    #[arg(long)]
    pub json: bool,
}

/// A `--default-ttl` value: a duration, or none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ttl(pub Option<Duration>);

fn parse_ttl(text: &str) -> Result<Ttl, String> {
    if text.eq_ignore_ascii_case("none") {
        return Ok(Ttl(None));
    }
    humantime::parse_duration(text).map(|d| Ttl(Some(d))).map_err(|e| format!("{e} (a duration such as 1h, or none)"))
}
