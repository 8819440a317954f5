//! The usage section: pickers for the app, window and resolution (plain
//! links), the window's totals, charts of events, tokens, latency, errors,
//! distinct sessions and users and events per agent, and a table of agents.
//! Every figure comes from the rollup query layer (`usage`), routed and
//! bounded like `adk-pg usage`.

use std::fmt::Write as _;

use adk_postgres_rollup::{UsageFigures, UsagePoint, UsageReport};

use super::svg::{self, Chart, Kind, Series, TimeAxis};
use super::{escape, notice};
use crate::gather::UsageView;
use crate::view::{DashboardQuery, ResolutionChoice, UsageWindow};

const AGENT_COLORS: [&str; 8] =
    ["#4f46e5", "#0d9488", "#f59e0b", "#e11d48", "#0ea5e9", "#8b5cf6", "#84cc16", "#64748b"];
/// Agents drawn on their own; the rest are summed into one line.
const AGENTS_DRAWN: usize = 7;

/// The x axis of a report: every bucket of its plan's aligned window.
pub fn axis_of(report: &UsageReport) -> TimeAxis {
    let plan = &report.plan;
    let step = plan.resolution;
    let points = (plan.until - plan.since).num_seconds() / step.num_seconds().max(1);
    TimeAxis { start: plan.since, step, points: usize::try_from(points).unwrap_or(0) }
}

/// One value per bucket from the points that have one; `fill` stands in
/// where a bucket had no events (zero for counts, `None` for latency).
pub fn values(
    axis: &TimeAxis,
    points: &[UsagePoint],
    fill: Option<f64>,
    figure: impl Fn(&UsageFigures) -> Option<f64>,
) -> Vec<Option<f64>> {
    let mut values = vec![fill; axis.points];
    for point in points {
        if let Some(index) = axis.index_of(point.start) {
            values[index] = figure(&point.figures).or(fill);
        }
    }
    values
}

fn step_text(report: &UsageReport) -> String {
    let minutes = report.plan.resolution.num_minutes();
    match minutes {
        m if m % 1440 == 0 => format!("{}d", m / 1440),
        m if m % 60 == 0 => format!("{}h", m / 60),
        m => format!("{m}m"),
    }
}

fn panel(title: &str, subtitle: &str, legend: &str, body: &str) -> String {
    format!(
        "<section class=\"panel chart-panel\"><header><div><h3>{}</h3><p class=\"sub\">{}</p></div>{legend}</header>{body}</section>",
        escape(title),
        escape(subtitle)
    )
}

fn chart_panel(title: &str, subtitle: &str, chart: Chart<'_>, empty: &str) -> String {
    if !svg::has_data(&chart.series) {
        return panel(title, subtitle, "", &format!("<div class=\"empty\">{}</div>", escape(empty)));
    }
    panel(title, subtitle, &svg::legend(&chart.series), &svg::render(&chart))
}

fn chip(href: &str, label: &str, selected: bool) -> String {
    format!("<a class=\"chip{}\" href=\"{}\">{}</a>", if selected { " on" } else { "" }, escape(href), escape(label))
}

fn pickers(view: &UsageView, query: &DashboardQuery) -> String {
    let app = view.app.as_deref();
    let mut html = String::from("<nav class=\"pickers\">");
    if let Ok(apps) = &view.apps {
        html.push_str("<div class=\"picker\"><span>App</span>");
        let mut listed = false;
        for total in apps {
            listed |= Some(total.app.as_str()) == app;
            html.push_str(&chip(
                &query.href(query.window, query.resolution, Some(&total.app)),
                &total.app,
                Some(total.app.as_str()) == app,
            ));
        }
        // An app asked for by name that had no traffic still shows as chosen.
        if let (false, Some(app)) = (listed, app) {
            html.push_str(&chip(&query.href(query.window, query.resolution, Some(app)), app, true));
        }
        html.push_str("</div>");
    }
    html.push_str("<div class=\"picker\"><span>Window</span>");
    for window in UsageWindow::ALL {
        html.push_str(&chip(&query.href(window, query.resolution, app), window.param(), window == query.window));
    }
    html.push_str("</div><div class=\"picker\"><span>Resolution</span>");
    for resolution in ResolutionChoice::ALL {
        html.push_str(&chip(
            &query.href(query.window, resolution, app),
            resolution.param(),
            resolution == query.resolution,
        ));
    }
    html.push_str("</div></nav>");
    html
}

