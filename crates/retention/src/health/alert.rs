//! Typed alerts: which rule of `adk-pg status` fired, the area of the store
//! it is about, and how bad it is, so a dashboard can colour a card by the
//! same rules `status` alerts on instead of matching message text.

use std::fmt;

use serde::Serialize;

/// The part of the store an alert is about: one card of the dashboard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AlertArea {
    /// Event partitions for today and the days ahead.
    Partitions,
    /// The maintenance runs themselves.
    Maintenance,
    /// Days past lifetime plus retention, and detaches left pending.
    Retention,
    /// The usage rollup job: lag and its latest run.
    Rollups,
    /// Events rejected as late by the rollups.
    LateEvents,
    /// Days archived to object storage before they are dropped.
    Archive,
}

impl AlertArea {
    /// Every area, in the order the dashboard shows their cards.
    pub const ALL: [AlertArea; 6] = [
        AlertArea::Partitions,
        AlertArea::Maintenance,
        AlertArea::Retention,
        AlertArea::Archive,
        AlertArea::Rollups,
        AlertArea::LateEvents,
    ];

    /// A stable machine name (metric labels, HTML attributes).
    pub fn name(self) -> &'static str {
        match self {
            AlertArea::Partitions => "partitions",
            AlertArea::Maintenance => "maintenance",
            AlertArea::Retention => "retention",
            AlertArea::Rollups => "rollups",
            AlertArea::LateEvents => "late_events",
            AlertArea::Archive => "archive",
        }
    }

    /// The heading a person reads.
    pub fn title(self) -> &'static str {
        match self {
            AlertArea::Partitions => "Partitions",
            AlertArea::Maintenance => "Maintenance",
            AlertArea::Retention => "Retention",
            AlertArea::Rollups => "Usage rollups",
            AlertArea::LateEvents => "Late events",
            AlertArea::Archive => "Archive",
        }
    }
}

impl fmt::Display for AlertArea {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How soon an alert hurts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    /// Needs attention; nothing fails yet.
    Warning,
    /// Appends fail now, or after the next UTC midnight unless the store
    /// makes the day's partition on the spot.
    Critical,
}

impl Severity {
    /// Both severities, the milder first.
    pub const ALL: [Severity; 2] = [Severity::Warning, Severity::Critical];

    /// A stable machine name (metric labels, HTML attributes).
    pub fn name(self) -> &'static str {
        match self {
            Severity::Warning => "warning",
            Severity::Critical => "critical",
        }
    }
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Each rule `adk-pg status` alerts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Check {
    /// Today has no event partition.
    TodayPartition,
    /// Fewer future days than the threshold have a partition.
    PartitionsAhead,
    /// On Citus, a node holding sessions has fewer future days' shards than
    /// the threshold.
    NodePartitionsAhead,
    /// No maintenance run has succeeded yet.
    MaintenanceNeverRun,
    /// The last successful maintenance run is older than the threshold.
    MaintenanceStale,
    /// The latest maintenance run failed.
    MaintenanceFailed,
    /// An attached partition is past lifetime plus retention.
    OverduePartition,
    /// A `DETACH … CONCURRENTLY` was left pending.
    PendingDetach,
    /// No rollup run yet, and events have waited longer than the lag limit.
    RollupsNeverRun,
    /// The rollup watermark is further behind than the lag limit.
    RollupLag,
    /// The latest rollup run failed.
    RollupRunFailed,
    /// The latest rollup run could not advance past in-flight writers.
    RollupRunWaiting,
    /// More events arriving today were rejected as late than allowed.
    LateEvents,
    /// An app's day past retention could not be archived, so it is kept.
    ArchiveFailed,
}

impl Check {
    /// The area this rule is about.
    pub fn area(self) -> AlertArea {
        match self {
            Check::TodayPartition | Check::PartitionsAhead | Check::NodePartitionsAhead => AlertArea::Partitions,
            Check::MaintenanceNeverRun | Check::MaintenanceStale | Check::MaintenanceFailed => AlertArea::Maintenance,
            Check::OverduePartition | Check::PendingDetach => AlertArea::Retention,
            Check::RollupsNeverRun | Check::RollupLag | Check::RollupRunFailed | Check::RollupRunWaiting => {
                AlertArea::Rollups
            }
            Check::LateEvents => AlertArea::LateEvents,
            Check::ArchiveFailed => AlertArea::Archive,
        }
    }
}

/// One alert: the rule that fired, how bad it is, and the line `adk-pg
/// status` prints for it (after `ALERT: `).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Alert {
    /// The rule that fired.
    pub check: Check,
    /// Its area, as [`Check::area`].
    pub area: AlertArea,
    /// How bad it is.
    pub severity: Severity,
    /// The line `adk-pg status` prints.
    pub message: String,
}

impl Alert {
    /// A [`Severity::Warning`] alert of `check`.
    pub fn warning(check: Check, message: impl Into<String>) -> Self {
        Self { check, area: check.area(), severity: Severity::Warning, message: message.into() }
    }

    /// A [`Severity::Critical`] alert of `check`.
    pub fn critical(check: Check, message: impl Into<String>) -> Self {
        Self { check, area: check.area(), severity: Severity::Critical, message: message.into() }
    }
}

impl fmt::Display for Alert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_area_has_a_distinct_name_and_a_check() {
        let checks = [
            Check::TodayPartition,
            Check::PartitionsAhead,
            Check::MaintenanceNeverRun,
            Check::MaintenanceStale,
            Check::MaintenanceFailed,
            Check::OverduePartition,
            Check::PendingDetach,
            Check::RollupsNeverRun,
            Check::RollupLag,
            Check::RollupRunFailed,
            Check::RollupRunWaiting,
            Check::LateEvents,
            Check::ArchiveFailed,
        ];
        for area in AlertArea::ALL {
            assert!(checks.iter().any(|check| check.area() == area), "{area} has no check");
        }
        let names: std::collections::BTreeSet<_> = AlertArea::ALL.iter().map(|a| a.name()).collect();
        assert_eq!(names.len(), AlertArea::ALL.len());
    }

    #[test]
    fn an_alert_prints_its_message_and_knows_its_area() {
        let alert = Alert::critical(Check::TodayPartition, "no partition for today");
        assert_eq!(alert.to_string(), "no partition for today");
        assert_eq!((alert.area, alert.severity), (AlertArea::Partitions, Severity::Critical));
        assert_eq!(Alert::warning(Check::LateEvents, "x").area, AlertArea::LateEvents);
    }
}
