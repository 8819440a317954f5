//! WORKAROUND(store-rewind): `rewind` on the store's current operations.
//!
//! adk's rewind keeps a session's events up to a point, drops the rest, and
//! rebuilds the session-scoped state from the kept events' deltas; `app:` and
//! `user:` state are not rewound. The store cannot truncate a session in
//! place yet, so this rewrites it: delete, re-create under the same key (same
//! expiry), and re-append the kept events as stored. Re-appending must not
//! re-apply their `app:`/`user:` deltas (that would move shared state back in
//! time), so those parts travel in the event's actions under
//! [`REWIND_SHARED_DELTA`] and are merged back when the event is read.
//!
//! Limits, until the store gains an atomic rewind (see the crate's report):
//! it is not atomic (a crash between the delete and the last append loses
//! the tail of the rewritten session) and it must not race appends to the
//! same session; `created_at` becomes the time of the rewind.
//!
//! Delete this module when the store can rewind a session itself.

use std::time::Duration;

use adk_core::AdkError;
use adk_postgres_domain::state::{APP_PREFIX, TEMP_PREFIX, USER_PREFIX};
use adk_postgres_domain::{
    AppendOptions, CreateSession, Event, GetOptions, Session, SessionKey, SessionStore, State, StoreError,
};
use chrono::Utc;
use serde_json::Value;

use crate::error::to_adk_error;
use crate::event::REWIND_SHARED_DELTA;

fn is_shared(key: &str) -> bool {
    key.starts_with(APP_PREFIX) || key.starts_with(USER_PREFIX)
}

/// The session-scoped state the first `keep` events build.
fn rebuilt_state(events: &[Event]) -> State {
    let mut state = State::new();
    for event in events {
        for (k, v) in &event.actions.state_delta {
            if !is_shared(k) && !k.starts_with(TEMP_PREFIX) {
                state.insert(k.clone(), v.clone());
            }
        }
    }
    state
}

/// The event to re-append: the shared part of its delta moved aside.
fn for_replay(mut event: Event) -> Event {
    let mut shared = match event.actions.extra.remove(REWIND_SHARED_DELTA) {
        Some(Value::Object(map)) => map,
        _ => State::new(),
    };
    let (moved, kept): (State, State) =
        std::mem::take(&mut event.actions.state_delta).into_iter().partition(|(k, _)| is_shared(k));
    shared.extend(moved);
    event.actions.state_delta = kept;
    if !shared.is_empty() {
        event.actions.extra.insert(REWIND_SHARED_DELTA.to_owned(), Value::Object(shared));
    }
    event
}

/// Rewinds `current` (loaded with all its events) to its first `keep` events.
pub(crate) async fn rewind(store: &dyn SessionStore, current: Session, keep: usize) -> Result<Session, AdkError> {
    let key = current.key.clone();
    if current.closed_at.is_some() {
        return Err(to_adk_error(StoreError::SessionClosed { key, successor: current.successor }));
    }
    let mut events = current.events;
    events.truncate(keep);
    let session_state: State = current.state.into_iter().filter(|(k, _)| !is_shared(k)).collect();
    let unchanged = events.len() == current.version as usize && session_state == rebuilt_state(&events);
    if unchanged {
        return get_all(store, &key).await;
    }

    let ttl = current.expires_at.map(|at| (at - Utc::now()).to_std().unwrap_or(Duration::from_millis(1)));
    store.delete(&key).await.map_err(to_adk_error)?;
    let mut request = CreateSession::new(key.app_name.clone(), key.user_id.clone()).with_id(key.session_id.as_str());
    request.ttl = ttl;
    store.create(request).await.map_err(to_adk_error)?;
    for event in events {
        store.append(&key, for_replay(event), AppendOptions::default()).await.map_err(to_adk_error)?;
    }
    get_all(store, &key).await
}

async fn get_all(store: &dyn SessionStore, key: &SessionKey) -> Result<Session, AdkError> {
    store.get(key, GetOptions::default()).await.map_err(to_adk_error)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn replay_moves_the_shared_delta_aside_and_keeps_earlier_moves() {
        let mut event = Event::new("agent");
        event.actions.state_delta = json!({"a": 1, "user:b": 2, "app:c": 3}).as_object().cloned().unwrap();
        event.actions.extra.insert(REWIND_SHARED_DELTA.into(), json!({"user:z": 0}));
        let replay = for_replay(event);
        assert_eq!(Value::Object(replay.actions.state_delta), json!({"a": 1}));
        assert_eq!(replay.actions.extra[REWIND_SHARED_DELTA], json!({"user:z": 0, "user:b": 2, "app:c": 3}));
    }

    #[test]
    fn state_is_rebuilt_from_session_scoped_deltas_only() {
        let mut first = Event::new("agent");
        first.actions.state_delta = json!({"a": 1, "user:b": 2}).as_object().cloned().unwrap();
        let mut second = Event::new("agent");
        second.actions.state_delta = json!({"a": 2, "c": null}).as_object().cloned().unwrap();
        assert_eq!(Value::Object(rebuilt_state(&[first, second])), json!({"a": 2, "c": null}));
    }
}
