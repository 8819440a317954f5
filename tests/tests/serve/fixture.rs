//! What the `adk-pg serve` tests share: a store filled the way a working
//! deployment fills it, the server started in-process on a free loopback
//! port, a plain HTTP client, and a recorder of the SQL the server sends.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
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
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
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

// ---------------------------------------------------------------------------
// Recording the SQL the server sends
// ---------------------------------------------------------------------------

/// One statement as the server sent it: its text, the types it declared
/// and the values it bound (binary or text, as `formats` says).
#[derive(Debug, Clone)]
pub struct Statement {
    pub sql: String,
    pub types: Vec<u32>,
    pub formats: Vec<i16>,
    pub values: Vec<Option<Vec<u8>>>,
}

/// A TCP proxy in front of PostgreSQL that passes everything through and
/// records each statement a client runs: simple queries, and extended
/// queries with their bound values. It reads the frontend protocol only;
/// the server's replies pass untouched.
pub struct SqlRecorder {
    pub addr: SocketAddr,
    statements: Arc<Mutex<Vec<Statement>>>,
    task: JoinHandle<()>,
}

impl Drop for SqlRecorder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl SqlRecorder {
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the recorder");
        let addr = listener.local_addr().expect("its address");
        let statements = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&statements);
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let sink = Arc::clone(&sink);
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(upstream).await else { return };
                    relay(client, server, sink).await;
                });
            }
        });
        Self { addr, statements, task }
    }

    /// Takes what was recorded so far.
    pub fn take(&self) -> Vec<Statement> {
        std::mem::take(&mut *self.statements.lock().expect("the recording"))
    }

    /// `url` pointed at the recorder instead of the server.
    pub fn url(&self, url: &str) -> String {
        let mut parsed = url::Url::parse(url).expect("a URL");
        parsed.set_port(Some(self.addr.port())).expect("set the port");
        // The recorder reads the wire protocol, which TLS would hide (the
        // test servers offer TLS, and `prefer` takes it).
        parsed.query_pairs_mut().append_pair("sslmode", "disable");
        parsed.to_string()
    }
}

async fn relay(client: TcpStream, server: TcpStream, sink: Arc<Mutex<Vec<Statement>>>) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let down = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
    });
    let mut parser = FrontendParser::default();
    let mut buffer = [0u8; 16 * 1024];
    loop {
        let n = match client_read.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if server_write.write_all(&buffer[..n]).await.is_err() {
            break;
        }
        for statement in parser.feed(&buffer[..n]) {
            sink.lock().expect("the recording").push(statement);
        }
    }
    let _ = server_write.shutdown().await;
    let _ = down.await;
}

/// The frontend side of the PostgreSQL protocol, enough to see statements.
#[derive(Default)]
struct FrontendParser {
    pending: Vec<u8>,
    started: bool,
    /// Prepared statements by name (`""` is the unnamed one).
    prepared: HashMap<String, (String, Vec<u32>)>,
}

fn cstr(bytes: &[u8], at: &mut usize) -> String {
    let end = bytes[*at..].iter().position(|b| *b == 0).map_or(bytes.len(), |p| *at + p);
    let text = String::from_utf8_lossy(&bytes[*at..end]).into_owned();
    *at = (end + 1).min(bytes.len());
    text
}

fn int16(bytes: &[u8], at: &mut usize) -> i16 {
    let value = i16::from_be_bytes([bytes[*at], bytes[*at + 1]]);
    *at += 2;
    value
}

fn int32(bytes: &[u8], at: &mut usize) -> i32 {
    let value = i32::from_be_bytes([bytes[*at], bytes[*at + 1], bytes[*at + 2], bytes[*at + 3]]);
    *at += 4;
    value
}

