//! Issue 37's "a page in one row" lever, measured: `page_shape URL ROUNDS`.
//!
//! The store returned a list page as one row per session and a get as a
//! header row then one row per event. This compares those shapes, through
//! the statements the store sends (unnamed, `query_typed`, binary results),
//! against the same reads returned in one row:
//!
//! - the get's events as one `jsonb[]` (`array`) or one `json` text
//!   (`json_agg`) instead of a row each;
//! - the list as one row of arrays, a column each (`arrays`), or as one
//!   `json` text of per-session arrays (`json_agg`), instead of a row each.
//!
//! The get's array is the store's `adk_read_session`; the list's arrays are
//! what the store's `adk_read_sessions` returns, without its filters. The
//! other variants are copies of the store's functions before them
//! (`adk_get_session`'s and `adk_list_sessions`' bodies then) and reshaped
//! copies, with the same tenant check, SET clauses and plans, installed
//! beside them in the database at URL, which the tool migrates and which
//! may be throwaway. Each call decodes what the store decodes: the list
//! into typed fields with state and labels as JSON values, the get's events
//! into one buffer plus spans, as `get_json` holds them (the adapter's
//! parse of each event, the same for every shape, is left out).
//!
//! Printed per variant: calls/s (median over rounds, shapes alternating
//! which goes first), the process's client CPU per call, and the bytes the
//! server sent per call, counted through a relay in an untimed pass.

use std::time::{Duration, Instant};

use adk_core::identity::{AdkIdentity, AppName, SessionId, UserId};
use adk_core::{Content, Event, Part};
use adk_session::{AppendEventRequest, CreateRequest, SessionService};
use anyhow::{Context as _, bail, ensure};
use chrono::{DateTime, Utc};
use rustix::time::{ClockId, clock_gettime};
use serde_json::Value;
use serde_json::value::RawValue;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::net::{TcpListener, TcpStream};
use tokio_postgres::types::{FromSql, ToSql, Type};
use tokio_postgres::{Client, NoTls, Row};

const APP: &str = "page-shape";
const CALL_SECONDS: f64 = 1.5;

fn cpu() -> Duration {
    let t = clock_gettime(ClockId::ProcessCPUTime);
    Duration::new(u64::try_from(t.tv_sec).unwrap_or(0), u32::try_from(t.tv_nsec).unwrap_or(0))
}

/// The variants, next to the store's functions. Their bodies are the
/// store's but for the shape of what they return.
const VARIANTS_SQL: &str = r#"
-- The store's get before adk_read_session, a row per event.
CREATE OR REPLACE FUNCTION page_shape_get_rows(p_tenant text, p_app_name text, p_user_id text, p_session_id text, p_after_ts bigint, p_limit bigint)
 RETURNS TABLE(state jsonb, last_seq bigint, session_day date, created_at timestamp with time zone, updated_at timestamp with time zone, expires_at timestamp with time zone, closed_at timestamp with time zone, successor_id text, display_name text, labels jsonb, user_state jsonb, app_state jsonb, payload jsonb)
 LANGUAGE plpgsql
 STABLE SECURITY DEFINER
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET search_path = pg_catalog, public, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    s record;
BEGIN
    IF NOT adk_tenant_allows(p_tenant, p_app_name) THEN
        RETURN;
    END IF;
    SELECT a.state, a.last_seq, a.session_day, a.created_at, a.updated_at, a.expires_at, a.closed_at,
           a.successor_id, a.display_name, a.labels,
           -- By the arguments, not correlated with the session row: Citus
           -- routes no statement with a correlated subquery to one shard.
           (SELECT us.state FROM adk_user_states us WHERE us.app_name = p_app_name AND us.user_id = p_user_id)
               AS user_state,
           (SELECT aps.state FROM adk_app_states aps WHERE aps.app_name = p_app_name) AS app_state
      INTO s
      FROM adk_sessions a
     WHERE a.app_name = p_app_name AND a.user_id = p_user_id AND a.session_id = p_session_id
       AND (a.expires_at IS NULL OR a.expires_at > pg_catalog.now());
    IF NOT FOUND THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT s.state, s.last_seq, s.session_day, s.created_at, s.updated_at, s.expires_at,
                        s.closed_at, s.successor_id, s.display_name, s.labels, s.user_state, s.app_state,
                        NULL::jsonb;
    IF s.last_seq = 0 OR p_limit = 0 THEN
        RETURN;
    END IF;
    -- A static statement, so its plan is kept: generic (the function's
    -- plan_cache_mode), so it is never planned again and prunes to the
    -- session's partition as it starts, whatever the number of partitions;
    -- and made with sequential scans off, so a plan made while the day's
    -- partition was small reads it by index once it has filled.
    RETURN QUERY
    SELECT NULL::jsonb, NULL::bigint, NULL::date, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz,
           NULL::timestamptz, NULL::text, NULL::text, NULL::jsonb, NULL::jsonb, NULL::jsonb, recent.payload
      FROM (SELECT e.seq, e.payload FROM adk_events e
             WHERE e.app_name = p_app_name AND e.user_id = p_user_id AND e.session_id = p_session_id
               AND e.session_day = s.session_day AND e.seq <= s.last_seq
               AND (p_after_ts IS NULL OR e.event_ts >= p_after_ts)
             ORDER BY e.seq DESC
             LIMIT p_limit) recent
     ORDER BY recent.seq;
