//! The live change feed: [`PgSessionStore::watch`] follows one session's new
//! events in `seq` order, [`PgSessionStore::watch_app`] an app's new
//! sessions and events (migration `change_feed`).
//!
//! The rule that makes a session's feed exact: **LISTEN first, then read
//! from the table; on every notice, read from the table everything after the
//! last seq read; after a lost connection, LISTEN again and read again.**
//! A notice carries ids and a seq only and is never trusted for more than
//! "read again": notices are lost while the listener is reconnecting, and
//! PostgreSQL lets any role send one. The table is the truth, read through
//! `adk_read_events_after`, which checks the tenant like every store
//! function. So a feed delivers each seq exactly once, strictly increasing,
//! without gaps, however often its connection drops.
//!
//! Each feed has one connection of its own, opened with the pool's settings
//! but outside it (`bb8::Pool::dedicated_connection`): a connection that
//! LISTENs cannot go back to a pool, and a feed waits far longer than any
//! operation. Its reads run on that same connection, so a feed never takes a
//! pooled connection from the writers it is watching, idle or not.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use adk_postgres_domain::{AppName, Event, SessionId, SessionKey, StoreError, UserId};
use chrono::{DateTime, Utc};
use diesel_async::{AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use futures_util::future::FutureExt;
use futures_util::stream::{BoxStream, Stream, StreamExt};
use tokio::time::Instant;

use crate::error::from_diesel;
use crate::functions::{self as sql, BlobRow, FeedListenRow, FeedRow};
use crate::store::PgSessionStore;
use crate::store::media;

/// Events per read. A feed far behind catches up page by page, one page per
/// round trip, and hands each page out before it reads the next, so a slow
/// consumer holds at most one page in memory.
const PAGE: i32 = 256;

/// The first pause after the listener could not reconnect; it doubles up to
/// [`MAX_PAUSE`], with jitter so that the watchers of one server do not all
/// come back in the same millisecond after a restart.
const FIRST_PAUSE: Duration = Duration::from_millis(50);
const MAX_PAUSE: Duration = Duration::from_secs(5);

/// How long a feed keeps trying to get its connection back before it ends
/// with `Unavailable`. A caller resumes with `watch(key, last seq it got)`,
/// which loses nothing either.
const PATIENCE: Duration = Duration::from_secs(60);

/// An idle feed looks at its connection this often. A connection whose
/// server or network vanished without a word (no FIN, no RST) would
/// otherwise wait for TCP keepalive, which is hours by default.
const HEARTBEAT: Duration = Duration::from_secs(30);

/// Longest a feed waits for the answer to one of its statements. A server
/// answers within its `statement_timeout`; past this the connection is taken
/// for dead. Dropping a statement in flight is safe here, unlike on a pooled
/// connection: this connection is the feed's alone and is closed with it.
const ANSWER_PATIENCE: Duration = Duration::from_secs(60);

/// After an expiry check that found the session still alive (the server's
/// clock is behind ours), the next check waits at least this long.
const EXPIRY_RECHECK: Duration = Duration::from_secs(1);

/// A session's new events, in `seq` order: `(seq, event)` for each seq after
/// the `from_seq` it was opened with, exactly once, strictly increasing and
/// without gaps, also across lost and re-established connections. An event
/// redacted before the feed read it arrives as its tombstone; one redacted
/// after is not sent again ([`AppNotice::EventRedacted`] says which).
///
/// The stream ends with an error when the session can no longer be followed,
/// after every event before that point was delivered:
///
/// * `NotFound`: the session was deleted or expired (or replaced by a new
///   session with the same key).
/// * `SessionClosed`: it was rolled over; its last event was delivered and
///   the error names the successor, which can be watched from 0.
/// * `StaleSession { expected, actual }`: it was rewound below `expected`,
///   the seq this feed last read, so the seqs it delivered now name other
///   events (or none). Re-read the session.
/// * `Unavailable`: the database could not be reached for a minute. Resume
///   with `watch(key, last seq received)`.
/// * `PermissionDenied` and `Database` for what no retry fixes.
///
/// Dropping the feed closes its connection.
pub struct EventFeed {
    key: SessionKey,
    listener_pid: Arc<AtomicI32>,
    inner: BoxStream<'static, Result<(u64, Event), StoreError>>,
}

impl EventFeed {
    /// The session this feed follows.
    pub fn key(&self) -> &SessionKey {
        &self.key
    }

    /// The server process of the feed's listening connection, as
    /// `pg_stat_activity` shows it; `None` while it is reconnecting.
    pub fn listener_pid(&self) -> Option<i32> {
        listener_pid(&self.listener_pid)
    }

    /// The next item, as `StreamExt::next` gives it, for a caller that does
    /// not use the futures crates. Cancel-safe: dropping the future loses
    /// nothing.
    pub async fn recv(&mut self) -> Option<Result<(u64, Event), StoreError>> {
        self.inner.next().await
    }
}

impl std::fmt::Debug for EventFeed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventFeed").field("key", &self.key).field("listener_pid", &self.listener_pid()).finish()
    }
}

