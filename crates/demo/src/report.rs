//! [`DemoReport`]: what a run measured, and how it reads.

use std::fmt::Write as _;
use std::time::Duration;

use adk_postgres_retention::{HealthReport, MaintenanceReport};
use adk_postgres_rollup::{RollupReport, UsageFigures, UsageReport};

use crate::agent::MeterReading;
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

/// The run's usage, rolled up and read back from the rollups.
#[derive(Debug, Clone)]
pub struct UsageAnalytics {
    /// The rollup run that counted (the last one tried).
    pub rollup: RollupReport,
    pub rollup_time: Duration,
    /// Runs tried: more than one when another run held the rollup state.
    pub attempts: usize,
    /// The app's usage of the last hour: one series, `all`.
    pub all: UsageReport,
    pub by_kind: UsageReport,
    pub by_agent: UsageReport,
    /// What the model reported over the run's answers.
    pub model: MeterReading,
}

impl UsageAnalytics {
    /// The app's totals over the window (zero when nothing was rolled up).
    pub fn total(&self) -> UsageFigures {
        self.all.series.first().map(|s| s.total.clone()).unwrap_or_default()
    }

    /// Whether the rollups hold exactly `events` events, and the tokens and
    /// cost the model reported.
    pub fn matches(&self, events: i64) -> bool {
        let total = self.total();
        total.events == events
            && u64::try_from(total.prompt_tokens) == Ok(self.model.prompt_tokens)
            && u64::try_from(total.candidates_tokens) == Ok(self.model.candidates_tokens)
            && total.cost.as_deref().and_then(decimal_nanos) == Some(self.model.cost_nanos)
    }

    /// A table of `report`'s series totals, headed `group`, with the app's
    /// total as its last row when `with_total`.
    fn table(&self, group: &str, report: &UsageReport, with_total: bool) -> comfy_table::Table {
        let mut table = comfy_table::Table::new();
        table.load_style(comfy_table::presets::UTF8_FULL_CONDENSED).set_header([
            group,
            "events",
            "errors",
            "tokens in",
            "tokens out",
            "cost USD",
            "latency p50 ms",
            "p95 ms",
            "p99 ms",
            "payload p50 B",
            "sessions",
            "users",
        ]);
        let decimals = |v: Option<f64>, places: usize| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.places$}"));
        let row = |label: &str, f: &UsageFigures| {
            vec![
                label.to_owned(),
                f.events.to_string(),
                f.errors.to_string(),
                f.prompt_tokens.to_string(),
                f.candidates_tokens.to_string(),
                f.cost.clone().unwrap_or_else(|| "-".into()),
                decimals(f.latency_ms.p50, 2),
                decimals(f.latency_ms.p95, 2),
                decimals(f.latency_ms.p99, 2),
                decimals(f.payload_size.p50, 0),
                f.sessions.to_string(),
                f.users.to_string(),
            ]
        };
        for series in &report.series {
            table.add_row(row(&series.group, &series.total));
        }
        if with_total {
            table.add_row(row("all", &self.total()));
        }
        for i in 1..=11 {
            if let Some(column) = table.column_mut(i) {
                column.set_cell_alignment(comfy_table::CellAlignment::Right);
            }
        }
        table
    }
}

/// A non-negative decimal in billionths (`"0.000061"` is 61,000); `None`
/// when it has more than nine decimals or is not a plain decimal.
fn decimal_nanos(text: &str) -> Option<u64> {
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    if fraction.len() > 9 || !whole.bytes().chain(fraction.bytes()).all(|b| b.is_ascii_digit()) || whole.is_empty() {
        return None;
    }
    let fraction: u64 = format!("{fraction:0<9}").parse().ok()?;
    whole.parse::<u64>().ok()?.checked_mul(1_000_000_000)?.checked_add(fraction)
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
    /// The run's events rolled up into usage analytics and read back.
    pub usage: UsageAnalytics,
    /// `adk-pg status` after the run.
    pub health: HealthReport,
    /// The concurrent conversations alone.
    pub traffic_time: Duration,
    /// The whole run: migrations, maintenance, traffic, checks.
    pub total_time: Duration,
}

impl DemoReport {
    /// Every session and event is there, the reopened store holds all of
    /// it, and the usage rollups count every event and every token.
    pub fn passed(&self) -> bool {
        self.persistence.passed()
            && self.usage.matches(self.events)
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
        let usage = &self.usage;
        writeln!(
            out,
            "usage analytics  run_rollup (what `adk-pg rollup` runs) in {:.0} ms{}:",
            usage.rollup_time.as_secs_f64() * 1000.0,
            if usage.attempts > 1 {
                format!(" (attempt {}: another run held the rollup state)", usage.attempts)
            } else {
                String::new()
            }
        )?;
        for line in usage.rollup.to_string().lines() {
            writeln!(out, "  {line}")?;
        }
        let total = usage.total();
        let model = &usage.model;
        let matches = usage.matches(self.events);
        writeln!(
            out,
            "  check: {} events, {} tokens in, {} out, {} USD in the rollups; stored {} events, the model reported \
             {} tokens in, {} out, {} USD over {} answers{}",
            total.events,
            total.prompt_tokens,
            total.candidates_tokens,
            total.cost.as_deref().unwrap_or("0"),
            self.events,
            model.prompt_tokens,
            model.candidates_tokens,
            model.cost(),
            model.calls,
            check(matches)
        )?;
        writeln!(
            out,
            "  usage_at (what `adk-pg usage --app {} --since 1h --by kind` reads): {} to {}, {} rollups",
            self.app_name,
            usage.by_kind.plan.since.format("%H:%M"),
            usage.by_kind.plan.until.format("%H:%M UTC"),
            usage.by_kind.plan.level
        )?;
        writeln!(out, "{}", usage.table("kind", &usage.by_kind, true))?;
        writeln!(out, "{}", usage.table("agent", &usage.by_agent, false))?;
        writeln!(
            out,
            "  tokens and cost are the offline model's estimates (4 characters a token, {} / {} USD per million in / \
             out); latency: since the previous event of the same invocation",
            crate::agent::PRICE_PER_MILLION.0,
            crate::agent::PRICE_PER_MILLION.1
        )?;
        writeln!(out)?;
        writeln!(out, "adk-pg status")?;
        writeln!(out, "{}", self.health)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::decimal_nanos;

    #[test]
    fn decimals_in_billionths() {
        assert_eq!(decimal_nanos("0.000061"), Some(61_000));
        assert_eq!(decimal_nanos("12"), Some(12_000_000_000));
        assert_eq!(decimal_nanos("1.123456789"), Some(1_123_456_789));
        assert_eq!(decimal_nanos("0.0000000001"), None);
        assert_eq!(decimal_nanos("-1"), None);
        assert_eq!(decimal_nanos("1e-5"), None);
        assert_eq!(decimal_nanos(".5"), None);
    }
}