fn ms(value: Option<f64>) -> String {
    match value {
        Some(v) if v >= 1_000.0 => format!("{:.1} s", v / 1000.0),
        Some(v) => format!("{v:.0} ms"),
        None => "-".into(),
    }
}

fn totals(report: &UsageReport) -> String {
    let Some(all) = report.series.first() else { return String::new() };
    let total = &all.total;
    let error_rate = if total.events > 0 { 100.0 * total.errors as f64 / total.events as f64 } else { 0.0 };
    let mut tiles = vec![
        ("events", svg::compact(total.events as f64)),
        ("tokens", svg::compact(total.total_tokens as f64)),
        ("errors", format!("{} ({error_rate:.1}%)", svg::compact(total.errors as f64))),
        ("p95 latency", ms(total.latency_ms.p95)),
        ("sessions", svg::compact(total.sessions as f64)),
        ("users", svg::compact(total.users as f64)),
    ];
    if let Some(cost) = &total.cost {
        tiles.push(("cost", cost.clone()));
    }
    let mut html = String::from("<div class=\"totals\">");
    for (label, value) in tiles {
        let _ = write!(html, "<div><b>{}</b><span>{}</span></div>", escape(&value), escape(label));
    }
    html.push_str("</div>");
    html
}

fn charts(overall: &UsageReport, by_agent: Option<&UsageReport>) -> String {
    let axis = axis_of(overall);
    let step = step_text(overall);
    let points: &[UsagePoint] = overall.series.first().map_or(&[], |s| s.points.as_slice());
    let count = |fill: f64, f: fn(&UsageFigures) -> i64| values(&axis, points, Some(fill), move |x| Some(f(x) as f64));
    let empty = "no events in this window";
    let mut html = String::from("<div class=\"charts\">");
    html.push_str(&chart_panel(
        "Events",
        &format!("events stored, per {step}"),
        Chart {
            id: "events",
            kind: Kind::Bars,
            y_label: "events",
            axis,
            series: vec![Series {
                dashed: false,
                name: "events".into(),
                color: "#4f46e5",
                values: count(0.0, |f| f.events),
            }],
        },
        empty,
    ));
    html.push_str(&chart_panel(
        "Tokens",
        &format!("usage_metadata token counts, per {step}"),
        Chart {
            id: "tokens",
            kind: Kind::Bars,
            y_label: "tokens",
            axis,
            series: vec![
                Series {
                    dashed: false,
                    name: "prompt".into(),
                    color: "#818cf8",
                    values: count(0.0, |f| f.prompt_tokens),
                },
                Series {
                    dashed: false,
                    name: "output".into(),
                    color: "#0d9488",
                    values: count(0.0, |f| f.candidates_tokens),
                },
                Series {
                    dashed: false,
                    name: "other (e.g. thinking)".into(),
                    color: "#cbd5e1",
                    values: count(0.0, |f| (f.total_tokens - f.prompt_tokens - f.candidates_tokens).max(0)),
                },
            ],
        },
        "no tokens reported in this window",
    ));
    let latency = |q: fn(&UsageFigures) -> Option<f64>| values(&axis, points, None, q);
    html.push_str(&chart_panel(
        "Latency",
        "time since the previous event of the invocation",
        Chart {
            id: "latency",
            kind: Kind::Lines,
            y_label: "ms",
            axis,
            series: vec![
                Series { dashed: false, name: "p50".into(), color: "#0ea5e9", values: latency(|f| f.latency_ms.p50) },
                Series { dashed: false, name: "p95".into(), color: "#6366f1", values: latency(|f| f.latency_ms.p95) },
                Series { dashed: false, name: "p99".into(), color: "#d946ef", values: latency(|f| f.latency_ms.p99) },
            ],
        },
        "no latencies in this window (they need two events of one invocation)",
    ));
    html.push_str(&chart_panel(
        "Errors",
        &format!("events with an error_code, per {step}"),
        Chart {
            id: "errors",
            kind: Kind::Bars,
            y_label: "errors",
            axis,
            series: vec![Series {
                dashed: false,
                name: "errors".into(),
                color: "#e11d48",
                values: count(0.0, |f| f.errors),
            }],
        },
        "no errors in this window",
    ));
    html.push_str(&chart_panel(
        "Sessions and users",
        &format!("distinct per {step} (HyperLogLog estimates)"),
        Chart {
            id: "distinct",
            kind: Kind::Lines,
            y_label: "distinct",
            axis,
            series: vec![
                Series {
                    dashed: false,
                    name: "sessions".into(),
                    color: "#0d9488",
                    values: count(0.0, |f| f.sessions as i64),
                },
                Series { dashed: true, name: "users".into(), color: "#f59e0b", values: count(0.0, |f| f.users as i64) },
            ],
        },
        empty,
    ));
    if let Some(by_agent) = by_agent {
        let agent_axis = axis_of(by_agent);
        let mut series: Vec<Series> = by_agent
            .series
            .iter()
            .take(AGENTS_DRAWN)
            .zip(AGENT_COLORS)
            .map(|(s, color)| Series {
                dashed: false,
                name: s.group.clone(),
                color,
                values: values(&agent_axis, &s.points, Some(0.0), |f| Some(f.events as f64)),
            })
            .collect();
        let rest: Vec<_> = by_agent.series.iter().skip(AGENTS_DRAWN).collect();
        if !rest.is_empty() {
            let mut values = vec![Some(0.0); agent_axis.points];
            for s in rest {
                for point in &s.points {
                    if let Some(slot) = agent_axis.index_of(point.start).and_then(|i| values.get_mut(i)) {
                        *slot = Some(slot.unwrap_or(0.0) + point.figures.events as f64);
                    }
                }
            }
            series.push(Series {
                dashed: false,
                name: "other agents".into(),
                color: AGENT_COLORS[AGENTS_DRAWN],
                values,
            });
        }
        html.push_str(&chart_panel(
            "Events by agent",
            &format!("events per author, per {step}"),
            Chart { id: "agents", kind: Kind::Lines, y_label: "events", axis: agent_axis, series },
            empty,
        ));
    }
    html.push_str("</div>");
    html
}

