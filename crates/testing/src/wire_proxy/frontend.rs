//! The client's side of the PostgreSQL protocol, as the proxy reads it: one
//! parser per connection, whose findings feed the counters and the
//! recordings alike.

use std::collections::HashMap;

use serde::Serialize;

use super::Options;

pub(super) const SSL_REQUEST: u32 = 80_877_103;
const GSS_REQUEST: u32 = 80_877_104;
const CANCEL_REQUEST: u32 = 80_877_102;
/// The first byte of a TLS record carrying a handshake: how a client that
/// skips the request (`sslnegotiation=direct`) opens. No startup-phase
/// length starts with it.
const TLS_HANDSHAKE: u8 = 0x16;
/// PostgreSQL's own limit on a startup-phase message.
const MAX_STARTUP: usize = 10_000;
/// PostgreSQL's limit on any message: a longer length is not a message to
/// wait for but bytes that were never one.
const MAX_MESSAGE: usize = 0x3fff_ffff;

/// What crossed the proxy, from the client's side: since the start from
/// [`WireProxy::traffic`](super::WireProxy::traffic), for a stretch of it
/// with [`Traffic::minus`].
///
/// A round trip is a message batch the client waits on: everything up to a
/// `Sync` in the extended protocol, or one simple `Query`. These are what
/// `pg_stat_statements` cannot see (a statement prepared again before every
/// execution is one statement but two round trips). A batch of only `Close`
/// messages (tokio-postgres closes a statement it prepared that way when the
/// statement is dropped) is counted apart: the client does not wait for it,
/// but the server still processes it. `Parse` messages are counted too, and
/// mean what the client's protocol makes them mean: a client keeping named
/// statements (pgbench `-M prepared`, sqlx's cache) parses once per
/// connection, so about 0 per operation once warm; our store sends every
/// statement unnamed (`query_typed`), so each of its statements carries its
/// own `Parse` inside its one batch, and costs no round trip and leaves no
/// statement to close.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Traffic {
    /// Batches the client waited on.
    pub round_trips: u64,
    /// Batches of `Close` only (statements closed, not waited on).
    pub close_batches: u64,
    /// `Parse` messages: statements parsed, named (once per connection)
    /// or unnamed (with every execution, in its own batch).
    pub parses: u64,
    /// Connections opened to the server.
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

/// One statement as a client ran it: its text, the types it declared and
/// the values it bound (binary or text, as `formats` says). A simple query
/// declares and binds nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Statement {
    pub sql: String,
    pub types: Vec<u32>,
    pub formats: Vec<i16>,
    pub values: Vec<Option<Vec<u8>>>,
}

impl Statement {
    /// The format of the `index`th value: 0 (text) or 1 (binary). A Bind
    /// gives no format when all are text, one when all share it, else one
    /// per value.
    pub fn format_of(&self, index: usize) -> i16 {
        match self.formats.as_slice() {
            [] => 0,
            [all] => *all,
            each => each.get(index).copied().unwrap_or(0),
        }
    }
}

/// Where a client is in the protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Untyped messages (a length, then a code): encryption requests, then
    /// the startup message or a cancel request.
    Startup,
    /// Typed messages: a kind byte, then a length.
    Messages,
    /// TLS or GSS: nothing to read, everything passes.
    Encrypted,
    /// Something was not a message: nothing more is read, everything
    /// passes.
    Stopped,
}

/// What the parser found in one read.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Seen {
    /// Its counts (never `connections`, which are the proxy's).
    pub(super) traffic: Traffic,
    /// Statements run, when recording.
    pub(super) statements: Vec<Statement>,
    /// `None`: the read passes as it is. `Some`: only these bytes, while
    /// encryption requests are being taken out.
    pub(super) forward: Option<Vec<u8>>,
    /// Encryption requests the proxy refused, each owed an `N`.
    pub(super) refused: usize,
    /// An encryption request went on to the server.
    pub(super) asked_server: bool,
    /// A TLS handshake the proxy refuses by closing the connection.
    pub(super) close: bool,
}

/// A message that is not one; reading stops at it.
#[derive(Debug)]
struct Malformed;

