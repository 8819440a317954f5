//! The dashboard page, as pure functions from what was read to HTML.
//!
//! One self-contained document: CSS inline, charts as inline SVG drawn
//! here, system fonts, no script and nothing fetched (the server sends a
//! Content-Security-Policy that forbids both), so it renders the same
//! behind a proxy, offline, or in a screenshot. Every text from the
//! database (app and agent names, error messages) is escaped.

pub mod cards;
pub mod svg;
pub mod timeline;
pub mod usage;

use std::fmt::Write as _;
use std::time::Duration;

use adk_postgres_retention::health::AlertArea;

use crate::gather::{History, OpsSnapshot, UsageView};
use crate::view::DashboardQuery;

/// Everything the page shows.
#[derive(Debug)]
pub struct PageModel<'a> {
    /// The health cards' and the timeline's figures.
    pub ops: &'a OpsSnapshot,
    /// The latest runs.
    pub history: &'a History,
    /// The usage section.
    pub usage: &'a UsageView,
    /// What the URL asked for.
    pub query: &'a DashboardQuery,
    /// The database as the page names it (no password).
    pub database: &'a str,
    /// How long reading took.
    pub elapsed: Duration,
}

/// Escapes text for HTML content and attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A duration in seconds as a person reads it: the two largest units.
pub fn span(secs: u64) -> String {
    let units = [(86_400, "d"), (3_600, "h"), (60, "m"), (1, "s")];
    let mut parts = Vec::new();
    let mut rest = secs;
    for (size, unit) in units {
        if rest >= size || (parts.is_empty() && size == 1) {
            parts.push(format!("{}{unit}", rest / size));
            rest %= size;
        }
        if parts.len() == 2 {
            break;
        }
    }
    parts.join(" ")
}

/// A size in bytes, binary units, with a decimal only below 100.
pub fn bytes(value: i64) -> String {
    const KIB: f64 = 1024.0;
    let v = value as f64;
    let (scaled, unit) = if v >= KIB * KIB * KIB {
        (v / (KIB * KIB * KIB), "GiB")
    } else if v >= KIB * KIB {
        (v / (KIB * KIB), "MiB")
    } else if v >= KIB {
        (v / KIB, "KiB")
    } else {
        return format!("{value} B");
    };
    if scaled >= 100.0 { format!("{scaled:.0} {unit}") } else { format!("{scaled:.1} {unit}") }
}

/// A boxed message: `error`, `empty` or `info`.
pub fn notice(kind: &str, text: &str) -> String {
    format!("<div class=\"notice {kind}\" data-notice=\"{kind}\">{}</div>", escape(text))
}

