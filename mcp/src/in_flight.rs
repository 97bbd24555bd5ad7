//! The requests a peer has in flight, counted so that a peer cannot make a transport hold
//! an answer per request it sends without reading any (each answer waits, with its bytes,
//! for a writer the peer does not empty).

use std::collections::HashMap;
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
///
/// What an answer's bytes were counted in elsewhere (a budget's reservation) can be kept
/// with its request (by the [`AnswerHold`] [`InFlight::enter`] gives), and is dropped when
/// the answer's send ends (or when the request is forgotten unanswered), not when the
/// handler returns: rmcp serializes and writes the answer after that.
#[derive(Debug)]
pub struct InFlight {
    limit: usize,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Requests passed on whose answers have not been given to a send.
    unanswered: HashMap<RequestId, Waiting>,
    /// Answers whose sends have not ended.
    sending: usize,
    /// The number the next request entered is given.
    next: u64,
}

/// A request waiting for its answer.
struct Waiting {
    /// Which of the requests ever entered with its id it is: a hold made for an earlier
    /// one (cancelled, its id used again) keeps nothing with it.
    entered: u64,
    /// What is kept until its answer is sent.
    kept: Vec<Kept>,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("unanswered", &self.unanswered.len())
            .field("sending", &self.sending)
            .finish()
    }
}

/// Something kept until an answer's send ends ([`AnswerHold::keep`]).
pub type Kept = Box<dyn Send>;

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

    /// Counts the request `id` in, and gives its place, for its handler to keep things with
    /// ([`AnswerHold::keep`]); or says why not (nothing is counted then).
    ///
    /// # Errors
    ///
    /// [`Refusal::LongId`] for a string id over [`MAX_REQUEST_ID_BYTES`];
    /// [`Refusal::SameId`] while a request of this id is unanswered; [`Refusal::Full`] when
    /// `limit` requests are in flight.
    pub fn enter(self: &Arc<Self>, id: &RequestId) -> Result<AnswerHold, Refusal> {
        if let RequestId::String(text) = id
            && text.len() > MAX_REQUEST_ID_BYTES
        {
            return Err(Refusal::LongId);
        }
        let mut state = self.state();
        if state.unanswered.contains_key(id) {
            return Err(Refusal::SameId);
        }
        if state.unanswered.len() + state.sending >= self.limit {
            return Err(Refusal::Full);
        }
        let entered = state.next;
        state.next += 1;
        state.unanswered.insert(
            id.clone(),
            Waiting {
                entered,
                kept: Vec::new(),
            },
        );
        drop(state);
        Ok(AnswerHold {
            in_flight: Arc::clone(self),
            id: id.clone(),
            entered,
        })
    }

    /// Forgets the request `id` if it is unanswered (the peer cancelled it); an answer
    /// already being sent stays counted. What was kept for it is dropped, after the lock.
    pub fn forget(&self, id: &RequestId) {
        let waiting = self.state().unanswered.remove(id);
        drop(waiting);
    }

    /// Forgets every unanswered request (a transport whose peer's requests were ignored
    /// rather than answered: rmcp during a handshake); answers being sent stay counted.
    pub fn forget_unanswered(&self) {
        let kept = std::mem::take(&mut self.state().unanswered);
        drop(kept);
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
        let mut kept = Vec::new();
        if let Some(id) = id {
            let mut state = self.state();
            if let Some(id) = id {
                kept = state
                    .unanswered
                    .remove(id)
                    .map(|waiting| waiting.kept)
                    .unwrap_or_default();
            }
            state.sending += 1;
        }
        Answering {
            in_flight: Arc::clone(self),
            counted,
            kept,
        }
    }
}

/// A request's place in its transport's [`InFlight`] ([`InFlight::enter`]), which the
/// transport puts in the request's extensions (rmcp hands them to the handler as its
/// context's) so that the handler can [keep](AnswerHold::keep) what counts its answer's
/// bytes until the answer has been sent.
#[derive(Debug, Clone)]
pub struct AnswerHold {
    in_flight: Arc<InFlight>,
    id: RequestId,
    /// Which request of this id it is the place of (`Waiting::entered`).
    entered: u64,
}

impl AnswerHold {
    /// Keeps `kept` until the answer to this request has been sent (or the request is
    /// forgotten: cancelled by the peer), then drops it. A handler gives here what counts
    /// its answer's bytes (a budget's reservation), so that they stay counted while rmcp
    /// writes them. Keep it last, just before returning the answer: a handler that
    /// panicked after keeping would leave it kept until the transport is dropped.
    ///
    /// # Errors
    ///
    /// `kept` back when this request is no longer waiting for its answer (answered,
    /// forgotten, or its id used again since by another request): the caller drops it.
    pub fn keep(&self, kept: Kept) -> Result<(), Kept> {
        match self.in_flight.state().unanswered.get_mut(&self.id) {
            Some(waiting) if waiting.entered == self.entered => {
                waiting.kept.push(kept);
                Ok(())
            }
            _ => Err(kept),
        }
    }
}

