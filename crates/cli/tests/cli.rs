//! The `adk-pg` binary end to end: exit codes and what an operator reads.

use std::process::Output;

use adk_postgres_testing::test_database;
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

async fn raw(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.expect("connect");
    tokio::spawn(connection);
    client
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

    let json = adk_pg(db.url(), &["status", "--json"]);
    let report: serde_json::Value = serde_json::from_slice(&json.stdout).expect("status --json is JSON");
    assert_eq!(report["partitions_ahead"], 7);

    let sql = raw(db.url()).await;
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
    let sql = raw(db.url()).await;
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
