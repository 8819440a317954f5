//! The store behind a real PgBouncer in transaction mode, with fewer server
//! connections (`default_pool_size` 4, or 1) than the store's own pool
//! (16), so consecutive statements of one store connection land on
//! different server connections and server connections pass from client
//! to client between transactions. Pinned here:
//!
//! - the whole conformance suite holds through the pooler;
//! - a crowd of 200 writers through it loses, duplicates and reorders
//!   nothing, and never sees a prepared-statement error;
//! - nothing the store does outlives its transaction on a server
//!   connection: no setting, no tenant, no direct-session mark, no
//!   prepared statement reaches the pooler's next client;
//! - the change feed refuses a pooled URL at once with a typed error
//!   naming the URL's field, and works given a direct URL;
//! - a pooler that refuses startup options is detected, and one that drops
//!   them silently still serves the store but not the feed;
//! - health says whether it was read through a pooler;
//! - neither a refused feed nor health leaves a setting or a prepared
//!   statement on the pooler's server connection.
//!
//! PgBouncer 1.18 is what the harness runs: it refuses the `options`
//! startup parameter unless told to ignore it, and has no support for
//! named prepared statements in transaction mode.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use adk_postgres_connect::ConnectConfig;
use adk_postgres_domain::{
    AppName, AppendOptions, CreateSession, Event, GetOptions, ListSessions, SessionKey, SessionMetadata, SessionStore,
    StoreConfig, StoreError, UserId,
};
use adk_postgres_retention::{HealthThresholds, RetentionError, health};
use adk_postgres_storage::tenancy::AppBinding;
use adk_postgres_storage::{AppNotice, PgSessionStore, PoolConfig, TenantScope};
use adk_postgres_testing::{PgBouncer, PgBouncerConfig, TestDatabase, test_database};
use adk_postgres_tests::conformance::StoreFactory;
use adk_postgres_tests::pg::{client, new_session, service_role, store, with_delta};
use diesel::QueryableByName;
use diesel::sql_types::{Integer, Text};
use serde_json::json;
use tokio::sync::OnceCell;
use tokio::task::JoinSet;

/// How long a refused change feed may take to say so. A feed that tried to
/// LISTEN through the pooler would instead wait for notices that never
/// come, so anything near this bound is a hang in disguise.
const FAIL_FAST: Duration = Duration::from_secs(5);

// ---------------------------------------------------------------------------
// the pooler

/// The shared server's port on 127.0.0.1 and the harness's superuser, read
/// from a database's URL (the same server as `ADK_PG_TEST_URL`'s).
fn server_of(db: &TestDatabase) -> (u16, String) {
    let url = url::Url::parse(db.url()).expect("test database URL");
    let port = url.port().unwrap_or(5432);
    let user = match url.username() {
        "" => "postgres".to_owned(),
        user => user.to_owned(),
    };
    (port, user)
}

/// PgBouncer in front of `db`'s server, letting in the harness's superuser
/// and `extra_users`, as `tweak` configures it.
async fn start_bouncer(db: &TestDatabase, extra_users: &[&str], tweak: impl FnOnce(&mut PgBouncerConfig)) -> PgBouncer {
    let (port, superuser) = server_of(db);
    let mut config = PgBouncerConfig::new(port);
    config.users = std::iter::once(superuser).chain(extra_users.iter().map(|u| (*u).to_owned())).collect();
    tweak(&mut config);
    // Starting it waits on its port with blocking sleeps.
    tokio::task::spawn_blocking(move || PgBouncer::start(&config))
        .await
        .expect("starting PgBouncer panicked")
        .unwrap_or_else(|e| panic!("starting PgBouncer: {e}"))
}

/// The test process's PgBouncer with the default configuration
/// (transaction mode, 4 server connections per database and user, startup
/// options refused). nextest runs each test in a process of its own, so
/// each test gets a fresh one; its watchdog ends it with the process.
async fn bouncer(db: &TestDatabase) -> &'static PgBouncer {
    static BOUNCER: OnceCell<PgBouncer> = OnceCell::const_new();
    BOUNCER.get_or_init(|| start_bouncer(db, &[], |_| {})).await
}

