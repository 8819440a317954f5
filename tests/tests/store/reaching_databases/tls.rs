//! TLS as libpq's `sslmode` promises it, against real servers with
//! certificates made for the run: every mode reaches a server that takes
//! TLS only (and `disable` is refused there), a certificate that does not
//! verify is refused with its reason and never retried in plaintext, a
//! server asking for client certificates gets them, and the store and the
//! whole conformance suite work over `verify-full`.
//!
//! The refusals run against servers that also take plaintext (the shared
//! test server, or a cluster without `hostssl_only`), so a client that fell
//! back to plaintext would connect and fail the test.
//!
//! On a server built without SSL every test that needs a TLS server ends
//! early, saying so; the two that need none (a fake server refusing TLS, a
//! verify mode without roots) run everywhere.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use adk_postgres_connect::{ConnectConfig, ConnectError, SslMode, TlsFailure};
use adk_postgres_domain::{AppName, AppendOptions, CreateSession, Event, SessionStore, StoreConfig, UserId};
use adk_postgres_storage::{PgSessionStore, PoolBuildError, PoolConfig, run_pending_migrations};
use adk_postgres_testing::{
    Capability, Cluster, ServerCert, TestPki, TlsOptions, connect, skip_without, start_throwaway_tls_cluster,
    test_database,
};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// Whether the session running it is encrypted, from the server's side.
const IN_TLS: &str = "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()";

/// A throwaway cluster with TLS as `options` say, and its PKI. Leaked, as
/// the harness's databases borrow their cluster for the whole test; the
/// watchdog removes it when the test process ends.
async fn tls_cluster(options: TlsOptions) -> (&'static Cluster, TestPki) {
    let (cluster, pki) = tokio::task::spawn_blocking(move || start_throwaway_tls_cluster(&options))
        .await
        .expect("task")
        .expect("a TLS cluster");
    (Box::leak(Box::new(cluster)), pki)
}

/// A libpq value, quoted so a path with a space or quote stays one value.
fn quoted(value: impl AsRef<str>) -> String {
    format!("'{}'", value.as_ref().replace('\\', "\\\\").replace('\'', "\\'"))
}

fn path(file: &Path) -> String {
    quoted(file.display().to_string())
}

/// The superuser's maintenance database on `cluster` by host name `host`,
/// in libpq's key/value form, with `tls` (more `key=value` pairs) after it.
fn conninfo(cluster: &Cluster, host: &str, tls: &str) -> String {
    format!("host={host} port={} user=postgres dbname=postgres {tls}", cluster.port())
}

/// Where a harness database is, as key/value pairs without any TLS
/// setting, and the address its URL names (an IP address on the harness's
/// servers), for connecting to it by another host name.
fn server_of(db_url: &str) -> (String, IpAddr) {
    let url = url::Url::parse(db_url).expect("a harness URL");
    let address = url.host_str().and_then(|host| host.parse().ok()).expect("the harness's servers are on an IP");
    let mut conninfo = format!(
        "port={} user={} dbname={}",
        url.port().unwrap_or(5432),
        quoted(url.username()),
        quoted(url.path().trim_start_matches('/'))
    );
    if let Some(password) = url.password() {
        conninfo.push_str(&format!(" password={}", quoted(password)));
    }
    (conninfo, address)
}

/// The `ssl` column of [`IN_TLS`] on a session opened with `url`.
async fn session_is_tls(url: &str) -> bool {
    let config = ConnectConfig::from_url(url).unwrap_or_else(|e| panic!("{url}: {e}"));
    let client = config.client().await.unwrap_or_else(|e| panic!("connecting with {url}: {e}"));
    client.query_one(IN_TLS, &[]).await.expect("pg_stat_ssl").get(0)
}

/// Why a connect with `url` failed; a panic when it succeeded.
async fn refusal(url: &str) -> ConnectError {
    let config = ConnectConfig::from_url(url).unwrap_or_else(|e| panic!("{url}: {e}"));
    config.connect().await.expect_err(url)
}

#[track_caller]
fn assert_tls_refusal(error: &ConnectError, expected: &TlsFailure) {
    assert!(!error.is_retryable(), "a certificate that does not verify will not verify later: {error}");
    match error {
        ConnectError::Tls { reason, .. } => assert_eq!(reason, expected, "{error}"),
        other => panic!("expected the TLS failure {expected:?}, got {other:?}"),
    }
}