impl Stream for EventFeed {
    type Item = Result<(u64, Event), StoreError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.poll_next_unpin(cx)
    }
}

/// Something that happened in an app, as [`PgSessionStore::watch_app`]
/// reports it: ids only. A notice is a hint, not a proof: PostgreSQL lets any
/// role that may connect send one on any channel, so read what a notice
/// names (get, or watch) before acting on it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AppNotice {
    /// A session was created (by create, or as a rollover's successor).
    SessionCreated {
        /// The session.
        key: SessionKey,
    },
    /// An event was stored with this seq.
    EventAppended {
        /// The session.
        key: SessionKey,
        /// The event's sequence number.
        seq: u64,
    },
    /// A session was closed by a rollover.
    SessionClosed {
        /// The session.
        key: SessionKey,
    },
    /// A session was rewound to `seq` events.
    SessionRewound {
        /// The session.
        key: SessionKey,
        /// The events it kept; later seqs no longer exist.
        seq: u64,
    },
    /// The event at `seq` was redacted (`redact_event`): what was read of
    /// it before is no longer what the store holds; read it again.
    EventRedacted {
        /// The session.
        key: SessionKey,
        /// The redacted event's sequence number.
        seq: u64,
    },
    /// A session was deleted (by delete, expiry or retention).
    SessionDeleted {
        /// The session.
        key: SessionKey,
    },
    /// The feed's connection was lost and is listening again: notices sent
    /// in between were lost. Re-read whatever you follow.
    Reconnected,
}

/// An app's notices ([`AppNotice`]), in the order the changes committed.
/// Notices are not replayed after a lost connection: the feed says
/// [`AppNotice::Reconnected`] instead. It ends only with an error
/// (`Unavailable` after a minute without a connection, `PermissionDenied`
/// when the role was unbound, `Database` when the feed was turned off).
/// Dropping it closes its connection.
pub struct AppFeed {
    app: AppName,
    listener_pid: Arc<AtomicI32>,
    inner: BoxStream<'static, Result<AppNotice, StoreError>>,
}

impl AppFeed {
    /// The app this feed follows.
    pub fn app(&self) -> &AppName {
        &self.app
    }

    /// As [`EventFeed::listener_pid`].
    pub fn listener_pid(&self) -> Option<i32> {
        listener_pid(&self.listener_pid)
    }

    /// As [`EventFeed::recv`].
    pub async fn recv(&mut self) -> Option<Result<AppNotice, StoreError>> {
        self.inner.next().await
    }
}

impl std::fmt::Debug for AppFeed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppFeed").field("app", &self.app).field("listener_pid", &self.listener_pid()).finish()
    }
}

impl Stream for AppFeed {
    type Item = Result<AppNotice, StoreError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.poll_next_unpin(cx)
    }
}

fn listener_pid(pid: &AtomicI32) -> Option<i32> {
    Some(pid.load(Ordering::Relaxed)).filter(|pid| *pid != 0)
}

