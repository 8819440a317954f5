//! What the store tells about its own work: one `tracing` span per store
//! operation and, with the `metrics` feature, a latency histogram and an
//! error counter through the `metrics` facade, exported by whatever recorder
//! the service installs.
//!
//! Only bounded, impersonal values are recorded: the operation, the app
//! name (on spans only) and the outcome. User ids and session ids are
//! personal and unbounded, and state and events are the users' data, so
//! none of them is ever a field or a label. An error is recorded by its
//! kind alone, never by its message: most messages name the session key.
//!
//! Spans are at `DEBUG`, so a service logging at `INFO` pays one level check
//! per operation and nothing else: no allocation, no clock read (unless the
//! `metrics` feature needs the duration).

use std::future::Future;
use std::time::{Duration, Instant};

use adk_postgres_domain::{AppName, StoreError};
use tracing::Instrument as _;
use tracing::field::Empty;

/// The name of every store operation's span.
pub const SPAN_NAME: &str = "adk_pg_store";

/// Seconds each store operation took, labelled `operation` and `outcome`.
pub const DURATION_METRIC: &str = "adk_pg_store_operation_duration_seconds";

/// Store operations that failed, labelled `operation` and `kind`.
pub const ERRORS_METRIC: &str = "adk_pg_store_operation_errors_total";

/// The `outcome` of an operation that succeeded.
pub const OK: &str = "ok";

/// A store operation, as spans and metrics name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Operation {
    /// `SessionStore::create`.
    Create,
    /// `SessionStore::get`.
    Get,
    /// `SessionStore::list`.
    List,
    /// `SessionStore::delete`.
    Delete,
    /// `SessionStore::append`.
    Append,
    /// `SessionStore::rollover`.
    Rollover,
    /// `SessionStore::find_by_id`.
    FindById,
    /// `SessionStore::rewind`.
    Rewind,
    /// `SessionStore::set_metadata`.
    SetMetadata,
    /// `SessionStore::erase_user`.
    EraseUser,
    /// `SessionStore::fork`.
    Fork,
    /// `SessionStore::redact_event`.
    RedactEvent,
    /// `SessionStore::get_user_state`.
    GetUserState,
    /// `SessionStore::get_app_state`.
    GetAppState,
    /// `SessionStore::merge_user_state`.
    MergeUserState,
    /// `SessionStore::merge_app_state`.
    MergeAppState,
    /// `SessionStore::list_events`.
    ListEvents,
    /// `SessionStore::list_app_sessions`.
    ListAppSessions,
}

impl Operation {
    /// Every operation, each once, in the order of the `SessionStore` trait.
    pub const ALL: [Operation; 18] = [
        Self::Create,
        Self::Get,
        Self::List,
        Self::Delete,
        Self::Append,
        Self::Rollover,
        Self::FindById,
        Self::Rewind,
        Self::SetMetadata,
        Self::EraseUser,
        Self::Fork,
        Self::RedactEvent,
        Self::GetUserState,
        Self::GetAppState,
        Self::MergeUserState,
        Self::MergeAppState,
        Self::ListEvents,
        Self::ListAppSessions,
    ];

    /// The `operation` field and label: the `SessionStore` method's name.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Create => "create",
            Self::Get => "get",
            Self::List => "list",
            Self::Delete => "delete",
            Self::Append => "append",
            Self::Rollover => "rollover",
            Self::FindById => "find_by_id",
            Self::Rewind => "rewind",
            Self::SetMetadata => "set_metadata",
            Self::EraseUser => "erase_user",
            Self::Fork => "fork",
            Self::RedactEvent => "redact_event",
            Self::GetUserState => "get_user_state",
            Self::GetAppState => "get_app_state",
            Self::MergeUserState => "merge_user_state",
            Self::MergeAppState => "merge_app_state",
            Self::ListEvents => "list_events",
            Self::ListAppSessions => "list_app_sessions",
        }
    }
}

/// The `outcome` of a failed operation and the `kind` label of the error
/// counter: one fixed word per `StoreError` variant, so dashboards and
/// alerts can rely on them.
pub fn error_kind(error: &StoreError) -> &'static str {
    error.kind()
}

fn outcome<T>(result: &Result<T, StoreError>) -> &'static str {
    result.as_ref().map_or_else(error_kind, |_| OK)
}

/// One store operation being observed: its span, opened when the request
/// arrives (while its app is still at hand: the work may consume the
/// request).
#[derive(Debug)]
pub(crate) struct Observation {
    operation: Operation,
    span: tracing::Span,
}

