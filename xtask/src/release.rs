//! `release --dry-run`: everything a release checks, without uploading.
//!
//! 1. `cargo package` of every published crate (those whose `publish` is not
//!    `[]` in `cargo metadata`). The size and file count of each `.crate` are
//!    printed, and a crate over [`MAX_CRATE_BYTES`] fails the run.
//! 2. The packaged crates, unpacked into `target/package/check/`, are made a
//!    workspace of their own, each depending on the others' packaged
//!    sources, and checked one crate at a time (`cargo check -p`), each with
//!    only its own features, as `cargo package` verifies them: a file a crate
//!    needs but does not ship (embedded migrations, SQL, a README it
//!    includes) or a feature it forgot to ask for fails here. This stands in
//!    for `cargo package`'s own verification, which builds each crate in a
//!    target directory of its own and so rebuilt most of the dependencies
//!    once per crate (22 minutes here against a few): this one shares the
//!    workspace's target directory with clippy. `cargo publish` still runs
//!    that verification when a person publishes.
//! 3. `cargo semver-checks` of every published library against the last `v*`
//!    tag, or against the previous commit until a first tag exists, on the
//!    features docs.rs documents (the feature set users are shown).
//!
//! Publishing itself needs a crates.io token and is done by a person, so
//! `release` only has a dry run.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::Instant;

use anyhow::{Context as _, bail};
use serde_json::Value;

use crate::project::{cargo, exit_code, root};

/// Well above any crate of ours, well below crates.io's 10 MB: a crate this
/// big has picked up files it should not ship.
pub const MAX_CRATE_BYTES: u64 = 4 * 1024 * 1024;

/// The workspace's `[profile.dev]` (see its Cargo.toml), which packaged
/// manifests do not carry: with it the check of the packaged crates reuses
/// what clippy and the tests already built.
const DEV_PROFILE: &str = "\
[profile.dev]
debug = \"line-tables-only\"

[profile.dev.package.\"*\"]
debug = false
";

pub fn run() -> anyhow::Result<ExitCode> {
    let workspace = Workspace::load()?;
    let published: Vec<&Package> = workspace.packages.iter().filter(|p| p.published).collect();
    if published.is_empty() {
        bail!("cargo metadata lists no published package");
    }

    eprintln!("\n==> release --dry-run: cargo package of {} crates", published.len());
    let mut command = cargo();
    command.args(["package", "--workspace", "--no-verify", "--allow-dirty"]);
    for package in workspace.packages.iter().filter(|p| !p.published) {
        command.args(["--exclude", &package.name]);
    }
    let started = Instant::now();
    let status = command.status().context("running cargo package")?;
    eprintln!("release: cargo package took {}", Elapsed(started));
    if !status.success() {
        eprintln!("\nrelease: cargo package failed");
        return Ok(exit_code(status));
    }

    let check_dir = workspace.target_dir.join("package").join("check");
    let packaged = unpack(&workspace, &published, &check_dir)?;
    println!("\n{}", SizeTable(&packaged));
    let too_big: Vec<&Packaged> = packaged.iter().filter(|crate_| crate_.bytes > MAX_CRATE_BYTES).collect();
    if !too_big.is_empty() {
        for crate_ in too_big {
            eprintln!("release: {} is {} (limit {})", crate_.file, Bytes(crate_.bytes), Bytes(MAX_CRATE_BYTES));
        }
        eprintln!("check its `cargo package --list` for files it should not ship (`exclude` in its Cargo.toml)");
        return Ok(ExitCode::FAILURE);
    }

    eprintln!("\n==> release --dry-run: cargo check of the packaged crates, from their packaged sources");
    std::fs::write(check_dir.join("Cargo.toml"), check_manifest(&published))
        .context("writing the packaged crates' workspace")?;
    std::fs::copy(root().join("Cargo.lock"), check_dir.join("Cargo.lock"))
        .context("copying Cargo.lock for the packaged crates")?;
    let started = Instant::now();
    // One crate at a time, as `cargo package` verifies them: checked
    // together, a crate would also get the features its neighbours turn on
    // in shared dependencies, and one that forgot to ask for a feature it
    // uses would compile here and fail for its users.
    for package in &published {
        let status = cargo()
            .args(["check", "--quiet", "--package", &package.name, "--manifest-path"])
            .arg(check_dir.join("Cargo.toml"))
            .arg("--target-dir")
            .arg(&workspace.target_dir)
            .status()
            .context("running cargo check on the packaged crates")?;
        if !status.success() {
            eprintln!(
                "\nrelease: {} does not compile from its packaged sources alone (in {})",
                package.name,
                check_dir.display()
            );
            return Ok(exit_code(status));
        }
    }
    eprintln!("release: the check of the packaged crates, one by one, took {}", Elapsed(started));

    semver_checks(&published, &workspace.target_dir)
}

/// The workspace as `cargo metadata` describes it.
#[derive(Debug)]
struct Workspace {
    target_dir: PathBuf,
    packages: Vec<Package>,
}

#[derive(Debug, PartialEq)]
struct Package {
    name: String,
    version: String,
    /// `publish` is not `[]` (cargo's `publish = false`).
    published: bool,
    /// Only a library has an API for semver-checks to compare.
    has_lib: bool,
    manifest_path: PathBuf,
    features: Features,
}

/// The features semver-checks builds a crate with: the ones its docs.rs
/// metadata documents, else its default features.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Features {
    Default,
    DefaultAnd(Vec<String>),
    Only(Vec<String>),
    All,
}

