//! Raw SQL access for tests that look behind the store: catalog checks,
//! plans, statistics and rows written without going through the store.

use adk_postgres_domain::{AppName, CreateSession, Event, SessionKey, SessionStore, StoreConfig, UserId};
use adk_postgres_storage::tenancy::{AppBinding, ServiceRoleOptions, setup_service_role};
use adk_postgres_storage::{PgSessionStore, PoolConfig, TenantScope};
use adk_postgres_testing::connect;
pub use adk_postgres_testing::{Notices, drain_notices as drain};
use diesel_async::AsyncPgConnection;
use tokio_postgres::Client;

/// A plain tokio-postgres client on `url`; its connection task runs on the
/// current runtime.
pub async fn client(url: &str) -> Client {
    connect(url).await.unwrap_or_else(|e| panic!("connect for raw SQL: {e}"))
}

/// A diesel connection on `url`, for the storage and retention functions
/// that take one.
pub async fn diesel(url: &str) -> AsyncPgConnection {
    adk_postgres_connect::establish(url).await.unwrap_or_else(|e| panic!("connect with diesel to {url}: {e}"))
}

/// A store on `url` with default settings.
pub async fn store(url: &str) -> PgSessionStore {
    store_with(url, StoreConfig::default()).await
}

pub async fn store_with(url: &str, config: StoreConfig) -> PgSessionStore {
    PgSessionStore::connect(url, &PoolConfig::default(), config)
        .await
        .unwrap_or_else(|e| panic!("connecting the store ({url}): {e}"))
}

/// A store on `url` acting for the tenants `scope` names, as a service role
/// runs it.
pub async fn scoped_store(url: &str, config: StoreConfig, scope: TenantScope) -> PgSessionStore {
    PgSessionStore::connect(url, &PoolConfig::default(), config)
        .await
        .unwrap_or_else(|e| panic!("connecting the store ({url}): {e}"))
        .with_tenant_scope(scope)
}

/// A fresh role name: `prefix` and 12 random hex digits. Roles belong to the
/// cluster, which the tests share, so every test makes its own.
pub fn unique_role(prefix: &str) -> String {
    format!("{prefix}_{}", &uuid::Uuid::new_v4().simple().to_string()[..12])
}

/// `url` logging in as `role`, without a password (the test cluster trusts
/// local logins).
pub fn login_url(url: &str, role: &str) -> String {
    let mut url = url::Url::parse(url).expect("test URL");
    url.set_username(role).expect("set user");
    url.set_password(None).expect("no password");
    url.to_string()
}

/// A new login role named after `prefix`, set up on the store at
/// `owner_url` the way an operator would (`adk-pg service-role --create`)
/// and bound to `apps`. Returns its name and the URL it logs in with.
pub async fn service_role(owner_url: &str, prefix: &str, apps: AppBinding) -> (String, String) {
    let role = unique_role(prefix);
    let report = setup_service_role(owner_url, &role, &ServiceRoleOptions { create: true, password: None, apps })
        .await
        .unwrap_or_else(|e| panic!("setting up service role {role}: {e}"));
    assert!(report.created, "{role} is new");
    let url = login_url(owner_url, &role);
    (role, url)
}

/// An event whose state delta is `delta` (an object).
pub fn with_delta(delta: serde_json::Value) -> Event {
    let mut event = Event::new("agent");
    event.actions.state_delta = delta.as_object().cloned().expect("a state delta is an object");
    event
}

/// Sessions `alpha-session` of app "alpha" and `beta-session` of app
/// "beta", for user "u1", each with one event that writes session, user and
/// app state, written by the owner's store at `owner_url`.
pub async fn two_tenants(owner_url: &str) -> (SessionKey, SessionKey) {
    let owner = store(owner_url).await;
    let mut keys = Vec::new();
    for app in ["alpha", "beta"] {
        let request = CreateSession::new(AppName::new(app).expect("app"), UserId::new("u1").expect("user"))
            .with_id(format!("{app}-session"));
        let key = owner.create(request).await.expect("create as the owner").key;
        let delta = serde_json::json!({"user:plan": app, "app:motd": app, "topic": app});
        owner.append(&key, with_delta(delta), Default::default()).await.expect("append as the owner");
        keys.push(key);
    }
    let beta = keys.pop().expect("beta");
    (keys.pop().expect("alpha"), beta)
}

/// Creates a session with a generated id for (app, user).
pub async fn new_session(store: &dyn SessionStore, app: &str, user: &str) -> SessionKey {
    let request = CreateSession::new(AppName::new(app).expect("app"), UserId::new(user).expect("user"));
    store.create(request).await.expect("create session").key
}

/// A client whose notices are collected, e.g. plans `auto_explain` logs;
/// [`drain`] takes them.
pub async fn client_with_notices(url: &str) -> (Client, Notices) {
    adk_postgres_testing::connect_with_notices(url).await.unwrap_or_else(|e| panic!("connect for raw SQL: {e}"))
}

