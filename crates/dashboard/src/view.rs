//! What a dashboard URL asks for: the window, the resolution and the app,
//! from plain query parameters (`/?window=7d&res=1h&app=shop`), so every
//! picker is a link or a GET form and the page needs no script.

use std::collections::HashMap;

use adk_postgres_rollup::Resolution;
use chrono::Duration;

/// The windows the picker offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UsageWindow {
    /// The last hour.
    Hour,
    /// The last 24 hours.
    Day,
    /// The last 7 days.
    Week,
    /// The last 30 days.
    Month,
}

impl UsageWindow {
    /// Every window, shortest first, as the picker lists them.
    pub const ALL: [UsageWindow; 4] = [UsageWindow::Hour, UsageWindow::Day, UsageWindow::Week, UsageWindow::Month];

    /// Its `window=` value in the URL, such as `7d`.
    pub fn param(self) -> &'static str {
        match self {
            UsageWindow::Hour => "1h",
            UsageWindow::Day => "24h",
            UsageWindow::Week => "7d",
            UsageWindow::Month => "30d",
        }
    }

    /// What the picker shows.
    pub fn label(self) -> &'static str {
        match self {
            UsageWindow::Hour => "last hour",
            UsageWindow::Day => "last 24 hours",
            UsageWindow::Week => "last 7 days",
            UsageWindow::Month => "last 30 days",
        }
    }

    /// How far back from now it reaches.
    pub fn span(self) -> Duration {
        match self {
            UsageWindow::Hour => Duration::hours(1),
            UsageWindow::Day => Duration::hours(24),
            UsageWindow::Week => Duration::days(7),
            UsageWindow::Month => Duration::days(30),
        }
    }

    fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|window| window.param() == text)
    }
}

/// The resolutions the picker offers; the rollup query layer routes each
/// to a level (`auto` picks the finest that fits a chart).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResolutionChoice {
    /// [`Resolution::Auto`].
    Auto,
    /// A point per minute.
    Minute,
    /// A point per hour.
    Hour,
    /// A point per day.
    Day,
}

impl ResolutionChoice {
    /// Every choice, as the picker lists them.
    pub const ALL: [ResolutionChoice; 4] =
        [ResolutionChoice::Auto, ResolutionChoice::Minute, ResolutionChoice::Hour, ResolutionChoice::Day];

    /// Its `res=` value in the URL, such as `1h`.
    pub fn param(self) -> &'static str {
        match self {
            ResolutionChoice::Auto => "auto",
            ResolutionChoice::Minute => "1m",
            ResolutionChoice::Hour => "1h",
            ResolutionChoice::Day => "1d",
        }
    }

    /// The resolution the usage query is asked for.
    pub fn resolution(self) -> Resolution {
        match self {
            ResolutionChoice::Auto => Resolution::Auto,
            ResolutionChoice::Minute => Resolution::Every(Duration::minutes(1)),
            ResolutionChoice::Hour => Resolution::Every(Duration::hours(1)),
            ResolutionChoice::Day => Resolution::Every(Duration::days(1)),
        }
    }

    fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|choice| choice.param() == text)
    }
}

/// The dashboard's question.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DashboardQuery {
    /// The usage window.
    pub window: UsageWindow,
    /// The width of a chart's points.
    pub resolution: ResolutionChoice,
    /// `None`: the busiest app of the window.
    pub app: Option<String>,
}

impl Default for DashboardQuery {
    fn default() -> Self {
        Self { window: UsageWindow::Day, resolution: ResolutionChoice::Auto, app: None }
    }
}

impl DashboardQuery {
    /// Reads the query parameters; a value the pickers never offer is
    /// refused with the reason, naming the parameter. Unknown parameters
    /// are ignored, so a proxy's own parameters do no harm.
    pub fn from_params(params: &HashMap<String, String>) -> Result<Self, String> {
        let mut query = Self::default();
        if let Some(window) = params.get("window").filter(|w| !w.is_empty()) {
            query.window = UsageWindow::parse(window)
                .ok_or_else(|| format!("window {window:?} is not one of 1h, 24h, 7d, 30d"))?;
        }
        if let Some(res) = params.get("res").filter(|r| !r.is_empty()) {
            query.resolution =
                ResolutionChoice::parse(res).ok_or_else(|| format!("res {res:?} is not one of auto, 1m, 1h, 1d"))?;
        }
        if let Some(app) = params.get("app").filter(|a| !a.is_empty()) {
            // The store's own limits on an app name: an app that could not
            // exist is a typo, not a question.
            if app.chars().count() > 128 || app.chars().any(char::is_control) || app.trim() != app {
                return Err("app must be an app name: 1 to 128 characters, no control characters or \
                            surrounding spaces"
                    .to_owned());
            }
            query.app = Some(app.clone());
        }
        Ok(query)
    }

    /// The query string of this question with one part changed, for the
    /// pickers' links.
    pub fn href(&self, window: UsageWindow, resolution: ResolutionChoice, app: Option<&str>) -> String {
        let mut href = format!("?window={}&res={}", window.param(), resolution.param());
        if let Some(app) = app {
            href.push_str("&app=");
            href.push_str(&url_component(app));
        }
        href
    }
}

/// Percent-encodes everything but unreserved characters.
fn url_component(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => out.push(byte as char),
            _ => out.push_str(&format!("%{byte:02X}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn defaults_and_picks() {
        assert_eq!(DashboardQuery::from_params(&params(&[])), Ok(DashboardQuery::default()));
        let picked =
            DashboardQuery::from_params(&params(&[("window", "7d"), ("res", "1h"), ("app", "shop"), ("x", "y")]));
        assert_eq!(
            picked,
            Ok(DashboardQuery {
                window: UsageWindow::Week,
                resolution: ResolutionChoice::Hour,
                app: Some("shop".into())
            })
        );
        // An empty value is the GET form's "not chosen".
        assert_eq!(DashboardQuery::from_params(&params(&[("app", "")])), Ok(DashboardQuery::default()));
    }

    #[test]
    fn values_the_pickers_never_offer_are_refused_by_name() {
        for (key, value) in [("window", "2y"), ("res", "5s"), ("app", " padded"), ("app", "tab\there")] {
            let refused = DashboardQuery::from_params(&params(&[(key, value)])).expect_err(value);
            assert!(refused.starts_with(key), "{refused}");
        }
        let long = "a".repeat(129);
        assert!(DashboardQuery::from_params(&params(&[("app", long.as_str())])).is_err());
    }

    #[test]
    fn links_carry_the_question_encoded() {
        let query = DashboardQuery::default();
        assert_eq!(
            query.href(UsageWindow::Week, ResolutionChoice::Auto, Some("a b&c/é")),
            "?window=7d&res=auto&app=a%20b%26c%2F%C3%A9"
        );
        assert_eq!(query.href(UsageWindow::Hour, ResolutionChoice::Minute, None), "?window=1h&res=1m");
    }
}
