//! `list_app_sessions`: an app's sessions across its users, newest created
//! first, with the user listing's filters, in keyset pages.

use std::time::Duration;

use adk_postgres_domain::{
    AppPageToken, AppSessionPage, CreateSession, Event, ListAppSessions, PageToken, SessionMetadata, SessionStore,
    SessionSummary, StoreConfig, UserId,
};
use chrono::{DateTime, Utc};
use serde_json::json;

use super::*;

async fn app_page(store: &dyn SessionStore, request: &ListAppSessions) -> AppSessionPage {
    store.list_app_sessions(request).await.unwrap_or_else(|e| panic!("list_app_sessions {}: {e}", request.app_name))
}

/// Every session the request selects, following page tokens.
async fn app_all(store: &dyn SessionStore, request: &ListAppSessions) -> Vec<SessionSummary> {
    let mut request = request.clone();
    let mut all = Vec::new();
    loop {
        let page = app_page(store, &request).await;
        all.extend(page.sessions);
        match page.next_page_token {
            Some(next) => request.page_token = Some(next),
            None => return all,
        }
    }
}

/// `user/session` of each summary: the listing names the user.
fn user_sessions(sessions: &[SessionSummary]) -> Vec<String> {
    sessions.iter().map(|s| format!("{}/{}", s.key.user_id, s.key.session_id)).collect()
}

/// Creates `ids` (`user/session`) one after another, far enough apart that
/// their creation times differ.
async fn create_across_users(store: &dyn SessionStore, app: &AppName, ids: &[&str]) -> Vec<SessionKey> {
    let mut keys = Vec::new();
    for id in ids {
        let (user, session) = id.split_once('/').expect("user/session");
        let user = UserId::new(user).expect("user");
        keys.push(create(store, app, &user, session, json!({})).await.key);
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    keys
}

pub async fn list_app_sessions_spans_users_newest_created_first<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, _) = names("applist");
    let keys = create_across_users(&*store, &app, &["ann/a1", "bob/b1", "ann/a2", "cid/c1"]).await;
    // Another app's sessions, and one of ann's in it, are not listed.
    create(&*store, &other_app(&app), &UserId::new("ann").expect("user"), "elsewhere", json!({})).await;
    append(&*store, &keys[0], ev(json!({"topic": "x", "user:tier": "gold", "app:motd": "hi"}))).await;

    let listed = app_all(&*store, &ListAppSessions::new(app.clone())).await;
    assert_eq!(
        user_sessions(&listed),
        ["cid/c1", "ann/a2", "bob/b1", "ann/a1"],
        "newest created first; an append does not move a session"
    );
    for pair in listed.windows(2) {
        assert!(pair[0].created_at >= pair[1].created_at);
    }
    for summary in &listed {
        let full = get(&*store, &summary.key).await;
        let from_get = SessionSummary {
            key: full.key,
            state: full.state,
            version: full.version,
            last_update_time: full.last_update_time,
            created_at: full.created_at,
            expires_at: full.expires_at,
            metadata: full.metadata,
        };
        assert_eq!(summary, &from_get, "a summary agrees with get, its own user's state merged");
    }
    assert_eq!(listed[3].state, obj(json!({"topic": "x", "user:tier": "gold", "app:motd": "hi"})));
    assert_eq!(listed[2].state, obj(json!({"app:motd": "hi"})), "bob has no user state; the app's is shared");
    assert_eq!(listed[1].state, obj(json!({"user:tier": "gold", "app:motd": "hi"})));

    let empty = app_page(&*store, &ListAppSessions::new(other_app(&other_app(&app)))).await;
    assert!(empty.sessions.is_empty() && empty.next_page_token.is_none());
}

