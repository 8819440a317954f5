//! The data model as migrated: constraints, partitioning, storage settings,
//! the schema.rs mirror and reversible migrations.

use adk_postgres_domain::{AppendOptions, Event, SessionStore as _};
use adk_postgres_schema::migrations::{revert_all_migrations, run_pending_migrations};
use adk_postgres_schema::tables_print::render_schema;
use adk_postgres_testing::{Capability, empty_database, skip_without, test_database};
use adk_postgres_tests::pg::{client, diesel, migrate_through, new_session, server_binary, store};
use futures_util::future::join_all;
use tokio_postgres::Client;

async fn constraint_columns(client: &Client, name: &str) -> Vec<String> {
    let row = client
        .query_one(
            "SELECT array_agg(a.attname::text ORDER BY k.ord)
             FROM pg_constraint c
             CROSS JOIN LATERAL unnest(c.conkey) WITH ORDINALITY k(attnum, ord)
             JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.attnum
             WHERE c.conname = $1 AND c.conrelid = 'adk_events'::regclass",
            &[&name],
        )
        .await
        .expect("constraint columns");
    row.get(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn event_keys_include_session_day() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    let key = ["app_name", "user_id", "session_id", "session_day"];
    assert_eq!(constraint_columns(&sql, "adk_events_pkey").await, [&key[..], &["seq"]].concat());
    assert_eq!(constraint_columns(&sql, "adk_events_event_id_key").await, [&key[..], &["event_id"]].concat());
    let strategy: String = sql
        .query_one(
            "SELECT p.partstrat::text || ':' || a.attname::text FROM pg_partitioned_table p
             JOIN pg_attribute a ON a.attrelid = p.partrelid AND a.attnum = p.partattrs[0]
             WHERE p.partrelid = 'adk_events'::regclass",
            &[],
        )
        .await
        .expect("partition strategy")
        .get(0);
    assert_eq!(strategy, "r:session_day");
    let cascade: String = sql
        .query_one(
            "SELECT confdeltype::text FROM pg_constraint
             WHERE conname = 'adk_events_session_fkey' AND conrelid = 'adk_events'::regclass",
            &[],
        )
        .await
        .expect("foreign key")
        .get(0);
    assert_eq!(cascade, "c", "the event foreign key must cascade on delete");
}

#[tokio::test(flavor = "multi_thread")]
async fn there_is_no_default_partition() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    let default_oid: u32 = sql
        .query_one("SELECT partdefid::oid FROM pg_partitioned_table WHERE partrelid = 'adk_events'::regclass", &[])
        .await
        .expect("partitioned table")
        .get(0);
    assert_eq!(default_oid, 0);
    let defaults: i64 = sql
        .query_one(
            "SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
             WHERE i.inhparent = 'adk_events'::regclass AND pg_get_expr(c.relpartbound, c.oid) = 'DEFAULT'",
            &[],
        )
        .await
        .expect("partition bounds")
        .get(0);
    assert_eq!(defaults, 0);
}

/// The last migration before payloads were compressed with lz4 (migration
/// 2026-12-05-000028_payload_lz4).
const BEFORE_PAYLOAD_LZ4: &str = "20261205000027";

/// `payload`'s compression method on `adk_events` and each partition, by
/// table: `l` for lz4, `p` for pglz, empty for the server's default.
async fn payload_compression(sql: &Client) -> Vec<(String, String)> {
    sql.query(
        "SELECT c.relname::text, a.attcompression::text
           FROM pg_partition_tree('adk_events') t
           JOIN pg_class c ON c.oid = t.relid
           JOIN pg_attribute a ON a.attrelid = t.relid AND a.attname = 'payload'
          ORDER BY 1",
        &[],
    )
    .await
    .expect("payload compression")
    .iter()
    .map(|row| (row.get(0), row.get(1)))
    .collect()
}

/// Every table of the log compresses `payload` with lz4.
async fn assert_lz4_everywhere(sql: &Client) {
    let tables = payload_compression(sql).await;
    assert!(tables.len() >= 2, "adk_events and today's partition at least: {tables:?}");
    let other: Vec<_> = tables.iter().filter(|(_, method)| method != "l").collect();
    assert!(other.is_empty(), "payload is not lz4 on {other:?}");
}

/// An event whose payload TOAST compresses: ~12 kB of text that repeats.
fn long_answer() -> Event {
    let mut event = Event::new("agent");
    let text: String = (0..400).map(|i| format!("line {i} of a long answer, ")).collect();
    event.content = Some(serde_json::json!({"role": "model", "parts": [{"text": text}]}));
    event
}

