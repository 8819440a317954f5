//! Identifier newtypes, validated once at construction so a store never sees
//! an empty, oversize or NUL-carrying key.

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

macro_rules! identifier {
    ($(#[$doc:meta])* $name:ident, $field:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            /// The field name used in errors about this identifier.
            pub const FIELD: &'static str = $field;

            /// Validates `value` as is: 1 to 128 characters, no NUL.
            pub fn new(value: impl Into<String>) -> Result<Self, StoreError> {
                let value = value.into();
                validate($field, &value)?;
                Ok(Self(value))
            }

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
    AppName,
    "app_name"
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
    pub app_name: AppName,
    pub user_id: UserId,
    pub session_id: SessionId,
}

impl SessionKey {
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

    #[test]
    fn deserializing_validates() {
        assert!(serde_json::from_str::<AppName>("\"\"").is_err());
        assert_eq!(serde_json::from_str::<AppName>("\"a\"").unwrap().as_str(), "a");
    }
}
