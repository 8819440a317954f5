//! The command line.

use std::path::PathBuf;

use anyhow::bail;

pub const USAGE: &str = "\
cargo xtask <command>

  demo [ARGS]    50 simulated users talk to a real adk-runner agent on the store, on
                 $DATABASE_URL or a throwaway cluster; ARGS: --users N, --turns N
  db up          start the developer cluster in target/adk-pg-dev/ (made on first use)
  db down        stop it (its data stays; delete the folder to start over)
  db url         print the URL of its `adk` database
  db psql [ARGS] open psql on it
  migrate        apply pending migrations to $DATABASE_URL, else to the developer cluster
  schema         regenerate crates/schema/src/tables.rs from a freshly migrated database
  test [--server-bin-dir DIR] [ARGS]
                 run the workspace tests on a throwaway cluster; ARGS go to
                 `cargo nextest run` (or `cargo test` without nextest), e.g. `-- -p adk-postgres-testing`;
                 DIR (absolute) holds the server binaries to use instead of the default ones,
                 e.g. another PostgreSQL version's (docs/testing.md)
  bench [ARGS]   benchmarks against the raw-SQL floor (pgbench) and adk-session's
                 PostgresSessionService on a throwaway durable cluster (or $DATABASE_URL);
                 `--quick` for a smoke run; `--profile dev` builds without optimisation (a
                 smoke run's build, its figures are not measurements); table on stdout,
                 JSON in target/bench/
  citus up       build Citus from vendor/citus/ if the server lacks it, start a coordinator
                 and two workers in target/adk-pg-citus/ and migrate an `adk` database in
                 Citus mode; prints its URL
  citus down     stop and delete them
  citus test [ARGS]  the conformance, adk contract and Citus suites on a throwaway
                 coordinator and two workers; ARGS go to `cargo nextest run`
  citus bench [ARGS]  append, get and list on a throwaway Citus cluster against a throwaway
                 single server, with the statements and round trips of each and the workers
                 a call touches; figures indicative only (every node shares this machine);
                 `--quick` for a smoke run, `--profile` as for bench; table on stdout, JSON
                 in target/bench/citus.json
  release --dry-run  package every published crate, print its size and file count, build
                 the packages from their packaged sources, then cargo semver-checks the
                 libraries against the last `v*` tag (else the previous commit); publishing
                 itself is done by hand
  ci             what CI runs: fmt, clippy, the testcontainers build, the release dry run,
                 bench --quick --profile dev, test, citus test, citus bench --quick --profile
                 dev, then test on PostgreSQL 18 (from the venv .ci/run makes; skipped
                 without it off CI)
";

#[derive(Debug)]
pub enum Command {
    Db(Db),
    Demo { args: Vec<String> },
    Migrate,
    Schema,
    Test { server_bin_dir: Option<PathBuf>, args: Vec<String> },
    Bench { args: Vec<String> },
    Citus(Citus),
    Release,
    Ci,
    Help,
}

#[derive(Debug)]
pub enum Citus {
    Up,
    Down,
    Test { args: Vec<String> },
    Bench { args: Vec<String> },
}

#[derive(Debug)]
pub enum Db {
    Up,
    Down,
    Url,
    Psql { args: Vec<String> },
}

pub fn parse(args: impl IntoIterator<Item = String>) -> anyhow::Result<Command> {
    let mut args = args.into_iter();
    let command = args.next();
    let rest: Vec<String> = args.collect();
    let no_more = |command: Command| {
        if let Some(extra) = rest.first() {
            bail!("unexpected argument `{extra}`\n\n{USAGE}");
        }
        Ok(command)
    };
    match command.as_deref() {
        None | Some("help" | "-h" | "--help") => Ok(Command::Help),
        Some("migrate") => no_more(Command::Migrate),
        Some("ci") => no_more(Command::Ci),
        Some("release") => match rest.as_slice() {
            [flag] if flag == "--dry-run" => Ok(Command::Release),
            [] => bail!(
                "`release` only has a dry run (`release --dry-run`): publishing needs a crates.io token and is done \
                 by hand with `cargo publish --workspace`"
            ),
            [.., extra] => bail!("unexpected argument `{extra}`: only `release --dry-run`\n\n{USAGE}"),
        },
        Some("demo") => Ok(Command::Demo { args: strip_separator(rest.clone()) }),
        Some("schema") => no_more(Command::Schema),
        Some("test") => {
            let (server_bin_dir, args) = take_server_bin_dir(rest.clone())?;
            Ok(Command::Test { server_bin_dir, args: strip_separator(args) })
        }
        Some("bench") => Ok(Command::Bench { args: strip_separator(rest.clone()) }),
        Some("citus") => {
            let (action, rest) = rest.split_first().map_or((None, &[][..]), |(a, r)| (Some(a.as_str()), r));
            match (action, rest.first()) {
                (Some("up"), None) => Ok(Command::Citus(Citus::Up)),
                (Some("down"), None) => Ok(Command::Citus(Citus::Down)),
                (Some("test"), _) => Ok(Command::Citus(Citus::Test { args: strip_separator(rest.to_vec()) })),
                (Some("bench"), _) => Ok(Command::Citus(Citus::Bench { args: strip_separator(rest.to_vec()) })),
                (Some("up" | "down"), Some(extra)) => bail!("unexpected argument `{extra}`\n\n{USAGE}"),
                _ => bail!("`citus` needs one of up, down, test, bench\n\n{USAGE}"),
            }
        }
        Some("db") => {
            let (action, rest) = rest.split_first().map_or((None, &[][..]), |(a, r)| (Some(a.as_str()), r));
            let only = |db: Db| match rest.first() {
                Some(extra) => bail!("unexpected argument `{extra}`\n\n{USAGE}"),
                None => Ok(Command::Db(db)),
            };
            match action {
                Some("up") => only(Db::Up),
                Some("down") => only(Db::Down),
                Some("url") => only(Db::Url),
                Some("psql") => Ok(Command::Db(Db::Psql { args: strip_separator(rest.to_vec()) })),
                _ => bail!("`db` needs one of up, down, url, psql\n\n{USAGE}"),
            }
        }
        Some(other) => bail!("unknown command `{other}`\n\n{USAGE}"),
    }
}

/// `--server-bin-dir DIR` (or `=DIR`) before any `--`, taken out of the
/// arguments that go on to the test runner.
fn take_server_bin_dir(args: Vec<String>) -> anyhow::Result<(Option<PathBuf>, Vec<String>)> {
    let (mut dirs, rest) = take_flag("--server-bin-dir", "a folder", &args)?;
    if dirs.len() > 1 {
        bail!("--server-bin-dir given twice");
    }
    Ok((dirs.pop().map(PathBuf::from), rest))
}

/// The values of `FLAG VALUE` and `FLAG=VALUE` before any `--`, in order,
/// and the other arguments; `needs` says what a value is when one is missing.
pub fn take_flag(flag: &str, needs: &str, args: &[String]) -> anyhow::Result<(Vec<String>, Vec<String>)> {
    let mut values = Vec::new();
    let mut rest = Vec::with_capacity(args.len());
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        if arg == "--" {
            rest.push(arg.clone());
            rest.extend(args.by_ref().cloned());
            break;
        }
        if arg == flag {
            match args.next() {
                Some(value) => values.push(value.clone()),
                None => bail!("{flag} needs {needs}\n\n{USAGE}"),
            }
        } else if let Some(value) = arg.strip_prefix(flag).and_then(|tail| tail.strip_prefix('=')) {
            values.push(value.to_owned());
        } else {
            rest.push(arg.clone());
        }
    }
    Ok((values, rest))
}

