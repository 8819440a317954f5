//! [`ConnectConfig`]: a parsed connection string and what to do with it.

use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio_postgres::config::{Host, SslMode as DriverSslMode, TargetSessionAttrs};
use tokio_postgres::{Client, Socket};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::conninfo::{self, ConnInfo};
use crate::credentials::{Secret, SharedPasswordProvider};
use crate::error::ConnectError;
use crate::tls::{self, SslMode, Tls};

/// Longest a connect to one host may take on the client, TCP, TLS and
/// authentication together, when the string sets no `connect_timeout`.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Idle time before the first keepalive probe. Short enough that a
/// connection idle in a pool through a partition is found dead within
/// half a minute (idle + interval × retries), long enough to cost nothing.
pub const DEFAULT_KEEPALIVES_IDLE: Duration = Duration::from_secs(10);
/// Time between unanswered keepalive probes.
pub const DEFAULT_KEEPALIVES_INTERVAL: Duration = Duration::from_secs(5);
/// Unanswered probes after which the kernel drops the connection.
pub const DEFAULT_KEEPALIVES_RETRIES: u32 = 3;
/// How long sent data may stay unacknowledged before the kernel drops the
/// connection: under the store's 30 s operation bound, so a silent peer
/// fails the socket rather than leaving it for Linux's ~15 minutes.
pub const DEFAULT_TCP_USER_TIMEOUT: Duration = Duration::from_secs(20);

/// The TLS stream every connection of the project uses (plaintext
/// connections are its unencrypted case).
pub type TlsStream = <MakeRustlsConnect as tokio_postgres::tls::MakeTlsConnect<Socket>>::Stream;
/// The half of a connection that performs the I/O; it must be polled
/// (spawned) for the client to work.
pub type PgConnection = tokio_postgres::Connection<Socket, TlsStream>;

/// The setting [`ConnectConfig::marking_direct_sessions`] sends.
pub const DIRECT_SESSION_SETTING: &str = "adk.direct_session";
/// A query answering one row, one boolean column `direct`: whether the
/// statement ran in a session marked by [`ConnectConfig::marking_direct_sessions`].
pub const DIRECT_SESSION_CHECK: &str =
    "SELECT coalesce(current_setting('adk.direct_session', true) = 'on', false) AS direct";

/// The TLS connector of every connection (and of cancel requests).
pub type TlsConnector = MakeRustlsConnect;

/// How to connect: parsed once, cheap to clone, safe to print.
#[derive(Clone)]
pub struct ConnectConfig {
    driver: tokio_postgres::Config,
    tls: Tls,
    make_tls: MakeRustlsConnect,
    password: Option<SharedPasswordProvider>,
    /// `options` as the caller gave it; server settings are added to it.
    user_options: Option<String>,
    server_settings: Vec<(String, String)>,
    /// Set once a server (a pooler) refused startup options; shared by
    /// clones so the pool asks only once.
    options_refused: Arc<AtomicBool>,
    connect_timeout: Duration,
    redacted: String,
}

impl std::fmt::Debug for ConnectConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectConfig")
            .field("url", &self.redacted)
            .field("sslmode", &self.tls.mode)
            .field("password_provider", &self.password.is_some())
            .field("server_settings", &self.server_settings)
            .field("connect_timeout", &self.connect_timeout)
            .finish()
    }
}

/// A new connection: the client, and the connection to drive.
pub struct Connected {
    /// Sends statements; works only while `connection` is polled.
    pub client: Client,
    /// The I/O half, to be spawned on the runtime.
    pub connection: PgConnection,
    /// Whether the server settings went in the startup packet; `false`
    /// when a pooler refused startup options.
    pub server_settings_applied: bool,
}

impl std::fmt::Debug for Connected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connected").field("server_settings_applied", &self.server_settings_applied).finish()
    }
}

fn os_user() -> Option<String> {
    std::env::var("USER").ok().or_else(|| std::env::var("LOGNAME").ok()).filter(|u| !u.is_empty())
}

impl FromStr for ConnectConfig {
    type Err = ConnectError;

    fn from_str(url: &str) -> Result<Self, Self::Err> {
        Self::from_url(url)
    }
}

impl ConnectConfig {
    /// Parses a libpq connection string (`postgres://…` or `key=value …`),
    /// taking what it leaves out from libpq's `PG*` variables.
    pub fn from_url(url: &str) -> Result<Self, ConnectError> {
        Self::from_url_with_environment(url, &|name| std::env::var(name).ok())
    }

