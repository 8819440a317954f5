//! One PostgreSQL wire proxy for the tests and the bench: on 127.0.0.1, in
//! front of one server, every accepted connection getting a connection of
//! its own upstream. Bytes pass unchanged unless a fault or an option says
//! otherwise. Through it a test or the bench can
//!
//! - cut connections without telling either end
//!   ([`WireProxy::blackhole_open_connections`] and its siblings), to test
//!   what a client does when the network between it and the server goes
//!   silent (a partition, a dead load balancer) rather than closing;
//! - count round trips, `Close`-only batches, `Parse` messages and
//!   connections ([`Traffic`]);
//! - record every statement clients run ([`Statement`]), or every byte
//!   they send. Recording is asked for ([`WireProxyBuilder`]), so a proxy
//!   that only counts or cuts holds no more memory after a long run;
//! - answer clients' requests for encryption itself, with a refusal
//!   ([`WireProxyBuilder::refuse_encryption`]).
//!
//! It runs on a thread of its own with its own runtime: a test whose
//! runtime stalls (a blocked worker, a paused clock) must not stall the
//! network it is testing against.
//!
//! Silence is made by no longer reading or writing the sockets while keeping
//! them open: no FIN, no RST reaches either side. The kernel still
//! acknowledges what arrives until the buffers fill, so TCP keepalives do
//! not notice; a client finds out only by its own timeouts, as it would
//! behind a stateful firewall that dropped the flow.
//!
//! Only the client's side of the protocol is read, by one parser that feeds
//! the counters and the recordings alike; the server's replies pass
//! untouched. Encrypted bytes are not messages: once the server accepts a
//! client's request for encryption (answers `S`, or `G` for GSS), or a
//! client opens with a TLS handshake directly, the connection's bytes pass
//! as they are and nothing more is counted or recorded on it. Neither is
//! anything after a message that does not parse: the proxy never fails a
//! connection over what it could not read, it stops reading it.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch};
use url::Url;

use crate::error::HarnessError;

mod frontend;

use frontend::Frontend;
pub use frontend::{Statement, Traffic};

/// What a proxy does besides forwarding; see [`WireProxy::builder`].
#[derive(Debug, Clone, Copy, Default)]
struct Options {
    refuse_encryption: bool,
    record_statements: bool,
    record_client_bytes: bool,
}

/// A [`WireProxy`] with options; [`WireProxyBuilder::start`] starts it.
#[derive(Debug, Clone)]
#[must_use]
pub struct WireProxyBuilder {
    upstream: SocketAddr,
    options: Options,
}

impl WireProxyBuilder {
    /// Answers the client's SSL and GSS encryption requests with `N` (not
    /// supported) instead of passing them on, so a connection through the
    /// proxy is plaintext or fails (a client asked to `require` TLS), and
    /// is never miscounted or misrecorded from encrypted bytes. A direct TLS
    /// handshake (`sslnegotiation=direct`, no request first) is refused by
    /// closing the connection. Without this, encryption is the server's to
    /// grant, and a connection it grants is passed through unread.
    pub fn refuse_encryption(mut self) -> Self {
        self.options.refuse_encryption = true;
        self
    }

    /// Keeps every statement clients run, for [`WireProxy::take_statements`].
    pub fn record_statements(mut self) -> Self {
        self.options.record_statements = true;
        self
    }

    /// Keeps every byte clients send, for [`WireProxy::take_client_bytes`].
    pub fn record_client_bytes(mut self) -> Self {
        self.options.record_client_bytes = true;
        self
    }

    /// Listens on a free port of 127.0.0.1 and forwards to the upstream.
    pub fn start(self) -> Result<WireProxy, HarnessError> {
        let Self { upstream, options } = self;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(HarnessError::io("building the wire proxy's runtime"))?;
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .map_err(HarnessError::io("binding the wire proxy's port"))?;
        let addr = listener.local_addr().map_err(HarnessError::io("reading the wire proxy's port"))?;
        listener.set_nonblocking(true).map_err(HarnessError::io("setting up the wire proxy's port"))?;
        let listener = {
            let _context = runtime.enter();
            TcpListener::from_std(listener).map_err(HarnessError::io("setting up the wire proxy's port"))?
        };
        let shared = Arc::new(Shared { options, ..Shared::default() });
        let (shutdown, stopped) = oneshot::channel();
        let serving = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name(format!("adk-wire-proxy-{}", addr.port()))
            .spawn(move || {
                runtime.block_on(async {
                    tokio::select! {
                        _ = stopped => {}
                        () = accept_loop(listener, upstream, serving) => {}
                    }
                });
                // Dropping the runtime drops every connection's task, and
                // with them the sockets.
                drop(runtime);
            })
            .map_err(HarnessError::io("spawning the wire proxy's thread"))?;
        Ok(WireProxy { addr, shared, shutdown: Some(shutdown), thread: Some(thread) })
    }
}

