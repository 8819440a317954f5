//! The store on Citus: its layout, and that a user's operations run on the
//! one worker holding the user. Run by `cargo xtask citus test` on a
//! coordinator and two workers; ignored by the single-server run, which
//! has no workers to look at.

use adk_postgres_domain::{AppName, GetOptions, ListSessions, SessionId, SessionStore, UserId};
use adk_postgres_retention::{HealthThresholds, MaintenanceConfig, health, run_maintenance};
use adk_postgres_testing::test_database;
use adk_postgres_tests::pg::{client, new_session, store, with_delta};
use futures_util::StreamExt as _;
use tokio_postgres::AsyncMessage;

const NEEDS_CITUS: &str = "needs a Citus cluster: cargo xtask citus test";

#[tokio::test]
#[ignore = "needs a Citus cluster: cargo xtask citus test"]
async fn the_store_is_distributed_by_user_and_colocated() {
    let db = test_database().await;
    assert_eq!(db.worker_urls().len(), 2, "{NEEDS_CITUS}");
    let layout = adk_postgres_schema::citus_layout(db.url()).await.unwrap().expect("the citus extension is installed");
    assert_eq!(layout.distributed_tables, ["adk_event_redactions", "adk_events", "adk_sessions", "adk_user_states"]);
    assert_eq!(layout.reference_tables, ["adk_app_states", "adk_role_apps", "adk_store_policy"]);
    assert_eq!(layout.workers, 2);
    assert!(layout.schema_guarded, "migrated as a superuser, the store's schema is guarded");
    for function in [
        "adk_append_event(",
        "adk_get_session(",
        "adk_read_session(",
        "adk_read_sessions(",
        "adk_list_sessions(",
        "adk_create_session(",
        "adk_redact_event(",
        "adk_get_user_state(",
        "adk_merge_user_state(",
    ] {
        assert!(layout.delegated_functions.iter().any(|f| f.starts_with(function)), "{function} in {layout:?}");
    }
    assert!(!layout.delegated_functions.iter().any(|f| f.starts_with("adk_erase_user")), "{layout:?}");
    // App state is a reference table, written and read on the coordinator.
    for function in ["adk_get_app_state(", "adk_merge_app_state("] {
        assert!(!layout.delegated_functions.iter().any(|f| f.starts_with(function)), "{function} in {layout:?}");
    }

    let sql = client(db.url()).await;
    let colocations: i64 = sql
        .query_one(
            "SELECT count(DISTINCT colocationid) FROM pg_dist_partition
              WHERE logicalrelid IN ('adk_sessions'::regclass, 'adk_events'::regclass, 'adk_user_states'::regclass,
                                     'adk_event_redactions'::regclass)",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(colocations, 1, "sessions, events, user states and redactions share their shards");
    // Today's partition is distributed like its parent, and has shards.
    let partitions_with_shards: i64 = sql
        .query_one(
            "SELECT count(DISTINCT s.logicalrelid) FROM pg_dist_shard s
               JOIN pg_inherits i ON i.inhrelid = s.logicalrelid
              WHERE i.inhparent = 'adk_events'::regclass",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(partitions_with_shards >= 9, "yesterday … a week ahead: {partitions_with_shards}");
}

/// Each append, get and list of a user is one call on the worker holding
/// the user, counted by pg_stat_statements on every worker, and the rows are
/// on that worker only.
#[tokio::test]
#[ignore = "needs a Citus cluster: cargo xtask citus test"]
async fn a_users_operations_are_delegated_to_the_worker_holding_the_user() {
    let db = test_database().await;
    let workers = db.worker_urls();
    assert_eq!(workers.len(), 2, "{NEEDS_CITUS}");
    let sql = client(db.url()).await;
    let users = users_on_two_workers(&sql).await;

    // Created on the coordinator, which propagates it; a worker refuses DDL.
    sql.batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements").await.unwrap();
    let mut worker_clients = Vec::new();
    for url in &workers {
        let worker = client(url).await;
        let port: i32 = worker.query_one("SELECT current_setting('port')::int", &[]).await.unwrap().get(0);
        worker_clients.push((port, worker));
    }
    let store = store(db.url()).await;
    const APPENDS: i64 = 5;
    for (user, _) in &users {
        let key = new_session(&store, "app", user).await;
        for n in 0..APPENDS {
            store.append(&key, with_delta(serde_json::json!({ "n": n })), Default::default()).await.unwrap();
        }
        let session = store.get(&key, GetOptions::default()).await.unwrap();
        assert_eq!(session.events.len() as i64, APPENDS);
        let request = ListSessions::new(AppName::new("app").unwrap(), UserId::new(user.as_str()).unwrap());
        assert_eq!(store.list(&request).await.unwrap().sessions.len(), 1);
    }

    for (user, port) in &users {
        let (_, worker) = worker_clients.iter().find(|(p, _)| p == port).expect("the user's worker");
        let (_, other) = worker_clients.iter().find(|(p, _)| p != port).expect("the other worker");
        for (function, expected) in [("adk_append_event", APPENDS), ("adk_read_session", 1), ("adk_read_sessions", 1)] {
            // Both users' calls are counted together per worker: one user each.
            assert_eq!(calls_on(worker, function).await, expected, "{function} calls on the worker of {user}");
            assert!(calls_on(other, function).await <= expected, "{function} on the other worker");
        }
        let stored: i64 =
            sql.query_one("SELECT count(*) FROM adk_events WHERE user_id = $1", &[user]).await.unwrap().get(0);
        assert_eq!(stored, APPENDS);
    }
}

/// A user's state read and merged directly runs on the worker holding the
/// user, where its rows are; app state, a reference table, is merged from
/// the coordinator into every node's copy; and merges racing appends of the
/// same user and app lose no key there either.
#[tokio::test]
#[ignore = "needs a Citus cluster: cargo xtask citus test"]
async fn scoped_state_runs_where_the_user_is_and_loses_no_update() {
    let db = test_database().await;
    let workers = db.worker_urls();
    assert_eq!(workers.len(), 2, "{NEEDS_CITUS}");
    let sql = client(db.url()).await;
    let users = users_on_two_workers(&sql).await;
    sql.batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements").await.unwrap();
    let mut worker_clients = Vec::new();
    for url in &workers {
        let worker = client(url).await;
        let port: i32 = worker.query_one("SELECT current_setting('port')::int", &[]).await.unwrap().get(0);
        worker_clients.push((port, worker));
    }
    let store = std::sync::Arc::new(store(db.url()).await);
    let app = AppName::new("app").unwrap();
    let obj = |v: serde_json::Value| v.as_object().cloned().unwrap();
    const MERGES: i64 = 3;
    for (user, _) in &users {
        let user = UserId::new(user.as_str()).unwrap();
        for n in 0..MERGES {
            store.merge_user_state(&app, &user, obj(serde_json::json!({ "n": n }))).await.unwrap();
        }
        assert_eq!(store.get_user_state(&app, &user).await.unwrap(), obj(serde_json::json!({"n": MERGES - 1})));
    }
    for (user, port) in &users {
        let (_, worker) = worker_clients.iter().find(|(p, _)| p == port).expect("the user's worker");
        assert_eq!(calls_on(worker, "adk_merge_user_state").await, MERGES, "merges on the worker of {user}");
        assert_eq!(calls_on(worker, "adk_get_user_state").await, 1, "the read on the worker of {user}");
    }
    store.merge_app_state(&app, obj(serde_json::json!({"motd": "hi"}))).await.unwrap();
    assert_eq!(store.get_app_state(&app).await.unwrap(), obj(serde_json::json!({"motd": "hi"})));

    // Appends (delegated to the user's worker) and direct merges racing on
    // one user's and one app's rows.
    const TASKS: usize = 4;
    const PER_TASK: usize = 10;
    let user = UserId::new(users[0].0.as_str()).unwrap();
    let mut writers = tokio::task::JoinSet::new();
    for task in 0..TASKS {
        let key = new_session(&*store, "app", user.as_str()).await;
        let appender = store.clone();
        writers.spawn(async move {
            for j in 0..PER_TASK {
                let delta = serde_json::json!({ format!("user:e{task}"): j, format!("app:e{task}"): j });
                appender.append(&key, with_delta(delta), Default::default()).await.unwrap();
            }
        });
        let (store, app, user) = (store.clone(), app.clone(), user.clone());
        writers.spawn(async move {
            for j in 0..PER_TASK {
                let delta = serde_json::json!({ format!("m{task}"): j }).as_object().cloned().unwrap();
                store.merge_user_state(&app, &user, delta.clone()).await.unwrap();
                store.merge_app_state(&app, delta).await.unwrap();
            }
        });
    }
    while let Some(done) = writers.join_next().await {
        done.unwrap();
    }
    let user_state = store.get_user_state(&app, &user).await.unwrap();
    let app_state = store.get_app_state(&app).await.unwrap();
    for task in 0..TASKS {
        for key in [format!("e{task}"), format!("m{task}")] {
            assert_eq!(user_state.get(&key), Some(&serde_json::json!(PER_TASK - 1)), "user {key}: {user_state:?}");
            assert_eq!(app_state.get(&key), Some(&serde_json::json!(PER_TASK - 1)), "app {key}: {app_state:?}");
        }
    }
}

/// Calls of `function` counted by pg_stat_statements in this database on
/// one worker.
async fn calls_on(worker: &tokio_postgres::Client, function: &str) -> i64 {
    worker
        .query_one(
            "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements
              WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
                AND query LIKE '%' || $1 || '(%' AND query NOT LIKE '%pg_stat_statements%'",
            &[&function],
        )
        .await
        .unwrap()
        .get(0)
}

/// Two users whose shards are on different workers, each with the port of
/// its worker.
async fn users_on_two_workers(sql: &tokio_postgres::Client) -> Vec<(String, i32)> {
    let mut users: Vec<(String, i32)> = Vec::new();
    for n in 0..64 {
        let user = format!("user-{n}");
        let port: i32 = sql
            .query_one(
                "SELECT s.nodeport FROM citus_shards s
                  WHERE s.shardid = get_shard_id_for_distribution_column('adk_sessions', $1::text)
                    AND s.table_name = 'adk_sessions'::regclass",
                &[&user],
            )
            .await
            .unwrap()
            .get(0);
        if !users.iter().any(|(_, seen)| *seen == port) {
            users.push((user, port));
        }
        if users.len() == 2 {
            return users;
        }
    }
    panic!("64 users all hashed to one worker");
}

/// A connection whose notices (DEBUG and LOG lines sent to the client) are
/// kept, each as its message and detail.
async fn listening_client(
    url: &str,
) -> (tokio_postgres::Client, tokio::sync::mpsc::UnboundedReceiver<(String, String)>) {
    let (client, mut connection) = adk_postgres_connect::ConnectConfig::from_url(url)
        .unwrap()
        .connect()
        .await
        .map(|c| (c.client, c.connection))
        .unwrap();
    let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(Ok(message)) = messages.next().await {
            if let AsyncMessage::Notice(notice) = message {
                let _ = sender.send((notice.message().to_owned(), notice.detail().unwrap_or_default().to_owned()));
            }
        }
    });
    (client, receiver)
}

