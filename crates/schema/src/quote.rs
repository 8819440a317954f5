//! Quoting for the few SQL texts that must be built rather than bound:
//! identifiers (tables, roles, indexes, schemas) and the DDL positions that
//! take no bind parameters (partition bounds, defaults). Every crate that
//! builds such text quotes it here, so there is one spelling of the rules.

/// `"name"` with embedded quotes doubled: every identifier built from data
/// goes through here.
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `'text'` with embedded quotes doubled, for the few DDL positions that take
/// no bind parameters (partition bounds, defaults). Text with a backslash
/// becomes an `E'…'` literal with the backslash doubled, as libpq's
/// `PQescapeLiteral` does: a plain literal would read a backslash
/// differently under `standard_conforming_strings = off`.
pub fn quote_literal(text: &str) -> String {
    let quoted = text.replace('\'', "''");
    if text.contains('\\') { format!("E'{}'", quoted.replace('\\', "\\\\")) } else { format!("'{quoted}'") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_doubles_embedded_quotes() {
        assert_eq!(quote_ident("a\"b"), "\"a\"\"b\"");
        assert_eq!(quote_literal("it's"), "'it''s'");
        assert_eq!(quote_literal(r"a\'b"), r"E'a\\''b'");
    }
}
