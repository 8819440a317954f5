//! `adk-postgres-bench`: the store measured against the raw-SQL floor
//! (pgbench running our own SQL) and against adk-session's built-in
//! `PostgresSessionService`, in one run on one cluster. Run it with
//! `cargo xtask bench` (add `--quick` for the smoke test).
//!
//! Every implementation gets a database of its own on the same server, is
//! reached over the same transport (plaintext, whatever the server offers:
//! see `server`), and every workload runs on all of them round by round, so
//! the ratios compare like with like even where absolute timings are noisy.
//! What TLS would change is measured apart, on our store alone (`tls`).
//! The reads section (`reads`, `--reads`) judges issue 37's targets for
//! gets and listings, ours over TLS included; a full run judges them too,
//! from its own rows.

mod archive;
mod citus;
mod cpu;
mod crowd;
mod driver;
mod erase;
mod feed;
mod floor;
mod labels;
mod lease;
mod measure;
mod media;
mod ops;
mod paging;
mod pgstat;
mod protocol;
mod reads;
mod report;
mod retention;
mod rollup;
mod run;
mod server;
mod tls;
mod toast;
mod workload;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Parser;

// The bench binary only: the library crates leave the allocator to the
// application that links them. Every report says which one ran.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Benchmarks adk-postgres against the raw-SQL floor and adk-session.
#[derive(Debug, Parser)]
#[command(name = "adk-postgres-bench", version)]
struct Args {
    /// A reduced run (well under a minute): a smoke test, its figures only indicative.
    #[arg(long)]
    quick: bool,
    /// A maintenance database on the server to use (the bench creates and
    /// drops its own databases there); without it the bench starts a
    /// throwaway cluster with durable settings.
    #[arg(long, env = "DATABASE_URL")]
    database_url: Option<String>,
    /// Where the JSON report and pgbench's scripts and logs go.
    #[arg(long)]
    out_dir: Option<PathBuf>,
    /// Instead: append, get and list on a throwaway Citus cluster (a
    /// coordinator and two workers) against a throwaway single server
    /// (`cargo xtask citus bench`); JSON in OUT_DIR/citus.json.
    #[arg(long)]
    citus: bool,
    /// Instead: only the media section (16 images of 1 MB in a session,
    /// against media inline and adk-session; one image in 100 sessions);
    /// JSON in OUT_DIR/media.json (media-quick.json with --quick).
    #[arg(long, conflicts_with = "citus")]
    media: bool,
    /// Instead: only the TOAST section (adk_events.payload compressed with
    /// pglz against lz4, agent events of ~4 KB); JSON in
    /// OUT_DIR/toast.json (toast-quick.json with --quick).
    #[arg(long, conflicts_with_all = ["citus", "media"])]
    toast: bool,
    /// Instead: only the archive section (a day of 1,000,000 events of
    /// ~4 kB archived by `adk-pg maintain`, restored; a user erased from
    /// 30 archived days); JSON in OUT_DIR/archive.json (archive-quick.json
    /// with --quick).
    #[arg(long, conflicts_with_all = ["citus", "media", "toast"])]
    archive: bool,
    /// Instead: only the reads section (get of 40 and of 1,000 events,
    /// list of 100 sessions, through the adk trait: ours, adk-session, ours
    /// over TLS; issue 37's targets); JSON in OUT_DIR/reads.json
    /// (reads-quick.json with --quick).
    #[arg(long, conflicts_with_all = ["citus", "media", "toast", "archive"])]
    reads: bool,
}

/// Prints a section's report and writes it as JSON to OUT_DIR/NAME.json
/// (NAME-quick.json for a quick run); returns the file.
fn write_section<R>(report: &R, out_dir: &Path, name: &str, quick: bool) -> anyhow::Result<PathBuf>
where
    R: std::fmt::Display + serde::Serialize,
{
    println!("{report}");
    std::fs::create_dir_all(out_dir)?;
    let file = out_dir.join(if quick { format!("{name}-quick.json") } else { format!("{name}.json") });
    std::fs::write(&file, serde_json::to_string_pretty(report)?)?;
    println!("JSON: {}", file.display());
    Ok(file)
}

fn main() -> ExitCode {
    let args = Args::parse();
    if cfg!(debug_assertions) {
        eprintln!(
            "bench: this is a debug build: every workload runs, but its figures are not measurements \
             (`cargo xtask bench` builds the release profile)"
        );
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("bench: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let out_dir = args.out_dir.unwrap_or_else(run::default_out_dir);
    let options = run::Options {
        plan: if args.quick { workload::Plan::quick() } else { workload::Plan::full() },
        database_url: args.database_url.filter(|url| !url.trim().is_empty()),
        out_dir: out_dir.clone(),
    };
    let result = runtime.block_on(async {
        if args.citus {
            let plan = if args.quick { citus::CitusPlan::quick() } else { citus::CitusPlan::full() };
            return citus::run(plan, &out_dir).await;
        }
        let quick = options.plan.quick;
        if args.media {
            return write_section(&run::run_media(options).await?, &out_dir, "media", quick);
        }
        if args.toast {
            return write_section(&run::run_toast(options).await?, &out_dir, "toast", quick);
        }
        if args.archive {
            return write_section(&run::run_archive(options).await?, &out_dir, "archive", quick);
        }
        if args.reads {
            return write_section(&run::run_reads(options).await?, &out_dir, "reads", quick);
        }
        let report = run::run(options).await?;
        run::write_outputs(&report, &out_dir)
    });
    // The throwaway cluster is stopped when the runtime's tasks are gone.
    runtime.shutdown_timeout(std::time::Duration::from_secs(5));
    match result {
        Ok(_) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("bench: {error:#}");
            ExitCode::FAILURE
        }
    }
}
