//! The `adk-pg` binary end to end: exit codes and what an operator reads.

use std::process::Output;

use adk_postgres_testing::{WireProxy, connect, test_database};
use chrono::{Days, Utc};

fn adk_pg(url: &str, args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_adk-pg"))
        .args(args)
        .env("DATABASE_URL", url)
        .output()
        .expect("run adk-pg")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn status_is_zero_when_healthy_and_two_when_partitions_run_short() {
    let db = test_database().await;
    let migrate = adk_pg(db.url(), &["migrate"]);
    assert!(migrate.status.success(), "{migrate:?}");
    assert!(stdout(&migrate).contains("up to date"), "{}", stdout(&migrate));

    let maintain = adk_pg(db.url(), &["maintain", "--once"]);
    assert!(maintain.status.success(), "{maintain:?}");
    assert!(stdout(&maintain).contains("day(s) ahead"), "{}", stdout(&maintain));

    let status = adk_pg(db.url(), &["status"]);
    assert_eq!(status.status.code(), Some(0), "{}", stdout(&status));
    let text = stdout(&status);
    let ahead = text.lines().find(|line| line.contains("partitions ahead")).unwrap_or_default();
    assert!(ahead.split_whitespace().any(|cell| cell == "7"), "{text}");

    let policy = text.lines().find(|line| line.contains("policy")).unwrap_or_default();
    assert!(policy.contains("lifetime 7days") && policy.contains("retention 30days"), "{text}");
    assert!(text.lines().any(|line| line.contains("kept past retention") && line.contains("none")), "{text}");

    let json = adk_pg(db.url(), &["status", "--json"]);
    let report: serde_json::Value = serde_json::from_slice(&json.stdout).expect("status --json is JSON");
    assert_eq!(report["partitions_ahead"], 7);
    assert_eq!(report["policy"]["retention_secs"], 30 * 86_400);
    assert_eq!(report["overdue_partitions"], serde_json::json!([]));

    let sql = connect(db.url()).await.expect("connect");
    let today = Utc::now().date_naive();
    for ahead in 3..=7 {
        let day = today.checked_add_days(Days::new(ahead)).expect("day");
        sql.batch_execute(&format!("DROP TABLE adk_events_p{}", day.format("%Y%m%d"))).await.expect("drop");
    }
    let short = adk_pg(db.url(), &["status"]);
    assert_eq!(short.status.code(), Some(2), "{}", stdout(&short));
    assert!(stdout(&short).contains("ALERT: only 2 future day(s)"), "{}", stdout(&short));

    let repaired = adk_pg(db.url(), &["maintain"]);
    assert!(repaired.status.success());
    assert_eq!(adk_pg(db.url(), &["status"]).status.code(), Some(0));
}

#[tokio::test(flavor = "multi_thread")]
async fn expire_reports_what_it_deleted() {
    let db = test_database().await;
    let sql = connect(db.url()).await.expect("connect");
    sql.batch_execute(
        "INSERT INTO adk_sessions (app_name, user_id, session_id, expires_at)
         SELECT 'app', 'user', 's' || n, now() - interval '1 hour' FROM generate_series(1, 7) n",
    )
    .await
    .expect("expired sessions");
    let expire = adk_pg(db.url(), &["expire", "--batch-size", "3"]);
    assert!(expire.status.success(), "{expire:?}");
    assert!(stdout(&expire).contains("expired 7 session(s)"), "{}", stdout(&expire));
}

#[tokio::test(flavor = "multi_thread")]
async fn erase_user_counts_erases_in_batches_and_refuses_bad_input() {
    let db = test_database().await;
    let sql = connect(db.url()).await.expect("connect");
    sql.batch_execute(
        "INSERT INTO adk_sessions (app_name, user_id, session_id, last_seq) VALUES ('app', 'gone', 'a', 5),
                ('app', 'gone', 'b', 0), ('app', 'stays', 'a', 5);
         INSERT INTO adk_events (app_name, user_id, session_id, session_day, seq, event_id, author, event_ts, payload)
         SELECT 'app', u, 'a', (now() AT TIME ZONE 'UTC')::date, n, 'e' || n, 'agent', n, '{}'
           FROM generate_series(1, 5) n, unnest(ARRAY['gone', 'stays']) u;
         INSERT INTO adk_user_states (app_name, user_id, state) VALUES ('app', 'gone', '{\"k\": 1}');",
    )
    .await
    .expect("a user to erase and one to keep");
    let rows = async |user: &str| -> i64 {
        sql.query_one(
            "SELECT (SELECT count(*) FROM adk_sessions WHERE user_id = $1)
                  + (SELECT count(*) FROM adk_events WHERE user_id = $1)
                  + (SELECT count(*) FROM adk_user_states WHERE user_id = $1)",
            &[&user],
        )
        .await
        .expect("count")
        .get(0)
    };

    let dry = adk_pg(db.url(), &["erase-user", "--app", "app", "--user", "gone", "--dry-run", "--json"]);
    assert!(dry.status.success(), "{dry:?}");
    let preview: serde_json::Value = serde_json::from_slice(&dry.stdout).expect("--json is JSON");
    assert_eq!((preview["sessions"].as_u64(), preview["events"].as_u64()), (Some(2), Some(5)), "{preview}");
    assert_eq!((preview["dry_run"].as_bool(), preview["user_state"].as_bool()), (Some(true), Some(true)));
    assert_eq!(rows("gone").await, 2 + 5 + 1, "a dry run writes nothing");

    let erase = adk_pg(db.url(), &["erase-user", "--app", "app", "--user", "gone", "--batch-size", "2"]);
    assert!(erase.status.success(), "{erase:?}");
    let (out, err) = (stdout(&erase), stderr(&erase));
    assert!(out.contains("erased user") && out.contains("2 session(s), 5 event(s), the user state"), "{out}");
    assert!(err.starts_with("erasing user ") && err.contains("batch 1: hid 2 session(s)"), "{err}");
    assert!(!out.contains("gone") && !err.contains("gone"), "the user id is never printed: {out}{err}");
    assert_eq!((rows("gone").await, rows("stays").await), (0, 6));
    let audit: (String, i64, String) = sql
        .query_one("SELECT status, events, started_by::text FROM adk_user_erasures", &[])
        .await
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .expect("the audit record");
    assert_eq!(audit, ("done".to_owned(), 5, "postgres".to_owned()));

    for (args, field) in [
        (["erase-user", "--app", "app", "--user", ""].as_slice(), "user_id"),
        (["erase-user", "--app", "app ", "--user", "stays"].as_slice(), "app_name"),
        (["erase-user", "--app", "app", "--user", "stays", "--batch-size", "0"].as_slice(), "batch_size"),
    ] {
        let refused = adk_pg(db.url(), args);
        assert_eq!(refused.status.code(), Some(1), "{args:?}");
        assert!(stderr(&refused).contains(&format!("invalid {field}")), "{args:?}: {}", stderr(&refused));
    }
    assert_eq!(rows("stays").await, 6, "nothing written on bad input");
}

#[test]
fn an_unreachable_database_is_a_clear_failure() {
    let output = adk_pg("postgres://nobody@127.0.0.1:1/none", &["status"]);
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.starts_with("error: "), "{stderr}");
}