/// The frontend side of the PostgreSQL protocol, for one connection: splits
/// the client's bytes into messages, counts batches, and (when recording)
/// keeps the statements.
#[derive(Debug)]
pub(super) struct Frontend {
    refuse_encryption: bool,
    record: bool,
    phase: Phase,
    /// The start of a message whose end has not arrived yet.
    pending: Vec<u8>,
    /// The current batch holds something other than `Close`.
    batch_has_work: bool,
    batch_has_close: bool,
    /// Statements parsed, by name (`""` is the unnamed one), when recording.
    prepared: HashMap<String, (String, Vec<u32>)>,
}

impl Frontend {
    pub(super) fn new(options: Options) -> Self {
        Self {
            refuse_encryption: options.refuse_encryption,
            record: options.record_statements,
            phase: Phase::Startup,
            pending: Vec::new(),
            batch_has_work: false,
            batch_has_close: false,
            prepared: HashMap::new(),
        }
    }

    /// The server granted encryption: nothing more is read.
    pub(super) fn encrypted(&mut self) {
        self.phase = Phase::Encrypted;
        self.pending = Vec::new();
    }

    pub(super) fn feed(&mut self, bytes: &[u8]) -> Seen {
        let mut seen = Seen::default();
        if matches!(self.phase, Phase::Encrypted | Phase::Stopped) {
            return seen;
        }
        // Refusing encryption, the proxy passes nothing of the startup phase
        // before it has seen whole messages: a request must not reach the
        // server.
        let mut holding = (self.refuse_encryption && self.phase == Phase::Startup).then(Vec::new);
        let mut pending = std::mem::take(&mut self.pending);
        pending.extend_from_slice(bytes);
        let mut at = 0;
        loop {
            let rest = &pending[at..];
            match self.phase {
                Phase::Startup => match untyped(rest) {
                    Untyped::Incomplete => break,
                    Untyped::Encryption(length) => {
                        if self.refuse_encryption {
                            seen.refused += 1;
                        } else {
                            seen.asked_server = true;
                        }
                        at += length;
                    }
                    Untyped::Cancel(length) => {
                        if let Some(held) = holding.as_mut() {
                            held.extend_from_slice(&rest[..length]);
                        }
                        at += length;
                    }
                    Untyped::Startup(length) => {
                        // From here on every byte passes as it comes.
                        if let Some(mut held) = holding.take() {
                            held.extend_from_slice(rest);
                            seen.forward = Some(held);
                        }
                        self.phase = Phase::Messages;
                        at += length;
                    }
                    Untyped::DirectTls if self.refuse_encryption => {
                        seen.close = true;
                        self.phase = Phase::Stopped;
                    }
                    Untyped::DirectTls => self.phase = Phase::Encrypted,
                    Untyped::Malformed => {
                        if let Some(mut held) = holding.take() {
                            held.extend_from_slice(rest);
                            seen.forward = Some(held);
                        }
                        self.phase = Phase::Stopped;
                    }
                },
                Phase::Messages => {
                    let Some(&[kind, a, b, c, d]) = rest.get(..5) else { break };
                    let length = u32::from_be_bytes([a, b, c, d]) as usize;
                    if !(4..=MAX_MESSAGE).contains(&length) {
                        self.phase = Phase::Stopped;
                        break;
                    }
                    let Some(body) = rest.get(5..1 + length) else { break };
                    if self.message(kind, body, &mut seen).is_err() {
                        self.phase = Phase::Stopped;
                        break;
                    }
                    at += 1 + length;
                }
                Phase::Encrypted | Phase::Stopped => break,
            }
        }
        if seen.forward.is_none() {
            seen.forward = holding;
        }
        if matches!(self.phase, Phase::Encrypted | Phase::Stopped) {
            pending = Vec::new();
        } else {
            pending.drain(..at);
        }
        self.pending = pending;
        seen
    }

