//! The health cards. A card about an area `adk-pg status` alerts on is red
//! exactly when status raises an alert in that area (the typed alerts of
//! the health report, not a rule of our own), amber when a figure is
//! halfway to such an alert or something is off that status only reports,
//! and green otherwise. Cards about facts status never alerts on (sessions,
//! storage, schema) are neutral or amber, never red.

use std::fmt::Write as _;

use adk_postgres_retention::HealthReport;
use adk_postgres_retention::health::AlertArea;

use super::{bytes, escape, span};
use crate::gather::OpsSnapshot;

/// Largest state size before the storage card turns amber: three quarters
/// of the 64 KiB a scope's state may hold.
const STATE_SIZE_WATCH: i64 = 48 * 1024;

/// A card's colour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tone {
    /// Nothing to do.
    Green,
    /// Halfway to an alert, or something status reports without alerting.
    Amber,
    /// `adk-pg status` alerts in this area.
    Red,
    /// The figures could not be read.
    Unknown,
    /// Facts without a rule.
    Neutral,
}

impl Tone {
    /// The CSS class and `data-state` value of its card.
    pub fn name(self) -> &'static str {
        match self {
            Tone::Green => "green",
            Tone::Amber => "amber",
            Tone::Red => "red",
            Tone::Unknown => "unknown",
            Tone::Neutral => "neutral",
        }
    }
}

/// One card.
#[derive(Debug, Clone, PartialEq)]
pub struct Card {
    /// `data-area`: the alert area's name, or the fact's.
    pub key: &'static str,
    /// The heading.
    pub title: &'static str,
    /// Its colour.
    pub tone: Tone,
    /// The headline figure.
    pub value: String,
    /// The line under it.
    pub caption: String,
    /// Further figures, as (label, value).
    pub details: Vec<(String, String)>,
    /// The alerts (red), or why it is amber.
    pub notes: Vec<String>,
}

/// Why an alert area is amber, if it is: figures halfway to status's
/// thresholds, or oddities status reports without alerting.
pub fn watch(report: &HealthReport, area: AlertArea, ops: &OpsSnapshot) -> Option<String> {
    let thresholds = &ops.thresholds;
    match area {
        AlertArea::Partitions => (report.partitions_ahead < report.policy.premake_days).then(|| {
            format!(
                "{} of the policy's {} premade days exist: has maintenance run today?",
                report.partitions_ahead, report.policy.premake_days
            )
        }),
        AlertArea::Maintenance => report.last_run.as_ref().and_then(|run| {
            let age = (ops.now - run.finished_at).num_seconds().max(0).unsigned_abs();
            (age > thresholds.max_run_age.as_secs() / 2).then(|| {
                format!(
                    "the last successful run was {} ago; status alerts after {}",
                    span(age),
                    span(thresholds.max_run_age.as_secs())
                )
            })
        }),
        AlertArea::Retention => (!report.orphaned_partitions.is_empty()).then(|| {
            format!(
                "detached tables left by an interrupted run: {}; the next maintenance run drops or re-attaches them",
                report.orphaned_partitions.join(", ")
            )
        }),
        AlertArea::Rollups => match &report.rollups {
            None => Some("the usage rollups are not installed: run adk-pg migrate".to_owned()),
            Some(rollups) => match rollups.lag_secs {
                None => Some("rollups have never run: schedule adk-pg rollup --every 1m".to_owned()),
                Some(lag) if lag > thresholds.max_rollup_lag.as_secs() / 2 => Some(format!(
                    "{} behind; status alerts after {}",
                    span(lag),
                    span(thresholds.max_rollup_lag.as_secs())
                )),
                Some(_) => None,
            },
        },
        AlertArea::LateEvents => report.rollups.as_ref().and_then(|rollups| {
            (rollups.late_rejected_yesterday > 0).then(|| {
                format!("{} event(s) arriving yesterday were rejected as late", rollups.late_rejected_yesterday)
            })
        }),
        AlertArea::Archive => (!report.archive.on && report.archive.objects > 0).then(|| {
            "archiving is off: days past retention are dropped unarchived; adk-pg policy set --archive URL".to_owned()
        }),
    }
}

