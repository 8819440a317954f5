//! The timed workloads, run through a [`Driver`].

use std::time::Instant;

use anyhow::{Context as _, bail, ensure};

use crate::driver::Driver;
use crate::measure::Sample;
use crate::workload::{
    self, BIG_SESSION, CONCURRENCY, EVENTS_PER_SESSION, GET_USER, LIST_SESSIONS, LIST_USER, SMALL_SESSION,
};

/// The operations measured, in the order of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Op {
    Create,
    AppendSequential,
    AppendConcurrent,
    Get40,
    Get40Recent20,
    GetBig,
    GetBigRecent20,
    List100,
}

impl Op {
    /// In the order the report prints them: the reads every turn of an
    /// agent and every sidebar makes come first, then the writes.
    pub const ALL: [Op; 8] = [
        Op::List100,
        Op::Get40,
        Op::Get40Recent20,
        Op::GetBig,
        Op::GetBigRecent20,
        Op::Create,
        Op::AppendSequential,
        Op::AppendConcurrent,
    ];

    /// Events one operation reads, for the gets (`big`: events of the big session).
    pub fn events_read(self, big: usize) -> Option<usize> {
        match self {
            Op::Get40 => Some(EVENTS_PER_SESSION),
            Op::GetBig => Some(big),
            Op::Get40Recent20 | Op::GetBigRecent20 => Some(20),
            _ => None,
        }
    }

    pub fn label(self, big: usize) -> String {
        match self {
            Op::Create => "create".into(),
            Op::AppendSequential => "append, 1 session at a time".into(),
            Op::AppendConcurrent => format!("append, {CONCURRENCY} sessions at once"),
            Op::Get40 => "get, 40 events".into(),
            Op::Get40Recent20 => "get, 20 recent of 40".into(),
            Op::GetBig => format!("get, {big} events"),
            Op::GetBigRecent20 => format!("get, 20 recent of {big}"),
            Op::List100 => format!("list, {LIST_SESSIONS} sessions"),
        }
    }
}

/// Runs a workload on a worker thread, as a service's request handler
/// runs: a client whose connections are tasks of their own (tokio-postgres)
/// would otherwise pay a cross-thread wake-up on every message, which the
/// benchmark's main thread would add and a service would not.
async fn on_worker<F>(work: F) -> anyhow::Result<Sample>
where
    F: Future<Output = anyhow::Result<Sample>> + Send + 'static,
{
    tokio::spawn(work).await.context("a workload panicked")?
}

/// Creates `count` sessions one after another: ids `c-{round}-{i}`, ten users.
pub async fn create(driver: &Driver, round: usize, count: usize) -> anyhow::Result<Sample> {
    let driver = driver.clone();
    on_worker(async move { create_here(&driver, round, count).await }).await
}

async fn create_here(driver: &Driver, round: usize, count: usize) -> anyhow::Result<Sample> {
    let mut sample = Sample::default();
    let began = Instant::now();
    for i in 0..count {
        let (user, id) = (format!("c-{}", i % 10), format!("c-{round}-{i}"));
        let started = Instant::now();
        driver.create(&user, &id).await?;
        sample.record(started.elapsed());
    }
    sample.end_round(count as u64, began.elapsed());
    Ok(sample)
}

/// Appends the conversation (`EVENTS_PER_SESSION` events) to each of
/// `sessions` in turn; returns the latencies without closing a round.
async fn converse(driver: &Driver, sessions: &[(String, String)]) -> anyhow::Result<Sample> {
    let mut sample = Sample::default();
    for (user, session) in sessions {
        for n in 0..EVENTS_PER_SESSION {
            let event = driver.prepare(workload::event(n))?;
            let started = Instant::now();
            driver.append(user, session, event).await?;
            sample.record(started.elapsed());
        }
    }
    Ok(sample)
}

/// One client appending to one session after another.
pub async fn append_sequential(driver: &Driver, sessions: &[(String, String)]) -> anyhow::Result<Sample> {
    let (driver, sessions) = (driver.clone(), sessions.to_vec());
    on_worker(async move {
        let began = Instant::now();
        let mut sample = converse(&driver, &sessions).await?;
        sample.end_round((sessions.len() * EVENTS_PER_SESSION) as u64, began.elapsed());
        Ok(sample)
    })
    .await
}

