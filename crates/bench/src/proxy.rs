//! A counting TCP proxy in front of the server: it reads the client's side
//! of the PostgreSQL wire protocol and counts round trips, which
//! `pg_stat_statements` cannot see (a statement prepared again before every
//! execution is one statement but two round trips).
//!
//! A round trip is a message batch the client waits on: everything up to a
//! `Sync` in the extended protocol, or one simple `Query`. A batch of only
//! `Close` messages (tokio-postgres closes a statement it prepared that
//! way when the statement is dropped) is counted apart: the client does not
//! wait for it, but the server still processes it. `Parse` messages are
//! counted too, and mean what the client's protocol makes them mean: a
//! client keeping named statements (pgbench `-M prepared`, sqlx's cache)
//! parses once per connection, so about 0 per operation once warm; our
//! store sends every statement unnamed (`query_typed`), so each of its
//! statements carries its own `Parse` inside its one batch, and costs no
//! round trip and leaves no statement to close.
//!
//! It reads plaintext only: it answers a client's request for TLS or GSS
//! encryption itself, with a refusal, so a connection through it is
//! plaintext or fails (a client asked to `require` TLS), and is never
//! miscounted from encrypted bytes. Only used in an untimed pass: the extra
//! hop would distort latencies.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

const SSL_REQUEST: u32 = 80_877_103;
const GSS_REQUEST: u32 = 80_877_104;
const CANCEL_REQUEST: u32 = 80_877_102;

#[derive(Debug, Default)]
struct Counters {
    round_trips: AtomicU64,
    close_batches: AtomicU64,
    parses: AtomicU64,
    connections: AtomicU64,
}

/// What crossed the proxy since the last reset.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct Traffic {
    /// Batches the client waited on.
    pub round_trips: u64,
    /// Batches of `Close` only (statements closed, not waited on).
    pub close_batches: u64,
    /// `Parse` messages: statements parsed, named (once per connection)
    /// or unnamed (with every execution, in its own batch).
    pub parses: u64,
    /// Connections opened.
    pub connections: u64,
}

impl Traffic {
    pub fn minus(self, earlier: Traffic) -> Traffic {
        Traffic {
            round_trips: self.round_trips.saturating_sub(earlier.round_trips),
            close_batches: self.close_batches.saturating_sub(earlier.close_batches),
            parses: self.parses.saturating_sub(earlier.parses),
            connections: self.connections.saturating_sub(earlier.connections),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Proxy {
    addr: SocketAddr,
    counters: Arc<Counters>,
}

impl Proxy {
    /// Listens on a free port of 127.0.0.1 and forwards to `upstream`.
    pub async fn start(upstream: SocketAddr) -> anyhow::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let counters = Arc::new(Counters::default());
        let shared = counters.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let counters = shared.clone();
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(upstream).await {
                        counters.connections.fetch_add(1, Ordering::Relaxed);
                        let _ = forward(client, server, counters).await;
                    }
                });
            }
        });
        Ok(Self { addr, counters })
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    pub fn read(&self) -> Traffic {
        let c = &self.counters;
        Traffic {
            round_trips: c.round_trips.load(Ordering::Relaxed),
            close_batches: c.close_batches.load(Ordering::Relaxed),
            parses: c.parses.load(Ordering::Relaxed),
            connections: c.connections.load(Ordering::Relaxed),
        }
    }
}

async fn forward(client: TcpStream, server: TcpStream, counters: Arc<Counters>) -> std::io::Result<()> {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let mut client = client;
    let mut parser = Parser::default();
    let first = refuse_encryption(&mut client).await?;
    parser.feed(&first, &counters);
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    server_write.write_all(&first).await?;
    let downstream = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
        let _ = client_write.shutdown().await;
    });
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = client_read.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        parser.feed(&buf[..n], &counters);
        server_write.write_all(&buf[..n]).await?;
    }
    let _ = server_write.shutdown().await;
    let _ = downstream.await;
    Ok(())
}

/// Answers the client's SSL and GSS encryption requests with `N` (not
/// supported) until it sends something else, and returns the first 8 bytes
/// of that (the start of its startup message or cancel request), not yet
/// forwarded. A direct TLS handshake (`sslnegotiation=direct`, no request
/// first) is refused by closing the connection.
async fn refuse_encryption(client: &mut TcpStream) -> std::io::Result<[u8; 8]> {
    /// The first byte of a TLS record carrying a handshake.
    const TLS_HANDSHAKE: u8 = 0x16;
    loop {
        let mut head = [0u8; 8];
        client.read_exact(&mut head).await?;
        if head[0] == TLS_HANDSHAKE {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "a direct TLS handshake: the counting proxy reads plaintext only",
            ));
        }
        let len = u32::from_be_bytes([head[0], head[1], head[2], head[3]]);
        let code = u32::from_be_bytes([head[4], head[5], head[6], head[7]]);
        if len != 8 || !matches!(code, SSL_REQUEST | GSS_REQUEST) {
            return Ok(head);
        }
        client.write_all(b"N").await?;
    }
}

/// Splits the client's byte stream into protocol messages.
#[derive(Debug, Default)]
struct Parser {
    pending: Vec<u8>,
    started: bool,
    /// The current batch holds something other than `Close`.
    batch_has_work: bool,
    batch_has_close: bool,
}

