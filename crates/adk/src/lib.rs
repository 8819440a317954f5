//! The adk-rust adapter of adk-postgres: [`PgSessionService`] implements
//! `adk_session::SessionService` on the adk-postgres store, so an
//! `adk-runner` `Runner` keeps its conversations in PostgreSQL unchanged.
//!
//! The README's "Use with adk-rust" snippet is `examples/quickstart.rs`
//! (migrate, connect, run a turn through a `Runner`, read it back, list,
//! rewind); `tests/adk/readme_path.rs` keeps the two identical and runs it on an
//! empty database.
//!
//! # What this crate owns, and what it does not
//!
//! It translates; it does not store. Everything the store promises
//! (one-round-trip appends, gapless sequences, row-locked `user:`/`app:`
//! state, nanosecond-exact `after` filters, idempotent retried appends,
//! partitions, expiry) lives in `adk-postgres-domain`'s `SessionStore`
//! contract and its implementations. This crate maps between the two worlds:
//!
//! - requests and identities: adk's raw strings become validated keys, a bad
//!   one is an invalid-input error naming the field;
//! - events: [`to_store_event`] / [`from_store_event`] carry every field of
//!   an adk `Event` (typed where the store reads it, the rest in `extra`), so
//!   an event reads back exactly as it was appended, to the nanosecond;
//! - state keys: validated as adk-core does (`validate_state_key`) on top of
//!   the store's own rules;
//! - errors: every `StoreError` becomes an `AdkError` of component `session`
//!   with a stable code from [`codes`] and the closest category.
//!
//! The service runs over any `Arc<dyn SessionStore>`: the Postgres store in
//! production (feature `postgres`, on by default), the in-memory reference
//! store in unit tests.
//!
//! With the `scripted` feature, `ScriptedLlm` is a deterministic offline
//! model for tests and demos that drive a real `Runner`; it is small,
//! depends on adk-core only, and stays out of a production build.

#![warn(missing_docs)]

mod error;
mod event;
mod event_json;
mod lease;
mod paging;
#[cfg(feature = "scripted")]
mod scripted;
mod service;
mod session;
mod state;
mod state_access;

pub use error::{codes, to_adk_error};
pub use event::{REDACTION_AT, REDACTION_REASON, REDACTION_STATE_DELTA, from_store_event, to_store_event};
pub use paging::AdkEventsPage;
#[cfg(feature = "scripted")]
pub use scripted::{ScriptedLlm, ScriptedTurn};
pub use service::PgSessionService;

/// The store contract the service runs on, re-exported so one dependency
/// is enough.
pub use adk_postgres_domain as domain;
/// The PostgreSQL store: pool settings, migrations, `PgSessionStore`.
#[cfg(feature = "postgres")]
pub use adk_postgres_storage as storage;

/// Applies the store's pending migrations to the database at `url`; returns
/// the versions applied. Run it once at deploy time (or at start-up) before
/// [`PgSessionService::connect`].
#[cfg(feature = "postgres")]
pub async fn migrate(url: &str) -> adk_core::Result<Vec<String>> {
    adk_postgres_schema::run_pending_migrations(url).await.map_err(|e| {
        adk_core::AdkError::new(
            adk_core::ErrorComponent::Session,
            adk_core::ErrorCategory::Unavailable,
            codes::MIGRATION_FAILED,
            format!("migrating the session store failed: {e}"),
        )
        .with_source(e)
    })
}
