//! Operating the usage rollups against a real PostgreSQL: their tiers are
//! policy like the rest (read, changed, refused when inconsistent),
//! maintenance premakes and retires their partitions, and health alerts
//! on lag, on a failed or stuck run and on late events, and stays quiet
//! on a fresh database.
//!
//! Events are written behind the store's back with SQL, so their own time
//! (`event_ts`) can be put in the past while their arrival (`created_at`)
//! is the real clock.

use std::time::Duration;

use adk_postgres_domain::{StoreError, StorePolicy};
use adk_postgres_retention::{
    HealthReport, HealthThresholds, LockPolicy, MaintenanceConfig, RetentionError, health, run_maintenance,
};
use adk_postgres_rollup::{RollupConfig, RollupError, run_rollup};
use adk_postgres_storage::policy::{
    PolicyAmendment, PolicySettings, UsagePolicy, amend_policy_settings, read_policy_settings, set_usage_policy,
};
use adk_postgres_storage::{policy_changes, read_policy};
use adk_postgres_testing::test_database;
use adk_postgres_tests::pg::{client, diesel};
use chrono::{Days, NaiveDate};
use tokio_postgres::Client;

const HOUR: Duration = Duration::from_secs(3600);
const DAY: Duration = Duration::from_secs(24 * 3600);

async fn today_utc(sql: &Client) -> NaiveDate {
    sql.query_one("SELECT (now() AT TIME ZONE 'UTC')::date", &[]).await.expect("today (UTC)").get(0)
}

async fn count(sql: &Client, query: &str) -> i64 {
    sql.query_one(query, &[]).await.unwrap_or_else(|e| panic!("{query}: {e}")).get(0)
}

/// Stores session `session` of `app` with `events` events by agent
/// `agent`, whose own time is `age_secs` before now and whose arrival is
/// now. The session's day is today (UTC), which maintenance premade.
async fn store_events(sql: &Client, app: &str, session: &str, events: i64, age_secs: f64) {
    sql.execute(
        "INSERT INTO adk_sessions (app_name, user_id, session_id, last_seq) VALUES ($1, 'user', $2, $3)",
        &[&app, &session, &events],
    )
    .await
    .expect("session");
    sql.execute(
        "INSERT INTO adk_events (app_name, user_id, session_id, session_day, seq, event_id, author, event_ts, payload)
         SELECT $1, 'user', $2, (now() AT TIME ZONE 'UTC')::date, n, 'e' || n, 'agent',
                (extract(epoch FROM now() - make_interval(secs => $4)) * 1000000)::bigint * 1000,
                '{\"author\": \"agent\", \"content\": {\"parts\": [{\"text\": \"hi\"}]}}'
         FROM generate_series(1, $3::bigint) n",
        &[&app, &session, &events, &age_secs],
    )
    .await
    .expect("events");
}

/// The name of the `level` partition holding the moment `ago` before now.
async fn usage_partition(sql: &Client, level: &str, ago: &str) -> String {
    sql.query_one(
        "SELECT adk_usage_partition_name($1, date_trunc(adk_usage_span($1),
                                                     (now() - $2::text::interval) AT TIME ZONE 'UTC'))",
        &[&level, &ago],
    )
    .await
    .expect("partition name")
    .get(0)
}

async fn make_usage_partition(sql: &Client, level: &str, ago: &str) -> String {
    sql.execute("SELECT adk_ensure_usage_partition($1, now() - $2::text::interval)", &[&level, &ago])
        .await
        .expect("make a usage partition");
    usage_partition(sql, level, ago).await
}

async fn table_exists(sql: &Client, name: &str) -> bool {
    sql.query_one("SELECT to_regclass($1) IS NOT NULL", &[&name]).await.expect("to_regclass").get(0)
}

async fn health_now(url: &str, sql: &Client) -> HealthReport {
    health(url, today_utc(sql).await, &HealthThresholds::default()).await.expect("health")
}

fn rollup_alerts(report: &HealthReport) -> Vec<&String> {
    report.alerts.iter().filter(|a| a.contains("rollup") || a.contains("late")).collect()
}

