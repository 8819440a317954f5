//! A TCP proxy that can cut a connection without telling either end, for
//! tests of what a client does when the network between it and the server
//! goes silent (a partition, a dead load balancer) rather than closing.
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

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch};

use crate::error::HarnessError;

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
    /// The open connections' modes, by connection number.
    connections: Mutex<HashMap<u64, Arc<watch::Sender<Mode>>>>,
    refuse_new: AtomicBool,
    accepted: AtomicU64,
    refused: AtomicU64,
}

impl Shared {
    fn set_open(&self, change: impl Fn(Mode) -> Mode) {
        let connections = self.connections.lock().unwrap_or_else(PoisonError::into_inner);
        for mode in connections.values() {
            mode.send_modify(|mode| *mode = change(*mode));
        }
    }
}

/// A proxy on 127.0.0.1 to one upstream address; every accepted connection
/// gets a connection of its own upstream. Stopped, with every connection
/// closed, when dropped.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl FaultProxy {
    /// Listens on a free port of 127.0.0.1 and forwards to `upstream`.
    pub fn start(upstream: SocketAddr) -> Result<Self, HarnessError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(HarnessError::io("building the fault proxy's runtime"))?;
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .map_err(HarnessError::io("binding the fault proxy's port"))?;
        let addr = listener.local_addr().map_err(HarnessError::io("reading the fault proxy's port"))?;
        listener.set_nonblocking(true).map_err(HarnessError::io("setting up the fault proxy's port"))?;
        let listener = {
            let _context = runtime.enter();
            TcpListener::from_std(listener).map_err(HarnessError::io("setting up the fault proxy's port"))?
        };
        let shared = Arc::new(Shared::default());
        let (shutdown, stopped) = oneshot::channel();
        let serving = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name(format!("adk-fault-proxy-{}", addr.port()))
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
            .map_err(HarnessError::io("spawning the fault proxy's thread"))?;
        Ok(Self { addr, shared, shutdown: Some(shutdown), thread: Some(thread) })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
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

    /// Connections closed at once by [`FaultProxy::refuse_new`].
    pub fn refused(&self) -> u64 {
        self.shared.refused.load(Ordering::SeqCst)
    }

    /// Connections open now, blackholed ones included.
    pub fn open_connections(&self) -> usize {
        self.shared.connections.lock().unwrap_or_else(PoisonError::into_inner).len()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
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
        shared.connections.lock().unwrap_or_else(PoisonError::into_inner).insert(id, Arc::clone(&mode));
        let registered = Registered { id, shared: Arc::clone(&shared) };
        tokio::spawn(async move {
            let _registered = registered;
            let Ok(server) = TcpStream::connect(upstream).await else { return };
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            let (client_read, client_write) = client.into_split();
            let (server_read, server_write) = server.into_split();
            tokio::join!(
                pump(client_read, server_write, mode.subscribe(), Direction::ToServer),
                pump(server_read, client_write, mode.subscribe(), Direction::ToClient),
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
        self.shared.connections.lock().unwrap_or_else(PoisonError::into_inner).remove(&self.id);
    }
}

/// Copies `from` to `to` as the connection's mode allows. Frozen, it holds
/// both halves (dropping a write half would send a FIN) until the proxy
/// stops. Its end of stream is passed on as a FIN, unless this direction is
/// being discarded: then the other side hears nothing, not even that.
async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, mut mode: watch::Receiver<Mode>, direction: Direction) {
    let mut buffer = vec![0_u8; 64 * 1024];
    loop {
        let now = effect(*mode.borrow_and_update(), direction);
        if now == Effect::Freeze {
            return freeze(from, to).await;
        }
        let read = tokio::select! {
            biased;
            // The sender lives as long as the connection: no error here.
            _ = mode.changed() => continue,
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
        let mut written = 0;
        while written < count && effect(*mode.borrow_and_update(), direction) == Effect::Forward {
            tokio::select! {
                biased;
                // Re-checked by the loop; what is left is dropped if it
                // must no longer pass.
                _ = mode.changed() => {}
                result = to.write(&buffer[written..count]) => match result {
                    Ok(0) | Err(_) => return,
                    Ok(more) => written += more,
                },
            }
        }
    }
}

async fn freeze(from: OwnedReadHalf, to: OwnedWriteHalf) {
    let _held = (from, to);
    std::future::pending::<()>().await;
}

#[cfg(test)]
mod tests {
    use std::io::{ErrorKind, Read as _, Write as _};
    use std::net::TcpStream;
    use std::sync::mpsc;
    use std::time::Duration;

    use super::*;

    /// What the upstream saw on one connection: its bytes, then `None` at
    /// end of stream.
    type Seen = mpsc::Receiver<Option<Vec<u8>>>;

    /// An echo server whose connections report what they read.
    fn upstream() -> (SocketAddr, mpsc::Receiver<Seen>) {
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let addr = listener.local_addr().unwrap();
        let (connections, accepted) = mpsc::channel();
        std::thread::spawn(move || {
            for mut stream in listener.incoming().map_while(Result::ok) {
                let (seen, saw) = mpsc::channel();
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

    fn client(proxy: &FaultProxy) -> TcpStream {
        let stream = TcpStream::connect(proxy.addr()).unwrap();
        stream.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
        stream
    }

    /// Sends `bytes` and returns what comes back: `Some(reply)`, or `None`
    /// when nothing came, neither bytes nor a close, within the timeout.
    fn round_trip(stream: &mut TcpStream, bytes: &[u8]) -> Option<Vec<u8>> {
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
        let proxy = FaultProxy::start(addr).unwrap();
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
        let proxy = FaultProxy::start(addr).unwrap();
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
        let proxy = FaultProxy::start(addr).unwrap();
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
}
