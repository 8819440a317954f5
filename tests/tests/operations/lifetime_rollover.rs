//! Session lifetime: old sessions refuse appends, rollover moves the
//! conversation to a successor atomically.

use std::time::Duration;

use adk_postgres_domain::{AppendOptions, Event, GetOptions, SessionStore, StoreConfig, StoreError};
use adk_postgres_testing::test_database;
use adk_postgres_tests::pg::{client, new_session, store_with};
use serde_json::json;

fn with_delta(delta: serde_json::Value) -> Event {
    let mut event = Event::new("agent");
    event.actions.state_delta = delta.as_object().cloned().expect("object");
    event
}

#[tokio::test(flavor = "multi_thread")]
async fn a_session_past_its_lifetime_refuses_appends_until_rolled_over() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    let config = StoreConfig { max_session_lifetime: Some(Duration::from_secs(7 * 24 * 3600)), ..Default::default() };
    let store = store_with(db.url(), config).await;
    let key = new_session(&store, "app", "user").await;
    store
        .append(&key, with_delta(json!({"topic": "refunds", "user:tier": "gold"})), AppendOptions::default())
        .await
        .expect("young session appends");
    // Age the session past seven days.
    sql.execute("UPDATE adk_sessions SET created_at = now() - interval '8 days'", &[]).await.expect("age");

    let err = store.append(&key, Event::new("user"), AppendOptions::default()).await.expect_err("too old");
    assert!(
        matches!(&err, StoreError::LifetimeExceeded { max_lifetime, .. } if max_lifetime.as_secs() == 7 * 24 * 3600)
    );
    assert!(err.to_string().contains("roll it over"), "{err}");

    let mut summary = Event::new("summarizer");
    summary.content = Some(json!({"role": "model", "parts": [{"text": "We discussed refunds."}]}));
    let successor = store.rollover(&key, None, summary.clone()).await.expect("rollover");
    assert_ne!(successor.key.session_id, key.session_id);
    assert_eq!(successor.events, vec![summary]);
    assert_eq!(successor.version, 1);
    assert_eq!(successor.state.get("topic"), Some(&json!("refunds")), "session state carried over");
    assert_eq!(successor.state.get("user:tier"), Some(&json!("gold")), "user state shared");

    let closed = store.append(&key, Event::new("user"), AppendOptions::default()).await.expect_err("closed");
    assert_eq!(
        closed,
        StoreError::SessionClosed { key: key.clone(), successor: Some(successor.key.session_id.clone()) }
    );
    let again = store.rollover(&key, None, Event::new("summarizer")).await.expect_err("already rolled over");
    assert!(matches!(again, StoreError::SessionClosed { .. }), "{again:?}");

    let next = store.append(&successor.key, Event::new("user"), AppendOptions::default()).await.expect("successor");
    assert_eq!(next.seq, Some(2));
    let old = store.get(&key, GetOptions::default()).await.expect("the closed session stays readable");
    assert_eq!(old.successor, Some(successor.key.session_id.clone()));
    assert!(old.closed_at.is_some());
}

#[tokio::test(flavor = "multi_thread")]
async fn rollover_is_atomic() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    let store = store_with(db.url(), StoreConfig::default()).await;
    let key = new_session(&store, "app", "user").await;
    let taken = new_session(&store, "app", "user").await;

    // The successor id is taken: nothing changes.
    let err =
        store.rollover(&key, Some(taken.session_id.to_string()), Event::new("summarizer")).await.expect_err("taken id");
    assert!(matches!(err, StoreError::AlreadyExists(_)), "{err:?}");
    assert!(store.get(&key, GetOptions::default()).await.expect("get").closed_at.is_none());

    // Today's partition is missing: the summary cannot be stored, so the old
    // session must stay open and no successor may exist.
    let today: String = sql
        .query_one("SELECT adk_event_partition_name((now() AT TIME ZONE 'UTC')::date)", &[])
        .await
        .expect("name")
        .get(0);
    // The store makes a missing partition for today itself; take that
    // remedy away so the partition stays missing.
    sql.batch_execute(&format!(
        "DROP TABLE {today}; ALTER FUNCTION adk_premake_event_partitions() RENAME TO premake_disabled"
    ))
    .await
    .expect("drop today's partition");
    let err = store.rollover(&key, Some("next".into()), Event::new("summarizer")).await.expect_err("no partition");
    assert!(matches!(err, StoreError::PartitionMissing { .. }), "{err:?}");
    assert!(store.get(&key, GetOptions::default()).await.expect("get").closed_at.is_none());
    let successors: i64 =
        sql.query_one("SELECT count(*) FROM adk_sessions WHERE session_id = 'next'", &[]).await.expect("count").get(0);
    assert_eq!(successors, 0);
    // With the remedy back, the same rollover makes today's partition and succeeds.
    sql.batch_execute("ALTER FUNCTION premake_disabled() RENAME TO adk_premake_event_partitions").await.expect("back");
    let successor = store.rollover(&key, Some("next".into()), Event::new("summarizer")).await.expect("rollover");
    assert_eq!(successor.version, 1);

    let summary_with_state = with_delta(json!({"a": 1}));
    let err = store.rollover(&key, None, summary_with_state).await.expect_err("summary with a delta");
    assert!(matches!(&err, StoreError::InvalidInput { field, .. } if field == "summary.actions.state_delta"));
}