/// How each stored payload of a user's events is compressed, by seq.
async fn compression_of_events(sql: &Client, user: &str) -> Vec<Option<String>> {
    sql.query("SELECT pg_column_compression(payload) FROM adk_events WHERE user_id = $1 ORDER BY seq", &[&user])
        .await
        .expect("pg_column_compression")
        .iter()
        .map(|row| row.get(0))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn event_payloads_are_compressed_with_lz4() {
    if skip_without(Capability::Lz4).await {
        return;
    }
    let db = test_database().await;
    let sql = client(db.url()).await;
    // The parent and every premade day.
    assert_lz4_everywhere(&sql).await;
    let store = store(db.url()).await;
    let key = new_session(&store, "app", "lz4-user").await;
    let stored = store.append(&key, long_answer(), AppendOptions::default()).await.expect("append");
    assert_eq!(compression_of_events(&sql, "lz4-user").await, [Some("lz4".to_owned())]);
    let loaded = store.get(&key, Default::default()).await.expect("get");
    assert_eq!(loaded.events.last().map(|e| &e.content), Some(&stored.event.content));
}

/// Rows of the relation and of its TOAST table stay in the same files.
async fn files_of_partitions(sql: &Client) -> Vec<(String, u32, Option<u32>)> {
    sql.query(
        "SELECT c.relname::text, pg_relation_filenode(c.oid)::oid, pg_relation_filenode(nullif(c.reltoastrelid, 0))::oid
           FROM pg_partition_tree('adk_events') t JOIN pg_class c ON c.oid = t.relid
          WHERE t.isleaf ORDER BY 1",
        &[],
    )
    .await
    .expect("relfilenodes")
    .iter()
    .map(|row| (row.get(0), row.get(1), row.get(2)))
    .collect()
}

/// Event `seq` of user `before`'s session, ~12 kB of text that repeats,
/// written as the owner straight into today's partition.
async fn insert_long_event(sql: &Client, seq: i64) {
    sql.execute(
        "INSERT INTO adk_events (app_name, user_id, session_id, session_day, seq, event_id, author, event_ts, payload)
         SELECT 'app', 'before', 'before', (now() AT TIME ZONE 'UTC')::date, $1::bigint, 'e' || $1::bigint, 'agent', $1::bigint,
                jsonb_build_object('id', 'e' || $1::bigint, 'author', 'agent', 'timestamp', '2026-12-05T12:00:00Z',
                                   'text', (SELECT string_agg('line ' || g || ' of a long answer', ', ')
                                              FROM generate_series(1, 400) g))",
        &[&seq],
    )
    .await
    .expect("a long event");
}

#[tokio::test(flavor = "multi_thread")]
async fn compressing_payloads_with_lz4_rewrites_nothing_stored() {
    if skip_without(Capability::Lz4).await {
        return;
    }
    let db = empty_database().await;
    migrate_through(db.url(), BEFORE_PAYLOAD_LZ4).await;
    let sql = client(db.url()).await;
    sql.batch_execute(
        "INSERT INTO adk_sessions (app_name, user_id, session_id, session_day, last_seq, created_at, updated_at)
         VALUES ('app', 'before', 'before', (now() AT TIME ZONE 'UTC')::date, 2, now(), now())",
    )
    .await
    .expect("a session");
    insert_long_event(&sql, 1).await;
    assert_eq!(
        compression_of_events(&sql, "before").await,
        [Some("pglz".to_owned())],
        "before the migration payloads take the server's default (pglz)"
    );
    let files = files_of_partitions(&sql).await;
    assert!(!files.is_empty());

    run_pending_migrations(db.url()).await.expect("the migration to lz4");
    // The catalog changed; the partitions' files, and what they hold, did not.
    assert_lz4_everywhere(&sql).await;
    let after: Vec<_> =
        files_of_partitions(&sql).await.into_iter().filter(|(name, ..)| files.iter().any(|f| &f.0 == name)).collect();
    assert_eq!(after, files, "a partition (or its TOAST table) was rewritten");
    // The row written before keeps pglz; the next one in the same
    // partition is lz4.
    insert_long_event(&sql, 2).await;
    assert_eq!(compression_of_events(&sql, "before").await, [Some("pglz".to_owned()), Some("lz4".to_owned())]);
}

#[tokio::test(flavor = "multi_thread")]
async fn sessions_are_built_for_hot_updates() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    let options: Vec<String> = sql
        .query_one("SELECT coalesce(reloptions, '{}') FROM pg_class WHERE oid = 'adk_sessions'::regclass", &[])
        .await
        .expect("reloptions")
        .get(0);
    assert!(options.contains(&"fillfactor=80".to_owned()), "{options:?}");
    // Every column that an append changes must stay out of every index, or
    // the update stops being HOT.
    let indexed: Vec<String> = sql
        .query_one(
            "SELECT coalesce(array_agg(DISTINCT a.attname::text), '{}')
             FROM pg_index i
             JOIN pg_attribute a ON a.attrelid = i.indrelid
              AND (a.attnum = ANY (i.indkey)
                   OR pg_get_expr(i.indexprs, i.indrelid) LIKE '%' || a.attname || '%'
                   OR pg_get_expr(i.indpred, i.indrelid) LIKE '%' || a.attname || '%')
             WHERE i.indrelid = 'adk_sessions'::regclass AND a.attnum > 0",
            &[],
        )
        .await
        .expect("indexed columns")
        .get(0);
    for changing in ["updated_at", "last_seq", "state"] {
        assert!(!indexed.contains(&changing.to_owned()), "{changing} is indexed: {indexed:?}");
    }
    assert!(indexed.contains(&"expires_at".to_owned()), "the expiry index is missing: {indexed:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn checks_reject_bad_session_rows() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    let insert =
        "INSERT INTO adk_sessions (app_name, user_id, session_id, state) VALUES ('app', 'user', $1, $2::text::jsonb)";
    let big_state = format!("{{\"blob\": \"{}\"}}", "x".repeat(70_000));
    let cases: [(&str, String, &str, &str); 4] = [
        ("empty session id", String::new(), "{}", "adk_sessions_session_id_sane"),
        ("129-character session id", "s".repeat(129), "{}", "adk_sessions_session_id_sane"),
        ("array state", "ok".into(), "[1, 2]", "adk_sessions_state_is_object"),
        ("oversize state", "ok2".into(), big_state.as_str(), "adk_sessions_state_size"),
    ];
    for (what, id, state, constraint) in cases {
        let err = sql.execute(insert, &[&id, &state]).await.expect_err(what);
        let db_err = err.as_db_error().unwrap_or_else(|| panic!("{what}: {err}"));
        assert_eq!(db_err.constraint(), Some(constraint), "{what}: {db_err}");
    }
    sql.execute(insert, &[&"s".repeat(128), &"{\"a\": 1}"]).await.expect("a 128-character id is fine");
    let rows: i64 = sql.query_one("SELECT count(*) FROM adk_sessions", &[]).await.expect("count").get(0);
    assert_eq!(rows, 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn deleting_a_session_cascades_to_its_events() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    sql.batch_execute(
        "INSERT INTO adk_sessions (app_name, user_id, session_id) VALUES ('a', 'u', 's1'), ('a', 'u', 's2');
         INSERT INTO adk_events (app_name, user_id, session_id, session_day, seq, event_id, author, event_ts, payload)
         SELECT 'a', 'u', s, (now() AT TIME ZONE 'UTC')::date, n, 'e' || n, 'user', n, '{}'
         FROM unnest(ARRAY['s1', 's2']) s, generate_series(1, 5) n;",
    )
    .await
    .expect("seed");
    sql.execute("DELETE FROM adk_sessions WHERE session_id = 's1'", &[]).await.expect("delete");
    let left: Vec<(String, i64)> = sql
        .query("SELECT session_id, count(*) FROM adk_events GROUP BY 1 ORDER BY 1", &[])
        .await
        .expect("count")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(left, vec![("s2".to_owned(), 5)]);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_event_must_carry_its_sessions_day() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    sql.execute("INSERT INTO adk_sessions (app_name, user_id, session_id) VALUES ('a', 'u', 's')", &[])
        .await
        .expect("session");
    let err = sql
        .execute(
            "INSERT INTO adk_events (app_name, user_id, session_id, session_day, seq, event_id, author, event_ts, payload)
             VALUES ('a', 'u', 's', (now() AT TIME ZONE 'UTC')::date + 1, 1, 'e', 'user', 1, '{}')",
            &[],
        )
        .await
        .expect_err("an event on another day than its session");
    assert_eq!(err.as_db_error().and_then(|e| e.constraint()), Some("adk_events_session_fkey"));
}

#[tokio::test(flavor = "multi_thread")]
async fn partitions_are_created_idempotently_and_missing_days_fail_loudly() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    let day = "2031-03-04";
    let first: bool =
        sql.query_one("SELECT adk_ensure_event_partition($1::text::date)", &[&day]).await.expect("create").get(0);
    let second: bool =
        sql.query_one("SELECT adk_ensure_event_partition($1::text::date)", &[&day]).await.expect("create again").get(0);
    assert!(first && !second);
    let bound: String = sql
        .query_one("SELECT pg_get_expr(relpartbound, oid) FROM pg_class WHERE relname = 'adk_events_p20310304'", &[])
        .await
        .expect("the partition is named by its day")
        .get(0);
    assert_eq!(bound, "FOR VALUES FROM ('2031-03-04') TO ('2031-03-05')");

    sql.execute(
        "INSERT INTO adk_sessions (app_name, user_id, session_id, session_day) VALUES ('a', 'u', 's', '2031-03-09')",
        &[],
    )
    .await
    .expect("session on a day without partition");
    let err = sql
        .execute(
            "INSERT INTO adk_events (app_name, user_id, session_id, session_day, seq, event_id, author, event_ts, payload)
             VALUES ('a', 'u', 's', '2031-03-09', 1, 'e', 'user', 1, '{}')",
            &[],
        )
        .await
        .expect_err("no partition for the day");
    let db_err = err.as_db_error().expect("a server error");
    assert!(db_err.message().starts_with("no partition of relation \"adk_events\""), "{db_err}");
    let stored: i64 = sql.query_one("SELECT count(*) FROM adk_events", &[]).await.expect("count").get(0);
    assert_eq!(stored, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_partition_creation_is_harmless() {
    let db = test_database().await;
    let mut clients = Vec::new();
    for _ in 0..6 {
        clients.push(client(db.url()).await);
    }
    let results = join_all(clients.iter().map(|c| async move {
        c.query_one("SELECT adk_ensure_event_partition('2032-01-01')", &[]).await.map(|r| r.get::<_, bool>(0))
    }))
    .await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    assert_eq!(results.iter().filter(|r| matches!(r, Ok(true))).count(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn schema_rs_matches_database() {
    let db = test_database().await;
    let mut conn = diesel(db.url()).await;
    let rendered = render_schema(&mut conn).await.expect("render schema");
    let checked_in = include_str!("../../../crates/schema/src/tables.rs");
    assert!(
        rendered == checked_in,
        "crates/schema/src/tables.rs is stale; regenerate it with `cargo xtask schema`.\n--- expected ---\n{rendered}"
    );
}

async fn schema_dump(url: &str) -> String {
    let pg_dump = server_binary("pg_dump");
    let output = tokio::process::Command::new(&pg_dump)
        .args(["--schema-only", "--no-owner", "--no-privileges", "--dbname", url])
        .output()
        .await
        .unwrap_or_else(|e| panic!("run {}: {e}", pg_dump.display()));
    assert!(output.status.success(), "pg_dump failed: {}", String::from_utf8_lossy(&output.stderr));
    // pg_dump fences its output with a random \restrict key each run.
    String::from_utf8(output.stdout)
        .expect("utf-8 dump")
        .lines()
        .filter(|line| !line.starts_with("\\restrict") && !line.starts_with("\\unrestrict"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test(flavor = "multi_thread")]
async fn migrations_run_up_down_up_to_the_same_schema() {
    let db = empty_database().await;
    let applied = run_pending_migrations(db.url()).await.expect("up");
    assert!(applied.len() >= 2, "{applied:?}");
    let first = schema_dump(db.url()).await;
    assert!(first.contains("CREATE TABLE public.adk_events"), "{first}");

    let reverted = revert_all_migrations(db.url()).await.expect("down");
    assert_eq!(reverted.len(), applied.len());
    let sql = client(db.url()).await;
    let left: i64 = sql
        .query_one(
            "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = 'public' AND c.relname LIKE 'adk%'",
            &[],
        )
        .await
        .expect("count relations")
        .get(0);
    assert_eq!(left, 0, "down.sql left relations behind");
    let functions: i64 = sql
        .query_one("SELECT count(*) FROM pg_proc WHERE proname LIKE 'adk%'", &[])
        .await
        .expect("count functions")
        .get(0);
    assert_eq!(functions, 0, "down.sql left functions behind");

    run_pending_migrations(db.url()).await.expect("up again");
    let second = schema_dump(db.url()).await;
    let differing: Vec<(&str, &str)> = first.lines().zip(second.lines()).filter(|(a, b)| a != b).take(5).collect();
    assert!(
        first == second,
        "the schema after up-down-up differs ({} vs {} lines); first differences: {differing:#?}",
        first.lines().count(),
        second.lines().count()
    );
}
