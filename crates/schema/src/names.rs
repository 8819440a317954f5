//! Names the SQL and the Rust code must agree on. The migrations spell the
//! same names; `tests/tests/store/data_model.rs` checks the two against the catalog.

use chrono::NaiveDate;

/// One row per session: its state, event counter, day, lifetime, rollover
/// marker, metadata and invocation lease.
pub const SESSIONS: &str = "adk_sessions";
/// The append-only event log, partitioned by the day its session was
/// created (one `adk_events_pYYYYMMDD` partition per UTC day).
pub const EVENTS: &str = "adk_events";
/// `user:` state, one row per app and user, prefix stripped.
pub const USER_STATES: &str = "adk_user_states";
/// `app:` state, one row per app, prefix stripped.
pub const APP_STATES: &str = "adk_app_states";
/// The store's policy: a single row, which a trigger refuses to delete.
pub const STORE_POLICY: &str = "adk_store_policy";
/// The apps each service role may act for; a NULL app means every app.
pub const ROLE_APPS: &str = "adk_role_apps";
/// Every binding and unbinding of a role to an app, written by a trigger.
pub const ROLE_APP_CHANGES: &str = "adk_role_app_changes";
/// Every change to the policy row, written by its trigger.
pub const STORE_POLICY_CHANGES: &str = "adk_store_policy_changes";
/// One row per maintenance run, failed runs included, with the days it
/// kept and why.
pub const MAINTENANCE_RUNS: &str = "adk_maintenance_runs";
/// Media moved out of the log, once per app, counted by the events naming it.
pub const BLOBS: &str = "adk_blobs";
/// Usage rolled up by minute, from the raw events. Each level is
/// partitioned by bucket start.
pub const USAGE_MINUTES: &str = "adk_usage_1m";
/// Usage rolled up by hour, recomputed from the minutes.
pub const USAGE_HOURS: &str = "adk_usage_1h";
/// Usage rolled up by day, recomputed from the hours.
pub const USAGE_DAYS: &str = "adk_usage_1d";
/// The rollup job's single row: its watermark.
pub const USAGE_STATE: &str = "adk_usage_state";
/// The last event rolled up per invocation.
pub const USAGE_INVOCATION_TAILS: &str = "adk_usage_invocation_tails";
/// Events that arrived past the lateness window, counted per app and
/// arrival day instead of rolled up.
pub const USAGE_LATE_EVENTS: &str = "adk_usage_late_events";
/// One row per rollup run.
pub const USAGE_RUNS: &str = "adk_usage_runs";
/// The audit of redacted events: which, why, when, by whom; no content.
pub const EVENT_REDACTIONS: &str = "adk_event_redactions";
/// The archive tier's catalog: one row per object written to object
/// storage.
pub const ARCHIVE_OBJECTS: &str = "adk_archive_objects";
/// Days that failed to archive, which maintenance keeps and alerts on.
pub const ARCHIVE_FAILURES: &str = "adk_archive_failures";
/// Days loaded back from the archive into a read-only schema.
pub const ARCHIVE_RESTORES: &str = "adk_archive_restores";
/// Which text of `crates/schema/sql/` the database holds (its SHA-256), so
/// an unchanged install after a migrate is a no-op.
pub const SCHEMA_SQL: &str = "adk_schema_sql";

/// Every table the migrations create: the store's data, its policy and its
/// history, the tenant bindings, the maintenance log, the usage rollups and
/// the record of the installed functions.
pub const STORE_TABLES: [&str; 22] = [
    SESSIONS,
    EVENTS,
    BLOBS,
    USER_STATES,
    APP_STATES,
    STORE_POLICY,
    STORE_POLICY_CHANGES,
    ROLE_APPS,
    ROLE_APP_CHANGES,
    MAINTENANCE_RUNS,
    USAGE_MINUTES,
    USAGE_HOURS,
    USAGE_DAYS,
    USAGE_STATE,
    USAGE_INVOCATION_TAILS,
    USAGE_LATE_EVENTS,
    USAGE_RUNS,
    SCHEMA_SQL,
    EVENT_REDACTIONS,
    ARCHIVE_OBJECTS,
    ARCHIVE_FAILURES,
    ARCHIVE_RESTORES,
];

/// What every daily partition's name starts with; the day follows as `YYYYMMDD`.
pub const EVENT_PARTITION_PREFIX: &str = "adk_events_p";

/// The partition holding one UTC day; matches the SQL function
/// `adk_event_partition_name`.
pub fn partition_name(day: NaiveDate) -> String {
    format!("{EVENT_PARTITION_PREFIX}{}", day.format("%Y%m%d"))
}

/// The day a daily partition's name stands for.
pub fn day_of_partition(name: &str) -> Option<NaiveDate> {
    let digits = name.strip_prefix(EVENT_PARTITION_PREFIX)?;
    if digits.len() != 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    NaiveDate::parse_from_str(digits, "%Y%m%d").ok()
}

/// Session-level advisory lock keys, one per kind of unattended run, so two
/// runs of one kind never overlap while runs of different kinds may. The
/// high bits spell the project, to stay clear of other users' keys.
pub mod lock_keys {
    /// Held by a partition maintenance run.
    pub const MAINTENANCE: i64 = 0x0adc_9a57_0001;
    /// Held by a live conversion of the event table.
    pub const CONVERSION: i64 = 0x0adc_9a57_0002;
    /// Held by a concurrent build of an index on the partitioned log.
    pub const INDEX_BUILD: i64 = 0x0adc_9a57_0003;
    /// Held by a migrate from its first migration to the end of the install
    /// of the functions: services migrating on start take turns.
    pub const MIGRATION: i64 = 0x0adc_9a57_0004;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn day(s: &str) -> NaiveDate {
        NaiveDate::parse_from_str(s, "%Y-%m-%d").expect("a date")
    }

    #[test]
    fn partition_names_round_trip() {
        assert_eq!(partition_name(day("2026-01-05")), "adk_events_p20260105");
        assert_eq!(day_of_partition("adk_events_p20260105"), Some(day("2026-01-05")));
        assert_eq!(day_of_partition("adk_events_p2026010"), None);
        assert_eq!(day_of_partition("adk_events_p+2026010"), None);
        assert_eq!(day_of_partition("adk_events_legacy"), None);
    }
}
