//! The archive tier against a real PostgreSQL: maintenance writes each
//! covered app's retiring day to object storage (a folder, or moto's S3
//! server) before it drops the day; what comes back (a restore, DuckDB
//! reading the folder) is row for row what the store held, media included.
//! An S3 outage keeps the day; erasure reaches archived objects and
//! restored copies and leaves objects without the user untouched; a role
//! bound to one app sees only that app's catalog.
//!
//! Faults of the objects themselves (a flipped byte, a run killed before
//! its catalog rows, a full disk) are in `archive_faults`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use adk_postgres_archive::{
    ArchiveConfig, ArchiveError, ArchiveSetting, Destination, StoreOptions, archive_app_day, erase_user, list_archive,
    restore_day, set_archive_policy, verify_archive,
};
use adk_postgres_domain::{AppName, AppendOptions, SessionId, SessionKey, SessionStore, UserId};
use adk_postgres_retention::{MaintenanceConfig, MaintenanceReport, run_maintenance};
use adk_postgres_storage::tenancy::AppBinding;
use adk_postgres_storage::{EraseOptions, PgSessionStore};
use adk_postgres_testing::{S3Server, duckdb_json, test_database};
use adk_postgres_tests::conformance::{image_event, media_bytes};
use adk_postgres_tests::pg::{client, diesel, service_role, store};
use chrono::{Days, NaiveDate, Utc};
use diesel_async::AsyncPgConnection;
use serde_json::Value;
use tokio_postgres::Client;
use tokio_postgres::error::SqlState;

/// The columns of an archived event, as a restore loads them and as the
/// snapshot of the live log holds them.
pub(super) const EVENT_COLUMNS: &str = "app_name, user_id, session_id, session_day, seq, event_id, invocation_id, \
     author, event_ts, created_at, payload, blob_refs, session_display_name, session_labels, session_created_at";

/// The columns of a piece of archived media.
const BLOB_COLUMNS: &str = "app_name, day, sha256, size, data";

pub(super) fn days_ago(days: u64) -> NaiveDate {
    Utc::now().date_naive().checked_sub_days(Days::new(days)).expect("day")
}

pub(super) fn plus(day: NaiveDate, days: u64) -> NaiveDate {
    day.checked_add_days(Days::new(days)).expect("day")
}

/// Maintenance run on this "today" retires `day` and every day before it
/// (lifetime 7 days + retention 30 days, the default policy), and no later
/// day.
pub(super) fn retiring(day: NaiveDate) -> NaiveDate {
    plus(day, 38)
}

pub(super) fn partition(day: NaiveDate) -> String {
    format!("adk_events_p{}", day.format("%Y%m%d"))
}

/// The partition of `day`, schema-qualified and quoted, as
/// `archive_app_day` takes it.
pub(super) async fn qualified_partition(sql: &Client, day: NaiveDate) -> String {
    sql.query_one(
        "SELECT format('%I.%I', n.nspname, c.relname) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
          WHERE c.relname = $1",
        &[&partition(day)],
    )
    .await
    .expect("the day's partition")
    .get(0)
}

pub(super) async fn partition_exists(sql: &Client, day: NaiveDate) -> bool {
    sql.query_one("SELECT to_regclass($1) IS NOT NULL", &[&partition(day)]).await.expect("to_regclass").get(0)
}

/// `users` each with `sessions` sessions of `day` in `app`, every session
/// with `events` text events (written behind the store's back, as a past
/// day must be), and `images` (user index, bytes): an image event the store
/// appends to that user's first session, so its media goes through the
/// store. Sessions are made "now" so they take the appends, then aged to
/// noon of the day.
pub(super) struct DaySeed<'a> {
    pub app: &'a str,
    pub day: NaiveDate,
    pub users: &'a [String],
    pub sessions: i32,
    pub events: i32,
    pub images: &'a [(usize, Vec<u8>)],
}

pub(super) fn users(prefix: &str, count: usize) -> Vec<String> {
    (0..count).map(|n| format!("{prefix}{n:02}")).collect()
}

pub(super) fn session_id(app: &str, day: NaiveDate, user: &str, session: i32) -> String {
    format!("{app}-{day}-{user}-{session}")
}

