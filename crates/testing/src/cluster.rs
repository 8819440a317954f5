//! PostgreSQL clusters run from local server binaries: the throwaway ones the
//! tests use and the persistent one behind `cargo xtask db`.
//!
//! Every cluster lives in one folder: `data/` (PGDATA), `sock/` (its Unix
//! socket), `postgres.log` and a small `adk-cluster` file that lets
//! [`Cluster::open`] find the binaries and port again. Clients connect over
//! TCP on 127.0.0.1 as the trusted superuser `postgres`.
//!
//! Throwaway clusters also have TLS on, with a PKI made in their folder's
//! `pki/` ([`crate::TestPki`]), while pg_hba.conf still takes plaintext: the
//! tests of TLS can then ask any server the harness started for a verified
//! URL, and nothing else notices. A build without SSL (`ssl_library` empty)
//! gets no TLS, and the tests that need it skip
//! ([`crate::skip_without`]); only [`crate::start_throwaway_tls_cluster`]
//! refuses such a build ([`HarnessError::Lacks`]).

use std::ffi::OsStr;
use std::fmt::Write as _;
use std::io::Write as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::capability::Capability;
use crate::error::HarnessError;
use crate::source::{Search, no_postgres_message, pg_config, server_bin_dir};
use crate::tls::{ClusterTls, TestPki, TlsOptions};

/// The server's TimeZone and log_timezone: UTC+14, so any code that reads the
/// server's zone instead of saying UTC gets a different day and fails a test.
pub const SERVER_TIMEZONE: &str = "Pacific/Kiritimati";

const META_FILE: &str = "adk-cluster";
const SETTINGS_FILE: &str = "adk.conf";
const LOG_FILE: &str = "postgres.log";
/// Unix socket paths are limited to 107 bytes; past this the cluster goes
/// without a socket rather than failing to start.
const MAX_SOCKET_DIR_LEN: usize = 90;
/// Attempts at a free port: another process may take the one we picked
/// between our probe and the server's bind.
const START_ATTEMPTS: usize = 5;

/// How [`Cluster::init`] sets up a new cluster.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// The folder holding `initdb`, `pg_ctl` and `postgres`.
    pub bin_dir: PathBuf,
    /// The cluster's folder; created if missing, must not hold a cluster yet.
    pub dir: PathBuf,
    /// The TCP port on 127.0.0.1.
    pub port: u16,
    /// Keep fsync, full-page writes and synchronous commit on. Throwaway test
    /// clusters turn them off: nothing in them must survive a crash.
    pub durable: bool,
    /// Load the Citus extension (`shared_preload_libraries`), for a node of
    /// a [`crate::CitusCluster`].
    pub citus: bool,
}