impl PgSessionStore {
    /// Follows `key`'s events after `from_seq`: the version the caller
    /// already has (0 for all of them), so the first item is `from_seq + 1`
    /// and a caller resumes a feed with the last seq it received. Events
    /// already stored come first, then each new one as it commits.
    ///
    /// Fails at once, rather than in the stream, when the session is
    /// missing, expired or not the tenant's (`NotFound`), when the role may
    /// not act for the app (`PermissionDenied`), when `from_seq` is past the
    /// session's version (`StaleSession`) or out of range (`InvalidInput`),
    /// when the owner turned the change feed off (`Database`) or when the
    /// database cannot be reached (`Unavailable`). See [`EventFeed`] for
    /// how the stream ends.
    pub async fn watch(&self, key: &SessionKey, from_seq: u64) -> Result<EventFeed, StoreError> {
        let after = i64::try_from(from_seq).map_err(|_| {
            StoreError::invalid("from_seq", format!("{from_seq} is past the largest seq, {}", i64::MAX))
        })?;
        let pid = Arc::new(AtomicI32::new(0));
        let mut watch = SessionWatch::new(self.clone(), key.clone(), after, pid.clone());
        watch.start().await?;
        let inner =
            futures_util::stream::unfold(
                watch,
                |mut watch| async move { watch.next().await.map(|item| (item, watch)) },
            )
            .boxed();
        Ok(EventFeed { key: key.clone(), listener_pid: pid, inner })
    }

    /// Follows `app`'s new sessions and events as notices ([`AppNotice`]):
    /// ids only, as hints, with no catch-up. Fails at once when the role may
    /// not act for the app (`PermissionDenied`), when the change feed is
    /// off (`Database`) or when the database cannot be reached
    /// (`Unavailable`).
    pub async fn watch_app(&self, app: &AppName) -> Result<AppFeed, StoreError> {
        let pid = Arc::new(AtomicI32::new(0));
        let listener = Listener::open(self, app, &pid).await?;
        let watch = AppWatch {
            store: self.clone(),
            app: app.clone(),
            listener: Some(listener),
            pid: pid.clone(),
            queued: VecDeque::new(),
            backoff: Backoff::default(),
            done: false,
        };
        let inner =
            futures_util::stream::unfold(
                watch,
                |mut watch| async move { watch.next().await.map(|item| (item, watch)) },
            )
            .boxed();
        Ok(AppFeed { app: app.clone(), listener_pid: pid, inner })
    }
}

/// A notice as the triggers send it: `[kind, user_id, session_id, seq]`.
#[derive(Debug, PartialEq, Eq)]
struct Notice {
    kind: char,
    user_id: String,
    session_id: String,
    seq: i64,
}

impl Notice {
    /// `None` for anything else: anyone may NOTIFY on the channel, so a
    /// payload that is not ours is skipped (and logged), never an error
    /// that would let any role end everyone's feeds.
    fn parse(payload: &str) -> Option<Self> {
        let parsed = serde_json::from_str::<(String, String, String, i64)>(payload).ok().and_then(
            |(kind, user_id, session_id, seq)| {
                let mut chars = kind.chars();
                match (chars.next(), chars.next()) {
                    (Some(kind @ ('e' | 'c' | 'x' | 'r' | 'd' | 't')), None) => {
                        Some(Self { kind, user_id, session_id, seq })
                    }
                    _ => None,
                }
            },
        );
        if parsed.is_none() {
            tracing::debug!(len = payload.len(), "skipping a change notice that is not the store's");
        }
        parsed
    }
}

/// Pauses between attempts to get a connection back, and gives up after
/// [`PATIENCE`] of failing without a success in between.
#[derive(Debug)]
struct Backoff {
    pause: Duration,
    failing_since: Option<Instant>,
}

impl Default for Backoff {
    fn default() -> Self {
        Self { pause: FIRST_PAUSE, failing_since: None }
    }
}

impl Backoff {
    fn succeeded(&mut self) {
        *self = Self::default();
    }

