//! Erasing a user on PostgreSQL, looked at from behind the store: what is
//! left in every table and partition, the audit record, bounded batches and
//! partition pruning, interruptions and reruns, appends and creates racing
//! the erasure, a rollup run in progress, tenancy and bad input.
//!
//! Every test has a database of its own; backends are looked up only in it
//! (`datname = current_database()`), since tests run in parallel on one
//! cluster. No assertion depends on how long anything took.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use adk_postgres_domain::{
    AppName, AppendOptions, CreateSession, Erasure, Event, GetOptions, SessionId, SessionKey, SessionStore,
    StoreConfig, StoreError, UserId,
};
use adk_postgres_retention::expire_sessions;
use adk_postgres_storage::tenancy::AppBinding;
use adk_postgres_storage::{
    EraseOptions, EraseProgress, EraseStep, ErasureReport, MAX_ERASE_BATCH, PgSessionStore, TenantScope,
};
use adk_postgres_testing::test_database;
use adk_postgres_tests::pg::{client, scoped_store, service_role, store, with_delta};
use chrono::{Days, NaiveDate, Utc};
use serde_json::{Value, json};
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio_postgres::Client;

const APP: &str = "app";

/// The batch delete of `adk_erase_user_batch` and the count of
/// `adk_erase_user_preview`, as the functions run them (each test that
/// explains one first checks the function still holds it word for word).
const BATCH_DELETE: &str = "DELETE FROM adk_events e WHERE e.app_name = $1 AND e.user_id = $2 \
     AND e.session_id = $3 AND e.session_day = $4 AND e.seq > $5 AND e.seq <= $6";
const PREVIEW_COUNT: &str = "SELECT pg_catalog.count(*) FROM adk_events e WHERE e.app_name = $1 \
     AND e.user_id = $2 AND e.session_id = $3 AND e.session_day = $4";

fn app() -> AppName {
    AppName::new(APP).expect("app")
}

fn user(id: &str) -> UserId {
    UserId::new(id).expect("user id")
}

fn key(user_id: &str, session: &str) -> SessionKey {
    SessionKey::new(app(), user(user_id), SessionId::new(session).expect("session id"))
}

fn utc_today() -> NaiveDate {
    Utc::now().date_naive()
}

fn days_ago(n: u64) -> NaiveDate {
    utc_today().checked_sub_days(Days::new(n)).expect("a day")
}

fn options(batch_size: u32) -> EraseOptions {
    EraseOptions { batch_size, ..EraseOptions::default() }
}

/// A session of `user_id` on `day` (its partition made if missing) with
/// `events` events carrying content that must not survive, written by the
/// owner with `INSERT … SELECT`; expired when `expired`.
async fn seed_session(
    sql: &Client,
    (app_name, user_id, session): (&str, &str, &str),
    day: NaiveDate,
    events: i64,
    expired: bool,
) {
    sql.execute("SELECT adk_ensure_event_partition($1)", &[&day]).await.expect("partition");
    // Created at noon of its day, or now when that is today (still young
    // enough for the lifetime, so appends to it are accepted).
    sql.execute(
        "INSERT INTO adk_sessions (app_name, user_id, session_id, session_day, last_seq, state, created_at,
                                   updated_at, expires_at)
         SELECT $1, $2, $3, $4, $5, '{\"diagnosis\": \"secret-state\"}', t, t,
                CASE WHEN $6 THEN now() - interval '1 hour' END
           FROM (SELECT CASE WHEN $4 = (now() AT TIME ZONE 'UTC')::date THEN now()
                             ELSE ($4::date + time '12:00') AT TIME ZONE 'UTC' END AS t) c",
        &[&app_name, &user_id, &session, &day, &events, &expired],
    )
    .await
    .expect("session");
    sql.execute(
        "INSERT INTO adk_events (app_name, user_id, session_id, session_day, seq, event_id, invocation_id, author,
                                 event_ts, payload)
         SELECT $1, $2, $3, $4, n, $3 || '-e' || n, 'inv-' || (n / 4), 'agent', n,
                jsonb_build_object('id', $3 || '-e' || n, 'author', 'agent', 'timestamp', to_char($4::date, 'YYYY-MM-DD') || 'T12:00:00Z',
                                   'content', jsonb_build_object('parts',
                                       jsonb_build_array(jsonb_build_object('text', 'secret-content ' || n))))
           FROM generate_series(1, $5::bigint) n",
        &[&app_name, &user_id, &session, &day, &events],
    )
    .await
    .expect("events");
}

