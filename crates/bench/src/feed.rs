//! The change feed (`PgSessionStore::watch`): how long an event takes from
//! its append being acknowledged to its watcher receiving it, under eight
//! writers, and what the feed costs those writers (the same appends with the
//! feed turned off by `adk_set_change_feed(false)`), told apart from what
//! the watchers' own reads cost (the feed on, nobody watching).
//!
//! Each writer appends to a session of its own, one append after the other,
//! as fast as the store acknowledges them, and each session has a watcher
//! opened before the first append: a conversation and the UI following it.
//! Latency is measured per event from the writer's acknowledgement to the
//! watcher's receipt on the same clock. A notice can reach the watcher
//! before the acknowledgement reaches the writer (both leave the server at
//! commit); such an event counts as 0 and is counted apart.
//!
//! Each round runs the three kinds one after the other (feed on and
//! watched, on and unwatched, off), so a checkpoint or a noisy neighbour
//! falls on all of them; appends/s is the median over each kind's rounds.

use std::sync::Arc;
use std::time::{Duration, Instant};

use adk_postgres_domain::{AppName, AppendOptions, CreateSession, Event, SessionKey, SessionStore, UserId};
use adk_postgres_storage::PgSessionStore;
use anyhow::{Context as _, bail, ensure};
use serde::Serialize;
use tokio_postgres::Client;

use crate::driver::pool_config;
use crate::measure::{Sample, median};
use crate::server::connect;

/// The app the measured sessions belong to.
const APP: &str = "feed-bench";

/// A watcher gives up on an event this long after its writer finished: a
/// guard against a hung run, not a bound on the figure.
const GIVE_UP_AFTER: Duration = Duration::from_secs(60);

/// What one measurement runs.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct FeedPlan {
    pub writers: usize,
    /// Appends of each writer in each round.
    pub appends_per_writer: usize,
    /// Rounds of each kind (feed on with watchers, on without, off).
    pub rounds: usize,
}

impl Default for FeedPlan {
    fn default() -> Self {
        Self { writers: 8, appends_per_writer: 500, rounds: 2 }
    }
}

/// What the measurement found.
#[derive(Debug, Clone, Serialize)]
pub struct FeedLatencyReport {
    pub plan: FeedPlan,
    /// Appends acknowledged with the feed on, and events the watchers
    /// received (each once, in order: anything else fails the run).
    pub appended: u64,
    pub received: u64,
    /// Of those, received before the writer had its acknowledgement.
    pub before_ack: u64,
    /// From the writer's acknowledgement to the watcher's receipt.
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// Appends acknowledged per second by all writers together, median
    /// over rounds: with the feed on and a watcher on each session, with
    /// the feed on and nobody watching (the cost of NOTIFY alone), and with
    /// the feed off.
    pub appends_per_sec_on: f64,
    pub appends_per_sec_on_unwatched: f64,
    pub appends_per_sec_off: f64,
}

impl FeedLatencyReport {
    /// Append throughput with the feed on and watched, as a share of it
    /// with the feed off.
    pub fn on_off_ratio(&self) -> f64 {
        self.share_of_off(self.appends_per_sec_on)
    }

    fn share_of_off(&self, rate: f64) -> f64 {
        if self.appends_per_sec_off > 0.0 { rate / self.appends_per_sec_off } else { f64::NAN }
    }
}

impl std::fmt::Display for FeedLatencyReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let FeedPlan { writers, appends_per_writer, rounds } = self.plan;
        writeln!(
            f,
            "Change feed: {writers} writers, a session and a watcher each, {appends_per_writer} appends per writer \
             per round, {rounds} rounds of each kind"
        )?;
        writeln!(
            f,
            "  append acknowledged -> watcher received: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms \
             ({} of {} events; {} reached the watcher before the writer's acknowledgement, counted as 0)",
            self.p50_ms, self.p99_ms, self.max_ms, self.received, self.appended, self.before_ack
        )?;
        write!(
            f,
            "  appends/s: {:.0} with the feed on and watched ({:.2}x), {:.0} on and unwatched ({:.2}x), {:.0} off",
            self.appends_per_sec_on,
            self.on_off_ratio(),
            self.appends_per_sec_on_unwatched,
            self.share_of_off(self.appends_per_sec_on_unwatched),
            self.appends_per_sec_off,
        )
    }
}