/// `cargo xtask test -- -p x` and `cargo xtask test -p x` mean the same.
fn strip_separator(mut args: Vec<String>) -> Vec<String> {
    if args.first().is_some_and(|arg| arg == "--") {
        args.remove(0);
    }
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(line: &str) -> anyhow::Result<Command> {
        parse(line.split_whitespace().map(String::from))
    }

    #[test]
    fn test_arguments_pass_through_with_or_without_a_separator() {
        for line in ["test -- -p a -- --nocapture", "test -p a -- --nocapture"] {
            let Command::Test { args, server_bin_dir: None } = parse_str(line).unwrap() else { panic!("{line}") };
            assert_eq!(args, ["-p", "a", "--", "--nocapture"]);
        }
    }

    #[test]
    fn the_server_bin_dir_is_taken_before_the_separator_only() {
        for line in [
            "test --server-bin-dir /pg/bin -p a",
            "test -p a --server-bin-dir=/pg/bin",
            "test --server-bin-dir /pg/bin -- -p a",
        ] {
            let Command::Test { args, server_bin_dir } = parse_str(line).unwrap() else { panic!("{line}") };
            assert_eq!(server_bin_dir.as_deref(), Some(std::path::Path::new("/pg/bin")), "{line}");
            assert_eq!(args, ["-p", "a"], "{line}");
        }
        let Command::Test { args, server_bin_dir: None } = parse_str("test -- -E x --server-bin-dir y").unwrap() else {
            panic!()
        };
        assert_eq!(args, ["-E", "x", "--server-bin-dir", "y"]);
        assert!(parse_str("test --server-bin-dir").is_err());
        assert!(parse_str("test --server-bin-dir a --server-bin-dir b").is_err());
    }

    #[test]
    fn commands_and_mistakes() {
        assert!(matches!(parse_str("").unwrap(), Command::Help));
        assert!(matches!(parse_str("db up").unwrap(), Command::Db(Db::Up)));
        assert!(matches!(parse_str("demo --users 5").unwrap(), Command::Demo { args } if args == ["--users", "5"]));
        assert!(
            matches!(parse_str("db psql -c select").unwrap(), Command::Db(Db::Psql { args }) if args == ["-c", "select"])
        );
        assert!(parse_str("db").is_err());
        assert!(parse_str("db up now").is_err());
        assert!(parse_str("ci --fast").is_err());
        assert!(matches!(parse_str("bench --quick").unwrap(), Command::Bench { args } if args == ["--quick"]));
        assert!(matches!(parse_str("bench").unwrap(), Command::Bench { args } if args.is_empty()));
        assert!(parse_str("benchmark").is_err());
        assert!(matches!(parse_str("citus up").unwrap(), Command::Citus(Citus::Up)));
        assert!(
            matches!(parse_str("citus test -- -E x").unwrap(), Command::Citus(Citus::Test { args }) if args == ["-E", "x"])
        );
        assert!(
            matches!(parse_str("citus bench --quick").unwrap(), Command::Citus(Citus::Bench { args }) if args == ["--quick"])
        );
        assert!(matches!(parse_str("citus bench").unwrap(), Command::Citus(Citus::Bench { args }) if args.is_empty()));
        assert!(parse_str("citus").is_err());
        assert!(parse_str("citus benchmark").is_err());
        assert!(parse_str("citus down now").is_err());
        assert!(matches!(parse_str("release --dry-run").unwrap(), Command::Release));
        assert!(parse_str("release").unwrap_err().to_string().contains("only has a dry run"));
        assert!(parse_str("release --dry-run --yes").is_err());
        assert!(parse_str("release publish").is_err());
    }
}
