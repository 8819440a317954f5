//! Usage queries against real PostgreSQL: they read one level pruned to
//! the window's partitions, refuse bad questions before reading anything,
//! answer exactly for known events, and a role bound to an app sees only
//! that app's rollups.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use adk_postgres_domain::{AppendOptions, Event, SessionKey, SessionStore};
use adk_postgres_rollup::{
    GroupBy, Level, MAX_POINTS, Resolution, RollupConfig, UsageError, UsageFigures, UsageQuery, UsageReport, plan,
    run_rollup, tiers, usage, usage_at,
};
use adk_postgres_storage::tenancy::AppBinding;
use adk_postgres_testing::test_database;
use adk_postgres_tests::pg::{self, client, new_session, store};
use chrono::{DateTime, Duration, TimeZone, Utc};
use serde_json::{Value, json};
use tokio_postgres::Client;
use tokio_postgres::error::SqlState;

fn query(app: &str, since: DateTime<Utc>, until: DateTime<Utc>, resolution: &str, by: Option<GroupBy>) -> UsageQuery {
    UsageQuery {
        app: app.to_owned(),
        window: Some((since, until)),
        by,
        resolution: resolution.parse().expect("a valid resolution"),
    }
}

fn floor_minute(at: DateTime<Utc>) -> DateTime<Utc> {
    Utc.timestamp_opt(at.timestamp().div_euclid(60) * 60, 0).single().expect("a minute")
}

/// The policy's tiers and the server's clock, as `usage` reads them.
async fn server_tiers(url: &str) -> (adk_postgres_rollup::Tiers, DateTime<Utc>) {
    tiers(&mut pg::diesel(url).await).await.expect("read the tiers")
}

// ---------------------------------------------------------------------------
// Routing and pruning
// ---------------------------------------------------------------------------

/// The partitions of `level` whose span meets `[since, until)`, by name,
/// worked out here from the naming rule rather than asked of the crate.
fn covering_partitions(level: Level, since: DateTime<Utc>, until: DateTime<Utc>) -> BTreeSet<String> {
    let last = (until - Duration::nanoseconds(1)).date_naive();
    let mut names = BTreeSet::new();
    let mut day = since.date_naive();
    while day <= last {
        names.insert(match level {
            Level::Minute => format!("adk_usage_1m_p{}", day.format("%Y%m%d")),
            Level::Hour => format!("adk_usage_1h_p{}", day.format("%Y%m")),
            Level::Day => format!("adk_usage_1d_p{}", day.format("%Y")),
        });
        day = day.succ_opt().expect("a next day");
    }
    names
}

async fn partitions_of(sql: &Client, table: &str) -> BTreeSet<String> {
    sql.query(
        "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
         WHERE i.inhparent = $1::text::regclass",
        &[&table],
    )
    .await
    .expect("list partitions")
    .iter()
    .map(|r| r.get(0))
    .collect()
}

/// Every relation a plan scans, and how many subplans run-time pruning
/// removed.
fn scanned(plan: &Value, relations: &mut BTreeSet<String>, removed: &mut i64) {
    if let Some(name) = plan.get("Relation Name").and_then(Value::as_str) {
        relations.insert(name.to_owned());
    }
    *removed += plan.get("Subplans Removed").and_then(Value::as_i64).unwrap_or(0);
    for child in plan.get("Plans").and_then(Value::as_array).into_iter().flatten() {
        scanned(child, relations, removed);
    }
}

async fn explain_execute(
    sql: &Client,
    app: &str,
    since: DateTime<Utc>,
    until: DateTime<Utc>,
) -> (BTreeSet<String>, i64) {
    let row = sql
        .query_one(
            &format!(
                "EXPLAIN (FORMAT JSON) EXECUTE usage_q('{app}', '{}', '{}')",
                since.to_rfc3339(),
                until.to_rfc3339()
            ),
            &[],
        )
        .await
        .expect("explain the usage statement");
    let document: Value = row
        .try_get::<_, Value>(0)
        .or_else(|_| serde_json::from_str(row.get::<_, &str>(0)))
        .expect("EXPLAIN output is JSON");
    let mut relations = BTreeSet::new();
    let mut removed = 0;
    for entry in document.as_array().expect("a list of plans") {
        scanned(&entry["Plan"], &mut relations, &mut removed);
    }
    (relations, removed)
}

