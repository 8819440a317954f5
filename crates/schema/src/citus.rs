//! The store on Citus: which tables are distributed, which are copied to
//! every node, and which functions run where the user's rows are.
//!
//! The migrations are the same for one server and for Citus, and the
//! functions' Citus variants sit beside their files in `crates/schema/sql/`
//! (installed with them, see [`crate::replaceable`]); this module is the
//! step after both, run by [`crate::run_pending_migrations`] whenever the
//! database has the `citus` extension. Every step is idempotent, so it runs
//! again after each later migration and finishes a distribution that was
//! interrupted. Citus sends a replaced function's new body on to the
//! workers itself.
//!
//! - Sessions, events (still partitioned by day) and user states are
//!   distributed by `user_id` and colocated: a user's rows live on one
//!   worker, and every key the store looks up by includes the user.
//! - The policy, the role bindings and app states are reference tables,
//!   copied to every node, because the functions that run on a worker read
//!   them (and an append writes app state).
//! - Every function that takes a user (`p_user_id`) is a distributed function
//!   colocated with the sessions, so a call is sent whole to the worker that
//!   holds the user: one round trip from the coordinator.
//! - Everything else stays on the coordinator: the run records and logs of
//!   maintenance, the usage rollups and the audit logs are written and read
//!   only there, and a reference table would cost them a two-phase commit
//!   across every node for nothing.

use diesel::QueryableByName;
use diesel::connection::SimpleConnection as _;
use diesel::sql_types::{BigInt, Bool, Text};
use diesel_async::AsyncPgConnection;
use diesel_async::async_connection_wrapper::AsyncConnectionWrapper;

use crate::migrations::MigrationError;

type Wrapper = AsyncConnectionWrapper<AsyncPgConnection>;

/// Tables copied to every node, in dependency order: a table's policies and
/// defaults may only use functions whose tables are already known to Citus.
/// Each entry lists the functions to propagate right after it.
const REFERENCE_TABLES: &[(&str, &[&str])] = &[
    // adk_is_store_owner() reads the owner of adk_store_policy; every
    // row-level security policy calls it, and Citus does not follow a
    // policy's function calls, so it is propagated by name.
    ("adk_store_policy", &["adk_is_store_owner()"]),
    (
        "adk_role_apps",
        &[
            "adk_acting_role()",
            "adk_acting_role_name()",
            "adk_role_oids_are_local()",
            "adk_binding_is_acting_role(oid, name)",
            "adk_acting_app()",
            "adk_visible_app()",
        ],
    ),
    ("adk_app_states", &[]),
];

/// Settings of the database on Citus. A tenant set with `SET LOCAL
/// adk.app_name` in a transaction reaches the workers, where row-level
/// security reads it, only when the coordinator propagates SET LOCAL
/// (Citus propagates no session-level SET at all). A clone of the database
/// does not inherit these (they are kept per database, not in it).
pub const DATABASE_SETTINGS: &[(&str, &str)] = &[("citus.propagate_set_commands", "local")];

/// The table whose shards the other distributed tables are colocated with.
const SHARDS_OWNER: &str = "adk_sessions";
/// Tables distributed by user_id in the shards of [`SHARDS_OWNER`].
const COLOCATED_TABLES: &[&str] = &["adk_events", "adk_user_states", "adk_event_redactions"];

/// The column every distributed table is distributed by.
pub const DISTRIBUTION_COLUMN: &str = "user_id";

/// Functions that take a user but must run on the coordinator: erasure
/// writes its audit row and the usage job's invocation tails, which live
/// there only.
/// adk_user_hash reads no table at all.
const COORDINATOR_ONLY: &[&str] = &[
    "adk_erase_user_begin",
    "adk_erase_user_batch",
    "adk_erase_user_check",
    "adk_erase_user_preview",
    "adk_user_hash",
];

/// What the store looks like on Citus once a migrate distributed it
/// ([`crate::citus_layout`] reads it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CitusLayout {
    /// Tables distributed by `user_id` (partitions of adk_events not counted).
    pub distributed_tables: Vec<String>,
    /// Tables copied to every node.
    pub reference_tables: Vec<String>,
    /// Functions delegated to the worker holding their `p_user_id`.
    pub delegated_functions: Vec<String>,
    /// Worker nodes with shards.
    pub workers: i64,
    /// Whether the event trigger keeping other roles' functions and
    /// operators out of the store's schema is installed
    /// (`adk_guard_store_schema`);
    /// only a superuser can install it.
    pub schema_guarded: bool,
}

