//! `--citus` (`cargo xtask citus bench`): append, get and list through the
//! store on a Citus cluster (a coordinator and two workers) against the same
//! on one server, both throwaway clusters on this machine with the same
//! settings, interleaved round by round.
//!
//! Every node shares this machine's cores, so the latencies are indicative
//! only. What does not depend on the machine is counted, not assumed: the
//! statements each operation costs on every node (pg_stat_statements), the
//! round trips of the store (a counting proxy in front of the server it
//! talks to), and every command Citus sends or runs for one call
//! (`citus.log_remote_commands` and `citus.log_local_commands`), on the
//! coordinator and on the worker the call is delegated to, with the node
//! each command went to.

use std::collections::{BTreeMap, BTreeSet};
use std::future::poll_fn;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use adk_postgres_testing::{CitusCluster, Cluster, WireProxy, create_citus_database, find_server_binaries};
use anyhow::{Context as _, anyhow, bail, ensure};
use comfy_table::presets::ASCII_MARKDOWN;
use comfy_table::{CellAlignment, Table};
use serde::Serialize;
use tokio_postgres::{AsyncMessage, Client};

use crate::driver::{Driver, Peer};
use crate::floor::BoundEvent;
use crate::measure::{Latency, Sample};
use crate::ops::{self, Op};
use crate::report::{Machine, load_average};
use crate::run::{SERVICE_ROLE, bound_service_url};
use crate::server::{connect, human_bytes};
use crate::workload::{self, APP, EVENTS_PER_SESSION, GET_USER, LIST_SESSIONS, LIST_USER, append_session};

/// Workers of the Citus cluster.
const WORKERS: usize = 2;
/// The bench's database, on each server (and each Citus node).
const DATABASE: &str = "adk_bench";
/// The session `get` reads (`EVENTS_PER_SESSION` events of `GET_USER`).
const GET_SESSION: &str = "g-40";
/// The session the counting pass and the logged calls append to, and its user.
const COUNT_USER: &str = "counter";
const COUNT_SESSION: &str = "count-appends";
/// The session the warm-up appends to.
const WARM_SESSION: &str = "warm-appends";
/// Untimed operations of each kind before anything is timed or counted:
/// statement caches warm, the coordinator's connections to the workers open.
const WARM_UP: usize = 5;
/// Calls of each operation whose commands are logged.
const LOGGED_CALLS: usize = 5;
/// Kinds of remote command of a call printed (all are in the JSON).
const PRINTED_HOPS: usize = 16;
/// The operations compared, in the order of the table.
const OPS: [Op; 3] = [Op::AppendSequential, Op::Get40, Op::List100];

/// The store's calls as it makes them (`adk_postgres_storage::functions`),
/// written out for a plain client whose notices can be read; the casts pick
/// the one signature of each function.
const APPEND_SQL: &str = "SELECT outcome, seq FROM adk_append_event($1, $2, $3, $4, $5, $6, $7, $8, \
     $9::text::jsonb, $10::text::jsonb, $11::text::jsonb, '{}'::jsonb, NULL::bigint, NULL::interval)";
const GET_SQL: &str = "SELECT * FROM adk_read_session($1, $2, $3, $4, NULL::bigint, NULL::bigint)";
const LIST_SQL: &str = "SELECT * FROM adk_read_sessions($1, $2, $3, NULL::timestamptz, NULL::text, $4, \
     '{}'::jsonb, NULL::timestamptz, NULL::timestamptz)";

/// Statements no operation of the store runs: this bench's own reads of
/// the statistics, and the polling of Citus' maintenance daemon (distributed
/// deadlock detection, recovery of prepared transactions).
const NOT_THE_STORES: [&str; 3] = ["%pg_stat_statements%", "%dump_local_wait_edges%", "%pg_prepared_xacts%"];

/// Which cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Target {
    Single,
    Citus,
}

impl Target {
    const ALL: [Target; 2] = [Target::Single, Target::Citus];

    fn label(self) -> &'static str {
        match self {
            Target::Single => "single node",
            Target::Citus => "Citus",
        }
    }
}

/// Sizes of one run.
#[derive(Debug, Clone, Serialize)]
pub struct CitusPlan {
    pub quick: bool,
    /// Timed rounds; each runs every operation on both targets.
    pub rounds: usize,
    /// Sessions appended to per round, `EVENTS_PER_SESSION` events each, one
    /// user each (so on Citus they spread over the workers).
    pub append_sessions_per_round: usize,
    pub events_per_session: usize,
    /// Gets and lists per round.
    pub reads_per_round: usize,
    /// Events of the session `get` reads, and sessions `list` lists.
    pub get_events: usize,
    pub list_sessions: usize,
    /// Operations of each kind in the counting pass.
    pub counted_ops: usize,
}

impl CitusPlan {
    pub fn full() -> Self {
        Self {
            quick: false,
            rounds: 6,
            append_sessions_per_round: 1,
            events_per_session: EVENTS_PER_SESSION,
            reads_per_round: 60,
            get_events: EVENTS_PER_SESSION,
            list_sessions: LIST_SESSIONS,
            counted_ops: 20,
        }
    }

    /// A smoke run.
    pub fn quick() -> Self {
        Self { quick: true, rounds: 2, reads_per_round: 15, counted_ops: 5, ..Self::full() }
    }
}

/// The whole report, as `citus.json` holds it.
#[derive(Debug, Clone, Serialize)]
pub struct CitusReport {
    pub plan: CitusPlan,
    pub machine: Machine,
    pub servers: Vec<ServerFacts>,
    pub results: Vec<Measured>,
    pub ratios: Vec<Ratio>,
    pub counts: Vec<Counted>,
    pub remote_commands: Vec<RemoteEvidence>,
    /// Commands the coordinator sent to workers per append (a delegated
    /// call is one), from `citus.log_remote_commands`.
    pub coordinator_to_worker_per_append: Option<f64>,
    /// Remote commands the worker running an append sent on, per append.
    pub onward_per_append: Option<f64>,
    pub notes: Vec<String>,
    pub elapsed_secs: f64,
}

/// What a target runs.
#[derive(Debug, Clone, Serialize)]
pub struct ServerFacts {
    pub target: Target,
    /// host:port of the server the store connects to.
    pub address: String,
    pub workers: Vec<String>,
    pub server_version: String,
    pub citus_version: Option<String>,
    pub settings: Vec<(String, String)>,
}

