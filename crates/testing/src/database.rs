//! Per-test databases cloned from a migrated template.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use tokio::sync::OnceCell;
use tokio::task::JoinHandle;
use tokio_postgres::Client;
use url::Url;

use adk_postgres_schema::quote::quote_ident as quote;

use crate::citus::{create_citus_database, workers_from_environment};
use crate::cluster::{Cluster, throwaway_cluster};
use crate::error::HarnessError;
use crate::source::{Search, Source, choose_source};
use crate::urls::{is_local, redacted, with_database};

const TEST_DB_PREFIX: &str = "adk_test_";
/// Serialises template builds across processes (nextest runs one per test).
const TEMPLATE_LOCK: i64 = 0x0061_646b_5f74_706c; // "adk_tpl"
/// How long dropping a database may hold up the test that drops it.
const DROP_TIMEOUT: Duration = Duration::from_secs(60);

/// UTC days yesterday … a week ahead, the window a test may write into.
/// Written against UTC, never the server's TimeZone.
const ENSURE_PARTITIONS: &str = "SELECT adk_ensure_event_partition(d::date) \
     FROM generate_series((now() AT TIME ZONE 'UTC')::date - 1, \
                          (now() AT TIME ZONE 'UTC')::date + 7, interval '1 day') d";

/// A database of its own for one test, dropped (`WITH (FORCE)`) when this
/// value is dropped.
#[derive(Debug)]
pub struct TestDatabase {
    name: String,
    url: String,
    server_url: String,
    cluster: Option<&'static Cluster>,
    /// The maintenance URLs of the Citus workers holding copies of it.
    worker_server_urls: Vec<String>,
}

impl TestDatabase {
    /// A URL usable by tokio-postgres and diesel-async.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The database's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A URL of the maintenance database of the same server, to look at the
    /// server from outside this database (`pg_database`, other databases).
    pub fn server_url(&self) -> &str {
        &self.server_url
    }

    /// The cluster the harness started itself, `None` for a server it was
    /// given (`ADK_PG_TEST_URL`, as under `cargo xtask test`, or a container).
    /// A test that restarts PostgreSQL needs one; under nextest start a
    /// private one with [`crate::start_throwaway_cluster`] and
    /// [`test_database_on`].
    pub fn cluster(&self) -> Option<&'static Cluster> {
        self.cluster
    }

    /// On Citus, the URLs of this database on each worker; empty on a
    /// single server.
    pub fn worker_urls(&self) -> Vec<String> {
        self.worker_server_urls.iter().filter_map(|server| with_database(server, &self.name).ok()).collect()
    }

    /// This database's URL over verified TLS: host `localhost` (the name the
    /// server certificate carries), `sslmode=verify-full` and `sslrootcert`
    /// the server's own `ssl_ca_file`, asked of the server so it works for
    /// any server the harness started, `ADK_PG_TEST_URL`'s included. An
    /// error when the server has TLS off or its CA file is not on this host.
    pub async fn tls_url(&self) -> Result<String, HarnessError> {
        let pg = Pg::connect(&self.server_url).await?;
        let row = pg.client.query_one("SELECT current_setting('ssl'), current_setting('ssl_ca_file')", &[]).await?;
        pg.close().await;
        let (ssl, ca_file): (String, String) = (row.get(0), row.get(1));
        if ssl != "on" {
            return Err(HarnessError::Setup(format!(
                "the server at {} has ssl = {ssl}: a TLS URL needs a server the harness started \
                 (its throwaway clusters have TLS on), or one with ssl and ssl_ca_file set",
                redacted(&self.server_url)
            )));
        }
        if ca_file.is_empty() || !Path::new(&ca_file).is_absolute() || !Path::new(&ca_file).is_file() {
            return Err(HarnessError::Setup(format!(
                "the server at {} has ssl on but its ssl_ca_file {ca_file:?} is not an absolute path of \
                 a file on this host, so the client cannot verify it",
                redacted(&self.server_url)
            )));
        }
        verified_tls_url(&self.url, &ca_file)
    }

    /// A tokio-postgres client of this database; its connection task runs on
    /// the current runtime. Panics when it cannot connect.
    pub async fn connect(&self) -> Client {
        crate::connect(&self.url).await.unwrap_or_else(|error| panic!("adk-postgres-testing: {error}"))
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        // Drop may run inside a runtime (the end of a #[tokio::test]) or
        // outside any, and a runtime cannot be started on a thread that is
        // already in one: the drop gets a thread and a runtime of its own.
        // The coordinator's copy first: it holds connections to the others.
        let servers: Vec<String> =
            std::iter::once(self.server_url.clone()).chain(self.worker_server_urls.iter().cloned()).collect();
        let name = self.name.clone();
        let (done, finished) = std::sync::mpsc::channel();
        let spawned = std::thread::Builder::new().name("adk-test-db-drop".into()).spawn(move || {
            let _ = done.send(servers.iter().try_for_each(|server_url| drop_database(server_url, &name)));
        });
        let outcome = match spawned {
            Ok(_) => finished.recv_timeout(DROP_TIMEOUT),
            Err(error) => Ok(Err(HarnessError::Setup(format!("spawning a thread: {error}")))),
        };
        // A panic here would abort a test that is already unwinding; a
        // leftover database is swept by a later run instead.
        match outcome {
            Ok(Ok(())) => {}
            Ok(Err(error)) => eprintln!("adk-postgres-testing: could not drop database {}: {error}", self.name),
            Err(_) => {
                eprintln!("adk-postgres-testing: dropping database {} did not finish in {DROP_TIMEOUT:?}", self.name)
            }
        }
    }
}

