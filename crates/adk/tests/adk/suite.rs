//! A contract suite for `adk_session::SessionService`, written from the
//! trait's documentation and adk-core's state-scope rules (not from
//! adk-session's tests).
//!
//! Two groups:
//! - `core`: what the trait and adk-core document — every backend should
//!   pass these, and adk-session's `InMemorySessionService` does in CI;
//! - `strict`: what a durable, concurrent production store must also
//!   guarantee (docs/ARCHITECTURE.md, "The semantics contract"): no
//!   overwrite on a taken id, adk-core key validation, `session.not_found`
//!   everywhere, idempotent retried appends, no lost `user:` updates, no
//!   guessing on ambiguous ids, live state in listings, time that never runs
//!   backwards.
//!
//! A case is a `pub async fn` taking `&Service`, listed once in
//! [`with_cases!`]; it names its app and users uniquely (so cases can share a
//! database and a service) and panics on a broken promise. The test binaries
//! run the list with `adk_postgres_testing::contract_tests!`, as the store's
//! conformance suite (tests/src/conformance) is run.

#![allow(dead_code)] // Each test binary uses a different subset.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use adk_core::{Content, ErrorCategory, FinishReason, Part, UsageMetadata};
use adk_session::{
    AppendEventRequest, CreateRequest, DeleteRequest, Event, GetRequest, ListRequest, Session, SessionService,
};
use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use futures_util::future::BoxFuture;
use serde_json::{Value, json};

pub type Service = Arc<dyn SessionService>;

/// Which group a case belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Group {
    Core,
    Strict,
}

/// One case, runnable against any service (for the comparison table).
#[derive(Debug)]
pub struct Case {
    pub name: &'static str,
    pub group: Group,
    pub run: fn(Service) -> BoxFuture<'static, ()>,
}

/// Calls `$callback! { <args> core: [...] strict: [...] }` with every case
/// name, so the test binaries and the comparison table share one list.
macro_rules! with_cases {
    ($callback:ident ! { $($args:tt)* }) => {
        $callback! { $($args)*
            core: [
                create_without_id_generates_a_unique_id,
                create_with_id_keeps_it,
                create_routes_initial_state_by_prefix_and_drops_temp,
                append_routes_the_state_delta_by_scope_and_drops_temp,
                get_returns_events_in_append_order_exactly,
                get_num_recent_events_returns_the_last_n,
                get_after_is_inclusive_and_exact_to_the_nanosecond,
                get_recent_and_after_together_intersect,
                get_missing_session_is_session_not_found,
                sessions_are_isolated_per_user,
                sessions_are_isolated_per_app,
                get_sees_live_user_and_app_state_written_by_other_sessions,
                list_returns_only_the_users_sessions_newest_first,
                list_limit_and_offset_page_without_overlap,
                delete_removes_the_session_is_idempotent_and_keeps_shared_state,
                delete_all_sessions_removes_only_that_users_sessions,
                append_event_by_bare_session_id,
                append_to_a_missing_session_fails,
                rewind_keeps_events_through_the_target_and_rebuilds_session_state,
                rewind_steps_counts_back_from_the_end,
                health_check_succeeds,
            ]
            strict: [
                create_with_a_taken_id_fails_and_keeps_the_original,
                invalid_state_keys_are_refused_and_nothing_is_written,
                invalid_identity_is_invalid_input,
                missing_session_is_session_not_found_on_every_path,
                retried_append_is_idempotent_and_a_reused_id_is_refused,
                concurrent_user_state_updates_are_never_lost,
                ambiguous_bare_session_id_is_refused,
                last_update_time_never_moves_backwards,
                partial_events_are_not_stored,
                list_shows_live_state,
            ]
        }
    };
}

macro_rules! case_table {
    (core: [$($core:ident),* $(,)?] strict: [$($strict:ident),* $(,)?]) => {
        /// Every case, in table order.
        pub const CASES: &[Case] = &[
            $(Case { name: stringify!($core), group: Group::Core, run: |s| Box::pin(async move { $core(&s).await }) },)*
            $(Case { name: stringify!($strict), group: Group::Strict, run: |s| Box::pin(async move { $strict(&s).await }) },)*
        ];
    };
}

with_cases!(case_table! {});

// ---------------------------------------------------------------- helpers

/// `expect` with the error's Display (`session.not_found: …`) rather than
/// its Debug form, so a failure reads well in the comparison table.
trait OrPanic<T> {
    fn or_panic(self, what: &str) -> T;
}

impl<T> OrPanic<T> for adk_core::Result<T> {
    fn or_panic(self, what: &str) -> T {
        self.unwrap_or_else(|e| panic!("{what}: {e}"))
    }
}

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

fn map(value: Value) -> HashMap<String, Value> {
    match value {
        Value::Object(m) => m.into_iter().collect(),
        other => panic!("not an object: {other}"),
    }
}

