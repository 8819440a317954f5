//! The results: a table on stdout and a JSON file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use adk_postgres_testing::Traffic;
use anyhow::Context as _;
use comfy_table::presets::ASCII_MARKDOWN;
use comfy_table::{CellAlignment, Table};
use serde::Serialize;

use crate::archive::ArchiveReport;
use crate::crowd::CrowdResult;
use crate::driver::Peer;
use crate::erase::EraseBenchReport;
use crate::feed::FeedLatencyReport;
use crate::labels::LabelListReport;
use crate::lease::LeaseReport;
use crate::measure::Latency;
use crate::media::MediaReport;
use crate::ops::Op;
use crate::paging::PagingReport;
use crate::pgstat::HotRatio;
use crate::protocol::ProtocolReport;
use crate::reads::{self, Reader};
use crate::retention::RetentionReport;
use crate::rollup::{RollupBenchReport, RollupRun};
use crate::server::{ServerInfo, human_bytes};
use crate::tls::{SslCount, TlsReport};
use crate::toast::ToastReport;
use crate::workload::Plan;

/// One operation on one implementation.
#[derive(Debug, Clone, Serialize)]
pub struct Measured {
    pub op: Op,
    pub peer: Peer,
    #[serde(flatten)]
    pub latency: Latency,
    /// Top-level statements per operation (pg_stat_statements).
    pub statements_per_op: Option<f64>,
    /// `SET` statements of connections the pool opened during the workload
    /// (not counted in `statements_per_op`).
    pub connection_setup_statements: Option<i64>,
    /// The statements behind that figure, most calls first.
    pub top_statements: Vec<(String, i64)>,
    /// This row against the references of the same run (filled in by
    /// [`Report::with_targets`]).
    pub ratios: Ratios,
}

/// A row's ratios to the references measured in the same run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Ratios {
    /// ops/s over the floor's (lean SQL through pgbench).
    pub ops_vs_floor: Option<f64>,
    /// p50 over the floor's p50.
    pub p50_vs_floor: Option<f64>,
    /// ops/s over our SQL functions through pgbench.
    pub ops_vs_our_sql_functions: Option<f64>,
    /// ops/s over adk-session's.
    pub ops_vs_adk_session: Option<f64>,
}

/// What the round-trip pass counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RoundTripKind {
    Create,
    /// An append with a session delta only.
    Append,
    /// An append with a session and a `user:` delta.
    AppendUserDelta,
    /// A get of a whole session.
    Get,
    /// A get of the 20 most recent events.
    GetRecent,
    List,
}

impl RoundTripKind {
    pub const ALL: [RoundTripKind; 6] = [
        RoundTripKind::Create,
        RoundTripKind::Append,
        RoundTripKind::AppendUserDelta,
        RoundTripKind::Get,
        RoundTripKind::GetRecent,
        RoundTripKind::List,
    ];

    fn label(self) -> &'static str {
        match self {
            RoundTripKind::Create => "create",
            RoundTripKind::Append => "append (session delta)",
            RoundTripKind::AppendUserDelta => "append (session + user: delta)",
            RoundTripKind::Get => "get (all events)",
            RoundTripKind::GetRecent => "get (20 recent)",
            RoundTripKind::List => "list",
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct RoundTripEntry {
    pub kind: RoundTripKind,
    pub peer: Peer,
    pub ops: usize,
    /// Message batches the client waited on, per operation.
    pub round_trips_per_op: f64,
    /// `Parse` messages per operation: about 0 once warm for a client
    /// keeping named statements, one per statement for ours (unnamed, each
    /// parsed inside its own batch).
    pub parses_per_op: f64,
    /// Batches of `Close` only (not waited on), per operation.
    pub closes_per_op: f64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct RoundTrips {
    pub entries: Vec<RoundTripEntry>,
}

impl RoundTrips {
    pub fn insert(&mut self, kind: RoundTripKind, peer: Peer, traffic: Traffic, ops: usize) {
        let per = |n: u64| n as f64 / ops.max(1) as f64;
        self.entries.push(RoundTripEntry {
            kind,
            peer,
            ops,
            round_trips_per_op: per(traffic.round_trips),
            parses_per_op: per(traffic.parses),
            closes_per_op: per(traffic.close_batches),
        });
    }

    pub fn get(&self, kind: RoundTripKind, peer: Peer) -> Option<&RoundTripEntry> {
        self.entries.iter().find(|e| e.kind == kind && e.peer == peer)
    }
}

/// The machine the figures come from.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    pub cpu_model: String,
    pub cpus: usize,
    pub memory_bytes: u64,
    pub kernel: String,
    /// 1-minute load average when the run started and when it ended: other
    /// work on the machine shows here.
    pub load_average_start: Option<f64>,
    pub load_average_end: Option<f64>,
}

/// The bench process's global allocator (the `mimalloc` feature), which
/// the client CPU figures depend on.
pub fn allocator() -> &'static str {
    if cfg!(feature = "mimalloc") { "mimalloc" } else { "system" }
}

pub fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg").ok()?.split_whitespace().next()?.parse().ok()
}

