//! TOAST compression of the log's payloads: `lz4` against PostgreSQL's
//! default `pglz` for `adk_events.payload`, on events like an agent's of
//! about 4 KB of JSON each (the seed's figure): a user's question, the
//! model's tool call, the tool's output (JSON search results or a file of
//! code) and the model's answer in prose with markdown, over and over.
//!
//! Two fresh databases, one a method, with the method set on the column of
//! `adk_events` and of every partition (as migration 000028 sets lz4). Both
//! receive the same events through the adk trait (our `PgSessionService`,
//! as the bound service role acting per request, as the rest of the bench
//! runs it), round by round and in alternating order, so a slow spell on
//! the shared machine falls on both; then each reads its sessions back,
//! 40 events each. The figures compared are ratios within the run:
//! timings here are noisy, sizes are not.
//!
//! The text is made from a vocabulary drawn with Zipf-like frequencies,
//! with numbers, ids, URLs and hashes in it, so that it compresses about
//! as prose and code do, not as a repeated phrase would.

use std::ops::RangeInclusive;
use std::sync::Arc;
use std::time::{Duration, Instant};

use adk_core::identity::{AdkIdentity, AppName, SessionId, UserId};
use adk_core::{Content, FunctionResponseData, Part};
use adk_postgres_adk::PgSessionService;
use adk_postgres_domain::StoreConfig;
use adk_postgres_storage::{PgSessionStore, TenantScope};
use adk_session::{AppendEventRequest, CreateRequest, Event, GetRequest, SessionService};
use anyhow::{Context as _, anyhow, ensure};
use chrono::NaiveDate;
use serde::Serialize;
use serde_json::{Value, json};
use tokio_postgres::Client;

use crate::driver::pool_config;
use crate::measure::{Latency, Sample, median};
use crate::report::ratio;
use crate::run::{bound_service_url, log, migrate_ours};
use crate::server::{Server, connect, human_bytes};
use crate::workload::{APP, EVENTS_PER_SESSION, initial_state};

/// Repetitions of one run.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct ToastPlan {
    pub rounds: usize,
    /// Sessions of `EVENTS_PER_SESSION` events each method receives per round.
    pub sessions: usize,
    /// Gets of a whole session per method and round.
    pub gets: usize,
    /// Scans detoasting every stored payload, per method, after the rounds.
    pub scans: usize,
}

/// The compression method of `adk_events.payload`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Method {
    Pglz,
    Lz4,
}

impl Method {
    pub fn label(self) -> &'static str {
        match self {
            Method::Pglz => "pglz",
            Method::Lz4 => "lz4",
        }
    }

    fn database(self) -> &'static str {
        match self {
            Method::Pglz => "adk_bench_toast_pglz",
            Method::Lz4 => "adk_bench_toast_lz4",
        }
    }
}

/// What one method measured.
#[derive(Debug, Clone, Serialize)]
pub struct MethodFigures {
    pub method: Method,
    pub events: i64,
    /// Mean size of an event's JSON as text.
    pub json_bytes_per_event: f64,
    /// Mean stored size of an event's payload (`pg_column_size`, after
    /// compression, inline or out of line).
    pub stored_bytes_per_event: f64,
    /// Payloads stored compressed (`pg_column_compression` not NULL): pglz
    /// gives up on a value whose first kilobyte it cannot shrink.
    pub compressed_events: i64,
    /// Of those, compressed with this leg's method (the rest: none other
    /// should be there).
    pub compressed_with_method: i64,
    /// `pg_table_size` of every partition (heap, TOAST, free space and
    /// visibility maps; no index).
    pub table_bytes: i64,
    /// `pg_total_relation_size` of every partition: with the indexes,
    /// which hold no payload and are the same for both methods.
    pub total_bytes: i64,
    /// One append through the adk trait.
    pub append: Latency,
    /// A get of a whole session (40 events) through the adk trait.
    pub get: Latency,
    /// Median time of one scan reading every payload on the server
    /// (detoast and decompress, no transfer).
    pub scan_ms: f64,
}

