//! A crowd through adk's `SessionService`: three hundred writers share the
//! default pool (sixteen connections), each appending to its own session for
//! a few seconds. The store queues callers for a connection in arrival order,
//! so every wait is bounded by the queue ahead and not one call fails; and
//! every append the service acknowledged is in the log exactly once, in a
//! gapless sequence.
#![cfg(feature = "postgres")]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use adk_core::{AdkIdentity, Content};
use adk_postgres_adk::PgSessionService;
use adk_postgres_testing::test_database;
use adk_session::{AppendEventRequest, CreateRequest, Event, SessionService};
use serde_json::json;
use tokio::task::JoinSet;

const WRITERS: usize = 300;
const APP: &str = "crowd";
/// How long the writers keep appending.
const RUN_FOR: Duration = Duration::from_secs(3);
/// Attempts at one call before a writer gives up; far more than a healthy
/// store needs (none), but a store that keeps failing must not hang the test.
const MAX_ATTEMPTS: usize = 20;

/// What one writer saw.
#[derive(Debug, Default)]
struct Tally {
    session_id: String,
    /// Ids of the appends the service acknowledged, in order.
    acknowledged: Vec<String>,
    /// Failed attempts (of create or append) by error code.
    errors: BTreeMap<&'static str, usize>,
    /// A call that still failed after MAX_ATTEMPTS.
    gave_up: Option<String>,
}

fn identity(user: &str, session_id: &str) -> AdkIdentity {
    AdkIdentity::new(APP.try_into().unwrap(), user.try_into().unwrap(), session_id.try_into().unwrap())
}

fn event(id: String, n: usize) -> Event {
    let mut e = Event::new(format!("inv-{n}"));
    e.id = id;
    e.author = "agent".into();
    e.llm_response.content = Some(Content::new("model").with_text(format!("turn {n}")));
    e.actions.state_delta.insert("n".into(), json!(n));
    e
}

async fn writer(svc: Arc<PgSessionService>, w: usize, deadline: Instant) -> Tally {
    let user = format!("writer-{w}");
    let mut tally = Tally { session_id: format!("session-{w}"), ..Tally::default() };
    let request = CreateRequest {
        app_name: APP.into(),
        user_id: user.clone(),
        session_id: Some(tally.session_id.clone()),
        state: Default::default(),
    };
    let mut created = false;
    for _ in 0..MAX_ATTEMPTS {
        match svc.create(request.clone()).await {
            Ok(_) => {
                created = true;
                break;
            }
            Err(e) => {
                *tally.errors.entry(e.code).or_default() += 1;
                // A create that failed on the wire may have committed.
                if e.code == adk_postgres_adk::codes::ALREADY_EXISTS {
                    created = true;
                    break;
                }
            }
        }
    }
    if !created {
        tally.gave_up = Some(format!("{user}: create"));
        return tally;
    }

    let mut n = 0;
    while Instant::now() < deadline {
        n += 1;
        let id = format!("{user}-{n}");
        let e = event(id.clone(), n);
        let mut acknowledged = false;
        for _ in 0..MAX_ATTEMPTS {
            // A retry sends the same event id: the store answers a repeat of
            // a stored append with the stored event, never a second row.
            let request = AppendEventRequest { identity: identity(&user, &tally.session_id), event: e.clone() };
            match svc.append_event_for_identity(request).await {
                Ok(()) => {
                    acknowledged = true;
                    break;
                }
                Err(e) => *tally.errors.entry(e.code).or_default() += 1,
            }
        }
        if !acknowledged {
            tally.gave_up = Some(format!("{user}: append {id}"));
            break;
        }
        tally.acknowledged.push(id);
    }
    tally
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_hundred_writers_on_the_default_pool_get_no_error_and_lose_nothing() {
    let db = test_database().await;
    // The default PoolConfig: sixteen connections for three hundred writers.
    let svc = Arc::new(PgSessionService::connect(db.url()).await.expect("connect"));

    let deadline = Instant::now() + RUN_FOR;
    let mut writers = JoinSet::new();
    for w in 0..WRITERS {
        writers.spawn(writer(Arc::clone(&svc), w, deadline));
    }
    let mut tallies = Vec::with_capacity(WRITERS);
    while let Some(tally) = writers.join_next().await {
        tallies.push(tally.expect("writer panicked"));
    }

    let mut errors: BTreeMap<&'static str, usize> = BTreeMap::new();
    for tally in &tallies {
        for (code, count) in &tally.errors {
            *errors.entry(code).or_default() += count;
        }
    }
    let acknowledged: usize = tallies.iter().map(|t| t.acknowledged.len()).sum();
    let gave_up: Vec<&String> = tallies.iter().filter_map(|t| t.gave_up.as_ref()).collect();
    eprintln!("{WRITERS} writers, {acknowledged} appends acknowledged, errors by code: {errors:?}");
    assert!(gave_up.is_empty(), "{} writers gave up, e.g. {:?}; errors by code: {errors:?}", gave_up.len(), gave_up[0]);
    assert!(errors.is_empty(), "calls failed on the default pool; errors by code: {errors:?}");
    assert!(tallies.iter().all(|t| !t.acknowledged.is_empty()), "a writer never got an append in");

    // The log, read as the owner: each session holds exactly the appends
    // acknowledged to its writer, once each, in order, seq 1..n.
    let sql = db.connect().await;
    let rows = sql
        .query(
            "SELECT session_id, array_agg(event_id ORDER BY seq), array_agg(seq ORDER BY seq)
             FROM adk_events WHERE app_name = $1 GROUP BY session_id",
            &[&APP],
        )
        .await
        .expect("read the log");
    let mut stored: BTreeMap<String, (Vec<String>, Vec<i64>)> =
        rows.iter().map(|r| (r.get(0), (r.get(1), r.get(2)))).collect();
    assert_eq!(stored.len(), WRITERS, "sessions with events");
    for tally in &tallies {
        let (ids, seqs) = stored.remove(&tally.session_id).unwrap_or_default();
        assert_eq!(ids, tally.acknowledged, "{}: stored events differ from the acknowledged ones", tally.session_id);
        let gapless: Vec<i64> = (1..=ids.len() as i64).collect();
        assert_eq!(seqs, gapless, "{}: seq is not 1..n", tally.session_id);
    }
    let last_seqs: i64 = sql
        .query_one(
            "SELECT count(*) FROM adk_sessions s
             WHERE s.app_name = $1
               AND s.last_seq = (SELECT count(*) FROM adk_events e
                                 WHERE (e.app_name, e.user_id, e.session_id) = (s.app_name, s.user_id, s.session_id))",
            &[&APP],
        )
        .await
        .expect("last_seq")
        .get(0);
    assert_eq!(last_seqs as usize, WRITERS, "a session's last_seq differs from its event count");
}
