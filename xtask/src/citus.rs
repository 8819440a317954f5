//! `citus up|down|test|bench`: the store on a Citus cluster of a coordinator
//! and two workers on localhost.
//!
//! Citus is not packaged for Debian, so it is built from the source tarball
//! in `vendor/citus/` when the server lacks it: the build dependencies come
//! from apt, the server headers pinned to the installed server's exact
//! version (unpinned, apt would pick a newer minor and upgrade the server
//! with it).

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

use adk_postgres_testing::{
    CITUS_WORKERS_VAR, Cluster, ClusterConfig, TEST_URL_VAR, citus_installed, create_citus_database,
    find_server_binaries, free_port, start_throwaway_citus_cluster,
};
use anyhow::{Context as _, bail};

use crate::flags::Citus;
use crate::project::{self, cargo, exit_code};

const TARBALL: &str = "vendor/citus/citus-13.2.2-notests.tar.gz";
const TARBALL_SHA256: &str = "706bdca88e77323c8742d21105cd24a43dd9bae5aec11e3b6d7c0b31f53efed9";
const WORKERS: usize = 2;
/// The database `citus up` makes and migrates.
const DATABASE: &str = "adk";

/// The suites that must pass on Citus as on one server: the conformance
/// suite (as the owner and as bound service roles), the adk-rust contract
/// suite, the tenancy escape suite, maintenance and expiry, and the checks
/// of the Citus layout itself (delegation, fan-out, per-node status).
///
/// Left out, because the behaviour they pin does not exist on Citus: the
/// two tests of a `DETACH … CONCURRENTLY` stopped between its phases (Citus
/// detaches plainly, in one statement), and the conformance cases of media
/// stored apart from its event, which Citus refuses (the Citus suite pins
/// the refusal).
///
/// Selected from the whole workspace by the filter alone: naming packages
/// with `-p` unifies features over those packages only, which rebuilt a
/// second copy of most of the tree after `xtask test` had built it.
const SUITES: &[&str] = &[
    "--workspace",
    // The Citus suite is ignored on one server, which has no workers.
    "--run-ignored",
    "all",
    "-E",
    "((binary_id(adk-postgres-tests::store) & test(/^conformance::postgres::/)) \
     | (binary_id(adk-postgres-tests::tenancy) & test(/^(bound_roles|conformance_as_service_role|escape)::/)) \
     | (binary_id(adk-postgres-adk::adk) & test(/^contract::/)) \
     | binary_id(adk-postgres-tests::citus) \
     | (binary_id(adk-postgres-tests::operations) & test(/^(partition_maintenance|expiry)::/))) \
     - (binary_id(adk-postgres-tests::operations) & test(/^partition_maintenance::.*_phase_/)) \
     - test(/conformance.*::media_|_media_event_|_keep_media_/)",
];

pub fn run(action: Citus) -> anyhow::Result<ExitCode> {
    match action {
        Citus::Up => up(),
        Citus::Down => down(),
        Citus::Test { args } => test(&args),
        Citus::Bench { args } => bench(&args),
    }
}

/// Builds and installs Citus for the server in `bin_dir` unless it is there.
pub fn ensure_installed(bin_dir: &Path) -> anyhow::Result<()> {
    if citus_installed(bin_dir) {
        return Ok(());
    }
    eprintln!("xtask citus: Citus is not installed for {}; building it from {TARBALL}", bin_dir.display());
    let pg_config = bin_dir.join("pg_config");
    let major = bin_dir
        .parent()
        .and_then(Path::file_name)
        .and_then(|name| name.to_str())
        .context("the server binaries are not in a /usr/lib/postgresql/<major>/bin folder")?
        .to_owned();
    let server_package = format!("postgresql-{major}");
    let version = output(Command::new("dpkg-query").args(["-W", "-f=${Version}", &server_package]))
        .with_context(|| format!("reading the version of {server_package}"))?;
    let mut apt = Command::new("apt-get");
    apt.env("DEBIAN_FRONTEND", "noninteractive").args(["install", "-y", "-q", "--no-install-recommends"]).args([
        format!("postgresql-server-dev-{major}={version}"),
        "liblz4-dev".into(),
        "libzstd-dev".into(),
        "libkrb5-dev".into(),
        "make".into(),
        "gcc".into(),
    ]);
    if !status(&mut apt)? {
        status(Command::new("apt-get").args(["update", "-q"]))?;
        if !status(&mut apt)? {
            bail!("apt-get could not install Citus' build dependencies (run as root)");
        }
    }

    let root = project::root();
    let tarball = root.join(TARBALL);
    let sum = output(Command::new("sha256sum").arg(&tarball))?;
    if sum.split_whitespace().next() != Some(TARBALL_SHA256) {
        bail!("{} does not have the sha256 {TARBALL_SHA256}", tarball.display());
    }
    let build = root.join("target/citus-build");
    let _ = std::fs::remove_dir_all(&build);
    std::fs::create_dir_all(&build).with_context(|| format!("creating {}", build.display()))?;
    run_in(&build, Command::new("tar").arg("xzf").arg(&tarball).args(["--strip-components=1"]))?;
    run_in(
        &build,
        Command::new("./configure").arg("--without-libcurl").arg(format!("PG_CONFIG={}", pg_config.display())),
    )?;
    // No JIT bitcode: the tests do not need it, and it halves the build.
    run_in(&build, Command::new("make").args(["-j2", "with_llvm=no"]))?;
    run_in(&build, Command::new("make").args(["install", "with_llvm=no"]))?;
    if !citus_installed(bin_dir) {
        bail!("Citus was built but is still not found for {}", bin_dir.display());
    }
    Ok(())
}

