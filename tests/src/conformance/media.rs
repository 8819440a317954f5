//! Media in events: inline data past the offload size is stored once,
//! outside the event, and read back exactly as it was sent; the event size
//! limit applies to what is left.

use adk_postgres_domain::event::MAX_EVENT_BYTES;
use adk_postgres_domain::{DEFAULT_MEDIA_OFFLOAD_BYTES, Event, GetOptions, Session, StoreConfig, StoreError};
use base64::Engine as _;
use serde_json::{Value, json};

use super::*;

pub use adk_postgres_testing::media_bytes;

/// An event carrying `image` as adk-rust writes `Part::InlineData` (a JSON
/// array of numbers), with a caption.
pub fn image_event(image: &[u8]) -> Event {
    let mut event = Event::new("user");
    event.content = Some(json!({"role": "user", "parts": [
        {"text": "what is in this picture?"},
        {"mime_type": "image/png", "data": image},
    ]}));
    event
}

/// The event as JSON, for equality: the same keys with the same values, so
/// media comes back in the form it was written (numbers stay numbers,
/// base64 stays text). PostgreSQL's jsonb keeps no key order, for any event.
fn as_json(event: &Event) -> Value {
    serde_json::to_value(event).expect("serialize")
}

pub async fn media_round_trips_exactly_past_the_event_limit<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("media");
    let session = create(&*store, &app, &user, "s", json!({})).await;
    let image = media_bytes(1_500_000, 1);
    let adk_form = image_event(&image);
    assert!(
        serde_json::to_vec(&adk_form).expect("json").len() > 4 * MAX_EVENT_BYTES,
        "inline, this event is far over the limit"
    );

    let mut python_form = Event::new("user");
    python_form.content = Some(json!({"role": "user", "parts": [{"inline_data": {
        "mime_type": "audio/wav",
        "data": base64::engine::general_purpose::STANDARD.encode(media_bytes(400_000, 2)),
    }}]}));
    let mut small = Event::new("agent");
    small.content = Some(json!({"role": "model", "parts": [{"mime_type": "image/png", "data": media_bytes(100, 3)}]}));
    let sent = vec![adk_form, python_form, small, image_event(&image)];
    for event in &sent {
        let appended = append(&*store, &session.key, event.clone()).await;
        assert_eq!(as_json(&appended.event), as_json(event), "the append answers with the event as sent");
    }

    let read = get(&*store, &session.key).await;
    assert_eq!(read.events.len(), sent.len());
    for (read, sent) in read.events.iter().zip(&sent) {
        assert_eq!(as_json(read), as_json(sent), "value for value, in the form it was written");
    }
    let recent = store.get(&session.key, GetOptions { num_recent_events: Some(1), after: None }).await.expect("get");
    assert_eq!(as_json(&recent.events[0]), as_json(&sent[3]));

    // The events as JSON (what the adk adapter's get reads): the media is
    // put back there too, and everything else is what `get` returns.
    let as_stored = store.get_json(&session.key, GetOptions::default()).await.expect("get_json");
    assert_eq!(as_stored.events.len(), sent.len());
    assert!(as_stored.session.events.is_empty(), "the events come once, as JSON");
    let decoded = as_stored.into_session().expect("every document is an event");
    assert_eq!(decoded.events.iter().map(as_json).collect::<Vec<_>>(), sent.iter().map(as_json).collect::<Vec<_>>());
    assert_eq!(Session { events: Vec::new(), ..decoded }, Session { events: Vec::new(), ..read });
}

pub async fn media_events_replay_and_conflict_like_any_event<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("mediareplay");
    let session = create(&*store, &app, &user, "s", json!({})).await;
    let event = image_event(&media_bytes(200_000, 4));
    append(&*store, &session.key, event.clone()).await;
    let again = store.append(&session.key, event.clone(), AppendOptions::default()).await.expect("retry");
    assert!(again.replayed, "a retry of a stored media event is a replay");
    assert_eq!(as_json(&again.event), as_json(&event));

    let mut other = image_event(&media_bytes(200_000, 5));
    other.id = event.id.clone();
    let refused = store.append(&session.key, other, AppendOptions::default()).await;
    assert!(matches!(refused, Err(StoreError::DuplicateEvent { .. })), "{refused:?}");
    assert_eq!(get(&*store, &session.key).await.events.len(), 1);
}

pub async fn what_is_left_of_a_media_event_still_meets_the_limit<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("medialimit");
    let session = create(&*store, &app, &user, "s", json!({})).await;
    let mut event = image_event(&media_bytes(300_000, 6));
    let content = event.content.as_mut().and_then(|c| c["parts"].as_array_mut()).expect("parts");
    content.push(json!({"text": "x".repeat(MAX_EVENT_BYTES)}));
    let refused = store.append(&session.key, event, AppendOptions::default()).await;
    assert!(matches!(refused, Err(StoreError::EventTooLarge { .. })), "{refused:?}");

    // The store's own reference form, sent by a client, would read back as
    // someone else's bytes: refused, naming the content.
    let mut forged = Event::new("user");
    forged.content = Some(json!({"parts": [
        {"mime_type": "image/png", "data": {"adk_blob": "00".repeat(32), "size": 3, "encoding": "bytes"}},
        {"text": "y".repeat(DEFAULT_MEDIA_OFFLOAD_BYTES)},
    ]}));
    expect_invalid(
        store.append(&session.key, forged, AppendOptions::default()).await,
        |field| field == "event.content",
        "a reference sent by a client",
    );
    assert_eq!(get(&*store, &session.key).await.version, 0, "nothing was written");
}

pub async fn forks_rewinds_and_deletes_keep_media_whole<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("medialife");
    let original = create(&*store, &app, &user, "s", json!({})).await;
    let shared = image_event(&media_bytes(250_000, 7));
    let later = image_event(&media_bytes(250_000, 8));
    append(&*store, &original.key, shared.clone()).await;
    append(&*store, &original.key, later.clone()).await;
    let other = create(&*store, &app, &user, "o", json!({})).await;
    let mut same_image = image_event(&media_bytes(250_000, 7));
    same_image.id = "same-image-elsewhere".into();
    append(&*store, &other.key, same_image.clone()).await;

    let fork = store.fork(&original.key, 2, Some("f".into())).await.expect("fork");
    assert_eq!(fork.events.iter().map(as_json).collect::<Vec<_>>(), vec![as_json(&shared), as_json(&later)]);
    store.rewind(&original.key, 1, None).await.expect("rewind");
    store.delete(&original.key).await.expect("delete");

    let fork = get(&*store, &fork.key).await;
    assert_eq!(as_json(&fork.events[0]), as_json(&shared), "the fork's copy outlives the original");
    assert_eq!(as_json(&fork.events[1]), as_json(&later));
    store.delete(&fork.key).await.expect("delete the fork");
    let other = get(&*store, &other.key).await;
    assert_eq!(as_json(&other.events[0]), as_json(&same_image), "the same image in another session stays");
}
