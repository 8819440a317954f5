//! `create`: ids, conflicts, `return_existing`, initial state, and an
//! expired session's id.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use adk_postgres_domain::{CreateSession, State, StoreConfig, StoreError};
use serde_json::json;

use super::*;

pub async fn create_generates_a_uuid_v4_for_a_blank_or_absent_id<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("uuid");
    let mut seen = BTreeSet::new();
    for requested in [None, Some(""), Some("   "), Some("\t \n")] {
        let mut request = CreateSession::new(app.clone(), user.clone());
        request.session_id = requested.map(str::to_owned);
        let session = store.create(request).await.unwrap_or_else(|e| panic!("create with {requested:?}: {e}"));
        let id = session.key.session_id.as_str();
        let uuid =
            uuid::Uuid::parse_str(id).unwrap_or_else(|e| panic!("{requested:?} gave id {id:?}, not a UUID: {e}"));
        assert_eq!(uuid.get_version(), Some(uuid::Version::Random), "{requested:?} gave {id}, not a UUIDv4");
        assert_eq!(uuid.hyphenated().to_string(), id, "ids are lowercase hyphenated UUIDs");
        assert_eq!((session.version, session.events.len()), (0, 0));
        assert_eq!(session.expires_at, None, "no ttl asked for and no default: never expires");
        assert_eq!(session.closed_at, None);
        assert_eq!(session.created_at, session.last_update_time);
        assert!(seen.insert(id.to_owned()), "id {id} generated twice");
        assert_eq!(get(&*store, &session.key).await, session, "get returns what create returned");
    }
    let listed: BTreeSet<String> = session_ids(&list_all(&*store, &app, &user).await).into_iter().collect();
    assert_eq!(listed, seen);
}

pub async fn create_trims_ids<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("trim");
    let session = create(&*store, &app, &user, "  abc  ", json!({})).await;
    assert_eq!(session.key.session_id.as_str(), "abc");
    assert_eq!(get(&*store, &key(&app, &user, "abc")).await, session);
    for again in ["abc", " abc", "abc\t"] {
        let result = store.create(CreateSession::new(app.clone(), user.clone()).with_id(again)).await;
        assert!(
            matches!(&result, Err(StoreError::AlreadyExists(k)) if *k == session.key),
            "{again:?} is the trimmed id abc: {result:?}"
        );
    }
    // Inner whitespace is part of the id.
    let inner = create(&*store, &app, &user, " a b ", json!({})).await;
    assert_eq!(inner.key.session_id.as_str(), "a b");
    // The length bound applies after trimming.
    let long = "x".repeat(128);
    let padded = create(&*store, &app, &user, &format!("  {long}  "), json!({})).await;
    assert_eq!(padded.key.session_id.as_str(), long);
    let mut listed = session_ids(&list_all(&*store, &app, &user).await);
    listed.sort();
    assert_eq!(listed, vec!["a b".to_owned(), "abc".to_owned(), long]);
}

pub async fn create_with_a_taken_id_is_already_exists_and_never_overwrites<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("dup");
    let original = create(&*store, &app, &user, "dup", json!({"a": 1, "user:pref": "orig", "app:flag": "orig"})).await;
    append(&*store, &original.key, ev(json!({"b": 2}))).await;
    let before = get(&*store, &original.key).await;

    let result = store
        .create(CreateSession::new(app.clone(), user.clone()).with_id("dup").with_state(obj(json!({
            "a": 2, "c": 3, "user:pref": "new", "user:only_new": 1, "app:flag": "new"
        }))))
        .await;
    assert!(matches!(&result, Err(StoreError::AlreadyExists(k)) if *k == original.key), "{result:?}");

    let after = get(&*store, &original.key).await;
    assert_eq!(after, before, "a refused create changes nothing");
    assert_eq!(after.state, obj(json!({"a": 1, "b": 2, "user:pref": "orig", "app:flag": "orig"})));
    assert_eq!(after.version, 1);
    // Not even the shared scopes took the refused create's state.
    let sibling = create(&*store, &app, &user, "sibling", json!({})).await;
    assert_eq!(sibling.state, obj(json!({"user:pref": "orig", "app:flag": "orig"})));
    assert_eq!(list_all(&*store, &app, &user).await.len(), 2);
}

