//! Where the tests' PostgreSQL comes from.
//!
//! The decision is a function of what was found (environment variables, the
//! answer of `pg_config`, the folders under a versioned install root) so it can
//! be tested without touching the machine; [`Search::from_environment`] is the
//! only part that looks around.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Names the server the harness creates its databases on.
pub const TEST_URL_VAR: &str = "ADK_PG_TEST_URL";

/// Names the folder of server binaries (`initdb`, `pg_ctl`, `postgres`, …)
/// the harness starts its clusters from, ahead of `pg_config` and
/// `/usr/lib/postgresql`: how the tests run on another PostgreSQL version
/// (`cargo xtask test --server-bin-dir DIR` sets it). An absolute path; a
/// folder without `initdb` is an error, never a fall back to another server.
pub const SERVER_BIN_DIR_VAR: &str = "ADK_PG_SERVER_BIN_DIR";

/// Debian and Ubuntu put each major version's server binaries here.
pub(crate) const VERSIONED_ROOT: &str = "/usr/lib/postgresql";

/// Where the tests get PostgreSQL from, in order of preference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Source {
    /// A running server named by [`TEST_URL_VAR`].
    Url(String),
    /// Local server binaries: the harness starts a throwaway cluster.
    Binaries(PathBuf),
    /// A container started through testcontainers (feature `testcontainers`).
    #[cfg_attr(not(feature = "testcontainers"), allow(dead_code))]
    Container,
}

/// What the search for PostgreSQL found; built from the environment in real
/// runs and by hand in tests.
#[derive(Debug, Clone)]
pub(crate) struct Search {
    pub(crate) env_url: Option<String>,
    /// [`SERVER_BIN_DIR_VAR`], when set.
    pub(crate) env_bin_dir: Option<PathBuf>,
    /// `pg_config --bindir`, when `pg_config` is installed.
    pub(crate) pg_config_bindir: Option<PathBuf>,
    /// A folder of `<version>/bin` installs, `/usr/lib/postgresql` on Debian.
    pub(crate) versioned_root: PathBuf,
    /// Whether this build can start containers.
    pub(crate) containers: bool,
}

impl Search {
    pub(crate) fn from_environment() -> Self {
        Self {
            env_url: std::env::var(TEST_URL_VAR).ok(),
            env_bin_dir: std::env::var_os(SERVER_BIN_DIR_VAR).map(PathBuf::from),
            pg_config_bindir: pg_config("--bindir", None).map(PathBuf::from),
            versioned_root: PathBuf::from(VERSIONED_ROOT),
            containers: cfg!(feature = "testcontainers"),
        }
    }
}

/// Picks the source: the URL first, then local binaries (those
/// [`SERVER_BIN_DIR_VAR`] names first), then a container.
///
/// The error is the whole message to show a developer who has none of them,
/// or whose [`SERVER_BIN_DIR_VAR`] names no server.
pub(crate) fn choose_source(search: &Search) -> Result<Source, String> {
    if let Some(url) = search.env_url.as_deref().map(str::trim)
        && !url.is_empty()
    {
        return Ok(Source::Url(url.to_owned()));
    }
    if let Some(bin_dir) = server_bin_dir(search)? {
        return Ok(Source::Binaries(bin_dir));
    }
    if search.containers {
        return Ok(Source::Container);
    }
    Err(no_postgres_message(&search.versioned_root))
}

pub(crate) fn no_postgres_message(versioned_root: &Path) -> String {
    format!(
        "no PostgreSQL found for the tests. Either install the server binaries \
         (Debian/Ubuntu: `apt-get install postgresql-15`, or `postgresql` for the \
         distribution's default version; the harness looks for initdb in \
         {SERVER_BIN_DIR_VAR}, via `pg_config --bindir` and in {}/<version>/bin), \
         or set {TEST_URL_VAR} to a \
         server the tests may create databases on, e.g. \
         {TEST_URL_VAR}=postgres://postgres@127.0.0.1:5432/postgres \
         (or build adk-postgres-testing with the `testcontainers` feature to use Docker)",
        versioned_root.display()
    )
}

