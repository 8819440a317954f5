//! The rollup job against live traffic: every acknowledged event lands in
//! exactly one minute row, however appends, open writer transactions,
//! concurrent runs and killed backends interleave with the runs. Counts are
//! always checked against the raw log (`adk_events`), bucketed by the
//! event's own nanosecond time, so the check shares no code with the job.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use adk_postgres_domain::{AppendOptions, Event, SessionKey, SessionStore};
use adk_postgres_retention::LockPolicy;
use adk_postgres_rollup::{RollupConfig, RollupReport, run_rollup};
use adk_postgres_testing::test_database;
use adk_postgres_tests::pg::{client, new_session, store};
use chrono::{DateTime, Utc};
use serde_json::json;
use tokio::task::JoinSet;
use tokio_postgres::Client;

const ROLLUP_APP: &str = "adk-pg rollup";

/// An event of kind `kind` (0 user message, 1 model response, 2 tool call,
/// 3 tool result, 4 error) as adk-rust writes it, timestamped now.
fn event_of_kind(kind: usize, agent: &str, invocation: &str, tokens: i64) -> Event {
    let author = if kind == 0 { "user" } else { agent };
    let mut event = Event::new(author);
    event.invocation_id = invocation.to_owned();
    event.content = Some(match kind {
        0 => json!({"role": "user", "parts": [{"text": "what is the weather"}]}),
        2 => json!({"role": "model", "parts": [{"functionCall": {"name": "weather", "args": {"city": "Oslo"}}}]}),
        3 => json!({"role": "user", "parts": [{"functionResponse": {"name": "weather", "response": {"c": 4}}}]}),
        _ => json!({"role": "model", "parts": [{"text": "it is cold"}]}),
    });
    if kind == 1 {
        event.extra.insert(
            "usage_metadata".into(),
            json!({"prompt_token_count": tokens, "candidates_token_count": 1, "total_token_count": tokens + 1}),
        );
    }
    if kind == 4 {
        event.extra.insert("error_code".into(), json!("RESOURCE_EXHAUSTED"));
    }
    event
}

async fn watermark(sql: &Client) -> Option<DateTime<Utc>> {
    sql.query_one("SELECT watermark FROM adk_usage_state", &[]).await.expect("read the watermark").get(0)
}

async fn raw_events(sql: &Client) -> i64 {
    sql.query_one("SELECT count(*) FROM adk_events", &[]).await.expect("count events").get(0)
}

async fn rolled_minutes(sql: &Client) -> i64 {
    sql.query_one("SELECT coalesce(sum(events), 0)::bigint FROM adk_usage_1m", &[])
        .await
        .expect("sum minute rows")
        .get(0)
}

/// Every (app, author, kind, bucket) of `table` whose events or total
/// tokens differ from the raw log's, as readable lines; empty when exact.
/// `width` is the level's bucket width in seconds.
async fn mismatches(sql: &Client, table: &str, width: i64) -> Vec<String> {
    let rows = sql
        .query(
            &format!(
                "WITH raw AS (
                     SELECT app_name, author, adk_usage_kind(payload, author) AS kind,
                            event_ts / ($1::bigint * 1000000000) AS bucket,
                            count(*) AS events,
                            sum(adk_usage_tokens(payload, 'total_token_count', 'totalTokenCount'))::bigint AS tokens
                     FROM adk_events GROUP BY 1, 2, 3, 4),
                 rolled AS (
                     SELECT app_name, author, kind, extract(epoch FROM bucket_start)::bigint / $1::bigint AS bucket,
                            sum(events)::bigint AS events, sum(total_tokens)::bigint AS tokens
                     FROM {table} GROUP BY 1, 2, 3, 4)
                 SELECT format('%s/%s/%s bucket %s: raw %s events %s tokens, rolled up %s events %s tokens',
                               app_name, author, kind, bucket, r.events, r.tokens, u.events, u.tokens)
                 FROM raw r FULL JOIN rolled u USING (app_name, author, kind, bucket)
                 WHERE r.events IS DISTINCT FROM u.events OR r.tokens IS DISTINCT FROM u.tokens
                 ORDER BY 1 LIMIT 20"
            ),
            &[&width],
        )
        .await
        .expect("compare rollup rows with the log");
    rows.iter().map(|r| r.get(0)).collect()
}

