//! The typed contract between the store and its SQL functions: one wrapper
//! per function, declared once with its arguments and result columns.
//!
//! Why functions at all: each store operation is one round trip and one
//! statement, whatever it does inside, and a service role may execute them
//! (they are `SECURITY DEFINER`) without holding any privilege on the
//! tables (docs/ARCHITECTURE.md, "Why each SQL function exists").
//!
//! Each wrapper binds its arguments in declaration order and selects its
//! result columns by name; [`SIGNATURES`] lists both, and the test
//! `tests/tests/store/sql_wrappers.rs` compares them with `pg_proc`, so a
//! migration that changes a signature without its wrapper (or the reverse)
//! fails the suite. Result rows decode their outcome column into enums, and
//! rows whose columns mirror a table take their SQL types from the generated
//! `adk_postgres_schema::tables`, checked at compile time.
//!
//! The statements are fixed texts with every value bound. They are sent
//! unnamed, in one round trip each (the store's own connection, `conn.rs`), so they also work
//! through a transaction pooler.

use adk_postgres_domain::JsonEvents;
use chrono::{DateTime, Utc};
use diesel::QueryResult;
use diesel::data_types::PgInterval;
use diesel::deserialize::FromSql;
use diesel::pg::{Pg, PgValue};
use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};
use diesel::sql_types::{Array, BigInt, Bool, Bytea, Integer, Interval, Jsonb, Nullable, Text, Timestamptz, Untyped};
use serde_json::Value;

/// One SQL function as `pg_proc` should describe it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Signature {
    /// The function's name, without schema.
    pub name: &'static str,
    /// Input arguments, in order: name and type as `format_type` spells it.
    pub arguments: &'static [(&'static str, &'static str)],
    /// Result columns: name and type. A function returning a single value
    /// has one column named after the function.
    pub columns: &'static [(&'static str, &'static str)],
}

/// The SQL type of a bound argument, and how a value of it is bound.
pub(crate) trait ArgType {
    type Value<'a>: std::fmt::Debug;
    /// The type as PostgreSQL's `format_type` prints it.
    const PG_TYPE: &'static str;
    fn bind<'b>(value: &'b Self::Value<'_>, out: &mut AstPass<'_, 'b, Pg>) -> QueryResult<()>;
}

macro_rules! arg_types {
    ($($name:ident: $value:ty as $sql:ty = $pg:literal;)*) => {$(
        #[derive(Debug)]
        pub(crate) struct $name;
        impl ArgType for $name {
            type Value<'a> = $value;
            const PG_TYPE: &'static str = $pg;
            fn bind<'b>(value: &'b Self::Value<'_>, out: &mut AstPass<'_, 'b, Pg>) -> QueryResult<()> {
                out.push_bind_param::<$sql, _>(value)
            }
        }
    )*};
}

arg_types! {
    TextArg: &'a str as Text = "text";
    OptTextArg: Option<&'a str> as Nullable<Text> = "text";
    JsonArg: &'a Value as Jsonb = "jsonb";
    BigIntArg: i64 as BigInt = "bigint";
    OptBigIntArg: Option<i64> as Nullable<BigInt> = "bigint";
    IntArg: i32 as Integer = "integer";
    BoolArg: bool as Bool = "boolean";
    OptTimestamptzArg: Option<DateTime<Utc>> as Nullable<Timestamptz> = "timestamp with time zone";
    OptIntervalArg: Option<PgInterval> as Nullable<Interval> = "interval";
    ByteaArrayArg: &'a [Vec<u8>] as Array<Bytea> = "bytea[]";
    OptByteaArrayArg: Option<&'a [Vec<u8>]> as Nullable<Array<Bytea>> = "bytea[]";
}

/// The arguments every per-session function starts with: the app the store
/// acts for (checked against the role's bindings) and the session's key.
#[derive(Debug, Clone, Copy)]
pub(crate) struct KeyArgs<'a> {
    pub tenant: Option<&'a str>,
    pub app_name: &'a str,
    pub user_id: &'a str,
    pub session_id: &'a str,
}

const KEY_ARGUMENTS: [(&str, &str); 4] =
    [("p_tenant", "text"), ("p_app_name", "text"), ("p_user_id", "text"), ("p_session_id", "text")];

impl KeyArgs<'_> {
    fn bind<'b>(&'b self, out: &mut AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        out.push_bind_param::<Nullable<Text>, _>(&self.tenant)?;
        out.push_sql(", ");
        out.push_bind_param::<Text, _>(&self.app_name)?;
        out.push_sql(", ");
        out.push_bind_param::<Text, _>(&self.user_id)?;
        out.push_sql(", ");
        out.push_bind_param::<Text, _>(&self.session_id)
    }
}

/// `const` concatenation of a list of names with `", "` between them.
macro_rules! joined {
    ($first:ident $(, $rest:ident)*) => { concat!(stringify!($first) $(, ", ", stringify!($rest))*) };
}