impl Observation {
    /// `app` is the app the request is about; none when it names none.
    pub(crate) fn new(operation: Operation, app: Option<&AppName>) -> Self {
        let span = tracing::debug_span!(
            SPAN_NAME,
            operation = operation.as_str(),
            app = app.map(AppName::as_str),
            outcome = Empty,
            duration_ms = Empty,
        );
        Self { operation, span }
    }

    /// Runs `work`, the operation's body, inside the span, and records how
    /// it ended and how long it took.
    pub(crate) async fn run<T, F>(self, work: F) -> Result<T, StoreError>
    where
        F: Future<Output = Result<T, StoreError>>,
    {
        let Self { operation, span } = self;
        // Nobody listens: not even a clock read, which costs more than the
        // rest of the bookkeeping together.
        if span.is_disabled() && !cfg!(feature = "metrics") {
            return work.await;
        }
        let started = Instant::now();
        let result = work.instrument(span.clone()).await;
        let elapsed = started.elapsed();
        let outcome = outcome(&result);
        if !span.is_disabled() {
            span.record("outcome", outcome);
            span.record("duration_ms", elapsed.as_secs_f64() * 1e3);
            // For log subscribers, which print a span's fields with the
            // events inside it but not when it closes (unless told to).
            tracing::debug!(parent: &span, "store operation finished");
        }
        measure(operation, elapsed, outcome);
        result
    }
}

#[cfg(not(feature = "metrics"))]
fn measure(_: Operation, _: Duration, _: &'static str) {}

#[cfg(feature = "metrics")]
fn measure(operation: Operation, elapsed: Duration, outcome: &'static str) {
    let operation = operation.as_str();
    metrics::histogram!(DURATION_METRIC, "operation" => operation, "outcome" => outcome).record(elapsed.as_secs_f64());
    if outcome != OK {
        metrics::counter!(ERRORS_METRIC, "operation" => operation, "kind" => outcome).increment(1);
    }
}

/// Gives the store's metrics their units and help texts in the recorder
/// installed now (a Prometheus exporter prints them as `# HELP`). A store
/// does it when it is built, so only a recorder installed later needs this.
#[cfg(feature = "metrics")]
pub fn describe_metrics() {
    metrics::describe_histogram!(
        DURATION_METRIC,
        metrics::Unit::Seconds,
        "How long adk-postgres store operations took, by operation and outcome (ok or the error kind)."
    );
    metrics::describe_counter!(
        ERRORS_METRIC,
        metrics::Unit::Count,
        "adk-postgres store operations that failed, by operation and error kind."
    );
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::time::Duration;

    use adk_postgres_domain::SessionKey;

    use super::*;

    fn key() -> SessionKey {
        SessionKey::parse("app", "user", "session").expect("key")
    }

    /// One of each variant the store can return: the labels are a contract
    /// with dashboards, so each must stay distinct and none may fall back
    /// to `other`.
    fn every_error() -> Vec<StoreError> {
        vec![
            StoreError::invalid("field", "reason"),
            StoreError::StateTooLarge { field: "state".into(), size: None, limit: 1 },
            StoreError::EventTooLarge { size: 2, limit: 1 },
            StoreError::NotFound(key()),
            StoreError::AlreadyExists(key()),
            StoreError::DuplicateEvent { key: key(), event_id: "e".into() },
            StoreError::StaleSession { key: key(), expected: 1, actual: 2 },
            StoreError::SessionClosed { key: key(), successor: None },
            StoreError::LifetimeExceeded { key: key(), max_lifetime: Duration::from_secs(1) },
            StoreError::PartitionMissing { day: None },
            StoreError::Timeout { what: "lock".into() },
            StoreError::Conflict { message: "deadlock".into() },
            StoreError::PermissionDenied { message: "no".into() },
            StoreError::Unavailable { message: "gone".into() },
            StoreError::Overloaded { waiting: 1, waited: Duration::ZERO },
            StoreError::Database { message: "other".into() },
        ]
    }

    #[test]
    fn every_error_has_its_own_kind() {
        let errors = every_error();
        let kinds: HashSet<_> = errors.iter().map(error_kind).collect();
        assert_eq!(kinds.len(), errors.len(), "{kinds:?}");
        for kind in kinds {
            assert!(kind != OK && kind != "other", "{kind}");
            assert!(kind.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'), "{kind} is not snake_case");
        }
        assert_eq!(error_kind(&StoreError::PartitionMissing { day: None }), "partition_missing");
        assert_eq!(error_kind(&StoreError::Unavailable { message: String::new() }), "unavailable");
    }

    #[test]
    fn operations_have_distinct_names() {
        let names: HashSet<_> = Operation::ALL.iter().map(|op| op.as_str()).collect();
        assert_eq!(names.len(), Operation::ALL.len());
    }
}
