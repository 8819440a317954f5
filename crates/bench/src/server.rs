//! The PostgreSQL server the benchmark runs on: a throwaway cluster of its
//! own with durable settings, or the server behind `DATABASE_URL`.

use std::path::PathBuf;

use adk_postgres_testing::{Cluster, find_server_binaries, start_throwaway_cluster};
use anyhow::{Context as _, bail};
use serde::Serialize;
use tokio_postgres::Client;
use url::Url;

/// Settings the benchmark turns on in its own cluster: a server as an
/// operator would run it (every commit flushed, full-page writes), plus
/// `pg_stat_statements` counting top-level statements only.
const DURABLE: &[(&str, &str)] = &[
    ("fsync", "on"),
    ("synchronous_commit", "on"),
    ("full_page_writes", "on"),
    ("pg_stat_statements.track", "top"),
    ("pg_stat_statements.track_utility", "on"),
];

/// Settings printed with the results, so a figure is never read without them.
const SHOWN: &[&str] = &[
    "server_version",
    "fsync",
    "synchronous_commit",
    "full_page_writes",
    "wal_level",
    "wal_sync_method",
    "shared_buffers",
    "max_wal_size",
    "checkpoint_timeout",
    "autovacuum",
    "shared_preload_libraries",
    "pg_stat_statements.track",
    "max_connections",
];

