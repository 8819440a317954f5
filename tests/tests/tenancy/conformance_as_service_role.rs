//! The conformance suite run as a bound service role: a login role that does
//! not own the store, holds no table privilege, and may act only for the apps
//! `setup_service_role` bound it to. It proves the SECURITY DEFINER store
//! functions, their binding checks and row-level security together keep the
//! whole contract for a tenant doing ordinary work, in both tenant scopes:
//!
//! * `per_request`: one `TenantScope::PerRequest` store on a role bound to
//!   every app (the cases' app names are random, so they cannot be bound in
//!   advance), as a trusted router serving many tenants from one pool runs;
//!   and `find_by_id`, which names no app, searching only a role's own apps.
//! * `fixed`: a store that routes each call to a `TenantScope::Fixed(app)`
//!   store of its own app, each on a role bound to exactly that app, made
//!   the first time a case touches the app. So every call runs as a role that
//!   could act for no other app, through a store that names its app itself.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use adk_postgres_domain::{
    AppName, AppSessionPage, AppendOptions, Appended, CreateSession, Erasure, Event, EventPage, EventsPage, GetOptions,
    ListAppSessions, ListSessions, RedactOptions, Redacted, Session, SessionId, SessionKey, SessionMetadata,
    SessionPage, SessionStore, State, StoreConfig, StoreError, UserId,
};
use adk_postgres_storage::tenancy::AppBinding;
use adk_postgres_storage::{PgSessionStore, TenantScope};
use adk_postgres_testing::{TestDatabase, test_database};
use adk_postgres_tests::conformance::StoreFactory;
use adk_postgres_tests::pg::{scoped_store, store};
use tokio::sync::{Mutex, OnceCell};

/// A service role bound to `apps`: the URL it logs in with.
async fn service_role(owner_url: &str, apps: AppBinding) -> String {
    adk_postgres_tests::pg::service_role(owner_url, "adk_svc", apps).await.1
}

// ---------------------------------------------------------------------------
// PerRequest, on a role bound to every app

/// One database per test; the store a case asks for is a `PerRequest` pool
/// of a role bound to all apps.
#[derive(Debug, Default)]
struct PerRequestFactory {
    db: OnceCell<TestDatabase>,
}

impl StoreFactory for PerRequestFactory {
    async fn store(&self, config: StoreConfig) -> Arc<dyn SessionStore> {
        let db = self.db.get_or_init(test_database).await;
        let url = service_role(db.url(), AppBinding::AllApps).await;
        Arc::new(scoped_store(&url, config, TenantScope::PerRequest).await)
    }
}

mod per_request {
    use super::PerRequestFactory;

    adk_postgres_tests::conformance_tests!(PerRequestFactory::default());
}

/// A `PerRequest` store knows no app before `find_by_id` looks, so it names
/// no tenant: a role then finds sessions of the apps it is bound to, and
/// only those, while the owner finds them all.
#[tokio::test(flavor = "multi_thread")]
async fn per_request_find_by_id_searches_the_roles_own_apps() {
    let db = test_database().await;
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    let (mine, theirs) = (format!("app-mine-{suffix}"), format!("app-theirs-{suffix}"));
    let owner = store(db.url()).await;
    let id = format!("shared-{suffix}");
    let mut keys = Vec::new();
    for app in [&mine, &theirs] {
        let request =
            CreateSession::new(AppName::new(app.as_str()).expect("app"), UserId::new("u1").expect("user")).with_id(&id);
        keys.push(owner.create(request).await.expect("create as the owner").key);
    }
    let id = SessionId::new(id).expect("id");

    let bound = service_role(db.url(), AppBinding::Apps(vec![mine.clone()])).await;
    let bound = scoped_store(&bound, StoreConfig::default(), TenantScope::PerRequest).await;
    assert_eq!(bound.find_by_id(&id, 5).await.expect("find"), vec![keys[0].clone()], "only its own app's session");

    let router = service_role(db.url(), AppBinding::AllApps).await;
    let router = scoped_store(&router, StoreConfig::default(), TenantScope::PerRequest).await;
    assert_eq!(router.find_by_id(&id, 5).await.expect("find").len(), 2, "a router bound to every app finds both");

    let unbound = service_role(db.url(), AppBinding::Keep).await;
    let unbound = scoped_store(&unbound, StoreConfig::default(), TenantScope::PerRequest).await;
    assert!(unbound.find_by_id(&id, 5).await.expect("find").is_empty(), "a role bound to nothing finds nothing");

    assert_eq!(owner.find_by_id(&id, 5).await.expect("find").len(), 2);
}

