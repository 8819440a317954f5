//! `get`: live shared state, event order and filters, exact values, and
//! what is not found.

use std::time::Duration;

use adk_postgres_domain::{AppendOptions, CreateSession, Event, GetOptions, StoreConfig};
use chrono::{DateTime, TimeDelta, Utc};
use serde_json::{Value, json};

use super::*;

pub async fn get_merges_the_live_app_and_user_state<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("live");
    let a = create(&*store, &app, &user, "a", json!({"mine": "a"})).await;
    let b = create(&*store, &app, &user, "b", json!({})).await;
    let c = create(&*store, &app, &other_user(&user), "c", json!({})).await;

    append(&*store, &b.key, ev(json!({"user:color": "red", "app:mode": "fast", "local": 1}))).await;
    assert_eq!(get(&*store, &a.key).await.state, obj(json!({"mine": "a", "user:color": "red", "app:mode": "fast"})));
    assert_eq!(get(&*store, &c.key).await.state, obj(json!({"app:mode": "fast"})));

    append(&*store, &b.key, ev(json!({"user:color": "blue"}))).await;
    let a_now = get(&*store, &a.key).await;
    assert_eq!(a_now.state["user:color"], json!("blue"), "get sees the live user state, not a snapshot");
    assert_eq!(a_now.version, 0, "a itself did not change");
    let listed = list_all(&*store, &app, &user).await;
    let a_summary = listed.iter().find(|s| s.key == a.key).expect("a listed");
    assert_eq!(a_summary.state, a_now.state, "list merges the live state too");
}

pub async fn get_returns_events_in_seq_order_exactly_as_appended<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("order");
    let session = create(&*store, &app, &user, "s", json!({})).await;
    let mut stored = Vec::new();
    for i in 0..10i64 {
        // Timestamps run backwards: the order is the append order (seq).
        let mut event = event_at(base_time() - TimeDelta::seconds(i));
        event.invocation_id = format!("inv-{i}");
        if i % 3 == 0 {
            event.branch = Some("root.child".into());
            event.content = Some(json!({"role": "model", "parts": [{"text": format!("héllo 😀 {i}")}, {"n": i}]}));
            event.turn_complete = Some(true);
            event.actions.artifact_delta = obj(json!({"file.txt": i}));
            event.actions.transfer_to_agent = Some("helper".into());
            event.actions.escalate = Some(false);
            event.actions.skip_summarization = Some(true);
            event.actions.extra = obj(json!({"requested_auth_configs": {}}));
            event.extra = obj(json!({
                "usage_metadata": {"total_token_count": 12},
                "long_running_tool_ids": ["t1"],
                "numbers": [0.1, 1.0, -2.5, 1e-7, 123_456_789.123, 5e-324, u64::MAX, i64::MIN, 0],
                "text": "quotes \" ' \\ and \u{2028} and \t tabs",
            }));
            event.actions.state_delta = obj(json!({"k": i, "temp:scratch": i}));
        }
        let appended = append(&*store, &session.key, event.clone()).await;
        assert_eq!(appended.seq, Some(i as u64 + 1));
        assert_eq!(appended.event, event.without_temp_state(), "the answer is the event as stored");
        stored.push(appended.event);
    }
    let loaded = get(&*store, &session.key).await;
    assert_eq!(loaded.version, 10);
    assert_eq!(loaded.events, stored, "events read back exactly as appended, in seq order");
}

pub async fn numbers_read_back_exactly<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("numbers");
    let session = create(&*store, &app, &user, "s", json!({})).await;
    // Deterministic pseudo-random bit patterns: every finite f64 is a value
    // an agent may put in an event or in state.
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let mut random = Vec::new();
    while random.len() < 2_000 {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        let x = f64::from_bits(seed);
        if x.is_finite() {
            random.push(x);
        }
    }
    let extremes = [f64::MAX, f64::MIN, f64::MIN_POSITIVE, 5e-324, -5e-324, 1e308, 1.5e-300, 0.1, -0.0];
    let mut wrong = Vec::new();
    for (what, values) in [("extreme", &extremes[..]), ("random", &random[..400]), ("random", &random[400..])] {
        let mut event = ev(json!({ "values": values[..values.len().min(400)] }));
        event.content = Some(json!({ "values": values }));
        let Ok(stored) = store.append(&session.key, event.clone(), AppendOptions::default()).await.map_err(|e| {
            wrong.push(format!("{what}: append failed: {e}"));
        }) else {
            continue;
        };
        assert_eq!(stored.event, event);
        match store.get(&session.key, GetOptions { num_recent_events: Some(1), after: None }).await {
            Ok(loaded) => {
                let back = loaded.events[0].content.as_ref().and_then(|c| c["values"].as_array().cloned());
                let back: Vec<Option<f64>> = back.unwrap_or_default().iter().map(Value::as_f64).collect();
                for (i, (sent, got)) in values.iter().zip(&back).enumerate() {
                    if Some(sent.to_bits()) != got.map(f64::to_bits) && !(*sent == 0.0 && *got == Some(0.0)) {
                        wrong.push(format!("{what}[{i}]: appended {sent:e}, read back {got:?}"));
                    }
                }
                if back.len() != values.len() {
                    wrong.push(format!("{what}: {} values read back, not {}", back.len(), values.len()));
                }
                // JSON has one number type: 6.2e16 may come back spelled as
                // the integer 62000000000000000. Same value, same f64 bits.
                let as_bits = |v: &Value| -> Vec<Option<u64>> {
                    v.as_array().map(|a| a.iter().map(|n| n.as_f64().map(f64::to_bits)).collect()).unwrap_or_default()
                };
                let zero = |bits: &Option<u64>| bits.map(f64::from_bits) == Some(0.0);
                let sent = as_bits(&event.actions.state_delta["values"]);
                let got = as_bits(&loaded.state["values"]);
                if sent.len() != got.len() || sent.iter().zip(&got).any(|(a, b)| a != b && !(zero(a) && zero(b))) {
                    wrong.push(format!("{what}: state values differ"));
                }
            }
            Err(e) => wrong.push(format!("{what}: get failed after a successful append: {e}")),
        }
    }
    wrong.truncate(10);
    assert!(wrong.is_empty(), "numbers do not read back exactly:\n{}", wrong.join("\n"));
}