/// lz4's figures over pglz's (below 1: lz4 smaller or faster, except
/// `append_ops`, where above 1 is faster).
#[derive(Debug, Clone, Serialize)]
pub struct Lz4OverPglz {
    pub stored_bytes: Option<f64>,
    pub table_bytes: Option<f64>,
    pub total_bytes: Option<f64>,
    pub append_ops: Option<f64>,
    pub append_p50: Option<f64>,
    pub get_p50: Option<f64>,
    pub scan: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ToastReport {
    pub plan: ToastPlan,
    pub methods: Vec<MethodFigures>,
    pub lz4_over_pglz: Lz4OverPglz,
    pub elapsed_secs: f64,
}

/// Whether the server was built with lz4 (`--with-lz4`).
pub async fn server_has_lz4(sql: &Client) -> anyhow::Result<bool> {
    Ok(sql
        .query_one(
            "SELECT 'lz4' = ANY (enumvals) FROM pg_catalog.pg_settings WHERE name = 'default_toast_compression'",
            &[],
        )
        .await?
        .get(0))
}

/// Sets `payload`'s compression on `adk_events` and every partition it has
/// (PostgreSQL 15 does not recurse; partitions made later take the
/// parent's).
async fn set_compression(sql: &Client, method: Method) -> anyhow::Result<()> {
    sql.batch_execute(&format!(
        "DO $$ DECLARE part regclass; BEGIN
           ALTER TABLE adk_events ALTER COLUMN payload SET COMPRESSION {m};
           FOR part IN SELECT inhrelid::regclass FROM pg_inherits WHERE inhparent = 'adk_events'::regclass LOOP
             EXECUTE format('ALTER TABLE %s ALTER COLUMN payload SET COMPRESSION {m}', part);
           END LOOP; END $$",
        m = method.label()
    ))
    .await
    .with_context(|| format!("setting {} on adk_events.payload", method.label()))?;
    let other: i64 = sql
        .query_one(
            "SELECT count(*) FROM pg_attribute
              WHERE attname = 'payload' AND attcompression <> $1::\"char\"
                AND attrelid IN (SELECT relid FROM pg_partition_tree('adk_events'))",
            &[&(method.label().as_bytes()[0] as i8)],
        )
        .await?
        .get(0);
    ensure!(other == 0, "{other} of adk_events' tables do not compress payload with {}", method.label());
    Ok(())
}

/// One method's service and the owner's connection to its database.
struct Leg {
    method: Method,
    service: Arc<dyn SessionService>,
    sql: Client,
    appends: Sample,
    gets: Sample,
}

impl Leg {
    async fn open(server: &Server, method: Method, today: NaiveDate) -> anyhow::Result<Self> {
        let url = server.fresh_database(method.database()).await?;
        migrate_ours(&url, today).await?;
        let sql = connect(&url).await?;
        set_compression(&sql, method).await?;
        let store = PgSessionStore::connect(&bound_service_url(&url).await?, &pool_config(), StoreConfig::default())
            .await
            .context("connecting our store")?
            .with_tenant_scope(TenantScope::PerRequest);
        let service: Arc<dyn SessionService> = Arc::new(PgSessionService::from_store(store));
        Ok(Self { method, service, sql, appends: Sample::default(), gets: Sample::default() })
    }

    /// Creates `session` and appends its conversation, timing each append.
    async fn write(&mut self, session: usize) -> anyhow::Result<(u64, Duration)> {
        let (user, id) = names(session);
        self.service
            .create(CreateRequest {
                app_name: APP.to_owned(),
                user_id: user.clone(),
                session_id: Some(id.clone()),
                state: initial_state(),
            })
            .await
            .map_err(|e| anyhow!("create {id} ({}): {e}", self.method.label()))?;
        let identity = AdkIdentity {
            app_name: AppName::try_from(APP)?,
            user_id: UserId::try_from(user.as_str())?,
            session_id: SessionId::try_from(id.as_str())?,
        };
        let mut elapsed = Duration::ZERO;
        for n in 0..EVENTS_PER_SESSION {
            let event = agent_event(session, n);
            let began = Instant::now();
            self.service
                .append_event_for_identity(AppendEventRequest { identity: identity.clone(), event })
                .await
                .map_err(|e| anyhow!("append to {id} ({}): {e}", self.method.label()))?;
            let took = began.elapsed();
            self.appends.record(took);
            elapsed += took;
        }
        Ok((EVENTS_PER_SESSION as u64, elapsed))
    }

