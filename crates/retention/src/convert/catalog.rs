//! What the conversion reads of the catalog, once per step: the catalog,
//! not a record of our own, says which steps are done, so a rerun after any
//! interruption agrees with the run before it.

use std::collections::{BTreeMap, BTreeSet};

use adk_postgres_schema::quote::quote_ident;
use diesel::QueryableByName;
use diesel::sql_types::{Array, BigInt, Bool, Nullable, Text};
use diesel_async::{AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};

use super::layout::MIGRATIONS_TABLE;
use crate::RetentionError;
use crate::catalog::{IndexInfo, schema_indexes};
use adk_postgres_operations::{LockPolicy, connect, events_schema, first_row};

/// An operations connection whose search path is the tables' schema, so
/// migration 000001's unqualified DDL lands next to the old table.
pub(super) async fn open(
    database_url: &str,
    application_name: &str,
    policy: &LockPolicy,
) -> Result<(AsyncPgConnection, String), RetentionError> {
    let mut conn = connect(database_url, application_name, policy).await?;
    let schema = events_schema(&mut conn).await?;
    conn.batch_execute(&format!("SET search_path TO {}", quote_ident(&schema)))
        .await
        .map_err(RetentionError::query("set the search path"))?;
    Ok((conn, schema))
}

#[derive(Debug, Clone, QueryableByName)]
pub(super) struct RelationRow {
    #[diesel(sql_type = Text)]
    pub(super) name: String,
    #[diesel(sql_type = Text)]
    pub(super) kind: String,
    #[diesel(sql_type = Text)]
    pub(super) owner: String,
    /// Row-level security enabled, or policies defined.
    #[diesel(sql_type = Bool)]
    pub(super) secured: bool,
    /// A partition or inheritance child, or has children.
    #[diesel(sql_type = Bool)]
    pub(super) in_hierarchy: bool,
    /// Foreign keys of other tables that point here.
    #[diesel(sql_type = BigInt)]
    pub(super) referenced_by: i64,
}

#[derive(Debug, Clone, QueryableByName)]
pub(super) struct ColumnRow {
    #[diesel(sql_type = Text)]
    pub(super) table_name: String,
    #[diesel(sql_type = Text)]
    pub(super) name: String,
    #[diesel(sql_type = Text)]
    pub(super) type_name: String,
    #[diesel(sql_type = Bool)]
    pub(super) not_null: bool,
    #[diesel(sql_type = Nullable<Text>)]
    pub(super) default_expr: Option<String>,
}

#[derive(Debug, Clone, QueryableByName)]
pub(super) struct ConstraintRow {
    #[diesel(sql_type = Text)]
    pub(super) table_name: String,
    #[diesel(sql_type = Text)]
    pub(super) name: String,
    #[diesel(sql_type = Text)]
    pub(super) kind: String,
    #[diesel(sql_type = Bool)]
    pub(super) validated: bool,
    #[diesel(sql_type = Text)]
    pub(super) definition: String,
    #[diesel(sql_type = Array<Text>)]
    pub(super) columns: Vec<String>,
}

#[derive(Debug, Clone, QueryableByName)]
pub(super) struct GrantRow {
    /// `None` for PUBLIC.
    #[diesel(sql_type = Nullable<Text>)]
    pub(super) grantee: Option<String>,
    #[diesel(sql_type = Text)]
    pub(super) privilege: String,
    #[diesel(sql_type = Bool)]
    pub(super) grantable: bool,
}

#[derive(QueryableByName)]
struct TextRow {
    #[diesel(sql_type = Text)]
    pub(super) value: String,
}

/// What the conversion needs to know about the two tables.
#[derive(Debug, Clone)]
pub(super) struct Catalog {
    pub(super) current_user: String,
    pub(super) relations: BTreeMap<String, RelationRow>,
    pub(super) columns: Vec<ColumnRow>,
    pub(super) indexes: Vec<IndexInfo>,
    pub(super) constraints: Vec<ConstraintRow>,
    /// Privileges granted on `adk_events` to others than its owner.
    pub(super) grants: Vec<GrantRow>,
    /// Versions in `__diesel_schema_migrations`; `None` without the table.
    pub(super) migrations: Option<BTreeSet<String>>,
}