fn area_card(report: &HealthReport, area: AlertArea, ops: &OpsSnapshot) -> Card {
    let alerts: Vec<String> = report.alerts_in(area).map(|alert| alert.message.clone()).collect();
    let amber = watch(report, area, ops);
    let tone = match (&alerts[..], &amber) {
        ([_, ..], _) => Tone::Red,
        ([], Some(_)) => Tone::Amber,
        ([], None) => Tone::Green,
    };
    let notes = if alerts.is_empty() { amber.into_iter().collect() } else { alerts };
    let mut card = Card {
        key: area.name(),
        title: area.title(),
        tone,
        value: String::new(),
        caption: String::new(),
        details: Vec::new(),
        notes,
    };
    let today_partition =
        ops.partitions.as_ref().ok().and_then(|parts| {
            parts.iter().find(|p| !p.detach_pending && p.holds(report.today)).map(|p| p.name.clone())
        });
    match area {
        AlertArea::Partitions => {
            card.value = format!("{} day{} ahead", report.partitions_ahead, plural(report.partitions_ahead.into()));
            card.caption = format!(
                "policy premakes {}; status alerts below {}",
                report.policy.premake_days, ops.thresholds.min_partitions_ahead
            );
            card.details.push(("today".into(), today_partition.unwrap_or_else(|| "no partition".into())));
            card.details.push(("attached".into(), report.partitions.to_string()));
            card.details.push(("newest".into(), report.newest_partition.clone().unwrap_or_else(|| "-".into())));
        }
        AlertArea::Maintenance => {
            match &report.last_run {
                Some(run) => {
                    card.value =
                        format!("{} ago", span((ops.now - run.finished_at).num_seconds().max(0).unsigned_abs()));
                    card.caption = "last successful run".into();
                    card.details.push(("ran for".into(), run.today.to_string()));
                    card.details.push(("created / dropped".into(), format!("{} / {}", run.created, run.dropped)));
                    card.details.push(("sessions deleted".into(), run.sessions_deleted.to_string()));
                }
                None => {
                    card.value = "never".into();
                    card.caption = "run adk-pg maintain (e.g. --every 6h)".into();
                }
            }
            if let Some(failure) = &report.last_failure {
                card.details
                    .push(("last failure".into(), failure.finished_at.format("%Y-%m-%d %H:%M UTC").to_string()));
            }
        }
        AlertArea::Retention => {
            let kept = ops.partitions.as_ref().map_or(0, |parts| {
                parts.iter().filter(|p| !p.detach_pending && p.to.is_some_and(|to| to <= report.today)).count()
            });
            card.value = format!("{kept} past day{} kept", plural(kept as u64));
            card.caption = format!("retiring days before {}", report.retire_before);
            card.details.push((
                "lifetime + retention".into(),
                format!("{} + {}", span(report.policy.max_session_lifetime_secs), span(report.policy.retention_secs)),
            ));
            card.details.push(("overdue".into(), count_or_none(report.overdue_partitions.len())));
            card.details.push(("pending detaches".into(), count_or_none(report.pending_detaches.len())));
            card.details.push(("orphaned tables".into(), count_or_none(report.orphaned_partitions.len())));
        }
        AlertArea::Rollups => match &report.rollups {
            None => {
                card.value = "not installed".into();
                card.caption = "run adk-pg migrate".into();
            }
            Some(rollups) => {
                match rollups.lag_secs {
                    Some(lag) => {
                        card.value = format!("{} behind", span(lag));
                        card.caption = "usage figures trail the events by".into();
                    }
                    None => {
                        card.value = "never run".into();
                        card.caption = "run adk-pg rollup (e.g. --every 1m)".into();
                    }
                }
                if let Some(run) = &rollups.last_run {
                    card.details.push((
                        "last run".into(),
                        format!(
                            "{} {} ago",
                            run.outcome,
                            span((ops.now - run.finished_at).num_seconds().max(0).unsigned_abs())
                        ),
                    ));
                    card.details.push(("rolled up".into(), format!("{} event(s)", run.events_rolled_up)));
                }
                let tiers: Vec<String> =
                    rollups.tiers.iter().map(|t| format!("{} {}", t.level, bytes(t.bytes))).collect();
                if !tiers.is_empty() {
                    card.details.push(("tiers".into(), tiers.join(" · ")));
                }
            }
        },
        AlertArea::Archive => {
            let archive = &report.archive;
            if archive.on {
                card.value = format!("{} day{} archived", archive.days, plural(archive.days.unsigned_abs()));
                card.caption = archive.policy.clone();
            } else {
                card.value = "off".into();
                card.caption = "days past retention are dropped; adk-pg policy set --archive URL".into();
            }
            card.details.push(("objects".into(), format!("{} · {}", archive.objects, bytes(archive.bytes))));
            card.details.push((
                "newest".into(),
                archive.last_success.map_or_else(
                    || "never".into(),
                    |at| format!("{} ago", span((ops.now - at).num_seconds().max(0).unsigned_abs())),
                ),
            ));
            card.details.push(("days kept, not archived".into(), count_or_none(archive.pending.len())));
            card.details.push(("failed attempts".into(), archive.failures.to_string()));
        }
        AlertArea::LateEvents => match &report.rollups {
            None => {
                card.value = "-".into();
                card.caption = "the usage rollups are not installed".into();
            }
            Some(rollups) => {
                card.value = rollups.late_rejected_today.to_string();
                card.caption = "events rejected as late today (UTC)".into();
                card.details.push(("yesterday".into(), rollups.late_rejected_yesterday.to_string()));
                let apps: Vec<String> =
                    rollups.late_apps_today.iter().map(|a| format!("{} ({})", a.app, a.rejected)).collect();
                card.details.push(("apps today".into(), if apps.is_empty() { "none".into() } else { apps.join(", ") }));
            }
        },
    }
    card
}