async fn create(svc: &Service, app: &str, user: &str, id: Option<&str>, state: Value) -> Box<dyn Session> {
    svc.create(CreateRequest {
        app_name: app.into(),
        user_id: user.into(),
        session_id: id.map(Into::into),
        state: map(state),
    })
    .await
    .unwrap_or_else(|e| panic!("create {app}/{user}/{id:?}: {e}"))
}

fn request(app: &str, user: &str, id: &str) -> GetRequest {
    GetRequest {
        app_name: app.into(),
        user_id: user.into(),
        session_id: id.into(),
        num_recent_events: None,
        after: None,
    }
}

async fn get(svc: &Service, app: &str, user: &str, id: &str) -> Box<dyn Session> {
    svc.get(request(app, user, id)).await.unwrap_or_else(|e| panic!("get {app}/{user}/{id}: {e}"))
}

async fn get_filtered(
    svc: &Service,
    app: &str,
    user: &str,
    id: &str,
    num_recent_events: Option<usize>,
    after: Option<DateTime<Utc>>,
) -> Vec<String> {
    let req = GetRequest { num_recent_events, after, ..request(app, user, id) };
    let session = svc.get(req).await.unwrap_or_else(|e| panic!("get {id}: {e}"));
    ids(session.as_ref())
}

fn ids(session: &dyn Session) -> Vec<String> {
    session.events().all().into_iter().map(|e| e.id).collect()
}

fn identity(app: &str, user: &str, id: &str) -> adk_core::AdkIdentity {
    adk_core::AdkIdentity::new(
        app.try_into().expect("app"),
        user.try_into().expect("user"),
        id.try_into().expect("session id"),
    )
}

async fn append(svc: &Service, app: &str, user: &str, id: &str, event: Event) -> adk_core::Result<()> {
    svc.append_event_for_identity(AppendEventRequest { identity: identity(app, user, id), event }).await
}

async fn must_append(svc: &Service, app: &str, user: &str, id: &str, event: Event) {
    let event_id = event.id.clone();
    append(svc, app, user, id, event).await.unwrap_or_else(|e| panic!("append {event_id} to {id}: {e}"));
}

/// One invocation for every event of the suite: the cases append user
/// messages that no agent answers, one after another, which a runner would
/// never do across invocations (ours refuses the second invocation's append
/// as `session.busy` while the first holds the session's invocation lease;
/// that is tested in `one_invocation.rs`).
const INVOCATION: &str = "inv-contract";

/// An event by `author` with a text and a state delta.
fn event(author: &str, text: &str, delta: Value) -> Event {
    let mut e = Event::new(INVOCATION);
    e.author = author.into();
    e.llm_response.content = Some(Content::new(if author == "user" { "user" } else { "model" }).with_text(text));
    e.actions.state_delta = map(delta);
    e
}

fn event_at(at: DateTime<Utc>) -> Event {
    let mut e = event("agent", "at", json!({}));
    e.timestamp = at;
    e
}

/// A whole second, so that offsets of a few hundred nanoseconds stay
/// distinct only for a store that keeps nanoseconds.
fn whole_second() -> DateTime<Utc> {
    Utc::now().duration_trunc(TimeDelta::seconds(1)).expect("truncate")
}

fn as_json(event: &Event) -> Value {
    serde_json::to_value(event).expect("serialize event")
}

fn state(session: &dyn Session) -> HashMap<String, Value> {
    session.state().all()
}

async fn list(
    svc: &Service,
    app: &str,
    user: &str,
    limit: Option<usize>,
    offset: Option<usize>,
) -> Vec<Box<dyn Session>> {
    svc.list(ListRequest { app_name: app.into(), user_id: user.into(), limit, offset })
        .await
        .unwrap_or_else(|e| panic!("list {app}/{user}: {e}"))
}

fn session_ids(sessions: &[Box<dyn Session>]) -> BTreeSet<String> {
    sessions.iter().map(|s| s.id().to_owned()).collect()
}

// ------------------------------------------------------------- core cases

pub async fn create_without_id_generates_a_unique_id(svc: &Service) {
    let (app, user) = (unique("app"), unique("user"));
    let a = create(svc, &app, &user, None, json!({})).await;
    let b = create(svc, &app, &user, None, json!({})).await;
    assert!(!a.id().is_empty() && a.id() != b.id(), "ids {} and {}", a.id(), b.id());
    assert_eq!((a.app_name(), a.user_id()), (app.as_str(), user.as_str()));
    assert_eq!(get(svc, &app, &user, a.id()).await.id(), a.id());
}

pub async fn create_with_id_keeps_it(svc: &Service) {
    let (app, user, id) = (unique("app"), unique("user"), unique("s"));
    let s = create(svc, &app, &user, Some(&id), json!({})).await;
    assert_eq!(s.id(), id);
    let loaded = get(svc, &app, &user, &id).await;
    assert_eq!(loaded.id(), id);
    assert!(loaded.events().is_empty());
}

