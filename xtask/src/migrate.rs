//! `migrate`: apply the embedded migrations.

use std::process::ExitCode;

use anyhow::Context as _;

use crate::db;

pub fn run() -> anyhow::Result<ExitCode> {
    let url = match std::env::var("DATABASE_URL") {
        Ok(url) if !url.trim().is_empty() => url,
        _ => db::dev_url().context("DATABASE_URL is not set, so migrating the developer cluster")?,
    };
    // diesel's migration harness blocks; storage runs it on spawn_blocking.
    let runtime =
        tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting a tokio runtime")?;
    let applied = runtime.block_on(adk_postgres_schema::run_pending_migrations(&url))?;
    if applied.is_empty() {
        println!("nothing to apply: the database is up to date");
    }
    for version in applied {
        println!("applied {version}");
    }
    Ok(ExitCode::SUCCESS)
}
