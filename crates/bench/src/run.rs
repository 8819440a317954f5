//! One benchmark run: set up the databases, run every workload on every
//! implementation (interleaved round by round, so drift and checkpoints
//! hit all of them alike), count statements and round trips, report.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use adk_postgres_retention::{MaintenanceConfig, run_maintenance};
use adk_postgres_storage::tenancy::{AppBinding, ServiceRoleOptions, setup_service_role};
use anyhow::{Context as _, anyhow};
use chrono::{NaiveDate, Utc};
use tokio_postgres::Client;
use url::Url;

use std::sync::Arc;

use adk_postgres_adk::PgSessionService;
use adk_postgres_storage::{PgSessionStore, TenantScope};
use adk_postgres_testing::WireProxy;
use adk_session::SessionService;

use crate::cpu::{CpuClock, MachineClock};
use crate::crowd::{self, CrowdResult};
use crate::driver::{Driver, Peer, pool_config};
use crate::floor::{self, BoundEvent, Flavor, Pgbench, Protocol, SessionCoordinates, Spread};
use crate::measure::Sample;
use crate::ops::{self, Op};
use crate::pgstat::{HotRatio, StatementCount, StatementCounter, hot_ratio};
use crate::protocol::{ProtocolReport, ProtocolRow};
use crate::report::{self, Measured, Report, RoundTripKind, RoundTrips, ratio};
use crate::retention;
use crate::rollup;
use crate::server::{Server, Transport, connect, with_transport};
use crate::tls::{self, SslCount, TlsReport};
use crate::workload::{
    self, APP, BIG_SESSION, CONCURRENCY, EVENTS_PER_SESSION, GET_USER, LIST_SESSIONS, LIST_USER, Plan, SMALL_SESSION,
    append_session,
};
use crate::{archive, erase, feed, labels, lease, media, paging, reads, toast};

/// Session ids of the floor's append workloads: numbers (user = session),
/// sequential from here, concurrent from `CONCURRENT_BASE`.
const SEQUENTIAL_BASE: usize = 100_000;
const CONCURRENT_BASE: usize = 200_000;
const RETENTION_DATABASE: &str = "adk_bench_retention";
const ROLLUP_DATABASE: &str = "adk_bench_rollup";
const BEYOND_DATABASE: &str = "adk_bench_beyond";
const TLS_DATABASE: &str = "adk_bench_tls";
/// Untimed operations of each kind before the round-trip pass counts.
const WARM_UP: usize = 3;

pub struct Options {
    pub plan: Plan,
    pub database_url: Option<String>,
    pub out_dir: PathBuf,
}

struct Bench {
    plan: Plan,
    server: Server,
    /// As the owner: set-up, statistics, the floor.
    urls: BTreeMap<Peer, String>,
    /// As the bound service role, for our drivers.
    service_urls: BTreeMap<Peer, String>,
    drivers: BTreeMap<Peer, Driver>,
    pgbench: Option<Pgbench>,
    counter: Option<StatementCounter>,
    samples: BTreeMap<(Op, Peer), Sample>,
    statements: BTreeMap<(Op, Peer), StatementCount>,
    notes: Vec<String>,
}

pub(crate) fn log(message: impl AsRef<str>) {
    eprintln!("bench: {}", message.as_ref());
}

