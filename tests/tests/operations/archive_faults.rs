//! The archive's objects going wrong between runs: a byte flipped on disk,
//! a run killed after its uploads but before its catalog rows, a disk too
//! small for the day. Each time the day stays in the log until an archive
//! of it reads back whole.

use std::path::{Path, PathBuf};
use std::process::Command;

use adk_postgres_archive::{
    ArchiveConfig, ArchiveError, Destination, StoreOptions, archive_app_day, restore_day, verify_archive,
};
use adk_postgres_testing::test_database;
use adk_postgres_tests::pg::{client, diesel, lock_waiter, store};

use super::archive::{
    DaySeed, archive_to, config_with, days_ago, file_url, files_below, maintain, partition, partition_exists,
    qualified_partition, restore_and_compare, retiring, seed, snapshot, users,
};
use adk_postgres_tests::conformance::media_bytes;

/// A flipped byte in an archived object: `verify_archive` names the object,
/// and the maintenance run that finds the day recorded reads it back, sees
/// the mismatch and archives the day again before it drops it.
#[tokio::test(flavor = "multi_thread")]
async fn archive_corrupted_on_disk_is_found_and_archived_again_before_the_drop() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    let store = store(db.url()).await;
    let mut conn = diesel(db.url()).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let url = file_url(dir.path());
    let (app, day) = ("flipped", days_ago(61));
    let people = users("f", 4);
    let images = [(0, media_bytes(70_000, 1))];
    seed(&sql, &store, &DaySeed { app, day, users: &people, sessions: 2, events: 50, images: &images }).await;
    snapshot(&sql, day.succ_opt().expect("next day")).await;
    archive_to(&mut conn, &url, None).await;
    let destination = Destination::open(&url).expect("destination");
    let written = archive_app_day(
        &mut conn,
        &destination,
        &qualified_partition(&sql, day).await,
        app,
        day,
        &ArchiveConfig::default(),
    )
    .await
    .expect("archive the day");
    assert_eq!((written.events, written.objects), (4 * 2 * 50 + 1, 2));
    let options = StoreOptions::default();
    let clean = verify_archive(&mut conn, None, None, &options).await.expect("verify");
    assert!(clean.iter().all(|c| c.problem.is_none()), "{clean:?}");

    let events = dir.path().join(format!("app={app}/day={day}/events-0000.parquet"));
    let mut bytes = std::fs::read(&events).expect("read the object");
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x5a;
    std::fs::write(&events, &bytes).expect("flip a byte");

    let checks = verify_archive(&mut conn, None, Some(app), &options).await.expect("verify");
    let bad: Vec<(&str, &str)> = checks
        .iter()
        .filter_map(|c| c.problem.as_deref().map(|problem| (c.object.object_key.as_str(), problem)))
        .collect();
    assert_eq!(bad.len(), 1, "{checks:?}");
    assert_eq!(bad[0].0, format!("app={app}/day={day}/events-0000.parquet"));
    assert!(bad[0].1.contains("SHA-256"), "{}", bad[0].1);
    let error = restore_day(&mut conn, app, day, "flipped_copy", &options).await.expect_err("a bad object");
    assert!(matches!(error, ArchiveError::Unverified { .. }), "{error}");

    let report = maintain(db.url(), retiring(day), &config_with(ArchiveConfig::default())).await;
    assert!(report.archive_failed.is_empty(), "{report}");
    assert_eq!(report.archived.len(), 1, "{report}");
    assert!(!report.archived[0].already_archived, "the bad object was written again, not trusted");
    assert_eq!(report.dropped, vec![partition(day)]);
    let checks = verify_archive(&mut conn, None, Some(app), &options).await.expect("verify");
    assert!(checks.iter().all(|c| c.problem.is_none()), "{checks:?}");
    restore_and_compare(&mut conn, &sql, &options, app, day, "flipped_copy").await;
}

