//! A primary and a streaming standby, for failover tests: the primary
//! crashes, the standby is promoted, and a client with a two-host URL and
//! `target_session_attrs=read-write` must find the new primary.
//!
//! Both are throwaway clusters from the same server binaries. fsync stays
//! off (only the server process ever crashes here, never the machine), but
//! the primary commits synchronously and keeps full-page writes, so a
//! synchronous standby really has every commit the client was told of.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::cluster::{Cluster, Extras, find_server_binaries, throwaway_node_with};
use crate::error::HarnessError;
use crate::tls::TlsOptions;

/// The standby's `application_name`, replication slot and the primary's
/// `synchronous_standby_names`.
pub const STANDBY_NAME: &str = "standby1";
const WAIT: Duration = Duration::from_secs(60);

/// A primary and (once made) a streaming standby of it; both stopped and
/// removed when dropped, or by their watchdogs when this process exits.
#[derive(Debug)]
pub struct ReplicatedPair {
    primary: Cluster,
    standby: OnceLock<Cluster>,
    synchronous: bool,
}

impl ReplicatedPair {
    /// A primary and its standby, streaming; with `synchronous`, every
    /// commit on the primary waits until the standby has it (sync_state
    /// `sync`).
    pub fn start(synchronous: bool) -> Result<Self, HarnessError> {
        let pair = Self::start_primary(synchronous)?;
        pair.start_standby()?;
        Ok(pair)
    }

    /// The primary alone, for a test that puts a database on it before the
    /// standby is made ([`ReplicatedPair::start_standby`]). Commits do not
    /// wait for anyone until then.
    pub fn start_primary(synchronous: bool) -> Result<Self, HarnessError> {
        let settings = [
            ("wal_level", "replica"),
            ("max_wal_senders", "10"),
            ("max_replication_slots", "10"),
            ("synchronous_commit", "on"),
            // A base backup taken while full-page writes are off cannot be
            // trusted, and the standby replays the primary's WAL.
            ("full_page_writes", "on"),
            ("wal_sender_timeout", "10s"),
        ];
        let extras = Extras {
            tls: Some(TlsOptions::default()),
            tls_required: false,
            settings: settings.into_iter().map(|(name, value)| (name, value.to_owned())).collect(),
        };
        // initdb's pg_hba.conf takes `replication` from 127.0.0.1 on trust.
        let (primary, _) = throwaway_node_with(&find_server_binaries()?, false, extras)?;
        Ok(Self { primary, standby: OnceLock::new(), synchronous })
    }

    /// Makes the standby from a base backup of the primary as it is now,
    /// starts it and waits until it streams (and, when synchronous, until
    /// the primary's commits wait for it). Once only.
    pub fn start_standby(&self) -> Result<&Cluster, HarnessError> {
        if self.standby.get().is_some() {
            return Err(HarnessError::Setup("the pair already has its standby".into()));
        }
        // The standby's own settings: after a promotion nothing must wait
        // for a standby of its own.
        let settings = vec![("synchronous_commit", "on".to_owned()), ("hot_standby", "on".to_owned())];
        let mut standby = Cluster::base_backup_of(&self.primary, STANDBY_NAME, settings)?;
        standby.start_on_a_free_port()?;
        let standby = self.standby.get_or_init(|| standby);
        if self.synchronous {
            self.primary.query_value(&format!("ALTER SYSTEM SET synchronous_standby_names = '{STANDBY_NAME}'"))?;
            self.primary.query_value("SELECT pg_reload_conf()")?;
        }
        let wanted = if self.synchronous { "sync" } else { "async" };
        let sql = format!(
            "SELECT state || '/' || sync_state FROM pg_stat_replication WHERE application_name = '{STANDBY_NAME}'"
        );
        wait_for(&format!("the standby to stream ({wanted})"), || {
            Ok(self.primary.query_value(&sql)? == format!("streaming/{wanted}"))
        })?;
        Ok(standby)
    }

    pub fn primary(&self) -> &Cluster {
        &self.primary
    }

    /// The standby; an error before [`ReplicatedPair::start_standby`].
    pub fn standby(&self) -> Result<&Cluster, HarnessError> {
        self.standby.get().ok_or_else(|| HarnessError::Setup("the pair has no standby yet: start_standby".into()))
    }