#[test]
fn a_missing_database_url_is_named() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_adk-pg"))
        .arg("status")
        .env_remove("DATABASE_URL")
        .output()
        .expect("run adk-pg");
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("DATABASE_URL"));
}

#[tokio::test(flavor = "multi_thread")]
async fn convert_events_dry_run_prints_sql_then_converts() {
    let db = adk_postgres_testing::empty_database().await;
    let sql = connect(db.url()).await.expect("connect");
    sql.batch_execute(include_str!("../../../tests/fixtures/legacy_layout.sql")).await.expect("legacy layout");
    sql.batch_execute(
        "INSERT INTO adk_sessions (app_name, user_id, session_id) VALUES ('app', 'user', 's');
         INSERT INTO adk_events (app_name, user_id, session_id, seq, event_id, author, event_ts, payload)
         SELECT 'app', 'user', 's', n, 'e' || n, 'agent', n, '{}' FROM generate_series(1, 50) n;",
    )
    .await
    .expect("legacy rows");

    let plan = adk_pg(db.url(), &["convert-events", "--dry-run"]);
    assert!(plan.status.success(), "{plan:?}");
    let text = stdout(&plan);
    assert!(text.contains("CONCURRENTLY") && text.contains("NOT VALID"), "{text}");
    let still_plain: String = sql
        .query_one("SELECT relkind::text FROM pg_class WHERE relname = 'adk_events'", &[])
        .await
        .expect("relkind")
        .get(0);
    assert_eq!(still_plain, "r", "a dry run changed the table");

    let convert = adk_pg(db.url(), &["convert-events"]);
    assert!(convert.status.success(), "{convert:?}");
    let partitioned: String = sql
        .query_one("SELECT relkind::text FROM pg_class WHERE relname = 'adk_events'", &[])
        .await
        .expect("relkind")
        .get(0);
    assert_eq!(partitioned, "p");
    let again = adk_pg(db.url(), &["convert-events"]);
    assert!(stdout(&again).contains("already partitioned"), "{}", stdout(&again));

    let index = adk_pg(db.url(), &["create-index", "adk_events_author", "--columns", "app_name,author"]);
    assert!(index.status.success(), "{index:?}");
    let valid: bool = sql
        .query_one("SELECT indisvalid FROM pg_index WHERE indexrelid = 'adk_events_author'::regclass", &[])
        .await
        .expect("index")
        .get(0);
    assert!(valid);
}

#[tokio::test(flavor = "multi_thread")]
async fn service_role_grants_a_non_owner_and_refuses_a_superuser() {
    let db = test_database().await;
    let role = format!("adk_cli_{}", std::process::id());
    let created = adk_pg(db.url(), &["service-role", &role, "--create", "--app", "alpha", "--app", "beta"]);
    assert!(created.status.success(), "{created:?}");
    let text = stdout(&created);
    assert!(text.contains("holds no table privilege") && text.contains("acts for: alpha, beta"), "{text}");

    let narrowed = adk_pg(db.url(), &["service-role", &role, "--app", "beta"]);
    assert!(stdout(&narrowed).contains("unbound from alpha"), "{}", stdout(&narrowed));
    let router = adk_pg(db.url(), &["service-role", &role, "--all-apps"]);
    assert!(stdout(&router).contains("acts for: every app"), "{}", stdout(&router));

    let shown = adk_pg(db.url(), &["service-role", &role, "--show", "--json"]);
    assert!(shown.status.success(), "{shown:?}");
    let view: serde_json::Value = serde_json::from_str(&stdout(&shown)).expect("json");
    assert_eq!(view["bindings"]["all_apps"], serde_json::json!(true), "{view}");
    assert_eq!(view["table_privileges"], serde_json::json!([]), "{view}");
    let changes: Vec<(String, Option<String>)> = view["changes"]
        .as_array()
        .expect("changes")
        .iter()
        .map(|c| (c["change"].as_str().unwrap_or_default().to_owned(), c["app_name"].as_str().map(str::to_owned)))
        .collect();
    for expected in [
        ("bound".to_owned(), Some("alpha".to_owned())),
        ("bound".to_owned(), Some("beta".to_owned())),
        ("unbound".to_owned(), Some("alpha".to_owned())),
        ("unbound".to_owned(), Some("beta".to_owned())),
        ("bound".to_owned(), None),
    ] {
        assert!(changes.contains(&expected), "{expected:?} missing from {changes:?}");
    }
    let table = adk_pg(db.url(), &["service-role", &role, "--show"]);
    assert!(stdout(&table).contains("table privileges: none"), "{}", stdout(&table));

    let bad_app = adk_pg(db.url(), &["service-role", &role, "--app", "alpha "]);
    assert_eq!(bad_app.status.code(), Some(1), "{bad_app:?}");
    assert!(stderr(&bad_app).contains("leading or trailing whitespace"), "{}", stderr(&bad_app));

    let refused = adk_pg(db.url(), &["service-role", "postgres"]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("exempt from row-level security"));
}