pub(super) async fn seed(sql: &Client, store: &PgSessionStore, seed: &DaySeed<'_>) {
    let DaySeed { app, day, users, sessions, events, images } = *seed;
    sql.execute("SELECT adk_ensure_event_partition($1)", &[&day]).await.expect("partition");
    sql.execute(
        "INSERT INTO adk_sessions (app_name, user_id, session_id, session_day, last_seq, created_at, updated_at,
                                   display_name, labels)
         SELECT $1, u, $1 || '-' || $2::date::text || '-' || u || '-' || s, $2, $4::int, now(), now(),
                CASE WHEN s % 2 = 1 THEN 'chat ' || s END, jsonb_build_object('team', u, 'n', s::text)
           FROM unnest($3::text[]) u, generate_series(1, $5::int) s",
        &[&app, &day, &users, &events, &sessions],
    )
    .await
    .expect("sessions");
    sql.execute(
        "INSERT INTO adk_events (app_name, user_id, session_id, session_day, seq, event_id, invocation_id, author,
                                 event_ts, payload)
         SELECT $1, u, sid, $2, n, md5(sid || ':' || n),
                CASE WHEN n % 3 = 0 THEN NULL ELSE 'inv-' || (n / 2) END,
                CASE WHEN n % 2 = 0 THEN 'model' ELSE 'user' END,
                extract(epoch FROM $2::date)::bigint * 1000000000 + n * 1000003,
                jsonb_build_object(
                    'id', md5(sid || ':' || n),
                    'author', CASE WHEN n % 2 = 0 THEN 'model' ELSE 'user' END,
                    'content', jsonb_build_object(
                        'role', CASE WHEN n % 2 = 0 THEN 'model' ELSE 'user' END,
                        'parts', jsonb_build_array(jsonb_build_object(
                            'text', 'turn ' || n || ' of ' || u || ' — héllo ✓ ' || repeat(md5(sid || n), 2)))),
                    'actions', jsonb_build_object('state_delta', jsonb_build_object('turn', n)))
           FROM unnest($3::text[]) u, generate_series(1, $5::int) s,
                LATERAL (SELECT $1 || '-' || $2::date::text || '-' || u || '-' || s AS sid) k,
                generate_series(1, $4::int) n",
        &[&app, &day, &users, &events, &sessions],
    )
    .await
    .expect("events");
    for (user, image) in images {
        let key = SessionKey::new(
            AppName::new(app).expect("app"),
            UserId::new(users[*user].as_str()).expect("user"),
            SessionId::new(session_id(app, day, &users[*user], 1)).expect("id"),
        );
        store.append(&key, image_event(image), AppendOptions::default()).await.expect("image event");
    }
    sql.execute(
        "UPDATE adk_sessions SET created_at = ($2::date + time '12:00') AT TIME ZONE 'UTC',
                updated_at = ($2::date + time '12:00') AT TIME ZONE 'UTC'
          WHERE app_name = $1 AND session_day = $2",
        &[&app, &day],
    )
    .await
    .expect("age the day");
}

/// Copies the live rows of the days before `before` (their events with
/// their sessions' metadata, and the media they name) into the tables
/// `snapshot_events` and `snapshot_blobs`, to compare with what comes back
/// once the days are gone.
pub(super) async fn snapshot(sql: &Client, before: NaiveDate) {
    sql.batch_execute(&format!(
        "DROP TABLE IF EXISTS snapshot_events, snapshot_blobs;
         CREATE TABLE snapshot_events AS
         SELECT e.app_name, e.user_id, e.session_id, e.session_day, e.seq, e.event_id, e.invocation_id, e.author,
                e.event_ts, e.created_at, e.payload, e.blob_refs, s.display_name AS session_display_name,
                s.labels AS session_labels, s.created_at AS session_created_at
           FROM adk_events e
           LEFT JOIN adk_sessions s USING (app_name, user_id, session_id)
          WHERE e.session_day < DATE '{before}';
         CREATE TABLE snapshot_blobs AS
         SELECT DISTINCT b.app_name, r.session_day AS day, b.sha256, b.size, b.data
           FROM (SELECT app_name, session_day, unnest(blob_refs) AS sha256 FROM adk_events
                  WHERE blob_refs IS NOT NULL AND session_day < DATE '{before}') r
           JOIN adk_blobs b USING (app_name, sha256);"
    ))
    .await
    .expect("snapshot the live rows");
}

/// Rows of `left` missing from `right` and rows of `right` missing from
/// `left`, duplicates counted (EXCEPT ALL both ways): (0, 0) when they are
/// the same multiset.
pub(super) async fn differences(sql: &Client, left: &str, right: &str) -> (i64, i64) {
    let row = sql
        .query_one(
            &format!(
                "SELECT (SELECT count(*) FROM ({left} EXCEPT ALL {right}) l),
                        (SELECT count(*) FROM ({right} EXCEPT ALL {left}) r)"
            ),
            &[],
        )
        .await
        .unwrap_or_else(|e| panic!("compare {left} with {right}: {e}"));
    (row.get(0), row.get(1))
}

async fn count(sql: &Client, query: &str) -> i64 {
    sql.query_one(&format!("SELECT count(*) FROM ({query}) c"), &[])
        .await
        .unwrap_or_else(|e| panic!("count {query}: {e}"))
        .get(0)
}

