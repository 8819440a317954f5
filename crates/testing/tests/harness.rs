//! The harness against a real server: isolated, migrated, partitioned
//! databases that are really gone afterwards.

use std::path::PathBuf;
use std::sync::OnceLock;

use adk_postgres_testing::{
    Capability, Cluster, SERVER_BIN_DIR_VAR, SERVER_TIMEZONE, TestDatabase, empty_database, find_server_binaries,
    server_binaries_version, server_has, start_throwaway_cluster, test_database, test_database_on,
};

async fn partition_count(db: &TestDatabase) -> i64 {
    let client = db.connect().await;
    client
        .query_one("SELECT count(*) FROM pg_inherits WHERE inhparent = 'adk_events'::regclass", &[])
        .await
        .expect("adk_events exists")
        .get(0)
}

async fn database_exists(server_url: &str, name: &str) -> bool {
    let client = adk_postgres_testing::connect(server_url)
        .await
        .unwrap_or_else(|e| panic!("the maintenance database accepts connections: {e}"));
    client.query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&name]).await.unwrap().is_some()
}

/// Two databases of one test are migrated, carry yesterday … a week ahead of
/// partitions, and do not see each other's writes.
async fn databases_are_migrated_and_isolated() {
    let (a, b) = tokio::join!(test_database(), test_database());
    assert_ne!(a.name(), b.name());
    assert_ne!(a.url(), b.url());
    assert!(partition_count(&a).await >= 9);
    assert!(partition_count(&b).await >= 9);

    let client_a = a.connect().await;
    client_a.batch_execute("CREATE TABLE only_in_a (x int)").await.unwrap();
    let client_b = b.connect().await;
    let seen = client_b.query_opt("SELECT 1 FROM pg_class WHERE relname = 'only_in_a'", &[]).await.unwrap();
    assert!(seen.is_none(), "{} sees a table made in {}", b.name(), a.name());

    if let Some(cluster) = a.cluster() {
        let zone: String = client_a.query_one("SHOW TimeZone", &[]).await.unwrap().get(0);
        assert_eq!(zone, SERVER_TIMEZONE, "a harness cluster runs far from UTC");
        assert!(cluster.data_dir().join("PG_VERSION").is_file());
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn parallel_databases_one() {
    databases_are_migrated_and_isolated().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn parallel_databases_two() {
    databases_are_migrated_and_isolated().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dropped_database_is_gone() {
    let db = test_database().await;
    let (server_url, name) = (db.server_url().to_owned(), db.name().to_owned());
    // An open session must not keep it alive: the drop is WITH (FORCE).
    let _client = db.connect().await;
    assert!(database_exists(&server_url, &name).await);
    drop(db);
    assert!(!database_exists(&server_url, &name).await, "{name} is still there");
}

#[tokio::test]
async fn an_empty_database_has_no_migrations() {
    let db = empty_database().await;
    let client = db.connect().await;
    let tables: i64 = client
        .query_one("SELECT count(*) FROM pg_class WHERE relname IN ('adk_events', '__diesel_schema_migrations')", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(tables, 0);
}

/// Drop also works where no runtime is around, e.g. in a plain #[test].
#[test]
fn a_database_can_be_dropped_outside_a_runtime() {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let db = runtime.block_on(test_database());
    let (server_url, name) = (db.server_url().to_owned(), db.name().to_owned());
    drop(db);
    assert!(!runtime.block_on(database_exists(&server_url, &name)));
}

/// A test that restarts PostgreSQL gets a cluster of its own, so tests
/// running beside it (threads or nextest processes) never see the restart.
#[tokio::test(flavor = "multi_thread")]
async fn a_private_cluster_survives_a_restart() {
    static PRIVATE: OnceLock<Cluster> = OnceLock::new();
    let cluster = PRIVATE.get_or_init(|| start_throwaway_cluster().expect("a private cluster starts"));
    let db = test_database_on(cluster).await;
    assert!(std::ptr::eq(db.cluster().unwrap(), cluster));
    assert!(partition_count(&db).await >= 9);

    let client = db.connect().await;
    client.batch_execute("CREATE TABLE kept (x int); INSERT INTO kept VALUES (1)").await.unwrap();
    let restart = tokio::task::spawn_blocking(|| PRIVATE.get().unwrap().restart_fast());
    restart.await.unwrap().expect("pg_ctl restart");
    assert!(client.is_closed() || client.simple_query("SELECT 1").await.is_err(), "the restart ended the session");

    let client = db.connect().await;
    let kept: i64 = client.query_one("SELECT count(*) FROM kept", &[]).await.unwrap().get(0);
    assert_eq!(kept, 1);
    assert!(cluster.is_running());
    assert!(cluster.bin_dir().join("pg_ctl").is_file());
}

/// The server the tests run on is the build they were pointed at: with
/// `ADK_PG_SERVER_BIN_DIR` set (`cargo xtask test` sets it to the binaries
/// it started its cluster from, `--server-bin-dir` to another version's)
/// the server reports that folder's `postgres --version`, so a run meant
/// for another PostgreSQL cannot quietly run on the default one.
#[tokio::test(flavor = "multi_thread")]
async fn the_server_is_the_version_of_the_binaries_named() {
    let db = test_database().await;
    let client = db.connect().await;
    let shown: String = client.query_one("SHOW server_version", &[]).await.unwrap().get(0);
    let running = shown.split_whitespace().next().expect("a version").to_owned();
    let named = std::env::var_os(SERVER_BIN_DIR_VAR).filter(|dir| !dir.is_empty()).map(PathBuf::from);
    let bin_dir = match (named, db.cluster()) {
        (Some(named), _) => {
            let found = find_server_binaries().expect("the named binaries");
            assert_eq!(found, named, "the harness starts its clusters from {SERVER_BIN_DIR_VAR}");
            named
        }
        (None, Some(cluster)) => cluster.bin_dir().to_path_buf(),
        (None, None) => {
            eprintln!("a server given by URL and no {SERVER_BIN_DIR_VAR}: no binaries to compare it with");
            return;
        }
    };
    let expected = server_binaries_version(&bin_dir).expect("postgres --version");
    assert_eq!(running, expected, "the server at {} is not the PostgreSQL in {}", db.server_url(), bin_dir.display());
    if let Some(cluster) = db.cluster() {
        assert_eq!(cluster.bin_dir(), bin_dir);
        assert_eq!(cluster.server_version().expect("SHOW server_version"), expected);
    }
}

/// A throwaway cluster has TLS exactly when its build has SSL, so a test
/// asking whether it may use TLS gets the same answer from the server as
/// from the harness.
#[tokio::test(flavor = "multi_thread")]
async fn a_throwaway_cluster_has_tls_exactly_when_its_build_has_ssl() {
    let cluster = tokio::task::spawn_blocking(start_throwaway_cluster).await.unwrap().expect("a cluster");
    let has_ssl = server_has(&cluster.server_url(), Capability::Tls).await.expect("ssl_library");
    assert_eq!(cluster.ca_file().is_some(), has_ssl, "ca_file {:?}", cluster.ca_file());
    let client = adk_postgres_testing::connect(&cluster.server_url()).await.unwrap();
    let ssl: String = client.query_one("SHOW ssl", &[]).await.unwrap().get(0);
    assert_eq!(ssl == "on", has_ssl);
}