pub async fn run(options: Options) -> anyhow::Result<Report> {
    let started = Instant::now();
    let load_at_start = report::load_average();
    let plan = options.plan;
    let server = match &options.database_url {
        Some(url) => Server::existing(url).await?,
        None => {
            log("starting a throwaway cluster with durable settings");
            Server::throwaway().await?
        }
    };
    let info = server.info();
    println!("PostgreSQL: {}", info.source);
    for (name, value) in &info.settings {
        println!("  {name:<28} {value}");
    }
    if !server.stat_statements {
        log("pg_stat_statements is not loaded on this server: statements per operation are not counted");
    }

    let mut notes = Vec::new();
    let pgbench = match server.bin_dir.as_deref().map(|dir| Pgbench::new(dir, options.out_dir.join("pgbench"))) {
        Some(Ok(pgbench)) => Some(pgbench),
        Some(Err(error)) => {
            notes.push(format!("no floor: {error:#}"));
            None
        }
        None => {
            notes.push("no floor: pgbench not found (PostgreSQL server binaries)".into());
            None
        }
    };
    let peers: Vec<Peer> = Peer::ALL.into_iter().filter(|p| !p.is_pgbench() || pgbench.is_some()).collect();

    log("creating one database per implementation");
    let today = Utc::now().date_naive();
    let mut urls = BTreeMap::new();
    for &peer in &peers {
        let url = server.fresh_database(peer.database()).await?;
        if peer.our_schema() {
            migrate_ours(&url, today).await?;
        } else {
            migrate_adk_session(&url).await?;
        }
        urls.insert(peer, url);
    }
    // Our store runs as production runs it: a non-owner role bound to the
    // app, acting per request, so the tenant check is in every figure.
    let mut service_urls = BTreeMap::new();
    for &peer in peers.iter().filter(|p| !p.is_pgbench() && p.our_schema()) {
        service_urls.insert(peer, bound_service_url(&urls[&peer]).await?);
    }
    let mut drivers = BTreeMap::new();
    for &peer in peers.iter().filter(|p| !p.is_pgbench()) {
        drivers.insert(peer, Driver::connect(peer, service_urls.get(&peer).unwrap_or(&urls[&peer])).await?);
    }
    let counter =
        if server.stat_statements { Some(StatementCounter::new(connect(server.admin_url()).await?)) } else { None };
    let mut bench = Bench {
        plan,
        server,
        urls,
        service_urls,
        drivers,
        pgbench,
        counter,
        samples: BTreeMap::new(),
        statements: BTreeMap::new(),
        notes,
    };

    // Retention first: nothing else writes WAL yet.
    log(format!(
        "retention: {} events in {} sessions, DROP (maintenance) vs DELETE",
        bench.plan.retention_events(),
        bench.plan.retention_sessions
    ));
    let retention_url = bench.server.fresh_database(RETENTION_DATABASE).await?;
    migrate_ours(&retention_url, today).await?;
    let retention =
        retention::measure(&retention_url, bench.plan.retention_sessions, bench.plan.retention_events_per_session)
            .await?;
    bench.server.drop_database(RETENTION_DATABASE).await?;

    // Usage rollups next, while still nothing else writes WAL.
    log(format!(
        "usage rollup: {} events, rolled up {} time(s) from scratch, then one minute more",
        bench.plan.rollup_events, bench.plan.rollup_runs
    ));
    let rollup_url = bench.server.fresh_database(ROLLUP_DATABASE).await?;
    migrate_ours(&rollup_url, today).await?;
    let rollup = rollup::measure(&rollup_url, bench.plan.rollup_events, bench.plan.rollup_runs).await?;
    bench.server.drop_database(ROLLUP_DATABASE).await?;

    // What no peer offers: erasing a user, a labelled listing, the change
    // feed. Each on a fresh database, before the peers' workloads.
    log(format!("erase_user: a user with {} events over 4 days", bench.plan.erase_events));
    let beyond_url = bench.server.fresh_database(BEYOND_DATABASE).await?;
    migrate_ours(&beyond_url, today).await?;
    let erase = erase::measure_erase(&beyond_url, bench.plan.erase_events, 1_000).await?;
    bench.server.drop_database(BEYOND_DATABASE).await?;
    log(format!("list with a label filter: one user with {} sessions", bench.plan.label_sessions));
    let beyond_url = bench.server.fresh_database(BEYOND_DATABASE).await?;
    migrate_ours(&beyond_url, today).await?;
    let labels = labels::measure_label_list(&beyond_url, bench.plan.label_sessions, bench.plan.label_calls).await?;
    bench.server.drop_database(BEYOND_DATABASE).await?;
    log("list_events: page 1 and page 100 (of 100 events) of a 10,000-event session");
    let beyond_url = bench.server.fresh_database(BEYOND_DATABASE).await?;
    migrate_ours(&beyond_url, today).await?;
    let paging = paging::measure_list_events(&beyond_url, bench.plan.label_calls).await?;
    bench.server.drop_database(BEYOND_DATABASE).await?;
    let lease_plan = bench.plan.lease();
    log(format!(
        "invocation lease: {} rounds x {} turns of {} events with and without it, then {} invocations racing \
         for one session ({} times)",
        lease_plan.rounds,
        lease_plan.invocations_per_round,
        lease::EVENTS_PER_INVOCATION,
        lease::RACE_INVOCATIONS,
        lease_plan.race_repetitions
    ));
    let beyond_url = bench.server.fresh_database(BEYOND_DATABASE).await?;
    migrate_ours(&beyond_url, today).await?;
    let admin = if bench.server.stat_statements { Some(connect(bench.server.admin_url()).await?) } else { None };
    let lease = lease::measure(&beyond_url, BEYOND_DATABASE, admin.as_ref(), lease_plan).await?;
    drop(admin);
    bench.server.drop_database(BEYOND_DATABASE).await?;
    log("change feed: append-to-watcher latency under 8 writers");
    let beyond_url = bench.server.fresh_database(BEYOND_DATABASE).await?;
    migrate_ours(&beyond_url, today).await?;
    let feed_plan = feed::FeedPlan {
        writers: 8,
        appends_per_writer: bench.plan.feed_appends_per_writer,
        ..feed::FeedPlan::default()
    };
    let feed = feed::measure_notify_latency(&beyond_url, feed_plan).await?;
    bench.server.drop_database(BEYOND_DATABASE).await?;
    log("toast: adk_events.payload compressed with pglz vs lz4, agent events of ~4 KB");
    let toast = toast::measure(&bench.server, today, bench.plan.toast()).await?;
    if toast.is_none() {
        bench.notes.push("no TOAST section: the server was built without lz4".to_owned());
    }

    bench.setup_sessions().await?;
    bench.creates().await?;
    bench.appends().await?;
    let hot = bench.hot_ratios().await?;
    let coordinates = bench.setup_reads().await?;
    bench.settle().await?;
    let idle = crate::cpu::idle_share(Duration::from_secs(3)).await;
    let reads_began = MachineClock::now();
    bench.reads(&coordinates).await?;
    if let Some(busy) = crate::cpu::busy_beside_note(reads_began) {
        let note = format!("{busy}; the bench process idle just before: {:.1}% of a core", idle * 100.0);
        log(&note);
        bench.notes.push(note);
    }
    let peer_connections = bench.peer_connections().await?;
    let protocol = bench.statement_protocols(&coordinates).await?;
    let tls = bench.tls_leg(today).await?;
    let round_trips = bench.round_trips(&coordinates).await?;
    let crowd = bench.crowd().await?;
    // Read before the media section, which holds sessions of 16 MB of
    // images in memory (and resets the peak to measure its own gets).
    let peak_rss_bytes = peak_rss_bytes();
    // Last: its hundreds of megabytes of WAL would otherwise bring
    // checkpoints into the other workloads.
    let media = media::measure(&bench.server, today, bench.plan.media()).await?;
    // After the media: a day of 1,000,000 events seeded, archived and
    // restored writes gigabytes of WAL.
    let archive = archive::measure(&bench.server, today, bench.plan.archive()).await?;

    let measured = bench.measured();
    let report = Report {
        plan: bench.plan.clone(),
        allocator: report::allocator(),
        machine: report::Machine { load_average_start: load_at_start, ..report::Machine::detect() },
        server: info,
        results: measured,
        peer_connections,
        protocol,
        tls,
        round_trips,
        crowd,
        hot,
        retention,
        rollup,
        erase,
        labels,
        paging,
        lease,
        feed,
        toast,
        media,
        archive,
        peak_rss_bytes,
        notes: bench.notes.clone(),
        elapsed_secs: started.elapsed().as_secs_f64(),
        targets: Vec::new(),
        read_targets: Vec::new(),
    }
    .with_targets();
    if !bench.server.is_throwaway() {
        for peer in bench.urls.keys() {
            bench.server.drop_database(peer.database()).await?;
        }
    }
    drop(bench);
    Ok(report)
}

