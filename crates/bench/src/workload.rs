//! What the benchmark does, and the data it does it with.

use std::collections::HashMap;

use adk_core::{Content, Part};
use adk_session::Event;
use serde::Serialize;
use serde_json::{Value, json};

/// The app every benchmark session belongs to.
pub const APP: &str = "bench";
/// Sessions appended to at once in the concurrent append workload.
pub const CONCURRENCY: usize = 8;
/// Events per session in the append workloads.
pub const EVENTS_PER_SESSION: usize = 40;
/// Every this-many events carries a `user:` delta.
pub const USER_DELTA_EVERY: usize = 10;
/// Characters of the text part of each event.
pub const TEXT_CHARS: usize = 200;
/// The user whose sessions `list` lists.
pub const LIST_USER: &str = "lister";
/// The user of the sessions `get` reads.
pub const GET_USER: &str = "reader";
/// Sessions of the list user.
pub const LIST_SESSIONS: usize = 100;
/// The sessions `get` reads: `EVENTS_PER_SESSION` events, and the big one.
pub const SMALL_SESSION: &str = "g-40";
pub const BIG_SESSION: &str = "g-big";
/// Events of the big session in a full run.
pub const BIG_SESSION_EVENTS: usize = 1_000;

/// Writers of the crowd sections; adk-session meets the first only.
pub const CROWD_WRITERS: [usize; 2] = [200, 1000];

/// Sizes of one run.
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    pub quick: bool,
    /// Sessions created, in `create_rounds` rounds.
    pub creates: usize,
    pub create_rounds: usize,
    /// Sessions appended to (each `EVENTS_PER_SESSION` events), per mode,
    /// in `append_rounds` rounds (concurrent: a multiple of `CONCURRENCY`
    /// sessions per round) and `sequential_append_rounds` rounds.
    pub append_sessions: usize,
    pub append_rounds: usize,
    pub sequential_append_rounds: usize,
    /// Events of the big session `get` reads.
    pub big_session_events: usize,
    /// Reads per round of each get/list workload, and rounds.
    pub small_reads: usize,
    pub big_reads: usize,
    pub read_rounds: usize,
    /// Events of the retention day (sessions x events each).
    pub retention_sessions: usize,
    pub retention_events_per_session: usize,
    /// Events of the backlog the usage rollup rolls up, and how many times
    /// it is rolled up from scratch (the median run is reported).
    pub rollup_events: usize,
    pub rollup_runs: usize,
    /// Operations per kind in the round-trip pass.
    pub round_trip_ops: usize,
    /// Writers of each crowd section (ours), and seconds each lasts.
    pub crowd_writers: Vec<usize>,
    pub crowd_secs: u64,
    /// Events of the user `erase_user` erases.
    pub erase_events: usize,
    /// Sessions of the user a labelled listing filters, and listings timed.
    pub label_sessions: usize,
    pub label_calls: usize,
    /// Appends of each of the 8 writers per round of the change-feed latency.
    pub feed_appends_per_writer: usize,
    /// Rounds of the invocation lease's overhead legs, turns (of
    /// `lease::EVENTS_PER_INVOCATION` events) each leg appends per round,
    /// and runs of its 20-invocation race.
    pub lease_rounds: usize,
    pub lease_invocations: usize,
    pub lease_race_repetitions: usize,
    /// Rounds of the TLS leg (each transport once per operation), and the
    /// sessions each round appends to per transport; its gets read
    /// `small_reads` and `big_reads` times per round.
    pub tls_rounds: usize,
    pub tls_append_sessions: usize,
    /// Rounds of the reads section (`--reads`), each running every read
    /// workload once on every implementation (`small_reads` and
    /// `big_reads` operations, as a round of the main table).
    pub reads_rounds: usize,
    /// Sessions of 16 images each leg of the media section appends (one a
    /// round), and whole-session gets timed per leg and round.
    pub media_rounds: usize,
    pub media_gets: usize,
    /// Sessions adk-session stores the shared image in (ours always 100):
    /// each costs it a full copy, so fewer are linear to scale.
    pub media_peer_dedup_sessions: usize,
    /// Rounds of the TOAST section (pglz against lz4), sessions of
    /// `EVENTS_PER_SESSION` events each method receives per round, gets of
    /// a whole session per method and round, and scans of every payload.
    pub toast_rounds: usize,
    pub toast_sessions: usize,
    pub toast_gets: usize,
    pub toast_scans: usize,
    /// Events of the day the archive section archives and restores; days
    /// of its erasure's archive, events in each, days holding the erased
    /// user, and full reads of that archive timed.
    pub archive_day_events: i64,
    pub archive_erase_days: u64,
    pub archive_erase_events_per_day: i64,
    pub archive_erase_user_days: u64,
    pub archive_full_reads: usize,
}

