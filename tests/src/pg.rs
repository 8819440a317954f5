//! Raw SQL access for tests that look behind the store: catalog checks,
//! plans, statistics and rows written without going through the store.

use adk_postgres_domain::{AppName, CreateSession, SessionKey, SessionStore, StoreConfig, UserId};
use adk_postgres_storage::{PgSessionStore, PoolConfig};
use tokio_postgres::{Client, NoTls};

/// A plain tokio-postgres client on `url`; its connection task runs on the
/// current runtime.
pub async fn client(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.expect("connect for raw SQL");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

/// A store on `url` with default settings.
pub async fn store(url: &str) -> PgSessionStore {
    store_with(url, StoreConfig::default()).await
}

pub async fn store_with(url: &str, config: StoreConfig) -> PgSessionStore {
    PgSessionStore::connect(url, &PoolConfig::default(), config).await.expect("connect the store")
}

/// Creates a session with a generated id for (app, user).
pub async fn new_session(store: &dyn SessionStore, app: &str, user: &str) -> SessionKey {
    let request = CreateSession::new(AppName::new(app).expect("app"), UserId::new(user).expect("user"));
    store.create(request).await.expect("create session").key
}

/// Messages the server sends a session outside any result: notices, and
/// log lines when `client_min_messages` lets them through.
pub type Notices = std::sync::Arc<std::sync::Mutex<Vec<String>>>;

/// A client whose notices are collected, e.g. plans `auto_explain` logs.
pub async fn client_with_notices(url: &str) -> (Client, Notices) {
    use futures_util::StreamExt;
    let (client, mut connection) = tokio_postgres::connect(url, NoTls).await.expect("connect for raw SQL");
    let notices = Notices::default();
    let sink = std::sync::Arc::clone(&notices);
    tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(Ok(message)) = messages.next().await {
            if let tokio_postgres::AsyncMessage::Notice(notice) = message {
                sink.lock().unwrap_or_else(|e| e.into_inner()).push(notice.message().to_owned());
            }
        }
    });
    (client, notices)
}

/// Takes the notices collected so far.
pub fn drain(notices: &Notices) -> Vec<String> {
    std::mem::take(&mut *notices.lock().unwrap_or_else(|e| e.into_inner()))
}

/// The text of `EXPLAIN (COSTS OFF) <sql>`.
pub async fn explain(client: &Client, sql: &str) -> String {
    let rows = client.query(&format!("EXPLAIN (COSTS OFF) {sql}"), &[]).await.expect("explain");
    rows.iter().map(|r| r.get::<_, String>(0)).collect::<Vec<_>>().join("\n")
}

/// A PostgreSQL client program (pg_dump, psql, pgbench) from the server's
/// installation: `pg_config --bindir` first, else the newest
/// `/usr/lib/postgresql/*/bin`, else whatever `PATH` finds.
pub fn server_binary(name: &str) -> std::path::PathBuf {
    use std::path::PathBuf;
    let from_pg_config = std::process::Command::new("pg_config")
        .arg("--bindir")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()))
        .map(|dir| dir.join(name))
        .filter(|p| p.exists());
    let versioned = || {
        let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
            .ok()?
            .flatten()
            .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path().join("bin").join(name))))
            .filter(|(_, p)| p.exists())
            .collect();
        versions.sort();
        versions.pop().map(|(_, p)| p)
    };
    from_pg_config.or_else(versioned).unwrap_or_else(|| PathBuf::from(name))
}
