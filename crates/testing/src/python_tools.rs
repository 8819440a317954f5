//! The Python tools of the archive tests, in one venv: moto's standalone S3
//! server (`moto_server`, run by [`S3Server`](crate::S3Server)) and DuckDB
//! (run by [`duckdb_json`]), at the versions `python/requirements.txt` pins.
//!
//! The venv is [`PYTHON_TOOLS_VAR`] when set, else `python-tools` in the
//! workspace's target folder. Off CI the first test that needs it makes it
//! (`python3 -m venv`, then `pip install -r python/requirements.txt`, about
//! half a minute from PyPI), under a file lock beside it so that parallel
//! test processes wait for one maker instead of racing. With `CI=true` a
//! missing venv is an error: `.ci/run` makes it before the tests and sets
//! [`PYTHON_TOOLS_VAR`].
//!
//! A venv this crate or `.ci/run` made holds a copy of the requirements it
//! was made from (`adk-pg-requirements.txt`); when the pins change it is made
//! again. A venv made by someone else (no copy, but a `bin/moto_server`) is
//! used as it is.

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use crate::cluster::run;
use crate::error::HarnessError;

/// Names the venv of the Python tools (a folder); `.ci/run` sets it.
pub const PYTHON_TOOLS_VAR: &str = "ADK_PG_PYTHON_TOOLS";
const REQUIREMENTS: &str = include_str!("../python/requirements.txt");
const DUCKDB_JSON: &str = include_str!("../python/duckdb_json.py");
/// The requirements a finished venv was made from.
const MADE_FROM: &str = "adk-pg-requirements.txt";
/// The requirements of a venv being made (and pip's input): a venv holding
/// it was left half made.
const BEING_MADE_FROM: &str = "adk-pg-requirements.partial";
/// The name of the venv in the target folder.
const DEFAULT_NAME: &str = "python-tools";

/// A venv holding `moto_server` and DuckDB.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PythonTools {
    dir: PathBuf,
}

impl PythonTools {
    /// The venv's folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Its Python, which imports `duckdb`.
    pub fn python(&self) -> PathBuf {
        self.dir.join("bin/python")
    }

    /// Its `moto_server` script.
    pub fn moto_server(&self) -> PathBuf {
        self.dir.join("bin/moto_server")
    }
}

/// The venv of the Python tools, made first when it is missing or was made
/// from other pins (not on CI: there `.ci/run` makes it). Once per process;
/// a failure is tried again by the next call.
pub fn python_tools() -> Result<PythonTools, HarnessError> {
    static FOUND: OnceLock<PythonTools> = OnceLock::new();
    if let Some(tools) = FOUND.get() {
        return Ok(tools.clone());
    }
    let dir = tools_dir(
        std::env::var_os(PYTHON_TOOLS_VAR),
        std::env::var_os("CARGO_TARGET_DIR"),
        std::env::current_exe().ok().as_deref(),
        &workspace_root(),
    );
    let on_ci = std::env::var("CI").is_ok_and(|ci| ci == "true");
    let tools = prepare(&dir, on_ci)?;
    Ok(FOUND.get_or_init(|| tools).clone())
}

/// Runs `sql` (one or more statements) in a fresh in-memory DuckDB and
/// returns the rows of the last statement as a JSON array of objects, one
/// member per column; a statement without rows (`COPY … TO`) gives `[]`.
///
/// Values JSON has no type for come back as strings: BLOBs as `\x` and hex
/// (PostgreSQL's bytea), dates and timestamps in ISO 8601 (the session's
/// time zone is UTC), decimals and UUIDs as text, NaN as `"nan"`.
///
/// Local files only: DuckDB reads `s3://` through its httpfs extension,
/// which it downloads from extensions.duckdb.org, and that is not reachable
/// from CI, so extensions are never installed here. Copy the objects out of
/// the S3 server first ([`S3Server::download`](crate::S3Server::download)).
///
/// It blocks while DuckDB runs (a child process).
pub fn duckdb_json(sql: &str) -> Result<serde_json::Value, HarnessError> {
    let tools = python_tools()?;
    let python = tools.python();
    let mut child = Command::new(&python)
        .arg("-c")
        .arg(DUCKDB_JSON)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(HarnessError::io(format!("starting {}", python.display())))?;
    // The child reads all of stdin before it writes anything, so writing
    // first cannot deadlock.
    let written = child.stdin.take().map(|mut stdin| stdin.write_all(sql.as_bytes()));
    let output = child.wait_with_output().map_err(HarnessError::io(format!("running {}", python.display())))?;
    if !output.status.success() {
        return Err(HarnessError::Command {
            command: format!("duckdb_json: {sql}"),
            status: output.status.to_string(),
            output: String::from_utf8_lossy(&output.stderr).into_owned(),
        });
    }
    if let Some(Err(error)) = written {
        return Err(HarnessError::Io { context: "writing the SQL to DuckDB".into(), source: error });
    }
    serde_json::from_slice(&output.stdout).map_err(|error| {
        HarnessError::Setup(format!(
            "duckdb_json printed no JSON ({error}): {}",
            String::from_utf8_lossy(&output.stdout)
        ))
    })
}