/// Restores `app`'s `day` into `schema` and checks it against the
/// snapshot, events and media, in both directions.
pub(super) async fn restore_and_compare(
    conn: &mut AsyncPgConnection,
    sql: &Client,
    options: &StoreOptions,
    app: &str,
    day: NaiveDate,
    schema: &str,
) {
    let report =
        restore_day(conn, app, day, schema, options).await.unwrap_or_else(|e| panic!("restore {app} {day}: {e}"));
    let expected =
        count(sql, &format!("SELECT 1 FROM snapshot_events WHERE app_name = '{app}' AND session_day = '{day}'")).await;
    assert_eq!(report.events, expected, "{app} {day}: events restored");
    let events = format!("WHERE app_name = '{app}' AND session_day = '{day}'");
    assert_eq!(
        differences(
            sql,
            &format!("SELECT {EVENT_COLUMNS} FROM snapshot_events {events}"),
            &format!("SELECT {EVENT_COLUMNS} FROM {schema}.adk_restored_events {events}")
        )
        .await,
        (0, 0),
        "{app} {day}: the restored events are the live ones"
    );
    let blobs = format!("WHERE app_name = '{app}' AND day = '{day}'");
    assert_eq!(
        differences(
            sql,
            &format!("SELECT {BLOB_COLUMNS} FROM snapshot_blobs {blobs}"),
            &format!("SELECT {BLOB_COLUMNS} FROM {schema}.adk_restored_blobs {blobs}")
        )
        .await,
        (0, 0),
        "{app} {day}: the restored media is the stored bytes"
    );
    let media = count(sql, &format!("SELECT 1 FROM snapshot_blobs {blobs}")).await;
    assert_eq!(report.media, media, "{app} {day}: media restored");
}

pub(super) fn file_url(dir: &Path) -> String {
    format!("file://{}", dir.display())
}

pub(super) fn config_with(archive: ArchiveConfig) -> MaintenanceConfig {
    MaintenanceConfig { archive, ..MaintenanceConfig::default() }
}

pub(super) async fn archive_to(conn: &mut AsyncPgConnection, url: &str, apps: Option<&[&str]>) {
    let setting =
        ArchiveSetting::On { url: url.to_owned(), apps: apps.map(|a| a.iter().map(|s| (*s).to_owned()).collect()) };
    set_archive_policy(conn, &setting).await.expect("archive policy");
}

pub(super) async fn maintain(url: &str, today: NaiveDate, config: &MaintenanceConfig) -> MaintenanceReport {
    run_maintenance(url, today, config).await.unwrap_or_else(|e| panic!("maintenance for {today}: {e}"))
}

/// (app, day) → (events recorded in the catalog's parts, the day's event
/// count it recorded, media rows).
async fn catalog_counts(sql: &Client) -> BTreeMap<(String, NaiveDate), (i64, i64, i64)> {
    sql.query(
        "SELECT app_name, day, (sum(rows) FILTER (WHERE kind = 'events'))::bigint, max(day_events),
                coalesce(sum(rows) FILTER (WHERE kind = 'media'), 0)::bigint
           FROM adk_archive_objects GROUP BY 1, 2",
        &[],
    )
    .await
    .expect("catalog")
    .iter()
    .map(|r| ((r.get(0), r.get(1)), (r.get(2), r.get(3), r.get(4))))
    .collect()
}

