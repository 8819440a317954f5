//! Passwords asked for on every new connection: a provider whose answer
//! changes (as an IAM token does) keeps the store working, a failing one
//! is a typed, retryable error, and no secret reaches a log line, an
//! error or a `Debug`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use adk_postgres_connect::{ConnectConfig, ConnectError, CredentialError, Secret};
use adk_postgres_domain::{
    AppName, AppendOptions, CreateSession, Event, SessionStore, StoreConfig, StoreError, UserId,
};
use adk_postgres_storage::tenancy::{AppBinding, ServiceRoleOptions, setup_service_role};
use adk_postgres_storage::{PgSessionStore, PoolBuildError, PoolConfig};
use adk_postgres_testing::{Cluster, connect, start_throwaway_cluster, test_database_on};

use super::LogLines;

const ROLE: &str = "adk_rotating";

/// A throwaway cluster on which `ROLE` must log in with its password
/// (SCRAM), while the harness's own superuser keeps trust.
async fn cluster_with_password_role() -> &'static Cluster {
    let cluster = tokio::task::spawn_blocking(start_throwaway_cluster).await.expect("task").expect("a cluster");
    let hba = cluster.data_dir().join("pg_hba.conf");
    let rules = std::fs::read_to_string(&hba).expect("read pg_hba.conf");
    std::fs::write(&hba, format!("host all {ROLE} 127.0.0.1/32 scram-sha-256\n{rules}")).expect("write pg_hba.conf");
    let admin = connect(&cluster.server_url()).await.expect("superuser");
    admin.batch_execute("SELECT pg_reload_conf()").await.expect("reload");
    // The harness's databases borrow their cluster for the whole test; the
    // watchdog removes it when the test process ends.
    Box::leak(Box::new(cluster))
}

fn role_url(db_url: &str) -> String {
    adk_postgres_tests::pg::login_url(db_url, ROLE)
}

async fn set_password(db_url: &str, password: &str) {
    let admin = connect(db_url).await.expect("superuser");
    // A test literal, not input: it holds no quote.
    admin.batch_execute(&format!("ALTER ROLE {ROLE} PASSWORD '{password}'")).await.expect("alter the password");
}

/// Ends every session of the role, so the pool must log in again.
async fn drop_sessions(db_url: &str) {
    let admin = connect(db_url).await.expect("superuser");
    admin
        .batch_execute(&format!("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{ROLE}'"))
        .await
        .expect("terminate");
}