impl Machine {
    /// This machine, now; `load_average_start` is the caller's to fill in.
    pub fn detect() -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name").and_then(|rest| rest.split_once(':')).map(|(_, m)| m.trim()))
            .unwrap_or("unknown")
            .to_owned();
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let memory_bytes = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0)
            * 1024;
        Self {
            cpu_model,
            cpus: std::thread::available_parallelism().map(usize::from).unwrap_or(1),
            memory_bytes,
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_owned(),
            load_average_start: None,
            load_average_end: load_average(),
        }
    }

    /// One line saying what the machine is and how busy it was.
    pub fn describe(&self) -> String {
        let load = |l: Option<f64>| l.map_or_else(|| "?".to_owned(), |l| format!("{l:.2}"));
        format!(
            "Machine: {} x {}, {} RAM, Linux {}; load average {} at the start, {} at the end",
            self.cpus,
            self.cpu_model,
            human_bytes(self.memory_bytes as f64),
            self.kernel,
            load(self.load_average_start),
            load(self.load_average_end),
        )
    }
}

/// One of the targets, judged on this run.
#[derive(Debug, Clone, Serialize)]
pub struct Target {
    pub name: String,
    pub measured: String,
    pub wanted: String,
    /// `None` when this run could not measure it.
    pub met: Option<bool>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub plan: Plan,
    /// The bench process's global allocator.
    pub allocator: &'static str,
    pub machine: Machine,
    pub server: ServerInfo,
    pub results: Vec<Measured>,
    /// The server's view of the compared implementations' open
    /// connections after the reads: all on plaintext, or the run fails.
    pub peer_connections: SslCount,
    /// Our SQL functions sent unnamed against prepared; `None` without pgbench.
    pub protocol: Option<ProtocolReport>,
    /// Our store over verified TLS against plaintext; `None` without a CA.
    pub tls: Option<TlsReport>,
    pub round_trips: RoundTrips,
    /// Many writers at once through the adk trait.
    pub crowd: Vec<CrowdResult>,
    /// HOT-update ratio of each implementation's sessions table after the appends.
    pub hot: BTreeMap<Peer, HotRatio>,
    pub retention: RetentionReport,
    /// Usage rollups of a backlog of events, and of the minute after it.
    pub rollup: RollupBenchReport,
    /// Erasing one user's events in bounded batches.
    pub erase: EraseBenchReport,
    /// A user's listing filtered by labels, against unfiltered.
    pub labels: LabelListReport,
    /// `list_events` page 1 and page 100 of a 10,000-event session.
    pub paging: PagingReport,
    /// What the invocation lease costs an append, and 20 invocations racing
    /// for one session.
    pub lease: LeaseReport,
    /// Append-to-watcher latency of the change feed, and its cost on appends.
    pub feed: FeedLatencyReport,
    /// `adk_events.payload` compressed with pglz against lz4; `None` when
    /// the server has no lz4.
    pub toast: Option<ToastReport>,
    /// Sessions with 16 images of 1 MB (and of 200 kB), and one image
    /// shared by 100 sessions, against media inline and adk-session.
    pub media: MediaReport,
    /// A day archived by `adk-pg maintain` and restored; a user erased
    /// from a month of archive.
    pub archive: ArchiveReport,
    /// Peak RSS of the bench process before the media section.
    pub peak_rss_bytes: Option<u64>,
    pub notes: Vec<String>,
    pub elapsed_secs: f64,
    pub targets: Vec<Target>,
    /// Issue 37's targets for reads, from this table's rows (ours through
    /// the adk trait against adk-session; `--reads` measures TLS too).
    pub read_targets: Vec<Target>,
}

