//! Plain tokio-postgres clients, for tests and tools that look behind the
//! store: catalog checks, plans, rows written without the store.
//!
//! They return an error rather than panic: this crate also serves the bench,
//! the demo and `xtask`, where a failed connection is an error to report. A
//! test turns it into its failure message.

use std::future::poll_fn;
use std::sync::{Arc, Mutex, PoisonError};

use adk_postgres_connect::ConnectConfig;
use tokio_postgres::{AsyncMessage, Client};

use crate::error::HarnessError;
use crate::urls::redacted;

/// A client of `url`, made by the project's one connection module (so a
/// URL with `sslmode` and friends works as it does for the store). Its connection is driven by a task on the
/// current runtime, so the client lives no longer than that runtime.
pub async fn connect(url: &str) -> Result<Client, HarnessError> {
    let (client, connection) = open(url).await?;
    tokio::spawn(async move {
        // The connection ends when the client is dropped or the server goes;
        // either way the client's own calls report it.
        let _ = connection.await;
    });
    Ok(client)
}

/// Messages the server sent a session outside any result: notices, and log
/// lines when `client_min_messages` lets them through (e.g. the plans
/// `auto_explain` logs, or why an `ATTACH PARTITION` skipped its scan).
pub type Notices = Arc<Mutex<Vec<String>>>;

/// [`connect`], collecting every notice the server sends this session.
pub async fn connect_with_notices(url: &str) -> Result<(Client, Notices), HarnessError> {
    let (client, mut connection) = open(url).await?;
    let notices = Notices::default();
    let sink = Arc::clone(&notices);
    tokio::spawn(async move {
        // A notice is only seen by polling the connection for messages, which
        // also drives it; ending at the first error is what awaiting it does.
        while let Some(Ok(message)) = poll_fn(|cx| connection.poll_message(cx)).await {
            if let AsyncMessage::Notice(notice) = message {
                sink.lock().unwrap_or_else(PoisonError::into_inner).push(notice.message().to_owned());
            }
        }
    });
    Ok((client, notices))
}

/// Takes the notices collected so far.
pub fn drain_notices(notices: &Notices) -> Vec<String> {
    std::mem::take(&mut *notices.lock().unwrap_or_else(PoisonError::into_inner))
}

pub(crate) type Connection = adk_postgres_connect::PgConnection;

/// A client and its connection, which nothing drives yet.
pub(crate) async fn open(url: &str) -> Result<(Client, Connection), HarnessError> {
    let fail = |source| HarnessError::Connect { url: redacted(url), source };
    let connected = ConnectConfig::from_url(url).map_err(fail)?.connect().await.map_err(fail)?;
    Ok((connected.client, connected.connection))
}