/// One operation on one target, over every round.
#[derive(Debug, Clone, Serialize)]
pub struct Measured {
    pub op: Op,
    pub target: Target,
    #[serde(flatten)]
    pub latency: Latency,
}

/// Citus over the single node, per operation.
#[derive(Debug, Clone, Serialize)]
pub struct Ratio {
    pub op: Op,
    pub p50: f64,
    pub p95: f64,
    pub ops_per_sec: f64,
}

/// What one kind of operation cost on one target, in the counting pass.
#[derive(Debug, Clone, Serialize)]
pub struct Counted {
    pub op: Op,
    pub target: Target,
    pub ops: usize,
    /// Message batches the store waited on, through a counting proxy.
    pub client_round_trips_per_op: f64,
    /// The server the store talks to first, then each worker.
    pub nodes: Vec<NodeCount>,
    /// The worker holding the operation's user (citus_shards).
    pub user_worker: Option<String>,
}

/// Top-level statements one node ran for the operations, per operation.
#[derive(Debug, Clone, Serialize)]
pub struct NodeCount {
    pub node: String,
    /// Of the store's role: the store's own on the server it talks to, the
    /// delegated calls on a worker (Citus connects as the session's role).
    pub store_role_per_op: f64,
    /// Of any other role: what the store's functions (SECURITY DEFINER, so
    /// as their owner) send on from the node they run on, with Citus'
    /// transaction control.
    pub other_roles_per_op: f64,
    /// Its statements, most calls first.
    pub top: Vec<StatementShape>,
}

/// Statements of one text but for their numbers (masked, see [`shape`]).
#[derive(Debug, Clone, Serialize)]
pub struct StatementShape {
    pub store_role: bool,
    pub query: String,
    pub calls: i64,
}

/// Every command Citus logged for calls of one operation.
#[derive(Debug, Clone, Serialize)]
pub struct RemoteEvidence {
    pub op: Op,
    pub user: String,
    /// The worker holding the user, by citus_shards.
    pub user_worker: String,
    pub calls: usize,
    /// Remote commands the coordinator sent, per call.
    pub from_coordinator_per_call: f64,
    /// Remote commands the nodes the coordinator reached sent on, per call:
    /// in all, and by `from → to`.
    pub onward_per_call: f64,
    pub onward_by_hop: BTreeMap<String, f64>,
    /// Commands a node ran on its own shards, per call.
    pub local_per_call: f64,
    /// Every node any call's commands went to or came from, but the
    /// coordinator unless a command went to it.
    pub nodes: BTreeSet<String>,
    /// Whether every call touched the user's worker and no other node.
    pub one_worker: bool,
    /// The first logged call's commands, in order.
    pub first_call: Vec<Hop>,
    /// The coordinator's `EXPLAIN (VERBOSE)` of the same call, and the
    /// nodes its tasks name.
    pub explain: Vec<String>,
    pub explain_nodes: BTreeSet<String>,
}

/// Whether a logged command went to another node or ran on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum HopKind {
    Remote,
    Local,
}

/// One command `citus.log_remote_commands` or `citus.log_local_commands`
/// reported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Hop {
    pub kind: HopKind,
    /// host:port of the node that sent or ran it.
    pub from: String,
    /// host:port of the node it ran on (`from` when local).
    pub to: String,
    /// The role of the receiving connection, for a remote command.
    pub user: Option<String>,
    pub command: String,
}

const ISSUING: &str = "issuing ";
const LOCAL_COMMAND: &str = "executing the command locally: ";
const LOCAL_COPY: &str = "executing the copy locally";

/// One notice of a session on the node `entry`: a command of its own, or
/// one of a session it opened on another node. Citus words its own as
/// `issuing <command>` with the detail `on server <user>@<host>:<port>
/// connectionId: <n>`, or `executing the command locally: <command>`, and
/// relays another node's with that node as the detail (`from
/// <host>:<port>`) and the original detail (and context) inside the
/// message. `None` for any other notice.
pub fn parse_notice(message: &str, detail: Option<&str>, entry: &str) -> Option<Hop> {
    let detail = detail.map(str::trim);
    if let Some(from) = detail.and_then(|d| d.strip_prefix("from ")) {
        let text = message.split_once("\nCONTEXT:  ").map_or(message, |(text, _)| text);
        let (own, own_detail) = match text.rsplit_once("\nDETAIL:  ") {
            Some((own, own_detail)) => (own, Some(own_detail)),
            None => (text, None),
        };
        return own_hop(own, own_detail, from);
    }
    own_hop(message, detail, entry)
}

fn own_hop(message: &str, detail: Option<&str>, at: &str) -> Option<Hop> {
    if let Some(command) = message.strip_prefix(ISSUING) {
        let server = detail?.trim().strip_prefix("on server ")?;
        let (address, connection) = server.split_once(" connectionId: ")?;
        connection.trim().parse::<i64>().ok()?;
        // A role name may hold an `@`; a host name cannot.
        let (user, node) = address.rsplit_once('@')?;
        let (host, port) = node.rsplit_once(':')?;
        if host.is_empty() || port.parse::<u16>().is_err() {
            return None;
        }
        return Some(Hop {
            kind: HopKind::Remote,
            from: at.to_owned(),
            to: node.to_owned(),
            user: Some(user.to_owned()),
            command: command.to_owned(),
        });
    }
    let command = message.strip_prefix(LOCAL_COMMAND).or_else(|| message.starts_with(LOCAL_COPY).then_some(message))?;
    Some(Hop { kind: HopKind::Local, from: at.to_owned(), to: at.to_owned(), user: None, command: command.to_owned() })
}

/// The nodes a call's commands ran on or came from; the coordinator
/// (`entry`) only when a command ran on it.
pub fn nodes_touched(hops: &[Hop], entry: &str) -> BTreeSet<String> {
    hops.iter()
        .flat_map(|hop| [&hop.to, &hop.from])
        .filter(|node| *node != entry)
        .cloned()
        .chain(hops.iter().filter(|hop| hop.to == entry).map(|hop| hop.to.clone()))
        .collect()
}

/// A call's remote commands grouped by sender, receiver, role and shape,
/// each group where its first command came, with its size.
pub fn grouped(hops: &[Hop]) -> Vec<(usize, &Hop)> {
    let mut groups: Vec<(usize, &Hop, String)> = Vec::new();
    for hop in hops.iter().filter(|hop| hop.kind == HopKind::Remote) {
        let key = shape(&hop.command);
        match groups.iter_mut().find(|(_, seen, seen_key)| {
            seen.from == hop.from && seen.to == hop.to && seen.user == hop.user && *seen_key == key
        }) {
            Some(group) => group.0 += 1,
            None => groups.push((1, hop, key)),
        }
    }
    groups.into_iter().map(|(n, hop, _)| (n, hop)).collect()
}

