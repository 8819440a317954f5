//! Session metadata: a display name and labels, set at create and replaced
//! by `set_metadata`, which is not an append; and the list filters on them
//! (labels, every one must match) and on the last update time (a half-open
//! window), keyset-paged like any listing.

use std::collections::BTreeMap;
use std::time::Duration;

use adk_postgres_domain::metadata::{MAX_DISPLAY_NAME_CHARS, MAX_LABEL_KEY_BYTES, MAX_LABEL_VALUE_CHARS, MAX_LABELS};
use adk_postgres_domain::{
    AppName, CreateSession, Event, GetOptions, ListSessions, PageToken, SessionId, SessionKey, SessionMetadata,
    SessionPage, SessionStore, SessionSummary, StoreConfig, StoreError, UserId,
};
use chrono::{DateTime, Utc};
use serde_json::json;

use super::*;

/// Label pairs as a case writes them.
type Pairs<'a> = &'a [(&'a str, &'a str)];
/// A window's bounds, either open.
type Window = (Option<DateTime<Utc>>, Option<DateTime<Utc>>);

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

fn with_labels(pairs: &[(&str, &str)]) -> SessionMetadata {
    SessionMetadata { display_name: None, labels: labels(pairs) }
}

async fn create_with(
    store: &dyn SessionStore,
    app: &AppName,
    user: &UserId,
    id: &str,
    metadata: SessionMetadata,
) -> SessionKey {
    store
        .create(CreateSession::new(app.clone(), user.clone()).with_id(id).with_metadata(metadata))
        .await
        .unwrap_or_else(|e| panic!("create {id} with metadata: {e}"))
        .key
}

async fn set(store: &dyn SessionStore, key: &SessionKey, metadata: SessionMetadata) {
    store.set_metadata(key, metadata).await.unwrap_or_else(|e| panic!("set_metadata on {key}: {e}"));
}

/// A list request for the user with `labels` as its filter and the window.
fn filtered(
    app: &AppName,
    user: &UserId,
    pairs: &[(&str, &str)],
    updated_after: Option<DateTime<Utc>>,
    updated_before: Option<DateTime<Utc>>,
) -> ListSessions {
    let mut request = ListSessions::new(app.clone(), user.clone());
    request.labels = labels(pairs);
    request.updated_after = updated_after;
    request.updated_before = updated_before;
    request
}

/// Every session `request` lists, following page tokens, with the page
/// size it asks for (the maximum when it asks for none).
async fn list_every_page(store: &dyn SessionStore, request: &ListSessions) -> (Vec<SessionSummary>, Vec<usize>) {
    let mut request = request.clone();
    request.page_size = request.page_size.or(Some(MAX_PAGE_SIZE));
    let mut all = Vec::new();
    let mut sizes = Vec::new();
    loop {
        let page: SessionPage = store.list(&request).await.unwrap_or_else(|e| panic!("list {request:?}: {e}"));
        sizes.push(page.sessions.len());
        all.extend(page.sessions);
        match page.next_page_token {
            Some(next) => {
                assert!(sizes.len() <= 100, "paging does not end");
                request.page_token = Some(next);
            }
            None => return (all, sizes),
        }
    }
}

async fn listed_ids(store: &dyn SessionStore, request: &ListSessions) -> Vec<String> {
    session_ids(&list_every_page(store, request).await.0)
}

/// The largest metadata the bounds allow, with multi-byte characters where
/// characters (not bytes) are counted.
fn largest_metadata() -> SessionMetadata {
    let mut metadata = SessionMetadata::new().with_display_name("✈".repeat(MAX_DISPLAY_NAME_CHARS));
    for i in 0..MAX_LABELS - 1 {
        metadata = metadata.with_label(format!("k{i:02}"), "é".repeat(MAX_LABEL_VALUE_CHARS));
    }
    let long_key =
        format!("a{}", "./-_9".repeat(MAX_LABEL_KEY_BYTES)).chars().take(MAX_LABEL_KEY_BYTES).collect::<String>();
    metadata.with_label(long_key, "")
}