async fn rollup(url: &str) -> adk_postgres_rollup::RollupReport {
    run_rollup(url, &RollupConfig::default()).await.unwrap_or_else(|e| panic!("rollup: {e}"))
}

// ---------------------------------------------------------------------------
// Policy
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn usage_tiers_are_read_and_changed_with_the_rest_of_the_policy() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    let mut conn = diesel(db.url()).await;
    assert_eq!(read_policy_settings(&mut conn).await.expect("read"), PolicySettings::default());

    // A partial change keeps the other fields, the store's half included.
    let amendment = PolicyAmendment {
        usage_lateness: Some(HOUR * 12),
        usage_minute_retention: Some(DAY * 10),
        usage_hour_retention: Some(DAY * 100),
        usage_day_retention: Some(Some(DAY * 800)),
        ..PolicyAmendment::default()
    };
    let amended = amend_policy_settings(&mut conn, &amendment).await.expect("amend the tiers");
    let wanted = UsagePolicy {
        lateness: HOUR * 12,
        minute_retention: DAY * 10,
        hour_retention: DAY * 100,
        day_retention: Some(DAY * 800),
    };
    assert_eq!(amended, PolicySettings { store: StorePolicy::default(), usage: wanted });
    assert_eq!(read_policy_settings(&mut conn).await.expect("read").usage, wanted);
    assert_eq!(read_policy(&mut conn).await.expect("read"), StorePolicy::default());

    // The SQL side (the rollup job, retirement) reads the same durations.
    let seconds: Vec<Option<f64>> = sql
        .query_one(
            "SELECT extract(epoch FROM adk_policy_seconds(usage_lateness))::float8,
                    extract(epoch FROM adk_policy_seconds(usage_minute_retention))::float8,
                    extract(epoch FROM adk_policy_seconds(usage_hour_retention))::float8,
                    extract(epoch FROM adk_policy_seconds(usage_day_retention))::float8
             FROM adk_store_policy",
            &[],
        )
        .await
        .map(|row| (0..4).map(|i| row.get(i)).collect())
        .expect("seconds");
    assert_eq!(seconds, vec![Some(43_200.0), Some(864_000.0), Some(8_640_000.0), Some(69_120_000.0)]);
    let mut usage_conn = diesel(db.url()).await;
    let (tiers, _) = adk_postgres_rollup::tiers(&mut usage_conn).await.expect("the query's tiers");
    assert_eq!(tiers.days, Some(chrono::Duration::days(800)));

    // Day rows kept for ever again, and the store's half changed alone.
    let kept = PolicyAmendment { usage_day_retention: Some(None), retention: Some(DAY * 40), ..Default::default() };
    let amended = amend_policy_settings(&mut conn, &kept).await.expect("keep day rows");
    assert_eq!(amended.usage, UsagePolicy { day_retention: None, ..wanted });
    assert_eq!(amended.store.retention, DAY * 40);
    let null: bool =
        sql.query_one("SELECT usage_day_retention IS NULL FROM adk_store_policy", &[]).await.expect("null").get(0);
    assert!(null, "kept for ever is NULL in the row");

    // Replaced whole, leaving the store's policy alone.
    let replaced = set_usage_policy(&mut conn, &UsagePolicy::default()).await.expect("set the tiers");
    assert_eq!(replaced, UsagePolicy::default());
    assert_eq!(read_policy(&mut conn).await.expect("read").retention, DAY * 40);

    // Every change is recorded, naming the fields it changed.
    let changes = policy_changes(&mut conn, 10).await.expect("history");
    assert_eq!(changes.len(), 3, "{changes:?}");
    let fields = |i: usize| changes[i].changed_fields().into_iter().map(|(f, _, _)| f).collect::<Vec<_>>();
    assert_eq!(
        fields(2),
        vec!["usage_day_retention", "usage_hour_retention", "usage_lateness", "usage_minute_retention"]
    );
    assert_eq!(fields(1), vec!["retention", "usage_day_retention"]);
    assert_eq!(fields(0), vec!["usage_hour_retention", "usage_lateness", "usage_minute_retention"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn inconsistent_tiers_are_refused_naming_the_field_and_nothing_changes() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    let mut conn = diesel(db.url()).await;
    let refused = [
        (PolicyAmendment { usage_lateness: Some(Duration::from_secs(30)), ..Default::default() }, "usage_lateness"),
        (PolicyAmendment { usage_lateness: Some(DAY * 8), ..Default::default() }, "usage_lateness"),
        // Minutes must outlast the lateness window by a day, whichever moved.
        (PolicyAmendment { usage_minute_retention: Some(DAY), ..Default::default() }, "usage_minute_retention"),
        (
            PolicyAmendment {
                usage_lateness: Some(DAY * 7),
                usage_minute_retention: Some(DAY * 7),
                ..Default::default()
            },
            "usage_minute_retention",
        ),
        (PolicyAmendment { usage_hour_retention: Some(DAY * 13), ..Default::default() }, "usage_hour_retention"),
        (PolicyAmendment { usage_minute_retention: Some(DAY * 401), ..Default::default() }, "usage_hour_retention"),
        (PolicyAmendment { usage_day_retention: Some(Some(DAY * 399)), ..Default::default() }, "usage_day_retention"),
        (
            PolicyAmendment {
                usage_day_retention: Some(Some(DAY * 500)),
                usage_hour_retention: Some(DAY * 501),
                ..Default::default()
            },
            "usage_day_retention",
        ),
    ];
    for (amendment, field) in refused {
        let err = amend_policy_settings(&mut conn, &amendment).await.expect_err("inconsistent tiers");
        assert!(matches!(&err, StoreError::InvalidInput { field: f, .. } if f == field), "{amendment:?}: {err:?}");
        assert!(err.to_string().contains(&format!("invalid {field}")), "{err}");
    }
    let err = set_usage_policy(&mut conn, &UsagePolicy { hour_retention: DAY, ..UsagePolicy::default() })
        .await
        .expect_err("hours shorter than minutes");
    assert!(matches!(&err, StoreError::InvalidInput { field, .. } if field == "usage_hour_retention"), "{err:?}");
    // A store field and a tier together: nothing of either is written.
    let both =
        PolicyAmendment { retention: Some(DAY * 90), usage_hour_retention: Some(DAY), ..PolicyAmendment::default() };
    assert!(amend_policy_settings(&mut conn, &both).await.is_err());

    assert_eq!(read_policy_settings(&mut conn).await.expect("read"), PolicySettings::default(), "nothing written");
    assert_eq!(count(&sql, "SELECT count(*) FROM adk_store_policy_changes").await, 0, "nothing recorded");

    // The database refuses the same tiers on its own, constraint by constraint.
    for (update, constraint) in [
        ("usage_lateness = interval '8 days'", "adk_store_policy_usage_lateness_range"),
        ("usage_minute_retention = interval '1 day'", "adk_store_policy_minute_tier_covers_lateness"),
        ("usage_hour_retention = interval '13 days'", "adk_store_policy_hour_tier_covers_minutes"),
        ("usage_day_retention = interval '399 days'", "adk_store_policy_day_tier_covers_hours"),
    ] {
        let refused =
            sql.execute(&format!("UPDATE adk_store_policy SET {update}"), &[]).await.expect_err("CHECK constraint");
        let name = refused.as_db_error().and_then(|e| e.constraint()).unwrap_or_default().to_owned();
        assert_eq!(name, constraint, "{update}");
    }
    assert_eq!(read_policy_settings(&mut conn).await.expect("read"), PolicySettings::default());
}

// ---------------------------------------------------------------------------
// Maintenance
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn maintenance_premakes_usage_partitions_and_drops_each_tier_past_its_retention() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    let today = today_utc(&sql).await;
    let config = MaintenanceConfig::default();

    // A gap in the premade minutes, and old partitions of every tier.
    let ahead = usage_partition(&sql, "1m", "-3 days").await;
    sql.batch_execute(&format!("DROP TABLE IF EXISTS \"{ahead}\"")).await.expect("drop a premade minute partition");
    let old_minutes = make_usage_partition(&sql, "1m", "30 days").await;
    let recent_minutes = make_usage_partition(&sql, "1m", "10 days").await;
    let old_hours = make_usage_partition(&sql, "1h", "500 days").await;
    let old_days = make_usage_partition(&sql, "1d", "5 years").await;

    let report = run_maintenance(db.url(), today, &config).await.expect("maintenance");
    assert!(report.usage_partitions_created >= 1, "{report:?}");
    assert!(table_exists(&sql, &ahead).await, "the gap is premade again");
    assert_eq!(report.usage_partitions_dropped, vec![old_minutes.clone(), old_hours.clone()], "{report:?}");
    assert!(!table_exists(&sql, &old_minutes).await);
    assert!(!table_exists(&sql, &old_hours).await);
    assert!(table_exists(&sql, &recent_minutes).await, "10 days old is within the 14 days of minutes");
    assert!(table_exists(&sql, &old_days).await, "day rows are kept for ever by default");
    let usage = report.policy.as_ref().and_then(|p| p.usage.as_ref()).expect("the tiers judged by");
    assert_eq!(usage.minute_retention_secs, 14 * 86_400);
    let text = report.to_string();
    assert!(text.contains("usage rollups:") && text.contains(&old_minutes), "{text}");
    let json = serde_json::to_value(&report).expect("json");
    assert_eq!(json["usage_partitions_dropped"][0], old_minutes.as_str());

    // Nothing left to do the second time.
    let again = run_maintenance(db.url(), today, &config).await.expect("again");
    assert_eq!((again.usage_partitions_created, again.usage_partitions_dropped.len()), (0, 0), "{again:?}");
    assert!(!again.to_string().contains("usage rollups:"), "{again}");

    // The policy decides: shorter minutes retire the 10-day-old partition,
    // and a day tier retires the old days.
    let mut conn = diesel(db.url()).await;
    let tighter = PolicyAmendment {
        usage_minute_retention: Some(DAY * 3),
        usage_day_retention: Some(Some(DAY * 1000)),
        ..PolicyAmendment::default()
    };
    amend_policy_settings(&mut conn, &tighter).await.expect("tighter tiers");
    let tightened = run_maintenance(db.url(), today, &config).await.expect("after tightening");
    assert_eq!(tightened.usage_partitions_dropped, vec![recent_minutes.clone(), old_days.clone()], "{tightened:?}");
    // Today's, yesterday's and the premade minutes stay.
    let minutes = count(
        &sql,
        "SELECT count(*) FROM pg_inherits WHERE inhparent = 'adk_usage_1m'::regclass
           AND inhrelid::regclass::text >= adk_usage_partition_name('1m', date_trunc('day', now() AT TIME ZONE 'UTC'))",
    )
    .await;
    assert!(minutes >= 8, "today and the premade days: {minutes}");
}

