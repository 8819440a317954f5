//! What only the Postgres store can show about `fork`: an exact prefix under
//! concurrent appends, the copy landing in today's partition, all or
//! nothing when its backend dies mid-copy, tenancy, and the usage rollup
//! not counting the copies again.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use adk_postgres_domain::{
    AppName, AppendOptions, CreateSession, Event, GetOptions, SessionKey, SessionStore, StoreConfig, StoreError, UserId,
};
use adk_postgres_rollup::{RollupConfig, run_rollup};
use adk_postgres_storage::TenantScope;
use adk_postgres_storage::tenancy::AppBinding;
use adk_postgres_testing::test_database;
use adk_postgres_tests::pg::{
    client, lock_waiter, new_session, scoped_store, service_role, store, two_tenants, with_delta,
};
use serde_json::json;
use tokio::task::JoinSet;

fn counter_event(i: usize) -> Event {
    with_delta(json!({ "last": i, format!("n{}", i % 7): i }))
}

#[tokio::test(flavor = "multi_thread")]
async fn forks_taken_under_eight_concurrent_writers_hold_an_exact_prefix() {
    let db = test_database().await;
    let store = Arc::new(store(db.url()).await);
    let key = new_session(&*store, "app", "user").await;
    let stop = Arc::new(AtomicBool::new(false));
    let mut writers = JoinSet::new();
    for w in 0..8 {
        let (store, key, stop) = (Arc::clone(&store), key.clone(), Arc::clone(&stop));
        writers.spawn(async move {
            let mut acked = 0usize;
            while !stop.load(Ordering::Relaxed) {
                store.append(&key, counter_event(w * 100_000 + acked), AppendOptions::default()).await.expect("append");
                acked += 1;
            }
            acked
        });
    }
    let mut forks = Vec::new();
    for i in 0..12 {
        tokio::time::sleep(Duration::from_millis(40)).await;
        let version =
            store.get(&key, GetOptions { num_recent_events: Some(0), after: None }).await.expect("get").version;
        let fork = store.fork(&key, version, Some(format!("fork-{i}"))).await.expect("fork under load");
        assert_eq!(fork.version, version);
        assert_eq!(fork.events.len() as u64, version, "a fork holds exactly events 1..=at_seq");
        forks.push(fork);
    }
    stop.store(true, Ordering::Relaxed);
    let mut acked = 0;
    while let Some(done) = writers.join_next().await {
        acked += done.expect("writer");
    }
    let original = store.get(&key, GetOptions::default()).await.expect("get the original");
    assert_eq!(original.version as usize, acked, "every acknowledged append is in the original");
    for fork in &forks {
        let prefix = &original.events[..fork.events.len()];
        assert_eq!(fork.events, prefix, "{} is a prefix of the original", fork.key);
        // The state a rewind to the same point would rebuild.
        let mut expected = serde_json::Map::new();
        for event in prefix {
            for (k, v) in &event.actions.state_delta {
                expected.insert(k.clone(), v.clone());
            }
        }
        assert_eq!(fork.state, expected, "{}: state folded from the copied deltas", fork.key);
    }
    assert!(forks.last().is_some_and(|f| f.version > 0), "the writers made progress before the last fork");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fork_of_an_old_session_copies_into_todays_partition() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    let store = store(db.url()).await;
    let key = new_session(&store, "app", "user").await;
    // A session born three days ago: its events live in that day's partition.
    sql.batch_execute(
        "SELECT adk_ensure_event_partition((now() AT TIME ZONE 'UTC')::date - 3);
         UPDATE adk_sessions SET session_day = (now() AT TIME ZONE 'UTC')::date - 3",
    )
    .await
    .expect("age the session");
    for i in 0..5 {
        store.append(&key, counter_event(i), AppendOptions::default()).await.expect("append");
    }
    let fork = store.fork(&key, 4, Some("forked".into())).await.expect("fork");
    let placement = sql
        .query(
            "SELECT session_id, tableoid::regclass::text, count(*)
               FROM adk_events GROUP BY 1, 2 ORDER BY 1",
            &[],
        )
        .await
        .expect("placement");
    let mut placement: Vec<(String, String, i64)> = placement.iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect();
    placement.sort();
    let day =
        |offset: i64| (chrono::Utc::now().date_naive() - chrono::Days::new(offset as u64)).format("%Y%m%d").to_string();
    assert_eq!(
        placement,
        {
            let mut expected = vec![
                (fork.key.session_id.as_str().to_owned(), format!("adk_events_p{}", day(0)), 4),
                (key.session_id.as_str().to_owned(), format!("adk_events_p{}", day(3)), 5),
            ];
            expected.sort();
            expected
        },
        "the original stays in its day, the fork's copies are in today's partition"
    );
    let day_of_fork: chrono::NaiveDate = sql
        .query_one("SELECT session_day FROM adk_sessions WHERE session_id = 'forked'", &[])
        .await
        .expect("fork row")
        .get(0);
    assert_eq!(day_of_fork, chrono::Utc::now().date_naive());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fork_killed_mid_copy_leaves_nothing() {
    let db = test_database().await;
    let store = store(db.url()).await;
    let key = new_session(&store, "app", "user").await;
    for i in 0..20 {
        store.append(&key, counter_event(i), AppendOptions::default()).await.expect("append");
    }
    let sql = client(db.url()).await;
    let blocker = client(db.url()).await;
    // SHARE on today's partition lets the fork read the original and insert
    // its session row, then blocks its copy of the events: half done.
    let partition: String =
        sql.query_one("SELECT tableoid::regclass::text FROM adk_events LIMIT 1", &[]).await.expect("partition").get(0);
    blocker.batch_execute(&format!("BEGIN; LOCK TABLE \"{partition}\" IN SHARE MODE")).await.expect("lock");
    let fork = {
        let store = store.clone();
        let key = key.clone();
        tokio::spawn(async move { store.fork(&key, 20, Some("half".into())).await })
    };
    let pid = lock_waiter(&sql, "query LIKE '%adk_fork_session%'").await;
    let half_written: i64 = sql
        .query_one(
            "SELECT count(*) FROM pg_locks l WHERE l.pid = $1 AND l.locktype = 'transactionid' AND l.granted",
            &[&pid],
        )
        .await
        .expect("locks")
        .get(0);
    assert_eq!(half_written, 1, "the fork had written (its session row) when it blocked");
    sql.execute("SELECT pg_terminate_backend($1)", &[&pid]).await.expect("terminate");
    let err = fork.await.expect("join").expect_err("the fork's backend was killed");
    assert!(err.is_retryable(), "{err:?}");
    blocker.batch_execute("ROLLBACK").await.expect("release");

    let leftovers: i64 = sql
        .query_one(
            "SELECT (SELECT count(*) FROM adk_sessions WHERE session_id = 'half')
                  + (SELECT count(*) FROM adk_events WHERE session_id = 'half')",
            &[],
        )
        .await
        .expect("leftovers")
        .get(0);
    assert_eq!(leftovers, 0, "nothing of a killed fork remains");
    let retried = store.fork(&key, 20, Some("half".into())).await.expect("the retry forks");
    assert_eq!(retried.version, 20);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_role_bound_to_another_app_cannot_fork_and_writes_nothing() {
    let db = test_database().await;
    let (alpha, beta) = two_tenants(db.url()).await;
    let (_, beta_url) = service_role(db.url(), "fork_beta", AppBinding::Apps(vec!["beta".into()])).await;
    let sql = client(db.url()).await;
    let before: i64 = sql.query_one("SELECT count(*) FROM adk_sessions", &[]).await.expect("count").get(0);
    for scope in [TenantScope::PerRequest, TenantScope::Fixed(beta.app_name.clone())] {
        let beta_store = scoped_store(&beta_url, StoreConfig::default(), scope.clone()).await;
        let refused = beta_store.fork(&alpha, 1, Some("stolen".into())).await;
        assert!(
            matches!(refused, Err(StoreError::NotFound(_) | StoreError::PermissionDenied { .. })),
            "{scope:?}: {refused:?}"
        );
    }
    let after: i64 = sql.query_one("SELECT count(*) FROM adk_sessions", &[]).await.expect("count").get(0);
    assert_eq!(after, before, "a refused fork wrote no session");
    let own = scoped_store(&beta_url, StoreConfig::default(), TenantScope::PerRequest).await;
    let fork = own.fork(&beta, 1, Some("own".into())).await.expect("a role forks within its app");
    assert_eq!(fork.state.get("topic"), Some(&json!("beta")));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_usage_rollup_does_not_count_forked_copies_again() {
    let db = test_database().await;
    let store = store(db.url()).await;
    let app = AppName::new("usage-app").expect("app");
    let key: SessionKey =
        store.create(CreateSession::new(app.clone(), UserId::new("user").expect("user"))).await.expect("create").key;
    for i in 0..30 {
        store.append(&key, counter_event(i), AppendOptions::default()).await.expect("append");
    }
    let rolled = |sql: tokio_postgres::Client| async move {
        let row = sql
            .query_one("SELECT coalesce(sum(events), 0)::bigint FROM adk_usage_1m WHERE app_name = 'usage-app'", &[])
            .await
            .expect("rollup rows");
        row.get::<_, i64>(0)
    };
    run_rollup(db.url(), &RollupConfig::default()).await.expect("rollup");
    assert_eq!(rolled(client(db.url()).await).await, 30);
    store.fork(&key, 30, Some("copy".into())).await.expect("fork");
    store.append(&key, counter_event(99), AppendOptions::default()).await.expect("a new event");
    run_rollup(db.url(), &RollupConfig::default()).await.expect("rollup after the fork");
    assert_eq!(rolled(client(db.url()).await).await, 31, "only the one new event is counted, not the 30 copies");
}