const STYLE: &str = r#"
:root{--bg:#f4f6fb;--panel:#fff;--ink:#0f172a;--muted:#64748b;--line:#e2e8f0;--green:#16a34a;--amber:#d97706;--red:#dc2626;--accent:#4f46e5;--grey:#94a3b8}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--ink);font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;-webkit-font-smoothing:antialiased}
a{color:var(--accent);text-decoration:none}
.top{background:linear-gradient(90deg,#111827,#1e1b4b);color:#fff;padding:18px 36px;display:flex;align-items:center;justify-content:space-between;gap:24px}
.brand{display:flex;align-items:center;gap:14px}
.logo{width:34px;height:34px;border-radius:9px;background:linear-gradient(135deg,#818cf8,#4f46e5);display:grid;place-items:center;font-weight:800;font-size:15px}
.brand h1{font-size:19px;margin:0;font-weight:650;letter-spacing:.2px}
.brand p{margin:0;color:#c7d2fe;font-size:12.5px}
.pill{padding:6px 14px;border-radius:999px;font-weight:650;font-size:13px;display:inline-flex;align-items:center;gap:8px}
.pill.green{background:#dcfce7;color:#166534}.pill.red{background:#fee2e2;color:#991b1b}.pill.unknown{background:#e2e8f0;color:#334155}
.pill i{width:8px;height:8px;border-radius:50%;background:currentColor}
.meta{color:#c7d2fe;font-size:12.5px;text-align:right}
main{max-width:1320px;margin:0 auto;padding:26px 36px 48px}
h2{font-size:17px;margin:0}
.section-head{display:flex;align-items:baseline;gap:14px;margin:30px 0 12px}
.sub{color:var(--muted);font-size:12.5px;margin:2px 0 0}
.cards{display:grid;grid-template-columns:repeat(4,minmax(0,1fr));gap:14px}
.card{background:var(--panel);border-radius:12px;padding:14px 16px 12px;box-shadow:0 1px 2px rgba(15,23,42,.06),0 4px 12px rgba(15,23,42,.04);border-top:4px solid var(--grey)}
.card.green{border-top-color:var(--green)}.card.amber{border-top-color:var(--amber);background:#fffbeb}.card.red{border-top-color:var(--red);background:#fef2f2}.card.neutral{border-top-color:#818cf8}
.card h3{margin:0 0 6px;font-size:12.5px;text-transform:uppercase;letter-spacing:.6px;color:var(--muted);display:flex;align-items:center;gap:7px}
.card .dot{width:8px;height:8px;border-radius:50%;background:var(--grey)}
.card.green .dot{background:var(--green)}.card.amber .dot{background:var(--amber)}.card.red .dot{background:var(--red)}.card.neutral .dot{background:#818cf8}
.card .value{font-size:25px;font-weight:700;letter-spacing:-.3px}
.card .caption{color:var(--muted);font-size:12px;margin-bottom:6px}
.card dl{display:grid;grid-template-columns:auto 1fr;gap:2px 10px;margin:8px 0 0;font-size:12.5px}
.card dt{color:var(--muted)}.card dd{margin:0;text-align:right;overflow-wrap:anywhere}
.card .note{margin:8px 0 0;font-size:12.5px;color:#7c2d12}.card.red .note{color:#991b1b}
.alerts{list-style:none;margin:18px 0 0;padding:0;display:grid;gap:8px}
.alerts li{background:#fff;border-left:4px solid var(--red);border-radius:8px;padding:9px 14px;box-shadow:0 1px 2px rgba(15,23,42,.06);display:flex;gap:12px;align-items:baseline}
.alerts li.warning{border-left-color:var(--amber)}
.badge{font-size:11px;font-weight:700;text-transform:uppercase;letter-spacing:.5px;padding:2px 8px;border-radius:999px;background:#fee2e2;color:#991b1b;white-space:nowrap}
.warning .badge{background:#fef3c7;color:#92400e}
.area{color:var(--muted);font-size:12px;white-space:nowrap}
.panel{background:var(--panel);border-radius:12px;padding:16px 18px;box-shadow:0 1px 2px rgba(15,23,42,.06),0 4px 12px rgba(15,23,42,.04)}
.panel header{display:flex;justify-content:space-between;align-items:flex-start;gap:12px;margin-bottom:6px}
.panel h3{margin:0;font-size:14.5px}
.legend{list-style:none;margin:0;padding:0;display:flex;flex-wrap:wrap;gap:4px 14px;font-size:12px;color:var(--muted);justify-content:flex-end}
.legend li{display:flex;align-items:center;gap:6px}.legend i{width:10px;height:10px;border-radius:3px;display:inline-block}
.timeline-panel .legend{justify-content:flex-start;margin-top:6px}
svg{display:block;width:100%;height:auto}
svg .grid line{stroke:#eef2f7}svg .baseline,svg .xtick{stroke:#cbd5e1}
svg .tick{fill:#64748b;font-size:11px;font-family:inherit}svg .tick.strong{fill:var(--accent);font-weight:700}
svg .axis-label{fill:#94a3b8;font-size:11px}
svg .line{fill:none;stroke-width:2;stroke-linejoin:round;stroke-linecap:round}
svg .bar{shape-rendering:crispEdges}
.pickers{display:flex;flex-wrap:wrap;gap:10px 26px;margin:4px 0 14px}
.picker{display:flex;align-items:center;flex-wrap:wrap;gap:6px}
.picker span{color:var(--muted);font-size:12px;text-transform:uppercase;letter-spacing:.5px;margin-right:4px}
.chip{padding:4px 11px;border-radius:999px;background:#fff;border:1px solid var(--line);color:var(--ink);font-size:12.5px}
.chip:hover{border-color:#a5b4fc}.chip.on{background:var(--accent);border-color:var(--accent);color:#fff}
.plan{color:var(--muted);font-size:12.5px;margin:0 0 10px}
.totals{display:grid;grid-template-columns:repeat(auto-fit,minmax(130px,1fr));gap:12px;margin-bottom:14px}
.totals div{background:#fff;border-radius:10px;padding:10px 14px;box-shadow:0 1px 2px rgba(15,23,42,.06)}
.totals b{display:block;font-size:20px}.totals span{color:var(--muted);font-size:12px}
.charts{display:grid;grid-template-columns:repeat(2,minmax(0,1fr));gap:14px}
.empty{height:190px;display:grid;place-items:center;color:var(--muted);background:repeating-linear-gradient(45deg,#fafbfd,#fafbfd 10px,#f4f6fb 10px,#f4f6fb 20px);border-radius:8px;font-size:13px;text-align:center;padding:0 20px}
.notice{border-radius:10px;padding:12px 16px;margin:10px 0;font-size:13.5px}
.notice.error{background:#fef2f2;border:1px solid #fecaca;color:#991b1b}
.notice.empty{background:#eef2ff;border:1px solid #c7d2fe;color:#3730a3}
.notice.info{background:#f8fafc;border:1px solid var(--line);color:var(--muted)}
.runs{display:grid;grid-template-columns:repeat(2,minmax(0,1fr));gap:14px}
.grid-table{width:100%;border-collapse:collapse;font-size:12.5px;margin-top:14px;background:#fff;border-radius:10px;overflow:hidden}
.panel .grid-table{margin-top:4px}
.agents-panel{margin-top:14px}
.grid-table th{text-align:left;color:var(--muted);font-weight:600;font-size:11.5px;text-transform:uppercase;letter-spacing:.4px;padding:7px 10px;border-bottom:1px solid var(--line);background:#f8fafc}
.grid-table td{padding:6px 10px;border-bottom:1px solid #f1f5f9;vertical-align:top}
.grid-table tr:last-child td{border-bottom:0}
.outcome{font-weight:650;font-size:11.5px;padding:1px 8px;border-radius:999px;background:#dcfce7;color:#166534}
.outcome.failed{background:#fee2e2;color:#991b1b}.outcome.waiting{background:#fef3c7;color:#92400e}
.err{color:#991b1b;font-size:12px;overflow-wrap:anywhere}
.bar-cell{display:inline-block;width:60px;height:6px;background:#eef2ff;border-radius:3px;margin-right:8px;vertical-align:middle;overflow:hidden}
.bar-cell i{display:block;height:100%;background:#818cf8}
footer{color:var(--muted);font-size:12px;margin-top:34px;display:flex;justify-content:space-between;gap:20px;flex-wrap:wrap}
footer a{margin-left:12px}
@media (max-width:1000px){.cards{grid-template-columns:repeat(2,minmax(0,1fr))}.charts,.runs{grid-template-columns:1fr}}
"#;

fn head(title: &str) -> String {
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <meta http-equiv=\"refresh\" content=\"60\">\
         <link rel=\"icon\" href=\"data:,\"><title>{}</title><style>{STYLE}</style></head>",
        escape(title)
    )
}

fn alerts(ops: &OpsSnapshot) -> String {
    let Ok(report) = &ops.health else { return String::new() };
    if report.typed_alerts.is_empty() {
        return String::new();
    }
    let mut sorted: Vec<_> = report.typed_alerts.iter().collect();
    sorted.sort_by_key(|alert| std::cmp::Reverse(alert.severity));
    let mut html = String::from("<ul class=\"alerts\" data-alerts>");
    for alert in sorted {
        let _ = write!(
            html,
            "<li class=\"{severity}\" data-area=\"{area}\"><span class=\"badge\">{severity}</span>\
             <span class=\"area\">{title}</span><span>{message}</span></li>",
            severity = alert.severity.name(),
            area = alert.area.name(),
            title = escape(alert.area.title()),
            message = escape(&alert.message)
        );
    }
    html.push_str("</ul>");
    html
}

fn status_pill(ops: &OpsSnapshot) -> String {
    match &ops.health {
        Ok(report) if report.is_healthy() => {
            "<span class=\"pill green\" data-status=\"ok\"><i></i>Healthy</span>".into()
        }
        Ok(report) => format!(
            "<span class=\"pill red\" data-status=\"alerting\"><i></i>{} alert{}</span>",
            report.alerts.len(),
            if report.alerts.len() == 1 { "" } else { "s" }
        ),
        Err(_) => "<span class=\"pill unknown\" data-status=\"unknown\"><i></i>Health unknown</span>".into(),
    }
}

fn timeline(ops: &OpsSnapshot) -> String {
    let mut html = String::from(
        "<div class=\"section-head\"><h2>Event partitions</h2><p class=\"sub\">one cell per UTC day: retained, \
         today and premade</p></div><section class=\"panel timeline-panel\">",
    );
    match (&ops.partitions, &ops.health) {
        (Ok(partitions), Ok(report)) => {
            let (legacy, days) =
                timeline::days(partitions, report.today, report.retire_before, report.policy.premake_days);
            html.push_str(&timeline::render(legacy, &days, report.today, report.retire_before));
        }
        (Err(error), _) | (_, Err(error)) => html.push_str(&notice("error", &error.describe())),
    }
    html.push_str("</section>");
    html
}

fn ago(ops: &OpsSnapshot, at: chrono::DateTime<chrono::Utc>) -> String {
    format!("{} ago", span((ops.now - at).num_seconds().max(0).unsigned_abs()))
}

fn outcome(text: &str) -> String {
    format!("<span class=\"outcome {0}\">{0}</span>", escape(text))
}

fn history(ops: &OpsSnapshot, history: &History) -> String {
    let mut html = String::from(
        "<div class=\"section-head\"><h2>Runs</h2><p class=\"sub\">the latest maintenance and rollup runs, \
         failed ones included</p></div><div class=\"runs\">",
    );
    html.push_str("<section class=\"panel\" data-runs=\"maintenance\"><header><h3>Maintenance</h3></header>");
    match &history.maintenance {
        Err(error) => html.push_str(&notice("error", &error.describe())),
        Ok(runs) if runs.is_empty() => html.push_str(&notice(
            "empty",
            "No maintenance runs yet: run adk-pg maintain (for example adk-pg maintain --every 6h).",
        )),
        Ok(runs) => {
            html.push_str(
                "<table class=\"grid-table\"><thead><tr><th>finished</th><th>for</th><th>outcome</th>\
                 <th>created</th><th>dropped</th><th>ahead</th><th>sessions deleted</th></tr></thead><tbody>",
            );
            for run in runs {
                let _ = write!(
                    html,
                    "<tr title=\"{}\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                    run.finished_at.format("%Y-%m-%d %H:%M:%S UTC"),
                    ago(ops, run.finished_at),
                    run.today,
                    outcome(&run.outcome),
                    run.created,
                    run.dropped,
                    run.partitions_ahead,
                    run.sessions_deleted
                );
                if let Some(error) = &run.error {
                    let _ = write!(html, "<tr><td colspan=\"7\" class=\"err\">{}</td></tr>", escape(error));
                }
            }
            html.push_str("</tbody></table>");
        }
    }
    html.push_str("</section><section class=\"panel\" data-runs=\"rollups\"><header><h3>Usage rollups</h3></header>");
    match &history.rollups {
        Err(error) => html.push_str(&notice("error", &error.describe())),
        Ok(runs) if runs.is_empty() => {
            html.push_str(&notice("empty", "No rollups yet: run adk-pg rollup (for example adk-pg rollup --every 1m)."))
        }
        Ok(runs) => {
            html.push_str(
                "<table class=\"grid-table\"><thead><tr><th>finished</th><th>outcome</th><th>read</th>\
                 <th>rolled up</th><th>late</th><th>minutes</th><th>took</th></tr></thead><tbody>",
            );
            for run in runs {
                let took = (run.finished_at - run.started_at).num_milliseconds().max(0);
                let _ = write!(
                    html,
                    "<tr title=\"{}\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{} ms</td></tr>",
                    run.finished_at.format("%Y-%m-%d %H:%M:%S UTC"),
                    ago(ops, run.finished_at),
                    outcome(&run.outcome),
                    run.events_read,
                    run.events_rolled,
                    run.late_rejected,
                    run.minute_buckets,
                    took
                );
                if let Some(error) = &run.error {
                    let _ = write!(html, "<tr><td colspan=\"7\" class=\"err\">{}</td></tr>", escape(error));
                }
            }
            html.push_str("</tbody></table>");
        }
    }
    html.push_str("</section></div>");
    html
}

/// The whole dashboard.
pub fn render(model: &PageModel<'_>) -> String {
    let ops = model.ops;
    let mut html = head("adk-postgres · dashboard");
    let _ = write!(
        html,
        "<body><header class=\"top\"><div class=\"brand\"><div class=\"logo\">pg</div><div><h1>adk-postgres</h1>\
         <p>{}</p></div></div>{}<div class=\"meta\">{} UTC<br>today is {}</div></header><main>",
        escape(model.database),
        status_pill(ops),
        ops.now.format("%Y-%m-%d %H:%M:%S"),
        ops.today
    );
    if let Some(error) = &ops.unreachable {
        html.push_str(&notice(
            "error",
            &format!("The database could not be reached, so nothing below is current. {}", error.describe()),
        ));
    }
    html.push_str(&alerts(ops));
    html.push_str(
        "<div class=\"section-head\"><h2>Health</h2><p class=\"sub\">red: adk-pg status alerts on it · amber: \
         halfway there, or worth a look</p></div>",
    );
    html.push_str(&cards::render(&cards::cards(ops)));
    html.push_str(&timeline(ops));
    let rolled_up_ever = matches!(&history_rollups(model.history), Some(true))
        || ops.health.as_ref().ok().and_then(|r| r.rollups.as_ref()).is_some_and(|r| r.last_run.is_some());
    html.push_str(&usage::render(model.usage, model.query, rolled_up_ever));
    html.push_str(&history(ops, model.history));
    let _ = write!(
        html,
        "<footer><span>Read-only view · read in {} ms · refreshes every minute · alert thresholds: {} days \
         ahead, maintenance within {}, rollups within {}</span><span><a href=\"/metrics\">/metrics</a>\
         <a href=\"/readyz\">/readyz</a><a href=\"/healthz\">/healthz</a></span></footer></main></body></html>",
        model.elapsed.as_millis(),
        ops.thresholds.min_partitions_ahead,
        span(ops.thresholds.max_run_age.as_secs()),
        span(ops.thresholds.max_rollup_lag.as_secs())
    );
    html
}

fn history_rollups(history: &History) -> Option<bool> {
    history.rollups.as_ref().ok().map(|runs| !runs.is_empty())
}

/// A small page for a refused request (a bad parameter, a missing token).
pub fn message_page(title: &str, message: &str) -> String {
    format!(
        "{}<body><main><div class=\"section-head\"><h2>{}</h2></div>{}<p><a href=\"/\">Back to the dashboard</a>\
         </p></main></body></html>",
        head(title),
        escape(title),
        notice("error", message)
    )
}

/// Which cards are red: the areas of the report's alerts.
pub fn red_areas(ops: &OpsSnapshot) -> Vec<AlertArea> {
    cards::cards(ops)
        .iter()
        .filter(|card| card.tone == cards::Tone::Red)
        .filter_map(|card| AlertArea::ALL.into_iter().find(|area| area.name() == card.key))
        .collect()
}

#[cfg(test)]
mod tests;
