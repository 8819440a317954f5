//! The store's functions, stated whole in `crates/schema/sql/`, installed
//! after every migrate.
//!
//! Migrations are ordered history: tables, columns, indexes, data moves, and
//! a `DROP FUNCTION` when a signature goes away. What a function does today
//! is read in one place, its area's file, with its `SET` clauses and
//! grants. A Citus variant beside it (`read.citus.sql`), installed after it
//! there, holds only what differs on Citus: a function's settings (`ALTER
//! FUNCTION … SET`), and the switch `adk_on_citus()` (`sessions.citus.sql`)
//! that a body branches on where Citus needs other statements. No body is
//! stated twice.
//!
//! The install is `CREATE OR REPLACE` rather than dropping and recreating:
//! service roles hold per-function grants, row-level security policies and
//! SQL-standard bodies depend on the functions by identity, and callers stay
//! live during a deploy. A function keeps its grants and its oid; only its
//! definition changes.
//!
//! Services may migrate on start, so the install stores the SHA-256 of the
//! text it ran and an unchanged install is a no-op (one read).

use diesel::connection::{Connection as _, SimpleConnection as _};
use diesel::sql_types::Text;
use diesel_async::AsyncPgConnection;
use diesel_async::async_connection_wrapper::AsyncConnectionWrapper;

use crate::citus::{Answer, TextRow};
use crate::migrations::MigrationError;
use crate::names::SCHEMA_SQL;

type Wrapper = AsyncConnectionWrapper<AsyncPgConnection>;

/// One area's functions: its file, and what Citus runs after it.
#[derive(Debug, Clone, Copy)]
pub struct SqlFile {
    /// The file's name under `crates/schema/sql/`.
    pub name: &'static str,
    /// The file's text.
    pub sql: &'static str,
    /// The Citus variant's text (`<name>.citus.sql`), installed right after
    /// `sql` on a database with the citus extension.
    pub citus: Option<&'static str>,
}

macro_rules! sql_file {
    ($name:literal) => {
        SqlFile { name: concat!($name, ".sql"), sql: include_str!(concat!("../sql/", $name, ".sql")), citus: None }
    };
    ($name:literal, citus) => {
        SqlFile {
            name: concat!($name, ".sql"),
            sql: include_str!(concat!("../sql/", $name, ".sql")),
            citus: Some(include_str!(concat!("../sql/", $name, ".citus.sql"))),
        }
    };
}

/// Every file, in install order: a file may use what an earlier one
/// states (an SQL-standard body binds the functions it calls when it is
/// created).
pub const SQL_FILES: &[SqlFile] = &[
    sql_file!("partitions"),
    sql_file!("policy"),
    sql_file!("tenancy", citus),
    sql_file!("usage"),
    sql_file!("sessions", citus),
    sql_file!("append"),
    sql_file!("state"),
    sql_file!("blobs"),
    sql_file!("read", citus),
    sql_file!("feed", citus),
    sql_file!("redact"),
    sql_file!("erase"),
    sql_file!("archive"),
];

/// The files' spelling of the store's schema in `SET search_path`, as psql
/// spells an identifier variable (`psql -v store_schema=public -f …` runs a
/// file by hand); the install puts the quoted schema in its place.
pub const SCHEMA_PLACEHOLDER: &str = ":\"store_schema\"";

/// Bounds the wait for each function's lock: a replace waits for callers
/// that hold it, and a deploy must not queue every caller behind it.
pub(crate) const LOCK_TIMEOUT: &str = "5s";

/// The text an install runs on a database whose store lives in
/// `quoted_schema` (already an identifier, quoted as needed), with the
/// Citus variants when `on_citus`.
pub fn install_text(quoted_schema: &str, on_citus: bool) -> String {
    let mut text = String::new();
    for file in SQL_FILES {
        for (name, sql) in
            std::iter::once((file.name, file.sql)).chain(file.citus.filter(|_| on_citus).map(|sql| (file.name, sql)))
        {
            text.push_str("-- crates/schema/sql/");
            text.push_str(name);
            text.push('\n');
            text.push_str(&sql.replace(SCHEMA_PLACEHOLDER, quoted_schema));
            text.push('\n');
        }
    }
    text
}

/// The names of the functions the files state (`CREATE OR REPLACE FUNCTION
/// name(`), base files and Citus variants, each once.
pub fn stated_functions() -> Vec<&'static str> {
    let mut names: Vec<&'static str> = SQL_FILES
        .iter()
        .flat_map(|file| std::iter::once(file.sql).chain(file.citus))
        .flat_map(|sql| sql.split("CREATE OR REPLACE FUNCTION ").skip(1))
        .filter_map(|rest| rest.split('(').next())
        .map(str::trim)
        .collect();
    names.sort_unstable();
    names.dedup();
    names
}