/// A proxy on 127.0.0.1 to one upstream address; every accepted connection
/// gets a connection of its own upstream. Stopped, with every connection
/// closed, when dropped.
#[derive(Debug)]
pub struct WireProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl WireProxy {
    /// Listens on a free port of 127.0.0.1 and forwards to `upstream`,
    /// counting but recording nothing, and leaving encryption to the server.
    pub fn start(upstream: SocketAddr) -> Result<Self, HarnessError> {
        Self::builder(upstream).start()
    }

    /// A proxy to `upstream` with options.
    /// A proxy to be started in front of the server `server_url` names
    /// (its first host; port 5432 unless given).
    pub fn in_front_of(server_url: &str) -> Result<WireProxyBuilder, HarnessError> {
        Ok(Self::builder(crate::urls::server_address(server_url)?))
    }

    pub fn builder(upstream: SocketAddr) -> WireProxyBuilder {
        WireProxyBuilder { upstream, options: Options::default() }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// `url` pointed at the proxy: host 127.0.0.1 and the proxy's port,
    /// everything else kept.
    pub fn url(&self, url: &str) -> Result<String, HarnessError> {
        let bad = |reason: String| HarnessError::BadUrl { url: crate::urls::redacted(url), reason };
        let mut parsed = Url::parse(url).map_err(|error| bad(error.to_string()))?;
        parsed.set_host(Some("127.0.0.1")).map_err(|error| bad(error.to_string()))?;
        parsed.set_port(Some(self.port())).map_err(|()| bad("it cannot take a port".to_owned()))?;
        Ok(parsed.into())
    }

    /// Every connection open now goes silent both ways and stays open;
    /// connections accepted afterwards pass.
    pub fn blackhole_open_connections(&self) {
        self.shared.set_open(|_| Mode::Blackhole);
    }

    /// On every connection open now, the server still gets what the client
    /// sends but the client hears nothing more (a commit whose reply is
    /// lost); connections accepted afterwards pass. A blackholed connection
    /// stays blackholed.
    pub fn swallow_replies_on_open_connections(&self) {
        self.shared.set_open(|mode| if mode == Mode::Blackhole { mode } else { Mode::SwallowReplies });
    }

    /// While on, connections are closed as soon as they are accepted (the
    /// client sees its connection closed before the server greets it);
    /// open ones carry on.
    pub fn refuse_new(&self, refuse: bool) {
        self.shared.refuse_new.store(refuse, Ordering::SeqCst);
    }

    /// Connections accepted so far, refused ones included.
    pub fn accepted(&self) -> u64 {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// Connections closed at once by [`WireProxy::refuse_new`].
    pub fn refused(&self) -> u64 {
        self.shared.refused.load(Ordering::SeqCst)
    }

    /// Connections open now, blackholed ones included.
    pub fn open_connections(&self) -> usize {
        lock(&self.shared.connections).len()
    }

    /// What clients sent since the proxy started. A message is counted
    /// before it is forwarded, so an operation's reply never arrives before
    /// its count.
    pub fn traffic(&self) -> Traffic {
        let shared = &self.shared;
        Traffic {
            round_trips: shared.round_trips.load(Ordering::SeqCst),
            close_batches: shared.close_batches.load(Ordering::SeqCst),
            parses: shared.parses.load(Ordering::SeqCst),
            connections: shared.connected.load(Ordering::SeqCst),
        }
    }

    /// The statements recorded since the last take, in the order they were
    /// sent; none unless [`WireProxyBuilder::record_statements`].
    pub fn take_statements(&self) -> Vec<Statement> {
        std::mem::take(&mut *lock(&self.shared.statements))
    }

    /// The bytes clients sent since the last take, in the order the proxy
    /// read them (connections interleave between reads, not within one);
    /// none unless [`WireProxyBuilder::record_client_bytes`].
    pub fn take_client_bytes(&self) -> Vec<u8> {
        std::mem::take(&mut *lock(&self.shared.client_bytes))
    }
}

impl Drop for WireProxy {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A lock that a panicking holder elsewhere does not make unusable: every
/// value behind one is whole after each update.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What a connection's bytes do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Pass,
    /// Nothing is read or written either way, and nothing is closed.
    Blackhole,
    /// Client → server passes; server → client is read and dropped.
    SwallowReplies,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    ToServer,
    ToClient,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Effect {
    Forward,
    Discard,
    Freeze,
}

fn effect(mode: Mode, direction: Direction) -> Effect {
    match (mode, direction) {
        (Mode::Pass, _) | (Mode::SwallowReplies, Direction::ToServer) => Effect::Forward,
        (Mode::SwallowReplies, Direction::ToClient) => Effect::Discard,
        (Mode::Blackhole, _) => Effect::Freeze,
    }
}

#[derive(Debug, Default)]
struct Shared {
    options: Options,
    /// The open connections' modes, by connection number.
    connections: Mutex<HashMap<u64, Arc<watch::Sender<Mode>>>>,
    refuse_new: AtomicBool,
    accepted: AtomicU64,
    refused: AtomicU64,
    /// Connections that reached the server.
    connected: AtomicU64,
    round_trips: AtomicU64,
    close_batches: AtomicU64,
    parses: AtomicU64,
    /// Stay empty unless the options ask for them.
    statements: Mutex<Vec<Statement>>,
    client_bytes: Mutex<Vec<u8>>,
}

impl Shared {
    fn set_open(&self, change: impl Fn(Mode) -> Mode) {
        for mode in lock(&self.connections).values() {
            mode.send_modify(|mode| *mode = change(*mode));
        }
    }

    fn count(&self, traffic: &Traffic) {
        self.round_trips.fetch_add(traffic.round_trips, Ordering::SeqCst);
        self.close_batches.fetch_add(traffic.close_batches, Ordering::SeqCst);
        self.parses.fetch_add(traffic.parses, Ordering::SeqCst);
    }
}

async fn accept_loop(listener: TcpListener, upstream: SocketAddr, shared: Arc<Shared>) {
    let mut next_id = 0_u64;
    loop {
        let client = match listener.accept().await {
            Ok((client, _)) => client,
            // Out of file descriptors, say: the next accept may do better.
            Err(_) => {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                continue;
            }
        };
        shared.accepted.fetch_add(1, Ordering::SeqCst);
        if shared.refuse_new.load(Ordering::SeqCst) {
            shared.refused.fetch_add(1, Ordering::SeqCst);
            drop(client);
            continue;
        }
        let id = next_id;
        next_id += 1;
        // Registered before the upstream connect, so a fault set from now
        // on covers it.
        let mode = Arc::new(watch::Sender::new(Mode::Pass));
        lock(&shared.connections).insert(id, Arc::clone(&mode));
        let registered = Registered { id, shared: Arc::clone(&shared) };
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            let _registered = registered;
            let Ok(server) = TcpStream::connect(upstream).await else { return };
            shared.connected.fetch_add(1, Ordering::SeqCst);
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            let (client_read, client_write) = client.into_split();
            let (server_read, server_write) = server.into_split();
            let link = Arc::new(Link::default());
            let (answers, answered) = mpsc::unbounded_channel();
            let client_side =
                ClientSide { frontend: Frontend::new(shared.options), shared, link: Arc::clone(&link), answers };
            tokio::join!(
                to_server(client_read, server_write, mode.subscribe(), client_side),
                to_client(server_read, client_write, mode.subscribe(), &link, answered),
            );
        });
    }
}

/// Takes a connection out of the count when its task ends or is dropped.
struct Registered {
    id: u64,
    shared: Arc<Shared>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        lock(&self.shared.connections).remove(&self.id);
    }
}