/// Declares one wrapper: a struct of its arguments (after the session key,
/// when it takes one), its result row, its statement and its signature.
macro_rules! store_function {
    (
        $(#[doc = $doc:literal])*
        $wrapper:ident => $function:ident($([$key:ident])? $($arg:ident: $ty:ident),* $(,)?)
            -> $row:ident { $($column:ident: $pg:literal),+ $(,)? }
    ) => {
        $(#[doc = $doc])*
        #[derive(Debug)]
        pub(crate) struct $wrapper<'a> {
            $(pub $key: KeyArgs<'a>,)?
            $(pub $arg: <$ty as ArgType>::Value<'a>,)*
        }

        impl $wrapper<'_> {
            pub(crate) const SIGNATURE: Signature = Signature {
                name: stringify!($function),
                arguments: &{
                    #[allow(unused_mut, unused_assignments)]
                    const fn arguments() -> [(&'static str, &'static str); store_function!(@count $($key $key $key $key)? $($arg)*)] {
                        let mut all = [("", ""); store_function!(@count $($key $key $key $key)? $($arg)*)];
                        let mut i = 0;
                        $(
                            let _ = stringify!($key);
                            while i < KEY_ARGUMENTS.len() {
                                all[i] = KEY_ARGUMENTS[i];
                                i += 1;
                            }
                        )?
                        $(
                            all[i] = (concat!("p_", stringify!($arg)), <$ty as ArgType>::PG_TYPE);
                            i += 1;
                        )*
                        all
                    }
                    arguments()
                },
                columns: &[$((stringify!($column), $pg)),+],
            };
        }

        impl QueryFragment<Pg> for $wrapper<'_> {
            fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
                out.push_sql(concat!("SELECT ", joined!($($column),+), " FROM ", stringify!($function), "("));
                #[allow(unused_mut, unused_assignments)]
                let mut first = true;
                $(
                    self.$key.bind(&mut out)?;
                    first = false;
                )?
                $(
                    if !first {
                        out.push_sql(", ");
                    }
                    <$ty as ArgType>::bind(&self.$arg, &mut out)?;
                    first = false;
                )*
                let _ = first;
                out.push_sql(")");
                Ok(())
            }
        }

        impl QueryId for $wrapper<'_> {
            type QueryId = ();
            // The text is fixed per wrapper, so the statement cache keys it by its SQL.
            const HAS_STATIC_QUERY_ID: bool = false;
        }

        impl Query for $wrapper<'_> {
            type SqlType = Untyped;
        }

    };
    (@count) => { 0 };
    (@count $head:tt $($tail:tt)*) => { 1 + store_function!(@count $($tail)*) };
}

/// Declares an outcome column's values; an unknown value fails decoding
/// (a store function newer than this code), naming what it got.
macro_rules! outcome {
    ($(#[doc = $doc:literal])* $name:ident { $($(#[doc = $vdoc:literal])* $variant:ident = $text:literal),+ $(,)? }) => {
        $(#[doc = $doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, diesel::deserialize::FromSqlRow)]
        pub(crate) enum $name {
            $($(#[doc = $vdoc])* $variant),+
        }

        impl FromSql<Text, Pg> for $name {
            fn from_sql(value: PgValue<'_>) -> diesel::deserialize::Result<Self> {
                let text = value.as_bytes();
                $(if text == $text.as_bytes() {
                    return Ok(Self::$variant);
                })+
                Err(format!(concat!(stringify!($name), ": unknown outcome {:?}"), String::from_utf8_lossy(text)).into())
            }
        }
    };
}

outcome! {
    /// What `adk_append_event` did.
    AppendOutcome {
        Stored = "stored",
        /// The same event was stored before; the stored one is returned.
        Replayed = "replayed",
        /// Another event with this id was stored before.
        Duplicate = "duplicate",
        Stale = "stale",
        NotFound = "not_found",
        Closed = "closed",
        TooOld = "too_old",
        /// Another invocation holds the session's lease.
        Busy = "busy",
        /// The caller's fencing token is behind the session's generation.
        LeaseLost = "lease_lost",
    }
}

outcome! {
    /// What `adk_rollover_session` did.
    RolloverOutcome {
        /// Closed with this successor, now or by an earlier call.
        Rolled = "rolled",
        NotFound = "not_found",
        Closed = "closed",
        /// The successor's id is taken.
        Exists = "exists",
    }
}

outcome! {
    /// What `adk_rewind_session` did.
    RewindOutcome {
        Rewound = "rewound",
        NotFound = "not_found",
        Stale = "stale",
        /// The session has fewer events than asked to keep.
        Beyond = "beyond",
    }
}

outcome! {
    /// What `adk_fork_session` did.
    ForkOutcome {
        Forked = "forked",
        NotFound = "not_found",
        /// The session has fewer events than the fork point.
        Beyond = "beyond",
        /// The new id is taken by a live session.
        Exists = "exists",
    }
}

use adk_postgres_schema::tables::adk_sessions;

store_function! {
    /// Creates the session with its display name and labels and merges the
    /// initial app and user state in one statement; no row when the id is
    /// taken.
    CreateSession => adk_create_session(
        [key]
        state: JsonArg,
        ttl: OptIntervalArg,
        user_delta: JsonArg,
        app_delta: JsonArg,
        display_name: OptTextArg,
        labels: JsonArg,
    ) -> CreatedRow {
            created_at: "timestamp with time zone",
            updated_at: "timestamp with time zone",
            expires_at: "timestamp with time zone",
            user_state: "jsonb",
            app_state: "jsonb",
        }
}

#[derive(diesel::QueryableByName)]
#[diesel(table_name = adk_sessions, check_for_backend(Pg))]
pub(crate) struct CreatedRow {
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub expires_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<Jsonb>)]
    pub user_state: Option<Value>,
    #[diesel(sql_type = Nullable<Jsonb>)]
    pub app_state: Option<Value>,
}

store_function! {
    /// The live session with the live app and user state and its events
    /// (up to the version read, the newest `limit` of them, from the one
    /// partition of its day) as one array, in one snapshot, one round trip
    /// and one row. No row when missing, expired or not the tenant's.
    ReadSession => adk_read_session([key] after_ts: OptBigIntArg, limit: OptBigIntArg)
        -> ReadRow {
            state: "jsonb",
            last_seq: "bigint",
            session_day: "date",
            created_at: "timestamp with time zone",
            updated_at: "timestamp with time zone",
            expires_at: "timestamp with time zone",
            closed_at: "timestamp with time zone",
            successor_id: "text",
            display_name: "text",
            labels: "jsonb",
            user_state: "jsonb",
            app_state: "jsonb",
            events: "jsonb[]",
        }
}

/// `adk_read_session`'s row.
#[derive(diesel::QueryableByName)]
#[diesel(check_for_backend(Pg))]
pub(crate) struct ReadRow {
    #[diesel(sql_type = Jsonb)]
    pub state: Value,
    #[diesel(sql_type = BigInt)]
    pub last_seq: i64,
    #[diesel(sql_type = Timestamptz)]
    pub created_at: DateTime<Utc>,
    #[diesel(sql_type = Timestamptz)]
    pub updated_at: DateTime<Utc>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub expires_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub closed_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<Text>)]
    pub successor_id: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    pub display_name: Option<String>,
    #[diesel(sql_type = Jsonb)]
    pub labels: StoredLabels,
    #[diesel(sql_type = Nullable<Jsonb>)]
    pub user_state: Option<Value>,
    #[diesel(sql_type = Nullable<Jsonb>)]
    pub app_state: Option<Value>,
    #[diesel(sql_type = Array<Jsonb>)]
    pub events: EventArray,
}