impl Plan {
    pub fn full() -> Self {
        Self {
            quick: false,
            creates: 1_000,
            create_rounds: 5,
            append_sessions: 200,
            append_rounds: 5,
            sequential_append_rounds: 10,
            big_session_events: BIG_SESSION_EVENTS,
            small_reads: 300,
            big_reads: 60,
            read_rounds: 5,
            retention_sessions: 1_000,
            retention_events_per_session: 100,
            rollup_events: 1_000_000,
            rollup_runs: 3,
            round_trip_ops: 50,
            crowd_writers: CROWD_WRITERS.to_vec(),
            crowd_secs: 10,
            erase_events: 100_000,
            label_sessions: 100_000,
            label_calls: 200,
            feed_appends_per_writer: 500,
            lease_rounds: 10,
            lease_invocations: 50,
            lease_race_repetitions: 5,
            tls_rounds: 8,
            tls_append_sessions: 10,
            // Every order of the three implementations four times.
            reads_rounds: 24,
            media_rounds: 3,
            media_gets: 5,
            media_peer_dedup_sessions: 100,
            toast_rounds: 5,
            toast_sessions: 20,
            toast_gets: 100,
            toast_scans: 5,
            archive_day_events: 1_000_000,
            archive_erase_days: 30,
            archive_erase_events_per_day: 10_000,
            archive_erase_user_days: 3,
            archive_full_reads: 3,
        }
    }

    /// A smoke test of every workload, well under a minute.
    pub fn quick() -> Self {
        Self {
            quick: true,
            creates: 50,
            create_rounds: 1,
            append_sessions: 8,
            append_rounds: 1,
            sequential_append_rounds: 1,
            big_session_events: 200,
            small_reads: 50,
            big_reads: 20,
            read_rounds: 1,
            retention_sessions: 100,
            retention_events_per_session: 100,
            rollup_events: 100_000,
            rollup_runs: 1,
            round_trip_ops: 5,
            crowd_writers: CROWD_WRITERS.to_vec(),
            crowd_secs: 3,
            erase_events: 10_000,
            label_sessions: 10_000,
            label_calls: 50,
            feed_appends_per_writer: 100,
            lease_rounds: 2,
            lease_invocations: 10,
            lease_race_repetitions: 2,
            tls_rounds: 2,
            tls_append_sessions: 2,
            reads_rounds: 2,
            // The 16 images of 1 MB even here: fewer repetitions instead.
            media_rounds: 1,
            media_gets: 3,
            media_peer_dedup_sessions: 20,
            toast_rounds: 1,
            toast_sessions: 4,
            toast_gets: 20,
            toast_scans: 3,
            archive_day_events: 5_000,
            archive_erase_days: 3,
            archive_erase_events_per_day: 1_000,
            archive_erase_user_days: 1,
            archive_full_reads: 1,
        }
    }

    /// Rounds of the append workload `concurrent` or not.
    pub fn rounds_of_appends(&self, concurrent: bool) -> usize {
        if concurrent { self.append_rounds } else { self.sequential_append_rounds }
    }

    pub fn sessions_per_append_round(&self, concurrent: bool) -> usize {
        self.append_sessions / self.rounds_of_appends(concurrent)
    }

    pub fn creates_per_round(&self) -> usize {
        self.creates / self.create_rounds
    }

    pub fn media(&self) -> crate::media::MediaPlan {
        crate::media::MediaPlan {
            rounds: self.media_rounds,
            gets: self.media_gets,
            peer_dedup_sessions: self.media_peer_dedup_sessions,
        }
    }

    pub fn toast(&self) -> crate::toast::ToastPlan {
        crate::toast::ToastPlan {
            rounds: self.toast_rounds,
            sessions: self.toast_sessions,
            gets: self.toast_gets,
            scans: self.toast_scans,
        }
    }

    pub fn archive(&self) -> crate::archive::ArchivePlan {
        crate::archive::ArchivePlan {
            day_events: self.archive_day_events,
            erase_days: self.archive_erase_days,
            erase_events_per_day: self.archive_erase_events_per_day,
            erase_user_days: self.archive_erase_user_days,
            full_reads: self.archive_full_reads,
        }
    }