/// The password reaches the server only as a SCRAM verifier, never in a
/// statement (nor, so, in a server log), and a quote or backslash in it
/// cannot end the literal even with `standard_conforming_strings = off`.
#[tokio::test(flavor = "multi_thread")]
async fn service_role_passwords_travel_only_as_a_scram_verifier() {
    let db = test_database().await;
    let sql = connect(db.url()).await.expect("connect");
    sql.batch_execute(&format!("ALTER DATABASE \"{}\" SET standard_conforming_strings = off", db.name()))
        .await
        .expect("old-style strings for every new session");
    // The statements are read off the wire, which they cannot be once the
    // session is in TLS (the harness's servers offer it, and `prefer` takes
    // it): the proxy refuses TLS itself.
    let proxy = WireProxy::in_front_of(db.url())
        .expect("the server")
        .refuse_encryption()
        .record_client_bytes()
        .start()
        .expect("the proxy");
    let url = proxy.url(db.url()).expect("the URL through the proxy");

    let role = format!("adk_cli_pw_{}", std::process::id());
    let password = "it's a \\'; CREATE TABLE adk_injected (); --";
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_adk-pg"))
        .args(["service-role", &role, "--create", "--app", "alpha", "--password-env", "ADK_TEST_SERVICE_PASSWORD"])
        .env("DATABASE_URL", &url)
        .env("ADK_TEST_SERVICE_PASSWORD", password)
        .output()
        .expect("run adk-pg");
    assert!(output.status.success(), "{output:?}");
    assert!(stdout(&output).contains("only the SCRAM-SHA-256 verifier was sent"), "{}", stdout(&output));

    let wire = String::from_utf8_lossy(&proxy.take_client_bytes()).into_owned();
    assert!(wire.contains("ALTER ROLE") && wire.contains("PASSWORD 'SCRAM-SHA-256$4096:"), "no verifier sent");
    assert!(!wire.contains("adk_injected"), "the password itself went over the wire");
    let injected: bool =
        sql.query_one("SELECT to_regclass('adk_injected') IS NOT NULL", &[]).await.expect("look").get(0);
    assert!(!injected, "the password ran as SQL");
    let stored: String = sql
        .query_one("SELECT rolpassword FROM pg_authid WHERE rolname = $1", &[&role])
        .await
        .expect("stored verifier")
        .get(0);
    assert!(stored.starts_with("SCRAM-SHA-256$4096:"), "{stored}");
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

async fn policy_changes(sql: &tokio_postgres::Client) -> i64 {
    sql.query_one("SELECT count(*) FROM adk_store_policy_changes", &[]).await.expect("count").get(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn policy_show_set_and_history() {
    let db = test_database().await;
    let sql = connect(db.url()).await.expect("connect");

    let show = adk_pg(db.url(), &["policy", "show"]);
    assert!(show.status.success(), "{show:?}");
    let text = stdout(&show);
    assert!(text.contains("max session lifetime") && text.contains("7days"), "{text}");
    assert!(text.lines().any(|line| line.contains("default TTL") && line.contains("none")), "{text}");

    let set = adk_pg(db.url(), &["policy", "set", "--retention", "10d", "--default-ttl", "1h"]);
    assert!(set.status.success(), "{set:?}");
    assert!(stdout(&set).contains("policy updated"), "{}", stdout(&set));
    let json = adk_pg(db.url(), &["policy", "show", "--json"]);
    let policy: serde_json::Value = serde_json::from_slice(&json.stdout).expect("policy show --json is JSON");
    assert_eq!(policy["retention_secs"], 10.0 * 86_400.0);
    assert_eq!(policy["max_session_lifetime_secs"], 7.0 * 86_400.0, "unspecified fields keep their value");
    assert_eq!(policy["default_ttl_secs"], 3600.0);
    assert_eq!(policy["premake_days"], 7);

    // Invalid: a clear error naming the field, a failure exit, nothing written.
    let written = policy_changes(&sql).await;
    for (args, field) in [
        (vec!["--retention", "1d"], "retention"),
        (vec!["--max-session-lifetime", "30d"], "retention"),
        (vec!["--premake-days", "0"], "premake_days"),
        (vec!["--default-ttl", "0s"], "default_ttl"),
    ] {
        let refused = adk_pg(db.url(), &[&["policy", "set"][..], &args].concat());
        assert_eq!(refused.status.code(), Some(1), "{refused:?}");
        assert!(stderr(&refused).contains(&format!("invalid {field}")), "{args:?}: {}", stderr(&refused));
    }
    let unparsable = adk_pg(db.url(), &["policy", "set", "--retention", "a while"]);
    assert!(!unparsable.status.success());
    let nothing = adk_pg(db.url(), &["policy", "set"]);
    assert_eq!(nothing.status.code(), Some(1));
    assert!(stderr(&nothing).contains("nothing to change"), "{}", stderr(&nothing));
    assert_eq!(policy_changes(&sql).await, written, "a refused change wrote nothing");

    let cleared = adk_pg(db.url(), &["policy", "set", "--default-ttl", "none", "--premake-days", "5"]);
    assert!(cleared.status.success(), "{cleared:?}");
    let role: String = sql.query_one("SELECT current_user::text", &[]).await.expect("role").get(0);
    let history = adk_pg(db.url(), &["policy", "history"]);
    assert!(history.status.success(), "{history:?}");
    let text = stdout(&history);
    assert!(text.contains("retention: 30days -> 10days"), "{text}");
    assert!(text.contains("default_ttl: null -> 1h") || text.contains("default_ttl: none -> 1h"), "{text}");
    assert!(text.contains("premake_days: 7 -> 5"), "{text}");
    assert!(text.contains(&role), "{text}");
    let history = adk_pg(db.url(), &["policy", "history", "--json", "--limit", "1"]);
    let changes: serde_json::Value = serde_json::from_slice(&history.stdout).expect("history --json is JSON");
    assert_eq!(changes.as_array().map(Vec::len), Some(1));
    assert_eq!(changes[0]["after"]["premake_days"], 5);
    assert_eq!(changes[0]["changed_by"], role.as_str());

    // Maintenance reads the policy from the database; its old flags are gone.
    let old_flag = adk_pg(db.url(), &["maintain", "--retention-days", "30"]);
    assert_eq!(old_flag.status.code(), Some(2), "{old_flag:?}");
    let maintain = adk_pg(db.url(), &["maintain"]);
    assert!(maintain.status.success(), "{maintain:?}");
    assert!(stdout(&maintain).contains("retention 10days"), "{}", stdout(&maintain));
}

/// Stores a session of `app` with `events` model responses behind the
/// store's back, timed and arriving now; today's partition must exist.
async fn store_events(sql: &tokio_postgres::Client, app: &str, session: &str, events: i64) {
    sql.execute(
        "INSERT INTO adk_sessions (app_name, user_id, session_id, last_seq) VALUES ($1, 'user', $2, $3)",
        &[&app, &session, &events],
    )
    .await
    .expect("session");
    sql.execute(
        "INSERT INTO adk_events (app_name, user_id, session_id, session_day, seq, event_id, author, event_ts, payload)
         SELECT $1, 'user', $2, (now() AT TIME ZONE 'UTC')::date, n, 'e' || n, 'agent',
                (extract(epoch FROM now()) * 1000000)::bigint * 1000,
                '{\"author\": \"agent\", \"content\": {\"parts\": [{\"text\": \"hi\"}]}}'
         FROM generate_series(1, $3::bigint) n",
        &[&app, &session, &events],
    )
    .await
    .expect("events");
}

#[tokio::test(flavor = "multi_thread")]
async fn rollup_then_usage_and_status_from_the_command_line() {
    let db = test_database().await;
    let sql = connect(db.url()).await.expect("connect");
    assert!(adk_pg(db.url(), &["maintain"]).status.success());
    store_events(&sql, "shop", "s1", 5).await;

    let once = adk_pg(db.url(), &["rollup"]);
    assert_eq!(once.status.code(), Some(0), "{once:?}");
    assert!(stdout(&once).contains("5 event(s) read, 5 rolled up, 0 rejected as late"), "{}", stdout(&once));
    let again = adk_pg(db.url(), &["rollup", "--once", "--json"]);
    assert_eq!(again.status.code(), Some(0), "{again:?}");
    let report: serde_json::Value = serde_json::from_slice(&again.stdout).expect("rollup --json is JSON");
    assert_eq!(report["events_read"], 0);
    assert!(report["window_from"].is_string(), "{report}");

    let usage = adk_pg(db.url(), &["usage", "--app", "shop"]);
    assert_eq!(usage.status.code(), Some(0), "{usage:?}");
    let text = stdout(&usage);
    assert!(text.starts_with("usage of shop from "), "{text}");
    assert!(text.lines().any(|line| line.contains("total") && line.contains(" 5 ")), "{text}");
    let by_kind = adk_pg(
        db.url(),
        &["usage", "--app", "shop", "--by", "kind", "--since", "2h", "--until", "now", "--resolution", "5m", "--json"],
    );
    assert_eq!(by_kind.status.code(), Some(0), "{by_kind:?}");
    let report: serde_json::Value = serde_json::from_slice(&by_kind.stdout).expect("usage --json is JSON");
    assert_eq!(report["plan"]["resolution"], "5m");
    // Two hours not aligned to 5 minutes touch 25 buckets, aligned 24.
    assert!(report["plan"]["points"].as_i64().is_some_and(|p| (24..=25).contains(&p)), "{report}");
    assert_eq!(report["series"][0]["group"], "model_response");
    assert_eq!(report["series"][0]["total"]["events"], 5);
    let other_app = adk_pg(db.url(), &["usage", "--app", "blog", "--since", "2026-01-01T00:00:00Z", "--until", "1h"]);
    assert_eq!(other_app.status.code(), Some(0), "{other_app:?}");
    assert!(stdout(&other_app).contains("no events in this window"), "{}", stdout(&other_app));

    // Refusals are the library's typed errors, printed as they are.
    for (args, message) in [
        (vec!["--since", "7d", "--resolution", "1m"], "error: too many points: "),
        (vec!["--since", "30d", "--resolution", "5m"], "error: no rollup level holds 5m buckets"),
        (vec!["--resolution", "1w"], "error: invalid resolution"),
        (vec!["--by", "user"], "error: invalid by"),
        (vec!["--since", "yesterday"], "error: invalid --since \"yesterday\""),
        (vec!["--since", "1h", "--until", "2h"], "error: invalid window"),
    ] {
        let refused = adk_pg(db.url(), &[&["usage", "--app", "shop"][..], &args].concat());
        assert_eq!(refused.status.code(), Some(1), "{args:?}: {refused:?}");
        assert!(stderr(&refused).starts_with(message), "{args:?}: {}", stderr(&refused));
    }

    let status = adk_pg(db.url(), &["status"]);
    assert_eq!(status.status.code(), Some(0), "{}", stdout(&status));
    let text = stdout(&status);
    assert!(text.lines().any(|line| line.contains("last rollup run") && line.contains(" ok: ")), "{text}");
    assert!(text.lines().any(|line| line.contains("rollup minute partitions ahead")), "{text}");
    let json = adk_pg(db.url(), &["status", "--json"]);
    let report: serde_json::Value = serde_json::from_slice(&json.stdout).expect("status --json is JSON");
    assert_eq!(report["rollups"]["last_run"]["outcome"], "ok");

    sql.batch_execute("UPDATE adk_usage_state SET watermark = now() - interval '2 hours'").await.expect("fall back");
    let behind = adk_pg(db.url(), &["status"]);
    assert_eq!(behind.status.code(), Some(2), "{}", stdout(&behind));
    assert!(stdout(&behind).contains("ALERT: rollups are 2h"), "{}", stdout(&behind));
    let tolerant = adk_pg(db.url(), &["status", "--max-rollup-lag", "3h"]);
    assert_eq!(tolerant.status.code(), Some(0), "{}", stdout(&tolerant));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_single_rollup_that_cannot_advance_exits_two() {
    let db = test_database().await;
    let sql = connect(db.url()).await.expect("connect");
    assert!(adk_pg(db.url(), &["maintain"]).status.success());
    let writer = connect(db.url()).await.expect("connect");
    writer.batch_execute("BEGIN").await.expect("begin");
    store_events(&writer, "shop", "open", 1).await;

    let stuck = adk_pg(db.url(), &["rollup", "--writer-wait", "200ms"]);
    assert_eq!(stuck.status.code(), Some(2), "{stuck:?}");
    assert!(stdout(&stuck).contains("did not advance"), "{}", stdout(&stuck));
    let status = adk_pg(db.url(), &["status"]);
    assert_eq!(status.status.code(), Some(2));
    assert!(stdout(&status).contains("ALERT: the last rollup run could not advance"), "{}", stdout(&status));

    writer.batch_execute("COMMIT").await.expect("commit");
    let advanced = adk_pg(db.url(), &["rollup"]);
    assert_eq!(advanced.status.code(), Some(0), "{advanced:?}");
    let count: i64 = sql.query_one("SELECT count(*) FROM adk_usage_runs", &[]).await.expect("runs").get(0);
    assert_eq!(count, 2);
    let bad_cap = adk_pg(db.url(), &["rollup", "--author-cap", "0"]);
    assert_eq!(bad_cap.status.code(), Some(1), "{bad_cap:?}");
    assert!(stderr(&bad_cap).contains("invalid author_cap"), "{}", stderr(&bad_cap));
}

#[tokio::test(flavor = "multi_thread")]
async fn rollup_every_keeps_running_until_interrupted() {
    use std::io::BufRead;
    let db = test_database().await;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_adk-pg"))
        .args(["rollup", "--every", "100ms", "--json"])
        .env("DATABASE_URL", db.url())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start adk-pg rollup --every");
    let out = child.stdout.take().expect("stdout");
    let (lines_tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut runs = Vec::new();
    while runs.len() < 3 {
        match lines.recv_timeout(std::time::Duration::from_secs(30)) {
            Ok(line) => runs.push(serde_json::from_str::<serde_json::Value>(&line).expect("one JSON report a run")),
            Err(e) => {
                let _ = child.kill();
                panic!("fewer than 3 runs: {e}");
            }
        }
    }
    // Past its first sleep, so Ctrl-C ends the loop however it lands.
    let pid = child.id().to_string();
    assert!(std::process::Command::new("kill").args(["-INT", &pid]).status().expect("kill").success());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("adk-pg rollup --every ignored Ctrl-C");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0), "{status:?}");
    assert!(runs.iter().all(|run| run["skipped"] == false), "{runs:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn policy_sets_and_shows_the_usage_tiers() {
    let db = test_database().await;
    let sql = connect(db.url()).await.expect("connect");

    let show = adk_pg(db.url(), &["policy", "show"]);
    let text = stdout(&show);
    for (setting, value) in [
        ("usage lateness", "1day"),
        ("usage minute retention", "14days"),
        ("usage hour retention", "400days"),
        ("usage day retention", "keep (for ever)"),
    ] {
        assert!(text.lines().any(|line| line.contains(setting) && line.contains(value)), "{setting}: {text}");
    }

    let set = adk_pg(
        db.url(),
        &[
            "policy",
            "set",
            "--usage-lateness",
            "12h",
            "--usage-minute-retention",
            "10d",
            "--usage-hour-retention",
            "100d",
            "--usage-day-retention",
            "800d",
        ],
    );
    assert_eq!(set.status.code(), Some(0), "{set:?}");
    assert!(stdout(&set).lines().any(|line| line.contains("usage day retention") && line.contains("800days")));
    let json = adk_pg(db.url(), &["policy", "show", "--json"]);
    let policy: serde_json::Value = serde_json::from_slice(&json.stdout).expect("policy show --json is JSON");
    assert_eq!(policy["usage_lateness_secs"], 12.0 * 3600.0);
    assert_eq!(policy["usage_minute_retention_secs"], 10.0 * 86_400.0);
    assert_eq!(policy["usage_hour_retention_secs"], 100.0 * 86_400.0);
    assert_eq!(policy["usage_day_retention"], "800days");
    assert_eq!(policy["retention_secs"], 30.0 * 86_400.0, "the store's fields keep their value");

    let kept = adk_pg(db.url(), &["policy", "set", "--usage-day-retention", "keep", "--json"]);
    assert_eq!(kept.status.code(), Some(0), "{kept:?}");
    let policy: serde_json::Value = serde_json::from_slice(&kept.stdout).expect("policy set --json is JSON");
    assert!(policy["usage_day_retention_secs"].is_null(), "{policy}");

    // Inconsistent tiers: the field named, a failure exit, nothing written.
    let written = policy_changes(&sql).await;
    for (args, field) in [
        (vec!["--usage-lateness", "8d"], "usage_lateness"),
        (vec!["--usage-minute-retention", "1d"], "usage_minute_retention"),
        (vec!["--usage-hour-retention", "5d"], "usage_hour_retention"),
        (vec!["--usage-day-retention", "50d"], "usage_day_retention"),
    ] {
        let refused = adk_pg(db.url(), &[&["policy", "set"][..], &args].concat());
        assert_eq!(refused.status.code(), Some(1), "{refused:?}");
        assert!(stderr(&refused).contains(&format!("invalid {field}")), "{args:?}: {}", stderr(&refused));
    }
    let unparsable = adk_pg(db.url(), &["policy", "set", "--usage-day-retention", "forever"]);
    assert!(!unparsable.status.success());
    assert_eq!(policy_changes(&sql).await, written, "a refused change wrote nothing");

    // Maintenance judges by the tiers and says so.
    let maintain = adk_pg(db.url(), &["maintain"]);
    assert!(maintain.status.success(), "{maintain:?}");
    assert!(stdout(&maintain).contains("rollups kept 1m 10days, 1h 100days, 1d for ever"), "{}", stdout(&maintain));
    let json = adk_pg(db.url(), &["maintain", "--json"]);
    let report: serde_json::Value = serde_json::from_slice(&json.stdout).expect("maintain --json is JSON");
    assert_eq!(report["usage_partitions_created"], 0);
    assert_eq!(report["usage_partitions_dropped"], serde_json::json!([]));
}

#[test]
fn serve_refuses_an_open_address_without_a_token() {
    for (token, expected) in [
        (None, "refusing to listen on 0.0.0.0:0 without a token: set ADK_PG_SERVE_TOKEN"),
        (Some(""), "ADK_PG_SERVE_TOKEN is set but empty"),
    ] {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_adk-pg"));
        command.args(["serve", "--listen", "0.0.0.0:0"]).env("DATABASE_URL", "postgres://nobody@127.0.0.1:1/none");
        match token {
            Some(token) => command.env("ADK_PG_SERVE_TOKEN", token),
            None => command.env_remove("ADK_PG_SERVE_TOKEN"),
        };
        let output = command.output().expect("run adk-pg serve");
        assert_eq!(output.status.code(), Some(1), "{output:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(expected), "{stderr}");
    }
}

/// A plain HTTP/1.1 GET: the status and the body.
async fn http_get(addr: &str, path: &str, token: Option<&str>) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect to adk-pg serve");
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Connection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("send the request");
    let mut response = String::new();
    stream.read_to_string(&mut response).await.expect("read the response");
    let status = response.split_whitespace().nth(1).and_then(|code| code.parse().ok()).unwrap_or_default();
    let body = response.split_once("\r\n\r\n").map(|(_, body)| body.to_owned()).unwrap_or_default();
    (status, body)
}

#[tokio::test(flavor = "multi_thread")]
async fn serve_answers_with_the_token_and_stops_on_sigterm() {
    use std::io::BufRead;
    let db = test_database().await;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_adk-pg"))
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env("DATABASE_URL", db.url())
        .env("ADK_PG_SERVE_TOKEN", "cli-test-token")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start adk-pg serve");
    let stderr = child.stderr.take().expect("its stderr");
    let first_line = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        std::io::BufReader::new(stderr).read_line(&mut line).map(|_| line)
    });
    let line = tokio::time::timeout(std::time::Duration::from_secs(30), first_line)
        .await
        .expect("adk-pg serve says where it listens")
        .expect("the reader")
        .expect("a line");
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .unwrap_or_else(|| panic!("an address in {line:?}"))
        .to_owned();

    assert_eq!(http_get(&addr, "/healthz", None).await.0, 200);
    assert_eq!(http_get(&addr, "/metrics", None).await.0, 401);
    let (status, body) = http_get(&addr, "/metrics", Some("cli-test-token")).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("adk_pg_database_up 1"), "{body}");
    let (status, body) = http_get(&addr, "/readyz", Some("cli-test-token")).await;
    assert_eq!((status, body.as_str()), (200, "ready\n"));

    let signalled =
        std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status().expect("run kill");
    assert!(signalled.success());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let exit = loop {
        if let Some(exit) = child.try_wait().expect("poll the server") {
            break exit;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("adk-pg serve did not stop within 30 s of SIGTERM");
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert!(exit.success(), "SIGTERM stops the server cleanly: {exit:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_change_feed_is_off_after_migrating_and_switches_on_and_off() {
    let db = test_database().await;
    let triggers = || async {
        let sql = connect(db.url()).await.expect("connect");
        let row = sql
            .query_one(
                "SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'adk_feed%' AND tgrelid IN \
                 ('adk_events'::regclass, 'adk_sessions'::regclass)",
                &[],
            )
            .await
            .expect("count triggers");
        row.get::<_, i64>(0)
    };
    let status = adk_pg(db.url(), &["change-feed", "status"]);
    assert!(status.status.success(), "{}", stderr(&status));
    assert_eq!(stdout(&status).trim(), "change feed: off");
    assert_eq!(triggers().await, 0, "nothing of the feed on the append path after migrating");

    let on = adk_pg(db.url(), &["change-feed", "on"]);
    assert!(on.status.success(), "{}", stderr(&on));
    assert!(stdout(&on).contains("change feed: on"), "{}", stdout(&on));
    assert!(triggers().await > 0, "turning it on creates the triggers");
    let again = adk_pg(db.url(), &["change-feed", "on"]);
    assert!(stdout(&again).contains("already on"), "{}", stdout(&again));

    let off = adk_pg(db.url(), &["change-feed", "off"]);
    assert!(off.status.success(), "{}", stderr(&off));
    assert_eq!(triggers().await, 0);
    assert_eq!(stdout(&adk_pg(db.url(), &["change-feed", "status"])).trim(), "change feed: off");
}

/// `url` with its `sslrootcert` pair replaced by `sslrootcert=<ca>`, or
/// removed when `ca` is `None`.
fn with_root_cert(url: &str, ca: Option<&std::path::Path>) -> String {
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let pairs = query.split('&').filter(|pair| !pair.is_empty() && !pair.starts_with("sslrootcert="));
    let root = ca.map(|ca| format!("sslrootcert={}", ca.display()));
    let query: Vec<String> = pairs.map(str::to_owned).chain(root).collect();
    format!("{base}?{}", query.join("&"))
}

/// `adk-pg serve` on a free port of 127.0.0.1 with `url`: the child (killed
/// if the test ends first) and the address it says it listens on. Its
/// stderr is drained from then on, so it never blocks on a full pipe.
async fn serve(url: &str, token: &str) -> (tokio::process::Child, String) {
    use tokio::io::AsyncBufReadExt;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_adk-pg"))
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env("DATABASE_URL", url)
        .env("ADK_PG_SERVE_TOKEN", token)
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start adk-pg serve");
    let mut lines = tokio::io::BufReader::new(child.stderr.take().expect("its stderr")).lines();
    let listening = async {
        let mut seen = Vec::new();
        while let Some(line) = lines.next_line().await.expect("read its stderr") {
            if let Some(addr) = line.split("http://").nth(1).and_then(|rest| rest.split('/').next()) {
                return addr.to_owned();
            }
            seen.push(line);
        }
        panic!("adk-pg serve ended without saying where it listens: {seen:?}");
    };
    let addr = tokio::time::timeout(std::time::Duration::from_secs(30), listening)
        .await
        .expect("adk-pg serve says where it listens within 30 s");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, addr)
}

/// A server that takes TLS only, so nothing below can have gone in
/// plaintext: every command an operator runs works over `verify-full`, and
/// a CA that did not sign the server's certificate is named as the reason
/// in the failure, with no password printed.
#[tokio::test(flavor = "multi_thread")]
async fn every_command_works_over_verify_full_and_a_wrong_ca_is_named_without_the_password() {
    use adk_postgres_testing::{Capability, TlsOptions, skip_without, start_throwaway_tls_cluster, test_database_on};
    if skip_without(Capability::Tls).await {
        return;
    }
    let options = TlsOptions { hostssl_only: true, ..TlsOptions::default() };
    let (cluster, pki) = tokio::task::spawn_blocking(move || start_throwaway_tls_cluster(&options))
        .await
        .expect("task")
        .expect("a TLS-only cluster");
    // The database borrows its cluster for the whole test; the watchdog
    // removes the cluster when the test process ends.
    let cluster = Box::leak(Box::new(cluster));
    let db = test_database_on(cluster).await;
    let url = db.tls_url().await.expect("a verify-full URL");
    assert!(url.contains("sslmode=verify-full"), "{url}");

    let migrate = adk_pg(&url, &["migrate"]);
    assert!(migrate.status.success(), "{migrate:?}");
    assert!(stdout(&migrate).contains("up to date"), "{}", stdout(&migrate));
    let maintain = adk_pg(&url, &["maintain", "--once"]);
    assert!(maintain.status.success(), "{maintain:?}");
    let status = adk_pg(&url, &["status"]);
    assert_eq!(status.status.code(), Some(0), "{}{}", stdout(&status), stderr(&status));
    let text = stdout(&status);
    let connection = text.lines().find(|line| line.contains("connection")).unwrap_or_default();
    assert!(connection.split_whitespace().any(|cell| cell == "direct"), "{text}");

    let token = "cli-tls-token";
    let (mut child, addr) = serve(&url, token).await;
    let (code, body) = http_get(&addr, "/readyz", Some(token)).await;
    assert_eq!((code, body.as_str()), (200, "ready\n"), "ready over verify-full");
    let signalled = std::process::Command::new("kill")
        .args(["-TERM", &child.id().expect("running").to_string()])
        .status()
        .expect("run kill");
    assert!(signalled.success());
    let exit = tokio::time::timeout(std::time::Duration::from_secs(30), child.wait())
        .await
        .expect("adk-pg serve stops within 30 s of SIGTERM")
        .expect("its exit status");
    assert!(exit.success(), "{exit:?}");

    // A password in the URL (trust ignores it) that must appear nowhere.
    let password = "tls-test-pw-5e1d0c";
    let mut wrong = url::Url::parse(&with_root_cert(&url, Some(&pki.wrong_ca_cert()))).expect("URL");
    wrong.set_password(Some(password)).expect("a password");
    let refused = adk_pg(wrong.as_str(), &["migrate"]);
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    let (out, err) = (stdout(&refused), stderr(&refused));
    assert!(err.contains("not signed by a CA in sslrootcert"), "the reason is named: {err}");
    assert!(!out.contains(password) && !err.contains(password), "a password was printed: {out}{err}");
}

/// A folder of the test's own, removed when dropped.
#[derive(Debug)]
struct RemovedOnDrop(std::path::PathBuf);

impl Drop for RemovedOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// libpq's default roots: with no `sslrootcert`, a verify mode trusts
/// `~/.postgresql/root.crt`, and without that file it fails before
/// connecting, naming the parameter to set.
#[tokio::test(flavor = "multi_thread")]
async fn verify_full_without_sslrootcert_trusts_the_homes_root_crt_and_names_it_when_missing() {
    if adk_postgres_testing::skip_without(adk_postgres_testing::Capability::Tls).await {
        return;
    }
    let db = test_database().await;
    let url = db.tls_url().await.expect("the shared test server has TLS");
    let ca = url::Url::parse(&url)
        .expect("URL")
        .query_pairs()
        .find_map(|(key, value)| (key == "sslrootcert").then(|| value.into_owned()))
        .expect("the TLS URL names its CA");
    let without_roots = with_root_cert(&url, None);
    let home = RemovedOnDrop(std::env::temp_dir().join(format!("adk-pg-cli-home-{}", std::process::id())));
    let home = &home.0;
    std::fs::create_dir_all(home.join(".postgresql")).expect("a HOME");
    let migrate = || {
        std::process::Command::new(env!("CARGO_BIN_EXE_adk-pg"))
            .arg("migrate")
            .env("DATABASE_URL", &without_roots)
            .env("HOME", home)
            .output()
            .expect("run adk-pg")
    };

    let missing = migrate();
    assert_eq!(missing.status.code(), Some(1), "{missing:?}");
    assert!(
        stderr(&missing).contains("sslrootcert") && stderr(&missing).contains("needs trusted roots"),
        "{missing:?}"
    );

    std::fs::copy(&ca, home.join(".postgresql/root.crt")).expect("root.crt");
    let found = migrate();
    assert!(found.status.success(), "{found:?}");
    assert!(stdout(&found).contains("up to date"), "{}", stdout(&found));
}

#[tokio::test(flavor = "multi_thread")]
async fn archive_keeps_a_day_it_cannot_write_then_archives_restores_and_verifies_it() {
    let db = test_database().await;
    let sql = connect(db.url()).await.expect("connect");
    assert!(adk_pg(db.url(), &["maintain"]).status.success());
    store_events(&sql, "shop", "s1", 25).await;
    let today = Utc::now().date_naive();
    let later = today.checked_add_days(Days::new(40)).expect("day").to_string();
    let partition = format!("adk_events_p{}", today.format("%Y%m%d"));
    let exists = async |name: &str| -> bool {
        sql.query_one("SELECT to_regclass($1) IS NOT NULL", &[&name]).await.expect("regclass").get(0)
    };

    let refused = adk_pg(db.url(), &["policy", "set", "--archive", "ftp://host/dir"]);
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    assert!(stderr(&refused).contains("invalid archive_url"), "{}", stderr(&refused));
    let keys = adk_pg(db.url(), &["policy", "set", "--archive", "s3://key:secret@bucket/p"]);
    assert_eq!(keys.status.code(), Some(1), "credentials in the URL are refused");

    // A destination that cannot be made: the day is kept, and status says why.
    let dir = std::env::temp_dir().join(format!("adk-cli-archive-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let blocker = dir.join("a-file");
    std::fs::write(&blocker, b"not a directory").expect("file");
    let broken = format!("file://{}/below", blocker.display());
    assert!(adk_pg(db.url(), &["policy", "set", "--archive", &broken]).status.success());
    let kept = adk_pg(db.url(), &["maintain", "--today", &later]);
    assert!(kept.status.success(), "{kept:?}");
    assert!(
        stdout(&kept).contains(&format!("KEPT {today} ({partition}): the archive of app shop failed")),
        "{}",
        stdout(&kept)
    );
    assert!(exists(&partition).await, "a day whose archive failed is not dropped");
    let status = adk_pg(db.url(), &["status", "--today", &later]);
    assert_eq!(status.status.code(), Some(2), "{}", stdout(&status));
    assert!(stdout(&status).contains("ALERT: the archive of app shop for"), "{}", stdout(&status));

    // A working destination: archived, read back, recorded, then dropped.
    let archive = dir.join("archive");
    let url = format!("file://{}", archive.display());
    let set = adk_pg(db.url(), &["policy", "set", "--archive", &url, "--json"]);
    assert!(set.status.success(), "{set:?}");
    let policy: serde_json::Value = serde_json::from_slice(&set.stdout).expect("JSON");
    assert_eq!(policy["archive_url"], url.as_str());
    assert!(stdout(&adk_pg(db.url(), &["policy", "history"])).contains("archive_url"), "the log says when it began");
    let archived = adk_pg(db.url(), &["maintain", "--today", &later]);
    assert!(archived.status.success(), "{archived:?}");
    assert!(stdout(&archived).contains("archived: 1 app day(s), 25 event(s)"), "{}", stdout(&archived));
    assert!(!exists(&partition).await, "dropped once archived");
    let unresolved: i64 = sql
        .query_one("SELECT count(*) FROM adk_archive_failures WHERE resolved_at IS NULL", &[])
        .await
        .expect("count")
        .get(0);
    assert_eq!(unresolved, 0, "the archive that succeeded resolves the failure");

    let list = adk_pg(db.url(), &["archive", "list", "--app", "shop", "--json"]);
    assert!(list.status.success(), "{list:?}");
    let objects: serde_json::Value = serde_json::from_slice(&list.stdout).expect("JSON");
    assert_eq!(objects.as_array().map(Vec::len), Some(1), "{objects}");
    assert_eq!((objects[0]["rows"].as_i64(), objects[0]["kind"].as_str()), (Some(25), Some("events")));
    let verify = adk_pg(db.url(), &["archive", "verify"]);
    assert_eq!(verify.status.code(), Some(0), "{}", stdout(&verify));

    let restore = ["archive", "restore", "--app", "shop", "--day", &today.to_string(), "--into", "audit"];
    for _ in 0..2 {
        let restored = adk_pg(db.url(), &restore);
        assert!(restored.status.success(), "{restored:?}");
        assert!(stdout(&restored).contains("25 event(s)"), "{}", stdout(&restored));
    }
    let rows: i64 =
        sql.query_one("SELECT count(*) FROM audit.adk_restored_events", &[]).await.expect("restored").get(0);
    assert_eq!(rows, 25, "restoring twice replaces the copy");
    let write = sql.batch_execute("DELETE FROM audit.adk_restored_events").await.expect_err("read-only");
    let message = write.as_db_error().map(|e| e.message().to_owned()).unwrap_or_default();
    assert!(message.contains("read-only"), "{write:?}");

    // One flipped byte: verify names the object and exits 2.
    let key = objects[0]["object_key"].as_str().expect("key");
    let file = archive.join(key);
    let mut bytes = std::fs::read(&file).expect("object");
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&file, bytes).expect("flip");
    let bad = adk_pg(db.url(), &["archive", "verify"]);
    assert_eq!(bad.status.code(), Some(2), "{}", stdout(&bad));
    assert!(stdout(&bad).contains("BAD") && stdout(&bad).contains("SHA-256"), "{}", stdout(&bad));
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread")]
async fn sessions_lists_an_app_across_users_as_a_table_or_json() {
    let db = test_database().await;
    let sql = connect(db.url()).await.expect("connect");
    sql.batch_execute(
        "INSERT INTO adk_sessions (app_name, user_id, session_id, created_at, labels, display_name) VALUES
           ('support', 'ann', 'a1', now() - interval '3 minutes', '{\"team\": \"red\"}', 'Refund'),
           ('support', 'bob', 'b1', now() - interval '2 minutes', '{\"team\": \"blue\"}', NULL),
           ('support', 'cid', 'c1', now() - interval '1 minute', '{\"team\": \"red\"}', NULL),
           ('other', 'ann', 'x1', now(), '{\"team\": \"red\"}', NULL)",
    )
    .await
    .expect("sessions");

    let table = adk_pg(db.url(), &["sessions", "--app", "support"]);
    assert!(table.status.success(), "{table:?}");
    let text = stdout(&table);
    for cell in ["ann", "bob", "cid", "a1", "Refund", "team=red", "3 session(s) of app support"] {
        assert!(text.contains(cell), "{cell}: {text}");
    }
    assert!(!text.contains("x1"), "another app's session: {text}");

    let json = adk_pg(db.url(), &["sessions", "--app", "support", "--label", "team=red", "--json"]);
    assert!(json.status.success(), "{json:?}");
    let listed: serde_json::Value = serde_json::from_slice(&json.stdout).expect("sessions --json is JSON");
    let keys: Vec<String> = listed["sessions"]
        .as_array()
        .expect("sessions")
        .iter()
        .map(|s| format!("{}/{}", s["user_id"].as_str().unwrap_or(""), s["session_id"].as_str().unwrap_or("")))
        .collect();
    assert_eq!(keys, ["cid/c1", "ann/a1"], "newest created first, every user");
    assert_eq!(listed["more"], false);

    let one = adk_pg(db.url(), &["sessions", "--app", "support", "--limit", "1", "--json"]);
    let listed: serde_json::Value = serde_json::from_slice(&one.stdout).expect("JSON");
    assert_eq!((listed["sessions"].as_array().map(Vec::len), &listed["more"]), (Some(1), &serde_json::json!(true)));

    let since =
        adk_pg(db.url(), &["sessions", "--app", "support", "--updated-since", "2999-01-01T00:00:00Z", "--json"]);
    let listed: serde_json::Value = serde_json::from_slice(&since.stdout).expect("JSON");
    assert_eq!(listed["sessions"], serde_json::json!([]));

    for bad in [
        vec!["sessions", "--app", "support", "--label", "no-equals"],
        vec!["sessions", "--app", "support", "--updated-since", "yesterday"],
        vec!["sessions", "--app", "support", "--limit", "0"],
        vec!["sessions", "--app", " padded"],
    ] {
        let refused = adk_pg(db.url(), &bad);
        assert!(!refused.status.success(), "{bad:?} was accepted: {}", stdout(&refused));
    }
}