pub async fn get_num_recent_events_keeps_the_last_n<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("recent");
    let session = create(&*store, &app, &user, "s", json!({})).await;
    let mut all = Vec::new();
    for _ in 0..5 {
        all.push(append(&*store, &session.key, Event::new("agent")).await.event.id);
    }
    let k = &session.key;
    assert_eq!(get_ids(&*store, k, None, None).await, all);
    assert_eq!(get_ids(&*store, k, Some(0), None).await, Vec::<String>::new(), "Some(0) is none");
    assert_eq!(get_ids(&*store, k, Some(1), None).await, all[4..]);
    assert_eq!(get_ids(&*store, k, Some(3), None).await, all[2..]);
    assert_eq!(get_ids(&*store, k, Some(5), None).await, all);
    assert_eq!(get_ids(&*store, k, Some(6), None).await, all);
    assert_eq!(get_ids(&*store, k, Some(usize::MAX), None).await, all);
    let none = store.get(k, GetOptions { num_recent_events: Some(0), after: None }).await.expect("get");
    assert_eq!(none.version, 5, "the version counts every event, whatever is returned");
}

pub async fn get_after_is_inclusive_to_the_nanosecond<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("after");
    let session = create(&*store, &app, &user, "s", json!({})).await;
    let t = base_time();
    let offsets = [ns(0), ns(1), ns(2), TimeDelta::microseconds(1), TimeDelta::seconds(1)];
    let mut all = Vec::new();
    for offset in offsets {
        all.push(append(&*store, &session.key, event_at(t + offset)).await.event.id);
    }
    let k = &session.key;
    let cases: [(DateTime<Utc>, &[String]); 9] = [
        (t, &all),
        (t + ns(1), &all[1..]),
        (t + ns(2), &all[2..]),
        (t + ns(3), &all[3..]),
        (t + TimeDelta::microseconds(1), &all[3..]),
        (t + TimeDelta::microseconds(1) + ns(1), &all[4..]),
        (t + TimeDelta::seconds(1), &all[4..]),
        (t + TimeDelta::seconds(1) + ns(1), &[]),
        (t - ns(1), &all),
    ];
    for (after, expected) in cases {
        assert_eq!(get_ids(&*store, k, None, Some(after)).await, expected, "after {after:?}");
    }
    assert_eq!(get_ids(&*store, k, None, Some(DateTime::<Utc>::MIN_UTC)).await, all);
    assert_eq!(get_ids(&*store, k, None, Some(DateTime::<Utc>::MAX_UTC)).await, Vec::<String>::new());
    let loaded = store.get(k, GetOptions { num_recent_events: None, after: Some(t + ns(1)) }).await.expect("get");
    assert_eq!(loaded.events[0].timestamp, t + ns(1), "timestamps keep their nanoseconds");
}

pub async fn get_with_both_filters_returns_their_intersection<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("both");
    let session = create(&*store, &app, &user, "s", json!({})).await;
    let t = |ms: i64| base_time() + TimeDelta::milliseconds(ms);
    // Timestamps out of seq order: e0=t5 e1=t1 e2=t6 e3=t2 e4=t7 e5=t3.
    let mut all = Vec::new();
    for ms in [5, 1, 6, 2, 7, 3] {
        all.push(append(&*store, &session.key, event_at(t(ms))).await.event.id);
    }
    let k = &session.key;
    let pick = |idx: &[usize]| idx.iter().map(|&i| all[i].clone()).collect::<Vec<_>>();
    // At or after t5: e0, e2, e4; the 2 most recent of those by seq.
    assert_eq!(get_ids(&*store, k, Some(2), Some(t(5))).await, pick(&[2, 4]));
    assert_eq!(get_ids(&*store, k, Some(10), Some(t(5))).await, pick(&[0, 2, 4]));
    assert_eq!(get_ids(&*store, k, Some(0), Some(t(5))).await, pick(&[]));
    // At or after t3: e0, e2, e4, e5.
    assert_eq!(get_ids(&*store, k, Some(2), Some(t(3))).await, pick(&[4, 5]));
    assert_eq!(get_ids(&*store, k, Some(3), Some(t(3))).await, pick(&[2, 4, 5]));
    assert_eq!(get_ids(&*store, k, Some(1), Some(t(8))).await, pick(&[]));
    assert_eq!(get_ids(&*store, k, None, Some(t(6))).await, pick(&[2, 4]));
}