/// Keeps functions, aggregates, procedures and operators of any role but
/// the store's owner out of the store's schema, on Citus.
///
/// Citus sends the shard queries inside the store's functions with
/// `pg_catalog` names unqualified, and they are parsed again on the worker
/// under the function's `search_path` (`pg_catalog`, the store's schema,
/// `pg_temp`). There an exact-type function planted in the store's schema
/// (say `jsonb_object_agg(text, jsonb)`) beats the catalog's polymorphic
/// one and runs as the owner; on one server the store's `pg_catalog.`
/// qualification rules that out. Workers refuse such DDL from a direct
/// connection ("not allowed on this node"), so the coordinator is the one
/// place to guard. A `format()` template: `%1$L` is the schema, `%2$s`
/// the owner check, `%%` a `%` of the RAISE.
const SCHEMA_GUARD: &str = "
CREATE OR REPLACE FUNCTION adk_guard_store_schema() RETURNS event_trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $guard$
DECLARE
    command record;
BEGIN
    FOR command IN SELECT * FROM pg_catalog.pg_event_trigger_ddl_commands() LOOP
        IF command.object_type IN ('function', 'aggregate', 'procedure', 'operator')
           AND command.schema_name = %1$L
           AND NOT %2$s THEN
            RAISE EXCEPTION 'only the store''s owner may create or move a %% into schema %%',
                            command.object_type, command.schema_name
                USING ERRCODE = 'insufficient_privilege',
                      HINT = 'On Citus, shard queries name catalog functions unqualified; '
                             'a routine here could capture them (docs/citus.md).';
        END IF;
    END LOOP;
END
$guard$;
-- An event trigger runs its function whatever the EXECUTE grants say; no
-- role needs to call it.
REVOKE EXECUTE ON FUNCTION adk_guard_store_schema() FROM PUBLIC;
DROP EVENT TRIGGER IF EXISTS adk_guard_store_schema;
CREATE EVENT TRIGGER adk_guard_store_schema ON ddl_command_end
    WHEN TAG IN ('CREATE FUNCTION', 'CREATE AGGREGATE', 'CREATE PROCEDURE', 'CREATE OPERATOR',
                 'ALTER FUNCTION', 'ALTER AGGREGATE', 'ALTER PROCEDURE', 'ALTER ROUTINE', 'ALTER OPERATOR')
    EXECUTE FUNCTION adk_guard_store_schema();
";

/// Whether the database runs on Citus, as one boolean column `answer`:
/// the one test for it, shared by the migrations and by the operations that
/// take another path there (retention).
pub const CITUS_INSTALLED_SQL: &str =
    "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'citus') AS answer";

/// Whether the database has the citus extension.
pub(crate) fn citus_installed(conn: &mut Wrapper) -> Result<bool, MigrationError> {
    ask(conn, diesel::sql_query(CITUS_INSTALLED_SQL), "looking for the citus extension")
}

/// The one boolean column, named `answer`, of a catalog question.
#[derive(QueryableByName)]
pub(crate) struct Answer {
    #[diesel(sql_type = Bool)]
    pub(crate) answer: bool,
}

/// The one text column, named `text`, of each row of a catalog query.
#[derive(QueryableByName)]
pub(crate) struct TextRow {
    #[diesel(sql_type = Text)]
    pub(crate) text: String,
}

/// Runs `query`, which answers yes or no in a column named `answer`.
fn ask<'q, Q>(conn: &mut Wrapper, query: Q, asking: &str) -> Result<bool, MigrationError>
where
    Q: diesel::query_dsl::LoadQuery<'q, Wrapper, Answer>,
{
    let row: Answer = query.get_result(conn).map_err(|e| citus_error(asking, e))?;
    Ok(row.answer)
}

/// Creates the citus extension in the database when it is missing. The
/// server must load it (`shared_preload_libraries = 'citus'`), and the
/// workers must be added with `citus_add_node` before [`distribute`] for the
/// shards to be spread.
pub(crate) fn create_extension(conn: &mut Wrapper) -> Result<(), MigrationError> {
    conn.batch_execute("CREATE EXTENSION IF NOT EXISTS citus")
        .map_err(|e| citus_error("creating the citus extension (is citus in shared_preload_libraries?)", e))
}