/// Measures the feed on the migrated database at `owner_url`, as the
/// tables' owner (turning the feed off and on takes it). The feed is on
/// when this returns, whatever happened.
pub async fn measure_notify_latency(owner_url: &str, plan: FeedPlan) -> anyhow::Result<FeedLatencyReport> {
    ensure!(plan.writers > 0 && plan.appends_per_writer > 0 && plan.rounds > 0, "an empty plan: {plan:?}");
    let sql = connect(owner_url).await?;
    let store = Arc::new(
        PgSessionStore::connect(owner_url, &pool_config(), Default::default()).await.context("connecting the store")?,
    );
    let result = rounds(&sql, &store, plan).await;
    let restored = set_feed(&sql, true).await;
    let report = result?;
    restored?;
    Ok(report)
}

async fn set_feed(sql: &Client, on: bool) -> anyhow::Result<()> {
    sql.query_one("SELECT adk_set_change_feed($1)", &[&on])
        .await
        .with_context(|| format!("turning the feed on: {on}"))?;
    Ok(())
}

async fn rounds(sql: &Client, store: &Arc<PgSessionStore>, plan: FeedPlan) -> anyhow::Result<FeedLatencyReport> {
    let mut latency = Sample::default();
    let (mut appended, mut received, mut before_ack) = (0, 0, 0);
    let (mut rates_on, mut rates_unwatched, mut rates_off) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..plan.rounds {
        set_feed(sql, true).await?;
        let on = round_with_watchers(store, plan, round).await?;
        rates_on.push(on.appends as f64 / on.elapsed.as_secs_f64());
        appended += on.appends;
        received += on.received;
        before_ack += on.before_ack;
        latency.merge(&on.latency);

        let unwatched = round_without_watchers(store, plan, round, "unwatched").await?;
        rates_unwatched.push(unwatched.appends as f64 / unwatched.elapsed.as_secs_f64());

        set_feed(sql, false).await?;
        let off = round_without_watchers(store, plan, round, "off").await?;
        rates_off.push(off.appends as f64 / off.elapsed.as_secs_f64());
    }
    Ok(FeedLatencyReport {
        plan,
        appended,
        received,
        before_ack,
        p50_ms: latency.millis_at(0.50),
        p99_ms: latency.millis_at(0.99),
        max_ms: latency.millis_at(1.0),
        appends_per_sec_on: median(&mut rates_on).unwrap_or(0.0),
        appends_per_sec_on_unwatched: median(&mut rates_unwatched).unwrap_or(0.0),
        appends_per_sec_off: median(&mut rates_off).unwrap_or(0.0),
    })
}

/// One round's figures.
struct Round {
    appends: u64,
    /// From the first append's start to the last acknowledgement.
    elapsed: Duration,
    received: u64,
    before_ack: u64,
    latency: Sample,
}

async fn sessions(store: &PgSessionStore, plan: FeedPlan, round: usize, kind: &str) -> anyhow::Result<Vec<SessionKey>> {
    let mut keys = Vec::with_capacity(plan.writers);
    for w in 0..plan.writers {
        let request = CreateSession::new(AppName::new(APP)?, UserId::new(format!("writer-{w}"))?)
            .with_id(format!("{kind}-{round}-{w}"));
        keys.push(store.create(request).await.context("creating a session")?.key);
    }
    Ok(keys)
}

fn event(writer: usize, i: usize) -> Event {
    let mut event = Event::new("agent");
    event.content =
        Some(serde_json::json!({"role": "model", "parts": [{"text": format!("writer {writer}, event {i}")}]}));
    event
}

/// Appends `plan.appends_per_writer` events to `key`, one after the other,
/// and returns when each was acknowledged, by seq (index `seq - 1`).
async fn write(store: Arc<PgSessionStore>, key: SessionKey, writer: usize, n: usize) -> anyhow::Result<Vec<Instant>> {
    let mut acks = Vec::with_capacity(n);
    for i in 0..n {
        let appended = store.append(&key, event(writer, i), AppendOptions::default()).await?;
        acks.push(Instant::now());
        ensure!(
            appended.seq == Some(acks.len() as u64),
            "writer {writer}: seq {:?} for append {}",
            appended.seq,
            i + 1
        );
    }
    Ok(acks)
}

