//! What only the Postgres store can show of the paging reads: a page of
//! events reads one partition, the app-wide listing reads its index and no
//! more than a page of it, and who may list an app.

use adk_postgres_domain::{AppName, Event, ListAppSessions, SessionStore, StoreError};
use adk_postgres_storage::TenantScope;
use adk_postgres_storage::tenancy::AppBinding;
use adk_postgres_testing::test_database;
use adk_postgres_tests::pg::{client, client_explaining, drain, new_session, scoped_store, service_role, store};

use crate::postgres_only::partitions_in;

#[tokio::test(flavor = "multi_thread")]
async fn list_events_reads_one_partition_of_forty_both_ways() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    sql.batch_execute(
        "SELECT adk_ensure_event_partition(d::date)
         FROM generate_series((now() AT TIME ZONE 'UTC')::date - 35, (now() AT TIME ZONE 'UTC')::date + 7, '1 day') d",
    )
    .await
    .expect("premake");
    let store = store(db.url()).await;
    let key = new_session(&store, "app", "user").await;
    for _ in 0..5 {
        store.append(&key, Event::new("user"), Default::default()).await.expect("append");
    }
    let day: String = sql
        .query_one("SELECT session_day::text FROM adk_sessions WHERE session_id = $1", &[&key.session_id.as_str()])
        .await
        .expect("day")
        .get(0);
    let expected = format!("adk_events_p{}", day.replace('-', ""));

    // auto_explain logs the plan of the statement inside adk_list_events as
    // it ran: the function keeps a generic plan, pruned as it starts.
    let (explaining, plans) = client_explaining(db.url()).await;
    for (after, before, seqs) in [(Some(0_i64), None, vec![1_i64, 2, 3]), (None, Some(i64::MAX), vec![5, 4, 3])] {
        drain(&plans);
        let rows = explaining
            .query(
                "SELECT seq FROM adk_list_events(NULL, 'app', 'user', $1, $2, $3, 2) WHERE seq IS NOT NULL",
                &[&key.session_id.as_str(), &after, &before],
            )
            .await
            .expect("a page");
        assert_eq!(rows.iter().map(|r| r.get::<_, i64>(0)).collect::<Vec<_>>(), seqs, "limit + 1, in direction");
        let logged = drain(&plans);
        let plan =
            logged.iter().find(|p| p.contains("adk_events")).unwrap_or_else(|| panic!("no plan logged: {logged:?}"));
        assert_eq!(partitions_in(plan), vec![expected.clone()], "a page reads more than one partition:\n{plan}");
        assert!(plan.contains("Subplans Removed"), "pruned as the generic plan starts:\n{plan}");
        assert!(plan.contains("Index Scan"), "by the primary key:\n{plan}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn list_app_sessions_reads_its_index_a_page_at_a_time() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    sql.batch_execute(
        "INSERT INTO adk_sessions (app_name, user_id, session_id, created_at)
         SELECT 'big', 'u' || (n % 50), 's' || n, now() - n * interval '1 second' FROM generate_series(1, 5000) n;
         ANALYZE adk_sessions",
    )
    .await
    .expect("5,000 sessions of 50 users");
    let (explaining, plans) = client_explaining(db.url()).await;
    drain(&plans);
    let rows = explaining
        .query(
            "SELECT session_id FROM adk_list_app_sessions(NULL, 'big', NULL, NULL, NULL, 11, '{}', NULL, NULL)
              WHERE session_id IS NOT NULL",
            &[],
        )
        .await
        .expect("a page");
    let ids: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    assert_eq!(ids[..3], ["s1", "s2", "s3"], "newest created first");
    let logged = drain(&plans);
    let plan = logged.iter().find(|p| p.contains("adk_sessions_app_created")).unwrap_or_else(|| panic!("{logged:#?}"));
    assert!(!plan.contains("Sort"), "the index gives the order:\n{plan}");
    let store = store(db.url()).await;
    let page = store.list_app_sessions(&ListAppSessions::new(AppName::new("big").unwrap())).await.expect("page");
    assert_eq!(page.sessions.len(), 50);
    assert_eq!(page.sessions[0].key.user_id.as_str(), "u1", "the summary names its user");
}

#[tokio::test(flavor = "multi_thread")]
async fn list_app_sessions_is_for_the_owner_and_roles_bound_to_the_app() {
    let db = test_database().await;
    let owner = store(db.url()).await;
    for app in ["alpha", "beta"] {
        new_session(&owner, app, "u1").await;
        new_session(&owner, app, "u2").await;
    }
    let (_, url) = service_role(db.url(), "lister", AppBinding::Apps(vec!["alpha".into()])).await;
    let alpha = AppName::new("alpha").unwrap();
    let beta = AppName::new("beta").unwrap();
    let bound = scoped_store(&url, Default::default(), TenantScope::PerRequest).await;
    let page = bound.list_app_sessions(&ListAppSessions::new(alpha.clone())).await.expect("its own app");
    assert_eq!(page.sessions.len(), 2);
    let refused = bound.list_app_sessions(&ListAppSessions::new(beta.clone())).await;
    assert!(matches!(refused, Err(StoreError::PermissionDenied { .. })), "a foreign app: {refused:?}");
    let fixed = scoped_store(&url, Default::default(), TenantScope::Fixed(alpha.clone())).await;
    let refused = fixed.list_app_sessions(&ListAppSessions::new(beta)).await;
    assert!(matches!(refused, Err(StoreError::PermissionDenied { .. })), "a forged tenant: {refused:?}");
    let unnamed = scoped_store(&url, Default::default(), TenantScope::Off).await;
    let refused = unnamed.list_app_sessions(&ListAppSessions::new(alpha.clone())).await;
    assert!(matches!(refused, Err(StoreError::PermissionDenied { .. })), "no tenant named: {refused:?}");
    assert_eq!(owner.list_app_sessions(&ListAppSessions::new(alpha)).await.expect("owner").sessions.len(), 2);
}
