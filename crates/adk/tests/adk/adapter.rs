//! What the adapter itself promises beyond the SessionService contract:
//! stable error codes with the offending field, bare-id resolution that
//! explains itself, trimmed ids, listings past one store page without
//! events, a rewind that survives a new store instance, and a health check
//! that notices a lost database.
#![cfg(feature = "postgres")]

use std::collections::HashMap;
use std::sync::Arc;

use adk_core::{AdkIdentity, Content, ErrorCategory, ErrorComponent};
use adk_postgres_adk::domain::InMemoryStore;
use adk_postgres_adk::{PgSessionService, codes};
use adk_postgres_testing::test_database;
use adk_session::{AppendEventRequest, CreateRequest, Event, GetRequest, ListRequest, SessionService};
use serde_json::{Value, json};

fn create_request(app: &str, user: &str, id: Option<&str>, state: Value) -> CreateRequest {
    let state = state.as_object().map(|m| m.clone().into_iter().collect()).unwrap_or_default();
    CreateRequest { app_name: app.into(), user_id: user.into(), session_id: id.map(Into::into), state }
}

fn get_request(app: &str, user: &str, id: &str) -> GetRequest {
    GetRequest {
        app_name: app.into(),
        user_id: user.into(),
        session_id: id.into(),
        num_recent_events: None,
        after: None,
    }
}

fn event(author: &str, delta: Value) -> Event {
    let mut e = Event::new("inv-1");
    e.author = author.into();
    e.llm_response.content = Some(Content::new("model").with_text("text"));
    e.actions.state_delta = delta.as_object().map(|m| m.clone().into_iter().collect()).unwrap_or_default();
    e
}

fn identity(app: &str, user: &str, id: &str) -> AdkIdentity {
    AdkIdentity::new(app.try_into().unwrap(), user.try_into().unwrap(), id.try_into().unwrap())
}

async fn append(svc: &PgSessionService, app: &str, user: &str, id: &str, e: Event) -> adk_core::Result<()> {
    svc.append_event_for_identity(AppendEventRequest { identity: identity(app, user, id), event: e }).await
}

fn memory() -> PgSessionService {
    PgSessionService::from_store(InMemoryStore::new())
}

#[tokio::test]
async fn errors_carry_a_code_a_category_and_the_field() {
    let svc = memory();
    svc.create(create_request("a", "u", Some("s"), json!({}))).await.unwrap();

    let err = svc.create(create_request("a", "u", Some("s"), json!({}))).await.err().unwrap();
    assert_eq!(
        (err.component, err.category, err.code),
        (ErrorComponent::Session, ErrorCategory::InvalidInput, codes::ALREADY_EXISTS)
    );

    let err = svc.create(create_request("a", "u", None, json!({"a/b": 1}))).await.err().unwrap();
    assert_eq!((err.category, err.code), (ErrorCategory::InvalidInput, codes::INVALID_STATE_KEY));
    assert!(err.message.contains("a/b"), "{err}");

    // The store's own key rules (control characters) arrive with the same code.
    let err = svc.create(create_request("a", "u", None, json!({"a\u{1}b": 1}))).await.err().unwrap();
    assert_eq!(err.code, codes::INVALID_STATE_KEY, "{err}");

    let err = svc.create(create_request("a", &"u".repeat(129), None, json!({}))).await.err().unwrap();
    assert_eq!((err.category, err.code), (ErrorCategory::InvalidInput, codes::INVALID_IDENTITY));
    assert_eq!(err.details.metadata["field"], "user_id");

    let e = event("agent", json!({}));
    append(&svc, "a", "u", "s", e.clone()).await.unwrap();
    let mut changed = e.clone();
    changed.llm_response.content = Some(Content::new("model").with_text("other"));
    let err = append(&svc, "a", "u", "s", changed).await.err().unwrap();
    assert_eq!(err.code, codes::DUPLICATE_EVENT);

    // adk-core's Event::new leaves the author empty; the runner accepts it, so do we.
    append(&svc, "a", "u", "s", event("", json!({}))).await.unwrap();

    let err = svc.get(get_request("a", "u", "nope")).await.err().unwrap();
    assert_eq!(err.message, "session 'nope' was not found for app 'a' and user 'u'");
    assert!(!err.is_retryable());
}

