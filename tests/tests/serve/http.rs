//! `adk-pg serve` over HTTP against a real PostgreSQL: status codes and the
//! bearer token, a metrics scrape parsed as Prometheus text and checked
//! figure by figure against the database, readiness following the
//! partitions and the migrations, a locked table costing only its sections,
//! and every statement the server sends read-only and pruned to its window.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration as StdDuration, Instant};

use crate::fixture::{APPS, get, parse_metrics, realistic, sample, serve};
use adk_postgres_dashboard::{DashboardError, ServeConfig, Server};
use adk_postgres_retention::{HealthThresholds, health};
use adk_postgres_testing::{Statement, WireProxy, test_database};
use adk_postgres_tests::pg::client;
use chrono::{DateTime, Days, Duration, NaiveDate, Utc};
use serde_json::Value;
use tokio_postgres::Client;

const TOKEN: &str = "s3cret-Token-for-tests";

async fn scalar_f64(sql: &Client, query: &str) -> f64 {
    sql.query_one(query, &[]).await.unwrap_or_else(|e| panic!("{query}: {e}")).get::<_, f64>(0)
}

fn assert_close(name: &str, got: Option<f64>, want: f64, tolerance: f64) {
    let got = got.unwrap_or_else(|| panic!("{name} is missing from the scrape"));
    assert!((got - want).abs() <= tolerance, "{name}: scraped {got}, the database says {want} (±{tolerance})");
}

