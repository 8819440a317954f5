//! What one bucket holds, how buckets merge, and how authors above the cap
//! are folded.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::str::FromStr;

use bigdecimal::BigDecimal;
use chrono::{DateTime, Datelike, Duration, TimeZone, Timelike, Utc};
use serde::Serialize;

use crate::sketch::{Distinct, Quantiles};

/// A rollup level: the width of its buckets and the table holding them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Level {
    /// Minute buckets, rolled up from the events (`adk_usage_1m`).
    #[serde(rename = "1m")]
    Minute,
    /// Hour buckets, recomputed from the minutes (`adk_usage_1h`).
    #[serde(rename = "1h")]
    Hour,
    /// Day buckets, recomputed from the hours (`adk_usage_1d`).
    #[serde(rename = "1d")]
    Day,
}

impl Level {
    /// Every level, finest first.
    pub const ALL: [Level; 3] = [Level::Minute, Level::Hour, Level::Day];

    /// The name the SQL functions and the CLI use: `1m`, `1h`, `1d`.
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Minute => "1m",
            Level::Hour => "1h",
            Level::Day => "1d",
        }
    }

    /// The table holding this level's rows.
    pub fn table(self) -> &'static str {
        match self {
            Level::Minute => adk_postgres_schema::names::USAGE_MINUTES,
            Level::Hour => adk_postgres_schema::names::USAGE_HOURS,
            Level::Day => adk_postgres_schema::names::USAGE_DAYS,
        }
    }

    /// How much time one bucket covers.
    pub fn width(self) -> Duration {
        match self {
            Level::Minute => Duration::minutes(1),
            Level::Hour => Duration::hours(1),
            Level::Day => Duration::days(1),
        }
    }

    /// The start of the bucket holding `at` (UTC).
    pub fn bucket_of(self, at: DateTime<Utc>) -> DateTime<Utc> {
        let day = Utc.from_utc_datetime(&at.date_naive().and_hms_opt(0, 0, 0).unwrap_or_default());
        match self {
            Level::Minute => day + Duration::minutes(i64::from(at.hour() * 60 + at.minute())),
            Level::Hour => day + Duration::hours(i64::from(at.hour())),
            Level::Day => day,
        }
    }

    /// The level each bucket of this one is made from; `None` for minutes,
    /// which are made from the events themselves.
    pub fn source(self) -> Option<Level> {
        match self {
            Level::Minute => None,
            Level::Hour => Some(Level::Minute),
            Level::Day => Some(Level::Hour),
        }
    }

    /// The start of the partition holding `bucket`: a day of minutes, a
    /// month of hours, a year of days.
    pub fn partition_of(self, bucket: DateTime<Utc>) -> DateTime<Utc> {
        let date = bucket.date_naive();
        let first = match self {
            Level::Minute => date,
            Level::Hour => date.with_day(1).unwrap_or(date),
            Level::Day => date.with_day(1).and_then(|d| d.with_month(1)).unwrap_or(date),
        };
        Utc.from_utc_datetime(&first.and_hms_opt(0, 0, 0).unwrap_or_default())
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What an event counts as (the SQL function `adk_usage_kind` decides).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// An event authored by `user` that is none of the kinds below.
    UserMessage,
    /// An agent's event that is none of the kinds below.
    ModelResponse,
    /// An event whose content calls a function (a tool).
    ToolCall,
    /// An event whose content carries a function's response.
    ToolResult,
    /// An event with an `error_code`.
    Error,
}

impl Kind {
    /// Every kind.
    pub const ALL: [Kind; 5] = [Kind::UserMessage, Kind::ModelResponse, Kind::ToolCall, Kind::ToolResult, Kind::Error];

    /// The name the tables and the CLI use, such as `tool_call`.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::UserMessage => "user_message",
            Kind::ModelResponse => "model_response",
            Kind::ToolCall => "tool_call",
            Kind::ToolResult => "tool_result",
            Kind::Error => "error",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Kind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Kind::ALL.into_iter().find(|k| k.as_str() == s).ok_or_else(|| format!("unknown kind {s:?}"))
    }
}

/// Who a row counts: one author, or every author folded above the cap.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Author {
    /// One author: `user` or an agent's name.
    Named(String),
    /// Every author of the bucket beyond the run's author cap, in one row.
    Folded,
}

impl Author {
    /// How the tables store it: `(author, folded)`.
    pub fn columns(&self) -> (&str, bool) {
        match self {
            Author::Named(name) => (name, false),
            Author::Folded => ("", true),
        }
    }

    /// The author of a row, from its `(author, folded)` columns.
    pub fn from_columns(author: String, folded: bool) -> Self {
        if folded { Author::Folded } else { Author::Named(author) }
    }
}

