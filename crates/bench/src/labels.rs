//! Listing by label: the first page of one user's sessions through
//! `PgSessionStore::list`, with a label filter and without, when that user
//! has 100k sessions (the case the label index exists for: a user with few
//! sessions is narrowed by the primary key whatever the filter).
//!
//! A database of its own is seeded as the owner with `INSERT … SELECT`
//! (untimed): four sessions in five carry a `project` label (one of 1000,
//! so a project is on about 80 sessions) and a `team` label (one of 10, on
//! about 8,000); the rest carry none. Then `VACUUM ANALYZE`, as autovacuum
//! would. The three listings run one call at a time, interleaved call by
//! call so a slow spell shows in all of them, each filtered call with the
//! next project or team in turn; every page is checked against the labels
//! it asked for.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use adk_postgres_domain::{AppName, ListSessions, SessionStore, UserId};
use adk_postgres_storage::{PgSessionStore, PoolConfig};
use anyhow::ensure;
use serde::Serialize;
use tokio_postgres::Client;

use crate::measure::{Latency, Sample};
use crate::server::connect;
use crate::workload::APP;

/// The user whose sessions are listed.
const USER: &str = "labelled-user";
/// Distinct values of the rare and the common label.
const PROJECTS: i64 = 1_000;
const TEAMS: i64 = 10;
/// Calls of each listing before the measured ones (the connection, the server's caches).
const WARMUP: usize = 20;

/// One listing's figures.
#[derive(Debug, Clone, Serialize)]
pub struct ListingFigure {
    /// Sessions carrying the filter's label, on average over the values
    /// listed (all the user's sessions for the unfiltered listing).
    pub matching: f64,
    pub latency: Latency,
}

#[derive(Debug, Clone, Serialize)]
pub struct LabelListReport {
    /// The user's sessions, and how many carry labels.
    pub sessions: i64,
    pub labelled: i64,
    pub page_size: usize,
    /// Seconds the untimed seeding took (insert, then VACUUM ANALYZE).
    pub seed_secs: f64,
    /// `project = p…`: a label on about a thousandth of the sessions.
    pub rare: ListingFigure,
    /// `team = t…`: a label on about a tenth.
    pub common: ListingFigure,
    /// No filter: the same first page of all of the user's sessions.
    pub unfiltered: ListingFigure,
}

impl std::fmt::Display for LabelListReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let line = |f: &mut std::fmt::Formatter<'_>, what: &str, figure: &ListingFigure| {
            writeln!(
                f,
                "  {what:<28} {:>8.0} matching  p50 {:>7.2} ms  p95 {:>7.2} ms  p99 {:>7.2} ms  ({} calls)",
                figure.matching,
                figure.latency.p50_ms,
                figure.latency.p95_ms,
                figure.latency.p99_ms,
                figure.latency.ops
            )
        };
        writeln!(
            f,
            "list by label: first page of {} of one user's {} sessions ({} labelled), through the store",
            self.page_size, self.sessions, self.labelled
        )?;
        line(f, "label on ~0.1% (project)", &self.rare)?;
        line(f, "label on ~10% (team)", &self.common)?;
        line(f, "no filter", &self.unfiltered)
    }
}

async fn seed(sql: &Client, sessions: i64) -> anyhow::Result<()> {
    sql.execute(
        "INSERT INTO adk_sessions (app_name, user_id, session_id, last_seq, state, created_at, updated_at, labels)
         SELECT $1, $2, 'labelled-' || i, 12, '{\"channel\": \"web\", \"turn\": 12}',
                now() - i * interval '1 second', now() - i * interval '1 second',
                CASE WHEN i % 5 = 0 THEN '{}'::jsonb
                     ELSE jsonb_build_object('project', 'p' || (i / 5) % $4::bigint,
                                             'team', 't' || (i / 5000) % $5::bigint) END
           FROM generate_series(1, $3::bigint) i",
        &[&APP, &USER, &sessions, &PROJECTS, &TEAMS],
    )
    .await?;
    sql.batch_execute("VACUUM ANALYZE adk_sessions").await?;
    Ok(())
}

/// The user's sessions carrying `key = value`.
async fn matching(sql: &Client, key: &str, value: &str) -> anyhow::Result<i64> {
    let filter = serde_json::json!({ key: value });
    Ok(sql
        .query_one(
            "SELECT count(*) FROM adk_sessions WHERE app_name = $1 AND user_id = $2 AND labels @> $3",
            &[&APP, &USER, &filter],
        )
        .await?
        .get(0))
}

/// What one listing measured so far.
#[derive(Default)]
struct Tally {
    sample: Sample,
    elapsed: Duration,
    calls: u64,
    matching: Vec<i64>,
}

