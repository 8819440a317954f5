//! `test`: the workspace tests against one throwaway cluster.
//!
//! nextest runs every test in a process of its own; each starting a cluster
//! would cost seconds per test, so one cluster is started here and handed to
//! all of them through ADK_PG_TEST_URL.

use std::process::{ExitCode, Stdio};

use adk_postgres_testing::{TEST_URL_VAR, start_throwaway_cluster};
use anyhow::Context as _;

use crate::project::{cargo, exit_code};

/// Enough cases to find edge cases in CI without making a run slow.
const DEFAULT_PROPTEST_CASES: &str = "256";

pub fn run(args: &[String]) -> anyhow::Result<ExitCode> {
    // Dropped (stopped and deleted) when this function returns, whatever the
    // tests did; a watchdog covers Ctrl-C.
    let mut cluster = None;
    let url = match std::env::var(TEST_URL_VAR) {
        Ok(url) if !url.trim().is_empty() => {
            eprintln!("xtask test: using the server in {TEST_URL_VAR}");
            url
        }
        _ => {
            let started =
                cluster.insert(start_throwaway_cluster().context("starting a PostgreSQL cluster for the tests")?);
            eprintln!("xtask test: PostgreSQL {} in {}", started.server_url(), started.dir().display());
            started.server_url()
        }
    };

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
    command.arg("--no-fail-fast").args(args).env(TEST_URL_VAR, &url);
    if std::env::var_os("PROPTEST_CASES").is_none() {
        command.env("PROPTEST_CASES", DEFAULT_PROPTEST_CASES);
    }
    let status = command.status().context("running the tests")?;
    drop(cluster);
    Ok(exit_code(status))
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
    fn package_selection_is_seen_before_the_separator_only() {
        assert!(selects_packages(&strings(&["-p", "x"])));
        assert!(selects_packages(&strings(&["--package=x"])));
        assert!(selects_packages(&strings(&["-px"])));
        assert!(!selects_packages(&strings(&["--", "-p"])));
        assert!(!selects_packages(&strings(&["harness"])));
    }
}
