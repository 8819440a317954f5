//! Where the project is and how to run cargo on it.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, ExitStatus};

/// The workspace root, from where this crate sits in it.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask/ sits in the workspace root").to_path_buf()
}

/// The cargo that runs us (`$CARGO`), so a `+toolchain` choice carries over.
///
/// Without the variables `cargo run` gave this process: build scripts (ring's,
/// aws-lc-sys') ask to rerun when `CARGO_PKG_NAME` or `CARGO_MANIFEST_DIR`
/// changes, and cargo compares the values in its own environment, so a cargo
/// started with xtask's values rebuilt every crate above them that a plain
/// `cargo build` had built, and the other way round (ten minutes here).
pub fn cargo() -> Command {
    let mut command = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    command.current_dir(root());
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(set_by_cargo_run) {
            command.env_remove(name);
        }
    }
    command
}

/// The variables cargo sets for the program `cargo run` starts, which say
/// which package that program is; `CARGO` itself stays (see [`cargo`]).
fn set_by_cargo_run(name: &str) -> bool {
    name.starts_with("CARGO_PKG_")
        || matches!(
            name,
            "CARGO_MANIFEST_DIR"
                | "CARGO_MANIFEST_PATH"
                | "CARGO_MANIFEST_LINKS"
                | "CARGO_CRATE_NAME"
                | "CARGO_BIN_NAME"
                | "CARGO_PRIMARY_PACKAGE"
        )
}

/// Our exit code for a child's status; a child killed by a signal is a failure.
pub fn exit_code(status: ExitStatus) -> ExitCode {
    match status.code() {
        Some(0) => ExitCode::SUCCESS,
        Some(code) => ExitCode::from(u8::try_from(code).unwrap_or(1).max(1)),
        None => ExitCode::FAILURE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cargo_is_started_without_the_package_variables_cargo_run_set() {
        // The test runner sets them for this process, as `cargo run` does
        // for xtask.
        assert!(std::env::var_os("CARGO_PKG_NAME").is_some() && std::env::var_os("CARGO_MANIFEST_DIR").is_some());
        let command = cargo();
        let removed: Vec<_> =
            command.get_envs().filter(|(_, value)| value.is_none()).filter_map(|(name, _)| name.to_str()).collect();
        assert!(removed.contains(&"CARGO_PKG_NAME"), "{removed:?}");
        assert!(removed.contains(&"CARGO_MANIFEST_DIR"), "{removed:?}");
        assert!(!removed.contains(&"CARGO"), "{removed:?}");
        assert!(set_by_cargo_run("CARGO_PKG_VERSION_MAJOR"));
        assert!(!set_by_cargo_run("CARGO_TARGET_DIR") && !set_by_cargo_run("CARGO_HOME"));
    }
}
