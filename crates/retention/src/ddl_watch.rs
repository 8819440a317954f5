//! Long DDL on the working connection, watched from a second one: the
//! concurrent build of one index (conversion and index builds both need it)
//! and constraint validation. A statement in flight keeps its own
//! connection busy, so its progress can only be read from another.

use std::time::{Duration, Instant};

use adk_postgres_schema::quote::quote_ident;
use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Integer, Nullable, Text};
use diesel_async::{AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use serde::Serialize;

use crate::RetentionError;
use crate::catalog::index_info;
use adk_postgres_operations::{LockPolicy, LockRetry, connect, ddl, first_row};

/// How often a running build or validation is looked at.
const POLL_INTERVAL: Duration = Duration::from_millis(200);

/// A snapshot of `pg_stat_progress_create_index` for one build.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BuildProgress {
    /// e.g. `building index: scanning table`, `waiting for old snapshots`.
    pub phase: String,
    /// Blocks processed in this phase.
    pub blocks_done: i64,
    /// Blocks this phase will process; 0 when the phase does not count them.
    pub blocks_total: i64,
    /// Tuples processed in this phase.
    pub tuples_done: i64,
    /// Tuples this phase will process; 0 when the phase does not count them.
    pub tuples_total: i64,
}

#[derive(QueryableByName)]
struct PidRow {
    #[diesel(sql_type = Integer)]
    pid: i32,
}

/// The server process of `conn`, as `pg_stat_*` views know it.
pub(crate) async fn backend_pid(conn: &mut AsyncPgConnection) -> Result<i32, RetentionError> {
    Ok(diesel::sql_query("SELECT pg_backend_pid() AS pid")
        .load::<PidRow>(conn)
        .await
        .and_then(first_row)
        .map_err(RetentionError::query("read the backend pid"))?
        .pid)
}

/// What to sample while a statement runs.
#[derive(Debug, Clone, Copy)]
enum Watch {
    /// `pg_stat_progress_create_index`.
    IndexBuild,
    /// `pg_stat_activity` (validation scans have no progress view).
    Activity,
}

/// One sample of a running statement.
#[derive(Debug, Clone)]
pub(crate) enum Observation {
    Index(BuildProgress),
    Activity { elapsed: Duration, wait_event: Option<String> },
}

/// A second connection that looks at the working one (server process
/// `pid`) while it is busy. Progress is a nicety: when the second
/// connection cannot be had or fails, the work carries on without it.
pub(crate) struct Watcher {
    conn: Option<AsyncPgConnection>,
    pid: i32,
}

impl std::fmt::Debug for Watcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watcher").field("connected", &self.conn.is_some()).field("pid", &self.pid).finish()
    }
}

#[derive(QueryableByName)]
struct IndexProgressRow {
    #[diesel(sql_type = Text)]
    phase: String,
    #[diesel(sql_type = BigInt)]
    blocks_done: i64,
    #[diesel(sql_type = BigInt)]
    blocks_total: i64,
    #[diesel(sql_type = BigInt)]
    tuples_done: i64,
    #[diesel(sql_type = BigInt)]
    tuples_total: i64,
}

#[derive(QueryableByName)]
struct ActivityRow {
    #[diesel(sql_type = Nullable<Text>)]
    wait_event: Option<String>,
}

impl Watcher {
    /// Watches the server process `pid` (see [`backend_pid`]).
    pub(crate) async fn open(database_url: &str, application_name: &str, policy: &LockPolicy, pid: i32) -> Self {
        match connect(database_url, application_name, policy).await {
            Ok(conn) => Self { conn: Some(conn), pid },
            Err(error) => {
                tracing::warn!(%error, "no second connection for progress; continuing without progress");
                Self { conn: None, pid }
            }
        }
    }

    async fn observe(&mut self, watch: Watch, started: Instant) -> Option<Observation> {
        let pid = self.pid;
        let conn = self.conn.as_mut()?;
        let outcome = match watch {
            Watch::IndexBuild => diesel::sql_query(
                "SELECT phase, coalesce(blocks_done, 0) AS blocks_done, coalesce(blocks_total, 0) AS blocks_total,
                        coalesce(tuples_done, 0) AS tuples_done, coalesce(tuples_total, 0) AS tuples_total
                 FROM pg_stat_progress_create_index WHERE pid = $1",
            )
            .bind::<Integer, _>(pid)
            .load::<IndexProgressRow>(conn)
            .await
            .map(|rows| {
                rows.into_iter().next().map(|r| {
                    Observation::Index(BuildProgress {
                        phase: r.phase,
                        blocks_done: r.blocks_done,
                        blocks_total: r.blocks_total,
                        tuples_done: r.tuples_done,
                        tuples_total: r.tuples_total,
                    })
                })
            }),
            Watch::Activity => diesel::sql_query(
                "SELECT CASE WHEN wait_event IS NULL THEN NULL ELSE wait_event_type || ':' || wait_event END
                        AS wait_event
                 FROM pg_stat_activity WHERE pid = $1",
            )
            .bind::<Integer, _>(pid)
            .load::<ActivityRow>(conn)
            .await
            .map(|rows| {
                rows.into_iter()
                    .next()
                    .map(|r| Observation::Activity { elapsed: started.elapsed(), wait_event: r.wait_event })
            }),
        };
        match outcome {
            Ok(observation) => observation,
            Err(error) => {
                tracing::warn!(%error, "reading progress failed; continuing without progress");
                self.conn = None;
                None
            }
        }
    }
}

