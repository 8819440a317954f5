//! The dashboard in a real browser: headless Chromium loads the page the
//! server renders from a store with a day of traffic, its DOM has every
//! chart with data drawn, its console stays empty, a forced alert (no
//! partition for tomorrow) turns the partitions card red, and the
//! screenshots land in `target/dashboard/` (the README's comes from there).
//!
//! Without Chromium the test says so loudly and passes, except in CI
//! (`CI=true`), where a missing browser is a failure: `.ci/run` installs it.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use crate::fixture::{realistic, serve};
use adk_postgres_dashboard::ServeConfig;
use adk_postgres_testing::test_database;
use adk_postgres_tests::pg::client;
use chrono::{Days, NaiveDate};

/// Where a browser is looked for, in order.
const BROWSERS: [&str; 3] = ["chromium", "chromium-browser", "google-chrome"];

fn find_browser() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    BROWSERS
        .iter()
        .find_map(|name| std::env::split_paths(&path).map(|dir| dir.join(name)).find(|candidate| candidate.is_file()))
}

/// The browser, or `None` after saying loudly why the test is skipped.
/// In CI a missing browser fails the test instead.
fn browser() -> Option<PathBuf> {
    if let Some(found) = find_browser() {
        return Some(found);
    }
    if std::env::var("CI").is_ok_and(|ci| ci == "true") {
        panic!("CI=true but no Chromium was found ({BROWSERS:?} on PATH): .ci/run installs it with apt-get");
    }
    eprintln!(
        "\n{bar}\nSKIPPED: the dashboard's browser test needs Chromium, and none of {BROWSERS:?} is on PATH.\n\
         Install it (apt-get install chromium) to run it; in CI it is required.\n{bar}\n",
        bar = "!".repeat(78)
    );
    None
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("target"))
        .join("dashboard")
}

/// What one browser run printed.
struct Run {
    stdout: String,
    /// The browser's log, with the page's console messages in it.
    stderr: String,
}

impl Run {
    /// The page's console messages: Chromium logs each as a `CONSOLE` line
    /// (`console.*` calls, and the browser's own reports such as a blocked
    /// load or a Content-Security-Policy violation). The page has no
    /// script, so any of them is a fault.
    fn console(&self) -> Vec<&str> {
        self.stderr.lines().filter(|line| line.contains(":CONSOLE")).collect()
    }
}

async fn chromium(browser: &Path, profile: &Path, args: &[&str]) -> Run {
    let output = tokio::process::Command::new(browser)
        .args(["--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars"])
        .arg("--disable-dev-shm-usage")
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(["--enable-logging=stderr", "--v=0"])
        .args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(120), output)
        .await
        .unwrap_or_else(|_| panic!("Chromium did not finish within two minutes: {args:?}"))
        .unwrap_or_else(|e| panic!("run {}: {e}", browser.display()));
    assert!(
        output.status.success(),
        "Chromium failed ({:?}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    Run {
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// The element of the DOM that starts at `marker`, up to its end tag.
fn element<'a>(dom: &'a str, marker: &str, end: &str) -> &'a str {
    let start = dom.find(marker).unwrap_or_else(|| panic!("the rendered DOM has no {marker}"));
    let stop = dom[start..].find(end).map_or(dom.len(), |at| start + at);
    &dom[start..stop]
}

/// The value of `name` in each start tag `<tag …>` inside `html`.
fn attributes(html: &str, tag: &str, name: &str) -> Vec<String> {
    html.split(&format!("<{tag} "))
        .skip(1)
        .filter_map(|rest| {
            let tag_text = rest.split('>').next()?;
            let value = tag_text.split(&format!(" {name}=\"")).nth(1)?;
            Some(value.split('"').next()?.to_owned())
        })
        .collect()
}

/// Asserts chart `id` is drawn with data: bars of some height, or lines
/// of at least two points.
fn assert_chart_has_data(dom: &str, id: &str) {
    let svg = element(dom, &format!("data-chart=\"{id}\""), "</svg>");
    let heights: Vec<f64> =
        attributes(svg, "rect", "height").iter().filter_map(|h| h.parse().ok()).filter(|h| *h > 0.0).collect();
    let lines: Vec<String> =
        attributes(svg, "path", "d").into_iter().filter(|d| d.starts_with('M') && d.contains('L')).collect();
    assert!(!heights.is_empty() || !lines.is_empty(), "chart {id} draws nothing: {svg}");
    let points: usize =
        svg.split("data-points=\"").nth(1).and_then(|p| p.split('"').next()?.parse().ok()).unwrap_or_default();
    assert!(points > 0, "chart {id} says it has no points");
}

