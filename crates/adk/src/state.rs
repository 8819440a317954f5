//! State maps between adk (`HashMap`) and the store (`serde_json::Map`), and
//! the adk-core key rules the store does not know about.

use std::collections::HashMap;

use adk_core::AdkError;
use adk_postgres_domain::State;
use serde_json::Value;

use crate::error::{codes, invalid};

/// Checks every key the way adk-core does (`validate_state_key`: not empty,
/// at most 256 bytes, no `/`, `\`, `..` or NUL). The store adds its own rules
/// (no control characters, no bare scope prefix) and reports those itself.
/// `temp:` keys are checked too: they are dropped, but a malformed key is a
/// bug worth reporting rather than ignoring.
pub(crate) fn validate_keys<'a>(field: &str, keys: impl IntoIterator<Item = &'a String>) -> Result<(), AdkError> {
    for key in keys {
        if let Err(reason) = adk_core::validate_state_key(key) {
            return Err(invalid(codes::INVALID_STATE_KEY, format!("invalid {field}[{key:?}]: {reason}")));
        }
    }
    Ok(())
}

/// Keys sorted, so the stored JSON of a delta does not depend on a
/// `HashMap`'s iteration order.
pub(crate) fn to_store_state(state: &HashMap<String, Value>) -> State {
    let mut entries: Vec<(&String, &Value)> = state.iter().collect();
    entries.sort_unstable_by_key(|(k, _)| *k);
    entries.into_iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adk_key_rules_apply() {
        for bad in ["", "a/b", "a\\b", "..", "user:../x", "a\0b"] {
            let keys = [bad.to_owned()];
            let err = validate_keys("state", &keys).unwrap_err();
            assert_eq!(err.code, codes::INVALID_STATE_KEY, "{bad:?}");
        }
        let keys = ["user:name".to_owned(), "temp:x".to_owned(), "app:a.b".to_owned()];
        assert!(validate_keys("state", &keys).is_ok());
    }
}