/// Citus' own account of an append and a get, in the form the store sends
/// them: the coordinator pushes the function call down whole and issues one
/// command, to the worker holding the user, and that worker sends nothing
/// on (its own commands are logged because the setting is the role's in
/// this database, which Citus copies to every node; a worker relays them
/// with the detail `from host:port`).
#[tokio::test]
#[ignore = "needs a Citus cluster: cargo xtask citus test"]
async fn citus_pushes_an_append_and_a_get_down_to_one_worker() {
    let db = test_database().await;
    assert_eq!(db.worker_urls().len(), 2, "{NEEDS_CITUS}");
    let sql = client(db.url()).await;
    let users = users_on_two_workers(&sql).await;
    let store = store(db.url()).await;
    sql.batch_execute(
        "DO $$ BEGIN
             EXECUTE format('ALTER ROLE %I IN DATABASE %I SET citus.log_remote_commands = on',
                            current_user, current_database());
         END $$",
    )
    .await
    .unwrap();
    let (listener, mut notices) = listening_client(db.url()).await;
    listener.batch_execute("SET client_min_messages = debug1").await.unwrap();
    for (user, port) in &users {
        let key = new_session(&store, "app", user).await;
        let calls = [
            (
                "append",
                "SELECT outcome, seq FROM adk_append_event(NULL, $1, $2, $3, 'direct-1', NULL, 'agent', 0,
                        '{}'::jsonb, '{}'::jsonb, '{}'::jsonb, '{}'::jsonb, NULL, NULL)",
            ),
            ("get", "SELECT last_seq FROM adk_read_session(NULL, $1, $2, $3, NULL, 0)"),
        ];
        for (operation, call) in calls {
            while notices.try_recv().is_ok() {}
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 3] =
                [&"app", &key.user_id.as_str(), &key.session_id.as_str()];
            listener.query(call, &params).await.unwrap_or_else(|e| panic!("{operation}: {e}"));
            let mut seen = Vec::new();
            while let Ok(notice) = notices.try_recv() {
                seen.push(notice);
            }
            assert!(
                seen.iter().any(|(message, _)| message == "pushing down the function call"),
                "{operation} of {user} was not pushed down: {seen:?}"
            );
            let (sent_on, issued): (Vec<_>, Vec<_>) = seen
                .iter()
                .filter(|(message, _)| message.contains("issuing "))
                .map(|(_, detail)| detail)
                .partition(|detail| detail.starts_with("from "));
            assert_eq!(issued.len(), 1, "{operation} of {user}: one command to a worker: {seen:?}");
            assert!(sent_on.is_empty(), "{operation} of {user}: the worker sent commands on: {seen:?}");
            assert!(issued[0].contains(&format!(":{port} ")), "{operation} of {user} went to its worker: {seen:?}");
        }
    }
}