    /// [`Self::from_url`] with the environment supplied, for tests.
    pub fn from_url_with_environment(
        url: &str,
        environment: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, ConnectError> {
        let info = conninfo::parse(url, environment)?;
        let driver = driver_config(&info)?;
        let home = environment("HOME");
        let tls = tls::from_conninfo(&info, home.as_deref())?;
        let make_tls = MakeRustlsConnect::new((*tls.config).clone());
        let connect_timeout = driver.get_connect_timeout().copied().unwrap_or(DEFAULT_CONNECT_TIMEOUT);
        Ok(Self {
            user_options: driver.get_options().map(str::to_owned),
            driver,
            tls,
            make_tls,
            password: None,
            server_settings: Vec::new(),
            options_refused: Arc::new(AtomicBool::new(false)),
            connect_timeout,
            redacted: conninfo::redact_url(url),
        })
    }

    /// Asks `provider` for the password on every new connection (it
    /// replaces any password in the string).
    pub fn with_password_provider(mut self, provider: SharedPasswordProvider) -> Self {
        self.password = Some(provider);
        self
    }

    /// Names connections in `pg_stat_activity`, unless the string did.
    pub fn with_default_application_name(mut self, name: &str) -> Self {
        if self.driver.get_application_name().is_none() {
            self.driver.application_name(name);
        }
        self
    }

    /// Server settings (`statement_timeout` and the like) every connection
    /// starts with, sent as `-c name=value` startup options: they hold for
    /// the whole session on a direct connection and can never leak to
    /// another client, because a pooler either refuses startup options
    /// (then the connection is made without them, see
    /// [`Self::pooler_refused_settings`]) or drops them.
    pub fn with_server_settings(mut self, settings: Vec<(String, String)>) -> Self {
        self.server_settings = settings;
        self
    }

    /// One more server setting, after those already set.
    pub fn with_server_setting(mut self, name: &str, value: &str) -> Self {
        self.server_settings.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Marks every session this config opens with [`DIRECT_SESSION_SETTING`]
    /// = `on`, so [`DIRECT_SESSION_CHECK`] run on it tells a session of our
    /// own (direct, or through a plain TCP proxy) from one a pooler lends:
    /// a pooler refuses or drops startup options, so the mark is missing
    /// on the server connection a statement reaches.
    pub fn marking_direct_sessions(self) -> Self {
        self.with_server_setting(DIRECT_SESSION_SETTING, "on")
    }

    /// The client-side bound on one connect attempt per host.
    pub fn with_connect_timeout(mut self, bound: Duration) -> Self {
        self.connect_timeout = bound;
        self.driver.connect_timeout(bound);
        self
    }

    /// The client-side bound on one connect attempt per host.
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// The longest a whole [`Self::connect`] may take: one connect bound
    /// per host tried, since each host gets its own.
    pub fn connect_bound(&self) -> Duration {
        let hosts = u32::try_from(self.driver.get_hosts().len().max(1)).unwrap_or(u32::MAX);
        self.connect_timeout.saturating_mul(hosts)
    }

    /// The `sslmode` in effect: the string's, else `verify-full` with
    /// `sslrootcert=system`, else `prefer`.
    pub fn ssl_mode(&self) -> SslMode {
        self.tls.mode
    }

    /// The connection string with any password replaced by `***`.
    pub fn redacted(&self) -> &str {
        &self.redacted
    }

    /// The database to connect to; `None` means PostgreSQL's default, the
    /// database named like the user.
    pub fn database(&self) -> Option<&str> {
        self.driver.get_dbname()
    }

    /// The role to log in as (the string's, `PGUSER`, else the OS user).
    pub fn user(&self) -> Option<&str> {
        self.driver.get_user()
    }

    /// The same server with another database.
    pub fn with_database(mut self, database: &str) -> Self {
        self.driver.dbname(database);
        self
    }

    /// Whether a server refused startup options, which only a pooler does
    /// (PgBouncer: "unsupported startup parameter: options").
    pub fn pooler_refused_settings(&self) -> bool {
        self.options_refused.load(Ordering::Relaxed)
    }

    /// The driver's settings, for what this type does not wrap. Connect
    /// through [`Self::connect`], never the driver directly.
    pub fn driver(&self) -> &tokio_postgres::Config {
        &self.driver
    }

    /// A copy whose `target_session_attrs` is `read-only` acceptance
    /// (`any`), for operator reads that may go to a standby.
    pub fn for_any_session(mut self) -> Self {
        self.driver.target_session_attrs(TargetSessionAttrs::Any);
        self
    }

    /// A TLS connector with the same settings, for cancel requests.
    pub fn tls_connector(&self) -> MakeRustlsConnect {
        self.make_tls.clone()
    }

    pub(crate) fn target(&self) -> String {
        self.redacted.clone()
    }

    fn first_host(&self) -> String {
        match self.driver.get_hosts().first() {
            Some(Host::Tcp(host)) => host.clone(),
            #[cfg(unix)]
            Some(Host::Unix(path)) => path.display().to_string(),
            None => String::new(),
        }
    }

    /// Opens a connection, bounded by [`Self::connect_bound`] on the client.
    pub async fn connect(&self) -> Result<Connected, ConnectError> {
        let bound = self.connect_bound();
        match tokio::time::timeout(bound, self.connect_unbounded()).await {
            Ok(result) => result,
            Err(_elapsed) => Err(ConnectError::Timeout { target: self.target(), bound }),
        }
    }

    /// Opens a session of our own, refusing one that a pooler lends
    /// ([`ConnectError::ThroughPooler`]) before any statement of the
    /// caller's runs on it: the session is marked at startup
    /// ([`Self::marking_direct_sessions`]) and the mark read back with one
    /// unnamed statement, which leaves nothing behind on a pooled server
    /// connection.
    pub async fn connect_direct(&self) -> Result<Connected, ConnectError> {
        let bound = self.connect_bound();
        let marked = self.clone().marking_direct_sessions();
        let check = async {
            let mut connected = marked.connect_unbounded().await?;
            if !connected.server_settings_applied {
                return Err(ConnectError::ThroughPooler { target: self.target() });
            }
            let answer = {
                let query = connected.client.query_typed(DIRECT_SESSION_CHECK, &[]);
                tokio::pin!(query);
                tokio::select! {
                    rows = &mut query => rows,
                    ended = &mut connected.connection => {
                        return Err(match ended {
                            Err(source) => ConnectError::Unreachable { target: self.target(), source },
                            Ok(()) => ConnectError::Closed { target: self.target() },
                        });
                    }
                }
            };
            let direct = answer
                .map_err(|source| ConnectError::Unreachable { target: self.target(), source })?
                .first()
                .and_then(|row| row.try_get::<_, bool>(0).ok())
                .unwrap_or(false);
            if direct { Ok(connected) } else { Err(ConnectError::ThroughPooler { target: self.target() }) }
        };
        match tokio::time::timeout(bound, check).await {
            Ok(result) => result,
            Err(_elapsed) => Err(ConnectError::Timeout { target: self.target(), bound }),
        }
    }

    /// Opens a connection and drives it on the runtime; the client is
    /// usable until dropped.
    pub async fn client(&self) -> Result<Client, ConnectError> {
        let connected = self.connect().await?;
        spawn_connection(connected.connection);
        Ok(connected.client)
    }

    /// A diesel-async connection with these settings, for operator work.
    pub async fn diesel(&self) -> Result<diesel_async::AsyncPgConnection, ConnectError> {
        let connected = self.connect().await?;
        let bound = self.connect_bound();
        match tokio::time::timeout(bound, connected.into_diesel()).await {
            Ok(result) => result,
            Err(_elapsed) => Err(ConnectError::Timeout { target: self.target(), bound }),
        }
    }

    async fn connect_unbounded(&self) -> Result<Connected, ConnectError> {
        // The driver's config cannot unset `options` once set, so the
        // attempt with server settings works on a copy and the retry
        // without them starts again from this one.
        let mut base = self.driver.clone();
        if let Some(provider) = &self.password {
            let secret: Secret =
                provider.password().await.map_err(|e| ConnectError::Credentials { message: e.message })?;
            base.password(secret.expose());
        }
        let send_settings = !self.server_settings.is_empty() && !self.pooler_refused_settings();
        if !send_settings {
            let (client, connection) = self.attempt(&base).await?;
            return Ok(Connected { client, connection, server_settings_applied: false });
        }
        let mut with_settings = base.clone();
        with_settings.options(self.options_with_settings());
        match self.attempt(&with_settings).await {
            Ok((client, connection)) => Ok(Connected { client, connection, server_settings_applied: true }),
            Err(ConnectError::Refused { source, .. }) if refuses_startup_options(&source) => {
                self.options_refused.store(true, Ordering::Relaxed);
                tracing::warn!(
                    target = %self.redacted,
                    "the server refused startup options, so a pooler sits in front of it; connecting without \
                     them (server-side timeouts then come from the role's or database's settings)"
                );
                let (client, connection) = self.attempt(&base).await?;
                Ok(Connected { client, connection, server_settings_applied: false })
            }
            Err(e) => Err(e),
        }
    }

    fn options_with_settings(&self) -> String {
        let mut options = self.user_options.clone().unwrap_or_default();
        for (name, value) in &self.server_settings {
            if !options.is_empty() {
                options.push(' ');
            }
            // libpq's options syntax: a backslash escapes a space.
            options.push_str(&format!("-c {name}={}", value.replace('\\', "\\\\").replace(' ', "\\ ")));
        }
        options
    }

    async fn attempt(&self, driver: &tokio_postgres::Config) -> Result<(Client, PgConnection), ConnectError> {
        let mut driver = driver.clone();
        match self.tls.mode {
            SslMode::Disable => {
                driver.ssl_mode(DriverSslMode::Disable);
            }
            SslMode::Allow => {
                driver.ssl_mode(DriverSslMode::Disable);
                match self.open(&driver).await {
                    // libpq's `allow`: plaintext first, TLS when the server
                    // refuses plaintext.
                    Err(ConnectError::Refused { .. }) => {
                        driver.ssl_mode(DriverSslMode::Require);
                    }
                    other => return other,
                }
            }
            SslMode::Prefer => {
                driver.ssl_mode(DriverSslMode::Prefer);
                match self.open(&driver).await {
                    // libpq's `prefer`: a TLS connection that fails is
                    // tried again in plaintext (Citus' self-signed X.509
                    // v1 certificates, say, which rustls cannot parse).
                    // Only the verify modes and `require` never fall back.
                    Err(ConnectError::Tls { reason, .. }) => {
                        tracing::debug!(%reason, "TLS failed under sslmode=prefer; trying plaintext");
                        driver.ssl_mode(DriverSslMode::Disable);
                    }
                    other => return other,
                }
            }
            _ => {
                driver.ssl_mode(DriverSslMode::Require);
            }
        }
        self.open(&driver).await
    }

    async fn open(&self, driver: &tokio_postgres::Config) -> Result<(Client, PgConnection), ConnectError> {
        driver.connect(self.make_tls.clone()).await.map_err(|source| {
            if let Some((reason, detail)) = tls::failure_of(&source, &self.first_host()) {
                return ConnectError::Tls { target: self.target(), reason, detail };
            }
            if source.as_db_error().is_some() {
                ConnectError::Refused { target: self.target(), source }
            } else {
                ConnectError::Unreachable { target: self.target(), source }
            }
        })
    }
}

/// PgBouncer's answer to a startup packet with `options` in it.
fn refuses_startup_options(error: &tokio_postgres::Error) -> bool {
    error.as_db_error().is_some_and(|db| db.message().contains("unsupported startup parameter"))
}

/// A diesel-async connection to `url` (a libpq connection string), for
/// operator work, with the error as diesel reports connection failures
/// (its message redacted like every [`ConnectError`]). A session a pooler
/// lends is refused ([`ConnectConfig::connect_direct`]): diesel-async keeps
/// named prepared statements and runs `SET`s, and operator work sets
/// timeouts and takes session locks, all of which a transaction pooler
/// would leave on a server connection for its next client.
pub async fn establish(url: &str) -> Result<diesel_async::AsyncPgConnection, diesel::ConnectionError> {
    let bad = |e: ConnectError| diesel::ConnectionError::BadConnection(e.to_string());
    let config = ConnectConfig::from_url(url).map_err(bad)?;
    let connected = config.connect_direct().await.map_err(bad)?;
    let bound = config.connect_bound();
    match tokio::time::timeout(bound, connected.into_diesel()).await {
        Ok(result) => result.map_err(bad),
        Err(_elapsed) => Err(bad(ConnectError::Timeout { target: config.target(), bound })),
    }
}

/// A tokio-postgres client to `url`, driven on the runtime.
pub async fn client(url: &str) -> Result<Client, ConnectError> {
    ConnectConfig::from_url(url)?.client().await
}

impl Connected {
    /// The connection as diesel-async's, for operator work.
    pub async fn into_diesel(self) -> Result<diesel_async::AsyncPgConnection, ConnectError> {
        diesel_async::AsyncPgConnection::try_from_client_and_connection(self.client, self.connection)
            .await
            .map_err(|e| ConnectError::invalid("connection setup", e.to_string()))
    }
}

/// Drives a connection until it closes, logging how it ended.
pub fn spawn_connection(connection: PgConnection) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            tracing::debug!(%error, "database connection ended");
        }
    })
}

