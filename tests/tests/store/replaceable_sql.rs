//! The store's functions have one home, `crates/schema/sql/`: an upgrade
//! from the last released migration set ends with the same catalog as a
//! fresh install, the files state every function the database has, an
//! unchanged install runs nothing, and no migration after the cut-over
//! writes a function body.

use std::collections::BTreeMap;

use adk_postgres_schema::migrations::{MIGRATIONS, run_pending_migrations};
use adk_postgres_schema::replaceable::{FILES_ONLY, SQL_FILES, stated_functions};
use adk_postgres_storage::{AppBinding, STORE_FUNCTIONS};
use adk_postgres_testing::empty_database;
use adk_postgres_tests::pg::{client, migrate_through, unique_role};
use diesel::migration::MigrationSource;
use diesel::pg::Pg;
use tokio_postgres::Client;

/// The last migration whose file may state a function body: the one that
/// moved the bodies into `crates/schema/sql/`. Every migration after it
/// holds ordered history only.
const CUT_OVER: &str = "20261203000024";

/// The last migration of the released set (0.1.0): its database had every
/// function from its migrations' bodies, and no install step.
const LAST_RELEASED: &str = "20261202000023";

/// Functions whose definition in the files differs, on purpose, from what
/// the released migrations made. Empty at the cut-over: the files restate
/// the released functions exactly. A change to a function adds its name
/// here, so the comparison below keeps guarding every other one.
///
/// - `adk_on_citus`: new, whether the store runs on Citus;
/// - `adk_append_event`, `adk_create_session`: one body each for one server
///   and Citus, branching on it; the append also takes the event's media;
/// - `adk_fork_session`: the copies hold the original's media;
/// - `adk_get_session`: the same rows, unnested from `adk_read_session`'s
///   one row, which the store calls instead (issue 37);
/// - `adk_list_sessions`: the same rows, unnested from `adk_read_sessions`'
///   one row, which the store calls instead (issue 37).
const CHANGED_SINCE_RELEASE: &[&str] = &[
    "adk_on_citus",
    "adk_append_event",
    "adk_create_session",
    "adk_fork_session",
    "adk_usage_kind",
    "adk_usage_bytes",
    "adk_erase_user_batch",
    "adk_redact_event",
    "adk_get_session",
    "adk_list_sessions",
];

/// Store functions the released migrations did not have: the released
/// service role cannot be granted them, and the install grants them to it.
const NEW_SINCE_RELEASE: &[&str] = &[
    "adk_redact_event",
    "adk_get_blobs",
    "adk_archive_list",
    "adk_get_user_state",
    "adk_get_app_state",
    "adk_merge_user_state",
    "adk_merge_app_state",
    "adk_list_events",
    "adk_list_app_sessions",
    "adk_read_session",
    "adk_read_sessions",
];

/// Everything of the catalog the install may touch, keyed by object, with
/// role names in place of oids so two databases compare: each function's
/// full definition (body, SET clauses, volatility, security) and its grants,
/// each trigger, each row-level security policy, each view.
async fn catalog(sql: &Client) -> BTreeMap<String, String> {
    let query = "
        SELECT 'function ' || p.oid::regprocedure::text,
               pg_catalog.pg_get_functiondef(p.oid) || E'\ngrants: ' ||
               coalesce((SELECT pg_catalog.string_agg(g.grant_text, ', ' ORDER BY g.grant_text)
                           FROM (SELECT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END
                                        || ' ' || a.privilege_type AS grant_text
                                   FROM pg_catalog.aclexplode(p.proacl) a) g), 'default')
          FROM pg_catalog.pg_proc p WHERE p.pronamespace = pg_catalog.current_schema()::regnamespace
        UNION ALL
        SELECT 'trigger ' || t.tgname || ' on ' || t.tgrelid::regclass::text, pg_catalog.pg_get_triggerdef(t.oid)
          FROM pg_catalog.pg_trigger t JOIN pg_catalog.pg_class c ON c.oid = t.tgrelid
         WHERE c.relnamespace = pg_catalog.current_schema()::regnamespace AND NOT t.tgisinternal
        UNION ALL
        SELECT 'policy ' || p.policyname || ' on ' || p.tablename,
               p.permissive || ' ' || p.cmd || ' ' || p.roles::text || ' USING ' || coalesce(p.qual, '')
               || ' CHECK ' || coalesce(p.with_check, '')
          FROM pg_catalog.pg_policies p WHERE p.schemaname = pg_catalog.current_schema()
        UNION ALL
        SELECT 'view ' || v.viewname, v.definition
          FROM pg_catalog.pg_views v WHERE v.schemaname = pg_catalog.current_schema()";
    sql.query(query, &[])
        .await
        .expect("read the catalog")
        .iter()
        .map(|row| (row.get::<_, String>(0), row.get::<_, String>(1)))
        .collect()
}

