//! The invocation lease (`adk_postgres_domain::lease`): one invocation at a
//! time per session, released by the holder's last append or lapsed after
//! its idle time, and fenced by its generation.

use std::time::Duration;

use adk_postgres_domain::{AppendOptions, Event, InvocationLease, LeaseGrant, StoreConfig, StoreError};
use serde_json::json;

use super::*;

fn turn_event(invocation: &str, text: &str) -> Event {
    let mut event = Event::new("agent");
    event.invocation_id = invocation.to_owned();
    event.content = Some(json!({"role": "model", "parts": [{"text": text}]}));
    event
}

async fn leased(
    store: &dyn SessionStore,
    key: &SessionKey,
    event: Event,
    lease: InvocationLease,
) -> Result<Appended, StoreError> {
    store.append(key, event, AppendOptions { lease: Some(lease), ..AppendOptions::default() }).await
}

fn next(grant: Option<LeaseGrant>, idle: Duration, release: bool) -> InvocationLease {
    InvocationLease { idle, generation: grant.map(|g| g.generation), release }
}

async fn invocations(store: &dyn SessionStore, key: &SessionKey) -> Vec<String> {
    get(store, key).await.events.into_iter().map(|e| e.invocation_id).collect()
}

pub async fn lease_refuses_other_invocations_until_the_holder_releases_it<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("lease-release");
    let session = create(&*store, &app, &user, "s", json!({})).await;
    let idle = Duration::from_secs(60);

    let a1 = leased(&*store, &session.key, turn_event("inv-a", "a1"), InvocationLease::take(idle)).await.expect("free");
    let grant = a1.lease.expect("a stored append under the lease reports it");
    assert_eq!(grant.generation, 1);
    assert!(grant.expires_at.is_some_and(|at| at > Utc::now()), "{grant:?}");

    let refused = leased(&*store, &session.key, turn_event("inv-b", "b1"), InvocationLease::take(idle)).await;
    match refused {
        Err(StoreError::SessionBusy { holder, lapses_at, .. }) => {
            assert_eq!(holder, "inv-a");
            assert_eq!(Some(lapses_at), grant.expires_at);
        }
        other => panic!("expected SessionBusy, got {other:?}"),
    }
    assert!(
        matches!(
            leased(&*store, &session.key, turn_event("inv-b", "b1"), InvocationLease::take(idle)).await,
            Err(ref e @ StoreError::SessionBusy { .. }) if e.is_retryable()
        ),
        "busy is retryable"
    );

    let a2 =
        leased(&*store, &session.key, turn_event("inv-a", "a2"), next(a1.lease, idle, false)).await.expect("holder");
    assert_eq!(a2.lease.map(|g| g.generation), Some(1), "the holder keeps its generation");
    let a3 =
        leased(&*store, &session.key, turn_event("inv-a", "a3"), next(a2.lease, idle, true)).await.expect("holder");
    assert_eq!(a3.lease, Some(LeaseGrant { generation: 1, expires_at: None }), "released");

    let b1 = leased(&*store, &session.key, turn_event("inv-b", "b1"), InvocationLease::take(idle)).await.expect("free");
    assert_eq!(b1.lease.map(|g| g.generation), Some(2), "another invocation takes the next generation");
    assert_eq!(invocations(&*store, &session.key).await, ["inv-a", "inv-a", "inv-a", "inv-b"]);
    assert_eq!(get(&*store, &session.key).await.version, 4, "refused appends took no sequence number");
}

pub async fn lease_lapses_and_a_taken_over_holder_cannot_append<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("lease-lapse");
    let session = create(&*store, &app, &user, "s", json!({})).await;
    let idle = Duration::from_millis(400);

    let a1 = leased(&*store, &session.key, turn_event("inv-a", "a1"), InvocationLease::take(idle)).await.expect("free");
    assert!(matches!(
        leased(&*store, &session.key, turn_event("inv-b", "b1"), InvocationLease::take(idle)).await,
        Err(StoreError::SessionBusy { .. })
    ));
    tokio::time::sleep(idle + Duration::from_millis(200)).await;
    let b1 = leased(&*store, &session.key, turn_event("inv-b", "b1"), InvocationLease::take(Duration::from_secs(60)))
        .await
        .expect("the lease lapsed");
    assert_eq!(b1.lease.map(|g| g.generation), Some(2));

    // The late holder, while the new one is live: busy.
    let late = leased(&*store, &session.key, turn_event("inv-a", "a2"), next(a1.lease, idle, false)).await;
    assert!(matches!(late, Err(StoreError::SessionBusy { ref holder, .. }) if holder == "inv-b"), "{late:?}");
    // After the new holder released it: the lease was lost, not free.
    leased(&*store, &session.key, turn_event("inv-b", "b2"), next(b1.lease, idle, true)).await.expect("release");
    let late = leased(&*store, &session.key, turn_event("inv-a", "a2"), next(a1.lease, idle, false)).await;
    assert!(matches!(late, Err(StoreError::LeaseLost { held: 1, current: 2, .. })), "{late:?}");
    assert_eq!(invocations(&*store, &session.key).await, ["inv-a", "inv-b", "inv-b"], "nothing of the late holder");

    // A holder whose lease lapsed with nobody taking over goes on.
    let c1 = leased(&*store, &session.key, turn_event("inv-c", "c1"), InvocationLease::take(idle)).await.expect("free");
    tokio::time::sleep(idle + Duration::from_millis(200)).await;
    let c2 = leased(&*store, &session.key, turn_event("inv-c", "c2"), next(c1.lease, idle, false)).await;
    assert_eq!(c2.expect("lapsed but not taken over").lease.map(|g| g.generation), Some(3));
}

