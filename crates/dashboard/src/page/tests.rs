//! The page from hand-made snapshots: cards follow the typed alerts, empty
//! states say what to do, and nothing from the database reaches the HTML
//! unescaped.

use std::time::Duration as StdDuration;

use adk_postgres_retention::health::{Alert, ArchiveHealth, Check, HealthReport, LastRun, RollupHealth, StateSizes};
use adk_postgres_retention::partitions::{Partition, partition_name};
use adk_postgres_retention::{HealthThresholds, PolicySummary};
use chrono::{DateTime, Days, Duration, NaiveDate, Utc};

use super::cards::{Tone, cards};
use super::*;
use crate::error::SectionError;
use crate::gather::{MigrationStatus, SessionCounts};

fn now() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2026-12-10T12:00:00Z").map(|t| t.with_timezone(&Utc)).unwrap_or_default()
}

fn today() -> NaiveDate {
    now().date_naive()
}

fn healthy() -> HealthReport {
    HealthReport {
        today: today(),
        partitions: 12,
        partitions_ahead: 7,
        oldest_partition: Some(partition_name(today() - Days::new(4))),
        newest_partition: Some(partition_name(today() + Days::new(7))),
        pending_detaches: Vec::new(),
        orphaned_partitions: Vec::new(),
        last_run: Some(LastRun {
            finished_at: now() - Duration::minutes(20),
            today: today(),
            created: 1,
            dropped: 0,
            sessions_deleted: 0,
        }),
        last_failure: None,
        policy: PolicySummary {
            max_session_lifetime_secs: 7 * 86_400,
            retention_secs: 30 * 86_400,
            default_ttl_secs: None,
            premake_days: 7,
            usage: None,
        },
        retire_before: today() - Days::new(37),
        overdue_partitions: Vec::new(),
        session_updates: 100,
        session_hot_updates: 97,
        hot_ratio: Some(0.97),
        state_sizes: StateSizes::default(),
        rollups: Some(RollupHealth {
            watermark: Some(now() - Duration::seconds(40)),
            lag_secs: Some(40),
            overdue_events: false,
            last_run: None,
            late_rejected_today: 0,
            late_rejected_yesterday: 0,
            late_apps_today: Vec::new(),
            tiers: Vec::new(),
            minute_partitions_ahead: 7,
        }),
        archive: ArchiveHealth {
            policy: "archive off".into(),
            on: false,
            objects: 0,
            bytes: 0,
            days: 0,
            last_success: None,
            pending: Vec::new(),
            failures: 0,
        },
        nodes: Vec::new(),
        through_pooler: false,
        alerts: Vec::new(),
        typed_alerts: Vec::new(),
    }
}

fn with_alerts(mut report: HealthReport, alerts: Vec<Alert>) -> HealthReport {
    report.alerts = alerts.iter().map(ToString::to_string).collect();
    report.typed_alerts = alerts;
    report
}

fn partitions() -> Vec<Partition> {
    (-4i64..=7)
        .filter_map(|offset| {
            let day = if offset < 0 {
                today().checked_sub_days(Days::new(offset.unsigned_abs()))
            } else {
                today().checked_add_days(Days::new(offset.unsigned_abs()))
            }?;
            Some(Partition {
                schema: "public".into(),
                name: partition_name(day),
                from: Some(day),
                to: day.succ_opt(),
                detach_pending: false,
            })
        })
        .collect()
}

fn snapshot(report: HealthReport) -> OpsSnapshot {
    let mut ops = OpsSnapshot::unreachable(SectionError::timeout("connect", "x"), &HealthThresholds::default());
    ops.now = now();
    ops.today = today();
    ops.unreachable = None;
    ops.health = Ok(report);
    ops.partitions = Ok(partitions());
    ops.sessions = Ok(SessionCounts { live: 5, expired: 1, closed: 0 });
    ops.state_sizes = Ok(Vec::new());
    ops.late_today = Ok(Vec::new());
    ops.last_rollup_ok = Ok(Some(now() - Duration::seconds(40)));
    ops.migrations = Ok(MigrationStatus { compiled: 12, pending: Vec::new() });
    ops
}

fn tone_of(ops: &OpsSnapshot, key: &str) -> Tone {
    cards(ops).into_iter().find(|card| card.key == key).map_or(Tone::Unknown, |card| card.tone)
}

#[test]
fn a_healthy_store_has_no_red_or_amber_card() {
    let ops = snapshot(healthy());
    for card in cards(&ops) {
        assert!(matches!(card.tone, Tone::Green | Tone::Neutral), "{}: {:?} {:?}", card.key, card.tone, card.notes);
    }
}

#[test]
fn a_card_is_red_exactly_when_status_alerts_on_its_area() {
    let cases = [
        (Alert::warning(Check::PartitionsAhead, "only 2 future day(s)"), "partitions"),
        (Alert::critical(Check::TodayPartition, "no partition for today"), "partitions"),
        (Alert::warning(Check::MaintenanceFailed, "failed"), "maintenance"),
        (Alert::warning(Check::PendingDetach, "pending"), "retention"),
        (Alert::warning(Check::RollupLag, "behind"), "rollups"),
        (Alert::warning(Check::LateEvents, "late"), "late_events"),
    ];
    for (alert, area) in cases {
        let ops = snapshot(with_alerts(healthy(), vec![alert.clone()]));
        let red: Vec<&str> = red_areas(&ops).iter().map(|area| area.name()).collect();
        assert_eq!(red, vec![area], "{alert:?}");
        let page_cards = cards::render(&cards(&ops));
        assert!(page_cards.contains(&format!("data-area=\"{area}\" data-state=\"red\"")), "{area}");
        assert!(page_cards.contains(&escape(&alert.message)), "the card says why");
    }
}

