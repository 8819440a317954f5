//! The service role: the non-owner role an agent service connects as, and
//! the apps it is bound to.
//!
//! The role gets no privilege on any table. It may execute the store's
//! operations, which are SECURITY DEFINER functions that check, on every
//! call, that the role is bound to the app it asks about (the
//! `bound_tenants` migration). So a role can neither act for an app it was
//! not bound to nor rewrite what the store wrote for its own: it has no
//! UPDATE to move a session's clock, no INSERT to choose an event's seq.
//! Bindings live in `adk_role_apps` and every change to them is logged.
//!
//! A password is never sent: the SCRAM-SHA-256 verifier is computed here and
//! only the verifier reaches the server (and so its logs), as `psql`'s
//! `\password` does.
//!
//! It lives with the store because which SQL functions a service role may
//! execute is part of the store's access contract: a function the store
//! starts calling must be granted here in the same release.

use std::time::Duration;

use adk_postgres_domain::AppName;
use adk_postgres_schema::quote::{quote_ident, quote_literal};
use chrono::{DateTime, Utc};
use diesel::QueryableByName;
use diesel::sql_types::{Array, Bool, Nullable, Oid, Text, Timestamptz};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};

use crate::functions::SIGNATURES;
use crate::pg_error::{PgFailure, classify};

/// The tables that hold the store's data. The service role holds no
/// privilege on any of them; setting a role up revokes what an earlier
/// version of this tool granted.
pub use adk_postgres_schema::names::STORE_TABLES;

/// Everything a service role may do: the functions the store calls, each
/// with its typed wrapper ([`crate::functions::SIGNATURES`]), so the grant
/// follows the wrappers and a test holds both to the migrations.
pub static STORE_FUNCTIONS: std::sync::LazyLock<Vec<&'static str>> =
    std::sync::LazyLock::new(|| SIGNATURES.iter().map(|signature| signature.name).collect());

/// Why setting a service role up, or reading it, failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServiceRoleError {
    /// A role name, app name or password was refused; `field` names which.
    #[error("invalid {field}: {reason}")]
    InvalidInput {
        /// `role`, `app` or `password`.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// Row-level security would not restrict the role, so binding it to
    /// apps would promise an isolation it does not have.
    #[error(
        "role {role} is exempt from row-level security (superuser, BYPASSRLS or owner of the tables); \
         the service must run as a role that is none of these"
    )]
    Unrestricted {
        /// The role.
        role: String,
    },
    /// Another session dropped the role right after this setup created it.
    #[error("role {role} was dropped while being set up")]
    Dropped {
        /// The role.
        role: String,
    },
    /// A store table or function is missing: run the migrations first.
    #[error("the database is not migrated: {0}")]
    NotMigrated(String),
    /// A grant kept waiting for its lock past the lock timeout on every
    /// attempt; the store's traffic never queued behind it for longer.
    #[error("gave up after {attempts} attempts waiting for a lock: {statement}")]
    LockTimeout {
        /// The statement that waited.
        statement: String,
        /// How many times it was tried.
        attempts: u32,
    },
    /// The database could not be reached or refused the connection.
    #[error("could not connect: {0}")]
    Connect(#[from] diesel::ConnectionError),
    /// A statement failed; `context` says what it was doing.
    #[error("{context}: {source}")]
    Query {
        /// What the statement was doing.
        context: String,
        /// diesel's error.
        #[source]
        source: diesel::result::Error,
    },
}

impl ServiceRoleError {
    fn query(context: &'static str) -> impl FnOnce(diesel::result::Error) -> Self {
        move |source| Self::Query { context: context.to_owned(), source }
    }
}

/// Which apps a role may act for after setup.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum AppBinding {
    /// Leave the role's bindings as they are.
    #[default]
    Keep,
    /// Exactly these apps: bindings to any other app are removed.
    Apps(Vec<String>),
    /// Every app, present and future: for a trusted router that serves many
    /// tenants from one pool. It still acts for one named app per call.
    AllApps,
}

