//! Tenancy as an operator sets it up: a service role bound to its apps acts
//! for those only, through the store's operations only; a role granted
//! direct reads sees only the rows of an app it is bound to and acts for,
//! even through a query without an app filter. The escape suite
//! (`escape.rs`) tries the ways around this.

use std::sync::Arc;

use adk_postgres_domain::{
    AppName, AppendOptions, CreateSession, Event, GetOptions, ListSessions, SessionKey, SessionStore, StoreConfig,
    StoreError, UserId,
};
use adk_postgres_schema::names::STORE_TABLES;
use adk_postgres_storage::tenancy::{AppBinding, STORE_FUNCTIONS, ServiceRoleOptions, setup_service_role};
use adk_postgres_storage::{PgSessionStore, PoolConfig, TenantScope};
use adk_postgres_testing::{TestDatabase, test_database};
use adk_postgres_tests::pg::{self, client, store, with_delta};
use serde_json::json;

/// A service role bound to `apps`: its name and login URL.
async fn service_role(db: &TestDatabase, apps: &[&str]) -> (String, String) {
    pg::service_role(db.url(), "adk_service", AppBinding::Apps(apps.iter().map(|a| (*a).to_owned()).collect())).await
}

async fn two_tenants(db: &TestDatabase) -> (SessionKey, SessionKey) {
    pg::two_tenants(db.url()).await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tenant_cannot_reach_another_apps_sessions() {
    let db = test_database().await;
    let (alpha, beta) = two_tenants(&db).await;
    let (_, service_url) = service_role(&db, &["alpha"]).await;
    let scoped = PgSessionStore::connect(&service_url, &PoolConfig::default(), StoreConfig::default())
        .await
        .expect("connect as the service role")
        .with_tenant_scope(TenantScope::Fixed(AppName::new("alpha").expect("app")));

    let own = scoped.get(&alpha, GetOptions::default()).await.expect("own session");
    assert_eq!(own.events.len(), 1);
    assert_eq!(own.state.get("user:plan"), Some(&json!("alpha")));

    assert!(matches!(scoped.get(&beta, GetOptions::default()).await, Err(StoreError::NotFound(_))));
    let listed =
        scoped.list(&ListSessions::new(beta.app_name.clone(), beta.user_id.clone())).await.expect("list another app");
    assert!(listed.sessions.is_empty());
    let append_elsewhere =
        scoped.append(&beta, Event::new("user"), AppendOptions::default()).await.expect_err("append to another app");
    assert!(matches!(append_elsewhere, StoreError::PermissionDenied { .. }), "{append_elsewhere:?}");
    let delete_elsewhere = scoped.delete(&beta).await.expect_err("delete in another app");
    assert!(matches!(delete_elsewhere, StoreError::PermissionDenied { .. }), "{delete_elsewhere:?}");
    let create_elsewhere = scoped
        .create(CreateSession::new(AppName::new("beta").expect("app"), UserId::new("u2").expect("user")))
        .await
        .expect_err("creating a session of another app");
    assert!(matches!(create_elsewhere, StoreError::PermissionDenied { .. }), "{create_elsewhere:?}");

    // The owner still sees beta whole.
    let owner = store(db.url()).await;
    let untouched = owner.get(&beta, GetOptions::default()).await.expect("beta survives");
    assert_eq!(untouched.events.len(), 1);
    assert_eq!(untouched.state.get("app:motd"), Some(&json!("beta")));
}

#[tokio::test(flavor = "multi_thread")]
async fn raw_queries_without_an_app_filter_see_only_the_tenant() {
    let db = test_database().await;
    two_tenants(&db).await;
    // The service role itself reads no table at all.
    let (_, service_url) = service_role(&db, &["alpha"]).await;
    let denied = client(&service_url).await.query("SELECT * FROM adk_sessions", &[]).await.expect_err("no SELECT");
    let message = denied.as_db_error().map(|e| e.message().to_owned()).unwrap_or_default();
    assert!(message.starts_with("permission denied"), "{denied:?}");

    // A reporting role bound to alpha, after the broad grant operators make.
    let (reporting, reporting_url) = service_role(&db, &["alpha"]).await;
    let owner = client(db.url()).await;
    owner
        .batch_execute(&format!("GRANT SELECT, INSERT ON ALL TABLES IN SCHEMA public TO \"{reporting}\""))
        .await
        .expect("broad grant");
    let partition: String = owner
        .query_one("SELECT adk_event_partition_name((now() AT TIME ZONE 'UTC')::date)", &[])
        .await
        .expect("partition")
        .get(0);
    let sql = client(&reporting_url).await;
    let counts = async |sql: &tokio_postgres::Client| -> Vec<i64> {
        let mut counts = Vec::new();
        for table in ["adk_sessions", "adk_events", "adk_user_states", "adk_app_states", partition.as_str()] {
            counts.push(sql.query_one(&format!("SELECT count(*) FROM {table}"), &[]).await.expect("count").get(0));
        }
        counts
    };
    assert_eq!(counts(&sql).await, vec![0, 0, 0, 0, 0], "no tenant set: nothing visible");

    // SET LOCAL, the one form that reaches Citus workers (docs/citus.md).
    sql.batch_execute("BEGIN; SET LOCAL adk.app_name = 'alpha'").await.expect("enter alpha");
    assert_eq!(counts(&sql).await, vec![1, 1, 1, 1, 1]);
    let apps: Vec<String> = sql
        .query(&format!("SELECT DISTINCT app_name FROM {partition}"), &[])
        .await
        .expect("apps")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(apps, vec!["alpha".to_owned()]);
    let refused = sql
        .execute("INSERT INTO adk_sessions (app_name, user_id, session_id) VALUES ('beta', 'u9', 'sneaky')", &[])
        .await
        .expect_err("WITH CHECK refuses another app's row");
    let message = refused.as_db_error().map(|e| e.message().to_owned()).unwrap_or_default();
    assert!(message.contains("row-level security"), "{refused:?}");
    sql.batch_execute("ROLLBACK").await.expect("rollback");

    // The setting was transaction-local: it is gone.
    assert_eq!(counts(&sql).await, vec![0, 0, 0, 0, 0]);
    // Naming an app it is not bound to shows nothing.
    sql.batch_execute("SET adk.app_name = 'beta'").await.expect("forge beta");
    assert_eq!(counts(&sql).await, vec![0, 0, 0, 0, 0], "a forged tenant sees nothing");
    sql.batch_execute("BEGIN; SET LOCAL adk.app_name = 'beta'").await.expect("forge beta locally");
    assert_eq!(counts(&sql).await, vec![0, 0, 0, 0, 0], "a tenant forged with SET LOCAL sees nothing");
    sql.batch_execute("ROLLBACK").await.expect("rollback");

    // The owner, without any role switch, is not restricted (by design).
    let all: i64 = owner.query_one("SELECT count(*) FROM adk_sessions", &[]).await.expect("count").get(0);
    assert_eq!(all, 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn tenants_hammering_one_pool_never_see_each_other() {
    let db = test_database().await;
    let (_, service_url) = service_role(&db, &["alpha", "beta"]).await;
    let shared = Arc::new(
        PgSessionStore::connect(
            &service_url,
            &PoolConfig { max_size: 4, ..PoolConfig::default() },
            StoreConfig::default(),
        )
        .await
        .expect("connect")
        .with_tenant_scope(TenantScope::PerRequest),
    );
    let mut tasks = Vec::new();
    for worker in 0..8 {
        let store = Arc::clone(&shared);
        tasks.push(tokio::spawn(async move {
            let app = if worker % 2 == 0 { "alpha" } else { "beta" };
            let app_name = AppName::new(app).expect("app");
            let user = UserId::new("shared-user").expect("user");
            for round in 0..15 {
                let key = store
                    .create(
                        CreateSession::new(app_name.clone(), user.clone()).with_id(format!("{app}-{worker}-{round}")),
                    )
                    .await
                    .expect("create")
                    .key;
                store
                    .append(&key, with_delta(json!({"app:last_writer": app, "owner": app})), AppendOptions::default())
                    .await
                    .expect("append");
                let session = store.get(&key, GetOptions::default()).await.expect("get");
                assert_eq!(session.state.get("app:last_writer"), Some(&json!(app)), "saw another app's state");
                let page = store
                    .list(&ListSessions { page_size: Some(200), ..ListSessions::new(app_name.clone(), user.clone()) })
                    .await
                    .expect("list");
                // Sessions other workers just created may not have their first
                // event yet; none may carry another app's.
                assert!(page.sessions.iter().all(
                    |s| s.key.app_name == app_name && s.state.get("owner").is_none_or(|owner| owner == &json!(app))
                ));
            }
        }));
    }
    for task in tasks {
        task.await.expect("worker");
    }
    // No pooled connection kept a tenant after its transaction.
    let mut leaked = Vec::new();
    for _ in 0..4 {
        let mut conn = shared.pool().get().await.expect("connection");
        leaked.push(setting(&mut conn).await);
    }
    assert!(leaked.iter().all(|s| s.as_deref().unwrap_or("").is_empty()), "{leaked:?}");
    let owner = client(db.url()).await;
    let per_app: Vec<(String, i64)> = owner
        .query("SELECT app_name, count(*) FROM adk_sessions GROUP BY 1 ORDER BY 1", &[])
        .await
        .expect("count")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(per_app, vec![("alpha".to_owned(), 60), ("beta".to_owned(), 60)]);
}

async fn setting(conn: &mut adk_postgres_storage::PgConn) -> Option<String> {
    use diesel::sql_types::{Nullable, Text};
    #[derive(diesel::QueryableByName)]
    struct Row {
        #[diesel(sql_type = Nullable<Text>)]
        value: Option<String>,
    }
    conn.load::<Row>(&diesel::sql_query("SELECT current_setting('adk.app_name', true) AS value"))
        .await
        .expect("read the setting")
        .into_iter()
        .next()
        .and_then(|row| row.value)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_role_exempt_from_row_level_security_is_refused() {
    let db = test_database().await;
    let err = setup_service_role(db.url(), "postgres", &ServiceRoleOptions::default()).await.expect_err("superuser");
    assert!(err.to_string().contains("exempt from row-level security"), "{err}");
    let err = setup_service_role(db.url(), "no_such_role_here", &ServiceRoleOptions::default())
        .await
        .expect_err("missing role without create");
    assert!(err.to_string().contains("does not exist"), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_service_role_runs_the_store_operations_and_nothing_else() {
    let db = test_database().await;
    let (role, service_url) = service_role(&db, &["alpha"]).await;
    let owner = client(db.url()).await;
    for table in STORE_TABLES {
        let any: bool = owner
            .query_one(
                "SELECT has_table_privilege($1, $2, 'SELECT') OR has_table_privilege($1, $2, 'INSERT')
                     OR has_table_privilege($1, $2, 'UPDATE') OR has_table_privilege($1, $2, 'DELETE')
                     OR has_table_privilege($1, $2, 'TRUNCATE')",
                &[&role, &table],
            )
            .await
            .expect("table privileges")
            .get(0);
        assert!(!any, "{role} holds a privilege on {table}");
    }
    let executable: Vec<String> = owner
        .query(
            "SELECT p.proname::text FROM pg_proc p
             WHERE p.pronamespace = 'public'::regnamespace AND p.proname LIKE 'adk\\_%'
               AND has_function_privilege($1, p.oid, 'EXECUTE')
             ORDER BY 1",
            &[&role],
        )
        .await
        .expect("functions")
        .iter()
        .map(|r| r.get(0))
        // Row-level security calls these as the querying role; they answer
        // only about that role.
        .filter(|f: &String| !["adk_acting_app", "adk_is_store_owner", "adk_visible_app"].contains(&f.as_str()))
        .collect();
    let mut expected: Vec<String> = STORE_FUNCTIONS.iter().map(|f| (*f).to_owned()).collect();
    expected.sort();
    assert_eq!(executable, expected, "exactly the store's operations");

    let sql = client(&service_url).await;
    // Partitions it is missing are made as the owner, for the policy's days only.
    owner
        .batch_execute("DO $$ BEGIN EXECUTE format('DROP TABLE %I', adk_event_partition_name((now() AT TIME ZONE 'UTC')::date + 2)); END $$")
        .await
        .expect("drop a coming day");
    let made: i32 = sql.query_one("SELECT adk_premake_event_partitions()", &[]).await.expect("premake").get(0);
    assert_eq!(made, 1);
    let refused = sql
        .execute("UPDATE adk_store_policy SET premake_days = 30", &[])
        .await
        .expect_err("the service role cannot change the policy");
    let message = refused.as_db_error().map(|e| e.message().to_owned()).unwrap_or_default();
    assert!(message.starts_with("permission denied"), "{refused:?}");
    let other_day = sql
        .execute("SELECT adk_ensure_event_partition((now() AT TIME ZONE 'UTC')::date + 100)", &[])
        .await
        .expect_err("no arbitrary partitions for the service role");
    let message = other_day.as_db_error().map(|e| e.message().to_owned()).unwrap_or_default();
    assert!(message.contains("must be owner") || message.starts_with("permission denied"), "{other_day:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_service_role_store_makes_todays_missing_partition_itself() {
    let db = test_database().await;
    let (_role, service_url) = service_role(&db, &["alpha"]).await;
    let owner = client(db.url()).await;
    // As on a new day that maintenance has not reached: no partition for today.
    owner
        .batch_execute("DO $$ BEGIN EXECUTE format('DROP TABLE %I', adk_event_partition_name((now() AT TIME ZONE 'UTC')::date)); END $$")
        .await
        .expect("drop today's partition");
    let service = PgSessionStore::connect(&service_url, &PoolConfig::default(), StoreConfig::default())
        .await
        .expect("connect as the service role")
        .with_tenant_scope(TenantScope::PerRequest);
    let request = CreateSession::new(AppName::new("alpha").expect("app"), UserId::new("u1").expect("user"));
    let session = service.create(request).await.expect("create");
    let appended = service
        .append(&session.key, with_delta(json!({"step": 1})), AppendOptions::default())
        .await
        .expect("the first append makes today's partition and is stored");
    assert_eq!(appended.seq, Some(1));
    let stored: i64 = owner.query_one("SELECT count(*) FROM adk_events", &[]).await.expect("count").get(0);
    assert_eq!(stored, 1);
}
