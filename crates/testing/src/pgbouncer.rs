//! PgBouncer in front of a cluster, for the tests of the store behind a
//! transaction pooler (the deployment that breaks session state: prepared
//! statements, `SET`, advisory locks, `LISTEN`).
//!
//! It is Debian's `pgbouncer` binary, run as a child of the test process on
//! a free port with a configuration of its own in a throwaway folder; a
//! watchdog ends it if this process dies without dropping the value, like a
//! throwaway cluster's.

use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::cluster::{Cluster, free_port, log_tail, run, running_as_root, spawn_watchdog, throwaway_dir};
use crate::error::HarnessError;

const BINARY: &str = "pgbouncer";
/// Where Debian's package puts it; `/usr/sbin` is not on a user's PATH.
const DEBIAN_PATH: &str = "/usr/sbin/pgbouncer";
const READY_TIMEOUT: Duration = Duration::from_secs(15);
const START_ATTEMPTS: usize = 5;

/// PgBouncer's `pool_mode`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum PoolMode {
    Session,
    /// A server connection per transaction: what the store must survive.
    #[default]
    Transaction,
    Statement,
}

impl PoolMode {
    fn as_str(self) -> &'static str {
        match self {
            Self::Session => "session",
            Self::Transaction => "transaction",
            Self::Statement => "statement",
        }
    }
}

/// How [`PgBouncer::start`] configures the pooler.
#[derive(Debug, Clone)]
pub struct PgBouncerConfig {
    /// The server's port on 127.0.0.1; every database name is passed through
    /// (`* = host=127.0.0.1 port=…`), so per-test databases need no entry.
    pub server_port: u16,
    pub pool_mode: PoolMode,
    pub default_pool_size: u32,
    /// The users the pooler lets in (`auth_type = trust`, so no passwords),
    /// also allowed its admin console (database `pgbouncer`: `SHOW POOLS`);
    /// the server must trust them too.
    pub users: Vec<String>,
    /// Startup parameters the pooler accepts and drops instead of refusing
    /// the client (PgBouncer's `ignore_startup_parameters`).
    pub ignore_startup_parameters: Vec<String>,
}

impl PgBouncerConfig {
    /// Transaction pooling, 4 server connections per database and user, and
    /// the superuser `postgres` the harness's URLs ([`Cluster::server_url`]) use.
    pub fn new(server_port: u16) -> Self {
        Self {
            server_port,
            pool_mode: PoolMode::Transaction,
            default_pool_size: 4,
            users: vec!["postgres".to_owned()],
            ignore_startup_parameters: Vec::new(),
        }
    }

    /// [`PgBouncerConfig::new`] in front of `cluster`.
    pub fn for_cluster(cluster: &Cluster) -> Self {
        Self::new(cluster.port())
    }
}

/// A running PgBouncer; stopped and its folder removed when dropped.
#[derive(Debug)]
pub struct PgBouncer {
    child: Child,
    dir: PathBuf,
    port: u16,
}

impl PgBouncer {
    /// Starts PgBouncer on a free port of 127.0.0.1 and waits until it takes
    /// TCP connections. An error naming the package when it is not installed.
    pub fn start(config: &PgBouncerConfig) -> Result<Self, HarnessError> {
        let binary = find_binary()?;
        let as_postgres = running_as_root();
        let dir = throwaway_dir("bouncer");
        std::fs::create_dir_all(&dir).map_err(HarnessError::io(format!("creating {}", dir.display())))?;
        // Before anything runs, so that even a failed start leaves no folder.
        spawn_watchdog(r#"rm -rf "$1""#, &[dir.as_os_str()])?;
        write_auth_file(&dir, &config.users)?;
        let mut attempt = 1;
        loop {
            let port = free_port()?;
            write_config(&dir, port, config)?;
            if as_postgres {
                // PgBouncer refuses root; with -u it drops to `postgres`,
                // which must be able to write its log and pidfile here.
                let mut chown = Command::new("chown");
                chown.args(["-R", "postgres:"]).arg(&dir);
                run(chown)?;
            }
            let mut command = Command::new(&binary);
            if as_postgres {
                command.args(["-u", "postgres"]);
            }
            let stderr = std::fs::File::create(dir.join("stderr.log"))
                .map_err(HarnessError::io(format!("creating {}", dir.join("stderr.log").display())))?;
            command
                .arg(dir.join("pgbouncer.ini"))
                .current_dir(&dir)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(stderr)
                // A Ctrl-C in the terminal is for the tests, not for it.
                .process_group(0);
            let mut child = command.spawn().map_err(HarnessError::io(format!("starting {}", binary.display())))?;
            // Dropping the value kills it; this covers a process that dies
            // without dropping it. The command line is checked first, so a
            // pid reused after a normal drop is left alone.
            spawn_watchdog(
                r#"grep -qaF "$2" "/proc/$1/cmdline" 2>/dev/null && kill -9 "$1"; rm -rf "$2""#,
                &[child.id().to_string().as_ref(), dir.as_os_str()],
            )?;
            match wait_until_ready(&mut child, port, &dir) {
                Ok(()) => return Ok(Self { child, dir, port }),
                Err(error) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    if attempt < START_ATTEMPTS && tails(&dir).contains("Address already in use") {
                        attempt += 1;
                        continue;
                    }
                    let _ = std::fs::remove_dir_all(&dir);
                    return Err(error);
                }
            }
        }
    }

