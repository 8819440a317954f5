//! One conformance suite for every [`SessionStore`]: each case pins a line of
//! the semantics contract (docs/ARCHITECTURE.md, "The semantics contract"),
//! and the same cases run against the in-memory reference store and the
//! PostgreSQL store.
//!
//! A case is a `pub async fn` taking a [`StoreFactory`], in the file of the
//! operation it is about, and listed once in
//! [`conformance_tests!`](crate::conformance_tests), which runs every listed
//! case against one factory. A case asks its factory for one store (with the
//! [`StoreConfig`] it needs) and names its app and user uniquely, so cases
//! never see each other's data.
//!
//! The adapter's `SessionService` suite (crates/adk/tests/adk/suite.rs) is run the
//! same way, by [`adk_postgres_testing::contract_tests!`].

mod app_list;
mod append;
mod concurrency;
mod create;
mod delete;
mod erase;
mod find;
mod fork;
mod get;
mod lease;
mod list;
mod media;
mod metadata;
mod paging;
mod redact;
mod rewind_rollover;
mod scoped_state;
mod validation;

pub use app_list::*;
pub use append::*;
pub use concurrency::*;
pub use create::*;
pub use delete::*;
pub use erase::*;
pub use find::*;
pub use fork::*;
pub use get::*;
pub use lease::*;
pub use list::*;
pub use media::*;
pub use metadata::*;
pub use paging::*;
pub use redact::*;
pub use rewind_rollover::*;
pub use scoped_state::*;
pub use validation::*;

use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use adk_postgres_domain::session::MAX_PAGE_SIZE;
use adk_postgres_domain::{
    AppName, AppendOptions, Appended, CreateSession, Event, GetOptions, InMemoryStore, ListSessions, PageToken,
    Session, SessionId, SessionKey, SessionPage, SessionStore, SessionSummary, State, StoreConfig, StoreError, UserId,
};
use chrono::{DateTime, TimeDelta, TimeZone, Utc};
use serde_json::{Value, json};
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

/// Every conformance case against the store factory `$factory` (evaluated
/// once per test): one `#[tokio::test]` per case, named after it. A case not
/// listed here runs nowhere. With `requires CAPABILITY`, each case ends
/// early, saying so, on a server built without it.
#[macro_export]
macro_rules! conformance_tests {
    ($factory:expr $(, requires $capability:expr)?) => {
        $crate::testing::contract_tests!($crate::conformance => $factory $(, requires $capability)?;
            // create
            create_generates_a_uuid_v4_for_a_blank_or_absent_id,
            create_trims_ids,
            create_with_a_taken_id_is_already_exists_and_never_overwrites,
            create_return_existing_returns_the_existing_session,
            create_same_id_for_another_user_or_app_is_another_session,
            create_routes_initial_state_by_prefix,
            an_expired_sessions_id_is_free_at_once,
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
            // the invocation lease
            lease_refuses_other_invocations_until_the_holder_releases_it,
            lease_lapses_and_a_taken_over_holder_cannot_append,
            lease_is_ignored_by_appends_without_it_and_replays_still_answer,
            lease_refuses_bad_requests_with_nothing_written,
            racing_invocations_take_turns_and_never_interleave,
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
            // erase
            erase_user_removes_every_session_event_and_the_user_state,
            a_second_erasure_and_an_unknown_user_erase_nothing,
            erased_session_ids_are_free_and_nothing_comes_back,
            erase_user_matches_the_user_id_exactly,
            appends_racing_an_erasure_land_before_it_or_are_not_found,
            // find_by_id
            find_by_id_finds_live_sessions_across_users_and_apps,
            // rewind and rollover
            rewind_keeps_the_first_events_and_rebuilds_session_state,
            rewind_refuses_stale_versions_and_targets_past_the_end,
            rewind_starts_from_the_state_the_session_was_created_with,
            rewind_to_the_current_version_changes_nothing,
            retried_rewind_already_at_its_target_succeeds,
            retried_rollover_returns_its_successor,
            // fork
            fork_copies_the_first_events_and_rebuilds_session_state,
            fork_and_original_diverge_independently,
            fork_at_zero_or_at_the_end_and_with_a_generated_id,
            fork_refuses_bad_points_taken_ids_and_missing_sessions,
            fork_of_a_closed_session_is_open_and_expired_ones_are_not_found,
            fork_copies_the_display_name_and_labels,
            // media
            media_round_trips_exactly_past_the_event_limit,
            media_events_replay_and_conflict_like_any_event,
            what_is_left_of_a_media_event_still_meets_the_limit,
            forks_rewinds_and_deletes_keep_media_whole,
            // redact
            redact_replaces_content_and_every_text_and_keeps_identity_order_and_state,
            rewind_and_fork_see_the_tombstone_and_rebuild_the_same_state,
            redacting_the_state_delta_changes_what_rewind_rebuilds,
            redacting_twice_changes_nothing_unless_it_removes_the_state_delta,
            redact_refuses_bad_input_and_missing_targets_writing_nothing,
            a_retried_append_of_a_redacted_event_is_a_duplicate_and_appending_a_tombstone_is_refused,
            redactions_racing_appends_lose_no_append_and_keep_seq_gapless,
            // metadata
            create_with_metadata_shows_it_in_get_and_list,
            set_metadata_replaces_without_moving_version_or_update_time,
            bad_metadata_is_refused_naming_the_field_and_nothing_is_written,
            set_metadata_of_a_missing_or_expired_session_is_not_found,
            a_closed_session_can_be_renamed_and_its_successor_inherits_metadata,
            list_filters_by_labels_every_one_must_match,
            list_filters_by_an_updated_window_exact_to_the_nanosecond,
            list_filters_page_by_keyset_without_gaps_or_duplicates,
            list_refuses_bad_filters,
            // user and app state without a session
            scoped_state_reads_empty_then_round_trips_merges,
            a_direct_merge_shows_in_every_session_of_the_user_with_prefixes,
            direct_merges_treat_null_and_empty_deltas_as_an_append_does,
            bad_scope_deltas_are_refused_and_nothing_is_written,
            app_state_is_shared_by_users_and_user_state_is_per_user_and_app,
            direct_merges_racing_appends_lose_no_key,
            // list_events
            list_events_pages_forward_and_backward_without_gaps,
            list_events_refuses_bad_limits_and_missing_sessions,
            list_events_of_an_expired_session_is_not_found,
            list_events_during_concurrent_appends_is_gapless_and_in_order,
            // list_app_sessions
            list_app_sessions_spans_users_newest_created_first,
            list_app_sessions_pages_by_keyset_without_gaps_or_duplicates,
            list_app_sessions_filters_by_labels_and_update_window,
            list_app_sessions_refuses_bad_tokens_and_filters,
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
            concurrent_appends_with_one_expected_version_store_exactly_one,
            concurrent_retries_of_one_event_store_it_once,
            concurrent_creates_of_one_id_make_one_session,
        );
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
    // The same read with the events as JSON (the adk adapter's get) selects
    // the same events and returns the same session.
    let as_json = store
        .get_json(key, GetOptions { num_recent_events, after })
        .await
        .and_then(|read| read.into_session())
        .unwrap_or_else(|e| panic!("get_json {key} ({num_recent_events:?}, {after:?}): {e}"));
    assert_eq!(as_json, session, "get_json {key} ({num_recent_events:?}, {after:?})");
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
    store
        .append(key, event, AppendOptions { expected_version: Some(expected_version), ..AppendOptions::default() })
        .await
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