/// Every file below `dir`, relative to it, sorted.
pub(super) fn files_below(dir: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display())) {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                walk(root, &path, out);
            } else {
                out.push(path.strip_prefix(root).expect("below").to_string_lossy().into_owned());
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

/// DuckDB's answer to `query`, run off the async threads.
async fn duckdb(query: String) -> Vec<Value> {
    let answer = tokio::task::spawn_blocking(move || duckdb_json(&query)).await.expect("duckdb task");
    match answer.unwrap_or_else(|e| panic!("duckdb: {e}")) {
        Value::Array(rows) => rows,
        other => panic!("duckdb answered {other}"),
    }
}

/// 3 apps × 3 days, about 100,000 events, some with media: maintenance
/// archives every app's day to a folder before dropping it (one of them was
/// archived beforehand and is only read back), the catalog adds up to the
/// days, a restore before and after the drop is row for row the live log
/// (media bytes included), restoring again is idempotent, restored tables
/// refuse writes, and DuckDB reads one user's conversation from the folder.
#[tokio::test(flavor = "multi_thread")]
async fn archive_to_a_folder_restores_row_for_row_and_duckdb_reads_it() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    let store = store(db.url()).await;
    let mut conn = diesel(db.url()).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let url = file_url(dir.path());
    let options = StoreOptions::default();
    let apps = ["archive-a", "archive-b", "archive-c"];
    let days: Vec<NaiveDate> = (0..3).map(|n| days_ago(62 - n)).collect();
    let people = users("u", 10);
    let shared = media_bytes(100_000, 7);
    let started = std::time::Instant::now();
    for (a, app) in apps.iter().enumerate() {
        for (d, day) in days.iter().enumerate() {
            let seed_n = u64::try_from(a * 10 + d).expect("seed");
            let images =
                [(1, media_bytes(80_000, 100 + seed_n)), (4, media_bytes(70_000, 200 + seed_n)), (7, shared.clone())];
            // 10 users × 4 sessions × 277 events + 3 images = 11,083 a day.
            let day_seed = DaySeed { app, day: *day, users: &people, sessions: 4, events: 277, images: &images };
            seed(&sql, &store, &day_seed).await;
        }
    }
    let seeded = std::time::Instant::now();
    let last = *days.last().expect("days");
    snapshot(&sql, plus(last, 1)).await;
    let total = count(&sql, "SELECT 1 FROM snapshot_events").await;
    assert_eq!(total, 9 * (10 * 4 * 277 + 3));
    assert_eq!(
        count(&sql, "SELECT 1 FROM snapshot_blobs").await,
        9 * 3,
        "two images of its own and the shared one a day"
    );

    // One app's day archived ahead of maintenance, and restored while the
    // day is still in the log.
    archive_to(&mut conn, &url, None).await;
    let destination = Destination::open(&url).expect("destination");
    let partition0 = qualified_partition(&sql, days[0]).await;
    let early = archive_app_day(&mut conn, &destination, &partition0, apps[0], days[0], &ArchiveConfig::default())
        .await
        .expect("archive a day ahead of maintenance");
    assert_eq!(early.events, 10 * 4 * 277 + 3);
    assert!(!early.already_archived);
    restore_and_compare(&mut conn, &sql, &options, apps[0], days[0], "audit_before").await;

    let report = maintain(db.url(), retiring(last), &config_with(ArchiveConfig::default())).await;
    let maintained = std::time::Instant::now();
    assert!(report.archive_failed.is_empty(), "{report}");
    let archived: BTreeSet<(String, NaiveDate, bool)> =
        report.archived.iter().map(|a| (a.app_name.clone(), a.day, a.already_archived)).collect();
    let (first_app, first_day) = (apps[0], days[0]);
    let expected: BTreeSet<(String, NaiveDate, bool)> = apps
        .iter()
        .flat_map(|app| days.iter().map(move |day| ((*app).to_owned(), *day, *app == first_app && *day == first_day)))
        .collect();
    assert_eq!(archived, expected, "every app's day archived once; the early one read back, not rewritten");
    for day in &days {
        assert!(report.dropped.contains(&partition(*day)), "{day} dropped: {report}");
        assert!(!partition_exists(&sql, *day).await);
    }

    // The catalog adds up to the days.
    let catalog = catalog_counts(&sql).await;
    let live: BTreeMap<(String, NaiveDate), (i64, i64)> = sql
        .query(
            "SELECT e.app_name, e.session_day, count(*),
                    (SELECT count(*) FROM snapshot_blobs b WHERE b.app_name = e.app_name AND b.day = e.session_day)
               FROM snapshot_events e GROUP BY 1, 2",
            &[],
        )
        .await
        .expect("live counts")
        .iter()
        .map(|r| ((r.get(0), r.get(1)), (r.get(2), r.get(3))))
        .collect();
    assert_eq!(live.len(), 9);
    for (key, (events, media)) in &live {
        assert_eq!(catalog.get(key), Some(&(*events, *events, *media)), "{key:?}: catalog rows == events, media");
    }

    // The days are gone from the log; each comes back whole, twice.
    for schema in ["audit_after", "audit_after"] {
        for app in apps {
            for day in &days {
                restore_and_compare(&mut conn, &sql, &options, app, *day, schema).await;
            }
        }
        assert_eq!(count(&sql, "SELECT 1 FROM audit_after.adk_restored_events").await, total, "no duplicates");
    }
    let restored = std::time::Instant::now();
    // The comparison sees a single missing row.
    let all = format!("SELECT {EVENT_COLUMNS} FROM audit_after.adk_restored_events");
    let one_less = format!("{all} WHERE NOT (app_name = '{}' AND user_id = '{}' AND seq = 7)", apps[2], people[9]);
    assert_eq!(differences(&sql, &format!("SELECT {EVENT_COLUMNS} FROM snapshot_events"), &one_less).await, (12, 0));
    // The restore before the drop is the same too.
    restore_and_compare(&mut conn, &sql, &options, apps[0], days[0], "audit_before").await;

    // Restored copies are read-only.
    for statement in [
        "INSERT INTO audit_after.adk_restored_events SELECT * FROM audit_after.adk_restored_events LIMIT 1",
        "UPDATE audit_after.adk_restored_events SET author = 'someone else' WHERE seq = 1",
        "DELETE FROM audit_after.adk_restored_events WHERE seq = 1",
        "TRUNCATE audit_after.adk_restored_events",
        "DELETE FROM audit_after.adk_restored_blobs",
        "UPDATE audit_after.adk_restored_blobs SET data = '\\x00'",
    ] {
        let error = sql.batch_execute(statement).await.expect_err(statement);
        assert_eq!(error.code(), Some(&SqlState::READ_ONLY_SQL_TRANSACTION), "{statement}: {error}");
    }
    assert_eq!(count(&sql, "SELECT 1 FROM audit_after.adk_restored_events").await, total);

    // DuckDB reads the folder as Hive partitions: one user's conversation,
    // in order, is what the store held.
    let (app, user) = (apps[1], people[4].as_str());
    let from_duckdb = duckdb(format!(
        "SELECT session_id, seq, event_id, payload
           FROM read_parquet('{}/app=*/day=*/events-*.parquet', hive_partitioning = true)
          WHERE app = '{app}' AND user_id = '{user}' ORDER BY day, session_id, seq",
        dir.path().display()
    ))
    .await;
    let from_store: Vec<Value> = sql
        .query(
            "SELECT session_id, seq, event_id, payload::text FROM snapshot_events WHERE app_name = $1 AND user_id = $2
              ORDER BY session_day, session_id, seq",
            &[&app, &user],
        )
        .await
        .expect("the user's events")
        .iter()
        .map(|r| {
            serde_json::json!({
                "session_id": r.get::<_, String>(0), "seq": r.get::<_, i64>(1),
                "event_id": r.get::<_, String>(2), "payload": r.get::<_, String>(3),
            })
        })
        .collect();
    assert_eq!(from_store.len(), 3 * (4 * 277 + 1), "the user has an image a day");
    assert_eq!(from_duckdb, from_store, "DuckDB reads the user's conversation as the store held it");
    let counts = duckdb(format!(
        "SELECT app, count(*) AS n FROM read_parquet('{}/**/events-*.parquet', hive_partitioning = true)
          GROUP BY app ORDER BY app",
        dir.path().display()
    ))
    .await;
    let per_app = total / 3;
    assert_eq!(
        counts,
        apps.iter().map(|app| serde_json::json!({"app": app, "n": per_app})).collect::<Vec<_>>(),
        "every archived event, once"
    );
    println!(
        "archive round trip of {total} events: seeding {:.1}s, maintenance (archive 8 app days, verify 1, drop 3) \
         {:.1}s, 18 restores and comparisons {:.1}s",
        (seeded - started).as_secs_f64(),
        (maintained - seeded).as_secs_f64(),
        (restored - maintained).as_secs_f64()
    );
}

