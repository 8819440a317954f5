//! `bench`: the benchmarks (crates/bench), built in release mode.
//!
//! `--profile NAME` builds them with another cargo profile: CI's smoke run
//! uses `dev`, whose dependencies the test build compiles anyway, instead of
//! a release build of the whole tree that nothing else uses (its figures
//! are then not measurements; the bench says so).
//! Without `DATABASE_URL` the benchmark starts a throwaway cluster of its own
//! with durable settings; the table goes to stdout and the JSON report to
//! target/bench/. `adk-pg` is built first: the archive section runs it.
//! `--allocator mimalloc` builds the bench with mimalloc as its global
//! allocator (`--allocator system`, the default, without).

use std::process::ExitCode;

use anyhow::{Context as _, bail};

use crate::flags::take_flag;
use crate::project::{cargo, exit_code, root};

pub fn run(args: &[String]) -> anyhow::Result<ExitCode> {
    let (profile, args) = cargo_profile(args)?;
    let (features, args) = allocator_features(&args)?;
    // The archive section runs `adk-pg maintain` as a child, from the same
    // build as the bench (it looks beside its own binary).
    let status = cargo()
        .args(["build", "--quiet", "--package", "adk-pg"])
        .args(&profile)
        .status()
        .context("building adk-pg for the benchmarks")?;
    if !status.success() {
        return Ok(exit_code(status));
    }
    let status = cargo()
        .args(["run", "--quiet", "--package", "adk-postgres-bench"])
        .args(&profile)
        .args(features)
        .arg("--")
        .arg("--out-dir")
        .arg(root().join("target/bench"))
        .args(args)
        .status()
        .context("running the benchmarks")?;
    Ok(exit_code(status))
}

/// Cargo's arguments for the profile `--profile NAME` (or `--profile=NAME`)
/// asks for, `release` without it, and `args` without the flag.
pub fn cargo_profile(args: &[String]) -> anyhow::Result<(Vec<String>, Vec<String>)> {
    let (profiles, rest) = take_flag("--profile", "a cargo profile: release or dev", args)?;
    let profile = profiles.last().map_or("release", String::as_str);
    if profile.is_empty() || profile.starts_with('-') {
        bail!("--profile needs a cargo profile (release or dev), not {profile:?}");
    }
    Ok((vec!["--profile".to_owned(), profile.to_owned()], rest))
}

/// Cargo's arguments for the allocator `--allocator NAME` (or
/// `--allocator=NAME`) asks for, and `args` without it: the allocator is
/// chosen when the bench is built, so the bench itself never sees the flag.
fn allocator_features(args: &[String]) -> anyhow::Result<(Vec<String>, Vec<String>)> {
    let (allocators, rest) = take_flag("--allocator", "a value: system or mimalloc", args)?;
    let features = match allocators.last().map(String::as_str) {
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

    fn profile(args: &str) -> anyhow::Result<(Vec<String>, Vec<String>)> {
        cargo_profile(&args.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
    }

    #[test]
    fn the_profile_is_release_unless_named_and_leaves_the_benchs_arguments() {
        assert_eq!(profile("--quick").unwrap(), (vec!["--profile".into(), "release".into()], vec!["--quick".into()]));
        assert_eq!(
            profile("--quick --profile dev").unwrap(),
            (vec!["--profile".into(), "dev".into()], vec!["--quick".into()])
        );
        assert_eq!(profile("--profile=dev --reads").unwrap().0, ["--profile", "dev"]);
        assert_eq!(profile("--profile=dev --reads").unwrap().1, ["--reads"]);
        assert!(profile("--profile").is_err());
        assert!(profile("--profile --quick").is_err());
        assert!(profile("--profile=").is_err());
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