/// How to set the role up.
#[derive(Debug, Clone, Default)]
pub struct ServiceRoleOptions {
    /// Create the role when it does not exist (as `LOGIN`).
    pub create: bool,
    /// Set (or change) its password. Only its SCRAM verifier is sent.
    pub password: Option<String>,
    /// Which apps it may act for afterwards.
    pub apps: AppBinding,
}

/// The apps a role is bound to.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct RoleBindings {
    /// Bound to every app, present and future.
    pub all_apps: bool,
    /// The apps it is bound to by name.
    pub apps: Vec<String>,
}

impl RoleBindings {
    /// Whether the role may act for no app at all.
    pub fn is_empty(&self) -> bool {
        !self.all_apps && self.apps.is_empty()
    }
}

impl std::fmt::Display for RoleBindings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.all_apps, self.apps.is_empty()) {
            (true, _) => f.write_str("every app"),
            (false, true) => f.write_str("no app"),
            (false, false) => f.write_str(&self.apps.join(", ")),
        }
    }
}

/// What setting the role up did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct ServiceRoleReport {
    /// The role set up.
    pub role: String,
    /// Whether this setup created it.
    pub created: bool,
    /// Whether this setup set its password.
    pub password_set: bool,
    /// The functions it may execute.
    pub granted: Vec<String>,
    /// Apps bound or unbound by this setup; `None` stands for every app.
    pub bound: Vec<Option<String>>,
    /// Apps unbound by this setup; `None` stands for every app.
    pub unbound: Vec<Option<String>>,
    /// The role's bindings once setup committed.
    pub bindings: RoleBindings,
    /// Settings every session of the role starts with in this database
    /// (`ALTER ROLE … IN DATABASE … SET`): the pool's server-side timeouts,
    /// which a transaction pooler keeps only this way.
    pub session_defaults: Vec<(String, String)>,
}

impl std::fmt::Display for ServiceRoleReport {
    /// What `adk-pg service-role` prints after setting a role up.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let role = &self.role;
        if self.created {
            writeln!(f, "created role {role}")?;
        }
        if self.password_set {
            writeln!(f, "set its password (only the SCRAM-SHA-256 verifier was sent)")?;
        }
        writeln!(f, "{role} may execute {}; it holds no table privilege", self.granted.join(", "))?;
        for app in &self.bound {
            writeln!(f, "bound to {}", app.as_deref().unwrap_or("every app"))?;
        }
        for app in &self.unbound {
            writeln!(f, "unbound from {}", app.as_deref().unwrap_or("every app"))?;
        }
        writeln!(f, "{role} acts for: {}", self.bindings)?;
        if !self.session_defaults.is_empty() {
            let defaults =
                self.session_defaults.iter().map(|(name, value)| format!("{name} = {value}")).collect::<Vec<_>>();
            writeln!(f, "its sessions here start with {} (kept behind a pooler too)", defaults.join(", "))?;
        }
        if self.bindings.is_empty() {
            writeln!(f, "WARNING: {role} is bound to no app and can act for none; add --app APP")?;
        }
        write!(f, "connect the service as {role} with a tenant scope (see docs/security.md)")
    }
}

/// One change to a role's bindings, as the log recorded it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, QueryableByName)]
pub struct BindingChange {
    /// When the change's transaction started.
    #[diesel(sql_type = Timestamptz)]
    pub changed_at: DateTime<Utc>,
    /// The login role (`session_user`) that made the change.
    #[diesel(sql_type = Text)]
    pub changed_by: String,
    /// `None`: the every-app binding.
    #[diesel(sql_type = Nullable<Text>)]
    pub app_name: Option<String>,
    /// `bound` or `unbound`.
    #[diesel(sql_type = Text)]
    pub change: String,
}

/// A role as `adk-pg service-role NAME --show` prints it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ServiceRoleView {
    /// The role.
    pub role: String,
    /// The apps it may act for now.
    pub bindings: RoleBindings,
    /// Newest first.
    pub changes: Vec<BindingChange>,
    /// Store tables the role can read or write directly; empty for a role
    /// set up by this tool.
    pub table_privileges: Vec<String>,
}