/// Where the benchmark's databases live.
#[derive(Debug)]
pub struct Server {
    /// Stopped and deleted when dropped (and by a watchdog if we die first).
    cluster: Option<Cluster>,
    /// A URL of a maintenance database on the server.
    admin_url: String,
    /// Where `pgbench` is, when it is anywhere.
    pub bin_dir: Option<PathBuf>,
    /// Whether `pg_stat_statements` is loaded and installed in every
    /// database the benchmark makes.
    pub stat_statements: bool,
    pub settings: Vec<(String, String)>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ServerInfo {
    pub source: String,
    pub settings: Vec<(String, String)>,
    pub stat_statements: bool,
}

pub async fn connect(url: &str) -> anyhow::Result<Client> {
    let (client, connection) = adk_postgres_connect::ConnectConfig::from_url(url)?
        .connect()
        .await
        .map(|c| (c.client, c.connection))
        .with_context(|| format!("connecting to {}", redacted(url)))?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

fn redacted(url: &str) -> String {
    match Url::parse(url) {
        Ok(mut parsed) if parsed.password().is_some() => {
            let _ = parsed.set_password(Some("***"));
            parsed.into()
        }
        _ => url.to_owned(),
    }
}

impl Server {
    /// Starts a throwaway cluster with durable settings; blocks for a few
    /// seconds (initdb, start, restart with the settings).
    pub async fn throwaway() -> anyhow::Result<Self> {
        let cluster = tokio::task::block_in_place(start_throwaway_cluster)
            .context("starting a throwaway PostgreSQL cluster (server binaries needed: initdb, pg_ctl, postgres)")?;
        let admin_url = cluster.server_url();
        {
            // The harness's clusters are made for tests (fsync off);
            // postgresql.auto.conf wins over their settings file.
            let client = connect(&admin_url).await?;
            for (name, value) in DURABLE {
                if let Err(error) = client.batch_execute(&format!("ALTER SYSTEM SET {name} = '{value}'")).await {
                    // pg_stat_statements.* is unknown where the module is not loaded.
                    eprintln!("bench: ALTER SYSTEM SET {name}: {error}");
                }
            }
        }
        tokio::task::block_in_place(|| cluster.restart_fast()).context("restarting with durable settings")?;
        let bin_dir = Some(cluster.bin_dir().to_path_buf());
        let mut server =
            Self { cluster: Some(cluster), admin_url, bin_dir, stat_statements: false, settings: Vec::new() };
        server.inspect().await?;
        let client = connect(&server.admin_url).await?;
        let fsync: String = client.query_one("SHOW fsync", &[]).await?.get(0);
        let sync: String = client.query_one("SHOW synchronous_commit", &[]).await?.get(0);
        if fsync != "on" || sync != "on" {
            bail!("the benchmark cluster did not take durable settings (fsync = {fsync}, synchronous_commit = {sync})");
        }
        Ok(server)
    }

    /// Uses the server at `url` (a maintenance database where we may create
    /// databases).
    pub async fn existing(url: &str) -> anyhow::Result<Self> {
        let bin_dir = find_server_binaries().ok().filter(|dir| dir.join("pgbench").is_file());
        let mut server =
            Self { cluster: None, admin_url: url.to_owned(), bin_dir, stat_statements: false, settings: Vec::new() };
        server.inspect().await?;
        Ok(server)
    }

    async fn inspect(&mut self) -> anyhow::Result<()> {
        let client = connect(&self.admin_url).await?;
        let rows = client
            .query("SELECT name, setting, unit FROM pg_settings WHERE name = ANY($1) ORDER BY name", &[&SHOWN])
            .await
            .context("reading pg_settings")?;
        let mut settings: Vec<(String, String)> = rows
            .iter()
            .map(|row| {
                let name: String = row.get(0);
                let setting: String = row.get(1);
                let unit: Option<String> = row.get(2);
                (name, pretty_setting(&setting, unit.as_deref()))
            })
            .collect();
        settings.sort_by_key(|(name, _)| SHOWN.iter().position(|n| n == name));
        self.settings = settings;
        self.stat_statements = client.batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements").await.is_ok()
            && client.query_one("SELECT count(*) FROM pg_stat_statements", &[]).await.is_ok();
        Ok(())
    }

    pub fn info(&self) -> ServerInfo {
        ServerInfo {
            source: match &self.cluster {
                Some(cluster) => format!("throwaway cluster in {} (port {})", cluster.dir().display(), cluster.port()),
                None => format!("DATABASE_URL {}", redacted(&self.admin_url)),
            },
            settings: self.settings.clone(),
            stat_statements: self.stat_statements,
        }
    }

    pub fn admin_url(&self) -> &str {
        &self.admin_url
    }

    pub fn database_url(&self, name: &str) -> String {
        let mut url = Url::parse(&self.admin_url).expect("the admin URL parsed before");
        url.set_path(&format!("/{name}"));
        url.into()
    }

    /// A fresh, empty database `name` (dropped first if a previous run left it).
    pub async fn fresh_database(&self, name: &str) -> anyhow::Result<String> {
        let client = connect(&self.admin_url).await?;
        for statement in
            [format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"), format!("CREATE DATABASE \"{name}\"")]
        {
            client.batch_execute(&statement).await.with_context(|| format!("creating database {name}"))?;
        }
        let url = self.database_url(name);
        if self.stat_statements {
            connect(&url).await?.batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements").await?;
        }
        Ok(url)
    }

    pub async fn drop_database(&self, name: &str) -> anyhow::Result<()> {
        connect(&self.admin_url)
            .await?
            .batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
            .await?;
        Ok(())
    }

    /// Whether the cluster is ours (and goes away with us).
    pub fn is_throwaway(&self) -> bool {
        self.cluster.is_some()
    }
}

fn pretty_setting(setting: &str, unit: Option<&str>) -> String {
    let Ok(n) = setting.parse::<f64>() else { return setting.to_owned() };
    match unit {
        Some("8kB") => human_bytes(n * 8192.0),
        Some("kB") => human_bytes(n * 1024.0),
        Some("MB") => human_bytes(n * 1024.0 * 1024.0),
        Some("s") => format!("{setting}s"),
        Some("ms") => format!("{setting}ms"),
        Some(other) => format!("{setting} {other}"),
        None => setting.to_owned(),
    }
}

pub fn human_bytes(bytes: f64) -> String {
    const UNITS: [&str; 5] = ["B", "kB", "MB", "GB", "TB"];
    let mut value = bytes;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 { format!("{value:.0} {}", UNITS[unit]) } else { format!("{value:.1} {}", UNITS[unit]) }
}
