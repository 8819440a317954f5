//! The invocation lease (`adk_postgres_domain::lease`): what taking,
//! renewing and releasing it in the append's own statement costs an append,
//! and twenty invocations racing for one session, through
//! `PgSessionStore` and the `SessionStore` trait, as the owner, on a
//! database of its own.
//!
//! Overhead: the same turns appended to fresh sessions one append at a
//! time, with the lease (the invocation's first event takes it, the next
//! pass the holder's generation back, the last releases it) and without
//! (`lease: None`). A session gets `INVOCATIONS_PER_SESSION` turns of
//! `EVENTS_PER_INVOCATION` events (user message, tool call, tool result,
//! answer), so every turn takes the lease anew. The two legs alternate
//! round by round, each going first in every other round, so a slow spell
//! of the machine falls on both. Around each leg the server's counters are
//! read: the append's execution time (pg_stat_statements, reset before the
//! leg) and the HOT updates of `adk_sessions` (read once the store's
//! backend has published its counters after the leg).
//!
//! Race: `RACE_INVOCATIONS` invocations, each a task with its own
//! connection, start together on one fresh session; each appends a turn of
//! `EVENTS_PER_INVOCATION` events under the lease, retrying after 2 to 5 ms
//! while the session is busy. Afterwards the session is read back: its
//! events must be the turns one after the other, never interleaved, or the
//! run fails.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use adk_postgres_domain::{
    AppName, AppendOptions, CreateSession, DEFAULT_LEASE_IDLE, Event, GetOptions, InvocationLease, LeaseGrant,
    SessionKey, SessionStore, StoreError, UserId,
};
use adk_postgres_storage::{PgSessionStore, PoolConfig};
use anyhow::{Context as _, anyhow, bail, ensure};
use serde::Serialize;
use serde_json::json;
use tokio_postgres::Client;

use crate::driver::pool_config;
use crate::measure::{Latency, Sample, median};
use crate::pgstat::{ExecTime, HotRatio, exec_time, hot_ratio};
use crate::report::ratio;
use crate::run::log;
use crate::server::connect;
use crate::workload::{APP, text};

/// Turns (invocations) each session of the overhead legs receives.
pub const INVOCATIONS_PER_SESSION: usize = 5;
/// Events of one invocation's turn: user message, tool call, tool result, answer.
pub const EVENTS_PER_INVOCATION: usize = 4;
/// Invocations racing for one session.
pub const RACE_INVOCATIONS: usize = 20;
/// How long a racing invocation's lease outlives its last append: long
/// enough that no turn lapses mid-race.
const RACE_IDLE: Duration = Duration::from_secs(30);
/// The append among pg_stat_statements' texts.
const APPEND_FUNCTION: &str = "adk_append_event(";

/// Sizes of the section.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct LeasePlan {
    /// Rounds of the overhead legs; each leg appends `invocations_per_round`
    /// turns per round (a multiple of `INVOCATIONS_PER_SESSION`).
    pub rounds: usize,
    pub invocations_per_round: usize,
    /// Times the race is run, each on a fresh session.
    pub race_repetitions: usize,
}

/// One leg of the overhead.
#[derive(Debug, Clone, Serialize)]
pub struct LegFigures {
    /// Each append's latency, as the caller saw it.
    pub latency: Latency,
    /// The append's execution on the server (pg_stat_statements); `None`
    /// without it.
    pub server: Option<ExecTime>,
    /// Updates of `adk_sessions` during the leg, and how many were HOT.
    pub hot: HotRatio,
}