impl Features {
    fn from_docs_rs(docs_rs: Option<&Value>) -> Self {
        let Some(docs_rs) = docs_rs else { return Self::Default };
        if docs_rs.get("all-features").and_then(Value::as_bool) == Some(true) {
            return Self::All;
        }
        let mut features: Vec<String> = docs_rs
            .get("features")
            .and_then(Value::as_array)
            .map(|list| list.iter().filter_map(Value::as_str).map(String::from).collect())
            .unwrap_or_default();
        features.sort();
        if docs_rs.get("no-default-features").and_then(Value::as_bool) == Some(true) {
            Self::Only(features)
        } else if features.is_empty() {
            Self::Default
        } else {
            Self::DefaultAnd(features)
        }
    }

    fn args(&self) -> Vec<String> {
        let listed = |mode: &str, features: &[String]| {
            let mut args = vec![mode.to_owned()];
            for feature in features {
                args.extend(["--features".to_owned(), feature.clone()]);
            }
            args
        };
        match self {
            Self::Default => vec!["--default-features".to_owned()],
            Self::DefaultAnd(features) => listed("--default-features", features),
            Self::Only(features) => listed("--only-explicit-features", features),
            Self::All => vec!["--all-features".to_owned()],
        }
    }
}

impl Workspace {
    fn load() -> anyhow::Result<Self> {
        let output = cargo()
            .args(["metadata", "--format-version", "1", "--no-deps"])
            .stderr(Stdio::inherit())
            .output()
            .context("running cargo metadata")?;
        if !output.status.success() {
            bail!("cargo metadata failed");
        }
        Self::parse(&serde_json::from_slice(&output.stdout).context("reading cargo metadata's JSON")?)
    }

    fn parse(metadata: &Value) -> anyhow::Result<Self> {
        let target_dir = metadata["target_directory"].as_str().context("cargo metadata without target_directory")?;
        let packages = metadata["packages"]
            .as_array()
            .context("cargo metadata without packages")?
            .iter()
            .map(Package::parse)
            .collect::<anyhow::Result<_>>()?;
        Ok(Self { target_dir: target_dir.into(), packages })
    }
}

