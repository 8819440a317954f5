//! State scopes. ADK keeps one flat key space per session; the prefix of a
//! key decides where it lives: `app:` keys are shared by every user of the
//! app, `user:` keys by every session of the user, `temp:` keys live only for
//! the current invocation and are never persisted, and unprefixed keys belong
//! to the session.

use serde_json::{Map, Value};

use crate::error::StoreError;

/// A JSON object of state keys to values.
pub type State = Map<String, Value>;

/// Marks a key shared by every user of the app.
pub const APP_PREFIX: &str = "app:";
/// Marks a key shared by every session of the user.
pub const USER_PREFIX: &str = "user:";
/// Marks a key that lives only for the current invocation; never stored.
pub const TEMP_PREFIX: &str = "temp:";

/// Longest state key, in bytes.
pub const MAX_STATE_KEY_BYTES: usize = 256;

/// The most bytes one scope's state may take, as JSON text; the database
/// enforces the same bound on the stored jsonb (`pg_column_size < 65536`).
pub const MAX_STATE_BYTES: usize = 65_535;

/// State split by scope, prefixes stripped. `temp:` keys are gone.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ScopedState {
    /// `app:` keys, prefix stripped.
    pub app: State,
    /// `user:` keys, prefix stripped.
    pub user: State,
    /// Unprefixed keys: the session's own.
    pub session: State,
}

impl ScopedState {
    /// Splits `state` by prefix, validating every key; `field` names the
    /// input in errors (e.g. `state` or `event.actions.state_delta`).
    pub fn split(field: &str, state: &State) -> Result<Self, StoreError> {
        let mut scoped = Self::default();
        for (key, value) in state {
            validate_key(field, key)?;
            if contains_nul(value) {
                return Err(StoreError::invalid(
                    format!("{field}[{key:?}]"),
                    "contains a NUL character, which PostgreSQL cannot store in jsonb",
                ));
            }
            if key.starts_with(TEMP_PREFIX) {
                continue;
            } else if let Some(name) = key.strip_prefix(APP_PREFIX) {
                scoped.app.insert(name.to_owned(), value.clone());
            } else if let Some(name) = key.strip_prefix(USER_PREFIX) {
                scoped.user.insert(name.to_owned(), value.clone());
            } else {
                scoped.session.insert(key.clone(), value.clone());
            }
        }
        Ok(scoped)
    }

    /// Whether no scope holds a key.
    pub fn is_empty(&self) -> bool {
        self.app.is_empty() && self.user.is_empty() && self.session.is_empty()
    }

    /// Refuses a scope whose JSON is over [`MAX_STATE_BYTES`] before it
    /// reaches a database.
    pub fn check_sizes(&self, field: &str) -> Result<(), StoreError> {
        for (scope, state) in [("app", &self.app), ("user", &self.user), ("session", &self.session)] {
            let size = json_size(state);
            if size > MAX_STATE_BYTES {
                return Err(StoreError::StateTooLarge {
                    field: format!("{field} ({scope} scope)"),
                    size: Some(size),
                    limit: MAX_STATE_BYTES,
                });
            }
        }
        Ok(())
    }

    /// One flat state with prefixes restored: what an agent sees.
    pub fn merged(&self) -> State {
        merge_scopes(&self.session, &self.user, &self.app)
    }
}

/// Merges stored scopes into the flat view an agent sees.
pub fn merge_scopes(session: &State, user: &State, app: &State) -> State {
    SharedScopes::new(user, app).merge_into(session.clone())
}

/// The user and app scopes with their prefixes restored, made once and laid
/// over many sessions of one user (a listed page) without building each
/// prefixed key again.
#[derive(Debug, Clone, Default)]
pub struct SharedScopes(Vec<(String, Value)>);

impl SharedScopes {
    /// The stored user and app scopes, prefixed once.
    pub fn new(user: &State, app: &State) -> Self {
        let app = app.iter().map(|(key, value)| (format!("{APP_PREFIX}{key}"), value.clone()));
        let user = user.iter().map(|(key, value)| (format!("{USER_PREFIX}{key}"), value.clone()));
        Self(app.chain(user).collect())
    }

    /// `session` with the shared scopes laid over it; its own entries move
    /// into the result instead of being copied.
    pub fn merge_into(&self, mut session: State) -> State {
        for (key, value) in &self.0 {
            session.insert(key.clone(), value.clone());
        }
        session
    }
}

/// Shallow merge: each key in `delta` replaces the stored value (JSON null
/// included), matching PostgreSQL's `jsonb || jsonb`.
pub fn apply_delta(target: &mut State, delta: &State) {
    for (key, value) in delta {
        target.insert(key.clone(), value.clone());
    }
}

/// Checks a delta for one shared scope, as written by `merge_user_state` or
/// `merge_app_state`, by the rules an append's delta is held to: every key
/// valid, no NUL anywhere, and the delta itself under the size cap (`scope`
/// names the scope in that error). Its keys are the scope's own, as stored,
/// so a key with a scope prefix is refused: stripping it could move a
/// `temp:` or `app:` key somewhere the caller did not mean, and storing it
/// would read back as `user:user:…`.
pub fn check_scope_delta(field: &str, scope: &str, delta: &State) -> Result<(), StoreError> {
    for (key, value) in delta {
        validate_key(field, key)?;
        if [APP_PREFIX, USER_PREFIX, TEMP_PREFIX].iter().any(|prefix| key.starts_with(prefix)) {
            return Err(StoreError::invalid(
                format!("{field}[{key:?}]"),
                format!("the {scope} scope's own keys carry no scope prefix (app:, user:, temp:)"),
            ));
        }
        if contains_nul(value) {
            return Err(StoreError::invalid(
                format!("{field}[{key:?}]"),
                "contains a NUL character, which PostgreSQL cannot store in jsonb",
            ));
        }
    }
    let size = json_size(delta);
    if size > MAX_STATE_BYTES {
        return Err(StoreError::StateTooLarge {
            field: format!("{field} ({scope} scope)"),
            size: Some(size),
            limit: MAX_STATE_BYTES,
        });
    }
    Ok(())
}