pub async fn create_routes_initial_state_by_prefix_and_drops_temp(svc: &Service) {
    let (app, user, other) = (unique("app"), unique("user"), unique("user"));
    let initial = json!({"topic": "billing", "user:lang": "fr", "app:version": 3, "temp:scratch": true});
    let s = create(svc, &app, &user, None, initial).await;
    let expected = map(json!({"topic": "billing", "user:lang": "fr", "app:version": 3}));
    assert_eq!(state(s.as_ref()), expected, "state returned by create");
    assert_eq!(state(get(svc, &app, &user, s.id()).await.as_ref()), expected, "state read back");

    let sibling = create(svc, &app, &user, None, json!({})).await;
    assert_eq!(state(sibling.as_ref()), map(json!({"user:lang": "fr", "app:version": 3})), "same user, new session");
    let stranger = create(svc, &app, &other, None, json!({})).await;
    assert_eq!(state(stranger.as_ref()), map(json!({"app:version": 3})), "same app, other user");
}

pub async fn append_routes_the_state_delta_by_scope_and_drops_temp(svc: &Service) {
    let (app, user, other) = (unique("app"), unique("user"), unique("user"));
    let s = create(svc, &app, &user, None, json!({})).await;
    let delta = json!({"step": 1, "user:name": "Ada", "app:motd": "hi", "temp:draft": "x"});
    must_append(svc, &app, &user, s.id(), event("agent", "ok", delta)).await;

    let loaded = get(svc, &app, &user, s.id()).await;
    assert_eq!(state(loaded.as_ref()), map(json!({"step": 1, "user:name": "Ada", "app:motd": "hi"})));
    let stored = loaded.events().at(0).expect("the event").clone();
    assert!(!stored.actions.state_delta.contains_key("temp:draft"), "temp: key stored in the event");

    let sibling = create(svc, &app, &user, None, json!({})).await;
    assert_eq!(state(sibling.as_ref()), map(json!({"user:name": "Ada", "app:motd": "hi"})));
    let stranger = create(svc, &app, &other, None, json!({})).await;
    assert_eq!(state(stranger.as_ref()), map(json!({"app:motd": "hi"})));
}

pub async fn get_returns_events_in_append_order_exactly(svc: &Service) {
    let (app, user) = (unique("app"), unique("user"));
    let s = create(svc, &app, &user, None, json!({})).await;

    let question = event("user", "what is my balance?", json!({}));
    let mut answer = event("assistant", "", json!({"last_topic": "balance"}));
    answer.timestamp = whole_second() + TimeDelta::nanoseconds(123_456_789);
    answer.branch = "root.assistant".into();
    answer.llm_response.content = Some(Content {
        role: "model".into(),
        parts: vec![
            Part::Text { text: "Let me check.".into() },
            Part::FunctionCall {
                name: "balance".into(),
                args: json!({"account": "main", "precision": 2.5}),
                id: Some("call-1".into()),
                thought_signature: None,
            },
        ],
    });
    answer.llm_response.usage_metadata = Some(UsageMetadata {
        prompt_token_count: 12,
        candidates_token_count: 7,
        total_token_count: 19,
        ..Default::default()
    });
    answer.llm_response.finish_reason = Some(FinishReason::Stop);
    answer.llm_response.turn_complete = true;
    answer.llm_response.provider_metadata = Some(json!({"response_id": "r-1"}));
    answer.actions.artifact_delta = HashMap::from([("statement.pdf".to_owned(), 3)]);
    answer.actions.transfer_to_agent = Some("billing".into());
    answer.actions.escalate = true;
    answer.long_running_tool_ids = vec!["call-1".into()];
    answer.provider_metadata = HashMap::from([("trace".to_owned(), "t-1".to_owned())]);
    let follow_up = event("user", "thanks", json!({}));

    let appended = [question, answer, follow_up];
    for e in &appended {
        must_append(svc, &app, &user, s.id(), e.clone()).await;
    }
    let loaded = get(svc, &app, &user, s.id()).await;
    assert_eq!(loaded.events().len(), 3);
    for (i, original) in appended.iter().enumerate() {
        let back = loaded.events().at(i).expect("event");
        assert_eq!(back.timestamp, original.timestamp, "timestamp of event {i}");
        assert_eq!(as_json(back), as_json(original), "event {i} read back differently");
    }
}

