//! Opt-in: the contract suite against adk-session's own sqlx-based
//! `PostgresSessionService`, next to our adapter, on the same throwaway
//! cluster (each backend on a database of its own). Every case runs against
//! every backend; a failing case is recorded, not fatal, except for ours.
//! The result is written to `target/adk-session-comparison.md`.
//!
//! ```sh
//! cargo test -p adk-postgres-adk --features compare-builtin --test adk compare_builtin -- --nocapture
//! ```
#![cfg(all(feature = "compare-builtin", feature = "postgres"))]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::suite::{CASES, Group, Service};
use adk_postgres_adk::PgSessionService;
use adk_postgres_adk::storage::{PgSessionStore, PoolConfig};
use adk_postgres_testing::test_database;
use adk_session::InMemorySessionService;
use adk_session::postgres::PostgresSessionService;

/// Longer than any case needs; a hung case is a failure, not a hung run.
const CASE_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs one case in a task of its own, so a panic is an outcome.
async fn outcome(case: &crate::suite::Case, service: Service) -> Result<(), String> {
    let task = tokio::spawn((case.run)(service));
    match tokio::time::timeout(CASE_TIMEOUT, task).await {
        Err(_) => Err(format!("timed out after {CASE_TIMEOUT:?}")),
        Ok(Ok(())) => Ok(()),
        Ok(Err(join)) if join.is_panic() => {
            let payload = join.into_panic();
            let message = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_else(|| "panicked".to_owned());
            Err(message)
        }
        Ok(Err(join)) => Err(join.to_string()),
    }
}

/// The first line of a failure, short enough for a table cell.
fn cell(result: &Result<(), String>) -> String {
    match result {
        Ok(()) => "pass".to_owned(),
        Err(message) => {
            let line = message.lines().next().unwrap_or_default();
            let line = line.trim_start_matches("assertion `left == right` failed: ").replace('|', "\\|");
            let short: String = line.chars().take(110).collect();
            let ellipsis = if line.chars().count() > 110 { "…" } else { "" };
            format!("**FAIL**: {short}{ellipsis}")
        }
    }
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn compare_with_adk_session_backends() {
    let ours_db = test_database().await;
    let builtin_db = test_database().await;
    let ours_store = PgSessionStore::connect(ours_db.url(), &PoolConfig::default(), Default::default())
        .await
        .expect("connect our store");
    let ours: Service = Arc::new(PgSessionService::from_store(ours_store));
    let builtin = PostgresSessionService::new(builtin_db.url()).await.expect("connect PostgresSessionService");
    builtin.migrate().await.expect("PostgresSessionService::migrate");
    let builtin: Service = Arc::new(builtin);
    let in_memory: Service = Arc::new(InMemorySessionService::new());

    // Failures are outcomes here, reported in the table; keep the default
    // hook's backtraces out of the output while the cases run.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let mut rows = Vec::new();
    for case in CASES {
        let results = [
            outcome(case, ours.clone()).await,
            outcome(case, builtin.clone()).await,
            outcome(case, in_memory.clone()).await,
        ];
        rows.push((case, results));
    }
    std::panic::set_hook(default_hook);

    let count = |i: usize| rows.iter().filter(|(_, r)| r[i].is_ok()).count();
    let mut table = String::new();
    table.push_str(&format!(
        "Contract suite (`crates/adk/tests/adk/suite.rs`), {} cases, run by `cargo test -p adk-postgres-adk --features \
         compare-builtin --test adk compare_builtin` on PostgreSQL {}.\n\n",
        CASES.len(),
        server_version(ours_db.url()).await
    ));
    table.push_str("| case | group | ours (`PgSessionService`) | built-in (`PostgresSessionService`) | `InMemorySessionService` |\n");
    table.push_str("|---|---|---|---|---|\n");
    for (case, results) in &rows {
        let group = match case.group {
            Group::Core => "core",
            Group::Strict => "strict",
        };
        table.push_str(&format!(
            "| `{}` | {group} | {} | {} | {} |\n",
            case.name,
            cell(&results[0]),
            cell(&results[1]),
            cell(&results[2])
        ));
    }
    table.push_str(&format!(
        "| **passed** | | **{}/{}** | **{}/{}** | **{}/{}** |\n",
        count(0),
        rows.len(),
        count(1),
        rows.len(),
        count(2),
        rows.len()
    ));

    std::fs::create_dir_all(target_dir()).expect("create target dir");
    let path = target_dir().canonicalize().expect("target dir").join("adk-session-comparison.md");
    std::fs::write(&path, &table).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    println!("{table}\nwritten to {}", path.display());

    let ours_failed: Vec<_> = rows.iter().filter(|(_, r)| r[0].is_err()).map(|(c, r)| (c.name, cell(&r[0]))).collect();
    assert!(ours_failed.is_empty(), "our adapter failed: {ours_failed:?}");
}

async fn server_version(url: &str) -> String {
    match adk_postgres_testing::connect(url).await {
        Ok(client) => {
            let row = client.query_one("SHOW server_version", &[]).await;
            row.map(|r| r.get::<_, String>(0)).unwrap_or_else(|_| "?".into())
        }
        Err(_) => "?".into(),
    }
}
