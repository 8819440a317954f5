//! Converting a live unpartitioned event log (tests/fixtures/legacy_layout.sql)
//! into the partitioned layout: no rewrite, same rows, both uniqueness
//! guarantees, new sessions in daily partitions, resumable after an
//! interruption at any step, and a dry run that shows the exact SQL.

use std::sync::Arc;
use std::time::{Duration, Instant};

use adk_postgres_domain::{AppName, AppendOptions, Event, GetOptions, SessionId, SessionKey, SessionStore, UserId};
use adk_postgres_retention::convert::CONVERT_LOCK_KEY;
use adk_postgres_retention::partitions::partition_name;
use adk_postgres_retention::{
    ConvertOptions, ConvertProgress, LockPolicy, RetentionError, StepKind, conversion_plan, convert_events,
    convert_events_with, plan_conversion,
};
use adk_postgres_schema::migrations::pending_migrations;
use adk_postgres_testing::{TestDatabase, empty_database, test_database};
use adk_postgres_tests::pg::{client, client_with_notices, lock_waiter, new_session, store};
use chrono::{NaiveDate, Utc};
use tokio_postgres::Client;

const LEGACY_LAYOUT: &str = include_str!("../../fixtures/legacy_layout.sql");

/// Sessions spread over 100 users; every event payload is a valid ADK event
/// so the store can read legacy sessions back.
const SEED: &str = "
INSERT INTO adk_sessions (app_name, user_id, session_id, state, last_seq)
SELECT 'app', 'user-' || (s % 100), 'session-' || s, jsonb_build_object('n', s), $2::bigint
FROM generate_series(1, $1::bigint) s;
INSERT INTO adk_events (app_name, user_id, session_id, seq, event_id, invocation_id, author, event_ts, payload)
SELECT 'app', 'user-' || (s % 100), 'session-' || s, n, 'event-' || s || '-' || n, 'inv-' || s,
       CASE WHEN n % 2 = 0 THEN 'agent' ELSE 'user' END, 1767225600000000000 + n * 1000000000,
       jsonb_build_object('id', 'event-' || s || '-' || n, 'invocation_id', 'inv-' || s,
                          'author', CASE WHEN n % 2 = 0 THEN 'agent' ELSE 'user' END,
                          'timestamp', to_char(timestamp '2026-01-01' + make_interval(secs => n),
                                               'YYYY-MM-DD\"T\"HH24:MI:SS\".000000000Z\"'),
                          'content', jsonb_build_object('text', md5(s::text || '/' || n::text)))
FROM generate_series(1, $1::bigint) s, generate_series(1, $2::bigint) n;";

fn utc_today() -> NaiveDate {
    Utc::now().date_naive()
}

fn policy() -> LockPolicy {
    LockPolicy::default()
}

/// An empty database holding the legacy layout with `sessions` sessions of
/// `per_session` events each.
async fn legacy_database(sessions: i64, per_session: i64) -> TestDatabase {
    let db = empty_database().await;
    let sql = client(db.url()).await;
    sql.batch_execute(LEGACY_LAYOUT).await.expect("legacy layout");
    for statement in SEED.split(';').map(str::trim).filter(|s| !s.is_empty()) {
        sql.execute(statement, &[&sessions, &per_session]).await.expect("seed");
    }
    sql.batch_execute("ANALYZE").await.expect("analyze");
    db
}

/// Row count and a checksum over (session_id, seq, payload).
async fn fingerprint(sql: &Client) -> (i64, String) {
    let row = sql
        .query_one(
            "SELECT count(*), md5(string_agg(session_id || ':' || seq || ':' || payload::text, ',' ORDER BY session_id, seq))
             FROM adk_events",
            &[],
        )
        .await
        .expect("fingerprint");
    (row.get(0), row.get(1))
}

async fn filenode(sql: &Client, relation: &str) -> u32 {
    sql.query_one("SELECT pg_relation_filenode($1::text::regclass)", &[&relation]).await.expect("filenode").get(0)
}