async fn seed_user_state(sql: &Client, app_name: &str, user_id: &str) {
    sql.execute(
        "INSERT INTO adk_user_states (app_name, user_id, state) VALUES ($1, $2, '{\"plan\": \"secret-plan\"}')",
        &[&app_name, &user_id],
    )
    .await
    .expect("user state");
}

async fn seed_tails(sql: &Client, app_name: &str, user_id: &str, session: &str, tails: i64) {
    sql.execute(
        "INSERT INTO adk_usage_invocation_tails (app_name, user_id, session_id, session_day, invocation_id,
                                                 last_seq, last_event_ts)
         SELECT $1, $2, $3, (now() AT TIME ZONE 'UTC')::date, 'inv-' || n, n, n FROM generate_series(1, $4::bigint) n",
        &[&app_name, &user_id, &session, &tails],
    )
    .await
    .expect("invocation tails");
}

async fn count(sql: &Client, query: &str, app_name: &str, user_id: &str) -> i64 {
    sql.query_one(query, &[&app_name, &user_id]).await.unwrap_or_else(|e| panic!("{query}: {e}")).get(0)
}

/// The user's rows: sessions, events (through the parent), user state,
/// invocation tails.
async fn user_rows(sql: &Client, app_name: &str, user_id: &str) -> [i64; 4] {
    [
        count(sql, "SELECT count(*) FROM adk_sessions WHERE app_name = $1 AND user_id = $2", app_name, user_id).await,
        count(sql, "SELECT count(*) FROM adk_events WHERE app_name = $1 AND user_id = $2", app_name, user_id).await,
        count(sql, "SELECT count(*) FROM adk_user_states WHERE app_name = $1 AND user_id = $2", app_name, user_id)
            .await,
        count(
            sql,
            "SELECT count(*) FROM adk_usage_invocation_tails WHERE app_name = $1 AND user_id = $2",
            app_name,
            user_id,
        )
        .await,
    ]
}

/// The user's events in each partition, read from the partition itself.
async fn events_per_partition(sql: &Client, app_name: &str, user_id: &str) -> Vec<(String, i64)> {
    let partitions: Vec<String> = sql
        .query(
            "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
              WHERE i.inhparent = 'adk_events'::regclass ORDER BY 1",
            &[],
        )
        .await
        .expect("partitions")
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut counts = Vec::new();
    for partition in partitions {
        let query = format!(
            "SELECT count(*) FROM {} WHERE app_name = $1 AND user_id = $2",
            adk_postgres_schema::quote::quote_ident(&partition)
        );
        counts.push((partition, count(sql, &query, app_name, user_id).await));
    }
    counts
}

