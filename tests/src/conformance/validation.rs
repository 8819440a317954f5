//! Bad input on every path: refused naming the field, and nothing written.

use std::collections::BTreeSet;

use adk_postgres_domain::{
    AppName, AppendOptions, CreateSession, Event, GetOptions, SessionId, SessionKey, State, StoreConfig, StoreError,
    UserId,
};
use chrono::Utc;
use serde_json::json;

use super::*;

pub async fn bad_identifiers_are_refused_naming_the_field<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("badids");
    let long = "a".repeat(129);
    for bad in ["", long.as_str(), "a\0b"] {
        expect_invalid(AppName::new(bad), |f| f == "app_name", &format!("app {bad:?}"));
        expect_invalid(UserId::new(bad), |f| f == "user_id", &format!("user {bad:?}"));
        expect_invalid(SessionId::new(bad), |f| f == "session_id", &format!("session {bad:?}"));
        expect_invalid(SessionKey::parse("a", bad, "s"), |f| f == "user_id", &format!("key {bad:?}"));
    }
    for bad in [long.clone(), "a\0b".into(), "  a\0  ".into(), format!(" {long} ")] {
        let result = store.create(CreateSession::new(app.clone(), user.clone()).with_id(bad.clone())).await;
        expect_invalid(result, |f| f == "session_id", &format!("create with id {bad:?}"));
        assert!(list_all(&*store, &app, &user).await.is_empty(), "nothing written for {bad:?}");
        assert_healthy(&*store, &app).await;
    }
    // The bounds are in characters and inclusive.
    let wide = "é".repeat(128);
    let session = create(&*store, &app, &user, &wide, json!({})).await;
    assert_eq!(get(&*store, &session.key).await.key.session_id.as_str(), wide);
    let max_app = AppName::new("p".repeat(128)).expect("128 characters");
    let max_user = UserId::new("u".repeat(128)).expect("128 characters");
    let edge = store.create(CreateSession::new(max_app, max_user)).await.expect("longest names");
    assert_eq!(get(&*store, &edge.key).await, edge);
}

pub async fn bad_state_keys_are_refused_and_nothing_is_written<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("badkeys");
    let existing = create(&*store, &app, &user, "existing", json!({"keep": 1})).await;
    let long_key = "k".repeat(257);
    let bad_keys = ["", "user:", "app:", "temp:", "a\u{1}b", "tab\tkey", "nul\0key", "del\u{7f}", long_key.as_str()];
    for bad in bad_keys {
        // Valid keys first: a store must refuse the whole state, not write
        // the keys it checked before the bad one.
        let mut state = obj(json!({"user:ok": 1, "app:ok": 1, "fine": 1}));
        state.insert(bad.to_owned(), json!(1));
        let result =
            store.create(CreateSession::new(app.clone(), user.clone()).with_id("new").with_state(state.clone())).await;
        expect_invalid(result, |f| f.starts_with("state["), &format!("create with key {bad:?}"));

        if bad != "temp:" {
            let mut event = Event::new("agent");
            event.actions.state_delta = state;
            let result = store.append(&existing.key, event, AppendOptions::default()).await;
            expect_invalid(
                result,
                |f| f.starts_with("event.actions.state_delta["),
                &format!("append with key {bad:?}"),
            );
        }
    }
    for value in [json!("a\0b"), json!({"deep": ["x\0"]}), json!({"k\0": 1})] {
        let state = obj(json!({"user:ok": 1, "v": value}));
        let result =
            store.create(CreateSession::new(app.clone(), user.clone()).with_id("new").with_state(state.clone())).await;
        expect_invalid(result, |f| f.starts_with("state["), &format!("create with value {value}"));
        let mut event = Event::new("agent");
        event.actions.state_delta = state;
        let result = store.append(&existing.key, event, AppendOptions::default()).await;
        expect_invalid(result, |f| f.starts_with("event.actions.state_delta["), &format!("append with {value}"));
    }
    assert_eq!(get(&*store, &existing.key).await, existing, "the session is untouched");
    assert_eq!(session_ids(&list_all(&*store, &app, &user).await), ["existing"], "no session was created");
    assert_healthy(&*store, &app).await;
}