// `adk_get_session` and `adk_list_sessions`, the get a row per event and
// the list a row per session, are kept in the schema for a service still
// running a build that calls them during a rolling deploy; the store no
// longer does, but a service role may still run them.
#[allow(dead_code)]
mod kept_for_older_builds {
    use super::*;

    store_function! {
        /// The get as the store called it before `adk_read_session`: a row
        /// with the session, then a row per event.
        GetSession => adk_get_session([key] after_ts: OptBigIntArg, limit: OptBigIntArg)
            -> GetRow {
                state: "jsonb",
                last_seq: "bigint",
                session_day: "date",
                created_at: "timestamp with time zone",
                updated_at: "timestamp with time zone",
                expires_at: "timestamp with time zone",
                closed_at: "timestamp with time zone",
                successor_id: "text",
                display_name: "text",
                labels: "jsonb",
                user_state: "jsonb",
                app_state: "jsonb",
                payload: "jsonb",
            }
    }

    store_function! {
        /// The list as the store called it before `adk_read_sessions`: a
        /// row per session, the app and user state on the first.
        ListSessions => adk_list_sessions(
            tenant: OptTextArg,
            app_name: TextArg,
            user_id: TextArg,
            after_time: OptTimestamptzArg,
            after_id: OptTextArg,
            limit: BigIntArg,
            labels: JsonArg,
            updated_after: OptTimestamptzArg,
            updated_before: OptTimestamptzArg,
        ) -> SummaryRow {
            session_id: "text",
            state: "jsonb",
            last_seq: "bigint",
            created_at: "timestamp with time zone",
            updated_at: "timestamp with time zone",
            expires_at: "timestamp with time zone",
            display_name: "text",
            labels: "jsonb",
            user_state: "jsonb",
            app_state: "jsonb",
        }
    }
}
use kept_for_older_builds::{GetSession, ListSessions};

/// A get's events straight from the binary `jsonb[]` into one buffer plus
/// spans: no row, no allocation and no parse per event (a row per event
/// cost the client about a microsecond each in row handling alone).
#[derive(Debug, diesel::deserialize::FromSqlRow)]
pub(crate) struct EventArray(pub JsonEvents);

impl FromSql<Array<Jsonb>, Pg> for EventArray {
    fn from_sql(value: PgValue<'_>) -> diesel::deserialize::Result<Self> {
        events_from_array(value.as_bytes()).map(Self).map_err(Into::into)
    }
}

/// Reads PostgreSQL's binary array format (dimensions, null flag, element
/// type, then a length and lower bound per dimension, then each element as
/// a length and its bytes) of a one-dimensional `jsonb[]` without nulls.
fn events_from_array(mut bytes: &[u8]) -> Result<JsonEvents, String> {
    let mut int = |what: &str| -> Result<i32, String> {
        let (head, rest) = bytes.split_first_chunk::<4>().ok_or_else(|| format!("event array: no {what}"))?;
        bytes = rest;
        Ok(i32::from_be_bytes(*head))
    };
    let dimensions = int("dimensions")?;
    let _has_nulls = int("null flag")?;
    let _element_type = int("element type")?;
    let count = match dimensions {
        0 => 0,
        1 => {
            let count = usize::try_from(int("length")?).map_err(|_| "event array: negative length")?;
            let _lower_bound = int("lower bound")?;
            count
        }
        other => return Err(format!("event array: {other} dimensions")),
    };
    // Each event takes at least its length and jsonb's version byte.
    let mut events = JsonEvents::with_capacity(count.min(bytes.len() / 5), bytes.len());
    for _ in 0..count {
        let (head, rest) = bytes.split_first_chunk::<4>().ok_or("event array: truncated")?;
        let length = usize::try_from(i32::from_be_bytes(*head)).map_err(|_| "event array: a null event")?;
        let element = rest.get(..length).ok_or("event array: truncated event")?;
        bytes = &rest[length..];
        // Binary jsonb is a version byte (1) followed by the JSON text.
        match element.split_first() {
            Some((1, text)) => events.push(text),
            _ => return Err("unsupported jsonb version".into()),
        }
    }
    if !bytes.is_empty() {
        return Err("event array: bytes after the last event".into());
    }
    Ok(events)
}

/// An event read straight from jsonb's bytes, without a `serde_json::Value`
/// in between: a get of a thousand events parses each payload once.
#[derive(Debug, diesel::deserialize::FromSqlRow)]
pub(crate) struct StoredEvent(pub adk_postgres_domain::Event);

impl FromSql<Jsonb, Pg> for StoredEvent {
    fn from_sql(value: PgValue<'_>) -> diesel::deserialize::Result<Self> {
        // Binary jsonb is a version byte (1) followed by the JSON text.
        match value.as_bytes().split_first() {
            Some((1, text)) => {
                serde_json::from_slice(text).map(Self).map_err(|e| format!("stored event is corrupt: {e}").into())
            }
            _ => Err("unsupported jsonb version".into()),
        }
    }
}