/// The server binaries to start clusters from: [`SERVER_BIN_DIR_VAR`]'s
/// folder when it is set (an error when it holds no `initdb`), else
/// [`find_bin_dir`]'s answer.
pub(crate) fn server_bin_dir(search: &Search) -> Result<Option<PathBuf>, String> {
    let Some(dir) = search.env_bin_dir.as_deref().filter(|dir| !dir.as_os_str().is_empty()) else {
        return Ok(find_bin_dir(search.pg_config_bindir.as_deref(), &search.versioned_root));
    };
    if !dir.is_absolute() {
        return Err(format!(
            "{SERVER_BIN_DIR_VAR} is {}, a relative path; it must be absolute (each test runs in its \
             own crate's folder)",
            dir.display()
        ));
    }
    if !dir.join("initdb").is_file() {
        return Err(format!(
            "{SERVER_BIN_DIR_VAR} is {}, which has no initdb: it must name a folder of PostgreSQL \
             server binaries (initdb, pg_ctl, postgres), such as /usr/lib/postgresql/15/bin",
            dir.display()
        ));
    }
    Ok(Some(dir.to_path_buf()))
}

/// The folder holding `initdb`, `pg_ctl` and `postgres`: `pg_config`'s answer
/// when it has `initdb` (client-only installs have a `pg_config` without a
/// server), else the newest version under `versioned_root`.
pub(crate) fn find_bin_dir(pg_config_bindir: Option<&Path>, versioned_root: &Path) -> Option<PathBuf> {
    if let Some(dir) = pg_config_bindir
        && dir.join("initdb").is_file()
    {
        return Some(dir.to_path_buf());
    }
    let entries = std::fs::read_dir(versioned_root).ok()?;
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let version = parse_version(entry.file_name().to_str()?)?;
            let bin = entry.path().join("bin");
            bin.join("initdb").is_file().then_some((version, bin))
        })
        .max()
        .map(|(_, bin)| bin)
}

/// "15" → (15, 0), "9.6" → (9, 6); anything else is not a version folder.
fn parse_version(name: &str) -> Option<(u32, u32)> {
    let mut parts = name.splitn(2, '.');
    let major = parts.next()?.parse().ok()?;
    let minor = match parts.next() {
        Some(minor) => minor.parse().ok()?,
        None => 0,
    };
    Some((major, minor))
}

