//! Writers appending through adk-rust's `SessionService` as a service
//! does: each on its own session, each event retried with the same id (and
//! content) until acknowledged, every call timed; and the audit of what
//! they were told against what the table holds.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use adk_core::{AdkIdentity, Content};
use adk_postgres_adk::PgSessionService;
use adk_session::{AppendEventRequest, CreateRequest, SessionService};
use tokio::task::JoinHandle;

fn identity(app: &str, user: &str, session_id: &str) -> AdkIdentity {
    AdkIdentity::new(app.try_into().expect("app"), user.try_into().expect("user"), session_id.try_into().expect("id"))
}

fn event(id: &str, n: usize) -> adk_session::Event {
    let mut e = adk_session::Event::new(format!("inv-{n}"));
    e.id = id.to_owned();
    e.author = "agent".into();
    e.llm_response.content = Some(Content::new("model").with_text(format!("turn {n}")));
    e
}

/// What one writer saw.
#[derive(Debug, Default)]
pub struct Writer {
    pub session_id: String,
    /// Acknowledged event ids, in order, with when.
    pub acknowledged: Vec<(String, Instant)>,
    /// Every call's duration, with when it ended and whether it failed.
    pub calls: Vec<(Instant, Duration, bool)>,
    pub retries: usize,
    pub last_error: Option<String>,
    pub fatal: Option<String>,
}

/// When each writer's latest acknowledged call started and ended, shared so
/// the test can watch.
type Latest = Arc<std::sync::Mutex<Option<(Instant, Instant)>>>;

async fn write(
    svc: Arc<PgSessionService>,
    app: &'static str,
    w: usize,
    stop: Arc<AtomicBool>,
    latest: Latest,
) -> Writer {
    let user = format!("writer-{w}");
    let mut writer = Writer { session_id: format!("session-{w}"), ..Writer::default() };
    let request = CreateRequest {
        app_name: app.into(),
        user_id: user.clone(),
        session_id: Some(writer.session_id.clone()),
        state: Default::default(),
    };
    if let Err(e) = svc.create(request).await {
        writer.fatal = Some(format!("create: {e}"));
        return writer;
    }
    let mut n = 0;
    'events: while !stop.load(Ordering::Relaxed) {
        n += 1;
        let id = uuid::Uuid::new_v4().to_string();
        // The same event until acknowledged (its timestamp too): a call cut
        // off by the bound may have committed, and its retry must be
        // replayed, not duplicated.
        let event = event(&id, n);
        loop {
            let started = Instant::now();
            let result = svc
                .append_event_for_identity(AppendEventRequest {
                    identity: identity(app, &user, &writer.session_id),
                    event: event.clone(),
                })
                .await;
            let ended = Instant::now();
            writer.calls.push((ended, ended - started, result.is_err()));
            match result {
                Ok(()) => {
                    writer.acknowledged.push((id, ended));
                    *latest.lock().expect("lock") = Some((started, ended));
                    break;
                }
                Err(e) if e.is_retryable() => {
                    writer.retries += 1;
                    writer.last_error = Some(e.to_string());
                    if stop.load(Ordering::Relaxed) {
                        // In doubt: not acknowledged, maybe stored.
                        break 'events;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => {
                    writer.fatal = Some(format!("event {id}: {e}"));
                    return writer;
                }
            }
        }
    }
    writer
}

/// Writers running until stopped.
#[derive(Debug)]
pub struct Crowd {
    stop: Arc<AtomicBool>,
    latest: Vec<Latest>,
    tasks: Vec<JoinHandle<Writer>>,
}

impl Crowd {
    pub fn start(svc: Arc<PgSessionService>, app: &'static str, writers: usize) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let latest: Vec<Latest> = (0..writers).map(|_| Latest::default()).collect();
        let tasks =
            (0..writers).map(|w| tokio::spawn(write(svc.clone(), app, w, stop.clone(), latest[w].clone()))).collect();
        Self { stop, latest, tasks }
    }

    /// Waits until every writer had a call acknowledged that it made after
    /// `since`, or `patience` passed; returns how long the slowest took. A
    /// reply already on its way at `since` does not count: on a loaded
    /// machine it can arrive after a fault began and make the writers look
    /// unaffected.
    pub async fn resumed(&self, since: Instant, patience: Duration) -> Option<Duration> {
        resumed(&self.latest, since, patience).await
    }

    pub async fn stop(self) -> Vec<Writer> {
        self.stop.store(true, Ordering::Relaxed);
        let mut writers = Vec::new();
        for task in self.tasks {
            writers.push(task.await.expect("writer"));
        }
        writers
    }
}

async fn resumed(reports: &[Latest], since: Instant, patience: Duration) -> Option<Duration> {
    let deadline = since + patience;
    loop {
        let last: Vec<Option<(Instant, Instant)>> = reports.iter().map(|r| *r.lock().expect("lock")).collect();
        if last.iter().all(|call| call.is_some_and(|(started, _)| started > since)) {
            return last.iter().flatten().map(|(_, ended)| *ended - since).max();
        }
        if Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Sessions whose acknowledged events are not the start of what is
/// stored, in order; and events stored beyond the acknowledged ones and
/// each writer's last call, which the stop may have cut off in doubt.
#[derive(Debug)]
pub struct Audit {
    pub lost: usize,
    pub duplicated: usize,
}

pub async fn audit(client: &tokio_postgres::Client, app: &str, writers: &[Writer]) -> Audit {
    let mut audit = Audit { lost: 0, duplicated: 0 };
    for writer in writers {
        let stored: Vec<String> = client
            .query(
                "SELECT event_id FROM adk_events WHERE app_name = $1 AND session_id = $2 ORDER BY seq",
                &[&app, &writer.session_id],
            )
            .await
            .expect("stored events")
            .iter()
            .map(|row| row.get(0))
            .collect();
        let acknowledged: Vec<&str> = writer.acknowledged.iter().map(|(id, _)| id.as_str()).collect();
        let prefix: Vec<&str> = stored.iter().take(acknowledged.len()).map(String::as_str).collect();
        if prefix != acknowledged {
            audit.lost += 1;
        }
        audit.duplicated += stored.len().saturating_sub(acknowledged.len() + 1);
    }
    audit
}
