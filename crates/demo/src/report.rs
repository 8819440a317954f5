//! [`DemoReport`]: what a run measured, and how it reads.

use std::fmt::Write as _;
use std::time::Duration;

use adk_postgres_retention::{HealthReport, MaintenanceReport};

use crate::timing::LatencySummary;

/// Updates of `adk_sessions` during the run, from `pg_stat_user_tables`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HotUpdates {
    pub updates: i64,
    /// Of those, heap-only-tuple updates (no index touched).
    pub hot: i64,
    /// False when the statistics had not caught up with every append by
    /// the time the demo stopped waiting.
    pub settled: bool,
}

impl HotUpdates {
    pub fn ratio(&self) -> Option<f64> {
        (self.updates > 0).then(|| self.hot as f64 / self.updates as f64)
    }
}

/// The reopened store compared with what the runner streamed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Persistence {
    pub sessions_checked: usize,
    pub events_checked: usize,
    /// Everything missing or different, one line each; empty when the check
    /// passed.
    pub problems: Vec<String>,
}

impl Persistence {
    pub fn passed(&self) -> bool {
        self.problems.is_empty()
    }
}

/// What [`crate::run_demo`] did and measured.
#[derive(Debug, Clone)]
pub struct DemoReport {
    /// The app the run's sessions belong to (unique per run).
    pub app_name: String,
    pub users: usize,
    pub turns: usize,
    /// Migrations this run applied (none when the schema was current).
    pub migrations_applied: Vec<String>,
    pub maintenance: MaintenanceReport,
    /// Rows the run left in `adk_sessions` and `adk_events`.
    pub sessions: i64,
    pub events: i64,
    pub expected_events: i64,
    pub distinct_users: i64,
    /// Users whose `user:preference` (written by the tool) is stored.
    pub users_with_preference: i64,
    /// `append_event*` as the runner saw them.
    pub appends: LatencySummary,
    /// Appends of one user alone (same script, same pool, after the crowd):
    /// the store's cost without queueing.
    pub solo_appends: LatencySummary,
    /// Connections in the pool the users share.
    pub pool_size: u32,
    /// Session loads (one per turn) as the runner saw them.
    pub gets: LatencySummary,
    pub hot: HotUpdates,
    pub persistence: Persistence,
    /// `adk-pg status` after the run.
    pub health: HealthReport,
    /// The concurrent conversations alone.
    pub traffic_time: Duration,
    /// The whole run: migrations, maintenance, traffic, checks.
    pub total_time: Duration,
}

impl DemoReport {
    /// Every session and event is there and the reopened store holds all of it.
    pub fn passed(&self) -> bool {
        self.persistence.passed()
            && usize::try_from(self.sessions) == Ok(self.users)
            && self.events == self.expected_events
            && usize::try_from(self.users_with_preference) == Ok(self.users)
    }

    /// The report as printed by `cargo xtask demo`.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = self.write(&mut out);
        out
    }

    fn write(&self, out: &mut String) -> std::fmt::Result {
        let secs = |d: Duration| format!("{:.2} s", d.as_secs_f64());
        let migrations = if self.migrations_applied.is_empty() {
            "schema already current".to_owned()
        } else {
            format!("{} migration(s) applied", self.migrations_applied.len())
        };
        writeln!(out, "schema         {migrations}")?;
        for (i, line) in self.maintenance.to_string().lines().enumerate() {
            writeln!(out, "{}{line}", if i == 0 { "maintenance    " } else { "             " })?;
        }
        writeln!(
            out,
            "traffic        {} users x {} turns at once (app {}): adk-runner Runner + LlmAgent on PgSessionService,",
            self.users, self.turns, self.app_name
        )?;
        writeln!(
            out,
            "               scripted offline model; turn {} calls a tool writing user:preference, output_key writes \
             user:last_reply",
            crate::agent::Script { turns: self.turns }.tool_turn()
        )?;
        writeln!(out)?;
        writeln!(out, "report")?;
        let check = |ok: bool| if ok { "" } else { "  <-- MISMATCH" };
        writeln!(
            out,
            "  sessions            {}{}",
            self.sessions,
            check(usize::try_from(self.sessions) == Ok(self.users))
        )?;
        writeln!(
            out,
            "  events              {} ({} expected){}",
            self.events,
            self.expected_events,
            check(self.events == self.expected_events)
        )?;
        writeln!(
            out,
            "  users               {} ({} with user:preference stored){}",
            self.distinct_users,
            self.users_with_preference,
            check(usize::try_from(self.users_with_preference) == Ok(self.users))
        )?;
        writeln!(out, "  partitions ahead    {}", self.health.partitions_ahead)?;
        let hot = match self.hot.ratio() {
            Some(ratio) => format!(
                "{:.1} % of {} updates of adk_sessions during the run{}",
                ratio * 100.0,
                self.hot.updates,
                if self.hot.settled { "" } else { " (statistics still catching up)" }
            ),
            None => "no updates reported yet".to_owned(),
        };
        writeln!(out, "  HOT updates         {hot}")?;
        let latency = |l: &LatencySummary| {
            format!("p50 {:.2} ms, p99 {:.2} ms (max {:.2} ms, {} calls)", l.p50_ms, l.p99_ms, l.max_ms, l.count)
        };
        writeln!(out, "  append latency      {}", latency(&self.appends))?;
        writeln!(
            out,
            "                      as the Runner saw them: {} users at once on {} pooled connections, {} CPU(s), {} build",
            self.users,
            self.pool_size,
            std::thread::available_parallelism().map_or(1, usize::from),
            if cfg!(debug_assertions) { "debug" } else { "release" }
        )?;
        writeln!(out, "  one user alone      {} (appends, after the crowd, same pool)", latency(&self.solo_appends))?;
        writeln!(out, "  session load        {} (the Runner loads the session every turn)", latency(&self.gets))?;
        let throughput = self.appends.count as f64 / self.traffic_time.as_secs_f64().max(f64::EPSILON);
        writeln!(out, "  conversations       {} ({throughput:.0} appends/s)", secs(self.traffic_time))?;
        writeln!(out, "  wall time           {} (migrate, maintain, converse, reopen, check)", secs(self.total_time))?;
        if self.persistence.passed() {
            writeln!(
                out,
                "  persistence         OK: a new store instance on a new pool reloaded {} of {} sessions with all \
                 {} events and their user: state",
                self.persistence.sessions_checked, self.users, self.persistence.events_checked
            )?;
        } else {
            writeln!(out, "  persistence         FAILED: {} problem(s)", self.persistence.problems.len())?;
            for problem in self.persistence.problems.iter().take(20) {
                writeln!(out, "    - {problem}")?;
            }
        }
        writeln!(out)?;
        writeln!(out, "adk-pg status")?;
        writeln!(out, "{}", self.health)?;
        Ok(())
    }
}
