//! Reads (issue 37, "reads beat the peer"): a get of a 40-event session, a
//! get of a 1,000-event session and a listing of a user's 100 sessions,
//! through adk-rust's `SessionService` trait, on three implementations in
//! one run on one cluster:
//!
//! - ours, `PgSessionService` connected as the main table connects it (the
//!   bound service role acting per request), on plaintext;
//! - adk-session's `PostgresSessionService`, on plaintext, as in the main
//!   table;
//! - ours again over TLS (`sslmode=verify-full`, as the TLS leg sets it
//!   up), on the same database and sessions as ours on plaintext.
//!
//! The sessions, the events in them and the workloads are the main table's
//! ([`ops::setup_reads`], [`ops::setup_list`], [`ops::read`]), so the
//! figures compare with its rows. Rounds alternate which implementation
//! goes first ([`order`]), so drift and checkpoints fall on all alike;
//! ops/s is the median over rounds, p50 and p99 over every operation, and
//! client CPU the bench process's user + system time over the timed
//! sections, as in the main table. At the end the server's `pg_stat_ssl`
//! says what each implementation's connections are, and the run fails if
//! a plaintext one was encrypted or a TLS one was not.
//!
//! The targets ([`targets`]) are judged here and, from the main table's
//! rows, at the end of a full run too; they are reported, never asserted:
//! timings on a shared machine are too noisy to fail a run on.

use std::collections::BTreeMap;
use std::time::Instant;

use adk_postgres_storage::PoolConfig;
use anyhow::{Context as _, ensure};
use chrono::NaiveDate;
use comfy_table::presets::ASCII_MARKDOWN;
use comfy_table::{CellAlignment, Table};
use serde::Serialize;

use crate::cpu::{CpuClock, MachineClock};
use crate::driver::{Driver, Peer, pool_config};
use crate::measure::{Latency, Sample};
use crate::ops::{self, Op};
use crate::report::{self, Machine, Target, ratio};
use crate::run::{bound_service_url, log, migrate_adk_session, migrate_ours};
use crate::server::{Server, ServerInfo, connect, with_transport};
use crate::tls::{PLAIN_APPLICATION, SslCount, TLS_APPLICATION};
use crate::workload::{EVENTS_PER_SESSION, LIST_SESSIONS};

/// Ours on both transports reads this one, adk-session its own.
const OURS_DATABASE: &str = "adk_bench_reads_ours";
const ADK_SESSION_DATABASE: &str = "adk_bench_reads_adk_session";
/// Untimed operations of each workload on each implementation before the
/// first round: every pool's connection is open (the TLS handshake done)
/// and the server's caches are warm.
const WARM_UP: usize = 10;

/// The operations of the section, in the order of its table.
pub const OPS: [Op; 3] = [Op::Get40, Op::GetBig, Op::List100];

/// Ours through the adk trait over adk-session, ops/s, at least: issue 37's
/// targets, on plaintext and with ours over TLS.
pub const SPEEDUPS: [(Op, f64); 3] = [(Op::List100, 1.2), (Op::Get40, 1.5), (Op::GetBig, 2.0)];
/// Client CPU per event of a get of the big session (ours, adk trait, on
/// plaintext), in microseconds, at most.
pub const CPU_PER_EVENT_US: f64 = 3.0;

/// Sizes of the section.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct ReadsPlan {
    pub quick: bool,
    pub rounds: usize,
    /// Operations per round and implementation: gets of the 40-event
    /// session and listings; gets of the big session.
    pub small_reads: usize,
    pub big_reads: usize,
    pub big_session_events: usize,
}

impl ReadsPlan {
    fn count(&self, op: Op) -> usize {
        if op == Op::GetBig { self.big_reads } else { self.small_reads }
    }
}

/// Which implementation reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Reader {
    Ours,
    OursTls,
    AdkSession,
}

impl Reader {
    pub const ALL: [Reader; 3] = [Reader::Ours, Reader::OursTls, Reader::AdkSession];

