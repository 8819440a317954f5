//! Racing writers: no gap, no lost update, no double write.

use std::collections::BTreeMap;
use std::sync::Arc;

use adk_postgres_domain::{AppendOptions, CreateSession, GetOptions, State, StoreConfig, StoreError};
use serde_json::json;
use tokio::sync::Barrier;
use tokio::task::JoinSet;

use super::*;

pub async fn concurrent_appends_to_one_session_are_gapless<F: StoreFactory>(f: &F) {
    const TASKS: usize = 16;
    const PER_TASK: usize = 50;
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("gapless");
    let session = create(&*store, &app, &user, "s", json!({})).await;
    let barrier = Arc::new(Barrier::new(TASKS));
    let mut tasks = JoinSet::new();
    for task in 0..TASKS {
        let (store, key, barrier) = (store.clone(), session.key.clone(), barrier.clone());
        tasks.spawn(async move {
            barrier.wait().await;
            let mut answers = Vec::with_capacity(PER_TASK);
            for i in 0..PER_TASK {
                let event = ev(json!({ format!("t{task}"): i }));
                let answer = store.append(&key, event, AppendOptions::default()).await.expect("concurrent append");
                assert!(!answer.replayed);
                answers.push((answer.seq.expect("stored"), answer.event.id, answer.last_update_time.expect("time")));
            }
            answers
        });
    }
    let mut by_seq = BTreeMap::new();
    while let Some(answers) = tasks.join_next().await {
        for (seq, id, at) in answers.expect("append task") {
            assert!(by_seq.insert(seq, (id, at)).is_none(), "seq {seq} handed out twice");
        }
    }
    let total = (TASKS * PER_TASK) as u64;
    assert_eq!(by_seq.keys().copied().collect::<Vec<_>>(), (1..=total).collect::<Vec<_>>(), "seqs 1..=800");
    let times: Vec<_> = by_seq.values().map(|(_, at)| *at).collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "update times follow seq order, never backwards");

    let loaded = get(&*store, &session.key).await;
    assert_eq!(loaded.version, total);
    let expected_ids: Vec<String> = by_seq.values().map(|(id, _)| id.clone()).collect();
    assert_eq!(ids(&loaded.events), expected_ids, "get returns every event in seq order");
    assert_eq!(loaded.last_update_time, *times.last().expect("times"));
    let expected_state: State = (0..TASKS).map(|t| (format!("t{t}"), json!(PER_TASK - 1))).collect();
    assert_eq!(loaded.state, expected_state, "every task's last delta is in the state");
}

pub async fn concurrent_shared_state_merges_lose_no_update<F: StoreFactory>(f: &F) {
    const TASKS: usize = 8;
    const PER_TASK: usize = 50;
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("lostupdate");
    // Creates with initial user and app state, all at once.
    let barrier = Arc::new(Barrier::new(TASKS));
    let mut creates = JoinSet::new();
    for task in 0..TASKS {
        let (store, app, user, barrier) = (store.clone(), app.clone(), user.clone(), barrier.clone());
        creates.spawn(async move {
            let state = obj(json!({ format!("user:created_{task}"): true, format!("app:created_{task}"): true }));
            barrier.wait().await;
            store
                .create(CreateSession::new(app, user).with_id(format!("s{task}")).with_state(state))
                .await
                .expect("concurrent create")
                .key
        });
    }
    let mut keys = Vec::new();
    while let Some(key) = creates.join_next().await {
        keys.push(key.expect("create task"));
    }
    keys.sort();

    // Every task on its own session, writing its own keys of the shared scopes.
    let barrier = Arc::new(Barrier::new(TASKS));
    let mut appends = JoinSet::new();
    for (task, key) in keys.iter().cloned().enumerate() {
        let (store, barrier) = (store.clone(), barrier.clone());
        appends.spawn(async move {
            barrier.wait().await;
            for j in 0..PER_TASK {
                let delta = json!({ format!("user:task_{task}"): j, format!("app:task_{task}"): j, "own": j });
                store.append(&key, ev(delta), AppendOptions::default()).await.expect("concurrent append");
            }
        });
    }
    while let Some(done) = appends.join_next().await {
        done.expect("append task");
    }

    let mut expected = State::new();
    for task in 0..TASKS {
        expected.insert(format!("user:task_{task}"), json!(PER_TASK - 1));
        expected.insert(format!("app:task_{task}"), json!(PER_TASK - 1));
        expected.insert(format!("user:created_{task}"), json!(true));
        expected.insert(format!("app:created_{task}"), json!(true));
    }
    expected.insert("own".into(), json!(PER_TASK - 1));
    for key in &keys {
        let loaded = get(&*store, key).await;
        assert_eq!(loaded.version, PER_TASK as u64);
        let missing: Vec<_> = expected.keys().filter(|k| loaded.state.get(*k) != expected.get(*k)).collect();
        assert!(missing.is_empty(), "{key}: lost or wrong keys {missing:?} in {:?}", loaded.state);
        assert_eq!(loaded.state, expected);
    }
}