pub async fn bad_events_are_refused_and_nothing_is_written<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("badevents");
    let session = create(&*store, &app, &user, "s", json!({})).await;
    let malformed = [
        "",
        "{",
        "[]",
        "null",
        "42",
        r#"{"id": "x"}"#,
        r#"{"id": 1, "author": "a", "timestamp": "2026-11-30T10:00:00Z"}"#,
        r#"{"id": "x", "author": "a", "timestamp": "yesterday"}"#,
        r#"{"id": "x", "author": "a", "timestamp": "2026-11-30T10:00:00Z", "actions": {"state_delta": [1]}}"#,
    ];
    for text in malformed {
        expect_invalid(Event::from_json(text), |f| f == "event", &format!("event JSON {text:?}"));
    }
    expect_invalid(Event::from_value(json!([1, 2])), |f| f == "event", "event value");
    let ok = Event::from_json(r#"{"id": "x", "author": "a", "timestamp": "2026-11-30T10:00:00.000000001Z"}"#)
        .expect("a minimal event parses");
    assert_eq!(ok.timestamp.timestamp_subsec_nanos(), 1);

    let bad = |change: &dyn Fn(&mut Event)| {
        let mut event = ev(json!({"user:ok": 1, "n": 1}));
        change(&mut event);
        event
    };
    let cases: Vec<(&str, Event)> = vec![
        ("event", bad(&|e| e.content = Some(json!({"parts": [{"text": "a\0b"}]})))),
        ("event", bad(&|e| e.extra = obj(json!({"custom\0": 1})))),
        ("event", bad(&|e| e.actions.artifact_delta = obj(json!({"f": "\0"})))),
        ("event.id", bad(&|e| e.id = String::new())),
        ("event.id", bad(&|e| e.id = "  ".into())),
        ("event.id", bad(&|e| e.id = "i".repeat(129))),
        ("event.id", bad(&|e| e.id = "a\0b".into())),
        ("event.author", bad(&|e| e.author = "a\0".into())),
        ("event.invocation_id", bad(&|e| e.invocation_id = "i".repeat(257))),
        ("event.timestamp", bad(&|e| e.timestamp = Utc.with_ymd_and_hms(2300, 1, 1, 0, 0, 0).unwrap())),
        ("event.timestamp", bad(&|e| e.timestamp = Utc.with_ymd_and_hms(1600, 1, 1, 0, 0, 0).unwrap())),
    ];
    for (field, event) in cases {
        let result = store.append(&session.key, event, AppendOptions::default()).await;
        expect_invalid(result, |f| f == field, &format!("event with a bad {field}"));
    }
    let mut huge = Event::new("agent");
    huge.content = Some(json!({"parts": [{"text": "x".repeat(adk_postgres_domain::event::MAX_EVENT_BYTES)}]}));
    let result = store.append(&session.key, huge, AppendOptions::default()).await;
    assert!(matches!(result, Err(StoreError::EventTooLarge { .. })), "{result:?}");

    assert_eq!(get(&*store, &session.key).await, session, "nothing was written");
    let sibling = create(&*store, &app, &user, "sibling", json!({})).await;
    assert_eq!(sibling.state, State::new(), "not even the user scope");
    assert_healthy(&*store, &app).await;
}

