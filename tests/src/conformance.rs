//! One conformance suite for every [`SessionStore`]: each case pins a line of
//! the contract in DESIGN.md ("Semantics"), and the same cases run against the
//! in-memory reference store and the PostgreSQL store.
//!
//! A case is a `pub async fn` taking a [`StoreFactory`]; the
//! [`conformance_tests!`](crate::conformance_tests) macro turns every case
//! into a `#[tokio::test]` for one factory. A case asks its factory for one
//! store (with the [`StoreConfig`] it needs) and names its app and user
//! uniquely, so cases never see each other's data.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use adk_postgres_domain::session::{DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE};
use adk_postgres_domain::{
    AppName, AppendOptions, Appended, CreateSession, Event, GetOptions, InMemoryStore, ListSessions, PageToken,
    Session, SessionId, SessionKey, SessionPage, SessionStore, SessionSummary, State, StoreConfig, StoreError, UserId,
};
use chrono::{DateTime, TimeDelta, TimeZone, Utc};
use serde_json::{Value, json};
use tokio::sync::Barrier;
use tokio::task::JoinSet;

/// Makes the store a case runs against.
pub trait StoreFactory: Send + Sync {
    /// A store with `config`. A case asks for one store and uses only it.
    fn store(&self, config: StoreConfig) -> impl Future<Output = Arc<dyn SessionStore>> + Send;
}

/// The in-memory reference store: a fresh one per call.
#[derive(Debug, Default, Clone, Copy)]
pub struct MemoryFactory;

impl StoreFactory for MemoryFactory {
    async fn store(&self, config: StoreConfig) -> Arc<dyn SessionStore> {
        Arc::new(InMemoryStore::with_config(config))
    }
}

/// Expands to one `#[tokio::test]` per conformance case, each building its
/// factory from `$factory` (evaluated once per test).
#[macro_export]
macro_rules! conformance_tests {
    ($factory:expr) => {
        $crate::conformance_tests!(@cases $factory;
            // create
            create_generates_a_uuid_v4_for_a_blank_or_absent_id,
            create_trims_ids,
            create_with_a_taken_id_is_already_exists_and_never_overwrites,
            create_return_existing_returns_the_existing_session,
            create_same_id_for_another_user_or_app_is_another_session,
            create_routes_initial_state_by_prefix,
            // get
            get_merges_the_live_app_and_user_state,
            get_returns_events_in_seq_order_exactly_as_appended,
            numbers_read_back_exactly,
            get_num_recent_events_keeps_the_last_n,
            get_after_is_inclusive_to_the_nanosecond,
            get_with_both_filters_returns_their_intersection,
            get_missing_or_foreign_session_is_not_found,
            get_during_concurrent_appends_sees_one_consistent_version,
            expired_sessions_are_not_found_not_listed_and_refuse_appends,
            // append
            append_does_not_store_partial_events,
            append_strips_temp_keys,
            append_assigns_gapless_sequence_numbers,
            append_merges_state_deltas_shallowly,
            append_routes_app_and_user_deltas_to_their_scopes,
            append_update_time_never_moves_backwards,
            append_retry_of_a_stored_event_is_replayed,
            append_same_id_with_different_content_is_duplicate_event,
            append_expected_version_detects_stale_sessions,
            append_to_a_missing_session_is_not_found,
            append_past_the_max_lifetime_is_refused,
            // list
            list_is_metadata_newest_first,
            list_pages_by_keyset_without_gaps_or_duplicates,
            list_pages_are_stable_while_sessions_move,
            list_page_size_is_clamped,
            list_rejects_bad_page_tokens,
            list_shows_only_the_users_sessions_of_the_app,
            identifiers_are_exact_strings,
            // delete
            delete_is_idempotent,
            delete_removes_events_and_keeps_app_and_user_state,
            // bad input
            bad_identifiers_are_refused_naming_the_field,
            app_names_that_look_alike_are_refused,
            bad_state_keys_are_refused_and_nothing_is_written,
            bad_events_are_refused_and_nothing_is_written,
            state_over_the_size_cap_is_refused_and_nothing_is_written,
            // concurrency
            concurrent_appends_to_one_session_are_gapless,
            concurrent_shared_state_merges_lose_no_update,
            concurrent_increments_of_a_user_counter_reach_exactly_400,
            // lookup and rewind
            find_by_id_finds_live_sessions_across_users_and_apps,
            rewind_keeps_the_first_events_and_rebuilds_session_state,
            rewind_refuses_stale_versions_and_targets_past_the_end,
            rewind_starts_from_the_state_the_session_was_created_with,
            rewind_to_the_current_version_changes_nothing,
            retried_rewind_already_at_its_target_succeeds,
            retried_rollover_returns_its_successor,
            an_expired_sessions_id_is_free_at_once,
            concurrent_appends_with_one_expected_version_store_exactly_one,
            concurrent_retries_of_one_event_store_it_once,
            concurrent_creates_of_one_id_make_one_session,
        );
    };
    (@cases $factory:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() {
                let factory = $factory;
                $crate::conformance::$case(&factory).await;
            }
        )*
    };
}

// ---------------------------------------------------------------------------
// helpers

/// A unique (app, user) for one case.
pub fn names(case: &str) -> (AppName, UserId) {
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let tag = &tag[..12];
    (
        AppName::new(format!("app-{case}-{tag}")).expect("app name"),
        UserId::new(format!("user-{case}-{tag}")).expect("user id"),
    )
}

fn other_user(user: &UserId) -> UserId {
    UserId::new(format!("{user}-other")).expect("user id")
}

fn other_app(app: &AppName) -> AppName {
    AppName::new(format!("{app}-other")).expect("app name")
}

fn key(app: &AppName, user: &UserId, id: &str) -> SessionKey {
    SessionKey::new(app.clone(), user.clone(), SessionId::new(id).expect("session id"))
}

fn obj(value: Value) -> State {
    match value {
        Value::Object(map) => map,
        other => panic!("not an object: {other}"),
    }
}

/// An event by `agent` carrying `delta`.
fn ev(delta: Value) -> Event {
    let mut event = Event::new("agent");
    event.actions.state_delta = obj(delta);
    event
}

fn event_at(timestamp: DateTime<Utc>) -> Event {
    let mut event = Event::new("agent");
    event.timestamp = timestamp;
    event
}

fn ids(events: &[Event]) -> Vec<String> {
    events.iter().map(|e| e.id.clone()).collect()
}

fn session_ids(sessions: &[SessionSummary]) -> Vec<String> {
    sessions.iter().map(|s| s.key.session_id.as_str().to_owned()).collect()
}

async fn create(store: &dyn SessionStore, app: &AppName, user: &UserId, id: &str, state: Value) -> Session {
    store
        .create(CreateSession::new(app.clone(), user.clone()).with_id(id).with_state(obj(state)))
        .await
        .unwrap_or_else(|e| panic!("create {app}/{user}/{id}: {e}"))
}

async fn get(store: &dyn SessionStore, key: &SessionKey) -> Session {
    store.get(key, GetOptions::default()).await.unwrap_or_else(|e| panic!("get {key}: {e}"))
}

async fn get_ids(
    store: &dyn SessionStore,
    key: &SessionKey,
    num_recent_events: Option<usize>,
    after: Option<DateTime<Utc>>,
) -> Vec<String> {
    let session = store
        .get(key, GetOptions { num_recent_events, after })
        .await
        .unwrap_or_else(|e| panic!("get {key} ({num_recent_events:?}, {after:?}): {e}"));
    ids(&session.events)
}

async fn append(store: &dyn SessionStore, key: &SessionKey, event: Event) -> Appended {
    store.append(key, event, AppendOptions::default()).await.unwrap_or_else(|e| panic!("append to {key}: {e}"))
}