#[tokio::test(flavor = "multi_thread")]
async fn usage_partition_work_retries_its_locks_and_a_run_that_gives_up_is_recorded() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    let today = today_utc(&sql).await;
    run_maintenance(db.url(), today, &MaintenanceConfig::default()).await.expect("premake");
    let old_minutes = make_usage_partition(&sql, "1m", "30 days").await;
    let event_day = today.checked_add_days(Days::new(3)).expect("a day");
    let event_partition = format!("adk_events_p{}", event_day.format("%Y%m%d"));
    sql.batch_execute(&format!("DROP TABLE \"{event_partition}\"")).await.expect("drop a premade event partition");

    // A reader of the minute rollups holds its lock for the whole run.
    let reader = client(db.url()).await;
    reader.batch_execute("BEGIN; SELECT count(*) FROM adk_usage_1m;").await.expect("reader");
    let impatient = MaintenanceConfig {
        lock_policy: LockPolicy {
            lock_timeout: Duration::from_millis(100),
            attempts: 2,
            backoff: Duration::from_millis(50),
        },
        ..MaintenanceConfig::default()
    };
    let err = run_maintenance(db.url(), today, &impatient).await.expect_err("the reader never lets go");
    match &err {
        RetentionError::LockTimeout { statement, attempts } => {
            assert!(statement.contains("adk_retire_usage_partitions"), "{statement}");
            assert_eq!(*attempts, 2);
        }
        other => panic!("expected a lock timeout, got {other:?}"),
    }
    assert!(table_exists(&sql, &old_minutes).await, "a statement that gave up dropped nothing");
    assert!(table_exists(&sql, &event_partition).await, "the event log's partitions come first");
    let (outcome, error): (String, Option<String>) = sql
        .query_one("SELECT outcome, error FROM adk_maintenance_runs ORDER BY run_id DESC LIMIT 1", &[])
        .await
        .map(|row| (row.get(0), row.get(1)))
        .expect("the run");
    assert_eq!(outcome, "failed");
    assert!(error.as_deref().is_some_and(|e| e.contains("adk_retire_usage_partitions")), "{error:?}");

    reader.batch_execute("COMMIT").await.expect("reader done");
    let report = run_maintenance(db.url(), today, &MaintenanceConfig::default()).await.expect("next run");
    assert_eq!(report.usage_partitions_dropped, vec![old_minutes]);
}