#[tokio::test(flavor = "multi_thread")]
async fn each_window_reads_one_level_pruned_to_its_partitions() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    // Enough partitions on every level that reading all of them would show.
    sql.batch_execute(
        "SELECT adk_ensure_usage_partition('1m', now() - make_interval(days => d)) FROM generate_series(0, 10) d;
         SELECT adk_ensure_usage_partition('1h', now() - make_interval(months => m)) FROM generate_series(0, 13) m;
         SELECT adk_ensure_usage_partition('1d', now() - make_interval(years => y)) FROM generate_series(0, 5) y;",
    )
    .await
    .expect("premake partitions");
    let (tiers, now) = server_tiers(db.url()).await;

    let cases = [
        ("24 h auto", now - Duration::hours(24), now, "auto", Level::Minute, Duration::minutes(5)),
        ("7 d auto", now - Duration::days(7), now, "auto", Level::Hour, Duration::hours(1)),
        ("1 year auto", now - Duration::days(365), now, "auto", Level::Day, Duration::days(1)),
        ("2 d at 1h", now - Duration::days(2), now, "1h", Level::Hour, Duration::hours(1)),
    ];
    for (label, since, until, resolution, level, step) in cases {
        let plan = plan(&query("shop", since, until, resolution, None), &tiers, now).expect(label);
        assert_eq!((plan.level, plan.resolution), (level, step), "{label}");
        let all = partitions_of(&sql, level.table()).await;
        let expected: BTreeSet<String> =
            covering_partitions(level, plan.since, plan.until).intersection(&all).cloned().collect();
        assert!(!expected.is_empty(), "{label}: the window has partitions");
        assert!(all.len() > expected.len(), "{label}: {} partitions, so pruning shows", all.len());

        sql.batch_execute(&format!(
            "DEALLOCATE ALL; PREPARE usage_q(text, timestamptz, timestamptz) AS {}",
            plan.sql()
        ))
        .await
        .expect("prepare the usage statement");
        // A custom plan is pruned when planned, with the values bound.
        sql.batch_execute("SET plan_cache_mode = force_custom_plan").await.expect("custom plans");
        let (relations, removed) = explain_execute(&sql, "shop", plan.since, plan.until).await;
        assert_eq!(relations, expected, "{label}: a custom plan reads only the window's partitions of {level}");
        assert_eq!(removed, 0, "{label}: nothing left to prune at run time");
        // A generic plan names every partition and prunes them when it starts.
        sql.batch_execute("SET plan_cache_mode = force_generic_plan").await.expect("generic plans");
        let (relations, removed) = explain_execute(&sql, "shop", plan.since, plan.until).await;
        assert_eq!(relations, expected, "{label}: a generic plan runs only the window's partitions of {level}");
        assert_eq!(removed as usize, all.len() - expected.len(), "{label}: Subplans Removed");
        sql.batch_execute("RESET plan_cache_mode").await.expect("reset");
    }
}

// ---------------------------------------------------------------------------
// Refusals
// ---------------------------------------------------------------------------