/// Only the media section, on a server of its own (`--media`).
pub async fn run_media(options: Options) -> anyhow::Result<media::MediaReport> {
    let server = match &options.database_url {
        Some(url) => Server::existing(url).await?,
        None => {
            log("starting a throwaway cluster with durable settings");
            Server::throwaway().await?
        }
    };
    media::measure(&server, Utc::now().date_naive(), options.plan.media()).await
}

/// Only the TOAST section, on a server of its own (`--toast`).
pub async fn run_toast(options: Options) -> anyhow::Result<toast::ToastReport> {
    let server = match &options.database_url {
        Some(url) => Server::existing(url).await?,
        None => {
            log("starting a throwaway cluster with durable settings");
            Server::throwaway().await?
        }
    };
    toast::measure(&server, Utc::now().date_naive(), options.plan.toast())
        .await?
        .ok_or_else(|| anyhow!("the server was built without lz4: nothing to compare"))
}

/// Only the reads section, on a server of its own (`--reads`).
pub async fn run_reads(options: Options) -> anyhow::Result<reads::ReadsReport> {
    let server = match &options.database_url {
        Some(url) => Server::existing(url).await?,
        None => {
            log("starting a throwaway cluster with durable settings");
            Server::throwaway().await?
        }
    };
    reads::measure(&server, Utc::now().date_naive(), options.plan.reads()).await
}

/// Only the archive section, on a server of its own (`--archive`).
pub async fn run_archive(options: Options) -> anyhow::Result<archive::ArchiveReport> {
    let server = match &options.database_url {
        Some(url) => Server::existing(url).await?,
        None => {
            log("starting a throwaway cluster with durable settings");
            Server::throwaway().await?
        }
    };
    archive::measure(&server, Utc::now().date_naive(), options.plan.archive()).await
}

pub(crate) async fn migrate_ours(url: &str, today: NaiveDate) -> anyhow::Result<()> {
    adk_postgres_schema::run_pending_migrations(url).await.context("migrating")?;
    // Premake today and the week ahead, as `adk-pg maintain` does.
    run_maintenance(url, today, &MaintenanceConfig::default()).await.context("premaking partitions")?;
    Ok(())
}

/// adk-session's own tables on the database at `url`, by its own migration.
pub(crate) async fn migrate_adk_session(url: &str) -> anyhow::Result<()> {
    adk_session::PostgresSessionService::new(url)
        .await
        .map_err(|e| anyhow!("{e}"))?
        .migrate()
        .await
        .map_err(|e| anyhow!("adk-session migrate: {e}"))
}

/// The role our drivers connect as in every database of the run.
pub(crate) const SERVICE_ROLE: &str = "adk_bench_service";

/// Sets the bench's service role up on the database at `owner_url`, bound
/// to the workload's app, with a fresh password, and returns its URL.
pub(crate) async fn bound_service_url(owner_url: &str) -> anyhow::Result<String> {
    let password = uuid::Uuid::new_v4().simple().to_string();
    let options = ServiceRoleOptions {
        create: true,
        password: Some(password.clone()),
        apps: AppBinding::Apps(vec![APP.to_owned()]),
    };
    setup_service_role(owner_url, SERVICE_ROLE, &options).await.context("setting up the bench's service role")?;
    let mut url = Url::parse(owner_url).context("parsing the database URL")?;
    url.set_username(SERVICE_ROLE).map_err(|()| anyhow!("cannot set a user on {owner_url}"))?;
    url.set_password(Some(&password)).map_err(|()| anyhow!("cannot set a password on {owner_url}"))?;
    Ok(url.to_string())
}

/// The bench process's peak resident set (VmHWM), in bytes.
fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb = status.lines().find_map(|l| l.strip_prefix("VmHWM:"))?.split_whitespace().next()?.parse::<u64>().ok()?;
    Some(kb * 1024)
}

impl Bench {
    fn peers(&self) -> Vec<Peer> {
        self.urls.keys().copied().collect()
    }

    async fn client(&self, peer: Peer) -> anyhow::Result<Client> {
        connect(&self.urls[&peer]).await
    }

