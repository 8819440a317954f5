//! The raw-SQL floor: pgbench running our own SQL (the very statements the
//! store sends, with the same data shape and the same concurrency) with the
//! prepared protocol. No client-side cost but libpq's: what the database
//! itself can do, the figure the store is measured against.

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
const LOAD_SESSION_SQL: &str = "SELECT state, last_seq, session_day, created_at, updated_at, expires_at, closed_at, \
     successor_id, user_state, app_state FROM adk_load_session(NULL, :app, :u, :sid);";
const LIST_SQL: &str = "SELECT session_id, state, last_seq, created_at, updated_at, expires_at, user_state, app_state \
     FROM adk_list_sessions(NULL, :app, :u, NULL, NULL, :lim);";

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

/// One pgbench run: its scripts, clients and variables.
#[derive(Debug, Clone)]
pub struct Run {
    pub name: String,
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
        command.args(["-n", "-M", "prepared", "--no-vacuum"]);
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
pub fn create_run(name: &str, transactions: usize) -> Run {
    let script = format!("\\set n random(1, 999999999999999)\n\\set u random(0, 9)\n{CREATE_SQL}\n");
    let state = serde_json::to_string(&workload::initial_state()).expect("JSON");
    let mut defines = common();
    defines.push(define("state", state));
    Run { name: name.to_owned(), scripts: vec![(script, 1)], clients: 1, threads: 1, transactions, defines }
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
pub fn append_run(name: &str, spread: Spread, plain: &BoundEvent, with_user: &BoundEvent) -> Run {
    let Spread { clients, threads, base, per_client, transactions } = spread;
    let pick = format!(
        "\\set s {base} + :client_id * {per_client} + random(0, {})\n\\set e random(1, 9000000000000000000)\n",
        per_client - 1
    );
    let every = workload::USER_DELTA_EVERY as u32;
    let scripts = vec![(format!("{pick}{APPEND_SQL}\n"), every - 1), (format!("{pick}{APPEND_USER_SQL}\n"), 1)];
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
    Run { name: name.to_owned(), scripts, clients, threads, transactions, defines }
}

/// A session's store coordinates the event read binds.
#[derive(Debug, Clone)]
pub struct SessionCoordinates {
    pub user: String,
    pub session: String,
    pub day: String,
    pub last_seq: i64,
}

/// `get`: the session row, then its events (all, or the last `recent`).
pub fn get_run(name: &str, transactions: usize, at: &SessionCoordinates, recent: Option<usize>) -> Run {
    let limit = if recent.is_some() { ":lim" } else { "NULL" };
    let script = format!(
        "{LOAD_SESSION_SQL}\nSELECT payload FROM adk_load_events(NULL, :app, :u, :sid, :day, :maxseq, NULL, {limit});\n"
    );
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
    Run { name: name.to_owned(), scripts: vec![(script, 1)], clients: 1, threads: 1, transactions, defines }
}

/// `list`: one page of the user's sessions (page size 200, plus one to
/// tell whether another page follows).
pub fn list_run(name: &str, transactions: usize, user: &str) -> Run {
    let mut defines = common();
    defines.extend([define("u", user), define("lim", adk_postgres_domain::session::MAX_PAGE_SIZE + 1)]);
    Run {
        name: name.to_owned(),
        scripts: vec![(format!("{LIST_SQL}\n"), 1)],
        clients: 1,
        threads: 1,
        transactions,
        defines,
    }
}
