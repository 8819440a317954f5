//! adk-session's `EncryptedSession` (feature `encrypted-session`) over
//! `PgSessionService`, on a real PostgreSQL, with our tables read directly:
//! what it encrypts never reaches them in plaintext (and does without the
//! wrapper, so the check can fail), what it leaves in plaintext is pinned,
//! key rotation reads old data, a wrong key is an error, and the adapter's
//! own rewind and fork meet ciphertext bound to a session. The docs'
//! snippet (docs/adk-rust.md, "Encryption at rest with EncryptedSession") is
//! run here line for line.
#![cfg(feature = "postgres")]

use std::collections::HashMap;

use adk_core::{AdkIdentity, Content};
use adk_postgres_adk::PgSessionService;
use adk_postgres_testing::{TestDatabase, test_database};
use adk_session::{
    AppendEventRequest, CreateRequest, EncryptedSession, EncryptionKey, Event, GetRequest, ListRequest, SessionService,
};
use serde_json::{Value, json};

const ENCRYPTED_APP: &str = "vault";
const PLAIN_APP: &str = "plain";
const USER: &str = "alice";
const SESSION: &str = "s-1";

/// One distinctive string per place a secret is written, so a failure says
/// which path leaked.
const SECRETS: [&str; 7] = [
    "zq-create-session-7f3a",
    "zq-create-user-91c2",
    "zq-create-app-4e8d",
    "zq-delta-session-b5a0",
    "zq-delta-user-2d6f",
    "zq-delta-app-c719",
    "zq-content-text-83e1",
];
const ENVELOPE: &str = "adk-enc:v1:";
const DECRYPT_FAILED: &str = "session.encryption.decrypt_failed";

fn key(byte: u8) -> EncryptionKey {
    EncryptionKey::from_bytes(&[byte; 32]).expect("32 bytes")
}

fn map(value: Value) -> HashMap<String, Value> {
    serde_json::from_value(value).expect("a JSON object")
}

fn create_request(app: &str, session_id: &str) -> CreateRequest {
    CreateRequest {
        app_name: app.into(),
        user_id: USER.into(),
        session_id: Some(session_id.into()),
        state: map(json!({
            "profile": SECRETS[0],
            "user:name": SECRETS[1],
            "app:motd": SECRETS[2],
            "temp:draft": "never stored",
        })),
    }
}

fn get_request(app: &str, session_id: &str) -> GetRequest {
    GetRequest {
        app_name: app.into(),
        user_id: USER.into(),
        session_id: session_id.into(),
        num_recent_events: None,
        after: None,
    }
}

fn list_request(app: &str) -> ListRequest {
    ListRequest { app_name: app.into(), user_id: USER.into(), limit: None, offset: None }
}

fn identity(app: &str, session_id: &str) -> AdkIdentity {
    AdkIdentity::new(app.try_into().unwrap(), USER.try_into().unwrap(), session_id.try_into().unwrap())
}

/// The events a conversation appends: a user message, then a model turn
/// that writes a state delta into every scope.
fn conversation() -> Vec<Event> {
    let mut question = Event::new("inv-enc");
    question.author = "user".into();
    question.llm_response.content = Some(Content::new("user").with_text(format!("my note: {}", SECRETS[6])));

    let mut answer = Event::new("inv-enc");
    answer.author = "planner".into();
    answer.branch = "root.planner".into();
    answer.llm_response.content = Some(Content::new("model").with_text("noted"));
    answer.actions.state_delta = map(json!({
        "plan": SECRETS[3],
        "user:card": SECRETS[4],
        "app:flag": SECRETS[5],
    }));
    vec![question, answer]
}

fn expected_state() -> HashMap<String, Value> {
    map(json!({
        "profile": SECRETS[0],
        "user:name": SECRETS[1],
        "app:motd": SECRETS[2],
        "plan": SECRETS[3],
        "user:card": SECRETS[4],
        "app:flag": SECRETS[5],
    }))
}

/// Creates the session and appends the conversation through `service`.
async fn write(service: &dyn SessionService, app: &str, session_id: &str) -> Vec<Event> {
    service.create(create_request(app, session_id)).await.expect("create");
    let events = conversation();
    for event in &events {
        let request = AppendEventRequest { identity: identity(app, session_id), event: event.clone() };
        service.append_event_for_identity(request).await.expect("append");
    }
    events
}

fn as_json(events: &[Event]) -> Vec<Value> {
    events.iter().map(|e| serde_json::to_value(e).expect("serialize an event")).collect()
}

async fn connect(db: &TestDatabase) -> PgSessionService {
    PgSessionService::connect(db.url()).await.expect("connect")
}