    fn message(&mut self, kind: u8, body: &[u8], seen: &mut Seen) -> Result<(), Malformed> {
        let mut fields = Fields(body);
        match kind {
            b'Q' => {
                seen.traffic.round_trips += 1;
                if self.record {
                    let sql = fields.string()?;
                    seen.statements.push(Statement { sql, types: Vec::new(), formats: Vec::new(), values: Vec::new() });
                }
            }
            b'S' => {
                if self.batch_has_work {
                    seen.traffic.round_trips += 1;
                } else if self.batch_has_close {
                    seen.traffic.close_batches += 1;
                }
                self.batch_has_work = false;
                self.batch_has_close = false;
            }
            b'C' => self.batch_has_close = true,
            b'P' => {
                seen.traffic.parses += 1;
                self.batch_has_work = true;
                if self.record {
                    let name = fields.string()?;
                    let sql = fields.string()?;
                    let types = (0..fields.count()?).map(|_| fields.oid()).collect::<Result<_, _>>()?;
                    self.prepared.insert(name, (sql, types));
                }
            }
            b'B' => {
                self.batch_has_work = true;
                if self.record {
                    let _portal = fields.string()?;
                    let name = fields.string()?;
                    let formats = (0..fields.count()?).map(|_| fields.int16()).collect::<Result<_, _>>()?;
                    let values = (0..fields.count()?).map(|_| fields.value()).collect::<Result<_, _>>()?;
                    if let Some((sql, types)) = self.prepared.get(&name) {
                        seen.statements.push(Statement { sql: sql.clone(), types: types.clone(), formats, values });
                    }
                }
            }
            // Terminate, password and copy data do not start a batch.
            b'X' | b'p' | b'd' | b'c' | b'f' => {}
            _ => self.batch_has_work = true,
        }
        Ok(())
    }
}

/// A startup-phase message, by its length and code.
#[derive(Debug, PartialEq, Eq)]
enum Untyped {
    Incomplete,
    /// An SSL or GSS encryption request, this long.
    Encryption(usize),
    Cancel(usize),
    Startup(usize),
    DirectTls,
    Malformed,
}

fn untyped(bytes: &[u8]) -> Untyped {
    if bytes.first() == Some(&TLS_HANDSHAKE) {
        return Untyped::DirectTls;
    }
    let Some(&[a, b, c, d, e, f, g, h]) = bytes.get(..8) else { return Untyped::Incomplete };
    let length = u32::from_be_bytes([a, b, c, d]) as usize;
    if !(8..=MAX_STARTUP).contains(&length) {
        return Untyped::Malformed;
    }
    if bytes.len() < length {
        return Untyped::Incomplete;
    }
    match u32::from_be_bytes([e, f, g, h]) {
        SSL_REQUEST | GSS_REQUEST => Untyped::Encryption(length),
        CANCEL_REQUEST => Untyped::Cancel(length),
        _ => Untyped::Startup(length),
    }
}

/// A message's body, read field by field; running out is [`Malformed`].
struct Fields<'a>(&'a [u8]);