pub(crate) fn ratio(a: f64, b: f64) -> Option<f64> {
    (a.is_finite() && b.is_finite() && b > 0.0).then(|| a / b)
}

impl Report {
    pub fn find(&self, op: Op, peer: Peer) -> Option<&Measured> {
        self.results.iter().find(|m| m.op == op && m.peer == peer)
    }

    fn throughput_ratio(&self, op: Op, peer: Peer, base: Peer) -> Option<f64> {
        ratio(self.find(op, peer)?.latency.ops_per_sec, self.find(op, base)?.latency.ops_per_sec)
    }

    fn p50_ratio(&self, op: Op, peer: Peer, base: Peer) -> Option<f64> {
        ratio(self.find(op, peer)?.latency.p50_ms, self.find(op, base)?.latency.p50_ms)
    }

    pub fn with_targets(mut self) -> Self {
        let big = self.plan.big_session_events;
        let mut targets = Vec::new();
        let mut push = |name: String,
                        measured: Option<f64>,
                        fmt: &dyn Fn(f64) -> String,
                        wanted: &str,
                        ok: &dyn Fn(f64) -> bool| {
            targets.push(Target {
                name,
                measured: measured.map_or_else(|| "not measured".to_owned(), fmt),
                wanted: wanted.to_owned(),
                met: measured.map(ok),
            });
        };
        let times = |x: f64| format!("{x:.3}x");
        for (op, what) in [(Op::AppendConcurrent, "8 concurrent"), (Op::AppendSequential, "sequential")] {
            push(
                format!("append ({what}) via adk trait vs the floor, ops/s"),
                self.throughput_ratio(op, Peer::Ours, Peer::Floor),
                &times,
                ">= 0.85x",
                &|x| x >= 0.85,
            );
        }
        for op in [Op::Get40, Op::GetBig, Op::Get40Recent20, Op::GetBigRecent20, Op::List100] {
            let label = op.label(big);
            push(
                format!("{label} via adk trait vs adk-session, ops/s"),
                self.throughput_ratio(op, Peer::Ours, Peer::AdkSession),
                &times,
                ">= 1.2x",
                &|x| x >= 1.2,
            );
            push(
                format!("{label} via adk trait, p50 vs the floor's p50"),
                self.p50_ratio(op, Peer::Ours, Peer::Floor),
                &times,
                "<= 1.3x",
                &|x| x <= 1.3,
            );
        }
        push(
            "create via adk trait vs the floor, ops/s".into(),
            self.throughput_ratio(Op::Create, Peer::Ours, Peer::Floor),
            &times,
            ">= 0.9x",
            &|x| x >= 0.9,
        );
        let statements = |op: Op| self.find(op, Peer::Ours).and_then(|m| m.statements_per_op);
        push(
            "statements per append (pg_stat_statements)".into(),
            statements(Op::AppendSequential),
            &|x| format!("{x:.2}"),
            "1",
            &|x| x <= 1.0 + 1e-9,
        );
        let trips = |kind: RoundTripKind| self.round_trips.get(kind, Peer::Ours).map(|e| e.round_trips_per_op);
        for (kind, wanted, limit) in [
            (RoundTripKind::Append, "1", 1.0),
            (RoundTripKind::AppendUserDelta, "1", 1.0),
            (RoundTripKind::Get, "<= 2", 2.0),
            (RoundTripKind::GetRecent, "<= 2", 2.0),
            (RoundTripKind::List, "1", 1.0),
        ] {
            push(
                format!("round trips per {} (wire)", kind.label()),
                trips(kind),
                &|x| format!("{x:.2}"),
                wanted,
                &|x| x <= limit + 1e-9,
            );
        }
        for c in self.crowd.iter().filter(|c| c.implementation == Peer::Ours.label()) {
            push(
                format!("crowd of {} writers via adk trait: errors", c.writers),
                Some((c.errors + c.given_up) as f64),
                &|x| format!("{x:.0}"),
                "0",
                &|x| x == 0.0,
            );
        }
        push(
            "retention: WAL of DROP vs DELETE".into(),
            Some(self.retention.wal_ratio),
            &|x| format!("{:.3}%", x * 100.0),
            "< 1%",
            &|x| x < 0.01,
        );
        push(
            "peak RSS of the bench process (before the media section)".into(),
            self.peak_rss_bytes.map(|b| b as f64),
            &human_bytes,
            "< 200 MB",
            &|x| x < 200.0 * 1024.0 * 1024.0,
        );
        self.targets = targets;
        self.read_targets = reads::targets(big, |op, reader| {
            let peer = match reader {
                Reader::Ours => Peer::Ours,
                Reader::AdkSession => Peer::AdkSession,
                Reader::OursTls => return None,
            };
            self.find(op, peer).map(|m| &m.latency)
        });
        let ratios: Vec<Ratios> = self
            .results
            .iter()
            .map(|m| {
                let (op, peer) = (m.op, m.peer);
                let other = |base: Peer| (peer != base).then(|| self.throughput_ratio(op, peer, base)).flatten();
                Ratios {
                    ops_vs_floor: other(Peer::Floor),
                    p50_vs_floor: (peer != Peer::Floor).then(|| self.p50_ratio(op, peer, Peer::Floor)).flatten(),
                    ops_vs_our_sql_functions: other(Peer::Functions),
                    ops_vs_adk_session: other(Peer::AdkSession),
                }
            })
            .collect();
        for (m, r) in self.results.iter_mut().zip(ratios) {
            m.ratios = r;
        }
        self
    }

