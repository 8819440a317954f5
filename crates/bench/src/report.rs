//! The results: a table on stdout and a JSON file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use comfy_table::presets::ASCII_MARKDOWN;
use comfy_table::{CellAlignment, Table};
use serde::Serialize;

use crate::driver::Peer;
use crate::measure::Latency;
use crate::ops::Op;
use crate::pgstat::HotRatio;
use crate::proxy::Traffic;
use crate::retention::RetentionReport;
use crate::server::{ServerInfo, human_bytes};
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
    /// Statements prepared (`Parse`), per operation.
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
    pub machine: Machine,
    pub server: ServerInfo,
    pub results: Vec<Measured>,
    pub round_trips: RoundTrips,
    /// HOT-update ratio of each implementation's sessions table after the appends.
    pub hot: BTreeMap<Peer, HotRatio>,
    pub retention: RetentionReport,
    pub peak_rss_bytes: Option<u64>,
    pub notes: Vec<String>,
    pub elapsed_secs: f64,
    pub targets: Vec<Target>,
}

fn ratio(a: f64, b: f64) -> Option<f64> {
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
        push(
            "concurrent append throughput vs the floor".into(),
            self.throughput_ratio(Op::AppendConcurrent, Peer::Ours, Peer::Floor),
            &times,
            ">= 0.85x",
            &|x| x >= 0.85,
        );
        push(
            "concurrent append throughput vs adk-session".into(),
            self.throughput_ratio(Op::AppendConcurrent, Peer::Ours, Peer::AdkSession),
            &times,
            ">= 3x",
            &|x| x >= 3.0,
        );
        push(
            format!("get of {big} events: p50 vs the floor's p50"),
            self.p50_ratio(Op::GetBig, Peer::Ours, Peer::Floor),
            &times,
            "<= 1.3x",
            &|x| x <= 1.3,
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
        push(
            "round trips per append without app/user delta (wire)".into(),
            trips(RoundTripKind::Append),
            &|x| format!("{x:.2}"),
            "1",
            &|x| x <= 1.0 + 1e-9,
        );
        push(
            "statements per get (pg_stat_statements)".into(),
            statements(Op::Get40),
            &|x| format!("{x:.2}"),
            "<= 2",
            &|x| x <= 2.0 + 1e-9,
        );
        push("round trips per get (wire)".into(), trips(RoundTripKind::Get), &|x| format!("{x:.2}"), "<= 2", &|x| {
            x <= 2.0 + 1e-9
        });
        push(
            "retention: WAL of DROP vs DELETE".into(),
            Some(self.retention.wal_ratio),
            &|x| format!("{:.3}%", x * 100.0),
            "< 1%",
            &|x| x < 0.01,
        );
        push(
            "peak RSS of the bench process".into(),
            self.peak_rss_bytes.map(|b| b as f64),
            &human_bytes,
            "< 200 MB",
            &|x| x < 200.0 * 1024.0 * 1024.0,
        );
        self.targets = targets;
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
            "ops/s vs adk-session",
            "statements/op",
            "round trips/op",
        ]);
        let fmt_ratio = |r: Option<f64>| r.map_or_else(|| "-".to_owned(), |r| format!("{r:.2}x"));
        for op in Op::ALL {
            for peer in Peer::ALL {
                let Some(m) = self.find(op, peer) else { continue };
                let l = &m.latency;
                let vs_floor = (peer != Peer::Floor).then(|| self.throughput_ratio(op, peer, Peer::Floor)).flatten();
                let p50_floor = (peer != Peer::Floor).then(|| self.p50_ratio(op, peer, Peer::Floor)).flatten();
                let vs_adk =
                    (peer != Peer::AdkSession).then(|| self.throughput_ratio(op, peer, Peer::AdkSession)).flatten();
                table.add_row(vec![
                    op.label(self.plan.big_session_events),
                    peer.label().to_owned(),
                    format!("{:.0}", l.ops_per_sec),
                    l.round_range().map_or_else(|| "-".to_owned(), |(lo, hi)| format!("{lo:.0}-{hi:.0}")),
                    format!("{:.3}", l.p50_ms),
                    format!("{:.3}", l.p95_ms),
                    format!("{:.3}", l.p99_ms),
                    fmt_ratio(vs_floor),
                    fmt_ratio(p50_floor),
                    fmt_ratio(vs_adk),
                    m.statements_per_op.map_or_else(|| "-".to_owned(), |s| format!("{s:.2}")),
                    self.round_trip_cell(op, peer),
                ]);
            }
        }
        for i in 2..=11 {
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

    pub fn print(&self) {
        let m = &self.machine;
        println!();
        let load = |l: Option<f64>| l.map_or_else(|| "?".to_owned(), |l| format!("{l:.2}"));
        println!(
            "Machine: {} x {}, {} RAM, Linux {}; load average {} at the start, {} at the end",
            m.cpus,
            m.cpu_model,
            human_bytes(m.memory_bytes as f64),
            m.kernel,
            load(m.load_average_start),
            load(m.load_average_end),
        );
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
        println!("floor (pgbench)     pgbench running our own SQL functions, same data and concurrency, -M prepared");
        println!("ours (adk trait)    PgSessionService (crates/adk) through adk_session::SessionService");
        println!("ours (store trait)  PgSessionStore through our SessionStore trait");
        println!(
            "adk-session         adk-session 2.3's PostgresSessionService (sqlx) through adk_session::SessionService"
        );
        println!(
            "ops/s: median over rounds; ratios from this run; statements/op: top-level statements in \
             pg_stat_statements (connection set-up SETs excluded); round trips/op: counted on the wire"
        );
        println!();
        println!("{}", self.results_table());
        println!();
        println!(
            "Round trips per operation on the wire (waited batches; Parse messages and Close-only batches in brackets):"
        );
        println!("{}", self.round_trip_table());
        println!();
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
        if let Some(rss) = self.peak_rss_bytes {
            println!("Peak RSS of the bench process: {}", human_bytes(rss as f64));
        }
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