pub async fn create_with_metadata_shows_it_in_get_and_list<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("metacreate");
    let metadata = SessionMetadata::new()
        .with_display_name("Trip to Lisbon ✈")
        .with_label("team", "travel")
        .with_label("k8s.io/tier", "gold")
        .with_label("quote", "it's \"50%\" off_\\ 日本")
        .with_label("empty", "");
    let created = store
        .create(CreateSession::new(app.clone(), user.clone()).with_id("titled").with_metadata(metadata.clone()))
        .await
        .expect("create with metadata");
    assert_eq!(created.metadata, metadata, "create answers with the metadata");
    assert_eq!(get(&*store, &created.key).await.metadata, metadata, "get reads it back exactly");
    let plain = create(&*store, &app, &user, "plain", json!({})).await;
    assert_eq!(plain.metadata, SessionMetadata::default(), "no metadata: no name, no labels");

    let largest = largest_metadata();
    assert!(largest.validate().is_ok(), "the largest metadata is within the bounds");
    let big = create_with(&*store, &app, &user, "largest", largest.clone()).await;
    assert_eq!(get(&*store, &big).await.metadata, largest, "metadata at every bound is stored whole");

    let listed = list_all(&*store, &app, &user).await;
    assert_eq!(session_ids(&listed), ["largest", "plain", "titled"]);
    let by_id: BTreeMap<&str, &SessionMetadata> =
        listed.iter().map(|s| (s.key.session_id.as_str(), &s.metadata)).collect();
    assert_eq!(by_id["titled"], &metadata, "list shows the metadata");
    assert_eq!(by_id["plain"], &SessionMetadata::default());
    assert_eq!(by_id["largest"], &largest);

    // A retried create with other metadata returns the session as stored.
    let other = SessionMetadata::new().with_display_name("another title").with_label("team", "food");
    let again = store
        .create(
            CreateSession::new(app.clone(), user.clone())
                .with_id("titled")
                .with_metadata(other.clone())
                .return_existing(),
        )
        .await
        .expect("create returning the existing session");
    assert_eq!(again.metadata, metadata, "the existing session keeps its metadata");
    let taken =
        store.create(CreateSession::new(app.clone(), user.clone()).with_id("titled").with_metadata(other)).await;
    assert!(matches!(taken, Err(StoreError::AlreadyExists(_))), "{taken:?}");
    assert_eq!(get(&*store, &created.key).await.metadata, metadata, "a refused create overwrote nothing");
}

pub async fn set_metadata_replaces_without_moving_version_or_update_time<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("metaset");
    let first = SessionMetadata::new().with_display_name("first").with_label("a", "1").with_label("b", "2");
    let s1 = create_with(&*store, &app, &user, "s1", first).await;
    tokio::time::sleep(Duration::from_millis(3)).await;
    let s2 = create(&*store, &app, &user, "s2", json!({"k": "v"})).await.key;
    tokio::time::sleep(Duration::from_millis(3)).await;
    append(&*store, &s1, ev(json!({"step": 1}))).await;
    append(&*store, &s1, ev(json!({"step": 2, "user:plan": "pro"}))).await;
    let before = get(&*store, &s1).await;
    let order = session_ids(&list_all(&*store, &app, &user).await);
    assert_eq!(order, ["s1", "s2"]);

    // Replaced whole: labels are not merged, and no name means none.
    let second = with_labels(&[("c", "3")]);
    set(&*store, &s1, second.clone()).await;
    let after = get(&*store, &s1).await;
    assert_eq!(after.metadata, second, "replaced, not merged");
    assert_eq!(after.version, before.version, "not an append: the version stays");
    assert_eq!(after.last_update_time, before.last_update_time, "not an append: the update time stays");
    assert_eq!((after.events, after.state), (before.events, before.state), "events and state untouched");

    // Renaming the older session does not move it to the top of the list.
    set(&*store, &s2, SessionMetadata::new().with_display_name("renamed")).await;
    let listed = list_all(&*store, &app, &user).await;
    assert_eq!(session_ids(&listed), order, "set_metadata does not reorder the listing");
    assert_eq!(listed[1].metadata.display_name.as_deref(), Some("renamed"));
    assert_eq!(listed[1].version, 0);

    // Appends and a retried set keep it; clearing it is a set like any other.
    set(&*store, &s1, second.clone()).await;
    append(&*store, &s1, Event::new("agent")).await;
    let appended = get(&*store, &s1).await;
    assert_eq!((appended.version, &appended.metadata), (before.version + 1, &second), "an append keeps the metadata");
    set(&*store, &s1, SessionMetadata::default()).await;
    assert_eq!(get(&*store, &s1).await.metadata, SessionMetadata::default(), "cleared");
}