/// Distributes the store's tables and functions; a no-op for what is done.
pub(crate) fn distribute(conn: &mut Wrapper) -> Result<CitusLayout, MigrationError> {
    // Citus refuses tables with triggers unless told that each trigger
    // touches only its own row: the store's triggers check a row's bounds
    // and keep two logs that exist on the coordinator only (migration 18).
    conn.batch_execute("SET citus.enable_unsafe_triggers = on")
        .map_err(|e| citus_error("allowing the store's triggers on distributed tables", e))?;

    for (table, functions) in REFERENCE_TABLES {
        if !is_distributed(conn, table)? {
            run_bound(conn, "SELECT create_reference_table($1::regclass)", table)?;
            run_bound(conn, "SELECT truncate_local_data_after_distributing_table($1::regclass)", table)?;
        }
        for function in *functions {
            run_bound(conn, "SELECT create_distributed_function($1::regprocedure)", function)?;
        }
    }

    // The rows a live database had stay on the coordinator's disk, unseen,
    // until truncated; a table can be truncated only once every table
    // referencing it is distributed too, so that waits for the last one.
    let mut copied = Vec::new();
    if !is_distributed(conn, SHARDS_OWNER)? {
        run_bound(conn, "SELECT create_distributed_table($1::regclass, 'user_id')", SHARDS_OWNER)?;
        copied.push(SHARDS_OWNER);
    }
    for table in COLOCATED_TABLES {
        if !is_distributed(conn, table)? {
            let sql = "SELECT create_distributed_table($1::regclass, 'user_id', colocate_with => 'adk_sessions')";
            run_bound(conn, sql, table)?;
            copied.push(table);
        }
    }
    for table in copied.iter().rev() {
        run_bound(conn, "SELECT truncate_local_data_after_distributing_table($1::regclass)", table)?;
    }

    for function in functions_taking_a_user(conn)? {
        run_bound(
            conn,
            "SELECT create_distributed_function($1::regprocedure, 'p_user_id', colocate_with => 'adk_sessions')",
            &function,
        )?;
    }
    install_schema_guard(conn)?;
    for (setting, value) in DATABASE_SETTINGS {
        // The database's name is quoted by format(); the pairs are constants.
        conn.batch_execute(&format!(
            "DO $$ BEGIN
                 EXECUTE pg_catalog.format('ALTER DATABASE %I SET {setting} = %L', pg_catalog.current_database(), '{value}');
             END $$"
        ))
        .map_err(|e| citus_error(&format!("setting {setting} for the database"), e))?;
    }
    conn.batch_execute("RESET citus.enable_unsafe_triggers")
        .map_err(|e| citus_error("resetting citus.enable_unsafe_triggers", e))?;
    layout(conn)
}

/// Installs [`SCHEMA_GUARD`] when the migrating role is a superuser (event
/// triggers need one); `layout` tells whether it is there.
fn install_schema_guard(conn: &mut Wrapper) -> Result<(), MigrationError> {
    use diesel::RunQueryDsl as _;
    let superuser = ask(
        conn,
        diesel::sql_query(
            "SELECT coalesce((SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname = current_user), false)
                    AS answer",
        ),
        "asking whether the migrating role is a superuser",
    )?;
    if !superuser {
        return Ok(());
    }
    // The schema and the owner's role are read when the guard is made; the
    // owner check runs per command, so a later change of owner is honoured.
    let owner_check = "pg_catalog.pg_has_role(current_user,
        (SELECT c.relowner FROM pg_catalog.pg_class c
          WHERE c.oid = pg_catalog.to_regclass(pg_catalog.quote_ident(command.schema_name) || '.adk_store_policy')),
        'MEMBER')";
    let row: TextRow = diesel::sql_query("SELECT pg_catalog.format($1, pg_catalog.current_schema(), $2) AS text")
        .bind::<Text, _>(SCHEMA_GUARD)
        .bind::<Text, _>(owner_check)
        .get_result(conn)
        .map_err(|e| citus_error("preparing the store schema's guard", e))?;
    conn.batch_execute(&row.text).map_err(|e| citus_error("installing the store schema's guard", e))
}

