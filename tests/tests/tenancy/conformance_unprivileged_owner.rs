//! The whole contract on a store owned by an ordinary role, not a superuser.
//!
//! Every other test migrates as the cluster's superuser `postgres`, and a
//! superuser bypasses row-level security entirely, even on tables where it
//! is FORCEd. So there the policies on `adk_sessions`, `adk_events` (and
//! every partition), `adk_user_states`, `adk_app_states`, `adk_role_apps`
//! and `adk_role_app_changes` are never evaluated inside the store's
//! SECURITY DEFINER functions: a policy that refused the owner's own
//! function, an `ON CONFLICT … DO UPDATE` it could not pass, a maintenance
//! step it blocked, would go unnoticed. Production usually migrates as an
//! ordinary owner role, for which the forced policies do apply.
//!
//! Here each test gets a database of its own owned by a fresh
//! `NOSUPERUSER NOBYPASSRLS CREATEROLE` login role that runs the migrations
//! itself (CREATEROLE so it can set service roles up, as an operator would
//! with it), and then:
//!
//! * `as_owner`: the full conformance suite on stores connected as that
//!   owner (`TenantScope::Off`);
//! * `as_service_role`: the full suite on `TenantScope::PerRequest` stores
//!   of service roles the owner set up, bound to every app;
//! * targeted cases: row-level security really is evaluated for the owner,
//!   maintenance runs as the owner and premakes protected partitions, a
//!   service role makes today's missing partition itself, the owner sees
//!   every app, and a role with direct reads sees only its bound app.

use adk_postgres_domain::{AppName, AppendOptions, CreateSession, SessionStore, StoreConfig, UserId};
use adk_postgres_retention::{MaintenanceConfig, run_maintenance};
use adk_postgres_schema::migrations::run_pending_migrations;
use adk_postgres_storage::TenantScope;
use adk_postgres_storage::tenancy::AppBinding;
use adk_postgres_testing::{TestDatabase, empty_database};
use adk_postgres_tests::pg::{self, client, login_url, scoped_store, two_tenants, unique_role, with_delta};
use chrono::{Days, NaiveDate};
use serde_json::json;
use tokio_postgres::Client;

/// The tables that hold tenant rows or bindings: row-level security must be
/// enabled and forced on each (and on every partition of `adk_events`).
const PROTECTED_TABLES: [&str; 6] =
    ["adk_sessions", "adk_events", "adk_user_states", "adk_app_states", "adk_role_apps", "adk_role_app_changes"];

/// UTC days yesterday … a week ahead, as the harness's migrated databases
/// have them (`adk_postgres_testing::test_database`).
const ENSURE_PARTITIONS: &str = "SELECT adk_ensure_event_partition(d::date) \
     FROM generate_series((now() AT TIME ZONE 'UTC')::date - 1, \
                          (now() AT TIME ZONE 'UTC')::date + 7, interval '1 day') d";

/// A database of its own, owned by a non-superuser role that migrated it.
#[derive(Debug)]
struct OwnedDatabase {
    /// The harness's database, dropped (by the superuser, `WITH (FORCE)`)
    /// with this value. Roles are the cluster's and stay: it is throwaway.
    _db: TestDatabase,
    /// The owner role's name.
    owner: String,
    /// The URL the owner logs in with.
    url: String,
}

fn quote(identifier: &str) -> String {
    format!("\"{}\"", identifier.replace('"', "\"\""))
}