/// Where the venv is: the variable; else `python-tools` in the target
/// folder the running executable was built in (the one with cargo's
/// `CACHEDIR.TAG`); else in `CARGO_TARGET_DIR` (relative to the workspace);
/// else in the workspace's `target`.
pub(crate) fn tools_dir(
    var: Option<OsString>,
    cargo_target_dir: Option<OsString>,
    exe: Option<&Path>,
    workspace: &Path,
) -> PathBuf {
    if let Some(dir) = var.filter(|dir| !dir.is_empty()) {
        return absolute(PathBuf::from(dir));
    }
    let built_in = exe.and_then(|exe| exe.ancestors().skip(1).find(|dir| dir.join("CACHEDIR.TAG").is_file()));
    let target = match (built_in, cargo_target_dir.filter(|dir| !dir.is_empty())) {
        (Some(dir), _) => dir.to_path_buf(),
        (None, Some(dir)) => workspace.join(dir),
        (None, None) => workspace.join("target"),
    };
    target.join(DEFAULT_NAME)
}

fn absolute(path: PathBuf) -> PathBuf {
    std::path::absolute(&path).unwrap_or(path)
}

fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().and_then(Path::parent).unwrap_or(manifest).to_path_buf()
}

/// What a venv folder holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Venv {
    /// Made here (or by `.ci/run`) from the requirements of this build.
    Ready,
    /// Someone else's venv with a `moto_server`: used as it is.
    Foreign,
    /// Made here from other pins, or left half made: made again.
    Stale,
    /// Absent or empty.
    Missing,
    /// Something else, which is never deleted.
    Unknown,
}

fn inspect(dir: &Path) -> Venv {
    match std::fs::read_to_string(dir.join(MADE_FROM)) {
        Ok(made_from) if made_from == REQUIREMENTS => return Venv::Ready,
        Ok(_) => return Venv::Stale,
        Err(_) => {}
    }
    if dir.join(BEING_MADE_FROM).exists() {
        return Venv::Stale;
    }
    if dir.join("bin/moto_server").is_file() && dir.join("bin/python").exists() {
        return Venv::Foreign;
    }
    match std::fs::read_dir(dir) {
        Err(_) => Venv::Missing,
        Ok(mut entries) => match entries.next() {
            None => Venv::Missing,
            Some(_) => Venv::Unknown,
        },
    }
}

fn prepare(dir: &Path, on_ci: bool) -> Result<PythonTools, HarnessError> {
    let tools = PythonTools { dir: dir.to_path_buf() };
    match inspect(dir) {
        Venv::Ready | Venv::Foreign => return Ok(tools),
        Venv::Unknown => return Err(unknown(dir)),
        Venv::Stale | Venv::Missing if on_ci => {
            return Err(HarnessError::NoPythonTools(format!(
                "the Python tools of the archive tests (moto, duckdb) are not installed in {} \
                 (or were installed from other pins), and CI=true: run .ci/run, which installs \
                 them and sets {PYTHON_TOOLS_VAR}",
                dir.display()
            )));
        }
        Venv::Stale | Venv::Missing => {}
    }
    let _lock = lock_beside(dir)?;
    // Another process may have made it while we waited for the lock.
    match inspect(dir) {
        Venv::Ready | Venv::Foreign => return Ok(tools),
        Venv::Unknown => return Err(unknown(dir)),
        Venv::Stale => {
            std::fs::remove_dir_all(dir).map_err(HarnessError::io(format!("removing {}", dir.display())))?;
        }
        Venv::Missing => {}
    }
    make(dir)?;
    Ok(tools)
}

fn unknown(dir: &Path) -> HarnessError {
    HarnessError::NoPythonTools(format!(
        "{} is neither empty nor a venv with moto_server; remove it, or set {PYTHON_TOOLS_VAR} \
         to another folder",
        dir.display()
    ))
}

/// An exclusive lock on `<dir>.lock`, held until the file is dropped.
fn lock_beside(dir: &Path) -> Result<File, HarnessError> {
    let mut name = dir.file_name().map(OsString::from).unwrap_or_else(|| DEFAULT_NAME.into());
    name.push(".lock");
    let path = dir.with_file_name(name);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(HarnessError::io(format!("creating {}", parent.display())))?;
    }
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(HarnessError::io(format!("opening {}", path.display())))?;
    file.lock().map_err(HarnessError::io(format!("locking {}", path.display())))?;
    Ok(file)
}

