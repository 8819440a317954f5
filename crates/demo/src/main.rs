//! `cargo xtask demo`: the demo on `$DATABASE_URL`, or on a throwaway
//! PostgreSQL cluster (stopped and deleted at the end) when it is unset.
//!
//! Usage: `adk-postgres-demo [--users N] [--turns N]` (defaults 50 and 4).
//! Exit codes: 0 success, 1 failure (including a failed persistence check).

use std::process::ExitCode;
use std::time::Instant;

use adk_postgres_demo::run_demo;
use adk_postgres_testing::{Cluster, start_throwaway_cluster};
use anyhow::{Context as _, bail};

const DEFAULT_USERS: usize = 50;
const DEFAULT_TURNS: usize = 4;
/// The database the demo creates on a throwaway cluster.
const DEMO_DATABASE: &str = "adk_demo";

const USAGE: &str = "usage: adk-postgres-demo [--users N] [--turns N]
  Runs the demo on $DATABASE_URL, or on a throwaway PostgreSQL cluster when it is unset.";

struct Args {
    users: usize,
    turns: usize,
}

fn parse_args(args: impl IntoIterator<Item = String>) -> anyhow::Result<Option<Args>> {
    let mut parsed = Args { users: DEFAULT_USERS, turns: DEFAULT_TURNS };
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) => (flag.to_owned(), Some(value.to_owned())),
            None => (arg, None),
        };
        let target = match flag.as_str() {
            "-h" | "--help" => return Ok(None),
            "--users" => &mut parsed.users,
            "--turns" => &mut parsed.turns,
            other => bail!("unknown argument `{other}`\n{USAGE}"),
        };
        let Some(value) = inline.or_else(|| args.next()) else { bail!("{flag} needs a number\n{USAGE}") };
        *target =
            value.parse().ok().filter(|n| *n >= 1).with_context(|| format!("{flag} {value}: not a positive number"))?;
    }
    Ok(Some(parsed))
}

fn main() -> ExitCode {
    match run() {
        Ok(code) => code,
        Err(error) => {
            eprintln!("demo: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> anyhow::Result<ExitCode> {
    let Some(args) = parse_args(std::env::args().skip(1))? else {
        println!("{USAGE}");
        return Ok(ExitCode::SUCCESS);
    };
    let started = Instant::now();
    println!("adk-postgres demo\n");

    // Dropped (stopped and deleted) when `run` returns; the cluster's own
    // watchdog covers a crash or Ctrl-C.
    let mut cluster: Option<Cluster> = None;
    let url = match std::env::var("DATABASE_URL") {
        Ok(url) if !url.trim().is_empty() => {
            println!("database       $DATABASE_URL ({})", describe(&url));
            url
        }
        _ => {
            let cluster_started = Instant::now();
            let started = cluster.insert(start_throwaway_cluster().context("starting a throwaway PostgreSQL cluster")?);
            println!(
                "database       throwaway PostgreSQL on 127.0.0.1:{} in {}, started in {:.2} s (no DATABASE_URL set)",
                started.port(),
                started.dir().display(),
                cluster_started.elapsed().as_secs_f64()
            );
            started.database_url(DEMO_DATABASE)
        }
    };

    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the runtime")?;
    let report = runtime.block_on(async {
        if let Some(cluster) = &cluster {
            create_database(&cluster.server_url(), DEMO_DATABASE).await?;
        }
        run_demo(&url, args.users, args.turns).await
    })?;
    drop(runtime);
    print!("{}", report.render());

    if let Some(cluster) = cluster.take() {
        let stopping = Instant::now();
        drop(cluster);
        println!("stopped and removed the throwaway cluster in {:.2} s", stopping.elapsed().as_secs_f64());
    }
    println!("total          {:.2} s", started.elapsed().as_secs_f64());
    if report.passed() {
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!("demo: FAILED: the report above shows what is missing");
        Ok(ExitCode::FAILURE)
    }
}

/// Host and database of a URL, never its password.
fn describe(url: &str) -> String {
    match adk_postgres_connect::ConnectConfig::from_url(url) {
        Ok(config) => {
            let config = config.driver();
            let hosts: Vec<String> = config
                .get_hosts()
                .iter()
                .map(|host| match host {
                    tokio_postgres::config::Host::Tcp(name) => name.clone(),
                    tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
                })
                .collect();
            format!("database {} on {}", config.get_dbname().unwrap_or("(default)"), hosts.join(","))
        }
        Err(_) => "unparsable URL".to_owned(),
    }
}

async fn create_database(server_url: &str, name: &str) -> anyhow::Result<()> {
    let (client, connection) = adk_postgres_connect::ConnectConfig::from_url(server_url)?
        .connect()
        .await
        .map(|c| (c.client, c.connection))
        .context("connecting to the cluster")?;
    let connection = tokio::spawn(connection);
    client.batch_execute(&format!("CREATE DATABASE \"{name}\"")).await.with_context(|| format!("creating {name}"))?;
    drop(client);
    let _ = connection.await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> anyhow::Result<Option<Args>> {
        parse_args(line.split_whitespace().map(String::from))
    }

    #[test]
    fn arguments() {
        let args = parse("").unwrap().unwrap();
        assert_eq!((args.users, args.turns), (DEFAULT_USERS, DEFAULT_TURNS));
        let args = parse("--users 5 --turns=2").unwrap().unwrap();
        assert_eq!((args.users, args.turns), (5, 2));
        assert!(parse("--help").unwrap().is_none());
        assert!(parse("--users 0").is_err());
        assert!(parse("--users").is_err());
        assert!(parse("--fast").is_err());
    }
}