/// Ages every session of the database by `days` (creation time and event
/// partition day alike), as if it had been created that long ago.
async fn age_sessions(sql: &tokio_postgres::Client, interval: &str) {
    sql.execute(&format!("UPDATE adk_sessions SET created_at = now() - interval '{interval}'"), &[])
        .await
        .expect("age the sessions");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_policy_lifetime_holds_for_a_client_that_sets_none() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    let store = store_with(db.url(), StoreConfig::default()).await;
    let key = new_session(&store, "app", "user").await;
    store.append(&key, Event::new("user"), AppendOptions::default()).await.expect("young");
    age_sessions(&sql, "7 days 1 second").await;
    let err = store.append(&key, Event::new("user"), AppendOptions::default()).await.expect_err("past the policy");
    assert!(
        matches!(&err, StoreError::LifetimeExceeded { max_lifetime, .. } if *max_lifetime == Duration::from_secs(7 * 86_400)),
        "{err:?}"
    );
    assert_eq!(store.get(&key, GetOptions::default()).await.expect("get").version, 1, "nothing written");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_can_tighten_the_lifetime_but_never_loosen_it() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    let day = Duration::from_secs(86_400);
    let loose = store_with(db.url(), StoreConfig { max_session_lifetime: Some(day * 70), ..Default::default() }).await;
    let tight = store_with(db.url(), StoreConfig { max_session_lifetime: Some(day), ..Default::default() }).await;
    let key = new_session(&loose, "app", "user").await;
    age_sessions(&sql, "2 days").await;
    let err = tight.append(&key, Event::new("user"), AppendOptions::default()).await.expect_err("tightened");
    assert!(matches!(&err, StoreError::LifetimeExceeded { max_lifetime, .. } if *max_lifetime == day), "{err:?}");
    loose.append(&key, Event::new("user"), AppendOptions::default()).await.expect("inside the policy's 7 days");
    age_sessions(&sql, "8 days").await;
    let err = loose.append(&key, Event::new("user"), AppendOptions::default()).await.expect_err("not loosened");
    assert!(matches!(&err, StoreError::LifetimeExceeded { max_lifetime, .. } if *max_lifetime == day * 7), "{err:?}");

    // The policy is read on every append: lowering it applies at once, to
    // every client.
    let key = new_session(&loose, "app", "user").await;
    sql.execute(
        "UPDATE adk_sessions SET created_at = now() - interval '3 hours' WHERE session_id = $1",
        &[&key.session_id.as_str()],
    )
    .await
    .expect("age one");
    sql.execute("UPDATE adk_store_policy SET max_session_lifetime = '2 hours'", &[]).await.expect("lower the policy");
    let err = loose.append(&key, Event::new("user"), AppendOptions::default()).await.expect_err("lowered");
    assert!(
        matches!(&err, StoreError::LifetimeExceeded { max_lifetime, .. } if *max_lifetime == Duration::from_secs(7200)),
        "{err:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_session_created_38_days_ago_is_refused_under_the_default_policy() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    let store = store_with(db.url(), StoreConfig::default()).await;
    let day: String =
        sql.query_one("SELECT ((now() AT TIME ZONE 'UTC')::date - 38)::text", &[]).await.expect("day").get(0);
    sql.batch_execute(&format!(
        "SELECT adk_ensure_event_partition('{day}'); \
         INSERT INTO adk_sessions (app_name, user_id, session_id, session_day, created_at, updated_at) \
         VALUES ('app', 'user', 'old', '{day}', now() - interval '38 days', now() - interval '38 days')"
    ))
    .await
    .expect("an old session");
    let key = adk_postgres_domain::SessionKey::new(
        adk_postgres_domain::AppName::new("app").expect("app"),
        adk_postgres_domain::UserId::new("user").expect("user"),
        adk_postgres_domain::SessionId::new("old").expect("id"),
    );
    let err = store.append(&key, Event::new("user"), AppendOptions::default()).await.expect_err("too old");
    assert!(matches!(err, StoreError::LifetimeExceeded { .. }), "{err:?}");
    let stored: i64 = sql.query_one("SELECT count(*) FROM adk_events", &[]).await.expect("count").get(0);
    assert_eq!(stored, 0, "nothing was acknowledged, nothing stored");
}
