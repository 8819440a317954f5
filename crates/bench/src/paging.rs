//! Paging through a long session: `SessionStore::list_events` pages of 100
//! forward, page 1 (from the start) and page 100 (after seq 9,900) of a
//! 10,000-event session, through the store trait as a service calls it.
//!
//! The session is seeded as the owner with `INSERT … SELECT` (untimed): its
//! events in its one partition, `last_seq` set to match. Both pages are
//! read one call at a time, interleaved call by call so a slow spell shows
//! in both, and each page is checked (its seqs, and that more follow unless
//! it is the last).

use std::time::{Duration, Instant};

use adk_postgres_domain::{AppName, CreateSession, Event, EventPage, SessionKey, SessionStore, UserId};
use adk_postgres_storage::{PgSessionStore, PoolConfig};
use anyhow::ensure;
use serde::Serialize;

use crate::measure::{Latency, Sample};
use crate::server::connect;
use crate::workload::APP;

const USER: &str = "paging-user";
const EVENTS: i64 = 10_000;
const PAGE: usize = 100;
/// Calls of each page before the measured ones.
const WARMUP: usize = 20;

#[derive(Debug, Clone, Serialize)]
pub struct PagingReport {
    pub events: i64,
    pub page_size: usize,
    /// `EventPage::first(100)`: seqs 1..=100.
    pub first_page: Latency,
    /// `EventPage::after(9_900, 100)`: seqs 9,901..=10,000, page 100.
    pub page_100: Latency,
}

impl std::fmt::Display for PagingReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "list_events: pages of {} forward of a {}-event session, through the store",
            self.page_size, self.events
        )?;
        for (what, latency) in [("page 1", &self.first_page), ("page 100", &self.page_100)] {
            writeln!(
                f,
                "  {what:<10} p50 {:>7.2} ms  p95 {:>7.2} ms  p99 {:>7.2} ms  ({} calls)",
                latency.p50_ms, latency.p95_ms, latency.p99_ms, latency.ops
            )?;
        }
        Ok(())
    }
}

async fn seed(url: &str, store: &PgSessionStore) -> anyhow::Result<SessionKey> {
    let key = store.create(CreateSession::new(AppName::new(APP)?, UserId::new(USER)?).with_id("long")).await?.key;
    let template = serde_json::to_value(Event::new("agent"))?;
    let sql = connect(url).await?;
    sql.execute(
        "INSERT INTO adk_events (app_name, user_id, session_id, session_day, seq, event_id, author, event_ts, payload)
         SELECT s.app_name, s.user_id, s.session_id, s.session_day, i, 'e' || i, 'agent', i,
                jsonb_set($4::jsonb, '{id}', to_jsonb('e' || i))
           FROM adk_sessions s CROSS JOIN generate_series(1, $3::bigint) i
          WHERE s.app_name = $1 AND s.user_id = $2 AND s.session_id = 'long'",
        &[&APP, &USER, &EVENTS, &template],
    )
    .await?;
    sql.execute(
        "UPDATE adk_sessions SET last_seq = $3 WHERE app_name = $1 AND user_id = $2 AND session_id = 'long'",
        &[&APP, &USER, &EVENTS],
    )
    .await?;
    sql.batch_execute("VACUUM ANALYZE adk_events").await?;
    Ok(key)
}

async fn read_once(
    store: &dyn SessionStore,
    key: &SessionKey,
    page: EventPage,
    first: u64,
    sample: Option<(&mut Sample, &mut Duration)>,
) -> anyhow::Result<()> {
    let began = Instant::now();
    let read = store.list_events(key, page).await?;
    let took = began.elapsed();
    let seqs: Vec<u64> = read.events.iter().map(|e| e.seq).collect();
    ensure!(seqs == (first..first + PAGE as u64).collect::<Vec<_>>(), "page from {first}: {:?}", seqs.first());
    ensure!(read.more == (first + (PAGE as u64) <= EVENTS as u64), "page from {first}: more {}", read.more);
    if let Some((sample, elapsed)) = sample {
        sample.record(took);
        *elapsed += took;
    }
    Ok(())
}

/// Seeds the session in `url` (a freshly migrated database), then reads
/// page 1 and page 100 `calls` times each through a store connected as the
/// owner.
pub async fn measure_list_events(url: &str, calls: usize) -> anyhow::Result<PagingReport> {
    let store =
        PgSessionStore::connect(url, &PoolConfig { max_size: 2, ..PoolConfig::default() }, Default::default()).await?;
    let key = seed(url, &store).await?;
    let (mut first, mut last) = (Sample::default(), Sample::default());
    let (mut first_elapsed, mut last_elapsed) = (Duration::ZERO, Duration::ZERO);
    let last_after = (EVENTS as u64) - PAGE as u64;
    for call in 0..WARMUP + calls {
        let measured = call >= WARMUP;
        read_once(&store, &key, EventPage::first(PAGE), 1, measured.then_some((&mut first, &mut first_elapsed)))
            .await?;
        read_once(
            &store,
            &key,
            EventPage::after(last_after, PAGE),
            last_after + 1,
            measured.then_some((&mut last, &mut last_elapsed)),
        )
        .await?;
    }
    first.end_round(calls as u64, first_elapsed);
    last.end_round(calls as u64, last_elapsed);
    Ok(PagingReport { events: EVENTS, page_size: PAGE, first_page: first.summary(), page_100: last.summary() })
}

#[cfg(test)]
mod tests {
    use crate::server::Server;

    /// Not part of `cargo test`: measures once on a throwaway cluster and
    /// prints the figures. Run with
    /// `cargo test --release -p adk-postgres-bench paging -- --ignored --nocapture`.
    #[tokio::test(flavor = "multi_thread")]
    #[ignore = "a measurement, not a test"]
    async fn list_events_of_a_10k_event_session() -> anyhow::Result<()> {
        let server = Server::throwaway().await?;
        let url = server.fresh_database("adk_bench_paging").await?;
        adk_postgres_schema::run_pending_migrations(&url).await?;
        println!("{}", super::measure_list_events(&url, 200).await?);
        server.drop_database("adk_bench_paging").await?;
        Ok(())
    }
}