/// A session's labels read straight from jsonb's bytes into the map the
/// domain holds; anything but an object of strings fails decoding (the
/// table's metadata checks make that corruption).
#[derive(Debug, Default, diesel::deserialize::FromSqlRow)]
pub(crate) struct StoredLabels(pub std::collections::BTreeMap<String, String>);

impl FromSql<Jsonb, Pg> for StoredLabels {
    fn from_sql(value: PgValue<'_>) -> diesel::deserialize::Result<Self> {
        match value.as_bytes().split_first() {
            Some((1, text)) => {
                serde_json::from_slice(text).map(Self).map_err(|e| format!("stored labels are corrupt: {e}").into())
            }
            _ => Err("unsupported jsonb version".into()),
        }
    }
}

store_function! {
    /// One keyset page of a user's live sessions, newest first, carrying
    /// every label of `labels` and last updated in the half-open window
    /// `[updated_after, updated_before)`, as one row: an array per column in
    /// the page's order, and the app and user state once. No row when the
    /// app is not the tenant's.
    ReadSessions => adk_read_sessions(
        tenant: OptTextArg,
        app_name: TextArg,
        user_id: TextArg,
        after_time: OptTimestamptzArg,
        after_id: OptTextArg,
        limit: BigIntArg,
        labels: JsonArg,
        updated_after: OptTimestamptzArg,
        updated_before: OptTimestamptzArg,
    ) -> SessionsRow {
        session_ids: "text[]",
        states: "jsonb[]",
        last_seqs: "bigint[]",
        created_ats: "timestamp with time zone[]",
        updated_ats: "timestamp with time zone[]",
        expires_ats: "timestamp with time zone[]",
        display_names: "text[]",
        label_sets: "jsonb[]",
        user_state: "jsonb",
        app_state: "jsonb",
    }
}

/// `adk_read_sessions`' row: the arrays are the page's columns, one element
/// per session in the page's order.
#[derive(diesel::QueryableByName)]
#[diesel(check_for_backend(Pg))]
pub(crate) struct SessionsRow {
    #[diesel(sql_type = Array<Text>)]
    pub session_ids: Vec<String>,
    #[diesel(sql_type = Array<Jsonb>)]
    pub states: Vec<Value>,
    #[diesel(sql_type = Array<BigInt>)]
    pub last_seqs: Vec<i64>,
    #[diesel(sql_type = Array<Timestamptz>)]
    pub created_ats: Vec<DateTime<Utc>>,
    #[diesel(sql_type = Array<Timestamptz>)]
    pub updated_ats: Vec<DateTime<Utc>>,
    #[diesel(sql_type = Array<Nullable<Timestamptz>>)]
    pub expires_ats: Vec<Option<DateTime<Utc>>>,
    #[diesel(sql_type = Array<Nullable<Text>>)]
    pub display_names: Vec<Option<String>>,
    #[diesel(sql_type = Array<Jsonb>)]
    pub label_sets: Vec<StoredLabels>,
    #[diesel(sql_type = Nullable<Jsonb>)]
    pub user_state: Option<Value>,
    #[diesel(sql_type = Nullable<Jsonb>)]
    pub app_state: Option<Value>,
}

outcome! {
    /// What `adk_set_session_metadata` did.
    MetadataOutcome {
        /// The display name and labels were replaced.
        Set = "set",
        NotFound = "not_found",
    }
}

store_function! {
    /// Replaces the display name and labels; neither the version nor the
    /// last update time moves.
    SetSessionMetadata => adk_set_session_metadata([key] display_name: OptTextArg, labels: JsonArg)
        -> MetadataRow { outcome: "text" }
}

#[derive(diesel::QueryableByName)]
#[diesel(check_for_backend(Pg))]
pub(crate) struct MetadataRow {
    #[diesel(sql_type = Text)]
    pub outcome: MetadataOutcome,
}

store_function! {
    /// Deletes the session; its events go with it through the cascading key
    /// on one partition.
    DeleteSession => adk_delete_session([key]) -> DeletedRow { adk_delete_session: "bigint" }
}

#[derive(diesel::QueryableByName)]
pub(crate) struct DeletedRow {
    /// How many sessions were deleted (0 or 1).
    #[diesel(sql_type = Nullable<BigInt>)]
    #[allow(dead_code)]
    pub adk_delete_session: Option<i64>,
}

store_function! {
    /// Locks, checks, sequences, inserts and merges state in one round trip,
    /// or says which check refused the append.
    AppendEvent => adk_append_event(
        [key]
        event_id: TextArg,
        invocation_id: OptTextArg,
        author: TextArg,
        event_ts: BigIntArg,
        payload: JsonArg,
        session_delta: JsonArg,
        user_delta: JsonArg,
        app_delta: JsonArg,
        expected_seq: OptBigIntArg,
        max_lifetime: OptIntervalArg,
        blobs: OptByteaArrayArg,
        lease_idle: OptIntervalArg,
        lease_generation: OptBigIntArg,
        lease_release: BoolArg,
    ) -> AppendRow {
        outcome: "text",
        seq: "bigint",
        session_day: "date",
        updated_at: "timestamp with time zone",
        payload: "jsonb",
        successor_id: "text",
        max_lifetime: "interval",
        lease_holder: "text",
        lease_until: "timestamp with time zone",
        lease_generation: "bigint",
    }
}