/// Creates the owner role, hands it a new empty database (on PostgreSQL 15
/// the `public` schema belongs to `pg_database_owner`, so to it) and runs
/// the migrations as it.
async fn owned_database() -> OwnedDatabase {
    let db = empty_database().await;
    let owner = unique_role("adk_owner");
    {
        let superuser = client(db.url()).await;
        // `ALTER DATABASE … OWNER` on the harness's fresh database is
        // `CREATE DATABASE … OWNER` that the harness still drops at the end.
        superuser
            .batch_execute(&format!(
                "CREATE ROLE {role} LOGIN NOSUPERUSER NOBYPASSRLS CREATEROLE;
                 ALTER DATABASE {db} OWNER TO {role};",
                role = quote(&owner),
                db = quote(db.name()),
            ))
            .await
            .unwrap_or_else(|e| panic!("creating owner role {owner}: {e:?}"));
    }
    let url = login_url(db.url(), &owner);
    run_pending_migrations(&url).await.unwrap_or_else(|e| panic!("migrating as {owner}: {e}"));
    client(&url)
        .await
        .batch_execute(ENSURE_PARTITIONS)
        .await
        .unwrap_or_else(|e| panic!("making partitions as {owner}: {e:?}"));
    OwnedDatabase { _db: db, owner, url }
}

/// A service role the owner set up, bound to `apps`: name and login URL.
async fn service_role(owner_url: &str, apps: AppBinding) -> (String, String) {
    pg::service_role(owner_url, "adk_svc", apps).await
}

async fn count(sql: &Client, table: &str) -> i64 {
    sql.query_one(&format!("SELECT count(*) FROM {table}"), &[])
        .await
        .unwrap_or_else(|e| panic!("counting {table}: {e:?}"))
        .get(0)
}

/// Every partition of `adk_events` with whether it has row-level security
/// enabled, forced, and the tenant policy.
async fn partition_protection(sql: &Client) -> Vec<(String, bool, bool, bool)> {
    sql.query(
        "SELECT c.relname::text, c.relrowsecurity, c.relforcerowsecurity,
                EXISTS (SELECT 1 FROM pg_policy p WHERE p.polrelid = c.oid AND p.polname = 'adk_tenant_isolation')
         FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
         WHERE i.inhparent = 'adk_events'::regclass ORDER BY 1",
        &[],
    )
    .await
    .expect("partitions")
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
    .collect()
}

fn assert_all_protected(partitions: &[(String, bool, bool, bool)]) {
    assert!(!partitions.is_empty(), "adk_events has partitions");
    for (name, enabled, forced, policy) in partitions {
        assert!(*enabled && *forced && *policy, "{name}: rls {enabled}, forced {forced}, policy {policy}");
    }
}

// ---------------------------------------------------------------------------
// The suite as the owner

/// One owned database per test; every store a case asks for is a pool of the
/// owner with no tenant scope.
#[derive(Debug, Default)]
struct OwnerFactory {
    db: tokio::sync::OnceCell<OwnedDatabase>,
}

impl adk_postgres_tests::conformance::StoreFactory for OwnerFactory {
    async fn store(&self, config: StoreConfig) -> std::sync::Arc<dyn SessionStore> {
        let db = self.db.get_or_init(owned_database).await;
        std::sync::Arc::new(scoped_store(&db.url, config, TenantScope::Off).await)
    }
}

mod as_owner {
    use super::OwnerFactory;

    adk_postgres_tests::conformance_tests!(OwnerFactory::default());
}

// ---------------------------------------------------------------------------
// The suite as a service role the owner set up

/// One owned database per test; every store a case asks for is a
/// `PerRequest` pool of a new service role the owner bound to every app (the
/// cases' app names are random, so they cannot be bound in advance).
#[derive(Debug, Default)]
struct ServiceRoleFactory {
    db: tokio::sync::OnceCell<OwnedDatabase>,
}

impl adk_postgres_tests::conformance::StoreFactory for ServiceRoleFactory {
    async fn store(&self, config: StoreConfig) -> std::sync::Arc<dyn SessionStore> {
        let db = self.db.get_or_init(owned_database).await;
        let (_, url) = service_role(&db.url, AppBinding::AllApps).await;
        std::sync::Arc::new(scoped_store(&url, config, TenantScope::PerRequest).await)
    }
}

mod as_service_role {
    use super::ServiceRoleFactory;

    adk_postgres_tests::conformance_tests!(ServiceRoleFactory::default());
}