/// A copy of `state` without `temp:` keys.
pub fn without_temp(state: &State) -> State {
    state.iter().filter(|(k, _)| !k.starts_with(TEMP_PREFIX)).map(|(k, v)| (k.clone(), v.clone())).collect()
}

fn validate_key(field: &str, key: &str) -> Result<(), StoreError> {
    let problem = if key.is_empty() {
        Some("a state key must not be empty".to_owned())
    } else if key.len() > MAX_STATE_KEY_BYTES {
        Some(format!("a state key is {} bytes, more than {MAX_STATE_KEY_BYTES}", key.len()))
    } else if key.chars().any(char::is_control) {
        Some("a state key must not contain control characters".to_owned())
    } else if [APP_PREFIX, USER_PREFIX, TEMP_PREFIX].iter().any(|p| key.len() == p.len() && key.starts_with(p)) {
        Some("a scope prefix must be followed by a name".to_owned())
    } else {
        None
    };
    match problem {
        Some(reason) => Err(StoreError::invalid(format!("{field}[{key:?}]"), reason)),
        None => Ok(()),
    }
}

/// Whether any string or key inside `value` holds U+0000, which jsonb refuses.
pub fn contains_nul(value: &Value) -> bool {
    match value {
        Value::String(s) => s.contains('\0'),
        Value::Array(items) => items.iter().any(contains_nul),
        Value::Object(map) => map.iter().any(|(k, v)| k.contains('\0') || contains_nul(v)),
        _ => false,
    }
}

/// Bytes of the compact JSON text of `state`.
pub fn json_size(state: &State) -> usize {
    serde_json::to_vec(state).map(|v| v.len()).unwrap_or(usize::MAX)
}

/// Turns a JSON value that must be an object into a state map.
pub fn state_from_value(field: &str, value: Value) -> Result<State, StoreError> {
    match value {
        Value::Object(map) => Ok(map),
        Value::Null => Ok(State::new()),
        other => Err(StoreError::invalid(field, format!("must be a JSON object, got {}", json_kind(&other)))),
    }
}

pub(crate) fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn obj(v: Value) -> State {
        v.as_object().cloned().unwrap()
    }

    #[test]
    fn split_routes_by_prefix_and_drops_temp() {
        let scoped =
            ScopedState::split("state", &obj(json!({"a": 1, "app:b": 2, "user:c": 3, "temp:d": 4, "appx": 5})))
                .unwrap();
        assert_eq!(scoped.session, obj(json!({"a": 1, "appx": 5})));
        assert_eq!(scoped.app, obj(json!({"b": 2})));
        assert_eq!(scoped.user, obj(json!({"c": 3})));
        assert_eq!(scoped.merged(), obj(json!({"a": 1, "appx": 5, "app:b": 2, "user:c": 3})));
    }

    #[test]
    fn bad_keys_name_the_field() {
        for key in ["", "user:", "temp:", "a\u{1}b", &"k".repeat(257)] {
            let err = ScopedState::split("state", &obj(json!({ key: 1 }))).unwrap_err();
            assert!(matches!(&err, StoreError::InvalidInput { field, .. } if field.starts_with("state[")), "{err}");
        }
    }

    #[test]
    fn nul_in_values_is_refused() {
        let err = ScopedState::split("state", &obj(json!({"a": ["x\u{0}"]}))).unwrap_err();
        assert!(matches!(err, StoreError::InvalidInput { .. }));
    }

    #[test]
    fn oversize_scope_is_refused_before_the_database() {
        let scoped = ScopedState::split("state", &obj(json!({"big": "x".repeat(70_000)}))).unwrap();
        assert!(matches!(scoped.check_sizes("state"), Err(StoreError::StateTooLarge { .. })));
    }

    #[test]
    fn scope_deltas_refuse_prefixes_nul_and_oversize_naming_the_key() {
        for key in ["user:a", "app:a", "temp:a", "", "a\u{1}b"] {
            let err = check_scope_delta("delta", "user", &obj(json!({ key: 1 }))).unwrap_err();
            assert!(matches!(&err, StoreError::InvalidInput { field, .. } if field.starts_with("delta[")), "{err}");
        }
        let err = check_scope_delta("delta", "app", &obj(json!({"a": {"b": "x\u{0}"}}))).unwrap_err();
        assert!(matches!(&err, StoreError::InvalidInput { field, .. } if field == "delta[\"a\"]"), "{err}");
        let err = check_scope_delta("delta", "app", &obj(json!({"big": "x".repeat(70_000)}))).unwrap_err();
        assert!(matches!(&err, StoreError::StateTooLarge { field, .. } if field == "delta (app scope)"), "{err}");
        assert!(check_scope_delta("delta", "user", &obj(json!({"appx": null, "a:b": [1]}))).is_ok());
    }

    #[test]
    fn delta_null_replaces() {
        let mut s = obj(json!({"a": 1, "b": 2}));
        apply_delta(&mut s, &obj(json!({"a": null, "c": 3})));
        assert_eq!(s, obj(json!({"a": null, "b": 2, "c": 3})));
    }
}