/// A PostgreSQL cluster in a folder of its own.
///
/// A throwaway cluster (from [`start_throwaway_cluster`]) is stopped and its
/// folder removed when the value is dropped, and by a watchdog process when
/// ours exits without dropping it (statics, panics, Ctrl-C). Other clusters
/// keep running and keep their data.
#[derive(Debug)]
pub struct Cluster {
    bin_dir: PathBuf,
    dir: PathBuf,
    data_dir: PathBuf,
    port: u16,
    durable: bool,
    citus: bool,
    /// initdb refuses to run as root, so as root every server command runs
    /// as the `postgres` OS user.
    as_postgres: bool,
    throwaway: bool,
    tls: Option<ClusterTls>,
    /// Written after every other setting, so they win (a primary's
    /// replication settings, say).
    settings: Vec<(&'static str, String)>,
}

/// What a throwaway cluster gets beyond what [`ClusterConfig`] says.
#[derive(Debug, Clone, Default)]
pub(crate) struct Extras {
    /// TLS with a fresh PKI in the cluster's `pki/` folder, when the build
    /// has SSL.
    pub(crate) tls: Option<TlsOptions>,
    /// A build without SSL is an error ([`HarnessError::Lacks`]) rather
    /// than a cluster without TLS.
    pub(crate) tls_required: bool,
    pub(crate) settings: Vec<(&'static str, String)>,
}

/// Finds local server binaries the way the test harness does:
/// [`crate::SERVER_BIN_DIR_VAR`]'s folder, else `pg_config --bindir`, else the
/// newest `/usr/lib/postgresql/*/bin`.
pub fn find_server_binaries() -> Result<PathBuf, HarnessError> {
    let search = Search::from_environment();
    server_bin_dir(&search)
        .map_err(HarnessError::NoPostgres)?
        .ok_or_else(|| HarnessError::NoPostgres(no_postgres_message(&search.versioned_root)))
}

/// Starts a fast, non-durable cluster in a fresh temporary folder on a free
/// port, with the same settings the test harness uses.
///
/// It is gone when the returned value is dropped or, failing that, within a
/// second of this process exiting.
pub fn start_throwaway_cluster() -> Result<Cluster, HarnessError> {
    throwaway_cluster(&find_server_binaries()?)
}

/// [`start_throwaway_cluster`] from the server binaries in `bin_dir`.
pub fn start_throwaway_cluster_from(bin_dir: &Path) -> Result<Cluster, HarnessError> {
    throwaway_cluster(bin_dir)
}

/// The version of the server binaries in `bin_dir` (`postgres --version`,
/// e.g. `18.6` or `15.14`), to compare with a running server's
/// [`Cluster::server_version`].
pub fn server_binaries_version(bin_dir: &Path) -> Result<String, HarnessError> {
    let mut command = Command::new(bin_dir.join("postgres"));
    command.arg("--version");
    let out = run(command)?;
    version_of_postgres(&out)
        .map(str::to_owned)
        .ok_or_else(|| HarnessError::Setup(format!("{}/postgres --version said {out:?}", bin_dir.display())))
}

/// `postgres (PostgreSQL) 15.14 (Debian 15.14-0+deb12u1)` → `15.14`.
fn version_of_postgres(out: &str) -> Option<&str> {
    out.split_once("(PostgreSQL)")?.1.split_whitespace().next()
}

pub(crate) fn throwaway_cluster(bin_dir: &Path) -> Result<Cluster, HarnessError> {
    throwaway_node(bin_dir, false)
}

/// A throwaway cluster, loading Citus when `citus` is set. Every node gets a
/// valid PKI of its own: a Citus node without one makes itself a
/// self-signed X.509 v1 certificate, which a verifying client cannot use,
/// and the tests connect to the coordinator over verify-full too. (Citus'
/// connections between nodes use `sslmode=require`, which checks no CA.)
pub(crate) fn throwaway_node(bin_dir: &Path, citus: bool) -> Result<Cluster, HarnessError> {
    let extras = Extras { tls: Some(TlsOptions::default()), ..Extras::default() };
    throwaway_node_with(bin_dir, citus, extras).map(|(cluster, _)| cluster)
}

/// A throwaway cluster with `extras`, started; its PKI when it has TLS.
pub(crate) fn throwaway_node_with(
    bin_dir: &Path,
    citus: bool,
    extras: Extras,
) -> Result<(Cluster, Option<TestPki>), HarnessError> {
    let config = ClusterConfig {
        bin_dir: bin_dir.to_path_buf(),
        dir: throwaway_dir("test"),
        port: free_port()?,
        durable: false,
        citus,
    };
    let mut cluster = Cluster::prepare(&config, true)?;
    cluster.settings = extras.settings;
    cluster.initdb()?;
    let pki = match &extras.tls {
        Some(options) if cluster.build_has_ssl()? => {
            let pki = TestPki::generate(&cluster.dir.join("pki"), &options.extra_names)?;
            cluster.tls = Some(ClusterTls::new(&pki, options));
            Some(pki)
        }
        Some(_) if extras.tls_required => {
            return Err(HarnessError::Lacks { capability: Capability::Tls, bin_dir: bin_dir.to_path_buf() });
        }
        Some(_) | None => None,
    };
    cluster.configure()?;
    cluster.start_on_a_free_port()?;
    Ok((cluster, pki))
}

/// A fresh folder name for a throwaway cluster or pooler. The system temp
/// dir rather than target/: its paths are short enough for a Unix socket,
/// and the `postgres` user can reach it even when the checkout sits in
/// root's home.
pub(crate) fn throwaway_dir(what: &str) -> PathBuf {
    std::env::temp_dir().join(format!("adk-pg-{what}-{}-{}", std::process::id(), crate::short_random()))
}

impl Cluster {
    /// Creates a cluster with `initdb` and writes its settings; does not start it.
    pub fn init(config: &ClusterConfig) -> Result<Self, HarnessError> {
        Self::create(config, false)
    }

