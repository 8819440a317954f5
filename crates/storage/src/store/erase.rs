//! Erasing a user (`SessionStore::erase_user`, `adk-pg erase-user`): every
//! session of one user of one app, expired ones too, their events in every
//! partition, the user's state and the usage job's invocation tails that
//! name them. App state stays.
//!
//! An erasure is a loop of short transactions, one bounded batch each
//! (`adk_erase_user_batch`, migration 15), so it never holds a lock for
//! long and traffic keeps flowing between its batches: first the user's
//! sessions are hidden (expired with the erasure's mark, so get, list and
//! append answer `NotFound` at once), then each session's events are deleted
//! newest first, `batch_size` at a time from the session's one partition,
//! then the session rows, the invocation tails and the user state. Every
//! batch is its own autocommit statement on a connection of the pool,
//! checked out for that batch only.
//!
//! The erasure is recorded in `adk_user_erasures` before its first batch
//! (app, SHA-256 of the user id, the acting role, counts, times; never
//! content), as `running` until its last batch marks it `done`. Interrupted
//! anywhere, it is finished by running it again, which resumes the same
//! record. An append racing it either lands before its session is hidden,
//! and is erased with it, or is refused with `NotFound`; sessions created
//! while it runs are erased too, up to its last batch (see the migration for
//! the argument).

use std::time::Duration;

use adk_postgres_domain::{AppName, Erasure, StoreError, UserId};
use serde::Serialize;

use crate::conn::Load as _;
use crate::error::from_diesel;
use crate::functions::{self as sql, EraseOutcome, ErasureBatchRow, ErasureBegunRow, ErasurePreviewRow};
use crate::pool::with_retries;
use crate::store::{PgSessionStore, only_row};

/// Rows one batch marks or deletes by default.
pub const DEFAULT_ERASE_BATCH: u32 = 1_000;
/// The largest batch the SQL function accepts.
pub const MAX_ERASE_BATCH: u32 = 100_000;
/// Longest an erasure waits, in all, for rollup runs to finish before its
/// last batch; past it the erasure stops, still recorded as running, and a
/// rerun resumes it.
const ROLLUP_PATIENCE: Duration = Duration::from_secs(300);

/// How [`PgSessionStore::erase_user_with`] erases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EraseOptions {
    /// Most rows one batch (one short transaction) marks or deletes: 1 to
    /// [`MAX_ERASE_BATCH`].
    pub batch_size: u32,
    /// Count what would be erased and write nothing, not even the audit
    /// record.
    pub dry_run: bool,
}

impl Default for EraseOptions {
    fn default() -> Self {
        Self { batch_size: DEFAULT_ERASE_BATCH, dry_run: false }
    }
}

impl EraseOptions {
    fn checked_batch(&self) -> Result<i32, StoreError> {
        if !(1..=MAX_ERASE_BATCH).contains(&self.batch_size) {
            return Err(StoreError::invalid(
                "batch_size",
                format!("must be 1 to {MAX_ERASE_BATCH}, not {}", self.batch_size),
            ));
        }
        i32::try_from(self.batch_size).map_err(|_| StoreError::invalid("batch_size", "out of range"))
    }
}

/// What one batch did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum EraseStep {
    /// Sessions of the user hidden: from now on they are `NotFound`.
    Hidden,
    /// The newest events of one hidden session deleted.
    Events,
    /// A hidden session, its events gone, deleted.
    Session,
    /// Nothing: a session was created or went meanwhile; the next batch
    /// picks it up.
    Busy,
    /// Nothing: a usage rollup run is in progress and may write invocation
    /// tails of this user's events; the erasure waits for it to end.
    WaitingForRollup,
    /// Invocation tails of the user deleted; more follow.
    UsageTails,
    /// The last tails and the user state deleted, no session left, and the
    /// audit record completed.
    Done,
}

impl From<EraseOutcome> for EraseStep {
    fn from(outcome: EraseOutcome) -> Self {
        match outcome {
            EraseOutcome::Marked => Self::Hidden,
            EraseOutcome::Events => Self::Events,
            EraseOutcome::Session => Self::Session,
            EraseOutcome::Busy => Self::Busy,
            EraseOutcome::Waiting => Self::WaitingForRollup,
            EraseOutcome::Tails => Self::UsageTails,
            EraseOutcome::Done => Self::Done,
        }
    }
}

