//! On one server the common path of an append and of a create is one SQL
//! statement inside its function: the append's lock, insert and sequencing
//! as one CTE (migration 10), the create's insert with its expiry and the
//! shared state it returns (migration 21). The statements Citus needs are
//! the other branch of the same bodies, taken where the switch
//! `adk_on_citus()` says true (`sessions.citus.sql`, installed on a
//! database with Citus); here they cost a quarter of the appends and a
//! fifth of the creates, and nothing but a count of the statements the
//! function ran tells the branches apart: both store the same rows with the
//! same outcomes.
//!
//! Counted by pg_stat_statements with `track = all`, which sees the
//! statements a PL/pgSQL body runs.

use adk_postgres_testing::test_database;
use adk_postgres_tests::pg::client;
use tokio_postgres::Client;

const CALLS: i64 = 6;

/// The Citus variant that turns the switch to true: installed here, the
/// append and the create take the branch Citus runs. The controls, which
/// must show more statements, else these tests could not see the
/// one-server branch go missing.
const ON_CITUS: &str = include_str!("../../../crates/schema/sql/sessions.citus.sql");

#[tokio::test(flavor = "multi_thread")]
async fn an_append_runs_one_statement_inside_the_function_on_one_server() {
    let one_statement = statements_of(None, append_to_one_session).await;
    assert_eq!(one_statement.len(), 1, "one statement locks, inserts and sequences: {one_statement:#?}");
    let (text, calls) = &one_statement[0];
    assert!(text.contains("adk_sessions") && text.contains("adk_events"), "{one_statement:#?}");
    assert!(text.trim_start().to_ascii_uppercase().starts_with("WITH"), "as a CTE: {one_statement:#?}");
    assert_eq!(*calls, CALLS, "once per append: {one_statement:#?}");

    let routable = statements_of(Some(ON_CITUS), append_to_one_session).await;
    assert_eq!(routable.len(), 3, "the control's lock, insert and update: {routable:#?}");
    assert!(routable.iter().all(|(_, calls)| *calls == CALLS), "{routable:#?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_create_runs_one_statement_inside_the_function_on_one_server() {
    let one_statement = statements_of(None, create_sessions).await;
    assert_eq!(one_statement.len(), 1, "one insert takes the expiry and returns the shared state: {one_statement:#?}");
    let (text, calls) = &one_statement[0];
    for table in ["adk_sessions", "adk_store_policy", "adk_user_states", "adk_app_states"] {
        assert!(text.contains(table), "{table}: {one_statement:#?}");
    }
    assert!(text.trim_start().to_ascii_uppercase().starts_with("INSERT"), "{one_statement:#?}");
    assert_eq!(*calls, CALLS, "once per create: {one_statement:#?}");

    let citus = statements_of(Some(ON_CITUS), create_sessions).await;
    assert_eq!(citus.len(), 5, "the control's delete, policy read, insert and two state reads: {citus:#?}");
    assert!(citus.iter().all(|(_, calls)| *calls == CALLS), "{citus:#?}");
}

/// The switch is folded into each plan that reads it, so a connection that
/// has appended keeps a constant in its cached plans; PostgreSQL records the
/// function as their dependency, so replacing it (as an install on Citus
/// does) replans them, and the next append takes the other branch.
#[tokio::test(flavor = "multi_thread")]
async fn a_live_connection_takes_the_other_branch_once_the_switch_is_replaced() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    prepare_statistics(&sql).await;
    sql.batch_execute("INSERT INTO adk_sessions (app_name, user_id, session_id) VALUES ('app', 'user', 'one')")
        .await
        .unwrap();
    reset_statistics(&sql).await;
    append(&sql, 0..CALLS).await;

    let installer = client(db.url()).await;
    let on_citus = ON_CITUS.replace(adk_postgres_schema::replaceable::SCHEMA_PLACEHOLDER, "public");
    installer.batch_execute(&format!("BEGIN; {on_citus} COMMIT;")).await.unwrap();
    append(&sql, CALLS..2 * CALLS).await;

    let statements = store_statements(&sql).await;
    assert_eq!(statements.len(), 4, "the CTE, then the lock, insert and update: {statements:#?}");
    assert!(statements.iter().all(|(_, calls)| *calls == CALLS), "each for half of the appends: {statements:#?}");
    let ctes = statements.iter().filter(|(text, _)| text.trim_start().to_ascii_uppercase().starts_with("WITH"));
    assert_eq!(ctes.count(), 1, "{statements:#?}");
}