#[derive(Debug, Clone, Serialize)]
pub struct OverheadReport {
    pub rounds: usize,
    pub invocations_per_round: usize,
    pub invocations_per_session: usize,
    pub events_per_invocation: usize,
    pub with_lease: LegFigures,
    pub without_lease: LegFigures,
    /// With over without, of the p50s (the medians) and of the p95s.
    pub p50_ratio: Option<f64>,
    pub p95_ratio: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct RaceReport {
    pub invocations: usize,
    pub events_per_invocation: usize,
    pub repetitions: usize,
    /// Each repetition's wall time, from the start signal to the last
    /// invocation's release, and their median.
    pub wall_ms: Vec<f64>,
    pub wall_ms_median: f64,
    /// Appends stored, and appends refused with `SessionBusy`, over all
    /// repetitions.
    pub acknowledged: u64,
    pub refused: u64,
    /// Summed wall time over append statements (acknowledged + refused):
    /// the row's time per statement while they queue on it.
    pub wall_per_statement_ms: f64,
    /// The append statements' execution on the server over all repetitions
    /// (pg_stat_statements), and its mean; `None` without it.
    pub server: Option<ExecTime>,
    pub server_mean_ms: Option<f64>,
    /// Updates of the raced sessions' rows, and how many were HOT.
    pub hot: HotRatio,
}

#[derive(Debug, Clone, Serialize)]
pub struct LeaseReport {
    pub plan: LeasePlan,
    pub overhead: OverheadReport,
    pub race: RaceReport,
}

impl std::fmt::Display for LeaseReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let o = &self.overhead;
        let ms = |x: Option<f64>| x.map_or_else(|| "-".to_owned(), |x| format!("{x:.3} ms"));
        let times = |x: Option<f64>| x.map_or_else(|| "-".to_owned(), |x| format!("{x:.2}x"));
        writeln!(
            f,
            "Invocation lease: appends through the store (PgSessionStore, as the owner) with and without the lease"
        )?;
        writeln!(
            f,
            "  overhead: {} rounds x {} invocations x {} events per leg, {} invocations per fresh session, one \
             append at a time, the legs alternating which goes first",
            o.rounds, o.invocations_per_round, o.events_per_invocation, o.invocations_per_session
        )?;
        for (what, leg) in [("with the lease", &o.with_lease), ("without", &o.without_lease)] {
            let l = &leg.latency;
            writeln!(
                f,
                "    {what:<15} p50 {:>7.3} ms  p95 {:>7.3} ms  ({} appends; server {} per append; HOT {:.1}% of {} \
                 session updates)",
                l.p50_ms,
                l.p95_ms,
                l.ops,
                ms(leg.server.and_then(|s| s.mean_ms())),
                leg.hot.ratio * 100.0,
                leg.hot.updates
            )?;
        }
        writeln!(f, "    with/without    p50 {}  p95 {}", times(o.p50_ratio), times(o.p95_ratio))?;
        let r = &self.race;
        writeln!(
            f,
            "  race: {} invocations x {} events into one session, each retrying 2-5 ms after SessionBusy, {} \
             time(s), each on a fresh session; every time the stored events were {} whole turns one after the other",
            r.invocations, r.events_per_invocation, r.repetitions, r.invocations
        )?;
        writeln!(
            f,
            "    wall {:.1} ms (median of the runs), {} appends acknowledged, {} refused busy ({:.1} per \
             acknowledged append); HOT {:.1}% of {} session updates",
            r.wall_ms_median,
            r.acknowledged,
            r.refused,
            r.refused as f64 / r.acknowledged.max(1) as f64,
            r.hot.ratio * 100.0,
            r.hot.updates
        )?;
        writeln!(
            f,
            "    lock hold per append: {:.3} ms wall / append statements ({} statements); server execution {} \
             mean, {} min (pg_stat_statements, {} calls)",
            r.wall_per_statement_ms,
            r.acknowledged + r.refused,
            ms(r.server_mean_ms),
            ms(r.server.map(|s| s.min_ms)),
            r.server.map_or_else(|| "-".to_owned(), |s| s.calls.to_string())
        )?;
        write!(
            f,
            "    method: every append, stored or refused, locks the session row (FOR NO KEY UPDATE) until its \
             transaction commits, so the statements run on it one at a time; with at least one always queued, \
             the wall time over the statements is the row's time per statement, its commit (WAL flush) included \
             (an upper bound: moments when every invocation was pausing count too); the server's execution time \
             (pg_stat_statements) leaves the commit out and counts each statement from its start, so its mean \
             includes the wait for the row behind the statements queued before it, and its minimum is the \
             uncontended execution"
        )
    }
}

