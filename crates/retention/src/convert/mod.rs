//! Converting a live, unpartitioned event log into the partitioned layout
//! without rewriting its data.
//!
//! A table cannot be altered into a partitioned one. Instead the existing
//! table becomes, unchanged on disk, one *legacy* partition holding every day
//! before the cutover, under a new partitioned parent with the name and the
//! exact definition of migration `2026-11-01-000001_create_store`.
//!
//! # The legacy layout
//!
//! What this converts (the fixture `tests/fixtures/legacy_layout.sql`) is
//! migration 000001's tables except that:
//!
//! * `adk_sessions` has no `session_day` column, no `adk_sessions_key_day`
//!   unique constraint and no `adk_sessions_day` index;
//! * `adk_events` is a plain table without `session_day`, with
//!   `PRIMARY KEY (app_name, user_id, session_id, seq)`,
//!   `UNIQUE (app_name, user_id, session_id, event_id)` and
//!   `FOREIGN KEY (app_name, user_id, session_id) REFERENCES adk_sessions
//!   ON DELETE CASCADE` (any constraint names), plus the two CHECKs of the
//!   partitioned parent (`adk_events_seq_positive`,
//!   `adk_events_payload_is_object`; added if missing);
//! * there is no diesel migrations table.
//!
//! Anything else (other columns, row-level security, foreign keys pointing
//! at `adk_events`, inheritance) is refused with [`RetentionError::Conflict`](crate::RetentionError::Conflict)
//! before anything is changed. The tables must be on the search path of the
//! connecting role, in the schema diesel keeps its migrations table in
//! (normally `public`).
//!
//! # The steps
//!
//! The numbers in brackets are the steps of the partitioning guide; each
//! [`StepKind`] is one resumable unit whose completion is read from the
//! catalog, never from a record of our own, so a run can be interrupted
//! anywhere (including a killed `CREATE INDEX CONCURRENTLY`, whose INVALID
//! leftover is dropped and rebuilt) and simply run again.
//!
//! * \[1\] [`StepKind::AddSessionDay`]: `session_day date NOT NULL DEFAULT
//!   '<cutover - 1>'` on both tables, in one transaction so both agree. A
//!   constant default is stored in the catalog (`attmissingval`): no rewrite,
//!   no scan.
//! * \[2\] Deploy the application that reads `session_day` under the session
//!   row lock and binds it into every event insert (this crate's store does,
//!   through `adk_append_event`). Nothing to do here, but it must be live
//!   before step \[4\]: after the swap an insert without `session_day` fails.
//! * \[3\] Everything the attach would otherwise do under its lock, done
//!   beforehand with weak locks: `adk_sessions_key_day` (unique index built
//!   concurrently, then promoted to a constraint) and `adk_sessions_day`;
//!   unique indexes matching the new primary key and event-id key on the
//!   old table (concurrently); `CHECK (session_day < '<cutover>')` added
//!   `NOT VALID` and then validated (a light lock), which is what lets the
//!   attach skip its validation scan; the new foreign key carrying
//!   `session_day`, `NOT VALID` then validated, which the attach adopts
//!   instead of checking. Adding that key is preceded by an `EXCLUSIVE`
//!   lock on `adk_sessions`: on its own it locks `adk_events` first, the
//!   reverse of a live append's order, and the two deadlock.
//! * \[4\] [`StepKind::Swap`], one short transaction under `lock_timeout`
//!   (retried whole): lock both tables, rename `adk_events` to
//!   `adk_events_legacy`, drop its constraints without `session_day`,
//!   promote the prebuilt indexes to its primary key and unique constraint,
//!   create the partitioned parent exactly as migration 000001 does (grants
//!   and owner moved over from the old table, so that, like every other
//!   partition, the legacy one is reached only through the parent and its
//!   row-level security), attach the legacy table `FOR
//!   VALUES FROM (MINVALUE) TO ('<cutover>')`, create the cutover day's
//!   partition, and check inside the transaction that the parent's indexes
//!   and foreign key are valid and were adopted rather than rebuilt. Only
//!   catalog work happens under the lock; [`ConvertReport::swap_lock_ms`]
//!   says how long it was held.
//! * \[5\] [`StepKind::SessionsDefault`]: new sessions get today's UTC day
//!   (and so today's partition). Sessions from before keep the legacy day
//!   and keep appending into the legacy partition until they age out.
//! * \[6\] Dropping the legacy partition is not done here: maintenance drops
//!   it like any other partition once its upper bound (the cutover) is past
//!   the maximum session lifetime plus retention, and never deletes session
//!   rows while a `MINVALUE` partition is attached.
//!
//! Finally diesel's `__diesel_schema_migrations` is created if missing with
//! migration 000001 recorded as applied (the conversion *is* that
//! migration), and the later migrations are applied, so the database ends
//! exactly where a fresh install is. Run maintenance right after: the
//! conversion only creates the cutover day's partition.
//!
//! [`plan_conversion`] lists the remaining steps with their exact SQL
//! without changing anything (`--dry-run`); [`convert_events`] runs them.
//! Running it on a converted (or freshly migrated) database does nothing.

mod catalog;
mod layout;
mod plan;
mod run;
mod steps;
mod swap;

pub use layout::LEGACY_PARTITION;
pub use plan::{ConvertPlan, conversion_plan, plan_conversion};
pub use run::{ConvertOptions, ConvertProgress, ConvertReport, StepReport, convert_events, convert_events_with};
pub use steps::{ConvertStep, StepKind};

/// Key of the advisory lock that keeps two conversions apart.
pub const CONVERT_LOCK_KEY: i64 = adk_postgres_schema::names::lock_keys::CONVERSION;