/// Minutes, hours and days all equal the raw log, bucket by bucket.
async fn assert_exact(sql: &Client, context: &str) {
    for (table, width) in [("adk_usage_1m", 60), ("adk_usage_1h", 3_600), ("adk_usage_1d", 86_400)] {
        let wrong = mismatches(sql, table, width).await;
        assert!(wrong.is_empty(), "{context}: {table} differs from the log:\n{}", wrong.join("\n"));
    }
    let folded: i64 =
        sql.query_one("SELECT count(*) FROM adk_usage_1m WHERE folded", &[]).await.expect("folded rows").get(0);
    assert_eq!(folded, 0, "{context}: no bucket here has more authors than the cap");
}

/// Everything the rollup has committed: rows of every level (sketches
/// included), tails, late counters and the watermark.
async fn rollup_fingerprint(sql: &Client) -> String {
    fingerprint_of(sql, &["adk_usage_1m", "adk_usage_1h", "adk_usage_1d"]).await
}

/// [`rollup_fingerprint`] reading only the levels in `tables`, for when
/// another is locked.
async fn fingerprint_of(sql: &Client, tables: &[&str]) -> String {
    let levels: Vec<String> = tables
        .iter()
        .map(|t| format!("(SELECT md5(coalesce(string_agg(u::text, ',' ORDER BY u::text), '')) FROM {t} u)"))
        .collect();
    sql.query_one(
        &format!(
            "SELECT concat_ws(' | ', {},
                 (SELECT md5(coalesce(string_agg(t::text, ',' ORDER BY t::text), '')) FROM adk_usage_invocation_tails t),
                 (SELECT count(*) FROM adk_usage_late_events),
                 (SELECT coalesce(watermark::text, 'none') FROM adk_usage_state))",
            levels.join(", ")
        ),
        &[],
    )
    .await
    .expect("fingerprint the rollup")
    .get(0)
}

async fn runs_with_outcome(sql: &Client, outcome: &str) -> i64 {
    sql.query_one("SELECT count(*) FROM adk_usage_runs WHERE outcome = $1", &[&outcome])
        .await
        .expect("count runs")
        .get(0)
}

/// Inserts one event into `key`'s session as the owner, behind the store's
/// back, so that the caller decides when its transaction ends. Returns the
/// inserting transaction's virtual id.
async fn insert_held_event(sql: &Client, key: &SessionKey, seq: i64) -> String {
    let inserted = sql
        .execute(
            "INSERT INTO adk_events (app_name, user_id, session_id, session_day, seq, event_id, author, event_ts, payload)
             SELECT s.app_name, s.user_id, s.session_id, s.session_day, $4, $5, 'agent',
                    (extract(epoch FROM clock_timestamp()) * 1000000000)::bigint,
                    jsonb_build_object('id', $5::text, 'author', 'agent',
                                       'usage_metadata', jsonb_build_object('total_token_count', 5))
             FROM adk_sessions s WHERE s.app_name = $1 AND s.user_id = $2 AND s.session_id = $3",
            &[&key.app_name.as_str(), &key.user_id.as_str(), &key.session_id.as_str(), &seq, &format!("held-{seq}")],
        )
        .await
        .expect("insert inside the held transaction");
    assert_eq!(inserted, 1, "the session exists");
    sql.query_one("SELECT virtualxid FROM pg_locks WHERE locktype = 'virtualxid' AND pid = pg_backend_pid()", &[])
        .await
        .expect("own virtual transaction id")
        .get(0)
}

/// Waits until a rollup run is inside its wait for writers: its last
/// statement is the poll of their virtual transaction ids.
async fn rollup_waiting_for_writers(sql: &Client) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let waiting: i64 = sql
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND application_name = $1
                   AND query LIKE '%l.virtualxid = ANY%'",
                &[&ROLLUP_APP],
            )
            .await
            .expect("activity")
            .get(0);
        if waiting > 0 {
            return;
        }
        assert!(Instant::now() < deadline, "the rollup never started waiting for the open writer");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn short_wait() -> RollupConfig {
    RollupConfig { writer_wait: Duration::from_millis(300), ..RollupConfig::default() }
}