// ---------------------------------------------------------------------------
// Health
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn a_fresh_database_does_not_alert_about_rollups() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    run_maintenance(db.url(), today_utc(&sql).await, &MaintenanceConfig::default()).await.expect("maintenance");

    let fresh = health_now(db.url(), &sql).await;
    assert!(fresh.is_healthy(), "{:?}", fresh.alerts);
    let rollups = fresh.rollups.as_ref().expect("migration 12 is applied");
    assert_eq!((rollups.watermark, rollups.lag_secs, rollups.overdue_events), (None, None, false));
    assert!(rollups.last_run.is_none());
    assert_eq!((rollups.late_rejected_today, rollups.late_rejected_yesterday), (0, 0));
    assert!(rollups.minute_partitions_ahead >= 7, "{rollups:?}");
    let levels: Vec<&str> = rollups.tiers.iter().map(|t| t.level.as_str()).collect();
    assert_eq!(levels, ["1m", "1h", "1d"]);
    assert!(rollups.tiers.iter().all(|t| t.partitions >= 1), "{rollups:?}");
    let text = fresh.to_string();
    assert!(text.contains("rollup watermark") && text.contains("never run"), "{text}");
    let json = serde_json::to_value(&fresh).expect("json");
    assert_eq!(json["rollups"]["late_rejected_today"], 0);

    // Events that just arrived do not alert yet: a scheduled run has not
    // had its chance.
    store_events(&sql, "shop", "s1", 3, 1.0).await;
    let young = health_now(db.url(), &sql).await;
    assert!(young.is_healthy(), "{:?}", young.alerts);
}