/// The `host:port` of every `Node: host=… port=…` line of a Citus plan.
pub fn explain_nodes(plan: &[String]) -> BTreeSet<String> {
    plan.iter()
        .filter_map(|line| {
            let fields = line.trim().strip_prefix("Node: ")?;
            let field = |name: &str| fields.split_whitespace().find_map(|f| f.strip_prefix(name)?.strip_prefix('='));
            Some(format!("{}:{}", field("host")?, field("port")?))
        })
        .collect()
}

/// A statement with every run of digits masked, so the per-call names of
/// intermediate results and prepared transactions group together.
pub fn shape(query: &str) -> String {
    let mut shaped = String::with_capacity(query.len());
    let mut in_number = false;
    for c in query.split_whitespace().collect::<Vec<_>>().join(" ").chars() {
        if c.is_ascii_digit() {
            if !in_number {
                shaped.push('N');
            }
            in_number = true;
        } else {
            shaped.push(c);
            in_number = false;
        }
    }
    shaped
}

fn log(message: impl AsRef<str>) {
    eprintln!("bench citus: {}", message.as_ref());
}

/// A node of a target, as Citus names it (host:port), with the bench
/// database on it as the superuser.
#[derive(Debug)]
struct Node {
    name: String,
    url: String,
}

/// One target, ready: its database migrated, the store connected as the
/// bound service role.
struct Side {
    target: Target,
    /// Where the store connects (the coordinator on Citus).
    address: SocketAddr,
    /// That server first, then the workers.
    nodes: Vec<Node>,
    service_url: String,
    driver: Driver,
}

impl Side {
    fn entry(&self) -> &Node {
        &self.nodes[0]
    }

    fn workers(&self) -> &[Node] {
        &self.nodes[1..]
    }
}