fn assert_png(path: &Path) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "{} is a PNG", path.display());
    assert!(bytes.len() > 40_000, "{} is only {} bytes: a blank page?", path.display(), bytes.len());
}

#[tokio::test(flavor = "multi_thread")]
async fn the_dashboard_renders_in_a_real_browser() {
    let Some(browser) = browser() else { return };
    let out = target_dir();
    std::fs::create_dir_all(&out).expect("target/dashboard");
    let profile = out.join(format!("profile-{}", std::process::id()));

    // The console is really captured: a page that logs an error shows it.
    let control = chromium(
        &browser,
        &profile,
        &["--dump-dom", "data:text/html,<p>control</p><script>console.error('control-error')</script>"],
    )
    .await;
    assert!(control.stdout.contains("control"), "{}", control.stdout);
    assert!(control.console().iter().any(|line| line.contains("control-error")), "{}", control.stderr);

    let db = test_database().await;
    let fixture = realistic(db.url(), false).await;
    let server = serve(ServeConfig::new(db.url())).await;
    let url = format!("http://{}/", server.addr);

    let healthy = chromium(&browser, &profile, &["--dump-dom", &url]).await;
    assert!(healthy.console().is_empty(), "console messages: {:?}", healthy.console());
    let dom = &healthy.stdout;
    for id in ["events", "tokens", "latency", "errors", "distinct", "agents", "partitions"] {
        assert_chart_has_data(dom, id);
    }
    assert_eq!(attributes(dom, "article", "data-state").iter().filter(|s| *s == "red").count(), 0, "no red card");
    assert!(dom.contains("data-status=\"ok\""), "the header says healthy");
    let shot = out.join("dashboard.png");
    let _ = std::fs::remove_file(&shot);
    let screenshot_arg = format!("--screenshot={}", shot.display());
    // Hourly points read best in a picture of a day; the default (auto,
    // five-minute points) was checked above.
    let hourly = format!("{url}?window=24h&res=1h");
    let taken = chromium(&browser, &profile, &["--window-size=1400,2500", &screenshot_arg, &hourly]).await;
    assert!(taken.console().is_empty(), "console messages: {:?}", taken.console());
    assert_png(&shot);

    // Forced alert: tomorrow loses its partition.
    let tomorrow: NaiveDate = fixture.today.checked_add_days(Days::new(1)).expect("tomorrow");
    client(db.url())
        .await
        .batch_execute(&format!("DROP TABLE adk_events_p{}", tomorrow.format("%Y%m%d")))
        .await
        .expect("drop tomorrow's partition");
    let alerting = chromium(&browser, &profile, &["--dump-dom", &url]).await;
    assert!(alerting.console().is_empty(), "console messages: {:?}", alerting.console());
    let dom = &alerting.stdout;
    let card = element(dom, "data-area=\"partitions\"", "</article>");
    assert!(card.contains("data-state=\"red\""), "the partitions card is red: {card}");
    assert!(card.contains("only 0 future day(s) have a partition"), "and says why: {card}");
    let red: Vec<String> = attributes(dom, "article", "data-area")
        .into_iter()
        .zip(attributes(dom, "article", "data-state"))
        .filter(|(_, state)| state == "red")
        .map(|(area, _)| area)
        .collect();
    assert_eq!(red, vec!["partitions".to_owned()], "only the card of the alert's area");
    assert!(dom.contains(&format!("data-day=\"{tomorrow}\" data-state=\"missing\"")), "the timeline shows the gap");
    assert!(dom.contains("data-status=\"alerting\""));
    let alert_shot = out.join("dashboard-alert.png");
    let _ = std::fs::remove_file(&alert_shot);
    let alert_arg = format!("--screenshot={}", alert_shot.display());
    chromium(&browser, &profile, &["--window-size=1400,1100", &alert_arg, &url]).await;
    assert_png(&alert_shot);
    let _ = std::fs::remove_dir_all(&profile);
    eprintln!("screenshots: {} and {}", shot.display(), alert_shot.display());
}