fn long_wait() -> RollupConfig {
    RollupConfig { writer_wait: Duration::from_secs(20), ..RollupConfig::default() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_appends_are_rolled_up_exactly_once() {
    const WRITERS: usize = 8;
    let db = test_database().await;
    let store = Arc::new(store(db.url()).await);
    let sql = client(db.url()).await;
    let stop_writing = Instant::now() + Duration::from_secs(3);

    let mut writers = JoinSet::new();
    for w in 0..WRITERS {
        let store = Arc::clone(&store);
        writers.spawn(async move {
            let app = if w % 2 == 0 { "alpha" } else { "beta" };
            let key = new_session(store.as_ref(), app, &format!("writer-{w}")).await;
            let mut acknowledged = 0u64;
            let mut i = 0usize;
            while Instant::now() < stop_writing {
                let agent = format!("agent-{}", i % 3);
                let event = event_of_kind(i % 5, &agent, &format!("inv-{w}-{}", i / 5), (i % 11) as i64);
                // Any error fails the test: an append whose outcome is unknown
                // would make "acknowledged" ambiguous.
                store.append(&key, event, AppendOptions::default()).await.expect("append");
                acknowledged += 1;
                i += 1;
            }
            acknowledged
        });
    }

    let stop = Arc::new(AtomicBool::new(false));
    let rollups = {
        let stop = Arc::clone(&stop);
        let url = db.url().to_owned();
        tokio::spawn(async move {
            let mut reports: Vec<RollupReport> = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                reports.push(run_rollup(&url, &RollupConfig::default()).await.expect("a rollup run under load"));
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            reports
        })
    };

    let mut acknowledged = 0u64;
    while let Some(writer) = writers.join_next().await {
        acknowledged += writer.expect("writer");
    }
    stop.store(true, Ordering::Relaxed);
    let mut reports = rollups.await.expect("rollup loop");
    let during = reports.iter().filter(|r| r.events_rolled_up > 0).count();
    reports.push(run_rollup(db.url(), &RollupConfig::default()).await.expect("final rollup"));

    assert!(during >= 2, "only {during} runs rolled anything up while the writers ran: not concurrent enough");
    for report in &reports {
        assert!(report.advanced(), "a lone rollup loop never skips nor gives up: {report}");
        assert_eq!(report.late_rejected, 0, "events timestamped now are never late");
    }
    // Each run reads exactly the arrivals since the previous one: together
    // they read every event once.
    let read: u64 = reports.iter().map(|r| r.events_read).sum();
    assert_eq!(read, acknowledged, "events read over all runs");
    assert_eq!(raw_events(&sql).await as u64, acknowledged, "every acknowledged append is stored");
    assert_eq!(rolled_minutes(&sql).await as u64, acknowledged, "minute rows count every acknowledged append");
    assert_exact(&sql, "after concurrent appends").await;
    let waited = reports.iter().filter(|r| r.writers_waited > 0).count();
    println!(
        "{acknowledged} appends by {WRITERS} writers; {} rollup runs, {during} with events, {waited} waited for writers",
        reports.len()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_open_writer_holds_the_watermark_until_it_commits() {
    let db = test_database().await;
    let store = store(db.url()).await;
    let sql = client(db.url()).await;
    let key = new_session(&store, "held", "u1").await;
    let held_key = new_session(&store, "held", "u2").await;
    store.append(&key, event_of_kind(1, "agent", "", 3), AppendOptions::default()).await.expect("append");
    let first = run_rollup(db.url(), &RollupConfig::default()).await.expect("first run");
    assert_eq!(first.events_rolled_up, 1);
    let before = watermark(&sql).await;
    assert!(before.is_some(), "the first run sets a watermark");
    let fingerprint = rollup_fingerprint(&sql).await;

    let writer = client(db.url()).await;
    writer.batch_execute("BEGIN").await.expect("begin the writer");
    let vxid = insert_held_event(&writer, &held_key, 1_000).await;
    // Committed after the held insert: it arrived later, so it waits too.
    store.append(&key, event_of_kind(2, "agent", "", 0), AppendOptions::default()).await.expect("append");

    let waiting = run_rollup(db.url(), &short_wait()).await.expect("a run that finds an open writer");
    assert_eq!(waiting.waiting_on, vec![vxid.clone()], "{waiting}");
    assert!(!waiting.advanced() && !waiting.skipped);
    assert_eq!((waiting.writers_waited, waiting.events_read), (1, 0), "{waiting:?}");
    assert_eq!(waiting.window_from, before);
    assert_eq!(watermark(&sql).await, before, "the watermark stays while a writer is open");
    assert_eq!(rollup_fingerprint(&sql).await, fingerprint, "a waiting run writes no rows");
    let last = sql
        .query_one(
            "SELECT outcome, writers_waited, coalesce(error, '') FROM adk_usage_runs ORDER BY run_id DESC LIMIT 1",
            &[],
        )
        .await
        .expect("last run");
    let (outcome, waited, error): (String, i32, String) = (last.get(0), last.get(1), last.get(2));
    assert_eq!((outcome.as_str(), waited), ("waiting", 1));
    assert!(error.contains(&vxid), "the run record names the writer: {error}");

    writer.batch_execute("COMMIT").await.expect("commit the writer");
    let after = run_rollup(db.url(), &short_wait()).await.expect("run after the commit");
    assert!(after.advanced(), "{after}");
    assert_eq!((after.window_from, after.events_rolled_up), (before, 2), "the held event and the later one");
    let again = run_rollup(db.url(), &short_wait()).await.expect("one more run");
    assert_eq!(again.events_read, 0, "nothing is read twice");
    assert_eq!(rolled_minutes(&sql).await, 3);
    assert_exact(&sql, "after the held writer committed").await;
}

/// The heart of the exactness argument: an event inserted before the run
/// takes its upper bound but committed only after the run began is still
/// counted, because the run waits for it before reading.
async fn writer_committing_during_the_wait_is_counted(db_url: &str) {
    let store = store(db_url).await;
    let sql = client(db_url).await;
    let key = new_session(&store, "held", "u1").await;
    store.append(&key, event_of_kind(0, "agent", "", 0), AppendOptions::default()).await.expect("append");
    run_rollup(db_url, &RollupConfig::default()).await.expect("first run");

    let writer = client(db_url).await;
    writer.batch_execute("BEGIN").await.expect("begin the writer");
    insert_held_event(&writer, &key, 1_000).await;
    let run = {
        let url = db_url.to_owned();
        tokio::spawn(async move { run_rollup(&url, &long_wait()).await })
    };
    rollup_waiting_for_writers(&sql).await;
    writer.batch_execute("COMMIT").await.expect("commit while the run waits");
    let report = run.await.expect("rollup task").expect("the run that waited");
    assert!(report.advanced(), "{report}");
    assert_eq!(report.writers_waited, 1, "{report:?}");
    assert_eq!(
        report.events_rolled_up, 1,
        "an event inserted before the run took its upper bound and committed during its wait belongs to this run: {report:?}"
    );
    let next = run_rollup(db_url, &RollupConfig::default()).await.expect("next run");
    assert_eq!(next.events_read, 0, "{next:?}");
    assert_eq!(rolled_minutes(&sql).await, 2, "both events, once each");
    assert_exact(&sql, "after a commit during the wait").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_writer_committing_during_the_wait_is_counted() {
    let db = test_database().await;
    writer_committing_during_the_wait_is_counted(db.url()).await;
}

/// `default_transaction_isolation` is an ordinary database setting. The
/// run's window is complete only if it reads with a snapshot taken after
/// the wait, so the run must not inherit a snapshot-per-transaction level.
#[tokio::test(flavor = "multi_thread")]
async fn a_writer_committing_during_the_wait_is_counted_under_repeatable_read_default() {
    let db = test_database().await;
    client(db.url())
        .await
        .batch_execute(&format!(
            "ALTER DATABASE \"{}\" SET default_transaction_isolation = 'repeatable read'",
            db.name()
        ))
        .await
        .expect("set the database default");
    writer_committing_during_the_wait_is_counted(db.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_runs_skip_rather_than_count_twice() {
    let db = test_database().await;
    let store = Arc::new(store(db.url()).await);
    let sql = client(db.url()).await;
    let key = new_session(store.as_ref(), "race", "u1").await;
    for i in 0..20 {
        store.append(&key, event_of_kind(i % 5, "agent", "inv", 1), AppendOptions::default()).await.expect("append");
    }

    // Two runs certainly at the same time: the first holds the state row
    // while it waits for an open writer; the second must skip.
    let writer = client(db.url()).await;
    writer.batch_execute("BEGIN").await.expect("begin the writer");
    let held_key = new_session(store.as_ref(), "race", "u2").await;
    insert_held_event(&writer, &held_key, 1_000).await;
    let first = {
        let url = db.url().to_owned();
        tokio::spawn(async move { run_rollup(&url, &long_wait()).await })
    };
    rollup_waiting_for_writers(&sql).await;
    let runs_before = sql.query_one("SELECT count(*) FROM adk_usage_runs", &[]).await.expect("runs").get::<_, i64>(0);
    let started = Instant::now();
    let second = run_rollup(db.url(), &long_wait()).await.expect("the second run");
    assert!(second.skipped && !second.advanced(), "{second:?}");
    assert!(started.elapsed() < Duration::from_secs(5), "a skipped run does not wait: {:?}", started.elapsed());
    assert_eq!(second, RollupReport { skipped: true, ..RollupReport::default() }, "a skipped run did nothing");
    let runs_after = sql.query_one("SELECT count(*) FROM adk_usage_runs", &[]).await.expect("runs").get::<_, i64>(0);
    assert_eq!(runs_after, runs_before, "a skipped run records nothing");
    writer.batch_execute("COMMIT").await.expect("commit the writer");
    let first = first.await.expect("rollup task").expect("the first run");
    assert!(first.advanced(), "{first}");
    assert_eq!(first.events_rolled_up, 21);
    assert_exact(&sql, "after a skipped run").await;

    // Bursts of runs racing each other and a writer: each either runs
    // alone or skips; none counts anything twice.
    let stop = Arc::new(AtomicBool::new(false));
    let appender = {
        let store = Arc::clone(&store);
        let stop = Arc::clone(&stop);
        tokio::spawn(async move {
            let mut appended = 0u64;
            let mut i = 0usize;
            while !stop.load(Ordering::Relaxed) {
                store
                    .append(&key, event_of_kind(i % 5, "agent", "inv", 2), AppendOptions::default())
                    .await
                    .expect("append");
                appended += 1;
                i += 1;
            }
            appended
        })
    };
    let mut reports = Vec::new();
    for _ in 0..6 {
        let mut burst = JoinSet::new();
        for _ in 0..4 {
            let url = db.url().to_owned();
            burst.spawn(async move { run_rollup(&url, &RollupConfig::default()).await });
        }
        while let Some(run) = burst.join_next().await {
            reports.push(run.expect("rollup task").expect("a racing run"));
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let appended = appender.await.expect("appender");
    reports.push(run_rollup(db.url(), &RollupConfig::default()).await.expect("final run"));
    let skipped = reports.iter().filter(|r| r.skipped).count();
    for report in &reports {
        assert!(report.skipped || report.advanced(), "{report:?}");
    }
    let read: u64 = reports.iter().map(|r| r.events_read).sum();
    assert_eq!(read, appended, "racing runs read each new event once");
    assert_eq!(rolled_minutes(&sql).await as u64, 21 + appended);
    assert_eq!(raw_events(&sql).await as u64, 21 + appended);
    assert_exact(&sql, "after racing runs").await;
    println!("racing runs: {} runs, {skipped} skipped, {appended} events appended meanwhile", reports.len());
}

/// `n` events of app "bulk", arriving now, in invocations of 50 events,
/// by four agents, behind the store's back (the store would take minutes).
async fn bulk_insert(sql: &Client, session: &str, n: i64) {
    sql.execute(
        "INSERT INTO adk_sessions (app_name, user_id, session_id, last_seq) VALUES ('bulk', 'loader', $1, $2)",
        &[&session, &n],
    )
    .await
    .expect("bulk session");
    sql.execute(
        "INSERT INTO adk_events (app_name, user_id, session_id, session_day, seq, event_id, invocation_id, author,
                                 event_ts, payload)
         SELECT 'bulk', 'loader', $1, (now() AT TIME ZONE 'UTC')::date, n, 'e' || n, 'inv-' || (n / 50),
                'agent-' || (n % 4), (extract(epoch FROM clock_timestamp()) * 1000000000)::bigint,
                jsonb_build_object('id', 'e' || n, 'author', 'agent-' || (n % 4),
                                   'content', jsonb_build_object('parts', jsonb_build_array(jsonb_build_object('text', md5(n::text)))),
                                   'usage_metadata', jsonb_build_object('total_token_count', n % 7))
         FROM generate_series(1, $2::bigint) n",
        &[&session, &n],
    )
    .await
    .expect("bulk events");
}

/// The pid of the rollup backend once it runs `statement_like`, or once
/// it waits for a lock when `on_lock`.
async fn rollup_backend(sql: &Client, statement_like: &str, on_lock: bool, within: Duration) -> Option<i32> {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        let rows = sql
            .query(
                // This database's only: tests run in parallel on one cluster,
                // and killing another test's rollup would fail that test.
                "SELECT pid FROM pg_stat_activity
                 WHERE datname = current_database() AND application_name = $1 AND state = 'active'
                   AND query LIKE $2 AND (NOT $3 OR wait_event_type = 'Lock')",
                &[&ROLLUP_APP, &statement_like, &on_lock],
            )
            .await
            .expect("activity");
        if let Some(row) = rows.first() {
            return Some(row.get(0));
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rollup_killed_while_reading_commits_nothing() {
    const BATCH: i64 = 100_000;
    let db = test_database().await;
    let store = store(db.url()).await;
    let sql = client(db.url()).await;
    let killer = client(db.url()).await;
    let key = new_session(&store, "bulk", "early").await;
    store.append(&key, event_of_kind(1, "agent-0", "early", 4), AppendOptions::default()).await.expect("append");
    run_rollup(db.url(), &RollupConfig::default()).await.expect("a first run, so that there is state to keep");

    let mut caught = false;
    for attempt in 1..=3 {
        bulk_insert(&sql, &format!("bulk-{attempt}"), BATCH).await;
        let before = rollup_fingerprint(&sql).await;
        let ok_runs = runs_with_outcome(&sql, "ok").await;
        let run = {
            let url = db.url().to_owned();
            tokio::spawn(async move { run_rollup(&url, &RollupConfig::default()).await })
        };
        let reading = rollup_backend(&killer, "%WITH batch AS%", false, Duration::from_secs(30)).await;
        if let Some(pid) = reading {
            let killed: bool =
                killer.query_one("SELECT pg_terminate_backend($1)", &[&pid]).await.expect("terminate").get(0);
            assert!(killed, "terminate the rollup backend");
        }
        match run.await.expect("rollup task") {
            Err(error) => {
                assert!(reading.is_some(), "a run failed without being killed: {error}");
                println!("attempt {attempt}: killed mid-read: {error}");
                assert_eq!(rollup_fingerprint(&sql).await, before, "a killed run leaves nothing behind");
                assert_eq!(runs_with_outcome(&sql, "ok").await, ok_runs, "and records no success");
                caught = true;
                break;
            }
            // The read finished before the kill landed: exact all the same;
            // try again with another batch.
            Ok(report) => {
                println!("attempt {attempt}: the run finished before the kill: {report}");
                assert_exact(&sql, "after a run the kill missed").await;
            }
        }
    }
    assert!(caught, "never caught the rollup mid-read");

    let after = run_rollup(db.url(), &RollupConfig::default()).await.expect("the run after the kill");
    assert!(after.advanced() && !after.skipped, "the killed run left the state row unlocked: {after}");
    assert_eq!(rolled_minutes(&sql).await, raw_events(&sql).await);
    assert_exact(&sql, "after the run that followed the kill").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rollup_failing_after_writing_minutes_commits_nothing() {
    let db = test_database().await;
    let store = store(db.url()).await;
    let sql = client(db.url()).await;
    let key = new_session(&store, "fail", "u1").await;
    for i in 0..10 {
        store.append(&key, event_of_kind(i % 5, "agent", "inv", 2), AppendOptions::default()).await.expect("append");
    }
    run_rollup(db.url(), &RollupConfig::default()).await.expect("first run");
    for i in 0..10 {
        store.append(&key, event_of_kind(i % 5, "agent", "inv", 3), AppendOptions::default()).await.expect("append");
    }
    let before = rollup_fingerprint(&sql).await;
    let before_but_hours = fingerprint_of(&sql, &["adk_usage_1m", "adk_usage_1d"]).await;

    // The hour table is locked: the run gets as far as rewriting minutes,
    // then blocks on the hours (its first statement touching them).
    let blocker = client(db.url()).await;
    blocker.batch_execute("BEGIN; LOCK TABLE adk_usage_1h IN ACCESS EXCLUSIVE MODE").await.expect("lock the hours");

    // 1. A failure the run sees: it is recorded, and nothing else stays.
    let impatient = RollupConfig {
        lock_policy: LockPolicy { lock_timeout: Duration::from_millis(300), ..LockPolicy::default() },
        ..RollupConfig::default()
    };
    let error = run_rollup(db.url(), &impatient).await.expect_err("a lock timeout on the hours");
    assert!(error.to_string().contains("lock timeout"), "{error}");
    assert_eq!(
        fingerprint_of(&sql, &["adk_usage_1m", "adk_usage_1d"]).await,
        before_but_hours,
        "the failed run's minutes were rolled back"
    );
    let recorded: String = sql
        .query_one("SELECT error FROM adk_usage_runs WHERE outcome = 'failed' ORDER BY run_id DESC LIMIT 1", &[])
        .await
        .expect("the failed run is recorded")
        .get(0);
    assert!(recorded.contains("lock timeout"), "{recorded}");

    // 2. A failure it cannot see: its backend dies with minutes written.
    let patient = RollupConfig {
        lock_policy: LockPolicy { lock_timeout: Duration::from_secs(30), ..LockPolicy::default() },
        ..RollupConfig::default()
    };
    let run = {
        let url = db.url().to_owned();
        tokio::spawn(async move { run_rollup(&url, &patient).await })
    };
    let pid = rollup_backend(&sql, "%DELETE FROM%adk_usage_1h%", true, Duration::from_secs(20))
        .await
        .expect("the run blocks on the hour table");
    let wrote_minutes: i64 = sql
        .query_one(
            "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
             WHERE l.pid = $1 AND l.mode = 'RowExclusiveLock' AND c.relname LIKE 'adk\\_usage\\_1m\\_p%'",
            &[&pid],
        )
        .await
        .expect("the run's locks")
        .get(0);
    assert!(wrote_minutes > 0, "the run had written minute rows when it was killed");
    let killed: bool = sql.query_one("SELECT pg_terminate_backend($1)", &[&pid]).await.expect("terminate").get(0);
    assert!(killed);
    let error = run.await.expect("rollup task").expect_err("a killed run is an error");
    println!("killed after writing minutes: {error}");
    blocker.batch_execute("ROLLBACK").await.expect("release the hours");
    assert_eq!(rollup_fingerprint(&sql).await, before, "the killed run's minutes were rolled back");

    let after = run_rollup(db.url(), &RollupConfig::default()).await.expect("the run after");
    assert_eq!(after.events_rolled_up, 10, "{after}");
    assert_eq!(rolled_minutes(&sql).await, 20);
    assert_exact(&sql, "after the failed and the killed run").await;
}