async fn append_expecting(
    store: &dyn SessionStore,
    key: &SessionKey,
    event: Event,
    expected_version: u64,
) -> Result<Appended, StoreError> {
    store.append(key, event, AppendOptions { expected_version: Some(expected_version) }).await
}

async fn list_page(
    store: &dyn SessionStore,
    app: &AppName,
    user: &UserId,
    page_size: Option<usize>,
    page_token: Option<PageToken>,
) -> SessionPage {
    let mut request = ListSessions::new(app.clone(), user.clone());
    request.page_size = page_size;
    request.page_token = page_token;
    store.list(&request).await.unwrap_or_else(|e| panic!("list {app}/{user}: {e}"))
}

/// Every session of the user, following page tokens.
async fn list_all(store: &dyn SessionStore, app: &AppName, user: &UserId) -> Vec<SessionSummary> {
    let mut all = Vec::new();
    let mut token = None;
    loop {
        let page = list_page(store, app, user, Some(MAX_PAGE_SIZE), token).await;
        all.extend(page.sessions);
        match page.next_page_token {
            Some(next) => token = Some(next),
            None => return all,
        }
    }
}

#[track_caller]
fn expect_invalid<T: Debug>(result: Result<T, StoreError>, field_ok: impl Fn(&str) -> bool, what: &str) {
    match result {
        Err(StoreError::InvalidInput { field, reason }) => {
            assert!(field_ok(&field), "{what}: InvalidInput names the wrong field {field:?} ({reason})");
            assert!(!reason.is_empty(), "{what}: InvalidInput without a reason");
        }
        other => panic!("{what}: expected InvalidInput, got {other:?}"),
    }
}

#[track_caller]
fn expect_not_found<T: Debug>(result: Result<T, StoreError>, key: &SessionKey, what: &str) {
    match result {
        Err(StoreError::NotFound(k)) => assert_eq!(&k, key, "{what}: NotFound names another key"),
        other => panic!("{what}: expected NotFound({key}), got {other:?}"),
    }
}

#[track_caller]
fn expect_state_too_large<T: Debug>(result: Result<T, StoreError>, field_prefix: &str, scope: &str, what: &str) {
    match result {
        Err(StoreError::StateTooLarge { field, limit, .. }) => {
            assert!(field.starts_with(field_prefix), "{what}: StateTooLarge names {field:?}, not {field_prefix}");
            assert!(field.contains(scope), "{what}: StateTooLarge names {field:?}, not the {scope} scope");
            assert_eq!(limit, adk_postgres_domain::state::MAX_STATE_BYTES, "{what}: limit");
        }
        other => panic!("{what}: expected StateTooLarge, got {other:?}"),
    }
}

/// The store still serves ordinary work: create, append, get, list, delete.
async fn assert_healthy(store: &dyn SessionStore, app: &AppName) {
    let user = UserId::new(format!("healthy-{}", uuid::Uuid::new_v4().simple())).expect("user id");
    let session = store
        .create(CreateSession::new(app.clone(), user.clone()).with_state(obj(json!({"ok": true}))))
        .await
        .expect("create after an error");
    let appended = append(store, &session.key, ev(json!({"n": 1}))).await;
    assert_eq!(appended.seq, Some(1));
    let loaded = get(store, &session.key).await;
    assert_eq!(loaded.events.len(), 1);
    assert_eq!(loaded.state, obj(json!({"ok": true, "n": 1})));
    assert_eq!(session_ids(&list_all(store, app, &user).await), vec![session.key.session_id.to_string()]);
    store.delete(&session.key).await.expect("delete after an error");
}

/// Runs `count` creates at once.
async fn create_many(store: &Arc<dyn SessionStore>, app: &AppName, user: &UserId, count: usize) -> Vec<SessionKey> {
    let mut tasks = JoinSet::new();
    for i in 0..count {
        let (store, app, user) = (store.clone(), app.clone(), user.clone());
        tasks.spawn(async move {
            store
                .create(CreateSession::new(app, user).with_id(format!("s{i:04}")))
                .await
                .unwrap_or_else(|e| panic!("create s{i:04}: {e}"))
                .key
        });
    }
    let mut keys = Vec::with_capacity(count);
    while let Some(key) = tasks.join_next().await {
        keys.push(key.expect("create task"));
    }
    keys
}

/// Sessions created one after another, far enough apart that their update
/// times differ (both stores keep microseconds).
async fn create_in_order(store: &dyn SessionStore, app: &AppName, user: &UserId, ids: &[&str]) -> Vec<SessionKey> {
    let mut keys = Vec::new();
    for id in ids {
        keys.push(create(store, app, user, id, json!({})).await.key);
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    keys
}

#[track_caller]
fn assert_newest_first(sessions: &[SessionSummary]) {
    for pair in sessions.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        assert!(
            (a.last_update_time, &a.key.session_id) > (b.last_update_time, &b.key.session_id),
            "not newest first: {} ({}) before {} ({})",
            a.key.session_id,
            a.last_update_time,
            b.key.session_id,
            b.last_update_time
        );
    }
}

/// A fixed instant with every nanosecond digit set.
fn base_time() -> DateTime<Utc> {
    Utc.timestamp_opt(1_790_000_000, 123_456_789).single().expect("valid instant")
}

fn ns(n: i64) -> TimeDelta {
    TimeDelta::nanoseconds(n)
}

// ---------------------------------------------------------------------------
// create

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

// ---------------------------------------------------------------------------
// get

pub async fn get_merges_the_live_app_and_user_state<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("live");
    let a = create(&*store, &app, &user, "a", json!({"mine": "a"})).await;
    let b = create(&*store, &app, &user, "b", json!({})).await;
    let c = create(&*store, &app, &other_user(&user), "c", json!({})).await;

    append(&*store, &b.key, ev(json!({"user:color": "red", "app:mode": "fast", "local": 1}))).await;
    assert_eq!(get(&*store, &a.key).await.state, obj(json!({"mine": "a", "user:color": "red", "app:mode": "fast"})));
    assert_eq!(get(&*store, &c.key).await.state, obj(json!({"app:mode": "fast"})));

    append(&*store, &b.key, ev(json!({"user:color": "blue"}))).await;
    let a_now = get(&*store, &a.key).await;
    assert_eq!(a_now.state["user:color"], json!("blue"), "get sees the live user state, not a snapshot");
    assert_eq!(a_now.version, 0, "a itself did not change");
    let listed = list_all(&*store, &app, &user).await;
    let a_summary = listed.iter().find(|s| s.key == a.key).expect("a listed");
    assert_eq!(a_summary.state, a_now.state, "list merges the live state too");
}

pub async fn get_returns_events_in_seq_order_exactly_as_appended<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("order");
    let session = create(&*store, &app, &user, "s", json!({})).await;
    let mut stored = Vec::new();
    for i in 0..10i64 {
        // Timestamps run backwards: the order is the append order (seq).
        let mut event = event_at(base_time() - TimeDelta::seconds(i));
        event.invocation_id = format!("inv-{i}");
        if i % 3 == 0 {
            event.branch = Some("root.child".into());
            event.content = Some(json!({"role": "model", "parts": [{"text": format!("héllo 😀 {i}")}, {"n": i}]}));
            event.turn_complete = Some(true);
            event.actions.artifact_delta = obj(json!({"file.txt": i}));
            event.actions.transfer_to_agent = Some("helper".into());
            event.actions.escalate = Some(false);
            event.actions.skip_summarization = Some(true);
            event.actions.extra = obj(json!({"requested_auth_configs": {}}));
            event.extra = obj(json!({
                "usage_metadata": {"total_token_count": 12},
                "long_running_tool_ids": ["t1"],
                "numbers": [0.1, 1.0, -2.5, 1e-7, 123_456_789.123, 5e-324, u64::MAX, i64::MIN, 0],
                "text": "quotes \" ' \\ and \u{2028} and \t tabs",
            }));
            event.actions.state_delta = obj(json!({"k": i, "temp:scratch": i}));
        }
        let appended = append(&*store, &session.key, event.clone()).await;
        assert_eq!(appended.seq, Some(i as u64 + 1));
        assert_eq!(appended.event, event.without_temp_state(), "the answer is the event as stored");
        stored.push(appended.event);
    }
    let loaded = get(&*store, &session.key).await;
    assert_eq!(loaded.version, 10);
    assert_eq!(loaded.events, stored, "events read back exactly as appended, in seq order");
}

