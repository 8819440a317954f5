//! Acknowledge only what committed (issue #10).
//!
//! A write the store reports as done must be in the database, whatever
//! happens to the connection or the server while it commits. A statement in
//! autocommit commits after it has produced its rows, so the server sends
//! the rows first and an error at commit (or a dying backend's farewell)
//! after them, ahead of ReadyForQuery: a store that returns on the first
//! row acknowledges writes that then roll back. These tests make exactly
//! that happen and compare what the store acknowledged with what the
//! database holds, never with themselves.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use adk_postgres_domain::{
    AppName, AppendOptions, CreateSession, Event, GetOptions, SessionKey, SessionStore, StoreConfig, StoreError, UserId,
};
use adk_postgres_storage::{PgSessionStore, PoolConfig};
use adk_postgres_testing::{Cluster, TestDatabase, start_throwaway_cluster, test_database, test_database_on};
use adk_postgres_tests::pg::{client, new_session, store};
use serde_json::json;
use tokio::task::JoinHandle;

/// The app of every writer's sessions.
const APP: &str = "acknowledged";
const WRITERS: usize = 16;
const SESSIONS_PER_WRITER: usize = 2;

/// The storm runs until both quotas are met: enough appends that thousands
/// of them were in flight when a backend died, enough terminations that
/// many of those deaths hit a commit.
const STORM_APPENDS: u64 = 10_000;
const STORM_TERMINATIONS: u64 = 300;
/// Only a guard against a store that stops making progress; the test never
/// judges how fast anything was.
const STORM_CAP: Duration = Duration::from_secs(120);

/// Appends acknowledged before each fault of the restart test, and after the
/// last one, so every fault hits writers in full flight and the store is
/// seen to serve again afterwards.
const PHASE_APPENDS: u64 = 1_500;
const PHASE_CAP: Duration = Duration::from_secs(60);

/// How long a writer keeps retrying one event once the run is over before
/// it reports the event as in doubt (and the test as failed).
const GIVE_UP_AFTER: Duration = Duration::from_secs(30);

/// Ends client backends of the database (never its own): at most `$1` of
/// them, picked at random, all of them when `$1` is NULL. Counting in SQL
/// keeps backends that were already gone out of the figure.
const TERMINATE_SQL: &str = "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM ( \
     SELECT pid FROM pg_stat_activity \
     WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend' \
     ORDER BY random() LIMIT $1::bigint) victims";
/// One pass in this many ends every backend at once.
const KILL_ALL_EVERY: u64 = 10;

/// A database of its own on a cluster of its own: these tests kill backends
/// and stop the server, which must never reach another test's connections.
async fn private_database() -> (&'static Cluster, TestDatabase) {
    // Leaked: a test database keeps a `&'static` to its cluster. The
    // cluster's watchdog removes it when the test process exits.
    let cluster: &'static Cluster = Box::leak(Box::new(start_throwaway_cluster().expect("a private cluster")));
    (cluster, test_database_on(cluster).await)
}

/// Makes every event's commit durable against a crash and slow enough to be
/// hit.
///
/// The throwaway cluster runs with `synchronous_commit = off`: its commits
/// return before their WAL is written, so an immediate stop loses the last
/// moments of commits by design of that setting, not by any fault of the
/// store. Turned on for this database, a commit's WAL reaches the kernel
/// before the commit returns, which is all a crash of the server (not of the
/// machine) needs, with fsync still off.
///
/// With fsync off the commit follows the row within microseconds, so a kill
/// or a crash almost never lands between the two. A deferred constraint
/// trigger runs at commit, after the row was produced, as any deferred
/// constraint does: its pause widens that window until kills and crashes
/// land in it often, which is where a store that acknowledges too early
/// loses appends.
async fn slow_durable_commits(db: &TestDatabase) {
    let sql = db.connect().await;
    sql.batch_execute(&format!(
        r#"ALTER DATABASE "{}" SET synchronous_commit = on;
        CREATE FUNCTION ack_test_commit_work() RETURNS trigger LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
        BEGIN
            PERFORM pg_sleep(0.002);
            RETURN NULL;
        END $$;
        CREATE CONSTRAINT TRIGGER ack_test_commit_work AFTER INSERT ON adk_events
            DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION ack_test_commit_work();"#,
        db.name()
    ))
    .await
    .expect("slow, durable commits");
}