#[derive(diesel::QueryableByName)]
#[diesel(check_for_backend(Pg))]
pub(crate) struct AppendRow {
    #[diesel(sql_type = Text)]
    pub outcome: AppendOutcome,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub seq: Option<i64>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub updated_at: Option<DateTime<Utc>>,
    /// The stored event, on a replay or a duplicate. The store answers a
    /// replay with the event it was sent (equal by definition), whose media
    /// is in place, rather than with this payload, whose media is not.
    #[diesel(sql_type = Nullable<Jsonb>)]
    #[allow(dead_code)]
    pub payload: Option<Value>,
    #[diesel(sql_type = Nullable<Text>)]
    pub successor_id: Option<String>,
    /// The lifetime a `too_old` session was held to: the policy's, or the
    /// client's shorter one.
    #[diesel(sql_type = Nullable<Interval>)]
    pub max_lifetime: Option<PgInterval>,
    /// The invocation holding the lease: the caller's after a stored append
    /// that kept it, the other one's when `busy`.
    #[diesel(sql_type = Nullable<Text>)]
    pub lease_holder: Option<String>,
    /// When the lease lapses; NULL once released.
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub lease_until: Option<DateTime<Utc>>,
    /// The session's lease generation; NULL when the append left the lease
    /// alone.
    #[diesel(sql_type = Nullable<BigInt>)]
    pub lease_generation: Option<i64>,
}

store_function! {
    /// The media a read found references to, among the blobs the session's
    /// events hold (blobs.sql).
    GetBlobs => adk_get_blobs([key] sha256: ByteaArrayArg) -> BlobRow { sha256: "bytea", data: "bytea" }
}

#[derive(diesel::QueryableByName)]
#[diesel(check_for_backend(Pg))]
pub(crate) struct BlobRow {
    #[diesel(sql_type = Bytea)]
    pub sha256: Vec<u8>,
    #[diesel(sql_type = Bytea)]
    pub data: Vec<u8>,
}

store_function! {
    /// Closes the session and opens its successor with the summary event as
    /// its first, atomically; a retry finds it already done.
    RolloverSession => adk_rollover_session(
        [key]
        successor_id: TextArg,
        event_id: TextArg,
        invocation_id: OptTextArg,
        author: TextArg,
        event_ts: BigIntArg,
        payload: JsonArg,
        ttl: OptIntervalArg,
    ) -> RolloverRow {
        outcome: "text",
        state: "jsonb",
        created_at: "timestamp with time zone",
        updated_at: "timestamp with time zone",
        expires_at: "timestamp with time zone",
        successor_id: "text",
    }
}

#[derive(diesel::QueryableByName)]
#[diesel(check_for_backend(Pg))]
pub(crate) struct RolloverRow {
    #[diesel(sql_type = Text)]
    pub outcome: RolloverOutcome,
    #[diesel(sql_type = Nullable<Text>)]
    pub successor_id: Option<String>,
}

store_function! {
    /// Drops the events after `keep` and rebuilds the session state from the
    /// initial state and the kept deltas, in one transaction.
    RewindSession => adk_rewind_session([key] keep: BigIntArg, expected_seq: OptBigIntArg)
        -> RewindRow { outcome: "text", seq: "bigint" }
}

store_function! {
    /// Starts a new session from the first `at_seq` events of another:
    /// copies them and rebuilds the session state, in one transaction.
    ForkSession => adk_fork_session([key] new_id: TextArg, at_seq: BigIntArg, ttl: OptIntervalArg)
        -> ForkRow { outcome: "text", seq: "bigint" }
}

#[derive(diesel::QueryableByName)]
#[diesel(check_for_backend(Pg))]
pub(crate) struct ForkRow {
    #[diesel(sql_type = Text)]
    pub outcome: ForkOutcome,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub seq: Option<i64>,
}

#[derive(diesel::QueryableByName)]
#[diesel(check_for_backend(Pg))]
pub(crate) struct RewindRow {
    #[diesel(sql_type = Text)]
    pub outcome: RewindOutcome,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub seq: Option<i64>,
}

store_function! {
    /// The live sessions with an id, across users and the apps the role may
    /// see, without reading any row it may not.
    FindSessions => adk_find_sessions(tenant: OptTextArg, session_id: TextArg, limit: IntArg)
        -> FoundRow { app_name: "text", user_id: "text" }
}

#[derive(diesel::QueryableByName)]
#[diesel(table_name = adk_sessions, check_for_backend(Pg))]
pub(crate) struct FoundRow {
    pub app_name: String,
    pub user_id: String,
}

outcome! {
    /// Which unit of work one `adk_erase_user_batch` call did.
    EraseOutcome {
        /// Sessions of the user hidden (expired with the erasure's mark).
        Marked = "marked",
        /// The newest events of one hidden session deleted.
        Events = "events",
        /// A hidden session without events deleted.
        Session = "session",
        /// Nothing: a session appeared or went meanwhile.
        Busy = "busy",
        /// Nothing: a rollup run is in progress.
        Waiting = "waiting",
        /// Invocation tails of the user deleted, more may follow.
        Tails = "tails",
        /// The last tails and the user state deleted, the audit record completed.
        Done = "done",
    }
}

store_function! {
    /// Records an erasure of a user as running, or joins the one already
    /// running for them (a rerun after an interruption).
    EraseUserBegin => adk_erase_user_begin(tenant: OptTextArg, app_name: TextArg, user_id: TextArg)
        -> ErasureBegunRow {
            erasure_id: "bigint",
            user_hash: "text",
            runs: "integer",
            started_at: "timestamp with time zone",
        }
}

#[derive(diesel::QueryableByName)]
#[diesel(check_for_backend(Pg))]
pub(crate) struct ErasureBegunRow {
    #[diesel(sql_type = BigInt)]
    pub erasure_id: i64,
    #[diesel(sql_type = Text)]
    pub user_hash: String,
    #[diesel(sql_type = Integer)]
    pub runs: i32,
}

store_function! {
    /// One bounded unit of an erasure in its own transaction, with the
    /// erasure's totals so far.
    EraseUserBatch => adk_erase_user_batch(
        tenant: OptTextArg,
        app_name: TextArg,
        user_id: TextArg,
        erasure_id: BigIntArg,
        batch_size: IntArg,
    ) -> ErasureBatchRow {
        step: "text",
        affected: "bigint",
        sessions: "bigint",
        events: "bigint",
        usage_tails: "bigint",
        user_state: "boolean",
    }
}