/// `url` on host `localhost`, with `sslmode=verify-full&sslrootcert=<ca_file>`
/// in place of whatever TLS parameters it had.
fn verified_tls_url(url: &str, ca_file: &str) -> Result<String, HarnessError> {
    let bad = |reason: String| HarnessError::BadUrl { url: redacted(url), reason };
    let mut parsed = Url::parse(url).map_err(|error| bad(error.to_string()))?;
    parsed.set_host(Some("localhost")).map_err(|error| bad(error.to_string()))?;
    // Raw pairs and our own escaping: libpq and the connect crate read `+`
    // as itself, not as the space form encoding would make it.
    let query = parsed.query().unwrap_or_default().to_owned();
    let kept = query.split('&').filter(|pair| {
        !pair.is_empty() && !matches!(pair.split('=').next(), Some("sslmode" | "sslrootcert" | "host" | "hostaddr"))
    });
    let ca_file: String = ca_file
        .bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' | b'/' => char::from(byte).to_string(),
            other => format!("%{other:02X}"),
        })
        .collect();
    let query: Vec<String> =
        kept.map(str::to_owned).chain(["sslmode=verify-full".to_owned(), format!("sslrootcert={ca_file}")]).collect();
    parsed.set_query(Some(&query.join("&")));
    Ok(parsed.into())
}

fn drop_database(server_url: &str, name: &str) -> Result<(), HarnessError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(HarnessError::io("building a runtime to drop a test database"))?;
    runtime.block_on(async {
        let sql = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", quote(name));
        let work = async {
            let pg = Pg::connect(server_url).await?;
            pg.client.batch_execute(&sql).await?;
            pg.close().await;
            Ok(())
        };
        tokio::time::timeout(DROP_TIMEOUT - Duration::from_secs(5), work)
            .await
            .map_err(|_| HarnessError::Setup("timed out".into()))?
    })
}

/// A freshly migrated database of its own, cloned from a template that is
/// migrated once per run, with event partitions for UTC days yesterday to a
/// week ahead.
///
/// The server is `ADK_PG_TEST_URL` when set, else a throwaway cluster this
/// process starts from local server binaries (else, with the `testcontainers`
/// feature, a container). Panics with a message saying what to install or set
/// when there is none.
pub async fn test_database() -> TestDatabase {
    let server = default_server().await;
    migrated_database(server).await
}

/// A database with no migrations applied (cloned from `template0`), for tests
/// of the migrations themselves.
pub async fn empty_database() -> TestDatabase {
    let server = default_server().await;
    create_database(server, None)
        .await
        .unwrap_or_else(|error| panic!("adk-postgres-testing: creating an empty database: {error}"))
}

