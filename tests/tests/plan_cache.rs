//! A connection warmed while today's partition was small must not keep a
//! plan that scans the whole partition once it has filled.
//!
//! PL/pgSQL caches the plans of a function's statements per connection.
//! Under the default `plan_cache_mode = auto`, after five custom plans the
//! cache settles on one generic plan when that looks no dearer, and keeps it
//! until something invalidates it (an ANALYZE, DDL): inserting rows does not.
//! While statistics say today's partition holds a handful of rows, a
//! sequential scan plus a sort is the cheapest way to read it, so the generic
//! plan reads every row of the partition on every call, long after it holds
//! tens of thousands. The store's functions carry
//! `SET plan_cache_mode = force_custom_plan`, so each call is planned with its
//! parameters and today's actual size.
//!
//! The test runs the same story twice, on two databases: once as migrated,
//! and once as a control with that setting reset on the functions it calls.
//! The control must show the sequential scans (else this test could not
//! notice the fix going missing); the migrated functions must show none.

use adk_postgres_testing::{TestDatabase, test_database};
use adk_postgres_tests::pg::client;
use tokio_postgres::Client;

/// Calls on the warm connection while today's partition is small: past the
/// five custom plans after which the plan cache may switch to a generic one.
const WARM_CALLS: usize = 10;
/// Calls measured once the partition has filled.
const MEASURED_CALLS: usize = 3;
/// The partition fills with FILL_SESSIONS × FILL_EVENTS rows.
const FILL_SESSIONS: i32 = 500;
const FILL_EVENTS: i32 = 100;

const LOAD_EVENTS: &str = "adk_load_events(text, text, text, text, date, bigint, bigint, bigint)";
const APPEND_EVENT: &str =
    "adk_append_event(text, text, text, text, text, text, text, bigint, jsonb, jsonb, jsonb, jsonb, bigint, interval)";

/// As the store reads a session's events: `session_day` bound, the latest
/// events first, limited.
const LOAD_SQL: &str =
    "SELECT payload FROM adk_load_events(NULL, 'app', 'user', 'warm', $1::text::date, 1000000, NULL, 20)";
/// As the store appends: a new event id each time.
const APPEND_SQL: &str = "SELECT outcome FROM adk_append_event(NULL, 'app', 'user', 'warm', $1, NULL, 'agent', 1,
     jsonb_build_object('id', $1::text), '{}', '{}', '{}', NULL, NULL)";

/// Scans of today's partition counted while the warm connection made its
/// measured calls of one function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Scans {
    seq: i64,
    idx: i64,
}

#[derive(Debug)]
struct Outcome {
    partition: String,
    load_events: Scans,
    append_event: Scans,
}

#[tokio::test(flavor = "multi_thread")]
async fn a_warm_connection_reads_a_partition_that_filled_since_by_index() {
    let (migrated, control) = tokio::join!(test_database(), test_database());
    let (fixed, unfixed) = tokio::join!(warm_then_fill(&migrated, true), warm_then_fill(&control, false));
    eprintln!("as migrated: {fixed:?}\ncontrol, plan_cache_mode reset: {unfixed:?}");

    // The control reproduces the failure: a cached generic plan scans the
    // whole partition on every call.
    assert!(
        unfixed.load_events.seq >= MEASURED_CALLS as i64,
        "control: adk_load_events without force_custom_plan did not scan {} sequentially, so this test \
         cannot tell the fix from its absence: {unfixed:?}",
        unfixed.partition
    );
    assert!(
        unfixed.append_event.seq >= MEASURED_CALLS as i64,
        "control: adk_append_event without force_custom_plan did not scan {} sequentially, so this test \
         cannot tell the fix from its absence: {unfixed:?}",
        unfixed.partition
    );

    // The migrated functions reach the filled partition by index only.
    assert_eq!(fixed.load_events.seq, 0, "adk_load_events scanned {} sequentially: {fixed:?}", fixed.partition);
    assert!(fixed.load_events.idx >= MEASURED_CALLS as i64, "adk_load_events used no index: {fixed:?}");
    assert_eq!(fixed.append_event.seq, 0, "adk_append_event scanned {} sequentially: {fixed:?}", fixed.partition);
    assert!(fixed.append_event.idx >= MEASURED_CALLS as i64, "adk_append_event used no index: {fixed:?}");
}

