//! Media an event read refers to, put back in place: the events of a get or
//! of the change feed arrive with references (`adk_postgres_domain::blob`),
//! and one more call reads the blobs they name, only when there are any.

use std::collections::HashMap;

use adk_postgres_domain::Event;
use adk_postgres_domain::blob::{self, BlobHash};

use crate::functions::BlobRow;

/// The reference's key as it shows in an event's JSON text: an event
/// without it names no media. (Inside a JSON string the quotes would be
/// escaped, so text merely mentioning the key does not match.)
pub(crate) const MEDIA_MARKER: &[u8] = b"\"adk_blob\"";

/// The distinct blobs the events' content names, for `adk_get_blobs`.
pub(super) fn references(events: &[Event]) -> Vec<Vec<u8>> {
    let mut wanted: Vec<BlobHash> = Vec::new();
    for content in events.iter().filter_map(|event| event.content.as_ref()) {
        for hash in blob::references(content) {
            if !wanted.contains(&hash) {
                wanted.push(hash);
            }
        }
    }
    wanted.into_iter().map(Vec::from).collect()
}

/// A blob the events named was gone when it was read: the session was
/// rewound, deleted or erased between the two reads.
#[derive(Debug)]
pub(super) struct MediaGone;

/// Puts each blob back where the events name it.
pub(super) fn put_back(events: &mut [Event], rows: Vec<BlobRow>) -> Result<(), MediaGone> {
    let blobs: HashMap<BlobHash, Vec<u8>> =
        rows.into_iter().filter_map(|row| Some((BlobHash::try_from(row.sha256.as_slice()).ok()?, row.data))).collect();
    for content in events.iter_mut().filter_map(|event| event.content.as_mut()) {
        blob::reinline(content, &blobs).map_err(|_| MediaGone)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_marker_is_the_reference_key_quoted() {
        assert_eq!(MEDIA_MARKER, format!("{:?}", blob::BLOB_KEY).as_bytes());
    }
}
