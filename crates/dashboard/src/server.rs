//! The HTTP side: routes, the bearer-token gate, response headers, and the
//! listener.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use adk_postgres_retention::partitions::{days_ahead, list_partitions};
use axum::Router;
use axum::extract::{Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::config::{ServeConfig, database_label};
use crate::db::{self, DbSettings, migration_status};
use crate::error::{DashboardError, SectionError};
use crate::gather::{self, History, OpsSnapshot, UsageView};
use crate::metrics::{CONTENT_TYPE, render_metrics};
use crate::page::{self, PageModel};
use crate::view::DashboardQuery;

/// The page may use its own inline styles and data: icons, and nothing
/// else: no script, no fetch, no frame, no other origin.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'self'; \
     frame-ancestors 'none'";

struct Shared {
    config: ServeConfig,
    db: DbSettings,
    /// Requests reading the database at once.
    gate: Semaphore,
    /// Scrapes in which some section failed, for the counter.
    scrapes_failed: AtomicU64,
    database: String,
}

type AppState = Arc<Shared>;

/// The routes, for a caller that serves them itself. Refuses a
/// configuration `ServeConfig::validate` refuses.
pub fn router(config: ServeConfig) -> Result<Router, DashboardError> {
    config.validate()?;
    let state: AppState = Arc::new(Shared {
        db: DbSettings {
            url: config.database_url.clone(),
            statement_timeout: config.statement_timeout,
            connect_timeout: config.connect_timeout,
        },
        gate: Semaphore::new(config.max_concurrent_reads),
        scrapes_failed: AtomicU64::new(0),
        database: database_label(&config.database_url),
        config,
    });
    let guarded = Router::new()
        .route("/", get(dashboard))
        .route("/metrics", get(metrics))
        .route("/readyz", get(readyz))
        .fallback(not_found)
        // `layer`, not `route_layer`: unknown paths want the token too, so
        // a prober learns nothing without it.
        .layer(middleware::from_fn_with_state(state.clone(), require_token))
        .with_state(state);
    // Liveness says only that the process answers: no token, no database,
    // so an orchestrator can probe it without a secret.
    Ok(Router::new().route("/healthz", get(|| async { "ok\n" })).merge(guarded))
}

/// A bound server, not yet serving.
#[derive(Debug)]
pub struct Server {
    listener: TcpListener,
    router: Router,
}

impl Server {
    /// Checks the configuration and binds its address (port 0 picks a
    /// free one; see [`Server::local_addr`]).
    pub async fn bind(config: ServeConfig) -> Result<Self, DashboardError> {
        let listen = config.listen;
        let router = router(config)?;
        let listener = TcpListener::bind(listen).await.map_err(|source| DashboardError::Bind { listen, source })?;
        Ok(Self { listener, router })
    }

    /// The address bound: the port chosen when the config asked for 0.
    pub fn local_addr(&self) -> Result<SocketAddr, DashboardError> {
        self.listener.local_addr().map_err(DashboardError::Serve)
    }

    /// Serves until `shutdown` completes, then finishes the requests in
    /// flight.
    pub async fn serve(self, shutdown: impl Future<Output = ()> + Send + 'static) -> Result<(), DashboardError> {
        axum::serve(self.listener, self.router).with_graceful_shutdown(shutdown).await.map_err(DashboardError::Serve)
    }
}

/// Whether `headers` carry `Authorization: Bearer <token>`.
fn bearer_matches(headers: &HeaderMap, token: &str) -> bool {
    let Some(value) = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) else { return false };
    let Some((scheme, given)) = value.split_once(' ') else { return false };
    scheme.eq_ignore_ascii_case("bearer") && constant_time_eq(given.trim().as_bytes(), token.as_bytes())
}

/// Compares without stopping at the first difference, so the time taken
/// does not say how much of a guess was right.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
}

async fn require_token(State(state): State<AppState>, request: Request, next: Next) -> Response {
    match &state.config.token {
        Some(token) if !bearer_matches(request.headers(), token) => {
            let mut response =
                (StatusCode::UNAUTHORIZED, "a bearer token is required: send Authorization: Bearer <token>\n")
                    .into_response();
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer realm=\"adk-pg\""));
            response
        }
        _ => next.run(request).await,
    }
}

fn html(status: StatusCode, body: String) -> Response {
    let mut response = (status, body).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8"));
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CONTENT_SECURITY_POLICY));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