/// The whole comparison: both clusters started and set up, the timed
/// rounds, the counting pass, the logged calls; prints the report and
/// writes its JSON into `out_dir`, whose path it returns.
pub async fn run(plan: CitusPlan, out_dir: &Path) -> anyhow::Result<PathBuf> {
    let started = Instant::now();
    let load_at_start = load_average();
    let bin_dir = find_server_binaries()?;
    log(format!("starting a throwaway Citus cluster (a coordinator and {WORKERS} workers) and a single server"));
    let (citus, single) = tokio::task::block_in_place(|| {
        std::thread::scope(|scope| {
            let citus = scope.spawn(|| adk_postgres_testing::start_throwaway_citus_cluster(&bin_dir, WORKERS));
            let single = adk_postgres_testing::start_throwaway_cluster();
            let citus = citus.join().map_err(|_| anyhow!("starting the Citus nodes panicked"))?;
            anyhow::Ok((citus.context("starting the Citus nodes")?, single.context("starting the single server")?))
        })
    })?;

    log("migrating the single server's database");
    let single_side = single_side(&single).await?;
    log("creating and migrating the Citus database (distributing the store)");
    let citus_side = citus_side(&citus).await?;
    let sides = BTreeMap::from([(Target::Single, single_side), (Target::Citus, citus_side)]);
    let mut servers = Vec::new();
    for side in sides.values() {
        servers.push(facts(side).await?);
    }

    log(format!(
        "setup: {} sessions to append to, a session of {} events, {} sessions to list",
        plan.rounds * plan.append_sessions_per_round,
        plan.get_events,
        plan.list_sessions
    ));
    for side in sides.values() {
        setup(side, &plan).await?;
        warm_up(&side.driver).await?;
    }

    let samples = timed_rounds(&sides, &plan).await?;
    log(format!("counting statements and round trips: {} of each operation (untimed)", plan.counted_ops));
    let mut counts = Vec::new();
    for side in sides.values() {
        counts.extend(count(side, plan.counted_ops).await?);
    }
    log("logging every command Citus sends or runs for single calls (untimed)");
    let remote_commands = remote_commands(&sides[&Target::Citus]).await?;

    let results: Vec<Measured> =
        samples.iter().map(|(&(op, target), sample)| Measured { op, target, latency: sample.summary() }).collect();
    let ratios = OPS
        .iter()
        .filter_map(|&op| {
            let of = |target| results.iter().find(|m| m.op == op && m.target == target).map(|m| &m.latency);
            let (single, citus) = (of(Target::Single)?, of(Target::Citus)?);
            Some(Ratio {
                op,
                p50: citus.p50_ms / single.p50_ms,
                p95: citus.p95_ms / single.p95_ms,
                ops_per_sec: citus.ops_per_sec / single.ops_per_sec,
            })
        })
        .collect();
    let append_evidence = remote_commands.iter().find(|e| e.op == Op::AppendSequential);
    let machine = Machine { load_average_start: load_at_start, ..Machine::detect() };
    let notes = vec![format!(
        "Indicative only: the coordinator, both workers and the single server share this machine's {} CPU(s); \
         both clusters run the test harness's settings (fsync and synchronous_commit off).",
        machine.cpus
    )];
    let report = CitusReport {
        plan,
        machine,
        servers,
        results,
        ratios,
        counts,
        coordinator_to_worker_per_append: append_evidence.map(|e| e.from_coordinator_per_call),
        onward_per_append: append_evidence.map(|e| e.onward_per_call),
        remote_commands,
        notes,
        elapsed_secs: started.elapsed().as_secs_f64(),
    };
    drop(sides);
    drop((citus, single));
    report.print();
    std::fs::create_dir_all(out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    let file = out_dir.join(if report.plan.quick { "citus-quick.json" } else { "citus.json" });
    std::fs::write(&file, serde_json::to_string_pretty(&report)?)
        .with_context(|| format!("writing {}", file.display()))?;
    println!("JSON: {}", file.display());
    Ok(file)
}

async fn single_side(cluster: &Cluster) -> anyhow::Result<Side> {
    // As create_citus_database makes each node's copy, so both start alike.
    connect(&cluster.server_url())
        .await?
        .batch_execute(&format!("CREATE DATABASE {DATABASE} TEMPLATE template0 ENCODING 'UTF8' LOCALE 'C'"))
        .await
        .context("creating the single server's database")?;
    let url = cluster.database_url(DATABASE);
    adk_postgres_schema::run_pending_migrations(&url).await.context("migrating the single server")?;
    let node = Node { name: format!("127.0.0.1:{}", cluster.port()), url };
    side(Target::Single, cluster, vec![node]).await
}

async fn citus_side(cluster: &CitusCluster) -> anyhow::Result<Side> {
    let coordinator = cluster.coordinator();
    let worker_urls: Vec<String> = cluster.workers().iter().map(Cluster::server_url).collect();
    let url = create_citus_database(&coordinator.server_url(), &worker_urls, DATABASE)
        .await
        .context("creating the Citus database")?;
    adk_postgres_schema::run_pending_migrations_on_citus(&url).await.context("migrating on Citus")?;
    // The nodes by the names the coordinator gave them, which its log
    // messages and plans use; the coordinator is group 0.
    let rows = connect(&url)
        .await?
        .query(
            "SELECT nodename, nodeport, groupid = 0 FROM pg_dist_node
              WHERE noderole = 'primary' AND isactive AND (groupid = 0 OR shouldhaveshards)
              ORDER BY groupid <> 0, nodeport",
            &[],
        )
        .await
        .context("listing the Citus nodes")?;
    let mut nodes = Vec::new();
    for row in rows {
        let (host, port, is_coordinator): (String, i32, bool) = (row.get(0), row.get(1), row.get(2));
        let cluster = std::iter::once(coordinator)
            .chain(cluster.workers())
            .find(|node| i32::from(node.port()) == port)
            .ok_or_else(|| anyhow!("Citus names a node on port {port} that the harness did not start"))?;
        ensure!(is_coordinator == (cluster.port() == coordinator.port()), "node {host}:{port} has the wrong role");
        nodes.push(Node { name: format!("{host}:{port}"), url: cluster.database_url(DATABASE) });
    }
    ensure!(nodes.len() == WORKERS + 1, "Citus knows {} nodes with shards and a coordinator", nodes.len());
    side(Target::Citus, coordinator, nodes).await
}

async fn side(target: Target, front: &Cluster, nodes: Vec<Node>) -> anyhow::Result<Side> {
    let owner_url = nodes[0].url.clone();
    // On Citus the coordinator propagates the extension to the workers.
    connect(&owner_url)
        .await?
        .batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .await
        .context("creating pg_stat_statements (the harness preloads it where the server has it)")?;
    let service_url = bound_service_url(&owner_url)
        .await
        .with_context(|| format!("setting up the service role on {}", target.label()))?;
    let driver = Driver::connect(Peer::OursStore, &service_url).await?;
    Ok(Side { target, address: SocketAddr::from(([127, 0, 0, 1], front.port())), nodes, service_url, driver })
}

async fn facts(side: &Side) -> anyhow::Result<ServerFacts> {
    const SHOWN: [&str; 5] = ["fsync", "synchronous_commit", "full_page_writes", "shared_buffers", "max_connections"];
    let sql = connect(&side.entry().url).await?;
    let server_version: String = sql.query_one("SHOW server_version", &[]).await?.get(0);
    let citus_version: Option<String> =
        sql.query_opt("SELECT extversion FROM pg_extension WHERE extname = 'citus'", &[]).await?.map(|row| row.get(0));
    let mut settings = Vec::new();
    for name in SHOWN {
        let value: String = sql.query_one("SELECT current_setting($1)", &[&name]).await?.get(0);
        settings.push((name.to_owned(), value));
    }
    Ok(ServerFacts {
        target: side.target,
        address: side.entry().name.clone(),
        workers: side.workers().iter().map(|node| node.name.clone()).collect(),
        server_version,
        citus_version,
        settings,
    })
}

/// The sessions every workload uses, made through the store, untimed.
async fn setup(side: &Side, plan: &CitusPlan) -> anyhow::Result<()> {
    let driver = &side.driver;
    for i in 0..plan.rounds * plan.append_sessions_per_round {
        let (user, session) = append_session("seq", i);
        driver.create(&user, &session).await?;
    }
    driver.create(GET_USER, GET_SESSION).await?;
    ops::fill(driver, GET_USER, GET_SESSION, plan.get_events).await?;
    for i in 0..plan.list_sessions {
        driver.create(LIST_USER, &format!("l-{i}")).await?;
    }
    driver.create(GET_USER, WARM_SESSION).await?;
    driver.create(COUNT_USER, COUNT_SESSION).await?;
    Ok(())
}

/// Untimed operations of every kind, so the first round is not the one
/// that plans the statements and opens the coordinator's connections.
async fn warm_up(driver: &Driver) -> anyhow::Result<()> {
    ops::fill(driver, GET_USER, WARM_SESSION, WARM_UP).await?;
    for _ in 0..WARM_UP {
        driver.get(GET_USER, GET_SESSION, None).await?;
        driver.list(LIST_USER).await?;
    }
    Ok(())
}

/// Every round runs each operation on both targets, in turns, the first
/// target alternating, so drift on the shared machine hits both alike.
async fn timed_rounds(
    sides: &BTreeMap<Target, Side>,
    plan: &CitusPlan,
) -> anyhow::Result<BTreeMap<(Op, Target), Sample>> {
    let mut samples: BTreeMap<(Op, Target), Sample> = BTreeMap::new();
    for round in 0..plan.rounds {
        log(format!(
            "round {}/{}: {} appends, {} gets, {} lists on each",
            round + 1,
            plan.rounds,
            plan.append_sessions_per_round * plan.events_per_session,
            plan.reads_per_round,
            plan.reads_per_round
        ));
        let first = round * plan.append_sessions_per_round;
        let sessions: Vec<(String, String)> =
            (first..first + plan.append_sessions_per_round).map(|i| append_session("seq", i)).collect();
        let order = if round % 2 == 0 { Target::ALL } else { [Target::Citus, Target::Single] };
        for op in OPS {
            for target in order {
                let driver = &sides[&target].driver;
                let sample = match op {
                    Op::AppendSequential => ops::append_sequential(driver, &sessions).await?,
                    Op::Get40 => {
                        ops::get(driver, GET_USER, GET_SESSION, None, plan.get_events, plan.reads_per_round).await?
                    }
                    Op::List100 => ops::list(driver, LIST_USER, plan.list_sessions, plan.reads_per_round).await?,
                    other => bail!("{other:?} is not part of the Citus comparison"),
                };
                samples.entry((op, target)).or_default().merge(&sample);
            }
        }
    }
    Ok(samples)
}

/// One operation of `op` through `driver`; `n` numbers the appended event.
async fn one(driver: &Driver, op: Op, n: usize) -> anyhow::Result<()> {
    match op {
        Op::AppendSequential => {
            driver.append(COUNT_USER, COUNT_SESSION, driver.prepare(workload::event(n))?).await?;
        }
        Op::Get40 => {
            driver.get(GET_USER, GET_SESSION, None).await?;
        }
        Op::List100 => {
            driver.list(LIST_USER).await?;
        }
        other => bail!("{other:?} is not part of the Citus comparison"),
    }
    Ok(())
}

/// The user whose rows `op` reads or writes in [`one`] and [`remote_commands`].
fn user_of(op: Op) -> &'static str {
    match op {
        Op::AppendSequential => COUNT_USER,
        Op::List100 => LIST_USER,
        _ => GET_USER,
    }
}