#[derive(diesel::QueryableByName)]
#[diesel(check_for_backend(Pg))]
pub(crate) struct ErasureBatchRow {
    #[diesel(sql_type = Text)]
    pub step: EraseOutcome,
    /// Rows this call marked or deleted.
    #[diesel(sql_type = BigInt)]
    pub affected: i64,
    #[diesel(sql_type = BigInt)]
    pub sessions: i64,
    #[diesel(sql_type = BigInt)]
    pub events: i64,
    #[diesel(sql_type = BigInt)]
    pub usage_tails: i64,
    #[diesel(sql_type = Bool)]
    pub user_state: bool,
}

store_function! {
    /// What erasing the user would remove, and their running erasure if an
    /// interrupted one waits to be resumed; writes nothing.
    EraseUserPreview => adk_erase_user_preview(tenant: OptTextArg, app_name: TextArg, user_id: TextArg)
        -> ErasurePreviewRow {
            user_hash: "text",
            sessions: "bigint",
            events: "bigint",
            usage_tails: "bigint",
            user_state: "boolean",
            running_erasure_id: "bigint",
        }
}

#[derive(diesel::QueryableByName)]
#[diesel(check_for_backend(Pg))]
pub(crate) struct ErasurePreviewRow {
    #[diesel(sql_type = Text)]
    pub user_hash: String,
    #[diesel(sql_type = BigInt)]
    pub sessions: i64,
    #[diesel(sql_type = BigInt)]
    pub events: i64,
    #[diesel(sql_type = BigInt)]
    pub usage_tails: i64,
    #[diesel(sql_type = Bool)]
    pub user_state: bool,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub running_erasure_id: Option<i64>,
}

store_function! {
    /// The archived objects of one app, or of every app for the owner
    /// (`app_name` NULL); a role bound to other apps is refused.
    ArchiveList => adk_archive_list(tenant: OptTextArg, app_name: OptTextArg)
        -> ArchivedObject {
            app_name: "text",
            day: "date",
            kind: "text",
            part: "integer",
            object_key: "text",
            destination: "text",
            rows: "bigint",
            bytes: "bigint",
            sha256: "bytea",
            format_version: "integer",
            day_events: "bigint",
            archived_at: "timestamp with time zone",
            archived_by: "name",
            verified_at: "timestamp with time zone",
        }
}

/// One object of the archive catalog, as `adk_archive_list` returns it.
#[derive(Debug, Clone, PartialEq, Eq, diesel::QueryableByName, serde::Serialize)]
#[diesel(check_for_backend(Pg))]
pub struct ArchivedObject {
    /// The app whose events the object holds.
    #[diesel(sql_type = Text)]
    pub app_name: String,
    /// The partition day (UTC) the events were in.
    #[diesel(sql_type = diesel::sql_types::Date)]
    pub day: chrono::NaiveDate,
    /// `events` or `media`.
    #[diesel(sql_type = Text)]
    pub kind: String,
    /// The object's number within its day and kind, from 0.
    #[diesel(sql_type = Integer)]
    pub part: i32,
    /// The object's key, relative to `destination`.
    #[diesel(sql_type = Text)]
    pub object_key: String,
    /// The archive URL the object was written to.
    #[diesel(sql_type = Text)]
    pub destination: String,
    /// Rows the object holds.
    #[diesel(sql_type = BigInt)]
    pub rows: i64,
    /// The object's size in bytes.
    #[diesel(sql_type = BigInt)]
    pub bytes: i64,
    /// SHA-256 of the object's bytes, checked when it was read back.
    #[diesel(sql_type = Bytea)]
    #[serde(serialize_with = "serialize_hex")]
    pub sha256: Vec<u8>,
    /// The archive format it was written in (`adk_postgres_archive::format`).
    #[diesel(sql_type = Integer)]
    pub format_version: i32,
    /// Events the day held for the app when it was archived.
    #[diesel(sql_type = BigInt)]
    pub day_events: i64,
    /// When it was recorded in the catalog.
    #[diesel(sql_type = Timestamptz)]
    pub archived_at: DateTime<Utc>,
    /// The role that archived it.
    #[diesel(sql_type = Text)]
    pub archived_by: String,
    /// When it was read back and checked.
    #[diesel(sql_type = Timestamptz)]
    pub verified_at: DateTime<Utc>,
}

fn serialize_hex<S: serde::Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
    use std::fmt::Write as _;
    let hex = bytes.iter().fold(String::with_capacity(bytes.len() * 2), |mut out, b| {
        let _ = write!(out, "{b:02x}");
        out
    });
    serializer.serialize_str(&hex)
}

/// The archive catalog as the connected role may see it: one app's objects
/// (`tenant` names the app a bound role acts for), or every app's for the
/// store's owner when `app_name` is `None`.
pub async fn list_archive(
    conn: &mut diesel_async::AsyncPgConnection,
    tenant: Option<&str>,
    app_name: Option<&str>,
) -> QueryResult<Vec<ArchivedObject>> {
    use diesel_async::RunQueryDsl as _;
    ArchiveList { tenant, app_name }.load::<ArchivedObject>(conn).await
}

/// Makes the policy's missing event partitions as the tables' owner: the
/// one DDL a service role may cause, when an append finds today's partition
/// missing. Written out because it takes no argument (the macro's wrappers
/// borrow theirs).
#[derive(Debug)]
pub(crate) struct PremakeEventPartitions;

impl PremakeEventPartitions {
    pub(crate) const SIGNATURE: Signature = Signature {
        name: "adk_premake_event_partitions",
        arguments: &[],
        columns: &[("adk_premake_event_partitions", "integer")],
    };
}