fn dir() -> PathBuf {
    project::root().join("target/adk-pg-citus")
}

fn node_dirs() -> Vec<PathBuf> {
    let dir = dir();
    std::iter::once(dir.join("coordinator")).chain((1..=WORKERS).map(|n| dir.join(format!("worker{n}")))).collect()
}

/// Starts (making on first use) a coordinator and two workers in
/// target/adk-pg-citus/ and a migrated `adk` database on them.
fn up() -> anyhow::Result<ExitCode> {
    let bin_dir = find_server_binaries()?;
    ensure_installed(&bin_dir)?;
    let mut nodes = Vec::new();
    for node_dir in node_dirs() {
        let cluster = if node_dir.join("data/PG_VERSION").is_file() {
            Cluster::open(&node_dir)?
        } else {
            let config = ClusterConfig {
                bin_dir: bin_dir.clone(),
                dir: node_dir.clone(),
                port: free_port()?,
                durable: false,
                citus: true,
            };
            Cluster::init(&config).with_context(|| format!("initdb in {}", node_dir.display()))?
        };
        if !cluster.is_running() {
            cluster.start()?;
        }
        nodes.push(cluster);
    }
    let (coordinator, workers) = nodes.split_first().context("no nodes")?;
    let worker_urls: Vec<String> = workers.iter().map(Cluster::server_url).collect();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let url = runtime.block_on(async {
        let exists = {
            let client = adk_postgres_testing::connect(&coordinator.server_url()).await?;
            client.query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&DATABASE]).await?.is_some()
        };
        let url = if exists {
            coordinator.database_url(DATABASE)
        } else {
            create_citus_database(&coordinator.server_url(), &worker_urls, DATABASE).await?
        };
        for version in adk_postgres_schema::run_pending_migrations_on_citus(&url).await? {
            eprintln!("applied {version}");
        }
        anyhow::Ok(url)
    })?;
    eprintln!("coordinator {} and workers {}", coordinator.dir().display(), worker_urls.join(", "));
    println!("{url}");
    Ok(ExitCode::SUCCESS)
}

/// Stops the three nodes and deletes them.
fn down() -> anyhow::Result<ExitCode> {
    for node_dir in node_dirs() {
        if !node_dir.join("data/PG_VERSION").is_file() {
            continue;
        }
        let cluster = Cluster::open(&node_dir)?;
        if cluster.is_running() {
            cluster.stop_immediate()?;
        }
    }
    let dir = dir();
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("deleting {}", dir.display()))?;
        eprintln!("stopped and deleted {}", dir.display());
    } else {
        eprintln!("no Citus cluster in {}", dir.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// The suites on a throwaway Citus cluster; `args` go to nextest after them.
fn test(args: &[String]) -> anyhow::Result<ExitCode> {
    let bin_dir = find_server_binaries()?;
    ensure_installed(&bin_dir)?;
    let cluster = start_throwaway_citus_cluster(&bin_dir, WORKERS).context("starting the Citus nodes")?;
    eprintln!(
        "xtask citus test: coordinator {} and {} workers",
        cluster.coordinator().server_url(),
        cluster.workers().len()
    );
    let status = cargo()
        .args(["nextest", "run", "--no-fail-fast"])
        .args(SUITES)
        .args(args)
        .env(TEST_URL_VAR, cluster.coordinator().server_url())
        .env(CITUS_WORKERS_VAR, cluster.workers_var())
        .env("PROPTEST_CASES", std::env::var("PROPTEST_CASES").unwrap_or_else(|_| "64".into()))
        .status()
        .context("running the tests")?;
    drop(cluster);
    Ok(exit_code(status))
}

/// The bench's Citus comparison (crates/bench/src/citus.rs), in release
/// mode unless `--profile NAME` says otherwise. It starts its throwaway
/// Citus and single-server clusters itself, so they live exactly as long as
/// the measuring process and not through the build before it; `args` go to
/// the bench after `--citus`.
fn bench(args: &[String]) -> anyhow::Result<ExitCode> {
    let bin_dir = find_server_binaries()?;
    ensure_installed(&bin_dir)?;
    let (profile, args) = crate::bench::cargo_profile(args)?;
    let status = cargo()
        .args(["run", "--quiet", "--package", "adk-postgres-bench"])
        .args(profile)
        .args(["--", "--citus", "--out-dir"])
        .arg(project::root().join("target/bench"))
        .args(&args)
        .status()
        .context("running the Citus benchmark")?;
    Ok(exit_code(status))
}

fn status(command: &mut Command) -> anyhow::Result<bool> {
    Ok(command.stdin(Stdio::null()).status().with_context(|| format!("running {command:?}"))?.success())
}

fn output(command: &mut Command) -> anyhow::Result<String> {
    let output = command.stdin(Stdio::null()).output().with_context(|| format!("running {command:?}"))?;
    if !output.status.success() {
        bail!("{command:?} failed: {}", String::from_utf8_lossy(&output.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

fn run_in(dir: &Path, command: &mut Command) -> anyhow::Result<()> {
    let log = dir.join("build.log");
    let file = std::fs::OpenOptions::new().create(true).append(true).open(&log)?;
    let ok = command
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file)
        .status()
        .with_context(|| format!("running {command:?}"))?
        .success();
    if !ok {
        bail!("{command:?} failed; see {}", log.display());
    }
    Ok(())
}
