//! The raw-SQL references, both through pgbench with the prepared protocol,
//! the same data shape and the same concurrency, run as the owner:
//!
//! - the floor ([`Flavor::Lean`]): for each operation the leanest SQL that
//!   keeps the same guarantees on the same schema, written by hand, no
//!   functions of ours: what the database itself can do, the figure the
//!   targets are judged against;
//! - [`Flavor::Functions`]: our own SQL functions, the very statements the
//!   store sends, so the overhead of our SQL shows as the gap between the two.
//!
//! The statement-protocol probe ([`crate::protocol`]) also runs our SQL
//! functions with `-M extended`: unnamed, as the store sends them.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use adk_postgres_domain::state::ScopedState;
use anyhow::{Context as _, anyhow, bail};
use serde_json::Value;

use crate::measure::Sample;
use crate::workload::{self, APP};

/// Our statements, as `PgSessionStore` sends them, with pgbench variables
/// for its parameters (`crates/storage/src/store.rs`).
const CREATE_SQL: &str = "SELECT created_at, updated_at, expires_at, user_state, app_state \
     FROM adk_create_session(NULL, :app, :u, :n, :state, NULL, :empty, :empty);";
const APPEND_SQL: &str = "SELECT outcome, seq, session_day, updated_at, payload, successor_id \
     FROM adk_append_event(NULL, :app, :s, :s, :e, :inv, :author, :ts, :payload, :sdelta, :empty, :empty, NULL, NULL);";
const APPEND_USER_SQL: &str = "SELECT outcome, seq, session_day, updated_at, payload, successor_id \
     FROM adk_append_event(NULL, :app, :s, :s, :e, :inv, :author, :ts, :payload_u, :sdelta_u, :udelta, :empty, NULL, NULL);";
const GET_SQL: &str = "SELECT state, last_seq, session_day, created_at, updated_at, expires_at, closed_at, \
     successor_id, user_state, app_state, events FROM adk_read_session(NULL, :app, :u, :sid, NULL, LIMIT);";
const LIST_SQL: &str = "SELECT session_ids, states, last_seqs, created_ats, updated_ats, expires_ats, display_names, \
     label_sets, user_state, app_state FROM adk_read_sessions(NULL, :app, :u, NULL, NULL, :lim);";

/// Which SQL a pgbench run sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    /// Hand-written lean statements on our tables.
    Lean,
    /// Our SQL functions, as `PgSessionStore` calls them.
    Functions,
}

/// create, lean: one insert; the live user and app state come back in the
/// same statement, as `adk_create_session` returns them. It writes what a
/// create must: the initial state a rewind starts from, and the deadline
/// the store policy's default TTL gives. Leaves out the initial user/app
/// delta upserts (the workload's creates carry none), replacing an expired
/// session that holds the id (the workload's ids are fresh) and the tenant
/// setting (the owner bypasses row-level security).
const LEAN_CREATE_SQL: &str = "INSERT INTO adk_sessions AS s (app_name, user_id, session_id, state, initial_state, expires_at) \
     VALUES (:app, :u, :n, :state::jsonb, :state::jsonb, now() + (SELECT p.default_ttl FROM adk_store_policy p)) \
     ON CONFLICT DO NOTHING \
     RETURNING s.created_at, s.updated_at, s.expires_at, \
     (SELECT us.state FROM adk_user_states us WHERE us.app_name = s.app_name AND us.user_id = s.user_id), \
     (SELECT aps.state FROM adk_app_states aps WHERE aps.app_name = s.app_name);";

/// The session step of a lean append: lock the live, open session row,
/// take the next seq and merge the session delta, in one UPDATE.
const LEAN_LOCK_AND_SEQUENCE: &str = "s AS (UPDATE adk_sessions \
     SET last_seq = last_seq + 1, state = state || :SDELTA::jsonb, updated_at = now() \
     WHERE app_name = :app AND user_id = :s AND session_id = :s \
     AND closed_at IS NULL AND (expires_at IS NULL OR expires_at > now()) \
     RETURNING app_name, user_id, session_id, session_day, last_seq)";

/// The event step of a lean append.
const LEAN_INSERT_EVENT: &str = "INSERT INTO adk_events \
     (app_name, user_id, session_id, session_day, seq, event_id, invocation_id, author, event_ts, payload) \
     SELECT s.app_name, s.user_id, s.session_id, s.session_day, s.last_seq, :e::text, :inv::text, :author::text, :ts::bigint, :PAYLOAD::jsonb \
     FROM s RETURNING seq, session_day, created_at;";

