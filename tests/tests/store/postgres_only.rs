//! What only the Postgres store can show: plans, HOT updates, exact
//! timestamps in the log, and the database's own limits reached through it.

use std::time::Duration;

use adk_postgres_domain::{
    AppendOptions, Event, GetOptions, InvocationLease, LeaseGrant, SessionKey, SessionStore, StoreConfig, StoreError,
};
use adk_postgres_storage::{PgSessionStore, PoolConfig};
use adk_postgres_testing::test_database;
use adk_postgres_tests::pg::{client, client_explaining, drain, new_session, store};
use chrono::{DateTime, Utc};
use serde_json::json;

fn event_with_delta(delta: serde_json::Value) -> Event {
    let mut event = Event::new("agent");
    event.actions.state_delta = delta.as_object().cloned().expect("object delta");
    event
}

/// Partitions scanned by a plan: one line per partition node.
pub(crate) fn partitions_in(plan: &str) -> Vec<String> {
    let mut found: Vec<String> = plan
        .split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .filter(|word| word.starts_with("adk_events_p") && word.len() == "adk_events_p20260101".len())
        .map(str::to_owned)
        .collect();
    found.sort();
    found.dedup();
    found
}

#[tokio::test(flavor = "multi_thread")]
async fn get_reads_one_partition_of_forty() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    sql.batch_execute(
        "SELECT adk_ensure_event_partition(d::date)
         FROM generate_series((now() AT TIME ZONE 'UTC')::date - 35, (now() AT TIME ZONE 'UTC')::date + 7, '1 day') d",
    )
    .await
    .expect("premake");
    let partitions: i64 = sql
        .query_one("SELECT count(*) FROM pg_inherits WHERE inhparent = 'adk_events'::regclass", &[])
        .await
        .expect("count")
        .get(0);
    assert!(partitions >= 40, "{partitions}");

    let store = store(db.url()).await;
    let key = new_session(&store, "app", "user").await;
    for _ in 0..3 {
        store.append(&key, Event::new("user"), AppendOptions::default()).await.expect("append");
    }
    let day: String = sql
        .query_one("SELECT session_day::text FROM adk_sessions WHERE session_id = $1", &[&key.session_id.as_str()])
        .await
        .expect("day")
        .get(0);

    // The store reads events through adk_read_session; auto_explain shows the
    // plan of the statement inside it, as executed, under both plan modes.
    let (explaining, plans) = client_explaining(db.url()).await;
    let expected = format!("adk_events_p{}", day.replace('-', ""));
    for mode in ["force_custom_plan", "force_generic_plan"] {
        explaining.batch_execute(&format!("SET plan_cache_mode = {mode}")).await.expect("plan mode");
        drain(&plans);
        let rows = explaining
            .query(
                "SELECT pg_catalog.unnest(events) FROM adk_read_session(NULL, 'app', 'user', $1, NULL, NULL)",
                &[&key.session_id.as_str()],
            )
            .await
            .expect("read events");
        assert_eq!(rows.len(), 3);
        let logged = drain(&plans);
        let plan =
            logged.iter().find(|p| p.contains("adk_events")).unwrap_or_else(|| panic!("no plan logged: {logged:?}"));
        assert_eq!(partitions_in(plan), vec![expected.clone()], "{mode} plan reads more than one partition:\n{plan}");
    }

    // And the statistics of the transaction agree: one partition was read.
    explaining.batch_execute("BEGIN").await.expect("begin");
    explaining
        .query(
            "SELECT pg_catalog.unnest(events) FROM adk_read_session(NULL, 'app', 'user', $1, NULL, NULL)",
            &[&key.session_id.as_str()],
        )
        .await
        .expect("read events");
    let touched: Vec<String> = explaining
        .query(
            "SELECT relname::text FROM pg_stat_xact_user_tables
             WHERE relname LIKE 'adk_events_p%' AND coalesce(idx_scan, 0) + coalesce(seq_scan, 0) > 0",
            &[],
        )
        .await
        .expect("xact stats")
        .iter()
        .map(|r| r.get(0))
        .collect();
    explaining.batch_execute("COMMIT").await.expect("commit");
    assert_eq!(touched, vec![expected]);
}