    /// Waits before the next attempt after `error`, or gives `error` back
    /// (as `Unavailable`) when the feed has been failing for too long.
    async fn pause(&mut self, error: StoreError) -> Result<(), StoreError> {
        let since = *self.failing_since.get_or_insert_with(Instant::now);
        if since.elapsed() >= PATIENCE {
            return Err(StoreError::Unavailable {
                message: format!("the change feed has had no connection for {:?}: {error}", since.elapsed()),
            });
        }
        tracing::debug!(%error, pause = ?self.pause, "change feed reconnecting");
        let jitter = Duration::from_micros(u64::from(uuid::Uuid::new_v4().as_u128() as u16) % 50_000);
        tokio::time::sleep(self.pause + jitter).await;
        self.pause = (self.pause * 2).min(MAX_PAUSE);
        Ok(())
    }
}

/// What woke a listener up.
enum Wake {
    /// These payloads arrived (all that were waiting, so one read serves
    /// them all).
    Notices(Vec<String>),
    /// The deadline passed with nothing received.
    Deadline,
    /// The connection is gone.
    Lost(StoreError),
}

/// A feed's own connection, listening on one app's channel.
struct Listener {
    conn: AsyncPgConnection,
}

impl Listener {
    /// Opens a connection with the pool's settings, outside the pool, and
    /// listens on `app`'s channel after the tenant check. `pid` learns the
    /// connection's server process.
    async fn open(store: &PgSessionStore, app: &AppName, pid: &AtomicI32) -> Result<Self, StoreError> {
        pid.store(0, Ordering::Relaxed);
        let mut conn = feed_connection(store).await?;
        let listen =
            sql::FeedListen { tenant: store.tenant_for(app), app_name: app.as_str() }.load::<FeedListenRow>(&mut conn);
        let rows = answered(listen).await?.map_err(feed_error)?;
        let row = rows
            .into_iter()
            .next()
            .ok_or_else(|| StoreError::Database { message: "adk_feed_listen returned no row".into() })?;
        pid.store(row.backend_pid.unwrap_or_default(), Ordering::Relaxed);
        tracing::debug!(app = %app, channel = ?row.channel, pid = ?row.backend_pid, "change feed listening");
        Ok(Self { conn })
    }

    /// Waits for notices until `deadline`.
    async fn wait(&mut self, deadline: Instant) -> Wake {
        let mut notices = std::pin::pin!(self.conn.notifications_stream());
        let first = match tokio::time::timeout_at(deadline, notices.next()).await {
            Err(_elapsed) => return Wake::Deadline,
            Ok(first) => first,
        };
        let mut payloads = match first {
            Some(Ok(notice)) => vec![notice.payload],
            Some(Err(e)) => return Wake::Lost(from_diesel(e, "from_seq")),
            None => {
                return Wake::Lost(StoreError::Unavailable { message: "the change feed's connection closed".into() });
            }
        };
        // Take whatever else is already here: one read answers them all.
        // An error here shows again (as the stream's end) on the next wait.
        while let Some(Some(Ok(notice))) = notices.next().now_or_never() {
            payloads.push(notice.payload);
        }
        Wake::Notices(payloads)
    }

    /// Asks the server for a sign of life.
    async fn ping(&mut self) -> Result<(), StoreError> {
        answered(self.conn.batch_execute("SELECT 1")).await?.map_err(feed_error)
    }
}

/// The feed's own session: from `change_feed_url` when set, else with the
/// pool's settings, and refused at once when a pooler lends it (LISTEN on a
/// pooled server connection would hear nothing, or another client's
/// notifications, and the feed would hang instead of failing).
async fn feed_connection(store: &PgSessionStore) -> Result<AsyncPgConnection, StoreError> {
    let (config, field) = match &store.change_feed {
        Some(config) => (config.as_ref().clone(), "change_feed_url"),
        None => (store.pool().connect_config().clone(), "database_url"),
    };
    let through_pooler = || {
        StoreError::invalid(
            field,
            format!(
                "the change feed needs a session of its own, and {} goes through a connection pooler (PgBouncer \
                 or the like); give the feed a direct URL to the server with change_feed_url",
                config.redacted()
            ),
        )
    };
    let connected = answered(config.connect_direct()).await?.map_err(|e| match e {
        adk_postgres_connect::ConnectError::ThroughPooler { .. } => through_pooler(),
        other => StoreError::Unavailable { message: format!("could not open the change feed's connection: {other}") },
    })?;
    let conn = answered(connected.into_diesel()).await?.map_err(|e| StoreError::Unavailable {
        message: format!("could not set up the change feed's connection: {e}"),
    })?;
    Ok(conn)
}

