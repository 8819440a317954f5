//! An S3-protocol server for the archive tests: moto's standalone server
//! (`moto_server`, from the venv of [`python_tools`](crate::python_tools)),
//! run as a child of the test process on a free port with one bucket made.
//!
//! The store reaches it through `object_store`'s `AmazonS3Builder` with the
//! settings of [`S3Server::env`]. moto checks no signatures: any access key
//! and secret do. It keeps everything in memory, so [`S3Server::restart`]
//! comes back on the same port with the bucket made again but empty; moto has
//! no option to keep objects on disk (`-s` is TLS, `-r` reloading on code
//! changes), so a test that needs objects across a restart copies them out
//! and back itself ([`S3Server::list`], [`S3Server::get_object`],
//! [`S3Server::put_object`]).
//!
//! A watchdog ends the server if this process dies without dropping the
//! value, like a throwaway cluster's.

use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt as _, Full};
use hyper::body::Bytes;
use hyper::{Method, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use crate::cluster::{free_port, log_tail, spawn_watchdog, throwaway_dir};
use crate::error::HarnessError;
use crate::python_tools::{PythonTools, python_tools};

/// The bucket [`S3Server::start`] makes.
pub const S3_BUCKET: &str = "adk-archive-test";
/// What [`S3Server::env`] gives as credentials; moto takes any.
const ACCESS_KEY_ID: &str = "adk-test-key";
const SECRET_ACCESS_KEY: &str = "adk-test-secret";
const REGION: &str = "us-east-1";
/// moto starts in about a second; a loaded CI machine gets more.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
const START_ATTEMPTS: usize = 5;

/// A running moto S3 server with one bucket; killed and its folder removed
/// when dropped.
#[derive(Debug)]
pub struct S3Server {
    /// `None` while stopped.
    child: Option<Child>,
    tools: PythonTools,
    dir: PathBuf,
    port: u16,
    bucket: String,
    client: Client<HttpConnector, Full<Bytes>>,
}

impl S3Server {
    /// Starts moto on a free port of 127.0.0.1, waits until it answers and
    /// makes the bucket [`S3_BUCKET`]. Makes the venv first when it has to
    /// (see [`python_tools`](crate::python_tools)).
    pub async fn start() -> Result<Self, HarnessError> {
        let tools = python_tools()?;
        let dir = throwaway_dir("s3");
        std::fs::create_dir_all(&dir).map_err(HarnessError::io(format!("creating {}", dir.display())))?;
        // Before anything runs, so that even a failed start leaves no folder.
        spawn_watchdog(r#"rm -rf "$1""#, &[dir.as_os_str()])?;
        let client = Client::builder(TokioExecutor::new()).pool_max_idle_per_host(0).build_http();
        let mut server = Self { child: None, tools, dir, port: 0, bucket: S3_BUCKET.to_owned(), client };
        let mut attempt = 1;
        loop {
            server.port = free_port()?;
            match server.spawn_and_make_bucket().await {
                Ok(()) => return Ok(server),
                Err(_) if attempt < START_ATTEMPTS && server.log_tail().contains("Address already in use") => {
                    attempt += 1;
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// `http://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// `s3://<bucket>/<prefix>` (`s3://<bucket>` for an empty prefix).
    pub fn url(&self, prefix: &str) -> String {
        match prefix.trim_start_matches('/') {
            "" => format!("s3://{}", self.bucket),
            prefix => format!("s3://{}/{prefix}", self.bucket),
        }
    }

    /// The standard AWS variables that point a client at this server: what
    /// `object_store`'s `AmazonS3Builder::from_env` reads (`AWS_ENDPOINT_URL`
    /// is its endpoint, and `AWS_ALLOW_HTTP=true` lets it use plain HTTP;
    /// requests are path-style with a custom endpoint). Give them to a child
    /// process (`adk-pg`), or, lower-cased, to `AmazonS3Builder::with_config`
    /// / `object_store::parse_url_opts` in-process (setting a test process's
    /// own environment is `unsafe`).
    pub fn env(&self) -> Vec<(String, String)> {
        [
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY_ID.to_owned()),
            ("AWS_SECRET_ACCESS_KEY", SECRET_ACCESS_KEY.to_owned()),
            ("AWS_REGION", REGION.to_owned()),
            ("AWS_ENDPOINT_URL", self.endpoint()),
            ("AWS_ALLOW_HTTP", "true".to_owned()),
        ]
        .into_iter()
        .map(|(name, value)| (name.to_owned(), value))
        .collect()
    }

    /// Kills the server (SIGKILL: a crash, not a shutdown): requests in
    /// flight are cut and new connections refused until
    /// [`S3Server::restart`]. Everything it held is lost.
    pub fn stop(&mut self) -> Result<(), HarnessError> {
        if let Some(mut child) = self.child.take() {
            child.kill().map_err(HarnessError::io("killing moto_server"))?;
            child.wait().map_err(HarnessError::io("waiting for moto_server"))?;
        }
        Ok(())
    }

    /// Starts the server again on the same port (stopping it first if it
    /// runs) and makes the bucket again: empty, as moto keeps nothing.
    pub async fn restart(&mut self) -> Result<(), HarnessError> {
        self.stop()?;
        self.spawn_and_make_bucket().await
    }

    /// Whether the server process is alive (it may be stopped, or may have died).
    pub fn is_running(&mut self) -> bool {
        self.child.as_mut().is_some_and(|child| matches!(child.try_wait(), Ok(None)))
    }

    /// Stores `bytes` as `key` in the bucket.
    pub async fn put_object(&self, key: &str, bytes: impl Into<Bytes>) -> Result<(), HarnessError> {
        let (status, body) = self.request(Method::PUT, &self.object_path(key), bytes.into()).await?;
        expect_ok(&format!("PUT {key}"), status, &body)
    }

    /// The bytes of `key`, `None` when the bucket has no such object.
    pub async fn get_object(&self, key: &str) -> Result<Option<Vec<u8>>, HarnessError> {
        let (status, body) = self.request(Method::GET, &self.object_path(key), Bytes::new()).await?;
        if status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        expect_ok(&format!("GET {key}"), status, &body)?;
        Ok(Some(body.to_vec()))
    }

    /// The keys of the objects whose key starts with `prefix`, in order.
    pub async fn list(&self, prefix: &str) -> Result<Vec<String>, HarnessError> {
        let mut keys = Vec::new();
        let mut continuation: Option<String> = None;
        loop {
            let mut path = format!("/{}?list-type=2&prefix={}", self.bucket, encode(prefix, false));
            if let Some(token) = &continuation {
                path.push_str(&format!("&continuation-token={}", encode(token, false)));
            }
            let (status, body) = self.request(Method::GET, &path, Bytes::new()).await?;
            expect_ok(&format!("listing {prefix:?}"), status, &body)?;
            let page = parse_listing(&String::from_utf8_lossy(&body));
            keys.extend(page.keys);
            match page.next {
                Some(token) => continuation = Some(token),
                None => return Ok(keys),
            }
        }
    }

    /// Copies every object under `prefix` to `dir/<key>` (folders made as
    /// needed), for reading with [`duckdb_json`](crate::duckdb_json), which
    /// cannot read `s3://` here; the files written, in key order.
    pub async fn download(&self, prefix: &str, dir: &Path) -> Result<Vec<PathBuf>, HarnessError> {
        let mut files = Vec::new();
        for key in self.list(prefix).await? {
            if key.split('/').any(|part| part == "..") {
                return Err(HarnessError::Setup(format!("refusing to download {key:?} outside {}", dir.display())));
            }
            let Some(bytes) = self.get_object(&key).await? else { continue };
            let file = dir.join(&key);
            if let Some(parent) = file.parent() {
                std::fs::create_dir_all(parent).map_err(HarnessError::io(format!("creating {}", parent.display())))?;
            }
            std::fs::write(&file, bytes).map_err(HarnessError::io(format!("writing {}", file.display())))?;
            files.push(file);
        }
        Ok(files)
    }

    /// The last lines of what moto printed (a line per request), for a
    /// failure message.
    pub fn log_tail(&self) -> String {
        log_tail(&self.dir.join("moto.log")).unwrap_or_default()
    }

    /// Spawns moto on `self.port`, waits until it answers and makes the bucket.
    async fn spawn_and_make_bucket(&mut self) -> Result<(), HarnessError> {
        let moto = self.tools.moto_server();
        let log_path = self.dir.join("moto.log");
        let log =
            std::fs::File::create(&log_path).map_err(HarnessError::io(format!("creating {}", log_path.display())))?;
        let log_err = log.try_clone().map_err(HarnessError::io(format!("opening {}", log_path.display())))?;
        let child = Command::new(&moto)
            .args(["-H", "127.0.0.1", "-p", &self.port.to_string()])
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            // A Ctrl-C in the terminal is for the tests, not for it.
            .process_group(0)
            .spawn()
            .map_err(HarnessError::io(format!("starting {}", moto.display())))?;
        // Dropping the value kills it; this covers a process that dies
        // without dropping it. The server runs in our folder, so a pid
        // reused after a normal drop is left alone.
        spawn_watchdog(
            r#"[ "$(readlink "/proc/$1/cwd")" = "$2" ] && kill -9 "$1"; rm -rf "$2""#,
            &[child.id().to_string().as_ref(), self.dir.as_os_str()],
        )?;
        self.child = Some(child);
        let result = self.make_bucket().await;
        if result.is_err() {
            let _ = self.stop();
        }
        result
    }

    /// `PUT /<bucket>`, tried until moto answers it.
    async fn make_bucket(&mut self) -> Result<(), HarnessError> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let path = format!("/{}", self.bucket);
        loop {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                return Err(self.failed(&format!("exited ({status})")));
            }
            match self.request(Method::PUT, &path, Bytes::new()).await {
                Ok((status, body)) => return expect_ok(&format!("PUT /{}", self.bucket), status, &body),
                Err(_) if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(50)).await,
                Err(_) => {
                    return Err(self.failed(&format!("did not answer on port {} within {READY_TIMEOUT:?}", self.port)));
                }
            }
        }
    }

    fn failed(&self, what: &str) -> HarnessError {
        HarnessError::Setup(format!("moto_server {what}; in {}:\n{}", self.dir.display(), self.log_tail()))
    }

    fn object_path(&self, key: &str) -> String {
        format!("/{}/{}", self.bucket, encode(key, true))
    }

    /// One request with a made-up signature: moto checks none, but treats a
    /// request without one as anonymous and refuses it private objects.
    async fn request(&self, method: Method, path: &str, body: Bytes) -> Result<(StatusCode, Bytes), HarnessError> {
        let context = format!("{method} {}{path}", self.endpoint());
        let request = hyper::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.endpoint()))
            .header(
                "authorization",
                format!(
                    "AWS4-HMAC-SHA256 Credential={ACCESS_KEY_ID}/20260101/{REGION}/s3/aws4_request, \
                     SignedHeaders=host, Signature=0"
                ),
            )
            .header("content-type", "application/octet-stream")
            .body(Full::new(body))
            .map_err(|error| HarnessError::Http { context: context.clone(), source: error.into() })?;
        let exchange = async {
            let response = self.client.request(request).await?;
            let status = response.status();
            let body = response.into_body().collect().await?.to_bytes();
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>((status, body))
        };
        match tokio::time::timeout(REQUEST_TIMEOUT, exchange).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(source)) => Err(HarnessError::Http { context, source }),
            Err(elapsed) => Err(HarnessError::Http { context, source: elapsed.into() }),
        }
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn expect_ok(what: &str, status: StatusCode, body: &[u8]) -> Result<(), HarnessError> {
    if status.is_success() {
        return Ok(());
    }
    Err(HarnessError::Setup(format!("moto answered {what} with {status}: {}", String::from_utf8_lossy(body))))
}

