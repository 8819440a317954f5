//! The names an index build accepts and the names it gives the index on
//! each partition: both must fit PostgreSQL's 63 bytes, because a name it
//! truncates silently would no longer match the catalog lookups that make
//! a build resumable.

use crate::RetentionError;

/// PostgreSQL truncates identifiers longer than this (NAMEDATALEN - 1).
const MAX_IDENTIFIER_BYTES: usize = 63;
/// An index has at most this many columns (INDEX_MAX_KEYS).
const MAX_INDEX_COLUMNS: usize = 32;

/// Refuses an index name or column list PostgreSQL would truncate, reject
/// or read differently, before anything is looked up.
pub(super) fn check_request(name: &str, columns: &[&str]) -> Result<(), RetentionError> {
    validate_identifier("name", name)?;
    if columns.is_empty() || columns.len() > MAX_INDEX_COLUMNS {
        return Err(RetentionError::InvalidInput {
            field: "columns",
            reason: format!("between 1 and {MAX_INDEX_COLUMNS} columns, got {}", columns.len()),
        });
    }
    for (i, column) in columns.iter().enumerate() {
        validate_identifier("columns", column)?;
        if columns[..i].contains(column) {
            return Err(RetentionError::InvalidInput { field: "columns", reason: format!("{column} is listed twice") });
        }
    }
    Ok(())
}

/// Accepts `[A-Za-z_][A-Za-z0-9_]*` of at most 63 bytes: what PostgreSQL
/// keeps without truncating and what needs no thought when quoted.
fn validate_identifier(field: &'static str, value: &str) -> Result<(), RetentionError> {
    let invalid = |reason: String| Err(RetentionError::InvalidInput { field, reason });
    if value.is_empty() {
        return invalid("must not be empty".into());
    }
    if value.len() > MAX_IDENTIFIER_BYTES {
        return invalid(format!("{value:?} is longer than {MAX_IDENTIFIER_BYTES} bytes"));
    }
    let mut chars = value.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if !first_ok || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return invalid(format!("{value:?} is not an identifier (letters, digits and _, not starting with a digit)"));
    }
    Ok(())
}

/// The name of the index on one partition: `<index>_<partition suffix>`,
/// the suffix being the partition name without `adk_events_` (`p20261105`,
/// `legacy`). Past 63 bytes the index part is cut and a hash of the full
/// name keeps it unique.
pub fn child_index_name(index: &str, partition: &str) -> String {
    let suffix = partition.strip_prefix("adk_events_").unwrap_or(partition);
    let plain = format!("{index}_{suffix}");
    if plain.len() <= MAX_IDENTIFIER_BYTES {
        return plain;
    }
    let hash = fnv1a(plain.as_bytes());
    // <index prefix>_<hash>_<suffix> keeps the partition readable; a suffix
    // too long for that leaves <index prefix>_<longer hash>.
    let tail =
        if suffix.len() <= 30 { format!("_{:08x}_{suffix}", hash & 0xffff_ffff) } else { format!("_{hash:016x}") };
    let keep = MAX_IDENTIFIER_BYTES.saturating_sub(tail.len());
    format!("{}{tail}", truncate_to_boundary(index, keep))
}

fn truncate_to_boundary(text: &str, max_bytes: usize) -> &str {
    if text.len() <= max_bytes {
        return text;
    }
    let mut end = max_bytes;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325_u64, |hash, b| (hash ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_checked() {
        assert!(validate_identifier("name", "adk_events_author").is_ok());
        assert!(validate_identifier("name", "_x1").is_ok());
        for bad in ["", "1abc", "a-b", "a b", "a\"b", "drop table x;", "é"] {
            assert!(validate_identifier("name", bad).is_err(), "{bad:?}");
        }
        assert!(validate_identifier("name", &"a".repeat(63)).is_ok());
        assert!(validate_identifier("name", &"a".repeat(64)).is_err());
    }

    #[test]
    fn child_names_fit_and_stay_unique() {
        assert_eq!(child_index_name("adk_events_author", "adk_events_p20261105"), "adk_events_author_p20261105");
        assert_eq!(child_index_name("ix", "adk_events_legacy"), "ix_legacy");
        let long = "a".repeat(63);
        let one = child_index_name(&long, "adk_events_p20261105");
        let two = child_index_name(&long, "adk_events_p20261106");
        assert!(one.len() <= 63 && two.len() <= 63, "{one} {two}");
        assert_ne!(one, two);
        assert!(one.ends_with("_p20261105"), "{one}");
        let mut other = "a".repeat(62);
        other.push('b');
        assert_ne!(child_index_name(&other, "adk_events_p20261105"), one);
        let huge_partition = "x".repeat(63);
        let three = child_index_name("ix", &huge_partition);
        assert!(three.len() <= 63, "{three}");
        assert_ne!(three, child_index_name("ix", &"y".repeat(63)));
    }
}