#[tokio::test]
async fn a_bare_id_resolves_through_the_store_and_is_never_guessed() {
    let store = Arc::new(InMemoryStore::new());
    let writer = PgSessionService::new(store.clone());
    writer.create(create_request("a", "u", Some("s-1"), json!({}))).await.unwrap();

    // Another service instance on the same store (another process) finds it.
    let other = PgSessionService::new(store);
    other.append_event("s-1", event("user", json!({}))).await.unwrap();
    assert_eq!(writer.get(get_request("a", "u", "s-1")).await.unwrap().events().len(), 1);
    let err = other.append_event("s-404", event("user", json!({}))).await.err().unwrap();
    assert_eq!((err.category, err.code), (ErrorCategory::NotFound, codes::NOT_FOUND));

    writer.create(create_request("a", "u2", Some("s-1"), json!({}))).await.unwrap();
    let err = writer.append_event("s-1", event("user", json!({}))).await.err().unwrap();
    assert_eq!((err.category, err.code), (ErrorCategory::InvalidInput, codes::AMBIGUOUS_ID));
    let err = writer.rewind_steps("s-1", 0).await.err().unwrap();
    assert_eq!(err.code, codes::AMBIGUOUS_ID);
}

#[tokio::test]
async fn ids_are_trimmed_and_listings_carry_no_events() {
    let svc = memory();
    let created = svc.create(create_request("a", "u", Some("  s-1 "), json!({}))).await.unwrap();
    assert_eq!(created.id(), "s-1");
    let blank = svc.create(create_request("a", "u", Some("   "), json!({}))).await.unwrap();
    assert_eq!(blank.id().len(), 36, "a blank id gets a UUID: {}", blank.id());
    append(&svc, "a", "u", "s-1", event("user", json!({}))).await.unwrap();
    let listed = svc.list(ListRequest { app_name: "a".into(), user_id: "u".into(), limit: None, offset: None }).await;
    let listed = listed.unwrap();
    assert_eq!(listed.len(), 2);
    assert!(listed.iter().all(|s| s.events().is_empty()), "a listing carried events");
    assert_eq!(listed[0].id(), "s-1", "the session appended to last is listed first");
}

#[tokio::test]
async fn listing_walks_every_store_page() {
    let svc = memory();
    for _ in 0..205 {
        svc.create(create_request("a", "u", None, json!({}))).await.unwrap();
    }
    let list = |limit, offset| svc.list(ListRequest { app_name: "a".into(), user_id: "u".into(), limit, offset });
    assert_eq!(list(None, None).await.unwrap().len(), 205);
    assert_eq!(list(Some(10), Some(199)).await.unwrap().len(), 6);
    assert_eq!(list(Some(500), Some(3)).await.unwrap().len(), 202);
    svc.delete_all_sessions("a", "u").await.unwrap();
    assert!(list(None, None).await.unwrap().is_empty());
}

#[tokio::test]
async fn rewind_errors_name_what_is_missing() {
    let svc = memory();
    svc.create(create_request("a", "u", Some("s"), json!({}))).await.unwrap();
    append(&svc, "a", "u", "s", event("agent", json!({}))).await.unwrap();
    let err = svc.rewind("s", "no-such-event").await.err().unwrap();
    assert_eq!((err.category, err.code), (ErrorCategory::NotFound, codes::EVENT_NOT_FOUND));
    let err = svc.rewind_steps("s", 2).await.err().unwrap();
    assert_eq!((err.category, err.code), (ErrorCategory::InvalidInput, codes::REWIND_OUT_OF_RANGE));
}