END;
$$;

CREATE OR REPLACE FUNCTION page_shape_get_json(p_tenant text, p_app_name text, p_user_id text, p_session_id text)
 RETURNS TABLE(state jsonb, last_seq bigint, session_day date, created_at timestamptz, updated_at timestamptz,
               expires_at timestamptz, closed_at timestamptz, successor_id text, display_name text, labels jsonb,
               user_state jsonb, app_state jsonb, payloads_json json)
 LANGUAGE plpgsql STABLE SECURITY DEFINER
 SET plan_cache_mode = force_generic_plan SET enable_seqscan = off
 SET search_path = pg_catalog, public, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    s record;
BEGIN
    IF NOT adk_tenant_allows(p_tenant, p_app_name) THEN
        RETURN;
    END IF;
    SELECT a.state, a.last_seq, a.session_day, a.created_at, a.updated_at, a.expires_at, a.closed_at,
           a.successor_id, a.display_name, a.labels,
           (SELECT us.state FROM adk_user_states us WHERE us.app_name = p_app_name AND us.user_id = p_user_id) AS user_state,
           (SELECT aps.state FROM adk_app_states aps WHERE aps.app_name = p_app_name) AS app_state
      INTO s
      FROM adk_sessions a
     WHERE a.app_name = p_app_name AND a.user_id = p_user_id AND a.session_id = p_session_id
       AND (a.expires_at IS NULL OR a.expires_at > pg_catalog.now());
    IF NOT FOUND THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT s.state, s.last_seq, s.session_day, s.created_at, s.updated_at, s.expires_at,
        s.closed_at, s.successor_id, s.display_name, s.labels, s.user_state, s.app_state,
        (SELECT pg_catalog.json_agg(e.payload ORDER BY e.seq) FROM adk_events e
          WHERE e.app_name = p_app_name AND e.user_id = p_user_id AND e.session_id = p_session_id
            AND e.session_day = s.session_day AND e.seq <= s.last_seq);
END;
$$;

-- The store's list before adk_read_sessions, a row per session, the user
-- and app state on the first (its branch without a label filter).
CREATE OR REPLACE FUNCTION page_shape_list_rows(p_tenant text, p_app_name text, p_user_id text, p_limit bigint)
 RETURNS TABLE(session_id text, state jsonb, last_seq bigint, created_at timestamptz, updated_at timestamptz,
               expires_at timestamptz, display_name text, labels jsonb, user_state jsonb, app_state jsonb)
 LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off
