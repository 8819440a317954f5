//! A call of one of the store's SQL functions as a query diesel-async keeps
//! prepared per connection.
//!
//! diesel's `sql_query` marks itself unsafe to cache (its text may be built
//! from anything), so every call would parse and plan again: two round trips
//! instead of one. The store's statements are fixed texts with every value
//! bound, so they are safe to cache; this type says so.

use chrono::{DateTime, NaiveDate, Utc};
use diesel::QueryResult;
use diesel::data_types::PgInterval;
use diesel::pg::Pg;
use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};
use diesel::sql_types::{BigInt, Date, Integer, Interval, Jsonb, Nullable, Text, Timestamptz, Untyped};
use serde_json::Value;

/// One bound argument.
#[derive(Debug)]
pub(crate) enum Arg<'a> {
    Text(&'a str),
    OptText(Option<&'a str>),
    Json(&'a Value),
    BigInt(i64),
    OptBigInt(Option<i64>),
    Int(i32),
    Date(NaiveDate),
    OptTimestamptz(Option<DateTime<Utc>>),
    OptInterval(Option<PgInterval>),
}

/// `SELECT <columns> FROM <function>($1, …)`: `head` is everything up to the
/// opening parenthesis of the argument list.
#[derive(Debug)]
pub(crate) struct Call<'a> {
    head: &'static str,
    args: Vec<Arg<'a>>,
}

impl<'a> Call<'a> {
    pub(crate) fn new(head: &'static str) -> Self {
        Self { head, args: Vec::with_capacity(16) }
    }

    pub(crate) fn arg(mut self, arg: Arg<'a>) -> Self {
        self.args.push(arg);
        self
    }
}

impl QueryFragment<Pg> for Call<'_> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        out.push_sql(self.head);
        out.push_sql("(");
        for (i, arg) in self.args.iter().enumerate() {
            if i > 0 {
                out.push_sql(", ");
            }
            match arg {
                Arg::Text(v) => out.push_bind_param::<Text, _>(v)?,
                Arg::OptText(v) => out.push_bind_param::<Nullable<Text>, _>(v)?,
                Arg::Json(v) => out.push_bind_param::<Jsonb, _>(*v)?,
                Arg::BigInt(v) => out.push_bind_param::<BigInt, _>(v)?,
                Arg::OptBigInt(v) => out.push_bind_param::<Nullable<BigInt>, _>(v)?,
                Arg::Int(v) => out.push_bind_param::<Integer, _>(v)?,
                Arg::Date(v) => out.push_bind_param::<Date, _>(v)?,
                Arg::OptTimestamptz(v) => out.push_bind_param::<Nullable<Timestamptz>, _>(v)?,
                Arg::OptInterval(v) => out.push_bind_param::<Nullable<Interval>, _>(v)?,
            }
        }
        out.push_sql(")");
        Ok(())
    }
}

impl QueryId for Call<'_> {
    type QueryId = ();
    // The text is fixed per head and argument count, so the statement cache
    // keys it by its SQL.
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl Query for Call<'_> {
    type SqlType = Untyped;
}