/// Checks that `invocations`, the stored events' invocation ids in order,
/// are `turns` runs of `k` events, each of another invocation: no turn
/// interleaved with another, none split in two.
pub fn check_turns(invocations: &[String], turns: usize, k: usize) -> Result<(), String> {
    if k == 0 || invocations.len() != turns * k {
        return Err(format!("{} events stored, {turns} turns of {k} expected", invocations.len()));
    }
    let mut seen = HashSet::new();
    for (t, run) in invocations.chunks(k).enumerate() {
        if let Some(other) = run.iter().find(|i| **i != run[0]) {
            return Err(format!("turn {t} ({}) interleaved with {other}: {invocations:?}", run[0]));
        }
        if !seen.insert(run[0].as_str()) {
            return Err(format!("{} appended in two turns: {invocations:?}", run[0]));
        }
    }
    Ok(())
}

/// Event `n` of an invocation's turn: the user's message, then the agent's
/// tool call, the tool's result and the answer; ~200 characters of text
/// (`seed` chooses them) and a small session delta each.
fn turn_event(invocation: &str, n: usize, seed: usize) -> Event {
    let mut event = Event::new(if n == 0 { "user" } else { "agent" });
    event.invocation_id = invocation.to_owned();
    event.content = Some(json!({"role": if n == 0 { "user" } else { "model" }, "parts": [{"text": text(seed)}]}));
    event.actions.state_delta.insert("turn".to_owned(), json!(seed));
    event
}

/// The lease of event `n` of a turn, after `grant` (the turn's previous append's).
fn lease_of(n: usize, grant: Option<LeaseGrant>, idle: Duration) -> InvocationLease {
    InvocationLease { idle, generation: grant.map(|g| g.generation), release: n + 1 == EVENTS_PER_INVOCATION }
}

/// Appends every turn of `sessions`, one append at a time, under the lease
/// or not, and records each append's latency.
async fn leg(store: &dyn SessionStore, sessions: &[SessionKey], leased: bool) -> anyhow::Result<Sample> {
    let mut sample = Sample::default();
    let (mut appends, mut elapsed) = (0, Duration::ZERO);
    for (s, key) in sessions.iter().enumerate() {
        for t in 0..INVOCATIONS_PER_SESSION {
            let invocation = format!("inv-{t}");
            let mut grant = None;
            for n in 0..EVENTS_PER_INVOCATION {
                let event = turn_event(&invocation, n, (s * INVOCATIONS_PER_SESSION + t) * EVENTS_PER_INVOCATION + n);
                let lease = leased.then(|| lease_of(n, grant, DEFAULT_LEASE_IDLE));
                let began = Instant::now();
                let appended = store
                    .append(key, event, AppendOptions { lease, ..AppendOptions::default() })
                    .await
                    .with_context(|| format!("{key:?}, {invocation}, event {n}"))?;
                let took = began.elapsed();
                sample.record(took);
                elapsed += took;
                appends += 1;
                if leased {
                    let granted = appended.lease.ok_or_else(|| anyhow!("a leased append reported no lease"))?;
                    ensure!(granted.generation == t as u64 + 1, "{key:?}, {invocation}: generation {granted:?}");
                    grant = Some(granted);
                }
            }
        }
    }
    sample.end_round(appends, elapsed);
    Ok(sample)
}

/// The server's counters around each leg or race.
struct Counters<'a> {
    /// A client of a database with pg_stat_statements, when loaded.
    admin: Option<&'a Client>,
    database: &'a str,
    /// Of the measured database, for its table statistics.
    owner: Client,
    /// `adk_sessions`' update counters when they last settled, and the
    /// updates made up to now.
    settled: HotRatio,
    updates: i64,
}

