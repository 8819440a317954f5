//! [`TimedSessions`]: a `SessionService` decorator that measures what the
//! runner waits for.
//!
//! It delegates every method of the trait (the defaulted ones too, so the
//! inner service's own implementations run, not the trait's defaults) and
//! records how long appends and loads take, as the runner sees them: pool
//! wait, round trip and the work in PostgreSQL.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use adk_core::Result;
use adk_core::identity::AdkIdentity;
use adk_session::{
    AppendEventRequest, CreateRequest, DeleteRequest, Event, GetRequest, ListRequest, Session, SessionService,
};
use async_trait::async_trait;
use hdrhistogram::Histogram;

/// Latencies up to this long are recorded exactly (to 3 significant digits);
/// longer ones saturate at it.
const MAX_RECORDED: Duration = Duration::from_secs(60);

/// A latency distribution in microseconds.
#[derive(Debug)]
pub struct Latencies {
    histogram: Mutex<Histogram<u64>>,
}

impl Latencies {
    /// An empty distribution: 1 µs to 60 s at 3 significant digits.
    pub fn new() -> std::result::Result<Self, hdrhistogram::CreationError> {
        let max = u64::try_from(MAX_RECORDED.as_micros()).unwrap_or(u64::MAX);
        Ok(Self { histogram: Mutex::new(Histogram::new_with_bounds(1, max, 3)?) })
    }
}

impl Latencies {
    fn lock(&self) -> MutexGuard<'_, Histogram<u64>> {
        // A panic elsewhere while holding the lock leaves the histogram
        // intact (recording is one call), so its data stays usable.
        self.histogram.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records one call that took `elapsed`.
    pub fn record(&self, elapsed: Duration) {
        let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX).max(1);
        self.lock().saturating_record(micros);
    }

    /// A summary of what was recorded so far.
    pub fn summary(&self) -> LatencySummary {
        let h = self.lock();
        let ms = |micros: u64| micros as f64 / 1000.0;
        LatencySummary {
            count: h.len(),
            p50_ms: ms(h.value_at_quantile(0.50)),
            p90_ms: ms(h.value_at_quantile(0.90)),
            p99_ms: ms(h.value_at_quantile(0.99)),
            max_ms: ms(h.max()),
        }
    }
}

/// Percentiles of a [`Latencies`], in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LatencySummary {
    pub count: u64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

/// What [`TimedSessions`] measured.
#[derive(Debug)]
pub struct Timings {
    /// `append_event` and `append_event_for_identity`.
    pub appends: Latencies,
    /// `get` and `get_for_identity`: the runner loads the session at the
    /// start of every turn.
    pub gets: Latencies,
}

/// A `SessionService` that times another one.
#[derive(Clone)]
pub struct TimedSessions {
    inner: Arc<dyn SessionService>,
    timings: Arc<Timings>,
}

impl std::fmt::Debug for TimedSessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TimedSessions").field("timings", &self.timings).finish_non_exhaustive()
    }
}

impl Timings {
    pub fn new() -> std::result::Result<Self, hdrhistogram::CreationError> {
        Ok(Self { appends: Latencies::new()?, gets: Latencies::new()? })
    }
}

impl TimedSessions {
    pub fn new(inner: Arc<dyn SessionService>) -> std::result::Result<Self, hdrhistogram::CreationError> {
        Ok(Self { inner, timings: Arc::new(Timings::new()?) })
    }

    pub fn timings(&self) -> &Arc<Timings> {
        &self.timings
    }
}

async fn timed<T>(latencies: &Latencies, call: impl Future<Output = T>) -> T {
    let started = Instant::now();
    let result = call.await;
    latencies.record(started.elapsed());
    result
}

#[async_trait]
impl SessionService for TimedSessions {
    async fn create(&self, req: CreateRequest) -> Result<Box<dyn Session>> {
        self.inner.create(req).await
    }

    async fn get(&self, req: GetRequest) -> Result<Box<dyn Session>> {
        timed(&self.timings.gets, self.inner.get(req)).await
    }

    async fn list(&self, req: ListRequest) -> Result<Vec<Box<dyn Session>>> {
        self.inner.list(req).await
    }

    async fn delete(&self, req: DeleteRequest) -> Result<()> {
        self.inner.delete(req).await
    }

    async fn append_event(&self, session_id: &str, event: Event) -> Result<()> {
        timed(&self.timings.appends, self.inner.append_event(session_id, event)).await
    }

    async fn get_for_identity(&self, identity: &AdkIdentity) -> Result<Box<dyn Session>> {
        timed(&self.timings.gets, self.inner.get_for_identity(identity)).await
    }

    async fn delete_for_identity(&self, identity: &AdkIdentity) -> Result<()> {
        self.inner.delete_for_identity(identity).await
    }

    async fn append_event_for_identity(&self, req: AppendEventRequest) -> Result<()> {
        timed(&self.timings.appends, self.inner.append_event_for_identity(req)).await
    }

    async fn delete_all_sessions(&self, app_name: &str, user_id: &str) -> Result<()> {
        self.inner.delete_all_sessions(app_name, user_id).await
    }

    async fn rewind(&self, session_id: &str, target_event_id: &str) -> Result<Box<dyn Session>> {
        self.inner.rewind(session_id, target_event_id).await
    }

    async fn rewind_steps(&self, session_id: &str, steps: usize) -> Result<Box<dyn Session>> {
        self.inner.rewind_steps(session_id, steps).await
    }

    async fn health_check(&self) -> Result<()> {
        self.inner.health_check().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_in_milliseconds() {
        let latencies = Latencies::new().unwrap();
        for ms in 1..=100 {
            latencies.record(Duration::from_millis(ms));
        }
        let summary = latencies.summary();
        assert_eq!(summary.count, 100);
        assert!((summary.p50_ms - 50.0).abs() < 0.1, "{summary:?}");
        assert!((summary.p99_ms - 99.0).abs() < 0.1, "{summary:?}");
        assert!((summary.max_ms - 100.0).abs() < 0.1, "{summary:?}");
    }

    #[test]
    fn an_empty_record_reads_as_zero() {
        assert_eq!(Latencies::new().unwrap().summary(), LatencySummary::default());
    }
}
