//! `cargo xtask …`: the project's development commands (see `flags::USAGE`).

mod bench;
mod ci;
mod citus;
mod db;
mod demo;
mod flags;
mod migrate;
mod project;
mod release;
mod schema;
mod test;

use std::process::ExitCode;

use flags::Command;

fn main() -> ExitCode {
    let result = flags::parse(std::env::args().skip(1)).and_then(|command| match command {
        Command::Db(action) => db::run(action),
        Command::Demo { args } => demo::run(&args),
        Command::Migrate => migrate::run(),
        Command::Schema => schema::run(),
        Command::Test { server_bin_dir, args } => test::run(&args, server_bin_dir.as_deref()).map(|run| run.code),
        Command::Bench { args } => bench::run(&args),
        Command::Citus(action) => citus::run(action),
        Command::Release => release::run(),
        Command::Ci => ci::run(),
        Command::Help => {
            print!("{}", flags::USAGE);
            Ok(ExitCode::SUCCESS)
        }
    });
    result.unwrap_or_else(|error| {
        eprintln!("xtask: {error:#}");
        ExitCode::FAILURE
    })
}