    pub fn synchronous(&self) -> bool {
        self.synchronous
    }

    /// Stops the primary with `-m immediate`: no shutdown checkpoint, every
    /// session cut, as a crashed server would.
    pub fn crash_primary(&self) -> Result<(), HarnessError> {
        self.primary.stop_immediate()
    }

    /// Promotes the standby and waits until it takes writes.
    pub fn promote_standby(&self) -> Result<(), HarnessError> {
        let standby = self.standby()?;
        standby.promote()?;
        wait_for("the promoted standby to leave recovery", || {
            Ok(standby.query_value("SELECT pg_is_in_recovery()")? == "f")
        })
    }

    /// `postgres://postgres@127.0.0.1:<primary>,127.0.0.1:<standby>/<database>
    /// ?target_session_attrs=read-write`: whichever of the two takes writes.
    pub fn two_host_url(&self, database: &str) -> Result<String, HarnessError> {
        Ok(format!(
            "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/{database}?target_session_attrs=read-write",
            self.primary.port(),
            self.standby()?.port()
        ))
    }

    /// Waits until the standby has replayed everything the primary has
    /// written so far, e.g. before reading from it.
    pub fn wait_for_replay(&self) -> Result<(), HarnessError> {
        let standby = self.standby()?;
        let target = self.primary.query_value("SELECT pg_current_wal_lsn()")?;
        let sql = format!("SELECT pg_last_wal_replay_lsn() >= '{target}'::pg_lsn");
        wait_for("the standby to replay the primary's WAL", || Ok(standby.query_value(&sql)? == "t"))
    }
}

fn wait_for(what: &str, mut done: impl FnMut() -> Result<bool, HarnessError>) -> Result<(), HarnessError> {
    let deadline = Instant::now() + WAIT;
    loop {
        match done() {
            Ok(true) => return Ok(()),
            Ok(false) | Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            Ok(false) => return Err(HarnessError::Setup(format!("timed out after {WAIT:?} waiting for {what}"))),
            Err(error) => return Err(error),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::psql;

    #[test]
    fn a_synchronous_pair_fails_over_to_the_standby() {
        let pair = ReplicatedPair::start(true).unwrap();
        let bin = pair.primary().bin_dir();
        let sql = "SELECT sync_state FROM pg_stat_replication";
        assert_eq!(pair.primary().query_value(sql).unwrap(), "sync");
        let url = pair.two_host_url("postgres").unwrap();
        assert_eq!(psql(bin, &url, "SELECT inet_server_port()").unwrap(), pair.primary().port().to_string());
        psql(bin, &url, "CREATE TABLE t (x int); INSERT INTO t VALUES (1)").unwrap();

        pair.crash_primary().unwrap();
        pair.promote_standby().unwrap();
        let standby = pair.standby().unwrap().port().to_string();
        let answer = psql(bin, &url, "INSERT INTO t VALUES (2); SELECT count(*) || '@' || inet_server_port() FROM t");
        assert_eq!(answer.unwrap(), format!("2@{standby}"));
    }

    #[test]
    fn a_database_made_before_the_standby_is_on_it_and_later_ones_replicate() {
        let pair = ReplicatedPair::start_primary(false).unwrap();
        let bin = pair.primary().bin_dir();
        psql(bin, &pair.primary().server_url(), "CREATE DATABASE before").unwrap();
        psql(bin, &pair.primary().database_url("before"), "CREATE TABLE t AS SELECT 1 AS x").unwrap();
        assert!(pair.standby().is_err());
        pair.start_standby().unwrap();
        assert_eq!(pair.primary().query_value("SELECT sync_state FROM pg_stat_replication").unwrap(), "async");
        psql(bin, &pair.primary().server_url(), "CREATE DATABASE after").unwrap();
        psql(bin, &pair.primary().database_url("after"), "CREATE TABLE t AS SELECT 2 AS x").unwrap();
        pair.wait_for_replay().unwrap();
        let standby = pair.standby().unwrap();
        assert_eq!(psql(bin, &standby.database_url("before"), "SELECT x FROM t").unwrap(), "1");
        assert_eq!(psql(bin, &standby.database_url("after"), "SELECT x FROM t").unwrap(), "2");
    }
}