impl Catalog {
    pub(super) async fn read(conn: &mut AsyncPgConnection, schema: &str) -> Result<Self, RetentionError> {
        let relations = diesel::sql_query(
            "SELECT c.relname::text AS name, c.relkind::text AS kind, pg_get_userbyid(c.relowner)::text AS owner,
                    (c.relrowsecurity OR EXISTS (SELECT 1 FROM pg_policy p WHERE p.polrelid = c.oid)) AS secured,
                    EXISTS (SELECT 1 FROM pg_inherits h WHERE h.inhparent = c.oid OR h.inhrelid = c.oid) AS in_hierarchy,
                    (SELECT count(*) FROM pg_constraint f
                     WHERE f.confrelid = c.oid AND f.conrelid <> c.oid AND f.conparentid = 0) AS referenced_by
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = $1 AND (c.relname LIKE 'adk\\_%' OR c.relname = $2)",
        )
        .bind::<Text, _>(schema)
        .bind::<Text, _>(MIGRATIONS_TABLE)
        .load::<RelationRow>(conn)
        .await
        .map_err(RetentionError::query("read the tables"))?;
        let relations: BTreeMap<String, RelationRow> = relations.into_iter().map(|r| (r.name.clone(), r)).collect();

        let columns = diesel::sql_query(
            "SELECT c.relname::text AS table_name, a.attname::text AS name,
                    format_type(a.atttypid, a.atttypmod) AS type_name, a.attnotnull AS not_null,
                    pg_get_expr(d.adbin, d.adrelid) AS default_expr
             FROM pg_attribute a
             JOIN pg_class c ON c.oid = a.attrelid
             JOIN pg_namespace n ON n.oid = c.relnamespace
             LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
             WHERE n.nspname = $1 AND c.relname IN ('adk_events', 'adk_sessions')
               AND a.attnum > 0 AND NOT a.attisdropped",
        )
        .bind::<Text, _>(schema)
        .load::<ColumnRow>(conn)
        .await
        .map_err(RetentionError::query("read the columns"))?;

        let indexes = schema_indexes(conn, schema).await?;

        let constraints = diesel::sql_query(
            "SELECT t.relname::text AS table_name, c.conname::text AS name, c.contype::text AS kind,
                    c.convalidated AS validated, pg_get_constraintdef(c.oid) AS definition,
                    ARRAY(SELECT a.attname::text
                          FROM unnest(c.conkey) WITH ORDINALITY k(attnum, ord)
                          JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.attnum
                          ORDER BY k.ord) AS columns
             FROM pg_constraint c
             JOIN pg_class t ON t.oid = c.conrelid
             JOIN pg_namespace n ON n.oid = t.relnamespace
             WHERE n.nspname = $1 AND t.relname IN ('adk_events', 'adk_sessions')",
        )
        .bind::<Text, _>(schema)
        .load::<ConstraintRow>(conn)
        .await
        .map_err(RetentionError::query("read the constraints"))?;

        let grants = diesel::sql_query(
            "SELECT CASE WHEN g.grantee = 0 THEN NULL ELSE pg_get_userbyid(g.grantee)::text END AS grantee,
                    g.privilege_type::text AS privilege, g.is_grantable AS grantable
             FROM pg_class c
             JOIN pg_namespace n ON n.oid = c.relnamespace
             CROSS JOIN LATERAL aclexplode(c.relacl) g
             WHERE n.nspname = $1 AND c.relname = 'adk_events' AND g.grantee <> c.relowner
             ORDER BY 1, 2",
        )
        .bind::<Text, _>(schema)
        .load::<GrantRow>(conn)
        .await
        .map_err(RetentionError::query("read the privileges on adk_events"))?;

        let migrations = if relations.get(MIGRATIONS_TABLE).is_some_and(|r| r.kind == "r") {
            let rows =
                diesel::sql_query(format!("SELECT version::text AS value FROM {}", quote_ident(MIGRATIONS_TABLE)))
                    .load::<TextRow>(conn)
                    .await
                    .map_err(RetentionError::query("read the applied migrations"))?;
            Some(rows.into_iter().map(|r| r.value).collect())
        } else {
            None
        };

        let current_user = diesel::sql_query("SELECT current_user::text AS value")
            .load::<TextRow>(conn)
            .await
            .and_then(first_row)
            .map_err(RetentionError::query("read current_user"))?
            .value;

        Ok(Self { current_user, relations, columns, indexes, constraints, grants, migrations })
    }

    pub(super) fn relation(&self, name: &str) -> Option<&RelationRow> {
        self.relations.get(name)
    }

    pub(super) fn column(&self, table: &str, name: &str) -> Option<&ColumnRow> {
        self.columns.iter().find(|c| c.table_name == table && c.name == name)
    }

    pub(super) fn index(&self, name: &str) -> Option<&IndexInfo> {
        self.indexes.iter().find(|i| i.name == name)
    }

    pub(super) fn constraint(&self, table: &str, name: &str) -> Option<&ConstraintRow> {
        self.constraints.iter().find(|c| c.table_name == table && c.name == name)
    }
}
