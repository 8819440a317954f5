//! Session metadata where only PostgreSQL can show it: the label filter's
//! plan on 100k sessions, appends staying HOT next to the label index and
//! never running the metadata checks, the tenant check of
//! `adk_set_session_metadata`, and the checks that hold the bounds for rows
//! written behind the store's back (a trigger that refuses a row as a CHECK
//! constraint would, named like one: CHECKs would run on every append).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use adk_postgres_domain::{
    AppName, AppendOptions, CreateSession, Event, GetOptions, ListSessions, SessionMetadata, SessionStore, StoreConfig,
    StoreError, UserId,
};
use adk_postgres_storage::TenantScope;
use adk_postgres_storage::tenancy::AppBinding;
use adk_postgres_testing::test_database;
use adk_postgres_tests::pg::{
    client, client_with_notices, drain, new_session, scoped_store, service_role, store, two_tenants, with_delta,
};
use serde_json::{Value, json};
use tokio_postgres::Client;

/// Sessions of the one big user, and of the many small ones.
const BIG_USER_SESSIONS: i32 = 100_000;
const SMALL_USERS: i32 = 1_000;
const SESSIONS_PER_SMALL_USER: i32 = 100;
/// Every session carries `project: p<i % PROJECTS>`: a filter on one
/// project matches one session in a thousand.
const PROJECTS: i32 = 1_000;

/// Seeds app "app": user "big" with 100k sessions and 1000 users "u<n>"
/// with 100 each, labelled with a project and a team, one in five
/// unlabelled; then ANALYZE, as autovacuum would.
async fn seed(sql: &Client) {
    sql.execute(
        "INSERT INTO adk_sessions (app_name, user_id, session_id, state, created_at, updated_at, labels)
         SELECT 'app', CASE WHEN i <= $1::int THEN 'big' ELSE 'u' || (i % $2::int) END, 's' || i,
                '{\"channel\": \"web\"}', now() - i * interval '1 second', now() - i * interval '1 second',
                CASE WHEN i % 5 = 0 THEN '{}'::jsonb
                     ELSE jsonb_build_object('project', 'p' || (i % $3::int), 'team', 't' || (i % 10)) END
         FROM generate_series(1, $1::int + $2::int * $4::int) i",
        &[&BIG_USER_SESSIONS, &SMALL_USERS, &PROJECTS, &SESSIONS_PER_SMALL_USER],
    )
    .await
    .expect("seed sessions");
    sql.batch_execute("ANALYZE adk_sessions").await.expect("analyze");
}

/// Every node of a JSON plan, depth first.
fn nodes(plan: &Value) -> Vec<&Value> {
    let mut found = vec![plan];
    for child in plan.get("Plans").and_then(Value::as_array).into_iter().flatten() {
        found.extend(nodes(child));
    }
    found
}

/// The JSON plan auto_explain logged for the statement on adk_sessions that
/// `adk_read_sessions` ran, when the function is called with `labels`.
async fn list_plan(sql: &Client, notices: &adk_postgres_tests::pg::Notices, user: &str, labels: &Value) -> Value {
    drain(notices);
    let rows = sql
        .query(
            "SELECT s.session_id, s.labels
               FROM adk_read_sessions(NULL, 'app', $1, NULL, NULL, 51, $2, NULL, NULL) p,
                    ROWS FROM (pg_catalog.unnest(p.session_ids), pg_catalog.unnest(p.label_sets)) AS s(session_id, labels)",
            &[&user, labels],
        )
        .await
        .expect("list through the function");
    for row in &rows {
        let stored: Value = row.get(1);
        for (key, value) in labels.as_object().expect("labels") {
            assert_eq!(stored.get(key), Some(value), "a listed session lacks {key}: {stored}");
        }
    }
    let logged = drain(notices);
    let text = logged
        .iter()
        .find(|notice| notice.contains("adk_sessions s") && notice.contains("\"Plan\""))
        .unwrap_or_else(|| panic!("no plan of the list statement logged: {logged:#?}"));
    let json = &text[text.find('{').expect("a JSON plan")..];
    let explained: Value = serde_json::from_str(json).unwrap_or_else(|e| panic!("plan is not JSON ({e}): {text}"));
    explained["Plan"].clone()
}

