//! The session-level advisory lock that keeps two runs of one kind apart
//! (maintenance, conversion, index builds; the keys are
//! `adk_postgres_schema::names::lock_keys`).
//!
//! # Why the guard owns the connection
//!
//! A session-level advisory lock is held until it is unlocked or the
//! session ends, and async code cannot run `pg_advisory_unlock` in `Drop`.
//! So [`AdvisoryLock`] takes ownership of the dedicated connection that
//! holds the lock and only lends it out while the work runs. [`release`]
//! unlocks and closes it on the paths that finish; on every other path (an
//! early `?` return, a panic, a cancelled future) dropping the guard drops
//! the connection, the session ends and the server releases the lock
//! itself. Nothing can go on using the session once the guard is gone, so
//! the lock never outlives the work. This holds only because these
//! connections are never pooled: a pooled one would carry the lock back
//! into the pool.
//!
//! [`release`]: AdvisoryLock::release

use std::time::Duration;

use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Bool};
use diesel_async::{AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};

use crate::RetentionError;
use adk_postgres_operations::is_lock_wait;
use adk_postgres_operations::{LockPolicy, first_row};

/// A held session-level advisory lock and the connection holding it.
pub(crate) struct AdvisoryLock {
    conn: AsyncPgConnection,
    key: i64,
}

impl std::fmt::Debug for AdvisoryLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdvisoryLock").field("key", &self.key).finish_non_exhaustive()
    }
}

/// How [`AdvisoryLock::acquire_within`] came by the lock, or did not.
#[derive(Debug)]
pub(crate) enum Acquired {
    /// It was free.
    Free(AdvisoryLock),
    /// Another run held it; this one waited until it was released.
    AfterWait(AdvisoryLock),
    /// Another run held it for longer than the wait; the connection is closed.
    TimedOut,
}

#[derive(QueryableByName)]
struct DirectRow {
    #[diesel(sql_type = Bool)]
    direct: bool,
}

#[derive(QueryableByName)]
struct LockedRow {
    #[diesel(sql_type = Bool)]
    locked: bool,
}

impl AdvisoryLock {
    /// Takes the lock `key` on `conn` without waiting; `None` (and the
    /// connection closed) when another session holds it.
    pub(crate) async fn try_acquire(conn: AsyncPgConnection, key: i64) -> Result<Option<Self>, RetentionError> {
        Ok(Self::try_acquire_keeping(conn, key).await?.ok())
    }

    /// Takes the lock `key` on `conn`, waiting up to `wait` for another run
    /// to release it. The wait is a `lock_timeout` on `pg_advisory_lock`, so
    /// it ends the moment the lock is free; `policy`'s own timeout is put
    /// back for the work that follows.
    pub(crate) async fn acquire_within(
        conn: AsyncPgConnection,
        key: i64,
        wait: Duration,
        policy: &LockPolicy,
    ) -> Result<Acquired, RetentionError> {
        // Tried first without waiting: a run that found the lock free did
        // not wait for another, and its report says so.
        let mut conn = match Self::try_acquire_keeping(conn, key).await? {
            Ok(lock) => return Ok(Acquired::Free(lock)),
            Err(conn) => conn,
        };
        let waited = conn
            .batch_execute(&format!(
                "SET lock_timeout = {}; SELECT pg_advisory_lock({key}); SET lock_timeout = {}",
                wait.as_millis().max(1),
                policy.lock_timeout.as_millis().max(1)
            ))
            .await;
        match waited {
            Ok(()) => Ok(Acquired::AfterWait(Self { conn, key })),
            Err(e) if is_lock_wait(&e) => Ok(Acquired::TimedOut),
            Err(e) => Err(RetentionError::Query { context: "wait for an advisory lock".into(), source: e }),
        }
    }

    /// [`AdvisoryLock::try_acquire`] that hands the connection back when
    /// another session holds the lock, for a caller that will wait for it.
    async fn try_acquire_keeping(
        mut conn: AsyncPgConnection,
        key: i64,
    ) -> Result<Result<Self, AsyncPgConnection>, RetentionError> {
        // A session lock through a transaction pooler would be taken on a
        // server connection the next statement may not reach, and leak to
        // whichever client gets it next: refused at once instead.
        let direct = diesel::sql_query(adk_postgres_connect::DIRECT_SESSION_CHECK)
            .load::<DirectRow>(&mut conn)
            .await
            .and_then(first_row)
            .map_err(RetentionError::query("check for a connection pooler"))?
            .direct;
        if !direct {
            return Err(RetentionError::InvalidInput {
                field: "database_url",
                reason: "this job holds a session-level advisory lock, which a connection pooler cannot keep; \
                         give it a direct URL to the server"
                    .into(),
            });
        }
        let locked = diesel::sql_query("SELECT pg_try_advisory_lock($1) AS locked")
            .bind::<BigInt, _>(key)
            .load::<LockedRow>(&mut conn)
            .await
            .and_then(first_row)
            .map_err(RetentionError::query("take an advisory lock"))?
            .locked;
        Ok(if locked { Ok(Self { conn, key }) } else { Err(conn) })
    }

    /// The connection holding the lock, for the work done under it.
    pub(crate) fn conn(&mut self) -> &mut AsyncPgConnection {
        &mut self.conn
    }

    /// Unlocks, so the next run need not wait for the server to notice the
    /// closed connection, then closes it. A failed unlock is only logged:
    /// closing the connection releases the lock all the same.
    pub(crate) async fn release(mut self) {
        let unlocked = self.conn.batch_execute(&format!("SELECT pg_advisory_unlock({})", self.key)).await;
        if let Err(error) = unlocked {
            tracing::warn!(key = self.key, %error, "could not unlock; closing the connection releases the lock");
        }
    }
}
