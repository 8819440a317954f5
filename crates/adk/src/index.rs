//! WORKAROUND(find_by_id): resolving a bare session id to its full key.
//!
//! adk's legacy `append_event(session_id, …)`, `rewind` and `rewind_steps`
//! name a session by id alone, but the store addresses sessions by (app,
//! user, id) and has no lookup by id. Until it has one (`find_by_id`, see the
//! crate's report), the service remembers the keys of the sessions it has
//! created, loaded, listed or appended to, in this bounded, process-local
//! index. A bare id resolves when this process has seen exactly one session
//! with it; a session only another process has touched is reported as not
//! found, with a message saying how to address it fully. The runner never
//! depends on this: it appends through `append_event_for_identity`.
//!
//! Delete this module when the store can find sessions by id.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard};

use adk_postgres_domain::{AppName, SessionKey, UserId};

/// Keys remembered at most; the oldest are forgotten first. About 100 bytes
/// each, so the index stays within ~10 MB however many sessions pass.
pub(crate) const CAPACITY: usize = 100_000;

#[derive(Debug, Default)]
struct Inner {
    by_id: HashMap<String, Vec<SessionKey>>,
    order: VecDeque<SessionKey>,
}

#[derive(Debug, Default)]
pub(crate) struct SessionIndex {
    inner: Mutex<Inner>,
}

impl SessionIndex {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Every mutation below leaves the maps consistent before it can
        // panic, so the data behind a poisoned lock is sound.
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(crate) fn remember(&self, key: &SessionKey) {
        let mut inner = self.lock();
        let keys = inner.by_id.entry(key.session_id.to_string()).or_default();
        if keys.contains(key) {
            return;
        }
        keys.push(key.clone());
        inner.order.push_back(key.clone());
        while inner.order.len() > CAPACITY {
            if let Some(old) = inner.order.pop_front() {
                Self::remove(&mut inner, &old);
            }
        }
    }

    pub(crate) fn forget(&self, key: &SessionKey) {
        Self::remove(&mut self.lock(), key);
    }

    pub(crate) fn forget_user(&self, app_name: &AppName, user_id: &UserId) {
        let mut inner = self.lock();
        inner.by_id.retain(|_, keys| {
            keys.retain(|k| !(&k.app_name == app_name && &k.user_id == user_id));
            !keys.is_empty()
        });
    }

    /// Every key seen with this session id (empty, one, or an ambiguity).
    pub(crate) fn lookup(&self, session_id: &str) -> Vec<SessionKey> {
        self.lock().by_id.get(session_id).cloned().unwrap_or_default()
    }

    fn remove(inner: &mut Inner, key: &SessionKey) {
        let id = key.session_id.as_str();
        if let Some(keys) = inner.by_id.get_mut(id) {
            keys.retain(|k| k != key);
            if keys.is_empty() {
                inner.by_id.remove(id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(app: &str, user: &str, id: &str) -> SessionKey {
        SessionKey::parse(app, user, id).unwrap()
    }

    #[test]
    fn resolves_forgets_and_reports_ambiguity() {
        let index = SessionIndex::default();
        index.remember(&key("a", "u1", "s"));
        index.remember(&key("a", "u1", "s"));
        assert_eq!(index.lookup("s"), [key("a", "u1", "s")]);
        index.remember(&key("a", "u2", "s"));
        assert_eq!(index.lookup("s").len(), 2);
        index.forget(&key("a", "u2", "s"));
        assert_eq!(index.lookup("s"), [key("a", "u1", "s")]);
        index.forget_user(&AppName::new("a").unwrap(), &UserId::new("u1").unwrap());
        assert!(index.lookup("s").is_empty());
    }

    #[test]
    fn stays_bounded() {
        let index = SessionIndex::default();
        for i in 0..CAPACITY + 10 {
            index.remember(&key("a", "u", &format!("s{i}")));
        }
        assert!(index.lookup("s0").is_empty());
        assert_eq!(index.lookup(&format!("s{}", CAPACITY + 9)).len(), 1);
        assert!(index.lock().order.len() <= CAPACITY);
    }
}
