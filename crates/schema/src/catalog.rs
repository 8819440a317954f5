//! Where the store lives in the database, as the catalog says.

use diesel::QueryableByName;
use diesel::sql_types::Text;
use diesel_async::{AsyncPgConnection, RunQueryDsl};

#[derive(QueryableByName)]
struct SchemaRow {
    #[diesel(sql_type = Text)]
    schema: String,
}

/// The schema holding `adk_events` (so the store's tables and functions) as
/// `conn`'s search path finds it; `None` when the store is not migrated.
pub async fn store_schema(conn: &mut AsyncPgConnection) -> diesel::QueryResult<Option<String>> {
    let rows = diesel::sql_query(
        "SELECT n.nspname::text AS schema FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE c.oid = to_regclass('adk_events')",
    )
    .load::<SchemaRow>(conn)
    .await?;
    Ok(rows.into_iter().next().map(|row| row.schema))
}