/// Reported after every batch of an erasure.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct EraseProgress {
    /// What this batch did.
    pub step: EraseStep,
    /// Rows this batch marked or deleted: never more than the batch size.
    pub affected: u64,
    /// Batches this run has sent, this one included.
    pub batch: u64,
    /// Sessions deleted so far, an interrupted earlier run's included.
    pub sessions: u64,
    /// Events deleted so far, likewise.
    pub events: u64,
    /// Usage rollup invocation tails deleted so far, likewise.
    pub usage_tails: u64,
    /// Whether user state was found and deleted so far.
    pub user_state: bool,
}

impl std::fmt::Display for EraseProgress {
    /// One line of `adk-pg erase-user`'s progress.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match self.step {
            EraseStep::Hidden => format!("hid {} session(s)", self.affected),
            EraseStep::Events => format!("deleted {} event(s)", self.affected),
            EraseStep::Session => "deleted a session".to_owned(),
            EraseStep::Busy => "sessions changed meanwhile; looking again".to_owned(),
            EraseStep::WaitingForRollup => "waiting for a usage rollup run to finish".to_owned(),
            EraseStep::UsageTails => format!("deleted {} usage tail(s)", self.affected),
            EraseStep::Done => "deleted the user state and the last usage tails".to_owned(),
        };
        write!(
            f,
            "batch {}: {what}; so far {} session(s), {} event(s), {} usage tail(s)",
            self.batch, self.sessions, self.events, self.usage_tails
        )
    }
}

/// What an erasure removed, or for a dry run, would remove.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ErasureReport {
    /// The app the user was erased from.
    pub app_name: String,
    /// Hex SHA-256 of the user id, as the audit record keeps it.
    pub user_hash: String,
    /// Whether nothing was deleted: the figures are what a run would delete.
    pub dry_run: bool,
    /// The audit record (`adk_user_erasures.erasure_id`). For a dry run, the
    /// user's interrupted erasure that a real run would resume, if any.
    pub erasure_id: Option<i64>,
    /// Sessions deleted (expired ones too), by this erasure's runs so far.
    pub sessions: u64,
    /// Events deleted with them, likewise.
    pub events: u64,
    /// Whether the user had user state, now deleted.
    pub user_state: bool,
    /// Invocation tails of the usage rollup that named the user's sessions.
    pub usage_tails: u64,
    /// Batches this run sent.
    pub batches: u64,
    /// Runs of this erasure: more than 1 when it resumed an interrupted one
    /// (or ran alongside another run for the same user). 0 for a dry run.
    pub runs: u32,
}

impl ErasureReport {
    /// The store contract's summary.
    pub fn erasure(&self) -> Erasure {
        Erasure { sessions: self.sessions, events: self.events, user_state: self.user_state }
    }
}

impl std::fmt::Display for ErasureReport {
    /// What `adk-pg erase-user` prints at the end.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let who = format!("user {} of app {}", short_hash(&self.user_hash), self.app_name);
        let counts = format!(
            "{} session(s), {} event(s), {}, {} usage tail(s)",
            self.sessions,
            self.events,
            if self.user_state { "the user state" } else { "no user state" },
            self.usage_tails
        );
        if self.dry_run {
            write!(f, "dry run, nothing written: erasing {who} would delete {counts}")?;
            if let Some(id) = self.erasure_id {
                write!(f, "; it would resume interrupted erasure #{id}")?;
            }
            return Ok(());
        }
        write!(f, "erased {who}: {counts}, in {} batch(es)", self.batches)?;
        if let Some(id) = self.erasure_id {
            write!(f, "; audit record #{id}")?;
        }
        if self.runs > 1 {
            write!(f, " (run {} of it: an interrupted erasure resumed)", self.runs)?;
        }
        Ok(())
    }
}

/// The first 12 hex digits: enough to tell users apart in a log line.
fn short_hash(hash: &str) -> &str {
    hash.get(..12).unwrap_or(hash)
}

fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or_default()
}

