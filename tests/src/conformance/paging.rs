//! `list_events`: a session's events a page at a time, forward or
//! backward, each page consistent with the appends racing it.

use std::sync::Arc;
use std::time::Duration;

use adk_postgres_domain::{
    Event, EventCursor, EventPage, EventsPage, MAX_EVENT_PAGE, SessionKey, SessionStore, StoreConfig, StoreError,
};
use serde_json::json;
use tokio::task::JoinSet;

use super::*;

async fn page(store: &dyn SessionStore, key: &SessionKey, page: EventPage) -> EventsPage {
    store.list_events(key, page).await.unwrap_or_else(|e| panic!("list_events {key} {page:?}: {e}"))
}

/// Every event, following pages from `first` in its direction; also
/// returns each page's size.
async fn all_pages(
    store: &dyn SessionStore,
    key: &SessionKey,
    first: EventPage,
) -> (Vec<u64>, Vec<String>, Vec<usize>) {
    let (mut seqs, mut ids, mut sizes) = (Vec::new(), Vec::new(), Vec::new());
    let mut request = Some(first);
    while let Some(current) = request {
        let read = page(store, key, current).await;
        sizes.push(read.events.len());
        let got: Vec<u64> = read.events.iter().map(|e| e.seq).collect();
        let got_ids: Vec<String> = read.events.iter().map(|e| e.event.id.clone()).collect();
        if first.cursor.is_forward() {
            seqs.extend(got);
            ids.extend(got_ids);
        } else {
            seqs.splice(0..0, got);
            ids.splice(0..0, got_ids);
        }
        request = read.next(current);
        assert!(sizes.len() <= 100, "paging does not end");
    }
    (seqs, ids, sizes)
}

pub async fn list_events_pages_forward_and_backward_without_gaps<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("evpages");
    let session = create(&*store, &app, &user, "s", json!({})).await;
    for i in 0..25 {
        append(&*store, &session.key, ev(json!({"turn": i}))).await;
    }
    let full = get(&*store, &session.key).await;
    let all_ids = ids(&full.events);
    let all_seqs: Vec<u64> = (1..=25).collect();

    let (seqs, ids_forward, sizes) = all_pages(&*store, &session.key, EventPage::first(7)).await;
    assert_eq!((seqs, sizes), (all_seqs.clone(), vec![7, 7, 7, 4]), "forward pages chain without gap");
    assert_eq!(ids_forward, all_ids);
    let (seqs, ids_backward, sizes) = all_pages(&*store, &session.key, EventPage::last(7)).await;
    assert_eq!((seqs, sizes), (all_seqs, vec![7, 7, 7, 4]), "backward pages chain without gap");
    assert_eq!(ids_backward, all_ids);

    let first = page(&*store, &session.key, EventPage::first(3)).await;
    assert_eq!(first.version, 25);
    assert!(first.more);
    let events: Vec<Event> = first.events.iter().map(|e| e.event.clone()).collect();
    assert_eq!(events, full.events[..3], "events read back as get reads them");
    let last = page(&*store, &session.key, EventPage::last(3)).await;
    assert_eq!(last.events.iter().map(|e| e.seq).collect::<Vec<_>>(), [23, 24, 25], "ascending on a backward page");
    assert!(last.more);

    let exact = page(&*store, &session.key, EventPage::first(25)).await;
    assert_eq!((exact.events.len(), exact.more), (25, false), "a page holding the rest says no more");
    let middle = page(&*store, &session.key, EventPage::before(11, 4)).await;
    assert_eq!(middle.events.iter().map(|e| e.seq).collect::<Vec<_>>(), [7, 8, 9, 10]);
    let middle = page(&*store, &session.key, EventPage::after(10, 4)).await;
    assert_eq!(middle.events.iter().map(|e| e.seq).collect::<Vec<_>>(), [11, 12, 13, 14]);
    for beyond in
        [EventPage::after(25, 5), EventPage::after(1_000_000, 5), EventPage::before(1, 5), EventPage::before(0, 5)]
    {
        let read = page(&*store, &session.key, beyond).await;
        assert!(read.events.is_empty() && !read.more, "{beyond:?}: {read:?}");
        assert_eq!(read.version, 25);
    }
    let past_end = page(&*store, &session.key, EventPage::before(1_000_000, 2)).await;
    assert_eq!(past_end.events.iter().map(|e| e.seq).collect::<Vec<_>>(), [24, 25]);

    let empty = create(&*store, &app, &user, "empty", json!({})).await;
    for cursor in [EventCursor::Start, EventCursor::End] {
        let read = page(&*store, &empty.key, EventPage { cursor, limit: MAX_EVENT_PAGE }).await;
        assert_eq!((read.events.len(), read.more, read.version), (0, false, 0));
    }
}

