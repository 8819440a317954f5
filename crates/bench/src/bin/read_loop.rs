//! One read in a loop, for a profiler: `perf record -g -- read_loop URL OP
//! SECONDS` with OP `get40`, `get1000` or `list100`, through adk-rust's
//! `SessionService` on `PgSessionService` (or adk-session's
//! `PostgresSessionService` with `--peer`), one call at a time, as the main
//! bench's get and list rows run. It seeds its own sessions (the main
//! bench's shapes: ~200-character text parts with a small state delta) in
//! the database at URL, and prints calls/s and the process's CPU per call
//! and per event. `--warm N` first runs N calls at once, leaving up to N
//! connections open in the pool, as the main bench's concurrent workloads
//! leave it before its reads.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use adk_core::identity::{AdkIdentity, AppName, SessionId, UserId};
use adk_core::{Content, Event, Part};
use adk_session::{AppendEventRequest, CreateRequest, GetRequest, ListRequest, SessionService};
use anyhow::{Context as _, bail, ensure};
use rustix::time::{ClockId, clock_gettime};
use serde_json::json;

const APP: &str = "read-loop";

fn cpu() -> Duration {
    let t = clock_gettime(ClockId::ProcessCPUTime);
    Duration::new(u64::try_from(t.tv_sec).unwrap_or(0), u32::try_from(t.tv_nsec).unwrap_or(0))
}

fn event(n: usize, invocation: &str) -> Event {
    let author = if n.is_multiple_of(2) { "user" } else { "assistant" };
    let mut event = Event::new(invocation);
    event.author = author.to_owned();
    let words = ["the", "order", "arrives", "tomorrow", "between", "nine", "and", "noon", "please", "confirm"];
    let text: String = (0..40).map(|i| words[(n * 7 + i * 3) % words.len()]).collect::<Vec<_>>().join(" ");
    event.llm_response.content = Some(Content {
        role: if author == "user" { "user".to_owned() } else { "model".to_owned() },
        parts: vec![Part::Text { text: text.chars().take(200).collect() }],
    });
    event.llm_response.turn_complete = author == "assistant";
    event.actions.state_delta.insert("turn".to_owned(), json!(n));
    event.actions.state_delta.insert("last_author".to_owned(), json!(author));
    event
}

/// Every session of `user`, as one page.
fn list_request(user: String) -> ListRequest {
    ListRequest { app_name: APP.to_owned(), user_id: user, limit: None, offset: None }
}

async fn seed(service: &dyn SessionService, user: &str, session: &str, events: usize) -> anyhow::Result<()> {
    let state = HashMap::from([("channel".to_owned(), json!("web")), ("locale".to_owned(), json!("en-GB"))]);
    service
        .create(CreateRequest {
            app_name: APP.to_owned(),
            user_id: user.to_owned(),
            session_id: Some(session.to_owned()),
            state,
        })
        .await
        .map_err(|e| anyhow::anyhow!("create {session}: {e}"))?;
    let identity = AdkIdentity {
        app_name: AppName::try_from(APP)?,
        user_id: UserId::try_from(user)?,
        session_id: SessionId::try_from(session)?,
    };
    for n in 0..events {
        service
            .append_event_for_identity(AppendEventRequest {
                identity: identity.clone(),
                event: event(n, "inv-read-loop"),
            })
            .await
            .map_err(|e| anyhow::anyhow!("append to {session}: {e}"))?;
    }
    Ok(())
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> anyhow::Result<()> {
    let (mut peer, mut warm, mut positional) = (false, 0usize, Vec::new());
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--peer" => peer = true,
            "--warm" => warm = args.next().context("--warm N")?.parse().context("--warm N")?,
            _ => positional.push(arg),
        }
    }
    let [url, op, seconds] = positional.as_slice() else {
        bail!("usage: read_loop URL get40|get1000|list100 SECONDS [--peer] [--warm N]")
    };
    let seconds: u64 = seconds.parse().context("SECONDS")?;
    let service: Box<dyn SessionService> = if peer {
        let service = adk_session::PostgresSessionService::new(url).await.map_err(|e| anyhow::anyhow!("{e}"))?;
        service.migrate().await.map_err(|e| anyhow::anyhow!("{e}"))?;
        Box::new(service)
    } else {
        adk_postgres_adk::migrate(url).await.map_err(|e| anyhow::anyhow!("{e}"))?;
        Box::new(adk_postgres_adk::PgSessionService::connect(url).await.map_err(|e| anyhow::anyhow!("{e}"))?)
    };
    let run = uuid::Uuid::new_v4().simple().to_string();
    let user = format!("u-{run}");
    let (events, sessions) = match op.as_str() {
        "get40" => (40, 1),
        "get1000" => (1000, 1),
        "list100" => (0, 100),
        other => bail!("unknown op {other}"),
    };
    for s in 0..sessions {
        seed(service.as_ref(), &user, &format!("s-{s}"), events).await?;
    }
    let service: std::sync::Arc<dyn SessionService> = std::sync::Arc::from(service);
    let warming: Vec<_> = (0..warm)
        .map(|_| {
            let (service, user) = (service.clone(), user.clone());
            tokio::spawn(async move {
                service.list(list_request(user)).await.map(|_| ()).map_err(|e| anyhow::anyhow!("warming list: {e}"))
            })
        })
        .collect();
    for task in warming {
        task.await??;
    }
    // On a worker thread, as a service's request handler runs (and the
    // main bench's reads): from `block_on`'s thread every reply would wake
    // it from the worker that read the socket.
    let looping = tokio::spawn(async move {
        let (mut calls, mut read) = (0usize, 0usize);
        let deadline = Instant::now() + Duration::from_secs(seconds);
        let (started, cpu_before) = (Instant::now(), cpu());
        while Instant::now() < deadline {
            if sessions == 1 {
                let got = service
                    .get(GetRequest {
                        app_name: APP.to_owned(),
                        user_id: user.clone(),
                        session_id: "s-0".to_owned(),
                        num_recent_events: None,
                        after: None,
                    })
                    .await
                    .map_err(|e| anyhow::anyhow!("get: {e}"))?;
                ensure!(got.events().len() == events, "read {} events", got.events().len());
                read += events;
            } else {
                let listed =
                    service.list(list_request(user.clone())).await.map_err(|e| anyhow::anyhow!("list: {e}"))?;
                ensure!(listed.len() == sessions, "listed {}", listed.len());
            }
            calls += 1;
        }
        let (wall, spent) = (started.elapsed(), cpu() - cpu_before);
        anyhow::Ok((calls, read, wall, spent))
    });
    let (calls, read, wall, spent) = looping.await??;
    let per_call = spent.as_secs_f64() * 1e6 / calls as f64;
    println!(
        "{} {op}: {calls} calls in {:.1} s, {:.0}/s, client CPU {per_call:.1} µs/call{}",
        if peer { "adk-session" } else { "ours" },
        wall.as_secs_f64(),
        calls as f64 / wall.as_secs_f64(),
        if read > 0 { format!(", {:.2} µs/event", spent.as_secs_f64() * 1e6 / read as f64) } else { String::new() },
    );
    Ok(())
}
