//! The tables the CLI draws itself: the store's policy, its history and a
//! service role's bindings. Reports of retention work render themselves
//! (`Display`, next to their definitions); these stay here because the
//! store, which defines them, has no business depending on a table crate.

use std::time::Duration;

use adk_postgres_retention::span_text;
use adk_postgres_storage::policy::{PolicySettings, printed_interval};
use adk_postgres_storage::{PolicyChange, ServiceRoleView};
use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};
use serde_json::{Value, json};

fn duration(d: Duration) -> String {
    span_text(d)
}

fn ttl(d: Option<Duration>) -> String {
    d.map_or_else(|| "none".into(), duration)
}

fn kept(d: Option<Duration>) -> String {
    d.map_or_else(|| "keep (for ever)".into(), duration)
}

/// The `adk-pg policy show` table.
pub fn policy_table(settings: &PolicySettings) -> String {
    let (policy, usage) = (&settings.store, &settings.usage);
    let mut table = Table::new();
    table.load_style(UTF8_FULL_CONDENSED).set_header(["setting", "value"]);
    table.add_row(["max session lifetime".to_owned(), duration(policy.max_session_lifetime)]);
    table.add_row(["retention (after the lifetime)".to_owned(), duration(policy.retention)]);
    table.add_row(["default TTL".to_owned(), ttl(policy.default_ttl)]);
    table.add_row(["premake days".to_owned(), policy.premake_days.to_string()]);
    table.add_row(["usage lateness".to_owned(), duration(usage.lateness)]);
    table.add_row(["usage minute retention".to_owned(), duration(usage.minute_retention)]);
    table.add_row(["usage hour retention".to_owned(), duration(usage.hour_retention)]);
    table.add_row(["usage day retention".to_owned(), kept(usage.day_retention)]);
    table.to_string()
}

/// `adk-pg policy show --json`: each duration readable and in seconds; a
/// day tier kept for ever is `null`.
pub fn policy_json(settings: &PolicySettings, archive: &adk_postgres_archive::ArchivePolicy) -> Value {
    let (policy, usage) = (&settings.store, &settings.usage);
    json!({
        "max_session_lifetime": duration(policy.max_session_lifetime),
        "max_session_lifetime_secs": policy.max_session_lifetime.as_secs_f64(),
        "retention": duration(policy.retention),
        "retention_secs": policy.retention.as_secs_f64(),
        "default_ttl": policy.default_ttl.map(duration),
        "default_ttl_secs": policy.default_ttl.map(|d| d.as_secs_f64()),
        "premake_days": policy.premake_days,
        "usage_lateness": duration(usage.lateness),
        "usage_lateness_secs": usage.lateness.as_secs_f64(),
        "usage_minute_retention": duration(usage.minute_retention),
        "usage_minute_retention_secs": usage.minute_retention.as_secs_f64(),
        "usage_hour_retention": duration(usage.hour_retention),
        "usage_hour_retention_secs": usage.hour_retention.as_secs_f64(),
        "usage_day_retention": usage.day_retention.map(duration),
        "usage_day_retention_secs": usage.day_retention.map(|d| d.as_secs_f64()),
        "archive_url": archive.url,
        "archive_apps": archive.apps,
        "archive_format": archive.format_version,
    })
}

/// The `adk-pg archive list` table: one row per object.
pub fn archive_table(objects: &[adk_postgres_archive::ArchivedObject]) -> String {
    let mut table = Table::new();
    table.load_style(UTF8_FULL_CONDENSED).set_header([
        "app",
        "day",
        "object",
        "rows",
        "bytes",
        "sha256",
        "verified (UTC)",
    ]);
    for object in objects {
        let sha: String = object.sha256.iter().take(6).map(|b| format!("{b:02x}")).collect();
        table.add_row([
            object.app_name.clone(),
            object.day.to_string(),
            object.object_key.clone(),
            object.rows.to_string(),
            object.bytes.to_string(),
            format!("{sha}…"),
            object.verified_at.format("%Y-%m-%d %H:%M:%S").to_string(),
        ]);
    }
    table.to_string()
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
