//! `bench`: the benchmarks (crates/bench), built in release mode.
//!
//! Without `DATABASE_URL` the benchmark starts a throwaway cluster of its own
//! with durable settings; the table goes to stdout and the JSON report to
//! target/bench/. `adk-pg` is built first: the archive section runs it.

use std::process::ExitCode;

use anyhow::Context as _;

use crate::project::{cargo, exit_code, root};

pub fn run(args: &[String]) -> anyhow::Result<ExitCode> {
    // The archive section runs `adk-pg maintain` as a child, from the same
    // release build as the bench (it looks beside its own binary).
    let status = cargo()
        .args(["build", "--release", "--quiet", "--package", "adk-pg"])
        .status()
        .context("building adk-pg for the benchmarks")?;
    if !status.success() {
        return Ok(exit_code(status));
    }
    let status = cargo()
        .args(["run", "--release", "--quiet", "--package", "adk-postgres-bench", "--"])
        .arg("--out-dir")
        .arg(root().join("target/bench"))
        .args(args)
        .status()
        .context("running the benchmarks")?;
    Ok(exit_code(status))
}