/// The audit records, as JSON objects, oldest first.
async fn audit_records(sql: &Client) -> Vec<Value> {
    sql.query("SELECT to_jsonb(x) FROM adk_user_erasures x ORDER BY erasure_id", &[])
        .await
        .expect("audit records")
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// A bound service role's `PerRequest` store on `apps`, and the role's name.
async fn service_store(owner_url: &str, apps: &[&str]) -> (PgSessionStore, String) {
    let (role, url) =
        service_role(owner_url, "adk_eraser", AppBinding::Apps(apps.iter().map(|a| (*a).to_owned()).collect())).await;
    (scoped_store(&url, StoreConfig::default(), TenantScope::PerRequest).await, role)
}

#[track_caller]
fn assert_bounded(progress: &[EraseProgress], batch_size: u32) {
    for p in progress {
        assert!(p.affected <= u64::from(batch_size), "a batch touched more than {batch_size} rows: {p:?}");
    }
}

fn steps(progress: &[EraseProgress], step: EraseStep) -> Vec<&EraseProgress> {
    progress.iter().filter(|p| p.step == step).collect()
}

/// An erasure running in a task: its result and every progress report.
type ErasureTask = tokio::task::JoinHandle<(Result<ErasureReport, StoreError>, Vec<EraseProgress>)>;

/// Runs an erasure in a task that stops after batch `pause_after` until
/// told to go on: returns the task, a receiver that fires when it stopped,
/// and the sender that lets it go on.
fn paused_erasure(
    store: PgSessionStore,
    user_id: &str,
    batch_size: u32,
    pause_after: u64,
) -> (ErasureTask, mpsc::Receiver<()>, mpsc::Sender<()>) {
    let (reached_tx, reached_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    // In a mutex: the future holds it across awaits, so it must be Sync.
    let go_rx = std::sync::Mutex::new(go_rx);
    let user_id = user(user_id);
    let task = tokio::spawn(async move {
        let mut seen = Vec::new();
        let result = store
            .erase_user_with(&app(), &user_id, options(batch_size), |p| {
                seen.push(p.clone());
                if p.batch == pause_after {
                    reached_tx.send(()).expect("the test waits");
                    // Between two batches, holding nothing: the test acts now.
                    tokio::task::block_in_place(|| go_rx.lock().expect("not poisoned").recv())
                        .expect("the test lets it go on");
                }
            })
            .await;
        (result, seen)
    });
    (task, reached_rx, go_tx)
}

async fn wait_for(reached: mpsc::Receiver<()>) {
    tokio::task::spawn_blocking(move || reached.recv()).await.expect("join").expect("the erasure paused");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_user_with_100k_events_over_four_days_is_erased_in_bounded_batches() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    // "abc": its SHA-256 is a published test vector, so the audit's hash is
    // checked against a value computed outside this code base.
    const ABC_SHA256: &str = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
    let days = [days_ago(3), days_ago(2), days_ago(1), utc_today()];
    for (i, day) in days.iter().enumerate() {
        // The oldest session has expired, not purged: erased all the same.
        seed_session(&sql, (APP, "abc", &format!("s{i}")), *day, 25_000, i == 0).await;
        // Neighbours in the same partitions stay.
        seed_session(&sql, (APP, "neighbour", &format!("s{i}")), *day, 10, false).await;
        seed_session(&sql, ("other-app", "abc", &format!("s{i}")), *day, 10, false).await;
    }
    seed_user_state(&sql, APP, "abc").await;
    seed_user_state(&sql, APP, "neighbour").await;
    seed_user_state(&sql, "other-app", "abc").await;
    seed_tails(&sql, APP, "abc", "s3", 3).await;
    seed_tails(&sql, APP, "neighbour", "s3", 2).await;
    sql.execute("INSERT INTO adk_app_states (app_name, state) VALUES ($1, '{\"motd\": \"hi\"}')", &[&APP])
        .await
        .expect("app state");
    assert_eq!(user_rows(&sql, APP, "abc").await, [4, 100_000, 1, 3]);
    let per_day_before = events_per_partition(&sql, APP, "abc").await;
    assert_eq!(per_day_before.iter().filter(|(_, n)| *n == 25_000).count(), 4, "{per_day_before:?}");

    let (eraser, role) = service_store(db.url(), &[APP]).await;
    let preview = eraser
        .erase_user_with(&app(), &user("abc"), EraseOptions { dry_run: true, ..options(5_000) }, |_| {})
        .await
        .expect("dry run");
    assert_eq!((preview.sessions, preview.events, preview.user_state, preview.usage_tails), (4, 100_000, true, 3));

    let mut progress = Vec::new();
    let report = eraser
        .erase_user_with(&app(), &user("abc"), options(5_000), |p| progress.push(p.clone()))
        .await
        .expect("erase as the bound service role");

    // Bounded: no batch touched more rows than asked, and the work came in
    // the expected units: one batch hid the four sessions, twenty deleted
    // 5,000 events each (5 per session), four deleted the emptied sessions.
    assert_bounded(&progress, 5_000);
    assert_eq!(progress.first().map(|p| (p.step, p.affected)), Some((EraseStep::Hidden, 4)));
    let event_batches = steps(&progress, EraseStep::Events);
    assert_eq!(event_batches.len(), 20);
    assert!(event_batches.iter().all(|p| p.affected == 5_000), "{event_batches:?}");
    assert_eq!(steps(&progress, EraseStep::Session).len(), 4);
    assert_eq!(progress.last().map(|p| p.step), Some(EraseStep::Done));
    assert_eq!(report.batches, progress.len() as u64);
    assert_eq!(report.erasure(), Erasure { sessions: 4, events: 100_000, user_state: true });
    assert_eq!((report.usage_tails, report.runs, report.user_hash.as_str()), (3, 1, ABC_SHA256));

    // Nothing of the user is left, in any table or partition.
    assert_eq!(user_rows(&sql, APP, "abc").await, [0, 0, 0, 0]);
    let per_day_after = events_per_partition(&sql, APP, "abc").await;
    assert!(per_day_after.iter().all(|(_, n)| *n == 0), "{per_day_after:?}");
    // Everyone else keeps everything, app state included.
    assert_eq!(user_rows(&sql, APP, "neighbour").await, [4, 40, 1, 2]);
    assert_eq!(user_rows(&sql, "other-app", "abc").await, [4, 40, 1, 0]);
    let motd: Value =
        sql.query_one("SELECT state FROM adk_app_states WHERE app_name = $1", &[&APP]).await.expect("app").get(0);
    assert_eq!(motd, json!({"motd": "hi"}));

    // The audit record: counts, times, the acting role, the hash; no id,
    // no content, and no column that could hold any.
    let records = audit_records(&sql).await;
    assert_eq!(records.len(), 1, "{records:?}");
    let record = &records[0];
    let text = record.to_string();
    for personal in ["abc\"", "secret", "s0", "s3", "neighbour"] {
        assert!(!text.contains(personal), "the audit record holds {personal:?}: {text}");
    }
    assert_eq!(record["app_name"], APP);
    assert_eq!(record["user_hash"], ABC_SHA256);
    assert_eq!(record["status"], "done");
    assert_eq!((record["sessions"].as_i64(), record["events"].as_i64()), (Some(4), Some(100_000)));
    assert_eq!((record["user_state"].as_bool(), record["usage_tails"].as_i64()), (Some(true), Some(3)));
    assert_eq!((record["started_by"].as_str(), record["finished_by"].as_str()), (Some(&*role), Some(&*role)));
    assert_eq!((record["runs"].as_i64(), record["batches"].as_i64()), (Some(1), Some(progress.len() as i64)));
    let ordered: bool =
        sql.query_one("SELECT finished_at >= started_at FROM adk_user_erasures", &[]).await.expect("times").get(0);
    assert!(ordered);
    let columns: Vec<String> = sql
        .query(
            "SELECT column_name::text FROM information_schema.columns
              WHERE table_schema = current_schema() AND table_name = 'adk_user_erasures' ORDER BY ordinal_position",
            &[],
        )
        .await
        .expect("columns")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        columns,
        [
            "erasure_id",
            "app_name",
            "user_hash",
            "status",
            "sessions",
            "events",
            "usage_tails",
            "user_state",
            "runs",
            "batches",
            "started_at",
            "finished_at",
            "started_by",
            "finished_by",
            "archived_rows",
            "restored_rows"
        ],
        "a new column of the audit record must not hold content"
    );
}

/// Walks an `EXPLAIN (FORMAT JSON)` plan for the relations it reads or
/// writes. A DELETE's ModifyTable node names the table it was written
/// against (the parent); the partitions it touches are its "Target Tables".
fn relations(plan: &Value, found: &mut Vec<String>) {
    match plan {
        Value::Object(map) => {
            let statement_target = map.get("Node Type") == Some(&Value::from("ModifyTable"));
            if let Some(Value::String(name)) = map.get("Relation Name")
                && !statement_target
            {
                found.push(name.clone());
            }
            map.values().for_each(|v| relations(v, found));
        }
        Value::Array(items) => items.iter().for_each(|v| relations(v, found)),
        _ => {}
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_batch_delete_and_the_dry_run_count_read_only_the_sessions_partition() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    let definitions: String = sql
        .query_one(
            "SELECT pg_get_functiondef('adk_erase_user_batch(text, text, text, bigint, integer)'::regprocedure)
                    || pg_get_functiondef('adk_erase_user_preview(text, text, text)'::regprocedure)",
            &[],
        )
        .await
        .expect("function definitions")
        .get(0);
    let day = days_ago(2);
    for n in 0..5 {
        sql.execute("SELECT adk_ensure_event_partition($1)", &[&days_ago(n)]).await.expect("partition");
    }
    seed_session(&sql, (APP, "u", "s"), day, 100, false).await;
    sql.batch_execute("ANALYZE adk_events; SET plan_cache_mode = force_custom_plan").await.expect("analyze");
    for (statement, arguments) in [
        (BATCH_DELETE, format!("'{APP}', 'u', 's', DATE '{day}', 0, 50")),
        (PREVIEW_COUNT, format!("'{APP}', 'u', 's', DATE '{day}'")),
    ] {
        assert!(definitions.contains(statement), "the function no longer runs {statement:?}");
        // EXECUTE … USING plans with its arguments, as a custom plan does.
        sql.batch_execute(&format!("PREPARE probe AS {statement}")).await.expect("prepare");
        let plan: Value = sql
            .query_one(&format!("EXPLAIN (FORMAT JSON) EXECUTE probe({arguments})"), &[])
            .await
            .expect("explain")
            .get(0);
        sql.batch_execute("DEALLOCATE probe").await.expect("deallocate");
        let mut read = Vec::new();
        relations(&plan, &mut read);
        read.sort();
        read.dedup();
        assert_eq!(read, [adk_postgres_schema::names::partition_name(day)], "{statement}: {plan}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_erasure_killed_mid_batch_is_finished_by_running_it_again() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    for (i, day) in [days_ago(1), utc_today()].iter().enumerate() {
        seed_session(&sql, (APP, "victim", &format!("s{i}")), *day, 10_000, false).await;
    }
    seed_user_state(&sql, APP, "victim").await;
    let (eraser, role) = service_store(db.url(), &[APP]).await;
    // Batch 1 hides both sessions, batches 2 and 3 delete 1,000 events each.
    let (task, reached, go) = paused_erasure(eraser, "victim", 1_000, 3);
    wait_for(reached).await;
    let blocker = client(db.url()).await;
    blocker
        .batch_execute("BEGIN; SELECT 1 FROM adk_sessions WHERE app_name = 'app' AND user_id = 'victim' FOR UPDATE")
        .await
        .expect("hold the user's session rows");
    go.send(()).expect("go on");
    // Batch 4 waits for the session rows the blocker holds: kill it there.
    let mut pid = None;
    for _ in 0..400 {
        let rows = sql
            .query(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND usename = $1
                    AND wait_event_type = 'Lock'",
                &[&role],
            )
            .await
            .expect("activity");
        if let Some(row) = rows.first() {
            pid = Some(row.get::<_, i32>(0));
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let pid = pid.expect("the erasure's fourth batch never waited for the blocker");
    sql.execute("SELECT pg_terminate_backend($1)", &[&pid]).await.expect("terminate");
    let (result, seen) = task.await.expect("join");
    let error = result.expect_err("the erasure's backend was killed");
    assert!(error.is_retryable(), "{error:?}");
    assert_eq!(seen.len(), 3);
    blocker.batch_execute("ROLLBACK").await.expect("release");

    // Interrupted: recorded as running with what it did, the sessions
    // already hidden, the rest still there.
    let records = audit_records(&sql).await;
    assert_eq!(records.len(), 1);
    let id = records[0]["erasure_id"].as_i64();
    assert_eq!((records[0]["status"].as_str(), records[0]["events"].as_i64()), (Some("running"), Some(2_000)));
    let owner = store(db.url()).await;
    for session in ["s0", "s1"] {
        let missing = owner.get(&key("victim", session), GetOptions::default()).await;
        assert!(matches!(missing, Err(StoreError::NotFound(_))), "{missing:?}");
    }
    assert_eq!(user_rows(&sql, APP, "victim").await, [2, 18_000, 1, 0]);
    let preview = owner
        .erase_user_with(&app(), &user("victim"), EraseOptions { dry_run: true, ..EraseOptions::default() }, |_| {})
        .await
        .expect("dry run");
    assert_eq!((preview.erasure_id, preview.sessions, preview.events), (id, 2, 18_000), "{preview}");
    assert!(preview.to_string().contains("would resume interrupted erasure"), "{preview}");

    // Run again (as the owner this time): the same record, finished.
    let report = owner.erase_user_with(&app(), &user("victim"), options(1_000), |_| {}).await.expect("rerun");
    assert_eq!((report.erasure_id, report.runs), (id, 2));
    assert_eq!(report.erasure(), Erasure { sessions: 2, events: 20_000, user_state: true });
    assert_eq!(user_rows(&sql, APP, "victim").await, [0, 0, 0, 0]);
    let records = audit_records(&sql).await;
    assert_eq!(records.len(), 1);
    assert_eq!((records[0]["status"].as_str(), records[0]["runs"].as_i64()), (Some("done"), Some(2)));
    assert_eq!(records[0]["events"].as_i64(), Some(20_000));
    assert_eq!(records[0]["started_by"].as_str(), Some(&*role));
    assert_eq!(records[0]["finished_by"].as_str(), Some("postgres"), "the owner finished it");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_erasure_dropped_between_batches_then_expired_is_finished_by_running_it_again() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    for session in ["s0", "s1"] {
        seed_session(&sql, (APP, "dropped", session), utc_today(), 5_000, false).await;
    }
    seed_user_state(&sql, APP, "dropped").await;
    {
        let interrupted = store(db.url()).await;
        let third = Arc::new(Notify::new());
        let signal = Arc::clone(&third);
        let (app, dropped) = (app(), user("dropped"));
        tokio::select! {
            result = interrupted.erase_user_with(&app, &dropped, options(1_000), |p| {
                if p.batch == 3 {
                    signal.notify_one();
                }
            }) => panic!("the erasure finished before it was dropped: {result:?}"),
            () = third.notified() => {}
        }
        // The store goes with the future it ran.
    }
    // A batch the dropped future had queued is still sent by the
    // connection's task, which drains its queue before it closes: on a busy
    // machine it ran after the expiry below, found nothing left and
    // finished the erasure. Wait until the dropped store's connections are
    // gone, as an operator's rerun would come after the process died.
    let mut waited = 0;
    while sql
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()
               AND backend_type = 'client backend'",
            &[],
        )
        .await
        .expect("backends")
        .get::<_, i64>(0)
        > 0
    {
        assert!(waited < 600, "the dropped store's connections stayed open");
        waited += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let records = audit_records(&sql).await;
    assert_eq!(records[0]["status"], "running");
    // The expiry job takes the hidden sessions whole, as any expired
    // session: still an erasure, and the rerun finishes the rest.
    let expired = expire_sessions(db.url(), 100, None).await.expect("expire");
    assert_eq!(expired.sessions_deleted, 2);
    assert_eq!(user_rows(&sql, APP, "dropped").await, [0, 0, 1, 0]);

    let report =
        store(db.url()).await.erase_user_with(&app(), &user("dropped"), options(1_000), |_| {}).await.expect("rerun");
    assert_eq!(report.runs, 2);
    assert_eq!(report.sessions, 0, "expiry deleted the sessions, not the erasure");
    // Batches 2 and 3 deleted 1,000 events each; the fourth may have
    // committed before its future was dropped.
    assert!([2_000, 3_000].contains(&report.events), "{report:?}");
    assert!(report.user_state);
    assert_eq!(user_rows(&sql, APP, "dropped").await, [0, 0, 0, 0]);
    assert_eq!(audit_records(&sql).await[0]["status"], "done");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn eight_appenders_racing_an_erasure_leave_nothing_of_the_user() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    let sessions = ["a", "b", "c", "d"];
    for session in sessions {
        seed_session(&sql, (APP, "racer", session), utc_today(), 3_000, false).await;
    }
    let writer = Arc::new(store(db.url()).await);
    let acknowledged = Arc::new(AtomicU64::new(0));
    let warmed_up = Arc::new(Notify::new());
    let mut appenders = JoinSet::new();
    for (i, session) in sessions.iter().cycle().take(8).enumerate() {
        let (writer, acknowledged, warmed_up) =
            (Arc::clone(&writer), Arc::clone(&acknowledged), Arc::clone(&warmed_up));
        let key = key("racer", session);
        appenders.spawn(async move {
            for n in 0u64.. {
                let mut event = with_delta(json!({ format!("user:w{i}"): n, "n": n }));
                event.invocation_id = format!("inv-{i}-{n}");
                match writer.append(&key, event, AppendOptions::default()).await {
                    Ok(appended) => {
                        assert!(appended.seq.is_some() && !appended.replayed, "{appended:?}");
                        if acknowledged.fetch_add(1, Ordering::SeqCst) + 1 == 200 {
                            warmed_up.notify_one();
                        }
                    }
                    Err(StoreError::NotFound(missing)) => {
                        assert_eq!(missing, key);
                        return n;
                    }
                    Err(other) => panic!("append racing an erasure: {other:?}"),
                }
            }
            unreachable!("an appender stops at NotFound")
        });
    }
    warmed_up.notified().await;
    let (eraser, _) = service_store(db.url(), &[APP]).await;
    let mut progress = Vec::new();
    let report = eraser
        .erase_user_with(&app(), &user("racer"), options(500), |p| progress.push(p.clone()))
        .await
        .expect("erase under appends");
    while let Some(appender) = appenders.join_next().await {
        appender.expect("appender");
    }
    assert_bounded(&progress, 500);
    let acknowledged = acknowledged.load(Ordering::SeqCst);
    // Every acknowledged append landed before its session was hidden and
    // was erased with it; every other one was refused with NotFound.
    assert_eq!(report.erasure(), Erasure { sessions: 4, events: 4 * 3_000 + acknowledged, user_state: true });
    assert_eq!(user_rows(&sql, APP, "racer").await, [0, 0, 0, 0]);
    let left = events_per_partition(&sql, APP, "racer").await;
    assert!(left.iter().all(|(_, n)| *n == 0), "{left:?}");
    for session in sessions {
        let missing = writer.append(&key("racer", session), Event::new("late"), AppendOptions::default()).await;
        assert!(matches!(missing, Err(StoreError::NotFound(_))), "{missing:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sessions_created_during_an_erasure_are_erased_too() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    seed_session(&sql, (APP, "busy", "first"), utc_today(), 3_000, false).await;
    let owner = store(db.url()).await;
    // Batch 1 hides "first", batches 2 and 3 delete 1,000 of its events each.
    let (task, reached, go) = paused_erasure(owner.clone(), "busy", 1_000, 3);
    wait_for(reached).await;
    // Meanwhile: a new session, and the hidden one's id taken over (its
    // remaining events go with the expired row, as for any expired id).
    for id in ["late", "first"] {
        let session = owner
            .create(CreateSession::new(app(), user("busy")).with_id(id))
            .await
            .unwrap_or_else(|e| panic!("create {id} during the erasure: {e}"));
        assert_eq!(session.version, 0);
        owner
            .append(&session.key, with_delta(json!({"user:again": id})), AppendOptions::default())
            .await
            .expect("append to a session created during the erasure");
    }
    assert_eq!(user_rows(&sql, APP, "busy").await, [2, 2, 1, 0]);
    go.send(()).expect("go on");
    let (result, seen) = task.await.expect("join");
    let report = result.expect("erasure");
    assert_eq!(report.erasure(), Erasure { sessions: 2, events: 2_002, user_state: true });
    assert_eq!(seen[3].step, EraseStep::Hidden, "the next batch hid the two new sessions: {seen:?}");
    assert_eq!(seen[3].affected, 2);
    assert_eq!(user_rows(&sql, APP, "busy").await, [0, 0, 0, 0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_erasure_waits_for_a_running_rollup_before_deleting_tails() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    seed_session(&sql, (APP, "rolled", "s"), utc_today(), 10, false).await;
    seed_tails(&sql, APP, "rolled", "s", 2).await;
    // A rollup run in progress holds its state row until it commits, and
    // may then write tails of events it read before they were deleted.
    let rollup = client(db.url()).await;
    rollup.batch_execute("BEGIN; SELECT * FROM adk_usage_state FOR UPDATE").await.expect("a rollup run");
    let (steps_tx, mut steps_rx) = tokio::sync::mpsc::unbounded_channel();
    let eraser = store(db.url()).await;
    let task = tokio::spawn(async move {
        eraser
            .erase_user_with(&app(), &user("rolled"), options(100), |p| {
                let _ = steps_tx.send(p.step);
            })
            .await
    });
    while let Some(step) = steps_rx.recv().await {
        assert_ne!(step, EraseStep::Done, "the erasure finished under a running rollup");
        if step == EraseStep::WaitingForRollup {
            break;
        }
    }
    rollup
        .batch_execute(
            "INSERT INTO adk_usage_invocation_tails (app_name, user_id, session_id, session_day, invocation_id,
                                                     last_seq, last_event_ts)
             VALUES ('app', 'rolled', 's', (now() AT TIME ZONE 'UTC')::date, 'inv-written-at-commit', 10, 10);
             COMMIT",
        )
        .await
        .expect("the rollup run commits its tails");
    let report = task.await.expect("join").expect("erasure");
    assert_eq!(report.usage_tails, 3, "the tails the run wrote went too");
    assert_eq!(user_rows(&sql, APP, "rolled").await, [0, 0, 0, 0]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_service_role_of_another_app_can_neither_erase_nor_count() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    seed_session(&sql, (APP, "kept", "s"), utc_today(), 20, false).await;
    seed_user_state(&sql, APP, "kept").await;
    let (stranger, _) = service_store(db.url(), &["elsewhere"]).await;
    let fixed = {
        let (_, url) = service_role(db.url(), "adk_eraser", AppBinding::Apps(vec!["elsewhere".into()])).await;
        scoped_store(&url, StoreConfig::default(), TenantScope::Fixed(AppName::new("elsewhere").expect("app"))).await
    };
    let unscoped = {
        let (_, url) = service_role(db.url(), "adk_eraser", AppBinding::Apps(vec![APP.into()])).await;
        scoped_store(&url, StoreConfig::default(), TenantScope::Off).await
    };
    for (what, store) in [("bound elsewhere", &stranger), ("fixed elsewhere", &fixed), ("naming no tenant", &unscoped)]
    {
        for dry_run in [false, true] {
            let refused = store
                .erase_user_with(&app(), &user("kept"), EraseOptions { dry_run, ..EraseOptions::default() }, |_| {})
                .await;
            match refused {
                Err(StoreError::PermissionDenied { .. }) => {}
                other => panic!("{what} (dry run {dry_run}): expected PermissionDenied, got {other:?}"),
            }
        }
        assert!(matches!(store.erase_user(&app(), &user("kept")).await, Err(StoreError::PermissionDenied { .. })));
    }
    assert_eq!(user_rows(&sql, APP, "kept").await, [1, 20, 1, 0], "nothing deleted");
    assert!(audit_records(&sql).await.is_empty(), "nothing recorded");
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_batch_sizes_and_ids_are_refused_with_nothing_written() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    seed_session(&sql, (APP, "kept", "s"), utc_today(), 5, false).await;
    let owner = store(db.url()).await;
    for batch_size in [0, MAX_ERASE_BATCH + 1] {
        for dry_run in [false, true] {
            match owner.erase_user_with(&app(), &user("kept"), EraseOptions { batch_size, dry_run }, |_| {}).await {
                Err(StoreError::InvalidInput { field, .. }) => assert_eq!(field, "batch_size"),
                other => panic!("batch size {batch_size}: expected InvalidInput, got {other:?}"),
            }
        }
    }
    // Behind the store's back, the functions refuse what the newtypes would.
    let long = "u".repeat(129);
    for (user_id, constraint) in [("", "adk_sessions_user_id_sane"), (long.as_str(), "adk_sessions_user_id_sane")] {
        for function in ["adk_erase_user_begin", "adk_erase_user_preview"] {
            let error = sql
                .query(&format!("SELECT * FROM {function}(NULL, 'app', $1)"), &[&user_id])
                .await
                .expect_err("a bad user id");
            let db_error = error.as_db_error().expect("a server error");
            assert_eq!(db_error.code(), &tokio_postgres::error::SqlState::CHECK_VIOLATION, "{function}");
            assert_eq!(db_error.constraint(), Some(constraint), "{function}");
        }
    }
    let error =
        sql.query("SELECT * FROM adk_erase_user_begin(NULL, '', 'kept')", &[]).await.expect_err("a bad app name");
    assert_eq!(error.as_db_error().and_then(|e| e.constraint()), Some("adk_sessions_app_name_sane"));
    // An erasure id is bound to its user: another user's is refused.
    let begun: i64 = sql
        .query_one("SELECT erasure_id FROM adk_erase_user_begin(NULL, 'app', 'someone')", &[])
        .await
        .expect("begin")
        .get(0);
    let error = sql
        .query("SELECT * FROM adk_erase_user_batch(NULL, 'app', 'kept', $1, 10)", &[&begun])
        .await
        .expect_err("the erasure of another user");
    let message = error.as_db_error().map(|e| e.message().to_owned()).unwrap_or_default();
    assert!(message.contains("is not an erasure of this user"), "{error:?}");
    for batch in [0, 100_001] {
        sql.query("SELECT * FROM adk_erase_user_batch(NULL, 'app', 'someone', $1, $2)", &[&begun, &batch])
            .await
            .expect_err("a bad batch size");
    }
    assert_eq!(user_rows(&sql, APP, "kept").await, [1, 5, 0, 0], "nothing deleted");
    let hidden: i64 = sql
        .query_one("SELECT count(*) FROM adk_sessions WHERE expires_at IS NOT NULL", &[])
        .await
        .expect("hidden")
        .get(0);
    assert_eq!(hidden, 0, "nothing hidden");
    assert_eq!(audit_records(&sql).await.len(), 1, "only the one begun above");
    assert!(owner.get(&key("kept", "s"), GetOptions::default()).await.is_ok());
}