pub async fn state_over_the_size_cap_is_refused_and_nothing_is_written<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("toolarge");
    let session = create(&*store, &app, &user, "s", json!({"small": 1})).await;
    let big = "x".repeat(70_000);
    let delta_field = "event.actions.state_delta";

    for (scope, delta) in [
        ("session", json!({"big": big, "user:ok": 1})),
        ("user", json!({"user:big": big, "ok": 1})),
        ("app", json!({"app:big": big, "ok": 1})),
    ] {
        let result = store.append(&session.key, ev(delta), AppendOptions::default()).await;
        expect_state_too_large(result, delta_field, scope, &format!("a {scope} delta over the cap"));
    }
    let result = store
        .create(
            CreateSession::new(app.clone(), user.clone())
                .with_id("big")
                .with_state(obj(json!({"user:big": big, "ok": 1}))),
        )
        .await;
    expect_state_too_large(result, "state", "user", "initial state over the cap");
    assert_eq!(get(&*store, &session.key).await, session, "nothing written");
    assert_eq!(session_ids(&list_all(&*store, &app, &user).await), ["s"], "no session created");

    // Deltas each under the cap whose merged scope is over it: refused by
    // the merge, with nothing written. Repeated past the pool size, so a
    // leaked connection would show.
    let half = |c: char| c.to_string().repeat(40_000);
    append(&*store, &session.key, ev(json!({"h1": half('a'), "user:h1": half('b')}))).await;
    let before = get(&*store, &session.key).await;
    for round in 0..20 {
        let (scope, delta) = if round % 2 == 0 {
            ("session", json!({"h2": half('c'), "user:small": round}))
        } else {
            ("user", json!({"user:h2": half('d'), "small": round}))
        };
        let result = store.append(&session.key, ev(delta), AppendOptions::default()).await;
        expect_state_too_large(result, delta_field, scope, &format!("a merged {scope} scope over the cap"));
    }
    assert_eq!(get(&*store, &session.key).await, before, "nothing written");
    // A create whose initial user state overflows the stored user scope is
    // refused whole: no session either.
    let result = store
        .create(CreateSession::new(app.clone(), user.clone()).with_id("late").with_state(obj(json!({
            "user:h3": half('e'), "fine": 1
        }))))
        .await;
    expect_state_too_large(result, "state", "user", "a create overflowing the user scope");
    assert_eq!(session_ids(&list_all(&*store, &app, &user).await), ["s"], "no session created");
    assert_eq!(get(&*store, &session.key).await, before, "nothing written");
    assert_healthy(&*store, &app).await;
}

/// An app name is the tenant key roles are bound to, so a name that only
/// looks like another (another Unicode normal form, surrounding whitespace,
/// a control character) is refused, never normalised; the names a store does
/// get are stored as given and compared byte for byte, so case matters.
pub async fn app_names_that_look_alike_are_refused<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (base, user) = names("lookalike");
    let nfc = AppName::new(format!("{base}-caf\u{e9}")).expect("an NFC app name");
    let nfd = format!("{base}-cafe\u{301}");
    let bad_names = [
        nfd.clone(),
        format!("{nfc} "),
        format!(" {nfc}"),
        format!("{nfc}\n"),
        format!("\u{a0}{nfc}"),
        format!("{base}\u{7}"),
        format!("{base}\u{1b}[0m"),
        format!("ap\u{7f}p-{base}"),
    ];
    for bad in &bad_names {
        expect_invalid(AppName::new(bad.as_str()), |f| f == "app_name", &format!("app {bad:?}"));
        expect_invalid(SessionKey::parse(bad, "u", "s"), |f| f == "app_name", &format!("key {bad:?}"));
        assert!(serde_json::from_value::<AppName>(json!(bad)).is_err(), "deserialising app {bad:?}");
    }
    // The rule is the app name's: user and session ids keep theirs.
    assert_eq!(UserId::new(nfd.as_str()).expect("an NFD user id").as_str(), nfd);

    // The NFC name is stored exactly as given and found under exactly it.
    let id = format!("lookalike-{}", uuid::Uuid::new_v4().simple());
    let session = create(&*store, &nfc, &user, &id, json!({"app:who": "nfc"})).await;
    assert_eq!(get(&*store, &session.key).await.key.app_name.as_str(), nfc.as_str());
    assert_eq!(store.find_by_id(&session.key.session_id, 2).await.expect("find"), std::slice::from_ref(&session.key));

    // Case matters: the upper-case spelling is another tenant, with its own
    // sessions and app state.
    let upper = AppName::new(nfc.as_str().to_uppercase()).expect("an upper-case app name");
    assert_ne!(upper, nfc);
    assert!(list_all(&*store, &upper, &user).await.is_empty(), "{upper:?} is another app");
    expect_not_found(store.get(&key(&upper, &user, &id), GetOptions::default()).await, &key(&upper, &user, &id), "get");
    let other = create(&*store, &upper, &user, &id, json!({"app:who": "upper"})).await;
    assert_eq!(get(&*store, &session.key).await.state, obj(json!({"app:who": "nfc"})));
    assert_eq!(get(&*store, &other.key).await.state, obj(json!({"app:who": "upper"})));
    let found: BTreeSet<SessionKey> =
        store.find_by_id(&session.key.session_id, 3).await.expect("find").into_iter().collect();
    assert_eq!(found, BTreeSet::from([session.key, other.key]));
}