/// Each bad metadata with the field its refusal must name (a prefix).
fn bad_metadata() -> Vec<(&'static str, SessionMetadata, &'static str)> {
    let mut too_many = SessionMetadata::new();
    for i in 0..=MAX_LABELS {
        too_many = too_many.with_label(format!("k{i}"), "v");
    }
    vec![
        ("a blank name", SessionMetadata::new().with_display_name(" \u{3000} "), "metadata.display_name"),
        ("an empty name", SessionMetadata::new().with_display_name(""), "metadata.display_name"),
        ("a name with a newline", SessionMetadata::new().with_display_name("a\nb"), "metadata.display_name"),
        ("a name with a C1 control", SessionMetadata::new().with_display_name("a\u{85}b"), "metadata.display_name"),
        ("a name too long", SessionMetadata::new().with_display_name("x".repeat(257)), "metadata.display_name"),
        ("an uppercase key", with_labels(&[("Team", "x")]), "metadata.labels"),
        ("an empty key", with_labels(&[("", "x")]), "metadata.labels"),
        ("a key starting with '-'", with_labels(&[("-x", "x")]), "metadata.labels"),
        ("a key with a space", with_labels(&[("a b", "x")]), "metadata.labels"),
        ("a key of 64 bytes", with_labels(&[(&"k".repeat(64), "x")]), "metadata.labels"),
        ("a value with a control", with_labels(&[("team", "a\u{7}b")]), "metadata.labels.team"),
        ("a value too long", with_labels(&[("team", &"v".repeat(257))]), "metadata.labels.team"),
        ("33 labels", too_many, "metadata.labels"),
    ]
}

pub async fn bad_metadata_is_refused_naming_the_field_and_nothing_is_written<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("metabad");
    let good = SessionMetadata::new().with_display_name("kept").with_label("team", "travel");
    let kept = create_with(&*store, &app, &user, "kept", good.clone()).await;
    for (i, (what, metadata, field)) in bad_metadata().into_iter().enumerate() {
        let id = format!("bad{i}");
        let result = store
            .create(CreateSession::new(app.clone(), user.clone()).with_id(&id).with_metadata(metadata.clone()))
            .await;
        expect_invalid(result, |f| f.starts_with(field), &format!("create with {what}"));
        let refused = key(&app, &user, &id);
        expect_not_found(
            store.get(&refused, GetOptions::default()).await,
            &refused,
            &format!("get after a create with {what}"),
        );
        expect_invalid(store.set_metadata(&kept, metadata).await, |f| f.starts_with(field), &format!("set {what}"));
        assert_eq!(get(&*store, &kept).await.metadata, good, "a refused set ({what}) wrote nothing");
    }
    assert_eq!(session_ids(&list_all(&*store, &app, &user).await), ["kept"], "no refused create left a session");
    assert_healthy(&*store, &app).await;
}