/// The writers' store: a connection per writer, and a short checkout timeout
/// so a writer waiting through a restart retries rather than hangs.
async fn writers_store(url: &str) -> Arc<PgSessionStore> {
    let pool =
        PoolConfig { max_size: WRITERS as u32, connection_timeout: Duration::from_secs(2), ..PoolConfig::default() };
    Arc::new(PgSessionStore::connect(url, &pool, StoreConfig::default()).await.expect("connect the writers' store"))
}

#[derive(Debug, Default)]
struct Counters {
    acknowledged: AtomicU64,
    retries: AtomicU64,
    /// Retries answered with the event an earlier attempt had stored: that
    /// attempt committed but its answer was lost, which is allowed.
    replayed: AtomicU64,
}

impl Counters {
    fn acknowledged(&self) -> u64 {
        self.acknowledged.load(Ordering::Relaxed)
    }
}

/// What the store told one writer about one session.
#[derive(Debug)]
struct Ledger {
    key: SessionKey,
    /// (event id, seq) in the order the store acknowledged them.
    acks: Vec<(String, u64)>,
    /// The `step` of the last acknowledged event that carried a state delta.
    last_step: Option<u64>,
    /// An event given up on: it may or may not be stored.
    in_doubt: Option<String>,
}

#[derive(Debug)]
struct WriterReport {
    ledgers: Vec<Ledger>,
    /// The `user:step` the writer's user state must hold: the writer is
    /// sequential, so the last acknowledged delta across its sessions wins.
    user_step: Option<u64>,
    failure: Option<String>,
}

/// The `step`-th event of a writer. Most carry a delta for the session and
/// the user scope, so the state merges (and the user row lock) commit or
/// vanish together with their event; the rest are plain.
fn event(step: u64) -> Event {
    let mut event = Event::new("agent");
    if carries_delta(step) {
        event.actions.state_delta.insert("step".into(), json!(step));
        event.actions.state_delta.insert("user:step".into(), json!(step));
    }
    event
}

fn carries_delta(step: u64) -> bool {
    !step.is_multiple_of(4)
}

/// Creates each writer's sessions (before any fault: a create is not what
/// these tests are about) and starts the writers.
async fn start_writers(
    store: &Arc<PgSessionStore>,
    stop: &Arc<AtomicBool>,
    counters: &Arc<Counters>,
) -> Vec<JoinHandle<WriterReport>> {
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let mut keys = Vec::new();
        for _ in 0..SESSIONS_PER_WRITER {
            keys.push(new_session(store.as_ref(), APP, &format!("writer-{w}")).await);
        }
        let (store, stop, counters) = (Arc::clone(store), Arc::clone(stop), Arc::clone(counters));
        writers.push(tokio::spawn(write_until_stopped(store, keys, stop, counters)));
    }
    writers
}

/// Appends to its sessions in turn until told to stop, retrying each event
/// unchanged (same id, same content) until it is acknowledged, as a client
/// would: appends are idempotent by event id.
async fn write_until_stopped(
    store: Arc<PgSessionStore>,
    keys: Vec<SessionKey>,
    stop: Arc<AtomicBool>,
    counters: Arc<Counters>,
) -> WriterReport {
    let mut ledgers: Vec<Ledger> =
        keys.into_iter().map(|key| Ledger { key, acks: Vec::new(), last_step: None, in_doubt: None }).collect();
    let mut report = WriterReport { ledgers: Vec::new(), user_step: None, failure: None };
    let mut step = 0u64;
    // An event already begun is always seen through, so at the end every
    // writer's last event is either acknowledged or reported in doubt.
    while !stop.load(Ordering::Relaxed) {
        step += 1;
        let ledger = &mut ledgers[step as usize % SESSIONS_PER_WRITER];
        let event = event(step);
        match append_until_acknowledged(&store, &ledger.key, &event, &stop, &counters).await {
            Ok(seq) => {
                ledger.acks.push((event.id, seq));
                if carries_delta(step) {
                    ledger.last_step = Some(step);
                    report.user_step = Some(step);
                }
                counters.acknowledged.fetch_add(1, Ordering::Relaxed);
            }
            Err(failure) => {
                ledger.in_doubt = Some(event.id);
                report.failure = Some(failure);
                break;
            }
        }
    }
    report.ledgers = ledgers;
    report
}

