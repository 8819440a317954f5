//! The service role: the non-owner role an agent service connects as, so
//! that row-level security applies to it (owners are exempt).
//!
//! The role is granted the four store tables through their parents only:
//! a partition queried directly would bypass the parent's policies, so the
//! service role gets no privilege on any partition. It may read the store
//! policy and premake partitions through `adk_premake_event_partitions()`,
//! nothing more.

use diesel::QueryableByName;
use diesel::sql_types::{Bool, Text};
use diesel_async::{AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};

use crate::error::OpsError;
use crate::sql::{LockPolicy, connect, ddl, events_schema, first_row, quote_ident, quote_literal};

/// The tables a service role reads and writes.
pub const STORE_TABLES: [&str; 4] = ["adk_sessions", "adk_events", "adk_user_states", "adk_app_states"];

/// The policy row the store functions read.
pub const POLICY_TABLE: &str = "adk_store_policy";

/// The SECURITY DEFINER function that premakes today's (and the policy's
/// coming days') partitions for a caller that does not own the tables.
pub const PREMAKE_FUNCTION: &str = "adk_premake_event_partitions";

/// How to set the role up.
#[derive(Debug, Clone, Default)]
pub struct ServiceRoleOptions {
    /// Create the role when it does not exist (as `LOGIN`).
    pub create: bool,
    /// Set (or change) its password.
    pub password: Option<String>,
}

/// What setting the role up did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct ServiceRoleReport {
    pub role: String,
    pub created: bool,
    pub granted: Vec<String>,
}

#[derive(QueryableByName)]
struct RoleRow {
    #[diesel(sql_type = Bool)]
    superuser: bool,
    #[diesel(sql_type = Bool)]
    bypass_rls: bool,
    #[diesel(sql_type = Bool)]
    owns_tables: bool,
}

#[derive(QueryableByName)]
struct ExistsRow {
    #[diesel(sql_type = Bool)]
    exists: bool,
}

fn check_role_name(role: &str) -> Result<(), OpsError> {
    if role.is_empty() || role.len() > 63 || role.contains('\0') {
        return Err(OpsError::InvalidInput { field: "role", reason: "must be 1 to 63 bytes without NUL".into() });
    }
    Ok(())
}

async fn role_exists(conn: &mut AsyncPgConnection, role: &str) -> Result<bool, OpsError> {
    Ok(diesel::sql_query("SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1) AS exists")
        .bind::<Text, _>(role)
        .load::<ExistsRow>(conn)
        .await
        .and_then(first_row)
        .map_err(OpsError::query("look the role up"))?
        .exists)
}

/// Grants `role` what the store needs, creating it first when asked, and
/// refuses a role that row-level security would not restrict.
pub async fn setup_service_role(
    database_url: &str,
    role: &str,
    options: &ServiceRoleOptions,
) -> Result<ServiceRoleReport, OpsError> {
    check_role_name(role)?;
    let policy = LockPolicy::default();
    let mut conn = connect(database_url, "adk-pg service-role", &policy).await?;
    let schema = events_schema(&mut conn).await?;
    let quoted_role = quote_ident(role);
    let mut report = ServiceRoleReport { role: role.to_owned(), ..ServiceRoleReport::default() };

    if !role_exists(&mut conn, role).await? {
        if !options.create {
            return Err(OpsError::InvalidInput { field: "role", reason: format!("role {role} does not exist") });
        }
        // Two setups racing: the loser's CREATE fails; it checks again.
        if let Err(e) = conn.batch_execute(&format!("CREATE ROLE {quoted_role} LOGIN")).await
            && !role_exists(&mut conn, role).await?
        {
            return Err(OpsError::Query { context: format!("create role {role}"), source: e });
        }
        report.created = true;
    }
    if let Some(password) = &options.password {
        conn.batch_execute(&format!("ALTER ROLE {quoted_role} PASSWORD {}", quote_literal(password)))
            .await
            .map_err(OpsError::query("set the role's password"))?;
    }

    let row = diesel::sql_query(
        "SELECT r.rolsuper AS superuser, r.rolbypassrls AS bypass_rls,
                EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = to_regclass('adk_sessions')
                        AND pg_has_role(r.oid, c.relowner, 'USAGE')) AS owns_tables
         FROM pg_roles r WHERE r.rolname = $1",
    )
    .bind::<Text, _>(role)
    .load::<RoleRow>(&mut conn)
    .await
    .and_then(first_row)
    .map_err(OpsError::query("inspect the role"))?;
    if row.superuser || row.bypass_rls || row.owns_tables {
        return Err(OpsError::Conflict(format!(
            "role {role} is exempt from row-level security (superuser, BYPASSRLS or owner of the tables); \
             the service must run as a role that is none of these"
        )));
    }

    let schema = quote_ident(&schema);
    ddl(&mut conn, &format!("GRANT USAGE ON SCHEMA {schema} TO {quoted_role}"), &policy).await?;
    let tables = STORE_TABLES.iter().map(|t| format!("{schema}.{}", quote_ident(t))).collect::<Vec<_>>().join(", ");
    ddl(&mut conn, &format!("GRANT SELECT, INSERT, UPDATE, DELETE ON {tables} TO {quoted_role}"), &policy).await?;
    report.granted = STORE_TABLES.iter().map(|t| (*t).to_owned()).collect();

    // The store functions run as their caller and read the policy row; the
    // role reads it but never changes it (that is the operator's
    // `adk-pg policy set`, as the owner).
    ddl(&mut conn, &format!("GRANT SELECT ON {schema}.{} TO {quoted_role}", quote_ident(POLICY_TABLE)), &policy)
        .await?;
    report.granted.push(format!("{POLICY_TABLE} (read only)"));
    // The store calls this when an append finds no partition for today; it
    // runs as the owner and makes only the days the policy asks for.
    ddl(
        &mut conn,
        &format!("GRANT EXECUTE ON FUNCTION {schema}.{}() TO {quoted_role}", quote_ident(PREMAKE_FUNCTION)),
        &policy,
    )
    .await?;
    report.granted.push(format!("{PREMAKE_FUNCTION}() (execute)"));
    Ok(report)
}
