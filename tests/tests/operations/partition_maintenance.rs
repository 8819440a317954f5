//! Partition maintenance against a real PostgreSQL, with "today" injected.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use adk_postgres_domain::{
    AppendOptions, Event, GetOptions, SessionKey, SessionStore, StoreConfig, StoreError, StorePolicy,
};
use adk_postgres_retention::{
    HealthThresholds, LockPolicy, MaintenanceConfig, RetentionError, health, run_maintenance,
};
use adk_postgres_storage::set_policy;
use adk_postgres_testing::{Cluster, start_throwaway_cluster, test_database, test_database_on};
use adk_postgres_tests::pg::{client, diesel, new_session, store, store_with, wal_lsn, wal_since};
use chrono::{Days, NaiveDate, Utc};
use serde_json::Value;
use tokio_postgres::Client;

const DAY: Duration = Duration::from_secs(24 * 3600);

fn day(text: &str) -> NaiveDate {
    NaiveDate::parse_from_str(text, "%Y-%m-%d").expect("day")
}

fn plus(d: NaiveDate, n: i64) -> NaiveDate {
    if n >= 0 { d.checked_add_days(Days::new(n as u64)) } else { d.checked_sub_days(Days::new((-n) as u64)) }
        .expect("day in range")
}

/// Removes every partition, so a test starts from an empty set.
async fn drop_all_partitions(sql: &Client) {
    sql.batch_execute(
        "DO $$ DECLARE p regclass; BEGIN
           FOR p IN SELECT inhrelid::regclass FROM pg_inherits WHERE inhparent = 'adk_events'::regclass LOOP
             EXECUTE format('DROP TABLE %s', p);
           END LOOP; END $$;",
    )
    .await
    .expect("drop partitions");
}

async fn partition_days(sql: &Client) -> Vec<NaiveDate> {
    let rows = sql
        .query(
            "SELECT substring(c.relname from 13)::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
             WHERE i.inhparent = 'adk_events'::regclass ORDER BY 1",
            &[],
        )
        .await
        .expect("partitions");
    rows.iter().map(|r| NaiveDate::parse_from_str(r.get::<_, &str>(0), "%Y%m%d").expect("partition day")).collect()
}

async fn default_partition(sql: &Client) -> u32 {
    sql.query_one("SELECT partdefid::oid FROM pg_partitioned_table WHERE partrelid = 'adk_events'::regclass", &[])
        .await
        .expect("partdefid")
        .get(0)
}

fn days(from: NaiveDate, to: NaiveDate) -> Vec<NaiveDate> {
    from.iter_days().take_while(|d| *d <= to).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn premakes_from_the_clock_and_fills_gaps() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    drop_all_partitions(&sql).await;
    let today = day("2030-01-10");
    let config = MaintenanceConfig::default();

    let first = run_maintenance(db.url(), today, &config).await.expect("first run");
    assert_eq!(first.created, days(today, plus(today, 7)));
    assert_eq!(first.partitions_ahead, 7);
    assert_eq!(partition_days(&sql).await, days(today, plus(today, 7)));

    let again = run_maintenance(db.url(), today, &config).await.expect("same day again");
    assert!(again.created.is_empty(), "{again:?}");

    let next_day = run_maintenance(db.url(), plus(today, 1), &config).await.expect("next day");
    assert_eq!(next_day.created, vec![plus(today, 8)]);

    for gap in 3..=5 {
        sql.batch_execute(&format!("DROP TABLE adk_events_p{}", plus(today, gap).format("%Y%m%d"))).await.expect("gap");
    }
    let filled = run_maintenance(db.url(), plus(today, 1), &config).await.expect("fill the gap");
    assert_eq!(filled.created, days(plus(today, 3), plus(today, 5)));
    assert_eq!(partition_days(&sql).await, days(today, plus(today, 8)));
    assert_eq!(default_partition(&sql).await, 0, "no default partition, ever");
}

