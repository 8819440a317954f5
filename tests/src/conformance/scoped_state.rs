//! User and app state read and merged directly, without a session
//! (`get_user_state`, `get_app_state`, `merge_user_state`,
//! `merge_app_state`): the same scopes an append's `user:`/`app:` delta
//! writes, with the same semantics and the same row locks.

use std::sync::Arc;

use adk_postgres_domain::state::MAX_STATE_BYTES;
use adk_postgres_domain::{AppendOptions, State, StoreConfig};
use serde_json::json;
use tokio::sync::Barrier;
use tokio::task::JoinSet;

use super::*;

pub async fn scoped_state_reads_empty_then_round_trips_merges<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("scopedrt");
    assert_eq!(store.get_user_state(&app, &user).await.expect("get_user_state"), State::new(), "none yet reads {{}}");
    assert_eq!(store.get_app_state(&app).await.expect("get_app_state"), State::new(), "none yet reads {{}}");

    let first = obj(json!({"tier": "gold", "prefs": {"lang": ["pt", "en"]}, "n": 1.5}));
    assert_eq!(store.merge_user_state(&app, &user, first.clone()).await.expect("merge"), first, "returns the merge");
    assert_eq!(store.get_user_state(&app, &user).await.expect("get"), first);
    let after = store.merge_user_state(&app, &user, obj(json!({"n": 2, "new": true}))).await.expect("merge");
    let expected = obj(json!({"tier": "gold", "prefs": {"lang": ["pt", "en"]}, "n": 2, "new": true}));
    assert_eq!(after, expected, "shallow: a value replaces, other keys stay");
    assert_eq!(store.get_user_state(&app, &user).await.expect("get"), expected);

    let motd = obj(json!({"motd": "hello", "limit": 10}));
    assert_eq!(store.merge_app_state(&app, motd.clone()).await.expect("merge app"), motd);
    let after = store.merge_app_state(&app, obj(json!({"limit": 20}))).await.expect("merge app");
    assert_eq!(after, obj(json!({"motd": "hello", "limit": 20})));
    assert_eq!(store.get_app_state(&app).await.expect("get app"), after);
    assert_eq!(store.get_user_state(&app, &user).await.expect("get"), expected, "the app merge left the user alone");
}

pub async fn a_direct_merge_shows_in_every_session_of_the_user_with_prefixes<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("scopedget");
    let s1 = create(&*store, &app, &user, "s1", json!({"own": 1, "user:seed": 0, "app:seed": 0})).await;
    let s2 = create(&*store, &app, &user, "s2", json!({"own": 2})).await;
    append(&*store, &s1.key, ev(json!({"user:by_event": true, "app:by_event": true}))).await;

    let user_state = store.merge_user_state(&app, &user, obj(json!({"tier": "gold"}))).await.expect("merge user");
    assert_eq!(user_state, obj(json!({"seed": 0, "by_event": true, "tier": "gold"})), "keys as stored, no prefix");
    let app_state = store.merge_app_state(&app, obj(json!({"motd": "hi"}))).await.expect("merge app");
    assert_eq!(app_state, obj(json!({"seed": 0, "by_event": true, "motd": "hi"})));

    let shared = json!({"user:seed": 0, "user:by_event": true, "user:tier": "gold",
                        "app:seed": 0, "app:by_event": true, "app:motd": "hi"});
    for (key, own) in [(&s1.key, 1), (&s2.key, 2)] {
        let mut expected = obj(shared.clone());
        expected.insert("own".into(), json!(own));
        let loaded = get(&*store, key).await;
        assert_eq!(loaded.state, expected, "{key}: prefixes restored in a later get");
        let version = if own == 1 { 1 } else { 0 };
        assert_eq!(loaded.version, version, "{key}: a direct merge is not an event of any session");
    }
    let listed = list_all(&*store, &app, &user).await;
    assert!(listed.iter().all(|s| s.state.get("user:tier") == Some(&json!("gold"))), "list shows it too");
    // Session state stays the events' to write: a merge cannot reach it.
    assert_eq!(get(&*store, &s1.key).await.state.get("tier"), None);
}

