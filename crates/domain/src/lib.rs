//! The contract of adk-postgres: what a session, an event and a state
//! scope are, what the store promises ([`SessionStore`]), its errors, and an
//! in-memory store that keeps the same promises.
//!
//! This crate has no database dependency on purpose: services and adapters
//! can consume the contract without pulling in diesel or a driver.

#![warn(missing_docs)]

pub mod app_list;
pub mod blob;
pub mod error;
pub mod event;
pub mod ids;
pub mod json_events;
pub mod lease;
pub mod memory;
pub mod metadata;
pub mod paging;
pub mod policy;
pub mod redaction;
pub mod session;
pub mod state;
pub mod store;

pub use app_list::{AppPageToken, AppPosition, AppSessionPage, ListAppSessions};
pub use blob::{Blob, BlobHash, DEFAULT_MEDIA_OFFLOAD_BYTES};
pub use error::StoreError;
pub use event::{Event, EventActions, PreparedEvent};
pub use ids::{AppName, SessionId, SessionKey, UserId};
pub use json_events::{JsonEvents, JsonSession};
pub use lease::{DEFAULT_LEASE_IDLE, InvocationLease, LeaseGrant, LeaseState};
pub use memory::InMemoryStore;
pub use metadata::SessionMetadata;
pub use paging::{EventCursor, EventPage, EventsPage, MAX_EVENT_PAGE, SequencedEvent};
pub use policy::{StorePolicy, UsagePolicy};
pub use redaction::{RedactOptions, Redacted, Redaction};
pub use session::{
    AppendOptions, Appended, CreateSession, Erasure, GetOptions, ListSessions, OnExisting, PageToken, Session,
    SessionPage, SessionSummary, StoreConfig,
};
pub use state::{ScopedState, State};
pub use store::SessionStore;