pub async fn numbers_read_back_exactly<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("numbers");
    let session = create(&*store, &app, &user, "s", json!({})).await;
    // Deterministic pseudo-random bit patterns: every finite f64 is a value
    // an agent may put in an event or in state.
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let mut random = Vec::new();
    while random.len() < 2_000 {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        let x = f64::from_bits(seed);
        if x.is_finite() {
            random.push(x);
        }
    }
    let extremes = [f64::MAX, f64::MIN, f64::MIN_POSITIVE, 5e-324, -5e-324, 1e308, 1.5e-300, 0.1, -0.0];
    let mut wrong = Vec::new();
    for (what, values) in [("extreme", &extremes[..]), ("random", &random[..400]), ("random", &random[400..])] {
        let mut event = ev(json!({ "values": values[..values.len().min(400)] }));
        event.content = Some(json!({ "values": values }));
        let Ok(stored) = store.append(&session.key, event.clone(), AppendOptions::default()).await.map_err(|e| {
            wrong.push(format!("{what}: append failed: {e}"));
        }) else {
            continue;
        };
        assert_eq!(stored.event, event);
        match store.get(&session.key, GetOptions { num_recent_events: Some(1), after: None }).await {
            Ok(loaded) => {
                let back = loaded.events[0].content.as_ref().and_then(|c| c["values"].as_array().cloned());
                let back: Vec<Option<f64>> = back.unwrap_or_default().iter().map(Value::as_f64).collect();
                for (i, (sent, got)) in values.iter().zip(&back).enumerate() {
                    if Some(sent.to_bits()) != got.map(f64::to_bits) && !(*sent == 0.0 && *got == Some(0.0)) {
                        wrong.push(format!("{what}[{i}]: appended {sent:e}, read back {got:?}"));
                    }
                }
                if back.len() != values.len() {
                    wrong.push(format!("{what}: {} values read back, not {}", back.len(), values.len()));
                }
                // JSON has one number type: 6.2e16 may come back spelled as
                // the integer 62000000000000000. Same value, same f64 bits.
                let as_bits = |v: &Value| -> Vec<Option<u64>> {
                    v.as_array().map(|a| a.iter().map(|n| n.as_f64().map(f64::to_bits)).collect()).unwrap_or_default()
                };
                let zero = |bits: &Option<u64>| bits.map(f64::from_bits) == Some(0.0);
                let sent = as_bits(&event.actions.state_delta["values"]);
                let got = as_bits(&loaded.state["values"]);
                if sent.len() != got.len() || sent.iter().zip(&got).any(|(a, b)| a != b && !(zero(a) && zero(b))) {
                    wrong.push(format!("{what}: state values differ"));
                }
            }
            Err(e) => wrong.push(format!("{what}: get failed after a successful append: {e}")),
        }
    }
    wrong.truncate(10);
    assert!(wrong.is_empty(), "numbers do not read back exactly:\n{}", wrong.join("\n"));
}

pub async fn get_num_recent_events_keeps_the_last_n<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("recent");
    let session = create(&*store, &app, &user, "s", json!({})).await;
    let mut all = Vec::new();
    for _ in 0..5 {
        all.push(append(&*store, &session.key, Event::new("agent")).await.event.id);
    }
    let k = &session.key;
    assert_eq!(get_ids(&*store, k, None, None).await, all);
    assert_eq!(get_ids(&*store, k, Some(0), None).await, Vec::<String>::new(), "Some(0) is none");
    assert_eq!(get_ids(&*store, k, Some(1), None).await, all[4..]);
    assert_eq!(get_ids(&*store, k, Some(3), None).await, all[2..]);
    assert_eq!(get_ids(&*store, k, Some(5), None).await, all);
    assert_eq!(get_ids(&*store, k, Some(6), None).await, all);
    assert_eq!(get_ids(&*store, k, Some(usize::MAX), None).await, all);
    let none = store.get(k, GetOptions { num_recent_events: Some(0), after: None }).await.expect("get");
    assert_eq!(none.version, 5, "the version counts every event, whatever is returned");
}

pub async fn get_after_is_inclusive_to_the_nanosecond<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("after");
    let session = create(&*store, &app, &user, "s", json!({})).await;
    let t = base_time();
    let offsets = [ns(0), ns(1), ns(2), TimeDelta::microseconds(1), TimeDelta::seconds(1)];
    let mut all = Vec::new();
    for offset in offsets {
        all.push(append(&*store, &session.key, event_at(t + offset)).await.event.id);
    }
    let k = &session.key;
    let cases: [(DateTime<Utc>, &[String]); 9] = [
        (t, &all),
        (t + ns(1), &all[1..]),
        (t + ns(2), &all[2..]),
        (t + ns(3), &all[3..]),
        (t + TimeDelta::microseconds(1), &all[3..]),
        (t + TimeDelta::microseconds(1) + ns(1), &all[4..]),
        (t + TimeDelta::seconds(1), &all[4..]),
        (t + TimeDelta::seconds(1) + ns(1), &[]),
        (t - ns(1), &all),
    ];
    for (after, expected) in cases {
        assert_eq!(get_ids(&*store, k, None, Some(after)).await, expected, "after {after:?}");
    }
    assert_eq!(get_ids(&*store, k, None, Some(DateTime::<Utc>::MIN_UTC)).await, all);
    assert_eq!(get_ids(&*store, k, None, Some(DateTime::<Utc>::MAX_UTC)).await, Vec::<String>::new());
    let loaded = store.get(k, GetOptions { num_recent_events: None, after: Some(t + ns(1)) }).await.expect("get");
    assert_eq!(loaded.events[0].timestamp, t + ns(1), "timestamps keep their nanoseconds");
}

pub async fn get_with_both_filters_returns_their_intersection<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("both");
    let session = create(&*store, &app, &user, "s", json!({})).await;
    let t = |ms: i64| base_time() + TimeDelta::milliseconds(ms);
    // Timestamps out of seq order: e0=t5 e1=t1 e2=t6 e3=t2 e4=t7 e5=t3.
    let mut all = Vec::new();
    for ms in [5, 1, 6, 2, 7, 3] {
        all.push(append(&*store, &session.key, event_at(t(ms))).await.event.id);
    }
    let k = &session.key;
    let pick = |idx: &[usize]| idx.iter().map(|&i| all[i].clone()).collect::<Vec<_>>();
    // At or after t5: e0, e2, e4; the 2 most recent of those by seq.
    assert_eq!(get_ids(&*store, k, Some(2), Some(t(5))).await, pick(&[2, 4]));
    assert_eq!(get_ids(&*store, k, Some(10), Some(t(5))).await, pick(&[0, 2, 4]));
    assert_eq!(get_ids(&*store, k, Some(0), Some(t(5))).await, pick(&[]));
    // At or after t3: e0, e2, e4, e5.
    assert_eq!(get_ids(&*store, k, Some(2), Some(t(3))).await, pick(&[4, 5]));
    assert_eq!(get_ids(&*store, k, Some(3), Some(t(3))).await, pick(&[2, 4, 5]));
    assert_eq!(get_ids(&*store, k, Some(1), Some(t(8))).await, pick(&[]));
    assert_eq!(get_ids(&*store, k, None, Some(t(6))).await, pick(&[2, 4]));
}

