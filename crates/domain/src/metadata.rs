//! What a person sees of a session in a listing: an optional display name
//! and labels. Neither is part of the conversation: changing them is not an
//! append and moves neither the version nor the last update time.
//!
//! Labels are a flat string-to-string map, bounded so that a listing stays
//! cheap to send and a label filter stays cheap to index. The database
//! holds the same bounds as CHECK constraints.

use std::collections::BTreeMap;

use crate::error::StoreError;

/// Most labels one session carries.
pub const MAX_LABELS: usize = 32;
/// Longest label key, in bytes.
pub const MAX_LABEL_KEY_BYTES: usize = 63;
/// Longest label value, in characters.
pub const MAX_LABEL_VALUE_CHARS: usize = 256;
/// Longest display name, in characters.
pub const MAX_DISPLAY_NAME_CHARS: usize = 256;

/// A session's display name and labels.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionMetadata {
    /// A title for people; `None` when it has none.
    pub display_name: Option<String>,
    /// Keys are lowercase ASCII (`a-z`, `0-9`, `_`, `-`, `.`, `/`), starting
    /// with a letter or digit; values are any text without control characters.
    pub labels: BTreeMap<String, String>,
}

impl SessionMetadata {
    /// No display name and no labels.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the display name.
    pub fn with_display_name(mut self, name: impl Into<String>) -> Self {
        self.display_name = Some(name.into());
        self
    }

    /// Adds or replaces the label `key`.
    pub fn with_label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }

    /// Whether there is neither a display name nor a label.
    pub fn is_empty(&self) -> bool {
        self.display_name.is_none() && self.labels.is_empty()
    }

    /// Checks every bound, naming the offending field
    /// (`metadata.display_name`, `metadata.labels.<key>`).
    pub fn validate(&self) -> Result<(), StoreError> {
        if let Some(name) = &self.display_name {
            check_text("metadata.display_name", name, MAX_DISPLAY_NAME_CHARS)?;
            if name.trim().is_empty() {
                return Err(StoreError::invalid("metadata.display_name", "is blank; leave it out instead"));
            }
        }
        validate_labels("metadata.labels", &self.labels)
    }
}

/// Checks a label map: the bounds of [`SessionMetadata::labels`]. Used for a
/// session's labels and for a listing's label filter alike, so a filter can
/// never ask for a label no session could carry.
pub fn validate_labels(field: &str, labels: &BTreeMap<String, String>) -> Result<(), StoreError> {
    if labels.len() > MAX_LABELS {
        return Err(StoreError::invalid(field, format!("has {} labels; at most {MAX_LABELS}", labels.len())));
    }
    for (key, value) in labels {
        check_label_key(field, key)?;
        check_text(&format!("{field}.{key}"), value, MAX_LABEL_VALUE_CHARS)?;
    }
    Ok(())
}

fn check_label_key(field: &str, key: &str) -> Result<(), StoreError> {
    let bad = |reason: &str| StoreError::invalid(format!("{field} key {key:?}"), reason);
    if key.is_empty() || key.len() > MAX_LABEL_KEY_BYTES {
        return Err(bad(&format!("must be 1 to {MAX_LABEL_KEY_BYTES} bytes")));
    }
    let allowed = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '_' | '-' | '.' | '/');
    let starts_well = key.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit());
    if !starts_well || !key.chars().all(allowed) {
        return Err(bad("must be lowercase letters, digits, '_', '-', '.' or '/', starting with a letter or digit"));
    }
    Ok(())
}

fn check_text(field: &str, text: &str, max_chars: usize) -> Result<(), StoreError> {
    let chars = text.chars().count();
    if chars > max_chars {
        return Err(StoreError::invalid(field, format!("is {chars} characters; at most {max_chars}")));
    }
    if text.chars().any(char::is_control) {
        return Err(StoreError::invalid(field, "contains a control character"));
    }
    Ok(())
}

/// Whether `labels` carries every label of `filter` with the same value.
pub fn labels_match(labels: &BTreeMap<String, String>, filter: &BTreeMap<String, String>) -> bool {
    filter.iter().all(|(k, v)| labels.get(k) == Some(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field_of(err: StoreError) -> String {
        match err {
            StoreError::InvalidInput { field, .. } => field,
            other => panic!("expected InvalidInput, got {other:?}"),
        }
    }

    #[test]
    fn accepts_ordinary_metadata() {
        let m = SessionMetadata::new()
            .with_display_name("Trip to Lisbon ✈")
            .with_label("team", "travel")
            .with_label("k8s.io/tier", "gold");
        assert!(m.validate().is_ok());
        assert!(SessionMetadata::new().validate().is_ok());
    }

    #[test]
    fn refuses_bad_labels_naming_the_field() {
        let upper = SessionMetadata::new().with_label("Team", "x");
        assert!(field_of(upper.validate().unwrap_err()).starts_with("metadata.labels key"));
        let control = SessionMetadata::new().with_label("team", "a\u{0}b");
        assert_eq!(field_of(control.validate().unwrap_err()), "metadata.labels.team");
        let long_key = SessionMetadata::new().with_label("k".repeat(64), "v");
        assert!(long_key.validate().is_err());
        let long_value = SessionMetadata::new().with_label("k", "v".repeat(257));
        assert!(long_value.validate().is_err());
        let mut many = SessionMetadata::new();
        for i in 0..=MAX_LABELS {
            many = many.with_label(format!("k{i}"), "v");
        }
        assert_eq!(field_of(many.validate().unwrap_err()), "metadata.labels");
        assert!(SessionMetadata::new().with_label("", "v").validate().is_err());
        assert!(SessionMetadata::new().with_label("-x", "v").validate().is_err());
    }

    #[test]
    fn refuses_bad_display_names() {
        for bad in ["   ", "a\nb", &"x".repeat(257)] {
            let m = SessionMetadata::new().with_display_name(bad);
            assert_eq!(field_of(m.validate().unwrap_err()), "metadata.display_name");
        }
    }

    #[test]
    fn a_filter_matches_when_every_label_is_carried() {
        let labels: BTreeMap<_, _> = [("a".to_owned(), "1".to_owned()), ("b".to_owned(), "2".to_owned())].into();
        assert!(labels_match(&labels, &BTreeMap::new()));
        assert!(labels_match(&labels, &[("a".to_owned(), "1".to_owned())].into()));
        assert!(!labels_match(&labels, &[("a".to_owned(), "2".to_owned())].into()));
        assert!(!labels_match(&labels, &[("c".to_owned(), "1".to_owned())].into()));
    }
}
