//! The docs' "beyond the peers" snippets, kept honest: each ```rust block
//! of `docs/features/` stands, line for line, in one of the functions below,
//! which run it against a real PostgreSQL. A docs edit that is not made
//! here too fails `every_snippet_of_the_feature_pages_is_run_here`.

#![allow(unused_variables)]

use std::time::Duration;

use adk_postgres_domain::{AppName, Event, SessionStore, StoreError, UserId};
use adk_postgres_storage::{AppNotice, EraseOptions, PgSessionStore};
use adk_postgres_testing::test_database;
use adk_postgres_tests::pg::{client, store};
use chrono::{TimeDelta, Utc};

/// The feature pages with snippets, and how many ```rust blocks each has:
/// a count that drops means a snippet left the page, or its fence broke.
const FEATURE_PAGES: [(&str, &str, usize); 4] = [
    ("docs/features/titles-and-labels.md", include_str!("../../docs/features/titles-and-labels.md"), 1),
    ("docs/features/forks.md", include_str!("../../docs/features/forks.md"), 1),
    ("docs/features/change-feed.md", include_str!("../../docs/features/change-feed.md"), 1),
    ("docs/features/erasing-a-user.md", include_str!("../../docs/features/erasing-a-user.md"), 1),
];
const THIS_FILE: &str = include_str!("readme_beyond.rs");

/// The ```rust blocks of a page, each as its lines without indentation.
fn snippets(page: &str) -> Vec<Vec<String>> {
    let mut blocks = Vec::new();
    let mut current: Option<Vec<String>> = None;
    for line in page.lines() {
        match (&mut current, line.trim()) {
            (None, "```rust") => current = Some(Vec::new()),
            (Some(_), "```") => blocks.extend(current.take()),
            (Some(block), text) => block.push(text.to_owned()),
            (None, _) => {}
        }
    }
    blocks
}

#[test]
fn every_snippet_of_the_feature_pages_is_run_here() {
    let here: Vec<&str> = THIS_FILE.lines().map(str::trim).collect();
    for (path, page, expected) in FEATURE_PAGES {
        let blocks = snippets(page);
        assert_eq!(blocks.len(), expected, "{path}'s rust blocks: {blocks:#?}");
        for block in blocks {
            let found = here.windows(block.len()).any(|window| window.iter().zip(&block).all(|(a, b)| a == b));
            assert!(found, "this snippet of {path} is not run by this file:\n{}", block.join("\n"));
        }
    }
}

fn names() -> (AppName, UserId) {
    let tag = &uuid::Uuid::new_v4().simple().to_string()[..8];
    (AppName::new(format!("readme-{tag}")).expect("app"), UserId::new("u-42").expect("user"))
}

#[tokio::test(flavor = "multi_thread")]
async fn titles_and_labels() -> anyhow::Result<()> {
    let db = test_database().await;
    let store = store(db.url()).await;
    let (app, user) = names();
    let week_start = Utc::now() - TimeDelta::days(7);
    let next_week_start = Utc::now() + TimeDelta::days(1);

    use adk_postgres_domain::{CreateSession, ListSessions, SessionMetadata};

    let metadata = SessionMetadata::new()
        .with_display_name("Trip to Lisbon")
        .with_label("team", "travel")
        .with_label("k8s.io/tier", "gold");
    let session = store.create(CreateSession::new(app.clone(), user.clone()).with_metadata(metadata)).await?;

    // Rename or relabel later: replaces both, wholesale (labels are not merged).
    store.set_metadata(&session.key, SessionMetadata::new().with_display_name("Lisbon, day 2")).await?;

    // The user's sessions carrying every given label, last updated this week.
    let mut request = ListSessions::new(app, user).with_label("team", "travel");
    request.updated_after = Some(week_start); // inclusive
    request.updated_before = Some(next_week_start); // exclusive
    let page = store.list(&request).await?; // keyset pages, as any listing

    assert!(page.sessions.is_empty(), "the relabel dropped the team label: {page:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn forking() -> anyhow::Result<()> {
    let db = test_database().await;
    let store = store(db.url()).await;
    let (app, user) = names();
    let key = adk_postgres_tests::pg::new_session(&store, app.as_str(), user.as_str()).await;
    for _ in 0..12 {
        store.append(&key, Event::new("agent"), Default::default()).await?;
    }

    // A new session of the same app and user from the first 12 events of `key`.
    let branch = store.fork(&key, 12, Some("what-if".into())).await?;

    assert_eq!(branch.version, 12);
    Ok(())
}

fn render(seq: u64, event: &Event) {
    assert!(seq > 0 && !event.id.is_empty());
}

async fn follow(store: &PgSessionStore, key: adk_postgres_domain::SessionKey, app: AppName) -> anyhow::Result<()> {
    let session = store.get(&key, Default::default()).await?;

    use futures_util::StreamExt;

    // Everything after the version the caller already has (0: from the start).
    let mut feed = store.watch(&key, session.version).await?;
    while let Some(item) = feed.next().await {
        match item {
            Ok((seq, event)) => render(seq, &event),
            // Rolled over: follow the successor from its first event.
            Err(StoreError::SessionClosed { successor: Some(next), .. }) => {
                /* watch(next, 0) */
                break;
            }
            // Deleted or expired; rewound under us (re-read the session);
            // no database for a minute (resume with watch(key, last seq seen)).
            Err(other) => return Err(other.into()),
        }
    }

    // An app's new sessions and events, as hints.
    let mut notices = store.watch_app(&app).await?;
    while let Some(notice) = notices.next().await {
        match notice? {
            AppNotice::SessionCreated { key } => { /* … */ }
            AppNotice::EventAppended { key, seq } => { /* … */ }
            AppNotice::Reconnected => { /* notices were lost: re-read what you follow */ }
            _ => {}
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn following_a_session_and_an_app() -> anyhow::Result<()> {
    let db = test_database().await;
    client(db.url()).await.batch_execute("SELECT adk_set_change_feed(true)").await?;
    let store = store(db.url()).await;
    let (app, user) = names();
    let key = adk_postgres_tests::pg::new_session(&store, app.as_str(), user.as_str()).await;
    store.append(&key, Event::new("agent"), Default::default()).await?;
    let writer = {
        let (store, key) = (store.clone(), key.clone());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            store.append(&key, Event::new("agent"), Default::default()).await.expect("append");
            store.rollover(&key, Some("next".into()), Event::new("agent")).await.expect("rollover");
        })
    };
    // The app's notices never end on their own: the snippet's second loop
    // runs until this test stops listening.
    let followed = tokio::time::timeout(Duration::from_secs(3), follow(&store, key, app)).await;
    writer.await?;
    assert!(followed.is_err(), "the session's feed ended at the rollover, the app's ran on: {followed:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn erasing_a_user() -> anyhow::Result<()> {
    let db = test_database().await;
    let store = store(db.url()).await;
    let (app, user) = names();
    let key = adk_postgres_tests::pg::new_session(&store, app.as_str(), user.as_str()).await;
    store.append(&key, Event::new("agent"), Default::default()).await?;

    let erased = store.erase_user(&app, &user).await?; // Erasure { sessions, events, user_state }
    // With progress and options (PgSessionStore only):
    let report = store
        .erase_user_with(&app, &user, EraseOptions { batch_size: 1_000, dry_run: false }, |p| eprintln!("{p}"))
        .await?;

    assert_eq!((erased.sessions, erased.events), (1, 1));
    assert_eq!(report.erasure().sessions, 0, "a second erasure finds nothing");
    Ok(())
}