pub async fn get_missing_or_foreign_session_is_not_found<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("notfound");
    let mine = create(&*store, &app, &user, "mine", json!({"x": 1})).await;
    append(&*store, &mine.key, Event::new("agent")).await;
    let missing = key(&app, &user, "never-created");
    let foreign_user = key(&app, &other_user(&user), "mine");
    let foreign_app = key(&other_app(&app), &user, "mine");
    for k in [&missing, &foreign_user, &foreign_app] {
        expect_not_found(store.get(k, GetOptions::default()).await, k, "get");
        expect_not_found(store.get(k, GetOptions { num_recent_events: Some(1), after: None }).await, k, "get");
        expect_not_found(store.append(k, Event::new("agent"), AppendOptions::default()).await, k, "append");
        store.delete(k).await.expect("deleting what is not there");
    }
    assert!(list_all(&*store, &app, &other_user(&user)).await.is_empty());
    let still = get(&*store, &mine.key).await;
    assert_eq!((still.version, still.events.len(), still.state), (1, 1, obj(json!({"x": 1}))));
}

pub async fn get_during_concurrent_appends_sees_one_consistent_version<F: StoreFactory>(f: &F) {
    const APPENDS: u64 = 200;
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("snapshot");
    let session = create(&*store, &app, &user, "s", json!({})).await;
    let writer = {
        let (store, key) = (store.clone(), session.key.clone());
        tokio::spawn(async move {
            let mut ids = Vec::new();
            for n in 1..=APPENDS {
                let mut event = ev(json!({ "n": n }));
                event.id = format!("e{n:04}");
                ids.push(store.append(&key, event, AppendOptions::default()).await.expect("append").event.id);
            }
            ids
        })
    };
    let mut reads = 0;
    loop {
        let finished = writer.is_finished();
        let loaded = get(&*store, &session.key).await;
        let version = loaded.version;
        assert_eq!(loaded.events.len() as u64, version, "events and version describe one moment");
        let expected: Vec<String> = (1..=version).map(|n| format!("e{n:04}")).collect();
        assert_eq!(ids(&loaded.events), expected, "a gapless prefix of the log");
        if version > 0 {
            assert_eq!(loaded.state["n"], json!(version), "the state is the one of the last event returned");
        }
        let recent =
            store.get(&session.key, GetOptions { num_recent_events: Some(2), after: None }).await.expect("get");
        let tail: Vec<String> =
            (recent.version.saturating_sub(1).max(1)..=recent.version).map(|n| format!("e{n:04}")).collect();
        assert_eq!(ids(&recent.events), if recent.version == 0 { Vec::new() } else { tail }, "the newest events");
        reads += 1;
        if finished {
            break;
        }
    }
    let written = writer.await.expect("writer");
    assert_eq!(written.len() as u64, APPENDS);
    assert!(reads > 1);
    assert_eq!(get(&*store, &session.key).await.version, APPENDS);
}

pub async fn expired_sessions_are_not_found_not_listed_and_refuse_appends<F: StoreFactory>(f: &F) {
    let ttl = Duration::from_millis(500);
    let store = f.store(StoreConfig { default_ttl: Some(ttl), max_session_lifetime: None }).await;
    let (app, user) = names("expiry");
    let short = create(&*store, &app, &user, "short", json!({})).await;
    assert_eq!(short.expires_at, Some(short.created_at + TimeDelta::milliseconds(500)), "default ttl");
    let long = store
        .create(CreateSession::new(app.clone(), user.clone()).with_id("long").with_ttl(Duration::from_secs(3600)))
        .await
        .expect("create with ttl");
    assert_eq!(long.expires_at, Some(long.created_at + TimeDelta::hours(1)), "a request's ttl wins");
    append(&*store, &short.key, Event::new("agent")).await;
    assert_eq!(list_all(&*store, &app, &user).await.len(), 2);

    tokio::time::sleep(ttl + Duration::from_millis(400)).await;
    expect_not_found(store.get(&short.key, GetOptions::default()).await, &short.key, "get expired");
    expect_not_found(
        store.append(&short.key, Event::new("agent"), AppendOptions::default()).await,
        &short.key,
        "append to expired",
    );
    assert_eq!(session_ids(&list_all(&*store, &app, &user).await), vec!["long".to_owned()], "expired not listed");
    assert_eq!(get(&*store, &long.key).await.version, 0);
}

// ---------------------------------------------------------------------------
// append

pub async fn append_does_not_store_partial_events<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("partial");
    let session = create(&*store, &app, &user, "s", json!({})).await;
    let mut chunk = ev(json!({"a": 1, "user:p": 1, "app:p": 1, "temp:t": 1}));
    chunk.partial = Some(true);
    let answer = append(&*store, &session.key, chunk.clone()).await;
    assert_eq!(answer, Appended { event: chunk, seq: None, replayed: false, last_update_time: None });
    let loaded = get(&*store, &session.key).await;
    assert_eq!(loaded, session, "a partial event changes nothing");
    let sibling = create(&*store, &app, &user, "sibling", json!({})).await;
    assert_eq!(sibling.state, State::new(), "nor the shared scopes");

    let mut done = ev(json!({"a": 2}));
    done.partial = Some(false);
    assert_eq!(append(&*store, &session.key, done).await.seq, Some(1), "partial: false is stored");
}

pub async fn append_strips_temp_keys<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("temp");
    let session = create(&*store, &app, &user, "s", json!({})).await;
    let event = ev(json!({"temp:scratch": "x", "kept": 1, "user:u": 2, "app:a": 3, "temp:other": {"y": 1}}));
    let answer = append(&*store, &session.key, event.clone()).await;
    let without = obj(json!({"kept": 1, "user:u": 2, "app:a": 3}));
    assert_eq!(answer.event.actions.state_delta, without, "the answer carries the stored delta");
    assert_eq!(answer.event.id, event.id);
    let loaded = get(&*store, &session.key).await;
    assert_eq!(loaded.events[0].actions.state_delta, without, "the stored event has no temp: keys");
    assert_eq!(loaded.state, without, "nor does the state");
    let sibling = create(&*store, &app, &user, "sibling", json!({})).await;
    assert_eq!(sibling.state, obj(json!({"user:u": 2, "app:a": 3})));
}

pub async fn append_assigns_gapless_sequence_numbers<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("seq");
    let session = create(&*store, &app, &user, "s", json!({})).await;
    let other = create(&*store, &app, &user, "other", json!({})).await;
    for expected in 1..=5u64 {
        let answer = append(&*store, &session.key, Event::new("agent")).await;
        assert_eq!((answer.seq, answer.replayed), (Some(expected), false));
        assert!(answer.last_update_time.is_some());
    }
    assert_eq!(append(&*store, &other.key, Event::new("agent")).await.seq, Some(1), "seq is per session");
    let loaded = get(&*store, &session.key).await;
    assert_eq!((loaded.version, loaded.events.len()), (5, 5));
    assert_eq!(get(&*store, &other.key).await.version, 1);
}

pub async fn append_merges_state_deltas_shallowly<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("merge");
    let session = create(
        &*store,
        &app,
        &user,
        "s",
        json!({"nested": {"x": 1, "y": 2}, "gone": 1, "keep": "k", "user:nested": {"p": 1, "q": 2}, "user:gone": 1}),
    )
    .await;
    append(
        &*store,
        &session.key,
        ev(json!({"nested": {"x": 9}, "gone": null, "user:nested": {"p": 9}, "user:gone": null, "new": [1, 2]})),
    )
    .await;
    let expected = obj(json!({
        "nested": {"x": 9}, "gone": null, "keep": "k", "new": [1, 2], "user:nested": {"p": 9}, "user:gone": null
    }));
    let loaded = get(&*store, &session.key).await;
    assert_eq!(loaded.state, expected, "a value replaces (no deep merge) and JSON null is stored");
    assert_eq!(loaded.state.get("gone"), Some(&Value::Null), "null is a stored value, not a deletion");

    let answer = append(&*store, &session.key, ev(json!({}))).await;
    assert_eq!(answer.seq, Some(2));
    let loaded = get(&*store, &session.key).await;
    assert_eq!((loaded.version, &loaded.state), (2, &expected), "an empty delta leaves the state");
}