/// `query`'s result, or `Unavailable` when no answer came within
/// [`ANSWER_PATIENCE`].
async fn answered<T>(query: impl Future<Output = T>) -> Result<T, StoreError> {
    tokio::time::timeout(ANSWER_PATIENCE, query).await.map_err(|_| StoreError::Unavailable {
        message: format!("the change feed's connection gave no answer within {ANSWER_PATIENCE:?}"),
    })
}

/// A failed statement of the feed as a store error, with the server's hint
/// kept where it says what to do (the feed being turned off).
fn feed_error(error: diesel::result::Error) -> StoreError {
    let hint = match &error {
        diesel::result::Error::DatabaseError(_, info) => info.hint().map(str::to_owned),
        _ => None,
    };
    match (from_diesel(error, "from_seq"), hint) {
        (StoreError::Database { message }, Some(hint)) => {
            StoreError::Database { message: format!("{message} ({hint})") }
        }
        (other, _) => other,
    }
}

fn corrupt(what: &str) -> StoreError {
    StoreError::Database { message: format!("adk_read_events_after returned {what}") }
}

/// The state of one session's feed.
struct SessionWatch {
    store: PgSessionStore,
    key: SessionKey,
    pid: Arc<AtomicI32>,
    listener: Option<Listener>,
    /// The last seq read from the table (delivered or queued) and its
    /// event's id, once known: the next read starts after it and checks it
    /// is still the same event.
    read_upto: i64,
    read_upto_id: Option<String>,
    /// When the followed session was created: a session created later with
    /// the same key (after a delete) is another session.
    born: Option<DateTime<Utc>>,
    /// When the session expires, if it does; checked by a read then.
    expiry_check: Option<Instant>,
    /// The last wake-up was for the expiry check.
    checking_expiry: bool,
    /// Events read and not delivered yet.
    queued: VecDeque<(u64, Event)>,
    /// A read is due: a notice came, the connection is new, or a page
    /// limit left events behind.
    read_due: bool,
    /// How the feed ends, once `queued` is delivered.
    ending: Option<StoreError>,
    done: bool,
    /// When the feed last heard from its connection.
    last_heard: Instant,
    backoff: Backoff,
}

impl SessionWatch {
    fn new(store: PgSessionStore, key: SessionKey, after: i64, pid: Arc<AtomicI32>) -> Self {
        Self {
            store,
            key,
            pid,
            listener: None,
            read_upto: after,
            read_upto_id: None,
            born: None,
            expiry_check: None,
            checking_expiry: false,
            queued: VecDeque::new(),
            read_due: true,
            ending: None,
            done: false,
            last_heard: Instant::now(),
            backoff: Backoff::default(),
        }
    }

    /// LISTEN, then the first read: what fails here fails `watch` itself,
    /// and so does a session that cannot be followed from `from_seq` (gone,
    /// or not that far along). A closed session is followed to its end: its
    /// remaining events, then `SessionClosed`.
    async fn start(&mut self) -> Result<(), StoreError> {
        self.listener = Some(Listener::open(&self.store, &self.key.app_name, &self.pid).await?);
        self.read().await?;
        match self.ending.take() {
            Some(refused @ (StoreError::NotFound(_) | StoreError::StaleSession { .. })) => Err(refused),
            other => {
                self.ending = other;
                Ok(())
            }
        }
    }

    async fn next(&mut self) -> Option<Result<(u64, Event), StoreError>> {
        loop {
            if let Some(item) = self.queued.pop_front() {
                return Some(Ok(item));
            }
            if self.done {
                return None;
            }
            if let Some(end) = self.ending.take() {
                self.done = true;
                return Some(Err(end));
            }
            if let Err(end) = self.step().await {
                self.done = true;
                return Some(Err(end));
            }
        }
    }

