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
//! tens of thousands. So `adk_read_session` and the change feed's
//! `adk_read_events_after` keep one generic plan for their event reads made
//! with sequential scans off (migrations 20 and 22: an index read whatever
//! the statistics said, never planned again, the session's partition chosen
//! as the plan starts), and `adk_append_event` reads a partition only on its
//! rare replay path, through `EXECUTE`.
//!
//! The list's page read reads `adk_sessions`, which is not partitioned but
//! grows the same way; its plan is kept and made with sequential scans off
//! too (migration 23), which also spares the list the planning that the
//! default mode did on every call.
//!
//! The warm connection also calls a control: the same event read as static
//! PL/pgSQL under the default settings, as the store's functions were once
//! written. The control must show the sequential scans (else this test
//! could not notice the fix going missing); the store's functions must show
//! none, and the get and the feed must touch no other partition of
//! `adk_events`.

use adk_postgres_testing::{TestDatabase, test_database};
use adk_postgres_tests::pg::{client, client_explaining, drain};
use tokio_postgres::Client;

/// Calls on the warm connection while today's partition is small: past the
/// five custom plans after which the plan cache may switch to a generic one.
const WARM_CALLS: usize = 10;
/// Calls measured once the partition has filled.
const MEASURED_CALLS: usize = 3;
/// The partition fills with FILL_SESSIONS × FILL_EVENTS rows.
const FILL_SESSIONS: i32 = 500;
const FILL_EVENTS: i32 = 100;

/// As the store reads a session: the latest events, limited.
const GET_SQL: &str = "SELECT pg_catalog.unnest(events) FROM adk_read_session(NULL, 'app', 'user', 'warm', NULL, 20)";

/// As the change feed reads a session: the events after a seq, a page.
const FEED_SQL: &str =
    "SELECT seq FROM adk_read_events_after(NULL, 'app', 'user', 'warm', 1, 20) WHERE seq IS NOT NULL";

/// As the store lists a user's sessions: one page, no label filter.
const LIST_SQL: &str =
    "SELECT pg_catalog.unnest(session_ids) FROM adk_read_sessions(NULL, 'app', 'user', NULL, NULL, 201)";
/// The same with a label filter, which takes another statement.
const LABELLED_LIST_SQL: &str = "SELECT pg_catalog.unnest(session_ids) FROM adk_read_sessions(NULL, 'app', 'user', NULL, NULL, 201, '{\"team\": \"a\"}')";
/// The user's sessions, and the sessions of others added after the warm-up.
const LISTED_SESSIONS: i32 = 20;
const OTHER_SESSIONS: i32 = 20_000;

/// The control: the same event read as a static PL/pgSQL statement, whose
/// plan the connection caches.
const CONTROL_FUNCTION: &str = "
CREATE FUNCTION control_recent_events(p_day date) RETURNS SETOF jsonb LANGUAGE plpgsql AS $f$
BEGIN
    RETURN QUERY
    SELECT recent.payload FROM (
        SELECT e.seq, e.payload FROM adk_events e
        WHERE e.app_name = 'app' AND e.user_id = 'user' AND e.session_id = 'warm' AND e.session_day = p_day
        ORDER BY e.seq DESC
        LIMIT 20
    ) recent ORDER BY recent.seq;
END
$f$";
const CONTROL_SQL: &str = "SELECT * FROM control_recent_events($1::text::date)";
/// As the store appends: a new event id each time.
const APPEND_SQL: &str = "SELECT outcome FROM adk_append_event(NULL, 'app', 'user', 'warm', $1, NULL, 'agent', 1,
     jsonb_build_object('id', $1::text), '{}', '{}', '{}', NULL, NULL)";

/// Scans of today's partition counted while the warm connection made its
/// measured calls of one function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Scans {
    seq: i64,
    idx: i64,
    /// Scans of every other partition of `adk_events`, of either kind.
    elsewhere: i64,
}

#[derive(Debug)]
struct Outcome {
    partition: String,
    control: Scans,
    get_session: Scans,
    read_events_after: Scans,
    append_event: Scans,
}

