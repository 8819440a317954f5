//! On one server an append's common path is one SQL statement inside
//! `adk_append_event`: the lock, the insert and the sequencing as one CTE
//! (migration 10). The three-statement body Citus needs (installed by the
//! distribution step, pinned by `citus.rs`) cost a quarter of the appends
//! here, and nothing but a count of the statements the function ran tells
//! the two apart: both store the same events with the same outcomes.
//!
//! Counted by pg_stat_statements with `track = all`, which sees the
//! statements a PL/pgSQL body runs.

use adk_postgres_testing::test_database;
use adk_postgres_tests::pg::client;

const APPENDS: i64 = 6;

/// The body the distribution step installs on Citus: the control, which
/// must show three statements, else this test could not see the one-server
/// body go missing.
const ROUTABLE_APPEND: &str = include_str!("../../crates/schema/src/citus_append.sql");

#[tokio::test(flavor = "multi_thread")]
async fn an_append_runs_one_statement_inside_the_function_on_one_server() {
    let one_statement = statements_of_appends(None).await;
    assert_eq!(one_statement.len(), 1, "one statement locks, inserts and sequences: {one_statement:#?}");
    let (text, calls) = &one_statement[0];
    assert!(text.contains("adk_sessions") && text.contains("adk_events"), "{one_statement:#?}");
    assert!(text.trim_start().to_ascii_uppercase().starts_with("WITH"), "as a CTE: {one_statement:#?}");
    assert_eq!(*calls, APPENDS, "once per append: {one_statement:#?}");

    let routable = statements_of_appends(Some(ROUTABLE_APPEND)).await;
    assert_eq!(routable.len(), 3, "the control's lock, insert and update: {routable:#?}");
    assert!(routable.iter().all(|(_, calls)| *calls == APPENDS), "{routable:#?}");
}

/// The statements that read or wrote the session or the log while
/// `APPENDS` events were appended to a new session, with how often each
/// ran, on a new database whose append body is `body` (the migrations' when
/// `None`). PostgreSQL's own foreign-key check of each inserted event is
/// left out: both bodies run it.
async fn statements_of_appends(body: Option<&str>) -> Vec<(String, i64)> {
    let db = test_database().await;
    let sql = client(db.url()).await;
    let preloaded: String = sql.query_one("SHOW shared_preload_libraries", &[]).await.unwrap().get(0);
    assert!(
        preloaded.contains("pg_stat_statements"),
        "the test cluster must preload pg_stat_statements (Debian's postgresql-15 ships it); got {preloaded:?}"
    );
    if let Some(body) = body {
        sql.batch_execute(&format!("BEGIN; {body} COMMIT;")).await.unwrap();
    }
    sql.batch_execute(
        "CREATE EXTENSION IF NOT EXISTS pg_stat_statements;
         INSERT INTO adk_sessions (app_name, user_id, session_id) VALUES ('app', 'user', 'one');
         SET pg_stat_statements.track = 'all';
         SELECT pg_stat_statements_reset();",
    )
    .await
    .unwrap();
    for n in 0..APPENDS {
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
    let stored: i64 =
        sql.query_one("SELECT last_seq FROM adk_sessions WHERE session_id = 'one'", &[]).await.unwrap().get(0);
    assert_eq!(stored, APPENDS);

    let rows = sql
        .query(
            "SELECT query, calls FROM pg_stat_statements
              WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
                AND (query LIKE '%adk_sessions%' OR query LIKE '%adk_events%')
                AND query NOT LIKE '%pg_stat_statements%'
                AND query NOT LIKE '%last_seq FROM adk_sessions WHERE session_id%'
                AND query NOT LIKE '%FOR KEY SHARE OF x%'",
            &[],
        )
        .await
        .unwrap();
    rows.iter().map(|r| (r.get(0), r.get(1))).collect()
}