pub async fn get_num_recent_events_returns_the_last_n(svc: &Service) {
    let (app, user) = (unique("app"), unique("user"));
    let s = create(svc, &app, &user, None, json!({})).await;
    let mut all = Vec::new();
    for i in 0..5 {
        let e = event("user", &format!("m{i}"), json!({}));
        all.push(e.id.clone());
        must_append(svc, &app, &user, s.id(), e).await;
    }
    assert_eq!(get_filtered(svc, &app, &user, s.id(), Some(2), None).await, all[3..]);
    assert_eq!(get_filtered(svc, &app, &user, s.id(), Some(5), None).await, all);
    assert_eq!(get_filtered(svc, &app, &user, s.id(), Some(50), None).await, all);
    assert!(get_filtered(svc, &app, &user, s.id(), Some(0), None).await.is_empty(), "0 recent events");
    assert_eq!(get_filtered(svc, &app, &user, s.id(), None, None).await, all);
}

pub async fn get_after_is_inclusive_and_exact_to_the_nanosecond(svc: &Service) {
    let (app, user) = (unique("app"), unique("user"));
    let s = create(svc, &app, &user, None, json!({})).await;
    let base = whole_second();
    let offsets = [0, 250, 500, 1_000, 1_250];
    let mut all = Vec::new();
    for nanos in offsets {
        let e = event_at(base + TimeDelta::nanoseconds(nanos));
        all.push(e.id.clone());
        must_append(svc, &app, &user, s.id(), e).await;
    }
    let after = |nanos: i64| Some(base + TimeDelta::nanoseconds(nanos));
    assert_eq!(get_filtered(svc, &app, &user, s.id(), None, after(0)).await, all, "after the first: all");
    assert_eq!(get_filtered(svc, &app, &user, s.id(), None, after(250)).await, all[1..], "inclusive at 250 ns");
    assert_eq!(get_filtered(svc, &app, &user, s.id(), None, after(251)).await, all[2..], "exact: 251 ns");
    assert_eq!(get_filtered(svc, &app, &user, s.id(), None, after(1_001)).await, all[4..], "exact: 1001 ns");
    assert!(get_filtered(svc, &app, &user, s.id(), None, after(1_251)).await.is_empty(), "after the last");
}

pub async fn get_recent_and_after_together_intersect(svc: &Service) {
    let (app, user) = (unique("app"), unique("user"));
    let s = create(svc, &app, &user, None, json!({})).await;
    let base = whole_second();
    let mut all = Vec::new();
    for i in 0..5 {
        let e = event_at(base + TimeDelta::microseconds(i));
        all.push(e.id.clone());
        must_append(svc, &app, &user, s.id(), e).await;
    }
    let after = |micros: i64| Some(base + TimeDelta::microseconds(micros));
    assert_eq!(get_filtered(svc, &app, &user, s.id(), Some(3), after(1)).await, all[2..]);
    assert_eq!(get_filtered(svc, &app, &user, s.id(), Some(3), after(3)).await, all[3..]);
    assert!(get_filtered(svc, &app, &user, s.id(), Some(0), after(0)).await.is_empty());
}

pub async fn get_missing_session_is_session_not_found(svc: &Service) {
    let (app, user) = (unique("app"), unique("user"));
    let err = match svc.get(request(&app, &user, &unique("missing"))).await {
        Ok(_) => panic!("a missing session loaded"),
        Err(e) => e,
    };
    assert_eq!((err.category, err.code), (ErrorCategory::NotFound, "session.not_found"), "{err}");
}

pub async fn sessions_are_isolated_per_user(svc: &Service) {
    let (app, alice, bob, id) = (unique("app"), unique("alice"), unique("bob"), unique("s"));
    create(svc, &app, &alice, Some(&id), json!({"user:secret": 1})).await;
    must_append(svc, &app, &alice, &id, event("user", "alice only", json!({"note": "a"}))).await;
    assert!(svc.get(request(&app, &bob, &id)).await.is_err(), "bob loaded alice's session");

    let bobs = create(svc, &app, &bob, Some(&id), json!({})).await;
    assert_eq!(bobs.id(), id);
    let bobs = get(svc, &app, &bob, &id).await;
    assert!(bobs.events().is_empty(), "bob sees alice's events");
    assert!(state(bobs.as_ref()).is_empty(), "bob sees alice's state: {:?}", state(bobs.as_ref()));
    assert_eq!(get(svc, &app, &alice, &id).await.events().len(), 1);
}

pub async fn sessions_are_isolated_per_app(svc: &Service) {
    let (app1, app2, user, id) = (unique("app"), unique("app"), unique("user"), unique("s"));
    create(svc, &app1, &user, Some(&id), json!({"app:plan": "pro", "user:tz": "UTC"})).await;
    must_append(svc, &app1, &user, &id, event("user", "hello app1", json!({}))).await;
    assert!(svc.get(request(&app2, &user, &id)).await.is_err(), "app2 loaded app1's session");

    create(svc, &app2, &user, Some(&id), json!({})).await;
    let other = get(svc, &app2, &user, &id).await;
    assert!(other.events().is_empty());
    assert!(state(other.as_ref()).is_empty(), "app2 sees app1's state: {:?}", state(other.as_ref()));
}

