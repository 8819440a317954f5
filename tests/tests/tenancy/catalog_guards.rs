//! Catalog guards: checks on the store's schema that fail when a change
//! forgets one of the promises tenancy rests on, whichever way the schema
//! got where it is.
//!
//! * Every `adk_` table or partition with an `app_name` column has row-level
//!   security enabled and forced and the `adk_tenant_isolation` policy:
//!   after a fresh migration, after maintenance premakes days, after
//!   maintenance re-attaches a detached partition (stripped of its
//!   protection first, as a table detached before the bound_tenants
//!   migration would be), and after a legacy database is converted.
//! * Every `adk_` function, and every SECURITY DEFINER function, in the
//!   schema pins its `search_path` to `pg_catalog, …, pg_temp`, unless its
//!   body is standard SQL, whose names are bound when it is created.
//! * No `adk_` function is executable by PUBLIC but the one row-level
//!   security calls as the querying role.
//!
//! Each guard is one query listing offenders; the probe tests create an
//! offender of each kind and see the query list it, so a guard that can
//! never fail would fail here.

use adk_postgres_retention::{LockPolicy, MaintenanceConfig, convert_events, run_maintenance};
use adk_postgres_schema::migrations::run_pending_migrations;
use adk_postgres_testing::{empty_database, test_database};
use adk_postgres_tests::pg::client;
use chrono::{Days, NaiveDate, Utc};
use tokio_postgres::Client;

const LEGACY_LAYOUT: &str = include_str!("../../fixtures/legacy_layout.sql");

/// The store's schema: the one holding `adk_events`.
const SCHEMA: &str = "(SELECT c.relnamespace FROM pg_class c WHERE c.oid = 'adk_events'::regclass)";

/// `adk_` relations with an `app_name` column that hold no tenant rows, so
/// the tenant policy does not belong on them:
///
/// * `adk_role_apps` says which role may act for which app. The tenant
///   policy's own function (`adk_acting_app`) reads it.
/// * `adk_role_app_changes` is that table's audit log.
///
/// Both carry forced row-level security with an owner-only policy instead
/// (checked below), so even a role granted `SELECT ON ALL TABLES` learns
/// no app's name or binding from them.
const NOT_TENANT_TABLES: [&str; 2] = ["adk_role_apps", "adk_role_app_changes"];

/// The relations the tenant guard covers: `adk_` tables and partitioned
/// tables of the schema with an `app_name` column, minus [`NOT_TENANT_TABLES`].
fn tenant_relations_where() -> String {
    format!(
        "c.relnamespace = {SCHEMA} AND c.relkind IN ('r', 'p') AND c.relname LIKE 'adk\\_%'
         AND c.relname <> ALL (ARRAY['{}'])
         AND EXISTS (SELECT 1 FROM pg_attribute a
                     WHERE a.attrelid = c.oid AND a.attname = 'app_name' AND a.attnum > 0 AND NOT a.attisdropped)",
        NOT_TENANT_TABLES.join("', '")
    )
}

async fn names(sql: &Client, query: &str) -> Vec<String> {
    sql.query(query, &[]).await.unwrap_or_else(|e| panic!("{query}: {e}")).iter().map(|r| r.get(0)).collect()
}

/// Every relation the tenant guard looks at.
async fn tenant_relations(sql: &Client) -> Vec<String> {
    names(sql, &format!("SELECT c.relname::text FROM pg_class c WHERE {} ORDER BY 1", tenant_relations_where())).await
}

/// Tenant relations missing forced row-level security or the policy, each
/// with what it lacks.
async fn unprotected_relations(sql: &Client) -> Vec<String> {
    names(
        sql,
        &format!(
            "SELECT c.relname::text || ' (' || concat_ws(', ',
                        CASE WHEN NOT c.relrowsecurity THEN 'row-level security off' END,
                        CASE WHEN NOT c.relforcerowsecurity THEN 'not forced' END,
                        CASE WHEN NOT EXISTS (SELECT 1 FROM pg_policy p
                                              WHERE p.polrelid = c.oid AND p.polname = 'adk_tenant_isolation')
                             THEN 'no adk_tenant_isolation policy' END) || ')'
             FROM pg_class c
             WHERE {}
               AND NOT (c.relrowsecurity AND c.relforcerowsecurity
                        AND EXISTS (SELECT 1 FROM pg_policy p
                                    WHERE p.polrelid = c.oid AND p.polname = 'adk_tenant_isolation'))
             ORDER BY 1",
            tenant_relations_where()
        ),
    )
    .await
}

