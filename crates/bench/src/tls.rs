//! What TLS costs our store: appends and gets through `PgSessionStore`
//! (our `SessionStore` trait, as the bound service role acting per request,
//! as in the main table) over `sslmode=verify-full` against the same over
//! plaintext (`sslmode=disable`), on a database of their own, in one run.
//!
//! Every comparison between implementations runs on plaintext (see
//! [`crate::server`]); this leg says what turning TLS on would change, so
//! a reader of those figures need not guess. `verify-full` because that is
//! what a production client should use: the chain and the host name are
//! checked (once, at connect), and the records after the handshake cost the
//! same in every TLS mode.
//!
//! Both stores connect to the same database and read the same sessions.
//! Each store opens its connection before the first timed round, so a TLS
//! handshake is a connect's cost (the pool keeps its connections), not an
//! operation's. Rounds alternate which transport runs an operation first
//! (plain then TLS, then TLS then plain), so drift and checkpoints fall on
//! both alike; ops/s is the median over rounds, p50 over every operation,
//! as in the main table. At the end the server's `pg_stat_ssl` is asked
//! what each store's connections are, and the run fails if a plaintext
//! connection was encrypted or a TLS one was not.

use adk_postgres_storage::{PgSessionStore, PoolConfig, TenantScope};
use anyhow::{Context as _, ensure};
use comfy_table::presets::ASCII_MARKDOWN;
use comfy_table::{CellAlignment, Table};
use serde::Serialize;
use tokio_postgres::Client;

use crate::cpu::CpuClock;
use crate::driver::{Driver, pool_config};
use crate::measure::{Latency, Sample};
use crate::ops::{self, Op};
use crate::report::ratio;
use crate::run::bound_service_url;
use crate::server::{Transport, connect, with_transport};
use crate::workload::{EVENTS_PER_SESSION, GET_USER, Plan, append_session};

/// `application_name` of each store's connections, which is how the
/// server's statistics tell them apart.
pub(crate) const PLAIN_APPLICATION: &str = "adk-postgres-bench-plain";
pub(crate) const TLS_APPLICATION: &str = "adk-postgres-bench-tls";
/// Untimed gets on each store before the first round: its connection is
/// open (the handshake done) and the server's caches warm.
const WARM_UP: usize = 10;

/// The session every get reads, and the big one.
const SMALL_SESSION: &str = "tls-g-40";
const BIG_SESSION: &str = "tls-g-big";

/// What the server says about a set of connections (`pg_stat_ssl`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct SslCount {
    pub connections: i64,
    /// Of those, whose TLS state this role may see (all, as a superuser or
    /// with `pg_read_all_stats`).
    pub visible: i64,
    pub encrypted: i64,
    /// Protocol version and cipher of the encrypted ones (one of them).
    pub version: Option<String>,
    pub cipher: Option<String>,
}

impl SslCount {
    /// The connections to `databases` (of `applications` only, if given)
    /// other than `client`'s own.
    pub async fn read(client: &Client, databases: &[&str], applications: Option<&[&str]>) -> anyhow::Result<Self> {
        let row = client
            .query_one(
                "SELECT count(*), count(s.ssl), count(*) FILTER (WHERE s.ssl), \
                        min(s.version) FILTER (WHERE s.ssl), min(s.cipher) FILTER (WHERE s.ssl)
                 FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
                 WHERE a.datname = ANY($1) AND a.pid <> pg_backend_pid()
                   AND ($2::text[] IS NULL OR a.application_name = ANY($2))",
                &[&databases, &applications],
            )
            .await
            .context("reading pg_stat_ssl")?;
        Ok(Self {
            connections: row.get(0),
            visible: row.get(1),
            encrypted: row.get(2),
            version: row.get(3),
            cipher: row.get(4),
        })
    }