/// The same deltas through appends and through direct merges leave the
/// same state: null is stored as a value, a key is never removed.
pub async fn direct_merges_treat_null_and_empty_deltas_as_an_append_does<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("scopednull");
    let (by_merge, by_event) = (other_user(&user), user.clone());
    let merge_app = other_app(&app);
    let session = create(&*store, &app, &by_event, "s", json!({})).await;
    let deltas = [json!({"a": 1, "b": 2, "c": {"deep": 1}}), json!({"a": null, "c": {"other": 2}}), json!({})];
    for delta in &deltas {
        let prefixed = |prefix: &str| -> serde_json::Map<String, Value> {
            obj(delta.clone()).into_iter().map(|(k, v)| (format!("{prefix}{k}"), v)).collect()
        };
        let mut both = prefixed("user:");
        both.extend(prefixed("app:"));
        append(&*store, &session.key, ev(Value::Object(both))).await;
        store.merge_user_state(&app, &by_merge, obj(delta.clone())).await.expect("merge user");
        store.merge_app_state(&merge_app, obj(delta.clone())).await.expect("merge app");
    }
    let expected = obj(json!({"a": null, "b": 2, "c": {"other": 2}}));
    assert_eq!(store.get_user_state(&app, &by_event).await.expect("get"), expected, "through appends");
    assert_eq!(store.get_user_state(&app, &by_merge).await.expect("get"), expected, "through merges");
    assert_eq!(store.get_app_state(&app).await.expect("get"), expected, "through appends");
    assert_eq!(store.get_app_state(&merge_app).await.expect("get"), expected, "through merges");

    // An empty delta writes nothing and answers the current state.
    assert_eq!(store.merge_user_state(&app, &by_merge, State::new()).await.expect("empty"), expected);
    assert_eq!(store.merge_app_state(&merge_app, State::new()).await.expect("empty"), expected);
    let nobody = UserId::new(format!("{user}-nobody")).expect("user id");
    assert_eq!(store.merge_user_state(&app, &nobody, State::new()).await.expect("empty"), State::new());
    let erased = store.erase_user(&app, &nobody).await.expect("erase");
    assert!(!erased.user_state, "an empty merge stored no user state row");
}

pub async fn bad_scope_deltas_are_refused_and_nothing_is_written<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("scopedbad");
    let seed = obj(json!({"keep": 1}));
    store.merge_user_state(&app, &user, seed.clone()).await.expect("seed user");
    store.merge_app_state(&app, seed.clone()).await.expect("seed app");

    let bad_keys = ["user:tier", "app:motd", "temp:scratch", "", "a\u{1}b", "user:"];
    for key in bad_keys {
        let delta = obj(json!({ key: 1, "fine": 2 }));
        let what = format!("key {key:?}");
        let starts = |field: &str| field.starts_with("delta[");
        expect_invalid(store.merge_user_state(&app, &user, delta.clone()).await, starts, &what);
        expect_invalid(store.merge_app_state(&app, delta).await, starts, &what);
    }
    let nul = obj(json!({"fine": 1, "text": ["x\u{0}y"]}));
    let names_text = |field: &str| field == "delta[\"text\"]";
    expect_invalid(store.merge_user_state(&app, &user, nul.clone()).await, names_text, "a NUL in a value");
    expect_invalid(store.merge_app_state(&app, nul).await, names_text, "a NUL in a value");

    let big = obj(json!({"big": "x".repeat(MAX_STATE_BYTES + 10)}));
    expect_state_too_large(
        store.merge_user_state(&app, &user, big.clone()).await,
        "delta",
        "user",
        "a delta over the cap",
    );
    expect_state_too_large(store.merge_app_state(&app, big).await, "delta", "app", "a delta over the cap");

    // Each delta under the cap, the merged scope over it: refused by the
    // merge. Repeated past the pool size, so a leaked connection would show.
    let half = |c: char| obj(json!({ format!("h{c}"): c.to_string().repeat(40_000) }));
    let user_before = store.merge_user_state(&app, &user, half('a')).await.expect("half the user cap");
    let app_before = store.merge_app_state(&app, half('b')).await.expect("half the app cap");
    for round in 0..12 {
        let result = store.merge_user_state(&app, &user, half('c')).await;
        expect_state_too_large(result, "delta", "user", &format!("round {round}: a merged user scope over the cap"));
        let result = store.merge_app_state(&app, half('d')).await;
        expect_state_too_large(result, "delta", "app", &format!("round {round}: a merged app scope over the cap"));
    }
    assert_eq!(store.get_user_state(&app, &user).await.expect("get"), user_before, "nothing written");
    assert_eq!(store.get_app_state(&app).await.expect("get"), app_before, "nothing written");
    assert_eq!(user_before.get("keep"), Some(&json!(1)));
    // Another app: this one's app state would show in the check's session.
    assert_healthy(&*store, &other_app(&app)).await;
}