#[tokio::test(flavor = "multi_thread")]
async fn rollups_that_never_ran_alert_once_events_are_overdue_and_a_run_clears_it() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    run_maintenance(db.url(), today_utc(&sql).await, &MaintenanceConfig::default()).await.expect("maintenance");
    store_events(&sql, "shop", "s1", 3, 1.0).await;
    sql.batch_execute("UPDATE adk_events SET created_at = now() - interval '1 hour'").await.expect("arrived earlier");

    let never = health_now(db.url(), &sql).await;
    assert!(never.rollups.as_ref().is_some_and(|r| r.overdue_events), "{:?}", never.rollups);
    assert_eq!(rollup_alerts(&never).len(), 1, "{:?}", never.alerts);
    assert!(never.alerts.iter().any(|a| a.contains("rollups have never run")), "{:?}", never.alerts);

    let report = rollup(db.url()).await;
    assert_eq!(report.events_rolled_up, 3);
    let after = health_now(db.url(), &sql).await;
    assert!(after.is_healthy(), "{:?}", after.alerts);
    let rollups = after.rollups.as_ref().expect("rollups");
    assert!(rollups.lag_secs.is_some_and(|lag| lag < 60), "{rollups:?}");
    assert_eq!(rollups.last_run.as_ref().map(|r| (r.outcome.as_str(), r.events_rolled_up)), Some(("ok", 3)));
    assert!(rollups.tiers.iter().all(|t| t.bytes > 0), "{rollups:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn rollup_lag_alerts_above_its_threshold() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    run_maintenance(db.url(), today_utc(&sql).await, &MaintenanceConfig::default()).await.expect("maintenance");
    rollup(db.url()).await;
    assert!(health_now(db.url(), &sql).await.is_healthy());

    sql.batch_execute("UPDATE adk_usage_state SET watermark = now() - interval '2 hours'").await.expect("fall back");
    let behind = health_now(db.url(), &sql).await;
    let lag = behind.rollups.as_ref().and_then(|r| r.lag_secs).expect("a lag");
    assert!((7200..7300).contains(&lag), "{lag}");
    assert!(behind.alerts.iter().any(|a| a.contains("rollups are 2h") && a.contains("behind")), "{:?}", behind.alerts);
    let text = behind.to_string();
    assert!(text.lines().any(|l| l.contains("rollup watermark") && l.contains("2h")), "{text}");

    // A looser threshold tolerates it.
    let loose = HealthThresholds { max_rollup_lag: HOUR * 3, ..HealthThresholds::default() };
    let tolerated = health(db.url(), today_utc(&sql).await, &loose).await.expect("health");
    assert!(tolerated.is_healthy(), "{:?}", tolerated.alerts);

    // The next run catches up and the alert clears.
    rollup(db.url()).await;
    assert!(health_now(db.url(), &sql).await.is_healthy());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_or_waiting_last_run_alerts_until_a_run_succeeds() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    run_maintenance(db.url(), today_utc(&sql).await, &MaintenanceConfig::default()).await.expect("maintenance");

    // Waiting: a writer's transaction outlives the run's wait.
    let writer = client(db.url()).await;
    writer
        .batch_execute(
            "BEGIN;
             INSERT INTO adk_sessions (app_name, user_id, session_id) VALUES ('shop', 'user', 'open');",
        )
        .await
        .expect("writer");
    writer
        .execute(
            "INSERT INTO adk_events (app_name, user_id, session_id, session_day, seq, event_id, author, event_ts, payload)
             VALUES ('shop', 'user', 'open', (now() AT TIME ZONE 'UTC')::date, 1, 'e1', 'agent',
                     (extract(epoch FROM now()) * 1000000)::bigint * 1000, '{}')",
            &[],
        )
        .await
        .expect("an event not yet committed");
    let impatient = RollupConfig { writer_wait: Duration::from_millis(200), ..RollupConfig::default() };
    let stuck = run_rollup(db.url(), &impatient).await.expect("a run that waits");
    assert!(!stuck.waiting_on.is_empty(), "{stuck:?}");
    let waiting = health_now(db.url(), &sql).await;
    assert!(
        waiting.alerts.iter().any(|a| a.contains("last rollup run could not advance") && a.contains("writers")),
        "{:?}",
        waiting.alerts
    );
    writer.batch_execute("COMMIT").await.expect("the writer commits");
    rollup(db.url()).await;
    let cleared = health_now(db.url(), &sql).await;
    assert!(cleared.is_healthy(), "{:?}", cleared.alerts);

    // Failed: a minute row the run must merge into is unreadable. Both
    // batches' events are in the same minute, well within the lateness.
    sql.batch_execute(
        "CREATE TEMPORARY TABLE fixed AS
             SELECT ((extract(epoch FROM date_trunc('minute', now()) - interval '5 minutes'))::bigint
                     * 1000000000 + 1000) AS ts;",
    )
    .await
    .expect("a fixed time");
    for session in ["a", "b"] {
        sql.execute(
            "INSERT INTO adk_sessions (app_name, user_id, session_id, last_seq) VALUES ('shop', 'user', $1, 1)",
            &[&session],
        )
        .await
        .expect("session");
        sql.execute(
            "INSERT INTO adk_events (app_name, user_id, session_id, session_day, seq, event_id, author, event_ts, payload)
             SELECT 'shop', 'user', $1, (now() AT TIME ZONE 'UTC')::date, 1, 'e', 'agent', ts, '{}' FROM fixed",
            &[&session],
        )
        .await
        .expect("event");
        if session == "a" {
            rollup(db.url()).await;
            sql.batch_execute("UPDATE adk_usage_1m SET latency_sketch = '\\x00'::bytea WHERE app_name = 'shop'")
                .await
                .expect("corrupt the minute rows");
        }
    }
    let err = run_rollup(db.url(), &RollupConfig::default()).await.expect_err("an unreadable row");
    assert!(matches!(err, RollupError::Corrupt(_) | RollupError::Sketch(_)), "{err:?}");
    let failed = health_now(db.url(), &sql).await;
    let run = failed.rollups.as_ref().and_then(|r| r.last_run.as_ref()).expect("the failed run");
    assert_eq!(run.outcome, "failed");
    assert!(
        failed.alerts.iter().any(|a| a.contains("the last rollup run failed") && a.contains("unreadable")),
        "{:?}",
        failed.alerts
    );

    // Repaired (the rows rebuilt from what the failed window holds), the
    // next run succeeds and the alert clears.
    sql.batch_execute("DELETE FROM adk_usage_1m WHERE app_name = 'shop'").await.expect("drop the bad rows");
    rollup(db.url()).await;
    let repaired = health_now(db.url(), &sql).await;
    assert!(repaired.is_healthy(), "{:?}", repaired.alerts);
}

