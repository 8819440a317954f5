//! Paging through a session's events without loading the session
//! (`SessionStore::list_events`): forward from the start or after a `seq`,
//! backward from the end or before a `seq`, at most [`MAX_EVENT_PAGE`] at a
//! time, each page read in one snapshot of the session.

use crate::error::StoreError;
use crate::event::Event;

/// Most events one page holds. A page is one read of one partition in one
/// snapshot; a bound keeps that read, and the reply, small enough to
/// interleave with the session's appends.
pub const MAX_EVENT_PAGE: usize = 1000;

/// Where a page starts, and so which way it goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventCursor {
    /// Forward from the first event.
    Start,
    /// Forward from the event after this `seq` (exclusive).
    After(u64),
    /// Backward from the last event.
    End,
    /// Backward from the event before this `seq` (exclusive).
    Before(u64),
}

impl EventCursor {
    /// Whether pages from here go towards later events.
    pub fn is_forward(self) -> bool {
        matches!(self, Self::Start | Self::After(_))
    }
}

/// One page request: where it starts and how many events it holds at most.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventPage {
    /// Where the page starts, and so which way it goes.
    pub cursor: EventCursor,
    /// 1 to [`MAX_EVENT_PAGE`].
    pub limit: usize,
}

impl EventPage {
    /// The first `limit` events.
    pub fn first(limit: usize) -> Self {
        Self { cursor: EventCursor::Start, limit }
    }

    /// The `limit` events after `seq`.
    pub fn after(seq: u64, limit: usize) -> Self {
        Self { cursor: EventCursor::After(seq), limit }
    }

    /// The last `limit` events.
    pub fn last(limit: usize) -> Self {
        Self { cursor: EventCursor::End, limit }
    }

    /// The `limit` events before `seq`.
    pub fn before(seq: u64, limit: usize) -> Self {
        Self { cursor: EventCursor::Before(seq), limit }
    }

    /// Refuses a limit outside 1..=[`MAX_EVENT_PAGE`] and a `seq` past what
    /// the store can hold (`i64::MAX`), naming the field, before anything
    /// is read.
    pub fn validate(&self) -> Result<(), StoreError> {
        if self.limit == 0 || self.limit > MAX_EVENT_PAGE {
            return Err(StoreError::invalid(
                "limit",
                format!("must be 1 to {MAX_EVENT_PAGE} events, not {}", self.limit),
            ));
        }
        match self.cursor {
            EventCursor::After(seq) | EventCursor::Before(seq) if i64::try_from(seq).is_err() => {
                Err(StoreError::invalid("cursor", format!("seq {seq} is past the largest a session can hold")))
            }
            _ => Ok(()),
        }
    }
}

/// An event with its sequence number in its session.
#[derive(Debug, Clone, PartialEq)]
pub struct SequencedEvent {
    /// The event's position in its session, from 1, without gaps.
    pub seq: u64,
    /// The event as stored.
    pub event: Event,
}

/// One page of a session's events.
#[derive(Debug, Clone, PartialEq)]
pub struct EventsPage {
    /// In ascending `seq` order whichever way the page went.
    pub events: Vec<SequencedEvent>,
    /// Whether more events lie beyond this page in the direction it went
    /// (later ones for a forward page, earlier ones for a backward page),
    /// as of the snapshot it was read in.
    pub more: bool,
    /// The session's version (`last_seq`) in the same snapshot: events up to
    /// it, and no later ones, were visible to this page.
    pub version: u64,
}

impl EventsPage {
    /// The page after this one in the direction `page` went, when there is
    /// one: forward after the last event, backward before the first.
    pub fn next(&self, page: EventPage) -> Option<EventPage> {
        if !self.more {
            return None;
        }
        let cursor = if page.cursor.is_forward() {
            EventCursor::After(self.events.last()?.seq)
        } else {
            EventCursor::Before(self.events.first()?.seq)
        };
        Some(EventPage { cursor, limit: page.limit })
    }
}

/// The page `page` selects of `events` (all of a session's events, in
/// `seq` order from 1): what both stores answer, stated once.
pub fn select(events: &[Event], page: EventPage, version: u64) -> EventsPage {
    let numbered =
        events.iter().enumerate().map(|(i, event)| SequencedEvent { seq: i as u64 + 1, event: event.clone() });
    let (events, more): (Vec<SequencedEvent>, bool) = match page.cursor {
        EventCursor::Start | EventCursor::After(_) => {
            let after = match page.cursor {
                EventCursor::After(seq) => seq,
                _ => 0,
            };
            let mut rest: Vec<SequencedEvent> = numbered.filter(|e| e.seq > after).take(page.limit + 1).collect();
            let more = rest.len() > page.limit;
            rest.truncate(page.limit);
            (rest, more)
        }
        EventCursor::End | EventCursor::Before(_) => {
            let before = match page.cursor {
                EventCursor::Before(seq) => seq,
                _ => u64::MAX,
            };
            let mut rest: Vec<SequencedEvent> =
                numbered.rev().filter(|e| e.seq < before).take(page.limit + 1).collect();
            let more = rest.len() > page.limit;
            rest.truncate(page.limit);
            rest.reverse();
            (rest, more)
        }
    };
    EventsPage { events, more, version }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(n: usize) -> Vec<Event> {
        (0..n).map(|_| Event::new("agent")).collect()
    }

    fn seqs(page: &EventsPage) -> Vec<u64> {
        page.events.iter().map(|e| e.seq).collect()
    }

    #[test]
    fn limits_outside_one_to_a_thousand_are_refused_naming_the_limit() {
        for limit in [0, MAX_EVENT_PAGE + 1, usize::MAX] {
            let error = EventPage::first(limit).validate().unwrap_err();
            assert!(matches!(error, StoreError::InvalidInput { ref field, .. } if field == "limit"), "{error:?}");
        }
        assert!(EventPage::first(1).validate().is_ok());
        assert!(EventPage::last(MAX_EVENT_PAGE).validate().is_ok());
        let error = EventPage::after(u64::MAX, 5).validate().unwrap_err();
        assert!(matches!(error, StoreError::InvalidInput { ref field, .. } if field == "cursor"), "{error:?}");
    }

    #[test]
    fn pages_go_both_ways_and_chain() {
        let all = events(7);
        let page = EventPage::first(3);
        let first = select(&all, page, 7);
        assert_eq!((seqs(&first), first.more), (vec![1, 2, 3], true));
        let next = first.next(page).unwrap();
        assert_eq!(next, EventPage::after(3, 3));
        let last = select(&all, EventPage::after(6, 3), 7);
        assert_eq!((seqs(&last), last.more, last.next(page)), (vec![7], false, None));

        let back = EventPage::last(3);
        let end = select(&all, back, 7);
        assert_eq!((seqs(&end), end.more), (vec![5, 6, 7], true));
        assert_eq!(end.next(back), Some(EventPage::before(5, 3)));
        let start = select(&all, EventPage::before(2, 3), 7);
        assert_eq!((seqs(&start), start.more), (vec![1], false));
        assert_eq!(seqs(&select(&all, EventPage::before(4, 3), 7)), vec![1, 2, 3]);
        assert!(!select(&all, EventPage::before(4, 3), 7).more);
    }
}
