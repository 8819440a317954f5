//! Redacting events leaves every rollup figure as it was: redacted after
//! the rollup counted them, and redacted before it ever saw them, against
//! a control app holding the same events unredacted.

use adk_postgres_domain::{AppName, AppendOptions, CreateSession, Event, RedactOptions, SessionStore, UserId};
use adk_postgres_rollup::{RollupConfig, run_rollup};
use adk_postgres_testing::test_database;
use adk_postgres_tests::pg::store;
use serde_json::json;
use tokio_postgres::Client;

/// One invocation with an event of every kind the rollup tells apart, each
/// carrying text and usage.
fn conversation() -> Vec<Event> {
    let base = chrono::Utc::now() - chrono::Duration::minutes(5);
    [
        json!({"author": "user", "content": {"role": "user", "parts": [{"text": "my card is 4111-1111"}]}}),
        json!({"author": "shop", "content": {"role": "model", "parts": [
                  {"functionCall": {"name": "charge", "args": {"pan": "4111-1111"}}}]},
               "usage_metadata": {"prompt_token_count": 120, "candidates_token_count": 30,
                                  "total_token_count": 150, "cost": 0.0125}}),
        json!({"author": "shop", "content": {"role": "user", "parts": [
                  {"functionResponse": {"name": "charge", "response": {"ok": "charged 4111-1111"}}}]}}),
        json!({"author": "shop", "error_code": "SAFETY", "error_message": "refused 4111-1111",
               "usage_metadata": {"prompt_token_count": 10, "total_token_count": 10}}),
        json!({"author": "shop", "content": {"role": "model", "parts": [{"text": "charged 4111-1111, thanks"}]},
               "usage_metadata": {"prompt_token_count": 200, "candidates_token_count": 40,
                                  "total_token_count": 240, "cost": 0.02}}),
    ]
    .into_iter()
    .enumerate()
    .map(|(i, fields)| {
        let mut event = Event::new("x");
        event.id = format!("e{i}");
        event.invocation_id = "inv-1".into();
        event.timestamp = base + chrono::Duration::milliseconds(1_700 * i as i64);
        event.actions.state_delta = json!({ format!("k{i}"): i }).as_object().cloned().unwrap_or_default();
        let mut value = serde_json::to_value(&event).expect("json");
        if let (Some(into), Some(from)) = (value.as_object_mut(), fields.as_object()) {
            into.extend(from.clone());
        }
        Event::from_value(value).expect("event")
    })
    .collect()
}

/// Every row of every level for `app`, without the app: what `usage`
/// reports from (counts, sums, sketches).
async fn figures(sql: &Client, app: &str) -> Vec<String> {
    let mut all = Vec::new();
    for table in ["adk_usage_1m", "adk_usage_1h", "adk_usage_1d"] {
        let rows = sql
            .query(
                &format!(
                    "SELECT (pg_catalog.to_jsonb(u) - 'app_name')::text FROM {table} u WHERE u.app_name = $1
                      ORDER BY u.bucket_start, u.author, u.kind"
                ),
                &[&app],
            )
            .await
            .expect("usage rows");
        all.extend(rows.iter().map(|r| format!("{table} {}", r.get::<_, String>(0))));
    }
    all
}

#[tokio::test(flavor = "multi_thread")]
async fn redaction_before_or_after_the_rollup_leaves_every_figure_as_it_was() {
    let db = test_database().await;
    let store = store(db.url()).await;
    let sql = db.connect().await;
    let user = UserId::new("u").expect("user");
    let mut keys = Vec::new();
    for app in ["before", "after", "control"] {
        let request = CreateSession::new(AppName::new(app).expect("app"), user.clone()).with_id("s");
        let key = store.create(request).await.expect("create").key;
        for event in conversation() {
            store.append(&key, event, AppendOptions::default()).await.expect("append");
        }
        keys.push(key);
    }
    let redact_all = async |key| {
        for event in conversation() {
            let options = RedactOptions { state_delta: event.id == "e1" };
            store.redact_event(key, &event.id, "pasted a card number", options).await.expect("redact");
        }
    };

    redact_all(&keys[0]).await;
    let first = run_rollup(db.url(), &RollupConfig::default()).await.expect("rollup");
    assert_eq!(first.events_rolled_up, 15, "{first}");
    let control = figures(&sql, "control").await;
    let kinds: i64 = sql
        .query_one("SELECT count(DISTINCT kind) FROM adk_usage_1m WHERE app_name = 'control'", &[])
        .await
        .expect("kinds")
        .get(0);
    assert_eq!(kinds, 5, "every kind is in the test: {control:#?}");
    assert_eq!(figures(&sql, "before").await, control, "redacted before the rollup read them");

    redact_all(&keys[1]).await;
    let second = run_rollup(db.url(), &RollupConfig::default()).await.expect("rollup");
    assert_eq!(second.events_rolled_up, 0, "a redaction is not an arrival: {second}");
    assert_eq!(figures(&sql, "after").await, control, "redacted after the rollup counted them");
    assert_eq!(figures(&sql, "control").await, control);

    let leaked: i64 = sql
        .query_one("SELECT count(*) FROM adk_events WHERE app_name <> 'control' AND payload::text LIKE '%4111%'", &[])
        .await
        .expect("leaks")
        .get(0);
    assert_eq!(leaked, 0, "no redacted payload holds the text");
}
