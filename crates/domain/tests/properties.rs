//! Property tests of the domain layer. `cargo xtask test` runs each with at
//! least 256 cases (`PROPTEST_CASES`).

use adk_postgres_domain::state::{APP_PREFIX, TEMP_PREFIX, USER_PREFIX, merge_scopes};
use adk_postgres_domain::{AppName, Event, ScopedState, SessionId, State, StoreError, UserId};
use proptest::prelude::*;
use serde_json::{Map, Value};

/// Arbitrary JSON without NUL characters (which jsonb cannot hold, and the
/// store refuses up front).
fn json_value() -> impl Strategy<Value = Value> {
    let text = "[^\u{0}]{0,12}";
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(Value::from),
        text.prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 32, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(text, inner, 0..6).prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A valid state key name (no prefix): printable, non-empty.
fn key_name() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9_\\-. '\"%;]{1,20}"
}

fn scoped_key() -> impl Strategy<Value = String> {
    (prop_oneof![Just(""), Just(APP_PREFIX), Just(USER_PREFIX), Just(TEMP_PREFIX)], key_name())
        .prop_map(|(prefix, name)| format!("{prefix}{name}"))
        .prop_filter("a bare prefix is not a key", |k| {
            ![APP_PREFIX, USER_PREFIX, TEMP_PREFIX].iter().any(|p| k.starts_with(p) && k.len() == p.len())
        })
}

fn state() -> impl Strategy<Value = State> {
    prop::collection::btree_map(scoped_key(), json_value(), 0..12).prop_map(|m| m.into_iter().collect())
}

proptest! {
    #[test]
    fn identifiers_accept_exactly_1_to_128_chars_without_nul(raw in "\\PC{0,140}", nul in any::<bool>()) {
        let value = if nul { format!("{raw}\u{0}") } else { raw.clone() };
        let chars = value.chars().count();
        let valid = (1..=128).contains(&chars) && !value.contains('\0');
        let parsed = UserId::new(value.clone());
        prop_assert_eq!(parsed.is_ok(), valid);
        if let Err(StoreError::InvalidInput { field, .. }) = &parsed {
            prop_assert_eq!(field.as_str(), "user_id");
        }
        if let Ok(id) = parsed {
            prop_assert_eq!(id.as_str(), value.as_str(), "stored literally, never altered");
        }
    }

    #[test]
    fn app_names_also_refuse_names_that_only_look_alike(raw in "\\s?[\\PC\\t\\u{7}]{0,140}\\s?") {
        let lookalike = raw.trim() != raw || raw.contains(char::is_control) || !unicode_normalization::is_nfc(&raw);
        let valid = UserId::new(raw.clone()).is_ok() && !lookalike;
        let parsed = AppName::new(raw.clone());
        prop_assert_eq!(parsed.is_ok(), valid);
        if let Err(StoreError::InvalidInput { field, .. }) = &parsed {
            prop_assert_eq!(field.as_str(), "app_name");
        }
        if let Ok(name) = parsed {
            prop_assert_eq!(name.as_str(), raw.as_str(), "stored literally, never altered");
        }
    }

    #[test]
    fn requested_session_ids_are_trimmed_or_generated(raw in "\\s{0,3}[^\u{0}\\s]{0,10}\\s{0,3}") {
        let id = SessionId::from_requested(Some(&raw)).expect("valid");
        if raw.trim().is_empty() {
            prop_assert!(uuid::Uuid::parse_str(id.as_str()).is_ok());
        } else {
            prop_assert_eq!(id.as_str(), raw.trim());
        }
    }

    #[test]
    fn splitting_and_merging_state_round_trips_without_temp(state in state()) {
        let scoped = ScopedState::split("state", &state).expect("valid keys");
        let merged = merge_scopes(&scoped.session, &scoped.user, &scoped.app);
        let expected: Map<String, Value> =
            state.iter().filter(|(k, _)| !k.starts_with(TEMP_PREFIX)).map(|(k, v)| (k.clone(), v.clone())).collect();
        prop_assert_eq!(merged, expected);
        prop_assert!(scoped.session.keys().all(|k| !k.starts_with(APP_PREFIX) && !k.starts_with(USER_PREFIX)));
    }

    #[test]
    fn scopes_split_again_to_themselves(state in state()) {
        let scoped = ScopedState::split("state", &state).expect("valid keys");
        let again = ScopedState::split("state", &scoped.merged()).expect("merged keys are valid");
        prop_assert_eq!(again, scoped);
    }

    #[test]
    fn events_round_trip_arbitrary_json_in_every_open_field(
        content in json_value(),
        extra in prop::collection::btree_map("[a-z_]{1,10}", json_value(), 0..4),
        delta in state(),
        nanos in 0i64..4_000_000_000_000_000_000,
    ) {
        let mut event = Event::new("agent");
        event.content = Some(content);
        event.actions.state_delta = delta;
        event.timestamp = adk_postgres_domain::event::nanos_to_timestamp(nanos);
        for (k, v) in extra {
            // Keys the typed fields own are not "unknown".
            if !["id", "invocation_id", "author", "timestamp", "branch", "content", "actions", "partial", "turn_complete"].contains(&k.as_str()) {
                event.extra.insert(k, v);
            }
        }
        let text = serde_json::to_string(&event).expect("serialize");
        let back = Event::from_json(&text).expect("parse");
        prop_assert_eq!(back.timestamp_nanos().expect("in range"), nanos);
        // `content: null` is indistinguishable from no content in JSON.
        if event.content == Some(Value::Null) {
            event.content = None;
        }
        prop_assert_eq!(back, event);
    }

    #[test]
    fn malformed_event_json_is_always_a_typed_error(text in "\\PC{0,64}") {
        match Event::from_json(&text) {
            Ok(_) => prop_assert!(
                serde_json::from_str::<Value>(&text).is_ok_and(|v| v.is_object()),
                "accepted something that is not a JSON object: {:?}", text
            ),
            Err(StoreError::InvalidInput { field, .. }) => prop_assert_eq!(field.as_str(), "event"),
            Err(other) => prop_assert!(false, "unexpected error {:?}", other),
        }
    }
}
