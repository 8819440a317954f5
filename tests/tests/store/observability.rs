//! What the store tells a service about its operations: one `tracing` span
//! per call with the operation, the app and the outcome, and (with the
//! storage crate's `metrics` feature, on for this package) a latency
//! histogram and an error counter. None of it may carry a user id, a session
//! id, state or event content.
//!
//! Each test runs on a current-thread runtime, so every poll of its store
//! operations happens on its own thread. Spans go to one process-wide
//! subscriber that files them by thread: a subscriber per thread is not
//! enough when tests share a process (`cargo test`), because tracing caches
//! whether a callsite is wanted across threads and one test could switch
//! another's events off. Metrics go to a recorder set for the test's thread.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::thread::ThreadId;

use adk_postgres_domain::{
    AppName, AppendOptions, CreateSession, Event, GetOptions, ListSessions, RedactOptions, SessionId, SessionKey,
    SessionMetadata, SessionStore, StoreError, UserId,
};
use adk_postgres_storage::observe::{DURATION_METRIC, ERRORS_METRIC, Operation, SPAN_NAME};
use adk_postgres_testing::test_database;
use adk_postgres_tests::pg::{client, store};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use serde_json::json;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::{Context, SubscriberExt as _};
use tracing_subscriber::registry::LookupSpan;

const APP: &str = "obs-app";
const USER: &str = "obs-user-8d1c";
const SESSION: &str = "obs-session-51aa";
const SUCCESSOR: &str = "obs-successor-77e0";
const EVENT_ID: &str = "obs-event-id-c3f9";
const STATE_VALUE: &str = "obs-state-value-19b2";
const USER_STATE_VALUE: &str = "obs-user-state-value-4e61";
const DELTA_VALUE: &str = "obs-delta-value-a0d5";
const CONTENT_TEXT: &str = "obs-content-text-6b38";
const SUMMARY_TEXT: &str = "obs-summary-text-f2c7";

/// Everything the tests put into the store that must never come out in a
/// span or an event.
const SECRETS: [&str; 9] =
    [USER, SESSION, SUCCESSOR, EVENT_ID, STATE_VALUE, USER_STATE_VALUE, DELTA_VALUE, CONTENT_TEXT, SUMMARY_TEXT];

/// A span as a subscriber saw it, with every field recorded on it.
#[derive(Debug, Clone)]
struct SeenSpan {
    name: &'static str,
    fields: BTreeMap<String, String>,
}

impl SeenSpan {
    fn field(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }
}

/// An event, with its fields and the names of the spans it happened in.
#[derive(Debug, Clone)]
struct SeenEvent {
    fields: BTreeMap<String, String>,
    scope: Vec<&'static str>,
}

#[derive(Debug, Default)]
struct Seen {
    /// Closed spans, in the order they closed.
    spans: Vec<SeenSpan>,
    events: Vec<SeenEvent>,
}

/// A layer that keeps every span's and event's fields, as plain text, by
/// the thread they began on.
#[derive(Debug, Default)]
struct Collector(Mutex<HashMap<ThreadId, Seen>>);

/// A span still open: the thread it began on and its fields so far, kept in
/// its extensions.
#[derive(Debug)]
struct OpenFields {
    thread: ThreadId,
    fields: BTreeMap<String, String>,
}

#[derive(Debug, Default)]
struct Fields(BTreeMap<String, String>);

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().to_owned(), value.to_string());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

impl<S> Layer<S> for &'static Collector
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(OpenFields { thread: std::thread::current().id(), fields: fields.0 });
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        values.record(&mut fields);
        if let Some(span) = ctx.span(id)
            && let Some(open) = span.extensions_mut().get_mut::<OpenFields>()
        {
            open.fields.extend(fields.0);
        }
    }

    fn on_event(&self, event: &tracing::Event<'_>, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let scope = ctx.event_scope(event).map(|scope| scope.map(|span| span.name()).collect()).unwrap_or_default();
        self.filed(std::thread::current().id(), |seen| seen.events.push(SeenEvent { fields: fields.0, scope }));
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(&id)
            && let Some(open) = span.extensions_mut().remove::<OpenFields>()
        {
            let seen = SeenSpan { name: span.name(), fields: open.fields };
            self.filed(open.thread, |filed| filed.spans.push(seen));
        }
    }
}