#[derive(QueryableByName)]
struct RoleRow {
    #[diesel(sql_type = Oid)]
    oid: u32,
    #[diesel(sql_type = Bool)]
    superuser: bool,
    #[diesel(sql_type = Bool)]
    bypass_rls: bool,
    #[diesel(sql_type = Bool)]
    owns_tables: bool,
}

#[derive(QueryableByName)]
struct BindingRow {
    #[diesel(sql_type = Nullable<Text>)]
    app_name: Option<String>,
}

#[derive(QueryableByName)]
struct PrivilegeRow {
    #[diesel(sql_type = Text)]
    privilege: String,
}

fn check_role_name(role: &str) -> Result<(), ServiceRoleError> {
    if role.is_empty() || role.len() > 63 || role.contains('\0') {
        return Err(ServiceRoleError::InvalidInput {
            field: "role",
            reason: "must be 1 to 63 bytes without NUL".into(),
        });
    }
    Ok(())
}

/// Validates the apps to bind with the store's own rule for app names, so a
/// role is never bound to a spelling no store call could use.
fn checked_apps(apps: &[String]) -> Result<Vec<String>, ServiceRoleError> {
    let mut checked = Vec::with_capacity(apps.len());
    for app in apps {
        let app = AppName::new(app.as_str())
            .map_err(|e| ServiceRoleError::InvalidInput { field: "app", reason: e.to_string() })?;
        if !checked.iter().any(|a: &String| a == app.as_str()) {
            checked.push(app.as_str().to_owned());
        }
    }
    if checked.is_empty() {
        return Err(ServiceRoleError::InvalidInput {
            field: "app",
            reason: "name at least one app, or bind the role to every app explicitly".into(),
        });
    }
    Ok(checked)
}

async fn inspect_role(conn: &mut AsyncPgConnection, role: &str) -> Result<Option<RoleRow>, ServiceRoleError> {
    let rows = diesel::sql_query(
        "SELECT r.oid, r.rolsuper AS superuser, r.rolbypassrls AS bypass_rls,
                EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = to_regclass('adk_sessions')
                        AND pg_has_role(r.oid, c.relowner, 'USAGE')) AS owns_tables
         FROM pg_roles r WHERE r.rolname = $1",
    )
    .bind::<Text, _>(role)
    .load::<RoleRow>(conn)
    .await
    .map_err(ServiceRoleError::query("look the role up"))?;
    Ok(rows.into_iter().next())
}

/// The SCRAM-SHA-256 verifier of `password`, checked to be plain ASCII
/// without quotes or backslashes, so the literal carrying it means the same
/// whatever `standard_conforming_strings` is.
fn password_verifier(password: &str) -> Result<String, ServiceRoleError> {
    if password.is_empty() {
        return Err(ServiceRoleError::InvalidInput { field: "password", reason: "must not be empty".into() });
    }
    let verifier = postgres_protocol::password::scram_sha_256(password.as_bytes());
    if !verifier.bytes().all(|b| b.is_ascii_alphanumeric() || b"$:+/=-".contains(&b)) {
        return Err(ServiceRoleError::InvalidInput {
            field: "password",
            reason: "its SCRAM verifier has an unexpected character".into(),
        });
    }
    Ok(verifier)
}