    /// One step towards the next item: reconnect, read, or wait for a notice.
    async fn step(&mut self) -> Result<(), StoreError> {
        if self.listener.is_none() {
            match Listener::open(&self.store, &self.key.app_name, &self.pid).await {
                Ok(listener) => {
                    // Whatever was sent while we were away is in the table.
                    self.listener = Some(listener);
                    self.read_due = true;
                }
                Err(e) if e.is_retryable() => self.backoff.pause(e).await?,
                Err(e) => return Err(e),
            }
            return Ok(());
        }
        if self.read_due {
            match self.read().await {
                Ok(()) => self.backoff.succeeded(),
                Err(e) if e.is_retryable() => {
                    self.lose_listener(&e);
                    self.backoff.pause(e).await?;
                }
                Err(e) => return Err(e),
            }
            return Ok(());
        }
        let heartbeat = self.last_heard + HEARTBEAT;
        let deadline = self.expiry_check.map_or(heartbeat, |expiry| expiry.min(heartbeat));
        let Some(listener) = self.listener.as_mut() else { return Ok(()) };
        match listener.wait(deadline).await {
            Wake::Notices(payloads) => {
                self.last_heard = Instant::now();
                self.read_due = payloads.iter().filter_map(|p| Notice::parse(p)).any(|n| self.concerns(&n));
            }
            Wake::Deadline => {
                // Expiry, or a heartbeat: a read is also the cheapest sign
                // of life, and a catch-up for free.
                self.checking_expiry = self.expiry_check.is_some_and(|at| at <= Instant::now());
                self.read_due = true;
            }
            Wake::Lost(e) => self.lose_listener(&e),
        }
        Ok(())
    }

    fn lose_listener(&mut self, error: &StoreError) {
        tracing::debug!(key = %self.key, %error, "change feed lost its connection");
        self.listener = None;
        self.pid.store(0, Ordering::Relaxed);
    }

    /// Whether `notice` may mean something new for this feed. An event at
    /// or below what was read is old news (a rewind that could reuse its
    /// seq sends its own notice first), and so is the redaction of one: a
    /// feed delivers each seq once, and reads an event redacted before it
    /// got to it as the tombstone.
    fn concerns(&self, notice: &Notice) -> bool {
        notice.user_id == self.key.user_id.as_str()
            && notice.session_id == self.key.session_id.as_str()
            && (!matches!(notice.kind, 'e' | 't') || notice.seq > self.read_upto)
    }