    async fn get(&self, session: usize) -> anyhow::Result<(Duration, usize)> {
        let (user, id) = names(session);
        let began = Instant::now();
        let loaded = self
            .service
            .get(GetRequest {
                app_name: APP.to_owned(),
                user_id: user,
                session_id: id.clone(),
                num_recent_events: None,
                after: None,
            })
            .await
            .map_err(|e| anyhow!("get {id} ({}): {e}", self.method.label()))?;
        Ok((began.elapsed(), loaded.events().len()))
    }

    async fn scan(&self) -> anyhow::Result<Duration> {
        let began = Instant::now();
        // `?` reads the whole value: every payload is detoasted and
        // decompressed; none has the key.
        let found: i64 = self
            .sql
            .query_one("SELECT count(*) FROM adk_events WHERE payload ? 'adk-bench-no-such-key'", &[])
            .await?
            .get(0);
        ensure!(found == 0, "a payload has the probe key");
        Ok(began.elapsed())
    }

    async fn figures(&self, scans: usize) -> anyhow::Result<MethodFigures> {
        let row = self
            .sql
            .query_one(
                "SELECT count(*),
                        coalesce(avg(octet_length(payload::text)), 0)::float8,
                        coalesce(avg(pg_column_size(payload)), 0)::float8,
                        count(pg_column_compression(payload)),
                        count(*) FILTER (WHERE pg_column_compression(payload) = $1),
                        (SELECT sum(pg_table_size(relid))::bigint FROM pg_partition_tree('adk_events')),
                        (SELECT sum(pg_total_relation_size(relid))::bigint FROM pg_partition_tree('adk_events'))
                   FROM adk_events",
                &[&self.method.label()],
            )
            .await?;
        // One scan untimed, to read the tables into the cache.
        self.scan().await?;
        let mut times = Vec::with_capacity(scans);
        for _ in 0..scans {
            times.push(self.scan().await?.as_secs_f64() * 1000.0);
        }
        Ok(MethodFigures {
            method: self.method,
            events: row.get(0),
            json_bytes_per_event: row.get(1),
            stored_bytes_per_event: row.get(2),
            compressed_events: row.get(3),
            compressed_with_method: row.get(4),
            table_bytes: row.get(5),
            total_bytes: row.get(6),
            append: self.appends.summary(),
            get: self.gets.summary(),
            scan_ms: median(&mut times).unwrap_or(0.0),
        })
    }
}

fn names(session: usize) -> (String, String) {
    (format!("toast-u-{session}"), format!("toast-{session}"))
}

/// Measures both methods on databases of their own on `server`; `None`
/// when the server has no lz4.
pub async fn measure(server: &Server, today: NaiveDate, plan: ToastPlan) -> anyhow::Result<Option<ToastReport>> {
    let began = Instant::now();
    if !server_has_lz4(&connect(server.admin_url()).await?).await? {
        return Ok(None);
    }
    let mut legs = Vec::new();
    for method in [Method::Pglz, Method::Lz4] {
        legs.push(Leg::open(server, method, today).await?);
    }
    for round in 0..plan.rounds {
        log(format!(
            "toast: round {}/{}, {} sessions of {EVENTS_PER_SESSION} events per method, pglz vs lz4",
            round + 1,
            plan.rounds,
            plan.sessions
        ));
        let sessions: Vec<usize> = (round * plan.sessions..(round + 1) * plan.sessions).collect();
        // Alternate which method goes first, session by session.
        let mut rounds = vec![(0, Duration::ZERO); legs.len()];
        for (i, &session) in sessions.iter().enumerate() {
            let order: Vec<usize> = if (round + i) % 2 == 0 { vec![0, 1] } else { vec![1, 0] };
            for leg in order {
                let (ops, elapsed) = legs[leg].write(session).await?;
                rounds[leg].0 += ops;
                rounds[leg].1 += elapsed;
            }
        }
        for (leg, (ops, elapsed)) in legs.iter_mut().zip(rounds) {
            leg.appends.end_round(ops, elapsed);
        }
        let order: Vec<usize> = if round % 2 == 0 { vec![0, 1] } else { vec![1, 0] };
        for leg in order {
            let leg = &mut legs[leg];
            // The first read checks what came back and warms the caches.
            for &session in &sessions {
                let (_, events) = leg.get(session).await?;
                ensure!(events == EVENTS_PER_SESSION, "{} read {events} events", leg.method.label());
            }
            let mut sample = Sample::default();
            let mut elapsed = Duration::ZERO;
            for i in 0..plan.gets {
                let (took, _) = leg.get(sessions[i % sessions.len()]).await?;
                sample.record(took);
                elapsed += took;
            }
            sample.end_round(plan.gets as u64, elapsed);
            leg.gets.merge(&sample);
        }
    }
    let mut methods = Vec::new();
    for leg in &legs {
        methods.push(leg.figures(plan.scans).await?);
    }
    drop(legs);
    for method in [Method::Pglz, Method::Lz4] {
        server.drop_database(method.database()).await?;
    }
    let (pglz, lz4) = (&methods[0], &methods[1]);
    // The same events (their times aside, which JSON spells in more or
    // fewer digits).
    ensure!(
        pglz.events == lz4.events && (pglz.json_bytes_per_event - lz4.json_bytes_per_event).abs() < 8.0,
        "the two methods stored different events: {pglz:?} against {lz4:?}"
    );
    let lz4_over_pglz = Lz4OverPglz {
        stored_bytes: ratio(lz4.stored_bytes_per_event, pglz.stored_bytes_per_event),
        table_bytes: ratio(lz4.table_bytes as f64, pglz.table_bytes as f64),
        total_bytes: ratio(lz4.total_bytes as f64, pglz.total_bytes as f64),
        append_ops: ratio(lz4.append.ops_per_sec, pglz.append.ops_per_sec),
        append_p50: ratio(lz4.append.p50_ms, pglz.append.p50_ms),
        get_p50: ratio(lz4.get.p50_ms, pglz.get.p50_ms),
        scan: ratio(lz4.scan_ms, pglz.scan_ms),
    };
    Ok(Some(ToastReport { plan, methods, lz4_over_pglz, elapsed_secs: began.elapsed().as_secs_f64() }))
}

impl std::fmt::Display for ToastReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let first = &self.methods[0];
        writeln!(
            f,
            "TOAST compression of adk_events.payload, pglz (PostgreSQL's default) vs lz4: {} events of an agent's \
             conversations per method ({:.0} bytes of JSON each on average: questions, tool calls, search results \
             and code, answers), appended and read through the adk trait, {} round(s) alternating; stored: mean \
             pg_column_size of a payload; tables: every partition's heap and TOAST; with indexes: and their \
             indexes; scan: median of {} server-side reads of every payload:",
            first.events, first.json_bytes_per_event, self.plan.rounds, self.plan.scans
        )?;
        writeln!(
            f,
            "    {:<6} {:>8} {:>12} {:>10} {:>13} {:>10} {:>13} {:>12} {:>10}",
            "method",
            "stored",
            "compressed",
            "tables",
            "with indexes",
            "append/s",
            "append p50 ms",
            "get-40 p50 ms",
            "scan ms"
        )?;
        for m in &self.methods {
            writeln!(
                f,
                "    {:<6} {:>8} {:>12} {:>10} {:>13} {:>10.0} {:>13.2} {:>12.2} {:>10.1}",
                m.method.label(),
                human_bytes(m.stored_bytes_per_event),
                format!("{}/{}", m.compressed_events, m.events),
                human_bytes(m.table_bytes as f64),
                human_bytes(m.total_bytes as f64),
                m.append.ops_per_sec,
                m.append.p50_ms,
                m.get.p50_ms,
                m.scan_ms
            )?;
        }
        let r = &self.lz4_over_pglz;
        let x = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.3}x"));
        writeln!(
            f,
            "    lz4/pglz: stored {}, tables {}, with indexes {}, append/s {}, append p50 {}, get-40 p50 {}, scan {}",
            x(r.stored_bytes),
            x(r.table_bytes),
            x(r.total_bytes),
            x(r.append_ops),
            x(r.append_p50),
            x(r.get_p50),
            x(r.scan)
        )?;
        write!(f, "  took {:.0} s", self.elapsed_secs)
    }
}