/// A run killed after its uploads but before its catalog rows (the objects
/// written, no row names them), in smaller parts than the next run writes:
/// the next run archives the day again, leaves exactly its own parts and
/// the manifest in the folder, and drops the day once they verify.
#[tokio::test(flavor = "multi_thread")]
async fn archive_killed_before_its_catalog_leaves_no_duplicates_after_the_rerun() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    let store = store(db.url()).await;
    let mut conn = diesel(db.url()).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let url = file_url(dir.path());
    let (app, day) = ("killed", days_ago(61));
    let people = users("k", 6);
    let images = [(0, media_bytes(70_000, 1)), (5, media_bytes(72_000, 2))];
    seed(&sql, &store, &DaySeed { app, day, users: &people, sessions: 2, events: 80, images: &images }).await;
    snapshot(&sql, day.succ_opt().expect("next day")).await;
    archive_to(&mut conn, &url, None).await;
    let destination = Destination::open(&url).expect("destination");
    let small =
        ArchiveConfig { part_bytes: 16 << 10, batch_rows: 100, row_group_rows: 100, ..ArchiveConfig::default() };
    let interrupted = archive_app_day(&mut conn, &destination, &qualified_partition(&sql, day).await, app, day, &small)
        .await
        .expect("the interrupted run's uploads");
    assert!(interrupted.objects > 3, "{interrupted:?}");
    sql.execute("DELETE FROM adk_archive_objects WHERE app_name = $1 AND day = $2", &[&app, &day])
        .await
        .expect("the catalog rows it never wrote");
    let left = files_below(dir.path());
    assert_eq!(left.len(), interrupted.objects + 1, "its parts and manifest: {left:?}");

    let report = maintain(db.url(), retiring(day), &config_with(ArchiveConfig::default())).await;
    assert!(report.archive_failed.is_empty(), "{report}");
    assert_eq!(report.archived.len(), 1, "{report}");
    assert!(!report.archived[0].already_archived, "nothing recorded: archived again");
    assert_eq!(report.dropped, vec![partition(day)]);
    assert!(!partition_exists(&sql, day).await);

    let keys: Vec<String> = sql
        .query("SELECT object_key FROM adk_archive_objects WHERE app_name = $1 AND day = $2 ORDER BY 1", &[&app, &day])
        .await
        .expect("catalog")
        .iter()
        .map(|r| r.get(0))
        .collect();
    let folder = format!("app={app}/day={day}");
    assert_eq!(keys, [format!("{folder}/events-0000.parquet"), format!("{folder}/media-0000.parquet")]);
    let mut expected: Vec<String> = keys.clone();
    expected.push(format!("{folder}/manifest.json"));
    expected.sort();
    assert_eq!(files_below(dir.path()), expected, "exactly the recorded parts and the manifest");
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join(&folder).join("manifest.json")).expect("manifest"))
            .expect("manifest JSON");
    assert_eq!(manifest["events"], serde_json::json!(6 * 2 * 80 + 2));
    assert_eq!(manifest["objects"].as_array().map(Vec::len), Some(2), "{manifest}");
    let checks = verify_archive(&mut conn, None, Some(app), &StoreOptions::default()).await.expect("verify");
    assert!(checks.iter().all(|c| c.problem.is_none()), "{checks:?}");
    restore_and_compare(&mut conn, &sql, &StoreOptions::default(), app, day, "after_kill").await;
}

/// A 1 MiB tmpfs, unmounted when dropped (a failed assertion too).
struct SmallDisk {
    // Holds the mount point; removed after the unmount.
    _dir: tempfile::TempDir,
    mount: PathBuf,
}