/// append, lean: ONE statement that locks, sequences and inserts (and, with
/// a `user:` delta, upserts the user state under its row lock in a CTE of
/// the same statement, so it stays one atomic round trip as ours is). What
/// it leaves out of `adk_append_event`'s guarantees: the idempotent replay
/// of a retried event id (a retry fails on the unique key instead of
/// answering with the stored event), telling not-found / expired / closed /
/// stale apart (all come back as no row), the expected-seq check, the
/// max-lifetime check, the app delta (the workload has none) and the tenant
/// setting (the owner bypasses row-level security).
fn lean_append_sql(user_delta: bool) -> String {
    let (payload, sdelta) = if user_delta { ("payload_u", "sdelta_u") } else { ("payload", "sdelta") };
    let user = if user_delta {
        ", u AS (INSERT INTO adk_user_states AS us (app_name, user_id, state) \
         SELECT app_name, user_id, :udelta::jsonb FROM s \
         ON CONFLICT (app_name, user_id) DO UPDATE SET state = us.state || EXCLUDED.state, updated_at = now())"
    } else {
        ""
    };
    format!(
        "WITH {}{user} {}",
        LEAN_LOCK_AND_SEQUENCE.replace(":SDELTA", &format!(":{sdelta}")),
        LEAN_INSERT_EVENT.replace(":PAYLOAD", &format!(":{payload}"))
    )
}

/// get, lean: the session row with the live user and app state, then the
/// events of that session's day partition in seq order up to the seq the
/// first read saw (all, or the newest `:lim`). Leaves out the tenant
/// setting and the forced custom plans of our functions.
const LEAN_LOAD_SESSION_SQL: &str = "SELECT s.state, s.last_seq, s.session_day, s.created_at, s.updated_at, \
     s.expires_at, s.closed_at, s.successor_id, \
     (SELECT us.state FROM adk_user_states us WHERE us.app_name = s.app_name AND us.user_id = s.user_id), \
     (SELECT aps.state FROM adk_app_states aps WHERE aps.app_name = s.app_name) \
     FROM adk_sessions s WHERE s.app_name = :app AND s.user_id = :u AND s.session_id = :sid \
     AND (s.expires_at IS NULL OR s.expires_at > now());";
const LEAN_EVENTS_SQL: &str = "SELECT payload FROM adk_events WHERE app_name = :app AND user_id = :u \
     AND session_id = :sid AND session_day = :day::date AND seq <= :maxseq ORDER BY seq;";
const LEAN_RECENT_EVENTS_SQL: &str = "SELECT r.payload FROM (SELECT seq, payload FROM adk_events \
     WHERE app_name = :app AND user_id = :u AND session_id = :sid AND session_day = :day::date \
     AND seq <= :maxseq ORDER BY seq DESC LIMIT :lim) r ORDER BY r.seq;";

/// list, lean: the first keyset page of a user's live sessions, newest
/// first, metadata and state only. Leaves out the tenant setting.
const LEAN_LIST_SQL: &str = "SELECT s.session_id, s.state, s.last_seq, s.created_at, s.updated_at, s.expires_at, \
     us.state, aps.state FROM adk_sessions s \
     LEFT JOIN adk_user_states us ON us.app_name = s.app_name AND us.user_id = s.user_id \
     LEFT JOIN adk_app_states aps ON aps.app_name = s.app_name \
     WHERE s.app_name = :app AND s.user_id = :u AND (s.expires_at IS NULL OR s.expires_at > now()) \
     ORDER BY s.updated_at DESC, s.session_id DESC LIMIT :lim;";

/// An event's store form, the way the store binds it.
#[derive(Debug, Clone)]
pub struct BoundEvent {
    pub payload: String,
    pub session_delta: String,
    pub user_delta: String,
    pub invocation_id: String,
    pub author: String,
    pub event_ts: i64,
}

impl BoundEvent {
    /// Event `n` of the workload as our store sends it: the payload and
    /// the deltas split by scope, exactly as `PgSessionStore::append` binds them.
    pub fn of(n: usize) -> anyhow::Result<Self> {
        let event = adk_postgres_adk::to_store_event(&workload::event(n)).map_err(|e| anyhow!("{e}"))?;
        let (stored, prepared) = event.prepare_for_store()?;
        let ScopedState { session, user, .. } = prepared.delta;
        Ok(Self {
            payload: prepared.payload.to_string(),
            session_delta: Value::Object(session).to_string(),
            user_delta: Value::Object(user).to_string(),
            invocation_id: stored.invocation_id,
            author: stored.author,
            event_ts: prepared.event_ts,
        })
    }
}