pub async fn append_routes_app_and_user_deltas_to_their_scopes<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("scopes");
    let a = create(&*store, &app, &user, "a", json!({})).await;
    let b = create(&*store, &app, &user, "b", json!({})).await;
    let c = create(&*store, &app, &other_user(&user), "c", json!({})).await;
    let d = create(&*store, &other_app(&app), &user, "d", json!({})).await;
    append(&*store, &a.key, ev(json!({"app:theme": "dark", "user:lang": "fr", "mine": 1}))).await;

    let expect = [
        (&a, json!({"app:theme": "dark", "user:lang": "fr", "mine": 1})),
        (&b, json!({"app:theme": "dark", "user:lang": "fr"})),
        (&c, json!({"app:theme": "dark"})),
        (&d, json!({})),
    ];
    for (session, state) in expect {
        assert_eq!(get(&*store, &session.key).await.state, obj(state), "{}", session.key);
    }
    // A user delta from another user's session does not reach this user.
    append(&*store, &c.key, ev(json!({"user:lang": "de", "app:theme": "light"}))).await;
    assert_eq!(get(&*store, &b.key).await.state, obj(json!({"app:theme": "light", "user:lang": "fr"})));
    assert_eq!(get(&*store, &c.key).await.state, obj(json!({"app:theme": "light", "user:lang": "de"})));
}

pub async fn append_update_time_never_moves_backwards<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("clock");
    let session = create(&*store, &app, &user, "s", json!({})).await;
    let mut previous = session.last_update_time;
    for _ in 0..20 {
        let answer = append(&*store, &session.key, Event::new("agent")).await;
        let at = answer.last_update_time.expect("a stored append reports its update time");
        assert!(at >= previous, "update time went back from {previous} to {at}");
        previous = at;
    }
    let loaded = get(&*store, &session.key).await;
    assert_eq!(loaded.last_update_time, previous, "get reports the last append's update time");
    assert_eq!(loaded.created_at, session.created_at, "created_at never moves");
    assert!(loaded.last_update_time > session.created_at, "appends move the update time");
}

pub async fn append_retry_of_a_stored_event_is_replayed<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("replay");
    let session = create(&*store, &app, &user, "s", json!({})).await;
    let first = ev(json!({"n": 1, "user:seen": 1, "temp:t": 1}));
    let stored = append(&*store, &session.key, first.clone()).await;
    assert_eq!((stored.seq, stored.replayed), (Some(1), false));
    let second = append(&*store, &session.key, ev(json!({"n": 2, "user:seen": 2}))).await;
    assert_eq!(second.seq, Some(2));

    let retry = append(&*store, &session.key, first.clone()).await;
    assert!(retry.replayed, "a retry is reported as a replay");
    assert_eq!(retry.seq, Some(1), "with the stored seq");
    assert_eq!(retry.event, stored.event, "and the stored event");
    // A retry carries the options of the first attempt.
    let retry = append_expecting(&*store, &session.key, first.clone(), 0).await.expect("retry with its version");
    assert_eq!((retry.replayed, retry.seq), (true, Some(1)));

    let loaded = get(&*store, &session.key).await;
    assert_eq!(loaded.version, 2, "nothing was added");
    assert_eq!(loaded.events, vec![stored.event, second.event]);
    assert_eq!(loaded.state, obj(json!({"n": 2, "user:seen": 2})), "the retry's delta was not applied again");
}

pub async fn append_same_id_with_different_content_is_duplicate_event<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("dupevent");
    let session = create(&*store, &app, &user, "s", json!({})).await;
    let original = ev(json!({"n": 1}));
    let stored = append(&*store, &session.key, original.clone()).await.event;

    let mut other_content = original.clone();
    other_content.content = Some(json!({"parts": [{"text": "different"}]}));
    other_content.actions.state_delta = obj(json!({"n": 99, "user:x": 1}));
    let mut other_time = original.clone();
    other_time.timestamp += ns(1);
    let mut other_author = original.clone();
    other_author.author = "someone-else".into();
    for changed in [other_content, other_time, other_author] {
        let result = store.append(&session.key, changed, AppendOptions::default()).await;
        assert!(
            matches!(&result, Err(StoreError::DuplicateEvent { key, event_id }) if *key == session.key && *event_id == original.id),
            "{result:?}"
        );
    }
    let loaded = get(&*store, &session.key).await;
    assert_eq!((loaded.version, loaded.events), (1, vec![stored]));
    assert_eq!(loaded.state, obj(json!({"n": 1})), "nothing of the duplicate was applied");
}

pub async fn append_expected_version_detects_stale_sessions<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("stale");
    let session = create(&*store, &app, &user, "s", json!({})).await;
    let first = append_expecting(&*store, &session.key, Event::new("agent"), 0).await.expect("expected 0 at 0");
    assert_eq!(first.seq, Some(1));

    let late = ev(json!({"x": 1, "user:x": 1, "app:x": 1}));
    for expected in [0, 7] {
        let result = append_expecting(&*store, &session.key, late.clone(), expected).await;
        assert!(
            matches!(&result, Err(StoreError::StaleSession { key, expected: e, actual: 1 }) if *key == session.key && *e == expected),
            "expected {expected}: {result:?}"
        );
    }
    let loaded = get(&*store, &session.key).await;
    assert_eq!(loaded.version, 1, "nothing written");
    assert_eq!(ids(&loaded.events), vec![first.event.id.clone()]);
    assert_eq!(loaded.state, State::new(), "no delta of a stale append, in any scope");

    // The refused event was not stored: it appends as new, not as a replay.
    let now = append_expecting(&*store, &session.key, late, 1).await.expect("expected 1 at 1");
    assert_eq!((now.seq, now.replayed), (Some(2), false));
    assert_eq!(append(&*store, &session.key, Event::new("agent")).await.seq, Some(3), "no expectation");
}

pub async fn append_to_a_missing_session_is_not_found<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("appendmissing");
    let missing = key(&app, &user, "missing");
    expect_not_found(
        store.append(&missing, ev(json!({"user:x": 1})), AppendOptions::default()).await,
        &missing,
        "append",
    );
    expect_not_found(append_expecting(&*store, &missing, Event::new("agent"), 0).await, &missing, "append");
    let deleted = create(&*store, &app, &user, "deleted", json!({})).await;
    store.delete(&deleted.key).await.expect("delete");
    expect_not_found(
        store.append(&deleted.key, Event::new("agent"), AppendOptions::default()).await,
        &deleted.key,
        "append",
    );
    // Nothing of the refused appends was written anywhere.
    let fresh = create(&*store, &app, &user, "fresh", json!({})).await;
    assert_eq!(fresh.state, State::new());
    assert_eq!(session_ids(&list_all(&*store, &app, &user).await), vec!["fresh".to_owned()]);
}

