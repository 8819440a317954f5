//! The tenancy escape suite: real roles that do not own the store try every
//! way we know to act for, read or change an app they are not bound to, and
//! each attempt must fail.
//!
//! Role A is bound to app "alpha", role B to app "beta"; the owner writes
//! sessions, events and shared state for both. What the suite proves, against
//! the `bound_tenants` migration:
//!
//! 1. Forging `adk.app_name` gives a service role nothing (it holds no table
//!    privilege), and a reporting role granted direct SELECT sees only the
//!    rows of an app it is bound to *and* has set.
//! 2. Event partitions read directly after a broad `GRANT SELECT ON ALL
//!    TABLES` show no foreign rows: today's, one premade later, one detached
//!    and re-attached, and a table attached as a partition.
//! 3. With `CREATE` on the schema, objects planted to capture the store
//!    functions' name resolution (functions, an aggregate, an operator, a
//!    view, temp tables, overloads of the store's own helpers) are never
//!    invoked by the SECURITY DEFINER functions, the owner's store or
//!    maintenance; the store's functions cannot be redefined.
//! 4. A service role cannot write, truncate or alter any table directly,
//!    not even for its own app.
//! 5. Every store function, called with a forged, mismatched or missing
//!    tenant, returns no rows or raises 42501, and nothing changes.
//! 6. The Rust store, as a role bound to beta, whatever its `TenantScope`,
//!    finds nothing of alpha and writes nothing to it.
//! 7. A role acts through `SET ROLE` only for the apps of the role it set;
//!    membership alone is not a binding; an all-apps role acts for each app
//!    it names.
//! 8. A tenant set in a savepoint is gone after `ROLLBACK TO SAVEPOINT`; a
//!    tenant set by a store function does not outlive its transaction; row
//!    level security refuses to write another app's row; a broad write grant
//!    does not hand over the bindings.
//! 9. Re-binding a role is atomic: no snapshot ever sees it bound to both
//!    apps or to neither, and afterwards it acts for the new app only.
//!
//! Each attempt is checked on its own; a scenario reports every attempt that
//! escaped and then fails. `escape_suite_summary` runs every scenario and
//! prints `escape attempts: N tried, 0 succeeded`.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use adk_postgres_domain::{
    AppName, AppendOptions, CreateSession, Event, EventPage, GetOptions, ListAppSessions, ListSessions, RedactOptions,
    SessionKey, SessionStore, StoreConfig, StoreError, UserId,
};
use adk_postgres_retention::{MaintenanceConfig, run_maintenance};
use adk_postgres_storage::tenancy::{AppBinding, ServiceRoleOptions, setup_service_role};
use adk_postgres_storage::{PgSessionStore, PoolConfig, TenantScope};
use adk_postgres_testing::{TestDatabase, test_database};
use adk_postgres_tests::conformance::{image_event, media_bytes};
use adk_postgres_tests::pg::{self, client, store, with_delta};
use serde_json::json;
use tokio_postgres::Client;

// ---------------------------------------------------------------------------
// the tally

/// Every escape attempt of a run: how many were tried and which escaped.
#[derive(Debug, Default)]
struct Attempts {
    tried: usize,
    escapes: Vec<String>,
}

impl Attempts {
    /// Records one attempt; `held` is whether the attempt failed to escape.
    fn check(&mut self, attempt: &str, held: bool, outcome: &dyn Debug) {
        self.tried += 1;
        if !held {
            eprintln!("ESCAPE: {attempt}: {outcome:?}");
            self.escapes.push(format!("{attempt}: {outcome:?}"));
        }
    }

    /// `statement` must be refused with SQLSTATE 42501.
    async fn refused(&mut self, attempt: &str, sql: &Client, statement: &str) {
        self.refused_because(attempt, sql, statement, "").await;
    }

    /// `statement` must be refused with SQLSTATE 42501 and a message
    /// containing `needle`.
    async fn refused_because(&mut self, attempt: &str, sql: &Client, statement: &str, needle: &str) {
        let outcome = sql.batch_execute(statement).await.map_err(|e| describe(&e));
        let held = matches!(&outcome, Err(message) if message.starts_with("42501") && message.contains(needle));
        self.check(attempt, held, &outcome);
    }

    /// Like [`Attempts::refused`], acting for `app` in a transaction of its
    /// own: the refusal aborts that transaction and no other.
    async fn refused_for(&mut self, attempt: &str, sql: &Client, app: &str, statement: &str) {
        self.refused_because_for(attempt, sql, app, statement, "").await;
    }

    /// Like [`Attempts::refused_because`], acting for `app` in a transaction
    /// of its own.
    async fn refused_because_for(&mut self, attempt: &str, sql: &Client, app: &str, statement: &str, needle: &str) {
        act_for(sql, app).await;
        self.refused_because(attempt, sql, statement, needle).await;
        end_acting(sql).await;
    }

    /// `query` (one bigint) must answer `expected`.
    async fn count(&mut self, attempt: &str, sql: &Client, query: &str, expected: i64) {
        let outcome = count(sql, query).await;
        self.check(attempt, outcome == Ok(expected), &outcome);
    }

    /// Prints the tally and fails when any attempt escaped.
    fn finish(&self, label: &str) {
        eprintln!("{label}escape attempts: {} tried, {} succeeded", self.tried, self.escapes.len());
        assert!(self.tried > 0, "no attempt was made");
        assert!(
            self.escapes.is_empty(),
            "{} of {} escape attempts succeeded:\n  {}",
            self.escapes.len(),
            self.tried,
            self.escapes.join("\n  ")
        );
    }
}

fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} {}", db.code().code(), db.message()),
        None => e.to_string(),
    }
}

async fn count(sql: &Client, query: &str) -> Result<i64, String> {
    sql.query_one(query, &[]).await.map(|row| row.get::<_, i64>(0)).map_err(|e| describe(&e))
}

/// Like [`count`], for a setup or control step that must work.
async fn must_count(sql: &Client, query: &str) -> i64 {
    count(sql, query).await.unwrap_or_else(|e| panic!("{query}: {e}"))
}

async fn must(sql: &Client, statement: &str) {
    sql.batch_execute(statement).await.unwrap_or_else(|e| panic!("{statement}: {}", describe(&e)));
}

/// Sets the tenant to `app` in a new transaction, until [`end_acting`].
/// `SET LOCAL` in a transaction block is the one form of the setting that
/// reaches Citus workers, where row-level security is evaluated
/// (docs/citus.md); a session-level `SET` or `set_config` stays on the
/// coordinator, so there the workers would see no tenant at all: a forgery
/// would not really be tried, and a role acting for its own app would see
/// nothing.
async fn act_for(sql: &Client, app: &str) {
    must(sql, &format!("BEGIN; SET LOCAL adk.app_name = '{app}'")).await;
}

/// Ends the transaction of [`act_for`]. COMMIT, not ROLLBACK: a write that
/// escaped stays, for the fingerprints to show; a transaction an error
/// aborted is rolled back by COMMIT all the same.
async fn end_acting(sql: &Client) {
    must(sql, "COMMIT").await;
}

// ---------------------------------------------------------------------------
// the world

/// A login role of this test: its name and a URL that logs in as it.
#[derive(Debug, Clone)]
struct Role {
    name: String,
    url: String,
}

fn unique(prefix: &str) -> String {
    pg::unique_role(&format!("adk_esc_{prefix}"))
}

fn login_url(db: &TestDatabase, role: &str) -> String {
    pg::login_url(db.url(), role)
}

/// A new service role set up the way an operator would, bound to `apps`.
async fn service_role(db: &TestDatabase, prefix: &str, apps: AppBinding) -> Role {
    let (name, url) = pg::service_role(db.url(), &format!("adk_esc_{prefix}"), apps).await;
    Role { url, name }
}

/// A new login role with only USAGE on the schema: no binding, no function.
async fn plain_role(db: &TestDatabase, owner: &Client, prefix: &str) -> Role {
    let name = unique(prefix);
    must(owner, &format!("CREATE ROLE \"{name}\" LOGIN; GRANT USAGE ON SCHEMA public TO \"{name}\"")).await;
    Role { url: login_url(db, &name), name }
}

async fn rebind(db: &TestDatabase, role: &Role, apps: &[&str]) {
    let apps = AppBinding::Apps(apps.iter().map(|a| (*a).to_owned()).collect());
    setup_service_role(db.url(), &role.name, &ServiceRoleOptions { create: false, password: None, apps })
        .await
        .expect("re-bind the role");
}

async fn store_as(role: &Role, scope: TenantScope) -> PgSessionStore {
    PgSessionStore::connect(&role.url, &PoolConfig { max_size: 2, ..PoolConfig::default() }, StoreConfig::default())
        .await
        .expect("connect the store")
        .with_tenant_scope(scope)
}

fn app(name: &str) -> AppName {
    AppName::new(name).expect("app")
}

const TENANT_TABLES: [&str; 4] = ["adk_sessions", "adk_events", "adk_user_states", "adk_app_states"];

struct World {
    db: TestDatabase,
    owner: Client,
    alpha: SessionKey,
    beta: SessionKey,
    /// Bound to alpha.
    a: Role,
    /// Bound to beta.
    b: Role,
}