impl QueryFragment<Pg> for PremakeEventPartitions {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        out.push_sql("SELECT adk_premake_event_partitions FROM adk_premake_event_partitions()");
        Ok(())
    }
}

impl QueryId for PremakeEventPartitions {
    type QueryId = Self;
    const HAS_STATIC_QUERY_ID: bool = true;
}

impl Query for PremakeEventPartitions {
    type SqlType = Untyped;
}

#[derive(diesel::QueryableByName)]
pub(crate) struct PremadeRow {
    #[diesel(sql_type = Nullable<Integer>)]
    pub adk_premake_event_partitions: Option<i32>,
}

store_function! {
    /// Makes the calling connection (a change feed's own, never a pooled
    /// one) listen for one app's change notices, after the tenant check;
    /// refused with 42501 for an app the role may not act for.
    FeedListen => adk_feed_listen(tenant: OptTextArg, app_name: TextArg)
        -> FeedListenRow { channel: "text", backend_pid: "integer" }
}

#[derive(diesel::QueryableByName)]
#[diesel(check_for_backend(Pg))]
pub(crate) struct FeedListenRow {
    #[diesel(sql_type = Nullable<Text>)]
    pub channel: Option<String>,
    /// The listening server process, as `pg_stat_activity` knows it.
    #[diesel(sql_type = Nullable<Integer>)]
    pub backend_pid: Option<i32>,
}

store_function! {
    /// A change feed's read: the session's header, the event at `after_seq`
    /// (its id only, to tell a rewind under the watcher), then at most
    /// `limit` events after it, in one snapshot from one partition. No row
    /// when missing, expired or not the tenant's.
    ReadEventsAfter => adk_read_events_after([key] after_seq: BigIntArg, limit: IntArg)
        -> FeedRow {
            last_seq: "bigint",
            created_at: "timestamp with time zone",
            expires_at: "timestamp with time zone",
            closed_at: "timestamp with time zone",
            successor_id: "text",
            seq: "bigint",
            event_id: "text",
            payload: "jsonb",
        }
}

/// A row of `adk_read_events_after`: the header (no `seq`), then events
/// (a `seq` and an `event_id`; a `payload` on all but the one at
/// `after_seq`).
#[derive(diesel::QueryableByName)]
#[diesel(check_for_backend(Pg))]
pub(crate) struct FeedRow {
    #[diesel(sql_type = Nullable<BigInt>)]
    pub last_seq: Option<i64>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub created_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub expires_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub closed_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<Text>)]
    pub successor_id: Option<String>,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub seq: Option<i64>,
    #[diesel(sql_type = Nullable<Text>)]
    pub event_id: Option<String>,
    #[diesel(sql_type = Nullable<Jsonb>)]
    pub payload: Option<StoredEvent>,
}

outcome! {
    /// What `adk_redact_event` did.
    RedactOutcome {
        /// The event is now a tombstone.
        Redacted = "redacted",
        /// It was redacted before and this call would remove nothing more.
        Already = "already",
        /// No live session with this key.
        NotFound = "not_found",
        /// The session holds no event with this id.
        NoEvent = "no_event",
    }
}

store_function! {
    /// Replaces one event's payload with its tombstone and writes the audit
    /// row, in one transaction.
    RedactEvent => adk_redact_event([key] event_id: TextArg, reason: TextArg, state_delta: BoolArg)
        -> RedactRow { outcome: "text", seq: "bigint", payload: "jsonb" }
}

#[derive(diesel::QueryableByName)]
#[diesel(check_for_backend(Pg))]
pub(crate) struct RedactRow {
    #[diesel(sql_type = Text)]
    pub outcome: RedactOutcome,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub seq: Option<i64>,
    /// The event as stored after the call.
    #[diesel(sql_type = Nullable<Jsonb>)]
    pub payload: Option<StoredEvent>,
}

store_function! {
    /// The user's state in the app, `{}` when there is none; refused (42501)
    /// for an app the role may not act for.
    GetUserState => adk_get_user_state(tenant: OptTextArg, app_name: TextArg, user_id: TextArg)
        -> ScopeStateRow { state: "jsonb" }
}

store_function! {
    /// The app's state, `{}` when there is none; refused (42501) for an app
    /// the role may not act for.
    GetAppState => adk_get_app_state(tenant: OptTextArg, app_name: TextArg) -> ScopeStateRow { state: "jsonb" }
}

store_function! {
    /// Merges a delta into the user's state under the row lock an append
    /// takes, and returns the state after it; an empty delta writes nothing.
    MergeUserState => adk_merge_user_state(tenant: OptTextArg, app_name: TextArg, user_id: TextArg, delta: JsonArg)
        -> ScopeStateRow { state: "jsonb" }
}

store_function! {
    /// Merges a delta into the app's state under the row lock an append
    /// takes, and returns the state after it; an empty delta writes nothing.
    MergeAppState => adk_merge_app_state(tenant: OptTextArg, app_name: TextArg, delta: JsonArg)
        -> ScopeStateRow { state: "jsonb" }
}

/// One scope's state, as the state functions return it.
#[derive(diesel::QueryableByName)]
#[diesel(check_for_backend(Pg))]
pub(crate) struct ScopeStateRow {
    #[diesel(sql_type = Nullable<Jsonb>)]
    pub state: Option<Value>,
}

store_function! {
    /// One page of a session's events: the header (the version), then at
    /// most `limit + 1` events after `after` or before `before` (exactly one
    /// is given), in the page's direction, from the session's one partition
    /// in one snapshot. No row when missing, expired or not the tenant's.
    ListEvents => adk_list_events([key] after: OptBigIntArg, before: OptBigIntArg, limit: BigIntArg)
        -> EventPageRow { last_seq: "bigint", seq: "bigint", payload: "jsonb" }
}