impl fmt::Display for Author {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Author::Named(name) => f.write_str(name),
            Author::Folded => f.write_str("(other)"),
        }
    }
}

/// One row of a level: an app's bucket for one author and kind.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BucketKey {
    /// The app.
    pub app: String,
    /// The bucket's start, UTC.
    pub start: DateTime<Utc>,
    /// Whose events.
    pub author: Author,
    /// What kind of events.
    pub kind: Kind,
}

/// What one event contributes.
#[derive(Debug, Clone)]
pub struct EventFacts<'a> {
    pub session_key: &'a str,
    pub user_id: &'a str,
    pub payload_bytes: i32,
    pub prompt_tokens: i64,
    pub candidates_tokens: i64,
    pub total_tokens: i64,
    pub cost: Option<BigDecimal>,
    /// Milliseconds since the previous event of the same invocation.
    pub latency_ms: Option<f64>,
}

/// Counts, sums, extremes and sketches of a bucket. Averages are never
/// kept: they are divided out of sums and counts when read.
#[derive(Debug, Clone, Default)]
pub struct Aggregate {
    /// Events counted.
    pub events: i64,
    /// Their payload sizes summed, in bytes (a redacted event counts its
    /// original's size).
    pub payload_bytes: i64,
    /// The smallest payload, in bytes; 0 when there are no events.
    pub payload_bytes_min: i32,
    /// The largest payload, in bytes.
    pub payload_bytes_max: i32,
    /// `usage_metadata.prompt_token_count` summed.
    pub prompt_tokens: i64,
    /// `usage_metadata.candidates_token_count` summed.
    pub candidates_tokens: i64,
    /// `usage_metadata.total_token_count` summed.
    pub total_tokens: i64,
    /// `usage_metadata.cost` summed, exactly; `None` when no event carried
    /// a cost.
    pub cost: Option<BigDecimal>,
    /// Events that carried a cost.
    pub cost_events: i64,
    /// Events of kind [`Kind::Error`].
    pub errors: i64,
    /// Milliseconds from the previous event of the same invocation.
    pub latency: Quantiles,
    /// Payload sizes, in bytes.
    pub size: Quantiles,
    /// Distinct sessions.
    pub sessions: Distinct,
    /// Distinct users.
    pub users: Distinct,
    /// Distinct authors folded into this row; only on folded rows.
    pub folded_authors: Option<Distinct>,
}

impl Aggregate {
    /// Counts one event of `kind`.
    pub fn add_event(&mut self, kind: Kind, facts: &EventFacts<'_>) {
        self.payload_bytes_min =
            if self.events == 0 { facts.payload_bytes } else { self.payload_bytes_min.min(facts.payload_bytes) };
        self.payload_bytes_max = self.payload_bytes_max.max(facts.payload_bytes);
        self.events += 1;
        self.payload_bytes += i64::from(facts.payload_bytes);
        self.prompt_tokens += facts.prompt_tokens;
        self.candidates_tokens += facts.candidates_tokens;
        self.total_tokens += facts.total_tokens;
        if let Some(cost) = &facts.cost {
            self.cost = Some(self.cost.take().unwrap_or_default() + cost);
            self.cost_events += 1;
        }
        if kind == Kind::Error {
            self.errors += 1;
        }
        if let Some(latency) = facts.latency_ms {
            self.latency.add(latency);
        }
        self.size.add(f64::from(facts.payload_bytes));
        self.sessions.add(facts.session_key);
        self.users.add(facts.user_id);
    }

    /// Adds `other`'s counts, sums, extremes and sketches, as if its
    /// events had been added here.
    pub fn merge(&mut self, other: &Aggregate) {
        if other.events == 0 {
            return;
        }
        self.payload_bytes_min = if self.events == 0 {
            other.payload_bytes_min
        } else {
            self.payload_bytes_min.min(other.payload_bytes_min)
        };
        self.payload_bytes_max = self.payload_bytes_max.max(other.payload_bytes_max);
        self.events += other.events;
        self.payload_bytes += other.payload_bytes;
        self.prompt_tokens += other.prompt_tokens;
        self.candidates_tokens += other.candidates_tokens;
        self.total_tokens += other.total_tokens;
        if let Some(cost) = &other.cost {
            self.cost = Some(self.cost.take().unwrap_or_default() + cost);
        }
        self.cost_events += other.cost_events;
        self.errors += other.errors;
        self.latency.merge(&other.latency);
        self.size.merge(&other.size);
        self.sessions.merge(&other.sessions);
        self.users.merge(&other.users);
        if let Some(folded) = &other.folded_authors {
            self.folded_authors.get_or_insert_with(Distinct::default).merge(folded);
        }
    }
}