    fn round_trip_cell(&self, op: Op, peer: Peer) -> String {
        let one = |kind| self.round_trips.get(kind, peer).map(|e| format!("{:.2}", e.round_trips_per_op));
        let text = match op {
            Op::Create => one(RoundTripKind::Create),
            Op::AppendSequential | Op::AppendConcurrent => {
                match (one(RoundTripKind::Append), one(RoundTripKind::AppendUserDelta)) {
                    (Some(a), Some(b)) if a == b => Some(a),
                    (Some(a), Some(b)) => Some(format!("{a} / {b}")),
                    _ => None,
                }
            }
            Op::Get40 | Op::GetBig => one(RoundTripKind::Get),
            Op::Get40Recent20 | Op::GetBigRecent20 => one(RoundTripKind::GetRecent),
            Op::List100 => one(RoundTripKind::List),
        };
        text.unwrap_or_else(|| "-".into())
    }

    pub fn results_table(&self) -> Table {
        let mut table = Table::new();
        table.load_style(ASCII_MARKDOWN);
        table.set_header(vec![
            "operation",
            "implementation",
            "ops/s",
            "rounds min-max",
            "p50 ms",
            "p95 ms",
            "p99 ms",
            "ops/s vs floor",
            "p50 vs floor",
            "ops/s vs our SQL fns",
            "ops/s vs adk-session",
            "client CPU µs/op",
            "statements/op",
            "round trips/op",
        ]);
        let fmt_ratio = |r: Option<f64>| r.map_or_else(|| "-".to_owned(), |r| format!("{r:.2}x"));
        for op in Op::ALL {
            for peer in Peer::ALL {
                let Some(m) = self.find(op, peer) else { continue };
                let l = &m.latency;
                let r = &m.ratios;
                table.add_row(vec![
                    op.label(self.plan.big_session_events),
                    peer.label().to_owned(),
                    format!("{:.0}", l.ops_per_sec),
                    l.round_range().map_or_else(|| "-".to_owned(), |(lo, hi)| format!("{lo:.0}-{hi:.0}")),
                    format!("{:.3}", l.p50_ms),
                    format!("{:.3}", l.p95_ms),
                    format!("{:.3}", l.p99_ms),
                    fmt_ratio(r.ops_vs_floor),
                    fmt_ratio(r.p50_vs_floor),
                    fmt_ratio(r.ops_vs_our_sql_functions),
                    fmt_ratio(r.ops_vs_adk_session),
                    l.client_cpu_us_per_op.map_or_else(|| "-".to_owned(), |c| format!("{c:.0}")),
                    m.statements_per_op.map_or_else(|| "-".to_owned(), |s| format!("{s:.2}")),
                    self.round_trip_cell(op, peer),
                ]);
            }
        }
        for i in 2..=13 {
            if let Some(column) = table.column_mut(i) {
                column.set_cell_alignment(CellAlignment::Right);
            }
        }
        table
    }