/// `adk_get_session`, kept for older builds, answers a row per event what
/// `adk_read_session`, which the store calls, answers in one row: for every
/// filter, and nothing for a missing session.
#[tokio::test(flavor = "multi_thread")]
async fn the_kept_row_per_event_get_answers_what_the_one_row_get_does() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    let store = store(db.url()).await;
    let key = new_session(&store, "app", "user").await;
    for n in 0..5 {
        store.append(&key, event_with_delta(json!({ "n": n })), AppendOptions::default()).await.expect("append");
    }
    let third: i64 = sql
        .query_one("SELECT event_ts FROM adk_events WHERE session_id = $1 AND seq = 3", &[&key.session_id.as_str()])
        .await
        .expect("third event's time")
        .get(0);
    const HEADER: &str = "state, last_seq, session_day, created_at, updated_at, expires_at, closed_at, \
                          successor_id, display_name, labels, user_state, app_state";
    let cases: [(Option<i64>, Option<i64>, usize); 6] = [
        (None, None, 5),
        (None, Some(2), 2),
        (None, Some(0), 0),
        (Some(third), None, 3),
        (Some(third), Some(1), 1),
        (None, Some(9), 5),
    ];
    for (after, limit, expected) in cases {
        let session = key.session_id.as_str();
        let rows = sql
            .query(
                &format!(
                    "SELECT pg_catalog.to_jsonb(ROW({HEADER}))::text, pg_catalog.to_jsonb(events)::text
                       FROM adk_read_session(NULL, 'app', 'user', $1, $2, $3)"
                ),
                &[&session, &after, &limit],
            )
            .await
            .expect("adk_read_session");
        let [one_row] = rows.as_slice() else { panic!("adk_read_session gave {} rows", rows.len()) };
        let (header, events): (String, String) = (one_row.get(0), one_row.get(1));
        let kept = sql
            .query(
                &format!(
                    "SELECT pg_catalog.to_jsonb(ROW({HEADER}))::text, payload::text
                       FROM adk_get_session(NULL, 'app', 'user', $1, $2, $3)"
                ),
                &[&session, &after, &limit],
            )
            .await
            .expect("adk_get_session");
        let (kept_header, kept_events) = kept.split_first().expect("a header row");
        assert_eq!(kept_header.get::<_, String>(0), header, "after {after:?}, limit {limit:?}");
        assert!(kept_header.get::<_, Option<String>>(1).is_none(), "the header row carries no event");
        let kept_events: Vec<serde_json::Value> =
            kept_events.iter().map(|row| serde_json::from_str(&row.get::<_, String>(1)).expect("event")).collect();
        let events: Vec<serde_json::Value> = serde_json::from_str(&events).expect("events");
        assert_eq!(events.len(), expected, "after {after:?}, limit {limit:?}");
        assert_eq!(kept_events, events, "after {after:?}, limit {limit:?}");
        // The newest `expected` events, oldest first.
        let order: Vec<i64> =
            events.iter().map(|e| e["actions"]["state_delta"]["n"].as_i64().expect("the event's n")).collect();
        let newest: Vec<i64> = (5 - expected as i64..5).collect();
        assert_eq!(order, newest, "after {after:?}, limit {limit:?}");
    }
    for function in ["adk_read_session", "adk_get_session"] {
        let rows = sql
            .query(&format!("SELECT 1 FROM {function}(NULL, 'app', 'user', 'no-such-session', NULL, NULL)"), &[])
            .await
            .expect(function);
        assert!(rows.is_empty(), "{function} answered a missing session");
    }
}