    pub fn label(self) -> &'static str {
        match self {
            Reader::Ours => Peer::Ours.label(),
            Reader::OursTls => "ours (adk trait, TLS)",
            Reader::AdkSession => Peer::AdkSession.label(),
        }
    }
}

/// One operation on one implementation.
#[derive(Debug, Clone, Serialize)]
pub struct ReadsRow {
    pub op: Op,
    pub operation: String,
    pub reader: Reader,
    pub implementation: &'static str,
    #[serde(flatten)]
    pub latency: Latency,
    /// Events one operation reads (the gets).
    pub events_per_op: Option<usize>,
    pub client_cpu_us_per_event: Option<f64>,
    /// ops/s over adk-session's (medians over rounds).
    pub ops_vs_adk_session: Option<f64>,
}

/// What the server saw of one implementation's connections after the rounds.
#[derive(Debug, Clone, Serialize)]
pub struct ReaderConnections {
    pub reader: Reader,
    pub sslmode: &'static str,
    pub connections: SslCount,
}

#[derive(Debug, Clone, Serialize)]
pub struct ReadsReport {
    pub plan: ReadsPlan,
    /// The bench process's global allocator.
    pub allocator: &'static str,
    pub machine: Machine,
    pub server: ServerInfo,
    pub rows: Vec<ReadsRow>,
    pub connections: Vec<ReaderConnections>,
    pub targets: Vec<Target>,
    pub notes: Vec<String>,
    pub elapsed_secs: f64,
}

/// Issue 37's targets, judged on `latency` of each operation and
/// implementation (`None`: not measured); `big`: events of the big session.
/// The one definition both this section and the full run's table use.
pub fn targets<'a>(big: usize, latency: impl Fn(Op, Reader) -> Option<&'a Latency>) -> Vec<Target> {
    let speedup = |op: Op, reader: Reader, wanted: f64, base: &str| {
        let measured = latency(op, reader)
            .zip(latency(op, Reader::AdkSession))
            .and_then(|(ours, peer)| ratio(ours.ops_per_sec, peer.ops_per_sec));
        Target {
            name: format!("{}: {} / adk-session{base}, ops/s", op.label(big), reader.label()),
            measured: measured.map_or_else(|| "not measured".to_owned(), |x| format!("{x:.3}x")),
            wanted: format!(">= {wanted}x"),
            met: measured.map(|x| x >= wanted),
        }
    };
    let mut targets: Vec<Target> = SPEEDUPS.iter().map(|&(op, wanted)| speedup(op, Reader::Ours, wanted, "")).collect();
    let per_event =
        latency(Op::GetBig, Reader::Ours).and_then(|l| l.client_cpu_us_per_op).map(|cpu| cpu / big.max(1) as f64);
    targets.push(Target {
        name: format!("{}: {}, client CPU per event read", Op::GetBig.label(big), Reader::Ours.label()),
        measured: per_event.map_or_else(|| "not measured".to_owned(), |us| format!("{us:.2} µs")),
        wanted: format!("<= {CPU_PER_EVENT_US} µs"),
        met: per_event.map(|us| us <= CPU_PER_EVENT_US),
    });
    targets.extend(SPEEDUPS.iter().map(|&(op, wanted)| speedup(op, Reader::OursTls, wanted, " (plaintext)")));
    targets
}

/// The targets as a table: what was wanted, what was measured, met or missed.
pub fn targets_table(targets: &[Target]) -> Table {
    let mut table = Table::new();
    table.load_style(ASCII_MARKDOWN);
    table.set_header(vec!["target", "wanted", "measured", "verdict"]);
    for t in targets {
        let verdict = match t.met {
            Some(true) => "met",
            Some(false) => "missed",
            None => "n/a",
        };
        table.add_row(vec![t.name.clone(), t.wanted.clone(), t.measured.clone(), verdict.to_owned()]);
    }
    for i in 1..=2 {
        if let Some(column) = table.column_mut(i) {
            column.set_cell_alignment(CellAlignment::Right);
        }
    }
    table
}

