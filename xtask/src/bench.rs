//! `bench`: the benchmarks (crates/bench), built in release mode.
//!
//! Without `DATABASE_URL` the benchmark starts a throwaway cluster of its own
//! with durable settings; the table goes to stdout and the JSON report to
//! target/bench/. `adk-pg` is built first: the archive section runs it.
//! `--allocator mimalloc` builds the bench with mimalloc as its global
//! allocator (`--allocator system`, the default, without).

use std::process::ExitCode;

use anyhow::{Context as _, bail};

use crate::project::{cargo, exit_code, root};

pub fn run(args: &[String]) -> anyhow::Result<ExitCode> {
    let (features, args) = allocator_features(args)?;
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
        .args(["run", "--release", "--quiet", "--package", "adk-postgres-bench"])
        .args(features)
        .arg("--")
        .arg("--out-dir")
        .arg(root().join("target/bench"))
        .args(args)
        .status()
        .context("running the benchmarks")?;
    Ok(exit_code(status))
}

/// Cargo's arguments for the allocator `--allocator NAME` (or
/// `--allocator=NAME`) asks for, and `args` without it: the allocator is
/// chosen when the bench is built, so the bench itself never sees the flag.
fn allocator_features(args: &[String]) -> anyhow::Result<(Vec<String>, Vec<String>)> {
    let mut allocator = None;
    let mut rest = Vec::new();
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let value = if arg == "--allocator" {
            args.next().context("--allocator needs a value: system or mimalloc")?
        } else if let Some(value) = arg.strip_prefix("--allocator=") {
            value
        } else {
            rest.push(arg.clone());
            continue;
        };
        allocator = Some(value.to_owned());
    }
    let features = match allocator.as_deref() {
        None | Some("system") => Vec::new(),
        Some("mimalloc") => vec!["--features".to_owned(), "adk-postgres-bench/mimalloc".to_owned()],
        Some(other) => bail!("unknown allocator {other:?}: system or mimalloc"),
    };
    Ok((features, rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(args: &str) -> anyhow::Result<(Vec<String>, Vec<String>)> {
        allocator_features(&args.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
    }

    #[test]
    fn the_allocator_becomes_a_feature_and_leaves_the_benchs_arguments() {
        let mimalloc = vec!["--features".to_owned(), "adk-postgres-bench/mimalloc".to_owned()];
        assert_eq!(split("--reads --quick").unwrap(), (vec![], vec!["--reads".into(), "--quick".into()]));
        assert_eq!(split("--reads --allocator mimalloc --quick").unwrap().0, mimalloc);
        assert_eq!(split("--reads --allocator mimalloc --quick").unwrap().1, ["--reads", "--quick"]);
        assert_eq!(split("--allocator=mimalloc").unwrap(), (mimalloc, vec![]));
        assert_eq!(split("--quick --allocator system").unwrap(), (vec![], vec!["--quick".into()]));
        assert!(split("--allocator").is_err());
        assert!(split("--allocator jemalloc").is_err());
        assert_eq!(split("--allocators").unwrap().1, ["--allocators"]);
    }
}
