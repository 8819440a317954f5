//! Listing the archive and checking its objects against the catalog.

use std::collections::BTreeMap;

use diesel_async::AsyncPgConnection;
use serde::Serialize;

use crate::ArchiveError;
use crate::destination::{Destination, StoreOptions};
use crate::object::{WrittenObject, verify_object};
pub use adk_postgres_storage::functions::ArchivedObject;

/// The catalog as the connected role may read it: one app's objects, or
/// every app's for the store's owner (`app` `None`). A role bound to other
/// apps is refused.
pub async fn list_archive(
    conn: &mut AsyncPgConnection,
    tenant: Option<&str>,
    app: Option<&str>,
) -> Result<Vec<ArchivedObject>, ArchiveError> {
    adk_postgres_storage::functions::list_archive(conn, tenant, app)
        .await
        .map_err(ArchiveError::query("list the archive"))
}

/// One object read back against its catalog row.
#[derive(Debug, Clone, Serialize)]
pub struct ObjectCheck {
    /// The object's catalog row.
    pub object: ArchivedObject,
    /// `None` when it verified; else why not.
    pub problem: Option<String>,
}

/// Reads back every object of the catalog (of one app, or all) and checks
/// it against its row: size, SHA-256 and the footer's row count.
pub async fn verify_archive(
    conn: &mut AsyncPgConnection,
    tenant: Option<&str>,
    app: Option<&str>,
    options: &StoreOptions,
) -> Result<Vec<ObjectCheck>, ArchiveError> {
    let objects = list_archive(conn, tenant, app).await?;
    let mut destinations: BTreeMap<String, Destination> = BTreeMap::new();
    let mut checks = Vec::with_capacity(objects.len());
    for object in objects {
        if !destinations.contains_key(&object.destination) {
            destinations.insert(object.destination.clone(), Destination::open_with(&object.destination, options)?);
        }
        let Some(destination) = destinations.get(&object.destination) else { continue };
        let written = WrittenObject {
            key: object.object_key.clone(),
            part: object.part,
            rows: object.rows,
            bytes: object.bytes,
            sha256: object.sha256.clone(),
        };
        let problem = verify_object(&destination.store, &written).await.err().map(|e| e.to_string());
        checks.push(ObjectCheck { object, problem });
    }
    Ok(checks)
}