/// [`test_database`] on a cluster of the caller's, such as a private
/// [`crate::start_throwaway_cluster`] for a test that restarts PostgreSQL.
pub async fn test_database_on(cluster: &'static Cluster) -> TestDatabase {
    let server = Server { url: cluster.server_url(), cluster: Some(cluster), workers: Vec::new() };
    migrated_database(&server).await
}

async fn migrated_database(server: &Server) -> TestDatabase {
    let template = template_for(server).await.unwrap_or_else(|error| panic!("adk-postgres-testing: {error}"));
    create_database(server, Some(&template))
        .await
        .unwrap_or_else(|error| panic!("adk-postgres-testing: creating a test database from {template}: {error}"))
}

#[derive(Debug)]
struct Server {
    /// The maintenance database's URL (on Citus, the coordinator's).
    url: String,
    cluster: Option<&'static Cluster>,
    /// On Citus, the workers' maintenance URLs ([`CITUS_WORKERS_VAR`]).
    workers: Vec<String>,
}

impl Server {
    /// Every node's maintenance URL, workers first: a database must exist
    /// on the workers before the coordinator's copy can reach them.
    fn nodes_workers_first(&self) -> impl Iterator<Item = &String> {
        self.workers.iter().chain(std::iter::once(&self.url))
    }
}

static DEFAULT_SERVER: OnceLock<Result<Server, String>> = OnceLock::new();
static THROWAWAY_CLUSTER: OnceLock<Cluster> = OnceLock::new();

/// The maintenance URL of the server [`test_database`] uses; panics as it
/// does when there is none.
pub(crate) async fn default_server_url() -> &'static str {
    &default_server().await.url
}

async fn default_server() -> &'static Server {
    let server = match DEFAULT_SERVER.get() {
        Some(server) => server,
        // Starting a cluster takes seconds of blocking work.
        None => tokio::task::spawn_blocking(|| {
            DEFAULT_SERVER.get_or_init(|| find_default_server().map_err(|error| error.to_string()))
        })
        .await
        .expect("adk-postgres-testing: finding PostgreSQL panicked"),
    };
    // The failure is kept, so every test says the same thing at once instead
    // of each trying to start a cluster again.
    server.as_ref().unwrap_or_else(|message| panic!("adk-postgres-testing: {message}"))
}

fn find_default_server() -> Result<Server, HarnessError> {
    match choose_source(&Search::from_environment()).map_err(HarnessError::NoPostgres)? {
        Source::Url(url) => {
            with_database(&url, "postgres")?;
            Ok(Server { url, cluster: None, workers: workers_from_environment() })
        }
        Source::Binaries(bin_dir) => {
            // Runs once: DEFAULT_SERVER is initialised at most once.
            let cluster = throwaway_cluster(&bin_dir)?;
            let cluster = THROWAWAY_CLUSTER.get_or_init(|| cluster);
            Ok(Server { url: cluster.server_url(), cluster: Some(cluster), workers: Vec::new() })
        }
        #[cfg(feature = "testcontainers")]
        Source::Container => Ok(Server { url: crate::container::start()?, cluster: None, workers: Vec::new() }),
        #[cfg(not(feature = "testcontainers"))]
        Source::Container => unreachable!("containers are chosen only with the testcontainers feature"),
    }
}

/// One template per server and process; the first test to ask builds or
/// finds it, the others wait.
async fn template_for(server: &Server) -> Result<String, String> {
    /// The template's name, or why it could not be made, once per server.
    type Template = Arc<OnceCell<Result<String, String>>>;
    static TEMPLATES: Mutex<BTreeMap<String, Template>> = Mutex::new(BTreeMap::new());
    let cell = TEMPLATES.lock().unwrap_or_else(PoisonError::into_inner).entry(server.url.clone()).or_default().clone();
    cell.get_or_init(|| async {
        build_template(server)
            .await
            .map_err(|error| format!("preparing the template database on {}: {error}", server.url))
    })
    .await
    .clone()
}

