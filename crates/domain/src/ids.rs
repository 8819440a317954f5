//! Identifier newtypes, validated once at construction so a store never sees
//! an empty, oversize or NUL-carrying key, nor an app name that only looks
//! like another.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::StoreError;

/// Longest app name, user id or session id, in characters; the database
/// enforces the same bound with CHECK constraints.
pub const MAX_ID_CHARS: usize = 128;

fn validate(field: &'static str, value: &str) -> Result<(), StoreError> {
    if value.is_empty() {
        return Err(StoreError::invalid(field, "must not be empty"));
    }
    let chars = value.chars().count();
    if chars > MAX_ID_CHARS {
        return Err(StoreError::invalid(field, format!("is {chars} characters, more than {MAX_ID_CHARS}")));
    }
    if value.contains('\0') {
        return Err(StoreError::invalid(field, "contains a NUL character"));
    }
    Ok(())
}

/// The extra rule of app names, which tenants are keyed (and roles bound)
/// by: no invisible difference between two names that look the same.
fn validate_app_name(field: &'static str, value: &str) -> Result<(), StoreError> {
    if value.starts_with(char::is_whitespace) || value.ends_with(char::is_whitespace) {
        return Err(StoreError::invalid(field, "has leading or trailing whitespace; remove it"));
    }
    if value.contains(char::is_control) {
        return Err(StoreError::invalid(field, "contains a control character; remove it"));
    }
    // `is_nfc` answers from the quick check (`is_nfc_quick`) and normalises
    // only when that says "maybe".
    if !unicode_normalization::is_nfc(value) {
        return Err(StoreError::invalid(field, "is not in Unicode NFC form; normalise it (NFC) before use"));
    }
    Ok(())
}

