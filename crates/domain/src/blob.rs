//! Media moved out of the log: large inline data of an event's content is
//! stored once, as its raw bytes, under its SHA-256, and the event keeps a
//! reference in its place.
//!
//! adk-rust serializes `Part::InlineData` bytes as a JSON array of numbers,
//! so a 3 MB image is an 11 MB event, over the 1 MiB event limit; ADK Python
//! and the Gemini API write the same bytes as base64 text. Either form, at
//! or above the threshold, becomes a reference
//! `{"adk_blob": "<sha256 hex>", "size": <bytes>, "encoding": "bytes"|"base64"}`
//! in the `data` field, and reading the event puts the same JSON back, so
//! the round trip is exact. The key `adk_blob` is the store's: an event that
//! already carries one where media goes is refused.

use std::collections::HashMap;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Map, Number, Value};
use sha2::{Digest as _, Sha256};

use crate::error::StoreError;

/// Inline data of this many bytes or more leaves the event: below it, even
/// adk's number-array form (up to four characters a byte) keeps a part under
/// a quarter of the event limit, and a thumbnail stays where it is read.
pub const DEFAULT_MEDIA_OFFLOAD_BYTES: usize = 64 * 1024;

/// Largest single piece of media accepted: adk-core refuses inline data over
/// 10 MB, so this leaves room without letting one call fill memory.
pub const MAX_BLOB_BYTES: usize = 32 << 20;

/// The key that marks a reference in place of media.
pub const BLOB_KEY: &str = "adk_blob";

/// A SHA-256 digest, the blob's identity.
pub type BlobHash = [u8; 32];

/// One piece of media an event carried, as raw bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct Blob {
    /// The SHA-256 of `data`; two events naming the same media share one blob.
    pub sha256: BlobHash,
    /// The media's raw bytes.
    pub data: Vec<u8>,
}

impl std::fmt::Debug for Blob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Blob").field("sha256", &hex(&self.sha256)).field("bytes", &self.data.len()).finish()
    }
}

impl Blob {
    /// A blob of `data`, its hash computed.
    pub fn new(data: Vec<u8>) -> Self {
        Self { sha256: Sha256::digest(&data).into(), data }
    }
}

/// How the media was written in the JSON, so it is written back the same way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Encoding {
    /// adk-rust's `Vec<u8>`: an array of numbers.
    Bytes,
    /// Standard base64 with padding, as ADK Python and the Gemini API write it.
    Base64,
}

impl Encoding {
    fn name(self) -> &'static str {
        match self {
            Self::Bytes => "bytes",
            Self::Base64 => "base64",
        }
    }
}

/// Replaces every media `data` of `content` of at least `threshold` bytes by
/// a reference, and returns the distinct blobs, ordered by hash. `field`
/// names the content in errors.
pub fn offload(content: &mut Value, threshold: usize, field: &'static str) -> Result<Vec<Blob>, StoreError> {
    let mut blobs: Vec<Blob> = Vec::new();
    let mut stack = vec![content];
    while let Some(value) = stack.pop() {
        match value {
            Value::Array(items) => stack.extend(items.iter_mut()),
            Value::Object(map) => {
                if let Some((data, encoding)) = media_data(map, threshold, field)? {
                    if data.len() > MAX_BLOB_BYTES {
                        return Err(StoreError::invalid(
                            field,
                            format!("holds media of {} bytes, more than {MAX_BLOB_BYTES}", data.len()),
                        ));
                    }
                    let blob = Blob::new(data);
                    map.insert("data".to_owned(), reference(&blob, encoding));
                    if !blobs.iter().any(|b| b.sha256 == blob.sha256) {
                        blobs.push(blob);
                    }
                } else {
                    stack.extend(map.values_mut());
                }
            }
            _ => {}
        }
    }
    blobs.sort_by_key(|blob| blob.sha256);
    Ok(blobs)
}