AS $$
#variable_conflict use_column
BEGIN
    IF NOT adk_tenant_allows(p_tenant, p_app_name) THEN
        RETURN;
    END IF;
    RETURN QUERY
    SELECT s.session_id, s.state, s.last_seq, s.created_at, s.updated_at, s.expires_at, s.display_name,
           s.labels,
           CASE WHEN pg_catalog.row_number() OVER w = 1 THEN
               (SELECT us.state FROM adk_user_states us WHERE us.app_name = p_app_name AND us.user_id = p_user_id)
           END,
           CASE WHEN pg_catalog.row_number() OVER w = 1 THEN
               (SELECT aps.state FROM adk_app_states aps WHERE aps.app_name = p_app_name)
           END
    FROM adk_sessions s
    WHERE s.app_name = p_app_name AND s.user_id = p_user_id
      AND (s.expires_at IS NULL OR s.expires_at > pg_catalog.now())
    WINDOW w AS (ORDER BY s.updated_at DESC, s.session_id DESC)
    ORDER BY s.updated_at DESC, s.session_id DESC
    LIMIT p_limit;
END;
$$;

CREATE OR REPLACE FUNCTION page_shape_list_arrays(p_tenant text, p_app_name text, p_user_id text, p_limit bigint)
 RETURNS TABLE(session_ids text[], states jsonb[], last_seqs bigint[], created_ats timestamptz[],
               updated_ats timestamptz[], expires_ats timestamptz[], display_names text[], labels jsonb[],
               user_state jsonb, app_state jsonb)
 LANGUAGE plpgsql SECURITY DEFINER
 SET search_path = pg_catalog, public, pg_temp
 SET plan_cache_mode = force_generic_plan SET enable_seqscan = off
AS $$
#variable_conflict use_column
BEGIN
    IF NOT adk_tenant_allows(p_tenant, p_app_name) THEN
        RETURN;
    END IF;
    RETURN QUERY
    SELECT pg_catalog.array_agg(p.session_id), pg_catalog.array_agg(p.state), pg_catalog.array_agg(p.last_seq),
           pg_catalog.array_agg(p.created_at), pg_catalog.array_agg(p.updated_at),
           pg_catalog.array_agg(p.expires_at), pg_catalog.array_agg(p.display_name),
           pg_catalog.array_agg(p.labels),
           (SELECT us.state FROM adk_user_states us WHERE us.app_name = p_app_name AND us.user_id = p_user_id),
           (SELECT aps.state FROM adk_app_states aps WHERE aps.app_name = p_app_name)
      FROM (SELECT s.session_id, s.state, s.last_seq, s.created_at, s.updated_at, s.expires_at,
                   s.display_name, s.labels
              FROM adk_sessions s
             WHERE s.app_name = p_app_name AND s.user_id = p_user_id
               AND (s.expires_at IS NULL OR s.expires_at > pg_catalog.now())
             ORDER BY s.updated_at DESC, s.session_id DESC
             LIMIT p_limit) p;
END;
$$;

CREATE OR REPLACE FUNCTION page_shape_list_json(p_tenant text, p_app_name text, p_user_id text, p_limit bigint)
 RETURNS TABLE(page json, user_state jsonb, app_state jsonb)
 LANGUAGE plpgsql SECURITY DEFINER
 SET search_path = pg_catalog, public, pg_temp
 SET plan_cache_mode = force_generic_plan SET enable_seqscan = off
AS $$
#variable_conflict use_column
BEGIN
    IF NOT adk_tenant_allows(p_tenant, p_app_name) THEN
        RETURN;
    END IF;
    -- Times as microseconds since the epoch: the server's TimeZone never
    -- shapes them, and the client parses an integer, not a date.
    RETURN QUERY
    SELECT pg_catalog.json_agg(pg_catalog.json_build_array(
               p.session_id, p.state, p.last_seq,
               (EXTRACT(epoch FROM p.created_at) * 1000000)::bigint,
               (EXTRACT(epoch FROM p.updated_at) * 1000000)::bigint,
               (EXTRACT(epoch FROM p.expires_at) * 1000000)::bigint,
               p.display_name, p.labels)),
           (SELECT us.state FROM adk_user_states us WHERE us.app_name = p_app_name AND us.user_id = p_user_id),
           (SELECT aps.state FROM adk_app_states aps WHERE aps.app_name = p_app_name)
      FROM (SELECT s.session_id, s.state, s.last_seq, s.created_at, s.updated_at, s.expires_at,
                   s.display_name, s.labels
              FROM adk_sessions s
             WHERE s.app_name = p_app_name AND s.user_id = p_user_id
               AND (s.expires_at IS NULL OR s.expires_at > pg_catalog.now())
             ORDER BY s.updated_at DESC, s.session_id DESC
             LIMIT p_limit) p;