// ---------------------------------------------------------------------------
// Fixed, one role per app bound to that app only

#[derive(Debug, Default)]
struct FixedFactory {
    db: OnceCell<TestDatabase>,
}

impl StoreFactory for FixedFactory {
    async fn store(&self, config: StoreConfig) -> Arc<dyn SessionStore> {
        let db = self.db.get_or_init(test_database).await;
        Arc::new(PerAppFixed { owner_url: db.url().to_owned(), config, stores: Mutex::default() })
    }
}

/// Routes every call to the `Fixed` store of the app it is about, as a
/// service fronting one single-tenant deployment per app would. A store and
/// its role (bound to that app alone) are made on the app's first call.
#[derive(Debug)]
struct PerAppFixed {
    owner_url: String,
    config: StoreConfig,
    stores: Mutex<BTreeMap<AppName, Arc<PgSessionStore>>>,
}

impl PerAppFixed {
    async fn of(&self, app: &AppName) -> Arc<PgSessionStore> {
        let mut stores = self.stores.lock().await;
        if let Some(store) = stores.get(app) {
            return Arc::clone(store);
        }
        let url = service_role(&self.owner_url, AppBinding::Apps(vec![app.as_str().to_owned()])).await;
        let store = Arc::new(scoped_store(&url, self.config.clone(), TenantScope::Fixed(app.clone())).await);
        stores.insert(app.clone(), Arc::clone(&store));
        store
    }
}

/// What an `#[async_trait]` method returns (this crate does not depend on
/// `async-trait`, so the impl below spells its signatures out).
type Boxed<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

impl SessionStore for PerAppFixed {
    fn create<'s, 'a>(&'s self, request: CreateSession) -> Boxed<'a, Session>
    where
        's: 'a,
        Self: 'a,
    {
        Box::pin(async move { self.of(&request.app_name).await.create(request).await })
    }

    fn get<'s, 'k, 'a>(&'s self, key: &'k SessionKey, options: GetOptions) -> Boxed<'a, Session>
    where
        's: 'a,
        'k: 'a,
        Self: 'a,
    {
        Box::pin(async move { self.of(&key.app_name).await.get(key, options).await })
    }

    fn list<'s, 'r, 'a>(&'s self, request: &'r ListSessions) -> Boxed<'a, SessionPage>
    where
        's: 'a,
        'r: 'a,
        Self: 'a,
    {
        Box::pin(async move { self.of(&request.app_name).await.list(request).await })
    }

    fn delete<'s, 'k, 'a>(&'s self, key: &'k SessionKey) -> Boxed<'a, ()>
    where
        's: 'a,
        'k: 'a,
        Self: 'a,
    {
        Box::pin(async move { self.of(&key.app_name).await.delete(key).await })
    }

    fn append<'s, 'k, 'a>(&'s self, key: &'k SessionKey, event: Event, options: AppendOptions) -> Boxed<'a, Appended>
    where
        's: 'a,
        'k: 'a,
        Self: 'a,
    {
        Box::pin(async move { self.of(&key.app_name).await.append(key, event, options).await })
    }

    fn rollover<'s, 'k, 'a>(
        &'s self,
        key: &'k SessionKey,
        successor_id: Option<String>,
        summary: Event,
    ) -> Boxed<'a, Session>
    where
        's: 'a,
        'k: 'a,
        Self: 'a,
    {
        Box::pin(async move { self.of(&key.app_name).await.rollover(key, successor_id, summary).await })
    }

    /// Asks every app's store (each finds only its own app's sessions) and
    /// merges them in the order one store answers: by app, then user.
    fn find_by_id<'s, 'i, 'a>(&'s self, session_id: &'i SessionId, limit: usize) -> Boxed<'a, Vec<SessionKey>>
    where
        's: 'a,
        'i: 'a,
        Self: 'a,
    {
        Box::pin(async move {
            let stores: Vec<Arc<PgSessionStore>> = self.stores.lock().await.values().cloned().collect();
            let mut found = Vec::new();
            for store in stores {
                found.extend(store.find_by_id(session_id, limit).await?);
            }
            found.sort_by(|a, b| {
                (a.app_name.as_str(), a.user_id.as_str()).cmp(&(b.app_name.as_str(), b.user_id.as_str()))
            });
            found.truncate(limit);
            Ok(found)
        })
    }