impl SmallDisk {
    /// `None` when this process may not mount (not root).
    fn mount() -> Option<Self> {
        let status = std::fs::read_to_string("/proc/self/status").expect("status");
        let root = status.lines().any(|line| line.split_whitespace().take(2).eq(["Uid:", "0"]));
        if !root {
            return None;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let mount = dir.path().join("disk");
        std::fs::create_dir(&mount).expect("mount point");
        let status =
            Command::new("mount").args(["-t", "tmpfs", "-o", "size=1M", "tmpfs"]).arg(&mount).status().expect("mount");
        assert!(status.success(), "mount a 1 MiB tmpfs at {}: {status}", mount.display());
        Some(Self { _dir: dir, mount })
    }

    fn path(&self) -> &Path {
        &self.mount
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        // Before the folder it is mounted in goes (the fields drop after).
        let _ = Command::new("umount").arg(&self.mount).status();
    }
}

/// A destination on a disk smaller than the day: the archive fails as full
/// storage (a typed error, and the run's report says so), and the day is
/// kept and the failure recorded.
#[tokio::test(flavor = "multi_thread")]
async fn archive_to_a_full_disk_is_storage_full_and_keeps_the_day() {
    let Some(disk) = SmallDisk::mount() else {
        eprintln!("skipped: mounting a tmpfs needs root");
        return;
    };
    let db = test_database().await;
    let sql = client(db.url()).await;
    let store = store(db.url()).await;
    let mut conn = diesel(db.url()).await;
    let url = file_url(&disk.path().join("archive"));
    let (app, day) = ("full", days_ago(61));
    let people = users("d", 3);
    // Random bytes do not compress: 2 MiB of media for a 1 MiB disk.
    let images: Vec<(usize, Vec<u8>)> = (0..4).map(|n| (n % 3, media_bytes(512 << 10, 40 + n as u64))).collect();
    seed(&sql, &store, &DaySeed { app, day, users: &people, sessions: 1, events: 20, images: &images }).await;
    archive_to(&mut conn, &url, None).await;

    let destination = Destination::open(&url).expect("destination");
    let error = archive_app_day(
        &mut conn,
        &destination,
        &qualified_partition(&sql, day).await,
        app,
        day,
        &ArchiveConfig::default(),
    )
    .await
    .expect_err("the day does not fit");
    assert!(matches!(error, ArchiveError::StorageFull { .. }), "{error:?}");
    assert!(error.is_retryable());

    let report = maintain(db.url(), retiring(day), &config_with(ArchiveConfig::default())).await;
    assert!(report.archived.is_empty(), "{report}");
    assert_eq!(report.archive_failed.len(), 1, "{report}");
    assert!(report.archive_failed[0].error.contains("storage is full"), "{report}");
    assert!(report.dropped.is_empty(), "{report}");
    assert!(partition_exists(&sql, day).await, "the day is kept");
    let open: i64 = sql
        .query_one(
            "SELECT count(*) FROM adk_archive_failures WHERE app_name = $1 AND day = $2 AND resolved_at IS NULL",
            &[&app, &day],
        )
        .await
        .expect("failures")
        .get(0);
    assert_eq!(open, 1);
    let events: i64 = sql
        .query_one("SELECT count(*) FROM adk_events WHERE app_name = $1 AND session_day = $2", &[&app, &day])
        .await
        .expect("events")
        .get(0);
    assert_eq!(events, 3 * 20 + 4, "every event of the day is still there");
    assert!(
        sql.query("SELECT 1 FROM adk_archive_objects WHERE app_name = $1", &[&app]).await.expect("catalog").is_empty(),
        "nothing recorded"
    );
    drop(disk);
}

/// Restoring a day again while the earlier copy is being analyzed (what
/// autovacuum does after a restore's inserts): the ANALYZE holds a lock the
/// restore needs and ends by updating the copy's `pg_class` row, so a
/// restore that updated that row before taking the lock deadlocks with it.
/// It must wait for the ANALYZE instead.
#[tokio::test(flavor = "multi_thread")]
async fn archive_restore_again_waits_for_an_analyze_of_the_copy_without_deadlock() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    let store = store(db.url()).await;
    let mut conn = diesel(db.url()).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let url = file_url(dir.path());
    let (app, day) = ("analyzed", days_ago(61));
    let people = users("a", 2);
    seed(&sql, &store, &DaySeed { app, day, users: &people, sessions: 1, events: 30, images: &[] }).await;
    snapshot(&sql, day.succ_opt().expect("next day")).await;
    archive_to(&mut conn, &url, None).await;
    let destination = Destination::open(&url).expect("destination");
    let partition = qualified_partition(&sql, day).await;
    archive_app_day(&mut conn, &destination, &partition, app, day, &ArchiveConfig::default()).await.expect("archive");
    restore_and_compare(&mut conn, &sql, &StoreOptions::default(), app, day, "analyzed_copy").await;

    // The ANALYZE's lock, held while the restore starts.
    let analyzer = client(db.url()).await;
    analyzer
        .batch_execute("BEGIN; LOCK analyzed_copy.adk_restored_events IN SHARE UPDATE EXCLUSIVE MODE")
        .await
        .expect("the lock ANALYZE takes");
    let owner_url = db.url().to_owned();
    let restore = tokio::spawn(async move {
        let mut conn = diesel(&owner_url).await;
        restore_day(&mut conn, app, day, "analyzed_copy", &StoreOptions::default()).await
    });
    lock_waiter(&sql, r#"query LIKE '%CREATE SCHEMA IF NOT EXISTS "analyzed_copy"%'"#).await;
    analyzer.batch_execute("ANALYZE analyzed_copy.adk_restored_events").await.expect("ANALYZE is not deadlocked");
    analyzer.batch_execute("COMMIT").await.expect("commit");
    let report = restore.await.expect("restore task").expect("the restore waited, and ran");
    assert_eq!(report.events, 2 * 30);
    restore_and_compare(&mut conn, &sql, &StoreOptions::default(), app, day, "analyzed_copy").await;
}
