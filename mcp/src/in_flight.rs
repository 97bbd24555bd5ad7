//! The requests a peer has in flight, counted so that a peer cannot make a transport hold
//! an answer per request it sends without reading any (each answer waits, with its bytes,
//! for a writer the peer does not empty).

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};

use rmcp::model::{JsonRpcMessage, RequestId};

/// The most requests of one peer in flight at once, by default: 64. A client rarely runs
/// more than a few calls at once, and a server's own requests (`ping`, sampling, roots) are
/// answered as they come.
pub const MAX_PEER_REQUESTS: usize = 64;

/// The longest string request id a peer's request may have, in bytes: 256. An id is held
/// while the request is in flight and echoed in its answer, so without a bound a peer's
/// [`MAX_PEER_REQUESTS`] requests could make the answers waiting for it hold gigabytes of
/// ids. Ids are numbers or short strings (UUIDs) in practice.
pub const MAX_REQUEST_ID_BYTES: usize = 256;

/// A peer's requests in flight, at most a limit: those passed on and not yet answered
/// (by id), and the answers being sent (by count).
///
/// A transport [enters](InFlight::enter) each request it passes on, refusing it past the
/// limit or while a request of the same id is unanswered; it makes an [`Answering`] when
/// it is given an answer to send (which moves the answer's request from unanswered to
/// being sent) and keeps it until the send ends, however it ends. A cancellation from the
/// peer [forgets](InFlight::forget) its request only while it is unanswered (rmcp then
/// sends no answer); an answer being sent counts until its send ends, whatever the peer
/// says, so no message of the peer's frees a place that an answer still holds.
#[derive(Debug)]
pub struct InFlight {
    limit: usize,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Requests passed on whose answers have not been given to a send.
    unanswered: HashSet<RequestId>,
    /// Answers whose sends have not ended.
    sending: usize,
}

/// Why [`InFlight::enter`] refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refusal {
    /// The limit is reached.
    Full,
    /// A request of the same id is unanswered.
    SameId,
    /// The request's id is a string over [`MAX_REQUEST_ID_BYTES`].
    LongId,
}