    fn record(&mut self, op: Op, peer: Peer, sample: &Sample) {
        self.samples.entry((op, peer)).or_default().merge(sample);
    }

    async fn reset_statements(&self) -> anyhow::Result<()> {
        if let Some(counter) = &self.counter {
            counter.reset().await?;
        }
        Ok(())
    }

    async fn read_statements(&mut self, op: Op, peer: Peer) -> anyhow::Result<()> {
        if let Some(counter) = &self.counter {
            let count = counter.read(peer.database()).await?;
            let entry = self.statements.entry((op, peer)).or_default();
            entry.total += count.total;
            entry.connection_setup += count.connection_setup;
            if entry.top.is_empty() {
                entry.top = count.top;
            }
        }
        Ok(())
    }

    /// Runs one round of `op` on `peer`, counting its statements.
    async fn timed<F>(&mut self, op: Op, peer: Peer, run: F) -> anyhow::Result<()>
    where
        F: AsyncFnOnce(&Self) -> anyhow::Result<Sample>,
    {
        self.reset_statements().await?;
        let before = CpuClock::now();
        let mut sample = run(self).await.with_context(|| format!("{} on {}", op.label(0), peer.label()))?;
        let after = CpuClock::now();
        // pgbench's own CPU (a child, waited for) for its rows; the bench
        // process's for the drivers that run in it.
        sample.set_cpu(if peer.is_pgbench() { after.children_since(&before) } else { Some(after.own_since(&before)) });
        self.read_statements(op, peer).await?;
        self.record(op, peer, &sample);
        Ok(())
    }

    /// Runs `run` through pgbench on `peer`'s database (as the owner).
    fn floor(&self, peer: Peer, run: &floor::Run) -> anyhow::Result<Sample> {
        let pgbench = self.pgbench.as_ref().ok_or_else(|| anyhow!("no pgbench"))?;
        pgbench.run(&self.urls[&peer], run)
    }

    /// Sessions the append and list workloads use, made untimed.
    async fn setup_sessions(&mut self) -> anyhow::Result<()> {
        let n = self.plan.append_sessions;
        log(format!("setup: {} sessions to append to, {LIST_SESSIONS} sessions to list", 2 * n));
        for peer in self.peers() {
            if peer.is_pgbench() {
                let sql = self.client(peer).await?;
                let state = serde_json::to_string(&workload::initial_state())?;
                for base in [SEQUENTIAL_BASE, CONCURRENT_BASE] {
                    sql.execute(
                        "SELECT count(*) FROM generate_series($1::int, $2::int) g,
                           LATERAL adk_create_session(NULL, $3, g::text, g::text, $4::text::jsonb, NULL, '{}', '{}') c",
                        &[&(base as i32), &((base + n - 1) as i32), &APP, &state],
                    )
                    .await?;
                }
                sql.execute(
                    "SELECT count(*) FROM generate_series(1, $1::int) g,
                       LATERAL adk_create_session(NULL, $2, $3, 'l-' || g, $4::text::jsonb, NULL, '{}', '{}') c",
                    &[&(LIST_SESSIONS as i32), &APP, &LIST_USER, &state],
                )
                .await?;
                continue;
            }
            let driver = self.drivers[&peer].clone();
            for mode in ["seq", "con"] {
                for i in 0..n {
                    let (user, session) = append_session(mode, i);
                    driver.create(&user, &session).await?;
                }
            }
            ops::setup_list(&driver).await?;
        }
        Ok(())
    }

    async fn creates(&mut self) -> anyhow::Result<()> {
        let per_round = self.plan.creates_per_round();
        for round in 0..self.plan.create_rounds {
            log(format!("create: round {}/{} ({per_round} sessions each)", round + 1, self.plan.create_rounds));
            for peer in self.peers() {
                self.timed(Op::Create, peer, async |bench: &Self| match peer {
                    Peer::Floor | Peer::Functions => bench.floor(
                        peer,
                        &floor::create_run(flavor(peer), &format!("{}-create-{round}", peer.database()), per_round),
                    ),
                    _ => ops::create(&bench.drivers[&peer], round, per_round).await,
                })
                .await?;
            }
        }
        Ok(())
    }