/// Everything about the schema a conversion decides: tables, columns with
/// defaults, constraints with validity and parents, indexes with validity and
/// parents, partition bounds, functions and recorded migrations.
async fn catalog_summary(sql: &Client) -> Vec<String> {
    let migrations = if sql
        .query_one("SELECT to_regclass('__diesel_schema_migrations') IS NOT NULL", &[])
        .await
        .expect("migrations table")
        .get::<_, bool>(0)
    {
        "UNION ALL SELECT 'migration ' || version FROM __diesel_schema_migrations"
    } else {
        ""
    };
    let query = format!(
        "SELECT 'table ' || c.relname || ' kind=' || c.relkind::text
         FROM pg_class c WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p')
         UNION ALL
         SELECT 'column ' || c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
                || ' not_null=' || a.attnotnull || ' default=' || coalesce(pg_get_expr(d.adbin, d.adrelid), '-')
         FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
         LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
         WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p') AND a.attnum > 0
           AND NOT a.attisdropped
         UNION ALL
         SELECT 'constraint ' || c.conrelid::regclass || ' ' || c.conname || ' ' || pg_get_constraintdef(c.oid)
                || ' validated=' || c.convalidated
                || ' parent=' || coalesce((SELECT p.conname::text FROM pg_constraint p WHERE p.oid = c.conparentid), '-')
         FROM pg_constraint c WHERE c.connamespace = 'public'::regnamespace
         UNION ALL
         SELECT 'index ' || pg_get_indexdef(x.indexrelid) || ' valid=' || x.indisvalid
                || ' parent=' || coalesce((SELECT h.inhparent::regclass::text FROM pg_inherits h
                                           WHERE h.inhrelid = x.indexrelid), '-')
         FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid WHERE i.relnamespace = 'public'::regnamespace
         UNION ALL
         SELECT 'partition ' || h.inhrelid::regclass || ' ' || pg_get_expr(c.relpartbound, c.oid)
         FROM pg_inherits h JOIN pg_class c ON c.oid = h.inhrelid
         WHERE h.inhparent = to_regclass('adk_events')
         UNION ALL
         SELECT 'function ' || p.oid::regprocedure FROM pg_proc p WHERE p.pronamespace = 'public'::regnamespace
         {migrations}
         ORDER BY 1"
    );
    sql.query(&query, &[]).await.expect("catalog summary").iter().map(|r| r.get(0)).collect()
}

fn key(user: &str, session: &str) -> SessionKey {
    SessionKey::new(AppName::new("app").unwrap(), UserId::new(user).unwrap(), SessionId::new(session).unwrap())
}

