//! The databases users actually run, rather than one plaintext server on
//! loopback that never goes away: TLS-only servers with real certificates,
//! passwords that rotate, a transaction-mode PgBouncer in front, a primary
//! that crashes and a standby promoted in its place, and a network that
//! goes silent. Every server, pooler and proxy here is real (the test
//! harness starts them); nothing is mocked.

mod credentials;
mod failover;
mod partition;
mod pooler;
mod tls;
mod writers;

use std::sync::{Arc, Mutex, PoisonError};

/// Every log line written while a test runs, at every level, so a test can
/// search them for secrets.
#[derive(Debug, Clone, Default)]
pub struct LogLines(Arc<Mutex<Vec<u8>>>);

impl LogLines {
    /// Installs the collector for this test's thread and what it spawns
    /// on a current-thread runtime; returns the guard keeping it in place.
    pub fn install(&self) -> tracing::subscriber::DefaultGuard {
        let writer = self.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::set_default(subscriber)
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(PoisonError::into_inner)).into_owned()
    }
}

impl std::io::Write for LogLines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
