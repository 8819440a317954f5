//! A Citus cluster for the tests: a coordinator and workers, each a
//! throwaway PostgreSQL cluster on localhost loading Citus.
//!
//! Citus does not propagate `CREATE DATABASE`, and the coordinator reaches a
//! worker's copy of a database by the same name. So every per-test database
//! is made on every node from a template that exists on every node, and
//! dropped on every node (see `database.rs`). The template is wired once:
//! the extension created on each node and the workers added on the
//! coordinator; its clones inherit both.

use std::path::Path;

use adk_postgres_schema::quote::quote_ident;

use crate::cluster::{Cluster, throwaway_node};
use crate::error::HarnessError;
use crate::source::pg_config;
use crate::urls::with_database;

/// Comma-separated URLs of the workers' maintenance databases, beside
/// [`crate::TEST_URL_VAR`] naming the coordinator's; set by
/// `cargo xtask citus test`.
pub const CITUS_WORKERS_VAR: &str = "ADK_PG_TEST_CITUS_WORKERS";

/// A coordinator and its workers; all stopped and deleted when dropped.
#[derive(Debug)]
pub struct CitusCluster {
    coordinator: Cluster,
    workers: Vec<Cluster>,
}

impl CitusCluster {
    pub fn coordinator(&self) -> &Cluster {
        &self.coordinator
    }

    pub fn workers(&self) -> &[Cluster] {
        &self.workers
    }

    /// The workers' maintenance URLs, as [`CITUS_WORKERS_VAR`] wants them.
    pub fn workers_var(&self) -> String {
        self.workers.iter().map(Cluster::server_url).collect::<Vec<_>>().join(",")
    }
}

/// Whether the Citus extension is installed for the server binaries in
/// `bin_dir`.
pub fn citus_installed(bin_dir: &Path) -> bool {
    let library = pg_config("--pkglibdir", Some(bin_dir)).map(|dir| Path::new(&dir).join("citus.so"));
    let control = pg_config("--sharedir", Some(bin_dir)).map(|dir| Path::new(&dir).join("extension/citus.control"));
    library.is_some_and(|path| path.is_file()) && control.is_some_and(|path| path.is_file())
}

/// Starts a coordinator and `workers` workers, each a throwaway cluster
/// loading Citus. The databases are wired to each other per database, when
/// the harness makes its template.
pub fn start_throwaway_citus_cluster(bin_dir: &Path, workers: usize) -> Result<CitusCluster, HarnessError> {
    if !citus_installed(bin_dir) {
        return Err(HarnessError::Setup(format!(
            "Citus is not installed for the server in {}: `cargo xtask citus up` builds and installs it",
            bin_dir.display()
        )));
    }
    // Started side by side: each start is a second of waiting.
    let started: Vec<Result<Cluster, HarnessError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..=workers).map(|_| scope.spawn(|| throwaway_node(bin_dir, true))).collect();
        handles
            .into_iter()
            .map(|handle| {
                handle.join().unwrap_or_else(|_| Err(HarnessError::Setup("starting a Citus node panicked".into())))
            })
            .collect()
    });
    let mut nodes = started.into_iter().collect::<Result<Vec<_>, _>>()?;
    let coordinator = nodes.remove(0);
    Ok(CitusCluster { coordinator, workers: nodes })
}

/// Creates database `name` on every node and wires it: the citus extension
/// in each copy, the coordinator and the workers registered in the
/// coordinator's. Returns the coordinator copy's URL; migrating it
/// (`adk_postgres_schema::run_pending_migrations`) distributes the store.
pub async fn create_citus_database(
    coordinator_server_url: &str,
    worker_server_urls: &[String],
    name: &str,
) -> Result<String, HarnessError> {
    let quoted = quote_ident(name);
    for server in worker_server_urls.iter().map(String::as_str).chain([coordinator_server_url]) {
        let client = crate::connect(server).await?;
        client
            .batch_execute(&format!("CREATE DATABASE {quoted} TEMPLATE template0 ENCODING 'UTF8' LOCALE 'C'"))
            .await?;
        drop(client);
        let client = crate::connect(&with_database(server, name)?).await?;
        client.batch_execute("CREATE EXTENSION citus").await?;
    }
    let client = crate::connect(&with_database(coordinator_server_url, name)?).await?;
    let (host, port) = host_and_port(coordinator_server_url)?;
    client.execute("SELECT citus_set_coordinator_host($1, $2)", &[&host, &port]).await?;
    for worker in worker_server_urls {
        let (host, port) = host_and_port(worker)?;
        client.execute("SELECT citus_add_node($1, $2)", &[&host, &port]).await?;
    }
    with_database(coordinator_server_url, name)
}

/// The worker URLs in [`CITUS_WORKERS_VAR`], none when unset.
pub(crate) fn workers_from_environment() -> Vec<String> {
    std::env::var(CITUS_WORKERS_VAR)
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|url| !url.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Host and port of a server URL, as `citus_add_node` wants them.
pub(crate) fn host_and_port(url: &str) -> Result<(String, i32), HarnessError> {
    let config: tokio_postgres::Config =
        url.parse().map_err(|error| HarnessError::BadUrl { url: url.to_owned(), reason: format!("{error}") })?;
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
        _ => return Err(HarnessError::BadUrl { url: url.to_owned(), reason: "a Citus node needs a TCP host".into() }),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    Ok((host, i32::from(port)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_and_port_come_from_the_url() {
        assert_eq!(host_and_port("postgres://postgres@127.0.0.1:55401/postgres").unwrap(), ("127.0.0.1".into(), 55401));
        assert_eq!(host_and_port("postgres://postgres@db.example/postgres").unwrap(), ("db.example".into(), 5432));
    }
}
