//! Building an index on the partitioned event log partition by partition
//! with CREATE INDEX CONCURRENTLY: appends never fail meanwhile, the parent
//! index ends valid, reruns do nothing, interrupted runs finish, and later
//! partitions inherit the index.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use adk_postgres_domain::{AppendOptions, Event, SessionStore};
use adk_postgres_retention::index::child_index_name;
use adk_postgres_retention::{
    IndexOptions, IndexProgress, LockPolicy, RetentionError, create_partitioned_index, create_partitioned_index_with,
};
use adk_postgres_testing::test_database;
use adk_postgres_tests::pg::{client, new_session, store};
use tokio_postgres::Client;

/// A few thousand rows in every partition (UTC yesterday … a week ahead),
/// so each concurrent build has something to read.
const SEED: &str = "
INSERT INTO adk_sessions (app_name, user_id, session_id, session_day)
SELECT 'seed', 'u', 'seed-' || d::date, d::date
FROM generate_series((now() AT TIME ZONE 'UTC')::date - 1, (now() AT TIME ZONE 'UTC')::date + 7, interval '1 day') d;
INSERT INTO adk_events (app_name, user_id, session_id, session_day, seq, event_id, author, event_ts, payload)
SELECT 'seed', 'u', 'seed-' || d::date, d::date, n, 'e-' || n, 'author-' || (n % 7), n, jsonb_build_object('n', n)
FROM generate_series((now() AT TIME ZONE 'UTC')::date - 1, (now() AT TIME ZONE 'UTC')::date + 7, interval '1 day') d,
     generate_series(1, 3000) n;";

/// Partitions of adk_events and the index of each attached to `index`.
async fn attached(sql: &Client, index: &str) -> Vec<(String, Option<String>)> {
    sql.query(
        "SELECT c.relname::text,
                (SELECT ci.relname::text FROM pg_inherits hi JOIN pg_index x ON x.indexrelid = hi.inhrelid
                 JOIN pg_class ci ON ci.oid = x.indexrelid
                 WHERE hi.inhparent = to_regclass($1) AND x.indrelid = c.oid)
         FROM pg_inherits h JOIN pg_class c ON c.oid = h.inhrelid
         WHERE h.inhparent = 'adk_events'::regclass ORDER BY 1",
        &[&index],
    )
    .await
    .expect("partitions")
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect()
}