/// Statements and round trips per operation, with the real store behind a
/// counting proxy: `n` of each kind after a warm-up, every node's
/// pg_stat_statements reset before and read after.
async fn count(side: &Side, n: usize) -> anyhow::Result<Vec<Counted>> {
    let proxy = WireProxy::builder(side.address).refuse_encryption().start()?;
    let driver = Driver::connect(Peer::OursStore, &proxy.url(&side.service_url)?).await?;
    let mut clients = Vec::new();
    for node in &side.nodes {
        clients.push((node.name.clone(), connect(&node.url).await?));
    }
    let mut appended = 0;
    let mut counts = Vec::new();
    for op in OPS {
        for _ in 0..WARM_UP {
            one(&driver, op, appended).await?;
            appended += 1;
        }
        for (_, client) in &clients {
            client.batch_execute("SELECT pg_stat_statements_reset()").await?;
        }
        let before = proxy.traffic();
        for _ in 0..n {
            one(&driver, op, appended).await?;
            appended += 1;
        }
        let traffic = proxy.traffic().minus(before);
        let mut nodes = Vec::new();
        for (name, client) in &clients {
            nodes.push(node_statements(client, name, n).await?);
        }
        let user_worker =
            if side.target == Target::Citus { Some(worker_of(&clients[0].1, user_of(op)).await?) } else { None };
        counts.push(Counted {
            op,
            target: side.target,
            ops: n,
            client_round_trips_per_op: traffic.round_trips as f64 / n.max(1) as f64,
            nodes,
            user_worker,
        });
    }
    Ok(counts)
}

/// Top-level statements in this node's bench database since the last reset,
/// per operation, but those no operation of the store runs.
async fn node_statements(client: &Client, node: &str, ops: usize) -> anyhow::Result<NodeCount> {
    let rows = client
        .query(
            "SELECT s.userid = (SELECT oid FROM pg_roles WHERE rolname = $1), s.query, sum(s.calls)::bigint
               FROM pg_stat_statements s
              WHERE s.dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) AND s.toplevel
                AND NOT s.query LIKE ANY ($2)
              GROUP BY 1, 2",
            &[&SERVICE_ROLE, &NOT_THE_STORES.as_slice()],
        )
        .await
        .context("reading pg_stat_statements")?;
    let (mut store_role, mut other_roles) = (0, 0);
    let mut shapes: BTreeMap<(bool, String), i64> = BTreeMap::new();
    for row in rows {
        let (by_store_role, query, calls): (Option<bool>, String, i64) = (row.get(0), row.get(1), row.get(2));
        let by_store_role = by_store_role.unwrap_or(false);
        if by_store_role {
            store_role += calls;
        } else {
            other_roles += calls;
        }
        *shapes.entry((by_store_role, shorten(&shape(&query), 140))).or_default() += calls;
    }
    let mut top: Vec<StatementShape> =
        shapes.into_iter().map(|((store_role, query), calls)| StatementShape { store_role, query, calls }).collect();
    top.sort_by(|a, b| b.calls.cmp(&a.calls).then_with(|| a.query.cmp(&b.query)));
    top.truncate(8);
    let per = |total: i64| total as f64 / ops.max(1) as f64;
    Ok(NodeCount {
        node: node.to_owned(),
        store_role_per_op: per(store_role),
        other_roles_per_op: per(other_roles),
        top,
    })
}

/// host:port of the worker holding `user`'s sessions.
async fn worker_of(coordinator: &Client, user: &str) -> anyhow::Result<String> {
    Ok(coordinator
        .query_one(
            "SELECT nodename || ':' || nodeport FROM citus_shards
              WHERE shardid = get_shard_id_for_distribution_column('adk_sessions', $1::text)
                AND table_name = 'adk_sessions'::regclass",
            &[&user],
        )
        .await
        .with_context(|| format!("finding the worker of {user}"))?
        .get(0))
}

/// The notices of a session: message and detail.
type Notices = Arc<Mutex<Vec<(String, Option<String>)>>>;

/// A client keeping each notice's detail, which names the node a command
/// went to or came from (the harness's notice client keeps messages only).
async fn connect_with_details(url: &str) -> anyhow::Result<(Client, Notices)> {
    let (client, mut connection) = adk_postgres_connect::ConnectConfig::from_url(url)?
        .connect()
        .await
        .map(|c| (c.client, c.connection))
        .context("connecting for the log")?;
    let notices = Notices::default();
    let sink = notices.clone();
    tokio::spawn(async move {
        // Polling for messages also drives the connection; a notice arrives
        // before its statement's result, so it is here when the call returns.
        while let Some(Ok(message)) = poll_fn(|cx| connection.poll_message(cx)).await {
            if let AsyncMessage::Notice(notice) = message {
                let entry = (notice.message().to_owned(), notice.detail().map(str::to_owned));
                sink.lock().unwrap_or_else(PoisonError::into_inner).push(entry);
            }
        }
    });
    Ok((client, notices))
}

fn drain(notices: &Notices) -> Vec<(String, Option<String>)> {
    std::mem::take(&mut *notices.lock().unwrap_or_else(PoisonError::into_inner))
}

/// The store's three calls made by a plain client of the service role with
/// Citus' command logging on for the role in this database, so on the
/// coordinator and in the sessions it opens on the workers (a session-level
/// `SET` would stay on the coordinator, and a `SET LOCAL` needs a
/// transaction block, where Citus no longer delegates the call). Every
/// command of each call after a warm-up one, and the node it went to;
/// then the coordinator's `EXPLAIN (VERBOSE)` of the call.
async fn remote_commands(side: &Side) -> anyhow::Result<Vec<RemoteEvidence>> {
    const LOGGING: [&str; 2] = ["citus.log_remote_commands", "citus.log_local_commands"];
    let owner = connect(&side.entry().url).await?;
    for setting in LOGGING {
        owner.batch_execute(&format!("ALTER ROLE {SERVICE_ROLE} IN DATABASE {DATABASE} SET {setting} = on")).await?;
    }
    let evidence = logged_calls(side, &owner).await;
    for setting in LOGGING {
        owner.batch_execute(&format!("ALTER ROLE {SERVICE_ROLE} IN DATABASE {DATABASE} RESET {setting}")).await?;
    }
    evidence
}