END;
$$;
"#;

/// jsonb's binary form, borrowed: a version byte, then the JSON text.
struct RawJsonb<'a>(&'a [u8]);

impl<'a> FromSql<'a> for RawJsonb<'a> {
    fn from_sql(_: &Type, raw: &'a [u8]) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        match raw.split_first() {
            Some((1, text)) => Ok(Self(text)),
            _ => Err("unsupported jsonb version".into()),
        }
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::JSONB
    }
}

/// `json` arrives as its text.
struct RawJson<'a>(&'a str);

impl<'a> FromSql<'a> for RawJson<'a> {
    fn from_sql(_: &Type, raw: &'a [u8]) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        Ok(Self(std::str::from_utf8(raw)?))
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::JSON
    }
}

/// What a get decodes: the header's fields and the events as `get_json`
/// holds them, one buffer plus spans.
#[derive(Default)]
struct Got {
    state: Value,
    last_seq: i64,
    events: Vec<u8>,
    spans: Vec<(u32, u32)>,
}

impl Got {
    fn header(row: &Row) -> anyhow::Result<Self> {
        let _: Option<DateTime<Utc>> = row.try_get("expires_at")?;
        let _: DateTime<Utc> = row.try_get("created_at")?;
        let _: DateTime<Utc> = row.try_get("updated_at")?;
        let _: Option<String> = row.try_get("display_name")?;
        let _: Value = row.try_get("labels")?;
        let _: Option<Value> = row.try_get("user_state")?;
        let _: Option<Value> = row.try_get("app_state")?;
        Ok(Self { state: row.try_get("state")?, last_seq: row.try_get("last_seq")?, ..Self::default() })
    }

    fn push(&mut self, event: &[u8]) -> anyhow::Result<()> {
        let start = u32::try_from(self.events.len())?;
        self.events.extend_from_slice(event);
        self.spans.push((start, u32::try_from(self.events.len())?));
        Ok(())
    }
}

/// A listed session, decoded as the store's `SummaryRow`.
#[derive(serde::Deserialize)]
#[allow(dead_code)] // Decoded to be paid for, not read.
struct Listed {
    session_id: String,
    state: Value,
    last_seq: i64,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
    expires_at: Option<DateTime<Utc>>,
    display_name: Option<String>,
    labels: Value,
}

type JsonListed = (String, Value, i64, i64, i64, Option<i64>, Option<String>, Value);

fn micros(at: i64) -> anyhow::Result<DateTime<Utc>> {
    DateTime::from_timestamp_micros(at).context("time out of range")
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Shape {
    GetRows,
    GetArray,
    GetJson,
    ListRows,
    ListArrays,
    ListJson,
}

impl Shape {
    const GETS: [Shape; 3] = [Shape::GetRows, Shape::GetArray, Shape::GetJson];
    const LISTS: [Shape; 3] = [Shape::ListRows, Shape::ListArrays, Shape::ListJson];

    fn name(self) -> &'static str {
        match self {
            Shape::GetRows => "get, a row per event (the store before)",
            Shape::GetArray => "get, events as one jsonb[] (the store)",
            Shape::GetJson => "get, events as one json_agg",
            Shape::ListRows => "list, a row per session (the store)",
            Shape::ListArrays => "list, one row of arrays",
            Shape::ListJson => "list, one json_agg",
        }
    }
}

fn text(value: &String) -> (&(dyn ToSql + Sync), Type) {
    (value, Type::TEXT)
}

struct Reader<'a> {
    client: &'a Client,
    /// Owns the sessions read by a get.
    user: &'a str,
    /// Owns the 100 sessions listed, and nothing else.
    list_user: &'a str,
}

