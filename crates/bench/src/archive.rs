//! The archive tier: how fast a retiring day becomes Parquet, how much
//! smaller it gets, how much memory that takes, how fast a day comes back,
//! and what an erasure from a month of archive costs.
//!
//! Every day is seeded as the owner with `INSERT … SELECT` straight into its
//! partition (untimed): sessions of 40 events, two sessions a user, users
//! with random-looking ids, each event about 4 kB of JSON shaped as adk
//! stores a model turn (a text part, a function call, a state delta, usage
//! metadata). The text is made of syllables drawn from SHA-512 digests, two
//! pieces an event out of up to 16,384 (half as many as the events seeded,
//! at least 2,048), so it compresses about as well as prose and no two
//! events (and few pieces in a Parquet page) are alike. `--quick`'s small
//! days draw from fewer pieces, so its compression is flattered.
//!
//! - The day: one day past retention, across three apps, archived to a
//!   `file://` directory by `adk-pg maintain` in a child process, as an
//!   operator runs it (archive, read back, record, then detach and drop).
//!   Its wall time gives events/s, and MB/s of the partition it read (its
//!   `pg_total_relation_size`, heap, TOAST and indexes) and of the Parquet
//!   it wrote; its peak memory is the child's high-water mark. The floor
//!   is the leanest read of the same partition, `COPY … TO STDOUT` in
//!   binary drained by the bench just before, on the same warm cache.
//! - Restore: that day's apps loaded back with `restore_day`, in this
//!   process.
//! - Erasure: a month of archived days of one app with many users, and
//!   `erase_user` for a user present in three of them, against the time
//!   to read every object back (`verify_archive`): footers (statistics and
//!   bloom filters) should leave all but the user's days unread.
//!
//! Each figure is a single run except the full read, the median of its
//! runs; there is no timing assertion, only that every step did what it
//! says (events archived, the day dropped, rows restored, the user gone).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use adk_postgres_archive::{ArchiveSetting, StoreOptions};
use adk_postgres_domain::StorePolicy;
use adk_postgres_retention::{MaintenanceConfig, retire_before, run_maintenance};
use anyhow::{Context as _, anyhow, bail, ensure};
use chrono::{Days, NaiveDate};
use serde::Serialize;
use serde_json::Value;
use tokio_postgres::Client;

use crate::run::{log, migrate_ours};
use crate::server::{Server, connect, human_bytes};

const DAY_DATABASE: &str = "adk_bench_archive";
const ERASE_DATABASE: &str = "adk_bench_archive_erase";
/// The schema a restored day goes into.
const RESTORE_SCHEMA: &str = "adk_bench_restored";
/// The apps of the archived day and the share of its sessions (in tenths)
/// each gets; the erasure's month is the first app's.
const APPS: [(&str, u32); 3] = [("support-bot", 5), ("sales-assistant", 3), ("travel-planner", 2)];
/// Events per session.
const EVENTS_PER_SESSION: i64 = 40;
/// The most pieces the events' text is drawn from (two an event).
const TEXT_PIECES: i64 = 16_384;
/// The user erased from the month of archive.
const ERASED_USER: &str = "u-erased-0d9f2c4b7a1e";

/// Sizes of the section.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct ArchivePlan {
    /// Events of the archived day.
    pub day_events: i64,
    /// Days of the erasure's archive, events in each, and how many of them
    /// hold the erased user.
    pub erase_days: u64,
    pub erase_events_per_day: i64,
    pub erase_user_days: u64,
    /// Full reads of the month (`verify_archive`) timed; the median counts.
    pub full_reads: usize,
}