/// Sessions "alpha-session" and "beta-session" of user "u1", each with two
/// events and app and user state, written by the owner; role A bound to
/// alpha and role B bound to beta.
async fn world() -> World {
    let db = test_database().await;
    let owner_store = store(db.url()).await;
    let mut keys = Vec::new();
    for name in ["alpha", "beta"] {
        let request =
            CreateSession::new(app(name), UserId::new("u1").expect("user")).with_id(format!("{name}-session"));
        let key = owner_store.create(request).await.expect("create").key;
        for delta in
            [json!({"user:plan": name, "app:motd": name, "topic": name}), json!({"topic": format!("{name}-2")})]
        {
            let mut event = with_delta(delta);
            // Citus refuses media stored apart (docs/features/media.md).
            if event.actions.state_delta.len() == 1 && db.worker_urls().is_empty() {
                // The second event carries an image, stored apart as a blob.
                event.content = image_event(&app_image(name)).content;
            }
            owner_store.append(&key, event, AppendOptions::default()).await.expect("append");
        }
        keys.push(key);
    }
    let beta = keys.pop().expect("beta");
    let alpha = keys.pop().expect("alpha");
    let a = service_role(&db, "a", AppBinding::Apps(vec!["alpha".into()])).await;
    let b = service_role(&db, "b", AppBinding::Apps(vec!["beta".into()])).await;
    let owner = client(db.url()).await;
    World { db, owner, alpha, beta, a, b }
}

impl World {
    /// A digest of everything stored for `app`: any change shows.
    async fn fingerprint(&self, app: &str) -> String {
        self.owner
            .query_one(
                "SELECT pg_catalog.md5(pg_catalog.concat_ws(' / ',
                    (SELECT pg_catalog.string_agg(s::text, ' | ' ORDER BY s.user_id, s.session_id)
                       FROM adk_sessions s WHERE s.app_name = $1),
                    (SELECT pg_catalog.string_agg(e::text, ' | ' ORDER BY e.user_id, e.session_id, e.seq)
                       FROM adk_events e WHERE e.app_name = $1),
                    (SELECT pg_catalog.string_agg(u::text, ' | ' ORDER BY u.user_id)
                       FROM adk_user_states u WHERE u.app_name = $1),
                    (SELECT pg_catalog.string_agg(a::text, ' | ') FROM adk_app_states a WHERE a.app_name = $1),
                    (SELECT pg_catalog.string_agg(r::text, ' | ' ORDER BY r.user_id, r.session_id, r.redacted_at)
                       FROM adk_event_redactions r WHERE r.app_name = $1)))",
                &[&app],
            )
            .await
            .expect("fingerprint")
            .get(0)
    }

    /// The bindings of every role, as text.
    async fn bindings(&self) -> String {
        self.owner
            .query_one(
                "SELECT coalesce(pg_catalog.string_agg(r.rolname || '=' || coalesce(b.app_name, '*'), ', '
                                                       ORDER BY r.rolname, b.app_name), '')
                 FROM adk_role_apps b JOIN pg_catalog.pg_roles r ON r.oid = b.role_oid",
                &[],
            )
            .await
            .expect("bindings")
            .get(0)
    }

    /// Today's (UTC) partition of adk_events, today and tomorrow as dates.
    async fn today(&self) -> (String, String, String) {
        let row = self
            .owner
            .query_one(
                "SELECT adk_event_partition_name(d), d::text, (d + 1)::text
                 FROM (SELECT (now() AT TIME ZONE 'UTC')::date AS d) t",
                &[],
            )
            .await
            .expect("today");
        (row.get(0), row.get(1), row.get(2))
    }

    /// The partition of the UTC day `days` ahead.
    async fn partition_ahead(&self, days: i32) -> String {
        self.owner
            .query_one("SELECT adk_event_partition_name((now() AT TIME ZONE 'UTC')::date + $1::integer)", &[&days])
            .await
            .expect("partition name")
            .get(0)
    }

    /// Whether `table` has row-level security enabled, forced, and the
    /// tenant policy.
    async fn protected(&self, table: &str) -> bool {
        self.owner
            .query_one(
                "SELECT c.relrowsecurity AND c.relforcerowsecurity
                        AND EXISTS (SELECT 1 FROM pg_catalog.pg_policy p
                                    WHERE p.polrelid = c.oid AND p.polname = 'adk_tenant_isolation')
                 FROM pg_catalog.pg_class c WHERE c.oid = $1::text::regclass",
                &[&table],
            )
            .await
            .expect("protection")
            .get(0)
    }
}

// ---------------------------------------------------------------------------
// 1. forging adk.app_name

async fn forging_the_tenant_setting(at: &mut Attempts) {
    let w = world().await;
    let (partition, _, _) = w.today().await;

    // A service role holds no table privilege: forging the setting is moot.
    let b = client(&w.b.url).await;
    let tables: Vec<String> = TENANT_TABLES
        .iter()
        .copied()
        .chain(["adk_role_apps", "adk_role_app_changes", "adk_store_policy"])
        .map(String::from)
        .chain([partition.clone()])
        .collect();
    let acting_app = "SELECT count(*) FROM (SELECT adk_acting_app() AS app) t WHERE t.app IS NOT NULL";
    must(&b, "SET adk.app_name = 'alpha'").await;
    for table in &tables {
        at.refused(
            &format!("service role B forging alpha with SET reads {table}"),
            &b,
            &format!("SELECT * FROM {table}"),
        )
        .await;
    }
    at.count("service role B forging alpha with SET: adk_acting_app() stays NULL", &b, acting_app, 0).await;
    must(&b, "RESET adk.app_name").await;
    for table in &tables {
        at.refused_for(
            &format!("service role B forging alpha with SET LOCAL reads {table}"),
            &b,
            "alpha",
            &format!("SELECT * FROM {table}"),
        )
        .await;
    }
    act_for(&b, "alpha").await;
    at.count("service role B forging alpha with SET LOCAL: adk_acting_app() stays NULL", &b, acting_app, 0).await;
    end_acting(&b).await;

    // A reporting role bound to beta with direct SELECT on every table.
    let rep = service_role(&w.db, "rep", AppBinding::Apps(vec!["beta".into()])).await;
    must(&w.owner, &format!("GRANT SELECT ON ALL TABLES IN SCHEMA public TO \"{}\"", rep.name)).await;
    let sql = client(&rep.url).await;
    // Each setting with whether it opens a transaction (ended after the
    // case): the local forms are the ones Citus workers see.
    let cases: [(&str, Option<&str>, bool); 7] = [
        ("no setting", None, false),
        ("an empty setting", Some("SET adk.app_name = ''"), false),
        ("forging alpha with SET", Some("SET adk.app_name = 'alpha'"), false),
        ("forging alpha with set_config", Some("SELECT set_config('adk.app_name', 'alpha', false)"), false),
        ("an empty setting with SET LOCAL", Some("BEGIN; SET LOCAL adk.app_name = ''"), true),
        ("forging alpha with SET LOCAL", Some("BEGIN; SET LOCAL adk.app_name = 'alpha'"), true),
        (
            "forging alpha with a local set_config",
            Some("BEGIN; SELECT set_config('adk.app_name', 'alpha', true)"),
            true,
        ),
    ];
    for (case, setting, in_transaction) in cases {
        must(&sql, "RESET adk.app_name").await;
        if let Some(setting) = setting {
            must(&sql, setting).await;
        }
        for table in TENANT_TABLES {
            at.count(
                &format!("reporting role bound to beta, {case}: rows of {table}"),
                &sql,
                &format!("SELECT count(*) FROM {table}"),
                0,
            )
            .await;
        }
        if in_transaction {
            end_acting(&sql).await;
        }
    }
    must(&sql, "SET adk.app_name = 'alpha'").await;
    at.count("reporting role forging alpha with SET: adk_acting_app() stays NULL", &sql, acting_app, 0).await;
    must(&sql, "RESET adk.app_name").await;
    act_for(&sql, "alpha").await;
    at.count("reporting role forging alpha with SET LOCAL: adk_acting_app() stays NULL", &sql, acting_app, 0).await;
    end_acting(&sql).await;

    // Its own app shows its own rows, and only those: the zeros above are
    // row-level security, not a broken grant (nor, on Citus, a tenant that
    // never reached the workers).
    act_for(&sql, "beta").await;
    let mut own = Vec::new();
    for table in TENANT_TABLES {
        own.push(must_count(&sql, &format!("SELECT count(*) FROM {table}")).await);
        at.count(
            &format!("reporting role acting for beta: alpha rows of {table}"),
            &sql,
            &format!("SELECT count(*) FROM {table} WHERE app_name <> 'beta'"),
            0,
        )
        .await;
    }
    end_acting(&sql).await;
    assert_eq!(own, vec![1, 2, 1, 1], "beta's own rows are visible to the reporting role acting for beta");
}

// ---------------------------------------------------------------------------
// 2. partitions after a broad GRANT