/// Sets `role` up for the store: creates it when asked, refuses a role
/// that row-level security would not restrict, grants exactly the store's
/// operations, revokes any table privilege, and binds it to its apps in one
/// transaction.
pub async fn setup_service_role(
    database_url: &str,
    role: &str,
    options: &ServiceRoleOptions,
) -> Result<ServiceRoleReport, ServiceRoleError> {
    check_role_name(role)?;
    let apps = match &options.apps {
        AppBinding::Apps(apps) => Some(checked_apps(apps)?),
        AppBinding::Keep | AppBinding::AllApps => None,
    };
    let verifier = options.password.as_deref().map(password_verifier).transpose()?;
    let mut conn = connect(database_url).await?;
    let schema = quote_ident(&store_schema(&mut conn).await?);
    let quoted_role = quote_ident(role);
    let mut report = ServiceRoleReport { role: role.to_owned(), ..ServiceRoleReport::default() };

    let row = match inspect_role(&mut conn, role).await? {
        Some(row) => row,
        None => {
            if !options.create {
                return Err(ServiceRoleError::InvalidInput {
                    field: "role",
                    reason: format!("role {role} does not exist"),
                });
            }
            // Two setups racing: the loser's CREATE fails, and finds the
            // winner's role when it looks again.
            let created = conn.batch_execute(&format!("CREATE ROLE {quoted_role} LOGIN")).await;
            let row = inspect_role(&mut conn, role).await?;
            match (created, row) {
                (Ok(()), Some(row)) => {
                    report.created = true;
                    row
                }
                (Err(_), Some(row)) => row,
                (Err(e), None) => {
                    return Err(ServiceRoleError::Query { context: format!("create role {role}"), source: e });
                }
                (Ok(()), None) => return Err(ServiceRoleError::Dropped { role: role.to_owned() }),
            }
        }
    };
    if row.superuser || row.bypass_rls || row.owns_tables {
        return Err(ServiceRoleError::Unrestricted { role: role.to_owned() });
    }
    if let Some(verifier) = verifier {
        conn.batch_execute(&format!("ALTER ROLE {quoted_role} PASSWORD '{verifier}'"))
            .await
            .map_err(ServiceRoleError::query("set the role's password"))?;
        report.password_set = true;
    }

    ddl(&mut conn, &format!("GRANT USAGE ON SCHEMA {schema} TO {quoted_role}")).await?;
    let tables = STORE_TABLES.iter().map(|t| format!("{schema}.{}", quote_ident(t))).collect::<Vec<_>>().join(", ");
    ddl(&mut conn, &format!("REVOKE ALL ON {tables} FROM {quoted_role}")).await?;
    let functions =
        STORE_FUNCTIONS.iter().map(|f| format!("{schema}.{}", quote_ident(f))).collect::<Vec<_>>().join(", ");
    ddl(&mut conn, &format!("GRANT EXECUTE ON FUNCTION {functions} TO {quoted_role}")).await?;
    report.granted = STORE_FUNCTIONS.iter().map(|f| (*f).to_owned()).collect();
    report.session_defaults = set_session_defaults(&mut conn, &quoted_role).await?;

    let role_oid = row.oid;
    // The role's apps after setup: `None` stands for every app, as in the
    // table; nothing to write when the bindings stay as they are.
    let wanted: Option<Vec<Option<String>>> = match (&options.apps, apps) {
        (AppBinding::Keep, _) => None,
        (AppBinding::AllApps, _) => Some(vec![None]),
        (AppBinding::Apps(_), apps) => Some(apps.unwrap_or_default().into_iter().map(Some).collect()),
    };
    let (bound, unbound) = match wanted {
        None => (Vec::new(), Vec::new()),
        Some(wanted) => conn
            .transaction::<_, diesel::result::Error, _>(async move |conn| {
                // Two setups of one role take turns, so the result is one
                // of their sets, never a mix.
                diesel::sql_query("SELECT pg_advisory_xact_lock(hashtextextended('adk_role_apps:' || $1::text, 0))")
                    .bind::<Oid, _>(role_oid)
                    .execute(conn)
                    .await?;
                let unbound = diesel::sql_query(
                    "DELETE FROM adk_role_apps b WHERE b.role_oid = $1
                       AND NOT EXISTS (SELECT 1 FROM unnest($2::text[]) w(app) WHERE w.app IS NOT DISTINCT FROM b.app_name)
                     RETURNING b.app_name",
                )
                .bind::<Oid, _>(role_oid)
                .bind::<Array<Nullable<Text>>, _>(&wanted)
                .load::<BindingRow>(conn)
                .await?;
                let bound = diesel::sql_query(
                    // The name too: on Citus a role has another oid on each
                    // node, and the workers know it by name.
                    "INSERT INTO adk_role_apps (role_oid, app_name, role_name)
                     SELECT $1, w.app, $3::name FROM unnest($2::text[]) w(app)
                     ON CONFLICT DO NOTHING RETURNING app_name",
                )
                .bind::<Oid, _>(role_oid)
                .bind::<Array<Nullable<Text>>, _>(&wanted)
                .bind::<Text, _>(role)
                .load::<BindingRow>(conn)
                .await?;
                Ok((
                    bound.into_iter().map(|r| r.app_name).collect::<Vec<_>>(),
                    unbound.into_iter().map(|r| r.app_name).collect::<Vec<_>>(),
                ))
            })
            .await
            .map_err(ServiceRoleError::query("bind the role to its apps"))?,
    };
    report.bound = bound;
    report.unbound = unbound;
    report.bindings = read_bindings(&mut conn, role_oid).await?;
    Ok(report)
}