/// The archived day.
#[derive(Debug, Clone, Serialize)]
pub struct DayFigures {
    pub events: i64,
    pub sessions: i64,
    pub apps: usize,
    /// Seeding and `VACUUM (FREEZE, ANALYZE)`, untimed otherwise.
    pub seed_secs: f64,
    /// Average event as JSON text, and as stored (`pg_column_size`, after
    /// TOAST compression), over a sample of 10,000 events.
    pub event_json_bytes: f64,
    pub event_stored_bytes: f64,
    /// The TOAST compression of the partition's `payload` (lz4 since the
    /// store's migration for it, on servers built with lz4).
    pub payload_compression: String,
    /// `pg_total_relation_size` of the day's partition before the run.
    pub partition_bytes: i64,
    /// Objects and bytes of Parquet written (the catalog's sum).
    pub objects: i64,
    pub parquet_bytes: i64,
    /// Wall time of `adk-pg maintain` (archive, read back, record, detach,
    /// drop, the day's sessions deleted).
    pub secs: f64,
    pub events_per_sec: f64,
    /// 10^6 bytes a second.
    pub partition_mb_per_sec: f64,
    pub parquet_mb_per_sec: f64,
    /// partition bytes / Parquet bytes.
    pub compression_ratio: f64,
    /// The child's peak resident set (`getrusage(RUSAGE_CHILDREN)` when it
    /// raised the children's high-water mark, else its `VmHWM` polled).
    pub peak_rss_bytes: Option<u64>,
    pub dropped: Vec<String>,
    /// The floor: the leanest read of the same partition, `COPY … TO STDOUT
    /// (FORMAT binary)` drained by this process, timed just before; and the
    /// bytes it streamed.
    pub copy_out_secs: f64,
    pub copy_out_bytes: u64,
    /// archive time / floor time.
    pub time_vs_copy_out: f64,
}

/// The day loaded back.
#[derive(Debug, Clone, Serialize)]
pub struct RestoreFigures {
    pub events: i64,
    pub objects: usize,
    pub secs: f64,
    pub events_per_sec: f64,
    /// `pg_total_relation_size` of the restored events table.
    pub restored_bytes: i64,
}