/// `adk_list_sessions`, kept for older builds, answers a row per session
/// what `adk_read_sessions`, which the store calls, answers in one row: the
/// same sessions in the same order for every filter, with the user and app
/// state on the first row only.
#[tokio::test(flavor = "multi_thread")]
async fn the_kept_row_per_session_list_answers_what_the_one_row_list_does() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    let store = store(db.url()).await;
    let mut ids = Vec::new();
    for _ in 0..6 {
        ids.push(new_session(&store, "app", "user").await.session_id.as_str().to_owned());
    }
    // Two sessions share an old update time (the id breaks the tie), three
    // carry a label, one has expired.
    let tied = vec![ids[0].clone(), ids[1].clone()];
    let labelled = vec![ids[1].clone(), ids[2].clone(), ids[3].clone()];
    sql.execute("UPDATE adk_sessions SET updated_at = '2026-01-01T00:00:00Z' WHERE session_id = ANY($1)", &[&tied])
        .await
        .expect("tie");
    sql.execute(
        "UPDATE adk_sessions SET labels = '{\"team\": \"a\"}', display_name = 'A' WHERE session_id = ANY($1)",
        &[&labelled],
    )
    .await
    .expect("labels");
    sql.execute("UPDATE adk_sessions SET expires_at = now() - interval '1 second' WHERE session_id = $1", &[&ids[5]])
        .await
        .expect("expiry");
    sql.batch_execute(
        "SELECT adk_merge_user_state(NULL, 'app', 'user', '{\"k\": 1}');
         SELECT adk_merge_app_state(NULL, 'app', '{\"m\": 2}');",
    )
    .await
    .expect("user and app state");
    // A cursor at the tied pair's greater id: the other of the pair follows.
    let cursor_id = tied.iter().max().expect("a tied session").as_str();
    let tie_time = "2026-01-01T00:00:00Z";
    // (user, after time, after id, limit, labels, updated before, sessions)
    let cases = [
        ("user", None, None, 100_i64, json!({}), None, 5),
        ("user", None, None, 2, json!({}), None, 2),
        ("user", None, None, 0, json!({}), None, 0),
        ("user", Some(tie_time), Some(cursor_id), 100, json!({}), None, 1),
        ("user", None, None, 100, json!({"team": "a"}), None, 3),
        ("user", None, None, 100, json!({}), Some("2026-06-01T00:00:00Z"), 2),
        ("nobody", None, None, 100, json!({}), None, 0),
    ];
    let columns = [
        ("session_id", "session_ids"),
        ("state", "states"),
        ("last_seq", "last_seqs"),
        ("created_at", "created_ats"),
        ("updated_at", "updated_ats"),
        ("expires_at", "expires_ats"),
        ("display_name", "display_names"),
        ("labels", "label_sets"),
    ];
    for (user, after_time, after_id, limit, labels, before, expected) in cases {
        let case = format!("{user}, after {after_time:?} {after_id:?}, limit {limit}, {labels}, before {before:?}");
        let arguments = "NULL, 'app', $1, $2::text::timestamptz, $3, $4, $5, NULL, $6::text::timestamptz";
        let page = sql
            .query(
                &format!("SELECT pg_catalog.to_jsonb(p)::text FROM adk_read_sessions({arguments}) p"),
                &[&user, &after_time, &after_id, &limit, &labels, &before],
            )
            .await
            .expect("adk_read_sessions");
        let [page] = page.as_slice() else { panic!("{case}: adk_read_sessions gave {} rows", page.len()) };
        let page: serde_json::Value = serde_json::from_str(&page.get::<_, String>(0)).expect("page");
        let kept: Vec<serde_json::Value> = sql
            .query(
                &format!("SELECT pg_catalog.to_jsonb(l)::text FROM adk_list_sessions({arguments}) l"),
                &[&user, &after_time, &after_id, &limit, &labels, &before],
            )
            .await
            .expect("adk_list_sessions")
            .iter()
            .map(|row| serde_json::from_str(&row.get::<_, String>(0)).expect("row"))
            .collect();
        assert_eq!(kept.len(), expected, "{case}: {kept:#?}");
        for (one, many) in columns {
            let column = page[many].as_array().unwrap_or_else(|| panic!("{case}: {many} is not an array: {page}"));
            let rows: Vec<&serde_json::Value> = kept.iter().map(|row| &row[one]).collect();
            assert_eq!(rows, column.iter().collect::<Vec<_>>(), "{case}: {one}");
        }
        for (n, row) in kept.iter().enumerate() {
            let (user_state, app_state) =
                if n == 0 { (json!({"k": 1}), json!({"m": 2})) } else { (json!(null), json!(null)) };
            assert_eq!((&row["user_state"], &row["app_state"]), (&user_state, &app_state), "{case}: row {n}");
        }
        // Newest first, the id breaking ties, nothing expired.
        for pair in kept.windows(2) {
            let key = |row: &serde_json::Value| {
                let updated = DateTime::parse_from_rfc3339(row["updated_at"].as_str().expect("time")).expect("time");
                (updated, row["session_id"].as_str().expect("id").to_owned())
            };
            assert!(key(&pair[0]) > key(&pair[1]), "{case}: out of order: {pair:#?}");
        }
        assert!(kept.iter().all(|row| row["session_id"] != ids[5].as_str()), "{case}: listed an expired session");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn appends_are_hot_updates() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    {
        let store = store(db.url()).await;
        let key = new_session(&store, "app", "user").await;
        // Half of them under the invocation lease, which moves with every
        // append: turns of four events, the last one releasing it.
        let mut grant = None;
        for i in 0..1000 {
            let mut event = if i % 10 == 0 { event_with_delta(json!({"turn": i})) } else { Event::new("agent") };
            let lease = (i >= 500).then(|| {
                event.invocation_id = format!("inv-{}", i / 4);
                let generation = if i % 4 == 0 { None } else { grant.map(|g: LeaseGrant| g.generation) };
                InvocationLease { idle: Duration::from_secs(60), generation, release: i % 4 == 3 }
            });
            let appended =
                store.append(&key, event, AppendOptions { lease, ..AppendOptions::default() }).await.expect("append");
            grant = appended.lease;
            assert_eq!(grant.is_some(), lease.is_some());
        }
    }
    // Backends report their counters when they go idle or exit; the store's
    // pool is gone, so wait for its backends to flush.
    let mut last = (0, 0);
    for _ in 0..100 {
        let row = sql
            .query_one("SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'adk_sessions'", &[])
            .await
            .expect("stats");
        last = (row.get::<_, i64>(0), row.get::<_, i64>(1));
        if last.0 >= 1000 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (updates, hot) = last;
    assert!(updates >= 1000, "only {updates} updates reported");
    let ratio = hot as f64 / updates as f64;
    assert!(ratio >= 0.95, "HOT ratio {ratio:.3} ({hot} of {updates})");
}

#[tokio::test(flavor = "multi_thread")]
async fn event_time_is_stored_to_the_nanosecond() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    let store = store(db.url()).await;
    let key = new_session(&store, "app", "user").await;
    let at = DateTime::<Utc>::from_timestamp(1_790_000_000, 123_456_789).expect("time");
    let mut event = Event::new("agent");
    event.timestamp = at;
    store.append(&key, event.clone(), AppendOptions::default()).await.expect("append");

    let stored: i64 = sql.query_one("SELECT event_ts FROM adk_events", &[]).await.expect("event_ts").get(0);
    assert_eq!(stored, 1_790_000_000_123_456_789);
    let got = store.get(&key, GetOptions { after: Some(at), ..GetOptions::default() }).await.expect("get");
    assert_eq!(got.events, vec![event]);
    let later = at + chrono::TimeDelta::nanoseconds(1);
    let got = store.get(&key, GetOptions { after: Some(later), ..GetOptions::default() }).await.expect("get");
    assert!(got.events.is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_missing_partition_is_a_loud_typed_error() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    let store = store(db.url()).await;
    let key = new_session(&store, "app", "user").await;
    // Move the (still empty) session to a day nobody premade.
    sql.execute("UPDATE adk_sessions SET session_day = '2001-02-03'", &[]).await.expect("move day");
    let err = store.append(&key, Event::new("user"), AppendOptions::default()).await.expect_err("no partition");
    assert_eq!(err, StoreError::PartitionMissing { day: chrono::NaiveDate::from_ymd_opt(2001, 2, 3) });
    let session = store.get(&key, GetOptions::default()).await.expect("get");
    assert_eq!(session.version, 0, "nothing may be written");
}

#[tokio::test(flavor = "multi_thread")]
async fn state_growing_past_the_cap_is_refused_and_nothing_changes() {
    let db = test_database().await;
    let store = store(db.url()).await;
    let key = new_session(&store, "app", "user").await;
    // Each delta is under the cap on its own; together they are not. Random
    // text keeps compression from hiding the size.
    let noise = |seed: u64| -> String {
        let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (0..28_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                char::from(b'a' + (x % 26) as u8)
            })
            .collect()
    };
    store.append(&key, event_with_delta(json!({"a": noise(1)})), AppendOptions::default()).await.expect("first");
    store.append(&key, event_with_delta(json!({"b": noise(2)})), AppendOptions::default()).await.expect("second");
    let before = store.get(&key, GetOptions::default()).await.expect("get");
    let err = store
        .append(&key, event_with_delta(json!({"c": noise(3)})), AppendOptions::default())
        .await
        .expect_err("over the cap");
    assert!(matches!(&err, StoreError::StateTooLarge { field, .. } if field.contains("session scope")), "{err:?}");
    let after = store.get(&key, GetOptions::default()).await.expect("get");
    assert_eq!(after, before);

    let user_err = store
        .append(&key, event_with_delta(json!({"user:big": noise(4) + &noise(5) + &noise(6)})), AppendOptions::default())
        .await
        .expect_err("user scope over the cap");
    assert!(matches!(user_err, StoreError::StateTooLarge { .. }), "{user_err:?}");
    assert_eq!(store.get(&key, GetOptions::default()).await.expect("get"), before);
}

