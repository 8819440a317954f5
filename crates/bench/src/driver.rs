//! The implementations under test, behind one set of operations.
//!
//! `ours` and `adk-session` both go through `adk_session::SessionService`,
//! the trait an adk-rust `Runner` calls. `ours (store)` calls our
//! `SessionStore` trait directly, which tells how much of a difference is
//! the store and how much the adapter.

use std::sync::Arc;

use adk_core::identity::{AdkIdentity, AppName, SessionId, UserId};
use adk_postgres_adk::PgSessionService;
use adk_postgres_domain::{
    AppName as StoreApp, AppendOptions, CreateSession, GetOptions, ListSessions, SessionKey, SessionStore,
    UserId as StoreUser,
};
use adk_postgres_storage::{PgSessionStore, PoolConfig, TenantScope};
use adk_session::{AppendEventRequest, CreateRequest, Event, GetRequest, ListRequest, SessionService};
use anyhow::{Context as _, anyhow};

use crate::workload::{APP, initial_state};

/// Connections each implementation's pool may open: more than the
/// concurrency of any workload, so no workload waits for a connection.
pub const POOL_SIZE: u32 = 16;

/// Which implementation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Peer {
    /// pgbench running the leanest SQL that keeps our guarantees on our
    /// schema: what the database does, with no client cost and none of our
    /// SQL functions' overhead. The floor the targets are judged against.
    Floor,
    /// pgbench running our own SQL functions: the database's share of our
    /// cost, a second reference.
    Functions,
    /// Our store through our adk adapter (`adk_session::SessionService`).
    Ours,
    /// Our store through our `SessionStore` trait.
    OursStore,
    /// adk-session 2.3's `PostgresSessionService` (sqlx).
    AdkSession,
}

impl Peer {
    pub const ALL: [Peer; 5] = [Peer::Floor, Peer::Functions, Peer::Ours, Peer::OursStore, Peer::AdkSession];

    pub fn label(self) -> &'static str {
        match self {
            Peer::Floor => "floor (lean SQL, pgbench)",
            Peer::Functions => "our SQL functions (pgbench)",
            Peer::Ours => "ours (adk trait)",
            Peer::OursStore => "ours (store trait)",
            Peer::AdkSession => "adk-session",
        }
    }

    /// Its own database.
    pub fn database(self) -> &'static str {
        match self {
            Peer::Floor => "adk_bench_floor",
            Peer::Functions => "adk_bench_functions",
            Peer::Ours => "adk_bench_ours",
            Peer::OursStore => "adk_bench_ours_store",
            Peer::AdkSession => "adk_bench_adk_session",
        }
    }

    /// Whether pgbench drives it (no client library of ours).
    pub fn is_pgbench(self) -> bool {
        matches!(self, Peer::Floor | Peer::Functions)
    }

    /// Whether it uses our schema (the floor and ours) or adk-session's.
    pub fn our_schema(self) -> bool {
        self != Peer::AdkSession
    }
}

/// An event ready to append, converted outside the timed section.
#[derive(Debug, Clone)]
pub enum Prepared {
    Adk(Box<Event>),
    Store(Box<adk_postgres_domain::Event>),
}

/// A client of one implementation.
#[derive(Clone)]
pub enum Driver {
    Service(Arc<dyn SessionService>),
    Store(PgSessionStore),
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Driver::Service(_) => f.write_str("Driver::Service"),
            Driver::Store(store) => f.debug_tuple("Driver::Store").field(store).finish(),
        }
    }
}

pub fn pool_config() -> PoolConfig {
    PoolConfig { max_size: POOL_SIZE, application_name: "adk-postgres-bench".to_owned(), ..PoolConfig::default() }
}

impl Driver {
    /// Connects `peer` (not the floor) to the database at `url`.
    pub async fn connect(peer: Peer, url: &str) -> anyhow::Result<Self> {
        Self::connect_with(peer, url, &pool_config()).await
    }

    /// [`Driver::connect`] with our pools configured as `config` (a name of
    /// their own tells a driver's connections apart in `pg_stat_activity`);
    /// adk-session keeps its own pool.
    pub async fn connect_with(peer: Peer, url: &str, config: &PoolConfig) -> anyhow::Result<Self> {
        Ok(match peer {
            Peer::Floor | Peer::Functions => return Err(anyhow!("{} is driven by pgbench", peer.label())),
            Peer::Ours => Driver::Service(Arc::new(PgSessionService::from_store(
                PgSessionStore::connect(url, config, Default::default())
                    .await
                    .context("connecting our adk service")?
                    .with_tenant_scope(TenantScope::PerRequest),
            ))),
            Peer::OursStore => Driver::Store(
                PgSessionStore::connect(url, config, Default::default())
                    .await
                    .context("connecting our store")?
                    .with_tenant_scope(TenantScope::PerRequest),
            ),
            Peer::AdkSession => {
                // Its own constructor and sqlx's default pool (10 connections,
                // more than any workload's concurrency), as a user would.
                let service = adk_session::PostgresSessionService::new(url)
                    .await
                    .map_err(|e| anyhow!("{e}"))
                    .context("connecting adk-session's PostgresSessionService")?;
                Driver::Service(Arc::new(service))
            }
        })
    }

