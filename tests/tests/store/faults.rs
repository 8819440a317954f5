//! Faults: restarts, killed backends, stuck locks and deadlocks. Nothing
//! that was acknowledged is lost, nothing half-written stays, and the store
//! recovers on its own.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use adk_postgres_domain::{AppendOptions, Event, GetOptions, SessionKey, SessionStore, StoreConfig, StoreError};
use adk_postgres_storage::{PgSessionStore, PoolConfig};
use adk_postgres_testing::{Cluster, start_throwaway_cluster, test_database, test_database_on};
use adk_postgres_tests::pg::{client, lock_waiter, new_session};
use serde_json::json;

async fn store_with_pool(url: &str, pool: PoolConfig) -> PgSessionStore {
    PgSessionStore::connect(url, &pool, StoreConfig::default()).await.expect("connect")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restart_under_eight_writers_loses_nothing_acknowledged() {
    let cluster: &'static Cluster = Box::leak(Box::new(start_throwaway_cluster().expect("a private cluster")));
    let db = test_database_on(cluster).await;
    let store = Arc::new(
        store_with_pool(
            db.url(),
            PoolConfig { max_size: 8, connection_timeout: Duration::from_secs(2), ..PoolConfig::default() },
        )
        .await,
    );
    let restart_at = Arc::new(tokio::sync::Notify::new());
    let mut writers = Vec::new();
    for w in 0..8 {
        let store = Arc::clone(&store);
        let restart_at = Arc::clone(&restart_at);
        writers.push(tokio::spawn(async move {
            let key = new_session(store.as_ref(), "app", &format!("writer-{w}")).await;
            let mut acknowledged: Vec<(String, u64)> = Vec::new();
            let mut failures = 0u32;
            let deadline = Instant::now() + Duration::from_secs(60);
            // Each event is retried with its own id until acknowledged, as a
            // client would; appends are idempotent by event id.
            while acknowledged.len() < 60 && Instant::now() < deadline {
                let event = Event::new("agent");
                loop {
                    match store.append(&key, event.clone(), AppendOptions::default()).await {
                        Ok(appended) => {
                            acknowledged.push((event.id.clone(), appended.seq.expect("stored")));
                            break;
                        }
                        Err(e) if e.is_retryable() => {
                            failures += 1;
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                        Err(e) => panic!("writer {w}: a non-retryable error: {e:?}"),
                    }
                    if Instant::now() > deadline {
                        break;
                    }
                }
                if acknowledged.len() == 20 && w == 0 {
                    restart_at.notify_one();
                }
            }
            (key, acknowledged, failures)
        }));
    }
    restart_at.notified().await;
    cluster.restart_fast().expect("pg_ctl restart -m fast");
    let restarted = Instant::now();
    let probe = new_session(store.as_ref(), "app", "probe").await;
    let recovered = restarted.elapsed();
    assert!(recovered < Duration::from_secs(10), "the store took {recovered:?} to serve again");

    let mut total_failures = 0;
    for writer in writers {
        let (key, acknowledged, failures) = writer.await.expect("writer");
        total_failures += failures;
        assert_eq!(acknowledged.len(), 60, "{key} did not finish");
        let session = store.get(&key, GetOptions::default()).await.expect("get after restart");
        let stored: HashMap<&str, usize> =
            session.events.iter().enumerate().map(|(i, e)| (e.id.as_str(), i + 1)).collect();
        for (id, seq) in &acknowledged {
            assert_eq!(stored.get(id.as_str()), Some(&(*seq as usize)), "acknowledged event {id} lost or moved");
        }
        assert_eq!(session.version as usize, session.events.len(), "seq has a gap");
        assert_eq!(session.events.len(), acknowledged.len(), "an unacknowledged event was stored twice");
    }
    store.delete(&probe).await.expect("probe");
    println!("restart: recovered in {recovered:?}; {total_failures} retryable failures during it");
}

/// The pid of the store's backend that waits for a lock.
async fn waiting_backend(sql: &tokio_postgres::Client) -> i32 {
    lock_waiter(sql, "application_name = 'adk-postgres'").await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_backend_killed_mid_append_leaves_nothing_and_is_retryable() {
    let db = test_database().await;
    let store = store_with_pool(db.url(), PoolConfig::default()).await;
    let key = new_session(&store, "app", "user").await;
    let sql = client(db.url()).await;
    // Hold the user-state row: the append locks its session, inserts the
    // event and updates the session, then waits here, half done.
    store.append(&key, with_delta(json!({"user:seen": 0})), AppendOptions::default()).await.expect("first append");
    let blocker = client(db.url()).await;
    blocker.batch_execute("BEGIN; SELECT * FROM adk_user_states FOR UPDATE").await.expect("hold the user row");

    let mut event = with_delta(json!({"user:seen": 1, "topic": "half"}));
    event.id = "interrupted".into();
    let append = {
        let store = store.clone();
        let key = key.clone();
        let event = event.clone();
        tokio::spawn(async move { store.append(&key, event, AppendOptions::default()).await })
    };
    let pid = waiting_backend(&sql).await;
    sql.execute("SELECT pg_terminate_backend($1)", &[&pid]).await.expect("terminate");
    let err = append.await.expect("join").expect_err("the append's backend was killed");
    assert!(err.is_retryable(), "{err:?}");
    blocker.batch_execute("ROLLBACK").await.expect("release");

    let session = store.get(&key, GetOptions::default()).await.expect("the pool replaced the connection");
    assert_eq!(session.version, 1, "no partial append");
    assert_eq!(session.events.len(), 1);
    assert!(session.state.get("topic").is_none());
    assert_eq!(session.state.get("user:seen"), Some(&json!(0)));

    let retried = store.append(&key, event, AppendOptions::default()).await.expect("the retry succeeds");
    assert_eq!(retried.seq, Some(2));
    assert!(!retried.replayed);
}

fn with_delta(delta: serde_json::Value) -> Event {
    let mut event = Event::new("agent");
    event.actions.state_delta = delta.as_object().cloned().expect("object");
    event
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stuck_lock_is_a_typed_timeout_not_a_hang() {
    let db = test_database().await;
    let lock_timeout = Duration::from_millis(300);
    let store = store_with_pool(db.url(), PoolConfig { lock_timeout, ..PoolConfig::default() }).await;
    let key = new_session(&store, "app", "user").await;
    let blocker = client(db.url()).await;
    blocker.batch_execute("BEGIN; SELECT * FROM adk_sessions FOR UPDATE").await.expect("hold the session row");

    let started = Instant::now();
    let err = store.append(&key, Event::new("user"), AppendOptions::default()).await.expect_err("lock held");
    let waited = started.elapsed();
    assert!(matches!(&err, StoreError::Timeout { what } if what.contains("lock")), "{err:?}");
    assert!(err.is_retryable());
    assert!(waited >= lock_timeout && waited < Duration::from_secs(5), "waited {waited:?}");
    blocker.batch_execute("ROLLBACK").await.expect("release");
    assert_eq!(store.get(&key, GetOptions::default()).await.expect("get").version, 0);
    store.append(&key, Event::new("user"), AppendOptions::default()).await.expect("works once the lock is gone");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_statement_past_statement_timeout_is_a_typed_timeout() {
    let db = test_database().await;
    let store = store_with_pool(
        db.url(),
        PoolConfig {
            statement_timeout: Duration::from_millis(200),
            lock_timeout: Duration::from_secs(10),
            ..PoolConfig::default()
        },
    )
    .await;
    let key = new_session(&store, "app", "user").await;
    let blocker = client(db.url()).await;
    blocker.batch_execute("BEGIN; SELECT * FROM adk_sessions FOR UPDATE").await.expect("hold the session row");
    let err = store.append(&key, Event::new("user"), AppendOptions::default()).await.expect_err("too slow");
    assert!(matches!(&err, StoreError::Timeout { what } if what.contains("statement")), "{err:?}");
    blocker.batch_execute("ROLLBACK").await.expect("release");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lost_deadlock_is_retried_transparently() {
    let db = test_database().await;
    let store = store_with_pool(db.url(), PoolConfig::default()).await;
    let key = new_session(&store, "app", "user").await;
    store
        .append(&key, with_delta(json!({"user:a": 0, "app:b": 0})), AppendOptions::default())
        .await
        .expect("seed the shared rows");

    // The other transaction holds the app row and, once the append holds the
    // user row and waits for the app row, asks for the user row: a deadlock
    // the append detects first (its deadlock_timeout is the shorter), so the
    // append is the one rolled back, and must be retried.
    let other = client(db.url()).await;
    other
        .batch_execute("SET deadlock_timeout = '10s'; BEGIN; SELECT * FROM adk_app_states FOR UPDATE")
        .await
        .expect("hold the app row");
    let append = {
        let store = store.clone();
        let key = key.clone();
        tokio::spawn(async move {
            store.append(&key, with_delta(json!({"user:a": 1, "app:b": 1})), AppendOptions::default()).await
        })
    };
    let sql = client(db.url()).await;
    waiting_backend(&sql).await;
    let finish_other = tokio::spawn(async move {
        let locked = other.batch_execute("SELECT * FROM adk_user_states FOR UPDATE").await;
        other.batch_execute("COMMIT").await.expect("commit");
        locked
    });
    let appended = append.await.expect("join").expect("the append survives the deadlock");
    assert_eq!(appended.seq, Some(2));
    finish_other.await.expect("join").expect("the other transaction got its lock");
    let session = store.get(&key, GetOptions::default()).await.expect("get");
    assert_eq!(session.version, 2);
    assert_eq!(session.events.len(), 2, "the retried append is stored once");
    assert_eq!(session.state.get("user:a"), Some(&json!(1)));
}

#[tokio::test(flavor = "multi_thread")]
async fn no_connection_is_left_inside_a_transaction() {
    let db = test_database().await;
    let store = store_with_pool(db.url(), PoolConfig { max_size: 3, ..PoolConfig::default() }).await;
    let key = new_session(&store, "app", "user").await;
    let missing = SessionKey::parse("app", "user", "missing").expect("key");
    for _ in 0..10 {
        let _ = store.append(&missing, Event::new("user"), AppendOptions::default()).await;
        let mut too_big = Event::new("user");
        too_big.actions.state_delta.insert("k".into(), json!("x".repeat(70_000)));
        let _ = store.append(&key, too_big, AppendOptions::default()).await;
        store.append(&key, Event::new("user"), AppendOptions::default()).await.expect("append");
    }
    let sql = client(db.url()).await;
    let in_transaction: i64 = sql
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND application_name = 'adk-postgres' AND state LIKE 'idle in transaction%'",
            &[],
        )
        .await
        .expect("activity")
        .get(0);
    assert_eq!(in_transaction, 0);
    assert_eq!(store.get(&key, GetOptions::default()).await.expect("get").version, 10);
}