/// `adk_` functions, and SECURITY DEFINER functions of any name, in the
/// schema whose `search_path` is not pinned to start at `pg_catalog` and
/// end at `pg_temp` (unlisted, pg_temp would be searched first for tables),
/// with the setting they have. A function with an SQL-standard body
/// (`BEGIN ATOMIC` or `RETURN`) needs no pin: PostgreSQL bound each name in
/// it when it was created, so no path at run time can redirect one.
async fn unpinned_functions(sql: &Client) -> Vec<String> {
    names(
        sql,
        &format!(
            "SELECT p.oid::regprocedure::text || CASE WHEN p.prosecdef THEN ' SECURITY DEFINER' ELSE '' END
                    || ': ' || coalesce((SELECT s FROM unnest(p.proconfig) s WHERE s LIKE 'search\\_path=%'),
                                        'no search_path')
             FROM pg_proc p
             WHERE p.pronamespace = {SCHEMA} AND (p.proname LIKE 'adk\\_%' OR p.prosecdef)
               AND p.prosqlbody IS NULL
               AND NOT EXISTS (SELECT 1 FROM unnest(p.proconfig) s
                               WHERE s ~ '^search_path=pg_catalog(,|$)' AND s ~ '(^search_path=|, *)pg_temp$')
             ORDER BY 1"
        ),
    )
    .await
}

/// Functions row-level security calls as the querying role: PUBLIC must be
/// able to run them.
const PUBLIC_FUNCTIONS: [&str; 3] = ["adk_acting_app", "adk_is_store_owner", "adk_visible_app"];

/// `adk_` functions PUBLIC may execute, but [`PUBLIC_FUNCTIONS`]. A function
/// without an ACL has the default one, which grants PUBLIC.
async fn public_functions(sql: &Client) -> Vec<String> {
    names(
        sql,
        &format!(
            "SELECT p.oid::regprocedure::text FROM pg_proc p
             WHERE p.pronamespace = {SCHEMA} AND p.proname LIKE 'adk\\_%'
               AND p.proname <> ALL (ARRAY['{}'])
               AND EXISTS (SELECT 1 FROM aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
                           WHERE a.grantee = 0 AND a.privilege_type = 'EXECUTE')
             ORDER BY 1",
            PUBLIC_FUNCTIONS.join("', '")
        ),
    )
    .await
}

/// Every guard holds on the database behind `sql`, which got there by `how`,
/// and the tenant guard covered the tables and partitions it must.
async fn assert_guards_hold(sql: &Client, how: &str) -> Vec<String> {
    let covered = tenant_relations(sql).await;
    for table in ["adk_sessions", "adk_events", "adk_user_states", "adk_app_states"] {
        assert!(covered.iter().any(|c| c == table), "{how}: the guard does not look at {table}: {covered:?}");
    }
    assert!(covered.iter().any(|c| c.starts_with("adk_events_p")), "{how}: no partition looked at: {covered:?}");
    let unprotected = unprotected_relations(sql).await;
    assert!(
        unprotected.is_empty(),
        "{how}: tenant tables without forced row-level security and policy: {unprotected:?}"
    );
    let unpinned = unpinned_functions(sql).await;
    assert!(unpinned.is_empty(), "{how}: functions without a pinned search_path: {unpinned:?}");
    let public = public_functions(sql).await;
    assert!(public.is_empty(), "{how}: functions PUBLIC may execute: {public:?}");
    covered
}

fn utc_today() -> NaiveDate {
    Utc::now().date_naive()
}