/// `db` through the process's PgBouncer, as the harness's superuser.
async fn pooled_url(db: &TestDatabase) -> String {
    let (_, superuser) = server_of(db);
    bouncer(db).await.url_for(db.name(), &superuser)
}

/// A store on `url`, which must go through a pooler that refuses startup
/// options: checked, so that no test here passes by reaching the server
/// directly.
async fn pooled_store(url: &str, pool: &PoolConfig, config: StoreConfig) -> PgSessionStore {
    assert!(
        pool.max_size > PgBouncerConfig::new(0).default_pool_size,
        "the store must have more connections than the pooler has server connections"
    );
    let store = PgSessionStore::connect(url, pool, config)
        .await
        .unwrap_or_else(|e| panic!("connecting the store through PgBouncer ({url}): {e}"));
    assert!(store.pool().connect_config().pooler_refused_settings(), "{url} did not go through PgBouncer");
    store
}

// ---------------------------------------------------------------------------
// what a session carries

/// The settings a client's statement sees on the server connection it
/// reached, and which one that was.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SessionView {
    statement_timeout: String,
    lock_timeout: String,
    idle_in_transaction_session_timeout: String,
    time_zone: String,
    search_path: String,
    /// `current_setting(…, true)`: NULL when never set on the connection,
    /// `''` once a transaction-local value has ended. Both are "unset".
    app_name: Option<String>,
    direct_session: Option<String>,
    prepared_statements: i64,
    backend_pid: i32,
}

impl SessionView {
    /// The same view with the backend left out, for comparing two sessions.
    fn settings(&self) -> Self {
        Self {
            app_name: self.app_name.clone().filter(|v| !v.is_empty()),
            direct_session: self.direct_session.clone().filter(|v| !v.is_empty()),
            backend_pid: 0,
            ..self.clone()
        }
    }
}

/// One statement, so all of it is read on one server connection even
/// through a transaction pooler; sent as a simple query, so the check does
/// not leave a prepared statement of its own.
const VIEW: &str = "SELECT current_setting('statement_timeout'), current_setting('lock_timeout'), \
     current_setting('idle_in_transaction_session_timeout'), current_setting('TimeZone'), \
     current_setting('search_path'), current_setting('adk.app_name', true), \
     current_setting('adk.direct_session', true), \
     (SELECT count(*) FROM pg_prepared_statements)::text, pg_backend_pid()::text";

/// What a plain client sees on `url`: a client that sends no startup
/// options and sets nothing, so whatever it sees beyond the server's and
/// role's defaults was left behind by another client.
async fn plain_view(url: &str) -> SessionView {
    let sql = ConnectConfig::from_url(url)
        .expect("URL")
        .client()
        .await
        .unwrap_or_else(|e| panic!("a plain client on {url}: {e}"));
    let messages = sql.simple_query(VIEW).await.unwrap_or_else(|e| panic!("reading settings on {url}: {e}"));
    let row = messages
        .iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(row) => Some(row),
            _ => None,
        })
        .expect("one row");
    let text = |i: usize| row.get(i).map(str::to_owned);
    let required = |i: usize| text(i).unwrap_or_else(|| panic!("column {i} is NULL"));
    SessionView {
        statement_timeout: required(0),
        lock_timeout: required(1),
        idle_in_transaction_session_timeout: required(2),
        time_zone: required(3),
        search_path: required(4),
        app_name: text(5),
        direct_session: text(6),
        prepared_statements: required(7).parse().expect("a count"),
        backend_pid: required(8).parse().expect("a pid"),
    }
}

#[derive(Debug, QueryableByName)]
struct StoreSide {
    #[diesel(sql_type = Integer)]
    pid: i32,
    #[diesel(sql_type = Text)]
    statement_timeout: String,
}

/// The server connection a statement on the store's own pool reaches, and
/// the statement timeout it runs under there.
async fn store_side(store: &PgSessionStore) -> StoreSide {
    let mut conn = store.pool().get().await.expect("a store connection");
    let query =
        diesel::sql_query("SELECT pg_backend_pid() AS pid, current_setting('statement_timeout') AS statement_timeout");
    let mut rows: Vec<StoreSide> = conn.load(&query).await.expect("a raw query on the store's connection");
    rows.pop().expect("one row")
}