async fn round_with_watchers(store: &Arc<PgSessionStore>, plan: FeedPlan, round: usize) -> anyhow::Result<Round> {
    let n = plan.appends_per_writer;
    let keys = sessions(store, plan, round, "on").await?;
    let mut watchers = Vec::with_capacity(keys.len());
    for key in &keys {
        let mut feed = store.watch(key, 0).await.context("watching")?;
        watchers.push(tokio::spawn(async move {
            let mut receipts = Vec::with_capacity(n);
            while receipts.len() < n {
                let next = tokio::time::timeout(GIVE_UP_AFTER, feed.recv()).await;
                match next {
                    Ok(Some(Ok((seq, _)))) if seq == receipts.len() as u64 + 1 => receipts.push(Instant::now()),
                    Ok(Some(Ok((seq, _)))) => bail!("{}: seq {seq} after {}", feed.key(), receipts.len()),
                    Ok(Some(Err(e))) => bail!("{}: the feed failed: {e}", feed.key()),
                    Ok(None) => bail!("{}: the feed ended", feed.key()),
                    Err(_) => bail!("{}: nothing for {GIVE_UP_AFTER:?} after seq {}", feed.key(), receipts.len()),
                }
            }
            Ok(receipts)
        }));
    }
    let started = Instant::now();
    let writers: Vec<_> =
        keys.into_iter().enumerate().map(|(w, key)| tokio::spawn(write(Arc::clone(store), key, w, n))).collect();
    let mut acks = Vec::with_capacity(writers.len());
    for writer in writers {
        acks.push(writer.await??);
    }
    let elapsed = started.elapsed();
    let mut latency = Sample::default();
    let (mut received, mut before_ack) = (0, 0);
    for (watcher, acks) in watchers.into_iter().zip(&acks) {
        for (receipt, ack) in watcher.await??.iter().zip(acks) {
            received += 1;
            match receipt.checked_duration_since(*ack) {
                Some(latency_of_one) => latency.record(latency_of_one),
                None => {
                    before_ack += 1;
                    latency.record(Duration::ZERO);
                }
            }
        }
    }
    let appends = (plan.writers * n) as u64;
    latency.end_round(appends, elapsed);
    Ok(Round { appends, elapsed, received, before_ack, latency })
}

async fn round_without_watchers(
    store: &Arc<PgSessionStore>,
    plan: FeedPlan,
    round: usize,
    kind: &str,
) -> anyhow::Result<Round> {
    let n = plan.appends_per_writer;
    let keys = sessions(store, plan, round, kind).await?;
    let started = Instant::now();
    let writers: Vec<_> =
        keys.into_iter().enumerate().map(|(w, key)| tokio::spawn(write(Arc::clone(store), key, w, n))).collect();
    for writer in writers {
        writer.await??;
    }
    let appends = (plan.writers * n) as u64;
    Ok(Round { appends, elapsed: started.elapsed(), received: 0, before_ack: 0, latency: Sample::default() })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The measurement itself: every event reaches its watcher (or the run
    /// fails), and the feed is on again afterwards.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn every_append_reaches_its_watcher_and_the_feed_is_left_on() {
        let db = adk_postgres_testing::test_database().await;
        let plan = FeedPlan { writers: 8, appends_per_writer: 20, rounds: 1 };
        let report = measure_notify_latency(db.url(), plan).await.expect("measure");
        assert_eq!((report.appended, report.received), (160, 160), "{report}");
        assert!(
            report.appends_per_sec_on > 0.0
                && report.appends_per_sec_on_unwatched > 0.0
                && report.appends_per_sec_off > 0.0,
            "{report}"
        );
        let on: bool =
            connect(db.url()).await.unwrap().query_one("SELECT adk_change_feed_enabled()", &[]).await.unwrap().get(0);
        assert!(on, "the feed is on after the measurement");
        assert!(report.to_string().contains("p99"), "{report}");
    }
}