fn driver_config(info: &ConnInfo) -> Result<tokio_postgres::Config, ConnectError> {
    let mut driver = if info.passed_on.trim().is_empty() {
        tokio_postgres::Config::new()
    } else {
        tokio_postgres::Config::from_str(&info.passed_on).map_err(|e| ConnectError::invalid("url", e.to_string()))?
    };
    for (key, value) in &info.from_environment {
        apply_environment(&mut driver, key, value)?;
    }
    if driver.get_hosts().is_empty() && !driver.get_hostaddrs().is_empty() {
        // Only addresses: libpq checks a certificate against the address, so
        // it is the name TLS is given too.
        for addr in driver.get_hostaddrs().to_vec() {
            driver.host(addr.to_string());
        }
    }
    if driver.get_hosts().is_empty() {
        // libpq's default: the local socket directory, else localhost.
        #[cfg(unix)]
        if std::path::Path::new("/var/run/postgresql").is_dir() {
            driver.host_path("/var/run/postgresql");
        }
        if driver.get_hosts().is_empty() {
            driver.host("localhost");
        }
    }
    if driver.get_user().is_none() {
        let user = os_user().ok_or_else(|| ConnectError::invalid("user", "no user given and no $USER"))?;
        driver.user(&user);
    }
    if !info.has("keepalives") {
        driver.keepalives(true);
    }
    if !info.has("keepalives_idle") {
        driver.keepalives_idle(DEFAULT_KEEPALIVES_IDLE);
    }
    if !info.has("keepalives_interval") {
        driver.keepalives_interval(DEFAULT_KEEPALIVES_INTERVAL);
    }
    if !info.has("keepalives_retries") {
        driver.keepalives_retries(DEFAULT_KEEPALIVES_RETRIES);
    }
    if !info.has("tcp_user_timeout") {
        driver.tcp_user_timeout(DEFAULT_TCP_USER_TIMEOUT);
    }
    if !info.has("connect_timeout") {
        driver.connect_timeout(DEFAULT_CONNECT_TIMEOUT);
    }
    Ok(driver)
}