/// Every row of an app in our four tables, each as PostgreSQL's text of the
/// whole row (identity columns, jsonb, timestamps), named by its table.
async fn stored_rows(db: &TestDatabase, app: &str) -> Vec<(String, String)> {
    let client = db.connect().await;
    let sql = "SELECT 'adk_sessions', t::text FROM adk_sessions t WHERE app_name = $1
               UNION ALL SELECT 'adk_user_states', t::text FROM adk_user_states t WHERE app_name = $1
               UNION ALL SELECT 'adk_app_states', t::text FROM adk_app_states t WHERE app_name = $1
               UNION ALL SELECT 'adk_events', t::text FROM adk_events t WHERE app_name = $1";
    let rows = client.query(sql, &[&app]).await.expect("read our tables");
    let mut rows: Vec<(String, String)> = rows.iter().map(|row| (row.get(0), row.get(1))).collect();
    rows.sort();
    rows
}

async fn stored_events(db: &TestDatabase, app: &str, session_id: &str) -> Vec<(String, Option<String>, String, Value)> {
    let client = db.connect().await;
    let sql = "SELECT event_id, invocation_id, author, payload FROM adk_events
               WHERE app_name = $1 AND user_id = $2 AND session_id = $3 ORDER BY seq";
    let rows = client.query(sql, &[&app, &USER, &session_id]).await.expect("read adk_events");
    rows.iter().map(|row| (row.get(0), row.get(1), row.get(2), row.get(3))).collect()
}

fn assert_decrypt_failed(result: adk_core::Result<impl Sized>, what: &str) {
    match result {
        Ok(_) => panic!("{what}: read with a key that never wrote the data, and succeeded"),
        Err(error) => assert_eq!(error.code, DECRYPT_FAILED, "{what}: {error}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn encrypted_session_reads_back_what_it_wrote_and_stores_no_plaintext() {
    let db = test_database().await;
    let service = EncryptedSession::new(connect(&db).await, key(1), vec![]);
    let written = write(&service, ENCRYPTED_APP, SESSION).await;

    let session = service.get(get_request(ENCRYPTED_APP, SESSION)).await.expect("get");
    assert_eq!(session.state().all(), expected_state(), "temp: dropped, every other value decrypted");
    assert_eq!(as_json(&session.events().all()), as_json(&written), "events read back field for field");
    let listed = service.list(list_request(ENCRYPTED_APP)).await.expect("list");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].state().all(), expected_state());

    // The control: the same writes without the wrapper put every secret in
    // our tables, so the search below can find one.
    write(&connect(&db).await, PLAIN_APP, SESSION).await;
    let plain = stored_rows(&db, PLAIN_APP).await;
    for secret in SECRETS {
        assert!(
            plain.iter().any(|(_, text)| text.contains(secret)),
            "control: {secret} was written without encryption but is not found in our tables: {plain:#?}"
        );
    }

    let encrypted = stored_rows(&db, ENCRYPTED_APP).await;
    let tables: std::collections::BTreeSet<&str> = encrypted.iter().map(|(table, _)| table.as_str()).collect();
    assert_eq!(tables.len(), 4, "a row in each of our tables: {tables:?}");
    // What encryption costs in stored size, for the docs.
    for table in &tables {
        let size =
            |rows: &[(String, String)]| rows.iter().filter(|(t, _)| t == table).map(|(_, r)| r.len()).sum::<usize>();
        eprintln!("encrypted_session: {table}: {} bytes as text encrypted, {} plain", size(&encrypted), size(&plain));
    }
    for (table, text) in &encrypted {
        for secret in SECRETS {
            assert!(!text.contains(secret), "{secret} is stored in plaintext in {table}: {text}");
        }
        assert!(text.contains(ENVELOPE), "{table}: no ciphertext in {text}");
    }
}

