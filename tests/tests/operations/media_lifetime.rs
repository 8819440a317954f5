//! Media through the unattended jobs: expiry and retention release the
//! blobs their events named, keep a blob another session still names, and
//! retiring a day stays a `DROP` for every event without media. The WAL of
//! retiring a day with media is measured against a day without.

use std::time::Duration;

use adk_postgres_domain::{AppName, AppendOptions, CreateSession, Event, SessionKey, SessionStore, UserId};
use adk_postgres_retention::{MaintenanceConfig, expire_sessions, run_maintenance};
use adk_postgres_testing::{Cluster, start_throwaway_cluster, test_database, test_database_on};
use adk_postgres_tests::conformance::{image_event, media_bytes};
use adk_postgres_tests::pg::{assert_counts_match_references, blobs, client, store, wal_lsn, wal_since};
use chrono::{Days, NaiveDate, Utc};
use tokio_postgres::Client;

/// (blob rows, the sum of their references).
fn refs((rows, _, refs): (i64, i64, i64)) -> (i64, i64) {
    (rows, refs)
}

async fn session(store: &dyn SessionStore, user: &str) -> SessionKey {
    let request = CreateSession::new(AppName::new("app").expect("app"), UserId::new(user).expect("user"));
    store.create(request).await.expect("create").key
}

#[tokio::test(flavor = "multi_thread")]
async fn expiry_releases_the_media_of_expired_sessions_and_keeps_what_others_name() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    let store = store(db.url()).await;
    let (shared, own) = (media_bytes(120_000, 1), media_bytes(120_000, 2));
    let old = session(&store, "old").await;
    for image in [&shared, &own] {
        store.append(&old, image_event(image), AppendOptions::default()).await.expect("append");
    }
    let new = session(&store, "new").await;
    store.append(&new, image_event(&shared), AppendOptions::default()).await.expect("append");
    assert_eq!(refs(blobs(&sql, None).await), (2, 3));
    sql.execute("UPDATE adk_sessions SET expires_at = now() - interval '1 minute' WHERE user_id = 'old'", &[])
        .await
        .expect("expire");

    let report = expire_sessions(db.url(), 10, None).await.expect("expiry");
    assert_eq!(report.sessions_deleted, 1);
    assert_eq!(refs(blobs(&sql, None).await), (1, 1), "the shared image stays, named once");
    assert_counts_match_references(&sql).await;
}

fn minus(day: NaiveDate, days: u64) -> NaiveDate {
    day.checked_sub_days(Days::new(days)).expect("day")
}

/// Sessions of `day` (made today, so they take appends, then aged), each
/// with `text_events` events of text and, when `media` is set, one event
/// with an image of its own and one with `shared`.
async fn seed_day(
    sql: &Client,
    store: &dyn SessionStore,
    day: NaiveDate,
    sessions: usize,
    text_events: usize,
    media: Option<&[u8]>,
) {
    sql.execute("SELECT adk_ensure_event_partition($1)", &[&day]).await.expect("partition");
    for s in 0..sessions {
        let id = format!("{day}-{s}");
        sql.execute(
            "INSERT INTO adk_sessions (app_name, user_id, session_id, session_day, last_seq, created_at, updated_at)
             VALUES ('app', 'user', $1, $2, 0, now(), now())",
            &[&id, &day],
        )
        .await
        .expect("session");
        let key = SessionKey::new(
            AppName::new("app").expect("app"),
            UserId::new("user").expect("user"),
            adk_postgres_domain::SessionId::new(id).expect("id"),
        );
        for n in 0..text_events {
            let mut event = Event::new("agent");
            event.content =
                Some(serde_json::json!({"role": "model", "parts": [{"text": format!("answer {n} ").repeat(40)}]}));
            store.append(&key, event, AppendOptions::default()).await.expect("text");
        }
        if let Some(shared) = media {
            let own = media_bytes(200_000, u64::try_from(s).expect("seed") + 3);
            store.append(&key, image_event(&own), AppendOptions::default()).await.expect("own image");
            store.append(&key, image_event(shared), AppendOptions::default()).await.expect("shared image");
        }
    }
    sql.execute(
        "UPDATE adk_sessions SET created_at = ($1::date + time '12:00') AT TIME ZONE 'UTC',
                updated_at = ($1::date + time '12:00') AT TIME ZONE 'UTC' WHERE session_day = $1",
        &[&day],
    )
    .await
    .expect("age the day");
}