/// A question, and whether an error is the refusal it deserves.
type Refusal = (&'static str, UsageQuery, fn(&UsageError) -> bool);

#[tokio::test(flavor = "multi_thread")]
async fn bad_questions_are_refused_by_name_without_reading_rollups() {
    let db = test_database().await;
    let (tiers, now) = server_tiers(db.url()).await;
    let minute = floor_minute(now);

    for bad in ["", "0m", "5", "1w", "m", "-1h", "90s", "1.5h", "1H", " 1h", "527041m", "99999999999999999999m"] {
        let parsed = bad.parse::<Resolution>();
        assert!(matches!(parsed, Err(UsageError::InvalidInput { field: "resolution", .. })), "{bad:?}: {parsed:?}");
    }
    let by = "team".parse::<GroupBy>();
    assert!(matches!(by, Err(UsageError::InvalidInput { field: "by", .. })), "{by:?}");

    let mut no_window = query("shop", now - Duration::hours(1), now, "auto", None);
    no_window.window = None;
    let refusals: Vec<Refusal> = vec![
        ("no window", no_window, |e| matches!(e, UsageError::InvalidInput { field: "window", .. })),
        ("since = until", query("shop", now, now, "auto", None), |e| {
            matches!(e, UsageError::InvalidInput { field: "window", .. })
        }),
        ("since > until", query("shop", now, now - Duration::hours(1), "1h", None), |e| {
            matches!(e, UsageError::InvalidInput { field: "window", .. })
        }),
        ("empty app", query("", now - Duration::hours(1), now, "auto", None), |e| {
            matches!(e, UsageError::InvalidInput { field: "app", .. })
        }),
        ("blank app", query("  ", now - Duration::hours(1), now, "auto", None), |e| {
            matches!(e, UsageError::InvalidInput { field: "app", .. })
        }),
        (
            "3 days at 1m",
            query("shop", minute - Duration::days(3), minute, "1m", None),
            |e| matches!(e, UsageError::TooManyPoints { points: 4320, max: MAX_POINTS, resolution } if resolution == "1m"),
        ),
        (
            "5m of a month ago",
            query("shop", now - Duration::days(30), now - Duration::days(29), "5m", None),
            |e| matches!(e, UsageError::NotRetained { resolution, .. } if resolution == "5m"),
        ),
        (
            "1h of two years ago",
            query("shop", now - Duration::days(730), now - Duration::days(729), "1h", None),
            |e| matches!(e, UsageError::NotRetained { resolution, .. } if resolution == "1h"),
        ),
        // Both refusals apply; either is right, reading is not.
        ("30 days at 1m", query("shop", now - Duration::days(30), now, "1m", None), |e| {
            matches!(e, UsageError::NotRetained { .. } | UsageError::TooManyPoints { .. })
        }),
    ];
    let sub_minute = UsageQuery {
        resolution: Resolution::Every(Duration::seconds(90)),
        ..query("shop", now - Duration::hours(1), now, "1h", None)
    };
    let zero = UsageQuery { resolution: Resolution::Every(Duration::zero()), ..sub_minute.clone() };
    let negative = UsageQuery { resolution: Resolution::Every(Duration::minutes(-5)), ..sub_minute.clone() };

    // The planner alone, with no database at all.
    for (label, q, expected) in &refusals {
        let refused = plan(q, &tiers, now).expect_err(label);
        assert!(expected(&refused), "{label}: {refused:?}");
    }
    for q in [&sub_minute, &zero, &negative] {
        let refused = plan(q, &tiers, now).expect_err("a resolution that is not whole minutes");
        assert!(matches!(refused, UsageError::InvalidInput { field: "resolution", .. }), "{refused:?}");
    }

    // Through `usage_at`, with every level locked: a query that reached the
    // rollup tables would wait for the lock and fail on its timeout, so a
    // typed refusal proves none was read.
    let locker = client(db.url()).await;
    locker
        .batch_execute("BEGIN; LOCK TABLE adk_usage_1m, adk_usage_1h, adk_usage_1d IN ACCESS EXCLUSIVE MODE")
        .await
        .expect("lock every level");
    for (label, q, expected) in &refusals {
        let refused = usage_at(db.url(), q).await.expect_err(label);
        assert!(expected(&refused), "{label}: {refused:?}");
    }
    let control = usage_at(db.url(), &query("shop", now - Duration::hours(1), now, "auto", None))
        .await
        .expect_err("a valid query waits for the lock");
    assert!(
        matches!(&control, UsageError::Query { .. }) && control.to_string().contains("lock timeout"),
        "the lock is what a read would meet: {control}"
    );
    locker.batch_execute("ROLLBACK").await.expect("unlock");
}

// ---------------------------------------------------------------------------
// Exact answers
// ---------------------------------------------------------------------------

/// What one event is known to contribute.
struct Known {
    id: String,
    author: &'static str,
    kind: &'static str,
    at: DateTime<Utc>,
    tokens: (i64, i64, i64),
    /// In ten-thousandths, to add decimals exactly.
    cost: Option<i64>,
    session: &'static str,
    user: &'static str,
    latency_ms: Option<f64>,
}

/// One event to append: what it is, and what it should count as.
struct Spec {
    author: &'static str,
    kind: &'static str,
    invocation: &'static str,
    at: DateTime<Utc>,
    usage_metadata: Option<Value>,
    tokens: (i64, i64, i64),
    cost: Option<i64>,
    latency_ms: Option<f64>,
}

fn spec(author: &'static str, kind: &'static str, invocation: &'static str, at: DateTime<Utc>) -> Spec {
    Spec { author, kind, invocation, at, usage_metadata: None, tokens: (0, 0, 0), cost: None, latency_ms: None }
}

impl Spec {
    /// `usage_metadata` as written, with the (prompt, candidates, total)
    /// tokens and the cost (in ten-thousandths) it should count for.
    fn metered(self, metadata: Value, tokens: (i64, i64, i64), cost: Option<i64>) -> Self {
        Self { usage_metadata: Some(metadata), tokens, cost, ..self }
    }

    /// The time since the previous event of its invocation.
    fn after_ms(self, latency_ms: f64) -> Self {
        Self { latency_ms: Some(latency_ms), ..self }
    }
}

/// Appends `spec` to `key`'s session as adk-rust writes such an event, and
/// records what it should count as.
async fn append_known(store: &dyn SessionStore, key: &SessionKey, known: &mut Vec<Known>, spec: Spec) {
    let mut event = Event::new(spec.author);
    event.timestamp = spec.at;
    event.invocation_id = spec.invocation.to_owned();
    event.content = Some(match spec.kind {
        "user_message" => json!({"role": "user", "parts": [{"text": "book a table for two"}]}),
        "tool_call" => json!({"role": "model", "parts": [{"functionCall": {"name": "lookup", "args": {"q": "x"}}}]}),
        "tool_result" => json!({"role": "user", "parts": [{"functionResponse": {"name": "lookup", "response": {}}}]}),
        _ => json!({"role": "model", "parts": [{"text": "done"}]}),
    });
    if spec.kind == "error" {
        event.extra.insert("error_code".into(), json!("RATE_LIMITED"));
    }
    if let Some(metadata) = spec.usage_metadata {
        event.extra.insert("usage_metadata".into(), metadata);
    }
    let id = event.id.clone();
    store.append(key, event, AppendOptions::default()).await.expect("append a known event");
    let (session, user) = if key.user_id.as_str() == "u1" { ("a", "u1") } else { ("b", "u2") };
    known.push(Known {
        id,
        author: spec.author,
        kind: spec.kind,
        at: spec.at,
        tokens: spec.tokens,
        cost: spec.cost,
        session,
        user,
        latency_ms: spec.latency_ms,
    });
}

/// Figures summed by hand.
#[derive(Default)]
struct Tally {
    events: i64,
    errors: i64,
    bytes: i64,
    min: Option<i32>,
    max: Option<i32>,
    tokens: (i64, i64, i64),
    cost: Option<i64>,
    sessions: BTreeSet<&'static str>,
    users: BTreeSet<&'static str>,
    latencies: Vec<f64>,
    sizes: Vec<f64>,
}

impl Tally {
    fn add(&mut self, k: &Known, bytes: i32) {
        self.events += 1;
        self.errors += i64::from(k.kind == "error");
        self.bytes += i64::from(bytes);
        self.min = Some(self.min.map_or(bytes, |m| m.min(bytes)));
        self.max = Some(self.max.map_or(bytes, |m| m.max(bytes)));
        self.tokens = (self.tokens.0 + k.tokens.0, self.tokens.1 + k.tokens.1, self.tokens.2 + k.tokens.2);
        if let Some(cost) = k.cost {
            self.cost = Some(self.cost.unwrap_or(0) + cost);
        }
        self.sessions.insert(k.session);
        self.users.insert(k.user);
        self.latencies.extend(k.latency_ms);
        self.sizes.push(f64::from(bytes));
    }
}

/// Ten-thousandths as the shortest decimal text.
fn decimal(units: i64) -> String {
    let (whole, frac) = (units / 10_000, units % 10_000);
    let frac = format!("{frac:04}");
    let frac = frac.trim_end_matches('0');
    if frac.is_empty() { whole.to_string() } else { format!("{whole}.{frac}") }
}

/// The value at rank ⌊q·(n−1)⌋, which a quantile sketch approximates.
fn exact_quantile(values: &[f64], q: f64) -> Option<f64> {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = (q * (sorted.len() as f64 - 1.0)).floor() as usize;
    sorted.get(rank).copied()
}

fn assert_close(label: &str, got: Option<f64>, want: Option<f64>) {
    match (got, want) {
        (Some(got), Some(want)) => {
            assert!((got - want).abs() <= want * 0.01, "{label}: {got} is not within 1 % of {want}")
        }
        (got, want) => assert_eq!(got, want, "{label}"),
    }
}

fn assert_figures(label: &str, got: &UsageFigures, want: &Tally) {
    assert_eq!(
        (got.events, got.errors, got.payload_bytes, got.payload_bytes_min, got.payload_bytes_max),
        (want.events, want.errors, want.bytes, want.min, want.max),
        "{label}: events, errors, payload bytes, min, max"
    );
    assert_eq!(
        (got.prompt_tokens, got.candidates_tokens, got.total_tokens),
        want.tokens,
        "{label}: prompt, candidates, total tokens"
    );
    assert_eq!(got.cost, want.cost.map(decimal), "{label}: cost");
    assert_eq!(
        (got.sessions, got.users),
        (want.sessions.len() as u64, want.users.len() as u64),
        "{label}: distinct sessions, users"
    );
}

/// Checks `report` against the known events of its app, grouped and
/// bucketed the way the query says.
fn assert_report(report: &UsageReport, known: &[Known], bytes: &HashMap<String, i32>) {
    let step = report.plan.resolution;
    let mut want: BTreeMap<String, (Tally, BTreeMap<DateTime<Utc>, Tally>)> = BTreeMap::new();
    for k in known {
        let group = match report.by {
            None => "all".to_owned(),
            Some(GroupBy::Agent) => k.author.to_owned(),
            Some(GroupBy::Kind) => k.kind.to_owned(),
        };
        let minute = floor_minute(k.at);
        let start = report.plan.since + step * ((minute - report.plan.since).num_seconds() / step.num_seconds()) as i32;
        let size = bytes[&k.id];
        let (total, points) = want.entry(group).or_default();
        total.add(k, size);
        points.entry(start).or_default().add(k, size);
    }
    let label = format!("{:?} at {} from the {} level", report.by, step, report.plan.level);
    let groups: Vec<&str> = report.series.iter().map(|s| s.group.as_str()).collect();
    let mut order: Vec<(&String, i64)> = want.iter().map(|(g, (t, _))| (g, t.events)).collect();
    order.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
    assert_eq!(groups, order.iter().map(|(g, _)| g.as_str()).collect::<Vec<_>>(), "{label}: series, busiest first");
    for series in &report.series {
        let (total, points) = &want[&series.group];
        assert_figures(&format!("{label}, {} total", series.group), &series.total, total);
        let starts: Vec<DateTime<Utc>> = series.points.iter().map(|p| p.start).collect();
        assert_eq!(starts, points.keys().copied().collect::<Vec<_>>(), "{label}, {}: points with events", series.group);
        for point in &series.points {
            assert_eq!(point.start.timestamp() % step.num_seconds(), 0, "{label}: points align to the resolution");
            assert!(report.plan.since <= point.start && point.start < report.plan.until, "{label}: inside the window");
            assert_figures(
                &format!("{label}, {} at {}", series.group, point.start),
                &point.figures,
                &points[&point.start],
            );
        }
        for (name, q) in [("p50", 0.5), ("p95", 0.95), ("p99", 0.99)] {
            let latency = match name {
                "p50" => series.total.latency_ms.p50,
                "p95" => series.total.latency_ms.p95,
                _ => series.total.latency_ms.p99,
            };
            assert_close(
                &format!("{label}, {} latency {name}", series.group),
                latency,
                exact_quantile(&total.latencies, q),
            );
        }
        assert_close(
            &format!("{label}, {} size p50", series.group),
            series.total.payload_size.p50,
            exact_quantile(&total.sizes, 0.5),
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn usage_answers_exactly_for_known_events() {
    let db = test_database().await;
    let store = store(db.url()).await;
    let sql = client(db.url()).await;
    let (_, now) = server_tiers(db.url()).await;
    let m0 = floor_minute(now) - Duration::minutes(40);
    let (m1, m2) = (m0 + Duration::minutes(1), m0 + Duration::minutes(12));
    let ms = Duration::milliseconds;
    let a = new_session_with_id(&store, "shop", "u1", "session-a").await;
    let b = new_session_with_id(&store, "shop", "u2", "session-b").await;
    let noise = new_session(&store, "noise", "u1").await;
    let mut known = Vec::new();

    // First batch, rolled up on its own: the second batch's latencies then
    // come from the invocation tails and its minutes merge into these.
    let at = m0 + Duration::seconds(10);
    let first_batch = [
        (&a, spec("user", "user_message", "inv-a", at)),
        (
            &a,
            spec("planner", "model_response", "inv-a", at + ms(100))
                .metered(
                    json!({"prompt_token_count": 12, "candidates_token_count": 30, "total_token_count": 42, "cost": 0.0015}),
                    (12, 30, 42),
                    Some(15),
                )
                .after_ms(100.0),
        ),
        (&a, spec("planner", "tool_call", "inv-a", at + ms(400)).after_ms(300.0)),
    ];
    for (key, spec) in first_batch {
        append_known(&store, key, &mut known, spec).await;
    }
    // Another app's event in the same minute, by the same agent.
    let noise_spec = spec("planner", "model_response", "", m0 + Duration::seconds(20)).metered(
        json!({"total_token_count": 9, "cost": 100}),
        (0, 0, 9),
        Some(1_000_000),
    );
    append_known(&store, &noise, &mut Vec::new(), noise_spec).await;
    let first = run_rollup(db.url(), &RollupConfig::default()).await.expect("first run");
    assert_eq!(first.events_rolled_up, 4);

    let second_batch = [
        (&a, spec("lookup", "tool_result", "inv-a", m1 + Duration::seconds(5)).after_ms(54_600.0)),
        (
            &a,
            spec("planner", "error", "inv-a", m1 + Duration::seconds(6))
                .metered(json!({"prompt_token_count": 7, "total_token_count": 7, "cost": 0.0105}), (7, 0, 7), Some(105))
                .after_ms(1_000.0),
        ),
        (
            &b,
            spec("planner", "model_response", "", m0 + Duration::seconds(30)).metered(
                json!({"total_token_count": 1}),
                (0, 0, 1),
                None,
            ),
        ),
        (&b, spec("user", "user_message", "inv-b", m2)),
        // camelCase token counts, as Gemini's JSON writes them.
        (
            &b,
            spec("planner", "model_response", "inv-b", m2 + Duration::seconds(2))
                .metered(
                    json!({"promptTokenCount": 20, "candidatesTokenCount": 30, "totalTokenCount": 50, "cost": 0.25}),
                    (20, 30, 50),
                    Some(2_500),
                )
                .after_ms(2_000.0),
        ),
    ];
    for (key, spec) in second_batch {
        append_known(&store, key, &mut known, spec).await;
    }
    let second = run_rollup(db.url(), &RollupConfig::default()).await.expect("second run");
    assert_eq!(second.events_rolled_up, 5);

    let bytes: HashMap<String, i32> = sql
        .query("SELECT event_id, octet_length(payload::text) FROM adk_events WHERE app_name = 'shop'", &[])
        .await
        .expect("payload sizes")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(bytes.len(), known.len());

    let (since, until) = (m0 - Duration::minutes(30), m2 + Duration::minutes(30));
    let asks = [
        ("1m", None, Level::Minute),
        ("auto", None, Level::Minute),
        ("5m", Some(GroupBy::Kind), Level::Minute),
        ("1m", Some(GroupBy::Agent), Level::Minute),
        ("1h", Some(GroupBy::Agent), Level::Hour),
        ("1h", Some(GroupBy::Kind), Level::Hour),
        ("1d", None, Level::Day),
        ("1d", Some(GroupBy::Kind), Level::Day),
    ];
    for (resolution, by, level) in asks {
        let report = usage_at(db.url(), &query("shop", since, until, resolution, by)).await.expect("usage");
        assert_eq!(report.plan.level, level, "{resolution} {by:?}");
        assert_report(&report, &known, &bytes);
        assert!(report.to_string().contains("total"), "the report renders");
    }

    // The headline numbers, spelled out once.
    let report = usage_at(db.url(), &query("shop", since, until, "1m", None)).await.expect("usage");
    let all = &report.series[0].total;
    assert_eq!((all.events, all.errors, all.total_tokens, all.cost.as_deref()), (8, 1, 100, Some("0.262")));
    assert_eq!(report.series[0].points.iter().map(|p| p.figures.events).collect::<Vec<_>>(), vec![4, 2, 2]);
    let by_kind = usage_at(db.url(), &query("shop", since, until, "1h", Some(GroupBy::Kind))).await.expect("usage");
    let kinds: Vec<(&str, i64)> = by_kind.series.iter().map(|s| (s.group.as_str(), s.total.events)).collect();
    assert_eq!(
        kinds,
        vec![("model_response", 3), ("user_message", 2), ("error", 1), ("tool_call", 1), ("tool_result", 1)]
    );
}

async fn new_session_with_id(store: &dyn SessionStore, app: &str, user: &str, id: &str) -> SessionKey {
    let request = adk_postgres_domain::CreateSession::new(
        adk_postgres_domain::AppName::new(app).expect("app"),
        adk_postgres_domain::UserId::new(user).expect("user"),
    )
    .with_id(id);
    store.create(request).await.expect("create session").key
}

// ---------------------------------------------------------------------------
// Row-level security
// ---------------------------------------------------------------------------

async fn events_per_app(sql: &Client, table: &str) -> Vec<(String, i64)> {
    sql.query(&format!("SELECT app_name, sum(events)::bigint FROM {table} GROUP BY 1 ORDER BY 1"), &[])
        .await
        .unwrap_or_else(|e| panic!("read {table}: {e}"))
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_role_bound_to_an_app_reads_only_its_rollups() {
    let db = test_database().await;
    let store = store(db.url()).await;
    let owner = client(db.url()).await;
    // Late enough that the run creates a minute partition of its own.
    owner.batch_execute("UPDATE adk_store_policy SET usage_lateness = '3 days'").await.expect("policy");
    let two_days_ago = Utc::now() - Duration::days(2);
    for (app, n) in [("alpha", 3), ("beta", 5)] {
        let key = new_session(&store, app, "u1").await;
        for i in 0..n {
            let mut event = Event::new(if i % 2 == 0 { "user" } else { "agent" });
            if i == 0 {
                event.timestamp = two_days_ago;
            }
            store.append(&key, event, AppendOptions::default()).await.expect("append");
        }
    }
    run_rollup(db.url(), &RollupConfig::default()).await.expect("rollup");
    let old_partition = format!("adk_usage_1m_p{}", two_days_ago.format("%Y%m%d"));

    let (role, role_url) = pg::service_role(db.url(), "adk_usage_reader", AppBinding::Apps(vec!["alpha".into()])).await;
    let levels = ["adk_usage_1m", "adk_usage_1h", "adk_usage_1d", old_partition.as_str()];
    owner.batch_execute(&format!("GRANT SELECT ON {} TO \"{role}\"", levels.join(", "))).await.expect("grant reads");
    let reader = client(&role_url).await;

    for table in levels {
        let everything = events_per_app(&owner, table).await;
        let alpha_only: Vec<(String, i64)> = everything.iter().filter(|(app, _)| app == "alpha").cloned().collect();
        assert_eq!(
            everything.iter().map(|(app, _)| app.as_str()).collect::<Vec<_>>(),
            ["alpha", "beta"],
            "{table}: the owner sees all"
        );
        if table != old_partition {
            assert_eq!(alpha_only, vec![("alpha".to_owned(), 3)], "{table}");
        }
        assert!(events_per_app(&reader, table).await.is_empty(), "{table}: no tenant named, nothing visible");
        reader.batch_execute("BEGIN; SELECT set_config('adk.app_name', 'alpha', true)").await.expect("act for alpha");
        assert_eq!(events_per_app(&reader, table).await, alpha_only, "{table}: alpha's rows only");
        reader.batch_execute("ROLLBACK").await.expect("rollback");
        reader.batch_execute("SET adk.app_name = 'beta'").await.expect("name beta");
        assert!(events_per_app(&reader, table).await.is_empty(), "{table}: an app it is not bound to shows nothing");
        reader.batch_execute("RESET adk.app_name").await.expect("reset");
    }

    // Only the rollup job writes rollups.
    let forged = "INSERT INTO adk_usage_1m SELECT 'beta', 'forged', false, kind, bucket_start, events, payload_bytes,
                         payload_bytes_min, payload_bytes_max, prompt_tokens, candidates_tokens, total_tokens, cost,
                         cost_events, errors, latency_count, latency_sketch, size_sketch, sessions_sketch,
                         users_sketch, folded_authors
                  FROM adk_usage_1m LIMIT 1";
    reader.batch_execute("BEGIN; SELECT set_config('adk.app_name', 'alpha', true)").await.expect("act for alpha");
    let denied = reader.batch_execute(forged).await.expect_err("no INSERT privilege");
    assert_eq!(denied.code(), Some(&SqlState::INSUFFICIENT_PRIVILEGE), "{denied:?}");
    reader.batch_execute("ROLLBACK").await.expect("rollback");
    // Even after a broad grant, another app's row is refused.
    owner.batch_execute(&format!("GRANT INSERT ON adk_usage_1m TO \"{role}\"")).await.expect("grant inserts");
    reader.batch_execute("BEGIN; SELECT set_config('adk.app_name', 'alpha', true)").await.expect("act for alpha");
    let refused = reader.batch_execute(forged).await.expect_err("WITH CHECK refuses beta");
    let message = refused.as_db_error().map(|e| e.message().to_owned()).unwrap_or_default();
    assert!(message.contains("row-level security"), "{refused:?}");
    reader.batch_execute("ROLLBACK").await.expect("rollback");

    // Every partition, premade or made by the run, is guarded the same way.
    let unguarded: Vec<String> = owner
        .query(
            "SELECT c.relname::text FROM pg_class c
             JOIN pg_partition_tree('adk_usage_1m') t ON t.relid = c.oid
             UNION ALL SELECT c.relname::text FROM pg_class c JOIN pg_partition_tree('adk_usage_1h') t ON t.relid = c.oid
             UNION ALL SELECT c.relname::text FROM pg_class c JOIN pg_partition_tree('adk_usage_1d') t ON t.relid = c.oid
             EXCEPT
             SELECT c.relname::text FROM pg_class c JOIN pg_policy p ON p.polrelid = c.oid
             WHERE c.relrowsecurity AND c.relforcerowsecurity AND p.polname = 'adk_tenant_isolation'",
            &[],
        )
        .await
        .expect("guards")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(unguarded.is_empty(), "usage tables without row-level security: {unguarded:?}");
    let made_by_run: bool =
        owner.query_one("SELECT to_regclass($1) IS NOT NULL", &[&old_partition]).await.expect("partition").get(0);
    assert!(made_by_run, "{old_partition} exists");

    // The owner's `usage` sees alpha and beta each as a whole.
    let (_, now) = server_tiers(db.url()).await;
    for (app, events) in [("alpha", 3), ("beta", 5)] {
        let report = usage_at(db.url(), &query(app, now - Duration::days(3), now + Duration::minutes(1), "1d", None))
            .await
            .expect("the owner's usage");
        assert_eq!(report.series.iter().map(|s| s.total.events).sum::<i64>(), events, "{app}");
    }
    // Through `usage` itself, once the role may also read the tiers: the
    // same rows, and another app's question answered with nothing.
    owner
        .batch_execute(&format!(
            "GRANT SELECT ON adk_store_policy TO \"{role}\";
             GRANT EXECUTE ON FUNCTION adk_policy_seconds(interval) TO \"{role}\""
        ))
        .await
        .expect("grant the tiers");
    let mut role_conn = pg::diesel(&role_url).await;
    let window = |app: &str| query(app, now - Duration::days(3), now + Duration::minutes(1), "1d", None);
    let events = |report: &UsageReport| report.series.iter().map(|s| s.total.events).sum::<i64>();
    let unnamed = usage(&mut role_conn, &window("alpha")).await.expect("usage without a tenant");
    assert_eq!(events(&unnamed), 0, "no tenant named, nothing visible");
    diesel_async::SimpleAsyncConnection::batch_execute(&mut role_conn, "SET adk.app_name = 'alpha'")
        .await
        .expect("act for alpha");
    let own = usage(&mut role_conn, &window("alpha")).await.expect("alpha's usage");
    assert_eq!(events(&own), 3, "alpha's own usage, whole");
    let other = usage(&mut role_conn, &window("beta")).await.expect("beta's usage, asked by alpha");
    assert_eq!(events(&other), 0, "beta's rollups stay invisible");
}
