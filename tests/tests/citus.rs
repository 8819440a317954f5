//! The store on Citus: its layout, and that a user's operations run on the
//! one worker holding the user. Run by `cargo xtask citus test` on a
//! coordinator and two workers; ignored by the single-server run, which
//! has no workers to look at.

use adk_postgres_domain::{AppName, GetOptions, ListSessions, SessionStore, UserId};
use adk_postgres_testing::test_database;
use adk_postgres_tests::pg::{client, new_session, store, with_delta};

const NEEDS_CITUS: &str = "needs a Citus cluster: cargo xtask citus test";

#[tokio::test]
#[ignore = "needs a Citus cluster: cargo xtask citus test"]
async fn the_store_is_distributed_by_user_and_colocated() {
    let db = test_database().await;
    assert_eq!(db.worker_urls().len(), 2, "{NEEDS_CITUS}");
    let layout = adk_postgres_schema::citus_layout(db.url()).await.unwrap().expect("the citus extension is installed");
    assert_eq!(layout.distributed_tables, ["adk_events", "adk_sessions", "adk_user_states"]);
    assert_eq!(layout.reference_tables, ["adk_app_states", "adk_role_apps", "adk_store_policy"]);
    assert_eq!(layout.workers, 2);
    for function in ["adk_append_event(", "adk_get_session(", "adk_list_sessions(", "adk_create_session("] {
        assert!(layout.delegated_functions.iter().any(|f| f.starts_with(function)), "{function} in {layout:?}");
    }
    assert!(!layout.delegated_functions.iter().any(|f| f.starts_with("adk_erase_user")), "{layout:?}");

    let sql = client(db.url()).await;
    let colocations: i64 = sql
        .query_one(
            "SELECT count(DISTINCT colocationid) FROM pg_dist_partition
              WHERE logicalrelid IN ('adk_sessions'::regclass, 'adk_events'::regclass, 'adk_user_states'::regclass)",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(colocations, 1, "sessions, events and user states share their shards");
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
    // Two users whose shards are on different workers.
    let node_of = |user: String| {
        let sql = &sql;
        async move {
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
            (user, port)
        }
    };
    let mut users = Vec::new();
    for n in 0..64 {
        let (user, port) = node_of(format!("user-{n}")).await;
        if !users.iter().any(|(_, seen)| *seen == port) {
            users.push((user, port));
        }
        if users.len() == 2 {
            break;
        }
    }
    assert_eq!(users.len(), 2, "64 users all hashed to one worker");

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
        for (function, expected) in [("adk_append_event", APPENDS), ("adk_get_session", 1), ("adk_list_sessions", 1)] {
            // Both users' calls are counted together per worker: one user each.
            assert_eq!(calls_on(worker, function).await, expected, "{function} calls on the worker of {user}");
            assert!(calls_on(other, function).await <= expected, "{function} on the other worker");
        }
        let stored: i64 =
            sql.query_one("SELECT count(*) FROM adk_events WHERE user_id = $1", &[user]).await.unwrap().get(0);
        assert_eq!(stored, APPENDS);
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