/// What one connection's two directions tell each other about encryption.
#[derive(Debug, Default)]
struct Link {
    /// An encryption request went on to the server: the next byte it sends
    /// is its answer.
    answer_due: AtomicBool,
    /// The server said yes: from here on the bytes are TLS or GSS, not
    /// messages.
    encrypted: AtomicBool,
}

impl Link {
    /// Notes the server's answer to an encryption request, if `bytes` from
    /// the server start with one. Called before they reach the client, who
    /// sends its first encrypted byte only after reading the answer.
    fn heard(&self, bytes: &[u8]) {
        if let Some(first) = bytes.first()
            && self.answer_due.swap(false, Ordering::SeqCst)
            && matches!(first, b'S' | b'G')
        {
            self.encrypted.store(true, Ordering::SeqCst);
        }
    }
}

/// The client's side of one connection: its parser, and where what it
/// finds goes.
struct ClientSide {
    frontend: Frontend,
    shared: Arc<Shared>,
    link: Arc<Link>,
    /// The proxy's own answers to the client, sent as the server's replies
    /// are so that a fault silences them too.
    answers: mpsc::UnboundedSender<&'static [u8]>,
}

/// What to do with bytes a client sent.
struct Pass {
    /// `None`: pass them on as they are.
    forward: Option<Vec<u8>>,
    /// End the connection instead.
    close: bool,
}

