//! What the server saw: statements per operation (pg_stat_statements), the
//! HOT-update ratio, WAL written.

use std::time::{Duration, Instant};

use serde::Serialize;
use tokio_postgres::Client;

/// Counts the top-level statements one database ran between a reset and a
/// read. Every implementation has a database of its own, so its count is
/// its statements alone; the benchmark's own queries run elsewhere.
#[derive(Debug)]
pub struct StatementCounter {
    admin: Client,
}

/// The statements of one workload, by query text.
#[derive(Debug, Clone, Default, Serialize)]
pub struct StatementCount {
    pub total: i64,
    /// `SET …` statements of connections opened meanwhile, not in `total`.
    pub connection_setup: i64,
    /// The most frequent statements, most calls first (text shortened).
    pub top: Vec<(String, i64)>,
}

impl StatementCounter {
    pub fn new(admin: Client) -> Self {
        Self { admin }
    }

    pub async fn reset(&self) -> anyhow::Result<()> {
        self.admin.batch_execute("SELECT pg_stat_statements_reset()").await?;
        Ok(())
    }

    /// Calls per statement in `database` since the last reset.
    pub async fn read(&self, database: &str) -> anyhow::Result<StatementCount> {
        let rows = self
            .admin
            .query(
                "SELECT query, sum(calls)::bigint FROM pg_stat_statements s
                 JOIN pg_database d ON d.oid = s.dbid
                 WHERE d.datname = $1 AND s.toplevel
                 GROUP BY query ORDER BY 2 DESC, 1",
                &[&database],
            )
            .await?;
        let mut count = StatementCount::default();
        for row in rows {
            let query: String = row.get(0);
            let calls: i64 = row.get(1);
            // A new connection's settings are the connection's cost, not
            // any operation's (a pool pays them once per connection).
            if query.trim_start().get(..4).is_some_and(|verb| verb.eq_ignore_ascii_case("SET ")) {
                count.connection_setup += calls;
                continue;
            }
            count.total += calls;
            if count.top.len() < 12 {
                count.top.push((shorten(&query), calls));
            }
        }
        Ok(count)
    }
}

fn shorten(query: &str) -> String {
    let flat = query.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() > 110 { format!("{}…", flat.chars().take(110).collect::<String>()) } else { flat }
}

/// Update counters of one table.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct HotRatio {
    pub updates: i64,
    pub hot_updates: i64,
    pub ratio: f64,
}

/// The table's updates and HOT updates, once the statistics show at least
/// `expected_updates` (backends publish their counters about a second after
/// they go idle).
pub async fn hot_ratio(client: &Client, table: &str, expected_updates: i64) -> anyhow::Result<HotRatio> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let row = client
            .query_one(
                "SELECT coalesce(sum(n_tup_upd), 0)::bigint, coalesce(sum(n_tup_hot_upd), 0)::bigint
                 FROM pg_stat_user_tables WHERE relname = $1",
                &[&table],
            )
            .await?;
        let (updates, hot_updates): (i64, i64) = (row.get(0), row.get(1));
        if updates >= expected_updates || Instant::now() > deadline {
            let ratio = if updates > 0 { hot_updates as f64 / updates as f64 } else { 0.0 };
            return Ok(HotRatio { updates, hot_updates, ratio });
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        // A new snapshot of the statistics for the next read.
        client.batch_execute("SELECT pg_stat_clear_snapshot()").await?;
    }
}

pub async fn wal_lsn(client: &Client) -> anyhow::Result<String> {
    Ok(client.query_one("SELECT pg_current_wal_insert_lsn()::text", &[]).await?.get(0))
}

pub async fn wal_since(client: &Client, from: &str) -> anyhow::Result<i64> {
    Ok(client.query_one("SELECT (pg_current_wal_insert_lsn() - $1::text::pg_lsn)::bigint", &[&from]).await?.get(0))
}

/// Server-side execution of the top-level statements of one database whose
/// text contains a needle (pg_stat_statements), since the last reset.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct ExecTime {
    pub calls: i64,
    pub total_ms: f64,
    /// The fastest and slowest single execution.
    pub min_ms: f64,
    pub max_ms: f64,
}

impl ExecTime {
    pub fn mean_ms(&self) -> Option<f64> {
        (self.calls > 0).then(|| self.total_ms / self.calls as f64)
    }

    /// This and `other` together (of two resets).
    pub fn add(&self, other: &ExecTime) -> ExecTime {
        match (self.calls, other.calls) {
            (0, _) => *other,
            (_, 0) => *self,
            _ => ExecTime {
                calls: self.calls + other.calls,
                total_ms: self.total_ms + other.total_ms,
                min_ms: self.min_ms.min(other.min_ms),
                max_ms: self.max_ms.max(other.max_ms),
            },
        }
    }
}

/// What `admin` (a client of a database with the extension) reads of
/// `database`'s statements containing `needle`.
pub async fn exec_time(admin: &Client, database: &str, needle: &str) -> anyhow::Result<ExecTime> {
    let row = admin
        .query_one(
            "SELECT coalesce(sum(calls), 0)::bigint, coalesce(sum(total_exec_time), 0)::float8,
                    coalesce(min(min_exec_time), 0)::float8, coalesce(max(max_exec_time), 0)::float8
               FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
              WHERE d.datname = $1 AND s.toplevel AND strpos(s.query, $2) > 0",
            &[&database, &needle],
        )
        .await?;
    Ok(ExecTime { calls: row.get(0), total_ms: row.get(1), min_ms: row.get(2), max_ms: row.get(3) })
}