    /// Reads a page after `read_upto` into `queued`, or decides how the feed
    /// ends.
    async fn read(&mut self) -> Result<(), StoreError> {
        let Some(listener) = self.listener.as_mut() else { return Ok(()) };
        let read = sql::ReadEventsAfter { key: self.store.key_args(&self.key), after_seq: self.read_upto, limit: PAGE }
            .load::<FeedRow>(&mut listener.conn);
        let rows = answered(read).await?.map_err(feed_error)?;
        self.last_heard = Instant::now();
        let mut rows = rows.into_iter();
        let Some(header) = rows.next() else {
            self.end(StoreError::NotFound(self.key.clone()));
            return Ok(());
        };
        let last_seq = header.last_seq.ok_or_else(|| corrupt("a header without last_seq"))?;
        let born = header.created_at.ok_or_else(|| corrupt("a header without created_at"))?;
        if *self.born.get_or_insert(born) != born {
            // Deleted and created again under the same key: not ours.
            self.end(StoreError::NotFound(self.key.clone()));
            return Ok(());
        }
        if last_seq < self.read_upto {
            self.end(self.rewound(last_seq));
            return Ok(());
        }
        let mut rows = rows.peekable();
        if self.read_upto > 0 {
            // The event this feed read last, by id: another id (or none)
            // means the session was rewound under the feed and its seqs
            // were reused.
            let same = match rows.next_if(|row| row.seq == Some(self.read_upto) && row.payload.is_none()) {
                Some(boundary) => match (&self.read_upto_id, boundary.event_id) {
                    (Some(known), Some(id)) => *known == id,
                    (None, id) => {
                        self.read_upto_id = id;
                        true
                    }
                    (Some(_), None) => false,
                },
                None => false,
            };
            if !same {
                self.end(self.rewound(last_seq));
                return Ok(());
            }
        }
        let mut read = Vec::new();
        let mut read_upto = (self.read_upto, self.read_upto_id.clone());
        for row in rows {
            let seq = row.seq.ok_or_else(|| corrupt("an event without seq"))?;
            if seq != read_upto.0 + 1 {
                // One snapshot of a gapless log: never expected.
                return Err(corrupt(&format!("seq {seq} after {}", read_upto.0)));
            }
            read.push(row.payload.ok_or_else(|| corrupt("an event without payload"))?.0);
            read_upto = (seq, row.event_id);
        }
        let wanted = media::references(&read);
        if !wanted.is_empty() {
            let blobs = sql::GetBlobs { key: self.store.key_args(&self.key), sha256: &wanted }
                .load::<BlobRow>(&mut listener.conn);
            let blobs = answered(blobs).await?.map_err(feed_error)?;
            if media::put_back(&mut read, blobs).is_err() {
                // The session changed since the events were read: the next
                // read finds out how (rewound, deleted), from where this
                // one started.
                self.read_due = true;
                return Ok(());
            }
        }
        let first = self.read_upto + 1;
        for (seq, event) in (first..).zip(read) {
            self.queued.push_back((version(seq), event));
        }
        (self.read_upto, self.read_upto_id) = read_upto;
        self.read_due = self.read_upto < last_seq;
        if !self.read_due && header.closed_at.is_some() {
            let successor = header
                .successor_id
                .map(SessionId::new)
                .transpose()
                .map_err(|e| corrupt(&format!("a corrupt successor id: {e}")))?;
            self.end(StoreError::SessionClosed { key: self.key.clone(), successor });
            return Ok(());
        }
        // Only an expiry before the next heartbeat needs a timer of its own:
        // the heartbeat's read sets it again (and a far-off expiry would
        // overflow an Instant).
        self.expiry_check = header.expires_at.and_then(|at| (at - Utc::now()).to_std().ok()).map_or(
            // Past already by our clock, not yet by the server's.
            header.expires_at.map(|_| Instant::now()),
            |wait| (wait < HEARTBEAT).then_some(Instant::now() + wait),
        );
        if let Some(at) = &mut self.expiry_check {
            // A little after it, so that the server's now() has passed it
            // too; later still when a check at its time found it alive.
            *at += if self.checking_expiry { EXPIRY_RECHECK } else { Duration::from_millis(20) };
        }
        self.checking_expiry = false;
        Ok(())
    }

    fn rewound(&self, last_seq: i64) -> StoreError {
        StoreError::StaleSession { key: self.key.clone(), expected: version(self.read_upto), actual: version(last_seq) }
    }

    fn end(&mut self, error: StoreError) {
        self.ending = Some(error);
        self.read_due = false;
    }
}

fn version(seq: i64) -> u64 {
    u64::try_from(seq).unwrap_or_default()
}

/// The state of one app's feed.
struct AppWatch {
    store: PgSessionStore,
    app: AppName,
    pid: Arc<AtomicI32>,
    listener: Option<Listener>,
    queued: VecDeque<AppNotice>,
    backoff: Backoff,
    done: bool,
}

impl AppWatch {
    async fn next(&mut self) -> Option<Result<AppNotice, StoreError>> {
        loop {
            if let Some(notice) = self.queued.pop_front() {
                return Some(Ok(notice));
            }
            if self.done {
                return None;
            }
            if let Err(end) = self.step().await {
                self.done = true;
                return Some(Err(end));
            }
        }
    }