impl Parser {
    fn feed(&mut self, bytes: &[u8], counters: &Counters) {
        self.pending.extend_from_slice(bytes);
        let mut at = 0;
        loop {
            let rest = &self.pending[at..];
            if !self.started {
                // Length-prefixed, untyped: SSL/GSS requests, then the startup message.
                if rest.len() < 8 {
                    break;
                }
                let len = u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
                if rest.len() < len {
                    break;
                }
                let code = u32::from_be_bytes([rest[4], rest[5], rest[6], rest[7]]);
                if !matches!(code, SSL_REQUEST | GSS_REQUEST | CANCEL_REQUEST) {
                    self.started = true;
                }
                at += len.max(8);
                continue;
            }
            if rest.len() < 5 {
                break;
            }
            let kind = rest[0];
            let len = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
            if rest.len() < len + 1 {
                break;
            }
            self.message(kind, counters);
            at += len + 1;
        }
        self.pending.drain(..at);
    }

    fn message(&mut self, kind: u8, counters: &Counters) {
        match kind {
            b'Q' => {
                counters.round_trips.fetch_add(1, Ordering::Relaxed);
            }
            b'S' => {
                if self.batch_has_work {
                    counters.round_trips.fetch_add(1, Ordering::Relaxed);
                } else if self.batch_has_close {
                    counters.close_batches.fetch_add(1, Ordering::Relaxed);
                }
                self.batch_has_work = false;
                self.batch_has_close = false;
            }
            b'C' => self.batch_has_close = true,
            b'P' => {
                counters.parses.fetch_add(1, Ordering::Relaxed);
                self.batch_has_work = true;
            }
            // Terminate, password and copy data do not start a batch.
            b'X' | b'p' | b'd' | b'c' | b'f' => {}
            _ => self.batch_has_work = true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(kind: u8, body: &[u8]) -> Vec<u8> {
        let mut m = vec![kind];
        m.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
        m.extend_from_slice(body);
        m
    }

    #[test]
    fn batches_are_counted_across_reads() {
        let counters = Counters::default();
        let mut parser = Parser::default();
        let mut stream = Vec::new();
        stream.extend_from_slice(&8u32.to_be_bytes());
        stream.extend_from_slice(&SSL_REQUEST.to_be_bytes());
        let startup = [0u8, 3, 0, 0, b'u', b's', b'e', b'r', 0, b'x', 0, 0];
        stream.extend_from_slice(&(startup.len() as u32 + 4).to_be_bytes());
        stream.extend_from_slice(&startup);
        // prepare (round trip), execute (round trip), close (not waited), simple query.
        for m in [
            msg(b'P', b"s\0SELECT 1\0\0\0"),
            msg(b'D', b"Ss\0"),
            msg(b'S', b""),
            msg(b'B', b"\0s\0\0\0\0\0\0\0"),
            msg(b'E', b"\0\0\0\0\0"),
            msg(b'S', b""),
            msg(b'C', b"Ss\0"),
            msg(b'S', b""),
            msg(b'Q', b"BEGIN\0"),
        ] {
            stream.extend(m);
        }
        for chunk in stream.chunks(3) {
            parser.feed(chunk, &counters);
        }
        assert_eq!(counters.round_trips.load(Ordering::Relaxed), 3);
        assert_eq!(counters.close_batches.load(Ordering::Relaxed), 1);
        assert_eq!(counters.parses.load(Ordering::Relaxed), 1);
    }

    /// An unnamed statement as our store sends it: Parse, Bind, Describe,
    /// Execute and Sync in one batch, one round trip with its own Parse.
    #[test]
    fn an_unnamed_statement_is_one_round_trip_with_its_parse() {
        let counters = Counters::default();
        let mut parser = Parser { started: true, ..Parser::default() };
        for _ in 0..2 {
            for m in [
                msg(b'P', b"\0SELECT 1\0\0\0"),
                msg(b'B', b"\0\0\0\0\0\0\0\0"),
                msg(b'D', b"P\0"),
                msg(b'E', b"\0\0\0\0\0"),
                msg(b'S', b""),
            ] {
                parser.feed(&m, &counters);
            }
        }
        assert_eq!(counters.round_trips.load(Ordering::Relaxed), 2);
        assert_eq!(counters.parses.load(Ordering::Relaxed), 2);
        assert_eq!(counters.close_batches.load(Ordering::Relaxed), 0);
    }

    /// A client asking for TLS is refused by the proxy itself, and the
    /// server sees only the plaintext startup that follows.
    #[tokio::test]
    async fn requests_for_encryption_are_refused_not_forwarded() {
        let upstream = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
        let proxy = Proxy::start(upstream.local_addr().unwrap()).await.unwrap();
        let mut client = TcpStream::connect(("127.0.0.1", proxy.port())).await.unwrap();
        let mut request = 8u32.to_be_bytes().to_vec();
        request.extend_from_slice(&SSL_REQUEST.to_be_bytes());
        client.write_all(&request).await.unwrap();
        let mut answer = [0u8; 1];
        client.read_exact(&mut answer).await.unwrap();
        assert_eq!(&answer, b"N");
        let startup = [0u8, 0, 0, 12, 0, 3, 0, 0, b'u', 0, b'x', 0];
        client.write_all(&startup).await.unwrap();
        let (mut server, _) = upstream.accept().await.unwrap();
        let mut seen = [0u8; 12];
        server.read_exact(&mut seen).await.unwrap();
        assert_eq!(seen, startup);
        assert_eq!(proxy.read().connections, 1);
    }
}