async fn partitions_after_a_broad_grant(at: &mut Attempts) {
    let w = world().await;
    let (today, day, next_day) = w.today().await;
    let rep = service_role(&w.db, "rep", AppBinding::Apps(vec!["beta".into()])).await;
    let unbound = plain_role(&w.db, &w.owner, "unbound").await;
    let grant = format!("GRANT SELECT ON ALL TABLES IN SCHEMA public TO \"{}\", \"{}\"", rep.name, unbound.name);
    must(&w.owner, &grant).await;
    let rep_sql = client(&rep.url).await;
    let unbound_sql = client(&unbound.url).await;

    async fn reads(at: &mut Attempts, label: &str, rep: &Client, unbound: &Client, table: &str) {
        let all = format!("SELECT count(*) FROM {table}");
        for (role, who) in [(rep, "reporting role bound to beta"), (unbound, "unbound role")] {
            must(role, "SET adk.app_name = 'alpha'").await;
            at.count(&format!("{label}: {who} forging alpha with SET"), role, &all, 0).await;
            must(role, "RESET adk.app_name").await;
            act_for(role, "alpha").await;
            at.count(&format!("{label}: {who} forging alpha with SET LOCAL"), role, &all, 0).await;
            end_acting(role).await;
        }
        act_for(rep, "beta").await;
        at.count(
            &format!("{label}: reporting role acting for beta, alpha rows"),
            rep,
            &format!("SELECT count(*) FROM {table} WHERE app_name = 'alpha'"),
            0,
        )
        .await;
        end_acting(rep).await;
        at.count(&format!("{label}: unbound role, no setting"), unbound, &all, 0).await;
    }

    /// Beta's two events in `table`, read acting for beta: the zeros of
    /// [`reads`] are row-level security, not an unreadable table.
    async fn beta_reads_its_events(rep: &Client, table: &str, why: &str) {
        act_for(rep, "beta").await;
        assert_eq!(must_count(rep, &format!("SELECT count(*) FROM {table}")).await, 2, "{why}");
        end_acting(rep).await;
    }

    reads(at, "today's partition", &rep_sql, &unbound_sql, &today).await;
    reads(at, "adk_events through its parent", &rep_sql, &unbound_sql, "adk_events").await;
    beta_reads_its_events(&rep_sql, &today, "beta's events are readable").await;

    // A partition premade later, once alpha wrote into it.
    let later = w.partition_ahead(3).await;
    must(&w.owner, &format!("DROP TABLE {later}")).await;
    let made = must_count(&w.owner, "SELECT adk_premake_event_partitions()::bigint").await;
    assert_eq!(made, 1, "premake re-creates the dropped day");
    assert!(w.protected(&later).await, "a premade partition is protected as it is made");
    must(
        &w.owner,
        "INSERT INTO adk_sessions (app_name, user_id, session_id, session_day)
         VALUES ('alpha', 'u1', 'alpha-later', (now() AT TIME ZONE 'UTC')::date + 3);
         INSERT INTO adk_events (app_name, user_id, session_id, session_day, seq, event_id, author, event_ts, payload)
         VALUES ('alpha', 'u1', 'alpha-later', (now() AT TIME ZONE 'UTC')::date + 3, 1, 'later-1', 'agent', 0, '{}')",
    )
    .await;
    must(&w.owner, &grant).await;
    reads(at, "a partition premade later", &rep_sql, &unbound_sql, &later).await;

    // Today's partition detached: the protection travels with the table.
    must(&w.owner, &format!("ALTER TABLE adk_events DETACH PARTITION {today}")).await;
    reads(at, "today's partition while detached", &rep_sql, &unbound_sql, &today).await;
    beta_reads_its_events(&rep_sql, &today, "still readable for beta").await;
    must(
        &w.owner,
        &format!("ALTER TABLE adk_events ATTACH PARTITION {today} FOR VALUES FROM ('{day}') TO ('{next_day}')"),
    )
    .await;
    let changed = must_count(&w.owner, "SELECT adk_protect_event_partitions()::bigint").await;
    assert_eq!(changed, 0, "a re-attached partition kept its protection");
    assert!(w.protected(&today).await);
    reads(at, "today's partition re-attached", &rep_sql, &unbound_sql, &today).await;

    // A table attached as a partition (as a conversion does), protected by
    // maintenance's call.
    must(
        &w.owner,
        "INSERT INTO adk_sessions (app_name, user_id, session_id, session_day)
         VALUES ('alpha', 'u1', 'alpha-legacy', (now() AT TIME ZONE 'UTC')::date + 20);
         CREATE TABLE escape_legacy (LIKE adk_events INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
         INSERT INTO escape_legacy (app_name, user_id, session_id, session_day, seq, event_id, author, event_ts, payload)
         VALUES ('alpha', 'u1', 'alpha-legacy', (now() AT TIME ZONE 'UTC')::date + 20, 1, 'legacy-1', 'agent', 0, '{}');
         DO $$ BEGIN
             EXECUTE pg_catalog.format('ALTER TABLE adk_events ATTACH PARTITION escape_legacy FOR VALUES FROM (%L) TO (%L)',
                                       (now() AT TIME ZONE 'UTC')::date + 20, (now() AT TIME ZONE 'UTC')::date + 21);
         END $$",
    )
    .await;
    let changed = must_count(&w.owner, "SELECT adk_protect_event_partitions()::bigint").await;
    assert_eq!(changed, 1, "the attached table is protected by the maintenance call");
    must(&w.owner, &grant).await;
    reads(at, "a table attached as a partition", &rep_sql, &unbound_sql, "escape_legacy").await;
    assert_eq!(must_count(&w.owner, "SELECT count(*) FROM escape_legacy").await, 1, "the owner sees the alpha row");
}

// ---------------------------------------------------------------------------
// 3. search_path shadowing

/// What role B plants in `public` to capture the store functions' name
/// resolution; each logs its invocation, as whom (`who`), in whose session
/// (`via`), and how many alpha sessions it could see then.
const LEAK_TABLE: &str = "
CREATE TABLE public.escape_leak (what text NOT NULL, who name NOT NULL, via name NOT NULL, alpha_sessions bigint);
GRANT INSERT ON public.escape_leak TO PUBLIC;";

/// The shadows themselves, one statement group per blank-line-separated block.
const SHADOWS: &str = r#"
CREATE FUNCTION public.escape_log(what text) RETURNS boolean LANGUAGE plpgsql AS $f$
DECLARE
    seen bigint;
BEGIN
    BEGIN
        SELECT pg_catalog.count(*) INTO seen FROM public.adk_sessions s WHERE s.app_name = 'alpha';
    EXCEPTION WHEN insufficient_privilege THEN
        seen := NULL;
    END;
    INSERT INTO public.escape_leak VALUES (what, current_user, session_user, seen);
    RETURN true;
END $f$;

CREATE FUNCTION public.escape_agg_step(acc jsonb, k text, v jsonb) RETURNS jsonb LANGUAGE plpgsql AS $f$
BEGIN
    PERFORM public.escape_log('jsonb_object_agg(text, jsonb)');
    RETURN pg_catalog.jsonb_concat(coalesce(acc, '{}'::jsonb), pg_catalog.jsonb_build_object(k, v));
END $f$;
CREATE AGGREGATE public.jsonb_object_agg(text, jsonb) (SFUNC = public.escape_agg_step, STYPE = jsonb);

CREATE FUNCTION public.now() RETURNS timestamptz LANGUAGE plpgsql AS $f$
BEGIN
    PERFORM public.escape_log('now()');
    RETURN pg_catalog.now();
END $f$;

CREATE FUNCTION public.escape_concat(l jsonb, r jsonb) RETURNS jsonb LANGUAGE plpgsql AS $f$
BEGIN
    PERFORM public.escape_log('||(jsonb, jsonb)');
    RETURN pg_catalog.jsonb_concat(l, r);
END $f$;
CREATE OPERATOR public.|| (LEFTARG = jsonb, RIGHTARG = jsonb, FUNCTION = public.escape_concat);

CREATE FUNCTION public.format(f text, a name, b text, c text, d text) RETURNS text LANGUAGE plpgsql AS $f$
BEGIN
    PERFORM public.escape_log('format(text, name, text, text, text)');
    RETURN pg_catalog.format(f, a, b, c, d);
END $f$;
CREATE FUNCTION public.format(f text, a name, b text) RETURNS text LANGUAGE plpgsql AS $f$
BEGIN
    PERFORM public.escape_log('format(text, name, text)');
    RETURN pg_catalog.format(f, a, b);
END $f$;
CREATE FUNCTION public.format(f text, a regclass) RETURNS text LANGUAGE plpgsql AS $f$
BEGIN
    PERFORM public.escape_log('format(text, regclass)');
    RETURN pg_catalog.format(f, a);
END $f$;

CREATE FUNCTION public.to_jsonb(r public.adk_store_policy) RETURNS jsonb LANGUAGE plpgsql AS $f$
BEGIN
    PERFORM public.escape_log('to_jsonb(adk_store_policy)');
    RETURN pg_catalog.to_jsonb(r);
END $f$;

CREATE FUNCTION public.adk_tenant_allows(p_tenant text, p_app_name character varying) RETURNS boolean
LANGUAGE plpgsql AS $f$
BEGIN
    RETURN public.escape_log('adk_tenant_allows(text, varchar)');
END $f$;

CREATE VIEW public.pg_roles AS
    SELECT r.oid, r.rolname FROM pg_catalog.pg_roles r WHERE public.escape_log('pg_roles view');
"#;

/// Every shadow above, by the name it logs.
const SHADOW_NAMES: [&str; 9] = [
    "jsonb_object_agg(text, jsonb)",
    "now()",
    "||(jsonb, jsonb)",
    "format(text, name, text, text, text)",
    "format(text, name, text)",
    "format(text, regclass)",
    "to_jsonb(adk_store_policy)",
    "adk_tenant_allows(text, varchar)",
    "pg_roles view",
];

/// Temp tables in role B's own session named like the store's tables: a
/// forged session and a forged binding to every app.
const TEMP_SHADOWS: &str = "
CREATE TEMP TABLE adk_sessions (
    app_name text, user_id text, session_id text, state jsonb, last_seq bigint, session_day date,
    created_at timestamptz, updated_at timestamptz, expires_at timestamptz, closed_at timestamptz,
    successor_id text, initial_state jsonb);
INSERT INTO adk_sessions VALUES
    ('beta', 'u1', 'beta-session', '{\"forged\": true}', 777, current_date, now(), now(), NULL, NULL, NULL, '{}'),
    ('alpha', 'u1', 'alpha-session', '{\"forged\": true}', 777, current_date, now(), now(), NULL, NULL, NULL, '{}');
CREATE TEMP TABLE adk_role_apps (role_oid oid, app_name text);
INSERT INTO adk_role_apps SELECT r.oid, NULL FROM pg_catalog.pg_roles r WHERE r.rolname = current_user;
INSERT INTO adk_role_apps SELECT r.oid, 'alpha' FROM pg_catalog.pg_roles r WHERE r.rolname = current_user;
";

async fn shadowing_the_search_path(at: &mut Attempts) {
    let w = world().await;
    must(&w.owner, "GRANT CREATE ON SCHEMA public TO PUBLIC").await;
    let b = client(&w.b.url).await;
    must(&b, LEAK_TABLE).await;
    if w.db.worker_urls().is_empty() {
        must(&b, SHADOWS).await;
    } else {
        // On Citus, shard queries name catalog functions unqualified, so a
        // planted routine could capture them: the store's schema guard
        // refuses every one (docs/citus.md). The view
        // needs the refused escape_log, and a relation is found by the
        // search_path's order, pg_catalog first, on either.
        for block in SHADOWS.split("\n\n").map(str::trim).filter(|b| !b.is_empty() && !b.starts_with("CREATE VIEW")) {
            let planted = block.lines().next().unwrap_or(block);
            at.refused_because(
                &format!("role B with CREATE on public plants on Citus: {planted}"),
                &b,
                block,
                "only the store's owner",
            )
            .await;
        }
    }
    must(&b, TEMP_SHADOWS).await;
    let alpha_before = w.fingerprint("alpha").await;

    // Redefining the store's functions needs their ownership.
    let redefinitions = [
        (
            "adk_get_session",
            "CREATE OR REPLACE FUNCTION public.adk_get_session(p_tenant text, p_app_name text, p_user_id text,
                                                               p_session_id text, p_after_ts bigint, p_limit bigint)
             RETURNS TABLE (state jsonb, last_seq bigint, session_day date, created_at timestamptz,
                            updated_at timestamptz, expires_at timestamptz, closed_at timestamptz,
                            successor_id text, user_state jsonb, app_state jsonb, payload jsonb)
             LANGUAGE plpgsql SECURITY DEFINER AS $f$ BEGIN RETURN; END $f$",
        ),
        (
            "adk_acting_app",
            "CREATE OR REPLACE FUNCTION public.adk_acting_app() RETURNS text LANGUAGE sql AS $f$ SELECT 'alpha' $f$",
        ),
        (
            "adk_acting_role",
            "CREATE OR REPLACE FUNCTION public.adk_acting_role() RETURNS oid LANGUAGE sql
             AS $f$ SELECT 10::oid $f$",
        ),
        (
            "adk_tenant_allows",
            "CREATE OR REPLACE FUNCTION public.adk_tenant_allows(p_tenant text, p_app_name text) RETURNS boolean
             LANGUAGE sql AS $f$ SELECT true $f$",
        ),
        ("adk_tenant_require (drop)", "DROP FUNCTION public.adk_tenant_require(text, text)"),
        (
            "adk_tenant_allows (take ownership)",
            &format!("ALTER FUNCTION public.adk_tenant_allows(text, text) OWNER TO \"{}\"", w.b.name),
        ),
        ("adk_append_event (make SECURITY INVOKER)", "ALTER FUNCTION public.adk_append_event SECURITY INVOKER"),
    ];
    for (function, statement) in redefinitions {
        at.refused(&format!("role B with CREATE on public redefines {function}"), &b, statement).await;
    }

    // Role B uses the store for its own app, in the session holding the
    // temp tables and with its temp schema searched first: every function
    // resolves the store's own objects.
    must(&b, "SET search_path = pg_temp, pg_catalog, public").await;
    let calls = [
        "SELECT count(*) FROM adk_create_session('beta', 'beta', 'u1', 'beta-new', '{\"k\": 1}', NULL,
                                                 '{\"user:k\": 1}', '{\"app:k\": 1}')",
        "SELECT count(*) FROM adk_append_event('beta', 'beta', 'u1', 'beta-session', 'shadow-1', NULL, 'agent', 1,
             '{\"actions\": {\"state_delta\": {\"topic\": \"beta-3\"}}}', '{\"topic\": \"beta-3\"}',
             '{\"user:k\": 2}', '{\"app:k\": 2}', NULL, NULL)",
        "SELECT count(*) FROM adk_rewind_session('beta', 'beta', 'u1', 'beta-session', 1, NULL)",
        "SELECT count(*) FROM adk_rollover_session('beta', 'beta', 'u1', 'beta-new', 'beta-next', 'roll-1', NULL,
             'agent', 2, '{}', NULL)",
        "SELECT count(*) FROM adk_list_sessions('beta', 'beta', 'u1', NULL, NULL, 100)",
        "SELECT count(*) FROM adk_read_sessions('beta', 'beta', 'u1', NULL, NULL, 100)",
        "SELECT count(*) FROM adk_find_sessions('beta', 'beta-session', 10)",
        "SELECT count(*) FROM adk_get_session('beta', 'beta', 'u1', 'beta-session', NULL, 1000)",
        "SELECT count(*) FROM adk_get_session('alpha', 'alpha', 'u1', 'alpha-session', NULL, 0)",
        "SELECT count(*) FROM (SELECT adk_delete_session('beta', 'beta', 'u1', 'beta-next')) d",
    ];
    for call in calls {
        must_count(&b, call).await;
    }
    at.count(
        "role B's temp adk_sessions is not what the store reads",
        &b,
        "SELECT last_seq FROM adk_get_session('beta', 'beta', 'u1', 'beta-session', NULL, 0)",
        1,
    )
    .await;
    at.count(
        "role B's temp adk_role_apps binding it to alpha is not honoured",
        &b,
        "SELECT count(*) FROM adk_get_session('alpha', 'alpha', 'u1', 'alpha-session', NULL, 0)",
        0,
    )
    .await;
    at.refused(
        "role B's temp adk_role_apps lets it write alpha",
        &b,
        "SELECT * FROM adk_append_event('alpha', 'alpha', 'u1', 'alpha-session', 'shadow-2', NULL, 'agent', 1,
             '{}', '{}', '{}', '{}', NULL, NULL)",
    )
    .await;
    at.refused(
        "role B's varchar overload of adk_tenant_allows lets it write alpha",
        &b,
        "SELECT * FROM adk_delete_session('alpha'::varchar, 'alpha'::varchar, 'u1', 'alpha-session')",
    )
    .await;

    let alpha_after_b = w.fingerprint("alpha").await;
    at.check("role B's calls leave alpha unchanged", alpha_after_b == alpha_before, &(&alpha_before, &alpha_after_b));

    // A new day arrives: role B's store premakes the missing partition.
    let coming = w.partition_ahead(4).await;
    must(&w.owner, &format!("DROP TABLE {coming}")).await;
    assert_eq!(must_count(&b, "SELECT adk_premake_event_partitions()::bigint").await, 1, "premade the new day");

    // The owner's own work: its store, a policy change, maintenance.
    let owner_store = store(w.db.url()).await;
    owner_store
        .append(&w.alpha, with_delta(json!({"topic": "alpha-3", "app:motd": "alpha-3"})), AppendOptions::default())
        .await
        .expect("the owner appends");
    owner_store.rewind(&w.alpha, 1, None).await.expect("the owner rewinds");
    must(&w.owner, "UPDATE adk_store_policy SET premake_days = premake_days").await;
    let later = w.partition_ahead(5).await;
    must(&w.owner, &format!("DROP TABLE {later}")).await;
    let today = chrono::Utc::now().date_naive();
    run_maintenance(w.db.url(), today, &MaintenanceConfig::default()).await.expect("maintenance as the owner");

    // Not one shadow ran, as anyone.
    let invoked: BTreeMap<String, (i64, String, String, Option<i64>)> = w
        .owner
        .query(
            "SELECT what, count(*),
                    pg_catalog.string_agg(DISTINCT CASE WHEN who = $1 THEN 'role B' ELSE who::text END, ', '),
                    pg_catalog.string_agg(DISTINCT CASE WHEN via = $1 THEN 'role B' ELSE via::text END, ', '),
                    max(alpha_sessions)
             FROM public.escape_leak GROUP BY what",
            &[&w.b.name],
        )
        .await
        .expect("read the leak table")
        .iter()
        .map(|r| (r.get(0), (r.get(1), r.get(2), r.get(3), r.get(4))))
        .collect();
    for shadow in SHADOW_NAMES {
        let outcome = invoked.get(shadow).map(|(times, who, via, alpha)| {
            format!("invoked {times} times as {who}, in sessions of {via}, seeing {alpha:?} alpha sessions")
        });
        at.check(&format!("role B's shadow {shadow} is never invoked"), outcome.is_none(), &outcome);
    }
    let unknown: Vec<&String> = invoked.keys().filter(|k| !SHADOW_NAMES.contains(&k.as_str())).collect();
    assert!(unknown.is_empty(), "{unknown:?}");

    // Role B learnt nothing of alpha, by any path.
    at.count(
        "role B's leak table holds nothing about alpha",
        &b,
        "SELECT count(*) FROM public.escape_leak WHERE alpha_sessions IS NOT NULL",
        0,
    )
    .await;
    at.count(
        "role B reads alpha after planting its shadows",
        &b,
        "SELECT count(*) FROM adk_get_session('alpha', 'alpha', 'u1', 'alpha-session', NULL, 0)",
        0,
    )
    .await;
}