/// One user erased from a month of archive.
#[derive(Debug, Clone, Serialize)]
pub struct ErasureFigures {
    pub days: u64,
    pub events: i64,
    pub users: i64,
    pub user_days: u64,
    pub user_events: i64,
    /// The month's event objects and their Parquet bytes.
    pub objects: usize,
    pub parquet_bytes: i64,
    pub skipped_by_footer: usize,
    pub read: usize,
    pub rewritten: usize,
    pub rows_removed: i64,
    pub secs: f64,
    /// Reading every object back (`verify_archive`), median of the runs.
    pub full_read_secs: f64,
    pub full_read_runs: Vec<f64>,
    /// erasure time / full read time.
    pub time_vs_full_read: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct ArchiveReport {
    pub plan: ArchivePlan,
    pub day: DayFigures,
    pub restore: RestoreFigures,
    pub erasure: ErasureFigures,
    pub elapsed_secs: f64,
}

impl std::fmt::Display for ArchiveReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (d, r, e) = (&self.day, &self.restore, &self.erasure);
        writeln!(
            f,
            "Archive (Parquet, zstd, to a file:// directory; events of ~{} JSON, {} stored after {}):",
            human_bytes(d.event_json_bytes),
            human_bytes(d.event_stored_bytes),
            d.payload_compression
        )?;
        writeln!(
            f,
            "  a day of {} events ({} sessions, {} apps) archived and dropped by `adk-pg maintain` (a child \
             process): {:.1} s, {:.0} events/s; partition {} ({:.1} MB/s), Parquet {} in {} object(s) ({:.1} MB/s); \
             compression {:.2}x (partition / Parquet); peak RSS of adk-pg {}; the floor, COPY of the partition \
             to STDOUT (binary, {}): {:.1} s, so archiving took {:.2}x a bare read",
            d.events,
            d.sessions,
            d.apps,
            d.secs,
            d.events_per_sec,
            human_bytes(d.partition_bytes as f64),
            d.partition_mb_per_sec,
            human_bytes(d.parquet_bytes as f64),
            d.objects,
            d.parquet_mb_per_sec,
            d.compression_ratio,
            d.peak_rss_bytes.map_or_else(|| "?".to_owned(), |b| format!("{:.0} MiB", b as f64 / (1 << 20) as f64)),
            human_bytes(d.copy_out_bytes as f64),
            d.copy_out_secs,
            d.time_vs_copy_out,
        )?;
        writeln!(
            f,
            "  restore_day of that day ({} objects): {} events in {:.1} s, {:.0} events/s; restored table {}",
            r.objects,
            r.events,
            r.secs,
            r.events_per_sec,
            human_bytes(r.restored_bytes as f64)
        )?;
        writeln!(
            f,
            "  erase_user over {} archived days ({} events, {} users, {} of Parquet), the user in {} of them ({} \
             events): {} objects, {} skipped by footer, {} read, {} rewritten, {} rows removed: {:.2} s; reading \
             every object (verify_archive, median of {}): {:.2} s; erasure / full read {:.2}x",
            e.days,
            e.events,
            e.users,
            human_bytes(e.parquet_bytes as f64),
            e.user_days,
            e.user_events,
            e.objects,
            e.skipped_by_footer,
            e.read,
            e.rewritten,
            e.rows_removed,
            e.secs,
            e.full_read_runs.len(),
            e.full_read_secs,
            e.time_vs_full_read
        )?;
        write!(f, "  took {:.0} s (seeding included)", self.elapsed_secs)
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

fn partition_of(day: NaiveDate) -> String {
    format!("adk_events_p{}", day.format("%Y%m%d"))
}

/// The pieces the events' text is drawn from: syllables of SHA-512
/// digests, about 1.2 to 2.3 kB each, in an unlogged table every seeding
/// connection reads; as many as suit `events` events. Returns how many.
async fn make_text_pieces(sql: &Client, events: i64) -> anyhow::Result<i64> {
    let pieces = (events / 2).clamp(2_048, TEXT_PIECES);
    let digests: Vec<String> =
        (1..=7).map(|i| format!("sha512(int4send(k) || '\\x{i:02x}'::bytea)")).collect::<Vec<_>>();
    let syllables = [
        ("0", "lo"),
        ("1", "mi"),
        ("2", "nu"),
        ("3", "ro"),
        ("4", "si"),
        ("5", "tu"),
        ("6", "ko"),
        ("7", "pi"),
        ("8", "ju"),
        ("9", "vo"),
        ("a", "hi"),
        ("b", "zu"),
        ("c", "no "),
        ("d", "ti "),
        ("e", "gu "),
        ("f", "wo. "),
    ];
    // The syllables hold no hex digit, so the order of the replacements is free.
    let mut text = format!("substr(encode({}, 'hex'), 1, 512 + (hashint4(k) & 511))", digests.join(" || "));
    for (digit, syllable) in syllables {
        text = format!("replace({text}, '{digit}', '{syllable}')");
    }
    sql.batch_execute(&format!(
        "DROP TABLE IF EXISTS bench_archive_text;
         CREATE UNLOGGED TABLE bench_archive_text (k int PRIMARY KEY, text text NOT NULL);
         INSERT INTO bench_archive_text SELECT k, {text} FROM generate_series(0, {}) k;
         ANALYZE bench_archive_text;",
        pieces - 1
    ))
    .await
    .context("making the text pieces")?;
    Ok(pieces)
}

/// Sessions `[0, sessions)` of `day`, those whose app (by tenths of the
/// session number, as `apps` shares them) is `app`. Users have two
/// sessions each; the first two sessions of a day are `erased_user`'s when
/// given.
async fn seed_app_day(
    sql: &Client,
    day: NaiveDate,
    sessions: i64,
    apps: &[(&str, u32)],
    app: &str,
    erased_user: Option<&str>,
    pieces: i64,
) -> anyhow::Result<u64> {
    let mut app_case = String::from("CASE");
    let mut upper = 0;
    for (name, share) in apps {
        upper += share;
        app_case.push_str(&format!(" WHEN s % 10 < {upper} THEN '{name}'"));
    }
    app_case.push_str(" END");
    let user = "CASE WHEN s < 2 AND $4::text IS NOT NULL THEN $4::text
                     ELSE 'u-' || left(md5($1::date::text || '-' || (s / 2)), 20) END";
    let partition = partition_of(day);
    // A session's events start at a time of the day of its own, 7 s apart.
    sql.execute(
        &format!(
            "INSERT INTO adk_sessions (app_name, user_id, session_id, session_day, last_seq, state, labels,
                                       created_at, updated_at)
             SELECT x.app, x.user_id, x.session_id, $1::date, $5::bigint, '{{\"channel\": \"web\", \"locale\": \"en-GB\"}}',
                    '{{\"tier\": \"pro\"}}', to_timestamp(x.start_ns / 1e9),
                    to_timestamp((x.start_ns + $5::bigint * 7000000000) / 1e9)
               FROM (SELECT {app_case} AS app, {user} AS user_id, md5('session-' || $1::date::text || '-' || s)::uuid::text
                            AS session_id,
                            extract(epoch FROM $1::date)::bigint * 1000000000
                              + ((hashint8(s) & 2147483647) % 80000)::bigint * 1000000000 AS start_ns
                       FROM generate_series(0, $2::bigint - 1) s) x
              WHERE x.app = $3::text"
        ),
        &[&day, &sessions, &app, &erased_user, &EVENTS_PER_SESSION],
    )
    .await
    .with_context(|| format!("seeding the sessions of {app} on {day}"))?;
    let inserted = sql
        .execute(
            &format!(
                "INSERT INTO {partition} (app_name, user_id, session_id, session_day, seq, event_id, invocation_id,
                                          author, event_ts, created_at, payload)
                 SELECT s.app_name, s.user_id, s.session_id, $1::date, e.n, e.id, e.inv, e.author, e.ts,
                        to_timestamp(e.ts / 1e9),
                        jsonb_build_object(
                            'id', e.id,
                            'invocation_id', e.inv,
                            'author', e.author,
                            'timestamp', to_char(to_timestamp(e.ts / 1e9) AT TIME ZONE 'UTC',
                                                 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'),
                            'content', jsonb_build_object(
                                'role', CASE WHEN e.author = 'user' THEN 'user' ELSE 'model' END,
                                'parts', jsonb_build_array(
                                    jsonb_build_object('text', a.text || ' ' || b.text),
                                    jsonb_build_object('function_call', jsonb_build_object(
                                        'id', 'call-' || e.id, 'name', 'lookup_order',
                                        'args', jsonb_build_object('order', 'A-' || (hashint8(e.ts) & 16777215),
                                                                   'include', jsonb_build_array('items', 'shipping')))))),
                            'actions', jsonb_build_object('state_delta',
                                jsonb_build_object('turn', e.n, 'last_author', e.author)),
                            'turn_complete', e.author <> 'user',
                            'usage_metadata', jsonb_build_object(
                                'prompt_token_count', 800 + e.n * 90,
                                'candidates_token_count', 120 + (hashint8(e.ts) & 511),
                                'total_token_count', 920 + e.n * 90 + (hashint8(e.ts) & 511)))
                   FROM adk_sessions s
                   CROSS JOIN LATERAL (
                        SELECT n, md5(s.session_id || '-' || n)::uuid::text AS id, 'inv-' || (n / 4) AS inv,
                               CASE WHEN n % 2 = 1 THEN 'user' ELSE 'support' END AS author,
                               extract(epoch FROM s.created_at)::bigint * 1000000000 + n * 7000000000 AS ts
                          FROM generate_series(1, s.last_seq) n) e
                   JOIN bench_archive_text a ON a.k = (hashint8(e.ts) & 2147483647) % {pieces}
                   JOIN bench_archive_text b ON b.k = (hashint8(-e.ts) & 2147483647) % {pieces}
                  WHERE s.app_name = $2::text AND s.session_day = $1::date"
            ),
            &[&day, &app],
        )
        .await
        .with_context(|| format!("seeding the events of {app} on {day}"))?;
    Ok(inserted)
}

