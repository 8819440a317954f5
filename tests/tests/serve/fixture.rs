//! What the `adk-pg serve` tests share: a store filled the way a working
//! deployment fills it, the server started in-process on a free loopback
//! port, and a plain HTTP client. (The SQL the server sends is recorded by
//! the testing crate's `WireProxy`.)

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration as StdDuration;

use adk_postgres_dashboard::{DashboardError, ServeConfig, Server};
use adk_postgres_domain::{AppName, AppendOptions, CreateSession, Event, SessionKey, SessionStore, UserId};
use adk_postgres_retention::{MaintenanceConfig, run_maintenance};
use adk_postgres_rollup::{RollupConfig, run_rollup};
use adk_postgres_tests::pg;
use chrono::{DateTime, Duration, NaiveDate, Utc};
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use serde_json::json;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

// ---------------------------------------------------------------------------
// A store with a day of traffic
// ---------------------------------------------------------------------------

/// The apps and their agents: a support desk with a router, a billing
/// agent and a knowledge-base search, and a smaller shop assistant.
pub const APPS: [(&str, &[&str], usize); 2] =
    [("support-desk", &["triage", "billing_agent", "kb_search"], 28), ("shop-assistant", &["catalog", "checkout"], 16)];

/// What the fixture wrote, to check the figures against.
#[derive(Debug)]
pub struct Fixture {
    pub today: NaiveDate,
    /// Events appended per app, not counting late ones.
    pub events: HashMap<&'static str, i64>,
    /// Sessions made to look expired.
    pub expired: usize,
    /// Events rejected as late by the rollup, per app.
    pub late: HashMap<&'static str, i64>,
}

/// A deterministic number in [0, 1) for `(i, salt)`: varied, repeatable.
fn jitter(i: u64, salt: u64) -> f64 {
    let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ salt.wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
    x ^= x >> 31;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 29;
    (x % 10_000) as f64 / 10_000.0
}

fn at(base: DateTime<Utc>, millis: f64) -> DateTime<Utc> {
    base + Duration::milliseconds(millis as i64)
}

