//! The crowd: many writers at once through the adk trait, each retrying
//! until its append is acknowledged, no faults injected. Reports appends
//! acknowledged, errors by category (there should be none), how long an
//! append took to be acknowledged, and how long each operation waited for
//! its turn at the pool (the store's FIFO gate reports every wait).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use adk_core::identity::{AdkIdentity, AppName, SessionId, UserId};
use adk_postgres_storage::PgSessionStore;
use adk_session::{AppendEventRequest, CreateRequest, SessionService};
use anyhow::{Context as _, anyhow};
use serde::Serialize;

use crate::measure::Sample;
use crate::workload::{self, APP, initial_state};

/// A writer stops retrying this long after the section's end (and the
/// append counts as given up): a guard against a hung run, not a policy.
const GIVE_UP_AFTER: Duration = Duration::from_secs(60);
/// Pause between a failed append and its retry.
const RETRY_PAUSE: Duration = Duration::from_millis(10);

/// Every wait the store's gate reported, for the section running now.
pub type Waits = Arc<std::sync::Mutex<Vec<Duration>>>;

/// One crowd section on one implementation.
#[derive(Debug, Clone, Serialize)]
pub struct CrowdResult {
    pub implementation: String,
    pub writers: usize,
    pub secs: f64,
    /// Appends acknowledged (each after as many retries as it took).
    pub acked: u64,
    pub acked_per_sec: f64,
    /// Failed attempts (each was retried), by error category.
    pub errors: u64,
    pub errors_by_category: BTreeMap<String, u64>,
    /// Appends still unacknowledged when their writer gave up.
    pub given_up: u64,
    /// From the first attempt of an append to its acknowledgement.
    pub ack_p50_ms: f64,
    pub ack_p99_ms: f64,
    /// Each operation's wait for its turn at the pool, as the store's FIFO
    /// gate reports it (zero when a connection was free). `None` for
    /// adk-session.
    pub checkout_wait: Option<CheckoutWait>,
    /// bb8's own counters over the section (behind the gate).
    pub pool: Option<PoolWaits>,
}