/// Users must know what is not protected at rest: identities, state key
/// names, and each event's id, invocation id, author, branch and timestamp.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn encrypted_session_leaves_keys_and_event_metadata_in_plaintext() {
    let db = test_database().await;
    let service = EncryptedSession::new(connect(&db).await, key(1), vec![]);
    let written = write(&service, ENCRYPTED_APP, SESSION).await;

    let client = db.connect().await;
    let state = |sql: &'static str| {
        let client = &client;
        async move { client.query_one(sql, &[&ENCRYPTED_APP]).await.expect(sql).get::<_, Value>(0) }
    };
    // Key names stay so the store routes and merges by scope; each value is
    // one envelope string.
    let scopes = [
        (state("SELECT state FROM adk_sessions WHERE app_name = $1").await, ["plan", "profile"]),
        (state("SELECT state FROM adk_user_states WHERE app_name = $1").await, ["card", "name"]),
        (state("SELECT state FROM adk_app_states WHERE app_name = $1").await, ["flag", "motd"]),
    ];
    for (stored, keys) in &scopes {
        let mut names: Vec<&str> = stored.as_object().expect("an object").keys().map(String::as_str).collect();
        names.sort_unstable();
        assert_eq!(names, keys, "{stored}");
        for value in stored.as_object().expect("an object").values() {
            assert!(value.as_str().is_some_and(|v| v.starts_with(ENVELOPE)), "not an envelope: {value}");
        }
    }

    let stored = stored_events(&db, ENCRYPTED_APP, SESSION).await;
    assert_eq!(stored.len(), written.len());
    for ((id, invocation_id, author, payload), original) in stored.iter().zip(&written) {
        assert_eq!((id, invocation_id.as_deref(), author), (&original.id, Some("inv-enc"), &original.author));
        if !original.branch.is_empty() {
            assert_eq!(payload["branch"], json!(original.branch), "{payload}");
        }
        // The content, the user's message included, is one envelope in a
        // text part the wrapper marks as the model's: the role is not kept.
        let text = payload["content"]["parts"][0]["text"].as_str().unwrap_or_default();
        assert!(text.starts_with(ENVELOPE), "{payload}");
        assert_eq!(payload["content"]["role"], "model", "{payload}");
    }
    let client = db.connect().await;
    let ts: i64 = client
        .query_one("SELECT event_ts FROM adk_events WHERE event_id = $1", &[&written[0].id])
        .await
        .expect("event_ts")
        .get(0);
    assert_eq!(Some(ts), written[0].timestamp.timestamp_nanos_opt(), "event_ts is the event's own, to the ns");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn encrypted_session_key_rotation_reads_data_written_under_the_previous_key() {
    let db = test_database().await;
    let old = EncryptedSession::new(connect(&db).await, key(1), vec![]);
    let written = write(&old, ENCRYPTED_APP, SESSION).await;

    let rotated = EncryptedSession::new(old.into_inner(), key(2), vec![key(1)]);
    let session = rotated.get(get_request(ENCRYPTED_APP, SESSION)).await.expect("get under the new key");
    assert_eq!(session.state().all(), expected_state());
    assert_eq!(as_json(&session.events().all()), as_json(&written));

    // That get re-encrypted the state under the new key by appending one
    // state-only event, which the wrapper hides from its readers.
    let stored = stored_events(&db, ENCRYPTED_APP, SESSION).await;
    let authors: Vec<&str> = stored.iter().map(|(_, _, author, _)| author.as_str()).collect();
    assert_eq!(authors, ["user", "planner", "__adk_session_key_rotation__"]);
    let again = rotated.get(get_request(ENCRYPTED_APP, SESSION)).await.expect("get again");
    assert_eq!(again.events().len(), written.len(), "the rotation event is hidden");
    assert_eq!(stored_events(&db, ENCRYPTED_APP, SESSION).await.len(), 3, "nothing left to rotate");

    // State is now readable under the new key alone (list reads no
    // events), but events cannot be rewritten: the old key must stay in
    // `previous_keys` until the sessions it wrote are gone.
    let new_only = EncryptedSession::new(rotated.into_inner(), key(2), vec![]);
    let listed = new_only.list(list_request(ENCRYPTED_APP)).await.expect("list under the new key alone");
    assert_eq!(listed[0].state().all(), expected_state());
    assert_decrypt_failed(new_only.get(get_request(ENCRYPTED_APP, SESSION)).await, "events under the retired key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn encrypted_session_with_the_wrong_key_fails_and_writes_nothing() {
    let db = test_database().await;
    write(&EncryptedSession::new(connect(&db).await, key(1), vec![]), ENCRYPTED_APP, SESSION).await;
    let before = stored_rows(&db, ENCRYPTED_APP).await;

    let wrong = EncryptedSession::new(connect(&db).await, key(3), vec![key(4)]);
    assert_decrypt_failed(wrong.get(get_request(ENCRYPTED_APP, SESSION)).await, "get");
    assert_decrypt_failed(wrong.list(list_request(ENCRYPTED_APP)).await, "list");
    assert_eq!(stored_rows(&db, ENCRYPTED_APP).await, before, "a failed read rotated or wrote something");

    // Without the wrapper the ciphertext reads as what it is, never as
    // plausible values.
    let raw = connect(&db).await.get(get_request(ENCRYPTED_APP, SESSION)).await.expect("raw get");
    assert!(raw.state().all().values().all(|v| v.as_str().is_some_and(|v| v.starts_with(ENVELOPE))));
}

/// adk's trait has no rewind for the wrapper to pass on, and ciphertext is
/// bound to its session id: the adapter's rewind through `inner()` keeps the
/// session readable, its fork does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn encrypted_session_rewinds_through_inner_and_cannot_read_a_fork() {
    let db = test_database().await;
    let service = EncryptedSession::new(connect(&db).await, key(1), vec![]);
    let written = write(&service, ENCRYPTED_APP, SESSION).await;

    let err = service.rewind(SESSION, &written[0].id).await.err().expect("the wrapper has no rewind");
    assert!(err.message.contains("not supported"), "{err}");
    let err = service.append_event(SESSION, Event::new("inv")).await.expect_err("a bare id");
    assert_eq!(err.code, "session.encryption.identity_required", "{err}");

    service.inner().rewind(SESSION, &written[0].id).await.expect("the adapter's rewind");
    let rewound = service.get(get_request(ENCRYPTED_APP, SESSION)).await.expect("get after the rewind");
    assert_eq!(as_json(&rewound.events().all()), as_json(&written[..1]));
    assert_eq!(rewound.state().get("plan"), None, "the rewound delta's session key is gone");
    assert_eq!(rewound.state().get("profile"), Some(json!(SECRETS[0])));

    service.inner().fork(&identity(ENCRYPTED_APP, SESSION), &written[0].id, Some("fork".into())).await.expect("fork");
    assert_decrypt_failed(service.get(get_request(ENCRYPTED_APP, "fork")).await, "a fork of an encrypted session");
}