/// `items` in the order of round `round`: rotated every two rounds and
/// reversed in odd ones, so every two rounds run each pair in both orders,
/// and every six put each of three first twice.
fn order<T: Copy>(items: &[T], round: usize) -> Vec<T> {
    let mut order = items.to_vec();
    if !order.is_empty() {
        let shift = (round / 2) % order.len();
        order.rotate_left(shift);
    }
    if round % 2 == 1 {
        order.reverse();
    }
    order
}

/// Runs the section on databases of its own on `server`.
pub async fn measure(server: &Server, today: NaiveDate, plan: ReadsPlan) -> anyhow::Result<ReadsReport> {
    let began = Instant::now();
    let load_at_start = report::load_average();
    let big = plan.big_session_events;
    let mut notes = Vec::new();

    log("reads: a database for ours (both transports), one for adk-session");
    let ours_url = server.fresh_database(OURS_DATABASE).await?;
    migrate_ours(&ours_url, today).await?;
    let service_url = bound_service_url(&ours_url).await?;
    let adk_url = server.fresh_database(ADK_SESSION_DATABASE).await?;
    migrate_adk_session(&adk_url).await?;
    let named = |application_name: &str| PoolConfig { application_name: application_name.to_owned(), ..pool_config() };
    let mut drivers = BTreeMap::new();
    drivers.insert(Reader::Ours, Driver::connect_with(Peer::Ours, &service_url, &named(PLAIN_APPLICATION)).await?);
    let tls = server.verified_tls();
    match &tls {
        Some(transport) => {
            let url = with_transport(&service_url, transport)?;
            drivers.insert(Reader::OursTls, Driver::connect_with(Peer::Ours, &url, &named(TLS_APPLICATION)).await?);
        }
        None => {
            notes.push("no TLS rows: no CA to verify the server against (DATABASE_URL names no sslrootcert)".to_owned())
        }
    }
    drivers.insert(Reader::AdkSession, Driver::connect(Peer::AdkSession, &adk_url).await?);

    log(format!(
        "reads: setup, sessions of {EVENTS_PER_SESSION} and {big} events and {LIST_SESSIONS} sessions to list, on \
         ours and adk-session (untimed)"
    ));
    for reader in [Reader::Ours, Reader::AdkSession] {
        ops::setup_reads(&drivers[&reader], big).await?;
        ops::setup_list(&drivers[&reader]).await?;
    }
    for driver in drivers.values() {
        for op in OPS {
            ops::read(driver, op, big, WARM_UP).await?;
        }
    }

    let readers: Vec<Reader> = Reader::ALL.into_iter().filter(|r| drivers.contains_key(r)).collect();
    let mut samples: BTreeMap<(Op, Reader), Sample> = BTreeMap::new();
    let rounds_began = MachineClock::now();
    for round in 0..plan.rounds {
        let order = order(&readers, round);
        let names: Vec<&str> = order.iter().map(|r| r.label()).collect();
        log(format!("reads: round {}/{}, {}", round + 1, plan.rounds, names.join(", then ")));
        for op in OPS {
            for &reader in &order {
                let before = CpuClock::now();
                let mut sample = ops::read(&drivers[&reader], op, big, plan.count(op))
                    .await
                    .with_context(|| format!("{} on {}", op.label(big), reader.label()))?;
                sample.set_cpu(Some(CpuClock::now().own_since(&before)));
                samples.entry((op, reader)).or_default().merge(&sample);
            }
        }
    }

    if let Some(note) = crate::cpu::busy_beside_note(rounds_began) {
        log(&note);
        notes.push(note);
    }

    let sql = connect(server.admin_url()).await?;
    let mut connections = Vec::new();
    for &reader in &readers {
        let (database, application, sslmode) = match (reader, &tls) {
            (Reader::OursTls, Some(transport)) => (OURS_DATABASE, Some(TLS_APPLICATION), transport.sslmode()),
            (Reader::Ours, _) => (OURS_DATABASE, Some(PLAIN_APPLICATION), "disable"),
            _ => (ADK_SESSION_DATABASE, None, "disable"),
        };
        let applications = application.map(|a| [a]);
        let count = SslCount::read(&sql, &[database], applications.as_ref().map(|a| &a[..])).await?;
        ensure!(count.connections > 0, "{} has no connection open after the rounds: {count:?}", reader.label());
        if reader == Reader::OursTls {
            ensure!(count.encrypted == count.visible, "{} has connections on plaintext: {count:?}", reader.label());
        } else {
            ensure!(count.encrypted == 0, "{}'s connections are encrypted: {count:?}", reader.label());
        }
        connections.push(ReaderConnections { reader, sslmode, connections: count });
    }
    drop(drivers);
    if !server.is_throwaway() {
        for database in [OURS_DATABASE, ADK_SESSION_DATABASE] {
            server.drop_database(database).await?;
        }
    }

    let summaries: BTreeMap<(Op, Reader), Latency> =
        samples.iter().map(|(&key, sample)| (key, sample.summary())).collect();
    let mut rows = Vec::new();
    for op in OPS {
        for reader in Reader::ALL {
            let Some(latency) = summaries.get(&(op, reader)) else { continue };
            let events = op.events_read(big);
            rows.push(ReadsRow {
                op,
                operation: op.label(big),
                reader,
                implementation: reader.label(),
                latency: latency.clone(),
                events_per_op: events,
                client_cpu_us_per_event: latency.client_cpu_us_per_op.zip(events).map(|(cpu, n)| cpu / n as f64),
                ops_vs_adk_session: (reader != Reader::AdkSession)
                    .then(|| summaries.get(&(op, Reader::AdkSession)))
                    .flatten()
                    .and_then(|peer| ratio(latency.ops_per_sec, peer.ops_per_sec)),
            });
        }
    }
    let targets = targets(big, |op, reader| summaries.get(&(op, reader)));
    Ok(ReadsReport {
        plan,
        allocator: report::allocator(),
        machine: Machine { load_average_start: load_at_start, ..Machine::detect() },
        server: server.info(),
        rows,
        connections,
        targets,
        notes,
        elapsed_secs: began.elapsed().as_secs_f64(),
    })
}