    /// Opens a cluster that [`Cluster::init`] made earlier in `dir`.
    pub fn open(dir: &Path) -> Result<Self, HarnessError> {
        let meta_path = dir.join(META_FILE);
        let meta = std::fs::read_to_string(&meta_path)
            .map_err(HarnessError::io(format!("reading {}", meta_path.display())))?;
        let field = |key: &str| {
            meta.lines()
                .find_map(|line| line.strip_prefix(key)?.strip_prefix('='))
                .ok_or_else(|| HarnessError::Setup(format!("{} has no `{key}=` line", meta_path.display())))
        };
        let port = field("port")?
            .parse()
            .map_err(|_| HarnessError::Setup(format!("{} has a bad port", meta_path.display())))?;
        Ok(Self {
            bin_dir: PathBuf::from(field("bin_dir")?),
            dir: dir.to_path_buf(),
            data_dir: dir.join("data"),
            port,
            durable: field("durable")? == "true",
            citus: meta.lines().any(|line| line == "citus=true"),
            as_postgres: running_as_root(),
            throwaway: false,
            tls: None,
            settings: Vec::new(),
        })
    }

    fn create(config: &ClusterConfig, throwaway: bool) -> Result<Self, HarnessError> {
        let cluster = Self::prepare(config, throwaway)?;
        cluster.initialize()?;
        Ok(cluster)
    }

    /// The folder, its watchdog and the checks that need no data directory.
    fn prepare(config: &ClusterConfig, throwaway: bool) -> Result<Self, HarnessError> {
        let as_postgres = running_as_root();
        if as_postgres && !command_succeeds(Command::new("id").args(["-u", "postgres"])) {
            return Err(HarnessError::Setup(
                "running as root, and initdb refuses root, but there is no `postgres` OS user \
                 to run the cluster as; install the `postgresql` package (it creates one) or run \
                 the tests as an ordinary user"
                    .into(),
            ));
        }
        let dir = &config.dir;
        if dir.join("data").exists() {
            return Err(HarnessError::Setup(format!("{} already holds a cluster", dir.display())));
        }
        std::fs::create_dir_all(dir.join("sock")).map_err(HarnessError::io(format!("creating {}", dir.display())))?;
        let cluster = Self {
            bin_dir: config.bin_dir.clone(),
            dir: dir.clone(),
            data_dir: dir.join("data"),
            port: config.port,
            durable: config.durable,
            citus: config.citus,
            as_postgres,
            throwaway,
            tls: None,
            settings: Vec::new(),
        };
        if throwaway {
            // Before initdb, so that even a half-made cluster folder goes away.
            cluster.spawn_watchdog()?;
        }
        cluster.chown()?;
        if as_postgres
            && !command_succeeds(Command::new("runuser").args(["-u", "postgres", "--", "test", "-w"]).arg(dir))
        {
            return Err(HarnessError::Setup(format!(
                "the `postgres` OS user cannot write to {}: a parent folder is closed to it; \
                 put the cluster somewhere else",
                dir.display()
            )));
        }
        if as_postgres
            && !command_succeeds(
                Command::new("runuser")
                    .args(["-u", "postgres", "--", "test", "-x"])
                    .arg(cluster.bin_dir.join("postgres")),
            )
        {
            return Err(HarnessError::Setup(format!(
                "the `postgres` OS user cannot run {}/postgres: the file or a parent folder is \
                 closed to it (a server installed under root's home, say); install it where \
                 `postgres` can reach it",
                cluster.bin_dir.display()
            )));
        }
        Ok(cluster)
    }

    /// initdb, our settings and pg_hba.conf, everything given to `postgres`.
    fn initialize(&self) -> Result<(), HarnessError> {
        self.initdb()?;
        self.configure()
    }

    fn initdb(&self) -> Result<(), HarnessError> {
        let mut initdb = self.server_command("initdb");
        initdb.arg("-D").arg(&self.data_dir).args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C"]);
        if !self.durable {
            initdb.arg("--no-sync");
        }
        run(initdb).map(drop)
    }