async fn table_of_event(sql: &Client, session_id: &str, seq: i64) -> String {
    sql.query_one(
        "SELECT tableoid::regclass::text FROM adk_events WHERE session_id = $1 AND seq = $2",
        &[&session_id, &seq],
    )
    .await
    .expect("event row")
    .get(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn converts_a_live_table_without_rewriting_it() {
    let setup = Instant::now();
    let db = legacy_database(2_000, 50).await;
    let setup = setup.elapsed();
    let sql = client(db.url()).await;
    let cutover = utc_today();
    let legacy_day = cutover.pred_opt().expect("a day before").to_string();

    let events_node = filenode(&sql, "adk_events").await;
    let sessions_node = filenode(&sql, "adk_sessions").await;
    let (rows_before, checksum_before) = fingerprint(&sql).await;
    assert_eq!(rows_before, 100_000);

    let planned = plan_conversion(db.url(), cutover).await.expect("plan");
    let mut progress = Vec::new();
    let started = Instant::now();
    let report = convert_events(db.url(), cutover, &policy(), &mut |p| progress.push(p)).await.expect("convert");
    let took = started.elapsed();
    let timings: Vec<String> = report.steps.iter().map(|s| format!("{:?}={}ms", s.kind, s.elapsed_ms)).collect();
    eprintln!(
        "seeded 100,000 events in {setup:?}; converted in {took:?}; swap held its locks {:?} ms; {}",
        report.swap_lock_ms,
        timings.join(" ")
    );

    assert!(!report.already_converted && !report.stopped_early, "{report:?}");
    assert_eq!(
        report.steps.iter().map(|s| s.kind).collect::<Vec<_>>(),
        planned.iter().map(|s| s.kind).collect::<Vec<_>>(),
        "the run did what the plan said"
    );
    assert_eq!(report.steps.len(), StepKind::ALL.len());
    for step in &report.steps {
        let started =
            progress.iter().any(|p| matches!(p, ConvertProgress::StepStarted { kind, .. } if *kind == step.kind));
        let finished =
            progress.iter().any(|p| matches!(p, ConvertProgress::StepFinished { kind, .. } if *kind == step.kind));
        assert!(started && finished, "progress for {:?}", step.kind);
    }
    assert!(report.swap_lock_ms.is_some());
    // Every migration after 000001 (which the conversion itself stands for).
    let applied = &report.migrations_applied;
    assert_eq!(applied.first().map(String::as_str), Some("20261101000002"), "{applied:?}");
    assert!(applied.windows(2).all(|w| w[0] < w[1]) && !applied.contains(&"20261101000001".to_owned()));

    // No rewrite: the legacy partition is the old table's file; same rows.
    assert_eq!(filenode(&sql, "adk_events_legacy").await, events_node, "adk_events was rewritten");
    assert_eq!(filenode(&sql, "adk_sessions").await, sessions_node, "adk_sessions was rewritten");
    assert_eq!(fingerprint(&sql).await, (rows_before, checksum_before));

    // Partitioned by session_day, a legacy partition up to the cutover and
    // the cutover day's partition, no default partition.
    let bounds: Vec<(String, String)> = sql
        .query(
            "SELECT c.relname::text, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits h
             JOIN pg_class c ON c.oid = h.inhrelid WHERE h.inhparent = 'adk_events'::regclass ORDER BY 1",
            &[],
        )
        .await
        .expect("partitions")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let next = cutover.succ_opt().expect("next day");
    assert_eq!(
        bounds,
        vec![
            ("adk_events_legacy".to_owned(), format!("FOR VALUES FROM (MINVALUE) TO ('{cutover}')")),
            (partition_name(cutover), format!("FOR VALUES FROM ('{cutover}') TO ('{next}')")),
        ]
    );
    let (strategy, default_partition): (String, u32) = sql
        .query_one(
            "SELECT p.partstrat::text || ':' || a.attname::text, p.partdefid::oid FROM pg_partitioned_table p
             JOIN pg_attribute a ON a.attrelid = p.partrelid AND a.attnum = p.partattrs[0]
             WHERE p.partrelid = 'adk_events'::regclass",
            &[],
        )
        .await
        .map(|r| (r.get(0), r.get(1)))
        .expect("partitioned");
    assert_eq!((strategy.as_str(), default_partition), ("r:session_day", 0));

    // The parent and the sessions table are what a fresh install has.
    let fresh = test_database().await;
    let fresh_sql = client(fresh.url()).await;
    let definition = "SELECT c.conrelid::regclass || ' ' || c.conname || ' ' || pg_get_constraintdef(c.oid)
                      FROM pg_constraint c WHERE c.conrelid IN ('adk_events'::regclass, 'adk_sessions'::regclass)
                      UNION ALL
                      SELECT pg_get_indexdef(x.indexrelid) || ' valid=' || x.indisvalid FROM pg_index x
                      WHERE x.indrelid IN ('adk_events'::regclass, 'adk_sessions'::regclass)
                      UNION ALL
                      SELECT 'default ' || pg_get_expr(d.adbin, d.adrelid) FROM pg_attrdef d
                      JOIN pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum
                      WHERE d.adrelid = 'adk_sessions'::regclass AND a.attname = 'session_day'
                      ORDER BY 1";
    let rows = |rows: Vec<tokio_postgres::Row>| rows.iter().map(|r| r.get::<_, String>(0)).collect::<Vec<_>>();
    assert_eq!(
        rows(sql.query(definition, &[]).await.expect("converted definition")),
        rows(fresh_sql.query(definition, &[]).await.expect("fresh definition"))
    );

    // Both uniqueness guarantees hold on the legacy day.
    let insert =
        "INSERT INTO adk_events (app_name, user_id, session_id, session_day, seq, event_id, author, event_ts, payload)
                  VALUES ('app', 'user-1', 'session-1', $1::text::date, $2, $3, 'user', 1, '{}')";
    for (seq, event_id, constraint) in
        [(1_i64, "brand-new", "adk_events_legacy_pkey"), (51, "event-1-1", "adk_events_legacy_event_id_key")]
    {
        let err = sql.execute(insert, &[&legacy_day, &seq, &event_id]).await.expect_err("a duplicate");
        let db_err = err.as_db_error().expect("database error");
        assert_eq!(db_err.code(), &tokio_postgres::error::SqlState::UNIQUE_VIOLATION, "{db_err}");
        assert_eq!(db_err.constraint(), Some(constraint), "{db_err}");
    }

    // Through the real store: a new session lands in today's partition, an
    // old one keeps appending into the legacy partition and reads back.
    let store = store(db.url()).await;
    let fresh_key = new_session(&store, "app", "new-user").await;
    let day: String = sql
        .query_one(
            "SELECT session_day::text FROM adk_sessions WHERE session_id = $1",
            &[&fresh_key.session_id.as_str()],
        )
        .await
        .expect("new session")
        .get(0);
    assert_eq!(day, cutover.to_string());
    let appended = store.append(&fresh_key, Event::new("user"), AppendOptions::default()).await.expect("append new");
    assert_eq!(appended.seq, Some(1));
    assert_eq!(table_of_event(&sql, fresh_key.session_id.as_str(), 1).await, partition_name(cutover));

    let old_key = key("user-1", "session-1");
    let appended = store.append(&old_key, Event::new("agent"), AppendOptions::default()).await.expect("append old");
    assert_eq!(appended.seq, Some(51));
    assert_eq!(table_of_event(&sql, "session-1", 51).await, "adk_events_legacy");
    let session =
        store.get(&old_key, GetOptions { num_recent_events: Some(3), after: None }).await.expect("get an old session");
    assert_eq!(session.version, 51);
    assert_eq!(session.events.len(), 3);
    assert_eq!(session.events[0].id, "event-1-49");
    assert_eq!(session.events[2].id, appended.event.id);

    // Deleting an old session still cascades into the legacy partition.
    store.delete(&key("user-2", "session-2")).await.expect("delete");
    let left: i64 = sql
        .query_one("SELECT count(*) FROM adk_events WHERE session_id = 'session-2'", &[])
        .await
        .expect("count")
        .get(0);
    assert_eq!(left, 0);

    // Diesel sees a fully migrated database.
    assert_eq!(pending_migrations(db.url()).await.expect("pending"), Vec::<String>::new());

    // Idempotent: nothing left, and a second run does nothing.
    let before = catalog_summary(&sql).await;
    assert!(plan_conversion(db.url(), cutover).await.expect("plan again").is_empty());
    let again = convert_events(db.url(), cutover, &policy(), &mut |_| {}).await.expect("convert again");
    assert!(again.already_converted && again.steps.is_empty(), "{again:?}");
    assert_eq!(catalog_summary(&sql).await, before);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_swap_neither_scans_nor_builds_under_its_lock() {
    let db = legacy_database(200, 10).await;
    let cutover = utc_today();
    let before_swap = StepKind::Swap.number() - 1;
    let report = convert_events_with(
        db.url(),
        cutover,
        &policy(),
        &ConvertOptions { stop_after: Some(before_swap) },
        &mut |_| {},
    )
    .await
    .expect("steps before the swap");
    assert!(report.stopped_early);
    let plan = plan_conversion(db.url(), cutover).await.expect("plan");
    assert_eq!(plan[0].kind, StepKind::Swap);

    // Run the swap exactly as the plan prints it, with the server telling
    // what the attach decided.
    let (sql, notices) = client_with_notices(db.url()).await;
    sql.batch_execute("SET client_min_messages = debug1").await.expect("debug");
    sql.batch_execute(&plan[0].sql[0]).await.expect("the swap");
    sql.batch_execute("RESET client_min_messages").await.expect("reset");
    let notices = notices.lock().expect("notices").clone();
    assert!(
        notices
            .iter()
            .any(|n| n == "partition constraint for table \"adk_events_legacy\" is implied by existing constraints"),
        "the attach scanned the legacy table: {notices:#?}"
    );
    assert!(
        !notices.iter().any(|n| n.starts_with("building index") && n.contains("\"adk_events_legacy\"")),
        "the attach built an index on the legacy table: {notices:#?}"
    );

    // The rest of the conversion carries on from there.
    let rest = convert_events(db.url(), cutover, &policy(), &mut |_| {}).await.expect("finish");
    assert_eq!(
        rest.steps.iter().map(|s| s.kind).collect::<Vec<_>>(),
        vec![StepKind::SessionsDefault, StepKind::RecordBaseline, StepKind::ApplyMigrations]
    );
    assert_eq!(fingerprint(&sql).await.0, 2_000);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_plan_shows_every_step_and_changes_nothing() {
    let db = legacy_database(20, 5).await;
    let sql = client(db.url()).await;
    let cutover = utc_today();
    let before = catalog_summary(&sql).await;
    let plan = plan_conversion(db.url(), cutover).await.expect("plan");
    assert_eq!(plan.iter().map(|s| s.kind).collect::<Vec<_>>(), StepKind::ALL.to_vec());
    let text = plan.iter().flat_map(|s| s.sql.iter().cloned()).collect::<Vec<_>>().join(";\n");
    assert!(text.contains("CREATE UNIQUE INDEX CONCURRENTLY \"adk_events_legacy_pkey\""), "{text}");
    assert!(text.contains("NOT VALID") && text.contains("VALIDATE CONSTRAINT"), "{text}");
    assert!(text.contains(&format!("FOR VALUES FROM (MINVALUE) TO ('{cutover}')")), "{text}");
    let printed = conversion_plan(db.url(), cutover).await.expect("printable plan").to_string();
    eprintln!("{printed}");
    assert!(printed.contains("-- step 9 (guide step 4): swap in the partitioned parent"), "{printed}");
    assert_eq!(catalog_summary(&sql).await, before, "planning changed the database");

    convert_events(db.url(), cutover, &policy(), &mut |_| {}).await.expect("convert");
    assert!(plan_conversion(db.url(), cutover).await.expect("plan").is_empty());

    // A database migrated from scratch has nothing to convert either.
    let migrated = test_database().await;
    assert!(plan_conversion(migrated.url(), cutover).await.expect("plan").is_empty());
    let report = convert_events(migrated.url(), cutover, &policy(), &mut |_| {}).await.expect("convert");
    assert!(report.already_converted);
}

/// Leaves the next step half-done the way a crash would: an INVALID index
/// for an index build (a killed build, or one that failed its uniqueness
/// check), a NOT VALID constraint for a validation, an empty migrations
/// table for the bookkeeping. Returns what it planted.
async fn plant_half_done(db: &TestDatabase, next: StepKind, cutover: NaiveDate) -> Option<&'static str> {
    let sql = client(db.url()).await;
    // Fails on duplicates (every row has the same legacy day) after creating
    // the catalog entry: the index stays behind, INVALID.
    let failed_unique =
        |name: &str, table: &str| format!("CREATE UNIQUE INDEX CONCURRENTLY {name} ON {table} (session_day)");
    let (planted, statement) = match next {
        StepKind::SessionsKeyDayIndex => {
            ("adk_sessions_key_day", failed_unique("adk_sessions_key_day", "adk_sessions"))
        }
        StepKind::SessionsDayIndex => {
            kill_a_concurrent_build(db, "CREATE INDEX CONCURRENTLY adk_sessions_day ON adk_sessions (session_day)")
                .await;
            return Some("adk_sessions_day");
        }
        StepKind::EventsKeyIndex => ("adk_events_legacy_pkey", failed_unique("adk_events_legacy_pkey", "adk_events")),
        StepKind::EventsEventIdIndex => {
            ("adk_events_legacy_event_id_key", failed_unique("adk_events_legacy_event_id_key", "adk_events"))
        }
        StepKind::EventsChecks => {
            sql.batch_execute(&format!(
                "ALTER TABLE adk_events ADD CONSTRAINT adk_events_legacy_range CHECK (session_day < '{cutover}'::date) NOT VALID"
            ))
            .await
            .expect("plant a NOT VALID check");
            return Some("adk_events_legacy_range");
        }
        StepKind::EventsForeignKey => {
            sql.batch_execute(
                "ALTER TABLE adk_events ADD CONSTRAINT adk_events_legacy_session_fkey
                 FOREIGN KEY (app_name, user_id, session_id, session_day)
                 REFERENCES adk_sessions (app_name, user_id, session_id, session_day) ON DELETE CASCADE NOT VALID",
            )
            .await
            .expect("plant a NOT VALID foreign key");
            return Some("adk_events_legacy_session_fkey");
        }
        StepKind::RecordBaseline => {
            sql.batch_execute(
                "CREATE TABLE __diesel_schema_migrations (version VARCHAR(50) PRIMARY KEY NOT NULL,
                 run_on TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP)",
            )
            .await
            .expect("plant an empty migrations table");
            return Some("__diesel_schema_migrations");
        }
        _ => return None,
    };
    sql.batch_execute(&statement).await.expect_err("the planted build fails");
    let valid: bool = sql
        .query_one("SELECT indisvalid FROM pg_index WHERE indexrelid = $1::text::regclass", &[&planted])
        .await
        .expect("the failed build left its index")
        .get(0);
    assert!(!valid);
    Some(planted)
}

/// Starts `create` (a CREATE INDEX CONCURRENTLY on adk_sessions), lets it
/// get stuck behind an open writer after it has created its catalog entry,
/// and terminates its backend: what a killed build leaves.
async fn kill_a_concurrent_build(db: &TestDatabase, create: &str) {
    let writer = client(db.url()).await;
    writer
        .batch_execute("BEGIN; UPDATE adk_sessions SET last_seq = last_seq WHERE session_id = 'session-1'")
        .await
        .expect("open writer");
    let builder = client(db.url()).await;
    let builder_pid: i32 = builder.query_one("SELECT pg_backend_pid()", &[]).await.expect("pid").get(0);
    let create = create.to_owned();
    let build = tokio::spawn(async move { builder.batch_execute(&create).await });
    let watcher = client(db.url()).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let phase: Option<String> = watcher
            .query_opt("SELECT phase FROM pg_stat_progress_create_index WHERE pid = $1", &[&builder_pid])
            .await
            .expect("progress")
            .map(|r| r.get(0));
        if phase.as_deref().is_some_and(|p| p.starts_with("waiting for writers")) {
            break;
        }
        assert!(Instant::now() < deadline, "the build never waited for the writer: {phase:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let terminated: bool =
        watcher.query_one("SELECT pg_terminate_backend($1)", &[&builder_pid]).await.expect("terminate").get(0);
    assert!(terminated);
    assert!(build.await.expect("join").is_err(), "the build was killed");
    writer.batch_execute("ROLLBACK").await.expect("close writer");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_interrupted_conversion_resumes_from_any_step() {
    let started = Instant::now();
    let cutover = utc_today();
    let reference = {
        let db = legacy_database(40, 50).await;
        convert_events(db.url(), cutover, &policy(), &mut |_| {}).await.expect("uninterrupted");
        catalog_summary(&client(db.url()).await).await
    };
    let steps = StepKind::ALL.len();
    for k in 1..=steps {
        let db = legacy_database(40, 50).await;
        let first =
            convert_events_with(db.url(), cutover, &policy(), &ConvertOptions { stop_after: Some(k) }, &mut |_| {})
                .await
                .unwrap_or_else(|e| panic!("first part, stop after {k}: {e}"));
        assert_eq!(first.steps.len(), k);
        assert_eq!(first.stopped_early, k < steps, "stop after {k}");

        let next = plan_conversion(db.url(), cutover).await.expect("plan").first().map(|s| s.kind);
        let planted = match next {
            Some(kind) => plant_half_done(&db, kind, cutover).await,
            None => None,
        };
        let rest = convert_events(db.url(), cutover, &policy(), &mut |_| {})
            .await
            .unwrap_or_else(|e| panic!("resume after {k} (next {next:?}, planted {planted:?}): {e}"));
        assert_eq!(first.steps.len() + rest.steps.len(), steps, "after {k}: {rest:?}");
        if let Some(index) = planted.filter(|p| p.starts_with("adk_") && !p.ends_with("range") && !p.ends_with("fkey"))
        {
            assert_eq!(rest.dropped_invalid_indexes, vec![index.to_owned()], "after {k}");
        }
        let sql = client(db.url()).await;
        assert_eq!(catalog_summary(&sql).await, reference, "stopped after {k}, next {next:?}, planted {planted:?}");
        assert_eq!(fingerprint(&sql).await.0, 2_000);
    }
    eprintln!("{steps} interrupted conversions checked in {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread")]
async fn refuses_what_it_does_not_recognise_and_changes_nothing() {
    let db = legacy_database(10, 3).await;
    let sql = client(db.url()).await;
    sql.batch_execute("ALTER TABLE adk_events ADD COLUMN tenant text").await.expect("extra column");
    let before = catalog_summary(&sql).await;
    let err = convert_events(db.url(), utc_today(), &policy(), &mut |_| {}).await.expect_err("refused");
    assert!(matches!(&err, RetentionError::Conflict(m) if m.contains("tenant")), "{err}");
    assert!(plan_conversion(db.url(), utc_today()).await.is_err());
    assert_eq!(catalog_summary(&sql).await, before);

    let empty = empty_database().await;
    let err = convert_events(empty.url(), utc_today(), &policy(), &mut |_| {}).await.expect_err("no tables");
    assert!(matches!(err, RetentionError::NotMigrated(_)), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_resumed_run_must_keep_the_cutover() {
    let db = legacy_database(10, 3).await;
    let cutover = utc_today();
    let through_checks = StepKind::EventsChecks.number();
    convert_events_with(
        db.url(),
        cutover,
        &policy(),
        &ConvertOptions { stop_after: Some(through_checks) },
        &mut |_| {},
    )
    .await
    .expect("first part");
    let later = cutover.succ_opt().expect("tomorrow");
    let err = convert_events(db.url(), later, &policy(), &mut |_| {}).await.expect_err("another cutover");
    assert!(matches!(&err, RetentionError::Conflict(m) if m.contains("cutover")), "{err}");
    convert_events(db.url(), cutover, &policy(), &mut |_| {}).await.expect("the same cutover finishes");
}

#[tokio::test(flavor = "multi_thread")]
async fn two_conversions_do_not_run_at_once() {
    let db = legacy_database(10, 3).await;
    let holder = client(db.url()).await;
    holder.execute("SELECT pg_advisory_lock($1)", &[&CONVERT_LOCK_KEY]).await.expect("hold the lock");
    let err = convert_events(db.url(), utc_today(), &policy(), &mut |_| {}).await.expect_err("busy");
    assert!(matches!(&err, RetentionError::Conflict(m) if m.contains("another conversion")), "{err}");
    holder.execute("SELECT pg_advisory_unlock($1)", &[&CONVERT_LOCK_KEY]).await.expect("release");
    convert_events(db.url(), utc_today(), &policy(), &mut |_| {}).await.expect("now it runs");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_owner_and_grants_of_the_old_table_carry_over() {
    let db = legacy_database(10, 3).await;
    let sql = client(db.url()).await;
    // Roles are cluster-wide; name them after this test's database.
    let (owner, reader) = (format!("{}_owner", db.name()), format!("{}_reader", db.name()));
    sql.batch_execute(&format!(
        "CREATE ROLE \"{owner}\"; CREATE ROLE \"{reader}\";
         ALTER TABLE adk_events OWNER TO \"{owner}\";
         GRANT SELECT, INSERT ON adk_events TO \"{reader}\";
         GRANT SELECT ON adk_events TO PUBLIC;"
    ))
    .await
    .expect("roles");
    let cutover = utc_today();
    convert_events(db.url(), cutover, &policy(), &mut |_| {}).await.expect("convert");

    for table in ["adk_events".to_owned(), partition_name(cutover)] {
        let table_owner: String = sql
            .query_one("SELECT pg_get_userbyid(relowner)::text FROM pg_class WHERE oid = $1::text::regclass", &[&table])
            .await
            .expect("owner")
            .get(0);
        assert_eq!(table_owner, owner, "{table}");
    }
    let privileges: Vec<bool> = sql
        .query_one(
            "SELECT has_table_privilege($1, 'adk_events', 'SELECT'), has_table_privilege($1, 'adk_events', 'INSERT'),
                    has_table_privilege($1, 'adk_events', 'DELETE'), has_table_privilege('public', 'adk_events', 'SELECT')",
            &[&reader],
        )
        .await
        .map(|r| (0..4).map(|i| r.get(i)).collect())
        .expect("privileges");
    assert_eq!(privileges, vec![true, true, false, true]);
    // Like every other partition, the legacy one is reached only through
    // the parent (and whatever row-level security the parent has).
    let direct: Vec<bool> = sql
        .query_one(
            "SELECT has_table_privilege($1, 'adk_events_legacy', 'SELECT'),
                    has_table_privilege('public', 'adk_events_legacy', 'SELECT')",
            &[&reader],
        )
        .await
        .map(|r| (0..2).map(|i| r.get(i)).collect())
        .expect("legacy privileges");
    assert_eq!(direct, vec![false, false]);

    sql.batch_execute(&format!(
        "DROP OWNED BY \"{owner}\", \"{reader}\" CASCADE; DROP ROLE \"{owner}\"; DROP ROLE \"{reader}\";"
    ))
    .await
    .expect("drop roles");
}

/// A failed statement by its SQLSTATE and message: tokio-postgres'
/// Display says only "db error".
fn described(error: &tokio_postgres::Error) -> String {
    match error.as_db_error() {
        Some(db) => format!("{} {}: {}", db.code().code(), db.severity(), db.message()),
        None => format!("{error:?}"),
    }
}

/// Concurrent legacy writers in `appends_continue_through_the_conversion`.
const WRITERS: usize = 4;

/// What the legacy application does once step 2 is deployed: lock the
/// session row, take the next seq and bind the session's day into the
/// insert, in one statement.
const LEGACY_APPEND: &str = "
WITH s AS (
    SELECT app_name, user_id, session_id, session_day, last_seq FROM adk_sessions
    WHERE app_name = 'app' AND user_id = $1 AND session_id = $2 FOR NO KEY UPDATE
), ins AS (
    INSERT INTO adk_events (app_name, user_id, session_id, session_day, seq, event_id, author, event_ts, payload)
    SELECT app_name, user_id, session_id, session_day, last_seq + 1, 'live-' || (last_seq + 1), 'user', 1, '{}'
    FROM s RETURNING seq
)
UPDATE adk_sessions a SET last_seq = (SELECT seq FROM ins)
WHERE a.app_name = 'app' AND a.user_id = $1 AND a.session_id = $2";

#[tokio::test(flavor = "multi_thread")]
async fn appends_continue_through_the_conversion() {
    let db = legacy_database(40, 50).await;
    let cutover = utc_today();
    // Step 1, then the application that binds session_day goes live.
    convert_events_with(db.url(), cutover, &policy(), &ConvertOptions { stop_after: Some(1) }, &mut |_| {})
        .await
        .expect("step 1");
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Several writers, so that some statement is always between its lock
    // on adk_sessions and its lock on adk_events when a step takes its
    // locks: a step locking in the other order deadlocks with it.
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let (url, stop) = (db.url().to_owned(), Arc::clone(&stop));
            tokio::spawn(async move {
                let sql = client(&url).await;
                let (mut ok, mut failures) = (0_i64, Vec::new());
                let mut s = w;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    // Each writer keeps to its own sessions: the test is
                    // about the conversion's locks, not the writers' own.
                    s = (s + WRITERS) % 40;
                    let (user, session) = (format!("user-{}", (s + 1) % 100), format!("session-{}", s + 1));
                    match sql.execute(LEGACY_APPEND, &[&user, &session]).await {
                        Ok(1) => ok += 1,
                        Ok(n) => failures.push(format!("{n} rows")),
                        Err(e) => failures.push(described(&e)),
                    }
                }
                (ok, failures)
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let report = convert_events(db.url(), cutover, &policy(), &mut |_| {}).await.expect("the rest, under load");
    tokio::time::sleep(Duration::from_millis(100)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (mut ok, mut failures) = (0_i64, Vec::new());
    for writer in writers {
        let (done, failed) = writer.await.expect("writer");
        ok += done;
        failures.extend(failed);
    }
    eprintln!("{ok} appends ran during the conversion; the swap held its locks {:?} ms", report.swap_lock_ms);
    assert!(failures.is_empty(), "appends failed during the conversion: {failures:?}");
    assert!(ok > 0);
    let sql = client(db.url()).await;
    assert_eq!(fingerprint(&sql).await.0, 2_000 + ok);
    let gaps: i64 = sql
        .query_one(
            "SELECT count(*) FROM adk_sessions s
             WHERE s.last_seq <> (SELECT count(*) FROM adk_events e
                                  WHERE (e.app_name, e.user_id, e.session_id) = (s.app_name, s.user_id, s.session_id))",
            &[],
        )
        .await
        .expect("gaps")
        .get(0);
    assert_eq!(gaps, 0, "every session's events are gapless");
    let elsewhere: i64 = sql
        .query_one("SELECT count(*) FROM adk_events WHERE tableoid <> 'adk_events_legacy'::regclass", &[])
        .await
        .expect("partition")
        .get(0);
    assert_eq!(elsewhere, 0, "old sessions keep writing into the legacy partition");
}

const WRITER_SESSION: &str = "app_name = 'app' AND user_id = 'user-1' AND session_id = 'session-1'";

/// Appends lock adk_sessions, then adk_events. Adding the foreign key on
/// its own locks them the other way round; the step must not, or a writer
/// caught between its two locks deadlocks with it. A writer runs `before`
/// in a transaction, the step starts and waits for it, then the writer runs
/// `after` and commits: both must go through. The writer checks for a
/// deadlock long before the step would, so a deadlock fails the writer
/// (as it failed live appends), not the step, which would retry.
async fn key_step_beside_a_writer(before: &[String], after: &[String]) {
    let db = legacy_database(4, 5).await;
    let cutover = utc_today();
    let before_key = ConvertOptions { stop_after: Some(StepKind::EventsChecks.number()) };
    convert_events_with(db.url(), cutover, &policy(), &before_key, &mut |_| {}).await.expect("up to the key");
    let planned = plan_conversion(db.url(), cutover).await.expect("plan");
    assert_eq!(planned.first().map(|s| s.kind), Some(StepKind::EventsForeignKey));
    let observer = client(db.url()).await;
    observer
        .batch_execute(&format!("ALTER DATABASE \"{}\" SET deadlock_timeout = '1min'", db.name()))
        .await
        .expect("slow deadlock checks for the conversion");

    let mut writer = client(db.url()).await;
    writer.batch_execute("SET deadlock_timeout = '50ms'").await.expect("quick deadlock checks for the writer");
    let append = writer.transaction().await.expect("begin");
    for statement in before {
        append.batch_execute(statement).await.expect(statement);
    }
    // The conversion's futures are not Send: run the step and the writer
    // side by side on this task.
    let (only_the_key, lock_policy, mut quiet) = (ConvertOptions { stop_after: Some(1) }, policy(), |_| {});
    let key_step = convert_events_with(db.url(), cutover, &lock_policy, &only_the_key, &mut quiet);
    let writer_side = async {
        lock_waiter(&observer, "query LIKE '%FOREIGN KEY%'").await;
        for statement in after {
            if let Err(e) = append.batch_execute(statement).await {
                panic!("{statement}: {}", described(&e));
            }
        }
        append.commit().await.expect("commit");
    };
    let (stepped, ()) = tokio::join!(key_step, writer_side);
    stepped.expect("key step");
    convert_events(db.url(), cutover, &policy(), &mut |_| {}).await.expect("the rest");
    assert_eq!(fingerprint(&observer).await.0, 4 * 5 + 1);
}

fn insert_next_event(seq: &str) -> String {
    format!(
        "INSERT INTO adk_events (app_name, user_id, session_id, session_day, seq, event_id, author, event_ts, payload)
         SELECT app_name, user_id, session_id, session_day, {seq}, 'held-' || {seq}, 'user', 1, '{{}}'
         FROM adk_sessions WHERE {WRITER_SESSION}"
    )
}

/// A statement planned afresh (or a script) takes ROW EXCLUSIVE on
/// adk_sessions before touching adk_events.
#[tokio::test(flavor = "multi_thread")]
async fn the_key_step_cannot_deadlock_a_writer_holding_the_session_row_updated() {
    key_step_beside_a_writer(
        &[format!("UPDATE adk_sessions SET last_seq = last_seq + 1 WHERE {WRITER_SESSION}")],
        &[insert_next_event("last_seq")],
    )
    .await;
}

/// The same append parsed: its `FOR NO KEY UPDATE` read takes only ROW
/// SHARE on adk_sessions, then adk_events, then ROW EXCLUSIVE on
/// adk_sessions for its update.
#[tokio::test(flavor = "multi_thread")]
async fn the_key_step_cannot_deadlock_a_writer_holding_the_session_row_for_update() {
    key_step_beside_a_writer(
        &[
            format!("SELECT 1 FROM adk_sessions WHERE {WRITER_SESSION} FOR NO KEY UPDATE"),
            insert_next_event("last_seq + 1"),
        ],
        &[format!("UPDATE adk_sessions SET last_seq = last_seq + 1 WHERE {WRITER_SESSION}")],
    )
    .await;
}
