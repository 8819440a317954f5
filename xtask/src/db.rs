//! `db up|down|url|psql`: a persistent developer cluster in target/adk-pg-dev/.
//!
//! Same settings as the test clusters (UTC+14 server zone, 300 connections,
//! pg_stat_statements when available) but durable, and it keeps its data.

use std::os::unix::process::CommandExt as _;
use std::path::PathBuf;
use std::process::{Command, ExitCode};

use adk_postgres_testing::{Cluster, ClusterConfig, find_server_binaries, free_port, port_is_free};
use anyhow::{Context as _, bail};

use crate::flags::Db;
use crate::project;

/// Preferred port: fixed so a URL written down yesterday still works today,
/// and off 5432 so it never meets a system PostgreSQL.
const PREFERRED_PORT: u16 = 54329;
/// The database the developer cluster's URL points to.
const DATABASE: &str = "adk";

pub fn run(action: Db) -> anyhow::Result<ExitCode> {
    match action {
        Db::Up => up(),
        Db::Down => down(),
        Db::Url => {
            println!("{}", dev_url()?);
            Ok(ExitCode::SUCCESS)
        }
        Db::Psql { args } => psql(&args),
    }
}

/// The URL of the running developer cluster's database, for other commands.
pub fn dev_url() -> anyhow::Result<String> {
    let cluster = open()?;
    if !cluster.is_running() {
        bail!("the developer cluster is not running: start it with `cargo xtask db up`");
    }
    Ok(cluster.database_url(DATABASE))
}

fn dir() -> PathBuf {
    project::root().join("target/adk-pg-dev")
}

fn open() -> anyhow::Result<Cluster> {
    let dir = dir();
    if !dir.join("data/PG_VERSION").is_file() {
        bail!("there is no developer cluster in {}: make one with `cargo xtask db up`", dir.display());
    }
    Cluster::open(&dir).with_context(|| format!("opening the developer cluster in {}", dir.display()))
}

fn up() -> anyhow::Result<ExitCode> {
    let dir = dir();
    let cluster = if dir.join("data/PG_VERSION").is_file() {
        open()?
    } else {
        let port = if port_is_free(PREFERRED_PORT) { PREFERRED_PORT } else { free_port()? };
        eprintln!("creating a cluster in {} (port {port})", dir.display());
        let config =
            ClusterConfig { bin_dir: find_server_binaries()?, dir: dir.clone(), port, durable: true, citus: false };
        Cluster::init(&config)
            .with_context(|| format!("initdb in {} failed; delete the folder before trying again", dir.display()))?
    };
    if cluster.is_running() {
        eprintln!("already running");
    } else {
        cluster.start()?;
    }
    create_database(&cluster)?;
    println!("{}", cluster.database_url(DATABASE));
    Ok(ExitCode::SUCCESS)
}

fn down() -> anyhow::Result<ExitCode> {
    let cluster = open()?;
    if cluster.is_running() {
        cluster.stop()?;
        eprintln!("stopped; the data stays in {}", cluster.dir().display());
    } else {
        eprintln!("not running");
    }
    Ok(ExitCode::SUCCESS)
}

fn psql(args: &[String]) -> anyhow::Result<ExitCode> {
    let url = dev_url()?;
    let psql = open()?.bin_dir().join("psql");
    let error = Command::new(&psql).arg(url).args(args).exec();
    Err(error).with_context(|| format!("running {}", psql.display()))
}

fn create_database(cluster: &Cluster) -> anyhow::Result<()> {
    let query = |sql: &str| -> anyhow::Result<String> {
        let output = Command::new(cluster.bin_dir().join("psql"))
            .args(["-X", "-q", "-t", "-A", "-v", "ON_ERROR_STOP=1", "-d"])
            .arg(cluster.server_url())
            .args(["-c", sql])
            .output()
            .context("running psql")?;
        if !output.status.success() {
            bail!("psql -c {sql:?}: {}", String::from_utf8_lossy(&output.stderr).trim());
        }
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
    };
    if query(&format!("SELECT 1 FROM pg_database WHERE datname = '{DATABASE}'"))?.is_empty() {
        query(&format!("CREATE DATABASE \"{DATABASE}\""))?;
    }
    Ok(())
}
