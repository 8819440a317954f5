//! `list`: metadata newest first, keyset paging and its tokens, and whose
//! sessions are listed.

use std::collections::HashSet;
use std::time::Duration;

use adk_postgres_domain::session::{DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE};
use adk_postgres_domain::{
    AppName, Event, GetOptions, ListSessions, PageToken, SessionId, SessionKey, SessionSummary, StoreConfig,
    StoreError, UserId,
};
use chrono::{DateTime, Utc};
use serde_json::json;

use super::*;

pub async fn list_is_metadata_newest_first<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("listorder");
    let keys = create_in_order(&*store, &app, &user, &["s1", "s2", "s3"]).await;
    let page = list_page(&*store, &app, &user, None, None).await;
    assert_eq!(session_ids(&page.sessions), ["s3", "s2", "s1"]);
    assert_eq!(page.next_page_token, None);

    append(&*store, &keys[0], ev(json!({"touched": true, "user:u": 1}))).await;
    tokio::time::sleep(Duration::from_millis(3)).await;
    let listed = list_all(&*store, &app, &user).await;
    assert_eq!(session_ids(&listed), ["s1", "s3", "s2"], "an append moves a session to the top");

    for _ in 0..30 {
        append(&*store, &keys[1], Event::new("agent")).await;
    }
    let listed = list_all(&*store, &app, &user).await;
    assert_eq!(session_ids(&listed), ["s2", "s1", "s3"]);
    assert_newest_first(&listed);
    let versions: Vec<u64> = listed.iter().map(|s| s.version).collect();
    assert_eq!(versions, [30, 1, 0], "summaries carry the version, whatever the number of events");
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
        assert_eq!(summary, &from_get, "a summary agrees with get");
    }
    assert_eq!(listed[1].state, obj(json!({"touched": true, "user:u": 1})));
    assert_eq!(listed[2].state, obj(json!({"user:u": 1})), "summaries merge the user state");
}

pub async fn list_pages_by_keyset_without_gaps_or_duplicates<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("pages");
    let ids = ["p1", "p2", "p3", "p4", "p5", "p6", "p7"];
    create_in_order(&*store, &app, &user, &ids).await;
    let full = list_page(&*store, &app, &user, Some(50), None).await;
    assert_eq!(full.next_page_token, None);
    assert_eq!(session_ids(&full.sessions), ["p7", "p6", "p5", "p4", "p3", "p2", "p1"]);

    let mut seen = Vec::new();
    let mut sizes = Vec::new();
    let mut token = None;
    loop {
        let page = list_page(&*store, &app, &user, Some(3), token).await;
        sizes.push(page.sessions.len());
        seen.extend(page.sessions);
        match page.next_page_token {
            Some(next) => {
                assert!(sizes.len() < 3, "the last page has no token");
                token = Some(next);
            }
            None => break,
        }
    }
    assert_eq!(sizes, [3, 3, 1]);
    assert_eq!(seen, full.sessions, "pages concatenate to the whole listing: no gap, no duplicate");

    let exact = list_page(&*store, &app, &user, Some(7), None).await;
    assert_eq!((exact.sessions.len(), exact.next_page_token), (7, None), "an exact fit has no next page");
    let six = list_page(&*store, &app, &user, Some(6), None).await;
    let token = six.next_page_token.expect("one more session follows");
    let rest = list_page(&*store, &app, &user, Some(6), Some(token)).await;
    assert_eq!(session_ids(&rest.sessions), ["p1"]);
    assert_eq!(rest.next_page_token, None);
    // A token is an opaque string a client may send back.
    let first = list_page(&*store, &app, &user, Some(2), None).await;
    let text = first.next_page_token.expect("token").to_string();
    let again =
        list_page(&*store, &app, &user, Some(2), Some(PageToken::parse(&text).expect("own token parses"))).await;
    assert_eq!(session_ids(&again.sessions), ["p5", "p4"]);
}

pub async fn list_pages_are_stable_while_sessions_move<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("keyset");
    let keys = create_in_order(&*store, &app, &user, &["k1", "k2", "k3", "k4", "k5", "k6", "k7"]).await;
    let first = list_page(&*store, &app, &user, Some(3), None).await;
    assert_eq!(session_ids(&first.sessions), ["k7", "k6", "k5"]);
    // The oldest session moves to the top between two page reads: a keyset
    // cursor skips it (it is ahead of the cursor) instead of shifting the
    // rest of the listing and repeating k5, as OFFSET paging would.
    append(&*store, &keys[0], Event::new("agent")).await;
    let second = list_page(&*store, &app, &user, Some(3), first.next_page_token).await;
    assert_eq!(session_ids(&second.sessions), ["k4", "k3", "k2"]);
    assert_eq!(second.next_page_token, None, "k1 moved ahead of the cursor");
    assert_eq!(session_ids(&list_page(&*store, &app, &user, Some(1), None).await.sessions), ["k1"]);
}

