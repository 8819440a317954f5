//! What sending statements unnamed costs, on the server and the wire: our
//! SQL functions through pgbench with `-M extended` (each statement
//! unnamed, parsed and planned with every execution, Parse to Sync in one
//! batch: what the store sends since it left diesel-async's named
//! statements) against `-M prepared` (prepared once per connection, then
//! bound and executed), same database, sessions and payloads, in one run.
//!
//! pgbench has no client cost to speak of, so what differs between the two
//! is the server's parse and plan of each call and the bytes of the Parse
//! and the Describe's row description; our functions' own statements are
//! cached by PL/pgSQL either way. Rounds alternate which protocol runs an
//! operation first, so drift falls on both alike; ops/s is the median over
//! rounds, p50 over every operation.

use comfy_table::presets::ASCII_MARKDOWN;
use comfy_table::{CellAlignment, Table};
use serde::Serialize;

use crate::measure::Latency;
use crate::ops::Op;

/// One operation under both protocols.
#[derive(Debug, Clone, Serialize)]
pub struct ProtocolRow {
    pub op: Op,
    pub operation: String,
    pub prepared: Latency,
    pub unnamed: Latency,
    /// Unnamed ops/s over prepared ops/s: under 1 is slower.
    pub ops_unnamed_vs_prepared: Option<f64>,
    /// Unnamed p50 over prepared p50: over 1 is slower.
    pub p50_unnamed_vs_prepared: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ProtocolReport {
    pub rounds: usize,
    pub rows: Vec<ProtocolRow>,
}

impl ProtocolReport {
    pub fn table(&self) -> Table {
        let mut table = Table::new();
        table.load_style(ASCII_MARKDOWN);
        table.set_header(vec![
            "operation",
            "prepared ops/s",
            "unnamed ops/s",
            "ops/s unnamed / prepared",
            "prepared p50 ms",
            "unnamed p50 ms",
            "p50 unnamed / prepared",
            "prepared p99 ms",
            "unnamed p99 ms",
        ]);
        let times = |r: Option<f64>| r.map_or_else(|| "-".to_owned(), |r| format!("{r:.3}x"));
        for row in &self.rows {
            let (p, u) = (&row.prepared, &row.unnamed);
            table.add_row(vec![
                row.operation.clone(),
                format!("{:.0}", p.ops_per_sec),
                format!("{:.0}", u.ops_per_sec),
                times(row.ops_unnamed_vs_prepared),
                format!("{:.3}", p.p50_ms),
                format!("{:.3}", u.p50_ms),
                times(row.p50_unnamed_vs_prepared),
                format!("{:.3}", p.p99_ms),
                format!("{:.3}", u.p99_ms),
            ]);
        }
        for i in 1..=8 {
            if let Some(column) = table.column_mut(i) {
                column.set_cell_alignment(CellAlignment::Right);
            }
        }
        table
    }
}

impl std::fmt::Display for ProtocolReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "Statement protocol: our SQL functions through pgbench, unnamed (-M extended, as the store sends \
             them) against named (-M prepared, as the rows above), {} interleaved round(s), as the owner, \
             plaintext; ops/s: median over rounds:",
            self.rounds
        )?;
        write!(f, "{}", self.table())
    }
}