/// The differences between two catalogs, at most a few, for a message.
fn differences(left: &BTreeMap<String, String>, right: &BTreeMap<String, String>) -> Vec<String> {
    let mut keys: Vec<&String> = left.keys().chain(right.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter(|key| left.get(*key) != right.get(*key))
        .map(|key| format!("{key}:\n  left:  {:?}\n  right: {:?}", left.get(key), right.get(key)))
        .collect()
}

/// Runs the released migrations (through [`LAST_RELEASED`]) the way the
/// released code did: the migrations, then today's partitions, no install.
async fn migrate_as_released(url: &str) {
    migrate_through(url, LAST_RELEASED).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_upgrade_from_the_released_migrations_ends_with_a_fresh_installs_catalog() {
    let released = empty_database().await;
    migrate_as_released(released.url()).await;
    // A service role set up on the released store keeps its grants through
    // the upgrade: the install replaces functions, it never drops them.
    // Granted by hand, as the released `adk-pg service-role` did: today's
    // setup also names tables the released store lacks.
    let role = unique_role("upgraded_service");
    let released_sql = client(released.url()).await;
    let functions = STORE_FUNCTIONS.iter().filter(|f| !NEW_SINCE_RELEASE.contains(f)).copied().collect::<Vec<_>>();
    let functions = functions.join(", ");
    released_sql
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN; GRANT USAGE ON SCHEMA public TO {role};
             GRANT EXECUTE ON FUNCTION {functions} TO {role}"
        ))
        .await
        .expect("the released service role");
    let before = catalog(&released_sql).await;
    run_pending_migrations(released.url()).await.expect("the upgrade");
    let upgraded = catalog(&released_sql).await;

    let fresh = empty_database().await;
    run_pending_migrations(fresh.url()).await.expect("a fresh install");
    let setup = adk_postgres_storage::setup_service_role(
        fresh.url(),
        &role,
        &adk_postgres_storage::ServiceRoleOptions { create: false, password: None, apps: AppBinding::AllApps },
    )
    .await
    .expect("the same role on the fresh store");
    assert!(!setup.granted.is_empty());
    let installed = catalog(&client(fresh.url()).await).await;

    let apart = differences(&upgraded, &installed);
    assert!(apart.is_empty(), "the upgraded catalog differs from a fresh install's:\n{}", apart.join("\n"));
    assert!(
        installed.values().any(|grants| grants.contains(&format!("{role} EXECUTE"))),
        "the comparison saw the service role's grants"
    );

    // The files restate what the released migrations made: the move of the
    // bodies changed no function but those named as changed.
    // What a later feature added is not a change to a released object.
    let changed: Vec<String> = differences(&before, &upgraded)
        .into_iter()
        .filter(|d| !CHANGED_SINCE_RELEASE.iter().any(|name| d.starts_with(&format!("function {name}("))))
        .filter(|d| before.keys().any(|key| d.starts_with(&format!("{key}:"))))
        .collect();
    assert!(changed.is_empty(), "the files changed released functions:\n{}", changed.join("\n"));

    // A function the files made with no migration has no down.sql to drop
    // it: FILES_ONLY names it, and reverting every migration drops it.
    let mut made_by_the_files: Vec<&str> = upgraded
        .keys()
        .filter(|key| !before.contains_key(*key))
        .filter_map(|key| key.strip_prefix("function "))
        .collect();
    made_by_the_files.sort_unstable();
    let mut listed = FILES_ONLY.to_vec();
    listed.sort_unstable();
    assert_eq!(made_by_the_files, listed, "functions no migration made must be listed in replaceable::FILES_ONLY");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_files_state_every_function_the_store_has() {
    let db = empty_database().await;
    run_pending_migrations(db.url()).await.expect("migrate");
    let in_database: Vec<String> = client(db.url())
        .await
        .query(
            "SELECT p.proname::text FROM pg_catalog.pg_proc p
              WHERE p.pronamespace = pg_catalog.current_schema()::regnamespace ORDER BY 1",
            &[],
        )
        .await
        .expect("list functions")
        .iter()
        .map(|row| row.get(0))
        .collect();
    let stated: Vec<String> = stated_functions().into_iter().map(str::to_owned).collect();
    assert_eq!(in_database, stated, "a function lives only in a migration, or a file states one the store lacks");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unchanged_install_runs_nothing_and_a_changed_one_replaces() {
    let db = empty_database().await;
    run_pending_migrations(db.url()).await.expect("migrate");
    let sql = client(db.url()).await;
    let installed_at = "SELECT installed_at::text FROM adk_schema_sql";
    let first: String = sql.query_one(installed_at, &[]).await.expect("installed").get(0);
    run_pending_migrations(db.url()).await.expect("migrate again");
    let again: String = sql.query_one(installed_at, &[]).await.expect("installed").get(0);
    assert_eq!(first, again, "an unchanged install ran");

    // A function edited by hand (or left by an older build) is put back by
    // the next migrate, because the recorded text no longer matches.
    sql.batch_execute(
        "UPDATE adk_schema_sql SET sha256 = repeat('0', 64);
                       ALTER FUNCTION adk_read_session(text, text, text, text, bigint, bigint) SET enable_seqscan = on",
    )
    .await
    .expect("drift");
    run_pending_migrations(db.url()).await.expect("migrate after drift");
    let config: Vec<String> = sql
        .query_one(
            "SELECT proconfig::text[] FROM pg_proc
              WHERE oid = 'adk_read_session(text, text, text, text, bigint, bigint)'::regprocedure",
            &[],
        )
        .await
        .expect("read settings")
        .get(0);
    assert!(config.contains(&"enable_seqscan=off".to_owned()), "{config:?}");
    let replaced: String = sql.query_one(installed_at, &[]).await.expect("installed").get(0);
    assert_ne!(first, replaced, "the changed install ran");
}

#[tokio::test(flavor = "multi_thread")]
async fn migrations_run_concurrently_take_turns() {
    let db = empty_database().await;
    let url = db.url().to_owned();
    let runs: Vec<_> = (0..4)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move { run_pending_migrations(&url).await })
        })
        .collect();
    let mut applied = 0;
    for run in runs {
        applied += run.await.expect("join").expect("a concurrent migrate").len();
    }
    assert_eq!(
        applied,
        MigrationSource::<Pg>::migrations(&MIGRATIONS).expect("migrations").len(),
        "each migration applied once"
    );
    let recorded: i64 =
        client(db.url()).await.query_one("SELECT count(*) FROM adk_schema_sql", &[]).await.expect("count").get(0);
    assert_eq!(recorded, 1);
}

