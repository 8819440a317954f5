//! A multimodal agent through the adk trait: ten sessions each sending the
//! same 3 MB image as `Part::InlineData` are stored (the event limit applies
//! to what is left once the image is apart), read back equal, and the image
//! is stored once, as its 3,000,000 raw bytes.
#![cfg(feature = "postgres")]

use adk_core::{AdkIdentity, Content, Part};
use adk_postgres_adk::PgSessionService;
use adk_postgres_testing::{media_bytes, test_database};
use adk_session::{AppendEventRequest, CreateRequest, Event, GetRequest, SessionService};

#[tokio::test(flavor = "multi_thread")]
async fn ten_sessions_send_one_3_mb_image_and_read_it_back_byte_for_byte() {
    let db = test_database().await;
    let svc = PgSessionService::connect(db.url()).await.expect("connect");
    let picture = media_bytes(3_000_000, 1);
    for user in 0..10 {
        let user_id = format!("u{user}");
        let session = svc
            .create(CreateRequest {
                app_name: "vision".into(),
                user_id: user_id.clone(),
                session_id: None,
                state: Default::default(),
            })
            .await
            .expect("create");
        let mut event = Event::new("inv-1");
        event.author = "user".into();
        let mut content = Content::new("user").with_text("what is in this picture?");
        content.parts.push(Part::InlineData {
            mime_type: "image/png".into(),
            data: picture.clone(),
            uri: None,
            annotations: None,
        });
        event.llm_response.content = Some(content.clone());
        let identity = AdkIdentity::new(
            "vision".try_into().unwrap(),
            user_id.as_str().try_into().unwrap(),
            session.id().try_into().unwrap(),
        );
        svc.append_event_for_identity(AppendEventRequest { identity, event })
            .await
            .expect("a multimodal event is stored, not refused as too large");

        let read = svc
            .get(GetRequest {
                app_name: "vision".into(),
                user_id: user_id.clone(),
                session_id: session.id().to_owned(),
                num_recent_events: None,
                after: None,
            })
            .await
            .expect("get");
        let events = read.events();
        let stored = events.at(0).expect("the event");
        assert_eq!(
            serde_json::to_value(&stored.llm_response.content).expect("json"),
            serde_json::to_value(Some(&content)).expect("json"),
            "the image reads back byte for byte"
        );
    }
    let sql = db.connect().await;
    let row = sql
        .query_one(
            "SELECT count(*), sum(length(data))::bigint, sum(refs)::bigint,
                    (SELECT max(pg_column_size(payload))::bigint FROM adk_events)
               FROM adk_blobs",
            &[],
        )
        .await
        .expect("blobs");
    let (rows, bytes, refs, largest_event): (i64, i64, i64, i64) = (row.get(0), row.get(1), row.get(2), row.get(3));
    assert_eq!((rows, bytes, refs), (1, 3_000_000, 10), "one copy, its raw bytes, named by ten events");
    assert!(largest_event < 2_000, "the events hold a reference only: {largest_event} bytes");
}