pub async fn set_metadata_of_a_missing_or_expired_session_is_not_found<F: StoreFactory>(f: &F) {
    let ttl = Duration::from_millis(500);
    let store =
        f.store(StoreConfig { default_ttl: Some(ttl), max_session_lifetime: None, ..StoreConfig::default() }).await;
    let (app, user) = names("metamissing");
    let title = SessionMetadata::new().with_display_name("title");
    let keep = store
        .create(CreateSession::new(app.clone(), user.clone()).with_id("keep").with_ttl(Duration::from_secs(3600)))
        .await
        .expect("create")
        .key;
    let missing = key(&app, &user, "missing");
    expect_not_found(store.set_metadata(&missing, title.clone()).await, &missing, "missing session");
    for other in [key(&app, &other_user(&user), "keep"), key(&other_app(&app), &user, "keep")] {
        expect_not_found(store.set_metadata(&other, title.clone()).await, &other, "another owner's key");
    }
    assert_eq!(get(&*store, &keep).await.metadata, SessionMetadata::default(), "nothing written to the real one");

    let deleted = create(&*store, &app, &user, "deleted", json!({})).await.key;
    store.delete(&deleted).await.expect("delete");
    expect_not_found(store.set_metadata(&deleted, title.clone()).await, &deleted, "deleted session");

    let short = create(&*store, &app, &user, "short", json!({})).await.key;
    set(&*store, &short, title.clone()).await;
    tokio::time::sleep(ttl + Duration::from_millis(400)).await;
    expect_not_found(store.set_metadata(&short, SessionMetadata::default()).await, &short, "expired session");
    assert_eq!(session_ids(&list_all(&*store, &app, &user).await), ["keep"], "the expired session is not listed");
}

pub async fn a_closed_session_can_be_renamed_and_its_successor_inherits_metadata<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("metaroll");
    let original = SessionMetadata::new().with_display_name("Lisbon").with_label("team", "travel");
    let old = create_with(&*store, &app, &user, "old", original.clone()).await;
    append(&*store, &old, ev(json!({"step": 1}))).await;
    let successor = store.rollover(&old, Some("next".into()), Event::new("summarizer")).await.expect("rollover");
    assert_eq!(successor.metadata, original, "the successor inherits the display name and labels");
    assert_eq!(get(&*store, &successor.key).await.metadata, original);

    // The closed session may still be renamed; the two are independent now.
    let closed = get(&*store, &old).await;
    assert!(closed.closed_at.is_some());
    let renamed = SessionMetadata::new().with_display_name("Lisbon (part 1)").with_label("team", "travel");
    set(&*store, &old, renamed.clone()).await;
    let after = get(&*store, &old).await;
    assert_eq!(after.metadata, renamed);
    assert_eq!((after.version, after.last_update_time), (closed.version, closed.last_update_time));
    assert_eq!(get(&*store, &successor.key).await.metadata, original, "renaming the old one leaves the successor");

    let part2 = SessionMetadata::new().with_display_name("Lisbon (part 2)");
    set(&*store, &successor.key, part2.clone()).await;
    assert_eq!(get(&*store, &old).await.metadata, renamed, "renaming the successor leaves the old one");
    let retried = store.rollover(&old, Some("next".into()), Event::new("summarizer")).await.expect("retried rollover");
    assert_eq!(retried.metadata, part2, "a retried rollover returns the successor as it is now");

    let listed = list_all(&*store, &app, &user).await;
    let by_id: BTreeMap<&str, &SessionMetadata> =
        listed.iter().map(|s| (s.key.session_id.as_str(), &s.metadata)).collect();
    assert_eq!((by_id["old"], by_id["next"]), (&renamed, &part2));
}

