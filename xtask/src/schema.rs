//! `schema`: regenerate `crates/schema/src/tables.rs` from a freshly
//! migrated database (the test `schema_rs_matches_database` says when).

use std::process::ExitCode;

use anyhow::Context as _;

use crate::project;

pub fn run() -> anyhow::Result<ExitCode> {
    let runtime =
        tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting a tokio runtime")?;
    let rendered = runtime.block_on(async {
        let db = adk_postgres_testing::test_database().await;
        let mut conn = adk_postgres_connect::establish(db.url()).await.context("connecting to the test database")?;
        adk_postgres_schema::tables_print::render_schema(&mut conn).await.context("reading the schema")
    })?;
    let path = project::root().join("crates/schema/src/tables.rs");
    let current = std::fs::read_to_string(&path).unwrap_or_default();
    if current == rendered {
        println!("{} is up to date", path.display());
    } else {
        std::fs::write(&path, rendered).with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}