impl Counters<'_> {
    async fn reset_statements(&self) -> anyhow::Result<()> {
        if let Some(admin) = self.admin {
            admin.batch_execute("SELECT pg_stat_statements_reset()").await?;
        }
        Ok(())
    }

    async fn appends_executed(&self) -> anyhow::Result<Option<ExecTime>> {
        match self.admin {
            Some(admin) => Ok(Some(exec_time(admin, self.database, APPEND_FUNCTION).await?)),
            None => Ok(None),
        }
    }

    /// The session updates and HOT updates since the last call, once the
    /// statistics show the `updates` more made since then.
    async fn settle(&mut self, updates: u64) -> anyhow::Result<HotRatio> {
        self.updates += i64::try_from(updates)?;
        let now = hot_ratio(&self.owner, "adk_sessions", self.updates).await?;
        let (updates, hot_updates) = (now.updates - self.settled.updates, now.hot_updates - self.settled.hot_updates);
        self.settled = now;
        Ok(HotRatio {
            updates,
            hot_updates,
            ratio: if updates > 0 { hot_updates as f64 / updates as f64 } else { 0.0 },
        })
    }
}

fn add_hot(a: HotRatio, b: HotRatio) -> HotRatio {
    let (updates, hot_updates) = (a.updates + b.updates, a.hot_updates + b.hot_updates);
    HotRatio { updates, hot_updates, ratio: if updates > 0 { hot_updates as f64 / updates as f64 } else { 0.0 } }
}

async fn create(store: &dyn SessionStore, user: &str, id: &str) -> anyhow::Result<SessionKey> {
    Ok(store.create(CreateSession::new(AppName::new(APP)?, UserId::new(user)?).with_id(id)).await?.key)
}

/// Measures the section on the freshly migrated database `database` at
/// `url`, as its owner; `admin` is a client of a database with
/// pg_stat_statements, when the server has it loaded.
pub async fn measure(
    url: &str,
    database: &str,
    admin: Option<&Client>,
    plan: LeasePlan,
) -> anyhow::Result<LeaseReport> {
    ensure!(
        plan.rounds > 0
            && plan.race_repetitions > 0
            && plan.invocations_per_round > 0
            && plan.invocations_per_round.is_multiple_of(INVOCATIONS_PER_SESSION),
        "a plan the section cannot run: {plan:?}"
    );
    let mut counters =
        Counters { admin, database, owner: connect(url).await?, settled: HotRatio::default(), updates: 0 };
    let overhead = overhead(url, plan, &mut counters).await?;
    let race = race(url, plan, &mut counters).await?;
    Ok(LeaseReport { plan, overhead, race })
}

async fn overhead(url: &str, plan: LeasePlan, counters: &mut Counters<'_>) -> anyhow::Result<OverheadReport> {
    // One connection: the appends are sequential, and its backend is the
    // one whose statistics `publish_statistics` hurries.
    let store = PgSessionStore::connect(url, &PoolConfig { max_size: 1, ..pool_config() }, Default::default()).await?;
    // Every session of every round first (untimed; creating updates no
    // session row), then a session of each leg as a warm-up.
    let per_leg = plan.invocations_per_round / INVOCATIONS_PER_SESSION;
    // Each round's sessions: [without the lease, with it].
    let mut sessions: Vec<[Vec<SessionKey>; 2]> = Vec::with_capacity(plan.rounds);
    for round in 0..plan.rounds {
        let mut legs: [Vec<SessionKey>; 2] = Default::default();
        for (leased, keys) in legs.iter_mut().enumerate() {
            for i in 0..per_leg {
                keys.push(create(&store, &format!("lease-user-{i}"), &format!("l{leased}-r{round}-{i}")).await?);
            }
        }
        sessions.push(legs);
    }
    let mut warm_updates = 0;
    let mut warm_key = None;
    for leased in [true, false] {
        let key = create(&store, "lease-warm", &format!("warm-{leased}")).await?;
        warm_updates += leg(&store, std::slice::from_ref(&key), leased).await?.ops();
        warm_key = Some(key);
    }
    let warm_key = warm_key.ok_or_else(|| anyhow!("no warm-up session"))?;
    publish_statistics(&store, &warm_key).await?;
    counters.settle(warm_updates).await?;

    let mut legs: [(Sample, Option<ExecTime>, HotRatio); 2] = Default::default();
    for (round, keys) in sessions.iter().enumerate() {
        log(format!("invocation lease: overhead round {}/{}", round + 1, plan.rounds));
        let order = if round % 2 == 0 { [1, 0] } else { [0, 1] };
        for leased in order {
            counters.reset_statements().await?;
            let sample = leg(&store, &keys[leased], leased == 1).await?;
            let executed = counters.appends_executed().await?;
            publish_statistics(&store, &warm_key).await?;
            let hot = counters.settle(sample.ops()).await?;
            let (total, server, hot_total) = &mut legs[leased];
            total.merge(&sample);
            *server = match (*server, executed) {
                (Some(a), Some(b)) => Some(a.add(&b)),
                (None, b) => b,
                (a, None) => a,
            };
            *hot_total = add_hot(*hot_total, hot);
        }
    }
    let [without, with] = legs.map(|(sample, server, hot)| LegFigures { latency: sample.summary(), server, hot });
    Ok(OverheadReport {
        rounds: plan.rounds,
        invocations_per_round: plan.invocations_per_round,
        invocations_per_session: INVOCATIONS_PER_SESSION,
        events_per_invocation: EVENTS_PER_INVOCATION,
        p50_ratio: ratio(with.latency.p50_ms, without.latency.p50_ms),
        p95_ratio: ratio(with.latency.p95_ms, without.latency.p95_ms),
        with_lease: with,
        without_lease: without,
    })
}