async fn append_to_one_session(sql: &Client) {
    sql.batch_execute("INSERT INTO adk_sessions (app_name, user_id, session_id) VALUES ('app', 'user', 'one')")
        .await
        .unwrap();
    reset_statistics(sql).await;
    append(sql, 0..CALLS).await;
    let stored: i64 =
        sql.query_one("SELECT last_seq FROM adk_sessions WHERE session_id = 'one'", &[]).await.unwrap().get(0);
    assert_eq!(stored, CALLS);
}

/// Appends events `e<n>` for each `n` to the session `one`, each stored.
async fn append(sql: &Client, events: std::ops::Range<i64>) {
    for n in events {
        let event_id = format!("e{n}");
        let outcome: String = sql
            .query_one(
                "SELECT outcome FROM adk_append_event(NULL, 'app', 'user', 'one', $1, NULL, 'agent', 1,
                     jsonb_build_object('id', $1::text), '{\"n\": 1}', '{}', '{}', NULL, NULL)",
                &[&event_id],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(outcome, "stored");
    }
}

/// `CALLS` new sessions of a user whose user and app state exist, so that
/// every create returns both.
async fn create_sessions(sql: &Client) {
    sql.batch_execute(
        "INSERT INTO adk_user_states (app_name, user_id, state) VALUES ('app', 'user', '{\"u\": 1}');
         INSERT INTO adk_app_states (app_name, state) VALUES ('app', '{\"a\": 1}');",
    )
    .await
    .unwrap();
    reset_statistics(sql).await;
    for n in 0..CALLS {
        let session_id = format!("s{n}");
        let row = sql
            .query_one(
                "SELECT created_at, user_state, app_state FROM adk_create_session(NULL, 'app', 'user', $1,
                     '{\"n\": 1}', NULL, '{}', '{}')",
                &[&session_id],
            )
            .await
            .unwrap();
        let states: (serde_json::Value, serde_json::Value) = (row.get(1), row.get(2));
        assert_eq!(states, (serde_json::json!({"u": 1}), serde_json::json!({"a": 1})), "{session_id}");
    }
    let stored: i64 =
        sql.query_one("SELECT count(*) FROM adk_sessions WHERE user_id = 'user'", &[]).await.unwrap().get(0);
    assert_eq!(stored, CALLS);
}

/// Resets this database's statistics only: a reset of the whole cluster
/// would wipe the counts of a test running beside this one.
async fn reset_statistics(sql: &Client) {
    sql.batch_execute(
        "SET pg_stat_statements.track = 'all';
         SELECT pg_stat_statements_reset(0, (SELECT oid FROM pg_database WHERE datname = current_database()), 0);",
    )
    .await
    .unwrap();
}

/// The statements that read or wrote the store's tables while `work` ran,
/// with how often each ran, on a new database with `body` installed after
/// its migrations (for the controls, the switch turned to Citus).
async fn statements_of(body: Option<&str>, work: impl AsyncFnOnce(&Client)) -> Vec<(String, i64)> {
    let db = test_database().await;
    let sql = client(db.url()).await;
    if let Some(body) = body {
        // The test database's store lives in `public`.
        let body = body.replace(adk_postgres_schema::replaceable::SCHEMA_PLACEHOLDER, "public");
        sql.batch_execute(&format!("BEGIN; {body} COMMIT;")).await.unwrap();
    }
    prepare_statistics(&sql).await;
    work(&sql).await;
    store_statements(&sql).await
}

async fn prepare_statistics(sql: &Client) {
    let preloaded: String = sql.query_one("SHOW shared_preload_libraries", &[]).await.unwrap().get(0);
    assert!(
        preloaded.contains("pg_stat_statements"),
        "the test cluster must preload pg_stat_statements (Debian's postgresql-15 ships it); got {preloaded:?}"
    );
    sql.batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements").await.unwrap();
}

/// The statements on the store's tables pg_stat_statements counted since the
/// last reset, with how often each ran. PostgreSQL's own foreign-key check
/// of each inserted event is left out: every branch runs it.
async fn store_statements(sql: &Client) -> Vec<(String, i64)> {
    let rows = sql
        .query(
            "SELECT query, calls FROM pg_stat_statements
              WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
                AND query ~ '(adk_sessions|adk_events|adk_user_states|adk_app_states|adk_store_policy)'
                AND query NOT LIKE '%pg_stat_statements%'
                AND query NOT LIKE '%last_seq FROM adk_sessions WHERE session_id%'
                AND query NOT LIKE '%count(*) FROM adk_sessions%'
                AND query NOT LIKE '%FOR KEY SHARE OF x%'",
            &[],
        )
        .await
        .unwrap();
    rows.iter().map(|r| (r.get(0), r.get(1))).collect()
}
