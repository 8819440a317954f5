//! The live change feed (`PgSessionStore::watch` and `watch_app`, migration
//! `change_feed`) against a real PostgreSQL: catch-up then follow, every seq
//! exactly once and in order under eight writers and across listener
//! connections killed with `pg_terminate_backend`, the ways a feed ends, the
//! tenant check, and notices that carry ids, never content.
//!
//! Tests share one cluster and run in parallel, so every look at
//! `pg_stat_activity` keeps to the test's own database and to the feed's own
//! server process (`listener_pid`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use adk_postgres_domain::{
    AppName, AppendOptions, CreateSession, Event, SessionKey, SessionStore, StoreConfig, StoreError, UserId,
};
use adk_postgres_storage::tenancy::AppBinding;
use adk_postgres_storage::{AppNotice, EventFeed, PgSessionStore, TenantScope};
use adk_postgres_testing::{TestDatabase, test_database};
use adk_postgres_tests::pg::{self, client, new_session, scoped_store, store, two_tenants};
use diesel_async::RunQueryDsl;
use futures_util::{Stream, StreamExt};
use serde_json::json;
use tokio_postgres::Client;

/// How long a test waits for an item that must come. Not a performance
/// bound: only a missing item ever takes this long, and then the test fails
/// saying which one.
const PATIENCE: Duration = Duration::from_secs(60);

/// A migrated database with the change feed turned on, as its owner would
/// (`adk-pg change-feed on`): migrations leave it off.
async fn feed_database() -> TestDatabase {
    let db = test_database().await;
    let on: bool = client(db.url())
        .await
        .query_one("SELECT adk_set_change_feed(true)", &[])
        .await
        .expect("turn the feed on")
        .get(0);
    assert!(on, "the feed was off after migrating, and is on now");
    db
}

async fn next<S: Stream + Unpin>(feed: &mut S, what: &str) -> S::Item {
    tokio::time::timeout(PATIENCE, feed.next())
        .await
        .unwrap_or_else(|_| panic!("waited {PATIENCE:?} for {what}"))
        .unwrap_or_else(|| panic!("the feed ended before {what}"))
}

/// The next `n` events of `feed`, which must not fail.
async fn take(feed: &mut EventFeed, n: usize) -> Vec<(u64, Event)> {
    let mut items = Vec::with_capacity(n);
    for i in 0..n {
        match next(feed, &format!("item {} of {n}", i + 1)).await {
            Ok(item) => items.push(item),
            Err(e) => panic!("the feed failed after {} items: {e:?}", items.len()),
        }
    }
    items
}

/// Whether anything arrives on `feed` within a short look. Used only to see
/// that nothing is queued, so waiting longer could only make the test
/// slower, never change what it proves about what arrived before.
async fn nothing_ready<S: Stream + Unpin>(feed: &mut S) -> bool {
    tokio::time::timeout(Duration::from_millis(200), feed.next()).await.is_err()
}

fn event(text: &str) -> Event {
    let mut event = Event::new("agent");
    event.content = Some(json!({"role": "model", "parts": [{"text": text}]}));
    event
}

async fn append(store: &PgSessionStore, key: &SessionKey, text: &str) -> (u64, String) {
    let appended = store.append(key, event(text), AppendOptions::default()).await.expect("append");
    (appended.seq.expect("stored"), appended.event.id)
}

fn seqs(items: &[(u64, Event)]) -> Vec<u64> {
    items.iter().map(|(seq, _)| *seq).collect()
}

/// Terminates the server process `pid` if it is a backend of this test's
/// database; true when it did.
async fn terminate(sql: &Client, pid: i32) -> bool {
    sql.query_one(
        "SELECT coalesce(bool_or(pg_terminate_backend(pid)), false) FROM pg_stat_activity
          WHERE pid = $1 AND datname = current_database()",
        &[&pid],
    )
    .await
    .expect("terminate")
    .get(0)
}