#[test]
fn amber_is_halfway_to_an_alert() {
    let mut report = healthy();
    report.partitions_ahead = 5;
    if let Some(run) = report.last_run.as_mut() {
        run.finished_at = now() - Duration::hours(13);
    }
    if let Some(rollups) = report.rollups.as_mut() {
        rollups.lag_secs = Some(8 * 60);
        rollups.late_rejected_yesterday = 2;
    }
    report.orphaned_partitions = vec!["adk_events_p20261101".into()];
    let ops = snapshot(report);
    for key in ["partitions", "maintenance", "retention", "rollups", "late_events"] {
        assert_eq!(tone_of(&ops, key), Tone::Amber, "{key}");
    }
    assert!(red_areas(&ops).is_empty());
}

#[test]
fn unreadable_health_is_unknown_never_green() {
    let mut ops = snapshot(healthy());
    ops.health = Err(SectionError::timeout("read health", "canceling statement due to statement timeout"));
    for key in ["partitions", "maintenance", "retention", "rollups", "late_events"] {
        assert_eq!(tone_of(&ops, key), Tone::Unknown, "{key}");
    }
    let html = cards::render(&cards(&ops));
    assert!(html.contains("read health timed out: canceling statement due to statement timeout"), "{html}");
}

#[test]
fn pending_migrations_and_large_state_are_amber() {
    let mut ops = snapshot(healthy());
    ops.migrations = Ok(MigrationStatus { compiled: 13, pending: vec!["20270101000013".into()] });
    ops.state_sizes = Ok(vec![crate::gather::ScopeSizes {
        scope: "user".into(),
        rows: 1,
        p50: Some(50_000),
        p90: Some(50_000),
        p99: Some(50_000),
        max: Some(50_000),
    }]);
    assert_eq!(tone_of(&ops, "schema"), Tone::Amber);
    assert_eq!(tone_of(&ops, "storage"), Tone::Amber);
}

fn empty_history() -> History {
    History { maintenance: Ok(Vec::new()), rollups: Ok(Vec::new()) }
}

fn empty_usage() -> UsageView {
    UsageView {
        since: now() - Duration::hours(24),
        until: now(),
        apps: Ok(Vec::new()),
        app: None,
        overall: None,
        by_agent: None,
    }
}

fn page(ops: &OpsSnapshot, history: &History, usage: &UsageView) -> String {
    render(&PageModel {
        ops,
        history,
        usage,
        query: &DashboardQuery::default(),
        database: "db.internal:5432/store",
        elapsed: StdDuration::from_millis(12),
    })
}

#[test]
fn empty_states_say_what_to_run() {
    let mut report = healthy();
    if let Some(rollups) = report.rollups.as_mut() {
        rollups.lag_secs = None;
    }
    let html = page(&snapshot(report), &empty_history(), &empty_usage());
    assert!(html.contains("No rollups yet: run adk-pg rollup"), "usage");
    assert!(html.contains("No maintenance runs yet: run adk-pg maintain"), "maintenance runs");
    assert!(html.starts_with("<!doctype html>") && html.ends_with("</html>"));
    assert!(!html.contains("<script"), "no script at all");
    assert!(html.contains("data-chart=\"partitions\""), "the timeline is drawn");
    assert!(html.contains("data-status=\"ok\""), "healthy pill");
}

#[test]
fn database_text_is_escaped_everywhere() {
    let evil = "<img src=x onerror=alert(1)>";
    let report = with_alerts(healthy(), vec![Alert::warning(Check::MaintenanceFailed, evil)]);
    let mut usage = empty_usage();
    usage.apps = Err(SectionError::new("list the apps with usage", &evil));
    let history =
        History { maintenance: Err(SectionError::new("read the maintenance runs", &evil)), rollups: Ok(Vec::new()) };
    let html = page(&snapshot(report), &history, &usage);
    assert!(!html.contains(evil), "raw database text reached the page");
    assert!(html.contains("&lt;img src=x onerror=alert(1)&gt;"));
}

#[test]
fn an_unreachable_database_says_so_at_the_top() {
    let ops = OpsSnapshot::unreachable(
        SectionError::timeout("connect to the database", "no connection within 5s"),
        &HealthThresholds::default(),
    );
    let error = SectionError::timeout("connect to the database", "no connection within 5s");
    let history = History { maintenance: Err(error.clone()), rollups: Err(error.clone()) };
    let mut usage = empty_usage();
    usage.apps = Err(error);
    let html = page(&ops, &history, &usage);
    assert!(html.contains("The database could not be reached"), "{html}");
    assert!(html.contains("data-status=\"unknown\""));
}

#[test]
fn spans_and_sizes_read_well() {
    assert_eq!(span(0), "0s");
    assert_eq!(span(59), "59s");
    assert_eq!(span(61), "1m 1s");
    assert_eq!(span(3 * 3600 + 120 + 5), "3h 2m");
    assert_eq!(span(2 * 86_400 + 3600), "2d 1h");
    assert_eq!(bytes(512), "512 B");
    assert_eq!(bytes(1536), "1.5 KiB");
    assert_eq!(bytes(5 * 1024 * 1024), "5.0 MiB");
    assert_eq!(bytes(392 * 1024), "392 KiB");
}