async fn logged_calls(side: &Side, owner: &Client) -> anyhow::Result<Vec<RemoteEvidence>> {
    let entry = side.entry().name.as_str();
    // A new session, so that it and the sessions it opens take the role's settings.
    let (client, notices) = connect_with_details(&side.service_url).await?;
    client.batch_execute("SET client_min_messages = notice").await?;
    let mut evidence = Vec::new();
    for op in OPS {
        let user = user_of(op);
        let user_worker = worker_of(owner, user).await?;
        let mut calls = Vec::new();
        for call in 0..=LOGGED_CALLS {
            drain(&notices);
            call_directly(&client, op, false).await?;
            let hops: Vec<Hop> = drain(&notices)
                .iter()
                .filter_map(|(message, detail)| parse_notice(message, detail.as_deref(), entry))
                .collect();
            // The first call may open the connections to the workers.
            if call > 0 {
                calls.push(hops);
            }
        }
        let explain = call_directly(&client, op, true).await?;
        drain(&notices);
        let per_call = |n: usize| n as f64 / calls.len().max(1) as f64;
        let remote = |hop: &&Hop| hop.kind == HopKind::Remote;
        let all = || calls.iter().flatten();
        let mut onward_by_hop: BTreeMap<String, f64> = BTreeMap::new();
        for hop in all().filter(remote).filter(|hop| hop.from != entry) {
            *onward_by_hop.entry(format!("{} → {}", hop.from, hop.to)).or_default() += per_call(1);
        }
        let nodes: BTreeSet<String> = calls.iter().flat_map(|hops| nodes_touched(hops, entry)).collect();
        let one_worker = calls.iter().all(|hops| nodes_touched(hops, entry) == BTreeSet::from([user_worker.clone()]));
        evidence.push(RemoteEvidence {
            op,
            user: user.to_owned(),
            user_worker,
            calls: calls.len(),
            from_coordinator_per_call: per_call(all().filter(remote).filter(|hop| hop.from == entry).count()),
            onward_per_call: per_call(all().filter(remote).filter(|hop| hop.from != entry).count()),
            onward_by_hop,
            local_per_call: per_call(all().filter(|hop| hop.kind == HopKind::Local).count()),
            nodes,
            one_worker,
            first_call: calls.first().cloned().unwrap_or_default(),
            explain_nodes: explain_nodes(&explain),
            explain,
        });
    }
    Ok(evidence)
}

/// Makes `op`'s call as the store does (or explains it); returns the plan's
/// lines when explaining.
async fn call_directly(client: &Client, op: Op, explain: bool) -> anyhow::Result<Vec<String>> {
    let prefix = if explain { "EXPLAIN (VERBOSE) " } else { "" };
    let rows = match op {
        Op::AppendSequential => {
            let event = BoundEvent::of(1)?;
            let id = format!("direct-{}", uuid::Uuid::new_v4().simple());
            let rows = client
                .query(
                    &format!("{prefix}{APPEND_SQL}"),
                    &[
                        &APP,
                        &APP,
                        &COUNT_USER,
                        &COUNT_SESSION,
                        &id,
                        &event.invocation_id,
                        &event.author,
                        &event.event_ts,
                        &event.payload,
                        &event.session_delta,
                        &event.user_delta,
                    ],
                )
                .await
                .context("appending directly")?;
            if !explain {
                let outcome: &str = rows.first().ok_or_else(|| anyhow!("adk_append_event returned no row"))?.get(0);
                ensure!(outcome == "stored", "the direct append answered {outcome}");
            }
            rows
        }
        Op::Get40 => {
            let rows = client
                .query(&format!("{prefix}{GET_SQL}"), &[&APP, &APP, &GET_USER, &GET_SESSION])
                .await
                .context("getting directly")?;
            // One row: the session, with its events as an array.
            if !explain {
                let events = match rows.as_slice() {
                    [row] => row.try_get::<_, Vec<serde_json::Value>>("events")?.len(),
                    _ => anyhow::bail!("the direct get returned {} rows", rows.len()),
                };
                ensure!(events == EVENTS_PER_SESSION, "the direct get returned {events} events");
            }
            rows
        }
        Op::List100 => {
            let limit = (LIST_SESSIONS + 1) as i64;
            let rows = client
                .query(&format!("{prefix}{LIST_SQL}"), &[&APP, &APP, &LIST_USER, &limit])
                .await
                .context("listing directly")?;
            // One row: the page's columns as arrays.
            if !explain {
                let sessions = match rows.as_slice() {
                    [row] => row.try_get::<_, Vec<String>>("session_ids")?.len(),
                    _ => anyhow::bail!("the direct list returned {} rows", rows.len()),
                };
                ensure!(sessions == LIST_SESSIONS, "the direct list returned {sessions} sessions");
            }
            rows
        }
        other => bail!("{other:?} is not part of the Citus comparison"),
    };
    Ok(if explain { rows.iter().map(|row| row.get::<_, String>(0)).collect() } else { Vec::new() })
}

fn shorten(text: &str, max: usize) -> String {
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() > max { format!("{}…", flat.chars().take(max).collect::<String>()) } else { flat }
}

/// A ratio with three significant digits however small.
fn times(ratio: f64) -> String {
    if ratio >= 100.0 {
        format!("{ratio:.0}x")
    } else if ratio >= 10.0 {
        format!("{ratio:.1}x")
    } else if ratio >= 1.0 {
        format!("{ratio:.2}x")
    } else {
        format!("{ratio:.3}x")
    }
}

fn table(header: &[&str]) -> Table {
    let mut table = Table::new();
    table.load_style(ASCII_MARKDOWN);
    table.set_header(header.to_vec());
    for column in table.column_iter_mut().skip(1) {
        column.set_cell_alignment(CellAlignment::Right);
    }
    table
}