impl Reader<'_> {
    /// One call; returns the events or sessions it read.
    async fn call(&self, shape: Shape, session: &str) -> anyhow::Result<usize> {
        let listing = matches!(shape, Shape::ListRows | Shape::ListArrays | Shape::ListJson);
        let (app, user) = (APP.to_owned(), if listing { self.list_user } else { self.user }.to_owned());
        let tenant: Option<String> = None;
        let session = session.to_owned();
        match shape {
            Shape::GetRows => {
                let (after, limit): (Option<i64>, Option<i64>) = (None, None);
                let rows = self
                    .client
                    .query_typed(
                        "SELECT * FROM page_shape_get_rows($1, $2, $3, $4, $5, $6)",
                        &[
                            (&tenant, Type::TEXT),
                            text(&app),
                            text(&user),
                            text(&session),
                            (&after, Type::INT8),
                            (&limit, Type::INT8),
                        ],
                    )
                    .await?;
                let (header, events) = rows.split_first().context("no header row")?;
                let mut got = Got::header(header)?;
                for row in events {
                    let payload: RawJsonb<'_> = row.try_get("payload")?;
                    got.push(payload.0)?;
                }
                Ok(got.spans.len())
            }
            Shape::GetArray | Shape::GetJson => {
                let json = shape == Shape::GetJson;
                let (after, limit): (Option<i64>, Option<i64>) = (None, None);
                let rows = if json {
                    self.client
                        .query_typed(
                            "SELECT * FROM page_shape_get_json($1, $2, $3, $4)",
                            &[(&tenant, Type::TEXT), text(&app), text(&user), text(&session)],
                        )
                        .await?
                } else {
                    self.client
                        .query_typed(
                            "SELECT * FROM adk_read_session($1, $2, $3, $4, $5, $6)",
                            &[
                                (&tenant, Type::TEXT),
                                text(&app),
                                text(&user),
                                text(&session),
                                (&after, Type::INT8),
                                (&limit, Type::INT8),
                            ],
                        )
                        .await?
                };
                let row = rows.first().context("no row")?;
                let mut got = Got::header(row)?;
                if json {
                    let page: RawJson<'_> = row.try_get("payloads_json")?;
                    for event in serde_json::from_str::<Vec<&RawValue>>(page.0)? {
                        got.push(event.get().as_bytes())?;
                    }
                } else {
                    let payloads: Vec<RawJsonb<'_>> = row.try_get("events")?;
                    got.events.reserve(payloads.iter().map(|p| p.0.len()).sum());
                    for payload in payloads {
                        got.push(payload.0)?;
                    }
                }
                ensure!(got.last_seq as usize == got.spans.len() && got.state.is_object());
                Ok(got.spans.len())
            }
            Shape::ListRows => {
                let limit: i64 = 201;
                let rows = self
                    .client
                    .query_typed(
                        "SELECT * FROM page_shape_list_rows($1, $2, $3, $4)",
                        &[(&tenant, Type::TEXT), text(&app), text(&user), (&limit, Type::INT8)],
                    )
                    .await?;
                let mut listed = Vec::with_capacity(rows.len());
                for (i, row) in rows.iter().enumerate() {
                    if i == 0 {
                        let _: Option<Value> = row.try_get("user_state")?;
                        let _: Option<Value> = row.try_get("app_state")?;
                    }
                    listed.push(Listed {
                        session_id: row.try_get("session_id")?,
                        state: row.try_get("state")?,
                        last_seq: row.try_get("last_seq")?,
                        created_at: row.try_get("created_at")?,
                        updated_at: row.try_get("updated_at")?,
                        expires_at: row.try_get("expires_at")?,
                        display_name: row.try_get("display_name")?,
                        labels: row.try_get("labels")?,
                    });
                }
                Ok(listed.len())
            }
            Shape::ListArrays | Shape::ListJson => {
                let limit: i64 = 201;
                let function = if shape == Shape::ListJson { "page_shape_list_json" } else { "page_shape_list_arrays" };
                let rows = self
                    .client
                    .query_typed(
                        &format!("SELECT * FROM {function}($1, $2, $3, $4)"),
                        &[(&tenant, Type::TEXT), text(&app), text(&user), (&limit, Type::INT8)],
                    )
                    .await?;
                let row = rows.first().context("no row")?;
                let _: Option<Value> = row.try_get("user_state")?;
                let _: Option<Value> = row.try_get("app_state")?;
                let listed: Vec<Listed> = if shape == Shape::ListJson {
                    let page: RawJson<'_> = row.try_get("page")?;
                    let page: Vec<JsonListed> = serde_json::from_str(page.0)?;
                    page.into_iter()
                        .map(|(session_id, state, last_seq, created, updated, expires, display_name, labels)| {
                            Ok(Listed {
                                session_id,
                                state,
                                last_seq,
                                created_at: micros(created)?,
                                updated_at: micros(updated)?,
                                expires_at: expires.map(micros).transpose()?,
                                display_name,
                                labels,
                            })
                        })
                        .collect::<anyhow::Result<_>>()?
                } else {
                    let ids: Vec<String> = row.try_get("session_ids")?;
                    let states: Vec<Value> = row.try_get("states")?;
                    let seqs: Vec<i64> = row.try_get("last_seqs")?;
                    let created: Vec<DateTime<Utc>> = row.try_get("created_ats")?;
                    let updated: Vec<DateTime<Utc>> = row.try_get("updated_ats")?;
                    let expires: Vec<Option<DateTime<Utc>>> = row.try_get("expires_ats")?;
                    let names: Vec<Option<String>> = row.try_get("display_names")?;
                    let labels: Vec<Value> = row.try_get("labels")?;
                    ensure!(
                        [
                            states.len(),
                            seqs.len(),
                            created.len(),
                            updated.len(),
                            expires.len(),
                            names.len(),
                            labels.len()
                        ]
                        .iter()
                        .all(|n| *n == ids.len())
                    );
                    let mut listed = Vec::with_capacity(ids.len());
                    let columns = ids.into_iter().zip(states).zip(seqs).zip(created).zip(updated);
                    for (
                        ((((session_id, state), last_seq), created_at), updated_at),
                        ((expires_at, display_name), labels),
                    ) in columns.zip(expires.into_iter().zip(names).zip(labels))
                    {
                        listed.push(Listed {
                            session_id,
                            state,
                            last_seq,
                            created_at,
                            updated_at,
                            expires_at,
                            display_name,
                            labels,
                        });
                    }
                    listed
                };
                Ok(listed.len())
            }
        }
    }
}