/// The S3 settings of the server, lower-cased as object_store names them.
fn s3_options(server: &S3Server) -> StoreOptions {
    StoreOptions::new(server.env().into_iter().map(|(k, v)| (k.to_lowercase(), v)))
}

/// The same flow against moto's S3 server; then the server dies before a
/// run: the day is kept, the failure reported and recorded, and the run
/// after its restart archives the day, drops it and resolves the failure.
#[tokio::test(flavor = "multi_thread")]
async fn archive_to_s3_survives_an_outage_by_keeping_the_day() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    let store = store(db.url()).await;
    let mut conn = diesel(db.url()).await;
    let mut server = S3Server::start().await.expect("moto S3 server");
    let options = s3_options(&server);
    let config = config_with(ArchiveConfig { store_options: options.clone(), ..ArchiveConfig::default() });
    let url = server.url("archive/v1");
    let (first, second) = (days_ago(61), days_ago(60));
    let people = users("s", 3);
    // The second app's name needs escaping in a key.
    let apps = ["s3-a", "s3 b/ü"];
    for app in apps {
        let images = [(0, media_bytes(70_000, 1)), (2, media_bytes(75_000, 2))];
        seed(&sql, &store, &DaySeed { app, day: first, users: &people, sessions: 2, events: 40, images: &images })
            .await;
    }
    let images = [(1, media_bytes(70_000, 3))];
    seed(&sql, &store, &DaySeed { app: "s3-a", day: second, users: &people, sessions: 2, events: 30, images: &images })
        .await;
    snapshot(&sql, plus(second, 1)).await;
    archive_to(&mut conn, &url, None).await;

    let report = maintain(db.url(), retiring(first), &config).await;
    assert!(report.archive_failed.is_empty(), "{report}");
    assert_eq!(report.archived.len(), 2, "{report}");
    assert_eq!(report.dropped, vec![partition(first)]);
    assert!(partition_exists(&sql, second).await);
    let keys = server.list("archive/v1/").await.expect("list");
    let folders: BTreeMap<&str, Vec<&str>> = keys.iter().fold(BTreeMap::new(), |mut folders, key| {
        let (folder, name) = key.rsplit_once('/').expect("a key in a folder");
        folders.entry(folder).or_default().push(name);
        folders
    });
    assert_eq!(folders.len(), 2, "{keys:?}");
    for (folder, names) in &folders {
        assert!(folder.starts_with("archive/v1/app=") && folder.ends_with(&format!("/day={first}")), "{folder}");
        assert_eq!(names, &["events-0000.parquet", "manifest.json", "media-0000.parquet"], "{folder}");
    }
    for app in apps {
        restore_and_compare(&mut conn, &sql, &options, app, first, "from_s3").await;
    }
    let checks = verify_archive(&mut conn, None, None, &options).await.expect("verify");
    assert_eq!(checks.len(), 4);
    assert!(checks.iter().all(|c| c.problem.is_none()), "{checks:?}");

    // The server dies: the second day is kept, and says why.
    server.stop().expect("stop the S3 server");
    let outage = maintain(db.url(), retiring(second), &config).await;
    assert!(outage.archived.is_empty(), "{outage}");
    assert_eq!(outage.archive_failed.len(), 1, "{outage}");
    let failure = &outage.archive_failed[0];
    assert_eq!((failure.app_name.as_str(), failure.day), ("s3-a", second));
    assert!(outage.dropped.is_empty(), "{outage}");
    assert!(partition_exists(&sql, second).await, "the day is kept while its archive fails");
    assert!(outage.to_string().contains("KEPT"), "{outage}");
    let open: Vec<(String, NaiveDate, String)> = sql
        .query("SELECT app_name, day, error FROM adk_archive_failures WHERE resolved_at IS NULL", &[])
        .await
        .expect("failures")
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(open.len(), 1, "{open:?}");
    assert_eq!((open[0].0.as_str(), open[0].1), ("s3-a", second));
    assert!(!open[0].2.contains("adk-test-secret"), "no credential in the recorded error: {}", open[0].2);
    let live = count(&sql, &format!("SELECT 1 FROM adk_events WHERE session_day = '{second}'")).await;
    assert_eq!(live, 3 * 2 * 30 + 1, "the kept day still has its events");

    // Back (empty: moto keeps nothing): the next run archives and drops it.
    server.restart().await.expect("restart the S3 server");
    let recovered = maintain(db.url(), retiring(second), &config).await;
    assert!(recovered.archive_failed.is_empty(), "{recovered}");
    assert_eq!(recovered.archived.len(), 1, "{recovered}");
    assert!(!recovered.archived[0].already_archived);
    assert_eq!(recovered.dropped, vec![partition(second)]);
    let resolved: Vec<bool> = sql
        .query(
            "SELECT resolved_at IS NOT NULL FROM adk_archive_failures WHERE app_name = 's3-a' AND day = $1",
            &[&second],
        )
        .await
        .expect("failures")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(resolved, [true], "the failure is resolved by the archive");
    restore_and_compare(&mut conn, &sql, &options, "s3-a", second, "from_s3").await;
}