#[derive(Debug, Clone, Serialize)]
pub struct CheckoutWait {
    pub checkouts: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct PoolWaits {
    pub gets: u64,
    pub waited: u64,
    pub timed_out: u64,
    pub wait_ms_total: f64,
}

fn identity(i: usize) -> anyhow::Result<AdkIdentity> {
    Ok(AdkIdentity {
        app_name: AppName::try_from(APP)?,
        user_id: UserId::try_from(format!("u-crowd-{i}").as_str())?,
        session_id: SessionId::try_from(format!("crowd-{i}").as_str())?,
    })
}

/// Creates the sessions of `writers` writers (untimed), 16 at a time.
pub async fn setup(service: &Arc<dyn SessionService>, writers: usize) -> anyhow::Result<()> {
    let lanes = 16;
    let tasks: Vec<_> = (0..lanes)
        .map(|lane| {
            let service = service.clone();
            tokio::spawn(async move {
                for i in (lane..writers).step_by(lanes) {
                    service
                        .create(CreateRequest {
                            app_name: APP.to_owned(),
                            user_id: format!("u-crowd-{i}"),
                            session_id: Some(format!("crowd-{i}")),
                            state: initial_state(),
                        })
                        .await
                        .map_err(|e| anyhow!("create crowd-{i}: {e}"))?;
                }
                anyhow::Ok(())
            })
        })
        .collect();
    for task in tasks {
        task.await.context("a create task panicked")??;
    }
    Ok(())
}

/// An error's category: its message with numbers blanked, cut short.
fn category(message: &str) -> String {
    let mut out = String::new();
    let mut in_number = false;
    for c in message.chars() {
        if c.is_ascii_digit() {
            if !in_number {
                out.push('N');
            }
            in_number = true;
        } else {
            in_number = false;
            out.push(c);
        }
    }
    out.chars().take(100).collect()
}

#[derive(Debug, Default)]
struct Writer {
    acked: u64,
    given_up: u64,
    errors: BTreeMap<String, u64>,
    /// Acknowledgement latencies; one histogram per writer would cost a
    /// thousand writers some 200 MB, so they are merged at the end.
    latencies: Vec<Duration>,
}

/// `writers` writers (sessions `crowd-0..writers`, made by [`setup`]) for
/// `duration`; `store` is the store behind `service`, with its gate
/// reporting into `waits`.
pub async fn run(
    label: &str,
    service: &Arc<dyn SessionService>,
    store: Option<(&PgSessionStore, &Waits)>,
    writers: usize,
    duration: Duration,
) -> anyhow::Result<CrowdResult> {
    let pool_before = store.map(|(s, _)| s.pool().state().statistics);
    if let Some((_, waits)) = store {
        waits.lock().map_err(|_| anyhow!("the wait log is poisoned"))?.clear();
    }
    let began = Instant::now();
    let deadline = began + duration;
    // Invocation ids of this run only: the sessions are reused from run to
    // run, and the adk adapter remembers an invocation's lease token for a
    // while after its turn ended.
    let run_tag = format!("{label}-{writers}");
    let tasks: Vec<_> = (0..writers)
        .map(|i| {
            let service = service.clone();
            let run_tag = run_tag.clone();
            tokio::spawn(async move {
                let identity = identity(i)?;
                let mut writer = Writer::default();
                let mut n = 0usize;
                // A writer stops at the deadline once its turn is answered
                // (events alternate user, agent): an unanswered message
                // would hold the session's invocation lease into the next run.
                while Instant::now() < deadline || n % 2 == 1 {
                    let mut event = workload::event(n);
                    event.invocation_id = format!("{run_tag}-{}", event.invocation_id);
                    let started = Instant::now();
                    let acked = loop {
                        let request = AppendEventRequest { identity: identity.clone(), event: event.clone() };
                        match service.append_event_for_identity(request).await {
                            Ok(_) => break true,
                            Err(error) => {
                                *writer.errors.entry(category(&error.to_string())).or_default() += 1;
                                if Instant::now() > deadline + GIVE_UP_AFTER {
                                    break false;
                                }
                                tokio::time::sleep(RETRY_PAUSE).await;
                            }
                        }
                    };
                    if !acked {
                        writer.given_up += 1;
                        break;
                    }
                    writer.latencies.push(started.elapsed());
                    writer.acked += 1;
                    n += 1;
                }
                anyhow::Ok(writer)
            })
        })
        .collect();
    let mut sample = Sample::default();
    let (mut acked, mut given_up) = (0u64, 0u64);
    let mut errors_by_category = BTreeMap::new();
    for task in tasks {
        let writer = task.await.context("a crowd writer panicked")??;
        acked += writer.acked;
        given_up += writer.given_up;
        for latency in writer.latencies {
            sample.record(latency);
        }
        for (category, count) in writer.errors {
            *errors_by_category.entry(category).or_default() += count;
        }
    }
    let elapsed = began.elapsed();
    let checkout_wait = match store {
        Some((_, waits)) => {
            let waits = std::mem::take(&mut *waits.lock().map_err(|_| anyhow!("the wait log is poisoned"))?);
            let mut sample = Sample::default();
            for wait in &waits {
                sample.record(*wait);
            }
            Some(CheckoutWait {
                checkouts: waits.len() as u64,
                p50_ms: sample.millis_at(0.5),
                p99_ms: sample.millis_at(0.99),
                max_ms: sample.millis_at(1.0),
            })
        }
        None => None,
    };
    let pool = match (store, pool_before) {
        (Some((store, _)), Some(before)) => {
            let after = store.pool().state().statistics;
            Some(PoolWaits {
                gets: (after.get_direct + after.get_waited).saturating_sub(before.get_direct + before.get_waited),
                waited: after.get_waited.saturating_sub(before.get_waited),
                timed_out: after.get_timed_out.saturating_sub(before.get_timed_out),
                wait_ms_total: after.get_wait_time.saturating_sub(before.get_wait_time).as_secs_f64() * 1000.0,
            })
        }
        _ => None,
    };
    let errors = errors_by_category.values().sum();
    Ok(CrowdResult {
        implementation: label.to_owned(),
        writers,
        secs: elapsed.as_secs_f64(),
        acked,
        acked_per_sec: acked as f64 / elapsed.as_secs_f64().max(1e-9),
        errors,
        errors_by_category,
        given_up,
        ack_p50_ms: sample.millis_at(0.5),
        ack_p99_ms: sample.millis_at(0.99),
        checkout_wait,
        pool,
    })
}
