//! Command-line arguments.

use std::time::Duration;

use chrono::{DateTime, NaiveDate, TimeDelta, Utc};
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
    /// Apply pending schema migrations. On a database with the citus
    /// extension, then distribute the store by user_id (see
    /// docs/citus.md)
    Migrate {
        /// Create the citus extension first when the database lacks it
        /// (the server must preload citus and the workers must be added)
        #[arg(long)]
        citus: bool,
    },
    /// Premake partitions ahead of today and retire days past lifetime +
    /// retention, as the store's policy (adk-pg policy) sets them.
    Maintain(MaintainArgs),
    /// Show or change the store's policy (session lifetime, retention,
    /// default TTL, days premade, usage lateness and rollup tiers), which
    /// lives in the database.
    Policy {
        #[command(subcommand)]
        command: PolicyCommand,
    },
    /// The archive of retired days (see `policy set --archive`): list what
    /// it holds, check its objects, load a day back for an audit.
    Archive {
        #[command(subcommand)]
        command: ArchiveCommand,
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
    /// Roll up the events that arrived since the last run into minute, hour
    /// and day usage rows; exits 2 when writers kept it from advancing.
    Rollup(RollupArgs),
    /// Usage of one app over a time window, from the rollups.
    Usage(UsageArgs),
    /// Report health; exits 2 when something needs attention.
    Status {
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        thresholds: ThresholdArgs,
        /// The UTC day to judge by (default: today).
        #[arg(long)]
        today: Option<NaiveDate>,
    },
    /// Serve Prometheus metrics (/metrics), liveness and readiness
    /// (/healthz, /readyz) and an HTML dashboard (/), read-only. Listening
    /// beyond loopback needs a bearer token in ADK_PG_SERVE_TOKEN.
    Serve(ServeArgs),
    /// Erase a user of an app: every session (expired ones too), their
    /// events, the user state and the usage job's invocation tails, in
    /// short batches, leaving an audit record without content. App state
    /// stays. Safe to interrupt: run it again to finish.
    EraseUser(EraseUserArgs),
    /// List an app's live sessions across its users, newest created first:
    /// user, session, display name, labels, version, created and last
    /// updated. For the store's owner and roles bound to the app.
    Sessions(SessionsArgs),
    /// Turn the live change feed (watch, watch_app) on or off, or show it.
    /// Off after migrating: it costs appends a cluster-wide lock at commit.
    ChangeFeed {
        #[arg(value_enum)]
        switch: FeedSwitch,
    },
}

