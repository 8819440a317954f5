//! The pool's fair gate: turns at the pool in arrival order, with a bound
//! on how long and how many callers wait.

use std::time::Duration;

use adk_postgres_domain::StoreError;

use super::PgPool;

/// Hands out turns at the pool in arrival order. bb8 wakes one waiter when a
/// connection comes back, but a caller arriving in between can take it
/// first, so under a crowd some waiters starve past the checkout timeout
/// although the average wait is short. A FIFO semaphore with one permit per
/// connection in front of `get` makes every wait bounded by the queue ahead.
pub(crate) struct FairGate {
    turns: tokio::sync::Semaphore,
    /// Longest a caller queues before `Overloaded`: the pool's own checkout
    /// timeout, so the gate never waits longer than bb8 would have.
    patience: Duration,
    /// Callers queued beyond this get `Overloaded` at once instead of
    /// queueing; far above any sane crowd, it only bounds memory.
    max_waiting: usize,
    waiting: std::sync::atomic::AtomicUsize,
    observer: std::sync::OnceLock<CheckoutObserver>,
}

/// Called with how long each operation waited for its turn at the pool
/// (zero when a connection was free), whether it got one or was refused:
/// for a caller's own metrics, e.g. a wait histogram.
pub type CheckoutObserver = std::sync::Arc<dyn Fn(Duration) + Send + Sync>;

impl std::fmt::Debug for FairGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FairGate")
            .field("turns", &self.turns.available_permits())
            .field("waiting", &self.waiting)
            .field("patience", &self.patience)
            .field("observed", &self.observer.get().is_some())
            .finish()
    }
}

/// A caller's turn; the next caller in line goes when it is dropped.
type Turn<'a> = tokio::sync::SemaphorePermit<'a>;

impl FairGate {
    pub(crate) fn new(pool: &PgPool) -> Self {
        Self {
            turns: tokio::sync::Semaphore::new(usize::try_from(pool.max_size()).unwrap_or(1).max(1)),
            patience: pool.connection_timeout(),
            max_waiting: 100_000,
            waiting: std::sync::atomic::AtomicUsize::new(0),
            observer: std::sync::OnceLock::new(),
        }
    }

    pub(crate) async fn enter(&self) -> Result<Turn<'_>, StoreError> {
        use std::sync::atomic::Ordering::Relaxed;
        if let Ok(turn) = self.turns.try_acquire() {
            self.observe(Duration::ZERO);
            return Ok(turn);
        }
        let ahead = self.waiting.fetch_add(1, Relaxed);
        let started = tokio::time::Instant::now();
        let outcome = if ahead >= self.max_waiting {
            None
        } else {
            // Cancelling a semaphore wait is harmless: nothing was sent.
            tokio::time::timeout(self.patience, self.turns.acquire()).await.ok()
        };
        self.waiting.fetch_sub(1, Relaxed);
        self.observe(started.elapsed());
        match outcome {
            Some(Ok(turn)) => Ok(turn),
            Some(Err(_closed)) => Err(StoreError::Unavailable { message: "the store is shut down".into() }),
            None => Err(StoreError::Overloaded { waiting: ahead + 1, waited: started.elapsed() }),
        }
    }

    /// Reports every wait to `observer`; a second call keeps the first.
    pub(crate) fn observe_with(&self, observer: CheckoutObserver) {
        let _ = self.observer.set(observer);
    }

    fn observe(&self, waited: Duration) {
        if let Some(observer) = self.observer.get() {
            observer(waited);
        }
    }
}