pub async fn get_sees_live_user_and_app_state_written_by_other_sessions(svc: &Service) {
    let (app, user) = (unique("app"), unique("user"));
    let a = create(svc, &app, &user, None, json!({"user:tier": "free"})).await;
    let b = create(svc, &app, &user, None, json!({})).await;
    must_append(svc, &app, &user, b.id(), event("agent", "upgraded", json!({"user:tier": "gold", "app:promo": 7})))
        .await;
    let a_now = state(get(svc, &app, &user, a.id()).await.as_ref());
    assert_eq!(
        (a_now.get("user:tier"), a_now.get("app:promo")),
        (Some(&json!("gold")), Some(&json!(7))),
        "a session does not see user:/app: state another session wrote after it was created"
    );

    must_append(svc, &app, &user, a.id(), event("agent", "downgraded", json!({"user:tier": "silver"}))).await;
    let b_now = state(get(svc, &app, &user, b.id()).await.as_ref());
    assert_eq!(b_now.get("user:tier"), Some(&json!("silver")), "a session sees a stale user: state");
}

pub async fn list_returns_only_the_users_sessions_newest_first(svc: &Service) {
    let (app, other_app, user, other_user) = (unique("app"), unique("app"), unique("user"), unique("user"));
    let mut mine = BTreeSet::new();
    for _ in 0..3 {
        mine.insert(create(svc, &app, &user, None, json!({})).await.id().to_owned());
    }
    create(svc, &app, &other_user, None, json!({})).await;
    create(svc, &other_app, &user, None, json!({})).await;
    let listed = list(svc, &app, &user, None, None).await;
    assert_eq!(session_ids(&listed), mine);
    for s in &listed {
        assert_eq!((s.app_name(), s.user_id()), (app.as_str(), user.as_str()));
    }
    let times: Vec<_> = listed.iter().map(|s| s.last_update_time()).collect();
    assert!(times.windows(2).all(|w| w[0] >= w[1]), "not newest first: {times:?}");
    assert!(list(svc, &app, &unique("nobody"), None, None).await.is_empty());
}

pub async fn list_limit_and_offset_page_without_overlap(svc: &Service) {
    let (app, user) = (unique("app"), unique("user"));
    let mut all = BTreeSet::new();
    for _ in 0..5 {
        all.insert(create(svc, &app, &user, None, json!({})).await.id().to_owned());
    }
    let mut seen = BTreeSet::new();
    for (offset, expected) in [(0, 2), (2, 2), (4, 1), (6, 0)] {
        let page = list(svc, &app, &user, Some(2), Some(offset)).await;
        assert_eq!(page.len(), expected, "page at offset {offset}");
        for id in session_ids(&page) {
            assert!(seen.insert(id.clone()), "{id} listed twice");
        }
    }
    assert_eq!(seen, all);
    assert!(list(svc, &app, &user, Some(0), None).await.is_empty(), "limit 0");
}

pub async fn delete_removes_the_session_is_idempotent_and_keeps_shared_state(svc: &Service) {
    let (app, user) = (unique("app"), unique("user"));
    let s = create(svc, &app, &user, None, json!({"user:name": "Ada", "app:x": 1})).await;
    must_append(svc, &app, &user, s.id(), event("user", "bye", json!({}))).await;
    let delete = DeleteRequest { app_name: app.clone(), user_id: user.clone(), session_id: s.id().to_owned() };
    svc.delete(delete.clone()).await.or_panic("delete");
    assert!(svc.get(request(&app, &user, s.id())).await.is_err(), "deleted session still loads");
    svc.delete(delete).await.or_panic("deleting again");
    assert!(list(svc, &app, &user, None, None).await.is_empty());

    let again = create(svc, &app, &user, Some(s.id()), json!({})).await;
    let again = get(svc, &app, &user, again.id()).await;
    assert!(again.events().is_empty(), "events outlived their session");
    assert_eq!(state(again.as_ref()), map(json!({"user:name": "Ada", "app:x": 1})), "shared state went too");
}

pub async fn delete_all_sessions_removes_only_that_users_sessions(svc: &Service) {
    let (app, user, other) = (unique("app"), unique("user"), unique("user"));
    let mut mine = Vec::new();
    for _ in 0..3 {
        mine.push(create(svc, &app, &user, None, json!({})).await.id().to_owned());
    }
    let theirs = create(svc, &app, &other, None, json!({})).await;
    svc.delete_all_sessions(&app, &user).await.or_panic("delete_all_sessions");
    assert!(list(svc, &app, &user, None, None).await.is_empty());
    for id in &mine {
        assert!(svc.get(request(&app, &user, id)).await.is_err(), "{id} survived");
    }
    assert_eq!(session_ids(&list(svc, &app, &other, None, None).await), BTreeSet::from([theirs.id().to_owned()]));
}