    async fn step(&mut self) -> Result<(), StoreError> {
        let Some(listener) = self.listener.as_mut() else {
            match Listener::open(&self.store, &self.app, &self.pid).await {
                Ok(listener) => {
                    self.listener = Some(listener);
                    self.backoff.succeeded();
                    self.queued.push_back(AppNotice::Reconnected);
                }
                Err(e) if e.is_retryable() => self.backoff.pause(e).await?,
                Err(e) => return Err(e),
            }
            return Ok(());
        };
        let lost = match listener.wait(Instant::now() + HEARTBEAT).await {
            Wake::Notices(payloads) => {
                let notices: Vec<_> =
                    payloads.iter().filter_map(|p| Notice::parse(p)).filter_map(|n| self.notice(n)).collect();
                self.queued.extend(notices);
                return Ok(());
            }
            Wake::Deadline => match listener.ping().await {
                Ok(()) => return Ok(()),
                Err(e) => e,
            },
            Wake::Lost(e) => e,
        };
        tracing::debug!(app = %self.app, error = %lost, "app change feed lost its connection");
        self.listener = None;
        self.pid.store(0, Ordering::Relaxed);
        Ok(())
    }

    /// The notice for `notice`, or `None` (logged) when its ids are not
    /// valid ones: not sent by the store.
    fn notice(&self, notice: Notice) -> Option<AppNotice> {
        let key = match (UserId::new(notice.user_id), SessionId::new(notice.session_id)) {
            (Ok(user_id), Ok(session_id)) => SessionKey::new(self.app.clone(), user_id, session_id),
            _ => {
                tracing::debug!(app = %self.app, "skipping a change notice with invalid ids");
                return None;
            }
        };
        let seq = version(notice.seq);
        Some(match notice.kind {
            'e' => AppNotice::EventAppended { key, seq },
            'c' => AppNotice::SessionCreated { key },
            'x' => AppNotice::SessionClosed { key },
            'r' => AppNotice::SessionRewound { key, seq },
            't' => AppNotice::EventRedacted { key, seq },
            _ => AppNotice::SessionDeleted { key },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_triggers_payloads_and_nothing_else() {
        assert_eq!(
            Notice::parse(r#"["e", "u1", "s \"1\"", 7]"#),
            Some(Notice { kind: 'e', user_id: "u1".into(), session_id: "s \"1\"".into(), seq: 7 })
        );
        assert_eq!(Notice::parse(r#"["d", "u", "s", 0]"#).map(|n| n.kind), Some('d'));
        for forged in
            ["", "hello", r#"["q", "u", "s", 1]"#, r#"["ee", "u", "s", 1]"#, r#"["e", "u", "s"]"#, r#"{"k":"e"}"#]
        {
            assert_eq!(Notice::parse(forged), None, "{forged}");
        }
    }
}

/// Whether the change feed's triggers are in place, and the owner's switch.
/// Migrations leave the feed off: every notifying commit takes one
/// cluster-wide lock through its WAL flush, which halved appends/s under
/// eight writers, and a store nobody watches must not pay for that.
impl PgSessionStore {
    /// Turns the change feed on or off (creates or drops its triggers; DDL
    /// on the event log under `lock_timeout` 5 s). Only the tables' owner
    /// may. Returns whether anything changed.
    pub async fn set_change_feed(&self, enabled: bool) -> Result<bool, StoreError> {
        let query =
            diesel::sql_query("SELECT adk_set_change_feed($1) AS answer").bind::<diesel::sql_types::Bool, _>(enabled);
        self.feed_switch(query, "adk_set_change_feed").await
    }

    /// Whether the change feed is on (all of its triggers are in place).
    pub async fn change_feed_enabled(&self) -> Result<bool, StoreError> {
        self.feed_switch(diesel::sql_query("SELECT adk_change_feed_enabled() AS answer"), "adk_change_feed_enabled")
            .await
    }

    async fn feed_switch<Q>(&self, query: Q, function: &str) -> Result<bool, StoreError>
    where
        Q: diesel::query_builder::QueryFragment<diesel::pg::Pg>,
    {
        let mut conn = self.pool.get().await.map_err(crate::error::from_pool)?;
        let rows = crate::conn::Load::load::<FeedSwitchRow>(query, &mut conn)
            .await
            .map_err(|e| from_diesel(e, "change feed"))?;
        crate::store::only_row(rows, function).map(|row| row.answer)
    }
}

#[derive(diesel::QueryableByName)]
struct FeedSwitchRow {
    #[diesel(sql_type = diesel::sql_types::Bool)]
    answer: bool,
}