/// A client on which `auto_explain` logs the plan of every statement as it
/// ran, those inside functions too, as notices that [`drain`] takes: how a
/// test sees the plan a store function used.
pub async fn client_explaining(url: &str) -> (Client, Notices) {
    let (client, notices) = client_with_notices(url).await;
    client
        .batch_execute(
            "LOAD 'auto_explain'; SET auto_explain.log_min_duration = 0;
             SET auto_explain.log_nested_statements = on; SET client_min_messages = log;",
        )
        .await
        .expect("auto_explain");
    (client, notices)
}

/// The text of `EXPLAIN (COSTS OFF) <sql>`.
pub async fn explain(client: &Client, sql: &str) -> String {
    let rows = client.query(&format!("EXPLAIN (COSTS OFF) {sql}"), &[]).await.expect("explain");
    rows.iter().map(|r| r.get::<_, String>(0)).collect::<Vec<_>>().join("\n")
}

/// A PostgreSQL client program (pg_dump, psql, pgbench) from the server
/// binaries the harness starts its clusters from (`ADK_PG_SERVER_BIN_DIR`,
/// else `pg_config --bindir`, else the newest `/usr/lib/postgresql/*/bin`),
/// else whatever `PATH` finds: a pg_dump older than the server refuses it.
pub fn server_binary(name: &str) -> std::path::PathBuf {
    adk_postgres_testing::find_server_binaries()
        .ok()
        .map(|dir| dir.join(name))
        .filter(|path| path.exists())
        .unwrap_or_else(|| std::path::PathBuf::from(name))
}

/// The pid of a backend of this test's database that waits on a lock and
/// whose `pg_stat_activity` row matches `matching` (an SQL condition, e.g.
/// `application_name = 'adk-postgres'`). Panics after five seconds: the
/// test's statement never blocked.
pub async fn lock_waiter(sql: &Client, matching: &str) -> i32 {
    let query = format!(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() \
         AND wait_event_type = 'Lock' AND ({matching})"
    );
    for _ in 0..200 {
        let rows = sql.query(&query, &[]).await.expect("pg_stat_activity");
        if let Some(row) = rows.first() {
            return row.get(0);
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    panic!("no backend matching {matching} waited on a lock");
}

/// The cluster's WAL insert position, for measuring what a step writes.
pub async fn wal_lsn(sql: &Client) -> String {
    sql.query_one("SELECT pg_current_wal_insert_lsn()::text", &[]).await.expect("lsn").get(0)
}

/// Bytes of WAL written since `from` (a [`wal_lsn`]).
pub async fn wal_since(sql: &Client, from: &str) -> i64 {
    sql.query_one("SELECT (pg_current_wal_insert_lsn() - $1::text::pg_lsn)::bigint", &[&from])
        .await
        .expect("wal")
        .get(0)
}

/// (blob rows, their bytes, the sum of their references) of `app`, or of
/// every app when `app` is `None`.
pub async fn blobs(sql: &Client, app: Option<&str>) -> (i64, i64, i64) {
    let row = sql
        .query_one(
            "SELECT count(*), coalesce(sum(length(data)), 0)::bigint, coalesce(sum(refs), 0)::bigint
               FROM adk_blobs WHERE $1::text IS NULL OR app_name = $1",
            &[&app],
        )
        .await
        .expect("blobs");
    (row.get(0), row.get(1), row.get(2))
}

/// Every blob's count equals the events naming it, and none is unnamed.
pub async fn assert_counts_match_references(sql: &Client) {
    let wrong: i64 = sql
        .query_one(
            "SELECT count(*) FROM adk_blobs b
               FULL JOIN (SELECT e.app_name, h, count(*) AS n FROM adk_events e, unnest(e.blob_refs) h
                           GROUP BY e.app_name, h) r ON r.app_name = b.app_name AND r.h = b.sha256
              WHERE b.refs IS DISTINCT FROM r.n",
            &[],
        )
        .await
        .expect("compare")
        .get(0);
    assert_eq!(wrong, 0, "a blob's count differs from the events naming it, or a blob is orphaned or missing");
}

/// Applies the embedded migrations through `last` (a diesel version,
/// `20261202000023`) to the empty database at `url`, the way a binary of
/// that time left it: the migrations alone, then today's partitions, and
/// none of the later steps (the install of crates/schema/sql, Citus).
pub async fn migrate_through(url: &str, last: &str) {
    use diesel::migration::{Migration as _, MigrationSource};
    use diesel_migrations::MigrationHarness as _;

    type Wrapper = diesel_async::async_connection_wrapper::AsyncConnectionWrapper<AsyncPgConnection>;
    let mut conn = Wrapper::from(diesel(url).await);
    let last = last.to_owned();
    tokio::task::spawn_blocking(move || {
        use diesel::connection::SimpleConnection as _;
        diesel::migration::MigrationConnection::setup(&mut conn).expect("diesel's migrations table");
        let migrations = MigrationSource::<diesel::pg::Pg>::migrations(&adk_postgres_schema::migrations::MIGRATIONS)
            .expect("the embedded migrations");
        for migration in migrations.iter().filter(|m| m.name().version().to_string() <= last) {
            conn.run_migration(migration).unwrap_or_else(|e| panic!("migration {}: {e}", migration.name()));
        }
        conn.batch_execute("SELECT adk_premake_event_partitions()").expect("today's partitions");
    })
    .await
    .expect("the migrations");
}