    async fn appends(&mut self) -> anyhow::Result<()> {
        let plain = BoundEvent::of(0)?;
        let with_user = BoundEvent::of(workload::USER_DELTA_EVERY - 1)?;
        for (op, mode, base) in
            [(Op::AppendSequential, "seq", SEQUENTIAL_BASE), (Op::AppendConcurrent, "con", CONCURRENT_BASE)]
        {
            let concurrent = op == Op::AppendConcurrent;
            let rounds = self.plan.rounds_of_appends(concurrent);
            let per_round = self.plan.sessions_per_append_round(concurrent);
            for round in 0..rounds {
                log(format!(
                    "{}: round {}/{} ({per_round} sessions x {EVENTS_PER_SESSION} events)",
                    op.label(0),
                    round + 1,
                    rounds
                ));
                let first = round * per_round;
                let sessions: Vec<(String, String)> =
                    (first..first + per_round).map(|i| append_session(mode, i)).collect();
                for peer in self.peers() {
                    if concurrent && !peer.is_pgbench() {
                        // Open the pool's connections first, untimed, so the
                        // round measures appends, not connection set-up.
                        warm_up(&self.drivers[&peer], &sessions).await?;
                    }
                    let (plain, with_user, sessions) = (&plain, &with_user, &sessions);
                    self.timed(op, peer, async |bench: &Self| match (peer, op) {
                        (p, Op::AppendSequential) if p.is_pgbench() => {
                            let spread = Spread {
                                clients: 1,
                                threads: 1,
                                base: base + first,
                                per_client: per_round,
                                transactions: per_round * EVENTS_PER_SESSION,
                            };
                            bench.floor(
                                peer,
                                &floor::append_run(
                                    flavor(peer),
                                    &format!("{}-append-seq-{round}", peer.database()),
                                    spread,
                                    plain,
                                    with_user,
                                ),
                            )
                        }
                        (p, _) if p.is_pgbench() => {
                            let share = per_round / CONCURRENCY;
                            let spread = Spread {
                                clients: CONCURRENCY,
                                threads: 2,
                                base: base + first,
                                per_client: share,
                                transactions: share * EVENTS_PER_SESSION,
                            };
                            bench.floor(
                                peer,
                                &floor::append_run(
                                    flavor(peer),
                                    &format!("{}-append-con-{round}", peer.database()),
                                    spread,
                                    plain,
                                    with_user,
                                ),
                            )
                        }
                        (_, Op::AppendSequential) => ops::append_sequential(&bench.drivers[&peer], sessions).await,
                        _ => ops::append_concurrent(&bench.drivers[&peer], sessions).await,
                    })
                    .await?;
                }
            }
        }
        Ok(())
    }

    async fn hot_ratios(&self) -> anyhow::Result<BTreeMap<Peer, HotRatio>> {
        let expected = (2 * self.plan.append_sessions * EVENTS_PER_SESSION) as i64;
        let mut ratios = BTreeMap::new();
        for peer in self.peers() {
            let table = if peer.our_schema() { "adk_sessions" } else { "sessions" };
            let ratio = hot_ratio(&self.client(peer).await?, table, expected).await?;
            ratios.insert(peer, ratio);
        }
        Ok(ratios)
    }

    /// The sessions `get` reads: 40 events and the big one, filled through
    /// each implementation's own append (the floor's through our SQL).
    async fn setup_reads(&mut self) -> anyhow::Result<BTreeMap<Peer, ReadTargets>> {
        let big = self.plan.big_session_events;
        log(format!("setup: sessions of 40 and {big} events to read"));
        let mut targets = BTreeMap::new();
        for peer in self.peers() {
            if peer.is_pgbench() {
                let sql = self.client(peer).await?;
                let plain = BoundEvent::of(1)?;
                let state = serde_json::to_string(&workload::initial_state())?;
                let mut coordinates = Vec::new();
                for (session, events) in [(SMALL_SESSION, EVENTS_PER_SESSION), (BIG_SESSION, big)] {
                    sql.execute(
                        "SELECT adk_create_session(NULL, $1, $2, $3, $4::text::jsonb, NULL, '{}', '{}')",
                        &[&APP, &GET_USER, &session, &state],
                    )
                    .await?;
                    sql.execute(
                        "SELECT count(*) FROM generate_series(1, $4::int) g,
                           LATERAL adk_append_event(NULL, $1, $2, $3, 'e-' || g, $5, $6, $7,
                                                    $8::text::jsonb, $9::text::jsonb, '{}', '{}', NULL, NULL) a",
                        &[
                            &APP,
                            &GET_USER,
                            &session,
                            &(events as i32),
                            &plain.invocation_id,
                            &plain.author,
                            &plain.event_ts,
                            &plain.payload,
                            &plain.session_delta,
                        ],
                    )
                    .await?;
                    let row = sql
                        .query_one(
                            "SELECT session_day::text, last_seq FROM adk_sessions
                             WHERE app_name = $1 AND user_id = $2 AND session_id = $3",
                            &[&APP, &GET_USER, &session],
                        )
                        .await?;
                    coordinates.push(SessionCoordinates {
                        user: GET_USER.to_owned(),
                        session: session.to_owned(),
                        day: row.get(0),
                        last_seq: row.get(1),
                    });
                }
                let big_session = coordinates.pop().expect("two sessions");
                let small = coordinates.pop().expect("two sessions");
                targets.insert(peer, ReadTargets { small: Some(small), big: Some(big_session) });
                continue;
            }
            ops::setup_reads(&self.drivers[&peer], big).await?;
            targets.insert(peer, ReadTargets { small: None, big: None });
        }
        Ok(targets)
    }

    /// Leaves the server nothing of the write workloads to finish before
    /// the reads are timed. Creates and appends leave dead tuples and dirty
    /// pages behind, and autovacuum or a checkpoint working them off
    /// during the reads would take the CPU the reads are measured on: on
    /// two cores, a busy neighbour makes every operation cost more CPU
    /// time, for all implementations alike. The reads-only section
    /// (`--reads`) writes little before it measures, so it needs none.
    async fn settle(&self) -> anyhow::Result<()> {
        let started = Instant::now();
        let databases: std::collections::BTreeSet<&String> = self.urls.values().collect();
        for url in databases {
            connect(url).await?.batch_execute("VACUUM (ANALYZE)").await?;
        }
        let admin = connect(self.server.admin_url()).await?;
        if let Err(error) = admin.batch_execute("CHECKPOINT").await {
            log(format!("settling before the reads: no CHECKPOINT ({error})"));
        }
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let workers: i64 = admin
                .query_one("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'autovacuum worker'", &[])
                .await?
                .get(0);
            if workers == 0 || Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        log(format!(
            "settled before the reads: VACUUM (ANALYZE), CHECKPOINT, no autovacuum, {:.1} s",
            started.elapsed().as_secs_f64()
        ));
        Ok(())
    }

