//! The SessionService contract suite (`suite.rs`) against:
//! - our adapter on the PostgreSQL store (each test on its own migrated
//!   database) and on the in-memory reference store: every case;
//! - the same as a bound service role, the way production runs it: a role
//!   that owns nothing and holds no table privilege, bound to every app,
//!   acting per request: every case;
//! - the PostgreSQL store over verified TLS (`sslmode=verify-full` against
//!   the server's CA), every session of its pool checked to be encrypted:
//!   every case (each ends early, saying so, on a server built without
//!   SSL);
//! - the PostgreSQL store through a real PgBouncer in transaction mode
//!   with fewer server connections (4) than the store's pool (16), so a
//!   store connection's statements land on server connections other
//!   clients also use: every case;
//! - adk-session's own `InMemorySessionService`: the `core` cases, which
//!   hold the suite itself to the trait's documented behaviour.
//!
//! The opt-in comparison with adk-session's `PostgresSessionService` is
//! `compare_builtin.rs` (feature `compare-builtin`).
#![cfg(feature = "postgres")]

use std::ops::Deref;
use std::sync::Arc;

use crate::suite::Service;
use adk_postgres_adk::PgSessionService;
use adk_postgres_adk::domain::InMemoryStore;
use adk_postgres_adk::storage::{PgSessionStore, PoolConfig, SslMode, TenantScope};
use adk_postgres_storage::tenancy::{AppBinding, ServiceRoleOptions, setup_service_role};
use adk_postgres_testing::{PgBouncer, PgBouncerConfig, TestDatabase, test_database};
use adk_session::InMemorySessionService;
use tokio::sync::OnceCell;

/// What a case runs against: a service, and the database under it, which
/// must outlive the case.
struct Backend {
    service: Service,
    _db: Option<TestDatabase>,
}

impl Deref for Backend {
    type Target = Service;

    fn deref(&self) -> &Service {
        &self.service
    }
}

async fn ours_on_postgres() -> Backend {
    let db = test_database().await;
    let store = PgSessionStore::connect(db.url(), &PoolConfig::default(), Default::default())
        .await
        .unwrap_or_else(|e| panic!("connecting to {}: {e}", db.url()));
    Backend { service: Arc::new(PgSessionService::from_store(store)), _db: Some(db) }
}