pub async fn append_event_by_bare_session_id(svc: &Service) {
    let (app, user, id) = (unique("app"), unique("user"), unique("s"));
    create(svc, &app, &user, Some(&id), json!({})).await;
    let e = event("user", "legacy path", json!({"via": "append_event"}));
    let event_id = e.id.clone();
    svc.append_event(&id, e).await.or_panic("append_event");
    let loaded = get(svc, &app, &user, &id).await;
    assert_eq!(ids(loaded.as_ref()), [event_id]);
    assert_eq!(loaded.state().get("via"), Some(json!("append_event")));
}

pub async fn append_to_a_missing_session_fails(svc: &Service) {
    let (app, user, id) = (unique("app"), unique("user"), unique("missing"));
    assert!(append(svc, &app, &user, &id, event("user", "x", json!({}))).await.is_err());
    assert!(svc.append_event(&id, event("user", "x", json!({}))).await.is_err());
    assert!(svc.get(request(&app, &user, &id)).await.is_err(), "append created the session");
}

pub async fn rewind_keeps_events_through_the_target_and_rebuilds_session_state(svc: &Service) {
    let (app, user, id) = (unique("app"), unique("user"), unique("s"));
    create(svc, &app, &user, Some(&id), json!({})).await;
    let e1 = event("agent", "one", json!({"a": 1, "user:points": 1}));
    let e2 = event("agent", "two", json!({"a": 2, "b": true, "app:seen": 1}));
    let e3 = event("agent", "three", json!({"c": 3, "user:points": 2}));
    for e in [&e1, &e2, &e3] {
        must_append(svc, &app, &user, &id, e.clone()).await;
    }
    let rewound = svc.rewind(&id, &e2.id).await.or_panic("rewind");
    assert_eq!(ids(rewound.as_ref()), [e1.id.clone(), e2.id.clone()]);
    let expected = map(json!({"a": 2, "b": true, "user:points": 2, "app:seen": 1}));
    assert_eq!(state(rewound.as_ref()), expected, "state after rewind (app and user state are not rewound)");

    let loaded = get(svc, &app, &user, &id).await;
    assert_eq!(state(loaded.as_ref()), expected, "state read back");
    assert_eq!(ids(loaded.as_ref()), [e1.id.clone(), e2.id.clone()]);
    for (back, original) in loaded.events().all().iter().zip([&e1, &e2]) {
        assert_eq!(as_json(back), as_json(original), "a kept event changed");
    }
    assert!(svc.rewind(&id, "no-such-event").await.is_err(), "rewind to an unknown event");

    must_append(svc, &app, &user, &id, event("agent", "after", json!({"d": 4}))).await;
    assert_eq!(get(svc, &app, &user, &id).await.events().len(), 3, "appends continue after a rewind");
}

pub async fn rewind_steps_counts_back_from_the_end(svc: &Service) {
    let (app, user, id) = (unique("app"), unique("user"), unique("s"));
    create(svc, &app, &user, Some(&id), json!({})).await;
    let events: Vec<Event> = (0..3).map(|i| event("agent", "step", json!({ "n": i, "user:last": i }))).collect();
    for e in &events {
        must_append(svc, &app, &user, &id, e.clone()).await;
    }
    let unchanged = svc.rewind_steps(&id, 0).await.or_panic("rewind_steps(0)");
    assert_eq!(unchanged.events().len(), 3);
    assert!(svc.rewind_steps(&id, 4).await.is_err(), "rewinding past the first event");
    assert_eq!(get(svc, &app, &user, &id).await.events().len(), 3, "a refused rewind changed the session");

    let one_back = svc.rewind_steps(&id, 1).await.or_panic("rewind_steps(1)");
    assert_eq!(ids(one_back.as_ref()), [events[0].id.clone(), events[1].id.clone()]);
    assert_eq!(one_back.state().get("n"), Some(json!(1)));

    let empty = svc.rewind_steps(&id, 2).await.or_panic("rewind_steps(all)");
    assert!(empty.events().is_empty());
    assert_eq!(state(empty.as_ref()), map(json!({"user:last": 2})), "session state empty, user state kept");
}

pub async fn health_check_succeeds(svc: &Service) {
    svc.health_check().await.or_panic("health_check");
}

// ----------------------------------------------------------- strict cases

pub async fn create_with_a_taken_id_fails_and_keeps_the_original(svc: &Service) {
    let (app, user, id) = (unique("app"), unique("user"), unique("s"));
    create(svc, &app, &user, Some(&id), json!({"owner": "first"})).await;
    must_append(svc, &app, &user, &id, event("user", "keep me", json!({}))).await;
    let second = svc
        .create(CreateRequest {
            app_name: app.clone(),
            user_id: user.clone(),
            session_id: Some(id.clone()),
            state: map(json!({"owner": "second"})),
        })
        .await;
    assert!(second.is_err(), "a taken id was accepted");
    let kept = get(svc, &app, &user, &id).await;
    assert_eq!(kept.state().get("owner"), Some(json!("first")), "the original was overwritten");
    assert_eq!(kept.events().len(), 1, "the original lost its events");
}

