//! What only PostgreSQL can show about media moved out of the log: the
//! bytes at rest, deduplication within an app, the reference counts kept by
//! every way an event leaves (delete, rewind, erasure, a fork's copies),
//! under concurrent writers, the change feed reading media back, and the
//! tenancy of the blobs.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use adk_postgres_domain::{AppName, AppendOptions, Event, GetOptions, SessionKey, SessionStore, StoreError, UserId};
use adk_postgres_storage::TenantScope;
use adk_postgres_storage::tenancy::AppBinding;
use adk_postgres_testing::test_database;
use adk_postgres_tests::conformance::{image_event, media_bytes};
use adk_postgres_tests::pg::{
    assert_counts_match_references, blobs, client, new_session, scoped_store, service_role, store,
};
use futures_util::StreamExt as _;
use tokio::task::JoinSet;

/// An event as JSON, compared value for value: jsonb keeps no key order.
fn as_json(event: &Event) -> serde_json::Value {
    serde_json::to_value(event).expect("serialize")
}

#[tokio::test(flavor = "multi_thread")]
async fn an_image_is_stored_once_per_app_as_its_raw_bytes() {
    let db = test_database().await;
    let store = store(db.url()).await;
    let sql = client(db.url()).await;
    let image = media_bytes(3_000_000, 1);
    let inline = serde_json::to_vec(&image_event(&image)).expect("json").len();
    let mut keys = Vec::new();
    for user in 0..10 {
        let key = new_session(&store, "vision", &format!("u{user}")).await;
        store.append(&key, image_event(&image), AppendOptions::default()).await.expect("a 3 MB image is stored");
        keys.push(key);
    }
    let other_app = new_session(&store, "other", "u0").await;
    store.append(&other_app, image_event(&image), AppendOptions::default()).await.expect("append");

    assert_eq!(blobs(&sql, Some("vision")).await, (1, 3_000_000, 10), "one copy for the app, named ten times");
    assert_eq!(blobs(&sql, Some("other")).await, (1, 3_000_000, 1), "another app keeps its own copy");
    let row = sql
        .query_one(
            "SELECT pg_column_size(data)::bigint, pg_total_relation_size('adk_blobs')::bigint,
                    (SELECT max(pg_column_size(payload))::bigint FROM adk_events)
               FROM adk_blobs WHERE app_name = 'vision'",
            &[],
        )
        .await
        .expect("sizes");
    let (stored, table, largest_event): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
    println!("inline JSON {inline} bytes; blob {stored} bytes; adk_blobs {table} bytes; largest event {largest_event}");
    assert!((3_000_000..3_000_100).contains(&stored), "raw and uncompressed: {stored}");
    assert!(table < 7_000_000, "two copies in all, no JSON form: {table}");
    assert!(largest_event < 2_000, "the events keep references only: {largest_event}");
    assert!(inline > 10_000_000, "adk's number-array form would have been {inline} bytes");
    for key in &keys {
        let read = store.get(key, GetOptions::default()).await.expect("get");
        assert_eq!(
            read.events[0].content.as_ref().expect("content")["parts"][1]["data"].as_array().map(Vec::len),
            Some(3_000_000)
        );
    }
    assert_counts_match_references(&sql).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn delete_rewind_erase_and_fork_count_references_and_leave_no_orphan() {
    let db = test_database().await;
    let store = store(db.url()).await;
    let sql = client(db.url()).await;
    let (shared, own, other_own) = (media_bytes(100_000, 1), media_bytes(100_000, 2), media_bytes(100_000, 3));

    let a = new_session(&store, "app", "alice").await;
    for image in [&shared, &own, &shared] {
        store.append(&a, image_event(image), AppendOptions::default()).await.expect("append");
    }
    let b = new_session(&store, "app", "bob").await;
    for image in [&shared, &other_own] {
        store.append(&b, image_event(image), AppendOptions::default()).await.expect("append");
    }
    assert_eq!(blobs(&sql, Some("app")).await, (3, 300_000, 5), "an event names a blob once; two events, twice");

    store.fork(&a, 2, Some("alice-fork".into())).await.expect("fork");
    assert_eq!(blobs(&sql, Some("app")).await.2, 7, "the fork's two copies are two more references");
    store.rewind(&a, 1, None).await.expect("rewind");
    assert_eq!(blobs(&sql, Some("app")).await, (3, 300_000, 5));
    store.delete(&a).await.expect("delete");
    assert_eq!(blobs(&sql, Some("app")).await, (3, 300_000, 4), "the fork still names alice's own image");
    assert_counts_match_references(&sql).await;

    let erased = store.erase_user(&AppName::new("app").unwrap(), &UserId::new("alice").unwrap()).await.expect("erase");
    assert_eq!(erased.sessions, 1);
    assert_eq!(
        blobs(&sql, Some("app")).await,
        (2, 200_000, 2),
        "alice's own image left with her; the shared one is bob's too"
    );
    let bob = store.get(&b, GetOptions::default()).await.expect("bob's session");
    assert_eq!(bob.events[0].content.as_ref().unwrap()["parts"][1]["data"], serde_json::json!(shared));

    store.delete(&b).await.expect("delete bob's session");
    assert_eq!(blobs(&sql, Some("app")).await, (0, 0, 0), "nothing is left once no event names it");
}

/// Runs `call` until it succeeds, as long as it fails with retryable
/// errors; returns how many tries failed.
async fn retrying<T, F, Fut>(mut call: F) -> usize
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    for failed in 0..50 {
        match call().await {
            Ok(_) => return failed,
            Err(e) if e.is_retryable() => tokio::time::sleep(Duration::from_millis(20)).await,
            Err(e) => panic!("{e:?}"),
        }
    }
    panic!("50 retryable failures in a row");
}