/// How the store is laid out on Citus now.
pub(crate) fn layout(conn: &mut Wrapper) -> Result<CitusLayout, MigrationError> {
    #[derive(QueryableByName)]
    struct Count {
        #[diesel(sql_type = BigInt)]
        count: i64,
    }
    use diesel::RunQueryDsl as _;
    let names = |conn: &mut Wrapper, sql: &str| -> Result<Vec<String>, MigrationError> {
        let rows: Vec<TextRow> =
            diesel::sql_query(sql).load(conn).map_err(|e| citus_error("reading the Citus layout", e))?;
        Ok(rows.into_iter().map(|row| row.text).collect())
    };
    let distributed_tables = names(
        conn,
        "SELECT p.logicalrelid::regclass::text AS text
           FROM pg_dist_partition p JOIN pg_catalog.pg_class c ON c.oid = p.logicalrelid
          WHERE p.partmethod = 'h' AND NOT c.relispartition
          ORDER BY 1",
    )?;
    let reference_tables = names(
        conn,
        "SELECT p.logicalrelid::regclass::text AS text FROM pg_dist_partition p
          WHERE p.partmethod = 'n' AND p.repmodel = 't' ORDER BY 1",
    )?;
    let delegated_functions = names(
        conn,
        "SELECT o.objid::regprocedure::text AS text FROM pg_dist_object o
          WHERE o.classid = 'pg_catalog.pg_proc'::regclass AND o.distribution_argument_index IS NOT NULL
          ORDER BY 1",
    )?;
    let workers: Count = diesel::sql_query(
        "SELECT count(*) AS count FROM pg_dist_node WHERE noderole = 'primary' AND shouldhaveshards AND isactive",
    )
    .get_result(conn)
    .map_err(|e| citus_error("counting the Citus workers", e))?;
    let schema_guarded = ask(
        conn,
        diesel::sql_query(
            "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_event_trigger
                             WHERE evtname = 'adk_guard_store_schema' AND evtenabled <> 'D') AS answer",
        ),
        "looking for the store schema's guard",
    )?;
    Ok(CitusLayout {
        distributed_tables,
        reference_tables,
        delegated_functions,
        workers: workers.count,
        schema_guarded,
    })
}

fn is_distributed(conn: &mut Wrapper, table: &str) -> Result<bool, MigrationError> {
    ask(
        conn,
        diesel::sql_query(
            "SELECT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = $1::regclass) AS answer",
        )
        .bind::<Text, _>(table),
        &format!("asking Citus about {table}"),
    )
}

/// The store's functions with a `p_user_id` argument, by signature, but
/// those that must stay on the coordinator.
fn functions_taking_a_user(conn: &mut Wrapper) -> Result<Vec<String>, MigrationError> {
    #[derive(QueryableByName)]
    struct Signature {
        #[diesel(sql_type = Text)]
        signature: String,
        #[diesel(sql_type = Text)]
        name: String,
    }
    use diesel::RunQueryDsl as _;
    let rows: Vec<Signature> = diesel::sql_query(
        "SELECT p.oid::regprocedure::text AS signature, p.proname::text AS name FROM pg_catalog.pg_proc p
          WHERE p.pronamespace = pg_catalog.current_schema()::regnamespace
            AND p.proname LIKE 'adk\\_%' AND 'p_user_id' = ANY (p.proargnames)
          ORDER BY 1",
    )
    .load(conn)
    .map_err(|e| citus_error("listing the store's functions", e))?;
    Ok(rows.into_iter().filter(|row| !COORDINATOR_ONLY.contains(&row.name.as_str())).map(|row| row.signature).collect())
}

fn run_bound(conn: &mut Wrapper, sql: &str, value: &str) -> Result<(), MigrationError> {
    use diesel::RunQueryDsl as _;
    diesel::sql_query(sql).bind::<Text, _>(value).execute(conn).map(drop).map_err(|e| {
        citus_error(&format!("{} for {value}", sql.trim_start_matches("SELECT ").split('(').next().unwrap_or(sql)), e)
    })
}

fn citus_error(what: &str, error: impl std::fmt::Display) -> MigrationError {
    MigrationError::Citus(format!("{what}: {error}"))
}