#[tokio::test]
async fn a_rewound_session_reads_back_exactly_from_a_new_store_instance() {
    let db = test_database().await;
    let svc = PgSessionService::connect(db.url()).await.unwrap();
    svc.create(create_request("a", "u", Some("s"), json!({"seed": true}))).await.unwrap();
    let kept = [event("agent", json!({"n": 1, "user:pref": "tea", "app:v": 1})), event("agent", json!({"n": 2}))];
    for e in &kept {
        append(&svc, "a", "u", "s", e.clone()).await.unwrap();
    }
    append(&svc, "a", "u", "s", event("agent", json!({"n": 3, "user:pref": "coffee"}))).await.unwrap();
    svc.rewind("s", &kept[1].id).await.unwrap();

    let fresh = PgSessionService::connect(db.url()).await.unwrap();
    let session = fresh.get(get_request("a", "u", "s")).await.unwrap();
    let events = session.events().all();
    assert_eq!(events.len(), 2);
    for (back, original) in events.iter().zip(&kept) {
        assert_eq!(serde_json::to_value(back).unwrap(), serde_json::to_value(original).unwrap());
    }
    let expected: HashMap<String, Value> =
        [("seed", json!(true)), ("n", json!(2)), ("user:pref", json!("coffee")), ("app:v", json!(1))]
            .map(|(k, v)| (k.to_owned(), v))
            .into();
    assert_eq!(session.state().all(), expected, "the state it was created with + the kept events' deltas");
}

#[tokio::test]
async fn health_check_notices_a_lost_database() {
    let db = test_database().await;
    let svc = PgSessionService::connect(db.url()).await.unwrap();
    svc.health_check().await.unwrap();
    drop(db); // DROP DATABASE … WITH (FORCE): connections are terminated.
    let Err(err) = svc.health_check().await else {
        panic!("health_check passed on a dropped database");
    };
    assert_eq!(
        (err.component, err.category, err.code),
        (ErrorComponent::Session, ErrorCategory::Unavailable, codes::UNAVAILABLE),
        "{err}"
    );
    assert!(err.is_retryable());
}

#[tokio::test]
async fn fork_starts_a_new_session_from_the_history_up_to_an_event() {
    let db = test_database().await;
    let svc = PgSessionService::connect(db.url()).await.unwrap();
    svc.create(create_request("a", "u", Some("s"), json!({"seed": true}))).await.unwrap();
    let kept = [event("agent", json!({"n": 1})), event("agent", json!({"n": 2}))];
    for e in &kept {
        append(&svc, "a", "u", "s", e.clone()).await.unwrap();
    }
    append(&svc, "a", "u", "s", event("agent", json!({"n": 3}))).await.unwrap();

    let fork = svc.fork(&identity("a", "u", "s"), &kept[1].id, Some("f".into())).await.unwrap();
    assert_eq!(fork.id(), "f");
    let ids: Vec<String> = fork.events().all().iter().map(|e| e.id.clone()).collect();
    assert_eq!(ids, [kept[0].id.clone(), kept[1].id.clone()]);
    assert_eq!(fork.state().get("n"), Some(json!(2)));
    let original = svc.get(get_request("a", "u", "s")).await.unwrap();
    assert_eq!(original.events().len(), 3, "the original is untouched");

    let err = svc.fork(&identity("a", "u", "s"), "no-such-event", None).await.err().unwrap();
    assert_eq!((err.category, err.code), (ErrorCategory::NotFound, codes::EVENT_NOT_FOUND));
    let err = svc.fork(&identity("a", "u", "s"), &kept[0].id, Some("f".into())).await.err().unwrap();
    assert_eq!(err.code, codes::ALREADY_EXISTS);
}

#[tokio::test]
async fn redact_event_through_the_adapter_leaves_a_tombstone_adk_reads() {
    let db = test_database().await;
    let svc = PgSessionService::connect(db.url()).await.unwrap();
    svc.create(create_request("app", "u", Some("s"), json!({}))).await.unwrap();
    let mut pasted = event("user", json!({"kept": 1}));
    pasted.llm_response.content = Some(Content::new("user").with_text("my card is 4111 1111"));
    let id = pasted.id.clone();
    append(&svc, "app", "u", "s", pasted).await.unwrap();

    svc.redact_event(&identity("app", "u", "s"), &id, "a card number", Default::default()).await.unwrap();
    let read = svc.get(get_request("app", "u", "s")).await.unwrap();
    let events = read.events().all();
    let text = serde_json::to_string(&events[0].llm_response.content).unwrap();
    assert!(!text.contains("4111") && text.contains("[redacted]"), "{text}");
    assert_eq!(read.state().get("kept"), Some(json!(1)), "the state delta stays by default");

    let missing = svc.redact_event(&identity("app", "u", "s"), "no-such-event", "x", Default::default()).await;
    let error = missing.expect_err("a missing event");
    assert!(error.to_string().contains("no-such-event") || format!("{error:?}").contains("event"), "{error:?}");
}
