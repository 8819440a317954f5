//! A crowd of writers on the default pool: every caller gets its turn at a
//! connection in arrival order, so nobody starves past the checkout timeout
//! and not one append fails, although the writers outnumber the pool's
//! connections twenty to one.

use std::sync::Arc;

use adk_postgres_domain::{AppendOptions, Event, GetOptions, SessionStore};
use adk_postgres_testing::test_database;
use adk_postgres_tests::pg::{client, new_session, store};
use serde_json::json;
use tokio::task::JoinSet;

const WRITERS: usize = 320;
const APPENDS_PER_WRITER: u64 = 25;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_hundred_writers_on_the_default_pool_see_no_error() {
    let db = test_database().await;
    let store = Arc::new(store(db.url()).await);
    let mut writers = JoinSet::new();
    for w in 0..WRITERS {
        let store = Arc::clone(&store);
        writers.spawn(async move {
            let key = new_session(store.as_ref(), "crowd", &format!("writer-{w}")).await;
            let mut errors = Vec::new();
            for n in 1..=APPENDS_PER_WRITER {
                let mut event = Event::new("agent");
                event.actions.state_delta.insert("n".into(), json!(n));
                // Any error at all counts: the point is that a crowd needs no retries.
                if let Err(e) = store.append(&key, event, AppendOptions::default()).await {
                    errors.push(e.to_string());
                }
            }
            (key, errors)
        });
    }
    let mut keys = Vec::new();
    let mut errors = Vec::new();
    while let Some(writer) = writers.join_next().await {
        let (key, mut failed) = writer.expect("writer");
        keys.push(key);
        errors.append(&mut failed);
    }
    assert!(errors.is_empty(), "{} appends failed, e.g. {:?}", errors.len(), &errors[..errors.len().min(3)]);

    for key in &keys {
        let session = store.get(key, GetOptions::default()).await.expect("get");
        assert_eq!(session.version, APPENDS_PER_WRITER, "{key}");
        assert_eq!(session.state.get("n"), Some(&json!(APPENDS_PER_WRITER)), "{key}");
    }
    let sql = client(db.url()).await;
    let stored: i64 = sql.query_one("SELECT count(*) FROM adk_events", &[]).await.expect("count").get(0);
    assert_eq!(stored as u64, WRITERS as u64 * APPENDS_PER_WRITER, "every acknowledged append is stored");
}