    fn round_trip_table(&self) -> Table {
        let mut table = Table::new();
        table.load_style(ASCII_MARKDOWN);
        let peers: Vec<Peer> =
            Peer::ALL.into_iter().filter(|p| self.round_trips.entries.iter().any(|e| e.peer == *p)).collect();
        let mut header = vec!["operation".to_owned()];
        header.extend(peers.iter().map(|p| p.label().to_owned()));
        table.set_header(header);
        for kind in RoundTripKind::ALL {
            let mut row = vec![kind.label().to_owned()];
            for &peer in &peers {
                row.push(self.round_trips.get(kind, peer).map_or_else(
                    || "-".to_owned(),
                    |e| {
                        format!(
                            "{:.2} ({:.2} parse, {:.2} close)",
                            e.round_trips_per_op, e.parses_per_op, e.closes_per_op
                        )
                    },
                ));
            }
            table.add_row(row);
        }
        table
    }

    fn crowd_table(&self) -> Table {
        let mut table = Table::new();
        table.load_style(ASCII_MARKDOWN);
        table.set_header(vec![
            "implementation",
            "writers",
            "s",
            "appends acked",
            "acked/s",
            "errors",
            "given up",
            "ack p50 ms",
            "ack p99 ms",
            "wait for a connection p50 ms",
            "p99 ms",
            "bb8 gets waited / timed out",
        ]);
        for c in &self.crowd {
            let wait = c.checkout_wait.as_ref();
            table.add_row(vec![
                c.implementation.clone(),
                c.writers.to_string(),
                format!("{:.1}", c.secs),
                c.acked.to_string(),
                format!("{:.0}", c.acked_per_sec),
                c.errors.to_string(),
                c.given_up.to_string(),
                format!("{:.3}", c.ack_p50_ms),
                format!("{:.3}", c.ack_p99_ms),
                wait.map_or_else(|| "-".to_owned(), |w| format!("{:.3}", w.p50_ms)),
                wait.map_or_else(|| "-".to_owned(), |w| format!("{:.3}", w.p99_ms)),
                c.pool.as_ref().map_or_else(|| "-".to_owned(), |p| format!("{} / {}", p.waited, p.timed_out)),
            ]);
        }
        for i in 1..=11 {
            if let Some(column) = table.column_mut(i) {
                column.set_cell_alignment(CellAlignment::Right);
            }
        }
        table
    }

    fn rollup_table(&self) -> Table {
        let mut table = Table::new();
        table.load_style(ASCII_MARKDOWN);
        table.set_header(vec![
            "run",
            "events",
            "wall s",
            "job CPU s",
            "events/s",
            "WAL",
            "WAL bytes/event",
            "1m rows",
            "1h rows",
            "1d rows",
            "1m / 1h / 1d buckets",
        ]);
        let row = |label: String, r: &RollupRun| {
            vec![
                label,
                r.events.to_string(),
                format!("{:.2}", r.secs),
                format!("{:.2}", r.job_cpu_secs),
                format!("{:.0}", r.events_per_sec),
                human_bytes(r.wal_bytes as f64),
                format!("{:.0}", r.wal_bytes_per_event),
                r.minute_rows.to_string(),
                r.hour_rows.to_string(),
                r.day_rows.to_string(),
                format!("{} / {} / {}", r.report.minute_buckets, r.report.hour_buckets, r.report.day_buckets),
            ]
        };
        let rollup = &self.rollup;
        for (i, run) in rollup.runs.iter().enumerate() {
            let label = if rollup.runs.len() == 1 {
                "backlog (one run)".to_owned()
            } else {
                format!("backlog {}/{}", i + 1, rollup.runs.len())
            };
            table.add_row(row(label, run));
        }
        if rollup.runs.len() > 1 {
            table.add_row(vec![
                "backlog, median".to_owned(),
                rollup.events.to_string(),
                format!("{:.2}", rollup.median_secs),
                "-".into(),
                format!("{:.0}", rollup.median_events_per_sec),
                human_bytes(rollup.median_wal_bytes as f64),
                format!("{:.0}", rollup.median_wal_bytes_per_event),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
            ]);
        }
        if let Some(run) = &rollup.incremental {
            table.add_row(row("the minute after".to_owned(), run));
        }
        for i in 1..=10 {
            if let Some(column) = table.column_mut(i) {
                column.set_cell_alignment(CellAlignment::Right);
            }
        }
        table
    }