pub async fn append_past_the_max_lifetime_is_refused<F: StoreFactory>(f: &F) {
    let lifetime = Duration::from_millis(1000);
    let store = f.store(StoreConfig { default_ttl: None, max_session_lifetime: Some(lifetime) }).await;
    let (app, user) = names("lifetime");
    let session = create(&*store, &app, &user, "s", json!({})).await;
    let first = ev(json!({"n": 1}));
    let stored = append(&*store, &session.key, first.clone()).await;
    assert_eq!(stored.seq, Some(1), "young sessions take appends");

    tokio::time::sleep(lifetime + Duration::from_millis(300)).await;
    let result = store.append(&session.key, ev(json!({"n": 2, "user:n": 2})), AppendOptions::default()).await;
    assert!(
        matches!(&result, Err(StoreError::LifetimeExceeded { key, max_lifetime }) if *key == session.key && *max_lifetime == lifetime),
        "{result:?}"
    );
    let loaded = get(&*store, &session.key).await;
    assert_eq!((loaded.version, loaded.state), (1, obj(json!({"n": 1}))), "still readable, nothing written");
    // A retry of an append that was stored in time is still answered.
    let retry = append(&*store, &session.key, first).await;
    assert_eq!((retry.replayed, retry.seq), (true, Some(1)));
    // New sessions are young again.
    let young = create(&*store, &app, &user, "young", json!({})).await;
    assert_eq!(append(&*store, &young.key, Event::new("agent")).await.seq, Some(1));
}

// ---------------------------------------------------------------------------
// list

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

// ---------------------------------------------------------------------------
// delete

pub async fn delete_is_idempotent<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("deleteidem");
    let never = key(&app, &user, "never");
    store.delete(&never).await.expect("deleting a never-created session");
    store.delete(&never).await.expect("and again");
    let session = create(&*store, &app, &user, "s", json!({})).await;
    append(&*store, &session.key, Event::new("agent")).await;
    store.delete(&session.key).await.expect("delete");
    store.delete(&session.key).await.expect("delete again");
    expect_not_found(store.get(&session.key, GetOptions::default()).await, &session.key, "get deleted");
    assert!(list_all(&*store, &app, &user).await.is_empty());
}

pub async fn delete_removes_events_and_keeps_app_and_user_state<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("delete");
    let gone = create(&*store, &app, &user, "gone", json!({"s": 1})).await;
    let first = ev(json!({"user:kept": 1, "app:kept": 2, "local": 3}));
    append(&*store, &gone.key, first.clone()).await;
    append(&*store, &gone.key, Event::new("agent")).await;
    append(&*store, &gone.key, Event::new("agent")).await;
    let stays = create(&*store, &app, &user, "stays", json!({})).await;

    store.delete(&gone.key).await.expect("delete");
    expect_not_found(store.get(&gone.key, GetOptions::default()).await, &gone.key, "get deleted");
    assert_eq!(session_ids(&list_all(&*store, &app, &user).await), ["stays"]);
    let shared = obj(json!({"user:kept": 1, "app:kept": 2}));
    assert_eq!(get(&*store, &stays.key).await.state, shared, "app and user state stay");

    // The id is free again, and nothing of the old session comes back.
    let again = create(&*store, &app, &user, "gone", json!({})).await;
    assert_eq!((again.version, again.events.len(), &again.state), (0, 0, &shared));
    let loaded = get(&*store, &again.key).await;
    assert_eq!((loaded.version, loaded.events.len()), (0, 0), "the events went with the session");
    // The old first event's id is unused: it stores as new, not a replay.
    let answer = append(&*store, &again.key, first).await;
    assert_eq!((answer.seq, answer.replayed), (Some(1), false));
    assert_eq!(get(&*store, &again.key).await.events.len(), 1);
}

// ---------------------------------------------------------------------------
// bad input

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

// ---------------------------------------------------------------------------
// concurrency

pub async fn concurrent_appends_to_one_session_are_gapless<F: StoreFactory>(f: &F) {
    const TASKS: usize = 16;
    const PER_TASK: usize = 50;
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("gapless");
    let session = create(&*store, &app, &user, "s", json!({})).await;
    let barrier = Arc::new(Barrier::new(TASKS));
    let mut tasks = JoinSet::new();
    for task in 0..TASKS {
        let (store, key, barrier) = (store.clone(), session.key.clone(), barrier.clone());
        tasks.spawn(async move {
            barrier.wait().await;
            let mut answers = Vec::with_capacity(PER_TASK);
            for i in 0..PER_TASK {
                let event = ev(json!({ format!("t{task}"): i }));
                let answer = store.append(&key, event, AppendOptions::default()).await.expect("concurrent append");
                assert!(!answer.replayed);
                answers.push((answer.seq.expect("stored"), answer.event.id, answer.last_update_time.expect("time")));
            }
            answers
        });
    }
    let mut by_seq = BTreeMap::new();
    while let Some(answers) = tasks.join_next().await {
        for (seq, id, at) in answers.expect("append task") {
            assert!(by_seq.insert(seq, (id, at)).is_none(), "seq {seq} handed out twice");
        }
    }
    let total = (TASKS * PER_TASK) as u64;
    assert_eq!(by_seq.keys().copied().collect::<Vec<_>>(), (1..=total).collect::<Vec<_>>(), "seqs 1..=800");
    let times: Vec<_> = by_seq.values().map(|(_, at)| *at).collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "update times follow seq order, never backwards");

    let loaded = get(&*store, &session.key).await;
    assert_eq!(loaded.version, total);
    let expected_ids: Vec<String> = by_seq.values().map(|(id, _)| id.clone()).collect();
    assert_eq!(ids(&loaded.events), expected_ids, "get returns every event in seq order");
    assert_eq!(loaded.last_update_time, *times.last().expect("times"));
    let expected_state: State = (0..TASKS).map(|t| (format!("t{t}"), json!(PER_TASK - 1))).collect();
    assert_eq!(loaded.state, expected_state, "every task's last delta is in the state");
}

pub async fn concurrent_shared_state_merges_lose_no_update<F: StoreFactory>(f: &F) {
    const TASKS: usize = 8;
    const PER_TASK: usize = 50;
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("lostupdate");
    // Creates with initial user and app state, all at once.
    let barrier = Arc::new(Barrier::new(TASKS));
    let mut creates = JoinSet::new();
    for task in 0..TASKS {
        let (store, app, user, barrier) = (store.clone(), app.clone(), user.clone(), barrier.clone());
        creates.spawn(async move {
            let state = obj(json!({ format!("user:created_{task}"): true, format!("app:created_{task}"): true }));
            barrier.wait().await;
            store
                .create(CreateSession::new(app, user).with_id(format!("s{task}")).with_state(state))
                .await
                .expect("concurrent create")
                .key
        });
    }
    let mut keys = Vec::new();
    while let Some(key) = creates.join_next().await {
        keys.push(key.expect("create task"));
    }
    keys.sort();

    // Every task on its own session, writing its own keys of the shared scopes.
    let barrier = Arc::new(Barrier::new(TASKS));
    let mut appends = JoinSet::new();
    for (task, key) in keys.iter().cloned().enumerate() {
        let (store, barrier) = (store.clone(), barrier.clone());
        appends.spawn(async move {
            barrier.wait().await;
            for j in 0..PER_TASK {
                let delta = json!({ format!("user:task_{task}"): j, format!("app:task_{task}"): j, "own": j });
                store.append(&key, ev(delta), AppendOptions::default()).await.expect("concurrent append");
            }
        });
    }
    while let Some(done) = appends.join_next().await {
        done.expect("append task");
    }

    let mut expected = State::new();
    for task in 0..TASKS {
        expected.insert(format!("user:task_{task}"), json!(PER_TASK - 1));
        expected.insert(format!("app:task_{task}"), json!(PER_TASK - 1));
        expected.insert(format!("user:created_{task}"), json!(true));
        expected.insert(format!("app:created_{task}"), json!(true));
    }
    expected.insert("own".into(), json!(PER_TASK - 1));
    for key in &keys {
        let loaded = get(&*store, key).await;
        assert_eq!(loaded.version, PER_TASK as u64);
        let missing: Vec<_> = expected.keys().filter(|k| loaded.state.get(*k) != expected.get(*k)).collect();
        assert!(missing.is_empty(), "{key}: lost or wrong keys {missing:?} in {:?}", loaded.state);
        assert_eq!(loaded.state, expected);
    }
}