// The agent's events.

/// xorshift64*: the same events on every run and in both databases.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn between(&mut self, low: usize, high: usize) -> usize {
        low + self.below(high - low + 1)
    }

    /// An index into a list of `n` drawn with Zipf-like frequencies (the
    /// first words far more often than the last), as words are in prose.
    fn zipf(&mut self, n: usize) -> usize {
        let u = (self.next() >> 11) as f64 / (1u64 << 53) as f64;
        ((n as f64 + 1.0).powf(u) as usize).saturating_sub(1).min(n - 1)
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }

    fn hex(&mut self, digits: usize) -> String {
        let mut out = String::with_capacity(digits);
        while out.len() < digits {
            out.push_str(&format!("{:016x}", self.next()));
        }
        out.truncate(digits);
        out
    }
}

/// Common words first: the order sets their frequencies.
const WORDS: &str = "the of and to a in is that for it as with on be this are by you your can we not or from at \
    have an will if which was but all their more one has also when they there so do what about been would \
    order orders customer account delivery shipping refund payment invoice price prices team support service \
    data report reports search results result query source sources page pages document documents model tool \
    tools agent session sessions user users request requests response error errors time days week month \
    question answer summary update updates change changes issue issues plan plans policy policies product \
    products feature features release version versions file files code function table tables index database \
    server servers cluster latency throughput memory storage partition partitions retention backup cost costs \
    first last next new other same different most many some each every only still just already however \
    because while after before during between within without through across under over against into onto \
    check confirm review compare explain describe suggest recommend consider include exclude provide return \
    shows found found seems looks needs helps makes takes gives keeps moves starts ends runs uses reads writes \
    quickly clearly usually often rarely probably likely exactly roughly nearly recently currently finally \
    important useful possible available recent current previous similar specific general detailed simple \
    complex large small high low fast slow safe risky open closed pending active expired stable \
    london berlin paris tokyo madrid chicago toronto sydney dublin lisbon warehouse courier carrier \
    monday tuesday wednesday thursday friday morning afternoon evening tomorrow yesterday quarter annual \
    contract contracts vendor vendors budget forecast revenue margin growth churn pipeline migration \
    deployment incident outage rollback dashboard metric metrics alert alerts threshold schedule window";

