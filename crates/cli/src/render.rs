//! Human-readable output: what `adk-pg status` and `adk-pg maintain` print.

use adk_postgres_retention::{HealthReport, MaintenanceReport};
use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};

fn bytes(value: Option<i64>) -> String {
    value.map(|v| format!("{v} B")).unwrap_or_else(|| "-".into())
}

/// The `adk-pg status` table: one row per check.
pub fn health_table(report: &HealthReport) -> String {
    let mut table = Table::new();
    table.load_style(UTF8_FULL_CONDENSED).set_header(["check", "value"]);
    let last_run = report
        .last_run
        .as_ref()
        .map(|r| {
            format!(
                "{} (for {}, {} created, {} dropped)",
                r.finished_at.format("%Y-%m-%d %H:%M:%S UTC"),
                r.today,
                r.created,
                r.dropped
            )
        })
        .unwrap_or_else(|| "never".into());
    let rows: Vec<(&str, String)> = vec![
        ("today (UTC)", report.today.to_string()),
        ("partitions", report.partitions.to_string()),
        ("partitions ahead", report.partitions_ahead.to_string()),
        ("oldest partition", report.oldest_partition.clone().unwrap_or_else(|| "-".into())),
        ("newest partition", report.newest_partition.clone().unwrap_or_else(|| "-".into())),
        (
            "pending detaches",
            if report.pending_detaches.is_empty() { "none".into() } else { report.pending_detaches.join(", ") },
        ),
        (
            "orphaned partitions",
            if report.orphaned_partitions.is_empty() { "none".into() } else { report.orphaned_partitions.join(", ") },
        ),
        ("last maintenance run", last_run),
        (
            "HOT updates (adk_sessions)",
            match report.hot_ratio {
                Some(ratio) => format!("{:.1}% of {}", ratio * 100.0, report.session_updates),
                None => "no updates yet".into(),
            },
        ),
        ("sessions", report.state_sizes.sessions.to_string()),
        (
            "state size p50 / p90 / p99 / max",
            format!(
                "{} / {} / {} / {}",
                bytes(report.state_sizes.p50),
                bytes(report.state_sizes.p90),
                bytes(report.state_sizes.p99),
                bytes(report.state_sizes.max)
            ),
        ),
        ("status", if report.is_healthy() { "OK".into() } else { format!("{} alert(s)", report.alerts.len()) }),
    ];
    for (check, value) in rows {
        table.add_row([check.to_owned(), value]);
    }
    table.to_string()
}

/// What `adk-pg maintain` prints after a run.
pub fn maintenance_summary(report: &MaintenanceReport) -> String {
    if report.skipped {
        return "another maintenance run held the lock for too long; skipped".into();
    }
    let days = |d: &[chrono::NaiveDate]| d.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ");
    let mut lines = vec![format!(
        "maintenance for {}: {} partition(s) created, {} dropped, {} session(s) deleted, {} day(s) ahead",
        report.today.map(|d| d.to_string()).unwrap_or_default(),
        report.created.len(),
        report.dropped.len(),
        report.sessions_deleted,
        report.partitions_ahead
    )];
    if !report.created.is_empty() {
        lines.push(format!("  created: {}", days(&report.created)));
    }
    if !report.dropped.is_empty() {
        lines.push(format!("  dropped: {}", report.dropped.join(", ")));
    }
    if !report.finalized.is_empty() {
        lines.push(format!("  finished interrupted detaches: {}", report.finalized.join(", ")));
    }
    if !report.reattached.is_empty() {
        lines.push(format!("  re-attached: {}", report.reattached.join(", ")));
    }
    if report.waited_for_other_run {
        lines.push("  (waited for another run to finish first)".into());
    }
    lines.join("\n")
}