async fn read_bindings(conn: &mut AsyncPgConnection, role_oid: u32) -> Result<RoleBindings, ServiceRoleError> {
    let rows =
        diesel::sql_query("SELECT app_name FROM adk_role_apps WHERE role_oid = $1 ORDER BY app_name NULLS FIRST")
            .bind::<Oid, _>(role_oid)
            .load::<BindingRow>(conn)
            .await
            .map_err(ServiceRoleError::query("read the role's bindings"))?;
    let mut bindings = RoleBindings::default();
    for row in rows {
        match row.app_name {
            Some(app) => bindings.apps.push(app),
            None => bindings.all_apps = true,
        }
    }
    Ok(bindings)
}

/// The apps `role` is bound to, the log of changes to them, and any direct
/// table privilege it holds (there should be none).
pub async fn show_service_role(database_url: &str, role: &str) -> Result<ServiceRoleView, ServiceRoleError> {
    check_role_name(role)?;
    let mut conn = connect(database_url).await?;
    let schema = store_schema(&mut conn).await?;
    let row = inspect_role(&mut conn, role).await?.ok_or_else(|| ServiceRoleError::InvalidInput {
        field: "role",
        reason: format!("role {role} does not exist"),
    })?;
    let bindings = read_bindings(&mut conn, row.oid).await?;
    let changes = diesel::sql_query(
        "SELECT changed_at, changed_by::text AS changed_by, app_name, change FROM adk_role_app_changes
         WHERE role_oid = $1 ORDER BY changed_at DESC, app_name LIMIT 100",
    )
    .bind::<Oid, _>(row.oid)
    .load::<BindingChange>(&mut conn)
    .await
    .map_err(ServiceRoleError::query("read the role's binding changes"))?;
    let table_privileges = diesel::sql_query(
        "SELECT t.name || ' ' || p.privilege AS privilege
         FROM unnest($2::text[]) t(name)
         CROSS JOIN unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE', 'TRUNCATE']) p(privilege)
         WHERE has_table_privilege($1::oid, format('%I.%I', $3::text, t.name), p.privilege)
         ORDER BY t.name, p.privilege",
    )
    .bind::<Oid, _>(row.oid)
    .bind::<Array<Text>, _>(STORE_TABLES.iter().map(|t| (*t).to_owned()).collect::<Vec<_>>())
    .bind::<Text, _>(&schema)
    .load::<PrivilegeRow>(&mut conn)
    .await
    .map_err(ServiceRoleError::query("read the role's table privileges"))?
    .into_iter()
    .map(|r| r.privilege)
    .collect();
    Ok(ServiceRoleView { role: role.to_owned(), bindings, changes, table_privileges })
}

/// Longest a grant queues for its lock, and how often it tries: queued, it
/// would hold up every newer query on the table, so the wait stays short.
const LOCK_TIMEOUT: Duration = Duration::from_secs(2);
const LOCK_ATTEMPTS: u32 = 6;
/// Pause after the first lock wait that timed out; doubles each time.
const LOCK_BACKOFF: Duration = Duration::from_millis(200);

/// A connection of its own, in autocommit, under the short lock timeout;
/// no statement timeout, because a role's own default must not cut setup
/// short.
async fn connect(database_url: &str) -> Result<AsyncPgConnection, ServiceRoleError> {
    let mut conn = adk_postgres_connect::establish(database_url).await?;
    let setup = format!(
        "SET application_name = {}; SET statement_timeout = 0; SET lock_timeout = {}",
        quote_literal("adk-pg service-role"),
        LOCK_TIMEOUT.as_millis()
    );
    conn.batch_execute(&setup).await.map_err(ServiceRoleError::query("configure the connection"))?;
    Ok(conn)
}