fn agent_table(report: &UsageReport) -> String {
    if report.series.is_empty() {
        return String::new();
    }
    let all: i64 = report.series.iter().map(|s| s.total.events).sum();
    let mut html = String::from(
        "<section class=\"panel agents-panel\"><header><div><h3>Agents</h3><p class=\"sub\">the window's totals \
         per author, busiest first</p></div></header><table class=\"grid-table\" data-table=\"agents\"><thead><tr><th>agent</th><th>events</th><th>share</th>\
         <th>tokens</th><th>errors</th><th>p50</th><th>p95</th><th>p99</th><th>sessions</th><th>users</th></tr>\
         </thead><tbody>",
    );
    for series in &report.series {
        let t = &series.total;
        let share = if all > 0 { 100.0 * t.events as f64 / all as f64 } else { 0.0 };
        let _ = write!(
            html,
            "<tr><td>{}</td><td>{}</td><td><span class=\"bar-cell\"><i style=\"width:{share:.0}%\"></i></span>{share:.0}%</td>\
             <td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(&series.group),
            t.events,
            t.total_tokens,
            t.errors,
            ms(t.latency_ms.p50),
            ms(t.latency_ms.p95),
            ms(t.latency_ms.p99),
            t.sessions,
            t.users
        );
    }
    html.push_str("</tbody></table></section>");
    html
}

/// The usage section. `rolled_up_ever` says whether any rollup run is on
/// record, to tell "nothing rolled up yet" from "a quiet window".
pub fn render(view: &UsageView, query: &DashboardQuery, rolled_up_ever: bool) -> String {
    let mut html = String::from("<section class=\"usage\" id=\"usage\">");
    let _ = write!(
        html,
        "<div class=\"section-head\"><h2>Usage</h2><p class=\"sub\">{} · {} to {} UTC</p></div>",
        escape(query.window.label()),
        view.since.format("%Y-%m-%d %H:%M"),
        view.until.format("%Y-%m-%d %H:%M")
    );
    html.push_str(&pickers(view, query));
    match &view.apps {
        Err(error) => {
            html.push_str(&notice("error", &error.describe()));
            html.push_str("</section>");
            return html;
        }
        Ok(apps) if apps.is_empty() && view.app.is_none() => {
            let text = if rolled_up_ever {
                format!(
                    "No usage in the {}: pick a wider window, or check that agents are writing events and that \
                     adk-pg rollup runs.",
                    query.window.label()
                )
            } else {
                "No rollups yet: run adk-pg rollup (for example adk-pg rollup --every 1m), then reload.".to_owned()
            };
            html.push_str(&notice("empty", &text));
            html.push_str("</section>");
            return html;
        }
        Ok(_) => {}
    }
    match &view.overall {
        Some(Ok(overall)) => {
            let _ = write!(
                html,
                "<p class=\"plan\">{} · {} points of {} from the {} rollups</p>",
                escape(view.app.as_deref().unwrap_or_default()),
                overall.plan.points,
                step_text(overall),
                overall.plan.level
            );
            html.push_str(&totals(overall));
            let by_agent = view.by_agent.as_ref().and_then(|r| r.as_ref().ok());
            html.push_str(&charts(overall, by_agent));
            if let Some(Err(error)) = &view.by_agent {
                html.push_str(&notice("error", &error.describe()));
            }
            if let Some(by_agent) = by_agent {
                html.push_str(&agent_table(by_agent));
            }
        }
        Some(Err(error)) => {
            html.push_str(&notice(
                "error",
                &format!("{} (pick a coarser resolution or a shorter window)", error.describe()),
            ));
        }
        None => {}
    }
    html.push_str("</section>");
    html
}