async fn append_until_stored(store: &PgSessionStore, key: &adk_postgres_domain::SessionKey) -> Vec<StoreError> {
    let event = Event::new("agent");
    let mut errors = Vec::new();
    for _ in 0..50 {
        match store.append(key, event.clone(), AppendOptions::default()).await {
            Ok(_) => return errors,
            Err(e) if e.is_retryable() => {
                errors.push(e);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("a non-retryable error: {e:?}"),
        }
    }
    panic!("never stored: {errors:?}");
}

#[tokio::test(flavor = "current_thread")]
async fn a_provider_whose_password_rotates_keeps_the_store_working_and_no_secret_is_logged() {
    let logs = LogLines::default();
    let _guard = logs.install();
    let cluster = cluster_with_password_role().await;
    let db = test_database_on(cluster).await;
    let passwords: Vec<String> = (0..4).map(|i| format!("rotated-{i}-{}", uuid::Uuid::new_v4().simple())).collect();
    let options = ServiceRoleOptions { create: true, password: Some(passwords[0].clone()), apps: AppBinding::AllApps };
    setup_service_role(db.url(), ROLE, &options).await.expect("the role");

    let current = Arc::new(Mutex::new(passwords[0].clone()));
    let asked = Arc::new(AtomicUsize::new(0));
    let (source, count) = (current.clone(), asked.clone());
    let connect_config =
        ConnectConfig::from_url(&role_url(db.url())).expect("URL").with_password_provider(Arc::new(move || {
            count.fetch_add(1, Ordering::Relaxed);
            let password = source.lock().unwrap_or_else(PoisonError::into_inner).clone();
            async move { Ok(Secret::new(password)) }
        }));
    let store = PgSessionStore::connect_with(
        connect_config.clone(),
        &PoolConfig { max_size: 2, ..PoolConfig::default() },
        StoreConfig::default(),
    )
    .await
    .expect("the store logs in with the provider's password")
    .with_tenant_scope(adk_postgres_storage::TenantScope::PerRequest);
    let session = store
        .create(CreateSession::new(AppName::new("app").expect("app"), UserId::new("u").expect("user")))
        .await
        .expect("create");

    let mut errors = Vec::new();
    for password in &passwords[1..] {
        set_password(db.url(), password).await;
        *current.lock().unwrap_or_else(PoisonError::into_inner) = password.clone();
        drop_sessions(db.url()).await;
        errors.extend(append_until_stored(&store, &session.key).await);
    }
    let stored = store.get(&session.key, Default::default()).await.expect("get");
    assert_eq!(stored.events.len(), passwords.len() - 1, "one append per rotation");
    let asked = asked.load(Ordering::Relaxed);
    assert!(asked > passwords.len() - 1, "the provider was asked on every new connection ({asked} times)");

    // A login refused for an outdated password names no password either.
    let mut stale_url = url::Url::parse(&role_url(db.url())).expect("URL");
    stale_url.set_password(Some(&passwords[0])).expect("password");
    let stale = ConnectConfig::from_url(stale_url.as_str());
    let refused = match stale {
        Ok(config) => config.connect().await.err().map(|e| format!("{e} {e:?}")),
        Err(e) => Some(format!("{e} {e:?}")),
    };
    let refused = refused.expect("an outdated password is refused");

    let seen = format!(
        "{}\n{refused}\n{errors:?}\n{}\n{:?}\n{:?}\n{:?}",
        logs.text(),
        errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"),
        store,
        connect_config,
        stored
    );
    for password in &passwords {
        assert!(!seen.contains(password.as_str()), "a password appears in a log line, an error or a Debug");
    }
    assert!(!format!("{:?}", Secret::new(passwords[0].clone())).contains(&passwords[0]));
}

#[tokio::test(flavor = "current_thread")]
async fn a_failing_provider_is_a_typed_retryable_error() {
    let cluster = cluster_with_password_role().await;
    let db = test_database_on(cluster).await;
    let password = format!("good-{}", uuid::Uuid::new_v4().simple());
    let options = ServiceRoleOptions { create: true, password: Some(password.clone()), apps: AppBinding::AllApps };
    setup_service_role(db.url(), ROLE, &options).await.expect("the role");

    let failing = ConnectConfig::from_url(&role_url(db.url()))
        .expect("URL")
        .with_password_provider(Arc::new(|| async { Err(CredentialError::new("the token service is down")) }));
    match PgSessionStore::connect_with(failing, &PoolConfig::default(), StoreConfig::default()).await {
        Err(PoolBuildError::Connect(error)) if matches!(*error, ConnectError::Credentials { .. }) => {
            assert!(error.is_retryable(), "{error}");
            assert!(error.to_string().contains("the token service is down"), "{error}");
        }
        other => panic!("expected the provider's error, got {other:?}"),
    }

    // Working at first, failing later: the store's call is `Unavailable`.
    let healthy = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let switch = healthy.clone();
    let flaky =
        ConnectConfig::from_url(&role_url(db.url())).expect("URL").with_password_provider(Arc::new(move || {
            let (up, password) = (switch.load(Ordering::Relaxed), password.clone());
            async move { if up { Ok(Secret::new(password)) } else { Err(CredentialError::new("token expired")) } }
        }));
    let store = PgSessionStore::connect_with(
        flaky,
        &PoolConfig { max_size: 1, ..PoolConfig::default() },
        StoreConfig::default(),
    )
    .await
    .expect("the store")
    .with_tenant_scope(adk_postgres_storage::TenantScope::PerRequest);
    let session = store
        .create(CreateSession::new(AppName::new("app").expect("app"), UserId::new("u").expect("user")))
        .await
        .expect("create");
    healthy.store(false, Ordering::Relaxed);
    drop_sessions(db.url()).await;
    let mut last = None;
    for _ in 0..20 {
        match store.append(&session.key, Event::new("agent"), AppendOptions::default()).await {
            Err(error @ StoreError::Unavailable { .. }) if error.to_string().contains("password provider") => {
                last = Some(error);
                break;
            }
            // The killed connection itself, first.
            Err(error) if error.is_retryable() => tokio::time::sleep(Duration::from_millis(50)).await,
            other => panic!("expected Unavailable from the provider, got {other:?}"),
        }
    }
    let error = last.expect("the provider's failure reached the caller");
    assert!(error.is_retryable());
    healthy.store(true, Ordering::Relaxed);
    assert!(append_until_stored(&store, &session.key).await.len() < 50, "recovers once the provider does");
}

/// The README's RDS IAM example, run: its block in "Connecting to
/// production databases" must be this test's lines between the markers,
/// and here the "token" is the role's current password.
#[tokio::test(flavor = "current_thread")]
async fn the_readmes_password_provider_example_runs() -> Result<(), Box<dyn std::error::Error>> {
    const README: &str = include_str!("../../../../docs/connecting.md");
    const THIS_FILE: &str = include_str!("credentials.rs");
    let section = README.split("\n## Credentials that rotate\n").nth(1).expect("docs/connecting.md's section");
    let section = section.split("\n## ").next().unwrap_or(section);
    let block = section.split("```rust\n").nth(1).and_then(|rest| rest.split("\n```").next()).expect("a rust block");
    let begin = THIS_FILE.find(concat!("// README: ", "begin\n")).expect("begin marker") + "// README: begin\n".len();
    let end = THIS_FILE.find(concat!("    // README: ", "end")).expect("end marker");
    let excerpt: String = THIS_FILE[begin..end]
        .lines()
        .map(|line| line.strip_prefix("    ").unwrap_or(line))
        .map(|l| format!("{l}\n"))
        .collect();
    let block_body: String =
        block.lines().filter(|l| !l.starts_with("use ") && !l.is_empty()).map(|l| format!("{l}\n")).collect();
    let excerpt_body: String = excerpt.lines().filter(|l| !l.is_empty()).map(|l| format!("{l}\n")).collect();
    assert!(block_body.contains("with_password_provider"), "the README's block: {block_body}");
    assert_eq!(block_body, excerpt_body, "README.md's provider example and this test differ");

    let cluster = cluster_with_password_role().await;
    let db = test_database_on(cluster).await;
    let token = format!("token-{}", uuid::Uuid::new_v4().simple());
    let options = ServiceRoleOptions { create: true, password: Some(token.clone()), apps: AppBinding::AllApps };
    setup_service_role(db.url(), ROLE, &options).await?;
    let database_url = role_url(db.url());
    static TOKEN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TOKEN.set(token).expect("set once");
    async fn rds_auth_token() -> Result<String, std::io::Error> {
        TOKEN.get().cloned().ok_or_else(|| std::io::Error::other("no token"))
    }
    // README: begin
    // Asked on every new connection: the pool keeps working as tokens expire.
    let connect = ConnectConfig::from_url(&database_url)?.with_password_provider(Arc::new(|| async {
        let token = rds_auth_token().await.map_err(|e| CredentialError::new(e.to_string()))?;
        Ok(Secret::new(token))
    }));
    let store = PgSessionStore::connect_with(connect, &PoolConfig::default(), StoreConfig::default()).await?;
    // README: end
    let store = store.with_tenant_scope(adk_postgres_storage::TenantScope::PerRequest);
    store.create(CreateSession::new(AppName::new("app")?, UserId::new("u")?)).await?;
    Ok(())
}