/// 8 tasks × 50 increments of one `user:` counter: read the session, write
/// counter + 1 with the version read as the expected version, retry on
/// `StaleSession`. The version check and the write are one atomic step, so
/// the counter ends at exactly 400: no increment lost, none applied twice.
pub async fn concurrent_increments_of_a_user_counter_reach_exactly_400<F: StoreFactory>(f: &F) {
    const TASKS: usize = 8;
    const PER_TASK: usize = 50;
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("counter");
    let session = create(&*store, &app, &user, "s", json!({"user:counter": 0})).await;
    let barrier = Arc::new(Barrier::new(TASKS));
    let mut tasks = JoinSet::new();
    for _ in 0..TASKS {
        let (store, key, barrier) = (store.clone(), session.key.clone(), barrier.clone());
        tasks.spawn(async move {
            barrier.wait().await;
            let mut stale = 0u32;
            for _ in 0..PER_TASK {
                loop {
                    let seen = store
                        .get(&key, GetOptions { num_recent_events: Some(0), after: None })
                        .await
                        .expect("read the counter");
                    let counter = seen.state["user:counter"].as_u64().expect("a number");
                    let options = AppendOptions { expected_version: Some(seen.version) };
                    match store.append(&key, ev(json!({ "user:counter": counter + 1 })), options).await {
                        Ok(_) => break,
                        Err(StoreError::StaleSession { .. }) => stale += 1,
                        Err(other) => panic!("increment failed: {other:?}"),
                    }
                }
            }
            stale
        });
    }
    let mut stale = 0;
    while let Some(done) = tasks.join_next().await {
        stale += done.expect("increment task");
    }
    let loaded = get(&*store, &session.key).await;
    assert_eq!(loaded.state["user:counter"], json!(TASKS * PER_TASK), "after {stale} stale retries");
    assert_eq!(loaded.version, (TASKS * PER_TASK) as u64);
}

pub async fn concurrent_appends_with_one_expected_version_store_exactly_one<F: StoreFactory>(f: &F) {
    const ROUNDS: u64 = 10;
    const WRITERS: usize = 4;
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("race");
    let session = create(&*store, &app, &user, "s", json!({})).await;
    let mut winners = Vec::new();
    for version in 0..ROUNDS {
        let barrier = Arc::new(Barrier::new(WRITERS));
        let mut tasks = JoinSet::new();
        for writer in 0..WRITERS {
            let (store, key, barrier) = (store.clone(), session.key.clone(), barrier.clone());
            tasks.spawn(async move {
                let event = ev(json!({ "winner": writer, format!("user:w{version}_{writer}"): true }));
                let id = event.id.clone();
                barrier.wait().await;
                (id, store.append(&key, event, AppendOptions { expected_version: Some(version) }).await)
            });
        }
        let mut stored = Vec::new();
        let mut stale = 0;
        while let Some(outcome) = tasks.join_next().await {
            match outcome.expect("writer task") {
                (id, Ok(answer)) => {
                    assert_eq!((answer.seq, answer.replayed), (Some(version + 1), false));
                    stored.push(id);
                }
                (_, Err(StoreError::StaleSession { expected, actual, .. })) => {
                    assert_eq!((expected, actual), (version, version + 1));
                    stale += 1;
                }
                (_, Err(other)) => panic!("round {version}: unexpected {other}"),
            }
        }
        assert_eq!((stored.len(), stale), (1, WRITERS - 1), "round {version}: exactly one writer wins");
        winners.extend(stored);
    }
    let loaded = get(&*store, &session.key).await;
    assert_eq!(loaded.version, ROUNDS);
    assert_eq!(ids(&loaded.events), winners, "only the winners' events are stored");
    let user_keys = loaded.state.keys().filter(|k| k.starts_with("user:")).count();
    assert_eq!(user_keys, ROUNDS as usize, "only the winners' deltas were applied");
}

pub async fn concurrent_retries_of_one_event_store_it_once<F: StoreFactory>(f: &F) {
    const RETRIES: usize = 8;
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("retries");
    let session = create(&*store, &app, &user, "s", json!({})).await;
    for round in 0..5u64 {
        let event = ev(json!({ "round": round, "user:rounds": round }));
        let barrier = Arc::new(Barrier::new(RETRIES));
        let mut tasks = JoinSet::new();
        for _ in 0..RETRIES {
            let (store, key, barrier, event) = (store.clone(), session.key.clone(), barrier.clone(), event.clone());
            tasks.spawn(async move {
                barrier.wait().await;
                store.append(&key, event, AppendOptions::default()).await.expect("retry")
            });
        }
        let mut fresh = 0;
        while let Some(answer) = tasks.join_next().await {
            let answer = answer.expect("retry task");
            assert_eq!(answer.seq, Some(round + 1), "every retry answers with the one seq");
            assert_eq!(answer.event, event);
            if !answer.replayed {
                fresh += 1;
            }
        }
        assert_eq!(fresh, 1, "round {round}: exactly one append stored the event");
    }
    let loaded = get(&*store, &session.key).await;
    assert_eq!((loaded.version, loaded.events.len()), (5, 5));
}

pub async fn concurrent_creates_of_one_id_make_one_session<F: StoreFactory>(f: &F) {
    const CREATORS: usize = 8;
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("createrace");
    for return_existing in [false, true] {
        let id = format!("race-{return_existing}");
        let barrier = Arc::new(Barrier::new(CREATORS));
        let mut tasks = JoinSet::new();
        for creator in 0..CREATORS {
            let (store, app, user, barrier, id) =
                (store.clone(), app.clone(), user.clone(), barrier.clone(), id.clone());
            tasks.spawn(async move {
                let user_key = format!("user:{id}_c{creator}");
                let mut request = CreateSession::new(app, user)
                    .with_id(id)
                    .with_state(obj(json!({ "creator": creator, user_key: true })));
                if return_existing {
                    request = request.return_existing();
                }
                barrier.wait().await;
                store.create(request).await
            });
        }
        let mut sessions = Vec::new();
        let mut taken = 0;
        while let Some(outcome) = tasks.join_next().await {
            match outcome.expect("create task") {
                Ok(session) => sessions.push(session),
                Err(StoreError::AlreadyExists(k)) if k.session_id.as_str() == id => taken += 1,
                Err(other) => panic!("unexpected {other}"),
            }
        }
        let stored = get(&*store, &key(&app, &user, &id)).await;
        let winner = stored.state["creator"].clone();
        if return_existing {
            assert_eq!(sessions.len(), CREATORS, "return_existing: every creator gets the session");
            assert!(sessions.iter().all(|s| s.created_at == stored.created_at && s.state["creator"] == winner));
        } else {
            assert_eq!((sessions.len(), taken), (1, CREATORS - 1), "exactly one create wins");
            assert_eq!(sessions[0].created_at, stored.created_at);
        }
        // Only the winner's initial user state was applied.
        let winner_key = format!("user:{id}_c{}", winner.as_u64().expect("creator number"));
        let user_keys: Vec<&String> = stored.state.keys().filter(|k| k.starts_with(&format!("user:{id}_"))).collect();
        assert_eq!(user_keys, [&winner_key], "only the winning create wrote user state");
    }
    let listed = session_ids(&list_all(&*store, &app, &user).await);
    assert_eq!(listed.len(), 2, "{listed:?}");
}