/// The pool's server-side timeouts as the role's defaults in this database.
/// The pool sends them in its startup packet, which a transaction pooler
/// refuses or drops, and a `SET` would leak to the pooler's next client:
/// a role's defaults are applied by the server at every session start, so
/// they hold on every server connection a pooler opens for the role.
async fn set_session_defaults(
    conn: &mut AsyncPgConnection,
    quoted_role: &str,
) -> Result<Vec<(String, String)>, ServiceRoleError> {
    let pool = crate::pool::PoolConfig::default();
    let defaults = [
        ("statement_timeout", pool.statement_timeout),
        ("lock_timeout", pool.lock_timeout),
        ("idle_in_transaction_session_timeout", pool.idle_in_transaction_session_timeout),
    ]
    .map(|(name, value)| (name.to_owned(), format!("{}ms", value.as_millis())));
    let database = diesel::sql_query("SELECT current_database()::text AS name")
        .load::<DatabaseRow>(conn)
        .await
        .map_err(ServiceRoleError::query("read the database's name"))?
        .into_iter()
        .next()
        .map(|row| row.name)
        .unwrap_or_default();
    for (name, value) in &defaults {
        // Names are ours, values are digits and "ms": nothing from input.
        ddl(conn, &format!("ALTER ROLE {quoted_role} IN DATABASE {} SET {name} = '{value}'", quote_ident(&database)))
            .await?;
    }
    Ok(defaults.to_vec())
}

#[derive(diesel::QueryableByName)]
struct DatabaseRow {
    #[diesel(sql_type = Text)]
    name: String,
}

/// The schema the store's tables (and so its functions) live in.
async fn store_schema(conn: &mut AsyncPgConnection) -> Result<String, ServiceRoleError> {
    adk_postgres_schema::catalog::store_schema(conn)
        .await
        .map_err(ServiceRoleError::query("find adk_events"))?
        .ok_or_else(|| ServiceRoleError::NotMigrated("table adk_events does not exist".into()))
}

/// Runs a grant or revoke, trying again after a pause when it times out
/// waiting for a lock or loses a deadlock, up to [`LOCK_ATTEMPTS`] times.
async fn ddl(conn: &mut AsyncPgConnection, statement: &str) -> Result<(), ServiceRoleError> {
    let mut pause = LOCK_BACKOFF;
    let mut attempt = 1;
    loop {
        let Err(error) = conn.batch_execute(statement).await else { return Ok(()) };
        if !matches!(classify(&error), PgFailure::LockTimeout | PgFailure::Deadlock) {
            return Err(ServiceRoleError::Query { context: statement.to_owned(), source: error });
        }
        if attempt >= LOCK_ATTEMPTS {
            return Err(ServiceRoleError::LockTimeout { statement: statement.to_owned(), attempts: LOCK_ATTEMPTS });
        }
        tracing::warn!(statement, attempt, "lock wait timed out; retrying");
        tokio::time::sleep(pause).await;
        pause = pause.saturating_mul(2);
        attempt += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_verifier_is_safe_in_any_literal_and_never_the_password() {
        let password = "it's a \\'; CREATE TABLE pwned(); --";
        let verifier = password_verifier(password).expect("verifier");
        assert!(verifier.starts_with("SCRAM-SHA-256$4096:"), "{verifier}");
        assert!(!verifier.contains(password));
        assert!(!verifier.contains('\'') && !verifier.contains('\\'));
    }

    #[test]
    fn apps_are_checked_and_deduplicated() {
        assert_eq!(checked_apps(&["a".into(), "a".into(), "b".into()]).expect("apps"), vec!["a", "b"]);
        assert!(matches!(checked_apps(&[]), Err(ServiceRoleError::InvalidInput { field: "app", .. })));
        assert!(matches!(checked_apps(&[String::new()]), Err(ServiceRoleError::InvalidInput { field: "app", .. })));
    }
}