const DOMAINS: [&str; 8] = [
    "docs.example.com",
    "support.example.org",
    "en.wikipedia.org",
    "github.com",
    "news.example.net",
    "blog.example.io",
    "status.example.com",
    "kb.example.co.uk",
];

fn words() -> Vec<&'static str> {
    WORDS.split_whitespace().collect()
}

/// Some sentences of prose (between the bounds of `sentences`), with the
/// odd number, date or id in them.
fn prose(rng: &mut Rng, vocabulary: &[&str], sentences: RangeInclusive<usize>) -> String {
    let mut text = String::new();
    for _ in 0..rng.between(*sentences.start(), *sentences.end()) {
        let length = rng.between(7, 24);
        for i in 0..length {
            if i > 0 {
                text.push(if rng.below(9) == 0 { ',' } else { ' ' });
                if text.ends_with(',') {
                    text.push(' ');
                }
            }
            let word = match rng.below(30) {
                0 => format!("{}", rng.between(2, 9_999)),
                1 => format!("#{}", rng.between(100_000, 999_999)),
                2 => format!("2026-{:02}-{:02}", rng.between(1, 12), rng.between(1, 28)),
                3 => format!("{}.{:02}", rng.between(1, 900), rng.below(100)),
                _ => vocabulary[rng.zipf(vocabulary.len())].to_owned(),
            };
            if i == 0 {
                let mut chars = word.chars();
                if let Some(c) = chars.next() {
                    text.extend(c.to_uppercase());
                    text.push_str(chars.as_str());
                }
            } else {
                text.push_str(&word);
            }
        }
        text.push_str(if rng.below(8) == 0 { "? " } else { ". " });
    }
    text.truncate(text.trim_end().len());
    text
}