    /// "3 connections, none encrypted" and the like.
    pub fn describe(&self) -> String {
        let hidden = self.connections - self.visible;
        let encrypted = match (self.encrypted, self.visible) {
            (_, 0) => "TLS state not visible to this role".to_owned(),
            (0, _) => "none encrypted".to_owned(),
            (n, v) if n == v => format!(
                "all encrypted ({}, {})",
                self.version.as_deref().unwrap_or("?"),
                self.cipher.as_deref().unwrap_or("?")
            ),
            (n, _) => format!("{n} encrypted"),
        };
        let hidden = if hidden > 0 && self.visible > 0 { format!(", {hidden} not visible") } else { String::new() };
        format!("{} connection(s), {encrypted}{hidden}", self.connections)
    }
}

/// One operation on both transports.
#[derive(Debug, Clone, Serialize)]
pub struct TlsRow {
    pub op: Op,
    pub operation: String,
    pub plain: Latency,
    pub tls: Latency,
    /// TLS ops/s over plain ops/s (medians over rounds): under 1 is slower.
    pub ops_tls_vs_plain: Option<f64>,
    /// TLS p50 over plain p50: over 1 is slower.
    pub p50_tls_vs_plain: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct TlsReport {
    /// The TLS store's `sslmode`, and the plain one's.
    pub tls_sslmode: String,
    pub plain_sslmode: String,
    pub rounds: usize,
    /// Sessions appended to per round and transport, each
    /// `EVENTS_PER_SESSION` events, one append after another.
    pub append_sessions_per_round: usize,
    pub rows: Vec<TlsRow>,
    /// What the server saw of each store's connections after the rounds.
    pub plain_connections: SslCount,
    pub tls_connections: SslCount,
}

impl TlsReport {
    pub fn table(&self) -> Table {
        let mut table = Table::new();
        table.load_style(ASCII_MARKDOWN);
        table.set_header(vec![
            "operation",
            "plain ops/s",
            "TLS ops/s",
            "ops/s TLS / plain",
            "plain p50 ms",
            "TLS p50 ms",
            "p50 TLS / plain",
            "plain p99 ms",
            "TLS p99 ms",
            "plain client CPU µs/op",
            "TLS client CPU µs/op",
        ]);
        let times = |r: Option<f64>| r.map_or_else(|| "-".to_owned(), |r| format!("{r:.3}x"));
        let cpu = |l: &Latency| l.client_cpu_us_per_op.map_or_else(|| "-".to_owned(), |c| format!("{c:.0}"));
        for row in &self.rows {
            let (p, t) = (&row.plain, &row.tls);
            table.add_row(vec![
                row.operation.clone(),
                format!("{:.0}", p.ops_per_sec),
                format!("{:.0}", t.ops_per_sec),
                times(row.ops_tls_vs_plain),
                format!("{:.3}", p.p50_ms),
                format!("{:.3}", t.p50_ms),
                times(row.p50_tls_vs_plain),
                format!("{:.3}", p.p99_ms),
                format!("{:.3}", t.p99_ms),
                cpu(p),
                cpu(t),
            ]);
        }
        for i in 1..=10 {
            if let Some(column) = table.column_mut(i) {
                column.set_cell_alignment(CellAlignment::Right);
            }
        }
        table
    }
}

impl std::fmt::Display for TlsReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "TLS leg: our store (store trait, bound service role) over sslmode={} against sslmode={}, same \
             database and sessions, {} interleaved rounds (the transport going first alternates); appends: {} \
             sessions x {EVENTS_PER_SESSION} events per round, one at a time; ops/s: median over rounds:",
            self.tls_sslmode, self.plain_sslmode, self.rounds, self.append_sessions_per_round
        )?;
        writeln!(f, "{}", self.table())?;
        writeln!(f, "  the server's view after the rounds (pg_stat_ssl):")?;
        writeln!(f, "    TLS store    {}", self.tls_connections.describe())?;
        write!(f, "    plain store  {}", self.plain_connections.describe())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Leg {
    Plain,
    Tls,
}

impl Leg {
    fn name(self) -> &'static str {
        match self {
            Leg::Plain => "plain",
            Leg::Tls => "tls",
        }
    }
}