/// Has the store's backend publish its table statistics now rather than
/// in 10 s: a backend going idle publishes them at once when it last did a
/// second or more before, and otherwise only after 10 s idle. A read of
/// no events updates nothing.
async fn publish_statistics(store: &PgSessionStore, key: &SessionKey) -> anyhow::Result<()> {
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    store.get(key, GetOptions { num_recent_events: Some(0), ..GetOptions::default() }).await?;
    Ok(())
}

/// One invocation of the race: its turn appended under the lease, retrying
/// while the session is busy; returns the refusals it met.
async fn racer(store: PgSessionStore, key: SessionKey, invocation: String, seed: usize) -> anyhow::Result<u64> {
    let mut refused = 0_u64;
    let mut grant = None;
    for n in 0..EVENTS_PER_INVOCATION {
        let event = turn_event(&invocation, n, seed + n);
        loop {
            let options = AppendOptions { lease: Some(lease_of(n, grant, RACE_IDLE)), ..AppendOptions::default() };
            match store.append(&key, event.clone(), options).await {
                Ok(appended) => {
                    grant = Some(appended.lease.ok_or_else(|| anyhow!("a leased append reported no lease"))?);
                    break;
                }
                Err(StoreError::SessionBusy { .. }) => {
                    refused += 1;
                    // 2 to 5 ms, staggered between the invocations.
                    tokio::time::sleep(Duration::from_millis(2 + (seed as u64 + refused) % 4)).await;
                }
                Err(error) => return Err(anyhow::Error::from(error).context(format!("{invocation}, event {n}"))),
            }
        }
    }
    Ok(refused)
}