#[tokio::test(flavor = "multi_thread")]
async fn session_day_is_the_utc_day_whatever_the_server_time_zone() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    let store = store(db.url()).await;
    let key = new_session(&store, "app", "user").await;
    let row = sql
        .query_one(
            "SELECT session_day = (now() AT TIME ZONE 'UTC')::date, current_setting('TimeZone')
             FROM adk_sessions WHERE session_id = $1",
            &[&key.session_id.as_str()],
        )
        .await
        .expect("day");
    assert!(row.get::<_, bool>(0), "session_day is not the UTC day under TimeZone {}", row.get::<_, String>(1));
}

#[tokio::test(flavor = "multi_thread")]
async fn deleting_a_session_keeps_other_sessions_events() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    let store = store(db.url()).await;
    let gone = new_session(&store, "app", "user").await;
    let kept = new_session(&store, "app", "user").await;
    for key in [&gone, &kept] {
        for _ in 0..4 {
            store.append(key, Event::new("user"), AppendOptions::default()).await.expect("append");
        }
    }
    store.delete(&gone).await.expect("delete");
    let left: Vec<(String, i64)> = sql
        .query("SELECT session_id, count(*) FROM adk_events GROUP BY 1", &[])
        .await
        .expect("count")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(left, vec![(kept.session_id.to_string(), 4)]);
}