/// `CONCURRENCY` clients, each appending to its own share of `sessions`.
pub async fn append_concurrent(driver: &Driver, sessions: &[(String, String)]) -> anyhow::Result<Sample> {
    ensure!(sessions.len().is_multiple_of(CONCURRENCY), "sessions must split evenly over the clients");
    let share = sessions.len() / CONCURRENCY;
    let began = Instant::now();
    let tasks: Vec<_> = sessions
        .chunks(share)
        .map(|chunk| {
            let (driver, chunk) = (driver.clone(), chunk.to_vec());
            tokio::spawn(async move { converse(&driver, &chunk).await })
        })
        .collect();
    let mut sample = Sample::default();
    for task in tasks {
        sample.merge(&task.await.context("an append task panicked")??);
    }
    sample.end_round((sessions.len() * EVENTS_PER_SESSION) as u64, began.elapsed());
    Ok(sample)
}

/// `count` loads of one session, checking each returned `expected` events.
pub async fn get(
    driver: &Driver,
    user: &str,
    session: &str,
    recent: Option<usize>,
    expected: usize,
    count: usize,
) -> anyhow::Result<Sample> {
    let (driver, user, session) = (driver.clone(), user.to_owned(), session.to_owned());
    on_worker(async move { get_here(&driver, &user, &session, recent, expected, count).await }).await
}

async fn get_here(
    driver: &Driver,
    user: &str,
    session: &str,
    recent: Option<usize>,
    expected: usize,
    count: usize,
) -> anyhow::Result<Sample> {
    let mut sample = Sample::default();
    let began = Instant::now();
    for _ in 0..count {
        let started = Instant::now();
        let events = driver.get(user, session, recent).await?;
        sample.record(started.elapsed());
        ensure!(events == expected, "get {user}/{session} returned {events} events, expected {expected}");
    }
    sample.end_round(count as u64, began.elapsed());
    Ok(sample)
}

/// `count` listings of `user`, checking each returned `expected` sessions.
pub async fn list(driver: &Driver, user: &str, expected: usize, count: usize) -> anyhow::Result<Sample> {
    let (driver, user) = (driver.clone(), user.to_owned());
    on_worker(async move { list_here(&driver, &user, expected, count).await }).await
}

async fn list_here(driver: &Driver, user: &str, expected: usize, count: usize) -> anyhow::Result<Sample> {
    let mut sample = Sample::default();
    let began = Instant::now();
    for _ in 0..count {
        let started = Instant::now();
        let sessions = driver.list(user).await?;
        sample.record(started.elapsed());
        ensure!(sessions == expected, "list {user} returned {sessions} sessions, expected {expected}");
    }
    sample.end_round(count as u64, began.elapsed());
    Ok(sample)
}

/// `count` operations of the read workload `op` (a get or the listing) on
/// the sessions [`setup_reads`] made, with `big` events in the big one.
pub async fn read(driver: &Driver, op: Op, big: usize, count: usize) -> anyhow::Result<Sample> {
    match op {
        Op::Get40 => get(driver, GET_USER, SMALL_SESSION, None, EVENTS_PER_SESSION, count).await,
        Op::Get40Recent20 => get(driver, GET_USER, SMALL_SESSION, Some(20), 20, count).await,
        Op::GetBig => get(driver, GET_USER, BIG_SESSION, None, big, count).await,
        Op::GetBigRecent20 => get(driver, GET_USER, BIG_SESSION, Some(20), 20, count).await,
        Op::List100 => list(driver, LIST_USER, LIST_SESSIONS, count).await,
        Op::Create | Op::AppendSequential | Op::AppendConcurrent => bail!("{} is not a read", op.label(big)),
    }
}

/// The sessions the get workloads read, filled through the driver's own
/// append (setup, untimed): `SMALL_SESSION` of `EVENTS_PER_SESSION`
/// events and `BIG_SESSION` of `big`.
pub async fn setup_reads(driver: &Driver, big: usize) -> anyhow::Result<()> {
    for (session, events) in [(SMALL_SESSION, EVENTS_PER_SESSION), (BIG_SESSION, big)] {
        driver.create(GET_USER, session).await?;
        fill(driver, GET_USER, session, events).await?;
    }
    Ok(())
}

/// The `LIST_SESSIONS` empty sessions of the list user (setup, untimed).
pub async fn setup_list(driver: &Driver) -> anyhow::Result<()> {
    for i in 0..LIST_SESSIONS {
        driver.create(LIST_USER, &format!("l-{i}")).await?;
    }
    Ok(())
}

/// Appends `events` events to one session (setup, untimed).
pub async fn fill(driver: &Driver, user: &str, session: &str, events: usize) -> anyhow::Result<()> {
    for n in 0..events {
        driver.append(user, session, driver.prepare(workload::event(n))?).await?;
    }
    Ok(())
}