async fn build_template(server: &Server) -> Result<String, HarnessError> {
    // A cluster we started is new; a shared remote server's leftovers may
    // belong to live processes on other hosts.
    if server.cluster.is_none()
        && is_local(&server.url)
        && let Err(error) = sweep_leftovers(&server.url).await
    {
        eprintln!("adk-postgres-testing: sweeping leftover test databases: {error}");
    }

    let name = format!("adk_template_{:016x}", migrations_fingerprint());
    if !server.workers.is_empty() {
        return build_citus_template(server, &name).await;
    }
    let pg = Pg::connect(&server.url).await?;
    if is_template(&pg.client, &name).await? == Some(true) {
        pg.close().await;
        return Ok(name);
    }

    // Held on this session until unlocked or disconnected, so a build that
    // dies lets the next process in.
    pg.client.execute("SELECT pg_advisory_lock($1)", &[&TEMPLATE_LOCK]).await?;
    match is_template(&pg.client, &name).await? {
        Some(true) => {}
        // Renamed by a run that died before marking it: it is complete.
        Some(false) => mark_template(&pg.client, &name).await?,
        None => {
            let building = format!("{name}_building");
            pg.client.batch_execute(&format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", quote(&building))).await?;
            pg.client
                .batch_execute(&format!(
                    "CREATE DATABASE {} TEMPLATE template0 ENCODING 'UTF8' LOCALE 'C'",
                    quote(&building)
                ))
                .await?;
            let building_url = with_database(&server.url, &building)?;
            adk_postgres_schema::run_pending_migrations(&building_url).await?;
            ensure_partitions(&building_url).await?;
            // Only a complete template ever carries the final name.
            pg.client.batch_execute(&format!("ALTER DATABASE {} RENAME TO {}", quote(&building), quote(&name))).await?;
            mark_template(&pg.client, &name).await?;
        }
    }
    pg.client.execute("SELECT pg_advisory_unlock($1)", &[&TEMPLATE_LOCK]).await?;
    pg.close().await;
    Ok(name)
}

/// The template on every node of a Citus cluster, built under the same lock.
/// It is complete only when every node has it marked; anything less is
/// rebuilt everywhere.
async fn build_citus_template(server: &Server, name: &str) -> Result<String, HarnessError> {
    let coordinator = Pg::connect(&server.url).await?;
    coordinator.client.execute("SELECT pg_advisory_lock($1)", &[&TEMPLATE_LOCK]).await?;
    let mut complete = true;
    for node in server.nodes_workers_first() {
        let pg = Pg::connect(node).await?;
        complete &= is_template(&pg.client, name).await? == Some(true);
        pg.close().await;
    }
    if !complete {
        let building = format!("{name}_building");
        for node in server.nodes_workers_first() {
            let pg = Pg::connect(node).await?;
            for database in [name, building.as_str()] {
                pg.client
                    .batch_execute(&format!("ALTER DATABASE {} WITH IS_TEMPLATE false", quote(database)))
                    .await
                    .ok();
                pg.client.batch_execute(&format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", quote(database))).await?;
            }
            pg.close().await;
        }
        let building_url = create_citus_database(&server.url, &server.workers, &building).await?;
        let pg = Pg::connect(&building_url).await?;
        // Few shards: the tests make hundreds of databases, and each shard
        // is a table to copy. Read by the distribution step's connections.
        pg.client.batch_execute(&format!("ALTER DATABASE {} SET citus.shard_count = 4", quote(&building))).await?;
        pg.close().await;
        adk_postgres_schema::run_pending_migrations(&building_url).await?;
        ensure_partitions(&building_url).await?;
        for node in server.nodes_workers_first() {
            let pg = Pg::connect(node).await?;
            // Citus' maintenance daemon and the coordinator's cached
            // connections to the workers would keep the database busy.
            pg.client
                .execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()",
                    &[&building],
                )
                .await?;
            pg.client
                .batch_execute(&format!(
                    "ALTER DATABASE {} WITH ALLOW_CONNECTIONS false; ALTER DATABASE {} RENAME TO {}",
                    quote(&building),
                    quote(&building),
                    quote(name)
                ))
                .await?;
            mark_template(&pg.client, name).await?;
            pg.close().await;
        }
    }
    coordinator.client.execute("SELECT pg_advisory_unlock($1)", &[&TEMPLATE_LOCK]).await?;
    coordinator.close().await;
    Ok(name.to_owned())
}

async fn is_template(client: &Client, name: &str) -> Result<Option<bool>, HarnessError> {
    let row = client.query_opt("SELECT datistemplate FROM pg_database WHERE datname = $1", &[&name]).await?;
    Ok(row.map(|row| row.get(0)))
}

async fn mark_template(client: &Client, name: &str) -> Result<(), HarnessError> {
    client.batch_execute(&format!("ALTER DATABASE {} WITH IS_TEMPLATE true", quote(name))).await?;
    Ok(())
}

async fn create_database(server: &Server, template: Option<&str>) -> Result<TestDatabase, HarnessError> {
    let name = next_name();
    let sql = match template {
        Some(template) => format!("CREATE DATABASE {} TEMPLATE {} STRATEGY FILE_COPY", quote(&name), quote(template)),
        None => format!("CREATE DATABASE {} TEMPLATE template0 ENCODING 'UTF8' LOCALE 'C'", quote(&name)),
    };
    for node in server.nodes_workers_first() {
        let pg = Pg::connect(node).await?;
        if let Some(template) = template.filter(|_| !server.workers.is_empty()) {
            // A node's Citus daemon may linger on the template after a
            // restart; new ones cannot connect (ALLOW_CONNECTIONS false).
            pg.client
                .execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", &[&template])
                .await?;
        }
        pg.client.batch_execute(&sql).await?;
        pg.close().await;
    }
    if template.is_some() && !server.workers.is_empty() {
        let pg = Pg::connect(&server.url).await?;
        for (setting, value) in adk_postgres_schema::citus::DATABASE_SETTINGS {
            pg.client.batch_execute(&format!("ALTER DATABASE {} SET {setting} = '{value}'", quote(&name))).await?;
        }
        pg.close().await;
    }
    let database = TestDatabase {
        url: with_database(&server.url, &name)?,
        server_url: server.url.clone(),
        name,
        cluster: server.cluster,
        worker_server_urls: server.workers.clone(),
    };
    if template.is_some() {
        // A no-op unless the template was made on an earlier day.
        ensure_partitions(&database.url).await?;
    }
    Ok(database)
}

async fn ensure_partitions(url: &str) -> Result<(), HarnessError> {
    let pg = Pg::connect(url).await?;
    pg.client.batch_execute(ENSURE_PARTITIONS).await?;
    pg.close().await;
    Ok(())
}

/// Drops the databases of test processes on this host that are gone.
async fn sweep_leftovers(server_url: &str) -> Result<(), HarnessError> {
    if !Path::new("/proc/self").exists() {
        return Ok(()); // No way to tell live pids from dead ones.
    }
    let pg = Pg::connect(server_url).await?;
    let rows = pg.client.query("SELECT datname FROM pg_database WHERE NOT datistemplate", &[]).await?;
    for row in rows {
        let name: String = row.get(0);
        let Some(pid) = owner_pid(&name) else { continue };
        if Path::new("/proc").join(pid.to_string()).exists() {
            continue;
        }
        pg.client.batch_execute(&format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", quote(&name))).await?;
    }
    pg.close().await;
    Ok(())
}

/// `adk_test_<pid>_<counter>_<random>`: unique across threads, processes and
/// (by the random part) hosts sharing a server; the pid lets a later run
/// sweep what a crashed one left.
fn next_name() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    format!(
        "{TEST_DB_PREFIX}{}_{}_{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed),
        crate::short_random()
    )
}

/// The pid in a name made by [`next_name`]; `None` for any other name.
fn owner_pid(name: &str) -> Option<u32> {
    let mut parts = name.strip_prefix(TEST_DB_PREFIX)?.split('_');
    let pid = parts.next()?.parse().ok()?;
    parts.next()?.parse::<u64>().ok()?;
    let random = parts.next()?;
    let well_formed = parts.next().is_none() && !random.is_empty() && random.bytes().all(|b| b.is_ascii_hexdigit());
    well_formed.then_some(pid)
}

/// A stable fingerprint of the workspace migrations, so a changed migration
/// gets a new template instead of a stale one. FNV-1a: std's hasher may
/// change between Rust releases and processes of two builds share a server.
fn migrations_fingerprint() -> u64 {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../migrations");
    let mut files = Vec::new();
    collect_files(&root, &mut files);
    files.sort();
    let mut hash = Fnv1a::default();
    if files.is_empty() {
        // Outside the workspace the migrations are only inside the schema
        // crate; its version is the next best identity.
        hash.write(concat!("adk-postgres-schema@", env!("CARGO_PKG_VERSION")).as_bytes());
    }
    // The Citus step after the migrations shapes the template too.
    files.push(root.join("../crates/schema/src/citus.rs"));
    for file in files {
        hash.write(file.strip_prefix(&root).unwrap_or(&file).to_string_lossy().as_bytes());
        hash.write(&[0]);
        hash.write(&std::fs::read(&file).unwrap_or_default());
        hash.write(&[0]);
    }
    // And the functions installed after them, from the list they are
    // installed from (so a test build outside the workspace hashes them too).
    for file in adk_postgres_schema::replaceable::SQL_FILES {
        for body in std::iter::once(file.sql).chain(file.citus) {
            hash.write(file.name.as_bytes());
            hash.write(&[0]);
            hash.write(body.as_bytes());
            hash.write(&[0]);
        }
    }
    hash.0
}

fn collect_files(dir: &Path, files: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.filter_map(Result::ok) {
        let path = entry.path();
        if path.is_dir() {
            collect_files(&path, files);
        } else {
            files.push(path);
        }
    }
}

struct Fnv1a(u64);

impl Default for Fnv1a {
    fn default() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv1a {
    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 = (self.0 ^ u64::from(*byte)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

/// A short-lived connection. Tests run on a runtime each, so none outlives
/// the call that opened it: its task would die with the runtime it was
/// spawned on.
struct Pg {
    client: Client,
    connection: JoinHandle<()>,
}

impl Pg {
    async fn connect(url: &str) -> Result<Self, HarnessError> {
        let (client, connection) = crate::client::open(url).await?;
        let connection = tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(Self { client, connection })
    }

    /// Closes the session and waits until the socket is shut, so the server
    /// sees it gone before we rename or clone the database it was on.
    async fn close(self) {
        drop(self.client);
        let _ = self.connection.await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_the_pid_and_parse_back() {
        let name = next_name();
        assert!(name.len() < 64, "{name} is too long for PostgreSQL");
        assert_eq!(owner_pid(&name), Some(std::process::id()));
        assert_ne!(next_name(), next_name());
    }

    #[test]
    fn only_well_formed_test_names_are_swept() {
        assert_eq!(owner_pid("adk_test_4242_7_0a1b2c3d"), Some(4242));
        for name in [
            "postgres",
            "adk_template_0123456789abcdef",
            "adk_test_4242_7",
            "adk_test_4242_7_",
            "adk_test_x_7_0a1b",
            "adk_test_4242_x_0a1b",
            "adk_test_4242_7_zz",
            "adk_test_4242_7_0a1b_extra",
            "my_adk_test_4242_7_0a1b",
        ] {
            assert_eq!(owner_pid(name), None, "{name}");
        }
    }

    #[test]
    fn a_tls_url_verifies_localhost_against_the_servers_ca() {
        let url = verified_tls_url(
            "postgres://postgres@127.0.0.1:5432/adk_test_1_0_ab?sslmode=disable&application_name=x",
            "/tmp/adk pg+x/pki/ca.crt",
        )
        .unwrap();
        assert_eq!(
            url,
            "postgres://postgres@localhost:5432/adk_test_1_0_ab?application_name=x&sslmode=verify-full\
             &sslrootcert=/tmp/adk%20pg%2Bx/pki/ca.crt"
        );
    }

    #[test]
    fn identifiers_are_quoted() {
        assert_eq!(quote("adk_test_1_2_ab"), "\"adk_test_1_2_ab\"");
        assert_eq!(quote("we\"ird"), "\"we\"\"ird\"");
    }

    #[test]
    fn the_fingerprint_is_stable_and_sees_the_migrations() {
        assert_eq!(migrations_fingerprint(), migrations_fingerprint());
        let mut hash = Fnv1a::default();
        hash.write(b"a");
        assert_eq!(hash.0, 0xaf63_dc4c_8601_ec8c, "FNV-1a test vector");
    }
}