    pub fn print(&self) {
        println!();
        println!("{}", self.machine.describe());
        println!("Allocator of the bench process: {}", self.allocator);
        println!(
            "Plan: {}; {} creates, {} sessions x {} events per append mode, get of {} events, {} rounds of reads",
            if self.plan.quick { "quick (smoke test: figures are indicative only)" } else { "full" },
            self.plan.creates,
            self.plan.append_sessions,
            crate::workload::EVENTS_PER_SESSION,
            self.plan.big_session_events,
            self.plan.read_rounds,
        );
        println!();
        println!(
            "floor (lean SQL, pgbench)    pgbench running the leanest SQL that keeps our guarantees on our schema \
             (hand-written, no functions), same data and concurrency, -M prepared, as the owner"
        );
        println!(
            "our SQL functions (pgbench)  pgbench running our own SQL functions, the statements the store sends, \
             same data and concurrency, -M prepared, as the owner"
        );
        println!("ours (adk trait)    PgSessionService (crates/adk) through adk_session::SessionService");
        println!("ours (store trait)  PgSessionStore through our SessionStore trait");
        println!(
            "adk-session         adk-session 2.3's PostgresSessionService (sqlx) through adk_session::SessionService"
        );
        println!(
            "ops/s: median over rounds; ratios from this run; statements/op: top-level statements in \
             pg_stat_statements (connection set-up SETs excluded); round trips/op: counted on the wire; \
             client CPU µs/op: user+sys CPU of the bench process over the timed sections (of pgbench for the \
             pgbench rows, at clock-tick resolution) per operation"
        );
        println!(
            "transport: {}; the server saw the implementations' pools after the reads: {}",
            self.server.transport,
            self.peer_connections.describe()
        );
        println!();
        println!("{}", self.results_table());
        println!();
        println!(
            "Round trips per operation on the wire (waited batches; Parse messages and Close-only batches in \
             brackets; a client keeping named statements, pgbench -M prepared or sqlx, parses about 0 per \
             operation once warm, ours sends each statement unnamed with its Parse in the same batch):"
        );
        println!("{}", self.round_trip_table());
        println!();
        if let Some(protocol) = &self.protocol {
            println!("{protocol}");
            println!();
        }
        if let Some(tls) = &self.tls {
            println!("{tls}");
            println!();
        }
        println!("HOT updates of the sessions table after the appends:");
        for (peer, hot) in &self.hot {
            println!(
                "  {:<20} {:>6.1}%  ({} of {} updates)",
                peer.label(),
                hot.ratio * 100.0,
                hot.hot_updates,
                hot.updates
            );
        }
        let r = &self.retention;
        println!();
        println!("Retention of one day ({} events, {} sessions):", r.events, r.sessions);
        println!(
            "  maintenance (DETACH CONCURRENTLY + DROP)  {:>9.1} ms  {:>10} WAL",
            r.drop_ms,
            human_bytes(r.drop_wal_bytes as f64)
        );
        println!(
            "  DELETE of the same rows                   {:>9.1} ms  {:>10} WAL",
            r.delete_ms,
            human_bytes(r.delete_wal_bytes as f64)
        );
        println!("  WAL ratio {:.3}%, time ratio {:.1}%", r.wal_ratio * 100.0, r.time_ratio * 100.0);
        println!();
        let u = &self.rollup;
        println!(
            "Usage rollup (run_rollup, in this process, as the owner) of a backlog of {} events: {} apps x {} agents, \
             {} users, {} sessions, {} invocations (user message, tool call, tool result, answer; model events with \
             usage_metadata tokens and cost, ~1% errors) over {} minutes; {} from empty levels and a \
             checkpoint, wall time of run_rollup{}; seeding took {:.1} s (untimed):",
            u.events,
            u.apps,
            u.agents_per_app,
            u.users,
            u.sessions,
            u.invocations,
            u.span_minutes,
            if u.runs.len() == 1 { "one run".to_owned() } else { format!("{} runs, each", u.runs.len()) },
            if u.runs.len() == 1 { " (a single run: no median)" } else { ", median of the runs" },
            u.seed_secs
        );
        println!("{}", self.rollup_table());
        if let Some(last) = u.runs.last() {
            let z = &last.sizes;
            println!(
                "  on disk after a backlog run (tables and indexes): 1m rows {}, 1h {}, 1d {}; invocation tails {}",
                human_bytes(z.minute_bytes as f64),
                human_bytes(z.hour_bytes as f64),
                human_bytes(z.day_bytes as f64),
                human_bytes(z.invocation_tails_bytes as f64)
            );
        }
        println!(
            "  the minute after: a minute of the same traffic arriving after the backlog, rolled up on top of it \
             (its minutes merged, their hours and days recomputed from the level below), as `adk-pg rollup \
             --every 1m` runs; rows are totals after the run; job CPU: CPU of this process, where the rollup \
             job runs (streaming rows, sketches, merges, encoding), during the run; the server's work overlaps it"
        );
        println!();
        println!("{}", self.erase);
        println!();
        println!("{}", self.labels);
        println!();
        println!("{}", self.paging);
        println!();
        println!("{}", self.lease);
        println!();
        println!("{}", self.feed);
        println!();
        if let Some(toast) = &self.toast {
            println!("{toast}");
            println!();
        }
        if !self.crowd.is_empty() {
            println!(
                "Crowd: writers each appending to their own session, retrying until acknowledged, no faults \
                 (ours: default pool, 16 connections; adk-session: its default pool):"
            );
            println!("{}", self.crowd_table());
            println!(
                "  wait for a connection: every operation's turn at the store's FIFO gate in front of the \
                 pool, as the store reports it (zero when a connection was free)"
            );
            for c in &self.crowd {
                for (category, count) in &c.errors_by_category {
                    println!("  {} x{}: {count} x {category}", c.implementation, c.writers);
                }
            }
            println!();
        }
        println!("{}", self.media);
        println!();
        if let Some(rss) = self.peak_rss_bytes {
            println!("Peak RSS of the bench process (before the media section): {}", human_bytes(rss as f64));
        }
        println!();
        println!("{}", self.archive);
        println!();
        if self.plan.quick {
            println!("Targets (quick run: reduced sizes, so indicative only):");
        } else {
            println!("Targets:");
        }
        for t in &self.targets {
            let verdict = match t.met {
                Some(true) => "met   ",
                Some(false) => "MISSED",
                None => "n/a   ",
            };
            println!("  [{verdict}] {:<55} {:>12}  (wanted {})", t.name, t.measured, t.wanted);
        }
        println!();
        println!(
            "Reads (issue 37), from the rows above: ours (adk trait) against adk-session, both on plaintext \
             (the TLS rows: `--reads`); reported, never asserted:"
        );
        println!("{}", reads::targets_table(&self.read_targets));
        for note in &self.notes {
            println!("Note: {note}");
        }
        println!("\nTook {:.0} s.", self.elapsed_secs);
    }
}

/// Prints the report and writes it as JSON into `out_dir`; returns the file.
pub fn write_outputs(report: &Report, out_dir: &Path) -> anyhow::Result<PathBuf> {
    report.print();
    std::fs::create_dir_all(out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    let file = out_dir.join(if report.plan.quick { "bench-quick.json" } else { "bench.json" });
    std::fs::write(&file, serde_json::to_string_pretty(report)?)
        .with_context(|| format!("writing {}", file.display()))?;
    println!("JSON: {}", file.display());
    Ok(file)
}
