//! Catalog lookups that index builds and the conversion share: both must
//! tell a valid index from an INVALID leftover and a matching definition
//! from a clash before they build anything, and read it the same way.

use diesel::QueryableByName;
use diesel::sql_types::{Array, Bool, Text};
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use crate::RetentionError;

/// One index as the catalog describes it.
#[derive(Debug, Clone, QueryableByName)]
pub(crate) struct IndexInfo {
    #[diesel(sql_type = Text)]
    pub name: String,
    #[diesel(sql_type = Text)]
    pub table_name: String,
    #[diesel(sql_type = Bool)]
    pub valid: bool,
    #[diesel(sql_type = Bool)]
    pub is_unique: bool,
    /// btree on plain columns: no expressions, no predicate, no INCLUDE.
    #[diesel(sql_type = Bool)]
    pub plain: bool,
    #[diesel(sql_type = Array<Text>)]
    pub columns: Vec<String>,
}

/// Indexes of one schema; callers add the rest of the WHERE clause.
const INDEX_INFO_SQL: &str = "\
SELECT i.relname::text AS name, t.relname::text AS table_name, x.indisvalid AS valid,
       x.indisunique AS is_unique,
       (am.amname = 'btree' AND x.indexprs IS NULL AND x.indpred IS NULL AND x.indnkeyatts = x.indnatts) AS plain,
       ARRAY(SELECT a.attname::text
             FROM unnest(x.indkey::int2[]) WITH ORDINALITY k(attnum, ord)
             JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = k.attnum
             ORDER BY k.ord) AS columns
FROM pg_index x
JOIN pg_class i ON i.oid = x.indexrelid
JOIN pg_class t ON t.oid = x.indrelid
JOIN pg_namespace n ON n.oid = i.relnamespace
JOIN pg_am am ON am.oid = i.relam
WHERE n.nspname = $1";

/// Every index in `schema`.
pub(crate) async fn schema_indexes(
    conn: &mut AsyncPgConnection,
    schema: &str,
) -> Result<Vec<IndexInfo>, RetentionError> {
    diesel::sql_query(INDEX_INFO_SQL)
        .bind::<Text, _>(schema)
        .load::<IndexInfo>(conn)
        .await
        .map_err(RetentionError::query("read the indexes"))
}

/// The index `schema.name`, if there is one.
pub(crate) async fn index_info(
    conn: &mut AsyncPgConnection,
    schema: &str,
    name: &str,
) -> Result<Option<IndexInfo>, RetentionError> {
    let mut rows = diesel::sql_query(format!("{INDEX_INFO_SQL} AND i.relname = $2"))
        .bind::<Text, _>(schema)
        .bind::<Text, _>(name)
        .load::<IndexInfo>(conn)
        .await
        .map_err(RetentionError::query(format!("look up index {name}")))?;
    Ok(rows.pop())
}

#[derive(QueryableByName)]
struct KindRow {
    #[diesel(sql_type = Text)]
    kind: String,
}

/// `pg_class.relkind` of `schema.name`, `None` when there is no such relation.
pub(crate) async fn relation_kind(
    conn: &mut AsyncPgConnection,
    schema: &str,
    name: &str,
) -> Result<Option<String>, RetentionError> {
    let mut rows = diesel::sql_query(
        "SELECT c.relkind::text AS kind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = $1 AND c.relname = $2",
    )
    .bind::<Text, _>(schema)
    .bind::<Text, _>(name)
    .load::<KindRow>(conn)
    .await
    .map_err(RetentionError::query(format!("look up {name}")))?;
    Ok(rows.pop().map(|r| r.kind))
}

#[derive(QueryableByName)]
struct ColumnNameRow {
    #[diesel(sql_type = Text)]
    name: String,
}

/// The columns of `schema.table`, in no particular order.
pub(crate) async fn table_columns(
    conn: &mut AsyncPgConnection,
    schema: &str,
    table: &str,
) -> Result<Vec<String>, RetentionError> {
    let rows = diesel::sql_query(
        "SELECT a.attname::text AS name FROM pg_attribute a
         JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = $1 AND c.relname = $2 AND a.attnum > 0 AND NOT a.attisdropped",
    )
    .bind::<Text, _>(schema)
    .bind::<Text, _>(table)
    .load::<ColumnNameRow>(conn)
    .await
    .map_err(RetentionError::query(format!("list the columns of {table}")))?;
    Ok(rows.into_iter().map(|r| r.name).collect())
}