/// Store work that touches every kind of statement the store sends: create
/// (with app and user state), append, get, list, find, metadata, rewind,
/// fork, rollover, delete, erase, and a refused change feed; the appends
/// at once, so several of the store's connections take turns on the
/// server connection.
async fn exercise(store: &PgSessionStore, app: &str) {
    let app = AppName::new(app).expect("app");
    let user = UserId::new(format!("leak-{}", uuid::Uuid::new_v4().simple())).expect("user");
    let mut keys = Vec::new();
    for i in 0..3 {
        let request = CreateSession::new(app.clone(), user.clone()).with_id(format!("s{i}")).with_state(
            json!({"user:plan": "pro", "app:motd": "hi", "topic": i}).as_object().cloned().expect("object"),
        );
        keys.push(store.create(request).await.expect("create through the pooler").key);
    }
    let mut writers = JoinSet::new();
    for (w, key) in keys.iter().cycle().take(12).enumerate() {
        let (store, key) = (store.clone(), key.clone());
        writers.spawn(async move {
            store.append(&key, with_delta(json!({"w": w})), AppendOptions::default()).await.expect("append")
        });
    }
    while let Some(done) = writers.join_next().await {
        done.expect("writer");
    }
    for key in &keys {
        let session = store.get(key, GetOptions::default()).await.expect("get");
        assert_eq!(session.events.len(), 4, "{key}");
    }
    let page = store.list(&ListSessions::new(app.clone(), user.clone())).await.expect("list");
    assert_eq!(page.sessions.len(), 3);
    let found = store.find_by_id(&keys[0].session_id, 10).await.expect("find_by_id");
    assert!(found.contains(&keys[0]), "{found:?}");
    let metadata = SessionMetadata { display_name: Some("renamed".into()), ..SessionMetadata::default() };
    store.set_metadata(&keys[0], metadata).await.expect("set_metadata");
    store.rewind(&keys[1], 2, Some(4)).await.expect("rewind");
    store.fork(&keys[2], 2, None).await.expect("fork");
    store.rollover(&keys[2], None, Event::new("agent")).await.expect("rollover");
    store.delete(&keys[0]).await.expect("delete");
    let refused = store.watch(&keys[1], 0).await;
    assert!(matches!(&refused, Err(StoreError::InvalidInput { field, .. }) if field == "database_url"), "{refused:?}");
    store.erase_user(&app, &user).await.expect("erase_user");
}

// ---------------------------------------------------------------------------
// the conformance suite

/// Every store a case asks for is a pool through the process's PgBouncer,
/// on one database per test. Cases that look behind the store open their
/// raw clients on the database directly, which is fine: only the store has
/// to get through the pooler.
#[derive(Debug, Default)]
struct ThroughPgBouncer {
    db: OnceCell<TestDatabase>,
}

impl StoreFactory for ThroughPgBouncer {
    async fn store(&self, config: StoreConfig) -> Arc<dyn SessionStore> {
        let db = self.db.get_or_init(test_database).await;
        let url = pooled_url(db).await;
        Arc::new(pooled_store(&url, &PoolConfig::default(), config).await)
    }
}

mod conformance_through_pgbouncer {
    use super::ThroughPgBouncer;

    adk_postgres_tests::conformance_tests!(ThroughPgBouncer::default());
}

// ---------------------------------------------------------------------------
// a crowd

const WRITERS: usize = 200;
const APPENDS_PER_WRITER: usize = 20;
/// Writers below this share their session with two others; the rest all
/// write to one hot session.
const SPREAD_WRITERS: usize = 150;
const WRITERS_PER_SESSION: usize = 3;
const MAX_ATTEMPTS: usize = 200;

/// What one writer saw.
#[derive(Debug, Default)]
struct WriterLog {
    /// (session, event id, seq) of every acknowledged append.
    acknowledged: Vec<(SessionKey, String, u64)>,
    retryable: Vec<String>,
    fatal: Vec<String>,
    /// Acknowledgements of a retry that found its event already stored.
    replayed: usize,
}