// ---------------------------------------------------------------------------
// 4. direct writes

async fn writing_the_tables_directly(at: &mut Attempts) {
    let w = world().await;
    let (today, _, _) = w.today().await;
    let before = (w.fingerprint("alpha").await, w.fingerprint("beta").await, w.bindings().await);
    let a = client(&w.a.url).await;
    // Each acting for its own app, where row-level security would let it.
    let writes = [
        ("rewrites an event", "UPDATE adk_events SET payload = '{\"forged\": true}' WHERE app_name = 'alpha'".into()),
        (
            "moves a session's clock",
            "UPDATE adk_sessions SET created_at = now(), last_seq = 0 WHERE app_name = 'alpha'".into(),
        ),
        (
            "picks an event's seq",
            "INSERT INTO adk_events (app_name, user_id, session_id, session_day, seq, event_id, author, event_ts, payload)
             VALUES ('alpha', 'u1', 'alpha-session', (now() AT TIME ZONE 'UTC')::date, 999, 'forged', 'agent', 0, '{}')"
                .into(),
        ),
        (
            "inserts a session",
            "INSERT INTO adk_sessions (app_name, user_id, session_id) VALUES ('alpha', 'u1', 'forged')".into(),
        ),
        ("deletes app state", "DELETE FROM adk_app_states".into()),
        ("deletes user state", "DELETE FROM adk_user_states WHERE app_name = 'alpha'".into()),
        ("rewrites today's partition", format!("UPDATE {today} SET payload = '{{\"forged\": true}}'")),
        ("truncates adk_events", "TRUNCATE adk_events".into()),
        ("truncates adk_sessions", "TRUNCATE adk_sessions CASCADE".into()),
        ("truncates today's partition", format!("TRUNCATE {today}")),
        ("adds a column", "ALTER TABLE adk_sessions ADD COLUMN forged text".into()),
        ("disables row-level security", "ALTER TABLE adk_sessions DISABLE ROW LEVEL SECURITY".into()),
        ("stops forcing row-level security", "ALTER TABLE adk_events NO FORCE ROW LEVEL SECURITY".into()),
        ("drops the tenant policy", "DROP POLICY adk_tenant_isolation ON adk_app_states".into()),
        (
            "adds a permissive policy",
            "CREATE POLICY forged ON adk_sessions USING (true) WITH CHECK (true)".into(),
        ),
        ("detaches today's partition", format!("ALTER TABLE adk_events DETACH PARTITION {today}")),
        (
            "binds itself to every app",
            format!("INSERT INTO adk_role_apps (role_oid, app_name) VALUES ('\"{}\"'::regrole, NULL)", w.a.name),
        ),
        ("rewrites the bindings", "UPDATE adk_role_apps SET app_name = NULL".into()),
        ("erases the bindings log", "DELETE FROM adk_role_app_changes".into()),
        ("changes the store policy", "UPDATE adk_store_policy SET premake_days = 0".into()),
        ("makes an arbitrary partition", "SELECT adk_ensure_event_partition(current_date + 100)".into()),
        ("re-protects a table its way", "SELECT adk_protect_tenant_table('adk_sessions')".into()),
        ("protects partitions", "SELECT adk_protect_event_partitions()".into()),
    ];
    for (what, statement) in writes {
        at.refused_for(&format!("service role A {what}"), &a, "alpha", &statement).await;
    }
    let after = (w.fingerprint("alpha").await, w.fingerprint("beta").await, w.bindings().await);
    at.check("the owner finds alpha, beta and the bindings unchanged", after == before, &(before, after));
}