/// Percent-encodes all but RFC 3986's unreserved characters (and `/` in a path).
fn encode(text: &str, path: bool) -> String {
    let mut encoded = String::with_capacity(text.len());
    for byte in text.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => encoded.push(byte as char),
            b'/' if path => encoded.push('/'),
            _ => encoded.push_str(&format!("%{byte:02X}")),
        }
    }
    encoded
}

/// One page of a ListObjectsV2 answer.
#[derive(Debug, PartialEq)]
struct Listing {
    keys: Vec<String>,
    /// The continuation token of the next page, when truncated.
    next: Option<String>,
}

/// The `<Key>`s of a ListObjectsV2 answer (only `<Contents>` has them
/// without a delimiter) and its `<NextContinuationToken>`.
fn parse_listing(xml: &str) -> Listing {
    let elements = |name: &str| {
        let (open, close) = (format!("<{name}>"), format!("</{name}>"));
        let mut found = Vec::new();
        let mut rest = xml;
        while let Some(start) = rest.find(&open) {
            let after = &rest[start + open.len()..];
            let Some(end) = after.find(&close) else { break };
            found.push(unescape(&after[..end]));
            rest = &after[end + close.len()..];
        }
        found
    };
    let truncated = elements("IsTruncated").first().is_some_and(|value| value == "true");
    Listing { keys: elements("Key"), next: elements("NextContinuationToken").pop().filter(|_| truncated) }
}

