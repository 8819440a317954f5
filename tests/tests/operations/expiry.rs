//! Session expiry: batched, lock-skipping, complete.

use std::time::Duration;

use adk_postgres_domain::{
    AppName, AppendOptions, CreateSession, Event, GetOptions, SessionKey, SessionStore, StoreConfig, StoreError, UserId,
};
use adk_postgres_retention::expire_sessions;
use adk_postgres_testing::test_database;
use adk_postgres_tests::pg::{client, store, store_with};
use chrono::Utc;

/// `n` sessions of `user`, each with `events` events.
async fn sessions_with_events(store: &dyn SessionStore, user: &str, n: usize, events: usize) -> Vec<SessionKey> {
    let mut keys = Vec::new();
    for _ in 0..n {
        let request = CreateSession::new(AppName::new("app").expect("app"), UserId::new(user).expect("user"));
        let key = store.create(request).await.expect("create").key;
        for _ in 0..events {
            store.append(&key, Event::new("agent"), AppendOptions::default()).await.expect("append");
        }
        keys.push(key);
    }
    keys
}

async fn expire_user(sql: &tokio_postgres::Client, user: &str) {
    sql.execute("UPDATE adk_sessions SET expires_at = now() - interval '1 minute' WHERE user_id = $1", &[&user])
        .await
        .expect("expire");
}

#[tokio::test(flavor = "multi_thread")]
async fn removes_exactly_the_expired_sessions_and_their_events_in_batches() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    let store = store(db.url()).await;
    let expired = sessions_with_events(&store, "old", 10, 4).await;
    let live = sessions_with_events(&store, "new", 5, 4).await;
    expire_user(&sql, "old").await;
    // One live session with a deadline in the future stays too.
    sql.execute(
        "UPDATE adk_sessions SET expires_at = now() + interval '1 hour' WHERE session_id = $1",
        &[&live[0].session_id.as_str()],
    )
    .await
    .expect("future deadline");

    let report = expire_sessions(db.url(), 3, None).await.expect("expire");
    assert_eq!(report.sessions_deleted, 10);
    assert_eq!(report.events_deleted, 40);
    assert_eq!(report.batches, 4, "10 sessions in batches of 3");
    for key in &expired {
        assert!(matches!(store.get(key, GetOptions::default()).await, Err(StoreError::NotFound(_))));
    }
    for key in &live {
        assert_eq!(store.get(key, GetOptions::default()).await.expect("live session").events.len(), 4);
    }
    let events: i64 = sql.query_one("SELECT count(*) FROM adk_events", &[]).await.expect("count").get(0);
    assert_eq!(events, 20);

    let second = expire_sessions(db.url(), 3, None).await.expect("second run");
    assert_eq!(second.sessions_deleted, 0);
    assert_eq!(second.batches, 0);
}

/// One server skips a row an append holds and leaves it to the next run;
/// Citus, which cannot lock rows across shards, waits for the append.
/// Either way no batch fails and every expired session goes.
#[tokio::test(flavor = "multi_thread")]
async fn a_session_an_append_holds_is_skipped_on_one_server_and_waited_for_on_citus() {
    let db = test_database().await;
    let on_citus = !db.worker_urls().is_empty();
    let sql = client(db.url()).await;
    let store = store(db.url()).await;
    let keys = sessions_with_events(&store, "old", 4, 2).await;
    expire_user(&sql, "old").await;

    // Hold the row lock an append takes, as an append in progress would
    // (by the full key, which Citus routes to the user's shard).
    let appender = client(db.url()).await;
    appender
        .batch_execute(&format!(
            "BEGIN; SELECT 1 FROM adk_sessions WHERE app_name = '{}' AND user_id = '{}' AND session_id = '{}'
             FOR NO KEY UPDATE",
            keys[0].app_name, keys[0].user_id, keys[0].session_id
        ))
        .await
        .expect("lock");
    if on_citus {
        let url = db.url().to_owned();
        let run = tokio::spawn(async move { expire_sessions(&url, 2, None).await });
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!run.is_finished(), "the batch holding the locked session waits for the append");
        appender.batch_execute("COMMIT").await.expect("release");
        let report = run.await.expect("expiry task").expect("expire");
        assert_eq!((report.sessions_deleted, report.events_deleted), (4, 8));
        assert_eq!(expire_sessions(db.url(), 2, None).await.expect("next run").sessions_deleted, 0);
        return;
    }
    let report = tokio::time::timeout(Duration::from_secs(20), expire_sessions(db.url(), 2, None))
        .await
        .expect("expiry must not wait for the lock")
        .expect("expire");
    assert_eq!(report.sessions_deleted, 3);
    appender.batch_execute("COMMIT").await.expect("release");

    let next = expire_sessions(db.url(), 2, None).await.expect("next run");
    assert_eq!(next.sessions_deleted, 1);
    assert_eq!(next.events_deleted, 2);
    assert_eq!(expire_sessions(db.url(), 2, None).await.expect("third run").sessions_deleted, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn sessions_get_their_deadline_from_the_configured_ttl() {
    let db = test_database().await;
    let store =
        store_with(db.url(), StoreConfig { default_ttl: Some(Duration::from_secs(3600)), ..Default::default() }).await;
    let created = store
        .create(CreateSession::new(AppName::new("app").expect("app"), UserId::new("u").expect("user")))
        .await
        .expect("create");
    let deadline = created.expires_at.expect("a deadline");
    let ttl = deadline.signed_duration_since(created.created_at);
    assert_eq!(ttl.num_seconds(), 3600);

    // A per-session TTL overrides the default.
    let short = store
        .create(
            CreateSession::new(AppName::new("app").expect("app"), UserId::new("u").expect("user"))
                .with_ttl(Duration::from_secs(60)),
        )
        .await
        .expect("create");
    assert_eq!(short.expires_at.expect("deadline").signed_duration_since(short.created_at).num_seconds(), 60);

    // Expiry as of two hours from now removes both.
    let later = Utc::now() + chrono::TimeDelta::hours(2);
    assert_eq!(expire_sessions(db.url(), 100, Some(later)).await.expect("expire").sessions_deleted, 2);
}
