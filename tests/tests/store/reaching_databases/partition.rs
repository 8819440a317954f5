//! A network that goes silent. Eight writers append through adk-rust's
//! `SessionService` via a proxy that, mid-run, stops forwarding every open
//! connection without a FIN or a RST while new connections still pass; the
//! server enforces nothing it cannot reach, so only the store's own bound
//! (`PoolConfig::operation_timeout`) can end those calls. Then the proxy
//! refuses new connections for a while and the server drops the open ones.
//!
//! Pinned: no call outlasts the bound; every writer acknowledges again
//! within the bound plus one connect; calls during the refusal fail fast
//! and typed (retryable); and nothing acknowledged is lost, duplicated or
//! reordered, although calls cut off by the bound may have committed (each
//! is retried with the same event id, which the store replays).

use std::sync::Arc;
use std::time::{Duration, Instant};

use adk_postgres_adk::PgSessionService;
use adk_postgres_domain::{AppendOptions, Event, SessionStore, StoreConfig, StoreError};
use adk_postgres_storage::{PgSessionStore, PoolConfig};
use adk_postgres_testing::{TestDatabase, WireProxy, connect, test_database};

use super::writers::{Audit, Crowd, audit};

const WRITERS: usize = 8;
const APP: &str = "partition";
/// The store's bound in these tests; the default is 30 s, the behaviour
/// the same.
const BOUND: Duration = Duration::from_secs(3);
/// `connect_timeout` in the proxied URL.
const CONNECT: Duration = Duration::from_secs(2);
/// Scheduling slack on a loaded two-core machine.
const SLACK: Duration = Duration::from_millis(1500);

fn proxied_url(db: &TestDatabase, proxy: &WireProxy) -> String {
    let mut url = url::Url::parse(&proxy.url(db.url()).expect("test URL")).expect("test URL");
    url.query_pairs_mut().append_pair("connect_timeout", &CONNECT.as_secs().to_string());
    url.to_string()
}