async fn append_until_acknowledged(
    store: &PgSessionStore,
    key: &SessionKey,
    event: &Event,
    stop: &AtomicBool,
    counters: &Counters,
) -> Result<u64, String> {
    // Short: a checkout already waits for the pool to reconnect (or times
    // out while the server is down), so a retry cannot spin.
    let mut pause = Duration::from_millis(1);
    let mut stopped_at: Option<Instant> = None;
    loop {
        match store.append(key, event.clone(), AppendOptions::default()).await {
            Ok(appended) => {
                if appended.replayed {
                    counters.replayed.fetch_add(1, Ordering::Relaxed);
                }
                return appended.seq.ok_or_else(|| format!("{key}: event {} acknowledged without a seq", event.id));
            }
            // A dropped connection misread as a missing partition would send
            // an operator to run maintenance that fixes nothing.
            Err(StoreError::PartitionMissing { day }) => {
                return Err(format!("{key}: PartitionMissing({day:?}) while the partition exists"));
            }
            Err(e) if e.is_retryable() => {
                counters.retries.fetch_add(1, Ordering::Relaxed);
                if stop.load(Ordering::Relaxed) && stopped_at.get_or_insert_with(Instant::now).elapsed() > GIVE_UP_AFTER
                {
                    return Err(format!(
                        "{key}: event {} still failing {GIVE_UP_AFTER:?} after the run: {e}",
                        event.id
                    ));
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(10));
            }
            Err(e) => return Err(format!("{key}: a non-retryable error for event {}: {e:?}", event.id)),
        }
    }
}

/// Ends client backends over and over, a few ms to 30 ms apart, until
/// stopped, and counts the backends it ended. It survives its own
/// connection's death by connecting again.
///
/// A pass ends one backend at random, and every tenth pass all of them.
/// Ending all on every pass keeps the pool reconnecting so much that hardly
/// an append is in flight when the next pass comes (under a hundred appends
/// a second on two cores, against a thousand without kills), and in-flight
/// appends are the ones a kill must hit.
async fn terminate_backends(url: String, stop: Arc<AtomicBool>, terminations: Arc<AtomicU64>) {
    let mut pass = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let Ok(sql) = adk_postgres_testing::connect(&url).await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        while !stop.load(Ordering::Relaxed) {
            pass += 1;
            let victims: Option<i64> = if pass.is_multiple_of(KILL_ALL_EVERY) { None } else { Some(1) };
            match sql.query_one(TERMINATE_SQL, &[&victims]).await {
                Ok(row) => terminations.fetch_add(row.get::<_, i64>(0) as u64, Ordering::Relaxed),
                Err(_) => break,
            };
            // Irregular, so the kills land at every point of an append.
            let pause = 2 + (uuid::Uuid::new_v4().as_u128() % 29) as u64;
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
    }
}

