//! The store's own connection: a tokio-postgres client on which each typed
//! statement is sent as an unnamed statement in one round trip (Parse,
//! Bind, Describe, Execute and Sync together, tokio-postgres'
//! `query_typed`), and read to PostgreSQL's ReadyForQuery.
//!
//! Why not diesel-async's connection: it prepares named statements and
//! keeps them per connection, and it runs `SET`s after connecting. Behind
//! a transaction-mode pooler (PgBouncer, RDS Proxy, Supavisor) the next
//! statement may reach another server connection, where the name does not
//! exist or names another client's statement, and the `SET`s reach
//! whichever client gets that server connection next. An unnamed statement
//! in one protocol cycle is one transaction to a pooler, so it works there,
//! and on a direct connection it costs the same single round trip.
//!
//! The statements themselves stay diesel's: the typed wrappers of
//! [`crate::functions`] are rendered to SQL and bound values with diesel's
//! own query builder, and result rows decode through `QueryableByName`.
//!
//! The connection's socket side (tokio-postgres' `Connection`) is polled by
//! the call running a statement, in its own task, rather than by a task
//! spawned per connection: handing every reply from the connection's task
//! to the caller's, on another worker thread, was a third of a read's
//! client CPU, most of it the kernel waking threads. An idle connection is
//! polled once when the pool checks it out, so one the server closed
//! meanwhile is found then and replaced.
//!
//! A connection in the middle of a statement is never reused: if the call
//! waiting on it is dropped (its bound passed, or its caller gave up), the
//! pool sees it still busy and discards it, and a cancel request asks the
//! server to stop the statement.

use std::cell::Cell;
use std::future::Future;
use std::num::NonZeroU32;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use diesel::QueryResult;
use diesel::deserialize::QueryableByName;
use diesel::pg::{Pg, PgMetadataLookup, PgQueryBuilder, PgTypeMetadata, PgValue, TypeOidLookup};
use diesel::query_builder::bind_collector::RawBytesBindCollector;
use diesel::query_builder::{QueryBuilder, QueryFragment};
use diesel::result::{DatabaseErrorInformation, DatabaseErrorKind, Error as DieselError};
use diesel::row::{Field, PartialRow, Row, RowIndex, RowSealed};
use tokio_postgres::types::{FromSql, IsNull, ToSql, Type, to_sql_checked};

use adk_postgres_connect::tokio_postgres;

/// One connection of the store's pool.
pub struct PgConn {
    client: tokio_postgres::Client,
    /// `None` once it ended: the client's requests then fail at once.
    connection: Option<adk_postgres_connect::PgConnection>,
    /// Set while a statement is on the wire: a connection dropped or
    /// returned in that state has an answer (or a commit) in flight and
    /// must not serve anyone else.
    busy: bool,
    cancel: tokio_postgres::CancelToken,
    tls: adk_postgres_connect::TlsConnector,
}

impl std::fmt::Debug for PgConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgConn").field("busy", &self.busy).field("closed", &self.client.is_closed()).finish()
    }
}

impl PgConn {
    pub(crate) fn new(
        connected: adk_postgres_connect::Connected,
        config: &adk_postgres_connect::ConnectConfig,
    ) -> Self {
        let cancel = connected.client.cancel_token();
        Self {
            client: connected.client,
            connection: Some(connected.connection),
            busy: false,
            cancel,
            tls: config.tls_connector(),
        }
    }

    /// Whether the pool must drop this connection rather than keep it. An
    /// idle connection is polled once, without waiting, so that what the
    /// server sent while nobody used it (a termination, a closed socket) is
    /// read now rather than by the next statement.
    pub(crate) fn is_broken(&mut self) -> bool {
        if let Some(connection) = self.connection.as_mut() {
            let mut idle = Context::from_waker(Waker::noop());
            if let Poll::Ready(ended) = Pin::new(connection).poll(&mut idle) {
                log_end(ended);
                self.connection = None;
            }
        }
        self.busy || self.connection.is_none() || self.client.is_closed()
    }