#[tokio::test(flavor = "multi_thread")]
async fn sixty_writers_sharing_images_with_deletes_racing_keep_exact_counts() {
    let db = test_database().await;
    let store = Arc::new(store(db.url()).await);
    let sql = client(db.url()).await;
    let images: Arc<Vec<Vec<u8>>> = Arc::new((0..3).map(|i| media_bytes(70_000, i)).collect());
    let mut writers = JoinSet::new();
    for w in 0..60u8 {
        let (store, images) = (Arc::clone(&store), Arc::clone(&images));
        writers.spawn(async move {
            let key = new_session(store.as_ref(), "crowd", &format!("u{w}")).await;
            for round in 0..4usize {
                let mut event = image_event(&images[(usize::from(w) + round) % 3]);
                // Two images in one event, in either order.
                let parts = event.content.as_mut().and_then(|c| c["parts"].as_array_mut()).expect("parts");
                parts.push(
                    serde_json::json!({"mime_type": "image/png", "data": images[(usize::from(w) + round + 1) % 3]}),
                );
                // Appends sharing an image wait for each other's commit on
                // its row: under this crowd a wait can pass the lock
                // timeout, a retryable error a service retries.
                retrying(|| store.append(&key, event.clone(), AppendOptions::default())).await;
            }
            if w % 2 == 0 {
                retrying(|| store.delete(&key)).await;
            } else {
                retrying(|| store.rewind(&key, 2, None)).await;
            }
        });
    }
    while let Some(done) = writers.join_next().await {
        done.expect("writer");
    }
    // 30 sessions kept two events, each naming two images.
    assert_eq!(blobs(&sql, Some("crowd")).await.2, 30 * 2 * 2);
    assert_counts_match_references(&sql).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_change_feed_reads_media_back_in_place() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    sql.batch_execute("SELECT adk_set_change_feed(true)").await.expect("feed on");
    let store = store(db.url()).await;
    let key = new_session(&store, "app", "u").await;
    let event = image_event(&media_bytes(200_000, 9));
    let mut feed = store.watch(&key, 0).await.expect("watch");
    store.append(&key, event.clone(), AppendOptions::default()).await.expect("append");
    let (seq, read) = tokio::time::timeout(Duration::from_secs(60), feed.next())
        .await
        .expect("in time")
        .expect("an item")
        .expect("an event");
    assert_eq!(seq, 1);
    assert_eq!(as_json(&read), as_json(&event));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_blob_is_read_only_through_a_session_naming_it_and_only_for_bound_apps() {
    let db = test_database().await;
    let owner = store(db.url()).await;
    let image = media_bytes(100_000, 4);
    let with_image = new_session(&owner, "alpha", "u1").await;
    owner.append(&with_image, image_event(&image), AppendOptions::default()).await.expect("append");
    let without = new_session(&owner, "alpha", "u2").await;
    let beta = new_session(&owner, "beta", "u1").await;
    let hash = adk_postgres_domain::Blob::new(image.clone()).sha256.to_vec();

    let (_, alpha_url) = service_role(db.url(), "media", AppBinding::Apps(vec!["alpha".to_owned()])).await;
    let sql = client(&alpha_url).await;
    let read = |key: &SessionKey| {
        let (app, user, session) = (key.app_name.to_string(), key.user_id.to_string(), key.session_id.to_string());
        let (sql, hash) = (&sql, hash.clone());
        async move {
            sql.query(
                "SELECT count(*) FROM adk_get_blobs($1, $2, $3, $4, ARRAY[$5::bytea])",
                &[&app, &app, &user, &session, &hash],
            )
            .await
            .map(|rows| rows[0].get::<_, i64>(0))
        }
    };
    assert_eq!(read(&with_image).await.expect("read"), 1, "the session naming it reads it");
    assert_eq!(read(&without).await.expect("read"), 0, "a hash alone reads nothing, even in the same app");
    assert_eq!(read(&beta).await.expect("read"), 0, "another app's session reads nothing");
    let direct = sql.query("SELECT data FROM adk_blobs", &[]).await;
    assert!(direct.is_err(), "a service role holds no privilege on the table");

    let scoped = scoped_store(&alpha_url, Default::default(), TenantScope::PerRequest).await;
    let session = scoped.get(&with_image, GetOptions::default()).await.expect("the bound role reads its media");
    assert_eq!(session.events[0].content.as_ref().expect("content")["parts"][1]["data"], serde_json::json!(image));
}

#[tokio::test(flavor = "multi_thread")]
async fn redacting_an_image_removes_it_unless_another_event_names_it() {
    let db = test_database().await;
    let store = store(db.url()).await;
    let sql = client(db.url()).await;
    let (pasted, shared) = (media_bytes(150_000, 11), media_bytes(150_000, 12));
    let key = new_session(&store, "app", "u").await;
    let private = store.append(&key, image_event(&pasted), AppendOptions::default()).await.expect("append").event;
    let first = store.append(&key, image_event(&shared), AppendOptions::default()).await.expect("append").event;
    store.append(&key, image_event(&shared), AppendOptions::default()).await.expect("append");
    assert_eq!(blobs(&sql, Some("app")).await, (2, 300_000, 3));

    store.redact_event(&key, &private.id, "a passport scan", Default::default()).await.expect("redact");
    assert_eq!(blobs(&sql, Some("app")).await, (1, 150_000, 2), "the redacted image is gone from the store");
    store.redact_event(&key, &first.id, "duplicate", Default::default()).await.expect("redact");
    assert_eq!(blobs(&sql, Some("app")).await, (1, 150_000, 1), "the other event still names the shared image");
    assert_counts_match_references(&sql).await;
    let read = store.get(&key, GetOptions::default()).await.expect("get");
    assert_eq!(read.events[2].content.as_ref().expect("content")["parts"][1]["data"], serde_json::json!(shared));
    assert!(read.events[0].content.as_ref().expect("tombstone")["parts"].to_string().contains("[redacted]"));
}