/// Runs the leg on the migrated database `database` at `owner_url`, the
/// TLS store over `tls`.
pub async fn measure(owner_url: &str, database: &str, tls: &Transport, plan: &Plan) -> anyhow::Result<TlsReport> {
    let plain_url = with_transport(&bound_service_url(owner_url).await?, &Transport::Plaintext)?;
    let tls_url = with_transport(&plain_url, tls)?;
    let store = async |url: &str, application_name: &str| -> anyhow::Result<Driver> {
        let config = PoolConfig { application_name: application_name.to_owned(), ..pool_config() };
        let store = PgSessionStore::connect(url, &config, Default::default())
            .await
            .with_context(|| format!("connecting the {application_name} store"))?;
        Ok(Driver::Store(store.with_tenant_scope(TenantScope::PerRequest)))
    };
    let plain = store(&plain_url, PLAIN_APPLICATION).await?;
    let encrypted = store(&tls_url, TLS_APPLICATION).await?;
    let driver = |leg: Leg| if leg == Leg::Plain { &plain } else { &encrypted };

    let big = plan.big_session_events;
    for (session, events) in [(SMALL_SESSION, EVENTS_PER_SESSION), (BIG_SESSION, big)] {
        plain.create(GET_USER, session).await?;
        ops::fill(&plain, GET_USER, session, events).await?;
    }
    for leg in [Leg::Plain, Leg::Tls] {
        for _ in 0..WARM_UP {
            driver(leg).get(GET_USER, SMALL_SESSION, None).await?;
        }
    }

    let workloads = [Op::AppendSequential, Op::Get40, Op::GetBig];
    let mut samples: Vec<[Sample; 2]> = workloads.iter().map(|_| Default::default()).collect();
    for round in 0..plan.tls_rounds {
        let order = if round % 2 == 0 { [Leg::Plain, Leg::Tls] } else { [Leg::Tls, Leg::Plain] };
        for (i, &op) in workloads.iter().enumerate() {
            for leg in order {
                let driver = driver(leg);
                let mut sessions = Vec::new();
                if op == Op::AppendSequential {
                    let mode = format!("tls{round}-{}", leg.name());
                    for i in 0..plan.tls_append_sessions {
                        let (user, session) = append_session(&mode, i);
                        driver.create(&user, &session).await?;
                        sessions.push((user, session));
                    }
                }
                let before = CpuClock::now();
                let mut sample = match op {
                    Op::AppendSequential => ops::append_sequential(driver, &sessions).await?,
                    Op::Get40 => {
                        ops::get(driver, GET_USER, SMALL_SESSION, None, EVENTS_PER_SESSION, plan.small_reads).await?
                    }
                    _ => ops::get(driver, GET_USER, BIG_SESSION, None, big, plan.big_reads).await?,
                };
                sample.set_cpu(Some(CpuClock::now().own_since(&before)));
                samples[i][leg as usize].merge(&sample);
            }
        }
    }

    let sql = connect(owner_url).await?;
    let databases = [database];
    let plain_connections = SslCount::read(&sql, &databases, Some(&[PLAIN_APPLICATION])).await?;
    let tls_connections = SslCount::read(&sql, &databases, Some(&[TLS_APPLICATION])).await?;
    ensure!(
        plain_connections.connections > 0 && tls_connections.connections > 0,
        "the TLS leg's stores have no connections open: plain {plain_connections:?}, TLS {tls_connections:?}"
    );
    ensure!(plain_connections.encrypted == 0, "the plain store's connections are encrypted: {plain_connections:?}");
    ensure!(
        tls_connections.encrypted == tls_connections.visible,
        "the TLS store has connections on plaintext: {tls_connections:?}"
    );

    let rows = workloads
        .iter()
        .zip(samples)
        .map(|(&op, [plain, tls])| {
            let (plain, tls) = (plain.summary(), tls.summary());
            TlsRow {
                op,
                operation: op.label(big),
                ops_tls_vs_plain: ratio(tls.ops_per_sec, plain.ops_per_sec),
                p50_tls_vs_plain: ratio(tls.p50_ms, plain.p50_ms),
                plain,
                tls,
            }
        })
        .collect();
    Ok(TlsReport {
        tls_sslmode: tls.sslmode().to_owned(),
        plain_sslmode: Transport::Plaintext.sslmode().to_owned(),
        rounds: plan.tls_rounds,
        append_sessions_per_round: plan.tls_append_sessions,
        rows,
        plain_connections,
        tls_connections,
    })
}