impl Package {
    fn parse(package: &Value) -> anyhow::Result<Self> {
        let field = |name: &str| {
            package[name]
                .as_str()
                .map(String::from)
                .with_context(|| format!("a package without {name} in cargo metadata"))
        };
        let name = field("name")?;
        // `null`: any registry; a list: only those; `[]`: `publish = false`.
        let published = package["publish"].as_array().is_none_or(|registries| !registries.is_empty());
        let has_lib = package["targets"].as_array().is_some_and(|targets| {
            targets.iter().any(|target| {
                target["kind"].as_array().is_some_and(|kinds| kinds.iter().any(|kind| kind == "lib" || kind == "rlib"))
            })
        });
        let features = Features::from_docs_rs(package.pointer("/metadata/docs/rs"));
        let manifest_path = field("manifest_path")?.into();
        Ok(Self { version: field("version")?, name, published, has_lib, manifest_path, features })
    }

    /// `name-version`, as `cargo package` names the `.crate` and its folder.
    fn dir_name(&self) -> String {
        format!("{}-{}", self.name, self.version)
    }
}

/// One `.crate` that `cargo package` wrote.
#[derive(Debug)]
struct Packaged {
    file: String,
    bytes: u64,
    files: usize,
}

/// Unpacks each published crate's `.crate` into `dir` (emptied first).
fn unpack(workspace: &Workspace, published: &[&Package], dir: &Path) -> anyhow::Result<Vec<Packaged>> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).with_context(|| format!("emptying {}", dir.display()))?;
    }
    std::fs::create_dir_all(dir).with_context(|| format!("making {}", dir.display()))?;
    let mut packaged = Vec::new();
    for package in published {
        let file = format!("{}.crate", package.dir_name());
        let path = workspace.target_dir.join("package").join(&file);
        let bytes = std::fs::metadata(&path).with_context(|| format!("reading {}", path.display()))?.len();
        let status = Command::new("tar")
            .arg("-xzf")
            .arg(&path)
            .arg("-C")
            .arg(dir)
            .status()
            .with_context(|| format!("running tar to unpack {}", path.display()))?;
        if !status.success() {
            bail!("tar could not unpack {}", path.display());
        }
        let files = count_files(&dir.join(package.dir_name()))?;
        packaged.push(Packaged { file, bytes, files });
    }
    Ok(packaged)
}

fn count_files(dir: &Path) -> anyhow::Result<usize> {
    let mut count = 0;
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let entry = entry?;
        count += if entry.file_type()?.is_dir() { count_files(&entry.path())? } else { 1 };
    }
    Ok(count)
}

/// A workspace of the unpacked crates in which each depends on the others'
/// packaged sources (their manifests name them by version, as on crates.io).
fn check_manifest(published: &[&Package]) -> String {
    let mut manifest = String::from(
        "# Written by `cargo xtask release --dry-run`: the packaged crates, checked together.\n\
         [workspace]\nresolver = \"3\"\nmembers = [\n",
    );
    for package in published {
        manifest.push_str(&format!("    \"{}\",\n", package.dir_name()));
    }
    manifest.push_str("]\n\n[patch.crates-io]\n");
    for package in published {
        manifest.push_str(&format!("{} = {{ path = \"{}\" }}\n", package.name, package.dir_name()));
    }
    manifest.push('\n');
    manifest.push_str(DEV_PROFILE);
    manifest
}

struct SizeTable<'a>(&'a [Packaged]);

impl fmt::Display for SizeTable<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let width = self.0.iter().map(|crate_| crate_.file.len()).max().unwrap_or(0).max("crate".len());
        writeln!(f, "{:<width$}  {:>10}  {:>5}", "crate", "size", "files")?;
        for crate_ in self.0 {
            writeln!(f, "{:<width$}  {:>10}  {:>5}", crate_.file, Bytes(crate_.bytes).to_string(), crate_.files)?;
        }
        let total: u64 = self.0.iter().map(|crate_| crate_.bytes).sum();
        write!(f, "{:<width$}  {:>10}", "total", Bytes(total).to_string())
    }
}

