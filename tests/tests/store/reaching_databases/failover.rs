//! A primary that crashes and a standby promoted in its place. The primary
//! replicates synchronously (`synchronous_standby_names`), so a commit is
//! acknowledged only once the standby has flushed it; the store connects
//! with a two-host URL and `target_session_attrs=read-write`, as a client of
//! Patroni or of a managed service's failover would.
//!
//! Pinned, three times over: eight writers through adk-rust's trait resume
//! on the new primary without a restart of the service, and not one
//! acknowledged append is missing from it, duplicated or out of order.

use std::sync::Arc;
use std::time::{Duration, Instant};

use adk_postgres_adk::PgSessionService;
use adk_postgres_domain::StoreConfig;
use adk_postgres_storage::{PgSessionStore, PoolConfig};
use adk_postgres_testing::{ReplicatedPair, connect, test_database_on};

use super::writers::{Audit, Crowd, audit};

const WRITERS: usize = 8;
const APP: &str = "failover";
const ROUNDS: usize = 3;

async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(work).await.expect("blocking task")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promoted_standby_takes_over_and_nothing_acknowledged_is_lost() {
    let mut figures = Vec::new();
    for round in 1..=ROUNDS {
        let pair = blocking(|| ReplicatedPair::start(true)).await.expect("a primary with a synchronous standby");
        // The per-test database borrows its cluster for the rest of the
        // process; the harness's watchdog removes both servers at its end.
        let pair: &'static ReplicatedPair = Box::leak(Box::new(pair));
        let db = test_database_on(pair.primary()).await;
        let url = format!("{}&connect_timeout=2", pair.two_host_url(db.name()).expect("the two-host URL"));
        let pool = PoolConfig {
            operation_timeout: Duration::from_secs(5),
            connection_timeout: Duration::from_secs(5),
            ..PoolConfig::default()
        };
        let store = PgSessionStore::connect(&url, &pool, StoreConfig::default()).await.expect("the store");
        let crowd = Crowd::start(Arc::new(PgSessionService::from_store(store)), APP, WRITERS);
        assert!(crowd.resumed(Instant::now(), Duration::from_secs(10)).await.is_some(), "writers started");
        tokio::time::sleep(Duration::from_secs(1)).await;

        let crash = Instant::now();
        blocking(move || pair.crash_primary()).await.expect("crash the primary");
        blocking(move || pair.promote_standby()).await.expect("promote the standby");
        let promoted = crash.elapsed();
        let resume = crowd.resumed(crash, Duration::from_secs(30)).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let writers = crowd.stop().await;
        let resume = resume.expect("every writer acknowledges again on the new primary");

        let fatal: Vec<_> = writers.iter().filter_map(|w| w.fatal.clone()).collect();
        assert!(fatal.is_empty(), "round {round}: non-retryable errors: {fatal:?}");
        let standby = pair.standby().expect("the standby");
        let new_primary = connect(&standby.database_url(db.name())).await.expect("the new primary");
        let in_recovery: bool =
            new_primary.query_one("SELECT pg_is_in_recovery()", &[]).await.expect("recovery").get(0);
        assert!(!in_recovery, "the standby was promoted");
        let Audit { lost, duplicated } = audit(&new_primary, APP, &writers).await;
        let acknowledged: usize = writers.iter().map(|w| w.acknowledged.len()).sum();
        let retries: usize = writers.iter().map(|w| w.retries).sum();
        let after: usize = writers.iter().map(|w| w.acknowledged.iter().filter(|(_, at)| *at > crash).count()).sum();
        figures.push(format!(
            "round {round}: {acknowledged} acknowledged ({after} after the crash), {retries} retries, promoted \
             {promoted:.2?} after the crash, every writer resumed {resume:.2?} after it; lost {lost}, \
             duplicated {duplicated}"
        ));
        assert_eq!(lost, 0, "round {round}: an acknowledged append is missing on the new primary");
        assert_eq!(duplicated, 0, "round {round}: an append is stored twice");
        assert!(after > 0, "round {round}: nothing was acknowledged on the new primary");
        // The old primary's server is gone; the database goes with the
        // servers when the process ends.
        std::mem::forget(db);
    }
    eprintln!("failover:\n  {}", figures.join("\n  "));
}