/// A user over three archived days and a live one: the store's erasure and
/// the archive's leave no row of theirs in any object (DuckDB and a
/// restore say so) or restored copy; objects that never held them keep
/// their bytes, ruled out by their footers; the audit row counts what went.
#[tokio::test(flavor = "multi_thread")]
async fn archive_erasure_removes_the_user_everywhere_and_rewrites_only_their_objects() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    let store = store(db.url()).await;
    let mut conn = diesel(db.url()).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let url = file_url(dir.path());
    let options = StoreOptions::default();
    let app = "erase-app";
    let victim = "m-victim";
    // Sorted around the victim, so the key-ordered parts of a day hold
    // ranges of users and most rule the victim out by their statistics.
    let mut people = users("a-user", 6);
    people.extend(users("z-user", 6));
    let with_victim: Vec<String> = people.iter().cloned().chain([victim.to_owned()]).collect();
    let shared = media_bytes(70_000, 9);
    let own = media_bytes(80_000, 10);
    let days: Vec<NaiveDate> = (0..4).map(|n| days_ago(63 - n)).collect();
    // Day 0 never had the victim; days 1 to 3 did (the victim is user 12).
    seed(
        &sql,
        &store,
        &DaySeed { app, day: days[0], users: &people, sessions: 2, events: 60, images: &[(0, shared.clone())] },
    )
    .await;
    for day in &days[1..] {
        let images = [(12, own.clone()), (3, shared.clone())];
        seed(&sql, &store, &DaySeed { app, day: *day, users: &with_victim, sessions: 2, events: 60, images: &images })
            .await;
    }
    let live_key = {
        let request = adk_postgres_domain::CreateSession::new(
            AppName::new(app).expect("app"),
            UserId::new(victim).expect("user"),
        );
        store.create(request).await.expect("today's session").key
    };
    store.append(&live_key, image_event(&own), AppendOptions::default()).await.expect("today's event");
    let last = *days.last().expect("days");
    snapshot(&sql, plus(last, 1)).await;
    let victim_rows = count(&sql, &format!("SELECT 1 FROM snapshot_events WHERE user_id = '{victim}'")).await;
    assert_eq!(victim_rows, 3 * (2 * 60 + 1));

    archive_to(&mut conn, &url, None).await;
    // Small parts and row groups: each day is several objects.
    let archive =
        ArchiveConfig { part_bytes: 24 << 10, batch_rows: 150, row_group_rows: 150, ..ArchiveConfig::default() };
    let report = maintain(db.url(), retiring(last), &config_with(archive)).await;
    assert!(report.archive_failed.is_empty(), "{report}");
    assert_eq!(report.archived.len(), 4, "{report}");
    assert!(days.iter().all(|day| report.dropped.contains(&partition(*day))), "{report}");

    // A copy restored before the erasure, which the erasure must reach.
    restore_and_compare(&mut conn, &sql, &options, app, days[1], "legal_hold").await;
    let before: BTreeMap<String, Vec<u8>> = sql
        .query("SELECT object_key, sha256 FROM adk_archive_objects WHERE kind = 'events'", &[])
        .await
        .expect("catalog")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert!(before.len() > 8, "several parts a day: {}", before.len());
    let folder = dir.path().display().to_string();
    let holding: BTreeSet<String> = duckdb(format!(
        "SELECT DISTINCT filename FROM read_parquet('{folder}/**/events-*.parquet', filename = true)
          WHERE user_id = '{victim}'"
    ))
    .await
    .iter()
    .map(|row| {
        row["filename"].as_str().expect("filename").strip_prefix(&format!("{folder}/")).expect("below").to_owned()
    })
    .collect();
    assert!(!holding.is_empty() && holding.len() < before.len(), "{holding:?}");

    let erased = store
        .erase_user_with(
            &AppName::new(app).expect("app"),
            &UserId::new(victim).expect("user"),
            EraseOptions::default(),
            |_| {},
        )
        .await
        .expect("erase the live log");
    let erasure_id = erased.erasure_id.expect("an audit row");
    assert_eq!(erased.events, 1, "the live day's event");
    let archived = erase_user(&mut conn, app, victim, Some(erasure_id), &options).await.expect("erase the archive");
    assert_eq!(archived.archived_rows_removed, victim_rows, "{archived:?}");
    assert_eq!(archived.restored_rows_removed, 2 * 60 + 1, "{archived:?}");
    assert_eq!(archived.objects, before.len());
    assert_eq!(archived.rewritten, holding.len(), "{archived:?}");
    assert!(archived.skipped_by_footer > 0, "{archived:?}");
    assert_eq!(archived.skipped_by_footer + archived.read, archived.objects, "{archived:?}");
    assert_eq!(archived.media_rewritten, 3, "the victim's image leaves each day's media: {archived:?}");
    let audit = sql
        .query_one("SELECT archived_rows, restored_rows FROM adk_user_erasures WHERE erasure_id = $1", &[&erasure_id])
        .await
        .expect("audit row");
    assert_eq!((audit.get::<_, i64>(0), audit.get::<_, i64>(1)), (victim_rows, 2 * 60 + 1));

    // Objects without the user: the same key and bytes. Objects with: new.
    let after: BTreeMap<String, Vec<u8>> = sql
        .query("SELECT object_key, sha256 FROM adk_archive_objects WHERE kind = 'events'", &[])
        .await
        .expect("catalog")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    for (key, sha) in &before {
        if holding.contains(key) {
            assert!(!after.contains_key(key), "{key} held the victim and was rewritten under a new key");
        } else {
            assert_eq!(after.get(key), Some(sha), "{key} never held the victim and is untouched");
        }
    }
    let checks = verify_archive(&mut conn, None, Some(app), &options).await.expect("verify");
    assert!(checks.iter().all(|c| c.problem.is_none()), "{checks:?}");
    let again = erase_user(&mut conn, app, victim, None, &options).await.expect("erase again");
    assert_eq!((again.archived_rows_removed, again.rewritten, again.restored_rows_removed), (0, 0, 0), "{again:?}");

    // Nowhere to be found: DuckDB, the copy restored before, a new restore.
    let found = duckdb(format!(
        "SELECT count(*) FILTER (WHERE user_id = '{victim}') AS victim, count(*) AS total
           FROM read_parquet('{folder}/**/events-*.parquet')"
    ))
    .await;
    let total = count(&sql, "SELECT 1 FROM snapshot_events").await;
    assert_eq!(found, vec![serde_json::json!({"victim": 0, "total": total - victim_rows})]);
    assert_eq!(
        count(&sql, &format!("SELECT 1 FROM legal_hold.adk_restored_events WHERE user_id = '{victim}'")).await,
        0
    );
    let own_hash: Vec<u8> = sql
        .query_one(
            "SELECT sha256 FROM snapshot_blobs WHERE size = $1 LIMIT 1",
            &[&i64::try_from(own.len()).expect("len")],
        )
        .await
        .expect("the victim's image")
        .get(0);
    sql.batch_execute(&format!("DELETE FROM snapshot_events WHERE user_id = '{victim}'")).await.expect("expected");
    sql.execute("DELETE FROM snapshot_blobs WHERE sha256 = $1", &[&own_hash]).await.expect("expected media");
    for day in &days {
        restore_and_compare(&mut conn, &sql, &options, app, *day, "after_erasure").await;
    }
    let held_media: Vec<Vec<u8>> = sql
        .query("SELECT sha256 FROM legal_hold.adk_restored_blobs", &[])
        .await
        .expect("held media")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(!held_media.contains(&own_hash), "the victim's image left the restored copy");
    assert_eq!(held_media.len(), 1, "the shared image stays: another user names it");
    assert!(store.get(&live_key, Default::default()).await.is_err(), "the live session is gone");
}