impl CitusReport {
    pub fn print(&self) {
        let m = &self.machine;
        let load = |l: Option<f64>| l.map_or_else(|| "?".to_owned(), |l| format!("{l:.2}"));
        println!();
        println!(
            "Citus against a single node on one machine: {} x {}, {} RAM; load average {} at the start, {} at \
             the end. Indicative only: the coordinator, both workers and the single server share these {} CPU(s).",
            m.cpus,
            m.cpu_model,
            human_bytes(m.memory_bytes as f64),
            load(m.load_average_start),
            load(m.load_average_end),
            m.cpus
        );
        for s in &self.servers {
            let settings = s.settings.iter().map(|(n, v)| format!("{n}={v}")).collect::<Vec<_>>().join(", ");
            let citus = s.citus_version.as_ref().map(|v| format!(", Citus {v}")).unwrap_or_default();
            let workers =
                if s.workers.is_empty() { String::new() } else { format!(", workers {}", s.workers.join(" and ")) };
            println!(
                "  {}: PostgreSQL {}{citus} at {}{workers}; {settings}",
                s.target.label(),
                s.server_version,
                s.address
            );
        }
        let p = &self.plan;
        println!(
            "  {} rounds, the first target alternating; per round and target: {} appends ({} session(s) of one \
             user each), {} gets of a {}-event session, {} lists of a user's {} sessions; the store as a bound \
             service role",
            p.rounds,
            p.append_sessions_per_round * p.events_per_session,
            p.append_sessions_per_round,
            p.reads_per_round,
            p.get_events,
            p.reads_per_round,
            p.list_sessions
        );

        println!();
        let mut latencies = table(&[
            "operation",
            "single ops/s",
            "single p50 ms",
            "single p95 ms",
            "Citus ops/s",
            "Citus p50 ms",
            "Citus p95 ms",
            "p50 Citus/single",
            "p95 Citus/single",
            "ops/s Citus/single",
        ]);
        for op in OPS {
            let of = |target| self.results.iter().find(|r| r.op == op && r.target == target).map(|r| &r.latency);
            let (Some(single), Some(citus)) = (of(Target::Single), of(Target::Citus)) else { continue };
            let ratio = self.ratios.iter().find(|r| r.op == op);
            let x = |value: Option<f64>| value.map_or_else(|| "-".to_owned(), times);
            latencies.add_row(vec![
                op.label(0),
                format!("{:.0}", single.ops_per_sec),
                format!("{:.3}", single.p50_ms),
                format!("{:.3}", single.p95_ms),
                format!("{:.0}", citus.ops_per_sec),
                format!("{:.3}", citus.p50_ms),
                format!("{:.3}", citus.p95_ms),
                x(ratio.map(|r| r.p50)),
                x(ratio.map(|r| r.p95)),
                x(ratio.map(|r| r.ops_per_sec)),
            ]);
        }
        println!("{latencies}");
        println!("  ops/s: the median over rounds; p50 and p95 over every operation of every round.");

        println!();
        println!(
            "Statements per operation on each node ({} of each, untimed; pg_stat_statements, top level, without \
             Citus' maintenance polling), as the store's role + as any other role; the store's round trips \
             through a counting proxy:",
            p.counted_ops
        );
        let mut counted = table(&["operation", "target", "store round trips", "statements per node", "user's worker"]);
        for c in &self.counts {
            let nodes = c
                .nodes
                .iter()
                .map(|n| format!("{} {:.2} + {:.2}", n.node, n.store_role_per_op, n.other_roles_per_op))
                .collect::<Vec<_>>()
                .join(", ");
            counted.add_row(vec![
                c.op.label(0),
                c.target.label().to_owned(),
                format!("{:.2}", c.client_round_trips_per_op),
                nodes,
                c.user_worker.clone().unwrap_or_else(|| "-".to_owned()),
            ]);
        }
        println!("{counted}");

        println!();
        let client_trips = self
            .counts
            .iter()
            .find(|c| c.op == Op::AppendSequential && c.target == Target::Citus)
            .map(|c| format!("{:.2}", c.client_round_trips_per_op))
            .unwrap_or_else(|| "?".to_owned());
        let per = |value: Option<f64>| value.map_or_else(|| "?".to_owned(), |v| format!("{v:.2}"));
        println!(
            "Round trips per append on Citus: store→coordinator {client_trips}, coordinator→worker {}, then from \
             that worker on to other nodes {}",
            per(self.coordinator_to_worker_per_append),
            per(self.onward_per_append)
        );
        println!(
            "Every command Citus logged for {LOGGED_CALLS} calls of each (citus.log_remote_commands and \
             log_local_commands for the store's role, after a warm-up call; the user's worker from citus_shards):"
        );
        for e in &self.remote_commands {
            let nodes = e.nodes.iter().cloned().collect::<Vec<_>>().join(", ");
            println!(
                "  {}: user {} is on {}. Per call: {:.2} command(s) from the coordinator, {:.2} sent on from \
                 there, {:.2} run locally; nodes touched: {nodes}; one worker: {}",
                e.op.label(0),
                e.user,
                e.user_worker,
                e.from_coordinator_per_call,
                e.onward_per_call,
                e.local_per_call,
                if e.one_worker { "yes" } else { "NO" }
            );
            for (hop, n) in &e.onward_by_hop {
                println!("    sent on per call: {n:.2} {hop}");
            }
            let groups = grouped(&e.first_call);
            for (n, hop) in groups.iter().take(PRINTED_HOPS) {
                println!(
                    "    {} → {} as {}, {n} x: {}",
                    hop.from,
                    hop.to,
                    hop.user.as_deref().unwrap_or("?"),
                    shorten(&hop.command, 120)
                );
            }
            if groups.len() > PRINTED_HOPS {
                println!("    … {} more kinds of remote command in the JSON", groups.len() - PRINTED_HOPS);
            }
            let tasks = e
                .explain
                .iter()
                .map(|l| l.trim())
                .filter(|l| l.starts_with("Custom Scan") || l.starts_with("Task Count") || l.starts_with("Node:"));
            for line in tasks {
                println!("    the coordinator's EXPLAIN (VERBOSE): {line}");
            }
        }
        for note in &self.notes {
            println!("Note: {note}");
        }
        println!("Run time: {:.0} s", self.elapsed_secs);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const COORDINATOR: &str = "127.0.0.1:5000";

    #[test]
    fn the_coordinators_own_commands_name_where_they_went() {
        let hop = parse_notice(
            "issuing SELECT outcome, seq FROM public.adk_append_event($1, $2)",
            Some("on server adk_bench_service@127.0.0.1:41234 connectionId: 7"),
            COORDINATOR,
        )
        .unwrap();
        assert_eq!(
            hop,
            Hop {
                kind: HopKind::Remote,
                from: COORDINATOR.into(),
                to: "127.0.0.1:41234".into(),
                user: Some("adk_bench_service".into()),
                command: "SELECT outcome, seq FROM public.adk_append_event($1, $2)".into(),
            }
        );
        let odd_role =
            parse_notice("issuing COMMIT", Some("on server a@b@localhost:5432 connectionId: 12"), COORDINATOR);
        assert_eq!(odd_role.map(|h| (h.user, h.to)), Some((Some("a@b".into()), "localhost:5432".into())));
        let local = parse_notice("executing the command locally: SELECT 1", None, COORDINATOR).unwrap();
        assert_eq!((local.kind, local.from.as_str(), local.to.as_str()), (HopKind::Local, COORDINATOR, COORDINATOR));
    }

    #[test]
    fn a_workers_commands_are_relayed_with_the_worker_as_detail() {
        let onward = parse_notice(
            "issuing PREPARE TRANSACTION 'citus_2_6106_125_0'\n\
             DETAIL:  on server postgres@127.0.0.1:5001 connectionId: 1\n\
             CONTEXT:  SQL statement \"WITH l AS (SELECT 1)\nSELECT 2\"\nPL/pgSQL function adk_append_event line 9",
            Some("from 127.0.0.1:5002"),
            COORDINATOR,
        )
        .unwrap();
        assert_eq!(
            onward,
            Hop {
                kind: HopKind::Remote,
                from: "127.0.0.1:5002".into(),
                to: "127.0.0.1:5001".into(),
                user: Some("postgres".into()),
                command: "PREPARE TRANSACTION 'citus_2_6106_125_0'".into(),
            }
        );
        let local = parse_notice(
            "executing the copy locally for colocated file with shard 102050",
            Some("from 127.0.0.1:5002"),
            COORDINATOR,
        )
        .unwrap();
        assert_eq!((local.kind, local.to.as_str()), (HopKind::Local, "127.0.0.1:5002"));
    }

    #[test]
    fn other_notices_are_not_commands() {
        assert_eq!(parse_notice("relation \"x\" already exists, skipping", None, COORDINATOR), None);
        assert_eq!(parse_notice("issuing BEGIN", None, COORDINATOR), None);
        assert_eq!(parse_notice("issuing BEGIN", Some("on server u@host connectionId: 1"), COORDINATOR), None);
        assert_eq!(parse_notice("issuing BEGIN", Some("on server u@host:5432 connectionId: x"), COORDINATOR), None);
        assert_eq!(parse_notice("a worker's warning", Some("from 127.0.0.1:5002"), COORDINATOR), None);
    }

    #[test]
    fn nodes_touched_leave_out_the_coordinator_unless_a_command_went_to_it() {
        let hop = |kind, from: &str, to: &str| Hop {
            kind,
            from: from.into(),
            to: to.into(),
            user: None,
            command: "SELECT 1".into(),
        };
        let delegated = [hop(HopKind::Remote, COORDINATOR, "w1:1"), hop(HopKind::Local, "w1:1", "w1:1")];
        assert_eq!(nodes_touched(&delegated, COORDINATOR), BTreeSet::from(["w1:1".to_owned()]));
        let fanned_out = [hop(HopKind::Remote, COORDINATOR, "w1:1"), hop(HopKind::Remote, "w1:1", "w2:2")];
        assert_eq!(nodes_touched(&fanned_out, COORDINATOR), BTreeSet::from(["w1:1".to_owned(), "w2:2".to_owned()]));
        let back = [hop(HopKind::Remote, COORDINATOR, "w1:1"), hop(HopKind::Remote, "w1:1", COORDINATOR)];
        assert_eq!(nodes_touched(&back, COORDINATOR), BTreeSet::from([COORDINATOR.to_owned(), "w1:1".to_owned()]));
        assert!(nodes_touched(&[], COORDINATOR).is_empty());
    }

    #[test]
    fn remote_commands_group_by_hop_and_shape() {
        let hop = |kind, to: &str, command: &str| Hop {
            kind,
            from: "w1:1".into(),
            to: to.into(),
            user: Some("postgres".into()),
            command: command.into(),
        };
        let hops = [
            hop(HopKind::Remote, "w2:2", "SELECT * FROM adk_sessions_102008"),
            hop(HopKind::Local, "w1:1", "SELECT * FROM adk_sessions_102009"),
            hop(HopKind::Remote, "w2:2", "SELECT * FROM adk_sessions_102010"),
            hop(HopKind::Remote, "w1:1", "PREPARE TRANSACTION 'citus_2_1_1_1'"),
            hop(HopKind::Remote, "w2:2", "PREPARE TRANSACTION 'citus_2_1_1_2'"),
        ];
        let groups: Vec<(usize, &str, &str)> =
            grouped(&hops).into_iter().map(|(n, h)| (n, h.to.as_str(), h.command.as_str())).collect();
        assert_eq!(
            groups,
            [
                (2, "w2:2", "SELECT * FROM adk_sessions_102008"),
                (1, "w1:1", "PREPARE TRANSACTION 'citus_2_1_1_1'"),
                (1, "w2:2", "PREPARE TRANSACTION 'citus_2_1_1_2'"),
            ]
        );
    }

    #[test]
    fn plans_name_their_nodes() {
        let plan: Vec<String> = [
            "Custom Scan (Citus Adaptive)  (cost=0.00..0.00 rows=0 width=0)",
            "  Task Count: 1",
            "  Tasks Shown: All",
            "  ->  Task",
            "        Query: SELECT outcome, seq FROM public.adk_append_event('bench'::text)",
            "        Node: host=127.0.0.1 port=40111 dbname=adk_bench",
            "        ->  Function Scan on public.adk_append_event  (cost=0.25..10.25 rows=1000 width=40)",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(explain_nodes(&plan), BTreeSet::from(["127.0.0.1:40111".to_owned()]));
        assert!(explain_nodes(&["Function Scan on adk_read_session".to_owned()]).is_empty());
    }

    #[test]
    fn shapes_mask_numbers() {
        assert_eq!(shape("PREPARE TRANSACTION 'citus_2_6106_125_0'"), "PREPARE TRANSACTION 'citus_N_N_N_N'");
        assert_eq!(
            shape("COPY \"7_1\" FROM  STDIN\n WITH (format result)"),
            "COPY \"N_N\" FROM STDIN WITH (format result)"
        );
        assert_eq!(shape("SELECT $1, $12"), "SELECT $N, $N");
    }
}