    fn rewind<'s, 'k, 'a>(&'s self, key: &'k SessionKey, keep: u64, expected_version: Option<u64>) -> Boxed<'a, Session>
    where
        's: 'a,
        'k: 'a,
        Self: 'a,
    {
        Box::pin(async move { self.of(&key.app_name).await.rewind(key, keep, expected_version).await })
    }

    fn set_metadata<'s, 'k, 'a>(&'s self, key: &'k SessionKey, metadata: SessionMetadata) -> Boxed<'a, ()>
    where
        's: 'a,
        'k: 'a,
        Self: 'a,
    {
        Box::pin(async move { self.of(&key.app_name).await.set_metadata(key, metadata).await })
    }

    fn erase_user<'s, 'p, 'u, 'a>(&'s self, app: &'p AppName, user: &'u UserId) -> Boxed<'a, Erasure>
    where
        's: 'a,
        'p: 'a,
        'u: 'a,
        Self: 'a,
    {
        Box::pin(async move { self.of(app).await.erase_user(app, user).await })
    }

    fn fork<'s, 'k, 'a>(&'s self, key: &'k SessionKey, at_seq: u64, new_id: Option<String>) -> Boxed<'a, Session>
    where
        's: 'a,
        'k: 'a,
        Self: 'a,
    {
        Box::pin(async move { self.of(&key.app_name).await.fork(key, at_seq, new_id).await })
    }

    fn redact_event<'s, 'k, 'e, 'r, 'a>(
        &'s self,
        key: &'k SessionKey,
        event_id: &'e str,
        reason: &'r str,
        options: RedactOptions,
    ) -> Boxed<'a, Redacted>
    where
        's: 'a,
        'k: 'a,
        'e: 'a,
        'r: 'a,
        Self: 'a,
    {
        Box::pin(async move { self.of(&key.app_name).await.redact_event(key, event_id, reason, options).await })
    }

    fn get_user_state<'s, 'p, 'u, 'a>(&'s self, app: &'p AppName, user: &'u UserId) -> Boxed<'a, State>
    where
        's: 'a,
        'p: 'a,
        'u: 'a,
        Self: 'a,
    {
        Box::pin(async move { self.of(app).await.get_user_state(app, user).await })
    }

    fn get_app_state<'s, 'p, 'a>(&'s self, app: &'p AppName) -> Boxed<'a, State>
    where
        's: 'a,
        'p: 'a,
        Self: 'a,
    {
        Box::pin(async move { self.of(app).await.get_app_state(app).await })
    }

    fn merge_user_state<'s, 'p, 'u, 'a>(&'s self, app: &'p AppName, user: &'u UserId, delta: State) -> Boxed<'a, State>
    where
        's: 'a,
        'p: 'a,
        'u: 'a,
        Self: 'a,
    {
        Box::pin(async move { self.of(app).await.merge_user_state(app, user, delta).await })
    }

    fn merge_app_state<'s, 'p, 'a>(&'s self, app: &'p AppName, delta: State) -> Boxed<'a, State>
    where
        's: 'a,
        'p: 'a,
        Self: 'a,
    {
        Box::pin(async move { self.of(app).await.merge_app_state(app, delta).await })
    }

    fn list_events<'s, 'k, 'a>(&'s self, key: &'k SessionKey, page: EventPage) -> Boxed<'a, EventsPage>
    where
        's: 'a,
        'k: 'a,
        Self: 'a,
    {
        Box::pin(async move { self.of(&key.app_name).await.list_events(key, page).await })
    }

    fn list_app_sessions<'s, 'r, 'a>(&'s self, request: &'r ListAppSessions) -> Boxed<'a, AppSessionPage>
    where
        's: 'a,
        'r: 'a,
        Self: 'a,
    {
        Box::pin(async move { self.of(&request.app_name).await.list_app_sessions(request).await })
    }
}

mod fixed {
    use super::FixedFactory;

    adk_postgres_tests::conformance_tests!(FixedFactory::default());
}