#[tokio::test(flavor = "multi_thread")]
async fn injection_attempts_are_stored_and_read_back_literally() {
    use adk_postgres_domain::{AppName, CreateSession, ListSessions, UserId};
    let db = test_database().await;
    let sql = client(db.url()).await;
    let store = store(db.url()).await;
    let app = "app'); DROP TABLE adk_sessions; --";
    let user = "u\" OR 1=1 --";
    let id = "s'; DELETE FROM adk_events WHERE ''='";
    let keys = ["k'; DROP TABLE adk_events; --", "user:$1", "app:\\x00", "a\"b", "%_", "user:'||pg_sleep(5)||'"];
    let mut state = serde_json::Map::new();
    for (i, k) in keys.iter().enumerate() {
        state.insert((*k).to_owned(), json!(format!("v{i}'; --")));
    }
    let created = store
        .create(
            CreateSession::new(AppName::new(app).expect("app"), UserId::new(user).expect("user"))
                .with_id(id)
                .with_state(state.clone()),
        )
        .await
        .expect("create");
    assert_eq!(created.key.session_id.as_str(), id);
    let mut event = event_with_delta(json!({ "x'); --": "y" }));
    event.id = "e'; --".into();
    event.author = "author\"; --".into();
    store.append(&created.key, event.clone(), AppendOptions::default()).await.expect("append");

    let loaded = store.get(&created.key, GetOptions::default()).await.expect("get");
    for (k, v) in &state {
        assert_eq!(loaded.state.get(k), Some(v), "{k}");
    }
    assert_eq!(loaded.events, vec![event]);
    let page = store
        .list(&ListSessions::new(AppName::new(app).expect("app"), UserId::new(user).expect("user")))
        .await
        .expect("list");
    assert_eq!(page.sessions.len(), 1);
    let stored: (String, String, String) = sql
        .query_one("SELECT app_name, user_id, session_id FROM adk_sessions", &[])
        .await
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .expect("the tables are intact");
    assert_eq!(stored, (app.to_owned(), user.to_owned(), id.to_owned()));
}