    /// The port it listens on, on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// A URL of `database` through the pooler as `user` (one of the
    /// configured users).
    pub fn url_for(&self, database: &str, user: &str) -> String {
        format!("postgres://{user}@127.0.0.1:{}/{database}", self.port)
    }

    /// The last lines of its log, for a failure message.
    pub fn log_tail(&self) -> String {
        tails(&self.dir)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        // SIGKILL: it keeps nothing worth a clean shutdown, and its server
        // connections are closed by the kernel either way.
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn wait_until_ready(child: &mut Child, port: u16, dir: &Path) -> Result<(), HarnessError> {
    let failed = |what: String| HarnessError::Setup(format!("PgBouncer {what}; in {}:\n{}", dir.display(), tails(dir)));
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(failed(format!("exited ({status})")));
        }
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(failed(format!("did not listen on port {port} within {READY_TIMEOUT:?}")));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Its log's last lines, else what it said on stderr before it had a log
/// (a bad configuration). It writes every line to both.
fn tails(dir: &Path) -> String {
    ["pgbouncer.log", "stderr.log"]
        .iter()
        .find_map(|file| log_tail(&dir.join(file)).filter(|text| !text.trim().is_empty()))
        .unwrap_or_default()
}

fn find_binary() -> Result<PathBuf, HarnessError> {
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .map(|dir| dir.join(BINARY));
    on_path.chain([PathBuf::from(DEBIAN_PATH)]).find(|path| path.is_file()).ok_or_else(|| {
        HarnessError::Setup(format!(
            "PgBouncer is not installed (no `{BINARY}` on PATH or at {DEBIAN_PATH}); \
             Debian/Ubuntu: `apt-get install pgbouncer`"
        ))
    })
}

fn write_config(dir: &Path, port: u16, config: &PgBouncerConfig) -> Result<(), HarnessError> {
    let ini = format!(
        "; Written by adk-postgres-testing.\n\
         [databases]\n\
         * = host=127.0.0.1 port={server_port}\n\
         \n\
         [pgbouncer]\n\
         listen_addr = 127.0.0.1\n\
         listen_port = {port}\n\
         unix_socket_dir =\n\
         auth_type = trust\n\
         auth_file = {auth}\n\
         admin_users = {admins}\n\
         pool_mode = {pool_mode}\n\
         default_pool_size = {pool_size}\n\
         max_client_conn = 2000\n\
         ignore_startup_parameters = {ignore}\n\
         logfile = {log}\n\
         pidfile = {pid}\n",
        server_port = config.server_port,
        auth = dir.join("users.txt").display(),
        admins = config.users.join(","),
        pool_mode = config.pool_mode.as_str(),
        pool_size = config.default_pool_size,
        ignore = config.ignore_startup_parameters.join(","),
        log = dir.join("pgbouncer.log").display(),
        pid = dir.join("pgbouncer.pid").display(),
    );
    let path = dir.join("pgbouncer.ini");
    std::fs::write(&path, ini).map_err(HarnessError::io(format!("writing {}", path.display())))
}

/// `"user" ""` lines: trust needs the name listed, not a password.
fn write_auth_file(dir: &Path, users: &[String]) -> Result<(), HarnessError> {
    let text: String = users.iter().map(|user| format!("\"{}\" \"\"\n", user.replace('"', "\"\""))).collect();
    let path = dir.join("users.txt");
    std::fs::write(&path, text).map_err(HarnessError::io(format!("writing {}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::psql;

    #[test]
    fn a_transaction_pooler_passes_every_database_through() {
        let cluster = crate::start_throwaway_cluster().unwrap();
        let bouncer = PgBouncer::start(&PgBouncerConfig::for_cluster(&cluster)).unwrap();
        let bin = cluster.bin_dir();
        let plain = |url: String| format!("{url}?sslmode=disable");
        assert_eq!(psql(bin, &plain(bouncer.url_for("postgres", "postgres")), "SELECT 1").unwrap(), "1");
        // Made after the pooler started: the wildcard entry covers it.
        psql(bin, &cluster.server_url(), "CREATE DATABASE later").unwrap();
        let later = psql(bin, &plain(bouncer.url_for("later", "postgres")), "SELECT current_database()");
        assert_eq!(later.unwrap(), "later");
        let pools = psql(bin, &plain(bouncer.url_for("pgbouncer", "postgres")), "SHOW CONFIG").unwrap();
        assert!(pools.lines().any(|line| line.starts_with("pool_mode|transaction")), "{pools}");
        let stranger = psql(bin, &plain(bouncer.url_for("postgres", "stranger")), "SELECT 1");
        assert!(stranger.is_err(), "a user not in the auth file got in");

        let dir = bouncer.dir().to_path_buf();
        drop(bouncer);
        assert!(!dir.exists());
    }
}