/// Sessions and events on `day`, written behind the store's back so the
/// day can be in the past; the sessions were created and last active at
/// noon (UTC) of that day.
async fn seed_day(sql: &Client, day: NaiveDate, sessions: i32, events_per_session: i32) {
    sql.execute("SELECT adk_ensure_event_partition($1)", &[&day]).await.expect("partition");
    sql.execute(
        "INSERT INTO adk_sessions (app_name, user_id, session_id, session_day, last_seq, created_at, updated_at)
         SELECT 'app', 'user', $1::date::text || '-' || s, $1, $3::int,
                ($1::date + time '12:00') AT TIME ZONE 'UTC', ($1::date + time '12:00') AT TIME ZONE 'UTC'
         FROM generate_series(1, $2) s",
        &[&day, &sessions, &events_per_session],
    )
    .await
    .expect("sessions");
    sql.execute(
        "INSERT INTO adk_events (app_name, user_id, session_id, session_day, seq, event_id, author, event_ts, payload)
         SELECT 'app', 'user', $1::date::text || '-' || s, $1, n, 'e' || n, 'agent', n,
                jsonb_build_object('id', 'e' || n, 'author', 'agent', 'timestamp', $1::date::text || 'T12:00:00Z',
                                   'text', repeat(md5(s::text || n::text), 4))
         FROM generate_series(1, $2) s, generate_series(1, $3) n",
        &[&day, &sessions, &events_per_session],
    )
    .await
    .expect("events");
}

async fn day_fingerprints(sql: &Client) -> Vec<(NaiveDate, i64, String)> {
    sql.query(
        "SELECT session_day, count(*), md5(string_agg(session_id || ':' || seq || ':' || payload::text, ',' ORDER BY session_id, seq))
         FROM adk_events GROUP BY 1 ORDER BY 1",
        &[],
    )
    .await
    .expect("fingerprints")
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2)))
    .collect()
}