async fn ours_as_service_role() -> Backend {
    let db = test_database().await;
    let role = format!("adk_adapter_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let options = ServiceRoleOptions { create: true, password: None, apps: AppBinding::AllApps };
    setup_service_role(db.url(), &role, &options).await.unwrap_or_else(|e| panic!("setting up {role}: {e}"));
    let mut url = url::Url::parse(db.url()).expect("test URL");
    url.set_username(&role).expect("set user");
    let store = PgSessionStore::connect(url.as_str(), &PoolConfig::default(), Default::default())
        .await
        .unwrap_or_else(|e| panic!("connecting as {role}: {e}"))
        .with_tenant_scope(TenantScope::PerRequest);
    Backend { service: Arc::new(PgSessionService::from_store(store)), _db: Some(db) }
}

async fn ours_over_tls() -> Backend {
    let db = test_database().await;
    let url = db.tls_url().await.unwrap_or_else(|e| panic!("a TLS URL of the test server: {e}"));
    let store = PgSessionStore::connect(&url, &PoolConfig::default(), Default::default())
        .await
        .unwrap_or_else(|e| panic!("connecting over TLS to {url}: {e}"));
    assert_eq!(store.pool().connect_config().ssl_mode(), SslMode::VerifyFull, "{url}");
    // verify-full never falls back to plaintext; the server says so too.
    let sql = adk_postgres_testing::connect(db.url()).await.expect("a direct client");
    let row = sql
        .query_one(
            "SELECT count(*), count(*) FILTER (WHERE s.ssl) FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
             WHERE a.datname = current_database() AND a.application_name = 'adk-postgres'",
            &[],
        )
        .await
        .expect("pg_stat_ssl");
    let (sessions, encrypted): (i64, i64) = (row.get(0), row.get(1));
    assert!(sessions > 0 && encrypted == sessions, "{encrypted} of the store's {sessions} sessions use TLS");
    Backend { service: Arc::new(PgSessionService::from_store(store)), _db: Some(db) }
}

/// The test process's PgBouncer (nextest runs each test in a process of
/// its own): transaction mode, 4 server connections per database and
/// user, the harness's superuser let in; ended by its watchdog with the
/// process.
async fn bouncer(db: &TestDatabase) -> (&'static PgBouncer, String) {
    static BOUNCER: OnceCell<PgBouncer> = OnceCell::const_new();
    let url = url::Url::parse(db.url()).expect("test URL");
    let user = match url.username() {
        "" => "postgres".to_owned(),
        user => user.to_owned(),
    };
    let mut config = PgBouncerConfig::new(url.port().unwrap_or(5432));
    config.users = vec![user.clone()];
    let bouncer = BOUNCER
        .get_or_init(|| async move {
            // Starting it waits on its port with blocking sleeps.
            tokio::task::spawn_blocking(move || PgBouncer::start(&config))
                .await
                .expect("starting PgBouncer panicked")
                .unwrap_or_else(|e| panic!("starting PgBouncer: {e}"))
        })
        .await;
    (bouncer, user)
}

async fn ours_through_pgbouncer() -> Backend {
    let db = test_database().await;
    let (bouncer, user) = bouncer(&db).await;
    let url = bouncer.url_for(db.name(), &user);
    let pool = PoolConfig::default();
    assert!(pool.max_size > PgBouncerConfig::new(0).default_pool_size, "more store connections than server ones");
    let store = PgSessionStore::connect(&url, &pool, Default::default())
        .await
        .unwrap_or_else(|e| panic!("connecting through PgBouncer ({url}): {e}\n{}", bouncer.log_tail()));
    // PgBouncer refuses startup options, which only a pooler does: proof
    // that the store's connections go through it.
    assert!(store.pool().connect_config().pooler_refused_settings(), "{url} did not reach PgBouncer");
    Backend { service: Arc::new(PgSessionService::from_store(store)), _db: Some(db) }
}

async fn ours_in_memory() -> Backend {
    Backend { service: Arc::new(PgSessionService::from_store(InMemoryStore::new())), _db: None }
}

async fn adk_in_memory() -> Backend {
    Backend { service: Arc::new(InMemorySessionService::new()), _db: None }
}

/// Every case, core and strict: for our adapter.
macro_rules! all_cases {
    ($module:ident, $backend:expr; core: [$($core:ident),* $(,)?] strict: [$($strict:ident),* $(,)?]) => {
        mod $module {
            adk_postgres_testing::contract_tests!(crate::suite => $backend; $($core,)* $($strict,)*);
        }
    };
}

/// Every case, on a server that has `$capability`: for a backend that needs
/// what a server build may lack.
macro_rules! all_cases_requiring {
    ($module:ident, $capability:expr, $backend:expr; core: [$($core:ident),* $(,)?] strict: [$($strict:ident),* $(,)?]) => {
        mod $module {
            adk_postgres_testing::contract_tests!(crate::suite => $backend, requires $capability; $($core,)* $($strict,)*);
        }
    };
}

/// The core cases only: for adk-session's own services, which the strict
/// cases are known to fail.
macro_rules! core_cases {
    ($module:ident, $backend:expr; core: [$($core:ident),* $(,)?] strict: [$($strict:ident),* $(,)?]) => {
        mod $module {
            adk_postgres_testing::contract_tests!(crate::suite => $backend; $($core,)*);
        }
    };
}

with_cases!(all_cases! { ours_postgres, super::ours_on_postgres().await; });
with_cases!(all_cases! { ours_service_role, super::ours_as_service_role().await; });
with_cases!(all_cases_requiring! { ours_tls, adk_postgres_testing::Capability::Tls, super::ours_over_tls().await; });
with_cases!(all_cases! { ours_pgbouncer, super::ours_through_pgbouncer().await; });
with_cases!(all_cases! { ours_memory, super::ours_in_memory().await; });
with_cases!(core_cases! { adk_in_memory, super::adk_in_memory().await; });