// ---------------------------------------------------------------------------
// Targeted cases

/// The premise of this file: the owner is no superuser, owns the store, and
/// row-level security is evaluated for it. `row_security = off` makes a
/// query fail rather than filter when a policy would apply; a superuser (or
/// BYPASSRLS role) is never affected, so there it succeeds.
#[tokio::test(flavor = "multi_thread")]
async fn row_level_security_applies_to_the_owner_itself() {
    let db = owned_database().await;
    let sql = client(&db.url).await;
    let row = sql
        .query_one(
            "SELECT r.rolsuper, r.rolbypassrls, r.rolcreaterole,
                    pg_get_userbyid(c.relowner)::text,
                    pg_has_role(current_user, n.nspowner, 'USAGE')
             FROM pg_roles r, pg_class c, pg_namespace n
             WHERE r.rolname = current_user AND c.oid = 'adk_sessions'::regclass AND n.oid = c.relnamespace",
            &[],
        )
        .await
        .expect("owner");
    let (superuser, bypass, createrole): (bool, bool, bool) = (row.get(0), row.get(1), row.get(2));
    assert!(
        !superuser && !bypass && createrole,
        "owner: super {superuser}, bypassrls {bypass}, createrole {createrole}"
    );
    assert_eq!(row.get::<_, String>(3), db.owner, "the owner role made the tables");
    assert!(row.get::<_, bool>(4), "the owner owns the store's schema");

    for table in PROTECTED_TABLES {
        let row = sql
            .query_one(
                "SELECT relrowsecurity, relforcerowsecurity FROM pg_class WHERE oid = $1::text::regclass",
                &[&table],
            )
            .await
            .expect("table");
        assert!(row.get::<_, bool>(0) && row.get::<_, bool>(1), "{table}: row-level security enabled and forced");
    }
    assert_all_protected(&partition_protection(&sql).await);

    sql.batch_execute("SET row_security = off").await.expect("row_security off");
    for table in PROTECTED_TABLES {
        let error = sql
            .query_one(&format!("SELECT count(*) FROM {table}"), &[])
            .await
            .expect_err("a policy applies to the owner, so row_security = off refuses the query");
        let message = error.as_db_error().map(|e| e.message().to_owned()).unwrap_or_default();
        assert!(message.contains("row-level security"), "{table}: {error:?}");
    }
}