/// Appends to another session of `key`'s app every 100 ms until aborted:
/// an app is busy, so its feeds hear notices about other sessions all the
/// time. That also keeps a feed's heartbeat (a read every 30 s of silence)
/// from ever firing, so what a test sees arrive came from the notice or the
/// reconnect it is about, not from the heartbeat's read.
async fn keep_app_busy(store: &Arc<PgSessionStore>, key: &SessionKey) -> tokio::task::JoinHandle<()> {
    let store = Arc::clone(store);
    let other = new_session(store.as_ref(), key.app_name.as_str(), "someone-else").await;
    tokio::spawn(async move {
        loop {
            append(&store, &other, "someone else").await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn catches_up_from_the_version_given_then_follows() {
    let db = feed_database().await;
    let store = Arc::new(store(db.url()).await);
    let key = new_session(store.as_ref(), "app", "u1").await;
    let mut appended = Vec::new();
    for i in 1..=5 {
        appended.push(append(&store, &key, &format!("before {i}")).await);
    }

    // from_seq is the version the caller has: the feed starts after it.
    let mut feed = store.watch(&key, 2).await.expect("watch");
    assert_eq!(feed.key(), &key);
    let caught_up = take(&mut feed, 3).await;
    assert_eq!(seqs(&caught_up), vec![3, 4, 5]);
    let ids: Vec<&str> = caught_up.iter().map(|(_, e)| e.id.as_str()).collect();
    assert_eq!(ids, appended[2..].iter().map(|(_, id)| id.as_str()).collect::<Vec<_>>());
    assert_eq!(
        caught_up[0].1.content,
        Some(json!({"role": "model", "parts": [{"text": "before 3"}]})),
        "the event as stored"
    );
    assert!(nothing_ready(&mut feed).await, "nothing past the session's version");

    // Waiting for notices holds no pooled connection.
    let state = store.pool().state();
    assert_eq!(state.connections, state.idle_connections, "an idle feed holds no pooled connection: {state:?}");

    // Each new event comes by its own notice.
    let busy = keep_app_busy(&store, &key).await;
    for i in 6..=8 {
        let (seq, id) = append(&store, &key, &format!("after {i}")).await;
        let (got, event) = next(&mut feed, &format!("seq {seq}")).await.expect("follow");
        assert_eq!((got, event.id), (seq, id));
    }

    // From 0: everything; from the current version: only what comes next.
    let mut all = store.watch(&key, 0).await.expect("watch from 0");
    assert_eq!(seqs(&take(&mut all, 8).await), (1..=8).collect::<Vec<_>>());
    let mut tail = store.watch(&key, 8).await.expect("watch from the version");
    assert!(nothing_ready(&mut tail).await, "nothing before the next append");
    let (seq, _) = append(&store, &key, "ninth").await;
    assert_eq!(next(&mut tail, "seq 9").await.expect("follow").0, seq);
    busy.abort();
}

#[tokio::test]
async fn refuses_what_it_cannot_follow() {
    let db = feed_database().await;
    let store = store(db.url()).await;
    let key = new_session(&store, "app", "u1").await;
    append(&store, &key, "one").await;

    let missing = SessionKey::new(
        key.app_name.clone(),
        key.user_id.clone(),
        adk_postgres_domain::SessionId::new("nope").unwrap(),
    );
    assert!(matches!(store.watch(&missing, 0).await, Err(StoreError::NotFound(k)) if k == missing));
    let other_user = SessionKey::new(key.app_name.clone(), UserId::new("u2").unwrap(), key.session_id.clone());
    assert!(matches!(store.watch(&other_user, 0).await, Err(StoreError::NotFound(_))));

    // A version the session never had.
    match store.watch(&key, 2).await {
        Err(StoreError::StaleSession { expected: 2, actual: 1, .. }) => {}
        other => panic!("from_seq past the version: {other:?}"),
    }
    match store.watch(&key, u64::MAX).await {
        Err(StoreError::InvalidInput { field, .. }) => assert_eq!(field, "from_seq"),
        other => panic!("from_seq out of range: {other:?}"),
    }
}

/// Eight writers append to `sessions` sessions (writer `w` to session
/// `w % sessions`) while one feed per session, opened before the first
/// append, reads them; each feed must see exactly the seqs and event ids its
/// writers were acknowledged, in order.
async fn eight_writers(sessions: usize, per_writer: usize) {
    let db = feed_database().await;
    let store = Arc::new(store(db.url()).await);
    let mut keys = Vec::new();
    let mut feeds = Vec::new();
    for s in 0..sessions {
        let key = new_session(store.as_ref(), "app", &format!("user-{s}")).await;
        feeds.push(store.watch(&key, 0).await.expect("watch"));
        keys.push(key);
    }
    let writers: Vec<_> = (0..8)
        .map(|w| {
            let store = Arc::clone(&store);
            let key = keys[w % sessions].clone();
            tokio::spawn(async move {
                let mut acknowledged = Vec::new();
                for i in 0..per_writer {
                    acknowledged.push(append(&store, &key, &format!("writer {w} event {i}")).await);
                }
                (w % sessions, acknowledged)
            })
        })
        .collect();
    let readers: Vec<_> = feeds
        .into_iter()
        .enumerate()
        .map(|(s, mut feed)| {
            let expected = per_writer * (0..8).filter(|w| w % sessions == s).count();
            tokio::spawn(async move { take(&mut feed, expected).await })
        })
        .collect();
    let mut acknowledged: Vec<HashMap<u64, String>> = vec![HashMap::new(); sessions];
    for writer in writers {
        let (s, acks) = writer.await.expect("writer");
        acknowledged[s].extend(acks);
    }
    for (s, reader) in readers.into_iter().enumerate() {
        let received = reader.await.expect("reader");
        let expected: Vec<u64> = (1..=acknowledged[s].len() as u64).collect();
        assert_eq!(seqs(&received), expected, "session {s}: every seq once, in order, no gap");
        for (seq, event) in &received {
            assert_eq!(acknowledged[s].get(seq), Some(&event.id), "session {s}: seq {seq} is the acknowledged event");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_writers_on_one_session_every_seq_exactly_once_in_order() {
    eight_writers(1, 60).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_writers_on_several_sessions_every_seq_exactly_once_in_order() {
    eight_writers(3, 40).await;
}

/// The feed's listening backend in this test's database: the one that last
/// ran the feed's functions, other than those already `killed`.
async fn feed_backend(sql: &Client, killed: &[i32]) -> i32 {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let pids: Vec<i32> = sql
            .query(
                r"SELECT pid FROM pg_stat_activity
                   WHERE datname = current_database() AND pid <> pg_backend_pid()
                     AND (query LIKE '%adk\_feed\_listen%' OR query LIKE '%adk\_read\_events\_after%')",
                &[],
            )
            .await
            .expect("pg_stat_activity")
            .iter()
            .map(|r| r.get(0))
            .collect();
        if let Some(pid) = pids.into_iter().find(|pid| !killed.contains(pid)) {
            return pid;
        }
        assert!(tokio::time::Instant::now() < deadline, "the feed never listened again");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_listener_connection_loses_nothing_and_repeats_nothing() {
    const ROUNDS: usize = 8;
    const PER_WRITER: usize = 8;
    let db = feed_database().await;
    let store = Arc::new(store(db.url()).await);
    let sql = client(db.url()).await;
    let key = new_session(store.as_ref(), "app", "u1").await;
    let mut feed = store.watch(&key, 0).await.expect("watch");
    let first_pid = feed.listener_pid().expect("listening");
    let total = ROUNDS * 8 * PER_WRITER;
    let reader = tokio::spawn(async move {
        let received = take(&mut feed, total).await;
        // Nothing after the last append: no repeat came late.
        assert!(nothing_ready(&mut feed).await, "an item past the last append");
        received
    });

    let mut acknowledged = HashMap::new();
    let mut killed = Vec::new();
    for round in 0..ROUNDS {
        // The feed listening again (it reconnects while its reader waits),
        // so that every round cuts a live connection.
        let pid = feed_backend(&sql, &killed).await;
        if round == 0 {
            assert_eq!(pid, first_pid, "the backend found is the feed's");
        }
        let writers: Vec<_> = (0..8)
            .map(|w| {
                let store = Arc::clone(&store);
                let key = key.clone();
                tokio::spawn(async move {
                    let mut acks = Vec::new();
                    for i in 0..PER_WRITER {
                        acks.push(append(&store, &key, &format!("round {round} writer {w} event {i}")).await);
                    }
                    acks
                })
            })
            .collect();
        // Mid-round: appends commit while the feed's connection is gone.
        assert!(terminate(&sql, pid).await, "round {round}: terminate the feed's backend {pid}");
        killed.push(pid);
        for writer in writers {
            acknowledged.extend(writer.await.expect("writer"));
        }
    }

    let received = reader.await.expect("reader");
    assert_eq!(seqs(&received), (1..=total as u64).collect::<Vec<_>>(), "every seq once, in order, no gap");
    for (seq, event) in &received {
        assert_eq!(acknowledged.get(seq), Some(&event.id), "seq {seq} is the acknowledged event");
    }
    assert_eq!(killed.len(), ROUNDS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnected_feed_catches_up_what_was_missed() {
    let db = feed_database().await;
    let store = Arc::new(store(db.url()).await);
    let sql = client(db.url()).await;
    let key = new_session(store.as_ref(), "app", "u1").await;
    let mut feed = store.watch(&key, 0).await.expect("watch");
    // Busy with other sessions: nothing about this one but what is missed.
    let busy = keep_app_busy(&store, &key).await;
    let pid = feed.listener_pid().expect("listening");
    assert!(terminate(&sql, pid).await);
    // Committed while nobody listens: no notice will ever say so, and none
    // about this session follows. Only the read after reconnecting finds it.
    let (seq, id) = append(&store, &key, "while away").await;
    let (got, event) = next(&mut feed, "the event sent while away").await.expect("caught up");
    assert_eq!((got, event.id), (seq, id));
    assert_ne!(feed.listener_pid(), Some(pid), "a new connection");
    busy.abort();
}

#[tokio::test]
async fn deleting_the_session_ends_the_feed_after_its_events() {
    let db = feed_database().await;
    let store = store(db.url()).await;
    let key = new_session(&store, "app", "u1").await;
    let mut feed = store.watch(&key, 0).await.expect("watch");
    append(&store, &key, "one").await;
    append(&store, &key, "two").await;
    assert_eq!(seqs(&take(&mut feed, 2).await), vec![1, 2]);
    store.delete(&key).await.expect("delete");
    assert!(matches!(next(&mut feed, "the end").await, Err(StoreError::NotFound(k)) if k == key));
    assert!(feed.next().await.is_none(), "nothing after the end");

    // A new session with the same key is another session, even when it got
    // as far as the feed had read: deleted and created again in one
    // transaction, so the feed's next read finds a session under its key.
    let key = new_session(&store, "app", "u1").await;
    append(&store, &key, "one").await;
    let mut feed = store.watch(&key, 0).await.expect("watch");
    assert_eq!(seqs(&take(&mut feed, 1).await), vec![1]);
    let sql = client(db.url()).await;
    sql.batch_execute(&format!(
        "BEGIN;
         DELETE FROM adk_sessions WHERE app_name = 'app' AND user_id = 'u1' AND session_id = '{id}';
         INSERT INTO adk_sessions (app_name, user_id, session_id, last_seq) VALUES ('app', 'u1', '{id}', 2);
         COMMIT",
        id = key.session_id
    ))
    .await
    .expect("replace the session");
    assert!(matches!(next(&mut feed, "the end").await, Err(StoreError::NotFound(k)) if k == key));
}

#[tokio::test]
async fn an_expired_session_ends_the_feed() {
    let db = feed_database().await;
    let store = Arc::new(store(db.url()).await);
    let request =
        CreateSession::new(AppName::new("app").unwrap(), UserId::new("u1").unwrap()).with_ttl(Duration::from_secs(3));
    let key = store.create(request).await.expect("create").key;
    append(&store, &key, "one").await;
    let mut feed = store.watch(&key, 0).await.expect("watch");
    assert_eq!(seqs(&take(&mut feed, 1).await), vec![1]);
    // No notice about this session, and a busy app (so no heartbeat): the
    // feed looks again when the session expires.
    let busy = keep_app_busy(&store, &key).await;
    assert!(matches!(next(&mut feed, "the end").await, Err(StoreError::NotFound(_))));
    busy.abort();
}

#[tokio::test]
async fn a_rollover_ends_the_feed_naming_the_successor() {
    let db = feed_database().await;
    let store = store(db.url()).await;
    let key = new_session(&store, "app", "u1").await;
    let mut feed = store.watch(&key, 0).await.expect("watch");
    append(&store, &key, "one").await;
    append(&store, &key, "two").await;
    let successor = store.rollover(&key, Some("next".into()), event("summary")).await.expect("rollover");
    assert_eq!(seqs(&take(&mut feed, 2).await), vec![1, 2], "the events before the rollover");
    match next(&mut feed, "the end").await {
        Err(StoreError::SessionClosed { key: closed, successor: Some(id) }) => {
            assert_eq!(closed, key);
            assert_eq!(id, successor.key.session_id);
        }
        other => panic!("{other:?}"),
    }
    // The successor is followed from its summary, event 1.
    let mut next_feed = store.watch(&successor.key, 0).await.expect("watch the successor");
    assert_eq!(seqs(&take(&mut next_feed, 1).await), vec![1]);
}

#[tokio::test]
async fn a_rewind_under_the_feed_ends_it_instead_of_skipping_reused_seqs() {
    let db = feed_database().await;
    let store = store(db.url()).await;

    // Rewound and nothing since.
    let key = new_session(&store, "app", "u1").await;
    let mut feed = store.watch(&key, 0).await.expect("watch");
    for i in 0..3 {
        append(&store, &key, &format!("event {i}")).await;
    }
    assert_eq!(seqs(&take(&mut feed, 3).await), vec![1, 2, 3]);
    store.rewind(&key, 1, None).await.expect("rewind");
    assert!(matches!(next(&mut feed, "the end").await, Err(StoreError::StaleSession { expected: 3, actual: 1, .. })));

    // Rewound and written past the feed's seq again in one transaction, so
    // the feed's next read finds more events than it read: seq 3 is now
    // another event, and the feed must say so instead of going on at 4.
    let key = new_session(&store, "app", "u2").await;
    let mut feed = store.watch(&key, 0).await.expect("watch");
    for i in 0..3 {
        append(&store, &key, &format!("event {i}")).await;
    }
    assert_eq!(seqs(&take(&mut feed, 3).await), vec![1, 2, 3]);
    let sql = client(db.url()).await;
    sql.batch_execute(&format!(
        "BEGIN;
         DELETE FROM adk_events WHERE app_name = 'app' AND user_id = 'u2' AND session_id = '{id}' AND seq > 1;
         INSERT INTO adk_events (app_name, user_id, session_id, session_day, seq, event_id, author, event_ts, payload)
         SELECT s.app_name, s.user_id, s.session_id, s.session_day, g, 'rewritten-' || g, 'agent', 0,
                json_build_object('id', 'rewritten-' || g, 'author', 'agent',
                                  'timestamp', '2026-01-01T00:00:00Z')::jsonb
           FROM adk_sessions s, generate_series(2, 5) g
          WHERE s.app_name = 'app' AND s.user_id = 'u2' AND s.session_id = '{id}';
         UPDATE adk_sessions SET last_seq = 5 WHERE app_name = 'app' AND user_id = 'u2' AND session_id = '{id}';
         COMMIT",
        id = key.session_id
    ))
    .await
    .expect("rewrite history");
    assert!(matches!(next(&mut feed, "the end").await, Err(StoreError::StaleSession { expected: 3, actual: 5, .. })));
}

#[tokio::test]
async fn watch_app_reports_sessions_and_events_of_its_app_only() {
    let db = feed_database().await;
    let store = store(db.url()).await;
    let app = AppName::new("app").unwrap();
    let mut notices = store.watch_app(&app).await.expect("watch_app");
    let elsewhere = new_session(&store, "other-app", "u1").await;
    append(&store, &elsewhere, "not this app").await;

    let key = new_session(&store, "app", "u1").await;
    let (_, first) = append(&store, &key, "one").await;
    append(&store, &key, "two").await;
    // A redaction is said once: the second call changes nothing, and says nothing.
    for _ in 0..2 {
        store.redact_event(&key, &first, "pasted a secret", Default::default()).await.expect("redact");
    }
    let successor = store.rollover(&key, None, event("summary")).await.expect("rollover").key;
    store.rewind(&successor, 0, None).await.expect("rewind");
    store.delete(&successor).await.expect("delete");

    let expected = vec![
        AppNotice::SessionCreated { key: key.clone() },
        AppNotice::EventAppended { key: key.clone(), seq: 1 },
        AppNotice::EventAppended { key: key.clone(), seq: 2 },
        AppNotice::EventRedacted { key: key.clone(), seq: 1 },
        // One transaction, in the order it wrote.
        AppNotice::SessionCreated { key: successor.clone() },
        AppNotice::EventAppended { key: successor.clone(), seq: 1 },
        AppNotice::SessionClosed { key: key.clone() },
        AppNotice::SessionRewound { key: successor.clone(), seq: 0 },
        AppNotice::SessionDeleted { key: successor.clone() },
    ];
    let mut got = Vec::new();
    for i in 0..expected.len() {
        got.push(next(&mut notices, &format!("notice {i}")).await.expect("notice"));
    }
    assert_eq!(got, expected);

    // A lost connection is said, not hidden.
    let sql = client(db.url()).await;
    assert!(terminate(&sql, notices.listener_pid().expect("listening")).await);
    assert_eq!(next(&mut notices, "the reconnect").await.expect("notice"), AppNotice::Reconnected);
    let later = new_session(&store, "app", "u2").await;
    assert_eq!(
        next(&mut notices, "after the reconnect").await.expect("notice"),
        AppNotice::SessionCreated { key: later }
    );
}

#[tokio::test]
async fn a_role_bound_to_another_app_can_neither_watch_nor_read() {
    let db = feed_database().await;
    let (alpha, beta) = two_tenants(db.url()).await;
    let (_role, beta_url) = pg::service_role(db.url(), "adk_watcher", AppBinding::Apps(vec!["beta".into()])).await;

    for scope in [TenantScope::PerRequest, TenantScope::Fixed(AppName::new("beta").unwrap()), TenantScope::Off] {
        let service = scoped_store(&beta_url, StoreConfig::default(), scope.clone()).await;
        match service.watch(&alpha, 0).await {
            Err(StoreError::PermissionDenied { message }) => {
                assert!(!message.contains("alpha-session"), "{scope:?}: {message}");
            }
            other => panic!("{scope:?}: watching another app's session: {other:?}"),
        }
        assert!(
            matches!(service.watch_app(&alpha.app_name).await, Err(StoreError::PermissionDenied { .. })),
            "{scope:?}: watching another app"
        );
    }

    // Its own app, as a control that the refusals above are about the app.
    let service = scoped_store(&beta_url, StoreConfig::default(), TenantScope::PerRequest).await;
    let mut feed = service.watch(&beta, 0).await.expect("watch its own app");
    let (_, event) = next(&mut feed, "beta's event").await.expect("beta's event");
    assert_eq!(event.author, "agent");

    // The read itself refuses too, whatever tenant is named.
    let mut conn = pg::diesel(&beta_url).await;
    for tenant in ["alpha", "beta"] {
        let rows: Vec<ReadRow> = diesel::sql_query(
            "SELECT seq, payload::text AS payload FROM adk_read_events_after($1, 'alpha', 'u1', 'alpha-session', 0, 10)",
        )
        .bind::<diesel::sql_types::Text, _>(tenant)
        .load(&mut conn)
        .await
        .expect("read as the service role");
        assert!(rows.is_empty(), "tenant {tenant}: {} rows of alpha", rows.len());
    }
    // The same read of its own app is answered: the header and one event.
    let rows: Vec<ReadRow> = diesel::sql_query(
        "SELECT seq, payload::text AS payload FROM adk_read_events_after('beta', 'beta', 'u1', 'beta-session', 0, 10)",
    )
    .load(&mut conn)
    .await
    .expect("read its own app");
    assert_eq!(rows.len(), 2);
    assert!(rows[1].payload.is_some());
}

#[derive(diesel::QueryableByName)]
struct ReadRow {
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::BigInt>)]
    #[allow(dead_code)]
    seq: Option<i64>,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    payload: Option<String>,
}

#[tokio::test]
async fn notices_carry_ids_and_never_content() {
    let db = feed_database().await;
    let store = store(db.url()).await;
    let sql = client(db.url()).await;
    let channel: String = sql.query_one("SELECT adk_feed_channel('app')", &[]).await.expect("channel").get(0);
    assert!(channel.len() <= 63, "{channel}");
    let long_app = "a".repeat(128);
    let long_channel: String =
        sql.query_one("SELECT adk_feed_channel($1)", &[&long_app]).await.expect("channel").get(0);
    assert!(long_channel.len() <= 63 && long_channel != channel, "{long_channel}");

    // A plain LISTEN, as any role may do: what does it see?
    let mut raw = pg::diesel(db.url()).await;
    diesel::sql_query(format!("LISTEN \"{channel}\"")).execute(&mut raw).await.expect("listen");

    const SECRET: &str = "the secret recipe";
    let key =
        store
            .create(CreateSession::new(AppName::new("app").unwrap(), UserId::new("u1").unwrap()).with_state(
                json!({"note": SECRET, "user:plan": SECRET, "app:motd": SECRET}).as_object().cloned().unwrap(),
            ))
            .await
            .expect("create")
            .key;
    let mut secret = event(SECRET);
    secret.actions.state_delta = json!({"note": SECRET, "user:plan": SECRET}).as_object().cloned().unwrap();
    store.append(&key, secret, AppendOptions::default()).await.expect("append");
    store.rollover(&key, Some("next".into()), event(SECRET)).await.expect("rollover");
    store.delete(&key).await.expect("delete");

    let mut payloads = Vec::new();
    {
        let mut notifications = std::pin::pin!(raw.notifications_stream());
        while payloads.len() < 6 {
            let notification = next(&mut notifications, "a notification").await.expect("notification");
            assert_eq!(notification.channel, channel);
            payloads.push(notification.payload);
        }
    }
    for payload in &payloads {
        assert!(!payload.contains(SECRET) && !payload.contains("secret"), "{payload}");
        let (kind, user, session, _seq): (String, String, String, i64) =
            serde_json::from_str(payload).unwrap_or_else(|e| panic!("{payload}: {e}"));
        assert!(["c", "e", "x", "d"].contains(&kind.as_str()), "{payload}");
        assert_eq!(user, "u1");
        assert!(session == key.session_id.as_str() || session == "next", "{payload}");
    }
    let kinds: Vec<String> =
        payloads.iter().map(|p| serde_json::from_str::<(String, String, String, i64)>(p).unwrap().0).collect();
    assert_eq!(kinds, ["c", "e", "c", "e", "x", "d"]);
}

#[tokio::test]
async fn every_partition_carries_the_trigger_and_the_feed_can_be_turned_off() {
    let db = feed_database().await;
    let store = store(db.url()).await;
    let sql = client(db.url()).await;
    let key = new_session(&store, "app", "u1").await;

    // A partition made after the migration gets the trigger too.
    sql.query_one("SELECT adk_ensure_event_partition(((now() AT TIME ZONE 'UTC')::date + 300))", &[])
        .await
        .expect("a partition far ahead");
    let unwatched: Vec<String> = sql
        .query(
            "SELECT i.inhrelid::regclass::text FROM pg_inherits i
              WHERE i.inhparent = 'adk_events'::regclass
                AND NOT EXISTS (SELECT FROM pg_trigger t WHERE t.tgrelid = i.inhrelid AND t.tgname = 'adk_feed_event')",
            &[],
        )
        .await
        .expect("partitions")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(unwatched.is_empty(), "partitions without the feed's trigger: {unwatched:?}");
    let partitions: i64 = sql
        .query_one("SELECT count(*) FROM pg_inherits WHERE inhparent = 'adk_events'::regclass", &[])
        .await
        .expect("count")
        .get(0);
    assert!(partitions >= 2, "{partitions}");

    // Off: no trigger left anywhere, and a watcher is told rather than left
    // waiting for notices that never come.
    let mut feed = store.watch(&key, 0).await.expect("watch while on");
    let changed: bool = sql.query_one("SELECT adk_set_change_feed(false)", &[]).await.expect("off").get(0);
    assert!(changed);
    let triggers: i64 = sql
        .query_one("SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'adk\\_feed\\_%'", &[])
        .await
        .expect("count")
        .get(0);
    assert_eq!(triggers, 0);
    match store.watch(&key, 0).await {
        Err(StoreError::Database { message }) => {
            assert!(message.contains("turned off") && message.contains("adk_set_change_feed"), "{message}")
        }
        other => panic!("watching with the feed off: {other:?}"),
    }
    // The running feed's next reconnect is refused the same way.
    assert!(terminate(&sql, feed.listener_pid().expect("listening")).await);
    assert!(matches!(next(&mut feed, "the refusal").await, Err(StoreError::Database { .. })));

    let changed: bool = sql.query_one("SELECT adk_set_change_feed(true)", &[]).await.expect("on").get(0);
    assert!(changed);
    let again: bool = sql.query_one("SELECT adk_set_change_feed(true)", &[]).await.expect("on again").get(0);
    assert!(!again, "turning it on twice changes nothing the second time");
    let mut feed = store.watch(&key, 0).await.expect("watch after turning it on");
    let (seq, _) = append(&store, &key, "back on").await;
    assert_eq!(next(&mut feed, "the event").await.expect("event").0, seq);
}