/// A relay in front of the server that counts what the server sends.
async fn counting_relay(upstream: String, from_server: Arc<AtomicU64>) -> anyhow::Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let (upstream, from_server) = (upstream.clone(), from_server.clone());
            tokio::spawn(async move {
                let Ok(server) = TcpStream::connect(&upstream).await else { return };
                let (mut client_read, mut client_write) = client.into_split();
                let (mut server_read, mut server_write) = server.into_split();
                let up = tokio::io::copy(&mut client_read, &mut server_write);
                let down = async {
                    let mut buffer = vec![0u8; 64 * 1024];
                    loop {
                        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
                        let n = match server_read.read(&mut buffer).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        from_server.fetch_add(n as u64, Ordering::Relaxed);
                        if client_write.write_all(&buffer[..n]).await.is_err() {
                            break;
                        }
                    }
                };
                let _ = tokio::join!(up, down);
            });
        }
    });
    Ok(port)
}

fn event(n: usize) -> Event {
    let author = if n.is_multiple_of(2) { "user" } else { "assistant" };
    let mut event = Event::new("inv-page-shape");
    event.author = author.to_owned();
    let words = ["the", "order", "arrives", "tomorrow", "between", "nine", "and", "noon", "please", "confirm"];
    let text: String = (0..40).map(|i| words[(n * 7 + i * 3) % words.len()]).collect::<Vec<_>>().join(" ");
    event.llm_response.content = Some(Content {
        role: if author == "user" { "user".to_owned() } else { "model".to_owned() },
        parts: vec![Part::Text { text: text.chars().take(200).collect() }],
    });
    event.actions.state_delta.insert("turn".to_owned(), serde_json::json!(n));
    event
}