#[derive(Debug, Subcommand)]
pub enum ArchiveCommand {
    /// The archived objects of one app (or of every app, for the store's
    /// owner), from the catalog.
    List {
        /// Only this app's objects; a role bound to apps must name one.
        #[arg(long)]
        app: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Read every archived object back and check it against the catalog
    /// (size, SHA-256, row count); exits 2 when one does not verify.
    Verify {
        #[arg(long)]
        app: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Load an archived day of one app into a separate, read-only schema,
    /// checked against the catalog first; run again, it replaces the
    /// earlier copy. The store's owner only.
    Restore {
        #[arg(long)]
        app: String,
        /// The UTC day, YYYY-MM-DD.
        #[arg(long)]
        day: NaiveDate,
        /// The schema to load into (made when missing); never the store's.
        #[arg(long = "into", default_value = adk_postgres_archive::DEFAULT_RESTORE_SCHEMA)]
        schema: String,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
pub struct EraseUserArgs {
    /// The app the user belongs to.
    #[arg(long)]
    pub app: String,
    /// The user id, exactly as the agent service stores it.
    #[arg(long)]
    pub user: String,
    /// Count what would be erased and write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Most rows one batch (one short transaction) deletes.
    #[arg(long, default_value_t = adk_postgres_storage::DEFAULT_ERASE_BATCH)]
    pub batch_size: u32,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct SessionsArgs {
    /// The app whose sessions to list.
    #[arg(long)]
    pub app: String,
    /// Only sessions carrying this label (repeat: every one must match).
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = parse_label)]
    pub labels: Vec<(String, String)>,
    /// Only sessions last updated at or after this instant (RFC 3339).
    #[arg(long, value_name = "RFC3339")]
    pub updated_since: Option<DateTime<chrono::FixedOffset>>,
    /// Most sessions shown (pages of up to 200 are read until then).
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub limit: u32,
    #[arg(long)]
    pub json: bool,
}

fn parse_label(text: &str) -> Result<(String, String), String> {
    text.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| format!("expected KEY=VALUE, got {text:?}"))
}

/// When health turns into alerts: `status`'s exit code 2, and `serve`'s red
/// cards, `adk_pg_alerts_firing` and readiness.
#[derive(Debug, Args)]
pub struct ThresholdArgs {
    /// Alert when fewer future days have a partition.
    #[arg(long, default_value_t = 3)]
    pub min_partitions_ahead: u32,
    /// Alert when the last successful maintenance run is older.
    #[arg(long, default_value = "24h")]
    pub max_run_age: humantime::Duration,
    /// Alert when the usage rollups are further behind the clock.
    #[arg(long, default_value = "15m")]
    pub max_rollup_lag: humantime::Duration,
    /// Alert when more events arriving today (UTC) were rejected as late.
    #[arg(long, default_value_t = 0)]
    pub max_late_rejected: u64,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address and port to listen on. Anything but a loopback address is
    /// refused unless ADK_PG_SERVE_TOKEN holds a bearer token, which every
    /// endpoint but /healthz then requires.
    #[arg(long, default_value = "127.0.0.1:9187")]
    pub listen: std::net::SocketAddr,
    /// Longest one statement, or one lock wait, of a request may take; a
    /// slower section of the page shows an error instead.
    #[arg(long, default_value = "5s")]
    pub statement_timeout: humantime::Duration,
    #[command(flatten)]
    pub thresholds: ThresholdArgs,
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

#[derive(Debug, Args)]
pub struct RollupArgs {
    /// Run once and exit (the default).
    #[arg(long, conflicts_with = "every")]
    pub once: bool,
    /// Keep running, once per interval (e.g. 1m).
    #[arg(long)]
    pub every: Option<humantime::Duration>,
    /// Named authors kept per app and bucket; the rest fold into (other).
    #[arg(long, default_value_t = 1000)]
    pub author_cap: usize,
    /// Longest a run waits for in-flight appends before it gives up
    /// advancing this time.
    #[arg(long, default_value = "30s")]
    pub writer_wait: humantime::Duration,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct UsageArgs {
    /// The app to report on.
    #[arg(long)]
    pub app: String,
    /// Start of the window: RFC 3339 (2026-12-01T00:00:00Z), or a duration
    /// before now (24h, 7d).
    #[arg(long, default_value = "24h")]
    pub since: String,
    /// End of the window: RFC 3339, a duration before now (1h, 1h-ago) or
    /// now (the default).
    #[arg(long)]
    pub until: Option<String>,
    /// One series per agent (author) or per kind of event; default: one
    /// series for the whole app.
    #[arg(long)]
    pub by: Option<String>,
    /// Width of one point: auto, or 1m, 5m, 1h, 1d, … (minutes, hours, days).
    #[arg(long, default_value = "auto")]
    pub resolution: String,
    #[arg(long)]
    pub json: bool,
}

/// Reads `--since`/`--until`: an RFC 3339 time, `now`, or a duration
/// before `now` (`7d`, `7d-ago`, `7d ago`).
pub fn time_arg(flag: &str, text: &str, now: DateTime<Utc>) -> Result<DateTime<Utc>, String> {
    let text = text.trim();
    if text.eq_ignore_ascii_case("now") {
        return Ok(now);
    }
    if let Ok(at) = DateTime::parse_from_rfc3339(text) {
        return Ok(at.with_timezone(&Utc));
    }
    let span = text.strip_suffix("-ago").or_else(|| text.strip_suffix(" ago")).unwrap_or(text).trim();
    let duration = humantime::parse_duration(span).map_err(|e| {
        format!("invalid {flag} {text:?}: {e} (an RFC 3339 time such as 2026-12-01T00:00:00Z, or a duration such as 24h or 7d)")
    })?;
    TimeDelta::from_std(duration)
        .ok()
        .and_then(|span| now.checked_sub_signed(span))
        .ok_or_else(|| format!("invalid {flag} {text:?}: reaches before any time that can be stored"))
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
    /// How far an event's own time may be from its arrival and still be
    /// rolled up (1m to 7d); later ones are counted as late.
    #[arg(long)]
    pub usage_lateness: Option<humantime::Duration>,
    /// How long minute rollups are kept (at least the lateness plus a day).
    #[arg(long)]
    pub usage_minute_retention: Option<humantime::Duration>,
    /// How long hour rollups are kept (at least as long as the minutes).
    #[arg(long)]
    pub usage_hour_retention: Option<humantime::Duration>,
    /// How long day rollups are kept (at least as long as the hours), or
    /// `keep` to keep them for ever.
    #[arg(long, value_parser = parse_kept)]
    pub usage_day_retention: Option<Kept>,
    /// Archive each day before it is dropped, to file:///dir or
    /// s3://bucket/prefix (credentials from the AWS_* environment of the
    /// process that runs maintenance), or `off`.
    #[arg(long)]
    pub archive: Option<String>,
    /// With --archive URL: the apps to archive, comma-separated, or `all`
    /// (the default).
    #[arg(long, value_delimiter = ',', requires = "archive")]
    pub archive_apps: Vec<String>,
    #[arg(long)]
    pub json: bool,
}

/// A `--usage-day-retention` value: a duration, or kept for ever.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kept(pub Option<Duration>);

fn parse_kept(text: &str) -> Result<Kept, String> {
    if text.eq_ignore_ascii_case("keep") {
        return Ok(Kept(None));
    }
    humantime::parse_duration(text)
        .map(|d| Kept(Some(d)))
        .map_err(|e| format!("{e} (a duration such as 800d, or keep)"))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text).map(|t| t.with_timezone(&Utc)).unwrap_or_default()
    }

    #[test]
    fn window_bounds_are_times_or_durations_before_now() {
        let now = at("2026-12-08T12:00:00Z");
        assert_eq!(time_arg("--since", "7d", now), Ok(at("2026-12-01T12:00:00Z")));
        assert_eq!(time_arg("--since", "24h", now), Ok(at("2026-12-07T12:00:00Z")));
        assert_eq!(time_arg("--until", "1h-ago", now), Ok(at("2026-12-08T11:00:00Z")));
        assert_eq!(time_arg("--until", "90m ago", now), Ok(at("2026-12-08T10:30:00Z")));
        assert_eq!(time_arg("--until", "now", now), Ok(now));
        assert_eq!(time_arg("--since", "2026-12-01T00:00:00+01:00", now), Ok(at("2026-11-30T23:00:00Z")));
        for bad in ["yesterday", "", "-1h", "2026-12-01"] {
            let error = time_arg("--since", bad, now).expect_err(bad);
            assert!(error.starts_with("invalid --since"), "{error}");
        }
        assert!(time_arg("--since", "100000000000d", now).is_err());
    }

    #[test]
    fn the_day_tier_is_a_duration_or_kept() {
        assert_eq!(parse_kept("keep"), Ok(Kept(None)));
        assert_eq!(parse_kept("800d"), Ok(Kept(Some(Duration::from_secs(800 * 86_400)))));
        assert!(parse_kept("forever").is_err());
    }

    #[test]
    fn rollup_runs_once_unless_asked_to_loop() {
        let once = Cli::try_parse_from(["adk-pg", "rollup", "--once"]).map(|cli| cli.command);
        assert!(matches!(once, Ok(Command::Rollup(RollupArgs { every: None, author_cap: 1000, .. }))), "{once:?}");
        let every = Cli::try_parse_from(["adk-pg", "rollup", "--every", "1m", "--writer-wait", "5s"]);
        assert!(matches!(every.map(|cli| cli.command), Ok(Command::Rollup(RollupArgs { every: Some(_), .. }))));
        assert!(Cli::try_parse_from(["adk-pg", "rollup", "--once", "--every", "1m"]).is_err());
        assert!(Cli::try_parse_from(["adk-pg", "usage"]).is_err(), "--app is required");
    }

    #[test]
    fn erase_user_needs_an_app_and_a_user() {
        let parsed = Cli::try_parse_from(["adk-pg", "erase-user", "--app", "a", "--user", "u"]).map(|cli| cli.command);
        let Ok(Command::EraseUser(args)) = parsed else { panic!("{parsed:?}") };
        assert_eq!((args.dry_run, args.batch_size, args.json), (false, 1_000, false));
        assert!(Cli::try_parse_from(["adk-pg", "erase-user", "--app", "a"]).is_err(), "--user is required");
        assert!(Cli::try_parse_from(["adk-pg", "erase-user", "--user", "u"]).is_err(), "--app is required");
    }

    #[test]
    fn serve_listens_on_loopback_unless_told_otherwise() {
        let serve = Cli::try_parse_from(["adk-pg", "serve"]).map(|cli| cli.command);
        let Ok(Command::Serve(args)) = serve else { panic!("{serve:?}") };
        assert_eq!(args.listen.to_string(), "127.0.0.1:9187");
        assert_eq!(Duration::from(args.statement_timeout), Duration::from_secs(5));
        assert_eq!(args.thresholds.min_partitions_ahead, 3);
        let open = Cli::try_parse_from(["adk-pg", "serve", "--listen", "0.0.0.0:80", "--max-rollup-lag", "1h"]);
        assert!(matches!(open.map(|cli| cli.command), Ok(Command::Serve(_))));
        assert!(Cli::try_parse_from(["adk-pg", "serve", "--listen", "localhost"]).is_err(), "an address and port");
    }
}

/// What `adk-pg change-feed` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FeedSwitch {
    On,
    Off,
    Status,
}