    async fn reads(&mut self, targets: &BTreeMap<Peer, ReadTargets>) -> anyhow::Result<()> {
        let big = self.plan.big_session_events;
        let small_reads = self.plan.small_reads;
        let big_reads = self.plan.big_reads;
        let workloads = [
            (Op::Get40, SMALL_SESSION, None, small_reads),
            (Op::Get40Recent20, SMALL_SESSION, Some(20), small_reads),
            (Op::GetBig, BIG_SESSION, None, big_reads),
            (Op::GetBigRecent20, BIG_SESSION, Some(20), small_reads),
        ];
        for round in 0..self.plan.read_rounds {
            for (op, session, recent, count) in workloads {
                log(format!("{}: round {}/{} ({count} reads)", op.label(big), round + 1, self.plan.read_rounds));
                for peer in self.peers() {
                    self.timed(op, peer, async |bench: &Self| match peer {
                        Peer::Floor | Peer::Functions => {
                            let at = if session == SMALL_SESSION { &targets[&peer].small } else { &targets[&peer].big };
                            let at = at.as_ref().ok_or_else(|| anyhow!("no floor session"))?;
                            bench.floor(
                                peer,
                                &floor::get_run(
                                    flavor(peer),
                                    &format!("{}-{session}-{recent:?}-{round}", peer.database()),
                                    count,
                                    at,
                                    recent,
                                ),
                            )
                        }
                        _ => ops::read(&bench.drivers[&peer], op, big, count).await,
                    })
                    .await?;
                }
            }
            log(format!(
                "{}: round {}/{} ({small_reads} lists)",
                Op::List100.label(big),
                round + 1,
                self.plan.read_rounds
            ));
            for peer in self.peers() {
                self.timed(Op::List100, peer, async |bench: &Self| match peer {
                    Peer::Floor | Peer::Functions => bench.floor(
                        peer,
                        &floor::list_run(
                            flavor(peer),
                            &format!("{}-list-{round}", peer.database()),
                            small_reads,
                            LIST_USER,
                        ),
                    ),
                    _ => ops::read(&bench.drivers[&peer], Op::List100, big, small_reads).await,
                })
                .await?;
            }
        }
        Ok(())
    }

    /// What the server says of the implementations' connections still open
    /// after the reads (the drivers' pools; pgbench's have ended): the
    /// comparisons' evidence that every one of them ran on plaintext.
    async fn peer_connections(&self) -> anyhow::Result<SslCount> {
        let databases: Vec<&str> = self.peers().iter().map(|peer| peer.database()).collect();
        let count = SslCount::read(&connect(self.server.admin_url()).await?, &databases, None).await?;
        anyhow::ensure!(count.encrypted == 0, "connections of the compared implementations are encrypted: {count:?}");
        Ok(count)
    }

    /// Our SQL functions through pgbench, unnamed against prepared
    /// ([`crate::protocol`]), on the database and sessions of their rows
    /// in the main table (appending to the sequential workload's sessions
    /// again), when pgbench is there.
    async fn statement_protocols(
        &mut self,
        targets: &BTreeMap<Peer, ReadTargets>,
    ) -> anyhow::Result<Option<ProtocolReport>> {
        let peer = Peer::Functions;
        let (Some(pgbench), Some(ReadTargets { small: Some(small), .. })) = (self.pgbench.clone(), targets.get(&peer))
        else {
            return Ok(None);
        };
        let plain = BoundEvent::of(0)?;
        let with_user = BoundEvent::of(workload::USER_DELTA_EVERY - 1)?;
        let appends = Spread {
            clients: 1,
            threads: 1,
            base: SEQUENTIAL_BASE,
            per_client: self.plan.append_sessions,
            transactions: self.plan.sessions_per_append_round(false) * EVENTS_PER_SESSION,
        };
        let workloads = [Op::Create, Op::AppendSequential, Op::Get40, Op::List100];
        let mut samples: Vec<[Sample; 2]> = workloads.iter().map(|_| Default::default()).collect();
        let rounds = self.plan.read_rounds;
        for round in 0..rounds {
            log(format!("statement protocol: round {}/{rounds}, our SQL functions unnamed vs prepared", round + 1));
            let order = if round % 2 == 0 {
                [Protocol::Prepared, Protocol::Extended]
            } else {
                [Protocol::Extended, Protocol::Prepared]
            };
            for (i, &op) in workloads.iter().enumerate() {
                for protocol in order {
                    let name = format!("{}-protocol-{op:?}-{protocol:?}-{round}", peer.database());
                    let run = match op {
                        Op::Create => floor::create_run(Flavor::Functions, &name, self.plan.creates_per_round()),
                        Op::AppendSequential => {
                            floor::append_run(Flavor::Functions, &name, appends, &plain, &with_user)
                        }
                        Op::Get40 => floor::get_run(Flavor::Functions, &name, self.plan.small_reads, small, None),
                        _ => floor::list_run(Flavor::Functions, &name, self.plan.small_reads, LIST_USER),
                    };
                    let sample = pgbench
                        .run(&self.urls[&peer], &floor::Run { protocol, ..run })
                        .with_context(|| format!("{} with -M {protocol:?}", op.label(0)))?;
                    samples[i][protocol as usize].merge(&sample);
                }
            }
        }
        let rows = workloads
            .iter()
            .zip(samples)
            .map(|(&op, [prepared, unnamed])| {
                let (prepared, unnamed) = (prepared.summary(), unnamed.summary());
                ProtocolRow {
                    op,
                    operation: op.label(self.plan.big_session_events),
                    ops_unnamed_vs_prepared: ratio(unnamed.ops_per_sec, prepared.ops_per_sec),
                    p50_unnamed_vs_prepared: ratio(unnamed.p50_ms, prepared.p50_ms),
                    prepared,
                    unnamed,
                }
            })
            .collect();
        Ok(Some(ProtocolReport { rounds, rows }))
    }