/// A row of `adk_list_events`: the header (a `last_seq`, no `seq`), then
/// events (a `seq` and a `payload`).
#[derive(diesel::QueryableByName)]
#[diesel(check_for_backend(Pg))]
pub(crate) struct EventPageRow {
    #[diesel(sql_type = Nullable<BigInt>)]
    pub last_seq: Option<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub seq: Option<i64>,
    #[diesel(sql_type = Nullable<Jsonb>)]
    pub payload: Option<StoredEvent>,
}

store_function! {
    /// One keyset page of an app's live sessions across its users, newest
    /// created first, with the user listing's filters: a header row with
    /// the app state, then the sessions, each with its user's state.
    /// Refused (42501) for a role that may not act for the app.
    ListAppSessions => adk_list_app_sessions(
        tenant: OptTextArg,
        app_name: TextArg,
        after_created: OptTimestamptzArg,
        after_user: OptTextArg,
        after_session: OptTextArg,
        limit: BigIntArg,
        labels: JsonArg,
        updated_after: OptTimestamptzArg,
        updated_before: OptTimestamptzArg,
    ) -> AppSummaryRow {
        user_id: "text",
        session_id: "text",
        state: "jsonb",
        last_seq: "bigint",
        created_at: "timestamp with time zone",
        updated_at: "timestamp with time zone",
        expires_at: "timestamp with time zone",
        display_name: "text",
        labels: "jsonb",
        user_state: "jsonb",
        app_state: "jsonb",
    }
}

/// A row of `adk_list_app_sessions`: the header (only `app_state`), then
/// sessions (everything but `app_state`).
#[derive(diesel::QueryableByName)]
#[diesel(check_for_backend(Pg))]
pub(crate) struct AppSummaryRow {
    #[diesel(sql_type = Nullable<Text>)]
    pub user_id: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    pub session_id: Option<String>,
    #[diesel(sql_type = Nullable<Jsonb>)]
    pub state: Option<Value>,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub last_seq: Option<i64>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub created_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub updated_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub expires_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<Text>)]
    pub display_name: Option<String>,
    #[diesel(sql_type = Nullable<Jsonb>)]
    pub labels: Option<StoredLabels>,
    #[diesel(sql_type = Nullable<Jsonb>)]
    pub user_state: Option<Value>,
    #[diesel(sql_type = Nullable<Jsonb>)]
    pub app_state: Option<Value>,
}

/// Every function the store calls: exactly what a service role may execute.
pub const SIGNATURES: &[Signature] = &[
    CreateSession::SIGNATURE,
    ReadSession::SIGNATURE,
    GetSession::SIGNATURE,
    ReadSessions::SIGNATURE,
    ListSessions::SIGNATURE,
    SetSessionMetadata::SIGNATURE,
    DeleteSession::SIGNATURE,
    AppendEvent::SIGNATURE,
    GetBlobs::SIGNATURE,
    RolloverSession::SIGNATURE,
    RewindSession::SIGNATURE,
    FindSessions::SIGNATURE,
    PremakeEventPartitions::SIGNATURE,
    EraseUserBegin::SIGNATURE,
    EraseUserBatch::SIGNATURE,
    EraseUserPreview::SIGNATURE,
    ForkSession::SIGNATURE,
    FeedListen::SIGNATURE,
    ReadEventsAfter::SIGNATURE,
    RedactEvent::SIGNATURE,
    ArchiveList::SIGNATURE,
    GetUserState::SIGNATURE,
    GetAppState::SIGNATURE,
    MergeUserState::SIGNATURE,
    MergeAppState::SIGNATURE,
    ListEvents::SIGNATURE,
    ListAppSessions::SIGNATURE,
];

#[cfg(test)]
mod tests {
    use super::events_from_array;

    /// A `jsonb[]` as the server sends it in binary: header, one dimension,
    /// then each element.
    fn array(elements: &[Option<&[u8]>]) -> Vec<u8> {
        let mut bytes = Vec::new();
        for word in [1i32, 0, 3802, i32::try_from(elements.len()).unwrap(), 1] {
            bytes.extend_from_slice(&word.to_be_bytes());
        }
        for element in elements {
            match element {
                Some(element) => {
                    bytes.extend_from_slice(&i32::try_from(element.len()).unwrap().to_be_bytes());
                    bytes.extend_from_slice(element);
                }
                None => bytes.extend_from_slice(&(-1i32).to_be_bytes()),
            }
        }
        bytes
    }

    #[test]
    fn events_come_out_in_order_without_the_version_byte() {
        let events = events_from_array(&array(&[Some(b"\x01{\"a\": 1}"), Some(b"\x01[]")])).unwrap();
        assert_eq!(events.iter().collect::<Vec<_>>(), [&b"{\"a\": 1}"[..], &b"[]"[..]]);
        let mut empty = Vec::new();
        for word in [0i32, 0, 3802] {
            empty.extend_from_slice(&word.to_be_bytes());
        }
        assert_eq!(events_from_array(&empty).unwrap().len(), 0);
    }

    #[test]
    fn a_malformed_array_is_an_error_never_a_panic() {
        let good = array(&[Some(b"\x01{}"), Some(b"\x01{}")]);
        for cut in 0..good.len() {
            assert!(events_from_array(&good[..cut]).is_err(), "cut at {cut}");
        }
        let mut trailing = good.clone();
        trailing.push(0);
        assert!(events_from_array(&trailing).is_err());
        assert!(events_from_array(&array(&[Some(b"\x01{}"), None])).unwrap_err().contains("null"));
        assert!(events_from_array(&array(&[Some(b"\x02{}")])).unwrap_err().contains("version"));
        let mut two_dimensions = good;
        two_dimensions[3] = 2;
        assert!(events_from_array(&two_dimensions).unwrap_err().contains("dimensions"));
        let mut huge = array(&[]);
        huge[12..16].copy_from_slice(&i32::MAX.to_be_bytes());
        assert!(events_from_array(&huge).is_err());
    }
}