pub async fn invalid_state_keys_are_refused_and_nothing_is_written(svc: &Service) {
    let (app, user) = (unique("app"), unique("user"));
    for bad in ["a/b", "..", "user:../etc", "x\\y", ""] {
        let id = unique("s");
        let created = svc
            .create(CreateRequest {
                app_name: app.clone(),
                user_id: user.clone(),
                session_id: Some(id.clone()),
                state: map(json!({ bad: 1 })),
            })
            .await;
        let err = created.err().unwrap_or_else(|| panic!("create accepted state key {bad:?}"));
        assert_eq!(err.category, ErrorCategory::InvalidInput, "{bad:?}: {err}");
        assert!(svc.get(request(&app, &user, &id)).await.is_err(), "create with {bad:?} left a session");
    }
    let s = create(svc, &app, &user, None, json!({"ok": 1})).await;
    for bad in ["a/b", "app:..", "temp:x/y"] {
        let err = append(svc, &app, &user, s.id(), event("agent", "x", json!({ bad: 2 })))
            .await
            .err()
            .unwrap_or_else(|| panic!("append accepted state key {bad:?}"));
        assert_eq!(err.category, ErrorCategory::InvalidInput, "{bad:?}: {err}");
    }
    let after = get(svc, &app, &user, s.id()).await;
    assert!(after.events().is_empty(), "a refused event was stored");
    assert_eq!(state(after.as_ref()), map(json!({"ok": 1})));
}

pub async fn invalid_identity_is_invalid_input(svc: &Service) {
    let err = |r: adk_core::Result<Box<dyn Session>>| match r {
        Ok(s) => panic!("accepted a bad identity: {}/{}/{}", s.app_name(), s.user_id(), s.id()),
        Err(e) => e,
    };
    let nul = "a\0b".to_owned();
    let e = err(svc
        .create(CreateRequest { app_name: String::new(), user_id: "u".into(), session_id: None, state: HashMap::new() })
        .await);
    assert_eq!(e.category, ErrorCategory::InvalidInput, "empty app: {e}");
    let e = err(svc
        .create(CreateRequest { app_name: "a".into(), user_id: nul.clone(), session_id: None, state: HashMap::new() })
        .await);
    assert_eq!(e.category, ErrorCategory::InvalidInput, "NUL in user id: {e}");
    let e = err(svc.get(request("a", "", "s")).await);
    assert_eq!(e.category, ErrorCategory::InvalidInput, "empty user on get: {e}");
    let e = err(svc.get(request("a", "u", &nul)).await);
    assert_eq!(e.category, ErrorCategory::InvalidInput, "NUL in session id on get: {e}");
}

pub async fn missing_session_is_session_not_found_on_every_path(svc: &Service) {
    let (app, user, id) = (unique("app"), unique("user"), unique("missing"));
    let check = |what: &str, r: adk_core::Result<()>| {
        let e = r.err().unwrap_or_else(|| panic!("{what} on a missing session succeeded"));
        assert!(
            e.category == ErrorCategory::NotFound && e.code == "session.not_found",
            "{what}: expected NotFound/session.not_found, got {}/{}: {}",
            e.category,
            e.code,
            e.message
        );
    };
    check("append_event_for_identity", append(svc, &app, &user, &id, event("user", "x", json!({}))).await);
    check("append_event", svc.append_event(&id, event("user", "x", json!({}))).await);
    check("rewind_steps", svc.rewind_steps(&id, 1).await.map(|_| ()));
    check("get_for_identity", svc.get_for_identity(&identity(&app, &user, &id)).await.map(|_| ()));
}

pub async fn retried_append_is_idempotent_and_a_reused_id_is_refused(svc: &Service) {
    let (app, user) = (unique("app"), unique("user"));
    let s = create(svc, &app, &user, None, json!({})).await;
    let e = event("agent", "once", json!({"user:count": 1}));
    must_append(svc, &app, &user, s.id(), e.clone()).await;
    append(svc, &app, &user, s.id(), e.clone()).await.or_panic("a retried append (same id, same content)");
    assert_eq!(get(svc, &app, &user, s.id()).await.events().len(), 1, "a retry stored the event twice");

    let mut other = e.clone();
    other.llm_response.content = Some(Content::new("model").with_text("different"));
    let Err(err) = append(svc, &app, &user, s.id(), other).await else {
        panic!("a reused event id with other content was accepted");
    };
    assert_eq!(err.category, ErrorCategory::InvalidInput, "{err}");
    let loaded = get(svc, &app, &user, s.id()).await;
    assert_eq!(loaded.events().len(), 1);
    assert_eq!(as_json(loaded.events().at(0).expect("event")), as_json(&e), "the stored event was replaced");
}