pub async fn list_events_refuses_bad_limits_and_missing_sessions<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("evbad");
    let session = create(&*store, &app, &user, "s", json!({})).await;
    append(&*store, &session.key, Event::new("agent")).await;
    for limit in [0, MAX_EVENT_PAGE + 1, usize::MAX] {
        for cursor in [EventCursor::Start, EventCursor::End, EventCursor::After(0), EventCursor::Before(3)] {
            expect_invalid(
                store.list_events(&session.key, EventPage { cursor, limit }).await,
                |field| field == "limit",
                "limit",
            );
        }
    }
    // Checked before anything is read: a missing session with a bad limit
    // is still a bad limit.
    let missing = key(&app, &user, "missing");
    expect_invalid(store.list_events(&missing, EventPage::first(0)).await, |f| f == "limit", "limit first");
    expect_invalid(store.list_events(&session.key, EventPage::after(u64::MAX, 1)).await, |f| f == "cursor", "seq");
    expect_not_found(store.list_events(&missing, EventPage::first(10)).await, &missing, "missing session");
    let foreign = key(&app, &other_user(&user), "s");
    expect_not_found(store.list_events(&foreign, EventPage::first(10)).await, &foreign, "another user's");
    let foreign = key(&other_app(&app), &user, "s");
    expect_not_found(store.list_events(&foreign, EventPage::last(10)).await, &foreign, "another app's");
    assert_eq!(page(&*store, &session.key, EventPage::last(MAX_EVENT_PAGE)).await.events.len(), 1);
    assert_healthy(&*store, &app).await;
}

pub async fn list_events_of_an_expired_session_is_not_found<F: StoreFactory>(f: &F) {
    let ttl = Duration::from_millis(300);
    let store = f.store(StoreConfig { default_ttl: Some(ttl), ..StoreConfig::default() }).await;
    let (app, user) = names("evexpired");
    let session = create(&*store, &app, &user, "s", json!({})).await;
    append(&*store, &session.key, Event::new("agent")).await;
    assert_eq!(page(&*store, &session.key, EventPage::first(5)).await.events.len(), 1);
    tokio::time::sleep(ttl + Duration::from_millis(300)).await;
    expect_not_found(store.list_events(&session.key, EventPage::first(5)).await, &session.key, "expired");
}

/// Appenders race pagers: every page is gapless and ascending, holds
/// nothing past the version it reports, and the pages of one pass chain
/// into 1..=n with nothing missing or twice.
pub async fn list_events_during_concurrent_appends_is_gapless_and_in_order<F: StoreFactory>(f: &F) {
    const WRITERS: usize = 4;
    const EACH: usize = 40;
    let store: Arc<dyn SessionStore> = f.store(StoreConfig::default()).await;
    let (app, user) = names("evrace");
    let key = create(&*store, &app, &user, "s", json!({})).await.key;
    let mut tasks = JoinSet::new();
    for w in 0..WRITERS {
        let (store, key) = (store.clone(), key.clone());
        tasks.spawn(async move {
            for i in 0..EACH {
                let event = ev(json!({ format!("w{w}"): i }));
                store.append(&key, event, Default::default()).await.map(drop)?;
            }
            Ok::<_, StoreError>(0usize)
        });
    }
    for forward in [true, false, true] {
        let (store, key) = (store.clone(), key.clone());
        tasks.spawn(async move {
            let mut pages = 0;
            for pass in 0..8 {
                let first = if forward { EventPage::first(7) } else { EventPage::last(7) };
                let mut request = Some(first);
                let mut chained: Vec<u64> = Vec::new();
                while let Some(current) = request {
                    let read = store.list_events(&key, current).await?;
                    pages += 1;
                    let seqs: Vec<u64> = read.events.iter().map(|e| e.seq).collect();
                    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "pass {pass}: a page with a gap: {seqs:?}");
                    assert!(seqs.iter().all(|&s| s <= read.version), "past its version {}: {seqs:?}", read.version);
                    if forward {
                        // The page ends at its version, or says more follow.
                        assert!(read.more || seqs.last().copied().unwrap_or(0) == read.version, "{read:?}");
                        chained.extend(&seqs);
                    } else {
                        assert!(read.more || seqs.first().copied().unwrap_or(1) == 1, "{seqs:?}");
                        chained.splice(0..0, seqs);
                    }
                    request = read.next(current);
                }
                let expected: Vec<u64> = match (forward, chained.first(), chained.last()) {
                    (_, None, _) | (_, _, None) => Vec::new(),
                    (true, _, Some(&last)) => (1..=last).collect(),
                    (false, Some(&first), Some(&last)) => {
                        assert_eq!(first, 1, "a backward pass reaches the first event");
                        (1..=last).collect()
                    }
                };
                assert_eq!(
                    chained,
                    expected,
                    "pass {pass} ({}) has a gap",
                    if forward { "forward" } else { "backward" }
                );
                tokio::task::yield_now().await;
            }
            Ok(pages)
        });
    }
    let mut pages = 0;
    while let Some(done) = tasks.join_next().await {
        pages += done.expect("task").expect("store call");
    }
    assert!(pages > 0);
    let last = page(&*store, &key, EventPage::last(1)).await;
    assert_eq!(last.version, (WRITERS * EACH) as u64);
    let (seqs, _, _) = all_pages(&*store, &key, EventPage::first(MAX_EVENT_PAGE)).await;
    assert_eq!(seqs, (1..=(WRITERS * EACH) as u64).collect::<Vec<_>>());
}