/// Counts an answer being sent in its [`InFlight`] until dropped, and holds what was kept
/// for its request ([`AnswerHold::keep`]) as long.
pub struct Answering {
    in_flight: Arc<InFlight>,
    counted: bool,
    kept: Vec<Kept>,
}

impl std::fmt::Debug for Answering {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Answering")
            .field("counted", &self.counted)
            .field("kept", &self.kept.len())
            .finish()
    }
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
        // After the lock: what was kept is dropped by this thread, outside it.
        self.kept.clear();
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
        assert_eq!(in_flight.enter(&long).err(), Some(Refusal::LongId));
        assert!(in_flight.is_empty());
        let longest = RequestId::String("x".repeat(MAX_REQUEST_ID_BYTES).into());
        assert!(in_flight.enter(&longest).is_ok());
    }

    #[test]
    fn requests_are_counted_to_the_limit_and_out_when_their_answers_are_sent() {
        let in_flight = InFlight::new(2);
        let one = RequestId::Number(1);
        assert!(in_flight.enter(&one).is_ok());
        assert_eq!(in_flight.enter(&one).err(), Some(Refusal::SameId));
        assert!(in_flight.enter(&RequestId::Number(2)).is_ok());
        assert_eq!(
            in_flight.enter(&RequestId::Number(3)).err(),
            Some(Refusal::Full)
        );
        let answering = in_flight.answering(&response(1));
        assert_eq!(in_flight.len(), 2, "in flight until the send ends");
        // Its id may be used again once answered; the answer still holds a place.
        assert_eq!(in_flight.enter(&one).err(), Some(Refusal::Full));
        drop(answering);
        assert_eq!(in_flight.len(), 1);
        let error = ServerJsonRpcMessage::error(
            ErrorData::internal_error("x", None),
            Some(RequestId::Number(2)),
        );
        drop(in_flight.answering(&error));
        assert!(in_flight.is_empty());
    }

    /// What a handler keeps with its request is dropped when the answer's send ends, not
    /// before; when the request is forgotten unanswered; and not kept for a request that
    /// is not waiting for its answer.
    #[test]
    fn what_is_kept_for_a_request_is_dropped_when_its_answer_is_sent() {
        struct Flag(Arc<std::sync::atomic::AtomicBool>);
        impl Drop for Flag {
            fn drop(&mut self) {
                self.0.store(true, std::sync::atomic::Ordering::SeqCst);
            }
        }
        let flag = || {
            let dropped = Arc::new(std::sync::atomic::AtomicBool::new(false));
            (Box::new(Flag(Arc::clone(&dropped))) as Kept, dropped)
        };
        let dropped =
            |d: &Arc<std::sync::atomic::AtomicBool>| d.load(std::sync::atomic::Ordering::SeqCst);
        let in_flight = InFlight::new(4);
        let one = RequestId::Number(1);
        let hold = in_flight.enter(&one).unwrap();
        let (kept, one_dropped) = flag();
        assert!(hold.keep(kept).is_ok());
        let answering = in_flight.answering(&response(1));
        assert!(!dropped(&one_dropped), "kept while the answer is sent");
        drop(answering);
        assert!(dropped(&one_dropped), "dropped once the send ended");

        let two = RequestId::Number(2);
        let hold = in_flight.enter(&two).unwrap();
        let (kept, two_dropped) = flag();
        assert!(hold.keep(kept).is_ok());
        in_flight.forget(&two);
        assert!(
            dropped(&two_dropped),
            "dropped when the request is forgotten"
        );
        // A later request of the same id is another: the first's hold keeps nothing.
        in_flight.enter(&two).unwrap();
        let (kept, late_dropped) = flag();
        let refused = hold.keep(kept);
        assert!(refused.is_err(), "a cancelled request's hold keeps nothing");
        drop(refused);
        assert!(dropped(&late_dropped));
        in_flight.forget(&two);

        let hold = in_flight.enter(&RequestId::Number(4)).unwrap();
        let (kept, four_dropped) = flag();
        assert!(hold.keep(kept).is_ok());
        in_flight.forget_unanswered();
        assert!(
            dropped(&four_dropped),
            "dropped when every unanswered one is forgotten"
        );
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
        assert!(in_flight.enter(&RequestId::Number(99)).is_ok());
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