pub async fn list_filters_by_labels_every_one_must_match<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("metalabels");
    let sessions: [(&str, Pairs); 7] = [
        ("a", &[("team", "travel"), ("tier", "gold")]),
        ("b", &[("team", "travel")]),
        ("c", &[("team", "food"), ("tier", "gold")]),
        ("d", &[]),
        ("e", &[("team", "Travel")]),
        ("f", &[("team", "trav%")]),
        ("g", &[("team", ""), ("tier", "gold")]),
    ];
    for (id, pairs) in sessions {
        create_with(&*store, &app, &user, id, with_labels(pairs)).await;
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    // The same labels elsewhere are never listed.
    create_with(&*store, &app, &other_user(&user), "a", with_labels(&[("team", "travel")])).await;
    create_with(&*store, &other_app(&app), &user, "a", with_labels(&[("team", "travel")])).await;

    let cases: [(Pairs, &[&str]); 9] = [
        (&[], &["g", "f", "e", "d", "c", "b", "a"]),
        (&[("team", "travel")], &["b", "a"]),
        (&[("team", "travel"), ("tier", "gold")], &["a"]),
        (&[("tier", "gold")], &["g", "c", "a"]),
        (&[("team", "trav%")], &["f"]),
        (&[("team", "")], &["g"]),
        (&[("team", "travel"), ("tier", "silver")], &[]),
        (&[("nope", "x")], &[]),
        (&[("team", "TRAVEL")], &[]),
    ];
    for (filter, expected) in cases {
        let request = filtered(&app, &user, filter, None, None);
        assert_eq!(listed_ids(&*store, &request).await, expected, "filter {filter:?}");
    }
    let page = store.list(&filtered(&app, &user, &[("team", "travel")], None, None)).await.expect("list");
    assert!(
        page.sessions.iter().all(|s| s.metadata.labels.get("team").map(String::as_str) == Some("travel")),
        "every listed session carries the label: {page:?}"
    );

    // A change of labels shows in the next filtered listing.
    set(&*store, &key(&app, &user, "b"), with_labels(&[("team", "food")])).await;
    assert_eq!(listed_ids(&*store, &filtered(&app, &user, &[("team", "food")], None, None)).await, ["c", "b"]);
    assert_eq!(listed_ids(&*store, &filtered(&app, &user, &[("team", "travel")], None, None)).await, ["a"]);
}

pub async fn list_filters_by_an_updated_window_exact_to_the_nanosecond<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("metawindow");
    let keys = create_in_order(&*store, &app, &user, &["s1", "s2", "s3", "s4", "s5"]).await;
    let mut times = Vec::new();
    for key in &keys {
        times.push(get(&*store, key).await.last_update_time);
    }
    let (t2, t4, t5) = (times[1], times[3], times[4]);
    let window = async |after: Option<DateTime<Utc>>, before: Option<DateTime<Utc>>| {
        listed_ids(&*store, &filtered(&app, &user, &[], after, before)).await
    };
    assert_eq!(window(Some(t2), None).await, ["s5", "s4", "s3", "s2"], "updated_after is inclusive");
    assert_eq!(window(Some(t2 + ns(1)), None).await, ["s5", "s4", "s3"], "to the nanosecond");
    assert_eq!(window(Some(t2 - ns(1)), None).await, ["s5", "s4", "s3", "s2"]);
    assert_eq!(window(None, Some(t4)).await, ["s3", "s2", "s1"], "updated_before is exclusive");
    assert_eq!(window(None, Some(t4 + ns(1))).await, ["s4", "s3", "s2", "s1"], "to the nanosecond");
    assert_eq!(window(None, Some(t4 - ns(1))).await, ["s3", "s2", "s1"]);
    assert_eq!(window(Some(t2), Some(t4)).await, ["s3", "s2"]);
    assert_eq!(window(Some(t5 + ns(1)), None).await, Vec::<String>::new());
    assert_eq!(window(Some(DateTime::<Utc>::MIN_UTC), Some(DateTime::<Utc>::MAX_UTC)).await.len(), 5, "all of time");
    assert_eq!(window(None, Some(DateTime::<Utc>::MIN_UTC + ns(1))).await, Vec::<String>::new(), "before all time");

    // An append moves a session into the window of now; set_metadata moves
    // nothing.
    set(&*store, &keys[1], SessionMetadata::new().with_display_name("renamed")).await;
    append(&*store, &keys[0], Event::new("agent")).await;
    assert_eq!(window(Some(t5 + ns(1)), None).await, ["s1"], "the append moved s1");
    assert_eq!(window(None, Some(t2 + ns(1))).await, ["s2"], "the rename did not move s2");
}

