//! The demo behind `cargo xtask demo`: simulated users talk to a real
//! adk-runner `Runner` + adk-agent `LlmAgent` (offline, on a scripted model)
//! whose sessions live in PostgreSQL through `PgSessionService`.
//!
//! [`run_demo`] migrates, runs partition maintenance, drives the users
//! concurrently (each through a multi-turn conversation with a tool call and
//! an `output_key`, both writing `user:` state), then drops the store and
//! reopens it on a new pool to prove that every event and every `user:` key
//! persisted. Last it rolls the run's events up into usage analytics
//! (`run_rollup`, as `adk-pg rollup` does) and reads them back by kind and
//! by agent (`usage_at`, as `adk-pg usage` does), checking the rollup's
//! counts and tokens against what was stored and what the model reported,
//! and returns a [`DemoReport`]. The binary adds a throwaway cluster when
//! there is no `DATABASE_URL` and prints the report.

pub mod agent;
mod report;
pub mod timing;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use adk_core::Content;
use adk_postgres_adk::PgSessionService;
use adk_postgres_adk::domain::StoreConfig;
use adk_postgres_adk::storage::PoolConfig;
use adk_postgres_retention::{HealthThresholds, MaintenanceConfig, health, run_maintenance};
use adk_postgres_rollup::{GroupBy, RollupConfig, UsageQuery, run_rollup, usage_at};
use adk_runner::Runner;
use adk_session::{CreateRequest, DeleteRequest, GetRequest, SessionService};
use anyhow::{Context as _, ensure};
use futures_util::StreamExt as _;
use serde_json::json;

pub use report::{DemoReport, HotUpdates, Persistence, UsageAnalytics};

use crate::agent::{AGENT_NAME, LAST_REPLY_KEY, Meter, PREFERENCE_KEY, Script};
use crate::timing::TimedSessions;

/// How long to wait for PostgreSQL's statistics to include the run's
/// updates (backends report them when they exit, i.e. once the pool is gone).
const STATS_WAIT: Duration = Duration::from_secs(10);
/// Rollup runs tried when another run (a scheduled `adk-pg rollup` on the
/// same database) holds the rollup state, and the pause between them.
const ROLLUP_ATTEMPTS: usize = 20;
const ROLLUP_RETRY: Duration = Duration::from_millis(500);
/// The window the usage tables cover: the last hour.
const USAGE_WINDOW: chrono::Duration = chrono::Duration::hours(1);

/// What one simulated user did.
#[derive(Debug)]
struct Conversation {
    user_index: usize,
    user_id: String,
    session_id: String,
    /// Ids of the complete (not partial) events the runner streamed, in order.
    streamed: Vec<String>,
    /// Answers that differed from the script.
    wrong_replies: Vec<String>,
}