    pub fn prepare(&self, event: Event) -> anyhow::Result<Prepared> {
        Ok(match self {
            Driver::Service(_) => Prepared::Adk(Box::new(event)),
            Driver::Store(_) => {
                Prepared::Store(Box::new(adk_postgres_adk::to_store_event(&event).map_err(|e| anyhow!("{e}"))?))
            }
        })
    }

    pub async fn create(&self, user: &str, session: &str) -> anyhow::Result<()> {
        match self {
            Driver::Service(service) => {
                service
                    .create(CreateRequest {
                        app_name: APP.to_owned(),
                        user_id: user.to_owned(),
                        session_id: Some(session.to_owned()),
                        state: initial_state(),
                    })
                    .await
                    .map_err(|e| anyhow!("create {user}/{session}: {e}"))?;
            }
            Driver::Store(store) => {
                let state = initial_state().into_iter().collect();
                store
                    .create(CreateSession::new(app(), store_user(user)?).with_id(session).with_state(state))
                    .await
                    .with_context(|| format!("create {user}/{session}"))?;
            }
        }
        Ok(())
    }

    pub async fn append(&self, user: &str, session: &str, event: Prepared) -> anyhow::Result<()> {
        match (self, event) {
            (Driver::Service(service), Prepared::Adk(event)) => {
                let identity = AdkIdentity {
                    app_name: AppName::try_from(APP)?,
                    user_id: UserId::try_from(user)?,
                    session_id: SessionId::try_from(session)?,
                };
                service
                    .append_event_for_identity(AppendEventRequest { identity, event: *event })
                    .await
                    .map_err(|e| anyhow!("append to {user}/{session}: {e}"))?;
            }
            (Driver::Store(store), Prepared::Store(event)) => {
                store
                    .append(&key(user, session)?, *event, AppendOptions::default())
                    .await
                    .with_context(|| format!("append to {user}/{session}"))?;
            }
            _ => return Err(anyhow!("an event prepared for another driver")),
        }
        Ok(())
    }

    /// Loads a session (the last `recent` events, or all); returns how many
    /// events came back.
    pub async fn get(&self, user: &str, session: &str, recent: Option<usize>) -> anyhow::Result<usize> {
        match self {
            Driver::Service(service) => {
                let loaded = service
                    .get(GetRequest {
                        app_name: APP.to_owned(),
                        user_id: user.to_owned(),
                        session_id: session.to_owned(),
                        num_recent_events: recent,
                        after: None,
                    })
                    .await
                    .map_err(|e| anyhow!("get {user}/{session}: {e}"))?;
                Ok(loaded.events().len())
            }
            Driver::Store(store) => {
                let loaded = store
                    .get(&key(user, session)?, GetOptions { num_recent_events: recent, after: None })
                    .await
                    .with_context(|| format!("get {user}/{session}"))?;
                Ok(loaded.events.len())
            }
        }
    }

    /// Lists every session of `user`; returns how many.
    pub async fn list(&self, user: &str) -> anyhow::Result<usize> {
        match self {
            Driver::Service(service) => Ok(service
                .list(ListRequest { app_name: APP.to_owned(), user_id: user.to_owned(), limit: None, offset: None })
                .await
                .map_err(|e| anyhow!("list {user}: {e}"))?
                .len()),
            Driver::Store(store) => {
                let mut request = ListSessions::new(app(), store_user(user)?);
                request.page_size = Some(adk_postgres_domain::session::MAX_PAGE_SIZE);
                Ok(store.list(&request).await.with_context(|| format!("list {user}"))?.sessions.len())
            }
        }
    }
}

fn app() -> StoreApp {
    StoreApp::new(APP).expect("a valid app name")
}

fn store_user(user: &str) -> anyhow::Result<StoreUser> {
    Ok(StoreUser::new(user)?)
}

fn key(user: &str, session: &str) -> anyhow::Result<SessionKey> {
    Ok(SessionKey::parse(APP, user, session)?)
}