/// How pgbench sends its statements (`-M`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Protocol {
    /// `-M prepared`: each statement prepared once per connection under a
    /// name, then only bound and executed; the floor's and our SQL
    /// functions' figures everywhere but the statement-protocol probe.
    Prepared,
    /// `-M extended`: each statement unnamed, Parse, Bind, Describe,
    /// Execute and Sync in one batch every time, as our store sends them.
    Extended,
}

impl Protocol {
    fn flag(self) -> &'static str {
        match self {
            Protocol::Prepared => "prepared",
            Protocol::Extended => "extended",
        }
    }
}

/// One pgbench run: its scripts, clients and variables.
#[derive(Debug, Clone)]
pub struct Run {
    pub name: String,
    pub protocol: Protocol,
    /// (script, weight)
    pub scripts: Vec<(String, u32)>,
    pub clients: usize,
    pub threads: usize,
    /// Transactions per client.
    pub transactions: usize,
    pub defines: Vec<(String, String)>,
}

#[derive(Debug, Clone)]
pub struct Pgbench {
    binary: PathBuf,
    dir: PathBuf,
}

impl Pgbench {
    pub fn new(bin_dir: &Path, dir: PathBuf) -> anyhow::Result<Self> {
        let binary = bin_dir.join("pgbench");
        if !binary.is_file() {
            bail!("no pgbench in {}", bin_dir.display());
        }
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Self { binary, dir })
    }

    /// Runs `run` against the database at `url`, with per-transaction logs
    /// for the latency percentiles.
    pub fn run(&self, url: &str, run: &Run) -> anyhow::Result<Sample> {
        let logs = self.dir.join(&run.name);
        if logs.exists() {
            std::fs::remove_dir_all(&logs).with_context(|| format!("clearing {}", logs.display()))?;
        }
        std::fs::create_dir_all(&logs)?;
        let mut command = Command::new(&self.binary);
        command.args(["-n", "-M", run.protocol.flag(), "--no-vacuum"]);
        command.arg("-c").arg(run.clients.to_string());
        command.arg("-j").arg(run.threads.to_string());
        command.arg("-t").arg(run.transactions.to_string());
        for (i, (script, weight)) in run.scripts.iter().enumerate() {
            let path = self.dir.join(format!("{}-{i}.sql", run.name));
            std::fs::write(&path, script).with_context(|| format!("writing {}", path.display()))?;
            command.arg("-f").arg(format!("{}@{weight}", path.display()));
        }
        for (name, value) in &run.defines {
            command.arg("-D").arg(format!("{name}={value}"));
        }
        command.arg("-l").arg(format!("--log-prefix={}", logs.join("tx").display()));
        command.arg(url);
        command.current_dir(&logs);
        let output = tokio::task::block_in_place(|| command.output()).context("running pgbench")?;
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        if !output.status.success() {
            bail!("pgbench {} failed ({}):\n{stdout}\n{stderr}", run.name, output.status);
        }
        let expected = (run.clients * run.transactions) as u64;
        let processed = stdout
            .lines()
            .find_map(|l| l.trim().strip_prefix("number of transactions actually processed:"))
            .and_then(|rest| rest.trim().split('/').next().and_then(|n| n.trim().parse::<u64>().ok()))
            .ok_or_else(|| anyhow!("pgbench {}: no transaction count in its output:\n{stdout}", run.name))?;
        if processed != expected {
            bail!("pgbench {}: {processed} of {expected} transactions processed:\n{stdout}\n{stderr}", run.name);
        }
        let tps = stdout
            .lines()
            .find_map(|l| l.trim().strip_prefix("tps = "))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse::<f64>().ok())
            .ok_or_else(|| anyhow!("pgbench {}: no tps in its output:\n{stdout}", run.name))?;
        let mut sample = Sample::default();
        let mut logged = 0u64;
        for entry in std::fs::read_dir(&logs)? {
            let text = std::fs::read_to_string(entry?.path())?;
            for line in text.lines() {
                // client_id transaction_no time script_no time_epoch time_us
                let latency = line.split_whitespace().nth(2).and_then(|t| t.parse::<u64>().ok());
                if let Some(micros) = latency {
                    sample.record_micros(micros);
                    logged += 1;
                }
            }
        }
        if logged != expected {
            bail!("pgbench {}: {logged} transactions logged, {expected} run", run.name);
        }
        sample.end_round(processed, Duration::from_secs_f64(processed as f64 / tps));
        Ok(sample)
    }
}

fn define(name: &str, value: impl ToString) -> (String, String) {
    (name.to_owned(), value.to_string())
}

fn common() -> Vec<(String, String)> {
    vec![define("app", APP), define("empty", "{}")]
}