/// The store's statements are unnamed and sent whole in one round trip
/// (Parse, Bind, Execute and Sync together), so no prepared statement is
/// left in a session: behind a transaction pooler the next statement may
/// reach another server connection, where a name kept here would be
/// missing or another client's. (The round trips themselves are counted by
/// the benchmark's proxy: one per append.)
#[tokio::test(flavor = "multi_thread")]
async fn no_statement_stays_prepared_in_a_session() {
    use adk_postgres_domain::StoreConfig;
    use adk_postgres_storage::{PgSessionStore, PoolConfig};
    use diesel::sql_types::{BigInt, Text};

    #[derive(diesel::QueryableByName, Debug, PartialEq)]
    struct Prepared {
        #[diesel(sql_type = Text)]
        name: String,
        #[diesel(sql_type = BigInt)]
        calls: i64,
    }
    let db = test_database().await;
    let store =
        PgSessionStore::connect(db.url(), &PoolConfig { max_size: 1, ..Default::default() }, StoreConfig::default())
            .await
            .expect("connect");
    let key = new_session(&store, "app", "user").await;
    for _ in 0..5 {
        store.append(&key, Event::new("agent"), AppendOptions::default()).await.expect("append");
        store.get(&key, GetOptions::default()).await.expect("get");
    }
    let mut conn = store.pool().get().await.expect("the store's one connection");
    let prepared = conn
        .load::<Prepared>(&diesel::sql_query(
            "SELECT name::text AS name, count(*) OVER ()::bigint AS calls FROM pg_prepared_statements",
        ))
        .await
        .expect("prepared statements");
    assert_eq!(prepared, vec![], "a statement stayed prepared in the session");
}

/// Every operation reports its turn at the pool to the checkout observer,
/// waited or not: what an operator's wait histogram is built from.
#[tokio::test(flavor = "multi_thread")]
async fn the_checkout_observer_hears_every_operation() {
    let db = test_database().await;
    let waits = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = waits.clone();
    let store = std::sync::Arc::new(
        PgSessionStore::connect(db.url(), &PoolConfig { max_size: 2, ..PoolConfig::default() }, StoreConfig::default())
            .await
            .expect("connect")
            .with_checkout_observer(std::sync::Arc::new(move |wait| log.lock().expect("wait log").push(wait))),
    );
    let tasks: Vec<_> = (0..40)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                let key = SessionKey::parse("app", "user", &format!("gone-{i}")).expect("key");
                store.delete(&key).await.expect("delete");
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("task");
    }
    let waits = waits.lock().expect("wait log");
    assert_eq!(waits.len(), 40, "one turn per operation: {waits:?}");
    let patience = PoolConfig::default().connection_timeout;
    assert!(waits.iter().all(|w| *w <= patience), "{waits:?}");
}

/// After a burst has opened several connections, calls one at a time keep
/// landing on the connection used last: its backend's catalog and plan
/// caches are warm, and the burst's surplus idles until it is closed. A
/// pool that hands out its oldest idle connection first rotates every call
/// through every backend, which cost a list of 100 and a get of 40 a
/// quarter to a third of their pace.
#[tokio::test(flavor = "multi_thread")]
async fn calls_one_at_a_time_reuse_the_connection_used_last() {
    const BURST: usize = 4;
    let db = test_database().await;
    let application = "lifo-check";
    let config =
        PoolConfig { max_size: BURST as u32, application_name: application.to_owned(), ..PoolConfig::default() };
    let store = PgSessionStore::connect(db.url(), &config, StoreConfig::default()).await.expect("connect");
    let key = new_session(&store, "app", "user").await;
    let mut held = Vec::new();
    for _ in 0..BURST {
        held.push(store.pool().get().await.expect("a connection of the burst"));
    }
    drop(held);
    for _ in 0..3 * BURST {
        store.get(&key, GetOptions::default()).await.expect("get");
    }
    let sql = client(db.url()).await;
    let row = sql
        .query_one(
            "SELECT count(*), count(*) FILTER (WHERE query LIKE '%adk_read_session%')
               FROM pg_stat_activity WHERE datname = current_database() AND application_name = $1",
            &[&application],
        )
        .await
        .expect("the store's connections");
    let (open, served): (i64, i64) = (row.get(0), row.get(1));
    assert_eq!(open, BURST as i64, "the burst opened {BURST} connections");
    assert_eq!(served, 1, "{} calls one at a time were spread over {served} connections", 3 * BURST);
}