pub async fn create_return_existing_returns_the_existing_session<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("retexist");
    let original = create(&*store, &app, &user, "ret", json!({"a": 1})).await;
    let stored = append(&*store, &original.key, ev(json!({"b": 2}))).await.event;

    let returned = store
        .create(
            CreateSession::new(app.clone(), user.clone())
                .with_id(" ret ")
                .with_state(obj(json!({"a": 99, "user:x": 1})))
                .return_existing(),
        )
        .await
        .expect("return_existing on a taken id");
    assert_eq!(returned.key, original.key);
    assert_eq!(returned.created_at, original.created_at, "the existing session, not a new one");
    assert_eq!(returned.version, 1);
    assert_eq!(returned.events, vec![stored]);
    assert_eq!(returned.state, obj(json!({"a": 1, "b": 2})), "the request's state is not applied");
    assert_eq!(returned, get(&*store, &original.key).await);

    // On a free id it creates as usual.
    let fresh = store
        .create(
            CreateSession::new(app.clone(), user.clone())
                .with_id("ret-new")
                .with_state(obj(json!({"a": 5})))
                .return_existing(),
        )
        .await
        .expect("return_existing on a free id");
    assert_eq!((fresh.version, fresh.state.clone()), (0, obj(json!({"a": 5}))));
    assert_eq!(list_all(&*store, &app, &user).await.len(), 2);
}

pub async fn create_same_id_for_another_user_or_app_is_another_session<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("sameid");
    let (user2, app2) = (other_user(&user), other_app(&app));
    let mine = create(&*store, &app, &user, "shared", json!({"who": "me"})).await;
    let theirs = create(&*store, &app, &user2, "shared", json!({"who": "other user"})).await;
    let elsewhere = create(&*store, &app2, &user, "shared", json!({"who": "other app"})).await;
    append(&*store, &mine.key, ev(json!({"n": 1}))).await;

    let mine = get(&*store, &mine.key).await;
    assert_eq!((mine.version, mine.state), (1, obj(json!({"who": "me", "n": 1}))));
    for (other, who) in [(&theirs, "other user"), (&elsewhere, "other app")] {
        let loaded = get(&*store, &other.key).await;
        assert_eq!(loaded.version, 0, "{who}: untouched by appends to the first session");
        assert!(loaded.events.is_empty());
        assert_eq!(loaded.state, obj(json!({"who": who})));
    }
}

pub async fn create_routes_initial_state_by_prefix<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("route");
    let initial = json!({
        "s": 1, "app:a": "A", "user:u": "U", "temp:t": "T", "appx": 5, "user_x": 6, "nested": {"temp:inner": 1}
    });
    let expected = obj(json!({
        "s": 1, "app:a": "A", "user:u": "U", "appx": 5, "user_x": 6, "nested": {"temp:inner": 1}
    }));
    let first = create(&*store, &app, &user, "first", initial).await;
    assert_eq!(first.state, expected, "create's answer");
    assert_eq!(get(&*store, &first.key).await.state, expected, "get");

    let second = create(&*store, &app, &user, "second", json!({})).await;
    assert_eq!(second.state, obj(json!({"app:a": "A", "user:u": "U"})), "same app and user share app: and user:");
    let other_user = create(&*store, &app, &other_user(&user), "third", json!({})).await;
    assert_eq!(other_user.state, obj(json!({"app:a": "A"})), "another user shares app: only");
    let other_app = create(&*store, &other_app(&app), &user, "fourth", json!({})).await;
    assert_eq!(other_app.state, State::new(), "another app shares nothing");

    let listed: BTreeMap<String, State> =
        list_all(&*store, &app, &user).await.into_iter().map(|s| (s.key.session_id.to_string(), s.state)).collect();
    assert_eq!(listed["first"], expected);
    assert_eq!(listed["second"], obj(json!({"app:a": "A", "user:u": "U"})));
    for session in [&first, &second] {
        let state = get(&*store, &session.key).await.state;
        assert!(!state.contains_key("temp:t") && !state.contains_key("t"), "temp: is never persisted");
    }
}

pub async fn an_expired_sessions_id_is_free_at_once<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("reuse");
    let old = store
        .create(
            CreateSession::new(app.clone(), user.clone())
                .with_id("reused")
                .with_state(obj(json!({"old": true})))
                .with_ttl(Duration::from_millis(200)),
        )
        .await
        .expect("create");
    append(&*store, &old.key, ev(json!({"step": 1}))).await;
    tokio::time::sleep(Duration::from_millis(400)).await;

    let fresh = create(&*store, &app, &user, "reused", json!({"new": true})).await;
    assert_eq!(fresh.key, old.key);
    assert_eq!(fresh.version, 0);
    assert_eq!(fresh.expires_at, None, "the new session has its own (default) TTL");
    let loaded = get(&*store, &fresh.key).await;
    assert!(loaded.events.is_empty(), "the expired session's events went with it: {:?}", loaded.events);
    assert_eq!(loaded.state, obj(json!({"new": true})));
    assert_eq!(append(&*store, &fresh.key, ev(json!({}))).await.seq, Some(1), "sequence starts over");
    // A live session's id is still taken.
    let taken = store.create(CreateSession::new(app.clone(), user.clone()).with_id("reused")).await;
    assert_eq!(taken, Err(StoreError::AlreadyExists(fresh.key.clone())));
}