    /// Marks the connection unusable, so the pool drops it on return.
    pub(crate) fn discard(&mut self) {
        self.busy = true;
    }

    /// Runs `query` and reads all its rows, up to ReadyForQuery: an
    /// autocommit statement commits at its Sync, so only then is a write
    /// known to be stored.
    pub async fn load<R>(&mut self, query: &(impl QueryFragment<Pg> + ?Sized)) -> QueryResult<Vec<R>>
    where
        R: QueryableByName<Pg>,
    {
        let (sql, binds) = render(query)?;
        self.run(&sql, &binds).await
    }

    async fn run<R>(&mut self, sql: &str, binds: &[Bind]) -> QueryResult<Vec<R>>
    where
        R: QueryableByName<Pg>,
    {
        let params: Vec<(&(dyn ToSql + Sync), Type)> =
            binds.iter().map(|bind| (bind as &(dyn ToSql + Sync), bind.ty.clone())).collect();
        self.busy = true;
        let rows = drive(&mut self.connection, self.client.query_typed(sql, &params)).await;
        // A server error ends the cycle too: the connection is as good as
        // before. A lost connection is closed and found broken anyway.
        self.busy = false;
        let rows = rows.map_err(driver_error)?;
        rows.iter().map(|row| R::build(&DieselRow::new(row)).map_err(DieselError::DeserializationError)).collect()
    }

    /// Runs statements without parameters or results, as one simple query.
    pub async fn batch_execute(&mut self, sql: &str) -> QueryResult<()> {
        self.busy = true;
        let result = drive(&mut self.connection, self.client.batch_execute(sql)).await;
        self.busy = false;
        result.map_err(driver_error)
    }
}

impl Drop for PgConn {
    fn drop(&mut self) {
        if self.busy && !self.client.is_closed() {
            // The caller stopped waiting mid-statement: ask the server to
            // stop it too (through a partition the cancel goes on a new
            // connection, which may pass where the old one is silent).
            let cancel = self.cancel.clone();
            let tls = self.tls.clone();
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    let bound = adk_postgres_connect::DEFAULT_CONNECT_TIMEOUT;
                    let _ = tokio::time::timeout(bound, cancel.cancel_query(tls)).await;
                });
            }
        }
        // The connection goes with the struct, closing its socket now
        // rather than when the kernel gives up on a silent peer.
    }
}

/// Runs `work` (a request of the connection's client) while polling the
/// connection itself in the same task, so the reply is read and handed
/// over without waking another thread. The connection is polled between
/// two polls of `work`: the first sends the request to it, the second
/// takes the reply it just read.
async fn drive<T>(
    connection: &mut Option<adk_postgres_connect::PgConnection>,
    work: impl Future<Output = Result<T, tokio_postgres::Error>>,
) -> Result<T, tokio_postgres::Error> {
    let mut work = std::pin::pin!(work);
    std::future::poll_fn(|cx| {
        if let Poll::Ready(done) = work.as_mut().poll(cx) {
            return Poll::Ready(done);
        }
        if let Some(open) = connection.as_mut()
            && let Poll::Ready(ended) = Pin::new(open).poll(cx)
        {
            log_end(ended);
            // Dropping it fails whatever the client still waits for.
            *connection = None;
        }
        work.as_mut().poll(cx)
    })
    .await
}

fn log_end(ended: Result<(), tokio_postgres::Error>) {
    if let Err(error) = ended {
        tracing::debug!(%error, "database connection ended");
    }
}

/// A bound value as diesel serialized it, sent with its type.
#[derive(Debug)]
struct Bind {
    ty: Type,
    bytes: Option<Vec<u8>>,
}