impl ClientSide {
    fn sent(&mut self, bytes: &[u8]) -> Pass {
        let shared = &*self.shared;
        if shared.options.record_client_bytes {
            lock(&shared.client_bytes).extend_from_slice(bytes);
        }
        if self.link.encrypted.load(Ordering::SeqCst) {
            self.frontend.encrypted();
        }
        let seen = self.frontend.feed(bytes);
        shared.count(&seen.traffic);
        if !seen.statements.is_empty() {
            lock(&shared.statements).extend(seen.statements);
        }
        if seen.asked_server {
            self.link.answer_due.store(true, Ordering::SeqCst);
        }
        for _ in 0..seen.refused {
            // Gone only when the other direction is, and with it the client.
            let _ = self.answers.send(b"N");
        }
        Pass { forward: seen.forward, close: seen.close }
    }
}

/// Client → server: reads, lets the parser see each read before it is
/// forwarded (so it is counted before the server can answer it), forwards
/// what the parser passes. Frozen, it holds both halves (dropping a write
/// half would send a FIN) until the proxy stops.
async fn to_server(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    mut mode: watch::Receiver<Mode>,
    mut client: ClientSide,
) {
    let mut buffer = vec![0_u8; 64 * 1024];
    loop {
        if effect(*mode.borrow_and_update(), Direction::ToServer) == Effect::Freeze {
            return freeze(from, to).await;
        }
        let read = tokio::select! {
            biased;
            // The sender lives as long as the connection: no error here.
            _ = mode.changed() => continue,
            read = from.read(&mut buffer) => read,
        };
        let count = match read {
            Ok(0) => {
                let _ = to.shutdown().await;
                return;
            }
            Ok(count) => count,
            Err(_) => return,
        };
        let read = &buffer[..count];
        let pass = client.sent(read);
        if pass.close {
            // The server, given a FIN before a startup message, closes its
            // side, and the client hears that.
            let _ = to.shutdown().await;
            return;
        }
        if !forward(&mut to, pass.forward.as_deref().unwrap_or(read), &mut mode, Direction::ToServer).await {
            return;
        }
    }
}

/// Server → client: copies the server's bytes and the proxy's own answers
/// as the connection's mode allows. Frozen, it holds both halves until the
/// proxy stops. The server's end of stream is passed on as a FIN, unless
/// replies are being discarded: then the client hears nothing, not even
/// that.
async fn to_client(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    mut mode: watch::Receiver<Mode>,
    link: &Link,
    mut answers: mpsc::UnboundedReceiver<&'static [u8]>,
) {
    let mut buffer = vec![0_u8; 64 * 1024];
    let mut answering = true;
    loop {
        let now = effect(*mode.borrow_and_update(), Direction::ToClient);
        if now == Effect::Freeze {
            return freeze(from, to).await;
        }
        let read = tokio::select! {
            biased;
            _ = mode.changed() => continue,
            answer = answers.recv(), if answering => {
                match answer {
                    Some(answer) => {
                        if !forward(&mut to, answer, &mut mode, Direction::ToClient).await {
                            return;
                        }
                    }
                    // The client's direction has ended.
                    None => answering = false,
                }
                continue;
            }
            read = from.read(&mut buffer) => read,
        };
        let count = match read {
            Ok(0) if now == Effect::Discard => return freeze(from, to).await,
            Ok(0) => {
                let _ = to.shutdown().await;
                return;
            }
            Ok(count) => count,
            Err(_) => return,
        };
        link.heard(&buffer[..count]);
        if !forward(&mut to, &buffer[..count], &mut mode, Direction::ToClient).await {
            return;
        }
    }
}

/// Writes `bytes` while the connection's mode lets this direction forward;
/// what is left when it stops is dropped. False when the socket failed.
async fn forward(
    to: &mut OwnedWriteHalf,
    bytes: &[u8],
    mode: &mut watch::Receiver<Mode>,
    direction: Direction,
) -> bool {
    let mut written = 0;
    while written < bytes.len() && effect(*mode.borrow_and_update(), direction) == Effect::Forward {
        tokio::select! {
            biased;
            // Re-checked by the loop.
            _ = mode.changed() => {}
            result = to.write(&bytes[written..]) => match result {
                Ok(0) | Err(_) => return false,
                Ok(more) => written += more,
            },
        }
    }
    true
}