pub async fn list_filters_page_by_keyset_without_gaps_or_duplicates<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("metapages");
    let ids: Vec<String> = (0..15).map(|i| format!("p{i:02}")).collect();
    let mut keys = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        let mut metadata = SessionMetadata::new();
        if i % 2 == 0 {
            metadata = metadata.with_label("team", "a");
        }
        if i % 3 == 0 {
            metadata = metadata.with_label("tier", "x");
        }
        keys.push(create_with(&*store, &app, &user, id, metadata).await);
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    let everything = list_all(&*store, &app, &user).await;
    assert_eq!(everything.len(), 15);
    let (from, to) = (everything[11].last_update_time, everything[2].last_update_time);

    let filters: [(Pairs, Window); 4] = [
        (&[("team", "a")], (None, None)),
        (&[], (Some(from), Some(to))),
        (&[("team", "a")], (Some(from), Some(to))),
        (&[("team", "a"), ("tier", "x")], (Some(from), None)),
    ];
    for (pairs, (after, before)) in filters {
        let request = filtered(&app, &user, pairs, after, before);
        let expected: Vec<String> = session_ids(
            &everything
                .iter()
                .filter(|s| adk_postgres_domain::metadata::labels_match(&s.metadata.labels, &request.labels))
                .filter(|s| after.is_none_or(|t| s.last_update_time >= t))
                .filter(|s| before.is_none_or(|t| s.last_update_time < t))
                .cloned()
                .collect::<Vec<_>>(),
        );
        assert!(expected.len() >= 2, "the filter {pairs:?} {after:?} {before:?} leaves a few sessions: {expected:?}");
        let mut paged = request.clone();
        paged.page_size = Some(2);
        let (sessions, sizes) = list_every_page(&*store, &paged).await;
        assert_eq!(session_ids(&sessions), expected, "pages of {pairs:?} {after:?}..{before:?}: no gap, no duplicate");
        assert_eq!(sizes.len(), expected.len().div_ceil(2), "full pages of 2, the last without a token: {sizes:?}");
        assert!(sizes[..sizes.len() - 1].iter().all(|&n| n == 2), "{sizes:?}");
        assert_newest_first(&sessions);
    }
}

pub async fn list_refuses_bad_filters<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("metafilters");
    create_with(&*store, &app, &user, "s", with_labels(&[("team", "a")])).await;
    let now = Utc::now();
    let mut too_many = ListSessions::new(app.clone(), user.clone());
    for i in 0..=MAX_LABELS {
        too_many.labels.insert(format!("k{i}"), "v".into());
    }
    let mut with_token = filtered(&app, &user, &[("Team", "a")], None, None);
    with_token.page_token = Some(PageToken::after(now.timestamp_micros(), &SessionId::new("s").expect("id")));
    let cases: [(&str, ListSessions, &str); 6] = [
        ("an uppercase key", filtered(&app, &user, &[("Team", "a")], None, None), "labels"),
        ("an empty key", filtered(&app, &user, &[("", "a")], None, None), "labels"),
        ("a control in a value", filtered(&app, &user, &[("team", "a\u{0}")], None, None), "labels.team"),
        ("33 labels", too_many, "labels"),
        ("an empty window", filtered(&app, &user, &[], Some(now), Some(now)), "updated_before"),
        ("a bad key with a page token", with_token, "labels"),
    ];
    for (what, request, field) in cases {
        expect_invalid(store.list(&request).await, |f| f.starts_with(field), what);
    }
    let reversed = filtered(&app, &user, &[], Some(now), Some(now - ns(1)));
    expect_invalid(store.list(&reversed).await, |f| f == "updated_before", "a reversed window");
    assert_eq!(listed_ids(&*store, &filtered(&app, &user, &[("team", "a")], None, None)).await, ["s"]);
    assert_healthy(&*store, &app).await;
}