impl Tally {
    fn figure(mut self) -> ListingFigure {
        self.sample.end_round(self.calls, self.elapsed);
        let matching = self.matching.iter().sum::<i64>() as f64 / self.matching.len().max(1) as f64;
        ListingFigure { matching, latency: self.sample.summary() }
    }
}

/// Lists the first page with `filter` (none when empty), checks it and,
/// when `tally` is given, records the call.
async fn list_once(
    store: &PgSessionStore,
    base: &ListSessions,
    filter: Option<(&str, String)>,
    expected: usize,
    tally: Option<&mut Tally>,
) -> anyhow::Result<()> {
    let mut request = base.clone();
    request.labels = filter.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect::<BTreeMap<_, _>>();
    let began = Instant::now();
    let page = store.list(&request).await?;
    let took = began.elapsed();
    ensure!(page.sessions.len() == expected, "a page of {} sessions, expected {expected}", page.sessions.len());
    ensure!(
        page.sessions.iter().all(|s| adk_postgres_domain::metadata::labels_match(&s.metadata.labels, &request.labels)),
        "a listed session lacks a label of {:?}",
        request.labels
    );
    if let Some(tally) = tally {
        tally.sample.record(took);
        tally.elapsed += took;
        tally.calls += 1;
    }
    Ok(())
}

/// Seeds one user with `sessions` sessions in `url` (a freshly migrated
/// database), then lists the first page `calls` times each with a rare
/// label, a common label and no filter, through a store connected as the
/// owner.
pub async fn measure_label_list(url: &str, sessions: usize, calls: usize) -> anyhow::Result<LabelListReport> {
    let sql = connect(url).await?;
    let sessions = i64::try_from(sessions)?;
    let began = Instant::now();
    seed(&sql, sessions).await?;
    let seed_secs = began.elapsed().as_secs_f64();
    let labelled: i64 = sql
        .query_one(
            "SELECT count(*) FROM adk_sessions WHERE app_name = $1 AND user_id = $2 AND labels <> '{}'",
            &[&APP, &USER],
        )
        .await?
        .get(0);

    let store =
        PgSessionStore::connect(url, &PoolConfig { max_size: 2, ..PoolConfig::default() }, Default::default()).await?;
    let base = ListSessions::new(AppName::new(APP)?, UserId::new(USER)?);
    let page_size = base.effective_page_size();
    // The values listed in turn, with how many sessions carry each.
    let mut projects = Vec::new();
    for p in 0..PROJECTS.min(i64::try_from(calls + WARMUP)?) {
        let value = format!("p{p}");
        projects.push((matching(&sql, "project", &value).await?, value));
    }
    let mut teams = Vec::new();
    for t in 0..TEAMS {
        let value = format!("t{t}");
        teams.push((matching(&sql, "team", &value).await?, value));
    }
    let all = usize::try_from(sessions)?;

    let (mut rare, mut common, mut unfiltered) = (Tally::default(), Tally::default(), Tally::default());
    for call in 0..WARMUP + calls {
        let measured = call >= WARMUP;
        let (count, project) = &projects[call % projects.len()];
        let expected = usize::try_from(*count)?.min(page_size);
        list_once(&store, &base, Some(("project", project.clone())), expected, measured.then_some(&mut rare)).await?;
        let (count, team) = &teams[call % teams.len()];
        let expected = usize::try_from(*count)?.min(page_size);
        list_once(&store, &base, Some(("team", team.clone())), expected, measured.then_some(&mut common)).await?;
        list_once(&store, &base, None, all.min(page_size), measured.then_some(&mut unfiltered)).await?;
        if measured {
            rare.matching.push(projects[call % projects.len()].0);
            common.matching.push(teams[call % teams.len()].0);
            unfiltered.matching.push(sessions);
        }
    }
    Ok(LabelListReport {
        sessions,
        labelled,
        page_size,
        seed_secs,
        rare: rare.figure(),
        common: common.figure(),
        unfiltered: unfiltered.figure(),
    })
}

#[cfg(test)]
mod tests {
    use crate::server::Server;

    /// Not part of `cargo test`: measures once on a throwaway cluster with
    /// durable settings and prints the figures. Run with
    /// `cargo test --release -p adk-postgres-bench labels -- --ignored --nocapture`.
    #[tokio::test(flavor = "multi_thread")]
    #[ignore = "a measurement, not a test"]
    async fn list_by_label_on_100k_sessions() -> anyhow::Result<()> {
        let server = Server::throwaway().await?;
        let url = server.fresh_database("adk_bench_labels").await?;
        adk_postgres_schema::run_pending_migrations(&url).await?;
        let report = super::measure_label_list(&url, 100_000, 300).await?;
        println!("{report}");
        println!("{}", serde_json::to_string(&report)?);
        server.drop_database("adk_bench_labels").await?;
        Ok(())
    }
}
