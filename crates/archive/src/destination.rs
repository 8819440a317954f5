//! Where the archive goes: a URL from the store's policy turned into an
//! object store and a key prefix.
//!
//! `file:///dir` is a local directory (made if missing), for the demo, the
//! tests and a mounted volume. `s3://bucket/prefix` is any S3-compatible
//! store; its credentials, region and endpoint come from the environment in
//! the usual AWS variables (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
//! `AWS_SESSION_TOKEN`, `AWS_REGION`, `AWS_ENDPOINT_URL`, `AWS_ALLOW_HTTP`),
//! read by object_store, and never from or into the database.

use std::sync::Arc;

use object_store::ObjectStore;
use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::path::Path;

use crate::ArchiveError;

/// An archive destination, opened.
#[derive(Clone)]
pub struct Destination {
    /// The URL as the policy holds it (no secret is ever part of it).
    pub url: String,
    /// The opened store: a local directory, or S3.
    pub store: Arc<dyn ObjectStore>,
    /// Every key of this archive starts with it.
    pub prefix: Path,
}

impl std::fmt::Debug for Destination {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Destination").field("url", &self.url).field("prefix", &self.prefix.as_ref()).finish()
    }
}

/// Object store settings beyond the environment: pairs of object_store's
/// lower-case names (`aws_endpoint_url`, `aws_allow_http`, `aws_region`,
/// `aws_access_key_id`, …) and values. Values never appear in `Debug`.
#[derive(Clone, Default)]
pub struct StoreOptions {
    settings: Vec<(String, adk_postgres_storage::Secret)>,
}

impl StoreOptions {
    /// Settings from `(name, value)` pairs.
    pub fn new<K: Into<String>, V: Into<String>>(pairs: impl IntoIterator<Item = (K, V)>) -> Self {
        Self {
            settings: pairs.into_iter().map(|(k, v)| (k.into(), adk_postgres_storage::Secret::new(v.into()))).collect(),
        }
    }
}

impl std::fmt::Debug for StoreOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.settings.iter().map(|(k, _)| format!("{k}=<redacted>"))).finish()
    }
}

/// Checks a destination URL's form without opening it: what the policy
/// accepts.
pub fn check_url(url: &str) -> Result<(), ArchiveError> {
    let invalid = |reason: &str| ArchiveError::InvalidInput { field: "archive_url", reason: reason.to_owned() };
    let parsed = url::Url::parse(url).map_err(|e| invalid(&format!("{url} is not a URL: {e}")))?;
    match parsed.scheme() {
        "file" => {
            if parsed.host_str().is_some_and(|h| !h.is_empty()) {
                return Err(invalid("a file:// URL names a local directory: file:///absolute/path"));
            }
            if parsed.path().len() <= 1 {
                return Err(invalid("a file:// URL needs a directory other than /"));
            }
        }
        "s3" => {
            if parsed.host_str().is_none_or(str::is_empty) {
                return Err(invalid("an s3:// URL names its bucket: s3://bucket/prefix"));
            }
            if !parsed.username().is_empty() || parsed.password().is_some() {
                return Err(invalid("credentials never go in the URL; set the AWS_* environment variables"));
            }
        }
        other => return Err(invalid(&format!("scheme {other}: is not supported; use file:// or s3://"))),
    }
    if parsed.query().is_some() || parsed.fragment().is_some() {
        return Err(invalid("the URL takes no query or fragment"));
    }
    Ok(())
}

impl Destination {
    /// Opens `url`. Nothing is read or written yet.
    pub fn open(url: &str) -> Result<Self, ArchiveError> {
        Self::open_with(url, &StoreOptions::default())
    }

    /// Opens `url` with settings beyond the environment's (an S3 endpoint
    /// the environment does not name, say). Nothing is read or written yet.
    pub fn open_with(url: &str, options: &StoreOptions) -> Result<Self, ArchiveError> {
        check_url(url)?;
        let failed = |reason: String| ArchiveError::Destination { url: url.to_owned(), reason };
        let parsed = url::Url::parse(url).map_err(|e| failed(e.to_string()))?;
        match parsed.scheme() {
            "file" => {
                let dir = parsed.to_file_path().map_err(|()| failed("not a local path".into()))?;
                std::fs::create_dir_all(&dir).map_err(|e| failed(format!("create {}: {e}", dir.display())))?;
                let store = LocalFileSystem::new_with_prefix(&dir).map_err(|e| failed(e.to_string()))?;
                Ok(Self { url: url.to_owned(), store: Arc::new(store), prefix: Path::default() })
            }
            _ => {
                let bucket = parsed.host_str().unwrap_or_default();
                let mut builder = AmazonS3Builder::from_env().with_bucket_name(bucket);
                for (key, value) in &options.settings {
                    let key: object_store::aws::AmazonS3ConfigKey =
                        key.parse().map_err(|e: object_store::Error| failed(e.to_string()))?;
                    builder = builder.with_config(key, value.expose());
                }
                let store = builder.build().map_err(|e| failed(e.to_string()))?;
                let prefix = Path::parse(parsed.path().trim_matches('/')).map_err(|e| failed(e.to_string()))?;
                Ok(Self { url: url.to_owned(), store: Arc::new(store), prefix })
            }
        }
    }

    /// The folder of one app's day: `app=<app>/day=<YYYY-MM-DD>/`, as Hive
    /// partitioning spells it, so DuckDB, Spark and Athena read the app and
    /// the day from the path too.
    pub fn day_folder(&self, app: &str, day: chrono::NaiveDate) -> Path {
        let app_part = format!("app={app}");
        let day_part = format!("day={day}");
        self.prefix.clone().join(app_part.as_str()).join(day_part.as_str())
    }

    /// The folder of one app: every day of it is below.
    pub fn app_folder(&self, app: &str) -> Path {
        let app_part = format!("app={app}");
        self.prefix.clone().join(app_part.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_file_and_s3_and_refuses_the_rest() {
        assert!(check_url("file:///var/lib/adk-archive").is_ok());
        assert!(check_url("s3://bucket/some/prefix").is_ok());
        assert!(check_url("s3://bucket").is_ok());
        for bad in [
            "file:///",
            "file://host/dir",
            "s3:///prefix",
            "s3://key:secret@bucket/prefix",
            "gs://bucket",
            "s3://bucket/p?x=1",
            "not a url",
        ] {
            let error = check_url(bad).expect_err(bad);
            assert!(matches!(error, ArchiveError::InvalidInput { field: "archive_url", .. }), "{bad}: {error}");
        }
    }

    #[test]
    fn an_apps_day_is_a_hive_folder_with_its_name_escaped() {
        let destination =
            Destination::open(&format!("file://{}", std::env::temp_dir().join("adk-dest-test").display()))
                .expect("opens");
        let folder = destination.day_folder("support/bot", chrono::NaiveDate::from_ymd_opt(2026, 1, 5).expect("day"));
        assert_eq!(folder.as_ref(), "app=support%2Fbot/day=2026-01-05");
    }
}