    pub fn reads(&self) -> crate::reads::ReadsPlan {
        crate::reads::ReadsPlan {
            quick: self.quick,
            rounds: self.reads_rounds,
            small_reads: self.small_reads,
            big_reads: self.big_reads,
            // The targets name the 1,000-event session, so a smoke run reads
            // that one too: filling it takes seconds, not minutes.
            big_session_events: BIG_SESSION_EVENTS,
        }
    }

    pub fn lease(&self) -> crate::lease::LeasePlan {
        crate::lease::LeasePlan {
            rounds: self.lease_rounds,
            invocations_per_round: self.lease_invocations,
            race_repetitions: self.lease_race_repetitions,
        }
    }

    pub fn retention_events(&self) -> usize {
        self.retention_sessions * self.retention_events_per_session
    }
}

/// A session's id and owner in the append workloads: one user per session,
/// as in a service where many users talk at once (so `user:` upserts of
/// concurrent sessions never wait for one another).
pub fn append_session(mode: &str, index: usize) -> (String, String) {
    (format!("u-{mode}-{index}"), format!("{mode}-{index}"))
}

/// The session-scoped initial state of every created session.
pub fn initial_state() -> HashMap<String, Value> {
    HashMap::from([("channel".to_owned(), json!("web")), ("locale".to_owned(), json!("en-GB"))])
}

/// ~200 characters of text that differ per event, like a real turn.
pub fn text(seed: usize) -> String {
    const WORDS: [&str; 16] = [
        "the", "order", "arrives", "tomorrow", "between", "nine", "and", "noon", "please", "confirm", "your",
        "address", "so", "our", "courier", "knows",
    ];
    let mut text = String::with_capacity(TEXT_CHARS + 16);
    let mut state = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    while text.len() < TEXT_CHARS {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        if !text.is_empty() {
            text.push(' ');
        }
        text.push_str(WORDS[state % WORDS.len()]);
    }
    text.truncate(TEXT_CHARS);
    text
}

/// Event `n` (0-based) of a conversation: a ~200-character text part, a
/// small session delta, and on every tenth a `user:` delta.
pub fn event(n: usize) -> Event {
    let author = if n.is_multiple_of(2) { "user" } else { "assistant" };
    let mut event = Event::new(format!("inv-{}", n / 2));
    event.author = author.to_owned();
    event.llm_response.content = Some(Content {
        role: if author == "user" { "user".to_owned() } else { "model".to_owned() },
        parts: vec![Part::Text { text: text(n) }],
    });
    event.llm_response.turn_complete = author == "assistant";
    let delta = &mut event.actions.state_delta;
    delta.insert("turn".to_owned(), json!(n));
    delta.insert("last_author".to_owned(), json!(author));
    if has_user_delta(n) {
        delta.insert("user:visits".to_owned(), json!(n));
    }
    event
}

pub fn has_user_delta(n: usize) -> bool {
    n % USER_DELTA_EVERY == USER_DELTA_EVERY - 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_have_the_promised_shape() {
        let e = event(9);
        let Some(Part::Text { text }) = e.llm_response.content.as_ref().and_then(|c| c.parts.first()) else {
            panic!("a text part")
        };
        assert_eq!(text.chars().count(), TEXT_CHARS);
        assert!(e.actions.state_delta.contains_key("user:visits"));
        assert!(!event(8).actions.state_delta.contains_key("user:visits"));
        assert_ne!(self::text(1), self::text(2));
        let with_user = (0..EVENTS_PER_SESSION).filter(|n| has_user_delta(*n)).count();
        assert_eq!(with_user, EVENTS_PER_SESSION / USER_DELTA_EVERY);
    }

    #[test]
    fn plans_divide_evenly() {
        for plan in [Plan::full(), Plan::quick()] {
            assert_eq!(plan.append_sessions % plan.append_rounds, 0);
            assert_eq!(plan.append_sessions % plan.sequential_append_rounds, 0);
            assert_eq!(plan.sessions_per_append_round(true) % CONCURRENCY, 0);
            assert_eq!(plan.creates % plan.create_rounds, 0);
            assert_eq!(plan.lease_invocations % crate::lease::INVOCATIONS_PER_SESSION, 0);
            assert_eq!(plan.reads_rounds % 2, 0, "each pair of rounds runs the reads in both orders");
        }
    }
}