impl ToSql for Bind {
    fn to_sql(
        &self,
        _ty: &Type,
        out: &mut tokio_postgres::types::private::BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        match &self.bytes {
            Some(bytes) => {
                out.extend_from_slice(bytes);
                Ok(IsNull::No)
            }
            None => Ok(IsNull::Yes),
        }
    }

    fn accepts(_ty: &Type) -> bool {
        true
    }

    to_sql_checked!();
}

/// The store's statements use built-in types only; a custom type would
/// need a catalog lookup, which is a round trip of its own.
struct BuiltinTypesOnly;

impl PgMetadataLookup for BuiltinTypesOnly {
    fn lookup_type(&mut self, type_name: &str, _schema: Option<&str>) -> PgTypeMetadata {
        let key = diesel::pg::PgMetadataCacheKey::new(None, type_name.to_owned().into());
        PgTypeMetadata::from_result(Err(diesel::pg::FailedToLookupTypeError::new(key)))
    }
}

fn render(query: &(impl QueryFragment<Pg> + ?Sized)) -> QueryResult<(String, Vec<Bind>)> {
    let mut builder = PgQueryBuilder::default();
    query.to_sql(&mut builder, &Pg)?;
    let sql = builder.finish();
    let mut collector = RawBytesBindCollector::<Pg>::new();
    query.collect_binds(&mut collector, &mut BuiltinTypesOnly, &Pg)?;
    let binds = collector
        .metadata
        .iter()
        .zip(collector.binds)
        .map(|(metadata, bytes)| {
            let oid = metadata.oid().map_err(|e| DieselError::SerializationError(Box::new(e)))?;
            let ty = Type::from_oid(oid).ok_or_else(|| {
                DieselError::SerializationError(format!("a bound value of type oid {oid} is not built in").into())
            })?;
            Ok(Bind { ty, bytes })
        })
        .collect::<QueryResult<Vec<_>>>()?;
    Ok((sql, binds))
}

/// A driver failure as diesel's error, so the one classifier
/// ([`crate::pg_error`]) reads both; the SQLSTATE is kept exact.
pub(crate) fn driver_error(error: tokio_postgres::Error) -> DieselError {
    use tokio_postgres::error::SqlState;
    let Some(db) = error.as_db_error() else {
        return DieselError::DatabaseError(DatabaseErrorKind::ClosedConnection, Box::new(error.to_string()));
    };
    let kind = match *db.code() {
        SqlState::UNIQUE_VIOLATION => DatabaseErrorKind::UniqueViolation,
        SqlState::FOREIGN_KEY_VIOLATION => DatabaseErrorKind::ForeignKeyViolation,
        SqlState::RESTRICT_VIOLATION => DatabaseErrorKind::RestrictViolation,
        SqlState::EXCLUSION_VIOLATION => DatabaseErrorKind::ExclusionViolation,
        SqlState::T_R_SERIALIZATION_FAILURE => DatabaseErrorKind::SerializationFailure,
        SqlState::READ_ONLY_SQL_TRANSACTION => DatabaseErrorKind::ReadOnlyTransaction,
        SqlState::NOT_NULL_VIOLATION => DatabaseErrorKind::NotNullViolation,
        SqlState::CHECK_VIOLATION => DatabaseErrorKind::CheckViolation,
        _ => DatabaseErrorKind::Unknown,
    };
    DieselError::DatabaseError(kind, Box::new(DbErrorInfo(db.clone())))
}

struct DbErrorInfo(tokio_postgres::error::DbError);

impl DatabaseErrorInformation for DbErrorInfo {
    fn message(&self) -> &str {
        self.0.message()
    }
    fn details(&self) -> Option<&str> {
        self.0.detail()
    }
    fn hint(&self) -> Option<&str> {
        self.0.hint()
    }
    fn table_name(&self) -> Option<&str> {
        self.0.table()
    }
    fn column_name(&self) -> Option<&str> {
        self.0.column()
    }
    fn constraint_name(&self) -> Option<&str> {
        self.0.constraint()
    }
    fn statement_position(&self) -> Option<i32> {
        None
    }
}