// The docs' snippet, run. `url` and the two keys' bytes stand in for what an
// application reads from its configuration and its secret manager.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn encrypted_session_docs_snippet_runs() -> adk_core::Result<()> {
    let db = test_database().await;
    let url = db.url();
    let (current_key_bytes, next_key_bytes) = ([7u8; 32], [8u8; 32]);

    use adk_postgres_adk::PgSessionService;
    use adk_session::{EncryptedSession, EncryptionKey, SessionService};
    use std::sync::Arc;

    // 32 bytes the application keeps in its secret manager, never with the data
    // (EncryptionKey::from_env reads them base64 from an environment variable).
    let key = EncryptionKey::from_bytes(&current_key_bytes)?;
    let service: Arc<dyn SessionService> =
        Arc::new(EncryptedSession::new(PgSessionService::connect(url).await?, key, vec![]));
    // `service` is the Runner's session_service, as in the README.

    // Rotating: the new key writes, the retired key still reads.
    let rotated = EncryptedSession::new(
        PgSessionService::connect(url).await?,
        EncryptionKey::from_bytes(&next_key_bytes)?,
        vec![EncryptionKey::from_bytes(&current_key_bytes)?],
    );

    let written = write(service.as_ref(), ENCRYPTED_APP, SESSION).await;
    let session = rotated.get(get_request(ENCRYPTED_APP, SESSION)).await?;
    assert_eq!(session.state().all(), expected_state());
    assert_eq!(as_json(&session.events().all()), as_json(&written));
    Ok(())
}

const DOCS: &str = include_str!("../../../../docs/adk-rust.md");
const DOCS_SECTION: &str = "## Encryption at rest with EncryptedSession";
const THIS_FILE: &str = include_str!("encrypted_session.rs");

#[test]
fn encrypted_session_docs_snippet_is_the_one_run_here() {
    let start =
        DOCS.find(&format!("\n{DOCS_SECTION}\n")).unwrap_or_else(|| panic!("docs/adk-rust.md has no `{DOCS_SECTION}`"));
    let section = &DOCS[start + DOCS_SECTION.len() + 2..];
    let section = &section[..section.find("\n## ").unwrap_or(section.len())];
    let mut blocks: Vec<Vec<&str>> = Vec::new();
    let mut current: Option<Vec<&str>> = None;
    for line in section.lines() {
        match (&mut current, line.trim()) {
            (None, "```rust") => current = Some(Vec::new()),
            (Some(_), "```") => blocks.extend(current.take()),
            (Some(block), text) => block.push(text),
            (None, _) => {}
        }
    }
    assert_eq!(blocks.len(), 1, "`{DOCS_SECTION}` must hold exactly one closed ```rust block: {blocks:#?}");
    let block = &blocks[0];
    let here: Vec<&str> = THIS_FILE.lines().map(str::trim).collect();
    let found = here.windows(block.len()).any(|window| window == block.as_slice());
    assert!(
        found,
        "the ```rust block of docs/adk-rust.md's `{DOCS_SECTION}` is not, line for line, in \
         encrypted_session_docs_snippet_runs (crates/adk/tests/adk/encrypted_session.rs):\n{}",
        block.join("\n")
    );
}