#[tokio::test(flavor = "multi_thread")]
async fn retiring_a_day_releases_its_media_and_drops_the_rest() {
    // WAL is per cluster: a cluster of its own keeps other tests' writes out.
    let cluster: &'static Cluster = Box::leak(Box::new(start_throwaway_cluster().expect("a private cluster")));
    let db = test_database_on(cluster).await;
    let sql = client(db.url()).await;
    let store = store(db.url()).await;
    let today = Utc::now().date_naive();
    let (text_day, media_day) = (minus(today, 60), minus(today, 59));
    let shared = media_bytes(300_000, 0);
    seed_day(&sql, &store, text_day, 20, 40, None).await;
    seed_day(&sql, &store, media_day, 20, 40, Some(&shared)).await;
    // A session of today names the shared image too: it must outlive the day.
    let kept = session(&store, "today").await;
    store.append(&kept, image_event(&shared), AppendOptions::default()).await.expect("append");
    assert_eq!(refs(blobs(&sql, None).await), (21, 20 + 21));

    // The first measured run retires only the text day (retire before
    // today - 37), the second the media day; both premade their partitions
    // beforehand, so the runs only retire.
    let first_today = media_day.checked_add_days(Days::new(37)).expect("day");
    sql.batch_execute("UPDATE adk_store_policy SET retention = interval '1000 days'").await.expect("keep all");
    for run_today in [first_today, today] {
        run_maintenance(db.url(), run_today, &MaintenanceConfig::default()).await.expect("premake");
    }
    sql.batch_execute("UPDATE adk_store_policy SET retention = interval '30 days'").await.expect("default again");
    sql.batch_execute("VACUUM (FREEZE, ANALYZE) adk_events, adk_sessions, adk_blobs").await.expect("settle");
    // Throwaway clusters write no full-page images; a production server
    // does, and they are most of what a delete after a checkpoint logs.
    sql.batch_execute("ALTER SYSTEM SET full_page_writes = on").await.expect("full-page writes");
    sql.batch_execute("SELECT pg_reload_conf()").await.expect("reload");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let fpw: String = sql.query_one("SHOW full_page_writes", &[]).await.expect("show").get(0);
    assert_eq!(fpw, "on");
    sql.batch_execute("CHECKPOINT").await.expect("checkpoint");
    tokio::time::sleep(Duration::from_millis(100)).await;

    let start = wal_lsn(&sql).await;
    let text_run = run_maintenance(db.url(), first_today, &MaintenanceConfig::default()).await.expect("text day");
    let text_wal = wal_since(&sql, &start).await;
    assert_eq!(text_run.dropped, vec![format!("adk_events_p{}", text_day.format("%Y%m%d"))]);
    assert_eq!(text_run.media_events_released, 0);

    sql.batch_execute("CHECKPOINT").await.expect("checkpoint");
    let start = wal_lsn(&sql).await;
    let media_run = run_maintenance(db.url(), today, &MaintenanceConfig::default()).await.expect("media day");
    let media_wal = wal_since(&sql, &start).await;
    assert_eq!(media_run.dropped, vec![format!("adk_events_p{}", media_day.format("%Y%m%d"))]);
    assert_eq!(media_run.media_events_released, 40, "two events with media per session, deleted first");
    assert_eq!(
        refs(blobs(&sql, None).await),
        (1, 1),
        "the images of the day are gone; the shared one is named by today's session"
    );
    assert_counts_match_references(&sql).await;
    println!(
        "WAL of retiring a day: 800 text events {text_wal} bytes; 800 text events + 40 with media \
         (20 images of 200 kB released, one of 300 kB kept) {media_wal} bytes"
    );
}