/// 8 tasks × 50 increments of one `user:` counter: read the session, write
/// counter + 1 with the version read as the expected version, retry on
/// `StaleSession`. The version check and the write are one atomic step, so
/// the counter ends at exactly 400: no increment lost, none applied twice.
pub async fn concurrent_increments_of_a_user_counter_reach_exactly_400<F: StoreFactory>(f: &F) {
    const TASKS: usize = 8;
    const PER_TASK: usize = 50;
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("counter");
    let session = create(&*store, &app, &user, "s", json!({"user:counter": 0})).await;
    let barrier = Arc::new(Barrier::new(TASKS));
    let mut tasks = JoinSet::new();
    for _ in 0..TASKS {
        let (store, key, barrier) = (store.clone(), session.key.clone(), barrier.clone());
        tasks.spawn(async move {
            barrier.wait().await;
            let mut stale = 0u32;
            for _ in 0..PER_TASK {
                loop {
                    let seen = store
                        .get(&key, GetOptions { num_recent_events: Some(0), after: None })
                        .await
                        .expect("read the counter");
                    let counter = seen.state["user:counter"].as_u64().expect("a number");
                    let options = AppendOptions { expected_version: Some(seen.version), ..AppendOptions::default() };
                    match store.append(&key, ev(json!({ "user:counter": counter + 1 })), options).await {
                        Ok(_) => break,
                        Err(StoreError::StaleSession { .. }) => stale += 1,
                        Err(other) => panic!("increment failed: {other:?}"),
                    }
                }
            }
            stale
        });
    }
    let mut stale = 0;
    while let Some(done) = tasks.join_next().await {
        stale += done.expect("increment task");
    }
    let loaded = get(&*store, &session.key).await;
    assert_eq!(loaded.state["user:counter"], json!(TASKS * PER_TASK), "after {stale} stale retries");
    assert_eq!(loaded.version, (TASKS * PER_TASK) as u64);
}

pub async fn concurrent_appends_with_one_expected_version_store_exactly_one<F: StoreFactory>(f: &F) {
    const ROUNDS: u64 = 10;
    const WRITERS: usize = 4;
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("race");
    let session = create(&*store, &app, &user, "s", json!({})).await;
    let mut winners = Vec::new();
    for version in 0..ROUNDS {
        let barrier = Arc::new(Barrier::new(WRITERS));
        let mut tasks = JoinSet::new();
        for writer in 0..WRITERS {
            let (store, key, barrier) = (store.clone(), session.key.clone(), barrier.clone());
            tasks.spawn(async move {
                let event = ev(json!({ "winner": writer, format!("user:w{version}_{writer}"): true }));
                let id = event.id.clone();
                barrier.wait().await;
                (
                    id,
                    store
                        .append(
                            &key,
                            event,
                            AppendOptions { expected_version: Some(version), ..AppendOptions::default() },
                        )
                        .await,
                )
            });
        }
        let mut stored = Vec::new();
        let mut stale = 0;
        while let Some(outcome) = tasks.join_next().await {
            match outcome.expect("writer task") {
                (id, Ok(answer)) => {
                    assert_eq!((answer.seq, answer.replayed), (Some(version + 1), false));
                    stored.push(id);
                }
                (_, Err(StoreError::StaleSession { expected, actual, .. })) => {
                    assert_eq!((expected, actual), (version, version + 1));
                    stale += 1;
                }
                (_, Err(other)) => panic!("round {version}: unexpected {other}"),
            }
        }
        assert_eq!((stored.len(), stale), (1, WRITERS - 1), "round {version}: exactly one writer wins");
        winners.extend(stored);
    }
    let loaded = get(&*store, &session.key).await;
    assert_eq!(loaded.version, ROUNDS);
    assert_eq!(ids(&loaded.events), winners, "only the winners' events are stored");
    let user_keys = loaded.state.keys().filter(|k| k.starts_with("user:")).count();
    assert_eq!(user_keys, ROUNDS as usize, "only the winners' deltas were applied");
}