/// Maintenance needs no superuser: as the owner it premakes, detaches
/// (`CONCURRENTLY`), drops, deletes the retired days' sessions through the
/// forced policy, and every partition it makes is protected.
#[tokio::test(flavor = "multi_thread")]
async fn maintenance_runs_as_the_owner_and_premakes_protected_partitions() {
    let db = owned_database().await;
    let sql = client(&db.url).await;
    let plus = |d: NaiveDate, n: u64| d.checked_add_days(Days::new(n)).expect("day");
    let minus = |d: NaiveDate, n: u64| d.checked_sub_days(Days::new(n)).expect("day");

    // Start from no partition, as in maintenance.rs, on a day of our choosing.
    sql.batch_execute(
        "DO $$ DECLARE p regclass; BEGIN
           FOR p IN SELECT inhrelid::regclass FROM pg_inherits WHERE inhparent = 'adk_events'::regclass LOOP
             EXECUTE format('DROP TABLE %s', p);
           END LOOP; END $$;",
    )
    .await
    .expect("drop partitions as the owner");
    let today = NaiveDate::from_ymd_opt(2030, 3, 1).expect("day");
    // 50 days of two sessions with three events each, written by the owner
    // directly (it passes the forced policy with no tenant named).
    for back in 0..50 {
        let day = minus(today, back);
        sql.execute("SELECT adk_ensure_event_partition($1)", &[&day]).await.expect("partition as the owner");
        sql.execute(
            "INSERT INTO adk_sessions (app_name, user_id, session_id, session_day, last_seq, created_at, updated_at)
             SELECT 'app', 'user', $1::date::text || '-' || s, $1, 3,
                    ($1::date + time '12:00') AT TIME ZONE 'UTC', ($1::date + time '12:00') AT TIME ZONE 'UTC'
             FROM generate_series(1, 2) s",
            &[&day],
        )
        .await
        .expect("sessions as the owner");
        sql.execute(
            "INSERT INTO adk_events (app_name, user_id, session_id, session_day, seq, event_id, author, event_ts, payload)
             SELECT 'app', 'user', $1::date::text || '-' || s, $1, n, 'e' || n, 'agent', n,
                    jsonb_build_object('id', 'e' || n, 'author', 'agent', 'timestamp', $1::date::text || 'T12:00:00Z')
             FROM generate_series(1, 2) s, generate_series(1, 3) n",
            &[&day],
        )
        .await
        .expect("events as the owner");
    }

    let report = run_maintenance(&db.url, today, &MaintenanceConfig::default())
        .await
        .expect("maintenance as the non-superuser owner");
    // The default policy keeps lifetime (7 days) + retention (30 days).
    let cutoff = minus(today, 37);
    assert_eq!(report.retire_before, Some(cutoff));
    assert_eq!(report.created, (1..=7).map(|n| plus(today, n)).collect::<Vec<_>>(), "premade a week ahead");
    let retired: Vec<String> =
        (38..50).rev().map(|n| format!("adk_events_p{}", minus(today, n).format("%Y%m%d"))).collect();
    assert_eq!(report.detached, retired);
    assert_eq!(report.dropped, retired);
    assert_eq!(report.sessions_deleted, 12 * 2);
    assert!(report.kept.is_empty(), "{report:?}");

    let partitions = partition_protection(&sql).await;
    assert_eq!(partitions.len(), 38 + 7, "{partitions:?}");
    assert_all_protected(&partitions);
    let old: i64 = sql
        .query_one("SELECT count(*) FROM adk_sessions WHERE session_day < $1", &[&cutoff])
        .await
        .expect("count")
        .get(0);
    assert_eq!(old, 0);
    assert_eq!(count(&sql, "adk_sessions").await, 38 * 2);
    assert_eq!(count(&sql, "adk_events").await, 38 * 2 * 3);
    let recorded: i64 = sql
        .query_one("SELECT count(*) FROM adk_maintenance_runs WHERE outcome = 'ok'", &[])
        .await
        .expect("runs")
        .get(0);
    assert!(recorded >= 1, "the run was recorded");

    let again = run_maintenance(&db.url, today, &MaintenanceConfig::default()).await.expect("second run");
    assert!(again.created.is_empty() && again.dropped.is_empty() && again.sessions_deleted == 0, "{again:?}");
}

/// A service role cannot create tables, but its first append of a new day
/// makes that day's partition through the owner's SECURITY DEFINER
/// premake, protected like every other.
#[tokio::test(flavor = "multi_thread")]
async fn a_service_role_store_makes_todays_missing_partition_itself() {
    let db = owned_database().await;
    let (_, service_url) = service_role(&db.url, AppBinding::Apps(vec!["alpha".into()])).await;
    let owner = client(&db.url).await;
    // As on a new day that maintenance has not reached: no partition for today.
    owner
        .batch_execute(
            "DO $$ BEGIN EXECUTE format('DROP TABLE %I', adk_event_partition_name((now() AT TIME ZONE 'UTC')::date)); END $$",
        )
        .await
        .expect("drop today's partition as the owner");
    let service = scoped_store(&service_url, StoreConfig::default(), TenantScope::PerRequest).await;
    let request = CreateSession::new(AppName::new("alpha").expect("app"), UserId::new("u1").expect("user"));
    let session = service.create(request).await.expect("create as the service role");
    let appended = service
        .append(&session.key, with_delta(json!({"step": 1})), AppendOptions::default())
        .await
        .expect("the first append makes today's partition and is stored");
    assert_eq!(appended.seq, Some(1));
    assert_eq!(count(&owner, "adk_events").await, 1);
    let today: String = owner
        .query_one("SELECT adk_event_partition_name((now() AT TIME ZONE 'UTC')::date)", &[])
        .await
        .expect("name")
        .get(0);
    let partitions = partition_protection(&owner).await;
    assert!(partitions.iter().any(|(name, ..)| *name == today), "{today} was made again: {partitions:?}");
    assert_all_protected(&partitions);
}