/// Migration 30 builds an index on `adk_sessions`; the database is left
/// just before it, with a transaction holding that table, as a long
/// report or a stuck session would on a live store.
#[tokio::test(flavor = "multi_thread")]
async fn a_migration_behind_a_held_lock_fails_in_seconds_and_a_retry_applies_it() {
    let db = empty_database().await;
    migrate_through(db.url(), "20261205000029").await;
    let holder = client(db.url()).await;
    holder.batch_execute("BEGIN; LOCK TABLE adk_sessions IN ACCESS EXCLUSIVE MODE").await.expect("hold the table");

    // Far longer than the migrations' lock_timeout: without it the
    // migrate would wait here for as long as the holder stays open.
    let blocked = tokio::time::timeout(std::time::Duration::from_secs(60), run_pending_migrations(db.url()))
        .await
        .expect("the migrate waited on the lock instead of giving up");
    let error = blocked.expect_err("the migrate ran behind a held lock").to_string();
    assert!(error.contains("lock timeout"), "{error}");

    holder.batch_execute("ROLLBACK").await.expect("release the table");
    let applied = run_pending_migrations(db.url()).await.expect("the retried migrate");
    assert_eq!(applied.first().map(String::as_str), Some("20261205000030"), "{applied:?}");
}

/// The words that would put a function's definition (or part of one) into
/// a migration: a body, a body edited as text, or a setting of one.
const FUNCTION_DEFINITIONS: [&str; 5] = [
    "create function",
    "create or replace function",
    "create procedure",
    "create or replace procedure",
    "pg_get_functiondef",
];

