//! What a store operation does when it loses a race or its time bound: run
//! again after a short pause, or give up with a retryable answer.

use std::time::Duration;

use adk_postgres_domain::StoreError;

/// Tries per operation when it keeps losing deadlock or serialization races.
const CONFLICT_ATTEMPTS: u32 = 5;

/// Decides whether an operation that lost a deadlock or serialization race
/// runs again, and waits a short, growing, jittered pause before it does.
/// Every operation is one autocommit statement, so a failed attempt left
/// nothing behind.
#[derive(Debug)]
pub(crate) struct ConflictRetry {
    attempt: u32,
    pause: Duration,
}

impl Default for ConflictRetry {
    fn default() -> Self {
        Self { attempt: 1, pause: Duration::from_millis(5) }
    }
}

impl ConflictRetry {
    pub(crate) async fn again<T>(&mut self, result: &Result<T, StoreError>) -> bool {
        let Err(StoreError::Conflict { message }) = result else { return false };
        if self.attempt >= CONFLICT_ATTEMPTS {
            return false;
        }
        tracing::debug!(attempt = self.attempt, %message, "retrying after a conflict");
        // Jitter keeps two losers of the same race from meeting again.
        let jitter = Duration::from_micros(u64::from(uuid::Uuid::new_v4().as_u128() as u16));
        tokio::time::sleep(self.pause + jitter).await;
        self.pause = self.pause.saturating_mul(3);
        self.attempt += 1;
        true
    }
}

/// What a call whose bound passed returns.
pub(crate) fn no_answer(bound: Duration) -> StoreError {
    StoreError::Unavailable {
        message: format!(
            "no answer from the database within {bound:?} (operation_timeout); the connection was discarded \
             and the statement may or may not have committed: retry (the same event id is safe)"
        ),
    }
}

/// Runs `$query`, an expression over `$conn` (a pooled connection, fresh
/// for each attempt), again while it loses deadlock or serialization races.
macro_rules! with_retries {
    ($store:expr, |$conn:ident| $query:expr) => {{
        let mut retry = $crate::pool::ConflictRetry::default();
        loop {
            // Declared first so it is released last, after the connection
            // went back to the pool.
            let _turn = $store.gate.enter().await?;
            let mut $conn = $store.pool.get().await.map_err($crate::error::from_pool)?;
            // Each statement is bounded too, for calls made of many (an
            // erasure's batches); a statement cut off leaves its connection
            // busy, so the pool discards it.
            let result = match tokio::time::timeout($store.pool.operation_timeout(), async { $query }).await {
                Ok(result) => result,
                Err(_elapsed) => Err($crate::pool::no_answer($store.pool.operation_timeout())),
            };
            if matches!(result, Err(adk_postgres_domain::StoreError::Unavailable { .. })) {
                // A backend killed by the server is only seen as closed
                // once the driver has read the end of the stream, which may
                // be after the pool takes the connection back.
                $conn.discard();
            }
            if !retry.again(&result).await {
                break result;
            }
        }
    }};
}
pub(crate) use with_retries;
