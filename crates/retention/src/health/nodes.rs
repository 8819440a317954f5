//! Per-node facts on Citus: what `status` adds when the store is
//! distributed. A node short of shards or of the days ahead is where
//! appends would fail or pile up, and the coordinator's own catalog cannot
//! show it.

use std::collections::BTreeSet;

use chrono::NaiveDate;
use diesel::QueryableByName;
use diesel::sql_types::{Array, BigInt, Text};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use serde::Serialize;

use crate::RetentionError;
use crate::partitions::{Partition, days_ahead};

/// One node of a Citus cluster as the store sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeFacts {
    /// `host:port`, as the coordinator knows the node.
    pub node: String,
    /// Shards of adk_sessions here: the users whose sessions (and, colocated
    /// with them, events and user states) this node holds.
    pub session_shards: i64,
    /// Shard placements of every store table here, reference tables included.
    pub shards: i64,
    /// Their size on disk.
    pub bytes: i64,
    /// Consecutive days after today whose event partition has shards here.
    pub partitions_ahead: u32,
}

#[derive(QueryableByName)]
struct NodeRow {
    #[diesel(sql_type = Text)]
    node: String,
    #[diesel(sql_type = BigInt)]
    session_shards: i64,
    #[diesel(sql_type = BigInt)]
    shards: i64,
    #[diesel(sql_type = BigInt)]
    bytes: i64,
    #[diesel(sql_type = Array<Text>)]
    event_partitions: Vec<String>,
}

/// The facts of every active primary node, by `host:port`. Asks each node
/// for its shards' sizes (through `citus_shards`), so it costs one round
/// trip per node.
pub(crate) async fn node_facts(
    conn: &mut AsyncPgConnection,
    partitions: &[Partition],
    today: NaiveDate,
) -> Result<Vec<NodeFacts>, RetentionError> {
    let rows = diesel::sql_query(
        "SELECT n.nodename || ':' || n.nodeport AS node,
                count(s.shardid) FILTER (WHERE s.table_name = 'adk_sessions'::regclass) AS session_shards,
                count(s.shardid) AS shards,
                coalesce(sum(s.shard_size), 0)::bigint AS bytes,
                coalesce(array_agg(DISTINCT c.relname::text) FILTER (WHERE i.inhparent = 'adk_events'::regclass),
                         '{}') AS event_partitions
           FROM pg_dist_node n
           LEFT JOIN citus_shards s ON s.nodename = n.nodename AND s.nodeport = n.nodeport
           LEFT JOIN pg_catalog.pg_class c ON c.oid = s.table_name
           LEFT JOIN pg_catalog.pg_inherits i ON i.inhrelid = s.table_name
          WHERE n.noderole = 'primary' AND n.isactive
            AND (s.table_name IS NULL OR c.relname LIKE 'adk\\_%')
          GROUP BY n.nodename, n.nodeport
          ORDER BY n.nodename, n.nodeport",
    )
    .load::<NodeRow>(conn)
    .await
    .map_err(RetentionError::query("read the Citus nodes' shards"))?;
    Ok(rows
        .into_iter()
        .map(|row| {
            let here: BTreeSet<&str> = row.event_partitions.iter().map(String::as_str).collect();
            let placed: Vec<Partition> =
                partitions.iter().filter(|p| here.contains(p.name.as_str())).cloned().collect();
            NodeFacts {
                node: row.node,
                session_shards: row.session_shards,
                shards: row.shards,
                bytes: row.bytes,
                partitions_ahead: days_ahead(&placed, today),
            }
        })
        .collect())
}