/// The `data-value`s of the bars of chart `id` on the page.
fn bar_values(page: &str, id: &str) -> Vec<f64> {
    let start = page.find(&format!("data-chart=\"{id}\"")).unwrap_or_else(|| panic!("no chart {id}"));
    let end = start + page[start..].find("</svg>").expect("the chart ends");
    page[start..end]
        .split("data-value=\"")
        .skip(1)
        .map(|rest| rest.split('"').next().unwrap_or_default().parse::<f64>().expect("a number"))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_and_the_page_match_the_database() {
    let db = test_database().await;
    let fixture = realistic(db.url(), true).await;
    let sql = client(db.url()).await;
    let server = serve(ServeConfig::new(db.url())).await;

    let answer = get(server.addr, "/metrics", None).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(answer.header("content-type"), "text/plain; version=0.0.4; charset=utf-8");
    let scrape = parse_metrics(&answer.body);
    let metric = |name: &str, labels: &[(&str, &str)]| sample(&scrape, name, labels);

    assert_eq!(metric("adk_pg_database_up", &[]), Some(1.0));
    for section in
        ["connect", "health", "partitions", "sessions", "state_sizes", "late_events", "rollup_runs", "migrations"]
    {
        assert_eq!(metric("adk_pg_scrape_error", &[("section", section)]), Some(0.0), "{section}: {}", answer.body);
    }
    assert_eq!(metric("adk_pg_scrape_errors_total", &[]), Some(0.0));
    assert_eq!(metric("adk_pg_migrations_pending", &[]), Some(0.0));

    // Sessions, counted here by their own definitions.
    let counts = sql
        .query_one(
            "SELECT count(*) FILTER (WHERE closed_at IS NULL AND (expires_at IS NULL OR expires_at > now()))::float8,
                    count(*) FILTER (WHERE expires_at <= now())::float8,
                    count(*) FILTER (WHERE closed_at IS NOT NULL AND (expires_at IS NULL OR expires_at > now()))::float8
             FROM adk_sessions",
            &[],
        )
        .await
        .expect("count sessions");
    let sessions: usize = APPS.iter().map(|(_, _, n)| n).sum();
    assert_eq!(counts.get::<_, f64>(1), fixture.expired as f64);
    assert_eq!(counts.get::<_, f64>(0), (sessions + 1 - fixture.expired - 1) as f64, "one closed, one successor");
    assert_eq!(metric("adk_pg_sessions", &[("state", "live")]), Some(counts.get(0)));
    assert_eq!(metric("adk_pg_sessions", &[("state", "expired")]), Some(counts.get(1)));
    assert_eq!(metric("adk_pg_sessions", &[("state", "closed")]), Some(counts.get(2)));

    // Partitions, from the catalog by name.
    let mut ahead = 0;
    let mut day = fixture.today;
    loop {
        day = day.succ_opt().expect("a next day");
        let name = format!("adk_events_p{}", day.format("%Y%m%d"));
        let exists: bool =
            sql.query_one("SELECT to_regclass($1) IS NOT NULL", &[&name]).await.expect("a partition").get(0);
        if !exists {
            break;
        }
        ahead += 1;
    }
    assert_eq!(ahead, 7, "the policy premakes a week");
    assert_eq!(metric("adk_pg_event_partitions_ahead", &[]), Some(f64::from(ahead)));
    assert_eq!(metric("adk_pg_pending_detaches", &[]), Some(0.0));
    let attached =
        scalar_f64(&sql, "SELECT count(*)::float8 FROM pg_inherits WHERE inhparent = 'adk_events'::regclass").await;
    assert_eq!(metric("adk_pg_event_partitions", &[]), Some(attached));
    let oldest_age = scalar_f64(
        &sql,
        "SELECT extract(epoch FROM now() - (min(substr(c.relname, 13)::date)::timestamp AT TIME ZONE 'UTC'))::float8
         FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'adk_events'::regclass",
    )
    .await;
    assert_close(
        "adk_pg_oldest_event_partition_age_seconds",
        metric("adk_pg_oldest_event_partition_age_seconds", &[]),
        oldest_age,
        60.0,
    );

    // Runs and lag.
    let maintenance_age = scalar_f64(
        &sql,
        "SELECT extract(epoch FROM now() - max(finished_at))::float8 FROM adk_maintenance_runs WHERE outcome = 'ok'",
    )
    .await;
    assert_close("maintenance age", metric("adk_pg_maintenance_last_success_age_seconds", &[]), maintenance_age, 30.0);
    let rollup_age = scalar_f64(
        &sql,
        "SELECT extract(epoch FROM now() - max(finished_at))::float8 FROM adk_usage_runs WHERE outcome = 'ok'",
    )
    .await;
    assert_close("rollup age", metric("adk_pg_rollup_last_success_age_seconds", &[]), rollup_age, 30.0);
    let lag = scalar_f64(&sql, "SELECT extract(epoch FROM now() - watermark)::float8 FROM adk_usage_state").await;
    assert_close("rollup lag", metric("adk_pg_rollup_lag_seconds", &[]), lag, 30.0);

    // The late event, per app and today.
    let late: i64 = sql
        .query_one(
            "SELECT rejected FROM adk_usage_late_events
             WHERE app_name = $1 AND arrival_day = (now() AT TIME ZONE 'UTC')::date",
            &[&APPS[0].0],
        )
        .await
        .expect("late events")
        .get(0);
    assert_eq!(late, fixture.late[APPS[0].0]);
    assert_eq!(metric("adk_pg_rollup_late_rejected_today", &[("app", APPS[0].0)]), Some(late as f64));
    assert_eq!(metric("adk_pg_rollup_late_rejected_today", &[("app", APPS[1].0)]), None, "no late events there");

    // Storage.
    let hot = scalar_f64(
        &sql,
        "SELECT (sum(n_tup_hot_upd)::float8 / nullif(sum(n_tup_upd), 0))::float8 FROM pg_stat_user_tables
         WHERE relid = 'adk_sessions'::regclass",
    )
    .await;
    assert_close("HOT ratio", metric("adk_pg_sessions_hot_update_ratio", &[]), hot, 0.05);
    for (scope, table) in [("session", "adk_sessions"), ("user", "adk_user_states"), ("app", "adk_app_states")] {
        let row = sql
            .query_one(
                &format!(
                    "SELECT percentile_disc(0.5) WITHIN GROUP (ORDER BY pg_column_size(state))::float8,
                            max(pg_column_size(state))::float8 FROM {table}"
                ),
                &[],
            )
            .await
            .expect("state sizes");
        assert_eq!(
            metric("adk_pg_state_size_bytes", &[("scope", scope), ("quantile", "0.5")]),
            Some(row.get(0)),
            "{scope}"
        );
        assert_eq!(
            metric("adk_pg_state_size_bytes", &[("scope", scope), ("quantile", "1")]),
            Some(row.get(1)),
            "{scope}"
        );
    }
    for level in ["1m", "1h", "1d"] {
        let row = sql
            .query_one(
                &format!(
                    "SELECT coalesce(sum(pg_total_relation_size(relid)), 0)::float8,
                            count(*) FILTER (WHERE isleaf AND level > 0)::float8
                     FROM pg_partition_tree('adk_usage_{level}')"
                ),
                &[],
            )
            .await
            .expect("tier sizes");
        // Autovacuum may add a visibility map between the two reads.
        assert_close(
            &format!("tier {level} bytes"),
            metric("adk_pg_rollup_tier_size_bytes", &[("level", level)]),
            row.get(0),
            64.0 * 1024.0,
        );
        assert_eq!(metric("adk_pg_rollup_tier_partitions", &[("level", level)]), Some(row.get(1)), "{level}");
    }

    // Alerts: what `adk-pg status` raises, by area.
    let report = health(db.url(), fixture.today, &HealthThresholds::default()).await.expect("health");
    let firing: f64 = scrape
        .samples
        .iter()
        .filter(|s| s.metric == "adk_pg_alerts_firing")
        .map(|s| match s.value {
            prometheus_parse::Value::Gauge(v) => v,
            _ => f64::NAN,
        })
        .sum();
    assert_eq!(firing, report.alerts.len() as f64, "{:?}", report.alerts);
    assert_eq!(report.alerts.len(), 1, "only the late event alerts: {:?}", report.alerts);
    assert_eq!(metric("adk_pg_alerts_firing", &[("area", "late_events"), ("severity", "warning")]), Some(1.0));
    assert_eq!(metric("adk_pg_alerts_firing", &[("area", "partitions"), ("severity", "critical")]), Some(0.0));
    for name in ["adk_pg_scrape_duration_seconds", "adk_pg_rollup_tier_size_bytes"] {
        assert!(scrape.docs.contains_key(name), "{name} has its HELP");
    }

    // The page: the busiest app, its events to the last one, the cards.
    let page = get(server.addr, "/", None).await;
    assert_eq!(page.status, 200);
    assert_eq!(page.header("content-type"), "text/html; charset=utf-8");
    assert!(page.header("content-security-policy").contains("default-src 'none'"));
    let body = &page.body;
    assert!(body.contains("data-area=\"late_events\" data-state=\"red\""), "the late event's card is red");
    for area in ["partitions", "maintenance", "retention", "rollups"] {
        assert!(body.contains(&format!("data-area=\"{area}\" data-state=\"green\"")), "{area} is green");
    }
    assert!(
        body.contains("<a class=\"chip on\" href=\"?window=24h&amp;res=auto&amp;app=support-desk\">"),
        "busiest first"
    );
    let events: f64 = bar_values(body, "events").iter().sum();
    assert_eq!(
        events, fixture.events[APPS[0].0] as f64,
        "every event of the app in the last 24 hours, and no late one"
    );
    for agent in APPS[0].1 {
        assert!(body.contains(&format!("<td>{agent}</td>")), "{agent} in the agent table");
    }
    let shop = get(server.addr, "/?window=7d&res=1h&app=shop-assistant", None).await;
    assert_eq!(shop.status, 200);
    let events: f64 = bar_values(&shop.body, "events").iter().sum();
    assert_eq!(events, fixture.events[APPS[1].0] as f64, "the other app, hourly");
    assert!(shop.body.contains("from the 1h rollups"), "a week of hours reads the hour level");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_token_guards_every_endpoint_but_healthz() {
    // Refused before anything is bound or read.
    let open =
        ServeConfig { listen: "0.0.0.0:0".parse().expect("addr"), ..ServeConfig::new("postgres://x@127.0.0.1:1/x") };
    let refused = Server::bind(open.clone()).await.expect_err("0.0.0.0 without a token");
    assert!(matches!(refused, DashboardError::TokenRequired { .. }), "{refused}");
    assert!(refused.to_string().contains("ADK_PG_SERVE_TOKEN"), "{refused}");
    assert!(Server::bind(ServeConfig { token: Some(TOKEN.into()), ..open }).await.is_ok(), "with a token it starts");

    let db = test_database().await;
    let server = serve(ServeConfig { token: Some(TOKEN.into()), ..ServeConfig::new(db.url()) }).await;
    assert_eq!(get(server.addr, "/healthz", None).await.status, 200, "liveness needs no secret");
    for path in ["/", "/metrics", "/readyz", "/nowhere"] {
        let without = get(server.addr, path, None).await;
        assert_eq!(without.status, 401, "{path} without the token");
        assert_eq!(without.header("www-authenticate"), "Bearer realm=\"adk-pg\"");
        assert!(!without.body.contains("adk_pg_"), "{path} leaks nothing");
        assert_eq!(get(server.addr, path, Some("s3cret-Token-for-test")).await.status, 401, "{path}: a near miss");
    }
    assert_eq!(get(server.addr, "/", Some(TOKEN)).await.status, 200);
    assert_eq!(get(server.addr, "/metrics", Some(TOKEN)).await.status, 200);
    assert_eq!(get(server.addr, "/readyz", Some(TOKEN)).await.status, 200);
    assert_eq!(get(server.addr, "/nowhere", Some(TOKEN)).await.status, 404);
    let bad = get(server.addr, "/?window=2y", Some(TOKEN)).await;
    assert_eq!(bad.status, 400);
    assert!(bad.body.contains("window &quot;2y&quot; is not one of 1h, 24h, 7d, 30d"), "{}", bad.body);
}

#[tokio::test(flavor = "multi_thread")]
async fn readiness_follows_partitions_migrations_and_the_database() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    let server = serve(ServeConfig::new(db.url())).await;
    let ready = get(server.addr, "/readyz", None).await;
    assert_eq!((ready.status, ready.body.as_str()), (200, "ready\n"));

    let today: NaiveDate = sql.query_one("SELECT (now() AT TIME ZONE 'UTC')::date", &[]).await.expect("today").get(0);
    let tomorrow = today.checked_add_days(Days::new(1)).expect("tomorrow");
    let name = format!("adk_events_p{}", tomorrow.format("%Y%m%d"));
    sql.batch_execute(&format!("DROP TABLE {name}")).await.expect("drop tomorrow");
    let missing = get(server.addr, "/readyz", None).await;
    assert_eq!(missing.status, 503, "{}", missing.body);
    assert!(
        missing.body.contains("only 0 future day(s) have an event partition (want at least 3)"),
        "{}",
        missing.body
    );
    // The page shows it, and being read-only, repairs nothing.
    let page = get(server.addr, "/", None).await;
    assert!(page.body.contains("data-area=\"partitions\" data-state=\"red\""));
    assert!(page.body.contains(&format!("data-day=\"{tomorrow}\" data-state=\"missing\"")));
    let still_missing: bool = sql.query_one("SELECT to_regclass($1) IS NULL", &[&name]).await.expect("look").get(0);
    assert!(still_missing, "the server made a partition");
    sql.query("SELECT adk_ensure_event_partition($1)", &[&tomorrow]).await.expect("make tomorrow");
    assert_eq!(get(server.addr, "/readyz", None).await.status, 200);

    let version: String = sql
        .query_one(
            "DELETE FROM __diesel_schema_migrations WHERE version = (SELECT max(version) FROM __diesel_schema_migrations)
             RETURNING version",
            &[],
        )
        .await
        .expect("forget the last migration")
        .get(0);
    let pending = get(server.addr, "/readyz", None).await;
    assert_eq!(pending.status, 503);
    assert!(
        pending.body.contains(&format!("1 migration(s) pending ({version}): run adk-pg migrate")),
        "{}",
        pending.body
    );
    let scrape = parse_metrics(&get(server.addr, "/metrics", None).await.body);
    assert_eq!(sample(&scrape, "adk_pg_migrations_pending", &[]), Some(1.0));
    sql.execute("INSERT INTO __diesel_schema_migrations (version) VALUES ($1)", &[&version]).await.expect("restore");
    assert_eq!(get(server.addr, "/readyz", None).await.status, 200);

    // Nothing listens on port 1.
    let gone = serve(ServeConfig {
        connect_timeout: StdDuration::from_secs(3),
        ..ServeConfig::new("postgres://postgres@127.0.0.1:1/none")
    })
    .await;
    let unready = get(gone.addr, "/readyz", None).await;
    assert_eq!(unready.status, 503);
    assert!(unready.body.contains("the database is unreachable"), "{}", unready.body);
    assert_eq!(get(gone.addr, "/healthz", None).await.status, 200, "the process is alive all the same");
    let down = get(gone.addr, "/metrics", None).await;
    assert_eq!(down.status, 200, "the scrape worked; the database did not");
    let scrape = parse_metrics(&down.body);
    assert_eq!(sample(&scrape, "adk_pg_database_up", &[]), Some(0.0));
    assert_eq!(sample(&scrape, "adk_pg_scrape_error", &[("section", "connect")]), Some(1.0));
    assert_eq!(sample(&scrape, "adk_pg_scrape_errors_total", &[]), Some(1.0));
    let page = get(gone.addr, "/", None).await;
    assert_eq!(page.status, 503);
    assert!(page.body.contains("The database could not be reached"), "{}", page.body);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_locked_table_costs_its_sections_not_the_page() {
    let db = test_database().await;
    realistic(db.url(), false).await;
    let config = ServeConfig { statement_timeout: StdDuration::from_millis(300), ..ServeConfig::new(db.url()) };
    let server = serve(config).await;
    // Health and the rollup run history both read adk_usage_runs; the
    // usage charts, sessions and maintenance history do not.
    let locker = client(db.url()).await;
    locker.batch_execute("BEGIN; LOCK TABLE adk_usage_runs IN ACCESS EXCLUSIVE MODE").await.expect("lock");

    let started = Instant::now();
    let page = get(server.addr, "/", None).await;
    let took = started.elapsed();
    assert_eq!(page.status, 200);
    assert!(took < StdDuration::from_secs(10), "the page took {took:?}");
    let body = &page.body;
    assert!(body.contains("read health timed out: read the latest rollup run: canceling statement"), "{body}");
    assert!(body.contains("read the rollup runs timed out"), "the rollup history says why");
    assert!(body.contains("data-area=\"partitions\" data-state=\"unknown\""), "no health, no verdict");
    assert!(body.contains("data-chart=\"events\""), "the usage charts are still drawn");
    assert!(
        body.contains("data-runs=\"maintenance\"><header><h3>Maintenance</h3></header><table"),
        "maintenance runs too"
    );

    let scrape = parse_metrics(&get(server.addr, "/metrics", None).await.body);
    assert_eq!(sample(&scrape, "adk_pg_scrape_error", &[("section", "health")]), Some(1.0));
    assert_eq!(sample(&scrape, "adk_pg_scrape_error", &[("section", "rollup_runs")]), Some(1.0));
    assert_eq!(sample(&scrape, "adk_pg_scrape_error", &[("section", "sessions")]), Some(0.0));
    assert_eq!(sample(&scrape, "adk_pg_database_up", &[]), Some(1.0));
    assert_eq!(sample(&scrape, "adk_pg_alerts_firing", &[("area", "partitions"), ("severity", "warning")]), None);
    assert!(sample(&scrape, "adk_pg_sessions", &[("state", "live")]).is_some_and(|v| v > 0.0));
    assert_eq!(sample(&scrape, "adk_pg_scrape_errors_total", &[]), Some(1.0));
    assert_eq!(get(server.addr, "/readyz", None).await.status, 200, "readiness does not read the locked table");

    locker.batch_execute("ROLLBACK").await.expect("unlock");
    let page = get(server.addr, "/", None).await;
    assert!(!page.body.contains("timed out"), "every section back");
    let scrape = parse_metrics(&get(server.addr, "/metrics", None).await.body);
    assert_eq!(sample(&scrape, "adk_pg_scrape_error", &[("section", "health")]), Some(0.0));
    assert_eq!(sample(&scrape, "adk_pg_scrape_errors_total", &[]), Some(1.0), "a counter keeps its count");
}

// ---------------------------------------------------------------------------
// Every statement read-only and bounded
// ---------------------------------------------------------------------------

/// Every relation a plan scans.
fn scanned(plan: &Value, relations: &mut BTreeSet<String>) {
    if let Some(name) = plan.get("Relation Name").and_then(Value::as_str) {
        relations.insert(name.to_owned());
    }
    for child in plan.get("Plans").and_then(Value::as_array).into_iter().flatten() {
        scanned(child, relations);
    }
}

/// Each bound value as an SQL literal with its type's name, to run the
/// statement again under EXPLAIN; and the time values among them.
fn bound_literals(statement: &Statement) -> (Vec<(String, String)>, Vec<DateTime<Utc>>) {
    let epoch = NaiveDate::from_ymd_opt(2000, 1, 1).expect("2000-01-01");
    let quote = |text: &str| format!("'{}'", text.replace('\'', "''"));
    let mut literals = Vec::new();
    let mut times = Vec::new();
    for (index, value) in statement.values.iter().enumerate() {
        let oid = statement.types.get(index).copied().unwrap_or(0);
        let type_name = match oid {
            16 => "boolean",
            20 => "bigint",
            23 => "integer",
            25 => "text",
            1043 => "varchar",
            1082 => "date",
            1114 => "timestamp",
            1184 => "timestamptz",
            other => panic!("a bound value of type oid {other} in {}", statement.sql),
        };
        let Some(bytes) = value else {
            literals.push((type_name.to_owned(), "NULL".to_owned()));
            continue;
        };
        let literal = if statement.format_of(index) == 0 {
            quote(&String::from_utf8_lossy(bytes))
        } else {
            match oid {
                16 => (bytes[0] != 0).to_string(),
                20 => i64::from_be_bytes(bytes[..8].try_into().expect("8 bytes")).to_string(),
                23 => i32::from_be_bytes(bytes[..4].try_into().expect("4 bytes")).to_string(),
                25 | 1043 => quote(&String::from_utf8_lossy(bytes)),
                1082 => {
                    let days = i32::from_be_bytes(bytes[..4].try_into().expect("4 bytes"));
                    let day = epoch + Duration::days(i64::from(days));
                    times.push(day.and_hms_opt(0, 0, 0).expect("midnight").and_utc());
                    quote(&day.to_string())
                }
                _ => {
                    let micros = i64::from_be_bytes(bytes[..8].try_into().expect("8 bytes"));
                    let moment =
                        epoch.and_hms_opt(0, 0, 0).expect("midnight").and_utc() + Duration::microseconds(micros);
                    times.push(moment);
                    quote(&moment.to_rfc3339())
                }
            }
        };
        literals.push((type_name.to_owned(), literal));
    }
    (literals, times)
}

async fn explain(sql: &Client, statement: &Statement, mode: &str) -> BTreeSet<String> {
    let (literals, _) = bound_literals(statement);
    sql.batch_execute(&format!("DEALLOCATE ALL; SET plan_cache_mode = {mode}")).await.expect("plan mode");
    let explained = if literals.is_empty() {
        format!("EXPLAIN (FORMAT JSON) {}", statement.sql)
    } else {
        let types: Vec<&str> = literals.iter().map(|(t, _)| t.as_str()).collect();
        let values: Vec<&str> = literals.iter().map(|(_, v)| v.as_str()).collect();
        sql.batch_execute(&format!("PREPARE recorded({}) AS {}", types.join(", "), statement.sql))
            .await
            .unwrap_or_else(|e| panic!("prepare {}: {e}", statement.sql));
        format!("EXPLAIN (FORMAT JSON) EXECUTE recorded({})", values.join(", "))
    };
    let row = sql.query_one(&explained, &[]).await.unwrap_or_else(|e| panic!("{explained}: {e}"));
    let document: Value = row
        .try_get::<_, Value>(0)
        .or_else(|_| serde_json::from_str(row.get::<_, &str>(0)))
        .expect("EXPLAIN output is JSON");
    let mut relations = BTreeSet::new();
    for entry in document.as_array().expect("plans") {
        scanned(&entry["Plan"], &mut relations);
    }
    relations
}

/// `[from, to)` of a range partition over a date or timestamptz column,
/// read from its bound as printed under UTC and ISO dates.
fn bound_range(bound: &str) -> (DateTime<Utc>, DateTime<Utc>) {
    let parse = |text: &str| -> DateTime<Utc> {
        let text = text.trim_matches('\'');
        NaiveDate::parse_from_str(text, "%Y-%m-%d")
            .map(|day| day.and_hms_opt(0, 0, 0).expect("midnight").and_utc())
            .or_else(|_| DateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S%#z").map(|t| t.with_timezone(&Utc)))
            .unwrap_or_else(|e| panic!("a partition bound {text:?}: {e}"))
    };
    let rest = bound.strip_prefix("FOR VALUES FROM (").unwrap_or_else(|| panic!("a range bound: {bound}"));
    let (from, rest) = rest.split_once(") TO (").expect("TO");
    (parse(from), parse(rest.trim_end_matches(')')))
}

#[tokio::test(flavor = "multi_thread")]
async fn the_server_only_reads_and_every_read_is_bounded() {
    let db = test_database().await;
    realistic(db.url(), true).await;
    let sql = client(db.url()).await;
    sql.batch_execute("SET TimeZone = 'UTC'; SET DateStyle = ISO").await.expect("settings");
    let relations_before = scalar_f64(&sql, "SELECT count(*)::float8 FROM pg_class").await;

    // The recorder refuses TLS itself, to read the statements (the test
    // servers offer TLS, and `prefer` would take it).
    let recorder = WireProxy::in_front_of(db.url())
        .expect("the server")
        .refuse_encryption()
        .record_statements()
        .start()
        .expect("the recorder");
    let server = serve(ServeConfig::new(recorder.url(db.url()).expect("the URL through the recorder"))).await;
    let paths = [
        "/",
        "/?window=1h&res=1m",
        "/?window=7d&res=1h",
        "/?window=30d&res=1d&app=shop-assistant",
        "/metrics",
        "/readyz",
    ];
    for path in paths {
        assert_eq!(get(server.addr, path, None).await.status, 200, "{path}");
    }
    let statements = recorder.take_statements();
    assert!(statements.len() > 20, "the recorder saw the server's statements: {}", statements.len());

    // Read-only: the session says so, and no statement even tries to write.
    assert!(
        statements.iter().any(|s| s.sql.contains("SET default_transaction_read_only = on")),
        "every connection is read-only"
    );
    assert!(statements.iter().any(|s| s.sql.contains("SET statement_timeout")), "and has a timeout");
    let writes =
        ["INSERT", "UPDATE", "DELETE", "MERGE", "CREATE", "ALTER", "DROP", "TRUNCATE", "GRANT", "VACUUM", "ANALYZE"];
    for statement in &statements {
        for word in statement.sql.split(|c: char| !c.is_ascii_alphanumeric() && c != '_') {
            assert!(!writes.contains(&word.to_ascii_uppercase().as_str()), "{word} in {}", statement.sql);
        }
        for function in ["adk_premake", "adk_ensure", "adk_retire", "adk_append", "adk_create"] {
            assert!(!statement.sql.contains(function), "{function} in {}", statement.sql);
        }
    }

    // Bounded: every partition a statement scans meets the time values it
    // bound, and some partitions are left out.
    let partitions: BTreeMap<String, (String, String)> = sql
        .query(
            "SELECT c.relname::text, i.inhparent::regclass::text, pg_get_expr(c.relpartbound, c.oid)
             FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
             WHERE i.inhparent IN ('adk_events'::regclass, 'adk_usage_1m'::regclass, 'adk_usage_1h'::regclass,
                                   'adk_usage_1d'::regclass)",
            &[],
        )
        .await
        .expect("partitions")
        .iter()
        .map(|row| (row.get::<_, String>(0), (row.get::<_, String>(1), row.get::<_, String>(2))))
        .collect();
    let mut parents_read = BTreeSet::new();
    let mut explained = BTreeSet::new();
    for statement in &statements {
        let head = statement.sql.trim_start().to_ascii_uppercase();
        let (literals, times) = bound_literals(statement);
        if !(head.starts_with("SELECT") || head.starts_with("WITH"))
            || !explained.insert(format!("{}|{literals:?}", statement.sql))
        {
            continue;
        }
        for mode in ["force_custom_plan", "force_generic_plan"] {
            let relations = explain(&sql, statement, mode).await;
            for relation in &relations {
                let Some((parent, bound)) = partitions.get(relation) else { continue };
                parents_read.insert(parent.clone());
                assert!(!times.is_empty(), "{relation} is read with no time bound: {}", statement.sql);
                let (from, to) = bound_range(bound);
                let (low, high) = (times.iter().min().expect("a time"), times.iter().max().expect("a time"));
                assert!(
                    from <= *high && to > *low,
                    "{mode}: {relation} [{from}, {to}) is outside [{low}, {high}]: {}",
                    statement.sql
                );
            }
            let total: BTreeMap<&String, usize> = partitions.values().fold(BTreeMap::new(), |mut acc, (parent, _)| {
                *acc.entry(parent).or_default() += 1;
                acc
            });
            for (parent, count) in total {
                let read = relations.iter().filter(|r| partitions.get(*r).is_some_and(|(p, _)| p == parent)).count();
                assert!(read == 0 || read < count, "{mode}: all {count} partitions of {parent}: {}", statement.sql);
            }
        }
    }
    sql.batch_execute("DEALLOCATE ALL; RESET plan_cache_mode").await.expect("reset");
    assert_eq!(
        parents_read,
        ["adk_usage_1d", "adk_usage_1h", "adk_usage_1m"].into_iter().map(str::to_owned).collect(),
        "the usage levels were read (and checked); the event log never was"
    );
    let relations_after = scalar_f64(&sql, "SELECT count(*)::float8 FROM pg_class").await;
    assert_eq!(relations_before, relations_after, "no relation was made or dropped");
    drop(server);
}

/// The archive's figures on `/metrics` and its card, against the catalog:
/// bytes and objects recorded, a day kept because its archive failed
/// (pending, an alert in the archive area, a red card), and the age of the
/// newest archived object.
#[tokio::test(flavor = "multi_thread")]
async fn the_archive_card_and_metrics_follow_the_catalog_and_its_failures() {
    let db = test_database().await;
    let sql = client(db.url()).await;
    sql.batch_execute(
        "UPDATE adk_store_policy SET archive_url = 'file:///var/lib/adk-archive';
         INSERT INTO adk_archive_objects (app_name, day, kind, part, object_key, destination, rows, bytes, sha256,
                                          format_version, day_events, verified_at)
         VALUES ('shop', '2026-10-01', 'events', 0, 'app=shop/day=2026-10-01/events-0000.parquet',
                 'file:///var/lib/adk-archive', 120, 40000, sha256('a'), 1, 120, now() - interval '2 hours'),
                ('shop', '2026-10-01', 'media', 0, 'app=shop/day=2026-10-01/media-0000.parquet',
                 'file:///var/lib/adk-archive', 3, 9000, sha256('b'), 1, 120, now() - interval '2 hours');
         INSERT INTO adk_archive_failures (app_name, day, error, resolved_at)
         VALUES ('shop', '2026-10-02', 'object …: the archive''s storage is full', NULL),
                ('shop', '2026-09-30', 'connection refused', now());",
    )
    .await
    .expect("an archive with one pending day");
    let server = serve(ServeConfig::new(db.url())).await;
    let answer = get(server.addr, "/metrics", None).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let scrape = parse_metrics(&answer.body);
    let metric = |name: &str, labels: &[(&str, &str)]| sample(&scrape, name, labels);
    assert_eq!(metric("adk_pg_archive_bytes", &[]), Some(49_000.0));
    assert_eq!(metric("adk_pg_archive_objects", &[]), Some(2.0));
    assert_eq!(metric("adk_pg_archive_days_pending", &[]), Some(1.0), "the resolved failure is not pending");
    assert_eq!(metric("adk_pg_archive_failures", &[]), Some(2.0));
    assert_close("archive age", metric("adk_pg_archive_last_success_age_seconds", &[]), 7_200.0, 60.0);
    assert_eq!(metric("adk_pg_alerts_firing", &[("area", "archive"), ("severity", "warning")]), Some(1.0));

    let page = get(server.addr, "/", None).await;
    assert_eq!(page.status, 200);
    let start = page.body.find("<article class=\"card red\" data-area=\"archive\"").expect("a red archive card");
    let card = &page.body[start..];
    let card = &card[..card.find("</article>").expect("the card ends")];
    assert!(card.contains("1 day archived") && card.contains("storage is full"), "{card}");
}