async fn freeze(from: OwnedReadHalf, to: OwnedWriteHalf) {
    let _held = (from, to);
    std::future::pending::<()>().await;
}

#[cfg(test)]
mod tests {
    use std::io::{ErrorKind, Read as _, Write as _};
    use std::sync::mpsc as std_mpsc;
    use std::time::Duration;

    use super::frontend::SSL_REQUEST;
    use super::frontend::tests::{STARTUP, message, request, unnamed_batch};
    use super::*;

    /// What the upstream saw on one connection: its bytes, then `None` at
    /// end of stream.
    type Heard = std_mpsc::Receiver<Option<Vec<u8>>>;

    /// An echo server whose connections report what they read.
    fn upstream() -> (SocketAddr, std_mpsc::Receiver<Heard>) {
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let addr = listener.local_addr().unwrap();
        let (connections, accepted) = std_mpsc::channel();
        std::thread::spawn(move || {
            for mut stream in listener.incoming().map_while(Result::ok) {
                let (seen, saw) = std_mpsc::channel();
                if connections.send(saw).is_err() {
                    return;
                }
                std::thread::spawn(move || {
                    let mut buffer = [0_u8; 1024];
                    while let Ok(count) = stream.read(&mut buffer) {
                        let _ = seen.send((count > 0).then(|| buffer[..count].to_vec()));
                        if count == 0 || stream.write_all(&buffer[..count]).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (addr, accepted)
    }

    fn client(proxy: &WireProxy) -> std::net::TcpStream {
        let stream = std::net::TcpStream::connect(proxy.addr()).unwrap();
        stream.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
        stream
    }

    /// Sends `bytes` and returns what comes back: `Some(reply)`, or `None`
    /// when nothing came, neither bytes nor a close, within the timeout.
    fn round_trip(stream: &mut std::net::TcpStream, bytes: &[u8]) -> Option<Vec<u8>> {
        stream.write_all(bytes).unwrap();
        let mut buffer = [0_u8; 1024];
        match stream.read(&mut buffer) {
            Ok(count) => Some(buffer[..count].to_vec()),
            Err(error) if matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => None,
            Err(error) => panic!("the proxy broke the connection: {error}"),
        }
    }

    const QUIET: Duration = Duration::from_millis(200);

    #[test]
    fn a_blackhole_silences_open_connections_without_closing_them() {
        let (addr, accepted) = upstream();
        let proxy = WireProxy::start(addr).unwrap();
        let mut open = client(&proxy);
        let seen = accepted.recv().unwrap();
        assert_eq!(round_trip(&mut open, b"ping"), Some(b"ping".to_vec()));
        assert_eq!(seen.recv().unwrap(), Some(b"ping".to_vec()));

        proxy.blackhole_open_connections();
        assert_eq!(round_trip(&mut open, b"lost"), None, "no reply, and no close either");
        assert!(seen.recv_timeout(QUIET).is_err(), "the server got neither bytes nor a FIN");

        let mut later = client(&proxy);
        assert_eq!(round_trip(&mut later, b"new"), Some(b"new".to_vec()));
        assert_eq!((proxy.accepted(), proxy.open_connections()), (2, 2));

        drop(proxy);
        let mut buffer = [0_u8; 8];
        assert!(matches!(open.read(&mut buffer), Ok(0) | Err(_)), "dropping the proxy closes everything");
    }

    #[test]
    fn swallowed_replies_reach_the_server_but_not_the_client() {
        let (addr, accepted) = upstream();
        let proxy = WireProxy::start(addr).unwrap();
        let mut open = client(&proxy);
        let seen = accepted.recv().unwrap();
        proxy.swallow_replies_on_open_connections();
        assert_eq!(round_trip(&mut open, b"commit"), None);
        assert_eq!(seen.recv().unwrap(), Some(b"commit".to_vec()));
        let mut later = client(&proxy);
        assert_eq!(round_trip(&mut later, b"new"), Some(b"new".to_vec()));
    }

    #[test]
    fn refusing_closes_new_connections_only() {
        let (addr, _accepted) = upstream();
        let proxy = WireProxy::start(addr).unwrap();
        let mut open = client(&proxy);
        assert_eq!(round_trip(&mut open, b"a"), Some(b"a".to_vec()));
        proxy.refuse_new(true);
        let mut refused = client(&proxy);
        let mut buffer = [0_u8; 8];
        assert!(matches!(refused.read(&mut buffer), Ok(0) | Err(_)));
        assert_eq!(round_trip(&mut open, b"b"), Some(b"b".to_vec()));
        proxy.refuse_new(false);
        let mut again = client(&proxy);
        assert_eq!(round_trip(&mut again, b"c"), Some(b"c".to_vec()));
        assert_eq!((proxy.accepted(), proxy.refused(), proxy.open_connections()), (3, 1, 2));
    }

    /// A client asking for TLS is refused by the proxy itself, and the
    /// server sees only the plaintext startup that follows, and everything
    /// the client sent is on record.
    #[test]
    fn requests_for_encryption_are_refused_not_forwarded() {
        let (addr, accepted) = upstream();
        let proxy = WireProxy::builder(addr).refuse_encryption().record_client_bytes().start().unwrap();
        let mut open = client(&proxy);
        assert_eq!(round_trip(&mut open, &request(SSL_REQUEST)), Some(b"N".to_vec()));
        assert_eq!(round_trip(&mut open, &STARTUP), Some(STARTUP.to_vec()), "echoed by the server");
        let seen = accepted.recv().unwrap();
        assert_eq!(seen.recv().unwrap(), Some(STARTUP.to_vec()));
        assert_eq!(proxy.traffic().connections, 1);
        assert_eq!(proxy.take_client_bytes(), [request(SSL_REQUEST), STARTUP.to_vec()].concat());
        assert!(proxy.take_client_bytes().is_empty(), "taken");
    }

    /// The server grants TLS: what follows passes untouched and unread,
    /// though it would parse.
    #[test]
    fn a_connection_the_server_encrypts_passes_unread() {
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let proxy = WireProxy::builder(listener.local_addr().unwrap()).record_statements().start().unwrap();
        let mut open = client(&proxy);
        open.write_all(&request(SSL_REQUEST)).unwrap();
        let (mut server, _) = listener.accept().unwrap();
        server.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut asked = [0_u8; 8];
        server.read_exact(&mut asked).unwrap();
        assert_eq!(asked.to_vec(), request(SSL_REQUEST));
        server.write_all(b"S").unwrap();
        let mut answer = [0_u8; 1];
        open.read_exact(&mut answer).unwrap();
        assert_eq!(&answer, b"S");
        let not_tls = [&STARTUP[..], &message(b'Q', b"SELECT 1\0")].concat();
        open.write_all(&not_tls).unwrap();
        let mut passed = vec![0_u8; not_tls.len()];
        server.read_exact(&mut passed).unwrap();
        assert_eq!(passed, not_tls);
        assert_eq!(proxy.traffic(), Traffic { connections: 1, ..Traffic::default() });
        assert!(proxy.take_statements().is_empty());
    }

    /// Statements from a real client's bytes end up in the recording, and
    /// the counts in the traffic.
    #[test]
    fn recorded_statements_and_traffic_cross_the_proxy() {
        let (addr, accepted) = upstream();
        let proxy = WireProxy::builder(addr).record_statements().start().unwrap();
        let mut open = client(&proxy);
        let sent = [&STARTUP[..], &unnamed_batch(), &message(b'Q', b"COMMIT\0")].concat();
        open.write_all(&sent).unwrap();
        let seen = accepted.recv().unwrap();
        let mut passed = Vec::new();
        while passed.len() < sent.len() {
            passed.extend(seen.recv().unwrap().unwrap());
        }
        assert_eq!(passed, sent);
        assert_eq!(proxy.traffic(), Traffic { round_trips: 2, close_batches: 0, parses: 1, connections: 1 });
        let sql: Vec<_> = proxy.take_statements().into_iter().map(|s| s.sql).collect();
        assert_eq!(sql, ["SELECT $1::int8, $2::text", "COMMIT"]);
    }

    #[test]
    fn urls_are_pointed_at_the_proxy() {
        let (addr, _accepted) = upstream();
        let proxy = WireProxy::start(addr).unwrap();
        let url = proxy.url("postgres://u:p@localhost:5432/db?sslmode=prefer").unwrap();
        assert_eq!(url, format!("postgres://u:p@127.0.0.1:{}/db?sslmode=prefer", proxy.port()));
        assert!(proxy.url("not a url").is_err());
    }
}