/// Runs the demo against the database at `url` (migrated here if needed):
/// `users` simulated users, `turns` turns each, all at once. Fails on an
/// error of the store or the runner; a conversation that stored less than it
/// should is not an error but a failed [`DemoReport::persistence`] check.
pub async fn run_demo(url: &str, users: usize, turns: usize) -> anyhow::Result<DemoReport> {
    ensure!(users >= 1, "the demo needs at least one user");
    ensure!(turns >= 1, "the demo needs at least one turn");
    let started = Instant::now();
    let script = Script { turns };
    // Unique per run, so a run against a database that already holds an
    // earlier run's data counts only its own sessions.
    let app_name = format!("demo-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);

    let migrations = adk_postgres_adk::migrate(url).await.context("migrating the database")?;
    let today = chrono::Utc::now().date_naive();
    let maintenance =
        run_maintenance(url, today, &MaintenanceConfig::default()).await.context("running partition maintenance")?;

    let sql = sql_client(url).await?;
    let stats_before = session_update_stats(&sql).await?;

    // The first store instance: the default pool, every connection opened up
    // front as in a long-running service, so no user waits for a connect.
    let pool = PoolConfig { min_idle: Some(PoolConfig::default().max_size), ..PoolConfig::default() };
    let service = PgSessionService::connect_with(url, &pool, StoreConfig::default())
        .await
        .context("connecting the session service")?;

    // The crowd: every user at once.
    let traffic_started = Instant::now();
    let meter = Arc::new(Meter::default());
    let (runner, timed) = timed_runner(&service, &app_name, meter.clone())?;
    let timings = timed.timings().clone();
    let mut runs = tokio::task::JoinSet::new();
    for user_index in 0..users {
        let (runner, sessions, app_name) = (runner.clone(), timed.clone(), app_name.clone());
        runs.spawn(async move { converse(&runner, &sessions, &app_name, user_index, script).await });
    }
    let mut conversations = Vec::with_capacity(users);
    while let Some(done) = runs.join_next().await {
        conversations.push(done.context("a simulated user's task failed")??);
    }
    conversations.sort_by_key(|c| c.user_index);
    let traffic_time = traffic_started.elapsed();

    // Then a baseline: one user alone on the now warm pool, in an app of its
    // own, deleted after.
    let solo_app = format!("{app_name}-solo");
    let (solo_runner, solo_sessions) = timed_runner(&service, &solo_app, Arc::new(Meter::default()))?;
    let solo = converse(&solo_runner, &solo_sessions, &solo_app, 0, script).await?;
    let delete = DeleteRequest { app_name: solo_app, user_id: solo.user_id, session_id: solo.session_id };
    solo_sessions.delete(delete).await.context("deleting the baseline session")?;
    let solo_appends = solo_sessions.timings().appends.summary();
    drop((solo_runner, solo_sessions));

    // Close the pool: nothing of the first instance survives but the database.
    drop((runner, timed, service));
    let appends = timings.appends.summary();
    let gets = timings.gets.summary();

    let hot = wait_for_update_stats(&sql, stats_before, appends.count + solo_appends.count).await?;

    // A new store instance on a new pool.
    let reopened = PgSessionService::connect(url).await.context("reopening the session service")?;
    let persistence = check_persistence(&reopened, &app_name, &script, &conversations).await?;
    drop(reopened);

    let counts = sql
        .query_one(
            "SELECT (SELECT count(*) FROM adk_sessions WHERE app_name = $1),
                    (SELECT count(*) FROM adk_events WHERE app_name = $1),
                    (SELECT count(DISTINCT user_id) FROM adk_sessions WHERE app_name = $1),
                    (SELECT count(*) FROM adk_user_states WHERE app_name = $1 AND state ? 'preference')",
            &[&app_name],
        )
        .await
        .context("counting what the run stored")?;
    let usage = usage_analytics(url, &app_name, meter.read()).await?;
    let health = health(url, today, &HealthThresholds::default()).await.context("reading the health report")?;

    Ok(DemoReport {
        app_name,
        users,
        turns,
        migrations_applied: migrations,
        maintenance,
        sessions: counts.get(0),
        events: counts.get(1),
        distinct_users: counts.get(2),
        users_with_preference: counts.get(3),
        expected_events: i64::try_from(users * script.events_per_session()).unwrap_or(i64::MAX),
        appends,
        solo_appends,
        pool_size: pool.max_size,
        gets,
        hot,
        persistence,
        usage,
        health,
        traffic_time,
        total_time: started.elapsed(),
    })
}

/// Rolls up what arrived since the last rollup run (this run's events
/// among them) and reads the app's usage of the last hour back: in all, by
/// kind and by agent.
async fn usage_analytics(url: &str, app_name: &str, model: agent::MeterReading) -> anyhow::Result<UsageAnalytics> {
    let mut attempts = 0;
    let (rollup, rollup_time) = loop {
        attempts += 1;
        let started = Instant::now();
        let report = run_rollup(url, &RollupConfig::default()).await.context("rolling up usage")?;
        if report.advanced() || attempts >= ROLLUP_ATTEMPTS {
            break (report, started.elapsed());
        }
        tokio::time::sleep(ROLLUP_RETRY).await;
    };
    // One window for the three answers, so their totals agree.
    let window = UsageQuery::last(app_name, USAGE_WINDOW);
    let query = |by: Option<GroupBy>| UsageQuery { by, ..window.clone() };
    let all = usage_at(url, &query(None)).await.context("reading the app's usage")?;
    let by_kind = usage_at(url, &query(Some(GroupBy::Kind))).await.context("reading usage by kind")?;
    let by_agent = usage_at(url, &query(Some(GroupBy::Agent))).await.context("reading usage by agent")?;
    Ok(UsageAnalytics { rollup, rollup_time, attempts, all, by_kind, by_agent, model })
}

/// A runner for `app_name` on `service`, through a timing decorator; the
/// model's usage is added up in `meter`.
fn timed_runner(
    service: &PgSessionService,
    app_name: &str,
    meter: Arc<Meter>,
) -> anyhow::Result<(Arc<Runner>, TimedSessions)> {
    let timed = TimedSessions::new(Arc::new(service.clone())).context("making the latency histograms")?;
    let runner = Runner::builder()
        .app_name(app_name)
        .agent(agent::agent_metered(meter).context("building the agent")?)
        .session_service(Arc::new(timed.clone()))
        .build()
        .context("building the runner")?;
    Ok((Arc::new(runner), timed))
}

/// One user's whole conversation in a session of its own.
async fn converse(
    runner: &Runner,
    sessions: &TimedSessions,
    app_name: &str,
    user_index: usize,
    script: Script,
) -> anyhow::Result<Conversation> {
    let user_id = format!("user-{user_index:03}");
    let request = CreateRequest {
        app_name: app_name.to_owned(),
        user_id: user_id.clone(),
        session_id: None,
        state: HashMap::new(),
    };
    let session_id =
        sessions.create(request).await.with_context(|| format!("creating {user_id}'s session"))?.id().to_owned();
    let mut conversation =
        Conversation { user_index, user_id, session_id, streamed: Vec::new(), wrong_replies: Vec::new() };
    for turn in 1..=script.turns {
        let message = Content::new("user").with_text(script.message(user_index, turn));
        let mut stream = runner
            .run_str(&conversation.user_id, &conversation.session_id, message)
            .await
            .with_context(|| format!("starting turn {turn} of {}", conversation.user_id))?;
        let mut reply = None;
        while let Some(event) = stream.next().await {
            let event = event.with_context(|| format!("turn {turn} of {}", conversation.user_id))?;
            if event.author == AGENT_NAME
                && let Some(text) = event.content().and_then(|c| c.parts.iter().find_map(|p| p.text()))
            {
                reply = Some(text.to_owned());
            }
            // Partial (streaming) events are shown, never stored.
            if !event.llm_response.partial {
                conversation.streamed.push(event.id);
            }
        }
        let expected = script.reply(user_index, turn);
        if reply.as_deref() != Some(expected.as_str()) {
            conversation
                .wrong_replies
                .push(format!("{} turn {turn}: answered {reply:?}, expected {expected:?}", conversation.user_id));
        }
    }
    Ok(conversation)
}

/// Reloads every conversation through `service` (a new store instance) and
/// lists what is missing or different.
async fn check_persistence(
    service: &PgSessionService,
    app_name: &str,
    script: &Script,
    conversations: &[Conversation],
) -> anyhow::Result<Persistence> {
    let mut persistence = Persistence::default();
    for conversation in conversations {
        let user = &conversation.user_id;
        persistence.problems.extend(conversation.wrong_replies.iter().cloned());
        let request = GetRequest {
            app_name: app_name.to_owned(),
            user_id: user.clone(),
            session_id: conversation.session_id.clone(),
            num_recent_events: None,
            after: None,
        };
        let session = match service.get(request).await {
            Ok(session) => session,
            Err(e) if e.is_not_found() => {
                persistence.problems.push(format!("{user}: session {} is gone", conversation.session_id));
                continue;
            }
            Err(e) => return Err(e).with_context(|| format!("reloading {user}'s session")),
        };
        persistence.sessions_checked += 1;
        let stored: Vec<_> = session.events().all();
        let said: Vec<String> = stored
            .iter()
            .filter(|e| e.author == "user")
            .map(|e| e.content().map(|c| c.parts.iter().filter_map(|p| p.text()).collect()).unwrap_or_default())
            .collect();
        let script_said: Vec<String> =
            (1..=script.turns).map(|turn| script.message(conversation.user_index, turn)).collect();
        if said != script_said {
            persistence.problems.push(format!("{user}: stored user messages {said:?}, expected {script_said:?}"));
        }
        persistence.events_checked += stored.len();
        let expected_events = script.events_per_session();
        if stored.len() != expected_events {
            persistence.problems.push(format!("{user}: {} events stored, expected {expected_events}", stored.len()));
        }
        let stored_ids: Vec<&str> = stored.iter().map(|e| e.id.as_str()).collect();
        let missing: Vec<&str> =
            conversation.streamed.iter().map(String::as_str).filter(|id| !stored_ids.contains(id)).collect();
        if !missing.is_empty() {
            persistence.problems.push(format!("{user}: streamed events not stored: {missing:?}"));
        }
        let in_order: Vec<&str> =
            stored_ids.iter().copied().filter(|id| conversation.streamed.iter().any(|s| s == id)).collect();
        if missing.is_empty() && in_order.iter().copied().ne(conversation.streamed.iter().map(String::as_str)) {
            persistence.problems.push(format!("{user}: events stored out of order"));
        }
        let state = session.state();
        let expectations = [
            (PREFERENCE_KEY, json!(Script::preference(conversation.user_index))),
            (LAST_REPLY_KEY, json!(script.reply(conversation.user_index, script.turns))),
        ];
        for (key, want) in expectations {
            match state.get(key) {
                Some(got) if got == want => {}
                got => persistence.problems.push(format!("{user}: {key} is {got:?}, expected {want}")),
            }
        }
    }
    Ok(persistence)
}

async fn sql_client(url: &str) -> anyhow::Result<tokio_postgres::Client> {
    let (client, connection) = adk_postgres_connect::ConnectConfig::from_url(url)?
        .connect()
        .await
        .map(|c| (c.client, c.connection))
        .context("connecting for statistics")?;
    tokio::spawn(async move {
        // Ends when the client is dropped; an error then is of no interest.
        let _ = connection.await;
    });
    Ok(client)
}

/// `(updates, HOT updates)` of `adk_sessions` as PostgreSQL's statistics
/// see them.
async fn session_update_stats(sql: &tokio_postgres::Client) -> anyhow::Result<(i64, i64)> {
    let row = sql
        .query_one(
            "SELECT coalesce(sum(n_tup_upd), 0)::bigint, coalesce(sum(n_tup_hot_upd), 0)::bigint
             FROM pg_stat_user_tables WHERE relid = to_regclass('adk_sessions')",
            &[],
        )
        .await
        .context("reading pg_stat_user_tables")?;
    Ok((row.get(0), row.get(1)))
}

/// Waits (briefly) until the statistics show at least one update of
/// `adk_sessions` per append since `before`: each append updates its
/// session's row once. The backends of the closed pool report on exit.
async fn wait_for_update_stats(
    sql: &tokio_postgres::Client,
    before: (i64, i64),
    appends: u64,
) -> anyhow::Result<HotUpdates> {
    let want = i64::try_from(appends).unwrap_or(i64::MAX);
    let deadline = Instant::now() + STATS_WAIT;
    loop {
        let now = session_update_stats(sql).await?;
        let hot = HotUpdates { updates: now.0 - before.0, hot: now.1 - before.1, settled: now.0 - before.0 >= want };
        if hot.settled || Instant::now() >= deadline {
            return Ok(hot);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