    /// The TLS leg, on a database of its own, when the server's CA is known.
    async fn tls_leg(&mut self, today: NaiveDate) -> anyhow::Result<Option<TlsReport>> {
        let Some(transport) = self.server.verified_tls() else {
            self.notes
                .push("no TLS leg: no CA to verify the server against (DATABASE_URL names no sslrootcert)".to_owned());
            return Ok(None);
        };
        log(format!(
            "TLS leg: our store over sslmode={} vs sslmode=disable, {} interleaved rounds",
            transport.sslmode(),
            self.plan.tls_rounds
        ));
        let url = self.server.fresh_database(TLS_DATABASE).await?;
        migrate_ours(&url, today).await?;
        let report = tls::measure(&url, TLS_DATABASE, &transport, &self.plan).await?;
        self.server.drop_database(TLS_DATABASE).await?;
        Ok(Some(report))
    }

    /// Round trips per operation at the protocol level, through a counting
    /// proxy (the testing crate's `WireProxy`), in an untimed pass after
    /// warm-up: the extra hop would distort latencies.
    async fn round_trips(&mut self, targets: &BTreeMap<Peer, ReadTargets>) -> anyhow::Result<RoundTrips> {
        log("round trips: counting through a proxy (untimed)");
        let proxy = WireProxy::in_front_of(self.server.admin_url())?.refuse_encryption().start()?;
        let n = self.plan.round_trip_ops;
        let mut counts = RoundTrips::default();
        for peer in self.peers() {
            let url = proxied(self.service_urls.get(&peer).unwrap_or(&self.urls[&peer]), &proxy)?;
            if peer.is_pgbench() {
                let Some(pgbench) = self.pgbench.clone() else { continue };
                let plain = BoundEvent::of(0)?;
                let with_user = BoundEvent::of(workload::USER_DELTA_EVERY - 1)?;
                let ReadTargets { small: Some(small), big: Some(big_session) } = &targets[&peer] else { continue };
                // Two runs of different lengths: their difference is free of
                // connection set-up and statement preparation.
                let runs = |t: usize| -> Vec<(RoundTripKind, floor::Run)> {
                    let spread =
                        Spread { clients: 1, threads: 1, base: SEQUENTIAL_BASE, per_client: 1, transactions: t };
                    let mut only_plain = floor::append_run(flavor(peer), "rt-append", spread, &plain, &with_user);
                    only_plain.scripts.truncate(1);
                    let mut only_user = floor::append_run(flavor(peer), "rt-append-user", spread, &plain, &with_user);
                    only_user.scripts.remove(0);
                    vec![
                        (RoundTripKind::Create, floor::create_run(flavor(peer), "rt-create", t)),
                        (RoundTripKind::Append, only_plain),
                        (RoundTripKind::AppendUserDelta, only_user),
                        (RoundTripKind::Get, floor::get_run(flavor(peer), "rt-get", t, small, None)),
                        (
                            RoundTripKind::GetRecent,
                            floor::get_run(flavor(peer), "rt-get-recent", t, big_session, Some(20)),
                        ),
                        (RoundTripKind::List, floor::list_run(flavor(peer), "rt-list", t, LIST_USER)),
                    ]
                };
                let (short, long) = (runs(2), runs(2 + n));
                for ((kind, short), (_, long)) in short.into_iter().zip(long) {
                    let before = proxy.traffic();
                    pgbench.run(&url, &short)?;
                    let mid = proxy.traffic();
                    pgbench.run(&url, &long)?;
                    let after = proxy.traffic();
                    let traffic = after.minus(mid).minus(mid.minus(before));
                    counts.insert(kind, peer, traffic, n);
                }
                continue;
            }
            let driver = Driver::connect(peer, &url).await?;
            let tag = format!("rt-{}", peer.database());
            // Each kind is counted after a few untimed operations of its own,
            // so statement caches are warm and the pool's connection is open.
            for i in 0..WARM_UP {
                driver.create("rt", &format!("{tag}-warm-{i}")).await?;
            }
            let before = proxy.traffic();
            for i in 0..n {
                driver.create("rt", &format!("{tag}-{i}")).await?;
            }
            counts.insert(RoundTripKind::Create, peer, proxy.traffic().minus(before), n);
            // appends with a session delta only, then with a user: delta too
            let session = format!("{tag}-0");
            // One invocation throughout: the user's events here are never
            // answered, so a new invocation each time would find the session
            // busy under the invocation lease.
            let invocation = format!("{tag}-invocation");
            for (kind, offset) in [(RoundTripKind::Append, 0), (RoundTripKind::AppendUserDelta, 9)] {
                for i in 0..WARM_UP {
                    let mut event = workload::event(offset);
                    event.invocation_id = invocation.clone();
                    driver.append("rt", &format!("{tag}-warm-{i}"), driver.prepare(event)?).await?;
                }
                let before = proxy.traffic();
                for i in 0..n {
                    let mut event = workload::event(offset + 10 * (i + 1));
                    event.invocation_id = invocation.clone();
                    driver.append("rt", &session, driver.prepare(event)?).await?;
                }
                counts.insert(kind, peer, proxy.traffic().minus(before), n);
            }
            // reads
            for (kind, session, recent) in
                [(RoundTripKind::Get, SMALL_SESSION, None), (RoundTripKind::GetRecent, BIG_SESSION, Some(20))]
            {
                for _ in 0..WARM_UP {
                    driver.get(GET_USER, session, recent).await?;
                }
                let before = proxy.traffic();
                for _ in 0..n {
                    driver.get(GET_USER, session, recent).await?;
                }
                counts.insert(kind, peer, proxy.traffic().minus(before), n);
            }
            for _ in 0..WARM_UP {
                driver.list(LIST_USER).await?;
            }
            let before = proxy.traffic();
            for _ in 0..n {
                driver.list(LIST_USER).await?;
            }
            counts.insert(RoundTripKind::List, peer, proxy.traffic().minus(before), n);
        }
        Ok(counts)
    }