// ---------------------------------------------------------------------------
// 5. every store function, with a foreign app, in raw SQL

/// The image each app's second event carries (a blob of its own).
fn app_image(app: &str) -> Vec<u8> {
    media_bytes(70_000, if app == "alpha" { 1 } else { 2 })
}

/// `adk_get_blobs` of alpha's session for alpha's image, with tenant `t`.
fn alpha_blob_read(t: &str) -> String {
    let hash = adk_postgres_domain::blob::hex(&adk_postgres_domain::Blob::new(app_image("alpha")).sha256);
    format!("SELECT count(*) FROM adk_get_blobs({t}, 'alpha', 'u1', 'alpha-session', ARRAY['\\x{hash}'::bytea])")
}

/// Reads of alpha's session with tenant `t` (an SQL literal).
fn foreign_reads(t: &str) -> Vec<(&'static str, String)> {
    vec![
        ("adk_get_blobs", alpha_blob_read(t)),
        (
            "adk_read_session",
            format!("SELECT count(*) FROM adk_read_session({t}, 'alpha', 'u1', 'alpha-session', NULL, NULL)"),
        ),
        (
            "adk_get_session",
            format!("SELECT count(*) FROM adk_get_session({t}, 'alpha', 'u1', 'alpha-session', NULL, NULL)"),
        ),
        ("adk_read_sessions", format!("SELECT count(*) FROM adk_read_sessions({t}, 'alpha', 'u1', NULL, NULL, 100)")),
        ("adk_list_sessions", format!("SELECT count(*) FROM adk_list_sessions({t}, 'alpha', 'u1', NULL, NULL, 100)")),
        ("adk_find_sessions", format!("SELECT count(*) FROM adk_find_sessions({t}, 'alpha-session', 10)")),
        (
            "adk_list_events",
            format!("SELECT count(*) FROM adk_list_events({t}, 'alpha', 'u1', 'alpha-session', 0, NULL, 1000)"),
        ),
    ]
}

/// The app-wide listing of alpha with tenant `t`: refused, not answered
/// empty, for any role that may not act for alpha.
fn alpha_app_listing(t: &str) -> String {
    format!("SELECT count(*) FROM adk_list_app_sessions({t}, 'alpha', NULL, NULL, NULL, 100, '{{}}', NULL, NULL)")
}

/// Writes to alpha with tenant `t` (an SQL literal).
fn foreign_writes(t: &str) -> Vec<(&'static str, String)> {
    vec![
        (
            "adk_create_session",
            format!(
                "SELECT * FROM adk_create_session({t}, 'alpha', 'u1', 'forged-session', '{{}}', NULL,
                                                  '{{\"user:plan\": \"forged\"}}', '{{\"app:motd\": \"forged\"}}')"
            ),
        ),
        (
            "adk_append_event",
            format!(
                "SELECT * FROM adk_append_event({t}, 'alpha', 'u1', 'alpha-session', 'forged-event', NULL, 'mallory', 0,
                     '{{\"forged\": true}}', '{{\"topic\": \"forged\"}}', '{{\"user:plan\": \"forged\"}}',
                     '{{\"app:motd\": \"forged\"}}', NULL, NULL)"
            ),
        ),
        // Taking alpha's invocation lease would lock alpha's own runners
        // out of the session for an hour, with nothing appended that shows.
        (
            "adk_append_event (taking the invocation lease)",
            format!(
                "SELECT * FROM adk_append_event({t}, 'alpha', 'u1', 'alpha-session', 'forged-lease', 'mallory-turn',
                     'mallory', 0, '{{}}', '{{}}', '{{}}', '{{}}', NULL, NULL, NULL, interval '1 hour', NULL, false)"
            ),
        ),
        (
            "adk_rollover_session",
            format!(
                "SELECT * FROM adk_rollover_session({t}, 'alpha', 'u1', 'alpha-session', 'forged-successor',
                     'forged-event', NULL, 'mallory', 0, '{{}}', NULL)"
            ),
        ),
        (
            "adk_rewind_session",
            format!("SELECT * FROM adk_rewind_session({t}, 'alpha', 'u1', 'alpha-session', 0, NULL)"),
        ),
        ("adk_delete_session", format!("SELECT adk_delete_session({t}, 'alpha', 'u1', 'alpha-session')")),
        // Refused before the event is looked for, so any id shows it.
        (
            "adk_redact_event",
            format!("SELECT * FROM adk_redact_event({t}, 'alpha', 'u1', 'alpha-session', 'any-event', 'forged', true)"),
        ),
    ]
}

/// User and app state of alpha, read and merged directly, with tenant `t`:
/// refused (42501) like a write, reads too, since `{}` would be a state.
fn foreign_state_calls(t: &str) -> Vec<(&'static str, String)> {
    vec![
        ("adk_get_user_state", format!("SELECT * FROM adk_get_user_state({t}, 'alpha', 'u1')")),
        ("adk_get_app_state", format!("SELECT * FROM adk_get_app_state({t}, 'alpha')")),
        (
            "adk_merge_user_state",
            format!("SELECT * FROM adk_merge_user_state({t}, 'alpha', 'u1', '{{\"plan\": \"forged\"}}')"),
        ),
        ("adk_merge_app_state", format!("SELECT * FROM adk_merge_app_state({t}, 'alpha', '{{\"motd\": \"forged\"}}')")),
        // An empty delta writes nothing, but still reads the state back.
        ("adk_merge_user_state (empty)", format!("SELECT * FROM adk_merge_user_state({t}, 'alpha', 'u1', '{{}}')")),
        ("adk_merge_app_state (empty)", format!("SELECT * FROM adk_merge_app_state({t}, 'alpha', '{{}}')")),
    ]
}