#[tokio::test(flavor = "multi_thread")]
async fn a_warm_connection_reads_a_partition_that_filled_since_by_index() {
    // Parallel tests' DDL in other databases of the cluster can overflow the
    // shared invalidation queue, which resets every backend's caches and
    // with them the control's cached plan: then the control fails to show
    // the failure, and the run proves nothing either way. Such a run is
    // repeated on a fresh database; the store's functions are held to an
    // index read in every run.
    const ATTEMPTS: usize = 3;
    let mut outcomes = Vec::new();
    for _ in 0..ATTEMPTS {
        let db = test_database().await;
        let outcome = warm_then_fill(&db).await;
        eprintln!("{outcome:?}");

        // The store's functions reach the filled partition by index only.
        let Outcome { partition, get_session, read_events_after, append_event, .. } = &outcome;
        for (function, scans) in [("adk_read_session", get_session), ("adk_read_events_after", read_events_after)] {
            assert_eq!(scans.seq, 0, "{function} scanned {partition} sequentially: {outcome:?}");
            assert!(scans.idx >= MEASURED_CALLS as i64, "{function} used no index: {outcome:?}");
            assert_eq!(scans.elsewhere, 0, "{function} read partitions besides {partition}: {outcome:?}");
        }
        assert_eq!(append_event.seq, 0, "adk_append_event scanned {partition} sequentially: {outcome:?}");

        // The control reproduces the failure: a cached generic plan scans
        // the whole partition on every call.
        if outcome.control.seq >= MEASURED_CALLS as i64 {
            return;
        }
        outcomes.push(outcome);
    }
    panic!(
        "control: a static PL/pgSQL read did not scan the filled partition sequentially in {ATTEMPTS} runs, so \
         this test cannot tell the fix from its absence: {outcomes:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_warm_connection_lists_on_one_plan_that_reads_a_grown_table_by_its_key() {
    let db = test_database().await;
    let owner = client(db.url()).await;
    owner
        .execute(
            "INSERT INTO adk_sessions (app_name, user_id, session_id)
             SELECT 'app', 'user', 's' || g FROM generate_series(1, $1) g",
            &[&LISTED_SESSIONS],
        )
        .await
        .expect("the user's sessions");
    // As for the partition above: statistics that say "small", and nothing
    // that invalidates the warm connection's plans afterwards.
    owner
        .batch_execute(
            "ALTER TABLE adk_sessions SET (autovacuum_enabled = off);
             ANALYZE adk_sessions;
             CREATE EXTENSION IF NOT EXISTS pg_stat_statements;",
        )
        .await
        .expect("small statistics");
    let warm = client(db.url()).await;
    // Plans of the statements inside the function are counted too.
    warm.batch_execute("SET pg_stat_statements.track = 'all'; SET pg_stat_statements.track_planning = on")
        .await
        .expect("count plans");
    // This database's statistics only: tests beside this one count theirs.
    owner
        .batch_execute(
            "SELECT pg_stat_statements_reset(0, (SELECT oid FROM pg_database WHERE datname = current_database()), 0)",
        )
        .await
        .expect("reset");
    for _ in 0..WARM_CALLS {
        let rows = warm.query(LIST_SQL, &[]).await.expect("warm list");
        assert_eq!(rows.len(), LISTED_SESSIONS as usize);
    }

    owner
        .execute(
            "INSERT INTO adk_sessions (app_name, user_id, session_id)
             SELECT 'app', 'other-' || (g % 200), 's' || g FROM generate_series(1, $1) g",
            &[&OTHER_SESSIONS],
        )
        .await
        .expect("other users' sessions");
    flush(&warm).await;
    let before = table_scans(&owner, "adk_sessions").await;
    for _ in 0..MEASURED_CALLS {
        let rows = warm.query(LIST_SQL, &[]).await.expect("list after the table grew");
        assert_eq!(rows.len(), LISTED_SESSIONS as usize);
    }
    flush(&warm).await;
    let after = table_scans(&owner, "adk_sessions").await;
    let (seq, idx) = (after.0 - before.0, after.1 - before.1);
    assert_eq!(seq, 0, "the list scanned adk_sessions sequentially ({idx} index scans)");
    assert!(idx >= MEASURED_CALLS as i64, "the list used no index ({seq} sequential scans)");

    let row = owner
        .query_one(
            "SELECT coalesce(sum(plans), 0)::bigint, coalesce(sum(calls), 0)::bigint FROM pg_stat_statements
              WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
                AND query LIKE '%FROM adk_sessions s%' AND query LIKE '%array_agg(p.session_id)%'
                AND query NOT LIKE '%@>%'",
            &[],
        )
        .await
        .expect("plans of the page read");
    let (plans, calls): (i64, i64) = (row.get(0), row.get(1));
    assert_eq!(calls, (WARM_CALLS + MEASURED_CALLS) as i64, "the page read ran once per list");
    // One plan, kept. A second is the server resetting every backend's
    // caches when its invalidation queue overflows, which the rest of the
    // suite's DDL can cause at any moment; custom plans would be one per
    // call.
    assert!(plans <= 2, "the page read was planned {plans} times in {calls} lists on one connection");

    // A label filter is planned with its value on every call (auto_explain
    // shows the value in the plan, where a generic plan has `$3`), and the
    // function's exit leaves the connection's own setting as it was.
    let (explaining, logged) = client_explaining(db.url()).await;
    for _ in 0..MEASURED_CALLS {
        drain(&logged);
        explaining.query(LABELLED_LIST_SQL, &[]).await.expect("list with a label filter");
        let plans = drain(&logged);
        let plan = plans
            .iter()
            .find(|p| p.contains("FROM adk_sessions s") && p.contains("@>"))
            .unwrap_or_else(|| panic!("no plan of the filtered page logged: {plans:?}"));
        assert!(plan.contains(r#"'{"team": "a"}'"#), "the filter's value was not planned with:\n{plan}");
    }
    let mode: String = explaining.query_one("SHOW plan_cache_mode", &[]).await.expect("mode").get(0);
    assert_eq!(mode, "auto", "the list changed the connection's plan_cache_mode");
}

/// Sequential and index scans of `table` so far, from the server's
/// statistics on `reader`.
async fn table_scans(reader: &Client, table: &str) -> (i64, i64) {
    reader.batch_execute("SELECT pg_stat_clear_snapshot()").await.expect("fresh statistics");
    let row = reader
        .query_one(
            "SELECT coalesce(seq_scan, 0), coalesce(idx_scan, 0) FROM pg_stat_user_tables WHERE relname = $1",
            &[&table],
        )
        .await
        .expect("table statistics");
    (row.get(0), row.get(1))
}

/// Warms one connection on a small partition, fills the partition from
/// another connection, then counts the scans of the warm connection's next
/// calls of the control and of the store's functions.
async fn warm_then_fill(db: &TestDatabase) -> Outcome {
    let owner = client(db.url()).await;
    owner.batch_execute(CONTROL_FUNCTION).await.expect("create the control");
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
        let rows = warm.query(GET_SQL, &[]).await.expect("warm read");
        assert!(!rows.is_empty());
        let rows = warm.query(FEED_SQL, &[]).await.expect("warm feed read");
        assert!(!rows.is_empty());
        let rows = warm.query(CONTROL_SQL, &[&day]).await.expect("warm control read");
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

    let control = scans_during(&warm, &owner, &partition, async {
        for _ in 0..MEASURED_CALLS {
            warm.query(CONTROL_SQL, &[&day]).await.expect("control read after the fill");
        }
    })
    .await;
    let get_session = scans_during(&warm, &owner, &partition, async {
        for _ in 0..MEASURED_CALLS {
            warm.query(GET_SQL, &[]).await.expect("read after the fill");
        }
    })
    .await;
    let read_events_after = scans_during(&warm, &owner, &partition, async {
        for _ in 0..MEASURED_CALLS {
            warm.query(FEED_SQL, &[]).await.expect("feed read after the fill");
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
    Outcome { partition, control, get_session, read_events_after, append_event }
}

/// The scans of `partition` that `calls` on `warm` made, read from the
/// server's statistics on `reader`.
async fn scans_during(warm: &Client, reader: &Client, partition: &str, calls: impl Future<Output = ()>) -> Scans {
    flush(warm).await;
    let before = scans(reader, partition).await;
    calls.await;
    flush(warm).await;
    let after = scans(reader, partition).await;
    Scans { seq: after.seq - before.seq, idx: after.idx - before.idx, elsewhere: after.elsewhere - before.elsewhere }
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
            "SELECT coalesce(sum(t.seq_scan) FILTER (WHERE t.relname = $1), 0)::bigint,
                    coalesce(sum(t.idx_scan) FILTER (WHERE t.relname = $1), 0)::bigint,
                    coalesce(sum(coalesce(t.seq_scan, 0) + coalesce(t.idx_scan, 0))
                             FILTER (WHERE t.relname <> $1), 0)::bigint,
                    count(*) FILTER (WHERE t.relname <> $1)
               FROM pg_stat_user_tables t JOIN pg_inherits i ON i.inhrelid = t.relid
              WHERE i.inhparent = 'adk_events'::regclass",
            &[&partition],
        )
        .await
        .expect("partition statistics");
    // Without other partitions, "none read elsewhere" would prove nothing.
    assert!(row.get::<_, i64>(3) > 0, "adk_events has no partition besides {partition}");
    Scans { seq: row.get(0), idx: row.get(1), elsewhere: row.get(2) }
}