macro_rules! identifier {
    ($(#[$doc:meta])* $name:ident, $field:literal $(, $extra:path)?) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            /// The field name used in errors about this identifier.
            pub const FIELD: &'static str = $field;

            /// Validates `value` as is, never altering it: 1 to 128
            /// characters, no NUL, and any rule the type adds.
            pub fn new(value: impl Into<String>) -> Result<Self, StoreError> {
                let value = value.into();
                validate($field, &value)?;
                $($extra($field, &value)?;)?
                Ok(Self(value))
            }

            /// The identifier as given.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl TryFrom<String> for $name {
            type Error = StoreError;
            fn try_from(value: String) -> Result<Self, Self::Error> {
                Self::new(value)
            }
        }

        impl TryFrom<&str> for $name {
            type Error = StoreError;
            fn try_from(value: &str) -> Result<Self, Self::Error> {
                Self::new(value)
            }
        }

        impl From<$name> for String {
            fn from(value: $name) -> String {
                value.0
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
    };
}

identifier!(
    /// The agent application a session belongs to; the tenant boundary.
    ///
    /// It is the tenant key that database roles are bound to, so two names
    /// must not look alike yet differ: besides the rules of every identifier,
    /// an app name must be in Unicode NFC, must not start or end with
    /// whitespace and must not contain control characters. A name breaking
    /// these is refused, never normalised or trimmed. Valid names are compared
    /// byte for byte, so case matters: `AppA` and `appa` are two tenants.
    AppName,
    "app_name",
    validate_app_name
);
identifier!(
    /// The end user a session belongs to, unique within an app.
    UserId,
    "user_id"
);
identifier!(
    /// A session's id, unique within (app, user).
    SessionId,
    "session_id"
);

impl SessionId {
    /// A fresh UUIDv4 id.
    pub fn generate() -> Self {
        Self(uuid::Uuid::new_v4().to_string())
    }

    /// The id a create call uses: a caller-supplied id trimmed of surrounding
    /// whitespace, or a generated one when the id is absent or blank.
    pub fn from_requested(requested: Option<&str>) -> Result<Self, StoreError> {
        match requested.map(str::trim) {
            None | Some("") => Ok(Self::generate()),
            Some(id) => Self::new(id),
        }
    }
}

/// The full address of a session: every call carries all three parts, so a
/// lookup can never reach another user's session.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct SessionKey {
    /// The application the session belongs to.
    pub app_name: AppName,
    /// The user within that application.
    pub user_id: UserId,
    /// The session, unique per app and user.
    pub session_id: SessionId,
}

impl SessionKey {
    /// The key of three already validated parts.
    pub fn new(app_name: AppName, user_id: UserId, session_id: SessionId) -> Self {
        Self { app_name, user_id, session_id }
    }

    /// Validates three raw strings into a key.
    pub fn parse(app_name: &str, user_id: &str, session_id: &str) -> Result<Self, StoreError> {
        Ok(Self::new(AppName::new(app_name)?, UserId::new(user_id)?, SessionId::new(session_id)?))
    }
}

impl fmt::Display for SessionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.app_name, self.user_id, self.session_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_empty_long_and_nul() {
        assert!(matches!(AppName::new(""), Err(StoreError::InvalidInput { field, .. }) if field == "app_name"));
        assert!(UserId::new("u".repeat(129)).is_err());
        assert!(UserId::new("u".repeat(128)).is_ok());
        assert!(SessionId::new("a\0b").is_err());
        // 128 multi-byte characters are fine: the bound is in characters.
        assert!(SessionId::new("é".repeat(128)).is_ok());
    }

    #[test]
    fn requested_ids_are_trimmed_or_generated() {
        assert_eq!(SessionId::from_requested(Some("  abc ")).unwrap().as_str(), "abc");
        let generated = SessionId::from_requested(Some("   ")).unwrap();
        assert!(uuid::Uuid::parse_str(generated.as_str()).is_ok());
        assert!(uuid::Uuid::parse_str(SessionId::from_requested(None).unwrap().as_str()).is_ok());
    }

    fn app_name_refusal(value: &str) -> String {
        match AppName::new(value) {
            Err(StoreError::InvalidInput { field, reason }) if field == "app_name" => reason,
            other => panic!("{value:?} was not refused as an app name: {other:?}"),
        }
    }

    #[test]
    fn app_names_must_be_nfc_and_are_never_normalised() {
        let nfc = "caf\u{e9}";
        let nfd = "cafe\u{301}";
        assert_eq!(AppName::new(nfc).unwrap().as_str(), nfc);
        let reason = app_name_refusal(nfd);
        assert!(reason.contains("NFC"), "{reason}");
        // A singleton decomposition (OHM SIGN -> OMEGA) is not NFC either.
        assert!(app_name_refusal("\u{2126}").contains("NFC"));
        assert!(AppName::new("\u{3a9}").is_ok());
        // Hangul and other scripts already in NFC are fine.
        assert!(AppName::new("\u{d55c}\u{ad6d}\u{c5b4}").is_ok());
        assert!(AppName::new("\u{65e5}\u{672c}\u{8a9e}").is_ok());
        // The rule is the app name's: other identifiers keep theirs.
        assert_eq!(UserId::new(nfd).unwrap().as_str(), nfd);
        assert_eq!(SessionId::new(nfd).unwrap().as_str(), nfd);
    }

    #[test]
    fn app_names_refuse_surrounding_whitespace_and_control_characters() {
        for bad in ["appA ", " appA", "appA\n", "\u{a0}appA", "appA\u{3000}", " "] {
            let reason = app_name_refusal(bad);
            assert!(reason.contains("whitespace"), "{bad:?}: {reason}");
        }
        for bad in ["app\tA", "app\u{7}", "app\u{7f}A", "app\u{85}A", "app\rA"] {
            let reason = app_name_refusal(bad);
            assert!(reason.contains("control character"), "{bad:?}: {reason}");
        }
        // Whitespace inside a name is visible and allowed.
        assert_eq!(AppName::new("app A").unwrap().as_str(), "app A");
        assert!(UserId::new(" u ").is_ok() && SessionId::new("s\t").is_ok());
    }

    #[test]
    fn app_names_compare_byte_for_byte() {
        let upper = AppName::new("AppA").unwrap();
        let lower = AppName::new("appa").unwrap();
        assert_ne!(upper, lower);
        assert_eq!(upper, AppName::new("AppA").unwrap());
    }

    #[test]
    fn app_names_keep_the_rules_of_every_identifier() {
        assert_eq!(app_name_refusal(""), "must not be empty");
        assert!(app_name_refusal(&"p".repeat(129)).contains("more than 128"));
        assert!(AppName::new("p".repeat(128)).is_ok());
        assert!(AppName::new("\u{e9}".repeat(128)).is_ok());
        assert_eq!(app_name_refusal("a\0b"), "contains a NUL character");
    }

    #[test]
    fn deserializing_validates() {
        assert!(serde_json::from_str::<AppName>("\"appA \"").is_err());
        assert!(serde_json::from_str::<AppName>("\"cafe\\u0301\"").is_err());
        assert!(serde_json::from_str::<AppName>("\"\"").is_err());
        assert_eq!(serde_json::from_str::<AppName>("\"a\"").unwrap().as_str(), "a");
    }
}