/// Waits until `done` holds or `cap` has passed; whether it held.
async fn wait_for(cap: Duration, done: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + cap;
    while !done() {
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    true
}

async fn stop_writers(stop: &AtomicBool, writers: Vec<JoinHandle<WriterReport>>) -> Vec<WriterReport> {
    stop.store(true, Ordering::Relaxed);
    let mut reports = Vec::new();
    for writer in writers {
        reports.push(writer.await.expect("a writer panicked"));
    }
    reports
}

/// What the database holds, held against what the store acknowledged.
#[derive(Debug, Default)]
struct Audit {
    sessions: usize,
    acknowledged: usize,
    stored: usize,
    /// Acknowledged events not stored, or stored at another seq.
    lost: Vec<String>,
    /// An event id stored twice in one session.
    duplicated: Vec<String>,
    /// Stored events nobody acknowledged (besides an event in doubt).
    unacknowledged: Vec<String>,
    /// Acknowledgements out of seq order, or seqs with a gap.
    reordered: Vec<String>,
    /// The store's own reading (events, version, state) disagreeing with the rows.
    store_disagrees: Vec<String>,
    in_doubt: usize,
}

impl Audit {
    fn figures(&self) -> String {
        format!(
            "{} sessions; {} acknowledged, {} stored; lost {}, duplicated {}, unacknowledged {}, reordered {}, \
             store disagrees {}, in doubt {}",
            self.sessions,
            self.acknowledged,
            self.stored,
            self.lost.len(),
            self.duplicated.len(),
            self.unacknowledged.len(),
            self.reordered.len(),
            self.store_disagrees.len(),
            self.in_doubt,
        )
    }

    fn assert_clean(&self) {
        for (what, found) in [
            ("acknowledged appends lost", &self.lost),
            ("events stored twice", &self.duplicated),
            ("events stored but never acknowledged", &self.unacknowledged),
            ("events out of acknowledgement order or with seq gaps", &self.reordered),
            ("sessions the store reads differently from their rows", &self.store_disagrees),
        ] {
            assert!(found.is_empty(), "{} {what} ({}), e.g.:\n  {}", found.len(), self.figures(), first(found));
        }
    }
}

fn first(found: &[String]) -> String {
    found.iter().take(10).cloned().collect::<Vec<_>>().join("\n  ")
}

/// Reads every writer session's rows from `adk_events` and, through a fresh
/// store, the sessions themselves, and checks both against the ledgers.
async fn audit(url: &str, reports: &[WriterReport]) -> Audit {
    let sql = client(url).await;
    let mut rows: HashMap<(String, String), Vec<(i64, String)>> = HashMap::new();
    for row in sql
        .query("SELECT user_id, session_id, seq, event_id FROM adk_events WHERE app_name = $1 ORDER BY seq", &[&APP])
        .await
        .expect("read the events")
    {
        rows.entry((row.get(0), row.get(1))).or_default().push((row.get(2), row.get(3)));
    }
    // A store whose pool never saw a fault: nothing cached can vouch for a row.
    let fresh = store(url).await;
    let mut audit = Audit::default();
    for report in reports {
        for ledger in &report.ledgers {
            let key = &ledger.key;
            let stored =
                rows.remove(&(key.user_id.as_str().to_owned(), key.session_id.as_str().to_owned())).unwrap_or_default();
            audit.sessions += 1;
            audit.acknowledged += ledger.acks.len();
            audit.stored += stored.len();
            audit.in_doubt += usize::from(ledger.in_doubt.is_some());
            check_rows(&mut audit, ledger, &stored);
            check_store(&mut audit, &fresh, ledger, report, &stored).await;
        }
    }
    for ((user, session), stored) in rows {
        audit.unacknowledged.push(format!("{user}/{session}: {} events in a session no writer had", stored.len()));
    }
    audit
}

fn check_rows(audit: &mut Audit, ledger: &Ledger, stored: &[(i64, String)]) {
    let key = &ledger.key;
    let mut seq_of: HashMap<&str, i64> = HashMap::new();
    for (i, (seq, id)) in stored.iter().enumerate() {
        if *seq != i as i64 + 1 {
            audit.reordered.push(format!("{key}: row {} has seq {seq}", i + 1));
        }
        if seq_of.insert(id, *seq).is_some() {
            audit.duplicated.push(format!("{key}: event {id} stored twice"));
        }
    }
    let acknowledged: HashSet<&str> = ledger.acks.iter().map(|(id, _)| id.as_str()).collect();
    for (id, seq) in &ledger.acks {
        match seq_of.get(id.as_str()) {
            Some(stored) if *stored == *seq as i64 => {}
            Some(stored) => audit.lost.push(format!("{key}: event {id} acknowledged at seq {seq}, stored at {stored}")),
            None => audit.lost.push(format!("{key}: event {id} acknowledged at seq {seq}, not stored")),
        }
    }
    for pair in ledger.acks.windows(2) {
        if pair[1].1 <= pair[0].1 {
            audit.reordered.push(format!("{key}: seq {} acknowledged after seq {}", pair[1].1, pair[0].1));
        }
    }
    for (seq, id) in stored {
        if !acknowledged.contains(id.as_str()) && ledger.in_doubt.as_deref() != Some(id) {
            audit.unacknowledged.push(format!("{key}: event {id} at seq {seq} was never acknowledged"));
        }
    }
}

async fn check_store(
    audit: &mut Audit,
    fresh: &PgSessionStore,
    ledger: &Ledger,
    report: &WriterReport,
    stored: &[(i64, String)],
) {
    let key = &ledger.key;
    let session = fresh.get(key, GetOptions::default()).await.unwrap_or_else(|e| panic!("get {key}: {e}"));
    let read: Vec<&str> = session.events.iter().map(|e| e.id.as_str()).collect();
    let rows: Vec<&str> = stored.iter().map(|(_, id)| id.as_str()).collect();
    if read != rows {
        audit.store_disagrees.push(format!("{key}: get returns {} events, the table holds {}", read.len(), rows.len()));
    }
    if session.version != stored.len() as u64 {
        audit.store_disagrees.push(format!("{key}: version {} with {} events stored", session.version, stored.len()));
    }
    // A delta commits with its event; an event in doubt may have moved it.
    if ledger.in_doubt.is_none() && report.failure.is_none() {
        for (field, expected) in [("step", ledger.last_step), ("user:step", report.user_step)] {
            let actual = session.state.get(field);
            if actual != expected.map(|s| json!(s)).as_ref() {
                audit
                    .store_disagrees
                    .push(format!("{key}: state {field} is {actual:?}, last acknowledged {expected:?}"));
            }
        }
    }
}

fn failures(reports: &[WriterReport]) -> Vec<String> {
    reports.iter().filter_map(|r| r.failure.clone()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_termination_storm_loses_no_acknowledged_append() {
    let (_cluster, db) = private_database().await;
    slow_durable_commits(&db).await;
    let store = writers_store(db.url()).await;
    let (stop, counters) = (Arc::new(AtomicBool::new(false)), Arc::new(Counters::default()));
    let started = Instant::now();
    let writers = start_writers(&store, &stop, &counters).await;

    let (stop_killing, terminations) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
    let killer =
        tokio::spawn(terminate_backends(db.url().to_owned(), Arc::clone(&stop_killing), Arc::clone(&terminations)));
    let quota_met = wait_for(STORM_CAP, || {
        counters.acknowledged() >= STORM_APPENDS && terminations.load(Ordering::Relaxed) >= STORM_TERMINATIONS
    })
    .await;
    // The killer goes first, so the writers finish their last events in peace.
    stop_killing.store(true, Ordering::Relaxed);
    killer.await.expect("the killer");
    let reports = stop_writers(&stop, writers).await;
    let elapsed = started.elapsed();

    let audit = audit(db.url(), &reports).await;
    let terminations = terminations.load(Ordering::Relaxed);
    eprintln!(
        "termination storm: {} appends acknowledged, {terminations} backends terminated, {} retries, {} replays \
         in {elapsed:.1?}; {}",
        counters.acknowledged(),
        counters.retries.load(Ordering::Relaxed),
        counters.replayed.load(Ordering::Relaxed),
        audit.figures(),
    );
    audit.assert_clean();
    let failures = failures(&reports);
    assert!(failures.is_empty(), "{} writers failed:\n  {}", failures.len(), first(&failures));
    // Else the kills only ever met idle connections, and proved nothing.
    assert!(counters.retries.load(Ordering::Relaxed) > 0, "no append was ever interrupted");
    assert!(
        quota_met,
        "in {STORM_CAP:?} the storm reached {} of {STORM_APPENDS} appends and {terminations} of \
         {STORM_TERMINATIONS} terminations",
        counters.acknowledged()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_immediate_stop_and_restart_loses_no_acknowledged_append() {
    let (cluster, db) = private_database().await;
    slow_durable_commits(&db).await;
    let store = writers_store(db.url()).await;
    let (stop, counters) = (Arc::new(AtomicBool::new(false)), Arc::new(Counters::default()));
    let started = Instant::now();
    let writers = start_writers(&store, &stop, &counters).await;

    // A crash (no shutdown checkpoint, crash recovery at start), then an
    // orderly restart that ends every session, both under full load.
    type Fault = fn(&Cluster) -> Result<(), adk_postgres_testing::HarnessError>;
    let crash: Fault = |c| c.stop_immediate().and_then(|()| c.start());
    let restart: Fault = Cluster::restart_fast;
    let mut faults = Vec::new();
    let mut stalled = None;
    for (name, fault) in [("stop -m immediate, start", crash), ("restart -m fast", restart)] {
        let target = counters.acknowledged() + PHASE_APPENDS;
        if !wait_for(PHASE_CAP, || counters.acknowledged() >= target).await {
            stalled = Some(format!("before `{name}`"));
            break;
        }
        faults.push(format!("`{name}` at {} appends", counters.acknowledged()));
        let before = postmaster_start_time(&db).await;
        tokio::task::spawn_blocking(move || fault(cluster))
            .await
            .expect("join")
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        // Else the test would pass without having faced the fault.
        assert!(postmaster_start_time(&db).await > before, "`{name}` left the server running");
    }
    // The store must serve again after the last fault, not merely survive it.
    let target = counters.acknowledged() + PHASE_APPENDS;
    if stalled.is_none() && !wait_for(PHASE_CAP, || counters.acknowledged() >= target).await {
        stalled = Some("after the last fault".into());
    }
    let reports = stop_writers(&stop, writers).await;
    let elapsed = started.elapsed();

    let audit = audit(db.url(), &reports).await;
    eprintln!(
        "stop and restart: {} appends acknowledged, {} retries, {} replays in {elapsed:.1?}; faults: {}; {}",
        counters.acknowledged(),
        counters.retries.load(Ordering::Relaxed),
        counters.replayed.load(Ordering::Relaxed),
        faults.join(", "),
        audit.figures(),
    );
    audit.assert_clean();
    let failures = failures(&reports);
    assert!(failures.is_empty(), "{} writers failed:\n  {}", failures.len(), first(&failures));
    assert!(counters.retries.load(Ordering::Relaxed) > 0, "no append was ever interrupted");
    if let Some(when) = stalled {
        panic!("the writers stalled {when}, at {} appends", counters.acknowledged());
    }
}

async fn postmaster_start_time(db: &TestDatabase) -> chrono::DateTime<chrono::Utc> {
    db.connect().await.query_one("SELECT pg_postmaster_start_time()", &[]).await.expect("start time").get(0)
}

/// Refuses, at commit, any write to a session whose id is listed in
/// `ack_test_refused`: a deferred constraint trigger runs after the write's
/// statement produced its row, so the row is on its way to the client when
/// the transaction fails.
const REFUSE_AT_COMMIT: &str = r#"
CREATE TABLE ack_test_refused (session_id text PRIMARY KEY);
CREATE FUNCTION ack_test_refuse_at_commit() RETURNS trigger LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    target text;
BEGIN
    IF TG_OP = 'DELETE' THEN target := OLD.session_id; ELSE target := NEW.session_id; END IF;
    IF EXISTS (SELECT FROM ack_test_refused r WHERE r.session_id = target) THEN
        RAISE EXCEPTION 'ack test: refused at commit';
    END IF;
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER ack_test_refuse_at_commit AFTER INSERT OR UPDATE OR DELETE ON adk_sessions
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION ack_test_refuse_at_commit();
"#;

/// The commit's own error is what the caller must be told: not a success,
/// nor a consequence of a success that never happened. Wrong answers are
/// collected so one run names every write path that gets it wrong.
fn check_refused<T>(wrong: &mut Vec<String>, what: &str, result: Result<T, StoreError>) {
    match result {
        Err(StoreError::Database { message }) if message.contains("refused at commit") => {}
        Err(other) => wrong.push(format!("{what} failed at commit, yet the store answered Err({other:?})")),
        Ok(_) => wrong.push(format!("{what} failed at commit, yet the store acknowledged it (Ok)")),
    }
}

fn check_unchanged<T: PartialEq + std::fmt::Debug>(wrong: &mut Vec<String>, what: &str, actual: T, expected: T) {
    if actual != expected {
        wrong.push(format!("{what}: the database holds {actual:?}, not {expected:?}"));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_write_refused_at_commit_is_never_acknowledged() {
    let db = test_database().await;
    let sql = db.connect().await;
    sql.batch_execute(REFUSE_AT_COMMIT).await.expect("the refusing trigger");
    let store = store(db.url()).await;
    let (app, user) = (AppName::new(APP).expect("app"), UserId::new("refused").expect("user"));
    let refuse = |id: &'static str| {
        let sql = &sql;
        async move { sql.execute("INSERT INTO ack_test_refused VALUES ($1)", &[&id]).await.expect("refuse") }
    };
    let sessions_of_user = || {
        let sql = &sql;
        async move {
            sql.query_one("SELECT count(*) FROM adk_sessions WHERE user_id = 'refused'", &[])
                .await
                .expect("count")
                .get::<_, i64>(0)
        }
    };
    // (last_seq, closed, events stored) of a session that must still exist.
    let session_row = |id: &'static str| {
        let sql = &sql;
        async move {
            let row = sql
                .query_one(
                    "SELECT s.last_seq, s.closed_at IS NOT NULL, \
                            (SELECT count(*) FROM adk_events e WHERE e.session_id = s.session_id) \
                     FROM adk_sessions s WHERE s.session_id = $1",
                    &[&id],
                )
                .await
                .expect("the session is still there");
            (row.get::<_, i64>(0), row.get::<_, bool>(1), row.get::<_, i64>(2))
        }
    };
    let mut wrong = Vec::new();

    refuse("refused-create").await;
    let created = store.create(CreateSession::new(app.clone(), user.clone()).with_id("refused-create")).await;
    check_refused(&mut wrong, "create", created);
    check_unchanged(&mut wrong, "after the refused create, sessions", sessions_of_user().await, 0);

    let key = store.create(CreateSession::new(app, user).with_id("refused")).await.expect("create").key;
    for _ in 0..2 {
        store.append(&key, Event::new("agent"), AppendOptions::default()).await.expect("append before the refusal");
    }
    refuse("refused").await;
    let before = (2, false, 2);

    let mut event = Event::new("agent");
    event.actions.state_delta.insert("user:refused".into(), json!(true));
    check_refused(&mut wrong, "append", store.append(&key, event.clone(), AppendOptions::default()).await);
    check_unchanged(&mut wrong, "after the refused append, the session", session_row("refused").await, before);
    check_refused(&mut wrong, "rewind", store.rewind(&key, 1, None).await);
    check_unchanged(&mut wrong, "after the refused rewind, the session", session_row("refused").await, before);
    let rolled = store.rollover(&key, Some("successor".into()), Event::new("summary")).await;
    check_refused(&mut wrong, "rollover", rolled);
    check_unchanged(&mut wrong, "after the refused rollover, the session", session_row("refused").await, before);
    check_unchanged(&mut wrong, "after the refused rollover, sessions", sessions_of_user().await, 1);
    check_refused(&mut wrong, "delete", store.delete(&key).await);
    check_unchanged(&mut wrong, "after the refused delete, the session", session_row("refused").await, before);
    assert!(wrong.is_empty(), "{} wrong answers:\n  {}", wrong.len(), wrong.join("\n  "));

    // Once the refusal is lifted the very same append goes through: it was
    // the commit, nothing before it, that had failed.
    sql.execute("DELETE FROM ack_test_refused", &[]).await.expect("lift the refusal");
    let appended = store.append(&key, event, AppendOptions::default()).await.expect("the retried append");
    assert_eq!((appended.seq, appended.replayed), (Some(3), false));
    let session = store.get(&key, GetOptions::default()).await.expect("get");
    assert_eq!(session.state.get("user:refused"), Some(&json!(true)));
}
