//! What the catalog says about `adk_events`' partitions: names, day ranges,
//! pending detaches, and tables left detached by an interrupted run.

use chrono::{Days, NaiveDate};
use diesel::QueryableByName;
use diesel::sql_types::{Bool, Nullable, Text};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use serde::Serialize;

use crate::RetentionError;

pub use adk_postgres_schema::names::{day_of_partition, partition_name};

/// One attached partition of `adk_events`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Partition {
    /// The schema the partition is in.
    pub schema: String,
    /// The partition's table name, `adk_events_pYYYYMMDD` for a daily one.
    pub name: String,
    /// First day held; `None` for `MINVALUE` (a legacy partition).
    pub from: Option<NaiveDate>,
    /// First day no longer held (exclusive); `None` for `MAXVALUE`.
    pub to: Option<NaiveDate>,
    /// A `DETACH … CONCURRENTLY` stopped between its two transactions.
    pub detach_pending: bool,
}

impl Partition {
    /// Whether rows of `day` (a `session_day`) belong in this partition.
    pub fn holds(&self, day: NaiveDate) -> bool {
        self.from.is_none_or(|from| from <= day) && self.to.is_none_or(|to| day < to)
    }
}

#[derive(QueryableByName)]
struct PartitionRow {
    #[diesel(sql_type = Text)]
    schema: String,
    #[diesel(sql_type = Text)]
    name: String,
    #[diesel(sql_type = Nullable<Text>)]
    bound: Option<String>,
    #[diesel(sql_type = Bool)]
    detach_pending: bool,
}

/// Parses `FOR VALUES FROM ('2026-11-30') TO ('2026-12-01')`, with
/// `MINVALUE` / `MAXVALUE` as open ends. Needs `DateStyle = ISO`.
pub fn parse_bound(bound: &str) -> Option<(Option<NaiveDate>, Option<NaiveDate>)> {
    let rest = bound.strip_prefix("FOR VALUES FROM (")?;
    let (from, rest) = rest.split_once(") TO (")?;
    let to = rest.strip_suffix(')')?;
    let end = |text: &str| -> Option<Option<NaiveDate>> {
        match text {
            "MINVALUE" | "MAXVALUE" => Some(None),
            quoted => {
                let inner = quoted.strip_prefix('\'')?.strip_suffix('\'')?;
                NaiveDate::parse_from_str(inner, "%Y-%m-%d").ok().map(Some)
            }
        }
    };
    Some((end(from)?, end(to)?))
}

/// Every partition attached to `adk_events` (pending detaches included),
/// oldest first.
pub async fn list_partitions(conn: &mut AsyncPgConnection) -> Result<Vec<Partition>, RetentionError> {
    let rows = diesel::sql_query(
        "SELECT n.nspname::text AS schema, c.relname::text AS name,
                pg_get_expr(c.relpartbound, c.oid) AS bound, i.inhdetachpending AS detach_pending
         FROM pg_inherits i
         JOIN pg_class c ON c.oid = i.inhrelid
         JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE i.inhparent = to_regclass('adk_events')",
    )
    .load::<PartitionRow>(conn)
    .await
    .map_err(RetentionError::query("list partitions"))?;
    let mut partitions = Vec::with_capacity(rows.len());
    for row in rows {
        let bound = row.bound.unwrap_or_default();
        let (from, to) = parse_bound(&bound).ok_or_else(|| {
            RetentionError::Conflict(format!(
                "partition {} has a bound this tool does not understand: {bound}",
                row.name
            ))
        })?;
        partitions.push(Partition { schema: row.schema, name: row.name, from, to, detach_pending: row.detach_pending });
    }
    partitions.sort_by_key(|p| (p.from, p.to));
    Ok(partitions)
}

#[derive(QueryableByName)]
struct NameRow {
    #[diesel(sql_type = Text)]
    name: String,
}

/// Daily partition tables in `schema` that are attached to nothing: what a
/// run interrupted between `DETACH` and `DROP` leaves behind.
pub async fn list_orphans(conn: &mut AsyncPgConnection, schema: &str) -> Result<Vec<String>, RetentionError> {
    let rows = diesel::sql_query(
        "SELECT c.relname::text AS name FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = $1 AND c.relkind = 'r' AND c.relname ~ '^adk_events_p[0-9]{8}$'
           AND NOT EXISTS (SELECT 1 FROM pg_inherits i WHERE i.inhrelid = c.oid)
         ORDER BY 1",
    )
    .bind::<Text, _>(schema)
    .load::<NameRow>(conn)
    .await
    .map_err(RetentionError::query("list detached partition tables"))?;
    Ok(rows.into_iter().map(|r| r.name).collect())
}

/// Consecutive days after `today` that already have a partition: how long
/// appends keep working if maintenance stops now.
pub fn days_ahead(partitions: &[Partition], today: NaiveDate) -> u32 {
    let mut ahead = 0;
    let mut day = today;
    loop {
        let Some(next) = day.checked_add_days(Days::new(1)) else { return ahead };
        if !partitions.iter().any(|p| !p.detach_pending && p.holds(next)) {
            return ahead;
        }
        ahead += 1;
        day = next;
        if ahead >= 10_000 {
            return ahead;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn day(text: &str) -> NaiveDate {
        NaiveDate::parse_from_str(text, "%Y-%m-%d").unwrap()
    }

    #[test]
    fn parses_bounds() {
        assert_eq!(
            parse_bound("FOR VALUES FROM ('2026-11-30') TO ('2026-12-01')"),
            Some((Some(day("2026-11-30")), Some(day("2026-12-01"))))
        );
        assert_eq!(parse_bound("FOR VALUES FROM (MINVALUE) TO ('2026-12-01')"), Some((None, Some(day("2026-12-01")))));
        assert_eq!(parse_bound("DEFAULT"), None);
    }

    #[test]
    fn counts_days_ahead_until_the_first_gap() {
        let part = |d: &str| Partition {
            schema: "public".into(),
            name: partition_name(day(d)),
            from: Some(day(d)),
            to: day(d).checked_add_days(Days::new(1)),
            detach_pending: false,
        };
        let parts = vec![part("2026-11-30"), part("2026-12-01"), part("2026-12-02"), part("2026-12-04")];
        assert_eq!(days_ahead(&parts, day("2026-11-30")), 2);
        assert_eq!(days_ahead(&parts, day("2026-12-04")), 0);
    }
}
