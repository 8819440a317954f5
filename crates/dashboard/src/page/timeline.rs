//! The partition timeline: one cell per UTC day, from the oldest retained
//! day through today to the last premade day, coloured by what the catalog
//! says of it, so a missing tomorrow or a day kept past retention shows at
//! a glance.

use std::fmt::Write as _;

use adk_postgres_retention::partitions::Partition;
use chrono::{Datelike, Days, NaiveDate};

use super::escape;

/// Most days drawn before today, and after it.
const MAX_PAST: u64 = 90;
const MAX_AHEAD: u64 = 60;

/// What one day's cell means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DayState {
    /// A past day inside the retention, with its partition.
    Retained,
    /// A past day past lifetime plus retention whose partition is still
    /// attached: kept for a live session, or maintenance is behind.
    Overdue,
    /// Today, with its partition.
    Today,
    /// A future day with its partition.
    Premade,
    /// Today or a future day without a partition: appends for it fail.
    Missing,
    /// A past day without a partition: nothing was kept for it.
    Empty,
    /// A partition stopped halfway through its detach.
    PendingDetach,
}

impl DayState {
    /// The `data-state` value of its cell.
    pub fn name(self) -> &'static str {
        match self {
            DayState::Retained => "retained",
            DayState::Overdue => "overdue",
            DayState::Today => "today",
            DayState::Premade => "premade",
            DayState::Missing => "missing",
            DayState::Empty => "empty",
            DayState::PendingDetach => "pending-detach",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            DayState::Retained => "retained",
            DayState::Overdue => "past retention, still attached",
            DayState::Today => "today",
            DayState::Premade => "premade",
            DayState::Missing => "no partition: appends fail",
            DayState::Empty => "no partition",
            DayState::PendingDetach => "detach pending",
        }
    }

    fn color(self) -> &'static str {
        match self {
            DayState::Retained => "#93a4c3",
            DayState::Overdue => "#f59e0b",
            DayState::Today => "#4f46e5",
            DayState::Premade => "#34d399",
            DayState::Missing => "#ef4444",
            DayState::Empty => "#eef0f4",
            DayState::PendingDetach => "#fb923c",
        }
    }
}

/// The days to draw, oldest first, and whether a legacy (`MINVALUE`)
/// partition comes before them.
pub fn days(
    partitions: &[Partition],
    today: NaiveDate,
    retire_before: NaiveDate,
    premake_days: u32,
) -> (bool, Vec<(NaiveDate, DayState)>) {
    let legacy = partitions.iter().any(|p| p.from.is_none());
    let earliest = today.checked_sub_days(Days::new(MAX_PAST)).unwrap_or(today);
    let latest = today.checked_add_days(Days::new(MAX_AHEAD)).unwrap_or(today);
    let oldest = partitions.iter().filter_map(|p| p.from).min().unwrap_or(today);
    let first = oldest.min(retire_before).max(earliest).min(today);
    let newest = partitions.iter().filter_map(|p| p.to).max().and_then(|to| to.pred_opt()).unwrap_or(today);
    let horizon = today.checked_add_days(Days::new(u64::from(premake_days))).unwrap_or(today);
    let last = newest.max(horizon).min(latest);
    let mut days = Vec::new();
    for day in first.iter_days().take_while(|day| *day <= last) {
        // The legacy block stands for the days it holds.
        if partitions.iter().any(|p| p.from.is_none() && p.holds(day)) {
            continue;
        }
        let holding = partitions.iter().find(|p| p.holds(day) && p.from.is_some());
        let state = match holding {
            Some(p) if p.detach_pending => DayState::PendingDetach,
            Some(_) if day == today => DayState::Today,
            Some(_) if day > today => DayState::Premade,
            Some(_) if day < retire_before => DayState::Overdue,
            Some(_) => DayState::Retained,
            None if day >= today => DayState::Missing,
            None => DayState::Empty,
        };
        days.push((day, state));
    }
    (legacy, days)
}

