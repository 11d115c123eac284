//! Poll endpoints (issue 77, ADR 0051): an endpoint whose consumer cannot
//! receive webhooks reads its deliveries instead, in order, with a cursor.
//!
//! A poll endpoint is an endpoint without a URL ([`crate::Endpoint::is_poll`]).
//! Publishing makes its deliveries as for any endpoint (the same event
//! types, filter and examples), but no dispatcher claims them: they wait,
//! pending, until its consumer reads them. Reading is acknowledging: a read
//! hands out the oldest pending deliveries (by sequence) and records each
//! as delivered, with an attempt-log row of result `delivered`, in the same
//! transaction, so counts, tallies and the attempt log follow the reads.
//!
//! The cursor is a position in the endpoint's attempt log: a read returns
//! what was read after `after` first (again, when the consumer lost an
//! answer and asks with an older cursor), then new deliveries, and its
//! cursor is the position of the last one returned. Reads of one endpoint
//! are serialised, so positions follow the order in which deliveries were
//! handed out.

use crate::{AccountId, DeliveryId, EndpointId, EventId, StoreError, Timestamp};

/// The most events one read returns.
pub const MAX_POLL_LIMIT: u32 = 1_000;
/// What one read returns when the consumer names no limit.
pub const DEFAULT_POLL_LIMIT: u32 = 100;

/// One read of a poll endpoint's deliveries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PollRequest {
    /// The endpoint's account.
    pub account: AccountId,
    /// The endpoint, of kind poll.
    pub endpoint: EndpointId,
    /// The cursor of the last read: return what comes after it. `None`
    /// reads from the start of what the attempt log still holds.
    pub after: Option<i64>,
    /// At most this many events (1 to [`MAX_POLL_LIMIT`]).
    pub limit: u32,
}

impl PollRequest {
    /// A read of `endpoint` after `after` of at most `limit` events.
    ///
    /// # Errors
    /// `InvalidInput` for a limit of 0 or above [`MAX_POLL_LIMIT`], or a
    /// negative cursor.
    pub fn new(
        account: AccountId,
        endpoint: EndpointId,
        after: Option<i64>,
        limit: u32,
    ) -> Result<Self, StoreError> {
        if !(1..=MAX_POLL_LIMIT).contains(&limit) {
            return Err(StoreError::InvalidInput(format!(
                "limit must be from 1 to {MAX_POLL_LIMIT}, got {limit}"
            )));
        }
        if after.is_some_and(|a| a < 0) {
            return Err(StoreError::InvalidInput(
                "cursor must be one a read returned".into(),
            ));
        }
        Ok(PollRequest {
            account,
            endpoint,
            after,
            limit,
        })
    }

    /// The cursor a read returns when it found nothing: the one it was
    /// given, or the start.
    pub fn unchanged_cursor(&self) -> i64 {
        self.after.unwrap_or(0)
    }
}

/// One event as a poll endpoint's consumer reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Polled {
    /// Its position in the endpoint's stream: a cursor that reads what
    /// comes after it.
    pub position: i64,
    /// The delivery it acknowledged.
    pub delivery_id: DeliveryId,
    /// The event.
    pub event_id: EventId,
    /// The event's type.
    pub event_type: String,
    /// The body a pushed endpoint would receive: `{"type","timestamp","data"}`.
    pub body: String,
    /// When the event was published.
    pub published_at: Timestamp,
    /// When this read (or the first read of it) handed it out.
    pub read_at: Timestamp,
}

/// What one read returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PollPage {
    /// The events, in the endpoint's order.
    pub events: Vec<Polled>,
    /// The cursor for the next read: the last event's position, or the
    /// request's when there was none.
    pub cursor: i64,
    /// Whether the read returned everything there was: fewer events than
    /// its limit.
    pub done: bool,
}

impl PollPage {
    /// The page of `events` read for `req`.
    pub fn of(req: &PollRequest, events: Vec<Polled>) -> Self {
        let cursor = events
            .last()
            .map_or_else(|| req.unchanged_cursor(), |e| e.position);
        let done = events.len() < req.limit as usize;
        PollPage {
            events,
            cursor,
            done,
        }
    }

    /// The page of a read that found `before` events already read after
    /// its cursor, then handed out `handed` new ones and read `events`.
    ///
    /// # Errors
    /// `InvalidInput` when the page lacks some of what the read handed
    /// out: the cursor is ahead of every position of this endpoint (another
    /// endpoint's, or made up). The caller's transaction is then rolled
    /// back, so nothing is delivered unseen.
    pub fn read(
        req: &PollRequest,
        before: usize,
        handed: usize,
        events: Vec<Polled>,
    ) -> Result<Self, StoreError> {
        if events.len() < before + handed {
            return Err(StoreError::InvalidInput(format!(
                "cursor {} is ahead of every read of endpoint {}: give a cursor a read of it returned",
                req.unchanged_cursor(),
                req.endpoint
            )));
        }
        Ok(PollPage::of(req, events))
    }
}

/// The answer to a read of an endpoint that is not a poll endpoint.
pub fn not_a_poll_endpoint(id: EndpointId) -> StoreError {
    StoreError::InvalidInput(format!(
        "endpoint {id} is not a poll endpoint: its deliveries are sent to its URL"
    ))
}

/// Refuses, on a poll endpoint, the settings that only shape how
/// deliveries are sent: each `(name, given)`, the first given one named.
///
/// # Errors
/// `InvalidInput` naming the setting.
pub fn refuse_on_poll(settings: &[(&str, bool)]) -> Result<(), StoreError> {
    match settings.iter().find(|(_, given)| *given) {
        Some((what, _)) => Err(StoreError::InvalidInput(format!(
            "a poll endpoint takes no {what}: its consumer reads its events, nothing is sent"
        ))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(after: Option<i64>, limit: u32) -> Result<PollRequest, StoreError> {
        PollRequest::new(
            AccountId::new("a").unwrap(),
            EndpointId::new(),
            after,
            limit,
        )
    }

    #[test]
    fn limits_and_cursors_are_checked() {
        assert!(req(None, 0).is_err());
        assert!(req(None, MAX_POLL_LIMIT + 1).is_err());
        assert!(req(Some(-1), 10).is_err());
        assert!(req(Some(0), MAX_POLL_LIMIT).is_ok());
    }

    #[test]
    fn an_empty_page_keeps_the_cursor_and_a_short_one_is_done() {
        let r = req(Some(7), 2).unwrap();
        let empty = PollPage::of(&r, Vec::new());
        assert_eq!((empty.cursor, empty.done), (7, true));
        let one = Polled {
            position: 9,
            delivery_id: DeliveryId::new(),
            event_id: EventId::new(),
            event_type: "t".into(),
            body: "{}".into(),
            published_at: Timestamp::from_millis(1),
            read_at: Timestamp::from_millis(2),
        };
        let full = PollPage::of(
            &r,
            vec![
                one.clone(),
                Polled {
                    position: 11,
                    ..one
                },
            ],
        );
        assert_eq!((full.cursor, full.done), (11, false));
    }
}