/// A down.sql may put back a signature an earlier migration's down.sql
/// expects, as a placeholder that only raises: no body the store runs. The
/// text with those taken out, so that anything else is still caught.
fn without_placeholders(text: &str) -> String {
    let mut rest = text;
    let mut kept = String::new();
    while let Some(start) = rest.find("create function") {
        let Some(end) = rest[start..].find("$$;").map(|end| start + end + 3) else { break };
        let statement = &rest[start..end];
        kept.push_str(&rest[..start]);
        if !statement.contains("as $$ begin raise exception") || statement.matches(';').count() > 2 {
            kept.push_str(statement);
        }
        rest = &rest[end..];
    }
    kept.push_str(rest);
    kept
}

#[test]
fn no_migration_after_the_cut_over_writes_a_function_body() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../migrations");
    for entry in std::fs::read_dir(&root).expect("migrations/") {
        let dir = entry.expect("entry").path();
        let name = dir.file_name().expect("name").to_string_lossy().into_owned();
        let version: String = name.split('_').next().unwrap_or_default().chars().filter(char::is_ascii_digit).collect();
        if version.as_str() <= CUT_OVER {
            continue;
        }
        for file in ["up.sql", "down.sql"] {
            let text = std::fs::read_to_string(dir.join(file)).unwrap_or_default().to_lowercase();
            let mut text = text.split_whitespace().collect::<Vec<_>>().join(" ");
            if file == "down.sql" {
                text = without_placeholders(&text);
            }
            for words in FUNCTION_DEFINITIONS {
                assert!(
                    !text.contains(words),
                    "{name}/{file} has `{words}`: function bodies live in crates/schema/sql/"
                );
            }
            let settings = text.contains("alter function") && text.contains(" set ");
            assert!(!settings, "{name}/{file} sets a function's settings: state them in crates/schema/sql/");
        }
    }
    // The guard must see the migrations it guards: the cut-over is present.
    let cut_over_present = std::fs::read_dir(&root)
        .expect("migrations/")
        .any(|e| e.expect("entry").file_name().to_string_lossy().replace('-', "").starts_with(CUT_OVER));
    assert!(cut_over_present, "the cut-over migration {CUT_OVER} is missing from {}", root.display());
}

#[test]
fn every_file_is_installed_and_every_citus_variant_sits_beside_its_file() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../crates/schema/sql");
    let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
        .expect("crates/schema/sql")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    on_disk.sort();
    let mut listed: Vec<String> = SQL_FILES
        .iter()
        .flat_map(|f| std::iter::once(f.name.to_owned()).chain(f.citus.map(|_| f.name.replace(".sql", ".citus.sql"))))
        .collect();
    listed.sort();
    assert_eq!(on_disk, listed, "a file in crates/schema/sql is not installed (add it to SQL_FILES)");
}