/// Runs `pg_config <flag>`, preferring the one next to the server binaries so
/// that a second installed version cannot answer for the wrong server.
pub(crate) fn pg_config(flag: &str, bin_dir: Option<&Path>) -> Option<String> {
    let candidates = bin_dir
        .map(|dir| dir.join("pg_config"))
        .filter(|path| path.is_file())
        .into_iter()
        .chain(std::iter::once(PathBuf::from("pg_config")));
    for program in candidates {
        let Ok(output) = Command::new(&program).arg(flag).stdin(Stdio::null()).stderr(Stdio::null()).output() else {
            continue;
        };
        if output.status.success() {
            let answer = String::from_utf8_lossy(&output.stdout).trim().to_owned();
            if !answer.is_empty() {
                return Some(answer);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("adk-pg-source-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn fake_install(root: &Path, version: &str) -> PathBuf {
        let bin = root.join(version).join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::write(bin.join("initdb"), "").unwrap();
        bin
    }

    fn search(root: &Path) -> Search {
        Search {
            env_url: None,
            env_bin_dir: None,
            pg_config_bindir: None,
            versioned_root: root.to_path_buf(),
            containers: false,
        }
    }

    #[test]
    fn nothing_found_names_the_package_and_the_variable() {
        let root = scratch("nothing");
        let search =
            Search { pg_config_bindir: Some(root.join("no-such-bindir")), ..search(&root.join("no-such-root")) };
        let message = choose_source(&search).unwrap_err();
        assert!(message.contains("postgresql-15"), "{message}");
        assert!(message.contains("`postgresql`"), "{message}");
        assert!(message.contains(TEST_URL_VAR), "{message}");
        std::fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn the_url_wins_over_binaries() {
        let root = scratch("url");
        fake_install(&root, "15");
        let search = Search { env_url: Some(" postgres://x@h/postgres ".into()), ..search(&root) };
        assert_eq!(choose_source(&search), Ok(Source::Url("postgres://x@h/postgres".into())));
        std::fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn an_empty_url_counts_as_unset() {
        let root = scratch("empty-url");
        let bin = fake_install(&root, "15");
        let search = Search { env_url: Some(String::new()), ..search(&root) };
        assert_eq!(choose_source(&search), Ok(Source::Binaries(bin)));
        std::fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn pg_config_is_used_only_when_it_has_a_server() {
        let root = scratch("pg-config");
        let newest = fake_install(&root, "16");
        let client_only = root.join("client/bin");
        std::fs::create_dir_all(&client_only).unwrap();
        assert_eq!(find_bin_dir(Some(&client_only), &root), Some(newest));

        let server = fake_install(&root.join("elsewhere"), "14");
        assert_eq!(find_bin_dir(Some(&server), &root), Some(server));
        std::fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn the_highest_version_is_chosen_numerically() {
        let root = scratch("versions");
        fake_install(&root, "9.6");
        let sixteen = fake_install(&root, "16");
        fake_install(&root, "15");
        std::fs::create_dir_all(root.join("17/bin")).unwrap(); // no initdb: client only
        std::fs::create_dir_all(root.join("not-a-version/bin")).unwrap();
        assert_eq!(find_bin_dir(None, &root), Some(sixteen));
        std::fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn the_named_server_bin_dir_wins_over_pg_config_and_the_newest_version() {
        let root = scratch("bin-dir-var");
        fake_install(&root, "16");
        let pg_config = fake_install(&root.join("pg-config"), "15");
        let named = fake_install(&root.join("wheel"), "18");
        let search = Search { env_bin_dir: Some(named.clone()), pg_config_bindir: Some(pg_config), ..search(&root) };
        assert_eq!(choose_source(&search), Ok(Source::Binaries(named)));
        // Empty counts as unset.
        let unset = Search { env_bin_dir: Some(PathBuf::new()), ..search.clone() };
        assert_eq!(choose_source(&unset), Ok(Source::Binaries(root.join("pg-config/15/bin"))));
        // The URL still wins: the binaries only start clusters.
        let url = Search { env_url: Some("postgres://x@h/postgres".into()), ..search };
        assert_eq!(choose_source(&url), Ok(Source::Url("postgres://x@h/postgres".into())));
        std::fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn a_named_server_bin_dir_without_a_server_is_an_error_not_a_fall_back() {
        let root = scratch("bin-dir-var-bad");
        fake_install(&root, "15");
        let empty = root.join("empty");
        std::fs::create_dir_all(&empty).unwrap();
        let search = Search { env_bin_dir: Some(empty.clone()), ..search(&root) };
        let message = choose_source(&search).unwrap_err();
        assert!(message.contains(SERVER_BIN_DIR_VAR) && message.contains("no initdb"), "{message}");
        assert!(message.contains(&empty.display().to_string()), "{message}");
        let relative = Search { env_bin_dir: Some(PathBuf::from("target/postgres-18/bin")), ..search };
        let message = choose_source(&relative).unwrap_err();
        assert!(message.contains("relative"), "{message}");
        std::fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn containers_are_the_last_resort() {
        let root = scratch("containers");
        let search = Search { containers: true, ..search(&root) };
        assert_eq!(choose_source(&search), Ok(Source::Container));
        fake_install(&root, "15");
        assert!(matches!(choose_source(&search), Ok(Source::Binaries(_))));
        std::fs::remove_dir_all(root).unwrap();
    }
}