pub async fn list_app_sessions_pages_by_keyset_without_gaps_or_duplicates<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, _) = names("apppages");
    let ids = ["u1/s1", "u2/s2", "u1/s3", "u3/s4", "u2/s5", "u1/s6", "u3/s7"];
    create_across_users(&*store, &app, &ids).await;
    let mut request = ListAppSessions::new(app.clone());
    let full = app_page(&*store, &request).await;
    assert_eq!(full.next_page_token, None);
    assert_eq!(user_sessions(&full.sessions), ["u3/s7", "u1/s6", "u2/s5", "u3/s4", "u1/s3", "u2/s2", "u1/s1"]);

    request.page_size = Some(3);
    let mut seen = Vec::new();
    let mut sizes = Vec::new();
    loop {
        let page = app_page(&*store, &request).await;
        sizes.push(page.sessions.len());
        seen.extend(page.sessions);
        match page.next_page_token {
            Some(next) => {
                // Opaque text a client sends back as it got it.
                request.page_token = Some(AppPageToken::parse(next.as_str()).expect("a token we issued"));
                // Sessions created after the first page never enter a later one.
                create(&*store, &app, &UserId::new("u0").expect("user"), &format!("late{}", sizes.len()), json!({}))
                    .await;
            }
            None => break,
        }
    }
    assert_eq!(sizes, [3, 3, 1]);
    assert_eq!(seen, full.sessions, "pages concatenate to the whole listing: no gap, no duplicate");

    request.page_size = Some(10_000);
    request.page_token = None;
    assert_eq!(app_page(&*store, &request).await.sessions.len(), 9, "clamped to the cap, not refused: 7 and 2 late");
    request.page_size = Some(0);
    assert_eq!(app_page(&*store, &request).await.sessions.len(), 1, "clamped to one");
}

pub async fn list_app_sessions_filters_by_labels_and_update_window<F: StoreFactory>(f: &F) {
    let ttl = Duration::from_millis(400);
    let store = f.store(StoreConfig::default()).await;
    let (app, _) = names("appfilter");
    let labelled = |user: &str, id: &str, team: &str| {
        CreateSession::new(app.clone(), UserId::new(user).expect("user"))
            .with_id(id)
            .with_metadata(SessionMetadata::new().with_label("team", team).with_label("tier", "gold"))
    };
    let mut keys = Vec::new();
    for request in [labelled("u1", "a", "red"), labelled("u2", "b", "blue"), labelled("u3", "c", "red")] {
        keys.push(store.create(request).await.expect("create").key);
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    create(&*store, &app, &UserId::new("u4").expect("user"), "plain", json!({})).await;
    let expiring = labelled("u5", "gone", "red").with_ttl(ttl);
    store.create(expiring).await.expect("create expiring");

    let red = ListAppSessions::new(app.clone()).with_label("team", "red");
    tokio::time::sleep(ttl + Duration::from_millis(300)).await;
    assert_eq!(user_sessions(&app_all(&*store, &red).await), ["u3/c", "u1/a"], "expired sessions are not listed");
    let both = red.clone().with_label("tier", "gold");
    assert_eq!(user_sessions(&app_all(&*store, &both).await), ["u3/c", "u1/a"], "every label must match");
    let none = red.clone().with_label("tier", "silver");
    assert!(app_all(&*store, &none).await.is_empty());

    // An append moves a session into the window of now, not in the order.
    let before_append: DateTime<Utc> = Utc::now();
    tokio::time::sleep(Duration::from_millis(3)).await;
    append(&*store, &keys[0], Event::new("agent")).await;
    let mut recent = ListAppSessions::new(app.clone());
    recent.updated_after = Some(before_append);
    assert_eq!(user_sessions(&app_all(&*store, &recent).await), ["u1/a"]);
    let mut older = ListAppSessions::new(app.clone());
    older.updated_before = Some(before_append);
    assert_eq!(user_sessions(&app_all(&*store, &older).await), ["u4/plain", "u3/c", "u2/b"]);
}

pub async fn list_app_sessions_refuses_bad_tokens_and_filters<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("appbad");
    create(&*store, &app, &user, "s", json!({})).await;
    for garbage in ["", "!!", "bm9wZQ", "YTE6MTo5OTp1OnM"] {
        expect_invalid(AppPageToken::parse(garbage), |f| f == "page_token", "garbage token");
    }
    let user_listing = PageToken::after(1_700_000_000_000_000, &SessionId::new("s").expect("id"));
    expect_invalid(AppPageToken::parse(user_listing.as_str()), |f| f == "page_token", "a user listing's token");

    let mut request = ListAppSessions::new(app.clone());
    request.page_token = Some(AppPageToken::after(i64::MAX, &user, &SessionId::new("s").expect("id")));
    expect_invalid(store.list_app_sessions(&request).await, |f| f == "page_token", "out-of-range token");

    let mut request = ListAppSessions::new(app.clone());
    let now = Utc::now();
    request.updated_after = Some(now);
    request.updated_before = Some(now);
    expect_invalid(store.list_app_sessions(&request).await, |f| f == "updated_before", "empty window");
    let bad_label = ListAppSessions::new(app.clone()).with_label("", "x");
    expect_invalid(store.list_app_sessions(&bad_label).await, |f| f.starts_with("labels"), "bad label");
    assert_healthy(&*store, &app).await;
}