fn pool_config() -> PoolConfig {
    PoolConfig { operation_timeout: BOUND, connection_timeout: CONNECT, ..PoolConfig::default() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_network_bounds_every_call_and_loses_nothing_acknowledged() {
    let db = test_database().await;
    let proxy = WireProxy::in_front_of(db.url()).and_then(|proxy| proxy.start()).expect("proxy");
    let store = PgSessionStore::connect(&proxied_url(&db, &proxy), &pool_config(), StoreConfig::default())
        .await
        .expect("the store through the proxy");
    let crowd = Crowd::start(Arc::new(PgSessionService::from_store(store)), APP, WRITERS);
    assert!(crowd.resumed(Instant::now(), Duration::from_secs(10)).await.is_some(), "writers started");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let partition = Instant::now();
    proxy.blackhole_open_connections();
    let resume = crowd.resumed(partition, BOUND + CONNECT + SLACK + Duration::from_secs(5)).await;
    let resume = resume.expect("every writer acknowledges again after the partition");

    // A refusal: no new connection passes, and the server ends the open
    // ones, so every call needs a connection it cannot get.
    proxy.refuse_new(true);
    let admin = connect(db.url()).await.expect("a direct client");
    let refusal = Instant::now();
    admin
        .batch_execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        .await
        .expect("end the store's sessions");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let healed = Instant::now();
    proxy.refuse_new(false);
    let recovery = crowd.resumed(healed, CONNECT + SLACK + Duration::from_secs(5)).await;
    let recovery = recovery.expect("every writer acknowledges again once connections pass");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let writers = crowd.stop().await;
    let fatal: Vec<_> = writers.iter().filter_map(|w| w.fatal.clone()).collect();
    assert!(fatal.is_empty(), "non-retryable errors: {fatal:?}");
    let calls: Vec<_> = writers.iter().flat_map(|w| w.calls.iter().copied()).collect();
    let max_stall = calls.iter().map(|(_, took, _)| *took).max().unwrap_or_default();
    let refused: Vec<_> = calls
        .iter()
        .filter(|(ended, _, failed)| *failed && *ended > refusal + Duration::from_millis(200) && *ended < healed)
        .collect();
    let slowest_refusal = refused.iter().map(|(_, took, _)| *took).max().unwrap_or_default();
    let acknowledged: usize = writers.iter().map(|w| w.acknowledged.len()).sum();
    let retries: usize = writers.iter().map(|w| w.retries).sum();

    let Audit { lost, duplicated } = audit(&admin, APP, &writers).await;
    eprintln!(
        "partition: {} calls, {acknowledged} acknowledged, {retries} retries; max stall {max_stall:.2?} \
         (bound {BOUND:?}); every writer resumed {resume:.2?} after the partition; {} calls refused during \
         the refusal, the slowest in {slowest_refusal:.2?}; resumed {recovery:.2?} after it; sessions with \
         a lost or reordered acknowledgement: {lost}; duplicated: {duplicated}",
        calls.len(),
        refused.len()
    );
    assert_eq!(lost, 0, "an acknowledged append is missing or out of order");
    assert_eq!(duplicated, 0, "an append is stored twice");
    assert!(max_stall <= BOUND + SLACK, "a call took {max_stall:?}, past the bound {BOUND:?}");
    assert!(resume <= BOUND + CONNECT + SLACK, "resumed only after {resume:?}");
    assert!(!refused.is_empty(), "calls were tried during the refusal");
    assert!(slowest_refusal <= CONNECT + SLACK, "a refused call took {slowest_refusal:?}");
}

/// A statement that reached the server and committed, whose answer never
/// came back: the caller gets `Unavailable` at the bound, the connection
/// is discarded, and the retry with the same event id is the stored event,
/// replayed, not a second copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_append_that_committed_is_replayed_by_its_retry() {
    let db = test_database().await;
    let proxy = WireProxy::in_front_of(db.url()).and_then(|proxy| proxy.start()).expect("proxy");
    let store = PgSessionStore::connect(
        &proxied_url(&db, &proxy),
        &PoolConfig { max_size: 1, ..pool_config() },
        StoreConfig::default(),
    )
    .await
    .expect("the store through the proxy");
    let key = store
        .create(adk_postgres_domain::CreateSession::new(
            adk_postgres_domain::AppName::new(APP).expect("app"),
            adk_postgres_domain::UserId::new("u").expect("user"),
        ))
        .await
        .expect("create")
        .key;
    store.append(&key, Event::new("agent"), AppendOptions::default()).await.expect("a first append");

    proxy.swallow_replies_on_open_connections();
    let event = Event::new("agent");
    let started = Instant::now();
    let cut_off = store.append(&key, event.clone(), AppendOptions::default()).await;
    let waited = started.elapsed();
    assert!(matches!(cut_off, Err(StoreError::Unavailable { .. })), "{cut_off:?}");
    assert!(waited >= BOUND && waited <= BOUND + SLACK, "cut off after {waited:?}");

    let admin = connect(db.url()).await.expect("a direct client");
    let stored: i64 = admin
        .query_one("SELECT count(*) FROM adk_events WHERE event_id = $1", &[&event.id])
        .await
        .expect("count")
        .get(0);
    assert_eq!(stored, 1, "the cut-off append committed");

    let retried = store.append(&key, event.clone(), AppendOptions::default()).await.expect("the retry");
    assert!(retried.replayed, "the retry returns the stored event");
    assert_eq!(retried.seq, Some(2));
    let stored: i64 = admin
        .query_one("SELECT count(*) FROM adk_events WHERE event_id = $1", &[&event.id])
        .await
        .expect("count")
        .get(0);
    assert_eq!(stored, 1, "no second copy");
    let session = store.get(&key, Default::default()).await.expect("get");
    assert_eq!(session.events.len(), 2);
}