pub async fn find_by_id_finds_live_sessions_across_users_and_apps<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("findbyid");
    let unique = format!("unique-{}", uuid::Uuid::new_v4());
    let shared = format!("shared-{}", uuid::Uuid::new_v4());
    let one = create(&*store, &app, &user, &unique, json!({})).await;
    create(&*store, &app, &user, &shared, json!({})).await;
    create(&*store, &other_app(&app), &other_user(&user), &shared, json!({})).await;

    let found = store.find_by_id(&one.key.session_id, 2).await.expect("find");
    assert_eq!(found, vec![one.key.clone()]);
    let ambiguous = store.find_by_id(&SessionId::new(shared.clone()).expect("id"), 2).await.expect("find");
    assert_eq!(ambiguous.len(), 2, "{ambiguous:?}");
    assert_eq!(store.find_by_id(&SessionId::new(shared).expect("id"), 1).await.expect("find").len(), 1);
    let nowhere = SessionId::new(format!("nowhere-{}", uuid::Uuid::new_v4())).expect("id");
    assert!(store.find_by_id(&nowhere, 2).await.expect("find").is_empty());

    let expiring = format!("expiring-{}", uuid::Uuid::new_v4());
    store
        .create(CreateSession::new(app.clone(), user.clone()).with_id(&expiring).with_ttl(Duration::from_millis(1)))
        .await
        .expect("create");
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(store.find_by_id(&SessionId::new(expiring).expect("id"), 2).await.expect("find").is_empty());
}

pub async fn rewind_keeps_the_first_events_and_rebuilds_session_state<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("rewind");
    let session = create(&*store, &app, &user, "s", json!({})).await;
    let mut appended = Vec::new();
    for i in 1..=5 {
        let delta = json!({ "step": i, format!("only_{i}"): true, "user:seen": i, "temp:scratch": i });
        appended.push(append(&*store, &session.key, ev(delta)).await.event);
    }
    let rewound = store.rewind(&session.key, 2, Some(5)).await.expect("rewind");
    assert_eq!(rewound.version, 2);
    assert_eq!(ids(&rewound.events), ids(&appended[..2]));
    assert_eq!(rewound.state.get("step"), Some(&json!(2)));
    assert_eq!(rewound.state.get("only_1"), Some(&json!(true)));
    assert!(rewound.state.get("only_3").is_none(), "state of a forgotten event survived: {:?}", rewound.state);
    assert_eq!(rewound.state.get("user:seen"), Some(&json!(5)), "user state is shared and stays");
    assert!(rewound.state.keys().all(|k| !k.starts_with("temp:")));
    assert_eq!(get(&*store, &session.key).await, rewound, "the rewind is what a later read sees");

    let next = append(&*store, &session.key, ev(json!({}))).await;
    assert_eq!(next.seq, Some(3), "sequence numbers continue from the kept events");
    // A forgotten event id is free again.
    let reused = append(&*store, &session.key, appended[3].clone()).await;
    assert_eq!(reused.seq, Some(4));
    assert!(!reused.replayed);

    let emptied = store.rewind(&session.key, 0, None).await.expect("rewind to nothing");
    assert!(emptied.events.is_empty());
    assert_eq!(emptied.version, 0);
    assert!(emptied.state.keys().all(|k| k.starts_with("user:")), "{:?}", emptied.state);
}

pub async fn rewind_refuses_stale_versions_and_targets_past_the_end<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("rewindbad");
    let session = create(&*store, &app, &user, "s", json!({})).await;
    for i in 0..3 {
        append(&*store, &session.key, ev(json!({ "i": i }))).await;
    }
    let before = get(&*store, &session.key).await;
    let stale = store.rewind(&session.key, 1, Some(2)).await;
    assert!(matches!(stale, Err(StoreError::StaleSession { expected: 2, actual: 3, .. })), "{stale:?}");
    expect_invalid(store.rewind(&session.key, 4, None).await, |f| f == "keep", "rewind past the end");
    expect_not_found(store.rewind(&key(&app, &user, "missing"), 0, None).await, &key(&app, &user, "missing"), "rewind");
    assert_eq!(get(&*store, &session.key).await, before, "a refused rewind changed the session");
}

pub async fn rewind_starts_from_the_state_the_session_was_created_with<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("rewindinit");
    let session = create(&*store, &app, &user, "s", json!({"topic": "refunds", "step": 0, "user:tier": "gold"})).await;
    for i in 1..=3 {
        append(&*store, &session.key, ev(json!({ "step": i, format!("only_{i}"): true }))).await;
    }
    let rewound = store.rewind(&session.key, 1, None).await.expect("rewind");
    let expected = obj(json!({"topic": "refunds", "step": 1, "only_1": true, "user:tier": "gold"}));
    assert_eq!(rewound.state, expected, "initial state + the deltas of event 1");

    let emptied = store.rewind(&session.key, 0, None).await.expect("rewind to nothing");
    assert_eq!(emptied.state, obj(json!({"topic": "refunds", "step": 0, "user:tier": "gold"})), "the initial state");

    // A successor starts from the state its predecessor had when it closed.
    append(&*store, &session.key, ev(json!({"step": 9}))).await;
    let successor = store.rollover(&session.key, Some("next".into()), Event::new("summarizer")).await.expect("roll");
    append(&*store, &successor.key, ev(json!({"step": 10}))).await;
    let back = store.rewind(&successor.key, 1, None).await.expect("rewind the successor");
    assert_eq!(back.state, obj(json!({"topic": "refunds", "step": 9, "user:tier": "gold"})));
}

pub async fn rewind_to_the_current_version_changes_nothing<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("rewindnoop");
    let session = create(&*store, &app, &user, "s", json!({"topic": "a"})).await;
    for i in 1..=3 {
        append(&*store, &session.key, ev(json!({ "step": i }))).await;
    }
    let before = get(&*store, &session.key).await;
    let same = store.rewind(&session.key, 3, Some(3)).await.expect("rewind to the current version");
    assert_eq!(same, before, "state, events, version and update time unchanged");
    let untouched = store.rewind(&session.key, 3, None).await.expect("again, without a version");
    assert_eq!(untouched, before);
}

pub async fn retried_rewind_already_at_its_target_succeeds<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("rewindretry");
    let session = create(&*store, &app, &user, "s", json!({})).await;
    for i in 1..=5 {
        append(&*store, &session.key, ev(json!({ "step": i }))).await;
    }
    let first = store.rewind(&session.key, 2, Some(5)).await.expect("rewind");
    // The same call again, as a client does when the first reply was lost.
    let retried = store.rewind(&session.key, 2, Some(5)).await.expect("a retried rewind succeeds");
    assert_eq!(retried, first);
    // Once someone appended after the rewind, the retry is stale again.
    append(&*store, &session.key, ev(json!({"step": 6}))).await;
    let stale = store.rewind(&session.key, 2, Some(5)).await;
    assert!(matches!(stale, Err(StoreError::StaleSession { expected: 5, actual: 3, .. })), "{stale:?}");
}

pub async fn retried_rollover_returns_its_successor<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("rollretry");
    let session = create(&*store, &app, &user, "s", json!({"topic": "a"})).await;
    append(&*store, &session.key, ev(json!({"step": 1}))).await;
    let summary = Event::new("summarizer");
    let successor = store.rollover(&session.key, Some("next".into()), summary.clone()).await.expect("rollover");
    let retried = store.rollover(&session.key, Some("next".into()), summary.clone()).await.expect("retried rollover");
    assert_eq!(retried, successor, "the retry returns the successor it asked for");

    // The successor moved on; a late retry returns it as it is now.
    append(&*store, &successor.key, ev(json!({"step": 2}))).await;
    let late = store.rollover(&session.key, Some("next".into()), summary.clone()).await.expect("late retry");
    assert_eq!(late, get(&*store, &successor.key).await);
    assert_eq!(late.version, 2);

    // Another successor id is not a retry: the session is closed.
    let other = store.rollover(&session.key, Some("other".into()), summary).await;
    assert_eq!(
        other,
        Err(StoreError::SessionClosed { key: session.key.clone(), successor: Some(successor.key.session_id.clone()) })
    );
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

// ---------------------------------------------------------------------------
// app names that look alike

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
