//! The resumable units of a conversion and the SQL each runs: what the
//! plan shows and the run executes are one value, so a dry run prints
//! exactly what a run would do.

use adk_postgres_schema::quote::{quote_ident, quote_literal};
use serde::Serialize;

use super::layout::{BASELINE_VERSION, MIGRATIONS_TABLE};

/// One resumable unit of the conversion, in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StepKind {
    /// \[1\] `session_day` with a constant default on both tables, in one
    /// transaction: no rewrite, no scan.
    AddSessionDay,
    /// \[3\] Builds `adk_sessions_key_day` concurrently.
    SessionsKeyDayIndex,
    /// \[3\] Promotes `adk_sessions_key_day` to a unique constraint.
    SessionsKeyDayConstraint,
    /// \[3\] Builds `adk_sessions_day` concurrently.
    SessionsDayIndex,
    /// \[3\] Builds the legacy events' future primary key concurrently.
    EventsKeyIndex,
    /// \[3\] Builds the legacy events' future event-id key concurrently.
    EventsEventIdIndex,
    /// \[3\] Adds and validates the legacy range CHECK and the parent's CHECKs.
    EventsChecks,
    /// \[3\] Adds and validates the foreign key carrying `session_day`.
    EventsForeignKey,
    /// \[4\] Swaps in the partitioned parent and attaches the legacy table as
    /// a partition, in one short transaction.
    Swap,
    /// \[5\] Gives new sessions today's UTC day, so today's partition.
    SessionsDefault,
    /// Records migration 000001 as applied in diesel's table.
    RecordBaseline,
    /// Applies the remaining migrations.
    ApplyMigrations,
}

impl StepKind {
    /// Every step, in the order a conversion runs them.
    pub const ALL: [StepKind; 12] = [
        StepKind::AddSessionDay,
        StepKind::SessionsKeyDayIndex,
        StepKind::SessionsKeyDayConstraint,
        StepKind::SessionsDayIndex,
        StepKind::EventsKeyIndex,
        StepKind::EventsEventIdIndex,
        StepKind::EventsChecks,
        StepKind::EventsForeignKey,
        StepKind::Swap,
        StepKind::SessionsDefault,
        StepKind::RecordBaseline,
        StepKind::ApplyMigrations,
    ];

    /// Position in [`StepKind::ALL`], from 1.
    pub fn number(self) -> usize {
        Self::ALL.iter().position(|k| *k == self).map_or(0, |i| i + 1)
    }

    /// The step of the partitioning guide this belongs to (0: bookkeeping
    /// after the guide's steps).
    pub fn guide_step(self) -> u8 {
        match self {
            Self::AddSessionDay => 1,
            Self::Swap => 4,
            Self::SessionsDefault => 5,
            Self::RecordBaseline | Self::ApplyMigrations => 0,
            _ => 3,
        }
    }

    /// One line saying what the step does, as the plan prints it.
    pub fn title(self) -> &'static str {
        match self {
            Self::AddSessionDay => "add session_day with a constant default to adk_sessions and adk_events",
            Self::SessionsKeyDayIndex => "build adk_sessions_key_day concurrently",
            Self::SessionsKeyDayConstraint => "promote adk_sessions_key_day to a unique constraint",
            Self::SessionsDayIndex => "build adk_sessions_day concurrently",
            Self::EventsKeyIndex => "build the future primary key of the legacy events concurrently",
            Self::EventsEventIdIndex => "build the future event-id key of the legacy events concurrently",
            Self::EventsChecks => "add and validate the legacy range CHECK (and the parent's CHECKs)",
            Self::EventsForeignKey => "add and validate the foreign key carrying session_day",
            Self::Swap => "swap in the partitioned parent and attach the legacy partition (one transaction)",
            Self::SessionsDefault => "give new sessions today's UTC day",
            Self::RecordBaseline => "record migration 000001 as applied",
            Self::ApplyMigrations => "apply the remaining migrations",
        }
    }
}

/// What one action of a step does; the plan shows its SQL, the executor
/// runs it.
#[derive(Debug, Clone)]
pub(super) enum Action {
    /// DDL under lock_timeout with retry. Several statements in one string
    /// run as one implicit transaction.
    Ddl(String),
    /// `CREATE INDEX CONCURRENTLY`, watched; an INVALID leftover of the
    /// same name is dropped first (`drop` is its `DROP INDEX CONCURRENTLY`).
    BuildIndex { index: String, drop: Option<String>, create: String },
    /// `VALIDATE CONSTRAINT`: a scan under a lock that blocks no reads or
    /// writes; watched.
    Validate(String),
    /// The swap transaction; timed.
    Swap(String),
    /// Create diesel's table if missing and record migration 000001.
    RecordBaseline { create: String },
    /// `run_pending_migrations`.
    ApplyMigrations { pending: Vec<String> },
}

impl Action {
    fn sql(&self) -> Vec<String> {
        match self {
            Self::Ddl(sql) | Self::Validate(sql) | Self::Swap(sql) => vec![sql.clone()],
            Self::BuildIndex { drop, create, .. } => drop.iter().cloned().chain([create.clone()]).collect(),
            Self::RecordBaseline { create } => vec![
                create.clone(),
                format!(
                    "INSERT INTO {} (version) VALUES ({}) ON CONFLICT DO NOTHING",
                    quote_ident(MIGRATIONS_TABLE),
                    quote_literal(BASELINE_VERSION)
                ),
            ],
            Self::ApplyMigrations { pending } => {
                vec![format!("-- diesel: run pending migrations {}", pending.join(", "))]
            }
        }
    }
}

/// One remaining step and the exact SQL it runs.
#[derive(Debug, Clone, Serialize)]
pub struct ConvertStep {
    /// Position in [`StepKind::ALL`], from 1; stable across runs.
    pub number: usize,
    /// Which step.
    pub kind: StepKind,
    /// The step of the partitioning guide (1, 3, 4, 5; 0 for bookkeeping).
    pub guide_step: u8,
    /// What it does, as [`StepKind::title`].
    pub title: &'static str,
    /// The statements, in order. A statement holding several `;`-separated
    /// commands runs as one transaction.
    pub sql: Vec<String>,
    #[serde(skip)]
    pub(super) actions: Vec<Action>,
}

impl ConvertStep {
    pub(super) fn new(kind: StepKind, actions: Vec<Action>) -> Self {
        Self {
            number: kind.number(),
            kind,
            guide_step: kind.guide_step(),
            title: kind.title(),
            sql: actions.iter().flat_map(Action::sql).collect(),
            actions,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_are_numbered_in_order() {
        for (i, kind) in StepKind::ALL.iter().enumerate() {
            assert_eq!(kind.number(), i + 1);
        }
    }
}