pub async fn lease_is_ignored_by_appends_without_it_and_replays_still_answer<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("lease-off");
    let session = create(&*store, &app, &user, "s", json!({})).await;
    let idle = Duration::from_secs(60);
    let first = turn_event("inv-a", "a1");
    leased(&*store, &session.key, first.clone(), InvocationLease::take(idle)).await.expect("free");
    leased(&*store, &session.key, turn_event("inv-b", "b1"), InvocationLease::take(idle)).await.expect_err("busy");

    // A retry of a stored event is answered, whoever holds the lease now.
    let retry = leased(&*store, &session.key, first, InvocationLease::take(idle)).await.expect("replay");
    assert!(retry.replayed);
    let other = leased(&*store, &session.key, turn_event("inv-b", "b1"), InvocationLease::take(idle)).await;
    assert!(matches!(other, Err(StoreError::SessionBusy { .. })));

    // A store whose caller turned the lease off appends regardless.
    let unleased = append(&*store, &session.key, turn_event("inv-b", "b1")).await;
    assert_eq!((unleased.seq, unleased.lease), (Some(2), None));
}

pub async fn lease_refuses_bad_requests_with_nothing_written<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("lease-bad");
    let session = create(&*store, &app, &user, "s", json!({})).await;
    let no_invocation =
        leased(&*store, &session.key, Event::new("agent"), InvocationLease::take(Duration::from_secs(1))).await;
    assert!(
        matches!(no_invocation, Err(StoreError::InvalidInput { ref field, .. }) if field == "event.invocation_id"),
        "{no_invocation:?}"
    );
    let zero = leased(&*store, &session.key, turn_event("inv", "x"), InvocationLease::take(Duration::ZERO)).await;
    assert!(matches!(zero, Err(StoreError::InvalidInput { ref field, .. }) if field == "lease.idle"), "{zero:?}");
    let huge = InvocationLease { generation: Some(u64::MAX), ..InvocationLease::take(Duration::from_secs(1)) };
    let huge = leased(&*store, &session.key, turn_event("inv", "x"), huge).await;
    assert!(matches!(huge, Err(StoreError::InvalidInput { ref field, .. }) if field == "lease.generation"), "{huge:?}");
    assert_eq!(get(&*store, &session.key).await.version, 0);
}

/// Invocations racing for one session, each appending a few events and
/// retrying while the session is busy: every one completes, and each one's
/// events stand together.
pub async fn racing_invocations_take_turns_and_never_interleave<F: StoreFactory>(f: &F) {
    const INVOCATIONS: usize = 20;
    const EVENTS: usize = 3;
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("lease-race");
    let session = create(&*store, &app, &user, "s", json!({})).await;
    let barrier = Arc::new(tokio::sync::Barrier::new(INVOCATIONS));
    let mut tasks = JoinSet::new();
    for i in 0..INVOCATIONS {
        let (store, key, barrier) = (store.clone(), session.key.clone(), barrier.clone());
        tasks.spawn(async move {
            barrier.wait().await;
            let invocation = format!("inv-{i:02}");
            let idle = Duration::from_secs(30);
            let mut grant = None;
            let mut busy = 0_usize;
            for n in 0..EVENTS {
                loop {
                    let lease = next(grant, idle, n + 1 == EVENTS);
                    match leased(&*store, &key, turn_event(&invocation, &format!("{n}")), lease).await {
                        Ok(appended) => {
                            grant = appended.lease;
                            // The turn's next event comes after a model or tool
                            // call: others try meanwhile, on either store.
                            tokio::time::sleep(Duration::from_millis(1)).await;
                            break;
                        }
                        Err(StoreError::SessionBusy { .. }) => {
                            busy += 1;
                            tokio::time::sleep(Duration::from_millis(2)).await;
                        }
                        Err(e) => panic!("{invocation}: {e}"),
                    }
                }
            }
            busy
        });
    }
    let mut refusals = 0;
    while let Some(done) = tasks.join_next().await {
        refusals += done.expect("an invocation panicked");
    }
    let stored = invocations(&*store, &session.key).await;
    assert_eq!(stored.len(), INVOCATIONS * EVENTS);
    for turn in stored.chunks(EVENTS) {
        assert!(turn.iter().all(|i| *i == turn[0]), "interleaved: {stored:?}");
    }
    assert!(refusals > 0, "the invocations never met: the race tested nothing");
}