async fn calling_the_store_functions_for_another_app(at: &mut Attempts) {
    let w = world().await;
    let before = (w.fingerprint("alpha").await, w.fingerprint("beta").await);
    let b = client(&w.b.url).await;
    for (case, t) in [("forged tenant alpha", "'alpha'"), ("mismatched tenant beta", "'beta'"), ("no tenant", "NULL")] {
        for (function, query) in foreign_reads(t) {
            at.count(&format!("role B, {case}: {function} of alpha"), &b, &query, 0).await;
        }
        for (function, statement) in foreign_writes(t).into_iter().chain(foreign_state_calls(t)) {
            at.refused(&format!("role B, {case}: {function} of alpha"), &b, &statement).await;
        }
        at.refused(&format!("role B, {case}: adk_list_app_sessions of alpha"), &b, &alpha_app_listing(t)).await;
    }
    // A role bound to no app at all, naming alpha or nothing.
    let unbound = client(&service_role(&w.db, "unbound", AppBinding::Keep).await.url).await;
    for (case, t) in [("tenant alpha", "'alpha'"), ("no tenant", "NULL")] {
        for (function, statement) in foreign_state_calls(t) {
            at.refused(&format!("a role bound to nothing, {case}: {function} of alpha"), &unbound, &statement).await;
        }
    }
    at.refused_for(
        "role B, adk.app_name forged to alpha: adk_list_app_sessions of alpha",
        &b,
        "alpha",
        &alpha_app_listing("'alpha'"),
    )
    .await;
    // A role granted the store's functions whose binding is gone: the
    // paging reads find nothing and the app listing is refused.
    let c = service_role(&w.db, "c", AppBinding::Apps(vec!["gamma".into()])).await;
    must(&w.owner, &format!("DELETE FROM adk_role_apps WHERE role_name = '{}'", c.name)).await;
    let c_sql = client(&c.url).await;
    for t in ["'alpha'", "NULL"] {
        let query = format!("SELECT count(*) FROM adk_list_events({t}, 'alpha', 'u1', 'alpha-session', NULL, 99, 10)");
        at.count(&format!("role C without a binding, tenant {t}: adk_list_events of alpha"), &c_sql, &query, 0).await;
        at.refused(
            &format!("role C without a binding, tenant {t}: adk_list_app_sessions of alpha"),
            &c_sql,
            &alpha_app_listing(t),
        )
        .await;
    }
    // Role A, bound to alpha, pages alpha's events and lists alpha: the
    // reads above could have found them.
    let a_sql = client(&w.a.url).await;
    let own = "SELECT count(*) FROM adk_list_events('alpha', 'alpha', 'u1', 'alpha-session', 0, NULL, 1000)";
    assert_eq!(must_count(&a_sql, own).await, 3, "role A pages alpha's events: the header and two events");
    assert_eq!(
        must_count(&a_sql, &alpha_app_listing("'alpha'")).await,
        2,
        "role A lists alpha: the header and one session"
    );
    // Forging the setting first changes nothing, and a tenant the store set
    // for beta in this transaction does not carry over to alpha.
    act_for(&b, "alpha").await;
    for (function, query) in foreign_reads("'alpha'") {
        at.count(&format!("role B, adk.app_name forged to alpha: {function} of alpha"), &b, &query, 0).await;
    }
    assert_eq!(
        must_count(&b, "SELECT count(*) FROM adk_get_session('beta', 'beta', 'u1', 'beta-session', NULL, 0)").await,
        1,
        "role B reads its own session"
    );
    for (function, query) in foreign_reads("'alpha'") {
        at.count(&format!("role B, after acting for beta in the transaction: {function} of alpha"), &b, &query, 0)
            .await;
    }
    end_acting(&b).await;
    for (function, statement) in foreign_writes("'alpha'").into_iter().chain(foreign_state_calls("'alpha'")) {
        at.refused_for(&format!("role B, adk.app_name forged to alpha: {function} of alpha"), &b, "alpha", &statement)
            .await;
    }
    // Role A, bound to alpha, reads alpha's state: the refusals above were
    // not for want of a state to find.
    let a = client(&w.a.url).await;
    let plan: String = a
        .query_one("SELECT state ->> 'plan' FROM adk_get_user_state('alpha', 'alpha', 'u1')", &[])
        .await
        .expect("role A reads alpha's user state")
        .get(0);
    assert_eq!(plan, "alpha");
    // Role A, bound to alpha, reads the same blob: the reads above could
    // have found it.
    if w.db.worker_urls().is_empty() {
        let a = client(&w.a.url).await;
        assert_eq!(must_count(&a, &alpha_blob_read("'alpha'")).await, 1, "role A reads alpha's media");
    }
    // The helpers the functions use are not callable at all.
    let helpers = [
        "SELECT adk_hold_blobs('alpha', ARRAY['\\x00'::bytea], ARRAY['\\x00'::bytea])",
        "SELECT adk_hold_copied_blobs('alpha', 'u1', 'alpha-session', current_date)",
        "SELECT adk_release_blob_refs('alpha', ARRAY['\\x00'::bytea])",
        "SELECT adk_blob_hashes(ARRAY['\\x00'::bytea])",
        "SELECT adk_grant_like('adk_get_blobs(text, text, text, text, bytea[])', 'adk_get_session(text, text, text, text, bigint, bigint)')",
        "SELECT adk_tenant_allows('alpha', 'alpha')",
        "SELECT adk_tenant_require('alpha', 'alpha')",
        "SELECT adk_acting_role()",
        "SELECT adk_ensure_event_partition(current_date + 100)",
        "SELECT adk_protect_tenant_table('adk_sessions')",
        "SELECT adk_protect_event_partitions()",
    ];
    for helper in helpers {
        at.refused(&format!("role B calls {helper}"), &b, helper).await;
    }
    let after = (w.fingerprint("alpha").await, w.fingerprint("beta").await);
    at.check("the owner finds alpha and beta unchanged", after == before, &(before, after));
}

// ---------------------------------------------------------------------------
// 6. through the Rust store

/// Every operation of `store` about alpha, each an attempt.
async fn store_reaches_alpha(
    at: &mut Attempts,
    label: &str,
    store: &PgSessionStore,
    alpha: &SessionKey,
    alpha_event: &str,
) {
    let got = store.get(alpha, GetOptions::default()).await.map(|s| s.events.len());
    at.check(&format!("{label}: get alpha"), matches!(got, Err(StoreError::NotFound(_))), &got);
    let listed = store
        .list(&ListSessions::new(alpha.app_name.clone(), alpha.user_id.clone()))
        .await
        .map(|page| page.sessions.len());
    at.check(
        &format!("{label}: list alpha"),
        matches!(listed, Ok(0) | Err(StoreError::PermissionDenied { .. })),
        &listed,
    );
    let found = store.find_by_id(&alpha.session_id, 10).await;
    at.check(&format!("{label}: find alpha's session id"), matches!(&found, Ok(keys) if keys.is_empty()), &found);
    let paged = store.list_events(alpha, EventPage::last(1000)).await.map(|page| page.events.len());
    at.check(&format!("{label}: page alpha's events"), matches!(paged, Err(StoreError::NotFound(_))), &paged);
    let app_listed =
        store.list_app_sessions(&ListAppSessions::new(alpha.app_name.clone())).await.map(|page| page.sessions.len());
    at.check(
        &format!("{label}: list alpha's sessions across users"),
        matches!(app_listed, Err(StoreError::PermissionDenied { .. })),
        &app_listed,
    );

    let refused =
        |r: &Result<(), StoreError>| matches!(r, Err(StoreError::PermissionDenied { .. } | StoreError::NotFound(_)));
    let appended = store
        .append(alpha, with_delta(json!({"topic": "forged", "app:motd": "forged"})), AppendOptions::default())
        .await
        .map(|_| ());
    at.check(&format!("{label}: append to alpha"), refused(&appended), &appended);
    let created = store
        .create(CreateSession::new(alpha.app_name.clone(), alpha.user_id.clone()).with_id("forged-session"))
        .await
        .map(|_| ());
    at.check(&format!("{label}: create in alpha"), refused(&created), &created);
    let rolled = store.rollover(alpha, Some("forged-successor".into()), Event::new("mallory")).await.map(|_| ());
    at.check(&format!("{label}: roll alpha over"), refused(&rolled), &rolled);
    let rewound = store.rewind(alpha, 0, None).await.map(|_| ());
    at.check(&format!("{label}: rewind alpha"), refused(&rewound), &rewound);
    let redacted = store.redact_event(alpha, alpha_event, "forged", RedactOptions { state_delta: true }).await;
    let redacted = redacted.map(|_| ());
    at.check(&format!("{label}: redact an event of alpha"), refused(&redacted), &redacted);
    let deleted = store.delete(alpha).await;
    at.check(&format!("{label}: delete alpha"), refused(&deleted), &deleted);

    let denied =
        |r: &Result<adk_postgres_domain::State, StoreError>| matches!(r, Err(StoreError::PermissionDenied { .. }));
    let (app, user) = (&alpha.app_name, &alpha.user_id);
    let read = store.get_user_state(app, user).await;
    at.check(&format!("{label}: get alpha's user state"), denied(&read), &read);
    let read = store.get_app_state(app).await;
    at.check(&format!("{label}: get alpha's app state"), denied(&read), &read);
    let forged = json!({"plan": "forged", "motd": "forged"}).as_object().cloned().expect("an object");
    let merged = store.merge_user_state(app, user, forged.clone()).await;
    at.check(&format!("{label}: merge into alpha's user state"), denied(&merged), &merged);
    let merged = store.merge_app_state(app, forged).await;
    at.check(&format!("{label}: merge into alpha's app state"), denied(&merged), &merged);
}