#[cfg(test)]
mod tests {
    use super::*;
    use adk_postgres_rollup::{Level, UsagePlan, UsageSeries};
    use chrono::{DateTime, Duration, Utc};

    fn at(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text).map(|t| t.with_timezone(&Utc)).unwrap_or_default()
    }

    fn figures(events: i64, p95: Option<f64>) -> UsageFigures {
        UsageFigures {
            events,
            total_tokens: events * 10,
            prompt_tokens: events * 4,
            candidates_tokens: events * 5,
            latency_ms: adk_postgres_rollup::Percentiles { p50: p95, p95, p99: p95 },
            sessions: 1,
            users: 1,
            ..UsageFigures::default()
        }
    }

    fn report(groups: &[(&str, &[(usize, i64)])]) -> UsageReport {
        let since = at("2026-12-01T00:00:00Z");
        let plan = UsagePlan {
            level: Level::Hour,
            resolution: Duration::hours(1),
            since,
            until: since + Duration::hours(6),
            points: 6,
        };
        let series = groups
            .iter()
            .map(|(group, points)| UsageSeries {
                group: (*group).to_owned(),
                total: figures(points.iter().map(|(_, e)| e).sum(), Some(120.0)),
                points: points
                    .iter()
                    .map(|(i, e)| UsagePoint {
                        start: since + Duration::hours(*i as i64),
                        figures: figures(*e, Some(100.0)),
                    })
                    .collect(),
            })
            .collect();
        UsageReport { app: "shop".into(), by: None, plan, series }
    }

    #[test]
    fn points_land_in_their_buckets_and_gaps_are_filled_as_asked() {
        let report = report(&[("all", &[(0, 3), (4, 5)])]);
        let axis = axis_of(&report);
        assert_eq!(axis.points, 6);
        let points = &report.series[0].points;
        assert_eq!(
            values(&axis, points, Some(0.0), |f| Some(f.events as f64)),
            vec![Some(3.0), Some(0.0), Some(0.0), Some(0.0), Some(5.0), Some(0.0)]
        );
        let latency = values(&axis, points, None, |f| f.latency_ms.p95);
        assert_eq!(latency, vec![Some(100.0), None, None, None, Some(100.0), None]);
    }

    #[test]
    fn charts_draw_every_figure_and_the_agents() {
        let overall = report(&[("all", &[(0, 3), (1, 4), (4, 5)])]);
        let agents = report(&[("planner", &[(0, 2), (1, 4)]), ("user", &[(0, 1), (4, 5)])]);
        let html = charts(&overall, Some(&agents));
        for id in ["events", "tokens", "latency", "errors", "distinct", "agents"] {
            assert!(html.contains(&format!("data-chart=\"{id}\"")) || id == "errors", "{id}");
        }
        // No errors at all: an empty state instead of an empty chart.
        assert!(!html.contains("data-chart=\"errors\"") && html.contains("no errors in this window"));
        assert_eq!(html.matches("<rect class=\"bar\"").count(), 3 + 3 * 3, "events, and three token stacks");
        assert!(html.contains("data-series=\"planner\"") && html.contains("data-series=\"user\""));
        let table = agent_table(&agents);
        assert!(table.contains("<td>planner</td><td>6</td>"), "{table}");
    }
}