/// Seeds `events` events of `day` across `apps`, each app on a connection
/// of its own, at once.
async fn seed_day(
    url: &str,
    day: NaiveDate,
    events: i64,
    apps: &[(&'static str, u32)],
    erased_user: Option<&'static str>,
    pieces: i64,
) -> anyhow::Result<u64> {
    let sessions = (events / EVENTS_PER_SESSION).max(1);
    let apps: Vec<(&'static str, u32)> = apps.to_vec();
    let mut tasks = Vec::new();
    for &(app, _) in &apps {
        let (url, apps) = (url.to_owned(), apps.clone());
        tasks.push(tokio::spawn(async move {
            let sql = connect(&url).await?;
            seed_app_day(&sql, day, sessions, &apps, app, erased_user, pieces).await
        }));
    }
    let mut inserted = 0;
    for task in tasks {
        inserted += task.await??;
    }
    Ok(inserted)
}

/// Where the release build keeps `adk-pg`: `ADK_PG_BIN`, or beside this
/// binary (`cargo xtask bench` builds it first).
fn adk_pg_binary() -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os("ADK_PG_BIN") {
        return Ok(PathBuf::from(path));
    }
    let exe = std::env::current_exe().context("locating the bench binary")?;
    let mut dirs = exe.ancestors().skip(1).take(2);
    let found = dirs.find_map(|dir| Some(dir.join("adk-pg")).filter(|p| p.is_file()));
    found.ok_or_else(|| {
        anyhow!(
            "adk-pg is not beside {}: build it with `cargo build --release -p adk-pg` (cargo xtask bench does), \
             or name it in ADK_PG_BIN",
            exe.display()
        )
    })
}

/// The children's high-water mark so far (`getrusage(RUSAGE_CHILDREN)`), in bytes.
fn children_max_rss() -> Option<u64> {
    let usage = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN).ok()?;
    // Linux reports kilobytes.
    u64::try_from(usage.max_rss()).ok().map(|kb| kb * 1024)
}

/// `VmHWM` of a running process, in bytes.
fn vm_hwm(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb = status.lines().find_map(|l| l.strip_prefix("VmHWM:"))?.split_whitespace().next()?.parse::<u64>().ok()?;
    Some(kb * 1024)
}

/// What a child run of `adk-pg maintain` came to.
struct Maintained {
    secs: f64,
    report: Value,
    peak_rss_bytes: Option<u64>,
}

/// Runs `adk-pg maintain --once --json --today <today>` on `url` and waits,
/// watching its memory.
async fn maintain_in_child(url: &str, today: NaiveDate) -> anyhow::Result<Maintained> {
    let binary = adk_pg_binary()?;
    let before = children_max_rss();
    let began = Instant::now();
    let child = tokio::process::Command::new(&binary)
        .args(["maintain", "--once", "--json", "--today"])
        .arg(today.to_string())
        .env("DATABASE_URL", url)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", binary.display()))?;
    let pid = child.id().ok_or_else(|| anyhow!("adk-pg exited at once"))?;
    let polled = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let poll = {
        let polled = std::sync::Arc::clone(&polled);
        tokio::spawn(async move {
            loop {
                if let Some(hwm) = vm_hwm(pid) {
                    polled.fetch_max(hwm, std::sync::atomic::Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let output = child.wait_with_output().await;
    let secs = began.elapsed().as_secs_f64();
    poll.abort();
    let output = output.context("waiting for adk-pg maintain")?;
    if !output.status.success() {
        bail!(
            "adk-pg maintain failed ({}): {}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let report: Value = serde_json::from_slice(&output.stdout).with_context(|| {
        format!("adk-pg maintain printed no JSON report: {}", String::from_utf8_lossy(&output.stdout))
    })?;
    // The children's high-water mark moved: this child set it. Otherwise an
    // earlier child (pgbench) peaked higher and the polled VmHWM stands.
    let polled = polled.load(std::sync::atomic::Ordering::Relaxed);
    let rusage = match (before, children_max_rss()) {
        (Some(before), Some(after)) if after > before => Some(after),
        _ => None,
    };
    let peak_rss_bytes = match (rusage, polled) {
        (Some(r), p) => Some(r.max(p)),
        (None, 0) => None,
        (None, p) => Some(p),
    };
    Ok(Maintained { secs, report, peak_rss_bytes })
}

/// Drains `COPY <partition> TO STDOUT (FORMAT binary)`: the time and the
/// bytes of reading the partition with nothing done to it.
async fn copy_out(sql: &Client, partition: &str) -> anyhow::Result<(f64, u64)> {
    use futures_util::TryStreamExt as _;
    let began = Instant::now();
    let stream = sql.copy_out(&format!("COPY {partition} TO STDOUT (FORMAT binary)")).await?;
    let bytes = stream.try_fold(0_u64, |sum, chunk| async move { Ok(sum + chunk.len() as u64) }).await?;
    Ok((began.elapsed().as_secs_f64(), bytes))
}

async fn one_i64(sql: &Client, query: &str, day: NaiveDate) -> anyhow::Result<i64> {
    Ok(sql.query_one(query, &[&day]).await.with_context(|| query.to_owned())?.get(0))
}

/// The day: seeded, archived and dropped by `adk-pg maintain`, then restored.
async fn measure_day(
    server: &Server,
    today: NaiveDate,
    plan: ArchivePlan,
    archive_dir: &std::path::Path,
) -> anyhow::Result<(DayFigures, RestoreFigures)> {
    let url = server.fresh_database(DAY_DATABASE).await?;
    migrate_ours(&url, today).await?;
    let sql = connect(&url).await?;
    // Past lifetime + retention of the policy a fresh migration installs.
    let day = retire_before(&StorePolicy::default(), today).checked_sub_days(Days::new(3)).expect("a date");
    log(format!("archive: seeding a day of {} events across {} apps (untimed)", plan.day_events, APPS.len()));
    let began = Instant::now();
    sql.execute("SELECT adk_ensure_event_partition($1)", &[&day]).await?;
    let pieces = make_text_pieces(&sql, plan.day_events).await?;
    let events = i64::try_from(seed_day(&url, day, plan.day_events, &APPS, None, pieces).await?)?;
    let partition = partition_of(day);
    // One statement a call: VACUUM refuses the implicit transaction of several.
    for statement in [
        "DROP TABLE bench_archive_text".to_owned(),
        format!("VACUUM (FREEZE, ANALYZE) {partition}"),
        "VACUUM (ANALYZE) adk_sessions".to_owned(),
    ] {
        sql.batch_execute(&statement).await?;
    }
    let seed_secs = began.elapsed().as_secs_f64();
    let sessions = one_i64(&sql, "SELECT count(*) FROM adk_sessions WHERE session_day = $1", day).await?;
    let row = sql
        .query_one(
            &format!(
                "SELECT avg(length(payload::text))::float8, avg(pg_column_size(payload))::float8
                   FROM (SELECT payload FROM {partition} LIMIT 10000) x"
            ),
            &[],
        )
        .await?;
    let (event_json_bytes, event_stored_bytes): (f64, f64) = (row.get(0), row.get(1));
    let payload_compression: String = sql
        .query_one(
            "SELECT CASE attcompression WHEN 'l' THEN 'lz4' WHEN 'p' THEN 'pglz'
                    ELSE current_setting('default_toast_compression') END
               FROM pg_attribute WHERE attrelid = $1::text::regclass AND attname = 'payload'",
            &[&partition],
        )
        .await?
        .get(0);
    let partition_bytes: i64 =
        sql.query_one(&format!("SELECT pg_total_relation_size('{partition}')"), &[]).await?.get(0);

    let archive_url = url::Url::from_directory_path(archive_dir.join("day"))
        .map_err(|()| anyhow!("{} is not an absolute path", archive_dir.display()))?
        .to_string();
    let mut conn = adk_postgres_connect::establish(&url).await?;
    adk_postgres_archive::set_archive_policy(&mut conn, &ArchiveSetting::On { url: archive_url, apps: None }).await?;
    sql.batch_execute("CHECKPOINT").await?;
    log(format!("archive: the floor, COPY {partition} TO STDOUT (binary)"));
    let (copy_out_secs, copy_out_bytes) = copy_out(&sql, &partition).await?;
    log(format!(
        "archive: adk-pg maintain archives and drops the day ({events} events, {} on disk)",
        human_bytes(partition_bytes as f64)
    ));
    let run = maintain_in_child(&url, today).await?;
    let dropped: Vec<String> = run.report["dropped"]
        .as_array()
        .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect())
        .unwrap_or_default();
    ensure!(dropped.contains(&partition), "adk-pg maintain did not drop {partition}: {}", run.report);
    let failed = run.report["archive_failed"].as_array().map_or(0, Vec::len);
    ensure!(failed == 0, "the archive failed: {}", run.report["archive_failed"]);
    let row = sql
        .query_one(
            "SELECT count(*), coalesce(sum(bytes), 0)::bigint, coalesce(sum(rows) FILTER (WHERE kind = 'events'), 0)::bigint
               FROM adk_archive_objects WHERE day = $1",
            &[&day],
        )
        .await?;
    let (objects, parquet_bytes, archived_rows): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
    ensure!(archived_rows == events, "{archived_rows} events archived of {events}");
    let secs = run.secs;
    let day_figures = DayFigures {
        events,
        sessions,
        apps: APPS.len(),
        seed_secs,
        event_json_bytes,
        event_stored_bytes,
        payload_compression,
        partition_bytes,
        objects,
        parquet_bytes,
        secs,
        events_per_sec: events as f64 / secs,
        partition_mb_per_sec: partition_bytes as f64 / 1e6 / secs,
        parquet_mb_per_sec: parquet_bytes as f64 / 1e6 / secs,
        compression_ratio: partition_bytes as f64 / parquet_bytes.max(1) as f64,
        peak_rss_bytes: run.peak_rss_bytes,
        dropped,
        copy_out_secs,
        copy_out_bytes,
        time_vs_copy_out: secs / copy_out_secs,
    };

    log(format!("archive: restore_day of the day's {} apps", APPS.len()));
    let began = Instant::now();
    let (mut restored, mut restored_objects) = (0, 0);
    for (app, _) in APPS {
        let report =
            adk_postgres_archive::restore_day(&mut conn, app, day, RESTORE_SCHEMA, &StoreOptions::default()).await?;
        restored += report.events;
        restored_objects += report.objects;
    }
    let secs = began.elapsed().as_secs_f64();
    ensure!(restored == events, "{restored} events restored of {events}");
    let restored_bytes: i64 = sql
        .query_one(&format!("SELECT pg_total_relation_size('{RESTORE_SCHEMA}.adk_restored_events')"), &[])
        .await?
        .get(0);
    drop((sql, conn));
    server.drop_database(DAY_DATABASE).await?;
    Ok((
        day_figures,
        RestoreFigures {
            events: restored,
            objects: restored_objects,
            secs,
            events_per_sec: restored as f64 / secs,
            restored_bytes,
        },
    ))
}

/// A month of one app's archive, and a user erased from it.
async fn measure_erasure(
    server: &Server,
    today: NaiveDate,
    plan: ArchivePlan,
    archive_dir: &std::path::Path,
) -> anyhow::Result<ErasureFigures> {
    let url = server.fresh_database(ERASE_DATABASE).await?;
    migrate_ours(&url, today).await?;
    let sql = connect(&url).await?;
    let app = APPS[0].0;
    let newest = retire_before(&StorePolicy::default(), today).checked_sub_days(Days::new(1)).expect("a date");
    let days: Vec<NaiveDate> =
        (0..plan.erase_days).map(|back| newest.checked_sub_days(Days::new(back)).expect("a date")).collect();
    // The user's days spread over the month.
    let user_days: Vec<NaiveDate> = (0..plan.erase_user_days)
        .map(|i| days[usize::try_from(i * plan.erase_days / plan.erase_user_days.max(1)).unwrap_or(0)])
        .collect();
    log(format!(
        "archive: seeding {} days of {} events of one app, the erased user in {} of them (untimed)",
        plan.erase_days, plan.erase_events_per_day, plan.erase_user_days
    ));
    let pieces = make_text_pieces(&sql, plan.erase_events_per_day * i64::try_from(plan.erase_days)?).await?;
    let mut events = 0;
    for &day in &days {
        sql.execute("SELECT adk_ensure_event_partition($1)", &[&day]).await?;
        let user = user_days.contains(&day).then_some(ERASED_USER);
        events += i64::try_from(seed_day(&url, day, plan.erase_events_per_day, &[(app, 10)], user, pieces).await?)?;
    }
    for statement in ["DROP TABLE bench_archive_text", "VACUUM (FREEZE, ANALYZE) adk_events, adk_sessions"] {
        sql.batch_execute(statement).await?;
    }
    let users: i64 = sql.query_one("SELECT count(DISTINCT user_id) FROM adk_sessions", &[]).await?.get(0);
    let user_events: i64 =
        sql.query_one("SELECT count(*) FROM adk_events WHERE user_id = $1", &[&ERASED_USER]).await?.get(0);

    let archive_url = url::Url::from_directory_path(archive_dir.join("month"))
        .map_err(|()| anyhow!("{} is not an absolute path", archive_dir.display()))?
        .to_string();
    let mut conn = adk_postgres_connect::establish(&url).await?;
    adk_postgres_archive::set_archive_policy(&mut conn, &ArchiveSetting::On { url: archive_url, apps: None }).await?;
    log(format!("archive: maintenance archives and drops the {} days (untimed)", plan.erase_days));
    let report = run_maintenance(&url, today, &MaintenanceConfig::default()).await?;
    ensure!(report.archive_failed.is_empty(), "archives failed: {:?}", report.archive_failed);
    ensure!(
        report.dropped.len() == days.len(),
        "maintenance dropped {} of {} days: {report:?}",
        report.dropped.len(),
        days.len()
    );
    let parquet_bytes: i64 = sql
        .query_one("SELECT coalesce(sum(bytes), 0)::bigint FROM adk_archive_objects WHERE app_name = $1", &[&app])
        .await?
        .get(0);

    let options = StoreOptions::default();
    let mut full_read_runs = Vec::new();
    for run in 0..plan.full_reads {
        log(format!("archive: reading every object of the month back ({}/{})", run + 1, plan.full_reads));
        let began = Instant::now();
        let checks = adk_postgres_archive::verify_archive(&mut conn, None, Some(app), &options).await?;
        full_read_runs.push(began.elapsed().as_secs_f64());
        if let Some(bad) = checks.iter().find(|c| c.problem.is_some()) {
            bail!("an archived object does not verify: {bad:?}");
        }
    }
    log(format!("archive: erase_user over the month's {} objects", report.archived.len()));
    let began = Instant::now();
    let erased = adk_postgres_archive::erase_user(&mut conn, app, ERASED_USER, None, &options).await?;
    let secs = began.elapsed().as_secs_f64();
    ensure!(
        erased.archived_rows_removed == user_events,
        "{} archived rows of the user removed, {user_events} expected",
        erased.archived_rows_removed
    );
    ensure!(erased.rewritten == user_days.len(), "{} objects rewritten: {erased:?}", erased.rewritten);
    drop((sql, conn));
    server.drop_database(ERASE_DATABASE).await?;
    let full_read_secs = median(full_read_runs.clone());
    Ok(ErasureFigures {
        days: plan.erase_days,
        events,
        users,
        user_days: plan.erase_user_days,
        user_events,
        objects: erased.objects,
        parquet_bytes,
        skipped_by_footer: erased.skipped_by_footer,
        read: erased.read,
        rewritten: erased.rewritten,
        rows_removed: erased.archived_rows_removed,
        secs,
        full_read_secs,
        full_read_runs,
        time_vs_full_read: secs / full_read_secs,
    })
}

/// Runs the section on `server`, each part on a database of its own; the
/// archive goes to a temporary directory removed afterwards.
pub async fn measure(server: &Server, today: NaiveDate, plan: ArchivePlan) -> anyhow::Result<ArchiveReport> {
    let began = Instant::now();
    let archive_dir = tempfile::Builder::new().prefix("adk-bench-archive-").tempdir()?;
    let (day, restore) = measure_day(server, today, plan, archive_dir.path()).await?;
    let erasure = measure_erasure(server, today, plan, archive_dir.path()).await?;
    Ok(ArchiveReport { plan, day, restore, erasure, elapsed_secs: began.elapsed().as_secs_f64() })
}