/// A file of code a tool read (between the bounds of `lines` long):
/// functions with their own names and numbers.
fn code(rng: &mut Rng, vocabulary: &[&str], lines: RangeInclusive<usize>) -> String {
    let lines = rng.between(*lines.start(), *lines.end());
    const TYPES: [&str; 8] = ["u64", "String", "Option<u32>", "Vec<Event>", "&str", "bool", "Duration", "Result<()>"];
    let ident = |rng: &mut Rng| {
        format!("{}_{}", vocabulary[rng.zipf(vocabulary.len())], vocabulary[rng.zipf(vocabulary.len())])
            .replace(['#', '-', '.', ','], "")
    };
    let mut text = String::new();
    while text.lines().count() < lines {
        let name = ident(rng);
        let arg = ident(rng);
        text.push_str(&format!(
            "/// {}\npub fn {name}({arg}: {}) -> {} {{\n",
            prose(rng, vocabulary, 1..=1),
            rng.pick(&TYPES),
            rng.pick(&TYPES)
        ));
        for _ in 0..rng.between(2, 7) {
            let line = match rng.below(5) {
                0 => format!("    let {} = {arg}.{}()?;\n", ident(rng), ident(rng)),
                1 => {
                    format!("    if {} > {} {{ return Err(Error::{}); }}\n", ident(rng), rng.below(10_000), ident(rng))
                }
                2 => format!(
                    "    for item in {}.iter().take({}) {{ total += item.{}; }}\n",
                    ident(rng),
                    rng.below(500),
                    ident(rng)
                ),
                3 => format!("    tracing::debug!({} = %{arg}, \"{}\");\n", ident(rng), prose(rng, vocabulary, 1..=1)),
                _ => format!("    {}.insert({:?}, {});\n", ident(rng), rng.hex(8), rng.below(1_000_000)),
            };
            text.push_str(&line);
        }
        text.push_str("}\n\n");
    }
    text
}

/// A search tool's results.
fn search_results(rng: &mut Rng, vocabulary: &[&str], query: &str) -> Value {
    let results: Vec<Value> = (0..rng.between(7, 11))
        .map(|_| {
            let title = prose(rng, vocabulary, 1..=1);
            let slug = title.to_lowercase().replace(|c: char| !c.is_ascii_alphanumeric(), "-");
            json!({
                "title": title,
                "url": format!("https://{}/{}-{}", rng.pick(&DOMAINS), &slug[..slug.len().min(40)], rng.hex(6)),
                "snippet": prose(rng, vocabulary, 3..=6),
                "score": (rng.below(10_000) as f64) / 10_000.0,
                "published": format!("2026-{:02}-{:02}T{:02}:{:02}:00Z", rng.between(1, 12), rng.between(1, 28), rng.below(24), rng.below(60)),
                "id": rng.hex(16),
            })
        })
        .collect();
    json!({"query": query, "total": rng.between(40, 90_000), "took_ms": rng.between(20, 900), "results": results})
}

