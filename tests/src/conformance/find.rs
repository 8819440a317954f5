//! `find_by_id`: a session id across users and apps.

use std::time::Duration;

use adk_postgres_domain::{CreateSession, SessionId, StoreConfig};
use serde_json::json;

use super::*;

pub async fn find_by_id_finds_live_sessions_across_users_and_apps<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("findbyid");
    let unique = format!("unique-{}", uuid::Uuid::new_v4());
    let shared = format!("shared-{}", uuid::Uuid::new_v4());
    let one = create(&*store, &app, &user, &unique, json!({})).await;
    create(&*store, &app, &user, &shared, json!({})).await;
    create(&*store, &other_app(&app), &other_user(&user), &shared, json!({})).await;

    let found = store.find_by_id(&one.key.session_id, 2).await.expect("find");
    assert_eq!(found, vec![one.key.clone()]);
    let ambiguous = store.find_by_id(&SessionId::new(shared.clone()).expect("id"), 2).await.expect("find");
    assert_eq!(ambiguous.len(), 2, "{ambiguous:?}");
    assert_eq!(store.find_by_id(&SessionId::new(shared).expect("id"), 1).await.expect("find").len(), 1);
    let nowhere = SessionId::new(format!("nowhere-{}", uuid::Uuid::new_v4())).expect("id");
    assert!(store.find_by_id(&nowhere, 2).await.expect("find").is_empty());

    let expiring = format!("expiring-{}", uuid::Uuid::new_v4());
    store
        .create(CreateSession::new(app.clone(), user.clone()).with_id(&expiring).with_ttl(Duration::from_millis(1)))
        .await
        .expect("create");
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(store.find_by_id(&SessionId::new(expiring).expect("id"), 2).await.expect("find").is_empty());
}