/// Partitions made after the migration to lz4 (by maintenance, and by the
/// SQL function the store and the migrate call) take the parent's
/// compression of payloads, and on Citus so do their shards.
#[tokio::test(flavor = "multi_thread")]
async fn partitions_made_later_compress_payloads_with_lz4() {
    if adk_postgres_testing::skip_without(adk_postgres_testing::Capability::Lz4).await {
        return;
    }
    let db = test_database().await;
    let sql = client(db.url()).await;
    let today = day("2030-01-10");
    let report = run_maintenance(db.url(), today, &MaintenanceConfig::default()).await.expect("maintenance");
    assert_eq!(report.created.len(), 8, "{report:?}");
    sql.execute("SELECT adk_ensure_event_partition($1)", &[&day("2031-06-01")]).await.expect("one more day");
    // The partitions by name; on a worker their shards, the name and a
    // shard id.
    let methods = |sql: Client, names: &'static str| async move {
        sql.query(
            "SELECT c.relname::text, a.attcompression::text FROM pg_class c
               JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = 'payload'
              WHERE c.relname ~ $1 ORDER BY 1",
            &[&names],
        )
        .await
        .expect("attcompression")
        .iter()
        .map(|row| (row.get::<_, String>(0), row.get::<_, String>(1)))
        .collect::<Vec<_>>()
    };
    let made = methods(sql, "^adk_events_p(2030[0-9]{4}|20310601)$").await;
    assert_eq!(made.len(), 9, "{made:?}");
    assert!(made.iter().all(|(_, method)| method == "l"), "{made:?}");
    for worker in db.worker_urls() {
        let worker_sql = client(&worker).await;
        // Citus hides shards from pg_class unless asked.
        worker_sql.batch_execute("SET citus.override_table_visibility = off").await.expect("show shards");
        let shards = methods(worker_sql, "^adk_events_p(2030[0-9]{4}|20310601)_[0-9]+$").await;
        assert!(!shards.is_empty(), "no shard of the new days on {worker}");
        assert!(shards.iter().all(|(_, method)| method == "l"), "{shards:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn drops_exactly_the_days_past_lifetime_and_retention() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    drop_all_partitions(&sql).await;
    let today = day("2030-03-01");
    for back in 0..60 {
        seed_day(&sql, plus(today, -back), 3, 5).await;
    }
    let config = MaintenanceConfig::default();
    let cutoff = plus(today, -37);
    let before = day_fingerprints(&sql).await;

    let report = run_maintenance(db.url(), today, &config).await.expect("maintenance");
    let expected_dropped: Vec<String> = days(plus(today, -59), plus(today, -38))
        .iter()
        .map(|d| format!("adk_events_p{}", d.format("%Y%m%d")))
        .collect();
    assert_eq!(report.dropped, expected_dropped);
    assert_eq!(report.detached, expected_dropped);
    assert_eq!(report.sessions_deleted, 22 * 3);
    assert_eq!(report.created, days(plus(today, 1), plus(today, 7)));

    let kept: Vec<_> = before.into_iter().filter(|(d, _, _)| *d >= cutoff).collect();
    assert_eq!(kept.len(), 38);
    assert_eq!(day_fingerprints(&sql).await, kept, "a kept day changed");
    let old_sessions: i64 = sql
        .query_one("SELECT count(*) FROM adk_sessions WHERE session_day < $1", &[&cutoff])
        .await
        .expect("count")
        .get(0);
    assert_eq!(old_sessions, 0);
    let kept_sessions: i64 = sql.query_one("SELECT count(*) FROM adk_sessions", &[]).await.expect("count").get(0);
    assert_eq!(kept_sessions, 38 * 3);

    let second = run_maintenance(db.url(), today, &config).await.expect("second run");
    assert!(second.dropped.is_empty() && second.created.is_empty() && second.sessions_deleted == 0, "{second:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn dropping_a_day_writes_under_one_percent_of_the_wal_of_deleting_it() {
    // WAL is per cluster: a cluster of its own keeps other tests' writes out
    // of the measurement.
    let cluster: &'static Cluster = Box::leak(Box::new(start_throwaway_cluster().expect("a private cluster")));
    let db = test_database_on(cluster).await;
    let sql = client(db.url()).await;
    drop_all_partitions(&sql).await;
    let today = day("2030-06-01");
    // The deleted day is recent, so the measured run retires only the dropped one.
    let deleted_day = plus(today, -10);
    let dropped_day = plus(today, -49);
    // Few sessions with many events each: the day's bulk is its events.
    seed_day(&sql, deleted_day, 20, 5000).await;
    seed_day(&sql, dropped_day, 20, 5000).await;
    // Premake first (keeping everything), so the measured run only retires
    // days; settle the tables so autovacuum has nothing to write meanwhile.
    sql.batch_execute("UPDATE adk_store_policy SET retention = interval '1000 days'").await.expect("keep all");
    run_maintenance(db.url(), today, &MaintenanceConfig::default()).await.expect("premake");
    sql.batch_execute("UPDATE adk_store_policy SET retention = interval '30 days'").await.expect("default again");
    sql.batch_execute("VACUUM (FREEZE, ANALYZE) adk_events, adk_sessions").await.expect("vacuum");
    for d in [deleted_day, dropped_day] {
        sql.batch_execute(&format!("ALTER TABLE adk_events_p{} SET (autovacuum_enabled = off)", d.format("%Y%m%d")))
            .await
            .expect("autovacuum off");
    }
    sql.batch_execute("ALTER TABLE adk_sessions SET (autovacuum_enabled = off); CHECKPOINT").await.expect("settle");

    let start = wal_lsn(&sql).await;
    let deleted = sql.execute("DELETE FROM adk_events WHERE session_day = $1", &[&deleted_day]).await.expect("delete");
    let delete_wal = wal_since(&sql, &start).await;
    assert_eq!(deleted, 100_000);

    let start = wal_lsn(&sql).await;
    let report = run_maintenance(db.url(), today, &MaintenanceConfig::default()).await.expect("drop");
    let drop_wal = wal_since(&sql, &start).await;
    assert!(report.dropped.contains(&format!("adk_events_p{}", dropped_day.format("%Y%m%d"))), "{report:?}");
    let ratio = drop_wal as f64 / delete_wal as f64;
    println!("WAL: DELETE {delete_wal} bytes, maintenance drop {drop_wal} bytes, ratio {ratio:.4}");
    assert!(ratio < 0.01, "drop wrote {drop_wal} bytes of WAL, DELETE {delete_wal}");
}

#[tokio::test(flavor = "multi_thread")]
async fn two_runs_at_once_neither_fails_and_the_result_is_one_run() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    drop_all_partitions(&sql).await;
    let today = day("2030-02-01");
    for back in 38..45 {
        seed_day(&sql, plus(today, -back), 2, 3).await;
    }
    let config = MaintenanceConfig::default();
    let (a, b) = tokio::join!(run_maintenance(db.url(), today, &config), run_maintenance(db.url(), today, &config));
    let (a, b) = (a.expect("first run"), b.expect("second run"));
    assert!(a.waited_for_other_run || b.waited_for_other_run, "the runs did not overlap? {a:?} {b:?}");
    let mut created = [a.created.clone(), b.created.clone()].concat();
    created.sort();
    assert_eq!(created, days(today, plus(today, 7)), "each day created exactly once");
    assert_eq!(a.dropped.len() + b.dropped.len(), 7);
    assert_eq!(a.sessions_deleted + b.sessions_deleted, 14);
    assert_eq!(partition_days(&sql).await, days(today, plus(today, 7)));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_detach_interrupted_after_its_first_phase_is_finalized() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    drop_all_partitions(&sql).await;
    let today = day("2030-04-01");
    let old = plus(today, -40);
    seed_day(&sql, old, 2, 3).await;
    let partition = format!("adk_events_p{}", old.format("%Y%m%d"));

    // A reader holding a snapshot makes DETACH … CONCURRENTLY wait in its
    // second phase; cancelling it there leaves the detach pending.
    let reader = client(db.url()).await;
    reader
        .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM adk_events;")
        .await
        .expect("reader");
    let detacher = client(db.url()).await;
    let detacher_pid: i32 = detacher.query_one("SELECT pg_backend_pid()", &[]).await.expect("pid").get(0);
    let statement = format!("ALTER TABLE adk_events DETACH PARTITION {partition} CONCURRENTLY");
    let detach = tokio::spawn(async move { detacher.batch_execute(&statement).await });
    let mut pending = false;
    for _ in 0..100 {
        pending = sql
            .query_one(
                "SELECT coalesce(bool_or(inhdetachpending), false) FROM pg_inherits WHERE inhparent = 'adk_events'::regclass",
                &[],
            )
            .await
            .expect("pending")
            .get(0);
        if pending {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(pending, "the detach never reached its second phase");
    sql.execute("SELECT pg_cancel_backend($1)", &[&detacher_pid]).await.expect("cancel");
    assert!(detach.await.expect("join").is_err(), "the detach should have been cancelled");
    reader.batch_execute("COMMIT").await.expect("end reader");

    let report = run_maintenance(db.url(), today, &MaintenanceConfig::default()).await.expect("maintenance");
    assert_eq!(report.finalized, vec![partition.clone()]);
    assert!(report.dropped.contains(&partition), "{report:?}");
    assert_eq!(report.sessions_deleted, 2);
    let left: i64 =
        sql.query_one("SELECT count(*) FROM pg_class WHERE relname = $1", &[&partition]).await.expect("count").get(0);
    assert_eq!(left, 0);
}

/// On Citus the detaches are plain and lock adk_events exclusively; the
/// run reports how long, and the writers' worst append shows what that
/// cost them (printed, not gated: timings here are noise).
#[tokio::test(flavor = "multi_thread")]
async fn maintenance_under_eight_writers_loses_nothing() {
    let db = test_database().await;
    let on_citus = !db.worker_urls().is_empty();
    let sql = client(db.url()).await;
    let today = Utc::now().date_naive();
    for back in 40..50 {
        seed_day(&sql, plus(today, -back), 5, 20).await;
    }
    let store = Arc::new(store(db.url()).await);
    let stop = Arc::new(AtomicBool::new(false));
    let stored = Arc::new(AtomicU64::new(0));
    let mut writers = Vec::new();
    for w in 0..8 {
        let store = Arc::clone(&store);
        let stop = Arc::clone(&stop);
        let stored = Arc::clone(&stored);
        writers.push(tokio::spawn(async move {
            let key = new_session(store.as_ref(), "app", &format!("writer-{w}")).await;
            let mut appended = 0u64;
            let mut slowest = Duration::ZERO;
            while !stop.load(Ordering::Relaxed) {
                let started = std::time::Instant::now();
                store
                    .append(&key, Event::new("agent"), AppendOptions::default())
                    .await
                    .expect("append under maintenance");
                slowest = slowest.max(started.elapsed());
                appended += 1;
                stored.fetch_add(1, Ordering::Relaxed);
            }
            (key, appended, slowest)
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut reports = Vec::new();
    for _ in 0..3 {
        reports.push(run_maintenance(db.url(), today, &MaintenanceConfig::default()).await.expect("maintenance"));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::Relaxed);
    let mut total = 0;
    let mut slowest = Duration::ZERO;
    for writer in writers {
        let (key, appended, writer_slowest) = writer.await.expect("writer");
        slowest = slowest.max(writer_slowest);
        let session = store.get(&key, Default::default()).await.expect("get");
        assert_eq!(session.events.len() as u64, appended, "lost appends in {key}");
        assert_eq!(session.version, appended);
        total += appended;
    }
    assert_eq!(total, stored.load(Ordering::Relaxed));
    assert!(total > 8, "the writers barely ran: {total}");
    assert_eq!(reports[0].dropped.len(), 10, "{:?}", reports[0]);
    let exclusive = &reports[0].exclusive_detach_ms;
    if on_citus {
        assert_eq!(exclusive.len(), 10, "every detach on Citus is a plain one: {exclusive:?}");
    } else {
        assert!(exclusive.is_empty(), "one server detaches concurrently: {exclusive:?}");
    }
    let mut sorted = exclusive.clone();
    sorted.sort_unstable();
    eprintln!(
        "8 writers, {total} appends: {} exclusive detach(es), median {} ms, longest {} ms; slowest append {} ms",
        sorted.len(),
        sorted.get(sorted.len() / 2).copied().unwrap_or_default(),
        sorted.last().copied().unwrap_or_default(),
        slowest.as_millis()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn health_alerts_when_few_partitions_are_ahead() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    drop_all_partitions(&sql).await;
    let today = Utc::now().date_naive();
    let thresholds = HealthThresholds::default();

    let before = health(db.url(), today, &thresholds).await.expect("health");
    assert!(!before.is_healthy());
    assert!(before.alerts.iter().any(|a| a.contains("never run")), "{:?}", before.alerts);

    run_maintenance(db.url(), today, &MaintenanceConfig::default()).await.expect("maintenance");
    let healthy = health(db.url(), today, &thresholds).await.expect("health");
    assert!(healthy.is_healthy(), "{:?}", healthy.alerts);
    assert_eq!(healthy.partitions_ahead, 7);
    assert!(healthy.last_run.is_some());

    for ahead in 3..=7 {
        sql.batch_execute(&format!("DROP TABLE adk_events_p{}", plus(today, ahead).format("%Y%m%d")))
            .await
            .expect("drop");
    }
    let thin = health(db.url(), today, &thresholds).await.expect("health");
    assert_eq!(thin.partitions_ahead, 2);
    assert!(thin.alerts.iter().any(|a| a.contains("only 2 future")), "{:?}", thin.alerts);
}

fn name(d: NaiveDate) -> String {
    format!("adk_events_p{}", d.format("%Y%m%d"))
}

fn names(list: &[NaiveDate]) -> Vec<String> {
    list.iter().copied().map(name).collect()
}

async fn change_policy(url: &str, policy: StorePolicy) {
    let mut conn = diesel(url).await;
    set_policy(&mut conn, &policy).await.expect("set the policy");
}

/// outcome, error and kept_days of the latest recorded run.
async fn latest_run(sql: &Client) -> (String, Option<String>, Value) {
    let row = sql
        .query_one("SELECT outcome, error, kept_days FROM adk_maintenance_runs ORDER BY run_id DESC LIMIT 1", &[])
        .await
        .expect("latest run");
    (row.get(0), row.get(1), row.get(2))
}

#[tokio::test(flavor = "multi_thread")]
async fn maintenance_follows_the_policy_in_the_database() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    drop_all_partitions(&sql).await;
    let today = day("2030-03-01");
    for back in 0..=30 {
        seed_day(&sql, plus(today, -back), 1, 2).await;
    }
    let config = MaintenanceConfig::default();

    // The default policy (7 + 30 days) keeps every seeded day.
    let first = run_maintenance(db.url(), today, &config).await.expect("default policy");
    assert!(first.dropped.is_empty(), "{first:?}");
    assert_eq!(first.retire_before, Some(plus(today, -37)));
    assert_eq!(first.created, days(plus(today, 1), plus(today, 7)));

    // Lowered retention: days before today - 17 go, with their sessions.
    change_policy(db.url(), StorePolicy { retention: DAY * 10, premake_days: 3, ..StorePolicy::default() }).await;
    let lowered = run_maintenance(db.url(), today, &config).await.expect("lowered retention");
    assert_eq!(lowered.retire_before, Some(plus(today, -17)));
    assert_eq!(lowered.dropped, names(&days(plus(today, -30), plus(today, -18))));
    assert_eq!(lowered.sessions_deleted, 13);
    assert!(lowered.created.is_empty() && lowered.kept.is_empty(), "{lowered:?}");
    let policy = lowered.policy.expect("the policy the run used");
    assert_eq!((policy.retention_secs, policy.premake_days), (10 * 86_400, 3));

    // Raised retention: five days later nothing more goes (the lowered
    // policy would have retired five more days by then).
    change_policy(db.url(), StorePolicy { retention: DAY * 40, premake_days: 3, ..StorePolicy::default() }).await;
    let later = plus(today, 5);
    let raised = run_maintenance(db.url(), later, &config).await.expect("raised retention");
    assert!(raised.dropped.is_empty() && raised.sessions_deleted == 0, "{raised:?}");
    assert_eq!(raised.retire_before, Some(plus(later, -47)));
    assert_eq!(raised.created, vec![plus(today, 8)], "premake follows the policy's three days");
    assert_eq!(partition_days(&sql).await, days(plus(today, -17), plus(today, 8)));
    let sessions: i64 = sql.query_one("SELECT count(*) FROM adk_sessions", &[]).await.expect("count").get(0);
    assert_eq!(sessions, 18);
}

/// A conversation created today through the store, with `events` appends,
/// whose last activity is then moved to noon of `last_active` (simulated
/// time: it went on talking until then).
async fn conversation(
    store: &dyn SessionStore,
    sql: &Client,
    user: &str,
    events: usize,
    last_active: NaiveDate,
) -> SessionKey {
    let key = new_session(store, "app", user).await;
    for _ in 0..events {
        store.append(&key, Event::new("agent"), AppendOptions::default()).await.expect("append");
    }
    sql.execute(
        "UPDATE adk_sessions SET updated_at = ($1::date + time '12:00') AT TIME ZONE 'UTC' WHERE session_id = $2",
        &[&last_active, &key.session_id.as_str()],
    )
    .await
    .expect("simulate later activity");
    key
}

async fn events_of_day(sql: &Client, d: NaiveDate) -> i64 {
    sql.query_one("SELECT count(*) FROM adk_events WHERE session_day = $1", &[&d]).await.expect("count").get(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_day_with_a_live_session_is_kept_and_alerted_until_it_goes_quiet() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    let store = store(db.url()).await;
    let config = MaintenanceConfig::default();
    let thresholds = HealthThresholds::default();
    let today = Utc::now().date_naive();
    run_maintenance(db.url(), today, &config).await.expect("premake");
    // The run is six days from now; the conversation talked until the day
    // before it, under the policy of the time. A quiet day sits next to it.
    let run_day = plus(today, 6);
    let key = conversation(&store, &sql, "live", 5, plus(run_day, -1)).await;
    let yesterday = plus(today, -1);
    seed_day(&sql, yesterday, 2, 3).await;
    let before = day_fingerprints(&sql).await;

    // Then the policy is lowered: today is now past lifetime + retention.
    change_policy(
        db.url(),
        StorePolicy { max_session_lifetime: DAY * 2, retention: DAY * 3, ..StorePolicy::default() },
    )
    .await;
    let report = run_maintenance(db.url(), run_day, &config).await.expect("maintenance");
    assert_eq!(report.retire_before, Some(plus(today, 1)));
    assert_eq!(report.dropped, vec![name(yesterday)], "the quiet day goes, the live one stays");
    assert_eq!(report.sessions_deleted, 2);
    assert_eq!(report.kept.len(), 1, "{report:?}");
    let kept = &report.kept[0];
    assert_eq!((kept.day, kept.partition.clone(), kept.open_sessions), (today, Some(name(today)), 1));

    // Its events and its session row are intact.
    let session = store.get(&key, GetOptions::default()).await.expect("the kept conversation");
    assert_eq!(session.events.len(), 5);
    let kept_before: Vec<_> = before.into_iter().filter(|(d, _, _)| *d == today).collect();
    assert_eq!(day_fingerprints(&sql).await, kept_before);

    // The run says which day it kept and why.
    let (outcome, error, kept_days) = latest_run(&sql).await;
    assert_eq!((outcome.as_str(), error), ("ok", None));
    assert_eq!(kept_days[0]["day"], today.to_string());
    assert_eq!(kept_days[0]["open_sessions"], 1);
    let last_active = kept_days[0]["last_active"].as_str().unwrap_or_default();
    assert!(last_active.starts_with(&plus(run_day, -1).to_string()), "{kept_days}");
    assert!(kept_days[0]["reason"].as_str().is_some_and(|r| r.contains("open session")), "{kept_days}");

    // Health alerts, and keeps alerting while the day stays.
    let alerting = health(db.url(), run_day, &thresholds).await.expect("health");
    assert!(!alerting.is_healthy());
    assert_eq!(alerting.overdue_partitions.len(), 1, "{alerting:?}");
    assert!(alerting.alerts.iter().any(|a| a.contains(&name(today)) && a.contains("kept")), "{:?}", alerting.alerts);
    let again = run_maintenance(db.url(), run_day, &config).await.expect("same day again");
    assert_eq!(again.kept.len(), 1);
    assert!(!health(db.url(), run_day, &thresholds).await.expect("health").is_healthy());

    // Time passes: idle for the whole retention, the day is retired and the alert clears.
    let quiet = plus(run_day, 3);
    let retired = run_maintenance(db.url(), quiet, &config).await.expect("later");
    assert!(retired.dropped.contains(&name(today)), "{retired:?}");
    assert!(retired.kept.is_empty());
    assert_eq!(retired.sessions_deleted, 1);
    let cleared = health(db.url(), quiet, &thresholds).await.expect("health");
    assert!(cleared.is_healthy(), "{:?}", cleared.alerts);
    assert!(matches!(store.get(&key, GetOptions::default()).await, Err(StoreError::NotFound(_))));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_kept_day_is_retired_once_its_sessions_close_or_expire() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    let store = store(db.url()).await;
    let config = MaintenanceConfig::default();
    let thresholds = HealthThresholds::default();
    let today = Utc::now().date_naive();
    run_maintenance(db.url(), today, &config).await.expect("premake");
    let run_day = plus(today, 6);
    let rolled = conversation(&store, &sql, "rolled", 2, plus(run_day, -1)).await;
    let expiring = conversation(&store, &sql, "expiring", 2, plus(run_day, -1)).await;
    change_policy(
        db.url(),
        StorePolicy { max_session_lifetime: DAY * 2, retention: DAY * 3, ..StorePolicy::default() },
    )
    .await;

    let both = run_maintenance(db.url(), run_day, &config).await.expect("both live");
    assert_eq!(both.kept.iter().map(|k| k.open_sessions).collect::<Vec<_>>(), vec![2]);

    // Rolled over: closed. Its successor, made today, has been idle since.
    store.rollover(&rolled, None, Event::new("summarizer")).await.expect("rollover");
    let one = run_maintenance(db.url(), run_day, &config).await.expect("one live");
    assert_eq!(one.kept.iter().map(|k| k.open_sessions).collect::<Vec<_>>(), vec![1]);
    assert!(one.dropped.is_empty());
    assert!(!health(db.url(), run_day, &thresholds).await.expect("health").is_healthy());

    sql.execute(
        "UPDATE adk_sessions SET expires_at = now() - interval '1 minute' WHERE session_id = $1",
        &[&expiring.session_id.as_str()],
    )
    .await
    .expect("expire");
    let none = run_maintenance(db.url(), run_day, &config).await.expect("none live");
    assert!(none.kept.is_empty(), "{none:?}");
    assert_eq!(none.dropped, vec![name(today)]);
    assert_eq!(events_of_day(&sql, today).await, 0);
    let cleared = health(db.url(), run_day, &thresholds).await.expect("health");
    assert!(cleared.is_healthy(), "{:?}", cleared.alerts);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_session_38_days_old_is_never_both_acknowledged_and_lost() {
    // The default policy, and a client asking for a longer lifetime than
    // the policy's (it may only tighten).
    for client_lifetime in [None, Some(DAY * 60)] {
        let db = test_database().await;
        let sql = client(db.url()).await;
        let today = Utc::now().date_naive();
        let old = plus(today, -38);
        seed_day(&sql, old, 1, 3).await;
        let key = SessionKey::parse("app", "user", &format!("{old}-1")).expect("key");
        let store =
            store_with(db.url(), StoreConfig { max_session_lifetime: client_lifetime, ..StoreConfig::default() }).await;
        assert_eq!(store.get(&key, GetOptions::default()).await.expect("seeded").events.len(), 3);

        let appended = store.append(&key, Event::new("agent"), AppendOptions::default()).await;
        let acknowledged = match &appended {
            Ok(_) => true,
            Err(StoreError::LifetimeExceeded { max_lifetime, .. }) => {
                assert_eq!(*max_lifetime, DAY * 7, "the policy's lifetime applies");
                false
            }
            Err(other) => panic!("an append either succeeds or is refused as too old: {other:?}"),
        };
        let report = run_maintenance(db.url(), today, &MaintenanceConfig::default()).await.expect("maintenance");
        let after = store.get(&key, GetOptions::default()).await;
        if acknowledged {
            let events = after.as_ref().map(|s| s.events.len()).unwrap_or_default();
            assert_eq!(events, 4, "an acknowledged append was lost by maintenance: {report:?}");
        } else {
            // Refused, so nothing new was promised; the day is past lifetime
            // + retention and idle, so it goes.
            assert!(report.dropped.contains(&name(old)), "{report:?}");
            assert!(matches!(after, Err(StoreError::NotFound(_))), "{after:?}");
        }
    }
}

/// A transaction that read adk_events (so holds a lock on it and its
/// partitions, and a snapshot) until the returned client commits.
async fn reader_holding_adk_events(url: &str) -> Client {
    let reader = client(url).await;
    reader
        .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM adk_events;")
        .await
        .expect("reader");
    reader
}

async fn detach_pending(sql: &Client) -> bool {
    sql.query_one(
        "SELECT coalesce(bool_or(inhdetachpending), false) FROM pg_inherits WHERE inhparent = 'adk_events'::regclass",
        &[],
    )
    .await
    .expect("pending")
    .get(0)
}

/// An old day, and today's partitions already made, so the run under test
/// only has the old day to retire.
async fn one_day_to_retire(url: &str, sql: &Client, today: NaiveDate) -> NaiveDate {
    drop_all_partitions(sql).await;
    let old = plus(today, -40);
    seed_day(sql, old, 2, 3).await;
    sql.batch_execute("UPDATE adk_store_policy SET retention = interval '1000 days'").await.expect("keep all");
    run_maintenance(url, today, &MaintenanceConfig::default()).await.expect("premake");
    sql.batch_execute("UPDATE adk_store_policy SET retention = interval '30 days'").await.expect("default again");
    old
}

#[tokio::test(flavor = "multi_thread")]
async fn a_detach_that_times_out_in_its_second_phase_is_finished_in_the_same_run() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    let today = day("2030-04-01");
    let old = one_day_to_retire(db.url(), &sql, today).await;

    let reader = reader_holding_adk_events(db.url()).await;
    // Let go after a couple of lock timeouts of the detach's second phase.
    let watcher = client(db.url()).await;
    let release = tokio::spawn(async move {
        for _ in 0..500 {
            if detach_pending(&watcher).await {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(Duration::from_millis(450)).await;
        reader.batch_execute("COMMIT").await.expect("end reader");
    });
    let config = MaintenanceConfig {
        lock_policy: LockPolicy {
            lock_timeout: Duration::from_millis(200),
            attempts: 8,
            backoff: Duration::from_millis(100),
        },
        ..MaintenanceConfig::default()
    };
    let report = run_maintenance(db.url(), today, &config).await.expect("the run finishes the detach");
    release.await.expect("release");
    assert_eq!(report.finalized, vec![name(old)], "finished with FINALIZE: {report:?}");
    assert_eq!(report.detached, vec![name(old)]);
    assert_eq!(report.dropped, vec![name(old)]);
    assert_eq!(report.sessions_deleted, 2);
    assert!(!detach_pending(&sql).await);
    let left: i64 =
        sql.query_one("SELECT count(*) FROM pg_class WHERE relname = $1", &[&name(old)]).await.expect("count").get(0);
    assert_eq!(left, 0);
    let (outcome, error, _) = latest_run(&sql).await;
    assert_eq!((outcome.as_str(), error), ("ok", None));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_run_that_fails_for_good_is_recorded_and_the_next_one_finishes() {
    let db = test_database().await;
    // One server times out in the detach's second phase, leaving it pending;
    // Citus' plain detach times out waiting for its lock, leaving nothing.
    let on_citus = !db.worker_urls().is_empty();
    let sql = client(db.url()).await;
    let today = day("2030-04-01");
    let old = one_day_to_retire(db.url(), &sql, today).await;

    let reader = reader_holding_adk_events(db.url()).await;
    let impatient = MaintenanceConfig {
        lock_policy: LockPolicy {
            lock_timeout: Duration::from_millis(100),
            attempts: 2,
            backoff: Duration::from_millis(50),
        },
        ..MaintenanceConfig::default()
    };
    let err = run_maintenance(db.url(), today, &impatient).await.expect_err("the reader never lets go");
    assert!(matches!(err, RetentionError::LockTimeout { .. }), "{err:?}");
    assert_eq!(detach_pending(&sql).await, !on_citus, "pending after a second phase that timed out");
    let (outcome, error, _) = latest_run(&sql).await;
    assert_eq!(outcome, "failed");
    let statement = if on_citus { "DETACH PARTITION" } else { "FINALIZE" };
    assert!(error.as_deref().is_some_and(|e| e.contains(statement)), "{error:?}");
    let failing = health(db.url(), today, &HealthThresholds::default()).await.expect("health");
    assert!(failing.last_failure.is_some());
    assert!(failing.alerts.iter().any(|a| a.contains("failed")), "{:?}", failing.alerts);

    reader.batch_execute("COMMIT").await.expect("end reader");
    let report = run_maintenance(db.url(), today, &MaintenanceConfig::default()).await.expect("next run");
    if on_citus {
        assert!(report.finalized.is_empty(), "{report:?}");
        assert_eq!(report.exclusive_detach_ms.len(), 1, "{report:?}");
    } else {
        assert_eq!(report.finalized, vec![name(old)], "{report:?}");
    }
    assert_eq!(report.dropped, vec![name(old)]);
    assert_eq!(report.sessions_deleted, 2);
    let healthy = health(db.url(), today, &HealthThresholds::default()).await.expect("health");
    assert!(healthy.is_healthy(), "{:?}", healthy.alerts);
}