/// A size as people read it: `12.3 KiB`.
struct Bytes(u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        #[expect(clippy::cast_precision_loss, reason = "a size shown to one decimal")]
        let bytes = self.0 as f64;
        match self.0 {
            0..1024 => write!(f, "{} B", self.0),
            1024..1_048_576 => write!(f, "{:.1} KiB", bytes / 1024.0),
            _ => write!(f, "{:.1} MiB", bytes / 1_048_576.0),
        }
    }
}

/// The time since a step started, as `2m 05s`.
struct Elapsed(Instant);

impl fmt::Display for Elapsed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let seconds = self.0.elapsed().as_secs();
        write!(f, "{}m {:02}s", seconds / 60, seconds % 60)
    }
}

/// What the published libraries are compared with.
#[derive(Debug, PartialEq)]
enum Baseline {
    /// The last release.
    Tag(String),
    /// No release yet: the previous commit.
    PreviousCommit,
    /// Nothing to compare with, and why.
    None(&'static str),
}

impl Baseline {
    fn find() -> anyhow::Result<Self> {
        let tag = git(&["describe", "--tags", "--abbrev=0", "--match", "v*", "HEAD"])?;
        let has_parent = git(&["rev-parse", "--verify", "--quiet", "HEAD~1^{commit}"])?.is_some();
        let shallow = git(&["rev-parse", "--is-shallow-repository"])?.is_some_and(|answer| answer == "true");
        Ok(Self::choose(tag, has_parent, shallow))
    }

    fn choose(tag: Option<String>, has_parent: bool, shallow: bool) -> Self {
        match (tag, has_parent, shallow) {
            (Some(tag), _, _) => Self::Tag(tag),
            (None, true, _) => Self::PreviousCommit,
            (None, false, true) => Self::None(
                "this is a shallow clone without the previous commit or a `v*` tag; \
                 `git fetch --deepen=1` (or --unshallow) to check the API",
            ),
            (None, false, false) => Self::None("this is the first commit and there is no `v*` tag"),
        }
    }

