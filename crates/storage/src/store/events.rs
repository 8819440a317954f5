//! A session's events: append (making a missing day's partition first when
//! it must) and rewind.

use std::future::Future;

use adk_postgres_domain::{
    AppendOptions, Appended, Event, GetOptions, LeaseGrant, Session, SessionId, SessionKey, StoreError,
};

use super::{PgSessionStore, interval, only_row, single, to_json, version};
use crate::conn::Load as _;
use crate::error::from_diesel;
use crate::functions::{self as sql, AppendOutcome, AppendRow, PremadeRow, RewindOutcome, RewindRow};
use crate::policy::interval_duration;
use crate::pool::with_retries;

impl PgSessionStore {
    /// Runs a write that may need today's event partition; when the
    /// partition is missing, makes the policy's partitions (through the
    /// narrow `adk_premake_event_partitions`, which runs as the tables' owner)
    /// and runs it once more. A new database or a store running as a
    /// service role never needs `adk-pg maintain` before its first append;
    /// a day the policy does not premake stays a loud `PartitionMissing`.
    pub(super) async fn with_partition<T, F, Fut>(&self, mut write: F) -> Result<T, StoreError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, StoreError>>,
    {
        match write().await {
            Err(missing @ StoreError::PartitionMissing { .. }) => {
                let premade = with_retries!(self, |conn| sql::PremakeEventPartitions
                    .load::<PremadeRow>(&mut conn)
                    .await
                    .map_err(|e| from_diesel(e, "state")));
                match premade {
                    Ok(rows) => {
                        let made = single(rows).and_then(|r| r.adk_premake_event_partitions).unwrap_or(0);
                        tracing::info!(%missing, made, "made missing event partitions");
                        write().await
                    }
                    Err(e) => {
                        tracing::warn!(%missing, error = %e, "could not make the missing event partition");
                        Err(missing)
                    }
                }
            }
            other => other,
        }
    }

    pub(super) async fn append_event(
        &self,
        key: &SessionKey,
        event: Event,
        options: AppendOptions,
    ) -> Result<Appended, StoreError> {
        if event.is_partial() {
            return Ok(Appended { event, seq: None, replayed: false, last_update_time: None, lease: None });
        }
        if let Some(lease) = &options.lease {
            lease.validate(&event.invocation_id)?;
        }
        let lease_idle = options.lease.map(|lease| interval("lease.idle", lease.idle)).transpose()?;
        // In range: `validate` refused a generation past i64.
        let lease_generation = options.lease.and_then(|lease| lease.generation).and_then(|g| i64::try_from(g).ok());
        let (event, prepared) = event.prepare_for_store_with(self.config.media_offload_bytes())?;
        let expected = options
            .expected_version
            .map(|v| i64::try_from(v).map_err(|_| StoreError::invalid("expected_version", "out of range")))
            .transpose()?;
        let max_lifetime = self.config.max_session_lifetime.map(|d| interval("max_session_lifetime", d)).transpose()?;
        const DELTA_FIELD: &str = "event.actions.state_delta";
        let session_delta = to_json(prepared.delta.session);
        let user_delta = to_json(prepared.delta.user);
        let app_delta = to_json(prepared.delta.app);
        let blobs: Vec<Vec<u8>> = prepared.blobs.into_iter().map(|blob| blob.data).collect();

        let row = self
            .with_partition(|| async {
                with_retries!(self, |conn| sql::AppendEvent {
                    key: self.key_args(key),
                    event_id: event.id.as_str(),
                    invocation_id: Some(event.invocation_id.as_str()).filter(|s| !s.is_empty()),
                    author: event.author.as_str(),
                    event_ts: prepared.event_ts,
                    payload: &prepared.payload,
                    session_delta: &session_delta,
                    user_delta: &user_delta,
                    app_delta: &app_delta,
                    expected_seq: expected,
                    max_lifetime,
                    blobs: Some(blobs.as_slice()).filter(|b| !b.is_empty()),
                    lease_idle,
                    lease_generation,
                    lease_release: options.lease.is_some_and(|lease| lease.release),
                }
                .load::<AppendRow>(&mut conn)
                .await
                .map_err(|e| from_diesel(e, DELTA_FIELD))
                .and_then(|rows| only_row(rows, "adk_append_event")))
            })
            .await?;
        let seq = row.seq.map(version);
        match row.outcome {
            AppendOutcome::Stored => {
                let lease = row
                    .lease_generation
                    .map(|generation| LeaseGrant { generation: version(generation), expires_at: row.lease_until });
                Ok(Appended { event, seq, replayed: false, last_update_time: row.updated_at, lease })
            }
            // The stored payload equals the one just sent, so the event is
            // the one the caller sent, with its media in place: no need to
            // read the media back.
            AppendOutcome::Replayed => {
                Ok(Appended { event, seq, replayed: true, last_update_time: row.updated_at, lease: None })
            }
            AppendOutcome::Busy => Err(StoreError::SessionBusy {
                key: key.clone(),
                holder: row.lease_holder.unwrap_or_default(),
                lapses_at: row.lease_until.unwrap_or_default(),
            }),
            AppendOutcome::LeaseLost => Err(StoreError::LeaseLost {
                key: key.clone(),
                held: options.lease.and_then(|lease| lease.generation).unwrap_or_default(),
                current: row.lease_generation.map(version).unwrap_or_default(),
            }),
            AppendOutcome::Duplicate => Err(StoreError::DuplicateEvent { key: key.clone(), event_id: event.id }),
            AppendOutcome::Stale => Err(StoreError::StaleSession {
                key: key.clone(),
                expected: options.expected_version.unwrap_or_default(),
                actual: seq.unwrap_or_default(),
            }),
            AppendOutcome::NotFound => Err(StoreError::NotFound(key.clone())),
            AppendOutcome::Closed => Err(StoreError::SessionClosed {
                key: key.clone(),
                successor: row.successor_id.and_then(|s| SessionId::new(s).ok()),
            }),
            AppendOutcome::TooOld => Err(StoreError::LifetimeExceeded {
                key: key.clone(),
                max_lifetime: row.max_lifetime.as_ref().and_then(interval_duration).unwrap_or_default(),
            }),
        }
    }
    pub(super) async fn rewind_session(
        &self,
        key: &SessionKey,
        keep: u64,
        expected_version: Option<u64>,
    ) -> Result<Session, StoreError> {
        let keep_seq = i64::try_from(keep).map_err(|_| StoreError::invalid("keep", "out of range"))?;
        let expected = expected_version
            .map(|v| i64::try_from(v).map_err(|_| StoreError::invalid("expected_version", "out of range")))
            .transpose()?;
        let row = with_retries!(self, |conn| sql::RewindSession {
            key: self.key_args(key),
            keep: keep_seq,
            expected_seq: expected
        }
        .load::<RewindRow>(&mut conn)
        .await
        .map_err(|e| from_diesel(e, "state"))
        .and_then(|rows| only_row(rows, "adk_rewind_session")))?;
        let current = row.seq.map(version).unwrap_or_default();
        match row.outcome {
            RewindOutcome::Rewound => self.load_session(key, GetOptions::default()).await,
            RewindOutcome::NotFound => Err(StoreError::NotFound(key.clone())),
            RewindOutcome::Stale => Err(StoreError::StaleSession {
                key: key.clone(),
                expected: expected_version.unwrap_or_default(),
                actual: current,
            }),
            RewindOutcome::Beyond => Err(StoreError::invalid("keep", format!("the session has only {current} events"))),
        }
    }
}