    /// The crowd sections: ours through the adk trait with the default
    /// pool (16 connections), as the bound service role acting per request,
    /// at each crowd size; adk-session at the smallest.
    async fn crowd(&mut self) -> anyhow::Result<Vec<CrowdResult>> {
        let duration = Duration::from_secs(self.plan.crowd_secs);
        let largest = self.plan.crowd_writers.iter().copied().max().unwrap_or(0);
        let smallest = self.plan.crowd_writers.iter().copied().min().unwrap_or(0);
        let mut results = Vec::new();
        if let Some(url) = self.service_urls.get(&Peer::Ours) {
            let waits = crowd::Waits::default();
            let log_wait = waits.clone();
            let store = PgSessionStore::connect(url, &pool_config(), Default::default())
                .await
                .context("connecting the crowd's store")?
                .with_tenant_scope(TenantScope::PerRequest)
                .with_checkout_observer(Arc::new(move |wait| {
                    if let Ok(mut waits) = log_wait.lock() {
                        waits.push(wait);
                    }
                }));
            let service: Arc<dyn SessionService> = Arc::new(PgSessionService::from_store(store.clone()));
            log(format!("crowd: {largest} sessions for ours (untimed)"));
            crowd::setup(&service, largest).await?;
            for &writers in &self.plan.crowd_writers {
                log(format!("crowd: {writers} writers through ours for {} s", duration.as_secs()));
                results
                    .push(crowd::run(Peer::Ours.label(), &service, Some((&store, &waits)), writers, duration).await?);
            }
        }
        if let Some(Driver::Service(service)) = self.drivers.get(&Peer::AdkSession) {
            let service = service.clone();
            log(format!("crowd: {smallest} sessions for adk-session (untimed)"));
            crowd::setup(&service, smallest).await?;
            log(format!("crowd: {smallest} writers through adk-session for {} s", duration.as_secs()));
            results.push(crowd::run(Peer::AdkSession.label(), &service, None, smallest, duration).await?);
        }
        Ok(results)
    }

    fn measured(&self) -> Vec<Measured> {
        self.samples
            .iter()
            .map(|(&(op, peer), sample)| {
                let statements = self.statements.get(&(op, peer));
                let ops = sample.ops();
                Measured {
                    op,
                    peer,
                    latency: sample.summary(),
                    statements_per_op: statements.map(|s| s.total as f64 / ops.max(1) as f64),
                    connection_setup_statements: statements.map(|s| s.connection_setup),
                    top_statements: statements.map(|s| s.top.clone()).unwrap_or_default(),
                    ratios: Default::default(),
                }
            })
            .collect()
    }
}

/// The SQL a pgbench-driven peer sends.
fn flavor(peer: Peer) -> Flavor {
    if peer == Peer::Floor { Flavor::Lean } else { Flavor::Functions }
}

/// Where each implementation's get workloads read (the floor needs the
/// coordinates the event read binds).
#[derive(Debug, Clone)]
pub struct ReadTargets {
    small: Option<SessionCoordinates>,
    big: Option<SessionCoordinates>,
}

/// Opens the connections a concurrent workload will use: `CONCURRENCY`
/// clients loading sessions it will append to, over and over.
async fn warm_up(driver: &Driver, sessions: &[(String, String)]) -> anyhow::Result<()> {
    let loads: Vec<_> = sessions
        .iter()
        .take(CONCURRENCY)
        .map(|(user, session)| {
            let (driver, user, session) = (driver.clone(), user.clone(), session.clone());
            tokio::spawn(async move {
                for _ in 0..10 {
                    driver.get(&user, &session, Some(0)).await?;
                }
                anyhow::Ok(())
            })
        })
        .collect();
    for load in loads {
        load.await??;
    }
    Ok(())
}

/// `url` through the proxy, on plaintext: the proxy parses the protocol
/// and cannot read TLS.
fn proxied(url: &str, proxy: &WireProxy) -> anyhow::Result<String> {
    Ok(proxy.url(&with_transport(url, &Transport::Plaintext)?)?)
}

/// `target/bench` of this workspace (or of `CARGO_TARGET_DIR`).
pub fn default_out_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    let dir = target.join("bench");
    std::fs::create_dir_all(&dir).ok();
    dir.canonicalize().unwrap_or(dir)
}

pub use report::write_outputs;
