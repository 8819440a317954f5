//! Test support for adk-postgres: a real PostgreSQL for every test.
//!
//! [`test_database`] gives each test a database of its own, freshly migrated:
//! the workspace migrations run once per run into a template database, and
//! every test gets a `CREATE DATABASE … TEMPLATE … STRATEGY FILE_COPY` clone,
//! dropped `WITH (FORCE)` when the [`TestDatabase`] goes. Tests therefore
//! never share mutable state and run in parallel, as threads (`cargo test`)
//! or as processes (nextest). [`empty_database`] is the same without the
//! migrations, for testing the migrations themselves.
//!
//! The server comes from, in order:
//! 1. `ADK_PG_TEST_URL`, a URL of a maintenance database on a server where the
//!    tests may create databases (`cargo xtask test` starts one cluster and
//!    sets it for every test process);
//! 2. a throwaway cluster this process starts from local server binaries
//!    (`ADK_PG_SERVER_BIN_DIR`'s folder, else `pg_config --bindir`, else the
//!    newest `/usr/lib/postgresql/*/bin`), gone when the process exits,
//!    however it exits;
//! 3. with the `testcontainers` feature, a Docker container;
//! 4. else the first test panics saying what to install or set.
//!
//! Clusters the harness starts run in the `Pacific/Kiritimati` time zone
//! (UTC+14) so that code reading the server's TimeZone instead of UTC fails
//! here rather than in production, and with fsync off because nothing in
//! them must survive a crash.
//!
//! A test that needs what a build may lack (TLS, lz4) asks
//! [`skip_without`] first, and on a server without it ends early, saying
//! why; the decision is the server's answer, never its version number.
//!
//! [`connect`] is how tests open a plain client beside the store (it returns
//! an error rather than panicking, so tooling can use it too), and
//! [`contract_tests!`] runs a contract suite's cases against one backend.
//!
//! [`WireProxy`] is every PostgreSQL wire proxy a test or the bench needs:
//! in front of a server, it cuts connections without telling either end,
//! counts round trips, and on request records the statements or the bytes
//! clients send.
//!
//! [`S3Server`] is moto's S3 server for the archive tests and [`duckdb_json`]
//! reads what they archived with DuckDB; both run from a Python venv the
//! harness makes once (or `.ci/run` makes on CI, see [`python_tools`]).
//!
//! This crate is for tests and tooling (`xtask`) only: nothing the store
//! ships may depend on it, and it knows nothing of table layout beyond the
//! partition function the migrations provide.

mod capability;
mod citus;
mod client;
mod cluster;
#[cfg(feature = "testcontainers")]
mod container;
mod contract;
mod database;
mod error;
mod media;
mod pgbouncer;
mod python_tools;
mod s3;
mod source;
mod standby;
mod tls;
mod urls;
mod wire_proxy;

pub use capability::{Capability, SKIP_LOG_VAR, record_skip, server_has, skip_without};
pub use citus::{
    CITUS_WORKERS_VAR, CitusCluster, citus_installed, create_citus_database, start_throwaway_citus_cluster,
};
pub use client::{Notices, connect, connect_with_notices, drain_notices};
pub use cluster::{
    Cluster, ClusterConfig, SERVER_TIMEZONE, find_server_binaries, free_port, port_is_free, server_binaries_version,
    start_throwaway_cluster, start_throwaway_cluster_from,
};
pub use database::{TestDatabase, empty_database, test_database, test_database_on};
pub use error::HarnessError;
pub use media::media_bytes;
pub use pgbouncer::{PgBouncer, PgBouncerConfig, PoolMode};
pub use python_tools::{PYTHON_TOOLS_VAR, PythonTools, duckdb_json, python_tools};
pub use s3::{S3_BUCKET, S3Server};
pub use source::{SERVER_BIN_DIR_VAR, TEST_URL_VAR};
pub use standby::{ReplicatedPair, STANDBY_NAME};
pub use tls::{ServerCert, TestPki, TlsOptions, start_throwaway_tls_cluster};
pub use wire_proxy::{Statement, Traffic, WireProxy, WireProxyBuilder};

/// Eight random hex digits, so names made on two hosts sharing a server
/// (same pid, same counter) still differ.
pub(crate) fn short_random() -> String {
    let mut random = uuid::Uuid::new_v4().simple().to_string();
    random.truncate(8);
    random
}