/// Creates `transactions` sessions with random ids on one client.
pub fn create_run(flavor: Flavor, name: &str, transactions: usize) -> Run {
    let sql = match flavor {
        Flavor::Lean => LEAN_CREATE_SQL,
        Flavor::Functions => CREATE_SQL,
    };
    let script = format!("\\set n random(1, 999999999999999)\n\\set u random(0, 9)\n{sql}\n");
    let state = serde_json::to_string(&workload::initial_state()).expect("JSON");
    let mut defines = common();
    defines.push(define("state", state));
    Run {
        name: name.to_owned(),
        protocol: Protocol::Prepared,
        scripts: vec![(script, 1)],
        clients: 1,
        threads: 1,
        transactions,
        defines,
    }
}

/// Who appends where: `clients` (on `threads`) each append `transactions`
/// events to their own `per_client` sessions numbered from `base` on.
#[derive(Debug, Clone, Copy)]
pub struct Spread {
    pub clients: usize,
    pub threads: usize,
    pub base: usize,
    pub per_client: usize,
    pub transactions: usize,
}

/// Appends as `spread` says, each client to its own sessions (so no two
/// clients wait for the same session row, as in the store's workload), one
/// event in ten with a `user:` delta.
pub fn append_run(flavor: Flavor, name: &str, spread: Spread, plain: &BoundEvent, with_user: &BoundEvent) -> Run {
    let Spread { clients, threads, base, per_client, transactions } = spread;
    let pick = format!(
        "\\set s {base} + :client_id * {per_client} + random(0, {})\n\\set e random(1, 9000000000000000000)\n",
        per_client - 1
    );
    let every = workload::USER_DELTA_EVERY as u32;
    let (append, append_user) = match flavor {
        Flavor::Lean => (lean_append_sql(false), lean_append_sql(true)),
        Flavor::Functions => (APPEND_SQL.to_owned(), APPEND_USER_SQL.to_owned()),
    };
    let scripts = vec![(format!("{pick}{append}\n"), every - 1), (format!("{pick}{append_user}\n"), 1)];
    let mut defines = common();
    defines.extend([
        define("inv", &plain.invocation_id),
        define("author", &plain.author),
        define("ts", plain.event_ts),
        define("payload", &plain.payload),
        define("sdelta", &plain.session_delta),
        define("payload_u", &with_user.payload),
        define("sdelta_u", &with_user.session_delta),
        define("udelta", &with_user.user_delta),
    ]);
    Run { name: name.to_owned(), protocol: Protocol::Prepared, scripts, clients, threads, transactions, defines }
}

/// A session's store coordinates the event read binds.
#[derive(Debug, Clone)]
pub struct SessionCoordinates {
    pub user: String,
    pub session: String,
    pub day: String,
    pub last_seq: i64,
}

/// `get`: the session row, then its events (all, or the last `recent`):
/// two plain reads on the floor, one call of ours.
pub fn get_run(flavor: Flavor, name: &str, transactions: usize, at: &SessionCoordinates, recent: Option<usize>) -> Run {
    let limit = if recent.is_some() { ":lim" } else { "NULL" };
    let script = match flavor {
        Flavor::Lean => {
            let events = if recent.is_some() { LEAN_RECENT_EVENTS_SQL } else { LEAN_EVENTS_SQL };
            format!("{LEAN_LOAD_SESSION_SQL}\n{events}\n")
        }
        Flavor::Functions => format!("{}\n", GET_SQL.replace("LIMIT", limit)),
    };
    let mut defines = common();
    defines.extend([
        define("u", &at.user),
        define("sid", &at.session),
        define("day", &at.day),
        define("maxseq", at.last_seq),
    ]);
    if let Some(n) = recent {
        defines.push(define("lim", n));
    }
    Run {
        name: name.to_owned(),
        protocol: Protocol::Prepared,
        scripts: vec![(script, 1)],
        clients: 1,
        threads: 1,
        transactions,
        defines,
    }
}

/// `list`: one page of the user's sessions (page size 200, plus one to
/// tell whether another page follows).
pub fn list_run(flavor: Flavor, name: &str, transactions: usize, user: &str) -> Run {
    let sql = match flavor {
        Flavor::Lean => LEAN_LIST_SQL,
        Flavor::Functions => LIST_SQL,
    };
    let mut defines = common();
    defines.extend([define("u", user), define("lim", adk_postgres_domain::session::MAX_PAGE_SIZE + 1)]);
    Run {
        name: name.to_owned(),
        protocol: Protocol::Prepared,
        scripts: vec![(format!("{sql}\n"), 1)],
        clients: 1,
        threads: 1,
        transactions,
        defines,
    }
}
