//! `ci`: everything CI checks, in the order that fails cheapest first.

use std::process::ExitCode;
use std::time::Instant;

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
    // semver-checks); before the benchmarks and tests, since a missing file
    // in a package fails in its first minute.
    ("the release dry run", &["xtask", "release", "--dry-run"]),
    // A smoke run of the benchmarks (reduced workload); it asserts nothing
    // about timing, only that every workload runs. Built with the dev
    // profile: the tests need those dependencies built anyway, while a
    // release build of the whole tree cost CI about ten minutes for nothing
    // else (the debug build's run takes under two minutes longer).
    ("the benchmark smoke test", &["xtask", "bench", "--quick", "--profile", "dev"]),
];

pub fn run() -> anyhow::Result<ExitCode> {
    // The tests go last so that the test runner's summary closes the log.
    let total = CHECKS.len() + 1;
    for (step, (title, args)) in CHECKS.iter().enumerate() {
        header(step + 1, total, title, &args.join(" "));
        let began = Instant::now();
        let status = cargo().args(*args).status()?;
        took(title, began);
        if !status.success() {
            eprintln!("\nci: {title} failed");
            return Ok(exit_code(status));
        }
    }
    header(
        total,
        total,
        "tests",
        "xtask test, xtask citus test and citus bench --quick, then xtask test on PostgreSQL 18",
    );
    let began = Instant::now();
    let run = test::run(&[], None)?;
    took("tests", began);
    if run.code != ExitCode::SUCCESS {
        eprintln!("\nci: tests failed");
        return Ok(run.code);
    }
    // The default server (Debian's on CI) has every option the tests use;
    // a test ending early there means the harness lost one, not the build.
    if !run.skipped.is_empty() {
        eprintln!("\nci: {} tests ended early on the default server, which must run them all", run.skipped.len());
        return Ok(ExitCode::FAILURE);
    }
    // The same store on a coordinator and two workers; Citus is built from
    // vendor/citus/ on a machine without it.
    let began = Instant::now();
    let code = citus::run(Citus::Test { args: Vec::new() })?;
    took("the Citus tests", began);
    if code != ExitCode::SUCCESS {
        eprintln!("\nci: the Citus tests failed");
        return Ok(code);
    }
    // A smoke run of the Citus comparison, on the dev build the benchmark
    // smoke test made: every workload runs, nothing is timed.
    let began = Instant::now();
    let code = citus::run(Citus::Bench { args: ["--quick", "--profile", "dev"].map(String::from).to_vec() })?;
    took("the Citus benchmark smoke test", began);
    if code != ExitCode::SUCCESS {
        eprintln!("\nci: the Citus benchmark smoke test failed");
        return Ok(code);
    }
    // Last, so its summary closes the log.
    let began = Instant::now();
    let code = test::run_on_postgres_18()?;
    took("the tests on PostgreSQL 18", began);
    Ok(code)
}

/// CI has a time limit, and every step adds to it: each says what it cost,
/// so the log shows where the minutes go.
fn took(title: &str, began: Instant) {
    eprintln!("==> {title}: {:.0} s", began.elapsed().as_secs_f64());
}

fn header(step: usize, total: usize, title: &str, command: &str) {
    eprintln!("\n==> [{step}/{total}] {title}: cargo {command}");
}
