//! Step \[4\], the swap: one transaction, under `lock_timeout`, that renames
//! the old table, puts the partitioned parent in its place and attaches the
//! old table as its legacy partition. Only catalog work happens in it;
//! everything that reads data was done beforehand with weak locks, and the
//! transaction checks before it commits that the attach adopted that work
//! instead of redoing it under the lock.

use adk_postgres_schema::quote::{quote_ident, quote_literal};
use chrono::NaiveDate;

use super::catalog::{Catalog, ConstraintRow};
use super::layout::unrecognised;
use super::layout::{
    EVENTS, LEGACY_EVENT_ID_KEY, LEGACY_FKEY, LEGACY_PARTITION, LEGACY_PKEY, PARENT_EVENT_ID_KEY, PARENT_PKEY,
    SESSION_DAY, SESSIONS, parent_ddl,
};
use super::steps::Action;
use crate::RetentionError;
use crate::partitions::partition_name;

/// A literal that casts to the relation `name` in the pinned schema.
fn regclass(name: &str) -> String {
    format!("{}::regclass", quote_literal(&quote_ident(name)))
}

const PRIVILEGES: [&str; 7] = ["SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER"];

pub(super) fn swap_actions(catalog: &Catalog, cutover: NaiveDate) -> Result<Vec<Action>, RetentionError> {
    let events = catalog.relation(EVENTS).ok_or_else(|| unrecognised("adk_events is missing".into()))?;
    let (parent, legacy, sessions) = (quote_ident(EVENTS), quote_ident(LEGACY_PARTITION), quote_ident(SESSIONS));
    let next = cutover
        .succ_opt()
        .ok_or_else(|| RetentionError::InvalidInput { field: "cutover", reason: "has no day after it".into() })?;

    // The old key, event-id and foreign-key constraints (whatever they are
    // called): without session_day they cannot exist on a partition of the
    // new parent, and the names may be the ones the parent is about to use.
    let old: Vec<&ConstraintRow> = catalog
        .constraints
        .iter()
        .filter(|c| c.table_name == EVENTS && matches!(c.kind.as_str(), "p" | "u" | "f"))
        .filter(|c| !c.columns.iter().any(|col| col == SESSION_DAY))
        .collect();
    for taken in [PARENT_PKEY, PARENT_EVENT_ID_KEY] {
        let freed = old.iter().any(|c| c.kind != "f" && c.name == taken);
        if catalog.relation(taken).is_some() && !freed {
            return Err(unrecognised(format!("{taken}, a name the partitioned parent needs, is taken")));
        }
    }

    let mut sql = vec![
        // Sessions first: appends lock the session row and then write the
        // event, so taking the locks in the other order could deadlock.
        // ACCESS EXCLUSIVE on adk_sessions is what dropping the old foreign
        // key takes anyway; everything below is catalog work.
        format!("LOCK TABLE {sessions}, {parent} IN ACCESS EXCLUSIVE MODE"),
        format!("ALTER TABLE {parent} RENAME TO {legacy}"),
        // PostgreSQL 18 keeps NOT NULL constraints in pg_constraint, named
        // after their table (adk_events_seq_not_null): the old table's
        // would take the names the parent is about to use, and the parent
        // would get adk_events_seq_not_null1 where a fresh install has
        // adk_events_seq_not_null. They take the names a partition made
        // as adk_events_legacy would have. Before 18 there are none.
        format!(
            "DO $rename$
DECLARE
    c record;
BEGIN
    FOR c IN SELECT con.conname::text AS name, a.attname::text AS col
               FROM pg_constraint con
               JOIN pg_attribute a ON a.attrelid = con.conrelid AND a.attnum = con.conkey[1]
              WHERE con.conrelid = {legacy_oid} AND con.contype = 'n'
                AND con.conname = {events} || '_' || a.attname || '_not_null'
    LOOP
        EXECUTE pg_catalog.format('ALTER TABLE %I RENAME CONSTRAINT %I TO %I',
                                  {legacy_name}, c.name, {legacy_name} || '_' || c.col || '_not_null');
    END LOOP;
END
$rename$",
            legacy_oid = regclass(LEGACY_PARTITION),
            events = quote_literal(EVENTS),
            legacy_name = quote_literal(LEGACY_PARTITION),
        ),
    ];
    if !old.is_empty() {
        let drops: Vec<String> = old.iter().map(|c| format!("DROP CONSTRAINT {}", quote_ident(&c.name))).collect();
        sql.push(format!("ALTER TABLE {legacy} {}", drops.join(", ")));
    }
    sql.push(format!(
        "ALTER TABLE {legacy} ADD CONSTRAINT {pkey} PRIMARY KEY USING INDEX {pkey}, \
         ADD CONSTRAINT {idkey} UNIQUE USING INDEX {idkey}, ALTER COLUMN {day} DROP DEFAULT",
        pkey = quote_ident(LEGACY_PKEY),
        idkey = quote_ident(LEGACY_EVENT_ID_KEY),
        day = quote_ident(SESSION_DAY),
    ));
    sql.push(parent_ddl()?.to_owned());
    // The service's privileges were granted on the old table; the parent
    // is what it queries from now on.
    for grant in &catalog.grants {
        let privilege = PRIVILEGES
            .iter()
            .find(|p| **p == grant.privilege)
            .ok_or_else(|| unrecognised(format!("unknown privilege {} on adk_events", grant.privilege)))?;
        let grantee = grant.grantee.as_deref().map_or_else(|| "PUBLIC".to_owned(), quote_ident);
        let option = if grant.grantable { " WITH GRANT OPTION" } else { "" };
        sql.push(format!("GRANT {privilege} ON {parent} TO {grantee}{option}"));
        // Access goes through the parent (and its row-level security), as
        // for every other partition: none keeps privileges of its own.
        sql.push(format!("REVOKE {privilege} ON {legacy} FROM {grantee}"));
    }
    sql.push(format!(
        "ALTER TABLE {parent} ATTACH PARTITION {legacy} FOR VALUES FROM (MINVALUE) TO ({})",
        quote_literal(&cutover.to_string())
    ));
    let first_day = quote_ident(&partition_name(cutover));
    sql.push(format!(
        "CREATE TABLE {first_day} PARTITION OF {parent} FOR VALUES FROM ({}) TO ({})",
        quote_literal(&cutover.to_string()),
        quote_literal(&next.to_string())
    ));
    // Last, because attaching needs the running role to own the parent.
    if events.owner != catalog.current_user {
        for table in [&parent, &first_day] {
            sql.push(format!("ALTER TABLE {table} OWNER TO {}", quote_ident(&events.owner)));
        }
    }
    // Checked before commit: the attach must have adopted the indexes and
    // the foreign key built in step 3 (anything else would have been built
    // or checked under this lock) and left the parent fully valid.
    sql.push(format!(
        "DO $verify$
DECLARE
    problem text;
BEGIN
    SELECT string_agg(x.indexrelid::regclass::text, ', ') INTO problem
      FROM pg_index x WHERE x.indrelid = {parent_oid} AND NOT x.indisvalid;
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'invalid index on adk_events after the attach: %', problem;
    END IF;
    SELECT string_agg(c.conname::text, ', ') INTO problem
      FROM pg_constraint c WHERE c.conrelid IN ({parent_oid}, {legacy_oid}) AND NOT c.convalidated;
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'constraint not validated after the attach: %', problem;
    END IF;
    IF (SELECT count(*) FROM pg_inherits h WHERE h.inhrelid IN ({pkey_oid}, {idkey_oid})) <> 2
       OR (SELECT count(*) FROM pg_index x WHERE x.indrelid = {legacy_oid}
             AND EXISTS (SELECT 1 FROM pg_inherits h WHERE h.inhrelid = x.indexrelid)) <> 2 THEN
        RAISE EXCEPTION 'the attach did not adopt the prebuilt indexes';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conrelid = {legacy_oid}
                     AND c.conname = {fkey_name} AND c.conparentid <> 0) THEN
        RAISE EXCEPTION 'the attach did not adopt the validated foreign key';
    END IF;
END
$verify$",
        parent_oid = regclass(EVENTS),
        legacy_oid = regclass(LEGACY_PARTITION),
        pkey_oid = regclass(LEGACY_PKEY),
        idkey_oid = regclass(LEGACY_EVENT_ID_KEY),
        fkey_name = quote_literal(LEGACY_FKEY),
    ));
    Ok(vec![
        Action::Swap(sql.join(";\n")),
        // Autovacuum never analyzes a partitioned parent; plans over the
        // whole log need its statistics. Outside the transaction: it reads.
        Action::Ddl(format!("ANALYZE {parent}")),
    ])
}