pub async fn get_missing_or_foreign_session_is_not_found<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("notfound");
    let mine = create(&*store, &app, &user, "mine", json!({"x": 1})).await;
    append(&*store, &mine.key, Event::new("agent")).await;
    let missing = key(&app, &user, "never-created");
    let foreign_user = key(&app, &other_user(&user), "mine");
    let foreign_app = key(&other_app(&app), &user, "mine");
    for k in [&missing, &foreign_user, &foreign_app] {
        expect_not_found(store.get(k, GetOptions::default()).await, k, "get");
        expect_not_found(store.get_json(k, GetOptions::default()).await, k, "get_json");
        expect_not_found(store.get(k, GetOptions { num_recent_events: Some(1), after: None }).await, k, "get");
        expect_not_found(store.append(k, Event::new("agent"), AppendOptions::default()).await, k, "append");
        store.delete(k).await.expect("deleting what is not there");
    }
    assert!(list_all(&*store, &app, &other_user(&user)).await.is_empty());
    let still = get(&*store, &mine.key).await;
    assert_eq!((still.version, still.events.len(), still.state), (1, 1, obj(json!({"x": 1}))));
}

pub async fn get_during_concurrent_appends_sees_one_consistent_version<F: StoreFactory>(f: &F) {
    const APPENDS: u64 = 200;
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("snapshot");
    let session = create(&*store, &app, &user, "s", json!({})).await;
    let writer = {
        let (store, key) = (store.clone(), session.key.clone());
        tokio::spawn(async move {
            let mut ids = Vec::new();
            for n in 1..=APPENDS {
                let mut event = ev(json!({ "n": n }));
                event.id = format!("e{n:04}");
                ids.push(store.append(&key, event, AppendOptions::default()).await.expect("append").event.id);
            }
            ids
        })
    };
    let mut reads = 0;
    loop {
        let finished = writer.is_finished();
        let loaded = get(&*store, &session.key).await;
        let version = loaded.version;
        assert_eq!(loaded.events.len() as u64, version, "events and version describe one moment");
        let expected: Vec<String> = (1..=version).map(|n| format!("e{n:04}")).collect();
        assert_eq!(ids(&loaded.events), expected, "a gapless prefix of the log");
        if version > 0 {
            assert_eq!(loaded.state["n"], json!(version), "the state is the one of the last event returned");
        }
        let recent =
            store.get(&session.key, GetOptions { num_recent_events: Some(2), after: None }).await.expect("get");
        let tail: Vec<String> =
            (recent.version.saturating_sub(1).max(1)..=recent.version).map(|n| format!("e{n:04}")).collect();
        assert_eq!(ids(&recent.events), if recent.version == 0 { Vec::new() } else { tail }, "the newest events");
        reads += 1;
        if finished {
            break;
        }
    }
    let written = writer.await.expect("writer");
    assert_eq!(written.len() as u64, APPENDS);
    assert!(reads > 1);
    assert_eq!(get(&*store, &session.key).await.version, APPENDS);
}

pub async fn expired_sessions_are_not_found_not_listed_and_refuse_appends<F: StoreFactory>(f: &F) {
    let ttl = Duration::from_millis(500);
    let store =
        f.store(StoreConfig { default_ttl: Some(ttl), max_session_lifetime: None, ..StoreConfig::default() }).await;
    let (app, user) = names("expiry");
    let short = create(&*store, &app, &user, "short", json!({})).await;
    assert_eq!(short.expires_at, Some(short.created_at + TimeDelta::milliseconds(500)), "default ttl");
    let long = store
        .create(CreateSession::new(app.clone(), user.clone()).with_id("long").with_ttl(Duration::from_secs(3600)))
        .await
        .expect("create with ttl");
    assert_eq!(long.expires_at, Some(long.created_at + TimeDelta::hours(1)), "a request's ttl wins");
    append(&*store, &short.key, Event::new("agent")).await;
    assert_eq!(list_all(&*store, &app, &user).await.len(), 2);

    tokio::time::sleep(ttl + Duration::from_millis(400)).await;
    expect_not_found(store.get(&short.key, GetOptions::default()).await, &short.key, "get expired");
    expect_not_found(
        store.append(&short.key, Event::new("agent"), AppendOptions::default()).await,
        &short.key,
        "append to expired",
    );
    assert_eq!(session_ids(&list_all(&*store, &app, &user).await), vec!["long".to_owned()], "expired not listed");
    assert_eq!(get(&*store, &long.key).await.version, 0);
}