/// Event `n` of session `session`: in turn a user's question, the model's
/// tool call, the tool's output, the model's answer.
pub fn agent_event(session: usize, n: usize) -> Event {
    let vocabulary = words();
    let mut rng = Rng::new(((session as u64) << 16) ^ n as u64);
    let turn = n / 4;
    let mut event = Event::new(format!("inv-{session}-{turn}"));
    // Its own id, the same in both databases (a UUID's length).
    let id = rng.hex(32);
    event.id = format!("{}-{}-{}-{}-{}", &id[..8], &id[8..12], &id[12..16], &id[16..20], &id[20..]);
    let call_id = format!("call_{}", rng.hex(24));
    let tool = if turn % 3 == 2 { "read_file" } else { "web_search" };
    let (author, role, parts) = match n % 4 {
        0 => ("user", "user", vec![Part::Text { text: prose(&mut rng, &vocabulary, 4..=10) }]),
        1 => {
            let args = if tool == "read_file" {
                json!({"path": format!("src/{}/{}.rs", rng.pick(&vocabulary), rng.pick(&vocabulary)), "max_lines": 400})
            } else {
                json!({"query": prose(&mut rng, &vocabulary, 1..=1), "top_k": 8, "recency_days": rng.between(7, 365)})
            };
            let thinking = prose(&mut rng, &vocabulary, 16..=30);
            (
                "assistant",
                "model",
                vec![
                    Part::Thinking { thinking, signature: Some(rng.hex(96)) },
                    Part::FunctionCall {
                        name: tool.to_owned(),
                        args,
                        id: Some(call_id.clone()),
                        thought_signature: None,
                    },
                ],
            )
        }
        2 => {
            let response = if tool == "read_file" {
                json!({"path": "src/lib.rs", "content": code(&mut rng, &vocabulary, 150..=230)})
            } else {
                let query = prose(&mut rng, &vocabulary, 1..=1);
                search_results(&mut rng, &vocabulary, &query)
            };
            (
                "assistant",
                "function",
                vec![Part::FunctionResponse {
                    function_response: FunctionResponseData::new(tool, response),
                    id: Some(call_id.clone()),
                    annotations: None,
                }],
            )
        }
        _ => {
            let mut answer = String::new();
            for i in 0..rng.between(6, 10) {
                if i > 0 {
                    answer.push_str("\n\n");
                }
                if rng.below(3) == 0 {
                    answer.push_str(&format!("**{}**\n", prose(&mut rng, &vocabulary, 1..=1)));
                }
                if rng.below(2) == 0 {
                    for _ in 0..rng.between(2, 5) {
                        answer.push_str(&format!("- {}\n", prose(&mut rng, &vocabulary, 1..=1)));
                    }
                } else {
                    answer.push_str(&prose(&mut rng, &vocabulary, 4..=9));
                }
            }
            ("assistant", "model", vec![Part::Text { text: answer }])
        }
    };
    event.author = author.to_owned();
    event.llm_response.content = Some(Content { role: role.to_owned(), parts });
    event.llm_response.turn_complete = n % 4 == 3;
    event.actions.state_delta.insert("turn".to_owned(), json!(turn));
    event
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_about_four_kilobytes_of_json_and_differ() {
        let sizes: Vec<usize> =
            (0..EVENTS_PER_SESSION).map(|n| serde_json::to_vec(&agent_event(1, n)).expect("json").len()).collect();
        let mean = sizes.iter().sum::<usize>() / sizes.len();
        eprintln!("event JSON sizes: mean {mean}, {sizes:?}");
        assert!((3_000..=5_500).contains(&mean), "mean {mean} bytes: {sizes:?}");
        assert_ne!(
            serde_json::to_string(&agent_event(1, 3)).expect("json"),
            serde_json::to_string(&agent_event(2, 3)).expect("json")
        );
        // The same event in both databases, but for its time.
        assert_eq!(agent_event(7, 9).id, agent_event(7, 9).id);
        let content = |e: Event| serde_json::to_string(&e.llm_response.content).expect("json");
        assert_eq!(content(agent_event(7, 9)), content(agent_event(7, 9)));
    }
}
