//! Charts as inline SVG, drawn on the server: bars (stacked when there are
//! several series) and lines over a time axis, with gridlines, tick labels
//! and a legend. Pure functions of their input, so the tests read them.

use std::fmt::Write as _;

use chrono::{DateTime, Duration, Utc};

use super::escape;

const WIDTH: f64 = 640.0;
const HEIGHT: f64 = 250.0;
const LEFT: f64 = 58.0;
const RIGHT: f64 = 14.0;
const TOP: f64 = 14.0;
const BOTTOM: f64 = 34.0;

/// The x axis: `points` buckets of `step` from `start`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeAxis {
    /// The first bucket's start.
    pub start: DateTime<Utc>,
    /// Each bucket's width.
    pub step: Duration,
    /// How many buckets.
    pub points: usize,
}

impl TimeAxis {
    /// The bucket `at` falls in, if it is on the axis.
    pub fn index_of(&self, at: DateTime<Utc>) -> Option<usize> {
        let step = self.step.num_seconds();
        if step <= 0 || at < self.start {
            return None;
        }
        let index = usize::try_from((at - self.start).num_seconds() / step).ok()?;
        (index < self.points).then_some(index)
    }

    fn x_of(&self, index: usize) -> f64 {
        LEFT + (WIDTH - LEFT - RIGHT) * index as f64 / self.points.max(1) as f64
    }

    fn bucket_width(&self) -> f64 {
        (WIDTH - LEFT - RIGHT) / self.points.max(1) as f64
    }
}

/// One series: a value per bucket of the axis, `None` where there is none
/// (a line breaks there; a bar is absent).
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Drawn dashed (lines only), so a line that runs along another
    /// still shows.
    pub dashed: bool,
    /// The legend's label.
    pub name: String,
    /// A CSS colour.
    pub color: &'static str,
    /// One value per bucket of the axis.
    pub values: Vec<Option<f64>>,
}

/// What kind of chart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Bars, stacked in series order.
    Bars,
    /// A line per series.
    Lines,
}

/// A chart to draw.
#[derive(Debug, Clone)]
pub struct Chart<'a> {
    /// A stable id (`data-chart`), for tests and anchors.
    pub id: &'a str,
    /// Bars or lines.
    pub kind: Kind,
    /// What the y axis counts, e.g. "events per 5m" or "ms".
    pub y_label: &'a str,
    /// The time axis.
    pub axis: TimeAxis,
    /// What to draw, in legend order.
    pub series: Vec<Series>,
}