/// Keeps at most `cap` named authors per (app, bucket): those with the
/// most events (ties by name), folding every other author's rows into one
/// row per kind. Totals are unchanged by folding. Returns how many named
/// authors were folded.
pub fn cap_authors(rows: &mut BTreeMap<BucketKey, Aggregate>, cap: usize) -> usize {
    let mut per_bucket: HashMap<(String, DateTime<Utc>), HashMap<String, i64>> = HashMap::new();
    for (key, aggregate) in rows.iter() {
        if let Author::Named(name) = &key.author {
            *per_bucket.entry((key.app.clone(), key.start)).or_default().entry(name.clone()).or_default() +=
                aggregate.events;
        }
    }
    let mut folded = 0;
    for ((app, start), authors) in per_bucket {
        if authors.len() <= cap {
            continue;
        }
        let mut ranked: Vec<(String, i64)> = authors.into_iter().collect();
        ranked.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        for (name, _) in ranked.into_iter().skip(cap) {
            folded += 1;
            for kind in Kind::ALL {
                let key = BucketKey { app: app.clone(), start, author: Author::Named(name.clone()), kind };
                let Some(aggregate) = rows.remove(&key) else { continue };
                let target = rows.entry(BucketKey { author: Author::Folded, ..key }).or_default();
                target.merge(&aggregate);
                target.folded_authors.get_or_insert_with(Distinct::default).add(&name);
            }
        }
    }
    folded
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(bytes: i32) -> EventFacts<'static> {
        EventFacts {
            session_key: "u\u{1f}s",
            user_id: "u",
            payload_bytes: bytes,
            prompt_tokens: 2,
            candidates_tokens: 3,
            total_tokens: 5,
            cost: Some("0.25".parse().expect("decimal")),
            latency_ms: Some(10.0),
        }
    }

    #[test]
    fn buckets_are_utc_and_partitions_span_day_month_year() {
        let at = Utc.with_ymd_and_hms(2026, 3, 14, 15, 9, 26).single().expect("valid");
        assert_eq!(Level::Minute.bucket_of(at).to_rfc3339(), "2026-03-14T15:09:00+00:00");
        assert_eq!(Level::Hour.bucket_of(at).to_rfc3339(), "2026-03-14T15:00:00+00:00");
        assert_eq!(Level::Day.bucket_of(at).to_rfc3339(), "2026-03-14T00:00:00+00:00");
        assert_eq!(Level::Hour.partition_of(at).to_rfc3339(), "2026-03-01T00:00:00+00:00");
        assert_eq!(Level::Day.partition_of(at).to_rfc3339(), "2026-01-01T00:00:00+00:00");
    }

    #[test]
    fn merging_equals_adding_everything_to_one() {
        let mut one = Aggregate::default();
        let (mut left, mut right) = (Aggregate::default(), Aggregate::default());
        for (i, bytes) in [300, 120, 900, 40].into_iter().enumerate() {
            one.add_event(Kind::Error, &facts(bytes));
            if i % 2 == 0 {
                left.add_event(Kind::Error, &facts(bytes))
            } else {
                right.add_event(Kind::Error, &facts(bytes))
            }
        }
        left.merge(&right);
        assert_eq!(
            (left.events, left.payload_bytes, left.payload_bytes_min, left.payload_bytes_max, left.errors),
            (4, 1360, 40, 900, 4)
        );
        assert_eq!(left.cost, one.cost);
        assert_eq!(left.cost_events, 4);
        assert_eq!(left.total_tokens, 20);
        assert_eq!(left.latency.count(), 4);
    }

    #[test]
    fn authors_above_the_cap_fold_into_one_row_per_kind() {
        let start = Utc.with_ymd_and_hms(2026, 3, 14, 15, 9, 0).single().expect("valid");
        let mut rows = BTreeMap::new();
        for (name, events) in [("a", 3), ("b", 1), ("c", 2), ("d", 1)] {
            for _ in 0..events {
                let key =
                    BucketKey { app: "app".into(), start, author: Author::Named(name.into()), kind: Kind::ToolCall };
                rows.entry(key).or_insert_with(Aggregate::default).add_event(Kind::ToolCall, &facts(10));
            }
        }
        assert_eq!(cap_authors(&mut rows, 2), 2);
        let names: Vec<String> = rows.keys().map(|k| k.author.to_string()).collect();
        assert_eq!(names, ["a", "c", "(other)"]);
        let other = rows.values().last().expect("a folded row");
        assert_eq!(other.events, 2);
        assert_eq!(other.folded_authors.as_ref().map(|d| d.estimate().round()), Some(2.0));
        assert_eq!(rows.values().map(|a| a.events).sum::<i64>(), 7);
    }
}