    fn rev(&self) -> Option<&str> {
        match self {
            Self::Tag(tag) => Some(tag),
            Self::PreviousCommit => Some("HEAD~1"),
            Self::None(_) => None,
        }
    }
}

/// `git ARGS` in the workspace: its trimmed output, or `None` when git says no.
fn git(args: &[&str]) -> anyhow::Result<Option<String>> {
    let output = Command::new("git")
        .args(args)
        .current_dir(root())
        .stderr(Stdio::null())
        .output()
        .with_context(|| format!("running git {}", args.join(" ")))?;
    Ok(output.status.success().then(|| String::from_utf8_lossy(&output.stdout).trim().to_owned()))
}

fn semver_checks(published: &[&Package], target_dir: &Path) -> anyhow::Result<ExitCode> {
    let baseline = Baseline::find()?;
    let Some(rev) = baseline.rev() else {
        let Baseline::None(why) = baseline else { unreachable!() };
        eprintln!("\n==> release --dry-run: no API check: {why}");
        return Ok(ExitCode::SUCCESS);
    };
    // semver-checks fails on a crate the baseline lacks; a new crate has no
    // API to break yet.
    let mut libraries = Vec::new();
    for package in published.iter().copied().filter(|package| package.has_lib) {
        if in_baseline(rev, package)? {
            libraries.push(package);
        } else {
            eprintln!("release: {} is not in {rev}, so it has no API to compare with yet", package.name);
        }
    }
    if libraries.is_empty() {
        eprintln!("\n==> release --dry-run: no API check: no published library is in {rev}");
        return Ok(ExitCode::SUCCESS);
    }
    if !cargo().args(["semver-checks", "--version"]).stdout(Stdio::null()).status().is_ok_and(|s| s.success()) {
        bail!("cargo-semver-checks is not installed: `cargo install cargo-semver-checks --locked` (.ci/run does)");
    }
    let what = match &baseline {
        Baseline::Tag(tag) => format!("the last release, {tag}"),
        _ => "the previous commit (no `v*` tag yet)".to_owned(),
    };
    eprintln!("\n==> release --dry-run: cargo semver-checks of {} libraries against {what}", libraries.len());
    for (features, names) in by_features(&libraries) {
        let mut command = cargo();
        // One target directory for every crate's rustdoc (semver-checks'
        // default is one per crate, each checking the dependencies again).
        command
            .args(["semver-checks", "check-release", "--baseline-rev", rev])
            .args(features.args())
            .env("CARGO_TARGET_DIR", target_dir);
        for name in names {
            command.args(["--package", name]);
        }
        let started = Instant::now();
        let status = command.status().context("running cargo semver-checks")?;
        eprintln!("release: cargo semver-checks {} took {}", features.args().join(" "), Elapsed(started));
        if !status.success() {
            eprintln!("\nrelease: cargo semver-checks failed against {what}");
            return Ok(exit_code(status));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Whether `rev` has this package's manifest, naming it.
fn in_baseline(rev: &str, package: &Package) -> anyhow::Result<bool> {
    let root = root();
    let manifest = package.manifest_path.strip_prefix(&root).unwrap_or(&package.manifest_path);
    let manifest = manifest.to_str().context("a manifest path that is not UTF-8")?;
    let old = git(&["show", &format!("{rev}:{manifest}")])?;
    Ok(old.is_some_and(|old| names_package(&old, &package.name)))
}

/// Whether a Cargo.toml's text says `name = "<name>"` (the package's, as no
/// dependency of ours is written that way).
fn names_package(manifest: &str, name: &str) -> bool {
    manifest.lines().any(|line| {
        line.split_once('=').is_some_and(|(key, value)| key.trim() == "name" && value.trim() == format!("\"{name}\""))
    })
}

/// The libraries grouped by the features they are checked with, one
/// semver-checks run per group.
fn by_features<'a>(libraries: &[&'a Package]) -> BTreeMap<Features, Vec<&'a str>> {
    let mut groups: BTreeMap<Features, Vec<&str>> = BTreeMap::new();
    for package in libraries {
        groups.entry(package.features.clone()).or_default().push(&package.name);
    }
    groups
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn package(name: &str, publish: Value, kinds: &[&str], metadata: Value) -> Value {
        json!({
            "name": name,
            "version": "0.1.0",
            "manifest_path": format!("/w/crates/{name}/Cargo.toml"),
            "publish": publish,
            "targets": kinds.iter().map(|kind| json!({ "kind": [kind] })).collect::<Vec<_>>(),
            "metadata": metadata,
        })
    }

    #[test]
    fn publish_false_is_an_empty_list_and_the_rest_are_published() {
        let metadata = json!({
            "target_directory": "/t",
            "packages": [
                package("open", Value::Null, &["lib"], Value::Null),
                package("private", json!([]), &["lib"], Value::Null),
                package("one-registry", json!(["crates-io"]), &["lib"], Value::Null),
                package("tool", Value::Null, &["bin", "test"], Value::Null),
            ],
        });
        let workspace = Workspace::parse(&metadata).unwrap();
        let flags: Vec<(&str, bool, bool)> =
            workspace.packages.iter().map(|p| (p.name.as_str(), p.published, p.has_lib)).collect();
        assert_eq!(
            flags,
            [("open", true, true), ("private", false, true), ("one-registry", true, true), ("tool", true, false)]
        );
        assert_eq!(workspace.target_dir, PathBuf::from("/t"));
    }

    #[test]
    fn features_follow_the_docs_rs_metadata() {
        let of = |metadata: Value| Features::from_docs_rs(metadata.pointer("/docs/rs"));
        assert_eq!(of(Value::Null), Features::Default);
        assert_eq!(of(json!({ "docs": { "rs": { "all-features": true } } })), Features::All);
        let listed = of(json!({ "docs": { "rs": { "features": ["scripted", "postgres"] } } }));
        assert_eq!(listed, Features::DefaultAnd(vec!["postgres".into(), "scripted".into()]));
        assert_eq!(listed.args(), ["--default-features", "--features", "postgres", "--features", "scripted"]);
        let only = of(json!({ "docs": { "rs": { "features": ["a"], "no-default-features": true } } }));
        assert_eq!(only.args(), ["--only-explicit-features", "--features", "a"]);
        assert_eq!(Features::All.args(), ["--all-features"]);
        assert_eq!(Features::Default.args(), ["--default-features"]);
    }

    #[test]
    fn libraries_with_the_same_features_share_a_run() {
        let parse = |value: Value| Package::parse(&value).unwrap();
        let a = parse(package("a", Value::Null, &["lib"], Value::Null));
        let b = parse(package("b", Value::Null, &["lib"], json!({ "docs": { "rs": { "all-features": true } } })));
        let c = parse(package("c", Value::Null, &["lib"], Value::Null));
        let groups = by_features(&[&a, &b, &c]);
        assert_eq!(groups.len(), 2);
        assert_eq!(groups[&Features::Default], ["a", "c"]);
        assert_eq!(groups[&Features::All], ["b"]);
    }

    #[test]
    fn the_baseline_is_the_last_tag_then_the_previous_commit() {
        assert_eq!(Baseline::choose(Some("v0.1.0".into()), true, false).rev(), Some("v0.1.0"));
        assert_eq!(Baseline::choose(Some("v0.1.0".into()), false, true).rev(), Some("v0.1.0"));
        assert_eq!(Baseline::choose(None, true, true).rev(), Some("HEAD~1"));
        let shallow = Baseline::choose(None, false, true);
        assert!(matches!(shallow, Baseline::None(why) if why.contains("shallow")));
        assert!(matches!(Baseline::choose(None, false, false), Baseline::None(why) if why.contains("first commit")));
    }

    #[test]
    fn the_check_workspace_patches_every_packaged_crate_and_keeps_our_profile() {
        let parse = |name: &str| Package::parse(&package(name, Value::Null, &["lib"], Value::Null)).unwrap();
        let (a, b) = (parse("a"), parse("b"));
        let manifest = check_manifest(&[&a, &b]);
        assert!(manifest.contains("members = [\n    \"a-0.1.0\",\n    \"b-0.1.0\",\n]"), "{manifest}");
        assert!(
            manifest.contains("[patch.crates-io]\na = { path = \"a-0.1.0\" }\nb = { path = \"b-0.1.0\" }\n"),
            "{manifest}"
        );
        // The check reuses clippy's and the tests' artifacts only while its
        // profile is the workspace's.
        let ours = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
        assert!(ours.contains(DEV_PROFILE), "the workspace's [profile.dev] changed: update DEV_PROFILE in release.rs");
        assert!(manifest.ends_with(DEV_PROFILE));
    }

    #[test]
    fn a_baseline_manifest_names_its_package() {
        let manifest = "[package]\nname = \"adk-pg\"\n\n[[bin]]\nname = \"adk-pg\"\n";
        assert!(names_package(manifest, "adk-pg"));
        assert!(!names_package(manifest, "adk-pg-old"));
        assert!(!names_package("[package]\nname = \"other\"\n", "adk-pg"));
    }

    #[test]
    fn sizes_read_as_people_read_them() {
        assert_eq!(Bytes(512).to_string(), "512 B");
        assert_eq!(Bytes(1536).to_string(), "1.5 KiB");
        assert_eq!(Bytes(MAX_CRATE_BYTES).to_string(), "4.0 MiB");
        let table = SizeTable(&[Packaged { file: "a-0.1.0.crate".into(), bytes: 2048, files: 7 }]).to_string();
        assert!(table.contains("a-0.1.0.crate     2.0 KiB      7"), "{table}");
        assert!(table.ends_with("\ntotal             2.0 KiB"), "{table}");
    }
}