impl Collector {
    /// The process's subscriber, installed by the first test that asks.
    fn installed() -> &'static Collector {
        static COLLECTOR: OnceLock<&'static Collector> = OnceLock::new();
        COLLECTOR.get_or_init(|| {
            let collector: &'static Collector = Box::leak(Box::default());
            tracing::subscriber::set_global_default(tracing_subscriber::registry().with(collector))
                .expect("no other global subscriber in this test binary");
            collector
        })
    }

    fn filed(&self, thread: ThreadId, file: impl FnOnce(&mut Seen)) {
        file(self.0.lock().unwrap_or_else(PoisonError::into_inner).entry(thread).or_default());
    }

    /// What the current thread's operations reported since the last call.
    fn take(&self) -> Seen {
        let mut filed = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        filed.remove(&std::thread::current().id()).unwrap_or_default()
    }
}

impl Seen {
    fn store_spans(&self) -> Vec<&SeenSpan> {
        self.spans.iter().filter(|span| span.name == SPAN_NAME).collect()
    }

    /// Fails naming the span or event a secret turned up in, as a field's
    /// name or value.
    fn assert_no_secrets(&self) {
        let fields = self
            .spans
            .iter()
            .map(|span| (format!("span {}", span.name), &span.fields))
            .chain(self.events.iter().map(|event| (format!("event in {:?}", event.scope), &event.fields)));
        for (place, fields) in fields {
            for (name, value) in fields {
                for secret in SECRETS {
                    assert!(
                        !name.contains(secret) && !value.contains(secret),
                        "{place} carries {secret:?} in field {name} = {value:?}"
                    );
                }
            }
        }
    }
}

fn app() -> AppName {
    AppName::new(APP).expect("app")
}

fn user() -> UserId {
    UserId::new(USER).expect("user")
}

fn event_with(id: &str, delta: serde_json::Value, text: &str) -> Event {
    let mut event = Event::new("agent");
    event.id = id.to_owned();
    event.actions.state_delta = delta.as_object().cloned().expect("a state delta is an object");
    event.content = Some(json!({"role": "model", "parts": [{"text": text}]}));
    event
}

fn secret_session() -> CreateSession {
    let state = json!({"topic": STATE_VALUE, "user:tier": USER_STATE_VALUE});
    CreateSession::new(app(), user()).with_id(SESSION).with_state(state.as_object().cloned().expect("object"))
}

#[tokio::test(flavor = "current_thread")]
async fn every_operation_is_one_span_with_its_app_and_outcome() {
    let db = test_database().await;
    let store = store(db.url()).await;
    let collector = Collector::installed();
    collector.take();

    let key = store.create(secret_session()).await.expect("create").key;
    store.get(&key, GetOptions::default()).await.expect("get");
    store.list(&ListSessions::new(app(), user())).await.expect("list");
    let appended = event_with(EVENT_ID, json!({"topic": DELTA_VALUE}), CONTENT_TEXT);
    store.append(&key, appended, AppendOptions::default()).await.expect("append");
    store.rewind(&key, 1, None).await.expect("rewind");
    let summary = event_with("summary", json!({}), SUMMARY_TEXT);
    let successor = store.rollover(&key, Some(SUCCESSOR.into()), summary).await.expect("rollover").key;
    let found = store.find_by_id(&successor.session_id, 2).await.expect("find");
    assert_eq!(found, vec![successor.clone()]);
    store.set_metadata(&successor, SessionMetadata::new().with_label("kind", "test")).await.expect("set_metadata");
    store.fork(&successor, 1, Some("forked".into())).await.expect("fork");
    store.redact_event(&successor, "summary", "pasted a secret", RedactOptions::default()).await.expect("redact");
    store
        .merge_user_state(&app(), &user(), json!({"tier": USER_STATE_VALUE}).as_object().cloned().expect("object"))
        .await
        .expect("merge_user_state");
    store.get_user_state(&app(), &user()).await.expect("get_user_state");
    store
        .merge_app_state(&app(), json!({"motd": STATE_VALUE}).as_object().cloned().expect("object"))
        .await
        .expect("merge_app_state");
    store.get_app_state(&app()).await.expect("get_app_state");
    store.list_events(&successor, adk_postgres_domain::EventPage::first(10)).await.expect("list_events");
    store.list_app_sessions(&adk_postgres_domain::ListAppSessions::new(app())).await.expect("list_app_sessions");
    store.delete(&successor).await.expect("delete");
    store.erase_user(&app(), &user()).await.expect("erase_user");

    let seen = collector.take();
    let spans = seen.store_spans();
    let operations: Vec<_> = spans.iter().map(|span| span.field("operation").unwrap_or("(none)")).collect();
    // One span per call: the get inside rollover and rewind is not a second one.
    assert_eq!(
        operations,
        [
            "create",
            "get",
            "list",
            "append",
            "rewind",
            "rollover",
            "find_by_id",
            "set_metadata",
            "fork",
            "redact_event",
            "merge_user_state",
            "get_user_state",
            "merge_app_state",
            "get_app_state",
            "list_events",
            "list_app_sessions",
            "delete",
            "erase_user"
        ]
    );
    let covered: BTreeSet<_> = operations.iter().copied().collect();
    let all: BTreeSet<_> = Operation::ALL.iter().map(|op| op.as_str()).collect();
    assert_eq!(covered, all, "every operation the store has is exercised here");

    for span in &spans {
        let operation = span.field("operation").unwrap_or_default();
        // find_by_id names no app, and this store is not fixed to one.
        let app = if operation == "find_by_id" { None } else { Some(APP) };
        assert_eq!(span.field("app"), app, "{span:?}");
        assert_eq!(span.field("outcome"), Some("ok"), "{span:?}");
        let duration: f64 = span.field("duration_ms").and_then(|d| d.parse().ok()).expect("duration_ms");
        assert!((0.0..60_000.0).contains(&duration), "{span:?}");
    }
    let finished = seen.events.iter().filter(|event| event.scope.first() == Some(&SPAN_NAME)).count();
    assert_eq!(finished, spans.len(), "one closing event per operation, inside its span");
    seen.assert_no_secrets();
}