impl PgSessionStore {
    /// `SessionStore::erase_user` with the default batch size.
    pub(crate) async fn erase_user_data(&self, app: &AppName, user: &UserId) -> Result<Erasure, StoreError> {
        self.erase_user_with(app, user, EraseOptions::default(), |_| {}).await.map(|report| report.erasure())
    }

    /// Erases `user` of `app` in batches of `options.batch_size`, calling
    /// `progress` after each, or with `options.dry_run` counts what would
    /// go and writes nothing. Resumes the user's interrupted erasure if
    /// there is one. A bound service role may erase only users of its apps;
    /// any other is `PermissionDenied` with nothing written. An error
    /// part-way (a lost connection, a lock timeout) leaves the erasure
    /// recorded as running and its sessions hidden: run it again.
    pub async fn erase_user_with(
        &self,
        app: &AppName,
        user: &UserId,
        options: EraseOptions,
        mut progress: impl FnMut(&EraseProgress),
    ) -> Result<ErasureReport, StoreError> {
        let batch_size = options.checked_batch()?;
        let tenant = self.tenant_for(app);
        let (app_name, user_id) = (app.as_str(), user.as_str());
        if options.dry_run {
            let preview = with_retries!(self, |conn| sql::EraseUserPreview { tenant, app_name, user_id }
                .load::<ErasurePreviewRow>(&mut conn)
                .await
                .map_err(|e| from_diesel(e, "state"))
                .and_then(|rows| only_row(rows, "adk_erase_user_preview")))?;
            return Ok(ErasureReport {
                app_name: app_name.to_owned(),
                user_hash: preview.user_hash,
                dry_run: true,
                erasure_id: preview.running_erasure_id,
                sessions: count(preview.sessions),
                events: count(preview.events),
                user_state: preview.user_state,
                usage_tails: count(preview.usage_tails),
                batches: 0,
                runs: 0,
            });
        }

        let begun = with_retries!(self, |conn| sql::EraseUserBegin { tenant, app_name, user_id }
            .load::<ErasureBegunRow>(&mut conn)
            .await
            .map_err(|e| from_diesel(e, "state"))
            .and_then(|rows| only_row(rows, "adk_erase_user_begin")))?;
        let mut report = ErasureReport {
            app_name: app_name.to_owned(),
            user_hash: begun.user_hash,
            dry_run: false,
            erasure_id: Some(begun.erasure_id),
            sessions: 0,
            events: 0,
            user_state: false,
            usage_tails: 0,
            batches: 0,
            runs: u32::try_from(begun.runs).unwrap_or_default(),
        };
        let mut pause = Duration::from_millis(50);
        let mut waited = Duration::ZERO;
        loop {
            let row = with_retries!(self, |conn| sql::EraseUserBatch {
                tenant,
                app_name,
                user_id,
                erasure_id: begun.erasure_id,
                batch_size,
            }
            .load::<ErasureBatchRow>(&mut conn)
            .await
            .map_err(|e| from_diesel(e, "state"))
            .and_then(|rows| only_row(rows, "adk_erase_user_batch")))?;
            report.batches += 1;
            report.sessions = count(row.sessions);
            report.events = count(row.events);
            report.usage_tails = count(row.usage_tails);
            report.user_state = row.user_state;
            let step = EraseStep::from(row.step);
            progress(&EraseProgress {
                step,
                affected: count(row.affected),
                batch: report.batches,
                sessions: report.sessions,
                events: report.events,
                usage_tails: report.usage_tails,
                user_state: report.user_state,
            });
            match step {
                EraseStep::Done => return Ok(report),
                EraseStep::WaitingForRollup => {
                    if waited >= ROLLUP_PATIENCE {
                        return Err(StoreError::Timeout {
                            what: format!(
                                "usage rollup runs to finish ({waited:?}); erasure #{} is recorded as running, \
                                 run it again to finish it",
                                begun.erasure_id
                            ),
                        });
                    }
                    tokio::time::sleep(pause).await;
                    waited += pause;
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
                // A session appeared or went between two statements of the
                // batch: look again at once, after letting others run.
                EraseStep::Busy => tokio::task::yield_now().await,
                EraseStep::Hidden | EraseStep::Events | EraseStep::Session | EraseStep::UsageTails => {}
            }
        }
    }
}