/// Fills the store at `url`: sessions over the last day with
/// conversations as adk-rust writes them (user messages, tool calls and
/// results, model responses with `usage_metadata`, some errors), user and
/// app state, a few expired sessions and a rolled-over one; then a
/// maintenance run and a rollup run, as `adk-pg maintain` and `adk-pg
/// rollup` would. With `late`, one app also sends an event stamped three
/// days ago, which the rollup rejects as late.
pub async fn realistic(url: &str, late: bool) -> Fixture {
    let store = pg::store(url).await;
    let sql = pg::client(url).await;
    let now: DateTime<Utc> = sql.query_one("SELECT now()", &[]).await.expect("read the clock").get(0);
    let mut events: HashMap<&'static str, i64> = HashMap::new();
    let mut keys: Vec<SessionKey> = Vec::new();
    let mut serial = 0u64;
    for (app, agents, sessions) in APPS {
        for s in 0..sessions {
            serial += 1;
            let user = format!("user-{}", (s * 7) % 11);
            let request =
                CreateSession::new(AppName::new(app).expect("app"), UserId::new(user.as_str()).expect("user"));
            let key = store.create(request).await.expect("create a session").key;
            // Started over the last 22 hours up to an hour ago, so that
            // every event is in the past; in waves of busier hours.
            let offset = (s as f64 + jitter(serial, 1)) / sessions as f64;
            let start = now - Duration::hours(22) + Duration::milliseconds((offset * 21.0 * 3_600_000.0) as i64);
            let wave = 0.5 + 0.5 * (offset * std::f64::consts::TAU * 1.5).sin();
            let invocations = 1 + (wave * 3.0).round() as usize;
            for k in 0..invocations {
                let invocation = format!("inv-{serial}-{k}");
                let mut t = start + Duration::minutes(6 * k as i64);
                let agent = agents[(s + k) % agents.len()];
                let mut event = Event::new("user");
                event.timestamp = t;
                event.invocation_id = invocation.clone();
                event.content = Some(json!({"role": "user", "parts": [{"text": "where is my order?"}]}));
                if k == 0 {
                    event.actions.state_delta.insert("user:tier".into(), json!(["bronze", "silver", "gold"][s % 3]));
                    event.actions.state_delta.insert("app:motd".into(), json!(format!("{app} is open")));
                    event.actions.state_delta.insert("topic".into(), json!("orders"));
                }
                let mut batch = vec![event];
                t = at(t, 300.0 + 2_500.0 * jitter(serial, 10 + k as u64));
                let mut call = Event::new(agent);
                call.timestamp = t;
                call.invocation_id = invocation.clone();
                call.content = Some(
                    json!({"role": "model", "parts": [{"functionCall": {"name": "lookup", "args": {"q": "order"}}}]}),
                );
                call.extra.insert(
                    "usage_metadata".into(),
                    json!({"prompt_token_count": 180, "candidates_token_count": 20, "total_token_count": 200}),
                );
                batch.push(call);
                t = at(t, 40.0 + 400.0 * jitter(serial, 20 + k as u64));
                let mut result = Event::new(agent);
                result.timestamp = t;
                result.invocation_id = invocation.clone();
                result.content = Some(
                    json!({"role": "user", "parts": [{"functionResponse": {"name": "lookup", "response": {"status": "shipped"}}}]}),
                );
                batch.push(result);
                t = at(t, 600.0 + 6_000.0 * jitter(serial, 30 + k as u64));
                let mut answer = Event::new(agent);
                answer.timestamp = t;
                answer.invocation_id = invocation.clone();
                if (serial + k as u64) % 9 == 4 {
                    answer.extra.insert("error_code".into(), json!("RATE_LIMITED"));
                    answer.extra.insert("error_message".into(), json!("quota exceeded"));
                } else {
                    let prompt = 400 + (900.0 * jitter(serial, 40 + k as u64)) as i64;
                    let output = 60 + (300.0 * jitter(serial, 50 + k as u64)) as i64;
                    let thinking = if k % 2 == 0 { 120 } else { 0 };
                    answer.content = Some(json!({"role": "model", "parts": [{"text": "It ships tomorrow."}]}));
                    answer.extra.insert(
                        "usage_metadata".into(),
                        json!({"prompt_token_count": prompt, "candidates_token_count": output,
                               "thoughts_token_count": thinking, "total_token_count": prompt + output + thinking}),
                    );
                }
                batch.push(answer);
                for event in batch {
                    store.append(&key, event, AppendOptions::default()).await.expect("append");
                    *events.entry(app).or_default() += 1;
                }
            }
            keys.push(key);
        }
    }
    // Three sessions past their time, not purged yet; one rolled over.
    let expired = 3;
    for key in keys.iter().take(expired) {
        sql.execute(
            "UPDATE adk_sessions SET expires_at = now() - interval '1 hour'
             WHERE app_name = $1 AND user_id = $2 AND session_id = $3",
            &[&key.app_name.as_str(), &key.user_id.as_str(), &key.session_id.as_str()],
        )
        .await
        .expect("expire a session");
    }
    let mut summary = Event::new("triage");
    summary.content = Some(json!({"role": "model", "parts": [{"text": "summary so far"}]}));
    let rolled = keys.last().expect("a session");
    store.rollover(rolled, None, summary).await.expect("roll a session over");
    *events.entry(APPS[1].0).or_default() += 1;

    let mut late_counts = HashMap::new();
    if late {
        let key = &keys[expired];
        let mut stale = Event::new("triage");
        stale.timestamp = now - Duration::days(3);
        store.append(key, stale, AppendOptions::default()).await.expect("append a late event");
        late_counts.insert(APPS[0].0, 1);
    }

    let today = now.date_naive();
    run_maintenance(url, today, &MaintenanceConfig::default()).await.expect("maintenance");
    let rollup = run_rollup(url, &RollupConfig::default()).await.expect("rollup");
    assert!(rollup.advanced(), "{rollup:?}");
    Fixture { today, events, expired, late: late_counts }
}

// ---------------------------------------------------------------------------
// The server, in-process
// ---------------------------------------------------------------------------

/// A running server; stopped when dropped.
pub struct Running {
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), DashboardError>>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// Serves `config` on a free loopback port.
pub async fn serve(config: ServeConfig) -> Running {
    let config = ServeConfig { listen: "127.0.0.1:0".parse().expect("an address"), ..config };
    let server = Server::bind(config).await.expect("start the server");
    let addr = server.local_addr().expect("its address");
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(server.serve(async move {
        let _ = stopped.await;
    }));
    Running { addr, stop: Some(stop), task: Some(task) }
}

/// The server's answer.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: hyper::HeaderMap,
    pub body: String,
}

impl Answer {
    pub fn header(&self, name: &str) -> &str {
        self.headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default()
    }
}

/// `GET path`, with `Authorization: Bearer <token>` when given.
pub async fn get(addr: SocketAddr, path: &str, token: Option<&str>) -> Answer {
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let mut request = hyper::Request::get(format!("http://{addr}{path}"));
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let request = request.body(Empty::new()).expect("a request");
    let response = tokio::time::timeout(StdDuration::from_secs(60), client.request(request))
        .await
        .unwrap_or_else(|_| panic!("GET {path} did not answer within a minute"))
        .unwrap_or_else(|e| panic!("GET {path}: {e}"));
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response.into_body().collect().await.expect("the body").to_bytes();
    Answer { status, headers, body: String::from_utf8_lossy(&body).into_owned() }
}

/// The metrics of a scrape, by name and labels.
pub fn parse_metrics(text: &str) -> prometheus_parse::Scrape {
    prometheus_parse::Scrape::parse(text.lines().map(|line| Ok(line.to_owned()))).expect("a Prometheus text scrape")
}

/// The value of the sample `name` whose labels include `labels`.
pub fn sample(scrape: &prometheus_parse::Scrape, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    scrape.samples.iter().find(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v))).map(
        |s| match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            _ => f64::NAN,
        },
    )
}