/// The owner, with no tenant named and no role switch, passes the forced
/// policy and sees every app's rows.
#[tokio::test(flavor = "multi_thread")]
async fn the_owner_sees_every_app_without_naming_a_tenant() {
    let db = owned_database().await;
    two_tenants(&db.url).await;
    let owner = client(&db.url).await;
    assert_eq!(count(&owner, "adk_sessions").await, 2);
    assert_eq!(count(&owner, "adk_events").await, 2);
    assert_eq!(count(&owner, "adk_user_states").await, 2);
    assert_eq!(count(&owner, "adk_app_states").await, 2);
    let apps: Vec<String> = owner
        .query("SELECT DISTINCT app_name FROM adk_sessions ORDER BY 1", &[])
        .await
        .expect("apps")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(apps, ["alpha", "beta"]);
    // Naming some tenant changes nothing for the owner.
    owner.batch_execute("SET adk.app_name = 'alpha'").await.expect("set tenant");
    assert_eq!(count(&owner, "adk_sessions").await, 2);
    // And it reads the bindings, which only it may.
    service_role(&db.url, AppBinding::Apps(vec!["alpha".into()])).await;
    assert_eq!(count(&owner, "adk_role_apps").await, 1);
    assert!(count(&owner, "adk_role_app_changes").await >= 1);
}

/// A role the owner granted SELECT on every table, bound to "alpha", sees
/// alpha's rows only while it acts for alpha, nothing when it names another
/// app or none, and never the bindings.
#[tokio::test(flavor = "multi_thread")]
async fn a_role_with_direct_reads_sees_only_its_bound_app() {
    let db = owned_database().await;
    two_tenants(&db.url).await;
    let (reporting, reporting_url) = service_role(&db.url, AppBinding::Apps(vec!["alpha".into()])).await;
    let owner = client(&db.url).await;
    owner
        .batch_execute(&format!("GRANT SELECT ON ALL TABLES IN SCHEMA public TO {}", quote(&reporting)))
        .await
        .expect("broad grant by the owner");
    let partition: String = owner
        .query_one("SELECT adk_event_partition_name((now() AT TIME ZONE 'UTC')::date)", &[])
        .await
        .expect("partition")
        .get(0);
    let tables = ["adk_sessions", "adk_events", "adk_user_states", "adk_app_states", partition.as_str()];
    let sql = client(&reporting_url).await;
    let counts = async |sql: &Client| -> Vec<i64> {
        let mut counts = Vec::new();
        for table in tables {
            counts.push(count(sql, table).await);
        }
        counts
    };

    assert_eq!(counts(&sql).await, [0, 0, 0, 0, 0], "no tenant named: nothing visible");

    sql.batch_execute("SET adk.app_name = 'alpha'").await.expect("act for alpha");
    assert_eq!(counts(&sql).await, [1, 1, 1, 1, 1]);
    for table in tables {
        let apps: Vec<String> = sql
            .query(&format!("SELECT DISTINCT app_name FROM {table}"), &[])
            .await
            .expect("apps")
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert_eq!(apps, ["alpha"], "{table}");
    }

    sql.batch_execute("SET adk.app_name = 'beta'").await.expect("name a foreign app");
    assert_eq!(counts(&sql).await, [0, 0, 0, 0, 0], "a foreign tenant sees nothing");

    assert_eq!(count(&sql, "adk_role_apps").await, 0, "the bindings are the owner's alone");
    assert_eq!(count(&sql, "adk_role_app_changes").await, 0, "the binding log is the owner's alone");
}