fn partition(day: NaiveDate) -> String {
    format!("adk_events_p{}", day.format("%Y%m%d"))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fresh_migration_protects_every_tenant_table_and_pins_every_function() {
    let db = empty_database().await;
    run_pending_migrations(db.url()).await.expect("migrate");
    let sql = client(db.url()).await;
    let covered = assert_guards_hold(&sql, "fresh migration").await;
    // The partitions the migration's premake made are among those checked.
    let premade = covered.iter().filter(|c| c.starts_with("adk_events_p")).count();
    assert!(premade >= 8, "today and the policy's 7 days ahead: {covered:?}");
    // The two excluded tables exist (a rename would make the exclusion
    // stale) and only the owner reads them.
    for table in NOT_TENANT_TABLES {
        let exists: bool =
            sql.query_one("SELECT to_regclass($1) IS NOT NULL", &[&table]).await.expect("look the table up").get(0);
        assert!(exists, "{table} is gone: drop it from NOT_TENANT_TABLES");
        let owner_only: bool = sql
            .query_one(
                "SELECT c.relrowsecurity AND c.relforcerowsecurity
                        AND EXISTS (SELECT 1 FROM pg_policy p WHERE p.polrelid = c.oid AND p.polname = 'adk_owner_only')
                 FROM pg_class c WHERE c.oid = to_regclass($1)",
                &[&table],
            )
            .await
            .expect("read its row-level security")
            .get(0);
        assert!(owner_only, "{table} must be readable by the owner only");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn partitions_maintenance_premakes_are_protected() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    sql.batch_execute("UPDATE adk_store_policy SET premake_days = 20").await.expect("premake further ahead");
    let report = run_maintenance(db.url(), utc_today(), &MaintenanceConfig::default()).await.expect("maintenance");
    assert!(report.created.len() >= 10, "maintenance premade days: {report:?}");
    let covered = assert_guards_hold(&sql, "after maintenance premade days").await;
    for day in &report.created {
        assert!(covered.contains(&partition(*day)), "premade {day} not looked at: {covered:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_partition_maintenance_reattaches_is_protected() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    let day = utc_today().checked_add_days(Days::new(1)).expect("tomorrow");
    let orphan = partition(day);
    // Detached by an interrupted run, and unprotected as a table detached
    // before the bound_tenants migration (or by hand) would be.
    sql.batch_execute(&format!(
        "ALTER TABLE adk_events DETACH PARTITION {orphan};
         DROP POLICY adk_tenant_isolation ON {orphan};
         ALTER TABLE {orphan} NO FORCE ROW LEVEL SECURITY, DISABLE ROW LEVEL SECURITY"
    ))
    .await
    .expect("detach and strip a partition");
    let unprotected = unprotected_relations(&sql).await;
    assert_eq!(
        unprotected,
        vec![format!("{orphan} (row-level security off, not forced, no adk_tenant_isolation policy)")],
        "the guard sees the stripped table"
    );

    let report = run_maintenance(db.url(), utc_today(), &MaintenanceConfig::default()).await.expect("maintenance");
    assert_eq!(report.reattached, vec![orphan.clone()], "{report:?}");
    let attached: bool = sql
        .query_one("SELECT EXISTS (SELECT 1 FROM pg_inherits WHERE inhrelid = $1::text::regclass)", &[&orphan])
        .await
        .expect("attached?")
        .get(0);
    assert!(attached, "{orphan} is a partition again");
    let covered = assert_guards_hold(&sql, "after maintenance re-attached a partition").await;
    assert!(covered.contains(&orphan));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_converted_legacy_database_is_protected() {
    let db = empty_database().await;
    let sql = client(db.url()).await;
    sql.batch_execute(LEGACY_LAYOUT).await.expect("legacy layout");
    sql.batch_execute(
        "INSERT INTO adk_sessions (app_name, user_id, session_id, last_seq) VALUES ('app', 'u1', 's1', 1);
         INSERT INTO adk_events (app_name, user_id, session_id, seq, event_id, author, event_ts, payload)
         VALUES ('app', 'u1', 's1', 1, 'e1', 'user', 1, '{}')",
    )
    .await
    .expect("a legacy session");
    let report = convert_events(db.url(), utc_today(), &LockPolicy::default(), &mut |_| {}).await.expect("convert");
    assert!(!report.already_converted, "{report:?}");
    let covered = assert_guards_hold(&sql, "after converting a legacy database").await;
    assert!(covered.iter().any(|c| c == "adk_events_legacy"), "the legacy partition looked at: {covered:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_guards_list_what_they_guard_against() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    assert_guards_hold(&sql, "a test database").await;

    // A function without a search_path, executable by PUBLIC (the default).
    sql.batch_execute("CREATE FUNCTION adk_probe_unpinned() RETURNS integer LANGUAGE sql AS 'SELECT 1'")
        .await
        .expect("create the probe");
    assert_eq!(unpinned_functions(&sql).await, vec!["adk_probe_unpinned(): no search_path"]);
    assert_eq!(public_functions(&sql).await, vec!["adk_probe_unpinned()"]);
    // Pinned the wrong way round: the caller's schema before pg_catalog.
    sql.batch_execute("ALTER FUNCTION adk_probe_unpinned() SET search_path = public, pg_catalog, pg_temp")
        .await
        .expect("pin wrongly");
    assert_eq!(unpinned_functions(&sql).await, vec!["adk_probe_unpinned(): search_path=public, pg_catalog, pg_temp"]);
    // pg_catalog first but pg_temp not last.
    sql.batch_execute("ALTER FUNCTION adk_probe_unpinned() SET search_path = pg_catalog, public")
        .await
        .expect("pin without pg_temp");
    assert_eq!(unpinned_functions(&sql).await, vec!["adk_probe_unpinned(): search_path=pg_catalog, public"]);
    sql.batch_execute(
        "ALTER FUNCTION adk_probe_unpinned() SET search_path = pg_catalog, public, pg_temp;
         REVOKE EXECUTE ON FUNCTION adk_probe_unpinned() FROM PUBLIC",
    )
    .await
    .expect("pin and revoke");
    assert!(unpinned_functions(&sql).await.is_empty());
    assert!(public_functions(&sql).await.is_empty());
    sql.batch_execute("DROP FUNCTION adk_probe_unpinned()").await.expect("drop the probe");

    // A SECURITY DEFINER function is guarded whatever its name.
    sql.batch_execute("CREATE FUNCTION probe_definer() RETURNS integer LANGUAGE sql SECURITY DEFINER AS 'SELECT 1'")
        .await
        .expect("create the definer probe");
    assert_eq!(unpinned_functions(&sql).await, vec!["probe_definer() SECURITY DEFINER: no search_path"]);
    sql.batch_execute("DROP FUNCTION probe_definer()").await.expect("drop the definer probe");

    // The same body, standard-SQL: its names were bound at creation.
    sql.batch_execute(
        "CREATE FUNCTION adk_probe_bound() RETURNS integer LANGUAGE sql SECURITY DEFINER RETURN 1;
         REVOKE EXECUTE ON FUNCTION adk_probe_bound() FROM PUBLIC",
    )
    .await
    .expect("create the bound probe");
    assert!(unpinned_functions(&sql).await.is_empty(), "a standard-SQL body needs no pinned path");
    sql.batch_execute("DROP FUNCTION adk_probe_bound()").await.expect("drop the bound probe");

    // A tenant table with nothing, then each part of the protection in turn.
    sql.batch_execute("CREATE TABLE adk_probe_tenant (app_name text)").await.expect("create the table probe");
    assert_eq!(
        unprotected_relations(&sql).await,
        vec!["adk_probe_tenant (row-level security off, not forced, no adk_tenant_isolation policy)"]
    );
    sql.batch_execute("ALTER TABLE adk_probe_tenant ENABLE ROW LEVEL SECURITY").await.expect("enable");
    assert_eq!(
        unprotected_relations(&sql).await,
        vec!["adk_probe_tenant (not forced, no adk_tenant_isolation policy)"]
    );
    sql.batch_execute("ALTER TABLE adk_probe_tenant FORCE ROW LEVEL SECURITY").await.expect("force");
    assert_eq!(unprotected_relations(&sql).await, vec!["adk_probe_tenant (no adk_tenant_isolation policy)"]);
    sql.batch_execute("CREATE POLICY adk_tenant_isolation ON adk_probe_tenant USING (false)").await.expect("policy");
    assert!(unprotected_relations(&sql).await.is_empty());
    // A policy alone, without row-level security enabled, is not enough.
    sql.batch_execute("ALTER TABLE adk_probe_tenant DISABLE ROW LEVEL SECURITY").await.expect("disable");
    assert_eq!(unprotected_relations(&sql).await, vec!["adk_probe_tenant (row-level security off)"]);
    sql.batch_execute("DROP TABLE adk_probe_tenant").await.expect("drop the table probe");

    // A partitioned table counts as much as a plain one.
    sql.batch_execute("CREATE TABLE adk_probe_parted (app_name text) PARTITION BY LIST (app_name)")
        .await
        .expect("create the partitioned probe");
    assert_eq!(
        unprotected_relations(&sql).await,
        vec!["adk_probe_parted (row-level security off, not forced, no adk_tenant_isolation policy)"]
    );
    sql.batch_execute("DROP TABLE adk_probe_parted").await.expect("drop the partitioned probe");

    assert_guards_hold(&sql, "after the probes were dropped").await;
}