fn text(status: StatusCode, body: String) -> Response {
    let mut response = (status, body).into_response();
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

async fn not_found() -> Response {
    text(StatusCode::NOT_FOUND, "not found: the dashboard is at /, metrics at /metrics\n".into())
}

fn busy() -> Response {
    text(StatusCode::SERVICE_UNAVAILABLE, "the server is shutting down\n".into())
}

async fn dashboard(State(state): State<AppState>, Query(params): Query<HashMap<String, String>>) -> Response {
    let query = match DashboardQuery::from_params(&params) {
        Ok(query) => query,
        Err(reason) => {
            return html(StatusCode::BAD_REQUEST, page::message_page("Not a question the dashboard asks", &reason));
        }
    };
    let Ok(_permit) = state.gate.acquire().await else { return busy() };
    let started = Instant::now();
    let thresholds = &state.config.thresholds;
    let (ops, history, usage) = match db::connect(&state.db).await {
        Ok(mut conn) => {
            let ops = gather::ops(&mut conn, thresholds).await;
            match &ops.unreachable {
                Some(error) => {
                    let (history, usage) = failed_views(error, &ops, &query);
                    (ops, history, usage)
                }
                None => {
                    let history = gather::history(&mut conn).await;
                    let usage = gather::usage_view(&mut conn, &query, ops.now).await;
                    (ops, history, usage)
                }
            }
        }
        Err(error) => {
            let ops = OpsSnapshot::unreachable(error.clone(), thresholds);
            let (history, usage) = failed_views(&error, &ops, &query);
            (ops, history, usage)
        }
    };
    let body = page::render(&PageModel {
        ops: &ops,
        history: &history,
        usage: &usage,
        query: &query,
        database: &state.database,
        elapsed: started.elapsed(),
    });
    // The page is still worth showing when the database is down (it says
    // so), but a monitor fetching it should see the failure.
    let status = if ops.unreachable.is_some() { StatusCode::SERVICE_UNAVAILABLE } else { StatusCode::OK };
    html(status, body)
}

fn failed_views(error: &SectionError, ops: &OpsSnapshot, query: &DashboardQuery) -> (History, UsageView) {
    let history = History { maintenance: Err(error.clone()), rollups: Err(error.clone()) };
    let usage = UsageView {
        since: ops.now - query.window.span(),
        until: ops.now,
        apps: Err(error.clone()),
        app: query.app.clone(),
        overall: None,
        by_agent: None,
    };
    (history, usage)
}

async fn metrics(State(state): State<AppState>) -> Response {
    let Ok(_permit) = state.gate.acquire().await else { return busy() };
    let started = Instant::now();
    let thresholds = &state.config.thresholds;
    let ops = match db::connect(&state.db).await {
        Ok(mut conn) => gather::ops(&mut conn, thresholds).await,
        Err(error) => OpsSnapshot::unreachable(error, thresholds),
    };
    let failed_before = state.scrapes_failed.load(Ordering::Relaxed);
    let failed = if ops.section_errors().is_empty() {
        failed_before
    } else {
        state.scrapes_failed.fetch_add(1, Ordering::Relaxed) + 1
    };
    for (section, error) in ops.section_errors() {
        tracing::warn!(section, error = %error.describe(), "metrics scrape could not read a section");
    }
    let body = render_metrics(&ops, failed, started.elapsed().as_secs_f64());
    // 200 even when the database is down: the scrape itself worked, and
    // `adk_pg_database_up 0` is how Prometheus learns the rest.
    let mut response = text(StatusCode::OK, body);
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
    response
}

/// Ready when the database answers, has every migration this binary
/// knows, and has today's partition and at least the alert threshold of
/// days ahead: what an append needs to succeed now and after midnight.
async fn readyz(State(state): State<AppState>) -> Response {
    let Ok(_permit) = state.gate.acquire().await else { return busy() };
    let mut reasons = Vec::new();
    match db::connect(&state.db).await {
        Err(error) => reasons.push(format!("the database is unreachable: {}", error.describe())),
        Ok(mut conn) => {
            match migration_status(&mut conn).await {
                Ok(status) if !status.pending.is_empty() => reasons.push(format!(
                    "{} migration(s) pending ({}): run adk-pg migrate",
                    status.pending.len(),
                    status.pending.join(", ")
                )),
                Ok(_) => {}
                Err(error) => reasons.push(error.describe()),
            }
            match gather::clock(&mut conn).await {
                Err(error) => reasons.push(error.describe()),
                Ok(now) => {
                    let today = now.date_naive();
                    match list_partitions(&mut conn).await {
                        Err(error) => reasons.push(SectionError::new("list the event partitions", &error).describe()),
                        Ok(partitions) => {
                            let live: Vec<_> = partitions.into_iter().filter(|p| !p.detach_pending).collect();
                            if !live.iter().any(|p| p.holds(today)) {
                                reasons.push(format!("no event partition for today ({today}): run adk-pg maintain"));
                            }
                            let ahead = days_ahead(&live, today);
                            let want = state.config.thresholds.min_partitions_ahead;
                            if ahead < want {
                                reasons.push(format!(
                                    "only {ahead} future day(s) have an event partition (want at least {want}): \
                                     run adk-pg maintain"
                                ));
                            }
                        }
                    }
                }
            }
        }
    }
    if reasons.is_empty() {
        text(StatusCode::OK, "ready\n".into())
    } else {
        let body: String = reasons.iter().map(|reason| format!("- {reason}\n")).collect();
        text(StatusCode::SERVICE_UNAVAILABLE, format!("not ready:\n{body}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if let Ok(value) = HeaderValue::from_str(value) {
            headers.insert(header::AUTHORIZATION, value);
        }
        headers
    }

    #[test]
    fn only_the_exact_bearer_token_passes() {
        assert!(bearer_matches(&headers("Bearer s3cret"), "s3cret"));
        assert!(bearer_matches(&headers("bearer s3cret"), "s3cret"), "the scheme is case-insensitive");
        for wrong in ["Bearer s3cre", "Bearer s3cret2", "Basic s3cret", "s3cret", "Bearer", ""] {
            assert!(!bearer_matches(&headers(wrong), "s3cret"), "{wrong:?}");
        }
        assert!(!bearer_matches(&HeaderMap::new(), "s3cret"));
    }
}