/// The server itself said no, as an authorization failure (SQLSTATE
/// 28000) whose message holds `says`.
#[track_caller]
fn assert_refused_by_the_server(source: &tokio_postgres::Error, says: &str) {
    let db = source.as_db_error().unwrap_or_else(|| panic!("not the server's answer: {source:?}"));
    assert_eq!(db.code().code(), "28000", "{db}");
    assert!(db.message().contains(says), "{db}");
}

/// A folder of the test's own, removed when dropped.
#[derive(Debug)]
struct ScratchDir(PathBuf);

impl ScratchDir {
    fn new(what: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("adk-pg-{what}-{}-{}", std::process::id(), uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).expect("a scratch folder");
        Self(dir)
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[tokio::test(flavor = "current_thread")]
async fn require_verify_ca_and_verify_full_reach_a_hostssl_only_server_over_tls() {
    if skip_without(Capability::Tls).await {
        return;
    }
    let (cluster, pki) = tls_cluster(TlsOptions { hostssl_only: true, ..TlsOptions::default() }).await;
    let ca = format!("sslrootcert={}", path(&pki.ca_cert()));
    for url in [
        conninfo(cluster, "127.0.0.1", "sslmode=require"),
        conninfo(cluster, "localhost", &format!("sslmode=verify-ca {ca}")),
        conninfo(cluster, "localhost", &format!("sslmode=verify-full {ca}")),
        // The certificate names the address too, as an IP SAN.
        conninfo(cluster, "127.0.0.1", &format!("sslmode=verify-full {ca}")),
        // The URL form reads the same parameters.
        format!(
            "postgres://postgres@localhost:{}/postgres?sslmode=verify-full&sslrootcert={}",
            cluster.port(),
            pki.ca_cert().display()
        ),
    ] {
        assert!(session_is_tls(&url).await, "{url} connected in plaintext");
    }
}

#[tokio::test(flavor = "current_thread")]
async fn on_a_hostssl_only_server_disable_is_refused_while_prefer_and_allow_use_tls() {
    if skip_without(Capability::Tls).await {
        return;
    }
    let (cluster, _pki) = tls_cluster(TlsOptions { hostssl_only: true, ..TlsOptions::default() }).await;

    // The server's own refusal (pg_hba.conf's `hostnossl … reject`), not a
    // TLS failure: `disable` never tries TLS.
    let error = refusal(&conninfo(cluster, "127.0.0.1", "sslmode=disable")).await;
    match &error {
        ConnectError::Refused { source, .. } => assert_refused_by_the_server(source, "no encryption"),
        other => panic!("expected the server to refuse plaintext, got {other:?}"),
    }

    // `prefer` asks for TLS first; `allow` tries plaintext first and, once
    // the server refuses it, TLS.
    for mode in ["prefer", "allow"] {
        let url = conninfo(cluster, "127.0.0.1", &format!("sslmode={mode}"));
        assert!(session_is_tls(&url).await, "{url} connected in plaintext");
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_certificate_from_a_ca_not_trusted_is_an_unknown_issuer_and_never_plaintext() {
    if skip_without(Capability::Tls).await {
        return;
    }
    let db = test_database().await;
    let tls_url = db.tls_url().await.expect("the shared test server has TLS");
    assert!(session_is_tls(&tls_url).await, "the shared server's own CA verifies");
    // A CA of our own that signed nothing the server has.
    let scratch = ScratchDir::new("unrelated-pki");
    let unrelated = TestPki::generate(&scratch.0, &[]).expect("an unrelated PKI");
    let (server, address) = server_of(db.url());
    let wrong = format!("sslrootcert={}", path(&unrelated.ca_cert()));
    for url in [
        format!("{server} host=localhost sslmode=verify-full {wrong}"),
        format!("{server} host={address} sslmode=verify-ca {wrong}"),
        // libpq's rule: a root file makes `require` check the chain too.
        format!("{server} host={address} sslmode=require {wrong}"),
    ] {
        assert_tls_refusal(&refusal(&url).await, &TlsFailure::UnknownIssuer);
    }
    // The same server takes plaintext, so had any of them fallen back it
    // would have connected rather than failed.
    assert!(!session_is_tls(&format!("{server} host={address} sslmode=disable")).await);
}

#[tokio::test(flavor = "current_thread")]
async fn verify_full_refuses_a_host_name_the_certificate_lacks_and_verify_ca_accepts_it() {
    if skip_without(Capability::Tls).await {
        return;
    }
    let db = test_database().await;
    let tls_url = db.tls_url().await.expect("the shared test server has TLS");
    let ca = url::Url::parse(&tls_url)
        .expect("URL")
        .query_pairs()
        .find_map(|(key, value)| (key == "sslrootcert").then(|| value.into_owned()))
        .expect("the TLS URL names its CA");
    let (server, address) = server_of(db.url());
    // `hostaddr` reaches the server while `host` is the name checked
    // against the certificate, as in libpq; `.invalid` resolves nowhere
    // (RFC 6761), so no lookup can reach another server.
    let named = |mode: &str| {
        format!(
            "{server} host=not-in-the-certificate.invalid hostaddr={address} sslmode={mode} sslrootcert={}",
            quoted(&ca)
        )
    };
    let error = refusal(&named("verify-full")).await;
    assert_tls_refusal(&error, &TlsFailure::WrongHost { host: "not-in-the-certificate.invalid".to_owned() });
    assert!(error.to_string().contains("not-in-the-certificate.invalid"), "the message names the host: {error}");
    assert!(session_is_tls(&named("verify-ca")).await, "verify-ca checks the chain, not the name");
}

#[tokio::test(flavor = "current_thread")]
async fn an_expired_server_certificate_fails_verification_but_require_without_roots_connects() {
    if skip_without(Capability::Tls).await {
        return;
    }
    let (cluster, pki) = tls_cluster(TlsOptions { server_cert: ServerCert::Expired, ..TlsOptions::default() }).await;
    let ca = format!("sslrootcert={}", path(&pki.ca_cert()));
    for url in [
        conninfo(cluster, "localhost", &format!("sslmode=verify-full {ca}")),
        conninfo(cluster, "localhost", &format!("sslmode=verify-ca {ca}")),
        conninfo(cluster, "127.0.0.1", &format!("sslmode=require {ca}")),
    ] {
        assert_tls_refusal(&refusal(&url).await, &TlsFailure::Expired);
    }
    // Without roots `require` only encrypts, as libpq's does: the date of a
    // certificate nobody checks does not matter.
    assert!(session_is_tls(&conninfo(cluster, "127.0.0.1", "sslmode=require")).await);
}

#[tokio::test(flavor = "current_thread")]
async fn require_and_verify_full_refuse_a_server_that_offers_no_tls_without_trying_plaintext() {
    // A server that answers the SSLRequest with `N` (no TLS here) and keeps
    // whatever the client sends next: a client falling back to plaintext
    // would send its startup packet, with the user name in it.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("address").port();
    let server = tokio::spawn(async move {
        let mut after_refusal = Vec::new();
        for _ in 0..2 {
            let (mut socket, _) = listener.accept().await.expect("accept");
            let mut request = [0_u8; 8];
            socket.read_exact(&mut request).await.expect("the SSLRequest");
            assert_eq!(request, [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f], "an SSLRequest comes first");
            socket.write_all(b"N").await.expect("no TLS");
            let mut rest = Vec::new();
            // Until the client closes the socket.
            let _ = socket.read_to_end(&mut rest).await;
            after_refusal.push(rest);
        }
        after_refusal
    });
    let scratch = ScratchDir::new("no-tls-pki");
    let pki = TestPki::generate(&scratch.0, &[]).expect("a PKI");
    for tls in ["sslmode=require".to_owned(), format!("sslmode=verify-full sslrootcert={}", path(&pki.ca_cert()))] {
        let url = format!("host=127.0.0.1 port={port} user=someone dbname=postgres {tls}");
        assert_tls_refusal(&refusal(&url).await, &TlsFailure::NotOffered);
    }
    let after_refusal = server.await.expect("the fake server");
    assert_eq!(after_refusal, vec![Vec::<u8>::new(); 2], "nothing was sent in plaintext after the refusal");
}

#[test]
fn a_verify_mode_without_roots_is_a_typed_error_before_any_connect() {
    // The connect crate looks for ~/.postgresql/root.crt in the process's
    // HOME, which a test cannot change (no unsafe set_var); the environment
    // given below is what it would read, were it asked.
    let home = std::env::var_os("HOME").map(PathBuf::from);
    if let Some(home) = &home {
        assert!(
            !home.join(".postgresql/root.crt").exists(),
            "this test needs a HOME without .postgresql/root.crt (libpq's default roots), found in {}",
            home.display()
        );
    }
    let scratch = ScratchDir::new("empty-home");
    let empty_home = scratch.0.display().to_string();
    let environment = |given: &[(&str, &str)]| {
        let given: Vec<(String, String)> = given.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        let home = empty_home.clone();
        move |name: &str| {
            if name == "HOME" {
                return Some(home.clone());
            }
            given.iter().find(|(key, _)| key == name).map(|(_, value)| value.clone())
        }
    };
    // Nothing listens on port 1: a connect would be an Unreachable error,
    // not a TlsFile one, and parsing does no I/O.
    for (url, given) in [
        ("host=localhost port=1 user=u dbname=d sslmode=verify-full", vec![]),
        ("postgres://u@localhost:1/d?sslmode=verify-ca", vec![]),
        // libpq's PGSSLMODE fills in what the string leaves out.
        ("postgres://u@localhost:1/d", vec![("PGSSLMODE", "verify-full")]),
    ] {
        match ConnectConfig::from_url_with_environment(url, &environment(&given)) {
            Err(ConnectError::TlsFile { parameter: "sslrootcert", reason, .. }) => {
                assert!(reason.contains("needs trusted roots"), "{url}: {reason}");
            }
            other => panic!("{url} with {given:?}: expected a missing sslrootcert, got {other:?}"),
        }
    }
    // The modes that do not verify need no roots.
    let prefer = ConnectConfig::from_url_with_environment("postgres://u@localhost:1/d", &environment(&[]));
    assert_eq!(prefer.expect("prefer needs no roots").ssl_mode(), SslMode::Prefer);
}

#[tokio::test(flavor = "current_thread")]
async fn a_server_wanting_client_certificates_takes_the_users_and_refuses_the_rest() {
    if skip_without(Capability::Tls).await {
        return;
    }
    let options = TlsOptions { hostssl_only: true, client_cert: true, ..TlsOptions::default() };
    let (cluster, pki) = tls_cluster(options).await;
    let verified = conninfo(cluster, "localhost", &format!("sslmode=verify-full sslrootcert={}", path(&pki.ca_cert())));
    let with_cert =
        |(cert, key): &(PathBuf, PathBuf)| format!("{verified} sslcert={} sslkey={}", path(cert), path(key));

    let own = with_cert(&pki.client_cert("postgres").expect("the user's certificate"));
    let client = ConnectConfig::from_url(&own).expect("URL").client().await.expect("the user's certificate is taken");
    let row = client.query_one("SELECT ssl, client_dn FROM pg_stat_ssl WHERE pid = pg_backend_pid()", &[]).await;
    let (ssl, client_dn): (bool, Option<String>) = row.map(|r| (r.get(0), r.get(1))).expect("pg_stat_ssl");
    assert!(ssl);
    assert_eq!(client_dn.as_deref(), Some("/CN=postgres"), "the server saw our certificate");

    // Each is a typed refusal from the connect itself, well within the
    // connect bound (a hang would end as ConnectError::Timeout instead).
    let error = refusal(&verified).await;
    match &error {
        ConnectError::Refused { source, .. } => assert_refused_by_the_server(source, "valid client certificate"),
        other => panic!("expected the server to ask for a certificate, got {other:?}"),
    }
    let error = refusal(&with_cert(&pki.client_cert("someone_else").expect("another user's certificate"))).await;
    match &error {
        // PostgreSQL checks the certificate's CN against the user after
        // the handshake, as part of `clientcert=verify-full`.
        ConnectError::Refused { source, .. } => assert_refused_by_the_server(source, "authentication failed for user"),
        other => panic!("expected the server to refuse another user's certificate, got {other:?}"),
    }
    // A certificate for the right user from a CA the server does not trust
    // fails in the handshake itself.
    let scratch = ScratchDir::new("foreign-client-pki");
    let foreign = TestPki::generate(&scratch.0, &[]).expect("an unrelated PKI");
    let error = refusal(&with_cert(&foreign.client_cert("postgres").expect("a foreign certificate"))).await;
    assert_tls_refusal(&error, &TlsFailure::ClientCertificateRefused);
}

#[tokio::test(flavor = "current_thread")]
async fn the_store_migrates_and_works_over_verify_full_and_a_wrong_ca_fails_to_build() {
    if skip_without(Capability::Tls).await {
        return;
    }
    let (cluster, pki) = tls_cluster(TlsOptions { hostssl_only: true, ..TlsOptions::default() }).await;
    // A database of our own, so the migrations themselves run over TLS
    // (the harness's are cloned from a template it migrated).
    let admin = connect(&cluster.server_url()).await.expect("the superuser (prefer: TLS, since the server wants it)");
    admin.batch_execute("CREATE DATABASE adk_over_tls").await.expect("a database");
    let url = format!(
        "postgres://postgres@localhost:{}/adk_over_tls?sslmode=verify-full&sslrootcert={}",
        cluster.port(),
        pki.ca_cert().display()
    );
    let applied = run_pending_migrations(&url).await.expect("migrations over verify-full");
    assert!(!applied.is_empty(), "a new database gets every migration");

    let store = PgSessionStore::connect(&url, &PoolConfig::default(), StoreConfig::default())
        .await
        .expect("the store over verify-full");
    let session = store
        .create(CreateSession::new(AppName::new("app").expect("app"), UserId::new("u").expect("user")))
        .await
        .expect("create");
    store.append(&session.key, Event::new("agent"), AppendOptions::default()).await.expect("append");
    let stored = store.get(&session.key, Default::default()).await.expect("get");
    assert_eq!(stored.events.len(), 1);
    let (sessions, in_tls): (i64, bool) = admin
        .query_one(
            "SELECT count(*), coalesce(bool_and(s.ssl), false) FROM pg_stat_activity a \
             JOIN pg_stat_ssl s USING (pid) WHERE a.datname = 'adk_over_tls'",
            &[],
        )
        .await
        .map(|row| (row.get(0), row.get(1)))
        .expect("the store's sessions");
    assert!(sessions > 0 && in_tls, "{sessions} session(s) of the store, all in TLS: {in_tls}");

    let wrong = url.replace(&pki.ca_cert().display().to_string(), &pki.wrong_ca_cert().display().to_string());
    match PgSessionStore::connect(&wrong, &PoolConfig::default(), StoreConfig::default()).await {
        Err(PoolBuildError::Connect(error)) => assert_tls_refusal(&error, &TlsFailure::UnknownIssuer),
        other => panic!("expected the store to fail on the wrong CA, got {other:?}"),
    }
}

/// The whole conformance suite over `verify-full` TLS to the shared test
/// server: nothing in the store depends on a plaintext connection.
mod conformance_over_tls {
    use std::sync::Arc;

    use adk_postgres_connect::{ConnectConfig, SslMode};
    use adk_postgres_domain::{SessionStore, StoreConfig};
    use adk_postgres_storage::{PgSessionStore, PoolConfig};
    use adk_postgres_testing::{TestDatabase, test_database};
    use adk_postgres_tests::conformance::StoreFactory;
    use tokio::sync::OnceCell;

    use super::IN_TLS;

    /// One database per test and its verified TLS URL, made on first use;
    /// every store a case asks for is a pool on that URL.
    #[derive(Debug, Default)]
    struct TlsFactory {
        db: OnceCell<(TestDatabase, String)>,
    }

    impl StoreFactory for TlsFactory {
        async fn store(&self, config: StoreConfig) -> Arc<dyn SessionStore> {
            let (_db, url) = self
                .db
                .get_or_init(|| async {
                    let db = test_database().await;
                    let url = db.tls_url().await.expect("the shared test server has TLS");
                    let connect = ConnectConfig::from_url(&url).expect("the TLS URL");
                    assert_eq!(connect.ssl_mode(), SslMode::VerifyFull);
                    // A session made from the same URL, checked by the server.
                    let client = connect.client().await.expect("a session over TLS");
                    let ssl: bool = client.query_one(IN_TLS, &[]).await.expect("pg_stat_ssl").get(0);
                    assert!(ssl, "{url} connected in plaintext");
                    (db, url)
                })
                .await;
            let store = PgSessionStore::connect(url, &PoolConfig::default(), config)
                .await
                .unwrap_or_else(|e| panic!("connecting the store over TLS: {e}"));
            Arc::new(store)
        }
    }

    adk_postgres_tests::conformance_tests!(TlsFactory::default(), requires adk_postgres_testing::Capability::Tls);
}