async fn the_rust_store_for_another_app(at: &mut Attempts) {
    let w = world().await;
    let before = (w.fingerprint("alpha").await, w.fingerprint("beta").await);
    let alpha_event: String = w
        .owner
        .query_one("SELECT event_id FROM adk_events WHERE app_name = 'alpha' ORDER BY seq LIMIT 1", &[])
        .await
        .expect("an event of alpha")
        .get(0);

    let fixed_beta = store_as(&w.b, TenantScope::Fixed(app("beta"))).await;
    let per_request = store_as(&w.b, TenantScope::PerRequest).await;
    for (label, store) in [("Fixed(beta) as B", &fixed_beta), ("PerRequest as B", &per_request)] {
        let own = store.get(&w.beta, GetOptions::default()).await.expect("role B reads its own session");
        assert_eq!(own.events.len(), 2, "{label}");
        store_reaches_alpha(at, label, store, &w.alpha, &alpha_event).await;
    }

    let off = store_as(&w.b, TenantScope::Off).await;
    store_reaches_alpha(at, "Off as B", &off, &w.alpha, &alpha_event).await;
    let got = off.get(&w.beta, GetOptions::default()).await.map(|s| s.events.len());
    at.check("Off as B: get beta without naming a tenant", matches!(got, Err(StoreError::NotFound(_))), &got);
    let listed = off.list(&ListSessions::new(app("beta"), w.beta.user_id.clone())).await.map(|p| p.sessions.len());
    at.check("Off as B: list beta without naming a tenant", matches!(listed, Ok(0)), &listed);

    let fixed_alpha = store_as(&w.b, TenantScope::Fixed(app("alpha"))).await;
    store_reaches_alpha(at, "Fixed(alpha) as B", &fixed_alpha, &w.alpha, &alpha_event).await;
    let got = fixed_alpha.get(&w.beta, GetOptions::default()).await.map(|s| s.events.len());
    at.check("Fixed(alpha) as B: get beta", matches!(got, Err(StoreError::NotFound(_))), &got);

    let after = (w.fingerprint("alpha").await, w.fingerprint("beta").await);
    at.check("the owner finds alpha and beta unchanged", after == before, &(before, after));
}

// ---------------------------------------------------------------------------
// 7. SET ROLE and membership

async fn acting_through_set_role(at: &mut Attempts) {
    let w = world().await;
    let member = plain_role(&w.db, &w.owner, "member").await;
    must(&w.owner, &format!("GRANT \"{}\" TO \"{}\"", w.a.name, member.name)).await;
    let m = client(&member.url).await;
    let load_alpha = "SELECT count(*) FROM adk_get_session('alpha', 'alpha', 'u1', 'alpha-session', NULL, 0)";
    let load_beta = "SELECT count(*) FROM adk_get_session('beta', 'beta', 'u1', 'beta-session', NULL, 0)";
    let append_alpha = "SELECT * FROM adk_append_event('alpha', 'alpha', 'u1', 'alpha-session', 'member-1', NULL,
                            'member', 0, '{}', '{}', '{}', '{}', NULL, NULL)";

    at.count("a member of A, itself unbound, reads alpha", &m, load_alpha, 0).await;
    at.refused("a member of A, itself unbound, appends to alpha", &m, append_alpha).await;
    at.refused(&format!("a member of A sets role {}", w.b.name), &m, &format!("SET ROLE \"{}\"", w.b.name)).await;
    at.refused(
        "a member of A sets the role setting to B",
        &m,
        &format!("SELECT set_config('role', '{}', false)", w.b.name),
    )
    .await;
    at.refused(
        "a member of A takes A's session authorization",
        &m,
        &format!("SET SESSION AUTHORIZATION \"{}\"", w.a.name),
    )
    .await;

    must(&m, &format!("SET ROLE \"{}\"", w.a.name)).await;
    assert_eq!(must_count(&m, load_alpha).await, 1, "after SET ROLE to A it acts for alpha");
    at.count("a member of A, as A, reads beta", &m, load_beta, 0).await;
    must(&m, "RESET ROLE").await;
    at.count("a member of A, after RESET ROLE, reads alpha", &m, load_alpha, 0).await;

    let b = client(&w.b.url).await;
    at.refused("role B sets role A", &b, &format!("SET ROLE \"{}\"", w.a.name)).await;
    at.refused("role B sets the role setting to A", &b, &format!("SELECT set_config('role', '{}', false)", w.a.name))
        .await;

    // A router bound to every app acts for each app it names, and only
    // when it names one.
    let router = service_role(&w.db, "router", AppBinding::AllApps).await;
    let routed = store_as(&router, TenantScope::PerRequest).await;
    for key in [&w.alpha, &w.beta] {
        let session = routed.get(key, GetOptions::default()).await.expect("an all-apps role reads each app");
        assert_eq!(session.events.len(), 2);
        assert_eq!(session.key.app_name, key.app_name);
    }
    let unnamed = store_as(&router, TenantScope::Off).await;
    let got = unnamed.get(&w.alpha, GetOptions::default()).await.map(|s| s.events.len());
    at.check("an all-apps role naming no tenant reads alpha", matches!(got, Err(StoreError::NotFound(_))), &got);
    let r = client(&router.url).await;
    at.count(
        "an all-apps role calls with a mismatched tenant",
        &r,
        "SELECT count(*) FROM adk_get_session('beta', 'alpha', 'u1', 'alpha-session', NULL, 0)",
        0,
    )
    .await;
}

// ---------------------------------------------------------------------------
// 8. checks that already held

async fn checks_that_held(at: &mut Attempts) {
    let w = world().await;
    let before = w.fingerprint("alpha").await;
    let rep = service_role(&w.db, "rep", AppBinding::Apps(vec!["beta".into()])).await;
    must(
        &w.owner,
        &format!(
            "GRANT SELECT ON ALL TABLES IN SCHEMA public TO \"{0}\";
             GRANT INSERT, UPDATE, DELETE ON adk_sessions TO \"{0}\"",
            rep.name
        ),
    )
    .await;
    let sql = client(&rep.url).await;

    // A tenant set in a savepoint goes with it.
    must(&sql, "BEGIN; SAVEPOINT s; SET LOCAL adk.app_name = 'beta'").await;
    assert_eq!(must_count(&sql, "SELECT count(*) FROM adk_sessions").await, 1, "acting for beta");
    must(&sql, "ROLLBACK TO SAVEPOINT s").await;
    at.count(
        "the tenant set in a rolled back savepoint is gone",
        &sql,
        "SELECT count(*) FROM (SELECT current_setting('adk.app_name', true) AS s) t WHERE coalesce(t.s, '') <> ''",
        0,
    )
    .await;
    at.count("rows after ROLLBACK TO SAVEPOINT", &sql, "SELECT count(*) FROM adk_sessions", 0).await;
    must(&sql, "COMMIT").await;

    // The tenant a store function sets is local to its transaction.
    assert_eq!(
        must_count(&sql, "SELECT count(*) FROM adk_get_session('beta', 'beta', 'u1', 'beta-session', NULL, 0)").await,
        1,
        "the reporting role is a service role too"
    );
    at.count("rows after a store function acted for beta", &sql, "SELECT count(*) FROM adk_sessions", 0).await;

    // Acting for beta, no write reaches alpha.
    let insert_alpha = "INSERT INTO adk_sessions (app_name, user_id, session_id) VALUES ('alpha', 'u9', 'sneaky')";
    let update_all = "UPDATE adk_sessions SET state = '{\"forged\": true}'";
    at.refused_because_for(
        "acting for beta, insert an alpha session",
        &sql,
        "beta",
        insert_alpha,
        "row-level security",
    )
    .await;
    at.refused_because_for(
        "acting for beta, move beta's session into alpha",
        &sql,
        "beta",
        "UPDATE adk_sessions SET app_name = 'alpha' WHERE app_name = 'beta'",
        "row-level security",
    )
    .await;
    act_for(&sql, "beta").await;
    let updated = sql.execute(&format!("{update_all} WHERE app_name = 'alpha'"), &[]).await;
    let updated = updated.map_err(|e| describe(&e));
    at.check("acting for beta, update alpha's sessions", updated == Ok(0), &updated);
    let deleted = sql.execute("DELETE FROM adk_sessions WHERE app_name = 'alpha'", &[]).await.map_err(|e| describe(&e));
    at.check("acting for beta, delete alpha's sessions", deleted == Ok(0), &deleted);
    end_acting(&sql).await;
    must(&sql, "SET adk.app_name = 'alpha'").await;
    let updated = sql.execute(update_all, &[]).await.map_err(|e| describe(&e));
    at.check("forging alpha with SET, update every session", updated == Ok(0), &updated);
    at.refused_because("forging alpha with SET, insert an alpha session", &sql, insert_alpha, "row-level security")
        .await;
    must(&sql, "RESET adk.app_name").await;
    act_for(&sql, "alpha").await;
    let updated = sql.execute(update_all, &[]).await.map_err(|e| describe(&e));
    at.check("forging alpha with SET LOCAL, update every session", updated == Ok(0), &updated);
    end_acting(&sql).await;
    at.refused_because_for(
        "forging alpha with SET LOCAL, insert an alpha session",
        &sql,
        "alpha",
        insert_alpha,
        "row-level security",
    )
    .await;
    let after = w.fingerprint("alpha").await;
    at.check("the owner finds alpha unchanged", after == before, &(before, after));
}