/// A round maximum and step for the y axis, so ticks read 0, 250, 500…;
/// with `whole`, only whole steps, for counts ("2.5 events" is no reading).
pub fn nice_scale(max: f64, whole: bool) -> (f64, f64) {
    if !max.is_finite() || max <= 0.0 {
        return if whole { (1.0, 1.0) } else { (1.0, 0.25) };
    }
    let rough = max / 4.0;
    let magnitude = 10f64.powf(rough.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .into_iter()
        .map(|m| m * magnitude)
        .filter(|step| !whole || (step.fract() == 0.0 && *step >= 1.0))
        .find(|step| *step >= rough)
        .unwrap_or(10.0 * magnitude)
        .max(if whole { 1.0 } else { 0.0 });
    ((max / step).ceil() * step, step)
}

/// A number as a tick or a tooltip shows it: 950, 1.2k, 3.4M.
pub fn compact(value: f64) -> String {
    let abs = value.abs();
    let (scaled, suffix) = match abs {
        a if a >= 1e9 => (value / 1e9, "G"),
        a if a >= 1e6 => (value / 1e6, "M"),
        a if a >= 1e4 => (value / 1e3, "k"),
        _ => (value, ""),
    };
    if suffix.is_empty() && scaled.fract().abs() > 1e-9 && abs < 100.0 {
        return format!("{scaled:.1}");
    }
    if suffix.is_empty() {
        return format!("{scaled:.0}");
    }
    let text = format!("{scaled:.1}");
    format!("{}{suffix}", text.trim_end_matches(".0"))
}

fn time_label(at: DateTime<Utc>, axis: &TimeAxis) -> String {
    let span = axis.step * i32::try_from(axis.points).unwrap_or(i32::MAX);
    if span <= Duration::days(2) { at.format("%H:%M").to_string() } else { at.format("%b %d").to_string() }
}

/// The chart's legend as HTML, for the panel's header.
pub fn legend(series: &[Series]) -> String {
    let mut html = String::from("<ul class=\"legend\">");
    for s in series {
        let _ = write!(html, "<li><i style=\"background:{}\"></i>{}</li>", s.color, escape(&s.name));
    }
    html.push_str("</ul>");
    html
}

/// Whether any series has a value to draw.
pub fn has_data(series: &[Series]) -> bool {
    series.iter().any(|s| s.values.iter().any(|v| v.is_some_and(|v| v > 0.0)))
}

/// The chart as an `<svg>` element.
pub fn render(chart: &Chart<'_>) -> String {
    let axis = &chart.axis;
    let stacked_max = (0..axis.points)
        .map(|i| match chart.kind {
            Kind::Bars => chart.series.iter().filter_map(|s| s.values.get(i).copied().flatten()).sum::<f64>(),
            Kind::Lines => chart.series.iter().filter_map(|s| s.values.get(i).copied().flatten()).fold(0.0, f64::max),
        })
        .fold(0.0, f64::max);
    let whole = chart.series.iter().all(|s| s.values.iter().flatten().all(|v| v.fract() == 0.0));
    let (y_max, y_step) = nice_scale(stacked_max, whole);
    let plot_height = HEIGHT - TOP - BOTTOM;
    let y_of = |value: f64| TOP + plot_height * (1.0 - value / y_max);
    let points_drawn: usize = chart.series.iter().map(|s| s.values.iter().flatten().count()).sum();

    let mut svg = String::new();
    let _ = write!(
        svg,
        "<svg class=\"chart\" data-chart=\"{}\" data-points=\"{points_drawn}\" viewBox=\"0 0 {WIDTH} {HEIGHT}\" \
         role=\"img\" aria-label=\"{}\" xmlns=\"http://www.w3.org/2000/svg\">",
        escape(chart.id),
        escape(chart.y_label)
    );
    // Gridlines and y ticks.
    svg.push_str("<g class=\"grid\">");
    let mut tick = 0.0;
    while tick <= y_max + y_step / 2.0 {
        let y = y_of(tick);
        let _ = write!(
            svg,
            "<line x1=\"{LEFT}\" x2=\"{:.1}\" y1=\"{y:.1}\" y2=\"{y:.1}\"/>\
             <text class=\"tick\" x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            WIDTH - RIGHT,
            LEFT - 8.0,
            y + 4.0,
            compact(tick)
        );
        tick += y_step;
    }
    svg.push_str("</g>");
    let _ = write!(
        svg,
        "<text class=\"axis-label\" x=\"12\" y=\"{:.1}\" transform=\"rotate(-90 12 {:.1})\" \
         text-anchor=\"middle\">{}</text>",
        TOP + plot_height / 2.0,
        TOP + plot_height / 2.0,
        escape(chart.y_label)
    );
    // X ticks: about six labels, on bucket boundaries.
    let every = axis.points.div_ceil(6).max(1);
    let _ = write!(
        svg,
        "<line class=\"baseline\" x1=\"{LEFT}\" x2=\"{:.1}\" y1=\"{:.1}\" y2=\"{:.1}\"/>",
        WIDTH - RIGHT,
        TOP + plot_height,
        TOP + plot_height
    );
    for index in (0..axis.points).step_by(every) {
        let x = axis.x_of(index);
        let at = axis.start + axis.step * i32::try_from(index).unwrap_or(0);
        let _ = write!(
            svg,
            "<line class=\"xtick\" x1=\"{x:.1}\" x2=\"{x:.1}\" y1=\"{:.1}\" y2=\"{:.1}\"/>\
             <text class=\"tick\" x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
            TOP + plot_height,
            TOP + plot_height + 4.0,
            HEIGHT - BOTTOM + 18.0,
            time_label(at, axis)
        );
    }
    match chart.kind {
        Kind::Bars => {
            let width = axis.bucket_width();
            let gap = if width > 4.0 { width * 0.18 } else { 0.0 };
            let mut base = vec![0.0; axis.points];
            for series in &chart.series {
                let _ = write!(svg, "<g class=\"series\" data-series=\"{}\">", escape(&series.name));
                for (index, value) in series.values.iter().enumerate().take(axis.points) {
                    let Some(value) = value.filter(|v| *v > 0.0) else { continue };
                    let bottom = base[index];
                    base[index] += value;
                    let (y_top, y_bottom) = (y_of(base[index]), y_of(bottom));
                    let at = axis.start + axis.step * i32::try_from(index).unwrap_or(0);
                    let _ = write!(
                        svg,
                        "<rect class=\"bar\" x=\"{:.2}\" y=\"{y_top:.2}\" width=\"{:.2}\" height=\"{:.2}\" \
                         fill=\"{}\" data-value=\"{value}\"><title>{} {}: {}</title></rect>",
                        axis.x_of(index) + gap / 2.0,
                        (width - gap).max(0.8),
                        (y_bottom - y_top).max(0.5),
                        series.color,
                        at.format("%Y-%m-%d %H:%M"),
                        escape(&series.name),
                        compact(value)
                    );
                }
                svg.push_str("</g>");
            }
        }
        Kind::Lines => {
            let half = axis.bucket_width() / 2.0;
            for series in &chart.series {
                let mut path = String::new();
                let mut pen_down = false;
                let mut lone = Vec::new();
                for (index, value) in series.values.iter().enumerate().take(axis.points) {
                    match value {
                        Some(value) => {
                            let (x, y) = (axis.x_of(index) + half, y_of(*value));
                            let _ = write!(path, "{}{x:.1} {y:.1} ", if pen_down { "L" } else { "M" });
                            let next = series.values.get(index + 1).copied().flatten();
                            if !pen_down && next.is_none() {
                                lone.push((x, y));
                            }
                            pen_down = true;
                        }
                        None => pen_down = false,
                    }
                }
                if path.is_empty() {
                    continue;
                }
                let _ = write!(
                    svg,
                    "<g class=\"series\" data-series=\"{name}\"><path class=\"line\" d=\"{}\" stroke=\"{color}\"{dash}>\
                     <title>{name}</title></path>",
                    path.trim_end(),
                    name = escape(&series.name),
                    color = series.color,
                    dash = if series.dashed { " stroke-dasharray=\"6 4\"" } else { "" }
                );
                // A point with no neighbour would draw nothing as a line.
                for (x, y) in lone {
                    let _ = write!(
                        svg,
                        "<circle class=\"dot\" cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"2.5\" fill=\"{}\"/>",
                        series.color
                    );
                }
                svg.push_str("</g>");
            }
        }
    }
    svg.push_str("</svg>");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    fn axis(points: usize) -> TimeAxis {
        TimeAxis {
            start: DateTime::parse_from_rfc3339("2026-12-01T00:00:00Z")
                .map(|t| t.with_timezone(&Utc))
                .unwrap_or_default(),
            step: Duration::hours(1),
            points,
        }
    }

    #[test]
    fn scales_are_round() {
        assert_eq!(nice_scale(0.0, false), (1.0, 0.25));
        assert_eq!(nice_scale(7.0, false), (8.0, 2.0));
        assert_eq!(nice_scale(950.0, false), (1000.0, 250.0));
        assert_eq!(nice_scale(1001.0, false), (1500.0, 500.0));
        assert_eq!(nice_scale(f64::NAN, false), (1.0, 0.25));
        assert_eq!(nice_scale(10.0, false), (10.0, 2.5));
        assert_eq!(nice_scale(10.0, true), (10.0, 5.0), "no 2.5 steps for counts");
        assert_eq!(nice_scale(2.0, true), (2.0, 1.0));
        assert_eq!(nice_scale(0.0, true), (1.0, 1.0));
        assert_eq!(nice_scale(9_000.0, true), (10_000.0, 2_500.0), "2.5 thousand is whole");
    }

    #[test]
    fn numbers_are_compact() {
        assert_eq!(compact(0.0), "0");
        assert_eq!(compact(12.5), "12.5");
        assert_eq!(compact(950.0), "950");
        assert_eq!(compact(12_000.0), "12k");
        assert_eq!(compact(1_250_000.0), "1.2M");
    }

    #[test]
    fn bars_stack_and_skip_empty_buckets() {
        let chart = Chart {
            id: "tokens",
            kind: Kind::Bars,
            y_label: "tokens",
            axis: axis(4),
            series: vec![
                Series {
                    dashed: false,
                    name: "prompt".into(),
                    color: "#111",
                    values: vec![Some(10.0), None, Some(0.0), Some(5.0)],
                },
                Series {
                    dashed: false,
                    name: "output".into(),
                    color: "#222",
                    values: vec![Some(30.0), None, None, Some(5.0)],
                },
            ],
        };
        let svg = render(&chart);
        assert_eq!(svg.matches("<rect class=\"bar\"").count(), 4, "{svg}");
        assert!(svg.contains("data-chart=\"tokens\""));
        assert!(svg.contains("<title>2026-12-01 00:00 output: 30</title>"), "{svg}");
        // The stack of 40 reaches the nice maximum (40 → 40): the output bar
        // of the first bucket starts at the top of the plot.
        assert!(svg.contains(&format!("y=\"{TOP:.2}\"")), "{svg}");
    }

    #[test]
    fn lines_break_at_gaps_and_lone_points_get_a_dot() {
        let chart = Chart {
            id: "latency",
            kind: Kind::Lines,
            y_label: "ms",
            axis: axis(5),
            series: vec![Series {
                dashed: false,
                name: "p95 <b>".into(),
                color: "#333",
                values: vec![Some(1.0), Some(2.0), None, Some(3.0), None],
            }],
        };
        let svg = render(&chart);
        let d = svg.split("d=\"").nth(1).and_then(|rest| rest.split('"').next()).unwrap_or_default();
        assert_eq!(d.matches('M').count(), 2, "{d}");
        assert_eq!(d.matches('L').count(), 1, "{d}");
        assert_eq!(svg.matches("<circle").count(), 1, "{svg}");
        assert!(svg.contains("p95 &lt;b&gt;") && !svg.contains("<b>"), "names are escaped");
    }

    #[test]
    fn counts_get_whole_ticks() {
        let chart = Chart {
            id: "errors",
            kind: Kind::Bars,
            y_label: "errors",
            axis: axis(2),
            series: vec![Series {
                dashed: false,
                name: "errors".into(),
                color: "#e11d48",
                values: vec![Some(2.0), Some(1.0)],
            }],
        };
        let svg = render(&chart);
        let ticks: Vec<&str> =
            svg.split("text-anchor=\"end\">").skip(1).filter_map(|rest| rest.split('<').next()).collect();
        assert_eq!(ticks, vec!["0", "1", "2"], "{svg}");
    }

    #[test]
    fn the_axis_places_times_in_buckets() {
        let axis = axis(24);
        assert_eq!(axis.index_of(axis.start), Some(0));
        assert_eq!(axis.index_of(axis.start + Duration::minutes(90)), Some(1));
        assert_eq!(axis.index_of(axis.start - Duration::seconds(1)), None);
        assert_eq!(axis.index_of(axis.start + Duration::hours(24)), None);
        assert!(!has_data(&[Series { dashed: false, name: "x".into(), color: "#000", values: vec![None, Some(0.0)] }]));
    }
}