impl FrontendParser {
    fn feed(&mut self, bytes: &[u8]) -> Vec<Statement> {
        self.pending.extend_from_slice(bytes);
        let mut out = Vec::new();
        loop {
            if !self.started {
                // Untyped: length, then a code (a startup message, or an
                // SSL/GSS request after which another untyped one follows).
                if self.pending.len() < 8 {
                    return out;
                }
                let len = i32::from_be_bytes([self.pending[0], self.pending[1], self.pending[2], self.pending[3]]);
                let len = usize::try_from(len).expect("a length");
                if self.pending.len() < len {
                    return out;
                }
                let code = i32::from_be_bytes([self.pending[4], self.pending[5], self.pending[6], self.pending[7]]);
                self.pending.drain(..len);
                if code != 80_877_103 && code != 80_877_104 {
                    self.started = true;
                }
                continue;
            }
            if self.pending.len() < 5 {
                return out;
            }
            let kind = self.pending[0];
            let len = i32::from_be_bytes([self.pending[1], self.pending[2], self.pending[3], self.pending[4]]);
            let total = 1 + usize::try_from(len).expect("a length");
            if self.pending.len() < total {
                return out;
            }
            let body: Vec<u8> = self.pending[5..total].to_vec();
            self.pending.drain(..total);
            let mut at = 0;
            match kind {
                b'Q' => out.push(Statement {
                    sql: cstr(&body, &mut at),
                    types: Vec::new(),
                    formats: Vec::new(),
                    values: Vec::new(),
                }),
                b'P' => {
                    let name = cstr(&body, &mut at);
                    let sql = cstr(&body, &mut at);
                    let count = int16(&body, &mut at);
                    let types = (0..count).map(|_| int32(&body, &mut at) as u32).collect();
                    self.prepared.insert(name, (sql, types));
                }
                b'B' => {
                    let _portal = cstr(&body, &mut at);
                    let name = cstr(&body, &mut at);
                    let format_count = int16(&body, &mut at);
                    let formats: Vec<i16> = (0..format_count).map(|_| int16(&body, &mut at)).collect();
                    let value_count = int16(&body, &mut at);
                    let values = (0..value_count)
                        .map(|_| {
                            let len = int32(&body, &mut at);
                            (len >= 0).then(|| {
                                let len = len as usize;
                                let value = body[at..at + len].to_vec();
                                at += len;
                                value
                            })
                        })
                        .collect();
                    if let Some((sql, types)) = self.prepared.get(&name) {
                        out.push(Statement { sql: sql.clone(), types: types.clone(), formats, values });
                    }
                }
                _ => {}
            }
        }
    }
}

impl Statement {
    fn format_of(&self, index: usize) -> i16 {
        match self.formats.len() {
            0 => 0,
            1 => self.formats[0],
            _ => self.formats.get(index).copied().unwrap_or(0),
        }
    }

    /// Each bound value as an SQL literal with its type's name, to run the
    /// statement again under EXPLAIN; and the time values among them.
    pub fn literals(&self) -> (Vec<(String, String)>, Vec<DateTime<Utc>>) {
        let epoch = NaiveDate::from_ymd_opt(2000, 1, 1).expect("2000-01-01");
        let quote = |text: &str| format!("'{}'", text.replace('\'', "''"));
        let mut literals = Vec::new();
        let mut times = Vec::new();
        for (index, value) in self.values.iter().enumerate() {
            let oid = self.types.get(index).copied().unwrap_or(0);
            let type_name = match oid {
                16 => "boolean",
                20 => "bigint",
                23 => "integer",
                25 => "text",
                1043 => "varchar",
                1082 => "date",
                1114 => "timestamp",
                1184 => "timestamptz",
                other => panic!("a bound value of type oid {other} in {}", self.sql),
            };
            let Some(bytes) = value else {
                literals.push((type_name.to_owned(), "NULL".to_owned()));
                continue;
            };
            let literal = if self.format_of(index) == 0 {
                quote(&String::from_utf8_lossy(bytes))
            } else {
                match oid {
                    16 => (bytes[0] != 0).to_string(),
                    20 => i64::from_be_bytes(bytes[..8].try_into().expect("8 bytes")).to_string(),
                    23 => i32::from_be_bytes(bytes[..4].try_into().expect("4 bytes")).to_string(),
                    25 | 1043 => quote(&String::from_utf8_lossy(bytes)),
                    1082 => {
                        let days = i32::from_be_bytes(bytes[..4].try_into().expect("4 bytes"));
                        let day = epoch + Duration::days(i64::from(days));
                        times.push(day.and_hms_opt(0, 0, 0).expect("midnight").and_utc());
                        quote(&day.to_string())
                    }
                    _ => {
                        let micros = i64::from_be_bytes(bytes[..8].try_into().expect("8 bytes"));
                        let moment =
                            epoch.and_hms_opt(0, 0, 0).expect("midnight").and_utc() + Duration::microseconds(micros);
                        times.push(moment);
                        quote(&moment.to_rfc3339())
                    }
                }
            };
            literals.push((type_name.to_owned(), literal));
        }
        (literals, times)
    }
}