async fn seed(service: &dyn SessionService, user: &str, list_user: &str) -> anyhow::Result<()> {
    let state = std::collections::HashMap::from([
        ("channel".to_owned(), serde_json::json!("web")),
        ("locale".to_owned(), serde_json::json!("en-GB")),
    ]);
    let sessions = [(user, "g-40", 40), (user, "g-1000", 1000)].into_iter().chain((0..100).map(|_| (list_user, "", 0)));
    for (user, session, events) in sessions {
        let created = service
            .create(CreateRequest {
                app_name: APP.to_owned(),
                user_id: user.to_owned(),
                session_id: (!session.is_empty()).then(|| session.to_owned()),
                state: state.clone(),
            })
            .await
            .map_err(|e| anyhow::anyhow!("create: {e}"))?;
        let identity = AdkIdentity {
            app_name: AppName::try_from(APP)?,
            user_id: UserId::try_from(user)?,
            session_id: SessionId::try_from(created.id())?,
        };
        for n in 0..events {
            service
                .append_event_for_identity(AppendEventRequest { identity: identity.clone(), event: event(n) })
                .await
                .map_err(|e| anyhow::anyhow!("append: {e}"))?;
        }
    }
    Ok(())
}

async fn connect(url: &str) -> anyhow::Result<Client> {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(connection);
    Ok(client)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, rounds] = args.as_slice() else { bail!("usage: page_shape URL ROUNDS") };
    let rounds: usize = rounds.parse().context("ROUNDS")?;
    adk_postgres_adk::migrate(url).await.map_err(|e| anyhow::anyhow!("{e}"))?;
    let service = adk_postgres_adk::PgSessionService::connect(url).await.map_err(|e| anyhow::anyhow!("{e}"))?;
    let user = format!("u-{}", uuid::Uuid::new_v4().simple());
    let list_user = format!("{user}-list");
    seed(&service, &user, &list_user).await?;
    let client = connect(url).await?;
    client.batch_execute(VARIANTS_SQL).await.context("installing the variants")?;
    let reader = Reader { client: &client, user: &user, list_user: &list_user };
    let config: tokio_postgres::Config = url.parse()?;
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
        _ => bail!("URL needs a TCP host"),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let from_server = Arc::new(AtomicU64::new(0));
    let relay = counting_relay(format!("{host}:{port}"), from_server.clone()).await?;
    let mut relayed = url::Url::parse(url)?;
    relayed.set_host(Some("127.0.0.1"))?;
    relayed.set_port(Some(relay)).map_err(|()| anyhow::anyhow!("URL cannot take a port"))?;
    let (relay_client, relay_connection) = tokio_postgres::connect(relayed.as_str(), NoTls).await?;
    tokio::spawn(relay_connection);
    let relay_reader = Reader { client: &relay_client, user: &user, list_user: &list_user };

    for (label, session, shapes) in
        [("get of 40", "g-40", Shape::GETS), ("get of 1,000", "g-1000", Shape::GETS), ("list of 100", "", Shape::LISTS)]
    {
        let mut bytes = Vec::new();
        for shape in shapes {
            let read = reader.call(shape, session).await?;
            ensure!(read == relay_reader.call(shape, session).await?, "{shape:?} read differently through the relay");
            let before = from_server.load(Ordering::Relaxed);
            for _ in 0..20 {
                relay_reader.call(shape, session).await?;
            }
            bytes.push((from_server.load(Ordering::Relaxed) - before) as f64 / 20.0);
        }
        let mut rates = vec![Vec::new(); shapes.len()];
        let mut cpu_per_call = vec![Vec::new(); shapes.len()];
        for round in 0..rounds {
            for i in 0..shapes.len() {
                let k = (i + round) % shapes.len();
                let (started, cpu_before, mut calls) = (Instant::now(), cpu(), 0u32);
                while started.elapsed().as_secs_f64() < CALL_SECONDS {
                    reader.call(shapes[k], session).await?;
                    calls += 1;
                }
                let (wall, spent) = (started.elapsed().as_secs_f64(), (cpu() - cpu_before).as_secs_f64());
                rates[k].push(f64::from(calls) / wall);
                cpu_per_call[k].push(spent * 1e6 / f64::from(calls));
            }
        }
        println!("{label} ({rounds} rounds of {CALL_SECONDS} s per shape, alternating):");
        let base = median(rates[0].clone());
        for (k, shape) in shapes.iter().enumerate() {
            let rate = median(rates[k].clone());
            println!(
                "  {:<40} {:>7.0} calls/s ({:.2}x)  client CPU {:>7.1} µs/call  server sent {:>8.0} B/call",
                shape.name(),
                rate,
                rate / base,
                median(cpu_per_call[k].clone()),
                bytes[k],
            );
        }
    }
    Ok(())
}