/// The functions the files state that no migration created, by signature.
/// Each migration's `down.sql` drops what its `up.sql` made; these were
/// made by the files alone, so [`revert_all_migrations`] drops them after
/// the last `down.sql` has run.
///
/// [`revert_all_migrations`]: crate::migrations::revert_all_migrations
pub const FILES_ONLY: &[&str] = &[
    "adk_on_citus()",
    "adk_usage_bytes(jsonb)",
    "adk_redact_event(text,text,text,text,text,text,boolean)",
    "adk_grant_like(regprocedure,regprocedure)",
    "adk_append_event(text,text,text,text,text,text,text,bigint,jsonb,jsonb,jsonb,jsonb,bigint,interval,bytea[],interval,bigint,boolean)",
    "adk_get_blobs(text,text,text,text,bytea[])",
    "adk_blob_hashes(bytea[])",
    "adk_hold_blobs(text,bytea[],bytea[])",
    "adk_hold_copied_blobs(text,text,text,date)",
    "adk_release_blob_refs(text,bytea[])",
    "adk_release_blobs()",
    "adk_archive_list(text,text)",
    "adk_archive_read_only()",
    "adk_get_user_state(text,text,text)",
    "adk_get_app_state(text,text)",
    "adk_merge_user_state(text,text,text,jsonb)",
    "adk_merge_app_state(text,text,jsonb)",
    "adk_list_events(text,text,text,text,bigint,bigint,bigint)",
    "adk_list_app_sessions(text,text,timestamp with time zone,text,text,bigint,jsonb,timestamp with time zone,timestamp with time zone)",
    "adk_read_session(text,text,text,text,bigint,bigint)",
    "adk_read_sessions(text,text,text,timestamp with time zone,text,bigint,jsonb,timestamp with time zone,timestamp with time zone)",
];

/// Drops [`FILES_ONLY`], once every migration is reverted.
pub(crate) fn drop_files_only(conn: &mut Wrapper) -> Result<(), MigrationError> {
    for function in FILES_ONLY {
        conn.batch_execute(&format!("DROP FUNCTION IF EXISTS {function}"))
            .map_err(|e| MigrationError::Replaceable(format!("dropping {function}: {e}")))?;
    }
    Ok(())
}

/// What installing the functions after a migrate did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Installed {
    /// The database held other text (or none): the files were run.
    Replaced,
    /// The database already held this text: nothing ran.
    Unchanged,
}

/// Installs the files in one transaction, under the migration lock the
/// caller holds, unless the database already holds the same text. A failure
/// rolls the whole install back: the functions stay as they were.
pub(crate) fn install(conn: &mut Wrapper, on_citus: bool) -> Result<Installed, MigrationError> {
    use diesel::RunQueryDsl as _;
    let failed = |what: &str| {
        let what = what.to_owned();
        move |e: diesel::result::Error| MigrationError::Replaceable(format!("{what}: {e}"))
    };
    conn.transaction(|conn| {
        let schema: TextRow = diesel::sql_query("SELECT pg_catalog.quote_ident(pg_catalog.current_schema()) AS text")
            .get_result(conn)
            .map_err(failed("reading the store's schema"))?;
        let text = install_text(&schema.text, on_citus);
        let unchanged: Answer = diesel::sql_query(format!(
            "SELECT EXISTS (SELECT 1 FROM {SCHEMA_SQL}
                             WHERE sha256 = pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to($1, 'UTF8')), 'hex'))
                    AS answer"
        ))
        .bind::<Text, _>(&text)
        .get_result(conn)
        .map_err(failed("reading the installed SQL's hash"))?;
        if unchanged.answer {
            return Ok(Installed::Unchanged);
        }
        conn.batch_execute(&format!("SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'"))
            .map_err(failed("bounding the install's lock waits"))?;
        conn.batch_execute(&text).map_err(failed("installing crates/schema/sql"))?;
        diesel::sql_query(format!(
            "INSERT INTO {SCHEMA_SQL} AS s (singleton, sha256)
             VALUES (true, pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to($1, 'UTF8')), 'hex'))
             ON CONFLICT (singleton) DO UPDATE
                SET sha256 = EXCLUDED.sha256, installed_at = pg_catalog.now(), installed_by = CURRENT_USER"
        ))
        .bind::<Text, _>(&text)
        .execute(conn)
        .map_err(failed("recording the installed SQL's hash"))?;
        Ok(Installed::Replaced)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_states_functions_with_a_pinned_path_and_no_migration_era_pin() {
        for file in SQL_FILES {
            for sql in std::iter::once(file.sql).chain(file.citus) {
                assert!(!sql.contains("ALTER FUNCTION %s SET search_path"), "{}: re-pins by DO block", file.name);
                assert!(!sql.contains("SET LOCAL"), "{}: the install sets the transaction's bounds", file.name);
            }
            assert!(file.sql.contains("CREATE OR REPLACE FUNCTION"), "{} states no function", file.name);
        }
    }

    #[test]
    fn the_install_text_spells_the_schema_and_takes_citus_variants_only_there() {
        let single = install_text("\"my schema\"", false);
        assert!(!single.contains(SCHEMA_PLACEHOLDER));
        assert!(single.contains("SET search_path = pg_catalog, \"my schema\", pg_temp"));
        assert!(!single.contains("citus.allow_nested_distributed_execution"));
        let citus = install_text("public", true);
        assert!(citus.contains("citus.allow_nested_distributed_execution"));
        assert!(citus.len() > single.len());
    }

    #[test]
    fn stated_functions_are_found_by_name() {
        let names = stated_functions();
        for name in ["adk_append_event", "adk_create_session", "adk_get_session", "adk_acting_app"] {
            assert!(names.contains(&name), "{name} missing from {names:?}");
        }
        assert!(names.iter().all(|n| n.starts_with("adk_")), "{names:?}");
        for function in FILES_ONLY {
            assert!(names.iter().any(|name| function.starts_with(&format!("{name}("))), "{function} is not stated");
        }
    }
}