/// An operator granting a reporting role every privilege on every table of
/// the schema: the bindings are among those tables. Each attempt runs in a
/// transaction of its own, forging alpha, so a refusal aborts no other; what
/// a succeeding attempt let the role read is part of its outcome, and what
/// it wrote stays for the owner to find.
async fn a_broad_write_grant_and_the_bindings(at: &mut Attempts) {
    let w = world().await;
    let rep = service_role(&w.db, "rep", AppBinding::Apps(vec!["beta".into()])).await;
    must(&w.owner, &format!("GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO \"{}\"", rep.name))
        .await;
    let before = (w.fingerprint("alpha").await, w.bindings().await);
    let sql = client(&rep.url).await;
    let attempts = [
        (
            "insert a binding to alpha",
            format!("INSERT INTO adk_role_apps (role_oid, app_name) VALUES ('\"{}\"'::regrole, 'alpha')", rep.name),
        ),
        (
            "insert a binding to every app",
            format!("INSERT INTO adk_role_apps (role_oid, app_name) VALUES ('\"{}\"'::regrole, NULL)", rep.name),
        ),
        (
            "turn its beta binding into alpha",
            "UPDATE adk_role_apps SET app_name = 'alpha' WHERE app_name = 'beta'".into(),
        ),
    ];
    for (what, statement) in attempts {
        act_for(&sql, "alpha").await;
        let outcome = sql.batch_execute(&statement).await.map_err(|e| describe(&e));
        // Refused outright, or let through and changing nothing (a row-level
        // security policy without a write policy makes an UPDATE find no
        // row): either way the role must not reach alpha.
        let (held, reach) = match &outcome {
            Ok(()) => {
                let direct = must_count(&sql, "SELECT count(*) FROM adk_sessions").await;
                let through = must_count(
                    &sql,
                    "SELECT count(*) FROM adk_get_session('alpha', 'alpha', 'u1', 'alpha-session', NULL, 0)",
                )
                .await;
                (
                    direct == 0 && through == 0,
                    Some(format!("then saw {direct} alpha sessions directly, {through} through the store")),
                )
            }
            Err(message) => (message.starts_with("42501"), None),
        };
        end_acting(&sql).await;
        at.check(&format!("reporting role with a broad write grant: {what}"), held, &(outcome, reach));
    }
    let after = (w.fingerprint("alpha").await, w.bindings().await);
    at.check("the owner finds alpha and the bindings unchanged", after == before, &(before, after));
}

// ---------------------------------------------------------------------------
// 9. re-binding

async fn rebinding_a_role(at: &mut Attempts) {
    let w = world().await;
    let b = client(&w.b.url).await;
    let load_alpha = "SELECT count(*) FROM adk_get_session('alpha', 'alpha', 'u1', 'alpha-session', NULL, 0)";
    let load_beta = "SELECT count(*) FROM adk_get_session('beta', 'beta', 'u1', 'beta-session', NULL, 0)";
    assert_eq!((must_count(&b, load_alpha).await, must_count(&b, load_beta).await), (0, 1), "bound to beta");

    // A re-binding that fails changes nothing.
    let bad = AppBinding::Apps(vec!["alpha".into(), String::new()]);
    let refused =
        setup_service_role(w.db.url(), &w.b.name, &ServiceRoleOptions { create: false, password: None, apps: bad })
            .await;
    assert!(refused.is_err(), "an empty app name is refused");
    at.count("role B after a failed re-binding to alpha reads alpha", &b, load_alpha, 0).await;

    // Watched from role B's own snapshots while it is re-bound back and
    // forth: each snapshot sees it bound to exactly one of the two apps.
    let watcher = client(&w.b.url).await;
    let stop = Arc::new(AtomicBool::new(false));
    let watching = {
        let stop = Arc::clone(&stop);
        tokio::spawn(async move {
            let mut seen = Vec::new();
            while !stop.load(Ordering::Relaxed) || seen.is_empty() {
                watcher.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ").await.expect("begin");
                let row = watcher
                    .query_one(
                        "SELECT (SELECT count(*) FROM adk_get_session('alpha', 'alpha', 'u1', 'alpha-session', NULL, 0)),
                                (SELECT count(*) FROM adk_get_session('beta', 'beta', 'u1', 'beta-session', NULL, 0))",
                        &[],
                    )
                    .await
                    .expect("both at once");
                watcher.batch_execute("COMMIT").await.expect("commit");
                seen.push((row.get::<_, i64>(0), row.get::<_, i64>(1)));
            }
            seen
        })
    };
    for apps in [["alpha"], ["beta"], ["alpha"]] {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        rebind(&w.db, &w.b, &apps).await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    stop.store(true, Ordering::Relaxed);
    let seen = watching.await.expect("watcher");
    let torn: Vec<&(i64, i64)> = seen.iter().filter(|s| !matches!(s, (1, 0) | (0, 1))).collect();
    at.check(
        &format!("a snapshot during re-binding sees role B bound to both apps or neither ({} snapshots)", seen.len()),
        torn.is_empty(),
        &torn,
    );

    // Now bound to alpha, and to alpha only.
    assert_eq!(must_count(&b, load_alpha).await, 1, "re-bound to alpha");
    at.count("role B, re-bound to alpha, reads beta", &b, load_beta, 0).await;
    at.refused(
        "role B, re-bound to alpha, appends to beta",
        &b,
        "SELECT * FROM adk_append_event('beta', 'beta', 'u1', 'beta-session', 'after-rebind', NULL, 'agent', 0,
             '{}', '{}', '{}', '{}', NULL, NULL)",
    )
    .await;
    let per_request = store_as(&w.b, TenantScope::PerRequest).await;
    per_request.get(&w.alpha, GetOptions::default()).await.expect("the store acts for alpha now");
    let got = per_request.get(&w.beta, GetOptions::default()).await.map(|s| s.events.len());
    at.check("role B's store, re-bound to alpha, gets beta", matches!(got, Err(StoreError::NotFound(_))), &got);
    let changes = must_count(
        &w.owner,
        &format!(
            "SELECT count(*) FROM adk_role_app_changes WHERE role_oid = '\"{}\"'::regrole AND change = 'bound'",
            w.b.name
        ),
    )
    .await;
    assert_eq!(changes, 4, "every binding is logged: beta, alpha, beta, alpha");
}

// ---------------------------------------------------------------------------
// the tests

#[tokio::test(flavor = "multi_thread")]
async fn forging_the_tenant_setting_reveals_nothing() {
    let mut at = Attempts::default();
    forging_the_tenant_setting(&mut at).await;
    at.finish("forging the tenant setting: ");
}

#[tokio::test(flavor = "multi_thread")]
async fn partitions_stay_protected_after_a_broad_grant() {
    let mut at = Attempts::default();
    partitions_after_a_broad_grant(&mut at).await;
    at.finish("partitions after a broad grant: ");
}

#[tokio::test(flavor = "multi_thread")]
async fn shadowing_the_search_path_captures_nothing() {
    let mut at = Attempts::default();
    shadowing_the_search_path(&mut at).await;
    at.finish("search_path shadowing: ");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_service_role_cannot_write_the_tables_directly() {
    let mut at = Attempts::default();
    writing_the_tables_directly(&mut at).await;
    at.finish("direct writes: ");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_store_functions_refuse_another_app() {
    let mut at = Attempts::default();
    calling_the_store_functions_for_another_app(&mut at).await;
    at.finish("store functions: ");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_rust_store_refuses_another_app_in_every_scope() {
    let mut at = Attempts::default();
    the_rust_store_for_another_app(&mut at).await;
    at.finish("Rust store: ");
}

#[tokio::test(flavor = "multi_thread")]
async fn set_role_acts_only_for_the_role_set() {
    let mut at = Attempts::default();
    acting_through_set_role(&mut at).await;
    at.finish("SET ROLE: ");
}

#[tokio::test(flavor = "multi_thread")]
async fn savepoints_and_row_level_security_still_hold() {
    let mut at = Attempts::default();
    checks_that_held(&mut at).await;
    at.finish("checks that held: ");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_broad_write_grant_does_not_hand_over_the_bindings() {
    let mut at = Attempts::default();
    a_broad_write_grant_and_the_bindings(&mut at).await;
    at.finish("broad write grant: ");
}

#[tokio::test(flavor = "multi_thread")]
async fn rebinding_a_role_is_atomic() {
    let mut at = Attempts::default();
    rebinding_a_role(&mut at).await;
    at.finish("re-binding: ");
}

/// Every scenario in one tally.
#[tokio::test(flavor = "multi_thread")]
async fn escape_suite_summary() {
    let mut at = Attempts::default();
    forging_the_tenant_setting(&mut at).await;
    partitions_after_a_broad_grant(&mut at).await;
    shadowing_the_search_path(&mut at).await;
    writing_the_tables_directly(&mut at).await;
    calling_the_store_functions_for_another_app(&mut at).await;
    the_rust_store_for_another_app(&mut at).await;
    acting_through_set_role(&mut at).await;
    checks_that_held(&mut at).await;
    a_broad_write_grant_and_the_bindings(&mut at).await;
    rebinding_a_role(&mut at).await;
    at.finish("");
}