pub async fn concurrent_retries_of_one_event_store_it_once<F: StoreFactory>(f: &F) {
    const RETRIES: usize = 8;
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("retries");
    let session = create(&*store, &app, &user, "s", json!({})).await;
    for round in 0..5u64 {
        let event = ev(json!({ "round": round, "user:rounds": round }));
        let barrier = Arc::new(Barrier::new(RETRIES));
        let mut tasks = JoinSet::new();
        for _ in 0..RETRIES {
            let (store, key, barrier, event) = (store.clone(), session.key.clone(), barrier.clone(), event.clone());
            tasks.spawn(async move {
                barrier.wait().await;
                store.append(&key, event, AppendOptions::default()).await.expect("retry")
            });
        }
        let mut fresh = 0;
        while let Some(answer) = tasks.join_next().await {
            let answer = answer.expect("retry task");
            assert_eq!(answer.seq, Some(round + 1), "every retry answers with the one seq");
            assert_eq!(answer.event, event);
            if !answer.replayed {
                fresh += 1;
            }
        }
        assert_eq!(fresh, 1, "round {round}: exactly one append stored the event");
    }
    let loaded = get(&*store, &session.key).await;
    assert_eq!((loaded.version, loaded.events.len()), (5, 5));
}

pub async fn concurrent_creates_of_one_id_make_one_session<F: StoreFactory>(f: &F) {
    const CREATORS: usize = 8;
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("createrace");
    for return_existing in [false, true] {
        let id = format!("race-{return_existing}");
        let barrier = Arc::new(Barrier::new(CREATORS));
        let mut tasks = JoinSet::new();
        for creator in 0..CREATORS {
            let (store, app, user, barrier, id) =
                (store.clone(), app.clone(), user.clone(), barrier.clone(), id.clone());
            tasks.spawn(async move {
                let user_key = format!("user:{id}_c{creator}");
                let mut request = CreateSession::new(app, user)
                    .with_id(id)
                    .with_state(obj(json!({ "creator": creator, user_key: true })));
                if return_existing {
                    request = request.return_existing();
                }
                barrier.wait().await;
                store.create(request).await
            });
        }
        let mut sessions = Vec::new();
        let mut taken = 0;
        while let Some(outcome) = tasks.join_next().await {
            match outcome.expect("create task") {
                Ok(session) => sessions.push(session),
                Err(StoreError::AlreadyExists(k)) if k.session_id.as_str() == id => taken += 1,
                Err(other) => panic!("unexpected {other}"),
            }
        }
        let stored = get(&*store, &key(&app, &user, &id)).await;
        let winner = stored.state["creator"].clone();
        if return_existing {
            assert_eq!(sessions.len(), CREATORS, "return_existing: every creator gets the session");
            assert!(sessions.iter().all(|s| s.created_at == stored.created_at && s.state["creator"] == winner));
        } else {
            assert_eq!((sessions.len(), taken), (1, CREATORS - 1), "exactly one create wins");
            assert_eq!(sessions[0].created_at, stored.created_at);
        }
        // Only the winner's initial user state was applied.
        let winner_key = format!("user:{id}_c{}", winner.as_u64().expect("creator number"));
        let user_keys: Vec<&String> = stored.state.keys().filter(|k| k.starts_with(&format!("user:{id}_"))).collect();
        assert_eq!(user_keys, [&winner_key], "only the winning create wrote user state");
    }
    let listed = session_ids(&list_all(&*store, &app, &user).await);
    assert_eq!(listed.len(), 2, "{listed:?}");
}