async fn race(url: &str, plan: LeasePlan, counters: &mut Counters<'_>) -> anyhow::Result<RaceReport> {
    // A connection for each invocation, opened before the start.
    let pool =
        PoolConfig { max_size: RACE_INVOCATIONS as u32, min_idle: Some(RACE_INVOCATIONS as u32), ..pool_config() };
    let store = PgSessionStore::connect(url, &pool, Default::default()).await?;
    let (mut walls, mut refused, mut acknowledged) = (Vec::new(), 0, 0);
    let mut server: Option<ExecTime> = None;
    for rep in 0..plan.race_repetitions {
        log(format!(
            "invocation lease: race {}/{} ({RACE_INVOCATIONS} invocations x {EVENTS_PER_INVOCATION} events, one session)",
            rep + 1,
            plan.race_repetitions
        ));
        let key = create(&store, "lease-race", &format!("race-{rep}")).await?;
        let warm: Vec<_> = (0..RACE_INVOCATIONS)
            .map(|_| {
                let (store, key) = (store.clone(), key.clone());
                tokio::spawn(async move {
                    for _ in 0..5 {
                        store.get(&key, GetOptions::default()).await?;
                    }
                    anyhow::Ok(())
                })
            })
            .collect();
        for task in warm {
            task.await??;
        }
        counters.reset_statements().await?;
        let start = Arc::new(tokio::sync::Barrier::new(RACE_INVOCATIONS + 1));
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..RACE_INVOCATIONS {
            let (store, key, start) = (store.clone(), key.clone(), start.clone());
            tasks.spawn(async move {
                start.wait().await;
                racer(store, key, format!("race-{rep}-{i:02}"), i * EVENTS_PER_INVOCATION).await
            });
        }
        start.wait().await;
        let began = Instant::now();
        while let Some(done) = tasks.join_next().await {
            refused += done.context("a racing invocation panicked")??;
        }
        walls.push(began.elapsed());
        acknowledged += (RACE_INVOCATIONS * EVENTS_PER_INVOCATION) as u64;
        if let Some(executed) = counters.appends_executed().await? {
            server = Some(server.map_or(executed, |s| s.add(&executed)));
        }
        let stored: Vec<String> =
            store.get(&key, GetOptions::default()).await?.events.into_iter().map(|e| e.invocation_id).collect();
        if let Err(problem) = check_turns(&stored, RACE_INVOCATIONS, EVENTS_PER_INVOCATION) {
            bail!("invocation lease race {}: the stored turns are not whole: {problem}", rep + 1);
        }
    }
    let hot = counters.settle(acknowledged).await?;
    let wall_total: Duration = walls.iter().sum();
    let wall_ms: Vec<f64> = walls.iter().map(|w| w.as_secs_f64() * 1e3).collect();
    let wall_ms_median = median(&mut wall_ms.clone()).unwrap_or(0.0);
    Ok(RaceReport {
        invocations: RACE_INVOCATIONS,
        events_per_invocation: EVENTS_PER_INVOCATION,
        repetitions: plan.race_repetitions,
        wall_ms,
        wall_ms_median,
        acknowledged,
        refused,
        wall_per_statement_ms: wall_total.as_secs_f64() * 1e3 / (acknowledged + refused).max(1) as f64,
        server_mean_ms: server.and_then(|s| s.mean_ms()),
        server,
        hot,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn whole_turns_pass_and_interleaved_ones_do_not() {
        assert_eq!(check_turns(&ids(&["a", "a", "b", "b", "c", "c"]), 3, 2), Ok(()));
        assert!(check_turns(&ids(&["a", "b", "a", "b", "c", "c"]), 3, 2).is_err(), "interleaved");
        assert!(check_turns(&ids(&["a", "a", "b", "b", "a", "a"]), 3, 2).is_err(), "a turn split in two");
        assert!(check_turns(&ids(&["a", "a", "b", "b"]), 3, 2).is_err(), "a turn missing");
        assert!(check_turns(&ids(&["a", "a", "a", "b", "b", "b"]), 3, 2).is_err(), "runs of the wrong length");
        assert!(check_turns(&[], 0, 0).is_err());
    }

    /// Not part of `cargo test`: measures the section once on a throwaway
    /// cluster and prints the figures. Run with
    /// `cargo test --release -p adk-postgres-bench lease -- --ignored --nocapture`.
    #[tokio::test(flavor = "multi_thread")]
    #[ignore = "a measurement, not a test"]
    async fn lease_overhead_and_race() -> anyhow::Result<()> {
        use crate::server::Server;
        let server = Server::throwaway().await?;
        let url = server.fresh_database("adk_bench_lease").await?;
        crate::run::migrate_ours(&url, chrono::Utc::now().date_naive()).await?;
        let admin = if server.stat_statements { Some(connect(server.admin_url()).await?) } else { None };
        let plan = crate::workload::Plan::full().lease();
        println!("{}", measure(&url, "adk_bench_lease", admin.as_ref(), plan).await?);
        server.drop_database("adk_bench_lease").await?;
        Ok(())
    }
}