#[tokio::test(flavor = "current_thread")]
async fn a_failed_operation_records_its_error_kind_and_nothing_else() {
    let db = test_database().await;
    let store = store(db.url()).await;
    let key = store.create(secret_session()).await.expect("create").key;
    let stored = event_with(EVENT_ID, json!({"topic": DELTA_VALUE}), CONTENT_TEXT);
    store.append(&key, stored, AppendOptions::default()).await.expect("append");
    // A session of a day nobody premade, as in postgres_store.rs.
    let old_day = store.create(secret_session().with_id(format!("{SESSION}-old"))).await.expect("create").key;
    client(db.url())
        .await
        .execute(
            "UPDATE adk_sessions SET session_day = '2001-02-03' WHERE session_id = $1",
            &[&old_day.session_id.as_str()],
        )
        .await
        .expect("move the session's day");

    let collector = Collector::installed();
    // Only the failing calls below, not the setup.
    collector.take();
    let missing = SessionKey::new(app(), user(), SessionId::new("obs-session-51aa-gone").expect("id"));
    let errors = [
        store.get(&missing, GetOptions::default()).await.map(drop),
        store
            .append(&key, Event::new("agent"), AppendOptions { expected_version: Some(7), ..AppendOptions::default() })
            .await
            .map(drop),
        store.append(&key, event_with(EVENT_ID, json!({}), "other content"), AppendOptions::default()).await.map(drop),
        store.rewind(&key, 99, None).await.map(drop),
        store.create(secret_session().with_id("obs-session\0nul")).await.map(drop),
        store.create(secret_session()).await.map(drop),
        store.append(&old_day, Event::new("agent"), AppendOptions::default()).await.map(drop),
    ];
    // Each call failed as expected, so the spans below describe real errors.
    assert!(
        matches!(
            &errors,
            [
                Err(StoreError::NotFound(_)),
                Err(StoreError::StaleSession { .. }),
                Err(StoreError::DuplicateEvent { .. }),
                Err(StoreError::InvalidInput { .. }),
                Err(StoreError::InvalidInput { .. }),
                Err(StoreError::AlreadyExists(_)),
                Err(StoreError::PartitionMissing { .. }),
            ]
        ),
        "{errors:?}"
    );

    let seen = collector.take();
    let outcomes: Vec<_> = seen
        .store_spans()
        .iter()
        .map(|span| (span.field("operation").unwrap_or_default(), span.field("outcome").unwrap_or_default()))
        .collect();
    assert_eq!(
        outcomes,
        [
            ("get", "not_found"),
            ("append", "stale_session"),
            ("append", "duplicate_event"),
            ("rewind", "invalid_input"),
            ("create", "invalid_input"),
            ("create", "already_exists"),
            ("append", "partition_missing"),
        ]
    );
    for span in seen.store_spans() {
        assert_eq!(span.field("app"), Some(APP), "{span:?}");
        assert!(span.field("duration_ms").is_some(), "{span:?}");
    }
    // Most of these errors' messages name the session key; the missing
    // partition also logged its attempt to make one, inside the span.
    assert!(seen.events.iter().any(|e| e.scope.first() == Some(&SPAN_NAME) && e.fields.contains_key("missing")));
    seen.assert_no_secrets();
}