/// The timeline as SVG, with its legend.
pub fn render(legacy: bool, days: &[(NaiveDate, DayState)], today: NaiveDate, retire_before: NaiveDate) -> String {
    const WIDTH: f64 = 1240.0;
    const HEIGHT: f64 = 92.0;
    const PAD: f64 = 8.0;
    const CELL_TOP: f64 = 26.0;
    const CELL_HEIGHT: f64 = 34.0;
    let legacy_width = if legacy { 64.0 } else { 0.0 };
    let cell = ((WIDTH - 2.0 * PAD - legacy_width) / days.len().max(1) as f64).min(30.0);
    let x0 = PAD + legacy_width;
    let mut last_label = f64::MIN;
    let mut svg = String::new();
    let _ = write!(
        svg,
        "<svg class=\"timeline\" data-chart=\"partitions\" data-points=\"{}\" viewBox=\"0 0 {WIDTH} {HEIGHT}\" \
         role=\"img\" aria-label=\"event partitions by day\" xmlns=\"http://www.w3.org/2000/svg\">",
        days.len()
    );
    if legacy {
        let _ = write!(
            svg,
            "<rect class=\"day\" data-state=\"legacy\" x=\"{PAD}\" y=\"{CELL_TOP}\" width=\"{:.1}\" \
             height=\"{CELL_HEIGHT}\" rx=\"4\" fill=\"#64748b\"><title>legacy partition (before daily \
             partitions)</title></rect><text class=\"tick\" x=\"{:.1}\" y=\"{:.1}\" \
             text-anchor=\"middle\" fill=\"#fff\">legacy</text>",
            legacy_width - 6.0,
            PAD + (legacy_width - 6.0) / 2.0,
            CELL_TOP + CELL_HEIGHT / 2.0 + 4.0
        );
    }
    for (index, (day, state)) in days.iter().enumerate() {
        let x = x0 + cell * index as f64;
        let _ = write!(
            svg,
            "<rect class=\"day\" data-day=\"{day}\" data-state=\"{}\" x=\"{:.1}\" y=\"{CELL_TOP}\" \
             width=\"{:.1}\" height=\"{CELL_HEIGHT}\" rx=\"3\" fill=\"{}\"{}><title>{day}: {}</title></rect>",
            state.name(),
            x + 1.0,
            (cell - 2.0).max(1.0),
            state.color(),
            if *state == DayState::Empty { " stroke=\"#d1d5db\"" } else { "" },
            state.describe()
        );
        // A date under the first day, each month's first and each Monday,
        // where it does not run into the previous label.
        let wanted = index == 0 || day.day() == 1 || day.weekday().num_days_from_monday() == 0;
        if wanted && x - last_label >= 46.0 {
            last_label = x;
            let _ = write!(
                svg,
                "<text class=\"tick\" x=\"{:.1}\" y=\"{:.1}\">{}</text>",
                x + 1.0,
                CELL_TOP + CELL_HEIGHT + 16.0,
                day.format("%b %d")
            );
        }
        // Days before this are past lifetime plus retention.
        if *day == retire_before && index > 0 {
            let _ = write!(
                svg,
                "<line class=\"retire-marker\" x1=\"{x:.1}\" x2=\"{x:.1}\" y1=\"{:.1}\" y2=\"{:.1}\" \
                 stroke=\"#f59e0b\" stroke-width=\"2\"/><text class=\"tick\" x=\"{:.1}\" y=\"18\">retained from here</text>",
                CELL_TOP - 4.0,
                CELL_TOP + CELL_HEIGHT + 4.0,
                x + 4.0
            );
        }
        if *day == today {
            let center = x + cell / 2.0;
            let _ = write!(
                svg,
                "<path class=\"today-marker\" d=\"M{:.1} 14 L{:.1} 14 L{center:.1} 22 Z\" fill=\"#4f46e5\"/>\
                 <text class=\"tick strong\" x=\"{center:.1}\" y=\"10\" text-anchor=\"middle\">today</text>",
                center - 5.0,
                center + 5.0
            );
        }
    }
    svg.push_str("</svg>");
    let mut legend = String::from("<ul class=\"legend\">");
    for state in [
        DayState::Retained,
        DayState::Today,
        DayState::Premade,
        DayState::Missing,
        DayState::Overdue,
        DayState::PendingDetach,
        DayState::Empty,
    ] {
        if state == DayState::Retained
            || state == DayState::Today
            || state == DayState::Premade
            || days.iter().any(|(_, s)| *s == state)
        {
            let _ =
                write!(legend, "<li><i style=\"background:{}\"></i>{}</li>", state.color(), escape(state.describe()));
        }
    }
    legend.push_str("</ul>");
    format!("{svg}{legend}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use adk_postgres_retention::partitions::partition_name;

    fn day(text: &str) -> NaiveDate {
        NaiveDate::parse_from_str(text, "%Y-%m-%d").unwrap_or_default()
    }

    fn part(d: &str) -> Partition {
        Partition {
            schema: "public".into(),
            name: partition_name(day(d)),
            from: Some(day(d)),
            to: day(d).succ_opt(),
            detach_pending: false,
        }
    }

    #[test]
    fn each_day_is_read_from_the_catalog() {
        let today = day("2026-12-10");
        let mut parts: Vec<Partition> =
            ["2026-12-07", "2026-12-08", "2026-12-10", "2026-12-11", "2026-12-13"].into_iter().map(part).collect();
        parts[0].detach_pending = true;
        let (legacy, cells) = days(&parts, today, day("2026-12-08"), 3);
        assert!(!legacy);
        let states: Vec<(String, &str)> = cells.iter().map(|(d, s)| (d.to_string(), s.name())).collect();
        assert_eq!(
            states,
            vec![
                ("2026-12-07".into(), "pending-detach"),
                ("2026-12-08".into(), "retained"),
                ("2026-12-09".into(), "empty"),
                ("2026-12-10".into(), "today"),
                ("2026-12-11".into(), "premade"),
                ("2026-12-12".into(), "missing"),
                ("2026-12-13".into(), "premade"),
            ]
        );
        let (_, overdue) = days(&parts, today, day("2026-12-09"), 3);
        assert_eq!(overdue[1].1, DayState::Overdue);
    }

    #[test]
    fn a_missing_today_and_a_legacy_partition_show() {
        let today = day("2026-12-10");
        let legacy = Partition { from: None, to: Some(day("2026-12-09")), ..part("2026-12-01") };
        let (has_legacy, cells) = days(&[legacy, part("2026-12-11")], today, day("2026-11-01"), 1);
        assert!(has_legacy);
        assert_eq!(cells.iter().find(|(d, _)| *d == today).map(|(_, s)| *s), Some(DayState::Missing));
        assert!(cells.iter().all(|(d, _)| *d >= day("2026-12-09")), "the legacy block stands for its days");
        let svg = render(has_legacy, &cells, today, day("2026-11-01"));
        assert!(svg.contains("data-state=\"legacy\"") && svg.contains(">today</text>"), "{svg}");
        assert!(svg.contains("no partition: appends fail"), "the legend names the missing day");
        let labels = svg.matches("<text class=\"tick\" x=").count();
        assert!(labels >= 1 && labels <= cells.len(), "{labels} labels for {} days", cells.len());
    }
}
