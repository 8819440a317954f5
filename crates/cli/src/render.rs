//! Human-readable output: what `adk-pg status`, `adk-pg maintain` and
//! `adk-pg policy` print.

use std::time::Duration;

use adk_postgres_domain::StorePolicy;
use adk_postgres_retention::{HealthReport, MaintenanceReport, PolicySummary, ServiceRoleView};
use adk_postgres_storage::PolicyChange;
use adk_postgres_storage::policy::printed_interval;
use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};
use serde_json::{Value, json};

fn duration(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

fn ttl(d: Option<Duration>) -> String {
    d.map_or_else(|| "none".into(), duration)
}

/// The `adk-pg policy show` table.
pub fn policy_table(policy: &StorePolicy) -> String {
    let mut table = Table::new();
    table.load_style(UTF8_FULL_CONDENSED).set_header(["setting", "value"]);
    table.add_row(["max session lifetime".to_owned(), duration(policy.max_session_lifetime)]);
    table.add_row(["retention (after the lifetime)".to_owned(), duration(policy.retention)]);
    table.add_row(["default TTL".to_owned(), ttl(policy.default_ttl)]);
    table.add_row(["premake days".to_owned(), policy.premake_days.to_string()]);
    table.to_string()
}

/// `adk-pg policy show --json`: each duration readable and in seconds.
pub fn policy_json(policy: &StorePolicy) -> Value {
    json!({
        "max_session_lifetime": duration(policy.max_session_lifetime),
        "max_session_lifetime_secs": policy.max_session_lifetime.as_secs_f64(),
        "retention": duration(policy.retention),
        "retention_secs": policy.retention.as_secs_f64(),
        "default_ttl": policy.default_ttl.map(duration),
        "default_ttl_secs": policy.default_ttl.map(|d| d.as_secs_f64()),
        "premake_days": policy.premake_days,
    })
}

/// `adk-pg policy history --json`.
pub fn policy_changes_json(changes: &[PolicyChange]) -> Value {
    Value::Array(
        changes
            .iter()
            .map(|c| {
                json!({
                    "change_id": c.change_id,
                    "changed_at": c.changed_at,
                    "changed_by": c.changed_by,
                    "before": c.before,
                    "after": c.after,
                })
            })
            .collect(),
    )
}

/// The `adk-pg policy history` table: one row per change, with the fields
/// it changed.
pub fn policy_history_table(changes: &[PolicyChange]) -> String {
    let mut table = Table::new();
    table.load_style(UTF8_FULL_CONDENSED).set_header(["change", "at (UTC)", "by", "changed"]);
    let text = |v: &Value| match v.as_str() {
        Some(text) => printed_interval(text).map_or_else(|| text.to_owned(), duration),
        None => v.to_string(),
    };
    for change in changes {
        let fields = change.changed_fields();
        let changed = if fields.is_empty() {
            "nothing (same values written again)".to_owned()
        } else {
            fields
                .iter()
                .map(|(field, old, new)| format!("{field}: {} -> {}", text(old), text(new)))
                .collect::<Vec<_>>()
                .join("\n")
        };
        table.add_row([
            change.change_id.to_string(),
            change.changed_at.format("%Y-%m-%d %H:%M:%S").to_string(),
            change.changed_by.clone(),
            changed,
        ]);
    }
    table.to_string()
}

fn policy_line(policy: &PolicySummary) -> String {
    format!(
        "lifetime {}, retention {}, default TTL {}, premake {} day(s)",
        duration(Duration::from_secs(policy.max_session_lifetime_secs)),
        duration(Duration::from_secs(policy.retention_secs)),
        ttl(policy.default_ttl_secs.map(Duration::from_secs)),
        policy.premake_days
    )
}

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
            "last run failed",
            report
                .last_failure
                .as_ref()
                .map(|f| format!("{} (for {}): {}", f.finished_at.format("%Y-%m-%d %H:%M:%S UTC"), f.today, f.error))
                .unwrap_or_else(|| "no".into()),
        ),
        ("policy", policy_line(&report.policy)),
        ("retiring days before", report.retire_before.to_string()),
        (
            "kept past retention",
            if report.overdue_partitions.is_empty() {
                "none".into()
            } else {
                report
                    .overdue_partitions
                    .iter()
                    .map(|p| format!("{} ({} live session(s))", p.partition, p.open_sessions))
                    .collect::<Vec<_>>()
                    .join(", ")
            },
        ),
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
    if let (Some(policy), Some(before)) = (&report.policy, report.retire_before) {
        lines.push(format!("  policy: {}; retiring days before {before}", policy_line(policy)));
    }
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
    for kept in &report.kept {
        lines.push(format!(
            "  KEPT {} past retention{}: {}",
            kept.day,
            kept.partition.as_ref().map(|p| format!(" ({p})")).unwrap_or_default(),
            kept.reason
        ));
    }
    if report.waited_for_other_run {
        lines.push("  (waited for another run to finish first)".into());
    }
    lines.join("\n")
}

/// `adk-pg service-role NAME --show`: what the role acts for, any table
/// privilege it should not have, and the history of its bindings.
pub fn service_role(view: &ServiceRoleView) -> String {
    let mut out = format!("{} acts for: {}\n", view.role, view.bindings);
    if view.table_privileges.is_empty() {
        out.push_str("table privileges: none (it runs the store's operations only)\n");
    } else {
        out.push_str(&format!(
            "WARNING: direct table privileges: {}; re-run adk-pg service-role to revoke them\n",
            view.table_privileges.join(", ")
        ));
    }
    let mut table = Table::new();
    table.load_style(UTF8_FULL_CONDENSED).set_header(["at (UTC)", "by", "change", "app"]);
    for change in &view.changes {
        table.add_row([
            change.changed_at.format("%Y-%m-%d %H:%M:%S").to_string(),
            change.changed_by.clone(),
            change.change.clone(),
            change.app_name.clone().unwrap_or_else(|| "(every app)".to_owned()),
        ]);
    }
    out.push_str(&table.to_string());
    out
}