pub async fn list_page_size_is_clamped<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("clamp");
    let created: HashSet<SessionKey> = create_many(&store, &app, &user, MAX_PAGE_SIZE + 5).await.into_iter().collect();
    assert_eq!(created.len(), MAX_PAGE_SIZE + 5);

    let big = list_page(&*store, &app, &user, Some(10_000), None).await;
    assert_eq!(big.sessions.len(), MAX_PAGE_SIZE, "at most 200 a page");
    assert_newest_first(&big.sessions);
    let rest = list_page(&*store, &app, &user, Some(10_000), Some(big.next_page_token.expect("more follow"))).await;
    assert_eq!((rest.sessions.len(), rest.next_page_token), (5, None));
    let listed: HashSet<SessionKey> = big.sessions.iter().chain(&rest.sessions).map(|s| s.key.clone()).collect();
    assert_eq!(listed, created, "both pages hold every session once");

    let default = list_page(&*store, &app, &user, None, None).await;
    assert_eq!(default.sessions.len(), DEFAULT_PAGE_SIZE);
    assert!(default.next_page_token.is_some());
    let zero = list_page(&*store, &app, &user, Some(0), None).await;
    assert_eq!(zero.sessions.len(), 1, "a page size of 0 is raised to 1");
    assert!(zero.next_page_token.is_some());
}

pub async fn list_rejects_bad_page_tokens<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("badtoken");
    create_in_order(&*store, &app, &user, &["a", "b"]).await;
    for garbage in ["", "!!", "not a token", "djI6MTp4", "djE6eDp5", "djE6MTo"] {
        expect_invalid(PageToken::parse(garbage), |f| f == "page_token", &format!("token {garbage:?}"));
    }
    // Tokens that decode but point at instants no session can have (not a
    // date at all, or before PostgreSQL's first day, 4713 BC): not tokens
    // this store issued, so the caller's input is at fault, not the store.
    let id = SessionId::new("a").expect("id");
    let mut wrong = Vec::new();
    for micros in [i64::MIN, i64::MAX, DateTime::<Utc>::MIN_UTC.timestamp_micros()] {
        let mut request = ListSessions::new(app.clone(), user.clone());
        request.page_token = Some(PageToken::after(micros, &id));
        match store.list(&request).await {
            Err(StoreError::InvalidInput { field, .. }) if field == "page_token" => {}
            other => wrong.push(format!("token at {micros} µs: expected InvalidInput(page_token), got {other:?}")),
        }
        assert_eq!(list_all(&*store, &app, &user).await.len(), 2, "the store still lists");
    }
    assert_healthy(&*store, &app).await;
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

pub async fn list_shows_only_the_users_sessions_of_the_app<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("listscope");
    let (user2, app2) = (other_user(&user), other_app(&app));
    create_in_order(&*store, &app, &user, &["m1", "m2", "m3"]).await;
    create_in_order(&*store, &app, &user2, &["o1", "o2"]).await;
    create_in_order(&*store, &app2, &user, &["x1"]).await;
    let mine = list_all(&*store, &app, &user).await;
    assert_eq!(session_ids(&mine), ["m3", "m2", "m1"]);
    assert!(mine.iter().all(|s| s.key.app_name == app && s.key.user_id == user));
    assert_eq!(session_ids(&list_all(&*store, &app, &user2).await), ["o2", "o1"]);
    assert_eq!(session_ids(&list_all(&*store, &app2, &user).await), ["x1"]);
    assert!(list_all(&*store, &app2, &user2).await.is_empty());
}

pub async fn identifiers_are_exact_strings<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, _) = names("exact");
    // Wildcards, quotes, case and surrounding spaces of app names and user
    // ids are part of the name: nothing matches by pattern or folds case.
    let users = ["u%", "u_x", "U%", "u% ", " u%", "o'brien", "a\\b", "日本語", "u%x"];
    for (i, user) in users.iter().enumerate() {
        let user = UserId::new(*user).expect("user id");
        let session = create(&*store, &app, &user, &format!("s{i}"), json!({ "user:who": i })).await;
        assert_eq!(get(&*store, &session.key).await.state, obj(json!({ "user:who": i })));
    }
    for (i, user) in users.iter().enumerate() {
        let user = UserId::new(*user).expect("user id");
        let listed = list_all(&*store, &app, &user).await;
        assert_eq!(session_ids(&listed), [format!("s{i}")], "user {user:?} sees only their session");
        assert_eq!(listed[0].state, obj(json!({ "user:who": i })), "user {user:?} has their own user state");
    }
    // App names are exact: case matters. Names that differ only invisibly are
    // refused instead (app_names_that_look_alike_are_refused).
    let other = AppName::new(app.as_str().to_uppercase()).expect("app name");
    let user = UserId::new("u%").expect("user id");
    assert!(list_all(&*store, &other, &user).await.is_empty(), "{other:?} is another app");
    expect_not_found(
        store.get(&key(&other, &user, "s0"), GetOptions::default()).await,
        &key(&other, &user, "s0"),
        "get",
    );
    // Session ids are exact too, apart from the trimming create does.
    let user = UserId::new("ids").expect("user id");
    for id in ["Case", "case", "a%", "a_", "quote'id"] {
        create(&*store, &app, &user, id, json!({ "id": id })).await;
    }
    for id in ["Case", "case", "a%", "a_", "quote'id"] {
        assert_eq!(get(&*store, &key(&app, &user, id)).await.state, obj(json!({ "id": id })));
    }
    expect_not_found(
        store.get(&key(&app, &user, "CASE"), GetOptions::default()).await,
        &key(&app, &user, "CASE"),
        "get",
    );
}
