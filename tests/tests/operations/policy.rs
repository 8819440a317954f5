//! The store policy row: read, tightened, loosened, refused when invalid,
//! and every change recorded with its time and role.

use std::time::Duration;

use adk_postgres_domain::{StoreError, StorePolicy};
use adk_postgres_storage::{PolicyAmendment, amend_policy, policy_changes, read_policy, set_policy};
use adk_postgres_testing::test_database;
use adk_postgres_tests::pg::{client, diesel};
use chrono::{DateTime, Utc};

const HOUR: Duration = Duration::from_secs(3600);
const DAY: Duration = Duration::from_secs(24 * 3600);

async fn server_now(sql: &tokio_postgres::Client) -> DateTime<Utc> {
    sql.query_one("SELECT now()", &[]).await.expect("now").get(0)
}

async fn changes_recorded(sql: &tokio_postgres::Client) -> i64 {
    sql.query_one("SELECT count(*) FROM adk_store_policy_changes", &[]).await.expect("count").get(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fresh_store_has_the_default_policy() {
    let db = test_database().await;
    let mut conn = diesel(db.url()).await;
    assert_eq!(read_policy(&mut conn).await.expect("read"), StorePolicy::default());
    assert!(policy_changes(&mut conn, 10).await.expect("history").is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn tightening_and_loosening_are_stored_and_recorded_with_time_and_role() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    let mut conn = diesel(db.url()).await;
    let role: String = sql.query_one("SELECT current_user::text", &[]).await.expect("role").get(0);

    let before = server_now(&sql).await;
    let tight = StorePolicy { max_session_lifetime: DAY, retention: DAY * 3, default_ttl: Some(HOUR), premake_days: 3 };
    assert_eq!(set_policy(&mut conn, &tight).await.expect("tighten"), tight);
    assert_eq!(read_policy(&mut conn).await.expect("read"), tight);

    let loose =
        StorePolicy { max_session_lifetime: DAY * 30, retention: DAY * 90, default_ttl: None, premake_days: 14 };
    assert_eq!(set_policy(&mut conn, &loose).await.expect("loosen"), loose);
    assert_eq!(read_policy(&mut conn).await.expect("read"), loose);
    let after = server_now(&sql).await;

    // The SQL side reads the same durations the Rust side wrote.
    let seconds: Vec<f64> = sql
        .query_one(
            "SELECT extract(epoch FROM adk_policy_seconds(max_session_lifetime))::float8,
                    extract(epoch FROM adk_policy_seconds(retention))::float8
             FROM adk_store_policy",
            &[],
        )
        .await
        .map(|row| vec![row.get(0), row.get(1)])
        .expect("seconds");
    assert_eq!(seconds, vec![(30 * 86_400) as f64, (90 * 86_400) as f64]);

    let changes = policy_changes(&mut conn, 10).await.expect("history");
    assert_eq!(changes.len(), 2, "{changes:?}");
    let (newest, oldest) = (&changes[0], &changes[1]);
    assert!(newest.change_id > oldest.change_id, "newest first");
    for change in &changes {
        assert_eq!(change.changed_by, role);
        assert!(change.changed_at >= before && change.changed_at <= after, "{change:?}");
    }
    let fields = |change: &adk_postgres_storage::PolicyChange| {
        change.changed_fields().into_iter().map(|(field, _, _)| field).collect::<Vec<_>>()
    };
    assert_eq!(fields(oldest), vec!["default_ttl", "max_session_lifetime", "premake_days", "retention"]);
    assert_eq!(oldest.before["premake_days"], 7);
    assert_eq!(oldest.after["premake_days"], 3);
    assert!(oldest.before["default_ttl"].is_null());
    assert!(newest.after["default_ttl"].is_null());
    assert_eq!(newest.before["premake_days"], 3);
    assert_eq!(newest.after["premake_days"], 14);
    assert_eq!(newest.after["updated_by"], role.as_str());

    assert_eq!(policy_changes(&mut conn, 1).await.expect("limited").len(), 1);
    assert!(
        matches!(policy_changes(&mut conn, 0).await, Err(StoreError::InvalidInput { field, .. }) if field == "limit")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_invalid_policy_is_refused_naming_the_field_and_nothing_is_written() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    let mut conn = diesel(db.url()).await;
    let base = StorePolicy::default();
    let invalid = [
        (StorePolicy { retention: DAY, ..base.clone() }, "retention"),
        (StorePolicy { max_session_lifetime: Duration::from_millis(500), ..base.clone() }, "max_session_lifetime"),
        (StorePolicy { default_ttl: Some(Duration::ZERO), ..base.clone() }, "default_ttl"),
        (StorePolicy { premake_days: 0, ..base.clone() }, "premake_days"),
        (StorePolicy { premake_days: 367, ..base.clone() }, "premake_days"),
    ];
    for (policy, expected) in invalid {
        let err = set_policy(&mut conn, &policy).await.expect_err("invalid policy");
        assert!(matches!(&err, StoreError::InvalidInput { field, .. } if field == expected), "{err:?}");
        assert!(err.to_string().contains(expected), "{err}");
    }
    // A partial change is judged as the whole policy it would make.
    let err = amend_policy(&mut conn, &PolicyAmendment { max_session_lifetime: Some(DAY * 60), ..Default::default() })
        .await
        .expect_err("lifetime past the retention");
    assert!(matches!(&err, StoreError::InvalidInput { field, .. } if field == "retention"), "{err:?}");

    assert_eq!(read_policy(&mut conn).await.expect("read"), base, "nothing was written");
    assert_eq!(changes_recorded(&sql).await, 0, "nothing was recorded");

    // The database refuses the same values on its own, for a hand-written UPDATE.
    let refused = sql
        .execute("UPDATE adk_store_policy SET retention = interval '1 day'", &[])
        .await
        .expect_err("CHECK constraint");
    let constraint = refused.as_db_error().and_then(|e| e.constraint()).unwrap_or_default().to_owned();
    assert_eq!(constraint, "adk_store_policy_retention_covers_lifetime");
    let deleted = sql.execute("DELETE FROM adk_store_policy", &[]).await.expect_err("the row cannot be deleted");
    let message = deleted.as_db_error().map(|e| e.message().to_owned()).unwrap_or_default();
    assert!(message.contains("cannot be deleted"), "{deleted:?}");
    assert_eq!(read_policy(&mut conn).await.expect("read"), base);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_amendment_keeps_the_fields_it_does_not_name() {
    let db = test_database().await;
    let mut conn = diesel(db.url()).await;
    let ttl = amend_policy(&mut conn, &PolicyAmendment { default_ttl: Some(Some(HOUR * 2)), ..Default::default() })
        .await
        .expect("set a default TTL");
    assert_eq!(ttl, StorePolicy { default_ttl: Some(HOUR * 2), ..StorePolicy::default() });
    let longer = amend_policy(&mut conn, &PolicyAmendment { retention: Some(DAY * 60), ..Default::default() })
        .await
        .expect("keep longer");
    assert_eq!(longer, StorePolicy { retention: DAY * 60, default_ttl: Some(HOUR * 2), ..StorePolicy::default() });
    let cleared = amend_policy(&mut conn, &PolicyAmendment { default_ttl: Some(None), ..Default::default() })
        .await
        .expect("clear");
    assert_eq!(cleared.default_ttl, None);
    assert_eq!(cleared.retention, DAY * 60);
    assert_eq!(policy_changes(&mut conn, 10).await.expect("history").len(), 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hand_written_update_is_recorded_and_read_in_exact_seconds() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    let mut conn = diesel(db.url()).await;
    // A month counts as 30 days and a day as 24 hours, whatever the TimeZone.
    sql.batch_execute(
        "SET TimeZone = 'America/New_York';
         UPDATE adk_store_policy SET max_session_lifetime = interval '1 day 1 hour',
                                     retention = interval '1 mon', default_ttl = interval '90 minutes'",
    )
    .await
    .expect("hand-written update");
    let policy = read_policy(&mut conn).await.expect("read");
    assert_eq!(policy.max_session_lifetime, DAY + HOUR);
    assert_eq!(policy.retention, DAY * 30);
    assert_eq!(policy.default_ttl, Some(Duration::from_secs(90 * 60)));
    let changes = policy_changes(&mut conn, 10).await.expect("history");
    assert_eq!(changes.len(), 1);
    assert_eq!(changes[0].after["retention"], "1 mon");
}
