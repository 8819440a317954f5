//! `demo`: builds and runs the demo (crates/demo) with `cargo run`.
//!
//! The demo binary itself starts a throwaway cluster when `DATABASE_URL` is
//! unset, so `cargo run -p adk-postgres-demo` works on its own too.
//!
//! The debug profile, on purpose: it shares its build with xtask's own, and
//! on a fresh checkout (2 cores) `cargo xtask demo` took 3.5 minutes in all
//! with it against almost 10 with `--release` (8 minutes of release
//! build), while the run itself takes about 4 s in debug and 2.5 s in release.

use std::process::ExitCode;

use anyhow::Context as _;

use crate::project::{cargo, exit_code};

pub fn run(args: &[String]) -> anyhow::Result<ExitCode> {
    let status = cargo()
        .args(["run", "--package", "adk-postgres-demo", "--"])
        .args(args)
        .status()
        .context("running the demo")?;
    Ok(exit_code(status))
}