impl ReadsReport {
    pub fn table(&self) -> Table {
        let mut table = Table::new();
        table.load_style(ASCII_MARKDOWN);
        table.set_header(vec![
            "operation",
            "implementation",
            "ops/s",
            "rounds min-max",
            "p50 ms",
            "p99 ms",
            "ops/s vs adk-session",
            "client CPU µs/op",
            "client CPU µs/event",
        ]);
        let dash = || "-".to_owned();
        for row in &self.rows {
            let l = &row.latency;
            table.add_row(vec![
                row.operation.clone(),
                row.implementation.to_owned(),
                format!("{:.0}", l.ops_per_sec),
                l.round_range().map_or_else(dash, |(lo, hi)| format!("{lo:.0}-{hi:.0}")),
                format!("{:.3}", l.p50_ms),
                format!("{:.3}", l.p99_ms),
                row.ops_vs_adk_session.map_or_else(dash, |r| format!("{r:.2}x")),
                l.client_cpu_us_per_op.map_or_else(dash, |c| format!("{c:.0}")),
                row.client_cpu_us_per_event.map_or_else(dash, |c| format!("{c:.2}")),
            ]);
        }
        for i in 2..=8 {
            if let Some(column) = table.column_mut(i) {
                column.set_cell_alignment(CellAlignment::Right);
            }
        }
        table
    }
}