/// A plan node's `Actual Rows`: an integer up to PostgreSQL 17, a number
/// with a fraction (`200.0`, the average per loop) from 18 on.
fn actual_rows(node: &Value) -> f64 {
    node["Actual Rows"].as_f64().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_label_filter_on_100k_sessions_of_one_user_reads_the_label_index() {
    let db = test_database().await;
    let owner = client(db.url()).await;
    seed(&owner).await;

    // auto_explain shows the plan of the statement inside the function as
    // it ran (EXPLAIN ANALYZE, FORMAT JSON), planned with the call's values.
    let (sql, notices) = client_with_notices(db.url()).await;
    sql.batch_execute(
        "LOAD 'auto_explain'; SET auto_explain.log_min_duration = 0; SET auto_explain.log_analyze = on;
         SET auto_explain.log_timing = off; SET auto_explain.log_format = json;
         SET auto_explain.log_nested_statements = on; SET client_min_messages = log;",
    )
    .await
    .expect("auto_explain");

    let project = json!({"project": "p42"});
    let plan = list_plan(&sql, &notices, "big", &project).await;
    let all = nodes(&plan);
    let label_scan = all
        .iter()
        .find(|node| node["Index Name"] == "adk_sessions_labels")
        .unwrap_or_else(|| panic!("the label filter does not read adk_sessions_labels:\n{plan:#}"));
    // The big user's sessions with p42: i = 42, 1042, …, 99042, unlabelled
    // when i is a multiple of 5 (never: they end in 2). The index hands the
    // heap those 100 and the 100 of user u42 with p42, not the 100k.
    assert_eq!(actual_rows(label_scan), 200.0, "{plan:#}");
    let heap_rows: f64 =
        all.iter().filter(|node| node["Relation Name"] == "adk_sessions").map(|node| actual_rows(node)).sum();
    assert_eq!(heap_rows, 100.0, "only the big user's matches reach the sort:\n{plan:#}");

    // The control: without a filter the same function does not read the
    // label index (it reads the user's 100k rows and sorts them), so the
    // plan check above tells the two apart.
    let unfiltered = list_plan(&sql, &notices, "big", &json!({})).await;
    assert!(
        !nodes(&unfiltered).iter().any(|node| node["Index Name"] == "adk_sessions_labels"),
        "an unfiltered list reads the label index:\n{unfiltered:#}"
    );
    // A small user's filtered page never scans the whole table.
    let small = list_plan(&sql, &notices, "u7", &json!({"team": "t7"})).await;
    assert!(
        !nodes(&small).iter().any(|node| node["Node Type"] == "Seq Scan"),
        "a small user's filtered list scans the table:\n{small:#}"
    );

    // The store pages the 100 matches to the end: 50, then 50, no more.
    let store = store(db.url()).await;
    let mut request = ListSessions::new(AppName::new("app").expect("app"), UserId::new("big").expect("user"));
    request.labels = BTreeMap::from([("project".to_owned(), "p42".to_owned())]);
    let mut seen = Vec::new();
    loop {
        let page = store.list(&request).await.expect("list with a label filter");
        seen.extend(page.sessions.into_iter().map(|s| s.key.session_id.to_string()));
        match page.next_page_token {
            Some(token) => request.page_token = Some(token),
            None => break,
        }
    }
    let distinct: std::collections::BTreeSet<&String> = seen.iter().collect();
    assert_eq!((seen.len(), distinct.len()), (100, 100), "every match once");
}

/// n_tup_upd and n_tup_hot_upd of adk_sessions, once every other backend of
/// this database has gone (a backend reports its counters when it exits).
async fn session_updates(sql: &Client, at_least: i64) -> (i64, i64) {
    let mut last = (0, 0);
    for _ in 0..100 {
        let others: i64 = sql
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()",
                &[],
            )
            .await
            .expect("backends")
            .get(0);
        let row = sql
            .query_one("SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'adk_sessions'", &[])
            .await
            .expect("stats");
        last = (row.get(0), row.get(1));
        if others == 0 && last.0 >= at_least {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    last
}

/// Appends to sessions that carry a display name and labels are HOT: they
/// write no column of any index, the label index included. Renames (the
/// display name is in no index) are HOT too; a relabel is not, which the
/// control shows, so the counters could tell.
///
/// Two sessions, not twenty: a transaction that holds an xid anywhere on the
/// cluster (the tests share one) is in every snapshot's xmin, so it holds
/// back pruning in every database while it runs. Without pruning a page
/// takes some forty versions before an update has to leave it, so the ratio
/// of two sessions sharing a page stays above 0.95 whatever runs beside the
/// test (twenty sharing a page fell to 0.53), while an index on a column an
/// append writes would bring it to 0.
#[tokio::test(flavor = "multi_thread")]
async fn appends_to_labelled_sessions_stay_hot() {
    const APPENDS: usize = 2_000;
    const RELABELS: i64 = 50;
    let db = test_database().await;
    let sql = client(db.url()).await;
    // Counts the calls of the metadata check in every backend of the store.
    let name: String = sql.query_one("SELECT current_database()::text", &[]).await.expect("name").get(0);
    sql.batch_execute(&format!("ALTER DATABASE \"{name}\" SET track_functions = 'pl'")).await.expect("track");
    let mut keys = Vec::new();
    let mut renames = 0;
    {
        let store = store(db.url()).await;
        for i in 0..2 {
            let metadata = SessionMetadata::new()
                .with_display_name(format!("conversation {i}"))
                .with_label("team", "travel")
                .with_label("project", format!("p{i}"));
            let request = CreateSession::new(AppName::new("app").expect("app"), UserId::new("user").expect("user"))
                .with_metadata(metadata);
            keys.push(store.create(request).await.expect("create with metadata").key);
        }
        for i in 0..APPENDS {
            let key = &keys[i % keys.len()];
            let event = if i % 10 == 0 { with_delta(json!({"turn": i})) } else { Event::new("agent") };
            store.append(key, event, AppendOptions::default()).await.expect("append");
            if i % 200 == 0 {
                let mut metadata = store.get(key, GetOptions::default()).await.expect("get").metadata;
                metadata.display_name = Some(format!("renamed at {i}"));
                store.set_metadata(key, metadata).await.expect("rename");
                renames += 1;
            }
        }
    }
    let (updates, hot) = session_updates(&sql, (APPENDS + renames) as i64).await;
    assert!(updates >= (APPENDS + renames) as i64, "only {updates} updates reported");
    let ratio = hot as f64 / updates as f64;
    eprintln!("HOT ratio {ratio:.4} ({hot} of {updates} appends and renames of labelled sessions)");
    assert!(ratio >= 0.9, "HOT ratio {ratio:.3} ({hot} of {updates})");
    // The checks ran for the two creates and the renames, never for an append.
    let checks: i64 = sql
        .query_one(
            "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_user_functions
              WHERE funcname = 'adk_session_metadata_check'",
            &[],
        )
        .await
        .expect("function stats")
        .get(0);
    assert_eq!(checks, 2 + renames as i64, "the metadata check ran {checks} times");

    // The control: a relabel writes the label index, so it is never HOT.
    {
        let store = store(db.url()).await;
        for n in 0..RELABELS {
            let metadata = SessionMetadata::new().with_label("team", "travel").with_label("n", format!("{n}"));
            store.set_metadata(&keys[0], metadata).await.expect("relabel");
        }
    }
    let (after, hot_after) = session_updates(&sql, updates + RELABELS).await;
    assert_eq!(after - updates, RELABELS, "one update per relabel");
    assert!(
        (after - hot_after) - (updates - hot) >= RELABELS,
        "relabels counted as HOT: {} non-HOT of {RELABELS}",
        (after - hot_after) - (updates - hot)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_role_bound_to_another_app_sets_no_metadata() {
    let db = test_database().await;
    let (alpha, beta) = two_tenants(db.url()).await;
    let owner = client(db.url()).await;
    let title = SessionMetadata::new().with_display_name("taken over").with_label("owner", "beta");
    let (_, beta_url) = service_role(db.url(), "adk_meta", AppBinding::Apps(vec!["beta".into()])).await;

    for scope in [TenantScope::PerRequest, TenantScope::Fixed(AppName::new("beta").expect("app"))] {
        let beta_store = scoped_store(&beta_url, StoreConfig::default(), scope.clone()).await;
        let refused = beta_store.set_metadata(&alpha, title.clone()).await;
        assert!(matches!(refused, Err(StoreError::PermissionDenied { .. })), "{scope:?}: {refused:?}");
        let mut request = ListSessions::new(alpha.app_name.clone(), alpha.user_id.clone());
        request.labels = title.labels.clone();
        let listed = beta_store.list(&request).await.expect("list another app");
        assert!(listed.sessions.is_empty(), "{scope:?}: {listed:?}");
        // Its own app's session it may rename.
        beta_store.set_metadata(&beta, title.clone()).await.expect("set metadata of its own app");
    }
    let rows = owner
        .query("SELECT app_name, display_name, labels FROM adk_sessions ORDER BY app_name", &[])
        .await
        .expect("sessions");
    let seen: Vec<(String, Option<String>, Value)> = rows.iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect();
    assert_eq!(
        seen,
        [
            ("alpha".to_owned(), None, json!({})),
            ("beta".to_owned(), Some("taken over".to_owned()), json!({"owner": "beta"}))
        ],
        "nothing written to alpha"
    );
}

/// Label maps and display names at and past every bound. The store's own
/// checks (`SessionMetadata::validate`) and the table's must agree on each:
/// what one refuses the other refuses.
fn edge_cases() -> Vec<(String, SessionMetadata)> {
    let mut cases = Vec::new();
    let mut labels = |what: &str, pairs: Vec<(String, String)>| {
        cases.push((what.to_owned(), SessionMetadata { display_name: None, labels: pairs.into_iter().collect() }));
    };
    let one = |k: &str, v: &str| vec![(k.to_owned(), v.to_owned())];
    labels("32 labels", (0..32).map(|i| (format!("k{i}"), "v".to_owned())).collect());
    labels("33 labels", (0..33).map(|i| (format!("k{i}"), "v".to_owned())).collect());
    labels("a 63-byte key", one(&"k".repeat(63), "v"));
    labels("a 64-byte key", one(&"k".repeat(64), "v"));
    labels("a key of every allowed kind", one("a0_b-c.d/e", "v"));
    labels("a key starting with a digit", one("9lives", "v"));
    for bad in ["Team", "", "-x", "_x", ".x", "/x", "a b", "é", "a:b", "a\u{0}b"] {
        labels(&format!("key {bad:?}"), one(bad, "v"));
    }
    labels("a 256-character value", one("k", &"é".repeat(256)));
    labels("a 257-character value", one("k", &"é".repeat(257)));
    labels("an empty value", one("k", ""));
    labels("a value with spaces only", one("k", "   "));
    for control in ['\u{1}', '\t', '\n', '\u{1f}', '\u{7f}', '\u{85}', '\u{9f}'] {
        labels(&format!("a value with {control:?}"), one("k", &format!("a{control}b")));
    }
    for fine in ['\u{a0}', '\u{ad}', '\u{200b}', '\u{2028}', '✈'] {
        labels(&format!("a value with {fine:?}"), one("k", &format!("a{fine}b")));
    }
    let mut name = |what: &str, display_name: String| {
        cases.push((what.to_owned(), SessionMetadata::new().with_display_name(display_name)));
    };
    name("a 256-character name", "✈".repeat(256));
    name("a 257-character name", "✈".repeat(257));
    name("an empty name", String::new());
    for blank in [" ", "\u{a0}", "\u{3000}", "\u{2028} \u{2029}", "\u{1680}\u{2000}\u{200a}\u{202f}\u{205f}"] {
        name(&format!("the blank name {blank:?}"), blank.to_owned());
    }
    name("a name with a zero-width space only", "\u{200b}".to_owned());
    for control in ['\u{1}', '\n', '\u{7f}', '\u{85}'] {
        name(&format!("a name with {control:?}"), format!("a{control}b"));
    }
    name("a name with spaces around", "  Trip  ".to_owned());
    cases
}

#[tokio::test(flavor = "multi_thread")]
async fn the_table_checks_agree_with_the_store_bounds() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    let insert = "INSERT INTO adk_sessions (app_name, user_id, session_id, display_name, labels)
                  VALUES ('app', 'user', $1, $2, $3::text::jsonb)";
    let mut disagreements = Vec::new();
    for (i, (what, metadata)) in edge_cases().into_iter().enumerate() {
        // NUL cannot be sent as text at all; the store refuses it first.
        if metadata.labels.keys().any(|k| k.contains('\u{0}')) {
            assert!(metadata.validate().is_err(), "{what}");
            continue;
        }
        let labels = serde_json::to_string(&metadata.labels).expect("labels as JSON");
        let stored = sql.execute(insert, &[&format!("s{i}"), &metadata.display_name, &labels]).await;
        let constraint = stored.as_ref().err().map(|e| {
            e.as_db_error().and_then(|db| db.constraint()).map(str::to_owned).unwrap_or_else(|| format!("{e:?}"))
        });
        let valid = metadata.validate();
        if valid.is_ok() != stored.is_ok() {
            disagreements.push(format!("{what}: the store says {valid:?}, the table {constraint:?}"));
        }
        if let (Err(StoreError::InvalidInput { field, .. }), Some(constraint)) = (&valid, &constraint) {
            let column = if field.starts_with("metadata.display_name") { "display_name" } else { "labels" };
            assert!(constraint.starts_with(&format!("adk_sessions_{column}")), "{what}: {field} vs {constraint}");
        }
    }
    assert!(disagreements.is_empty(), "{}", disagreements.join("\n"));

    // What Rust cannot even express: labels that are not a flat map of strings.
    for (what, labels, constraint) in [
        ("an array", "[\"a\"]", "adk_sessions_labels_is_object"),
        ("a string", "\"a\"", "adk_sessions_labels_is_object"),
        ("a number value", "{\"k\": 1}", "adk_sessions_labels_sane"),
        ("a null value", "{\"k\": null}", "adk_sessions_labels_sane"),
        ("a nested object", "{\"k\": {\"a\": \"b\"}}", "adk_sessions_labels_sane"),
    ] {
        let error = sql.execute(insert, &[&format!("x-{what}"), &None::<String>, &labels]).await.expect_err(what);
        assert_eq!(error.as_db_error().and_then(|db| db.constraint()), Some(constraint), "{what}: {error:?}");
    }
    // An UPDATE is held to the same checks as an INSERT.
    sql.execute(insert, &[&"upd", &Some("fine"), &"{\"team\": \"a\"}"]).await.expect("a good row");
    let relabel = sql
        .execute("UPDATE adk_sessions SET labels = '{\"Team\": \"a\"}' WHERE session_id = 'upd'", &[])
        .await
        .expect_err("a bad key by UPDATE");
    assert_eq!(relabel.as_db_error().and_then(|db| db.constraint()), Some("adk_sessions_labels_sane"));
    let rename = sql
        .execute("UPDATE adk_sessions SET display_name = E'\\u3000' WHERE session_id = 'upd'", &[])
        .await
        .expect_err("a blank name by UPDATE");
    assert_eq!(rename.as_db_error().and_then(|db| db.constraint()), Some("adk_sessions_display_name_sane"));
}

#[tokio::test(flavor = "multi_thread")]
async fn renames_racing_appends_lose_neither() {
    let db = test_database().await;
    let store = Arc::new(store(db.url()).await);
    let key = new_session(&*store, "app", "user").await;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..200 {
        let (store, key) = (Arc::clone(&store), key.clone());
        tasks.spawn(async move {
            if i % 4 == 0 {
                let metadata = SessionMetadata::new().with_display_name("title").with_label("n", format!("{i}"));
                store.set_metadata(&key, metadata).await.map(|_| ())
            } else {
                store
                    .append(&key, with_delta(json!({ format!("k{i}"): i })), AppendOptions::default())
                    .await
                    .map(|_| ())
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("task").expect("append or set_metadata");
    }
    let session = store.get(&key, GetOptions::default()).await.expect("get");
    assert_eq!(session.version, 150, "every append counted");
    assert_eq!(session.state.len(), 150, "every append's state kept");
    assert_eq!(session.metadata.display_name.as_deref(), Some("title"), "a rename kept");
    assert_eq!(session.metadata.labels.len(), 1);
}