async fn write_until_stored(store: &PgSessionStore, key: &SessionKey, event: Event, log: &mut WriterLog) {
    for attempt in 1..=MAX_ATTEMPTS {
        // The same event, id and all, on every attempt: a retry of an
        // append that committed unseen is a replay, never a second copy.
        match store.append(key, event.clone(), AppendOptions::default()).await {
            Ok(appended) => {
                let seq = appended.seq.expect("a stored event has a seq");
                log.replayed += usize::from(appended.replayed);
                log.acknowledged.push((key.clone(), event.id.clone(), seq));
                return;
            }
            Err(e) if e.is_retryable() => {
                log.retryable.push(format!("{}: {e}", e.kind()));
                let pause = Duration::from_millis(5 * u64::try_from(attempt.min(20)).unwrap_or(20));
                tokio::time::sleep(pause).await;
            }
            Err(e) => {
                log.fatal.push(format!("{}: {e}", e.kind()));
                return;
            }
        }
    }
    log.fatal.push(format!("still retryable after {MAX_ATTEMPTS} attempts"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hundred_writers_through_pgbouncer_store_every_acknowledged_event_exactly_once_without_gaps() {
    let db = test_database().await;
    let url = pooled_url(&db).await;
    let store = pooled_store(&url, &PoolConfig::default(), StoreConfig::default()).await;
    let app = format!("crowd-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let spread_sessions = SPREAD_WRITERS / WRITERS_PER_SESSION;
    let mut keys = Vec::new();
    for s in 0..=spread_sessions {
        keys.push(new_session(&store, &app, &format!("user-{s}")).await);
    }
    let hot = keys[spread_sessions].clone();

    let started = Instant::now();
    let mut writers = JoinSet::new();
    for w in 0..WRITERS {
        let key = if w < SPREAD_WRITERS { keys[w % spread_sessions].clone() } else { hot.clone() };
        let store = store.clone();
        writers.spawn(async move {
            let mut log = WriterLog::default();
            for n in 0..APPENDS_PER_WRITER {
                write_until_stored(&store, &key, with_delta(json!({"writer": w, "n": n})), &mut log).await;
            }
            log
        });
    }
    let mut acknowledged = Vec::new();
    let (mut retryable, mut fatal, mut replayed) = (Vec::new(), Vec::new(), 0);
    while let Some(log) = writers.join_next().await {
        let log = log.expect("writer task");
        acknowledged.extend(log.acknowledged);
        retryable.extend(log.retryable);
        fatal.extend(log.fatal);
        replayed += log.replayed;
    }
    let took = started.elapsed();
    // The premise: more client connections than server connections.
    let store_connections = store.pool().state().connections;
    let mut kinds = BTreeMap::<String, usize>::new();
    for error in &retryable {
        *kinds.entry(error.split(':').next().unwrap_or_default().to_owned()).or_default() += 1;
    }
    eprintln!(
        "crowd through PgBouncer (default_pool_size {}, {store_connections} store connections): {WRITERS} writers, \
         {} sessions ({} writers on the hot one), {} appends acknowledged in {took:.2?} ({:.0}/s); \
         {} retryable errors {kinds:?}, {replayed} replayed acknowledgements, {} non-retryable",
        PgBouncerConfig::new(0).default_pool_size,
        keys.len(),
        WRITERS - SPREAD_WRITERS,
        acknowledged.len(),
        acknowledged.len() as f64 / took.as_secs_f64(),
        retryable.len(),
        fatal.len(),
    );

    let every_error = retryable.iter().chain(&fatal);
    let prepared: Vec<_> = every_error.filter(|e| e.contains("prepared statement")).collect();
    assert!(prepared.is_empty(), "prepared-statement errors through the pooler: {prepared:?}");
    assert!(fatal.is_empty(), "{} non-retryable errors, e.g. {:?}", fatal.len(), &fatal[..fatal.len().min(5)]);
    assert_eq!(acknowledged.len(), WRITERS * APPENDS_PER_WRITER, "every append was acknowledged");

    // The table, read directly, is the truth.
    let sql = client(db.url()).await;
    let backends: i64 = sql
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND backend_type = 'client backend' AND pid <> pg_backend_pid()",
            &[],
        )
        .await
        .expect("pg_stat_activity")
        .get(0);
    let server_connections = i64::from(PgBouncerConfig::new(0).default_pool_size);
    assert!(backends <= server_connections, "{backends} server connections behind the pooler");
    assert!(
        i64::from(store_connections) > server_connections,
        "the store used {store_connections} connections, not more than the pooler's {server_connections}"
    );
    let rows = sql
        .query(
            "SELECT user_id, session_id, seq, event_id FROM adk_events WHERE app_name = $1 ORDER BY user_id, seq",
            &[&app],
        )
        .await
        .expect("read the events");
    let mut stored: BTreeMap<(String, String), Vec<(i64, String)>> = BTreeMap::new();
    for row in &rows {
        stored.entry((row.get(0), row.get(1))).or_default().push((row.get(2), row.get(3)));
    }
    let mut expected: BTreeMap<(String, String), BTreeMap<String, u64>> = BTreeMap::new();
    for (key, id, seq) in &acknowledged {
        let ids = expected.entry((key.user_id.to_string(), key.session_id.to_string())).or_default();
        assert!(ids.insert(id.clone(), *seq).is_none(), "event {id} acknowledged twice in {key}");
    }
    assert_eq!(rows.len(), acknowledged.len(), "stored events vs acknowledged ones");
    assert_eq!(stored.len(), keys.len(), "every session has events");
    for (session, events) in &stored {
        let seqs: Vec<i64> = events.iter().map(|(seq, _)| *seq).collect();
        let gapless: Vec<i64> = (1..=i64::try_from(events.len()).expect("count")).collect();
        assert_eq!(seqs, gapless, "seqs of {session:?} are not 1..=n");
        let ids: BTreeSet<&String> = events.iter().map(|(_, id)| id).collect();
        assert_eq!(ids.len(), events.len(), "an event stored twice in {session:?}");
        let acked = &expected[session];
        for (seq, id) in events {
            let acked_seq =
                acked.get(id).unwrap_or_else(|| panic!("{id} stored in {session:?} but never acknowledged"));
            assert_eq!(i64::try_from(*acked_seq).expect("seq"), *seq, "{id} acknowledged with another seq");
        }
    }
    let hot_events = stored[&(hot.user_id.to_string(), hot.session_id.to_string())].len();
    assert_eq!(hot_events, (WRITERS - SPREAD_WRITERS) * APPENDS_PER_WRITER);
    // And the store, through the pooler, agrees.
    for key in &keys {
        let session = store.get(key, GetOptions::default()).await.expect("get through the pooler");
        assert_eq!(session.version as usize, session.events.len(), "{key}");
        assert_eq!(session.events.len(), stored[&(key.user_id.to_string(), key.session_id.to_string())].len(), "{key}");
    }
    let log = bouncer(&db).await.log_tail();
    assert!(!log.contains("prepared statement"), "PgBouncer logged a prepared-statement error:\n{log}");
}

// ---------------------------------------------------------------------------
// nothing left behind

/// Timeouts no server, database or role has by default, so a connect-time
/// `SET` of the store's own values would stand out on the next client.
fn telltale_pool() -> PoolConfig {
    PoolConfig {
        statement_timeout: Duration::from_millis(23_456),
        lock_timeout: Duration::from_millis(7_654),
        idle_in_transaction_session_timeout: Duration::from_millis(54_321),
        ..PoolConfig::default()
    }
}

/// Asserts that a plain client on `pooled` (through a pooler with one
/// server connection for its user) reaches the server connection the store
/// used (`store_pid`) and finds on it exactly what a plain client on
/// `direct` finds on a fresh session of the same user.
async fn assert_nothing_left(pooled: &str, direct: &str, store_pid: i32, what: &str) {
    let fresh = plain_view(direct).await;
    let after = plain_view(pooled).await;
    // With one server connection per database and user, the plain client
    // is on the very backend the store's statements ran on; a leak cannot
    // hide on a server connection the check never reaches.
    assert_eq!(after.backend_pid, store_pid, "{what}: the plain client is not on the store's server connection");
    assert_eq!(after.settings(), fresh.settings(), "{what}: a setting outlived its client on the server connection");
    assert_eq!(after.prepared_statements, 0, "{what}: prepared statements left on the server connection");
    assert_eq!(after.app_name.filter(|v| !v.is_empty()), None, "{what}: a tenant left on the server connection");
    assert_eq!(after.direct_session.filter(|v| !v.is_empty()), None, "{what}: a direct-session mark");
    // Would a leaked connect-time SET show? Only if the defaults differ
    // from what the store would set.
    let pool = telltale_pool();
    for (default, store_value) in [
        (&fresh.statement_timeout, pool.statement_timeout),
        (&fresh.lock_timeout, pool.lock_timeout),
        (&fresh.idle_in_transaction_session_timeout, pool.idle_in_transaction_session_timeout),
    ] {
        assert_ne!(*default, format!("{}ms", store_value.as_millis()), "{what}: the default hides a leak");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nothing_the_store_does_outlives_its_transaction_on_a_shared_server_connection() {
    let db = test_database().await;
    let (_, superuser) = server_of(&db);
    let (role, role_direct) = service_role(db.url(), "adk_pooler", AppBinding::AllApps).await;
    // One server connection per database and user: every client of a user
    // takes turns on the same backend, so whatever one leaves behind the
    // next one gets.
    let bouncer = start_bouncer(&db, &[&role], |config| config.default_pool_size = 1).await;
    let owner_pooled = bouncer.url_for(db.name(), &superuser);
    let role_pooled = bouncer.url_for(db.name(), &role);

    // A bound service role acting per request, as production runs it.
    let tenant = pooled_store(&role_pooled, &telltale_pool(), StoreConfig::default())
        .await
        .with_tenant_scope(TenantScope::PerRequest);
    exercise(&tenant, "leak-per-request").await;
    let tenant_side = store_side(&tenant).await;
    drop(tenant);
    assert_nothing_left(&role_pooled, &role_direct, tenant_side.pid, "service role, per-request tenant").await;
    // The role's defaults (from `adk-pg service-role`) are what its
    // sessions run under, not the store's refused startup options.
    assert_eq!(tenant_side.statement_timeout, "25s", "the role's default, not the store's 23456ms");

    // The owner, acting for one fixed app.
    let fixed = AppName::new("leak-fixed").expect("app");
    let owner = pooled_store(&owner_pooled, &telltale_pool(), StoreConfig::default())
        .await
        .with_tenant_scope(TenantScope::Fixed(fixed.clone()));
    exercise(&owner, fixed.as_str()).await;
    let owner_side = store_side(&owner).await;
    assert_ne!(owner_side.pid, tenant_side.pid, "each user has a server connection of its own");
    drop(owner);
    assert_nothing_left(&owner_pooled, db.url(), owner_side.pid, "owner, fixed tenant").await;
}

/// How often the two checks below repeat. What a diesel connection leaves
/// on a server connection reaches the next client only when it hung up
/// cleanly: PgBouncer discards a server connection whose client went away
/// in the middle of an exchange, leak and all, and most rounds end that
/// way (here one in ten to one in twenty ends cleanly). Two hundred
/// rounds see a leak almost surely, and never one when nothing leaks.
const ROUNDS: usize = 200;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_change_feed_refused_behind_a_pooler_dropping_options_leaves_nothing_on_the_server_connection() {
    let db = test_database().await;
    let (_, superuser) = server_of(&db);
    // The feed only gets as far as a query of its own (the direct-session
    // check) when the pooler took the packet and dropped the options.
    let bouncer = start_bouncer(&db, &[], |config| {
        config.default_pool_size = 1;
        config.ignore_startup_parameters = vec!["options".into()];
    })
    .await;
    let url = bouncer.url_for(db.name(), &superuser);
    let store = PgSessionStore::connect(&url, &PoolConfig::default(), StoreConfig::default()).await.expect("store");
    store.set_change_feed(true).await.expect("the owner's switch");
    let key = new_session(&store, "dropping", "u").await;
    let fresh = plain_view(db.url()).await.settings();
    for round in 1..=ROUNDS {
        let refused = store.watch(&key, 0).await;
        assert!(
            matches!(&refused, Err(StoreError::InvalidInput { field, .. }) if field == "database_url"),
            "{refused:?}"
        );
        let after = plain_view(&url).await.settings();
        assert_eq!(after, fresh, "round {round}: the refused feed left this on the pooler's server connection");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn health_through_a_pooler_leaves_nothing_on_the_server_connection() {
    let db = test_database().await;
    let (_, superuser) = server_of(&db);
    let bouncer = start_bouncer(&db, &[], |config| config.default_pool_size = 1).await;
    let url = bouncer.url_for(db.name(), &superuser);
    let fresh = plain_view(db.url()).await.settings();
    let today = chrono::Utc::now().date_naive();
    for round in 1..=ROUNDS {
        // Whether health answers through a pooler or refuses it is pinned
        // by the test below; either way the pooler's next client must find
        // the server connection as it was.
        match health(&url, today, &HealthThresholds::default()).await {
            Ok(report) => assert!(report.through_pooler, "round {round}"),
            Err(RetentionError::Connect(refused)) if refused.to_string().contains("connection pooler") => {}
            Err(other) => panic!("round {round}: health through PgBouncer: {other}"),
        }
        let after = plain_view(&url).await.settings();
        assert_eq!(after, fresh, "round {round}: health left this on the pooler's server connection");
    }
}

// ---------------------------------------------------------------------------
// the change feed

/// Awaits `call`, which must refuse at once with `InvalidInput` naming
/// `field`, and says how long it took.
async fn refused_fast<T: std::fmt::Debug>(call: impl Future<Output = Result<T, StoreError>>, field: &str, what: &str) {
    let started = Instant::now();
    let outcome = tokio::time::timeout(FAIL_FAST * 4, call).await;
    let took = started.elapsed();
    match outcome {
        Err(_) => panic!("{what}: no answer in {:?}: the feed hangs instead of refusing", FAIL_FAST * 4),
        Ok(Err(StoreError::InvalidInput { field: named, reason })) => {
            assert_eq!(named, field, "{what}: {reason}");
            assert!(reason.contains("pooler") && reason.contains("change_feed_url"), "{what}: {reason}");
        }
        Ok(other) => panic!("{what}: expected InvalidInput({field}), got {other:?}"),
    }
    assert!(took < FAIL_FAST, "{what}: refused only after {took:?}");
    eprintln!("{what}: refused in {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_change_feed_refuses_a_pooled_url_at_once_and_works_through_a_direct_one() {
    let db = test_database().await;
    let url = pooled_url(&db).await;
    let store = pooled_store(&url, &PoolConfig::default(), StoreConfig::default()).await;
    // The owner's switch is one statement: it works through the pooler.
    store.set_change_feed(true).await.expect("switch the change feed on as the owner");
    let app = AppName::new("feed").expect("app");
    let key = new_session(&store, app.as_str(), "u").await;

    refused_fast(store.watch(&key, 0), "database_url", "watch through PgBouncer").await;
    refused_fast(store.watch_app(&app), "database_url", "watch_app through PgBouncer").await;
    // A "direct" URL that is not: named as the feed's own field.
    let mislabelled = store.clone().with_change_feed_url(&url).expect("a valid URL");
    refused_fast(mislabelled.watch(&key, 0), "change_feed_url", "change_feed_url through PgBouncer").await;

    let direct = store.clone().with_change_feed_url(db.url()).expect("the direct URL");
    let mut events = direct.watch(&key, 0).await.expect("watch through the direct URL");
    let mut notices = direct.watch_app(&app).await.expect("watch_app through the direct URL");
    let mut appended = Vec::new();
    for n in 0..5 {
        // Written through the pooler, heard through the direct session.
        let event = with_delta(json!({"n": n}));
        appended.push(event.id.clone());
        store.append(&key, event, AppendOptions::default()).await.expect("append through the pooler");
    }
    for (i, id) in appended.iter().enumerate() {
        let next = tokio::time::timeout(Duration::from_secs(10), events.recv()).await.expect("an event within 10 s");
        let (seq, event) = next.expect("the feed goes on").expect("an event");
        assert_eq!((seq, &event.id), (u64::try_from(i).expect("seq") + 1, id));
    }
    let mut heard = Vec::new();
    while heard.len() < appended.len() {
        let next = tokio::time::timeout(Duration::from_secs(10), notices.recv()).await.expect("a notice within 10 s");
        match next.expect("the app feed goes on").expect("a notice") {
            AppNotice::EventAppended { key: noticed, seq } if noticed == key => heard.push(seq),
            _ => {}
        }
    }
    assert_eq!(heard, vec![1, 2, 3, 4, 5]);
}

// ---------------------------------------------------------------------------
// startup options refused, or dropped

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pooler_refusing_startup_options_is_detected_and_one_dropping_them_still_fails_the_feed() {
    let db = test_database().await;
    let direct = store(db.url()).await;
    assert!(!direct.pool().connect_config().pooler_refused_settings(), "a direct connection takes startup options");
    assert_eq!(
        store_side(&direct).await.statement_timeout,
        "25s",
        "the store's own statement_timeout, sent at startup"
    );

    let refusing = PgSessionStore::connect(&pooled_url(&db).await, &PoolConfig::default(), StoreConfig::default())
        .await
        .expect("the store connects through PgBouncer without its startup options");
    assert!(refusing.pool().connect_config().pooler_refused_settings(), "PgBouncer refused the startup options");

    // Told to ignore `options`, PgBouncer accepts the packet and drops them
    // without a word: nothing tells the client, so only the missing mark
    // on the server session can.
    let dropping = start_bouncer(&db, &[], |config| config.ignore_startup_parameters = vec!["options".into()]).await;
    let (_, superuser) = server_of(&db);
    let dropping_url = dropping.url_for(db.name(), &superuser);
    let store = PgSessionStore::connect(&dropping_url, &PoolConfig::default(), StoreConfig::default())
        .await
        .expect("the store connects through a PgBouncer that drops startup options");
    assert!(!store.pool().connect_config().pooler_refused_settings(), "nothing was refused");
    let fresh_default = plain_view(db.url()).await.statement_timeout;
    assert_eq!(store_side(&store).await.statement_timeout, fresh_default, "the options were dropped, not applied");
    let key = new_session(&store, "dropping", "u").await;
    for n in 0..3 {
        store.append(&key, with_delta(json!({"n": n})), AppendOptions::default()).await.expect("append");
    }
    let session = store.get(&key, GetOptions::default()).await.expect("get");
    assert_eq!((session.version, session.state.get("n")), (3, Some(&json!(2))));
    store.set_change_feed(true).await.expect("the owner's switch");
    refused_fast(store.watch(&key, 0), "database_url", "watch through a PgBouncer dropping options").await;
    refused_fast(store.watch_app(&key.app_name), "database_url", "watch_app through a PgBouncer dropping options")
        .await;
}

// ---------------------------------------------------------------------------
// health

/// `adk-pg status` (and every operator connection) sets session timeouts
/// and prepares statements, which a pooler would hand to its next client,
/// so through one it refuses at once, saying why; direct, it reports its
/// connection as direct.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn health_refuses_a_pooled_url_saying_so_and_reports_a_direct_one() {
    let db = test_database().await;
    let today = chrono::Utc::now().date_naive();
    let started = Instant::now();
    let pooled = health(&pooled_url(&db).await, today, &HealthThresholds::default()).await;
    let error = pooled.expect_err("health through PgBouncer is refused").to_string();
    assert!(error.contains("connection pooler"), "{error}");
    assert!(started.elapsed() < Duration::from_secs(5), "refused at once");
    let direct = health(db.url(), today, &HealthThresholds::default()).await.expect("health, direct");
    assert!(!direct.through_pooler, "health on a direct connection");
}