impl InFlight {
    /// A count allowing `limit` requests at once.
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self {
            limit,
            state: Mutex::new(State::default()),
        })
    }

    /// The limit.
    pub fn limit(&self) -> usize {
        self.limit
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts the request `id` in, or says why not (nothing is counted then).
    ///
    /// # Errors
    ///
    /// [`Refusal::LongId`] for a string id over [`MAX_REQUEST_ID_BYTES`];
    /// [`Refusal::SameId`] while a request of this id is unanswered; [`Refusal::Full`] when
    /// `limit` requests are in flight.
    pub fn enter(&self, id: &RequestId) -> Result<(), Refusal> {
        if let RequestId::String(text) = id
            && text.len() > MAX_REQUEST_ID_BYTES
        {
            return Err(Refusal::LongId);
        }
        let mut state = self.state();
        if state.unanswered.contains(id) {
            return Err(Refusal::SameId);
        }
        if state.unanswered.len() + state.sending >= self.limit {
            return Err(Refusal::Full);
        }
        state.unanswered.insert(id.clone());
        Ok(())
    }

    /// Forgets the request `id` if it is unanswered (the peer cancelled it); an answer
    /// already being sent stays counted.
    pub fn forget(&self, id: &RequestId) {
        self.state().unanswered.remove(id);
    }

    /// Forgets every unanswered request (a transport whose peer's requests were ignored
    /// rather than answered: rmcp during a handshake); answers being sent stay counted.
    pub fn forget_unanswered(&self) {
        self.state().unanswered.clear();
    }

    /// How many are in flight: unanswered, and being answered.
    pub fn len(&self) -> usize {
        let state = self.state();
        state.unanswered.len() + state.sending
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A hold on the send of `message` if it is an answer (a response, an error, with an
    /// id or without), which counts it until dropped: made when a send begins, moved into
    /// the send. Its request is no longer unanswered.
    pub fn answering<Req, Resp, Not>(
        self: &Arc<Self>,
        message: &JsonRpcMessage<Req, Resp, Not>,
    ) -> Answering {
        let id = match message {
            JsonRpcMessage::Response(response) => Some(Some(&response.id)),
            JsonRpcMessage::Error(error) => Some(error.id.as_ref()),
            _ => None,
        };
        let counted = id.is_some();
        if let Some(id) = id {
            let mut state = self.state();
            if let Some(id) = id {
                state.unanswered.remove(id);
            }
            state.sending += 1;
        }
        Answering {
            in_flight: Arc::clone(self),
            counted,
        }
    }
}

/// Counts an answer being sent in its [`InFlight`] until dropped.
#[derive(Debug)]
pub struct Answering {
    in_flight: Arc<InFlight>,
    counted: bool,
}

impl Answering {
    /// `send` with this hold kept until it ends or is dropped: a transport's send of the
    /// answer.
    pub async fn during<F: Future>(self, send: F) -> F::Output {
        let _held = self;
        send.await
    }
}

impl Drop for Answering {
    fn drop(&mut self) {
        if self.counted {
            let mut state = self.in_flight.state();
            state.sending = state.sending.saturating_sub(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use rmcp::model::{ErrorData, ServerJsonRpcMessage, ServerResult};

    use super::*;

    fn response(id: i64) -> ServerJsonRpcMessage {
        ServerJsonRpcMessage::response(ServerResult::empty(()), RequestId::Number(id))
    }

    #[test]
    fn a_request_with_a_long_string_id_is_refused_and_not_counted() {
        let in_flight = InFlight::new(2);
        let long = RequestId::String("x".repeat(MAX_REQUEST_ID_BYTES + 1).into());
        assert_eq!(in_flight.enter(&long), Err(Refusal::LongId));
        assert!(in_flight.is_empty());
        let longest = RequestId::String("x".repeat(MAX_REQUEST_ID_BYTES).into());
        assert_eq!(in_flight.enter(&longest), Ok(()));
    }

    #[test]
    fn requests_are_counted_to_the_limit_and_out_when_their_answers_are_sent() {
        let in_flight = InFlight::new(2);
        let one = RequestId::Number(1);
        assert_eq!(in_flight.enter(&one), Ok(()));
        assert_eq!(in_flight.enter(&one), Err(Refusal::SameId));
        assert_eq!(in_flight.enter(&RequestId::Number(2)), Ok(()));
        assert_eq!(in_flight.enter(&RequestId::Number(3)), Err(Refusal::Full));
        let answering = in_flight.answering(&response(1));
        assert_eq!(in_flight.len(), 2, "in flight until the send ends");
        // Its id may be used again once answered; the answer still holds a place.
        assert_eq!(in_flight.enter(&one), Err(Refusal::Full));
        drop(answering);
        assert_eq!(in_flight.len(), 1);
        let error = ServerJsonRpcMessage::error(
            ErrorData::internal_error("x", None),
            Some(RequestId::Number(2)),
        );
        drop(in_flight.answering(&error));
        assert!(in_flight.is_empty());
    }

    /// A cancellation, a reused id or an answer to nothing never frees a place an answer
    /// being sent holds: a peer that never reads cannot get past the limit.
    #[test]
    fn no_message_of_the_peer_frees_a_place_a_stuck_answer_holds() {
        let in_flight = InFlight::new(3);
        let mut stuck = Vec::new();
        for round in 0..10 {
            let id = RequestId::Number(round);
            if in_flight.enter(&id).is_err() {
                continue;
            }
            // Answered (its send never ends), then cancelled, then its id used again.
            stuck.push(in_flight.answering(&response(round)));
            in_flight.forget(&id);
            let _ = in_flight.enter(&id);
            in_flight.forget(&id);
        }
        assert_eq!(stuck.len(), 3, "only three answers were ever held");
        assert_eq!(in_flight.len(), 3);
        // An unanswered request a cancellation forgets frees its place.
        drop(stuck.pop());
        assert_eq!(in_flight.enter(&RequestId::Number(99)), Ok(()));
        in_flight.forget(&RequestId::Number(99));
        assert_eq!(in_flight.len(), 2);
        // An error without an id (a parse error's) is counted while sent too.
        let anonymous = ServerJsonRpcMessage::error(ErrorData::parse_error("x", None), None);
        let held = in_flight.answering(&anonymous);
        assert_eq!(in_flight.len(), 3);
        drop(held);
        assert_eq!(in_flight.len(), 2);
    }
}