/// A metric as the debugging recorder kept it: its labels, unit and values.
#[derive(Debug)]
struct Metric {
    name: String,
    labels: BTreeMap<String, String>,
    unit: Option<metrics::Unit>,
    value: DebugValue,
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

#[tokio::test(flavor = "current_thread")]
async fn metrics_record_latency_by_outcome_and_errors_by_kind() {
    let db = test_database().await;
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    // For this thread only, which runs every poll of the store's futures.
    let _recorder = metrics::set_default_local_recorder(&recorder);
    let store = store(db.url()).await;

    let key = store.create(secret_session()).await.expect("create").key;
    for _ in 0..2 {
        store.append(&key, Event::new("agent"), AppendOptions::default()).await.expect("append");
    }
    let missing = SessionKey::new(app(), user(), SessionId::new("obs-session-51aa-gone").expect("id"));
    assert!(matches!(store.get(&missing, GetOptions::default()).await, Err(StoreError::NotFound(_))));
    let stale = store
        .append(&key, Event::new("agent"), AppendOptions { expected_version: Some(0), ..AppendOptions::default() })
        .await;
    assert!(matches!(stale, Err(StoreError::StaleSession { .. })), "{stale:?}");

    let metrics: Vec<Metric> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, unit, _description, value)| Metric {
            name: key.key().name().to_owned(),
            labels: key.key().labels().map(|l| (l.key().to_owned(), l.value().to_owned())).collect(),
            unit,
            value,
        })
        .collect();
    let find = |name: &str, pairs: &[(&str, &str)]| {
        let wanted = labels(pairs);
        metrics.iter().find(|m| m.name == name && m.labels == wanted)
    };

    for (operation, outcome, count) in
        [("create", "ok", 1), ("append", "ok", 2), ("get", "not_found", 1), ("append", "stale_session", 1)]
    {
        let metric = find(DURATION_METRIC, &[("operation", operation), ("outcome", outcome)])
            .unwrap_or_else(|| panic!("no {DURATION_METRIC} for {operation}/{outcome} in {metrics:#?}"));
        let DebugValue::Histogram(values) = &metric.value else { panic!("{metric:?} is not a histogram") };
        assert_eq!(values.len(), count, "{metric:?}");
        assert!(values.iter().all(|v| (0.0..60.0).contains(&v.0)), "{metric:?} is in seconds");
        assert_eq!(metric.unit, Some(metrics::Unit::Seconds), "{metric:?}");
    }
    let errors: Vec<_> = metrics.iter().filter(|m| m.name == ERRORS_METRIC).collect();
    assert_eq!(errors.len(), 2, "only failures are counted: {errors:#?}");
    for (operation, kind) in [("get", "not_found"), ("append", "stale_session")] {
        let metric = find(ERRORS_METRIC, &[("operation", operation), ("kind", kind)])
            .unwrap_or_else(|| panic!("no {ERRORS_METRIC} for {operation}/{kind} in {metrics:#?}"));
        assert_eq!(metric.value, DebugValue::Counter(1), "{metric:?}");
    }
    assert_eq!(metrics.len(), 4 + 2, "nothing else is recorded: {metrics:#?}");

    // Labels stay bounded: no app, user or session, whatever the request.
    for metric in &metrics {
        for (name, value) in &metric.labels {
            assert!(["operation", "outcome", "kind"].contains(&name.as_str()), "{metric:?}");
            assert!(!value.contains(APP) && SECRETS.iter().all(|s| !value.contains(s)), "{metric:?}");
        }
    }
}