/// The media of a `{"mime_type": …, "data": …}` object, if it is at least
/// `threshold` bytes and in a form that is written back exactly.
fn media_data(
    map: &Map<String, Value>,
    threshold: usize,
    field: &'static str,
) -> Result<Option<(Vec<u8>, Encoding)>, StoreError> {
    if !map.get("mime_type").is_some_and(Value::is_string) {
        return Ok(None);
    }
    match map.get("data") {
        Some(Value::Array(items)) if items.len() >= threshold => {
            let mut bytes = Vec::with_capacity(items.len());
            for item in items {
                match item.as_u64().and_then(|n| u8::try_from(n).ok()) {
                    // A float such as 1.0 would come back as 1: not exact.
                    Some(byte) if !item.is_f64() => bytes.push(byte),
                    _ => return Ok(None),
                }
            }
            Ok(Some((bytes, Encoding::Bytes)))
        }
        Some(Value::String(text)) if text.len() / 4 * 3 >= threshold => match STANDARD.decode(text) {
            // Only text that encodes back to itself, so the read is exact.
            Ok(bytes) if STANDARD.encode(&bytes) == *text => Ok(Some((bytes, Encoding::Base64))),
            _ => Ok(None),
        },
        Some(Value::Object(inner)) if inner.contains_key(BLOB_KEY) => Err(StoreError::invalid(
            field,
            format!("media data holds the key {BLOB_KEY:?}, which the store reserves for its own references"),
        )),
        _ => Ok(None),
    }
}

fn reference(blob: &Blob, encoding: Encoding) -> Value {
    let mut map = Map::new();
    map.insert(BLOB_KEY.to_owned(), Value::String(hex(&blob.sha256)));
    map.insert("size".to_owned(), Value::Number(Number::from(blob.data.len())));
    map.insert("encoding".to_owned(), Value::String(encoding.name().to_owned()));
    Value::Object(map)
}

/// A reference found in stored content.
fn parse_reference(data: &Value) -> Option<(BlobHash, Encoding)> {
    let map = data.as_object()?;
    let hash = parse_hex(map.get(BLOB_KEY)?.as_str()?)?;
    let encoding = match map.get("encoding")?.as_str()? {
        "bytes" => Encoding::Bytes,
        "base64" => Encoding::Base64,
        _ => return None,
    };
    Some((hash, encoding))
}

/// The distinct blobs stored content refers to.
pub fn references(content: &Value) -> Vec<BlobHash> {
    let mut found = Vec::new();
    let mut stack = vec![content];
    while let Some(value) = stack.pop() {
        match value {
            Value::Array(items) => stack.extend(items.iter()),
            Value::Object(map) => {
                if let Some((hash, _)) = map.get("data").and_then(parse_reference) {
                    if !found.contains(&hash) {
                        found.push(hash);
                    }
                } else {
                    stack.extend(map.values());
                }
            }
            _ => {}
        }
    }
    found
}

/// Puts the media back in place of each reference of `content`, in the form
/// it was written. Returns the first hash `blobs` lacks (the session changed
/// under the read), leaving `content` partly restored.
pub fn reinline(content: &mut Value, blobs: &HashMap<BlobHash, Vec<u8>>) -> Result<(), BlobHash> {
    let mut stack = vec![content];
    while let Some(value) = stack.pop() {
        match value {
            Value::Array(items) => stack.extend(items.iter_mut()),
            Value::Object(map) => {
                let Some((hash, encoding)) = map.get("data").and_then(parse_reference) else {
                    stack.extend(map.values_mut());
                    continue;
                };
                let bytes = blobs.get(&hash).ok_or(hash)?;
                let data = match encoding {
                    Encoding::Bytes => Value::Array(bytes.iter().map(|b| Value::Number(Number::from(*b))).collect()),
                    Encoding::Base64 => Value::String(STANDARD.encode(bytes)),
                };
                map.insert("data".to_owned(), data);
            }
            _ => {}
        }
    }
    Ok(())
}

/// Lower-case hexadecimal, as the references spell a hash.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut text = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        text.push(char::from(DIGITS[usize::from(byte >> 4)]));
        text.push(char::from(DIGITS[usize::from(byte & 0xf)]));
    }
    text
}