fn unescape(text: &str) -> String {
    text.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&#39;", "'")
        .replace("&#x27;", "'")
        .replace("&amp;", "&")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_tokens_are_read_from_a_listing() {
        let xml = r#"<?xml version="1.0" encoding="utf-8"?>
<ListBucketResult><IsTruncated>true</IsTruncated><Contents><Key>a b/c&amp;d.parquet</Key><Size>5</Size></Contents><Contents><Key>e</Key></Contents><Name>x</Name><NextContinuationToken>t0k</NextContinuationToken></ListBucketResult>"#;
        let page = parse_listing(xml);
        assert_eq!(page, Listing { keys: vec!["a b/c&d.parquet".into(), "e".into()], next: Some("t0k".into()) });
        let last = parse_listing("<ListBucketResult><IsTruncated>false</IsTruncated></ListBucketResult>");
        assert_eq!(last, Listing { keys: vec![], next: None });
        assert_eq!(encode("app/2026-01-02/a b+c.parquet", true), "app/2026-01-02/a%20b%2Bc.parquet");
        assert_eq!(encode("a/b", false), "a%2Fb");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn objects_go_in_and_out_until_the_server_stops() {
        let mut s3 = S3Server::start().await.unwrap();
        assert_eq!(s3.url("archive/"), format!("s3://{S3_BUCKET}/archive/"));
        let env = s3.env();
        let value = |name: &str| env.iter().find(|(key, _)| key == name).map(|(_, value)| value.clone());
        assert_eq!(value("AWS_ENDPOINT_URL"), Some(s3.endpoint()));
        assert_eq!(value("AWS_ALLOW_HTTP").as_deref(), Some("true"));

        let key = "archive/app one/2026-01-02.parquet";
        s3.put_object(key, b"PAR1 not really".to_vec()).await.unwrap();
        assert_eq!(s3.get_object(key).await.unwrap().as_deref(), Some(&b"PAR1 not really"[..]));
        assert_eq!(s3.get_object("archive/missing").await.unwrap(), None);
        assert_eq!(s3.list("archive/").await.unwrap(), vec![key.to_owned()]);
        assert_eq!(s3.list("other/").await.unwrap(), Vec::<String>::new());

        s3.stop().unwrap();
        assert!(!s3.is_running());
        let refused = tokio::net::TcpStream::connect(s3.addr()).await.unwrap_err();
        assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
        assert!(matches!(s3.get_object(key).await, Err(HarnessError::Http { .. })));

        let port = s3.port();
        s3.restart().await.unwrap();
        assert_eq!(s3.port(), port);
        assert_eq!(s3.get_object(key).await.unwrap(), None, "moto keeps nothing across a restart");
        s3.put_object(key, b"again".to_vec()).await.unwrap();

        let dir = s3.dir.clone();
        drop(s3);
        assert!(!dir.exists());
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn duckdb_reads_what_was_downloaded_from_the_bucket() {
        let s3 = S3Server::start().await.unwrap();
        let scratch = throwaway_dir("s3-read");
        std::fs::create_dir_all(&scratch).unwrap();
        let written = scratch.join("written.parquet");
        crate::duckdb_json(&format!(
            "COPY (SELECT range AS n FROM range(3)) TO '{}' (FORMAT parquet, COMPRESSION zstd)",
            written.display()
        ))
        .unwrap();
        let bytes = std::fs::read(&written).unwrap();
        s3.put_object("day/app=a/part-0.parquet", bytes).await.unwrap();
        s3.put_object("day/app=b/part-0.parquet", std::fs::read(&written).unwrap()).await.unwrap();

        let copies = scratch.join("copies");
        let files = s3.download("day/", &copies).await.unwrap();
        assert_eq!(files, vec![copies.join("day/app=a/part-0.parquet"), copies.join("day/app=b/part-0.parquet")]);
        let rows = crate::duckdb_json(&format!(
            "SELECT app, sum(n)::INTEGER AS total FROM read_parquet('{}/day/*/*.parquet', hive_partitioning = true) \
             GROUP BY app ORDER BY app",
            copies.display()
        ))
        .unwrap();
        assert_eq!(rows, serde_json::json!([{"app": "a", "total": 3}, {"app": "b", "total": 3}]));
        std::fs::remove_dir_all(&scratch).unwrap();
    }
}