/// Runs `statement` on `conn` (the connection `watcher` watches) and,
/// while it runs, samples it from the watcher every [`POLL_INTERVAL`].
async fn run_watched(
    conn: &mut AsyncPgConnection,
    statement: &str,
    watcher: &mut Watcher,
    watch: Watch,
    on_observation: &mut dyn FnMut(Observation),
) -> diesel::QueryResult<()> {
    let started = Instant::now();
    let work = conn.batch_execute(statement);
    tokio::pin!(work);
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + POLL_INTERVAL, POLL_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            outcome = &mut work => return outcome,
            _ = ticker.tick() => {
                if let Some(observation) = watcher.observe(watch, started).await {
                    on_observation(observation);
                }
            }
        }
    }
}

/// What [`build_index_concurrently`] had to do.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct BuildOutcome {
    pub attempts: u32,
    /// An INVALID index of that name (an interrupted build) was dropped first.
    pub dropped_invalid: bool,
    /// A valid index of that name was already there; nothing was built.
    pub already_built: bool,
}

/// An index to build with `CREATE [UNIQUE] INDEX CONCURRENTLY`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConcurrentIndex<'a> {
    /// The schema the index lands in: its table's.
    pub schema: &'a str,
    pub name: &'a str,
    /// The `CREATE [UNIQUE] INDEX CONCURRENTLY` statement that builds it.
    pub create: &'a str,
}

/// Builds `index` on `conn` (the connection `watcher` watches) until it
/// succeeds, reporting its progress.
///
/// A concurrent build that fails at any point, including the lock_timeout
/// of one of its waits, leaves an INVALID index behind that still costs
/// every write; before each attempt such a leftover is dropped
/// (`DROP INDEX CONCURRENTLY`, so no write waits for that either). Lock
/// waits are retried with the policy's backoff like any other DDL.
pub(crate) async fn build_index_concurrently(
    conn: &mut AsyncPgConnection,
    watcher: &mut Watcher,
    policy: &LockPolicy,
    index: ConcurrentIndex<'_>,
    on_progress: &mut dyn FnMut(BuildProgress),
) -> Result<BuildOutcome, RetentionError> {
    let ConcurrentIndex { schema, name, create } = index;
    let mut outcome = BuildOutcome::default();
    let mut retry = LockRetry::new(create, policy);
    loop {
        outcome.attempts = retry.attempt();
        match index_info(conn, schema, name).await? {
            Some(info) if info.valid => {
                outcome.already_built = outcome.attempts == 1;
                return Ok(outcome);
            }
            Some(_) => {
                let drop = format!("DROP INDEX CONCURRENTLY IF EXISTS {}.{}", quote_ident(schema), quote_ident(name));
                ddl(conn, &drop, policy).await?;
                outcome.dropped_invalid = true;
            }
            None => {}
        }
        let result = run_watched(conn, create, watcher, Watch::IndexBuild, &mut |observation| {
            if let Observation::Index(progress) = observation {
                on_progress(progress);
            }
        })
        .await;
        if retry.settle(result).await? {
            return Ok(outcome);
        }
    }
}

/// Runs a long statement that takes a weak lock (`VALIDATE CONSTRAINT`) on
/// `conn` (the connection `watcher` watches) with lock_timeout retries,
/// sampling `pg_stat_activity` while it runs.
pub(crate) async fn run_long_watched(
    conn: &mut AsyncPgConnection,
    watcher: &mut Watcher,
    policy: &LockPolicy,
    statement: &str,
    on_observation: &mut dyn FnMut(Observation),
) -> Result<u32, RetentionError> {
    let mut retry = LockRetry::new(statement, policy);
    loop {
        let result = run_watched(conn, statement, watcher, Watch::Activity, on_observation).await;
        if retry.settle(result).await? {
            return Ok(retry.attempt());
        }
    }
}

/// Milliseconds, saturating, for reports and progress.
pub(crate) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}