    /// Whether the server was built with SSL: its `ssl_library`, asked of
    /// the binary (`postgres -C`) on the data directory initdb made.
    fn build_has_ssl(&self) -> Result<bool, HarnessError> {
        let mut postgres = self.server_command("postgres");
        postgres.args(["-C", "ssl_library", "-D"]).arg(&self.data_dir);
        Ok(!run(postgres)?.trim().is_empty())
    }

    /// Our settings and pg_hba.conf on a data directory initdb made,
    /// everything given to `postgres`.
    fn configure(&self) -> Result<(), HarnessError> {
        self.write_settings()?;
        if let Some(hba) = self.tls.as_ref().and_then(ClusterTls::hba) {
            write_file(&self.data_dir.join("pg_hba.conf"), &hba)?;
        }
        let conf = self.data_dir.join("postgresql.conf");
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&conf)
            .map_err(HarnessError::io(format!("opening {}", conf.display())))?;
        writeln!(file, "\n# adk-postgres-testing: its settings win over the ones above\ninclude '{SETTINGS_FILE}'")
            .map_err(HarnessError::io(format!("writing {}", conf.display())))?;
        self.chown()
    }

    /// A throwaway streaming standby of `primary`, made by `pg_basebackup -R
    /// -X stream` on a replication slot named `application_name` (so the
    /// primary keeps the WAL it has not had), with the primary's settings
    /// but its own port, its own copy of the primary's PKI and `settings`.
    /// Not started.
    pub(crate) fn base_backup_of(
        primary: &Cluster,
        application_name: &str,
        settings: Vec<(&'static str, String)>,
    ) -> Result<Self, HarnessError> {
        let config = ClusterConfig {
            bin_dir: primary.bin_dir.clone(),
            dir: throwaway_dir("standby"),
            port: free_port()?,
            durable: primary.durable,
            citus: primary.citus,
        };
        let mut standby = Self::prepare(&config, true)?;
        standby.settings = settings;
        if let Some(tls) = &primary.tls {
            let pki = standby.dir.join("pki");
            std::fs::create_dir_all(&pki).map_err(HarnessError::io(format!("creating {}", pki.display())))?;
            let copy = |file: &Path| -> Result<PathBuf, HarnessError> {
                let to = pki.join(file.file_name().unwrap_or(file.as_os_str()));
                std::fs::copy(file, &to).map_err(HarnessError::io(format!("copying {}", file.display())))?;
                Ok(to)
            };
            standby.tls = Some(ClusterTls {
                cert_file: copy(&tls.cert_file)?,
                key_file: copy(&tls.key_file)?,
                ca_file: copy(&tls.ca_file)?,
                ..tls.clone()
            });
        }
        standby.chown()?;
        let mut backup = standby.server_command("pg_basebackup");
        backup
            .arg("-D")
            .arg(&standby.data_dir)
            .arg("-d")
            .arg(format!("host=127.0.0.1 port={} user=postgres application_name={application_name}", primary.port))
            .args(["-R", "-X", "stream", "-C", "-S", application_name, "-c", "fast"]);
        if !standby.durable {
            backup.arg("--no-sync");
        }
        run(backup)?;
        // The backup brought the primary's adk.conf (its port) along.
        standby.write_settings()?;
        standby.chown()?;
        Ok(standby)
    }

    /// The folder holding `initdb`, `pg_ctl`, `postgres`, `psql`, `pgbench`….
    pub fn bin_dir(&self) -> &Path {
        &self.bin_dir
    }

    /// The cluster's folder (data directory, socket, log).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// PGDATA.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The server log `pg_ctl` writes to.
    pub fn log_file(&self) -> PathBuf {
        self.dir.join(LOG_FILE)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The CA file (`ssl_ca_file`) when the harness gave this cluster TLS
    /// (never on a build without SSL).
    pub fn ca_file(&self) -> Option<&Path> {
        self.tls.as_ref().map(|tls| tls.ca_file.as_path())
    }

    /// A URL of the maintenance database `postgres`.
    pub fn server_url(&self) -> String {
        self.database_url("postgres")
    }

    /// A URL of database `name` on this cluster.
    pub fn database_url(&self, name: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{name}", self.port)
    }

    pub fn is_running(&self) -> bool {
        self.data_dir.is_dir() && command_succeeds(self.pg_ctl("status").stdout(Stdio::null()).stderr(Stdio::null()))
    }

    /// The running server's version (`SHOW server_version`'s first word,
    /// e.g. `18.6`), as [`server_binaries_version`] gives it.
    pub fn server_version(&self) -> Result<String, HarnessError> {
        let shown = self.query_value("SHOW server_version")?;
        shown
            .split_whitespace()
            .next()
            .map(str::to_owned)
            .ok_or_else(|| HarnessError::Setup(format!("SHOW server_version said {shown:?}")))
    }

    /// Starts the server and waits until it accepts connections.
    pub fn start(&self) -> Result<(), HarnessError> {
        let mut command = self.pg_ctl("start");
        command.args(["-w", "-t", "60", "-l"]).arg(self.log_file());
        // Its own process group: a Ctrl-C in the terminal reaches the tests,
        // and the cluster is then shut down by whoever owns it, not mid-test.
        command.process_group(0);
        run(command).map(drop).map_err(|error| match error {
            HarnessError::Command { .. } => HarnessError::StartFailed {
                log: self.log_file(),
                tail: log_tail(&self.log_file()).unwrap_or_else(|| error.to_string()),
            },
            other => other,
        })
    }

    /// Stops the server after it has ended its sessions (`-m fast`).
    pub fn stop(&self) -> Result<(), HarnessError> {
        run(self.pg_ctl_stop("fast")).map(drop)
    }

    /// Stops the server with `-m immediate`: no shutdown checkpoint, crash
    /// recovery at the next start.
    pub fn stop_immediate(&self) -> Result<(), HarnessError> {
        run(self.pg_ctl_stop("immediate")).map(drop)
    }

    /// Restarts the server with `pg_ctl restart -m fast`: every session is
    /// ended, the port stays.
    pub fn restart_fast(&self) -> Result<(), HarnessError> {
        let mut command = self.pg_ctl("restart");
        command.args(["-m", "fast", "-w", "-t", "60", "-l"]).arg(self.log_file());
        command.process_group(0);
        run(command).map(drop)
    }

    /// `pg_ctl promote -w`: a standby ends recovery and takes writes.
    pub(crate) fn promote(&self) -> Result<(), HarnessError> {
        let mut command = self.pg_ctl("promote");
        command.args(["-w", "-t", "60"]);
        run(command).map(drop)
    }

    /// The one value `sql` returns, through psql on the maintenance
    /// database: callable with or without a tokio runtime around.
    pub(crate) fn query_value(&self, sql: &str) -> Result<String, HarnessError> {
        let port = self.port.to_string();
        let mut psql = self.server_command("psql");
        psql.args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p", &port]);
        psql.args(["-U", "postgres", "-d", "postgres", "-c", sql]);
        run(psql).map(|out| out.trim().to_owned())
    }

    /// Starts the server, moving to another free port when one taken
    /// between our probe and the server's bind was the reason it failed.
    pub(crate) fn start_on_a_free_port(&mut self) -> Result<(), HarnessError> {
        let mut attempt = 1;
        loop {
            match self.start() {
                Err(HarnessError::StartFailed { tail, .. })
                    if attempt < START_ATTEMPTS && tail.contains("could not bind") =>
                {
                    self.set_port(free_port()?)?;
                    attempt += 1;
                }
                outcome => return outcome,
            }
        }
    }

    fn pg_ctl(&self, action: &str) -> Command {
        let mut command = self.server_command("pg_ctl");
        command.arg(action).arg("-D").arg(&self.data_dir).arg("-s");
        command
    }

    fn pg_ctl_stop(&self, mode: &str) -> Command {
        let mut command = self.pg_ctl("stop");
        command.args(["-w", "-t", "60", "-m", mode]);
        command
    }

    /// A server program, run as `postgres` when we are root. Its working
    /// directory is the cluster folder because `postgres` may not be allowed
    /// into ours.
    fn server_command(&self, program: &str) -> Command {
        let path = self.bin_dir.join(program);
        let mut command = if self.as_postgres {
            let mut command = Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(path);
            command
        } else {
            Command::new(path)
        };
        command.current_dir(&self.dir).stdin(Stdio::null());
        command
    }

    fn set_port(&mut self, port: u16) -> Result<(), HarnessError> {
        self.port = port;
        self.write_settings()
    }

    fn write_settings(&self) -> Result<(), HarnessError> {
        let sharedir = pg_config("--sharedir", Some(&self.bin_dir));
        let stat_statements =
            sharedir.is_some_and(|dir| Path::new(&dir).join("extension/pg_stat_statements.control").is_file());
        let socket_dir = self.dir.join("sock");
        let socket_dir = socket_dir.to_str().filter(|dir| dir.len() <= MAX_SOCKET_DIR_LEN).unwrap_or("");

        let port = self.port.to_string();
        // Citus must come first; it runs a maintenance daemon per database,
        // and the tests make many databases at once.
        let preload = match (self.citus, stat_statements) {
            (true, true) => "citus,pg_stat_statements",
            (true, false) => "citus",
            (false, true) => "pg_stat_statements",
            (false, false) => "",
        };
        let mut settings = vec![
            ("listen_addresses", "127.0.0.1"),
            ("port", &port),
            ("unix_socket_directories", socket_dir),
            ("max_connections", "300"),
            ("timezone", SERVER_TIMEZONE),
            ("log_timezone", SERVER_TIMEZONE),
        ];
        if !preload.is_empty() {
            settings.push(("shared_preload_libraries", preload));
        }
        if self.citus {
            settings.push(("max_worker_processes", "128"));
        }
        if !self.durable {
            settings.extend([("fsync", "off"), ("synchronous_commit", "off"), ("full_page_writes", "off")]);
        }
        let tls_files = self
            .tls
            .as_ref()
            .map(|tls| [&tls.cert_file, &tls.key_file, &tls.ca_file].map(|file| file.to_string_lossy().into_owned()));
        if let Some([cert, key, ca]) = &tls_files {
            settings.extend([
                ("ssl", "on"),
                ("ssl_cert_file", cert.as_str()),
                ("ssl_key_file", key),
                ("ssl_ca_file", ca),
            ]);
        }
        settings.extend(self.settings.iter().map(|(name, value)| (*name, value.as_str())));
        let settings = settings.iter().fold(
            String::from("# Written by adk-postgres-testing; rewritten when the port changes.\n"),
            |mut text, (name, value)| {
                let _ = writeln!(text, "{name} = '{}'", value.replace('\'', "''"));
                text
            },
        );
        write_file(&self.data_dir.join(SETTINGS_FILE), &settings)?;
        let meta = format!(
            "port={}\nbin_dir={}\ndurable={}\ncitus={}\n",
            self.port,
            self.bin_dir.display(),
            self.durable,
            self.citus
        );
        write_file(&self.dir.join(META_FILE), &meta)
    }

    fn chown(&self) -> Result<(), HarnessError> {
        if self.as_postgres {
            run({
                let mut command = Command::new("chown");
                command.args(["-R", "postgres:"]).arg(&self.dir);
                command
            })?;
        }
        Ok(())
    }

    /// A detached process that outlives us by at most half a second: once
    /// our pid is gone it stops the server and removes the folder. Statics
    /// are never dropped and a panic or Ctrl-C skips destructors, so this is
    /// what really ends a test cluster.
    fn spawn_watchdog(&self) -> Result<(), HarnessError> {
        let runuser = if self.as_postgres { "runuser -u postgres -- " } else { "" };
        let cleanup = format!(r#"{runuser}"$1" stop -D "$2" -m immediate -s >/dev/null 2>&1; rm -rf "$3""#);
        spawn_watchdog(
            &cleanup,
            &[self.bin_dir.join("pg_ctl").as_os_str(), self.data_dir.as_os_str(), self.dir.as_os_str()],
        )
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if !self.throwaway {
            return;
        }
        if self.is_running()
            && let Err(error) = self.stop_immediate()
        {
            eprintln!("adk-postgres-testing: stopping the cluster in {}: {error}", self.dir.display());
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs `sh -c cleanup cleanup-name args…` once this process has exited.
///
/// The watcher is started through a shell that backgrounds it and exits at
/// once, so it is never our child (no zombie, nothing to wait for), it ignores
/// the terminal's SIGINT and SIGHUP, and it holds none of our output pipes, so
/// test runners do not wait for it.
pub(crate) fn spawn_watchdog(cleanup: &str, args: &[&OsStr]) -> Result<(), HarnessError> {
    const LAUNCHER: &str = r#"(
    trap '' INT HUP
    pid=$1; shift
    while kill -0 "$pid" 2>/dev/null; do sleep 0.5; done
    exec sh -c "$@"
) </dev/null >/dev/null 2>&1 &"#;
    let mut command = Command::new("sh");
    command
        .arg("-c")
        .arg(LAUNCHER)
        .arg("adk-pg-watchdog")
        .arg(std::process::id().to_string())
        .arg(cleanup)
        .arg("adk-pg-cleanup")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0);
    run(command).map(drop)
}

/// A TCP port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> Result<u16, HarnessError> {
    let listener =
        std::net::TcpListener::bind(("127.0.0.1", 0)).map_err(HarnessError::io("finding a free TCP port"))?;
    let port = listener.local_addr().map_err(HarnessError::io("finding a free TCP port"))?.port();
    Ok(port)
}

/// Whether nothing listens on `port` of 127.0.0.1 right now.
pub fn port_is_free(port: u16) -> bool {
    std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
}

/// Whether the effective user is root, from /proc (no libc, no unsafe).
pub(crate) fn running_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status").ok().and_then(|status| effective_uid(&status)).map_or_else(
        || {
            Command::new("id")
                .arg("-u")
                .output()
                .is_ok_and(|output| String::from_utf8_lossy(&output.stdout).trim() == "0")
        },
        |uid| uid == 0,
    )
}

/// The second field of the `Uid:` line (real, effective, saved, filesystem).
fn effective_uid(status: &str) -> Option<u32> {
    status.lines().find_map(|line| line.strip_prefix("Uid:"))?.split_whitespace().nth(1)?.parse().ok()
}

fn write_file(path: &Path, contents: &str) -> Result<(), HarnessError> {
    std::fs::write(path, contents).map_err(HarnessError::io(format!("writing {}", path.display())))
}

pub(crate) fn log_tail(path: &Path) -> Option<String> {
    let log = std::fs::read_to_string(path).ok()?;
    let lines: Vec<&str> = log.lines().collect();
    Some(lines[lines.len().saturating_sub(30)..].join("\n"))
}

fn command_succeeds(command: &mut Command) -> bool {
    command.stdin(Stdio::null()).output().is_ok_and(|output| output.status.success())
}

/// Runs a command to completion; its stdout on success, everything it said on
/// failure.
pub(crate) fn run(mut command: Command) -> Result<String, HarnessError> {
    let described = describe(&command);
    let output = command.stdin(Stdio::null()).output().map_err(HarnessError::io(format!("running `{described}`")))?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    if output.status.success() {
        Ok(stdout)
    } else {
        Err(HarnessError::Command {
            command: described,
            status: output.status.to_string(),
            output: format!("{stdout}{}", String::from_utf8_lossy(&output.stderr)),
        })
    }
}

fn describe(command: &Command) -> String {
    std::iter::once(command.get_program())
        .chain(command.get_args())
        .map(OsStr::to_string_lossy)
        .collect::<Vec<_>>()
        .join(" ")
}

/// psql, as us, on a libpq connection string: what a test of the fixtures
/// checks a server's answer (or refusal) with.
#[cfg(test)]
pub(crate) fn psql(bin_dir: &Path, conninfo: &str, sql: &str) -> Result<String, HarnessError> {
    let mut psql = Command::new(bin_dir.join("psql"));
    psql.args(["-X", "-q", "-A", "-t", "-d", conninfo, "-c", sql]).env("PGCONNECT_TIMEOUT", "10");
    run(psql).map(|out| out.trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_is_the_word_after_postgresql() {
        assert_eq!(version_of_postgres("postgres (PostgreSQL) 18.6\n"), Some("18.6"));
        assert_eq!(version_of_postgres("postgres (PostgreSQL) 15.14 (Debian 15.14-0+deb12u1)\n"), Some("15.14"));
        assert_eq!(version_of_postgres("postgres 18"), None);
    }

    #[test]
    fn the_effective_uid_is_the_second_field() {
        let status = "Name:\tx\nUmask:\t0022\nUid:\t1000\t0\t0\t0\nGid:\t5\t5\t5\t5\n";
        assert_eq!(effective_uid(status), Some(0));
        assert_eq!(effective_uid("Name:\tx\n"), None);
    }
}