/// A tokio-postgres row read by diesel's `QueryableByName`, which asks for
/// each field by name. The row structs list their fields in the order of
/// the statement's columns, so the column after the last one found is
/// tried first: a name is found with one comparison instead of a scan.
struct DieselRow<'r> {
    row: &'r tokio_postgres::Row,
    next: Cell<usize>,
}

impl<'r> DieselRow<'r> {
    fn new(row: &'r tokio_postgres::Row) -> Self {
        Self { row, next: Cell::new(0) }
    }
}

impl RowSealed for DieselRow<'_> {}

impl<'a> Row<'a, Pg> for DieselRow<'_> {
    type Field<'f>
        = DieselField<'f>
    where
        'a: 'f,
        Self: 'f;
    type InnerPartialRow = Self;

    fn field_count(&self) -> usize {
        self.row.len()
    }

    fn get<'b, I>(&'b self, idx: I) -> Option<Self::Field<'b>>
    where
        'a: 'b,
        Self: RowIndex<I>,
    {
        let idx = self.idx(idx)?;
        let oid = NonZeroU32::new(self.row.columns().get(idx)?.type_().oid())?;
        Some(DieselField { row: self.row, idx, oid: Oid(oid) })
    }

    fn partial_row(&self, range: std::ops::Range<usize>) -> PartialRow<'_, Self::InnerPartialRow> {
        PartialRow::new(self, range)
    }
}

impl RowIndex<usize> for DieselRow<'_> {
    fn idx(&self, idx: usize) -> Option<usize> {
        (idx < self.row.len()).then_some(idx)
    }
}

impl<'n> RowIndex<&'n str> for DieselRow<'_> {
    fn idx(&self, name: &'n str) -> Option<usize> {
        let columns = self.row.columns();
        let hint = self.next.get();
        let found = if columns.get(hint).is_some_and(|column| column.name() == name) {
            Some(hint)
        } else {
            columns.iter().position(|column| column.name() == name)
        };
        if let Some(index) = found {
            self.next.set(index + 1);
        }
        found
    }
}

struct Oid(NonZeroU32);

impl TypeOidLookup for Oid {
    fn lookup(&self) -> NonZeroU32 {
        self.0
    }
}

struct DieselField<'f> {
    row: &'f tokio_postgres::Row,
    idx: usize,
    oid: Oid,
}

/// A column's bytes, whatever its type: diesel decodes them.
struct RawColumn<'b>(Option<&'b [u8]>);

impl<'b> FromSql<'b> for RawColumn<'b> {
    fn from_sql(_ty: &Type, raw: &'b [u8]) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        Ok(Self(Some(raw)))
    }

    fn from_sql_null(_ty: &Type) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        Ok(Self(None))
    }

    fn accepts(_ty: &Type) -> bool {
        true
    }
}

impl<'f> Field<'f, Pg> for DieselField<'f> {
    fn field_name(&self) -> Option<&str> {
        Some(self.row.columns()[self.idx].name())
    }

    fn value(&self) -> Option<PgValue<'_>> {
        let RawColumn(raw) = self.row.try_get(self.idx).ok()?;
        raw.map(|bytes| PgValue::new(bytes, &self.oid))
    }
}

/// `query.load::<Row>(&mut conn)` on the store's connection, as diesel
/// spells it: the statement is rendered before anything is awaited, so the
/// future holds only its text and bound bytes.
pub(crate) trait Load: QueryFragment<Pg> + Sized {
    fn load<'c, R>(self, conn: &'c mut PgConn) -> impl Future<Output = QueryResult<Vec<R>>> + Send + 'c
    where
        R: QueryableByName<Pg> + 'c,
    {
        let rendered = render(&self);
        async move {
            let (sql, binds) = rendered?;
            conn.run(&sql, &binds).await
        }
    }
}

impl<Q: QueryFragment<Pg>> Load for Q {}
