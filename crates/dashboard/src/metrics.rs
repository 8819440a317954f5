//! `/metrics`: the operations snapshot in the Prometheus text exposition
//! format (0.0.4), encoded by `prometheus-client`.
//!
//! Every scrape builds a fresh registry from a fresh snapshot, so a figure
//! is never stale and a series whose fact is unknown (no maintenance run
//! yet, a section that failed) is absent rather than a made-up zero. What
//! did fail is said by `adk_pg_scrape_error{section}` and
//! `adk_pg_database_up`. Names follow Prometheus' conventions: the
//! `adk_pg_` prefix, the unit as a suffix (`_seconds`, `_bytes`,
//! `_ratio`), `_total` only on the one counter.

use std::sync::atomic::AtomicU64;

use adk_postgres_retention::health::{AlertArea, Severity};
use chrono::{DateTime, NaiveDate, Utc};
use prometheus_client::encoding::prometheus_text;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};

use crate::gather::OpsSnapshot;

/// The `Content-Type` of the answer.
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// The sections a scrape reads; each has an `adk_pg_scrape_error` series.
pub const SECTIONS: [&str; 8] =
    ["connect", "health", "partitions", "sessions", "state_sizes", "late_events", "rollup_runs", "migrations"];

type Labels = Vec<(&'static str, String)>;
type FloatGauge = Gauge<f64, AtomicU64>;

fn seconds_between(later: DateTime<Utc>, earlier: DateTime<Utc>) -> f64 {
    (later - earlier).num_milliseconds().max(0) as f64 / 1000.0
}

fn start_of(day: NaiveDate) -> Option<DateTime<Utc>> {
    day.and_hms_opt(0, 0, 0).map(|t| t.and_utc())
}

fn gauge(value: f64) -> FloatGauge {
    let gauge = FloatGauge::default();
    gauge.set(value);
    gauge
}

/// The scrape as text. `scrapes_failed` is how many scrapes since the
/// server started had a section fail (this one included), and
/// `scrape_seconds` how long this one took to read.
pub fn render_metrics(snapshot: &OpsSnapshot, scrapes_failed: u64, scrape_seconds: f64) -> String {
    let mut registry = Registry::with_prefix("adk_pg");
    let now = snapshot.now;

    registry.register(
        "database_up",
        "Whether the database answered: 1 when a connection was opened and the clock read",
        gauge(if snapshot.unreachable.is_none() { 1.0 } else { 0.0 }),
    );
    let scrape_error = Family::<Labels, FloatGauge>::default();
    let failed: Vec<&str> = snapshot.section_errors().iter().map(|(name, _)| *name).collect();
    for section in SECTIONS {
        let value = if failed.contains(&section) || snapshot.unreachable.is_some() { 1.0 } else { 0.0 };
        scrape_error.get_or_create(&vec![("section", section.to_owned())]).set(value);
    }
    registry.register(
        "scrape_error",
        "1 when this scrape could not read a section (its figures are missing), else 0",
        scrape_error,
    );
    registry.register(
        "scrape_errors",
        "Scrapes since the server started in which some section could not be read",
        ConstCounter::new(scrapes_failed),
    );
    registry.register_with_unit(
        "scrape_duration",
        "How long this scrape took to read the database",
        Unit::Seconds,
        gauge(scrape_seconds),
    );

    if let Ok(migrations) = &snapshot.migrations {
        registry.register(
            "migrations_pending",
            "Migrations of this adk-pg that the database has not applied (run adk-pg migrate)",
            gauge(migrations.pending.len() as f64),
        );
    }

    if let Ok(partitions) = &snapshot.partitions {
        let attached = partitions.iter().filter(|p| !p.detach_pending).count();
        registry.register("event_partitions", "Attached partitions of adk_events", gauge(attached as f64));
        // The oldest day with a partition; a legacy MINVALUE partition has
        // no first day, so the oldest daily one stands in for it.
        if let Some(oldest) = partitions.iter().filter_map(|p| p.from).min().and_then(start_of) {
            registry.register_with_unit(
                "oldest_event_partition_age",
                "Time since the first day of the oldest event partition began (UTC)",
                Unit::Seconds,
                gauge(seconds_between(now, oldest)),
            );
        }
    }

    if let Ok(health) = &snapshot.health {
        registry.register(
            "event_partitions_ahead",
            "Consecutive days after today (UTC) with an event partition",
            gauge(f64::from(health.partitions_ahead)),
        );
        registry.register(
            "pending_detaches",
            "Partitions left half-detached by an interrupted maintenance run",
            gauge(health.pending_detaches.len() as f64),
        );
        if let Some(run) = &health.last_run {
            registry.register_with_unit(
                "maintenance_last_success_age",
                "Time since the last successful maintenance run finished",
                Unit::Seconds,
                gauge(seconds_between(now, run.finished_at)),
            );
        }
        if let Some(ratio) = health.hot_ratio {
            registry.register_with_unit(
                "sessions_hot_update",
                "Share of adk_sessions updates that were heap-only (HOT), since statistics were reset",
                Unit::Other("ratio".into()),
                gauge(ratio),
            );
        }
        if let Some(rollups) = &health.rollups {
            if let Some(lag) = rollups.lag_secs {
                registry.register_with_unit(
                    "rollup_lag",
                    "The clock minus the rollup watermark: how far usage figures trail the events",
                    Unit::Seconds,
                    gauge(lag as f64),
                );
            }
            let tier_bytes = Family::<Labels, FloatGauge>::default();
            let tier_partitions = Family::<Labels, FloatGauge>::default();
            for tier in &rollups.tiers {
                tier_bytes.get_or_create(&vec![("level", tier.level.clone())]).set(tier.bytes as f64);
                tier_partitions.get_or_create(&vec![("level", tier.level.clone())]).set(tier.partitions as f64);
            }
            registry.register_with_unit(
                "rollup_tier_size",
                "Size of a usage rollup level (1m, 1h, 1d) over its partitions, indexes included",
                Unit::Bytes,
                tier_bytes,
            );
            registry.register("rollup_tier_partitions", "Partitions of a usage rollup level", tier_partitions);
        }
        let archive = &health.archive;
        if let Some(last) = archive.last_success {
            registry.register_with_unit(
                "archive_last_success_age",
                "Time since the newest archived object was written and read back",
                Unit::Seconds,
                gauge(seconds_between(now, last)),
            );
        }
        registry.register(
            "archive_days_pending",
            "App days past retention kept because their archive failed; maintenance tries again each run",
            gauge(archive.pending.len() as f64),
        );
        registry.register_with_unit(
            "archive",
            "Bytes of the archive's objects, as the catalog records them",
            Unit::Bytes,
            gauge(archive.bytes as f64),
        );
        registry.register("archive_objects", "Objects in the archive catalog", gauge(archive.objects as f64));
        registry.register(
            "archive_failures",
            "Failed attempts to archive an app's day, on record since the archive was installed",
            gauge(archive.failures as f64),
        );
        let firing = Family::<Labels, FloatGauge>::default();
        for area in AlertArea::ALL {
            for severity in Severity::ALL {
                let count = health.alerts_in(area).filter(|alert| alert.severity == severity).count();
                firing
                    .get_or_create(&vec![("area", area.name().to_owned()), ("severity", severity.name().to_owned())])
                    .set(count as f64);
            }
        }
        registry.register(
            "alerts_firing",
            "Alerts adk-pg status raises now, by area and severity (its exit code is 2 while any fire)",
            firing,
        );
    }

    if let Ok(Some(finished)) = &snapshot.last_rollup_ok {
        registry.register_with_unit(
            "rollup_last_success_age",
            "Time since the last successful usage rollup run finished",
            Unit::Seconds,
            gauge(seconds_between(now, *finished)),
        );
    }

    if let Ok(late) = &snapshot.late_today {
        let family = Family::<Labels, FloatGauge>::default();
        for app in late {
            family.get_or_create(&vec![("app", app.app.clone())]).set(app.rejected as f64);
        }
        registry.register(
            "rollup_late_rejected_today",
            "Events arriving today (UTC) that the rollups rejected as late, by app; resets at midnight UTC",
            family,
        );
    }

    if let Ok(sessions) = &snapshot.sessions {
        let family = Family::<Labels, FloatGauge>::default();
        for (state, count) in [("live", sessions.live), ("expired", sessions.expired), ("closed", sessions.closed)] {
            family.get_or_create(&vec![("state", state.to_owned())]).set(count as f64);
        }
        registry.register(
            "sessions",
            "Sessions by state: live (take appends), expired (not purged yet), closed (rolled over)",
            family,
        );
    }

    if let Ok(scopes) = &snapshot.state_sizes {
        let family = Family::<Labels, FloatGauge>::default();
        for scope in scopes {
            for (quantile, value) in [("0.5", scope.p50), ("0.9", scope.p90), ("0.99", scope.p99), ("1", scope.max)] {
                if let Some(value) = value {
                    family
                        .get_or_create(&vec![("scope", scope.scope.clone()), ("quantile", quantile.to_owned())])
                        .set(value as f64);
                }
            }
        }
        registry.register_with_unit(
            "state_size",
            "pg_column_size of stored state by scope (session, user, app) and quantile (1 is the largest), \
             over a sample of at most 100000 rows",
            Unit::Bytes,
            family,
        );
    }

    let mut text = String::new();
    // Writing to a String cannot fail; an error here would be the
    // encoder's own bug, and an empty scrape is the honest answer to it.
    if prometheus_text::encode(&mut text, &registry).is_err() {
        text.clear();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::SectionError;
    use crate::gather::{LateToday, MigrationStatus, ScopeSizes, SessionCounts};
    use adk_postgres_retention::HealthThresholds;

    fn unreachable() -> OpsSnapshot {
        OpsSnapshot::unreachable(
            SectionError::timeout("connect to the database", "no connection within 5s"),
            &HealthThresholds::default(),
        )
    }

    #[test]
    fn an_unreachable_database_scrapes_as_down_with_every_section_failed() {
        let text = render_metrics(&unreachable(), 3, 0.25);
        assert!(text.contains("adk_pg_database_up 0.0\n"), "{text}");
        for section in SECTIONS {
            assert!(text.contains(&format!("adk_pg_scrape_error{{section=\"{section}\"}} 1.0\n")), "{text}");
        }
        assert!(text.contains("# TYPE adk_pg_scrape_errors_total counter\nadk_pg_scrape_errors_total 3\n"), "{text}");
        assert!(text.contains("adk_pg_scrape_duration_seconds 0.25\n"), "{text}");
        assert!(!text.contains("adk_pg_sessions{"), "no made-up figures: {text}");
    }

    #[test]
    fn figures_carry_their_units_and_labels() {
        let mut snapshot = unreachable();
        snapshot.unreachable = None;
        snapshot.sessions = Ok(SessionCounts { live: 7, expired: 2, closed: 1 });
        snapshot.migrations = Ok(MigrationStatus { compiled: 12, pending: vec!["20270101000013".into()] });
        snapshot.late_today = Ok(vec![LateToday { app: "sh\"op".into(), rejected: 4 }]);
        snapshot.state_sizes = Ok(vec![ScopeSizes {
            scope: "user".into(),
            rows: 3,
            p50: Some(40),
            p90: Some(50),
            p99: Some(60),
            max: None,
        }]);
        let text = render_metrics(&snapshot, 0, 0.0);
        assert!(text.contains("adk_pg_database_up 1.0\n"), "{text}");
        assert!(text.contains("adk_pg_scrape_error{section=\"sessions\"} 0.0\n"), "{text}");
        assert!(text.contains("adk_pg_scrape_error{section=\"health\"} 1.0\n"), "health still failed: {text}");
        assert!(text.contains("adk_pg_sessions{state=\"live\"} 7.0\n"), "{text}");
        assert!(text.contains("adk_pg_sessions{state=\"expired\"} 2.0\n"), "{text}");
        assert!(text.contains("adk_pg_migrations_pending 1.0\n"), "{text}");
        assert!(text.contains("adk_pg_rollup_late_rejected_today{app=\"sh\\\"op\"} 4.0\n"), "escaped: {text}");
        assert!(text.contains("adk_pg_state_size_bytes{scope=\"user\",quantile=\"0.99\"} 60.0\n"), "{text}");
        assert!(!text.contains("quantile=\"1\""), "an unknown maximum is left out: {text}");
    }
}