fn plural(n: u64) -> &'static str {
    if n == 1 { "" } else { "s" }
}

fn count_or_none(n: usize) -> String {
    if n == 0 { "none".into() } else { n.to_string() }
}

fn unknown(key: &'static str, title: &'static str, error: &crate::error::SectionError) -> Card {
    Card {
        key,
        title,
        tone: Tone::Unknown,
        value: "unknown".into(),
        caption: "could not be read".into(),
        details: Vec::new(),
        notes: vec![error.describe()],
    }
}

/// Every card, in page order.
pub fn cards(ops: &OpsSnapshot) -> Vec<Card> {
    let mut cards: Vec<Card> = AlertArea::ALL
        .into_iter()
        .map(|area| match &ops.health {
            Ok(report) => area_card(report, area, ops),
            Err(error) => unknown(area.name(), area.title(), error),
        })
        .collect();
    cards.push(match &ops.sessions {
        Ok(sessions) => Card {
            key: "sessions",
            title: "Sessions",
            tone: Tone::Neutral,
            value: sessions.live.to_string(),
            caption: "live: open and not expired".into(),
            details: vec![
                ("expired, not purged".into(), sessions.expired.to_string()),
                ("closed by rollover".into(), sessions.closed.to_string()),
            ],
            notes: Vec::new(),
        },
        Err(error) => unknown("sessions", "Sessions", error),
    });
    cards.push(storage_card(ops));
    cards.push(match &ops.migrations {
        Ok(migrations) if migrations.pending.is_empty() => Card {
            key: "schema",
            title: "Schema",
            tone: Tone::Green,
            value: "up to date".into(),
            caption: format!("{} migrations applied", migrations.compiled),
            details: Vec::new(),
            notes: Vec::new(),
        },
        Ok(migrations) => Card {
            key: "schema",
            title: "Schema",
            tone: Tone::Amber,
            value: format!("{} pending", migrations.pending.len()),
            caption: "migrations this adk-pg has and the database lacks".into(),
            details: vec![("pending".into(), migrations.pending.join(", "))],
            notes: vec!["not ready until applied: run adk-pg migrate".into()],
        },
        Err(error) => unknown("schema", "Schema", error),
    });
    cards
}

fn storage_card(ops: &OpsSnapshot) -> Card {
    let mut card = Card {
        key: "storage",
        title: "Storage",
        tone: Tone::Neutral,
        value: "-".into(),
        caption: "HOT updates of adk_sessions".into(),
        details: Vec::new(),
        notes: Vec::new(),
    };
    if let Ok(report) = &ops.health {
        card.value = report.hot_ratio.map_or_else(|| "no updates yet".into(), |ratio| format!("{:.1}%", ratio * 100.0));
        let connection = if report.through_pooler { "through a connection pooler" } else { "direct" };
        card.details.push(("connection".into(), connection.into()));
    }
    match &ops.state_sizes {
        Ok(scopes) => {
            for scope in scopes {
                let text = match (scope.p50, scope.p99) {
                    (Some(p50), Some(p99)) => format!("p50 {} · p99 {}", bytes(p50), bytes(p99)),
                    _ => "no rows".into(),
                };
                card.details.push((format!("{} state", scope.scope), text));
                if let Some(max) = scope.max.filter(|max| *max >= STATE_SIZE_WATCH) {
                    card.tone = Tone::Amber;
                    card.notes.push(format!(
                        "a {} state takes {} of the 64 KiB a state may hold",
                        scope.scope,
                        bytes(max)
                    ));
                }
            }
        }
        Err(error) => card.notes.push(error.describe()),
    }
    card
}

/// The cards as HTML.
pub fn render(cards: &[Card]) -> String {
    let mut html = String::from("<div class=\"cards\">");
    for card in cards {
        let _ = write!(
            html,
            "<article class=\"card {tone}\" data-area=\"{key}\" data-state=\"{tone}\">\
             <h3><span class=\"dot\"></span>{title}</h3><div class=\"value\">{value}</div>\
             <div class=\"caption\">{caption}</div>",
            tone = card.tone.name(),
            key = card.key,
            title = escape(card.title),
            value = escape(&card.value),
            caption = escape(&card.caption)
        );
        if !card.details.is_empty() {
            html.push_str("<dl>");
            for (label, value) in &card.details {
                let _ = write!(html, "<dt>{}</dt><dd>{}</dd>", escape(label), escape(value));
            }
            html.push_str("</dl>");
        }
        for note in &card.notes {
            let _ = write!(html, "<p class=\"note\">{}</p>", escape(note));
        }
        html.push_str("</article>");
    }
    html.push_str("</div>");
    html
}