fn parse_hex(text: &str) -> Option<BlobHash> {
    if text.len() != 64 {
        return None;
    }
    let mut hash = [0u8; 32];
    for (i, pair) in text.as_bytes().chunks(2).enumerate() {
        let digit = |c: u8| match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        };
        hash[i] = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Some(hash)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn image(len: usize, seed: u8) -> Vec<u8> {
        (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
    }

    #[test]
    fn both_forms_of_large_media_leave_and_come_back_exactly() {
        let bytes = image(70_000, 1);
        let original = json!({"role": "user", "parts": [
            {"text": "look"},
            {"mime_type": "image/png", "data": bytes},
            {"inline_data": {"mime_type": "image/png", "data": STANDARD.encode(image(90_000, 2))}},
            {"mime_type": "image/png", "data": image(10, 3)},
            {"mime_type": "image/png", "data": bytes},
        ]});
        let mut content = original.clone();
        let blobs = offload(&mut content, DEFAULT_MEDIA_OFFLOAD_BYTES, "event.content").unwrap();
        assert_eq!(blobs.len(), 2, "the repeated image is one blob");
        assert!(blobs.windows(2).all(|w| w[0].sha256 < w[1].sha256));
        assert_eq!(blobs.iter().map(|b| b.data.len()).sum::<usize>(), 160_000, "raw bytes, not JSON");
        assert!(serde_json::to_vec(&content).unwrap().len() < 2_000);
        assert_eq!(references(&content).len(), 2);

        let stored: HashMap<_, _> = blobs.into_iter().map(|b| (b.sha256, b.data)).collect();
        reinline(&mut content, &stored).unwrap();
        assert_eq!(serde_json::to_vec(&content).unwrap(), serde_json::to_vec(&original).unwrap());
    }

    #[test]
    fn what_cannot_be_written_back_exactly_stays_inline() {
        let mut floats: Vec<Value> = image(70_000, 0).into_iter().map(Value::from).collect();
        floats[5] = json!(1.0);
        let padded_wrong = format!("{}=", STANDARD.encode(image(90_000, 1)).trim_end_matches('='));
        for data in [Value::Array(floats), json!(vec![300; 70_000]), Value::String(padded_wrong)] {
            let mut content = json!({"parts": [{"mime_type": "a/b", "data": data}]});
            let before = content.clone();
            assert!(offload(&mut content, DEFAULT_MEDIA_OFFLOAD_BYTES, "event.content").unwrap().is_empty());
            assert_eq!(content, before);
        }
    }

    #[test]
    fn a_reference_sent_by_a_client_is_refused_and_missing_blobs_are_named() {
        let mut content = json!({"parts": [{"mime_type": "a/b", "data": {"adk_blob": "00"}}]});
        let refused = offload(&mut content, 1, "event.content");
        assert!(matches!(refused, Err(StoreError::InvalidInput { field, .. }) if field == "event.content"));

        let mut content = json!({"parts": [{"mime_type": "a/b", "data": image(100, 0)}]});
        let blobs = offload(&mut content, 1, "event.content").unwrap();
        assert_eq!(reinline(&mut content, &HashMap::new()), Err(blobs[0].sha256));
    }

    #[test]
    fn oversize_media_is_refused() {
        let mut content =
            json!({"parts": [{"mime_type": "a/b", "data": STANDARD.encode(vec![0u8; MAX_BLOB_BYTES + 3])}]});
        let refused = offload(&mut content, DEFAULT_MEDIA_OFFLOAD_BYTES, "event.content");
        assert!(matches!(refused, Err(StoreError::InvalidInput { field, .. }) if field == "event.content"));
    }

    #[test]
    fn hex_round_trips() {
        let hash = Blob::new(b"abc".to_vec()).sha256;
        assert_eq!(hex(&hash), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        assert_eq!(parse_hex(&hex(&hash)), Some(hash));
        assert_eq!(parse_hex("zz"), None);
    }
}