/// Warms one connection on a small partition, fills the partition from
/// another connection, then counts the scans of the warm connection's next
/// calls. `fixed: false` first resets `plan_cache_mode` on the two functions.
async fn warm_then_fill(db: &TestDatabase, fixed: bool) -> Outcome {
    let owner = client(db.url()).await;
    if !fixed {
        owner
            .batch_execute(&format!(
                "ALTER FUNCTION {LOAD_EVENTS} RESET plan_cache_mode; ALTER FUNCTION {APPEND_EVENT} RESET plan_cache_mode"
            ))
            .await
            .expect("reset plan_cache_mode");
    }
    owner
        .batch_execute("SELECT * FROM adk_create_session(NULL, 'app', 'user', 'warm', '{}', NULL, '{}', '{}')")
        .await
        .expect("create the session");
    // The session's day, not "today": the test may run across midnight UTC.
    let row = owner
        .query_one(
            "SELECT session_day::text, adk_event_partition_name(session_day) FROM adk_sessions
             WHERE session_id = 'warm'",
            &[],
        )
        .await
        .expect("session day");
    let (day, partition): (String, String) = (row.get(0), row.get(1));
    // Nothing may invalidate the cached plans behind the test's back.
    owner
        .batch_execute(&format!("ALTER TABLE {partition} SET (autovacuum_enabled = off)"))
        .await
        .expect("autovacuum off");
    for n in 0..3 {
        owner.query_one(APPEND_SQL, &[&format!("early-{n}")]).await.expect("early append");
    }
    // Autovacuum (or a maintenance run) analyzes the young partition while
    // it holds a few rows. Without statistics the planner assumes a table of
    // at least ten pages and picks the index even for a generic plan; the
    // failure needs statistics that say "small". This is the last ANALYZE.
    owner.batch_execute("ANALYZE adk_events").await.expect("analyze while small");

    // One connection, warmed while the partition is small.
    let warm = client(db.url()).await;
    for n in 0..WARM_CALLS {
        let rows = warm.query(LOAD_SQL, &[&day]).await.expect("warm read");
        assert!(!rows.is_empty());
        let row = warm.query_one(APPEND_SQL, &[&format!("warm-{n}")]).await.expect("warm append");
        assert_eq!(row.get::<_, String>(0), "stored");
    }

    // The partition fills from another connection; no ANALYZE follows.
    owner
        .execute(
            "INSERT INTO adk_sessions (app_name, user_id, session_id, session_day)
             SELECT 'app', 'filler', 'f' || s, $1::text::date FROM generate_series(1, $2) s",
            &[&day, &FILL_SESSIONS],
        )
        .await
        .expect("filler sessions");
    let filled = owner
        .execute(
            "INSERT INTO adk_events (app_name, user_id, session_id, session_day, seq, event_id, author, event_ts, payload)
             SELECT 'app', 'filler', 'f' || s, $1::text::date, n, 'e' || n, 'agent', n,
                    jsonb_build_object('text', repeat('x', 40))
             FROM generate_series(1, $2) s, generate_series(1, $3) n",
            &[&day, &FILL_SESSIONS, &FILL_EVENTS],
        )
        .await
        .expect("fill the partition");
    assert_eq!(filled, (FILL_SESSIONS * FILL_EVENTS) as u64);

    let load_events = scans_during(&warm, &owner, &partition, async {
        for _ in 0..MEASURED_CALLS {
            warm.query(LOAD_SQL, &[&day]).await.expect("read after the fill");
        }
    })
    .await;
    let append_event = scans_during(&warm, &owner, &partition, async {
        for n in 0..MEASURED_CALLS {
            let row = warm.query_one(APPEND_SQL, &[&format!("after-{n}")]).await.expect("append after the fill");
            assert_eq!(row.get::<_, String>(0), "stored");
        }
    })
    .await;
    Outcome { partition, load_events, append_event }
}

/// The scans of `partition` that `calls` on `warm` made, read from the
/// server's statistics on `reader`.
async fn scans_during(warm: &Client, reader: &Client, partition: &str, calls: impl Future<Output = ()>) -> Scans {
    flush(warm).await;
    let before = scans(reader, partition).await;
    calls.await;
    flush(warm).await;
    let after = scans(reader, partition).await;
    Scans { seq: after.seq - before.seq, idx: after.idx - before.idx }
}

/// A backend reports its counters when it goes idle, at most once a second
/// unless told to: this one reports before answering the next statement.
async fn flush(warm: &Client) {
    warm.batch_execute("SELECT pg_stat_force_next_flush()").await.expect("flush statistics");
}

async fn scans(reader: &Client, partition: &str) -> Scans {
    reader.batch_execute("SELECT pg_stat_clear_snapshot()").await.expect("fresh statistics");
    let row = reader
        .query_one(
            "SELECT coalesce(seq_scan, 0), coalesce(idx_scan, 0) FROM pg_stat_user_tables WHERE relname = $1",
            &[&partition],
        )
        .await
        .expect("partition statistics");
    Scans { seq: row.get(0), idx: row.get(1) }
}
