//! The SessionService contract suite (tests/suite/mod.rs) against:
//! - our adapter on the PostgreSQL store (each test on its own migrated
//!   database) and on the in-memory reference store: every case;
//! - the same as a bound service role, the way production runs it: a role
//!   that owns nothing and holds no table privilege, bound to every app,
//!   acting per request: every case;
//! - adk-session's own `InMemorySessionService`: the `core` cases, which
//!   hold the suite itself to the trait's documented behaviour.
//!
//! The opt-in comparison with adk-session's `PostgresSessionService` is
//! tests/compare_builtin.rs (feature `compare-builtin`).
#![cfg(feature = "postgres")]

#[macro_use]
mod suite;

use std::ops::Deref;
use std::sync::Arc;

use adk_postgres_adk::PgSessionService;
use adk_postgres_adk::domain::InMemoryStore;
use adk_postgres_adk::storage::{PgSessionStore, PoolConfig, TenantScope};
use adk_postgres_storage::tenancy::{AppBinding, ServiceRoleOptions, setup_service_role};
use adk_postgres_testing::{TestDatabase, test_database};
use adk_session::InMemorySessionService;
use suite::Service;

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
with_cases!(all_cases! { ours_memory, super::ours_in_memory().await; });
with_cases!(core_cases! { adk_in_memory, super::adk_in_memory().await; });