pub async fn app_state_is_shared_by_users_and_user_state_is_per_user_and_app<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("scopedshare");
    let (neighbour, elsewhere) = (other_user(&user), other_app(&app));
    let theirs = create(&*store, &app, &neighbour, "theirs", json!({})).await;

    store.merge_app_state(&app, obj(json!({"motd": "shared"}))).await.expect("merge app");
    store.merge_user_state(&app, &user, obj(json!({"tier": "gold"}))).await.expect("merge user");

    assert_eq!(store.get_app_state(&app).await.expect("get"), obj(json!({"motd": "shared"})));
    assert_eq!(
        get(&*store, &theirs.key).await.state,
        obj(json!({"app:motd": "shared"})),
        "another user sees app state"
    );
    assert_eq!(store.get_user_state(&app, &neighbour).await.expect("get"), State::new(), "not another user's");
    assert_eq!(store.get_user_state(&elsewhere, &user).await.expect("get"), State::new(), "not another app's");
    assert_eq!(store.get_app_state(&elsewhere).await.expect("get"), State::new(), "not another app's");
    assert_eq!(store.get_user_state(&app, &user).await.expect("get"), obj(json!({"tier": "gold"})));

    // Erasing the user takes the state merged directly too; app state stays.
    let erased = store.erase_user(&app, &user).await.expect("erase");
    assert!(erased.user_state);
    assert_eq!(store.get_user_state(&app, &user).await.expect("get"), State::new());
    assert_eq!(store.get_app_state(&app).await.expect("get"), obj(json!({"motd": "shared"})));
}

/// 8 tasks append events whose deltas set their own `user:` and `app:` keys
/// while 8 tasks merge their own keys directly into the same user and app
/// rows, all at once: every key of every writer is there at the end, with
/// its last value, so neither path lost the other's update.
pub async fn direct_merges_racing_appends_lose_no_key<F: StoreFactory>(f: &F) {
    const TASKS: usize = 8;
    const PER_TASK: usize = 25;
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("scopedrace");
    let mut keys = Vec::new();
    for task in 0..TASKS {
        keys.push(create(&*store, &app, &user, &format!("s{task}"), json!({})).await.key);
    }
    let barrier = Arc::new(Barrier::new(2 * TASKS));
    let mut writers = JoinSet::new();
    for (task, key) in keys.into_iter().enumerate() {
        let (store, barrier) = (store.clone(), barrier.clone());
        writers.spawn(async move {
            barrier.wait().await;
            for j in 0..PER_TASK {
                let delta = json!({ format!("user:e{task}"): j, format!("app:e{task}"): j });
                store.append(&key, ev(delta), AppendOptions::default()).await.expect("racing append");
            }
        });
    }
    for task in 0..TASKS {
        let (store, app, user, barrier) = (store.clone(), app.clone(), user.clone(), barrier.clone());
        writers.spawn(async move {
            barrier.wait().await;
            for j in 0..PER_TASK {
                let delta = obj(json!({ format!("m{task}"): j }));
                let merged = store.merge_user_state(&app, &user, delta.clone()).await.expect("racing user merge");
                assert_eq!(merged.get(&format!("m{task}")), Some(&json!(j)), "the returned state holds the merge");
                store.merge_app_state(&app, delta).await.expect("racing app merge");
            }
        });
    }
    while let Some(done) = writers.join_next().await {
        done.expect("writer task");
    }
    let expected: State = (0..TASKS)
        .flat_map(|task| [format!("e{task}"), format!("m{task}")])
        .map(|key| (key, json!(PER_TASK - 1)))
        .collect();
    let user_state = store.get_user_state(&app, &user).await.expect("get user");
    let app_state = store.get_app_state(&app).await.expect("get app");
    let lost =
        |state: &State| expected.keys().filter(|k| state.get(*k) != expected.get(*k)).cloned().collect::<Vec<_>>();
    assert!(lost(&user_state).is_empty(), "user keys lost or stale: {:?}", lost(&user_state));
    assert!(lost(&app_state).is_empty(), "app keys lost or stale: {:?}", lost(&app_state));
    assert_eq!((user_state, app_state), (expected.clone(), expected));
}