impl std::fmt::Display for ReadsReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let p = &self.plan;
        writeln!(f, "{}", self.machine.describe())?;
        writeln!(f, "PostgreSQL: {}; allocator of the bench process: {}", self.server.source, self.allocator)?;
        writeln!(
            f,
            "Reads: {} interleaved rounds (the implementation going first changes round by round), each \
             {} gets of {EVENTS_PER_SESSION} events, {} gets of {} events and {} lists of {LIST_SESSIONS} \
             sessions per implementation, one after another through adk_session::SessionService; ops/s: median \
             over rounds; p50, p99: over every operation; client CPU: user+sys of the bench process over the \
             timed sections, per operation and per event read",
            p.rounds, p.small_reads, p.big_reads, p.big_session_events, p.small_reads
        )?;
        writeln!(
            f,
            "  {:<22} PgSessionService (crates/adk), the bound service role acting per request",
            Reader::Ours.label()
        )?;
        writeln!(f, "  {:<22} the same, on the same database and sessions, over TLS", Reader::OursTls.label())?;
        writeln!(f, "  {:<22} adk-session 2.3's PostgresSessionService (sqlx)", Reader::AdkSession.label())?;
        writeln!(f, "{}", self.table())?;
        writeln!(f, "  the server's view after the rounds (pg_stat_ssl):")?;
        for c in &self.connections {
            writeln!(f, "    {:<22} sslmode={:<12} {}", c.reader.label(), c.sslmode, c.connections.describe())?;
        }
        writeln!(
            f,
            "Targets (reported, never asserted; {}):",
            if p.quick { "a quick run: indicative only" } else { "ratios within this run" }
        )?;
        writeln!(f, "{}", targets_table(&self.targets))?;
        for note in &self.notes {
            writeln!(f, "Note: {note}")?;
        }
        write!(f, "Took {:.0} s.", self.elapsed_secs)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn latency(ops_per_sec: f64, cpu_us_per_op: f64) -> Latency {
        let mut sample = Sample::default();
        sample.record(Duration::from_millis(1));
        sample.end_round(ops_per_sec as u64, Duration::from_secs(1));
        sample.set_cpu(Some(Duration::from_secs_f64(cpu_us_per_op * ops_per_sec / 1e6)));
        sample.summary()
    }

    #[test]
    fn targets_are_judged_on_what_was_measured() {
        let figures: BTreeMap<(Op, Reader), Latency> = [
            ((Op::List100, Reader::Ours), latency(1300.0, 100.0)),
            ((Op::List100, Reader::AdkSession), latency(1000.0, 100.0)),
            ((Op::Get40, Reader::Ours), latency(1400.0, 100.0)),
            ((Op::Get40, Reader::AdkSession), latency(1000.0, 100.0)),
            ((Op::GetBig, Reader::Ours), latency(200.0, 2500.0)),
            ((Op::GetBig, Reader::AdkSession), latency(100.0, 9000.0)),
        ]
        .into();
        let targets = targets(1_000, |op, reader| figures.get(&(op, reader)));
        let met: Vec<Option<bool>> = targets.iter().map(|t| t.met).collect();
        assert_eq!(met, [Some(true), Some(false), Some(true), Some(true), None, None, None]);
        assert_eq!(targets[3].measured, "2.50 µs");
        assert_eq!(targets[1].measured, "1.400x");
        assert!(targets[4].name.contains("TLS"), "{}", targets[4].name);
        assert_eq!(targets[6].measured, "not measured");
    }

    #[test]
    fn every_pair_runs_in_both_orders_every_two_rounds() {
        let items = [0, 1, 2];
        let orders: Vec<Vec<i32>> = (0..6).map(|round| order(&items, round)).collect();
        for pair in orders.chunks(2) {
            for a in items {
                for b in items.into_iter().filter(|&b| b != a) {
                    let before = |o: &Vec<i32>| o.iter().position(|&x| x == a) < o.iter().position(|&x| x == b);
                    assert_ne!(before(&pair[0]), before(&pair[1]), "{pair:?}");
                }
            }
        }
        for item in items {
            assert_eq!(orders.iter().filter(|o| o[0] == item).count(), 2, "{orders:?}");
        }
        assert_eq!(order(&[1, 2], 1), [2, 1]);
        assert!(order::<i32>(&[], 3).is_empty());
    }
}