pub async fn concurrent_user_state_updates_are_never_lost(svc: &Service) {
    const SESSIONS: usize = 16;
    let (app, user) = (unique("app"), unique("user"));
    let mut sessions = Vec::new();
    for _ in 0..SESSIONS {
        sessions.push(create(svc, &app, &user, None, json!({})).await.id().to_owned());
    }
    for round in 0..3 {
        let barrier = Arc::new(tokio::sync::Barrier::new(SESSIONS));
        let mut tasks = tokio::task::JoinSet::new();
        for (i, id) in sessions.iter().enumerate() {
            let (svc, app, user, id, barrier) = (svc.clone(), app.clone(), user.clone(), id.clone(), barrier.clone());
            tasks.spawn(async move {
                barrier.wait().await;
                let delta = json!({ format!("user:r{round}_s{i}"): i, format!("app:r{round}_s{i}"): i });
                append(&svc, &app, &user, &id, event("agent", "note", delta)).await
            });
        }
        let mut failures = Vec::new();
        while let Some(joined) = tasks.join_next().await {
            if let Err(e) = joined.expect("append task panicked") {
                failures.push(e.to_string());
            }
        }
        assert!(failures.is_empty(), "round {round}: {} appends failed, e.g. {}", failures.len(), failures[0]);
    }
    let merged = state(get(svc, &app, &user, &sessions[0]).await.as_ref());
    let lost: Vec<String> = (0..3)
        .flat_map(|r| (0..SESSIONS).flat_map(move |i| [format!("user:r{r}_s{i}"), format!("app:r{r}_s{i}")]))
        .filter(|k| !merged.contains_key(k))
        .collect();
    assert!(
        lost.is_empty(),
        "{} of {} concurrent writes lost, e.g. {:?}",
        lost.len(),
        3 * SESSIONS * 2,
        &lost[..lost.len().min(3)]
    );
}

pub async fn ambiguous_bare_session_id_is_refused(svc: &Service) {
    let (app, alice, bob, id) = (unique("app"), unique("alice"), unique("bob"), unique("s"));
    create(svc, &app, &alice, Some(&id), json!({})).await;
    create(svc, &app, &bob, Some(&id), json!({})).await;
    let result = svc.append_event(&id, event("user", "whose?", json!({}))).await;
    let stored = get(svc, &app, &alice, &id).await.events().len() + get(svc, &app, &bob, &id).await.events().len();
    assert!(result.is_err(), "an ambiguous id was resolved by guessing (event stored in {stored} session)");
    assert_eq!(stored, 0, "a refused event was stored");
}

pub async fn last_update_time_never_moves_backwards(svc: &Service) {
    let (app, user) = (unique("app"), unique("user"));
    let s = create(svc, &app, &user, None, json!({})).await;
    must_append(svc, &app, &user, s.id(), event("user", "now", json!({}))).await;
    let before = get(svc, &app, &user, s.id()).await.last_update_time();
    must_append(svc, &app, &user, s.id(), event_at(Utc::now() - TimeDelta::days(1))).await;
    let after = get(svc, &app, &user, s.id()).await.last_update_time();
    assert!(after >= before, "last_update_time moved back from {before} to {after}");
}

pub async fn partial_events_are_not_stored(svc: &Service) {
    let (app, user) = (unique("app"), unique("user"));
    let s = create(svc, &app, &user, None, json!({})).await;
    let mut chunk = event("agent", "stream chun", json!({"half": true}));
    chunk.llm_response.partial = true;
    append(svc, &app, &user, s.id(), chunk).await.or_panic("appending a partial event");
    let loaded = get(svc, &app, &user, s.id()).await;
    assert!(loaded.events().is_empty(), "a partial event was stored");
    assert!(loaded.state().get("half").is_none(), "a partial event changed state");
}

pub async fn list_shows_live_state(svc: &Service) {
    let (app, user) = (unique("app"), unique("user"));
    let a = create(svc, &app, &user, None, json!({"user:plan": "free"})).await;
    tokio::time::sleep(Duration::from_millis(2)).await;
    let b = create(svc, &app, &user, None, json!({})).await;
    must_append(svc, &app, &user, b.id(), event("agent", "upgrade", json!({"user:plan": "pro", "mine": 1}))).await;
    let listed = list(svc, &app, &user, None, None).await;
    let listed_a = listed.iter().find(|s| s.id() == a.id()).expect("a is listed");
    assert_eq!(listed_a.state().get("user:plan"), Some(json!("pro")), "list returned a stale user state");
    let listed_b = listed.iter().find(|s| s.id() == b.id()).expect("b is listed");
    assert_eq!(listed_b.state().get("mine"), Some(json!(1)), "list returned a stale session state");
}