impl<'a> Fields<'a> {
    fn take(&mut self, count: usize) -> Result<&'a [u8], Malformed> {
        if count > self.0.len() {
            return Err(Malformed);
        }
        let (taken, rest) = self.0.split_at(count);
        self.0 = rest;
        Ok(taken)
    }

    fn string(&mut self) -> Result<String, Malformed> {
        let end = self.0.iter().position(|byte| *byte == 0).ok_or(Malformed)?;
        let text = String::from_utf8_lossy(self.take(end)?).into_owned();
        self.take(1)?;
        Ok(text)
    }

    fn int16(&mut self) -> Result<i16, Malformed> {
        let bytes = self.take(2)?.try_into().map_err(|_| Malformed)?;
        Ok(i16::from_be_bytes(bytes))
    }

    fn int32(&mut self) -> Result<i32, Malformed> {
        let bytes = self.take(4)?.try_into().map_err(|_| Malformed)?;
        Ok(i32::from_be_bytes(bytes))
    }

    /// How many of something follow.
    fn count(&mut self) -> Result<usize, Malformed> {
        usize::try_from(self.int16()?).map_err(|_| Malformed)
    }

    fn oid(&mut self) -> Result<u32, Malformed> {
        let bytes = self.take(4)?.try_into().map_err(|_| Malformed)?;
        Ok(u32::from_be_bytes(bytes))
    }

    /// A bound value: its length, -1 for NULL, then its bytes.
    fn value(&mut self) -> Result<Option<Vec<u8>>, Malformed> {
        match usize::try_from(self.int32()?) {
            Ok(length) => Ok(Some(self.take(length)?.to_vec())),
            Err(_) => Ok(None),
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub(in crate::wire_proxy) fn message(kind: u8, body: &[u8]) -> Vec<u8> {
        let mut message = vec![kind];
        message.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
        message.extend_from_slice(body);
        message
    }

    pub(in crate::wire_proxy) fn request(code: u32) -> Vec<u8> {
        let mut request = 8_u32.to_be_bytes().to_vec();
        request.extend_from_slice(&code.to_be_bytes());
        request
    }

    pub(in crate::wire_proxy) const STARTUP: [u8; 12] = [0, 0, 0, 12, 0, 3, 0, 0, b'u', 0, b'x', 0];

    fn recording() -> Frontend {
        Frontend::new(Options { record_statements: true, ..Options::default() })
    }

    fn traffic(round_trips: u64, close_batches: u64, parses: u64) -> Traffic {
        Traffic { round_trips, close_batches, parses, connections: 0 }
    }

    /// Feeds each read in turn and adds up what was seen.
    fn feed_all<'a>(frontend: &mut Frontend, reads: impl IntoIterator<Item = &'a [u8]>) -> Seen {
        let mut total = Seen::default();
        for read in reads {
            let seen = frontend.feed(read);
            total.traffic.round_trips += seen.traffic.round_trips;
            total.traffic.close_batches += seen.traffic.close_batches;
            total.traffic.parses += seen.traffic.parses;
            total.statements.extend(seen.statements);
            total.refused += seen.refused;
            total.asked_server |= seen.asked_server;
            total.close |= seen.close;
        }
        total
    }

    /// The batch our store sends for one statement: Parse, Bind, Describe,
    /// Execute and Sync, unnamed.
    pub(in crate::wire_proxy) fn unnamed_batch() -> Vec<u8> {
        let mut parse = b"\0SELECT $1::int8, $2::text\0".to_vec();
        parse.extend_from_slice(&2_i16.to_be_bytes());
        parse.extend_from_slice(&20_u32.to_be_bytes());
        parse.extend_from_slice(&25_u32.to_be_bytes());
        let mut bind = b"\0\0".to_vec();
        bind.extend_from_slice(&1_i16.to_be_bytes());
        bind.extend_from_slice(&1_i16.to_be_bytes());
        bind.extend_from_slice(&2_i16.to_be_bytes());
        bind.extend_from_slice(&8_i32.to_be_bytes());
        bind.extend_from_slice(&7_i64.to_be_bytes());
        bind.extend_from_slice(&(-1_i32).to_be_bytes());
        bind.extend_from_slice(&0_i16.to_be_bytes());
        [
            message(b'P', &parse),
            message(b'B', &bind),
            message(b'D', b"P\0"),
            message(b'E', b"\0\0\0\0\0"),
            message(b'S', b""),
        ]
        .concat()
    }

    #[test]
    fn a_simple_query_is_one_round_trip_and_its_text() {
        let mut frontend = recording();
        let seen = feed_all(&mut frontend, [&STARTUP[..], &message(b'Q', b"BEGIN\0")]);
        assert_eq!(seen.traffic, traffic(1, 0, 0));
        assert_eq!(
            seen.statements,
            [Statement { sql: "BEGIN".to_owned(), types: Vec::new(), formats: Vec::new(), values: Vec::new() }]
        );
    }

    /// An unnamed statement as our store sends it is one round trip with
    /// its own Parse, recorded with its declared types and bound values.
    #[test]
    fn an_extended_batch_is_one_round_trip_with_its_parse_and_values() {
        let mut frontend = recording();
        let batch = unnamed_batch();
        let seen = feed_all(&mut frontend, [&STARTUP[..], &batch, &batch]);
        assert_eq!(seen.traffic, traffic(2, 0, 2));
        let statement = Statement {
            sql: "SELECT $1::int8, $2::text".to_owned(),
            types: vec![20, 25],
            formats: vec![1],
            values: vec![Some(7_i64.to_be_bytes().to_vec()), None],
        };
        assert_eq!(seen.statements, [statement.clone(), statement.clone()]);
        assert_eq!((statement.format_of(0), statement.format_of(1)), (1, 1));
    }

    #[test]
    fn a_batch_of_closes_only_is_not_a_round_trip() {
        let mut frontend = recording();
        let closes = [message(b'C', b"Ss1\0"), message(b'C', b"Ss2\0"), message(b'S', b"")].concat();
        let seen = feed_all(&mut frontend, [&STARTUP[..], &closes]);
        assert_eq!(seen.traffic, traffic(0, 1, 0));
        assert!(seen.statements.is_empty());
    }

    /// Prepared, executed, closed, then a simple query, with the encryption
    /// request the server refused in front, fed three bytes at a time.
    #[test]
    fn messages_split_across_reads_are_counted_whole() {
        let mut frontend = recording();
        let mut stream = request(SSL_REQUEST);
        stream.extend_from_slice(&STARTUP);
        for part in [
            message(b'P', b"s\0SELECT 1\0\0\0"),
            message(b'D', b"Ss\0"),
            message(b'S', b""),
            message(b'B', b"\0s\0\0\0\0\0\0\0"),
            message(b'E', b"\0\0\0\0\0"),
            message(b'S', b""),
            message(b'C', b"Ss\0"),
            message(b'S', b""),
            message(b'Q', b"COMMIT\0"),
        ] {
            stream.extend(part);
        }
        let seen = feed_all(&mut frontend, stream.chunks(3));
        assert_eq!(seen.traffic, traffic(3, 1, 1));
        let sql: Vec<_> = seen.statements.iter().map(|s| s.sql.as_str()).collect();
        assert_eq!(sql, ["SELECT 1", "COMMIT"]);
        assert!(seen.asked_server, "the request went on to the server");
    }

    /// Refusing, the proxy keeps a request from the server and owes the
    /// client an `N`; the startup message, once whole, passes with whatever
    /// followed it in the same read.
    #[test]
    fn an_encryption_request_refused_is_answered_not_forwarded() {
        let mut frontend = Frontend::new(Options { refuse_encryption: true, ..Options::default() });
        let sent = request(GSS_REQUEST);
        let (head, tail) = sent.split_at(5);
        assert_eq!(frontend.feed(head), Seen { forward: Some(Vec::new()), ..Seen::default() });
        assert_eq!(frontend.feed(tail), Seen { forward: Some(Vec::new()), refused: 1, ..Seen::default() });
        let query = message(b'Q', b"SELECT 1\0");
        let then = [&request(SSL_REQUEST)[..], &STARTUP, &query[..4]].concat();
        let seen = frontend.feed(&then);
        assert_eq!(seen.refused, 1);
        assert_eq!(seen.forward.as_deref(), Some(&then[8..]));
        let seen = frontend.feed(&query[4..]);
        assert_eq!(seen.forward, None, "past the startup, reads pass as they are");
        assert_eq!(seen.traffic, traffic(1, 0, 0));
    }

    #[test]
    fn a_direct_tls_handshake_is_closed_when_refusing_and_passed_unread_otherwise() {
        let hello = [TLS_HANDSHAKE, 3, 1, 0, 200, 1, 0, 0, 196];
        let mut refusing = Frontend::new(Options { refuse_encryption: true, ..Options::default() });
        assert!(refusing.feed(&hello).close);
        let mut passing = recording();
        assert_eq!(passing.feed(&hello), Seen::default());
        assert_eq!(passing.feed(&[&STARTUP[..], &message(b'Q', b"SELECT 1\0")].concat()), Seen::default());
    }

    /// Granted encryption, the connection's bytes are never read again,
    /// even where they would parse.
    #[test]
    fn nothing_is_read_once_the_server_grants_encryption() {
        let mut frontend = recording();
        assert!(frontend.feed(&request(SSL_REQUEST)).asked_server);
        frontend.encrypted();
        let looks_like_messages = [&STARTUP[..], &message(b'Q', b"SELECT 1\0")].concat();
        assert_eq!(frontend.feed(&looks_like_messages), Seen::default());
    }

    #[test]
    fn a_malformed_message_stops_reading_without_a_panic() {
        let mut short_length = recording();
        let bad = [&STARTUP[..], &[b'Q', 0, 0, 0, 2], &message(b'Q', b"SELECT 1\0")].concat();
        assert_eq!(short_length.feed(&bad), Seen::default());

        let mut unterminated = recording();
        let bad = [&STARTUP[..], &message(b'Q', b"SELECT 1"), &message(b'Q', b"SELECT 2\0")].concat();
        let seen = unterminated.feed(&bad);
        assert_eq!(seen.traffic, traffic(1, 0, 0), "counted, then nothing more");
        assert!(seen.statements.is_empty());

        let mut short_bind = recording();
        let parse = message(b'P', b"\0SELECT 1\0\0\0");
        let bind = message(b'B', &[0, 0, 0, 0, 0, 1, 0, 0, 0, 9, 1]);
        assert!(short_bind.feed(&[&STARTUP[..], &parse, &bind].concat()).statements.is_empty());
        assert_eq!(short_bind.feed(&message(b'Q', b"SELECT 2\0")), Seen::default());

        let mut bad_startup = recording();
        assert_eq!(bad_startup.feed(&[0, 0, 0, 4, 0, 3, 0, 0]), Seen::default());
    }
}