#[tokio::test(flavor = "multi_thread")]
async fn late_rejections_of_today_alert_with_their_apps() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    let today = today_utc(&sql).await;
    run_maintenance(db.url(), today, &MaintenanceConfig::default()).await.expect("maintenance");
    // Three days old on arrival, past the 24 h lateness window.
    store_events(&sql, "shop", "s1", 4, 3.0 * 86_400.0).await;
    store_events(&sql, "blog", "s2", 1, 3.0 * 86_400.0).await;
    store_events(&sql, "shop", "s3", 2, 1.0).await;
    let report = rollup(db.url()).await;
    assert_eq!((report.late_rejected, report.events_rolled_up), (5, 2), "{report:?}");

    let late = health_now(db.url(), &sql).await;
    let rollups = late.rollups.as_ref().expect("rollups");
    assert_eq!((rollups.late_rejected_today, rollups.late_rejected_yesterday), (5, 0));
    let apps: Vec<(&str, i64)> = rollups.late_apps_today.iter().map(|a| (a.app.as_str(), a.rejected)).collect();
    assert_eq!(apps, vec![("shop", 4), ("blog", 1)]);
    let alerts = rollup_alerts(&late);
    assert_eq!(alerts.len(), 1, "{alerts:?}");
    assert!(alerts[0].contains("5 event(s) arriving on") && alerts[0].contains("shop (4), blog (1)"), "{alerts:?}");

    // A tolerance set by the operator.
    let tolerant = HealthThresholds { max_late_rejected_today: 5, ..HealthThresholds::default() };
    assert!(health(db.url(), today, &tolerant).await.expect("health").is_healthy());
    // Judged as of tomorrow, today's rejections are yesterday's: shown, not alerted.
    let tomorrow = today.checked_add_days(Days::new(1)).expect("tomorrow");
    let next_day = health(db.url(), tomorrow, &HealthThresholds::default()).await.expect("health");
    let rollups = next_day.rollups.as_ref().expect("rollups");
    assert_eq!((rollups.late_rejected_today, rollups.late_rejected_yesterday), (0, 5));
    assert!(rollup_alerts(&next_day).is_empty(), "{:?}", next_day.alerts);
}
