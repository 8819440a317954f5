//! Where the project is and how to run cargo on it.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, ExitStatus};

/// The workspace root, from where this crate sits in it.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask/ sits in the workspace root").to_path_buf()
}

/// The cargo that runs us (`$CARGO`), so a `+toolchain` choice carries over.
pub fn cargo() -> Command {
    let mut command = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    command.current_dir(root());
    command
}

/// Our exit code for a child's status; a child killed by a signal is a failure.
pub fn exit_code(status: ExitStatus) -> ExitCode {
    match status.code() {
        Some(0) => ExitCode::SUCCESS,
        Some(code) => ExitCode::from(u8::try_from(code).unwrap_or(1).max(1)),
        None => ExitCode::FAILURE,
    }
}
