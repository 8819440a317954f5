//! DDL with a bounded lock wait: while a DDL statement queues for its lock
//! it blocks every newer query on the table, so it waits briefly, gives up,
//! pauses and tries again rather than queueing for as long as it takes.

use std::time::Duration;

use diesel_async::{AsyncPgConnection, SimpleAsyncConnection};

use crate::error::{OperationsError, is_lock_wait};

/// How DDL waits for locks.
#[derive(Debug, Clone)]
pub struct LockPolicy {
    /// Longest a DDL statement queues for its lock; while it queues, it
    /// blocks every newer query on the table, so keep this short.
    pub lock_timeout: Duration,
    /// Tries per statement before giving up.
    pub attempts: u32,
    /// Pause after the first failed try; doubles each time.
    pub backoff: Duration,
}

impl Default for LockPolicy {
    fn default() -> Self {
        Self { lock_timeout: Duration::from_secs(2), attempts: 6, backoff: Duration::from_millis(200) }
    }
}

/// Paces the attempts of one statement that may time out waiting for a
/// lock: a pause that doubles after each timeout, up to the policy's number
/// of attempts, then a typed `LockTimeout`.
#[derive(Debug)]
pub struct LockRetry<'a> {
    statement: &'a str,
    attempts: u32,
    attempt: u32,
    pause: Duration,
}

impl<'a> LockRetry<'a> {
    /// Starts pacing `statement` under `policy`, at attempt 1.
    pub fn new(statement: &'a str, policy: &LockPolicy) -> Self {
        Self { statement, attempts: policy.attempts.max(1), attempt: 1, pause: policy.backoff }
    }

    /// The attempt about to run (or that just succeeded), from 1.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// Judges one attempt: `Ok(true)` when it succeeded, `Ok(false)` after
    /// pausing when a lock wait timed out and another attempt is due, an
    /// error otherwise.
    pub async fn settle(&mut self, result: diesel::QueryResult<()>) -> Result<bool, OperationsError> {
        match result {
            Ok(()) => Ok(true),
            Err(e) if is_lock_wait(&e) && self.attempt < self.attempts => {
                tracing::warn!(statement = self.statement, attempt = self.attempt, "lock wait timed out; retrying");
                tokio::time::sleep(self.pause).await;
                self.pause = self.pause.saturating_mul(2);
                self.attempt += 1;
                Ok(false)
            }
            Err(e) if is_lock_wait(&e) => {
                Err(OperationsError::LockTimeout { statement: self.statement.to_owned(), attempts: self.attempts })
            }
            Err(e) => Err(OperationsError::Query { context: self.statement.to_owned(), source: e }),
        }
    }
}

/// Runs one DDL statement, retrying with backoff when it times out waiting
/// for a lock. Returns the number of attempts it took.
pub async fn ddl(conn: &mut AsyncPgConnection, statement: &str, policy: &LockPolicy) -> Result<u32, OperationsError> {
    let mut retry = LockRetry::new(statement, policy);
    loop {
        let result = conn.batch_execute(statement).await;
        if retry.settle(result).await? {
            return Ok(retry.attempt());
        }
    }
}
