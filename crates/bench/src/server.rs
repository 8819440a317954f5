//! The PostgreSQL server the benchmark runs on: a throwaway cluster of its
//! own with durable settings, or the server behind `DATABASE_URL`.
//!
//! Every URL it hands out says `sslmode=disable`. libpq's default,
//! `prefer`, which pgbench and our connect crate both follow, means TLS
//! wherever the server offers it (the throwaway cluster does), while
//! adk-session's sqlx is built without TLS and stays on plaintext: left to
//! their defaults the implementations would not share a transport, and
//! figures would not compare with runs made before the cluster had TLS.
//! The TLS leg alone ([`crate::tls`]) asks for `verify-full`, through
//! [`with_transport`].

use std::path::{Path, PathBuf};

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
    "ssl",
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
    /// A URL of a maintenance database on the server, on plaintext.
    admin_url: String,
    /// The CA a TLS connection verifies the server against (`sslrootcert`,
    /// escaped for a URL): the throwaway cluster's own, or the one
    /// `DATABASE_URL` names; without one there is no TLS leg.
    root_cert: Option<String>,
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
    /// How every implementation reaches the server.
    pub transport: String,
}

/// How a connection of the bench reaches the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    /// `sslmode=disable`: every comparison between implementations.
    Plaintext,
    /// `sslmode=verify-full` against `root_cert` (as escaped for a URL):
    /// the chain and the host name checked, as a production client should.
    VerifiedTls { root_cert: String },
}

impl Transport {
    pub fn sslmode(&self) -> &'static str {
        match self {
            Transport::Plaintext => "disable",
            Transport::VerifiedTls { .. } => "verify-full",
        }
    }
}

/// Parameters of a URL that choose its transport; [`with_transport`]
/// replaces them all, so nothing of `DATABASE_URL`'s own choice is left to
/// mix with the bench's (`sslnegotiation=direct` without TLS fails).
const TRANSPORT_PARAMETERS: [&str; 3] = ["sslmode", "sslrootcert", "sslnegotiation"];

/// `url` with its transport set to `transport`, its other parameters kept.
/// Raw pairs and our own escaping: libpq and the connect crate read `+` as
/// itself, not as the space form encoding would make of it.
pub fn with_transport(url: &str, transport: &Transport) -> anyhow::Result<String> {
    let mut parsed = Url::parse(url).with_context(|| format!("parsing {}", redacted(url)))?;
    let query = parsed.query().unwrap_or_default().to_owned();
    let mut pairs: Vec<String> = query
        .split('&')
        .filter(|pair| !pair.is_empty() && !TRANSPORT_PARAMETERS.contains(&pair.split('=').next().unwrap_or_default()))
        .map(str::to_owned)
        .collect();
    pairs.push(format!("sslmode={}", transport.sslmode()));
    if let Transport::VerifiedTls { root_cert } = transport {
        pairs.push(format!("sslrootcert={root_cert}"));
    }
    parsed.set_query(Some(&pairs.join("&")));
    Ok(parsed.into())
}

/// A file path as a URL parameter's value.
fn escaped_path(path: &Path) -> String {
    path.to_string_lossy()
        .bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' | b'/' => char::from(byte).to_string(),
            other => format!("%{other:02X}"),
        })
        .collect()
}

/// The value of parameter `name` in `url`'s query, as written (escaped).
fn raw_parameter(url: &str, name: &str) -> Option<String> {
    let parsed = Url::parse(url).ok()?;
    let query = parsed.query()?.to_owned();
    query.split('&').find_map(|pair| pair.strip_prefix(name)?.strip_prefix('=').map(str::to_owned))
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
        let admin_url = with_transport(&cluster.server_url(), &Transport::Plaintext)?;
        let root_cert = cluster.ca_file().map(escaped_path);
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
        let mut server = Self {
            cluster: Some(cluster),
            admin_url,
            root_cert,
            bin_dir,
            stat_statements: false,
            settings: Vec::new(),
        };
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
    /// databases), on plaintext whatever `sslmode` it names; its
    /// `sslrootcert`, if any, is what the TLS leg verifies against.
    pub async fn existing(url: &str) -> anyhow::Result<Self> {
        let bin_dir = find_server_binaries().ok().filter(|dir| dir.join("pgbench").is_file());
        if let Some(mode) = raw_parameter(url, "sslmode").filter(|mode| mode != "disable") {
            eprintln!(
                "bench: DATABASE_URL asks for sslmode={mode}; every implementation runs on plaintext \
                 (sslmode=disable) so their figures compare, and only the TLS leg uses TLS"
            );
        }
        let root_cert = raw_parameter(url, "sslrootcert").filter(|cert| !cert.is_empty());
        let mut server = Self {
            cluster: None,
            admin_url: with_transport(url, &Transport::Plaintext)?,
            root_cert,
            bin_dir,
            stat_statements: false,
            settings: Vec::new(),
        };
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
            transport: "plaintext (sslmode=disable) for every implementation and pgbench; TLS (verify-full) \
                        only in the TLS leg"
                .to_owned(),
        }
    }

    /// The TLS leg's transport, when a CA to verify the server against is known.
    pub fn verified_tls(&self) -> Option<Transport> {
        self.root_cert.clone().map(|root_cert| Transport::VerifiedTls { root_cert })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transport_replaces_the_urls_own_and_keeps_the_rest() {
        let url = "postgres://u:p%2Bw@127.0.0.1:5432/db?application_name=a+b&sslmode=require\
                   &sslnegotiation=direct&sslrootcert=%2Fold%2Fca.crt";
        assert_eq!(
            with_transport(url, &Transport::Plaintext).unwrap(),
            "postgres://u:p%2Bw@127.0.0.1:5432/db?application_name=a+b&sslmode=disable"
        );
        let root_cert = escaped_path(Path::new("/tmp/adk pg+x/ca.crt"));
        assert_eq!(root_cert, "/tmp/adk%20pg%2Bx/ca.crt");
        assert_eq!(
            with_transport("postgres://u@127.0.0.1:5432/db", &Transport::VerifiedTls { root_cert }).unwrap(),
            "postgres://u@127.0.0.1:5432/db?sslmode=verify-full&sslrootcert=/tmp/adk%20pg%2Bx/ca.crt"
        );
        assert_eq!(raw_parameter(url, "sslrootcert").as_deref(), Some("%2Fold%2Fca.crt"));
        assert_eq!(raw_parameter(url, "sslcert"), None);
    }
}