/// A lookup without a user cannot be routed: it asks every shard, each for
/// at most the limit, and finds sessions wherever they are.
#[tokio::test]
#[ignore = "needs a Citus cluster: cargo xtask citus test"]
async fn find_by_id_asks_every_shard_for_at_most_the_limit() {
    let db = test_database().await;
    assert_eq!(db.worker_urls().len(), 2, "{NEEDS_CITUS}");
    let sql = client(db.url()).await;
    let store = store(db.url()).await;
    let mut expected = Vec::new();
    for (user, _) in users_on_two_workers(&sql).await {
        let created = store
            .create(adk_postgres_domain::CreateSession {
                session_id: Some("shared-id".into()),
                ..adk_postgres_domain::CreateSession::new(AppName::new("app").unwrap(), UserId::new(user).unwrap())
            })
            .await
            .unwrap();
        expected.push(created.key);
    }
    let mut found = store.find_by_id(&SessionId::new("shared-id").unwrap(), 2).await.unwrap();
    found.sort_by(|a, b| a.user_id.as_str().cmp(b.user_id.as_str()));
    expected.sort_by(|a, b| a.user_id.as_str().cmp(b.user_id.as_str()));
    assert_eq!(found, expected, "one session on each worker");

    let shards: i64 = sql
        .query_one("SELECT count(*) FROM pg_dist_shard WHERE logicalrelid = 'adk_sessions'::regclass", &[])
        .await
        .unwrap()
        .get(0);
    let plan: Vec<String> = sql
        .query(
            "EXPLAIN SELECT s.app_name, s.user_id FROM adk_sessions s
              WHERE s.session_id = 'shared-id' AND (s.expires_at IS NULL OR s.expires_at > now()) LIMIT 2",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    let plan = plan.join("\n");
    assert!(plan.contains(&format!("Task Count: {shards}")), "every shard is asked:\n{plan}");
    let task = plan.split("->  Task").nth(1).unwrap_or_default();
    assert!(task.contains("Limit"), "each shard returns at most the limit:\n{plan}");
}

/// `status` on Citus: each node's shards and days ahead.
#[tokio::test]
#[ignore = "needs a Citus cluster: cargo xtask citus test"]
async fn status_reports_each_workers_shards_and_days_ahead() {
    let db = test_database().await;
    assert_eq!(db.worker_urls().len(), 2, "{NEEDS_CITUS}");
    let sql = client(db.url()).await;
    let today = chrono::Utc::now().date_naive();
    run_maintenance(db.url(), today, &MaintenanceConfig::default()).await.expect("maintenance");
    let report = health(db.url(), today, &HealthThresholds::default()).await.expect("health");
    let holding: Vec<_> = report.nodes.iter().filter(|node| node.session_shards > 0).collect();
    assert_eq!(holding.len(), 2, "both workers hold users: {:?}", report.nodes);
    let shards: i64 = holding.iter().map(|node| node.session_shards).sum();
    assert_eq!(shards, 4, "the test databases' shard count: {:?}", report.nodes);
    for node in &holding {
        assert_eq!(node.partitions_ahead, report.partitions_ahead, "{node:?}");
        assert!(node.partitions_ahead >= 7, "{node:?}");
    }
    assert!(report.is_healthy(), "{:?}", report.alerts);
    assert!(report.to_string().contains("Citus node"), "{report}");

    // A week's shards gone from one worker alone: that node is short.
    let (name, port) = {
        let node = holding[0];
        let port: i32 = node.node.rsplit(':').next().and_then(|p| p.parse().ok()).expect("port");
        (node.node.clone(), port)
    };
    let tomorrow = today.succ_opt().unwrap().format("%Y%m%d").to_string();
    // Citus' catalog says where shards are; removing the placements is how a
    // failed shard move or a lost node would look.
    sql.execute(
        "DELETE FROM pg_dist_placement p USING pg_dist_shard s, pg_dist_node n
          WHERE p.shardid = s.shardid AND p.groupid = n.groupid AND n.nodeport = $1
            AND s.logicalrelid = ('adk_events_p' || $2::text)::regclass",
        &[&port, &tomorrow],
    )
    .await
    .unwrap();
    let short = health(db.url(), today, &HealthThresholds::default()).await.expect("health");
    let node = short.nodes.iter().find(|node| node.node == name).expect("the node");
    assert_eq!(node.partitions_ahead, 0, "{node:?}");
    assert!(
        short.alerts.iter().any(|alert| alert.contains(&name) && alert.contains("only 0 future day")),
        "{:?}",
        short.alerts
    );
}

#[tokio::test]
#[ignore = "needs a Citus cluster: cargo xtask citus test"]
async fn an_event_with_media_to_store_apart_is_refused_with_nothing_written() {
    let db = test_database().await;
    assert_eq!(db.worker_urls().len(), 2, "{NEEDS_CITUS}");
    let store = store(db.url()).await;
    let key = new_session(&store, "app", "u1").await;
    let image = adk_postgres_tests::conformance::media_bytes(100_000, 1);
    let refused = store
        .append(&key, adk_postgres_tests::conformance::image_event(&image), Default::default())
        .await
        .expect_err("blobs are shared across users, which Citus places on different nodes");
    assert!(refused.to_string().contains("Citus"), "{refused}");
    store.append(&key, with_delta(serde_json::json!({"a": 1})), Default::default()).await.expect("text still appends");
    let session = store.get(&key, GetOptions::default()).await.expect("get");
    assert_eq!(session.version, 1, "the refused event wrote nothing");
}

/// Migration 000028, run again on a store already distributed as an upgrade
/// runs it (its text as one string, in a transaction): Citus sends each
/// SET COMPRESSION on to every shard of the log, and down.sql takes it back.
#[tokio::test]
#[ignore = "needs a Citus cluster: cargo xtask citus test"]
async fn payload_compression_reaches_every_shard_of_the_log() {
    const UP: &str = include_str!("../../../migrations/2026-12-05-000028_payload_lz4/up.sql");
    const DOWN: &str = include_str!("../../../migrations/2026-12-05-000028_payload_lz4/down.sql");
    let db = test_database().await;
    let workers = db.worker_urls();
    assert_eq!(workers.len(), 2, "{NEEDS_CITUS}");
    let sql = client(db.url()).await;
    let mut worker_clients = Vec::new();
    for url in &workers {
        let worker = client(url).await;
        // Citus hides shards from pg_class unless asked.
        worker.batch_execute("SET citus.override_table_visibility = off").await.expect("show shards");
        worker_clients.push(worker);
    }
    // The method of every shard of adk_events and of its partitions.
    let shards = async || {
        let mut methods = Vec::new();
        for worker in &worker_clients {
            let rows = worker
                .query(
                    "SELECT c.relname::text, a.attcompression::text FROM pg_class c
                       JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = 'payload'
                      WHERE c.relname ~ '^adk_events(_p[0-9]{8})?_[0-9]+$'",
                    &[],
                )
                .await
                .expect("shards");
            methods.extend(rows.iter().map(|row| (row.get::<_, String>(0), row.get::<_, String>(1))));
        }
        assert!(methods.len() > 2, "shards of the parent and of the premade days: {methods:?}");
        methods
    };
    let all = |methods: &[(String, String)], method: &str| methods.iter().all(|(_, m)| m == method);
    // A fresh install ran the migration before distributing: the shards
    // were made with the tables' method.
    let fresh = shards().await;
    assert!(all(&fresh, "l"), "{fresh:?}");
    for (text, method) in [(DOWN, ""), (UP, "l")] {
        sql.batch_execute("BEGIN").await.expect("begin");
        sql.batch_execute(text).await.expect("the migration's text on a distributed log");
        sql.batch_execute("COMMIT").await.expect("commit");
        let now = shards().await;
        assert!(all(&now, method), "{method:?} expected: {now:?}");
    }
}

/// The archive on Citus: the coordinator reads a retiring day through the
/// distributed log, writes and verifies it before the day is dropped on
/// every worker, restores it into a read-only copy on the coordinator, and
/// an erasure reaches both.
#[tokio::test]
#[ignore = "needs a Citus cluster: cargo xtask citus test"]
async fn a_day_is_archived_from_every_worker_before_it_is_dropped_and_restored_whole() {
    use adk_postgres_archive::{ArchiveSetting, StoreOptions, erase_user, restore_day, set_archive_policy};
    let db = test_database().await;
    assert_eq!(db.worker_urls().len(), 2, "{NEEDS_CITUS}");
    let sql = client(db.url()).await;
    let store = store(db.url()).await;
    // Two users known to live on different workers, and six more.
    let mut users: Vec<String> = users_on_two_workers(&sql).await.into_iter().map(|(user, _)| user).collect();
    users.extend((100..106).map(|n| format!("user-{n}")));
    for user in &users {
        let key = new_session(&store, "app", user).await;
        for n in 0..5 {
            store.append(&key, with_delta(serde_json::json!({ "n": n })), Default::default()).await.expect("append");
        }
    }
    let before: i64 = sql.query_one("SELECT count(*) FROM adk_events", &[]).await.expect("count").get(0);
    assert_eq!(before, 40);

    let dir = tempfile_dir("citus-archive");
    let mut conn = adk_postgres_tests::pg::diesel(db.url()).await;
    let url = format!("file://{}", dir.display());
    set_archive_policy(&mut conn, &ArchiveSetting::On { url, apps: None }).await.expect("archive on");
    let today = chrono::Utc::now().date_naive();
    let later = today.checked_add_days(chrono::Days::new(40)).expect("day");
    let report = run_maintenance(db.url(), later, &MaintenanceConfig::default()).await.expect("maintenance");
    assert!(report.archive_failed.is_empty(), "{:?}", report.archive_failed);
    assert_eq!(report.archived.iter().map(|a| a.events).sum::<i64>(), 40, "{report}");
    let left: i64 = sql.query_one("SELECT count(*) FROM adk_events", &[]).await.expect("count").get(0);
    assert_eq!(left, 0, "dropped once archived: {report}");

    let restored = restore_day(&mut conn, "app", today, "audit", &StoreOptions::default()).await.expect("restore");
    assert_eq!(restored.events, 40);
    let per_user: i64 = sql
        .query_one("SELECT count(DISTINCT user_id) FROM audit.adk_restored_events WHERE app_name = 'app'", &[])
        .await
        .expect("count")
        .get(0);
    assert_eq!(per_user, 8, "users of both workers");

    let erased = erase_user(&mut conn, "app", &users[1], None, &StoreOptions::default()).await.expect("erase");
    assert_eq!((erased.archived_rows_removed, erased.restored_rows_removed), (5, 5), "{erased:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

fn tempfile_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("adk-{name}-{}-{}", std::process::id(), uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).expect("dir");
    dir
}

/// A page of events is delegated with the user to the worker holding them;
/// the app-wide listing, which spans users, is planned on the coordinator
/// and merges the workers' pages in order.
#[tokio::test]
#[ignore = "needs a Citus cluster: cargo xtask citus test"]
async fn event_pages_go_to_one_worker_and_the_app_listing_spans_them() {
    use adk_postgres_domain::{EventPage, ListAppSessions};
    let db = test_database().await;
    assert_eq!(db.worker_urls().len(), 2, "{NEEDS_CITUS}");
    let layout = adk_postgres_schema::citus_layout(db.url()).await.unwrap().expect("citus");
    assert!(layout.delegated_functions.iter().any(|f| f.starts_with("adk_list_events(")), "{layout:?}");
    assert!(!layout.delegated_functions.iter().any(|f| f.starts_with("adk_list_app_sessions(")), "{layout:?}");
    let sql = client(db.url()).await;
    let users = users_on_two_workers(&sql).await;
    let store = store(db.url()).await;
    let mut keys = Vec::new();
    for (user, _) in &users {
        let key = new_session(&store, "paging", user).await;
        for n in 0..30 {
            store.append(&key, with_delta(serde_json::json!({ "n": n })), Default::default()).await.unwrap();
        }
        keys.push(key);
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    for key in &keys {
        let mut seqs = Vec::new();
        let mut request = Some(EventPage::last(7));
        while let Some(page) = request {
            let read = store.list_events(key, page).await.unwrap();
            assert_eq!(read.version, 30);
            seqs.splice(0..0, read.events.iter().map(|e| e.seq));
            request = read.next(page);
        }
        assert_eq!(seqs, (1..=30).collect::<Vec<u64>>());
    }
    let app = AppName::new("paging").unwrap();
    let mut request = ListAppSessions::new(app);
    request.page_size = Some(1);
    let first = store.list_app_sessions(&request).await.unwrap();
    assert_eq!(first.sessions[0].key, keys[1], "newest created first, across workers");
    request.page_token = first.next_page_token;
    let second = store.list_app_sessions(&request).await.unwrap();
    assert_eq!(second.sessions[0].key, keys[0]);
    assert_eq!(second.next_page_token, None);
}