/// A service role bound to one app lists only that app's archive, is
/// refused another's, and may not restore (only the owner does).
#[tokio::test(flavor = "multi_thread")]
async fn archive_catalog_is_per_tenant_and_restore_is_the_owners() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    let store = store(db.url()).await;
    let mut conn = diesel(db.url()).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let day = days_ago(61);
    let people = users("t", 2);
    for app in ["tenant-a", "tenant-b", "tenant-c"] {
        seed(&sql, &store, &DaySeed { app, day, users: &people, sessions: 1, events: 10, images: &[] }).await;
    }
    // tenant-c is not covered: its part of the day goes unarchived.
    archive_to(&mut conn, &file_url(dir.path()), Some(&["tenant-a", "tenant-b"])).await;
    let report = maintain(db.url(), retiring(day), &config_with(ArchiveConfig::default())).await;
    let archived: Vec<&str> = report.archived.iter().map(|a| a.app_name.as_str()).collect();
    assert_eq!(archived, ["tenant-a", "tenant-b"], "{report}");
    assert_eq!(report.dropped, vec![partition(day)], "{report}");
    assert!(!dir.path().join("app=tenant-c").exists());

    let (_role, role_url) = service_role(db.url(), "archive_reader", AppBinding::Apps(vec!["tenant-a".into()])).await;
    let mut as_role = diesel(&role_url).await;
    let own = list_archive(&mut as_role, Some("tenant-a"), Some("tenant-a")).await.expect("its own app's archive");
    assert_eq!(own.len(), 1, "{own:?}");
    assert!(own.iter().all(|o| o.app_name == "tenant-a"), "{own:?}");
    for (tenant, app) in [(Some("tenant-b"), Some("tenant-b")), (Some("tenant-a"), Some("tenant-b")), (None, None)] {
        let error = list_archive(&mut as_role, tenant, app).await.expect_err("another app's archive");
        assert!(error.to_string().contains("permission denied"), "{tenant:?} {app:?}: {error}");
    }
    let role_sql = client(&role_url).await;
    let error =
        role_sql.query("SELECT * FROM adk_archive_list('tenant-b', 'tenant-b')", &[]).await.expect_err("refused");
    assert_eq!(error.code(), Some(&SqlState::INSUFFICIENT_PRIVILEGE), "{error}");
    let error = restore_day(&mut as_role, "tenant-a", day, "mine", &StoreOptions::default())
        .await
        .expect_err("restoring is the owner's");
    assert!(matches!(error, ArchiveError::NotOwner { .. }), "{error}");
    let error = erase_user(&mut as_role, "tenant-a", "t00", None, &StoreOptions::default())
        .await
        .expect_err("erasing the archive is the owner's");
    assert!(matches!(error, ArchiveError::NotOwner { .. }), "{error}");
    // The owner sees both.
    assert_eq!(list_archive(&mut conn, None, None).await.expect("owner").len(), 2);
}