/// Sets a parameter that came from a `PG*` variable by reparsing it
/// alone, so tokio-postgres validates it as it would in a string.
fn apply_environment(driver: &mut tokio_postgres::Config, key: &str, value: &str) -> Result<(), ConnectError> {
    let invalid = |reason: String| ConnectError::invalid(key, reason);
    match key {
        "host" => {
            for host in value.split(',') {
                if host.starts_with('/') {
                    driver.host_path(host);
                } else {
                    driver.host(host);
                }
            }
        }
        "hostaddr" => {
            for addr in value.split(',') {
                driver.hostaddr(addr.parse().map_err(|_| invalid(format!("{addr:?} is not an IP address")))?);
            }
        }
        "port" => {
            for port in value.split(',') {
                driver.port(port.parse().map_err(|_| invalid(format!("{port:?} is not a port")))?);
            }
        }
        "dbname" => {
            driver.dbname(value);
        }
        "user" => {
            driver.user(value);
        }
        "password" => {
            driver.password(value);
        }
        "application_name" => {
            driver.application_name(value);
        }
        "options" => {
            driver.options(value);
        }
        "connect_timeout" => {
            let seconds: u64 = value.parse().map_err(|_| invalid(format!("{value:?} is not seconds")))?;
            driver.connect_timeout(Duration::from_secs(seconds));
        }
        "target_session_attrs" => {
            let parsed = tokio_postgres::Config::from_str(&format!(
                "target_session_attrs={}",
                conninfo::libpq_session_attrs(value)?
            ))
            .map_err(|e| invalid(e.to_string()))?;
            driver.target_session_attrs(parsed.get_target_session_attrs());
        }
        "sslnegotiation" => {
            let parsed = tokio_postgres::Config::from_str(&format!("sslnegotiation={value}"))
                .map_err(|e| invalid(e.to_string()))?;
            driver.ssl_negotiation(parsed.get_ssl_negotiation());
        }
        // The TLS variables are read with the string's TLS parameters.
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn none(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn defaults_bound_a_silent_network() {
        let config = ConnectConfig::from_url_with_environment("postgres://u@h/db", &none).expect("parses");
        let driver = config.driver();
        assert!(driver.get_keepalives());
        assert_eq!(driver.get_keepalives_idle(), DEFAULT_KEEPALIVES_IDLE);
        assert_eq!(driver.get_tcp_user_timeout(), Some(&DEFAULT_TCP_USER_TIMEOUT));
        assert_eq!(config.connect_timeout(), DEFAULT_CONNECT_TIMEOUT);
        assert_eq!(config.ssl_mode(), SslMode::Prefer);
    }

    #[test]
    fn the_string_overrides_the_defaults() {
        let config = ConnectConfig::from_url_with_environment(
            "postgres://u@h/db?keepalives_idle=100&tcp_user_timeout=0&connect_timeout=3&sslmode=require",
            &none,
        )
        .expect("parses");
        assert_eq!(config.driver().get_keepalives_idle(), Duration::from_secs(100));
        assert_eq!(config.connect_timeout(), Duration::from_secs(3));
        assert_eq!(config.ssl_mode(), SslMode::Require);
    }

    #[test]
    fn the_environment_fills_host_user_and_tls() {
        let env = |name: &str| match name {
            "PGHOST" => Some("a.example,b.example".to_owned()),
            "PGPORT" => Some("5433,5434".to_owned()),
            "PGUSER" => Some("svc".to_owned()),
            "PGPASSWORD" => Some("hunter2".to_owned()),
            "PGSSLMODE" => Some("require".to_owned()),
            _ => None,
        };
        let config = ConnectConfig::from_url_with_environment("dbname=app", &env).expect("parses");
        assert_eq!(config.driver().get_hosts().len(), 2);
        assert_eq!(config.driver().get_ports(), &[5433, 5434]);
        assert_eq!(config.user(), Some("svc"));
        assert_eq!(config.ssl_mode(), SslMode::Require);
        assert_eq!(config.connect_bound(), DEFAULT_CONNECT_TIMEOUT * 2);
        assert!(!format!("{config:?}").contains("hunter2"));
    }

    #[test]
    fn verify_modes_need_roots_and_system_roots_need_verify_full() {
        let missing = ConnectConfig::from_url_with_environment("postgres://u@h/db?sslmode=verify-full", &|name| {
            (name == "HOME").then(|| "/nonexistent".to_owned())
        });
        assert!(matches!(missing, Err(ConnectError::TlsFile { parameter: "sslrootcert", .. })), "{missing:?}");
        let weak =
            ConnectConfig::from_url_with_environment("postgres://u@h/db?sslmode=require&sslrootcert=system", &none);
        assert!(matches!(weak, Err(ConnectError::InvalidUrl { ref parameter, .. }) if parameter == "sslmode"));
        let bad = ConnectConfig::from_url_with_environment("postgres://u@h/db?sslmode=sometimes", &none);
        assert!(matches!(bad, Err(ConnectError::InvalidUrl { ref parameter, .. }) if parameter == "sslmode"));
    }

    #[test]
    fn addresses_alone_are_the_names_tls_checks() {
        let config = ConnectConfig::from_url_with_environment("hostaddr=127.0.0.1 user=u sslmode=require", &none)
            .expect("parses");
        assert!(matches!(config.driver().get_hosts(), [Host::Tcp(host)] if host == "127.0.0.1"));
    }

    #[test]
    fn server_settings_escape_spaces_and_keep_the_users_options() {
        let config = ConnectConfig::from_url_with_environment("postgres://u@h/db?options=-c%20geqo%3Doff", &none)
            .expect("parses")
            .with_server_settings(vec![("statement_timeout".into(), "25000".into()), ("x.y".into(), "a b".into())]);
        assert_eq!(config.options_with_settings(), r"-c geqo=off -c statement_timeout=25000 -c x.y=a\ b");
    }
}
