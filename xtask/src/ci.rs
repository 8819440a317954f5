//! `ci`: everything CI checks, in the order that fails cheapest first.

use std::process::ExitCode;

use crate::citus;
use crate::flags::Citus;
use crate::project::{cargo, exit_code};
use crate::test;

const CHECKS: &[(&str, &[&str])] = &[
    ("formatting", &["fmt", "--all", "--", "--check"]),
    ("clippy", &["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"]),
    // Cannot run without Docker, so it must at least keep compiling.
    ("the testcontainers build", &["check", "-p", "adk-postgres-testing", "--features", "testcontainers"]),
    // The published crates packaged and checked from their packaged sources,
    // then their API against the last release (about 9 minutes, most of it
    // semver-checks); before the release build of the benchmarks, since a
    // missing file in a package fails in its first two minutes.
    ("the release dry run", &["xtask", "release", "--dry-run"]),
    // A smoke run of the benchmarks (release build, reduced workload); it
    // asserts nothing about timing, only that every workload runs.
    ("the benchmark smoke test", &["xtask", "bench", "--quick"]),
];

pub fn run() -> anyhow::Result<ExitCode> {
    // The tests go last so that the test runner's summary closes the log.
    let total = CHECKS.len() + 1;
    for (step, (title, args)) in CHECKS.iter().enumerate() {
        header(step + 1, total, title, &args.join(" "));
        let status = cargo().args(*args).status()?;
        if !status.success() {
            eprintln!("\nci: {title} failed");
            return Ok(exit_code(status));
        }
    }
    header(total, total, "tests", "xtask test, then xtask citus test and citus bench --quick");
    let code = test::run(&[])?;
    if code != ExitCode::SUCCESS {
        eprintln!("\nci: tests failed");
        return Ok(code);
    }
    // The same store on a coordinator and two workers; Citus is built from
    // vendor/citus/ on a machine without it.
    let code = citus::run(Citus::Test { args: Vec::new() })?;
    if code != ExitCode::SUCCESS {
        eprintln!("\nci: the Citus tests failed");
        return Ok(code);
    }
    // A smoke run of the Citus comparison, on the release build the
    // benchmark smoke test made: every workload runs, nothing is timed.
    let code = citus::run(Citus::Bench { args: vec!["--quick".into()] })?;
    if code != ExitCode::SUCCESS {
        eprintln!("\nci: the Citus benchmark smoke test failed");
    }
    Ok(code)
}

fn header(step: usize, total: usize, title: &str, command: &str) {
    eprintln!("\n==> [{step}/{total}] {title}: cargo {command}");
}
