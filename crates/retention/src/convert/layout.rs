//! The layout the conversion starts from and the one it ends in: the
//! names it creates or expects, the columns it insists on, and migration
//! 000001, whose `CREATE TABLE adk_events` is the target. Kept apart from
//! the planning so that the one place to compare with the migrations is
//! here.

use adk_postgres_schema::migrations::MIGRATIONS;
use diesel::migration::MigrationSource;
use diesel::pg::Pg;

use crate::RetentionError;

/// The old table's name once it is a partition.
pub const LEGACY_PARTITION: &str = "adk_events_legacy";

pub(super) const EVENTS: &str = "adk_events";
pub(super) const SESSIONS: &str = "adk_sessions";
pub(super) const SESSION_DAY: &str = "session_day";
pub(super) const LEGACY_PKEY: &str = "adk_events_legacy_pkey";
pub(super) const LEGACY_EVENT_ID_KEY: &str = "adk_events_legacy_event_id_key";
pub(super) const LEGACY_RANGE: &str = "adk_events_legacy_range";
pub(super) const LEGACY_FKEY: &str = "adk_events_legacy_session_fkey";
pub(super) const SESSIONS_KEY_DAY: &str = "adk_sessions_key_day";
pub(super) const SESSIONS_DAY: &str = "adk_sessions_day";
pub(super) const PARENT_PKEY: &str = "adk_events_pkey";
pub(super) const PARENT_EVENT_ID_KEY: &str = "adk_events_event_id_key";
pub(super) const SEQ_POSITIVE: &str = "adk_events_seq_positive";
pub(super) const PAYLOAD_IS_OBJECT: &str = "adk_events_payload_is_object";
pub(super) const MIGRATIONS_TABLE: &str = "__diesel_schema_migrations";
/// diesel's version of migration 2026-11-01-000001_create_store.
pub(super) const BASELINE_VERSION: &str = "20261101000001";
/// Migration 000001, whose `CREATE TABLE adk_events` the swap runs verbatim.
const CREATE_STORE_SQL: &str = adk_postgres_schema::migrations::CREATE_STORE_UP_SQL;
/// The session-day default of migration 000001.
pub(super) const SESSION_DAY_DEFAULT: &str = "((now() AT TIME ZONE 'UTC')::date)";

pub(super) const KEY: [&str; 4] = ["app_name", "user_id", "session_id", "session_day"];

/// Columns of the legacy `adk_events`: name, type as `format_type` spells
/// it, and whether the partitioned parent requires NOT NULL (the attach
/// refuses a partition that is laxer than its parent).
pub(super) const EVENT_COLUMNS: [(&str, &str, bool); 10] = [
    ("app_name", "text", true),
    ("user_id", "text", true),
    ("session_id", "text", true),
    ("seq", "bigint", true),
    ("event_id", "text", true),
    ("invocation_id", "text", false),
    ("author", "text", true),
    ("event_ts", "bigint", true),
    ("created_at", "timestamp with time zone", true),
    ("payload", "jsonb", true),
];

/// Columns the later migrations' functions use on `adk_sessions`.
pub(super) const SESSION_COLUMNS: [&str; 10] = [
    "app_name",
    "user_id",
    "session_id",
    "state",
    "last_seq",
    "created_at",
    "updated_at",
    "expires_at",
    "closed_at",
    "successor_id",
];

/// `CREATE TABLE adk_events (…) PARTITION BY RANGE (session_day);` exactly
/// as migration 000001 has it.
pub(super) fn parent_ddl() -> Result<&'static str, RetentionError> {
    let missing = || RetentionError::Conflict("migration 000001 has no CREATE TABLE adk_events statement".into());
    let start = CREATE_STORE_SQL.find("CREATE TABLE adk_events (").ok_or_else(missing)?;
    let rest = &CREATE_STORE_SQL[start..];
    let end = rest.find(';').ok_or_else(missing)?;
    Ok(&rest[..end])
}

/// Versions of the migrations compiled into this binary, oldest first.
pub(super) fn embedded_versions() -> Result<Vec<String>, RetentionError> {
    let migrations = MigrationSource::<Pg>::migrations(&MIGRATIONS)
        .map_err(|e| RetentionError::NotMigrated(format!("reading the embedded migrations: {e}")))?;
    let mut versions: Vec<String> = migrations.iter().map(|m| m.name().version().to_string()).collect();
    versions.sort();
    Ok(versions)
}

/// A layout the conversion does not know: refused before anything changes.
pub(super) fn unrecognised(detail: String) -> RetentionError {
    RetentionError::Conflict(format!("unrecognised layout, nothing was changed: {detail}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parent_ddl_is_migration_000001s() {
        let ddl = parent_ddl().expect("found");
        assert!(ddl.starts_with("CREATE TABLE adk_events ("));
        assert!(ddl.ends_with("PARTITION BY RANGE (session_day)"), "{ddl}");
        for name in [PARENT_PKEY, PARENT_EVENT_ID_KEY, "adk_events_session_fkey", SEQ_POSITIVE, PAYLOAD_IS_OBJECT] {
            assert!(ddl.contains(&format!("CONSTRAINT {name} ")), "{name}");
        }
        assert!(ddl.contains("CHECK (seq > 0)") && ddl.contains("CHECK (jsonb_typeof(payload) = 'object')"));
        assert!(CREATE_STORE_SQL.contains(&format!("DEFAULT {SESSION_DAY_DEFAULT}")));
    }

    #[test]
    fn the_baseline_is_the_first_migration() {
        let versions = embedded_versions().expect("embedded");
        // Spelled out: diesel's QueryDsl::first would shadow the slice method.
        assert_eq!(<[String]>::first(&versions).map(String::as_str), Some(BASELINE_VERSION));
    }
}
