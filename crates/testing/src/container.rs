//! The last resort: PostgreSQL in a Docker container.

use std::ffi::OsStr;

use testcontainers::ImageExt as _;
use testcontainers::runners::SyncRunner as _;
use testcontainers_modules::postgres::Postgres;

use crate::cluster::{SERVER_TIMEZONE, spawn_watchdog};
use crate::error::HarnessError;

/// Starts a container with the settings of a throwaway cluster and returns
/// the URL of its maintenance database.
pub(crate) fn start() -> Result<String, HarnessError> {
    // The blocking runner drives a runtime of its own, which cannot start on
    // a thread that is inside a test's runtime.
    std::thread::spawn(start_here)
        .join()
        .map_err(|_| HarnessError::Setup("starting the PostgreSQL container panicked".into()))?
}

fn start_here() -> Result<String, HarnessError> {
    let timezone = format!("timezone={SERVER_TIMEZONE}");
    let log_timezone = format!("log_timezone={SERVER_TIMEZONE}");
    let settings = [
        "fsync=off",
        "synchronous_commit=off",
        "full_page_writes=off",
        "max_connections=300",
        "shared_preload_libraries=pg_stat_statements",
        &timezone,
        &log_timezone,
    ];
    let container = Postgres::default()
        .with_host_auth()
        .with_tag("15-alpine")
        .with_cmd(settings.iter().flat_map(|setting| ["-c", setting]))
        .start()?;
    // Its Drop needs a runtime and statics are never dropped anyway: the
    // watchdog removes the container once this process is gone.
    spawn_watchdog(r#"docker rm -f -v "$1" >/dev/null 2>&1"#, &[OsStr::new(container.id())])?;
    let url = format!("postgres://postgres@{}:{}/postgres", container.get_host()?, container.get_host_port_ipv4(5432)?);
    std::mem::forget(container);
    Ok(url)
}