/// `python3 -m venv`, then pip from the requirements; the copy of them that
/// marks the venv finished is renamed into place last.
fn make(dir: &Path) -> Result<(), HarnessError> {
    eprintln!("adk-postgres-testing: installing moto and DuckDB into {} (once; about half a minute)", dir.display());
    std::fs::create_dir_all(dir).map_err(HarnessError::io(format!("creating {}", dir.display())))?;
    let partial = dir.join(BEING_MADE_FROM);
    std::fs::write(&partial, REQUIREMENTS).map_err(HarnessError::io(format!("writing {}", partial.display())))?;
    let mut venv = Command::new("python3");
    venv.args(["-m", "venv"]).arg(dir);
    run(venv).map_err(|error| match error {
        HarnessError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            HarnessError::NoPythonTools(
                "python3 is not installed; the archive tests need it to run moto's S3 server and \
                 DuckDB (Debian/Ubuntu: `apt-get install python3 python3-venv`)"
                    .into(),
            )
        }
        other => other,
    })?;
    let mut pip = Command::new(dir.join("bin/python"));
    pip.args(["-m", "pip", "install", "--quiet", "--no-input", "--disable-pip-version-check", "-r"]).arg(&partial);
    run(pip)?;
    let made = dir.join(MADE_FROM);
    std::fs::rename(&partial, &made).map_err(HarnessError::io(format!("renaming to {}", made.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variable_wins_then_the_executables_target_folder() {
        let workspace = Path::new("/work/repo");
        let var = Some(OsString::from("/opt/tools"));
        assert_eq!(tools_dir(var, None, None, workspace), Path::new("/opt/tools"));

        let target = std::env::temp_dir().join(format!("adk-pg-target-{}", crate::short_random()));
        let exe = target.join("debug/deps/harness-0123");
        std::fs::create_dir_all(exe.parent().unwrap()).unwrap();
        std::fs::write(target.join("CACHEDIR.TAG"), "Signature: 8a477f597d28d172789f06886806bc55").unwrap();
        let found = tools_dir(Some(OsString::new()), Some("elsewhere".into()), Some(&exe), workspace);
        assert_eq!(found, target.join("python-tools"));
        std::fs::remove_dir_all(&target).unwrap();

        let relative = tools_dir(None, Some("t".into()), Some(Path::new("/nowhere/bin/x")), workspace);
        assert_eq!(relative, Path::new("/work/repo/t/python-tools"));
        assert_eq!(tools_dir(None, None, None, workspace), Path::new("/work/repo/target/python-tools"));
    }

    #[test]
    fn only_venvs_made_here_are_remade() {
        let dir = std::env::temp_dir().join(format!("adk-pg-venv-{}", crate::short_random()));
        assert_eq!(inspect(&dir), Venv::Missing);
        std::fs::create_dir_all(dir.join("bin")).unwrap();
        assert_eq!(inspect(&dir), Venv::Unknown, "a folder that is not ours is never deleted");
        std::fs::write(dir.join("bin/moto_server"), "").unwrap();
        std::fs::write(dir.join("bin/python"), "").unwrap();
        assert_eq!(inspect(&dir), Venv::Foreign);
        std::fs::write(dir.join(BEING_MADE_FROM), REQUIREMENTS).unwrap();
        assert_eq!(inspect(&dir), Venv::Stale, "half made");
        std::fs::write(dir.join(MADE_FROM), "duckdb==0.1\n").unwrap();
        assert_eq!(inspect(&dir), Venv::Stale, "other pins");
        std::fs::write(dir.join(MADE_FROM), REQUIREMENTS).unwrap();
        assert_eq!(inspect(&dir), Venv::Ready);
        assert!(prepare(&dir, true).is_ok());
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(matches!(prepare(&dir, true), Err(HarnessError::NoPythonTools(_))));
    }

    #[test]
    fn duckdb_reads_back_the_parquet_it_wrote() {
        let dir = std::env::temp_dir().join(format!("adk-pg-duckdb-{}", crate::short_random()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("day.parquet");
        let written = duckdb_json(&format!(
            "COPY (SELECT 1 AS a, 'x'::BLOB AS b, DATE '2026-01-02' AS d, \
                   TIMESTAMPTZ '2026-01-02 03:04:05+01' AS t, 1.50::DECIMAL(5, 2) AS m) \
             TO '{}' (FORMAT parquet, COMPRESSION zstd)",
            file.display()
        ))
        .unwrap();
        assert_eq!(written, serde_json::json!([]));
        let rows = duckdb_json(&format!("SELECT * FROM '{}'", file.display())).unwrap();
        let expected = serde_json::json!([
            {"a": 1, "b": "\\x78", "d": "2026-01-02", "t": "2026-01-02T02:04:05+00:00", "m": "1.50"}
        ]);
        assert_eq!(rows, expected);
        let codecs =
            duckdb_json(&format!("SELECT DISTINCT compression FROM parquet_metadata('{}')", file.display())).unwrap();
        assert_eq!(codecs, serde_json::json!([{"compression": "ZSTD"}]));

        let error = duckdb_json("SELECT * FROM no_such_table").unwrap_err().to_string();
        assert!(error.contains("no_such_table"), "{error}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