async fn parent_valid(sql: &Client, index: &str) -> bool {
    sql.query_one("SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass($1)", &[&index])
        .await
        .expect("parent index")
        .get(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn builds_across_partitions_while_appends_continue() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    sql.batch_execute(SEED).await.expect("seed");
    let partitions = attached(&sql, "adk_events_app_author").await.len();
    assert_eq!(partitions, 9);

    // A writer appending through the store for the whole build.
    let store = store(db.url()).await;
    let mut keys = Vec::new();
    for user in ["ann", "bob", "cid"] {
        keys.push(new_session(&store, "app", user).await);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let appended = Arc::new(AtomicU64::new(0));
    let writer = {
        let (stop, appended) = (Arc::clone(&stop), Arc::clone(&appended));
        tokio::spawn(async move {
            let mut failures = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                for key in &keys {
                    match store.append(key, Event::new("agent"), AppendOptions::default()).await {
                        Ok(_) => {
                            appended.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => failures.push(e.to_string()),
                    }
                }
            }
            failures
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;

    let before = appended.load(Ordering::Relaxed);
    let mut progress = Vec::new();
    let started = Instant::now();
    let report = create_partitioned_index(
        db.url(),
        "adk_events_app_author",
        &["app_name", "author"],
        &LockPolicy::default(),
        &mut |p| progress.push(p),
    )
    .await
    .expect("build");
    let took = started.elapsed();
    let during = appended.load(Ordering::Relaxed) - before;
    tokio::time::sleep(Duration::from_millis(100)).await;
    stop.store(true, Ordering::Relaxed);
    let failures = writer.await.expect("writer");
    eprintln!("built on {partitions} partitions in {took:?} while {during} events were appended");

    assert!(failures.is_empty(), "appends failed during the build: {failures:?}");
    assert!(during > 0, "no append ran during the build");
    assert!(report.parent_created && report.parent_valid && !report.stopped_early, "{report:?}");
    assert_eq!(report.partitions, partitions);
    assert_eq!(report.built.len(), partitions);
    assert!(report.skipped.is_empty() && report.dropped_invalid.is_empty());
    assert!(parent_valid(&sql, "adk_events_app_author").await);
    for (partition, index) in attached(&sql, "adk_events_app_author").await {
        assert_eq!(index, Some(child_index_name("adk_events_app_author", &partition)), "{partition}");
    }
    assert!(matches!(progress.first(), Some(IndexProgress::ParentCreated { .. })), "{progress:?}");
    assert_eq!(progress.iter().filter(|p| matches!(p, IndexProgress::Attached { .. })).count(), partitions);
    assert!(matches!(progress.last(), Some(IndexProgress::Finished { valid: true, .. })));
    // The planner can use it: every partition has a valid index on
    // (app_name, author).
    let invalid: i64 = sql
        .query_one(
            "SELECT count(*) FROM pg_index x JOIN pg_inherits h ON h.inhrelid = x.indexrelid
             WHERE h.inhparent = 'adk_events_app_author'::regclass AND NOT x.indisvalid",
            &[],
        )
        .await
        .expect("children")
        .get(0);
    assert_eq!(invalid, 0);

    // A second run finds everything done.
    let again = create_partitioned_index(
        db.url(),
        "adk_events_app_author",
        &["app_name", "author"],
        &LockPolicy::default(),
        &mut |_| {},
    )
    .await
    .expect("rerun");
    assert!(!again.parent_created && again.built.is_empty() && again.parent_valid, "{again:?}");
    assert_eq!(again.skipped.len(), partitions);

    // The same name with other columns is refused, not silently accepted.
    let err =
        create_partitioned_index(db.url(), "adk_events_app_author", &["author"], &LockPolicy::default(), &mut |_| {})
            .await
            .expect_err("another definition");
    assert!(matches!(err, RetentionError::Conflict(_)), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_interrupted_build_is_finished_by_the_next_run() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    sql.batch_execute(SEED).await.expect("seed");
    let name = "adk_events_author_ts";
    let columns = ["author", "event_ts"];

    let first = create_partitioned_index_with(
        db.url(),
        name,
        &columns,
        &LockPolicy::default(),
        &IndexOptions { stop_after_partitions: Some(3) },
        &mut |_| {},
    )
    .await
    .expect("first part");
    assert!(first.stopped_early && !first.parent_valid, "{first:?}");
    assert_eq!(first.built.len(), 3);
    assert!(!parent_valid(&sql, name).await, "the parent index is valid with partitions missing");

    // The next partition's build was killed half-way: an INVALID leftover
    // under the name the tool uses.
    let partitions = attached(&sql, name).await;
    let (victim, _) = partitions.iter().find(|(_, index)| index.is_none()).expect("a partition left").clone();
    let leftover = child_index_name(name, &victim);
    sql.batch_execute(&format!("CREATE UNIQUE INDEX CONCURRENTLY \"{leftover}\" ON \"{victim}\" (session_day)"))
        .await
        .expect_err("fails on duplicate days and leaves its index");

    let rest =
        create_partitioned_index(db.url(), name, &columns, &LockPolicy::default(), &mut |_| {}).await.expect("finish");
    assert!(rest.parent_valid && !rest.parent_created, "{rest:?}");
    assert_eq!(rest.skipped.len(), 3);
    assert_eq!(rest.built.len(), partitions.len() - 3);
    assert_eq!(rest.dropped_invalid, vec![leftover.clone()]);
    assert!(parent_valid(&sql, name).await);
    assert!(attached(&sql, name).await.iter().all(|(_, index)| index.is_some()));
    let definition: String =
        sql.query_one("SELECT pg_get_indexdef($1::text::regclass)", &[&leftover]).await.expect("rebuilt").get(0);
    assert!(definition.contains("(author, event_ts)"), "{definition}");

    // With the parent index valid, PostgreSQL gives every new partition the
    // index on its own.
    sql.execute("SELECT adk_ensure_event_partition('2031-01-01')", &[]).await.expect("new partition");
    let later = attached(&sql, name).await;
    let (_, index) = later.iter().find(|(p, _)| p == "adk_events_p20310101").expect("the new partition");
    assert!(index.is_some(), "the new partition did not get the index: {later:?}");
    assert!(parent_valid(&sql, name).await);
}

#[tokio::test(flavor = "multi_thread")]
async fn progress_is_read_while_a_build_waits() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    sql.batch_execute(SEED).await.expect("seed");
    let first_partition = attached(&sql, "x").await.remove(0).0;

    // A writer holding the first partition open: that build waits for it,
    // which the second connection sees as a phase.
    let writer = client(db.url()).await;
    writer
        .batch_execute(&format!(
            "BEGIN; INSERT INTO \"{first_partition}\" (app_name, user_id, session_id, session_day, seq, event_id, author, event_ts, payload)
             SELECT app_name, user_id, session_id, session_day, 100000, 'held', 'a', 1, '{{}}' FROM \"{first_partition}\" LIMIT 1"
        ))
        .await
        .expect("open writer");
    let release = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        writer.batch_execute("COMMIT").await.expect("commit");
    });
    let policy = LockPolicy { lock_timeout: Duration::from_secs(10), ..LockPolicy::default() };
    let mut progress = Vec::new();
    let report =
        create_partitioned_index(db.url(), "adk_events_by_author", &["author"], &policy, &mut |p| progress.push(p))
            .await
            .expect("build");
    release.await.expect("writer");
    assert!(report.parent_valid);
    let phases: Vec<String> = progress
        .iter()
        .filter_map(|p| match p {
            IndexProgress::Building { partition, progress, .. } if *partition == first_partition => {
                Some(progress.phase.clone())
            }
            _ => None,
        })
        .collect();
    assert!(phases.iter().any(|p| p.starts_with("waiting for writers")), "{phases:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn names_and_columns_are_checked_before_anything_runs() {
    let db = test_database().await;
    let policy = LockPolicy::default();
    let long = "x".repeat(64);
    let cases: [(&str, &[&str], &str); 6] = [
        ("bad name; drop table adk_events", &["author"], "name"),
        (long.as_str(), &["author"], "name"),
        ("ok_name", &[], "columns"),
        ("ok_name", &["author", "author"], "columns"),
        ("ok_name", &["author\""], "columns"),
        ("ok_name", &["no_such_column"], "columns"),
    ];
    for (name, columns, field) in cases {
        let err = create_partitioned_index(db.url(), name, columns, &policy, &mut |_| {}).await.expect_err(name);
        assert!(
            matches!(&err, RetentionError::InvalidInput { field: f, .. } if *f == field),
            "{name} {columns:?}: {err}"
        );
    }
    let sql = client(db.url()).await;
    let made: bool = sql.query_one("SELECT to_regclass('ok_name') IS NOT NULL", &[]).await.expect("lookup").get(0);
    assert!(!made);
}
